//! The owned Llama/Qwen3 forward.
//!
//! Weights are immutable after load and shared (`Arc<QTensor>`, `Arc<PanelWeights>`, cheap `Tensor` clones),
//! so one [`Transformer`] serves many requests at once; each request owns its [`KvCache`] and passes the
//! [`LoraSet`] it started with (or none). Adapters are applied unmerged,
//! `y = W·x + scale·B·(A·x)`, so swapping an adapter never touches the base weights.
//!
//! Two op flavours share one code path: serving uses candle-nn's fused kernels (no backward), while
//! [`Transformer::forward_train`] uses differentiable equivalents (`train_ops`, and the head's log-softmax in
//! `head`). Quantized matmuls go through `QMatMulGrad`, whose backward multiplies by the weight (Q8_0: its
//! requantized transpose, in int8; other types: the dequantized weight), so LoRA parameters receive
//! gradients through frozen quantized layers (plain `QMatMul` silently drops them). In training, a Q8_0
//! projection and its LoRA pair are one node (`lora_linear`), whose backward computes `dx`, `dA` and `dB` itself,
//! and so is the attention core between the projections (`attention_train`).

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use serde::{Deserialize, Serialize};

use super::gguf::{Arch, GgufFile, ModelConfig};
use super::huge_pages::HugePageReport;
use super::lora::{LoraPair, LoraSet, LoraTarget};
use super::q8::{PanelWeights, QuantizedRows};
use super::{ModelError, Result};

mod attention_train;
mod decode;
mod f32_gemm;
mod head;
mod lora_linear;
mod train_ops;

/// A frozen weight: block-quantized and kept packed, Q8_0 repacked into panels where the CPU has their kernel
/// (see [`super::q8::panels`]), or dense f32 (F32/F16/BF16 in the file, or a merged/dequantized copy).
#[derive(Clone, Debug)]
pub enum Weight {
    Quant(Arc<QTensor>),
    Panels(Arc<PanelWeights>),
    Dense(Tensor),
}

impl Weight {
    /// A block-quantized GGUF tensor as the model keeps it: Q8_0 repacked into panels when
    /// [`super::q8::panels_usable`] (and `HEARTH_Q8_LAYOUT` is not `gguf`, which keeps the file's layout so
    /// that a benchmark can compare the two in one build), anything else as it is.
    fn packed(q: Arc<QTensor>) -> Result<Self> {
        if q.dtype() == GgmlDType::Q8_0
            && super::q8::panels_usable()
            && std::env::var("HEARTH_Q8_LAYOUT").as_deref() != Ok("gguf")
            && let Ok((n_out, k)) = q.shape().dims2()
        {
            let panels =
                PanelWeights::from_q8_0(&q.data()?, n_out, k).map_err(ModelError::Input)?;
            return Ok(Weight::Panels(Arc::new(panels)));
        }
        Ok(Weight::Quant(q))
    }

    /// The weight as dense f32 `[out, in]`.
    fn dequantize(&self) -> Result<Tensor> {
        Ok(match self {
            Weight::Quant(q) => dequantize(q)?,
            Weight::Panels(p) => dequantize_panels(p)?,
            Weight::Dense(t) => t.clone(),
        })
    }

    /// A Q8_0 weight in either layout, for hearth's int8 kernels; `None` for other types.
    fn q8_0(&self) -> Option<QuantWeight> {
        match self {
            Weight::Quant(q) if q.dtype() == GgmlDType::Q8_0 => Some(QuantWeight::Gguf(q.clone())),
            Weight::Panels(p) => Some(QuantWeight::Panels(p.clone())),
            _ => None,
        }
    }

    /// The rows named by `tokens` (any shape), `[..tokens' dims, in]`.
    fn embedding(&self, tokens: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Weight::Quant(q) => q.embedding(tokens)?,
            Weight::Panels(p) => {
                let ids = tokens.flatten_all()?.to_vec1::<u32>()?;
                let mut rows = vec![0f32; ids.len() * p.k()];
                for (&id, row) in ids.iter().zip(rows.chunks_exact_mut(p.k())) {
                    p.dequantize_row(id as usize, row)
                        .map_err(ModelError::Input)?;
                }
                let mut dims = tokens.dims().to_vec();
                dims.push(p.k());
                Tensor::from_vec(rows, dims, &Device::Cpu)?
            }
            Weight::Dense(w) => {
                let mut dims = tokens.dims().to_vec();
                dims.push(w.dim(1)?);
                w.index_select(&tokens.flatten_all()?, 0)?.reshape(dims)?
            }
        })
    }
}

/// Quantized matmul `x·Wᵀ` that, unlike `QMatMul`, has a backward pass w.r.t. `x`. The weight stays frozen;
/// the backward multiplies by its cached transpose (Q8_0, see [`TransposeCache`]) or by a dequantized copy
/// that exists only during that product.
struct QMatMulGrad {
    w: QuantWeight,
    transposed: Arc<TransposeCache>,
}

/// The weight of a [`QMatMulGrad`]: a GGUF tensor, or Q8_0 panels.
#[derive(Clone)]
enum QuantWeight {
    Gguf(Arc<QTensor>),
    Panels(Arc<PanelWeights>),
}

impl QuantWeight {
    /// The Q8_0 weight's GGUF bytes, `[n_out, k]`; `None` for other types.
    fn q8_0_bytes(&self) -> candle_core::Result<Option<std::borrow::Cow<'_, [u8]>>> {
        Ok(match self {
            QuantWeight::Gguf(q) if q.dtype() == GgmlDType::Q8_0 => Some(q.data()?),
            QuantWeight::Gguf(_) => None,
            QuantWeight::Panels(p) => Some(std::borrow::Cow::Owned(p.to_q8_0())),
        })
    }

    fn dims(&self) -> candle_core::Result<(usize, usize)> {
        match self {
            QuantWeight::Gguf(q) => q.shape().dims2(),
            QuantWeight::Panels(p) => Ok((p.n_out(), p.k())),
        }
    }

    /// `y = x·Wᵀ` (`[m, n_out]`) for a Q8_0 weight through hearth's int8 kernels.
    fn q8_0_matmul(&self, x: &QuantizedRows, y: &mut [f32]) -> std::result::Result<(), String> {
        match self {
            QuantWeight::Gguf(q) => {
                let (n_out, _) = q.shape().dims2().map_err(|e| e.to_string())?;
                let bytes = q.data().map_err(|e| e.to_string())?;
                super::q8::matmul_quantized(&bytes, n_out, x, y)
            }
            QuantWeight::Panels(p) => super::q8::matmul_panels(p, x, y),
        }
    }
}

impl CustomOp1 for QMatMulGrad {
    fn name(&self) -> &'static str {
        "qmatmul-grad"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if let Some(r) = q8_0_fwd(&self.w, storage, layout) {
            return r;
        }
        match &self.w {
            QuantWeight::Gguf(q) => q.cpu_fwd(storage, layout),
            QuantWeight::Panels(_) => {
                candle_core::bail!("qmatmul-grad: Q8_0 panels take contiguous f32 [m, k] inputs")
            }
        }
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        if let Some(dx) = q8_0_input_grad(&self.w, &self.transposed, grad_res)? {
            return Ok(Some(dx));
        }
        let w = match &self.w {
            QuantWeight::Gguf(q) => dequantize(q)?,
            QuantWeight::Panels(p) => dequantize_panels(p)?,
        }; // [out, in], for this product only
        Ok(Some(grad_res.broadcast_matmul(&w)?))
    }
}

/// `dy · W` for a Q8_0 weight through the int8 kernel, multiplying by the weight's transpose requantized along
/// the output axis (see [`TransposeCache`]). `None` when [`int8_backward_fits`] says no (the caller takes the
/// f32 route).
fn q8_0_input_grad(
    w: &QuantWeight,
    transposed: &TransposeCache,
    dy: &Tensor,
) -> candle_core::Result<Option<Tensor>> {
    if !int8_backward_fits(w) {
        return Ok(None);
    }
    let (n_out, k) = w.dims()?;
    let Some((&last, lead)) = dy.dims().split_last() else {
        return Ok(None);
    };
    if last != n_out {
        candle_core::bail!("qmatmul-grad: gradient rows of {last}, the weight has {n_out} outputs");
    }
    let m: usize = lead.iter().product();
    let dyv: Vec<f32> = dy.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    let mut dx = vec![0f32; m * k];
    q8_0_input_grad_into(w, transposed, &dyv, m, &mut dx)?;
    let mut shape = lead.to_vec();
    shape.push(k);
    Ok(Some(Tensor::from_vec(dx, shape, dy.device())?))
}

/// Whether a weight takes the int8 backward: Q8_0 with a multiple of 32 outputs (the transpose's blocks run
/// along them).
fn int8_backward_fits(w: &QuantWeight) -> bool {
    !matches!(w, QuantWeight::Gguf(q) if q.dtype() != GgmlDType::Q8_0)
        && w.dims()
            .is_ok_and(|(n_out, _)| n_out.is_multiple_of(super::q8::QK8_0))
}

/// `dx = dy · W` (`dy` `[m, n_out]`, `dx` `[m, k]`) through the int8 kernel, for a weight
/// [`int8_backward_fits`] accepts.
fn q8_0_input_grad_into(
    w: &QuantWeight,
    transposed: &TransposeCache,
    dy: &[f32],
    m: usize,
    dx: &mut [f32],
) -> candle_core::Result<()> {
    let (n_out, k) = w.dims()?;
    let wt = transposed.get(w)?;
    super::q8::matmul(wt, k, n_out, dy, m, dx).map_err(candle_core::Error::Msg)
}

/// The weight as dense f32 `[out, in]`: Q8_0 through [`super::q8::dequantize`] (parallel, ~10× candle's
/// single-threaded loop on SmolLM2's tied head), other types through candle.
fn dequantize(w: &QTensor) -> candle_core::Result<Tensor> {
    if w.dtype() == GgmlDType::Q8_0
        && let Ok((n_out, k)) = w.shape().dims2()
    {
        let bytes = w.data()?;
        let mut out = vec![0f32; n_out * k];
        super::q8::dequantize(&bytes, k, &mut out).map_err(candle_core::Error::Msg)?;
        return Tensor::from_vec(out, (n_out, k), &Device::Cpu);
    }
    w.dequantize(&Device::Cpu)
}

/// Q8_0 panels as dense f32 `[out, in]` (rows split across the current rayon pool).
fn dequantize_panels(p: &PanelWeights) -> candle_core::Result<Tensor> {
    Tensor::from_vec(p.dequantize(), (p.n_out(), p.k()), &Device::Cpu)
}

/// Products with a Q8_0 weight through [`super::q8`] (see there for why); `None` hands the call to candle (not
/// Q8_0, or not a contiguous f32 `[m, k]` input).
fn q8_0_fwd(
    w: &QuantWeight,
    storage: &CpuStorage,
    layout: &Layout,
) -> Option<candle_core::Result<(CpuStorage, Shape)>> {
    if matches!(w, QuantWeight::Gguf(q) if q.dtype() != GgmlDType::Q8_0) {
        return None;
    }
    let (n_out, k) = w.dims().ok()?;
    let x = match storage {
        CpuStorage::F32(x) => x,
        _ => return None,
    };
    let (m, x_k) = layout.shape().dims2().ok()?;
    if x_k != k || !layout.is_contiguous() {
        return None;
    }
    let x = x.get(layout.start_offset()..layout.start_offset() + m * k)?;
    let mut y = vec![0f32; m * n_out];
    let done = QuantizedRows::new(x, k).and_then(|xq| w.q8_0_matmul(&xq, &mut y));
    Some(
        done.map(|()| (CpuStorage::F32(y), Shape::from((m, n_out))))
            .map_err(candle_core::Error::Msg),
    )
}

/// `x·Wᵀ` over a dense frozen `W` whose backward computes only the input's gradient. candle's matmul
/// backward also computes the gradient of `W`, one more full-size matmul per layer that a frozen base
/// throws away. The product is computed outside the graph and handed in whole (`y`).
struct FrozenMatMul {
    y: Tensor,
    w: Tensor,
}

impl CustomOp1 for FrozenMatMul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (storage, layout) = self.y.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(s)
                if layout.is_contiguous() && layout.start_offset() == 0 =>
            {
                Ok((s.clone(), self.y.shape().clone()))
            }
            _ => candle_core::bail!("frozen-matmul: the product must be a contiguous CPU tensor"),
        }
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad_res.matmul(&self.w)?))
    }
}

/// `x·Wᵀ` for a dense frozen `w` (`[out, in]`); differentiable w.r.t. `x` only.
fn frozen_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let y = x.detach().matmul(&w.t()?)?;
    if !x.track_op() {
        return Ok(y);
    }
    let op = FrozenMatMul {
        y: y.contiguous()?,
        w: w.clone(),
    };
    Ok(x.apply_op1(op)?)
}

/// A linear layer over a frozen weight, with an optional LoRA pair applied unmerged.
#[derive(Clone, Debug)]
pub struct QLinear {
    weight: Weight,
    out_features: usize,
    in_features: usize,
    /// A Q8_0 weight's transpose for backward passes, made by the first one that needs it.
    transposed: Arc<TransposeCache>,
}

/// [`super::q8::transpose_requantized`] of a layer's weight, kept for the layer's lifetime once training has
/// needed it: +1 byte per weight (143 MB for SmolLM2), a quarter of what a dequantized f32 copy would cost,
/// where rebuilding it every backward pass took a third of the product's time. Serving never builds it.
#[derive(Default)]
struct TransposeCache(std::sync::OnceLock<Vec<u8>>);

impl std::fmt::Debug for TransposeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = self.0.get().map_or(0, Vec::len);
        write!(f, "TransposeCache({bytes} bytes)")
    }
}

impl TransposeCache {
    /// The transpose of Q8_0 `w` (`[n_out, k]`), built on first use.
    fn get(&self, w: &QuantWeight) -> candle_core::Result<&[u8]> {
        if let Some(t) = self.0.get() {
            return Ok(t);
        }
        let (n_out, k) = w.dims()?;
        let Some(bytes) = w.q8_0_bytes()? else {
            candle_core::bail!("qmatmul-grad: only a Q8_0 weight has an int8 transpose");
        };
        let t =
            super::q8::transpose_requantized(&bytes, n_out, k).map_err(candle_core::Error::Msg)?;
        // Two threads may build it at once; both results are the same bytes.
        Ok(self.0.get_or_init(|| t))
    }
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
    fn set_weight(&mut self, weight: Weight) {
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
        if let Some(w) = self.weight.q8_0()
            && no_grad
            && let Some(y) = q8_0_forward(&w, &x2, lora, dora.as_ref())?
        {
            let mut out_dims = lead.to_vec();
            out_dims.push(self.out_features);
            return Ok(y.reshape(out_dims)?);
        }
        if let (Some(p), Some(w)) = (lora, self.weight.q8_0())
            && int8_backward_fits(&w)
        {
            // Training through a Q8_0 weight: one fused node, in `x`'s own shape (see `lora_linear`).
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
            Weight::Quant(q) if n >= PREFILL_DEQUANT_ROWS && q.dtype() != GgmlDType::Q8_0 => {
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
    fn dora_factor(&self, p: &LoraPair) -> Result<Option<Tensor>> {
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

/// From this many rows (prefill, training) a quantized weight other than Q8_0 is dequantized for the
/// call and multiplied in f32: candle's quantized CPU matmul costs about one gemv per row, so a 41-token
/// SmolLM2 (Q4_1) prefill ran at 19 tok/s, and at 202 tok/s this way. The f32 copy is transient.
/// Q8_0 weights skip this at any row count: hearth's kernel (`q8`) multiplies the packed blocks in int8 (at
/// 512 rows its AVX-512 VNNI panel kernel measured 1.2-1.8× candle's f32 gemm on the dequantized weight), both
/// forward and, through [`TransposeCache`], backward.
const PREFILL_DEQUANT_ROWS: usize = 16;

/// Up to this many rows (decode steps, small batches) the LoRA delta is computed directly on the
/// f32 slices: four tiny candle ops per projection cost more than the math (measured: a rank-8
/// adapter on all projections slowed SmolLM2 decode by ~1.5x through candle ops).
const LORA_DIRECT_MAX_ROWS: usize = 4;

/// Runs `f` on the contiguous f32 CPU data of `t`, or returns `None` when `t` is not such a tensor.
fn with_f32_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 || !t.is_contiguous() {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(cpu) => {
            let s = cpu.as_slice::<f32>().ok()?;
            let start = layout.start_offset();
            s.get(start..start + t.elem_count()).map(f)
        }
        _ => None,
    }
}

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

/// Adds `scale·B·(A·x)` to each row of `y` (`n × out`) in place; `None` (nothing added) if a factor is not
/// contiguous f32 on CPU or the shapes disagree. Exact zeros are not added, so a fresh adapter (B = 0) leaves
/// `y` bitwise unchanged (even its −0.0s).
fn add_lora_rows(x: &[f32], p: &LoraPair, y: &mut [f32]) -> Option<()> {
    let (r, inp) = p.a.dims2().ok()?;
    let (out, b_r) = p.b.dims2().ok()?;
    if b_r != r || !x.len().is_multiple_of(inp.max(1)) || y.len() != x.len() / inp.max(1) * out {
        return None;
    }
    // Callers run this only for pairs that do not train (decode, small batches), so the factors may be cached.
    let f = p
        .decode_factors
        .get_or_init(|| {
            let a = with_f32_slice(&p.a, |a| a.to_vec())?;
            let b_by_rank = with_f32_slice(&p.b, |b| {
                let mut t = vec![0f32; b.len()];
                for (o, row) in b.chunks_exact(r.max(1)).enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        t[j * out + o] = v;
                    }
                }
                t
            })?;
            Some(DecodeFactors {
                a: DecodeFactor::new(a),
                b_by_rank: DecodeFactor::new(b_by_rank),
            })
        })
        .as_ref()?;
    let (scale, shape) = (p.scale as f32, (r, inp, out));
    // Rows are independent: a prefill's rows split across threads, a decode step's row runs here.
    let run = |x: &[f32], y: &mut [f32]| {
        use DecodeFactor::{Bf16, F32};
        match (&f.a, &f.b_by_rank) {
            (F32(a), F32(b)) => lora_rows_dispatch(&LoraRows { a, b, shape, scale }, x, y),
            (F32(a), Bf16(b)) => lora_rows_dispatch(&LoraRows { a, b, shape, scale }, x, y),
            (Bf16(a), F32(b)) => lora_rows_dispatch(&LoraRows { a, b, shape, scale }, x, y),
            (Bf16(a), Bf16(b)) => lora_rows_dispatch(&LoraRows { a, b, shape, scale }, x, y),
        }
    };
    let rows = y.len() / out.max(1);
    if rows < LORA_PARALLEL_ROWS {
        run(x, y);
    } else {
        super::spin_pool::items_mut(y, out.max(1), |first, part| {
            let n = part.len() / out.max(1);
            run(&x[first * inp..(first + n) * inp], part)
        });
    }
    Some(())
}

/// From this many rows [`add_lora_rows`] splits its rows across threads.
const LORA_PARALLEL_ROWS: usize = 16;

/// A LoRA pair's `A` (`[r, in]`) and transposed `B` (`[r, out]`) as the decode loops read them.
#[derive(Debug)]
pub(crate) struct DecodeFactors {
    a: DecodeFactor,
    b_by_rank: DecodeFactor,
}

/// One factor in bf16 when every value is exactly a bf16 (adapters load from PEFT files in bf16), halving the
/// bytes each token reads (a rank-8 SmolLM2 adapter on all projections is ~10 MB in f32, 7% on top of the
/// weights), else in f32. Widening bf16 is exact, so the sums are the same either way.
#[derive(Debug)]
enum DecodeFactor {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl DecodeFactor {
    fn new(v: Vec<f32>) -> Self {
        if v.iter().all(|x| x.to_bits() & 0xffff == 0) {
            Self::Bf16(v.iter().map(|x| (x.to_bits() >> 16) as u16).collect())
        } else {
            Self::F32(v)
        }
    }
}

/// A stored factor value: f32, or bf16 as its upper 16 bits.
trait FactorValue: Copy {
    fn widen(self) -> f32;
}

impl FactorValue for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl FactorValue for u16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

/// One pair's factors as slices, for [`lora_rows`].
struct LoraRows<'a, A, B> {
    a: &'a [A],
    /// `B` transposed, `[r, out]`.
    b: &'a [B],
    /// `(r, in, out)`.
    shape: (usize, usize, usize),
    scale: f32,
}

/// [`lora_rows`] compiled for AVX2 and FMA when the CPU has them, else portable.
fn lora_rows_dispatch<A: FactorValue, B: FactorValue>(
    p: &LoraRows<A, B>,
    x: &[f32],
    y: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::q8::avx2_usable() {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { lora_rows_avx2(p, x, y) };
        }
    }
    lora_rows(p, x, y)
}

/// [`lora_rows`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn lora_rows_avx2<A: FactorValue, B: FactorValue>(
    p: &LoraRows<A, B>,
    x: &[f32],
    y: &mut [f32],
) {
    lora_rows(p, x, y)
}

/// `B·(A·x)` as `r` updates of a contiguous `out`-long row each: a length-`r` dot per output (the obvious
/// loop) spent most of its time summing 8 lanes for 8 products. For each output the products are summed in
/// rank order from zero, as that dot did for r = 8.
#[inline(always)]
fn lora_rows<A: FactorValue, B: FactorValue>(p: &LoraRows<A, B>, x: &[f32], y: &mut [f32]) {
    let (r, inp, out) = p.shape;
    let mut ax = vec![0f32; r];
    let mut d = vec![0f32; out];
    for (row, yrow) in x.chunks_exact(inp).zip(y.chunks_exact_mut(out)) {
        for (j, axj) in ax.iter_mut().enumerate() {
            *axj = p.scale * dot(&p.a[j * inp..(j + 1) * inp], row);
        }
        d.fill(0.0);
        for (&axj, b) in ax.iter().zip(p.b.chunks_exact(out.max(1))) {
            for (dv, &bv) in d.iter_mut().zip(b) {
                *dv += bv.widen() * axj;
            }
        }
        for (yv, &dv) in yrow.iter_mut().zip(&d) {
            if dv != 0.0 {
                *yv += dv;
            }
        }
    }
}

/// `x·Wᵀ (+ scale·B·A·x)` for a Q8_0 weight through hearth's kernel in one pass and one tensor: the LoRA delta
/// is added into the kernel's output buffer, where through candle it cost two tensors and an add per projection
/// (~20% of a decode step with an adapter). `None` when an input is not contiguous f32 on CPU.
fn q8_0_forward(
    w: &QuantWeight,
    x2: &Tensor,
    lora: Option<&LoraPair>,
    dora: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let (n_out, k) = w.dims()?;
    let (n, _) = x2.dims2()?;
    let x2 = x2.contiguous()?;
    let y = with_f32_slice(&x2, |x| -> Result<Option<Vec<f32>>> {
        let xq = QuantizedRows::new(x, k).map_err(ModelError::Input)?;
        let mut y = vec![0f32; n * n_out];
        Ok(q8_0_into(w, x, &xq, lora, dora, &mut y)?.then_some(y))
    });
    match y.transpose()?.flatten() {
        Some(y) => Ok(Some(Tensor::from_vec(y, (n, n_out), x2.device())?)),
        None => Ok(None),
    }
}

/// [`q8_0_forward`] into `y` for `x` (rows of `in` values) already quantized as `xq`. `false` when a LoRA or
/// DoRA tensor is not contiguous f32 on CPU; `y` then holds no usable result.
fn q8_0_into(
    w: &QuantWeight,
    x: &[f32],
    xq: &QuantizedRows,
    lora: Option<&LoraPair>,
    dora: Option<&Tensor>,
    y: &mut [f32],
) -> Result<bool> {
    w.q8_0_matmul(xq, y).map_err(ModelError::Input)?;
    Ok(adapt_rows(x, lora, dora, y))
}

/// Adds `scale·B·(A·x)` to the rows `y` of `x·Wᵀ` and applies the DoRA factor. `false` when a LoRA or DoRA
/// tensor is not contiguous f32 on CPU; `y` then holds no usable result.
fn adapt_rows(x: &[f32], lora: Option<&LoraPair>, dora: Option<&Tensor>, y: &mut [f32]) -> bool {
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

/// Positions served at most, whatever the file claims: RoPE tables are precomputed, and a
/// corrupt `context_length` must not allocate gigabytes. (32768 × 64 × 2 × 4 B = 16 MiB.)
pub const MAX_POSITIONS: usize = 32_768;

/// Precomputed RoPE tables `[positions, head_dim/2]` in f32.
#[derive(Clone, Debug)]
struct Rope {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

impl Rope {
    fn new(cfg: &ModelConfig) -> Result<Self> {
        let half = cfg.head_dim / 2;
        let n = cfg.context_length.min(MAX_POSITIONS);
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f32 / cfg.head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in 0..n {
            for f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (n, half), &Device::Cpu)?,
            sin: Tensor::from_vec(sin, (n, half), &Device::Cpu)?,
            interleaved: cfg.arch == Arch::Llama,
        })
    }

    /// `x: [b, heads, l, d]` contiguous, positions `offset..offset+l`.
    fn apply(&self, x: &Tensor, offset: usize, train: bool) -> Result<Tensor> {
        let l = x.dim(2)?;
        let cos = self.cos.narrow(0, offset, l)?;
        let sin = self.sin.narrow(0, offset, l)?;
        use candle_nn::rotary_emb as re;
        Ok(match (self.interleaved, train) {
            (_, true) => train_ops::rope(x, &cos, &sin, self.interleaved)?,
            (true, false) => re::rope_i(x, &cos, &sin)?,
            (false, false) => re::rope(x, &cos, &sin)?,
        })
    }
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, train: bool) -> Result<Tensor> {
    Ok(if train {
        train_ops::rms_norm(x, w, eps)?
    } else {
        candle_nn::ops::rms_norm(&x.contiguous()?, w, eps)?
    })
}

/// One decoder block.
#[derive(Clone, Debug)]
pub struct Block {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    q: QLinear,
    k: QLinear,
    v: QLinear,
    o: QLinear,
    gate: QLinear,
    up: QLinear,
    down: QLinear,
}

impl Block {
    /// The linear layer a LoRA target adapts.
    pub fn linear(&self, t: LoraTarget) -> &QLinear {
        match t {
            LoraTarget::Q => &self.q,
            LoraTarget::K => &self.k,
            LoraTarget::V => &self.v,
            LoraTarget::O => &self.o,
            LoraTarget::Gate => &self.gate,
            LoraTarget::Up => &self.up,
            LoraTarget::Down => &self.down,
        }
    }

    fn linear_mut(&mut self, t: LoraTarget) -> &mut QLinear {
        match t {
            LoraTarget::Q => &mut self.q,
            LoraTarget::K => &mut self.k,
            LoraTarget::V => &mut self.v,
            LoraTarget::O => &mut self.o,
            LoraTarget::Gate => &mut self.gate,
            LoraTarget::Up => &mut self.up,
            LoraTarget::Down => &mut self.down,
        }
    }
}

/// How a [`KvCache`] stores keys and values.
///
/// At long context the cache is what a decode step reads besides the weights (SmolLM2-135M: 46 KB per cached
/// position in f32, the size of its Q8_0 weights at ~3,100 positions), so f16 halves both the memory a chat
/// holds and that part of each step's reads. f16 keeps 11 significant bits, as llama.cpp's default cache does;
/// f32 makes cached decoding agree with the cacheless forward up to the order of additions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum KvPrecision {
    /// Exact: what the forward computed.
    #[default]
    F32,
    /// Rounded to half precision when stored; every attention over the cache reads the rounded values.
    F16,
}

impl KvPrecision {
    fn dtype(self) -> DType {
        match self {
            KvPrecision::F32 => DType::F32,
            KvPrecision::F16 => DType::F16,
        }
    }
}

/// Per-request key/value cache: for each layer, buffers `[b, kv_heads, capacity, head_dim]`
/// filled up to `len`. Buffers grow geometrically and are written in place (`slice_set`), so a
/// decode step copies one position instead of the whole history; attention reads a narrowed view.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
    max_len: usize,
    precision: KvPrecision,
}

/// Initial cache capacity in positions (grows by doubling up to the context length).
const KV_INITIAL_CAPACITY: usize = 64;

impl KvCache {
    pub fn new(cfg: &ModelConfig, precision: KvPrecision) -> Self {
        Self {
            layers: vec![None; cfg.num_layers],
            len: 0,
            max_len: cfg.context_length.min(MAX_POSITIONS),
            precision,
        }
    }

    pub fn precision(&self) -> KvPrecision {
        self.precision
    }

    /// Bytes the buffers hold (allocated capacity, not only the filled positions).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum()
    }

    /// Positions already cached (the offset of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
        self.len = 0;
    }

    /// Forgets every position from `len` on (keeping the buffers): the next forward continues after position
    /// `len - 1`, overwriting what was cached after it.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// An independent copy (e.g. to reuse a cached system prompt for several requests). The
    /// buffers are written in place, so the cache is deliberately not `Clone`.
    pub fn fork(&self) -> Result<Self> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match l {
                Some((k, v)) => Some((k.copy()?, v.copy()?)),
                None => None,
            });
        }
        Ok(Self {
            layers,
            len: self.len,
            max_len: self.max_len,
            precision: self.precision,
        })
    }

    /// Writes `k`, `v` (`[b, kv_heads, l, d]`, contiguous) after the cached positions of `layer`
    /// and returns views of everything cached so far, in the cache's precision.
    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let dtype = self.precision.dtype();
        let (k, v) = (&k.to_dtype(dtype)?, &v.to_dtype(dtype)?);
        let (b, h, l, d) = k.dims4()?;
        let need = self.len + l;
        let slot = &mut self.layers[layer];
        let cap = slot.as_ref().map_or(0, |(kb, _)| kb.dim(2).unwrap_or(0));
        if slot
            .as_ref()
            .is_some_and(|(kb, _)| kb.dim(0).ok() != Some(b))
        {
            return Err(ModelError::Input(
                "batch size changed within one KV cache".into(),
            ));
        }
        if need > cap {
            let new_cap = need
                .max(2 * cap)
                .max(KV_INITIAL_CAPACITY)
                .min(self.max_len.max(need));
            let grow = |old: Option<&Tensor>| -> Result<Tensor> {
                let buf = Tensor::zeros((b, h, new_cap, d), k.dtype(), k.device())?;
                if let Some(old) = old
                    && self.len > 0
                {
                    buf.slice_set(&old.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                }
                Ok(buf)
            };
            let (kb, vb) = (
                grow(slot.as_ref().map(|s| &s.0))?,
                grow(slot.as_ref().map(|s| &s.1))?,
            );
            *slot = Some((kb, vb));
        }
        let (kb, vb) = slot.as_ref().expect("allocated above");
        kb.slice_set(k, 2, self.len)?;
        vb.slice_set(v, 2, self.len)?;
        Ok((kb.narrow(2, 0, need)?, vb.narrow(2, 0, need)?))
    }
}

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Logits {
    All,
    Last,
    /// No logits: the final norm's output, for [`head::target_logps`].
    Hidden,
}

/// A loaded model: configuration plus frozen weights.
#[derive(Clone, Debug)]
pub struct Transformer {
    config: ModelConfig,
    embed: Weight,
    blocks: Vec<Block>,
    norm: Tensor,
    head: QLinear,
    rope: Rope,
    kv_precision: KvPrecision,
    /// What the OS did with the weights' pages at load.
    huge_pages: HugePageReport,
}

fn norm_tensor(g: &mut GgufFile, name: &str, n: usize) -> Result<Tensor> {
    let q = g.tensor(name, Some(&[n]))?;
    Ok(q.dequantize(&Device::Cpu)?)
}

impl Transformer {
    /// Loads a llama or qwen3 GGUF, checking every tensor's shape against the metadata.
    pub fn from_gguf(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let mut g = GgufFile::open(path)?;
        Self::from_gguf_file(&mut g)
    }

    pub fn from_gguf_file(g: &mut GgufFile) -> Result<Self> {
        let cfg = ModelConfig::from_gguf(&g.content)?;
        let (h, q, kv, ff) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let embed_q = g.tensor("token_embd.weight", Some(&[cfg.vocab_size, h]))?;
        let head = if cfg.tied_embeddings {
            QLinear::from_qtensor(embed_q.clone())?
        } else {
            QLinear::from_qtensor(g.tensor("output.weight", Some(&[cfg.vocab_size, h]))?)?
        };
        let embed = match (embed_q.dtype(), &head.weight) {
            (GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16, _) => {
                Weight::Dense(embed_q.dequantize(&Device::Cpu)?)
            }
            // A tied table repacked for the head serves lookups too, rather than being held twice.
            (_, Weight::Panels(p)) if cfg.tied_embeddings => Weight::Panels(p.clone()),
            _ => Weight::Quant(embed_q),
        };
        // No with_capacity: a corrupt block_count must fail on the first missing tensor, not abort.
        let mut blocks = Vec::new();
        for l in 0..cfg.num_layers {
            let p = format!("blk.{l}");
            let mut lin = |name: &str, out: usize, inp: usize| -> Result<QLinear> {
                QLinear::from_qtensor(g.tensor(&format!("{p}.{name}.weight"), Some(&[out, inp]))?)
            };
            let (qw, kw, vw, ow) = (
                lin("attn_q", q, h)?,
                lin("attn_k", kv, h)?,
                lin("attn_v", kv, h)?,
                lin("attn_output", h, q)?,
            );
            let (gw, uw, dw) = (
                lin("ffn_gate", ff, h)?,
                lin("ffn_up", ff, h)?,
                lin("ffn_down", h, ff)?,
            );
            let (q_norm, k_norm) = if cfg.qk_norm {
                (
                    Some(norm_tensor(
                        g,
                        &format!("{p}.attn_q_norm.weight"),
                        cfg.head_dim,
                    )?),
                    Some(norm_tensor(
                        g,
                        &format!("{p}.attn_k_norm.weight"),
                        cfg.head_dim,
                    )?),
                )
            } else {
                (None, None)
            };
            blocks.push(Block {
                attn_norm: norm_tensor(g, &format!("{p}.attn_norm.weight"), h)?,
                ffn_norm: norm_tensor(g, &format!("{p}.ffn_norm.weight"), h)?,
                q_norm,
                k_norm,
                q: qw,
                k: kw,
                v: vw,
                o: ow,
                gate: gw,
                up: uw,
                down: dw,
            });
        }
        let norm = norm_tensor(g, "output_norm.weight", h)?;
        let rope = Rope::new(&cfg)?;
        let mut model = Self {
            config: cfg,
            embed,
            blocks,
            norm,
            head,
            rope,
            kv_precision: KvPrecision::default(),
            huge_pages: HugePageReport::default(),
        };
        if std::env::var("HEARTH_HUGE_PAGES").as_deref() != Ok("off") {
            model.huge_pages = model.collapse_weights_into_huge_pages()?;
        }
        Ok(model)
    }

    /// Puts the packed weights a decode step streams onto huge pages where the OS allows it (see
    /// [`super::huge_pages`]). `HEARTH_HUGE_PAGES=off` leaves them where they are, so that a benchmark can
    /// compare the two in one build.
    fn collapse_weights_into_huge_pages(&self) -> Result<HugePageReport> {
        let mut packed = Vec::new();
        let linears = self
            .blocks
            .iter()
            .flat_map(|b| LoraTarget::ALL.iter().map(|&t| b.linear(t)))
            .chain([&self.head]);
        for w in linears.map(QLinear::weight).chain([&self.embed]) {
            match w {
                Weight::Quant(q) => packed.push(q.data()?),
                Weight::Panels(p) => packed.push(std::borrow::Cow::Borrowed(p.bytes())),
                Weight::Dense(_) => {}
            }
        }
        let buffers: Vec<&[u8]> = packed.iter().map(|d| &d[..]).collect();
        let report = super::huge_pages::collapse_into_huge_pages(&buffers);
        tracing::debug!(?report, "weights on huge pages");
        Ok(report)
    }

    /// How many of the weights' 2 MiB chunks the OS moved onto huge pages at load, and how many it refused.
    pub fn huge_pages(&self) -> HugePageReport {
        self.huge_pages
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Longest sequence this instance serves: the file's context length, capped at
    /// [`MAX_POSITIONS`].
    pub fn max_positions(&self) -> usize {
        self.rope.cos.dim(0).unwrap_or(0)
    }

    /// Bytes of weights one decode step reads: every projection of every block and the output head (the
    /// embedding row and the norms are noise next to them). Divided into a measured read bandwidth, it bounds
    /// decode tokens/s.
    pub fn decode_read_bytes(&self) -> usize {
        let bytes = |l: &QLinear| match l.weight() {
            Weight::Quant(q) => q.storage_size_in_bytes(),
            Weight::Panels(p) => p.bytes().len(),
            Weight::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
        };
        let per_block: usize = self
            .blocks
            .iter()
            .map(|b| {
                LoraTarget::ALL
                    .iter()
                    .map(|&t| bytes(b.linear(t)))
                    .sum::<usize>()
            })
            .sum();
        per_block + bytes(&self.head)
    }

    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// A fresh cache sized for this model, in the precision it was given (see [`Self::with_kv_precision`]).
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(&self.config, self.kv_precision)
    }

    /// This model with caches made by [`Self::new_cache`] (and so by [`super::generate`]) in `precision`.
    pub fn with_kv_precision(mut self, precision: KvPrecision) -> Self {
        self.kv_precision = precision;
        self
    }

    pub fn kv_precision(&self) -> KvPrecision {
        self.kv_precision
    }

    /// A copy with every block-quantized weight re-encoded as `dtype` (e.g. Q8_0: candle's Q4_1
    /// CPU kernel is ~4x slower than Q8_0's at the same model). Weights whose row length is not a
    /// multiple of the block size are kept as they are.
    pub fn requantized(&self, dtype: GgmlDType) -> Result<Self> {
        let re = |w: &Weight| -> Result<Weight> {
            let (from, cols) = match w {
                Weight::Quant(q) => (q.dtype(), q.shape().dims().last().copied().unwrap_or(0)),
                Weight::Panels(p) => (GgmlDType::Q8_0, p.k()),
                Weight::Dense(_) => return Ok(w.clone()),
            };
            if from == dtype || !cols.is_multiple_of(dtype.block_size()) {
                return Ok(w.clone());
            }
            Weight::packed(Arc::new(QTensor::quantize(&w.dequantize()?, dtype)?))
        };
        let mut m = self.clone();
        let tied_same = match (&m.embed, &m.head.weight) {
            (Weight::Quant(a), Weight::Quant(b)) => Arc::ptr_eq(a, b),
            (Weight::Panels(a), Weight::Panels(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        m.embed = re(&m.embed)?;
        let head = if tied_same {
            m.embed.clone()
        } else {
            re(&m.head.weight)?
        };
        m.head.set_weight(head);
        for b in &mut m.blocks {
            for t in LoraTarget::ALL {
                let lin = b.linear_mut(t);
                let w = re(&lin.weight)?;
                lin.set_weight(w);
            }
        }
        Ok(m)
    }

    /// A copy with every linear layer dense f32 and `lora` (if any) merged as `W + scale·B·A`.
    /// The exact reference for unmerged adapters, and the basis of merged exports.
    pub fn merged(&self, lora: Option<&LoraSet>) -> Result<Self> {
        let mut m = self.clone();
        for (l, b) in m.blocks.iter_mut().enumerate() {
            for t in LoraTarget::ALL {
                let lin = b.linear_mut(t);
                let mut w = lin.dequantize()?;
                if let Some(p) = lora.and_then(|s| s.get(l, t)) {
                    let factor = p.dora_factor(&w)?;
                    w = (w + p.delta()?)?;
                    if let Some(f) = factor {
                        w = w.broadcast_mul(&f.unsqueeze(1)?)?;
                    }
                }
                *lin = QLinear::from_dense(w)?;
            }
        }
        m.head = QLinear::from_dense(m.head.dequantize()?)?;
        Ok(m)
    }

    /// Logits for every position, `[b, l, vocab]`. `tokens: [b, l]` (u32); with a cache, positions
    /// continue from `cache.len()` and the new keys/values are appended.
    pub fn forward(
        &self,
        tokens: &Tensor,
        cache: Option<&mut KvCache>,
        lora: Option<&LoraSet>,
    ) -> Result<Tensor> {
        self.run(tokens, cache, lora, false, Logits::All)
    }

    /// Logits for the last position only, `[b, vocab]`: what decoding needs, without projecting
    /// every prompt position onto the vocabulary.
    pub fn forward_last(
        &self,
        tokens: &Tensor,
        cache: Option<&mut KvCache>,
        lora: Option<&LoraSet>,
    ) -> Result<Tensor> {
        Ok(self
            .run(tokens, cache, lora, false, Logits::Last)?
            .squeeze(1)?)
    }

    /// Differentiable forward for training: same math with backward-capable ops, no cache.
    pub fn forward_train(&self, tokens: &Tensor, lora: Option<&LoraSet>) -> Result<Tensor> {
        self.run(tokens, None, lora, true, Logits::All)
    }

    /// Training's log-probabilities: `lp[n, t] = log softmax(logits[n, t])[targets[n·l + t]]` for every
    /// position where `scored[n·l + t]`, and 0 elsewhere (`tokens: [n, l]`; `targets` and `scored` have
    /// `n·l` entries). Differentiable like [`Self::forward_train`], but the head's logits exist only inside one
    /// op and only for scored positions (see the `head` module), so callers must weigh `lp` by the same mask.
    pub fn target_logps(
        &self,
        tokens: &Tensor,
        lora: Option<&LoraSet>,
        targets: &[u32],
        scored: &[bool],
    ) -> Result<Tensor> {
        let (n, l) = tokens.dims2()?;
        if targets.len() != n * l || scored.len() != n * l {
            return Err(ModelError::Input(format!(
                "{} targets and {} scored flags for {n}x{l} positions",
                targets.len(),
                scored.len()
            )));
        }
        let h = self.run(tokens, None, lora, true, Logits::Hidden)?;
        let h = h.reshape((n * l, self.config.hidden_size))?;
        Ok(head::target_logps(&self.head, &h, targets, scored)?.reshape((n, l))?)
    }

    /// Convenience for one sequence: logits `[ids.len(), vocab]`.
    pub fn forward_ids(
        &self,
        ids: &[u32],
        cache: Option<&mut KvCache>,
        lora: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let t = Tensor::from_slice(ids, (1, ids.len()), &Device::Cpu)?;
        Ok(self.forward(&t, cache, lora)?.squeeze(0)?)
    }

    fn run(
        &self,
        tokens: &Tensor,
        mut cache: Option<&mut KvCache>,
        lora: Option<&LoraSet>,
        train: bool,
        which: Logits,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let (b, l) = tokens.dims2()?;
        if l == 0 {
            return Err(ModelError::Input("empty token sequence".into()));
        }
        let tokens = tokens.to_dtype(DType::U32)?;
        let max = tokens.flatten_all()?.max(0)?.to_scalar::<u32>()? as usize;
        if max >= cfg.vocab_size {
            return Err(ModelError::Input(format!(
                "token id {max} out of range for vocab {}",
                cfg.vocab_size
            )));
        }
        let offset = cache.as_ref().map_or(0, |c| c.len());
        if offset + l > self.max_positions() {
            return Err(ModelError::Input(format!(
                "{} positions exceed the context of {}",
                offset + l,
                self.max_positions()
            )));
        }
        if let Some(c) = cache.as_ref()
            && c.layers.len() != cfg.num_layers
        {
            return Err(ModelError::Input("KV cache built for another model".into()));
        }
        if let Some(s) = lora {
            s.check_compatible(self)?;
        }
        // One token of one sequence, nothing to differentiate: the serving decode step (decode.rs).
        if b == 1
            && l == 1
            && !train
            && let Some(c) = cache.as_deref_mut()
            && lora.is_none_or(|s| s.iter().all(|(_, p)| !p.tracks()))
        {
            return self.decode_token(&tokens, c, lora);
        }
        let mut x = self.embed.embedding(&tokens)?;
        // Several positions at once: each attends to the cache and to itself and the positions before it.
        let causal = l > 1;
        for (li, blk) in self.blocks.iter().enumerate() {
            let pair = |t| lora.and_then(|s| s.get(li, t));
            let h = rms_norm(&x, &blk.attn_norm, cfg.rms_eps, train)?;
            let h = self.attention(
                blk,
                li,
                &h,
                offset,
                causal,
                cache.as_deref_mut(),
                &pair,
                train,
            )?;
            x = train_ops::add(&x, &h)?;
            let h = rms_norm(&x, &blk.ffn_norm, cfg.rms_eps, train)?;
            // Independent projections of the same input run as two tasks: with two threads each gets one
            // whole matrix (one fork instead of a split per matrix); with one they run in turn.
            let (pg, pu) = (pair(LoraTarget::Gate), pair(LoraTarget::Up));
            let (g, u) = rayon::join(|| blk.gate.forward(&h, pg), || blk.up.forward(&h, pu));
            let act = train_ops::silu_mul(&g?, &u?)?;
            let h = blk.down.forward(&act, pair(LoraTarget::Down))?;
            x = train_ops::add(&x, &h)?;
        }
        if let Some(c) = cache {
            c.len += l;
        }
        if which == Logits::Last {
            x = x.narrow(1, l - 1, 1)?;
        }
        let x = rms_norm(&x, &self.norm, cfg.rms_eps, train)?;
        if which == Logits::Hidden {
            return Ok(x);
        }
        self.head.forward(&x, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention<'a>(
        &self,
        blk: &Block,
        layer: usize,
        x: &Tensor,
        offset: usize,
        causal: bool,
        cache: Option<&mut KvCache>,
        pair: &dyn Fn(LoraTarget) -> Option<&'a LoraPair>,
        train: bool,
    ) -> Result<Tensor> {
        let cfg = &self.config;
        let (b, l, _) = x.dims3()?;
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        // q on one task, k and v (each a third of its size with GQA) on the other; see the MLP in `run`.
        let (pq, pk, pv) = (
            pair(LoraTarget::Q),
            pair(LoraTarget::K),
            pair(LoraTarget::V),
        );
        let (q, (k, v)) = rayon::join(
            || blk.q.forward(x, pq),
            || (blk.k.forward(x, pk), blk.v.forward(x, pv)),
        );
        let mut q = q?.reshape((b, l, nh, hd))?;
        let mut k = k?.reshape((b, l, nkv, hd))?;
        let v = v?.reshape((b, l, nkv, hd))?;
        if let (Some(qn), Some(kn)) = (&blk.q_norm, &blk.k_norm) {
            q = rms_norm(&q, qn, cfg.rms_eps, train)?;
            k = rms_norm(&k, kn, cfg.rms_eps, train)?;
        }
        if train && cache.is_none() && offset == 0 {
            // Training: rotary embedding, scores, causal softmax and context as one node (`attention_train`).
            let table = |t: &Tensor| -> Result<Vec<f32>> {
                Ok(t.narrow(0, 0, l)?.flatten_all()?.to_vec1()?)
            };
            let core = attention_train::AttentionCore {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                cos: table(&self.rope.cos)?,
                sin: table(&self.rope.sin)?,
                interleaved: self.rope.interleaved,
                probabilities: Default::default(),
            };
            let ctx = q
                .contiguous()?
                .apply_op3(&k.contiguous()?, &v.contiguous()?, core)?;
            return blk.o.forward(&ctx, pair(LoraTarget::O));
        }
        let q = self
            .rope
            .apply(&q.transpose(1, 2)?.contiguous()?, offset, train)?;
        let k = self
            .rope
            .apply(&k.transpose(1, 2)?.contiguous()?, offset, train)?;
        let v = v.transpose(1, 2)?.contiguous()?;
        let (k, v) = match cache {
            Some(c) => c.append(layer, &k, &v)?,
            None => (k, v),
        };
        // GQA without repeating K/V: query head h uses kv head h / g, so group the g query heads
        // of each kv head along the row axis.
        let g = nh / nkv;
        if l == 1
            && !train
            && let Some(ctx) = decode_attention(&q, &k, &v, g)?
        {
            return blk.o.forward(&ctx, pair(LoraTarget::O));
        }
        // The general products run in f32 (a no-op for an f32 cache).
        let (k, v) = (k.to_dtype(DType::F32)?, v.to_dtype(DType::F32)?);
        let qg = q.reshape((b, nkv, g * l, hd))?;
        let scale = 1.0 / (hd as f64).sqrt();
        // Scale, causal mask and softmax as one op on hearth's threads (`train_ops`), in training and inference.
        let probs = train_ops::causal_softmax(
            &qg.matmul(&k.t()?)?,
            scale as f32,
            causal.then_some((l, offset)),
        )?;
        let ctx = probs
            .matmul(&v)?
            .reshape((b, nh, l, hd))?
            .transpose(1, 2)?
            .reshape((b, l, nh * hd))?;
        blk.o.forward(&ctx, pair(LoraTarget::O))
    }
}

/// One query position against the cached keys and values, as plain loops over the cache's slices: at decode
/// the products are 1×64 by 64×t per head, where the general matmul's packing and dispatch cost more than the
/// math (~11% of a SmolLM2 decode step). `q`: `[b, nh, 1, hd]`; `k`, `v`: `[b, nkv, t, hd]` with unit stride
/// along `hd` (the cache's narrowed buffers). `None` when a layout does not fit: the caller takes the general
/// path. Returns `[b, 1, nh·hd]`, as the general path does. The cache may hold f32 or f16 (see [`KvPrecision`]).
fn decode_attention(q: &Tensor, k: &Tensor, v: &Tensor, g: usize) -> Result<Option<Tensor>> {
    let (b, nh, _, hd) = q.dims4()?;
    let q = q.contiguous()?;
    let mut out = vec![0f32; b * nh * hd];
    match with_f32_slice(&q, |qd| attend_cached(qd, k, v, g, &mut out)).flatten() {
        Some(()) => Ok(Some(Tensor::from_vec(out, (b, 1, nh * hd), &Device::Cpu)?)),
        None => Ok(None),
    }
}

/// [`decode_attention`] on the query's values `qd` (`[b, nh, hd]`), into `out` (same shape). `None` when a
/// layout does not fit.
fn attend_cached(qd: &[f32], k: &Tensor, v: &Tensor, g: usize, out: &mut [f32]) -> Option<()> {
    let (b, nkv, t, hd) = k.dims4().ok()?;
    let nh = nkv * g;
    if qd.len() != b * nh * hd || out.len() != qd.len() || v.dims4().ok()? != (b, nkv, t, hd) {
        return None;
    }
    let strided = |x: &Tensor| -> Option<(Vec<usize>, usize)> {
        let l = x.layout();
        (l.stride()[3] == 1).then(|| (l.stride().to_vec(), l.start_offset()))
    };
    let ((ks, k0), (vs, v0)) = (strided(k)?, strided(v)?);
    let scale = 1.0 / (hd as f32).sqrt();
    let (k_store, _) = k.storage_and_layout();
    let (v_store, _) = v.storage_and_layout();
    let (candle_core::Storage::Cpu(kc), candle_core::Storage::Cpu(vc)) = (&*k_store, &*v_store)
    else {
        return None;
    };
    // One copy of the loops per cache precision.
    macro_rules! attend_typed {
        ($kd:expr, $vd:expr) => {
            attend_heads(
                &Heads {
                    qd,
                    kd: $kd,
                    vd: $vd,
                    ks: &ks,
                    vs: &vs,
                    k0,
                    v0,
                    nh,
                    hd,
                    g,
                    scale,
                },
                b,
                nkv,
                t,
                out,
            )
        };
    }
    match (kc, vc) {
        (CpuStorage::F32(kd), CpuStorage::F32(vd)) => attend_typed!(kd, vd),
        (CpuStorage::F16(kd), CpuStorage::F16(vd)) => attend_typed!(kd, vd),
        _ => None,
    }
}

/// [`attend_cached`] once the cache's slices are typed.
fn attend_heads<E: CacheValue>(
    heads: &Heads<E>,
    b: usize,
    nkv: usize,
    t: usize,
    out: &mut [f32],
) -> Option<()> {
    let (hd, g) = (heads.hd, heads.g);
    // Tasks are (sequence, kv head, range of positions): with threads to share and enough cache to read, the
    // positions split into one range per thread, so that SmolLM2's three kv heads make six tasks for two
    // threads rather than three (one thread did two thirds of the attention). Each range leaves unnormalised
    // partial sums, combined below.
    let threads = rayon::current_num_threads();
    let ranges = if threads > 1 && t >= PARALLEL_ATTENTION_POSITIONS {
        threads.min(t)
    } else {
        1
    };
    let part = g * hd + 2 * g;
    let mut partials = vec![0f32; b * nkv * ranges * part];
    let task = |i: usize, chunk: &mut [f32]| {
        let (bi, kv, r) = (i / (nkv * ranges), i / ranges % nkv, i % ranges);
        let (acc, stats) = chunk.split_at_mut(g * hd);
        let (max, sum) = stats.split_at_mut(g);
        let positions = t * r / ranges..t * (r + 1) / ranges;
        attend_dispatch(heads, bi, kv, positions, Partial { acc, max, sum })
    };
    if ranges > 1 {
        let failed = std::sync::atomic::AtomicBool::new(false);
        crate::model::spin_pool::items_mut(&mut partials, part, |first, tasks| {
            for (i, chunk) in tasks.chunks_mut(part).enumerate() {
                if task(first + i, chunk).is_none() {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        if failed.into_inner() {
            return None;
        }
    } else {
        for (i, chunk) in partials.chunks_mut(part).enumerate() {
            task(i, chunk)?;
        }
    }
    // softmax·V = Σ_r e^(max_r − M)·acc_r / Σ_r e^(max_r − M)·sum_r, M the largest max.
    for (o, p) in out
        .chunks_exact_mut(g * hd)
        .zip(partials.chunks_exact(ranges * part))
    {
        for j in 0..g {
            let stat = |r: usize, k: usize| p[r * part + g * hd + k * g + j];
            let m = (0..ranges)
                .map(|r| stat(r, 0))
                .fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = (0..ranges).map(|r| (stat(r, 0) - m).exp()).collect();
            let total: f32 = (0..ranges).map(|r| weights[r] * stat(r, 1)).sum();
            let orow = &mut o[j * hd..(j + 1) * hd];
            orow.fill(0.0);
            for (r, w) in weights.iter().enumerate() {
                let acc = &p[r * part + j * hd..r * part + (j + 1) * hd];
                for (o, a) in orow.iter_mut().zip(acc) {
                    *o += w * a;
                }
            }
            orow.iter_mut().for_each(|o| *o /= total);
        }
    }
    Some(())
}

/// One query position's attention inputs, as slices of the q tensor and the cache buffers.
struct Heads<'a, E> {
    qd: &'a [f32],
    kd: &'a [E],
    vd: &'a [E],
    ks: &'a [usize],
    vs: &'a [usize],
    k0: usize,
    v0: usize,
    nh: usize,
    hd: usize,
    g: usize,
    scale: f32,
}

/// From this many cached positions, decode attention is split across threads (a range of positions each).
const PARALLEL_ATTENTION_POSITIONS: usize = 64;

/// What [`attend`] leaves for one range of positions, per query head: the largest score `max`, `sum` =
/// Σ e^(score − max) and `acc` (`[g, hd]`) = Σ e^(score − max)·v, so that ranges combine into
/// softmax(q·Kᵀ·scale)·V (see [`attend_cached`]).
struct Partial<'a> {
    acc: &'a mut [f32],
    max: &'a mut [f32],
    sum: &'a mut [f32],
}

/// [`attend`] compiled for AVX2, FMA and F16C when the CPU has them (the loops vectorize 8 wide; the baseline
/// target has 4), else portable.
fn attend_dispatch<E: CacheValue>(
    h: &Heads<E>,
    bi: usize,
    kv: usize,
    positions: std::ops::Range<usize>,
    out: Partial,
) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    {
        if super::q8::avx2_usable() && std::is_x86_feature_detected!("f16c") {
            // SAFETY: the CPU has AVX2, FMA and F16C.
            return unsafe { attend_avx2(h, bi, kv, positions, out) };
        }
    }
    attend::<false, E>(h, bi, kv, positions, out)
}

/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2<E: CacheValue>(
    h: &Heads<E>,
    bi: usize,
    kv: usize,
    positions: std::ops::Range<usize>,
    out: Partial,
) -> Option<()> {
    attend::<true, E>(h, bi, kv, positions, out)
}

/// The `g` query heads of sequence `bi` that share kv head `kv`, over the cached `positions`, into `out` (see
/// [`Partial`]); `None` if a cache row is out of range. The heads are done together, so each cached key and
/// value row is read once for all of them rather than once per query head (at a few hundred positions the
/// cache is megabytes per step).
///
/// `AVX2`: the caller runs with AVX2, FMA and F16C, so the loops may use [`dot4_avx2`] and [`accumulate_avx2`].
#[inline(always)]
fn attend<const AVX2: bool, E: CacheValue>(
    h: &Heads<E>,
    bi: usize,
    kv: usize,
    positions: std::ops::Range<usize>,
    out: Partial,
) -> Option<()> {
    let (hd, g) = (h.hd, h.g);
    let (start, t) = (positions.start, positions.len());
    let mut p = vec![0f32; g * t];
    let first = bi * h.nh + kv * g;
    let kb = h.k0 + bi * h.ks[0] + kv * h.ks[1] + start * h.ks[2];
    let vb = h.v0 + bi * h.vs[0] + kv * h.vs[1] + start * h.vs[2];
    // Positions scored so far; only the x86 fast path below advances it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if AVX2 && hd.is_multiple_of(8) {
        // Four cached positions at a time: one horizontal reduction for four dot products, where a dot on its
        // own spent more on summing its lanes than on the 64 products (~5% of a SmolLM2 decode step).
        while done + 4 <= t {
            let row = |i: usize| {
                h.kd.get(kb + (done + i) * h.ks[2]..kb + (done + i) * h.ks[2] + hd)
            };
            let rows = [row(0)?, row(1)?, row(2)?, row(3)?];
            for j in 0..g {
                let qrow = &h.qd[(first + j) * hd..][..hd];
                // SAFETY: `AVX2` says the CPU has AVX2 and FMA; every row holds `hd` values, a multiple of 8.
                let d = unsafe { dot4_avx2(qrow, rows) };
                for (i, v) in d.into_iter().enumerate() {
                    p[j * t + done + i] = v * h.scale;
                }
            }
            done += 4;
        }
    }
    for ti in done..t {
        let krow = h.kd.get(kb + ti * h.ks[2]..kb + ti * h.ks[2] + hd)?;
        for j in 0..g {
            let qrow = &h.qd[(first + j) * hd..][..hd];
            p[j * t + ti] = dot(krow, qrow) * h.scale;
        }
    }
    let Partial { acc, max, sum } = out;
    for ((pj, m), s) in p
        .chunks_exact_mut(t.max(1))
        .zip(max.iter_mut())
        .zip(sum.iter_mut())
    {
        *m = pj.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        *s = 0.0;
        for v in pj.iter_mut() {
            *v = (*v - *m).exp();
            *s += *v;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 && hd.is_multiple_of(8) {
        if t > 0 && h.vd.len() < vb + (t - 1) * h.vs[2] + hd {
            return None;
        }
        for block in (0..t).step_by(V_BLOCK) {
            let n = V_BLOCK.min(t - block);
            for (j, orow) in acc.chunks_exact_mut(hd).enumerate() {
                let w = &p[j * t + block..j * t + block + n];
                // SAFETY: `AVX2` says the CPU has AVX2, FMA and F16C; the `n` rows from `block` lie inside the
                // cache (checked above) and hold `hd` values, a multiple of 8, as `orow` does.
                unsafe {
                    accumulate_avx2(w, h.vd.as_ptr().add(vb + block * h.vs[2]), h.vs[2], orow)
                };
            }
        }
        return Some(());
    }
    for ti in 0..t {
        let vrow = h.vd.get(vb + ti * h.vs[2]..vb + ti * h.vs[2] + hd)?;
        for (j, orow) in acc.chunks_exact_mut(hd).enumerate() {
            let w = p[j * t + ti];
            for (o, x) in orow.iter_mut().zip(vrow) {
                *o += w * x.widen();
            }
        }
    }
    Some(())
}

/// Cached positions whose value rows [`accumulate_avx2`] takes at a time: 8 KB (f16) or 16 KB (f32) at 64 values
/// per row, so the `g` query heads of a kv head re-read them from L1.
const V_BLOCK: usize = 64;

/// `o += Σ_i w[i]·v[i]`, `v[i]` the row at `v + i·stride`, with 64 columns of `o` held in registers across the
/// rows: adding each row into `o` in memory made every row a load and a store of `o` per head (in-process A/B
/// at 1,000 and 3,000 cached positions: 3-5% faster decode steps in 7 of 8 runs). Each column still adds its
/// rows in order, one FMA per row, so the sums are bit-identical to that row-at-a-time loop.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `o.len()` is a multiple of 8, and each of the `w.len()` rows at `v` holds
/// `o.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn accumulate_avx2<E: CacheValue>(w: &[f32], v: *const E, stride: usize, o: &mut [f32]) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's guarantees keep every load inside the rows and every load and store inside `o`.
    unsafe {
        let full = o.len() / 64 * 64;
        for c0 in (0..full).step_by(64) {
            let mut acc: [__m256; 8] =
                std::array::from_fn(|r| _mm256_loadu_ps(o.as_ptr().add(c0 + 8 * r)));
            for (i, &wi) in w.iter().enumerate() {
                let wv = _mm256_set1_ps(wi);
                let row = v.add(i * stride + c0);
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(wv, E::load8(row.add(8 * r)), *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(c0 + 8 * r), *a);
            }
        }
        // Columns past the last 64 (head sizes such as 80), row by row through memory.
        for (i, &wi) in w.iter().enumerate() {
            let wv = _mm256_set1_ps(wi);
            for c in (full..o.len()).step_by(8) {
                let op = o.as_mut_ptr().add(c);
                let x = E::load8(v.add(i * stride + c));
                _mm256_storeu_ps(op, _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(op)));
            }
        }
    }
}

/// A cached key or value: f32, or f16 widened on load.
trait CacheValue: FactorValue + Sync {
    /// Eight values from `p` as f32 lanes.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C, and `p` points at eight readable values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl CacheValue for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees eight readable values and AVX.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl FactorValue for half::f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

impl CacheValue for half::f16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const half::f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees eight readable values (16 bytes) and F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

/// `q · k[i]` for four rows `k` of `q.len()` values (a multiple of 8).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; every row in `k` is at least as long as `q`, and `q.len()` is a multiple
/// of 8.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot4_avx2<E: CacheValue>(q: &[f32], k: [&[E]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    // SAFETY: the caller's guarantees keep every load inside `q` and the rows.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for c in (0..q.len()).step_by(8) {
            let qv = _mm256_loadu_ps(q.as_ptr().add(c));
            for (a, row) in acc.iter_mut().zip(k) {
                *a = _mm256_fmadd_ps(qv, E::load8(row.as_ptr().add(c)), *a);
            }
        }
        let s = _mm256_hadd_ps(
            _mm256_hadd_ps(acc[0], acc[1]),
            _mm256_hadd_ps(acc[2], acc[3]),
        );
        let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), s);
        out
    }
}

/// A dot product in eight lanes, so it vectorizes without reassociating one long sum. Always inlined, so it
/// takes the target features of the loop it sits in.
#[inline(always)]
fn dot<A: FactorValue>(a: &[A], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x.widen() * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i].widen() * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}
