//! The graph for yourself (graphs/personal.ron), copied into a fresh directory and run there by the binary,
//! as an installed `hearth` would run it: nothing it ships may be looked up relative to the working directory.
//! Taught over the API alone (the demo script's turns, sent as chat requests and feedback), it must train a
//! delta and have the gate promote it.

use crate::http_util;
use crate::train_util;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hearth::store::Store;
use serde_json::json;

/// graphs/personal.ron with the tiny model on every model node, an ephemeral port, no control server, and a
/// trainer sized for the tiny model with no schedule.
fn personal_graph(model: &Path) -> String {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/personal.ron"))
            .unwrap();
    let m = model.display();
    let mut out = src.clone();
    for (from, to) in [
        (
            r#"Serve(listen: "127.0.0.1:8080","#.to_owned(),
            format!(r#"Serve(model: "{m}", listen: "127.0.0.1:0","#),
        ),
        (
            "Trainer(min_samples: 16".to_owned(),
            format!(r#"Trainer(model: "{m}", min_samples: 24"#),
        ),
        ("max_seq_len: 256".to_owned(), "max_seq_len: 96".to_owned()),
        // The schedule would hold every cycle after the first for an hour, and wait for a busy test machine.
        (
            "min_interval_secs: 3600, idle_load: 0.5,".to_owned(),
            String::new(),
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
            "graphs/personal.ron no longer contains `{from}`"
        );
        out = out.replace(&from, &to);
    }
    out
}

struct Run(Child);

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends one scripted turn as a user would: the chat request, then the reaction to the answer.
fn send_turn(
    addr: std::net::SocketAddr,
    i: &hearth::message::Interaction,
    fb: Option<&hearth::message::Feedback>,
) {
    let messages: Vec<_> = i
        .prompt
        .iter()
        .map(|m| json!({"role": "user", "content": m.content}))
        .collect();
    let body = json!({"messages": messages, "user": i.user, "max_tokens": 6, "temperature": 0.0});
    let (code, answer) = http_util::post(addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(code, 200, "{answer}");
    let Some(fb) = fb else { return };
    let mut feedback = json!({"response_id": answer["id"], "user": i.user});
    match &fb.kind {
        hearth::message::FeedbackKind::Thumbs { up } => {
            feedback["kind"] = json!(if *up { "thumbs_up" } else { "thumbs_down" })
        }
        hearth::message::FeedbackKind::Edit { text } => {
            feedback["kind"] = json!("edit");
            feedback["text"] = json!(text);
        }
        _ => feedback["kind"] = json!("accepted"),
    }
    let (code, body) = http_util::post(addr, "/v1/feedback", &feedback.to_string());
    assert_eq!(code, 200, "{body}");
}

#[test]
fn the_personal_graph_learns_from_api_use_in_any_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (model_path, _, _) = train_util::tiny_with(dir.path(), false);
    let work = dir.path().join("elsewhere");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("mine.ron"), personal_graph(&model_path)).unwrap();
    let log = std::fs::File::create(dir.path().join("run.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .current_dir(&work)
        .args(["run", "mine.ron"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut run = Run(child);
    let data = work.join("hearth-data");
    let addr = http_util::wait_for_addr(&data, "serve");

    let mut script = hearth::demo::Script::new("t", Some(6));
    let deadline = Instant::now() + Duration::from_secs(240);
    let promoted = loop {
        if let Some((i, fb)) = script.next_turn() {
            send_turn(addr, &i, fb.as_ref());
        } else {
            std::thread::sleep(Duration::from_millis(200));
        }
        let promoted = Store::open(&data)
            .ok()
            .and_then(|s| s.served().ok())
            .and_then(|s| s.delta_id);
        if let Some(id) = promoted {
            break id;
        }
        assert!(
            Instant::now() < deadline,
            "no delta promoted in time; log:\n{}",
            std::fs::read_to_string(dir.path().join("run.log")).unwrap_or_default()
        );
    };
    let pid = run.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = run.0.wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("run.log")).unwrap();
    assert!(status.success(), "{log}");
    assert!(!log.contains("No such file"), "{log}");
    let store = Store::open(&data).unwrap();
    let delta = store.delta(&promoted).unwrap().unwrap();
    assert!(
        delta.path.starts_with(data.to_str().unwrap()) || Path::new(&delta.path).is_relative(),
        "delta written outside the data directory: {}",
        delta.path
    );
    assert!(data.join("report.md").exists());
    let counts = store.counts().unwrap();
    assert_eq!(counts.pending, 0, "{counts:?}");
}
