//! Turning samples into token sequences with loss masks, and the data digest for provenance.

use sha2::{Digest, Sha256};

use crate::engine::message::{Sample, SampleContent};
use crate::model::{ChatMessage, Role, Tokenizer, encode_chat};

/// A token sequence and which tokens are scored (predicted by the previous position).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seq {
    pub ids: Vec<u32>,
    /// `mask[i]`: token `i` counts in the loss. Always false at 0 (nothing predicts it).
    pub mask: Vec<bool>,
}

impl Seq {
    /// Scored tokens.
    pub fn scored(&self) -> usize {
        self.mask.iter().filter(|m| **m).count()
    }
}

/// One trainable unit, by objective.
#[derive(Clone, Debug, PartialEq)]
pub enum Example {
    /// Imitate the assistant tokens.
    Sft(Seq),
    /// DPO pair over the same prompt.
    Preference { chosen: Seq, rejected: Seq },
    /// KTO judgement.
    Unpaired { seq: Seq, desirable: bool },
    /// GRPO prompt (ends with the generation prompt) with the accepted answer, if any.
    Prompt {
        ids: Vec<u32>,
        messages: Vec<ChatMessage>,
        answer: Option<String>,
    },
}

fn messages(prompt: &[crate::engine::message::ChatMessage]) -> Option<Vec<ChatMessage>> {
    prompt
        .iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "system" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                _ => return None,
            };
            Some(ChatMessage::new(role, m.content.clone()))
        })
        .collect()
}

/// Encodes `prompt + response` with ChatML; the mask covers exactly the assistant turns' tokens
/// (content and closing `<|im_end|>`), including earlier assistant turns of the prompt.
pub fn encode_turns(
    tok: &Tokenizer,
    prompt: &[ChatMessage],
    response: &str,
    max_len: usize,
) -> Option<Seq> {
    let mut msgs = prompt.to_vec();
    msgs.push(ChatMessage::new(Role::Assistant, response));
    let enc = encode_chat(tok, &msgs, false).ok()?;
    let mut mask = enc.assistant_mask();
    let mut ids = enc.ids;
    ids.truncate(max_len);
    mask.truncate(max_len);
    if let Some(m) = mask.first_mut() {
        *m = false;
    }
    let seq = Seq { ids, mask };
    (seq.scored() > 0).then_some(seq)
}

/// Plain text for the replay loss: every token after the first is scored.
pub fn encode_text(tok: &Tokenizer, text: &str, max_len: usize) -> Option<Seq> {
    let mut ids = tok.encode(text, false).ok()?;
    ids.truncate(max_len);
    if ids.len() < 2 {
        return None;
    }
    let mut mask = vec![true; ids.len()];
    mask[0] = false;
    Some(Seq { ids, mask })
}

/// The example a sample trains, or `None` when it cannot (unknown role, nothing left to score
/// after truncation, or a Scored sample while GRPO is off).
pub fn encode_sample(
    tok: &Tokenizer,
    sample: &Sample,
    max_len: usize,
    grpo: bool,
) -> Option<Example> {
    match &sample.content {
        SampleContent::Sft { prompt, response } => {
            encode_turns(tok, &messages(prompt)?, response, max_len).map(Example::Sft)
        }
        SampleContent::Preference {
            prompt,
            chosen,
            rejected,
        } => {
            let p = messages(prompt)?;
            Some(Example::Preference {
                chosen: encode_turns(tok, &p, chosen, max_len)?,
                rejected: encode_turns(tok, &p, rejected, max_len)?,
            })
        }
        SampleContent::Unpaired {
            prompt,
            response,
            desirable,
        } => Some(Example::Unpaired {
            seq: encode_turns(tok, &messages(prompt)?, response, max_len)?,
            desirable: *desirable,
        }),
        SampleContent::Scored {
            prompt,
            response,
            score,
        } if grpo => {
            let p = messages(prompt)?;
            let ids = encode_chat(tok, &p, true).ok()?.ids;
            (ids.len() < max_len).then(|| Example::Prompt {
                ids,
                messages: p,
                answer: (*score > 0.0).then(|| response.clone()),
            })
        }
        SampleContent::Scored { .. } => None,
    }
}

/// SHA-256 over every sample's id and content, in order: which data, in which order, trained.
pub fn data_digest(samples: &[Sample]) -> String {
    let mut h = Sha256::new();
    for s in samples {
        h.update((s.id.len() as u64).to_le_bytes());
        h.update(s.id.as_bytes());
        let content = serde_json::to_vec(&s.content).unwrap_or_default();
        h.update((content.len() as u64).to_le_bytes());
        h.update(&content);
    }
    super::artifact::hex(&h.finalize())
}
