//! `hearth experiment`: one recorded stream replayed through graph variants, measured the same way each time.

use std::path::{Path, PathBuf};
use std::process::Command;

use hearth::experiment::{Experiment, ExperimentError, Results, RunOptions, output, run, stream};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BIN: &str = env!("CARGO_BIN_EXE_hearth");

fn graph(name: &str) -> String {
    format!("{ROOT}/graphs/{name}")
}

/// The shipped stream's first records: PII, secrets, guard categories and duplicate groups all occur in them.
fn stream_path() -> String {
    format!("{ROOT}/experiments/data/curation_stream.jsonl")
}

/// An experiment file over the shipped stream with `body` (seed, variants...) filled in.
fn experiment(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("exp.ron");
    let text = format!(
        "Experiment(\n    name: \"test\",\n    stream: (jsonl: \"{}\", limit: 400),\n{body}\n)\n",
        stream_path()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn run_file(path: &Path, out: &Path) -> Results {
    let exp = Experiment::load(path).unwrap();
    run(
        &exp,
        &RunOptions {
            out: out.to_path_buf(),
            progress: false,
        },
    )
    .unwrap()
}

fn variant<'a>(r: &'a Results, name: &'a str) -> &'a hearth::experiment::RunMetrics {
    r.of(name).next().unwrap()
}

#[test]
fn experiment_identical_variants_give_identical_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let path = experiment(
        dir.path(),
        &format!(
            "    seed: 3, shuffle: true,\n    variants: [(name: \"a\", graph: \"{g}\"), (name: \"b\", graph: \"{g}\")],",
            g = graph("curate.ron")
        ),
    );
    let r = run_file(&path, &dir.path().join("out"));
    let (a, b) = (variant(&r, "a"), variant(&r, "b"));
    assert_eq!(a.records, 400);
    assert!(a.admitted > 0 && a.decided > 0, "{a:?}");
    assert_eq!(a.unaccounted, 0);
    assert_eq!(a.counts(), b.counts());
    // Every curation node is timed, and every message it took is counted once.
    for n in &a.nodes {
        assert!(
            n.handled > 0 && n.p99_us >= n.p50_us && n.busy_ms > 0.0,
            "{n:?}"
        );
    }
    assert!(a.edges.iter().any(|e| e.high_water > 0));
}

#[test]
fn experiment_without_redaction_shows_its_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let path = experiment(
        dir.path(),
        &format!(
            "    variants: [
        (name: \"shipped\", graph: \"{g}\"),
        (name: \"no_redact\", graph: \"{g}\", order: [\"guard\", \"secret_filter\", \"dedup\"]),
        (name: \"no_secrets\", graph: \"{g}\", order: [\"dedup\"]),
        (name: \"loose_dedup\", graph: \"{g}\", set: {{\"dedup\": Dedup(threshold: 0.5, cluster_threshold: 0.5)}}),
    ],",
            g = graph("curate.ron")
        ),
    );
    let r = run_file(&path, &dir.path().join("out"));
    let shipped = variant(&r, "shipped");
    let no_redact = variant(&r, "no_redact");
    assert!(shipped.pii_spans > 0 && shipped.secret_spans > 0);
    assert!(
        no_redact.pii_span_leaks > shipped.pii_span_leaks,
        "{} vs {}",
        no_redact.pii_span_leaks,
        shipped.pii_span_leaks
    );
    assert!(no_redact.pii_record_leaks > 0);
    assert!(!no_redact.pii_leaks_by_type.is_empty());
    assert!(no_redact.nodes.iter().all(|n| n.id != "redact"));
    // Dedup alone keeps unsafe records and secrets out of nothing.
    let no_secrets = variant(&r, "no_secrets");
    assert!(no_secrets.secret_span_leaks > 0 && no_secrets.unsafe_leaks > shipped.unsafe_leaks);
    // A parameter override reaches the node: a lower threshold finds more near duplicates.
    let near = |m: &hearth::experiment::RunMetrics| {
        m.decisions
            .iter()
            .filter(|(k, _)| k.contains("near duplicate"))
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    assert!(near(variant(&r, "loose_dedup")) > near(shipped));
}

#[test]
fn experiment_one_seed_gives_the_same_numbers_twice() {
    let dir = tempfile::tempdir().unwrap();
    let body = |seed: u64| {
        format!(
            "    seed: {seed}, shuffle: true, repeats: 2,\n    variants: [(name: \"dedup_first\", graph: \"{}\", order: [\"dedup\", \"redact\", \"guard\", \"secret_filter\"])],",
            graph("curate.ron")
        )
    };
    let path = experiment(dir.path(), &body(11));
    let first = run_file(&path, &dir.path().join("one"));
    let second = run_file(&path, &dir.path().join("two"));
    assert_eq!(first.runs.len(), 2);
    let counts = |r: &Results| r.runs.iter().map(|m| m.counts()).collect::<Vec<_>>();
    assert_eq!(counts(&first), counts(&second));
    // Each repeat replays its own order, seeded `seed + repeat`.
    assert_eq!(
        first.runs.iter().map(|m| m.seed).collect::<Vec<_>>(),
        [11, 12]
    );
    assert_eq!(stream::order(5, false, 11), [0, 1, 2, 3, 4]);
    assert_ne!(stream::order(50, true, 11), stream::order(50, true, 12));
    assert_eq!(stream::order(50, true, 11), stream::order(50, true, 11));
    // The seed alone sets a run's order: seed 12's first repeat replays what seed 11's second did.
    let path = experiment(dir.path(), &body(12));
    let other = run_file(&path, &dir.path().join("three"));
    assert_eq!(other.runs[0].seed, 12);
    let without_repeat = |m: &hearth::experiment::RunMetrics| {
        let mut v = m.counts();
        v.as_object_mut().unwrap().remove("repeat");
        v
    };
    assert_eq!(
        without_repeat(&other.runs[0]),
        without_repeat(&first.runs[1])
    );
}

#[test]
fn experiment_input_and_sink_pick_the_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let path = experiment(
        dir.path(),
        &format!(
            "    sink: \"dedup\",\n    variants: [(name: \"a\", graph: \"{}\")],",
            graph("curate.ron")
        ),
    );
    let r = run_file(&path, &dir.path().join("out"));
    // At dedup, what arrives has passed redaction, guard and secrets: a sample in, nothing decided yet.
    let a = variant(&r, "a");
    assert_eq!(a.decided, 0);
    assert!(a.admitted > 0 && a.admitted < 400);

    let path = experiment(
        dir.path(),
        &format!(
            "    input: \"nowhere\",\n    variants: [(name: \"a\", graph: \"{}\")],",
            graph("curate.ron")
        ),
    );
    let exp = Experiment::load(&path).unwrap();
    let err = run(
        &exp,
        &RunOptions {
            out: dir.path().join("bad"),
            progress: false,
        },
    )
    .unwrap_err();
    assert!(
        matches!(&err, ExperimentError::Variant { field, variant, .. } if field == "input" && variant == "a"),
        "{err}"
    );
    assert!(err.to_string().contains("no node `nowhere`"), "{err}");
}

#[test]
fn experiment_bad_file_names_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.ron");
    std::fs::write(
        &path,
        "Experiment(\n    stream: (jsonl: \"s.jsonl\"),\n    repeat: 3,\n    variants: [],\n)\n",
    )
    .unwrap();
    let err = Experiment::load(&path).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{}:3:", path.display())),
        "{text}"
    );
    assert!(text.contains("repeat"), "{text}");

    // A semantic error names its field.
    std::fs::write(
        &path,
        "Experiment(\n    stream: (jsonl: \"s.jsonl\"),\n    repeats: 0,\n    variants: [],\n)\n",
    )
    .unwrap();
    let text = Experiment::load(&path).unwrap_err().to_string();
    assert!(text.contains("`repeats`"), "{text}");

    // A variant whose order names a missing node names the variant and the field.
    let path = experiment(
        dir.path(),
        &format!(
            "    variants: [(name: \"v\", graph: \"{}\", order: [\"redcat\"])],",
            graph("curate.ron")
        ),
    );
    let exp = Experiment::load(&path).unwrap();
    let opts = RunOptions {
        out: dir.path().join("out"),
        progress: false,
    };
    let text = run(&exp, &opts).unwrap_err().to_string();
    assert!(
        text.contains("variant `v`: `order`: no node `redcat`"),
        "{text}"
    );

    // A broken stream line is named by line and column.
    let bad_stream = dir.path().join("s.jsonl");
    std::fs::write(
        &bad_stream,
        "{\"id\": \"a\", \"prompt\": \"hi\"}\n{\"id\": 5}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("s.ron"),
        format!(
            "Experiment(stream: (jsonl: \"s.jsonl\"), variants: [(name: \"v\", graph: \"{}\")])",
            graph("curate.ron")
        ),
    )
    .unwrap();
    let exp = Experiment::load(&dir.path().join("s.ron")).unwrap();
    let text = run(&exp, &opts).unwrap_err().to_string();
    assert!(
        text.starts_with(&format!("{}:2:", bad_stream.display())),
        "{text}"
    );

    // The command exits 2 with the same place.
    let bad = dir.path().join("bad.ron");
    std::fs::write(
        &bad,
        "Experiment(\n  stream: (jsonl: \"s.jsonl\"),\n  variants: [(nam: \"v\")],\n)\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("experiment")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:3:", bad.display())),
        "{stderr}"
    );
}

#[test]
fn experiment_command_writes_tables_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let path = experiment(
        dir.path(),
        &format!(
            "    repeats: 2,\n    variants: [(name: \"shipped\", graph: \"{}\"), (name: \"guard_first\", graph: \"{}\")],",
            graph("curate.ron"),
            graph("curate_guard_first.ron")
        ),
    );
    let out_dir = dir.path().join("results");
    let out = Command::new(BIN)
        .arg("experiment")
        .arg(&path)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(out_dir.join("results.md")).unwrap();
    assert!(
        md.contains("| shipped |") && md.contains("| guard_first |"),
        "{md}"
    );
    let csv = std::fs::read_to_string(out_dir.join("runs.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 2 * 2);
    for svg in [
        "leaks.svg",
        "admitted.svg",
        "throughput.svg",
        "latency_p99.svg",
    ] {
        let text = std::fs::read_to_string(out_dir.join(svg)).unwrap();
        assert!(
            text.starts_with("<svg") && text.contains("guard_first"),
            "{svg}"
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("results.json")).unwrap())
            .unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 4);
    // Each run had a data directory of its own.
    assert!(out_dir.join("runs/shipped/r1").is_dir());
    assert!(out_dir.join("runs/guard_first/r0").is_dir());
    // The library writes the same set of files.
    let r = run_file(&path, &dir.path().join("lib"));
    let files = output::write(&r, &dir.path().join("lib")).unwrap();
    assert_eq!(files.len(), 11);
}
