//! The `Trainer` actor in a running graph: buffers samples, trains a cycle off the engine
//! thread, writes a delta with provenance and sends it on `deltas`.

use crate::train_util;

use hearth::actors::Graph;
use hearth::engine::runtime::start;
use hearth::train::Provenance;

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

#[test]
fn a_graph_trains_a_delta_from_the_sample_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _, _) = train_util::tiny(dir.path());
    let data = dir.path().join("data");
    let graph = trainer_graph(
        &base,
        12,
        "min_samples: 6, await_verdict: false, train: (steps: 2, batch_size: 2, rank: 2, max_seq_len: 64, seed: 3)",
    );
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
        assert_eq!(p.metrics["threads"], 1);
        let dir = data.join("deltas").join(&p.delta_id);
        // The llama.cpp export beside the PEFT files holds the same adapter.
        let (model, _) = hearth::model::load(&base).unwrap();
        let peft = hearth::model::LoraSet::load_peft(&dir, model.config()).unwrap();
        let gguf =
            hearth::model::LoraSet::load_gguf(dir.join("adapter.gguf"), model.config()).unwrap();
        assert_eq!(peft.len(), gguf.len());
        assert_eq!(p.metrics["steps"], 2);
        assert_eq!(p.base_sha256, hearth::train::sha256_file(&base).unwrap());
    }
}

/// A restarted trainer (after a crash, or a new run) reloads the training set the store holds, so no admitted
/// sample is lost to training, and records the delta it trains as a candidate.
#[test]
fn a_restarted_trainer_trains_on_the_training_set_in_the_store() {
    use hearth::message::{ChatMessage, Feedback, FeedbackKind, Interaction};
    let dir = tempfile::tempdir().unwrap();
    let (base, _, _) = train_util::tiny(dir.path());
    let data = dir.path().join("data");
    {
        let mut store = hearth::store::Store::open(&data).unwrap();
        for i in 0..5 {
            let id = format!("i{i}");
            let interaction = Interaction {
                id: id.clone(),
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
            let feedback = Feedback {
                id: format!("f{i}"),
                response_id: id,
                user: "u".to_owned(),
                kind: FeedbackKind::Accepted,
                created_at_unix_ms: 2,
                commit: Default::default(),
            };
            for s in store.capture_feedback(&feedback).unwrap() {
                assert!(store.admit(&s).unwrap());
            }
        }
        assert_eq!(store.training_set().unwrap().len(), 10);
    }
    // Nothing new arrives on the edge: everything comes from the store.
    let graph = trainer_graph(
        &base,
        0,
        "min_samples: 10, threads: 2, train: (steps: 2, batch_size: 2, rank: 2, max_seq_len: 64, holdout_fraction: 0.0, max_self_generated_share: 1.0)",
    );
    let report = start(graph, Some(&data)).expect("start").wait();
    assert!(report.failed_nodes.is_empty(), "{report:#?}");
    let store = hearth::store::Store::open(&data).unwrap();
    let deltas = store.deltas().unwrap();
    assert_eq!(deltas.len(), 1, "{deltas:?}");
    assert_eq!(deltas[0].provenance["num_samples"], 10);
    // The cycle ran in a pool of the configured size (the default is one thread).
    assert_eq!(deltas[0].provenance["metrics"]["threads"], 2);
    assert_eq!(deltas[0].status, hearth::store::DeltaStatus::Candidate);
}

/// `await_verdict` (the default) holds the next cycle until the gate has judged the last delta: with no gate
/// in the graph, the same stream as above trains one delta, not two.
#[test]
fn the_next_cycle_waits_for_the_gates_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _, _) = train_util::tiny(dir.path());
    let data = dir.path().join("data");
    let graph = trainer_graph(
        &base,
        12,
        "min_samples: 6, train: (steps: 2, batch_size: 2, rank: 2, max_seq_len: 64, seed: 3)",
    );
    let report = start(graph, Some(&data)).expect("start").wait();
    assert!(report.failed_nodes.is_empty(), "{report:#?}");
    let deltas = std::fs::read_dir(data.join("deltas")).unwrap().count();
    assert_eq!(deltas, 1);
}

/// `replay_self_distilled` is read where a cycle runs: the trainer generates the base's answers once, into
/// the data directory's cache, and trains with them; without it no cache appears.
#[test]
fn a_cycle_with_self_distilled_replay_caches_the_bases_answers() {
    for (prompts, cached) in [(0, false), (2, true)] {
        let dir = tempfile::tempdir().unwrap();
        let (base, _, _) = train_util::tiny(dir.path());
        let data = dir.path().join("data");
        let graph = trainer_graph(
            &base,
            6,
            &format!(
                "min_samples: 6, await_verdict: false, train: (steps: 2, batch_size: 2, rank: 2, \
                 max_seq_len: 64, replay_fraction: 0.5, replay_self_distilled: {prompts})"
            ),
        );
        let report = start(graph, Some(&data)).expect("start").wait();
        assert!(
            report.status.nodes.iter().all(|n| n.errors == 0),
            "{report:#?}"
        );
        let sha = hearth::train::sha256_file(&base).unwrap();
        let cache = hearth::train::replay::cache_path(&data, &sha, prompts);
        assert_eq!(cache.exists(), cached, "replay_self_distilled: {prompts}");
        assert_eq!(std::fs::read_dir(data.join("deltas")).unwrap().count(), 1);
    }
}

/// `start_from`: a cycle continues from the served delta (the default), or trains afresh from the base.
#[test]
fn a_cycle_starts_from_the_served_delta_or_from_the_base() {
    use hearth::train::{Cycles, StartFrom, cycle::TrainerSettings};
    use std::sync::Arc;
    for (start_from, continues) in [(StartFrom::Served, true), (StartFrom::Base, false)] {
        let dir = tempfile::tempdir().unwrap();
        let (model, _, _) = train_util::tiny(dir.path());
        let data = dir.path().join("data");
        let mut store = hearth::store::Store::open(&data).unwrap();
        let mut recipe = train_util::fast_cfg();
        recipe.steps = 1;
        let settings = TrainerSettings {
            min_samples: 2,
            await_verdict: false,
            start_from,
            train: Box::new(recipe),
            ..TrainerSettings::default()
        };
        let base = Arc::new(hearth::model::Base::load(&model).unwrap());
        let mut cycles = Cycles::new(
            settings.cycle_settings("t", &data),
            Arc::new(move || Ok(base.clone())),
        );
        let mut cycle = |n: usize| {
            for i in n..n + 2 {
                cycles.add(&train_util::sft(&format!("s{i}"), &format!("q{i}"), "a"));
            }
            cycles.maybe_start().unwrap();
            cycles.finished(true).unwrap().expect("a cycle ran")
        };
        let first = cycle(0);
        store
            .record_verdict(
                &first.id,
                &serde_json::json!({"promote": true, "reason": "test"}),
                &[],
                true,
            )
            .unwrap();
        store.promote(&first.id, "test").unwrap();
        let second = cycle(2);
        let record = store.delta(&second.id).unwrap().unwrap();
        assert_eq!(
            record.provenance["num_samples"], 4,
            "{start_from:?}: the window"
        );
        assert_eq!(
            record.parent.as_deref() == Some(first.id.as_str()),
            continues,
            "{start_from:?}: parent {:?}",
            record.parent
        );
        assert_eq!(second.parent.is_some(), continues, "{start_from:?}");
    }
}
