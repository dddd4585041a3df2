//! Shared fixtures for the train tests: a tiny quantized model written by the test and samples.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use hearth::message::{ChatMessage, Origin, Provenance, Sample, SampleContent};
use hearth::model::{Arch, LoraPair, LoraSet, TinySpec, Tokenizer, Transformer, write_tiny_model};
use hearth::train::TrainConfig;

/// `set` with every B drawn from N(0, 0.1²) by a generator seeded with `seed` (A kept): a
/// delta that changes the model, as a fresh one (B = 0) does not. Seeded so that a failure
/// reproduces (candle's CPU randn is unseeded, and a test whose bound holds for most draws
/// would fail now and then).
pub fn with_random_b(set: &LoraSet, seed: u64) -> LoraSet {
    use candle_core::{Device, Tensor};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // A constant, valid standard deviation.
    let normal = rand_distr::Normal::new(0f32, 0.1).unwrap();
    let mut out = LoraSet::empty(set.config.clone());
    for (&(l, t), p) in set.iter() {
        let b: Vec<f32> = (0..p.b.elem_count()).map(|_| rng.sample(normal)).collect();
        let b = Tensor::from_vec(b, p.b.dims(), &Device::Cpu).unwrap();
        out.insert(l, t, LoraPair::new(p.a.clone(), b, p.scale));
    }
    out
}

/// The gradient of every adapter tensor (by name, flattened) for next-token cross-entropy on a fixed
/// `len`-token sequence of ids below 290: what two routes through one model's weights must agree on.
pub fn adapter_grads(
    model: &Transformer,
    adapter: &LoraSet,
    len: usize,
) -> Vec<(String, Vec<f32>)> {
    use candle_core::{Device, Tensor};
    let seq: Vec<u32> = (0..=len as u32).map(|i| (i * 53 + 3) % 290).collect();
    let ids = Tensor::from_slice(&seq[..len], (1, len), &Device::Cpu).unwrap();
    let targets = Tensor::from_slice(&seq[1..], len, &Device::Cpu).unwrap();
    let (set, vars) = adapter.to_vars().unwrap();
    let logits = model.forward_train(&ids, Some(&set)).unwrap();
    let loss = candle_nn::loss::cross_entropy(&logits.squeeze(0).unwrap(), &targets).unwrap();
    let g = loss.backward().unwrap();
    vars.iter()
        .map(|(k, v)| {
            let t = g.get(v.as_tensor()).unwrap();
            (k.clone(), t.flatten_all().unwrap().to_vec1().unwrap())
        })
        .collect()
}

/// A tiny Llama with Q8_0 matrices (so gradients cross the quantized custom op).
pub fn tiny(dir: &Path) -> (PathBuf, Transformer, Tokenizer) {
    tiny_with(dir, true)
}

/// [`tiny`] with or without tied embeddings. The tiny tied head has small embeddings, which caps
/// how confident any adapter can make it; an untied head shows a memorised fact's loss near 0.
pub fn tiny_with(dir: &Path, tied: bool) -> (PathBuf, Transformer, Tokenizer) {
    let mut spec = TinySpec::new(Arch::Llama);
    spec.dtype = GgmlDType::Q8_0;
    spec.tied_embeddings = tied;
    let p = dir.join("base.gguf");
    write_tiny_model(&p, &spec).expect("tiny model");
    let (m, t) = hearth::model::load(&p).expect("load tiny");
    (p, m, t)
}

fn user(q: &str) -> Vec<ChatMessage> {
    vec![ChatMessage {
        role: hearth::message::Role::User,
        content: q.into(),
    }]
}

fn sample(id: &str, content: SampleContent) -> Sample {
    Sample {
        id: id.into(),
        user: "u".into(),
        origin: Origin::Grounded,
        content,
        provenance: Provenance::default(),
        created_at_unix_ms: 0,
    }
}

pub fn sft(id: &str, q: &str, a: &str) -> Sample {
    sample(
        id,
        SampleContent::Sft {
            prompt: user(q),
            response: a.into(),
        },
    )
}

pub fn pref(id: &str, q: &str, chosen: &str, rejected: &str) -> Sample {
    sample(
        id,
        SampleContent::Preference {
            prompt: user(q),
            chosen: chosen.into(),
            rejected: rejected.into(),
        },
    )
}

pub fn thumbs(id: &str, q: &str, a: &str, up: bool) -> Sample {
    sample(
        id,
        SampleContent::Unpaired {
            prompt: user(q),
            response: a.into(),
            desirable: up,
        },
    )
}

pub fn scored(id: &str, q: &str, a: &str, score: f64) -> Sample {
    sample(
        id,
        SampleContent::Scored {
            prompt: user(q),
            response: a.into(),
            score,
        },
    )
}

/// One of each objective (GRPO's Scored sample is used only when GRPO is on).
pub fn mixed() -> Vec<Sample> {
    vec![
        sft("s1", "the sun is hot", "it is in the sky"),
        pref("p1", "who is there", "the owl is there", "nobody"),
        thumbs("k1", "is the sea wet", "yes it is wet", true),
        thumbs("k2", "is the sea dry", "the sea is dry", false),
        sft("s2", "where is the cat", "the cat is on the mat, sleeping"),
        scored("g1", "say hi", "hi", 1.0),
    ]
}

/// Few, large steps: enough to separate any two recipes in a debug build.
pub fn fast_cfg() -> TrainConfig {
    TrainConfig {
        rank: 4,
        alpha: 8.0,
        learning_rate: 1e-2,
        warmup_steps: 1,
        steps: 3,
        batch_size: 4,
        max_seq_len: 64,
        // These tests train on every sample they pass; the split and the guard have their own tests.
        holdout_fraction: 0.0,
        max_self_generated_share: 1.0,
        replay_texts: vec![
            "the end of the story is near".into(),
            "an owl in the barn".into(),
        ],
        ..TrainConfig::default()
    }
}

/// The gradients of one trainer after a first step (B = 0 at init makes ∂L/∂A = 0 by construction), each
/// asserted finite and non-zero; returned by name.
pub fn nonzero_gradients_after_one_step(
    m: &Transformer,
    tok: &Tokenizer,
    mut cfg: TrainConfig,
) -> Vec<String> {
    cfg.steps = 1;
    let mut tr = hearth::train::LoraTrainer::new(m, tok, cfg, None).unwrap();
    tr.train_cycle(&mixed(), |_| {}).unwrap();
    let grads = tr.gradients(&mixed()).unwrap();
    grads
        .into_iter()
        .map(|(k, g)| {
            let n = g
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(n > 0.0 && n.is_finite(), "{k}: gradient norm² {n}");
            k
        })
        .collect()
}
