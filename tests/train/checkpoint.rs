//! A killed run resumes from its last checkpoint and ends with the same bytes as an
//! uninterrupted run of the same seed.

use crate::train_util;

use hearth::train::{LoraTrainer, TrainConfig};
use train_util::*;

fn cfg() -> TrainConfig {
    TrainConfig {
        steps: 6,
        checkpoint_every: 2,
        dropout: 0.1,
        grad_accum: 2,
        ..fast_cfg()
    }
}

fn bytes(m: &hearth::model::Transformer, tr: &LoraTrainer, dir: &std::path::Path) -> Vec<u8> {
    tr.adapter().unwrap().save_peft(dir, m.config()).unwrap();
    std::fs::read(dir.join("adapter_model.safetensors")).unwrap()
}

#[test]
fn a_killed_run_resumes_to_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());

    let mut whole = LoraTrainer::new(&m, &tok, cfg(), None).unwrap();
    whole.set_checkpoint_dir(dir.path().join("ck-whole"));
    let r = whole.train_cycle(&mixed(), |_| {}).unwrap();
    assert_eq!((r.steps, r.resumed_at_step), (6, None));
    let want = bytes(&m, &whole, &dir.path().join("whole"));
    assert!(
        !dir.path().join("ck-whole/checkpoint").exists(),
        "a finished cycle keeps no checkpoint"
    );

    // "Kill" the run during step 4 (0-based 3): the checkpoint after step 2 survives.
    let ck = dir.path().join("ck");
    let killed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut tr = LoraTrainer::new(&m, &tok, cfg(), None).unwrap();
        tr.set_checkpoint_dir(&ck);
        tr.train_cycle(&mixed(), |s| assert!(s.step < 3, "killed"))
            .unwrap();
    }));
    assert!(killed.is_err());
    assert!(ck.join("checkpoint/state.json").exists());

    let mut resumed = LoraTrainer::new(&m, &tok, cfg(), None).unwrap();
    resumed.set_checkpoint_dir(&ck);
    let r = resumed.train_cycle(&mixed(), |_| {}).unwrap();
    assert_eq!(r.resumed_at_step, Some(4));
    assert_eq!(r.steps, 2);
    assert_eq!(bytes(&m, &resumed, &dir.path().join("resumed")), want);
}

#[test]
fn a_checkpoint_of_other_data_or_recipe_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny(dir.path());
    let ck = dir.path().join("ck");
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut tr = LoraTrainer::new(&m, &tok, cfg(), None).unwrap();
        tr.set_checkpoint_dir(&ck);
        tr.train_cycle(&mixed(), |s| assert!(s.step < 3, "killed"))
            .unwrap();
    }));
    let mut other = cfg();
    other.learning_rate *= 2.0;
    let mut tr = LoraTrainer::new(&m, &tok, other, None).unwrap();
    tr.set_checkpoint_dir(&ck);
    let r = tr.train_cycle(&mixed(), |_| {}).unwrap();
    assert_eq!((r.resumed_at_step, r.steps), (None, 6));
}
