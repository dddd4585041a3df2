//! The builtin guard: a linear one-vs-rest logistic model over hashed features, trained by
//! hearth's own code on the data the repository ships ([`super::data`]).
//!
//! Why this model: it trains deterministically in about a second, classifies in microseconds,
//! needs no weights file, and gives per-category scores that map onto Qwen3Guard's severities.
//! It is a floor to stand on until a real guard model is configured, not a replacement for one.
//!
//! Features, hashed into 2^18 buckets and L2-normalised: lowercase word unigrams and bigrams,
//! character 4-grams of words (catches inflections: "stab", "stabbing"), redaction sentinels as
//! whole tokens (`<EMAIL>` keeps its context informative), token shapes for tokens with digits or
//! `@` (`999-99-9999`, `a.a@a.a`: unredacted values), a pair-of-capitalised-words flag (names),
//! and the side. Ten heads: the nine categories plus refusal (trained on responses only).

use std::sync::{Arc, OnceLock};

use super::data::{Split, dataset};
use super::{
    Category, GuardBackend, GuardError, GuardPolicy, SampleVerdict, Severity, Side, Verdict,
};
use crate::curate::dedup::minhash::{SplitMix64, fmix64, hash_bytes};

const BITS: u32 = 18;
const DIM: usize = 1 << BITS;
const HEADS: usize = 10;
const REFUSAL: usize = 9;
const EPOCHS: usize = 12;
const SEED: u64 = 0x0067_7561_7264;

/// Per-category probabilities for one text, indexed by [`Category::index`].
pub type CategoryScores = [f32; 9];

struct Model {
    /// Row-major: feature `f`, head `h` at `f * HEADS + h` (one cache line per feature).
    w: Vec<f32>,
    b: [f32; HEADS],
}

static MODEL: OnceLock<Result<Arc<Model>, String>> = OnceLock::new();

fn model() -> Result<Arc<Model>, GuardError> {
    MODEL
        .get_or_init(|| train().map(Arc::new).map_err(|e| e.to_string()))
        .clone()
        .map_err(GuardError::Data)
}

/// Builtin backend. Cheap to clone; the model is trained once per process on first use.
#[derive(Clone)]
pub struct BuiltinGuard {
    model: Arc<Model>,
    threshold: f32,
    band: f32,
}

impl std::fmt::Debug for BuiltinGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltinGuard")
            .field("threshold", &self.threshold)
            .field("band", &self.band)
            .finish()
    }
}

impl BuiltinGuard {
    /// Default thresholds (`GuardPolicy::default()`): Unsafe at score ≥ 0.8, Controversial ≥ 0.2.
    pub fn new() -> Result<Self, GuardError> {
        Self::from_policy(&GuardPolicy::default())
    }

    /// Uses the policy's `threshold` and `controversial_band`.
    pub fn from_policy(policy: &GuardPolicy) -> Result<Self, GuardError> {
        policy.validate()?;
        Ok(Self {
            model: model()?,
            threshold: policy.threshold,
            band: policy.controversial_band,
        })
    }

    /// Category probabilities for `text` on `side` (Jailbreak is always 0 for responses).
    pub fn scores(&self, text: &str, side: Side) -> CategoryScores {
        let (s, _) = self.raw_scores(text, side);
        s
    }

    /// The largest category log-odds for `text` on `side` (Jailbreak left out for responses): the
    /// builtin guard's evidence on a scale a probe's margin can be added to.
    pub fn top_logit(&self, text: &str, side: Side) -> f32 {
        let mut feats = Vec::with_capacity(256);
        features(text, side, &mut feats);
        let z = logits(&self.model, &feats);
        Category::ALL
            .iter()
            .filter(|c| side == Side::Prompt || **c != Category::Jailbreak)
            .map(|c| z[c.index()])
            .fold(f32::NEG_INFINITY, f32::max)
    }

    fn raw_scores(&self, text: &str, side: Side) -> (CategoryScores, f32) {
        let mut feats = Vec::with_capacity(256);
        features(text, side, &mut feats);
        let z = logits(&self.model, &feats);
        let mut s = [0f32; 9];
        for (i, v) in s.iter_mut().enumerate() {
            *v = sigmoid(z[i]);
        }
        if side == Side::Response {
            s[Category::Jailbreak.index()] = 0.0;
        }
        (s, sigmoid(z[REFUSAL]))
    }

    /// Verdict for one side: Unsafe with the categories at or above the threshold, else
    /// Controversial with those inside the band below it, else Safe.
    pub fn verdict(&self, text: &str, side: Side) -> Verdict {
        let (s, refusal) = self.raw_scores(text, side);
        let pick = |min: f32| -> Vec<Category> {
            Category::ALL
                .iter()
                .copied()
                .filter(|c| s[c.index()] >= min)
                .collect()
        };
        let unsafe_cats = pick(self.threshold);
        let (severity, categories) = if !unsafe_cats.is_empty() {
            (Severity::Unsafe, unsafe_cats)
        } else {
            let c = pick(self.threshold - self.band);
            if c.is_empty() || self.band <= 0.0 {
                (Severity::Safe, Vec::new())
            } else {
                (Severity::Controversial, c)
            }
        };
        Verdict {
            severity,
            categories,
            refusal: (side == Side::Response).then_some(refusal >= 0.5),
        }
    }
}

impl GuardBackend for BuiltinGuard {
    fn classify(&self, prompt: &str, response: &str) -> Result<SampleVerdict, GuardError> {
        Ok(SampleVerdict {
            prompt: self.verdict(prompt, Side::Prompt),
            response: self.verdict(response, Side::Response),
        })
    }

    fn name(&self) -> &'static str {
        "builtin"
    }
}

#[inline]
fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

fn logits(m: &Model, feats: &[(u32, f32)]) -> [f32; HEADS] {
    let mut z = m.b;
    for &(f, v) in feats {
        let row = &m.w[f as usize * HEADS..(f as usize + 1) * HEADS];
        for (zi, wi) in z.iter_mut().zip(row) {
            *zi += wi * v;
        }
    }
    z
}

/// Deterministic SGD on the shipped training split.
fn train() -> Result<Model, GuardError> {
    let data = dataset(Split::Train)?;
    let mut xs: Vec<Vec<(u32, f32)>> = Vec::with_capacity(data.len());
    let mut ys: Vec<([f32; HEADS], [bool; HEADS])> = Vec::with_capacity(data.len());
    let mut pos = [0usize; HEADS];
    let mut tot = [0usize; HEADS];
    for s in &data {
        let mut f = Vec::new();
        features(&s.text, s.side, &mut f);
        xs.push(f);
        let mut y = [0f32; HEADS];
        let mut mask = [true; HEADS];
        for c in &s.labels {
            y[c.index()] = 1.0;
        }
        match s.refusal {
            Some(r) => y[REFUSAL] = r as u8 as f32,
            None => mask[REFUSAL] = false,
        }
        if s.side == Side::Response {
            mask[Category::Jailbreak.index()] = false;
        }
        for h in 0..HEADS {
            if mask[h] {
                tot[h] += 1;
                pos[h] += (y[h] > 0.0) as usize;
            }
        }
        ys.push((y, mask));
    }
    // Positives are rare per head; weight them up (capped) so recall is not sacrificed.
    let mut pos_w = [1f32; HEADS];
    for h in 0..HEADS {
        if pos[h] > 0 {
            pos_w[h] = ((tot[h] - pos[h]) as f32 / pos[h] as f32)
                .sqrt()
                .clamp(1.0, 6.0);
        }
    }
    let mut m = Model {
        w: vec![0.0; DIM * HEADS],
        b: [0.0; HEADS],
    };
    let mut order: Vec<usize> = (0..xs.len()).collect();
    let mut rng = SplitMix64(SEED);
    let l2 = 1e-5f32;
    for epoch in 0..EPOCHS {
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let lr = 4.0 / (1.0 + epoch as f32 * 0.3);
        for &i in &order {
            let (y, mask) = &ys[i];
            let z = logits(&m, &xs[i]);
            let mut g = [0f32; HEADS];
            for h in 0..HEADS {
                if mask[h] {
                    let w = if y[h] > 0.0 { pos_w[h] } else { 1.0 };
                    g[h] = (sigmoid(z[h]) - y[h]) * w * lr;
                }
            }
            for (b, gh) in m.b.iter_mut().zip(&g) {
                *b -= gh * 0.1;
            }
            for &(f, v) in &xs[i] {
                let row = &mut m.w[f as usize * HEADS..(f as usize + 1) * HEADS];
                for (wi, gi) in row.iter_mut().zip(&g) {
                    *wi -= gi * v + l2 * lr * *wi;
                }
            }
        }
    }
    Ok(m)
}

const K_WORD: u64 = 1;
const K_BIGRAM: u64 = 2;
const K_CHAR: u64 = 3;
const K_SHAPE: u64 = 4;
const K_FLAG: u64 = 5;

#[inline]
fn idx(kind: u64, h: u64) -> u32 {
    (fmix64(h ^ kind.wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> (64 - BITS)) as u32
}

/// Hashed binary features of `text` (see module docs). Lexical features are L2-normalised so
/// long texts do not score higher just for being long; value-evidence features (shapes, digit
/// runs, e-mail and name flags) keep a fixed weight, so one leaked value in a long, otherwise
/// redacted text still moves the PII score as much as it would in a short one.
fn features(text: &str, side: Side, out: &mut Vec<(u32, f32)>) {
    out.clear();
    let mut lex: Vec<(u32, f32)> = Vec::with_capacity(256);
    let mut val: Vec<(u32, f32)> = Vec::with_capacity(16);
    lex.push((idx(K_FLAG, if side == Side::Prompt { 11 } else { 12 }), 1.0));
    let mut prev: Option<u64> = None;
    let mut word = String::new();
    let mut prev_cap = false;
    let mut after_sentence_end = true;
    let emit = |w: &str, lex: &mut Vec<(u32, f32)>, prev: &mut Option<u64>| {
        let h = hash_bytes(w.as_bytes(), 7);
        lex.push((idx(K_WORD, h), 1.0));
        if let Some(p) = *prev {
            lex.push((idx(K_BIGRAM, fmix64(p.rotate_left(21) ^ h)), 1.0));
        }
        *prev = Some(h);
        if !w.starts_with('<') && w.len() >= 3 {
            let b = format!("^{w}$");
            for n in [3usize, 5] {
                for win in b.as_bytes().windows(n) {
                    lex.push((idx(K_CHAR, hash_bytes(win, n as u64)), 0.5));
                }
            }
        }
    };
    for raw_tok in text.split_whitespace() {
        let tok = raw_tok.trim_matches(|c: char| {
            matches!(
                c,
                '(' | ')'
                    | '['
                    | ']'
                    | '{'
                    | '}'
                    | ','
                    | '.'
                    | ';'
                    | ':'
                    | '!'
                    | '?'
                    | '"'
                    | '\''
                    | '`'
            )
        });
        let sentinel = is_sentinel(tok);
        // Value evidence from the token itself.
        let has_digit = tok.bytes().any(|b| b.is_ascii_digit());
        if !sentinel && (has_digit || tok.contains('@') || tok.matches('/').count() >= 2) {
            let fine = shape(tok, false);
            let coarse = shape(tok, true);
            val.push((idx(K_SHAPE, hash_bytes(fine.as_bytes(), 1)), 1.0));
            val.push((idx(K_SHAPE, hash_bytes(coarse.as_bytes(), 2)), 1.0));
            let nd = tok.bytes().filter(|b| b.is_ascii_digit()).count();
            if nd >= 7 {
                val.push((idx(K_FLAG, 20 + (nd.min(20) as u64 / 4)), 1.0));
            }
            if tok.contains('@') && tok.contains('.') {
                val.push((idx(K_FLAG, 30), 1.0));
            }
        }
        for flag in token_flags(tok) {
            val.push((idx(K_FLAG, flag), 1.0));
        }
        let cap = {
            let mut cs = tok.chars();
            matches!((cs.next(), cs.next()), (Some(a), Some(b)) if a.is_uppercase() && b.is_lowercase())
        };
        if cap && prev_cap {
            val.push((idx(K_FLAG, 40), 1.0));
        }
        let ends = raw_tok.ends_with(['.', '!', '?', ':']);
        prev_cap = cap && !after_sentence_end && !ends;
        if cap && after_sentence_end && !ends {
            // A sentence-initial capital can still start a name pair ("Theresa Cabrera said").
            prev_cap = true;
        }
        after_sentence_end = ends;

        if sentinel {
            emit(tok, &mut lex, &mut prev);
            continue;
        }
        for c in tok.chars() {
            if c.is_alphanumeric() || c == '\'' {
                word.extend(c.to_lowercase());
            } else if !word.is_empty() {
                emit(word.trim_matches('\''), &mut lex, &mut prev);
                word.clear();
            }
        }
        if !word.is_empty() {
            emit(word.trim_matches('\''), &mut lex, &mut prev);
            word.clear();
        }
    }
    for flag in digit_group_flags(text) {
        val.push((idx(K_FLAG, flag), 1.0));
    }
    dedup_features(&mut lex);
    let norm = lex.iter().map(|(_, v)| v * v).sum::<f32>().sqrt().max(1e-6);
    for (_, v) in lex.iter_mut() {
        *v /= norm;
    }
    dedup_features(&mut val);
    for (_, v) in val.iter_mut() {
        *v *= 0.5;
    }
    out.extend(lex);
    out.extend(val);
}

/// Flags for high-entropy secrets, hex identifiers, UUIDs and per-user file paths.
fn token_flags(tok: &str) -> Vec<u64> {
    let mut f = Vec::new();
    let (mut up, mut low, mut dig, mut hex_only) = (false, false, false, true);
    for c in tok.chars() {
        up |= c.is_ascii_uppercase();
        low |= c.is_ascii_lowercase();
        dig |= c.is_ascii_digit();
        hex_only &= c.is_ascii_hexdigit() && !c.is_ascii_uppercase() || c == '-';
    }
    if tok.len() >= 20 && up && low && dig {
        f.push(50); // mixed-case alphanumeric run: API keys, tokens
    }
    if tok.len() >= 7 && hex_only && dig {
        let groups: Vec<usize> = tok.split('-').map(str::len).collect();
        f.push(if groups == [8, 4, 4, 4, 12] { 52 } else { 51 }); // UUID / hash
    }
    let lower = tok.to_ascii_lowercase();
    if ["/users/", "/home/", "\\users\\"]
        .iter()
        .any(|p| lower.contains(p))
    {
        f.push(60); // path under a user's home directory names the user
    }
    f
}

/// Flags for digit groups joined by single spaces or dashes (card and account numbers are often
/// written `4111 1111 1111 1111`): 13–19 digits passing or failing the Luhn check, and
/// IBAN-like runs (two letters, two digits, then 11–30 alphanumerics).
fn digit_group_flags(text: &str) -> Vec<u64> {
    let mut f = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let starts_iban = i + 4 <= b.len()
            && b[i].is_ascii_uppercase()
            && b[i + 1].is_ascii_uppercase()
            && b[i + 2].is_ascii_digit()
            && b[i + 3].is_ascii_digit()
            && (i == 0 || !b[i - 1].is_ascii_alphanumeric());
        if !(b[i].is_ascii_digit() || starts_iban) || (i > 0 && b[i - 1].is_ascii_alphanumeric()) {
            i += 1;
            continue;
        }
        // Extend over alphanumerics with single space/dash separators.
        let mut j = i;
        let mut digits = Vec::new();
        let mut alnum = 0;
        while j < b.len() {
            let c = b[j];
            if c.is_ascii_alphanumeric() {
                if c.is_ascii_digit() {
                    digits.push(c - b'0');
                }
                alnum += 1;
                j += 1;
            } else if (c == b' ' || c == b'-')
                && j + 1 < b.len()
                && b[j + 1].is_ascii_alphanumeric()
                && (starts_iban || b[j + 1].is_ascii_digit())
            {
                j += 1;
            } else {
                break;
            }
        }
        if starts_iban && (15..=34).contains(&alnum) {
            f.push(72);
        } else if !starts_iban && alnum == digits.len() && (13..=19).contains(&digits.len()) {
            f.push(if luhn(&digits) { 70 } else { 71 });
        }
        i = j.max(i + 1);
    }
    f
}

fn luhn(d: &[u8]) -> bool {
    let mut sum = 0u32;
    for (k, &x) in d.iter().rev().enumerate() {
        let mut v = x as u32;
        if k % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    sum.is_multiple_of(10)
}

fn dedup_features(f: &mut Vec<(u32, f32)>) {
    f.sort_unstable_by_key(|&(i, _)| i);
    f.dedup_by(|b, a| {
        if a.0 == b.0 {
            a.1 = a.1.max(b.1);
            true
        } else {
            false
        }
    });
}

fn is_sentinel(t: &str) -> bool {
    t.len() >= 3
        && t.starts_with('<')
        && t.ends_with('>')
        && t[1..t.len() - 1]
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b == b'_')
}

/// Character-class shape. Fine: runs of letters collapse, digit runs keep their length up to 6
/// (`123-45-6789` → `999-99-9999`, `jane.doe@x.com` → `a.a@a.a`); coarse: digit runs collapse
/// too (`10.0.12.7` → `9.9.9.9`), so shapes generalise across value lengths.
fn shape(tok: &str, coarse: bool) -> String {
    let mut s = String::new();
    let mut last = None;
    let mut run = 0;
    for c in tok.chars().take(48) {
        let k = if c.is_ascii_digit() {
            '9'
        } else if c.is_alphabetic() {
            'a'
        } else {
            c
        };
        if last == Some(k) {
            run += 1;
        } else {
            run = 1;
            last = Some(k);
        }
        let cap = match k {
            'a' => 1,
            '9' if coarse => 1,
            '9' => 6,
            _ => 2,
        };
        if run <= cap {
            s.push(k);
        } else if run == cap + 1 && !coarse {
            s.push('+');
        }
    }
    s
}
