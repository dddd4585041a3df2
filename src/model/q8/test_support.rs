//! Weights, inputs and the product check shared by the int8 kernels' unit tests ([`super::kquant`],
//! [`super::q8k`]).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// `n × k` weights spread over signs and magnitudes, quantized by candle to `dtype`.
pub(super) fn weights(n: usize, k: usize, dtype: GgmlDType) -> QTensor {
    let w: Vec<f32> = (0..n * k)
        .map(|i| (((i * 7919) % 509) as f32 - 254.0) / 97.0 * (1.0 + (i % 13) as f32 / 5.0))
        .collect();
    QTensor::quantize(&Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap(), dtype).unwrap()
}

/// `q` dequantized by candle, row-major.
pub(super) fn dense(q: &QTensor) -> Vec<f32> {
    q.dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// `m × k` activations with outliers in every block.
pub(super) fn inputs(m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| match i % 7 {
            0 => -3.0,
            1 => 2.5,
            _ => ((i * 104729 % 97) as f32 - 48.0) / 17.0,
        })
        .collect()
}

/// `y` (`m × n`, from inputs `x`) is the f32 product with the dequantized weights `dense` within `bound` (plus
/// 1e-5 of `Σ|x·w|` for float order), and `split` (the same product across a pool) is `y` bit for bit.
pub(super) fn check_product(
    dtype: GgmlDType,
    (x, k): (&[f32], usize),
    dense: &[f32],
    y: &[f32],
    split: &[f32],
    bound: impl Fn(&[f32], &[f32]) -> f32,
) {
    let (m, n) = (x.len() / k, dense.len() / k);
    for r in 0..m {
        let xr = &x[r * k..(r + 1) * k];
        for o in 0..n {
            let wr = &dense[o * k..(o + 1) * k];
            let want: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
            let norm: f32 = xr.iter().zip(wr).map(|(a, b)| (a * b).abs()).sum();
            let bound = bound(xr, wr) + 1e-5 * norm;
            let got = y[r * n + o];
            assert!(
                (got - want).abs() <= bound,
                "{dtype:?} m={m} [{r}][{o}]: {got} vs {want}, bound {bound}"
            );
            assert_eq!(
                got.to_bits(),
                split[r * n + o].to_bits(),
                "{dtype:?} split [{r}][{o}]"
            );
        }
    }
}

/// The activation rounding's bound is met and not vacuous for one `k`-weight row of `dtype`: rounding moves
/// the product (`y`, from `x` as the kernel rounds it), by less than the bound, itself under 5% of `Σ|x·w|`.
pub(super) fn check_bound_not_vacuous(
    dtype: GgmlDType,
    x: &[f32],
    dense: &[f32],
    y: f32,
    bound: impl Fn(&[f32], &[f32]) -> f32,
) {
    let want: f32 = x.iter().zip(dense).map(|(a, b)| a * b).sum();
    let bound = bound(x, dense);
    assert!((y - want).abs() <= bound, "{dtype:?}");
    assert!(y != want, "{dtype:?}: no rounding at all");
    let norm: f32 = x.iter().zip(dense).map(|(a, b)| (a * b).abs()).sum();
    assert!(bound < 0.05 * norm, "{dtype:?}");
}

/// One row of `k` activations for [`check_bound_not_vacuous`].
pub(super) fn bound_inputs(k: usize) -> Vec<f32> {
    (0..k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0)
        .collect()
}
