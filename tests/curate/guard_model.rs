//! The `model` guard backend end to end: a tiny model, trained here by hearth's own trainer to answer the
//! Qwen3Guard-Gen moderation prompt with verdict lines, judges samples through hearth's model path; the
//! verdicts are parsed, the policy drops what carries PII, and the backend runs as a graph node.

use std::path::Path;

use hearth::curate::guard::{
    GuardBackend, GuardDecision, GuardPolicy, ModelGuard, Severity, moderation_prompt,
};
use hearth::engine::start;
use hearth::message::{ChatMessage, Origin, Provenance, Sample, SampleContent};
use hearth::model::{Arch, TinySpec, write_tiny_model};
use hearth::train::{LoraTrainer, TrainConfig};

const DISCLOSURES: &[&str] = &[
    "my passport number is written on the card in my bag",
    "here is my passport scan so you can fill in the visa form",
    "copy my passport details into the hotel booking",
];
const BENIGN: &[&str] = &[
    "what time does the museum open on sundays",
    "suggest a name for a small grey cat",
    "how do i reverse a list in python",
];
const UNSAFE: &str = "Safety: Unsafe\nCategories: PII";
const SAFE: &str = "Safety: Safe\nCategories: None";
const SAFE_RESPONSE: &str = "Safety: Safe\nCategories: None\nRefusal: No";
const ANSWER: &str = "sure, here you go";

fn sft(id: usize, request: String, verdict: &str) -> Sample {
    Sample {
        id: format!("g{id}"),
        user: "guard-trainer".into(),
        origin: Origin::Grounded,
        content: SampleContent::Sft {
            prompt: vec![ChatMessage {
                role: hearth::message::Role::User,
                content: request,
            }],
            response: verdict.into(),
        },
        provenance: Provenance::default(),
        created_at_unix_ms: 0,
    }
}

/// Trains a guard adapter on the tiny model and saves it next to the base.
fn train_guard(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut spec = TinySpec::new(Arch::Llama);
    spec.tied_embeddings = false;
    // The moderation prompt is ~1,500 characters; the tiny tokenizer spends about one token on each.
    spec.context_length = 4096;
    let base = dir.join("guard.gguf");
    write_tiny_model(&base, &spec).unwrap();
    let (model, tok) = hearth::model::load(&base).unwrap();
    let mut samples = Vec::new();
    for (i, p) in DISCLOSURES.iter().chain(BENIGN).enumerate() {
        let verdict = if DISCLOSURES.contains(p) {
            UNSAFE
        } else {
            SAFE
        };
        samples.push(sft(2 * i, moderation_prompt(p, None), verdict));
        samples.push(sft(
            2 * i + 1,
            moderation_prompt(p, Some(ANSWER)),
            SAFE_RESPONSE,
        ));
    }
    let cfg = TrainConfig {
        rank: 16,
        alpha: 32.0,
        learning_rate: 1e-2,
        warmup_steps: 2,
        steps: 60,
        batch_size: 4,
        max_seq_len: 4096,
        replay_fraction: 0.0,
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    let mut tr = LoraTrainer::new(&model, &tok, cfg, None).unwrap();
    let report = tr.train_cycle(&samples, |_| {}).unwrap();
    eprintln!(
        "guard training loss {:?} -> {:?}",
        report.first_loss(),
        report.last_loss()
    );
    let adapter = dir.join("guard-adapter");
    tr.adapter()
        .unwrap()
        .save_peft(&adapter, model.config())
        .unwrap();
    (base, adapter)
}

#[test]
fn a_trained_generative_guard_gates_samples_through_the_model_path() {
    let dir = tempfile::tempdir().unwrap();
    let (base, adapter) = train_guard(dir.path());
    let guard = ModelGuard::load(&base, Some(&adapter), 64).unwrap();
    let policy = GuardPolicy::default();
    for p in DISCLOSURES {
        let v = guard.classify(p, ANSWER).unwrap();
        assert_eq!(v.prompt.severity, Severity::Unsafe, "{p}: {v:?}");
        assert_eq!(
            v.prompt.categories,
            vec![hearth::curate::guard::Category::Pii],
            "{p}"
        );
        assert_eq!(v.response.refusal, Some(false), "{p}: {v:?}");
        assert!(
            matches!(policy.decide(&v), GuardDecision::Drop { .. }),
            "{p}: {v:?}"
        );
    }
    for p in BENIGN {
        let v = guard.classify(p, ANSWER).unwrap();
        assert_eq!(v.prompt.severity, Severity::Safe, "{p}: {v:?}");
        assert_eq!(policy.decide(&v), GuardDecision::Admit, "{p}: {v:?}");
    }
    // The untrained base does not speak the format: its answer is an error, never a silent "safe".
    let untrained = ModelGuard::load(&base, None, 64).unwrap();
    assert!(untrained.classify(BENIGN[0], ANSWER).is_err());

    // The same backend as a graph node, chosen in the graph file.
    let src = format!(
        r#"Graph(name: "guard-model", nodes: [
            (id: "gen", kind: Generate(count: 3)),
            (id: "guard", kind: Guard(backend: Model(model: "{}", adapter: "{}", max_new_tokens: 64))),
            (id: "sink", kind: Blackhole()),
            (id: "decisions", kind: JsonlSink(path: "{}")),
        ], edges: [
            (from: "gen.out", to: "guard.in", capacity: 4),
            (from: "guard.out", to: "sink.in", capacity: 4),
            (from: "guard.decisions", to: "decisions.decisions", capacity: 4),
        ])"#,
        base.display(),
        adapter.display(),
        dir.path().join("decisions.jsonl").display()
    );
    let graph = hearth::actors::ActorKind::graph(&src).unwrap_or_else(|e| panic!("{e:#?}"));
    let report = start(graph, Some(&dir.path().join("data"))).unwrap().wait();
    let node = report
        .status
        .nodes
        .iter()
        .find(|n| n.id == "guard")
        .unwrap();
    assert_eq!((node.processed, node.errors), (3, 0), "{report:#?}");
    // The generated samples are unlike anything the guard was trained on: whatever it could not answer in
    // the verdict format is quarantined (fails closed), and nothing vanishes: every sample is in one place.
    let sink = report.status.nodes.iter().find(|n| n.id == "sink").unwrap();
    let decisions = std::fs::read_to_string(dir.path().join("decisions.jsonl")).unwrap_or_default();
    assert_eq!(
        sink.processed + decisions.lines().count() as u64,
        3,
        "{decisions}"
    );
    for line in decisions.lines() {
        assert!(line.contains("guard: "), "{line}");
    }
}
