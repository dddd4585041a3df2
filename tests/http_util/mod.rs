//! Plain HTTP/1.1 calls for tests that talk to a running serve node or control port, and finding its
//! address. Requests name the server in `Host` and send JSON, as the access rules require.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A whole answer: status, head (status line and headers) and body.
pub struct Raw {
    pub code: u16,
    pub head: String,
    pub body: String,
}

impl Raw {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// `method path` with `body`, and headers: `Host: addr` and `Content-Type: application/json` unless
/// `headers` names them (an empty value leaves that header out), then the rest of `headers`.
pub fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Raw {
    let host = addr.to_string();
    let defaults = [
        ("Host", host.as_str()),
        ("Content-Type", "application/json"),
    ];
    let mut lines = String::new();
    for (k, v) in defaults
        .iter()
        .filter(|(k, _)| !headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(k)))
        .chain(headers)
        .filter(|(_, v)| !v.is_empty())
    {
        lines.push_str(&format!("{k}: {v}\r\n"));
    }
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\n{lines}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut bytes = Vec::new();
    let _ = s.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Raw {
        code,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

pub fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, Value) {
    post_with(addr, path, body, &[])
}

pub fn post_with(
    addr: SocketAddr,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let r = raw(addr, "POST", path, headers, body);
    (r.code, r.json())
}

pub fn wait_for_addr(dir: &Path, node: &str) -> SocketAddr {
    let file = hearth::actors::serve::addr_file(dir, node);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&file)
            && let Ok(addr) = text.trim().parse()
        {
            return addr;
        }
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn get(addr: SocketAddr, path: &str) -> Value {
    let r = raw(addr, "GET", path, &[("Content-Type", "")], "");
    serde_json::from_str(&r.body).unwrap()
}
