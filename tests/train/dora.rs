//! DoRA: `W' = m ⊙ (W + scale·B·A) / ‖W + scale·B·A‖_row`, trained over the frozen quantized base and saved in
//! PEFT's layout (`lora_magnitude_vector`, `use_dora: true`). A fresh DoRA adapter is exactly the base; the
//! forward matches an independent f64 computation; every A, B and magnitude gets a gradient; a trained delta
//! round-trips through the PEFT files and has no llama.cpp export.

use crate::train_util;

use candle_core::{DType, Device, Tensor};
use hearth::model::{LoraPair, LoraSet, LoraTarget, QLinear};
use hearth::train::{LoraTrainer, Provenance, TrainConfig, save_delta};
use train_util::*;

fn dora_cfg() -> TrainConfig {
    TrainConfig {
        dora: true,
        ..fast_cfg()
    }
}

fn logits(m: &hearth::model::Transformer, ids: &[u32], set: Option<&LoraSet>) -> Vec<f32> {
    m.forward_ids(ids, None, set)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn vec2(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
}

#[test]
fn a_fresh_dora_adapter_is_exactly_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, _) = tiny(dir.path());
    let set = LoraSet::fresh(&m, dora_cfg().lora_config(), 3).unwrap();
    assert!(set.iter().all(|(_, p)| p.magnitude.is_some()));
    // Short (decode kernel path) and long (dequantized prefill path) inputs.
    for len in [3usize, 20] {
        let ids: Vec<u32> = (0..len as u32).map(|i| 5 + i % 40).collect();
        assert_eq!(
            logits(&m, &ids, Some(&set)),
            logits(&m, &ids, None),
            "{len} tokens"
        );
    }
}

/// One layer, against f64 loops written here: y = f ⊙ (W·x + s·B·(A·x)), f = m / ‖W + s·B·A‖_row. On an f32
/// weight to 1e-5; on the Q8_0 weights of the tiny model to the activation's int8 rounding.
#[test]
fn the_dora_forward_matches_an_independent_computation() {
    let dir = tempfile::tempdir().unwrap();
    let (_, model, _) = tiny(dir.path());
    let (out_f, in_f, r) = (24usize, 64usize, 4usize);
    let dev = Device::Cpu;
    let reference = |w: &Tensor, p: &LoraPair, x: &Tensor| -> Vec<Vec<f64>> {
        let (w, a, b, x) = (vec2(w), vec2(&p.a), vec2(&p.b), vec2(x));
        let m: Vec<f64> = p
            .magnitude
            .as_ref()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1()
            .unwrap();
        let (out_f, in_f) = (w.len(), w[0].len());
        let adapted: Vec<Vec<f64>> = (0..out_f)
            .map(|o| {
                (0..in_f)
                    .map(|i| {
                        w[o][i] + p.scale * (0..a.len()).map(|j| b[o][j] * a[j][i]).sum::<f64>()
                    })
                    .collect()
            })
            .collect();
        let f: Vec<f64> = adapted
            .iter()
            .zip(&m)
            .map(|(row, m)| m / row.iter().map(|v| v * v).sum::<f64>().sqrt())
            .collect();
        x.iter()
            .map(|xr| {
                (0..out_f)
                    .map(|o| f[o] * adapted[o].iter().zip(xr).map(|(w, x)| w * x).sum::<f64>())
                    .collect()
            })
            .collect()
    };
    let check = |lin: &QLinear, w: &Tensor, tol: f64| {
        let (out_f, in_f) = w.dims2().unwrap();
        let a = Tensor::randn(0f32, 0.2, (r, in_f), &dev).unwrap();
        let b = Tensor::randn(0f32, 0.2, (out_f, r), &dev).unwrap();
        let norms = w.sqr().unwrap().sum(1).unwrap().sqrt().unwrap();
        let jitter = Tensor::randn(1f32, 0.1, out_f, &dev).unwrap();
        let pair = LoraPair::with_magnitude(a, b, 1.5, Some((norms * jitter).unwrap()));
        for rows in [1usize, 3, 20] {
            let x = Tensor::randn(0f32, 1.0, (rows, in_f), &dev).unwrap();
            let got = vec2(&lin.forward(&x, Some(&pair)).unwrap());
            let want = reference(w, &pair, &x);
            let scale = want.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
            for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                assert!((g - w).abs() <= tol * scale, "{rows} rows: {g} vs {w}");
            }
        }
    };
    let w = Tensor::randn(0f32, 0.5, (out_f, in_f), &dev).unwrap();
    check(&QLinear::from_dense(w.clone()).unwrap(), &w, 1e-5);
    for t in LoraTarget::ALL {
        let lin = model.blocks()[1].linear(t);
        check(lin, &lin.dequantize().unwrap(), 2e-2);
    }
}

#[test]
fn every_dora_tensor_gets_a_nonzero_gradient() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let names = nonzero_gradients_after_one_step(&m, &tok, dora_cfg());
    assert_eq!(
        names.len(),
        3 * 7 * m.blocks().len(),
        "A, B and a magnitude per projection"
    );
    let magnitudes = names
        .iter()
        .filter(|k| k.ends_with("lora_magnitude_vector"))
        .count();
    assert_eq!(magnitudes, 7 * m.blocks().len());
}

#[test]
fn a_trained_dora_delta_round_trips_in_peft_layout_without_a_llama_cpp_export() {
    let dir = tempfile::tempdir().unwrap();
    let (base, m, tok) = tiny(dir.path());
    let mut tr = LoraTrainer::new(&m, &tok, dora_cfg(), None).unwrap();
    tr.train_cycle(&mixed(), |_| {}).unwrap();
    let adapter = tr.adapter().unwrap();
    let fresh = LoraSet::fresh(&m, dora_cfg().lora_config(), dora_cfg().seed).unwrap();
    // The magnitudes moved away from ‖W‖_row.
    let moved = adapter.iter().zip(fresh.iter()).any(|((_, p), (_, q))| {
        let d = (p.magnitude.as_ref().unwrap() - q.magnitude.as_ref().unwrap()).unwrap();
        d.abs().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap() > 0.0
    });
    assert!(moved, "training left every magnitude at its initial value");
    let prov = Provenance {
        delta_id: String::new(),
        base_sha256: hearth::train::sha256_file(&base).unwrap(),
        recipe_sha256: String::new(),
        recipe: dora_cfg(),
        data_digest: String::new(),
        num_samples: 6,
        parent: None,
        seed: 1,
        metrics: serde_json::json!({}),
        created_at_unix_ms: 0,
    };
    let delta = save_delta(&dir.path().join("deltas"), &adapter, m.config(), prov).unwrap();
    let ddir = std::path::Path::new(&delta.path);
    assert!(
        !ddir.join("adapter.gguf").exists(),
        "llama.cpp cannot load DoRA"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ddir.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(config["use_dora"], true);
    let bytes = std::fs::read(ddir.join("adapter_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let q = "base_model.model.model.layers.0.self_attn.q_proj";
    let mag = st.tensor(&format!("{q}.lora_magnitude_vector")).unwrap();
    assert_eq!(mag.shape(), &[m.config().num_heads * m.config().head_dim]);
    assert_eq!(mag.dtype(), safetensors::Dtype::BF16);
    assert_eq!(st.tensors().len(), 3 * 7 * m.blocks().len());

    // Loaded back, it gives the saved adapter's logits (bf16 rounding of the files aside: compare with the
    // adapter rounded the same way).
    let loaded = LoraSet::load_peft(ddir, m.config()).unwrap();
    let mut rounded = LoraSet::empty(adapter.config.clone());
    for (&(l, t), p) in adapter.iter() {
        let r = |x: &Tensor| {
            x.to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
        };
        rounded.insert(
            l,
            t,
            LoraPair::with_magnitude(r(&p.a), r(&p.b), p.scale, p.magnitude.as_ref().map(r)),
        );
    }
    let ids: Vec<u32> = (0..12).map(|i| 7 + i).collect();
    assert_eq!(
        logits(&m, &ids, Some(&loaded)),
        logits(&m, &ids, Some(&rounded))
    );
    assert_ne!(logits(&m, &ids, Some(&loaded)), logits(&m, &ids, None));
    // The merged model (W' computed once) agrees with the unmerged forward over the same dense f32 base (the
    // model merged without an adapter), so int8 rounding of the Q8_0 path plays no part in the comparison.
    let merged = m.merged(Some(&loaded)).unwrap();
    let dense = m.merged(None).unwrap();
    let (a, b) = (
        logits(&merged, &ids, None),
        logits(&dense, &ids, Some(&loaded)),
    );
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x - y).abs() <= 1e-4 * scale,
            "merged {x} vs unmerged {y}, scale {scale}"
        );
    }
    // llama.cpp's format cannot hold it: a clear refusal.
    let e = loaded
        .save_gguf(dir.path().join("x.gguf"), m.config())
        .unwrap_err()
        .to_string();
    assert!(e.contains("DoRA"), "{e}");
    // A recipe of the other kind cannot continue from it.
    let e = LoraTrainer::new(&m, &tok, fast_cfg(), Some(&loaded))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("DoRA"), "{e}");
}
