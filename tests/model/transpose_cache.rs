//! Training keeps each weight's transpose for later backward passes while all kept transposes fit in
//! `transpose_cache_mib`, and builds one per pass past it: less memory, the same update.

use hearth::model::Transformer;
use hearth::model::transformer::{set_transpose_cache_limit, transpose_cache_bytes};
use hearth::train::{LoraTrainer, TrainConfig};

use crate::train_util::{fast_cfg, mixed, tiny};
use crate::util::{is_child, rerun_with};

/// Trains one cycle with `mib` as the recipe's limit (or `bytes`, set after the trainer sets the recipe's),
/// and returns every adapter value.
fn train(
    m: &Transformer,
    tok: &hearth::model::Tokenizer,
    mib: usize,
    bytes: Option<usize>,
) -> Vec<f32> {
    let cfg = TrainConfig {
        transpose_cache_mib: mib,
        ..fast_cfg()
    };
    let mut tr = LoraTrainer::new(m, tok, cfg, None).unwrap();
    if let Some(b) = bytes {
        set_transpose_cache_limit(b);
    }
    tr.train_cycle(&mixed(), |_| {}).unwrap();
    let mut out = Vec::new();
    for (_, p) in tr.adapter().unwrap().iter() {
        out.extend(p.a.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        out.extend(p.b.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    }
    out
}

/// The limit is the process's and other tests train at the same time, so this runs in a child process.
#[test]
fn transpose_cache_mib_bounds_what_training_keeps() {
    if !is_child("HEARTH_TEST_CHILD", "transpose_cache") {
        rerun_with(
            "transpose_cache::transpose_cache_mib_bounds_what_training_keeps",
            "HEARTH_TEST_CHILD",
            "transpose_cache",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, m, tok) = tiny(dir.path());
    let load = || hearth::model::load(&path).unwrap().0;

    let none = train(&m, &tok, 0, None);
    assert_eq!((m.transposed_bytes(), transpose_cache_bytes()), (0, 0));

    let all_model = load();
    let all = train(&all_model, &tok, 256, None);
    let kept = all_model.transposed_bytes();
    assert!(kept > 0);
    assert_eq!(transpose_cache_bytes(), kept);
    assert_eq!(none, all, "keeping the transposes changed the update");

    // A limit of half of that keeps some, within it; the update is the same again.
    let half_model = load();
    let half = train(&half_model, &tok, 256, Some(kept + kept / 2));
    let kept_half = half_model.transposed_bytes();
    assert!(
        kept_half > 0 && kept_half <= kept / 2,
        "{kept_half} of {kept}"
    );
    assert_eq!(transpose_cache_bytes(), kept + kept_half);
    assert_eq!(half, all);

    // Dropping a model gives its share back.
    drop(all_model);
    assert_eq!(transpose_cache_bytes(), kept_half);
}
