//! `throttle`: passes samples through after a fixed delay, recording itself in their provenance.
//!
//! A stand-in for a slow stage: backpressure drills, drop-policy drills and pipeline benchmarks use it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::message::{Message, MessageType};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottleParams {
    /// Time spent on each message, in microseconds (0 passes straight through).
    pub delay_us: u64,
}

static INFO: KindInfo = KindInfo {
    name: "throttle",
    about: "passes samples through after `delay_us`, appending a provenance step",
    inputs: &[PortSpec::new("in", MessageType::Sample)],
    outputs: &[PortSpec::new("out", MessageType::Sample)],
    source: false,
};

impl ActorFactory<Message> for ThrottleParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        Ok(Box::new(Throttle {
            delay: Duration::from_micros(self.delay_us),
            node: ctx.node_id.clone(),
        }))
    }
}

impl KindParams<Message> for ThrottleParams {
    fn example() -> Self {
        ThrottleParams { delay_us: 500 }
    }
}

struct Throttle {
    delay: Duration,
    node: String,
}

impl Actor<Message> for Throttle {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let sample = crate::message::expect_sample(port, message)?;
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let mut sample = sample.clone();
        std::sync::Arc::make_mut(&mut sample).record(&self.node, "passed", serde_json::Value::Null);
        out.send("out", Message::Sample(sample))
            .map_err(ActorError::from)
    }
}
