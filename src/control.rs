//! The control port, on actix-web: the status page at `/` ([`crate::page`]), `/healthz`, `/status` (JSON) and
//! `/metrics` (Prometheus text), under the API's access rules ([`crate::access`]): it names every node and its
//! errors, so a key guards it too.
//!
//! The server runs on its own thread with its own actix system, so CPU-heavy actors on their worker threads
//! cannot starve it.

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::middleware::from_fn;
use actix_web::{App, HttpResponse, HttpServer, web};

use crate::access::{Access, ApiKey};
use crate::engine::runtime::RunStatus;
use crate::page::{PageSource, render_page, render_view};
use crate::server_thread::{ServerThread, no_address};
use crate::store::{ServedState, Store, StoreError};

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

/// Whether the control port has an API key: the page at `/` then carries no data.
#[derive(Clone, Copy)]
struct Keyed(bool);

/// The page's headers: it may load nothing from elsewhere (scripts, styles, images, connections), and no other
/// site may frame it.
fn page_response(body: String) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((
            "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; \
             connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ))
        .insert_header(("Cache-Control", "no-store"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .body(body)
}

async fn render(
    status: web::Data<Arc<RunStatus>>,
    page: web::Data<Option<PageSource>>,
) -> Result<String, HttpResponse> {
    let snapshot = status.snapshot();
    // SQLite reads and chart drawing block: off the server's worker.
    match web::block(move || render_view(&snapshot, page.get_ref().as_ref())).await {
        Ok(Ok(view)) => Ok(view),
        Ok(Err(e)) => Err(HttpResponse::InternalServerError().body(e.to_string())),
        Err(e) => Err(HttpResponse::InternalServerError().body(e.to_string())),
    }
}

/// `GET /`: the status page, with its data when no key is set; with one, the shell that asks for it.
async fn index(
    status: web::Data<Arc<RunStatus>>,
    page: web::Data<Option<PageSource>>,
    keyed: web::Data<Keyed>,
) -> HttpResponse {
    if keyed.0 {
        return page_response(render_page(None));
    }
    match render(status, page).await {
        Ok(view) => page_response(render_page(Some(&view))),
        Err(e) => e,
    }
}

/// `GET /page/view`: the page's data alone, which its script fetches every few seconds.
async fn view(
    status: web::Data<Arc<RunStatus>>,
    page: web::Data<Option<PageSource>>,
) -> HttpResponse {
    match render(status, page).await {
        Ok(view) => page_response(view),
        Err(e) => e,
    }
}

/// `POST /deltas/rollback` with a JSON body (`{}`, or `{"user": "U"}` for one user's own chain): what
/// `hearth deltas rollback [--user U]` does, through the same [`Store::rollback_for`]. A JSON body, so the
/// access rules' content-type and Origin checks keep other sites out.
async fn rollback(
    page: web::Data<Option<PageSource>>,
    body: web::Json<serde_json::Value>,
) -> HttpResponse {
    let user = match body.get("user") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(u)) => Some(u.clone()),
        Some(other) => {
            return HttpResponse::BadRequest().json(serde_json::json!({"error": {
                "message": format!("field `user`: expected a string, got {other}")
            }}));
        }
    };
    let alone = if user.is_some() {
        "the common state"
    } else {
        "the base alone"
    };
    let to = user
        .as_deref()
        .map_or(String::new(), |u| format!(" to user `{u}`"));
    let Some(dir) = page.get_ref().as_ref().map(|p| p.data_dir.clone()) else {
        return HttpResponse::NotFound().json(
            serde_json::json!({"error": {"message": "this control port has no data directory"}}),
        );
    };
    let result = web::block(move || -> Result<Option<ServedState>, StoreError> {
        if !dir.join(Store::FILE_NAME).exists() {
            return Err(StoreError::Refused(format!(
                "no store in {}",
                dir.display()
            )));
        }
        Store::open(&dir)?.rollback_for(user.as_deref(), ROLLBACK_REASON)
    })
    .await;
    match result {
        Ok(Ok(Some(s))) => HttpResponse::Ok().json(serde_json::json!({
            "rolled_back": true,
            "served": s,
            "message": format!(
                "serving {}{to} (the serve node follows within a second)",
                s.delta_id.as_deref().unwrap_or(alone)
            ),
        })),
        Ok(Ok(None)) => HttpResponse::Ok().json(serde_json::json!({
            "rolled_back": false,
            "message": format!("nothing to roll back: serving {alone}{to}"),
        })),
        Ok(Err(e)) => {
            HttpResponse::Conflict().json(serde_json::json!({"error": {"message": e.to_string()}}))
        }
        Err(e) => HttpResponse::InternalServerError().body(e.to_string()),
    }
}

/// The `serving_log` reason of a rollback from the page (the CLI's says "by a person" too).
pub const ROLLBACK_REASON: &str = "rolled back by a person (status page)";

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

/// What the control server serves beyond the live graph's status.
#[derive(Default, Clone)]
pub struct ControlOptions {
    /// With a key, every endpoint requires it (the page's shell aside), and only with one may the address be
    /// off loopback.
    pub key: Option<ApiKey>,
    /// Serves `POST /reload`.
    pub reload: Option<ReloadHook>,
    /// The status page reads the store in its data directory (curation, training, the gate, the privacy
    /// check) and serves `POST /deltas/rollback`; without it the page shows the live graph alone.
    pub page: Option<PageSource>,
}

/// The control server: the status page, `/healthz`, `/status`, `/metrics`, and `/reload` when given a
/// [`ReloadHook`].
pub struct ControlServer {
    pub addr: SocketAddr,
    server: ServerThread,
}

impl ControlServer {
    /// Binds `addr` (port 0 picks a free port) and serves until stopped, without an API key: loopback only.
    pub fn start(addr: &str, run_status: Arc<RunStatus>) -> Result<ControlServer, HttpError> {
        Self::start_with(addr, run_status, ControlOptions::default())
    }

    /// [`ControlServer::start`] with `options`, under the same access rules as the API ([`Access`]).
    pub fn start_with(
        addr: &str,
        run_status: Arc<RunStatus>,
        options: ControlOptions,
    ) -> Result<ControlServer, HttpError> {
        let ControlOptions {
            key,
            reload: reload_hook,
            page,
        } = options;
        let keyed = Keyed(key.is_some());
        // The page's shell needs no key (a browser cannot send one before the user types it); it carries
        // no data then, and everything it fetches does need the key.
        let access = Access::new(key).with_keyless_get(&["/"]);
        access.check_listen(addr)?;
        let data = web::Data::new(run_status);
        let page = web::Data::new(page);
        let bind = addr.to_owned();
        let server = ServerThread::spawn("control-http", move || {
            let server = HttpServer::new(move || {
                let access = access.clone();
                let app = App::new()
                    .wrap(from_fn(move |req, next| access.clone().guard(req, next)))
                    .app_data(data.clone())
                    .app_data(page.clone())
                    .app_data(web::Data::new(keyed))
                    .route("/", web::get().to(index))
                    .route("/page/view", web::get().to(view))
                    .route("/deltas/rollback", web::post().to(rollback))
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
