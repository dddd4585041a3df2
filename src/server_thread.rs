//! An actix-web server on a thread of its own, shared by the API, the control port and the federation
//! coordinator: CPU-heavy actors on their worker threads cannot starve it.

use std::net::SocketAddr;
use std::thread::JoinHandle;

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
