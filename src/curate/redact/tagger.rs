//! A small learned sequence tagger for person names and addresses, for the scripts and layouts
//! the rules were never written for.
//!
//! Units are the redactor's tokens, with runs of scripts written without spaces (Han, kana,
//! Thai, Lao) cut into one unit per character. Each unit is a bag of [`FEATURES`] hashed
//! features (folded word, affixes, character trigrams, shape, script, gazetteer bits), summed
//! from one embedding table; two width-3 convolutions and a linear layer give BIO tags over
//! PERSON and ADDRESS. The forward pass is plain f32 loops: at these widths a call into a tensor
//! library costs more than the arithmetic.
//!
//! Only units near a *trigger* (a word outside the Latin script: capitalised, or in a script
//! without case) are tagged, and only triggers no rule span holds count; Latin-script text
//! costs a scan of its tokens.
//!
//! Weights: `data/tagger.safetensors` (f16), trained by `examples/train_pii_tagger.rs` on
//! `scripts/gen_pii_tagger.py`'s data; see docs/redact-tagger.md.

use std::sync::LazyLock;

use super::lexicon::{self, Kind, Tok};

/// Hashed features per unit (unused slots point at bucket 0, which is trained like any other).
pub const FEATURES: usize = 12;
/// BIO tags: O, B-PERSON, I-PERSON, B-ADDRESS, I-ADDRESS.
pub const TAGS: usize = 5;
/// Units tagged on each side of a trigger.
const REACH: usize = 3;
/// Receptive field of the two width-3 convolutions, on each side.
const FIELD: usize = 2;

/// One unit: byte range in the text and its feature buckets.
#[derive(Debug, Clone)]
pub struct Unit {
    /// Start byte.
    pub start: usize,
    /// End byte (exclusive).
    pub end: usize,
    /// Index of its token (several units share one in no-space scripts).
    pub tok: u32,
    /// Feature buckets, each `< buckets`.
    pub feats: [u32; FEATURES],
    /// Inside a sentinel: never tagged.
    pub sentinel: bool,
    /// Punctuation: may sit inside a span, never ends one.
    pub punct: bool,
    /// Weak evidence alone: punctuation, a number, a short all-caps ASCII word (`IBAN`,
    /// `CA`), or a common word of the shipped vocabulary that is no known first or last name.
    /// A span of only weak units is not reported.
    pub weak: bool,
}

/// Script classes (a feature; also decides which runs are cut per character).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Script {
    Latin,
    Greek,
    Cyrillic,
    Armenian,
    Hebrew,
    Arabic,
    Devanagari,
    Bengali,
    OtherIndic,
    Thai,
    Lao,
    Georgian,
    Hangul,
    Kana,
    Han,
    Ethiopic,
    Digit,
    Other,
}

fn script(c: char) -> Script {
    let u = c as u32;
    match u {
        0x30..=0x39 => Script::Digit,
        0..=0x24F | 0x1E00..=0x1EFF => Script::Latin,
        0x370..=0x3FF | 0x1F00..=0x1FFF => Script::Greek,
        0x400..=0x52F => Script::Cyrillic,
        0x530..=0x58F => Script::Armenian,
        0x590..=0x5FF => Script::Hebrew,
        0x600..=0x6FF | 0x750..=0x77F | 0xFB50..=0xFDFF | 0xFE70..=0xFEFF => Script::Arabic,
        0x900..=0x97F => Script::Devanagari,
        0x980..=0x9FF => Script::Bengali,
        0xA00..=0xDFF => Script::OtherIndic,
        0xE00..=0xE7F => Script::Thai,
        0xE80..=0xEFF => Script::Lao,
        0x10A0..=0x10FF | 0x1C90..=0x1CBF => Script::Georgian,
        0x1100..=0x11FF | 0x3130..=0x318F | 0xAC00..=0xD7AF => Script::Hangul,
        0x3040..=0x30FF | 0x31F0..=0x31FF | 0xFF66..=0xFF9F => Script::Kana,
        0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x2FFFF => Script::Han,
        0x1200..=0x139F => Script::Ethiopic,
        _ => Script::Other,
    }
}

/// Scripts written without spaces between words: one unit per character.
fn no_space(s: Script) -> bool {
    matches!(s, Script::Han | Script::Kana | Script::Thai | Script::Lao)
}

/// Scripts without letter case: every word is a trigger.
fn caseless(s: Script) -> bool {
    !matches!(
        s,
        Script::Latin | Script::Greek | Script::Cyrillic | Script::Armenian | Script::Digit
    )
}

/// FNV-1a over a feature kind and bytes, folded into `buckets` (a power of two). Bucket 0 is
/// left for empty slots.
fn bucket(kind: u8, bytes: &[u8], buckets: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(kind);
    h = h.wrapping_mul(0x100_0000_01b3);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h ^= h >> 29;
    1 + (h as u32) % (buckets - 1)
}

/// Gazetteer bits that are features (the rules' word lists are evidence, not a verdict).
const LEX_BITS: u32 = lexicon::IN_FIRST
    | lexicon::IN_LAST
    | lexicon::IN_COMMON
    | lexicon::IN_PLACES
    | lexicon::C_TITLE
    | lexicon::C_ORG
    | lexicon::C_STRONG_SUFFIX
    | lexicon::C_WEAK_SUFFIX
    | lexicon::C_PREFIX_TYPE
    | lexicon::C_POST_TYPE
    | lexicon::C_UNIT
    | lexicon::C_NAME_PARTICLE
    | lexicon::C_HEADER
    | lexicon::C_PERSON_FIELD;

/// Whether a token wakes the tagger: a word outside the Latin script, in a script without
/// case or capitalised and not a plain common word. Latin-script text is left to the rules:
/// there the tagger added as many false spans on unseen layouts as it found missed ones.
fn is_trigger(text: &str, t: &Tok) -> bool {
    if t.kind != Kind::Word || t.sentinel {
        return false;
    }
    let sc = script(text[t.s..].chars().next().unwrap_or(' '));
    sc != Script::Latin && (caseless(sc) || (t.cap && !is_plain(t)))
}

/// A common word of the shipped vocabulary that is no known first or last name.
fn is_plain(t: &Tok) -> bool {
    t.kind == Kind::Word && t.is(lexicon::IN_COMMON) && !t.is(lexicon::IN_FIRST | lexicon::IN_LAST)
}

/// Units of `text` from its tokens, with features hashed into `buckets`. `at_start`: the
/// first token starts the text (so it starts a line).
pub(crate) fn units(text: &str, toks: &[Tok], buckets: u32, at_start: bool) -> Vec<Unit> {
    let mut out = Vec::with_capacity(toks.len() + 4);
    let mut line_start = at_start;
    for (ti, t) in toks.iter().enumerate() {
        let word = &text[t.s..t.e];
        let first = word.chars().next().unwrap_or(' ');
        let sc = script(first);
        if t.kind == Kind::Word
            && !t.sentinel
            && !word.is_ascii()
            && word.chars().any(|c| no_space(script(c)))
        {
            split_no_space(text, t, ti as u32, buckets, &mut out);
            line_start = false;
            continue;
        }
        let mut f = [0u32; FEATURES];
        let nl = t.nl_before || line_start;
        line_start = false;
        let flags = [
            t.kind as u8,
            sc as u8,
            u8::from(t.cap),
            u8::from(t.all_caps),
            u8::from(nl),
            u8::from(t.sp_before),
            (word.len().min(12)) as u8,
        ];
        f[0] = bucket(1, &flags, buckets);
        if t.sentinel {
            f[1] = bucket(2, word.as_bytes(), buckets);
        } else {
            match t.kind {
                Kind::Word => {
                    let key: &str = &t.key;
                    let kb = key.as_bytes();
                    f[1] = bucket(3, kb, buckets);
                    f[2] = bucket(4, &(t.cls & LEX_BITS).to_le_bytes(), buckets);
                    let cased = [u8::from(caseless(sc)), u8::from(t.cap), u8::from(nl)];
                    f[3] = bucket(5, &cased, buckets);
                    // byte offset of each char of the key, and the end
                    let mut at: smallvec::SmallVec<[usize; 24]> =
                        key.char_indices().map(|(i, _)| i).collect();
                    let n = at.len();
                    at.push(kb.len());
                    f[4] = bucket(6, &kb[..at[n.min(2)]], buckets);
                    f[5] = bucket(7, &kb[..at[n.min(3)]], buckets);
                    f[6] = bucket(8, &kb[at[n.saturating_sub(2)]..], buckets);
                    f[7] = bucket(9, &kb[at[n.saturating_sub(3)]..], buckets);
                    // trigrams spread over the word (at most four)
                    if n > 3 {
                        let grams = n - 2;
                        for (k, slot) in (8..FEATURES).enumerate() {
                            let i = k * grams / 4;
                            if k > 0 && i == (k - 1) * grams / 4 {
                                continue;
                            }
                            f[slot] = bucket(10, &kb[at[i]..at[i + 3]], buckets);
                        }
                    }
                }
                Kind::Num => {
                    let mut shape = [0u8; 10];
                    let mut len = 0;
                    for c in word.chars().take(10) {
                        shape[len] = if c.is_ascii_digit() {
                            b'd'
                        } else if c.is_alphabetic() {
                            b'a'
                        } else {
                            b'-'
                        };
                        len += 1;
                    }
                    f[1] = bucket(11, &shape[..len], buckets);
                }
                Kind::Punct => {
                    f[1] = bucket(12, word.as_bytes(), buckets);
                }
            }
        }
        out.push(Unit {
            start: t.s,
            end: t.e,
            tok: ti as u32,
            feats: f,
            sentinel: t.sentinel,
            punct: t.kind == Kind::Punct,
            weak: t.kind != Kind::Word
                || is_plain(t)
                || (t.all_caps && word.is_ascii() && word.len() <= 5),
        });
    }
    out
}

/// One unit per character of the no-space scripts inside a word token; other runs stay whole.
fn split_no_space(text: &str, t: &Tok, ti: u32, buckets: u32, out: &mut Vec<Unit>) {
    let word = &text[t.s..t.e];
    let chars: Vec<(usize, char)> = word.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        let (off, c) = chars[i];
        let sc = script(c);
        let mut j = i + 1;
        if !no_space(sc) {
            while j < chars.len() && !no_space(script(chars[j].1)) {
                j += 1;
            }
        }
        let end = if j < chars.len() {
            chars[j].0
        } else {
            word.len()
        };
        let s = t.s + off;
        let e = t.s + end;
        let mut f = [0u32; FEATURES];
        let flags = [
            Kind::Word as u8,
            sc as u8,
            u8::from(i == 0 && t.nl_before),
            u8::from(i == 0 && t.sp_before),
            (e - s).min(12) as u8,
        ];
        f[0] = bucket(1, &flags, buckets);
        f[1] = bucket(3, &text.as_bytes()[s..e], buckets);
        let prev = if i > 0 { chars[i - 1].0 } else { off };
        let next_end = if j + 1 < chars.len() {
            chars[j + 1].0
        } else {
            word.len()
        };
        f[2] = bucket(13, &word.as_bytes()[prev..end], buckets);
        f[3] = bucket(14, &word.as_bytes()[off..next_end], buckets);
        f[4] = bucket(15, &[u8::from(i == 0), u8::from(j == chars.len())], buckets);
        out.push(Unit {
            start: s,
            end: e,
            tok: ti,
            feats: f,
            sentinel: false,
            punct: false,
            weak: false,
        });
        i = j;
    }
}

/// Errors loading tagger weights.
#[derive(Debug, thiserror::Error)]
pub enum TaggerError {
    /// The file is not valid safetensors.
    #[error("tagger weights: {0}")]
    Format(#[from] safetensors::SafeTensorError),
    /// A tensor is missing or has the wrong shape or type.
    #[error("tagger weights: tensor `{name}`: {reason}")]
    Tensor {
        /// Tensor name.
        name: &'static str,
        /// What was wrong.
        reason: String,
    },
}

/// The tagger's weights, f32, laid out for the forward pass.
#[derive(Debug, Clone)]
pub struct TaggerWeights {
    /// Hash buckets (rows of `emb`).
    pub buckets: u32,
    /// Embedding width.
    pub dim: usize,
    /// Hidden width.
    pub hidden: usize,
    emb: Vec<f32>,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
    wo: Vec<f32>,
    bo: Vec<f32>,
}

/// Tensor names and layouts in the safetensors file: `emb` [buckets, dim], `w1` [3·dim, hidden]
/// (previous, own, next unit), `b1` [hidden], `w2` [3·hidden, hidden], `b2` [hidden], `wo`
/// [hidden, 5], `bo` [5]; f16 or f32.
impl TaggerWeights {
    /// Parses a safetensors buffer.
    pub fn from_safetensors(bytes: &[u8]) -> Result<Self, TaggerError> {
        let st = safetensors::SafeTensors::deserialize(bytes)?;
        let get = |name: &'static str| -> Result<(Vec<usize>, Vec<f32>), TaggerError> {
            let t = st.tensor(name).map_err(|e| TaggerError::Tensor {
                name,
                reason: e.to_string(),
            })?;
            let data = t.data();
            let v: Vec<f32> = match t.dtype() {
                safetensors::Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                safetensors::Dtype::F16 => data
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                d => {
                    return Err(TaggerError::Tensor {
                        name,
                        reason: format!("dtype {d:?}, want F16 or F32"),
                    });
                }
            };
            Ok((t.shape().to_vec(), v))
        };
        let (es, emb) = get("emb")?;
        let (w1s, w1) = get("w1")?;
        let (_, b1) = get("b1")?;
        let (w2s, w2) = get("w2")?;
        let (_, b2) = get("b2")?;
        let (wos, wo) = get("wo")?;
        let (_, bo) = get("bo")?;
        let bad = |name: &'static str, reason: String| TaggerError::Tensor { name, reason };
        if es.len() != 2 || !es[0].is_power_of_two() || es[0] < 2 {
            return Err(bad("emb", format!("shape {es:?}, want [2^k, dim]")));
        }
        let (buckets, dim) = (es[0], es[1]);
        if w1s != [3 * dim, w1s.get(1).copied().unwrap_or(0)] {
            return Err(bad("w1", format!("shape {w1s:?}, want [3*{dim}, hidden]")));
        }
        let hidden = w1s[1];
        if b1.len() != hidden {
            return Err(bad("b1", format!("{} values, want {hidden}", b1.len())));
        }
        if w2s != [3 * hidden, hidden] {
            return Err(bad(
                "w2",
                format!("shape {w2s:?}, want [{}, {hidden}]", 3 * hidden),
            ));
        }
        if b2.len() != hidden {
            return Err(bad("b2", format!("{} values, want {hidden}", b2.len())));
        }
        if wos != [hidden, TAGS] || bo.len() != TAGS {
            return Err(bad("wo", format!("shape {wos:?}, want [{hidden}, {TAGS}]")));
        }
        Ok(Self {
            buckets: buckets as u32,
            dim,
            hidden,
            emb,
            w1,
            b1,
            w2,
            b2,
            wo,
            bo,
        })
    }
}

/// The shipped weights.
static SHIPPED: LazyLock<TaggerWeights> = LazyLock::new(|| {
    TaggerWeights::from_safetensors(include_bytes!("data/tagger.safetensors"))
        // compiled-in constant, checked by a unit test
        .expect("shipped tagger weights are valid")
});

/// The shipped weights (parsed once).
pub fn shipped() -> &'static TaggerWeights {
    &SHIPPED
}

/// A tagged span: byte range, PERSON (`false`) or ADDRESS (`true`), mean tag probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TagSpan {
    pub start: usize,
    pub end: usize,
    pub address: bool,
    pub confidence: f32,
}

/// `out += x · W` for a row-major `W` [x.len(), out.len()].
#[inline]
fn axpy_rows(x: &[f32], w: &[f32], out: &mut [f32]) {
    let h = out.len();
    for (i, &xi) in x.iter().enumerate() {
        if xi == 0.0 {
            continue;
        }
        let row = &w[i * h..(i + 1) * h];
        for (o, &wv) in out.iter_mut().zip(row) {
            *o += xi * wv;
        }
    }
}

impl TaggerWeights {
    /// Tag probabilities for every unit of `units[a..b]` (as if the sequence were only that
    /// stretch, zero-padded), written to `probs` (`TAGS` per unit).
    fn forward(&self, units: &[Unit], probs: &mut Vec<f32>) {
        let n = units.len();
        let (d, h) = (self.dim, self.hidden);
        let mut x = vec![0f32; (n + 2) * d];
        for (i, u) in units.iter().enumerate() {
            let row = &mut x[(i + 1) * d..(i + 2) * d];
            for &f in &u.feats {
                let e = &self.emb[f as usize * d..(f as usize + 1) * d];
                for (r, v) in row.iter_mut().zip(e) {
                    *r += v;
                }
            }
        }
        let conv = |input: &[f32], w: &[f32], b: &[f32], k: usize| -> Vec<f32> {
            let mut y = vec![0f32; (n + 2) * h];
            for i in 0..n {
                let out = &mut y[(i + 1) * h..(i + 2) * h];
                out.copy_from_slice(b);
                // previous, own and next rows are contiguous in the padded input
                axpy_rows(&input[i * k..(i + 3) * k], w, out);
                for v in out.iter_mut() {
                    *v = v.max(0.0);
                }
            }
            y
        };
        let y1 = conv(&x, &self.w1, &self.b1, d);
        let y2 = conv(&y1, &self.w2, &self.b2, h);
        probs.clear();
        probs.reserve(n * TAGS);
        for i in 0..n {
            let mut logits = [0f32; TAGS];
            logits.copy_from_slice(&self.bo);
            axpy_rows(&y2[(i + 1) * h..(i + 2) * h], &self.wo, &mut logits);
            let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut z = 0.0;
            for l in logits.iter_mut() {
                *l = (*l - m).exp();
                z += *l;
            }
            probs.extend(logits.iter().map(|l| l / z));
        }
    }

    /// Tag probabilities for a whole unit sequence (training checks and tests).
    pub fn tag_probs(&self, units: &[Unit]) -> Vec<f32> {
        let mut p = Vec::new();
        self.forward(units, &mut p);
        p
    }

    /// PERSON and ADDRESS spans in `text`, tagging only the tokens within [`REACH`] of a
    /// trigger. `rescan`: `text` is a redacted text whose spans (sentinels) were already
    /// tagged around; only triggers near a sentinel count, since elsewhere the units and so the
    /// tags are those of the first pass. `held`: byte ranges other detectors found (sorted by
    /// start); a trigger inside one wakes nothing.
    pub(crate) fn spans(
        &self,
        text: &str,
        toks: &[Tok],
        rescan: bool,
        held: &[(usize, usize)],
    ) -> Vec<TagSpan> {
        let n = toks.len();
        let mut core = vec![false; n];
        let mut any = false;
        // sentinel tokens before each index (rescans only)
        let sentinels_before: Vec<u32> = if rescan {
            let mut acc = 0;
            let mut v = Vec::with_capacity(n + 1);
            v.push(0);
            for t in toks {
                acc += u32::from(t.sentinel);
                v.push(acc);
            }
            v
        } else {
            Vec::new()
        };
        let near = REACH + FIELD + 1;
        let mut h = 0;
        for (i, t) in toks.iter().enumerate() {
            if !is_trigger(text, t) {
                continue;
            }
            // held ranges ending before this token can never hold a later one
            while h < held.len() && held[h].1 <= t.s {
                h += 1;
            }
            if held[h..]
                .iter()
                .take_while(|r| r.0 <= t.s)
                .any(|r| r.1 >= t.e)
            {
                continue;
            }
            if rescan
                && sentinels_before[(i + near + 1).min(n)]
                    == sentinels_before[i.saturating_sub(near)]
            {
                continue;
            }
            any = true;
            for c in &mut core[i.saturating_sub(REACH)..(i + REACH + 1).min(n)] {
                *c = true;
            }
        }
        let mut out = Vec::new();
        if !any {
            return out;
        }
        let mut probs = Vec::new();
        let mut i = 0;
        while i < n {
            if !core[i] {
                i += 1;
                continue;
            }
            // a run of core tokens, joined with the next when their margins would touch
            let first = i;
            let mut last = i;
            let mut j = i;
            while j < n && j <= last + 2 * FIELD + 1 {
                if core[j] {
                    last = j;
                }
                j += 1;
            }
            let a = first.saturating_sub(FIELD);
            let b = (last + FIELD + 1).min(n);
            let units = units(text, &toks[a..b], self.buckets, a == 0);
            self.forward(&units, &mut probs);
            let mut tags = vec![0u8; units.len()];
            let mut conf = vec![0f32; units.len()];
            for (k, u) in units.iter().enumerate() {
                if !core[a + u.tok as usize] {
                    continue;
                }
                let p = &probs[k * TAGS..(k + 1) * TAGS];
                let (best, pb) = p
                    .iter()
                    .enumerate()
                    .fold((0, f32::MIN), |m, (t, &v)| if v > m.1 { (t, v) } else { m });
                tags[k] = best as u8;
                conf[k] = pb;
            }
            out.extend(decode(&units, &tags, &conf));
            i = last + 1;
        }
        out
    }
}

/// BIO tags to spans: an I- after another type or O starts a span as B- would. A span ends
/// on its last non-punctuation unit (a closing comma or bracket is context, not PII).
fn decode(units: &[Unit], tags: &[u8], conf: &[f32]) -> Vec<TagSpan> {
    struct Open {
        start: usize,
        end: usize,
        address: bool,
        sum: f32,
        k: usize,
        /// Some unit is not weak.
        telling: bool,
    }
    let mut out: Vec<TagSpan> = Vec::new();
    let mut cur: Option<Open> = None;
    let close = |c: Option<Open>, out: &mut Vec<TagSpan>| {
        if let Some(o) = c.filter(|o| o.end > o.start && o.telling) {
            out.push(TagSpan {
                start: o.start,
                end: o.end,
                address: o.address,
                confidence: o.sum / o.k as f32,
            });
        }
    };
    for (i, u) in units.iter().enumerate() {
        let t = if u.sentinel { 0 } else { tags[i] };
        if t == 0 {
            close(cur.take(), &mut out);
            continue;
        }
        let address = t >= 3;
        let begin = t == 1 || t == 3;
        match &mut cur {
            Some(o) if o.address == address && !begin => {
                if !u.punct {
                    o.end = u.end;
                }
                o.telling |= !u.weak;
                o.sum += conf[i];
                o.k += 1;
            }
            _ => {
                close(cur.take(), &mut out);
                if !u.punct {
                    cur = Some(Open {
                        start: u.start,
                        end: u.end,
                        address,
                        sum: conf[i],
                        k: 1,
                        telling: !u.weak,
                    });
                }
            }
        }
    }
    close(cur, &mut out);
    out
}

/// Units of `text` as the tagger sees them (training uses the same features as inference).
pub fn training_units(text: &str, buckets: u32) -> Vec<Unit> {
    let toks = lexicon::tokenize(text);
    units(text, &toks, buckets, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_weights_parse() {
        let w = shipped();
        assert!(w.buckets.is_power_of_two());
        assert_eq!(w.emb.len(), w.buckets as usize * w.dim);
    }

    #[test]
    fn no_space_scripts_are_cut_per_character() {
        let u = training_units("我叫王秀英 ok", 1 << 10);
        assert_eq!(u.len(), 6);
        assert!(u.iter().all(|u| u.feats.iter().all(|&f| f < 1 << 10)));
    }
}
