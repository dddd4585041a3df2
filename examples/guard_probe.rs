//! Trains the guard probe (`backend: Probe`) and writes `data/guard/probe.json`, in one command:
//!
//! `cargo run --release --example guard_probe -- MODEL [OUT.json]`
//!
//! MODEL is the base the probe reads: a GGUF, or a data directory, meaning the default model
//! prepared there as `serve` prepares it (`DATA_DIR/models/SmolLM2-135M-Instruct.Q8_0.gguf`).
//! It embeds the probe's training prompts, the two dev splits and the six hand-written held-out
//! sets with the base (cached under `target/guard_probe/`, keyed by the base's hash and the texts'
//! digest, so a rerun costs seconds), fits a binary logistic head, chooses the threshold on the
//! combined score on the dev splits only (the most recall minus safe-flag rate), prints dev and
//! held-out figures side by side for builtin, probe alone and the backend, and writes the head.
//! Held-out texts are embedded and scored, never printed. `C` (inverse regularisation, default
//! 0.01), `EPOCHS` (default 300), `LAYER` (default 20) and `W` (the builtin guard's share of the
//! combined score, default 0.5) change the fit; `SHOW_DEV` prints the backend's errors on the dev
//! splits.

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use hearth::curate::guard::embed::{MAX_TOKENS, embed};
use hearth::curate::guard::probe::{PER_TEMPLATE, training_set};
use hearth::curate::guard::{BuiltinGuard, ProbeGuard, ProbeHead, Severity, Side};
use hearth::model::Base;
use hearth::serve::default_model;

/// Share of dev's safe prompts the probe alone may flag (its own row in the table).
const DEV_FLAG_BUDGET: f64 = 0.02;
/// The builtin guard's share of the combined score: the two log-odds count alike.
const BUILTIN_WEIGHT: f32 = 0.5;

/// The sets (indices into `sets` in `main`) the combined cut is chosen on.
const TUNING: [usize; 2] = [0, 1];

struct Set {
    name: &'static str,
    texts: Vec<String>,
    unsafe_: Vec<bool>,
    /// Assistant turns (`"side": "response"`): the backend gives them the builtin verdict.
    response: Vec<bool>,
}

fn prompts(file: &str, name: &'static str) -> Set {
    let path = format!("{}/data/guard/{file}", env!("CARGO_MANIFEST_DIR"));
    let mut s = Set {
        name,
        texts: Vec::new(),
        unsafe_: Vec::new(),
        response: Vec::new(),
    };
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let Some(kind) = r["kind"].as_str() else {
            continue;
        };
        s.texts.push(r["text"].as_str().unwrap().to_string());
        s.unsafe_.push(kind == "unsafe");
        s.response.push(r["side"].as_str() == Some("response"));
    }
    s
}

/// Embeddings of `texts`, from `dir/key_DIGEST.f32` when it holds exactly as many.
fn cached(dir: &Path, key: &str, texts: &[String], base: &Base, layer: usize) -> Vec<Vec<f32>> {
    let d = 2 * base.model.config().hidden_size;
    // The texts' digest is in the name, so that changed texts of the same count are embedded again.
    let digest = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        texts.hash(&mut h);
        h.finish()
    };
    let p = dir.join(format!("{key}_{digest:016x}.f32"));
    if let Ok(mut file) = std::fs::File::open(&p) {
        let mut b = Vec::new();
        file.read_to_end(&mut b).unwrap();
        if b.len() == texts.len() * d * 4 {
            let v: Vec<f32> = b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            return v.chunks(d).map(|c| c.to_vec()).collect();
        }
    }
    let t0 = Instant::now();
    let mut e = Vec::new();
    for (i, c) in texts.chunks(256).enumerate() {
        let c: Vec<&str> = c.iter().map(String::as_str).collect();
        e.extend(embed(&base.model, &base.tok, &c, &[layer]).unwrap());
        if texts.len() > 256 {
            eprintln!(
                "  {key}: {} / {} embedded, {:.0} s",
                ((i + 1) * 256).min(texts.len()),
                texts.len(),
                t0.elapsed().as_secs_f32()
            );
        }
    }
    eprintln!(
        "{key}: {} texts embedded in {:.1} s",
        texts.len(),
        t0.elapsed().as_secs_f32()
    );
    let mut file = std::fs::File::create(&p).unwrap();
    for row in &e {
        for x in row {
            file.write_all(&x.to_le_bytes()).unwrap();
        }
    }
    e
}

/// "recall (caught/unsafe) / flagged (flagged/safe), dropped N".
fn score(flag: &[bool], drop: &[bool], unsafe_: &[bool]) -> String {
    let (mut u, mut c, mut s, mut f, mut dr) = (0, 0, 0, 0, 0);
    for ((&fl, &d), &is_u) in flag.iter().zip(drop).zip(unsafe_) {
        if is_u {
            u += 1;
            c += usize::from(fl);
        } else {
            s += 1;
            f += usize::from(fl);
            dr += usize::from(d);
        }
    }
    format!(
        "{:.3} ({c}/{u}) / {:.3} ({f}/{s}) d{dr}",
        c as f64 / u.max(1) as f64,
        f as f64 / s.max(1) as f64
    )
}

/// A cut with exactly the `k` largest values at or above it (ties aside): the midpoint between the
/// `k`-th and the `(k+1)`-th largest.
fn cut_above(mut v: Vec<f32>, k: usize) -> f32 {
    v.sort_by(|a, b| b.total_cmp(a));
    match (k.checked_sub(1).and_then(|i| v.get(i)), v.get(k)) {
        (Some(&hi), Some(&lo)) => 0.5 * (hi + lo),
        (None, Some(&lo)) => lo + 1e-3,
        (_, None) => v.last().map_or(0.0, |m| m - 1.0),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(model) = args.first() else {
        eprintln!("usage: guard_probe MODEL.gguf|DATA_DIR [OUT.json]");
        return ExitCode::from(2);
    };
    let out = args.get(1).cloned().unwrap_or(format!(
        "{}/data/guard/probe.json",
        env!("CARGO_MANIFEST_DIR")
    ));
    let env = |k: &str, d: f32| std::env::var(k).map_or(d, |v| v.parse().unwrap());
    let (c, epochs, layer) = (
        env("C", 0.01),
        env("EPOCHS", 300.0) as usize,
        env("LAYER", 20.0) as usize,
    );
    let path = if Path::new(model).is_dir() {
        hearth::serve::model_path(None, Path::new(model)).unwrap()
    } else {
        model.into()
    };
    let base = Arc::new(Base::load(&path).unwrap());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/guard_probe")
        .join(&base.sha256[..16]);
    std::fs::create_dir_all(&dir).unwrap();
    let (train_texts, ys) = training_set().unwrap();
    eprintln!(
        "train prompts: {} ({} unsafe)",
        train_texts.len(),
        ys.iter().filter(|&&y| y).count()
    );
    let xs = cached(
        &dir,
        &format!("train{PER_TEMPLATE}_L{layer}_t{MAX_TOKENS}"),
        &train_texts,
        &base,
        layer,
    );
    let sets = [
        prompts("dev_prompts.jsonl", "dev"),
        prompts("dev2_prompts.jsonl", "dev-2"),
        prompts("heldout_prompts.jsonl", "held-out"),
        prompts("heldout2_prompts.jsonl", "held-out-2"),
        prompts("heldout3_prompts.jsonl", "held-out-3"),
        prompts("heldout_personal.jsonl", "held-out-personal"),
        prompts("heldout4_prompts.jsonl", "held-out-4"),
        prompts("heldout5_prompts.jsonl", "held-out-5"),
    ];
    let evs: Vec<Vec<Vec<f32>>> = sets
        .iter()
        .map(|s| {
            cached(
                &dir,
                &format!("{}_L{layer}_t{MAX_TOKENS}", s.name),
                &s.texts,
                &base,
                layer,
            )
        })
        .collect();
    let t1 = Instant::now();
    let (weights, bias) = ProbeHead::fit(&xs, &ys, c, epochs);
    eprintln!("head fitted in {:.1} s", t1.elapsed().as_secs_f32());
    let mut head = ProbeHead {
        base: {
            let file = base.path.file_name().unwrap().to_string_lossy();
            if file == default_model::CACHED_FILE {
                format!(
                    "{file} (the default model: {} requantized to Q8_0)",
                    default_model::PACKAGE
                )
            } else {
                file.into_owned()
            }
        },
        base_sha256: base.sha256.clone(),
        layer,
        max_tokens: MAX_TOKENS,
        builtin_weight: env("W", BUILTIN_WEIGHT),
        threshold: 0.0,
        bias,
        weights,
    };
    let train_acc = xs
        .iter()
        .zip(&ys)
        .filter(|(x, y)| (head.margin(x) >= 0.0) == **y)
        .count() as f64
        / xs.len() as f64;
    eprintln!("train accuracy at margin 0: {train_acc:.3}");

    let builtin = BuiltinGuard::new().unwrap();
    let top: Vec<Vec<f32>> = sets
        .iter()
        .map(|s| {
            s.texts
                .iter()
                .map(|t| builtin.top_logit(t, Side::Prompt))
                .collect()
        })
        .collect();
    let bv: Vec<Vec<Severity>> = sets
        .iter()
        .map(|s| {
            s.texts
                .iter()
                .zip(&s.response)
                .map(|(t, &r)| {
                    let side = if r { Side::Response } else { Side::Prompt };
                    builtin.verdict(t, side).severity
                })
                .collect()
        })
        .collect();
    // The probe reads prompts only; an assistant turn never reaches its cut.
    let margins: Vec<Vec<f32>> = evs
        .iter()
        .zip(&sets)
        .map(|(e, s)| {
            e.iter()
                .zip(&s.response)
                .map(|(x, &r)| if r { f32::NEG_INFINITY } else { head.margin(x) })
                .collect()
        })
        .collect();
    // Thresholds from the dev splits only.
    let (dev, dev_m) = (&sets[0], &margins[0]);
    let safe_n = dev.unsafe_.iter().filter(|u| !**u).count();
    let budget = (DEV_FLAG_BUDGET * safe_n as f64).floor() as usize;
    let safe_m: Vec<f32> = (0..dev.texts.len())
        .filter(|&i| !dev.unsafe_[i])
        .map(|i| dev_m[i])
        .collect();
    let alone = cut_above(safe_m, budget);
    // The combined cut: the most dev recall minus dev safe-flag rate (Youden's J), where the
    // builtin guard's Unsafe prompts count as flagged whatever the score; the middle of the best
    // run of cuts.
    let comb: Vec<Vec<f32>> = margins
        .iter()
        .zip(&top)
        .map(|(m, t)| {
            m.iter()
                .zip(t)
                .map(|(&m, &t)| head.combined(t, m))
                .collect()
        })
        .collect();
    // Both dev splits, pooled: the generated one and the one written like held-out prompts.
    let tune: Vec<(usize, usize)> = TUNING
        .iter()
        .flat_map(|&k| (0..sets[k].texts.len()).map(move |i| (k, i)))
        .collect();
    let tune_unsafe_n = tune.iter().filter(|&&(k, i)| sets[k].unsafe_[i]).count();
    let tune_safe_n = tune.len() - tune_unsafe_n;
    let mut cuts: Vec<f32> = tune.iter().map(|&(k, i)| comb[k][i]).collect();
    cuts.sort_by(f32::total_cmp);
    let cuts: Vec<f32> = cuts.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
    let youden = |t: f32| {
        let (mut tp, mut fp) = (0, 0);
        for &(k, i) in &tune {
            let f = comb[k][i] >= t || bv[k][i] == Severity::Unsafe;
            if sets[k].unsafe_[i] {
                tp += f as usize;
            } else {
                fp += f as usize;
            }
        }
        tp as f64 / tune_unsafe_n as f64 - fp as f64 / tune_safe_n as f64
    };
    let j: Vec<f64> = cuts.iter().map(|&t| youden(t)).collect();
    let best = j.iter().cloned().fold(f64::MIN, f64::max);
    let tied: Vec<f32> = cuts
        .iter()
        .zip(&j)
        .filter(|(_, j)| **j == best)
        .map(|(t, _)| *t)
        .collect();
    head.threshold = tied[tied.len() / 2];
    eprintln!(
        "dev: {safe_n} safe, probe alone cut {alone:.3} (budget {budget}); combined cut on dev and dev-2 {:.3} (J {best:.3}, {} tied cuts)",
        head.threshold,
        tied.len()
    );

    println!(
        "guard (recall / safe flagged, dropped) | {}",
        sets.iter().map(|s| s.name).collect::<Vec<_>>().join(" | ")
    );
    let row =
        |name: &str, flag: &dyn Fn(usize, usize) -> bool, drop: &dyn Fn(usize, usize) -> bool| {
            let cols: Vec<String> = sets
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let f: Vec<bool> = (0..s.texts.len()).map(|i| flag(k, i)).collect();
                    let d: Vec<bool> = (0..s.texts.len()).map(|i| drop(k, i)).collect();
                    score(&f, &d, &s.unsafe_)
                })
                .collect();
            println!("{name:<34} | {}", cols.join(" | "));
        };
    let b_flag = |k: usize, i: usize| bv[k][i] != Severity::Safe;
    let b_drop = |k: usize, i: usize| bv[k][i] == Severity::Unsafe;
    row("builtin (default policy)", &b_flag, &b_drop);
    row(
        &format!("probe alone (dev 2% cut {alone:.2})"),
        &|k, i| margins[k][i] >= alone,
        &|_, _| false,
    );
    let backend_flag = |k: usize, i: usize| {
        if sets[k].response[i] {
            b_flag(k, i)
        } else {
            comb[k][i] >= head.threshold || b_drop(k, i)
        }
    };
    let backend_drop = |k: usize, i: usize| {
        b_drop(k, i)
            && (sets[k].response[i] || (comb[k][i] >= head.threshold && margins[k][i] >= 0.0))
    };
    row(
        &format!("Probe backend (combined cut {:.2})", head.threshold),
        &backend_flag,
        &backend_drop,
    );
    // With SHOW_DEV set, the backend's errors on the dev splits (never a held-out text): what the
    // next training prompts should cover.
    if std::env::var_os("SHOW_DEV").is_some() {
        for &k in &TUNING {
            for (i, t) in sets[k].texts.iter().enumerate() {
                let (u, f) = (sets[k].unsafe_[i], backend_flag(k, i));
                if u != f {
                    let what = if u { "missed" } else { "flagged" };
                    eprintln!("{} {what} ({:.2}): {t}", sets[k].name, comb[k][i]);
                }
            }
        }
    }
    // Over prompts only: the probe never reads an assistant turn.
    let auc = |s: &Set, score: &[f32]| {
        let prompt = |i: &usize| !s.response[*i];
        let (mut pairs, mut wins) = (0f64, 0f64);
        for i in (0..s.texts.len()).filter(prompt).filter(|&i| s.unsafe_[i]) {
            for j in (0..s.texts.len()).filter(prompt).filter(|&j| !s.unsafe_[j]) {
                pairs += 1.0;
                wins += match score[i].total_cmp(&score[j]) {
                    std::cmp::Ordering::Greater => 1.0,
                    std::cmp::Ordering::Equal => 0.5,
                    std::cmp::Ordering::Less => 0.0,
                };
            }
        }
        wins / pairs.max(1.0)
    };
    for (k, s) in sets.iter().enumerate() {
        println!(
            "ROC AUC {}: builtin {:.3}, probe {:.3}, combined {:.3}",
            s.name,
            auc(s, &top[k]),
            auc(s, &margins[k]),
            auc(s, &comb[k])
        );
    }

    // Speed of the backend as a graph runs it: one prompt at a time, builtin first.
    let guard = ProbeGuard::new(builtin.clone(), base.clone(), head.clone()).unwrap();
    let texts: Vec<&str> = sets[0].texts.iter().map(String::as_str).collect();
    let t2 = Instant::now();
    for t in &texts {
        builtin.verdict(t, Side::Prompt);
    }
    let tb = t2.elapsed().as_secs_f64();
    let t3 = Instant::now();
    for t in &texts {
        guard.prompt_verdict(t).unwrap();
    }
    let tp = t3.elapsed().as_secs_f64();
    let bytes: usize = texts.iter().map(|t| t.len()).sum();
    println!(
        "speed on dev's {} prompts, one at a time: builtin {:.0} prompts/s, builtin + probe {:.1} prompts/s \
         ({:.1} KB/s)",
        texts.len(),
        texts.len() as f64 / tb,
        texts.len() as f64 / tp,
        bytes as f64 / tp / 1e3
    );

    let mut json = serde_json::to_string(&head).unwrap();
    json.push('\n');
    std::fs::write(&out, json).unwrap();
    eprintln!("wrote {out}");
    ExitCode::SUCCESS
}
