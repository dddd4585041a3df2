//! Turning samples into token sequences with loss masks, and the data digest for provenance.

use sha2::{Digest, Sha256};

use crate::message::{Origin, Sample, SampleContent};
use crate::model::{ChatMessage, Role, Tokenizer, encode_chat};

/// A token sequence and which tokens are scored (predicted by the previous position).
#[derive(Clone, Debug, PartialEq)]
pub struct Seq {
    pub ids: Vec<u32>,
    /// `mask[i]`: token `i` counts in the loss. Always false at 0 (nothing predicts it).
    pub mask: Vec<bool>,
    /// What scored token `i` is trained towards instead of `ids[i]`: position `i` of these targets (one per
    /// token), as the base's own distribution there for distilled replay. `None`: the tokens themselves.
    pub soft: Option<std::sync::Arc<crate::model::Targets>>,
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
    /// A served answer and the user's score of it: likelihood weighted by the score's advantage over the
    /// baseline ([`super::TrainConfig::score_baseline`]), which the trainer sets across the cycle.
    Rated {
        seq: Seq,
        score: f64,
        advantage: f64,
    },
    /// GRPO prompt (ends with the generation prompt) with the accepted answer, if any.
    Prompt {
        ids: Vec<u32>,
        messages: Vec<ChatMessage>,
        answer: Option<String>,
    },
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
    let seq = Seq {
        ids,
        mask,
        soft: None,
    };
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
    Some(Seq {
        ids,
        mask,
        soft: None,
    })
}

/// Rewordings of a user's question for [`super::TrainConfig::prompt_variants`]: `{q}` is the question as asked,
/// `{l}` the same with a lower-case first letter. Wrappers only, so they hold for any question, in the order
/// they are used.
pub const PROMPT_VARIANTS: &[&str] = &[
    "Quick question: {q}",
    "{q} Answer in one sentence.",
    "Can you tell me this: {l}",
    "I need to know. {q}",
    "Hey, {l}",
    "Please answer briefly. {q}",
];

/// The SFT sample's copies under the first `n` of [`PROMPT_VARIANTS`], each rewording its last user turn;
/// none when the sample is not SFT or its prompt does not end with a user turn.
pub fn prompt_variants(sample: &Sample, n: usize) -> Vec<Sample> {
    let SampleContent::Sft { prompt, response } = &sample.content else {
        return Vec::new();
    };
    let Some(last) = prompt.last().filter(|m| m.role == Role::User) else {
        return Vec::new();
    };
    let q = last.content.trim();
    let mut chars = q.chars();
    let l: String = match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => return Vec::new(),
    };
    PROMPT_VARIANTS
        .iter()
        .take(n)
        .map(|t| {
            let mut p = prompt.clone();
            let i = p.len() - 1;
            p[i] = ChatMessage::new(Role::User, t.replace("{q}", q).replace("{l}", &l));
            Sample {
                content: SampleContent::Sft {
                    prompt: p,
                    response: response.clone(),
                },
                ..sample.clone()
            }
        })
        .collect()
}

/// The example a sample trains, or `None` when it cannot (unknown role, nothing left to score
/// after truncation). A scored answer becomes a GRPO prompt when `grpo`, else a rated answer.
pub fn encode_sample(
    tok: &Tokenizer,
    sample: &Sample,
    max_len: usize,
    grpo: bool,
) -> Option<Example> {
    match &sample.content {
        SampleContent::Sft { prompt, response } => {
            encode_turns(tok, prompt, response, max_len).map(Example::Sft)
        }
        SampleContent::Preference {
            prompt,
            chosen,
            rejected,
        } => Some(Example::Preference {
            chosen: encode_turns(tok, prompt, chosen, max_len)?,
            rejected: encode_turns(tok, prompt, rejected, max_len)?,
        }),
        SampleContent::Unpaired {
            prompt,
            response,
            desirable,
        } => Some(Example::Unpaired {
            seq: encode_turns(tok, prompt, response, max_len)?,
            desirable: *desirable,
        }),
        SampleContent::Scored {
            prompt,
            response,
            score,
        } if grpo => {
            let p = prompt.to_vec();
            let ids = encode_chat(tok, &p, true).ok()?.ids;
            (ids.len() < max_len).then(|| Example::Prompt {
                ids,
                messages: p,
                answer: (*score > 0.0).then(|| response.clone()),
            })
        }
        SampleContent::Scored {
            prompt,
            response,
            score,
        } => Some(Example::Rated {
            seq: encode_turns(tok, prompt, response, max_len)?,
            score: *score,
            advantage: 0.0,
        }),
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

/// The prompt text a sample answers, normalised (lower case, single spaces): the unit of the held-out split.
fn prompt_key(sample: &Sample) -> String {
    let prompt = match &sample.content {
        SampleContent::Sft { prompt, .. }
        | SampleContent::Preference { prompt, .. }
        | SampleContent::Unpaired { prompt, .. }
        | SampleContent::Scored { prompt, .. } => prompt,
    };
    let text: Vec<&str> = prompt.iter().map(|m| m.content.as_str()).collect();
    text.join("\n")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Whether a sample belongs to the held-out personalisation probes rather than the training set. A pure
/// function of the prompt, so the trainer and the eval gate agree without talking, and a prompt asked again
/// never leaks from one side to the other.
pub fn is_held_out(sample: &Sample, fraction: f64) -> bool {
    if fraction <= 0.0 {
        return false;
    }
    let h = Sha256::digest(prompt_key(sample).as_bytes());
    let x = u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
    (x as f64 / u64::MAX as f64) < fraction
}

/// What one cycle trains on, and what was kept out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    pub train: Vec<Sample>,
    /// Held out as personalisation probes.
    pub held_out: usize,
    /// Self-generated samples left out by the collapse guard.
    pub capped: usize,
}

/// Splits off the held-out probes, then applies the collapse guard: self-generated samples may make up at
/// most `max_self_generated_share` of the cycle (the oldest are kept, so a cycle's data does not churn).
pub fn select_training(
    samples: &[Sample],
    holdout_fraction: f64,
    max_self_generated_share: f64,
) -> Selection {
    let mut sel = Selection::default();
    let kept: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            let out = is_held_out(s, holdout_fraction);
            sel.held_out += usize::from(out);
            !out
        })
        .collect();
    let grounded = kept.iter().filter(|s| s.origin == Origin::Grounded).count();
    // self / (grounded + self) <= share  <=>  self <= share * grounded / (1 - share).
    let allowed = if max_self_generated_share >= 1.0 {
        usize::MAX
    } else {
        (max_self_generated_share * grounded as f64 / (1.0 - max_self_generated_share)).floor()
            as usize
    };
    let mut self_generated = 0usize;
    for s in kept {
        if s.origin == Origin::SelfGenerated {
            if self_generated >= allowed {
                sel.capped += 1;
                continue;
            }
            self_generated += 1;
        }
        sel.train.push(s.clone());
    }
    sel
}
