//! The store: exactly one terminal curation state per captured item, idempotent replays, quarantine review,
//! purge and retention, and durability across `kill -9` at random moments.

use std::process::{Command, Stdio};
use std::time::Duration;

use hearth::message::{
    ChatMessage, Decision, Feedback, FeedbackKind, Interaction, Outcome, SampleContent,
};
use hearth::store::Store;

fn interaction(id: &str, user: &str) -> Interaction {
    Interaction {
        id: id.to_owned(),
        user: user.to_owned(),
        adapter: None,
        prompt: vec![ChatMessage {
            role: hearth::message::Role::User,
            content: format!("question {id}"),
        }],
        response: format!("answer {id}"),
        sampling: serde_json::json!({"temperature": 0.0}),
        created_at_unix_ms: 1,
        latency_ms: 2,
        commit: Default::default(),
    }
}

fn feedback(id: &str, response: &str, kind: FeedbackKind) -> Feedback {
    Feedback {
        id: id.to_owned(),
        response_id: response.to_owned(),
        user: "u".to_owned(),
        kind,
        created_at_unix_ms: 3,
        commit: Default::default(),
    }
}

#[test]
fn an_item_reaches_exactly_one_terminal_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path()).unwrap();
    let samples = store.capture_interaction(&interaction("i1", "u")).unwrap();
    assert_eq!(samples.len(), 1);
    assert!(
        store
            .capture_interaction(&interaction("i1", "u"))
            .unwrap()
            .is_empty(),
        "resent: not captured twice"
    );
    assert_eq!(
        store.pending_samples().unwrap(),
        samples,
        "pending until decided"
    );
    assert!(store.admit(&samples[0]).unwrap());
    assert!(
        !store.admit(&samples[0]).unwrap(),
        "a replayed admit changes nothing"
    );
    let decision = Decision {
        sample: samples[0].clone(),
        node: "guard".to_owned(),
        outcome: Outcome::Dropped,
        reason: "late".to_owned(),
    };
    assert!(
        !store.decide(&decision).unwrap(),
        "an admitted item cannot also be dropped"
    );
    let c = store.counts().unwrap();
    assert_eq!(
        (c.interactions, c.pending, c.admitted, c.dropped),
        (1, 0, 1, 0)
    );
    assert_eq!(store.training_set().unwrap().len(), 1);
    assert!(store.pending_samples().unwrap().is_empty());
    assert_eq!(store.integrity_check().unwrap(), "ok");
}

#[test]
fn feedback_becomes_grounded_preference_and_may_arrive_before_its_interaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path()).unwrap();
    let early = store
        .capture_feedback(&feedback(
            "f1",
            "i1",
            FeedbackKind::Edit {
                text: "better".to_owned(),
            },
        ))
        .unwrap();
    assert!(
        early.is_empty(),
        "no interaction yet: the feedback waits, durably"
    );
    let samples = store.capture_interaction(&interaction("i1", "u")).unwrap();
    assert_eq!(
        samples.len(),
        2,
        "the interaction's sample and the waiting feedback's"
    );
    match &samples[1].content {
        SampleContent::Preference {
            chosen, rejected, ..
        } => {
            assert_eq!(
                (chosen.as_str(), rejected.as_str()),
                ("better", "answer i1")
            );
        }
        other => panic!("edit must become a preference pair, got {other:?}"),
    }
    assert_eq!(samples[1].provenance.sources, ["i1", "f1"]);
    let thumbs = store
        .capture_feedback(&feedback("f2", "i1", FeedbackKind::Thumbs { up: false }))
        .unwrap();
    assert!(matches!(
        thumbs[0].content,
        SampleContent::Unpaired {
            desirable: false,
            ..
        }
    ));
    // A restart rebuilds exactly the pending samples.
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let pending: Vec<String> = store
        .pending_samples()
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(pending, ["f1", "i1", "f2"]);
}

#[test]
fn quarantine_release_and_purge() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path()).unwrap();
    for id in ["a", "b"] {
        let s = store
            .capture_interaction(&interaction(id, "u"))
            .unwrap()
            .remove(0);
        let d = Decision {
            sample: s,
            node: "guard".to_owned(),
            outcome: Outcome::Quarantined,
            reason: "guard: prompt: Controversial (PII)".to_owned(),
        };
        assert!(store.decide(&d).unwrap());
    }
    let listed = store.quarantine_list().unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].reason, "guard: prompt: Controversial (PII)");
    assert!(store.quarantine_release("a").unwrap());
    assert!(!store.quarantine_release("a").unwrap());
    assert_eq!(store.quarantine_purge(None).unwrap(), 1);
    let c = store.counts().unwrap();
    assert_eq!((c.admitted, c.dropped, c.quarantined), (1, 1, 0));
    let released = &store.training_set().unwrap()[0];
    assert_eq!(released.provenance.steps.last().unwrap().action, "released");
}

#[test]
fn purge_user_deletes_everywhere_and_retention_erases_raw_text() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path()).unwrap();
    for (id, user) in [("x1", "x"), ("x2", "x"), ("y1", "y")] {
        let s = store
            .capture_interaction(&interaction(id, user))
            .unwrap()
            .remove(0);
        store.admit(&s).unwrap();
    }
    let mut fx = feedback("fx", "x1", FeedbackKind::Accepted);
    fx.user = "x".to_owned();
    store.capture_feedback(&fx).unwrap();
    let purged = store.purge_user("x").unwrap();
    assert_eq!(
        (purged.interactions, purged.feedback, purged.training_set),
        (2, 1, 2)
    );
    let c = store.counts().unwrap();
    assert_eq!((c.interactions, c.admitted), (1, 1));
    // Not a trace of x left in the files: secure_delete zeroes freed pages and the WAL is truncated.
    let bytes = file_bytes(dir.path());
    assert!(
        !bytes.contains("answer x1") && !bytes.contains("question x2"),
        "purged text survives on disk"
    );
    assert!(bytes.contains("answer y1"));
    // Retention: y1 finished curation; with a zero retention its raw text goes, the training set stays.
    assert_eq!(store.apply_retention(Duration::ZERO).unwrap(), 1);
    let conn = rusqlite::Connection::open(dir.path().join(Store::FILE_NAME)).unwrap();
    let (prompt, response): (Option<String>, Option<String>) = conn
        .query_row(
            "SELECT prompt_json, response FROM interactions WHERE id = 'y1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (prompt, response),
        (None, None),
        "raw text survived retention"
    );
    assert_eq!(store.training_set().unwrap().len(), 1);
}

/// The database and WAL files' bytes, to check what text they still hold.
fn file_bytes(dir: &std::path::Path) -> String {
    let mut all = Vec::new();
    for name in ["hearth.sqlite", "hearth.sqlite-wal"] {
        all.extend(std::fs::read(dir.join(name)).unwrap_or_default());
    }
    String::from_utf8_lossy(&all).into_owned()
}

const CRASH_GRAPH: &str = r#"Graph(
    name: "crash",
    nodes: [
        (id: "simulate", kind: Simulate(rounds: 2000, interval_ms: 0)),
        (id: "capture", kind: Capture()),
        (id: "redact", kind: Redact(), workers: 2),
        (id: "secret_filter", kind: SecretFilter()),
        (id: "dedup", kind: Dedup()),
        (id: "store", kind: Store()),
    ],
    edges: [
        (from: "simulate.interactions", to: "capture.interactions", capacity: 16),
        (from: "simulate.feedback", to: "capture.feedback", capacity: 16),
        (from: "capture.out", to: "redact.in", capacity: 16),
        (from: "redact.out", to: "secret_filter.in", capacity: 16),
        (from: "secret_filter.out", to: "dedup.in", capacity: 16),
        (from: "dedup.out", to: "store.admitted", capacity: 16),
        (from: "secret_filter.decisions", to: "store.decisions", capacity: 16),
        (from: "dedup.decisions", to: "store.decisions", capacity: 16),
    ],
)"#;

#[test]
fn kill_9_at_random_moments_loses_nothing_and_counts_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let graph = dir.path().join("crash.ron");
    std::fs::write(&graph, CRASH_GRAPH).unwrap();
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_hearth"))
            .arg("run")
            .arg(&graph)
            .arg("--data-dir")
            .arg(dir.path())
            .env("RUST_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // A fixed pseudo-random schedule of kill delays (xorshift), so a failure reproduces.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut kills = 0;
    for _ in 0..8 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut child = run();
        std::thread::sleep(Duration::from_millis(150 + x % 900));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            kills += 1;
        }
        child.wait().unwrap();
    }
    // A last run to completion replays whatever was left pending.
    let status = run().wait().unwrap();
    assert!(status.success());
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.integrity_check().unwrap(), "ok");
    let c = store.counts().unwrap();
    let (interactions, feedback) = hearth::demo::events_per_round();
    assert_eq!(c.interactions, 2000 * interactions as u64, "{c:?}");
    assert_eq!(c.feedback, 2000 * feedback as u64, "{c:?}");
    assert_eq!(c.pending, 0, "{c:?}");
    assert_eq!(
        c.admitted + c.dropped + c.quarantined,
        c.interactions + c.feedback,
        "{c:?}"
    );
    assert_eq!(store.training_set().unwrap().len() as u64, c.admitted);
    eprintln!(
        "kill -9 runs: {kills}; items: {}; lost: 0; counted twice: 0",
        c.interactions + c.feedback
    );
    assert!(
        kills >= 4,
        "the schedule should kill most runs mid-flight (killed {kills})"
    );
}

#[test]
fn quarantine_and_purge_commands() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = Store::open(dir.path()).unwrap();
        let s = store
            .capture_interaction(&interaction("q1", "zoe"))
            .unwrap()
            .remove(0);
        let d = Decision {
            sample: s,
            node: "guard".to_owned(),
            outcome: Outcome::Quarantined,
            reason: "guard: prompt: Controversial (PII)".to_owned(),
        };
        store.decide(&d).unwrap();
    }
    let hearth = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(args)
            .arg("--data-dir")
            .arg(dir.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, text) = hearth(&["quarantine", "list"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("q1\tguard\tguard: prompt: Controversial (PII)"),
        "{text}"
    );
    let (code, text) = hearth(&["quarantine", "release", "nope"]);
    assert_eq!(code, Some(1));
    assert!(text.contains("no quarantined sample `nope`"), "{text}");
    let (code, _) = hearth(&["quarantine", "release", "q1"]);
    assert_eq!(code, Some(0));
    let (code, text) = hearth(&["purge", "--user", "zoe"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("\"interactions\":1") && text.contains("\"training_set\":1"),
        "{text}"
    );
    assert_eq!(
        Store::open(dir.path())
            .unwrap()
            .counts()
            .unwrap()
            .interactions,
        0
    );
}

#[test]
fn actors_opening_a_fresh_store_at_once_all_succeed() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let barrier = std::sync::Barrier::new(6);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        Store::open(dir.path()).map(|_| ())
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap().expect("concurrent open must not fail");
            }
        });
    }
}
