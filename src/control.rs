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

/// The control server: `/healthz`, `/status`, `/metrics`.
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
        let access = Access::new(key);
        access.check_listen(addr)?;
        let data = web::Data::new(run_status);
        let bind = addr.to_owned();
        let server = ServerThread::spawn("control-http", move || {
            let server = HttpServer::new(move || {
                let access = access.clone();
                App::new()
                    .wrap(from_fn(move |req, next| access.clone().guard(req, next)))
                    .app_data(data.clone())
                    .route("/healthz", web::get().to(healthz))
                    .route("/status", web::get().to(status))
                    .route("/metrics", web::get().to(metrics))
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
