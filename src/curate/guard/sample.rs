//! Judging a whole training sample: each response side with its prompt, the worst decision winning.

use serde::{Deserialize, Serialize};

use super::{
    BuiltinGuard, GuardBackend, GuardDecision, GuardError, GuardPolicy, ModelGuard, ProbeGuard,
    ProbeHead,
};
use crate::message::{Outcome, SampleContent};
use crate::model::BaseCache;

/// Which classifier judges samples.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum GuardBackendKind {
    /// The classifier trained by hearth's own code on `data/guard/`.
    #[default]
    Builtin,
    /// A generative guard in GGUF (the Qwen3Guard-Gen family), optionally with a PEFT adapter directory;
    /// each answer is at most `max_new_tokens` long.
    Model {
        model: String,
        #[serde(default)]
        adapter: Option<String>,
        #[serde(default = "default_max_new_tokens")]
        max_new_tokens: usize,
    },
    /// The builtin guard plus the probe shipped in `data/guard/probe.json`: a logistic head on the
    /// base model's residual stream that sends prompts the builtin guard calls Safe to
    /// `Controversial` when it is confident. `model` is the base it reads, held in the graph's
    /// shared cache (absent: the default model, as `serve` resolves it); a base the probe was not
    /// trained on is refused when the node is built.
    Probe {
        #[serde(default)]
        model: Option<String>,
    },
}

fn default_max_new_tokens() -> usize {
    128
}

impl GuardBackendKind {
    /// Builds (or loads) the classifier this kind names; a base model comes from `bases`, resolved
    /// against `data_dir` when the default model is meant.
    pub fn open(
        &self,
        policy: &GuardPolicy,
        data_dir: &std::path::Path,
        bases: &BaseCache,
    ) -> Result<Box<dyn GuardBackend>, GuardError> {
        Ok(match self {
            GuardBackendKind::Builtin => Box::new(BuiltinGuard::from_policy(policy)?),
            GuardBackendKind::Model {
                model,
                adapter,
                max_new_tokens,
            } => Box::new(ModelGuard::load(
                std::path::Path::new(model),
                adapter.as_deref().map(std::path::Path::new),
                *max_new_tokens,
            )?),
            GuardBackendKind::Probe { model } => {
                let path = crate::serve::model_path(model.as_deref(), data_dir)
                    .map_err(|e| GuardError::Model(format!("resolving the probe's base: {e}")))?;
                let base = bases
                    .get(&path)
                    .map_err(|e| GuardError::Model(format!("{}: {e}", path.display())))?;
                Box::new(ProbeGuard::new(
                    BuiltinGuard::from_policy(policy)?,
                    base,
                    ProbeHead::shipped()?,
                )?)
            }
        })
    }
}

/// What happens to a sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Judgement {
    Admit,
    /// Kept out of training: `label` (`drop` or `quarantine`) names the action in provenance and metrics,
    /// `detail` is the machine-readable reason.
    KeepOut {
        outcome: Outcome,
        reason: String,
        detail: serde_json::Value,
        label: &'static str,
    },
}

/// Drop outranks quarantine outranks admit.
fn rank(d: &GuardDecision) -> u8 {
    match d {
        GuardDecision::Admit => 0,
        GuardDecision::Quarantine { .. } => 1,
        GuardDecision::Drop { .. } => 2,
    }
}

/// Classifies every response of `content` with its prompt. A verdict the backend could not give (a
/// generative guard answering off-format) fails closed: the sample waits in quarantine for a person, with
/// the error as its reason.
pub fn judge_sample(
    backend: &dyn GuardBackend,
    policy: &GuardPolicy,
    content: &SampleContent,
) -> Judgement {
    let mut texts = content.texts();
    // Every variant ends its texts with the response(s); a preference pair has two.
    let responses = match content {
        SampleContent::Preference { .. } => texts.split_off(texts.len() - 2),
        _ => texts.split_off(texts.len() - 1),
    };
    let prompt = texts.join("\n");
    let mut worst = GuardDecision::Admit;
    let mut no_verdict: Option<String> = None;
    for response in responses {
        match backend.classify(&prompt, response) {
            Ok(verdict) => {
                let decision = policy.decide(&verdict);
                if rank(&decision) > rank(&worst) {
                    worst = decision;
                }
            }
            Err(e) => no_verdict = Some(e.to_string()),
        }
    }
    let (outcome, reason, detail, label) = match (&worst, no_verdict) {
        (GuardDecision::Drop { reason }, _) => (
            Outcome::Dropped,
            reason.to_string(),
            serde_json::to_value(reason).unwrap_or_default(),
            "drop",
        ),
        (_, Some(error)) => (
            Outcome::Quarantined,
            format!("no verdict: {error}"),
            serde_json::Value::String(error),
            "quarantine",
        ),
        (GuardDecision::Quarantine { reason }, None) => (
            Outcome::Quarantined,
            reason.to_string(),
            serde_json::to_value(reason).unwrap_or_default(),
            "quarantine",
        ),
        (GuardDecision::Admit, None) => return Judgement::Admit,
    };
    Judgement::KeepOut {
        outcome,
        reason,
        detail,
        label,
    }
}
