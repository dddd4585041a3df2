//! A server's settings as a graph file writes them (the `Serve(...)` node's parameters).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use super::{ServeConfig, ServeError, Server, default_model};
use crate::access::ApiKey;
use crate::model::Base;
use crate::model::KvPrecision;
use crate::model::Requantize;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeSettings {
    /// A GGUF path; `None` serves the default model (SmolLM2-135M-Instruct, cached in the data directory).
    pub model: Option<String>,
    /// The id the API lists for the base; defaults to the default model's name or the file stem.
    pub model_name: Option<String>,
    /// Where the OpenAI-compatible API listens (port 0 picks one; the bound address is logged).
    pub listen: String,
    /// Generation threads.
    pub threads: usize,
    /// Requests waiting beyond those running; more get 429.
    pub queue: usize,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens: usize,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// Adapters to load at start: `(id, PEFT directory)`.
    pub adapters: Vec<(String, String)>,
    /// Key/value cache precision per request (`F32` exact, `F16` half the memory; see [`ServeConfig`]).
    pub kv_cache: KvPrecision,
    /// Bytes of finished requests' KV caches kept so that a chat's next turn prefills only its new tokens.
    pub prompt_cache_bytes: usize,
    /// `Q8_0` re-encodes the base's block-quantized weights as Q8_0 at load (see [`Requantize`]); `Off`
    /// keeps the file's types.
    pub requantize: Requantize,
    /// Where generation runs: `cpu`, `cuda:N`, `rocm:N`, `auto` or `emulated` (see [`crate::gpu::Device`]).
    pub device: crate::gpu::Device,
}

impl Default for ServeSettings {
    fn default() -> Self {
        let c = ServeConfig::default();
        ServeSettings {
            model: None,
            model_name: None,
            listen: "127.0.0.1:8080".to_owned(),
            threads: c.threads,
            queue: c.queue_capacity,
            max_tokens: c.max_tokens_limit,
            max_body_bytes: c.max_body_bytes,
            adapters: Vec::new(),
            kv_cache: c.kv_cache,
            prompt_cache_bytes: c.prompt_cache_bytes,
            requantize: Requantize::Off,
            device: c.device,
        }
    }
}

impl ServeSettings {
    /// The serving limits these settings ask for.
    pub fn config(&self) -> ServeConfig {
        let model_name = self
            .model_name
            .clone()
            .unwrap_or_else(|| match &self.model {
                None => default_model::MODEL_NAME.to_owned(),
                Some(m) => std::path::Path::new(m)
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("hearth")
                    .to_owned(),
            });
        ServeConfig {
            model_name,
            queue_capacity: self.queue,
            threads: self.threads,
            max_tokens_limit: self.max_tokens,
            max_body_bytes: self.max_body_bytes,
            kv_cache: self.kv_cache,
            prompt_cache_bytes: self.prompt_cache_bytes,
            device: self.device,
            ..ServeConfig::default()
        }
    }
}

/// The only folder the API loads adapters from (`POST /v1/adapters`): `DATA_DIR/adapters`.
pub fn adapter_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("adapters")
}

/// Where the bound API address is written, so scripts and tests find a server started on port 0.
pub fn addr_file(data_dir: &Path, node_id: &str) -> PathBuf {
    data_dir.join(format!("{node_id}.addr"))
}

impl ServeSettings {
    /// The API key of a server in `data_dir` ([`ApiKey::resolve`]), once `listen` is allowed with it or
    /// without one: cheap, so it is checked before the model loads.
    pub fn api_key(&self, data_dir: &Path) -> Result<Option<ApiKey>, ServeError> {
        let key = ApiKey::resolve(data_dir)?;
        crate::access::check_listen(&self.listen, key.as_ref())?;
        Ok(key)
    }

    /// Serves `base` with these settings: loads the listed adapters, starts the API and writes its bound
    /// address to [`addr_file`]. With `commit_timeout`, answers wait until the graph stored the item
    /// ([`ServeConfig::commit_timeout`]). The API key comes from the environment or `data_dir`
    /// ([`ApiKey::resolve`]), never from these settings; the API loads adapters only from
    /// [`adapter_dir`].
    pub fn start(
        &self,
        base: &Base,
        data_dir: &Path,
        node_id: &str,
        commit_timeout: Option<std::time::Duration>,
    ) -> Result<(Server, SocketAddr), ServeError> {
        let adapters = adapter_dir(data_dir);
        std::fs::create_dir_all(&adapters).map_err(|source| ServeError::CreateDir {
            path: adapters.clone(),
            source,
        })?;
        let config = ServeConfig {
            commit_timeout,
            api_key: self.api_key(data_dir)?,
            adapter_dir: Some(adapters),
            ..self.config()
        };
        let server = Server::from_base(base, config)?;
        for (id, dir) in &self.adapters {
            server.engine().load_adapter(id, Path::new(dir))?;
        }
        let addr = server.listen(&self.listen)?;
        let file = addr_file(data_dir, node_id);
        std::fs::create_dir_all(data_dir)
            .and_then(|_| std::fs::write(&file, addr.to_string()))
            .map_err(|source| ServeError::AddrFile { path: file, source })?;
        Ok((server, addr))
    }
}

/// Running servers by key (a node in a data directory): a server outlives a worker restart, which must not
/// drop the port or the requests in flight.
fn servers() -> &'static Mutex<HashMap<String, Arc<Server>>> {
    static SERVERS: OnceLock<Mutex<HashMap<String, Arc<Server>>>> = OnceLock::new();
    SERVERS.get_or_init(Default::default)
}

/// The server running under `key`, started by `start` if there is none.
pub fn running_or_start<E>(
    key: &str,
    start: impl FnOnce() -> Result<Server, E>,
) -> Result<Arc<Server>, E> {
    let mut map = servers().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = map.get(key) {
        return Ok(s.clone());
    }
    let server = Arc::new(start()?);
    map.insert(key.to_owned(), server.clone());
    Ok(server)
}

/// Takes the server running under `key` out of the registry, to stop it.
pub fn take_running(key: &str) -> Option<Arc<Server>> {
    servers()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `requantize` is read from a graph's parameters, and is `Off` when absent.
    #[test]
    fn requantize_is_read() {
        let s: ServeSettings = ron::from_str("(requantize: Q8_0)").unwrap();
        assert_eq!(s.requantize, Requantize::Q8_0);
        let s: ServeSettings = ron::from_str("()").unwrap();
        assert_eq!(s.requantize, Requantize::Off);
        assert!(ron::from_str::<ServeSettings>("(requantize: Q4K)").is_err());
    }
}
