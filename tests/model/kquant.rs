//! Models stored as Q4_0, Q4_K, Q5_K and Q6_K against the f32 route on the same weight values (forward,
//! and the training backward through the int8 transpose), and `Requantize::Q8_0` at load.

use crate::train_util;
use crate::util::{is_child, prefill_and_decode, rerun_with};

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use hearth::model::transformer::Weight;
use hearth::model::{
    Arch, GgufFile, LoraConfig, LoraSet, LoraTarget, QLinear, Requantize, TinySpec, Transformer,
    write_tiny_model,
};
use train_util::with_random_b;

const TYPES: [GgmlDType; 4] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// A tiny Llama whose rows fill whole 256-weight K-quant blocks.
fn write(dir: &std::path::Path, dtype: GgmlDType) -> std::path::PathBuf {
    let mut spec = TinySpec::new(Arch::Llama);
    spec.hidden_size = 256;
    spec.intermediate_size = 512;
    spec.head_dim = 64;
    spec.dtype = dtype;
    let path = dir.join(format!("{dtype:?}.gguf"));
    write_tiny_model(&path, &spec).unwrap();
    path
}

fn load(path: &std::path::Path, requantize: Requantize) -> Transformer {
    let mut g = GgufFile::open(path).unwrap();
    Transformer::from_gguf_file_with(&mut g, requantize).unwrap()
}

/// `|a - b| / |b|` over all values.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let d: f32 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f32>();
    let n: f32 = b.iter().map(|y| y * y).sum::<f32>();
    (d / n).sqrt()
}

/// `rows` input rows spread over signs, and what `lin` gives for them.
fn forward_rows(lin: &QLinear, rows: usize) -> (Vec<f32>, Vec<f32>) {
    let k = lin.in_features();
    let x: Vec<f32> = (0..rows * k)
        .map(|i| ((i * 7919 % 211) as f32 - 105.0) / 37.0)
        .collect();
    let t = Tensor::from_vec(x.clone(), (rows, k), &Device::Cpu).unwrap();
    let y = lin.forward(&t, None).unwrap().flatten_all().unwrap();
    (x, y.to_vec1().unwrap())
}

/// The GGUF type a weight keeps, packed as in the file or in panels; `None` for dense.
fn stored_type(w: &Weight) -> Option<GgmlDType> {
    match w {
        Weight::Quant(q) => Some(q.dtype()),
        Weight::Panels(p) => Some(p.dtype()),
        Weight::Dense(_) => None,
    }
}

fn first_q(m: &Transformer) -> &Weight {
    m.blocks()[0].linear(LoraTarget::Q).weight()
}

/// Each type, kept packed, computes the model its dequantized weights define (every weight dense f32) within
/// the activations' int8 rounding, in prefill and in decode steps. A wrong scale, sub-block order or minimum
/// moves the logits by far more than that.
#[test]
fn kquant_models_match_their_dequantized_weights() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in TYPES {
        let m = load(&write(dir.path(), dtype), Requantize::Off);
        assert_eq!(stored_type(first_q(&m)), Some(dtype));
        let dense = m.merged(None).unwrap();
        for (step, (a, b)) in prefill_and_decode(&m)
            .iter()
            .zip(&prefill_and_decode(&dense))
            .enumerate()
        {
            let d = rel_diff(a, b);
            // Q4_0 and Q4_K go through panels where the CPU has them (activations rounded per 32; elsewhere
            // Q4_0 through candle's path), the other K-quants through `q8k` (activations rounded per 256).
            assert!(d < 0.05, "{dtype:?} step {step}: relative difference {d}");
        }
    }
}

/// `Requantize::Q8_0` re-encodes every K-quant weight as Q8_0 (panels where the CPU has their kernel) and
/// computes the same model within the requantization's rounding; `Off` keeps the file's types.
#[test]
fn requantize_at_load_re_encodes_as_q8_0() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
        let path = write(dir.path(), dtype);
        let (native, re) = (load(&path, Requantize::Off), load(&path, Requantize::Q8_0));
        assert_eq!(stored_type(first_q(&native)), Some(dtype));
        for m in re.blocks() {
            for t in LoraTarget::ALL {
                let q8 = stored_type(m.linear(t).weight()) == Some(GgmlDType::Q8_0);
                assert!(q8, "{dtype:?} {t:?} not Q8_0 after requantize");
            }
        }
        for (step, (a, b)) in prefill_and_decode(&re)
            .iter()
            .zip(&prefill_and_decode(&native))
            .enumerate()
        {
            let d = rel_diff(a, b);
            assert!(d < 0.05, "{dtype:?} step {step}: relative difference {d}");
            assert!(
                d > 0.0,
                "{dtype:?} step {step}: requantized logits are the file's"
            );
        }
    }
}

/// Training a few rows through K-quant layers (below the rows from which the weight is dequantized for the
/// call) multiplies the backward in int8, by the weight's transpose dequantized once and quantized to Q8_0
/// along the output axis. The LoRA gradients agree with the exact f32 route on the same weight values
/// within that rounding, for every tensor.
#[test]
fn kquant_backward_matches_the_f32_route() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
        let m = load(&write(dir.path(), dtype), Requantize::Off);
        let dense = m.merged(None).unwrap();
        let fresh = LoraSet::fresh(&m, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 1).unwrap();
        let adapter = with_random_b(&fresh, 2);
        let len = 8;
        let (int8, exact) = (
            train_util::adapter_grads(&m, &adapter, len),
            train_util::adapter_grads(&dense, &adapter, len),
        );
        for ((name, a), (_, b)) in int8.iter().zip(&exact) {
            assert!(b.iter().any(|v| *v != 0.0), "{dtype:?} {name}: no gradient");
            let d = rel_diff(a, b);
            assert!(d <= 0.08, "{dtype:?} {name}: relative difference {d}");
        }
    }
}

/// Q4_K, Q5_K and Q6_K layers multiply through `q8k`'s kernel on Q8_K activations, in prefill (many rows) and
/// decode (one row), except Q4_K where the CPU has the panels' kernel (on Q8_0 activations): a layer's
/// output is that kernel's, bit for bit.
#[test]
fn kquant_layers_take_their_int8_kernel() {
    use hearth::model::q8::kquant::KQuant;
    use hearth::model::q8::{QuantizedRows, matmul_panels, panels_usable, q8k};
    let dir = tempfile::tempdir().unwrap();
    for dtype in [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K] {
        let m = load(&write(dir.path(), dtype), Requantize::Off);
        let lin = m.blocks()[0].linear(LoraTarget::Up);
        let (n_out, k) = (lin.out_features(), lin.in_features());
        for rows in [1, 20] {
            let (x, got) = forward_rows(lin, rows);
            let mut want = vec![0f32; rows * n_out];
            match lin.weight() {
                Weight::Quant(q) => {
                    assert!(dtype != GgmlDType::Q4K || !panels_usable());
                    let xq = q8k::KRows::new(&x, k).unwrap();
                    let kind = KQuant::of(dtype).unwrap();
                    q8k::matmul(kind, &q.data().unwrap(), n_out, &xq, &mut want).unwrap();
                }
                Weight::Panels(p) => {
                    assert!(dtype == GgmlDType::Q4K && panels_usable());
                    let xq = QuantizedRows::new(&x, k).unwrap();
                    matmul_panels(p, &xq, &mut want).unwrap();
                }
                Weight::Dense(_) => panic!("{dtype:?}: not kept packed"),
            }
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dtype:?} rows={rows}");
        }
    }
}

/// A fresh adapter (B = 0) on a K-quant model leaves its logits exactly the base's, through the fused
/// decode path (one row), the small-batch path (three) and the candle-op path (seven).
#[test]
fn kquant_zero_b_adapter_is_the_base() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
        let m = load(&write(dir.path(), dtype), Requantize::Off);
        let set = LoraSet::fresh(&m, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 3).unwrap();
        for len in [1, 3, 7] {
            let ids: Vec<u32> = (0..len).map(|i| (i * 37 % 200) as u32 + 1).collect();
            let t = Tensor::from_vec(ids, (1, len), &Device::Cpu).unwrap();
            let run = |lora| -> Vec<f32> {
                let mut cache = m.new_cache();
                m.forward(&t, Some(&mut cache), lora)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            };
            let (base, with) = (run(None), run(Some(&set)));
            // `==`: bitwise except that +0 and -0 compare equal.
            assert!(
                base.iter().zip(&with).all(|(a, b)| a == b),
                "{dtype:?} len={len}"
            );
        }
    }
}

/// `HEARTH_KQUANT_FORWARD=candle` (read once per process, for benchmarks that compare both paths in one
/// build) leaves the K-quants' forward to candle: this test reruns itself in a child process with the
/// variable set, where a 20-row product must differ from the Q8_K kernel's (candle dequantizes to f32 there).
#[test]
fn kquant_forward_switch_leaves_the_kquants_to_candle() {
    use hearth::model::q8::kquant::KQuant;
    use hearth::model::q8::q8k;
    const VAR: &str = "HEARTH_KQUANT_FORWARD";
    if !is_child(VAR, "candle") {
        rerun_with(
            "kquant::kquant_forward_switch_leaves_the_kquants_to_candle",
            VAR,
            "candle",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = load(&write(dir.path(), GgmlDType::Q6K), Requantize::Off);
    let lin = m.blocks()[0].linear(LoraTarget::Up);
    let Weight::Quant(q) = lin.weight() else {
        panic!("Q6_K: not kept packed");
    };
    let (rows, n_out, k) = (20, lin.out_features(), lin.in_features());
    let (x, got) = forward_rows(lin, rows);
    let mut kernel = vec![0f32; rows * n_out];
    let xq = q8k::KRows::new(&x, k).unwrap();
    q8k::matmul(KQuant::Q6K, &q.data().unwrap(), n_out, &xq, &mut kernel).unwrap();
    let same = got
        .iter()
        .zip(&kernel)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    let diff = rel_diff(&got, &kernel);
    assert!(
        !same && diff < 2e-2,
        "bitwise the kernel's: {same}, relative difference {diff}"
    );
}
