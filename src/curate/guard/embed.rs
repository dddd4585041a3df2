//! Text representations from a frozen base model, for the probe guard: the residual stream after
//! some blocks, pooled over the text's tokens.
//!
//! Why pooled residuals: a logistic head on them knows every word the base model knows, where the
//! builtin guard knows only the words of its training prompts.

use candle_core::{Device, Tensor};

use super::GuardError;
use crate::model::{Tokenizer, Transformer};

/// Longest text the embedding reads, in tokens; the rest is cut (a guard prompt's intent is
/// nearly always in its first sentences, and the cost grows with the length).
pub const MAX_TOKENS: usize = 96;
/// Texts embedded in one forward; right padding is harmless under causal attention.
const BATCH: usize = 16;

fn model_err(what: &str, e: impl std::fmt::Display) -> GuardError {
    GuardError::Model(format!("{what}: {e}"))
}

/// Embeds `texts` with `model`'s residual stream after each of `layers` blocks (ascending): per
/// text and layer, the mean of the residual over the text's tokens (the first left out when there
/// are others: it carries the attention sink's outsized activations) followed by the last token's
/// residual; `layers.len() × 2 × hidden` values per text, layer by layer.
pub fn embed(
    model: &Transformer,
    tok: &Tokenizer,
    texts: &[&str],
    layers: &[usize],
) -> Result<Vec<Vec<f32>>, GuardError> {
    let d = model.config().hidden_size;
    let mut ids: Vec<(usize, Vec<u32>)> = Vec::with_capacity(texts.len());
    for (i, t) in texts.iter().enumerate() {
        let mut v = tok
            .encode_prompt(t, false)
            .map_err(|e| model_err("tokenizing a guard text", e))?;
        v.truncate(MAX_TOKENS);
        if v.is_empty() {
            v = tok
                .encode_prompt(" ", false)
                .map_err(|e| model_err("tokenizing a guard text", e))?;
        }
        ids.push((i, v));
    }
    // Similar lengths share a batch, so little compute goes to padding.
    ids.sort_by_key(|(_, v)| v.len());
    let mut out = vec![Vec::new(); texts.len()];
    for chunk in ids.chunks(BATCH) {
        let l = chunk.iter().map(|(_, v)| v.len()).max().unwrap_or(1);
        let mut flat = Vec::with_capacity(chunk.len() * l);
        for (_, v) in chunk {
            flat.extend_from_slice(v);
            flat.extend(std::iter::repeat_n(v[0], l - v.len()));
        }
        let t = Tensor::from_vec(flat, (chunk.len(), l), &Device::Cpu)
            .map_err(|e| model_err("batching guard texts", e))?;
        let h = model
            .residual(&t, layers)
            .and_then(|h| Ok(h.flatten_all()?.to_vec1::<f32>()?))
            .map_err(|e| model_err("embedding guard texts", e))?;
        let b = chunk.len();
        for (bi, (i, v)) in chunk.iter().enumerate() {
            let from = usize::from(v.len() > 1);
            let n = (v.len() - from) as f32;
            let mut e = vec![0f32; layers.len() * 2 * d];
            for (k, e) in e.chunks_exact_mut(2 * d).enumerate() {
                let at = (k * b + bi) * l * d;
                let rows = &h[at..at + v.len() * d];
                for row in rows[from * d..].chunks_exact(d) {
                    for (a, x) in e[..d].iter_mut().zip(row) {
                        *a += x / n;
                    }
                }
                e[d..].copy_from_slice(&rows[(v.len() - 1) * d..]);
            }
            out[*i] = e;
        }
    }
    Ok(out)
}
