//! Q8_0 matrix products for serving (decode and prefill against packed weights), faster than candle's.
//!
//! Decode is bound by reading the weights: every token streams all of them once, and candle's Q8_0 path
//! reaches only part of the read bandwidth. This kernel reads the packed GGUF blocks in place (no copy; 34
//! bytes per 32 weights), converts scales through a table, does the int8 dot with AVX2 (`maddubs` on |w| and
//! sign(x, w), the llama.cpp formulation) or, where the CPU has AVX-VNNI or AVX-512 VNNI, `vpdpbusd` on
//! `w + 128` with the offset undone per block, keeps eight independent accumulator chains (eight weight rows
//! at once, each activation block loaded once for all eight), prefetches ahead in software (the interleaved
//! short row streams do not train the hardware prefetcher), and splits rows across threads
//! (`model::spin_pool`, or the current rayon pool) only when the work is large enough to pay for it. The
//! activation is quantized to Q8_0 exactly as candle and llama.cpp do (d = amax/127, round to nearest), so
//! results match theirs up to the order of float additions. Other CPUs get a portable scalar loop.
//!
//! Where the CPU has AVX-512 VNNI a model keeps its Q8_0 weights repacked into [`panels`] instead, whose
//! layout the memory system streams faster; the GGUF-layout kernels here then serve training's
//! transposed weights, and models loaded with `HEARTH_Q8_LAYOUT=gguf`.

use crate::model::spin_pool::SharedSlice;

pub mod kquant;
pub mod panels;
pub mod q8k;
#[cfg(test)]
mod test_support;
pub use panels::{PanelWeights, matmul_panels, matvec_panels_many, panels_usable};

/// A q8_0 kernel called with sizes that do not fit together; the message names the operation and the sizes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Q8Error(pub String);

/// Weights per Q8_0 block.
pub const QK8_0: usize = 32;
/// Bytes per Q8_0 block: an f16 scale and 32 int8.
pub const BLOCK_BYTES: usize = 34;

/// Below this many weights in a split, one thread does it all: a rayon hand-off costs microseconds. Decode
/// keeps the pool's other threads spinning (`generate`), so a hand-off is cheap there and each core's own
/// read bandwidth is the limit: even a small model's square projections gain from being split.
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
        let amax = abs_max(xb);
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

/// max |v| over the bits (ordered like the values for non-negative floats) so that the loop vectorizes, which
/// `f32::max` does not; a NaN counts as 0, as `f32::max` skips it.
#[inline(always)]
fn abs_max(x: &[f32]) -> f32 {
    f32::from_bits(
        x.iter()
            .map(|v| match v.to_bits() & 0x7fff_ffff {
                b if b > 0x7f80_0000 => 0,
                b => b,
            })
            .max()
            .unwrap_or(0),
    )
}

/// `f32::round` (halves away from zero) from `trunc`, which compiles to one vector instruction where `round`
/// is a libm call per value, on every decode step's path. Exact for every finite `x`:
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
/// All rows share three flat buffers: three vectors per row would be allocated and freed hundreds of times
/// per product, dozens of times a training step.
pub struct QuantizedRows {
    d: Vec<f32>,
    qs: Vec<i8>,
    offset_fix: Vec<i32>,
    k: usize,
}

impl QuantizedRows {
    /// Quantizes `x` (`m × k`, `m = x.len() / k`). `k` must be a non-zero multiple of 32.
    pub fn new(x: &[f32], k: usize) -> Result<Self, Q8Error> {
        if k == 0 || !k.is_multiple_of(QK8_0) || !x.len().is_multiple_of(k) {
            return Err(Q8Error(format!(
                "q8_0 activations: k = {k} is not a non-zero multiple of {QK8_0} dividing {} values",
                x.len()
            )));
        }
        let (m, blocks) = (x.len() / k, k / QK8_0);
        let mut d = vec![0f32; m * blocks];
        let mut qs = vec![0i8; m * k];
        let mut offset_fix = vec![0i32; m * blocks];
        // Prefill and training quantize hundreds of rows per product: split them across the current rayon
        // pool, rather than leave the other cores waiting.
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
) -> Result<(), Q8Error> {
    if x.len() != m * k {
        return Err(Q8Error(format!(
            "q8_0 matmul: x has {} values, not {m}x{k}",
            x.len()
        )));
    }
    matmul_quantized(w, n_out, &QuantizedRows::new(x, k)?, y)
}

/// Expands Q8_0 rows of `k` weights (raw GGUF bytes) into `out` (`[rows, k]` f32), rows split across the
/// current rayon pool: a backward pass that cannot take the int8 route ([`transpose_requantized`] needs output
/// rows in multiples of 32) needs the dense weight for a moment per product, and candle's loop is
/// single-threaded and scalar, too slow for a large head every step.
pub fn dequantize(w: &[u8], k: usize, out: &mut [f32]) -> Result<(), Q8Error> {
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    if k == 0
        || !k.is_multiple_of(QK8_0)
        || out.len() / k * row_bytes != w.len()
        || !out.len().is_multiple_of(k)
    {
        return Err(Q8Error(format!(
            "q8_0 dequantize: {} bytes do not make rows of {k} weights for {} values",
            w.len(),
            out.len()
        )));
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
pub fn transpose_requantized(w: &[u8], n_out: usize, k: usize) -> Result<Vec<u8>, Q8Error> {
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    if k == 0
        || !k.is_multiple_of(QK8_0)
        || n_out == 0
        || !n_out.is_multiple_of(QK8_0)
        || w.len() != n_out * row_bytes
    {
        return Err(Q8Error(format!(
            "q8_0 transpose: {} bytes are not {n_out} rows of {k} weights, or {n_out} rows are no multiple of 32",
            w.len()
        )));
    }
    Ok(transpose_blocks(n_out, k, |b, ob, tile, scales| {
        for (j, d) in scales.iter_mut().enumerate() {
            let blk = &w[(ob * QK8_0 + j) * row_bytes + b * BLOCK_BYTES..][..BLOCK_BYTES];
            *d = block_scale(blk);
            for (c, &q) in blk[2..].iter().enumerate() {
                tile[c][j] = q as i8;
            }
        }
    }))
}

/// One 32 × 32 tile of a Q8_0 weight for [`transpose_blocks`]: `load(b, ob, tile, scales)` fills `tile[c][j]`
/// with the int8 weight of row `32·ob + j`, column `32·b + c`, and `scales[j]` with that row's block scale.
pub(crate) trait TileLoader:
    Fn(usize, usize, &mut [[i8; QK8_0]; QK8_0], &mut [f32; QK8_0]) + Sync
{
}
impl<F: Fn(usize, usize, &mut [[i8; QK8_0]; QK8_0], &mut [f32; QK8_0]) + Sync> TileLoader for F {}

/// [`transpose_requantized`] of a weight `[n_out, k]` (checked sizes) whose tiles `load` gives, in parallel
/// over blocks of 32 input columns (the 32 rows of the transpose each writes are contiguous).
pub(crate) fn transpose_blocks(n_out: usize, k: usize, load: impl TileLoader) -> Vec<u8> {
    let out_row_bytes = n_out / QK8_0 * BLOCK_BYTES;
    let mut out = vec![0u8; k * out_row_bytes];
    use rayon::prelude::*;
    out.par_chunks_mut(QK8_0 * out_row_bytes)
        .enumerate()
        .for_each(|(b, dst)| {
            #[cfg(target_arch = "x86_64")]
            if x86::usable() {
                // SAFETY: the CPU has AVX2 and FMA.
                unsafe { x86::transpose_columns(n_out, b, dst, &load) };
                return;
            }
            transpose_columns(n_out, b, dst, &load);
        });
    out
}

/// Rows `32·b .. 32·b + 32` of [`transpose_requantized`]'s output (`dst`), from input column block `b`, in
/// 32 × 32 tiles: the tile's int8 values transposed as bytes (`load`), each tile row scaled by the 32 input
/// rows' scales, and the 32 rows quantized as one row of 32 blocks by [`quantize_row_into`] (whose x86 path
/// is written out eight lanes wide, where this loop's maximum and rounding stayed scalar).
#[inline(always)]
fn transpose_columns(n_out: usize, b: usize, dst: &mut [u8], load: &impl TileLoader) {
    let out_row_bytes = n_out / QK8_0 * BLOCK_BYTES;
    let mut tile = [[0i8; QK8_0]; QK8_0];
    let mut scales = [0f32; QK8_0];
    let mut vals = [0f32; QK8_0 * QK8_0];
    let (mut d, mut qs, mut fix) = ([0f32; QK8_0], [0i8; QK8_0 * QK8_0], [0i32; QK8_0]);
    for ob in 0..n_out / QK8_0 {
        load(b, ob, &mut tile, &mut scales);
        for (row, qs) in vals.chunks_exact_mut(QK8_0).zip(&tile) {
            for ((v, &q), &d) in row.iter_mut().zip(qs).zip(&scales) {
                *v = d * q as f32;
            }
        }
        quantize_row_into(&vals, &mut d, &mut qs, &mut fix);
        for (c, (&d, q)) in d.iter().zip(qs.chunks_exact(QK8_0)).enumerate() {
            write_block(
                &mut dst[c * out_row_bytes + ob * BLOCK_BYTES..][..BLOCK_BYTES],
                d,
                q,
            );
        }
    }
}

/// A dense f32 weight `[n_out, k]` as Q8_0 `[k, n_out]` (blocks along `n_out`, a multiple of 32): the
/// transpose a backward pass multiplies by (see [`transpose_requantized`]) for weights whose type has no
/// transpose of its own, quantized as activations are (d = amax/127, round to nearest, d stored as f16).
pub fn transpose_quantized(w: &[f32], n_out: usize, k: usize) -> Result<Vec<u8>, Q8Error> {
    if k == 0 || n_out == 0 || !n_out.is_multiple_of(QK8_0) || w.len() != n_out * k {
        return Err(Q8Error(format!(
            "q8_0 transpose: {} values are not {n_out} rows of {k}, or {n_out} rows are no multiple of 32",
            w.len()
        )));
    }
    transpose_quantized_rows(n_out, k, |o, rows| {
        rows.copy_from_slice(&w[o * k..o * k + rows.len()]);
        Ok(())
    })
}

/// Writes one Q8_0 block: scale `d` (already an f16 value, so the conversion is exact) and values `q`.
#[inline(always)]
fn write_block(blk: &mut [u8], d: f32, q: &[i8]) {
    blk[..2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
    for (o, &q) in blk[2..].iter_mut().zip(q) {
        *o = q as u8;
    }
}

/// [`transpose_quantized`] of a weight `[n_out, k]` (`n_out` a multiple of 32) whose rows `load(o, rows)`
/// writes as f32, 32 from row `o` at a time, byte for byte: for weights kept in a form other than Q8_0,
/// without a dense f32 copy of the whole weight (a 128k-token head of 2048 would take 1 GB). Parallel over
/// groups of 32 rows, each writing its block of every row of the transpose.
pub fn transpose_quantized_rows(
    n_out: usize,
    k: usize,
    load: impl Fn(usize, &mut [f32]) -> Result<(), Q8Error> + Sync,
) -> Result<Vec<u8>, Q8Error> {
    if k == 0 || n_out == 0 || !n_out.is_multiple_of(QK8_0) {
        return Err(Q8Error(format!(
            "q8_0 transpose: {n_out} rows of {k} are none, or {n_out} rows are no multiple of 32"
        )));
    }
    let out_row_bytes = n_out / QK8_0 * BLOCK_BYTES;
    let mut out = vec![0u8; k * out_row_bytes];
    let shared = SharedSlice::new(&mut out);
    use rayon::prelude::*;
    // Per group: the rows, their columns as consecutive blocks of 32, and those quantized as one row of `k`
    // blocks by `quantize_row_into` (eight lanes wide).
    let scratch = || {
        let (rows, cols) = (vec![0f32; QK8_0 * k], vec![0f32; QK8_0 * k]);
        (
            rows,
            cols,
            vec![0f32; k],
            vec![0i8; QK8_0 * k],
            vec![0i32; k],
        )
    };
    (0..n_out / QK8_0).into_par_iter().try_for_each_init(
        scratch,
        |(rows, cols, d, qs, fix), ob| {
            load(ob * QK8_0, rows)?;
            for (j, row) in rows.chunks_exact(k).enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    cols[c * QK8_0 + j] = v;
                }
            }
            quantize_row_into(cols, d, qs, fix);
            for (c, (&d, q)) in d.iter().zip(qs.chunks_exact(QK8_0)).enumerate() {
                let at = c * out_row_bytes + ob * BLOCK_BYTES;
                // SAFETY: block `ob` of each row of the transpose is written by this group of rows alone.
                write_block(unsafe { shared.part(at..at + BLOCK_BYTES) }, d, q);
            }
            Ok(())
        },
    )?;
    Ok(out)
}

/// [`matmul`] on activations already quantized.
pub fn matmul_quantized(
    w: &[u8],
    n_out: usize,
    x: &QuantizedRows,
    y: &mut [f32],
) -> Result<(), Q8Error> {
    let (k, m) = (x.k, x.len());
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    if w.len() != n_out * row_bytes || y.len() != m * n_out {
        return Err(Q8Error(format!(
            "q8_0 matmul: sizes do not agree (w {} bytes for {n_out}x{k}, y {}, m {m})",
            w.len(),
            y.len()
        )));
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
) -> Result<(), Q8Error> {
    let k = x.k;
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    if x.len() != 1 {
        return Err(Q8Error(format!(
            "q8_0 matvec: {} input rows, not one",
            x.len()
        )));
    }
    for (w, y) in products.iter() {
        if w.len() != y.len() * row_bytes {
            return Err(Q8Error(format!(
                "q8_0 matvec: sizes do not agree (w {} bytes for {}x{k})",
                w.len(),
                y.len()
            )));
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
    crate::model::spin_pool::for_each_range(n_panels, |panels| {
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
/// `[n_out, m]`), split across threads (`model::spin_pool`, or the current rayon pool) when the
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
    crate::model::spin_pool::for_each_range(total, |items| {
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
mod x86;

/// Which int8 kernels run here, for benchmark output: `avx512-vnni`, `avx-vnni` or `avx2` (`HEARTH_Q8_KERNEL=avx2`
/// forces the last), or `portable` where none of them can.
pub fn int8_kernel() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if x86::usable() {
        return x86::isa_name();
    }
    "portable"
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
        // The same bytes as a plain loop over the dequantized values, column by column.
        assert_eq!(t, transpose_by_columns(&dense, n, k));
        assert_eq!(t, transpose_quantized(&dense, n, k).unwrap());
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

    /// The quantized transpose of a dense weight holds every value within half a step of its block's scale
    /// (plus that scale's f16 rounding), at the transposed place; sizes that do not fit are errors.
    #[test]
    fn transpose_quantized_is_the_transpose() {
        let (n, k) = (64, 40);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 509) as f32 - 254.0) / 97.0)
            .collect();
        let t = transpose_quantized(&w, n, k).unwrap();
        let mut back = vec![0f32; k * n];
        dequantize(&t, n, &mut back).unwrap();
        for c in 0..k {
            for o in 0..n {
                let block = (o / QK8_0 * QK8_0..(o / QK8_0 + 1) * QK8_0).map(|j| w[j * k + c]);
                let step = block.fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                let (got, want) = (back[c * n + o], w[o * k + c]);
                assert!(
                    (got - want).abs() <= 0.57 * step,
                    "[{c}][{o}]: {got} vs {want}"
                );
            }
        }
        assert_eq!(t, transpose_by_columns(&w, n, k));
        assert!(transpose_quantized(&w[..k * 48], 48, k).is_err());
        assert!(transpose_quantized(&w[1..], n, k).is_err());
        // A loader's error comes back.
        let failing = |_: usize, _: &mut [f32]| Err(Q8Error("no rows".into()));
        assert!(transpose_quantized_rows(n, k, failing).is_err());
    }

    /// The transpose the kernels' paths must equal, byte for byte: each input column's 32-value blocks
    /// quantized one at a time by a plain scalar loop (d = max |v| / 127, values rounded at 1/d, d as f16).
    fn transpose_by_columns(w: &[f32], n_out: usize, k: usize) -> Vec<u8> {
        let out_row_bytes = n_out / QK8_0 * BLOCK_BYTES;
        let mut out = vec![0u8; k * out_row_bytes];
        for (c, dst) in out.chunks_exact_mut(out_row_bytes).enumerate() {
            for (ob, blk) in dst.chunks_exact_mut(BLOCK_BYTES).enumerate() {
                let vals: Vec<f32> = (0..QK8_0).map(|j| w[(ob * QK8_0 + j) * k + c]).collect();
                let d = vals.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
                for (q, v) in blk[2..].iter_mut().zip(&vals) {
                    *q = round_half_away(v * inv) as i8 as u8;
                }
            }
        }
        out
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
