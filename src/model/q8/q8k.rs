//! Q4_K, Q5_K and Q6_K products on activations quantized to Q8_K: per 256 values one f32 scale, 256 int8 and
//! the sums of each 16, as llama.cpp's ggml-cpu organises them.
//!
//! A K-quant weight is, per 256, small unsigned integers `q` with an integer scale per 16 or 32 of them and an
//! f16 super-scale `d`; Q4_K and Q5_K subtract `dmin·m` per 32, Q6_K stores `q + 32`. With one activation
//! scale per 256 the whole super-block sums in integers: `Σ_j sc_j·Σ q·x` (`maddubs` of `q` and `x`, then
//! `madd` with the scales as int16) minus a correction that needs only the activations' sums of 16 (`Σ_j m_j ·
//! Σ x` for the minimums, `32·Σ_j sc_j · Σ x` for Q6_K's offset), and meets the floats once per super-block.
//! Every integer is exact and `d·sc`, `dmin·m` are exactly the f32 values candle's dequantization multiplies
//! by, so a product differs from the f32 product of the dequantized weights only by the activations' int8
//! rounding ([`error_bound`]) and the order of float additions.
//!
//! A weight row is unpacked once per product into [`Unpacked`] (values as bytes, scales as the int16 lanes
//! `madd` takes) and then dotted with every input row; the GGUF bytes stay as they are in memory, so decode
//! streams 4.5 to 6.6 bits per weight. The kernels are AVX2 where the CPU has it, a portable loop elsewhere.

use super::kquant::{KQuant, f16_at, scale_min_k4};
use super::{PARALLEL_MIN_WEIGHTS, Q8Error};
use crate::model::spin_pool::SharedSlice;

/// Values per Q8_K activation block and per K-quant super-block.
pub const QK_K: usize = 256;
/// Activation values per block sum.
const SUM_LEN: usize = 16;

/// Whether `kind` has a kernel here.
pub fn supports(kind: KQuant) -> bool {
    matches!(kind, KQuant::Q4K | KQuant::Q5K | KQuant::Q6K)
}

/// Activation rows quantized to Q8_K, in three flat buffers for all rows.
pub struct KRows {
    d: Vec<f32>,
    qs: Vec<i8>,
    sums: Vec<i16>,
    k: usize,
}

/// One row of [`KRows`].
#[derive(Clone, Copy)]
struct KRow<'a> {
    d: &'a [f32],
    qs: &'a [i8],
    sums: &'a [i16],
}

impl KRows {
    /// Quantizes `x` (`m × k`, `m = x.len() / k`): per block of 256, `d = max |x| / 127` (f32) and each value
    /// rounded to the nearest multiple of it. `k` must be a non-zero multiple of 256.
    pub fn new(x: &[f32], k: usize) -> Result<Self, Q8Error> {
        if k == 0 || !k.is_multiple_of(QK_K) || !x.len().is_multiple_of(k) {
            return Err(Q8Error(format!(
                "q8_k activations: k = {k} is not a non-zero multiple of {QK_K} dividing {} values",
                x.len()
            )));
        }
        let blocks = x.len() / QK_K;
        let mut d = vec![0f32; blocks];
        let mut qs = vec![0i8; x.len()];
        let mut sums = vec![0i16; x.len() / SUM_LEN];
        type Block<'a> = ((&'a [f32], &'a mut [i8]), (&'a mut f32, &'a mut [i16]));
        let each = |((xb, qb), (d, s)): Block| quantize_block(xb, d, qb, s);
        if x.len() / k >= super::PARALLEL_QUANTIZE_ROWS {
            use rayon::prelude::*;
            x.par_chunks_exact(QK_K)
                .zip(qs.par_chunks_exact_mut(QK_K))
                .zip(
                    d.par_iter_mut()
                        .zip(sums.par_chunks_exact_mut(QK_K / SUM_LEN)),
                )
                .with_min_len(64)
                .for_each(each);
        } else {
            x.chunks_exact(QK_K)
                .zip(qs.chunks_exact_mut(QK_K))
                .zip(d.iter_mut().zip(sums.chunks_exact_mut(QK_K / SUM_LEN)))
                .for_each(each);
        }
        Ok(Self { d, qs, sums, k })
    }

    fn len(&self) -> usize {
        self.qs.len() / self.k
    }

    fn rows(&self) -> Vec<KRow<'_>> {
        let blocks = self.k / QK_K;
        self.qs
            .chunks_exact(self.k)
            .zip(self.d.chunks_exact(blocks))
            .zip(self.sums.chunks_exact(self.k / SUM_LEN))
            .map(|((qs, d), sums)| KRow { d, qs, sums })
            .collect()
    }
}

fn quantize_block(x: &[f32], d: &mut f32, qs: &mut [i8], sums: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::usable() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { quantize_block_avx2(x, d, qs, sums) };
    }
    quantize_block_generic(x, d, qs, sums)
}

/// # Safety
/// AVX2 and FMA are available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_block_avx2(x: &[f32], d: &mut f32, qs: &mut [i8], sums: &mut [i16]) {
    quantize_block_generic(x, d, qs, sums)
}

/// Compiled twice, like `quantize_row_generic` in the parent module, whose rules it follows (a NaN counts as
/// 0 in the maximum; halves round away from zero).
#[inline(always)]
fn quantize_block_generic(x: &[f32], d: &mut f32, qs: &mut [i8], sums: &mut [i16]) {
    let scale = super::abs_max(x) / 127.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    for (q, v) in qs.iter_mut().zip(x) {
        *q = super::round_half_away(v * inv) as i8;
    }
    for (s, q) in sums.iter_mut().zip(qs.chunks_exact(SUM_LEN)) {
        *s = q.iter().map(|&v| v as i16).sum();
    }
    *d = scale;
}

/// One weight row unpacked for the dot: per value a byte (`q`, unsigned), per 32 values the sixteen int16
/// scales of `maddubs`' pair lanes (`sc`: the first eight for values 0..16, the rest for 16..32), and per
/// super-block the sixteen int16 factors of the activations' sums of 16 (`corr`), the multiplier of the integer
/// sums (`d`) and that of the correction (`c`, subtracted).
pub(super) struct Unpacked {
    q: Vec<u8>,
    sc: Vec<i16>,
    corr: Vec<i16>,
    d: Vec<f32>,
    c: Vec<f32>,
}

impl Unpacked {
    fn new(k: usize) -> Self {
        Unpacked {
            q: vec![0; k],
            sc: vec![0; k / 2],
            corr: vec![0; k / SUM_LEN],
            d: vec![0.0; k / QK_K],
            c: vec![0.0; k / QK_K],
        }
    }
}

fn unpack(kind: KQuant, bytes: &[u8], out: &mut Unpacked) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::usable() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { unpack_avx2(kind, bytes, out) };
    }
    unpack_generic(kind, bytes, out)
}

/// # Safety
/// AVX2 and FMA are available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn unpack_avx2(kind: KQuant, bytes: &[u8], out: &mut Unpacked) {
    unpack_generic(kind, bytes, out)
}

/// The row `bytes` of `kind` super-blocks into `out`. Compiled twice: the per-value loops vectorize.
#[inline(always)]
fn unpack_generic(kind: KQuant, bytes: &[u8], out: &mut Unpacked) {
    let blocks = bytes.chunks_exact(kind.block_bytes());
    for (i, b) in blocks.enumerate() {
        let q = &mut out.q[i * QK_K..(i + 1) * QK_K];
        let sc = &mut out.sc[i * QK_K / 2..(i + 1) * QK_K / 2];
        let corr = &mut out.corr[i * 16..(i + 1) * 16];
        match kind {
            KQuant::Q4K | KQuant::Q5K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let scales = &b[4..16];
                let (qh, qs) = match kind {
                    KQuant::Q5K => (Some(&b[16..48]), &b[48..176]),
                    _ => (None, &b[16..144]),
                };
                for j in 0..4 {
                    let ql = &qs[32 * j..32 * j + 32];
                    let (lo, hi) = q[64 * j..64 * j + 64].split_at_mut(32);
                    for l in 0..32 {
                        lo[l] = ql[l] & 0xF;
                        hi[l] = ql[l] >> 4;
                    }
                    if let Some(qh) = qh {
                        for l in 0..32 {
                            lo[l] |= ((qh[l] >> (2 * j)) & 1) << 4;
                            hi[l] |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
                        }
                    }
                }
                for j in 0..8 {
                    let (s, m) = scale_min_k4(j, scales);
                    sc[16 * j..16 * j + 16].fill(s as i16);
                    corr[2 * j..2 * j + 2].fill(m as i16);
                }
                out.d[i] = d;
                out.c[i] = dmin;
            }
            KQuant::Q6K => {
                let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for n in 0..2 {
                    let (ql, qh, q) = (&ql[64 * n..], &qh[32 * n..], &mut q[128 * n..]);
                    for l in 0..32 {
                        q[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                        q[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                        q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                        q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                    }
                }
                for (t, &s) in scales.iter().enumerate() {
                    sc[8 * t..8 * t + 8].fill(s as i8 as i16);
                    corr[t] = s as i8 as i16;
                }
                out.d[i] = d;
                // The stored values are `q + 32`: `Σ sc·(q − 32)·x = Σ sc·q·x − 32·Σ sc·Σ x`.
                out.c[i] = 32.0 * d;
            }
            KQuant::Q4_0 => unreachable!("q8_k products take K-quant weights only"),
        }
    }
}

/// One unpacked weight row dotted with one activation row.
fn dot(w: &Unpacked, x: KRow) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::x86::usable() {
        // SAFETY: the CPU has AVX2 and FMA; `w` and `x` hold the same `k` (the callers' check).
        return unsafe { dot_avx2(w, x) };
    }
    dot_scalar(w, x)
}

fn dot_scalar(w: &Unpacked, x: KRow) -> f32 {
    let mut acc = 0f32;
    for (sb, &dx) in x.d.iter().enumerate() {
        let mut sum = 0i32;
        for e in sb * QK_K..(sb + 1) * QK_K {
            // Pair lane `(e % 32) / 2` of block `e / 32`.
            sum += w.sc[e / 32 * 16 + e % 32 / 2] as i32 * w.q[e] as i32 * x.qs[e] as i32;
        }
        let corr: i32 = (sb * 16..sb * 16 + 16)
            .map(|t| w.corr[t] as i32 * x.sums[t] as i32)
            .sum();
        acc += sum as f32 * (w.d[sb] * dx) - corr as f32 * (w.c[sb] * dx);
    }
    acc
}

/// [`dot_scalar`] in AVX2: per 32 values one `maddubs` and one `madd` with the scale lanes into eight int32
/// sums, two chains per super-block, converted once per super-block; the lanes are summed once per row.
///
/// # Safety
/// AVX2 and FMA are available; `w` and `x` are rows of the same `k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(w: &Unpacked, x: KRow) -> f32 {
    use std::arch::x86_64::*;
    let blocks = x.d.len();
    assert!(
        w.q.len() == x.qs.len()
            && w.sc.len() == blocks * QK_K / 2
            && w.corr.len() == blocks * 16
            && x.sums.len() == blocks * 16
            && w.d.len() == blocks
    );
    // SAFETY: every offset below stays inside the lengths asserted above.
    unsafe {
        let (wq, wsc, xq) = (w.q.as_ptr(), w.sc.as_ptr(), x.qs.as_ptr());
        let mut acc = _mm256_setzero_ps();
        for sb in 0..blocks {
            let mut s0 = _mm256_setzero_si256();
            let mut s1 = _mm256_setzero_si256();
            for b in (0..8).step_by(2) {
                let e = sb * QK_K + b * 32;
                let p0 = _mm256_maddubs_epi16(
                    _mm256_loadu_si256(wq.add(e).cast()),
                    _mm256_loadu_si256(xq.add(e).cast()),
                );
                let p1 = _mm256_maddubs_epi16(
                    _mm256_loadu_si256(wq.add(e + 32).cast()),
                    _mm256_loadu_si256(xq.add(e + 32).cast()),
                );
                s0 = _mm256_add_epi32(
                    s0,
                    _mm256_madd_epi16(p0, _mm256_loadu_si256(wsc.add(e / 2).cast())),
                );
                s1 = _mm256_add_epi32(
                    s1,
                    _mm256_madd_epi16(p1, _mm256_loadu_si256(wsc.add(e / 2 + 16).cast())),
                );
            }
            let corr = _mm256_madd_epi16(
                _mm256_loadu_si256(w.corr.as_ptr().add(sb * 16).cast()),
                _mm256_loadu_si256(x.sums.as_ptr().add(sb * 16).cast()),
            );
            let dx = *x.d.get_unchecked(sb);
            let sum = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
            acc = _mm256_fmadd_ps(sum, _mm256_set1_ps(*w.d.get_unchecked(sb) * dx), acc);
            acc = _mm256_fnmadd_ps(
                _mm256_cvtepi32_ps(corr),
                _mm256_set1_ps(*w.c.get_unchecked(sb) * dx),
                acc,
            );
        }
        let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// AVX2 dots straight from the GGUF bytes, as llama.cpp's `ggml_vec_dot_q*_K_q8_K` organise them: each
/// super-block's values are unpacked in registers once for up to four input rows, the scales broadcast to
/// int16 lanes by one byte shuffle, and the correction terms take the activations' sums of 16.
#[cfg(target_arch = "x86_64")]
mod fused {
    use std::arch::x86_64::*;

    use super::{KQuant, KRow, QK_K};

    /// Byte shuffles that broadcast int16 lane `j` of a 128-bit half to all eight of its lanes.
    static BROADCAST16: [[u8; 16]; 8] = {
        let mut t = [[0u8; 16]; 8];
        let mut j = 0;
        while j < 8 {
            let mut i = 0;
            while i < 8 {
                t[j][2 * i] = 2 * j as u8;
                t[j][2 * i + 1] = 2 * j as u8 + 1;
                i += 1;
            }
            j += 1;
        }
        t
    };

    /// Byte shuffles that give, from 16 int8 scales, scale `2t` eight times then scale `2t + 1` eight times.
    static PAIR_SCALES: [[u8; 16]; 8] = {
        let mut t = [[0u8; 16]; 8];
        let mut b = 0;
        while b < 8 {
            let mut i = 0;
            while i < 8 {
                t[b][i] = 2 * b as u8;
                t[b][i + 8] = 2 * b as u8 + 1;
                i += 1;
            }
            b += 1;
        }
        t
    };

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// The f16 at `at`, through the x86 kernels' table: `half`'s conversion would be a call per scale here
    /// (its F16C path is compiled apart from this function's features).
    #[inline(always)]
    fn f16(b: &[u8], at: usize) -> f32 {
        crate::model::q8::x86::f16_table()[u16::from_le_bytes([b[at], b[at + 1]]) as usize]
    }

    /// `out[r] = w · xs[r]` for one weight row `w` (GGUF bytes of `kind`) and `R` activation rows.
    ///
    /// # Safety
    /// AVX2 and FMA are available; `w` holds whole super-blocks of `kind` for the `k` values of every row of
    /// `xs`; `out` has `R` slots.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot<const R: usize>(kind: KQuant, w: &[u8], xs: &[KRow], out: &mut [f32]) {
        let bb = kind.block_bytes();
        let blocks = w.len() / bb;
        assert!(xs.len() == R && out.len() == R);
        for x in xs {
            assert!(
                x.d.len() == blocks && x.qs.len() == blocks * QK_K && x.sums.len() == blocks * 16
            );
        }
        // SAFETY: every read below is inside super-block `sb < blocks` of `w` (`bb` bytes) or of a row of
        // `xs` (256 values, 16 sums), as asserted above.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); R];
            let m4 = _mm256_set1_epi8(0x0F);
            for sb in 0..blocks {
                let b = &w[sb * bb..(sb + 1) * bb];
                let mut sumi = [_mm256_setzero_si256(); R];
                let (dw, cw, corr) = match kind {
                    KQuant::Q4K | KQuant::Q5K => {
                        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                        let (u0, u1, u2) = (u(4), u(8), u(12));
                        let sc03 = u0 & 0x3f3f_3f3f;
                        let m03 = u1 & 0x3f3f_3f3f;
                        let sc47 = (u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4);
                        let m47 = ((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4);
                        let scm = _mm256_cvtepu8_epi16(_mm_set_epi32(
                            m47 as i32,
                            m03 as i32,
                            sc47 as i32,
                            sc03 as i32,
                        ));
                        let scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(scm));
                        let mins = _mm256_extracti128_si256::<1>(scm);
                        let (qh, qs) = match kind {
                            KQuant::Q5K => {
                                (Some(_mm256_loadu_si256(b.as_ptr().add(16).cast())), 48)
                            }
                            _ => (None, 16),
                        };
                        for j in 0..4 {
                            let q = _mm256_loadu_si256(b.as_ptr().add(qs + 32 * j).cast());
                            let mut lo = _mm256_and_si256(q, m4);
                            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                            if let Some(qh) = qh {
                                let bit = |n: usize| {
                                    let m = _mm256_set1_epi8(1 << n);
                                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m);
                                    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
                                };
                                lo = _mm256_or_si256(lo, bit(2 * j));
                                hi = _mm256_or_si256(hi, bit(2 * j + 1));
                            }
                            let s_lo = _mm256_shuffle_epi8(
                                scales,
                                _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                    BROADCAST16[2 * j].as_ptr().cast(),
                                )),
                            );
                            let s_hi = _mm256_shuffle_epi8(
                                scales,
                                _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                    BROADCAST16[2 * j + 1].as_ptr().cast(),
                                )),
                            );
                            for r in 0..R {
                                let xq = xs[r].qs.as_ptr().add(sb * QK_K + 64 * j);
                                let p_lo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(xq.cast()));
                                let p_hi =
                                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256(xq.add(32).cast()));
                                sumi[r] = _mm256_add_epi32(
                                    sumi[r],
                                    _mm256_add_epi32(
                                        _mm256_madd_epi16(p_lo, s_lo),
                                        _mm256_madd_epi16(p_hi, s_hi),
                                    ),
                                );
                            }
                        }
                        // Each minimum meets two sums of 16: the mins duplicated into 16 lanes.
                        let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(
                            _mm_packus_epi16(mins, mins),
                            _mm_packus_epi16(mins, mins),
                        ));
                        (f16(b, 0), f16(b, 2), mins)
                    }
                    KQuant::Q6K => {
                        let d = f16(b, 208);
                        let scales = _mm_loadu_si128(b.as_ptr().add(192).cast());
                        let m3 = _mm256_set1_epi8(0x30);
                        for n in 0..2 {
                            let qh = _mm256_loadu_si256(b.as_ptr().add(128 + 32 * n).cast());
                            let a = _mm256_loadu_si256(b.as_ptr().add(64 * n).cast());
                            let c = _mm256_loadu_si256(b.as_ptr().add(64 * n + 32).cast());
                            let q = [
                                _mm256_or_si256(
                                    _mm256_and_si256(a, m4),
                                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m3),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(c, m4),
                                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m3),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(a), m4),
                                    _mm256_and_si256(qh, m3),
                                ),
                                _mm256_or_si256(
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(c), m4),
                                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m3),
                                ),
                            ];
                            for (i, q) in q.iter().enumerate() {
                                let t = 4 * n + i;
                                let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                                    scales,
                                    _mm_loadu_si128(PAIR_SCALES[t].as_ptr().cast()),
                                ));
                                for r in 0..R {
                                    let xq = xs[r].qs.as_ptr().add(sb * QK_K + 32 * t);
                                    let p = _mm256_maddubs_epi16(*q, _mm256_loadu_si256(xq.cast()));
                                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, sc));
                                }
                            }
                        }
                        // The stored values are `q + 32`: `32·Σ sc·Σ x` comes off.
                        (d, 32.0 * d, _mm256_cvtepi8_epi16(scales))
                    }
                    KQuant::Q4_0 => unreachable!("q8_k products take K-quant weights only"),
                };
                for r in 0..R {
                    let x = &xs[r];
                    let dx = *x.d.get_unchecked(sb);
                    let sums = _mm256_loadu_si256(x.sums.as_ptr().add(sb * 16).cast());
                    let c = _mm256_madd_epi16(corr, sums);
                    acc[r] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(sumi[r]),
                        _mm256_set1_ps(dw * dx),
                        acc[r],
                    );
                    acc[r] =
                        _mm256_fnmadd_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(cw * dx), acc[r]);
                }
            }
            for r in 0..R {
                out[r] = hsum(acc[r]);
            }
        }
    }
}

/// The bytes of one row of `k` weights of `kind`, after checking that `kind` has a kernel here and `k` fills
/// whole super-blocks.
fn row_bytes(kind: KQuant, k: usize) -> Result<usize, Q8Error> {
    if !supports(kind) || k == 0 || !k.is_multiple_of(QK_K) {
        return Err(Q8Error(format!(
            "{kind:?} q8_k product: no kernel, or rows of {k} weights are no whole number of {QK_K}-weight blocks"
        )));
    }
    Ok(k / QK_K * kind.block_bytes())
}

/// Weight rows per item of a split: enough work per claim that the hand-off stays small.
const ROWS_PER_ITEM: usize = 4;

/// Products of weight rows `rows` of `w` (rows of `rb` bytes) with every input row `r`, at
/// `out + (o - rows.start) · per_output + r · per_input`.
///
/// # Safety
/// `out` is valid for writes at every one of those places, which no one else touches during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn rows_into(
    kind: KQuant,
    w: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    x: &[KRow],
    un: &mut Unpacked,
    out: *mut f32,
    (per_output, per_input): (usize, usize),
) {
    let m = x.len();
    // SAFETY: the caller's guarantee for each `(o, r)` place.
    let put = |i: usize, r: usize, v: f32| unsafe { *out.add(i * per_output + r * per_input) = v };
    #[cfg(target_arch = "x86_64")]
    if super::x86::usable() {
        for (i, o) in rows.enumerate() {
            let wrow = &w[o * rb..(o + 1) * rb];
            let mut r = 0;
            while r < m {
                let n = (m - r).min(4);
                let mut v = [0f32; 4];
                // SAFETY: the CPU has AVX2 and FMA; `wrow` is one row of `kind` super-blocks for the `k` values
                // every input row has (the callers' checks).
                unsafe {
                    match n {
                        4 => fused::dot::<4>(kind, wrow, &x[r..r + 4], &mut v[..4]),
                        3 => fused::dot::<3>(kind, wrow, &x[r..r + 3], &mut v[..3]),
                        2 => fused::dot::<2>(kind, wrow, &x[r..r + 2], &mut v[..2]),
                        _ => fused::dot::<1>(kind, wrow, &x[r..r + 1], &mut v[..1]),
                    }
                }
                for (j, &v) in v[..n].iter().enumerate() {
                    put(i, r + j, v);
                }
                r += n;
            }
        }
        return;
    }
    for (i, o) in rows.enumerate() {
        unpack(kind, &w[o * rb..(o + 1) * rb], un);
        for (r, xr) in x.iter().enumerate() {
            put(i, r, dot(un, *xr));
        }
    }
}

/// `y = W·x` for each `(kind, W, y)` and one input row, all products' rows dealt across threads as one split
/// (`model::spin_pool`, or the current rayon pool) when they are large enough together: q, k and v (or gate
/// and up) cost one hand-off.
pub fn matvec_many(x: &KRows, products: &mut [(KQuant, &[u8], &mut [f32])]) -> Result<(), Q8Error> {
    if x.len() != 1 {
        return Err(Q8Error(format!(
            "q8_k matvec: {} input rows, not one",
            x.len()
        )));
    }
    for (kind, w, y) in products.iter() {
        if w.len() != y.len() * row_bytes(*kind, x.k)? {
            return Err(Q8Error(format!(
                "{kind:?} q8_k matvec: sizes do not agree (w {} bytes for {}x{})",
                w.len(),
                y.len(),
                x.k
            )));
        }
    }
    products_split(x, products);
    Ok(())
}

/// The products of every input row of `x` with each weight, into `[m, n_out]` outputs (`y`'s layout), split
/// as [`matvec_many`] describes. Sizes are the caller's to have checked.
fn products_split(x: &KRows, products: &mut [(KQuant, &[u8], &mut [f32])]) {
    let (k, m) = (x.k, x.len());
    let rows = x.rows();
    let weights: usize = products.iter().map(|(_, _, y)| y.len() / m * k).sum();
    if rayon::current_num_threads() == 1 || weights < PARALLEL_MIN_WEIGHTS {
        let mut un = Unpacked::new(k);
        for (kind, w, y) in products.iter_mut() {
            let (rb, n_out) = (kind.block_bytes() * k / QK_K, y.len() / m);
            // SAFETY: `y` holds `m × n_out` values and is borrowed mutably here.
            unsafe {
                rows_into(
                    *kind,
                    w,
                    rb,
                    0..n_out,
                    &rows,
                    &mut un,
                    y.as_mut_ptr(),
                    (1, n_out),
                )
            };
        }
        return;
    }
    let parts: Vec<(KQuant, &[u8], usize, SharedSlice<f32>)> = products
        .iter_mut()
        .map(|(kind, w, y)| (*kind, *w, y.len() / m, SharedSlice::new(y)))
        .collect();
    let total: usize = parts.iter().map(|p| p.2.div_ceil(ROWS_PER_ITEM)).sum();
    crate::model::spin_pool::for_each_range(total, |items| {
        let mut un = Unpacked::new(k);
        let mut first = 0;
        for (kind, w, n_out, y) in &parts {
            let count = n_out.div_ceil(ROWS_PER_ITEM);
            let (a, b) = (
                items.start.clamp(first, first + count) - first,
                items.end.clamp(first, first + count) - first,
            );
            first += count;
            if a < b {
                let o = a * ROWS_PER_ITEM..(b * ROWS_PER_ITEM).min(*n_out);
                let rb = kind.block_bytes() * k / QK_K;
                // SAFETY: `products` borrows every `y` (`m × n_out` values) mutably for this whole call, and item
                // ranges are disjoint, so these weight rows' outputs (their columns) are written by this range
                // alone.
                unsafe {
                    let out = y.as_ptr().add(o.start);
                    rows_into(*kind, w, rb, o, &rows, &mut un, out, (1, *n_out));
                }
            }
        }
    });
}

/// `y[r][o] = Σ_k x[r][k] · W[o][k]` for a row-major `kind` weight `[n_out, k]` given as its GGUF bytes, on
/// activations already quantized (`m` rows); `y` is `m × n_out`. Weight rows are split across threads, each
/// unpacked once for all input rows.
pub fn matmul(
    kind: KQuant,
    w: &[u8],
    n_out: usize,
    x: &KRows,
    y: &mut [f32],
) -> Result<(), Q8Error> {
    let (k, m) = (x.k, x.len());
    let rb = row_bytes(kind, k)?;
    if w.len() != n_out * rb || y.len() != m * n_out {
        return Err(Q8Error(format!(
            "{kind:?} q8_k product: sizes do not agree (w {} bytes for {n_out}x{k}, y {}, m {m})",
            w.len(),
            y.len()
        )));
    }
    products_split(x, &mut [(kind, w, y)]);
    Ok(())
}

/// The most [`matmul`]'s output for input row `x` may differ from `Σ x·w` over the dequantized weight row `w`,
/// from the activations' rounding alone: each value moves by at most half its 256-block's step
/// (`max |x| / 127`), times `|w|`, plus a relative 2⁻²⁰ of the step for the reciprocal it is scaled by. Float
/// summation adds a relative `1e-5`-order term on top, which callers allow for.
pub fn error_bound(x: &[f32], w: &[f32]) -> f32 {
    x.chunks_exact(QK_K)
        .zip(w.chunks_exact(QK_K))
        .map(|(xb, wb)| {
            let step = xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            step * (0.5 + 1.0 / 1048576.0) * wb.iter().map(|v| v.abs()).sum::<f32>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::q8::test_support::{
        bound_inputs, check_bound_not_vacuous, check_product, dense, inputs, weights,
    };
    use candle_core::quantized::GgmlDType;

    const TYPES: [GgmlDType; 3] = [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K];

    /// Each type's product equals the f32 product of its dequantized weights within [`error_bound`] (plus
    /// 1e-5 of `Σ|x·w|` for float order), for one and several input rows, single-threaded and split across a
    /// pool (bit for bit); one stage of several products gives each what it gives alone.
    #[test]
    fn products_match_the_dequantized_weights() {
        let (n, k) = (300, 512);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for dtype in TYPES {
            let kind = KQuant::of(dtype).unwrap();
            let q = weights(n, k, dtype);
            let dense = dense(&q);
            let bytes = q.data().unwrap();
            for m in [1, 5] {
                let x = inputs(m, k);
                let xq = KRows::new(&x, k).unwrap();
                let mut y = vec![f32::NAN; m * n];
                matmul(kind, &bytes, n, &xq, &mut y).unwrap();
                let mut split = vec![f32::NAN; m * n];
                pool.install(|| matmul(kind, &bytes, n, &xq, &mut split).unwrap());
                check_product(dtype, (&x, k), &dense, &y, &split, error_bound);
            }
            let x = inputs(1, k);
            let xq = KRows::new(&x, k).unwrap();
            let half = n / 2 * kind.block_bytes() * k / QK_K;
            let (mut a, mut b) = (vec![0f32; n / 2], vec![0f32; n - n / 2]);
            pool.install(|| {
                matvec_many(
                    &xq,
                    &mut [
                        (kind, &bytes[..half], &mut a),
                        (kind, &bytes[half..], &mut b),
                    ],
                )
                .unwrap()
            });
            let mut whole = vec![0f32; n];
            matmul(kind, &bytes, n, &xq, &mut whole).unwrap();
            let joined: Vec<u32> = a.iter().chain(&b).map(|v| v.to_bits()).collect();
            let whole: Vec<u32> = whole.iter().map(|v| v.to_bits()).collect();
            assert_eq!(joined, whole, "{dtype:?} matvec_many");
        }
    }

    /// The SIMD dot and unpacking agree with the portable ones (within float order), and the AVX2
    /// quantization with the generic one bit for bit, NaN and infinities included.
    #[test]
    fn simd_and_portable_agree() {
        let k = 512;
        for dtype in TYPES {
            let kind = KQuant::of(dtype).unwrap();
            let q = weights(2, k, dtype);
            let bytes = q.data().unwrap();
            let x = inputs(1, k);
            let xq = KRows::new(&x, k).unwrap();
            let row = xq.rows()[0];
            let (mut a, mut b) = (Unpacked::new(k), Unpacked::new(k));
            unpack(kind, &bytes[..row_bytes(kind, k).unwrap()], &mut a);
            unpack_generic(kind, &bytes[..row_bytes(kind, k).unwrap()], &mut b);
            assert!(a.q == b.q && a.sc == b.sc && a.corr == b.corr && a.d == b.d && a.c == b.c);
            let (s, v) = (dot_scalar(&a, row), dot(&a, row));
            assert!(
                (s - v).abs() <= 1e-5 * s.abs().max(1.0),
                "{dtype:?}: {v} vs {s}"
            );
            #[cfg(target_arch = "x86_64")]
            if crate::model::q8::x86::usable() {
                let mut f = [0f32];
                let wrow = &bytes[..row_bytes(kind, k).unwrap()];
                // SAFETY: the CPU has AVX2 and FMA; one row of `k` weights and one row of `k` values.
                unsafe { fused::dot::<1>(kind, wrow, &[row], &mut f) };
                assert!(
                    (s - f[0]).abs() <= 1e-5 * s.abs().max(1.0),
                    "{dtype:?}: fused {} vs {s}",
                    f[0]
                );
            }
        }
        let mut x = inputs(1, 2 * QK_K);
        x[3] = f32::NAN;
        x[300] = f32::INFINITY;
        let quantized = |simd: bool| {
            let (mut d, mut qs, mut sums) = (vec![0f32; 2], vec![0i8; x.len()], vec![0i16; 32]);
            for (b, xb) in x.chunks_exact(QK_K).enumerate() {
                let (q, s) = (
                    &mut qs[b * QK_K..(b + 1) * QK_K],
                    &mut sums[b * 16..(b + 1) * 16],
                );
                if simd {
                    quantize_block(xb, &mut d[b], q, s);
                } else {
                    quantize_block_generic(xb, &mut d[b], q, s);
                }
            }
            (d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), qs, sums)
        };
        assert_eq!(quantized(true), quantized(false));
    }

    /// The bound is met and not vacuous: rounding the activations does move the product, by less than it.
    #[test]
    fn the_bound_is_met_but_not_vacuous() {
        let k = 256;
        for dtype in TYPES {
            let q = weights(1, k, dtype);
            let dense = dense(&q);
            let x = bound_inputs(k);
            let xq = KRows::new(&x, k).unwrap();
            let mut y = [0f32];
            let kind = KQuant::of(dtype).unwrap();
            matmul(kind, &q.data().unwrap(), 1, &xq, &mut y).unwrap();
            check_bound_not_vacuous(dtype, &x, &dense, y[0], error_bound);
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let xq = KRows::new(&[0f32; 256], 256).unwrap();
        let mut y = [0f32; 1];
        assert!(matmul(KQuant::Q4K, &[0u8; 143], 1, &xq, &mut y).is_err());
        assert!(matmul(KQuant::Q4_0, &[0u8; 144], 8, &xq, &mut [0f32; 8]).is_err());
        assert!(matmul(KQuant::Q6K, &[0u8; 210], 1, &xq, &mut y[..0]).is_err());
        assert!(KRows::new(&[0f32; 128], 128).is_err());
        assert!(matvec_many(&xq, &mut [(KQuant::Q5K, &[0u8; 175], &mut y)]).is_err());
    }
}
