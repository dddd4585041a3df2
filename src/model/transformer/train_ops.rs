//! Training's norm, attention softmax, rotary embedding and MLP activation as single differentiable ops.
//!
//! candle's fused versions of these have no backward (see `shared/specs/candle-notes.md`), so training used
//! the compositions (`rms_norm_slow`, `softmax` after a scale and a mask add, `rope_slow`): five to ten
//! element-wise tensors each way per call, every one allocated and walked by candle's element-wise pool.
//! Each op here is one pass forward and one backward, with the gradient written out by hand:
//! - RMS norm `y = w · x · r`, `r = (mean x² + ε)^-½`: `dx = r · w·g − x · r³ · mean(w·g·x)` (the weight is
//!   frozen: no gradient for it).
//! - Softmax of `scale · x` with the causal mask: `dx = scale · y · (g − Σ g·y)`, from the output alone.
//! - Rotary embedding, a rotation per pair: the backward rotates the gradient back (`sin` negated).
//! - The gated MLP's `silu(g) · u`: `du = dy · silu(g)`, `dg = dy · u · σ(g) · (1 + g · (1 − σ(g)))`.
//! - The residual add `a + b`: the gradient passes to both.
//!
//! Inference over several positions (prefill) uses the softmax, the activation and the add too: candle runs
//! element-wise ops of 64K values and up on its own thread pool, whose worker then spins beside hearth's
//! rayon threads and takes their cores.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::model::Result;

/// Rows per parallel task in these ops (a row is one hidden vector or one query's scores).
const ROWS_PER_TASK: usize = 16;
/// Elements per parallel task of the element-wise op.
const ELEMENTS_PER_TASK: usize = 1 << 14;

/// `e^x` in plain arithmetic that vectorizes: `f32::exp` is a libm call per value the compiler cannot vectorize,
/// and the softmaxes and SiLU call it for every value. This is `2^n · e^r` with `n = round(x / ln 2)` and a
/// degree-6 Taylor polynomial for `e^r`, `|r| ≤ ln 2 / 2` (relative error below 3e-7, see the test). `x` is
/// clamped to [−87, 88]: below, `e^−87` (≈ 1.6e-38) stands for zero.
#[inline(always)]
pub(super) fn exp_approx(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding then subtracting 1.5 · 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `v ← e^(v − shift)` for every value, returning their sum: a softmax's exponentials.
pub(super) fn exp_shifted(values: &mut [f32], shift: f32) -> f32 {
    for v in values.iter_mut() {
        *v = exp_approx(*v - shift);
    }
    values.iter().sum()
}

/// The contiguous f32 values of a CPU input.
pub(super) fn values<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    op: &str,
) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(x) = storage else {
        candle_core::bail!("{op}: the input must be f32");
    };
    if !layout.is_contiguous() {
        candle_core::bail!("{op}: the input must be contiguous");
    }
    Ok(&x[layout.start_offset()..layout.start_offset() + layout.shape().elem_count()])
}

/// The CPU storage behind a tensor's storage guard.
pub(super) fn cpu_storage(storage: &candle_core::Storage) -> candle_core::Result<&CpuStorage> {
    match storage {
        candle_core::Storage::Cpu(c) => Ok(c),
        _ => candle_core::bail!("hearth's training ops run on CPU tensors only"),
    }
}

/// `‖a − b‖ / ‖b‖` over all values, for the fused ops' tests against candle's compositions.
#[cfg(test)]
pub(super) fn relative_difference(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (to_vec(a).unwrap_or_default(), to_vec(b).unwrap_or_default());
    assert!(
        a.len() == b.len() && !b.is_empty(),
        "shapes differ or are empty"
    );
    let d: f32 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f32>()
        .sqrt();
    let n: f32 = b.iter().map(|y| y * y).sum::<f32>().sqrt();
    assert!(n > 0.0);
    d / n
}

/// The contiguous f32 values of a tensor, copied.
fn to_vec(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
}

/// `f(out_row, a_row, b_row)` over rows of `width` values, in parallel tasks of [`ROWS_PER_TASK`] rows; the
/// output starts zeroed.
fn map_rows(
    width: usize,
    a: &[f32],
    b: &[f32],
    f: impl Fn(&mut [f32], &[f32], &[f32]) + Sync,
) -> Vec<f32> {
    let mut out = vec![0f32; a.len()];
    let task = width * ROWS_PER_TASK;
    out.par_chunks_mut(task)
        .zip(a.par_chunks(task).zip(b.par_chunks(task)))
        .for_each(|(out, (a, b))| {
            for (out, (a, b)) in out
                .chunks_exact_mut(width)
                .zip(a.chunks_exact(width).zip(b.chunks_exact(width)))
            {
                f(out, a, b);
            }
        });
    out
}

/// `f(a, b)` of two same-shaped inputs element by element, in parallel tasks of [`ELEMENTS_PER_TASK`].
fn zip_values(
    op: &str,
    (s1, l1): (&CpuStorage, &Layout),
    (s2, l2): (&CpuStorage, &Layout),
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> candle_core::Result<(CpuStorage, Shape)> {
    let (a, b) = (values(s1, l1, op)?, values(s2, l2, op)?);
    if l1.shape() != l2.shape() {
        candle_core::bail!("{op}: shapes {:?} and {:?}", l1.shape(), l2.shape());
    }
    let mut y = vec![0f32; a.len()];
    y.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(
            a.par_chunks(ELEMENTS_PER_TASK)
                .zip(b.par_chunks(ELEMENTS_PER_TASK)),
        )
        .for_each(|(y, (a, b))| {
            for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                *y = f(a, b);
            }
        });
    Ok((CpuStorage::F32(y), l1.shape().clone()))
}

struct RmsNorm {
    w: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    fn inv_rms(&self, row: &[f32]) -> f32 {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
        1.0 / (ms + self.eps).sqrt()
    }
}

impl CustomOp1 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm-train"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = values(s, l, self.name())?;
        let d = self.w.len();
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(d * ROWS_PER_TASK)
            .zip(x.par_chunks(d * ROWS_PER_TASK))
            .for_each(|(y, x)| {
                for (y, x) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                    let r = self.inv_rms(x);
                    for ((y, x), w) in y.iter_mut().zip(x).zip(&self.w) {
                        *y = w * x * r;
                    }
                }
            });
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, g: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let (x, g) = (to_vec(arg)?, to_vec(g)?);
        let d = self.w.len();
        let dx = map_rows(d, &x, &g, |dx, x, g| {
            let r = self.inv_rms(x);
            let dot: f32 = x
                .iter()
                .zip(g)
                .zip(&self.w)
                .map(|((x, g), w)| x * g * w)
                .sum();
            let c = r * r * r * dot / d as f32;
            for (((dx, x), g), w) in dx.iter_mut().zip(x).zip(g).zip(&self.w) {
                *dx = r * w * g - x * c;
            }
        });
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}

/// RMS norm over the last axis, differentiable with respect to `x` (`w` is frozen).
pub(super) fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let op = RmsNorm { w: to_vec(w)?, eps };
    if x.dims().last() != Some(&op.w.len()) {
        return Err(crate::model::ModelError::Input(format!(
            "rms norm of {:?} with a weight of {}",
            x.dims(),
            op.w.len()
        )));
    }
    Ok(x.to_dtype(DType::F32)?.contiguous()?.apply_op1(op)?)
}

struct CausalSoftmax {
    scale: f32,
    /// With the mask: query rows repeat every `l` rows (grouped heads), key `j` is visible to query `i`
    /// when `j <= i + offset`.
    causal: Option<(usize, usize)>,
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax-train"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = values(s, l, self.name())?;
        let t = l.shape().dims().last().copied().unwrap_or(1).max(1);
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(t * ROWS_PER_TASK)
            .zip(x.par_chunks(t * ROWS_PER_TASK))
            .enumerate()
            .for_each(|(task, (y, x))| {
                for (i, (y, x)) in y.chunks_exact_mut(t).zip(x.chunks_exact(t)).enumerate() {
                    let row = task * ROWS_PER_TASK + i;
                    let visible = match self.causal {
                        Some((l, offset)) => (row % l + offset + 1).min(t),
                        None => t,
                    };
                    let max = x[..visible]
                        .iter()
                        .fold(f32::NEG_INFINITY, |m, v| m.max(v * self.scale));
                    for (y, x) in y[..visible].iter_mut().zip(x) {
                        *y = x * self.scale;
                    }
                    let sum = exp_shifted(&mut y[..visible], max);
                    let inv = 1.0 / sum;
                    y[..visible].iter_mut().for_each(|y| *y *= inv);
                }
            });
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, res: &Tensor, g: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let (y, g) = (to_vec(res)?, to_vec(g)?);
        let t = arg.dims().last().copied().unwrap_or(1).max(1);
        let dx = map_rows(t, &y, &g, |dx, y, g| {
            let dot: f32 = y.iter().zip(g).map(|(y, g)| y * g).sum();
            for ((dx, y), g) in dx.iter_mut().zip(y).zip(g) {
                *dx = self.scale * y * (g - dot);
            }
        });
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}

/// `softmax(scale · x)` over the last axis; with `causal = Some((l, offset))`, rows are queries repeating
/// every `l` rows and key `j` is masked out for query `i` when `j > i + offset`.
pub(super) fn causal_softmax(
    x: &Tensor,
    scale: f32,
    causal: Option<(usize, usize)>,
) -> Result<Tensor> {
    let op = CausalSoftmax { scale, causal };
    Ok(x.to_dtype(DType::F32)?.contiguous()?.apply_op1(op)?)
}

struct SiluMul;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_approx(-x))
}

impl CustomOp2 for SiluMul {
    fn name(&self) -> &'static str {
        "silu-mul-train"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        zip_values(self.name(), (s1, l1), (s2, l2), |g, u| g * sigmoid(g) * u)
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (gv, uv, dyv) = (to_vec(g)?, to_vec(u)?, to_vec(dy)?);
        let mut dg = vec![0f32; gv.len()];
        let mut du = vec![0f32; gv.len()];
        dg.par_chunks_mut(ELEMENTS_PER_TASK)
            .zip(du.par_chunks_mut(ELEMENTS_PER_TASK))
            .zip(gv.par_chunks(ELEMENTS_PER_TASK))
            .zip(
                uv.par_chunks(ELEMENTS_PER_TASK)
                    .zip(dyv.par_chunks(ELEMENTS_PER_TASK)),
            )
            .for_each(|(((dg, du), g), (u, dy))| {
                for i in 0..g.len() {
                    let s = sigmoid(g[i]);
                    du[i] = dy[i] * g[i] * s;
                    dg[i] = dy[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
                }
            });
        Ok((
            Some(Tensor::from_vec(dg, g.shape(), g.device())?),
            Some(Tensor::from_vec(du, u.shape(), u.device())?),
        ))
    }
}

/// `silu(g) · u` (the gated MLP's activation), differentiable in both.
pub(super) fn silu_mul(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    let (g, u) = (
        g.to_dtype(DType::F32)?.contiguous()?,
        u.to_dtype(DType::F32)?.contiguous()?,
    );
    Ok(g.apply_op2(&u, SiluMul)?)
}

struct Add;

impl CustomOp2 for Add {
    fn name(&self) -> &'static str {
        "residual-add"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        zip_values(self.name(), (s1, l1), (s2, l2), |a, b| a + b)
    }

    fn bwd(
        &self,
        _a: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(dy.clone()), Some(dy.clone())))
    }
}

/// `a + b` of two same-shaped tensors (the residual stream), differentiable in both. candle's add of a
/// prefill's or a training step's activations (64K values and up) runs on candle's own element-wise pool,
/// whose worker then spins beside hearth's rayon threads on the same cores; this runs on rayon.
pub(super) fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b) = (
        a.to_dtype(DType::F32)?.contiguous()?,
        b.to_dtype(DType::F32)?.contiguous()?,
    );
    Ok(a.apply_op2(&b, Add)?)
}

struct Rotary {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

impl Rotary {
    fn rotate(&self, x: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        use candle_nn::rotary_emb as re;
        if self.interleaved {
            re::rope_i(x, &self.cos, sin)
        } else {
            re::rope(x, &self.cos, sin)
        }
    }
}

impl CustomOp1 for Rotary {
    fn name(&self) -> &'static str {
        "rope-train"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = Tensor::from_slice(values(s, l, self.name())?, l.shape(), &Device::Cpu)?;
        let y = self.rotate(&x, &self.sin)?;
        Ok((CpuStorage::F32(to_vec(&y)?), l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, g: &Tensor) -> candle_core::Result<Option<Tensor>> {
        // A rotation's transpose is the rotation by the opposite angle.
        Ok(Some(self.rotate(&g.contiguous()?, &self.sin.neg()?)?))
    }
}

/// candle's fused rotary embedding (`x: [b, heads, l, d]` contiguous; `cos`, `sin`: `[l, d/2]`) with a
/// backward pass.
pub(super) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, interleaved: bool) -> Result<Tensor> {
    let op = Rotary {
        cos: cos.contiguous()?,
        sin: sin.contiguous()?,
        interleaved,
    };
    Ok(x.to_dtype(DType::F32)?.contiguous()?.apply_op1(op)?)
}

#[cfg(test)]
mod tests {
    use candle_core::{D, Var};

    use super::*;

    /// Values and input gradients of `fused` and `composed` (candle's differentiable compositions) agree.
    fn agree(
        x0: &Tensor,
        fused: impl Fn(&Tensor) -> Tensor,
        composed: impl Fn(&Tensor) -> Tensor,
        what: &str,
    ) {
        let weights = Tensor::randn(0f32, 1.0, x0.shape(), &Device::Cpu).unwrap();
        let run = |f: &dyn Fn(&Tensor) -> Tensor| {
            let x = Var::from_tensor(x0).unwrap();
            let y = f(x.as_tensor());
            let loss = (&y * &weights).unwrap().sum_all().unwrap();
            let g = loss.backward().unwrap().get(x.as_tensor()).unwrap().clone();
            (to_vec(&y).unwrap(), to_vec(&g).unwrap())
        };
        let (fy, fg) = run(&fused);
        let (cy, cg) = run(&composed);
        for (name, a, b) in [("value", &fy, &cy), ("gradient", &fg, &cg)] {
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in a.iter().zip(b.iter()).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * scale.max(1.0),
                    "{what} {name}[{i}]: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn exp_shifted_matches_libm() {
        let xs: Vec<f32> = (0..20_000).map(|i| -86.0 + i as f32 * 0.0087).collect();
        let mut got = xs.clone();
        let sum = exp_shifted(&mut got, 0.5);
        for (x, g) in xs.iter().zip(&got) {
            let want = ((x - 0.5) as f64).exp();
            assert!(
                ((*g as f64 - want) / want).abs() < 3e-7,
                "e^({x} - 0.5): {g} vs {want}"
            );
        }
        assert_eq!(sum, got.iter().sum::<f32>());
        // Far below the range: a tiny positive value, never a NaN or an infinity.
        let mut low = [-1e30f32, f32::NEG_INFINITY];
        exp_shifted(&mut low, 0.0);
        assert!(low.iter().all(|v| *v >= 0.0 && *v < 1e-37));
    }

    #[test]
    fn rms_norm_matches_the_composition() {
        let x = Tensor::randn(0f32, 2.0, (3, 5, 64), &Device::Cpu).unwrap();
        let w = Tensor::randn(1f32, 0.3, 64, &Device::Cpu).unwrap();
        agree(
            &x,
            |x| rms_norm(x, &w, 1e-5).unwrap(),
            |x| candle_nn::ops::rms_norm_slow(x, &w, 1e-5).unwrap(),
            "rms norm",
        );
    }

    /// Rows of two grouped heads (`l` queries each) over `t` keys, with and without the causal mask, at
    /// offset 0 and 2.
    #[test]
    fn causal_softmax_matches_the_composition() {
        let (l, t) = (5, 7);
        let x = Tensor::randn(0f32, 3.0, (2, 2 * l, t), &Device::Cpu).unwrap();
        for causal in [None, Some((l, 2))] {
            let mask: Vec<f32> = (0..2 * l)
                .flat_map(|r| {
                    (0..t).map(move |j| match causal {
                        Some((l, off)) if j > r % l + off => f32::NEG_INFINITY,
                        _ => 0.0,
                    })
                })
                .collect();
            let mask = Tensor::from_vec(mask, (2 * l, t), &Device::Cpu).unwrap();
            agree(
                &x,
                |x| causal_softmax(x, 0.3, causal).unwrap(),
                |x| {
                    let s = (x * 0.3).unwrap().broadcast_add(&mask).unwrap();
                    candle_nn::ops::softmax(&s, D::Minus1).unwrap()
                },
                "softmax",
            );
        }
    }

    /// [`agree`] in each input of a two-input op in turn, the other held fixed.
    fn agree_in_both(
        a: &Tensor,
        b: &Tensor,
        fused: impl Fn(&Tensor, &Tensor) -> Tensor,
        composed: impl Fn(&Tensor, &Tensor) -> Tensor,
        what: &str,
    ) {
        agree(
            a,
            |a| fused(a, b),
            |a| composed(a, b),
            &format!("{what} (first)"),
        );
        agree(
            b,
            |b| fused(a, b),
            |b| composed(a, b),
            &format!("{what} (second)"),
        );
    }

    /// Over more values than one parallel task holds, so the split is exercised.
    #[test]
    fn add_matches_candles_add() {
        let a = Tensor::randn(0f32, 1.0, (3, 7000), &Device::Cpu).unwrap();
        let b = Tensor::randn(0f32, 1.0, (3, 7000), &Device::Cpu).unwrap();
        agree_in_both(
            &a,
            &b,
            |a, b| add(a, b).unwrap(),
            |a, b| (a + b).unwrap(),
            "add",
        );
    }

    /// Both inputs' gradients, against candle's `silu` and `mul`.
    #[test]
    fn silu_mul_matches_the_composition() {
        let g = Tensor::randn(0f32, 3.0, (4, 300), &Device::Cpu).unwrap();
        let u = Tensor::randn(0f32, 1.0, (4, 300), &Device::Cpu).unwrap();
        agree_in_both(
            &g,
            &u,
            |g, u| silu_mul(g, u).unwrap(),
            |g, u| (g.silu().unwrap() * u).unwrap(),
            "silu-mul",
        );
    }

    #[test]
    fn rope_matches_the_composition() {
        let (l, d) = (6, 16);
        let x = Tensor::randn(0f32, 1.0, (2, 3, l, d), &Device::Cpu).unwrap();
        let angles = Tensor::randn(0f32, 2.0, (l, d / 2), &Device::Cpu).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        use candle_nn::rotary_emb as re;
        for interleaved in [false, true] {
            agree(
                &x,
                |x| rope(x, &cos, &sin, interleaved).unwrap(),
                |x| {
                    if interleaved {
                        re::rope_i_slow(x, &cos, &sin).unwrap()
                    } else {
                        re::rope_slow(x, &cos, &sin).unwrap()
                    }
                },
                "rope",
            );
        }
    }
}
