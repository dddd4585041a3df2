//! PEFT adapter I/O, hot swapping, and gradients through frozen quantized layers.

use crate::train_util;

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use hearth::model::lora::peft_key;
use hearth::model::{
    AdapterRegistry, Arch, LoraConfig, LoraPair, LoraSet, LoraTarget, TinySpec, Transformer,
    write_tiny_model,
};
use train_util::with_random_b;

fn model(dir: &std::path::Path, arch: Arch, dtype: GgmlDType) -> Transformer {
    let mut spec = TinySpec::new(arch);
    spec.dtype = dtype;
    let p = dir.join("m.gguf");
    write_tiny_model(&p, &spec).unwrap();
    Transformer::from_gguf(&p).unwrap()
}

#[test]
fn peft_save_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path(), Arch::Llama, GgmlDType::Q8_0);
    let mut cfg = LoraConfig::new(8, 16.0, &[LoraTarget::Q, LoraTarget::V, LoraTarget::Down]);
    cfg.base_model_name_or_path = Some("HuggingFaceTB/SmolLM2-135M-Instruct".into());
    let set = with_random_b(&LoraSet::fresh(&m, cfg, 1).unwrap(), 2);
    let out = dir.path().join("adapter");
    set.save_peft(&out, m.config()).unwrap();

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(json["peft_type"], "LORA");
    assert_eq!(json["r"], 8);
    assert_eq!(json["lora_alpha"], 16.0);
    assert_eq!(
        json["target_modules"],
        serde_json::json!(["q_proj", "v_proj", "down_proj"])
    );
    assert_eq!(json["use_rslora"], false);

    let st = candle_core::safetensors::load(out.join("adapter_model.safetensors"), &Device::Cpu)
        .unwrap();
    assert_eq!(st.len(), 2 * 3 * 2);
    let a = &st["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"];
    let b = &st["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"];
    assert_eq!((a.dtype(), a.dims()), (DType::BF16, &[8, 64][..]));
    assert_eq!(b.dims(), &[64, 8]);
    assert_eq!(
        peft_key(1, LoraTarget::Down, true),
        "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"
    );

    // Llama q/k lora_B rows are saved in Hugging Face order: per head, GGUF row 2j+t is HF row
    // t·(d/2)+j (llama.cpp permutes q/k weights so that interleaved RoPE works on GGUF).
    let (hd, heads) = (m.config().head_dim, m.config().num_heads);
    let mem = set
        .get(0, LoraTarget::Q)
        .unwrap()
        .b
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let saved = st["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    for h in 0..heads {
        for j in 0..hd / 2 {
            for t in 0..2 {
                assert_eq!(saved[h * hd + t * (hd / 2) + j], mem[h * hd + 2 * j + t]);
            }
        }
    }
    let v_mem = set
        .get(0, LoraTarget::V)
        .unwrap()
        .b
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let v_saved = st["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"]
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(v_mem, v_saved, "v is not permuted");

    let back = LoraSet::load_peft(&out, m.config()).unwrap();
    assert_eq!(back.config, set.config);
    assert_eq!(back.len(), set.len());
    for (&(l, t), p) in set.iter() {
        let q = back.get(l, t).unwrap();
        assert_eq!(q.scale, 2.0);
        let want =
            p.a.to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
        let diff = (q.a.clone() - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(diff, 0.0, "A must round-trip exactly through bf16");
        let want =
            p.b.to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
        let diff = (q.b.clone() - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(diff, 0.0, "B must round-trip exactly (permuted and back)");
    }
}

#[test]
fn adapter_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path(), Arch::Qwen3, GgmlDType::F32);
    let out = dir.path().join("a");
    let set = LoraSet::fresh(&m, LoraConfig::new(4, 4.0, &[LoraTarget::Q]), 1).unwrap();
    set.save_peft(&out, m.config()).unwrap();
    // A DoRA config without magnitude vectors is refused, naming DoRA.
    let cfg_path = out.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(
        &cfg_path,
        text.replace("\"use_dora\": false", "\"use_dora\": true"),
    )
    .unwrap();
    assert!(
        LoraSet::load_peft(&out, m.config())
            .unwrap_err()
            .to_string()
            .contains("DoRA")
    );
    // Activated LoRA (same tensors, applied only after its invocation tokens) refused too.
    std::fs::write(
        &cfg_path,
        text.replace(
            "\"use_dora\": false",
            "\"use_dora\": false, \"alora_invocation_tokens\": [5, 6]",
        ),
    )
    .unwrap();
    assert!(
        LoraSet::load_peft(&out, m.config())
            .unwrap_err()
            .to_string()
            .contains("alora_invocation_tokens")
    );
    std::fs::write(&cfg_path, &text).unwrap();
    // Unknown tensor names are named in the error.
    let bad = Tensor::zeros((4, 64), DType::F32, &Device::Cpu).unwrap();
    candle_core::safetensors::save(
        &std::collections::HashMap::from([(
            "base_model.model.lm_head.lora_A.weight".to_string(),
            bad,
        )]),
        out.join("adapter_model.safetensors"),
    )
    .unwrap();
    assert!(
        LoraSet::load_peft(&out, m.config())
            .unwrap_err()
            .to_string()
            .contains("lm_head")
    );
    // An adapter for another model shape is refused at forward time, naming the module.
    let mut wrong = LoraSet::empty(LoraConfig::new(4, 4.0, &[LoraTarget::Q]));
    wrong.insert(
        0,
        LoraTarget::Q,
        LoraPair::new(
            Tensor::zeros((4, 32), DType::F32, &Device::Cpu).unwrap(),
            Tensor::zeros((64, 4), DType::F32, &Device::Cpu).unwrap(),
            1.0,
        ),
    );
    let e = m.forward_ids(&[1, 2], None, Some(&wrong)).unwrap_err();
    assert!(
        e.to_string().contains("model.layers.0.self_attn.q_proj"),
        "{e}"
    );
    // Garbage config.
    std::fs::write(&cfg_path, "{not json").unwrap();
    assert!(LoraSet::load_peft(&out, m.config()).is_err());
}

#[test]
fn registry_swap_leaves_in_flight_requests_alone() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path(), Arch::Llama, GgmlDType::Q8_0);
    let reg = AdapterRegistry::new();
    let v1 = Arc::new(with_random_b(
        &LoraSet::fresh(&m, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 1).unwrap(),
        2,
    ));
    reg.insert("me", v1.clone());
    let held = reg.get("me").unwrap(); // a request starts with v1
    let before = m
        .forward_ids(&[5, 6, 7], None, Some(&held))
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let v2 = Arc::new(with_random_b(
        &LoraSet::fresh(&m, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 2).unwrap(),
        3,
    ));
    assert!(reg.insert("me", v2.clone()).is_some());
    let after_held = m
        .forward_ids(&[5, 6, 7], None, Some(&held))
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(before, after_held);
    assert!(Arc::ptr_eq(&reg.get("me").unwrap(), &v2));
    assert_eq!(reg.names(), vec!["me".to_string()]);
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn lora_gets_gradients_through_quantized_layers() {
    let dir = tempfile::tempdir().unwrap();
    // 5 tokens take the few-row quantized kernel, 20 the many-row one (the panel kernel on AVX-512 VNNI).
    for (arch, len) in [
        (Arch::Llama, 5),
        (Arch::Qwen2, 5),
        (Arch::Qwen3, 5),
        (Arch::Qwen3, 20),
        (Arch::Phi3, 5),
        (Arch::Gemma3, 5),
    ] {
        let m = model(dir.path(), arch, GgmlDType::Q8_0);
        let fresh = LoraSet::fresh(&m, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 1).unwrap();
        let (set, vars) = fresh.to_vars().unwrap();
        let seq: Vec<u32> = (0..=len as u32).map(|i| (i * 53 + 3) % 290).collect();
        let ids = Tensor::from_slice(&seq[..len], (1, len), &Device::Cpu).unwrap();
        let targets = Tensor::from_slice(&seq[1..], len, &Device::Cpu).unwrap();
        let logits = m.forward_train(&ids, Some(&set)).unwrap();
        // Training forward agrees with the serving forward: both quantize the activations to int8 for Q8_0
        // weights, at any row count.
        let serve = m.forward(&ids, None, Some(&set)).unwrap();
        let d = max_abs(&(logits.clone() - &serve).unwrap());
        let tol = 1e-3;
        assert!(d < tol, "{arch:?}: train vs serve {d}");
        let loss = candle_nn::loss::cross_entropy(&logits.squeeze(0).unwrap(), &targets).unwrap();
        let grads = loss.backward().unwrap();
        let mut nonzero_b = 0;
        for (name, v) in &vars {
            let g = grads.get(v.as_tensor());
            if name.contains("lora_B") {
                let g = g.unwrap_or_else(|| panic!("{arch:?}: no gradient for {name}"));
                if max_abs(g) > 0.0 {
                    nonzero_b += 1;
                }
            }
        }
        // Every B (including layer 0's, which sits behind every later quantized layer) learns.
        assert_eq!(nonzero_b, 7 * m.config().num_layers, "{arch:?}");

        // A few AdamW steps on this one sequence lower its loss.
        use candle_nn::Optimizer;
        let params: Vec<candle_core::Var> = vars.iter().map(|(_, v)| v.clone()).collect();
        let mut opt = candle_nn::AdamW::new(
            params,
            candle_nn::ParamsAdamW {
                lr: 1e-2,
                weight_decay: 0.0,
                ..Default::default()
            },
        )
        .unwrap();
        let first = loss.to_scalar::<f32>().unwrap();
        let mut last = first;
        for _ in 0..5 {
            let logits = m
                .forward_train(&ids, Some(&set))
                .unwrap()
                .squeeze(0)
                .unwrap();
            let loss = candle_nn::loss::cross_entropy(&logits, &targets).unwrap();
            last = loss.to_scalar::<f32>().unwrap();
            opt.backward_step(&loss).unwrap();
        }
        assert!(last < first * 0.9, "{arch:?}: loss {first} -> {last}");
        // A snapshot published to serving does not move when training continues.
        // (It holds the live values.)
        let snap = set.snapshot().unwrap();
        for (key, p) in snap.iter() {
            let live = set.get(key.0, key.1).unwrap();
            assert_eq!(max_abs(&(&p.a - &live.a).unwrap()), 0.0);
            assert_eq!(max_abs(&(&p.b - &live.b).unwrap()), 0.0);
        }
        let before = m.forward(&ids, None, Some(&snap)).unwrap();
        let logits = m
            .forward_train(&ids, Some(&set))
            .unwrap()
            .squeeze(0)
            .unwrap();
        opt.backward_step(&candle_nn::loss::cross_entropy(&logits, &targets).unwrap())
            .unwrap();
        assert_eq!(
            max_abs(&(before - m.forward(&ids, None, Some(&snap)).unwrap()).unwrap()),
            0.0
        );
    }
}

/// Q8_0 layers multiply in int8 both ways (activations and incoming gradients quantized per 32 values, the
/// backward by the weight's transpose requantized along the other axis). The LoRA gradients they give agree
/// with the exact f32 route on the same weight values (the model merged with no adapter: every weight dense
/// f32, dequantized once) within that rounding, for every tensor; a permuted gradient would not. (The tiny
/// model's 64-wide rows make the rounding relatively larger than in real models.)
#[test]
fn int8_backward_matches_the_f32_route() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Arch::Llama, Arch::Qwen3] {
        let m = model(dir.path(), arch, GgmlDType::Q8_0);
        let dense = m.merged(None).unwrap();
        let fresh = LoraSet::fresh(&m, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 1).unwrap();
        let adapter = with_random_b(&fresh, 2);
        let len = 40;
        let (int8, exact) = (
            train_util::adapter_grads(&m, &adapter, len),
            train_util::adapter_grads(&dense, &adapter, len),
        );
        let mut ratios = Vec::new();
        for ((name, a), (_, b)) in int8.iter().zip(&exact) {
            let diff: f32 = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).powi(2))
                .sum::<f32>()
                .sqrt();
            let norm: f32 = b.iter().map(|y| y * y).sum::<f32>().sqrt();
            assert!(norm > 0.0, "{arch:?} {name}: no gradient");
            // int8 rounding moves each gradient by a few percent; the bound leaves room for unseeded draws of B.
            assert!(
                diff <= 0.08 * norm,
                "{arch:?} {name}: |int8 - f32| = {diff}, |f32| = {norm}"
            );
            ratios.push(diff / norm);
        }
        let mean = ratios.iter().sum::<f32>() / ratios.len() as f32;
        assert!(mean <= 0.05, "{arch:?}: mean relative difference {mean}");
    }
}

#[test]
fn concurrent_requests_share_one_model() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Transformer>();
    send_sync::<LoraSet>();
    send_sync::<AdapterRegistry>();
    send_sync::<hearth::model::Tokenizer>();

    let dir = tempfile::tempdir().unwrap();
    let m = Arc::new(model(dir.path(), Arch::Qwen3, GgmlDType::Q8_0));
    let reg = Arc::new(AdapterRegistry::new());
    let cfg = LoraConfig::new(4, 8.0, &LoraTarget::ALL);
    reg.insert(
        "a",
        Arc::new(with_random_b(
            &LoraSet::fresh(&m, cfg.clone(), 1).unwrap(),
            2,
        )),
    );
    let ids = [4u32, 8, 15, 16, 23, 42];
    // Token-by-token decode with a cache, as a request does: done alone here, then on four
    // threads at once, which must give the very same logits.
    let decode = move |m: &Transformer, set: Option<&LoraSet>| -> Vec<f32> {
        let mut cache = m.new_cache();
        let mut rows = Vec::new();
        for &t in &ids {
            let l = m.forward_ids(&[t], Some(&mut cache), set).unwrap();
            rows.extend(l.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        }
        rows
    };
    let alone: Vec<Vec<f32>> = [None, reg.get("a")]
        .iter()
        .map(|s| decode(&m, s.as_deref()))
        .collect();
    assert_ne!(alone[0], alone[1], "the adapter changes the logits");
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let m = m.clone();
            // A request resolves its adapter when it starts.
            let set = if i % 2 == 1 { reg.get("a") } else { None };
            std::thread::spawn(move || (i, decode(&m, set.as_deref())))
        })
        .collect();
    // Replace the adapter while requests run; they keep the set they started with.
    reg.insert(
        "a",
        Arc::new(with_random_b(&LoraSet::fresh(&m, cfg, 9).unwrap(), 10)),
    );
    for h in handles {
        let (i, rows) = h.join().unwrap();
        assert!(
            rows == alone[i % 2],
            "thread {i} differs from the same decode alone"
        );
    }
}

#[test]
fn llama_cpp_gguf_lora_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Arch::Llama, Arch::Qwen3] {
        let m = model(dir.path(), arch, GgmlDType::Q8_0);
        for rslora in [false, true] {
            let mut cfg = LoraConfig::new(4, 8.0, &[LoraTarget::Q, LoraTarget::Down]);
            cfg.use_rslora = rslora;
            let set = with_random_b(&LoraSet::fresh(&m, cfg, 3).unwrap(), 4);
            let path = dir.path().join("a.gguf");
            set.save_gguf(&path, m.config()).unwrap();
            let back = LoraSet::load_gguf(&path, m.config()).unwrap();
            assert_eq!(back.len(), set.len());
            // alpha/rank in llama.cpp reproduces our scale, rsLoRA included (alpha·√r written).
            let ids = [3u32, 1, 4, 1, 5];
            let a = m.forward_ids(&ids, None, Some(&set)).unwrap();
            let b = m.forward_ids(&ids, None, Some(&back)).unwrap();
            assert!(
                max_abs(&(a - b).unwrap()) < 1e-5,
                "{arch:?} rslora={rslora}"
            );
            let other = if arch == Arch::Llama {
                Arch::Qwen3
            } else {
                Arch::Llama
            };
            let mut wrong = m.config().clone();
            wrong.arch = other;
            assert!(LoraSet::load_gguf(&path, &wrong).is_err());
        }
    }
    // A base model GGUF is not an adapter.
    let p = dir.path().join("m.gguf");
    let m = model(dir.path(), Arch::Llama, GgmlDType::F32);
    assert!(LoraSet::load_gguf(&p, m.config()).is_err());
}
