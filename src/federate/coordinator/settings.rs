//! The coordinator's configuration: the runnable [`CoordinatorConfig`], its graph-file face
//! [`CoordinatorSettings`], and the per-worker secrets, which never come from a graph file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::CoordinatorError;
use crate::federate::aggregate::Method;
use crate::federate::hmac_auth;
use crate::federate::tls::ServerTls;
use crate::federate::wire::WireMode;
use crate::files::read_private_file;

/// Per-worker shared secrets. Never part of a graph file: loaded from a secrets file or the environment, and
/// redacted from Debug output.
#[derive(Clone, Default)]
pub struct Secrets(HashMap<String, Vec<u8>>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.0.keys().collect();
        names.sort();
        write!(f, "Secrets({names:?}, redacted)")
    }
}

/// Environment variable prefix: `HEARTH_FEDERATE_SECRET_<NAME>` with the name upper-cased and non-alphanumerics
/// turned into `_`.
pub const SECRET_ENV_PREFIX: &str = "HEARTH_FEDERATE_SECRET_";

impl Secrets {
    pub fn from_pairs<I: IntoIterator<Item = (String, Vec<u8>)>>(pairs: I) -> Secrets {
        Secrets(pairs.into_iter().collect())
    }

    /// Reads `name=secret` lines (`#` comments, blank lines ignored). On Unix the file must not be readable by
    /// group or others.
    pub fn from_file(path: &Path) -> Result<Secrets, CoordinatorError> {
        let text = read_private_file(path)?;
        let mut m = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or_else(|| {
                CoordinatorError::Secrets(format!("line {}: expected name=secret", i + 1))
            })?;
            if v.is_empty() {
                return Err(CoordinatorError::Secrets(format!(
                    "line {}: empty secret",
                    i + 1
                )));
            }
            m.insert(k.trim().to_owned(), v.as_bytes().to_vec());
        }
        Ok(Secrets(m))
    }

    /// Reads each worker's secret from `HEARTH_FEDERATE_SECRET_<NAME>`; missing ones are an error.
    pub fn from_env(workers: &[String]) -> Result<Secrets, CoordinatorError> {
        let mut m = HashMap::new();
        for w in workers {
            let var = secret_env_var(w);
            let v = std::env::var(&var)
                .map_err(|_| CoordinatorError::Secrets(format!("{var} is not set")))?;
            m.insert(w.clone(), v.into_bytes());
        }
        Ok(Secrets(m))
    }

    pub(super) fn get(&self, worker: &str) -> Option<&[u8]> {
        self.0.get(worker).map(|v| v.as_slice())
    }
}

pub fn secret_env_var(worker: &str) -> String {
    let up: String = worker
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{SECRET_ENV_PREFIX}{up}")
}

/// Exact LoRA aggregation settings (native mode).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExactLora {
    pub scale: f64,
    pub rank: usize,
}

#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// `host:port`; port 0 picks a free one.
    pub bind: String,
    pub mode: WireMode,
    /// Expected workers, in topology order.
    pub workers: Vec<String>,
    pub secrets: Secrets,
    pub aggregation: Method,
    /// Native mode: aggregate ΔW = scale·B·A exactly and re-factor (instead of gym's A/B mean).
    pub exact_lora: Option<ExactLora>,
    /// Data share per worker (e.g. capacity scores); aggregation is weighted when set.
    pub data_weights: Option<HashMap<String, f64>>,
    pub expert_pins: serde_json::Value,
    pub sync_interval_steps: u64,
    /// Minimum arrivals to close a round once its deadline passed.
    pub quorum: usize,
    /// Counted from the first push of a round.
    pub round_timeout: Duration,
    /// How long an aggregate GET is held before answering 503 (the client re-asks).
    pub long_poll: Duration,
    pub max_body_bytes: usize,
    pub skew_secs: i64,
    /// Where round state is persisted; None keeps it in memory only.
    pub state_dir: Option<PathBuf>,
    pub threads: usize,
    pub replay_capacity: usize,
    /// Finalised rounds kept (for stragglers' GETs and /v1/metrics).
    pub keep_rounds: usize,
    /// Serve HTTPS with this certificate; `None`: plain HTTP (loopback, or behind a TLS proxy).
    pub tls: Option<ServerTls>,
}

impl CoordinatorConfig {
    pub fn new(
        bind: &str,
        mode: WireMode,
        workers: Vec<String>,
        secrets: Secrets,
    ) -> CoordinatorConfig {
        let quorum = workers.len().div_ceil(2).max(1);
        CoordinatorConfig {
            bind: bind.to_owned(),
            mode,
            workers,
            secrets,
            aggregation: Method::GymRobust,
            exact_lora: None,
            data_weights: None,
            expert_pins: serde_json::json!({}),
            sync_interval_steps: 50,
            quorum,
            round_timeout: Duration::from_secs(120),
            long_poll: Duration::from_secs(30),
            max_body_bytes: 256 << 20,
            skew_secs: hmac_auth::DEFAULT_SKEW_SECS,
            state_dir: None,
            threads: 2,
            replay_capacity: 1 << 16,
            keep_rounds: 16,
            tls: None,
        }
    }

    pub(super) fn validate(&self) -> Result<(), CoordinatorError> {
        if self.workers.is_empty() {
            return Err(CoordinatorError::Config("no workers".into()));
        }
        if self.quorum == 0 || self.quorum > self.workers.len() {
            return Err(CoordinatorError::Config(
                "quorum must be in 1..=workers".into(),
            ));
        }
        for w in &self.workers {
            if self.secrets.get(w).is_none() {
                return Err(CoordinatorError::Config(format!(
                    "no secret for worker {w}"
                )));
            }
        }
        Ok(())
    }
}

pub(super) fn aggregation_name(m: Method) -> String {
    match m {
        Method::GymRobust => "byzantine_robust".into(),
        Method::Median => "median".into(),
        Method::Mean => "mean".into(),
        Method::Trimmed { beta } => format!("trimmed:{beta}"),
    }
}

/// The graph-file face of [`CoordinatorConfig`]: everything but the secrets, which come from `secrets_file` or,
/// when it is absent, from `HEARTH_FEDERATE_SECRET_<NAME>`. Unknown keys are refused, so a `secrets` map pasted
/// into a graph file is an error rather than silently kept in clear.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorSettings {
    pub bind: String,
    pub mode: WireMode,
    pub workers: Vec<String>,
    /// gym names (`byzantine_robust`, `median`, `mean`) or `trimmed:<beta>`.
    #[serde(default = "default_aggregation")]
    pub aggregation: String,
    #[serde(default)]
    pub exact_lora: Option<ExactLora>,
    #[serde(default)]
    pub data_weights: Option<HashMap<String, f64>>,
    #[serde(default)]
    pub expert_pins: Option<serde_json::Value>,
    #[serde(default)]
    pub sync_interval_steps: Option<u64>,
    #[serde(default)]
    pub quorum: Option<usize>,
    #[serde(default)]
    pub round_timeout_secs: Option<f64>,
    #[serde(default)]
    pub long_poll_secs: Option<f64>,
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    #[serde(default)]
    pub threads: Option<usize>,
    #[serde(default)]
    pub secrets_file: Option<PathBuf>,
    /// PEM certificate chain and key: serve HTTPS.
    #[serde(default)]
    pub tls: Option<ServerTls>,
}

fn default_aggregation() -> String {
    "byzantine_robust".into()
}

/// Parses an aggregation name: gym's names, or `trimmed:<beta>` with beta in [0, 0.5].
pub fn parse_aggregation(s: &str) -> Result<Method, CoordinatorError> {
    if let Some(b) = s.strip_prefix("trimmed:") {
        let beta: f32 = b
            .parse()
            .map_err(|_| CoordinatorError::Config(format!("bad trimmed beta {b:?}")))?;
        if !(0.0..=0.5).contains(&beta) {
            return Err(CoordinatorError::Config(
                "trimmed beta must be in [0, 0.5]".into(),
            ));
        }
        return Ok(Method::Trimmed { beta });
    }
    match s {
        "byzantine_robust" | "median" | "mean" => Ok(Method::from_gym_name(s)),
        other => Err(CoordinatorError::Config(format!(
            "unknown aggregation {other:?}"
        ))),
    }
}

fn secs(x: f64, what: &str) -> Result<Duration, CoordinatorError> {
    Duration::try_from_secs_f64(x).map_err(|_| CoordinatorError::Config(format!("bad {what}")))
}

impl CoordinatorSettings {
    /// Resolves secrets and defaults into a runnable config.
    pub fn into_config(self) -> Result<CoordinatorConfig, CoordinatorError> {
        let secrets = match &self.secrets_file {
            Some(p) => Secrets::from_file(p)?,
            None => Secrets::from_env(&self.workers)?,
        };
        let mut c = CoordinatorConfig::new(&self.bind, self.mode, self.workers, secrets);
        c.aggregation = parse_aggregation(&self.aggregation)?;
        c.exact_lora = self.exact_lora;
        c.data_weights = self.data_weights;
        if let Some(p) = self.expert_pins {
            c.expert_pins = p;
        }
        if let Some(s) = self.sync_interval_steps {
            c.sync_interval_steps = s;
        }
        if let Some(q) = self.quorum {
            c.quorum = q;
        }
        if let Some(t) = self.round_timeout_secs {
            c.round_timeout = secs(t, "round_timeout_secs")?;
        }
        if let Some(t) = self.long_poll_secs {
            c.long_poll = secs(t, "long_poll_secs")?;
        }
        if let Some(b) = self.max_body_bytes {
            c.max_body_bytes = b;
        }
        c.state_dir = self.state_dir;
        c.tls = self.tls;
        if let Some(t) = self.threads {
            c.threads = t;
        }
        c.validate()?;
        Ok(c)
    }
}
