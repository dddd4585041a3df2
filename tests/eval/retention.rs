//! Delta retention: the rollback chain and candidates are kept, the newest `keep_rejected` of the rest, and
//! everything else goes, rows and adapter files; rollback stays exact over what is kept; a crash between
//! deleting rows and files is finished by the next prune; the eval node reads its `retention`.

use std::collections::BTreeSet;
use std::path::Path;

use hearth::message::Delta;
use hearth::store::{DeltaRetention, DeltaStatus, LegRecord, Store};

fn record(store: &mut Store, id: &str, dir: &Path) -> Delta {
    let path = dir.join(id);
    std::fs::create_dir_all(&path).unwrap();
    std::fs::write(path.join("adapter_model.safetensors"), id.as_bytes()).unwrap();
    let d = Delta {
        id: id.to_owned(),
        path: path.display().to_string(),
        base_sha256: "base".into(),
        recipe_sha256: "recipe".into(),
        data_digest: "data".into(),
        parent: None,
    };
    assert!(store.record_delta(&d, &serde_json::json!({})).unwrap());
    d
}

fn judge(store: &mut Store, d: &Delta, pass: bool) {
    let sha = hearth::eval::adapter_sha256(Path::new(&d.path)).unwrap();
    let verdict = serde_json::json!({
        "delta_id": d.id, "adapter_sha256": sha, "base_sha256": d.base_sha256, "recipe_sha256": d.recipe_sha256,
        "data_digest": d.data_digest, "probe_set_sha256": "p", "promote": pass, "reason": "test",
    });
    let leg = LegRecord {
        leg: "personalisation".into(),
        baseline: 3.0,
        candidate: 2.0,
        tolerance: 0.0,
        passed: pass,
    };
    store.record_verdict(&d.id, &verdict, &[leg], pass).unwrap();
}

/// Promoted a, b, c; rejected r1, r2, r3 (in that order); then rolled back to b, so c is rolled back and the
/// chain is b -> a -> the base. With `candidate`, one more delta awaits its verdict.
fn scenario(data: &Path, candidate: bool) -> Store {
    let dir = data.join("deltas");
    let mut store = Store::open(data).unwrap();
    for id in ["a", "b", "c"] {
        let d = record(&mut store, id, &dir);
        judge(&mut store, &d, true);
        hearth::eval::promote_checked(&mut store, id, "t").unwrap();
    }
    for id in ["r1", "r2", "r3"] {
        let d = record(&mut store, id, &dir);
        judge(&mut store, &d, false);
    }
    if candidate {
        record(&mut store, "cand", &dir);
    }
    assert_eq!(
        store.rollback("t").unwrap().unwrap().delta_id.as_deref(),
        Some("b")
    );
    store
}

fn ids(store: &Store) -> BTreeSet<String> {
    store.deltas().unwrap().into_iter().map(|d| d.id).collect()
}

fn dirs(data: &Path) -> BTreeSet<String> {
    std::fs::read_dir(data.join("deltas"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn eval_rows(data: &Path) -> i64 {
    let conn = rusqlite::Connection::open(data.join(Store::FILE_NAME)).unwrap();
    conn.query_row("SELECT COUNT(*) FROM eval_results", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn retention_keeps_the_rollback_chain_candidates_and_the_newest_rejected() {
    for (keep_rejected, kept) in [
        (8, set(&["a", "b", "c", "r1", "r2", "r3", "cand"])),
        (2, set(&["a", "b", "r2", "r3", "cand"])),
        (0, set(&["a", "b", "cand"])),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let mut store = scenario(data, true);
        let retention = DeltaRetention {
            keep_rejected,
            keep_served: None,
        };
        let pruned = store.prune_deltas(&retention).unwrap();
        assert_eq!(ids(&store), kept, "keep_rejected {keep_rejected}");
        // Rows and files go together, with the pruned deltas' eval results.
        assert_eq!(dirs(data), kept, "keep_rejected {keep_rejected}");
        assert_eq!(
            eval_rows(data),
            kept.len() as i64 - 1,
            "one leg each; the candidate has none"
        );
        assert_eq!(pruned.deltas.len(), 7 - kept.len());
        // Only the rows no rollback can reach left the serving log (the promotions of b and c).
        assert_eq!(pruned.serving_log_rows, 2);
        // A second prune finds nothing more.
        assert!(store.prune_deltas(&retention).unwrap().deltas.is_empty());
        // Rollback is exact over what is kept: b, then a, then the base alone.
        assert_eq!(store.served().unwrap().delta_id.as_deref(), Some("b"));
        assert_eq!(
            store.rollback("t").unwrap().unwrap().delta_id.as_deref(),
            Some("a")
        );
        assert_eq!(store.rollback("t").unwrap().unwrap().delta_id, None);
        assert!(store.rollback("t").unwrap().is_none());
    }
}

/// `keep_served` bounds the chain: with 1, only the served delta is a rollback target, a rollback reaches the
/// base alone, and what was served before is deleted like any other delta no rollback can reach.
#[test]
fn keep_served_bounds_the_rollback_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    let mut store = scenario(data, false);
    let retention = DeltaRetention {
        keep_rejected: 1,
        keep_served: Some(1),
    };
    let pruned = store.prune_deltas(&retention).unwrap();
    assert_eq!(ids(&store), set(&["b", "r3"]));
    assert_eq!(dirs(data), set(&["b", "r3"]));
    assert_eq!(pruned.serving_log_rows, 3);
    assert_eq!(
        store.delta("b").unwrap().unwrap().status,
        DeltaStatus::Promoted
    );
    assert_eq!(store.served().unwrap().delta_id.as_deref(), Some("b"));
    assert_eq!(store.rollback("t").unwrap().unwrap().delta_id, None);
    assert!(store.rollback("t").unwrap().is_none());
    // Zero would delete the served delta: refused.
    let none = DeltaRetention {
        keep_rejected: 1,
        keep_served: Some(0),
    };
    assert!(store.prune_deltas(&none).is_err());
}

/// Rows go first, in one transaction that lists the files to delete; a crash before the files are gone
/// leaves that list, and the next prune (the gate's start) deletes them. A file already gone is no error.
#[test]
fn a_crash_between_rows_and_files_is_finished_by_the_next_prune() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    let mut store = scenario(data, false);
    // The state a crash after the commit leaves: r1's rows gone, its directory listed and still on disk.
    let conn = rusqlite::Connection::open(data.join(Store::FILE_NAME)).unwrap();
    let r1 = data.join("deltas").join("r1");
    conn.execute_batch(
        "DELETE FROM eval_results WHERE delta_id = 'r1'; DELETE FROM deltas WHERE id = 'r1';",
    )
    .unwrap();
    for path in [r1.clone(), data.join("deltas").join("gone-already")] {
        conn.execute(
            "INSERT INTO file_trash (path, at_unix_ms) VALUES (?1, 0)",
            [path.display().to_string()],
        )
        .unwrap();
    }
    assert!(r1.exists());
    store.prune_deltas(&DeltaRetention::default()).unwrap();
    assert!(!r1.exists());
    let left: i64 = conn
        .query_row("SELECT COUNT(*) FROM file_trash", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0);
    assert_eq!(dirs(data), set(&["a", "b", "c", "r2", "r3"]));
}

/// The eval node prunes by its `retention` at start (and after each verdict).
#[test]
fn the_eval_node_reads_its_retention() {
    for (retention, kept) in [
        ("", set(&["a", "b", "c", "r1", "r2", "r3"])),
        ("retention: (keep_rejected: 1),", set(&["a", "b", "r3"])),
        (
            "retention: (keep_rejected: 1, keep_served: 1),",
            set(&["b", "r3"]),
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        drop(scenario(data, false));
        // Nothing to judge: the model is never loaded.
        let src = format!(
            r#"Graph(name: "retention", nodes: [
                (id: "gen", kind: Generate(count: 0)),
                (id: "trainer", kind: Trainer(model: "none.gguf", min_samples: 1000)),
                (id: "eval", kind: Eval(model: "none.gguf", {retention})),
            ], edges: [
                (from: "gen.out", to: "trainer.samples", capacity: 4),
                (from: "trainer.deltas", to: "eval.candidates", capacity: 4),
            ])"#
        );
        let graph = hearth::actors::ActorKind::graph(&src).unwrap_or_else(|e| panic!("{e:#?}"));
        let run = hearth::engine::start(graph, Some(data)).unwrap().wait();
        assert!(run.failed_nodes.is_empty(), "{run:#?}");
        assert_eq!(ids(&Store::open(data).unwrap()), kept, "{retention}");
        assert_eq!(dirs(data), kept, "{retention}");
    }
}
