//! Training's attention core as one graph node: from the projected `q`, `k`, `v` (`[b, l, heads·d]`) to the
//! context `[b, l, nh·d]` that enters the output projection, with the rotary embedding, the causal softmax and
//! grouped-query heads inside.
//!
//! Composed from candle ops the core is about fifteen nodes (reshapes, transposes copied to contiguous, two
//! rotary embeddings, the score and context matmuls, the softmax), and candle's backward zero-fills and adds
//! a gradient tensor for each, on one thread. Here each (sequence, kv head) pair is one parallel task, and the
//! node keeps its attention probabilities for the backward (`g·l × l` values per task; 2.4 MB per SmolLM2 layer
//! at batch 4 × 128; recomputed if they are gone):
//! - forward: `S = scale · Qg·Kᵀ` with the causal mask, `P = softmax(S)`, `O = P·V`;
//! - backward: `dV = Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = scale · P ⊙ (dP − Σ dP⊙P)`, `dQ = dS·K`, `dK = dSᵀ·Q`, and
//!   the rotation undone on `dQ` and `dK`.
//!
//! `Qg` stacks the `g` query heads that share a kv head (`g·l` rows), as the composed path does.

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::f32_gemm::{Mat, gemm};

/// The fused node; see the module doc. Positions start at 0 (training has no cache).
pub(super) struct AttentionCore {
    pub(super) num_heads: usize,
    pub(super) num_kv_heads: usize,
    pub(super) head_dim: usize,
    /// `[positions, d/2]` tables, row-major, covering at least `l` positions.
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
    /// Pairs `(2i, 2i+1)` (GGUF Llama) rather than `(i, i + d/2)` (Qwen3).
    pub(super) interleaved: bool,
    /// Each task's probabilities from the forward, taken by the backward.
    pub(super) probabilities: std::sync::Mutex<Option<Vec<Vec<f32>>>>,
}

/// One task's inputs: the rotated queries of a kv head's group (`[g·l, d]`), its rotated keys and its values
/// (`[l, d]` each).
struct Group {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl AttentionCore {
    fn check(&self, q: &Shape, k: &Shape, v: &Shape) -> candle_core::Result<(usize, usize)> {
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let (b, l) = match q.dims() {
            [b, l, ..] => (*b, *l),
            _ => candle_core::bail!("attention-core: q {q:?} is not [b, l, ..]"),
        };
        let fits = |s: &Shape, heads: usize| {
            s.elem_count() == b * l * heads * d && s.dims()[..2] == [b, l]
        };
        if nkv == 0
            || !nh.is_multiple_of(nkv)
            || !d.is_multiple_of(2)
            || !fits(q, nh)
            || k.dims().len() < 2
            || v.dims().len() < 2
            || !fits(k, nkv)
            || !fits(v, nkv)
            || self.cos.len() < l * d / 2
            || self.sin.len() != self.cos.len()
        {
            candle_core::bail!(
                "attention-core: q {q:?}, k {k:?}, v {v:?} do not fit {nh} heads, {nkv} kv heads of {d}"
            );
        }
        Ok((b, l))
    }

    /// Rotates one head vector at position `pos` in place; `sign` −1 rotates back.
    fn rotate(&self, x: &mut [f32], pos: usize, sign: f32) {
        let half = self.head_dim / 2;
        let (cos, sin) = (
            &self.cos[pos * half..(pos + 1) * half],
            &self.sin[pos * half..(pos + 1) * half],
        );
        for i in 0..half {
            let (a, b) = if self.interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (c, s) = (cos[i], sign * sin[i]);
            let (xa, xb) = (x[a], x[b]);
            x[a] = xa * c - xb * s;
            x[b] = xa * s + xb * c;
        }
    }

    /// Gathers (and rotates, for `q` and `k`) the rows of sequence `bi`, kv head `h`.
    fn group(&self, q: &[f32], k: &[f32], v: &[f32], l: usize, bi: usize, h: usize) -> Group {
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let g = nh / nkv;
        let mut gq = vec![0f32; g * l * d];
        for j in 0..g {
            for i in 0..l {
                let src = ((bi * l + i) * nh + h * g + j) * d;
                let row = &mut gq[(j * l + i) * d..(j * l + i + 1) * d];
                row.copy_from_slice(&q[src..src + d]);
                self.rotate(row, i, 1.0);
            }
        }
        let (mut gk, mut gv) = (vec![0f32; l * d], vec![0f32; l * d]);
        for i in 0..l {
            let src = ((bi * l + i) * nkv + h) * d;
            gk[i * d..(i + 1) * d].copy_from_slice(&k[src..src + d]);
            self.rotate(&mut gk[i * d..(i + 1) * d], i, 1.0);
            gv[i * d..(i + 1) * d].copy_from_slice(&v[src..src + d]);
        }
        Group {
            q: gq,
            k: gk,
            v: gv,
        }
    }

    /// `P = softmax(scale · Qg·Kᵀ)` under the causal mask (row `r` is query position `r mod l`), `[g·l, l]`.
    fn probabilities(&self, grp: &Group, l: usize) -> candle_core::Result<Vec<f32>> {
        let d = self.head_dim;
        let rows = grp.q.len() / d;
        let mut p = vec![0f32; rows * l];
        let scale = 1.0 / (d as f32).sqrt();
        gemm(
            &mut p,
            false,
            Mat::new(&grp.q, rows, d),
            Mat::new(&grp.k, l, d).t(),
            scale,
            false,
        )?;
        for (r, row) in p.chunks_exact_mut(l).enumerate() {
            let visible = r % l + 1;
            let max = row[..visible]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let inv = 1.0 / super::train_ops::exp_shifted(&mut row[..visible], max);
            row[..visible].iter_mut().for_each(|s| *s *= inv);
            row[visible..].iter_mut().for_each(|s| *s = 0.0);
        }
        Ok(p)
    }
}

/// The f32 values of a contiguous CPU tensor (or storage under a layout).
fn values<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    super::train_ops::values(s, l, &format!("attention-core: {what}"))
}

impl CustomOp3 for AttentionCore {
    fn name(&self) -> &'static str {
        "attention-core"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, l) = self.check(l1.shape(), l2.shape(), l3.shape())?;
        let (q, k, v) = (
            values(s1, l1, "q")?,
            values(s2, l2, "k")?,
            values(s3, l3, "v")?,
        );
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let g = nh / nkv;
        let (outs, probabilities): (Vec<_>, Vec<_>) = (0..b * nkv)
            .into_par_iter()
            .map(|task| {
                let (bi, h) = (task / nkv, task % nkv);
                let grp = self.group(q, k, v, l, bi, h);
                let p = self.probabilities(&grp, l)?;
                let mut o = vec![0f32; g * l * d];
                gemm(
                    &mut o,
                    false,
                    Mat::new(&p, g * l, l),
                    Mat::new(&grp.v, l, d),
                    1.0,
                    false,
                )?;
                Ok((o, p))
            })
            .collect::<candle_core::Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        if let Ok(mut kept) = self.probabilities.lock() {
            *kept = Some(probabilities);
        }
        let mut ctx = vec![0f32; b * l * nh * d];
        for (task, o) in outs.iter().enumerate() {
            let (bi, h) = (task / nkv, task % nkv);
            for j in 0..g {
                for i in 0..l {
                    let dst = ((bi * l + i) * nh + h * g + j) * d;
                    ctx[dst..dst + d].copy_from_slice(&o[(j * l + i) * d..(j * l + i + 1) * d]);
                }
            }
        }
        Ok((CpuStorage::F32(ctx), Shape::from((b, l, nh * d))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (b, l) = self.check(q.shape(), k.shape(), v.shape())?;
        let dctx = grad_res.contiguous()?;
        let guards = [q, k, v, &dctx].map(|t| t.storage_and_layout());
        let mut slices = Vec::with_capacity(4);
        for (what, (storage, layout)) in ["q", "k", "v", "the context's gradient"]
            .iter()
            .zip(&guards)
        {
            slices.push(values(
                super::train_ops::cpu_storage(storage)?,
                layout,
                what,
            )?);
        }
        let [qv, kv, vv, dov] = [slices[0], slices[1], slices[2], slices[3]];
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let g = nh / nkv;
        let rows = g * l;
        let kept = self.probabilities.lock().ok().and_then(|mut p| p.take());
        let kept = kept.filter(|p| p.len() == b * nkv);
        let grads = (0..b * nkv)
            .into_par_iter()
            .map(|task| {
                let (bi, h) = (task / nkv, task % nkv);
                let grp = self.group(qv, kv, vv, l, bi, h);
                let recomputed;
                let p = match &kept {
                    Some(p) => &p[task],
                    None => {
                        recomputed = self.probabilities(&grp, l)?;
                        &recomputed
                    }
                };
                let mut d_o = vec![0f32; rows * d];
                for j in 0..g {
                    for i in 0..l {
                        let src = ((bi * l + i) * nh + h * g + j) * d;
                        d_o[(j * l + i) * d..(j * l + i + 1) * d]
                            .copy_from_slice(&dov[src..src + d]);
                    }
                }
                let (pm, dom) = (Mat::new(p, rows, l), Mat::new(&d_o, rows, d));
                let mut dv = vec![0f32; l * d];
                gemm(&mut dv, false, pm.t(), dom, 1.0, false)?;
                // dP = dO·Vᵀ, then dS in place.
                let mut ds = vec![0f32; rows * l];
                gemm(&mut ds, false, dom, Mat::new(&grp.v, l, d).t(), 1.0, false)?;
                let scale = 1.0 / (d as f32).sqrt();
                for (ds, p) in ds.chunks_exact_mut(l).zip(p.chunks_exact(l)) {
                    let dot: f32 = ds.iter().zip(p).map(|(a, b)| a * b).sum();
                    for (ds, p) in ds.iter_mut().zip(p) {
                        *ds = scale * p * (*ds - dot);
                    }
                }
                let dsm = Mat::new(&ds, rows, l);
                let mut dq = vec![0f32; rows * d];
                gemm(&mut dq, false, dsm, Mat::new(&grp.k, l, d), 1.0, false)?;
                let mut dk = vec![0f32; l * d];
                gemm(
                    &mut dk,
                    false,
                    dsm.t(),
                    Mat::new(&grp.q, rows, d),
                    1.0,
                    false,
                )?;
                for (r, row) in dq.chunks_exact_mut(d).enumerate() {
                    self.rotate(row, r % l, -1.0);
                }
                for (i, row) in dk.chunks_exact_mut(d).enumerate() {
                    self.rotate(row, i, -1.0);
                }
                Ok((dq, dk, dv))
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut dq = vec![0f32; b * l * nh * d];
        let (mut dk, mut dv) = (vec![0f32; b * l * nkv * d], vec![0f32; b * l * nkv * d]);
        for (task, (gq, gk, gv)) in grads.iter().enumerate() {
            let (bi, h) = (task / nkv, task % nkv);
            for i in 0..l {
                for j in 0..g {
                    let dst = ((bi * l + i) * nh + h * g + j) * d;
                    dq[dst..dst + d].copy_from_slice(&gq[(j * l + i) * d..(j * l + i + 1) * d]);
                }
                let dst = ((bi * l + i) * nkv + h) * d;
                dk[dst..dst + d].copy_from_slice(&gk[i * d..(i + 1) * d]);
                dv[dst..dst + d].copy_from_slice(&gv[i * d..(i + 1) * d]);
            }
        }
        let dev = q.device();
        Ok((
            Some(Tensor::from_vec(dq, q.shape(), dev)?),
            Some(Tensor::from_vec(dk, k.shape(), dev)?),
            Some(Tensor::from_vec(dv, v.shape(), dev)?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::super::train_ops::relative_difference as rel;
    use super::*;

    /// The fused core gives the context and the gradients of `q`, `k` and `v` that the composed graph of the
    /// inference path gives (reshapes, transposes, `train_ops::rope`, matmuls, `train_ops::causal_softmax`),
    /// for both rotary layouts, two sequences and two query heads per kv head.
    #[test]
    fn fused_attention_matches_the_composed_graph() {
        let (b, l, nh, nkv, d) = (2, 5, 4, 2, 8);
        let dev = Device::Cpu;
        let half = d / 2;
        let angles: Vec<f32> = (0..l)
            .flat_map(|p| (0..half).map(move |i| p as f32 * 0.3f32.powi(i as i32)))
            .collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let (cos_t, sin_t) = (
            Tensor::from_vec(cos.clone(), (l, half), &dev).unwrap(),
            Tensor::from_vec(sin.clone(), (l, half), &dev).unwrap(),
        );
        for interleaved in [true, false] {
            let q = Var::randn(0f32, 1.0, (b, l, nh * d), &dev).unwrap();
            let k = Var::randn(0f32, 1.0, (b, l, nkv * d), &dev).unwrap();
            let v = Var::randn(0f32, 1.0, (b, l, nkv * d), &dev).unwrap();
            let c = Tensor::randn(0f32, 1.0, (b, l, nh * d), &dev).unwrap();
            let core = AttentionCore {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: d,
                cos: cos.clone(),
                sin: sin.clone(),
                interleaved,
                probabilities: Default::default(),
            };
            let fused = q
                .as_tensor()
                .apply_op3(k.as_tensor(), v.as_tensor(), core)
                .unwrap();
            let composed = {
                let heads = |x: &Tensor, n: usize| {
                    x.reshape((b, l, n, d))
                        .unwrap()
                        .transpose(1, 2)
                        .unwrap()
                        .contiguous()
                        .unwrap()
                };
                let rope = |x: Tensor| {
                    super::super::train_ops::rope(&x, &cos_t, &sin_t, interleaved).unwrap()
                };
                let qh = rope(heads(q.as_tensor(), nh));
                let kh = rope(heads(k.as_tensor(), nkv));
                let vh = heads(v.as_tensor(), nkv);
                let qg = qh.reshape((b, nkv, nh / nkv * l, d)).unwrap();
                let scores = qg.matmul(&kh.t().unwrap()).unwrap();
                let probs = super::super::train_ops::causal_softmax(
                    &scores,
                    1.0 / (d as f32).sqrt(),
                    Some((l, 0)),
                )
                .unwrap();
                probs
                    .matmul(&vh)
                    .unwrap()
                    .reshape((b, nh, l, d))
                    .unwrap()
                    .transpose(1, 2)
                    .unwrap()
                    .reshape((b, l, nh * d))
                    .unwrap()
            };
            assert_eq!(fused.dims(), &[b, l, nh * d]);
            assert!(
                rel(&fused, &composed) < 1e-5,
                "context, interleaved {interleaved}"
            );
            let grads = |y: &Tensor| (y * &c).unwrap().sum_all().unwrap().backward().unwrap();
            let (gf, gc) = (grads(&fused), grads(&composed));
            // A second backward finds the kept probabilities taken and recomputes them.
            let again = grads(&fused);
            for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
                let want = gc.get(x.as_tensor()).unwrap();
                let e = rel(gf.get(x.as_tensor()).unwrap(), want);
                assert!(
                    e < 1e-5,
                    "gradient of {name}, interleaved {interleaved}: {e}"
                );
                let e = rel(again.get(x.as_tensor()).unwrap(), want);
                assert!(e < 1e-5, "recomputed gradient of {name}: {e}");
            }
        }
    }
}
