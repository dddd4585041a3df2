//! Training LoRA deltas over the frozen (possibly quantized) base: SFT on assistant tokens, DPO on
//! preference pairs, KTO on thumbs, scored answers by their score's advantage (or GRPO on their prompts
//! with a reward), with replay text mixed into every batch against forgetting.
//!
//! The base is never written: gradients reach the adapter through `forward_train` (see
//! `model::transformer`), and reference log-probs for DPO/KTO/scores/GRPO come from the same model with
//! the adapter disabled, so no second copy of the model is held. A finished cycle is saved as a
//! PEFT adapter plus `provenance.json` binding it to its base, recipe, data and parent.

pub mod artifact;
pub mod config;
pub mod cycle;
pub mod data;
pub mod loss;
pub mod merge;
pub mod reconcile;
pub mod replay;
pub mod reward;
pub mod trainer;

pub use artifact::{Provenance, save_delta, sha256_file, sha256_hex};
pub use config::{RewardKind, TrainConfig};
pub use cycle::{BaseSource, CycleSettings, Cycles, StartFrom, TrainingWindow};
pub use data::{Example, Seq, data_digest, encode_sample};
pub use reward::{Contains, ExactMatch, JsonValid, Reward};
pub use trainer::{CycleReport, LoraTrainer, StepReport};

/// General-language sentences shipped in the binary for the replay loss (`replay_builtin`): training
/// mixes them in so a delta keeps the base's plain language, wherever the process runs from.
pub const BUILTIN_REPLAY: &str = include_str!("../../data/replay/base.txt");

use crate::model::ModelError;

/// Everything that can stop a training cycle.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("config: {0}")]
    Config(String),
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("io error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no trainable example among {0} samples")]
    NoData(usize),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("the training thread panicked")]
    Panicked,
}

/// A thread pool for training that serving does not compete with: candle's CPU kernels run on the
/// current rayon pool, so a cycle run inside `pool.install(..)` uses only these `threads`, and each of them
/// runs in the idle scheduling class (Linux), so serving always comes first for a core.
pub fn background_pool(threads: usize) -> Result<rayon::ThreadPool> {
    // Threads inherit their creator's scheduling class: the process-wide pools that serving's and the eval
    // gate's kernels run on (rayon's global pool, candle's CPU pool and its quantized-kernel barrier pool)
    // must exist before anything runs in the idle class, or a training thread would create them and
    // they would starve with it.
    let _ = rayon::current_num_threads();
    let _ = candle_core::utils::barrier_pool();
    candle_core::utils::with_threadpool(|| ());
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("hearth-train-{i}"))
        .start_handler(|_| lower_thread_priority())
        .build()
        .map_err(|e| TrainError::Config(format!("training thread pool: {e}")))
}

/// Linux: SCHED_IDLE, so a training thread runs only on a core nothing else wants (nice 19 is still given
/// a share against serving, which shows in serving's tail latency). Elsewhere: unchanged.
fn lower_thread_priority() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: sched_setscheduler on the calling thread (pid 0) with a valid, zeroed sched_param (SCHED_IDLE
    // requires priority 0) changes only that thread's scheduling class.
    unsafe {
        let param: libc::sched_param = std::mem::zeroed();
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
    }
}

/// Result alias for the train module.
pub type Result<T> = std::result::Result<T, TrainError>;

pub(crate) fn io_err(path: &std::path::Path, source: std::io::Error) -> TrainError {
    TrainError::Io {
        path: path.display().to_string(),
        source,
    }
}
