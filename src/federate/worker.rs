//! One federation worker: contributes a trained delta to a round and turns the round's aggregate into a new
//! local delta.
//!
//! Only the adapter's tensors leave the device (bf16 safetensors, PEFT names, optionally clipped and noised
//! first); each contribution is kept under `sent/` so the user can audit exactly what left. The worker's
//! round counter and privacy accountant are persisted (temp file + rename) after every accepted push, so a
//! restarted worker neither reuses a round nor forgets the ε it spent. An unreachable coordinator (restarting,
//! say) is retried until `retry_for` passes; a round that closed before our push sends us to the next one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::client::{Client, ClientError, PushOutcome};
use super::dp::{DpConfig, DpEngine, DpError, DpReport, RdpAccountant};
use super::wire::{self, AdapterConfig, Rounding, WireError};
use crate::clock::now_unix_ms;
use crate::files::atomic_write;
use crate::message::Delta;
use crate::train::artifact::{delta_id, publish_delta, staging_dir};
use crate::train::{Provenance, TrainError, sha256_hex};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("delta `{id}`: {message}")]
    Delta { id: String, message: String },
    #[error("coordinator: {0}")]
    Client(#[from] ClientError),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error(transparent)]
    Dp(#[from] DpError),
    /// Publishing the aggregate as a local delta.
    #[error(transparent)]
    Publish(#[from] TrainError),
    #[error("the federation round thread panicked")]
    Panicked,
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> WorkerError {
    WorkerError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// What one contribution did; appended to the persisted state and to the aggregate's provenance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundRecord {
    pub round: u64,
    /// The local delta contributed.
    pub sent_delta: String,
    /// SHA-256 of the bytes that left the device (also under `sent/`).
    pub sent_sha256: String,
    pub sent_bytes: usize,
    pub dp: Option<DpReport>,
    /// The local delta made from the aggregate.
    pub aggregate_delta: Option<String>,
}

/// Persisted between runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerState {
    /// The round the next contribution goes to.
    pub next_round: u64,
    pub accountant: Option<RdpAccountant>,
    /// The last few contributions, newest last.
    pub history: Vec<RoundRecord>,
}

/// Contributions kept in the state and under `sent/`: disk stays bounded over months of rounds.
const KEEP_ROUNDS: usize = 16;

/// How long to wait between attempts while the coordinator cannot be reached.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Whether `delta` is a federation aggregate as received (its provenance names a round). Contributing it again
/// would send back what the federation already has, so the actor skips it; a delta trained on top of it is new.
pub fn is_aggregate(delta: &Delta) -> bool {
    let path = Path::new(&delta.path).join("provenance.json");
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Provenance>(&b).ok())
        .is_some_and(|p| p.metrics.get("federation").is_some())
}

pub struct Worker {
    client: Client,
    dp: Option<DpEngine>,
    /// `DATA_DIR/federate/<node>`: `state.json` and `sent/`.
    dir: PathBuf,
    /// Where aggregate deltas are written (the trainer's delta directory).
    deltas_dir: PathBuf,
    pub state: WorkerState,
    /// How long to wait for a round's aggregate.
    pub aggregate_timeout: Duration,
    /// How long to keep retrying a coordinator that cannot be reached.
    pub retry_for: Duration,
}

impl Worker {
    /// Loads the persisted state from `dir` (a fresh one if none).
    pub fn open(
        client: Client,
        dp: Option<DpConfig>,
        dir: PathBuf,
        deltas_dir: PathBuf,
    ) -> Result<Worker, WorkerError> {
        let path = dir.join("state.json");
        let state: WorkerState = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| file_err(&path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => WorkerState::default(),
            Err(e) => return Err(file_err(&path, e)),
        };
        let dp = match dp {
            Some(c) => Some(DpEngine::with_accountant(
                c,
                state.accountant.clone().unwrap_or_default(),
            )?),
            None => None,
        };
        Ok(Worker {
            client,
            dp,
            dir,
            deltas_dir,
            state,
            aggregate_timeout: Duration::from_secs(600),
            retry_for: Duration::from_secs(60),
        })
    }

    /// ε spent so far (0 without differential privacy).
    pub fn epsilon(&self) -> f64 {
        self.dp.as_ref().map_or(0.0, DpEngine::epsilon)
    }

    fn persist(&self) -> Result<(), WorkerError> {
        let path = self.dir.join("state.json");
        let bytes = serde_json::to_vec_pretty(&self.state).map_err(|e| file_err(&path, e))?;
        atomic_write(&path, &bytes).map_err(|e| file_err(&path, e))
    }

    /// Retries `f` while the coordinator cannot be reached (connection refused or reset, timeouts).
    fn retrying<T>(
        &self,
        mut f: impl FnMut(&Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let until = Instant::now() + self.retry_for;
        loop {
            match f(&self.client) {
                Err(ClientError::Io(e)) if Instant::now() < until => {
                    tracing::warn!(worker = %self.client.worker, error = %e, "coordinator unreachable; retrying");
                    std::thread::sleep(RETRY_PAUSE);
                }
                other => return other,
            }
        }
    }

    /// Contributes `delta` to the next round, waits for that round's aggregate and writes it as a new delta
    /// (parent: `delta`), which it returns.
    pub fn contribute(&mut self, delta: &Delta) -> Result<Delta, WorkerError> {
        let dir = Path::new(&delta.path);
        let bad = |message: String| WorkerError::Delta {
            id: delta.id.clone(),
            message,
        };
        let config_path = dir.join("adapter_config.json");
        let config_bytes = std::fs::read(&config_path).map_err(|e| file_err(&config_path, e))?;
        let config: AdapterConfig =
            serde_json::from_slice(&config_bytes).map_err(|e| file_err(&config_path, e))?;
        if config.use_dora {
            return Err(bad(
                "DoRA magnitudes do not aggregate as ΔW = scale·B·A; federate LoRA deltas".into(),
            ));
        }
        let prov_path = dir.join("provenance.json");
        let provenance: Provenance = std::fs::read(&prov_path)
            .map_err(|e| file_err(&prov_path, e))
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| file_err(&prov_path, e)))?;
        let st_path = dir.join("adapter_model.safetensors");
        let bytes = std::fs::read(&st_path).map_err(|e| file_err(&st_path, e))?;
        let mut tensors = wire::decode_safetensors(&bytes)?;
        if tensors.is_empty() {
            return Err(bad("no tensors".into()));
        }
        let dp_report = match &mut self.dp {
            Some(dp) => Some(dp.privatize(&mut tensors)?),
            None => None,
        };
        let blob = wire::encode(self.client.mode, &tensors)?;
        let mut round = self.state.next_round;
        loop {
            match self.retrying(|c| c.push_blob(round, &blob))? {
                PushOutcome::Accepted => break,
                PushOutcome::RoundClosed { next_round } => {
                    tracing::info!(worker = %self.client.worker, round, next_round, "round closed before our push");
                    round = next_round.max(round + 1);
                }
            }
        }
        let sent = self.dir.join("sent").join(format!("round-{round}.bin"));
        atomic_write(&sent, &blob).map_err(|e| file_err(&sent, e))?;
        self.state.next_round = round + 1;
        self.state.accountant = self.dp.as_ref().map(|d| d.accountant.clone());
        self.state.history.push(RoundRecord {
            round,
            sent_delta: delta.id.clone(),
            sent_sha256: sha256_hex(&blob),
            sent_bytes: blob.len(),
            dp: dp_report,
            aggregate_delta: None,
        });
        self.prune_history();
        self.persist()?;
        metrics::counter!("hearth_federate_worker_pushes_total").increment(1);
        metrics::counter!("hearth_federate_worker_sent_bytes_total").increment(blob.len() as u64);
        metrics::gauge!("hearth_federate_worker_epsilon").set(self.epsilon());

        let deadline = self.aggregate_timeout;
        let aggregate_blob = self.retrying(|c| c.aggregate_blob(round, deadline))?;
        let aggregate = wire::decode(self.client.mode, &aggregate_blob)?;
        let out = self.write_aggregate(&aggregate, round, &config_bytes, &provenance)?;
        if let Some(last) = self.state.history.last_mut() {
            last.aggregate_delta = Some(out.id.clone());
        }
        self.persist()?;
        Ok(out)
    }

    fn prune_history(&mut self) {
        while self.state.history.len() > KEEP_ROUNDS {
            let old = self.state.history.remove(0);
            let _ = std::fs::remove_file(
                self.dir
                    .join("sent")
                    .join(format!("round-{}.bin", old.round)),
            );
        }
    }

    /// Writes the aggregate as a PEFT delta directory (as the trainer publishes one), with a provenance that
    /// names the round and the local delta it came from.
    fn write_aggregate(
        &self,
        aggregate: &[wire::Tensor],
        round: u64,
        config_bytes: &[u8],
        local: &Provenance,
    ) -> Result<Delta, WorkerError> {
        let meta = HashMap::from([("format".to_owned(), "pt".to_owned())]);
        let bytes = wire::encode_safetensors(aggregate, Rounding::NearestEven, Some(meta))?;
        let sha = sha256_hex(&bytes);
        let provenance = Provenance {
            delta_id: delta_id(&bytes),
            base_sha256: local.base_sha256.clone(),
            recipe_sha256: local.recipe_sha256.clone(),
            recipe: local.recipe.clone(),
            // What the aggregate was made from is other people's data, which this device never sees: the digest
            // binds the round and the aggregate's bytes instead.
            data_digest: sha256_hex(format!("federated round {round}: {sha}").as_bytes()),
            num_samples: local.num_samples,
            parent: Some(local.delta_id.clone()),
            seed: local.seed,
            metrics: serde_json::json!({
                "federation": {"round": round, "worker": self.client.worker, "aggregate_sha256": sha}
            }),
            created_at_unix_ms: now_unix_ms(),
        };
        let tmp = staging_dir(&self.deltas_dir)?;
        for (name, data) in [
            ("adapter_model.safetensors", bytes.as_slice()),
            ("adapter_config.json", config_bytes),
        ] {
            let p = tmp.join(name);
            std::fs::write(&p, data).map_err(|e| file_err(&p, e))?;
        }
        Ok(publish_delta(&self.deltas_dir, &tmp, &provenance)?)
    }
}

/// Contributions one round at a time, each on its own thread: a delta that arrives while a round runs waits,
/// and a newer one replaces it (the older is superseded, not lost: the newer continues from it).
pub struct Rounds {
    name: String,
    /// Owned by the round in flight while one runs.
    worker: Option<Worker>,
    running: Option<JoinHandle<(Worker, Result<Delta, WorkerError>)>>,
    /// The newest delta that arrived while a round ran.
    waiting: Option<Delta>,
}

impl Rounds {
    /// Rounds for a node named `name` (for threads and logs), with no worker open yet.
    pub fn new(name: &str) -> Self {
        Rounds {
            name: name.to_owned(),
            worker: None,
            running: None,
            waiting: None,
        }
    }

    /// Whether a worker is open (idle, or lent to the round in flight).
    pub fn is_open(&self) -> bool {
        self.worker.is_some() || self.running.is_some()
    }

    pub fn open_with(&mut self, worker: Worker) {
        self.worker = Some(worker);
    }

    /// Contributes `delta` now, or after the round in flight (replacing any delta already waiting).
    pub fn offer(&mut self, delta: Delta) -> std::io::Result<()> {
        if self.running.is_some() {
            if let Some(old) = self.waiting.replace(delta) {
                let by = self.waiting.as_ref().map_or("", |d| d.id.as_str());
                tracing::info!(node = %self.name, superseded = %old.id, by, "a newer delta waits for the next round");
            }
            return Ok(());
        }
        let Some(mut worker) = self.worker.take() else {
            self.waiting = Some(delta);
            return Ok(());
        };
        let handle = std::thread::Builder::new()
            .name(format!("federate-{}", self.name))
            .spawn(move || {
                let r = worker.contribute(&delta);
                (worker, r)
            })?;
        self.running = Some(handle);
        Ok(())
    }

    /// The finished round's aggregate or error, if a round finished (with `wait`, once the running one
    /// does); the waiting delta then starts its round.
    pub fn finished(&mut self, wait: bool) -> Option<Result<Delta, WorkerError>> {
        if !(wait || self.running.as_ref().is_some_and(|h| h.is_finished())) {
            return None;
        }
        let handle = self.running.take()?;
        let result = match handle.join() {
            Ok((worker, result)) => {
                self.worker = Some(worker);
                result
            }
            Err(_) => Err(WorkerError::Panicked),
        };
        if let Some(next) = self.waiting.take()
            && let Err(e) = self.offer(next)
        {
            tracing::error!(node = %self.name, error = %e, "cannot start the next federation round");
        }
        Some(result)
    }
}
