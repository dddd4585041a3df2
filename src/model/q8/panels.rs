//! Q8_0 weights repacked once at load so that a product reads each weight as one sequential, aligned stream.
//!
//! In the GGUF layout a row is 34-byte blocks (an f16 scale, 32 int8), and the decode kernel reads eight rows
//! at once, interleaved at the row stride: eight short streams with unaligned loads. Streaming weights from
//! memory, that kernel waits on memory, well below what a plain read of the same buffers reaches: the hardware
//! prefetchers follow one forward stream and lose it on interleaved rows, and even on a panel layout that
//! keeps the scales apart from the quants. Here a panel of 16 rows stores, per pair of blocks, the quants (for
//! each group of four consecutive weights the 16 rows' bytes side by side: one aligned 64-byte line, offset by
//! 128 for `vpdpbusd`) and then the pair's 16 × 2 f16 scales: 1,088 bytes, 17 lines, so a panel is read
//! strictly front to back and every load is aligned. [`matvec_panels_many`] is faster on cached weights too:
//! each `vpdpbusd` gives 16 rows' partial sums in its lanes (no reduction across lanes), and one conversion
//! gives 16 scales (no table lookup). No software prefetching: the hardware prefetchers follow this layout on
//! their own, and prefetching on top of it only slows the walk. Same bytes per weight as GGUF (1 + 1/16),
//! except a padding block for an odd block count; the GGUF bytes are not kept ([`PanelWeights::to_gguf`]
//! rebuilds them exactly for what needs them, such as training's transposes).
//!
//! Q4_K and Q4_0 weights get panels of the same shape, each its own layout inside ([`q4k`], [`q4_0`]), and
//! the same activations: one quantized input serves every kind of weight. Q6_K has none: unpacking its six-bit
//! values for 16 rows costs decode more than [`super::q8k`]'s kernel spends on them (`docs/kernels.md`).
//!
//! The kernels need AVX-512 F, BW and VNNI ([`panels_usable`]); other CPUs keep the GGUF layout and its
//! kernels. A portable loop computes the same sums everywhere, for tests.

/// `$tile::<R>(args)` for `R`, the number of rows of `$rows` (1 to [`TILE_ROWS`]): a four-bit panel kernel's
/// entry, with a loop compiled for each row count.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_for_rows {
    ($tile:ident, $rows:expr, $($arg:expr),*) => {
        match $rows.len() {
            1 => $tile::<1>($($arg),*),
            2 => $tile::<2>($($arg),*),
            3 => $tile::<3>($($arg),*),
            4 => $tile::<4>($($arg),*),
            5 => $tile::<5>($($arg),*),
            6 => $tile::<6>($($arg),*),
            7 => $tile::<7>($($arg),*),
            8 => $tile::<8>($($arg),*),
            n => debug_assert!(n == 0),
        }
    };
}

mod q4_0;
mod q4k;

use candle_core::quantized::GgmlDType;

use super::{PARALLEL_MIN_WEIGHTS, Q8Error, QK8_0, QuantRow, QuantizedRows, block_scale};
use crate::model::spin_pool::SharedSlice;

/// Weight rows per panel: one int32 lane each in a 512-bit register.
pub const PANEL_ROWS: usize = 16;
/// One group of four consecutive weights of a panel's rows: one 64-byte line.
const GROUP_BYTES: usize = 4 * PANEL_ROWS;
/// A block's quants in a panel (eight groups).
const BLOCK_QUANT_BYTES: usize = QK8_0 * PANEL_ROWS;
/// A block's scales in a panel.
const BLOCK_SCALE_BYTES: usize = 2 * PANEL_ROWS;
/// Two blocks' quants, then their scales: 17 whole lines.
const PAIR_BYTES: usize = 2 * (BLOCK_QUANT_BYTES + BLOCK_SCALE_BYTES);

/// Where block `b`'s quants start in a panel.
#[inline(always)]
fn quant_offset(b: usize) -> usize {
    b / 2 * PAIR_BYTES + b % 2 * BLOCK_QUANT_BYTES
}

/// Where block `b`'s 16 scales start in a panel.
#[inline(always)]
fn scale_offset(b: usize) -> usize {
    b / 2 * PAIR_BYTES + 2 * BLOCK_QUANT_BYTES + b % 2 * BLOCK_SCALE_BYTES
}

/// A Q8_0, Q4_K or Q4_0 weight `[n_out, k]` in panels of [`PANEL_ROWS`] rows (see the module doc). A last partial
/// panel is padded with zero weights.
pub struct PanelWeights {
    lines: Vec<CacheLine>,
    n_out: usize,
    k: usize,
    dtype: GgmlDType,
}

/// What the panels are stored in: 64-byte aligned, so every quant load is an aligned line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine([u8; 64]);

impl std::fmt::Debug for PanelWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PanelWeights({:?} {}x{})",
            self.dtype, self.n_out, self.k
        )
    }
}

impl PanelWeights {
    /// Whether weights of `dtype` have panels (Q8_0, Q4_K and Q4_0).
    pub fn supports(dtype: GgmlDType) -> bool {
        matches!(dtype, GgmlDType::Q8_0 | GgmlDType::Q4K | GgmlDType::Q4_0)
    }

    /// Repacks a row-major weight `[n_out, k]` of a type [`Self::supports`] given as its raw GGUF bytes.
    pub fn from_gguf(dtype: GgmlDType, w: &[u8], n_out: usize, k: usize) -> Result<Self, Q8Error> {
        match dtype {
            GgmlDType::Q8_0 => Self::from_q8_0(w, n_out, k),
            GgmlDType::Q4K | GgmlDType::Q4_0 => Self::from_four_bit(dtype, w, n_out, k),
            _ => Err(Q8Error(format!("panels: no layout for {dtype:?}"))),
        }
    }

    /// Repacks a row-major Q4_K or Q4_0 weight `[n_out, k]` given as its raw GGUF bytes.
    fn from_four_bit(dtype: GgmlDType, w: &[u8], n_out: usize, k: usize) -> Result<Self, Q8Error> {
        let sizes = FourBit::of(dtype);
        let row_bytes = k / sizes.block_weights * sizes.block_bytes;
        if k == 0
            || !k.is_multiple_of(sizes.block_weights)
            || n_out == 0
            || w.len() != n_out * row_bytes
        {
            return Err(Q8Error(format!(
                "{dtype:?} panels: {} bytes are not {n_out} rows of {k} weights",
                w.len()
            )));
        }
        // Padding rows and blocks stay all zero: zero scales, zero values.
        let lines = n_out.div_ceil(PANEL_ROWS) * sizes.panel_bytes(k) / 64;
        let mut panels = Self {
            lines: vec![CacheLine([0; 64]); lines],
            n_out,
            k,
            dtype,
        };
        let panel_bytes = panels.panel_bytes();
        use rayon::prelude::*;
        panels
            .lines
            .par_chunks_mut(panel_bytes / 64)
            .enumerate()
            .for_each(|(p, panel)| {
                let panel = as_bytes_mut(panel);
                for l in 0..PANEL_ROWS.min(n_out - p * PANEL_ROWS) {
                    let row = &w[(p * PANEL_ROWS + l) * row_bytes..][..row_bytes];
                    match dtype {
                        GgmlDType::Q4K => q4k::pack_row(panel, l, row),
                        _ => q4_0::pack_row(panel, l, row),
                    }
                }
            });
        Ok(panels)
    }

    /// Repacks a row-major Q8_0 weight `[n_out, k]` given as its raw GGUF bytes.
    pub fn from_q8_0(w: &[u8], n_out: usize, k: usize) -> Result<Self, Q8Error> {
        let row_bytes = k / QK8_0 * super::BLOCK_BYTES;
        if k == 0 || !k.is_multiple_of(QK8_0) || n_out == 0 || w.len() != n_out * row_bytes {
            return Err(Q8Error(format!(
                "q8_0 panels: {} bytes are not {n_out} rows of {k} weights",
                w.len()
            )));
        }
        let panel_bytes = (k / QK8_0).div_ceil(2) * PAIR_BYTES;
        let panels = n_out.div_ceil(PANEL_ROWS);
        // 0x80 is a zero weight (offset by 128); the scales are all written below, padding rows' as zero.
        let mut lines = vec![CacheLine([0x80; 64]); panels * panel_bytes / 64];
        use rayon::prelude::*;
        lines
            .par_chunks_mut(panel_bytes / 64)
            .enumerate()
            .for_each(|(p, panel)| {
                let panel = as_bytes_mut(panel);
                for b in 0..k / QK8_0 {
                    panel[scale_offset(b)..][..BLOCK_SCALE_BYTES].fill(0);
                }
                for l in 0..PANEL_ROWS.min(n_out - p * PANEL_ROWS) {
                    let row = &w[(p * PANEL_ROWS + l) * row_bytes..][..row_bytes];
                    for (b, blk) in row.chunks_exact(super::BLOCK_BYTES).enumerate() {
                        panel[scale_offset(b) + 2 * l..][..2].copy_from_slice(&blk[..2]);
                        for (i, &q) in blk[2..].iter().enumerate() {
                            panel[quant_at(b, l, i)] = q ^ 0x80;
                        }
                    }
                }
            });
        Ok(Self {
            lines,
            n_out,
            k,
            dtype: GgmlDType::Q8_0,
        })
    }

    /// The GGUF type of the weights.
    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    /// The GGUF bytes this was made from, exactly.
    pub fn to_gguf(&self) -> Vec<u8> {
        let row_bytes = match self.dtype {
            GgmlDType::Q8_0 => self.k / QK8_0 * super::BLOCK_BYTES,
            t => {
                let sizes = FourBit::of(t);
                self.k / sizes.block_weights * sizes.block_bytes
            }
        };
        let mut out = vec![0u8; self.n_out * row_bytes];
        use rayon::prelude::*;
        out.par_chunks_mut(row_bytes)
            .enumerate()
            .for_each(|(o, row)| {
                let (panel, l) = (self.panel(o / PANEL_ROWS), o % PANEL_ROWS);
                match self.dtype {
                    GgmlDType::Q4K => return q4k::unpack_row(panel, l, row),
                    GgmlDType::Q4_0 => return q4_0::unpack_row(panel, l, row),
                    _ => {}
                }
                for (b, blk) in row.chunks_exact_mut(super::BLOCK_BYTES).enumerate() {
                    blk[..2].copy_from_slice(&panel[scale_offset(b) + 2 * l..][..2]);
                    for (i, q) in blk[2..].iter_mut().enumerate() {
                        *q = panel[quant_at(b, l, i)] ^ 0x80;
                    }
                }
            });
        out
    }

    /// The Q8_0 transpose `[k, rows]` of output rows `o0 .. o0 + rows` (both multiples of 32), the same bytes
    /// as those rows of the whole one: [`super::transpose_requantized`] for Q8_0, its tiles read from the panels
    /// themselves rather than from a GGUF-layout copy; [`super::transpose_quantized_rows`] of the dequantized
    /// rows for the four-bit types.
    pub fn transpose_rows(&self, o0: usize, rows: usize) -> Result<Vec<u8>, Q8Error> {
        const { assert!(QK8_0 == 2 * PANEL_ROWS) };
        if !o0.is_multiple_of(QK8_0)
            || !rows.is_multiple_of(QK8_0)
            || rows == 0
            || o0 + rows > self.n_out
        {
            return Err(Q8Error(format!(
                "q8_0 transpose: rows {o0}..{} of {} are no range of whole 32-row blocks",
                o0 + rows,
                self.n_out
            )));
        }
        if self.dtype != GgmlDType::Q8_0 {
            return super::transpose_quantized_rows(rows, self.k, |o, out| {
                for (i, row) in out.chunks_exact_mut(self.k).enumerate() {
                    self.dequantize_row(o0 + o + i, row)?;
                }
                Ok(())
            });
        }
        let ob0 = o0 / QK8_0;
        Ok(super::transpose_blocks(
            rows,
            self.k,
            |b, ob, tile, scales| {
                // Rows 32·ob .. 32·ob + 32 are two panels; in each, weights 4g .. 4g + 4 of its rows fill line g.
                for side in 0..2 {
                    let panel = self.panel(2 * (ob0 + ob) + side);
                    let sc = &panel[scale_offset(b)..][..BLOCK_SCALE_BYTES];
                    let qs = &panel[quant_offset(b)..][..BLOCK_QUANT_BYTES];
                    for l in 0..PANEL_ROWS {
                        let j = side * PANEL_ROWS + l;
                        scales[j] =
                            half::f16::from_bits(u16::from_le_bytes([sc[2 * l], sc[2 * l + 1]]))
                                .to_f32();
                        for (g, line) in qs.chunks_exact(GROUP_BYTES).enumerate() {
                            for r in 0..4 {
                                tile[4 * g + r][j] = (line[4 * l + r] ^ 0x80) as i8;
                            }
                        }
                    }
                }
            },
        ))
    }

    /// Row `o` as f32 into `out` (`k` values): an embedding lookup.
    pub fn dequantize_row(&self, o: usize, out: &mut [f32]) -> Result<(), Q8Error> {
        if o >= self.n_out || out.len() != self.k {
            return Err(Q8Error(format!(
                "q8_0 panels: row {o} of {} into {} values (rows have {})",
                self.n_out,
                out.len(),
                self.k
            )));
        }
        let (panel, l) = (self.panel(o / PANEL_ROWS), o % PANEL_ROWS);
        match self.dtype {
            GgmlDType::Q4K => q4k::dequantize_row(panel, l, out),
            GgmlDType::Q4_0 => q4_0::dequantize_row(panel, l, out),
            _ => {
                for (b, vals) in out.chunks_exact_mut(QK8_0).enumerate() {
                    let d = block_scale(&panel[scale_offset(b) + 2 * l..]);
                    for (i, v) in vals.iter_mut().enumerate() {
                        *v = d * (panel[quant_at(b, l, i)] ^ 0x80) as i8 as f32;
                    }
                }
            }
        }
        Ok(())
    }

    /// Every row as f32, `[n_out, k]`, rows split across the current rayon pool.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n_out * self.k];
        use rayon::prelude::*;
        out.par_chunks_mut(self.k).enumerate().for_each(|(o, row)| {
            // Cannot fail: `o < n_out` and the row has `k` values.
            let _ = self.dequantize_row(o, row);
        });
        out
    }

    pub fn n_out(&self) -> usize {
        self.n_out
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// The bytes held: what one product streams.
    pub fn bytes(&self) -> &[u8] {
        as_bytes(&self.lines)
    }

    /// Bytes per panel.
    fn panel_bytes(&self) -> usize {
        match self.dtype {
            GgmlDType::Q8_0 => (self.k / QK8_0).div_ceil(2) * PAIR_BYTES,
            t => FourBit::of(t).panel_bytes(self.k),
        }
    }

    /// Panel `p`'s bytes.
    fn panel(&self, p: usize) -> &[u8] {
        let n = self.panel_bytes();
        &self.bytes()[p * n..(p + 1) * n]
    }
}

/// The sizes of a four-bit type's GGUF blocks and of its panels' units.
struct FourBit {
    block_weights: usize,
    block_bytes: usize,
    unit_weights: usize,
    unit_bytes: usize,
}

impl FourBit {
    /// Q4_K's sizes, or (for any other type) Q4_0's.
    fn of(dtype: GgmlDType) -> Self {
        match dtype {
            GgmlDType::Q4K => FourBit {
                block_weights: q4k::QK_K,
                block_bytes: q4k::BLOCK_BYTES,
                unit_weights: q4k::QK_K,
                unit_bytes: q4k::UNIT_BYTES,
            },
            _ => FourBit {
                block_weights: QK8_0,
                block_bytes: q4_0::BLOCK_BYTES,
                unit_weights: 2 * QK8_0,
                unit_bytes: q4_0::UNIT_BYTES,
            },
        }
    }

    /// Bytes of one panel of rows of `k` weights.
    fn panel_bytes(&self, k: usize) -> usize {
        k.div_ceil(self.unit_weights) * self.unit_bytes
    }
}

/// Where weight `i` of block `b` of a panel's row `l` lies.
#[inline(always)]
fn quant_at(b: usize, l: usize, i: usize) -> usize {
    quant_offset(b) + i / 4 * GROUP_BYTES + 4 * l + i % 4
}

fn as_bytes(lines: &[CacheLine]) -> &[u8] {
    // SAFETY: `CacheLine` is 64 plain bytes with no padding.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast::<u8>(), lines.len() * 64) }
}

fn as_bytes_mut(lines: &mut [CacheLine]) -> &mut [u8] {
    // SAFETY: as for `as_bytes`; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64) }
}

/// Whether the panel kernels can run here: AVX-512 F, BW and VNNI (and `HEARTH_Q8_KERNEL` not forcing AVX2).
/// Elsewhere a model keeps the GGUF layout, whose kernels are the fast ones there.
pub fn panels_usable() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::x86::gemm_usable()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `y = W·x` for each `(W, y)` pair and one input row: all products' panels dealt across threads as one split
/// (`model::spin_pool`, or the current rayon pool), as [`super::matvec_quantized_many`] does for
/// the GGUF layout.
pub fn matvec_panels_many(
    x: &QuantizedRows,
    products: &mut [(&PanelWeights, &mut [f32])],
) -> Result<(), Q8Error> {
    if x.len() != 1 {
        return Err(Q8Error(format!(
            "q8_0 matvec: {} input rows, not one",
            x.len()
        )));
    }
    for (w, y) in products.iter() {
        check(w, x, y.len())?;
    }
    let row = &x.row(0);
    let weights: usize = products.iter().map(|(w, _)| w.n_out * w.k).sum();
    let parts: Vec<(&PanelWeights, SharedSlice<f32>)> = products
        .iter_mut()
        .map(|(w, y)| (*w, SharedSlice::new(y)))
        .collect();
    let total: usize = parts
        .iter()
        .map(|(w, _)| w.n_out.div_ceil(PANEL_ROWS))
        .sum();
    let run = |panels: std::ops::Range<usize>| {
        let mut first_panel = 0;
        for (w, y) in &parts {
            let count = w.n_out.div_ceil(PANEL_ROWS);
            let (a, b) = (
                panels.start.clamp(first_panel, first_panel + count) - first_panel,
                panels.end.clamp(first_panel, first_panel + count) - first_panel,
            );
            first_panel += count;
            if a < b {
                let rows = a * PANEL_ROWS..(b * PANEL_ROWS).min(w.n_out);
                // SAFETY: `products` borrows every `y` mutably for this whole call, and panel ranges are
                // disjoint, so these rows of this product are written by this range alone.
                let out = unsafe { y.part(rows) };
                panels_one_row(w, a..b, row, out);
            }
        }
    };
    if rayon::current_num_threads() == 1 || weights < PARALLEL_MIN_WEIGHTS {
        run(0..total);
    } else {
        crate::model::spin_pool::for_each_range(total, run);
    }
    Ok(())
}

/// Panels `panels` of `w` times one input row, into `out` (their rows).
fn panels_one_row(w: &PanelWeights, panels: std::ops::Range<usize>, x: &QuantRow, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::gemm_usable() && w.dtype == GgmlDType::Q8_0 {
        let bytes = w.panel_bytes();
        // SAFETY: `gemm_usable` found AVX-512 F/BW/VNNI; the panels exist in `w`, whose rows have the `k`
        // values `x` has (checked by the caller), and `out` has a slot for each of their rows.
        unsafe { x86::panels_one_row(w.bytes()[panels.start * bytes..].as_ptr(), bytes, x, out) };
        return;
    }
    for (p, out) in panels.zip(out.chunks_mut(PANEL_ROWS)) {
        panel_rows(
            w.dtype,
            w.panel(p),
            std::slice::from_ref(x),
            out.as_mut_ptr(),
            0,
            out.len(),
        );
    }
}

/// `y[r][o] = Σ_k x[r][k] · W[o][k]` (`y` is `[m, n_out]`) for any number of input rows: panels split across
/// threads, and each panel, while in cache, meets every input row in tiles of up to eight rows.
pub fn matmul_panels(w: &PanelWeights, x: &QuantizedRows, y: &mut [f32]) -> Result<(), Q8Error> {
    check(w, x, y.len() / x.len().max(1))?;
    let m = x.len();
    if y.len() != m * w.n_out {
        return Err(Q8Error(format!(
            "q8_0 matmul: y has {} values, not {m}x{}",
            y.len(),
            w.n_out
        )));
    }
    if m == 1 {
        return matvec_panels_many(x, &mut [(w, y)]);
    }
    let n_out = w.n_out;
    let y = SharedSlice::new(y);
    let rows = x.rows();
    crate::model::spin_pool::for_each_range(n_out.div_ceil(PANEL_ROWS), |panels| {
        for p in panels {
            let cols = PANEL_ROWS.min(n_out - p * PANEL_ROWS);
            for (t, tile) in rows.chunks(TILE_ROWS).enumerate() {
                // The tile's rows start at row `t · TILE_ROWS` of `y`; its columns p·16 .. p·16 + cols are this
                // panel's, which no other range writes (panel ranges are disjoint).
                let at = y
                    .as_ptr()
                    .wrapping_add(t * TILE_ROWS * n_out + p * PANEL_ROWS);
                panel_rows(w.dtype, w.panel(p), tile, at, n_out, cols);
            }
        }
    });
    Ok(())
}

fn check(w: &PanelWeights, x: &QuantizedRows, n_out: usize) -> Result<(), Q8Error> {
    if w.k != x.k || w.n_out != n_out {
        return Err(Q8Error(format!(
            "q8_0 panels: sizes do not agree (w {}x{}, x rows of {}, {n_out} outputs)",
            w.n_out, w.k, x.k
        )));
    }
    Ok(())
}

/// Input rows per tile of [`matmul_panels`]: eight int32 and eight f32 accumulators, eight independent
/// `vpdpbusd` chains.
const TILE_ROWS: usize = 8;

/// One panel of `dtype` weights times up to [`TILE_ROWS`] input rows: row `r`'s `cols` results at
/// `out + r · stride`.
fn panel_rows(
    dtype: GgmlDType,
    panel: &[u8],
    rows: &[QuantRow],
    out: *mut f32,
    stride: usize,
    cols: usize,
) {
    debug_assert!(rows.len() <= TILE_ROWS && cols <= PANEL_ROWS);
    match dtype {
        GgmlDType::Q4K => {
            #[cfg(target_arch = "x86_64")]
            if super::x86::gemm_usable() {
                // SAFETY: as below, for a Q4_K panel.
                unsafe { q4k::x86::panel_rows(panel.as_ptr(), rows, out, stride, cols) };
                return;
            }
            return q4k::panel_rows(panel, rows, out, stride, cols);
        }
        GgmlDType::Q4_0 => {
            #[cfg(target_arch = "x86_64")]
            if super::x86::gemm_usable() {
                // SAFETY: as below, for a Q4_0 panel.
                unsafe { q4_0::x86::panel_rows(panel.as_ptr(), rows, out, stride, cols) };
                return;
            }
            return q4_0::panel_rows(panel, rows, out, stride, cols);
        }
        _ => {}
    }
    #[cfg(target_arch = "x86_64")]
    if super::x86::gemm_usable() {
        // SAFETY: `gemm_usable` found AVX-512 F/BW/VNNI; `panel` is a whole panel for rows of `k` values,
        // which every row has (checked by the callers); `out` has `rows.len()` rows of `cols` slots `stride`
        // apart that this call alone writes.
        unsafe { x86::panel_rows(panel.as_ptr(), rows, out, stride, cols) };
        return;
    }
    for (r, x) in rows.iter().enumerate() {
        for l in 0..cols {
            let mut acc = 0f32;
            for b in 0..x.d.len() {
                let s: i32 = (0..QK8_0)
                    .map(|i| {
                        (panel[quant_at(b, l, i)] ^ 0x80) as i8 as i32 * x.qs[b * QK8_0 + i] as i32
                    })
                    .sum();
                acc += block_scale(&panel[scale_offset(b) + 2 * l..]) * x.d[b] * s as f32;
            }
            // SAFETY: as above, slot `l < cols` of row `r`.
            unsafe { *out.add(r * stride + l) = acc };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::{PANEL_ROWS, QuantRow, TILE_ROWS, quant_offset, scale_offset};
    use crate::model::q8::QK8_0;

    /// [`super::panel_rows`] on AVX-512.
    ///
    /// # Safety
    /// As for the portable loop in [`super::panel_rows`], plus AVX-512 F, BW and VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn panel_rows(
        panel: *const u8,
        rows: &[QuantRow],
        out: *mut f32,
        stride: usize,
        cols: usize,
    ) {
        // SAFETY: the caller's guarantees.
        unsafe {
            match rows.len() {
                1 => one_row(panel, &rows[0], out, cols),
                8 => tile::<8>(panel, rows, out, stride, cols),
                7 => tile::<7>(panel, rows, out, stride, cols),
                6 => tile::<6>(panel, rows, out, stride, cols),
                5 => tile::<5>(panel, rows, out, stride, cols),
                4 => tile::<4>(panel, rows, out, stride, cols),
                3 => tile::<3>(panel, rows, out, stride, cols),
                2 => tile::<2>(panel, rows, out, stride, cols),
                n => debug_assert!(n == 0 || n > TILE_ROWS),
            }
        }
    }

    fn mask(cols: usize) -> __mmask16 {
        if cols >= PANEL_ROWS {
            0xffff
        } else {
            (1u16 << cols) - 1
        }
    }

    /// Each tile row's 16 results to `out + r · stride`, the first `cols` of them.
    ///
    /// # Safety
    /// AVX-512 F is available; `out` has `acc.len()` rows of `cols` slots `stride` apart.
    #[inline(always)]
    pub(super) unsafe fn store_rows(acc: &[__m512], out: *mut f32, stride: usize, cols: usize) {
        for (r, a) in acc.iter().enumerate() {
            // SAFETY: the caller's guarantees.
            unsafe { _mm512_mask_storeu_ps(out.add(r * stride), mask(cols), *a) };
        }
    }

    /// Consecutive panels from `first` (each `panel_bytes` long) times one input row, into `out`: one panel per
    /// 16 slots, the last one partial if `out` is.
    ///
    /// # Safety
    /// AVX-512 F, BW and VNNI are available; `first` starts `out.len().div_ceil(16)` whole panels for rows of
    /// `x`'s length.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn panels_one_row(
        first: *const u8,
        panel_bytes: usize,
        x: &QuantRow,
        out: &mut [f32],
    ) {
        for (p, out) in out.chunks_mut(PANEL_ROWS).enumerate() {
            // SAFETY: the caller's guarantees; panel `p` is one of them.
            unsafe { one_row(first.add(p * panel_bytes), x, out.as_mut_ptr(), out.len()) };
        }
    }

    /// One input row (decode): per block, eight `vpdpbusd` (a broadcast word of four activations times the 16
    /// rows' four weights) in two chains, the first started from the offset fix, then scaled by the 16 weight
    /// scales (converted from f16 in one instruction) times the activation scale into one accumulator.
    ///
    /// # Safety
    /// As for [`panel_rows`].
    #[inline(always)]
    unsafe fn one_row(panel: *const u8, x: &QuantRow, out: *mut f32, cols: usize) {
        // SAFETY: every read is inside the panel (block b < the row's blocks, group g < 8) or the row.
        unsafe {
            let xs = x.qs.as_ptr() as *const i32;
            let mut acc = _mm512_setzero_ps();
            for b in 0..x.d.len() {
                let q = panel.add(quant_offset(b));
                let xb = xs.add(b * QK8_0 / 4);
                let mut d0 = _mm512_set1_epi32(*x.offset_fix.get_unchecked(b));
                let mut d1 = _mm512_setzero_si512();
                for g in (0..8).step_by(2) {
                    let w0 = _mm512_load_si512(q.add(g * 64).cast());
                    let w1 = _mm512_load_si512(q.add(g * 64 + 64).cast());
                    d0 = _mm512_dpbusd_epi32(d0, w0, _mm512_set1_epi32(xb.add(g).read_unaligned()));
                    d1 = _mm512_dpbusd_epi32(
                        d1,
                        w1,
                        _mm512_set1_epi32(xb.add(g + 1).read_unaligned()),
                    );
                }
                let dw = _mm512_cvtph_ps(_mm256_load_si256(panel.add(scale_offset(b)).cast()));
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*x.d.get_unchecked(b)));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)), scale, acc);
            }
            _mm512_mask_storeu_ps(out, mask(cols), acc);
        }
    }

    /// `R` input rows: per block, each weight line loaded once for all `R` rows' `vpdpbusd`s.
    ///
    /// # Safety
    /// As for [`panel_rows`], with `rows.len() == R`.
    #[inline(always)]
    unsafe fn tile<const R: usize>(
        panel: *const u8,
        rows: &[QuantRow],
        out: *mut f32,
        stride: usize,
        cols: usize,
    ) {
        // SAFETY: as for `one_row`, for each of the `R` rows and their output rows.
        unsafe {
            let xs: [*const i32; R] = std::array::from_fn(|r| rows[r].qs.as_ptr() as *const i32);
            let mut acc = [_mm512_setzero_ps(); R];
            for b in 0..rows[0].d.len() {
                let q = panel.add(quant_offset(b));
                let mut dots: [__m512i; R] = std::array::from_fn(|r| {
                    _mm512_set1_epi32(*rows[r].offset_fix.get_unchecked(b))
                });
                for g in 0..8 {
                    let wv = _mm512_load_si512(q.add(g * 64).cast());
                    for r in 0..R {
                        let word = xs[r].add(b * QK8_0 / 4 + g).read_unaligned();
                        dots[r] = _mm512_dpbusd_epi32(dots[r], wv, _mm512_set1_epi32(word));
                    }
                }
                let dw = _mm512_cvtph_ps(_mm256_load_si256(panel.add(scale_offset(b)).cast()));
                for r in 0..R {
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*rows[r].d.get_unchecked(b)));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r]), scale, acc[r]);
                }
            }
            store_rows(&acc, out, stride, cols);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n × k` Q8_0 weights with varied scales and the int8 range's ends, as GGUF bytes.
    fn weights(n: usize, k: usize) -> Vec<u8> {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 255) as f32 - 127.0) / (1.0 + (i / 96 % 7) as f32))
            .collect();
        let mut out = Vec::new();
        let wq = QuantizedRows::new(&w, k).unwrap();
        for q in wq.rows() {
            for (b, d) in q.d.iter().enumerate() {
                out.extend_from_slice(&half::f16::from_f32(*d).to_bits().to_le_bytes());
                out.extend(q.qs[b * QK8_0..(b + 1) * QK8_0].iter().map(|&v| v as u8));
            }
        }
        out
    }

    fn inputs(m: usize, k: usize) -> Vec<f32> {
        (0..m * k)
            .map(|i| match i % 5 {
                0 => -3.0,
                1 => 3.0,
                _ => ((i * 104729 % 97) as f32 - 48.0) / 17.0,
            })
            .collect()
    }

    /// The repack is lossless: the GGUF bytes come back exactly and every row dequantizes as candle's layout
    /// says, for a partial last panel and an odd block count (a padded pair).
    #[test]
    fn panels_round_trip_to_the_gguf_bytes() {
        for (n, k) in [(19, 96), (32, 64), (5, 32)] {
            let gguf = weights(n, k);
            let p = PanelWeights::from_q8_0(&gguf, n, k).unwrap();
            assert_eq!(p.to_gguf(), gguf, "{n}x{k}");
            let mut dense = vec![0f32; n * k];
            super::super::dequantize(&gguf, k, &mut dense).unwrap();
            assert_eq!(p.dequantize(), dense, "{n}x{k}");
        }
        assert!(PanelWeights::from_q8_0(&[0; 33], 1, 32).is_err());
    }

    /// The transpose read from the panels is the GGUF layout's, byte for byte, with an odd block count; rows
    /// that are no whole range of 32-row blocks are refused.
    #[test]
    fn panels_transpose_as_the_gguf_bytes_do() {
        for (n, k) in [(32, 96), (64, 64), (96, 32)] {
            let gguf = weights(n, k);
            let p = PanelWeights::from_q8_0(&gguf, n, k).unwrap();
            let want = super::super::transpose_requantized(&gguf, n, k).unwrap();
            assert_eq!(p.transpose_rows(0, n).unwrap(), want, "{n}x{k}");
        }
        let p = PanelWeights::from_q8_0(&weights(19, 32), 19, 32).unwrap();
        assert!(p.transpose_rows(0, 19).is_err());
        let p = PanelWeights::from_q8_0(&weights(64, 32), 64, 32).unwrap();
        assert!(p.transpose_rows(32, 64).is_err() && p.transpose_rows(16, 32).is_err());
    }

    /// Every path over panels (one row, tiles of two to eight rows and their remainders, the threaded split)
    /// agrees with the GGUF layout's scalar loop, for a partial panel and an odd block count.
    #[test]
    fn panel_products_match_the_gguf_kernels() {
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
        for (n, k) in [(19, 96), (48, 128)] {
            let gguf = weights(n, k);
            let p = PanelWeights::from_q8_0(&gguf, n, k).unwrap();
            for m in [1, 2, 3, 8, 9, 20] {
                let x = inputs(m, k);
                let xq = QuantizedRows::new(&x, k).unwrap();
                let mut want = vec![0f32; m * n];
                super::super::dot_rows_scalar(
                    &gguf,
                    n,
                    k,
                    &xq.rows(),
                    &mut want,
                    super::super::OutLayout::by_input_row(n),
                );
                let mut got = vec![f32::NAN; m * n];
                matmul_panels(&p, &xq, &mut got).unwrap();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(close(*g, *w), "{n}x{k}, {m} rows, value {i}: {g} vs {w}");
                }
            }
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let (n, k) = (4096, 64);
        let (gguf, x) = (weights(n, k), inputs(1, k));
        let p = PanelWeights::from_q8_0(&gguf, n, k).unwrap();
        let xq = QuantizedRows::new(&x, k).unwrap();
        let mut alone = vec![0f32; n];
        matvec_panels_many(&xq, &mut [(&p, &mut alone)]).unwrap();
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        pool.install(|| matvec_panels_many(&xq, &mut [(&p, &mut a), (&p, &mut b)]))
            .unwrap();
        assert_eq!((&a, &b), (&alone, &alone));
        assert!(matvec_panels_many(&xq, &mut [(&p, &mut vec![0f32; n - 1][..])]).is_err());
    }

    /// `dtype` (Q4_K or Q4_0) GGUF bytes for `n` rows of `k`: every byte pseudo-random (so every bit of the
    /// packed values and scales is exercised), then the f16 scales set to finite values of either sign.
    fn four_bit_bytes(dtype: GgmlDType, n: usize, k: usize) -> Vec<u8> {
        let sizes = FourBit::of(dtype);
        let block = sizes.block_bytes;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut out: Vec<u8> = (0..n * k / sizes.block_weights * block)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect();
        for (i, blk) in out.chunks_exact_mut(block).enumerate() {
            let d = half::f16::from_f32(0.001 * (1.0 + (i % 5) as f32));
            let dmin = half::f16::from_f32(0.002 * ((i % 3) as f32 - 1.0));
            match dtype {
                GgmlDType::Q4K => {
                    blk[..2].copy_from_slice(&d.to_bits().to_le_bytes());
                    blk[2..4].copy_from_slice(&dmin.to_bits().to_le_bytes());
                }
                _ => blk[..2].copy_from_slice(&d.to_bits().to_le_bytes()),
            }
        }
        out
    }

    /// candle's dequantization of `dtype` GGUF bytes.
    fn four_bit_dense(dtype: GgmlDType, bytes: &[u8], n: usize, k: usize) -> Vec<f32> {
        let storage = candle_core::quantized::QStorage::from_data(
            std::borrow::Cow::Borrowed(bytes),
            &candle_core::Device::Cpu,
            dtype,
        )
        .unwrap();
        let q = candle_core::quantized::QTensor::new(storage, (n, k)).unwrap();
        q.dequantize(&candle_core::Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    const FOUR_BIT: [GgmlDType; 2] = [GgmlDType::Q4K, GgmlDType::Q4_0];

    /// Four-bit panels give back the GGUF bytes exactly and dequantize as candle does, for a partial panel.
    #[test]
    fn four_bit_panels_round_trip_to_the_gguf_bytes() {
        for dtype in FOUR_BIT {
            for (n, k) in [(19, 512), (32, 256), (5, 256), (3, 96usize)] {
                if !k.is_multiple_of(FourBit::of(dtype).block_weights) {
                    continue;
                }
                let gguf = four_bit_bytes(dtype, n, k);
                let p = PanelWeights::from_gguf(dtype, &gguf, n, k).unwrap();
                assert_eq!(p.to_gguf(), gguf, "{dtype:?} {n}x{k}");
                let dense = four_bit_dense(dtype, &gguf, n, k);
                assert_eq!(p.dequantize(), dense, "{dtype:?} {n}x{k}");
            }
            let block = FourBit::of(dtype).block_bytes;
            assert!(PanelWeights::from_gguf(dtype, &vec![0; block], 1, 16).is_err());
        }
        assert!(PanelWeights::from_gguf(GgmlDType::Q5K, &[0; 176], 1, 256).is_err());
    }

    /// Every four-bit panel path (one row, tiles and their remainders, the threaded split; SIMD where the CPU
    /// has it, the portable loop) is the f32 product of the dequantized weights within the activations' int8
    /// rounding, and the transpose is that of the dequantized weights.
    #[test]
    fn four_bit_panel_products_match_the_dequantized_weights() {
        use super::super::kquant::error_bound;
        use super::super::test_support::check_product;
        for dtype in FOUR_BIT {
            for (n, k) in [(19, 512), (48, 256), (64, 512), (32, 96usize)] {
                if !k.is_multiple_of(FourBit::of(dtype).block_weights) {
                    continue;
                }
                let gguf = four_bit_bytes(dtype, n, k);
                let dense = four_bit_dense(dtype, &gguf, n, k);
                let p = PanelWeights::from_gguf(dtype, &gguf, n, k).unwrap();
                for m in [1, 2, 3, 5, 8, 9, 20] {
                    let x = inputs(m, k);
                    let xq = QuantizedRows::new(&x, k).unwrap();
                    let mut got = vec![f32::NAN; m * n];
                    matmul_panels(&p, &xq, &mut got).unwrap();
                    let mut portable = vec![f32::NAN; m * n];
                    for (r, row) in xq.rows().iter().enumerate() {
                        for pi in 0..n.div_ceil(PANEL_ROWS) {
                            let cols = PANEL_ROWS.min(n - pi * PANEL_ROWS);
                            let at = portable[r * n + pi * PANEL_ROWS..].as_mut_ptr();
                            let row = std::slice::from_ref(row);
                            match dtype {
                                GgmlDType::Q4K => q4k::panel_rows(p.panel(pi), row, at, 0, cols),
                                _ => q4_0::panel_rows(p.panel(pi), row, at, 0, cols),
                            }
                        }
                    }
                    check_product(dtype, (&x, k), &dense, &got, &got, error_bound);
                    check_product(dtype, (&x, k), &dense, &portable, &portable, error_bound);
                    let scale = got.iter().fold(0f32, |a, v| a.max(v.abs()));
                    for (i, (a, b)) in got.iter().zip(&portable).enumerate() {
                        assert!((a - b).abs() <= 1e-5 * scale, "{dtype:?} {n}x{k} value {i}");
                    }
                }
                let n32 = n / 32 * 32;
                if n32 == 0 {
                    continue;
                }
                let sizes = FourBit::of(dtype);
                let rows32 = &gguf[..n32 * k / sizes.block_weights * sizes.block_bytes];
                let p32 = PanelWeights::from_gguf(dtype, rows32, n32, k).unwrap();
                let want = super::super::transpose_quantized(&dense[..n32 * k], n32, k).unwrap();
                assert_eq!(
                    p32.transpose_rows(0, n32).unwrap(),
                    want,
                    "{dtype:?} {n32}x{k}"
                );
            }
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap();
            let (n, k) = (1024, 256);
            let p = PanelWeights::from_gguf(dtype, &four_bit_bytes(dtype, n, k), n, k).unwrap();
            let xq = QuantizedRows::new(&inputs(1, k), k).unwrap();
            let mut alone = vec![0f32; n];
            matvec_panels_many(&xq, &mut [(&p, &mut alone)]).unwrap();
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            pool.install(|| matvec_panels_many(&xq, &mut [(&p, &mut a), (&p, &mut b)]))
                .unwrap();
            assert_eq!((&a, &b), (&alone, &alone), "{dtype:?}");
        }
    }
}
