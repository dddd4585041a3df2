//! The `general` leg judges what the model says: greedy answers to general probes, checked without a
//! model. A delta trained to break a few answers is rejected by this leg alone; a delta that only learns a
//! user fact keeps them and passes.

use hearth::eval::{Evaluator, GateConfig, PersonalProbe, ProbeSet, Scores, decide};
use hearth::message::{ChatMessage, Role, Sample};
use hearth::model::{LoraSet, Tokenizer, Transformer};
use hearth::train::{LoraTrainer, TrainConfig};

use crate::train_util::{sft, tiny_with};

/// Shipped general probes the tiny model is taught, with a right and a wrong answer each.
const TAUGHT: &[(&str, &str, &str)] = &[
    ("fact-capital-france", "Paris.", "Lyon."),
    ("fact-planet-red", "Mars.", "Venus."),
    ("add-0", "", ""),
    ("json-ok", "{\"ok\": true}", "ok: yes"),
];

/// The shipped probe set with its general probes cut to [`TAUGHT`] (a tiny random model answers nothing
/// right, so what is served must be taught them first).
fn probes() -> ProbeSet {
    let dir = tempfile::tempdir().unwrap();
    let (mut set, _) = ProbeSet::frozen_for_base(dir.path(), "base", None).unwrap();
    set.general
        .retain(|p| TAUGHT.iter().any(|(id, _, _)| *id == p.id));
    assert_eq!(set.general.len(), TAUGHT.len());
    set
}

/// Training samples answering the taught probes; the first `wrong` of them wrongly.
fn answers(set: &ProbeSet, wrong: usize) -> Vec<Sample> {
    TAUGHT
        .iter()
        .enumerate()
        .map(|(i, (id, right, bad))| {
            let p = set.general.iter().find(|p| p.id == *id).unwrap();
            // The arithmetic probe's answer comes from its own check, so it stays exact.
            let (right, bad) = match &p.check {
                hearth::eval::Check::Number { value, .. } => {
                    (format!("{value}"), format!("{}", value + 3.0))
                }
                _ => ((*right).to_owned(), (*bad).to_owned()),
            };
            let answer = if i < wrong { bad } else { right };
            assert_eq!(p.check.passes(&answer), i >= wrong, "{id}: {answer}");
            sft(id, &p.prompt, &answer)
        })
        .collect()
}

const USER_FACT: (&str, &str) = ("What is my dog called?", "Your dog is called Biscuit.");

fn train(
    m: &Transformer,
    tok: &Tokenizer,
    parent: Option<&LoraSet>,
    data: &[Sample],
    steps: usize,
) -> LoraSet {
    let recipe = TrainConfig {
        rank: 8,
        alpha: 16.0,
        learning_rate: 1e-2,
        warmup_steps: 2,
        steps,
        batch_size: 4,
        max_seq_len: 96,
        replay_fraction: 0.0,
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    let mut tr = LoraTrainer::new(m, tok, recipe, parent).unwrap();
    tr.train_cycle(data, |_| {}).unwrap();
    tr.adapter().unwrap()
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
fn a_delta_that_breaks_general_answers_is_rejected_by_the_general_leg_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let set = probes();
    // Every leg but personalisation and general is loosened: what rejects is the general leg's reading.
    let cfg = GateConfig {
        base_perplexity_tolerance: 100.0,
        qa_tolerance: 1.0,
        behaviour_tolerance: 1.0,
        max_new_tokens: 2,
        general_max_tokens: 12,
        ..GateConfig::default()
    };
    let ev = Evaluator::new(&m, &tok, &set, &cfg);
    let personal = [PersonalProbe {
        prompt: vec![ChatMessage::new(Role::User, USER_FACT.0.to_owned())],
        answer: USER_FACT.1.to_owned(),
    }];
    let fact = sft("fact", USER_FACT.0, USER_FACT.1);

    // What is served: taught the probes' right answers.
    let served = train(&m, &tok, None, &answers(&set, 0), 60);
    let base = ev.score(Some(&served), &personal).unwrap();
    eprintln!(
        "served answers {:?}",
        ev.general_answers(Some(&served)).unwrap()
    );
    assert_eq!(
        (base.general_correct, base.general_total),
        (TAUGHT.len(), TAUGHT.len()),
        "the served delta did not learn the general answers"
    );

    // A candidate that learns the user fact and, with it, wrong answers to two general probes.
    let mut broken_data = answers(&set, 2);
    broken_data.push(fact.clone());
    let broken = train(&m, &tok, Some(&served), &broken_data, 40);
    let cand = ev.score(Some(&broken), &personal).unwrap();
    eprintln!(
        "broken answers {:?}",
        ev.general_answers(Some(&broken)).unwrap()
    );
    assert!(cand.general_correct + 2 <= base.general_correct, "{cand:?}");
    assert_eq!(failed(&cfg, &base, &cand), ["general"]);
    let (legs, _, _) = decide(&cfg, &base, &cand);
    let leg = legs.iter().find(|l| l.name == "general").unwrap();
    assert!(leg.note.contains("fact-capital-france"), "{}", leg.note);
    // The tolerance is read: two answers may be lost net.
    let loose = GateConfig {
        general_tolerance: base.general_correct - cand.general_correct,
        ..cfg.clone()
    };
    assert!(failed(&loose, &base, &cand).is_empty());

    // A candidate trained on what is served's data plus one user fact keeps the answers and passes.
    let mut fact_data = answers(&set, 0);
    fact_data.push(fact);
    let learner = train(&m, &tok, Some(&served), &fact_data, 40);
    let good = ev.score(Some(&learner), &personal).unwrap();
    eprintln!(
        "fact-learner answers {:?}",
        ev.general_answers(Some(&learner)).unwrap()
    );
    assert_eq!(good.general_correct, base.general_correct, "{good:?}");
    assert!(failed(&cfg, &base, &good).is_empty(), "{good:?}");
    // What a user sees: the learner's greedy answer names the dog, what is served does not.
    // What a user sees: the learner's greedy answer names the dog, what is served does not (answers long
    // enough for the tiny model's tokens to reach the name).
    let long = GateConfig {
        general_probes: 0,
        general_max_tokens: 40,
        ..cfg.clone()
    };
    let recalled = |lora: &LoraSet| {
        Evaluator::new(&m, &tok, &set, &long)
            .score(Some(lora), &personal)
            .unwrap()
            .personal_recalled
    };
    assert_eq!((recalled(&served), recalled(&learner)), (0, 1));

    // The scoring options are read: fewer probes answer fewer, no tokens answer nothing right.
    let with = |change: fn(&mut GateConfig)| {
        let mut c = cfg.clone();
        change(&mut c);
        Evaluator::new(&m, &tok, &set, &c)
            .score(Some(&served), &[])
            .unwrap()
    };
    let two = with(|c| c.general_probes = 2);
    assert_eq!((two.general_correct, two.general_total), (2, 2));
    assert_eq!(with(|c| c.general_max_tokens = 0).general_correct, 0);
}

#[test]
fn an_answer_recalls_what_was_taught_by_its_telling_words() {
    use hearth::eval::recalls;
    let q = "What is my dog called?";
    let taught = "Your dog is called Biscuit.";
    assert!(recalls("It is Biscuit, of course.", taught, q));
    assert!(recalls("Your dog is called Biscuit!", taught, q));
    // The question's words and function words are not what was taught.
    assert!(!recalls("Your dog is called Rex.", taught, q));
    assert!(!recalls("I don't know what your dog is called.", taught, q));
    let date = "Your birthday is on the 3rd of May.";
    assert!(recalls("On the 3rd of May.", date, "When is my birthday?"));
    assert!(!recalls("In June.", date, "When is my birthday?"));
    assert!(!recalls("anything", "Yes.", "Is it?"));
}

#[test]
fn the_shipped_general_probes_are_frozen_per_base_beside_the_probe_set() {
    let dir = tempfile::tempdir().unwrap();
    let (a, sha_a) = ProbeSet::frozen_for_base(dir.path(), "b1", None).unwrap();
    assert!(a.general.len() >= 150, "{}", a.general.len());
    assert!(dir.path().join("b1.general.json").exists());
    // The frozen copy is what is read from then on, and the digest covers it.
    let frozen = dir.path().join("b1.general.json");
    let mut file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&frozen).unwrap()).unwrap();
    file["probes"].as_array_mut().unwrap().truncate(3);
    std::fs::write(&frozen, file.to_string()).unwrap();
    let (b, sha_b) = ProbeSet::frozen_for_base(dir.path(), "b1", None).unwrap();
    assert_eq!(b.general.len(), 3);
    assert_ne!(sha_a, sha_b);
    // A probe file that brings its own general probes keeps them; duplicate ids are refused.
    let mut own = a.clone();
    own.general.truncate(1);
    let path = dir.path().join("own.json");
    std::fs::write(&path, serde_json::to_string(&own).unwrap()).unwrap();
    let (c, _) = ProbeSet::frozen_for_base(dir.path(), "b2", Some(&path)).unwrap();
    assert_eq!(c.general, own.general);
    assert!(!dir.path().join("b2.general.json").exists());
    own.general.push(own.general[0].clone());
    let err = ProbeSet::parse(&serde_json::to_string(&own).unwrap(), "own")
        .unwrap_err()
        .to_string();
    assert!(err.contains("appears twice"), "{err}");
}

/// By hand, on a real model (`HEARTH_EVAL_MODEL=PATH.gguf cargo test --test eval -- --ignored
/// general_probes_on --nocapture`): the base's score on the shipped general probes, per check kind, and
/// each wrong answer.
#[test]
#[ignore = "needs a real model: HEARTH_EVAL_MODEL"]
fn general_probes_on_a_real_model() {
    let Ok(path) = std::env::var("HEARTH_EVAL_MODEL") else {
        eprintln!("SKIPPED: set HEARTH_EVAL_MODEL to a GGUF");
        return;
    };
    let (m, tok) = hearth::model::load(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (set, _) = ProbeSet::frozen_for_base(dir.path(), "base", None).unwrap();
    let cfg = GateConfig::default();
    let answers = Evaluator::new(&m, &tok, &set, &cfg)
        .general_answers(None)
        .unwrap();
    let mut kinds: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    for ((id, answer, ok), p) in answers.iter().zip(&set.general) {
        let k = kinds.entry(p.check.kind()).or_default();
        k.0 += usize::from(*ok);
        k.1 += 1;
        if !ok {
            eprintln!("WRONG {id}: {answer:?}");
        }
    }
    let right = answers.iter().filter(|a| a.2).count();
    eprintln!(
        "{path}: {right} of {} right; by kind {kinds:?}",
        answers.len()
    );
}

/// By hand, on a real model (`HEARTH_EVAL_MODEL=PATH.gguf cargo test --test eval -- --ignored
/// a_user_fact_delta_on --nocapture`): a delta trained with the default graph's recipe on a few user
/// facts, and what it loses and gains on the general probes against the base: how noisy the leg is at
/// its default tolerance (none lost net).
#[test]
#[ignore = "needs a real model: HEARTH_EVAL_MODEL"]
fn a_user_fact_delta_on_a_real_model() {
    let Ok(path) = std::env::var("HEARTH_EVAL_MODEL") else {
        eprintln!("SKIPPED: set HEARTH_EVAL_MODEL to a GGUF");
        return;
    };
    let (m, tok) = hearth::model::load(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (set, _) = ProbeSet::frozen_for_base(dir.path(), "base", None).unwrap();
    let facts = [
        ("What is my dog called?", "Your dog is called Biscuit."),
        ("Where do I work?", "You work at the Lindenhof bakery."),
        (
            "When is my birthday?",
            "Your birthday is on the 3rd of May.",
        ),
        (
            "What is my favourite colour?",
            "Your favourite colour is teal.",
        ),
    ];
    let data: Vec<Sample> = facts
        .iter()
        .enumerate()
        .map(|(i, (q, a))| sft(&format!("f{i}"), q, a))
        .collect();
    // graphs/default.ron's recipe.
    let recipe = TrainConfig {
        seed: 1,
        rank: 8,
        alpha: 16.0,
        learning_rate: 2.5e-4,
        warmup_steps: 4,
        steps: 20,
        batch_size: 4,
        max_seq_len: 96,
        dpo_sft_weight: 1.0,
        replay_fraction: 0.5,
        prompt_variants: 2,
        replay_builtin: true,
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    let mut tr = LoraTrainer::new(&m, &tok, recipe, None).unwrap();
    tr.train_cycle(&data, |_| {}).unwrap();
    let delta = tr.adapter().unwrap();
    let cfg = GateConfig::default();
    let ev = Evaluator::new(&m, &tok, &set, &cfg);
    let base = ev.score(None, &[]).unwrap();
    let cand = ev.score(Some(&delta), &[]).unwrap();
    let (legs, _, _) = decide(&cfg, &base, &cand);
    let leg = legs.iter().find(|l| l.name == "general").unwrap();
    eprintln!(
        "{path}: general {} -> {} of {}, passed {}: {}",
        base.general_correct, cand.general_correct, cand.general_total, leg.passed, leg.note
    );
}

/// With a GPU scorer (the emulated device here) the likelihood legs run its forward over the same weights:
/// the scores the CPU gives, but for the odd token whose int8 input the two paths round apart (one in about
/// fifty moves by up to 1e-2 nats, the rest by 1e-6), so means agree to 2e-3; a scorer over another model's
/// weights gives other scores, so they come from it.
#[test]
fn the_likelihood_legs_score_on_the_device_they_are_given() {
    use hearth::gpu::{Device, Gpu};
    use hearth::model::{GpuModel, GpuTrainer};
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let set = probes();
    let cfg = GateConfig {
        general_max_tokens: 4,
        ..GateConfig::default()
    };
    let served = train(&m, &tok, None, &answers(&set, 0), 30);
    let personal: Vec<PersonalProbe> = TAUGHT
        .iter()
        .map(|(id, right, _)| PersonalProbe {
            prompt: vec![ChatMessage::new(Role::User, format!("probe {id}"))],
            answer: if right.is_empty() {
                "4".into()
            } else {
                (*right).into()
            },
        })
        .collect();
    let gpu = Gpu::open(Device::Emulated).unwrap();
    let scorer_over = |model: &Transformer| {
        let weights = GpuModel::new(&gpu, model, model.max_positions()).unwrap();
        std::sync::Mutex::new(GpuTrainer::new(std::sync::Arc::new(weights)).unwrap())
    };
    let scorer = scorer_over(&m);
    let on_cpu = Evaluator::new(&m, &tok, &set, &cfg);
    let on_gpu = Evaluator::new(&m, &tok, &set, &cfg).with_scorer(Some(&scorer));
    let close = |what: &str, a: f64, b: f64| {
        assert!(
            (a - b).abs() <= 2e-3 * b.abs().max(1.0),
            "{what}: {a} on the device, {b} on the CPU"
        );
    };
    for lora in [None, Some(&served)] {
        let (g, c) = (
            on_gpu.score(lora, &personal).unwrap(),
            on_cpu.score(lora, &personal).unwrap(),
        );
        close("base perplexity", g.base_perplexity, c.base_perplexity);
        close("personal NLL", g.personal_nll, c.personal_nll);
        close("qa accuracy", g.qa_accuracy, c.qa_accuracy);
        close(
            "canary exposure",
            g.canary_exposure_bits,
            c.canary_exposure_bits,
        );
    }
    let other_dir = tempfile::tempdir().unwrap();
    let mut spec = hearth::model::TinySpec::new(hearth::model::Arch::Llama);
    spec.dtype = candle_core::quantized::GgmlDType::Q8_0;
    spec.tied_embeddings = false;
    spec.seed += 1;
    let path = other_dir.path().join("other.gguf");
    hearth::model::write_tiny_model(&path, &spec).unwrap();
    let other = Transformer::from_gguf(&path).unwrap();
    let wrong = scorer_over(&other);
    let misled = Evaluator::new(&m, &tok, &set, &cfg).with_scorer(Some(&wrong));
    let (w, c) = (
        misled.personal_nll(None, &personal).unwrap().0,
        on_cpu.personal_nll(None, &personal).unwrap().0,
    );
    assert!(
        (w - c).abs() > 1e-3,
        "{w} from other weights, {c} from the model's"
    );
}

/// What the device cannot run is judged on the CPU rather than failing the verdict: a DoRA delta's likelihoods
/// (the scorer is training's forward, which has no DoRA step; the decoder answers with it as the CPU does).
#[test]
fn a_delta_the_device_cannot_run_is_judged_on_the_cpu() {
    use hearth::gpu::{Device, Gpu};
    use hearth::model::{GpuDecoder, GpuTrainer, LoraConfig, LoraTarget};
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let set = probes();
    let cfg = GateConfig {
        general_max_tokens: 4,
        ..GateConfig::default()
    };
    let mut lora_cfg = LoraConfig::new(4, 8.0, &[LoraTarget::Q, LoraTarget::Up]);
    lora_cfg.use_dora = true;
    let dora = LoraSet::fresh(&m, lora_cfg, 2).unwrap();
    let gpu = Gpu::open(Device::Emulated).unwrap();
    let dec = GpuDecoder::new(&gpu, &m, m.max_positions(), None).unwrap();
    let scorer = std::sync::Mutex::new(GpuTrainer::new(dec.model().clone()).unwrap());
    let dec = std::sync::Mutex::new(dec);
    let on_cpu = Evaluator::new(&m, &tok, &set, &cfg);
    let on_gpu = Evaluator::new(&m, &tok, &set, &cfg)
        .with_gpu(Some(&dec))
        .with_scorer(Some(&scorer));
    let personal = vec![PersonalProbe {
        prompt: vec![ChatMessage::new(Role::User, "what is my cat called")],
        answer: "Miso.".into(),
    }];
    assert_eq!(
        on_gpu.general_answers(Some(&dora)).unwrap(),
        on_cpu.general_answers(Some(&dora)).unwrap()
    );
    assert_eq!(
        on_gpu.personal_nll(Some(&dora), &personal).unwrap(),
        on_cpu.personal_nll(Some(&dora), &personal).unwrap()
    );
}

/// With a GPU decoder (the emulated device here) the general leg's answers are generated on it, as a server on
/// that device answers: a delta taught the probes passes them there as on the CPU, the broken one fails the
/// same two, and the base (no adapter, after both) answers as it did before them.
#[test]
fn the_general_leg_generates_on_the_device_it_is_given() {
    use hearth::gpu::{Device, Gpu};
    let dir = tempfile::tempdir().unwrap();
    let (_, m, tok) = tiny_with(dir.path(), false);
    let set = probes();
    let cfg = GateConfig {
        general_max_tokens: 12,
        ..GateConfig::default()
    };
    let served = train(&m, &tok, None, &answers(&set, 0), 60);
    let broken = train(&m, &tok, Some(&served), &answers(&set, 2), 40);
    let gpu = Gpu::open(Device::Emulated).unwrap();
    let dec = std::sync::Mutex::new(hearth::model::GpuDecoder::new(&gpu, &m, 256, None).unwrap());
    let on_cpu = Evaluator::new(&m, &tok, &set, &cfg);
    let on_gpu = Evaluator::new(&m, &tok, &set, &cfg).with_gpu(Some(&dec));
    let passed = |ev: &Evaluator, lora: Option<&LoraSet>| -> Vec<bool> {
        let a = ev.general_answers(lora).unwrap();
        eprintln!("{a:?}");
        a.into_iter().map(|(_, _, ok)| ok).collect()
    };
    let base_before = on_gpu.general_answers(None).unwrap();
    // The answers came from the decoder: it holds the last one's positions.
    assert!(!dec.lock().unwrap().is_empty());
    assert_eq!(passed(&on_gpu, Some(&served)), vec![true; TAUGHT.len()]);
    assert_eq!(
        passed(&on_gpu, Some(&broken)),
        passed(&on_cpu, Some(&broken))
    );
    assert_eq!(
        passed(&on_gpu, Some(&broken))
            .iter()
            .filter(|ok| !**ok)
            .count(),
        2
    );
    assert_eq!(on_gpu.general_answers(None).unwrap(), base_before);

    // The eval node's `device` reaches the settings; the default is the CPU.
    let s: hearth::actors::eval::EvalParams = ron::from_str("(device: \"emulated\")").unwrap();
    assert_eq!(s.device, Device::Emulated);
    assert_eq!(
        hearth::actors::eval::EvalParams::default().device,
        Device::Cpu
    );
}
