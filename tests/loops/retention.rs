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
