//! `requantize` is honoured by every node that loads the base (serve, trainer, eval): they share one base in
//! the form they name, the trainer trains over that form, and a graph whose nodes disagree is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use hearth::actors::eval::EvalParams;
use hearth::actors::serve::ServeParams;
use hearth::actors::trainer::TrainerParams;
use hearth::actors::{ActorKind, Graph};
use hearth::engine::runtime::start;
use hearth::model::transformer::Weight;
use hearth::model::{Arch, Base, BaseCache, LoraTarget, TinySpec, write_tiny_model};

/// A tiny Llama stored as Q4_0, which `Requantize::Q8_0` re-encodes.
fn q4_model(dir: &Path) -> PathBuf {
    let mut spec = TinySpec::new(Arch::Llama);
    spec.dtype = GgmlDType::Q4_0;
    let path = dir.join("q4.gguf");
    write_tiny_model(&path, &spec).unwrap();
    path
}

/// The storage type of every projection of the base (one type when they all agree).
fn weight_types(base: &Base) -> Vec<GgmlDType> {
    let mut types: Vec<GgmlDType> = base
        .model
        .blocks()
        .iter()
        .flat_map(|b| {
            LoraTarget::ALL.map(|t| match b.linear(t).weight() {
                Weight::Quant(q) => q.dtype(),
                Weight::Panels(p) => p.dtype(),
                Weight::Dense(_) => GgmlDType::F32,
            })
        })
        .collect();
    types.dedup();
    types
}

fn params(kind: &str, model: &Path, requantize: &str) -> ActorKind {
    let src = format!(
        r#"Graph(name: "g", nodes: [(id: "n", kind: {kind}(model: "{}", requantize: {requantize}))], edges: [])"#,
        model.display()
    );
    let file = hearth::engine::schema::GraphFile::<ActorKind>::parse(&src)
        .unwrap_or_else(|e| panic!("{e:#?}"))
        .0;
    file.nodes.into_iter().next().unwrap().value.kind
}

/// Serve, trainer and eval load their base through the functions below (the actors call them); with the same
/// `model` and `requantize` they get one base, in that form; changing `requantize` on the trainer or the gate
/// changes what it loads.
#[test]
fn serve_trainer_and_gate_share_one_base_in_the_form_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let model = q4_model(dir.path());
    let data = dir.path().join("data");
    let bases = Arc::new(BaseCache::default());
    let load = |requantize: &str| -> [Arc<Base>; 3] {
        let ActorKind::Serve(serve) = params("Serve", &model, requantize) else {
            unreachable!()
        };
        let ActorKind::Trainer(trainer) = params("Trainer", &model, requantize) else {
            unreachable!()
        };
        let ActorKind::Eval(eval) = params("Eval", &model, requantize) else {
            unreachable!()
        };
        let (serve, trainer, eval): (ServeParams, TrainerParams, EvalParams) =
            (serve, trainer, eval);
        [
            serve.base(&data, &bases).unwrap(),
            trainer.base_source(&data, bases.clone())().unwrap(),
            eval.base(&data, &bases).unwrap(),
        ]
    };
    let [s, t, e] = load("Q8_0");
    assert!(Arc::ptr_eq(&s, &t) && Arc::ptr_eq(&s, &e), "one base");
    assert_eq!(weight_types(&s), [GgmlDType::Q8_0]);
    let [s_off, t_off, e_off] = load("Off");
    assert!(Arc::ptr_eq(&s_off, &t_off) && Arc::ptr_eq(&s_off, &e_off));
    assert_eq!(weight_types(&t_off), [GgmlDType::Q4_0]);
    assert_eq!(weight_types(&e_off), [GgmlDType::Q4_0]);
    assert!(!Arc::ptr_eq(&t, &t_off) && !Arc::ptr_eq(&e, &e_off));
    // Both forms bind to the file: deltas trained over either are for the same base.
    assert_eq!(s.sha256, s_off.sha256);
    assert_eq!(bases.len(), 2);
}

fn graph(model: &Path, serve: &str, trainer: &str, eval: &str) -> Result<Graph, String> {
    let m = model.display();
    let src = format!(
        r#"Graph(name: "g", nodes: [
            (id: "serve", kind: Serve(model: "{m}"{serve})),
            (id: "trainer", kind: Trainer(model: "{m}"{trainer})),
            (id: "eval", kind: Eval(model: "{m}"{eval})),
            (id: "gen", kind: Generate(count: 1)),
        ], edges: [
            (from: "gen.out", to: "trainer.samples", capacity: 4),
            (from: "trainer.deltas", to: "eval.candidates", capacity: 4),
            (from: "eval.promoted", to: "serve.deltas", capacity: 4, feedback: true),
        ])"#
    );
    ActorKind::graph(&src).map_err(|errors| {
        errors
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.at.map(|l| l.to_string()).unwrap_or_default(),
                    e.message
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}

#[test]
fn a_graph_whose_nodes_hold_one_base_in_two_forms_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    let q8 = ", requantize: Q8_0";
    for form in [q8, ""] {
        if let Err(e) = graph(&model, form, form, form) {
            panic!("{e}");
        }
    }
    let Err(err) = graph(&model, q8, "", q8) else {
        panic!("two forms accepted")
    };
    assert!(
        err.starts_with("3:")
            && err.contains("node `trainer`: requantize: Off differs from node `serve`'s Q8_0"),
        "{err}"
    );
    let Err(err) = graph(&model, q8, q8, "") else {
        panic!("two forms accepted")
    };
    assert!(
        err.starts_with("4:") && err.contains("node `eval`"),
        "{err}"
    );
    // The default model (no `model`) counts as one model too.
    let src = r#"Graph(name: "g", nodes: [
        (id: "serve", kind: Serve(requantize: Q8_0)),
        (id: "trainer", kind: Trainer()),
        (id: "gen", kind: Generate(count: 1)),
    ], edges: [(from: "gen.out", to: "trainer.samples", capacity: 4)])"#;
    let Err(err) = ActorKind::graph(src) else {
        panic!("two forms of the default model accepted")
    };
    assert!(err[0].message.contains("the default model"), "{err:?}");
    // Another model may be held in another form.
    let other = dir.path().join("other.gguf");
    let src = format!(
        r#"Graph(name: "g", nodes: [
        (id: "serve", kind: Serve(model: "{}", requantize: Q8_0)),
        (id: "trainer", kind: Trainer(model: "{}")),
        (id: "gen", kind: Generate(count: 1)),
    ], edges: [(from: "gen.out", to: "trainer.samples", capacity: 4)])"#,
        model.display(),
        other.display()
    );
    if let Err(e) = ActorKind::graph(&src) {
        panic!("{e:?}");
    }
    // The reconcile node judges merges over the base too.
    let reconcile = |form: &str| {
        ActorKind::graph(&format!(
            r#"Graph(name: "g", nodes: [
            (id: "trainer", kind: Trainer(model: "{m}", requantize: Q8_0)),
            (id: "eval", kind: Eval(model: "{m}", requantize: Q8_0)),
            (id: "reconcile", kind: Reconcile(model: "{m}"{form})),
            (id: "gen", kind: Generate(count: 1)),
        ], edges: [
            (from: "gen.out", to: "trainer.samples", capacity: 4),
            (from: "trainer.deltas", to: "eval.candidates", capacity: 4),
            (from: "eval.promoted", to: "reconcile.deltas", capacity: 4),
        ])"#,
            m = model.display()
        ))
    };
    let Err(err) = reconcile("") else {
        panic!("a reconcile node holding another form accepted")
    };
    assert!(err[0].message.contains("node `reconcile`"), "{err:?}");
    if let Err(e) = reconcile(", requantize: Q8_0") {
        panic!("{e:?}");
    }
}

/// The trainer trains over the form it names: the same samples and seed give another delta over the
/// requantized weights, and the same delta again over the same form.
#[test]
fn the_trainer_trains_over_the_requantized_base() {
    let dir = tempfile::tempdir().unwrap();
    let model = q4_model(dir.path());
    let adapter = |run: &str, requantize: &str| -> Vec<u8> {
        let data = dir.path().join(run);
        let src = format!(
            r#"Graph(name: "train", nodes: [
                (id: "gen", kind: Generate(count: 4)),
                (id: "trainer", kind: Trainer(model: "{}", requantize: {requantize}, min_samples: 4,
                    await_verdict: false, train: (steps: 2, batch_size: 2, rank: 2, max_seq_len: 64, seed: 3))),
            ], edges: [(from: "gen.out", to: "trainer.samples", capacity: 8)])"#,
            model.display()
        );
        let graph = ActorKind::graph(&src).unwrap_or_else(|e| panic!("{e:#?}"));
        let report = start(graph, Some(&data)).expect("start").wait();
        let node = report
            .status
            .nodes
            .iter()
            .find(|n| n.id == "trainer")
            .unwrap();
        assert_eq!(node.errors, 0, "{report:#?}");
        let deltas: Vec<_> = std::fs::read_dir(data.join("deltas"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(deltas.len(), 1, "{deltas:?}");
        std::fs::read(deltas[0].join("adapter_model.safetensors")).unwrap()
    };
    let off = adapter("off", "Off");
    assert_eq!(
        off,
        adapter("off_again", "Off"),
        "training is deterministic"
    );
    assert_ne!(
        off,
        adapter("q8", "Q8_0"),
        "requantize changes the trained delta"
    );
}
