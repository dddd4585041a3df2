//! Q4_K weights in panels of [`PANEL_ROWS`] rows, multiplied on Q8_0 activations with `vpdpbusd`.
//!
//! A Q4_K row is, per 256 weights, an f16 scale `d` and minimum `dmin`, eight 6-bit scales `sc` and minimums
//! `m` (one per 32), and 4-bit values `q`: `w = d·sc·q − dmin·m`. The values are unsigned, as `vpdpbusd`
//! wants its weights, so no offset is needed. A panel keeps, per super-block of 256: the 16 rows' `d` and
//! `dmin` (one line), their `sc` and `m` unpacked to bytes (four lines), and then the values, 32 lines of
//! packed nibbles where line `8c + g` holds, for each of the 16 rows, the same four bytes as the GGUF block's
//! `qs[32c + 4g ..]`: low nibbles are weights `64c + 4g ..` (sub-block `2c`), high nibbles weights
//! `64c + 32 + 4g ..` (sub-block `2c + 1`). A super-block is 2,368 bytes for 4,096 weights (0.578 bytes per
//! weight, the GGUF layout's 0.5625 plus the unpacked scales), read front to back.
//!
//! Per sub-block of 32 the kernel gets each row's integer dot `Σ q·x` in its lane, then adds
//! `dx·(d·sc)·Σ q·x − (dmin·m)·dx·Σ x` (the activations' block sum is the Q8_0 row's offset fix over
//! −128). `d·sc` and `dmin·m` are the f32 values candle's dequantization multiplies by, so a product differs
//! from the f32 product of the dequantized weights only by the activations' int8 rounding
//! ([`crate::model::q8::kquant::error_bound`]) and the order of float additions.

use super::{PANEL_ROWS, QuantRow};
use crate::model::q8::QK8_0;
use crate::model::q8::kquant::{f16_at, scale_min_k4};

/// Weights per super-block.
pub(super) const QK_K: usize = 256;
/// GGUF bytes per super-block: `d`, `dmin`, 12 bytes of packed scales, 128 of values.
pub(super) const BLOCK_BYTES: usize = 144;
/// Where the values start in a panel's super-block: after `d`, `dmin`, `sc` and `m`.
const QUANTS: usize = 64 + 2 * 8 * PANEL_ROWS;
/// A panel's super-block: the scales, then 32 lines of values.
pub(super) const UNIT_BYTES: usize = QUANTS + 32 * 64;

/// Offsets inside super-block `s` of a panel.
#[inline(always)]
fn d_at(s: usize) -> usize {
    s * UNIT_BYTES
}
#[inline(always)]
fn dmin_at(s: usize) -> usize {
    s * UNIT_BYTES + 2 * PANEL_ROWS
}
#[inline(always)]
fn sc_at(s: usize, j: usize) -> usize {
    s * UNIT_BYTES + 64 + j * PANEL_ROWS
}
#[inline(always)]
fn m_at(s: usize, j: usize) -> usize {
    s * UNIT_BYTES + 64 + 8 * PANEL_ROWS + j * PANEL_ROWS
}
#[inline(always)]
fn line_at(s: usize, c: usize, g: usize) -> usize {
    s * UNIT_BYTES + QUANTS + (8 * c + g) * 64
}

/// Writes row `l` of a panel from its GGUF bytes (`k / 256` blocks).
pub(super) fn pack_row(panel: &mut [u8], l: usize, row: &[u8]) {
    for (s, blk) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        panel[d_at(s) + 2 * l..][..2].copy_from_slice(&blk[..2]);
        panel[dmin_at(s) + 2 * l..][..2].copy_from_slice(&blk[2..4]);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &blk[4..16]);
            panel[sc_at(s, j) + l] = sc;
            panel[m_at(s, j) + l] = m;
        }
        for c in 0..4 {
            for g in 0..8 {
                panel[line_at(s, c, g) + 4 * l..][..4]
                    .copy_from_slice(&blk[16 + 32 * c + 4 * g..][..4]);
            }
        }
    }
}

/// Row `l`'s GGUF bytes again, exactly (the inverse of [`pack_row`]: every bit of the packed scales is one of
/// the 16 six-bit values).
pub(super) fn unpack_row(panel: &[u8], l: usize, row: &mut [u8]) {
    for (s, blk) in row.chunks_exact_mut(BLOCK_BYTES).enumerate() {
        blk[..2].copy_from_slice(&panel[d_at(s) + 2 * l..][..2]);
        blk[2..4].copy_from_slice(&panel[dmin_at(s) + 2 * l..][..2]);
        let sc = |j: usize| panel[sc_at(s, j) + l];
        let m = |j: usize| panel[m_at(s, j) + l];
        for j in 0..4 {
            blk[4 + j] = sc(j) | (sc(j + 4) >> 4) << 6;
            blk[8 + j] = m(j) | (m(j + 4) >> 4) << 6;
            blk[12 + j] = (sc(j + 4) & 0xF) | (m(j + 4) & 0xF) << 4;
        }
        for c in 0..4 {
            for g in 0..8 {
                blk[16 + 32 * c + 4 * g..][..4]
                    .copy_from_slice(&panel[line_at(s, c, g) + 4 * l..][..4]);
            }
        }
    }
}

/// Row `l` as f32 (`out.len()` values), as candle dequantizes the GGUF block.
pub(super) fn dequantize_row(panel: &[u8], l: usize, out: &mut [f32]) {
    for (s, vals) in out.chunks_exact_mut(QK_K).enumerate() {
        let d = f16_at(panel, d_at(s) + 2 * l);
        let dmin = f16_at(panel, dmin_at(s) + 2 * l);
        for (c, pair) in vals.chunks_exact_mut(2 * QK8_0).enumerate() {
            let (lo, hi) = pair.split_at_mut(QK8_0);
            let (s_lo, m_lo) = (
                d * panel[sc_at(s, 2 * c) + l] as f32,
                dmin * panel[m_at(s, 2 * c) + l] as f32,
            );
            let (s_hi, m_hi) = (
                d * panel[sc_at(s, 2 * c + 1) + l] as f32,
                dmin * panel[m_at(s, 2 * c + 1) + l] as f32,
            );
            for g in 0..8 {
                let bytes = &panel[line_at(s, c, g) + 4 * l..][..4];
                for (t, &byte) in bytes.iter().enumerate() {
                    lo[4 * g + t] = s_lo * (byte & 0xF) as f32 - m_lo;
                    hi[4 * g + t] = s_hi * (byte >> 4) as f32 - m_hi;
                }
            }
        }
    }
}

/// The activations' integer sum over block `b` of row `x`, from its offset fix (`−128 · Σ qs`).
#[inline(always)]
fn block_sum(x: &QuantRow, b: usize) -> i32 {
    x.offset_fix[b] / -128
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
                let (s, j) = (b / 8, b % 8);
                let (c, high) = (j / 2, j % 2 == 1);
                let dot: i32 = (0..QK8_0)
                    .map(|t| {
                        let byte = panel[line_at(s, c, t / 4) + 4 * l + t % 4];
                        let q = if high { byte >> 4 } else { byte & 0xF };
                        q as i32 * x.qs[b * QK8_0 + t] as i32
                    })
                    .sum();
                let scale = f16_at(panel, d_at(s) + 2 * l) * panel[sc_at(s, j) + l] as f32;
                let min = f16_at(panel, dmin_at(s) + 2 * l) * panel[m_at(s, j) + l] as f32;
                acc += x.d[b] * (scale * dot as f32) - min * (x.d[b] * block_sum(x, b) as f32);
            }
            // SAFETY: the caller gives `rows.len()` rows of `cols` slots `stride` apart.
            unsafe { *out.add(r * stride + l) = acc };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::{QuantRow, block_sum, d_at, dmin_at, line_at, m_at, sc_at};
    use crate::model::q8::QK8_0;

    /// [`super::panel_rows`] on AVX-512 for up to eight rows: per pair of sub-blocks, each line of values
    /// loaded and split into its two nibbles once for all rows, two `vpdpbusd` per row and line.
    ///
    /// # Safety
    /// AVX-512 F, BW and VNNI are available; `panel` is a whole Q4_K panel for rows of the length of each of
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

    /// 16 rows' bytes at `p` as f32 lanes.
    #[inline(always)]
    unsafe fn bytes_ps(p: *const u8) -> __m512 {
        // SAFETY: the caller's panel holds 16 bytes at `p`.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()))) }
    }

    #[inline(always)]
    unsafe fn tile<const R: usize>(
        panel: *const u8,
        rows: &[QuantRow],
        out: *mut f32,
        stride: usize,
        cols: usize,
    ) {
        // SAFETY: every read is inside the panel (super-block s below the row's, lines and scales of it) or
        // inside the rows (block b below their block count); the writes are the caller's slots.
        unsafe {
            let nibble = _mm512_set1_epi8(0x0F);
            let xs: [*const i32; R] = std::array::from_fn(|r| rows[r].qs.as_ptr() as *const i32);
            let mut acc = [_mm512_setzero_ps(); R];
            for s in 0..rows[0].d.len() / 8 {
                let d = _mm512_cvtph_ps(_mm256_load_si256(panel.add(d_at(s)).cast()));
                let dmin = _mm512_cvtph_ps(_mm256_load_si256(panel.add(dmin_at(s)).cast()));
                for c in 0..4 {
                    let (lo_b, hi_b) = (8 * s + 2 * c, 8 * s + 2 * c + 1);
                    let mut lo = [_mm512_setzero_si512(); R];
                    let mut hi = [_mm512_setzero_si512(); R];
                    for g in 0..8 {
                        let line = _mm512_load_si512(panel.add(line_at(s, c, g)).cast());
                        let wl = _mm512_and_si512(line, nibble);
                        let wh = _mm512_and_si512(_mm512_srli_epi16(line, 4), nibble);
                        for r in 0..R {
                            let xl = xs[r].add(lo_b * QK8_0 / 4 + g).read_unaligned();
                            let xh = xs[r].add(hi_b * QK8_0 / 4 + g).read_unaligned();
                            lo[r] = _mm512_dpbusd_epi32(lo[r], wl, _mm512_set1_epi32(xl));
                            hi[r] = _mm512_dpbusd_epi32(hi[r], wh, _mm512_set1_epi32(xh));
                        }
                    }
                    let sc_lo = _mm512_mul_ps(d, bytes_ps(panel.add(sc_at(s, 2 * c))));
                    let sc_hi = _mm512_mul_ps(d, bytes_ps(panel.add(sc_at(s, 2 * c + 1))));
                    let m_lo = _mm512_mul_ps(dmin, bytes_ps(panel.add(m_at(s, 2 * c))));
                    let m_hi = _mm512_mul_ps(dmin, bytes_ps(panel.add(m_at(s, 2 * c + 1))));
                    for r in 0..R {
                        let x = &rows[r];
                        let (dl, dh) = (*x.d.get_unchecked(lo_b), *x.d.get_unchecked(hi_b));
                        let sums_l = dl * block_sum(x, lo_b) as f32;
                        let sums_h = dh * block_sum(x, hi_b) as f32;
                        let sl = _mm512_mul_ps(sc_lo, _mm512_set1_ps(dl));
                        let sh = _mm512_mul_ps(sc_hi, _mm512_set1_ps(dh));
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[r]), sl, acc[r]);
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[r]), sh, acc[r]);
                        acc[r] = _mm512_fnmadd_ps(m_lo, _mm512_set1_ps(sums_l), acc[r]);
                        acc[r] = _mm512_fnmadd_ps(m_hi, _mm512_set1_ps(sums_h), acc[r]);
                    }
                }
            }
            super::super::x86::store_rows(&acc, out, stride, cols);
        }
    }
}
