//! The status page at `GET /` on the control port: what it shows, the key, the rollback button, and a real
//! browser (headless Chromium, skipped with a notice where it is not installed) rendering it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth::access::ApiKey;
use hearth::control::{ControlOptions, ControlServer};
use hearth::engine::runtime::RunStatus;
use hearth::engine::start;
use hearth::message::{ChatMessage, Decision, Delta, Interaction, Outcome};
use hearth::page::PageSource;
use hearth::store::{LegRecord, Store};
use hearth::train::LoraTrainer;

use crate::http_util::raw;
use crate::runtime::graph;
use crate::train_util;

/// A generator faster than its consumer, on a small dropping edge: queue fill and drops to show.
const GRAPH: &str = r#"Graph(name: "page", nodes: [
    (id: "gen", kind: Generate(count: None, interval_us: 200)),
    (id: "slow", kind: Throttle(delay_us: 2000)),
    (id: "sink", kind: Blackhole()),
], edges: [
    (from: "gen.out", to: "slow.in", capacity: 8, when_full: DropNewest),
    (from: "slow.out", to: "sink.in", capacity: 16),
])"#;

fn interaction(id: &str) -> Interaction {
    Interaction {
        id: id.to_owned(),
        user: "u".to_owned(),
        adapter: None,
        prompt: vec![ChatMessage {
            role: hearth::message::Role::User,
            content: format!("question {id}"),
        }],
        response: format!("answer {id}"),
        sampling: serde_json::json!({}),
        created_at_unix_ms: 1,
        latency_ms: 2,
        commit: Default::default(),
    }
}

fn leg(name: &str, baseline: f64, candidate: f64, passed: bool) -> LegRecord {
    LegRecord {
        leg: name.to_owned(),
        baseline,
        candidate,
        tolerance: 0.0,
        passed,
    }
}

/// A store as a run leaves it: curation decisions, and two deltas trained for real on the tiny model (their
/// provenance carries the trainer's per-step losses), the first promoted by the gate, the second rejected.
/// Returns the two delta ids.
fn store_with_trained_deltas(dir: &Path) -> (String, String) {
    let mut store = Store::open(dir).unwrap();
    for i in 0..12 {
        let sample = store
            .capture_interaction(&interaction(&format!("i{i}")))
            .unwrap()
            .remove(0);
        if i % 3 == 0 {
            let outcome = if i % 2 == 0 {
                Outcome::Dropped
            } else {
                Outcome::Quarantined
            };
            let decision = Decision {
                sample,
                node: "guard".to_owned(),
                outcome,
                reason: "unsafe".to_owned(),
            };
            store.decide(&decision).unwrap();
        } else {
            store.admit(&sample).unwrap();
        }
    }
    let (_, model, tok) = train_util::tiny(dir);
    let mut cfg = train_util::fast_cfg();
    cfg.steps = 12;
    let samples = train_util::mixed();
    let mut ids = Vec::new();
    for (n, promote) in [(1, true), (2, false)] {
        let mut trainer = LoraTrainer::new(&model, &tok, cfg.clone(), None).unwrap();
        let report = trainer.train_cycle(&samples, |_| {}).unwrap();
        assert!(report.losses.len() >= 10, "a loss per step: {report:?}");
        let id = format!("delta-{n}-{}", "0123456789abcdef");
        let delta = Delta {
            id: id.clone(),
            path: dir.join(&id).display().to_string(),
            base_sha256: "base".into(),
            recipe_sha256: "recipe".into(),
            data_digest: report.data_digest.clone(),
            parent: None,
        };
        // What `train::cycle::run` records: the cycle report is the provenance's `metrics`.
        let provenance = serde_json::json!({
            "delta_id": id, "num_samples": samples.len(), "metrics": report,
        });
        store.record_delta(&delta, &provenance).unwrap();
        let legs = [
            leg(
                "personalisation",
                2.5,
                if promote { 2.1 } else { 2.6 },
                promote,
            ),
            leg("base_perplexity", 30.0, 30.1, true),
            leg("canary_leaks", 0.0, 0.0, true),
        ];
        let verdict = serde_json::json!({
            "promote": promote, "personal_gain": if promote { 0.4 } else { -0.1 },
            "reason": if promote { "every leg passed" } else { "personalisation did not improve" },
        });
        store.record_verdict(&id, &verdict, &legs, promote).unwrap();
        if promote {
            store.promote(&id, "gate").unwrap();
        }
        ids.push(id);
    }
    (ids.remove(0), ids.remove(0))
}

struct Page {
    server: ControlServer,
    running: hearth::engine::runtime::RunningGraph<hearth::message::Message>,
    dir: tempfile::TempDir,
    ids: (String, String),
}

fn serve_page(key: Option<&str>) -> Page {
    let dir = tempfile::tempdir().unwrap();
    let ids = store_with_trained_deltas(dir.path());
    let running = start(graph(GRAPH), Some(dir.path())).unwrap();
    let status: Arc<RunStatus> = running.status();
    let source = PageSource {
        data_dir: dir.path().to_owned(),
        planted: vec!["4111 1111 1111 1111".to_owned()],
    };
    let options = ControlOptions {
        key: key.map(ApiKey::new),
        reload: None,
        page: Some(source),
    };
    let server = ControlServer::start_with("127.0.0.1:0", status, options).unwrap();
    // Let the generator fill the slow node's queue, so the page has fill and drops to show.
    std::thread::sleep(Duration::from_millis(300));
    Page {
        server,
        running,
        dir,
        ids,
    }
}

impl Page {
    fn stop(self) {
        self.server.stop();
        self.running.shutdown();
        drop(self.dir);
    }
}

#[test]
fn the_page_shows_the_graph_curation_losses_the_gate_and_privacy() {
    let page = serve_page(None);
    let r = raw(page.server.addr, "GET", "/", &[("Content-Type", "")], "");
    assert_eq!(r.code, 200, "{}", r.body);
    assert!(
        r.head
            .to_ascii_lowercase()
            .contains("content-type: text/html")
    );
    assert!(
        r.head.contains("connect-src 'self'"),
        "a CSP that keeps the page to this server: {}",
        r.head
    );
    let body = &r.body;
    for needle in [
        "<svg id=\"graph\"",
        "data-node=\"gen\"",
        "data-node=\"slow\"",
        "data-node=\"sink\"",
        "data-edge=\"gen.out-&gt;slow.in\"",
        "class=\"chart curation\"",
        "guard: unsafe",
        "class=\"chart loss\"",
        "<polyline",
        "personalisation did not improve",
        "data-status=\"rejected\"",
        "data-status=\"promoted\"",
        "id=\"rollback\"",
        "id=\"privacy\"",
        "✓ clean",
    ] {
        assert!(body.contains(needle), "the page lacks {needle}:\n{body}");
    }
    assert!(
        body.contains(&format!("delta {}", page.ids.0)),
        "served now"
    );
    assert!(
        no_external_refs(body),
        "the page refers to nothing elsewhere"
    );
    page.stop();
}

/// The only absolute URLs the page may carry are SVG/XML namespace names, which a browser never fetches.
fn no_external_refs(body: &str) -> bool {
    body.match_indices("http").all(|(i, _)| {
        let rest = &body[i..];
        rest.starts_with("http://www.w3.org/")
    })
}

#[test]
fn with_a_key_the_page_carries_no_data_until_the_key_is_sent() {
    let page = serve_page(Some("s3cret"));
    let addr = page.server.addr;
    let r = raw(addr, "GET", "/", &[("Content-Type", "")], "");
    assert_eq!(r.code, 200, "the shell loads without the key");
    assert!(r.body.contains("id=\"login\"") && r.body.contains("data-keyed=\"true\""));
    assert!(
        !r.body.contains("data-node=\"gen\""),
        "no data without the key"
    );
    let r = raw(addr, "GET", "/page/view", &[("Content-Type", "")], "");
    assert_eq!(r.code, 401, "{}", r.body);
    let r = raw(
        addr,
        "GET",
        "/page/view",
        &[("Content-Type", ""), ("Authorization", "Bearer s3cret")],
        "",
    );
    assert_eq!(r.code, 200);
    assert!(r.body.contains("data-node=\"gen\"") && r.body.contains("<polyline"));
    let r = raw(addr, "POST", "/deltas/rollback", &[], "{}");
    assert_eq!(r.code, 401, "rollback needs the key");
    // The keyless shell is `GET /` only, and still under the Host rule.
    let r = raw(addr, "POST", "/", &[("Authorization", "")], "{}");
    assert_ne!(r.code, 200);
    let r = raw(addr, "GET", "/", &[("Host", "evil.example:80")], "");
    assert_eq!(r.code, 403);
    page.stop();
}

#[test]
fn the_rollback_button_rolls_back_and_other_sites_cannot_press_it() {
    let page = serve_page(None);
    let addr = page.server.addr;
    let origin = format!("http://{addr}");
    let refused = [
        vec![("Origin", "http://evil.example")],
        vec![("Sec-Fetch-Site", "cross-site")],
        vec![("Content-Type", "application/x-www-form-urlencoded")],
        vec![("Content-Type", "text/plain")],
    ];
    for headers in &refused {
        let r = raw(addr, "POST", "/deltas/rollback", headers, "{}");
        assert!(
            r.code == 403 || r.code == 415,
            "{headers:?}: {} {}",
            r.code,
            r.body
        );
    }
    let store = Store::open(page.dir.path()).unwrap();
    assert_eq!(
        store.served().unwrap().delta_id.as_deref(),
        Some(page.ids.0.as_str()),
        "refused requests changed nothing"
    );
    let r = raw(
        addr,
        "POST",
        "/deltas/rollback",
        &[
            ("Origin", origin.as_str()),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        "{}",
    );
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.json()["rolled_back"], true);
    assert_eq!(store.served().unwrap().delta_id, None, "back to the base");
    let d = store.delta(&page.ids.0).unwrap().unwrap();
    assert_eq!(d.status.as_str(), "rolled_back");
    let r = raw(addr, "POST", "/deltas/rollback", &[], "{}");
    assert_eq!(r.json()["rolled_back"], false, "nothing left: {}", r.body);
    let page_text = raw(addr, "GET", "/page/view", &[("Content-Type", "")], "").body;
    assert!(page_text.contains("the base alone"));
    page.stop();
}

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|p| p.join(name))
                    .find(|p| p.is_file())
            })
        })
}

fn headless(browser: &Path, profile: &Path, args: &[String]) -> std::process::Output {
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--window-size=1280,1500",
        // Long enough for the page's script to run; the page needs no network.
        "--virtual-time-budget=2000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args);
    cmd.output().expect("run chromium")
}

/// Count of pixels that are neither white nor near-white, and of clearly coloured ones (the state colours).
fn ink(png_path: &Path) -> (usize, usize, (u32, u32)) {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(png_path).unwrap(),
    ));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let (mut dark, mut colour) = (0, 0);
    for px in buf[..info.buffer_size()].chunks(channels) {
        let (r, g, b) = (px[0] as i32, px[1] as i32, px[2] as i32);
        if r.min(g).min(b) < 200 {
            dark += 1;
        }
        if (r - g).abs().max((g - b).abs()).max((r - b).abs()) > 60 {
            colour += 1;
        }
    }
    (dark, colour, (info.width, info.height))
}

#[test]
fn a_real_browser_renders_the_graph_and_a_loss_curve() {
    let Some(browser) = chromium() else {
        eprintln!(
            "SKIPPED: no chromium on PATH (apt-get install chromium) for the status page's browser test"
        );
        return;
    };
    let started = Instant::now();
    let page = serve_page(None);
    let addr: SocketAddr = page.server.addr;
    let url = format!("http://{addr}/");
    let out_dir = std::env::var_os("HEARTH_PAGE_SCREENSHOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| page.dir.path().to_owned());
    std::fs::create_dir_all(&out_dir).unwrap();
    let shot = out_dir.join("page.png");
    let profile = tempfile::tempdir().unwrap();

    let dom = headless(
        &browser,
        profile.path(),
        &["--dump-dom".into(), url.clone()],
    );
    let dom_text = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(
        dom.status.success() && !dom_text.is_empty(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    // The DOM after the page's script ran: the graph, each node, an edge's fill bar, and a loss curve drawn
    // as a polyline with a point per training step.
    assert!(dom_text.contains("<svg id=\"graph\""), "{dom_text}");
    for node in ["gen", "slow", "sink"] {
        assert!(
            dom_text.contains(&format!("data-node=\"{node}\"")),
            "{node}"
        );
    }
    assert!(dom_text.contains("class=\"fill\""));
    let loss = dom_text
        .split("class=\"chart loss\"")
        .nth(1)
        .expect("a loss chart in the DOM");
    let loss = loss.split("</figure>").next().unwrap_or_default();
    // The axes are polylines too: the curve is the one with a point per step.
    let points = loss
        .split("<polyline")
        .skip(1)
        .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
        .map(|p| p.split_whitespace().count())
        .max()
        .expect("a loss polyline");
    assert!(points >= 10, "a point per training step: {points}");

    let shot_run = headless(
        &browser,
        profile.path(),
        &[format!("--screenshot={}", shot.display()), url],
    );
    assert!(
        shot.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&shot_run.stderr)
    );
    // With a key, the browser gets the form and no data (the form's round trip is the plain key test's).
    let options = ControlOptions {
        key: Some(ApiKey::new("s3cret")),
        reload: None,
        page: Some(PageSource {
            data_dir: page.dir.path().to_owned(),
            planted: Vec::new(),
        }),
    };
    let keyed = ControlServer::start_with("127.0.0.1:0", page.running.status(), options).unwrap();
    let dom = headless(
        &browser,
        profile.path(),
        &["--dump-dom".into(), format!("http://{}/", keyed.addr)],
    );
    let dom_text = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(
        dom_text.contains("<form id=\"login\" class=\"login\" autocomplete=\"off\">"),
        "the key form, shown: {dom_text}"
    );
    assert!(!dom_text.contains("data-node="), "no data without the key");
    keyed.stop();

    let (dark, colour, (w, h)) = ink(&shot);
    eprintln!(
        "screenshot {} ({w}x{h}): {dark} non-white pixels, {colour} coloured, in {:.1} s",
        shot.display(),
        started.elapsed().as_secs_f64()
    );
    let total = (w * h) as usize;
    assert!(dark > total / 100, "the page is blank: {dark} of {total}");
    assert!(colour > 1000, "no state colours or curves drawn: {colour}");
    page.stop();
}

#[test]
fn each_user_has_a_row_and_a_rollback_of_their_own() {
    let page = serve_page(None);
    let addr = page.server.addr;
    let mut store = Store::open(page.dir.path()).unwrap();
    // alice's own delta, promoted on her chain.
    let dir = page.dir.path().join("delta-alice");
    std::fs::create_dir_all(&dir).unwrap();
    let delta = Delta {
        id: "delta-alice".into(),
        path: dir.display().to_string(),
        base_sha256: "base".into(),
        recipe_sha256: "recipe".into(),
        data_digest: "data".into(),
        parent: None,
    };
    let prov = serde_json::json!({"delta_id": "delta-alice", "num_samples": 8, "user": "alice"});
    store.record_delta(&delta, &prov).unwrap();
    let verdict =
        serde_json::json!({"promote": true, "personal_gain": 0.7, "reason": "every leg passed"});
    store
        .record_verdict(
            "delta-alice",
            &verdict,
            &[leg("personalisation", 2.0, 1.3, true)],
            true,
        )
        .unwrap();
    store.promote("delta-alice", "gate").unwrap();

    let view = raw(addr, "GET", "/page/view", &[("Content-Type", "")], "").body;
    assert!(view.contains("Per-user deltas"), "{view}");
    assert!(
        view.contains("data-action=\"rollback\" data-user=\"alice\""),
        "{view}"
    );
    assert!(view.contains("+0.7000"), "alice's gain: {view}");
    let md = hearth::report::Report::build(&store, &[])
        .unwrap()
        .to_markdown();
    assert!(
        md.contains("## Per-user deltas")
            && md.contains("| alice | `delta-alice` | +0.7000 | 1 (1, 0) |"),
        "{md}"
    );

    let r = raw(addr, "POST", "/deltas/rollback", &[], r#"{"user": 3}"#);
    assert_eq!(r.code, 400, "{}", r.body);
    let r = raw(
        addr,
        "POST",
        "/deltas/rollback",
        &[],
        r#"{"user": "alice"}"#,
    );
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.json()["rolled_back"], true);
    // alice is back on the common delta; the common chain did not move.
    assert_eq!(
        store.served_for("alice").unwrap().delta_id.as_deref(),
        Some(page.ids.0.as_str())
    );
    assert_eq!(
        store.served().unwrap().delta_id.as_deref(),
        Some(page.ids.0.as_str())
    );
    let r = raw(
        addr,
        "POST",
        "/deltas/rollback",
        &[],
        r#"{"user": "alice"}"#,
    );
    assert_eq!(r.json()["rolled_back"], false, "{}", r.body);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("user `alice`"),
        "{}",
        r.body
    );
    page.stop();
}
