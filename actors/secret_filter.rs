//! `secret_filter`: finds credentials (provider key formats plus entropy) and, as the graph chooses, redacts
//! them as `<SECRET:rule>` or drops the whole sample with a recorded decision.
//!
//! Thin over [`crate::curate::secrets`]. Provenance and decisions carry rule names, never secret values.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
pub use crate::curate::secrets::SecretConfig;
use crate::curate::secrets::{SecretAction, SecretScanner};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::message::{Decision, Outcome};
use crate::message::{Message, MessageType};

static INFO: KindInfo = KindInfo {
    name: "secret_filter",
    about: "redacts credentials as <SECRET:rule> or drops the sample (`action: Redact | Drop`)",
    inputs: &[PortSpec::new("in", MessageType::Sample)],
    outputs: &[
        PortSpec::new("out", MessageType::Sample),
        PortSpec::new("decisions", MessageType::Decision),
    ],
    source: false,
};

impl ActorFactory<Message> for SecretConfig {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        let scanner = SecretScanner::new(self.clone())
            .map_err(|e| ActorError::build_from("secret filter rules", e))?;
        Ok(Box::new(SecretFilter {
            scanner,
            node: ctx.node_id.clone(),
        }))
    }
}

impl KindParams<Message> for SecretConfig {
    fn example() -> Self {
        SecretConfig::default()
    }
}

struct SecretFilter {
    scanner: SecretScanner,
    node: String,
}

impl Actor<Message> for SecretFilter {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let sample = crate::message::expect_sample(port, message)?;
        let mut sample = sample.clone();
        let mut rules: BTreeMap<&'static str, u64> = BTreeMap::new();
        let action = self.scanner.config().action;
        // Redact in both modes: a dropped sample is kept as a decision record, which must not hold the secret.
        for text in Arc::make_mut(&mut sample).content.texts_mut() {
            let (redacted, findings) = self.scanner.redact(text);
            if findings.is_empty() {
                continue;
            }
            *text = redacted;
            for f in findings {
                *rules.entry(f.rule).or_default() += 1;
            }
        }
        for (rule, n) in &rules {
            metrics::counter!("hearth_secret_filter_findings_total", "node" => self.node.clone(), "rule" => *rule)
                .increment(*n);
        }
        let details = serde_json::to_value(&rules).unwrap_or_default();
        let send =
            |out: &mut Outbox, port: &str, m: Message| out.send(port, m).map_err(ActorError::from);
        if action == SecretAction::Drop && !rules.is_empty() {
            Arc::make_mut(&mut sample).record(&self.node, "dropped", details);
            let names: Vec<&str> = rules.keys().copied().collect();
            let decision = Decision {
                sample: Arc::unwrap_or_clone(sample),
                node: self.node.clone(),
                outcome: Outcome::Dropped,
                reason: format!("secret: {}", names.join(", ")),
            };
            return send(out, "decisions", Message::Decision(Arc::new(decision)));
        }
        Arc::make_mut(&mut sample).record(&self.node, "scanned", details);
        send(out, "out", Message::Sample(sample))
    }
}
