//! GRPO rewards: pluggable, shared across the training thread.

use crate::model::ChatMessage;

/// Scores one sampled completion for a prompt; `answer` is the sample's accepted answer, if any.
pub trait Reward: Send + Sync {
    fn score(&self, prompt: &[ChatMessage], completion: &str, answer: Option<&str>) -> f64;
}

/// 1 when the completion contains the accepted answer (case-insensitive, trimmed), else 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct Contains;

impl Reward for Contains {
    fn score(&self, _prompt: &[ChatMessage], completion: &str, answer: Option<&str>) -> f64 {
        match answer.map(str::trim) {
            Some(a) if !a.is_empty() => f64::from(u8::from(
                completion.to_lowercase().contains(&a.to_lowercase()),
            )),
            _ => 0.0,
        }
    }
}

/// 1 when the trimmed completion equals the trimmed accepted answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExactMatch;

impl Reward for ExactMatch {
    fn score(&self, _prompt: &[ChatMessage], completion: &str, answer: Option<&str>) -> f64 {
        f64::from(u8::from(
            answer.is_some_and(|a| a.trim() == completion.trim()),
        ))
    }
}

/// A format check: 1 when the completion is valid JSON.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonValid;

impl Reward for JsonValid {
    fn score(&self, _prompt: &[ChatMessage], completion: &str, _answer: Option<&str>) -> f64 {
        f64::from(u8::from(
            serde_json::from_str::<serde_json::Value>(completion.trim()).is_ok(),
        ))
    }
}

/// The built-in reward a config names.
pub fn builtin(kind: super::RewardKind) -> std::sync::Arc<dyn Reward> {
    match kind {
        super::RewardKind::Contains => std::sync::Arc::new(Contains),
        super::RewardKind::ExactMatch => std::sync::Arc::new(ExactMatch),
        super::RewardKind::JsonValid => std::sync::Arc::new(JsonValid),
    }
}
