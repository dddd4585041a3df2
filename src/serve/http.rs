//! The OpenAI-compatible HTTP API over [`super::Engine`]: chat and text completions (JSON or SSE), the
//! model list, adapter load/unload, and feedback.
//!
//! Handlers only validate and enqueue; generation runs on the engine's own threads, so the API stays
//! responsive (and can say 429) while the CPU is busy. Fields are checked one by one so that every 400 names
//! the offending parameter, as OpenAI's errors do.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use actix_web::body::{BodySize, MessageBody};
use actix_web::http::StatusCode;
use actix_web::middleware::from_fn;
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpResponse, HttpServer};
use serde_json::{Value, json};

use crate::access::Access;

use super::{Engine, GenerateRequest, Pipe, PromptInput, ServeError, StreamEvent};
use crate::message::FeedbackKind;
use crate::model::{ChatMessage, Role};

/// An OpenAI-style error answer: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
}

impl ApiError {
    fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_owned()),
            code: None,
        }
    }

    fn response(&self) -> HttpResponse {
        let mut b = HttpResponse::build(self.status);
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            b.insert_header(("Retry-After", "1"));
        }
        b.json(json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }}))
    }
}

impl From<ServeError> for ApiError {
    fn from(e: ServeError) -> Self {
        let (status, kind, param, code) = match &e {
            ServeError::UnknownModel(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            ServeError::UnknownAdapter(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("id"),
                Some("adapter_not_found"),
            ),
            ServeError::BadLora(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("lora"),
                None,
            ),
            ServeError::UnknownResponse(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("response_id"),
                Some("response_not_found"),
            ),
            ServeError::BadAdapterId(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("id"),
                None,
            ),
            ServeError::AdapterLoad { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("path"),
                None,
            ),
            ServeError::AdapterOutside { .. } | ServeError::NoAdapterDir(_) => (
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                Some("path"),
                Some("adapter_path_not_allowed"),
            ),
            ServeError::TooManyTokens(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("max_tokens"),
                Some("context_length_exceeded"),
            ),
            ServeError::QueueFull(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                None,
                Some("queue_full"),
            ),
            ServeError::Closed | ServeError::NotCommitted(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_error", None, None)
            }
            ServeError::Model(crate::model::ModelError::Input(_)) => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", None, None)
            }
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                None,
            ),
        };
        ApiError {
            status,
            message: e.to_string(),
            kind,
            param: param.map(str::to_owned),
            code,
        }
    }
}

type Data = web::Data<Arc<Engine>>;

/// Reads the body within the configured limit and parses it as a JSON object.
async fn json_body(
    engine: &Engine,
    payload: web::Payload,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    let limit = engine.config().max_body_bytes;
    let bytes = match payload.to_bytes_limited(limit).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(ApiError::invalid("body", format!("cannot read body: {e}"))),
        Err(_) => {
            return Err(ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!("request body exceeds the limit of {limit} bytes"),
                kind: "invalid_request_error",
                param: None,
                code: Some("body_too_large"),
            });
        }
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid("body", "the body must be a JSON object")),
        Err(e) => Err(ApiError::invalid("body", format!("malformed JSON: {e}"))),
    }
}

type Obj = serde_json::Map<String, Value>;

fn opt_str(o: &Obj, k: &str) -> Result<Option<String>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::invalid(k, format!("`{k}` must be a string"))),
    }
}

fn opt_f32(o: &Obj, k: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x as f32)),
            _ => Err(ApiError::invalid(
                k,
                format!("`{k}` must be a number in [{lo}, {hi}]"),
            )),
        },
    }
}

fn opt_u64(o: &Obj, k: &str) -> Result<Option<u64>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be a non-negative integer"))),
    }
}

fn opt_bool(o: &Obj, k: &str) -> Result<bool, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(k, format!("`{k}` must be a boolean"))),
    }
}

fn stop_list(o: &Obj) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "stop",
            "`stop` must be a string or an array of up to 4 strings",
        )
    };
    match o.get("stop") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) if a.len() <= 4 => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// What both completion endpoints read, besides `messages` or `prompt`.
const SAMPLING_PARAMS: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "user",
    "stream",
    "stream_options",
    "ignore_eos",
    "lora",
    "parse_special",
];

/// OpenAI parameters that leave the answer as it is: accepted and not used.
const NO_EFFECT_PARAMS: &[&str] = &[
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];

/// Whether a parameter's value asks for nothing hearth would ignore.
type Inert = fn(&Value) -> bool;

/// OpenAI parameters hearth does not implement, each with the one value (besides `null`) that asks for
/// nothing it would ignore. `store` is here because hearth always keeps what it serves.
const INERT_ONLY: &[(&str, &str, Inert)] = &[
    ("n", "1", |v| v.as_u64() == Some(1)),
    ("best_of", "1", |v| v.as_u64() == Some(1)),
    ("logprobs", "false", |v| *v == Value::Bool(false)),
    ("top_logprobs", "0", |v| v.as_u64() == Some(0)),
    ("presence_penalty", "0", |v| v.as_f64() == Some(0.0)),
    ("frequency_penalty", "0", |v| v.as_f64() == Some(0.0)),
    ("logit_bias", "{}", |v| {
        v.as_object().is_some_and(|m| m.is_empty())
    }),
    ("response_format", r#"{"type": "text"}"#, |v| {
        *v == json!({"type": "text"})
    }),
    ("tools", "[]", |v| {
        v.as_array().is_some_and(|a| a.is_empty())
    }),
    ("functions", "[]", |v| {
        v.as_array().is_some_and(|a| a.is_empty())
    }),
    ("tool_choice", r#""none""#, |v| v == "none"),
    ("function_call", r#""none""#, |v| v == "none"),
    (
        "parallel_tool_calls",
        "a boolean, without tools",
        Value::is_boolean,
    ),
    ("echo", "false", |v| *v == Value::Bool(false)),
    ("suffix", r#""""#, |v| v == ""),
    ("modalities", r#"["text"]"#, |v| *v == json!(["text"])),
    ("store", "true", |v| *v == Value::Bool(true)),
    ("audio", "null", |_| false),
    ("prediction", "null", |_| false),
    ("reasoning_effort", "null", |_| false),
    ("verbosity", "null", |_| false),
    ("web_search_options", "null", |_| false),
];

/// Refuses, naming every one, the parameters the endpoint would not honour: one OpenAI defines that
/// hearth does not implement (unless at its inert value), and one nobody defines: a misspelt
/// `temprature` must not be silently ignored (OpenAI refuses both kinds too).
fn check_params(o: &Obj, endpoint: Endpoint) -> Result<(), ApiError> {
    let own = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Text => "prompt",
    };
    let mut unsupported = Vec::new();
    let mut unknown = Vec::new();
    for (k, v) in o {
        let k = k.as_str();
        if k == own || SAMPLING_PARAMS.contains(&k) || NO_EFFECT_PARAMS.contains(&k) || v.is_null()
        {
            continue;
        }
        match INERT_ONLY.iter().find(|(name, ..)| *name == k) {
            Some((_, _, inert)) if inert(v) => {}
            Some((_, only, _)) => unsupported.push(format!("`{k}` (hearth accepts only {only})")),
            None => unknown.push(format!("`{k}`")),
        }
    }
    stream_options(o)?;
    refuse_params(unsupported, unknown)
}

/// The 400 for [`check_params`] and the other endpoints' unknown fields; `param` is the first one named.
fn refuse_params(unsupported: Vec<String>, unknown: Vec<String>) -> Result<(), ApiError> {
    let first = unsupported.first().or(unknown.first());
    let Some(first) = first else { return Ok(()) };
    let param = first.split('`').nth(1).unwrap_or_default().to_owned();
    let mut parts = Vec::new();
    if !unsupported.is_empty() {
        parts.push(format!(
            "unsupported parameter(s): {}",
            unsupported.join(", ")
        ));
    }
    if !unknown.is_empty() {
        parts.push(format!("unrecognized parameter(s): {}", unknown.join(", ")));
    }
    Err(ApiError {
        status: StatusCode::BAD_REQUEST,
        message: format!("{}; hearth does not implement them", parts.join("; ")),
        kind: "invalid_request_error",
        param: Some(param),
        code: Some(if unsupported.is_empty() {
            "unknown_parameter"
        } else {
            "unsupported_parameter"
        }),
    })
}

/// Refuses any field of a hearth endpoint's body other than `known`.
fn only_fields(o: &Obj, known: &[&str]) -> Result<(), ApiError> {
    let unknown = o
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| format!("`{k}`"))
        .collect();
    refuse_params(Vec::new(), unknown)
}

/// `stream_options.include_usage`: whether a stream ends with a usage chunk. Other options are refused.
fn stream_options(o: &Obj) -> Result<bool, ApiError> {
    let opts = match o.get("stream_options") {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object",
            ));
        }
    };
    for (k, v) in opts {
        match k.as_str() {
            // Padding against length side channels: nothing to pad here, so any value is honoured.
            "include_usage" | "include_obfuscation" if v.is_boolean() || v.is_null() => {}
            _ => {
                return Err(ApiError::invalid(
                    &format!("stream_options.{k}"),
                    format!(
                        "`stream_options.{k}` is not supported: hearth implements `include_usage` (a boolean)"
                    ),
                ));
            }
        }
    }
    opt_bool(opts, "include_usage")
}

fn messages(o: &Obj) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(Value::Array(items)) = o.get("messages") else {
        return Err(ApiError::invalid(
            "messages",
            "`messages` is required and must be an array",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Some(fields) = m.as_object() else {
                return Err(ApiError::invalid(
                    &format!("messages[{i}]"),
                    "each message must be an object",
                ));
            };
            // A message's other fields (`name`, `tool_calls`, ...) would shape the answer; empty, as a client
            // echoing an answer back sends them, they ask for nothing.
            let unsupported: Vec<String> = fields
                .iter()
                .filter(|(k, v)| {
                    let asks_nothing = v.is_null() || v.as_array().is_some_and(|a| a.is_empty());
                    !(matches!(k.as_str(), "role" | "content") || asks_nothing)
                })
                .map(|(k, _)| format!("`messages[{i}].{k}` (hearth accepts only null)"))
                .collect();
            refuse_params(unsupported, Vec::new())?;
            let role = match m.get("role").and_then(Value::as_str) {
                Some("system") | Some("developer") => Role::System,
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                _ => {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].role"),
                        "role must be one of system, user, assistant",
                    ));
                }
            };
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                // The array form: its text parts, concatenated; an image or audio part is refused, not
                // dropped.
                Some(Value::Array(parts)) => parts
                    .iter()
                    .enumerate()
                    .map(|(j, p)| match (p.get("type"), p.get("text")) {
                        (Some(t), Some(Value::String(text))) if t == "text" => Ok(text.as_str()),
                        _ => Err(ApiError::invalid(
                            &format!("messages[{i}].content[{j}]"),
                            "hearth implements only text content parts: {\"type\": \"text\", \"text\": ...}",
                        )),
                    })
                    .collect::<Result<String, _>>()?,
                _ => {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].content"),
                        "content must be a string",
                    ));
                }
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// The fields both completion endpoints share.
fn request(o: &Obj, prompt: PromptInput) -> Result<GenerateRequest, ApiError> {
    let max_tokens = match opt_u64(o, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => opt_u64(o, "max_tokens")?,
    };
    Ok(GenerateRequest {
        model: opt_str(o, "model")?,
        prompt,
        user: opt_str(o, "user")?.unwrap_or_else(|| "anonymous".to_owned()),
        max_tokens: max_tokens.map(|n| n.min(usize::MAX as u64) as usize),
        temperature: opt_f32(o, "temperature", 0.0, 2.0)?,
        top_p: opt_f32(o, "top_p", 0.0, 1.0)?,
        top_k: opt_u64(o, "top_k")?.map(|n| n.min(u32::MAX as u64) as usize),
        seed: opt_u64(o, "seed")?,
        stop: stop_list(o)?,
        ignore_eos: opt_bool(o, "ignore_eos")?,
        lora: lora_mix(o)?,
        // On unless turned off: a completion prompt written in the model's chat format means its tokens.
        parse_special: match o.get("parse_special") {
            None | Some(Value::Null) => true,
            Some(_) => opt_bool(o, "parse_special")?,
        },
    })
}

/// llama.cpp's `lora: [{"id": ..., "scale": ...}]` (scale defaults to 1).
fn lora_mix(o: &Obj) -> Result<Option<Vec<(String, f64)>>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "lora",
            "`lora` must be a list of {\"id\": string, \"scale\": finite number}",
        )
    };
    match o.get("lora") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|it| {
                let id = it.get("id").and_then(Value::as_str).ok_or_else(bad)?;
                let scale = match it.get("scale") {
                    None => 1.0,
                    Some(v) => v.as_f64().filter(|x| x.is_finite()).ok_or_else(bad)?,
                };
                Ok((id.to_owned(), scale))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(bad()),
    }
}

/// Which endpoint shapes the answer.
#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Text,
}

async fn complete(engine: Data, payload: web::Payload, endpoint: Endpoint) -> HttpResponse {
    match complete_inner(engine, payload, endpoint).await {
        Ok(r) => r,
        Err(e) => e.response(),
    }
}

async fn complete_inner(
    engine: Data,
    payload: web::Payload,
    endpoint: Endpoint,
) -> Result<HttpResponse, ApiError> {
    let o = json_body(&engine, payload).await?;
    check_params(&o, endpoint)?;
    let prompt = match endpoint {
        Endpoint::Chat => PromptInput::Chat(messages(&o)?),
        Endpoint::Text => match o.get("prompt") {
            Some(Value::String(s)) => PromptInput::Text(s.clone()),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                PromptInput::Text(a[0].as_str().unwrap_or_default().to_owned())
            }
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "`prompt` is required and must be a string",
                ));
            }
        },
    };
    let stream = opt_bool(&o, "stream")?;
    let include_usage = stream_options(&o)?;
    let req = request(&o, prompt)?;
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Text => "cmpl",
    };
    let engine = engine.into_inner();
    let admitted = engine.submit(req, prefix)?;
    let shape = Shape {
        id: admitted.id,
        model: admitted.model,
        created: admitted.created_unix,
        endpoint,
        include_usage,
    };
    if stream {
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header(("Cache-Control", "no-cache"))
            .body(SseBody {
                pipe: admitted.pipe,
                shape,
                started: false,
                finished: false,
            }));
    }
    let pipe = admitted.pipe.clone();
    let guard = CancelOnDrop(admitted.pipe);
    let done = web::block(move || pipe.wait())
        .await
        .map_err(|e| ApiError::from(ServeError::Http(e.to_string())))?;
    drop(guard);
    let c = done?;
    let usage = usage(&c);
    let body = match endpoint {
        Endpoint::Chat => json!({
            "id": shape.id, "object": "chat.completion", "created": shape.created, "model": shape.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
                         "logprobs": null, "finish_reason": c.finish_reason}],
            "usage": usage,
        }),
        Endpoint::Text => json!({
            "id": shape.id, "object": "text_completion", "created": shape.created, "model": shape.model,
            "choices": [{"index": 0, "text": c.text, "logprobs": null, "finish_reason": c.finish_reason}],
            "usage": usage,
        }),
    };
    Ok(HttpResponse::Ok().json(body))
}

fn usage(c: &super::Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_prompt_tokens},
    })
}

/// Cancels generation when a waiting client goes away (actix drops the handler's future).
struct CancelOnDrop(Arc<Pipe>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

struct Shape {
    id: String,
    model: String,
    created: u64,
    endpoint: Endpoint,
    /// `stream_options.include_usage`: every chunk has `usage` (null), and a last one, without choices,
    /// carries it.
    include_usage: bool,
}

impl Shape {
    fn chunk(&self, text: Option<&str>, role: bool, finish: Option<&str>) -> Bytes {
        let mut v = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                       "model": self.model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
            }
            Endpoint::Text => {
                json!({"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "text": text.unwrap_or_default(), "logprobs": null,
                             "finish_reason": finish}]})
            }
        };
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        Bytes::from(format!("data: {v}\n\n"))
    }

    /// The closing chunk of `stream_options.include_usage`.
    fn usage_chunk(&self, c: &super::Completion) -> Bytes {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Text => "text_completion",
        };
        let v = json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
                       "choices": [], "usage": usage(c)});
        Bytes::from(format!("data: {v}\n\n"))
    }
}

/// Server-sent events fed by a generation thread: one chunk per piece of text, a closing chunk with the
/// finish reason, then `data: [DONE]`. Dropped early (client gone), it cancels the generation.
struct SseBody {
    pipe: Arc<Pipe>,
    shape: Shape,
    started: bool,
    finished: bool,
}

impl MessageBody for SseBody {
    type Error = std::convert::Infallible;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(None);
        }
        if !this.started && this.shape.endpoint == Endpoint::Chat {
            this.started = true;
            return Poll::Ready(Some(Ok(this.shape.chunk(Some(""), true, None))));
        }
        this.started = true;
        match this.pipe.poll_event(cx.waker()) {
            None => Poll::Pending,
            Some(StreamEvent::Text(t)) => {
                Poll::Ready(Some(Ok(this.shape.chunk(Some(&t), false, None))))
            }
            Some(StreamEvent::Done(c)) => {
                this.finished = true;
                let mut out = this
                    .shape
                    .chunk(None, false, Some(c.finish_reason))
                    .to_vec();
                if this.shape.include_usage {
                    out.extend_from_slice(&this.shape.usage_chunk(&c));
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                Poll::Ready(Some(Ok(Bytes::from(out))))
            }
            Some(end @ (StreamEvent::Failed(_) | StreamEvent::Uncommitted(_))) => {
                this.finished = true;
                let message = match end {
                    StreamEvent::Uncommitted(e) => ServeError::NotCommitted(e).to_string(),
                    StreamEvent::Failed(m) => ServeError::Generation(m).to_string(),
                    _ => String::new(),
                };
                let e = json!({"error": {"message": message,
                                         "type": "server_error", "param": null, "code": null}});
                Poll::Ready(Some(Ok(Bytes::from(format!(
                    "data: {e}\n\ndata: [DONE]\n\n"
                )))))
            }
        }
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        if !self.finished {
            self.pipe.cancel();
        }
    }
}

async fn chat_completions(engine: Data, payload: web::Payload) -> HttpResponse {
    complete(engine, payload, Endpoint::Chat).await
}

async fn completions(engine: Data, payload: web::Payload) -> HttpResponse {
    complete(engine, payload, Endpoint::Text).await
}

async fn models(engine: Data) -> HttpResponse {
    let base = &engine.config().model_name;
    let default = engine.default_adapter();
    let mut data = vec![
        json!({"id": base, "object": "model", "created": 0, "owned_by": "hearth",
                               "default_adapter": default, "device": engine.device()}),
    ];
    for a in engine.adapters() {
        data.push(
            json!({"id": a, "object": "model", "created": 0, "owned_by": "hearth", "parent": base}),
        );
    }
    HttpResponse::Ok().json(json!({"object": "list", "data": data}))
}

async fn load_adapter(engine: Data, payload: web::Payload) -> HttpResponse {
    let run = async {
        let o = json_body(&engine, payload).await?;
        only_fields(&o, &["id", "path", "default"])?;
        let id = opt_str(&o, "id")?.ok_or_else(|| ApiError::invalid("id", "`id` is required"))?;
        let path =
            opt_str(&o, "path")?.ok_or_else(|| ApiError::invalid("path", "`path` is required"))?;
        let make_default = opt_bool(&o, "default")?;
        let e = engine.clone().into_inner();
        let (id2, path2) = (id.clone(), path.clone());
        // Resolving the path and reading safetensors is file I/O: keep it off the async workers.
        let replaced = web::block(move || -> Result<bool, ServeError> {
            let dir = e.adapter_path(&id2, &path2)?;
            let replaced = e.load_adapter(&id2, &dir)?;
            if make_default {
                e.set_default_adapter(Some(&id2))?;
            }
            Ok(replaced)
        })
        .await
        .map_err(|e| ApiError::from(ServeError::Http(e.to_string())))??;
        Ok::<_, ApiError>(
            HttpResponse::Ok()
                .json(json!({"id": id, "object": "adapter", "path": path, "replaced": replaced})),
        )
    };
    run.await.unwrap_or_else(|e| e.response())
}

async fn unload_adapter(engine: Data, id: web::Path<String>) -> HttpResponse {
    match engine.unload_adapter(&id) {
        Ok(()) => HttpResponse::Ok()
            .json(json!({"id": id.as_str(), "object": "adapter", "deleted": true})),
        Err(e) => ApiError::from(e).response(),
    }
}

async fn feedback(engine: Data, payload: web::Payload) -> HttpResponse {
    let run = async {
        let o = json_body(&engine, payload).await?;
        only_fields(&o, &["response_id", "kind", "text", "value", "user"])?;
        let response_id = opt_str(&o, "response_id")?
            .ok_or_else(|| ApiError::invalid("response_id", "`response_id` is required"))?;
        // Feedback counts for the user the response went to; a client naming someone else is mistaken.
        if let Some(user) = opt_str(&o, "user")?
            && engine
                .response_user(&response_id)
                .is_some_and(|u| u != user)
        {
            return Err(ApiError::invalid(
                "user",
                format!("response `{response_id}` was given to another user than `{user}`"),
            ));
        }
        let kind_name = opt_str(&o, "kind")?;
        for (field, kind) in [("text", "edit"), ("value", "score")] {
            if o.get(field).is_some_and(|v| !v.is_null()) && kind_name.as_deref() != Some(kind) {
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` goes only with kind `{kind}`"),
                ));
            }
        }
        let kind = match kind_name.as_deref() {
            Some("thumbs_up") => FeedbackKind::Thumbs { up: true },
            Some("thumbs_down") => FeedbackKind::Thumbs { up: false },
            Some("accepted") => FeedbackKind::Accepted,
            Some("edit") => FeedbackKind::Edit {
                text: opt_str(&o, "text")?
                    .ok_or_else(|| ApiError::invalid("text", "`text` is required for an edit"))?,
            },
            Some("score") => FeedbackKind::Score {
                value: o.get("value").and_then(Value::as_f64).ok_or_else(|| {
                    ApiError::invalid("value", "`value` (a number) is required for a score")
                })?,
            },
            _ => {
                return Err(ApiError::invalid(
                    "kind",
                    "`kind` must be one of thumbs_up, thumbs_down, edit, accepted, score",
                ));
            }
        };
        // Blocks until the feedback is stored: off the async workers.
        let id = response_id.clone();
        let engine = engine.into_inner();
        let fb = web::block(move || engine.feedback(&id, kind))
            .await
            .map_err(|e| ApiError::from(ServeError::Http(e.to_string())))??;
        Ok(HttpResponse::Ok()
            .json(json!({"id": fb.id, "object": "feedback", "response_id": response_id})))
    };
    run.await.unwrap_or_else(|e: ApiError| e.response())
}

async fn not_found() -> HttpResponse {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such endpoint".to_owned(),
        kind: "invalid_request_error",
        param: None,
        code: None,
    }
    .response()
}

/// The API server on its own thread and actix system (actix's server is not `Send`).
pub struct ApiServer {
    pub addr: SocketAddr,
    server: crate::server_thread::ServerThread,
}

impl ApiServer {
    /// Binds `addr` (port 0 picks a free port) and serves `engine` until stopped, to the requests
    /// [`Access`] lets through (a non-loopback `addr` needs the config's `api_key`).
    pub fn start(addr: &str, engine: Arc<Engine>) -> Result<ApiServer, ServeError> {
        let access = Access::new(engine.config().api_key.clone());
        access.check_listen(addr)?;
        let data = web::Data::new(engine);
        let bind = addr.to_owned();
        let server = crate::server_thread::ServerThread::spawn("serve-http", move || {
            let server = HttpServer::new(move || {
                let access = access.clone();
                App::new()
                    .wrap(from_fn(move |req, next| access.clone().guard(req, next)))
                    .app_data(data.clone())
                    .route("/v1/chat/completions", web::post().to(chat_completions))
                    .route("/v1/completions", web::post().to(completions))
                    .route("/v1/models", web::get().to(models))
                    .route("/v1/adapters", web::post().to(load_adapter))
                    .route("/v1/adapters/{id}", web::delete().to(unload_adapter))
                    .route("/v1/feedback", web::post().to(feedback))
                    .default_service(web::to(not_found))
            })
            .workers(2)
            .disable_signals()
            .shutdown_timeout(5)
            .bind(&bind)?;
            let local = server
                .addrs()
                .first()
                .copied()
                .ok_or_else(crate::server_thread::no_address)?;
            Ok((server.run(), local))
        })
        .map_err(|e| ServeError::Http(format!("cannot bind {addr}: {e}")))?;
        Ok(ApiServer {
            addr: server.addr,
            server,
        })
    }

    /// Stops accepting, lets requests in flight finish (up to the shutdown timeout), and joins the thread.
    pub fn stop(self) {
        self.server.stop(true);
    }
}
