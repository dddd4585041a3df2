//! A frozen int8 projection (Q8_0 or a type of `q8::kquant`) plus a training LoRA pair as one graph node: `y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ`.
//!
//! Composed from candle ops the same product is six nodes (the input and output reshapes, the base product, two
//! LoRA matmuls and their sum), and candle 0.11's backward gives every node's gradient a zero-filled tensor plus
//! an add (`GradStore::or_insert`): passes over `[tokens, out]` on one thread that, with the `Tensor::add`s they
//! feed, weigh on every training step. This node takes `x` in any leading shape and computes `dx`, `dA` and `dB`
//! straight from the incoming gradient: `dx` through the int8 kernel on the weight's cached transpose plus the
//! LoRA term accumulated into it, the rest through the f32 GEMM candle itself uses (the `gemm` crate, called
//! directly because candle's matmul cannot accumulate into an existing output).

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};

use super::f32_gemm::{Mat, gemm};
use super::train_ops::{cpu_storage, values};
use super::weight::{Int8Input, QuantWeight, TransposeCache};

/// The fused node; see the module doc. Built only for int8 weights whose output count is a multiple of 32
/// (the int8 backward's requirement, `int8_backward_fits`).
pub(super) struct LoraLinearGrad {
    pub(super) w: QuantWeight,
    pub(super) transposed: Arc<TransposeCache>,
    /// LoRA's `alpha / r` (or `alpha / √r`).
    pub(super) scale: f32,
}

impl LoraLinearGrad {
    /// `(m, k, r, n_out)` after checking that `x` is `[.., k]`, `A` `[r, k]` and `B` `[n_out, r]`.
    fn dims(
        &self,
        x: &Shape,
        a: &Shape,
        b: &Shape,
    ) -> candle_core::Result<(usize, usize, usize, usize)> {
        let (n_out, k) = self.w.dims()?;
        let (r, a_k) = a.dims2()?;
        let (b_out, b_r) = b.dims2()?;
        let x_k = x.dims().last().copied().unwrap_or(0);
        if x_k != k || a_k != k || b_out != n_out || b_r != r {
            candle_core::bail!(
                "lora-linear: x {x:?}, A {a:?} and B {b:?} do not fit a [{n_out}, {k}] weight"
            );
        }
        Ok((x.elem_count() / k.max(1), k, r, n_out))
    }
}

impl CustomOp3 for LoraLinearGrad {
    fn name(&self) -> &'static str {
        "lora-linear"
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
        let (m, k, r, n_out) = self.dims(l1.shape(), l2.shape(), l3.shape())?;
        let x = values(s1, l1, "lora-linear: x")?;
        let a = values(s2, l2, "lora-linear: A")?;
        let b = values(s3, l3, "lora-linear: B")?;
        let mut y = vec![0f32; m * n_out];
        self.w.int8_matmul(&Int8Input::new(x, k), &mut y)?;
        let mut xa = vec![0f32; m * r];
        gemm(
            &mut xa,
            false,
            Mat::new(x, m, k),
            Mat::new(a, r, k).t(),
            1.0,
            true,
        )?;
        gemm(
            &mut y,
            true,
            Mat::new(&xa, m, r),
            Mat::new(b, n_out, r).t(),
            self.scale,
            true,
        )?;
        let mut dims = l1.shape().dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = n_out;
        }
        Ok((CpuStorage::F32(y), Shape::from(dims)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (m, k, r, n_out) = self.dims(x.shape(), a.shape(), b.shape())?;
        let g = grad_res.contiguous()?;
        let (x_s, a_s, b_s, g_s) = (
            x.storage_and_layout(),
            a.storage_and_layout(),
            b.storage_and_layout(),
            g.storage_and_layout(),
        );
        let xv = values(cpu_storage(&x_s.0)?, x_s.1, "lora-linear: x")?;
        let av = values(cpu_storage(&a_s.0)?, a_s.1, "lora-linear: A")?;
        let bv = values(cpu_storage(&b_s.0)?, b_s.1, "lora-linear: B")?;
        let gv = values(
            cpu_storage(&g_s.0)?,
            g_s.1,
            "lora-linear: the output's gradient",
        )?;
        let (xm, am, bm, gm) = (
            Mat::new(xv, m, k),
            Mat::new(av, r, k),
            Mat::new(bv, n_out, r),
            Mat::new(gv, m, n_out),
        );
        let s = self.scale;
        // xa = x·Aᵀ again (m×k×r, a few hundredths of the base product) rather than kept from the forward.
        let mut xa = vec![0f32; m * r];
        gemm(&mut xa, false, xm, am.t(), 1.0, true)?;
        // dB = s·gᵀ·xa, [n_out, r]
        let mut db = vec![0f32; n_out * r];
        gemm(&mut db, false, gm.t(), Mat::new(&xa, m, r), s, true)?;
        // g·B, [m, r]: dA = s·(g·B)ᵀ·x and dx's LoRA term s·(g·B)·A
        let mut gb = vec![0f32; m * r];
        gemm(&mut gb, false, gm, bm, 1.0, true)?;
        let gbm = Mat::new(&gb, m, r);
        let mut da = vec![0f32; r * k];
        gemm(&mut da, false, gbm.t(), xm, s, true)?;
        let mut dx = vec![0f32; m * k];
        super::weight::int8_input_grad_into(&self.w, &self.transposed, gv, m, &mut dx)?;
        gemm(&mut dx, true, gbm, am, s, true)?;
        let device = x.device();
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), device)?),
            Some(Tensor::from_vec(da, (r, k), device)?),
            Some(Tensor::from_vec(db, (n_out, r), device)?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Var};

    use super::super::train_ops::relative_difference as rel;
    use super::super::weight::QMatMulGrad;
    use super::*;
    use crate::model::q8::PanelWeights;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2001) as f32
                    / 1000.0
                    - 1.0
            })
            .collect()
    }

    /// The fused node gives the output and the gradients of `x`, `A` and `B` that candle's own composition
    /// (the base node, two matmuls and a sum, each differentiated by candle) gives, in both weight layouts,
    /// for a 3-D input.
    #[test]
    fn fused_lora_linear_matches_the_composed_graph() {
        let (n_out, k, r, scale) = (96, 64, 4, 0.75f32);
        let dev = Device::Cpu;
        let w = Tensor::from_vec(values(n_out * k, 1), (n_out, k), &dev).unwrap();
        let q = Arc::new(QTensor::quantize(&w, GgmlDType::Q8_0).unwrap());
        let panels = Arc::new(PanelWeights::from_q8_0(&q.data().unwrap(), n_out, k).unwrap());
        for weight in [QuantWeight::Gguf(q.clone()), QuantWeight::Panels(panels)] {
            let transposed = Arc::new(TransposeCache::default());
            let x = Var::from_vec(values(2 * 5 * k, 2), (2, 5, k), &dev).unwrap();
            let a = Var::from_vec(values(r * k, 3), (r, k), &dev).unwrap();
            let b = Var::from_vec(values(n_out * r, 4), (n_out, r), &dev).unwrap();
            // A fixed upstream gradient: the loss is Σ y ⊙ c.
            let c = Tensor::from_vec(values(2 * 5 * n_out, 5), (2, 5, n_out), &dev).unwrap();

            let op = LoraLinearGrad {
                w: weight.clone(),
                transposed: transposed.clone(),
                scale,
            };
            let fused = x
                .as_tensor()
                .apply_op3(a.as_tensor(), b.as_tensor(), op)
                .unwrap();
            let base = x
                .as_tensor()
                .reshape((10, k))
                .unwrap()
                .apply_op1(QMatMulGrad {
                    w: weight,
                    transposed,
                })
                .unwrap();
            let delta = x
                .as_tensor()
                .reshape((10, k))
                .unwrap()
                .matmul(&a.as_tensor().t().unwrap())
                .unwrap()
                .matmul(&b.as_tensor().t().unwrap())
                .unwrap()
                .affine(scale as f64, 0.0)
                .unwrap();
            let composed = (base + delta).unwrap().reshape((2, 5, n_out)).unwrap();
            assert_eq!(fused.dims(), &[2, 5, n_out]);
            assert!(rel(&fused, &composed) < 1e-5, "output");

            let grads = |y: &Tensor| (y * &c).unwrap().sum_all().unwrap().backward().unwrap();
            let (gf, gc) = (grads(&fused), grads(&composed));
            for (name, v) in [("x", &x), ("A", &a), ("B", &b)] {
                let (f, c) = (
                    gf.get(v.as_tensor()).unwrap(),
                    gc.get(v.as_tensor()).unwrap(),
                );
                assert_eq!(f.dims(), v.dims(), "{name}");
                let e = rel(f, c);
                assert!(e < 1e-5, "gradient of {name}: relative difference {e}");
            }
        }
    }
}
