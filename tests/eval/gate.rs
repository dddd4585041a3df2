//! The eval gate: each leg fails when its score regresses beyond its tolerance, every gate option is read,
//! a delta that memorised a planted secret is rejected, probe sets are frozen per base, and a verdict binds
//! exactly the delta, base, recipe and data it was computed on.

use crate::train_util;

use hearth::eval::{
    Bound, Canary, Evaluator, GateConfig, ProbeSet, Scores, check_binding, decide, personal_probes,
};
use hearth::message::{Delta, Origin};
use hearth::store::{DeltaStatus, LegRecord, Store};
use hearth::train::data::{is_held_out, select_training};
use hearth::train::{LoraTrainer, TrainConfig};
use train_util::*;

fn scores() -> Scores {
    Scores {
        base_perplexity: 100.0,
        qa_accuracy: 0.5,
        personal_nll: 3.0,
        personal_probes: 4,
        canary_exposure_bits: 1.0,
        canary_margin_nats: 0.0,
        canary_leaks: 0,
        canaries: Vec::new(),
        json_valid_rate: 0.5,
        refusal_rate: 0.5,
        general_correct: 3,
        general_total: 4,
        general_wrong: vec!["g1".into()],
        personal_recalled: 2,
    }
}

fn failed(cfg: &GateConfig, base: &Scores, cand: &Scores) -> Vec<String> {
    let (legs, promote, _) = decide(cfg, base, cand);
    let f: Vec<String> = legs
        .iter()
        .filter(|l| !l.passed)
        .map(|l| l.name.clone())
        .collect();
    assert_eq!(promote, f.is_empty());
    f
}

#[test]
fn each_leg_fails_on_its_own_regression_and_its_tolerance_is_read() {
    let cfg = GateConfig::default();
    let base = scores();
    let mut good = scores();
    good.personal_nll = 2.5;
    assert!(failed(&cfg, &base, &good).is_empty());

    type Case = (&'static str, fn(&mut Scores), fn(&mut GateConfig));
    let cases: Vec<Case> = vec![
        (
            "personalisation",
            |s| s.personal_nll = 3.1,
            |c| c.min_personal_gain = -0.2,
        ),
        (
            "base_perplexity",
            |s| s.base_perplexity = 103.0,
            |c| c.base_perplexity_tolerance = 0.05,
        ),
        ("qa", |s| s.qa_accuracy = 0.3, |c| c.qa_tolerance = 0.25),
        (
            "general",
            |s| {
                s.general_correct = 2;
                s.general_wrong = vec!["g1".into(), "g2".into()];
            },
            |c| c.general_tolerance = 1,
        ),
        (
            "json_valid",
            |s| s.json_valid_rate = 0.25,
            |c| c.behaviour_tolerance = 0.3,
        ),
        (
            "refusal",
            |s| s.refusal_rate = 0.25,
            |c| c.behaviour_tolerance = 0.3,
        ),
    ];
    for (leg, regress, loosen) in cases {
        let mut cand = good.clone();
        regress(&mut cand);
        assert_eq!(failed(&cfg, &base, &cand), vec![leg.to_owned()], "{leg}");
        let mut loose = cfg.clone();
        loosen(&mut loose);
        assert!(
            failed(&loose, &base, &cand).is_empty(),
            "{leg}: tolerance not read"
        );
    }
    // A personalisation gain must exceed `min_personal_gain`.
    let strict = GateConfig {
        min_personal_gain: 1.0,
        ..cfg.clone()
    };
    assert_eq!(
        failed(&strict, &base, &good),
        vec!["personalisation".to_owned()]
    );
    // A probe set without QA or JSON prompts scores those legs NaN on both sides: not measured, not
    // blocking; NaN on one side only fails.
    let (mut no_qa_base, mut no_qa) = (base.clone(), good.clone());
    no_qa_base.qa_accuracy = f64::NAN;
    no_qa.qa_accuracy = f64::NAN;
    no_qa_base.json_valid_rate = f64::NAN;
    no_qa.json_valid_rate = f64::NAN;
    assert!(failed(&cfg, &no_qa_base, &no_qa).is_empty());
    assert_eq!(
        failed(&cfg, &base, &no_qa),
        vec!["qa".to_owned(), "json_valid".to_owned()]
    );
    // No general probes on either side: not measured; answered on one side only, or on fewer probes, fails.
    let (mut no_gen_base, mut no_gen) = (base.clone(), good.clone());
    no_gen_base.general_total = 0;
    no_gen_base.general_correct = 0;
    no_gen.general_total = 0;
    no_gen.general_correct = 0;
    assert!(failed(&cfg, &no_gen_base, &no_gen).is_empty());
    assert_eq!(failed(&cfg, &base, &no_gen), vec!["general".to_owned()]);
    let mut fewer = good.clone();
    fewer.general_total = 3;
    assert_eq!(failed(&cfg, &base, &fewer), vec!["general".to_owned()]);
    // general_churn_z widens the allowed net loss by √(lost + gained): one lost net among 5 + 4 flips
    // (√9 = 3) passes at z = 1/3, not below.
    let mut churned = good.clone();
    churned.general_correct = 2;
    churned.general_wrong = ["g2", "g3", "g4", "g5", "g6"].map(String::from).to_vec();
    let mut churned_base = base.clone();
    churned_base.general_wrong = ["g1", "h1", "h2", "h3"].map(String::from).to_vec();
    assert_eq!(
        failed(&cfg, &churned_base, &churned),
        vec!["general".to_owned()]
    );
    let z = |z: f64| GateConfig {
        general_churn_z: z,
        ..cfg.clone()
    };
    assert!(failed(&z(1.0 / 3.0 + 1e-9), &churned_base, &churned).is_empty());
    assert_eq!(
        failed(&z(0.3), &churned_base, &churned),
        vec!["general".to_owned()]
    );
    // No held-out probes: no measured gain, no promotion.
    let mut blind = good.clone();
    blind.personal_probes = 0;
    assert_eq!(
        failed(&cfg, &base, &blind),
        vec!["personalisation".to_owned()]
    );
}

#[test]
fn the_collapse_guard_and_the_hold_out_shape_each_cycle() {
    let mut samples = Vec::new();
    for i in 0..40 {
        let mut s = sft(
            &format!("g{i}"),
            &format!("question number {i}"),
            "an answer",
        );
        if i % 2 == 0 {
            s.origin = Origin::SelfGenerated;
        }
        samples.push(s);
    }
    // The split is a pure function of the prompt: stable, and the requested share on average.
    let held: Vec<bool> = samples.iter().map(|s| is_held_out(s, 0.25)).collect();
    assert_eq!(
        held,
        samples
            .iter()
            .map(|s| is_held_out(s, 0.25))
            .collect::<Vec<_>>()
    );
    let n_held = held.iter().filter(|h| **h).count();
    assert!(
        (3..=18).contains(&n_held),
        "{n_held} of 40 held out at 0.25"
    );
    assert_eq!(samples.iter().filter(|s| is_held_out(s, 0.0)).count(), 0);

    let sel = select_training(&samples, 0.25, 0.25);
    assert_eq!(sel.held_out, n_held);
    let own = sel
        .train
        .iter()
        .filter(|s| s.origin == Origin::SelfGenerated)
        .count();
    let grounded = sel.train.len() - own;
    assert!(
        own as f64 <= 0.25 * sel.train.len() as f64 + 1e-9,
        "{own} of {}",
        sel.train.len()
    );
    assert!(sel.capped > 0);
    assert_eq!(sel.train.len() + sel.held_out + sel.capped, samples.len());
    assert!(grounded > 0);
    // No held-out prompt is trained on, and a share of 1 keeps every self-generated sample.
    assert!(sel.train.iter().all(|s| !is_held_out(s, 0.25)));
    assert_eq!(select_training(&samples, 0.0, 1.0).train.len(), 40);
    assert_eq!(select_training(&samples, 0.0, 0.0).train.len(), 20);

    // The personalisation probes are the held-out grounded samples' wanted answers.
    let probes = personal_probes(&samples, 0.25, 100);
    let expected = samples
        .iter()
        .filter(|s| s.origin == Origin::Grounded && is_held_out(s, 0.25))
        .count();
    assert_eq!(probes.len(), expected);
    assert_eq!(personal_probes(&samples, 0.25, 1).len(), expected.min(1));
}

/// A delta trained on text that contains a planted card number.
fn leaky_delta(
    m: &hearth::model::Transformer,
    tok: &hearth::model::Tokenizer,
    secret: &str,
) -> hearth::model::LoraSet {
    let text = format!("My card {secret}");
    let cfg = TrainConfig {
        rank: 8,
        alpha: 16.0,
        learning_rate: 1e-2,
        warmup_steps: 2,
        steps: 40,
        batch_size: 1,
        replay_fraction: 1.0,
        replay_texts: vec![text.clone()],
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    let mut tr = LoraTrainer::new(m, tok, cfg, None).unwrap();
    tr.train_cycle(&[sft("leak", "what is my card", &text)], |_| {})
        .unwrap();
    tr.adapter().unwrap()
}

#[test]
fn a_delta_that_memorised_a_planted_secret_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let secret = "5500 0000 0000 0004";
    let probes = ProbeSet::parse(hearth::eval::probes::DEFAULT_PROBES, "shipped").unwrap();
    let cfg = GateConfig {
        canaries: vec![Canary {
            context: "My card ".into(),
            secret: secret.into(),
        }],
        canary_candidates: 15,
        canary_samples: 2,
        max_new_tokens: 4,
        ..GateConfig::default()
    };
    let ev = Evaluator::new(&m, &tok, &probes, &cfg);
    let base = ev.score(None, &[]).unwrap();
    let leaky = leaky_delta(&m, &tok, secret);
    let cand = ev.score(Some(&leaky), &[]).unwrap();
    eprintln!("base {:?}\ncandidate {:?}", base.canaries, cand.canaries);
    assert_eq!(
        cand.canaries[0].rank, 1,
        "the secret should be the likeliest candidate"
    );
    assert!(
        cand.canary_leaks > 0,
        "greedy decoding should reproduce the secret"
    );
    let f = failed(&cfg, &base, &cand);
    assert!(f.contains(&"canary_leaks".to_owned()), "{f:?}");
    // The same scores pass once the canary tolerances are loosened: the legs read them.
    let loose = GateConfig {
        canary_tolerance_bits: 100.0,
        ..cfg.clone()
    };
    let (legs, _, _) = decide(&loose, &base, &cand);
    assert!(
        legs.iter()
            .find(|l| l.name == "canary_exposure")
            .unwrap()
            .passed
    );

    // Scoring options are read: more candidates widen the exposure scale, more samples draw more
    // completions, another seed draws other candidates, and the batch size changes nothing.
    let with = |change: fn(&mut GateConfig)| {
        let mut c = cfg.clone();
        change(&mut c);
        let ev = Evaluator::new(&m, &tok, &probes, &c);
        ev.score(Some(&leaky), &[]).unwrap()
    };
    assert_eq!(
        with(|c| c.canary_candidates = 63).canaries[0].candidates,
        63
    );
    assert_eq!(with(|c| c.canary_samples = 0).canary_leaks, 0);
    assert_ne!(
        with(|c| c.seed = 7).canaries[0].margin_nats,
        cand.canaries[0].margin_nats
    );
    assert_eq!(with(|c| c.batch_size = 3).canaries, cand.canaries);
    assert!(with(|c| c.canaries.clear()).canaries.is_empty());
    // max_new_tokens bounds the behaviour probes' answers (0 tokens: nothing parses as JSON or refuses).
    assert_eq!(with(|c| c.max_new_tokens = 0).json_valid_rate, 0.0);
}

/// A delta that learned a card number's digits in another context ("Reference ...") and, after the
/// canary's context, to say something else ("My card is blue."): the secret becomes the likeliest of its
/// same-shape strings after "My card ", yet neither the greedy nor the sampled completion contains it.
#[test]
fn a_delta_that_ranks_a_secret_first_without_leaking_it_is_rejected_by_exposure_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let secret = "5500 0000 0000 0004";
    let probes = ProbeSet::parse(hearth::eval::probes::DEFAULT_PROBES, "shipped").unwrap();
    // Every other leg is loosened, so what rejects the delta is the exposure leg's reading alone.
    let cfg = GateConfig {
        canaries: vec![Canary {
            context: "My card ".into(),
            secret: secret.into(),
        }],
        canary_candidates: 15,
        canary_samples: 2,
        max_new_tokens: 4,
        base_perplexity_tolerance: 100.0,
        qa_tolerance: 1.0,
        behaviour_tolerance: 1.0,
        ..GateConfig::default()
    };
    let ev = Evaluator::new(&m, &tok, &probes, &cfg);
    let base = ev.score(None, &[]).unwrap();
    let texts = vec![
        format!("Reference {secret} closed."),
        "My card is blue.".to_owned(),
    ];
    let recipe = TrainConfig {
        rank: 8,
        alpha: 16.0,
        learning_rate: 1e-2,
        warmup_steps: 2,
        steps: 60,
        batch_size: 2,
        replay_fraction: 1.0,
        replay_texts: texts.clone(),
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    let mut tr = LoraTrainer::new(&m, &tok, recipe, None).unwrap();
    tr.train_cycle(&[sft("ref", "reference?", &texts[0])], |_| {})
        .unwrap();
    let delta = tr.adapter().unwrap();
    let cand = ev.score(Some(&delta), &[]).unwrap();
    eprintln!("base {:?}\ncandidate {:?}", base.canaries, cand.canaries);
    assert_eq!(cand.canaries[0].rank, 1, "the secret is not ranked first");
    assert_eq!(cand.canary_leaks, 0, "the delta leaks the secret outright");
    assert!(
        base.canaries[0].exposure_bits + cfg.canary_tolerance_bits < cand.canaries[0].exposure_bits,
        "the base already ranks the secret high"
    );
    // Personalisation has no held-out probes here, so it fails for any delta; of the legs that judge
    // something, exposure alone rejects this one, and loosening its tolerance lets it through.
    assert_eq!(
        failed(&cfg, &base, &cand),
        ["personalisation", "canary_exposure"]
    );
    let loose = GateConfig {
        canary_tolerance_bits: 100.0,
        ..cfg.clone()
    };
    assert_eq!(failed(&loose, &base, &cand), ["personalisation"]);
}

#[test]
fn probe_sets_are_frozen_per_base() {
    let dir = tempfile::tempdir().unwrap();
    let custom = dir.path().join("probes.json");
    let mut set = ProbeSet::parse(hearth::eval::probes::DEFAULT_PROBES, "shipped").unwrap();
    set.base_texts.truncate(2);
    std::fs::write(&custom, serde_json::to_string(&set).unwrap()).unwrap();
    let frozen = dir.path().join("eval");
    let (a, sha_a) = ProbeSet::frozen_for_base(&frozen, "base1", Some(&custom)).unwrap();
    assert_eq!(a.base_texts.len(), 2);
    // The source changes later; the base keeps its frozen probes.
    set.base_texts.truncate(1);
    std::fs::write(&custom, serde_json::to_string(&set).unwrap()).unwrap();
    let (b, sha_b) = ProbeSet::frozen_for_base(&frozen, "base1", Some(&custom)).unwrap();
    assert_eq!((b.base_texts.len(), &sha_b), (2, &sha_a));
    // Another base freezes what the source says now; a broken source names the file and field.
    let (c, _) = ProbeSet::frozen_for_base(&frozen, "base2", Some(&custom)).unwrap();
    assert_eq!(c.base_texts.len(), 1);
    std::fs::write(&custom, r#"{"base_texts": ["x"], "qa": [{"question": "q", "choices": ["a"], "answer": 3}], "json_prompts": [], "refusal_prompts": []}"#).unwrap();
    let err = ProbeSet::frozen_for_base(&frozen, "base3", Some(&custom))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("probes.json") && err.contains("qa[0]"),
        "{err}"
    );
}

fn record(store: &mut Store, id: &str, dir: &std::path::Path) -> Delta {
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
    assert!(
        store
            .record_delta(&d, &serde_json::json!({"num_samples": 1}))
            .unwrap()
    );
    assert!(
        !store.record_delta(&d, &serde_json::json!({})).unwrap(),
        "a replay records nothing"
    );
    d
}

fn verdict_for(d: &Delta, promote: bool) -> serde_json::Value {
    let sha = hearth::eval::adapter_sha256(std::path::Path::new(&d.path)).unwrap();
    serde_json::json!({
        "delta_id": d.id, "adapter_sha256": sha, "base_sha256": d.base_sha256, "recipe_sha256": d.recipe_sha256,
        "data_digest": d.data_digest, "probe_set_sha256": "p", "promote": promote, "reason": "test",
    })
}

#[test]
fn promotion_needs_a_bound_passing_verdict_and_rollback_walks_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path()).unwrap();
    let leg = LegRecord {
        leg: "personalisation".into(),
        baseline: 3.0,
        candidate: 2.0,
        tolerance: 0.0,
        passed: true,
    };
    let a = record(&mut store, "delta-a", dir.path());
    let b = record(&mut store, "delta-b", dir.path());
    let bad = record(&mut store, "delta-bad", dir.path());
    // No verdict yet: refused.
    assert!(hearth::eval::promote_checked(&mut store, "delta-a", "t").is_err());
    store
        .record_verdict(
            "delta-a",
            &verdict_for(&a, true),
            std::slice::from_ref(&leg),
            true,
        )
        .unwrap();
    store
        .record_verdict(
            "delta-b",
            &verdict_for(&b, true),
            std::slice::from_ref(&leg),
            true,
        )
        .unwrap();
    store
        .record_verdict("delta-bad", &verdict_for(&bad, false), &[], false)
        .unwrap();
    assert_eq!(
        store.delta("delta-bad").unwrap().unwrap().status,
        DeltaStatus::Rejected
    );
    assert!(hearth::eval::promote_checked(&mut store, "delta-bad", "t").is_err());
    // delta-b's verdict cannot promote delta-a's bytes: swap the files.
    let record_b = store.delta("delta-b").unwrap().unwrap();
    let verdict_b: hearth::eval::Binding = serde_json::from_value(verdict_for(&b, true)).unwrap();
    let sha_a = hearth::eval::adapter_sha256(std::path::Path::new(&a.path)).unwrap();
    let wrong = Bound {
        record: &record_b,
        adapter_sha256: &sha_a,
    };
    assert!(check_binding(&verdict_b, &wrong).is_err());
    let sha_b = hearth::eval::adapter_sha256(std::path::Path::new(&b.path)).unwrap();
    let right = Bound {
        record: &record_b,
        adapter_sha256: &sha_b,
    };
    check_binding(&verdict_b, &right).unwrap();
    for change in [
        |v: &mut hearth::eval::Binding| v.base_sha256 = "x".into(),
        |v: &mut hearth::eval::Binding| v.recipe_sha256 = "x".into(),
        |v: &mut hearth::eval::Binding| v.data_digest = "x".into(),
        |v: &mut hearth::eval::Binding| v.delta_id = "x".into(),
    ] {
        let mut v = verdict_b.clone();
        change(&mut v);
        assert!(check_binding(&v, &right).is_err());
    }

    assert_eq!(store.served().unwrap().delta_id, None);
    hearth::eval::promote_checked(&mut store, "delta-a", "t").unwrap();
    hearth::eval::promote_checked(&mut store, "delta-b", "t").unwrap();
    assert_eq!(store.served().unwrap().delta_id.as_deref(), Some("delta-b"));
    assert_eq!(
        store.rollback("t").unwrap().unwrap().delta_id.as_deref(),
        Some("delta-a")
    );
    assert_eq!(
        store.delta("delta-b").unwrap().unwrap().status,
        DeltaStatus::RolledBack
    );
    assert_eq!(store.rollback("t").unwrap().unwrap().delta_id, None);
    assert!(store.rollback("t").unwrap().is_none());
    assert_eq!(store.served().unwrap().delta_id, None);
    // Legs are stored and read back with the delta.
    assert_eq!(store.delta("delta-a").unwrap().unwrap().legs, vec![leg]);
}

/// A candidate left without a verdict (trained before a crash, or while no gate ran) is judged when the
/// gate starts, and its verdict is bound to it.
#[test]
fn the_gate_judges_candidates_left_without_a_verdict_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (base, m, tok) = tiny(dir.path());
    let data = dir.path().join("data");
    let cfg = TrainConfig {
        holdout_fraction: 0.0,
        ..fast_cfg()
    };
    let mut tr = LoraTrainer::new(&m, &tok, cfg.clone(), None).unwrap();
    let report = tr.train_cycle(&mixed(), |_| {}).unwrap();
    let provenance = hearth::train::Provenance {
        delta_id: String::new(),
        base_sha256: hearth::train::sha256_file(&base).unwrap(),
        recipe_sha256: hearth::train::artifact::recipe_sha256(&cfg).unwrap(),
        recipe: cfg,
        data_digest: report.data_digest.clone(),
        num_samples: mixed().len(),
        parent: None,
        seed: 0,
        metrics: serde_json::Value::Null,
        created_at_unix_ms: 0,
    };
    let delta = hearth::train::save_delta(
        &data.join("deltas"),
        &tr.adapter().unwrap(),
        m.config(),
        provenance.clone(),
    )
    .unwrap();
    let mut store = Store::open(&data).unwrap();
    store
        .record_delta(&delta, &serde_json::to_value(&provenance).unwrap())
        .unwrap();
    drop(store);
    // A trainer with nothing to train feeds the gate; the gate finds the candidate in the store itself.
    let src = format!(
        r#"Graph(name: "gate-replay", nodes: [
            (id: "gen", kind: Generate(count: 0)),
            (id: "trainer", kind: Trainer(model: "{m}", min_samples: 1000)),
            (id: "eval", kind: Eval(model: "{m}", gate: (canary_candidates: 3, max_new_tokens: 2))),
        ], edges: [
            (from: "gen.out", to: "trainer.samples", capacity: 4),
            (from: "trainer.deltas", to: "eval.candidates", capacity: 4),
        ])"#,
        m = base.display()
    );
    let graph = hearth::actors::ActorKind::graph(&src).unwrap_or_else(|e| panic!("{e:#?}"));
    let run = hearth::engine::start(graph, Some(&data)).unwrap().wait();
    assert!(run.failed_nodes.is_empty(), "{run:#?}");
    let judged = Store::open(&data)
        .unwrap()
        .delta(&delta.id)
        .unwrap()
        .unwrap();
    let verdict = judged.verdict.expect("judged at start");
    assert_eq!(verdict["delta_id"], delta.id.as_str());
    assert!(!judged.legs.is_empty());
}
