//! Token generation: seeded sampling (greedy, temperature, top-k, top-p), stop tokens and stop
//! strings, a token limit, and a per-token callback for streaming.
//!
//! Streamed text never contains a stop string or half a UTF-8 character: text that could still
//! turn into a stop string is held back until it cannot.

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::lora::LoraSet;
use super::tokenizer::Tokenizer;
use super::transformer::{GpuDecoder, KvCache, Transformer};
use super::{ModelError, Result};

/// How to pick tokens and when to stop.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateConfig {
    pub max_tokens: usize,
    /// 0 (or below) means greedy.
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub seed: u64,
    /// Generation ends when the text contains one of these; the text is cut before it.
    pub stop_strings: Vec<String>,
    /// Generation ends when one of these is sampled (it is not added to the output).
    pub stop_tokens: Vec<u32>,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
            stop_strings: Vec::new(),
            stop_tokens: Vec::new(),
        }
    }
}

impl GenerateConfig {
    /// Greedy decoding of at most `max_tokens`, stopping at the tokenizer's EOS, its EOT (end of turn, which
    /// chat models end a reply with where it differs from EOS), `<|im_end|>` and the special tokens Phi-3, Gemma
    /// and Llama 3 end a turn with (`<|end|>`, `<end_of_turn>`, `<|eot_id|>`).
    pub fn greedy(tok: &Tokenizer, max_tokens: usize) -> Self {
        let mut stop_tokens: Vec<u32> = tok.eos_id.into_iter().chain(tok.eot_id).collect();
        stop_tokens.extend(tok.token_id("<|im_end|>"));
        // Files often name no end-of-turn token; llama.cpp stops at these by name, where they are special.
        stop_tokens.extend(
            ["<|end|>", "<end_of_turn>", "<|eot_id|>"]
                .into_iter()
                .filter_map(|t| tok.token_id(t))
                .filter(|&id| tok.is_special(id)),
        );
        stop_tokens.sort_unstable();
        stop_tokens.dedup();
        Self {
            max_tokens,
            stop_tokens,
            ..Self::default()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    MaxTokens,
    StopToken(u32),
    StopString(String),
    ContextFull,
    /// The callback asked to stop.
    Cancelled,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOutput {
    /// Generated ids, without the stop token.
    pub tokens: Vec<u32>,
    /// Decoded text, cut before a stop string.
    pub text: String,
    pub reason: StopReason,
}

/// One streamed step. The concatenated `text` of all events equals [`GenerateOutput::text`].
#[derive(Clone, Debug)]
pub struct TokenEvent<'a> {
    /// The sampled token; `None` for the closing flush of text held back until the end (a
    /// possible stop-string prefix, or an incomplete UTF-8 sequence rendered as U+FFFD).
    pub token: Option<u32>,
    /// Text that became final with this event (may be empty).
    pub text: &'a str,
}

/// Seeded sampler. Same seed, logits and settings give the same tokens.
#[derive(Clone, Debug)]
pub struct Sampler {
    rng: StdRng,
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
}

impl Sampler {
    pub fn new(cfg: &GenerateConfig) -> Self {
        Self {
            rng: StdRng::seed_from_u64(cfg.seed),
            temperature: cfg.temperature,
            top_k: cfg.top_k,
            top_p: cfg.top_p,
        }
    }

    /// Picks a token from unnormalised logits. Greedy ties go to the lowest id.
    ///
    /// Sorting the whole vocabulary per token is a sizeable share of a decode step, so only what a setting
    /// needs is ordered: nothing for plain temperature sampling (one pass in id order), the `top_k` best for
    /// top-k, and for top-p a best prefix grown until it holds the nucleus. Candidates are ranked by logit,
    /// ties to the lower id.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(ModelError::Generate("empty logits".into()));
        }
        if logits.iter().any(|x| x.is_nan()) {
            return Err(ModelError::Generate("NaN in logits".into()));
        }
        if self.temperature <= 0.0 || self.top_k == Some(1) {
            return Ok(argmax(logits));
        }
        let n = logits.len();
        let max = logits[argmax(logits) as usize];
        let temperature = self.temperature;
        let weight = |i: usize| ((logits[i] - max) / temperature).exp();
        let top_p = self.top_p.filter(|p| *p < 1.0);
        let kept = self.top_k.map_or(n, |k| k.clamp(1, n));
        if kept == n && top_p.is_none() {
            // Plain temperature sampling: the distribution over all ids, walked in id order.
            let weights: Vec<f32> = (0..n).map(weight).collect();
            let target = self.rng.random::<f32>() * weights.iter().sum::<f32>();
            let mut acc = 0.0;
            for (i, w) in weights.iter().enumerate() {
                acc += w;
                if target < acc {
                    return Ok(i as u32);
                }
            }
            return Ok(argmax(logits));
        }
        let better = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        // The kept candidates (the top k, or every id), and their mass, which normalises.
        let mut idx: Vec<usize> = (0..n).collect();
        if kept < n {
            idx.select_nth_unstable_by(kept - 1, better);
            idx.truncate(kept);
        }
        let total: f32 = idx.iter().map(|&i| weight(i)).sum();
        // The best `prefix` candidates in order; with top-p, grown until their mass reaches the nucleus.
        let mut prefix = if top_p.is_some() { kept.min(64) } else { kept };
        loop {
            if prefix < kept {
                idx.select_nth_unstable_by(prefix - 1, better);
            }
            idx[..prefix].sort_unstable_by(better);
            let mass: f32 = idx[..prefix].iter().map(|&i| weight(i)).sum();
            match top_p {
                Some(p) if prefix < kept && mass < p * total => prefix = (prefix * 4).min(kept),
                _ => break,
            }
        }
        idx.truncate(prefix);
        let mut probs: Vec<f32> = idx.iter().map(|&i| weight(i) / total).collect();
        if let Some(p) = top_p {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            idx.truncate(keep);
        }
        let s: f32 = probs.iter().sum();
        let r: f32 = self.rng.random::<f32>() * s;
        let mut acc = 0.0;
        for (q, &i) in probs.iter().zip(&idx) {
            acc += q;
            if r < acc {
                return Ok(i as u32);
            }
        }
        Ok(*idx.last().expect("at least one candidate") as u32)
    }
}

/// Index of the largest logit (first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Accumulates token bytes into text, emitting only complete UTF-8 and holding back any tail that
/// could begin a stop string.
struct TextStream<'a> {
    stops: &'a [String],
    pending: Vec<u8>,
    text: String,
    emitted: usize,
}

impl TextStream<'_> {
    fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    self.text.push_str(s);
                    self.pending.clear();
                    return;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    self.text.push_str(
                        std::str::from_utf8(&self.pending[..valid]).expect("valid prefix"),
                    );
                    match e.error_len() {
                        Some(n) => {
                            self.text.push('\u{FFFD}');
                            self.pending.drain(..valid + n);
                        }
                        None => {
                            self.pending.drain(..valid);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The first stop string present, and where it starts.
    fn find_stop(&self) -> Option<(usize, &str)> {
        self.stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.text.find(s.as_str()).map(|p| (p, s.as_str())))
            .min_by_key(|(p, _)| *p)
    }

    /// Newly final text: everything except a suffix that is a prefix of some stop string.
    fn take_final(&mut self) -> &str {
        let mut hold = 0;
        for s in self.stops {
            for l in (1..s.len()).rev() {
                if l > hold && s.is_char_boundary(l) && self.text.ends_with(&s[..l]) {
                    hold = l;
                    break;
                }
            }
        }
        let mut end = self.text.len() - hold;
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        let start = self.emitted.min(end);
        self.emitted = end.max(self.emitted);
        &self.text[start..end]
    }
}

/// Generates from `prompt` ids. `on_token` sees each token and the text it made final; returning
/// `false` cancels. The model's weights are shared, the KV cache is local to this call, and `lora`
/// (if any) is used for every step, so a registry swap mid-generation does not affect it.
pub fn generate(
    model: &Transformer,
    tok: &Tokenizer,
    prompt: &[u32],
    lora: Option<&LoraSet>,
    cfg: &GenerateConfig,
    on_token: impl FnMut(TokenEvent<'_>) -> bool,
) -> Result<GenerateOutput> {
    Ok(generate_reusing(model, tok, prompt, lora, cfg, None, on_token)?.0)
}

/// A KV cache and the tokens at its positions: what a finished generation leaves, so that the next turn of
/// the same conversation, whose prompt starts with those tokens, prefills only what is new.
#[derive(Debug)]
pub struct CachedPrefix {
    /// The token at each cached position, in order (`tokens.len() == cache.len()`).
    pub tokens: Vec<u32>,
    pub cache: KvCache,
}

impl CachedPrefix {
    /// How many leading positions `prompt` shares with this cache, leaving at least the prompt's last token
    /// to run (its logits start generation).
    pub fn reusable_for(&self, prompt: &[u32]) -> usize {
        reusable_positions(&self.tokens, prompt)
    }
}

/// How many leading positions of `cached` a `prompt` may keep: those it shares, leaving its last token to run.
pub fn reusable_positions(cached: &[u32], prompt: &[u32]) -> usize {
    let common = cached
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    common.min(prompt.len().saturating_sub(1))
}

/// [`generate`], starting from `reuse` when given: a cache this model filled under the same adapter (the
/// caller's to guarantee; keys and values depend on both). Its positions that `prompt` starts with are kept
/// and only the rest of the prompt is prefilled. Returns the output, how many prompt positions came from
/// `reuse`, and the cache of every position this call ran (the prompt, then each generated token fed back).
pub fn generate_reusing(
    model: &Transformer,
    tok: &Tokenizer,
    prompt: &[u32],
    lora: Option<&LoraSet>,
    cfg: &GenerateConfig,
    reuse: Option<CachedPrefix>,
    on_token: impl FnMut(TokenEvent<'_>) -> bool,
) -> Result<(GenerateOutput, usize, CachedPrefix)> {
    if prompt.is_empty() {
        return Err(ModelError::Input("empty prompt".into()));
    }
    let ctx = model.max_positions();
    if prompt.len() >= ctx {
        return Err(ModelError::Input(format!(
            "prompt of {} tokens fills the context of {ctx}",
            prompt.len()
        )));
    }
    let (mut cache, reused) = match reuse {
        Some(CachedPrefix { tokens, mut cache }) if tokens.len() == cache.len() => {
            let keep = reusable_positions(&tokens, prompt);
            cache.truncate(keep);
            (cache, keep)
        }
        _ => (model.new_cache(), 0),
    };
    let input = Tensor::from_slice(&prompt[reused..], (1, prompt.len() - reused), &Device::Cpu)?;
    let logits: Vec<f32> =
        with_spinning_pool(|| model.forward_last(&input, Some(&mut cache), lora))?
            .squeeze(0)?
            .to_vec1()?;
    let (out, generated) = decode_loop(tok, cfg, logits, on_token, |next| {
        if cache.len() >= ctx {
            return Ok(None);
        }
        let input = Tensor::from_slice(&[next], (1, 1), &Device::Cpu)?;
        let logits = with_spinning_pool(|| model.forward_last(&input, Some(&mut cache), lora))?
            .squeeze(0)?
            .to_vec1()?;
        Ok(Some(logits))
    })?;
    let mut fed = prompt.to_vec();
    fed.extend(generated);
    Ok((out, reused, CachedPrefix { tokens: fed, cache }))
}

/// [`generate`] on a GPU decoder (its adapter is the one it holds), as [`generate_reusing`] with the decoder's
/// cache: the positions the prompt starts with are kept, the rest of it is prefilled, then sampling and
/// stopping are exactly [`generate`]'s. Returns the output and how many prompt positions were reused.
pub fn generate_on_gpu(
    dec: &mut GpuDecoder,
    tok: &Tokenizer,
    prompt: &[u32],
    cfg: &GenerateConfig,
    on_token: impl FnMut(TokenEvent<'_>) -> bool,
) -> Result<(GenerateOutput, usize)> {
    if prompt.is_empty() {
        return Err(ModelError::Input("empty prompt".into()));
    }
    let ctx = dec.capacity();
    if prompt.len() >= ctx {
        return Err(ModelError::Input(format!(
            "prompt of {} tokens fills the context of {ctx}",
            prompt.len()
        )));
    }
    let keep = reusable_positions(dec.tokens(), prompt);
    dec.truncate(keep)?;
    let logits = dec.prefill(&prompt[keep..])?;
    let (out, _) = decode_loop(tok, cfg, logits, on_token, |next| {
        if dec.len() >= ctx {
            return Ok(None);
        }
        dec.step(next).map(Some)
    })?;
    Ok((out, keep))
}

/// Samples from `logits`, streams text, and feeds each kept token to `next_logits` for the next logits
/// (`None`: the context is full) until a stop. Returns the output and the tokens fed back.
fn decode_loop(
    tok: &Tokenizer,
    cfg: &GenerateConfig,
    mut logits: Vec<f32>,
    mut on_token: impl FnMut(TokenEvent<'_>) -> bool,
    mut next_logits: impl FnMut(u32) -> Result<Option<Vec<f32>>>,
) -> Result<(GenerateOutput, Vec<u32>)> {
    let mut sampler = Sampler::new(cfg);
    let mut fed = Vec::new();
    let mut stream = TextStream {
        stops: &cfg.stop_strings,
        pending: Vec::new(),
        text: String::new(),
        emitted: 0,
    };
    let mut tokens = Vec::new();
    let mut reason = StopReason::MaxTokens;
    for step in 0..cfg.max_tokens {
        let next = sampler.sample(&logits)?;
        if cfg.stop_tokens.contains(&next) {
            reason = StopReason::StopToken(next);
            break;
        }
        tokens.push(next);
        if !tok.is_special(next) {
            stream.push(&tok.token_bytes(next));
        }
        if let Some((pos, s)) = stream.find_stop() {
            let s = s.to_string();
            stream.text.truncate(pos);
            let start = stream.emitted.min(pos);
            on_token(TokenEvent {
                token: Some(next),
                text: &stream.text[start..],
            });
            stream.emitted = pos;
            reason = StopReason::StopString(s);
            break;
        }
        if !on_token(TokenEvent {
            token: Some(next),
            text: stream.take_final(),
        }) {
            reason = StopReason::Cancelled;
            break;
        }
        if step + 1 == cfg.max_tokens {
            break;
        }
        match next_logits(next)? {
            Some(l) => logits = l,
            None => {
                reason = StopReason::ContextFull;
                break;
            }
        }
        fed.push(next);
    }
    if !stream.pending.is_empty() {
        stream.text.push('\u{FFFD}');
    }
    let start = stream.emitted.min(stream.text.len());
    if start < stream.text.len() && reason != StopReason::Cancelled {
        on_token(TokenEvent {
            token: None,
            text: &stream.text[start..],
        });
    }
    if reason == StopReason::Cancelled {
        // The caller stopped listening: return only what it was shown.
        stream.text.truncate(start);
    }
    Ok((
        GenerateOutput {
            tokens,
            text: stream.text,
            reason,
        },
        fed,
    ))
}

/// Runs `f` (one forward pass) while the current pool's other threads busy-wait for its forks instead of
/// sleeping between them. A decode step forks a few times per layer; a rayon worker that finds nothing to do
/// sleeps after a short spin, and waking it again (futex, an inter-processor interrupt in a VM) costs more than
/// the half matrix it was woken for; spinning between forks is what lets a second thread pay off, as it does
/// for llama.cpp, whose threads spin between ops. The helpers spin only while `f` runs.
/// The decode step's own splits go through a [`SpinPool`](super::spin_pool::SpinPool) the helpers poll on every
/// round (one load), and rayon's queues (prefill, candle's ops) every 32nd round, since a rayon poll costs more.
/// Outside a pool, or with one thread, `f` just runs.
fn with_spinning_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    if helpers == 0 || rayon::current_thread_index().is_none() {
        return f();
    }
    let done = AtomicBool::new(false);
    let spin_pool = super::spin_pool::SpinPool::new(helpers);
    rayon::scope(|s| {
        // Spawned before `f` forks anything, so they sit at the bottom of this thread's deque: thieves take
        // them first, and this thread, which pops from the top, never runs one itself while `f` waits on a
        // stolen half (it would spin until `done`, which only `f` returning sets).
        for _ in 0..helpers {
            s.spawn(|_| {
                let (mut idle, mut seen) = (0u32, 0);
                while !done.load(Ordering::Acquire) {
                    if spin_pool.help(&mut seen)
                        || (idle % 32 == 31 && rayon::yield_now() == Some(rayon::Yield::Executed))
                    {
                        idle = 0;
                    } else {
                        idle = idle.wrapping_add(1);
                        // Now and then give the core away, in case another process's thread is waiting for it.
                        if idle.is_multiple_of(256) {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                }
            });
        }
        let out = spin_pool.installed(f);
        done.store(true, Ordering::Release);
        out
    })
}
