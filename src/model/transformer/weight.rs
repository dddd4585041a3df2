//! A frozen weight as the model keeps it, and the products with it that candle lacks: a quantized matmul
//! with a backward pass (int8 for Q8_0 and the types of [`kquant`], through a cached transpose), and a dense
//! one that skips the weight's gradient.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};

use crate::model::q8::kquant::{self, KQuant};
use crate::model::q8::q8k::{self, KRows};
use crate::model::q8::{self, PanelWeights, Q8Error, QuantizedRows};
use crate::model::{ModelError, Result};

/// A frozen weight: block-quantized and kept packed, Q8_0 repacked into panels where the CPU has their kernel
/// (see [`q8::panels`]), or dense f32 (F32/F16/BF16 in the file, or a merged/dequantized copy).
#[derive(Clone, Debug)]
pub enum Weight {
    Quant(Arc<QTensor>),
    Panels(Arc<PanelWeights>),
    Dense(Tensor),
}

impl Weight {
    /// A block-quantized GGUF tensor as the model keeps it: Q8_0, Q4_K and Q4_0 repacked into panels when
    /// [`q8::panels_usable`] (and `HEARTH_Q8_LAYOUT` is not `gguf`, which keeps the file's layout so
    /// that a benchmark can compare the two in one build), anything else as it is.
    pub(super) fn packed(q: Arc<QTensor>) -> Result<Self> {
        if PanelWeights::supports(q.dtype())
            && q8::panels_usable()
            && std::env::var("HEARTH_Q8_LAYOUT").as_deref() != Ok("gguf")
            && let Ok((n_out, k)) = q.shape().dims2()
        {
            let panels = PanelWeights::from_gguf(q.dtype(), &q.data()?, n_out, k)
                .map_err(ModelError::from)?;
            return Ok(Weight::Panels(Arc::new(panels)));
        }
        Ok(Weight::Quant(q))
    }

    /// The weight as dense f32 `[out, in]`.
    pub(super) fn dequantize(&self) -> Result<Tensor> {
        Ok(match self {
            Weight::Quant(q) => dequantize(q)?,
            Weight::Panels(p) => dequantize_panels(p)?,
            Weight::Dense(t) => t.clone(),
        })
    }

    /// A weight whose forward products take hearth's int8 kernels (see [`forward_in_int8`]): Q8_0 in
    /// either layout; `None` for other types.
    pub(super) fn int8(&self) -> Option<QuantWeight> {
        match self {
            Weight::Quant(q) if forward_in_int8(q.dtype()) => Some(QuantWeight::Gguf(q.clone())),
            Weight::Panels(p) => Some(QuantWeight::Panels(p.clone())),
            _ => None,
        }
    }

    /// The rows named by `tokens` (any shape), `[..tokens' dims, in]`.
    pub(super) fn embedding(&self, tokens: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Weight::Quant(q) => q.embedding(tokens)?,
            Weight::Panels(p) => {
                let ids = tokens.flatten_all()?.to_vec1::<u32>()?;
                let mut rows = vec![0f32; ids.len() * p.k()];
                for (&id, row) in ids.iter().zip(rows.chunks_exact_mut(p.k())) {
                    p.dequantize_row(id as usize, row)
                        .map_err(ModelError::from)?;
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
pub(super) struct QMatMulGrad {
    pub(super) w: QuantWeight,
    pub(super) transposed: Arc<TransposeCache>,
}

/// Whether hearth's int8 kernels multiply this GGUF type (Q8_0, and those of [`kquant`]).
pub(super) fn has_int8_kernel(dtype: GgmlDType) -> bool {
    dtype == GgmlDType::Q8_0 || KQuant::of(dtype).is_some()
}

/// Whether forward products with this type, kept in the GGUF layout, take the int8 kernels: Q8_0, and the
/// K-quants [`q8k`] multiplies (Q4_K, Q5_K, Q6_K). Q4_0's GGUF-layout kernel ([`kquant`]) is slower than
/// candle's path (its quantized matvec for a few rows, the weight dequantized into one f32 gemm for more), so
/// there Q4_0 takes the int8 kernels in the backward's transpose only (see [`TransposeCache`]); in panels
/// (see [`Weight::packed`]) it takes them everywhere. `HEARTH_KQUANT_FORWARD=candle` leaves the K-quants'
/// forward to candle as before, so that a benchmark can compare the two in one build.
pub(super) fn forward_in_int8(dtype: GgmlDType) -> bool {
    static CANDLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let candle =
        *CANDLE.get_or_init(|| std::env::var("HEARTH_KQUANT_FORWARD").as_deref() == Ok("candle"));
    dtype == GgmlDType::Q8_0 || (!candle && KQuant::of(dtype).is_some_and(q8k::supports))
}

/// Activation rows for the int8 kernels, quantized on first use into the form each weight type takes: Q8_0
/// (32-value blocks) for Q8_0 and Q4_0 weights, Q8_K (256-value blocks, see [`q8k`]) for the K-quants. The
/// products of one input (q, k and v; gate and up) share it, so each form is made once per input.
pub(crate) struct Int8Input<'a> {
    x: &'a [f32],
    k: usize,
    q8_0: std::cell::OnceCell<QuantizedRows>,
    q8_k: std::cell::OnceCell<KRows>,
}

impl<'a> Int8Input<'a> {
    /// Rows of `k` values (`x.len() / k` of them).
    pub(crate) fn new(x: &'a [f32], k: usize) -> Self {
        Self {
            x,
            k,
            q8_0: std::cell::OnceCell::new(),
            q8_k: std::cell::OnceCell::new(),
        }
    }

    pub(crate) fn values(&self) -> &'a [f32] {
        self.x
    }

    pub(crate) fn q8_0(&self) -> std::result::Result<&QuantizedRows, Q8Error> {
        if let Some(q) = self.q8_0.get() {
            return Ok(q);
        }
        let q = QuantizedRows::new(self.x, self.k)?;
        Ok(self.q8_0.get_or_init(|| q))
    }

    pub(crate) fn q8_k(&self) -> std::result::Result<&KRows, Q8Error> {
        if let Some(q) = self.q8_k.get() {
            return Ok(q);
        }
        let q = KRows::new(self.x, self.k)?;
        Ok(self.q8_k.get_or_init(|| q))
    }
}

/// The weight of a [`QMatMulGrad`]: a GGUF tensor, or Q8_0 panels.
#[derive(Clone)]
pub(super) enum QuantWeight {
    Gguf(Arc<QTensor>),
    Panels(Arc<PanelWeights>),
}

impl QuantWeight {
    pub(super) fn dims(&self) -> candle_core::Result<(usize, usize)> {
        match self {
            QuantWeight::Gguf(q) => q.shape().dims2(),
            QuantWeight::Panels(p) => Ok((p.n_out(), p.k())),
        }
    }

    /// Whether the int8 kernels multiply this weight (see [`has_int8_kernel`]).
    fn is_int8(&self) -> bool {
        match self {
            QuantWeight::Gguf(q) => has_int8_kernel(q.dtype()),
            QuantWeight::Panels(_) => true,
        }
    }

    /// The Q8_0 transpose `[k, rows]` of output rows `o0 .. o0 + rows` (multiples of 32) of an int8 weight:
    /// Q8_0 requantized along the output axis ([`q8::transpose_requantized`]), other types quantized from
    /// their dequantized values ([`q8::transpose_quantized_rows`]), 32 rows at a time.
    fn transpose_rows(&self, o0: usize, rows: usize) -> candle_core::Result<Vec<u8>> {
        let (n_out, k) = self.dims()?;
        let t = match self {
            QuantWeight::Panels(p) => p.transpose_rows(o0, rows),
            QuantWeight::Gguf(q) if self.is_int8() && o0 + rows <= n_out => {
                let bytes = q.data()?;
                let row_bytes = bytes.len() / n_out;
                let part = &bytes[o0 * row_bytes..(o0 + rows) * row_bytes];
                if q.dtype() == GgmlDType::Q8_0 {
                    q8::transpose_requantized(part, rows, k)
                } else {
                    q8::transpose_quantized_rows(rows, k, |o, out| {
                        let m = out.len() / k;
                        dequantize_rows(q.dtype(), &part[o * row_bytes..][..m * row_bytes], k, out)
                            .map_err(|e| Q8Error(format!("{:?} transpose: {e}", q.dtype())))
                    })
                }
            }
            QuantWeight::Gguf(_) => candle_core::bail!(
                "qmatmul-grad: no int8 transpose of rows {o0}..{} of this weight",
                o0 + rows
            ),
        };
        t.map_err(candle_core::Error::wrap)
    }

    /// `y = x·Wᵀ` (`[m, n_out]`) through hearth's int8 kernels, for a weight [`Weight::int8`] gives.
    pub(super) fn int8_matmul(&self, x: &Int8Input, y: &mut [f32]) -> candle_core::Result<()> {
        match self {
            QuantWeight::Gguf(q) => {
                let (n_out, _) = q.shape().dims2()?;
                let bytes = q.data()?;
                match KQuant::of(q.dtype()) {
                    Some(kind) if q8k::supports(kind) => x
                        .q8_k()
                        .and_then(|x| q8k::matmul(kind, &bytes, n_out, x, y)),
                    Some(kind) => x
                        .q8_0()
                        .and_then(|x| kquant::matmul(kind, &bytes, n_out, x, y)),
                    None if q.dtype() == GgmlDType::Q8_0 => x
                        .q8_0()
                        .and_then(|x| q8::matmul_quantized(&bytes, n_out, x, y)),
                    None => candle_core::bail!("int8 matmul: no kernel for {:?}", q.dtype()),
                }
                .map_err(candle_core::Error::wrap)
            }
            QuantWeight::Panels(p) => x
                .q8_0()
                .and_then(|x| q8::matmul_panels(p, x, y))
                .map_err(candle_core::Error::wrap),
        }
    }
}

/// [`q8::transpose_requantized`] of a layer's weight (a type of [`kquant`]: [`q8::transpose_quantized`] of
/// its dequantized values), in parts of [`TRANSPOSE_PART_ROWS`] output rows, kept for the layer's lifetime
/// once training has needed it, while all kept transposes of the process fit in
/// [`set_transpose_cache_limit`]'s bound; past it, each backward pass builds one part at a time and drops it.
/// Kept: +1 byte per weight, a quarter of what a dequantized f32 copy would cost, where rebuilding it every
/// backward pass is a large share of the product's time. Serving never builds it. Kept or not, a product
/// sums the same parts in the same order, so the result is the same bytes.
#[derive(Default)]
pub(super) struct TransposeCache(std::sync::OnceLock<Vec<Vec<u8>>>);

/// Output rows of one part of a [`TransposeCache`]: a vocabulary-sized head (128k rows of 2048, 278 MB as
/// Q8_0) never exists whole unless kept; a part of it is 8.7 MB.
pub(super) const TRANSPOSE_PART_ROWS: usize = 4096;

/// Bytes all kept transposes may take, and what they take now ([`TransposeCache`]).
static TRANSPOSE_LIMIT: AtomicUsize = AtomicUsize::new(DEFAULT_TRANSPOSE_LIMIT);
static TRANSPOSE_KEPT: AtomicUsize = AtomicUsize::new(0);

/// [`set_transpose_cache_limit`]'s value until something sets another.
pub const DEFAULT_TRANSPOSE_LIMIT: usize = 256 << 20;

/// Bounds the bytes of weight transposes that training keeps across backward passes, for the whole process
/// (one base serves every trainer in it). Transposes kept already stay; later ones are kept only while the
/// total stays within `bytes`.
pub fn set_transpose_cache_limit(bytes: usize) {
    TRANSPOSE_LIMIT.store(bytes, Ordering::Relaxed);
}

/// Bytes of weight transposes kept now, by every model of the process.
pub fn transpose_cache_bytes() -> usize {
    TRANSPOSE_KEPT.load(Ordering::Relaxed)
}

/// Takes `bytes` of the limit, or nothing when they do not fit.
fn reserve_transpose(bytes: usize) -> bool {
    TRANSPOSE_KEPT
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |kept| {
            kept.checked_add(bytes)
                .filter(|&total| total <= TRANSPOSE_LIMIT.load(Ordering::Relaxed))
        })
        .is_ok()
}

impl std::fmt::Debug for TransposeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TransposeCache({} bytes)", self.kept())
    }
}

impl Drop for TransposeCache {
    fn drop(&mut self) {
        TRANSPOSE_KEPT.fetch_sub(self.kept(), Ordering::AcqRel);
    }
}

/// The parts of an `n_out`-row transpose: `(first output row, rows)`.
fn transpose_parts(n_out: usize) -> Vec<(usize, usize)> {
    (0..n_out)
        .step_by(TRANSPOSE_PART_ROWS)
        .map(|o0| (o0, TRANSPOSE_PART_ROWS.min(n_out - o0)))
        .collect()
}

impl TransposeCache {
    /// Bytes this cache keeps.
    pub(super) fn kept(&self) -> usize {
        self.0
            .get()
            .map_or(0, |parts| parts.iter().map(Vec::len).sum())
    }

    /// The kept parts of int8 weight `w`'s transpose, or those built now and kept when the limit allows;
    /// `None` when they do not fit.
    fn kept_or_keep(&self, w: &QuantWeight) -> candle_core::Result<Option<&[Vec<u8>]>> {
        if let Some(t) = self.0.get() {
            return Ok(Some(t));
        }
        let (n_out, k) = w.dims()?;
        let bytes = k * n_out.div_ceil(q8::QK8_0) * q8::BLOCK_BYTES;
        if !reserve_transpose(bytes) {
            return Ok(None);
        }
        let built: candle_core::Result<Vec<Vec<u8>>> = transpose_parts(n_out)
            .into_iter()
            .map(|(o0, rows)| w.transpose_rows(o0, rows))
            .collect();
        let mut mine = match built {
            Ok(parts) => Some(parts),
            Err(e) => {
                TRANSPOSE_KEPT.fetch_sub(bytes, Ordering::AcqRel);
                return Err(e);
            }
        };
        // Two threads may build it at once; both results are the same bytes, and the loser's share goes back.
        let kept = self.0.get_or_init(|| mine.take().unwrap_or_default());
        if mine.is_some() {
            TRANSPOSE_KEPT.fetch_sub(bytes, Ordering::AcqRel);
        }
        Ok(Some(kept))
    }

    /// `dx = dy · W` for each `(dy, m, dx)` (`dy` `[m, n_out]`, `dx` `[m, k]`) of an int8 weight `w` whose
    /// `n_out` is a multiple of 32, through the int8 kernel: part by part of the transpose (the kept ones, or
    /// each built once for all the products and dropped), the first part's product written into `dx` and
    /// each later one's added.
    pub(super) fn input_grads(
        &self,
        w: &QuantWeight,
        products: &mut [(&[f32], usize, &mut [f32])],
    ) -> candle_core::Result<()> {
        input_grads_by_parts(w, self.kept_or_keep(w)?, products)
    }
}

/// [`TransposeCache::input_grads`] by the `kept` parts, or by parts built one at a time when `None`.
fn input_grads_by_parts(
    w: &QuantWeight,
    kept: Option<&[Vec<u8>]>,
    products: &mut [(&[f32], usize, &mut [f32])],
) -> candle_core::Result<()> {
    let (n_out, k) = w.dims()?;
    let parts = transpose_parts(n_out);
    let (mut dy_part, mut dx_part) = (Vec::new(), Vec::new());
    for (i, &(o0, rows)) in parts.iter().enumerate() {
        let built;
        let t: &[u8] = match kept {
            Some(kept) => &kept[i],
            None => {
                built = w.transpose_rows(o0, rows)?;
                &built
            }
        };
        for (dy, m, dx) in products.iter_mut() {
            let dy_rows: &[f32] = if parts.len() == 1 {
                dy
            } else {
                dy_part.clear();
                for r in dy.chunks_exact(n_out) {
                    dy_part.extend_from_slice(&r[o0..o0 + rows]);
                }
                &dy_part
            };
            let product = if i == 0 {
                q8::matmul(t, k, rows, dy_rows, *m, dx)
            } else {
                dx_part.resize(dx.len(), 0.0);
                q8::matmul(t, k, rows, dy_rows, *m, &mut dx_part)
            };
            product.map_err(candle_core::Error::wrap)?;
            if i > 0 {
                dx.iter_mut().zip(&dx_part).for_each(|(a, b)| *a += b);
            }
        }
    }
    Ok(())
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
        if let Some(r) = int8_fwd(&self.w, storage, layout) {
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
        if let Some(dx) = int8_input_grad(&self.w, &self.transposed, grad_res)? {
            return Ok(Some(dx));
        }
        let w = match &self.w {
            QuantWeight::Gguf(q) => dequantize(q)?,
            QuantWeight::Panels(p) => dequantize_panels(p)?,
        }; // [out, in], for this product only
        Ok(Some(grad_res.broadcast_matmul(&w)?))
    }
}

/// `dy · W` for an int8 weight through the int8 kernel, multiplying by the weight's transpose requantized along
/// the output axis (see [`TransposeCache`]). `None` when [`int8_backward_fits`] says no (the caller takes the
/// f32 route).
fn int8_input_grad(
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
    int8_input_grad_into(w, transposed, &dyv, m, &mut dx)?;
    let mut shape = lead.to_vec();
    shape.push(k);
    Ok(Some(Tensor::from_vec(dx, shape, dy.device())?))
}

/// Whether a weight takes the int8 backward: an int8 weight with a multiple of 32 outputs (the transpose's
/// blocks run along them).
pub(super) fn int8_backward_fits(w: &QuantWeight) -> bool {
    w.is_int8()
        && w.dims()
            .is_ok_and(|(n_out, _)| n_out.is_multiple_of(q8::QK8_0))
}

/// `dx = dy · W` (`dy` `[m, n_out]`, `dx` `[m, k]`) through the int8 kernel, for a weight
/// [`int8_backward_fits`] accepts.
pub(super) fn int8_input_grad_into(
    w: &QuantWeight,
    transposed: &TransposeCache,
    dy: &[f32],
    m: usize,
    dx: &mut [f32],
) -> candle_core::Result<()> {
    transposed.input_grads(w, &mut [(dy, m, dx)])
}

/// The weight as dense f32 `[out, in]`: Q8_0 through [`q8::dequantize`] (parallel, where candle's loop is
/// single-threaded), other types through candle.
fn dequantize(w: &QTensor) -> candle_core::Result<Tensor> {
    if w.dtype() == GgmlDType::Q8_0
        && let Ok((n_out, k)) = w.shape().dims2()
    {
        let bytes = w.data()?;
        let mut out = vec![0f32; n_out * k];
        q8::dequantize(&bytes, k, &mut out).map_err(candle_core::Error::wrap)?;
        return Tensor::from_vec(out, (n_out, k), &Device::Cpu);
    }
    w.dequantize(&Device::Cpu)
}

/// GGUF rows of `dtype` (as many as `out` holds) dequantized by candle into `out`.
fn dequantize_rows(
    dtype: GgmlDType,
    bytes: &[u8],
    k: usize,
    out: &mut [f32],
) -> candle_core::Result<()> {
    let storage =
        candle_core::quantized::QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, dtype)?;
    let rows = QTensor::new(storage, (out.len() / k, k))?.dequantize(&Device::Cpu)?;
    out.copy_from_slice(&rows.flatten_all()?.to_vec1::<f32>()?);
    Ok(())
}

/// Q8_0 panels as dense f32 `[out, in]` (rows split across the current rayon pool).
fn dequantize_panels(p: &PanelWeights) -> candle_core::Result<Tensor> {
    Tensor::from_vec(p.dequantize(), (p.n_out(), p.k()), &Device::Cpu)
}

/// Products with an int8 weight through [`q8`] (see there for why); `None` hands the call to candle (no
/// int8 kernel for the type, or not a contiguous f32 `[m, k]` input).
fn int8_fwd(
    w: &QuantWeight,
    storage: &CpuStorage,
    layout: &Layout,
) -> Option<candle_core::Result<(CpuStorage, Shape)>> {
    if matches!(w, QuantWeight::Gguf(q) if !forward_in_int8(q.dtype())) {
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
    let done = w.int8_matmul(&Int8Input::new(x, k), &mut y);
    Some(done.map(|()| (CpuStorage::F32(y), Shape::from((m, n_out)))))
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
pub(super) fn frozen_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A weight of more output rows than one part of its transpose: each part is those rows of the whole
    /// transpose, byte for byte; products through kept parts and through parts built one at a time are the
    /// same bytes, and within int8 rounding of the f32 product. For the GGUF layout and Q8_0 panels.
    #[test]
    fn transpose_parts_give_the_same_products() {
        let (n, k, m) = (TRANSPOSE_PART_ROWS + 96, 64, 3);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 509) as f32 - 254.0) / 97.0)
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = Arc::new(QTensor::quantize(&t, GgmlDType::Q8_0).unwrap());
        let bytes = q.data().unwrap().to_vec();
        let dense: Vec<f32> = dequantize(&q)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let whole = q8::transpose_requantized(&bytes, n, k).unwrap();
        let dy: Vec<f32> = (0..m * n)
            .map(|i| ((i * 31 % 17) as f32 - 8.0) / 9.0)
            .collect();
        let mut weights = vec![QuantWeight::Gguf(q)];
        if q8::panels_usable() {
            let p = PanelWeights::from_q8_0(&bytes, n, k).unwrap();
            weights.push(QuantWeight::Panels(Arc::new(p)));
        }
        for w in weights {
            let parts: Vec<Vec<u8>> = transpose_parts(n)
                .iter()
                .map(|&(o0, rows)| w.transpose_rows(o0, rows).unwrap())
                .collect();
            assert_eq!(parts.len(), 2);
            let whole_row = n / q8::QK8_0 * q8::BLOCK_BYTES;
            for (part, &(o0, rows)) in parts.iter().zip(&transpose_parts(n)) {
                let row = rows / q8::QK8_0 * q8::BLOCK_BYTES;
                for c in 0..k {
                    let from = c * whole_row + o0 / q8::QK8_0 * q8::BLOCK_BYTES;
                    assert_eq!(part[c * row..][..row], whole[from..][..row], "column {c}");
                }
            }
            let run = |kept: Option<&[Vec<u8>]>| {
                let mut dx = vec![f32::NAN; m * k];
                input_grads_by_parts(&w, kept, &mut [(&dy, m, &mut dx)]).unwrap();
                dx
            };
            let (kept, built) = (run(Some(&parts)), run(None));
            assert!(
                kept.iter()
                    .zip(&built)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            // Against the whole transpose's product: the parts only add in another order.
            let mut one = vec![0f32; m * k];
            q8::matmul(&whole, k, n, &dy, m, &mut one).unwrap();
            let scale = one.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (i, (a, b)) in kept.iter().zip(&one).enumerate() {
                assert!((a - b).abs() <= 1e-5 * scale, "value {i}: {a} vs {b}");
            }
            // And the whole one against the f32 product, within the int8 roundings of `dy` and the transpose.
            for r in 0..m {
                for c in 0..k {
                    let want: f32 = (0..n).map(|o| dy[r * n + o] * dense[o * k + c]).sum();
                    let got = one[r * k + c];
                    assert!(
                        (got - want).abs() <= 0.1 * scale,
                        "[{r}][{c}] {got} vs {want}"
                    );
                }
            }
        }
    }
}
