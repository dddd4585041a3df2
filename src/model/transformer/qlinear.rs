//! A linear layer over a frozen weight with an optional LoRA pair applied unmerged, and the fused paths that
//! keep a Q8_0 product and its adapter in one pass over plain f32 rows.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::lora_linear;
use super::lora_rows::add_lora_rows;
use super::weight::{
    Int8Input, QMatMulGrad, QuantWeight, TransposeCache, Weight, forward_in_int8, frozen_matmul,
    int8_backward_fits,
};
use super::with_f32_slice;
use crate::model::lora::LoraPair;
use crate::model::{ModelError, Result};

/// A linear layer over a frozen weight, with an optional LoRA pair applied unmerged.
#[derive(Clone, Debug)]
pub struct QLinear {
    pub(super) weight: Weight,
    out_features: usize,
    in_features: usize,
    /// A Q8_0 weight's transpose for backward passes, made by the first one that needs it.
    pub(super) transposed: Arc<TransposeCache>,
}

impl QLinear {
    /// Wraps a GGUF tensor `[out, in]`. Float types are expanded to dense f32 (as `QMatMul` does);
    /// block-quantized types stay packed.
    pub fn from_qtensor(q: Arc<QTensor>) -> Result<Self> {
        let (out_features, in_features) = q.shape().dims2()?;
        let weight = match q.dtype() {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                Weight::Dense(q.dequantize(&Device::Cpu)?)
            }
            _ => Weight::packed(q)?,
        };
        Ok(Self {
            weight,
            out_features,
            in_features,
            transposed: Arc::default(),
        })
    }

    /// A dense f32 layer from a `[out, in]` tensor.
    pub fn from_dense(w: Tensor) -> Result<Self> {
        let (out_features, in_features) = w.dims2()?;
        Ok(Self {
            weight: Weight::Dense(w.to_dtype(DType::F32)?),
            out_features,
            in_features,
            transposed: Arc::default(),
        })
    }

    /// Replaces the weight (same shape), and with it anything derived from the old one.
    pub(super) fn set_weight(&mut self, weight: Weight) {
        self.weight = weight;
        self.transposed = Arc::default();
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    pub fn weight(&self) -> &Weight {
        &self.weight
    }

    /// The weight as dense f32 `[out, in]`.
    pub fn dequantize(&self) -> Result<Tensor> {
        self.weight.dequantize()
    }

    /// `x: [.., in] -> [.., out]`, plus `scale·B·(A·x)` when `lora` is given.
    pub fn forward(&self, x: &Tensor, lora: Option<&LoraPair>) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let Some((_, lead)) = dims.split_last() else {
            return Err(ModelError::Input(
                "linear layer input must have rank >= 1".into(),
            ));
        };
        let n: usize = lead.iter().product();
        let x2 = x.reshape((n, self.in_features))?;
        let no_grad = !x2.track_op() && lora.is_none_or(|p| !p.tracks());
        let dora = match lora {
            Some(p) => self.dora_factor(p)?,
            None => None,
        };
        if let Some(w) = self.weight.int8()
            && no_grad
            && let Some(y) = int8_forward(&w, &x2, lora, dora.as_ref())?
        {
            let mut out_dims = lead.to_vec();
            out_dims.push(self.out_features);
            return Ok(y.reshape(out_dims)?);
        }
        if let (Some(p), Some(w)) = (lora, self.weight.int8())
            && int8_backward_fits(&w)
        {
            // Training through an int8 weight: one fused node, in `x`'s own shape (see `lora_linear`).
            let op = lora_linear::LoraLinearGrad {
                w,
                transposed: self.transposed.clone(),
                scale: p.scale as f32,
            };
            let y = x
                .contiguous()?
                .apply_op3(&p.a.contiguous()?, &p.b.contiguous()?, op)?;
            return Ok(match dora {
                Some(f) => y.broadcast_mul(&f.reshape((1, self.out_features))?)?,
                None => y,
            });
        }
        let y = match &self.weight {
            Weight::Quant(q) if n >= PREFILL_DEQUANT_ROWS && !forward_in_int8(q.dtype()) => {
                frozen_matmul(&x2, &q.dequantize(x2.device())?)?
            }
            Weight::Quant(q) => x2.contiguous()?.apply_op1(QMatMulGrad {
                w: QuantWeight::Gguf(q.clone()),
                transposed: self.transposed.clone(),
            })?,
            Weight::Panels(p) => x2.contiguous()?.apply_op1(QMatMulGrad {
                w: QuantWeight::Panels(p.clone()),
                transposed: self.transposed.clone(),
            })?,
            Weight::Dense(w) => frozen_matmul(&x2, w)?,
        };
        let y = match lora {
            None => y,
            Some(p) => {
                let small = n <= LORA_DIRECT_MAX_ROWS
                    && !(x2.track_op() || p.a.track_op() || p.b.track_op());
                match small.then(|| lora_delta_direct(&x2, p)).transpose()? {
                    Some(Some(d)) => (y + d)?,
                    _ => {
                        // The scale goes on B (`[out, r]`), not on the `[n, out]` product: one pass over
                        // a few thousand values instead of one over the output, each way in training.
                        let d = x2
                            .matmul(&p.a.t()?)?
                            .matmul(&p.b.t()?.affine(p.scale, 0.0)?)?;
                        (y + d)?
                    }
                }
            }
        };
        let y = match dora {
            Some(f) => y.broadcast_mul(&f.reshape((1, self.out_features))?)?,
            None => y,
        };
        let mut out_dims = lead.to_vec();
        out_dims.push(self.out_features);
        Ok(y.reshape(out_dims)?)
    }

    /// DoRA's `m / ‖W + ΔW‖_row` for this layer's weight, or `None` for plain LoRA. A pair that no longer
    /// changes (serving) computes it once; a training pair every call, since its tensors change in place.
    pub(super) fn dora_factor(&self, p: &LoraPair) -> Result<Option<Tensor>> {
        if p.magnitude.is_none() {
            return Ok(None);
        }
        if !p.tracks()
            && let Some(f) = p.dora_factor.get()
        {
            return Ok(Some(f.clone()));
        }
        let Some(f) = p.dora_factor(&self.dequantize()?)? else {
            return Ok(None);
        };
        if !p.tracks() {
            let _ = p.dora_factor.set(f.clone());
        }
        Ok(Some(f))
    }
}

/// From this many rows (prefill, training) a quantized weight whose forward is not int8
/// (`forward_in_int8`) is dequantized for the call and multiplied in f32: candle's quantized CPU matmul
/// costs about one gemv per row, far slower than one f32 gemm over all of them. The f32 copy is transient.
/// Q8_0 weights skip this at any row count: hearth's kernel (`q8`) multiplies the packed blocks in int8,
/// both forward and, through [`TransposeCache`], backward.
const PREFILL_DEQUANT_ROWS: usize = 16;

/// Up to this many rows (decode steps, small batches) the LoRA delta is computed directly on the
/// f32 slices: four tiny candle ops per projection cost more than the math.
const LORA_DIRECT_MAX_ROWS: usize = 4;

/// `scale·B·(A·x)` for a few rows as plain loops; `None` if a tensor is not contiguous f32 on CPU.
fn lora_delta_direct(x2: &Tensor, p: &LoraPair) -> Result<Option<Tensor>> {
    let (n, out) = (x2.dim(0)?, p.b.dim(0)?);
    let x2 = x2.contiguous()?;
    let mut d = vec![0f32; n * out];
    match with_f32_slice(&x2, |x| add_lora_rows(x, p, &mut d)).flatten() {
        Some(()) => Ok(Some(Tensor::from_vec(d, (n, out), x2.device())?)),
        None => Ok(None),
    }
}

/// `x·Wᵀ (+ scale·B·A·x)` for an int8 weight through hearth's kernel in one pass and one tensor: the LoRA delta
/// is added into the kernel's output buffer, where through candle it costs two tensors and an add per
/// projection. `None` when an input is not contiguous f32 on CPU.
fn int8_forward(
    w: &QuantWeight,
    x2: &Tensor,
    lora: Option<&LoraPair>,
    dora: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let (n_out, k) = w.dims()?;
    let (n, _) = x2.dims2()?;
    let x2 = x2.contiguous()?;
    let y = with_f32_slice(&x2, |x| -> Result<Option<Vec<f32>>> {
        let mut y = vec![0f32; n * n_out];
        Ok(int8_into(w, &Int8Input::new(x, k), lora, dora, &mut y)?.then_some(y))
    });
    match y.transpose()?.flatten() {
        Some(y) => Ok(Some(Tensor::from_vec(y, (n, n_out), x2.device())?)),
        None => Ok(None),
    }
}

/// [`int8_forward`] into `y` for `x` (rows of `in` values) already quantized as `xq`. `false` when a LoRA or
/// DoRA tensor is not contiguous f32 on CPU; `y` then holds no usable result.
fn int8_into(
    w: &QuantWeight,
    x: &Int8Input,
    lora: Option<&LoraPair>,
    dora: Option<&Tensor>,
    y: &mut [f32],
) -> Result<bool> {
    w.int8_matmul(x, y).map_err(ModelError::from)?;
    Ok(adapt_rows(x.values(), lora, dora, y))
}

/// Adds `scale·B·(A·x)` to the rows `y` of `x·Wᵀ` and applies the DoRA factor. `false` when a LoRA or DoRA
/// tensor is not contiguous f32 on CPU; `y` then holds no usable result.
pub(super) fn adapt_rows(
    x: &[f32],
    lora: Option<&LoraPair>,
    dora: Option<&Tensor>,
    y: &mut [f32],
) -> bool {
    if let Some(p) = lora
        && add_lora_rows(x, p, y).is_none()
    {
        return false;
    }
    match dora {
        Some(f) => with_f32_slice(f, |f| {
            for row in y.chunks_exact_mut(f.len().max(1)) {
                row.iter_mut().zip(f).for_each(|(v, f)| *v *= f);
            }
        })
        .is_some(),
        None => true,
    }
}
