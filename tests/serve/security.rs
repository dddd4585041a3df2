//! Who may reach the API and the control port (`hearth::access`), over raw HTTP: the API key on every
//! endpoint, requests a browser could send cross-site (content type, `Origin`, `Host`), non-loopback
//! addresses, and where `hearth run` takes the key from.

use crate::http_util::{Raw, raw, wait_for_addr};

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hearth::access::{ApiKey, KEY_ENV, KEY_FILE};
use hearth::model::{Arch, TinySpec, write_tiny_model};
use hearth::serve::{ServeConfig, ServeEvent, Server};
use serde_json::{Value, json};

const KEY: &str = "hk-test-0123456789abcdef";

fn tiny(dir: &Path) -> PathBuf {
    let p = dir.join("tiny.gguf");
    write_tiny_model(&p, &TinySpec::new(Arch::Llama)).unwrap();
    p
}

fn server(dir: &Path, key: Option<&str>) -> Server {
    let config = ServeConfig {
        model_name: "tiny".to_owned(),
        api_key: key.map(ApiKey::new),
        adapter_dir: Some(dir.to_path_buf()),
        ..ServeConfig::default()
    };
    Server::load(&tiny(dir), config).unwrap()
}

fn chat_body() -> String {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "user": "ana"})
        .to_string()
}

fn error(r: &Raw) -> Value {
    let v = r.json();
    assert!(
        v["error"]["message"].is_string(),
        "not an OpenAI error: {} {}",
        r.code,
        r.body
    );
    v["error"].clone()
}

/// The status and error code of a refusal.
fn refusal(r: &Raw) -> (u16, String) {
    (
        r.code,
        error(r)["code"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Interactions the server emitted within `wait`: what reached the model and the graph.
fn interactions(server: &Server, wait: Duration) -> usize {
    std::thread::sleep(wait);
    server
        .events()
        .try_iter()
        .filter(|e| matches!(e, ServeEvent::Interaction(_)))
        .count()
}

#[test]
fn a_set_key_guards_every_endpoint_of_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), Some(KEY));
    let addr = server.listen("127.0.0.1:0").unwrap();
    let chat = chat_body();
    let prompt = json!({"prompt": "a", "max_tokens": 2}).to_string();
    let adapter = json!({"id": "a", "path": "a"}).to_string();
    let feedback = json!({"response_id": "chatcmpl-x", "kind": "thumbs_up"}).to_string();
    let endpoints = [
        ("GET", "/v1/models", ""),
        ("POST", "/v1/chat/completions", chat.as_str()),
        ("POST", "/v1/completions", prompt.as_str()),
        ("POST", "/v1/adapters", adapter.as_str()),
        ("DELETE", "/v1/adapters/a", ""),
        ("POST", "/v1/feedback", feedback.as_str()),
        ("GET", "/no/such/endpoint", ""),
    ];
    let wrong = format!("Bearer {KEY}x");
    let prefix = format!("Bearer {}", &KEY[..KEY.len() - 1]);
    let bare = KEY.to_owned();
    for (method, path, body) in endpoints {
        for auth in ["", wrong.as_str(), prefix.as_str(), bare.as_str()] {
            let r = raw(addr, method, path, &[("Authorization", auth)], body);
            assert_eq!(
                refusal(&r),
                (401, "invalid_api_key".into()),
                "{method} {path} `{auth}`"
            );
            assert!(
                r.head
                    .to_ascii_lowercase()
                    .contains("www-authenticate: bearer"),
                "{}",
                r.head
            );
        }
    }
    let with = format!("Bearer {KEY}");
    let key = [("Authorization", with.as_str())];
    let r = raw(addr, "GET", "/v1/models", &key, "");
    assert_eq!(r.code, 200, "{}", r.body);
    // Nothing refused reached the model; the one request with the key did.
    assert_eq!(interactions(&server, Duration::from_millis(100)), 0);
    let r = raw(addr, "POST", "/v1/chat/completions", &key, &chat);
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(interactions(&server, Duration::from_millis(200)), 1);
    server.shutdown();

    // The same server without a key answers without one.
    let open = self::server(dir.path(), None);
    let addr = open.listen("127.0.0.1:0").unwrap();
    assert_eq!(raw(addr, "GET", "/v1/models", &[], "").code, 200);
    open.shutdown();
}

#[test]
fn requests_a_browser_could_send_cross_site_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for key in [None, Some(KEY)] {
        let server = server(dir.path(), key);
        let addr = server.listen("127.0.0.1:0").unwrap();
        let auth = key.map(|k| format!("Bearer {k}")).unwrap_or_default();
        let call = |method: &str, path: &str, headers: &[(&str, &str)], body: &str| {
            let mut all = vec![("Authorization", auth.as_str())];
            all.extend_from_slice(headers);
            raw(addr, method, path, &all, body)
        };
        let chat = chat_body();
        let fb = json!({"response_id": "chatcmpl-x", "kind": "thumbs_up"}).to_string();
        // What a form post or a no-cors fetch carries: refused before any handler reads it.
        for media in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
        ] {
            for path in ["/v1/chat/completions", "/v1/feedback", "/v1/completions"] {
                let body = if path == "/v1/feedback" { &fb } else { &chat };
                let r = call("POST", path, &[("Content-Type", media)], body);
                assert_eq!(
                    refusal(&r),
                    (415, "unsupported_media_type".into()),
                    "{path} `{media}`"
                );
                let shown = if media.is_empty() {
                    "none"
                } else {
                    media.split(';').next().unwrap()
                };
                assert!(error(&r)["message"].as_str().unwrap().contains(shown));
            }
        }
        // A foreign Origin, even with JSON (a preflighted fetch would fail anyway; this refuses it first).
        for origin in [
            "http://evil.example",
            "null",
            "https://127.0.0.1",
            "http://127.0.0.1:1",
        ] {
            let r = call("POST", "/v1/chat/completions", &[("Origin", origin)], &chat);
            assert_eq!(refusal(&r), (403, "origin_not_allowed".into()), "{origin}");
        }
        let r = call("GET", "/v1/models", &[("Sec-Fetch-Site", "cross-site")], "");
        assert_eq!(refusal(&r), (403, "origin_not_allowed".into()));
        // A Host that is not this server: a DNS-rebinding page's requests carry its own name.
        let port = addr.port();
        for host in [format!("evil.example:{port}"), "127.0.0.1".to_owned()] {
            let r = call("POST", "/v1/chat/completions", &[("Host", &host)], &chat);
            assert_eq!(refusal(&r), (403, "host_not_allowed".into()), "`{host}`");
            assert!(
                error(&r)["message"]
                    .as_str()
                    .unwrap()
                    .contains(&addr.to_string())
            );
        }
        // HTTP/1.1 without a Host at all: actix answers 400 before the rules run.
        let r = call("POST", "/v1/chat/completions", &[("Host", "")], &chat);
        assert_eq!(r.code, 400, "{}", r.body);
        assert_eq!(interactions(&server, Duration::from_millis(100)), 0);
        // This server's own names and origin pass.
        let own = format!("http://{addr}");
        let localhost = format!("localhost:{port}");
        let r = call("POST", "/v1/chat/completions", &[("Origin", &own)], &chat);
        assert_eq!(r.code, 200, "{}", r.body);
        let r = call(
            "POST",
            "/v1/chat/completions",
            &[("Host", &localhost)],
            &chat,
        );
        assert_eq!(r.code, 200, "{}", r.body);
        let r = call(
            "GET",
            "/v1/models",
            &[("Sec-Fetch-Site", "same-origin")],
            "",
        );
        assert_eq!(r.code, 200, "{}", r.body);
        server.shutdown();
    }
}

#[test]
fn a_non_loopback_address_needs_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let open = server(dir.path(), None);
    let e = open.listen("0.0.0.0:0").unwrap_err().to_string();
    assert!(
        e.contains("0.0.0.0:0") && e.contains("non-loopback") && e.contains(KEY_ENV),
        "{e}"
    );
    open.shutdown();

    let keyed = server(dir.path(), Some(KEY));
    let bound = keyed.listen("0.0.0.0:0").unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], bound.port()));
    // Off loopback any name the network gives the machine is accepted; the key keeps pages out.
    let host = format!("box.lan:{}", bound.port());
    let auth = format!("Bearer {KEY}");
    let r = raw(
        addr,
        "GET",
        "/v1/models",
        &[("Host", &host), ("Authorization", &auth)],
        "",
    );
    assert_eq!(r.code, 200, "{}", r.body);
    let r = raw(addr, "GET", "/v1/models", &[("Host", &host)], "");
    assert_eq!(refusal(&r), (401, "invalid_api_key".into()));
    keyed.shutdown();
}

#[test]
fn the_control_port_follows_the_same_rules() {
    use hearth::control::ControlServer;
    let dir = tempfile::tempdir().unwrap();
    let g = hearth::actors::ActorKind::graph(
        r#"Graph(name: "ctl", nodes: [
            (id: "gen", kind: Generate(count: None, interval_us: 1000)),
            (id: "sink", kind: Blackhole()),
        ], edges: [ (from: "gen.out", to: "sink.in", capacity: 4) ])"#,
    )
    .unwrap();
    let running = hearth::engine::start(g, Some(dir.path())).unwrap();
    let keyed = ControlServer::start_with(
        "127.0.0.1:0",
        running.status(),
        hearth::control::ControlOptions {
            key: Some(ApiKey::new(KEY)),
            ..Default::default()
        },
    )
    .unwrap();
    let addr = keyed.addr;
    let auth = format!("Bearer {KEY}");
    for path in ["/healthz", "/status", "/metrics"] {
        let r = raw(addr, "GET", path, &[], "");
        assert_eq!(refusal(&r), (401, "invalid_api_key".into()), "{path}");
        let r = raw(addr, "GET", path, &[("Authorization", "Bearer nope")], "");
        assert_eq!(refusal(&r), (401, "invalid_api_key".into()), "{path}");
        let r = raw(addr, "GET", path, &[("Authorization", &auth)], "");
        assert_eq!(r.code, 200, "{path}: {}", r.body);
        let r = raw(
            addr,
            "GET",
            path,
            &[("Authorization", &auth), ("Host", "evil.example")],
            "",
        );
        assert_eq!(refusal(&r), (403, "host_not_allowed".into()), "{path}");
        let r = raw(
            addr,
            "GET",
            path,
            &[("Authorization", &auth), ("Origin", "http://evil.example")],
            "",
        );
        assert_eq!(refusal(&r), (403, "origin_not_allowed".into()), "{path}");
    }
    keyed.stop();
    let open = ControlServer::start("127.0.0.1:0", running.status()).unwrap();
    assert_eq!(raw(open.addr, "GET", "/healthz", &[], "").code, 200);
    let r = raw(
        open.addr,
        "GET",
        "/healthz",
        &[("Host", "evil.example")],
        "",
    );
    assert_eq!(refusal(&r), (403, "host_not_allowed".into()));
    open.stop();
    let e = ControlServer::start("0.0.0.0:0", running.status())
        .err()
        .expect("a non-loopback control port without a key")
        .to_string();
    assert!(e.contains("0.0.0.0:0") && e.contains("non-loopback"), "{e}");
    running.shutdown();
}

fn serve_graph(model: &Path, listen: &str) -> String {
    format!(
        r#"Graph(name: "keyed", nodes: [
            (id: "serve", kind: Serve(model: "{}", model_name: "tiny", listen: "{listen}", max_tokens: 16)),
        ], edges: [])"#,
        model.display()
    )
}

fn write_key_file(data: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(data).unwrap();
    let file = data.join(KEY_FILE);
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A serve node in a running graph: its key from `DATA_DIR/api_key`, adapters only from
/// `DATA_DIR/adapters`.
#[test]
fn a_serve_node_takes_its_key_and_adapters_from_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let data = dir.path().join("data");
    write_key_file(&data, 0o600);
    let g = hearth::actors::ActorKind::graph(&serve_graph(&model, "127.0.0.1:0")).unwrap();
    let running = hearth::engine::start(g, Some(&data)).unwrap();
    let addr = wait_for_addr(&data, "serve");
    let auth = format!("Bearer {KEY}");
    let key = [("Authorization", auth.as_str())];
    assert_eq!(refusal(&raw(addr, "GET", "/v1/models", &[], "")).0, 401);
    let r = raw(addr, "POST", "/v1/chat/completions", &key, &chat_body());
    assert_eq!(r.code, 200, "{}", r.body);

    let m = hearth::model::Transformer::from_gguf(&model).unwrap();
    let set = hearth::model::LoraSet::fresh(
        &m,
        hearth::model::LoraConfig::new(4, 8.0, &[hearth::model::LoraTarget::Q]),
        1,
    )
    .unwrap();
    let folder = hearth::serve::settings::adapter_dir(&data);
    assert!(
        folder.is_dir(),
        "the serve node creates {}",
        folder.display()
    );
    set.save_peft(folder.join("mine"), m.config()).unwrap();
    set.save_peft(dir.path().join("elsewhere"), m.config())
        .unwrap();
    let load = |path: &str| {
        let body = json!({"id": "mine", "path": path}).to_string();
        raw(addr, "POST", "/v1/adapters", &key, &body)
    };
    let r = load(&dir.path().join("elsewhere").display().to_string());
    assert_eq!(refusal(&r), (403, "adapter_path_not_allowed".into()));
    assert!(
        error(&r)["message"]
            .as_str()
            .unwrap()
            .contains(&folder.display().to_string())
    );
    let r = load("mine");
    assert_eq!(r.code, 200, "{}", r.body);
    let report = running.shutdown();
    assert!(report.failed_nodes.is_empty(), "{:?}", report.status.nodes);
}

/// `hearth run` with `args`, stderr to a file; the child and that file.
fn hearth_run(dir: &Path, args: &[&str], env: Option<&str>) -> (std::process::Child, PathBuf) {
    let log = dir.join(format!("run-{}.log", args.len() + env.map_or(0, |_| 100)));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
    cmd.arg("run")
        .args(args)
        .env_remove(KEY_ENV)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some(key) = env {
        cmd.env(KEY_ENV, key);
    }
    (cmd.spawn().unwrap(), log)
}

/// Waits for the child to exit on its own; its status and log.
fn finished(mut child: std::process::Child, log: &Path) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, std::fs::read_to_string(log).unwrap_or_default());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "hearth run did not stop: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn hearth_run_takes_the_key_from_the_environment_and_refuses_an_open_key_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let graph = dir.path().join("g.ron");
    std::fs::write(&graph, serve_graph(&model, "127.0.0.1:0")).unwrap();
    let graph = graph.to_str().unwrap();

    // A key file group or others may read is refused before anything starts, naming the file and the rule.
    let open_dir = dir.path().join("open");
    write_key_file(&open_dir, 0o644);
    let (child, log) = hearth_run(
        dir.path(),
        &[graph, "--data-dir", open_dir.to_str().unwrap()],
        None,
    );
    let (status, text) = finished(child, &log);
    assert!(!status.success(), "{text}");
    let file = open_dir.join(KEY_FILE).display().to_string();
    assert!(text.contains(&file) && text.contains("chmod 600"), "{text}");
    assert!(
        !hearth::actors::serve::addr_file(&open_dir, "serve").exists(),
        "{text}"
    );

    // A control port off loopback without a key: refused before the graph starts.
    let no_key = dir.path().join("no-key");
    let args = [
        graph,
        "--data-dir",
        no_key.to_str().unwrap(),
        "--control",
        "0.0.0.0:0",
    ];
    let (child, log) = hearth_run(dir.path(), &args, None);
    let (status, text) = finished(child, &log);
    assert!(!status.success() && text.contains("non-loopback"), "{text}");

    // The key from the environment guards the API and the control port alike.
    let data = dir.path().join("env");
    let args = [
        graph,
        "--data-dir",
        data.to_str().unwrap(),
        "--control",
        "127.0.0.1:0",
    ];
    let (mut child, log) = hearth_run(dir.path(), &args, Some(KEY));
    let api = wait_for_addr(&data, "serve");
    let control = control_addr(&log);
    let auth = format!("Bearer {KEY}");
    let key = [("Authorization", auth.as_str())];
    for (addr, path) in [
        (api, "/v1/models"),
        (control, "/healthz"),
        (control, "/status"),
    ] {
        assert_eq!(refusal(&raw(addr, "GET", path, &[], "")).0, 401, "{path}");
        let r = raw(addr, "GET", path, &key, "");
        assert_eq!(r.code, 200, "{path}: {}", r.body);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The control port's address from the line `hearth run` logs.
fn control_addr(log: &Path) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(log) {
            let _ = f.read_to_string(&mut text);
        }
        if let Some(rest) = text.split("control endpoints on http://").nth(1)
            && let Some(addr) = rest.split('/').next().and_then(|a| a.parse().ok())
        {
            return addr;
        }
        assert!(
            Instant::now() < deadline,
            "no control address in the log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A serve node told to listen off loopback without a key does not serve, and says why.
#[test]
fn a_serve_node_off_loopback_without_a_key_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let graph = dir.path().join("g.ron");
    std::fs::write(&graph, serve_graph(&model, "0.0.0.0:0")).unwrap();
    let data = dir.path().join("data");
    let args = [
        graph.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--duration",
        "20",
    ];
    let (child, log) = hearth_run(dir.path(), &args, None);
    let (status, text) = finished(child, &log);
    assert!(!status.success(), "{text}");
    assert!(
        text.contains("refusing to listen on 0.0.0.0:0") && text.contains("non-loopback"),
        "{text}"
    );
    assert!(!hearth::actors::serve::addr_file(&data, "serve").exists());
}
