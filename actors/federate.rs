//! `federate`: the worker side of federation, glue over [`crate::federate::worker`].
//!
//! Each delta arriving on `deltas` (wire it from `eval.promoted`, so only a delta that passed the gate,
//! canary exposure included, ever leaves the device) is contributed to the coordinator's next round off the
//! engine thread; the round's aggregate comes back as a new local delta on `aggregates` (wire it to
//! `eval.candidates`: the aggregate is judged like any other candidate before it is served). One round runs
//! at a time; a delta that arrives meanwhile waits, and a newer one replaces it (the older is superseded, not
//! lost: the newer continues from it). An aggregate promoted as received is not sent back. The worker's HMAC
//! secret comes from `secret_file` or the environment (`HEARTH_FEDERATE_SECRET_<WORKER>`), never from the graph
//! file.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::federate::WireMode;
use crate::federate::worker::{Worker, WorkerError, is_aggregate};
use crate::message::{Delta, Message, MessageType};

/// The node's parameters: the worker's settings.
pub use crate::federate::worker_settings::WorkerSettings as FederateParams;

static INFO: KindInfo = KindInfo {
    name: "federate",
    about: "contributes deltas (bf16 LoRA only, optionally with DP) to a federation round; emits the aggregate",
    inputs: &[PortSpec::new("deltas", MessageType::Delta)],
    outputs: &[PortSpec::new("aggregates", MessageType::Delta)],
    source: false,
};

impl ActorFactory<Message> for FederateParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    /// Checks what needs no file; the secret, the CA and the persisted state are read at start, so a graph
    /// validates and builds on a machine without them.
    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        let node = &ctx.node_id;
        if ctx.worker > 0 {
            return Err(ActorError::build(format!(
                "node `{node}`: one federation worker per node; use `workers: 1`"
            )));
        }
        self.validate()
            .map_err(|e| ActorError::build_from(format!("node `{node}`"), e))?;
        Ok(Box::new(Federate {
            params: self.clone(),
            node: node.clone(),
            data_dir: ctx.data_dir.clone(),
            worker: None,
            running: None,
            waiting: None,
        }))
    }
}

impl KindParams<Message> for FederateParams {
    fn example() -> Self {
        FederateParams {
            coordinator: "127.0.0.1:7070".to_owned(),
            worker: "alice".to_owned(),
            secret_file: Some(PathBuf::from("federate.secret")),
            mode: WireMode::Native,
            tls_ca: None,
            tls_server_name: None,
            dp: None,
            aggregate_timeout_secs: 600.0,
            retry_secs: 60.0,
        }
    }
}

type Round = JoinHandle<(Worker, Result<Delta, WorkerError>)>;

struct Federate {
    params: FederateParams,
    node: String,
    data_dir: PathBuf,
    /// Opened at start; owned by the round in flight while one runs.
    worker: Option<Worker>,
    running: Option<Round>,
    /// The newest delta that arrived while a round ran.
    waiting: Option<Delta>,
}

impl Federate {
    fn open(&self) -> Result<Worker, ActorError> {
        self.params
            .open(&self.node, &self.data_dir)
            .map_err(|e| ActorError::build_from("open the federation worker", e))
    }

    fn start(&mut self, delta: Delta) -> Result<(), ActorError> {
        if self.worker.is_none() && self.running.is_none() {
            // Not opened yet: a restart after a failed start, which retries here.
            self.worker = Some(self.open()?);
        }
        let Some(mut worker) = self.worker.take() else {
            self.waiting = Some(delta);
            return Ok(());
        };
        let handle = std::thread::Builder::new()
            .name(format!("federate-{}", self.node))
            .spawn(move || {
                let r = worker.contribute(&delta);
                (worker, r)
            })?;
        self.running = Some(handle);
        Ok(())
    }

    /// Collects a finished round (or waits for it), sends its aggregate, and starts the waiting delta.
    fn collect(&mut self, out: &mut Outbox, wait: bool) -> Result<(), ActorError> {
        if !(wait || self.running.as_ref().is_some_and(|h| h.is_finished())) {
            return Ok(());
        }
        let Some(handle) = self.running.take() else {
            return Ok(());
        };
        let (worker, result) = handle
            .join()
            .map_err(|_| ActorError::Message("federation round thread panicked".into()))?;
        self.worker = Some(worker);
        let outcome = match result {
            Ok(aggregate) => {
                tracing::info!(node = %self.node, delta = %aggregate.id, "federation aggregate received");
                out.send("aggregates", Message::Delta(Arc::new(aggregate)))?;
                Ok(())
            }
            Err(e) => {
                metrics::counter!("hearth_federate_worker_failures_total", "node" => self.node.clone()).increment(1);
                tracing::error!(node = %self.node, error = %e, "federation round failed");
                Err(ActorError::failed("federation round", e))
            }
        };
        if let Some(next) = self.waiting.take() {
            self.start(next)?;
        }
        // A failed round is logged and counted; the node keeps serving later rounds, except at drain, where the
        // failure is reported to the engine.
        if wait { outcome } else { Ok(()) }
    }
}

impl Actor<Message> for Federate {
    /// Opens the worker now, so a missing secret or a bad CA file shows at start, not hours later.
    fn on_start(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        self.worker = Some(self.open()?);
        Ok(())
    }

    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let delta = crate::message::expect_delta(port, message)?;
        self.collect(out, false)?;
        if is_aggregate(delta) {
            tracing::debug!(node = %self.node, delta = %delta.id, "an aggregate as received is not contributed again");
            return Ok(());
        }
        if self.running.is_some() {
            if let Some(old) = self.waiting.replace((**delta).clone()) {
                tracing::info!(node = %self.node, superseded = %old.id, by = %delta.id, "a newer delta waits for the next round");
            }
            return Ok(());
        }
        self.start((**delta).clone())
    }

    fn tick(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.collect(out, false)
    }

    /// Finishes the round in flight and the delta waiting for one.
    fn flush(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        let first = self.collect(out, true);
        let second = self.collect(out, true);
        first.and(second)
    }
}
