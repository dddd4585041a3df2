//! Route or merge, and purge through shared deltas. On the tiny model, users teach facts through edits; each
//! gets a delta of their own (`per_user`). `reconcile` merges the deltas that agree into one the gate judges
//! (each member must keep their gain) and keeps conflicting ones routed. `purge_user` retires every delta
//! trained partly on the purged user's data, and each chain that served one goes back to one that was not.

use std::path::Path;
use std::sync::Arc;

use hearth::eval::Gate;
use hearth::message::Delta;
use hearth::model::{Base, LoraSet};
use hearth::store::Store;
use hearth::train::Cycles;
use hearth::train::cycle::{PerUser, TrainerSettings};
use hearth::train::merge::Decision;
use hearth::train::reconcile::{GateSettings, Outcome, ReconcileOptions, reconcile};
use serde_json::json;

use super::per_user::{gate_config, recipe, teach};
use crate::train_util;

const COLOUR: [&str; 8] = [
    "which colour do i like",
    "what is my favourite colour",
    "tell me the colour i prefer",
    "my colour, please",
    "name the colour i love",
    "which colour suits me",
    "what colour should my car be",
    "pick a colour for me",
];

const PET: [&str; 8] = [
    "what pet do i have",
    "which animal lives with me",
    "name my pet",
    "what kind of pet is mine",
    "tell me about my animal",
    "who waits for me at home",
    "what do i feed every morning",
    "which animal do i walk",
];

/// A data directory where each `(user, questions, answer)` taught and got a promoted delta of their own.
struct Taught {
    _dir: tempfile::TempDir,
    model: std::path::PathBuf,
    data: std::path::PathBuf,
    base: Arc<Base>,
    own: std::collections::BTreeMap<String, Delta>,
}

fn taught(users: &[(&str, &[&str], &str)]) -> Taught {
    taught_and(users, true)
}

/// [`taught`]; with `judge` false the deltas are left as candidates for an eval node.
fn taught_and(users: &[(&str, &[&str], &str)], judge: bool) -> Taught {
    let dir = tempfile::tempdir().unwrap();
    let (model, _, _) = train_util::tiny_with(dir.path(), false);
    let data = dir.path().join("data");
    let mut store = Store::open(&data).unwrap();
    for (u, q, a) in users {
        teach(&mut store, u, q, a);
    }
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
    cycles.reload().unwrap();
    let mut gate = Gate::new(base.clone(), &data, None, gate_config());
    let mut own = std::collections::BTreeMap::new();
    for _ in users {
        cycles.maybe_start().unwrap();
        let delta = cycles.finished(true).unwrap().expect("a cycle ran");
        let user = hearth::train::artifact::delta_user(Path::new(&delta.path))
            .unwrap()
            .expect("a user's own delta");
        if judge {
            let verdict = gate.judge(&delta).unwrap();
            assert!(
                verdict.binding.promote,
                "{user}: {}",
                verdict.binding.reason
            );
        }
        own.insert(user, delta);
    }
    Taught {
        model,
        _dir: dir,
        data,
        base,
        own,
    }
}

fn settings() -> GateSettings {
    GateSettings {
        probes: None,
        cfg: gate_config(),
    }
}

/// Answer NLL per token of `user`'s held-out edits under `adapter` (`None`: the base).
fn held_out_nll(t: &Taught, user: &str, adapter: Option<&str>) -> f64 {
    let store = Store::open(&t.data).unwrap();
    let mine: Vec<_> = store
        .training_set()
        .unwrap()
        .into_iter()
        .filter(|s| s.user == user)
        .collect();
    let probes = hearth::eval::personal_probes(&mine, recipe().holdout_fraction, 64);
    assert!(!probes.is_empty(), "{user} has held-out probes");
    let set = adapter.map(|id| {
        let r = store.delta(id).unwrap().unwrap();
        LoraSet::load_peft(&r.path, t.base.model.config()).unwrap()
    });
    let cfg = gate_config();
    let probe_set =
        hearth::eval::ProbeSet::parse(hearth::eval::probes::DEFAULT_PROBES, "shipped").unwrap();
    let ev = hearth::eval::Evaluator::new(&t.base.model, &t.base.tok, &probe_set, &cfg);
    ev.personal_nll(set.as_ref(), &probes).unwrap().0
}

#[test]
fn compatible_deltas_merge_and_keep_both_gains() {
    let t = taught(&[("alice", &COLOUR, "blue"), ("dave", &PET, "rabbit")]);
    let (alice, dave) = (&t.own["alice"].id, &t.own["dave"].id);
    // A dry run decides and merges nothing; asking the pair to keep 99% of each gain routes it.
    let dry = ReconcileOptions {
        dry_run: true,
        ..ReconcileOptions::default()
    };
    let would = reconcile(&t.data, t.base.clone(), settings(), &dry).unwrap();
    assert!(
        matches!(would.groups[0].outcome, Outcome::WouldMerge),
        "{would:?}"
    );
    let strict = ReconcileOptions {
        min_kept: 0.99,
        ..dry
    };
    let strict = reconcile(&t.data, t.base.clone(), settings(), &strict).unwrap();
    assert_eq!(strict.pairs[0].decision, Decision::Route);
    assert_eq!(strict.pairs[0].decided_by, "kept_gain");
    assert_eq!(Store::open(&t.data).unwrap().deltas().unwrap().len(), 2);
    let rec = reconcile(
        &t.data,
        t.base.clone(),
        settings(),
        &ReconcileOptions::default(),
    )
    .unwrap();
    for l in rec.lines() {
        eprintln!("{l}");
    }
    assert_eq!(rec.pairs.len(), 1);
    assert_eq!(rec.pairs[0].decision, Decision::Merge, "{:?}", rec.pairs);
    assert_eq!(rec.groups.len(), 1);
    let Outcome::Merged {
        delta_id, promoted, ..
    } = &rec.groups[0].outcome
    else {
        panic!("{:?}", rec.groups)
    };
    assert!(promoted, "{:?}", rec.groups[0]);
    let store = Store::open(&t.data).unwrap();
    // Both are served the merge now; their own deltas stay on their chains to roll back to.
    for u in ["alice", "dave"] {
        assert_eq!(
            store.served_for(u).unwrap().delta_id.as_ref(),
            Some(delta_id)
        );
    }
    let merged = store.delta(delta_id).unwrap().unwrap();
    assert_eq!(merged.members(), ["alice", "dave"]);
    assert_eq!(merged.trained_on().unwrap(), ["alice", "dave"]);
    // Each member keeps a gain over the base on their own held-out edits.
    for (u, own) in [("alice", alice), ("dave", dave)] {
        let (base, own_nll, merged_nll) = (
            held_out_nll(&t, u, None),
            held_out_nll(&t, u, Some(own)),
            held_out_nll(&t, u, Some(delta_id)),
        );
        eprintln!("{u}: base {base:.4}  own {own_nll:.4}  merged {merged_nll:.4}");
        assert!(merged_nll < base, "{u}: merged {merged_nll} vs base {base}");
    }
    let legs: Vec<&str> = merged.legs.iter().map(|l| l.leg.as_str()).collect();
    assert!(
        legs.contains(&"personalisation:alice") && legs.contains(&"personalisation:dave"),
        "{legs:?}"
    );
    // The decision is recorded, and the report shows it and each member's row.
    let md = hearth::report::Report::build(&store, &[])
        .unwrap()
        .to_markdown();
    assert!(
        md.contains("## Route or merge") && md.contains("promoted to each member"),
        "{md}"
    );
    assert!(
        md.contains(&format!("| alice | `{delta_id}` merged: alice, dave |")),
        "{md}"
    );
    let recorded = store.reconciliations(1).unwrap();
    assert_eq!(recorded[0].2["groups"][0]["delta_id"], json!(delta_id));
    let list = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["deltas", "list", "--data-dir"])
        .arg(&t.data)
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.contains(&format!("* {delta_id}")) && list.contains("user=(merged: alice,dave)"),
        "{list}"
    );
    // Nothing is left to merge: the merge alone is an input now.
    let again = reconcile(
        &t.data,
        t.base.clone(),
        settings(),
        &ReconcileOptions::default(),
    )
    .unwrap();
    assert_eq!(again.inputs.len(), 1);
    assert!(matches!(again.groups[0].outcome, Outcome::Routed { .. }));

    // Purging dave retires the merge (it holds his data): alice goes back to her own delta.
    let mut store = Store::open(&t.data).unwrap();
    let counts = store.purge_user("dave").unwrap();
    assert_eq!(counts.trained_on.retired, std::slice::from_ref(delta_id));
    assert_eq!(
        store.served_for("alice").unwrap().delta_id.as_ref(),
        Some(alice)
    );
    assert!(store.delta(delta_id).unwrap().is_none());
    assert_eq!(counts.reconciliations, 4, "every decision named dave");
}

#[test]
fn conflicting_deltas_stay_routed() {
    let t = taught(&[("alice", &COLOUR, "blue"), ("bob", &COLOUR, "red")]);
    let rec = reconcile(
        &t.data,
        t.base.clone(),
        settings(),
        &ReconcileOptions::default(),
    )
    .unwrap();
    for l in rec.lines() {
        eprintln!("{l}");
    }
    assert_eq!(rec.pairs[0].decision, Decision::Route, "{:?}", rec.pairs);
    assert_eq!(rec.groups.len(), 2);
    assert!(
        rec.groups
            .iter()
            .all(|g| matches!(g.outcome, Outcome::Routed { .. }))
    );
    let store = Store::open(&t.data).unwrap();
    for (u, d) in &t.own {
        assert_eq!(store.served_for(u).unwrap().delta_id.as_ref(), Some(&d.id));
    }
    assert_eq!(store.deltas().unwrap().len(), 2, "nothing merged");
    drop(store);
    // The same decision through the CLI.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["deltas", "reconcile", "--dry-run", "--model"])
        .arg(&t.model)
        .arg("--data-dir")
        .arg(&t.data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("-> route (by contested_prompts)")
            && text.contains("8 of 8 questions both taught have different answers"),
        "{text}"
    );
    let store = Store::open(&t.data).unwrap();
    assert_eq!(
        store.reconciliations(1).unwrap()[0].2["groups"][0]["outcome"],
        "routed"
    );
}

/// Marks `id` judged and passing, and serves it (the gate's binding is not what this test is about).
fn serve(store: &mut Store, id: &str) {
    store
        .record_verdict(id, &json!({"promote": true, "reason": "test"}), &[], true)
        .unwrap();
    store.promote(id, "test").unwrap();
}

fn purge_cli(data: &Path, user: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["purge", "--user", user, "--data-dir"])
        .arg(data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn purge_retires_common_deltas_trained_on_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _, _) = train_util::tiny(dir.path());
    let data = dir.path().join("data");
    let mut store = Store::open(&data).unwrap();
    // A common delta from before deltas listed their users: nothing says whose data it holds.
    let legacy = data.join("deltas").join("legacy");
    std::fs::create_dir_all(&legacy).unwrap();
    let old = Delta {
        id: "legacy".into(),
        path: legacy.display().to_string(),
        base_sha256: "b".into(),
        recipe_sha256: "r".into(),
        data_digest: "d".into(),
        parent: None,
    };
    store.record_delta(&old, &json!({})).unwrap();
    serve(&mut store, "legacy");

    let base = Arc::new(Base::load(&model).unwrap());
    let mut recipe = train_util::fast_cfg();
    recipe.steps = 1;
    // A window of two samples: the second cycle trains on erin's alone, and holds carol's through its parent.
    let settings = TrainerSettings {
        min_samples: 2,
        await_verdict: false,
        window: hearth::train::TrainingWindow {
            max_samples: Some(2),
            max_age_secs: None,
        },
        train: Box::new(recipe),
        ..TrainerSettings::default()
    };
    let mut cycles = Cycles::new(
        settings.cycle_settings("t", &data),
        Arc::new(move || Ok(base.clone())),
    );
    let mut cycle = |user: &str| {
        for i in 0..2 {
            let mut s = train_util::sft(&format!("{user}{i}"), &format!("q{i}"), "a");
            s.user = user.to_owned();
            cycles.add(&s);
        }
        cycles.maybe_start().unwrap();
        let d = cycles.finished(true).unwrap().expect("a cycle ran");
        std::thread::sleep(std::time::Duration::from_millis(10));
        d
    };
    let c1 = cycle("carol");
    serve(&mut store, &c1.id);
    let c2 = cycle("erin");
    serve(&mut store, &c2.id);
    let record = store.delta(&c2.id).unwrap().unwrap();
    assert_eq!(record.provenance["num_samples"], 2, "erin's samples alone");
    assert_eq!(record.parent.as_deref(), Some(c1.id.as_str()));
    assert_eq!(record.trained_on().unwrap(), ["carol", "erin"]);
    assert_eq!(
        store.delta(&c1.id).unwrap().unwrap().trained_on().unwrap(),
        ["carol"]
    );
    drop(store);

    // Purging erin retires c2, whose weights hold her data; serving goes back to c1, trained without it.
    let out = purge_cli(&data, "erin");
    eprintln!("{out}");
    assert!(out.contains(&format!("retired {}", c2.id)), "{out}");
    assert!(
        out.contains(&format!(
            "the common chain now serves {} instead of {}",
            c1.id, c2.id
        )),
        "{out}"
    );
    assert!(
        out.contains("kept 1 common delta(s)") && out.contains("legacy"),
        "{out}"
    );
    let mut store = Store::open(&data).unwrap();
    assert!(store.delta(&c2.id).unwrap().is_none());
    assert!(!Path::new(&c2.path).exists());
    assert_eq!(store.served().unwrap().delta_id.as_ref(), Some(&c1.id));
    // No rollback reaches c2 again: back from c1 is the legacy delta, then the base.
    assert_eq!(
        store.rollback("t").unwrap().unwrap().delta_id.as_deref(),
        Some("legacy")
    );
    serve(&mut store, &c1.id);

    // Purging carol retires c1 too: only the legacy delta, whose data is not known, is left to serve.
    let counts = store.purge_user("carol").unwrap();
    assert_eq!(counts.trained_on.retired, std::slice::from_ref(&c1.id));
    assert_eq!(counts.trained_on.unknown, ["legacy"]);
    assert_eq!(store.served().unwrap().delta_id.as_deref(), Some("legacy"));
    assert_eq!(store.deltas().unwrap().len(), 1);
}

#[test]
fn the_reconcile_node_merges_after_the_gate_promotes() {
    // In a graph: the eval node judges the two users' candidates at its start and sends each promotion on to
    // the reconcile node, which merges the two once both are served.
    let t = taught_and(
        &[("alice", &COLOUR, "blue"), ("dave", &PET, "rabbit")],
        false,
    );
    let gate = "(base_perplexity_tolerance: 1e9, qa_tolerance: 1.0, behaviour_tolerance: 1.0, \
                general_tolerance: 18446744073709551615, canary_candidates: 3, max_new_tokens: 2, \
                general_probes: 4, general_max_tokens: 2)";
    let src = format!(
        r#"Graph(name: "reconcile", nodes: [
            (id: "gen", kind: Generate(count: 0)),
            (id: "trainer", kind: Trainer(model: "{m}", min_samples: 1000)),
            (id: "eval", kind: Eval(model: "{m}", gate: {gate})),
            (id: "reconcile", kind: Reconcile(model: "{m}", gate: {gate}, options: (method: linear))),
        ], edges: [
            (from: "gen.out", to: "trainer.samples", capacity: 4),
            (from: "trainer.deltas", to: "eval.candidates", capacity: 4),
            (from: "eval.promoted", to: "reconcile.deltas", capacity: 4),
        ])"#,
        m = t.model.display()
    );
    let graph = hearth::actors::ActorKind::graph(&src).unwrap_or_else(|e| panic!("{e:#?}"));
    let report = hearth::engine::runtime::start(graph, Some(&t.data))
        .expect("start")
        .wait();
    let node = report
        .status
        .nodes
        .iter()
        .find(|n| n.id == "reconcile")
        .unwrap();
    assert_eq!(node.errors, 0, "{report:#?}");
    assert_eq!(node.processed, 2, "{report:#?}");
    let store = Store::open(&t.data).unwrap();
    let served = store.served_for("alice").unwrap().delta_id.unwrap();
    assert_eq!(
        store.served_for("dave").unwrap().delta_id.as_ref(),
        Some(&served)
    );
    let merged = store.delta(&served).unwrap().unwrap();
    assert_eq!(merged.members(), ["alice", "dave"]);
    // `options` reached the node: the merge is linear, not the default.
    assert_eq!(merged.provenance["metrics"]["merge"]["method"], "linear");
    let recorded = store.reconciliations(8).unwrap();
    assert_eq!(
        recorded[0].2["groups"][0]["outcome"], "merged",
        "{:?}",
        recorded[0].2
    );
}
