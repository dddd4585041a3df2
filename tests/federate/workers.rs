//! Federation across processes on loopback: `hearth coordinator` and four `hearth run` workers, each training a
//! real tiny delta through the trainer and contributing it through the `federate` actor; a fifth worker killed
//! while it trains (the round closes by quorum without it); the coordinator killed with SIGKILL and restarted
//! mid-round (it resumes from its persisted state and the workers retry); a Byzantine participant pushing huge
//! values (the trimmed mean bounds the aggregate). The aggregate every worker writes as a local delta equals an
//! independent computation from the bytes each worker kept of what it sent.

use crate::train_util;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hearth::federate::client::{Client, PushOutcome};
use hearth::federate::wire::{self, Tensor, WireMode};
use hearth::federate::worker::WorkerState;
use hearth::train::Provenance;

const RANK: usize = 64;
const ALPHA: f64 = 32.0;
const HONEST: [&str; 4] = ["w0", "w1", "w2", "w3"];
const KILLED: &str = "w4";
const BYZANTINE: &str = "mallory";

fn secret(worker: &str) -> String {
    format!("secret-of-{worker}")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `hearth coordinator` and waits for its "listening" line.
fn coordinator(settings: &Path) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .arg("coordinator")
        .arg(settings)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = String::new();
    loop {
        let Some(Ok(line)) = lines.next() else {
            panic!("coordinator exited before listening:\n{seen}");
        };
        if line.contains("coordinator listening on") {
            break;
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    // Keep draining stderr so the coordinator never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    child
}

/// `step_sleep_ms` paces training, so a worker can be killed while it is surely still training.
fn worker_graph(
    dir: &Path,
    base: &Path,
    port: u16,
    worker: &str,
    seed: u64,
    step_sleep_ms: u64,
) -> PathBuf {
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("\"{worker} asks question {i} about owls and rivers\""))
        .collect();
    let src = format!(
        r#"Graph(name: "federated-{worker}", nodes: [
            (id: "gen", kind: Generate(count: 6, prompts: [{prompts}], user: "{worker}")),
            (id: "trainer", kind: Trainer(model: "{base}", min_samples: 6, await_verdict: false, train: (
                steps: 3, batch_size: 2, rank: {RANK}, alpha: {ALPHA}, max_seq_len: 48, seed: {seed},
                learning_rate: 0.01, warmup_steps: 0, step_sleep_ms: {step_sleep_ms}))),
            (id: "federate", kind: Federate(coordinator: "127.0.0.1:{port}", worker: "{worker}",
                retry_secs: 60, aggregate_timeout_secs: 120)),
        ], edges: [
            (from: "gen.out", to: "trainer.samples", capacity: 8),
            (from: "trainer.deltas", to: "federate.deltas", capacity: 2),
        ])"#,
        prompts = prompts.join(", "),
        base = base.display(),
    );
    let path = dir.join(format!("{worker}.ron"));
    std::fs::write(&path, src).unwrap();
    path
}

fn spawn_worker(dir: &Path, graph: &Path, worker: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["run", "--data-dir"])
        .arg(dir.join(worker))
        .arg(graph)
        .env(
            hearth::federate::coordinator::secret_env_var(worker),
            secret(worker),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{worker}.log"))).unwrap())
        .spawn()
        .unwrap()
}

fn log(dir: &Path, worker: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{worker}.log"))).unwrap_or_default()
}

fn state(dir: &Path, worker: &str) -> Option<WorkerState> {
    let p = dir.join(worker).join("federate/federate/state.json");
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

/// Waits until `worker` has had a push accepted (its persisted round counter moved on).
fn wait_pushed(dir: &Path, worker: &str) {
    let t0 = Instant::now();
    while state(dir, worker).is_none_or(|s| s.next_round == 0) {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "{worker} never pushed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_exit(child: &mut Child, what: &str) {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{what} exited with {status}");
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "{what} did not finish"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Row-major ΔW = scale·B·A of one module, in f64.
fn delta_w(state: &[Tensor], module: &str, scale: f64) -> Vec<f64> {
    let find = |f: char| {
        state
            .iter()
            .find(|t| t.name == format!("{module}.lora_{f}.weight"))
            .unwrap_or_else(|| panic!("{module} lora_{f}"))
    };
    let (a, b) = (find('A'), find('B'));
    let (r, n_in, n_out) = (a.shape[0], a.shape[1], b.shape[0]);
    let mut w = vec![0f64; n_out * n_in];
    for o in 0..n_out {
        for k in 0..r {
            let bk = scale * b.data[o * r + k] as f64;
            for i in 0..n_in {
                w[o * n_in + i] += bk * a.data[k * n_in + i] as f64;
            }
        }
    }
    w
}

/// The trimmed mean of five values per coordinate with beta 0.2: drop the lowest and the highest.
fn trimmed_mean(inputs: &[Vec<f64>]) -> Vec<f64> {
    (0..inputs[0].len())
        .map(|j| {
            let mut v: Vec<f64> = inputs.iter().map(|x| x[j]).collect();
            v.sort_by(f64::total_cmp);
            v[1..v.len() - 1].iter().sum::<f64>() / (v.len() - 2) as f64
        })
        .collect()
}

fn frob(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}

#[test]
fn workers_in_separate_processes_train_and_federate_through_kills_and_a_byzantine_peer() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (base, _, _) = train_util::tiny(root);
    let port = free_port();
    let mut names: Vec<&str> = HONEST.to_vec();
    names.extend([KILLED, BYZANTINE]);
    let secrets = root.join("secrets");
    std::fs::write(
        &secrets,
        names
            .iter()
            .map(|w| format!("{w}={}\n", secret(w)))
            .collect::<String>(),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let scale = ALPHA / RANK as f64;
    let settings = root.join("coordinator.ron");
    std::fs::write(
        &settings,
        format!(
            r#"(bind: "127.0.0.1:{port}", mode: native, workers: [{}], aggregation: "trimmed:0.2",
                exact_lora: (scale: {scale}, rank: {RANK}), quorum: 5, round_timeout_secs: 6,
                long_poll_secs: 2, state_dir: "{}", secrets_file: "{}")"#,
            names
                .iter()
                .map(|w| format!("\"{w}\""))
                .collect::<Vec<_>>()
                .join(", "),
            root.join("coordinator-state").display(),
            secrets.display(),
        ),
    )
    .unwrap();
    let graphs: Vec<PathBuf> = names[..5]
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let pace = if *w == KILLED { 60_000 } else { 0 };
            worker_graph(root, &base, port, w, i as u64 + 1, pace)
        })
        .collect();

    let mut co = coordinator(&settings);
    let mut workers: Vec<Child> = (0..2)
        .map(|i| spawn_worker(root, &graphs[i], HONEST[i]))
        .collect();
    wait_pushed(root, "w0");
    wait_pushed(root, "w1");

    // The Byzantine participant (this process) pushes huge values under its own, valid name.
    let sent_w0 = wire::decode_safetensors(
        &std::fs::read(root.join("w0/federate/federate/sent/round-0.bin")).unwrap(),
    )
    .unwrap();
    let huge: Vec<Tensor> = sent_w0
        .iter()
        .map(|t| Tensor::new(t.name.clone(), t.shape.clone(), vec![1e4; t.data.len()]))
        .collect();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mallory = Client::new(addr, BYZANTINE, secret(BYZANTINE), WireMode::Native);
    assert_eq!(mallory.push(0, &huge).unwrap(), PushOutcome::Accepted);

    // The coordinator dies mid-round (three of six arrived) and comes back on the same port.
    co.kill().unwrap();
    co.wait().unwrap();
    let mut co = coordinator(&settings);

    // Two more honest workers, and one killed while it trains: the round closes by quorum without it.
    for i in 2..4 {
        workers.push(spawn_worker(root, &graphs[i], HONEST[i]));
    }
    let mut killed = spawn_worker(root, &graphs[4], KILLED);
    // Its trainer sleeps a minute between steps: a second in, it is mid-training.
    std::thread::sleep(Duration::from_secs(1));
    killed.kill().unwrap();
    killed.wait().unwrap();
    for (w, name) in workers.iter_mut().zip(HONEST) {
        wait_exit(w, name);
    }
    assert!(state(root, KILLED).is_none(), "the killed worker pushed");

    // The coordinator's record of the round.
    let metrics = hearth::federate::client::http_request(
        addr,
        "GET",
        "/v1/metrics",
        &[],
        b"",
        Duration::from_secs(5),
    )
    .unwrap();
    let m: serde_json::Value = serde_json::from_slice(&metrics.body).unwrap();
    let round0 = &m["rounds"][0];
    assert_eq!(round0["round"], 0, "{m}");
    assert_eq!(round0["missing"], serde_json::json!([KILLED]), "{m}");
    assert_eq!(round0["included"].as_array().unwrap().len(), 5, "{m}");
    co.kill().unwrap();
    co.wait().unwrap();

    // Every honest worker wrote the same aggregate as a local delta whose parent is its own delta.
    let mut aggregate_bytes = None;
    let mut sent = Vec::new();
    for w in HONEST {
        let st = state(root, w).unwrap();
        assert_eq!(st.next_round, 1);
        let record = &st.history[0];
        let agg_id = record
            .aggregate_delta
            .clone()
            .unwrap_or_else(|| panic!("{w} has no aggregate delta:\n{}", log(root, w)));
        let agg_dir = root.join(w).join("deltas").join(&agg_id);
        let prov: Provenance =
            serde_json::from_slice(&std::fs::read(agg_dir.join("provenance.json")).unwrap())
                .unwrap();
        assert_eq!(prov.parent.as_deref(), Some(record.sent_delta.as_str()));
        assert_eq!(prov.metrics["federation"]["round"], 0);
        assert_eq!(prov.base_sha256, hearth::train::sha256_file(&base).unwrap());
        let bytes = std::fs::read(agg_dir.join("adapter_model.safetensors")).unwrap();
        match &aggregate_bytes {
            None => aggregate_bytes = Some(bytes),
            Some(b) => assert_eq!(b, &bytes, "{w} wrote a different aggregate"),
        }
        // What left the device is the worker's own delta, bit for bit (no DP configured).
        let blob = std::fs::read(root.join(w).join("federate/federate/sent/round-0.bin")).unwrap();
        assert_eq!(hearth::train::sha256_hex(&blob), record.sent_sha256);
        let own = std::fs::read(
            root.join(w)
                .join("deltas")
                .join(&record.sent_delta)
                .join("adapter_model.safetensors"),
        )
        .unwrap();
        assert_eq!(
            wire::decode_safetensors(&blob).unwrap(),
            wire::decode_safetensors(&own).unwrap()
        );
        sent.push(wire::decode_safetensors(&blob).unwrap());
        // The aggregate is a valid adapter for the base.
        let (model, _) = hearth::model::load(&base).unwrap();
        hearth::model::LoraSet::load_peft(&agg_dir, model.config()).unwrap();
    }
    sent.push(huge);

    // Independent computation: the trimmed mean of the five ΔW = scale·B·A, per module. The exact aggregation
    // re-factors at rank 64 >= every module's smaller side, so nothing is truncated: only bf16 rounding differs.
    let aggregate = wire::decode_safetensors(aggregate_bytes.as_ref().unwrap()).unwrap();
    let modules: Vec<String> = aggregate
        .iter()
        .filter_map(|t| t.name.strip_suffix(".lora_A.weight").map(str::to_owned))
        .collect();
    assert_eq!(modules.len(), 2 * 7, "every linear kind of both layers");
    let mut honest_max = 0f64;
    for module in &modules {
        let inputs: Vec<Vec<f64>> = sent.iter().map(|s| delta_w(s, module, scale)).collect();
        for x in &inputs[..4] {
            honest_max = honest_max.max(x.iter().fold(0f64, |m, v| m.max(v.abs())));
        }
        let reference = trimmed_mean(&inputs);
        let got = delta_w(&aggregate, module, scale);
        let diff: Vec<f64> = got.iter().zip(&reference).map(|(a, b)| a - b).collect();
        let rel = frob(&diff) / frob(&reference).max(1e-12);
        assert!(
            rel < 2e-2,
            "{module}: aggregate differs from the reference by {rel}"
        );
        // The Byzantine values (1e8 per ΔW coordinate) are trimmed away.
        let top = got.iter().fold(0f64, |m, v| m.max(v.abs()));
        assert!(
            top <= 1.05 * honest_max,
            "{module}: |ΔW| {top} exceeds honest {honest_max}"
        );
    }
}

/// The `federate` actor's options, each shown to act: `tls_ca` (the coordinator speaks only HTTPS), `secret_file`
/// (the secret it signs with), `dp` (what leaves is clipped and noised, and ε is accounted and persisted) and the
/// wire `mode`.
#[test]
fn federate_actor_talks_tls_signs_with_its_secret_file_and_privatises_what_it_sends() {
    use hearth::federate::coordinator::{Coordinator, CoordinatorConfig, ExactLora, Secrets};
    use hearth::federate::tls::ServerTls;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (base, _, _) = train_util::tiny(root);
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (root.join("cert.pem"), root.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let secret_file = root.join("alice.secret");
    std::fs::write(&secret_file, "alice-secret\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let start = |secret: &str| {
        let mut cfg = CoordinatorConfig::new(
            "127.0.0.1:0",
            WireMode::Native,
            vec!["alice".to_owned()],
            Secrets::from_pairs([("alice".to_owned(), secret.as_bytes().to_vec())]),
        );
        cfg.quorum = 1;
        cfg.long_poll = Duration::from_secs(2);
        cfg.exact_lora = Some(ExactLora {
            scale: 2.0,
            rank: 4,
        });
        cfg.tls = Some(ServerTls {
            cert: cert.clone(),
            key: key.clone(),
        });
        Coordinator::start(cfg).unwrap()
    };
    let graph = |port: u16, data: &str, dp: &str, retry: f64| {
        let src = format!(
            r#"Graph(name: "alice", nodes: [
                (id: "gen", kind: Generate(count: 4)),
                (id: "trainer", kind: Trainer(model: "{base}", min_samples: 4, await_verdict: false, train: (
                    steps: 2, batch_size: 2, rank: 4, alpha: 8.0, max_seq_len: 48, seed: 5, learning_rate: 0.01))),
                (id: "federate", kind: Federate(coordinator: "localhost:{port}", worker: "alice",
                    secret_file: "{secret}", tls_ca: "{cert}", retry_secs: {retry}, aggregate_timeout_secs: 30{dp})),
            ], edges: [
                (from: "gen.out", to: "trainer.samples", capacity: 8),
                (from: "trainer.deltas", to: "federate.deltas", capacity: 2),
            ])"#,
            base = base.display(),
            secret = secret_file.display(),
            cert = cert.display(),
        );
        let g = hearth::actors::ActorKind::graph(&src).unwrap_or_else(|e| panic!("{e:#?}"));
        let data = root.join(data);
        let report = hearth::engine::runtime::start(g, Some(&data))
            .unwrap()
            .wait();
        let errors = report
            .status
            .nodes
            .iter()
            .find(|n| n.id == "federate")
            .unwrap()
            .errors;
        (data, errors)
    };
    let sent = |data: &Path| {
        let st: WorkerState = serde_json::from_slice(
            &std::fs::read(data.join("federate/federate/state.json")).unwrap(),
        )
        .unwrap();
        let blob = std::fs::read(data.join("federate/federate/sent/round-0.bin")).unwrap();
        let own = std::fs::read(
            data.join("deltas")
                .join(&st.history[0].sent_delta)
                .join("adapter_model.safetensors"),
        )
        .unwrap();
        (
            st,
            wire::decode_safetensors(&blob).unwrap(),
            wire::decode_safetensors(&own).unwrap(),
        )
    };

    // Without DP: over TLS, signed with the file's secret; what left is the delta itself.
    let co = start("alice-secret");
    let (data, errors) = graph(co.addr.port(), "plain", "", 30.0);
    assert_eq!(errors, 0);
    let (st, out, own) = sent(&data);
    assert_eq!(out, own);
    assert!(st.accountant.is_none() && st.history[0].dp.is_none());
    // The aggregate, promoted as received, would not be sent back; the trained delta would.
    let delta_at = |id: &str| hearth::message::Delta {
        id: id.to_owned(),
        path: data.join("deltas").join(id).display().to_string(),
        base_sha256: String::new(),
        recipe_sha256: String::new(),
        data_digest: String::new(),
        parent: None,
    };
    let aggregate_id = st.history[0].aggregate_delta.clone().expect("aggregate");
    assert!(hearth::federate::worker::is_aggregate(&delta_at(
        &aggregate_id
    )));
    assert!(!hearth::federate::worker::is_aggregate(&delta_at(
        &st.history[0].sent_delta
    )));
    co.stop();

    // With DP: the update is clipped to the norm and noised; ε is recorded and persisted.
    let co = start("alice-secret");
    let dp = ", dp: (clip_norm: 0.05, noise_multiplier: 1.0, delta: 1e-5, seed: 9)";
    let (data, errors) = graph(co.addr.port(), "dp", dp, 30.0);
    assert_eq!(errors, 0);
    let (st, out, own) = sent(&data);
    assert_ne!(out, own);
    let report = st.history[0].dp.clone().expect("dp report");
    assert!(report.clipped && report.norm_before > 0.05, "{report:?}");
    assert!(report.epsilon > 0.0);
    assert_eq!(st.accountant.as_ref().map(|a| a.rounds), Some(1));
    co.stop();

    // A coordinator that knows another secret refuses the worker: the round fails and the node says so.
    let co = start("not-alice-secret");
    let (data, errors) = graph(co.addr.port(), "wrong-secret", "", 30.0);
    assert_eq!(errors, 1);
    assert!(!data.join("federate/federate/state.json").exists());
    co.stop();

    // A CA file that is not PEM: the node fails at start (and never sends in the clear).
    std::fs::write(root.join("not-a-cert.pem"), "hello").unwrap();
    let src = format!(
        r#"Graph(name: "bad", nodes: [
            (id: "gen", kind: Generate(count: 1)),
            (id: "trainer", kind: Trainer(model: "{}")),
            (id: "federate", kind: Federate(coordinator: "localhost:1", worker: "alice",
                secret_file: "{}", tls_ca: "{}")),
        ], edges: [
            (from: "gen.out", to: "trainer.samples", capacity: 8),
            (from: "trainer.deltas", to: "federate.deltas", capacity: 2),
        ])"#,
        base.display(),
        secret_file.display(),
        root.join("not-a-cert.pem").display()
    );
    let g = hearth::actors::ActorKind::graph(&src).unwrap();
    let report = hearth::engine::runtime::start(g, Some(&root.join("bad")))
        .unwrap()
        .wait();
    let node = report
        .status
        .nodes
        .iter()
        .find(|n| n.id == "federate")
        .unwrap();
    assert!(node.errors + node.restarts >= 1, "{report:#?}");
    assert!(!root.join("bad/federate/federate/state.json").exists());
    // The error names the node and the file.
    let (file, _) = hearth::engine::schema::GraphFile::parse(&src).unwrap();
    let Some(hearth::actors::ActorKind::Federate(params)) = file
        .nodes
        .into_iter()
        .find(|n| n.value.id == "federate")
        .map(|n| n.value.kind)
    else {
        panic!("no federate node")
    };
    let e = params
        .open("federate", &root.join("bad"))
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("`federate`") && e.contains("not-a-cert.pem"),
        "{e}"
    );
}

#[test]
fn the_example_coordinator_settings_parse() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/coordinator.ron"
    ))
    .unwrap();
    let s: hearth::federate::coordinator::CoordinatorSettings =
        hearth::engine::schema::ron_options()
            .from_str(&text)
            .unwrap();
    assert_eq!(s.workers.len(), 4);
    assert!(s.exact_lora.is_some() && s.tls.is_none());
}

/// The remaining `federate` options, each shown to act on a contribution: `retry_secs` (how long an unreachable
/// coordinator is retried), `tls_server_name` (the name the certificate must carry when the address is an IP),
/// `aggregate_timeout_secs` (how long the aggregate is awaited) and `mode` (the wire dialect).
#[test]
fn federate_options_retry_server_name_aggregate_timeout_and_mode_each_act() {
    use hearth::actors::federate::FederateParams;
    use hearth::federate::client::ClientError;
    use hearth::federate::coordinator::{Coordinator, CoordinatorConfig, Secrets};
    use hearth::federate::tls::ServerTls;
    use hearth::federate::worker::WorkerError;
    use hearth::model::{LoraConfig, LoraPair, LoraSet, LoraTarget};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (base, model, _) = train_util::tiny(root);
    // A small trained-looking delta (random B), written as the trainer writes one.
    let fresh = LoraSet::fresh(&model, LoraConfig::new(4, 8.0, &LoraTarget::ALL), 1).unwrap();
    let mut set = LoraSet::empty(fresh.config.clone());
    for (&(l, t), p) in fresh.iter() {
        let b =
            candle_core::Tensor::randn(0f32, 0.05, p.b.dims(), &candle_core::Device::Cpu).unwrap();
        set.insert(l, t, LoraPair::new(p.a.clone(), b, p.scale));
    }
    let prov = Provenance {
        delta_id: String::new(),
        base_sha256: hearth::train::sha256_file(&base).unwrap(),
        recipe_sha256: "r".into(),
        recipe: train_util::fast_cfg(),
        data_digest: "d".into(),
        num_samples: 1,
        parent: None,
        seed: 1,
        metrics: serde_json::json!({}),
        created_at_unix_ms: 0,
    };
    let delta =
        hearth::train::save_delta(&root.join("deltas"), &set, model.config(), prov).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (root.join("cert.pem"), root.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let start = |mode: WireMode, workers: &[&str], tls: bool| {
        let names: Vec<String> = workers.iter().map(|w| (*w).to_owned()).collect();
        let mut cfg = CoordinatorConfig::new(
            "127.0.0.1:0",
            mode,
            names.clone(),
            Secrets::from_pairs(names.iter().map(|w| (w.clone(), b"s".to_vec()))),
        );
        cfg.quorum = names.len();
        cfg.long_poll = Duration::from_millis(300);
        cfg.tls = tls.then(|| ServerTls {
            cert: cert.clone(),
            key: key.clone(),
        });
        Coordinator::start(cfg).unwrap()
    };
    // SAFETY of set_var: this test is the only one in the process reading this variable.
    unsafe { std::env::set_var(hearth::federate::coordinator::secret_env_var("alice"), "s") };
    let params = |addr: String| FederateParams {
        coordinator: addr,
        worker: "alice".to_owned(),
        secret_file: None,
        mode: WireMode::Native,
        tls_ca: None,
        tls_server_name: None,
        dp: None,
        aggregate_timeout_secs: 30.0,
        retry_secs: 0.0,
    };
    let contribute = |p: &FederateParams, data: &str| {
        let mut w = p.open("federate", &root.join(data)).unwrap();
        let t = Instant::now();
        (w.contribute(&delta), t.elapsed())
    };

    // retry_secs: nothing listens on the port; 0 gives up at once, 1.5 keeps trying that long.
    // Port 1 (tcpmux) is never served here; a port freed by `free_port` could be taken again by
    // another test's ephemeral bind.
    let closed = "127.0.0.1:1".to_owned();
    let (r, fast) = contribute(&params(closed.clone()), "retry0");
    assert!(
        matches!(r, Err(WorkerError::Client(ClientError::Io(_)))),
        "{r:?}"
    );
    let (r, slow) = contribute(
        &FederateParams {
            retry_secs: 1.5,
            ..params(closed)
        },
        "retry15",
    );
    assert!(r.is_err());
    assert!(
        fast < Duration::from_secs(1) && slow >= Duration::from_millis(1500),
        "{fast:?} {slow:?}"
    );

    // tls_server_name: the certificate names `localhost`; reached by IP, the name must be given.
    let co = start(WireMode::Native, &["alice"], true);
    let by_ip = FederateParams {
        tls_ca: Some(cert.clone()),
        ..params(co.addr.to_string())
    };
    let (r, _) = contribute(&by_ip, "tls-ip");
    assert!(
        matches!(r, Err(WorkerError::Client(ClientError::Tls(_)))),
        "{r:?}"
    );
    let named = FederateParams {
        tls_server_name: Some("localhost".to_owned()),
        ..by_ip
    };
    let (r, _) = contribute(&named, "tls-named");
    assert!(r.is_ok(), "{r:?}");
    co.stop();

    // aggregate_timeout_secs: a second worker never comes, so the round never closes.
    let co = start(WireMode::Native, &["alice", "bob"], false);
    let waiting = FederateParams {
        aggregate_timeout_secs: 1.0,
        ..params(co.addr.to_string())
    };
    let (r, waited) = contribute(&waiting, "timeout");
    assert!(
        matches!(r, Err(WorkerError::Client(ClientError::NotReady(0)))),
        "{r:?}"
    );
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    co.stop();

    // mode: a gym coordinator takes the gym dialect (its blob, no nonce in the signature) and refuses native.
    let co = start(WireMode::Gym, &["alice"], false);
    let (r, _) = contribute(&params(co.addr.to_string()), "native-to-gym");
    assert!(
        matches!(
            r,
            Err(WorkerError::Client(ClientError::Status {
                status: 400..=499,
                ..
            }))
        ),
        "{r:?}"
    );
    let gym = FederateParams {
        mode: WireMode::Gym,
        ..params(co.addr.to_string())
    };
    let (r, _) = contribute(&gym, "gym");
    assert!(r.is_ok(), "{r:?}");
    co.stop();
}
