//! A federation worker's settings as a graph file writes them, and opening the worker they describe: the
//! secret from a mode-600 file or the environment (never the graph file), the coordinator's address, TLS.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::WireMode;
use super::client::Client;
use super::coordinator::secret_env_var;
use super::dp::DpConfig;
use super::tls::{ClientTls, TlsError};
use super::worker::{Worker, WorkerError};
use crate::files::{PrivateFileError, read_private_file};

/// Why a worker's settings cannot open a worker; each names the field or file.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("`{field}`: {message}")]
    Field {
        field: &'static str,
        message: String,
    },
    #[error("secret: {0}")]
    SecretFile(#[from] PrivateFileError),
    #[error("{0} is empty")]
    EmptySecret(PathBuf),
    #[error("{0} is not set and no `secret_file` is given")]
    NoSecret(String),
    #[error("tls_ca: {0}")]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// A worker that could not be opened for a node.
#[derive(Debug, thiserror::Error)]
#[error("node `{node}`: {source}")]
pub struct OpenError {
    pub node: String,
    #[source]
    pub source: Box<SettingsError>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
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

fn secs(field: &'static str, x: f64) -> Result<Duration, SettingsError> {
    Duration::try_from_secs_f64(x).map_err(|_| SettingsError::Field {
        field,
        message: "must be a non-negative number".to_owned(),
    })
}

impl WorkerSettings {
    /// Checks what needs no file, so a graph validates and builds on a machine without the secret or CA.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.worker.is_empty() {
            return Err(SettingsError::Field {
                field: "worker",
                message: "is empty".to_owned(),
            });
        }
        secs("aggregate_timeout_secs", self.aggregate_timeout_secs)?;
        secs("retry_secs", self.retry_secs)?;
        Ok(())
    }

    /// Reads the secret and the CA file, resolves the coordinator and loads the worker's persisted state
    /// under `data_dir/federate/<node>`.
    pub fn open(&self, node: &str, data_dir: &Path) -> Result<Worker, OpenError> {
        self.open_in(node, data_dir).map_err(|source| OpenError {
            node: node.to_owned(),
            source: Box::new(source),
        })
    }

    fn open_in(&self, node: &str, data_dir: &Path) -> Result<Worker, SettingsError> {
        let mut worker = Worker::open(
            self.client()?,
            self.dp.clone(),
            data_dir.join("federate").join(node),
            data_dir.join("deltas"),
        )?;
        worker.aggregate_timeout = secs("aggregate_timeout_secs", self.aggregate_timeout_secs)?;
        worker.retry_for = secs("retry_secs", self.retry_secs)?;
        Ok(worker)
    }

    fn secret(&self) -> Result<Vec<u8>, SettingsError> {
        match &self.secret_file {
            Some(path) => {
                let text = read_private_file(path)?;
                let secret = text.trim();
                if secret.is_empty() {
                    return Err(SettingsError::EmptySecret(path.clone()));
                }
                Ok(secret.as_bytes().to_vec())
            }
            None => {
                let var = secret_env_var(&self.worker);
                std::env::var(&var)
                    .map(String::into_bytes)
                    .map_err(|_| SettingsError::NoSecret(var))
            }
        }
    }

    fn client(&self) -> Result<Client, SettingsError> {
        let addr: SocketAddr = self
            .coordinator
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| SettingsError::Field {
                field: "coordinator",
                message: format!("cannot resolve {:?} (host:port)", self.coordinator),
            })?;
        let mut client = Client::new(addr, self.worker.clone(), self.secret()?, self.mode);
        if let Some(ca) = &self.tls_ca {
            let host = self
                .coordinator
                .rsplit_once(':')
                .map_or(self.coordinator.as_str(), |(h, _)| h);
            let name = self
                .tls_server_name
                .as_deref()
                .unwrap_or(host.trim_start_matches('[').trim_end_matches(']'));
            client = client.with_tls(ClientTls::from_ca_file(ca, name)?);
        }
        Ok(client)
    }
}
