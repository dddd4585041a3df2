//! The runtime: backpressure, drop policies, supervision, drain, rewiring and the control endpoints.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use hearth::actors::Graph;
use hearth::engine::dead_letter::DeadLetterStore;
use hearth::engine::edge::bounded;
use hearth::engine::runtime::{NodeState, RunReport};
use hearth::engine::{WhenFull, start};
use hearth::message::{Message, Origin, Provenance, Sample, SampleContent};

pub(crate) fn graph(src: &str) -> Graph {
    hearth::actors::ActorKind::graph(src).unwrap_or_else(|e| panic!("invalid test graph: {e:#?}"))
}

fn run_to_end(src: &str, dir: &Path) -> RunReport {
    start(graph(src), Some(dir)).expect("start").wait()
}

fn edge<'a>(r: &'a RunReport, name: &str) -> &'a hearth::engine::edge::EdgeSnapshot {
    r.status
        .edges
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no edge {name}"))
}

fn node<'a>(r: &'a RunReport, id: &str) -> &'a hearth::engine::runtime::NodeSnapshot {
    r.status.nodes.iter().find(|n| n.id == id).expect("node")
}

fn sink_lines(dir: &Path, file: &str) -> Vec<Message> {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

#[test]
fn backpressure_blocks_the_producer_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let r = run_to_end(
        r#"Graph(name: "bp", nodes: [
            (id: "gen", kind: Generate(count: 400)),
            (id: "slow", kind: Throttle(delay_us: 500)),
            (id: "sink", kind: Blackhole()),
        ], edges: [
            (from: "gen.out", to: "slow.in", capacity: 8, when_full: Block),
            (from: "slow.out", to: "sink.in", capacity: 8),
        ])"#,
        dir.path(),
    );
    let e = edge(&r, "gen.out->slow.in");
    assert_eq!((e.pushed, e.popped, e.dropped), (400, 400, 0));
    assert!(e.max_depth <= 8, "depth {} exceeded capacity", e.max_depth);
    assert!(
        e.max_depth >= 7,
        "the slow consumer should have filled the mailbox"
    );
    // 400 messages at 0.5 ms each take ~0.2 s; a fast producer spends most of that blocked.
    assert!(e.blocked_seconds > 0.05, "producer never blocked: {e:?}");
    assert_eq!(node(&r, "sink").processed, 400);
}

fn sample(i: usize) -> Message {
    Message::Sample(std::sync::Arc::new(Sample {
        id: format!("s-{i}"),
        user: "u".to_owned(),
        origin: Origin::Grounded,
        content: SampleContent::Sft {
            prompt: vec![],
            response: String::new(),
        },
        provenance: Provenance::default(),
        created_at_unix_ms: 0,
    }))
}

#[test]
fn drop_newest_keeps_the_first_and_counts_the_rest() {
    let (tx, rx) = bounded("t".into(), 4, WhenFull::DropNewest, false, "in");
    for i in 0..10 {
        tx.send(sample(i));
    }
    let kept: Vec<String> = rx.rx.try_iter().map(|m| m.id().to_owned()).collect();
    assert_eq!(kept, ["s-0", "s-1", "s-2", "s-3"]);
    drop(tx); // publishes the sender's batched counts
    let s = rx.stats.snapshot();
    assert_eq!((s.pushed, s.dropped), (4, 6));
}

#[test]
fn drop_oldest_keeps_the_last_and_counts_the_rest() {
    let (tx, rx) = bounded("t".into(), 4, WhenFull::DropOldest, false, "in");
    for i in 0..10 {
        tx.send(sample(i));
    }
    let kept: Vec<String> = rx.rx.try_iter().map(|m| m.id().to_owned()).collect();
    assert_eq!(kept, ["s-6", "s-7", "s-8", "s-9"]);
    drop(tx); // publishes the sender's batched counts
    let s = rx.stats.snapshot();
    assert_eq!((s.pushed, s.dropped), (10, 6));
}

#[test]
fn drop_policies_account_for_every_message_in_a_running_graph() {
    for policy in ["DropNewest", "DropOldest"] {
        let dir = tempfile::tempdir().unwrap();
        let r = run_to_end(
            &format!(
                r#"Graph(name: "drops", nodes: [
                    (id: "gen", kind: Generate(count: 300)),
                    (id: "slow", kind: Throttle(delay_us: 1000)),
                    (id: "sink", kind: JsonlSink(path: "out.jsonl")),
                ], edges: [
                    (from: "gen.out", to: "slow.in", capacity: 4, when_full: {policy}),
                    (from: "slow.out", to: "sink.in", capacity: 64),
                ])"#
            ),
            dir.path(),
        );
        let e = edge(&r, "gen.out->slow.in");
        let delivered = sink_lines(dir.path(), "out.jsonl").len() as u64;
        assert!(
            e.dropped > 0,
            "{policy}: a 1 ms consumer must drop some of 300 fast messages"
        );
        assert_eq!(delivered, e.popped, "{policy}");
        match policy {
            // Offered = queued + dropped at the door.
            "DropNewest" => assert_eq!(e.pushed + e.dropped, 300, "{policy}: {e:?}"),
            // Every message is queued; evictions remove some of them.
            _ => assert_eq!(
                (e.pushed, e.popped + e.dropped),
                (300, 300),
                "{policy}: {e:?}"
            ),
        }
        assert!(e.max_depth <= 4);
    }
}

#[test]
fn a_panicking_message_is_dead_lettered_and_the_worker_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let r = run_to_end(
        r#"Graph(name: "sup", nodes: [
            (id: "gen", kind: Generate(count: 100)),
            (id: "flaky", kind: FaultInject(fail_ids_ending: ["-13"], mode: Panic),
             restart: (max_restarts: 3, window_secs: 60, backoff_ms: 1)),
            (id: "sink", kind: JsonlSink(path: "out.jsonl")),
        ], edges: [
            (from: "gen.out", to: "flaky.in", capacity: 4),
            (from: "flaky.out", to: "sink.in", capacity: 4),
        ])"#,
        dir.path(),
    );
    let flaky = node(&r, "flaky");
    assert_eq!((flaky.restarts, flaky.errors, flaky.processed), (1, 1, 99));
    assert_eq!(flaky.state, NodeState::Finished);
    assert!(r.failed_nodes.is_empty());
    let letters = DeadLetterStore::read_all::<Message>(dir.path()).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].node, "flaky");
    assert_eq!(letters[0].message.id(), "gen-0-13");
    assert!(
        letters[0]
            .error
            .contains("panicked: injected fault on gen-0-13"),
        "{}",
        letters[0].error
    );
    // Neighbours unaffected: everything else arrived, in order.
    let ids: Vec<String> = sink_lines(dir.path(), "out.jsonl")
        .iter()
        .map(|m| m.id().to_owned())
        .collect();
    let want: Vec<String> = (0..100)
        .filter(|&i| i != 13)
        .map(|i| format!("gen-0-{i}"))
        .collect();
    assert_eq!(ids, want);
    assert_eq!(node(&r, "sink").state, NodeState::Finished);
}

#[test]
fn the_restart_limit_marks_the_node_failed_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    // Ids ending in 0 fail: gen-0-0, -10, -20, ... The fourth failure exceeds max_restarts = 3.
    let r = run_to_end(
        r#"Graph(name: "limit", nodes: [
            (id: "gen", kind: Generate(count: 100)),
            (id: "flaky", kind: FaultInject(fail_ids_ending: ["0"], mode: Error),
             restart: (max_restarts: 3, window_secs: 60, backoff_ms: 1)),
            (id: "sink", kind: JsonlSink(path: "out.jsonl")),
        ], edges: [
            (from: "gen.out", to: "flaky.in", capacity: 4),
            (from: "flaky.out", to: "sink.in", capacity: 4),
        ])"#,
        dir.path(),
    );
    assert_eq!(r.failed_nodes, ["flaky"]);
    let flaky = node(&r, "flaky");
    assert_eq!(flaky.state, NodeState::Failed);
    assert_eq!(flaky.restarts, 3);
    assert_eq!(flaky.errors, 4);
    // The fourth failure (gen-0-30) is the node's last error, from its handler.
    let last = flaky.last_error.as_ref().expect("last error");
    assert_eq!(last.during, hearth::engine::runtime::Stage::Handle);
    assert_eq!(last.error, "injected fault on gen-0-30");
    let delivered = sink_lines(dir.path(), "out.jsonl").len();
    let letters = DeadLetterStore::read_all::<Message>(dir.path()).unwrap();
    // Delivered: ids 1..=29 minus 10 and 20 = 27. Every other message is a dead letter, so none is lost.
    assert_eq!(delivered, 27);
    assert_eq!(delivered + letters.len(), 100);
    assert!(
        letters
            .iter()
            .any(|l| l.error.contains("restart limit reached"))
    );
    assert_eq!(node(&r, "gen").state, NodeState::Finished);
    assert_eq!(node(&r, "sink").state, NodeState::Finished);
}

#[test]
fn shutdown_drains_every_mailbox() {
    let dir = tempfile::tempdir().unwrap();
    // An endless source; two slow stages with several workers keep mailboxes full when the stop comes.
    let g = graph(
        r#"Graph(name: "drain", nodes: [
            (id: "gen", kind: Generate(count: None)),
            (id: "a", kind: Throttle(delay_us: 200), workers: 3),
            (id: "b", kind: Throttle(delay_us: 300), workers: 2),
            (id: "sink", kind: JsonlSink(path: "out.jsonl")),
        ], edges: [
            (from: "gen.out", to: "a.in", capacity: 32),
            (from: "a.out", to: "b.in", capacity: 32),
            (from: "b.out", to: "sink.in", capacity: 32),
        ])"#,
    );
    let running = start(g, Some(dir.path())).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mid = running.status().snapshot();
    assert!(
        mid.edges.iter().any(|e| e.depth > 0),
        "mailboxes should hold messages when the stop arrives"
    );
    let r = running.shutdown();
    let generated = edge(&r, "gen.out->a.in").pushed;
    assert!(generated > 50);
    for e in &r.status.edges {
        assert_eq!(e.pushed, e.popped, "{} not drained", e.name);
        assert_eq!(e.dropped + e.undeliverable, 0);
    }
    assert_eq!(sink_lines(dir.path(), "out.jsonl").len() as u64, generated);
    assert!(
        r.status
            .nodes
            .iter()
            .all(|n| n.state == NodeState::Finished)
    );
}

const ORDER_AB: &str = r#"Graph(name: "ab", nodes: [
    (id: "gen", kind: Generate(count: 5)),
    (id: "first_stage", kind: Throttle()),
    (id: "second_stage", kind: Throttle()),
    (id: "sink", kind: JsonlSink(path: "out.jsonl")),
], edges: [
    (from: "gen.out", to: "first_stage.in", capacity: 4),
    (from: "first_stage.out", to: "second_stage.in", capacity: 4),
    (from: "second_stage.out", to: "sink.in", capacity: 4),
])"#;

#[test]
fn the_same_actors_in_two_graph_files_run_in_two_orders() {
    let order_ba = ORDER_AB
        .replace(
            "\"gen.out\", to: \"first_stage.in\"",
            "\"gen.out\", to: \"second_stage.in\"",
        )
        .replace(
            "\"first_stage.out\", to: \"second_stage.in\"",
            "\"second_stage.out\", to: \"first_stage.in\"",
        )
        .replace(
            "\"second_stage.out\", to: \"sink.in\"",
            "\"first_stage.out\", to: \"sink.in\"",
        );
    let mut orders = Vec::new();
    for src in [ORDER_AB.to_owned(), order_ba] {
        let dir = tempfile::tempdir().unwrap();
        run_to_end(&src, dir.path());
        let lines = sink_lines(dir.path(), "out.jsonl");
        assert_eq!(lines.len(), 5);
        let Message::Sample(s) = &lines[0] else {
            panic!("not a sample")
        };
        orders.push(
            s.provenance
                .steps
                .iter()
                .map(|s| s.node.clone())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(orders[0], ["first_stage", "second_stage"]);
    assert_eq!(orders[1], ["second_stage", "first_stage"]);
}

pub(crate) fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let code = text[9..12].parse().expect("status code");
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

#[test]
fn control_endpoints_report_health_status_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(
        graph(
            r#"Graph(name: "ctl", nodes: [
                (id: "gen", kind: Generate(count: None, interval_us: 100)),
                (id: "sink", kind: Blackhole()),
            ], edges: [ (from: "gen.out", to: "sink.in", capacity: 4) ])"#,
        ),
        Some(dir.path()),
    )
    .unwrap();
    let server = hearth::control::ControlServer::start("127.0.0.1:0", running.status()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let (code, body) = http_get(server.addr, "/healthz");
    assert_eq!((code, body.trim()), (200, "ok"));
    let (code, body) = http_get(server.addr, "/status");
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body).expect("status json");
    assert_eq!(status["graph"], "ctl");
    assert_eq!(status["nodes"][1]["id"], "sink");
    assert_eq!(status["nodes"][1]["state"], "Running");
    assert!(status["nodes"][1]["queue_depth"].is_u64());
    let (code, body) = http_get(server.addr, "/metrics");
    assert_eq!(code, 200);
    for needle in [
        "hearth_edge_pushed_total{edge=\"gen.out->sink.in\"}",
        "hearth_edge_popped_total{edge=\"gen.out->sink.in\"}",
        "hearth_node_processed_total{node=\"sink\"}",
        "hearth_node_handler_seconds_bucket{node=\"sink\"",
    ] {
        assert!(body.contains(needle), "/metrics lacks {needle}:\n{body}");
    }
    server.stop();
    running.shutdown();
}
