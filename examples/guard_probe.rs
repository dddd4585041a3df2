//! Experiment: does a logistic probe on a frozen base model's residual stream beat the builtin
//! guard on the dev split and both hand-written held-out sets? Prints dev / held-out / held-out-2
//! side by side for builtin, probe and their combination, per layer and regularisation; held-out
//! texts are embedded and scored, never printed.
//!
//! `cargo run --release --example guard_probe -- MODEL.gguf LAYERS [CACHE_DIR]`, e.g.
//! `... SmolLM2-135M-Instruct.Q8_0.gguf 8,16,24 /tmp/guard_probe`. The embeddings and targets stay
//! in CACHE_DIR for `scripts/guard_probe_eval.py`; `L2S` (comma-separated), `EPOCHS` and
//! `ONLY_LAYER` set the heads' regularisation, steps and the one layer to fit.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Instant;

use hearth::curate::guard::embed::embed;
use hearth::curate::guard::probe::training_set;
use hearth::curate::guard::{BuiltinGuard, ProbeHead, Side};

struct Set {
    name: &'static str,
    texts: Vec<String>,
    unsafe_: Vec<bool>,
}

fn prompts(file: &str, name: &'static str) -> Set {
    let path = format!("{}/data/guard/{file}", env!("CARGO_MANIFEST_DIR"));
    let mut s = Set {
        name,
        texts: Vec::new(),
        unsafe_: Vec::new(),
    };
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let Some(kind) = r["kind"].as_str() else {
            continue;
        };
        s.texts.push(r["text"].as_str().unwrap().to_string());
        s.unsafe_.push(kind == "unsafe");
    }
    s
}

fn cached(
    dir: &str,
    key: &str,
    f: impl FnOnce() -> Vec<Vec<f32>>,
    n: usize,
    d: usize,
) -> Vec<Vec<f32>> {
    let p = format!("{dir}/{key}.f32");
    if let Ok(mut file) = std::fs::File::open(&p) {
        let mut b = Vec::new();
        file.read_to_end(&mut b).unwrap();
        if b.len() == n * d * 4 {
            let v: Vec<f32> = b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            return v.chunks(d).map(|c| c.to_vec()).collect();
        }
    }
    let e = f();
    let mut file = std::fs::File::create(&p).unwrap();
    for row in &e {
        for x in row {
            file.write_all(&x.to_le_bytes()).unwrap();
        }
    }
    e
}

/// (caught/unsafe, flagged/safe, dropped) at the default policy: flag ≥ 0.2, drop ≥ 0.8.
fn score(top: &[f32], unsafe_: &[bool]) -> String {
    let (mut u, mut c, mut s, mut f, mut dr) = (0, 0, 0, 0, 0);
    for (&t, &is_u) in top.iter().zip(unsafe_) {
        if is_u {
            u += 1;
            c += (t >= 0.2) as usize;
        } else {
            s += 1;
            f += (t >= 0.2) as usize;
            dr += (t >= 0.8) as usize;
        }
    }
    format!(
        "{:.3} {:.3} d{dr}",
        c as f32 / u.max(1) as f32,
        f as f32 / s.max(1) as f32
    )
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: guard_probe MODEL.gguf LAYERS [CACHE_DIR]");
        return ExitCode::from(2);
    }
    let dir = args.get(2).cloned().unwrap_or("/tmp/guard_probe".into());
    std::fs::create_dir_all(&dir).unwrap();
    let (model, tok) = hearth::model::load(&args[0]).unwrap();
    let d = 2 * model.config().hidden_size;
    let layers: Vec<usize> = args[1].split(',').map(|l| l.parse().unwrap()).collect();
    let per_template = 3;
    let (train_texts, ys) = training_set().unwrap();
    eprintln!("train prompts: {}", train_texts.len());
    // Targets beside the cached embeddings, for analysis outside this program.
    std::fs::write(
        format!("{dir}/train{per_template}_ys.f32"),
        ys.iter()
            .flat_map(|y| y.iter().flat_map(|v| v.to_le_bytes()))
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let sets = [
        prompts("dev_prompts.jsonl", "dev"),
        prompts("heldout_prompts.jsonl", "held-out"),
        prompts("heldout2_prompts.jsonl", "held-out-2"),
    ];
    for s in &sets {
        std::fs::write(
            format!("{dir}/{}_unsafe.u8", s.name),
            s.unsafe_.iter().map(|&u| u as u8).collect::<Vec<u8>>(),
        )
        .unwrap();
    }
    let builtin = BuiltinGuard::new().unwrap();
    let btop: Vec<Vec<[f32; 9]>> = sets
        .iter()
        .map(|s| {
            s.texts
                .iter()
                .map(|t| builtin.scores(t, Side::Prompt))
                .collect()
        })
        .collect();
    let maxv = |a: &[f32; 9]| a.iter().cloned().fold(0.0, f32::max);
    let line = |name: &str, tops: &[Vec<f32>]| {
        let cols: Vec<String> = sets
            .iter()
            .zip(tops)
            .map(|(s, t)| format!("{} {}", s.name, score(t, &s.unsafe_)))
            .collect();
        println!("{name:<28} {}", cols.join(" | "));
    };
    line(
        "builtin",
        &btop
            .iter()
            .map(|v| v.iter().map(maxv).collect())
            .collect::<Vec<_>>(),
    );
    let key = layers
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join("-");
    let dk = d * layers.len();
    let t0 = Instant::now();
    let texts: Vec<&str> = train_texts.iter().map(String::as_str).collect();
    let all_xs = cached(
        &dir,
        &format!("train{per_template}_L{key}"),
        || {
            let mut out = Vec::new();
            for (i, c) in texts.chunks(256).enumerate() {
                out.extend(embed(&model, &tok, c, &layers).unwrap());
                eprintln!(
                    "  {} / {} embedded, {:.1} s",
                    (i + 1) * 256,
                    texts.len(),
                    t0.elapsed().as_secs_f32()
                );
            }
            out
        },
        texts.len(),
        dk,
    );
    eprintln!(
        "train embedded: {} texts in {:.1} s",
        texts.len(),
        t0.elapsed().as_secs_f32()
    );
    let all_evs: Vec<Vec<Vec<f32>>> = sets
        .iter()
        .map(|s| {
            let t: Vec<&str> = s.texts.iter().map(String::as_str).collect();
            let t1 = Instant::now();
            let e = cached(
                &dir,
                &format!("{}_L{key}", s.name),
                || embed(&model, &tok, &t, &layers).unwrap(),
                t.len(),
                dk,
            );
            eprintln!("{}: {:.1} s", s.name, t1.elapsed().as_secs_f32());
            e
        })
        .collect();
    let only = std::env::var("ONLY_LAYER")
        .ok()
        .map(|v| v.parse::<usize>().unwrap());
    for (k, &layer) in layers.iter().enumerate() {
        if only.is_some_and(|o| o != layer) {
            continue;
        }
        let slice = |v: &Vec<f32>| v[k * d..(k + 1) * d].to_vec();
        let xs: Vec<Vec<f32>> = all_xs.iter().map(slice).collect();
        let evs: Vec<Vec<Vec<f32>>> = all_evs
            .iter()
            .map(|e| e.iter().map(slice).collect())
            .collect();
        let layers = layer;
        for l2 in std::env::var("L2S").map_or(vec![1e-3f32], |v| {
            v.split(',').map(|x| x.parse().unwrap()).collect()
        }) {
            let t1 = Instant::now();
            let p = ProbeHead::train(
                &xs,
                &ys,
                l2,
                std::env::var("EPOCHS").map_or(200, |v| v.parse().unwrap()),
            );
            eprintln!("  head trained in {:.1} s", t1.elapsed().as_secs_f32());
            let ptop: Vec<Vec<[f32; 9]>> = evs
                .iter()
                .map(|e| e.iter().map(|x| p.scores(x)).collect())
                .collect();
            let name = format!("probe L{layers} l2={l2}");
            line(
                &name,
                &ptop
                    .iter()
                    .map(|v| v.iter().map(maxv).collect())
                    .collect::<Vec<_>>(),
            );
            // Combination: per-category mean of the two probabilities.
            let mix: Vec<Vec<f32>> = ptop
                .iter()
                .zip(&btop)
                .map(|(pv, bv)| {
                    pv.iter()
                        .zip(bv)
                        .map(|(a, b)| {
                            let mut m = [0f32; 9];
                            for h in 0..9 {
                                m[h] = 0.5 * (a[h] + b[h]);
                            }
                            maxv(&m)
                        })
                        .collect()
                })
                .collect();
            line("  mean(probe,builtin)", &mix);
        }
    }
    ExitCode::SUCCESS
}
