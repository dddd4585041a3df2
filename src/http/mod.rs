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

/// An actix-web server running on its own thread and actix system. actix's server is not `Send`, so it is built,
/// bound and run on that thread; the caller learns the bound address (or the bind error) before `spawn` returns.
pub struct ServerThread {
    pub addr: SocketAddr,
    handle: actix_web::dev::ServerHandle,
    thread: JoinHandle<()>,
}

impl ServerThread {
    /// Runs `build` inside a fresh actix system on a thread named `name`. `build` binds and starts the server
    /// (it may first spawn tasks on the system, e.g. timers) and returns it with its first bound address.
    pub fn spawn<F>(name: &str, build: F) -> std::io::Result<ServerThread>
    where
        F: FnOnce() -> std::io::Result<(actix_web::dev::Server, SocketAddr)> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread_name = name.to_owned();
        let thread = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = match build() {
                    Ok((server, addr)) => {
                        let _ = tx.send(Ok((addr, server.handle())));
                        server
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                if let Err(e) = server.await {
                    tracing::error!(server = %thread_name, error = %e, "server stopped with an error");
                }
            });
        })?;
        let (addr, handle) = rx.recv().map_err(|_| {
            std::io::Error::other(format!("{name}: server thread exited before binding"))
        })??;
        Ok(ServerThread {
            addr,
            handle,
            thread,
        })
    }

    /// Stops accepting and joins the thread; `graceful` lets requests in flight finish first.
    pub fn stop(self, graceful: bool) {
        actix_web::rt::System::new().block_on(self.handle.stop(graceful));
        let _ = self.thread.join();
    }
}

/// The error for a bound server that reports no address; `bind` succeeding makes this unreachable in practice,
/// but it stays an error rather than a panic.
pub fn no_address() -> std::io::Error {
    std::io::Error::other("no address bound")
}

/// The control server: `/healthz`, `/status`, `/metrics`.
pub struct ControlServer {
    pub addr: SocketAddr,
    server: ServerThread,
}

impl ControlServer {
    /// Binds `addr` (port 0 picks a free port) and serves until stopped.
    pub fn start(addr: &str, run_status: Arc<RunStatus>) -> Result<ControlServer, HttpError> {
        let data = web::Data::new(run_status);
        let bind = addr.to_owned();
        let server = ServerThread::spawn("control-http", move || {
            let server = HttpServer::new(move || {
                App::new()
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
