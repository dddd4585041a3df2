//! Per-request adapter mixing (llama.cpp's `lora: [{id, scale}]`): each request's mix is its own, concurrent
//! requests with different mixes answer as their mix alone would, and a mix naming an adapter that is not
//! resident is a 400 naming it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use candle_core::{Device, Tensor};
use hearth::model::{Arch, LoraConfig, LoraPair, LoraSet, LoraTarget, TinySpec, write_tiny_model};
use hearth::serve::{ServeConfig, Server};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

fn post(addr: SocketAddr, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn ask(model: &str, lora: Option<Value>) -> Value {
    let mut v = json!({"model": model, "messages": [{"role": "user", "content": "tell me"}],
                       "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    if let Some(l) = lora {
        v["lora"] = l;
    }
    v
}

fn text(addr: SocketAddr, body: &Value) -> String {
    let (code, v) = post(addr, body);
    assert_eq!(code, 200, "{v}");
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// An adapter with B drawn from N(0, 1) by a seeded generator: it changes greedy answers.
fn strong(model: &hearth::model::Transformer, seed: u64) -> LoraSet {
    let cfg = LoraConfig::new(4, 8.0, &[LoraTarget::Q, LoraTarget::V, LoraTarget::Down]);
    let fresh = LoraSet::fresh(model, cfg.clone(), seed).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let normal = rand_distr::Normal::new(0f32, 1.0).unwrap();
    let mut out = LoraSet::empty(cfg);
    for (&(l, t), p) in fresh.iter() {
        let b: Vec<f32> = (0..p.b.elem_count()).map(|_| rng.sample(normal)).collect();
        let b = Tensor::from_vec(b, p.b.dims(), &Device::Cpu).unwrap();
        out.insert(l, t, LoraPair::new(p.a.clone(), b, p.scale));
    }
    out
}

#[test]
fn concurrent_requests_with_different_mixes_answer_as_their_mix_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, &TinySpec::new(Arch::Llama)).unwrap();
    let config = ServeConfig {
        model_name: "tiny".to_owned(),
        queue_capacity: 32,
        threads: 1,
        max_tokens_limit: 64,
        ..ServeConfig::default()
    };
    let server = Server::load(&path, config).unwrap();
    let (model, _) = hearth::model::load(&path).unwrap();
    let engine = server.engine();
    let a = strong(&model, 1);
    // Half of a's update, exactly: `a` at scale 0.5 must answer as this adapter does.
    let mut half = LoraSet::empty(a.config.clone());
    for (&(l, t), p) in a.iter() {
        half.insert(l, t, LoraPair::new(p.a.clone(), p.b.clone(), p.scale * 0.5));
    }
    engine.insert_adapter("a", std::sync::Arc::new(a)).unwrap();
    engine
        .insert_adapter("b", std::sync::Arc::new(strong(&model, 2)))
        .unwrap();
    engine
        .insert_adapter("half", std::sync::Arc::new(half))
        .unwrap();
    let addr = server.listen("127.0.0.1:0").unwrap();

    // Alone, one at a time: the answers each mix should reproduce.
    let base = text(addr, &ask("tiny", None));
    let only_a = text(addr, &ask("a", None));
    let only_b = text(addr, &ask("b", None));
    let only_half = text(addr, &ask("half", None));
    assert_ne!(only_a, only_b);
    assert_ne!(only_a, base);

    let mixes: Vec<(Value, Option<&str>)> = vec![
        (json!([{"id": "a", "scale": 1.0}]), Some(&only_a)),
        (json!([{"id": "b"}]), Some(&only_b)),
        (json!([{"id": "a", "scale": 0.5}]), Some(&only_half)),
        (json!([]), Some(&base)),
        (
            json!([{"id": "a", "scale": 1.0}, {"id": "b", "scale": 1.0}]),
            None,
        ),
    ];
    // Every mix three times, all in flight together, each under a model name the mix overrides.
    let answers: Vec<(usize, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .flat_map(|_| mixes.iter().enumerate())
            .map(|(i, (mix, _))| {
                let body = ask("b", Some(mix.clone()));
                s.spawn(move || (i, text(addr, &body)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut both = Vec::new();
    for (i, got) in answers {
        match mixes[i].1 {
            Some(want) => assert_eq!(got, want, "mix {}", mixes[i].0),
            None => both.push(got),
        }
    }
    // a + b is neither alone, and the same each time.
    assert!(both.iter().all(|t| *t == both[0]), "{both:?}");
    assert_ne!(both[0], only_a);
    assert_ne!(both[0], only_b);

    // Nothing of a mix stayed behind: the resident adapters answer as before.
    assert_eq!(text(addr, &ask("a", None)), only_a);
    assert_eq!(engine.adapters(), vec!["a", "b", "half"]);

    let (code, v) = post(
        addr,
        &ask("tiny", Some(json!([{"id": "nope", "scale": 1.0}]))),
    );
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["param"], "lora");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`nope`"),
        "{v}"
    );
    let (code, v) = post(addr, &ask("tiny", Some(json!([{"id": "a", "scale": "x"}]))));
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["param"], "lora");
    server.shutdown();
}
