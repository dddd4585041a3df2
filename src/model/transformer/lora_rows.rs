//! LoRA deltas added to plain f32 rows, for decode steps and small batches, where candle's ops cost more than
//! the math.

use super::with_f32_slice;
use crate::model::lora::LoraPair;

/// Adds `scale·B·(A·x)` to each row of `y` (`n × out`) in place; `None` (nothing added) if a factor is not
/// contiguous f32 on CPU or the shapes disagree. Exact zeros are not added, so a fresh adapter (B = 0) leaves
/// `y` bitwise unchanged (even its −0.0s).
pub(super) fn add_lora_rows(x: &[f32], p: &LoraPair, y: &mut [f32]) -> Option<()> {
    let (r, inp) = p.a.dims2().ok()?;
    let (out, b_r) = p.b.dims2().ok()?;
    if b_r != r || !x.len().is_multiple_of(inp.max(1)) || y.len() != x.len() / inp.max(1) * out {
        return None;
    }
    // Callers run this only for pairs that do not train (decode, small batches), so the factors may be cached.
    let f = p
        .decode_factors
        .get_or_init(|| {
            let a = with_f32_slice(&p.a, |a| a.to_vec())?;
            let b_by_rank = with_f32_slice(&p.b, |b| {
                let mut t = vec![0f32; b.len()];
                for (o, row) in b.chunks_exact(r.max(1)).enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        t[j * out + o] = v;
                    }
                }
                t
            })?;
            Some(DecodeFactors {
                a: DecodeFactor::new(a),
                b_by_rank: DecodeFactor::new(b_by_rank),
            })
        })
        .as_ref()?;
    let (scale, shape) = (p.scale as f32, (r, inp, out));
    // Rows are independent: a prefill's rows split across threads, a decode step's row runs here.
    let run = |x: &[f32], y: &mut [f32]| {
        use DecodeFactor::{Bf16, F32};
        match (&f.a, &f.b_by_rank) {
            (F32(a), F32(b)) => lora_rows_dispatch(&LoraRows { a, b, shape, scale }, x, y),
            (F32(a), Bf16(b)) => lora_rows_dispatch(&LoraRows { a, b, shape, scale }, x, y),
            (Bf16(a), F32(b)) => lora_rows_dispatch(&LoraRows { a, b, shape, scale }, x, y),
            (Bf16(a), Bf16(b)) => lora_rows_dispatch(&LoraRows { a, b, shape, scale }, x, y),
        }
    };
    let rows = y.len() / out.max(1);
    if rows < LORA_PARALLEL_ROWS {
        run(x, y);
    } else {
        crate::model::spin_pool::items_mut(y, out.max(1), |first, part| {
            let n = part.len() / out.max(1);
            run(&x[first * inp..(first + n) * inp], part)
        });
    }
    Some(())
}

/// From this many rows [`add_lora_rows`] splits its rows across threads.
const LORA_PARALLEL_ROWS: usize = 16;

/// A LoRA pair's `A` (`[r, in]`) and transposed `B` (`[r, out]`) as the decode loops read them.
#[derive(Debug)]
pub(crate) struct DecodeFactors {
    a: DecodeFactor,
    b_by_rank: DecodeFactor,
}

/// One factor in bf16 when every value is exactly a bf16 (adapters load from PEFT files in bf16), halving the
/// bytes each token reads (a rank-8 SmolLM2 adapter on all projections is ~10 MB in f32, 7% on top of the
/// weights), else in f32. Widening bf16 is exact, so the sums are the same either way.
#[derive(Debug)]
enum DecodeFactor {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl DecodeFactor {
    fn new(v: Vec<f32>) -> Self {
        if v.iter().all(|x| x.to_bits() & 0xffff == 0) {
            Self::Bf16(v.iter().map(|x| (x.to_bits() >> 16) as u16).collect())
        } else {
            Self::F32(v)
        }
    }
}

/// A stored factor value: f32, or bf16 as its upper 16 bits.
pub(super) trait FactorValue: Copy {
    fn widen(self) -> f32;
}

impl FactorValue for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl FactorValue for u16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }
}

/// One pair's factors as slices, for [`lora_rows`].
struct LoraRows<'a, A, B> {
    a: &'a [A],
    /// `B` transposed, `[r, out]`.
    b: &'a [B],
    /// `(r, in, out)`.
    shape: (usize, usize, usize),
    scale: f32,
}

/// [`lora_rows`] compiled for AVX2 and FMA when the CPU has them, else portable.
fn lora_rows_dispatch<A: FactorValue, B: FactorValue>(
    p: &LoraRows<A, B>,
    x: &[f32],
    y: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::model::q8::avx2_usable() {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { lora_rows_avx2(p, x, y) };
        }
    }
    lora_rows(p, x, y)
}

/// [`lora_rows`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn lora_rows_avx2<A: FactorValue, B: FactorValue>(
    p: &LoraRows<A, B>,
    x: &[f32],
    y: &mut [f32],
) {
    lora_rows(p, x, y)
}

/// `B·(A·x)` as `r` updates of a contiguous `out`-long row each: a length-`r` dot per output (the obvious
/// loop) spent most of its time summing 8 lanes for 8 products. For each output the products are summed in
/// rank order from zero, as that dot did for r = 8.
#[inline(always)]
fn lora_rows<A: FactorValue, B: FactorValue>(p: &LoraRows<A, B>, x: &[f32], y: &mut [f32]) {
    let (r, inp, out) = p.shape;
    let mut ax = vec![0f32; r];
    let mut d = vec![0f32; out];
    for (row, yrow) in x.chunks_exact(inp).zip(y.chunks_exact_mut(out)) {
        for (j, axj) in ax.iter_mut().enumerate() {
            *axj = p.scale * dot(&p.a[j * inp..(j + 1) * inp], row);
        }
        d.fill(0.0);
        for (&axj, b) in ax.iter().zip(p.b.chunks_exact(out.max(1))) {
            for (dv, &bv) in d.iter_mut().zip(b) {
                *dv += bv.widen() * axj;
            }
        }
        for (yv, &dv) in yrow.iter_mut().zip(&d) {
            if dv != 0.0 {
                *yv += dv;
            }
        }
    }
}

/// A dot product in eight lanes, so it vectorizes without reassociating one long sum. Always inlined, so it
/// takes the target features of the loop it sits in.
#[inline(always)]
pub(super) fn dot<A: FactorValue>(a: &[A], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x.widen() * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i].widen() * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}
