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

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::federate::WireMode;
use crate::federate::worker::{Rounds, is_aggregate};
use crate::message::{Message, MessageType};

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
            rounds: Rounds::new(node),
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

struct Federate {
    params: FederateParams,
    node: String,
    data_dir: PathBuf,
    rounds: Rounds,
}

impl Federate {
    fn open(&mut self) -> Result<(), ActorError> {
        let worker = self
            .params
            .open(&self.node, &self.data_dir)
            .map_err(|e| ActorError::build_from("open the federation worker", e))?;
        self.rounds.open_with(worker);
        Ok(())
    }

    /// Sends a finished round's aggregate (with `wait`, once the running round ends). A failed round is
    /// logged and counted, and the node keeps serving later rounds, except at drain, where the failure is
    /// reported to the engine.
    fn collect(&mut self, out: &mut Outbox, wait: bool) -> Result<(), ActorError> {
        match self.rounds.finished(wait) {
            None => Ok(()),
            Some(Ok(aggregate)) => {
                tracing::info!(node = %self.node, delta = %aggregate.id, "federation aggregate received");
                Ok(out.send("aggregates", Message::Delta(Arc::new(aggregate)))?)
            }
            Some(Err(e)) => {
                metrics::counter!("hearth_federate_worker_failures_total", "node" => self.node.clone()).increment(1);
                tracing::error!(node = %self.node, error = %e, "federation round failed");
                if wait {
                    Err(ActorError::failed("federation round", e))
                } else {
                    Ok(())
                }
            }
        }
    }
}

impl Actor<Message> for Federate {
    /// Opens the worker now, so a missing secret or a bad CA file shows at start, not hours later.
    fn on_start(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        self.open()
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
        if !self.rounds.is_open() {
            // A restart after a failed start retries opening here.
            self.open()?;
        }
        Ok(self.rounds.offer((**delta).clone())?)
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
