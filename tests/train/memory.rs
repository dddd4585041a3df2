//! By hand, on a real model: what a training cycle leaves resident, with the main job's allocator settings,
//! and what giving the free heap back after it returns (`hearth::malloc::release_free_memory`, called after
//! every cycle and verdict).

use hearth::train::{LoraTrainer, TrainConfig};

use crate::train_util::sft;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// `HEARTH_EVAL_MODEL=PATH.gguf cargo test --release --test train -- --ignored resident --nocapture`
#[test]
#[ignore = "needs a real model: HEARTH_EVAL_MODEL"]
fn resident_memory_after_training_cycles() {
    let Ok(path) = std::env::var("HEARTH_EVAL_MODEL") else {
        eprintln!("SKIPPED: set HEARTH_EVAL_MODEL to a GGUF");
        return;
    };
    hearth::malloc::tune_for_long_runs();
    let (m, tok) = hearth::model::load(&path).unwrap();
    eprintln!("loaded: {:.0} MiB", rss_mib());
    let data: Vec<_> = (0..8)
        .map(|i| {
            sft(
                &format!("s{i}"),
                &format!("question {i}"),
                "an answer of a few words",
            )
        })
        .collect();
    let recipe = TrainConfig {
        steps: 10,
        batch_size: 4,
        max_seq_len: 96,
        replay_builtin: true,
        replay_fraction: 0.25,
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    for cycle in 1..=3 {
        let mut tr = LoraTrainer::new(&m, &tok, recipe.clone(), None).unwrap();
        tr.train_cycle(&data, |_| {}).unwrap();
        drop(tr);
        let before = rss_mib();
        hearth::malloc::release_free_memory();
        eprintln!(
            "cycle {cycle}: {before:.0} MiB resident after it, {:.0} MiB after giving the free heap back",
            rss_mib()
        );
    }
}
