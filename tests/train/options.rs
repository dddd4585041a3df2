//! Every `TrainConfig` option changes the update (or, for the scheduling knob, provably not).

use crate::train_util;

use std::collections::BTreeSet;

use hearth::model::LoraTarget;
use hearth::train::{LoraTrainer, RewardKind, TrainConfig};
use train_util::*;

/// A baseline in which every objective is active, so each objective's knobs matter.
fn baseline(dir: &std::path::Path) -> TrainConfig {
    let replay = dir.join("replay.txt");
    std::fs::write(
        &replay,
        "a file line about the barn\n\nanother line on the hill\n",
    )
    .unwrap();
    TrainConfig {
        grpo_group_size: 4,
        grpo_max_new_tokens: 5,
        // Contains "h" varies within a group, so GRPO advantages are non-zero.
        grpo_reward: RewardKind::Contains,
        dropout: 0.1,
        ..fast_cfg()
    }
}

fn data() -> Vec<hearth::message::Sample> {
    let mut d = mixed();
    d.retain(|s| s.id != "g1");
    d.push(scored("g1", "say a word", "h", 1.0));
    d.push(scored("g2", "say another word", "h", 1.0));
    // The model's own answer: what the collapse guard weighs.
    let mut own = sft("own1", "what do owls eat", "owls eat mice at night");
    own.origin = hearth::message::Origin::SelfGenerated;
    d.push(own);
    d
}

/// All adapter parameters after one cycle, as f32 (bf16 could hide a small difference).
fn params(
    m: &hearth::model::Transformer,
    tok: &hearth::model::Tokenizer,
    cfg: TrainConfig,
) -> Vec<f32> {
    let mut tr = LoraTrainer::new(m, tok, cfg, None).unwrap();
    tr.train_cycle(&data(), |_| {}).unwrap();
    let a = tr.adapter().unwrap();
    let mut out = Vec::new();
    for (_, p) in a.iter() {
        out.extend(p.a.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        out.extend(p.b.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    }
    out
}

#[test]
fn every_option_changes_the_update() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let base = baseline(dir.path());
    let other_file = dir.path().join("other.txt");
    std::fs::write(&other_file, "zebras run on the plain\n").unwrap();
    type Change = Box<dyn Fn(&mut TrainConfig)>;
    let changes: Vec<(&str, Change)> = vec![
        ("seed", Box::new(|c| c.seed = 99)),
        ("rank", Box::new(|c| c.rank = 2)),
        ("alpha", Box::new(|c| c.alpha = 3.0)),
        ("rslora", Box::new(|c| c.rslora = true)),
        ("dora", Box::new(|c| c.dora = true)),
        ("dropout", Box::new(|c| c.dropout = 0.3)),
        (
            "targets",
            Box::new(|c| c.targets = vec![LoraTarget::Q, LoraTarget::V]),
        ),
        ("learning_rate", Box::new(|c| c.learning_rate = 3e-3)),
        ("min_lr_ratio", Box::new(|c| c.min_lr_ratio = 0.9)),
        ("warmup_steps", Box::new(|c| c.warmup_steps = 3)),
        ("weight_decay", Box::new(|c| c.weight_decay = 0.5)),
        ("beta1", Box::new(|c| c.beta1 = 0.5)),
        ("beta2", Box::new(|c| c.beta2 = 0.9)),
        ("eps", Box::new(|c| c.eps = 1e-3)),
        ("steps", Box::new(|c| c.steps = 2)),
        ("batch_size", Box::new(|c| c.batch_size = 2)),
        ("grad_accum", Box::new(|c| c.grad_accum = 2)),
        ("max_grad_norm", Box::new(|c| c.max_grad_norm = 0.01)),
        ("max_seq_len", Box::new(|c| c.max_seq_len = 30)),
        ("replay_fraction", Box::new(|c| c.replay_fraction = 0.5)),
        (
            "replay_texts",
            Box::new(|c| c.replay_texts = vec!["zebras run on the plain".into()]),
        ),
        (
            "replay_file",
            Box::new(move |c| c.replay_file = Some(other_file.clone())),
        ),
        ("replay_builtin", Box::new(|c| c.replay_builtin = true)),
        ("replay_per_batch", Box::new(|c| c.replay_per_batch = 3)),
        (
            "replay_distill_top_k",
            Box::new(|c| c.replay_distill_top_k = 4),
        ),
        ("prompt_variants", Box::new(|c| c.prompt_variants = 2)),
        ("dpo_beta", Box::new(|c| c.dpo_beta = 2.0)),
        ("dpo_sft_weight", Box::new(|c| c.dpo_sft_weight = 1.0)),
        ("holdout_fraction", Box::new(|c| c.holdout_fraction = 0.5)),
        (
            "max_self_generated_share",
            Box::new(|c| c.max_self_generated_share = 0.0),
        ),
        ("kto_beta", Box::new(|c| c.kto_beta = 2.0)),
        (
            "kto_desirable_weight",
            Box::new(|c| c.kto_desirable_weight = 3.0),
        ),
        (
            "kto_undesirable_weight",
            Box::new(|c| c.kto_undesirable_weight = 3.0),
        ),
        ("grpo_group_size", Box::new(|c| c.grpo_group_size = 3)),
        (
            "grpo_max_new_tokens",
            Box::new(|c| c.grpo_max_new_tokens = 2),
        ),
        ("grpo_temperature", Box::new(|c| c.grpo_temperature = 0.3)),
        ("grpo_kl_coef", Box::new(|c| c.grpo_kl_coef = 5.0)),
        (
            "grpo_reward",
            Box::new(|c| c.grpo_reward = RewardKind::JsonValid),
        ),
    ];
    // The table must name every option. Two only schedule work and must NOT change the update:
    // step_sleep_ms (tested below) and checkpoint_every (tests/train/checkpoint.rs).
    let json = serde_json::to_value(TrainConfig::default()).unwrap();
    let all: BTreeSet<String> = json.as_object().unwrap().keys().cloned().collect();
    let mut named: BTreeSet<String> = changes.iter().map(|(n, _)| n.to_string()).collect();
    named.insert("step_sleep_ms".into());
    named.insert("checkpoint_every".into());
    // Two trade memory for time and must not change the update either: activation_budget_mib (below) and
    // transpose_cache_mib (tests/model/transpose_cache.rs).
    named.insert("activation_budget_mib".into());
    named.insert("transpose_cache_mib".into());
    // The rated-answer objective acts only with GRPO off, unlike this baseline: tests/train/scores.rs.
    named.insert("score_baseline".into());
    named.insert("score_kl_coef".into());
    // Read where a cycle runs with a base and a data directory: tests/train/replay.rs and train::cycle.
    named.insert("replay_self_distilled".into());
    assert_eq!(all, named, "an option has no change test");

    let reference = params(&m, &tok, base.clone());
    assert_eq!(
        reference,
        params(&m, &tok, base.clone()),
        "baseline not deterministic"
    );
    let mut unchanged = Vec::new();
    for (name, change) in &changes {
        let mut c = base.clone();
        change(&mut c);
        assert_ne!(c, base, "{name}: the change is a no-op");
        if params(&m, &tok, c) == reference {
            unchanged.push(*name);
        }
    }
    assert!(
        unchanged.is_empty(),
        "options that did not change the update: {unchanged:?}"
    );
}

#[test]
fn prompt_variants_reword_the_question_and_keep_the_answer() {
    use hearth::message::SampleContent;
    use hearth::train::data::{PROMPT_VARIANTS, prompt_variants};
    let s = sft("s1", "Where do I work?", "You work at the bakery.");
    assert!(prompt_variants(&s, 0).is_empty());
    let v = prompt_variants(&s, 100);
    assert_eq!(v.len(), PROMPT_VARIANTS.len());
    let mut asked = BTreeSet::new();
    for x in &v {
        let SampleContent::Sft { prompt, response } = &x.content else {
            panic!("{x:?}")
        };
        assert_eq!(response, "You work at the bakery.");
        assert_eq!(prompt.len(), 1);
        let q = &prompt[0].content;
        assert!(
            q.contains("Where do I work?") || q.contains("where do I work?"),
            "{q}"
        );
        assert_ne!(q, "Where do I work?");
        asked.insert(q.clone());
        assert_eq!((x.id.as_str(), &x.origin), (s.id.as_str(), &s.origin));
    }
    assert_eq!(asked.len(), v.len(), "the rewordings differ");
    // Only SFT samples are reworded: a preference pair's question keeps its one wording.
    assert!(prompt_variants(&pref("p1", "who is there", "the owl", "nobody"), 3).is_empty());
}

#[test]
fn step_sleep_ms_yields_time_without_changing_the_update() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let base = fast_cfg();
    let mut slow = base.clone();
    slow.step_sleep_ms = 40;
    let t = std::time::Instant::now();
    let p_slow = params(&m, &tok, slow.clone());
    assert!(t.elapsed().as_millis() >= 40 * slow.steps as u128);
    assert_eq!(p_slow, params(&m, &tok, base));
}

#[test]
fn activation_budget_mib_recomputes_the_forward_with_the_same_update() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let run = |cfg: TrainConfig| {
        let mut tr = LoraTrainer::new(&m, &tok, cfg, None).unwrap();
        let report = tr.train_cycle(&data(), |_| {}).unwrap();
        let mut out = Vec::new();
        for (_, p) in tr.adapter().unwrap().iter() {
            out.extend(p.a.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            out.extend(p.b.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        }
        (out, report.recomputed_micro_batches)
    };
    // Every objective on, dropout included: the recomputed forward must see the same masks.
    let base = baseline(dir.path());
    let (kept, none) = run(base.clone());
    assert_eq!(none, 0, "the tiny model's batches fit the default budget");
    let (recomputed, all) = run(TrainConfig {
        activation_budget_mib: 0,
        ..base.clone()
    });
    assert_eq!(all, base.steps * base.grad_accum);
    assert_eq!(kept, recomputed);
}

#[test]
fn the_config_refuses_unknown_keys_and_bad_values() {
    let ok: TrainConfig = serde_json::from_str(r#"{"rank": 4, "targets": ["Q", "Down"]}"#).unwrap();
    assert_eq!(ok.rank, 4);
    assert_eq!(ok.learning_rate, TrainConfig::default().learning_rate);
    assert!(serde_json::from_str::<TrainConfig>(r#"{"rnak": 4}"#).is_err());
    for bad in [
        TrainConfig {
            rank: 0,
            ..TrainConfig::default()
        },
        TrainConfig {
            dropout: 1.0,
            ..TrainConfig::default()
        },
        TrainConfig {
            replay_fraction: 1.5,
            ..TrainConfig::default()
        },
        TrainConfig {
            batch_size: 0,
            ..TrainConfig::default()
        },
        TrainConfig {
            targets: vec![],
            ..TrainConfig::default()
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}
