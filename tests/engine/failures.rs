//! A node that keeps failing is visible and bounded: its failures (in handlers, at build, in periodic or
//! background work) count against its restart policy, and `/status`, `/healthz`, the status line and the run
//! report name it with its last error.

use std::path::Path;
use std::time::{Duration, Instant};

use hearth::engine::runtime::{NodeSnapshot, NodeState, RunningGraph, Stage, StatusSnapshot};
use hearth::engine::start;
use serde_json::Value;

use super::runtime::{graph, http_get};
use crate::train_util;

/// Polls the running graph until `done` holds for its snapshot (or panics after `secs`).
fn wait_for(
    running: &RunningGraph<hearth::message::Message>,
    secs: u64,
    done: impl Fn(&StatusSnapshot) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let snap = running.status().snapshot();
        if done(&snap) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out: {snap:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn node<'a>(s: &'a StatusSnapshot, id: &str) -> &'a NodeSnapshot {
    s.nodes.iter().find(|n| n.id == id).expect("node")
}

fn status_node(status: &Value, id: &str) -> Value {
    status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no node {id} in {status}"))
}

/// A slow source feeding `fault`: between samples the node is idle, so its periodic work runs.
fn periodic_graph(fail_periodic: bool, restart: &str) -> hearth::actors::Graph {
    graph(&format!(
        r#"Graph(name: "periodic", nodes: [
            (id: "gen", kind: Generate(count: None, interval_us: 100000)),
            (id: "fault", kind: FaultInject(fail_periodic: {fail_periodic}), restart: {restart}),
            (id: "sink", kind: Blackhole()),
        ], edges: [
            (from: "gen.out", to: "fault.in", capacity: 4),
            (from: "fault.out", to: "sink.in", capacity: 4),
        ])"#
    ))
}

const TIGHT: &str = "(max_restarts: 2, window_secs: 60, backoff_ms: 1)";

/// Without `fail_periodic` the same node idles between samples without an error.
#[test]
fn periodic_work_that_succeeds_leaves_the_node_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(periodic_graph(false, TIGHT), Some(dir.path())).unwrap();
    let server = hearth::control::ControlServer::start("127.0.0.1:0", running.status()).unwrap();
    // Several idle periods (each tens of milliseconds) between the samples.
    std::thread::sleep(Duration::from_millis(400));
    let snap = running.status().snapshot();
    let fault = node(&snap, "fault");
    assert!(fault.processed + fault.queue_depth as u64 >= 1, "{fault:?}");
    assert_eq!((fault.state, fault.errors), (NodeState::Running, 0));
    assert!(!fault.erroring && fault.last_error.is_none(), "{fault:?}");
    let (code, body) = http_get(server.addr, "/healthz");
    assert_eq!((code, body.trim()), (200, "ok"));
    server.stop();
    let report = running.shutdown();
    assert!(report.failed_nodes.is_empty());
}

/// Periodic work that fails every time exhausts the restart budget like a failing handler: the node is
/// failed after `max_restarts` restarts, and every view names it with its last error.
#[test]
fn a_node_failing_in_periodic_work_is_failed_and_named_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(periodic_graph(true, TIGHT), Some(dir.path())).unwrap();
    let server = hearth::control::ControlServer::start("127.0.0.1:0", running.status()).unwrap();
    wait_for(&running, 20, |s| {
        node(s, "fault").state == NodeState::Failed
    });

    let (code, body) = http_get(server.addr, "/status");
    assert_eq!(code, 200);
    let status: Value = serde_json::from_str(&body).expect("status json");
    let fault = status_node(&status, "fault");
    assert_eq!(fault["state"], "Failed");
    assert_eq!(
        (fault["errors"].as_u64(), fault["restarts"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(
        fault["last_error"]["error"],
        "periodic work: injected fault"
    );
    assert_eq!(fault["last_error"]["during"], "background");
    let at = fault["last_error"]["at_unix_ms"].as_u64().expect("time");
    assert!(at.abs_diff(hearth::clock::now_unix_ms()) < 60_000, "{at}");
    assert_eq!(status_node(&status, "sink")["last_error"], Value::Null);

    let (code, body) = http_get(server.addr, "/healthz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("failed: node `fault` failed (restart limit reached after 3 errors)")
            && body.contains("periodic work: injected fault"),
        "{body}"
    );
    assert!(
        !body.contains("`sink`") && !body.contains("`gen`"),
        "{body}"
    );

    // The status line and the report (over an empty store) name it too.
    let store = hearth::store::Store::open(dir.path()).unwrap();
    let snapshot = running.status().snapshot();
    let report = hearth::report::Report::build(&store, &[])
        .unwrap()
        .with_nodes(&snapshot);
    let line = report.status_line();
    assert!(
        line.ends_with("| FAILED: fault: periodic work: injected fault"),
        "{line}"
    );
    let markdown = report.to_markdown();
    assert!(
        markdown.contains("## Node errors\n- `fault` (fault_inject): Failed, 3 errors, 2 restarts; last error in background work at "),
        "{markdown}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["node_errors"][0]["id"], "fault");

    server.stop();
    let report = running.shutdown();
    assert_eq!(report.failed_nodes, ["fault"]);
    assert_eq!(node(&report.status, "gen").state, NodeState::Finished);
    assert_eq!(node(&report.status, "sink").state, NodeState::Finished);
}

/// A node restarting within its budget is not failed, but `/healthz` flags it (still 200) and `/status`
/// marks it erroring, both with its last error.
#[test]
fn a_node_restarting_within_its_budget_is_flagged_as_erroring() {
    let dir = tempfile::tempdir().unwrap();
    // The first failure's backoff keeps the node restarting long enough to look at.
    let running = start(
        periodic_graph(
            true,
            "(max_restarts: 5, window_secs: 60, backoff_ms: 3000, max_backoff_ms: 3000)",
        ),
        Some(dir.path()),
    )
    .unwrap();
    let server = hearth::control::ControlServer::start("127.0.0.1:0", running.status()).unwrap();
    wait_for(&running, 20, |s| node(s, "fault").errors >= 1);

    let (code, body) = http_get(server.addr, "/healthz");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.starts_with("degraded: node `fault` is erroring (restarting, ")
            && body.contains("last error in background work: periodic work: injected fault"),
        "{body}"
    );
    let (_, body) = http_get(server.addr, "/status");
    let status: Value = serde_json::from_str(&body).expect("status json");
    let fault = status_node(&status, "fault");
    assert_eq!(fault["state"], "Restarting");
    assert_eq!(fault["erroring"], true);
    assert!(fault["restarts_in_window"].as_u64() >= Some(1), "{fault}");
    assert_eq!(
        fault["last_error"]["error"],
        "periodic work: injected fault"
    );
    assert_eq!(status_node(&status, "sink")["erroring"], false);

    let snapshot = running.status().snapshot();
    let line = hearth::report::troubled_nodes(&snapshot.nodes).expect("a node in trouble");
    assert!(
        line.starts_with("erroring: fault (")
            && line.ends_with(" restarts in window): periodic work: injected fault"),
        "{line}"
    );
    server.stop();
    running.shutdown();
}

/// A build that keeps failing counts the same way and is named with its error.
#[test]
fn a_node_that_cannot_be_built_is_failed_with_the_build_error() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(
        graph(
            r#"Graph(name: "build", nodes: [
                (id: "gen", kind: Generate(count: None, interval_us: 100000)),
                (id: "dedup", kind: Dedup(), workers: 2, restart: (max_restarts: 1, window_secs: 60, backoff_ms: 1)),
                (id: "sink", kind: Blackhole()),
            ], edges: [
                (from: "gen.out", to: "dedup.in", capacity: 4),
                (from: "dedup.out", to: "sink.in", capacity: 4),
            ])"#,
        ),
        Some(dir.path()),
    )
    .unwrap();
    wait_for(&running, 20, |s| {
        node(s, "dedup").state == NodeState::Failed
    });
    let health = running.status().health();
    assert!(!health.healthy());
    assert_eq!(health.failed.len(), 1);
    let error = health.failed[0].last_error.clone().expect("last error");
    assert_eq!(error.during, Stage::Build);
    assert!(error.error.contains("use `workers: 1`"), "{}", error.error);
    running.shutdown();
}

/// Through the real trainer: a replay file that does not exist fails every training cycle. The restarted
/// trainer reloads the training set from the store and retries the cycle at once, so the node is failed
/// after its restart budget rather than failing again with each new batch of samples, forever.
#[test]
fn a_trainer_whose_cycles_keep_failing_is_failed_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _, _) = train_util::tiny(dir.path());
    let data = dir.path().join("data");
    admit_samples(&data, 4);
    let missing = dir.path().join("no-such-dir").join("base.txt");
    // One sample arrives, then nothing for an hour: only the store's training set can start cycles.
    let src = format!(
        r#"Graph(name: "train", nodes: [
            (id: "gen", kind: Generate(count: None, interval_us: 3600000000)),
            (id: "trainer", kind: Trainer(model: "{}", min_samples: 4, await_verdict: false, train: (
                steps: 1, batch_size: 2, rank: 2, max_seq_len: 64, holdout_fraction: 0.0,
                max_self_generated_share: 1.0, replay_file: "{}")),
             restart: (max_restarts: 2, window_secs: 60, backoff_ms: 1)),
        ], edges: [
            (from: "gen.out", to: "trainer.samples", capacity: 8),
        ])"#,
        base.display(),
        missing.display()
    );
    let running = start(graph(&src), Some(&data)).unwrap();
    let server = hearth::control::ControlServer::start("127.0.0.1:0", running.status()).unwrap();
    wait_for(&running, 120, |s| {
        node(s, "trainer").state == NodeState::Failed
    });
    let (code, body) = http_get(server.addr, "/healthz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("node `trainer` failed") && body.contains("base.txt"),
        "{body}"
    );
    let (_, body) = http_get(server.addr, "/status");
    let status: Value = serde_json::from_str(&body).expect("status json");
    let trainer = status_node(&status, "trainer");
    assert_eq!(
        (trainer["errors"].as_u64(), trainer["restarts"].as_u64()),
        (Some(3), Some(2))
    );
    let error = trainer["last_error"]["error"].as_str().expect("error");
    assert!(
        error.starts_with("training cycle: ") && error.contains("no-such-dir"),
        "{error}"
    );
    assert_eq!(trainer["last_error"]["during"], "background");
    server.stop();
    let report = running.shutdown();
    assert_eq!(report.failed_nodes, ["trainer"]);
    // No sample was at fault: a failed cycle dead-letters nothing it had taken.
    let letters =
        hearth::engine::dead_letter::DeadLetterStore::read_all::<hearth::message::Message>(&data)
            .unwrap();
    assert!(
        letters
            .iter()
            .all(|l| l.error.contains("restart limit reached")),
        "{letters:?}"
    );
}

/// Puts `n` interactions in the store at `data`, each admitted to the training set.
fn admit_samples(data: &Path, n: usize) {
    let mut store = hearth::store::Store::open(data).unwrap();
    for i in 0..n {
        // From JSON: an interaction's fields as a client of the store writes them.
        let interaction: hearth::message::Interaction = serde_json::from_value(serde_json::json!({
            "id": format!("i{i}"),
            "user": "u",
            "adapter": null,
            "prompt": [{"role": "user", "content": format!("what is fact {i}")}],
            "response": format!("fact {i} is about owls"),
            "sampling": {},
            "created_at_unix_ms": 1,
            "latency_ms": 1,
        }))
        .expect("interaction");
        for s in store.capture_interaction(&interaction).unwrap() {
            assert!(store.admit(&s).unwrap());
        }
    }
    assert_eq!(store.training_set().unwrap().len(), n);
}
