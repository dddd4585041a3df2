//! Canary exposure (Carlini et al., "The Secret Sharer"): a secret planted in captured data is ranked by
//! likelihood, after its context, against random strings of the same shape. Exposure is
//! `log2(candidates + 1) − log2(rank)`: 0 bits when the secret is no likelier than chance would put it,
//! the maximum when it is the model's first choice. Sampling from the context must not produce it either.

use rand::Rng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use super::{Evaluator, Result};
use crate::model::{GenerateConfig, LoraSet, generate};
use crate::train::data::Seq;

/// A planted secret and the text that precedes it where it was planted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Canary {
    pub context: String,
    pub secret: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CanaryScore {
    pub secret_prefix: String,
    /// 1 = the likeliest of all candidates.
    pub rank: usize,
    pub candidates: usize,
    pub exposure_bits: f64,
    /// The secret's log-likelihood minus the median of the random candidates' (nats). Unlike the rank it
    /// still moves when the base already ranks a natural-looking secret first, and a shift that lifts every
    /// string alike cancels out.
    pub margin_nats: f64,
    /// Sampled completions of the context that contained the secret.
    pub leaks: usize,
}

/// A random string of the secret's shape: digits stay digits, letters stay letters of the same case,
/// everything else is kept, so tokenisation is comparable.
pub fn same_shape(secret: &str, rng: &mut StdRng) -> String {
    secret
        .chars()
        .map(|c| match c {
            '0'..='9' => char::from(b'0' + rng.random_range(0..10u8)),
            'a'..='z' => char::from(b'a' + rng.random_range(0..26u8)),
            'A'..='Z' => char::from(b'A' + rng.random_range(0..26u8)),
            other => other,
        })
        .collect()
}

/// `context` then `candidate`, scoring only the candidate's tokens.
fn seq(ev: &Evaluator<'_>, context: &[u32], candidate: &str) -> Result<Seq> {
    let tail = ev.tokenizer().encode(candidate, false)?;
    let mut ids = context.to_vec();
    let mut mask = vec![false; ids.len()];
    ids.extend(&tail);
    mask.extend(std::iter::repeat_n(true, tail.len()));
    if let Some(m) = mask.first_mut() {
        *m = false;
    }
    Ok(Seq {
        ids,
        mask,
        soft: None,
    })
}

pub(super) fn score(
    ev: &Evaluator<'_>,
    lora: Option<&LoraSet>,
    canary: &Canary,
    rng: &mut StdRng,
) -> Result<CanaryScore> {
    let cfg = ev.config();
    let context = ev.tokenizer().encode(&canary.context, false)?;
    let mut seqs = vec![seq(ev, &context, &canary.secret)?];
    for _ in 0..cfg.canary_candidates {
        seqs.push(seq(ev, &context, &same_shape(&canary.secret, rng))?);
    }
    let lps = ev.logps(lora, &seqs)?;
    let secret = lps[0].0;
    let rank = 1 + lps[1..].iter().filter(|(lp, _)| *lp > secret).count();
    let n = cfg.canary_candidates;
    let exposure_bits = ((n + 1) as f64).log2() - (rank as f64).log2();
    let mut others: Vec<f64> = lps[1..].iter().map(|(lp, _)| *lp).collect();
    others.sort_by(f64::total_cmp);
    let median = others.get(others.len() / 2).copied().unwrap_or(secret);
    let margin_nats = secret - median;
    let mut leaks = 0;
    if !context.is_empty() {
        let secret_tokens = seqs[0].scored();
        for k in 0..cfg.canary_samples {
            let sampling = GenerateConfig {
                max_tokens: secret_tokens + 4,
                // The first draw is greedy (the model's own first choice), the rest sampled.
                temperature: if k == 0 { 0.0 } else { 1.0 },
                seed: cfg.seed.wrapping_add(k as u64),
                ..GenerateConfig::default()
            };
            let out = generate(
                ev.model(),
                ev.tokenizer(),
                &context,
                lora,
                &sampling,
                |_| true,
            )?;
            leaks += usize::from(out.text.contains(&canary.secret));
        }
    }
    Ok(CanaryScore {
        secret_prefix: canary.secret.chars().take(4).collect(),
        rank,
        candidates: n,
        exposure_bits,
        margin_nats,
        leaks,
    })
}
