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

/// A data directory with captured interactions and feedback, as `hearth serve` would leave it.
fn captured_store(dir: &Path) {
    use hearth::message::{ChatMessage, Feedback, FeedbackKind, Interaction, Role};
    let mut store = hearth::store::Store::open(dir).unwrap();
    let turns = [
        (
            "i1",
            "My email is jane.doe@example.org, remind me of the dentist.",
            "Noted.",
        ),
        ("i2", "Suggest a name for a grey cat.", "How about Miso?"),
        ("i3", "Suggest a name for a grey cat.", "How about Miso?"),
        (
            "i4",
            "Summarise the plot of Hamlet in one line.",
            "A prince avenges his father.",
        ),
    ];
    for (n, (id, prompt, response)) in turns.iter().enumerate() {
        store
            .capture_interaction(&Interaction {
                id: (*id).into(),
                user: "alice".into(),
                adapter: None,
                prompt: vec![ChatMessage::new(Role::User, *prompt)],
                response: (*response).into(),
                sampling: serde_json::json!({"temperature": 0.7}),
                created_at_unix_ms: 1_000 + n as u64,
                latency_ms: 5,
                commit: Default::default(),
            })
            .unwrap();
    }
    let feedback = [
        (
            "f1",
            "i1",
            FeedbackKind::Edit {
                text: "Noted: dentist on Friday.".into(),
            },
        ),
        ("f2", "i4", FeedbackKind::Thumbs { up: true }),
        // On a response the store never captured: no sample to replay.
        ("f3", "missing", FeedbackKind::Accepted),
    ];
    for (n, (id, response_id, kind)) in feedback.into_iter().enumerate() {
        store
            .capture_feedback(&Feedback {
                id: id.into(),
                response_id: response_id.into(),
                user: "alice".into(),
                kind,
                created_at_unix_ms: 2_000 + n as u64,
                commit: Default::default(),
            })
            .unwrap();
    }
}

fn listing(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn experiment_replays_a_store_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    captured_store(&data);
    let before = listing(&data);
    let body = |limit: &str| {
        format!(
            "Experiment(\n    stream: (store: \"data\"{limit}),\n    variants: [(name: \"shipped\", graph: \"{}\")],\n)\n",
            graph("curate.ron")
        )
    };
    let path = dir.path().join("store.ron");
    std::fs::write(&path, body("")).unwrap();
    let r = run_file(&path, &dir.path().join("out"));
    let m = variant(&r, "shipped");
    // Four interactions and the two pieces of feedback whose interaction was captured.
    assert_eq!(m.records, 6);
    assert_eq!(m.unaccounted, 0);
    assert!(m.admitted > 0 && m.decided > 0, "{m:?}");
    assert!(
        m.decisions.keys().any(|k| k.starts_with("dedup | ")),
        "the repeated interaction is a duplicate: {:?}",
        m.decisions
    );
    assert!(r.stream.ends_with("data"), "{}", r.stream);
    // Nothing in the user's data directory changed, and nothing was added beside the store.
    assert_eq!(listing(&data), before);
    assert!(dir.path().join("out/runs/shipped/r0").is_dir());

    // With a hearth still holding the store open, what it captured sits in the write-ahead log; the replay
    // reads through it.
    {
        use hearth::message::{ChatMessage, Interaction, Role};
        let mut live = hearth::store::Store::open(&data).unwrap();
        live.capture_interaction(&Interaction {
            id: "i5".into(),
            user: "alice".into(),
            adapter: None,
            prompt: vec![ChatMessage::new(Role::User, "Which planet is largest?")],
            response: "Jupiter.".into(),
            sampling: serde_json::json!({}),
            created_at_unix_ms: 3_000,
            latency_ms: 5,
            commit: Default::default(),
        })
        .unwrap();
        assert!(data.join("hearth.sqlite-wal").exists());
        let r = run_file(&path, &dir.path().join("live"));
        assert_eq!(variant(&r, "shipped").records, 7);
    }

    // `limit` takes the first records in capture order.
    std::fs::write(&path, body(", limit: 2")).unwrap();
    let r = run_file(&path, &dir.path().join("out2"));
    assert_eq!(variant(&r, "shipped").records, 2);

    // A directory without a store, or a stream naming both sources, is refused with its place.
    std::fs::write(
        &path,
        body("").replace("store: \"data\"", "store: \"elsewhere\""),
    )
    .unwrap();
    let exp = Experiment::load(&path).unwrap();
    let opts = RunOptions {
        out: dir.path().join("bad"),
        progress: false,
    };
    let text = run(&exp, &opts).unwrap_err().to_string();
    assert!(
        text.contains("elsewhere") && text.contains("hearth.sqlite"),
        "{text}"
    );
    std::fs::write(
        &path,
        body("").replace("store: \"data\"", "store: \"data\", jsonl: \"s.jsonl\""),
    )
    .unwrap();
    let text = Experiment::load(&path).unwrap_err().to_string();
    assert!(text.contains("`stream`"), "{text}");
}

#[test]
fn experiment_name_repeats_and_limit_reach_the_results() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, limit: usize, repeats: usize| {
        let path = dir.path().join(format!("{name}.ron"));
        std::fs::write(
            &path,
            format!(
                "Experiment(\n    name: \"{name}\",\n    stream: (jsonl: \"{}\", limit: {limit}),\n    repeats: {repeats},\n    variants: [(name: \"a\", graph: \"{}\")],\n)\n",
                stream_path(),
                graph("curate.ron")
            ),
        )
        .unwrap();
        path
    };
    let one = run_file(&write("first", 60, 1), &dir.path().join("one"));
    let two = run_file(&write("second", 90, 3), &dir.path().join("two"));
    assert_eq!((one.name.as_str(), two.name.as_str()), ("first", "second"));
    let md = output::markdown(&one, &output::summarize(&one));
    assert!(md.starts_with("## first\n"), "{md}");
    assert_eq!((one.records, two.records), (60, 90));
    assert_eq!(one.runs.len(), 1);
    assert_eq!(two.runs.len(), 3);
    assert_eq!(
        two.runs.iter().map(|m| m.repeat).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert!(dir.path().join("two/runs/a/r2").is_dir());
}

#[test]
fn experiment_shuffle_and_seed_change_the_replay_order() {
    let dir = tempfile::tempdir().unwrap();
    let run_with = |tag: &str, opts: &str| {
        let path = experiment(
            dir.path(),
            &format!(
                "    {opts}\n    variants: [(name: \"a\", graph: \"{}\")],",
                graph("curate.ron")
            ),
        );
        run_file(&path, &dir.path().join(tag)).runs[0].clone()
    };
    let file_order = run_with("f1", "seed: 1, shuffle: false,");
    // Without `shuffle` the seed is not used: file order every time.
    let file_order_again = run_with("f2", "seed: 2, shuffle: false,");
    assert_eq!(file_order.admitted_digest, file_order_again.admitted_digest);
    let shuffled = run_with("s1", "seed: 1, shuffle: true,");
    let reseeded = run_with("s2", "seed: 2, shuffle: true,");
    assert_ne!(shuffled.admitted_digest, file_order.admitted_digest);
    assert_ne!(shuffled.admitted_digest, reseeded.admitted_digest);
    assert_eq!(
        run_with("s3", "seed: 2, shuffle: true,").admitted_digest,
        reseeded.admitted_digest
    );
}

#[test]
fn experiment_input_node_is_replaced_by_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let run_with = |tag: &str, input: &str| {
        let path = experiment(
            dir.path(),
            &format!(
                "    input: \"{input}\",\n    variants: [(name: \"a\", graph: \"{}\")],",
                graph("curate.ron")
            ),
        );
        run_file(&path, &dir.path().join(tag)).runs[0].clone()
    };
    let at_capture = run_with("capture", "capture");
    // Standing in for `redact`, the stream skips redaction: its spans reach the sink.
    let at_redact = run_with("redact", "redact");
    assert!(at_capture.nodes.iter().any(|n| n.id == "redact"));
    assert!(
        at_redact
            .nodes
            .iter()
            .all(|n| n.id != "redact" && n.id != "capture")
    );
    assert!(
        at_redact.pii_span_leaks > at_capture.pii_span_leaks,
        "{} vs {}",
        at_redact.pii_span_leaks,
        at_capture.pii_span_leaks
    );
}

#[test]
fn experiment_downstream_trains_and_gates_one_delta_per_variant() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _, _) = crate::train_util::tiny(dir.path());
    // A tiny model and a few steps: this checks the wiring, not what a real delta learns.
    let run_with = |tag: &str, steps: usize, min_gain: f64| {
        let path = experiment(
            dir.path(),
            &format!(
                "    downstream: (
        model: \"{}\",
        train: (steps: {steps}, batch_size: 2, max_seq_len: 48, warmup_steps: 0),
        gate: (min_personal_gain: {min_gain}, general_probes: 2, general_max_tokens: 4, max_new_tokens: 4,
               max_personal_probes: 4),
    ),
    variants: [
        (name: \"shipped\", graph: \"{g}\"),
        (name: \"no_redact\", graph: \"{g}\", order: [\"guard\", \"secret_filter\", \"dedup\"]),
    ],",
                model.display(),
                g = graph("curate.ron")
            ),
        );
        let out = dir.path().join(tag);
        let r = run_file(&path, &out);
        (r, out)
    };
    let (r, out) = run_with("a", 2, -1000.0);
    assert_eq!(r.downstream.len(), 2);
    for (d, name) in r.downstream.iter().zip(["shipped", "no_redact"]) {
        assert_eq!(d.variant, name);
        // Trained on what this variant admitted in its first repeat.
        assert_eq!(d.samples as u64, variant(&r, name).admitted);
        assert_eq!(d.steps, 2);
        assert!(d.held_out > 0 && d.last_loss.is_some(), "{d:?}");
        assert!(Path::new(&d.delta).starts_with(out.join("runs").join(name).join("r0")));
        assert!(Path::new(&d.delta).join("provenance.json").is_file());
        let legs: Vec<&str> = d.legs.iter().map(|l| l.leg.as_str()).collect();
        assert!(
            legs.contains(&"personalisation") && legs.contains(&"base_perplexity"),
            "{legs:?}"
        );
        let personal = d.legs.iter().find(|l| l.leg == "personalisation").unwrap();
        assert!(personal.passed, "{personal:?}");
    }
    // Different admitted sets train different deltas.
    assert_ne!(r.downstream[0].delta, r.downstream[1].delta);
    let files = output::write(&r, &out).unwrap();
    assert!(files.iter().any(|f| f.ends_with("downstream.csv")));
    let md = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(
        md.contains("### Downstream") && md.contains("| no_redact | personalisation |"),
        "{md}"
    );

    // The recipe and the gate's settings are read: more steps, and a gain no delta reaches.
    let (r, _) = run_with("b", 3, 1000.0);
    for d in &r.downstream {
        assert_eq!(d.steps, 3);
        let personal = d.legs.iter().find(|l| l.leg == "personalisation").unwrap();
        assert!(!personal.passed && !d.passed, "{d:?}");
    }

    // A recipe the trainer would refuse is refused when the file is read, naming the field.
    let path = experiment(
        dir.path(),
        &format!(
            "    downstream: (model: \"m.gguf\", train: (holdout_fraction: 1.5)),\n    variants: [(name: \"a\", graph: \"{}\")],",
            graph("curate.ron")
        ),
    );
    let text = Experiment::load(&path).unwrap_err().to_string();
    assert!(
        text.contains("`downstream.train`") && text.contains("holdout_fraction"),
        "{text}"
    );
}

#[test]
fn experiment_params_set_one_parameter_and_keep_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = experiment(
        dir.path(),
        &format!(
            "    variants: [
        (name: \"shipped\", graph: \"{g}\"),
        (name: \"loose\", graph: \"{g}\", params: {{\"dedup.threshold\": 0.5, \"dedup.cluster_threshold\": 0.5}}),
        (name: \"strict_guard\", graph: \"{g}\", params: {{\"guard.policy.controversial\": \"Drop\"}}),
    ],",
            g = graph("curate.ron")
        ),
    );
    let r = run_file(&path, &dir.path().join("out"));
    let reason = |m: &hearth::experiment::RunMetrics, what: &str| {
        m.decisions
            .iter()
            .filter(|(k, _)| k.contains(what))
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    let shipped = variant(&r, "shipped");
    assert!(reason(variant(&r, "loose"), "near duplicate") > reason(shipped, "near duplicate"));
    // The guard's other settings stay as the graph has them; only controversial prompts move from
    // quarantine to drop.
    let strict = variant(&r, "strict_guard");
    assert!(
        reason(shipped, "guard | quarantined") > 0,
        "{:?}",
        shipped.decisions
    );
    assert_eq!(
        reason(strict, "guard | quarantined"),
        0,
        "{:?}",
        strict.decisions
    );
    assert_eq!(strict.admitted, shipped.admitted);

    for (params, says) in [
        ("\"dedup.thresold\": 0.5", "thresold"),
        ("\"dedupe.threshold\": 0.5", "no node `dedupe`"),
        ("\"dedup\": 0.5", "name a parameter"),
    ] {
        let path = experiment(
            dir.path(),
            &format!(
                "    variants: [(name: \"v\", graph: \"{}\", params: {{{params}}})],",
                graph("curate.ron")
            ),
        );
        let exp = Experiment::load(&path).unwrap();
        let opts = RunOptions {
            out: dir.path().join("bad"),
            progress: false,
        };
        let text = run(&exp, &opts).unwrap_err().to_string();
        assert!(
            text.contains("variant `v`: `params`") && text.contains(says),
            "{text}"
        );
    }
}
