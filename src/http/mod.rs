//! HTTP endpoints on actix-web: `/healthz`, `/status` (JSON) and `/metrics` (Prometheus text).
//!
//! The server runs on its own thread with its own actix system, so CPU-heavy actors on their worker threads
//! cannot starve it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use actix_web::{App, HttpResponse, HttpServer, web};

use crate::engine::runtime::RunStatus;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot bind control endpoints to {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("control server thread: {0}")]
    Thread(std::io::Error),
}

async fn healthz(status: web::Data<Arc<RunStatus>>) -> HttpResponse {
    if status.healthy() {
        HttpResponse::Ok().body("ok\n")
    } else {
        HttpResponse::ServiceUnavailable().body("a node has failed; see /status\n")
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

/// A running control server; dropping it does not stop it, call [`ControlServer::stop`].
pub struct ControlServer {
    pub addr: SocketAddr,
    handle: actix_web::dev::ServerHandle,
    thread: JoinHandle<()>,
}

impl ControlServer {
    /// Binds `addr` (port 0 picks a free port) and serves until stopped.
    pub fn start(addr: &str, run_status: Arc<RunStatus>) -> Result<ControlServer, HttpError> {
        let data = web::Data::new(run_status);
        let addr_owned = addr.to_owned();
        // actix's server is not Send: build, bind and run it all on its own thread, reporting back how it went.
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("control-http".to_owned())
            .spawn(move || {
                let bound = HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .route("/healthz", web::get().to(healthz))
                        .route("/status", web::get().to(status))
                        .route("/metrics", web::get().to(metrics))
                })
                .workers(1)
                .disable_signals()
                .bind(&addr_owned);
                let server = match bound {
                    Ok(server) => server,
                    Err(source) => {
                        let _ = tx.send(Err(source));
                        return;
                    }
                };
                let Some(local) = server.addrs().first().copied() else {
                    let _ = tx.send(Err(std::io::Error::other("no address bound")));
                    return;
                };
                let system = actix_web::rt::System::new();
                system.block_on(async move {
                    let server = server.run();
                    let _ = tx.send(Ok((local, server.handle())));
                    if let Err(e) = server.await {
                        tracing::error!(error = %e, "control server stopped with an error");
                    }
                });
            })
            .map_err(HttpError::Thread)?;
        let (bound, handle) = rx
            .recv()
            .map_err(|_| HttpError::Thread(std::io::Error::other("control server did not start")))?
            .map_err(|source| HttpError::Bind {
                addr: addr.to_owned(),
                source,
            })?;
        Ok(ControlServer {
            addr: bound,
            handle,
            thread,
        })
    }

    /// Stops accepting, finishes requests in flight, and joins the server thread.
    pub fn stop(self) {
        let handle = self.handle;
        actix_web::rt::System::new().block_on(handle.stop(true));
        let _ = self.thread.join();
    }
}
