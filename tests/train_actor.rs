//! The `Trainer` actor in a running graph: buffers samples, trains a cycle off the engine
//! thread, writes a delta with provenance and sends it on `deltas`.

mod train_util;

use hearth::engine::Graph;
use hearth::engine::runtime::start;
use hearth::train::Provenance;

#[test]
fn a_graph_trains_a_delta_from_the_sample_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _, _) = train_util::tiny(dir.path());
    let data = dir.path().join("data");
    let src = format!(
        r#"Graph(name: "train", nodes: [
            (id: "gen", kind: Generate(count: 12)),
            (id: "trainer", kind: Trainer(model: "{}", min_samples: 6,
                train: (steps: 2, batch_size: 2, rank: 2, max_seq_len: 64, seed: 3))),
        ], edges: [
            (from: "gen.out", to: "trainer.samples", capacity: 8),
        ])"#,
        base.display()
    );
    let graph = Graph::from_ron(&src).unwrap_or_else(|e| panic!("{e:#?}"));
    let report = start(graph, Some(&data)).expect("start").wait();
    let node = report
        .status
        .nodes
        .iter()
        .find(|n| n.id == "trainer")
        .unwrap();
    assert_eq!(node.processed, 12, "{report:#?}");
    assert_eq!(node.errors, 0, "{report:#?}");
    let deltas: Vec<_> = std::fs::read_dir(data.join("deltas"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    // Two cycles (6 samples each): the second trains on all 12. Both start from the base: a cycle continues
    // from the served delta, and without an eval gate nothing is promoted.
    assert_eq!(deltas.len(), 2, "{deltas:?}");
    let mut provs: Vec<Provenance> = deltas
        .iter()
        .map(|d| {
            assert!(d.join("adapter_model.safetensors").exists());
            serde_json::from_slice(&std::fs::read(d.join("provenance.json")).unwrap()).unwrap()
        })
        .collect();
    provs.sort_by_key(|p| p.num_samples);
    assert_eq!((provs[0].num_samples, provs[1].num_samples), (6, 12));
    assert_eq!(provs[0].parent, None);
    assert_eq!(provs[1].parent, None);
    for p in &provs {
        assert_eq!((p.seed, p.recipe.steps), (3, 2));
        assert_eq!(p.metrics["steps"], 2);
        assert_eq!(p.base_sha256, hearth::train::sha256_file(&base).unwrap());
    }
}
