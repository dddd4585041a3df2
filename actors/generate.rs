//! `generate`: a source of synthetic chat samples, for demos, drills and benchmarks of a graph's plumbing.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::clock::now_unix_ms;
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams, Produce};
use crate::message::{ChatMessage, Origin, Provenance, Sample, SampleContent};
use crate::message::{Message, MessageType};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenerateParams {
    /// Samples to emit per worker; `None` runs until shutdown.
    pub count: Option<u64>,
    /// Pause between samples; 0 emits as fast as the edges accept.
    pub interval_us: u64,
    /// Prompts cycled through; each sample pairs one with a canned answer.
    pub prompts: Vec<String>,
    pub user: String,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            count: Some(100),
            interval_us: 0,
            prompts: DEMO_PROMPTS.iter().map(|s| (*s).to_owned()).collect(),
            user: "demo".to_owned(),
        }
    }
}

/// Mixed demo prompts: ordinary questions, some personal data and a secret, as a real user would paste them.
pub const DEMO_PROMPTS: &[&str] = &[
    "How do I reverse a list in Python?",
    "Please email Maria Lopez at maria.lopez@example.org about Friday's meeting.",
    "My card 4111 1111 1111 1111 was charged twice, what should I do?",
    "Why does my build fail with `error[E0382]: borrow of moved value`?",
    "Use this key for the deploy: ghp_8fK2mQ9xL4vN7pR1sT6wY3zB5cD0eH2jA9kM",
    "Summarise the plot of Hamlet in three sentences.",
    "Call me back at +1 415 555 0134 after 6pm.",
    "What is the difference between a mutex and a semaphore?",
];

static INFO: KindInfo = KindInfo {
    name: "generate",
    about: "emits synthetic chat samples (demo prompts or given ones) at a set pace",
    inputs: &[],
    outputs: &[PortSpec::new("out", MessageType::Sample)],
    source: true,
};

impl ActorFactory<Message> for GenerateParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        if self.prompts.is_empty() {
            return Err(ActorError::build("`prompts` must not be empty"));
        }
        Ok(Box::new(Generate {
            params: self.clone(),
            prefix: format!("{}-{}", ctx.node_id, ctx.worker),
            emitted: 0,
        }))
    }
}

impl KindParams<Message> for GenerateParams {
    fn example() -> Self {
        GenerateParams {
            count: Some(1000),
            interval_us: 1000,
            prompts: vec!["What is a monad?".to_owned()],
            user: "demo".to_owned(),
        }
    }
}

struct Generate {
    params: GenerateParams,
    prefix: String,
    emitted: u64,
}

impl Actor<Message> for Generate {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        _out: &mut Outbox,
    ) -> Result<(), ActorError> {
        Err(crate::message::unexpected(port, message))
    }

    fn produce(&mut self, out: &mut Outbox) -> Result<Produce, ActorError> {
        if self.params.count.is_some_and(|c| self.emitted >= c) {
            return Ok(Produce::Exhausted);
        }
        let prompt =
            &self.params.prompts[(self.emitted % self.params.prompts.len() as u64) as usize];
        let sample = Sample {
            id: format!("{}-{}", self.prefix, self.emitted),
            user: self.params.user.clone(),
            origin: Origin::Grounded,
            content: SampleContent::Sft {
                prompt: vec![ChatMessage {
                    role: crate::message::Role::User,
                    content: prompt.clone(),
                }],
                response: format!("(answer {} to: {prompt})", self.emitted),
            },
            provenance: Provenance::default(),
            created_at_unix_ms: now_unix_ms(),
        };
        self.emitted += 1;
        out.send("out", Message::Sample(std::sync::Arc::new(sample)))
            .map_err(ActorError::from)?;
        if self.params.interval_us == 0 {
            Ok(Produce::Produced)
        } else {
            Ok(Produce::Idle(Duration::from_micros(
                self.params.interval_us,
            )))
        }
    }
}
