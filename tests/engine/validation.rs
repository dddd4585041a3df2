//! `hearth check`: every error is collected and names its place.

use hearth::engine::schema::GraphError;

fn errors(src: &str) -> Vec<GraphError> {
    match hearth::actors::ActorKind::graph(src) {
        Ok(g) => panic!("expected errors, graph was valid: {}", g.summary()),
        Err(e) => e,
    }
}

fn one_error_containing(errs: &[GraphError], needle: &str) -> GraphError {
    let found: Vec<&GraphError> = errs.iter().filter(|e| e.message.contains(needle)).collect();
    assert_eq!(
        found.len(),
        1,
        "want one error with {needle:?}, got {errs:#?}"
    );
    found[0].clone()
}

fn at(e: &GraphError) -> (usize, usize) {
    let l = e.at.expect("error has a location");
    (l.line, l.col)
}

const VALID: &str = r#"Graph(
    name: "ok",
    nodes: [
        (id: "gen", kind: Generate(count: 3)),
        (id: "a", kind: Throttle()),
        (id: "sink", kind: JsonlSink(path: "x.jsonl")),
    ],
    edges: [
        (from: "gen.out", to: "a.in", capacity: 4),
        (from: "a.out", to: "sink.in", capacity: 4, when_full: DropOldest),
    ],
)"#;

#[test]
fn valid_graph_has_summary() {
    let g = hearth::actors::ActorKind::graph(VALID).expect("valid");
    assert_eq!(
        g.summary(),
        "graph `ok` is valid: 3 nodes (3 workers, 1 sources), 2 edges (0 feedback)"
    );
    let order: Vec<&str> = g
        .topo_order
        .iter()
        .map(|&i| g.plan.nodes[i].id.as_str())
        .collect();
    assert_eq!(order, ["gen", "a", "sink"]);
}

#[test]
fn syntax_error_has_line_and_column() {
    let src = "Graph(\n  name: \"x\",\n  nodes: [ (id: \"a\" kind: Throttle()) ],\n  edges: [],\n)";
    let errs = errors(src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    // The missing comma is detected where `kind` starts: line 3, column 21.
    assert_eq!(at(&errs[0]), (3, 21), "{errs:#?}");
}

#[test]
fn unknown_kind_lists_known_kinds() {
    let src = VALID.replace("Throttle()", "Teleport(speed: 3)");
    let e = one_error_containing(&errors(&src), "Teleport");
    assert_eq!(at(&e), (5, 25));
    assert!(e.message.contains("node `a`"), "{}", e.message);
    for known in [
        "Generate",
        "Throttle",
        "FaultInject",
        "JsonlSink",
        "Blackhole",
    ] {
        assert!(e.message.contains(known), "{} lacks {known}", e.message);
    }
}

#[test]
fn unknown_missing_and_ill_typed_parameters_are_all_reported() {
    let src = VALID
        .replace("Throttle()", "Throttle(delya_us: 3)")
        .replace("JsonlSink(path: \"x.jsonl\")", "JsonlSink()")
        .replace("Generate(count: 3)", "Generate(count: \"three\")");
    let errs = errors(&src);
    assert_eq!(errs.len(), 3, "{errs:#?}");
    let unknown = one_error_containing(&errs, "delya_us");
    assert!(
        unknown.message.contains("expected `delay_us`"),
        "{}",
        unknown.message
    );
    assert_eq!(at(&unknown).0, 5);
    let missing = one_error_containing(&errs, "missing field named `path`");
    assert_eq!(at(&missing).0, 6);
    let typed = one_error_containing(&errs, "node `gen`");
    // ron points just after `count:`, where the integer should start.
    assert_eq!(at(&typed), (4, 42), "{typed:?}");
}

#[test]
fn duplicate_ids_name_both_places() {
    let src = VALID.replace("(id: \"a\"", "(id: \"gen\"");
    let e = one_error_containing(&errors(&src), "duplicate node id `gen`");
    assert_eq!(at(&e), (5, 9));
    assert!(e.message.contains("first at 4:9"), "{}", e.message);
}

#[test]
fn edges_to_unknown_nodes_and_ports() {
    let src = VALID
        .replace("to: \"a.in\"", "to: \"b.in\"")
        .replace("from: \"a.out\"", "from: \"a.output\"");
    let errs = errors(&src);
    let node = one_error_containing(&errs, "unknown node `b`");
    assert_eq!(at(&node), (9, 9));
    assert!(
        node.message.contains("nodes: a, gen, sink"),
        "{}",
        node.message
    );
    let port = one_error_containing(&errs, "no output port `output`");
    assert_eq!(at(&port), (10, 9));
    assert!(
        port.message.contains("output ports: out"),
        "{}",
        port.message
    );
}

#[test]
fn message_type_mismatch_names_both_ends() {
    let src = VALID.replace("to: \"sink.in\"", "to: \"sink.decisions\"");
    let errs = errors(&src);
    let e = one_error_containing(&errs, "mismatch");
    assert!(
        e.message
            .contains("a.out emits Sample, sink.decisions expects Decision"),
        "{}",
        e.message
    );
    assert_eq!(at(&e), (10, 9));
}

#[test]
fn an_input_nothing_feeds_is_reported_at_its_node() {
    let src = VALID.replace(
        "        (from: \"gen.out\", to: \"a.in\", capacity: 4),\n",
        "",
    );
    let unfed = one_error_containing(&errors(&src), "`a.in` (Sample) is fed by no edge");
    assert_eq!(at(&unfed), (5, 9));
}

#[test]
fn unmarked_cycle_prints_its_path_and_feedback_allows_it() {
    let src = VALID.replace(
        "edges: [",
        "edges: [\n        (from: \"a.out\", to: \"a.in\", capacity: 2),",
    );
    let e = one_error_containing(&errors(&src), "cycle");
    assert!(e.message.ends_with("a -> a"), "{}", e.message);

    let three = r#"Graph(name: "c", nodes: [
        (id: "gen", kind: Generate()),
        (id: "x", kind: Throttle()), (id: "y", kind: Throttle()), (id: "z", kind: Throttle()),
    ], edges: [
        (from: "gen.out", to: "x.in", capacity: 1),
        (from: "x.out", to: "y.in", capacity: 1),
        (from: "y.out", to: "z.in", capacity: 1),
        (from: "z.out", to: "x.in", capacity: 1),
    ])"#;
    let e = one_error_containing(&errors(three), "cycle not marked `feedback: true`");
    assert!(e.message.ends_with("x -> y -> z -> x"), "{}", e.message);
    let marked = three.replace(
        "(from: \"z.out\", to: \"x.in\", capacity: 1)",
        "(from: \"z.out\", to: \"x.in\", capacity: 1, feedback: true)",
    );
    let g = hearth::actors::ActorKind::graph(&marked).expect("a feedback cycle is allowed");
    assert!(g.summary().ends_with("(1 feedback)"), "{}", g.summary());
}

#[test]
fn zero_capacity_and_zero_workers() {
    let src = VALID.replace("capacity: 4)", "capacity: 0)").replace(
        "(id: \"a\", kind: Throttle())",
        "(id: \"a\", kind: Throttle(), workers: 0)",
    );
    let errs = errors(&src);
    let cap = one_error_containing(&errs, "capacity must be at least 1");
    assert_eq!(at(&cap), (9, 9));
    let workers = one_error_containing(&errs, "workers must be at least 1");
    assert_eq!(at(&workers), (5, 9));
}

#[test]
fn many_errors_are_reported_together_in_file_order() {
    let src = r#"Graph(name: "bad", nodes: [
        (id: "gen", kind: Generate()),
        (id: "gen", kind: Throttle()),
        (id: "w", kind: Wormhole()),
        (id: "b", kind: Blackhole(), workers: 0),
    ], edges: [
        (from: "gen.out", to: "b.in", capacity: 0),
        (from: "gen.out", to: "w.in", capacity: 1),
        (from: "gen.out", to: "nope.in", capacity: 1),
    ])"#;
    let errs = errors(src);
    let lines: Vec<usize> = errs.iter().map(|e| at(e).0).collect();
    assert_eq!(lines, [3, 4, 5, 7, 9], "{errs:#?}");
}

#[test]
fn shipped_graphs_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).expect("graphs/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "ron") {
            let src = std::fs::read_to_string(&path).expect("read");
            if let Err(errs) = hearth::actors::ActorKind::graph(&src) {
                panic!("{}: {errs:#?}", path.display());
            }
            n += 1;
        }
    }
    assert!(n >= 1);
}

#[test]
fn every_kind_example_round_trips_and_builds() {
    use hearth::actors::ActorKind;
    use hearth::engine::BuildContext;
    let dir = tempfile::tempdir().expect("tempdir");
    for kind in ActorKind::examples() {
        let text = kind.to_ron();
        let src = format!("Graph(name: \"one\", nodes: [(id: \"n\", kind: {text})], edges: [])");
        let (file, errs) =
            hearth::engine::schema::GraphFile::<ActorKind>::parse(&src).expect("parses");
        assert!(errs.is_empty(), "{text}: {errs:?}");
        let factory = file.nodes[0].value.kind.factory();
        assert_eq!(factory.info().name, kind.info().name);
        let ctx = BuildContext::new("n", 0, dir.path());
        assert!(factory.build(&ctx).is_ok(), "{text} does not build");
    }
}

#[test]
fn the_documented_graph_example_is_valid() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/graphs.md")).unwrap();
    let start = readme
        .find("```ron\n")
        .expect("docs/graphs.md has a ron example")
        + "```ron\n".len();
    let end = start + readme[start..].find("```").unwrap();
    if let Err(e) = hearth::actors::ActorKind::graph(&readme[start..end]) {
        panic!("docs/graphs.md example: {e:#?}");
    }
}
