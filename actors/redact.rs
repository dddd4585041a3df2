//! `redact`: replaces span-level PII in every text field of a sample with typed sentinels (`<EMAIL>`, …).
//!
//! Thin over [`crate::curate::redact`]. The sample's provenance gains the span types and counts it removed,
//! never the values.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
pub use crate::curate::redact::RedactConfig;
use crate::curate::redact::Redactor;
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::message::{Message, MessageType};

static INFO: KindInfo = KindInfo {
    name: "redact",
    about: "replaces PII spans with typed sentinels such as <EMAIL>, recording types and counts in provenance",
    inputs: &[PortSpec::new("in", MessageType::Sample)],
    outputs: &[PortSpec::new("out", MessageType::Sample)],
    source: false,
};

impl ActorFactory<Message> for RedactConfig {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        Ok(Box::new(Redact {
            redactor: Redactor::new(self.clone()),
            node: ctx.node_id.clone(),
        }))
    }
}

impl KindParams<Message> for RedactConfig {
    fn example() -> Self {
        RedactConfig::default()
    }
}

struct Redact {
    redactor: Redactor,
    node: String,
}

impl Actor<Message> for Redact {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let sample = crate::message::expect_sample(port, message)?;
        let mut sample = sample.clone();
        let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
        for text in Arc::make_mut(&mut sample).content.texts_mut() {
            let redaction = self.redactor.redact(text);
            if redaction.spans.is_empty() {
                continue;
            }
            for span in &redaction.spans {
                *counts.entry(span.pii_type.label()).or_default() += 1;
            }
            *text = redaction.text;
        }
        for (label, n) in &counts {
            metrics::counter!("hearth_redact_spans_total", "node" => self.node.clone(), "type" => *label)
                .increment(*n);
        }
        let details = serde_json::to_value(&counts).unwrap_or_default();
        Arc::make_mut(&mut sample).record(&self.node, "redacted", details);
        out.send("out", Message::Sample(sample))
            .map_err(ActorError::from)
    }
}
