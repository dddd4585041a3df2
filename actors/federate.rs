//! `federate`: the worker side of federation, thin over [`crate::federate::worker`].
//!
//! Each delta arriving on `deltas` (wire it from `eval.promoted`, so only a delta that passed the gate,
//! canary exposure included, ever leaves the device) is contributed to the coordinator's next round off the
//! engine thread; the round's aggregate comes back as a new local delta on `aggregates` (wire it to
//! `eval.candidates`: the aggregate is judged like any other candidate before it is served). One round runs
//! at a time; a delta that arrives meanwhile waits, and a newer one replaces it (the older is superseded, not
//! lost: the newer continues from it). An aggregate promoted as received is not sent back. The worker's HMAC
//! secret comes from `secret_file` or the environment (`HEARTH_FEDERATE_SECRET_<WORKER>`), never from the graph
//! file.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, KindParams};
use crate::federate::WireMode;
use crate::federate::client::Client;
use crate::federate::coordinator::secret_env_var;
use crate::federate::dp::DpConfig;
use crate::federate::tls::ClientTls;
use crate::federate::worker::{Worker, WorkerError, is_aggregate};
use crate::files::read_private_file;
use crate::message::Delta;
use crate::message::{Message, MessageType};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FederateParams {
    /// The coordinator, `host:port`.
    pub coordinator: String,
    /// This worker's name, as the coordinator's settings list it.
    pub worker: String,
    /// A file holding only this worker's secret (mode 600); `None`: `HEARTH_FEDERATE_SECRET_<WORKER>`.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    #[serde(default = "default_mode")]
    pub mode: WireMode,
    /// Talk HTTPS, trusting the CA certificates in this PEM file.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// The name the coordinator's certificate must carry; `None`: the host part of `coordinator`.
    #[serde(default)]
    pub tls_server_name: Option<String>,
    /// Clip and noise each contribution before it leaves, with (ε, δ) accounted across rounds.
    #[serde(default)]
    pub dp: Option<DpConfig>,
    /// How long to wait for a round's aggregate.
    #[serde(default = "default_aggregate_timeout")]
    pub aggregate_timeout_secs: f64,
    /// How long to keep retrying a coordinator that cannot be reached.
    #[serde(default = "default_retry")]
    pub retry_secs: f64,
}

fn default_mode() -> WireMode {
    WireMode::Native
}

fn default_aggregate_timeout() -> f64 {
    600.0
}

fn default_retry() -> f64 {
    60.0
}

static INFO: KindInfo = KindInfo {
    name: "federate",
    about: "contributes deltas (bf16 LoRA only, optionally with DP) to a federation round; emits the aggregate",
    inputs: &[PortSpec::new("deltas", MessageType::Delta)],
    outputs: &[PortSpec::new("aggregates", MessageType::Delta)],
    source: false,
};

fn build_err(node: &str, e: impl std::fmt::Display) -> ActorError {
    ActorError::build(format!("node `{node}`: {e}"))
}

fn secs(node: &str, field: &str, x: f64) -> Result<Duration, ActorError> {
    Duration::try_from_secs_f64(x)
        .map_err(|_| build_err(node, format!("`{field}` must be a non-negative number")))
}

impl FederateParams {
    fn secret(&self, node: &str) -> Result<Vec<u8>, ActorError> {
        match &self.secret_file {
            Some(path) => {
                let text = read_private_file(path)
                    .map_err(|e| ActorError::build_from(format!("node `{node}`"), e))?;
                let secret = text.trim();
                if secret.is_empty() {
                    return Err(build_err(node, format!("{} is empty", path.display())));
                }
                Ok(secret.as_bytes().to_vec())
            }
            None => {
                let var = secret_env_var(&self.worker);
                std::env::var(&var).map(String::into_bytes).map_err(|_| {
                    build_err(
                        node,
                        format!("{var} is not set and no `secret_file` is given"),
                    )
                })
            }
        }
    }

    fn client(&self, node: &str) -> Result<Client, ActorError> {
        let addr: SocketAddr = self
            .coordinator
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                build_err(
                    node,
                    format!(
                        "`coordinator`: cannot resolve {:?} (host:port)",
                        self.coordinator
                    ),
                )
            })?;
        let mut client = Client::new(addr, self.worker.clone(), self.secret(node)?, self.mode);
        if let Some(ca) = &self.tls_ca {
            let host = self
                .coordinator
                .rsplit_once(':')
                .map_or(self.coordinator.as_str(), |(h, _)| h);
            let name = self
                .tls_server_name
                .as_deref()
                .unwrap_or(host.trim_start_matches('[').trim_end_matches(']'));
            client = client.with_tls(
                ClientTls::from_ca_file(ca, name)
                    .map_err(|e| ActorError::build_from(format!("node `{node}`"), e))?,
            );
        }
        Ok(client)
    }
}

impl ActorFactory<Message> for FederateParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    /// Checks what needs no file; the secret, the CA and the persisted state are read at start (see
    /// [`FederateParams::open_worker`]), so a graph validates and builds on a machine without them.
    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        let node = &ctx.node_id;
        if ctx.worker > 0 {
            return Err(build_err(
                node,
                "one federation worker per node; use `workers: 1`",
            ));
        }
        if self.worker.is_empty() {
            return Err(build_err(node, "`worker` is empty"));
        }
        secs(node, "aggregate_timeout_secs", self.aggregate_timeout_secs)?;
        secs(node, "retry_secs", self.retry_secs)?;
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

impl FederateParams {
    /// Reads the secret and the CA file, resolves the coordinator and loads the worker's persisted state; an
    /// error names the node and the file or field.
    pub fn open_worker(
        &self,
        node: &str,
        data_dir: &std::path::Path,
    ) -> Result<Worker, ActorError> {
        let mut worker = Worker::open(
            self.client(node)?,
            self.dp.clone(),
            data_dir.join("federate").join(node),
            data_dir.join("deltas"),
        )
        .map_err(|e| build_err(node, e))?;
        worker.aggregate_timeout =
            secs(node, "aggregate_timeout_secs", self.aggregate_timeout_secs)?;
        worker.retry_for = secs(node, "retry_secs", self.retry_secs)?;
        Ok(worker)
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
            aggregate_timeout_secs: default_aggregate_timeout(),
            retry_secs: default_retry(),
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
    fn start(&mut self, delta: Delta) -> Result<(), ActorError> {
        if self.worker.is_none() && self.running.is_none() {
            // Not opened yet: a restart after a failed start, which retries here.
            self.worker = Some(self.params.open_worker(&self.node, &self.data_dir)?);
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
        self.worker = Some(self.params.open_worker(&self.node, &self.data_dir)?);
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
