//! Byte-level BPE (GPT-2 style) loaded from GGUF metadata.
//!
//! SmolLM2 and Qwen GGUFs carry `tokenizer.ggml.model = "gpt2"` with the vocabulary, ranked merges
//! and token types, which is all byte-level BPE needs; this avoids the heavy `tokenizers` crate.
//! Encoding is lossless by construction (every byte has a token), so `decode(encode(s)) == s`.
//! The pre-tokenizer follows `tokenizer.ggml.pre` (gpt2, smollm, qwen2, llama-bpe); ids match the
//! reference tokenizer only as far as this split matches its regex.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::gguf::{md_get, md_int_array, md_str, md_str_array};
use super::{ModelError, Result};

/// GPT-2's reversible byte → printable char map.
fn bytes_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable =
            (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        map[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(256 + n).expect("256..512 are valid chars");
            n += 1;
            c
        };
    }
    map
}

/// Pre-tokenizer flavour, from `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2 regex.
    Gpt2,
    /// GPT-2 regex after splitting every digit on its own (SmolLM2).
    SmolLm,
    /// Qwen2/Qwen3 regex (single digits).
    Qwen2,
    /// Llama-3 regex (like Qwen2 but digits in runs of up to 3).
    LlamaBpe,
}

impl PreTokenizer {
    fn from_name(s: &str) -> Self {
        match s {
            "smollm" => PreTokenizer::SmolLm,
            "qwen2" | "qwen3" => PreTokenizer::Qwen2,
            "llama-bpe" | "llama3" | "smaug-bpe" => PreTokenizer::LlamaBpe,
            _ => PreTokenizer::Gpt2,
        }
    }
}

/// Byte-level BPE tokenizer.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    /// Merge rank and merged token of each mergeable pair of tokens. A merge whose parts or
    /// result are not in the vocabulary cannot produce a token, and is left out (Hugging Face
    /// refuses such a vocabulary).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Control / user-defined tokens matched verbatim (longest first) when specials are allowed.
    specials: Vec<(String, u32)>,
    is_special: Vec<bool>,
    /// Token of each byte's mapped char (`None`: the vocabulary lacks it), looked up once here
    /// instead of once per byte encoded.
    byte_ids: [Option<u32>; 256],
    byte_dec: HashMap<char, u8>,
    pre: PreTokenizer,
    /// Prefix a space to text that does not start with whitespace (`tokenizer.ggml.add_space_prefix`,
    /// Hugging Face's ByteLevel `add_prefix_space`); off for SmolLM2 and Qwen.
    pub add_space_prefix: bool,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// End of turn (`tokenizer.ggml.eot_token_id`; Llama 3's `<|eot_id|>`): generation stops on it as on EOS.
    pub eot_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// Prompts start with BOS (`tokenizer.ggml.add_bos_token`; Llama 3 sets it). Off when the key is absent, as
    /// for byte-level BPE vocabularies in llama.cpp.
    pub add_bos: bool,
    /// How conversations become prompts: the file's `tokenizer.chat_template`, or the template of the family
    /// whose turn markers the vocabulary has (`None` when neither).
    chat: Option<super::chat::ChatTemplate>,
}

fn tok_err(msg: impl Into<String>) -> ModelError {
    ModelError::Tokenizer(msg.into())
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata (`tokenizer.ggml.*`).
    pub fn from_gguf_metadata(md: &HashMap<String, Value>) -> Result<Self> {
        let model = md_str(md, "tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(tok_err(format!(
                "tokenizer.ggml.model = {model}; only byte-level BPE (gpt2) is supported"
            )));
        }
        let tokens: Vec<String> = md_str_array(md, "tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        let merges = md_str_array(md, "tokenizer.ggml.merges")?;
        let types = match md_get(md, "tokenizer.ggml.token_type") {
            Ok(_) => Some(md_int_array(md, "tokenizer.ggml.token_type")?),
            Err(_) => None,
        };
        let pre = md_str(md, "tokenizer.ggml.pre")
            .map(PreTokenizer::from_name)
            .unwrap_or(PreTokenizer::Gpt2);
        let id = |k: &str| -> Result<Option<u32>> {
            match md.get(k) {
                None => Ok(None),
                Some(Value::U32(v)) => Ok(Some(*v)),
                Some(Value::I32(v)) if *v >= 0 => Ok(Some(*v as u32)),
                Some(Value::U64(v)) => Ok(u32::try_from(*v).ok()),
                Some(v) => Err(ModelError::BadKey {
                    key: k.into(),
                    reason: format!("expected a token id, found {:?}", v.value_type()),
                }),
            }
        };
        let mut t = Self::new(tokens, &merges, types.as_deref(), pre)?;
        t.bos_id = id("tokenizer.ggml.bos_token_id")?;
        t.eos_id = id("tokenizer.ggml.eos_token_id")?;
        t.eot_id = id("tokenizer.ggml.eot_token_id")?;
        t.pad_id = id("tokenizer.ggml.padding_token_id")?;
        t.add_bos = match md.get("tokenizer.ggml.add_bos_token") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(ModelError::BadKey {
                    key: "tokenizer.ggml.add_bos_token".into(),
                    reason: format!("expected a bool, found {:?}", v.value_type()),
                });
            }
        };
        t.add_space_prefix = matches!(
            md.get("tokenizer.ggml.add_space_prefix"),
            Some(Value::Bool(true))
        );
        if let Some(v) = md.get("tokenizer.chat_template") {
            let Value::String(src) = v else {
                return Err(ModelError::BadKey {
                    key: "tokenizer.chat_template".into(),
                    reason: format!("expected a string, found {:?}", v.value_type()),
                });
            };
            t.chat = Some(super::chat::ChatTemplate::new(src)?);
        }
        if t.add_bos && t.bos_id.is_none() {
            return Err(tok_err("add_bos_token is set but there is no bos_token_id"));
        }
        for (k, v) in [
            ("bos", t.bos_id),
            ("eos", t.eos_id),
            ("eot", t.eot_id),
            ("pad", t.pad_id),
        ] {
            if let Some(v) = v
                && v as usize >= t.tokens.len()
            {
                return Err(tok_err(format!("{k} id {v} out of range")));
            }
        }
        Ok(t)
    }

    /// Builds from parts. `types` uses GGUF token types (3 = control, 4 = user-defined are
    /// special); without types, `<|…|>` tokens are treated as special.
    pub fn new(
        tokens: Vec<String>,
        merges: &[&str],
        types: Option<&[i64]>,
        pre: PreTokenizer,
    ) -> Result<Self> {
        if let Some(ty) = types
            && ty.len() != tokens.len()
        {
            return Err(tok_err(format!(
                "{} token types for {} tokens",
                ty.len(),
                tokens.len()
            )));
        }
        let mut ids = HashMap::with_capacity(tokens.len());
        let mut is_special = vec![false; tokens.len()];
        let mut specials = Vec::new();
        for (i, tok) in tokens.iter().enumerate() {
            ids.entry(tok.clone()).or_insert(i as u32);
            let special = match types {
                Some(ty) => ty[i] == 3 || ty[i] == 4,
                None => tok.starts_with("<|") && tok.ends_with("|>") && tok.len() > 4,
            };
            if special && !tok.is_empty() {
                is_special[i] = true;
                specials.push((tok.clone(), i as u32));
            }
        }
        specials.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        let mut merge_ids = HashMap::with_capacity(merges.len());
        for (r, m) in merges.iter().enumerate() {
            let (a, b) = m
                .split_once(' ')
                .ok_or_else(|| tok_err(format!("merge {r} `{m}` is not `left right`")))?;
            if let (Some(&a_id), Some(&b_id), Some(&ab_id)) =
                (ids.get(a), ids.get(b), ids.get(format!("{a}{b}").as_str()))
            {
                merge_ids.entry((a_id, b_id)).or_insert((r as u32, ab_id));
            }
        }
        let byte_enc = bytes_to_unicode();
        let byte_dec = byte_enc
            .iter()
            .enumerate()
            .map(|(b, c)| (*c, b as u8))
            .collect();
        // Real vocabularies omit some control bytes (SmolLM2 has no token for 0x04), so only the
        // printable ASCII bytes are required; a byte without a token is dropped when encoding, as
        // Hugging Face's BPE (without byte fallback) does.
        let byte_ids = byte_enc.map(|c| ids.get(c.to_string().as_str()).copied());
        for b in b'!'..=b'~' {
            if byte_ids[b as usize].is_none() {
                let c = byte_enc[b as usize];
                return Err(tok_err(format!(
                    "byte token `{c}` missing: not a byte-level vocabulary"
                )));
            }
        }
        Ok(Self {
            tokens,
            ids,
            merges: merge_ids,
            specials,
            is_special,
            byte_ids,
            byte_dec,
            pre,
            add_space_prefix: false,
            bos_id: None,
            eos_id: None,
            eot_id: None,
            pad_id: None,
            add_bos: false,
            chat: None,
        })
        .map(|mut t: Self| {
            t.chat = super::chat::ChatTemplate::fallback(&t);
            t
        })
    }

    /// The chat template conversations are rendered with (see [`super::chat`]).
    pub fn chat_template(&self) -> Option<&super::chat::ChatTemplate> {
        self.chat.as_ref()
    }

    /// Replaces the chat template.
    pub fn set_chat_template(&mut self, template: super::chat::ChatTemplate) {
        self.chat = Some(template);
    }

    /// The BOS token's text (`bos_token` in chat templates), empty without one.
    pub fn bos_text(&self) -> String {
        self.special_text(self.bos_id)
    }

    /// The EOS token's text (`eos_token` in chat templates), empty without one.
    pub fn eos_text(&self) -> String {
        self.special_text(self.eos_id)
    }

    fn special_text(&self, id: Option<u32>) -> String {
        id.and_then(|i| self.tokens.get(i as usize))
            .cloned()
            .unwrap_or_default()
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// `text` as a prompt: BOS first where the model asks for it (see [`Self::add_bos`]), then
    /// [`Self::encode`]'s ids.
    pub fn encode_prompt(&self, text: &str, allow_special: bool) -> Result<Vec<u32>> {
        let mut ids = self.bos_prefix();
        ids.extend(self.encode(text, allow_special)?);
        Ok(ids)
    }

    /// `[bos]` when prompts start with BOS, else empty.
    pub fn bos_prefix(&self) -> Vec<u32> {
        self.bos_id.filter(|_| self.add_bos).into_iter().collect()
    }

    /// Id of an exact token string (e.g. `<|im_start|>`).
    pub fn token_id(&self, tok: &str) -> Option<u32> {
        self.ids.get(tok).copied()
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.is_special.get(id as usize).copied().unwrap_or(false)
    }

    /// Encodes text. With `allow_special`, occurrences of special tokens become their ids;
    /// without, they are encoded as plain text — use that for untrusted content so users cannot
    /// inject `<|im_start|>` into a chat.
    pub fn encode(&self, text: &str, allow_special: bool) -> Result<Vec<u32>> {
        let spaced;
        let text = if self.add_space_prefix
            && !text.is_empty()
            && !text.starts_with(char::is_whitespace)
        {
            spaced = format!(" {text}");
            spaced.as_str()
        } else {
            text
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        if !allow_special || self.specials.is_empty() {
            self.encode_plain(text, &mut out)?;
            return Ok(out);
        }
        let mut rest = text;
        while !rest.is_empty() {
            // Earliest special occurrence; longest wins at the same position.
            let mut best: Option<(usize, usize, u32)> = None;
            for (s, id) in &self.specials {
                if let Some(p) = rest.find(s.as_str())
                    && best.is_none_or(|(bp, bl, _)| p < bp || (p == bp && s.len() > bl))
                {
                    best = Some((p, s.len(), *id));
                }
            }
            match best {
                Some((p, l, id)) => {
                    self.encode_plain(&rest[..p], &mut out)?;
                    out.push(id);
                    rest = &rest[p + l..];
                }
                None => {
                    self.encode_plain(rest, &mut out)?;
                    break;
                }
            }
        }
        Ok(out)
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut bpe = Bpe::default();
        for piece in pre_tokenize(text, self.pre) {
            // A byte the vocabulary lacks has no token and is dropped, as Hugging Face's BPE
            // (without byte fallback) does; it merges with nothing.
            let byte_ids = piece.bytes().map(|b| self.byte_ids[b as usize]);
            bpe.run(byte_ids, &self.merges, out);
        }
        Ok(())
    }

    /// Raw bytes of one token (special tokens give their text). Streaming decoders accumulate
    /// these and emit only complete UTF-8.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(tok) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        if self.is_special[id as usize] {
            return tok.as_bytes().to_vec();
        }
        let mut out = Vec::with_capacity(tok.len());
        for c in tok.chars() {
            match self.byte_dec.get(&c) {
                Some(b) => out.push(*b),
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        out
    }

    /// Decodes ids to text (invalid UTF-8 from a cut-off sequence becomes U+FFFD). Out-of-range
    /// ids are skipped.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            bytes.extend(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn is_l(c: char) -> bool {
    c.is_alphabetic()
}
fn is_n(c: char) -> bool {
    c.is_numeric()
}
fn is_s(c: char) -> bool {
    c.is_whitespace()
}
fn is_other(c: char) -> bool {
    !is_s(c) && !is_l(c) && !is_n(c)
}

/// Length (in chars) of an English contraction at `i` (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`).
fn contraction(ch: &[char], i: usize, case_insensitive: bool) -> Option<usize> {
    if ch.get(i) != Some(&'\'') {
        return None;
    }
    let low = |k: usize| {
        ch.get(i + k).map(|c| {
            if case_insensitive {
                c.to_ascii_lowercase()
            } else {
                *c
            }
        })
    };
    match (low(1), low(2)) {
        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => Some(3),
        (Some('s' | 't' | 'm' | 'd'), _) => Some(2),
        _ => None,
    }
}

/// One piece's byte-pair merging, in O(n log n): the lowest-ranked adjacent pair merges first,
/// the leftmost of equal ranks first, as Hugging Face's BPE does, with a heap of candidate
/// pairs over a linked list of symbols. (Scanning every pair for the best merge, once per
/// merge, is quadratic on long unbroken runs.) Buffers are kept between pieces.
#[derive(Default)]
struct Bpe {
    /// Token of each symbol (`None`: a byte without one), and its neighbours in the list.
    syms: Vec<(Option<u32>, usize, usize)>,
    alive: Vec<bool>,
    /// (rank, position of the pair's left symbol), smallest first.
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(u32, usize)>>,
}

impl Bpe {
    const NONE: usize = usize::MAX;

    fn run(
        &mut self,
        byte_ids: impl Iterator<Item = Option<u32>>,
        merges: &HashMap<(u32, u32), (u32, u32)>,
        out: &mut Vec<u32>,
    ) {
        self.syms.clear();
        self.alive.clear();
        self.heap.clear();
        for (i, id) in byte_ids.enumerate() {
            // (the first symbol's `prev` wraps to NONE)
            self.syms.push((id, i.wrapping_sub(1), i + 1));
            self.alive.push(true);
        }
        let n = self.syms.len();
        if let Some(last) = self.syms.last_mut() {
            last.2 = Self::NONE;
        }
        let merge_at = |syms: &[(Option<u32>, usize, usize)], i: usize| {
            let (a, _, next) = syms[i];
            if next == Self::NONE {
                return None;
            }
            merges.get(&(a?, syms[next].0?)).copied()
        };
        for i in 0..n.saturating_sub(1) {
            if let Some((rank, _)) = merge_at(&self.syms, i) {
                self.heap.push(std::cmp::Reverse((rank, i)));
            }
        }
        while let Some(std::cmp::Reverse((rank, i))) = self.heap.pop() {
            // Skip an entry that a merge made stale: its left symbol went, or now pairs with
            // another right neighbour.
            if !self.alive[i] {
                continue;
            }
            let Some((now, merged)) = merge_at(&self.syms, i) else {
                continue;
            };
            if now != rank {
                continue;
            }
            let right = self.syms[i].2;
            let after = self.syms[right].2;
            self.alive[right] = false;
            self.syms[i].0 = Some(merged);
            self.syms[i].2 = after;
            if after != Self::NONE {
                self.syms[after].1 = i;
            }
            let prev = self.syms[i].1;
            if prev != Self::NONE
                && let Some((r, _)) = merge_at(&self.syms, prev)
            {
                self.heap.push(std::cmp::Reverse((r, prev)));
            }
            if let Some((r, _)) = merge_at(&self.syms, i) {
                self.heap.push(std::cmp::Reverse((r, i)));
            }
        }
        let mut i = if n == 0 { Self::NONE } else { 0 };
        while i != Self::NONE {
            if let Some(id) = self.syms[i].0 {
                out.push(id);
            }
            i = self.syms[i].2;
        }
    }
}

/// Splits text like the pre-tokenizer regex of `pre`, returning pieces that BPE runs on.
pub fn pre_tokenize(text: &str, pre: PreTokenizer) -> Vec<&str> {
    let ch: Vec<char> = text.chars().collect();
    let mut byte_at = Vec::with_capacity(ch.len() + 1);
    let mut b = 0;
    for c in &ch {
        byte_at.push(b);
        b += c.len_utf8();
    }
    byte_at.push(b);
    let n = ch.len();
    let mut pieces = Vec::new();
    let mut i = 0;
    let qwen = matches!(pre, PreTokenizer::Qwen2 | PreTokenizer::LlamaBpe);
    let lone_digits = matches!(pre, PreTokenizer::SmolLm);
    let run = |mut j: usize, f: &dyn Fn(char) -> bool| {
        while j < n && f(ch[j]) {
            j += 1;
        }
        j
    };
    while i < n {
        let c = ch[i];
        let next = ch.get(i + 1).copied();
        let end = if let Some(l) = contraction(&ch, i, qwen) {
            i + l
        } else if qwen {
            if is_l(c) {
                run(i, &is_l)
            } else if c != '\r' && c != '\n' && !is_n(c) && next.is_some_and(is_l) {
                run(i + 1, &is_l)
            } else if is_n(c) {
                let max = if pre == PreTokenizer::LlamaBpe { 3 } else { 1 };
                let mut j = i;
                while j < n && j - i < max && is_n(ch[j]) {
                    j += 1;
                }
                j
            } else if is_other(c) || (c == ' ' && next.is_some_and(is_other)) {
                let j = run(if c == ' ' { i + 1 } else { i }, &is_other);
                run(j, &|c| c == '\r' || c == '\n')
            } else {
                // Whitespace: `\s*[\r\n]+`, then `\s+(?!\S)`, then `\s+`.
                let j = run(i, &is_s);
                match (i..j).rev().find(|&k| ch[k] == '\r' || ch[k] == '\n') {
                    Some(k) => k + 1,
                    None => ws_end(i, j, n),
                }
            }
        } else {
            let sp = usize::from(c == ' ' && next.is_some_and(|d| !is_s(d)));
            let k = i + sp;
            let d = ch[k];
            if is_l(d) {
                run(k, &is_l)
            } else if is_n(d) {
                if lone_digits {
                    // SmolLM2 isolates digits before the regex: a space before one stands alone
                    // (sp == 1 gives the single space), and each digit is its own piece.
                    i + 1
                } else {
                    run(k, &is_n)
                }
            } else if is_other(d) {
                run(k, &|c| is_other(c))
            } else {
                let j = run(i, &is_s);
                // A digit after the run is a segment boundary in SmolLM2's split.
                if lone_digits && j < n && is_n(ch[j]) {
                    j
                } else {
                    ws_end(i, j, n)
                }
            }
        };
        let end = end.max(i + 1);
        pieces.push(&text[byte_at[i]..byte_at[end]]);
        i = end;
    }
    pieces
}

/// `\s+(?!\S)` then `\s+` for a whitespace run `i..j`: leave the last space to prefix the word
/// that follows.
fn ws_end(i: usize, j: usize, n: usize) -> usize {
    if j == n || j - i == 1 { j } else { j - 1 }
}

const TINY_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// Word merges first; then merges across digits, punctuation and whitespace, so that the
/// pre-tokenizer's boundaries (digit runs, `'ll`, newline runs) change the ids and are tested.
const TINY_MERGES: [&str; 48] = [
    "Ġ t", "h e", "i n", "Ġ a", "e r", "o n", "r e", "a n", "Ġ s", "Ġ w", "o u", "i s", "e n",
    "Ġ o", "l l", "Ġ i", "e s", "a t", "o r", "Ġt he", "Ġ h", "Ġ b", "Ġ m", "Ġ c", "e d", "in g",
    "Ġ f", "l o", "Ġ d", "Ġ p", "Ġ l", "a r", "Ġw h", "Ċ Ċ", "Ġ Ġ", "Ġa n", "1 2", "12 3", "3 4",
    ". .", ".. .", "Ġ 1", "' s", "' ll", "! !", "Ċ Ġ", "Ġ (", "č Ċ",
];

/// A 307-token byte-level vocabulary (256 bytes, 48 merges, 3 ChatML specials) for tiny test
/// models: `(tokens, merges, token_types)`.
pub fn tiny_vocab() -> (Vec<String>, Vec<String>, Vec<i32>) {
    let enc = bytes_to_unicode();
    let mut tokens: Vec<String> = enc.iter().map(|c| c.to_string()).collect();
    let mut types = vec![1; 256];
    for m in TINY_MERGES {
        let (a, b) = m.split_once(' ').expect("static merges have a space");
        tokens.push(format!("{a}{b}"));
        types.push(1);
    }
    for s in TINY_SPECIALS {
        tokens.push(s.to_string());
        types.push(3);
    }
    (
        tokens,
        TINY_MERGES.iter().map(|s| s.to_string()).collect(),
        types,
    )
}

/// Id of a special token in [`tiny_vocab`].
pub fn tiny_special_id(tok: &str) -> Result<usize> {
    TINY_SPECIALS
        .iter()
        .position(|s| *s == tok)
        .map(|p| 256 + TINY_MERGES.len() + p)
        .ok_or_else(|| tok_err(format!("`{tok}` is not a tiny special")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The BPE this module had before [`Bpe`]: every adjacent pair scanned for the best merge,
    /// all its occurrences merged left to right, until none applies; a symbol outside the
    /// vocabulary falls back to its chars' tokens.
    fn by_rounds(t: &Tokenizer, merges: &[String], text: &str) -> Vec<u32> {
        let ranks: HashMap<(String, String), usize> = merges
            .iter()
            .enumerate()
            .rev()
            .filter_map(|(r, m)| m.split_once(' ').map(|(a, b)| ((a.into(), b.into()), r)))
            .collect();
        let enc = bytes_to_unicode();
        let mut out = Vec::new();
        for piece in pre_tokenize(text, t.pre) {
            let mut syms: Vec<String> =
                piece.bytes().map(|b| enc[b as usize].to_string()).collect();
            loop {
                let best = (1..syms.len())
                    .filter_map(|i| ranks.get(&(syms[i - 1].clone(), syms[i].clone())))
                    .min();
                let Some(&r) = best else { break };
                let (a, b) = merges[r].split_once(' ').expect("checked above");
                let mut merged = Vec::new();
                let mut j = 0;
                while j < syms.len() {
                    if j + 1 < syms.len() && syms[j] == a && syms[j + 1] == b {
                        merged.push(format!("{a}{b}"));
                        j += 2;
                    } else {
                        merged.push(syms[j].clone());
                        j += 1;
                    }
                }
                syms = merged;
            }
            for s in syms {
                match t.ids.get(&s) {
                    Some(&id) => out.push(id),
                    None => out.extend(s.chars().filter_map(|c| t.ids.get(&c.to_string()))),
                }
            }
        }
        out
    }

    /// A byte-level vocabulary plus `n` random merges of existing tokens over `a`, `b`, `c`
    /// and the space-marked `Ġa`..., each merge's result a new token (as BPE training makes).
    fn random_vocab(seed: u64, n: usize) -> (Vec<String>, Vec<String>) {
        let mut tokens: Vec<String> = bytes_to_unicode().iter().map(|c| c.to_string()).collect();
        let mut pool: Vec<String> = ["a", "b", "c", "Ġ", "Ġa"].map(String::from).to_vec();
        tokens.push("Ġa".into());
        let mut merges = vec!["Ġ a".to_string()];
        let mut x = seed | 1;
        let mut below = |m: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m as u64) as usize
        };
        while merges.len() < n {
            let (l, r) = (
                pool[below(pool.len())].clone(),
                pool[below(pool.len())].clone(),
            );
            if r.starts_with('Ġ') || merges.contains(&format!("{l} {r}")) {
                continue;
            }
            let joined = format!("{l}{r}");
            merges.push(format!("{l} {r}"));
            if !tokens.contains(&joined) {
                tokens.push(joined.clone());
                pool.push(joined);
            }
        }
        (tokens, merges)
    }

    proptest! {
        /// The heap BPE gives what the pair-scanning one gave, on random vocabularies with
        /// many interacting merges and texts of long unbroken runs.
        #[test]
        fn heap_bpe_equals_merging_by_rounds(
            seed in any::<u64>(),
            merges in 1usize..150,
            text in "[abc ]{0,300}",
        ) {
            let (tokens, merges) = random_vocab(seed, merges);
            let refs: Vec<&str> = merges.iter().map(String::as_str).collect();
            let t = Tokenizer::new(tokens, &refs, None, PreTokenizer::Gpt2).expect("byte-level vocabulary");
            prop_assert_eq!(t.encode(&text, false).expect("encodes"), by_rounds(&t, &merges, &text));
        }
    }
}
