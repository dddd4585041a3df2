//! The process-wide Prometheus recorder behind `/metrics`.
//!
//! Metric names: `hearth_edge_{pushed,popped,dropped}_total` and `hearth_edge_send_blocked_seconds` labelled
//! `edge="from->to"`; `hearth_node_{processed,errors,restarts,dead_letters}_total`, `hearth_node_failed` and
//! `hearth_node_handler_seconds` labelled `node="id"`. Actors add their own under `hearth_<kind>_*`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Histogram buckets in seconds, from 10 µs (a fast handler) to 10 s (a badly backpressured edge).
const BUCKETS: &[f64] = &[
    1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0,
];

/// Installs the recorder once per process. Metrics registered before this are lost, so the runtime calls it
/// before creating any edge or node. Returns `None` if another recorder was installed first.
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new().set_buckets(BUCKETS).ok()?;
            let handle = builder.install_recorder().ok()?;
            spawn_upkeep();
            Some(handle)
        })
        .as_ref()
}

/// Histograms buffer raw observations until upkeep folds them into buckets; a process that runs for days
/// without anyone scraping `/metrics` would otherwise grow without bound.
fn spawn_upkeep() {
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".to_owned())
        .spawn(|| {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                if let Some(Some(handle)) = HANDLE.get() {
                    handle.run_upkeep();
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no metrics upkeep thread: histogram memory grows until /metrics is read");
    }
}

/// Renders every metric in Prometheus text format.
pub fn render() -> String {
    match install() {
        Some(handle) => {
            handle.run_upkeep();
            handle.render()
        }
        None => String::new(),
    }
}
