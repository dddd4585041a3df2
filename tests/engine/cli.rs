//! The binary: `check` exit codes and messages, `graph`, `actors`, and SIGTERM draining a running graph.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_hearth");

#[test]
fn check_exits_2_with_every_error_and_0_with_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.ron");
    std::fs::write(
        &bad,
        "Graph(name: \"b\", nodes: [\n  (id: \"g\", kind: Generate()),\n  (id: \"g\", kind: Nope()),\n], edges: [\n  (from: \"g.out\", to: \"x.in\", capacity: 0),\n])",
    )
    .unwrap();
    let out = Command::new(BIN).arg("check").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let path = bad.display().to_string();
    assert!(
        err.contains(&format!(
            "{path}:3:19: error: node `g`: Unexpected variant named `Nope`"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{path}:5:3: error: edge `g.out->x.in`: capacity must be at least 1"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{path}:5:3: error: edge `g.out->x.in`: unknown node `x`"
        )),
        "{err}"
    );
    assert!(err.contains("3 error(s)"), "{err}");

    let out = Command::new(BIN)
        .args([
            "check",
            concat!(env!("CARGO_MANIFEST_DIR"), "/graphs/default.ron"),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1);
    assert!(text.contains("is valid"), "{text}");
}

#[test]
fn graph_draws_dot_and_mermaid_and_actors_lists_kinds() {
    let default = concat!(env!("CARGO_MANIFEST_DIR"), "/graphs/default.ron");
    let dot = Command::new(BIN)
        .args(["graph", default, "--format", "dot"])
        .output()
        .unwrap();
    let dot = String::from_utf8_lossy(&dot.stdout);
    assert!(dot.starts_with("digraph"), "{dot}");
    assert!(dot.contains("cap "), "{dot}");
    let mermaid = Command::new(BIN)
        .args(["graph", default, "--format", "mermaid"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&mermaid.stdout).starts_with("flowchart LR"));
    let actors = Command::new(BIN).arg("actors").output().unwrap();
    let actors = String::from_utf8_lossy(&actors.stdout);
    for kind in [
        "generate",
        "throttle",
        "fault_inject",
        "jsonl_sink",
        "blackhole",
    ] {
        assert!(actors.contains(&format!("{kind} — ")), "{actors}");
    }
    assert!(actors.contains("inputs:  in: Sample"), "{actors}");
}

#[test]
fn sigterm_stops_sources_drains_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let graph = dir.path().join("g.ron");
    std::fs::write(
        &graph,
        r#"Graph(name: "sig", nodes: [
            (id: "gen", kind: Generate(count: None, interval_us: 50)),
            (id: "slow", kind: Throttle(delay_us: 300), workers: 2),
            (id: "sink", kind: JsonlSink(path: "out.jsonl")),
        ], edges: [
            (from: "gen.out", to: "slow.in", capacity: 16),
            (from: "slow.out", to: "sink.in", capacity: 16),
        ])"#,
    )
    .unwrap();
    let child = Command::new(BIN)
        .arg("run")
        .arg(&graph)
        .arg("--data-dir")
        .arg(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Signal once samples reach the sink (the handler is installed by then), at least 700 ms in,
    // at most 30 s: a fixed sleep could hit a slow start before the handler exists.
    let out_path = dir.path().join("out.jsonl");
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(700)
        || (started.elapsed() < Duration::from_secs(30)
            && std::fs::read_to_string(&out_path).map_or(0, |s| s.lines().count()) <= 10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let pushed: u64 = err
        .lines()
        .find(|l| l.contains("edge gen.out->slow.in"))
        .and_then(|l| l.split("pushed=").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no edge line in {err}"));
    let lines = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .count() as u64;
    assert!(pushed > 10, "{err}");
    assert_eq!(lines, pushed, "count in != count out\n{err}");
}

/// A child process that a failing test does not leave running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running graph's stderr, collected as it comes.
fn collect_stderr(child: &mut std::process::Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::BufRead;
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = text.clone();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let mut all = sink.lock().unwrap();
            all.push_str(&line);
            all.push('\n');
        }
    });
    text
}

fn wait_for_text(text: &std::sync::Mutex<String>, needle: &str) -> String {
    let started = std::time::Instant::now();
    loop {
        let all = text.lock().unwrap().clone();
        if all.contains(needle) {
            return all;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no `{needle}` in:\n{all}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pipeline_graph(sink_file: &str, broken: bool) -> String {
    let to = if broken { "nowhere.in" } else { "sink.in" };
    format!(
        r#"Graph(name: "live", nodes: [
            (id: "gen", kind: Generate(count: None, interval_us: 200)),
            (id: "slow", kind: Throttle(delay_us: 100)),
            (id: "sink", kind: JsonlSink(path: "{sink_file}")),
        ], edges: [
            (from: "gen.out", to: "slow.in", capacity: 16),
            (from: "slow.out", to: "{to}", capacity: 16),
        ])"#
    )
}

#[test]
fn reload_and_sighup_rewire_a_running_graph_and_refuse_a_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let graph = dir.path().join("live.ron");
    std::fs::write(&graph, pipeline_graph("a.jsonl", false)).unwrap();
    let mut child = KillOnDrop(
        Command::new(BIN)
            .arg("run")
            .arg(&graph)
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--control")
            .arg("127.0.0.1:0")
            .env_remove("HEARTH_API_KEY")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = collect_stderr(&mut child.0);
    let text = wait_for_text(&stderr, "control endpoints on http://");
    let addr = text
        .split("control endpoints on http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap()
        .to_owned();
    let lines =
        |f: &str| std::fs::read_to_string(dir.path().join(f)).map_or(0, |s| s.lines().count());
    let reload = |file: &Path| {
        Command::new(BIN)
            .arg("reload")
            .arg(file)
            .arg("--control")
            .arg(&addr)
            .arg("--data-dir")
            .arg(dir.path())
            .env_remove("HEARTH_API_KEY")
            .output()
            .unwrap()
    };

    // A broken graph: refused with its errors, located; the old one keeps running.
    let broken = dir.path().join("broken.ron");
    std::fs::write(&broken, pipeline_graph("b.jsonl", true)).unwrap();
    let out = reload(&broken);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{}:7:13: error: edge `slow.out->nowhere.in`: unknown node `nowhere`",
            broken.display()
        )),
        "{err}"
    );
    let before = lines("a.jsonl");
    std::thread::sleep(Duration::from_millis(300));
    assert!(lines("a.jsonl") > before, "the old graph stopped");

    // A good one: the sink changes, the rest keeps running.
    let next = dir.path().join("next.ron");
    std::fs::write(&next, pipeline_graph("b.jsonl", false)).unwrap();
    let out = reload(&next);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("graph `live` reloaded: nodes changed: sink;"),
        "{err}"
    );
    let started = std::time::Instant::now();
    while lines("b.jsonl") < 10 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nothing reached b.jsonl"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // SIGHUP rereads the file the run started with: broken, then fixed (the sink back to a.jsonl).
    let hup = |expect: &str| {
        let kill = Command::new("kill")
            .args(["-HUP", &child.0.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        wait_for_text(&stderr, expect)
    };
    std::fs::write(&graph, pipeline_graph("a.jsonl", true)).unwrap();
    let text = hup("still running the old graph");
    assert!(
        text.contains(&format!(
            "{}:7:13: error: edge `slow.out->nowhere.in`",
            graph.display()
        )),
        "{text}"
    );
    std::fs::write(&graph, pipeline_graph("a.jsonl", false)).unwrap();
    hup(&format!(
        "SIGHUP: {}: graph `live` reloaded: nodes changed: sink;",
        graph.display()
    ));
    let at_a = lines("a.jsonl");
    let started = std::time::Instant::now();
    while lines("a.jsonl") < at_a + 10 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nothing reached a.jsonl again"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Count in equals count out across all three sinks' lifetimes.
    let kill = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.0.wait().unwrap();
    let text = wait_for_text(&stderr, "edge slow.out->sink.in");
    assert_eq!(status.code(), Some(0), "{text}");
    let pushed: u64 = text
        .lines()
        .find(|l| l.contains("edge gen.out->slow.in"))
        .and_then(|l| l.split("pushed=").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no edge line in {text}"));
    assert_eq!(
        (lines("a.jsonl") + lines("b.jsonl")) as u64,
        pushed,
        "count in != count out"
    );
}

/// `hearth redact --tagger-weights FILE` reads its weights from FILE: a copy of the shipped ones gives the
/// shipped tagger's spans, and a file that is not weights, or none, is an error naming it.
#[test]
fn redact_reads_tagger_weights_from_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"id\": 0, \"text\": \"Вчера звонил Сергей Кузнецов насчёт договора.\"}\n",
    )
    .unwrap();
    let shipped = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/curate/redact/data/tagger.safetensors"
    );
    let copy = dir.path().join("copy.safetensors");
    std::fs::copy(shipped, &copy).unwrap();
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"not weights").unwrap();
    let run = |weights: Option<&Path>, out: &str| {
        let mut cmd = Command::new(BIN);
        cmd.args(["redact", "--config", "(tagger: true)", "--jsonl"])
            .arg(&input)
            .arg("--spans-out")
            .arg(dir.path().join(out));
        if let Some(w) = weights {
            cmd.arg("--tagger-weights").arg(w);
        }
        let o = cmd.output().unwrap();
        let spans = std::fs::read_to_string(dir.path().join(out)).unwrap_or_default();
        (
            o.status.success(),
            spans,
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (ok, default_spans, err) = run(None, "default.jsonl");
    assert!(
        ok && default_spans.contains("PERSON"),
        "{err}{default_spans}"
    );
    let (ok, copy_spans, err) = run(Some(&copy), "copy.jsonl");
    assert!(ok && copy_spans == default_spans, "{err}{copy_spans}");
    for bad in [garbage, dir.path().join("missing.safetensors")] {
        let (ok, _, err) = run(Some(&bad), "bad.jsonl");
        assert!(!ok && err.contains(&bad.display().to_string()), "{err}");
    }
}
