//! Live rewiring of a running graph: curation reordered under load loses and repeats nothing; added, removed
//! and changed nodes keep every message; a graph that fails validation or a node that fails to start leaves
//! the running graph as it was.

use std::path::Path;
use std::time::{Duration, Instant};

use hearth::actors::ActorKind;
use hearth::demo::events_per_round;
use hearth::engine::{ReloadError, start};
use hearth::store::Store;

fn shipped(file: &str, rounds: usize) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("graphs")
        .join(file);
    let src = std::fs::read_to_string(path).unwrap();
    let line = "Simulate(rounds: 50, interval_ms: 20)";
    assert!(src.contains(line), "{file}: the simulate line changed");
    src.replace(line, &format!("Simulate(rounds: {rounds}, interval_ms: 1)"))
}

/// Items captured so far (the store is read while the graph writes it).
fn captured(dir: &Path) -> u64 {
    Store::open(dir)
        .and_then(|s| s.counts())
        .map(|c| c.interactions + c.feedback)
        .unwrap_or(0)
}

fn wait_until(what: &str, secs: u64, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn reordering_curation_under_load_loses_and_repeats_nothing() {
    const ROUNDS: usize = 40;
    let (interactions, feedback) = events_per_round();
    let total = (ROUNDS * (interactions + feedback)) as u64;
    let dir = tempfile::tempdir().unwrap();
    let graph = ActorKind::graph(&shipped("curate.ron", ROUNDS)).unwrap();
    let running = start(graph, Some(dir.path())).unwrap();
    let orders = [
        "curate_secrets_first.ron",
        "curate_guard_first.ron",
        "curate.ron",
    ];
    for (k, file) in orders.iter().enumerate() {
        let at = total * (k as u64 + 1) / (orders.len() as u64 + 1);
        wait_until("items to be captured", 60, || captured(dir.path()) >= at);
        let new = ActorKind::graph(&shipped(file, ROUNDS)).unwrap();
        let summary = running.reload(new).unwrap();
        assert!(summary.nodes_added.is_empty(), "{summary}");
        assert!(summary.nodes_removed.is_empty(), "{summary}");
        assert!(summary.nodes_changed.is_empty(), "{summary}");
        assert!(!summary.edges_added.is_empty(), "{summary}");
        assert!(!summary.edges_removed.is_empty(), "{summary}");
        assert_eq!(running.status().snapshot().graph, summary.graph);
    }
    let during = captured(dir.path());
    assert!(during < total, "the load ended before the last reload");
    let report = running.wait();
    assert!(report.failed_nodes.is_empty(), "{:?}", report.failed_nodes);
    let store = Store::open(dir.path()).unwrap();
    let c = store.counts().unwrap();
    assert_eq!(c.interactions + c.feedback, total, "{c:?}");
    assert_eq!(c.pending, 0, "an item never left curation: {c:?}");
    assert_eq!(
        c.admitted + c.dropped + c.quarantined,
        total,
        "count in != count out: {c:?}"
    );
    // Items went through both orders: the redactor first labels the pasted key <API_KEY>, the secret filter
    // first labels it by provider rule.
    let text = serde_json::to_string(&store.training_set().unwrap()).unwrap()
        + &serde_json::to_string(&store.quarantine_list().unwrap()).unwrap();
    assert!(text.contains("<API_KEY>"), "redact-first order never ran");
    assert!(
        text.contains("<SECRET:github-pat>"),
        "secrets-first order never ran"
    );
}

/// A source, a pass-through stage and a sink, in RON; `stage` and `sinks` are spliced in.
fn pipeline(count: u64, nodes: &str, edges: &str) -> String {
    format!(
        r#"Graph(
    name: "p",
    settings: (data_dir: "unused"),
    nodes: [
        (id: "gen", kind: Generate(count: Some({count}), interval_us: 200, prompts: ["a", "b", "c"], user: "u")),
        {nodes}
    ],
    edges: [
        {edges}
    ],
)"#
    )
}

fn lines(dir: &Path, file: &str) -> usize {
    std::fs::read_to_string(dir.join(file))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[test]
fn added_removed_and_changed_nodes_keep_every_message() {
    const COUNT: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let one = pipeline(
        COUNT,
        r#"(id: "stage", kind: FaultInject()),
        (id: "sink", kind: JsonlSink(path: "a.jsonl")),"#,
        r#"(from: "gen.out", to: "stage.in", capacity: 8),
        (from: "stage.out", to: "sink.in", capacity: 8),"#,
    );
    let running = start(ActorKind::graph(&one).unwrap(), Some(dir.path())).unwrap();
    wait_until("the first messages", 30, || {
        lines(dir.path(), "a.jsonl") > 100
    });

    // A stage added in the middle; the first stage and the sink changed (the sink writes another file), so
    // the first stage's new workers take over its queued input.
    let two = pipeline(
        COUNT,
        r#"(id: "stage", kind: FaultInject(fail_ids_ending: ["-never"])),
        (id: "extra", kind: FaultInject(), workers: 2),
        (id: "sink", kind: JsonlSink(path: "b.jsonl")),"#,
        r#"(from: "gen.out", to: "stage.in", capacity: 8),
        (from: "stage.out", to: "extra.in", capacity: 8),
        (from: "extra.out", to: "sink.in", capacity: 8),"#,
    );
    let summary = running.reload(ActorKind::graph(&two).unwrap()).unwrap();
    assert_eq!(summary.nodes_added, ["extra"], "{summary}");
    assert_eq!(summary.nodes_changed, ["stage", "sink"], "{summary}");
    assert_eq!(summary.edges_removed, ["stage.out->sink.in"], "{summary}");
    wait_until("messages in the new file", 30, || {
        lines(dir.path(), "b.jsonl") > 100
    });

    // The middle stage removed again: the edges around it are replaced, what it holds drains on.
    let three = pipeline(
        COUNT,
        r#"(id: "stage", kind: FaultInject(fail_ids_ending: ["-never"])),
        (id: "sink", kind: JsonlSink(path: "b.jsonl")),"#,
        r#"(from: "gen.out", to: "stage.in", capacity: 8),
        (from: "stage.out", to: "sink.in", capacity: 8),"#,
    );
    let summary = running.reload(ActorKind::graph(&three).unwrap()).unwrap();
    assert_eq!(summary.nodes_removed, ["extra"], "{summary}");
    assert!(summary.nodes_changed.is_empty(), "{summary}");
    let names: Vec<String> = running
        .status()
        .snapshot()
        .nodes
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(names, ["gen", "stage", "sink"]);
    let report = running.wait();
    assert!(report.failed_nodes.is_empty(), "{:?}", report.failed_nodes);
    let (a, b) = (lines(dir.path(), "a.jsonl"), lines(dir.path(), "b.jsonl"));
    assert!(a > 0 && b > 0, "a {a}, b {b}");
    assert_eq!(a + b, COUNT as usize, "a {a} + b {b} != {COUNT}");
    let mut ids = std::collections::HashSet::new();
    for file in ["a.jsonl", "b.jsonl"] {
        for line in std::fs::read_to_string(dir.path().join(file))
            .unwrap()
            .lines()
        {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let id = v.pointer("/Sample/id").or_else(|| v.get("id")).cloned();
            assert!(
                ids.insert(id.unwrap_or_default().to_string()),
                "twice: {line}"
            );
        }
    }
}

#[test]
fn a_node_that_fails_to_start_or_build_leaves_the_running_graph_as_it_was() {
    const COUNT: u64 = 2000;
    let dir = tempfile::tempdir().unwrap();
    let nodes = r#"(id: "stage", kind: FaultInject()),
        (id: "sink", kind: JsonlSink(path: "out.jsonl")),"#;
    let edges = r#"(from: "gen.out", to: "stage.in", capacity: 8),
        (from: "stage.out", to: "sink.in", capacity: 8),"#;
    let running = start(
        ActorKind::graph(&pipeline(COUNT, nodes, edges)).unwrap(),
        Some(dir.path()),
    )
    .unwrap();
    wait_until("the first messages", 30, || {
        lines(dir.path(), "out.jsonl") > 50
    });

    // The stage changed into one that cannot start: its old workers are back on their channels.
    let broken = nodes.replace("FaultInject()", "FaultInject(fail_start: true)");
    let err = running
        .reload(ActorKind::graph(&pipeline(COUNT, &broken, edges)).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, ReloadError::Start { node, error } if node == "stage" && error.contains("injected fault at start")),
        "{err}"
    );
    // A new node whose file cannot be opened fails to build: refused before anything is touched.
    let blocked = dir.path().join("blocked");
    std::fs::write(&blocked, "a file where a directory is needed").unwrap();
    let unbuildable = format!(
        r#"{nodes}
        (id: "tap", kind: JsonlSink(path: "blocked/x.jsonl")),"#
    );
    let tapped = format!(r#"{edges} (from: "stage.out", to: "tap.in", capacity: 8),"#);
    let err = running
        .reload(ActorKind::graph(&pipeline(COUNT, &unbuildable, &tapped)).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, ReloadError::Build { node, .. } if node == "tap"),
        "{err}"
    );
    // A graph that does not validate never reaches the running one.
    let invalid = pipeline(
        COUNT,
        nodes,
        r#"(from: "gen.out", to: "nowhere.in", capacity: 8),"#,
    );
    let Err(errors) = ActorKind::graph(&invalid) else {
        panic!("a graph with an unknown node validated");
    };
    assert!(
        errors
            .iter()
            .any(|e| e.message.contains("unknown node `nowhere`")),
        "{errors:?}"
    );
    // A setting that cannot change while running is refused.
    let moved =
        pipeline(COUNT, nodes, edges).replace("data_dir: \"unused\"", "data_dir: \"elsewhere\"");
    let err = running
        .reload(ActorKind::graph(&moved).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            ReloadError::Settings {
                field: "data_dir",
                ..
            }
        ),
        "{err}"
    );
    let rotated = pipeline(COUNT, nodes, edges).replace(
        "data_dir: \"unused\"",
        "data_dir: \"unused\", dead_letters: (max_bytes: 1024, keep: 1)",
    );
    let err = running
        .reload(ActorKind::graph(&rotated).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            ReloadError::Settings {
                field: "dead_letters",
                ..
            }
        ),
        "{err}"
    );

    let snapshot = running.status().snapshot();
    assert_eq!(snapshot.nodes.len(), 3);
    let report = running.wait();
    assert!(report.failed_nodes.is_empty(), "{:?}", report.failed_nodes);
    assert_eq!(lines(dir.path(), "out.jsonl"), COUNT as usize);
}
