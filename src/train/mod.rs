//! Training LoRA deltas over the frozen (possibly quantized) base: SFT on assistant tokens, DPO on
//! preference pairs, KTO on thumbs, GRPO on prompts with a reward, with replay text mixed into
//! every batch against forgetting.
//!
//! The base is never written: gradients reach the adapter through `forward_train` (see
//! `model::transformer`), and reference log-probs for DPO/KTO/GRPO come from the same model with
//! the adapter disabled, so no second copy of the model is held. A finished cycle is saved as a
//! PEFT adapter plus `provenance.json` binding it to its base, recipe, data and parent.

pub mod artifact;
pub mod config;
pub mod data;
pub mod loss;
pub mod reward;
pub mod trainer;

pub use artifact::{Provenance, save_delta, sha256_file, sha256_hex};
pub use config::{RewardKind, TrainConfig};
pub use data::{Example, Seq, data_digest, encode_sample};
pub use reward::{Contains, ExactMatch, JsonValid, Reward};
pub use trainer::{CycleReport, LoraTrainer, StepReport};

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
}

/// Result alias for the train module.
pub type Result<T> = std::result::Result<T, TrainError>;

pub(crate) fn io_err(path: &std::path::Path, source: std::io::Error) -> TrainError {
    TrainError::Io {
        path: path.display().to_string(),
        source,
    }
}
