//! `guard`: the gate that drops (or quarantines) samples still carrying personal or unsafe content after
//! redaction. Verdicts follow the Qwen3Guard structure; the policy is a graph parameter.
//!
//! Thin over [`crate::curate::guard`]. Every sample not admitted leaves as a [`Decision`] with its reason.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::curate::guard::{BuiltinGuard, GuardBackend, GuardDecision, GuardPolicy, ModelGuard};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::message::{Decision, Outcome};
use crate::message::{Message, MessageType};

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
}

fn default_max_new_tokens() -> usize {
    128
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardParams {
    pub backend: GuardBackendKind,
    pub policy: GuardPolicy,
}

static INFO: KindInfo = KindInfo {
    name: "guard",
    about: "classifies prompt and response sides (Qwen3Guard verdicts); drops or quarantines by policy",
    inputs: &[PortSpec::new("in", MessageType::Sample)],
    outputs: &[
        PortSpec::new("out", MessageType::Sample),
        PortSpec::new("decisions", MessageType::Decision),
    ],
    source: false,
};

impl ActorFactory<Message> for GuardParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        let build = |e: crate::curate::guard::GuardError| {
            ActorError::build_from(format!("node `{}`", ctx.node_id), e)
        };
        let backend: Box<dyn GuardBackend> = match &self.backend {
            GuardBackendKind::Builtin => {
                Box::new(BuiltinGuard::from_policy(&self.policy).map_err(build)?)
            }
            GuardBackendKind::Model {
                model,
                adapter,
                max_new_tokens,
            } => Box::new(
                ModelGuard::load(
                    std::path::Path::new(model),
                    adapter.as_deref().map(std::path::Path::new),
                    *max_new_tokens,
                )
                .map_err(build)?,
            ),
        };
        Ok(Box::new(Guard {
            backend,
            policy: self.policy.clone(),
            node: ctx.node_id.clone(),
        }))
    }
}

impl KindParams<Message> for GuardParams {
    fn example() -> Self {
        GuardParams::default()
    }
}

struct Guard {
    backend: Box<dyn GuardBackend>,
    policy: GuardPolicy,
    node: String,
}

/// Drop outranks quarantine outranks admit.
fn rank(d: &GuardDecision) -> u8 {
    match d {
        GuardDecision::Admit => 0,
        GuardDecision::Quarantine { .. } => 1,
        GuardDecision::Drop { .. } => 2,
    }
}

impl Actor<Message> for Guard {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let sample = crate::message::expect_sample(port, message)?;
        let mut texts = sample.content.texts();
        // Every variant ends its texts with the response(s); a preference pair has two.
        let responses = match &sample.content {
            crate::message::SampleContent::Preference { .. } => texts.split_off(texts.len() - 2),
            _ => texts.split_off(texts.len() - 1),
        };
        let prompt = texts.join("\n");
        let mut worst = GuardDecision::Admit;
        // A verdict the backend could not give (a generative guard answering off-format) fails closed:
        // the sample waits in quarantine for a person, with the error as its reason.
        let mut no_verdict: Option<String> = None;
        for response in responses {
            match self.backend.classify(&prompt, response) {
                Ok(verdict) => {
                    let decision = self.policy.decide(&verdict);
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
            (GuardDecision::Admit, None) => {
                let mut sample = sample.clone();
                Arc::make_mut(&mut sample).record(&self.node, "admitted", serde_json::Value::Null);
                metrics::counter!("hearth_guard_decisions_total", "node" => self.node.clone(), "decision" => "admit")
                    .increment(1);
                return out
                    .send("out", Message::Sample(sample))
                    .map_err(ActorError::from);
            }
        };
        metrics::counter!("hearth_guard_decisions_total", "node" => self.node.clone(), "decision" => label)
            .increment(1);
        let mut sample = Arc::unwrap_or_clone(sample.clone());
        sample.record(&self.node, label, detail);
        let decision = Decision {
            sample,
            node: self.node.clone(),
            outcome,
            reason: format!("guard: {reason}"),
        };
        out.send("decisions", Message::Decision(Arc::new(decision)))
            .map_err(ActorError::from)
    }
}
