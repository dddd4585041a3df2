//! The federation coordinator: gym's endpoints on actix-web, with what gym lacks —
//! * replay protection (seen-signature cache within the skew window, optional signed nonce);
//! * quorum + round timeout: a round closes when every expected worker has pushed, or once its deadline (counted
//!   from the first push) has passed and at least `quorum` have; late pushes get 409 with the current round, so
//!   stragglers fetch the aggregate and join the next round instead of deadlocking the others;
//! * long-poll for the aggregate, woken by a notification (no polling loop);
//! * body size limit (413), per-worker secrets loaded from a file or the environment;
//! * round state persisted (temp file + rename) so a restarted coordinator resumes mid-round;
//! * `hearth_federate_*` metrics.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

use super::aggregate::{self, Method};
use super::hmac_auth::{
    self, AuthError, HEADER_NONCE, HEADER_SIG, HEADER_TS, HEADER_WORKER, ReplayCache, SignedRequest,
};
use super::lora::{self, ExactOptions};
use super::tls::{ServerTls, TlsError};
use super::wire::{self, Delta, Rounding, WireMode};

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("server thread: {0}")]
    Thread(std::io::Error),
    #[error("state: {0}")]
    State(String),
    #[error("secrets: {0}")]
    Secrets(String),
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

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

/// Reads a file that holds secrets, refusing it (on Unix) when group or others may read it. The error names
/// the file.
pub fn read_private_file(path: &Path) -> Result<String, String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(format!(
                "{} is readable by group/others; chmod 600 it",
                path.display()
            ));
        }
    }
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
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
        let text = read_private_file(path).map_err(CoordinatorError::Secrets)?;
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

    fn get(&self, worker: &str) -> Option<&[u8]> {
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

    fn validate(&self) -> Result<(), CoordinatorError> {
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

fn aggregation_name(m: Method) -> String {
    match m {
        Method::GymRobust => "byzantine_robust".into(),
        Method::Median => "median".into(),
        Method::Mean => "mean".into(),
        Method::Trimmed { beta } => format!("trimmed:{beta}"),
    }
}

/// One round's summary, kept for `/v1/metrics` and persisted.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RoundSummary {
    pub round: u64,
    pub included: Vec<String>,
    pub missing: Vec<String>,
    pub aggregate_ms: f64,
    pub bytes: usize,
    pub timed_out: bool,
    pub lora_max_residual: Option<f64>,
    pub losses: BTreeMap<String, (f64, u64)>,
}

#[derive(Default)]
struct Round {
    opened_at_ms: i64,
    arrivals: BTreeMap<String, web::Bytes>,
    layout: Option<Vec<(String, Vec<usize>)>>,
    finalizing: bool,
    /// Aggregation failed; the round is closed and its GETs answer 500 (no retry loop).
    failed: Option<String>,
    aggregate: Option<web::Bytes>,
    summary: RoundSummary,
}

#[derive(Default)]
struct State {
    /// Lowest round still accepting pushes.
    current_round: u64,
    rounds: BTreeMap<u64, Round>,
}

#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Persisted {
    current_round: u64,
    rounds: Vec<PersistedRound>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct PersistedRound {
    id: u64,
    opened_at_ms: i64,
    arrivals: Vec<String>,
    finalized: bool,
    summary: RoundSummary,
}

/// A broadcast notification that async waiters can await without a runtime-specific primitive.
#[derive(Default)]
struct Signal {
    generation: AtomicU64,
    wakers: Mutex<Vec<Waker>>,
}

impl Signal {
    fn notify_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        let ws = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|p| p.into_inner()));
        ws.into_iter().for_each(Waker::wake);
    }
    fn current(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
    fn changed(&self, seen: u64) -> SignalWait<'_> {
        SignalWait { sig: self, seen }
    }
}

struct SignalWait<'a> {
    sig: &'a Signal,
    seen: u64,
}

impl Future for SignalWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.sig.current() != self.seen {
            return Poll::Ready(());
        }
        let mut ws = self.sig.wakers.lock().unwrap_or_else(|p| p.into_inner());
        // Re-check under the lock so a notify between the check and the push is not lost.
        if self.sig.current() != self.seen {
            return Poll::Ready(());
        }
        if !ws.iter().any(|w| w.will_wake(cx.waker())) {
            ws.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

struct Shared {
    cfg: CoordinatorConfig,
    state: Mutex<State>,
    signal: Signal,
    replay: ReplayCache,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deadline_ms(&self, r: &Round) -> i64 {
        r.opened_at_ms + self.cfg.round_timeout.as_millis() as i64
    }
}

// ---------- persistence ----------

/// Writes `bytes` to `path` atomically: temp file in the same directory, fsync, rename.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("state"),
        std::process::id()
    ));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn round_dir(base: &Path, id: u64) -> PathBuf {
    base.join(format!("round-{id}"))
}

/// Worker names become file names hex-encoded, so no name can escape the directory.
fn blob_path(base: &Path, id: u64, worker: &str) -> PathBuf {
    round_dir(base, id).join(format!("{}.blob", hmac_auth::to_hex(worker.as_bytes())))
}

fn persist_state(sh: &Shared, st: &State) -> Result<(), CoordinatorError> {
    let Some(dir) = &sh.cfg.state_dir else {
        return Ok(());
    };
    let p = Persisted {
        current_round: st.current_round,
        rounds: st
            .rounds
            .iter()
            .map(|(&id, r)| PersistedRound {
                id,
                opened_at_ms: r.opened_at_ms,
                arrivals: r.arrivals.keys().cloned().collect(),
                finalized: r.aggregate.is_some(),
                summary: r.summary.clone(),
            })
            .collect(),
    };
    let bytes =
        serde_json::to_vec_pretty(&p).map_err(|e| CoordinatorError::State(e.to_string()))?;
    atomic_write(&dir.join("state.json"), &bytes)
        .map_err(|e| CoordinatorError::State(e.to_string()))
}

fn load_state(cfg: &CoordinatorConfig) -> Result<State, CoordinatorError> {
    let Some(dir) = &cfg.state_dir else {
        return Ok(State::default());
    };
    let path = dir.join("state.json");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
        Err(e) => return Err(CoordinatorError::State(format!("{}: {e}", path.display()))),
    };
    let p: Persisted =
        serde_json::from_slice(&bytes).map_err(|e| CoordinatorError::State(e.to_string()))?;
    let mut st = State {
        current_round: p.current_round,
        rounds: BTreeMap::new(),
    };
    for pr in p.rounds {
        let mut r = Round {
            opened_at_ms: pr.opened_at_ms,
            summary: pr.summary,
            ..Round::default()
        };
        if pr.finalized {
            let b = std::fs::read(round_dir(dir, pr.id).join("aggregate.blob"))
                .map_err(|e| CoordinatorError::State(format!("round {} aggregate: {e}", pr.id)))?;
            r.aggregate = Some(web::Bytes::from(b));
        } else {
            for w in pr.arrivals {
                let b = std::fs::read(blob_path(dir, pr.id, &w)).map_err(|e| {
                    CoordinatorError::State(format!("round {} worker {w}: {e}", pr.id))
                })?;
                let layout = validate_update(cfg.mode, cfg.exact_lora, &b)
                    .map_err(|e| CoordinatorError::State(e.to_string()))?;
                r.layout.get_or_insert(layout);
                r.arrivals.insert(w, web::Bytes::from(b));
            }
        }
        st.rounds.insert(pr.id, r);
    }
    Ok(st)
}

// ---------- validation and aggregation ----------

/// Decodes and checks an update; returns its layout. With exact LoRA aggregation every pair must have the
/// configured rank, so a hostile worker cannot make the re-factoring SVD arbitrarily large.
fn validate_update(
    mode: WireMode,
    exact: Option<ExactLora>,
    body: &[u8],
) -> Result<Vec<(String, Vec<usize>)>, wire::WireError> {
    let d: Delta = wire::decode(mode, body)?;
    if let Some(x) = exact {
        for p in lora::find_lora_pairs(&d) {
            let (a, b) = (&d[p.a], &d[p.b]);
            let ok = a.shape.len() == 2
                && b.shape.len() == 2
                && a.shape[0] == x.rank
                && b.shape[1] == x.rank;
            if !ok {
                return Err(wire::WireError::BadTensor {
                    name: p.module,
                    reason: format!(
                        "LoRA shapes {:?} {:?} do not have rank {}",
                        a.shape, b.shape, x.rank
                    ),
                });
            }
        }
    }
    if mode == WireMode::Gym && wire::decode_gym_view(body)?.flat.is_none() {
        return Err(wire::WireError::BadTensor {
            name: "*".into(),
            reason: "tensors not back to back".into(),
        });
    }
    Ok(d.into_iter().map(|t| (t.name, t.shape)).collect())
}

fn compute_aggregate(
    cfg: &CoordinatorConfig,
    names: &[String],
    blobs: &[web::Bytes],
) -> Result<(Vec<u8>, Option<f64>), String> {
    let weights: Option<Vec<f32>> = cfg.data_weights.as_ref().map(|dw| {
        let n = names.len() as f64;
        names
            .iter()
            .map(|w| dw.get(w).copied().unwrap_or(1.0 / n) as f32)
            .collect()
    });
    match cfg.mode {
        WireMode::Gym => {
            let refs: Vec<&[u8]> = blobs.iter().map(|b| b.as_ref()).collect();
            aggregate::aggregate_gym_blobs(
                &refs,
                weights.as_deref(),
                cfg.aggregation,
                Rounding::Truncate,
                cfg.threads,
            )
            .map(|b| (b, None))
            .map_err(|e| e.to_string())
        }
        WireMode::Native => {
            let deltas = blobs
                .iter()
                .map(|b| wire::decode_safetensors(b))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let (agg, residual) = match cfg.exact_lora {
                Some(x) => {
                    let (d, reps) = lora::aggregate_exact(
                        &deltas,
                        weights.as_deref(),
                        ExactOptions {
                            scale: x.scale,
                            rank: x.rank,
                            method: cfg.aggregation,
                            seed: 0x5eed,
                            threads: cfg.threads,
                        },
                    )
                    .map_err(|e| e.to_string())?;
                    let worst = reps.iter().map(|r| r.rel_residual).fold(0.0, f64::max);
                    (d, Some(worst))
                }
                None => (
                    aggregate::aggregate_deltas(
                        &deltas,
                        weights.as_deref(),
                        cfg.aggregation,
                        cfg.threads,
                    )
                    .map_err(|e| e.to_string())?,
                    None,
                ),
            };
            let meta = residual.map(|r| {
                HashMap::from([("hearth.lora_max_residual".to_owned(), format!("{r:.6e}"))])
            });
            wire::encode_safetensors(&agg, Rounding::NearestEven, meta)
                .map(|b| (b, residual))
                .map_err(|e| e.to_string())
        }
    }
}

/// Closes `round` if every expected worker arrived, or the deadline passed with a quorum.
async fn try_finalize(sh: Arc<Shared>, round: u64) {
    let job = {
        let mut st = sh.lock();
        let deadline = st.rounds.get(&round).map(|r| sh.deadline_ms(r));
        let Some(r) = st.rounds.get_mut(&round) else {
            return;
        };
        if r.aggregate.is_some() || r.finalizing || r.failed.is_some() || r.arrivals.is_empty() {
            return;
        }
        let all = sh.cfg.workers.iter().all(|w| r.arrivals.contains_key(w));
        let due = now_ms() >= deadline.unwrap_or(i64::MAX);
        if !(all || (due && r.arrivals.len() >= sh.cfg.quorum)) {
            return;
        }
        r.finalizing = true;
        let names: Vec<String> = r.arrivals.keys().cloned().collect();
        let blobs: Vec<web::Bytes> = r.arrivals.values().cloned().collect();
        (names, blobs, !all)
    };
    let (names, blobs, timed_out) = job;
    let sh2 = sh.clone();
    let names2 = names.clone();
    let t0 = std::time::Instant::now();
    let res = web::block(move || compute_aggregate(&sh2.cfg, &names2, &blobs)).await;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    {
        let mut st = sh.lock();
        let Some(r) = st.rounds.get_mut(&round) else {
            return;
        };
        r.finalizing = false;
        match res {
            Ok(Ok((blob, residual))) => {
                if let Some(dir) = &sh.cfg.state_dir
                    && let Err(e) =
                        atomic_write(&round_dir(dir, round).join("aggregate.blob"), &blob)
                {
                    tracing_log(&format!("round {round}: cannot persist aggregate: {e}"));
                }
                r.summary.round = round;
                r.summary.included = names.clone();
                r.summary.missing = sh
                    .cfg
                    .workers
                    .iter()
                    .filter(|w| !names.contains(w))
                    .cloned()
                    .collect();
                r.summary.aggregate_ms = ms;
                r.summary.bytes = blob.len();
                r.summary.timed_out = timed_out;
                r.summary.lora_max_residual = residual;
                r.aggregate = Some(web::Bytes::from(blob));
                r.arrivals.clear();
                metrics::counter!("hearth_federate_rounds_total").increment(1);
                metrics::gauge!("hearth_federate_round_participants").set(names.len() as f64);
                metrics::histogram!("hearth_federate_aggregate_seconds").record(ms / 1e3);
                if timed_out {
                    metrics::counter!("hearth_federate_rounds_timed_out_total").increment(1);
                }
                if let Some(res) = residual {
                    metrics::gauge!("hearth_federate_lora_residual").set(res);
                }
                st.current_round = st.current_round.max(round + 1);
                let keep = sh.cfg.keep_rounds.max(1) as u64;
                let cur = st.current_round;
                let old: Vec<u64> = st
                    .rounds
                    .keys()
                    .copied()
                    .filter(|&id| id + keep < cur)
                    .collect();
                for id in old {
                    st.rounds.remove(&id);
                    if let Some(dir) = &sh.cfg.state_dir {
                        let _ = std::fs::remove_dir_all(round_dir(dir, id));
                    }
                }
                if let Some(dir) = &sh.cfg.state_dir {
                    // Blobs of a closed round are no longer needed.
                    for w in &names {
                        let _ = std::fs::remove_file(blob_path(dir, round, w));
                    }
                }
                if let Err(e) = persist_state(&sh, &st) {
                    tracing_log(&format!("round {round}: {e}"));
                }
            }
            Ok(Err(e)) => {
                tracing_log(&format!("round {round}: aggregation failed: {e}"));
                r.failed = Some(e);
                st.current_round = st.current_round.max(round + 1);
            }
            Err(e) => {
                tracing_log(&format!("round {round}: aggregation task failed: {e}"));
                r.failed = Some(e.to_string());
                st.current_round = st.current_round.max(round + 1);
            }
        }
    }
    sh.signal.notify_all();
}

fn tracing_log(msg: &str) {
    metrics::counter!("hearth_federate_errors_total").increment(1);
    eprintln!("hearth::federate: {msg}");
}

/// Arms the deadline timer of a round (no polling: one sleep per round).
fn arm_timer(sh: &Arc<Shared>, round: u64, deadline_ms: i64) {
    let sh = sh.clone();
    let wait = Duration::from_millis((deadline_ms - now_ms()).max(0) as u64 + 5);
    actix_web::rt::spawn(async move {
        actix_web::rt::time::sleep(wait).await;
        try_finalize(sh, round).await;
    });
}

// ---------- handlers ----------

fn header<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn unauthorized(e: &AuthError) -> Box<HttpResponse> {
    metrics::counter!("hearth_federate_auth_failures_total", "reason" => e.reason()).increment(1);
    Box::new(
        HttpResponse::Unauthorized()
            .insert_header(("X-Hearth-Auth-Error", e.reason()))
            .finish(),
    )
}

/// Verifies the signature, then the replay cache; returns the authenticated worker.
/// The error side is boxed: an `HttpResponse` is large and this is the cold path.
fn authenticate(sh: &Shared, req: &HttpRequest, body: &[u8]) -> Result<String, Box<HttpResponse>> {
    let worker = header(req, HEADER_WORKER)
        .ok_or_else(|| unauthorized(&AuthError::Header(HEADER_WORKER)))?;
    let secret = sh
        .cfg
        .secrets
        .get(worker)
        .filter(|_| sh.cfg.workers.iter().any(|w| w == worker))
        .ok_or_else(|| unauthorized(&AuthError::UnknownWorker))?;
    let sreq = SignedRequest {
        method: req.method().as_str(),
        path: req.path(),
        ts: header(req, HEADER_TS).ok_or_else(|| unauthorized(&AuthError::Header(HEADER_TS)))?,
        sig: header(req, HEADER_SIG).ok_or_else(|| unauthorized(&AuthError::Header(HEADER_SIG)))?,
        nonce: header(req, HEADER_NONCE),
        body,
    };
    let now = hmac_auth::unix_now();
    let sig =
        hmac_auth::verify(secret, &sreq, now, sh.cfg.skew_secs).map_err(|e| unauthorized(&e))?;
    let ts: i64 = sreq.ts.trim().parse().unwrap_or(now);
    sh.replay
        .check_and_insert(sig, ts + sh.cfg.skew_secs, now)
        .map_err(|e| unauthorized(&e))?;
    Ok(worker.to_owned())
}

fn json_err(status: StatusCode, msg: &str, extra: serde_json::Value) -> HttpResponse {
    metrics::counter!("hearth_federate_rejected_total", "status" => status.as_u16().to_string())
        .increment(1);
    let mut v = serde_json::json!({"ok": false, "error": msg});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    HttpResponse::build(status).json(v)
}

async fn put_update(
    sh: web::Data<Arc<Shared>>,
    req: HttpRequest,
    path: web::Path<(u64, String)>,
    body: web::Bytes,
) -> HttpResponse {
    let (round, name) = path.into_inner();
    let worker = match authenticate(&sh, &req, &body) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    if worker != name {
        metrics::counter!("hearth_federate_auth_failures_total", "reason" => "impersonation")
            .increment(1);
        return HttpResponse::Forbidden().finish();
    }
    let layout = match validate_update(sh.cfg.mode, sh.cfg.exact_lora, &body) {
        Ok(l) => l,
        Err(e) => {
            return json_err(
                StatusCode::UNPROCESSABLE_ENTITY,
                &e.to_string(),
                serde_json::json!({}),
            );
        }
    };
    let arm = {
        let mut st = sh.lock();
        let cur = st.current_round;
        let closed = st
            .rounds
            .get(&round)
            .is_some_and(|r| r.aggregate.is_some() || r.finalizing || r.failed.is_some());
        if round < cur || closed || round > cur + 1 {
            return json_err(
                StatusCode::CONFLICT,
                "round not open",
                serde_json::json!({"current_round": cur}),
            );
        }
        let r = st.rounds.entry(round).or_default();
        if let Some(l) = &r.layout
            && *l != layout
        {
            return json_err(
                StatusCode::UNPROCESSABLE_ENTITY,
                "tensor layout differs from this round's",
                serde_json::json!({}),
            );
        }
        let first = r.arrivals.is_empty();
        if first {
            r.opened_at_ms = now_ms();
            r.layout = Some(layout);
        }
        if let Some(dir) = &sh.cfg.state_dir
            && let Err(e) = atomic_write(&blob_path(dir, round, &worker), &body)
        {
            tracing_log(&format!("persist update: {e}"));
            return json_err(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot persist",
                serde_json::json!({}),
            );
        }
        r.arrivals.insert(worker.clone(), body.clone());
        let deadline = sh.deadline_ms(r);
        if let Err(e) = persist_state(&sh, &st) {
            tracing_log(&e.to_string());
        }
        first.then_some(deadline)
    };
    metrics::counter!("hearth_federate_updates_total").increment(1);
    metrics::counter!("hearth_federate_update_bytes_total").increment(body.len() as u64);
    if let Some(d) = arm {
        arm_timer(&sh, round, d);
    }
    try_finalize(sh.get_ref().clone(), round).await;
    HttpResponse::Ok().json(serde_json::json!({"ok": true}))
}

async fn get_aggregate(
    sh: web::Data<Arc<Shared>>,
    req: HttpRequest,
    path: web::Path<u64>,
) -> HttpResponse {
    let round = path.into_inner();
    if let Err(r) = authenticate(&sh, &req, b"") {
        return *r;
    }
    let hold_until = std::time::Instant::now() + sh.cfg.long_poll;
    loop {
        let seen = sh.signal.current();
        let overdue = {
            let st = sh.lock();
            match st.rounds.get(&round) {
                Some(r) if r.aggregate.is_some() => {
                    let b = r.aggregate.clone().unwrap_or_default();
                    return HttpResponse::Ok()
                        .content_type("application/octet-stream")
                        .body(b);
                }
                Some(r) if r.failed.is_some() => {
                    let msg = r.failed.clone().unwrap_or_default();
                    return json_err(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &msg,
                        serde_json::json!({}),
                    );
                }
                Some(r) => !r.finalizing && !r.arrivals.is_empty() && now_ms() >= sh.deadline_ms(r),
                None if round < st.current_round => {
                    return json_err(StatusCode::GONE, "round expired", serde_json::json!({}));
                }
                None => false,
            }
        };
        if overdue {
            try_finalize(sh.get_ref().clone(), round).await;
            if sh.signal.current() != seen {
                continue;
            }
        }
        let left = hold_until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return HttpResponse::ServiceUnavailable()
                .insert_header(("Retry-After", "0"))
                .json(serde_json::json!({"ok": false, "error": "not ready"}));
        }
        let _ = actix_web::rt::time::timeout(left, sh.signal.changed(seen)).await;
    }
}

#[derive(serde::Deserialize)]
struct EndBody {
    loss: f64,
    step: u64,
}

async fn post_end(
    sh: web::Data<Arc<Shared>>,
    req: HttpRequest,
    path: web::Path<u64>,
    body: web::Bytes,
) -> HttpResponse {
    let round = path.into_inner();
    let worker = match authenticate(&sh, &req, &body) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    let Ok(end) = serde_json::from_slice::<EndBody>(&body) else {
        return json_err(
            StatusCode::BAD_REQUEST,
            "expected {\"loss\": float, \"step\": int}",
            serde_json::json!({}),
        );
    };
    let mut st = sh.lock();
    if let Some(r) = st.rounds.get_mut(&round) {
        r.summary.losses.insert(worker, (end.loss, end.step));
    }
    metrics::gauge!("hearth_federate_last_loss").set(end.loss);
    HttpResponse::Ok().json(serde_json::json!({"ok": true}))
}

async fn topology(sh: web::Data<Arc<Shared>>) -> HttpResponse {
    let c = &sh.cfg;
    let weights: serde_json::Value = match &c.data_weights {
        Some(w) => serde_json::to_value(w).unwrap_or_default(),
        None => {
            let n = c.workers.len() as f64;
            c.workers
                .iter()
                .map(|w| (w.clone(), serde_json::json!(1.0 / n)))
                .collect()
        }
    };
    HttpResponse::Ok().json(serde_json::json!({
        "workers": c.workers,
        "data_weights": weights,
        "expert_pins": c.expert_pins,
        "aggregation": aggregation_name(c.aggregation),
        "sync_interval_steps": c.sync_interval_steps,
    }))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"ok": true}))
}

async fn recent(sh: web::Data<Arc<Shared>>) -> HttpResponse {
    let st = sh.lock();
    let rounds: VecDeque<&RoundSummary> = st
        .rounds
        .values()
        .filter(|r| r.aggregate.is_some())
        .map(|r| &r.summary)
        .collect();
    HttpResponse::Ok()
        .json(serde_json::json!({"current_round": st.current_round, "rounds": rounds}))
}

/// A running coordinator. Stop it with [`Coordinator::stop`].
pub struct Coordinator {
    pub addr: SocketAddr,
    server: crate::server_thread::ServerThread,
}

impl Coordinator {
    /// Loads persisted state (if any), binds, re-arms timers of open rounds, and serves on its own thread.
    pub fn start(cfg: CoordinatorConfig) -> Result<Coordinator, CoordinatorError> {
        cfg.validate()?;
        // Checked here, so a bad certificate is a clear error rather than a server thread that never starts.
        let tls = cfg.tls.as_ref().map(ServerTls::server_config).transpose()?;
        let state = load_state(&cfg)?;
        let bind = cfg.bind.clone();
        let shared = Arc::new(Shared {
            replay: ReplayCache::new(cfg.replay_capacity),
            cfg,
            state: Mutex::new(state),
            signal: Signal::default(),
        });
        let bind2 = bind.clone();
        let server = crate::server_thread::ServerThread::spawn("federate-http", move || {
            let data = web::Data::new(shared.clone());
            let limit = shared.cfg.max_body_bytes;
            let server = HttpServer::new(move || {
                App::new()
                    .app_data(data.clone())
                    .app_data(web::PayloadConfig::new(limit))
                    .route("/", web::get().to(healthz))
                    .route("/v1/healthz", web::get().to(healthz))
                    .route("/v1/metrics", web::get().to(recent))
                    .route("/v1/topology", web::get().to(topology))
                    .route("/v1/round/{round}/worker/{name}", web::put().to(put_update))
                    .route("/v1/round/{round}/aggregate", web::get().to(get_aggregate))
                    .route("/v1/round/{round}/end", web::post().to(post_end))
            })
            .workers(1)
            .disable_signals();
            let server = match tls {
                Some(tls) => server.bind_rustls_0_23(&bind2, tls)?,
                None => server.bind(&bind2)?,
            };
            let local = server
                .addrs()
                .first()
                .copied()
                .ok_or_else(crate::server_thread::no_address)?;
            // Re-arm the timers of rounds that were open when the last coordinator stopped.
            let open: Vec<(u64, i64)> = {
                let st = shared.lock();
                st.rounds
                    .iter()
                    .filter(|(_, r)| r.aggregate.is_none() && !r.arrivals.is_empty())
                    .map(|(&id, r)| (id, shared.deadline_ms(r)))
                    .collect()
            };
            for (id, d) in open {
                arm_timer(&shared, id, d);
                actix_web::rt::spawn(try_finalize(shared.clone(), id));
            }
            Ok((server.run(), local))
        })
        .map_err(|source| CoordinatorError::Bind { addr: bind, source })?;
        Ok(Coordinator {
            addr: server.addr,
            server,
        })
    }

    /// Stops accepting, drops requests in flight (long-polls would hold a graceful stop), joins the thread.
    pub fn stop(self) {
        self.server.stop(false);
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
