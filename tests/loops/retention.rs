//! Retention on a timer: capture erases raw text every `sweep_every_secs` even when nothing arrives.

use std::time::Duration;

use hearth::message::{ChatMessage, Interaction};
use hearth::store::Store;

/// Whether the raw text of interaction `id` is still stored.
fn raw_text_kept(data: &std::path::Path, id: &str) -> bool {
    let conn = rusqlite::Connection::open(data.join(Store::FILE_NAME)).unwrap();
    let response: Option<String> = conn
        .query_row(
            "SELECT response FROM interactions WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    response.is_some()
}

/// One item, curated just now, and a capture node that receives nothing: with `retention_secs: 3` its text
/// is erased by a later sweep on the timer when sweeps come every second, and survives the 5 s run when
/// they come every hour (the first sweep, at start, finds it too young).
#[test]
fn capture_sweeps_retention_on_a_timer_with_no_input() {
    for (every, kept) in [(1, false), (3600, true)] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        let mut store = Store::open(data).unwrap();
        let i = Interaction {
            id: "y1".to_owned(),
            user: "u".to_owned(),
            adapter: None,
            prompt: vec![ChatMessage {
                role: hearth::message::Role::User,
                content: "question y1".to_owned(),
            }],
            response: "answer y1".to_owned(),
            sampling: serde_json::json!({}),
            created_at_unix_ms: 1,
            latency_ms: 2,
            commit: Default::default(),
        };
        let s = store.capture_interaction(&i).unwrap().remove(0);
        assert!(store.admit(&s).unwrap());
        drop(store);
        let src = format!(
            r#"Graph(name: "sweep", nodes: [
                (id: "capture", kind: Capture(retention_secs: 3, sweep_every_secs: {every})),
            ], edges: [])"#
        );
        let graph = hearth::actors::ActorKind::graph(&src).unwrap_or_else(|e| panic!("{e:#?}"));
        let run = hearth::engine::start(graph, Some(data)).unwrap();
        std::thread::sleep(Duration::from_secs(5));
        let report = run.shutdown();
        assert!(report.failed_nodes.is_empty(), "{report:#?}");
        assert_eq!(raw_text_kept(data, "y1"), kept, "sweep_every_secs: {every}");
        // What training needs stays.
        assert_eq!(Store::open(data).unwrap().training_set().unwrap().len(), 1);
    }
}

fn interaction(id: &str) -> Interaction {
    Interaction {
        id: id.to_owned(),
        user: "u".to_owned(),
        adapter: None,
        prompt: vec![ChatMessage {
            role: hearth::message::Role::User,
            content: format!("question {id}"),
        }],
        response: format!("answer {id}"),
        sampling: serde_json::json!({}),
        created_at_unix_ms: 1,
        latency_ms: 2,
        commit: Default::default(),
    }
}

fn feedback(id: &str, response_id: &str) -> hearth::message::Feedback {
    hearth::message::Feedback {
        id: id.to_owned(),
        response_id: response_id.to_owned(),
        user: "u".to_owned(),
        kind: hearth::message::FeedbackKind::Thumbs { up: true },
        created_at_unix_ms: 3,
        commit: Default::default(),
    }
}

/// The ids of `table`'s rows.
fn ids(data: &std::path::Path, table: &str, column: &str) -> Vec<String> {
    let conn = rusqlite::Connection::open(data.join(Store::FILE_NAME)).unwrap();
    let mut stmt = conn
        .prepare(&format!("SELECT {column} FROM {table} ORDER BY 1"))
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Decided items' records go once their text is erased and `record_retention_secs` has passed; an
/// interaction that feedback still waits on, a quarantined item and (without the option) everything stay.
/// Feedback on a response whose record is gone cannot be paired and goes too.
#[test]
fn capture_prunes_decided_records_and_keeps_what_is_still_needed() {
    for (record, pruned) in [("None", false), ("Some(1)", true)] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        let mut store = Store::open(data).unwrap();
        // y1 admitted; y2 admitted with feedback still pending; y3 quarantined; f9 on a response never seen.
        for id in ["y1", "y2", "y3"] {
            let s = store
                .capture_interaction(&interaction(id))
                .unwrap()
                .remove(0);
            if id == "y3" {
                let d = hearth::message::Decision {
                    sample: s,
                    node: "guard".to_owned(),
                    outcome: hearth::message::Outcome::Quarantined,
                    reason: "test".to_owned(),
                };
                assert!(store.decide(&d).unwrap());
            } else {
                assert!(store.admit(&s).unwrap());
            }
        }
        store.capture_feedback(&feedback("f2", "y2")).unwrap();
        store.capture_feedback(&feedback("f9", "gone")).unwrap();
        drop(store);
        let src = format!(
            r#"Graph(name: "prune", nodes: [
                (id: "capture", kind: Capture(retention_secs: 0, record_retention_secs: {record},
                    sweep_every_secs: 1)),
            ], edges: [])"#
        );
        let graph = hearth::actors::ActorKind::graph(&src).unwrap_or_else(|e| panic!("{e:#?}"));
        let run = hearth::engine::start(graph, Some(data)).unwrap();
        std::thread::sleep(Duration::from_secs(4));
        let report = run.shutdown();
        assert!(report.failed_nodes.is_empty(), "{report:#?}");
        let errors: Vec<_> = report.status.nodes.iter().map(|n| n.errors).collect();
        assert_eq!(errors, [0], "{report:#?}");
        let (interactions, feedback) =
            (ids(data, "interactions", "id"), ids(data, "feedback", "id"));
        let curation = ids(data, "curation", "sample_id");
        if pruned {
            assert_eq!(
                interactions,
                ["y2", "y3"],
                "record_retention_secs: {record}"
            );
            assert_eq!(feedback, ["f2"]);
            // y1's curation row stays while the training window holds its sample.
            assert_eq!(curation, ["f2", "y1", "y2", "y3"]);
        } else {
            assert_eq!(interactions, ["y1", "y2", "y3"]);
            assert_eq!(feedback, ["f2", "f9"]);
            assert_eq!(curation.len(), 5);
        }
        // What training needs stays.
        assert_eq!(Store::open(data).unwrap().training_set().unwrap().len(), 2);
    }
}
