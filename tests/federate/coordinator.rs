//! Coordinator over loopback: auth rejections (tampered, stale, replayed, impersonated, oversized), quorum with a
//! worker that never arrives, stragglers joining the next round, restart mid-round, a Byzantine worker among
//! several client threads, and native mode with exact LoRA aggregation and DP clients.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hearth::federate::aggregate::Method;
use hearth::federate::client::{Client, PushOutcome, http_request};
use hearth::federate::coordinator::{
    Coordinator, CoordinatorConfig, ExactLora, Secrets, secret_env_var,
};
use hearth::federate::dp::{DpConfig, DpEngine};
use hearth::federate::hmac_auth;
use hearth::federate::wire::{self, Rounding, Tensor, WireMode};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("w{i}")).collect()
}

fn secrets(ws: &[String]) -> Secrets {
    Secrets::from_pairs(
        ws.iter()
            .map(|w| (w.clone(), format!("secret-of-{w}").into_bytes())),
    )
}

fn config(n: usize, mode: WireMode) -> CoordinatorConfig {
    let ws = names(n);
    let mut c = CoordinatorConfig::new("127.0.0.1:0", mode, ws.clone(), secrets(&ws));
    c.quorum = n;
    c.round_timeout = Duration::from_secs(60);
    c.long_poll = Duration::from_secs(10);
    c
}

fn client(c: &Coordinator, w: &str, mode: WireMode) -> Client {
    let mut cl = Client::new(c.addr, w, format!("secret-of-{w}").into_bytes(), mode);
    cl.timeout = Duration::from_secs(30);
    cl
}

fn delta(seed: u64, n: usize) -> Vec<Tensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    vec![
        Tensor::new(
            "B",
            vec![n / 4, 4],
            (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
        ),
        Tensor::new("A", vec![3], vec![1.0, 2.0, 3.0]),
    ]
}

fn reason(r: &hearth::federate::client::Response) -> String {
    r.header("X-Hearth-Auth-Error").unwrap_or("").to_owned()
}

#[test]
fn replay_tampered_stale_impersonated_and_oversized_requests_are_rejected() {
    let mut cfg = config(3, WireMode::Gym);
    cfg.max_body_bytes = 64 * 1024;
    let co = Coordinator::start(cfg).unwrap();
    let w1 = client(&co, "w1", WireMode::Gym);
    let w2 = client(&co, "w2", WireMode::Gym);
    let blob = wire::encode_gym(&delta(1, 64), Rounding::Truncate).unwrap();
    let path = "/v1/round/0/worker/w1";
    let now = hmac_auth::unix_now();
    let t = Duration::from_secs(10);

    // Tampered body: signed for one blob, another sent.
    let h = w1.auth_headers("PUT", path, now, &blob);
    let mut tampered = blob.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let r = http_request(co.addr, "PUT", path, &h, &tampered, t).unwrap();
    assert_eq!((r.status, reason(&r).as_str()), (401, "signature"));
    assert!(r.body.is_empty(), "bad auth answers an empty body, as gym");

    // Stale timestamp (301 s old), correctly signed.
    let h = w1.auth_headers("PUT", path, now - 301, &blob);
    let r = http_request(co.addr, "PUT", path, &h, &blob, t).unwrap();
    assert_eq!((r.status, reason(&r).as_str()), (401, "stale"));

    // Replay: the same signed request twice.
    let h = w1.auth_headers("PUT", path, now, &blob);
    assert_eq!(
        http_request(co.addr, "PUT", path, &h, &blob, t)
            .unwrap()
            .status,
        200
    );
    let r = http_request(co.addr, "PUT", path, &h, &blob, t).unwrap();
    assert_eq!((r.status, reason(&r).as_str()), (401, "replay"));

    // w2, correctly signed with its own secret, pushing under w1's name.
    let r = w2.signed("PUT", path, &blob).unwrap();
    assert_eq!(r.status, 403);

    // Unknown worker.
    let ghost = Client::new(co.addr, "ghost", b"x".to_vec(), WireMode::Gym);
    let r = ghost
        .signed("PUT", "/v1/round/0/worker/ghost", &blob)
        .unwrap();
    assert_eq!((r.status, reason(&r).as_str()), (401, "unknown_worker"));

    // Body over the limit.
    let big = wire::encode_gym(&delta(2, 40_000), Rounding::Truncate).unwrap();
    let r = w2.signed("PUT", "/v1/round/0/worker/w2", &big).unwrap();
    assert_eq!(r.status, 413);

    // Not a blob; a layout different from the round's.
    let r = w2
        .signed("PUT", "/v1/round/0/worker/w2", b"garbage")
        .unwrap();
    assert_eq!(r.status, 422);
    let other = wire::encode_gym(&delta(3, 32), Rounding::Truncate).unwrap();
    assert_eq!(
        w2.signed("PUT", "/v1/round/0/worker/w2", &other)
            .unwrap()
            .status,
        422
    );

    // Public endpoints without auth; protected ones refuse.
    assert_eq!(
        http_request(co.addr, "GET", "/v1/healthz", &[], b"", t)
            .unwrap()
            .status,
        200
    );
    let topo = w1.topology().unwrap();
    assert_eq!(topo["aggregation"], "byzantine_robust");
    assert_eq!(topo["workers"].as_array().unwrap().len(), 3);
    assert_eq!(
        http_request(co.addr, "GET", "/v1/round/0/aggregate", &[], b"", t)
            .unwrap()
            .status,
        401
    );
    co.stop();
}

#[test]
fn quorum_closes_round_without_missing_worker_and_straggler_joins_next_round() {
    let mut cfg = config(3, WireMode::Gym);
    cfg.quorum = 2;
    cfg.round_timeout = Duration::from_millis(800);
    let co = Coordinator::start(cfg).unwrap();
    let [w1, w2, w3] = ["w1", "w2", "w3"].map(|w| client(&co, w, WireMode::Gym));
    let t0 = Instant::now();
    assert_eq!(w1.push(0, &delta(1, 64)).unwrap(), PushOutcome::Accepted);
    assert_eq!(w2.push(0, &delta(2, 64)).unwrap(), PushOutcome::Accepted);
    // w3 never arrives: the long-poll returns once the deadline passes with a quorum.
    let agg = w1.aggregate(0, Duration::from_secs(10)).unwrap();
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // Two workers (< 4): plain mean, truncated to bf16.
    let (a, b) = (delta(1, 64), delta(2, 64));
    for (i, &g) in agg[0].data.iter().enumerate() {
        let want = (wire::bf16_to_f32(wire::f32_to_bf16_trunc(a[0].data[i]))
            + wire::bf16_to_f32(wire::f32_to_bf16_trunc(b[0].data[i])))
            / 2.0;
        assert_eq!(g, wire::bf16_to_f32(wire::f32_to_bf16_trunc(want)));
    }
    let m: serde_json::Value = serde_json::from_slice(
        &http_request(
            co.addr,
            "GET",
            "/v1/metrics",
            &[],
            b"",
            Duration::from_secs(5),
        )
        .unwrap()
        .body,
    )
    .unwrap();
    assert_eq!(m["rounds"][0]["missing"], serde_json::json!(["w3"]));
    assert_eq!(m["rounds"][0]["timed_out"], true);
    // The straggler is told the round closed and where to go; it can still fetch round 0's aggregate.
    assert_eq!(
        w3.push(0, &delta(3, 64)).unwrap(),
        PushOutcome::RoundClosed { next_round: 1 }
    );
    assert_eq!(w3.aggregate(0, Duration::from_secs(5)).unwrap(), agg);
    // Round 1 with everyone closes as soon as the last one arrives (no deadline wait, no polling).
    w1.push(1, &delta(4, 64)).unwrap();
    w2.push(1, &delta(5, 64)).unwrap();
    // Timed from before the spawn, so that a thread that starts late on a loaded machine does
    // not look like a GET answered early.
    let waiter = {
        let w1 = w1.clone();
        let t = Instant::now();
        std::thread::spawn(move || {
            w1.aggregate(1, Duration::from_secs(10)).unwrap();
            t.elapsed()
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let t_push = Instant::now();
    w3.push(1, &delta(6, 64)).unwrap();
    let woke = waiter.join().unwrap();
    assert!(
        woke >= Duration::from_millis(150),
        "the GET was held: {woke:?}"
    );
    // The coordinator holds a GET for 10 s (long_poll); 3 s leaves room for a loaded machine.
    assert!(
        t_push.elapsed() < Duration::from_secs(3),
        "woken by the notify, not a poll"
    );
    w1.end(1, 0.5, 100).unwrap();
    co.stop();
}

/// Independent f64 computation of gym's byzantine_robust over bf16-decoded inputs, truncated to bf16.
fn reference_robust(inputs: &[Vec<f32>]) -> Vec<f32> {
    let n = inputs.len();
    (0..inputs[0].len())
        .map(|i| {
            let mut col: Vec<f64> = inputs.iter().map(|v| v[i] as f64).collect();
            col.sort_by(f64::total_cmp);
            let kept = if n >= 4 { &col[1..n - 1] } else { &col[..] };
            let m = kept.iter().sum::<f64>() / kept.len() as f64;
            wire::bf16_to_f32(wire::f32_to_bf16_trunc(m as f32))
        })
        .collect()
}

#[test]
fn byzantine_worker_among_client_threads_is_bounded_and_honest_aggregate_matches_reference() {
    let co = Coordinator::start(config(5, WireMode::Gym)).unwrap();
    let addr = co.addr;
    let rounds = 2u64;
    let handles: Vec<_> = names(5)
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            std::thread::spawn(move || {
                let mut cl = Client::new(
                    addr,
                    w.clone(),
                    format!("secret-of-{w}").into_bytes(),
                    WireMode::Gym,
                );
                cl.timeout = Duration::from_secs(30);
                let mut got = Vec::new();
                for r in 0..rounds {
                    let mut d = delta(100 * r + i as u64, 4096);
                    if i == 4 {
                        d[0].data.iter_mut().for_each(|x| *x = 1e30); // Byzantine
                    }
                    assert_eq!(cl.push(r, &d).unwrap(), PushOutcome::Accepted);
                    got.push(cl.aggregate(r, Duration::from_secs(20)).unwrap());
                }
                got
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for r in 0..rounds as usize {
        let inputs: Vec<Vec<f32>> = (0..5)
            .map(|i| {
                let mut d = delta(100 * r as u64 + i as u64, 4096);
                if i == 4 {
                    d[0].data.iter_mut().for_each(|x| *x = 1e30);
                }
                d[0].data
                    .iter()
                    .map(|&x| wire::bf16_to_f32(wire::f32_to_bf16_trunc(x)))
                    .collect()
            })
            .collect();
        let want = reference_robust(&inputs);
        for res in &results {
            assert_eq!(
                res[r], results[0][r],
                "every worker sees the same aggregate"
            );
        }
        let got = &results[0][r][0].data;
        assert!(
            got.iter().all(|x| x.abs() <= 1.0),
            "trimmed mean bounds the Byzantine worker"
        );
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= w.abs() / 128.0, "{g} vs {w}");
        }
        assert_eq!(results[0][r][1].data, vec![1.0, 2.0, 3.0]);
    }
    co.stop();
}

#[test]
fn restart_mid_round_resumes_from_persisted_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(3, WireMode::Gym);
    cfg.state_dir = Some(dir.path().to_path_buf());
    let co = Coordinator::start(cfg.clone()).unwrap();
    client(&co, "w1", WireMode::Gym)
        .push(0, &delta(1, 64))
        .unwrap();
    client(&co, "w2", WireMode::Gym)
        .push(0, &delta(2, 64))
        .unwrap();
    co.stop();
    assert!(dir.path().join("state.json").exists());
    let co = Coordinator::start(cfg.clone()).unwrap();
    let w3 = client(&co, "w3", WireMode::Gym);
    w3.push(0, &delta(3, 64)).unwrap();
    let agg = w3.aggregate(0, Duration::from_secs(10)).unwrap();
    let inputs: Vec<Vec<f32>> = (1..=3)
        .map(|s| {
            delta(s, 64)[0]
                .data
                .iter()
                .map(|&x| wire::bf16_to_f32(wire::f32_to_bf16_trunc(x)))
                .collect()
        })
        .collect();
    assert_eq!(agg[0].data, reference_robust(&inputs));
    co.stop();
    // And the finished round survives another restart; round 1 is the one open.
    let co = Coordinator::start(cfg).unwrap();
    let w1 = client(&co, "w1", WireMode::Gym);
    assert_eq!(w1.aggregate(0, Duration::from_secs(5)).unwrap(), agg);
    assert_eq!(
        w1.push(0, &delta(9, 64)).unwrap(),
        PushOutcome::RoundClosed { next_round: 1 }
    );
    co.stop();
}

#[test]
fn native_mode_exact_lora_with_dp_clients() {
    let (r, n_in, n_out) = (4, 16, 12);
    let mut cfg = config(3, WireMode::Native);
    cfg.exact_lora = Some(ExactLora {
        scale: 2.0,
        rank: r,
    });
    cfg.aggregation = Method::Mean;
    cfg.data_weights = Some(HashMap::from([
        ("w1".into(), 0.5),
        ("w2".into(), 0.25),
        ("w3".into(), 0.25),
    ]));
    let co = Coordinator::start(cfg).unwrap();
    let a_key = wire::peft_lora_key(0, "self_attn.q_proj", 'A');
    let b_key = wire::peft_lora_key(0, "self_attn.q_proj", 'B');
    let handles: Vec<_> = (1..=3)
        .map(|i| {
            let cl = client(&co, &format!("w{i}"), WireMode::Native);
            let (a_key, b_key) = (a_key.clone(), b_key.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(i);
                let d = vec![
                    Tensor::new(
                        a_key,
                        vec![r, n_in],
                        (0..r * n_in)
                            .map(|_| rng.random_range(-0.1f32..0.1))
                            .collect(),
                    ),
                    Tensor::new(
                        b_key,
                        vec![n_out, r],
                        (0..n_out * r)
                            .map(|_| rng.random_range(-0.1f32..0.1))
                            .collect(),
                    ),
                ];
                let mut dp = DpEngine::new(DpConfig {
                    clip_norm: 1.0,
                    noise_multiplier: 1.0,
                    delta: 1e-5,
                    epsilon_budget: Some(10.0),
                    seed: i,
                })
                .unwrap();
                let (out, rep) = cl.push_private(0, d, &mut dp).unwrap();
                assert_eq!(out, PushOutcome::Accepted);
                assert!(rep.epsilon > 0.0 && rep.epsilon < 10.0);
                // Two GETs in the same second are distinct thanks to the signed nonce.
                let x = cl.aggregate_blob(0, Duration::from_secs(10)).unwrap();
                let y = cl.aggregate_blob(0, Duration::from_secs(10)).unwrap();
                assert_eq!(x, y);
                x
            })
        })
        .collect();
    let blobs: Vec<Vec<u8>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let st = safetensors::SafeTensors::deserialize(&blobs[0]).unwrap();
    assert_eq!(st.tensor(&a_key).unwrap().shape(), &[r, n_in]);
    assert_eq!(st.tensor(&b_key).unwrap().dtype(), safetensors::Dtype::BF16);
    let (_, meta) = safetensors::SafeTensors::read_metadata(&blobs[0]).unwrap();
    let residual: f64 = meta.metadata().as_ref().unwrap()["hearth.lora_max_residual"]
        .parse()
        .unwrap();
    assert!(
        residual > 0.0 && residual < 1.0,
        "three rank-4 updates re-factored to rank 4: {residual}"
    );
    // A worker sending a different rank (which would blow up the re-factoring SVD) is refused at ingress.
    let wrong = vec![
        Tensor::new(a_key.clone(), vec![64, n_in], vec![0.0; 64 * n_in]),
        Tensor::new(b_key.clone(), vec![n_out, 64], vec![0.0; n_out * 64]),
    ];
    let blob = wire::encode(WireMode::Native, &wrong).unwrap();
    let w1 = client(&co, "w1", WireMode::Native);
    assert_eq!(
        w1.signed("PUT", "/v1/round/1/worker/w1", &blob)
            .unwrap()
            .status,
        422
    );
    co.stop();
}

#[test]
fn secrets_come_from_a_private_file_or_the_environment() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("secrets");
    std::fs::write(&p, "# workers\nw1=alpha\nw2 = beta\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        Secrets::from_file(&p).is_err(),
        "world-readable secrets are refused"
    );
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let s = Secrets::from_file(&p).unwrap();
    assert!(!format!("{s:?}").contains("alpha"), "Debug redacts");
    let var = secret_env_var("edge-node.1");
    assert_eq!(var, "HEARTH_FEDERATE_SECRET_EDGE_NODE_1");
    // SAFETY: this test is the only one touching this variable.
    unsafe { std::env::set_var(&var, "gamma") };
    assert!(Secrets::from_env(&["edge-node.1".to_owned()]).is_ok());
    assert!(Secrets::from_env(&["nobody".to_owned()]).is_err());
}

#[test]
fn settings_from_a_graph_file_refuse_inline_secrets() {
    use hearth::federate::coordinator::{CoordinatorSettings, parse_aggregation};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("secrets");
    std::fs::write(&p, "a=1\nb=2\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let json = serde_json::json!({
        "bind": "127.0.0.1:0", "mode": "gym", "workers": ["a", "b"], "aggregation": "trimmed:0.2",
        "quorum": 1, "round_timeout_secs": 5.0, "secrets_file": p,
    });
    let s: CoordinatorSettings = serde_json::from_value(json.clone()).unwrap();
    let c = s.into_config().unwrap();
    assert_eq!(c.aggregation, Method::Trimmed { beta: 0.2 });
    assert_eq!(c.round_timeout, Duration::from_secs(5));
    let mut inline = json;
    inline["secrets"] = serde_json::json!({"a": "1"});
    assert!(serde_json::from_value::<CoordinatorSettings>(inline).is_err());
    assert!(parse_aggregation("trimmed:0.9").is_err());
    assert_eq!(parse_aggregation("median").unwrap(), Method::Median);
}

/// With `tls` set the coordinator speaks only HTTPS: a worker trusting its CA pushes and fetches the aggregate;
/// a plain-HTTP client and a client trusting another CA get nothing through.
#[test]
fn tls_coordinator_serves_workers_that_trust_its_ca_and_nobody_else() {
    use hearth::federate::client::{ClientError, http_request_tls};
    use hearth::federate::tls::{ClientTls, ServerTls};
    let dir = tempfile::tempdir().unwrap();
    let write_cert = |name: &str| {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let cert = dir.path().join(format!("{name}.pem"));
        let key = dir.path().join(format!("{name}.key"));
        std::fs::write(&cert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
        (cert, key)
    };
    let (cert, key) = write_cert("coordinator");
    let (other_ca, _) = write_cert("other");
    let mut cfg = config(2, WireMode::Native);
    cfg.tls = Some(ServerTls {
        cert: cert.clone(),
        key,
    });
    let co = Coordinator::start(cfg).unwrap();
    let tls = ClientTls::from_ca_file(&cert, "localhost").unwrap();
    let w1 = client(&co, "w1", WireMode::Native).with_tls(tls.clone());
    let w2 = client(&co, "w2", WireMode::Native).with_tls(tls.clone());
    assert_eq!(w1.push(0, &delta(1, 64)).unwrap(), PushOutcome::Accepted);
    assert_eq!(w2.push(0, &delta(2, 64)).unwrap(), PushOutcome::Accepted);
    let agg = w1.aggregate(0, Duration::from_secs(10)).unwrap();
    assert_eq!(agg.len(), 2);
    assert_eq!(w1.topology().unwrap()["workers"][0], "w1");

    let t = Duration::from_secs(5);
    // Plain HTTP to the TLS port: the handshake fails and no HTTP answer comes back.
    let plain = http_request(co.addr, "GET", "/v1/healthz", &[], b"", t);
    assert!(
        !matches!(&plain, Ok(r) if r.status == 200),
        "plain HTTP got through: {plain:?}"
    );
    // A client that trusts another CA refuses the coordinator's certificate.
    let stranger = ClientTls::from_ca_file(&other_ca, "localhost").unwrap();
    let refused = http_request_tls(co.addr, Some(&stranger), "GET", "/v1/healthz", &[], b"", t);
    assert!(matches!(refused, Err(ClientError::Tls(_))), "{refused:?}");
    // So does one expecting another server name.
    let wrong_name = ClientTls::from_ca_file(&cert, "coordinator.example").unwrap();
    let refused = http_request_tls(
        co.addr,
        Some(&wrong_name),
        "GET",
        "/v1/healthz",
        &[],
        b"",
        t,
    );
    assert!(matches!(refused, Err(ClientError::Tls(_))), "{refused:?}");
    // The trusted one reaches the same endpoint.
    let ok = http_request_tls(co.addr, Some(&tls), "GET", "/v1/healthz", &[], b"", t).unwrap();
    assert_eq!(ok.status, 200);
    co.stop();

    // A missing or malformed certificate is a clear start-up error naming the file.
    let mut cfg = config(2, WireMode::Native);
    cfg.tls = Some(ServerTls {
        cert: dir.path().join("missing.pem"),
        key: dir.path().join("missing.key"),
    });
    let e = Coordinator::start(cfg)
        .err()
        .expect("must refuse")
        .to_string();
    assert!(e.contains("missing.pem"), "{e}");
}
