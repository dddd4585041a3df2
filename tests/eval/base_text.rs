//! The base-perplexity leg measures drift on text replay never trains on, of other kinds than replay's plain
//! factual sentences, so that training on replay cannot lower it by imitation.

use std::collections::HashSet;

use hearth::eval::{Evaluator, GateConfig, ProbeSet};
use hearth::train::{BUILTIN_REPLAY, LoraTrainer, TrainConfig};

fn shipped() -> ProbeSet {
    ProbeSet::parse(hearth::eval::probes::DEFAULT_PROBES, "shipped").unwrap()
}

fn shingles(text: &str, n: usize) -> HashSet<String> {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    words.windows(n).map(|w| w.join(" ")).collect()
}

#[test]
fn base_texts_are_held_out_from_replay_and_of_other_kinds() {
    let set = shipped();
    let replay = shingles(BUILTIN_REPLAY, 4);
    for text in &set.base_texts {
        let own = shingles(text, 4);
        let shared: Vec<&String> = own.intersection(&replay).collect();
        assert!(shared.is_empty(), "{text:?} shares {shared:?} with replay");
    }
    // Replay is one plain sentence per line; the leg's texts are mostly not.
    let multi_line = set.base_texts.iter().filter(|t| t.contains('\n')).count();
    let non_ascii = set.base_texts.iter().filter(|t| !t.is_ascii()).count();
    assert!(multi_line * 2 >= set.base_texts.len(), "{multi_line}");
    assert!(non_ascii >= 4, "{non_ascii} texts in other languages");
}

/// Replay-style sentences of the kind the leg used to hold (plain facts, one or two sentences).
const REPLAY_STYLE: &[&str] = &[
    "Water boils at 100 degrees Celsius at sea level. At higher altitudes the air pressure is lower, so water boils at a lower temperature.",
    "The heart pumps blood through the body. Arteries carry blood away from the heart and veins carry it back.",
    "Rain forms when water vapour in clouds condenses into droplets that grow heavy enough to fall to the ground.",
    "Bees collect nectar from flowers and turn it into honey. While they do so they carry pollen from one flower to another.",
    "The Earth orbits the Sun once every year and turns on its axis once every day, which gives us day and night.",
    "Bread is made from flour, water, salt and yeast. The yeast ferments sugars in the dough and releases gas that makes it rise.",
];

/// By hand, on a real model (`HEARTH_EVAL_MODEL=PATH.gguf cargo test --release --test eval -- --ignored
/// replay_training --nocapture`): a delta trained on replay alone moves replay-style text's perplexity
/// more than the leg's texts. Prints both, before and after.
#[test]
#[ignore = "needs a real model: HEARTH_EVAL_MODEL"]
fn replay_training_lowers_replay_style_text_more_than_the_leg_text() {
    let Ok(path) = std::env::var("HEARTH_EVAL_MODEL") else {
        eprintln!("SKIPPED: set HEARTH_EVAL_MODEL to a GGUF");
        return;
    };
    let (m, tok) = hearth::model::load(&path).unwrap();
    let leg = shipped();
    let mut replay_style = leg.clone();
    replay_style.base_texts = REPLAY_STYLE.iter().map(|s| (*s).to_owned()).collect();
    let cfg = GateConfig::default();
    let ppl = |probes: &ProbeSet, lora: Option<&hearth::model::LoraSet>| {
        Evaluator::new(&m, &tok, probes, &cfg)
            .score(lora, &[])
            .unwrap()
            .base_perplexity
    };
    let before = (ppl(&replay_style, None), ppl(&leg, None));
    let steps: usize = std::env::var("HEARTH_EVAL_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let recipe = TrainConfig {
        seed: 1,
        rank: 8,
        alpha: 16.0,
        learning_rate: 5e-4,
        warmup_steps: 4,
        steps,
        batch_size: 4,
        max_seq_len: 96,
        replay_fraction: 1.0,
        replay_builtin: true,
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    let mut tr = LoraTrainer::new(&m, &tok, recipe, None).unwrap();
    let filler = crate::train_util::sft("f", "Say hello.", "Hello!");
    tr.train_cycle(&[filler], |_| {}).unwrap();
    let delta = tr.adapter().unwrap();
    let after = (ppl(&replay_style, Some(&delta)), ppl(&leg, Some(&delta)));
    let change = |(b, a): (f64, f64)| (a / b - 1.0) * 100.0;
    eprintln!(
        "replay-style: {:.2} -> {:.2} ({:+.1}%); leg texts: {:.2} -> {:.2} ({:+.1}%) after {steps} replay steps",
        before.0,
        after.0,
        change((before.0, after.0)),
        before.1,
        after.1,
        change((before.1, after.1)),
    );
    assert!(
        change((before.0, after.0)) < change((before.1, after.1)),
        "replay training lowered the leg's texts as much as replay-style text"
    );
}

/// By hand, on a real model (`HEARTH_EVAL_MODEL=PATH.gguf cargo test --release --test eval -- --ignored
/// replay_against_drift --nocapture`): the default recipe trained on four user facts with no replay, with
/// the built-in text replay, and with that plus the base's own answers (self-distilled replay); prints each
/// delta's general score and base perplexity beside the base's.
#[test]
#[ignore = "needs a real model: HEARTH_EVAL_MODEL"]
fn replay_against_drift_on_a_real_model() {
    use hearth::message::Sample;
    let Ok(path) = std::env::var("HEARTH_EVAL_MODEL") else {
        eprintln!("SKIPPED: set HEARTH_EVAL_MODEL to a GGUF");
        return;
    };
    let (m, tok) = hearth::model::load(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (set, _) = ProbeSet::frozen_for_base(dir.path(), "base", None).unwrap();
    let facts = [
        ("What is my dog called?", "Your dog is called Biscuit."),
        ("Where do I work?", "You work at the Lindenhof bakery."),
        (
            "When is my birthday?",
            "Your birthday is on the 3rd of May.",
        ),
        (
            "What is my favourite colour?",
            "Your favourite colour is teal.",
        ),
    ];
    let data: Vec<Sample> = facts
        .iter()
        .enumerate()
        .map(|(i, (q, a))| crate::train_util::sft(&format!("f{i}"), q, a))
        .collect();
    let steps: usize = std::env::var("HEARTH_EVAL_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let recipe = TrainConfig {
        seed: 1,
        rank: 8,
        alpha: 16.0,
        learning_rate: 5e-4,
        warmup_steps: 4,
        steps,
        batch_size: 4,
        max_seq_len: 96,
        replay_fraction: 0.25,
        replay_builtin: true,
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    let cfg = GateConfig::default();
    let ev = Evaluator::new(&m, &tok, &set, &cfg);
    let base = ev.score(None, &[]).unwrap();
    eprintln!(
        "base: general {}/{}, base perplexity {:.3}",
        base.general_correct, base.general_total, base.base_perplexity
    );
    let turns = hearth::train::replay::self_distilled(&m, &tok, "measure", 64, dir.path()).unwrap();
    for (name, fraction, distilled) in [
        ("no replay", 0.0, false),
        ("text replay", 0.25, false),
        ("text + self-distilled replay", 0.25, true),
    ] {
        let r = TrainConfig {
            replay_fraction: fraction,
            ..recipe.clone()
        };
        let mut tr = LoraTrainer::new(&m, &tok, r, None).unwrap();
        if distilled {
            tr.add_replay_turns(&turns);
        }
        tr.train_cycle(&data, |_| {}).unwrap();
        let delta = tr.adapter().unwrap();
        let s = ev.score(Some(&delta), &[]).unwrap();
        eprintln!(
            "{name}: general {}/{} ({:+}), base perplexity {:.3} ({:+.2}%) after {steps} steps",
            s.general_correct,
            s.general_total,
            s.general_correct as i64 - base.general_correct as i64,
            s.base_perplexity,
            (s.base_perplexity / base.base_perplexity - 1.0) * 100.0
        );
    }
}
