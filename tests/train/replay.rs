//! Self-distilled replay: the base's greedy answers to hearth's everyday prompts are generated once per base,
//! cached, held apart from the gate's probes, and change what a cycle learns; distilled replay trains towards
//! the base's own distribution.

use std::collections::HashSet;

use hearth::train::replay::{self, BUILTIN_PROMPTS};
use hearth::train::{LoraTrainer, TrainConfig};

use crate::train_util::*;

fn shingles(text: &str) -> HashSet<String> {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    words.windows(4).map(|w| w.join(" ")).collect()
}

#[test]
fn the_replay_prompts_are_held_apart_from_the_gates_probes() {
    let general: serde_json::Value =
        serde_json::from_str(include_str!("../../data/eval/general.json")).unwrap();
    let mut probes: HashSet<String> = HashSet::new();
    for p in general["probes"].as_array().unwrap() {
        probes.extend(shingles(p["prompt"].as_str().unwrap_or_default()));
    }
    let set =
        hearth::eval::ProbeSet::parse(hearth::eval::probes::DEFAULT_PROBES, "shipped").unwrap();
    for t in set.base_texts.iter().chain(set.json_prompts.iter()) {
        probes.extend(shingles(t));
    }
    let prompts: Vec<&str> = BUILTIN_PROMPTS
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(prompts.len() >= 64, "{}", prompts.len());
    for p in prompts {
        let shared: Vec<String> = shingles(p).intersection(&probes).cloned().collect();
        assert!(
            shared.is_empty(),
            "{p:?} shares {shared:?} with the gate's probes"
        );
    }
}

#[test]
fn answers_are_generated_once_per_base_and_cached() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let turns = replay::self_distilled(&m, &tok, "base-a", 3, dir.path()).unwrap();
    assert!(!turns.is_empty() && turns.len() <= 3, "{turns:?}");
    let first_prompt = BUILTIN_PROMPTS.lines().next().unwrap();
    assert_eq!(turns[0].prompt, first_prompt);
    let path = replay::cache_path(dir.path(), "base-a", 3);
    assert!(path.exists());
    // The cache is what a second call reads: an edited answer comes back.
    let mut edited = turns.clone();
    edited[0].answer = "edited".to_owned();
    std::fs::write(&path, serde_json::to_vec(&edited).unwrap()).unwrap();
    assert_eq!(
        replay::self_distilled(&m, &tok, "base-a", 3, dir.path()).unwrap()[0].answer,
        "edited"
    );
    // Another base (or count) has its own answers.
    let other = replay::self_distilled(&m, &tok, "base-b", 3, dir.path()).unwrap();
    assert_eq!(other, turns);
    assert!(replay::cache_path(dir.path(), "base-b", 3).exists());
}

#[test]
fn replayed_turns_change_the_update() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let cfg = TrainConfig {
        replay_fraction: 0.5,
        ..fast_cfg()
    };
    let data = vec![sft("a", "what is my dog called", "Biscuit")];
    let params = |turns: &[replay::Turn]| {
        let mut tr = LoraTrainer::new(&m, &tok, cfg.clone(), None).unwrap();
        tr.add_replay_turns(turns);
        tr.train_cycle(&data, |_| {}).unwrap();
        let a = tr.adapter().unwrap();
        a.iter()
            .flat_map(|(_, p)| p.b.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect::<Vec<f32>>()
    };
    let turns = vec![replay::Turn {
        prompt: "Describe the sound of the sea.".to_owned(),
        answer: "Waves hush and roll against the shore.".to_owned(),
    }];
    assert_ne!(params(&[]), params(&turns));
}

/// Replay alone (`replay_fraction` 1) from a fresh adapter, which is exactly the base: towards the replay
/// text's tokens the first step has a gradient; towards the base's own full distribution it has none (the
/// base is already the optimum), and with its 3 likeliest tokens only a small one, the cut tail's.
#[test]
fn distilled_replay_pulls_towards_the_base_not_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let vocab = m.config().vocab_size;
    let first_grad_norm = |top_k: usize| {
        let cfg = TrainConfig {
            replay_fraction: 1.0,
            replay_per_batch: 2,
            replay_distill_top_k: top_k,
            dropout: 0.0,
            steps: 1,
            ..fast_cfg()
        };
        let mut tr = LoraTrainer::new(&m, &tok, cfg, None).unwrap();
        let mut norm = f64::NAN;
        tr.train_cycle(&[sft("a", "what is my dog called", "Biscuit")], |s| {
            norm = s.grad_norm
        })
        .unwrap();
        norm
    };
    let (text, full, top3) = (
        first_grad_norm(0),
        first_grad_norm(vocab),
        first_grad_norm(3),
    );
    assert!(text > 1e-3, "text {text}");
    assert!(
        full < 1e-4 * text,
        "full distribution {full} vs text {text}"
    );
    assert!(
        top3 > full && top3 < text,
        "top 3 {top3}, full {full}, text {text}"
    );
}
