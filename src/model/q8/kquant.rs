//! Int8 products with Q4_0, Q4_K, Q5_K and Q6_K weights read from their GGUF blocks in place, on activations
//! quantized to Q8_0 ([`QuantizedRows`], one scale per 32 values), so one quantized input serves Q8_0 and
//! K-quant weights alike.
//!
//! Every one of these types is, per 32 weights, small integers with a scale per 16 or 32 of them and, for
//! Q4_K and Q5_K, a subtracted minimum per 32: `w = s·q − m`. A weight row is decoded into that form (`q` as
//! int8 with the type's offset applied, `s` per 16 weights, `m` per 32) and dotted with the activation blocks:
//! `Σ_b dx_b·(s_2b·Σ₀..₁₅ q·x + s_2b+1·Σ₁₆..₃₁ q·x − m_b·Σ x)`. The integer sums are exact and `s`, `m` are the
//! f32 values candle's own dequantization multiplies by, so the result differs from the f32 product of the
//! dequantized weights only by the activations' int8 rounding (see [`error_bound`]) and the order of float
//! additions. Decoding costs about as much as one dot, so a matmul decodes each weight row once for all its
//! input rows. The dot is AVX2 (`maddubs` on |q| and sign(x, q), as the Q8_0 kernel) where the CPU has it,
//! a portable loop elsewhere.

use candle_core::quantized::GgmlDType;

use super::{Q8Error, QK8_0, QuantRow, QuantizedRows};

/// Weights per K-quant super-block.
const QK_K: usize = 256;

/// The block-quantized types this module multiplies natively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KQuant {
    Q4_0,
    Q4K,
    Q5K,
    Q6K,
}

impl KQuant {
    /// The native type of a GGUF tensor type, or `None`.
    pub fn of(dtype: GgmlDType) -> Option<Self> {
        Some(match dtype {
            GgmlDType::Q4_0 => KQuant::Q4_0,
            GgmlDType::Q4K => KQuant::Q4K,
            GgmlDType::Q5K => KQuant::Q5K,
            GgmlDType::Q6K => KQuant::Q6K,
            _ => return None,
        })
    }

    /// Weights per block.
    pub fn block_weights(self) -> usize {
        match self {
            KQuant::Q4_0 => QK8_0,
            _ => QK_K,
        }
    }

    /// Bytes per block, as in the GGUF file.
    pub fn block_bytes(self) -> usize {
        match self {
            KQuant::Q4_0 => 18,
            KQuant::Q4K => 144,
            KQuant::Q5K => 176,
            KQuant::Q6K => 210,
        }
    }

    /// Whether weights carry a subtracted minimum (the activations' block sums enter the product).
    fn has_min(self) -> bool {
        matches!(self, KQuant::Q4K | KQuant::Q5K)
    }
}

/// One weight row decoded for the int8 dot: values `q` (`k`), scales `s` (one per 16 values) and minimums
/// `m` (one per 32 values, all zero for types without one).
struct Decoded {
    q: Vec<i8>,
    s: Vec<f32>,
    m: Vec<f32>,
}

impl Decoded {
    fn new(k: usize) -> Self {
        Decoded {
            q: vec![0; k],
            s: vec![0.0; k / 16],
            m: vec![0.0; k / QK8_0],
        }
    }
}

#[inline(always)]
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Q4_K/Q5_K's packed 6-bit scale and minimum of sub-block `j` (0..8), as llama.cpp's `get_scale_min_k4`.
pub(super) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Decodes one row of `kind` blocks (`bytes`) into `out`.
fn decode_row(kind: KQuant, bytes: &[u8], out: &mut Decoded) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::usable() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { decode_row_avx2(kind, bytes, out) };
    }
    decode_row_generic(kind, bytes, out)
}

/// [`decode_row_generic`] compiled with AVX2, where its per-block loops vectorize.
///
/// # Safety
/// AVX2 and FMA are available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode_row_avx2(kind: KQuant, bytes: &[u8], out: &mut Decoded) {
    decode_row_generic(kind, bytes, out)
}

#[inline(always)]
fn decode_row_generic(kind: KQuant, bytes: &[u8], out: &mut Decoded) {
    let bw = kind.block_weights();
    let blocks = bytes.chunks_exact(kind.block_bytes());
    for (i, b) in blocks.enumerate() {
        let q = &mut out.q[i * bw..(i + 1) * bw];
        let s = &mut out.s[i * bw / 16..(i + 1) * bw / 16];
        let m = &mut out.m[i * bw / QK8_0..(i + 1) * bw / QK8_0];
        match kind {
            KQuant::Q4_0 => {
                let d = f16_at(b, 0);
                let qs = &b[2..18];
                for l in 0..16 {
                    q[l] = (qs[l] & 0xF) as i8 - 8;
                    q[l + 16] = (qs[l] >> 4) as i8 - 8;
                }
                s.fill(d);
            }
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
                        lo[l] = (ql[l] & 0xF) as i8;
                        hi[l] = (ql[l] >> 4) as i8;
                    }
                    if let Some(qh) = qh {
                        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
                        for l in 0..32 {
                            lo[l] += if qh[l] & u1 != 0 { 16 } else { 0 };
                            hi[l] += if qh[l] & u2 != 0 { 16 } else { 0 };
                        }
                    }
                    for h in 0..2 {
                        let (sc, mn) = scale_min_k4(2 * j + h, scales);
                        // As candle's dequantization: `d·sc` and `dmin·m` in f32.
                        s[4 * j + 2 * h..4 * j + 2 * h + 2].fill(d * sc as f32);
                        m[2 * j + h] = dmin * mn as f32;
                    }
                }
            }
            KQuant::Q6K => {
                let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for n in 0..2 {
                    let (ql, qh, q) = (&ql[64 * n..], &qh[32 * n..], &mut q[128 * n..]);
                    for l in 0..32 {
                        let six =
                            |low: u8, shift: u32| (low | (((qh[l] >> shift) & 3) << 4)) as i8 - 32;
                        q[l] = six(ql[l] & 0xF, 0);
                        q[l + 32] = six(ql[l + 32] & 0xF, 2);
                        q[l + 64] = six(ql[l] >> 4, 4);
                        q[l + 96] = six(ql[l + 32] >> 4, 6);
                    }
                }
                for (s, &c) in s.iter_mut().zip(sc) {
                    *s = d * c as i8 as f32;
                }
            }
        }
    }
}

/// The bytes of one row of `k` weights of `kind`, after checking that `k` fills whole blocks.
fn row_bytes(kind: KQuant, k: usize) -> Result<usize, Q8Error> {
    if k == 0 || !k.is_multiple_of(kind.block_weights()) {
        return Err(Q8Error(format!(
            "{kind:?} product: rows of {k} weights are no whole number of {}-weight blocks",
            kind.block_weights()
        )));
    }
    Ok(k / kind.block_weights() * kind.block_bytes())
}

/// `Σ_b dx_b · Σ_{e∈b} x_e` terms' sums per block: `Σ x_q` over block `b` of an activation row, from the
/// offset the VNNI paths keep (`-128 · Σ q`).
fn block_sum(x: &QuantRow, b: usize) -> f32 {
    (-x.offset_fix[b] / 128) as f32
}

/// One decoded weight row dotted with one quantized activation row.
fn dot(kind: KQuant, w: &Decoded, x: &QuantRow) -> f32 {
    #[cfg(target_arch = "x86_64")]
    let mut acc = if super::x86::usable() {
        // SAFETY: the CPU has AVX2 and FMA; `w` and `x` hold the same `k`.
        unsafe { dot_avx2(w, x) }
    } else {
        dot_scalar(w, x)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let mut acc = dot_scalar(w, x);
    if kind.has_min() {
        for (b, &m) in w.m.iter().enumerate() {
            acc -= m * x.d[b] * block_sum(x, b);
        }
    }
    acc
}

/// The scaled integer sums without the minimums' term.
fn dot_scalar(w: &Decoded, x: &QuantRow) -> f32 {
    let mut acc = 0f32;
    for (b, (wq, xq)) in
        w.q.chunks_exact(QK8_0)
            .zip(x.qs.chunks_exact(QK8_0))
            .enumerate()
    {
        let half = |h: usize| -> f32 {
            let r = h * 16..h * 16 + 16;
            let s: i32 = wq[r.clone()]
                .iter()
                .zip(&xq[r])
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum();
            s as f32
        };
        acc += x.d[b] * (w.s[2 * b] * half(0) + w.s[2 * b + 1] * half(1));
    }
    acc
}

/// [`dot_scalar`] eight lanes wide: per block the 32 products pair up into eight i32 sums, the low four over
/// the first 16 values, the high four over the rest, which meet their scales in one vector multiply; the
/// lanes are summed once per row.
///
/// # Safety
/// AVX2 and FMA are available; `w.q` and `x.qs` have the same length, a multiple of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(w: &Decoded, x: &QuantRow) -> f32 {
    use std::arch::x86_64::*;
    let blocks = w.q.len() / QK8_0;
    assert!(x.qs.len() == w.q.len() && x.d.len() >= blocks && w.s.len() >= 2 * blocks);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for b in 0..blocks {
        // SAFETY: block `b` holds 32 values of both rows (asserted above).
        let (wv, xv) = unsafe {
            (
                _mm256_loadu_si256(w.q.as_ptr().add(b * QK8_0).cast()),
                _mm256_loadu_si256(x.qs.as_ptr().add(b * QK8_0).cast()),
            )
        };
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
        let p32 = _mm256_madd_epi16(p16, ones);
        let scale = _mm256_mul_ps(
            _mm256_set_m128(_mm_set1_ps(w.s[2 * b + 1]), _mm_set1_ps(w.s[2 * b])),
            _mm256_set1_ps(x.d[b]),
        );
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), scale, acc);
    }
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// Below this many weights one thread does the whole product: a rayon hand-off costs microseconds.
const PARALLEL_MIN_WEIGHTS: usize = 1 << 16;

/// `y[r][o] = Σ_k x[r][k] · W[o][k]` for a row-major `kind` weight `[n_out, k]` given as its GGUF bytes, on
/// activations already quantized (`m` rows); `y` is `m × n_out`. Weight rows are split across the current
/// rayon pool; each is decoded once for all input rows.
pub fn matmul(
    kind: KQuant,
    w: &[u8],
    n_out: usize,
    x: &QuantizedRows,
    y: &mut [f32],
) -> Result<(), Q8Error> {
    let (k, m) = (x.k, x.len());
    let rb = row_bytes(kind, k)?;
    if w.len() != n_out * rb || y.len() != m * n_out {
        return Err(Q8Error(format!(
            "{kind:?} product: sizes do not agree (w {} bytes for {n_out}x{k}, y {}, m {m})",
            w.len(),
            y.len()
        )));
    }
    let rows = x.rows();
    let one_row = |wrow: &[u8], dec: &mut Decoded, out: &mut [f32]| {
        decode_row(kind, wrow, dec);
        for (o, xr) in out.iter_mut().zip(&rows) {
            *o = dot(kind, dec, xr);
        }
    };
    // Computed output-row major (`[n_out, m]`) so that threads own disjoint slices; that is `y` itself for one
    // input row and is transposed into `y` after for more.
    let mut by_output = if m == 1 {
        Vec::new()
    } else {
        vec![0f32; n_out * m]
    };
    let out: &mut [f32] = if m == 1 { y } else { &mut by_output };
    if n_out * k < PARALLEL_MIN_WEIGHTS || rayon::current_num_threads() == 1 {
        let mut dec = Decoded::new(k);
        for (wrow, o) in w.chunks_exact(rb).zip(out.chunks_exact_mut(m)) {
            one_row(wrow, &mut dec, o);
        }
    } else {
        use rayon::prelude::*;
        let per = n_out.div_ceil(4 * rayon::current_num_threads()).max(1);
        w.par_chunks(per * rb)
            .zip(out.par_chunks_mut(per * m))
            .for_each(|(w, out)| {
                let mut dec = Decoded::new(k);
                for (wrow, o) in w.chunks_exact(rb).zip(out.chunks_exact_mut(m)) {
                    one_row(wrow, &mut dec, o);
                }
            });
    }
    if m > 1 {
        for (o, col) in by_output.chunks_exact(m).enumerate() {
            for (r, &v) in col.iter().enumerate() {
                y[r * n_out + o] = v;
            }
        }
    }
    Ok(())
}

/// The weight row `bytes` (`k` weights of `kind`) as f32, exactly as candle dequantizes it.
pub fn dequantize_row(kind: KQuant, bytes: &[u8], k: usize) -> Result<Vec<f32>, Q8Error> {
    if bytes.len() != row_bytes(kind, k)? {
        return Err(Q8Error(format!(
            "{kind:?} dequantize: {} bytes are not one row of {k} weights",
            bytes.len()
        )));
    }
    let mut dec = Decoded::new(k);
    decode_row(kind, bytes, &mut dec);
    Ok(dec
        .q
        .iter()
        .enumerate()
        .map(|(e, &q)| dec.s[e / 16] * q as f32 - dec.m[e / QK8_0])
        .collect())
}

/// The most [`matmul`]'s output `o` for input row `x` may differ from `Σ x·w` over the dequantized weight
/// row `w`, from the activations' rounding alone: each value moves by at most half its block's step
/// (`amax/127`, so `amax/254`) plus the f16 rounding of that step over up to 127 steps (`127·step·2⁻¹¹`),
/// times `|w|`. Float summation adds a relative `1e-5`-order term on top, which callers allow for.
pub fn error_bound(x: &[f32], w: &[f32]) -> f32 {
    x.chunks_exact(QK8_0)
        .zip(w.chunks_exact(QK8_0))
        .map(|(xb, wb)| {
            let step = xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            let moved = step * (0.5 + 127.0 / 2048.0);
            moved * wb.iter().map(|v| v.abs()).sum::<f32>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::q8::test_support::{
        bound_inputs, check_bound_not_vacuous, check_product, dense, inputs, weights,
    };

    const TYPES: [GgmlDType; 4] = [
        GgmlDType::Q4_0,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ];

    /// Decoding a row gives candle's dequantized values bit for bit, for every native type.
    #[test]
    fn decoding_is_candles_dequantization() {
        let (n, k) = (3, 512);
        for dtype in TYPES {
            let kind = KQuant::of(dtype).unwrap();
            let q = weights(n, k, dtype);
            let want = dense(&q);
            let bytes = q.data().unwrap();
            let rb = row_bytes(kind, k).unwrap();
            for r in 0..n {
                let got = dequantize_row(kind, &bytes[r * rb..(r + 1) * rb], k).unwrap();
                for (e, (a, b)) in got.iter().zip(&want[r * k..(r + 1) * k]).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{dtype:?} row {r} weight {e}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// Each type's product equals the f32 product of its dequantized weights within [`error_bound`] (plus
    /// 1e-5 of `Σ|x·w|` for float order), for one and several input rows, single-threaded and split; and the
    /// SIMD and portable dots agree.
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
                let xq = QuantizedRows::new(&x, k).unwrap();
                let mut y = vec![f32::NAN; m * n];
                matmul(kind, &bytes, n, &xq, &mut y).unwrap();
                let mut split = vec![f32::NAN; m * n];
                pool.install(|| matmul(kind, &bytes, n, &xq, &mut split).unwrap());
                check_product(dtype, (&x, k), &dense, &y, &split, error_bound);
                let rows = xq.rows();
                let mut dec = Decoded::new(k);
                decode_row(kind, &bytes[..row_bytes(kind, k).unwrap()], &mut dec);
                let (a, b) = (dot(kind, &dec, &rows[0]), {
                    let mut s = dot_scalar(&dec, &rows[0]);
                    if kind.has_min() {
                        for (bl, &mn) in dec.m.iter().enumerate() {
                            s -= mn * rows[0].d[bl] * block_sum(&rows[0], bl);
                        }
                    }
                    s
                });
                assert!(
                    (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                    "{dtype:?}: simd {a} vs scalar {b}"
                );
            }
        }
    }

    /// The bound is not loose to the point of meaning nothing: rounding the activations does move the product,
    /// and by less than the bound.
    #[test]
    fn the_bound_is_met_but_not_vacuous() {
        let k = 256;
        let q = weights(1, k, GgmlDType::Q4K);
        let dense = dense(&q);
        let x = bound_inputs(k);
        let xq = QuantizedRows::new(&x, k).unwrap();
        let mut y = [0f32];
        matmul(KQuant::Q4K, &q.data().unwrap(), 1, &xq, &mut y).unwrap();
        check_bound_not_vacuous(GgmlDType::Q4K, &x, &dense, y[0], error_bound);
    }

    #[test]
    fn bad_sizes_are_errors() {
        let xq = QuantizedRows::new(&[0f32; 256], 256).unwrap();
        let mut y = [0f32; 1];
        assert!(matmul(KQuant::Q4K, &[0u8; 143], 1, &xq, &mut y).is_err());
        let xq = QuantizedRows::new(&[0f32; 32], 32).unwrap();
        assert!(matmul(KQuant::Q6K, &[0u8; 210], 1, &xq, &mut y).is_err());
        assert!(matmul(KQuant::Q4_0, &[0u8; 18], 1, &xq, &mut y[..0]).is_err());
    }
}
