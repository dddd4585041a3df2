//! The output head and the log-softmax of the scored targets as one differentiable op.
//!
//! Composed from candle ops, a training step makes half a dozen tensors the size of the logits over the whole
//! vocabulary (logits, their softmax's temporaries, the gather's scatter, their gradients), each allocated,
//! zeroed and walked by candle's element-wise pool, and projected every position onto the vocabulary, scored or
//! not. Here the logits of scored positions are computed once (Q8_0 heads through the int8 kernel), turned into
//! probabilities in place, and kept for the backward pass, whose gradient is `g · (onehot(target) − p) · W`
//! (for weighted targets `g · (Σ w·onehot(t) − Σw·p) · W`), computed in row chunks (int8 as well for Q8_0
//! heads).

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::weight::{QuantWeight, TransposeCache};
use super::{QLinear, Weight};
use crate::model::{ModelError, Result};

/// Bytes of `[rows, vocab]` values per chunk of scored rows (85 rows of SmolLM2's vocabulary). The forward
/// keeps its probabilities chunk by chunk and the backward makes each chunk's gradient, multiplies it by the
/// head and drops it before the next. Below glibc's largest mmap threshold (32 MiB, set by
/// `malloc::tune_for_long_runs`), so every chunk comes from the heap and reuses the previous step's memory:
/// one buffer for all scored rows would be a fresh mapping each step, paying page faults and kernel zeroing.
const CHUNK_BYTES: usize = 16 << 20;

/// Scored rows per chunk for a vocabulary of `vocab` (see [`CHUNK_BYTES`]).
fn chunk_rows(vocab: usize) -> usize {
    (CHUNK_BYTES / (vocab.max(1) * std::mem::size_of::<f32>())).max(1)
}

/// What each position of a batch is scored against, in row-major order: nothing, one token (weight 1), or a
/// distribution over a few tokens (weights summing to 1, as a teacher's likeliest tokens), whose value is the
/// weighted log-probability `Σ w·log p(t)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Targets {
    /// Where each position's pairs start in `ids`/`weights`; one more entry than positions.
    offsets: Vec<usize>,
    ids: Vec<u32>,
    weights: Vec<f32>,
}

impl Targets {
    pub fn with_capacity(positions: usize) -> Self {
        let mut offsets = Vec::with_capacity(positions + 1);
        offsets.push(0);
        Self {
            offsets,
            ids: Vec::with_capacity(positions),
            weights: Vec::with_capacity(positions),
        }
    }

    /// Hard targets: `targets[i]` where `scored[i]`, nothing elsewhere.
    #[cfg(test)]
    fn tokens(targets: &[u32], scored: &[bool]) -> Self {
        let mut t = Self::with_capacity(targets.len());
        for (&id, &s) in targets.iter().zip(scored) {
            if s {
                t.push_token(id);
            } else {
                t.push_none();
            }
        }
        t
    }

    /// An unscored position.
    pub fn push_none(&mut self) {
        self.offsets.push(self.ids.len());
    }

    /// A position scored against one token.
    pub fn push_token(&mut self, id: u32) {
        self.push_soft(&[(id, 1.0)]);
    }

    /// A position scored against a distribution over a few tokens.
    pub fn push_soft(&mut self, pairs: &[(u32, f32)]) {
        for &(id, w) in pairs {
            self.ids.push(id);
            self.weights.push(w);
        }
        self.offsets.push(self.ids.len());
    }

    /// Positions.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every position's pairs at once: `offsets` (one more than positions), then the ids and weights they index.
    pub fn parts(&self) -> (&[usize], &[u32], &[f32]) {
        (&self.offsets, &self.ids, &self.weights)
    }

    /// The pairs of position `i`: token ids and weights.
    pub fn at(&self, i: usize) -> (&[u32], &[f32]) {
        let (s, e) = (self.offsets[i], self.offsets[i + 1]);
        (&self.ids[s..e], &self.weights[s..e])
    }
}

/// See [`super::Transformer::target_logps`]: `x` is the final norm's output `[positions, hidden]`.
pub(super) fn target_logps(head: &QLinear, x: &Tensor, targets: &Targets) -> Result<Tensor> {
    let rows_per_chunk = chunk_rows(head.out_features());
    target_logps_in_chunks(head, x, targets, rows_per_chunk)
}

/// [`target_logps`] with `rows_per_chunk` scored rows per chunk.
fn target_logps_in_chunks(
    head: &QLinear,
    x: &Tensor,
    targets: &Targets,
    rows_per_chunk: usize,
) -> Result<Tensor> {
    let vocab = head.out_features();
    let mut rows = Vec::new();
    let mut scored = Targets::with_capacity(targets.len());
    for i in 0..targets.len() {
        let (ids, weights) = targets.at(i);
        if ids.is_empty() {
            continue;
        }
        if let Some(t) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Input(format!(
                "target {t} at position {i} is outside the vocabulary of {vocab}"
            )));
        }
        rows.push(i);
        for (&t, &w) in ids.iter().zip(weights) {
            scored.ids.push(t);
            scored.weights.push(w);
        }
        scored.offsets.push(scored.ids.len());
    }
    let op = HeadLogps {
        head: head.weight.clone(),
        transposed: head.transposed.clone(),
        vocab,
        hidden: head.in_features(),
        rows,
        targets: scored,
        keep: x.track_op(),
        probs: Mutex::new(None),
        rows_per_chunk: rows_per_chunk.max(1),
    };
    Ok(x.to_dtype(DType::F32)?.contiguous()?.apply_op1(op)?)
}

struct HeadLogps {
    head: Weight,
    transposed: std::sync::Arc<TransposeCache>,
    vocab: usize,
    hidden: usize,
    /// Scored positions, ascending, and their targets (one entry per scored position).
    rows: Vec<usize>,
    targets: Targets,
    /// Whether a backward pass can follow (the input tracks gradients): then `probs` keeps the softmax.
    keep: bool,
    /// `[rows.len(), vocab]` softmax of the scored rows' logits, from the forward pass, in chunks of
    /// `rows_per_chunk` rows.
    probs: Mutex<Option<Vec<Vec<f32>>>>,
    /// Scored rows per chunk of the forward's logits and the backward's gradient ([`chunk_rows`]).
    rows_per_chunk: usize,
}

impl HeadLogps {
    /// `x_rows · Wᵀ` for `m` rows of `hidden` values, `[m, vocab]`.
    fn logits(&self, x_rows: Vec<f32>, m: usize) -> candle_core::Result<Vec<f32>> {
        if let Some(w) = self.head.int8() {
            let mut y = vec![0f32; m * self.vocab];
            w.int8_matmul(&super::weight::Int8Input::new(&x_rows, self.hidden), &mut y)
                .map_err(candle_core::Error::wrap)?;
            return Ok(y);
        }
        let x = Tensor::from_vec(x_rows, (m, self.hidden), &Device::Cpu)?;
        x.matmul(&self.dense()?.t()?)?.flatten_all()?.to_vec1()
    }

    /// What the backward pass multiplies by: an int8 head through its transpose requantized for the int8
    /// kernel ([`TransposeCache::input_grads`]), when the vocabulary is a multiple of 32; else the dense head.
    fn backward_weight(&self) -> candle_core::Result<BackwardWeight> {
        if let Some(w) = self.head.int8()
            && self.vocab.is_multiple_of(crate::model::q8::QK8_0)
        {
            return Ok(BackwardWeight::Int8(w));
        }
        Ok(BackwardWeight::Dense(self.dense()?))
    }

    /// The head as dense f32 `[vocab, hidden]`.
    fn dense(&self) -> candle_core::Result<Tensor> {
        self.head
            .dequantize()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))
    }
}

enum BackwardWeight {
    /// An int8 head, multiplied through its transpose.
    Int8(QuantWeight),
    /// f32 `[vocab, hidden]`.
    Dense(Tensor),
}

impl CustomOp1 for HeadLogps {
    fn name(&self) -> &'static str {
        "head-logps"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, d) = layout.shape().dims2()?;
        if d != self.hidden {
            candle_core::bail!(
                "head-logps: {d} hidden values, the head takes {}",
                self.hidden
            );
        }
        let x = super::train_ops::values(storage, layout, self.name())?;
        let mut out = vec![0f32; n];
        if self.rows.is_empty() {
            return Ok((CpuStorage::F32(out), Shape::from(n)));
        }
        let per_chunk = self.rows_per_chunk;
        let mut kept = Vec::new();
        for (c, rows) in self.rows.chunks(per_chunk).enumerate() {
            let mut x_rows = Vec::with_capacity(rows.len() * d);
            for &r in rows {
                x_rows.extend_from_slice(&x[r * d..(r + 1) * d]);
            }
            let mut probs = self.logits(x_rows, rows.len())?;
            let lps: Vec<f32> = probs
                .par_chunks_mut(self.vocab)
                .enumerate()
                .map(|(i, row)| {
                    let (ids, weights) = self.targets.at(c * per_chunk + i);
                    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    // Σ w·(logit − max), then less Σw·log Σ: for one token at weight 1, its log-softmax.
                    let (mut lp, mut total) = (0f32, 0f32);
                    for (&t, &w) in ids.iter().zip(weights) {
                        lp += w * (row[t as usize] - max);
                        total += w;
                    }
                    // One exponential per logit: kept as the unnormalised probability when a backward
                    // pass needs it, then scaled by 1 / Σ.
                    let sum = super::train_ops::exp_shifted(row, max);
                    if self.keep {
                        let inv = 1.0 / sum;
                        row.iter_mut().for_each(|v| *v *= inv);
                    }
                    lp - total * sum.ln()
                })
                .collect();
            for (&r, lp) in rows.iter().zip(lps) {
                out[r] = lp;
            }
            if self.keep {
                kept.push(probs);
            }
        }
        if self.keep {
            *self.probs.lock().unwrap_or_else(|e| e.into_inner()) = Some(kept);
        }
        Ok((CpuStorage::F32(out), Shape::from(n)))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let (n, d) = arg.dims2()?;
        let g: Vec<f32> = grad_res.to_dtype(DType::F32)?.to_vec1()?;
        // The forward's probabilities become the logits' gradient in place: one backward per forward.
        let taken = self.probs.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut dls) = taken else {
            candle_core::bail!("head-logps: backward without the forward's probabilities");
        };
        let v = self.vocab;
        let per_chunk = self.rows_per_chunk;
        let chunks: Vec<&[usize]> = self.rows.chunks(per_chunk).collect();
        for (c, (&rows, dl)) in chunks.iter().zip(dls.iter_mut()).enumerate() {
            // d lp / d logits = Σ w·onehot(t) − (Σ w)·p, times the incoming gradient of that position.
            dl.par_chunks_mut(v).enumerate().for_each(|(i, row)| {
                let (ids, weights) = self.targets.at(c * per_chunk + i);
                let gi = g[rows[i]];
                let total: f32 = weights.iter().sum();
                row.iter_mut().for_each(|p| *p *= -gi * total);
                for (&t, &w) in ids.iter().zip(weights) {
                    row[t as usize] += gi * w;
                }
            });
        }
        let mut dxs: Vec<Vec<f32>> = chunks
            .iter()
            .map(|rows| vec![0f32; rows.len() * d])
            .collect();
        match self.backward_weight()? {
            BackwardWeight::Int8(w) => {
                let mut products: Vec<(&[f32], usize, &mut [f32])> = dls
                    .iter()
                    .zip(dxs.iter_mut())
                    .map(|(dl, dx)| (&dl[..], dl.len() / v, &mut dx[..]))
                    .collect();
                self.transposed.input_grads(&w, &mut products)?;
            }
            BackwardWeight::Dense(w) => {
                for (dl, dx) in dls.into_iter().zip(dxs.iter_mut()) {
                    let m = dl.len() / v;
                    let dl = Tensor::from_vec(dl, (m, v), &Device::Cpu)?;
                    *dx = dl.matmul(&w)?.flatten_all()?.to_vec1()?;
                }
            }
        }
        let mut grad = vec![0f32; n * d];
        for (rows, dx) in chunks.iter().zip(&dxs) {
            for (i, &r) in rows.iter().enumerate() {
                grad[r * d..(r + 1) * d].copy_from_slice(&dx[i * d..(i + 1) * d]);
            }
        }
        Ok(Some(Tensor::from_vec(grad, (n, d), arg.device())?))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QTensor;
    use candle_core::{D, Var};

    use super::*;

    /// The fused op against candle's composition (matmul, log_softmax, gather) on the same dense head:
    /// the same log-probabilities at scored positions, zero elsewhere, and the same input gradient, which
    /// is zero at unscored positions, whether the scored rows make one chunk or many. A Q8_0 head (int8
    /// forward) agrees within its quantization error.
    #[test]
    fn fused_head_matches_the_composition() {
        let (n, d, v) = (21, 64, 320);
        let dev = &Device::Cpu;
        let w = Tensor::randn(0f32, 0.3, (v, d), dev).unwrap();
        let x0 = Tensor::randn(0f32, 1.0, (n, d), dev).unwrap();
        let targets: Vec<u32> = (0..n as u32).map(|i| i * 37 % v as u32).collect();
        let scored: Vec<bool> = (0..n).map(|i| i % 3 != 0).collect();
        let mask = Tensor::from_vec(
            scored.iter().map(|&s| s as u8 as f32).collect::<Vec<_>>(),
            n,
            dev,
        )
        .unwrap();
        let weights = Tensor::randn(0f32, 1.0, n, dev).unwrap();

        let x = Var::from_tensor(&x0).unwrap();
        let logits = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
        let lsm = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
        let t = Tensor::from_vec(targets.clone(), (n, 1), dev).unwrap();
        let want = (lsm.gather(&t, D::Minus1).unwrap().squeeze(1).unwrap() * &mask).unwrap();
        let loss = (&want * &weights).unwrap().sum_all().unwrap();
        let want_grad = loss.backward().unwrap().get(x.as_tensor()).unwrap().clone();

        let dense = QLinear::from_dense(w.clone()).unwrap();
        let q8 = QLinear::from_qtensor(std::sync::Arc::new(
            QTensor::quantize(&w, candle_core::quantized::GgmlDType::Q8_0).unwrap(),
        ))
        .unwrap();
        // One chunk (the default for this vocabulary), and chunks of 4 rows and of 1 (SmolLM2's vocabulary
        // makes 85-row chunks).
        for ((head, tol), rows_per_chunk) in [(&dense, 1e-5f32), (&q8, 0.03)]
            .into_iter()
            .flat_map(|h| [chunk_rows(v), 4, 1].map(|c| (h, c)))
        {
            assert!(chunk_rows(v) >= n);
            let x = Var::from_tensor(&x0).unwrap();
            let got = target_logps_in_chunks(
                head,
                x.as_tensor(),
                &Targets::tokens(&targets, &scored),
                rows_per_chunk,
            )
            .unwrap();
            let loss = (&got * &weights).unwrap().sum_all().unwrap();
            let grad = loss.backward().unwrap().get(x.as_tensor()).unwrap().clone();
            let (got, want): (Vec<f32>, Vec<f32>) =
                (got.to_vec1().unwrap(), want.to_vec1().unwrap());
            for i in 0..n {
                let close = (got[i] - want[i]).abs() <= tol * want[i].abs().max(1.0);
                assert!(close, "lp[{i}] {} vs {}", got[i], want[i]);
                assert!(scored[i] || got[i] == 0.0);
            }
            let (g, wg): (Vec<f32>, Vec<f32>) = (
                grad.flatten_all().unwrap().to_vec1().unwrap(),
                want_grad.flatten_all().unwrap().to_vec1().unwrap(),
            );
            let scale = wg.iter().fold(0f32, |a, b| a.max(b.abs()));
            for (i, (a, b)) in g.iter().zip(&wg).enumerate() {
                assert!((a - b).abs() <= tol * scale, "grad[{i}] {a} vs {b}");
                assert!(scored[i / d] || *a == 0.0);
            }
        }
    }

    /// Soft targets (a few tokens with weights summing to 1) against the composition `Σ w·log_softmax[t]`:
    /// the same values and input gradient, in one chunk and in chunks of 3 rows; unscored positions stay 0.
    #[test]
    fn soft_targets_match_the_composition() {
        let (n, d, v) = (9, 32, 200);
        let dev = &Device::Cpu;
        let w = Tensor::randn(0f32, 0.3, (v, d), dev).unwrap();
        let x0 = Tensor::randn(0f32, 1.0, (n, d), dev).unwrap();
        let mut targets = Targets::with_capacity(n);
        let mut dense = vec![0f32; n * v];
        for i in 0..n {
            if i % 4 == 3 {
                targets.push_none();
                continue;
            }
            let pairs: Vec<(u32, f32)> = (0..3)
                .map(|k| (((i * 31 + k * 17) % v) as u32, [0.6f32, 0.3, 0.1][k]))
                .collect();
            for &(t, wt) in &pairs {
                dense[i * v + t as usize] += wt;
            }
            targets.push_soft(&pairs);
        }
        let weights = Tensor::randn(0f32, 1.0, n, dev).unwrap();
        let x = Var::from_tensor(&x0).unwrap();
        let logits = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
        let lsm = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
        let q = Tensor::from_vec(dense, (n, v), dev).unwrap();
        let want = (lsm * q).unwrap().sum(1).unwrap();
        let loss = (&want * &weights).unwrap().sum_all().unwrap();
        let want_grad = loss.backward().unwrap().get(x.as_tensor()).unwrap().clone();
        let head = QLinear::from_dense(w).unwrap();
        for rows_per_chunk in [chunk_rows(v), 3] {
            let x = Var::from_tensor(&x0).unwrap();
            let got =
                target_logps_in_chunks(&head, x.as_tensor(), &targets, rows_per_chunk).unwrap();
            let loss = (&got * &weights).unwrap().sum_all().unwrap();
            let grad = loss.backward().unwrap().get(x.as_tensor()).unwrap().clone();
            let (got, want): (Vec<f32>, Vec<f32>) =
                (got.to_vec1().unwrap(), want.to_vec1().unwrap());
            for i in 0..n {
                assert!((got[i] - want[i]).abs() <= 1e-5 * want[i].abs().max(1.0));
                assert!(i % 4 != 3 || got[i] == 0.0);
            }
            let (g, wg): (Vec<f32>, Vec<f32>) = (
                grad.flatten_all().unwrap().to_vec1().unwrap(),
                want_grad.flatten_all().unwrap().to_vec1().unwrap(),
            );
            let scale = wg.iter().fold(0f32, |a, b| a.max(b.abs()));
            for (i, (a, b)) in g.iter().zip(&wg).enumerate() {
                assert!((a - b).abs() <= 1e-5 * scale, "grad[{i}] {a} vs {b}");
                assert!((i / d) % 4 != 3 || *a == 0.0);
            }
        }
    }
}
