//! Acknowledged means committed: an answer or a feedback's 200 goes out only once the item is in the store.
//! Concurrent clients talk to the binary, which is killed with SIGKILL at random moments, over and over on
//! one data directory; after each kill every acknowledged id must be in the store, exactly once.

use crate::train_util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const RUNS: u64 = 20;
const CLIENTS: usize = 3;

fn graph(model: &Path) -> String {
    format!(
        r#"Graph(
    name: "ack",
    nodes: [
        (id: "serve", kind: Serve(model: "{}", listen: "127.0.0.1:0", queue: 64, max_tokens: 8)),
        (id: "capture", kind: Capture()),
        (id: "sink", kind: Blackhole()),
    ],
    edges: [
        (from: "serve.interactions", to: "capture.interactions", capacity: 64),
        (from: "serve.feedback", to: "capture.feedback", capacity: 64),
        (from: "capture.out", to: "sink.in", capacity: 64),
    ],
)"#,
        model.display()
    )
}

/// One request; `None` when the server is gone (killed mid-request): then nothing was acknowledged.
fn post(addr: SocketAddr, path: &str, body: &Value) -> Option<(u16, Value)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    Some((code, serde_json::from_str(body).ok()?))
}

/// Chats and gives feedback until the server goes away; returns the ids it got a 200 for.
fn client(addr: SocketAddr, n: usize, stop: &AtomicBool) -> Vec<(&'static str, String)> {
    let mut acked = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::Acquire) {
        i += 1;
        let ask = json!({"messages": [{"role": "user", "content": format!("client {n} asks {i}")}],
                         "max_tokens": 4, "user": format!("u{n}")});
        let Some((200, answer)) = post(addr, "/v1/chat/completions", &ask) else {
            continue;
        };
        let id = answer["id"].as_str().unwrap().to_owned();
        acked.push(("interactions", id.clone()));
        let fb = json!({"response_id": id, "kind": "thumbs_up"});
        if let Some((200, got)) = post(addr, "/v1/feedback", &fb) {
            acked.push(("feedback", got["id"].as_str().unwrap().to_owned()));
        }
    }
    acked
}

#[test]
fn every_acknowledged_item_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _, _) = train_util::tiny_with(dir.path(), false);
    let graph_file = dir.path().join("ack.ron");
    std::fs::write(&graph_file, graph(&model)).unwrap();
    let data = dir.path().join("data");
    let addr_file = hearth::actors::serve::addr_file(&data, "serve");
    let all_acked = Arc::new(Mutex::new(Vec::new()));
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    for run in 0..RUNS {
        let _ = std::fs::remove_file(&addr_file);
        let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(["run", graph_file.to_str().unwrap(), "--data-dir"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr: SocketAddr = loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file)
                && let Ok(a) = a.trim().parse()
            {
                break a;
            }
            assert!(Instant::now() < deadline, "run {run}: serve did not start");
            std::thread::sleep(Duration::from_millis(10));
        };
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|n| {
                let stop = stop.clone();
                std::thread::spawn(move || client(addr, n, &stop))
            })
            .collect();
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(150 + (rng >> 33) % 700));
        child.kill().unwrap();
        child.wait().unwrap();
        stop.store(true, Ordering::Release);
        let mut acked = all_acked.lock().unwrap();
        for c in clients {
            acked.extend(c.join().unwrap());
        }
        let db = rusqlite::Connection::open(data.join(hearth::store::Store::FILE_NAME)).unwrap();
        for (table, id) in acked.iter() {
            let n: i64 = db
                .query_row(
                    &format!("SELECT COUNT(*) FROM {table} WHERE id = ?1"),
                    [id],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(
                n, 1,
                "run {run}: acknowledged {table} `{id}` stored {n} times"
            );
        }
    }
    let acked = all_acked.lock().unwrap();
    let unique: std::collections::HashSet<_> = acked.iter().collect();
    assert_eq!(unique.len(), acked.len(), "an id was acknowledged twice");
    let interactions = acked.iter().filter(|(t, _)| *t == "interactions").count();
    assert!(
        interactions >= RUNS as usize,
        "too little load to mean anything: {interactions}"
    );
    eprintln!(
        "{} items acknowledged over {RUNS} kills, all stored",
        acked.len()
    );
}
