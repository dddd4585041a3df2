//! Request authentication, gym-compatible: `X-Zen-Sig` = hex HMAC-SHA256 over `METHOD|PATH|TS|` + raw SHA-256 of the
//! body, keyed by the worker's secret; `X-Zen-Ts` within ±300 s. hearth adds what gym lacks: an optional nonce
//! (`X-Hearth-Nonce`, signed as `METHOD|PATH|TS|NONCE|` + digest) and a seen-signature cache, so a captured request
//! cannot be replayed inside the skew window.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

pub const HEADER_SIG: &str = "X-Zen-Sig";
pub const HEADER_TS: &str = "X-Zen-Ts";
pub const HEADER_WORKER: &str = "X-Zen-Worker";
pub const HEADER_NONCE: &str = "X-Hearth-Nonce";
/// gym's accepted clock skew.
pub const DEFAULT_SKEW_SECS: i64 = 300;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing or malformed header {0}")]
    Header(&'static str),
    #[error("unknown worker")]
    UnknownWorker,
    #[error("timestamp outside the accepted skew")]
    Stale,
    #[error("signature mismatch")]
    Signature,
    #[error("request already seen (replay)")]
    Replay,
    #[error("replay cache full")]
    CacheFull,
}

impl AuthError {
    /// Short reason for metrics labels and the `X-Hearth-Auth-Error` header.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Header(_) => "header",
            AuthError::UnknownWorker => "unknown_worker",
            AuthError::Stale => "stale",
            AuthError::Signature => "signature",
            AuthError::Replay => "replay",
            AuthError::CacheFull => "cache_full",
        }
    }
}

/// The exact bytes gym signs (plus hearth's optional nonce field).
pub fn signed_message(
    method: &str,
    path: &str,
    ts: i64,
    nonce: Option<&str>,
    body: &[u8],
) -> Vec<u8> {
    let mut m = Vec::with_capacity(method.len() + path.len() + 64);
    m.extend_from_slice(method.as_bytes());
    m.push(b'|');
    m.extend_from_slice(path.as_bytes());
    m.push(b'|');
    m.extend_from_slice(ts.to_string().as_bytes());
    m.push(b'|');
    if let Some(n) = nonce {
        m.extend_from_slice(n.as_bytes());
        m.push(b'|');
    }
    m.extend_from_slice(&Sha256::digest(body));
    m
}

fn mac(secret: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; new_from_slice cannot fail for it.
    match HmacSha256::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    }
}

/// Lowercase hex HMAC-SHA256 signature, as in `X-Zen-Sig`.
pub fn sign(
    secret: &[u8],
    method: &str,
    path: &str,
    ts: i64,
    nonce: Option<&str>,
    body: &[u8],
) -> String {
    let mut m = mac(secret);
    m.update(&signed_message(method, path, ts, nonce, body));
    to_hex(&m.finalize().into_bytes())
}

pub fn to_hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[(b >> 4) as usize] as char);
        s.push(D[(b & 15) as usize] as char);
    }
    s
}

pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks_exact(2)
        .map(|p| Some(nib(p[0])? << 4 | nib(p[1])?))
        .collect()
}

/// What a request carried, already pulled out of the headers.
#[derive(Debug, Clone)]
pub struct SignedRequest<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub ts: &'a str,
    pub sig: &'a str,
    pub nonce: Option<&'a str>,
    pub body: &'a [u8],
}

/// Checks skew then signature (constant-time compare). Does not touch the replay cache.
pub fn verify(
    secret: &[u8],
    req: &SignedRequest<'_>,
    now: i64,
    skew: i64,
) -> Result<[u8; 32], AuthError> {
    let ts: i64 = req
        .ts
        .trim()
        .parse()
        .map_err(|_| AuthError::Header(HEADER_TS))?;
    if (now - ts).abs() > skew {
        return Err(AuthError::Stale);
    }
    let sig = from_hex(req.sig.trim()).ok_or(AuthError::Header(HEADER_SIG))?;
    if sig.len() != 32 {
        return Err(AuthError::Header(HEADER_SIG));
    }
    if let Some(n) = req.nonce
        && (n.is_empty() || n.len() > 128 || n.contains('|'))
    {
        return Err(AuthError::Header(HEADER_NONCE));
    }
    let mut m = mac(secret);
    m.update(&signed_message(
        req.method, req.path, ts, req.nonce, req.body,
    ));
    m.verify_slice(&sig).map_err(|_| AuthError::Signature)?;
    let mut out = [0u8; 32];
    out.copy_from_slice(&sig);
    Ok(out)
}

/// Signatures seen within the skew window. A signature covers method, path, timestamp and body, so a second
/// arrival of the same one is a replay; entries expire once their timestamp falls out of the window (the skew check
/// rejects them from then on). Bounded: when full, new requests are refused rather than old entries evicted, so a
/// flood cannot push a captured signature out and replay it.
pub struct ReplayCache {
    inner: Mutex<ReplayInner>,
    capacity: usize,
}

struct ReplayInner {
    seen: HashMap<[u8; 32], i64>,
    order: VecDeque<([u8; 32], i64)>,
}

impl ReplayCache {
    pub fn new(capacity: usize) -> ReplayCache {
        ReplayCache {
            inner: Mutex::new(ReplayInner {
                seen: HashMap::new(),
                order: VecDeque::new(),
            }),
            capacity,
        }
    }

    /// Records `sig` (valid until `expires`), or says it was already seen.
    pub fn check_and_insert(&self, sig: [u8; 32], expires: i64, now: i64) -> Result<(), AuthError> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *g;
        // Expiry is not monotone in arrival order (timestamps vary by skew), so scan the front while expired and
        // let `seen` hold the truth.
        while let Some(&(s, e)) = inner.order.front() {
            if e >= now {
                break;
            }
            inner.order.pop_front();
            if inner.seen.get(&s) == Some(&e) {
                inner.seen.remove(&s);
            }
        }
        if let Some(&e) = inner.seen.get(&sig)
            && e >= now
        {
            return Err(AuthError::Replay);
        }
        if inner.seen.len() >= self.capacity {
            inner.seen.retain(|_, e| *e >= now);
            if inner.seen.len() >= self.capacity {
                return Err(AuthError::CacheFull);
            }
        }
        inner.seen.insert(sig, expires);
        inner.order.push_back((sig, expires));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .seen
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Unix seconds now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
