//! GGUF loading: configuration, tensor types, and clear errors on bad files.

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use hearth::model::gguf::{GgufFile, write_gguf};
use hearth::model::{Arch, ModelConfig, ModelError, TinySpec, Transformer, write_tiny_model};

#[test]
fn config_from_metadata() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Phi3,
        Arch::Gemma3,
    ] {
        let path = dir.path().join("m.gguf");
        let spec = TinySpec::new(arch);
        let want = write_tiny_model(&path, &spec).unwrap();
        let g = GgufFile::open(&path).unwrap();
        let cfg = ModelConfig::from_gguf(&g.content).unwrap();
        assert_eq!(cfg, want);
        assert_eq!(
            (cfg.hidden_size, cfg.num_layers, cfg.head_dim),
            (spec.hidden_size, spec.num_layers, spec.head_dim)
        );
        // Phi-3's fused `ffn_up` holds gate and up; the width is one of them.
        assert_eq!(cfg.intermediate_size, spec.intermediate_size);
        assert_eq!(
            cfg.tied_embeddings,
            matches!(arch, Arch::Llama | Arch::Gemma3)
        );
        assert_eq!(cfg.qk_norm, matches!(arch, Arch::Qwen3 | Arch::Gemma3));
        let sliding = cfg
            .sliding
            .map(|s| (s.window, s.rope_theta, s.global_period));
        assert_eq!(
            sliding,
            (arch == Arch::Gemma3).then_some((512, 10_000.0, 6))
        );
        assert_eq!(cfg.query_scale, 1.0);
        let m = Transformer::from_gguf(&path).unwrap();
        assert_eq!(m.config(), &want);
    }
}

#[test]
fn quantized_types_load_and_dequantize() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    let data: Vec<f32> = (0..256 * 4)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let src = Tensor::from_vec(data.clone(), (4, 256), &Device::Cpu).unwrap();
    let types = [
        GgmlDType::F32,
        GgmlDType::F16,
        GgmlDType::Q8_0,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ];
    let tensors: Vec<(String, QTensor)> = types
        .iter()
        .map(|t| (format!("{t:?}"), QTensor::quantize(&src, *t).unwrap()))
        .collect();
    write_gguf(
        &path,
        &[("general.architecture".into(), Value::String("llama".into()))],
        &tensors,
    )
    .unwrap();
    let mut g = GgufFile::open(&path).unwrap();
    for (t, tol) in types.iter().zip([0.0, 1e-3, 1e-2, 0.13, 0.1, 0.1, 0.05]) {
        let q = g.tensor(&format!("{t:?}"), Some(&[4, 256])).unwrap();
        assert_eq!(q.dtype(), *t);
        let back: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let err = back
            .iter()
            .zip(&data)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= tol, "{t:?}: {err}");
    }
    let e = g.tensor("F32", Some(&[256, 4])).unwrap_err();
    assert!(
        matches!(e, ModelError::BadTensor { ref name, .. } if name == "F32"),
        "{e}"
    );
    assert!(matches!(
        g.tensor("nope", None).unwrap_err(),
        ModelError::MissingTensor { .. }
    ));
}

fn rewrite_with(
    dir: &std::path::Path,
    edit: impl Fn(&mut Vec<(String, Value)>, &mut Vec<(String, QTensor)>),
) -> std::path::PathBuf {
    let src = dir.join("src.gguf");
    write_tiny_model(&src, &TinySpec::new(Arch::Qwen3)).unwrap();
    let mut g = GgufFile::open(&src).unwrap();
    let mut md: Vec<(String, Value)> = g
        .content
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let names: Vec<String> = g.content.tensor_infos.keys().cloned().collect();
    let mut ts: Vec<(String, QTensor)> = names
        .into_iter()
        .map(|n| {
            let q = g.tensor(&n, None).unwrap();
            let t = q.dequantize(&Device::Cpu).unwrap();
            (n, QTensor::quantize(&t, q.dtype()).unwrap())
        })
        .collect();
    edit(&mut md, &mut ts);
    let out = dir.join("edited.gguf");
    write_gguf(&out, &md, &ts).unwrap();
    out
}

#[test]
fn bad_files_are_errors_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    // Missing metadata key.
    let p = rewrite_with(dir.path(), |md, _| {
        md.retain(|(k, _)| k != "qwen3.block_count")
    });
    let e = Transformer::from_gguf(&p).unwrap_err();
    assert!(
        matches!(e, ModelError::MissingKey { ref key } if key == "qwen3.block_count"),
        "{e}"
    );
    // Wrong value type.
    let p = rewrite_with(dir.path(), |md, _| {
        md.iter_mut()
            .find(|(k, _)| k == "qwen3.embedding_length")
            .unwrap()
            .1 = Value::String("64".into())
    });
    assert!(
        Transformer::from_gguf(&p)
            .unwrap_err()
            .to_string()
            .contains("qwen3.embedding_length")
    );
    // Absurd sizes are refused; an absurd context is capped rather than allocated.
    let p = rewrite_with(dir.path(), |md, _| {
        md.iter_mut()
            .find(|(k, _)| k == "qwen3.block_count")
            .unwrap()
            .1 = Value::U32(4_000_000_000)
    });
    let e = Transformer::from_gguf(&p).unwrap_err();
    assert!(
        matches!(e, ModelError::BadKey { ref key, .. } if key == "qwen3.block_count"),
        "{e}"
    );
    let p = rewrite_with(dir.path(), |md, _| {
        md.iter_mut()
            .find(|(k, _)| k == "qwen3.context_length")
            .unwrap()
            .1 = Value::U64(1 << 40)
    });
    let m = Transformer::from_gguf(&p).unwrap();
    assert_eq!(m.max_positions(), hearth::model::MAX_POSITIONS);
    // Unsupported architecture.
    let p = rewrite_with(dir.path(), |md, _| {
        md.iter_mut()
            .find(|(k, _)| k == "general.architecture")
            .unwrap()
            .1 = Value::String("mamba".into())
    });
    assert!(
        matches!(Transformer::from_gguf(&p).unwrap_err(), ModelError::UnsupportedArch(a) if a == "mamba")
    );
    // RoPE scaling hearth does not implement is refused, not ignored.
    let p = rewrite_with(dir.path(), |md, _| {
        md.push((
            "qwen3.rope.scaling.type".into(),
            Value::String("yarn".into()),
        ));
        md.push(("qwen3.rope.scaling.factor".into(), Value::F32(4.0)));
    });
    let e = Transformer::from_gguf(&p).unwrap_err();
    assert!(
        matches!(e, ModelError::BadKey { ref key, .. } if key == "qwen3.rope.scaling.type"),
        "{e}"
    );
    // Non-positive RoPE frequency factors.
    let p = rewrite_with(dir.path(), |_, ts| {
        let t = Tensor::zeros(16, candle_core::DType::F32, &Device::Cpu).unwrap();
        ts.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&t, GgmlDType::F32).unwrap(),
        ));
    });
    let e = Transformer::from_gguf(&p).unwrap_err();
    assert!(
        matches!(e, ModelError::BadTensor { ref name, .. } if name == "rope_freqs.weight"),
        "{e}"
    );
    // LongRoPE (Phi-3 128k) is refused, naming its tensor.
    let p = rewrite_with(dir.path(), |_, ts| {
        let t = Tensor::ones(16, candle_core::DType::F32, &Device::Cpu).unwrap();
        ts.push((
            "rope_factors_long.weight".into(),
            QTensor::quantize(&t, GgmlDType::F32).unwrap(),
        ));
    });
    let e = Transformer::from_gguf(&p).unwrap_err();
    assert!(
        matches!(e, ModelError::BadTensor { ref name, .. } if name == "rope_factors_long.weight"),
        "{e}"
    );
    // A gemma3 file without its sliding window names the key.
    let p = rewrite_with(dir.path(), |md, _| {
        for (k, v) in md.iter_mut() {
            if let Some(rest) = k.strip_prefix("qwen3.") {
                *k = format!("gemma3.{rest}");
            }
            if k == "general.architecture" {
                *v = Value::String("gemma3".into());
            }
        }
    });
    let e = Transformer::from_gguf(&p).unwrap_err();
    assert!(
        matches!(e, ModelError::MissingKey { ref key } if key == "gemma3.attention.sliding_window"),
        "{e}"
    );
    // Missing tensor.
    let p = rewrite_with(dir.path(), |_, ts| {
        ts.retain(|(n, _)| n != "blk.1.attn_k_norm.weight")
    });
    let e = Transformer::from_gguf(&p).unwrap_err();
    assert!(
        matches!(e, ModelError::MissingTensor { ref name } if name == "blk.1.attn_k_norm.weight"),
        "{e}"
    );
    // Wrong shape.
    let p = rewrite_with(dir.path(), |_, ts| {
        let t = Tensor::zeros((64, 64), candle_core::DType::F32, &Device::Cpu).unwrap();
        ts.iter_mut()
            .find(|(n, _)| n == "blk.0.ffn_up.weight")
            .unwrap()
            .1 = QTensor::quantize(&t, GgmlDType::F32).unwrap();
    });
    let e = Transformer::from_gguf(&p).unwrap_err();
    assert!(e.to_string().contains("blk.0.ffn_up.weight"), "{e}");
}

#[test]
fn truncated_and_garbage_files_do_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write_tiny_model(&path, &TinySpec::new(Arch::Llama)).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.gguf");
    for len in [0, 3, 16, 200, bytes.len() / 2, bytes.len() - 10] {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        assert!(Transformer::from_gguf(&cut).is_err(), "truncated to {len}");
    }
    let mut junk = bytes.clone();
    for b in junk.iter_mut().skip(8).step_by(97) {
        *b ^= 0x5a;
    }
    std::fs::write(&cut, &junk).unwrap();
    let _ = Transformer::from_gguf(&cut); // any result but a panic
    let e = Transformer::from_gguf(dir.path().join("absent.gguf")).unwrap_err();
    assert!(e.to_string().contains("absent.gguf"));
}
