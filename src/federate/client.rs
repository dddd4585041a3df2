//! Blocking federation client over a minimal HTTP/1.1 exchange on `std::net::TcpStream` (one request per
//! connection, `Connection: close`), so workers need no async runtime. The delta it sends is a plain
//! `Vec<Tensor>`: a trainer plugs in by producing one.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::dp::{DpEngine, DpError, DpReport};
use super::hmac_auth::{self, HEADER_NONCE, HEADER_SIG, HEADER_TS, HEADER_WORKER};
use super::tls::ClientTls;
use super::wire::{self, Delta, WireError, WireMode};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("malformed HTTP response: {0}")]
    Http(String),
    #[error("coordinator answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("aggregate for round {0} not ready before the deadline")]
    NotReady(u64),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error(transparent)]
    Dp(#[from] DpError),
}

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request in plain HTTP and reads the whole response.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, ClientError> {
    http_request_tls(addr, None, method, path, headers, body, timeout)
}

/// Sends one request, over TLS when `tls` is given, and reads the whole response.
pub fn http_request_tls(
    addr: SocketAddr,
    tls: Option<&ClientTls>,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, ClientError> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let raw = match tls {
        None => exchange(s, head.as_bytes(), body)?,
        Some(t) => {
            let conn = rustls::ClientConnection::new(t.config.clone(), t.server_name.clone())
                .map_err(|e| ClientError::Tls(e.to_string()))?;
            exchange(rustls::StreamOwned::new(conn, s), head.as_bytes(), body)?
        }
    };
    parse_response(&raw)
}

/// Writes a request and reads until the server closes. A TLS peer that closes without `close_notify` after a
/// complete response is tolerated (the length check in [`parse_response`] catches a truncated body).
fn exchange<S: Read + Write>(mut s: S, head: &[u8], body: &[u8]) -> Result<Vec<u8>, ClientError> {
    // rustls reports handshake and certificate failures as `InvalidData` from whichever call drove it.
    let tls_err = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::InvalidData => ClientError::Tls(e.to_string()),
        _ => ClientError::Io(e),
    };
    s.write_all(head).map_err(tls_err)?;
    s.write_all(body).map_err(tls_err)?;
    s.flush().map_err(tls_err)?;
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw) {
        // A server that went away mid-request (a restart) closes without answering: an I/O failure to retry,
        // not a malformed answer.
        Ok(_) if raw.is_empty() => Err(ClientError::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "connection closed before a response",
        ))),
        Ok(_) => Ok(raw),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => Ok(raw),
        Err(e) => Err(tls_err(e)),
    }
}

fn parse_response(raw: &[u8]) -> Result<Response, ClientError> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| ClientError::Http("no header end".into()))?;
    let head =
        std::str::from_utf8(&raw[..end]).map_err(|_| ClientError::Http("non-UTF-8 head".into()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ClientError::Http(format!("bad status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body)?;
    } else if let Some(n) = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        if body.len() < n {
            return Err(ClientError::Http(format!(
                "body cut short: {} of {n} bytes",
                body.len()
            )));
        }
        body.truncate(n);
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, ClientError> {
    let mut out = Vec::new();
    loop {
        let nl = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| ClientError::Http("bad chunk".into()))?;
        let size_str = std::str::from_utf8(&b[..nl])
            .map_err(|_| ClientError::Http("bad chunk size".into()))?;
        let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| ClientError::Http("bad chunk size".into()))?;
        b = &b[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            return Err(ClientError::Http("short chunk".into()));
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// One worker's connection details.
#[derive(Debug, Clone)]
pub struct Client {
    pub addr: SocketAddr,
    pub worker: String,
    secret: Vec<u8>,
    pub mode: WireMode,
    /// Per-request socket timeout; must exceed the coordinator's long-poll hold.
    pub timeout: Duration,
    /// Whether to send `X-Hearth-Nonce` (native coordinators accept it; gym ones ignore it and reject the signature).
    pub use_nonce: bool,
    /// HTTPS to a coordinator started with TLS; `None`: plain HTTP.
    pub tls: Option<ClientTls>,
}

/// How a push went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushOutcome {
    Accepted,
    /// The round had closed; the worker should fetch its aggregate and join `next_round`.
    RoundClosed {
        next_round: u64,
    },
}

impl Client {
    pub fn new(
        addr: SocketAddr,
        worker: impl Into<String>,
        secret: impl Into<Vec<u8>>,
        mode: WireMode,
    ) -> Client {
        Client {
            addr,
            worker: worker.into(),
            secret: secret.into(),
            mode,
            timeout: Duration::from_secs(120),
            use_nonce: mode == WireMode::Native,
            tls: None,
        }
    }

    /// Talks HTTPS, trusting what `tls` trusts.
    pub fn with_tls(mut self, tls: ClientTls) -> Client {
        self.tls = Some(tls);
        self
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> Result<Response, ClientError> {
        http_request_tls(
            self.addr,
            self.tls.as_ref(),
            method,
            path,
            headers,
            body,
            self.timeout,
        )
    }

    /// Signed headers for a request at time `ts`.
    pub fn auth_headers(
        &self,
        method: &str,
        path: &str,
        ts: i64,
        body: &[u8],
    ) -> Vec<(&'static str, String)> {
        let nonce = self.use_nonce.then(random_nonce);
        let sig = hmac_auth::sign(&self.secret, method, path, ts, nonce.as_deref(), body);
        let mut h = vec![
            (HEADER_SIG, sig),
            (HEADER_TS, ts.to_string()),
            (HEADER_WORKER, self.worker.clone()),
        ];
        if let Some(n) = nonce {
            h.push((HEADER_NONCE, n));
        }
        h
    }

    /// A signed request, as-is (tests use it to tamper).
    pub fn signed(&self, method: &str, path: &str, body: &[u8]) -> Result<Response, ClientError> {
        let h = self.auth_headers(method, path, hmac_auth::unix_now(), body);
        self.request(method, path, &h, body)
    }

    /// Pushes an encoded update for a round.
    pub fn push_blob(&self, round: u64, blob: &[u8]) -> Result<PushOutcome, ClientError> {
        let path = format!("/v1/round/{round}/worker/{}", self.worker);
        let r = self.signed("PUT", &path, blob)?;
        match r.status {
            200 => Ok(PushOutcome::Accepted),
            409 => {
                let next = serde_json::from_slice::<serde_json::Value>(&r.body)
                    .ok()
                    .and_then(|v| v.get("current_round").and_then(|x| x.as_u64()))
                    .unwrap_or(round + 1);
                Ok(PushOutcome::RoundClosed { next_round: next })
            }
            s => Err(status_err(s, &r.body)),
        }
    }

    /// Encodes (in this client's mode) and pushes.
    pub fn push(&self, round: u64, delta: &Delta) -> Result<PushOutcome, ClientError> {
        let blob = wire::encode(self.mode, delta)?;
        self.push_blob(round, &blob)
    }

    /// Clips, noises and accounts the delta, then pushes it; refuses without sending once the budget is spent.
    pub fn push_private(
        &self,
        round: u64,
        mut delta: Delta,
        dp: &mut DpEngine,
    ) -> Result<(PushOutcome, DpReport), ClientError> {
        let report = dp.privatize(&mut delta)?;
        Ok((self.push(round, &delta)?, report))
    }

    /// Long-polls for the aggregate blob until `deadline` passes (each request is held by the coordinator).
    pub fn aggregate_blob(&self, round: u64, deadline: Duration) -> Result<Vec<u8>, ClientError> {
        let path = format!("/v1/round/{round}/aggregate");
        let until = std::time::Instant::now() + deadline;
        loop {
            let r = self.signed("GET", &path, b"")?;
            match r.status {
                200 => return Ok(r.body),
                503 | 202 if std::time::Instant::now() < until => {
                    if !self.use_nonce {
                        // Without a nonce an identical request in the same second has the same signature, which
                        // the coordinator's replay cache refuses: re-sign in the next second.
                        let ms = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.subsec_millis())
                            .unwrap_or(0);
                        std::thread::sleep(Duration::from_millis(1001 - ms as u64));
                    }
                    continue;
                }
                503 | 202 => return Err(ClientError::NotReady(round)),
                s => return Err(status_err(s, &r.body)),
            }
        }
    }

    pub fn aggregate(&self, round: u64, deadline: Duration) -> Result<Delta, ClientError> {
        let b = self.aggregate_blob(round, deadline)?;
        Ok(wire::decode(self.mode, &b)?)
    }

    /// Reports the end of a round (`{"loss", "step"}`).
    pub fn end(&self, round: u64, loss: f64, step: u64) -> Result<(), ClientError> {
        let body = serde_json::json!({"loss": loss, "step": step}).to_string();
        let r = self.signed("POST", &format!("/v1/round/{round}/end"), body.as_bytes())?;
        if r.status == 200 {
            Ok(())
        } else {
            Err(status_err(r.status, &r.body))
        }
    }

    /// Public topology.
    pub fn topology(&self) -> Result<serde_json::Value, ClientError> {
        let r = self.request("GET", "/v1/topology", &[], b"")?;
        if r.status != 200 {
            return Err(status_err(r.status, &r.body));
        }
        serde_json::from_slice(&r.body).map_err(|e| ClientError::Http(e.to_string()))
    }
}

fn status_err(status: u16, body: &[u8]) -> ClientError {
    ClientError::Status {
        status,
        body: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
    }
}

fn random_nonce() -> String {
    let b: [u8; 16] = rand::random();
    hmac_auth::to_hex(&b)
}
