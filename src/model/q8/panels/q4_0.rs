//! Q4_0 weights in panels of [`PANEL_ROWS`] rows, multiplied on Q8_0 activations with `vpdpbusd`.
//!
//! A Q4_0 block is an f16 scale `d` and 32 four-bit values stored as `q + 8`: `w = d·(u − 8)`, the GGUF byte
//! `j` holding weight `j` in its low nibble and weight `16 + j` in its high one. A panel keeps, per pair of
//! blocks: each block's four lines of packed nibbles (line `g` holds the 16 rows' GGUF bytes `4g ..`, so
//! weights `4g ..` low and `16 + 4g ..` high), then one line of the pair's 16 × 2 scales: 576 bytes for
//! 1,024 weights, the GGUF layout's 0.5625 bytes per weight (plus a padding block for an odd block count).
//!
//! Per block and input row the kernel starts one `vpdpbusd` chain from `−8·Σ x` (the activations' block sum
//! is the Q8_0 row's offset fix over −128), which takes the stored offset off in integers, and adds
//! `dx·d·Σ (u − 8)·x`: the f32 values candle's dequantization multiplies by, so a product differs from the
//! f32 product of the dequantized weights only by the activations' int8 rounding
//! ([`crate::model::q8::kquant::error_bound`]) and the order of float additions.

use super::{PANEL_ROWS, QuantRow};
use crate::model::q8::QK8_0;
use crate::model::q8::kquant::f16_at;

/// GGUF bytes per block: `d`, then 16 bytes of values.
pub(super) const BLOCK_BYTES: usize = 18;
/// A panel's pair of blocks: eight lines of values, one of scales.
pub(super) const UNIT_BYTES: usize = 9 * 64;

#[inline(always)]
fn line_at(b: usize, g: usize) -> usize {
    b / 2 * UNIT_BYTES + b % 2 * 4 * 64 + g * 64
}
#[inline(always)]
fn d_at(b: usize) -> usize {
    b / 2 * UNIT_BYTES + 8 * 64 + b % 2 * 2 * PANEL_ROWS
}

/// Writes row `l` of a panel from its GGUF bytes (`k / 32` blocks).
pub(super) fn pack_row(panel: &mut [u8], l: usize, row: &[u8]) {
    for (b, blk) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        panel[d_at(b) + 2 * l..][..2].copy_from_slice(&blk[..2]);
        for g in 0..4 {
            panel[line_at(b, g) + 4 * l..][..4].copy_from_slice(&blk[2 + 4 * g..][..4]);
        }
    }
}

/// Row `l`'s GGUF bytes again, exactly.
pub(super) fn unpack_row(panel: &[u8], l: usize, row: &mut [u8]) {
    for (b, blk) in row.chunks_exact_mut(BLOCK_BYTES).enumerate() {
        blk[..2].copy_from_slice(&panel[d_at(b) + 2 * l..][..2]);
        for g in 0..4 {
            blk[2 + 4 * g..][..4].copy_from_slice(&panel[line_at(b, g) + 4 * l..][..4]);
        }
    }
}

/// The stored value (`q + 8`, 0..16) of weight `i` (0..32) of block `b`, row `l`.
#[inline(always)]
fn stored(panel: &[u8], b: usize, l: usize, i: usize) -> u8 {
    let byte = panel[line_at(b, i % 16 / 4) + 4 * l + i % 4];
    if i < 16 { byte & 0xF } else { byte >> 4 }
}

/// Row `l` as f32 (`out.len()` values), as candle dequantizes the GGUF block.
pub(super) fn dequantize_row(panel: &[u8], l: usize, out: &mut [f32]) {
    for (b, vals) in out.chunks_exact_mut(QK8_0).enumerate() {
        let d = f16_at(panel, d_at(b) + 2 * l);
        for (i, v) in vals.iter_mut().enumerate() {
            *v = (stored(panel, b, l, i) as i32 - 8) as f32 * d;
        }
    }
}

/// One panel times each of `rows`: row `r`'s `cols` results at `out + r · stride`. The portable loop, the
/// reference the SIMD kernel is tested against.
pub(super) fn panel_rows(
    panel: &[u8],
    rows: &[QuantRow],
    out: *mut f32,
    stride: usize,
    cols: usize,
) {
    for (r, x) in rows.iter().enumerate() {
        for l in 0..cols {
            let mut acc = 0f32;
            for b in 0..x.d.len() {
                let dot: i32 = (0..QK8_0)
                    .map(|i| (stored(panel, b, l, i) as i32 - 8) * x.qs[b * QK8_0 + i] as i32)
                    .sum();
                acc += x.d[b] * (f16_at(panel, d_at(b) + 2 * l) * dot as f32);
            }
            // SAFETY: the caller gives `rows.len()` rows of `cols` slots `stride` apart.
            unsafe { *out.add(r * stride + l) = acc };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::{QuantRow, d_at, line_at};
    use crate::model::q8::QK8_0;

    /// [`super::panel_rows`] on AVX-512 for up to eight rows: each line loaded and split into its two nibbles
    /// once for all rows, two `vpdpbusd` per row and line.
    ///
    /// # Safety
    /// AVX-512 F, BW and VNNI are available; `panel` is a whole Q4_0 panel for rows of the length of each of
    /// `rows` (at most eight); `out` has `rows.len()` rows of `cols ≤ 16` slots `stride` apart that this call
    /// alone writes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn panel_rows(
        panel: *const u8,
        rows: &[QuantRow],
        out: *mut f32,
        stride: usize,
        cols: usize,
    ) {
        // SAFETY: the caller's guarantees.
        unsafe { tile_for_rows!(tile, rows, panel, rows, out, stride, cols) }
    }

    #[inline(always)]
    unsafe fn tile<const R: usize>(
        panel: *const u8,
        rows: &[QuantRow],
        out: *mut f32,
        stride: usize,
        cols: usize,
    ) {
        // SAFETY: every read is inside the panel (block b below the row's, its lines and scales) or inside
        // the rows; the writes are the caller's slots.
        unsafe {
            let nibble = _mm512_set1_epi8(0x0F);
            let xs: [*const i32; R] = std::array::from_fn(|r| rows[r].qs.as_ptr() as *const i32);
            let mut acc = [_mm512_setzero_ps(); R];
            for b in 0..rows[0].d.len() {
                // −8·Σx = offset_fix / 16, exactly (the fix is −128·Σx).
                let mut lo: [__m512i; R] = std::array::from_fn(|r| {
                    _mm512_set1_epi32(*rows[r].offset_fix.get_unchecked(b) / 16)
                });
                let mut hi = [_mm512_setzero_si512(); R];
                for g in 0..4 {
                    let line = _mm512_load_si512(panel.add(line_at(b, g)).cast());
                    let wl = _mm512_and_si512(line, nibble);
                    let wh = _mm512_and_si512(_mm512_srli_epi16(line, 4), nibble);
                    for r in 0..R {
                        let xl = xs[r].add(b * QK8_0 / 4 + g).read_unaligned();
                        let xh = xs[r].add(b * QK8_0 / 4 + 4 + g).read_unaligned();
                        lo[r] = _mm512_dpbusd_epi32(lo[r], wl, _mm512_set1_epi32(xl));
                        hi[r] = _mm512_dpbusd_epi32(hi[r], wh, _mm512_set1_epi32(xh));
                    }
                }
                let d = _mm512_cvtph_ps(_mm256_load_si256(panel.add(d_at(b)).cast()));
                for r in 0..R {
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(*rows[r].d.get_unchecked(b)));
                    let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(lo[r], hi[r]));
                    acc[r] = _mm512_fmadd_ps(dot, scale, acc[r]);
                }
            }
            super::super::x86::store_rows(&acc, out, stride, cols);
        }
    }
}
