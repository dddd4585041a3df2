//! Dead-letter rotation: the file rotates at `max_bytes`, `keep` rotated files stay, and readers read them
//! all, oldest first.

use hearth::engine::dead_letter::{DeadLetterStore, Rotation};
use hearth::message::Message;

use crate::runtime::graph;

/// 100 messages, every one ending in 0 failing: 73 dead letters (see the restart-limit test in runtime.rs),
/// written under the graph's `settings.dead_letters`.
fn letters_under(settings: &str) -> (Vec<String>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let src = format!(
        r#"Graph(name: "rotate", settings: ({settings}), nodes: [
            (id: "gen", kind: Generate(count: 100)),
            (id: "flaky", kind: FaultInject(fail_ids_ending: ["0"], mode: Error),
             restart: (max_restarts: 3, window_secs: 60, backoff_ms: 1)),
            (id: "sink", kind: Blackhole()),
        ], edges: [
            (from: "gen.out", to: "flaky.in", capacity: 4),
            (from: "flaky.out", to: "sink.in", capacity: 4),
        ])"#
    );
    let report = hearth::engine::start(graph(&src), Some(dir.path()))
        .unwrap()
        .wait();
    assert_eq!(report.failed_nodes, ["flaky"]);
    let ids = DeadLetterStore::read_all::<Message>(dir.path())
        .unwrap()
        .iter()
        .map(|l| l.message.id().to_owned())
        .collect();
    (ids, DeadLetterStore::files(dir.path()).len())
}

#[test]
fn the_graph_setting_rotates_dead_letters_and_readers_read_every_file() {
    // The default (8 MiB) never rotates 73 letters.
    let (all, files) = letters_under("");
    assert_eq!((all.len(), files), (73, 1));
    // Rotating at 2 KB and keeping 100 files loses nothing, in order.
    let (kept, files) = letters_under("dead_letters: (max_bytes: 2000, keep: 100)");
    assert_eq!(kept, all);
    assert!(files > 3, "{files} files");
    // Keeping 2 rotated files bounds the letters to the newest; the last letter is always there.
    let (newest, files) = letters_under("dead_letters: (max_bytes: 2000, keep: 2)");
    assert!(files <= 3, "{files} files");
    assert!(newest.len() < all.len());
    assert_eq!(newest, all[all.len() - newest.len()..]);
}

#[test]
fn rotation_keeps_at_most_keep_files_of_about_max_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = DeadLetterStore::open_rotating(
        dir.path(),
        Rotation {
            max_bytes: 600,
            keep: 2,
        },
    )
    .unwrap();
    let sample = hearth::message::Message::Sample(std::sync::Arc::new(hearth::message::Sample {
        id: "s".into(),
        user: "u".into(),
        origin: hearth::message::Origin::Grounded,
        content: hearth::message::SampleContent::Sft {
            prompt: vec![],
            response: "r".into(),
        },
        provenance: Default::default(),
        created_at_unix_ms: 0,
    }));
    for i in 0..200 {
        store.put("n", i, "e", &sample);
    }
    let files = DeadLetterStore::files(dir.path());
    assert_eq!(files.len(), 3, "{files:?}");
    for f in &files {
        // A file rotates on the letter that takes it past max_bytes, so it holds at most one letter more.
        assert!(std::fs::metadata(f).unwrap().len() < 600 + 300, "{f:?}");
    }
    let letters = DeadLetterStore::read_all::<Message>(dir.path()).unwrap();
    let workers: Vec<usize> = letters.iter().map(|l| l.worker).collect();
    assert_eq!(workers.last(), Some(&199));
    assert!(workers.windows(2).all(|w| w[0] + 1 == w[1]), "{workers:?}");
}
