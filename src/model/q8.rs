//! Q8_0 matrix products for serving (decode and prefill against packed weights), faster than candle's.
//!
//! Decode is bound by reading the weights: every token streams all of them once. candle 0.11's Q8_0 path
//! reached ~41% of the read bandwidth here (SmolLM2: 31 tokens/s on one thread through the serve engine). This
//! kernel reads the packed GGUF blocks in place (no copy; 34 bytes per 32 weights), converts scales through a
//! table, does the int8 dot with AVX2 (`maddubs` on |w| and sign(x, w), the llama.cpp formulation) or, where
//! the CPU has AVX-VNNI or AVX-512 VNNI, `vpdpbusd` on `w + 128` with the offset undone per block, keeps eight
//! independent accumulator chains (eight weight rows at once, each activation block loaded once for all
//! eight), prefetches 16 rows ahead in software (the interleaved short row streams do not train the hardware
//! prefetcher; this alone doubled decode), and splits rows across threads (the decode team of `model::team`,
//! or the current rayon pool) only when the work is large enough to pay for it. The activation is quantized
//! to Q8_0 exactly as candle and llama.cpp do (d = amax/127, round to nearest), so results match theirs up to
//! the order of float additions. Other CPUs get a portable scalar loop.
//!
//! Where the CPU has AVX-512 VNNI a model keeps its Q8_0 weights repacked into [`panels`] instead, whose
//! layout the memory system streams twice as fast; the GGUF-layout kernels here then serve training's
//! transposed weights, and models loaded with `HEARTH_Q8_LAYOUT=gguf`.

use crate::model::team::SharedSlice;

pub mod panels;
pub use panels::{PanelWeights, matmul_panels, matvec_panels_many, panels_usable};

/// Weights per Q8_0 block.
pub const QK8_0: usize = 32;
/// Bytes per Q8_0 block: an f16 scale and 32 int8.
pub const BLOCK_BYTES: usize = 34;

/// Below this many weights in a split, one thread does it all: a rayon hand-off costs microseconds. Decode
/// keeps the pool's other threads spinning (`generate`), so a hand-off is cheap there and each core's own
/// read bandwidth is the limit: splitting SmolLM2's 576×576 projections too measured ~4% faster per step
/// on 2 threads than from 2^19 weights.
const PARALLEL_MIN_WEIGHTS: usize = 1 << 16;

/// Weight rows the kernel computes together (eight accumulator chains).
const ROW_GROUP: usize = 8;

/// One activation row quantized to Q8_0: per block a scale and 32 int8. A view into [`QuantizedRows`]' buffers.
#[derive(Clone, Copy)]
struct QuantRow<'a> {
    d: &'a [f32],
    qs: &'a [i8],
    /// Per block, `-128 · Σ qs`: the VNNI paths dot `w + 128` (unsigned) with `x`, and this undoes the offset.
    offset_fix: &'a [i32],
}

/// Quantizes one row `x` into its blocks' scales `d`, values `qs` and offset corrections (one entry per
/// block of 32 in `d` and `offset_fix`, one per value in `qs`).
fn quantize_row_into(x: &[f32], d: &mut [f32], qs: &mut [i8], offset_fix: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if x86::usable() {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { x86::quantize_row_into(x, d, qs, offset_fix) };
        }
    }
    quantize_row_generic(x, d, qs, offset_fix)
}

/// Compiled twice: portable, and inside an AVX2 function where the loops vectorize (`round` included; the
/// portable build calls libm's `roundf` per value).
#[inline(always)]
fn quantize_row_generic(x: &[f32], d: &mut [f32], qs: &mut [i8], offset_fix: &mut [i32]) {
    let blocks = x.chunks_exact(QK8_0).zip(qs.chunks_exact_mut(QK8_0));
    for (((xb, qb), d), fix) in blocks.zip(d.iter_mut()).zip(offset_fix.iter_mut()) {
        // max |v| over the bits (ordered like the values for non-negative floats) so the loop vectorizes, which
        // `f32::max` does not; a NaN counts as 0, as `f32::max` skips it.
        let amax = f32::from_bits(
            xb.iter()
                .map(|v| match v.to_bits() & 0x7fff_ffff {
                    b if b > 0x7f80_0000 => 0,
                    b => b,
                })
                .max()
                .unwrap_or(0),
        );
        let scale = amax / 127.0;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (q, v) in qb.iter_mut().zip(xb) {
            *q = round_half_away(v * inv) as i8;
        }
        *fix = -128 * qb.iter().map(|&q| q as i32).sum::<i32>();
        // The scale is stored as f16 in a Q8_0 block; round it the same way so sums match candle's.
        *d = half::f16::from_f32(scale).to_f32();
    }
}

/// `f32::round` (halves away from zero) from `trunc`, which compiles to one vector instruction where `round`
/// is a libm call per value (quantizing the activations was 3% of a decode step). Exact for every finite `x`:
/// `x - trunc(x)` is exact, and so is the integer step.
#[inline(always)]
fn round_half_away(x: f32) -> f32 {
    let t = x.trunc();
    if (x - t).abs() >= 0.5 {
        t + 1f32.copysign(x)
    } else {
        t
    }
}

/// Row count from which [`QuantizedRows::new`] quantizes in parallel.
const PARALLEL_QUANTIZE_ROWS: usize = 32;

/// Activation rows quantized to Q8_0 once, for several weights that read the same input (q, k and v; gate
/// and up), where [`matmul`] would quantize them again for each.
///
/// All rows share three flat buffers: with three vectors per row, a training step on a small model spent ~9%
/// of its time allocating and freeing them (a product quantizes hundreds of rows, dozens of times a step).
pub struct QuantizedRows {
    d: Vec<f32>,
    qs: Vec<i8>,
    offset_fix: Vec<i32>,
    k: usize,
}

impl QuantizedRows {
    /// Quantizes `x` (`m × k`, `m = x.len() / k`). `k` must be a non-zero multiple of 32.
    pub fn new(x: &[f32], k: usize) -> Result<Self, String> {
        if k == 0 || !k.is_multiple_of(QK8_0) || !x.len().is_multiple_of(k) {
            return Err(format!(
                "q8_0 activations: k = {k} is not a non-zero multiple of {QK8_0} dividing {} values",
                x.len()
            ));
        }
        let (m, blocks) = (x.len() / k, k / QK8_0);
        let mut d = vec![0f32; m * blocks];
        let mut qs = vec![0i8; m * k];
        let mut offset_fix = vec![0i32; m * blocks];
        // Prefill and training quantize hundreds of rows per product: split them across the current rayon
        // pool (on one thread this was ~4% of a SmolLM2 training step, with the other core waiting).
        if m >= PARALLEL_QUANTIZE_ROWS {
            use rayon::prelude::*;
            x.par_chunks_exact(k)
                .zip(qs.par_chunks_exact_mut(k))
                .zip(d.par_chunks_exact_mut(blocks))
                .zip(offset_fix.par_chunks_exact_mut(blocks))
                .with_min_len(PARALLEL_QUANTIZE_ROWS / 2)
                .for_each(|(((x, qs), d), fix)| quantize_row_into(x, d, qs, fix));
        } else {
            let rows = x.chunks_exact(k).zip(qs.chunks_exact_mut(k));
            let rows = rows.zip(d.chunks_exact_mut(blocks));
            for (((x, qs), d), fix) in rows.zip(offset_fix.chunks_exact_mut(blocks)) {
                quantize_row_into(x, d, qs, fix);
            }
        }
        Ok(Self {
            d,
            qs,
            offset_fix,
            k,
        })
    }

    /// Number of rows.
    fn len(&self) -> usize {
        self.qs.len() / self.k
    }

    /// Row `r`'s view; `r` must be below [`Self::len`].
    fn row(&self, r: usize) -> QuantRow<'_> {
        let blocks = self.k / QK8_0;
        QuantRow {
            d: &self.d[r * blocks..(r + 1) * blocks],
            qs: &self.qs[r * self.k..(r + 1) * self.k],
            offset_fix: &self.offset_fix[r * blocks..(r + 1) * blocks],
        }
    }

    /// Per-row views, the form the kernels take.
    fn rows(&self) -> Vec<QuantRow<'_>> {
        let blocks = self.k / QK8_0;
        self.qs
            .chunks_exact(self.k)
            .zip(self.d.chunks_exact(blocks))
            .zip(self.offset_fix.chunks_exact(blocks))
            .map(|((qs, d), offset_fix)| QuantRow { d, qs, offset_fix })
            .collect()
    }
}

/// `y[r][o] = Σ_k x[r][k] · W[o][k]` for a row-major Q8_0 weight `[n_out, k]` given as its raw GGUF bytes.
/// `x` is `m × k`, `y` is `m × n_out`. `k` must be a multiple of 32 (GGUF guarantees it for Q8_0).
pub fn matmul(
    w: &[u8],
    n_out: usize,
    k: usize,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) -> Result<(), String> {
    if x.len() != m * k {
        return Err(format!(
            "q8_0 matmul: x has {} values, not {m}x{k}",
            x.len()
        ));
    }
    matmul_quantized(w, n_out, &QuantizedRows::new(x, k)?, y)
}

/// Expands Q8_0 rows of `k` weights (raw GGUF bytes) into `out` (`[rows, k]` f32), rows split across the
/// current rayon pool: a backward pass that cannot take the int8 route ([`transpose_requantized`] needs output
/// rows in multiples of 32) needs the dense weight for a moment per product, and candle's loop is
/// single-threaded and scalar (~80 ms for SmolLM2's 28 M-weight head).
pub fn dequantize(w: &[u8], k: usize, out: &mut [f32]) -> Result<(), String> {
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    if k == 0
        || !k.is_multiple_of(QK8_0)
        || out.len() / k * row_bytes != w.len()
        || !out.len().is_multiple_of(k)
    {
        return Err(format!(
            "q8_0 dequantize: {} bytes do not make rows of {k} weights for {} values",
            w.len(),
            out.len()
        ));
    }
    use rayon::prelude::*;
    out.par_chunks_mut(k)
        .zip(w.par_chunks(row_bytes))
        .with_min_len(64)
        .for_each(|(row, bytes)| {
            for (vals, blk) in row
                .chunks_exact_mut(QK8_0)
                .zip(bytes.chunks_exact(BLOCK_BYTES))
            {
                let d = block_scale(blk);
                for (v, &q) in vals.iter_mut().zip(&blk[2..]) {
                    *v = d * q as i8 as f32;
                }
            }
        });
    Ok(())
}

/// The transpose of a Q8_0 weight `[n_out, k]` as Q8_0 `[k, n_out]` (blocks along `n_out`, which must be a
/// multiple of 32): what a backward pass multiplies by, `dx = dy · W = dy · (Wᵀ)ᵀ`, so that it runs through
/// [`matmul`]'s int8 kernel too. Each value is dequantized and quantized again along the other axis, so it
/// moves by at most half a step of its new block's scale (max |w| / 254 over 32 values of one input column),
/// plus the f16 rounding of that scale. Built in parallel over blocks of 32 input columns.
pub fn transpose_requantized(w: &[u8], n_out: usize, k: usize) -> Result<Vec<u8>, String> {
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    if k == 0
        || !k.is_multiple_of(QK8_0)
        || n_out == 0
        || !n_out.is_multiple_of(QK8_0)
        || w.len() != n_out * row_bytes
    {
        return Err(format!(
            "q8_0 transpose: {} bytes are not {n_out} rows of {k} weights, or {n_out} rows are no multiple of 32",
            w.len()
        ));
    }
    let out_row_bytes = n_out / QK8_0 * BLOCK_BYTES;
    let mut out = vec![0u8; k * out_row_bytes];
    use rayon::prelude::*;
    // One unit per block of 32 input columns (the 32 rows of the transpose it writes are contiguous), in
    // 32 × 32 tiles that stay in L1: expanded to f32 transposed, then each tile row quantized as one block.
    out.par_chunks_mut(QK8_0 * out_row_bytes)
        .enumerate()
        .for_each(|(b, dst)| {
            #[cfg(target_arch = "x86_64")]
            if x86::usable() {
                // SAFETY: the CPU has AVX2 and FMA; sizes were checked above.
                unsafe { x86::transpose_columns(w, n_out, row_bytes, b, dst) };
                return;
            }
            transpose_columns(w, n_out, row_bytes, b, dst);
        });
    Ok(out)
}

/// Rows `32·b .. 32·b + 32` of [`transpose_requantized`]'s output (`dst`), from input column block `b`, in
/// 32 × 32 tiles that stay in L1: expanded to f32 transposed, then each tile row quantized as one block.
/// Compiled twice, like [`quantize_row_generic`] (the portable build calls libm's `truncf` per value).
#[inline(always)]
fn transpose_columns(w: &[u8], n_out: usize, row_bytes: usize, b: usize, dst: &mut [u8]) {
    let out_row_bytes = n_out / QK8_0 * BLOCK_BYTES;
    let mut tile = [[0f32; QK8_0]; QK8_0];
    for ob in 0..n_out / QK8_0 {
        for j in 0..QK8_0 {
            let blk = &w[(ob * QK8_0 + j) * row_bytes + b * BLOCK_BYTES..][..BLOCK_BYTES];
            let d = block_scale(blk);
            for (c, &q) in blk[2..].iter().enumerate() {
                tile[c][j] = d * q as i8 as f32;
            }
        }
        for (c, vals) in tile.iter().enumerate() {
            // As `quantize_row_into`: d = max |v| / 127, values rounded at 1/d, d stored as f16.
            let amax = vals.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
            let blk = &mut dst[c * out_row_bytes + ob * BLOCK_BYTES..][..BLOCK_BYTES];
            blk[..2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
            for (q, v) in blk[2..].iter_mut().zip(vals) {
                *q = round_half_away(v * inv) as i8 as u8;
            }
        }
    }
}

/// [`matmul`] on activations already quantized.
pub fn matmul_quantized(
    w: &[u8],
    n_out: usize,
    x: &QuantizedRows,
    y: &mut [f32],
) -> Result<(), String> {
    let (k, m) = (x.k, x.len());
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    if w.len() != n_out * row_bytes || y.len() != m * n_out {
        return Err(format!(
            "q8_0 matmul: sizes do not agree (w {} bytes for {n_out}x{k}, y {}, m {m})",
            w.len(),
            y.len()
        ));
    }
    let rows = x.rows();
    let rows = &rows[..];
    #[cfg(target_arch = "x86_64")]
    if m >= SPLIT_INPUT_ROWS && x86::gemm_usable() {
        gemm_panels(w, n_out, k, rows, y);
        return Ok(());
    }
    // Few rows (decode, small batches) split the weight rows across threads, so the weights stream from memory
    // once; computed output-row major ([n_out, m]) so that threads own disjoint slices, which is `y` itself for
    // one row and is transposed into `y` after for more. Many rows (prefill) split the input rows instead: each
    // thread writes whole rows of `y` in place, and re-reads weights that the cache mostly holds.
    if m >= SPLIT_INPUT_ROWS {
        let threads = rayon::current_num_threads();
        let per = m.div_ceil(threads);
        use rayon::prelude::*;
        y.par_chunks_mut(per * n_out)
            .zip(rows.par_chunks(per))
            .for_each(|(y, rows)| {
                let layout = OutLayout::by_input_row(n_out);
                dot_rows(w, n_out, k, rows, y, layout);
            });
        return Ok(());
    }
    if m == 1 {
        dot_rows_split(k, rows, &mut [(w, y)]);
        return Ok(());
    }
    let mut out = vec![0f32; n_out * m];
    dot_rows_split(k, rows, &mut [(w, &mut out[..])]);
    for o in 0..n_out {
        for r in 0..m {
            y[r * n_out + o] = out[o * m + r];
        }
    }
    Ok(())
}

/// [`matmul_quantized`] of one input against several weights (`(w, y)` pairs, `n_out = y.len()`), as one
/// parallel split over all their rows: q, k and v (or gate and up) then cost one hand-off between threads
/// instead of three (or two), and the small k and v matrices no longer split on their own.
pub fn matvec_quantized_many(
    x: &QuantizedRows,
    products: &mut [(&[u8], &mut [f32])],
) -> Result<(), String> {
    let k = x.k;
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    if x.len() != 1 {
        return Err(format!("q8_0 matvec: {} input rows, not one", x.len()));
    }
    for (w, y) in products.iter() {
        if w.len() != y.len() * row_bytes {
            return Err(format!(
                "q8_0 matvec: sizes do not agree (w {} bytes for {}x{k})",
                w.len(),
                y.len()
            ));
        }
    }
    dot_rows_split(k, &[x.row(0)], products);
    Ok(())
}

/// From this many input rows [`matmul_quantized`] splits the input rows across threads, not the weight rows
/// (or, on AVX-512 VNNI, runs the panel kernel).
const SPLIT_INPUT_ROWS: usize = 16;

/// Many input rows (prefill, training) through the AVX-512 VNNI panel kernel: weight rows in panels of 16
/// (one int32 lane each), input rows in tiles of eight, so each weight load serves eight products and each
/// broadcast activation word sixteen, where [`dot_rows`] reloads both per product and reduces across lanes.
/// Panels split across threads; each writes its 16 columns of `y` in place.
#[cfg(target_arch = "x86_64")]
fn gemm_panels(w: &[u8], n_out: usize, k: usize, rows: &[QuantRow], y: &mut [f32]) {
    let n_panels = n_out.div_ceil(x86::PANEL);
    let y = SharedSlice::new(y);
    crate::model::team::for_each_range(n_panels, |panels| {
        // SAFETY: `gemm_usable` found AVX-512 F/BW/VNNI; `w` holds `n_out` rows of `k / 32` blocks and `y`
        // `m * n_out` values (checked by `matmul_quantized`, which borrows `y` mutably for this call); panel
        // ranges are disjoint, so each output column is written by one range only.
        unsafe { x86::gemm_panels(w, n_out, k, rows, panels, y.as_ptr()) };
    });
}

/// Where the kernel writes the product of weight row `o` and input row `r`.
#[derive(Clone, Copy, Debug)]
struct OutLayout {
    per_output: usize,
    per_input_row: usize,
}

impl OutLayout {
    /// `[n_out, m]`: output-row major, for `m` input rows.
    fn by_output(m: usize) -> Self {
        Self {
            per_output: m,
            per_input_row: 1,
        }
    }

    /// `[m, n_out]`: the layout of `y`.
    fn by_input_row(n_out: usize) -> Self {
        Self {
            per_output: 1,
            per_input_row: n_out,
        }
    }

    #[inline(always)]
    fn at(self, o: usize, r: usize) -> usize {
        o * self.per_output + r * self.per_input_row
    }
}

/// [`dot_rows`] of every input row with all rows of each weight in `products` (`(w, out)` pairs, `out` being
/// `[n_out, m]`), split across threads (the decode team of `model::team`, or the current rayon pool) when the
/// weights together are large enough. Items are groups of eight weight rows (the kernel's row group) numbered
/// across the products in order, dealt in shrinking ranges as threads come free; a range may span two products.
fn dot_rows_split(k: usize, rows: &[QuantRow], products: &mut [(&[u8], &mut [f32])]) {
    let m = rows.len();
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    let weights: usize = products.iter().map(|(_, out)| out.len() / m * k).sum();
    if rayon::current_num_threads() == 1 || weights < PARALLEL_MIN_WEIGHTS {
        for (w, out) in products.iter_mut() {
            dot_rows(w, out.len() / m, k, rows, out, OutLayout::by_output(m));
        }
        return;
    }
    let parts: Vec<(&[u8], usize, SharedSlice<f32>)> = products
        .iter_mut()
        .map(|(w, out)| (*w, out.len() / m, SharedSlice::new(out)))
        .collect();
    let total: usize = parts.iter().map(|p| p.1.div_ceil(ROW_GROUP)).sum();
    crate::model::team::for_each_range(total, |items| {
        let mut first_group = 0;
        for (w, n_out, out) in &parts {
            let groups = n_out.div_ceil(ROW_GROUP);
            let (a, b) = (
                items.start.max(first_group) - first_group,
                items
                    .end
                    .min(first_group + groups)
                    .saturating_sub(first_group),
            );
            first_group += groups;
            if a >= b {
                continue;
            }
            let (first, end) = (a * ROW_GROUP, (b * ROW_GROUP).min(*n_out));
            // SAFETY: `products` borrows every `out` mutably for this whole call, and item ranges are
            // disjoint, so the weight rows `first..end` of this product are written by this range alone.
            let part = unsafe { out.part(first * m..end * m) };
            dot_rows(
                &w[first * row_bytes..end * row_bytes],
                end - first,
                k,
                rows,
                part,
                OutLayout::by_output(m),
            );
        }
    });
}

/// Whether the CPU has AVX2 and FMA: what this module's fast paths (and the decode loops in
/// `transformer`, compiled for them) need.
pub(crate) fn avx2_usable() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::usable()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The products of `n` weight rows in `w` with every input row, at `out[layout.at(o, r)]`.
fn dot_rows(w: &[u8], n: usize, k: usize, rows: &[QuantRow], out: &mut [f32], layout: OutLayout) {
    #[cfg(target_arch = "x86_64")]
    {
        if x86::usable() {
            // SAFETY: the CPU has AVX2 and FMA (checked by `usable`); sizes were checked by `matmul`.
            unsafe { x86::dot_rows(w, n, k, rows, out, layout) };
            return;
        }
    }
    dot_rows_scalar(w, n, k, rows, out, layout);
}

fn block_scale(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

fn dot_rows_scalar(
    w: &[u8],
    n: usize,
    k: usize,
    rows: &[QuantRow],
    out: &mut [f32],
    layout: OutLayout,
) {
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    for o in 0..n {
        let wrow = &w[o * row_bytes..(o + 1) * row_bytes];
        for (r, x) in rows.iter().enumerate() {
            let mut acc = 0f32;
            for (b, wb) in wrow.chunks_exact(BLOCK_BYTES).enumerate() {
                let xq = &x.qs[b * QK8_0..(b + 1) * QK8_0];
                let s: i32 = wb[2..]
                    .iter()
                    .zip(xq)
                    .map(|(&wq, &xv)| wq as i8 as i32 * xv as i32)
                    .sum();
                acc += block_scale(wb) * x.d[b] * s as f32;
            }
            out[layout.at(o, r)] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    use super::{BLOCK_BYTES, OutLayout, QK8_0, QuantRow, ROW_GROUP};

    /// [`super::quantize_row_into`] compiled with AVX2.
    ///
    /// # Safety
    /// AVX2 and FMA are available.
    /// The compiler kept the generic loop's saturating `as i8` and the block maximum scalar (a decode step spent
    /// 2.5% here); this is the same arithmetic eight lanes wide, bit-exact against the generic loop (tested).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantize_row_into(
        x: &[f32],
        d: &mut [f32],
        qs: &mut [i8],
        offset_fix: &mut [i32],
    ) {
        let blocks = x.len() / QK8_0;
        // The stores below write through `qs`'s pointer: its length is what keeps them in bounds.
        assert!(qs.len() == blocks * QK8_0 && d.len() == blocks && offset_fix.len() == blocks);
        let abs_bits = _mm256_set1_epi32(0x7fff_ffff);
        let inf_bits = _mm256_set1_epi32(0x7f80_0000);
        let sign = _mm256_set1_ps(-0.0);
        let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for b in 0..blocks {
            // SAFETY: block `b` holds 32 values of `x` and of `qs`.
            let scale = unsafe {
                let p = x.as_ptr().add(b * QK8_0);
                // Plain loops rather than `array::map`, whose closures were compiled as calls (1.6% of a
                // training step's samples in `quantize_row::{{closure}}`).
                let mut v = [_mm256_setzero_ps(); 4];
                for (i, vi) in v.iter_mut().enumerate() {
                    *vi = _mm256_loadu_ps(p.add(8 * i));
                }
                // max |v| over the bits, a NaN counting as 0 (as in the generic loop)
                let mut m = _mm256_setzero_si256();
                for &vi in &v {
                    let bits = _mm256_and_si256(_mm256_castps_si256(vi), abs_bits);
                    let nan = _mm256_cmpgt_epi32(bits, inf_bits);
                    m = _mm256_max_epi32(m, _mm256_andnot_si256(nan, bits));
                }
                let m = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
                let m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0b01_00_11_10));
                let m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0b10_11_00_01));
                let amax = f32::from_bits(_mm_cvtsi128_si32(m) as u32);
                let scale = amax / 127.0;
                let inv = _mm256_set1_ps(if scale != 0.0 { 1.0 / scale } else { 0.0 });
                let mut q = [_mm256_setzero_si256(); 4];
                for (qi, &vi) in q.iter_mut().zip(&v) {
                    let y = _mm256_mul_ps(vi, inv);
                    let t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                    let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
                    let up = _mm256_cmp_ps(frac, half, _CMP_GE_OQ);
                    let step = _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(y, sign), one));
                    // a NaN quantizes to 0, as `NaN as i8` does
                    let r = _mm256_and_ps(_mm256_add_ps(t, step), _mm256_cmp_ps(y, y, _CMP_ORD_Q));
                    *qi = _mm256_cvtps_epi32(r);
                }
                let sum =
                    _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
                let s = _mm_add_epi32(
                    _mm256_castsi256_si128(sum),
                    _mm256_extracti128_si256(sum, 1),
                );
                let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
                offset_fix[b] = -128 * _mm_cvtsi128_si32(s);
                let packed = _mm256_packs_epi16(
                    _mm256_packs_epi32(q[0], q[1]),
                    _mm256_packs_epi32(q[2], q[3]),
                );
                let packed = _mm256_permutevar8x32_epi32(packed, order);
                _mm256_storeu_si256(qs.as_mut_ptr().add(b * QK8_0).cast(), packed);
                scale
            };
            // The scale is stored as f16 in a Q8_0 block; round it the same way so sums match candle's.
            d[b] = half::f16::from_f32(scale).to_f32();
        }
    }

    /// [`super::transpose_columns`] compiled with AVX2.
    ///
    /// # Safety
    /// AVX2 and FMA are available.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn transpose_columns(
        w: &[u8],
        n_out: usize,
        row_bytes: usize,
        b: usize,
        dst: &mut [u8],
    ) {
        super::transpose_columns(w, n_out, row_bytes, b, dst)
    }

    pub fn usable() -> bool {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }

    /// Which int8 dot instruction the kernel uses: `maddubs` + `madd` (AVX2), or `vpdpbusd` in its VEX
    /// (AVX-VNNI) or EVEX (AVX-512 VNNI with VL, e.g. Ice Lake servers, which lack AVX-VNNI) encoding.
    const AVX2: u8 = 0;
    const AVX_VNNI: u8 = 1;
    const AVX512_VNNI: u8 = 2;

    /// The best path this CPU has. `HEARTH_Q8_KERNEL=avx2` forces the AVX2 one, so a benchmark can compare the
    /// two in one build.
    fn isa() -> u8 {
        static ISA: OnceLock<u8> = OnceLock::new();
        *ISA.get_or_init(|| {
            if std::env::var("HEARTH_Q8_KERNEL").is_ok_and(|v| v == "avx2") {
                AVX2
            } else if is_x86_feature_detected!("avxvnni") {
                AVX_VNNI
            } else if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
            {
                AVX512_VNNI
            } else {
                AVX2
            }
        })
    }

    // The helpers and the loop body are `inline(always)` without target features of their own: inlined into
    // the entry points below, they compile with each entry point's features. (A call to a function with
    // more features than its caller cannot be inlined: per block, that was a real call.)

    /// f32 for every f16 bit pattern (256 KiB, of which a model's scales touch a few KB). A scale then costs a
    /// 16-bit load and a broadcast load, where F16C's convert is two more uops on the vector ports that the
    /// int8 dot needs (measured in cache, with a build running beside it: ~+10% on the AVX-512 VNNI path,
    /// +6-10% on AVX2).
    fn f16_table() -> &'static [f32] {
        static TABLE: OnceLock<Box<[f32]>> = OnceLock::new();
        TABLE.get_or_init(|| {
            (0..=u16::MAX)
                .map(|b| half::f16::from_bits(b).to_f32())
                .collect()
        })
    }

    /// The block's f16 scale in all eight lanes, through [`f16_table`].
    ///
    /// # Safety
    /// `b` points at a block; `table` has 65536 entries; AVX is available.
    #[inline(always)]
    unsafe fn scale8(b: *const u8, table: *const f32) -> __m256 {
        unsafe {
            let bits = (b as *const u16).read_unaligned();
            _mm256_broadcast_ss(&*table.add(bits as usize))
        }
    }

    /// The part of [`block_dot`] that depends on the weights only (`|w|`, or `w + 128` for VNNI), so that a
    /// tile computes it once for all its input rows.
    ///
    /// # Safety
    /// As for [`block_dot`].
    #[inline(always)]
    unsafe fn block_prepare<const ISA: u8>(w: __m256i) -> __m256i {
        unsafe {
            if ISA == AVX2 {
                _mm256_sign_epi8(w, w)
            } else {
                _mm256_xor_si256(w, _mm256_set1_epi8(-128))
            }
        }
    }

    /// Sum of the 32 products of two int8 blocks as 8 int32 lanes, plus `fix` (in lane 0; see
    /// `QuantRow::offset_fix`), given [`block_prepare`]'s `prepared` for `w`. AVX2 has only `maddubs` (u8 × i8
    /// pairs that saturate in i16), so it dots |w| with sign(x, w), the llama.cpp formulation, and ignores
    /// `fix`. `vpdpbusd` sums in i32 without saturating, so the VNNI paths dot `w + 128` (one xor) with `x` and
    /// start from `fix = -128 · Σx`: two instructions where the sign trick takes three or four.
    ///
    /// # Safety
    /// AVX2 is available, and AVX-VNNI or AVX-512 VNNI + VL for those `ISA`s.
    #[inline(always)]
    unsafe fn block_dot<const ISA: u8>(
        prepared: __m256i,
        w: __m256i,
        x: __m256i,
        fix: __m256i,
    ) -> __m256i {
        unsafe {
            if ISA == AVX2 {
                let sx = _mm256_sign_epi8(x, w);
                _mm256_madd_epi16(_mm256_maddubs_epi16(prepared, sx), _mm256_set1_epi16(1))
            } else if ISA == AVX_VNNI {
                _mm256_dpbusd_avx_epi32(fix, prepared, x)
            } else {
                _mm256_dpbusd_epi32(fix, prepared, x)
            }
        }
    }

    /// Weight rows per panel of the many-row kernel: one int32 lane each in a 512-bit register.
    pub const PANEL: usize = 16;
    /// Input rows per tile of the many-row kernel: eight int32 and eight f32 accumulators, eight independent
    /// `vpdpbusd` chains (latency 5, one per cycle).
    const TILE_ROWS: usize = 8;
    /// `u32` words per block of a packed panel: 8 groups × 16 rows of four weight bytes, then 16 f32 scales.
    const PANEL_BLOCK_WORDS: usize = 8 * PANEL + PANEL;

    /// Whether the panel kernel can run: AVX-512 F, BW and VNNI (and the kernel not forced to AVX2).
    pub fn gemm_usable() -> bool {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| {
            isa() == AVX512_VNNI
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
        })
    }

    /// Repacks weight rows `o0..o0 + 16` (fewer at the end: the missing rows are zero weights) into `out`:
    /// per block, for each group of four consecutive weights, the 16 rows' bytes side by side as one register
    /// (offset by 128, unsigned, for `vpdpbusd`), then the 16 scales.
    fn pack_panel(w: &[u8], n_out: usize, k: usize, o0: usize, out: &mut [u32]) {
        let blocks = k / QK8_0;
        let row_bytes = blocks * BLOCK_BYTES;
        let table = f16_table();
        for b in 0..blocks {
            let dst = &mut out[b * PANEL_BLOCK_WORDS..(b + 1) * PANEL_BLOCK_WORDS];
            for l in 0..PANEL {
                let o = o0 + l;
                if o >= n_out {
                    for g in 0..8 {
                        dst[g * PANEL + l] = 0x8080_8080;
                    }
                    dst[8 * PANEL + l] = 0;
                    continue;
                }
                let blk = &w[o * row_bytes + b * BLOCK_BYTES..][..BLOCK_BYTES];
                for g in 0..8 {
                    let q = u32::from_le_bytes([
                        blk[2 + 4 * g],
                        blk[3 + 4 * g],
                        blk[4 + 4 * g],
                        blk[5 + 4 * g],
                    ]);
                    dst[g * PANEL + l] = q ^ 0x8080_8080;
                }
                dst[8 * PANEL + l] = table[u16::from_le_bytes([blk[0], blk[1]]) as usize].to_bits();
            }
        }
    }

    /// Products of the weight panels `panels` with every input row, written to their columns of `y`
    /// (`[m, n_out]`, row-major).
    ///
    /// # Safety
    /// AVX-512 F, BW and VNNI are available ([`gemm_usable`]); `w` holds `n_out` rows of `k / 32` blocks; every
    /// row has `k` quantized values; `y` points at `rows.len() * n_out` values that no one else reads or
    /// writes in these panels' columns during the call.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn gemm_panels(
        w: &[u8],
        n_out: usize,
        k: usize,
        rows: &[QuantRow],
        panels: std::ops::Range<usize>,
        y: *mut f32,
    ) {
        let m = rows.len();
        let blocks = k / QK8_0;
        let mut packed = vec![0u32; blocks * PANEL_BLOCK_WORDS];
        for p in panels {
            pack_panel(w, n_out, k, p * PANEL, &mut packed);
            let cols = PANEL.min(n_out - p * PANEL);
            let mut r = 0;
            while r < m {
                let tile = &rows[r..(r + TILE_ROWS).min(m)];
                // SAFETY: the caller's guarantees; `packed` holds `blocks` packed blocks, and rows r.. of `y`
                // have columns p·16 .. p·16 + cols.
                unsafe {
                    let dst = Out {
                        at: y.add(r * n_out + p * PANEL),
                        stride: n_out,
                        cols,
                    };
                    match tile.len() {
                        8 => gemm_tile::<8>(&packed, blocks, tile, dst),
                        7 => gemm_tile::<7>(&packed, blocks, tile, dst),
                        6 => gemm_tile::<6>(&packed, blocks, tile, dst),
                        5 => gemm_tile::<5>(&packed, blocks, tile, dst),
                        4 => gemm_tile::<4>(&packed, blocks, tile, dst),
                        3 => gemm_tile::<3>(&packed, blocks, tile, dst),
                        2 => gemm_tile::<2>(&packed, blocks, tile, dst),
                        _ => gemm_tile::<1>(&packed, blocks, tile, dst),
                    }
                }
                r += tile.len();
            }
        }
    }

    /// Where a tile's results go: `cols` (≤ 16) values per row, rows `stride` apart.
    #[derive(Clone, Copy)]
    struct Out {
        at: *mut f32,
        stride: usize,
        cols: usize,
    }

    /// `R` input rows against one packed panel: per block, eight `vpdpbusd` per row (each a broadcast word of
    /// four activations times the 16 rows' four weights), started from the row's offset fix, then scaled by
    /// weight scale × activation scale into the row's f32 accumulator.
    ///
    /// # Safety
    /// As for [`gemm_panels`]; `tile.len() == R`, `packed` holds `blocks` packed blocks, `out` has `R` rows.
    #[inline(always)]
    unsafe fn gemm_tile<const R: usize>(
        packed: &[u32],
        blocks: usize,
        tile: &[QuantRow],
        out: Out,
    ) {
        // SAFETY: the caller's guarantees bound every read below (block b < blocks of a k-value row, group
        // g < 8 of a 32-value block) and the stores (R rows of `cols` lanes, masked).
        unsafe {
            let pp = packed.as_ptr();
            let xs: [*const i8; R] = std::array::from_fn(|r| tile[r].qs.as_ptr());
            let mut acc = [_mm512_setzero_ps(); R];
            for b in 0..blocks {
                let pb = pp.add(b * PANEL_BLOCK_WORDS);
                let mut dots: [__m512i; R] = std::array::from_fn(|r| {
                    _mm512_set1_epi32(*tile[r].offset_fix.get_unchecked(b))
                });
                for g in 0..8 {
                    let wv = _mm512_loadu_si512(pb.add(g * PANEL).cast());
                    for r in 0..R {
                        let word = (xs[r].add(b * QK8_0 + 4 * g) as *const i32).read_unaligned();
                        dots[r] = _mm512_dpbusd_epi32(dots[r], wv, _mm512_set1_epi32(word));
                    }
                }
                let dw = _mm512_loadu_ps(pb.add(8 * PANEL).cast());
                for r in 0..R {
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*tile[r].d.get_unchecked(b)));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r]), scale, acc[r]);
                }
            }
            let mask: __mmask16 = if out.cols >= PANEL {
                0xffff
            } else {
                (1u16 << out.cols) - 1
            };
            for (r, a) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(out.at.add(r * out.stride), mask, *a);
            }
        }
    }

    /// # Safety
    /// AVX is available.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; `w` holds `n` rows of `k / 32` blocks, each row in `rows` has `k`
    /// quantized values, and `out` has `n * rows.len()` slots.
    pub unsafe fn dot_rows(
        w: &[u8],
        n: usize,
        k: usize,
        rows: &[QuantRow],
        out: &mut [f32],
        layout: OutLayout,
    ) {
        // SAFETY: the caller's guarantees, plus the VNNI instructions where `isa()` found them.
        unsafe {
            match isa() {
                AVX_VNNI => dot_rows_avx_vnni(w, n, k, rows, out, layout),
                AVX512_VNNI => dot_rows_avx512_vnni(w, n, k, rows, out, layout),
                _ => dot_rows_avx2(w, n, k, rows, out, layout),
            }
        }
    }

    /// Every path this CPU can run, each applied to the same input: for tests.
    #[cfg(test)]
    pub fn dot_rows_each_isa(
        w: &[u8],
        n: usize,
        k: usize,
        rows: &[QuantRow],
    ) -> Vec<(&'static str, Vec<f32>)> {
        let mut outs = Vec::new();
        type Path = unsafe fn(&[u8], usize, usize, &[QuantRow], &mut [f32], OutLayout);
        let mut run = |name, f: Path| {
            let mut out = vec![0f32; n * rows.len()];
            // SAFETY: each path is run only where `usable` and the feature checks below found its instructions;
            // the sizes are the caller's (as for `dot_rows`).
            unsafe { f(w, n, k, rows, &mut out, OutLayout::by_output(rows.len())) };
            outs.push((name, out));
        };
        if usable() {
            run("avx2", dot_rows_avx2);
            if is_x86_feature_detected!("avxvnni") {
                run("avx-vnni", dot_rows_avx_vnni);
            }
            if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                run("avx512-vnni", dot_rows_avx512_vnni);
            }
        }
        outs
    }

    #[target_feature(enable = "avx2,fma,avxvnni")]
    unsafe fn dot_rows_avx_vnni(
        w: &[u8],
        n: usize,
        k: usize,
        rows: &[QuantRow],
        out: &mut [f32],
        layout: OutLayout,
    ) {
        // SAFETY: as for `dot_rows`.
        unsafe { body::<AVX_VNNI>(w, n, k, rows, out, layout) }
    }

    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    unsafe fn dot_rows_avx512_vnni(
        w: &[u8],
        n: usize,
        k: usize,
        rows: &[QuantRow],
        out: &mut [f32],
        layout: OutLayout,
    ) {
        // SAFETY: as for `dot_rows`.
        unsafe { body::<AVX512_VNNI>(w, n, k, rows, out, layout) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_rows_avx2(
        w: &[u8],
        n: usize,
        k: usize,
        rows: &[QuantRow],
        out: &mut [f32],
        layout: OutLayout,
    ) {
        // SAFETY: as for `dot_rows`.
        unsafe { body::<AVX2>(w, n, k, rows, out, layout) }
    }

    /// How far ahead of the kernel's position weights are prefetched, in bytes. A group's rows are read
    /// interleaved, a block of each in turn: short strided streams that the hardware prefetchers follow
    /// poorly. Prefetching the group's bytes in memory order instead, 12 KB ahead (6-16 KB measured alike),
    /// took one thread streaming a 160 MB matrix from 9.4 to 16.2 GB/s at k = 576 and from 11.2 to 13.7 GB/s
    /// at k = 1536 (AMD EPYC, AVX2), and a 2-thread SmolLM2 decode from 86-97 to 110-117 tokens/s, against the
    /// same block 16 rows ahead (the previous prefetch).
    const PREFETCH_AHEAD: usize = 12 * 1024;

    /// Weight rows and input rows of one tile of the many-row path: per block, each weight's
    /// [`block_prepare`] serves two input rows and each input block four weight rows, eight accumulators.
    const TILE_W: usize = 4;
    const TILE_X: usize = 2;

    /// The products of `n` weight rows with every input row, in tiles: for one input row (decode), groups of
    /// [`ROW_GROUP`] weight rows, eight independent accumulator chains (four measured ~10% slower) sharing one
    /// activation load per block; for several, [`TILE_W`] × [`TILE_X`] tiles. Weight rows are outermost, so a
    /// tile's weights stay in L1 while every input row passes. Every product is summed in the same order
    /// whatever its tile, so all tilings agree bit for bit.
    ///
    /// # Safety
    /// As for [`dot_rows`], plus the instructions `ISA` names.
    #[inline(always)]
    unsafe fn body<const ISA: u8>(
        w: &[u8],
        n: usize,
        k: usize,
        rows: &[QuantRow],
        out: &mut [f32],
        layout: OutLayout,
    ) {
        let t = Tiling {
            w: w.as_ptr(),
            row_bytes: k / QK8_0 * BLOCK_BYTES,
            blocks: k / QK8_0,
            table: f16_table().as_ptr(),
            layout,
        };
        let m = rows.len();
        let mut o = 0;
        if m == 1 {
            while o + ROW_GROUP <= n {
                // SAFETY: rows o..o + ROW_GROUP <= n of `w` and the one input row exist; `out` has a slot for each of
                // their products (the caller's guarantees).
                unsafe { t.tile::<ISA, { ROW_GROUP }, 1>(o, 0, rows, out) };
                o += ROW_GROUP;
            }
            while o < n {
                // SAFETY: as above, for the single row o < n.
                unsafe { t.tile::<ISA, 1, 1>(o, 0, rows, out) };
                o += 1;
            }
            return;
        }
        while o < n {
            let rw = (n - o).min(TILE_W);
            let mut r = 0;
            while r < m {
                let xs = &rows[r..(r + TILE_X).min(m)];
                // SAFETY: rows o..o + rw <= n of `w` and the rows `xs` of `rows` exist; `out` has a slot for
                // each of their products (the caller's guarantees).
                unsafe {
                    match (rw, xs.len()) {
                        (4, 2) => t.tile::<ISA, 4, 2>(o, r, xs, out),
                        (4, _) => t.tile::<ISA, 4, 1>(o, r, xs, out),
                        (3, 2) => t.tile::<ISA, 3, 2>(o, r, xs, out),
                        (3, _) => t.tile::<ISA, 3, 1>(o, r, xs, out),
                        (2, 2) => t.tile::<ISA, 2, 2>(o, r, xs, out),
                        (2, _) => t.tile::<ISA, 2, 1>(o, r, xs, out),
                        (_, 2) => t.tile::<ISA, 1, 2>(o, r, xs, out),
                        _ => t.tile::<ISA, 1, 1>(o, r, xs, out),
                    }
                }
                r += xs.len();
            }
            o += rw;
        }
    }

    /// What every tile of one [`body`] call shares.
    struct Tiling {
        w: *const u8,
        row_bytes: usize,
        blocks: usize,
        table: *const f32,
        layout: OutLayout,
    }

    impl Tiling {
        /// Weight rows `o..o + RW` by input rows `r..r + RX` (`xs`).
        ///
        /// # Safety
        /// As for [`body`]; `xs` holds `RX` rows and `w` rows `o..o + RW`.
        #[inline(always)]
        unsafe fn tile<const ISA: u8, const RW: usize, const RX: usize>(
            &self,
            o: usize,
            r: usize,
            xs: &[QuantRow],
            out: &mut [f32],
        ) {
            unsafe {
                let mut acc = [[_mm256_setzero_ps(); RX]; RW];
                for b in 0..self.blocks {
                    let mut xv = [_mm256_setzero_si256(); RX];
                    let mut xd = [_mm256_setzero_ps(); RX];
                    let mut fix = [_mm256_setzero_si256(); RX];
                    for j in 0..RX {
                        let x = xs.get_unchecked(j);
                        xv[j] = _mm256_loadu_si256(x.qs.as_ptr().add(b * QK8_0) as *const __m256i);
                        xd[j] = _mm256_set1_ps(*x.d.get_unchecked(b));
                        fix[j] = _mm256_zextsi128_si256(_mm_cvtsi32_si128(
                            *x.offset_fix.get_unchecked(b),
                        ));
                    }
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let blk = self.w.add((o + i) * self.row_bytes + b * BLOCK_BYTES);
                        if r == 0 {
                            // One block's worth of the weight bytes `PREFETCH_AHEAD` past this tile's current
                            // position in memory order (once per weight row, by the first input rows): the
                            // tile's rows lie back to back, so over its `blocks · RW` steps these prefetches walk
                            // its bytes in order. A prefetch past the end of `w` is harmless (it never faults).
                            _mm_prefetch::<_MM_HINT_T0>(self.w.wrapping_add(
                                o * self.row_bytes + PREFETCH_AHEAD + (b * RW + i) * BLOCK_BYTES,
                            ) as *const i8);
                        }
                        let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                        let scale = scale8(blk, self.table);
                        let prepared = block_prepare::<ISA>(wv);
                        for j in 0..RX {
                            let s =
                                _mm256_cvtepi32_ps(block_dot::<ISA>(prepared, wv, xv[j], fix[j]));
                            acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(scale, xd[j]), s, acc[j]);
                        }
                    }
                }
                for (i, acc) in acc.iter().enumerate() {
                    for (j, a) in acc.iter().enumerate() {
                        out[self.layout.at(o + i, r + j)] = hsum(*a);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(w: &[f32], k: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let wq = QuantizedRows::new(w, k).unwrap();
        for q in wq.rows() {
            for (b, d) in q.d.iter().enumerate() {
                out.extend_from_slice(&half::f16::from_f32(*d).to_bits().to_le_bytes());
                out.extend(q.qs[b * QK8_0..(b + 1) * QK8_0].iter().map(|&v| v as u8));
            }
        }
        out
    }

    /// `n × k` weights spread over the int8 range (`[-127, 127] / div`), packed as Q8_0.
    fn spread_weights(n: usize, k: usize, div: f32) -> Vec<u8> {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 255) as f32 - 127.0) / div)
            .collect();
        pack(&w, k)
    }

    /// `matmul` (the dispatched path: row split, transposition for several rows) and each SIMD path this CPU
    /// has (AVX2, and the VNNI ones with their offset trick) agree with the scalar loop, for every row count, a
    /// ragged tail and activations at both ends of the int8 range.
    #[test]
    fn simd_and_scalar_agree() {
        let (n, k) = (19, 128);
        let packed = spread_weights(n, k, 13.0);
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
        // From 16 rows `matmul` splits the input rows (or runs the panel kernel: 19 weight rows make a full and
        // a partial panel; 20 and 37 rows end in tiles of 4 and 5).
        for m in [1, 2, 3, 4, 5, 20, 37] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| match i % 5 {
                    0 => -3.0,
                    1 => 3.0,
                    _ => ((i * 104729 % 97) as f32 - 48.0) / 17.0,
                })
                .collect();
            let xq = QuantizedRows::new(&x, k).unwrap();
            let rows = xq.rows();
            let mut scalar = vec![0f32; n * m];
            dot_rows_scalar(&packed, n, k, &rows, &mut scalar, OutLayout::by_output(m));
            let mut y = vec![0f32; m * n];
            matmul(&packed, n, k, &x, m, &mut y).unwrap();
            for r in 0..m {
                for o in 0..n {
                    let (a, b) = (y[r * n + o], scalar[o * m + r]);
                    assert!(close(a, b), "matmul m={m} r={r} o={o}: {a} vs {b}");
                }
            }
            #[cfg(target_arch = "x86_64")]
            for (isa, out) in x86::dot_rows_each_isa(&packed, n, k, &rows) {
                for (i, (&a, &b)) in out.iter().zip(&scalar).enumerate() {
                    assert!(close(a, b), "{isa} m={m} slot {i}: {a} vs {b}");
                }
            }
        }
    }

    /// The many-row tiling (tiles of several weight and input rows, edges included: 19 weight rows, 2, 3 and 5
    /// input rows) gives each product bit for bit what the one-row tiling (8 × 1, then 1 × 1) gives it, on every
    /// ISA path.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tiles_match_single_rows_bit_for_bit() {
        let (n, k) = (19, 96);
        let packed = spread_weights(n, k, 11.0);
        for m in [2, 3, 5] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 104729 % 97) as f32 - 48.0) / 7.0)
                .collect();
            let xq = QuantizedRows::new(&x, k).unwrap();
            let rows = xq.rows();
            let many = x86::dot_rows_each_isa(&packed, n, k, &rows);
            assert!(!many.is_empty() || !x86::usable());
            for r in 0..m {
                let single = x86::dot_rows_each_isa(&packed, n, k, &rows[r..r + 1]);
                for ((isa, all), (_, one)) in many.iter().zip(&single) {
                    for o in 0..n {
                        assert_eq!(
                            all[o * m + r].to_bits(),
                            one[o].to_bits(),
                            "{isa} m={m} row {r} output {o}"
                        );
                    }
                }
            }
        }
    }

    /// Split across threads (weights over `PARALLEL_MIN_WEIGHTS`, in a pool of three), one or several input
    /// rows, and several products split as one: every output equals the unsplit kernel's bit for bit (each
    /// weight row is computed whole by one thread), including products whose row counts are no multiple of 8.
    #[test]
    fn split_products_equal_the_unsplit_kernel() {
        let k = 128;
        let sizes = [301, 5, 230];
        let weights: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(p, &n)| {
                let w: Vec<f32> = (0..n * k)
                    .map(|i| (((i + p) * 7919 % 255) as f32 - 127.0) / 13.0)
                    .collect();
                pack(&w, k)
            })
            .collect();
        assert!(sizes.iter().sum::<usize>() * k >= PARALLEL_MIN_WEIGHTS);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for m in [1, 3] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 31 % 23) as f32 - 11.0) / 7.0)
                .collect();
            let xq = QuantizedRows::new(&x, k).unwrap();
            let rows = xq.rows();
            let alone: Vec<Vec<f32>> = weights
                .iter()
                .zip(sizes)
                .map(|(w, n)| {
                    let mut out = vec![0f32; n * m];
                    dot_rows(w, n, k, &rows, &mut out, OutLayout::by_output(m));
                    out
                })
                .collect();
            let mut outs: Vec<Vec<f32>> = sizes.iter().map(|n| vec![f32::NAN; n * m]).collect();
            pool.install(|| {
                let mut products: Vec<(&[u8], &mut [f32])> = weights
                    .iter()
                    .zip(outs.iter_mut())
                    .map(|(w, o)| (&w[..], &mut o[..]))
                    .collect();
                dot_rows_split(k, &rows, &mut products);
            });
            for (p, (a, b)) in outs.iter().zip(&alone).enumerate() {
                let same = a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "m={m}, product {p}");
            }
        }
    }

    /// The vectorizable rounding equals `f32::round` at and around every half step in the int8 range, and on
    /// the edge values.
    #[test]
    fn round_half_away_is_f32_round() {
        let mut xs = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            1e-30,
            8388609.0,
        ];
        for i in -300..=300 {
            let h = i as f32 * 0.5;
            xs.extend([h, h.next_up(), h.next_down(), h + 0.25, h - 0.1]);
        }
        for x in xs {
            assert_eq!(round_half_away(x).to_bits(), x.round().to_bits(), "{x}");
        }
        assert!(round_half_away(f32::NAN).is_nan());
    }

    /// The AVX2 quantization equals the generic loop bit for bit: halves, both ends of the range, an all-zero
    /// block, NaN and infinities.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_quantization_is_the_generic_one() {
        if !x86::usable() {
            return;
        }
        let mut x: Vec<f32> = (0..32 * 40)
            .map(|i| ((i * 7919 % 509) as f32 - 254.0) / 2.0 * (1.0 + (i / 32) as f32 / 7.0))
            .collect();
        x[32..64].fill(0.0);
        x[70] = f32::NAN;
        x[100] = f32::INFINITY;
        x[130] = f32::NEG_INFINITY;
        x[160] = -1e-40;
        let quantized = |simd: bool| {
            let blocks = x.len() / QK8_0;
            let (mut d, mut qs, mut fix) =
                (vec![0f32; blocks], vec![0i8; x.len()], vec![0i32; blocks]);
            if simd {
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                unsafe { x86::quantize_row_into(&x, &mut d, &mut qs, &mut fix) };
            } else {
                quantize_row_generic(&x, &mut d, &mut qs, &mut fix);
            }
            (d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), qs, fix)
        };
        assert_eq!(quantized(true), quantized(false));
    }

    /// The requantized transpose holds every weight within half a step of its new block's scale (plus the
    /// f16 rounding of that scale: up to 127 steps × 2⁻¹¹), and
    /// multiplying by it gives `dy · W` within the rounding of both quantizations.
    #[test]
    fn transpose_requantized_is_the_transpose() {
        let (n, k) = (64, 96);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 509) as f32 - 254.0) / 97.0)
            .collect();
        let packed = pack(&w, k);
        let mut dense = vec![0f32; n * k];
        dequantize(&packed, k, &mut dense).unwrap();
        let t = transpose_requantized(&packed, n, k).unwrap();
        let mut back = vec![0f32; k * n];
        dequantize(&t, n, &mut back).unwrap();
        for c in 0..k {
            for ob in 0..n / QK8_0 {
                let col: Vec<f32> = (ob * QK8_0..(ob + 1) * QK8_0)
                    .map(|o| dense[o * k + c])
                    .collect();
                let step = col.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                for (j, v) in col.iter().enumerate() {
                    let got = back[c * n + ob * QK8_0 + j];
                    assert!(
                        (got - v).abs() <= 0.57 * step,
                        "w[{}][{c}]: {got} vs {v}, step {step}",
                        ob * QK8_0 + j
                    );
                }
            }
        }
        let m = 17;
        let dy: Vec<f32> = (0..m * n)
            .map(|i| ((i * 31 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let mut dx = vec![0f32; m * k];
        matmul(&t, k, n, &dy, m, &mut dx).unwrap();
        for r in 0..m {
            for c in 0..k {
                let want: f32 = (0..n).map(|o| dy[r * n + o] * dense[o * k + c]).sum();
                let norm: f32 = (0..n)
                    .map(|o| (dy[r * n + o] * dense[o * k + c]).abs())
                    .sum();
                assert!((dx[r * k + c] - want).abs() <= 0.02 * norm, "dx[{r}][{c}]");
            }
        }
        assert!(transpose_requantized(&packed[..BLOCK_BYTES * 3], 1, k).is_err());
    }

    /// The parallel expansion gives candle's dequantized values bit for bit.
    #[test]
    fn dequantize_is_candles() {
        use candle_core::quantized::{GgmlDType, QTensor};
        use candle_core::{Device, Tensor};
        let (n, k) = (70, 96);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 509) as f32 - 254.0) / 97.0)
            .collect();
        let t = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
        let want: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mut got = vec![f32::NAN; n * k];
        dequantize(&q.data().unwrap(), k, &mut got).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        assert!(dequantize(&q.data().unwrap(), k, &mut got[..k]).is_err());
    }

    #[test]
    fn bad_sizes_are_errors() {
        let mut y = vec![0f32; 2];
        assert!(matmul(&[0u8; 34], 1, 32, &[0f32; 32], 1, &mut y).is_err());
        assert!(matmul(&[0u8; 34], 1, 30, &[0f32; 30], 1, &mut y[..1]).is_err());
    }
}
