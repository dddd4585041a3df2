//! Deterministic synthetic corpus for measuring the deduper (tests, bench, and the datasketch
//! peer script, which reads the same records as JSONL).
//!
//! Records are short (20–60 words) pseudo-English: Zipf-distributed content words from a
//! procedurally built vocabulary mixed with common function words, so unrelated records share
//! words the way real text does. Mix: ~55% originals, ~30% near duplicates of an earlier original
//! (1–3 word substitutions/insertions/deletions/tail truncations, plus formatting changes half the
//! time), ~5% formatting-only variants (exact after normalisation), ~10% hard negatives that copy
//! about half of an earlier original and write the rest afresh (related, but not duplicates).

use serde::{Deserialize, Serialize};

use super::minhash::SplitMix64;

/// How a record was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CorpusKind {
    Original,
    /// Near duplicate of `source` with this many word edits.
    NearDuplicate {
        edits: u8,
    },
    /// Same words as `source`, only case/punctuation/whitespace differ.
    FormatVariant,
    /// Shares roughly half its words (a prefix) with `source`; not a duplicate.
    HardNegative,
}

/// One generated record; `id` is its position in the stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CorpusRecord {
    pub id: u64,
    pub text: String,
    pub kind: CorpusKind,
    pub source: Option<u64>,
}

impl CorpusRecord {
    /// Ground truth: near duplicates and format variants are duplicates of their source.
    pub fn is_duplicate(&self) -> bool {
        matches!(
            self.kind,
            CorpusKind::NearDuplicate { .. } | CorpusKind::FormatVariant
        )
    }
}

const FUNCTION_WORDS: &[&str] = &[
    "the", "a", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was",
    "at", "by", "this", "be", "from", "or", "have", "an", "are", "but", "not", "you", "we", "they",
    "which", "one", "all", "were", "their", "there", "been", "has", "more", "when", "will",
    "would", "can", "if", "so", "about", "into", "than", "then", "some", "could", "our",
];

const ONSETS: &[&str] = &[
    "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "br",
    "cr", "dr", "fl", "gr", "pl", "st", "tr", "sh", "ch", "th",
];
const VOWELS: &[&str] = &["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"];
const CODAS: &[&str] = &["", "", "", "n", "r", "s", "l", "t", "nd", "st", "ck", "m"];

struct Vocab {
    words: Vec<String>,
    cdf: Vec<f64>,
}

impl Vocab {
    fn new(rng: &mut SplitMix64, n: usize) -> Self {
        let mut seen = std::collections::HashSet::new();
        let mut words = Vec::with_capacity(n);
        while words.len() < n {
            let syl = 1 + rng.below(3);
            let mut w = String::new();
            for _ in 0..syl {
                w.push_str(ONSETS[rng.below(ONSETS.len())]);
                w.push_str(VOWELS[rng.below(VOWELS.len())]);
            }
            w.push_str(CODAS[rng.below(CODAS.len())]);
            if w.len() >= 3 && seen.insert(w.clone()) {
                words.push(w);
            }
        }
        let mut acc = 0.0;
        let cdf = (0..n)
            .map(|r| {
                acc += 1.0 / (r as f64 + 2.0);
                acc
            })
            .collect();
        Self { words, cdf }
    }

    fn word(&self, rng: &mut SplitMix64) -> String {
        if rng.chance(0.4) {
            return FUNCTION_WORDS[rng.below(FUNCTION_WORDS.len())].to_string();
        }
        let total = *self.cdf.last().unwrap_or(&1.0);
        let x = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let i = self
            .cdf
            .partition_point(|&c| c < x)
            .min(self.words.len() - 1);
        self.words[i].clone()
    }
}

/// Renders words as a sentence-like text; `messy` adds the formatting noise a copy-paste or a
/// reformatting would (case, punctuation, doubled spaces, line breaks).
fn render(words: &[String], rng: &mut SplitMix64, messy: bool) -> String {
    let mut s = String::new();
    let mut cap = true;
    for (i, w) in words.iter().enumerate() {
        if i > 0 {
            s.push_str(if messy && rng.chance(0.1) {
                "  "
            } else if messy && rng.chance(0.03) {
                "\n"
            } else {
                " "
            });
        }
        if cap || (messy && rng.chance(0.05)) {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                s.extend(f.to_uppercase());
                s.push_str(c.as_str());
            }
        } else if messy && rng.chance(0.02) {
            s.push_str(&w.to_uppercase());
        } else {
            s.push_str(w);
        }
        cap = false;
        let end = i + 1 == words.len();
        if end || rng.chance(0.08) {
            s.push(if messy && rng.chance(0.3) { '!' } else { '.' });
            cap = true;
        } else if rng.chance(if messy { 0.08 } else { 0.04 }) {
            s.push(',');
        }
    }
    s
}

/// Generates `n` records deterministically from `seed` (same inputs, same corpus, on every
/// platform), for measuring near-duplicate recall/precision and throughput.
pub fn near_dup_corpus(n: usize, seed: u64) -> Vec<CorpusRecord> {
    let mut rng = SplitMix64(seed);
    let vocab = Vocab::new(&mut rng, 4000);
    let mut originals: Vec<(u64, Vec<String>)> = Vec::new();
    let mut out = Vec::with_capacity(n);
    for id in 0..n as u64 {
        let roll = rng.below(100);
        let fresh = |rng: &mut SplitMix64| -> Vec<String> {
            let len = 20 + rng.below(41);
            (0..len).map(|_| vocab.word(rng)).collect()
        };
        if originals.is_empty() || roll < 55 {
            let words = fresh(&mut rng);
            let text = render(&words, &mut rng, false);
            originals.push((id, words));
            out.push(CorpusRecord {
                id,
                text,
                kind: CorpusKind::Original,
                source: None,
            });
            continue;
        }
        let (src_id, src) = &originals[rng.below(originals.len())];
        let (text, kind) = if roll < 85 {
            let mut w = src.clone();
            let edits = 1 + rng.below(1 + w.len() / 25);
            for _ in 0..edits {
                let pos = rng.below(w.len());
                match rng.below(5) {
                    0 | 1 => w[pos] = vocab.word(&mut rng),
                    2 => w.insert(pos, vocab.word(&mut rng)),
                    3 => {
                        w.remove(pos);
                    }
                    _ => {
                        let cut = 1 + rng.below((w.len() / 10).max(1));
                        w.truncate(w.len() - cut);
                    }
                }
            }
            let messy = rng.chance(0.5);
            (
                render(&w, &mut rng, messy),
                CorpusKind::NearDuplicate { edits: edits as u8 },
            )
        } else if roll < 90 {
            (render(src, &mut rng, true), CorpusKind::FormatVariant)
        } else {
            let keep = src.len() * (4 + rng.below(3)) / 10;
            let mut w: Vec<String> = src[..keep].to_vec();
            let extra = fresh(&mut rng);
            w.extend(extra.into_iter().take(src.len() - keep));
            (render(&w, &mut rng, false), CorpusKind::HardNegative)
        };
        out.push(CorpusRecord {
            id,
            text,
            kind,
            source: Some(*src_id),
        });
    }
    out
}
