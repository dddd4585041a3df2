//! One query position's attention over the key/value cache, as plain loops over the cache's slices: the
//! decode step's attention.

use candle_core::{CpuStorage, Device, Tensor};

use super::lora_rows::{FactorValue, dot};
use super::with_f32_slice;
use crate::model::Result;

/// One query position against the cached keys and values, as plain loops over the cache's slices: at decode the
/// products are 1×64 by 64×t per head, where the general matmul's packing and dispatch cost more than the math.
/// `q`: `[b, nh, 1, hd]`; `k`, `v`: `[b, nkv, t, hd]` with unit stride along `hd` (the cache's narrowed buffers).
/// `None` when a layout does not fit: the caller takes the general path. Returns `[b, 1, nh·hd]`, as the general
/// path does. The cache may hold f32 or f16 (see [`KvPrecision`](super::KvPrecision)).
pub(super) fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: usize,
) -> Result<Option<Tensor>> {
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
pub(super) fn attend_cached(
    qd: &[f32],
    k: &Tensor,
    v: &Tensor,
    g: usize,
    out: &mut [f32],
) -> Option<()> {
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
        if crate::model::q8::avx2_usable() && std::is_x86_feature_detected!("f16c") {
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
        // own spends more on summing its lanes than on the 64 products.
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
/// rows: adding each row into `o` in memory would make every row a load and a store of `o` per head. Each
/// column still adds its rows in order, one FMA per row, so the sums are bit-identical to that row-at-a-time
/// loop.
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
