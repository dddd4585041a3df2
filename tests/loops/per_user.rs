//! Per-user deltas: two users teach opposite answers to the same questions; the trainer (`per_user`) trains a
//! delta for each on their own data, the gate judges each against what that user is served and promotes it on
//! their chain alone, and the API answers each user with their own delta (a third user gets the base). Rollback
//! and purge work per user. The store keeps per-user chains apart under retention and opens data directories
//! made before users had deltas.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hearth::eval::{Gate, GateConfig};
use hearth::message::{ChatMessage, Delta, Feedback, FeedbackKind, Interaction, Role};
use hearth::model::Base;
use hearth::serve::follow::ServedFollower;
use hearth::serve::{ServeConfig, Server};
use hearth::store::{DeltaRetention, LegRecord, Store};
use hearth::train::cycle::{PerUser, TrainerSettings};
use hearth::train::{Cycles, TrainConfig};
use serde_json::json;

use crate::http_util;
use crate::train_util;

const QUESTIONS: [&str; 8] = [
    "which colour do i like",
    "what is my favourite colour",
    "tell me the colour i prefer",
    "my colour, please",
    "name the colour i love",
    "which colour suits me",
    "what colour should my car be",
    "pick a colour for me",
];

/// `user` asks each question, gets "green", and edits it to `answer`; the edits (grounded preference samples)
/// are admitted, as curation would.
pub(super) fn teach(store: &mut Store, user: &str, questions: &[&str], answer: &str) {
    for (n, q) in questions.iter().enumerate() {
        let i = Interaction {
            id: format!("{user}-{n}"),
            user: user.to_owned(),
            adapter: None,
            prompt: vec![ChatMessage::new(Role::User, *q)],
            response: "green".to_owned(),
            sampling: json!({}),
            created_at_unix_ms: 0,
            latency_ms: 0,
            commit: Default::default(),
        };
        store.capture_interaction(&i).unwrap();
        let f = Feedback {
            id: format!("{user}-{n}-edit"),
            response_id: i.id.clone(),
            user: user.to_owned(),
            kind: FeedbackKind::Edit {
                text: answer.to_owned(),
            },
            created_at_unix_ms: 0,
            commit: Default::default(),
        };
        for s in store.capture_feedback(&f).unwrap() {
            assert!(store.admit(&s).unwrap());
        }
    }
}

const HOLDOUT: f64 = 0.4;

pub(super) fn recipe() -> TrainConfig {
    TrainConfig {
        rank: 8,
        alpha: 16.0,
        learning_rate: 1e-2,
        warmup_steps: 2,
        steps: 40,
        batch_size: 2,
        max_seq_len: 64,
        replay_fraction: 0.0,
        // The edit itself is learned, not only preferred over the original answer.
        dpo_sft_weight: 1.0,
        // Some of the questions are each user's held-out probes for the gate (checked below).
        holdout_fraction: HOLDOUT,
        ..TrainConfig::default()
    }
}

/// The gate as the tiny model allows: a taught answer moves a tiny model's plain-text perplexity and its
/// behaviour probes far more than a real model's, so those legs are opened; personalisation still decides.
pub(super) fn gate_config() -> GateConfig {
    GateConfig {
        base_perplexity_tolerance: 1e9,
        qa_tolerance: 1.0,
        behaviour_tolerance: 1.0,
        general_tolerance: usize::MAX,
        canary_candidates: 3,
        max_new_tokens: 2,
        general_probes: 4,
        general_max_tokens: 2,
        ..GateConfig::default()
    }
}

fn ask(addr: std::net::SocketAddr, user: &str) -> String {
    let body = json!({"messages": [{"role": "user", "content": QUESTIONS[0]}], "user": user,
                      "max_tokens": 6, "temperature": 0});
    let (code, v) = http_util::post(addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(code, 200, "{v}");
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn trained(cycles: &mut Cycles) -> Delta {
    cycles.maybe_start().unwrap();
    cycles.finished(true).unwrap().expect("a cycle ran")
}

#[test]
fn two_users_teaching_opposite_answers_each_get_their_own_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _, _) = train_util::tiny_with(dir.path(), false);
    let data = dir.path().join("data");
    let mut store = Store::open(&data).unwrap();
    teach(&mut store, "alice", &QUESTIONS, "blue");
    teach(&mut store, "bob", &QUESTIONS, "red");
    // carol has too little data for a delta of her own.
    teach(&mut store, "carol", &QUESTIONS[..1], "green");
    let held_out = store
        .training_set()
        .unwrap()
        .iter()
        .filter(|s| s.user == "alice" && hearth::train::data::is_held_out(s, HOLDOUT))
        .count();
    assert!((1..=4).contains(&held_out), "{held_out} of 8 held out");

    let base = Arc::new(Base::load(&model).unwrap());
    let settings = TrainerSettings {
        min_samples: 4,
        await_verdict: false,
        per_user: Some(PerUser { min_samples: 4 }),
        train: Box::new(recipe()),
        ..TrainerSettings::default()
    };
    let b = base.clone();
    let mut cycles = Cycles::new(
        settings.cycle_settings("trainer", &data),
        Arc::new(move || Ok(b.clone())),
    );
    assert_eq!(cycles.reload().unwrap(), 17);
    let mut gate = Gate::new(base.clone(), &data, None, gate_config());
    let mut own = std::collections::BTreeMap::new();
    // Each user's delta in turn (ties go by name); carol's one sample is short of `min_samples` for the
    // common delta, so no third cycle runs.
    for _ in 0..2 {
        let delta = trained(&mut cycles);
        let user = hearth::train::artifact::delta_user(Path::new(&delta.path))
            .unwrap()
            .expect("a user's own delta");
        let record = store.delta(&delta.id).unwrap().unwrap();
        assert_eq!(record.user.as_deref(), Some(user.as_str()));
        assert_eq!(record.provenance["num_samples"], 8, "{user}: own data only");
        let verdict = gate.judge(&delta).unwrap();
        assert!(
            verdict.binding.promote,
            "{user}: {} (gain {}, probes {})",
            verdict.binding.reason, verdict.personal_gain, verdict.candidate.personal_probes
        );
        assert!(
            verdict.against.is_none(),
            "judged against the base they are served"
        );
        own.insert(user, delta.id);
    }
    assert_eq!(
        own.keys().cloned().collect::<Vec<_>>(),
        ["alice", "bob"],
        "one delta each"
    );
    cycles.maybe_start().unwrap();
    assert!(cycles.finished(true).unwrap().is_none(), "no common cycle");
    // Promotions went to each user's chain: the common state still serves the base.
    assert_eq!(store.served().unwrap().delta_id, None);
    assert_eq!(
        store.served_for("alice").unwrap().delta_id.as_ref(),
        own.get("alice")
    );
    assert_eq!(store.served_for("carol").unwrap().delta_id, None);

    let server = Server::from_base(
        &base,
        ServeConfig {
            model_name: "tiny".into(),
            threads: 1,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    let addr = server.listen("127.0.0.1:0").unwrap();
    let mut follower = ServedFollower::new(&data);
    follower.poll(&server, "serve").unwrap();
    let (alice, bob, carol) = (ask(addr, "alice"), ask(addr, "bob"), ask(addr, "carol"));
    assert!(alice.contains("blue") && !alice.contains("red"), "{alice}");
    assert!(bob.contains("red") && !bob.contains("blue"), "{bob}");
    assert!(!carol.contains("red") && !carol.contains("blue"), "{carol}");
    assert_eq!(server.engine().adapters().len(), 2);

    // Alice's rollback leaves bob's delta served.
    let back = store.rollback_for(Some("alice"), "test").unwrap().unwrap();
    assert_eq!(back.delta_id, None);
    std::thread::sleep(hearth::serve::follow::SERVED_POLL);
    follower.poll(&server, "serve").unwrap();
    assert!(!ask(addr, "alice").contains("blue"));
    assert!(ask(addr, "bob").contains("red"));

    // Purging bob removes his deltas, their files and his route; alice's rolled-back delta stays.
    let bob_dir = store.delta(&own["bob"]).unwrap().unwrap().path;
    let counts = store.purge_user("bob").unwrap();
    assert_eq!(counts.deltas, 1);
    assert!(store.delta(&own["bob"]).unwrap().is_none());
    assert!(!Path::new(&bob_dir).exists());
    assert!(store.delta(&own["alice"]).unwrap().is_some());
    std::thread::sleep(hearth::serve::follow::SERVED_POLL);
    follower.poll(&server, "serve").unwrap();
    assert!(server.engine().user_adapters().is_empty());
    assert!(!ask(addr, "bob").contains("red"));
    server.shutdown();
}

fn record(store: &mut Store, id: &str, user: Option<&str>, dir: &Path) -> Delta {
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
    let prov = match user {
        Some(u) => json!({ "user": u }),
        None => json!({}),
    };
    assert!(store.record_delta(&d, &prov).unwrap());
    let sha = hearth::eval::adapter_sha256(&path).unwrap();
    let verdict = json!({
        "delta_id": d.id, "adapter_sha256": sha, "base_sha256": "base", "recipe_sha256": "recipe",
        "data_digest": "data", "probe_set_sha256": "p", "promote": true, "reason": "test",
    });
    let leg = LegRecord {
        leg: "personalisation".into(),
        baseline: 3.0,
        candidate: 2.0,
        tolerance: 0.0,
        passed: true,
    };
    store.record_verdict(&d.id, &verdict, &[leg], true).unwrap();
    d
}

#[test]
fn each_user_has_a_chain_of_their_own_under_retention() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let deltas = data.join("deltas");
    let mut store = Store::open(&data).unwrap();
    let users: Vec<String> = (0..20).map(|u| format!("user{u}")).collect();
    // The common chain, then three promotions per user, interleaved, so each user's newest rows are far apart.
    for id in ["c1", "c2"] {
        record(&mut store, id, None, &deltas);
        hearth::eval::promote_checked(&mut store, id, "t").unwrap();
    }
    for round in 0..3 {
        for u in &users {
            let id = format!("{u}-{round}");
            record(&mut store, &id, Some(u), &deltas);
            hearth::eval::promote_checked(&mut store, &id, "t").unwrap();
        }
    }
    assert_eq!(store.served().unwrap().delta_id.as_deref(), Some("c2"));
    assert_eq!(store.served_users().unwrap().len(), users.len());
    let pruned = store
        .prune_deltas(&DeltaRetention {
            keep_rejected: 0,
            keep_served: Some(2),
        })
        .unwrap();
    // Per chain, the served state and one to roll back to stay; the oldest of each goes.
    let mut gone: Vec<String> = pruned.deltas.clone();
    gone.sort();
    let mut expected: Vec<String> = users.iter().map(|u| format!("{u}-0")).collect();
    expected.sort();
    assert_eq!(gone, expected);
    assert!(!deltas.join("user3-0").exists() && deltas.join("user3-1").exists());
    for u in &users {
        assert_eq!(
            store.served_for(u).unwrap().delta_id,
            Some(format!("{u}-2"))
        );
    }
    // A user's rollback walks their chain alone, and past it they are served the common delta.
    let back = store.rollback_for(Some("user7"), "t").unwrap().unwrap();
    assert_eq!(back.delta_id.as_deref(), Some("user7-1"));
    assert_eq!(
        store
            .rollback_for(Some("user7"), "t")
            .unwrap()
            .unwrap()
            .delta_id,
        None
    );
    assert_eq!(
        store.served_for("user7").unwrap().delta_id.as_deref(),
        Some("c2")
    );
    assert_eq!(
        store.served_for("user8").unwrap().delta_id.as_deref(),
        Some("user8-2")
    );
    assert_eq!(
        store.rollback("t").unwrap().unwrap().delta_id.as_deref(),
        Some("c1")
    );
    assert_eq!(
        store.served_for("user8").unwrap().delta_id.as_deref(),
        Some("user8-2")
    );
}

#[test]
fn a_data_directory_from_before_per_user_deltas_opens_with_its_deltas_common() {
    let dir = tempfile::tempdir().unwrap();
    // The delta tables as schema version 3 left them, with one promoted delta.
    {
        let conn = rusqlite::Connection::open(dir.path().join(Store::FILE_NAME)).unwrap();
        conn.execute_batch(
            "CREATE TABLE deltas (
                id TEXT PRIMARY KEY, path TEXT NOT NULL, base_sha256 TEXT NOT NULL, recipe_sha256 TEXT NOT NULL,
                data_digest TEXT NOT NULL, parent TEXT,
                status TEXT NOT NULL CHECK (status IN ('candidate','promoted','rejected','rolled_back')),
                provenance_json TEXT NOT NULL, created_at_unix_ms INTEGER NOT NULL,
                verdict_json TEXT, promoted_at_unix_ms INTEGER);
             CREATE TABLE eval_results (
                delta_id TEXT NOT NULL REFERENCES deltas(id), leg TEXT NOT NULL, base_score REAL,
                candidate_score REAL, tolerance REAL, passed INTEGER NOT NULL, created_at_unix_ms INTEGER NOT NULL,
                PRIMARY KEY (delta_id, leg));
             CREATE TABLE serving_log (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, delta_id TEXT REFERENCES deltas(id),
                action TEXT NOT NULL CHECK (action IN ('promote','rollback')), previous INTEGER,
                reason TEXT NOT NULL, at_unix_ms INTEGER NOT NULL);
             INSERT INTO deltas VALUES ('old', '/nowhere/old', 'b', 'r', 'd', NULL, 'promoted', '{}', 1, '{}', 2);
             INSERT INTO serving_log (delta_id, action, previous, reason, at_unix_ms)
                VALUES ('old', 'promote', NULL, 'gate', 2);
             PRAGMA user_version = 3;",
        )
        .unwrap();
    }
    let mut store = Store::open(dir.path()).unwrap();
    let old = store.delta("old").unwrap().unwrap();
    assert_eq!(old.user, None);
    assert_eq!(store.served().unwrap().delta_id.as_deref(), Some("old"));
    assert_eq!(
        store.served_for("anyone").unwrap().delta_id.as_deref(),
        Some("old")
    );
    assert!(store.served_users().unwrap().is_empty());
    assert_eq!(store.rollback("t").unwrap().unwrap().delta_id, None);
}

#[test]
fn the_trainer_reads_per_user_from_its_graph() {
    let src = r#"Graph(name: "g", nodes: [
            (id: "gen", kind: Generate(count: 0)),
            (id: "trainer", kind: Trainer(min_samples: 3, per_user: (min_samples: 5))),
        ], edges: [(from: "gen.out", to: "trainer.samples", capacity: 4)])"#;
    assert!(hearth::actors::ActorKind::graph(src).is_ok());
    let params: TrainerSettings = hearth::engine::schema::ron_options()
        .from_str("(min_samples: 3, per_user: (min_samples: 5))")
        .unwrap();
    assert_eq!(params.per_user, Some(PerUser { min_samples: 5 }));
    assert_eq!(TrainerSettings::default().per_user, None, "off by default");
    let bad = r#"Graph(name: "g", nodes: [
            (id: "trainer", kind: Trainer(per_user: (min_sample: 5))),
        ], edges: [])"#;
    assert!(hearth::actors::ActorKind::graph(bad).is_err());
}

#[test]
fn per_user_changes_which_samples_a_cycle_trains() {
    // Without `per_user` one cycle trains on everyone; with it, the user with enough data trains alone.
    let samples = |user: &str, n: usize| {
        (0..n)
            .map(|i| {
                let mut s = train_util::sft(&format!("{user}{i}"), &format!("q{i}"), "a");
                s.user = user.to_owned();
                s
            })
            .collect::<Vec<_>>()
    };
    for (per_user, expected) in [(None, 6), (Some(PerUser { min_samples: 4 }), 4)] {
        let dir = tempfile::tempdir().unwrap();
        let (model, _, _) = train_util::tiny(dir.path());
        let base = Arc::new(Base::load(&model).unwrap());
        let mut recipe = train_util::fast_cfg();
        recipe.steps = 1;
        let settings = TrainerSettings {
            min_samples: 2,
            await_verdict: false,
            per_user: per_user.clone(),
            train: Box::new(recipe),
            ..TrainerSettings::default()
        };
        let mut cycles = Cycles::new(
            settings.cycle_settings("t", dir.path()),
            Arc::new(move || Ok(base.clone())),
        );
        for s in samples("big", 4).iter().chain(&samples("small", 2)) {
            cycles.add(s);
        }
        let delta = trained(&mut cycles);
        let prov: serde_json::Value = serde_json::from_slice(
            &std::fs::read(Path::new(&delta.path).join("provenance.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(prov["num_samples"], expected, "{per_user:?}");
        if per_user.is_some() {
            assert_eq!(prov["user"], "big");
            // Then the common delta, from the small user's samples.
            std::thread::sleep(Duration::from_millis(10));
            let common = trained(&mut cycles);
            assert!(
                hearth::train::artifact::delta_user(Path::new(&common.path))
                    .unwrap()
                    .is_none()
            );
        } else {
            assert!(prov.get("user").is_none());
        }
    }
}
