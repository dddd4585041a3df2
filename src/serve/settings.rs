//! A server's settings as a graph file writes them (the `Serve(...)` node's parameters).

use serde::{Deserialize, Serialize};

use super::{ServeConfig, default_model};
use crate::model::KvPrecision;

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
            ..ServeConfig::default()
        }
    }
}
