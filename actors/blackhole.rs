//! `blackhole`: accepts and discards samples, counting them; the end of a graph under test or benchmark.

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::message::{Message, MessageType};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BlackholeParams {
    /// Log a line every this many messages (0: never).
    pub log_every: u64,
}

static INFO: KindInfo = KindInfo {
    name: "blackhole",
    about: "discards samples, counting them in hearth_node_processed_total",
    inputs: &[PortSpec::new("in", MessageType::Sample)],
    outputs: &[],
    source: false,
};

impl ActorFactory<Message> for BlackholeParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        Ok(Box::new(Blackhole {
            log_every: self.log_every,
            seen: 0,
            node: ctx.node_id.clone(),
        }))
    }
}

impl KindParams<Message> for BlackholeParams {
    fn example() -> Self {
        BlackholeParams { log_every: 10_000 }
    }
}

struct Blackhole {
    log_every: u64,
    seen: u64,
    node: String,
}

impl Actor<Message> for Blackhole {
    fn handle(
        &mut self,
        _port: &str,
        _message: &Message,
        _out: &mut Outbox,
    ) -> Result<(), ActorError> {
        self.seen += 1;
        if self.log_every > 0 && self.seen.is_multiple_of(self.log_every) {
            tracing::info!(node = %self.node, seen = self.seen, "blackhole");
        }
        Ok(())
    }
}
