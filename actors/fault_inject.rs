//! `fault_inject`: passes samples through but fails on chosen ones, or in its periodic work, to drill
//! supervision and dead letters.

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::message::{Message, MessageType};

/// How a chosen message fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum FaultMode {
    #[default]
    Panic,
    Error,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultInjectParams {
    /// Fail on every sample whose id ends with one of these suffixes (e.g. `"-13"`).
    pub fail_ids_ending: Vec<String>,
    pub mode: FaultMode,
    /// Fail every idle call ([`Actor::tick`]) as background work that keeps failing does (a training cycle
    /// that cannot read its data), whatever arrives.
    pub fail_periodic: bool,
    /// Fail every start, as a node that cannot take its port or open its files does.
    pub fail_start: bool,
}

static INFO: KindInfo = KindInfo {
    name: "fault_inject",
    about: "passes samples through, panicking or erroring on chosen ids or in its periodic work (supervision drills)",
    inputs: &[PortSpec::new("in", MessageType::Sample)],
    outputs: &[PortSpec::new("out", MessageType::Sample)],
    source: false,
};

impl ActorFactory<Message> for FaultInjectParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, _ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        Ok(Box::new(FaultInject {
            params: self.clone(),
        }))
    }
}

impl KindParams<Message> for FaultInjectParams {
    fn example() -> Self {
        FaultInjectParams {
            fail_ids_ending: vec!["-13".to_owned()],
            mode: FaultMode::Panic,
            fail_periodic: false,
            fail_start: false,
        }
    }
}

struct FaultInject {
    params: FaultInjectParams,
}

impl Actor<Message> for FaultInject {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let sample = crate::message::expect_sample(port, message)?;
        if self
            .params
            .fail_ids_ending
            .iter()
            .any(|s| sample.id.ends_with(s.as_str()))
        {
            match self.params.mode {
                FaultMode::Panic => panic!("injected fault on {}", sample.id),
                FaultMode::Error => {
                    return Err(ActorError::Message(format!(
                        "injected fault on {}",
                        sample.id
                    )));
                }
            }
        }
        out.send("out", message.clone()).map_err(ActorError::from)
    }

    fn on_start(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        if self.params.fail_start {
            return Err(ActorError::Message("injected fault at start".to_owned()));
        }
        Ok(())
    }

    fn tick(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        if self.params.fail_periodic {
            return Err(ActorError::background("periodic work", "injected fault"));
        }
        Ok(())
    }
}
