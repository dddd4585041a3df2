//! Chat prompts: the model's own chat template, rendered with a Jinja engine, is the one way a conversation
//! becomes tokens, for serving, training and the eval gate alike.
//!
//! The template is the GGUF's `tokenizer.chat_template` (Hugging Face's Jinja dialect), rendered by minijinja
//! with the extras Hugging Face provides (`raise_exception`, `strftime_now`, `bos_token`, `eos_token`,
//! `add_generation_prompt`, a `tojson` that writes as Python's `json.dumps` does) and, as HF does, with
//! `trim_blocks` and `lstrip_blocks`. `enable_thinking` is false: Qwen3 answers directly, as hearth serves and
//! trains it. A file without a template gets its family's (see [`ChatTemplate::fallback`]).
//!
//! Message content never becomes special tokens: the template is rendered a second time with each content
//! replaced by a marker, which tells apart the template's own text (encoded with special tokens parsed) from the
//! user's (encoded as plain text), so text typed by a user cannot forge a turn boundary. The same markers give
//! each assistant turn's byte span, from its content to the end of its turn marker (`<|im_end|>`, `<|eot_id|>`,
//! `<end_of_turn>`, ...), taken from the template's rendering of the conversation up to that turn: the tokens
//! a training loss is masked to.

use std::ops::Range;
use std::sync::Arc;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error as JinjaError, ErrorKind};

use super::tokenizer::Tokenizer;
use super::{ModelError, Result};

pub use crate::message::{ChatMessage, Role};

/// An encoded conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatPrompt {
    pub ids: Vec<u32>,
    /// Token ranges of assistant turns: content plus the template's end-of-turn token (what the model must learn
    /// to produce, including when to stop); the role header is excluded.
    pub assistant_spans: Vec<Range<usize>>,
}

impl ChatPrompt {
    /// Per-token flag: true inside an assistant span (loss mask for training).
    pub fn assistant_mask(&self) -> Vec<bool> {
        let mut m = vec![false; self.ids.len()];
        for r in &self.assistant_spans {
            m[r.clone()].iter_mut().for_each(|x| *x = true);
        }
        m
    }
}

/// The chat families hearth knows a template for, used when a file has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatFamily {
    /// `<|im_start|>role\n...<|im_end|>\n` (SmolLM2, Qwen without its default system prompt).
    ChatMl,
    /// Qwen2.5-Instruct's template (ChatML with a default system prompt).
    Qwen25,
    /// Qwen3's template (ChatML, an empty `<think>` block with thinking off).
    Qwen3,
    /// Llama 3.x Instruct (`<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>`).
    Llama3,
    /// Gemma 3 (`<start_of_turn>user\n...<end_of_turn>\n`, the system text prefixed to the first user turn).
    Gemma,
    /// Phi-3 / 3.5 mini (`<|user|>\n...<|end|>\n`).
    Phi3,
    /// Mistral Instruct (`[INST] ... [/INST]`, no system role).
    Mistral,
}

impl ChatFamily {
    pub const ALL: [ChatFamily; 7] = [
        ChatFamily::ChatMl,
        ChatFamily::Qwen25,
        ChatFamily::Qwen3,
        ChatFamily::Llama3,
        ChatFamily::Gemma,
        ChatFamily::Phi3,
        ChatFamily::Mistral,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ChatFamily::ChatMl => "chatml",
            ChatFamily::Qwen25 => "qwen2.5",
            ChatFamily::Qwen3 => "qwen3",
            ChatFamily::Llama3 => "llama3",
            ChatFamily::Gemma => "gemma3",
            ChatFamily::Phi3 => "phi3",
            ChatFamily::Mistral => "mistral",
        }
    }

    /// The family's template as its publisher ships it in `tokenizer_config.json`.
    pub fn template(self) -> &'static str {
        match self {
            ChatFamily::ChatMl => include_str!("chat_templates/chatml.jinja"),
            ChatFamily::Qwen25 => include_str!("chat_templates/qwen2.5.jinja"),
            ChatFamily::Qwen3 => include_str!("chat_templates/qwen3.jinja"),
            ChatFamily::Llama3 => include_str!("chat_templates/llama3.jinja"),
            ChatFamily::Gemma => include_str!("chat_templates/gemma3.jinja"),
            ChatFamily::Phi3 => include_str!("chat_templates/phi3.jinja"),
            ChatFamily::Mistral => include_str!("chat_templates/mistral.jinja"),
        }
    }

    /// The family whose turn markers the vocabulary has, if any.
    fn detect(tok: &Tokenizer) -> Option<Self> {
        let has = |t: &str| tok.token_id(t).is_some();
        if has("<|im_start|>") && has("<|im_end|>") {
            Some(ChatFamily::ChatMl)
        } else if has("<|start_header_id|>") && has("<|eot_id|>") {
            Some(ChatFamily::Llama3)
        } else if has("<start_of_turn>") && has("<end_of_turn>") {
            Some(ChatFamily::Gemma)
        } else if has("<|user|>") && has("<|end|>") {
            Some(ChatFamily::Phi3)
        } else if has("[INST]") {
            Some(ChatFamily::Mistral)
        } else {
            None
        }
    }
}

/// A compiled chat template.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    /// The `date_string` the template sees (Llama 3's "Today Date"); `None` lets it call `strftime_now`.
    date_string: Option<String>,
    /// The template writes `bos_token` itself (Llama 3, Gemma, Mistral): where the tokenizer adds BOS too, the
    /// rendered one is dropped. A template that does not (ChatML) keeps its first token even if it is BOS's text.
    writes_bos: bool,
}

const NAME: &str = "chat";
const KEY: &str = "tokenizer.chat_template";

/// Content markers: private-use characters no template trims or rewrites.
const MARK_OPEN: char = '\u{E000}';
const MARK_CLOSE: char = '\u{E001}';

fn marker(i: usize) -> String {
    format!("{MARK_OPEN}{i}{MARK_CLOSE}")
}

impl ChatTemplate {
    /// Compiles `source`; a template minijinja cannot parse is an error naming `tokenizer.chat_template`.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| ModelError::BadKey {
                key: KEY.into(),
                reason: format!("the template does not parse: {e}"),
            })?;
        Ok(Self {
            env: Arc::new(env),
            date_string: None,
            writes_bos: source.contains("bos_token"),
        })
    }

    /// The family template for a vocabulary without `tokenizer.chat_template`, from the turn markers it has.
    pub fn fallback(tok: &Tokenizer) -> Option<Self> {
        ChatFamily::detect(tok).and_then(|f| Self::new(f.template()).ok())
    }

    /// This template with a fixed `date_string` (for reproducible renderings of Llama 3's).
    pub fn with_date(mut self, date: impl Into<String>) -> Self {
        self.date_string = Some(date.into());
        self
    }

    /// The template's text for `messages`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String> {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_iter([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let mut ctx = vec![
            ("messages", Value::from(msgs)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(bos_token)),
            ("eos_token", Value::from(eos_token)),
            ("enable_thinking", Value::from(false)),
        ];
        if let Some(d) = &self.date_string {
            ctx.push(("date_string", Value::from(d.as_str())));
        }
        let tmpl = self.env.get_template(NAME)?;
        Ok(tmpl.render(Value::from_iter(ctx))?)
    }

    /// Encodes a conversation (see the module docs). With `add_generation_prompt`, ends where the model writes
    /// the next assistant turn.
    pub fn encode(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<ChatPrompt> {
        let (bos, eos) = (tok.bos_text(), tok.eos_text());
        let text = self.render(messages, add_generation_prompt, &bos, &eos)?;
        let marked_msgs = |n: usize| -> Vec<ChatMessage> {
            messages[..n]
                .iter()
                .enumerate()
                .map(|(i, m)| ChatMessage::new(m.role, marker(i)))
                .collect()
        };
        let marked = self.render(
            &marked_msgs(messages.len()),
            add_generation_prompt,
            &bos,
            &eos,
        )?;
        let contents = locate_contents(&text, &marked, messages)?;
        // Each assistant turn: its content, then as much of the template's end of turn (what follows the content
        // when the conversation ends with this turn, trailing whitespace aside) as the full text has there.
        let mut spans = Vec::new();
        for (i, range) in contents.iter().enumerate() {
            let Some(range) = range else { continue };
            if messages[i].role != Role::Assistant {
                continue;
            }
            let upto = self.render(&marked_msgs(i + 1), false, &bos, &eos)?;
            let m = marker(i);
            let tail = upto
                .rfind(&m)
                .map_or("", |p| upto[p + m.len()..].trim_end());
            let mut common = tail
                .bytes()
                .zip(text[range.end..].bytes())
                .take_while(|(a, b)| a == b)
                .count();
            // Back off to a character boundary (the tail and the text may share part of a multi-byte char).
            while !tail.is_char_boundary(common) {
                common -= 1;
            }
            spans.push(range.start..range.end + end_of_turn(tok, &tail[..common])?);
        }
        let skip = if self.writes_bos
            && !tok.bos_prefix().is_empty()
            && !bos.is_empty()
            && text.starts_with(&bos)
        {
            bos.len()
        } else {
            0
        };
        encode_segments(tok, &text, skip, &contents, &spans)
    }
}

/// How much of `shared` (the start of what follows an assistant's content) ends its turn: through the last
/// special token in it (`<|im_end|>`, `<|end|>`, `</s>`), so that a span never ends inside one the next turn
/// begins with (Phi-3's `<|end|>\n<|user|>` shares `<|` with `<|end|>\n<|endoftext|>`); without one, the text
/// up to trailing whitespace.
fn end_of_turn(tok: &Tokenizer, shared: &str) -> Result<usize> {
    Ok(tok
        .special_matches(shared)
        .last()
        .map_or_else(|| shared.trim_end().len(), |(r, _)| r.end))
}

/// Byte range of each message's content in `text` (`None` for a message the template left out), found by walking
/// `text` alongside `marked`, its rendering with content markers. A template may trim content (Llama 3, Gemma),
/// so each content is tried as given and trimmed.
fn locate_contents(
    text: &str,
    marked: &str,
    messages: &[ChatMessage],
) -> Result<Vec<Option<Range<usize>>>> {
    // Split the marked rendering into template text and marker indices.
    let mut pieces: Vec<(String, Option<usize>)> = Vec::new();
    let mut rest = marked;
    while let Some(open) = rest.find(MARK_OPEN) {
        let after = &rest[open + MARK_OPEN.len_utf8()..];
        let close = after.find(MARK_CLOSE).ok_or_else(transformed)?;
        let idx: usize = after[..close].parse().map_err(|_| transformed())?;
        if idx >= messages.len() {
            return Err(transformed());
        }
        pieces.push((rest[..open].to_string(), Some(idx)));
        rest = &after[close + MARK_CLOSE.len_utf8()..];
    }
    pieces.push((rest.to_string(), None));
    let mut out = vec![None; messages.len()];
    let mut pos = 0;
    for (k, (literal, idx)) in pieces.iter().enumerate() {
        if !text[pos..].starts_with(literal.as_str()) {
            return Err(transformed());
        }
        pos += literal.len();
        let Some(i) = *idx else { continue };
        let next = &pieces[k + 1].0;
        let last = k + 2 == pieces.len();
        let c = messages[i].content.as_str();
        let fits = |cand: &str| {
            let after = &text[pos..];
            after.starts_with(cand)
                && if last {
                    after[cand.len()..] == **next
                } else {
                    after[cand.len()..].starts_with(next.as_str())
                }
        };
        let cand = [c, c.trim(), c.trim_start(), c.trim_end()]
            .into_iter()
            .find(|cand| fits(cand))
            .ok_or_else(transformed)?;
        out[i] = Some(pos..pos + cand.len());
        pos += cand.len();
    }
    Ok(out)
}

fn transformed() -> ModelError {
    ModelError::Tokenizer(
        "the chat template rewrites message content beyond trimming it; hearth cannot tell the content from \
         the template's text"
            .into(),
    )
}

/// Tokenizes `text` in pieces: message contents as plain text, the template's text with special tokens parsed,
/// split at the assistant spans' ends so that each span is whole tokens. The first `skip` bytes (a BOS the
/// template wrote where the tokenizer adds its own, as llama.cpp's server drops it) are left out. A space the
/// template puts right before a content (Mistral's `[INST] `) goes with the content, as tokenizing the whole text
/// would join it to the content's first word (GPT-2's ` ?\p{L}+`, SentencePiece's `▁word`); each piece is encoded
/// as following the one before (see [`Tokenizer::encode_after`]).
fn encode_segments(
    tok: &Tokenizer,
    text: &str,
    skip: usize,
    contents: &[Option<Range<usize>>],
    spans: &[Range<usize>],
) -> Result<ChatPrompt> {
    let contents: Vec<Range<usize>> = contents
        .iter()
        .flatten()
        .map(|r| {
            let joined = r.start > skip
                && text.as_bytes()[r.start - 1] == b' '
                && !text[r.start..].starts_with(char::is_whitespace)
                && !r.is_empty();
            if joined {
                r.start - 1..r.end
            } else {
                r.clone()
            }
        })
        .collect();
    // An assistant span starts with its content, so with the space joined to it.
    let spans: Vec<Range<usize>> = spans
        .iter()
        .map(|s| {
            contents
                .iter()
                .find(|c| c.start + 1 == s.start && c.end >= s.start)
                .map_or(s.clone(), |c| c.start..s.end)
        })
        .collect();
    let mut bounds: Vec<usize> = contents
        .iter()
        .flat_map(|r| [r.start, r.end])
        .chain(spans.iter().map(|s| s.end))
        .chain([text.len()])
        .collect();
    bounds.sort_unstable();
    let mut ids = tok.bos_prefix();
    let mut start = skip;
    // (byte start, token index) at each segment start, to map byte spans onto tokens.
    let mut marks: Vec<(usize, usize)> = Vec::new();
    for end in bounds {
        let end = end.max(start);
        if end > start {
            marks.push((start, ids.len()));
            let is_content = contents.iter().any(|r| r.start <= start && end <= r.end);
            let seg = tok.encode_after(&text[start..end], !is_content, ids.last().copied())?;
            ids.extend(seg);
        }
        start = end;
    }
    marks.push((text.len(), ids.len()));
    let token_at = |byte: usize| {
        marks
            .iter()
            .find(|(b, _)| *b >= byte)
            .map_or(ids.len(), |(_, t)| *t)
    };
    let assistant_spans = spans
        .iter()
        .map(|s| token_at(s.start)..token_at(s.end))
        .filter(|r| !r.is_empty())
        .collect();
    Ok(ChatPrompt {
        ids,
        assistant_spans,
    })
}

fn raise_exception(msg: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(format)`: the current UTC time, for the directives chat templates use (`%d %b %Y`, `%B`, `%m`,
/// `%y`, `%H:%M:%S`, `%A`/`%a`).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(&format, secs)
}

/// Formats `secs` since the Unix epoch (UTC) by `format`.
pub fn strftime(format: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (year, month, day) = crate::clock::civil_from_days(days);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as Hugging Face's (Python's `json.dumps` with `ensure_ascii=False`): `", "` and `": "` separators,
/// or newlines with `indent`; no HTML escaping (minijinja's own escapes `<`, `>`, `&` and `'`).
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, "tojson").with_source(e))?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(v: &serde_json::Value, indent: Option<usize>, level: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                write_json(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Encodes a conversation with the tokenizer's chat template (the GGUF's own, or its family's). With
/// `add_generation_prompt`, ends where the model writes the next assistant turn.
pub fn encode_chat(
    tok: &Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<ChatPrompt> {
    chat_template(tok)?.encode(tok, messages, add_generation_prompt)
}

/// The text [`encode_chat`] tokenizes (for logs and debugging).
pub fn render_chat(
    tok: &Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String> {
    chat_template(tok)?.render(
        messages,
        add_generation_prompt,
        &tok.bos_text(),
        &tok.eos_text(),
    )
}

fn chat_template(tok: &Tokenizer) -> Result<&ChatTemplate> {
    tok.chat_template().ok_or_else(|| {
        ModelError::Tokenizer(format!(
            "the model has no `{KEY}` and its vocabulary has no chat family's turn markers"
        ))
    })
}

impl From<JinjaError> for ModelError {
    fn from(e: JinjaError) -> Self {
        ModelError::Template(Box::new(e))
    }
}
