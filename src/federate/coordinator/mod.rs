//! The federation coordinator: gym's endpoints on actix-web, with what gym lacks —
//! * replay protection (seen-signature cache within the skew window, optional signed nonce);
//! * quorum + round timeout: a round closes when every expected worker has pushed, or once its deadline (counted
//!   from the first push) has passed and at least `quorum` have; late pushes get 409 with the current round, so
//!   stragglers fetch the aggregate and join the next round instead of deadlocking the others;
//! * long-poll for the aggregate, woken by a notification (no polling loop);
//! * body size limit (413), per-worker secrets loaded from a file or the environment;
//! * round state persisted (temp file + rename) so a restarted coordinator resumes mid-round;
//! * `hearth_federate_*` metrics.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use actix_web::{App, HttpServer, web};

use super::hmac_auth::ReplayCache;
use super::tls::{ServerTls, TlsError};

mod finalize;
mod handlers;
mod settings;
mod state;

use finalize::{arm_timer, try_finalize};
use handlers::{get_aggregate, healthz, post_end, put_update, recent, topology};
pub use settings::{
    CoordinatorConfig, CoordinatorSettings, ExactLora, SECRET_ENV_PREFIX, Secrets,
    parse_aggregation, secret_env_var,
};
pub use state::RoundSummary;
use state::{Round, State, load_state};

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
    #[error("secrets: {0}")]
    SecretsFile(#[from] crate::files::PrivateFileError),
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
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

/// Round arithmetic is signed (deadlines minus now).
fn now_ms() -> i64 {
    crate::clock::now_unix_ms() as i64
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deadline_ms(&self, r: &Round) -> i64 {
        r.opened_at_ms + self.cfg.round_timeout.as_millis() as i64
    }
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
