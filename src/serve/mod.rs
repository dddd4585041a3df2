//! Serving: one frozen quantized base shared by every request, several LoRA adapters resident at once, and a
//! bounded request queue in front of dedicated generation threads.
//!
//! Why this shape: generation is CPU-heavy and must not run on the HTTP threads, and a queue without bound
//! would hide overload until memory runs out, so a full queue is reported to the client (429) instead.
//! Adapters live in [`AdapterRegistry`]: a request takes an `Arc` snapshot of its adapter when it is
//! admitted, so loading, replacing or unloading an adapter never disturbs a request in flight.

pub mod default_model;
pub mod follow;
pub mod http;
pub mod settings;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, SendTimeoutError, Sender, TrySendError};

use crate::clock::now_unix_ms;
use crate::message::{
    Commit, CommitWait, Delta, Feedback, FeedbackKind, Interaction, NotCommitted, Role,
};
use crate::model::{
    AdapterRegistry, Base, CachedPrefix, ChatMessage, GenerateConfig, KvPrecision, LoraSet,
    ModelError, StopReason, Tokenizer, Transformer, encode_chat,
};

/// Everything serving can fail with; the HTTP layer maps each to a status code.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the model `{0}` does not exist (not the base and not a resident adapter)")]
    UnknownModel(String),
    #[error("adapter `{0}` is not resident")]
    UnknownAdapter(String),
    /// A request's `lora` mix names an adapter that is not resident, or one that cannot be mixed.
    #[error("lora: {0}")]
    BadLora(String),
    #[error(
        "invalid adapter id `{0}`: use 1-128 of A-Z a-z 0-9 . _ - : and not the base model's name"
    )]
    BadAdapterId(String),
    #[error("cannot load adapter `{id}` from {path}: {reason}")]
    AdapterLoad {
        id: String,
        path: String,
        reason: String,
    },
    #[error("{0}")]
    TooManyTokens(String),
    #[error("request queue is full ({0} waiting); retry later")]
    QueueFull(usize),
    #[error("the server is shutting down")]
    Closed,
    #[error("unknown response id `{0}`")]
    UnknownResponse(String),
    #[error("default model: {0}")]
    DefaultModel(String),
    #[error("http: {0}")]
    Http(String),
    #[error("cannot spawn a generation thread: {0}")]
    Spawn(std::io::Error),
    #[error(
        "delta `{delta}` adapts base {adapts}, but this server serves base {served}; not swapped"
    )]
    OtherBase {
        delta: String,
        adapts: String,
        served: String,
    },
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("generation failed: {0}")]
    Generation(String),
    #[error("not acknowledged: {0}")]
    NotCommitted(#[from] NotCommitted),
    #[error("the served delta `{0}` is not in the store")]
    ServedUnknown(String),
    #[error(
        "refusing adapter path {path}: the API loads adapters only from {root} (the data directory's \
         adapters folder)"
    )]
    AdapterOutside { path: String, root: PathBuf },
    #[error(
        "refusing adapter path {0}: no adapters folder is configured (ServeConfig::adapter_dir), so the API \
         loads no adapters"
    )]
    NoAdapterDir(String),
    #[error(transparent)]
    Access(#[from] crate::access::AccessError),
    #[error("cannot create {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the API address to {path}: {source}")]
    AddrFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Serving limits and sizes. Defaults suit one person on a laptop.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The id under which the base model is listed and requested.
    pub model_name: String,
    /// Requests admitted but not yet started; past this a request gets 429.
    pub queue_capacity: usize,
    /// Generation threads (each runs one request at a time).
    pub threads: usize,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
    /// `max_tokens` when a request does not say.
    pub default_max_tokens: usize,
    /// Largest request body, in bytes (413 above).
    pub max_body_bytes: usize,
    /// How many recent response ids feedback may refer to.
    pub recent_responses: usize,
    /// Precision of each request's key/value cache: f16 halves the memory a long chat holds, at a small drift
    /// in the logits; f32 (the default) answers exactly as the eval gate's forward computes.
    pub kv_cache: KvPrecision,
    /// Bytes of finished requests' KV caches kept for reuse: a request whose prompt starts with a kept one's
    /// tokens (the next turn of a chat, a shared system prompt) under the same adapter prefills only the rest.
    /// 0 keeps none.
    pub prompt_cache_bytes: usize,
    /// When set, an answer (and a feedback's 200) waits until the graph has stored the item, up to this long
    /// (see [`crate::message::Commit`]); otherwise answers never wait for the store.
    pub commit_timeout: Option<Duration>,
    /// When set, every API request must carry it as `Authorization: Bearer`; listening off loopback needs it.
    pub api_key: Option<crate::access::ApiKey>,
    /// The only folder `POST /v1/adapters` loads from (`DATA_DIR/adapters` for a serve node). `None`: the API
    /// loads no adapters, since a request must never name an arbitrary path on the machine.
    pub adapter_dir: Option<PathBuf>,
    /// Where generation runs. A GPU that does not open, or a model its decode step does not cover, leaves
    /// generation on the CPU with the reason in [`Engine::device`] (and in `GET /v1/models`).
    pub device: crate::gpu::Device,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            model_name: "hearth".to_owned(),
            queue_capacity: 16,
            threads: 1,
            max_tokens_limit: 1024,
            default_max_tokens: 256,
            max_body_bytes: 1 << 20,
            recent_responses: 10_000,
            kv_cache: KvPrecision::F32,
            prompt_cache_bytes: 256 << 20,
            commit_timeout: None,
            api_key: None,
            adapter_dir: None,
            device: crate::gpu::Device::Cpu,
        }
    }
}

/// What a request asks the model to continue.
#[derive(Debug, Clone)]
pub enum PromptInput {
    /// A conversation, rendered with the model's ChatML template.
    Chat(Vec<ChatMessage>),
    /// Raw text (`/v1/completions`).
    Text(String),
}

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// `None` or the base name: the requesting `user`'s own adapter if one is routed to them, else the default
    /// adapter (if one is set) on the base; otherwise that adapter.
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub user: String,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// vLLM's extension: keep generating past end-of-sequence tokens (benchmarks, tests).
    pub ignore_eos: bool,
    /// llama.cpp's per-request `lora: [{id, scale}]`: resident adapters summed with a scale each, for this
    /// request only, in place of the adapter `model` names. `Some(empty)`: the base alone.
    pub lora: Option<Vec<(String, f64)>>,
    /// A text prompt's special-token strings (`<|im_start|>`) become those tokens, as llama.cpp's server and vLLM
    /// parse them; `"parse_special": false` encodes them as plain text. Chat messages are always text.
    pub parse_special: bool,
}

/// What a generation thread reports to the request's waiter, in order: text pieces, then one end.
#[derive(Debug, Clone)]
pub enum StreamEvent {
    Text(String),
    Done(Completion),
    Failed(String),
    /// Generated, but the interaction was not stored, so it is not acknowledged.
    Uncommitted(NotCommitted),
}

/// The end of a finished request.
#[derive(Debug, Clone)]
pub struct Completion {
    pub text: String,
    /// OpenAI's `finish_reason`: `stop` or `length`.
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from an earlier request's cache (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`).
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
}

#[derive(Default)]
struct PipeState {
    events: VecDeque<StreamEvent>,
    waker: Option<Waker>,
}

/// A one-request channel from a generation thread to its HTTP handler, readable both blocking (JSON
/// answers) and as an async stream (SSE) without an async runtime dependency of its own.
#[derive(Default)]
pub struct Pipe {
    state: Mutex<PipeState>,
    ready: Condvar,
    /// Set when the client went away, so generation stops early.
    cancelled: AtomicBool,
}

impl Pipe {
    fn push(&self, event: StreamEvent) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.events.push_back(event);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        self.ready.notify_all();
    }

    /// Blocks until the request ends; returns its completion or failure.
    pub fn wait(&self) -> Result<Completion, ServeError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            while let Some(e) = s.events.pop_front() {
                match e {
                    StreamEvent::Text(_) => {}
                    StreamEvent::Done(c) => return Ok(c),
                    StreamEvent::Failed(m) => return Err(ServeError::Generation(m)),
                    StreamEvent::Uncommitted(e) => return Err(ServeError::NotCommitted(e)),
                }
            }
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Blocks for the next event (text pieces as they come, then the end).
    pub fn next_event(&self) -> StreamEvent {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(e) = s.events.pop_front() {
                return e;
            }
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The next event if there is one; otherwise registers `waker` to be woken by the next push.
    pub fn poll_event(&self, waker: &Waker) -> Option<StreamEvent> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let e = s.events.pop_front();
        if e.is_none() {
            s.waker = Some(waker.clone());
        }
        e
    }

    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

/// A request admitted to the queue.
pub struct Admitted {
    pub id: String,
    /// The name the response reports (`model` as requested, or the base name).
    pub model: String,
    pub created_unix: u64,
    pub pipe: Arc<Pipe>,
}

struct Job {
    id: String,
    user: String,
    adapter: Option<String>,
    lora: Option<Arc<LoraSet>>,
    ids: Vec<u32>,
    prompt: Vec<ChatMessage>,
    cfg: GenerateConfig,
    sampling: serde_json::Value,
    admitted: Instant,
    created_unix_ms: u64,
    pipe: Arc<Pipe>,
}

/// What serving emits for the rest of the graph.
#[derive(Debug, Clone)]
pub enum ServeEvent {
    Interaction(Interaction),
    Feedback(Feedback),
}

/// Response ids that feedback may name, with the user who got them; oldest evicted first.
#[derive(Default)]
struct Recent {
    users: HashMap<String, String>,
    order: VecDeque<String>,
}

/// The shared serving state: model, adapters, queue. Cheap to share across HTTP and generation threads.
pub struct Engine {
    model: Arc<Transformer>,
    tok: Arc<Tokenizer>,
    registry: AdapterRegistry,
    default_adapter: RwLock<Option<String>>,
    /// Per-user routes: the resident adapter that answers a user's requests for the base (their own promoted
    /// delta) in place of the default.
    user_adapters: RwLock<HashMap<String, String>>,
    config: ServeConfig,
    queue: Sender<Job>,
    queue_rx: Receiver<Job>,
    events: Sender<ServeEvent>,
    recent: Mutex<Recent>,
    next_id: AtomicU64,
    id_prefix: String,
    closing: AtomicBool,
    prompt_cache: PromptCache,
    /// The GPU decoders generation runs on, one per generation thread over one copy of the weights, each with
    /// the adapter snapshot it holds; empty on the CPU.
    gpu: Vec<Mutex<GpuSlot>>,
    device: crate::model::DeviceStatus,
}

struct GpuSlot {
    decoder: crate::model::GpuDecoder,
    adapter: Option<Arc<LoraSet>>,
}

/// Finished requests' KV caches, most recently used first, within a byte budget. A request takes the entry
/// that shares the longest prefix with its prompt (so two requests never share one cache) and gives back its
/// own cache when done. Entries are matched by the adapter snapshot they were computed under: an entry holds
/// that `Arc`, so a replaced or unloaded adapter's entries match nothing, and they are dropped at the next
/// `put`, so that the cache never keeps an unloaded adapter's weights alive.
struct PromptCache {
    budget_bytes: usize,
    entries: Mutex<VecDeque<(Option<Arc<LoraSet>>, CachedPrefix)>>,
}

impl PromptCache {
    fn same_adapter(a: &Option<Arc<LoraSet>>, b: &Option<Arc<LoraSet>>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The entry for `lora` sharing the longest prefix with `prompt`, removed from the store; `None` when none
    /// shares a position.
    fn take(&self, lora: &Option<Arc<LoraSet>>, prompt: &[u32]) -> Option<CachedPrefix> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (best, shared) = entries
            .iter()
            .enumerate()
            .filter(|(_, (a, _))| Self::same_adapter(a, lora))
            .map(|(i, (_, c))| (i, c.reusable_for(prompt)))
            .max_by_key(|&(_, shared)| shared)?;
        if shared == 0 {
            return None;
        }
        entries.remove(best).map(|(_, c)| c)
    }

    /// Keeps `prefix` as the most recent entry, dropping entries whose adapter is no longer `installed` and
    /// then the oldest while over budget.
    fn put(
        &self,
        lora: Option<Arc<LoraSet>>,
        prefix: CachedPrefix,
        installed: impl Fn(&Arc<LoraSet>) -> bool,
    ) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|(a, _)| a.as_ref().is_none_or(&installed));
        let fits = prefix.cache.bytes() <= self.budget_bytes && !prefix.tokens.is_empty();
        if !fits || lora.as_ref().is_some_and(|a| !installed(a)) {
            return;
        }
        entries.push_front((lora, prefix));
        while entries.iter().map(|(_, c)| c.cache.bytes()).sum::<usize>() > self.budget_bytes {
            entries.pop_back();
        }
    }
}

impl Engine {
    pub fn config(&self) -> &ServeConfig {
        &self.config
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// Resident adapter ids, sorted.
    pub fn adapters(&self) -> Vec<String> {
        self.registry.names()
    }

    /// The adapter that answers requests naming the base (set by a promoted delta).
    pub fn default_adapter(&self) -> Option<String> {
        self.default_adapter
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes `id` (which must be resident) the default adapter, or clears it.
    pub fn set_default_adapter(&self, id: Option<&str>) -> Result<(), ServeError> {
        if let Some(id) = id
            && self.registry.get(id).is_none()
        {
            return Err(ServeError::UnknownAdapter(id.to_owned()));
        }
        *self
            .default_adapter
            .write()
            .unwrap_or_else(|p| p.into_inner()) = id.map(str::to_owned);
        Ok(())
    }

    fn check_adapter_id(&self, id: &str) -> Result<(), ServeError> {
        let ok = !id.is_empty()
            && id.len() <= 128
            && id != self.config.model_name
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'));
        if ok {
            Ok(())
        } else {
            Err(ServeError::BadAdapterId(id.to_owned()))
        }
    }

    /// The adapter routed to `user`, if any.
    pub fn user_adapter(&self, user: &str) -> Option<String> {
        self.user_adapters
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(user)
            .cloned()
    }

    /// Every per-user route, by user.
    pub fn user_adapters(&self) -> Vec<(String, String)> {
        let mut routes: Vec<_> = self
            .user_adapters
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(u, a)| (u.clone(), a.clone()))
            .collect();
        routes.sort();
        routes
    }

    /// Routes `user`'s requests for the base to `id` (which must be resident), or back to the default.
    /// Returns the adapter routed before.
    pub fn set_user_adapter(
        &self,
        user: &str,
        id: Option<&str>,
    ) -> Result<Option<String>, ServeError> {
        if let Some(id) = id
            && self.registry.get(id).is_none()
        {
            return Err(ServeError::UnknownAdapter(id.to_owned()));
        }
        let mut routes = self
            .user_adapters
            .write()
            .unwrap_or_else(|p| p.into_inner());
        Ok(match id {
            Some(id) => routes.insert(user.to_owned(), id.to_owned()),
            None => routes.remove(user),
        })
    }

    /// Whether anything still answers with `id`: the default or a user's route.
    fn adapter_in_use(&self, id: &str) -> bool {
        self.default_adapter().as_deref() == Some(id)
            || self
                .user_adapters
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .any(|a| a == id)
    }

    /// Loads a PEFT adapter directory under `id`, replacing any adapter of that id; requests already
    /// admitted keep the set they started with. Returns whether an adapter was replaced.
    pub fn load_adapter(&self, id: &str, dir: &Path) -> Result<bool, ServeError> {
        self.check_adapter_id(id)?;
        let load_err = |reason: String| ServeError::AdapterLoad {
            id: id.to_owned(),
            path: dir.display().to_string(),
            reason,
        };
        let set =
            LoraSet::load_peft(dir, self.model.config()).map_err(|e| load_err(e.to_string()))?;
        set.check_compatible(&self.model)
            .map_err(|e| load_err(e.to_string()))?;
        Ok(self.insert_adapter(id, Arc::new(set))?.is_some())
    }

    /// Where an API request's adapter `path` is: inside [`ServeConfig::adapter_dir`] (a relative path is
    /// taken from there) once symlinks and `..` are resolved, or refused.
    pub fn adapter_path(&self, id: &str, requested: &str) -> Result<PathBuf, ServeError> {
        let Some(root) = &self.config.adapter_dir else {
            return Err(ServeError::NoAdapterDir(requested.to_owned()));
        };
        let outside = || ServeError::AdapterOutside {
            path: requested.to_owned(),
            root: root.clone(),
        };
        let root = root.canonicalize().map_err(|_| outside())?;
        let path = root.join(requested).canonicalize().map_err(|e| {
            if Path::new(requested).is_absolute() && !Path::new(requested).starts_with(&root) {
                outside()
            } else {
                ServeError::AdapterLoad {
                    id: id.to_owned(),
                    path: requested.to_owned(),
                    reason: e.to_string(),
                }
            }
        })?;
        if path.starts_with(&root) && path != root {
            Ok(path)
        } else {
            Err(outside())
        }
    }

    /// Installs an in-memory adapter (e.g. a trainer's snapshot).
    pub fn insert_adapter(
        &self,
        id: &str,
        set: Arc<LoraSet>,
    ) -> Result<Option<Arc<LoraSet>>, ServeError> {
        self.check_adapter_id(id)?;
        set.check_compatible(&self.model)?;
        Ok(self.registry.insert(id, set))
    }

    /// Unloads `id`; if it was the default adapter, requests for the base get the bare base again.
    pub fn unload_adapter(&self, id: &str) -> Result<(), ServeError> {
        self.registry
            .remove(id)
            .ok_or_else(|| ServeError::UnknownAdapter(id.to_owned()))?;
        let mut d = self
            .default_adapter
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if d.as_deref() == Some(id) {
            *d = None;
        }
        self.user_adapters
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, a| a != id);
        Ok(())
    }

    /// Which adapter (if any) answers `user`'s request for `model`, and its snapshot.
    fn resolve(
        &self,
        model: Option<&str>,
        user: &str,
    ) -> Result<Option<(String, Arc<LoraSet>)>, ServeError> {
        let name = match model {
            Some(m) if m != self.config.model_name => Some(m.to_owned()),
            _ => self.user_adapter(user).or_else(|| self.default_adapter()),
        };
        let Some(name) = name else { return Ok(None) };
        match self.registry.get(&name) {
            Some(set) => Ok(Some((name, set))),
            // A default adapter unloaded in a race: serve the base rather than fail.
            None if model.is_none_or(|m| m == self.config.model_name) => Ok(None),
            None => Err(ServeError::UnknownModel(name)),
        }
    }

    /// The sum of resident adapters `mix` names, each at its scale, as one set built for this request alone, so
    /// no other request sees it and a later swap of any of them does not change it.
    fn mixed(&self, mix: &[(String, f64)]) -> Result<Option<(String, Arc<LoraSet>)>, ServeError> {
        if mix.is_empty() {
            return Ok(None);
        }
        let sets = mix
            .iter()
            .map(|(id, _)| {
                self.registry
                    .get(id)
                    .ok_or_else(|| ServeError::BadLora(format!("adapter `{id}` is not resident")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let parts: Vec<(&LoraSet, f64)> = sets
            .iter()
            .zip(mix)
            .map(|(s, (_, c))| (s.as_ref(), *c))
            .collect();
        let set =
            crate::train::merge::mix(&parts).map_err(|e| ServeError::BadLora(e.to_string()))?;
        let name = mix
            .iter()
            .map(|(id, c)| format!("{id}*{c}"))
            .collect::<Vec<_>>()
            .join("+");
        Ok(Some((name, Arc::new(set))))
    }

    /// Validates, tokenizes and enqueues a request. Never blocks: a full queue is [`ServeError::QueueFull`].
    pub fn submit(&self, req: GenerateRequest, id_prefix: &str) -> Result<Admitted, ServeError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ServeError::Closed);
        }
        let resolved = self.resolve(req.model.as_deref(), &req.user)?;
        let resolved = match &req.lora {
            Some(mix) => self.mixed(mix)?,
            None => resolved,
        };
        let limit = self.config.max_tokens_limit;
        let max_tokens = req
            .max_tokens
            .unwrap_or(self.config.default_max_tokens.min(limit));
        if max_tokens > limit {
            return Err(ServeError::TooManyTokens(format!(
                "max_tokens {max_tokens} exceeds this server's limit of {limit}"
            )));
        }
        let (ids, prompt) = match &req.prompt {
            PromptInput::Chat(messages) => (
                encode_chat(&self.tok, messages, true)?.ids,
                messages.clone(),
            ),
            PromptInput::Text(text) => (
                self.tok.encode_prompt(text, req.parse_special)?,
                vec![ChatMessage::new(Role::User, text.clone())],
            ),
        };
        if ids.is_empty() {
            return Err(ServeError::TooManyTokens("the prompt is empty".to_owned()));
        }
        let context = self.model.max_positions();
        if ids.len() + max_tokens > context {
            return Err(ServeError::TooManyTokens(format!(
                "prompt of {} tokens plus max_tokens {max_tokens} exceeds the context limit of {context} tokens",
                ids.len()
            )));
        }
        let mut cfg = GenerateConfig::greedy(&self.tok, max_tokens);
        cfg.temperature = req.temperature.unwrap_or(0.0);
        cfg.top_p = req.top_p;
        cfg.top_k = req.top_k;
        cfg.seed = req.seed.unwrap_or(0);
        cfg.stop_strings = req.stop.clone();
        if req.ignore_eos {
            cfg.stop_tokens.clear();
        }
        let sampling = serde_json::json!({
            "max_tokens": max_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "top_k": cfg.top_k,
            "seed": cfg.seed,
            "stop": cfg.stop_strings,
        });
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("{id_prefix}-{}{n:06}", self.id_prefix);
        let pipe = Arc::new(Pipe::default());
        let created_unix_ms = now_unix_ms();
        let (adapter, lora) = match resolved {
            Some((name, set)) => (Some(name), Some(set)),
            None => (None, None),
        };
        let job = Job {
            id: id.clone(),
            user: req.user,
            adapter,
            lora,
            ids,
            prompt,
            cfg,
            sampling,
            admitted: Instant::now(),
            created_unix_ms,
            pipe: pipe.clone(),
        };
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(ServeError::QueueFull(self.config.queue_capacity));
            }
            Err(TrySendError::Disconnected(_)) => return Err(ServeError::Closed),
        }
        Ok(Admitted {
            id,
            model: req.model.unwrap_or_else(|| self.config.model_name.clone()),
            created_unix: created_unix_ms / 1000,
            pipe,
        })
    }

    /// Records feedback on a served response and emits it. `kind` is checked by the caller.
    pub fn feedback(&self, response_id: &str, kind: FeedbackKind) -> Result<Feedback, ServeError> {
        let user = self
            .recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .users
            .get(response_id)
            .cloned()
            .ok_or_else(|| ServeError::UnknownResponse(response_id.to_owned()))?;
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (commit, waiter) = self.commit_pair();
        let fb = Feedback {
            id: format!("fb-{}{n:06}", self.id_prefix),
            response_id: response_id.to_owned(),
            user,
            kind,
            created_at_unix_ms: now_unix_ms(),
            commit: Default::default(),
        };
        let event = ServeEvent::Feedback(Feedback {
            commit,
            ..fb.clone()
        });
        match self.events.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(ServeError::QueueFull(EVENT_BUFFER)),
            Err(TrySendError::Disconnected(_)) => return Err(ServeError::Closed),
        }
        if let Some((waiter, timeout)) = waiter {
            waiter.wait(timeout)?;
        }
        Ok(fb)
    }

    /// A commit signal for an item to emit, and its waiter when answers wait for the store.
    fn commit_pair(&self) -> (Commit, Option<(CommitWait, Duration)>) {
        match self.config.commit_timeout {
            Some(timeout) => {
                let (commit, waiter) = Commit::pair();
                (commit, Some((waiter, timeout)))
            }
            None => (Commit::default(), None),
        }
    }

    /// The user a recent response went to.
    pub fn response_user(&self, response_id: &str) -> Option<String> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.users.get(response_id).cloned()
    }

    /// Requests admitted and not yet started.
    pub fn queued(&self) -> usize {
        self.queue_rx.len()
    }

    fn remember(&self, id: &str, user: &str) {
        let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        r.users.insert(id.to_owned(), user.to_owned());
        r.order.push_back(id.to_owned());
        while r.order.len() > self.config.recent_responses.max(1) {
            if let Some(old) = r.order.pop_front() {
                r.users.remove(&old);
            }
        }
    }

    /// Where generation runs (see [`ServeConfig::device`]).
    pub fn device(&self) -> &crate::model::DeviceStatus {
        &self.device
    }

    /// One request on the GPU decoder, switching it to the request's adapter snapshot first.
    fn generate_on_gpu(
        &self,
        job: &Job,
        on_token: impl FnMut(crate::model::TokenEvent<'_>) -> bool,
    ) -> Result<(crate::model::GenerateOutput, usize), crate::model::ModelError> {
        // Of the free decoders (there are as many as generation threads), the one whose cache shares the most
        // of this prompt under this adapter.
        let mut slot = {
            let free = self.gpu.iter().filter_map(|m| m.try_lock().ok());
            let score = |s: &GpuSlot| match PromptCache::same_adapter(&s.adapter, &job.lora) {
                true => 1 + crate::model::reusable_positions(s.decoder.tokens(), &job.ids),
                false => 0,
            };
            match free.max_by_key(|s| score(s)) {
                Some(s) => s,
                None => self.gpu[0].lock().unwrap_or_else(|p| p.into_inner()),
            }
        };
        if !PromptCache::same_adapter(&slot.adapter, &job.lora) {
            // Cleared first: a failed upload must not leave the old snapshot's name on other pairs.
            slot.adapter = None;
            slot.decoder.set_adapter(None)?;
            slot.decoder.set_adapter(job.lora.as_deref())?;
            slot.adapter = job.lora.clone();
        }
        crate::model::generate_on_gpu(&mut slot.decoder, &self.tok, &job.ids, &job.cfg, on_token)
    }

    fn run_job(&self, job: Job) {
        if job.pipe.is_cancelled() {
            return;
        }
        let started = Instant::now();
        let pipe = job.pipe.clone();
        let streamed = std::cell::Cell::new(false);
        let on_token = |ev: crate::model::TokenEvent<'_>| {
            if !ev.text.is_empty() {
                streamed.set(true);
                pipe.push(StreamEvent::Text(ev.text.to_owned()));
            }
            !pipe.is_cancelled()
        };
        let on_cpu = |on_token| {
            crate::model::generate_reusing(
                &self.model,
                &self.tok,
                &job.ids,
                job.lora.as_deref(),
                &job.cfg,
                self.prompt_cache.take(&job.lora, &job.ids),
                on_token,
            )
            .map(|(out, reused, prefix)| {
                self.prompt_cache
                    .put(job.lora.clone(), prefix, |a| self.registry.holds(a));
                (out, reused)
            })
        };
        let result = match self.gpu.is_empty() {
            false => match self.generate_on_gpu(&job, on_token) {
                // What the decoder cannot take (a DoRA delta, a prompt past its cache, the device out of
                // memory) is answered on the CPU, unless part of the answer has gone out already.
                Err(e) if !streamed.get() => {
                    tracing::warn!(id = %job.id, error = %e, "GPU generation failed; answering on the CPU");
                    metrics::counter!("hearth_serve_gpu_fallbacks_total").increment(1);
                    on_cpu(on_token)
                }
                other => other,
            },
            true => on_cpu(on_token),
        };
        let (out, cached_prompt_tokens) = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(id = %job.id, error = %e, "generation failed");
                job.pipe.push(StreamEvent::Failed(e.to_string()));
                return;
            }
        };
        let finish_reason = match out.reason {
            StopReason::MaxTokens | StopReason::ContextFull => "length",
            _ => "stop",
        };
        let decode_ms = started.elapsed().as_millis() as u64;
        let latency_ms = job.admitted.elapsed().as_millis() as u64;
        self.remember(&job.id, &job.user);
        let done = StreamEvent::Done(Completion {
            text: out.text.clone(),
            finish_reason,
            prompt_tokens: job.ids.len(),
            cached_prompt_tokens,
            completion_tokens: out.tokens.len(),
        });
        if out.reason == StopReason::Cancelled {
            job.pipe.push(done);
            return;
        }
        let (commit, waiter) = self.commit_pair();
        let mut sampling = job.sampling;
        sampling["timings"] = serde_json::json!({
            "queue_ms": latency_ms.saturating_sub(decode_ms),
            "generate_ms": decode_ms,
            "prompt_tokens": job.ids.len(),
            "cached_prompt_tokens": cached_prompt_tokens,
            "completion_tokens": out.tokens.len(),
        });
        let interaction = Interaction {
            id: job.id.clone(),
            user: job.user,
            adapter: job.adapter,
            prompt: job.prompt,
            response: out.text,
            sampling,
            created_at_unix_ms: job.created_unix_ms,
            latency_ms,
            commit,
        };
        // Waits while the graph falls behind (generation slows, the queue fills, clients see 429); only at
        // shutdown, with nobody draining, is an interaction given up, and that is logged.
        let mut event = ServeEvent::Interaction(interaction);
        loop {
            match self.events.send_timeout(event, IDLE_POLL) {
                Ok(()) => break,
                Err(SendTimeoutError::Timeout(back)) if !self.closing.load(Ordering::Acquire) => {
                    event = back
                }
                Err(_) => {
                    tracing::warn!("an interaction was not forwarded: the graph stopped draining");
                    break;
                }
            }
        }
        // The answer is the acknowledgement: it goes out only once the interaction is stored.
        let end = match waiter.map(|(w, timeout)| w.wait(timeout)) {
            Some(Err(e)) => {
                tracing::warn!(id = %job.id, error = %e, "answer withheld: interaction not stored");
                StreamEvent::Uncommitted(e)
            }
            _ => done,
        };
        job.pipe.push(end);
    }
}

/// A running server: the engine, its generation threads and (optionally) the HTTP API.
pub struct Server {
    engine: Arc<Engine>,
    /// SHA-256 of the base's file: a delta for another base is never served.
    base_sha256: Option<String>,
    events: Receiver<ServeEvent>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    http: Mutex<Option<http::ApiServer>>,
}

/// How many completed interactions/feedback may wait for the graph before generation blocks.
const EVENT_BUFFER: usize = 1024;

impl Server {
    /// Loads the model at `path` and starts the generation threads (no HTTP yet).
    pub fn load(path: &Path, config: ServeConfig) -> Result<Server, ServeError> {
        Server::from_base(&Base::load(path)?, config)
    }

    /// Serves a loaded base, sharing its weights and tokenizer; only deltas for this base are served.
    pub fn from_base(base: &Base, config: ServeConfig) -> Result<Server, ServeError> {
        let mut server = Server::new(base.model.clone(), base.tok.clone(), config)?;
        server.base_sha256 = Some(base.sha256.clone());
        Ok(server)
    }

    /// Starts serving an already loaded model.
    pub fn new(
        model: Transformer,
        tok: impl Into<Arc<Tokenizer>>,
        config: ServeConfig,
    ) -> Result<Server, ServeError> {
        let (queue, queue_rx) = crossbeam_channel::bounded(config.queue_capacity.max(1));
        let prompt_cache = PromptCache {
            budget_bytes: config.prompt_cache_bytes,
            entries: Mutex::new(VecDeque::new()),
        };
        let (events, events_rx) = crossbeam_channel::bounded(EVENT_BUFFER);
        // Distinguishes ids across restarts of the process, so a re-used counter never repeats an id.
        let id_prefix = format!("{:x}", now_unix_ms() % 0xffff_ffff);
        let (gpu, device) = crate::model::GpuDecoder::open(config.device, &model);
        let mut slots = Vec::new();
        if let Some(first) = gpu {
            let weights = first.model().clone();
            slots.push(first);
            for _ in 1..config.threads.max(1) {
                match crate::model::GpuDecoder::on(weights.clone(), None) {
                    Ok(d) => slots.push(d),
                    Err(e) => {
                        // Fewer sequences at once on the GPU, rather than none.
                        tracing::warn!(error = %e, decoders = slots.len(), "no further GPU decoder");
                        break;
                    }
                }
            }
        }
        let gpu = slots
            .into_iter()
            .map(|decoder| {
                Mutex::new(GpuSlot {
                    decoder,
                    adapter: None,
                })
            })
            .collect();
        if let Some(notice) = &device.notice {
            tracing::warn!("{notice}");
        }
        let engine = Arc::new(Engine {
            model: Arc::new(model.with_kv_precision(config.kv_cache)),
            tok: tok.into(),
            registry: AdapterRegistry::new(),
            default_adapter: RwLock::new(None),
            user_adapters: RwLock::new(HashMap::new()),
            config,
            queue,
            queue_rx,
            events,
            recent: Mutex::new(Recent::default()),
            next_id: AtomicU64::new(0),
            id_prefix,
            closing: AtomicBool::new(false),
            prompt_cache,
            gpu,
            device,
        });
        let mut threads = Vec::new();
        // Each generation thread runs inside its own compute pool (as many threads as the process-wide pool):
        // candle's CPU ops run on rayon, and called from a thread outside a pool every op is a hand-off to a
        // pool thread and back (two futex calls). Inside, they run inline.
        let compute_threads = rayon::current_num_threads();
        for i in 0..engine.config.threads.max(1) {
            let e = engine.clone();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(compute_threads)
                .thread_name(move |j| format!("serve-gen-{i}-{j}"))
                .build()
                .map_err(|e| ServeError::Spawn(std::io::Error::other(e)))?;
            let t = std::thread::Builder::new()
                .name(format!("serve-gen-{i}"))
                .spawn(move || pool.install(|| generation_loop(&e)))
                .map_err(ServeError::Spawn)?;
            threads.push(t);
        }
        Ok(Server {
            engine,
            base_sha256: None,
            events: events_rx,
            threads: Mutex::new(threads),
            http: Mutex::new(None),
        })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Serves `delta` (or the base alone) by default from the next request on; requests in flight keep the
    /// adapter they started with. A delta for another base than the one served is refused.
    pub fn swap_to(&self, delta: Option<&Delta>) -> Result<(), ServeError> {
        let engine = &self.engine;
        let Some(delta) = delta else {
            engine.set_default_adapter(None)?;
            tracing::info!("serving the base alone");
            return Ok(());
        };
        if engine.default_adapter().as_deref() == Some(delta.id.as_str()) {
            return Ok(());
        }
        if let Some(served) = &self.base_sha256
            && delta.base_sha256 != *served
        {
            return Err(ServeError::OtherBase {
                delta: delta.id.clone(),
                adapts: delta.base_sha256.clone(),
                served: served.clone(),
            });
        }
        engine.load_adapter(&delta.id, Path::new(&delta.path))?;
        engine.set_default_adapter(Some(&delta.id))?;
        tracing::info!(adapter = %delta.id, "hot-swapped the default adapter");
        Ok(())
    }

    /// Serves `delta` to `user` from their next request on (`None`: the default again), as [`Server::swap_to`]
    /// does for everyone. The adapter the user was routed to before is unloaded unless something still
    /// answers with it, so resident adapters stay one per routed user.
    pub fn swap_user(&self, user: &str, delta: Option<&Delta>) -> Result<(), ServeError> {
        let engine = &self.engine;
        let before = match delta {
            None => engine.set_user_adapter(user, None)?,
            Some(delta) => {
                if engine.user_adapter(user).as_deref() == Some(delta.id.as_str()) {
                    return Ok(());
                }
                if let Some(served) = &self.base_sha256
                    && delta.base_sha256 != *served
                {
                    return Err(ServeError::OtherBase {
                        delta: delta.id.clone(),
                        adapts: delta.base_sha256.clone(),
                        served: served.clone(),
                    });
                }
                if engine.registry.get(&delta.id).is_none() {
                    engine.load_adapter(&delta.id, Path::new(&delta.path))?;
                }
                engine.set_user_adapter(user, Some(&delta.id))?
            }
        };
        if let Some(old) = before
            && !engine.adapter_in_use(&old)
        {
            let _ = engine.registry.remove(&old);
        }
        tracing::info!(user, adapter = ?delta.map(|d| &d.id), "routed the user's requests");
        Ok(())
    }

    /// Starts the OpenAI-compatible API on `addr` (port 0 picks one); returns the bound address.
    pub fn listen(&self, addr: &str) -> Result<std::net::SocketAddr, ServeError> {
        let api = http::ApiServer::start(addr, self.engine.clone())?;
        let bound = api.addr;
        *self.http.lock().unwrap_or_else(|p| p.into_inner()) = Some(api);
        Ok(bound)
    }

    /// Completed interactions and feedback, for the serve actor to forward (or a test to read).
    pub fn events(&self) -> &Receiver<ServeEvent> {
        &self.events
    }

    /// Stops taking requests, finishes those admitted, and joins the generation threads. Events stay
    /// readable on [`Server::events`].
    pub fn shutdown(&self) {
        self.engine.closing.store(true, Ordering::Release);
        if let Some(api) = self.http.lock().unwrap_or_else(|p| p.into_inner()).take() {
            api.stop();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How often an idle generation thread checks for shutdown.
const IDLE_POLL: Duration = Duration::from_millis(50);

fn generation_loop(engine: &Engine) {
    loop {
        match engine.queue_rx.recv_timeout(IDLE_POLL) {
            Ok(job) => engine.run_job(job),
            Err(_) => {
                if engine.closing.load(Ordering::Acquire) && engine.queue_rx.is_empty() {
                    return;
                }
            }
        }
    }
}

/// Where the model comes from: an explicit path, or the default model cached in `data_dir`.
pub fn model_path(path: Option<&str>, data_dir: &Path) -> Result<PathBuf, ServeError> {
    match path {
        Some(p) => Ok(PathBuf::from(p)),
        None => default_model::ensure(data_dir),
    }
}
