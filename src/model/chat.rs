//! ChatML prompts: `<|im_start|>role\ncontent<|im_end|>\n`, as used by SmolLM2 and Qwen.
//!
//! Structure tokens are inserted by id and message content is encoded with specials disallowed,
//! so text typed by a user can never forge a turn boundary. The encoder also reports which tokens
//! belong to assistant turns, for masking the loss to assistant tokens when training.

use std::ops::Range;

use super::tokenizer::Tokenizer;
use super::{ModelError, Result};

pub use crate::message::{ChatMessage, Role};

/// An encoded conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatPrompt {
    pub ids: Vec<u32>,
    /// Token ranges of assistant turns: content plus the closing `<|im_end|>` (what the model
    /// must learn to produce, including when to stop); the role header is excluded.
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

/// Template variants beyond plain ChatML, as model chat templates add them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatOptions {
    /// System message inserted when the conversation does not start with one (SmolLM2's
    /// template inserts "You are a helpful AI assistant named SmolLM, trained by Hugging Face").
    pub default_system: Option<String>,
    /// Append `<think>\n\n</think>\n\n` after the generation prompt: Qwen3's template with
    /// `enable_thinking=false`, which makes it answer directly.
    pub empty_think: bool,
}

impl ChatOptions {
    /// Reads the options from a GGUF `tokenizer.chat_template`: a default system message written
    /// literally in the template, and Qwen3's `enable_thinking` switch (set to non-thinking).
    pub fn from_template(template: &str) -> Self {
        let default_system = template
            .contains("messages[0]['role'] != 'system'")
            .then(|| {
                let start = template.find("<|im_start|>system\n")? + "<|im_start|>system\n".len();
                let len = template[start..].find("<|im_end|>")?;
                Some(template[start..start + len].to_string())
            })
            .flatten();
        Self {
            default_system,
            empty_think: template.contains("enable_thinking"),
        }
    }
}

fn with_default_system<'a>(
    messages: &'a [ChatMessage],
    opts: &ChatOptions,
) -> Vec<std::borrow::Cow<'a, ChatMessage>> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(sys) = &opts.default_system
        && messages.first().is_none_or(|m| m.role != Role::System)
    {
        out.push(std::borrow::Cow::Owned(ChatMessage::new(
            Role::System,
            sys.clone(),
        )));
    }
    out.extend(messages.iter().map(std::borrow::Cow::Borrowed));
    out
}

const EMPTY_THINK: &str = "<think>\n\n</think>\n\n";

/// The ChatML text of a conversation (for logs and debugging; encoding uses [`encode_chat`]).
pub fn render_chat(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    render_chat_with(messages, add_generation_prompt, &ChatOptions::default())
}

/// [`render_chat`] with template options.
pub fn render_chat_with(
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    opts: &ChatOptions,
) -> String {
    let mut s = String::new();
    for m in with_default_system(messages, opts) {
        s.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role.as_str(),
            m.content
        ));
    }
    if add_generation_prompt {
        s.push_str("<|im_start|>assistant\n");
        if opts.empty_think {
            s.push_str(EMPTY_THINK);
        }
    }
    s
}

/// Encodes a conversation. With `add_generation_prompt`, ends with `<|im_start|>assistant\n` so
/// the model writes the next assistant turn.
pub fn encode_chat(
    tok: &Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<ChatPrompt> {
    encode_chat_with(
        tok,
        messages,
        add_generation_prompt,
        &ChatOptions::default(),
    )
}

/// [`encode_chat`] with template options.
pub fn encode_chat_with(
    tok: &Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    opts: &ChatOptions,
) -> Result<ChatPrompt> {
    let special = |s: &str| {
        tok.token_id(s).ok_or_else(|| {
            ModelError::Tokenizer(format!("vocabulary has no `{s}`: not a ChatML model"))
        })
    };
    let (start, end) = (special("<|im_start|>")?, special("<|im_end|>")?);
    let newline = tok.encode("\n", false)?;
    let mut ids = tok.bos_prefix();
    let mut spans = Vec::new();
    for m in with_default_system(messages, opts) {
        ids.push(start);
        ids.extend(tok.encode(m.role.as_str(), false)?);
        ids.extend(&newline);
        let from = ids.len();
        ids.extend(tok.encode(&m.content, false)?);
        ids.push(end);
        if m.role == Role::Assistant {
            spans.push(from..ids.len());
        }
        ids.extend(&newline);
    }
    if add_generation_prompt {
        ids.push(start);
        ids.extend(tok.encode(Role::Assistant.as_str(), false)?);
        ids.extend(&newline);
        if opts.empty_think {
            // Our own fixed text: specials allowed (`<think>` is an added token in Qwen3).
            ids.extend(tok.encode(EMPTY_THINK, true)?);
        }
    }
    Ok(ChatPrompt {
        ids,
        assistant_spans: spans,
    })
}
