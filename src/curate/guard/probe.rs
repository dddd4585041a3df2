//! A guard probe: one-vs-rest logistic heads on a frozen base model's pooled residual stream
//! ([`super::embed`]), trained on the prompt side of the builtin guard's training data. Measured
//! by `examples/guard_probe.rs` (figures in `docs/guard.md`); not yet a graph backend.
//!
//! Why: the builtin guard knows only the words of its training prompts; the base model has read
//! far more text, so an unsafe prompt in words the guard data lacks can still land near the
//! training prompts it means the same as.

use super::data::{COMPOSED_BASE, Split, dataset};
use super::{CategoryScores, GuardError, Side};

/// Expansions of each prompt template kept for the probe's training (every composed prompt is
/// kept): expansions of one template differ in a filler word, and each costs a forward.
const PER_TEMPLATE: usize = 3;
const LR: f32 = 0.01;
/// Logistic heads over standardised features: `w[j * 9 + h]` for feature `j`, category `h`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeHead {
    mean: Vec<f32>,
    scale: Vec<f32>,
    w: Vec<f32>,
    b: [f32; 9],
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

impl ProbeHead {
    /// Full-batch Adam on the logistic loss, positives weighted up per category as the builtin
    /// guard does (square root of the imbalance, capped at 6).
    pub fn train(xs: &[Vec<f32>], ys: &[[f32; 9]], l2: f32, epochs: usize) -> Self {
        let d = xs.first().map_or(0, Vec::len);
        let n = xs.len().max(1) as f32;
        let mut mean = vec![0f32; d];
        for x in xs {
            for (m, v) in mean.iter_mut().zip(x) {
                *m += v / n;
            }
        }
        let mut var = vec![0f32; d];
        for x in xs {
            for ((s, v), m) in var.iter_mut().zip(x).zip(&mean) {
                *s += (v - m).powi(2) / n;
            }
        }
        let scale: Vec<f32> = var.iter().map(|v| 1.0 / (v.sqrt() + 1e-3)).collect();
        let us: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| {
                x.iter()
                    .zip(&mean)
                    .zip(&scale)
                    .map(|((v, m), s)| (v - m) * s)
                    .collect()
            })
            .collect();
        let mut pos = [0f32; 9];
        for y in ys {
            for (p, v) in pos.iter_mut().zip(y) {
                *p += v;
            }
        }
        let pw = pos.map(|p| {
            if p > 0.0 {
                ((n - p) / p).sqrt().clamp(1.0, 6.0)
            } else {
                1.0
            }
        });
        let mut w = vec![0f32; d * 9];
        let mut b = [0f32; 9];
        let (mut mw, mut vw) = (vec![0f32; d * 9], vec![0f32; d * 9]);
        let (mut mb, mut vb) = ([0f32; 9], [0f32; 9]);
        let (b1, b2) = (0.9f32, 0.999f32);
        let mut gw = vec![0f32; d * 9];
        for t in 1..=epochs {
            gw.iter_mut().for_each(|g| *g = 0.0);
            let mut gb = [0f32; 9];
            for (u, y) in us.iter().zip(ys) {
                let z = logits(&w, &b, u);
                let mut g = [0f32; 9];
                for h in 0..9 {
                    let wt = if y[h] > 0.0 { pw[h] } else { 1.0 };
                    g[h] = (sigmoid(z[h]) - y[h]) * wt / n;
                    gb[h] += g[h];
                }
                for (row, &v) in gw.chunks_exact_mut(9).zip(u) {
                    for (r, gh) in row.iter_mut().zip(&g) {
                        *r += gh * v;
                    }
                }
            }
            let (c1, c2) = (1.0 - b1.powi(t as i32), 1.0 - b2.powi(t as i32));
            let adam = |p: &mut f32, m: &mut f32, v: &mut f32, g: f32| {
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                *p -= LR * (*m / c1) / ((*v / c2).sqrt() + 1e-8);
            };
            for i in 0..d * 9 {
                let g = gw[i] + l2 * w[i];
                adam(&mut w[i], &mut mw[i], &mut vw[i], g);
            }
            for h in 0..9 {
                adam(&mut b[h], &mut mb[h], &mut vb[h], gb[h]);
            }
        }
        ProbeHead { mean, scale, w, b }
    }

    /// Features the head reads.
    pub fn dim(&self) -> usize {
        self.mean.len()
    }

    /// Category probabilities of one embedding.
    pub fn scores(&self, x: &[f32]) -> CategoryScores {
        let u: Vec<f32> = x
            .iter()
            .zip(&self.mean)
            .zip(&self.scale)
            .map(|((v, m), s)| (v - m) * s)
            .collect();
        logits(&self.w, &self.b, &u).map(sigmoid)
    }
}

fn logits(w: &[f32], b: &[f32; 9], u: &[f32]) -> [f32; 9] {
    let mut z = *b;
    for (row, &v) in w.chunks_exact(9).zip(u) {
        for (zh, wh) in z.iter_mut().zip(row) {
            *zh += wh * v;
        }
    }
    z
}

/// The probe's training prompts and their category targets: the prompt side of the builtin
/// guard's training split, every composed prompt and [`PER_TEMPLATE`] expansions per template.
pub fn training_set() -> Result<(Vec<String>, Vec<[f32; 9]>), GuardError> {
    let mut per = std::collections::HashMap::new();
    let mut texts = Vec::new();
    let mut ys = Vec::new();
    for s in dataset(Split::Train)? {
        if s.side != Side::Prompt {
            continue;
        }
        let n = per.entry(s.template).or_insert(0usize);
        *n += 1;
        if s.template < COMPOSED_BASE && *n > PER_TEMPLATE {
            continue;
        }
        let mut y = [0f32; 9];
        for c in &s.labels {
            y[c.index()] = 1.0;
        }
        texts.push(s.text);
        ys.push(y);
    }
    Ok((texts, ys))
}
