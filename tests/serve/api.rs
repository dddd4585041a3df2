//! The OpenAI-compatible API over real HTTP with a tiny model: JSON and SSE completions, the model list,
//! adapter hot swap under load, exactness of a zero adapter, backpressure (429) and every 4xx answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{Device, Tensor};
use hearth::model::{
    Arch, ChatMessage, GenerateConfig, KvPrecision, LoraConfig, LoraPair, LoraSet, LoraTarget,
    Role, TinySpec, Tokenizer, Transformer, encode_chat, write_tiny_model,
};
use hearth::serve::{ServeConfig, ServeEvent, Server};
use serde_json::{Value, json};

fn tiny(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("tiny.gguf");
    write_tiny_model(&p, &TinySpec::new(Arch::Llama)).unwrap();
    p
}

fn config(queue: usize) -> ServeConfig {
    ServeConfig {
        model_name: "tiny".to_owned(),
        queue_capacity: queue,
        threads: 1,
        max_tokens_limit: 200,
        default_max_tokens: 16,
        max_body_bytes: 8 * 1024,
        ..ServeConfig::default()
    }
}

/// A server on a tiny model in `dir`, which is also the folder the API may load adapters from.
fn serve(dir: &Path, queue: usize) -> (Server, SocketAddr) {
    let config = ServeConfig {
        adapter_dir: Some(dir.to_path_buf()),
        ..config(queue)
    };
    let server = Server::load(&tiny(dir), config).unwrap();
    let addr = server.listen("127.0.0.1:0").unwrap();
    (server, addr)
}

struct Reply {
    code: u16,
    head: String,
    body: String,
}

fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

fn read(mut s: TcpStream) -> Reply {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Reply {
        code,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> Reply {
    read(send(addr, method, path, body))
}

fn json_of(r: &Reply) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

/// The `data:` payloads of an SSE body (chunked transfer framing lines are skipped).
fn sse_events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

fn sse_text(events: &[String]) -> (String, Option<String>) {
    let mut text = String::new();
    let mut finish = None;
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    (text, finish)
}

/// A non-streaming chat request of `content` to `model`, answered in full.
fn chat(addr: SocketAddr, model: &str, content: &str, max_tokens: usize) -> Reply {
    call(
        addr,
        "POST",
        "/v1/chat/completions",
        &chat_body(model, content, max_tokens, false),
    )
}

fn chat_body(model: &str, content: &str, max_tokens: usize, stream: bool) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "temperature": 0, "stream": stream, "user": "ana"})
    .to_string()
}

fn error_of(r: &Reply) -> Value {
    let v = json_of(r);
    assert!(
        v["error"]["message"].is_string(),
        "not an OpenAI error: {}",
        r.body
    );
    assert!(v["error"]["type"].is_string());
    v["error"].clone()
}

fn adapter(model: &Transformer, dir: &Path, name: &str, b_std: Option<f32>) -> String {
    let cfg = LoraConfig::new(4, 8.0, &[LoraTarget::Q, LoraTarget::V, LoraTarget::Down]);
    let fresh = LoraSet::fresh(model, cfg.clone(), 3).unwrap();
    let set = match b_std {
        None => fresh,
        Some(std) => {
            let mut out = LoraSet::empty(cfg);
            for (&(l, t), p) in fresh.iter() {
                let b = Tensor::randn(0f32, std, p.b.dims(), &Device::Cpu).unwrap();
                out.insert(l, t, LoraPair::new(p.a.clone(), b, p.scale));
            }
            out
        }
    };
    let out = dir.join(name);
    set.save_peft(&out, model.config()).unwrap();
    out.display().to_string()
}

/// Greedy generation for a conversation straight on the model code (no server), with caches of `precision`:
/// the output and the prompt's length in tokens.
fn direct_greedy(
    path: &Path,
    precision: KvPrecision,
    messages: &[ChatMessage],
    max_tokens: usize,
) -> (hearth::model::GenerateOutput, usize) {
    let g = hearth::model::GgufFile::open(path).unwrap();
    let tok = Tokenizer::from_gguf_metadata(g.metadata()).unwrap();
    let model = Transformer::from_gguf(path)
        .unwrap()
        .with_kv_precision(precision);
    let ids = encode_chat(&tok, messages, true).unwrap().ids;
    let out = hearth::model::generate(
        &model,
        &tok,
        &ids,
        None,
        &GenerateConfig::greedy(&tok, max_tokens),
        |_| true,
    )
    .unwrap();
    (out, ids.len())
}

#[test]
fn chat_completion_json_matches_direct_generation() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = serve(dir.path(), 4);
    let r = chat(addr, "tiny", "hello there", 12);
    assert_eq!(r.code, 200, "{}", r.body);
    let v = json_of(&r);
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "tiny");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(completion <= 12);
    assert!(["stop", "length"].contains(&v["choices"][0]["finish_reason"].as_str().unwrap()));

    // The same greedy generation, run directly on the model code.
    let (out, prompt_tokens) = direct_greedy(
        &dir.path().join("tiny.gguf"),
        KvPrecision::F32,
        &[ChatMessage::new(Role::User, "hello there")],
        12,
    );
    assert_eq!(content, out.text);
    assert_eq!(completion as usize, out.tokens.len());
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        prompt_tokens
    );

    // Text completions take a raw prompt.
    let r = call(
        addr,
        "POST",
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "once upon", "max_tokens": 5}).to_string(),
    );
    assert_eq!(r.code, 200, "{}", r.body);
    let v = json_of(&r);
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert!(v["choices"][0]["text"].is_string());
    // Special tokens in a completion prompt are parsed as llama.cpp does: `<|im_start|>` is one token, unless
    // `parse_special` is false.
    let chatml = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    let prompt_tokens = |extra: serde_json::Value| {
        let mut body = json!({"model": "tiny", "prompt": chatml, "max_tokens": 1});
        if let serde_json::Value::Object(m) = extra {
            body.as_object_mut().unwrap().extend(m);
        }
        let r = call(addr, "POST", "/v1/completions", &body.to_string());
        assert_eq!(r.code, 200, "{}", r.body);
        json_of(&r)["usage"]["prompt_tokens"].as_u64().unwrap() as usize
    };
    let g = hearth::model::gguf::GgufFile::open(dir.path().join("tiny.gguf")).unwrap();
    let tok = Tokenizer::from_gguf_metadata(g.metadata()).unwrap();
    let parsed = prompt_tokens(json!({}));
    assert_eq!(parsed, tok.encode(chatml, true).unwrap().len());
    assert_eq!(
        tok.encode("<|im_start|>", true).unwrap(),
        [tok.token_id("<|im_start|>").unwrap()]
    );
    let plain = prompt_tokens(json!({"parse_special": false}));
    assert_eq!(plain, tok.encode(chatml, false).unwrap().len());
    assert!(plain > parsed);
    server.shutdown();
}

/// `kv_cache` reaches the model every request runs on: with an f16 cache the API answers as direct generation
/// over an f16 cache does (tests/model/exactness.rs shows what f16 changes in the logits), and the graph file
/// spells the setting as the serve node's `kv_cache`.
#[test]
fn the_kv_cache_setting_reaches_generation() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let config = ServeConfig {
        kv_cache: KvPrecision::F16,
        ..config(4)
    };
    let server = Server::load(&path, config).unwrap();
    assert_eq!(server.engine().model().kv_precision(), KvPrecision::F16);
    let addr = server.listen("127.0.0.1:0").unwrap();
    let r = chat(addr, "tiny", "hello there", 12);
    assert_eq!(r.code, 200, "{}", r.body);
    let content = json_of(&r)["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let (out, _) = direct_greedy(
        &path,
        KvPrecision::F16,
        &[ChatMessage::new(Role::User, "hello there")],
        12,
    );
    assert_eq!(content, out.text);
    server.shutdown();
    let params: hearth::actors::serve::ServeParams = ron::from_str("(kv_cache: F16)").unwrap();
    assert_eq!(params.kv_cache, KvPrecision::F16);
    assert_eq!(
        hearth::actors::serve::ServeParams::default().kv_cache,
        ServeConfig::default().kv_cache
    );
}

/// A chat's next turn reuses the previous turn's KV cache: the second request reports the prompt tokens it did
/// not recompute (OpenAI's `usage.prompt_tokens_details.cached_tokens`, at least the whole first prompt) and
/// answers exactly as a fresh generation of its prompt does; so does another chat that shares only the
/// template's opening with the kept cache. A request under another adapter never reuses the base's cache (its
/// keys and values differ), and with `prompt_cache_bytes: 0` nothing is reused.
#[test]
fn a_chats_next_turn_reuses_the_cached_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let model = Transformer::from_gguf(&path).unwrap();
    let with_adapter = adapter(&model, dir.path(), "a", Some(0.5));
    let cached = |r: &Reply| {
        assert_eq!(r.code, 200, "{}", r.body);
        json_of(r)["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    for budget in [ServeConfig::default().prompt_cache_bytes, 0] {
        let config = ServeConfig {
            prompt_cache_bytes: budget,
            ..config(4)
        };
        let server = Server::load(&path, config).unwrap();
        server
            .engine()
            .load_adapter("a", Path::new(&with_adapter))
            .unwrap();
        let addr = server.listen("127.0.0.1:0").unwrap();
        let first = chat(addr, "tiny", "hello there", 8);
        assert_eq!(cached(&first), 0);
        let first = json_of(&first);
        let answer = first["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let conversation = [
            ChatMessage::new(Role::User, "hello there"),
            ChatMessage::new(Role::Assistant, &answer),
            ChatMessage::new(Role::User, "and then?"),
        ];
        let turn = |model: &str| {
            json!({"model": model, "max_tokens": 8, "temperature": 0, "messages": [
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "and then?"}]})
            .to_string()
        };
        // Under the adapter first: the base's cache must not serve it.
        let other = call(addr, "POST", "/v1/chat/completions", &turn("a"));
        assert_eq!(cached(&other), 0, "an adapter reused the base's cache");
        let second = call(addr, "POST", "/v1/chat/completions", &turn("tiny"));
        let reused = cached(&second);
        if budget == 0 {
            assert_eq!(reused, 0);
        } else {
            let first_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
            assert!(reused >= first_prompt, "{reused} < {first_prompt}");
        }
        let (fresh, _) = direct_greedy(&path, KvPrecision::F32, &conversation, 8);
        assert_eq!(
            json_of(&second)["choices"][0]["message"]["content"],
            fresh.text.as_str()
        );
        // Another chat shares only the template's opening with the kept cache, which holds more positions
        // after it: those are dropped and recomputed for the new prompt.
        let other_chat = chat(addr, "tiny", "good morning", 8);
        let shared = cached(&other_chat);
        assert_eq!(shared > 0, budget > 0, "{shared}");
        let (fresh, n) = direct_greedy(
            &path,
            KvPrecision::F32,
            &[ChatMessage::new(Role::User, "good morning")],
            8,
        );
        assert!((shared as usize) < n);
        assert_eq!(
            json_of(&other_chat)["choices"][0]["message"]["content"],
            fresh.text.as_str()
        );
        server.shutdown();
    }
}

/// The prompt cache keys entries by adapter snapshot; once that adapter is unloaded its entries must go, or the
/// cache would keep its weights alive for as long as nothing else evicts them.
#[test]
fn the_prompt_cache_lets_go_of_an_unloaded_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let model = Transformer::from_gguf(&path).unwrap();
    let adapter_dir = adapter(&model, dir.path(), "a", Some(0.5));
    let server = Server::load(&path, config(4)).unwrap();
    let set = Arc::new(LoraSet::load_peft(Path::new(&adapter_dir), model.config()).unwrap());
    let weak = Arc::downgrade(&set);
    server.engine().insert_adapter("a", set).unwrap();
    let addr = server.listen("127.0.0.1:0").unwrap();
    let r = chat(addr, "a", "hello there", 4);
    assert_eq!(r.code, 200, "{}", r.body);
    server.engine().unload_adapter("a").unwrap();
    let r = chat(addr, "tiny", "hello there", 4);
    assert_eq!(r.code, 200, "{}", r.body);
    // The first job's worker may still be emitting its interaction event; give it a moment, not forever.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while weak.upgrade().is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        weak.upgrade().is_none(),
        "the prompt cache kept an unloaded adapter alive"
    );
    server.shutdown();
}

#[test]
fn sse_stream_carries_the_same_text_and_ends_with_done() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = serve(dir.path(), 4);
    let plain = json_of(&chat(addr, "tiny", "stream me", 20));
    let r = call(
        addr,
        "POST",
        "/v1/chat/completions",
        &chat_body("tiny", "stream me", 20, true),
    );
    assert_eq!(r.code, 200);
    assert!(
        r.head
            .to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{}",
        r.head
    );
    let events = sse_events(&r.body);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.body
    );
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert!(first["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let (text, finish) = sse_text(&events);
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(
        finish.as_deref(),
        plain["choices"][0]["finish_reason"].as_str()
    );
    server.shutdown();
}

#[test]
fn models_list_and_zero_adapter_answers_like_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = serve(dir.path(), 4);
    let zero = adapter(server.engine().model(), dir.path(), "zero", None);
    let r = call(
        addr,
        "POST",
        "/v1/adapters",
        &json!({"id": "zero", "path": zero}).to_string(),
    );
    assert_eq!(r.code, 200, "{}", r.body);
    let r = call(addr, "GET", "/v1/models", "");
    let v = json_of(&r);
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["tiny", "zero"]);

    let base = json_of(&chat(addr, "tiny", "same?", 24));
    let with = json_of(&chat(addr, "zero", "same?", 24));
    assert_eq!(with["model"], "zero");
    assert_eq!(
        base["choices"][0]["message"]["content"],
        with["choices"][0]["message"]["content"]
    );
    assert_eq!(base["usage"], with["usage"]);

    // Every served interaction names its adapter.
    let mut adapters = Vec::new();
    while let Ok(ServeEvent::Interaction(i)) = server.events().recv_timeout(Duration::from_secs(5))
    {
        adapters.push(i.adapter.clone());
        if adapters.len() == 2 {
            break;
        }
    }
    assert_eq!(adapters, [None, Some("zero".to_owned())]);

    let r = call(addr, "DELETE", "/v1/adapters/zero", "");
    assert_eq!(r.code, 200);
    let v = json_of(&call(addr, "GET", "/v1/models", ""));
    assert_eq!(v["data"].as_array().unwrap().len(), 1);
    server.shutdown();
}

#[test]
fn adapter_swap_and_unload_do_not_disturb_a_stream_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = serve(dir.path(), 4);
    let model = server.engine().model().clone();
    let a1 = adapter(&model, dir.path(), "a1", Some(0.3));
    let a2 = adapter(&model, dir.path(), "a2", Some(0.6));
    assert_eq!(
        call(
            addr,
            "POST",
            "/v1/adapters",
            &json!({"id": "live", "path": a1}).to_string()
        )
        .code,
        200
    );
    let mut body: Value =
        serde_json::from_str(&chat_body("live", "tell me a long story", 150, true)).unwrap();
    body["ignore_eos"] = json!(true);
    let body = body.to_string();
    let reference = sse_text(&sse_events(
        &call(addr, "POST", "/v1/chat/completions", &body).body,
    ));

    let mut stream = send(addr, "POST", "/v1/chat/completions", &body);
    // Read until tokens arrive: the request is admitted and generating.
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while String::from_utf8_lossy(&seen).matches("data: ").count() < 3 {
        stream.read_exact(&mut byte).unwrap();
        seen.push(byte[0]);
    }
    let r = call(
        addr,
        "POST",
        "/v1/adapters",
        &json!({"id": "live", "path": a2}).to_string(),
    );
    assert_eq!(
        (r.code, json_of(&r)["replaced"].clone()),
        (200, json!(true))
    );
    assert_eq!(call(addr, "DELETE", "/v1/adapters/live", "").code, 200);
    let _ = stream.read_to_end(&mut seen);
    let after = sse_text(&sse_events(&String::from_utf8_lossy(&seen)));
    assert_eq!(after.1.as_deref(), Some("length"));
    assert_eq!(after, reference, "the stream changed under an adapter swap");

    // Unloaded: naming it now is a 404 that names it.
    let r = chat(addr, "live", "hi", 4);
    assert_eq!(r.code, 404);
    assert!(error_of(&r)["message"].as_str().unwrap().contains("live"));
    server.shutdown();
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = serve(dir.path(), 1);
    let long =
        json!({"model": "tiny", "prompt": "a b c d e f g", "max_tokens": 200, "ignore_eos": true})
            .to_string();
    let streams: Vec<TcpStream> = (0..6)
        .map(|_| send(addr, "POST", "/v1/completions", &long))
        .collect();
    let replies: Vec<Reply> = streams.into_iter().map(read).collect();
    let codes: Vec<u16> = replies.iter().map(|r| r.code).collect();
    assert!(codes.iter().all(|c| [200, 429].contains(c)), "{codes:?}");
    let busy: Vec<&Reply> = replies.iter().filter(|r| r.code == 429).collect();
    assert!(!busy.is_empty(), "no request was refused: {codes:?}");
    assert!(codes.contains(&200), "{codes:?}");
    for r in busy {
        assert!(
            r.head.to_ascii_lowercase().contains("retry-after: 1"),
            "{}",
            r.head
        );
        assert_eq!(error_of(r)["code"], "queue_full");
    }
    server.shutdown();
}

#[test]
fn every_client_error_is_an_openai_error_naming_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = serve(dir.path(), 4);
    let chat = "/v1/chat/completions";

    let big = json!({"messages": [{"role": "user", "content": "x".repeat(10_000)}]}).to_string();
    let r = call(addr, "POST", chat, &big);
    assert_eq!(r.code, 413);
    assert!(error_of(&r)["message"].as_str().unwrap().contains("8192"));

    let r = call(addr, "POST", chat, &chat_body("tiny", "hi", 5000, false));
    assert_eq!(r.code, 400);
    let e = error_of(&r);
    assert!(e["message"].as_str().unwrap().contains("200"), "{e}");
    assert_eq!(e["param"], "max_tokens");

    let r = call(
        addr,
        "POST",
        chat,
        &chat_body("tiny", &"word ".repeat(300), 100, false),
    );
    assert_eq!(r.code, 400);
    assert!(
        error_of(&r)["message"]
            .as_str()
            .unwrap()
            .contains("context limit of 256")
    );

    let r = call(addr, "POST", chat, &chat_body("nonesuch", "hi", 4, false));
    assert_eq!(r.code, 404);
    let e = error_of(&r);
    assert!(e["message"].as_str().unwrap().contains("nonesuch"));
    assert_eq!(e["code"], "model_not_found");

    let r = call(addr, "POST", chat, "{\"messages\": [");
    assert_eq!(r.code, 400);
    assert_eq!(error_of(&r)["param"], "body");

    let r = call(addr, "POST", chat, &json!({"model": "tiny"}).to_string());
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (400, json!("messages"))
    );

    let bad_temp = json!({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"});
    let r = call(addr, "POST", chat, &bad_temp.to_string());
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (400, json!("temperature"))
    );

    let bad_role = json!({"messages": [{"role": "wizard", "content": "hi"}]});
    let r = call(addr, "POST", chat, &bad_role.to_string());
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (400, json!("messages[0].role"))
    );

    let r = call(
        addr,
        "POST",
        "/v1/feedback",
        &json!({"response_id": "chatcmpl-nope", "kind": "thumbs_up"}).to_string(),
    );
    assert_eq!(r.code, 404);
    assert!(
        error_of(&r)["message"]
            .as_str()
            .unwrap()
            .contains("chatcmpl-nope")
    );

    let r = call(
        addr,
        "POST",
        "/v1/feedback",
        &json!({"response_id": "x", "kind": "meh"}).to_string(),
    );
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (400, json!("kind"))
    );

    let r = call(addr, "DELETE", "/v1/adapters/ghost", "");
    assert_eq!(r.code, 404);
    assert!(error_of(&r)["message"].as_str().unwrap().contains("ghost"));

    let r = call(
        addr,
        "POST",
        "/v1/adapters",
        &json!({"id": "bad", "path": "/no/such/dir"}).to_string(),
    );
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (403, json!("path"))
    );
    let r = call(
        addr,
        "POST",
        "/v1/adapters",
        &json!({"id": "bad", "path": "no-such-adapter"}).to_string(),
    );
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (400, json!("path"))
    );

    // Still serving after all of that.
    assert_eq!(
        call(addr, "POST", chat, &chat_body("tiny", "hi", 4, false)).code,
        200
    );
    server.shutdown();
}

#[test]
fn feedback_on_a_served_response_is_emitted() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = serve(dir.path(), 4);
    let v = json_of(&chat(addr, "tiny", "rate me", 6));
    let id = v["id"].as_str().unwrap();
    let r = call(
        addr,
        "POST",
        "/v1/feedback",
        &json!({"response_id": id, "kind": "edit", "text": "a better answer"}).to_string(),
    );
    assert_eq!(r.code, 200, "{}", r.body);
    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(
            server
                .events()
                .recv_timeout(Duration::from_secs(5))
                .expect("event"),
        );
    }
    // The reply reaches the client before its interaction event is sent, so the feedback event
    // can come first; the capture store pairs them in either order (tests/loops/store.rs).
    if matches!(got[0], ServeEvent::Feedback(_)) {
        got.swap(0, 1);
    }
    match &got[..] {
        [ServeEvent::Interaction(i), ServeEvent::Feedback(f)] => {
            assert_eq!(i.id, id);
            assert_eq!(i.user, "ana");
            assert_eq!(i.prompt[0].content, "rate me");
            assert_eq!(
                i.response,
                v["choices"][0]["message"]["content"].as_str().unwrap()
            );
            assert_eq!(i.sampling["max_tokens"], 6);
            assert!(i.sampling["timings"]["generate_ms"].is_u64());
            assert_eq!(f.response_id, id);
            assert_eq!(f.user, "ana");
            assert_eq!(
                f.kind,
                hearth::message::FeedbackKind::Edit {
                    text: "a better answer".into()
                }
            );
        }
        other => panic!("unexpected events {other:?}"),
    }
    server.shutdown();
}

/// A parameter the server does not implement is a 400 naming it (all of them, when several), never silently
/// ignored; at the value that asks for nothing (`n: 1`, `tools: []`, null), it is accepted.
#[test]
fn unimplemented_parameters_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = serve(dir.path(), 4);
    let ask = |extra: Value| {
        let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        call(addr, "POST", "/v1/chat/completions", &body.to_string())
    };
    let refused = |r: &Reply, param: &str, code: &str| {
        assert_eq!(r.code, 400, "{}", r.body);
        let e = error_of(r);
        assert_eq!(
            (e["param"].as_str(), e["code"].as_str()),
            (Some(param), Some(code))
        );
        e["message"].as_str().unwrap().to_owned()
    };
    let tool = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    for (extra, param) in [
        (json!({"n": 3}), "n"),
        (json!({"logprobs": true}), "logprobs"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"tools": tool}), "tools"),
        (json!({"tool_choice": "auto"}), "tool_choice"),
        (json!({"presence_penalty": 0.5}), "presence_penalty"),
        (json!({"logit_bias": {"42": 5}}), "logit_bias"),
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (json!({"store": false}), "store"),
    ] {
        let message = refused(&ask(extra.clone()), param, "unsupported_parameter");
        assert!(
            message.contains(&format!("`{param}`")),
            "{extra}: {message}"
        );
    }
    let message = refused(
        &ask(json!({"n": 2, "logprobs": true, "tools": tool})),
        "logprobs",
        "unsupported_parameter",
    );
    for p in ["`n`", "`logprobs`", "`tools`"] {
        assert!(message.contains(p), "{message}");
    }
    // A misspelt parameter is not silently ignored either.
    let message = refused(
        &ask(json!({"temprature": 0})),
        "temprature",
        "unknown_parameter",
    );
    assert!(message.contains("`temprature`"), "{message}");
    let r = ask(json!({"stream_options": {"chunk_size": 4}}));
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (400, json!("stream_options.chunk_size"))
    );
    // The inert values, null, and what leaves the answer as it is.
    let r = ask(
        json!({"n": 1, "logprobs": false, "tools": [], "tool_choice": "none",
                       "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
                       "response_format": {"type": "text"}, "top_logprobs": null, "seed": null,
                       "metadata": {"k": "v"}, "service_tier": "auto", "store": true}),
    );
    assert_eq!(r.code, 200, "{}", r.body);

    // Messages: fields and content parts hearth does not implement.
    let msg = |m: Value| json!({"messages": [m], "max_tokens": 2}).to_string();
    let r = call(
        addr,
        "POST",
        "/v1/chat/completions",
        &msg(json!({"role": "user", "content": "hi", "name": "bob"})),
    );
    refused(&r, "messages[0].name", "unsupported_parameter");
    let r = call(
        addr,
        "POST",
        "/v1/chat/completions",
        &msg(json!({"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]})),
    );
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (400, json!("messages[0].content[1]"))
    );
    let echoed = json!({"role": "assistant", "content": "a", "tool_calls": [], "refusal": null});
    let r = call(
        addr,
        "POST",
        "/v1/chat/completions",
        &json!({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}, echoed,
        {"role": "user", "content": "again"}], "max_tokens": 2})
        .to_string(),
    );
    assert_eq!(r.code, 200, "{}", r.body);

    // Text completions have their own.
    let text = |extra: Value| {
        let mut body = json!({"prompt": "a b", "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        call(addr, "POST", "/v1/completions", &body.to_string())
    };
    for (extra, param) in [
        (json!({"echo": true}), "echo"),
        (json!({"best_of": 2}), "best_of"),
        (json!({"suffix": "end"}), "suffix"),
        (json!({"logprobs": 3}), "logprobs"),
        (json!({"messages": []}), "messages"),
    ] {
        let code = if param == "messages" {
            "unknown_parameter"
        } else {
            "unsupported_parameter"
        };
        refused(&text(extra), param, code);
    }
    assert_eq!(
        text(json!({"echo": false, "best_of": 1, "suffix": ""})).code,
        200
    );

    // hearth's own endpoints refuse fields they do not read.
    let id = json_of(&chat(addr, "tiny", "rate me", 2))["id"].clone();
    let fb = |body: Value| call(addr, "POST", "/v1/feedback", &body.to_string());
    let r = fb(json!({"response_id": id, "kind": "thumbs_up", "comment": "nice"}));
    refused(&r, "comment", "unknown_parameter");
    let r = fb(json!({"response_id": id, "kind": "thumbs_up", "text": "nice"}));
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (400, json!("text"))
    );
    // The response went to `ana` (chat_body's user): feedback naming someone else is refused.
    let r = fb(json!({"response_id": id, "kind": "thumbs_up", "user": "bob"}));
    assert_eq!(
        (r.code, error_of(&r)["param"].clone()),
        (400, json!("user"))
    );
    assert_eq!(
        fb(json!({"response_id": id, "kind": "thumbs_up", "user": "ana"})).code,
        200
    );
    let r = call(
        addr,
        "POST",
        "/v1/adapters",
        &json!({"id": "a", "path": "a", "merge": true}).to_string(),
    );
    refused(&r, "merge", "unknown_parameter");
    server.shutdown();
}

/// `stream_options.include_usage`: each chunk carries `usage: null` and a last chunk without choices carries
/// the usage a JSON answer reports.
#[test]
fn a_stream_with_include_usage_ends_with_the_usage() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = serve(dir.path(), 4);
    let plain = json_of(&chat(addr, "tiny", "count", 6));
    let mut body: Value = serde_json::from_str(&chat_body("tiny", "count", 6, true)).unwrap();
    let without = call(addr, "POST", "/v1/chat/completions", &body.to_string());
    assert!(!without.body.contains("usage"), "{}", without.body);
    body["stream_options"] = json!({"include_usage": true});
    let r = call(addr, "POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(r.code, 200, "{}", r.body);
    let events = sse_events(&r.body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let (last, rest) = chunks.split_last().unwrap();
    assert_eq!(last["choices"], json!([]));
    // The same prompt again: the prompt cache makes `cached_tokens` differ, not the counts.
    for count in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(last["usage"][count], plain["usage"][count], "{count}");
    }
    assert!(
        rest.iter()
            .all(|c| c["usage"].is_null() && c.get("usage").is_some())
    );
    assert_eq!(
        sse_text(&events).0,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    server.shutdown();
}

/// `POST /v1/adapters` loads only from the configured folder (a serve node's `DATA_DIR/adapters`): a path
/// outside it, a `..` or a symlink out of it is refused naming the rule and the folder; without a folder,
/// the API loads nothing.
#[test]
fn adapters_load_only_from_the_adapter_folder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("adapters");
    std::fs::create_dir_all(&root).unwrap();
    let config = ServeConfig {
        adapter_dir: Some(root.clone()),
        ..config(4)
    };
    let model_path = tiny(dir.path());
    let server = Server::load(&model_path, config.clone()).unwrap();
    let addr = server.listen("127.0.0.1:0").unwrap();
    let model = server.engine().model().clone();
    let inside = adapter(&model, &root, "inside", None);
    let outside = adapter(&model, dir.path(), "outside", None);
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let load = |addr, path: &str| {
        call(
            addr,
            "POST",
            "/v1/adapters",
            &json!({"id": "a", "path": path}).to_string(),
        )
    };
    let shown_root = root.display().to_string();
    for path in [outside.as_str(), "../outside", "link", "/etc", "."] {
        let r = load(addr, path);
        assert_eq!(r.code, 403, "{path}: {}", r.body);
        let e = error_of(&r);
        assert_eq!(
            (e["param"].as_str(), e["code"].as_str()),
            (Some("path"), Some("adapter_path_not_allowed"))
        );
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains("adapters folder") && message.contains(&shown_root),
            "{message}"
        );
    }
    assert_eq!(load(addr, "inside").code, 200);
    assert_eq!(load(addr, &inside).code, 200);
    assert_eq!(server.engine().adapters(), ["a"]);
    server.shutdown();

    // A server with no folder configured loads no adapter through the API.
    let bare = Server::load(
        &model_path,
        ServeConfig {
            adapter_dir: None,
            ..config
        },
    )
    .unwrap();
    let addr = bare.listen("127.0.0.1:0").unwrap();
    let r = load(addr, &inside);
    assert_eq!(r.code, 403, "{}", r.body);
    assert!(
        error_of(&r)["message"]
            .as_str()
            .unwrap()
            .contains("no adapters folder")
    );
    bare.shutdown();
}

/// `device` moves generation: on the emulated device (the GPU decode step with the kernels' Rust semantics)
/// a chat answers exactly as that decoder does when called directly, with and without an adapter, the
/// decoder switching its pairs both ways; `GET /v1/models` names the device; a GPU that does not open leaves
/// generation on the CPU, answering as the CPU does, with the reason there. (The emulated step multiplies in
/// f32 where the CPU quantizes activations to int8, so on a tiny random model's near-ties the two may pick
/// different tokens: tests/gpu/decode.rs compares their logits.)
#[test]
fn the_device_option_moves_generation_and_says_where() {
    use hearth::gpu::{Device as Dev, Gpu};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-q8.gguf");
    let mut spec = TinySpec::new(Arch::Llama);
    spec.dtype = candle_core::quantized::GgmlDType::Q8_0;
    write_tiny_model(&path, &spec).unwrap();
    let model = Transformer::from_gguf(&path).unwrap();
    let cfg = LoraConfig::new(4, 8.0, &[LoraTarget::Q, LoraTarget::V, LoraTarget::Down]);
    let fresh = LoraSet::fresh(&model, cfg.clone(), 3).unwrap();
    let mut set = LoraSet::empty(cfg);
    for (&(l, t), p) in fresh.iter() {
        let b = Tensor::randn(0f32, 0.5, p.b.dims(), &Device::Cpu).unwrap();
        set.insert(l, t, LoraPair::new(p.a.clone(), b, p.scale));
    }
    let set = Arc::new(set);
    let answers = |device: Dev| {
        let server = Server::load(
            &path,
            // Two generation threads: on a GPU, two decoders over one copy of the weights.
            ServeConfig {
                device,
                threads: 2,
                ..config(4)
            },
        )
        .unwrap();
        server.engine().insert_adapter("a", set.clone()).unwrap();
        let addr = server.listen("127.0.0.1:0").unwrap();
        let models = json_of(&call(addr, "GET", "/v1/models", ""));
        let status = models["data"][0]["device"].clone();
        let text = |m: &str| {
            let r = chat(addr, m, "hello there", 12);
            assert_eq!(r.code, 200, "{}", r.body);
            json_of(&r)["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        // The base, the adapter, then the base again.
        let out = vec![text("tiny"), text("a"), text("tiny")];
        // The same chat once more reuses the cached prompt, on either device (on the GPU, the decoder that
        // holds it is chosen).
        let r = chat(addr, "tiny", "hello there", 12);
        let cached = json_of(&r)["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
        assert!(cached.as_u64().unwrap() > 0, "{}", r.body);
        server.shutdown();
        (status, out)
    };
    let tok =
        Tokenizer::from_gguf_metadata(hearth::model::GgufFile::open(&path).unwrap().metadata())
            .unwrap();
    let ids = encode_chat(&tok, &[ChatMessage::new(Role::User, "hello there")], true)
        .unwrap()
        .ids;
    let gpu = Gpu::open(Dev::Emulated).unwrap();
    let direct = |lora: Option<&LoraSet>| {
        let mut dec = hearth::model::GpuDecoder::new(&gpu, &model, 64, lora).unwrap();
        let greedy = GenerateConfig::greedy(&tok, 12);
        hearth::model::generate_on_gpu(&mut dec, &tok, &ids, &greedy, |_| true)
            .unwrap()
            .0
            .text
    };
    let (base, adapted) = (direct(None), direct(Some(&set)));
    assert_ne!(base, adapted, "the adapter changes nothing");

    let (status, emulated) = answers(Dev::Emulated);
    assert!(
        status["running_on"]
            .as_str()
            .unwrap()
            .starts_with("emulated"),
        "{status}"
    );
    assert!(status["notice"].is_null(), "{status}");
    assert_eq!(emulated, [base.clone(), adapted, base]);

    let (cpu_status, cpu) = answers(Dev::Cpu);
    assert_eq!(cpu_status, json!({"running_on": "cpu", "notice": null}));
    let (status, missing) = answers(Dev::Cuda(7));
    if status["running_on"] == "cpu" {
        let notice = status["notice"].as_str().unwrap();
        assert!(notice.starts_with("device cuda:7: "), "{notice}");
        assert_eq!(missing, cpu);
    }

    // The graph's `Serve(device: ...)` reaches the server's config; the default is the CPU.
    let params: hearth::actors::serve::ServeParams =
        ron::from_str("(device: \"emulated\")").unwrap();
    assert_eq!(params.config().device, Dev::Emulated);
    assert_eq!(
        hearth::actors::serve::ServeParams::default()
            .config()
            .device,
        Dev::Cpu
    );
    let e = ron::from_str::<hearth::actors::serve::ServeParams>("(device: \"gpu0\")")
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpu0"), "{e}");
}

/// A request the GPU decoder cannot take (here a prompt past its cache, which attention's shared memory
/// bounds below this model's context) is answered on the CPU, as a server on the CPU answers it, instead of
/// failing; a DoRA delta is answered on the GPU as on the CPU.
#[test]
fn what_the_gpu_decoder_cannot_take_is_answered_on_the_cpu() {
    use hearth::gpu::Device as Dev;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-long.gguf");
    let mut spec = TinySpec::new(Arch::Llama);
    spec.dtype = candle_core::quantized::GgmlDType::Q8_0;
    spec.context_length = hearth::gpu::ops::ATTENTION_MAX_POSITIONS + 512;
    write_tiny_model(&path, &spec).unwrap();
    let model = Transformer::from_gguf(&path).unwrap();
    let mut cfg = LoraConfig::new(4, 8.0, &[LoraTarget::Q, LoraTarget::V]);
    cfg.use_dora = true;
    let dora = Arc::new(LoraSet::fresh(&model, cfg, 5).unwrap());
    // Four tokens a repeat in the tiny vocabulary: a prompt between the two limits.
    let long = "the owl ".repeat((hearth::gpu::ops::ATTENTION_MAX_POSITIONS + 200) / 4);
    let answers = |device: Dev| {
        let cfg = ServeConfig {
            device,
            max_body_bytes: 1 << 20,
            ..config(4)
        };
        let server = Server::load(&path, cfg).unwrap();
        server.engine().insert_adapter("d", dora.clone()).unwrap();
        let addr = server.listen("127.0.0.1:0").unwrap();
        let mut out = Vec::new();
        for (m, prompt) in [("d", "hello there"), ("tiny", long.as_str())] {
            let r = chat(addr, m, prompt, 4);
            assert_eq!(r.code, 200, "{device}: {}", r.body);
            let j = json_of(&r);
            assert!(j["usage"]["prompt_tokens"].as_u64().unwrap() > 10, "{j}");
            out.push(
                j["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        server.shutdown();
        out
    };
    assert_eq!(answers(Dev::Emulated), answers(Dev::Cpu));
}
