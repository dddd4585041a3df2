//! `guard`: the gate that drops (or quarantines) samples still carrying personal or unsafe content after
//! redaction. Verdicts follow the Qwen3Guard structure; the policy is a graph parameter.
//!
//! Glue over [`crate::curate::guard::judge_sample`]. Every sample not admitted leaves as a [`Decision`] with its reason.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::curate::guard::{GuardBackend, GuardBackendKind, GuardPolicy, Judgement, judge_sample};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::message::Decision;
use crate::message::{Message, MessageType};

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
        let backend = self
            .backend
            .open(
                &self.policy,
                &ctx.data_dir,
                &ctx.resources.get::<crate::model::BaseCache>(),
            )
            .map_err(|e| ActorError::build_from(format!("node `{}`", ctx.node_id), e))?;
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

impl Actor<Message> for Guard {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let sample = crate::message::expect_sample(port, message)?;
        let node = self.node.clone();
        let Judgement::KeepOut {
            outcome,
            reason,
            detail,
            label,
        } = judge_sample(self.backend.as_ref(), &self.policy, &sample.content)
        else {
            let mut sample = sample.clone();
            Arc::make_mut(&mut sample).record(&node, "admitted", serde_json::Value::Null);
            metrics::counter!("hearth_guard_decisions_total", "node" => node, "decision" => "admit")
                .increment(1);
            return Ok(out.send("out", Message::Sample(sample))?);
        };
        metrics::counter!("hearth_guard_decisions_total", "node" => node.clone(), "decision" => label)
            .increment(1);
        let mut sample = Arc::unwrap_or_clone(sample.clone());
        sample.record(&node, label, detail);
        let decision = Decision {
            sample,
            node,
            outcome,
            reason: format!("guard: {reason}"),
        };
        Ok(out.send("decisions", Message::Decision(Arc::new(decision)))?)
    }
}
