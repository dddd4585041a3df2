//! Who may reach hearth's HTTP servers: the OpenAI-compatible API and the control port.
//!
//! Both listen on loopback by default, which every local process and every web page the user opens can
//! reach. A page may send a form post or a `no-cors` fetch to 127.0.0.1 without the server's consent
//! (browsers send "simple" requests without a CORS preflight), and a DNS-rebinding page can even read the
//! answers. Since feedback and interactions feed training, that would let any page teach the model. So every
//! request must name this server in `Host`, must not come from another origin, must be JSON if it has a
//! body, and, when an API key is set, must present it as `Authorization: Bearer KEY`. Listening anywhere
//! but loopback needs a key.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderMap};
use actix_web::middleware::Next;
use actix_web::{Error, HttpResponse};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::files::{PrivateFileError, read_private_file};

/// The environment variable that holds the API key; it wins over the key file.
pub const KEY_ENV: &str = "HEARTH_API_KEY";
/// The key file's name in the data directory, read when [`KEY_ENV`] is unset. Group/other must not read it.
pub const KEY_FILE: &str = "api_key";

/// Why a server will not start as configured.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The key file is unreadable, or readable by group/others (the message names the file and the rule).
    #[error(transparent)]
    KeyFile(#[from] PrivateFileError),
    #[error("the API key in {from} is {why}")]
    BadKey { from: String, why: &'static str },
    #[error(
        "refusing to listen on {addr}: a non-loopback address needs an API key ({KEY_ENV}, or \
         DATA_DIR/{KEY_FILE} with mode 600)"
    )]
    PublicWithoutKey { addr: String },
}

/// An API key, kept only as its SHA-256.
#[derive(Clone)]
pub struct ApiKey {
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl ApiKey {
    /// A key from its text, as clients will send it.
    pub fn new(key: &str) -> ApiKey {
        ApiKey {
            digest: Sha256::digest(key.as_bytes()).into(),
        }
    }

    /// The key from [`KEY_ENV`], or else from `DATA_DIR/`[`KEY_FILE`]; `None` when neither is there. Never
    /// from a graph file: those get shared and committed.
    pub fn resolve(data_dir: &Path) -> Result<Option<ApiKey>, AccessError> {
        let env = match std::env::var(KEY_ENV) {
            Ok(v) => Some(v),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(AccessError::BadKey {
                    from: KEY_ENV.to_owned(),
                    why: NOT_PRINTABLE,
                });
            }
        };
        Self::resolve_from(env, data_dir)
    }

    /// [`ApiKey::resolve`] with the variable's value passed in, so tests need not change the environment.
    pub fn resolve_from(
        env: Option<String>,
        data_dir: &Path,
    ) -> Result<Option<ApiKey>, AccessError> {
        if let Some(v) = env {
            return Self::checked(&v, KEY_ENV.to_owned()).map(Some);
        }
        let file = data_dir.join(KEY_FILE);
        if std::fs::symlink_metadata(&file).is_err() {
            return Ok(None);
        }
        let text = read_private_file(&file)?;
        Self::checked(&text, file.display().to_string()).map(Some)
    }

    /// Surrounding whitespace (a file's newline) is not part of the key; inside, a header value's visible
    /// ASCII only, so that what a client can send is exactly the key.
    fn checked(text: &str, from: String) -> Result<ApiKey, AccessError> {
        let key = text.trim();
        let why = if key.is_empty() {
            "empty"
        } else if !key.bytes().all(|b| b.is_ascii_graphic()) {
            NOT_PRINTABLE
        } else {
            return Ok(ApiKey::new(key));
        };
        Err(AccessError::BadKey { from, why })
    }

    /// Whether `presented` is the key. Hashing first gives both sides 32 bytes, so the constant-time
    /// comparison's duration reveals neither the key's bytes nor its length.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let digest = Sha256::digest(presented);
        digest.as_slice().ct_eq(&self.digest).into()
    }
}

const NOT_PRINTABLE: &str = "not printable ASCII without spaces (clients send it in a header)";

/// Refuses a listen address that is not loopback unless a key is set. A name is checked by what it resolves
/// to; one that does not resolve is left for the bind to report.
pub fn check_listen(addr: &str, key: Option<&ApiKey>) -> Result<(), AccessError> {
    if key.is_some() {
        return Ok(());
    }
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default();
    if resolved.iter().all(|a| a.ip().is_loopback()) {
        Ok(())
    } else {
        Err(AccessError::PublicWithoutKey {
            addr: addr.to_owned(),
        })
    }
}

/// A refused request: the status and an OpenAI-shaped error.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: &'static str, message: String) -> Self {
        Refusal {
            status,
            code,
            message,
        }
    }

    pub fn response(&self) -> HttpResponse {
        let mut b = HttpResponse::build(self.status);
        if self.status == StatusCode::UNAUTHORIZED {
            b.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        b.json(serde_json::json!({"error": {
            "message": self.message,
            "type": "invalid_request_error",
            "param": null,
            "code": self.code,
        }}))
    }
}

/// What every request to one server must satisfy (see the module's doc); wrap each app in
/// `from_fn(move |req, next| access.clone().guard(req, next))`.
#[derive(Debug, Clone, Default)]
pub struct Access {
    key: Option<ApiKey>,
    /// Paths whose `GET` needs no key (every other rule still applies): the status page's shell, which a
    /// browser must load before it can ask its user for the key. It carries no data.
    keyless_get: &'static [&'static str],
}

impl Access {
    pub fn new(key: Option<ApiKey>) -> Self {
        Access {
            key,
            keyless_get: &[],
        }
    }

    /// [`Access::new`], letting a `GET` of one of `paths` through without the key.
    pub fn with_keyless_get(mut self, paths: &'static [&'static str]) -> Self {
        self.keyless_get = paths;
        self
    }

    pub fn key(&self) -> Option<&ApiKey> {
        self.key.as_ref()
    }

    /// See [`check_listen`].
    pub fn check_listen(&self, addr: &str) -> Result<(), AccessError> {
        check_listen(addr, self.key.as_ref())
    }

    /// The middleware: passes the request on, or answers its refusal without running the handler.
    pub async fn guard<B: MessageBody>(
        self,
        req: ServiceRequest,
        next: Next<B>,
    ) -> Result<ServiceResponse<EitherBody<B>>, Error> {
        let keyless =
            req.method() == actix_web::http::Method::GET && self.keyless_get.contains(&req.path());
        let access = if keyless { Access::new(None) } else { self };
        match access.verdict(req.headers(), req.app_config().local_addr()) {
            Ok(()) => next
                .call(req)
                .await
                .map(ServiceResponse::map_into_left_body),
            Err(r) => Ok(req.into_response(r.response()).map_into_right_body()),
        }
    }

    /// Checks one request's headers, for a server listening on `local`: the rules in the order a refusal
    /// names them.
    pub fn verdict(&self, headers: &HeaderMap, local: SocketAddr) -> Result<(), Refusal> {
        let host = text(headers, &header::HOST).to_ascii_lowercase();
        if !host_allowed(&host, local) {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                format!(
                    "the Host `{host}` is not this server's address ({}): requests through another name are \
                     refused (DNS rebinding)",
                    own_hosts(local).join(" or ")
                ),
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or_default().to_ascii_lowercase();
            if origin != format!("http://{host}") {
                return Err(Refusal::new(
                    StatusCode::FORBIDDEN,
                    "origin_not_allowed",
                    format!(
                        "the Origin `{origin}` is not this server (http://{host}): cross-site requests are \
                         refused"
                    ),
                ));
            }
        }
        // Browsers mark every request they send, including the no-cors ones that carry no Origin.
        let site = text(headers, &header::HeaderName::from_static("sec-fetch-site"));
        if site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site") {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                format!("a {site} request (Sec-Fetch-Site): cross-site requests are refused"),
            ));
        }
        if let Some(key) = &self.key {
            let auth = text(headers, &header::AUTHORIZATION);
            let token = auth
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, t)| t.trim());
            let message = match token {
                None => "this server requires an API key: send `Authorization: Bearer KEY`",
                Some(t) if !key.matches(t.as_bytes()) => "incorrect API key provided",
                Some(_) => "",
            };
            if !message.is_empty() {
                return Err(Refusal::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_api_key",
                    message.to_owned(),
                ));
            }
        }
        // A body of another type is what a browser may post cross-site without asking (a form, text/plain).
        let length = text(headers, &header::CONTENT_LENGTH);
        let has_body = !(length.is_empty() || length == "0")
            || headers.contains_key(header::TRANSFER_ENCODING)
            || headers.contains_key(header::CONTENT_TYPE);
        let media = text(headers, &header::CONTENT_TYPE);
        let media = media.split(';').next().unwrap_or_default().trim();
        if has_body && !media.eq_ignore_ascii_case("application/json") {
            let media = if media.is_empty() { "none" } else { media };
            return Err(Refusal::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "a request body must be `Content-Type: application/json`, not `{media}`: other types \
                     are what a web page can send cross-site"
                ),
            ));
        }
        Ok(())
    }
}

/// A header's value as text; absent or not text is empty.
fn text<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim()
}

/// The `Host` values that name a server listening on `local`: its address and `localhost`, with the port
/// (without it too on port 80).
fn own_hosts(local: SocketAddr) -> Vec<String> {
    let ip = match local.ip() {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    let port = local.port();
    let mut hosts = vec![format!("{ip}:{port}"), format!("localhost:{port}")];
    if port == 80 {
        hosts.extend([ip, "localhost".to_owned()]);
    }
    hosts
}

/// On loopback, where a server may run without a key, `Host` must name it. Elsewhere a key is required,
/// and it is what keeps a rebinding page out (a page cannot know it), so any name the network gives the
/// machine is accepted.
fn host_allowed(host: &str, local: SocketAddr) -> bool {
    !local.ip().is_loopback() || own_hosts(local).iter().any(|h| h == host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_static(k),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const LOCAL: &str = "127.0.0.1:8080";

    fn code(access: &Access, pairs: &[(&'static str, &str)]) -> Result<(), &'static str> {
        access
            .verdict(&headers(pairs), LOCAL.parse().unwrap())
            .map_err(|r| r.code)
    }

    #[test]
    fn host_must_name_this_server_on_loopback() {
        let open = Access::default();
        assert_eq!(code(&open, &[("host", "127.0.0.1:8080")]), Ok(()));
        assert_eq!(code(&open, &[("host", "LOCALHOST:8080")]), Ok(()));
        for bad in ["evil.example:8080", "127.0.0.1:8081", "localhost", ""] {
            assert_eq!(
                code(&open, &[("host", bad)]),
                Err("host_not_allowed"),
                "{bad}"
            );
        }
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        assert!(
            open.verdict(&headers(&[("host", "[::1]:9")]), v6).is_ok(),
            "v6"
        );
        // Off loopback a key is required, and any name reaches the key check.
        let public: SocketAddr = "0.0.0.0:9".parse().unwrap();
        let keyed = Access::new(Some(ApiKey::new("k")));
        let r = keyed.verdict(&headers(&[("host", "box.lan:9")]), public);
        assert_eq!(r.map_err(|r| r.code), Err("invalid_api_key"));
    }

    #[test]
    fn origin_and_fetch_site_must_be_this_server() {
        let open = Access::default();
        let host = ("host", LOCAL);
        assert_eq!(
            code(&open, &[host, ("origin", "http://127.0.0.1:8080")]),
            Ok(())
        );
        for bad in ["http://evil.example", "null", "http://localhost:8080"] {
            assert_eq!(
                code(&open, &[host, ("origin", bad)]),
                Err("origin_not_allowed"),
                "{bad}"
            );
        }
        assert_eq!(
            code(&open, &[host, ("sec-fetch-site", "same-origin")]),
            Ok(())
        );
        assert_eq!(code(&open, &[host, ("sec-fetch-site", "none")]), Ok(()));
        assert_eq!(
            code(&open, &[host, ("sec-fetch-site", "cross-site")]),
            Err("origin_not_allowed")
        );
    }

    #[test]
    fn a_body_must_be_json() {
        let open = Access::default();
        let host = ("host", LOCAL);
        let json = ("content-type", "application/json; charset=utf-8");
        assert_eq!(code(&open, &[host, json, ("content-length", "2")]), Ok(()));
        assert_eq!(code(&open, &[host]), Ok(()));
        assert_eq!(code(&open, &[host, ("content-length", "0")]), Ok(()));
        for bad in [
            vec![
                host,
                ("content-type", "text/plain"),
                ("content-length", "2"),
            ],
            vec![host, ("content-length", "2")],
            vec![host, ("transfer-encoding", "chunked")],
            vec![host, ("content-type", "application/x-www-form-urlencoded")],
        ] {
            assert_eq!(code(&open, &bad), Err("unsupported_media_type"), "{bad:?}");
        }
    }

    #[test]
    fn a_set_key_must_be_presented_as_bearer() {
        let keyed = Access::new(Some(ApiKey::new("s3cret")));
        let host = ("host", LOCAL);
        assert_eq!(
            code(&keyed, &[host, ("authorization", "Bearer s3cret")]),
            Ok(())
        );
        assert_eq!(
            code(&keyed, &[host, ("authorization", "bearer s3cret")]),
            Ok(())
        );
        for bad in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "Basic s3cret",
            "s3cret",
            "",
        ] {
            assert_eq!(
                code(&keyed, &[host, ("authorization", bad)]),
                Err("invalid_api_key"),
                "{bad}"
            );
        }
        assert_eq!(code(&keyed, &[host]), Err("invalid_api_key"));
    }

    #[test]
    fn only_loopback_listens_without_a_key() {
        assert!(check_listen("127.0.0.1:0", None).is_ok());
        assert!(check_listen("[::1]:0", None).is_ok());
        assert!(check_listen("localhost:0", None).is_ok());
        let e = check_listen("0.0.0.0:8080", None).unwrap_err().to_string();
        assert!(
            e.contains("0.0.0.0:8080") && e.contains("non-loopback"),
            "{e}"
        );
        assert!(check_listen("0.0.0.0:8080", Some(&ApiKey::new("k"))).is_ok());
    }

    #[test]
    fn the_key_comes_from_the_variable_or_a_private_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        assert!(ApiKey::resolve_from(None, dir.path()).unwrap().is_none());
        let file = dir.path().join(KEY_FILE);
        std::fs::write(&file, "from-file\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ApiKey::resolve_from(None, dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&file.display().to_string()) && e.contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = ApiKey::resolve_from(None, dir.path()).unwrap().unwrap();
        assert!(key.matches(b"from-file") && !key.matches(b"from-file\n"));
        // The variable wins over the file.
        let key = ApiKey::resolve_from(Some("from-env".into()), dir.path())
            .unwrap()
            .unwrap();
        assert!(key.matches(b"from-env") && !key.matches(b"from-file"));
        for bad in ["", "  ", "two words"] {
            let e = ApiKey::resolve_from(Some(bad.into()), dir.path()).unwrap_err();
            assert!(e.to_string().contains(KEY_ENV), "{e}");
        }
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
    }
}
