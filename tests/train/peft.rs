//! Saved deltas: PEFT files (bf16) that load back exactly, provenance that binds them to their
//! inputs, atomic content-addressed directories, and training that continues from a parent.

use crate::train_util;

use candle_core::DType;
use hearth::model::{LoraPair, LoraSet};
use hearth::train::artifact::recipe_sha256;
use hearth::train::{LoraTrainer, Provenance, data_digest, save_delta, sha256_file, sha256_hex};
use train_util::*;

fn logits(m: &hearth::model::Transformer, lora: Option<&LoraSet>) -> Vec<u32> {
    m.forward_ids(&[1, 50, 72, 300, 101, 7], None, lora)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn bf16_rounded(set: &LoraSet) -> LoraSet {
    let mut out = LoraSet::empty(set.config.clone());
    let r = |t: &candle_core::Tensor| {
        t.to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    for (&(l, t), p) in set.iter() {
        out.insert(l, t, LoraPair::new(r(&p.a), r(&p.b), p.scale));
    }
    out
}

fn provenance(
    base: &std::path::Path,
    cfg: &hearth::train::TrainConfig,
    parent: Option<String>,
) -> Provenance {
    Provenance {
        delta_id: String::new(),
        base_sha256: sha256_file(base).unwrap(),
        recipe_sha256: recipe_sha256(cfg).unwrap(),
        recipe: cfg.clone(),
        data_digest: data_digest(&mixed()),
        num_samples: mixed().len(),
        parent,
        seed: cfg.seed,
        metrics: serde_json::json!({"steps": cfg.steps}),
        created_at_unix_ms: 0,
    }
}

#[test]
fn peft_delta_files_load_back_exactly_with_provenance() {
    let dir = tempfile::tempdir().unwrap();
    let (base, m, tok) = tiny(dir.path());
    let mut cfg = fast_cfg();
    cfg.rslora = true;
    let mut tr = LoraTrainer::new(&m, &tok, cfg.clone(), None).unwrap();
    tr.train_cycle(&mixed(), |_| {}).unwrap();
    let adapter = tr.adapter().unwrap();
    let root = dir.path().join("deltas");
    let delta = save_delta(&root, &adapter, m.config(), provenance(&base, &cfg, None)).unwrap();

    // Exactly one published directory, nothing temporary left behind.
    let entries: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, vec![delta.id.clone()]);
    let d = std::path::Path::new(&delta.path);
    let mut files: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "adapter.gguf",
            "adapter_config.json",
            "adapter_model.safetensors",
            "provenance.json"
        ]
    );

    // bf16 tensors under PEFT keys; the config says what was trained.
    let bytes = std::fs::read(d.join("adapter_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), 2 * adapter.len());
    assert!(
        st.tensors()
            .iter()
            .all(|(_, v)| v.dtype() == safetensors::Dtype::BF16)
    );
    assert!(
        st.names()
            .contains(&"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
    );
    assert_eq!(delta.id, format!("delta-{}", &sha256_hex(&bytes)[..16]));
    let cfg_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(cfg_json["r"], cfg.rank);
    assert_eq!(cfg_json["lora_alpha"], cfg.alpha);
    assert_eq!(cfg_json["use_rslora"], true);
    assert_eq!(cfg_json["target_modules"].as_array().unwrap().len(), 7);

    // Loading gives exactly the trained adapter at bf16 precision.
    let loaded = LoraSet::load_peft(d, m.config()).unwrap();
    assert_eq!(
        logits(&m, Some(&loaded)),
        logits(&m, Some(&bf16_rounded(&adapter)))
    );

    // Provenance binds the delta to base, recipe, data, parent and seed.
    let p: Provenance =
        serde_json::from_slice(&std::fs::read(d.join("provenance.json")).unwrap()).unwrap();
    assert_eq!(p.delta_id, delta.id);
    assert_eq!(p.base_sha256, sha256_hex(&std::fs::read(&base).unwrap()));
    assert_eq!(
        p.recipe_sha256,
        sha256_hex(&serde_json::to_vec(&cfg).unwrap())
    );
    assert_eq!(p.recipe, cfg);
    assert_eq!(p.data_digest, data_digest(&mixed()));
    assert_eq!((p.parent, p.seed), (None, cfg.seed));
    assert_eq!(
        (delta.base_sha256, delta.recipe_sha256),
        (p.base_sha256, p.recipe_sha256)
    );
}

#[test]
fn peft_delta_ids_are_content_addressed_and_resaving_is_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let (base, m, tok) = tiny(dir.path());
    let cfg = fast_cfg();
    let mut tr = LoraTrainer::new(&m, &tok, cfg.clone(), None).unwrap();
    tr.train_cycle(&mixed(), |_| {}).unwrap();
    let a = tr.adapter().unwrap();
    let root = dir.path().join("deltas");
    let d1 = save_delta(&root, &a, m.config(), provenance(&base, &cfg, None)).unwrap();
    let d2 = save_delta(&root, &a, m.config(), provenance(&base, &cfg, None)).unwrap();
    assert_eq!(d1, d2);
    assert_eq!(std::fs::read_dir(&root).unwrap().count(), 1);
}

#[test]
fn peft_parent_delta_continues_training_from_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (base, m, tok) = tiny(dir.path());
    let cfg = fast_cfg();
    let mut tr = LoraTrainer::new(&m, &tok, cfg.clone(), None).unwrap();
    tr.train_cycle(&mixed(), |_| {}).unwrap();
    let root = dir.path().join("deltas");
    let parent = save_delta(
        &root,
        &tr.adapter().unwrap(),
        m.config(),
        provenance(&base, &cfg, None),
    )
    .unwrap();
    let loaded = LoraSet::load_peft(&parent.path, m.config()).unwrap();
    let mut child = LoraTrainer::new(&m, &tok, cfg.clone(), Some(&loaded)).unwrap();
    assert_eq!(
        logits(&m, Some(&child.adapter().unwrap())),
        logits(&m, Some(&loaded))
    );
    child.train_cycle(&mixed(), |_| {}).unwrap();
    let c = child.adapter().unwrap();
    assert!(logits(&m, Some(&c)) != logits(&m, Some(&loaded)));
    let d = save_delta(
        &root,
        &c,
        m.config(),
        provenance(&base, &cfg, Some(parent.id.clone())),
    )
    .unwrap();
    assert_eq!(d.parent.as_deref(), Some(parent.id.as_str()));
}

#[test]
fn the_data_digest_covers_ids_contents_and_order() {
    let a = mixed();
    let mut b = mixed();
    b.swap(0, 1);
    let mut c = mixed();
    c[0].id = "other".into();
    let mut e = mixed();
    if let hearth::message::SampleContent::Sft { response, .. } = &mut e[0].content {
        response.push('!');
    }
    let d = data_digest(&a);
    assert_eq!(d, data_digest(&mixed()));
    for x in [&b, &c, &e] {
        assert_ne!(d, data_digest(x));
    }
    // Provenance metadata (not content) does not change the digest.
    let mut f = mixed();
    f[0].provenance.sources.push("x".into());
    assert_eq!(d, data_digest(&f));
}
