//! TLS for federation traffic (rustls with the ring provider): the coordinator serves HTTPS from a PEM
//! certificate chain and key; a worker trusts the CA certificates in a PEM file (a self-signed coordinator is
//! its own CA). HMAC signing stays on top: TLS hides the delta from the network, the signature still names the
//! worker.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("bad server name {0:?} (a DNS name or an IP address)")]
    ServerName(String),
}

/// The coordinator's certificate chain and private key, both PEM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

impl ServerTls {
    /// Loads and checks the files into a server configuration.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let certs = read_certs(&self.cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| file_err(&self.key, e))?;
        Ok(rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?)
    }
}

/// What a worker needs to talk TLS to one coordinator.
#[derive(Clone)]
pub struct ClientTls {
    pub config: Arc<rustls::ClientConfig>,
    pub server_name: ServerName<'static>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientTls({:?})", self.server_name)
    }
}

impl ClientTls {
    /// Trusts exactly the CA certificates in `ca_pem` (not the system store: a federation names its CA) and
    /// checks that the coordinator's certificate is for `server_name`.
    pub fn from_ca_file(ca_pem: &Path, server_name: &str) -> Result<ClientTls, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in read_certs(ca_pem)? {
            roots.add(c).map_err(|e| file_err(ca_pem, e))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = ServerName::try_from(server_name.to_owned())
            .map_err(|_| TlsError::ServerName(server_name.to_owned()))?;
        Ok(ClientTls {
            config: Arc::new(config),
            server_name,
        })
    }
}
