//! `simulate`: scripted users for the demo graph (see [`crate::demo`]): each turn sends an interaction and,
//! when the user reacts, its feedback.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::demo::{SIMULATE_PLANTED, Script};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams, Produce};
use crate::message::{Message, MessageType};

pub use crate::demo::events_per_round;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimulateParams {
    /// Times the whole script is played; `None` plays forever.
    pub rounds: Option<u64>,
    /// Pause between turns.
    pub interval_ms: u64,
}

impl Default for SimulateParams {
    fn default() -> Self {
        SimulateParams {
            rounds: Some(20),
            interval_ms: 50,
        }
    }
}

static INFO: KindInfo = KindInfo {
    name: "simulate",
    about: "scripted users who ask, give thumbs, edit answers and sometimes paste personal data (demo)",
    inputs: &[],
    outputs: &[
        PortSpec::new("interactions", MessageType::Interaction),
        PortSpec::new("feedback", MessageType::Feedback),
    ],
    source: true,
};

impl ActorFactory<Message> for SimulateParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn planted(&self) -> Vec<String> {
        SIMULATE_PLANTED.iter().map(|p| (*p).to_owned()).collect()
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        Ok(Box::new(Simulate {
            interval_ms: self.interval_ms,
            script: Script::new(
                format!(
                    "{}{}",
                    ctx.node_id,
                    if ctx.worker == 0 {
                        String::new()
                    } else {
                        format!("#{}", ctx.worker)
                    }
                ),
                self.rounds,
            ),
        }))
    }
}

impl KindParams<Message> for SimulateParams {
    fn example() -> Self {
        SimulateParams::default()
    }
}

struct Simulate {
    interval_ms: u64,
    script: Script,
}

impl Actor<Message> for Simulate {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        _out: &mut Outbox,
    ) -> Result<(), ActorError> {
        Err(crate::message::unexpected(port, message))
    }

    fn produce(&mut self, out: &mut Outbox) -> Result<Produce, ActorError> {
        let Some((interaction, feedback)) = self.script.next_turn() else {
            return Ok(Produce::Exhausted);
        };
        out.send("interactions", Message::Interaction(Arc::new(interaction)))?;
        if let Some(feedback) = feedback {
            out.send("feedback", Message::Feedback(Arc::new(feedback)))?;
        }
        Ok(if self.interval_ms == 0 {
            Produce::Produced
        } else {
            Produce::Idle(Duration::from_millis(self.interval_ms))
        })
    }
}
