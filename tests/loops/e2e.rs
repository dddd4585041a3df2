//! The three loops end to end: the shipped main graph (graphs/default.ron), pointed at a tiny model the test
//! writes, with the scripted users. It must capture and curate everything, train a delta, have the eval gate
//! promote it with a measured personalisation gain, hot-swap it into the served model through the feedback
//! edge, keep every planted value out of the training set, and leave the base byte-identical; rollback walks
//! the served state back exactly, and a verdict cannot promote bytes it was not computed on.

use crate::http_util;
use crate::train_util;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use hearth::engine::start;
use hearth::report::Report;
use hearth::store::{DeltaStatus, Store};
use hearth::train::data::{is_held_out, select_training};
use hearth::train::data_digest;
use http_util::get;

const ROUNDS: usize = 12;

/// The shipped main graph with the tiny model on every model node, an ephemeral port, no control server,
/// and fewer, faster scripted rounds.
fn main_graph(model: &Path) -> String {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/default.ron"))
            .unwrap();
    let m = model.display();
    let mut out = src.clone();
    for (from, to) in [
        (
            r#"Serve(listen: "127.0.0.1:8080","#.to_owned(),
            format!(r#"Serve(model: "{m}", listen: "127.0.0.1:0","#),
        ),
        (
            "Simulate(rounds: 50, interval_ms: 200)".to_owned(),
            format!("Simulate(rounds: {ROUNDS}, interval_ms: 0)"),
        ),
        (
            "Trainer(min_samples".to_owned(),
            format!(r#"Trainer(model: "{m}", min_samples"#),
        ),
        (
            "Eval(gate".to_owned(),
            format!(r#"Eval(model: "{m}", gate"#),
        ),
        (r#", control: "127.0.0.1:9090""#.to_owned(), String::new()),
        // The shipped probe reads the default model only and refuses the tiny one: the builtin guard.
        (
            "Guard(backend: Probe()".to_owned(),
            "Guard(backend: Builtin".to_owned(),
        ),
    ] {
        assert!(
            out.contains(&from),
            "graphs/default.ron no longer contains `{from}`"
        );
        out = out.replace(&from, &to);
    }
    out
}

fn logits(model: &hearth::model::Transformer, ids: &[u32]) -> Vec<f32> {
    let t = Tensor::new(ids, &candle_core::Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    model
        .forward(&t, None, None)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn the_main_graph_learns_from_simulated_users_and_promotes_a_delta() {
    let dir = tempfile::tempdir().unwrap();
    let (model_path, model, tok) = train_util::tiny_with(dir.path(), false);
    let base_sha = hearth::train::sha256_file(&model_path).unwrap();
    let probe_ids = tok.encode("Which editor do I prefer?", false).unwrap();
    let base_logits = logits(&model, &probe_ids);
    let data = dir.path().join("data");

    let graph = hearth::actors::ActorKind::graph(&main_graph(&model_path))
        .unwrap_or_else(|e| panic!("{e:#?}"));
    let planted: Vec<String> = graph
        .plan
        .nodes
        .iter()
        .flat_map(|n| n.factory.planted())
        .collect();
    let running = start(graph, Some(&data)).unwrap();
    let stop = running.stop_flag();

    // Wait for the gate to promote a delta and the serve node to swap it in (through the feedback edge).
    let addr_file = hearth::actors::serve::addr_file(&data, "serve");
    let deadline = Instant::now() + Duration::from_secs(150);
    let swapped = loop {
        if Instant::now() > deadline {
            let store = Store::open(&data).unwrap();
            let r = Report::build(&store, &planted).unwrap();
            panic!(
                "no delta promoted and served in time:\n{}\n{:#?}",
                r.to_markdown(),
                running.status().snapshot()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
        let Ok(addr) = std::fs::read_to_string(&addr_file).map(|a| a.trim().parse::<SocketAddr>())
        else {
            continue;
        };
        let Ok(store) = Store::open(&data) else {
            continue;
        };
        let Some(served) = store.served().unwrap().delta_id else {
            continue;
        };
        let models = get(addr.unwrap(), "/v1/models");
        if models["data"][0]["default_adapter"] == served.as_str() {
            break served;
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Release);
    let run = running.wait();
    assert!(run.failed_nodes.is_empty(), "{:?}", run.failed_nodes);

    let mut store = Store::open(&data).unwrap();
    let report = Report::build(&store, &planted).unwrap();
    eprintln!("{}", report.to_markdown());
    // Nothing lost: every captured item reached exactly one terminal state.
    let c = &report.curation;
    assert!(c.interactions >= 10 && c.feedback >= 8, "{c:?}");
    assert_eq!(c.pending, 0, "{c:?}");
    assert_eq!(
        c.admitted + c.dropped + c.quarantined,
        c.interactions + c.feedback,
        "{c:?}"
    );
    // Privacy: nothing planted in the training set, and the promoted delta does not leak the canaries.
    assert!(planted.len() >= 5);
    assert_eq!(
        report.planted_in_training_set, 0,
        "{:?}",
        report.planted_found_prefixes
    );
    assert_eq!(report.promoted_canary_leaks, 0);
    // The promoted delta: every leg passed and personalisation improved on held-out prompts.
    let promoted = store.delta(&swapped).unwrap().unwrap();
    let verdict = promoted.verdict.clone().unwrap();
    assert_eq!(verdict["promote"], true, "{verdict:#}");
    assert!(
        verdict["personal_gain"].as_f64().unwrap() > 0.0,
        "{verdict:#}"
    );
    assert!(
        verdict["candidate"]["personal_probes"].as_u64().unwrap() > 0,
        "{verdict:#}"
    );
    assert!(
        promoted.legs.len() >= 6 && promoted.legs.iter().all(|l| l.passed),
        "{:?}",
        promoted.legs
    );
    assert_eq!(verdict["base_sha256"], base_sha.as_str());
    assert_eq!(verdict["data_digest"], promoted.data_digest.as_str());
    // What the delta trained on is exactly the first samples the store admitted, less the held-out prompts
    // (the personalisation probes) and the self-generated samples over the collapse guard's share.
    let recipe = &promoted.provenance["recipe"];
    let given = promoted.provenance["num_samples"].as_u64().unwrap() as usize;
    let admitted = store.training_set().unwrap();
    let selection = select_training(
        &admitted[..given],
        recipe["holdout_fraction"].as_f64().unwrap(),
        recipe["max_self_generated_share"].as_f64().unwrap(),
    );
    assert_eq!(data_digest(&selection.train), promoted.data_digest);
    assert!(
        selection
            .train
            .iter()
            .all(|s| !is_held_out(s, recipe["holdout_fraction"].as_f64().unwrap()))
    );

    // Bounded forgetting: the base file is byte-identical and its logits unchanged with the adapter off.
    assert_eq!(hearth::train::sha256_file(&model_path).unwrap(), base_sha);
    let (reloaded, _) = hearth::model::load(&model_path).unwrap();
    assert_eq!(
        logits(&reloaded, &probe_ids),
        base_logits,
        "base logits changed"
    );

    // Rollback walks back through every promotion to the base alone, then has nothing left to undo.
    let promotions = store
        .deltas()
        .unwrap()
        .iter()
        .filter(|d| d.promoted_at_unix_ms.is_some())
        .count();
    let mut steps = 0;
    while let Some(state) = store.rollback("test").unwrap() {
        steps += 1;
        assert!(steps <= promotions, "rollback does not terminate");
        if state.delta_id.is_none() {
            break;
        }
    }
    assert_eq!(store.served().unwrap().delta_id, None);
    assert_eq!(
        store.delta(&swapped).unwrap().unwrap().status,
        DeltaStatus::RolledBack
    );
    assert!(store.rollback("again").unwrap().is_none());

    // The verdict promotes exactly the bytes it judged: re-promoting works, a tampered adapter is refused.
    hearth::eval::promote_checked(&mut store, &swapped, "test").unwrap();
    assert_eq!(
        store.served().unwrap().delta_id.as_deref(),
        Some(swapped.as_str())
    );
    store.rollback("test").unwrap();
    let weights = Path::new(&promoted.path).join("adapter_model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&weights, bytes).unwrap();
    let err = hearth::eval::promote_checked(&mut store, &swapped, "test").unwrap_err();
    assert!(err.to_string().contains("adapter file changed"), "{err}");
    assert_eq!(store.served().unwrap().delta_id, None);
    drop(store);

    // The same through the command line a person uses.
    let hearth = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(args)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, list) = hearth(&["deltas", "list"]);
    assert!(
        ok && list.contains(&swapped)
            && list.contains("rolled_back")
            && list.contains("serving the base alone"),
        "{list}"
    );
    let (ok, show) = hearth(&["deltas", "show", &swapped]);
    assert!(ok && show.contains("\"personalisation\""), "{show}");
    let (ok, refused) = hearth(&["deltas", "promote", &swapped]);
    assert!(!ok && refused.contains("adapter file changed"), "{refused}");
    let (ok, none) = hearth(&["deltas", "rollback"]);
    assert!(ok && none.contains("nothing to roll back"), "{none}");
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["deltas", "list", "--data-dir"])
        .arg(dir.path().join("no-such-dir"))
        .output()
        .unwrap();
    assert!(
        !missing.status.success()
            && String::from_utf8_lossy(&missing.stderr).contains("no hearth store")
    );
    assert!(
        !dir.path().join("no-such-dir").exists(),
        "a read command created a store"
    );
    let (ok, json) = hearth(&["report", "--json"]);
    let report: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert!(ok && !report["deltas"].as_array().unwrap().is_empty());
}
