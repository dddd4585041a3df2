//! Score feedback trains by default: without GRPO, each scored answer's likelihood is weighted by its score's
//! advantage over the baseline, so the scores themselves (not only which answers were scored) decide the
//! update, and each option of that objective is read.

use hearth::message::Sample;
use hearth::model::{LoraSet, Tokenizer, Transformer};
use hearth::train::data::encode_turns;
use hearth::train::loss::sequence_logps;
use hearth::train::{LoraTrainer, TrainConfig};

use crate::train_util::*;

const GOOD: (&str, &str) = ("name a colour", "blue sky");
const BAD: (&str, &str) = ("name a fruit", "dusty rock");

fn rated(good: f64, bad: f64) -> Vec<Sample> {
    vec![
        scored("s1", GOOD.0, GOOD.1, good),
        scored("s2", BAD.0, BAD.1, bad),
    ]
}

fn cfg() -> TrainConfig {
    TrainConfig {
        steps: 12,
        replay_fraction: 0.0,
        ..fast_cfg()
    }
}

fn train(m: &Transformer, tok: &Tokenizer, cfg: TrainConfig, data: &[Sample]) -> LoraSet {
    let mut tr = LoraTrainer::new(m, tok, cfg, None).unwrap();
    tr.train_cycle(data, |_| {}).unwrap();
    tr.adapter().unwrap()
}

/// Log-likelihood of `answer` after `prompt`, per answer token.
fn logp(m: &Transformer, tok: &Tokenizer, lora: Option<&LoraSet>, (q, a): (&str, &str)) -> f64 {
    let prompt = [hearth::model::ChatMessage::new(
        hearth::message::Role::User,
        q,
    )];
    let seq = encode_turns(tok, &prompt, a, 64).unwrap();
    let lp = sequence_logps(m, lora, &[&seq], 0, false, None)
        .unwrap()
        .logps;
    let sum: f32 = lp.sums().unwrap().to_vec1::<f32>().unwrap()[0];
    sum as f64 / seq.scored() as f64
}

fn flat(set: &LoraSet) -> Vec<f32> {
    set.iter()
        .flat_map(|(_, p)| {
            let mut v = p.a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.extend(p.b.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            v
        })
        .collect()
}

#[test]
fn score_feedback_trains_by_default_and_the_scores_steer_the_update() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    assert_eq!(TrainConfig::default().grpo_group_size, 0);
    let before = (logp(&m, &tok, None, GOOD), logp(&m, &tok, None, BAD));
    let liked = train(&m, &tok, cfg(), &rated(5.0, 1.0));
    let after = (
        logp(&m, &tok, Some(&liked), GOOD),
        logp(&m, &tok, Some(&liked), BAD),
    );
    eprintln!("before {before:?}, after {after:?}");
    assert!(after.0 > before.0, "the well-scored answer got no likelier");
    assert!(
        after.1 < before.1,
        "the badly scored answer got no less likely"
    );
    // The same answers with the scores swapped move the other way.
    let swapped = train(&m, &tok, cfg(), &rated(1.0, 5.0));
    assert!(logp(&m, &tok, Some(&swapped), GOOD) < before.0);
    assert!(logp(&m, &tok, Some(&swapped), BAD) > before.1);
    // Equal scores carry no advantage: only the KL term acts, and the adapter stays at the base (B = 0).
    let flat_scores = train(&m, &tok, cfg(), &rated(3.0, 3.0));
    let b_norm: f32 = flat_scores
        .iter()
        .map(|(_, p)| {
            p.b.sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        })
        .sum();
    assert!(b_norm < 1e-10, "equal scores moved the adapter: {b_norm}");
}

#[test]
fn the_score_objectives_options_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let data = rated(5.0, 1.0);
    let reference = flat(&train(&m, &tok, cfg(), &data));
    // A fixed baseline above both scores makes both answers less likely.
    let high = TrainConfig {
        score_baseline: Some(10.0),
        ..cfg()
    };
    let pessimist = train(&m, &tok, high.clone(), &data);
    assert_ne!(flat(&pessimist), reference);
    assert!(logp(&m, &tok, Some(&pessimist), GOOD) < logp(&m, &tok, None, GOOD));
    // With a fixed baseline a lone score counts too; with the cycle's mean it carries no advantage.
    let lone = [scored("s1", GOOD.0, GOOD.1, 5.0)];
    let fixed = TrainConfig {
        score_baseline: Some(0.0),
        ..cfg()
    };
    assert!(
        logp(&m, &tok, Some(&train(&m, &tok, fixed, &lone)), GOOD) > logp(&m, &tok, None, GOOD)
    );
    let kl = TrainConfig {
        score_kl_coef: 5.0,
        ..cfg()
    };
    assert_ne!(flat(&train(&m, &tok, kl, &data)), reference);
}
