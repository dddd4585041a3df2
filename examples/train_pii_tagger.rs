//! Trains the redactor's name/address tagger (`src/curate/redact/tagger.rs`) with candle on
//! JSONL from `scripts/gen_pii_tagger.py` and writes its weights as f16 safetensors. After
//! training, the written file is loaded back through the redactor's own forward pass and scored
//! on `--eval` (unit-level span precision and recall), so the figures are those of the shipped
//! code, not of the training graph.
//!
//! usage: cargo run --release --example train_pii_tagger -- --train FILE --eval FILE --out FILE
//! (`scripts/train_pii_tagger.sh` makes the data and runs this with the shipped settings)

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use clap::Parser;
use hearth::curate::redact::tagger::{FEATURES, TAGS, TaggerWeights, Unit, training_units};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[derive(Parser)]
struct Args {
    /// Training JSONL (gold schema: text, spans with code-point offsets).
    #[arg(long)]
    train: String,
    /// Evaluation JSONL (not trained on).
    #[arg(long)]
    eval: Option<String>,
    /// Output safetensors.
    #[arg(long)]
    out: String,
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Hash buckets (power of two).
    #[arg(long, default_value_t = 1 << 14)]
    buckets: u32,
    #[arg(long, default_value_t = 32)]
    dim: usize,
    #[arg(long, default_value_t = 32)]
    hidden: usize,
    /// Units per batch.
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    #[arg(long, default_value_t = 0.005)]
    lr: f64,
    /// Probability of hiding a unit's word feature, so that context and character n-grams
    /// carry names never seen.
    #[arg(long, default_value_t = 0.25)]
    word_dropout: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

struct Record {
    units: Vec<Unit>,
    tags: Vec<u32>,
    /// Gold spans in bytes: (start, end, address).
    gold: Vec<(usize, usize, bool)>,
}

fn load(path: &str, buckets: u32) -> Result<Vec<Record>> {
    let data = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut out = Vec::new();
    for (ln, line) in data.lines().enumerate() {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{path}:{}", ln + 1))?;
        let Some(text) = v["text"].as_str() else {
            bail!("{path}:{}: no text", ln + 1);
        };
        // code points -> bytes
        let mut byte_of: Vec<usize> = text.char_indices().map(|(b, _)| b).collect();
        byte_of.push(text.len());
        let mut gold = Vec::new();
        for s in v["spans"].as_array().into_iter().flatten() {
            let ty = s["type"].as_str().unwrap_or("");
            if ty != "PERSON" && ty != "ADDRESS" {
                continue;
            }
            let (a, b) = (
                s["start"].as_u64().unwrap_or(0) as usize,
                s["end"].as_u64().unwrap_or(0) as usize,
            );
            if a >= b || b >= byte_of.len() {
                bail!("{path}:{}: bad span {a}..{b}", ln + 1);
            }
            gold.push((byte_of[a], byte_of[b], ty == "ADDRESS"));
        }
        let units = training_units(text, buckets);
        let mut tags = vec![0u32; units.len()];
        for &(a, b, addr) in &gold {
            let mut first = true;
            for (i, u) in units.iter().enumerate() {
                if u.start >= a && u.end <= b {
                    tags[i] = match (addr, first) {
                        (false, true) => 1,
                        (false, false) => 2,
                        (true, true) => 3,
                        (true, false) => 4,
                    };
                    first = false;
                }
            }
        }
        out.push(Record { units, tags, gold });
    }
    Ok(out)
}

struct Model {
    emb: Var,
    w1: Var,
    b1: Var,
    w2: Var,
    b2: Var,
    wo: Var,
    bo: Var,
}

/// Glorot-uniform matrix from our own seeded generator (candle's CPU one cannot be seeded).
fn uniform(rows: usize, cols: usize, rng: &mut StdRng, dev: &Device) -> Result<Var> {
    let a = (6.0 / (rows + cols) as f32).sqrt();
    let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-a..a)).collect();
    Ok(Var::from_tensor(&Tensor::from_vec(v, (rows, cols), dev)?)?)
}

impl Model {
    fn new(a: &Args, rng: &mut StdRng, dev: &Device) -> Result<Self> {
        let (b, d, h) = (a.buckets as usize, a.dim, a.hidden);
        let emb: Vec<f32> = (0..b * d).map(|_| rng.random_range(-0.1..0.1)).collect();
        Ok(Self {
            emb: Var::from_tensor(&Tensor::from_vec(emb, (b, d), dev)?)?,
            w1: uniform(3 * d, h, rng, dev)?,
            b1: Var::zeros(h, DType::F32, dev)?,
            w2: uniform(3 * h, h, rng, dev)?,
            b2: Var::zeros(h, DType::F32, dev)?,
            wo: uniform(h, TAGS, rng, dev)?,
            bo: Var::zeros(TAGS, DType::F32, dev)?,
        })
    }

    fn vars(&self) -> Vec<Var> {
        vec![
            self.emb.clone(),
            self.w1.clone(),
            self.b1.clone(),
            self.w2.clone(),
            self.b2.clone(),
            self.wo.clone(),
            self.bo.clone(),
        ]
    }

    /// Width-3 convolution over rows (previous, own, next), as the Rust forward pass does.
    fn conv(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (n, k) = x.dims2()?;
        let z = Tensor::zeros((1, k), DType::F32, x.device())?;
        let prev = Tensor::cat(&[&z, &x.narrow(0, 0, n - 1)?], 0)?;
        let next = Tensor::cat(&[&x.narrow(0, 1, n - 1)?, &z], 0)?;
        let cat = Tensor::cat(&[&prev, x, &next], 1)?;
        Ok(cat.matmul(w)?.broadcast_add(b)?)
    }

    /// Logits [n, TAGS] for a batch: `idx` [n·F] buckets, `mask` [n, 1] (0 on pad rows).
    fn logits(&self, idx: &Tensor, mask: &Tensor, n: usize, d: usize) -> Result<Tensor> {
        let x = self
            .emb
            .as_tensor()
            .index_select(idx, 0)?
            .reshape((n, FEATURES, d))?
            .sum(1)?
            .broadcast_mul(mask)?;
        let y1 = Self::conv(&x, &self.w1, &self.b1)?
            .relu()?
            .broadcast_mul(mask)?;
        let y2 = Self::conv(&y1, &self.w2, &self.b2)?
            .relu()?
            .broadcast_mul(mask)?;
        Ok(y2.matmul(&self.wo)?.broadcast_add(&self.bo)?)
    }

    fn save(&self, path: &str) -> Result<()> {
        let mut m = HashMap::new();
        for (name, v) in [
            ("emb", &self.emb),
            ("w1", &self.w1),
            ("b1", &self.b1),
            ("w2", &self.w2),
            ("b2", &self.b2),
            ("wo", &self.wo),
            ("bo", &self.bo),
        ] {
            m.insert(name.to_string(), v.as_tensor().to_dtype(DType::F16)?);
        }
        candle_core::safetensors::save(&m, path)?;
        Ok(())
    }
}

/// Span precision and recall of the shipped forward pass (whole sequence, no trigger gating):
/// a gold span counts as found when a predicted span of its type covers it.
fn evaluate(w: &TaggerWeights, recs: &[Record]) -> (f64, f64, f64, f64) {
    let (mut gp, mut fp_, mut ga, mut fa, mut pp, mut okp, mut pa, mut oka) =
        (0, 0, 0, 0, 0, 0, 0, 0);
    for r in recs {
        let probs = w.tag_probs(&r.units);
        let mut spans: Vec<(usize, usize, bool)> = Vec::new();
        let mut cur: Option<(usize, usize, bool)> = None;
        for (i, u) in r.units.iter().enumerate() {
            let p = &probs[i * TAGS..(i + 1) * TAGS];
            let t = (0..TAGS).fold(0, |b, k| if p[k] > p[b] { k } else { b });
            match (t, &mut cur) {
                (0, _) => {
                    spans.extend(cur.take());
                }
                (t, Some(c)) if (t == 2 || t == 4) && c.2 == (t == 4) => c.1 = u.end,
                (t, _) => {
                    spans.extend(cur.take());
                    cur = Some((u.start, u.end, t >= 3));
                }
            }
        }
        spans.extend(cur.take());
        for &(a, b, addr) in &r.gold {
            let hit = spans.iter().any(|s| s.2 == addr && s.0 <= a && s.1 >= b);
            if addr {
                ga += 1;
                fa += usize::from(hit);
            } else {
                gp += 1;
                fp_ += usize::from(hit);
            }
        }
        for s in &spans {
            let ok = r.gold.iter().any(|g| g.2 == s.2 && g.0 < s.1 && s.0 < g.1);
            if s.2 {
                pa += 1;
                oka += usize::from(ok);
            } else {
                pp += 1;
                okp += usize::from(ok);
            }
        }
    }
    let div = |a: usize, b: usize| a as f64 / b.max(1) as f64;
    (div(fp_, gp), div(okp, pp), div(fa, ga), div(oka, pa))
}

fn main() -> Result<()> {
    let a = Args::parse();
    if !a.buckets.is_power_of_two() {
        bail!("--buckets must be a power of two");
    }
    let t0 = Instant::now();
    let train = load(&a.train, a.buckets)?;
    let eval = a.eval.as_deref().map(|p| load(p, a.buckets)).transpose()?;
    let units: usize = train.iter().map(|r| r.units.len()).sum();
    eprintln!(
        "train: {} records, {units} units; loaded in {:.1}s",
        train.len(),
        t0.elapsed().as_secs_f64()
    );
    let dev = Device::Cpu;
    let mut rng = StdRng::seed_from_u64(a.seed);
    let model = Model::new(&a, &mut rng, &dev)?;
    let mut opt = AdamW::new(
        model.vars(),
        ParamsAdamW {
            lr: a.lr,
            weight_decay: 0.0,
            ..Default::default()
        },
    )?;
    let mut order: Vec<usize> = (0..train.len()).collect();
    let steps_per_epoch = units.div_ceil(a.batch);
    let total = steps_per_epoch * a.epochs;
    let mut step = 0;
    for epoch in 0..a.epochs {
        order.shuffle(&mut rng);
        let (mut loss_sum, mut nb) = (0.0, 0);
        let mut i = 0;
        while i < order.len() {
            let mut idx: Vec<u32> = Vec::with_capacity(a.batch * FEATURES);
            let mut mask: Vec<f32> = Vec::with_capacity(a.batch);
            let mut valid: Vec<u32> = Vec::new();
            let mut labels: Vec<u32> = Vec::new();
            while i < order.len() && mask.len() < a.batch {
                let r = &train[order[i]];
                i += 1;
                for (u, &t) in r.units.iter().zip(&r.tags) {
                    valid.push(mask.len() as u32);
                    labels.push(t);
                    mask.push(1.0);
                    for (k, &f) in u.feats.iter().enumerate() {
                        let hide = k == 1 && !u.sentinel && rng.random::<f64>() < a.word_dropout;
                        idx.push(if hide { 0 } else { f });
                    }
                }
                // one zero row between records: the convolutions see no neighbour across it
                mask.push(0.0);
                idx.extend([0u32; FEATURES]);
            }
            let n = mask.len();
            let idx = Tensor::from_vec(idx, n * FEATURES, &dev)?;
            let mask = Tensor::from_vec(mask, (n, 1), &dev)?;
            let nv = valid.len();
            let valid = Tensor::from_vec(valid, nv, &dev)?;
            let labels = Tensor::from_vec(labels, nv, &dev)?;
            let logits = model
                .logits(&idx, &mask, n, a.dim)?
                .index_select(&valid, 0)?;
            let loss = candle_nn::loss::cross_entropy(&logits, &labels)?;
            // linear decay to a tenth
            opt.set_learning_rate(a.lr * (1.0 - 0.9 * step as f64 / total as f64));
            opt.backward_step(&loss)?;
            loss_sum += loss.to_scalar::<f32>()? as f64;
            nb += 1;
            step += 1;
        }
        eprintln!(
            "epoch {epoch}: loss {:.4} ({:.0}s)",
            loss_sum / nb as f64,
            t0.elapsed().as_secs_f64()
        );
    }
    model.save(&a.out)?;
    let bytes = std::fs::read(&a.out)?;
    let w = TaggerWeights::from_safetensors(&bytes)?;
    eprintln!(
        "wrote {} ({} bytes) after {:.0}s",
        a.out,
        bytes.len(),
        t0.elapsed().as_secs_f64()
    );
    for (name, recs) in [("train", Some(&train)), ("eval", eval.as_ref())] {
        if let Some(recs) = recs {
            let (rp, pp, ra, pa) = evaluate(&w, recs);
            println!(
                "{name}: PERSON recall {rp:.3} precision {pp:.3}; ADDRESS recall {ra:.3} precision {pa:.3}"
            );
        }
    }
    Ok(())
}
