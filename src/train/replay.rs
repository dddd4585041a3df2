//! Self-distilled replay: the base's own greedy answers to a fixed, diverse set of everyday prompts, replayed
//! as chat turns beside a cycle's data. Training toward what the base already says, in the same chat format
//! the user's data comes in, holds the delta near the base where the user's data says nothing.
//!
//! The answers depend only on the base, so they are generated once per base and cached in
//! `DATA_DIR/replay/<base sha256>-<prompts>.json` (written atomically).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Result, TrainError};
use crate::message::Role;
use crate::model::{ChatMessage, GenerateConfig, Tokenizer, Transformer, encode_chat, generate};

/// The prompts hearth ships for self-distilled replay, one per line; held apart from the eval gate's probes.
pub const BUILTIN_PROMPTS: &str = include_str!("../../data/replay/prompts.txt");

/// Tokens each replayed answer may have.
pub const ANSWER_TOKENS: usize = 64;

/// One prompt and the base's greedy answer to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub prompt: String,
    pub answer: String,
}

/// Where the answers for `base_sha256` and the first `prompts` prompts are cached. The name carries a digest
/// of those prompts, so a release that rewords or adds prompts generates its answers afresh.
pub fn cache_path(data_dir: &Path, base_sha256: &str, prompts: usize) -> PathBuf {
    let digest = super::sha256_hex(
        builtin_prompts(prompts)
            .collect::<Vec<_>>()
            .join("\n")
            .as_bytes(),
    );
    data_dir
        .join("replay")
        .join(format!("{base_sha256}-{prompts}-{}.json", &digest[..16]))
}

/// The first `n` built-in prompts.
fn builtin_prompts(n: usize) -> impl Iterator<Item = &'static str> {
    BUILTIN_PROMPTS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(n)
}

/// The base's answers to the first `prompts` built-in prompts: from the cache when there, else generated
/// greedily with no adapter and cached.
pub fn self_distilled(
    model: &Transformer,
    tok: &Tokenizer,
    base_sha256: &str,
    prompts: usize,
    data_dir: &Path,
) -> Result<Vec<Turn>> {
    let path = cache_path(data_dir, base_sha256, prompts);
    let io = |e| TrainError::Io {
        path: path.display().to_string(),
        source: e,
    };
    if path.exists() {
        let text = std::fs::read_to_string(&path).map_err(io)?;
        return Ok(serde_json::from_str(&text)?);
    }
    let greedy = GenerateConfig {
        max_tokens: ANSWER_TOKENS,
        temperature: 0.0,
        ..GenerateConfig::default()
    };
    let mut turns = Vec::new();
    for prompt in builtin_prompts(prompts) {
        let ids = encode_chat(tok, &[ChatMessage::new(Role::User, prompt)], true)?.ids;
        let out = generate(model, tok, &ids, None, &greedy, |_| true)?;
        let answer = out.text.trim().to_owned();
        if !answer.is_empty() {
            turns.push(Turn {
                prompt: prompt.to_owned(),
                answer,
            });
        }
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    crate::files::atomic_write(&path, &serde_json::to_vec_pretty(&turns)?).map_err(io)?;
    Ok(turns)
}
