//! `guard`: the gate that drops (or quarantines) samples still carrying personal or unsafe content after
//! redaction. Verdicts follow the Qwen3Guard structure; the policy is a graph parameter.
//!
//! Thin over [`crate::curate::guard`]. Every sample not admitted leaves as a [`Decision`] with its reason.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::curate::guard::{BuiltinGuard, GuardBackend, GuardDecision, GuardPolicy};
use crate::engine::message::{Decision, Outcome};
use crate::engine::{
    Actor, ActorError, ActorFactory, BuildContext, KindInfo, KindParams, Message, MessageType, Outbox,
    PortSpec,
};

/// Which classifier judges samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum GuardBackendKind {
    /// The classifier trained by hearth's own code on `data/guard/`.
    #[default]
    Builtin,
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

impl ActorFactory for GuardParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Actor>, ActorError> {
        let backend: Box<dyn GuardBackend> = match self.backend {
            GuardBackendKind::Builtin => Box::new(
                BuiltinGuard::from_policy(&self.policy).map_err(|e| ActorError::Build(e.to_string()))?,
            ),
        };
        Ok(Box::new(Guard {
            backend,
            policy: self.policy.clone(),
            node: ctx.node_id.clone(),
        }))
    }
}

impl KindParams for GuardParams {
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

impl Actor for Guard {
    fn handle(&mut self, port: &str, message: &Message, out: &mut Outbox) -> Result<(), ActorError> {
        let sample = crate::engine::expect_sample(port, message)?;
        let mut texts = sample.content.texts();
        // Every variant ends its texts with the response(s); a preference pair has two.
        let responses = match &sample.content {
            crate::engine::message::SampleContent::Preference { .. } => texts.split_off(texts.len() - 2),
            _ => texts.split_off(texts.len() - 1),
        };
        let prompt = texts.join("\n");
        let mut worst = GuardDecision::Admit;
        for response in responses {
            let verdict = self
                .backend
                .classify(&prompt, response)
                .map_err(|e| ActorError::Failed(e.to_string()))?;
            let decision = self.policy.decide(&verdict);
            if rank(&decision) > rank(&worst) {
                worst = decision;
            }
        }
        let (outcome, reason, label) = match &worst {
            GuardDecision::Admit => {
                let mut sample = sample.clone();
                Arc::make_mut(&mut sample).record(&self.node, "admitted", serde_json::Value::Null);
                metrics::counter!("hearth_guard_decisions_total", "node" => self.node.clone(), "decision" => "admit")
                    .increment(1);
                return out
                    .send("out", Message::Sample(sample)).map_err(ActorError::from);
            }
            GuardDecision::Drop { reason } => (Outcome::Dropped, reason, "drop"),
            GuardDecision::Quarantine { reason } => (Outcome::Quarantined, reason, "quarantine"),
        };
        metrics::counter!("hearth_guard_decisions_total", "node" => self.node.clone(), "decision" => label)
            .increment(1);
        let mut sample = Arc::unwrap_or_clone(sample.clone());
        sample.record(&self.node, label, serde_json::to_value(reason).unwrap_or_default());
        let decision = Decision {
            sample,
            node: self.node.clone(),
            outcome,
            reason: format!("guard: {reason}"),
        };
        out.send("decisions", Message::Decision(Arc::new(decision))).map_err(ActorError::from)
    }
}
