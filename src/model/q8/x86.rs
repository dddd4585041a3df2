//! The x86_64 kernels of [`super`]: AVX2, AVX-VNNI and AVX-512 VNNI, each behind a CPU feature check.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{BLOCK_BYTES, OutLayout, QK8_0, QuantRow, ROW_GROUP};

/// [`super::quantize_row_into`] compiled with AVX2.
///
/// # Safety
/// AVX2 and FMA are available.
/// The compiler kept the generic loop's saturating `as i8` and the block maximum scalar, on a decode step's
/// path; this is the same arithmetic eight lanes wide, bit-exact against the generic loop (tested).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize_row_into(x: &[f32], d: &mut [f32], qs: &mut [i8], offset_fix: &mut [i32]) {
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
            // Plain loops rather than `array::map`, whose closures are compiled as calls.
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
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
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
    n_out: usize,
    b: usize,
    dst: &mut [u8],
    load: &impl super::TileLoader,
) {
    super::transpose_columns(n_out, b, dst, load)
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

/// The best path this CPU has: AVX-512 VNNI first, since the Q8_0 panels and their gemm need it (a CPU with
/// both encodings, such as Zen 5, would otherwise never use them), then AVX-VNNI, then AVX2.
/// `HEARTH_Q8_KERNEL=avx2` forces the AVX2 one, so a benchmark can compare the two in one build.
fn isa() -> u8 {
    static ISA: OnceLock<u8> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("HEARTH_Q8_KERNEL").is_ok_and(|v| v == "avx2") {
            AVX2
        } else if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
            AVX512_VNNI
        } else if is_x86_feature_detected!("avxvnni") {
            AVX_VNNI
        } else {
            AVX2
        }
    })
}

/// The name of the int8 dot path [`isa`] chose.
pub fn isa_name() -> &'static str {
    match isa() {
        AVX_VNNI => "avx-vnni",
        AVX512_VNNI => "avx512-vnni",
        _ => "avx2",
    }
}

// The helpers and the loop body are `inline(always)` without target features of their own: inlined into
// the entry points below, they compile with each entry point's features. (A call to a function with
// more features than its caller cannot be inlined: per block, that was a real call.)

/// f32 for every f16 bit pattern (256 KiB, of which a model's scales touch a few KB). A scale then costs a
/// 16-bit load and a broadcast load, where F16C's convert is two more uops on the vector ports that the
/// int8 dot needs.
pub(super) fn f16_table() -> &'static [f32] {
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
unsafe fn gemm_tile<const R: usize>(packed: &[u32], blocks: usize, tile: &[QuantRow], out: Out) {
    // SAFETY: the caller's guarantees bound every read below (block b < blocks of a k-value row, group
    // g < 8 of a 32-value block) and the stores (R rows of `cols` lanes, masked).
    unsafe {
        let pp = packed.as_ptr();
        let xs: [*const i8; R] = std::array::from_fn(|r| tile[r].qs.as_ptr());
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..blocks {
            let pb = pp.add(b * PANEL_BLOCK_WORDS);
            let mut dots: [__m512i; R] =
                std::array::from_fn(|r| _mm512_set1_epi32(*tile[r].offset_fix.get_unchecked(b)));
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
/// poorly, so the group's bytes are prefetched in memory order instead, far enough ahead to cover the
/// memory latency (the distance is not critical).
const PREFETCH_AHEAD: usize = 12 * 1024;

/// Weight rows and input rows of one tile of the many-row path: per block, each weight's
/// [`block_prepare`] serves two input rows and each input block four weight rows, eight accumulators.
const TILE_W: usize = 4;
const TILE_X: usize = 2;

/// The products of `n` weight rows with every input row, in tiles: for one input row (decode), groups of
/// [`ROW_GROUP`] weight rows, eight independent accumulator chains (four are slower) sharing one
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
                    fix[j] =
                        _mm256_zextsi128_si256(_mm_cvtsi32_si128(*x.offset_fix.get_unchecked(b)));
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
                        let s = _mm256_cvtepi32_ps(block_dot::<ISA>(prepared, wv, xv[j], fix[j]));
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
