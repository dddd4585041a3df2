//! Exact aggregation of LoRA adapters: average the updates ΔW = scale·B·A rather than A and B separately
//! (mean(B)·mean(A) ≠ mean(B·A)), then re-factor the aggregate to rank r by truncated SVD and report how much was
//! lost (relative Frobenius residual).
//!
//! For a (weighted) mean the aggregate is a product of concatenated factors, ΔW = [s·B₁ … s·B_K]·[w₁A₁; …; w_KA_K],
//! so its SVD comes exactly from two thin QRs and a (K·r)² Jacobi SVD without ever forming ΔW. Robust rules
//! (median, trimmed) are not low-rank preserving: they form each ΔW densely, aggregate per coordinate, and use a
//! randomized truncated SVD.

use super::aggregate::{self, AggregateError, Method, Out};
use super::linalg::{Mat, jacobi_svd, qr, randomized_svd};
use super::wire::{Delta, Tensor};

/// A lora_A / lora_B pair found in a delta, by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraPair {
    /// Key without the `.lora_A.weight` suffix.
    pub module: String,
    pub a: usize,
    pub b: usize,
}

/// Pairs PEFT `…lora_A.weight` [r, in] with `…lora_B.weight` [out, r].
pub fn find_lora_pairs(delta: &[Tensor]) -> Vec<LoraPair> {
    let mut out = Vec::new();
    for (ai, t) in delta.iter().enumerate() {
        if let Some(module) = t.name.strip_suffix(".lora_A.weight") {
            let bname = format!("{module}.lora_B.weight");
            if let Some(bi) = delta.iter().position(|x| x.name == bname) {
                out.push(LoraPair {
                    module: module.to_owned(),
                    a: ai,
                    b: bi,
                });
            }
        }
    }
    out
}

/// What re-factoring one module cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleReport {
    pub module: String,
    /// Rank of the exact aggregate before truncation (numerical).
    pub rank_before: usize,
    pub rank: usize,
    /// ‖ΔW − ΔW_r‖_F / ‖ΔW‖_F.
    pub rel_residual: f64,
}

/// Options for exact LoRA aggregation.
#[derive(Debug, Clone, Copy)]
pub struct ExactOptions {
    /// PEFT scale (`alpha/r` or `alpha/sqrt(r)`), the same for every worker.
    pub scale: f64,
    /// Output rank; usually the adapter's r.
    pub rank: usize,
    pub method: Method,
    /// Seed for the randomized SVD (robust rules only).
    pub seed: u64,
    pub threads: usize,
}

/// Aggregates adapter states exactly; non-LoRA tensors are aggregated per coordinate with the same rule.
pub fn aggregate_exact(
    states: &[Delta],
    weights: Option<&[f32]>,
    opts: ExactOptions,
) -> Result<(Delta, Vec<ModuleReport>), AggregateError> {
    let first = states.first().ok_or(AggregateError::Empty)?;
    for d in &states[1..] {
        aggregate::check_same_layout(first, d)?;
    }
    let k = states.len();
    let w: Vec<f64> = match weights {
        Some(w) if w.len() != k => {
            return Err(AggregateError::Weights(format!(
                "{} weights for {k} inputs",
                w.len()
            )));
        }
        Some(w) => aggregate::normalize_weights(w)?
            .iter()
            .map(|&x| x as f64)
            .collect(),
        None => vec![1.0 / k as f64; k],
    };
    let pairs = find_lora_pairs(first);
    let mut out: Delta = aggregate::aggregate_deltas(states, weights, opts.method, opts.threads)?;
    let mut reports = Vec::with_capacity(pairs.len());
    for p in &pairs {
        let (ta, tb) = (&first[p.a], &first[p.b]);
        if ta.shape.len() != 2 || tb.shape.len() != 2 || tb.shape[1] != ta.shape[0] {
            return Err(AggregateError::Mismatch(format!(
                "{}: lora shapes {:?} {:?}",
                p.module, ta.shape, tb.shape
            )));
        }
        let (r_in, n_in, n_out) = (ta.shape[0], ta.shape[1], tb.shape[0]);
        let rank = opts.rank.max(1).min(n_in).min(n_out);
        let (left, s, right, total2) = if matches!(opts.method, Method::Mean) {
            // Exact factored path.
            let kr = k * r_in;
            let mut bcat = Mat::zeros(n_out, kr);
            let mut acat_t = Mat::zeros(n_in, kr);
            for (wi, st) in states.iter().enumerate() {
                let (a, b) = (&st[p.a].data, &st[p.b].data);
                for o in 0..n_out {
                    for j in 0..r_in {
                        bcat.set(o, wi * r_in + j, opts.scale * b[o * r_in + j] as f64);
                    }
                }
                for j in 0..r_in {
                    for i in 0..n_in {
                        acat_t.set(i, wi * r_in + j, w[wi] * a[j * n_in + i] as f64);
                    }
                }
            }
            let (q1, r1) = qr(&bcat);
            let (q2, r2) = qr(&acat_t);
            let m = r1.matmul(&r2.transpose());
            let (u, s, v) = jacobi_svd(&m);
            let total2: f64 = s.iter().map(|x| x * x).sum();
            (q1.matmul(&u), s, q2.matmul(&v), total2)
        } else {
            // Dense robust path: per-coordinate rule over each worker's ΔW.
            let dense: Vec<Vec<f32>> = states
                .iter()
                .map(|st| {
                    let b = Mat::from_f32(n_out, r_in, &st[p.b].data);
                    let a = Mat::from_f32(r_in, n_in, &st[p.a].data);
                    b.matmul(&a)
                        .data
                        .iter()
                        .map(|&x| (opts.scale * x) as f32)
                        .collect()
                })
                .collect();
            let srcs: Vec<&[f32]> = dense.iter().map(|d| d.as_slice()).collect();
            let mut agg = vec![0f32; n_out * n_in];
            aggregate::aggregate_flat(
                &srcs,
                weights,
                opts.method,
                Out::F32(&mut agg),
                opts.threads,
            )?;
            let am = Mat::from_f32(n_out, n_in, &agg);
            let total2 = am.frob2();
            let (l, s, r) = randomized_svd(&am, rank, 8, 2, opts.seed);
            (l, s, r, total2)
        };
        let kept2: f64 = s.iter().take(rank).map(|x| x * x).sum();
        let rel_residual = if total2 > 0.0 {
            ((total2 - kept2).max(0.0) / total2).sqrt()
        } else {
            0.0
        };
        let smax = s.first().copied().unwrap_or(0.0);
        let rank_before = s
            .iter()
            .filter(|&&x| x > 1e-10 * smax.max(f64::MIN_POSITIVE))
            .count();
        // Balanced split: B' = U_r·sqrt(σ/scale), A' = sqrt(σ/scale)·V_rᵀ, so scale·B'·A' = ΔW_r. The output keeps
        // the input's r (zero-padded if the aggregate has lower rank) so the adapter config stays valid.
        let mut a_new = vec![0f32; r_in * n_in];
        let mut b_new = vec![0f32; n_out * r_in];
        let sc = if opts.scale != 0.0 { opts.scale } else { 1.0 };
        for j in 0..rank.min(r_in).min(s.len()) {
            let f = (s[j] / sc).abs().sqrt();
            for o in 0..n_out {
                b_new[o * r_in + j] = (left.at(o, j) * f * sc.signum()) as f32;
            }
            for i in 0..n_in {
                a_new[j * n_in + i] = (right.at(i, j) * f) as f32;
            }
        }
        out[p.a] = Tensor::new(ta.name.clone(), ta.shape.clone(), a_new);
        out[p.b] = Tensor::new(tb.name.clone(), tb.shape.clone(), b_new);
        reports.push(ModuleReport {
            module: p.module.clone(),
            rank_before,
            rank: rank.min(r_in),
            rel_residual,
        });
    }
    Ok((out, reports))
}

/// ΔW = scale·B·A for one module of a state, row-major [out, in], in f64 (for checks and export).
pub fn delta_w(state: &[Tensor], pair: &LoraPair, scale: f64) -> Mat {
    let (a, b) = (&state[pair.a], &state[pair.b]);
    let bm = Mat::from_f32(b.shape[0], b.shape[1], &b.data);
    let am = Mat::from_f32(a.shape[0], a.shape[1], &a.data);
    let mut d = bm.matmul(&am);
    d.data.iter_mut().for_each(|x| *x *= scale);
    d
}
