//! `store`: the end of curation. Admitted samples join the training set; decisions record why others did not.
//!
//! Thin over [`crate::store`]: each write is one transaction that moves a pending item to exactly one
//! terminal state, so a replayed item is never counted twice. A newly admitted sample, once committed, goes
//! on to `training` (the trainer), so the trainer never sees a sample the store could still lose.

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, Context, KindParams};
use crate::message::{Message, MessageType};
use crate::store::Store;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreParams {}

static INFO: KindInfo = KindInfo {
    name: "store",
    about: "writes admitted samples to the training set and curation decisions (drop, quarantine) to the store",
    inputs: &[
        PortSpec::optional("admitted", MessageType::Sample),
        PortSpec::optional("decisions", MessageType::Decision),
    ],
    outputs: &[PortSpec::new("training", MessageType::Sample)],
    source: false,
};

impl ActorFactory<Message> for StoreParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        let store =
            Store::open(&ctx.data_dir).map_err(|e| ActorError::build_from("open the store", e))?;
        Ok(Box::new(StoreActor { store }))
    }
}

impl KindParams<Message> for StoreParams {
    fn example() -> Self {
        StoreParams {}
    }
}

struct StoreActor {
    store: Store,
}

impl Actor<Message> for StoreActor {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let changed = match message {
            Message::Sample(s) => self.store.admit(s),
            Message::Decision(d) => self.store.decide(d),
            other => {
                return Err(crate::message::unexpected(port, other));
            }
        }
        .context("write to the store")?;
        if !changed {
            tracing::debug!(id = message.id(), "already decided; replay ignored");
        } else if matches!(message, Message::Sample(_)) {
            out.send("training", message.clone())?;
        }
        Ok(())
    }
}
