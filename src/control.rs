//! The control port, on actix-web: `/healthz`, `/status` (JSON) and `/metrics` (Prometheus text), under the
//! API's access rules ([`crate::access`]): it names every node and its errors, so a key guards it too.
//!
//! The server runs on its own thread with its own actix system, so CPU-heavy actors on their worker threads
//! cannot starve it.

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::middleware::from_fn;
use actix_web::{App, HttpResponse, HttpServer, web};

use crate::access::{Access, ApiKey};
use crate::engine::runtime::RunStatus;
use crate::server_thread::{ServerThread, no_address};

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot bind control endpoints to {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("control server thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    Access(#[from] crate::access::AccessError),
}

/// 503 once a node has failed; 200 otherwise, with a `degraded:` line for each node erroring within its
/// restart budget. Each node in trouble is named with its last error.
async fn healthz(status: web::Data<Arc<RunStatus>>) -> HttpResponse {
    let health = status.health();
    if health.healthy() {
        HttpResponse::Ok().body(health.to_string())
    } else {
        HttpResponse::ServiceUnavailable().body(health.to_string())
    }
}

async fn status(status: web::Data<Arc<RunStatus>>) -> HttpResponse {
    HttpResponse::Ok().json(status.snapshot())
}

async fn metrics() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(crate::engine::metrics::render())
}

/// Applies a new graph, given as graph-file text, to the running one (`POST /reload`): the summary of what
/// changed, or why nothing did.
pub type ReloadHook = Arc<dyn Fn(&str) -> Result<String, ReloadRefused> + Send + Sync>;

/// Why a reload changed nothing.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReloadRefused {
    /// The new graph failed validation: every error, each with its `line:col`.
    Invalid(Vec<String>),
    /// It validated, but could not be applied (a setting that cannot change, a node that failed to start).
    Failed(String),
}

#[derive(serde::Deserialize)]
struct ReloadRequest {
    graph: String,
}

/// `POST /reload` with `{"graph": TEXT}`: 200 with the summary, 400 with the validation errors, 409 when it
/// could not be applied. Runs off the server's worker: a reload waits for nodes to reach a safe point.
async fn reload(hook: web::Data<ReloadHook>, body: web::Json<ReloadRequest>) -> HttpResponse {
    let hook = hook.get_ref().clone();
    let text = body.into_inner().graph;
    match web::block(move || hook(&text)).await {
        Ok(Ok(summary)) => HttpResponse::Ok().json(serde_json::json!({ "reloaded": summary })),
        Ok(Err(refused @ ReloadRefused::Invalid(_))) => HttpResponse::BadRequest().json(refused),
        Ok(Err(refused)) => HttpResponse::Conflict().json(refused),
        Err(e) => HttpResponse::InternalServerError().body(e.to_string()),
    }
}

/// The control server: `/healthz`, `/status`, `/metrics`, and `/reload` when given a [`ReloadHook`].
pub struct ControlServer {
    pub addr: SocketAddr,
    server: ServerThread,
}

impl ControlServer {
    /// Binds `addr` (port 0 picks a free port) and serves until stopped, without an API key: loopback only.
    pub fn start(addr: &str, run_status: Arc<RunStatus>) -> Result<ControlServer, HttpError> {
        Self::start_with_key(addr, run_status, None)
    }

    /// [`ControlServer::start`] under the same rules as the API ([`Access`]): with `key`, every endpoint
    /// requires it, and only with one may `addr` be off loopback.
    pub fn start_with_key(
        addr: &str,
        run_status: Arc<RunStatus>,
        key: Option<ApiKey>,
    ) -> Result<ControlServer, HttpError> {
        Self::start_with(addr, run_status, key, None)
    }

    /// [`ControlServer::start_with_key`], serving `POST /reload` through `reload` when given.
    pub fn start_with(
        addr: &str,
        run_status: Arc<RunStatus>,
        key: Option<ApiKey>,
        reload_hook: Option<ReloadHook>,
    ) -> Result<ControlServer, HttpError> {
        let access = Access::new(key);
        access.check_listen(addr)?;
        let data = web::Data::new(run_status);
        let bind = addr.to_owned();
        let server = ServerThread::spawn("control-http", move || {
            let server = HttpServer::new(move || {
                let access = access.clone();
                let app = App::new()
                    .wrap(from_fn(move |req, next| access.clone().guard(req, next)))
                    .app_data(data.clone())
                    .route("/healthz", web::get().to(healthz))
                    .route("/status", web::get().to(status))
                    .route("/metrics", web::get().to(metrics));
                match reload_hook.clone() {
                    Some(hook) => app
                        .app_data(web::Data::new(hook))
                        .route("/reload", web::post().to(reload)),
                    None => app,
                }
            })
            .workers(1)
            .disable_signals()
            .bind(&bind)?;
            let local = server.addrs().first().copied().ok_or_else(no_address)?;
            Ok((server.run(), local))
        })
        .map_err(|source| HttpError::Bind {
            addr: addr.to_owned(),
            source,
        })?;
        Ok(ControlServer {
            addr: server.addr,
            server,
        })
    }

    /// Stops accepting, finishes requests in flight, and joins the server thread.
    pub fn stop(self) {
        self.server.stop(true);
    }
}
