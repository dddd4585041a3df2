//! The trainer's bounds: the training window (by count and by age) in memory and in the store, and the
//! training schedule (`min_interval_secs`, `idle_load`). Each parameter changes what the trainer does.

use crate::train_util;

use hearth::actors::Graph;
use hearth::engine::runtime::start;
use hearth::message::{ChatMessage, Interaction};
use hearth::store::Store;

/// A graph of `Generate(count: N)` feeding a trainer with the given parameters (after `model`).
fn trainer_graph(base: &std::path::Path, count: u64, trainer: &str) -> Graph {
    let src = format!(
        r#"Graph(name: "train", nodes: [
            (id: "gen", kind: Generate(count: {count})),
            (id: "trainer", kind: Trainer(model: "{}", {trainer})),
        ], edges: [
            (from: "gen.out", to: "trainer.samples", capacity: 8),
        ])"#,
        base.display()
    );
    hearth::actors::ActorKind::graph(&src).unwrap_or_else(|e| panic!("{e:#?}"))
}

const RECIPE: &str = "train: (steps: 2, batch_size: 2, rank: 2, max_seq_len: 64, seed: 3, holdout_fraction: 0.0, max_self_generated_share: 1.0)";

/// Runs `Generate(count)` into a trainer (no gate, `min_samples: 6`) with `extra` parameters; returns each
/// delta's `num_samples`, in training order.
fn cycles(count: u64, extra: &str) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let (base, _, _) = train_util::tiny(dir.path());
    let data = dir.path().join("data");
    let graph = trainer_graph(
        &base,
        count,
        &format!("min_samples: 6, await_verdict: false, {extra} {RECIPE}"),
    );
    let report = start(graph, Some(&data)).expect("start").wait();
    assert!(report.failed_nodes.is_empty(), "{report:#?}");
    let Ok(entries) = std::fs::read_dir(data.join("deltas")) else {
        return Vec::new();
    };
    let mut provs: Vec<hearth::train::Provenance> = entries
        .map(|e| {
            let p = e.unwrap().path().join("provenance.json");
            serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
        })
        .collect();
    provs.sort_by_key(|p| p.created_at_unix_ms);
    provs.iter().map(|p| p.num_samples as u64).collect()
}

/// `window.max_samples` bounds what a cycle trains on (and the buffer behind it): the second cycle of 12
/// samples trains on the last 4, not on all 12.
#[test]
fn the_window_by_count_bounds_each_cycle() {
    assert_eq!(cycles(12, ""), vec![6, 12]);
    assert_eq!(cycles(12, "window: (max_samples: 4),"), vec![4, 4]);
}

/// `min_interval_secs` holds the next cycle: the same stream trains once, not twice (drain included).
#[test]
fn the_minimum_interval_holds_the_next_cycle() {
    assert_eq!(cycles(12, "min_interval_secs: 0,").len(), 2);
    assert_eq!(cycles(12, "min_interval_secs: 3600,"), vec![6]);
}

/// `idle_load` starts a cycle only while the load average per CPU is below it: nothing is ever below 0.
#[test]
fn idle_load_holds_training_while_the_machine_is_busy() {
    if hearth::train::cycle::load_per_cpu().is_none() {
        eprintln!("no /proc/loadavg here: idle_load is not applied, nothing to test");
        return;
    }
    assert_eq!(cycles(12, "idle_load: 0.0,"), Vec::<u64>::new());
    assert_eq!(cycles(12, "idle_load: 1000000.0,").len(), 2);
}

/// Captures and admits `n` interactions, then backdates the admission of the first `old` by two days.
fn admitted_store(data: &std::path::Path, n: usize, old: usize) {
    let mut store = Store::open(data).unwrap();
    for i in 0..n {
        let interaction = Interaction {
            id: format!("i{i}"),
            user: "u".to_owned(),
            adapter: None,
            prompt: vec![ChatMessage {
                role: hearth::message::Role::User,
                content: format!("what is fact {i}"),
            }],
            response: format!("fact {i} is about owls"),
            sampling: serde_json::json!({}),
            created_at_unix_ms: 1,
            latency_ms: 1,
            commit: Default::default(),
        };
        for s in store.capture_interaction(&interaction).unwrap() {
            assert!(store.admit(&s).unwrap());
        }
    }
    drop(store);
    let two_days_ago = hearth::clock::now_unix_ms() as i64 - 2 * 86_400_000;
    let conn = rusqlite::Connection::open(data.join(Store::FILE_NAME)).unwrap();
    conn.execute(
        "UPDATE training_set SET admitted_at_unix_ms = ?1 WHERE rowid IN
         (SELECT rowid FROM training_set ORDER BY rowid LIMIT ?2)",
        rusqlite::params![two_days_ago, old as i64],
    )
    .unwrap();
}

/// A trainer started over a store reloads only the window, and deletes the training-set rows outside it:
/// by age (`max_age_secs`) and by count (`max_samples`).
#[test]
fn the_window_cuts_the_stores_training_set_by_age_and_by_count() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _, _) = train_util::tiny(dir.path());
    for (window, trained, left) in [
        ("window: (max_samples: None),", 10, 10),
        ("window: (max_samples: None, max_age_secs: 86400),", 4, 4),
        ("window: (max_samples: 3),", 3, 3),
    ] {
        let data = dir.path().join(format!("data-{trained}"));
        admitted_store(&data, 10, 6);
        let graph = trainer_graph(
            &base,
            0,
            &format!("min_samples: 3, await_verdict: false, {window} {RECIPE}"),
        );
        let report = start(graph, Some(&data)).expect("start").wait();
        assert!(report.failed_nodes.is_empty(), "{report:#?}");
        let store = Store::open(&data).unwrap();
        let deltas = store.deltas().unwrap();
        assert_eq!(deltas.len(), 1, "{window}: {deltas:?}");
        assert_eq!(deltas[0].provenance["num_samples"], trained, "{window}");
        assert_eq!(store.training_set().unwrap().len(), left, "{window}");
        // What left the window is still accounted for: its item stays admitted.
        assert_eq!(store.counts().unwrap().admitted, 10, "{window}");
    }
}

/// A window with nothing a cycle may train on (only the model's own answers, which the collapse guard caps by
/// the grounded ones) is not a failure: the trainer waits for more samples instead of failing the cycle
/// again at each restart until the node is failed (what a soak of the personal graph without feedback hit).
#[test]
fn a_window_without_trainable_samples_waits_rather_than_failing_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _, _) = train_util::tiny(dir.path());
    let data = dir.path().join("data");
    admitted_store(&data, 10, 0);
    let graph = trainer_graph(
        &base,
        0,
        "min_samples: 3, await_verdict: false, train: (steps: 2, batch_size: 2, rank: 2, max_seq_len: 64, max_self_generated_share: 0.5)",
    );
    let report = start(graph, Some(&data)).expect("start").wait();
    assert!(report.failed_nodes.is_empty(), "{report:#?}");
    let trainer = report
        .status
        .nodes
        .iter()
        .find(|n| n.id == "trainer")
        .unwrap();
    assert_eq!((trainer.errors, trainer.restarts), (0, 0), "{report:#?}");
    assert!(Store::open(&data).unwrap().deltas().unwrap().is_empty());
}
