//! `trainer`: turns the admitted training set into LoRA deltas over the frozen base.
//!
//! Glue over [`crate::train::Cycles`]: samples are buffered; once `min_samples` new ones wait, no cycle
//! runs and the schedule allows (`min_interval_secs`, `idle_load`), a cycle starts on its own thread over
//! the training window (`window`: the last `max_samples`, none older than `max_age_secs`), from the served
//! delta or the base (`start_from`). The engine thread never trains, so curation keeps flowing, and a cycle
//! runs in its own pool of `threads` in the idle scheduling class, so serving always gets a core first. At
//! start the trainer reloads the window from the store; training-set rows outside it are deleted there at
//! most once a minute (from [`Actor::tick`] too, so an idle trainer still ages them out). Drain waits for a
//! running cycle, then trains once more on samples that arrived meanwhile if the schedule allows. The model
//! is loaded by the first cycle, so a graph builds without it.
//!
//! A failed cycle is reported as background work ([`ActorError::Background`]): it restarts the worker and
//! counts against the node's restart policy. The rebuilt trainer reloads the training set from the store
//! ([`Actor::on_restart`]) and so retries the cycle at once: a cycle that fails every time exhausts the
//! restart budget and the node is marked failed, rather than failing again with each new batch of samples.

use std::path::Path;
use std::sync::Arc;

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, Context, KindParams};
use crate::message::{Message, MessageType};
use crate::model::BaseCache;
use crate::train::{BaseSource, Cycles, TrainError};

/// The node's parameters: the trainer's settings.
pub use crate::train::cycle::TrainerSettings as TrainerParams;

static INFO: KindInfo = KindInfo {
    name: "trainer",
    about: "trains LoRA deltas (SFT, DPO, KTO, GRPO, with replay) on the admitted samples over the frozen base",
    inputs: &[PortSpec::new("samples", MessageType::Sample)],
    outputs: &[PortSpec::new("deltas", MessageType::Delta)],
    source: false,
};

impl ActorFactory<Message> for TrainerParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        if ctx.worker > 0 {
            return Err(ActorError::build(format!(
                "node `{}`: trainer keeps one adapter per node; use `workers: 1`",
                ctx.node_id
            )));
        }
        self.train
            .validate()
            .map_err(|e| ActorError::build_from("recipe", e))?;
        let settings = self.cycle_settings(&ctx.node_id, &ctx.data_dir);
        let base = self.base_source(&ctx.data_dir, ctx.resources.get::<BaseCache>());
        Ok(Box::new(Trainer {
            node: ctx.node_id.clone(),
            cycles: Cycles::new(settings, base),
        }))
    }
}

impl TrainerParams {
    /// Where the cycles find their base: `model` held as `requantize` says, from the graph's shared cache, so
    /// that a serve node and a gate naming the same `model` and `requantize` use the very same weights.
    pub fn base_source(&self, data_dir: &Path, bases: Arc<BaseCache>) -> BaseSource {
        let (model, requantize, data_dir) =
            (self.model.clone(), self.requantize, data_dir.to_path_buf());
        Arc::new(move || {
            let path = crate::serve::model_path(model.as_deref(), &data_dir)
                .map_err(|e| TrainError::Config(format!("model: {e}")))?;
            Ok(bases.get_with(&path, requantize)?)
        })
    }
}

impl KindParams<Message> for TrainerParams {
    fn example() -> Self {
        TrainerParams {
            model: Some("models/SmolLM2-135M-Instruct.Q8_0.gguf".to_owned()),
            ..TrainerParams::default()
        }
    }
}

struct Trainer {
    node: String,
    cycles: Cycles,
}

impl Trainer {
    /// Sends the finished cycle's delta, if any (with `wait`, once the running cycle ends).
    fn collect(&mut self, out: &mut Outbox, wait: bool) -> Result<(), ActorError> {
        let finished = self
            .cycles
            .finished(wait)
            .map_err(|e| ActorError::background("training cycle", e))?;
        if let Some(delta) = finished {
            out.send("deltas", Message::Delta(Arc::new(delta)))?;
        }
        Ok(())
    }

    fn maybe_start(&mut self) -> Result<(), ActorError> {
        self.cycles
            .maybe_start()
            .map_err(|e| ActorError::background("start a training cycle", e))
    }

    fn reload(&mut self) -> Result<(), ActorError> {
        let n = self.cycles.reload().context("reload the training set")?;
        if n > 0 {
            tracing::info!(node = %self.node, samples = n, "reloaded the training set from the store");
        }
        Ok(())
    }
}

impl Actor<Message> for Trainer {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        self.cycles
            .add(crate::message::expect_sample(port, message)?);
        self.collect(out, false)?;
        self.maybe_start()
    }

    /// Reloads the training window the store holds: what earlier runs admitted is trained on again.
    fn on_start(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        self.reload()
    }

    /// The same after a failure: the rebuilt trainer has lost what it had buffered, and the reloaded samples
    /// count as new, so the cycle that failed is tried again without waiting for more input.
    fn on_restart(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        self.reload()
    }

    /// Sends a cycle's delta as soon as it is written, and starts the next cycle if data waits.
    fn tick(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.collect(out, false)?;
        self.maybe_start()
    }

    /// Waits for the running cycle, then trains once more if `min_samples` new ones arrived meanwhile, so a
    /// drained graph has trained on everything it was given.
    fn flush(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.collect(out, true)?;
        self.maybe_start()?;
        self.collect(out, true)
    }
}
