//! The tokenizers GGUF files name in `tokenizer.ggml.model`, built from their metadata (this avoids the heavy
//! `tokenizers` crate):
//!
//! - `gpt2`: byte-level BPE (SmolLM2, Qwen, Llama 3), from the vocabulary, ranked merges and token types.
//!   Encoding is lossless by construction (every byte has a token), so `decode(encode(s)) == s`. The
//!   pre-tokenizer follows `tokenizer.ggml.pre` (gpt2, smollm, qwen2, llama-bpe); ids match the reference
//!   tokenizer only as far as this split matches its regex.
//! - `llama`: SentencePiece BPE (Llama 2, Mistral, Phi-3, Gemma), from the vocabulary, piece scores and token
//!   types, as llama.cpp runs it: spaces become `▁`, a space is prefixed to the text and to each fragment after a
//!   special token (`tokenizer.ggml.add_space_prefix`, on unless the file says otherwise), adjacent pieces merge
//!   highest score first (the leftmost of equal scores), and a character no piece covers falls back to its UTF-8
//!   bytes' `<0xNN>` tokens. Decoding turns `▁` back into spaces, reassembles the bytes and drops the prefixed
//!   space.

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
    /// The names hearth splits text for (`tokenizer.ggml.pre`). `default` (llama.cpp's name where the
    /// converter knew none) gets the GPT-2 split.
    const NAMES: &str =
        "gpt-2, gpt2, phi-2, default, smollm, qwen2, qwen3, llama-bpe, llama3, smaug-bpe";

    /// Another name is an error: its pre-tokenizer splits text otherwise (Qwen 3.5's joins `'all`, Falcon's and
    /// MPT's split ` ½` apart), so its ids would not be the model's, as llama.cpp refuses names it lacks.
    fn from_name(s: &str) -> Result<Self> {
        Ok(match s {
            "gpt-2" | "gpt2" | "phi-2" | "default" => PreTokenizer::Gpt2,
            "smollm" => PreTokenizer::SmolLm,
            "qwen2" | "qwen3" => PreTokenizer::Qwen2,
            "llama-bpe" | "llama3" | "smaug-bpe" => PreTokenizer::LlamaBpe,
            other => {
                return Err(ModelError::BadKey {
                    key: "tokenizer.ggml.pre".into(),
                    reason: format!(
                        "pre-tokenizer `{other}` is not one hearth splits text for ({})",
                        Self::NAMES
                    ),
                });
            }
        })
    }
}

/// GGUF token types (`tokenizer.ggml.token_type`), as llama.cpp and SentencePiece number them.
pub mod token_type {
    pub const NORMAL: i64 = 1;
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
    pub const UNUSED: i64 = 5;
    pub const BYTE: i64 = 6;
}

/// A tokenizer of one of the kinds GGUF files name (see the module docs).
#[derive(Clone, Debug)]
pub struct Tokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    /// Control / user-defined tokens matched verbatim (longest first) when specials are allowed.
    specials: Vec<(String, u32)>,
    is_special: Vec<bool>,
    model: Model,
    /// Byte-level BPE: prefix a space to text that does not start with whitespace (Hugging Face's ByteLevel
    /// `add_prefix_space`); off for SmolLM2 and Qwen. SentencePiece: prefix a space to the text and to each
    /// fragment after a special token, whatever it starts with, as llama.cpp does (Hugging Face's legacy Llama
    /// tokenizer too); on for Llama 2, Mistral and Phi-3, off for Gemma. From `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: bool,
    /// `tokenizer.ggml.unknown_token_id`: what a SentencePiece character without a piece or byte tokens becomes.
    pub unk_id: Option<u32>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// End of turn (`tokenizer.ggml.eot_token_id`; Llama 3's `<|eot_id|>`): generation stops on it as on EOS.
    pub eot_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// Prompts start with BOS (`tokenizer.ggml.add_bos_token`; Llama 3 sets it). When the key is absent, off for
    /// byte-level BPE and on for SentencePiece, as in llama.cpp.
    pub add_bos: bool,
    /// How conversations become prompts: the file's `tokenizer.chat_template`, or the template of the family
    /// whose turn markers the vocabulary has (`None` when neither).
    chat: Option<super::chat::ChatTemplate>,
    /// Tokens after which whitespace is dropped where special tokens are parsed (empty: none). llama.cpp does
    /// this for Phi-3 files, chosen by `general.name`: every control, user-defined and unknown token but
    /// `<unk>`, `<s>` and `<|endoftext|>`, and `</s>` (its RSTRIP attribute). Prompts must be the ids llama.cpp
    /// gives them, which are what such models were run with.
    rstrip: Vec<bool>,
}

fn tok_err(msg: impl Into<String>) -> ModelError {
    ModelError::Tokenizer(msg.into())
}

/// Token ids by text, and the special tokens.
struct Vocabulary {
    ids: HashMap<String, u32>,
    is_special: Vec<bool>,
    specials: Vec<(String, u32)>,
}

/// How text becomes ids.
#[derive(Clone, Debug)]
enum Model {
    Bpe(ByteBpe),
    Spm(Spm),
}

#[derive(Clone, Debug)]
struct ByteBpe {
    /// Merge rank and merged token of each mergeable pair of tokens. A merge whose parts or
    /// result are not in the vocabulary cannot produce a token, and is left out (Hugging Face
    /// refuses such a vocabulary).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Token of each byte's mapped char (`None`: the vocabulary lacks it), looked up once here
    /// instead of once per byte encoded.
    byte_ids: [Option<u32>; 256],
    byte_dec: HashMap<char, u8>,
    pre: PreTokenizer,
}

#[derive(Clone, Debug)]
struct Spm {
    scores: Vec<f32>,
    /// Tokens text can merge into: normal, user-defined and unused ones. Control, unknown and byte tokens only
    /// come from their own rules (a text `<0x41>` or `<s>` stays characters), as in SentencePiece.
    piece: Vec<bool>,
    /// Value of each byte token (`<0xNN>`).
    byte_of: Vec<Option<u8>>,
    /// The `<0xNN>` token of each byte.
    byte_ids: [Option<u32>; 256],
}

/// SentencePiece's visible space.
const SPACE: char = '\u{2581}';

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata (`tokenizer.ggml.*`).
    pub fn from_gguf_metadata(md: &HashMap<String, Value>) -> Result<Self> {
        let model = md_str(md, "tokenizer.ggml.model")?;
        let spm = match model {
            "gpt2" => false,
            "llama" => true,
            other => {
                return Err(tok_err(format!(
                    "tokenizer.ggml.model = {other}; supported: gpt2 (byte-level BPE), llama (SentencePiece)"
                )));
            }
        };
        let tokens: Vec<String> = md_str_array(md, "tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        let types = match md_get(md, "tokenizer.ggml.token_type") {
            Ok(_) => Some(md_int_array(md, "tokenizer.ggml.token_type")?),
            Err(_) => None,
        };
        let id = |k: &str| -> Result<Option<u32>> {
            match md.get(k) {
                None => Ok(None),
                Some(Value::U32(v)) => Ok(Some(*v)),
                Some(Value::I32(v)) if *v >= 0 => Ok(Some(*v as u32)),
                // A negative id is none.
                Some(Value::I32(_)) => Ok(None),
                Some(Value::U64(v)) => Ok(u32::try_from(*v).ok()),
                Some(v) => Err(ModelError::BadKey {
                    key: k.into(),
                    reason: format!("expected a token id, found {:?}", v.value_type()),
                }),
            }
        };
        let flag = |k: &str| -> Result<Option<bool>> {
            match md.get(k) {
                None => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(v) => Err(ModelError::BadKey {
                    key: k.into(),
                    reason: format!("expected a bool, found {:?}", v.value_type()),
                }),
            }
        };
        let mut t = if spm {
            let scores = match md_get(md, "tokenizer.ggml.scores") {
                Ok(v) => md_f32_array(v, "tokenizer.ggml.scores")?,
                Err(_) => vec![0.0; tokens.len()],
            };
            Self::new_spm(tokens, &scores, types.as_deref())?
        } else {
            let merges = md_str_array(md, "tokenizer.ggml.merges")?;
            let pre = match md.get("tokenizer.ggml.pre") {
                Some(_) => PreTokenizer::from_name(md_str(md, "tokenizer.ggml.pre")?)?,
                // Files converted before the key existed: llama.cpp's default split.
                None => PreTokenizer::Gpt2,
            };
            Self::new(tokens, &merges, types.as_deref(), pre)?
        };
        // Without the keys, llama.cpp gives SentencePiece vocabularies Llama's ids: unknown 0, BOS 1, EOS 2.
        let n = t.tokens.len() as u32;
        let default = |i: u32| Some(i).filter(|&i| spm && i < n);
        t.bos_id = id("tokenizer.ggml.bos_token_id")?.or(default(1));
        t.eos_id = id("tokenizer.ggml.eos_token_id")?.or(default(2));
        t.unk_id = id("tokenizer.ggml.unknown_token_id")?.or(default(0));
        t.eot_id = id("tokenizer.ggml.eot_token_id")?;
        t.pad_id = id("tokenizer.ggml.padding_token_id")?;
        t.add_bos = flag("tokenizer.ggml.add_bos_token")?.unwrap_or(spm);
        t.add_space_prefix = flag("tokenizer.ggml.add_space_prefix")?.unwrap_or(spm);
        let name = match md.get("general.name") {
            Some(Value::String(n)) => n.to_lowercase(),
            _ => String::new(),
        };
        if name.contains("phi-3") || name.contains("phi3") {
            t.rstrip = t
                .tokens
                .iter()
                .enumerate()
                .map(|(i, tok)| {
                    let special = match &types {
                        Some(ty) => matches!(
                            ty.get(i).copied(),
                            Some(
                                token_type::CONTROL
                                    | token_type::USER_DEFINED
                                    | token_type::UNKNOWN
                            )
                        ),
                        None => t.is_special[i],
                    };
                    (special || tok == "</s>")
                        && !matches!(tok.as_str(), "<unk>" | "<s>" | "<|endoftext|>")
                })
                .collect();
        }
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
            ("unknown", t.unk_id),
        ] {
            if let Some(v) = v
                && v as usize >= t.tokens.len()
            {
                return Err(tok_err(format!("{k} id {v} out of range")));
            }
        }
        Ok(t)
    }

    /// The vocabulary's token ids and special tokens: control, user-defined and unknown ones by `types` (GGUF
    /// token types), or without types the `<|…|>` ones. Both are matched in text where special tokens are parsed; with
    /// `user_defined_text`, user-defined ones are text otherwise (not [`Self::is_special`]: decoded and streamed
    /// as text), as llama.cpp has it for SentencePiece vocabularies, where Gemma's newline runs are user-defined.
    fn vocabulary(
        tokens: &[String],
        types: Option<&[i64]>,
        user_defined_text: bool,
    ) -> Result<Vocabulary> {
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
                // llama.cpp matches the unknown token (`<unk>`) in text as well.
                Some(ty) => matches!(
                    ty[i],
                    token_type::CONTROL | token_type::USER_DEFINED | token_type::UNKNOWN
                ),
                None => tok.starts_with("<|") && tok.ends_with("|>") && tok.len() > 4,
            };
            if special && !tok.is_empty() {
                is_special[i] =
                    !(user_defined_text && types.is_some_and(|t| t[i] == token_type::USER_DEFINED));
                specials.push((tok.clone(), i as u32));
            }
        }
        specials.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        Ok(Vocabulary {
            ids,
            is_special,
            specials,
        })
    }

    fn with_model(
        tokens: Vec<String>,
        Vocabulary {
            ids,
            is_special,
            specials,
        }: Vocabulary,
        model: Model,
    ) -> Self {
        let mut t = Self {
            tokens,
            ids,
            specials,
            is_special,
            model,
            add_space_prefix: false,
            unk_id: None,
            bos_id: None,
            eos_id: None,
            eot_id: None,
            pad_id: None,
            add_bos: false,
            chat: None,
            rstrip: Vec::new(),
        };
        t.chat = super::chat::ChatTemplate::fallback(&t);
        t
    }

    /// A SentencePiece (`llama`) tokenizer from its pieces, their scores and GGUF token types (all normal
    /// without). Special ids, `add_bos` and `add_space_prefix` start unset: [`Self::from_gguf_metadata`] sets
    /// them from the file.
    pub fn new_spm(tokens: Vec<String>, scores: &[f32], types: Option<&[i64]>) -> Result<Self> {
        if scores.len() != tokens.len() {
            return Err(tok_err(format!(
                "{} scores for {} tokens",
                scores.len(),
                tokens.len()
            )));
        }
        let vocab = Self::vocabulary(&tokens, types, true)?;
        let ty = |i: usize| types.map_or(token_type::NORMAL, |t| t[i]);
        let mut byte_ids = [None; 256];
        let mut byte_of = vec![None; tokens.len()];
        let mut piece = vec![false; tokens.len()];
        for (i, tok) in tokens.iter().enumerate() {
            match ty(i) {
                token_type::BYTE => {
                    let b = tok
                        .strip_prefix("<0x")
                        .and_then(|h| h.strip_suffix('>'))
                        .filter(|h| h.len() == 2)
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                        .ok_or_else(|| {
                            tok_err(format!("byte token {i} is `{tok}`, not `<0xNN>`"))
                        })?;
                    byte_of[i] = Some(b);
                    byte_ids[b as usize].get_or_insert(i as u32);
                }
                token_type::CONTROL | token_type::UNKNOWN => {}
                _ => piece[i] = true,
            }
        }
        let model = Model::Spm(Spm {
            scores: scores.to_vec(),
            piece,
            byte_of,
            byte_ids,
        });
        Ok(Self::with_model(tokens, vocab, model))
    }

    /// A byte-level BPE (`gpt2`) tokenizer from parts. `types` uses GGUF token types (3 = control,
    /// 4 = user-defined are special); without types, `<|…|>` tokens are treated as special.
    pub fn new(
        tokens: Vec<String>,
        merges: &[&str],
        types: Option<&[i64]>,
        pre: PreTokenizer,
    ) -> Result<Self> {
        let vocab = Self::vocabulary(&tokens, types, false)?;
        let ids = &vocab.ids;
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
        let model = Model::Bpe(ByteBpe {
            merges: merge_ids,
            byte_ids,
            byte_dec,
            pre,
        });
        Ok(Self::with_model(tokens, vocab, model))
    }

    /// Whether this is a SentencePiece (`llama`) tokenizer.
    pub fn is_sentencepiece(&self) -> bool {
        matches!(self.model, Model::Spm(_))
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
        self.encode_after(text, allow_special, None)
    }

    /// [`Self::encode`] for text that follows token `after` in one prompt (`None`: the text starts it), so that a
    /// prompt encoded in pieces gets the ids of the whole: a SentencePiece space prefix goes only at the start and
    /// after a special token, a byte-level one only at the start.
    pub fn encode_after(
        &self,
        text: &str,
        allow_special: bool,
        after: Option<u32>,
    ) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let spm = match &self.model {
            Model::Spm(spm) => spm,
            Model::Bpe(bpe) => {
                let spaced;
                let text = if self.add_space_prefix
                    && after.is_none()
                    && !text.is_empty()
                    && !text.starts_with(char::is_whitespace)
                {
                    spaced = format!(" {text}");
                    spaced.as_str()
                } else {
                    text
                };
                let mut at = self.after_rstrip(after, text, 0);
                if allow_special {
                    for (r, id) in self.special_matches(text) {
                        if r.start < at {
                            continue;
                        }
                        self.bpe_encode(bpe, &text[at..r.start], &mut out);
                        out.push(id);
                        at = self.after_rstrip(Some(id), text, r.end);
                    }
                }
                self.bpe_encode(bpe, &text[at..], &mut out);
                return Ok(out);
            }
        };
        let mut prev_special = after.is_none_or(|a| self.is_special(a));
        let mut at = self.after_rstrip(after, text, 0);
        let matches = if allow_special {
            self.special_matches(text)
        } else {
            Vec::new()
        };
        for (r, id) in matches {
            if r.start < at {
                continue;
            }
            if r.start > at {
                self.spm_encode(spm, &text[at..r.start], prev_special, &mut out);
            }
            out.push(id);
            prev_special = true;
            at = self.after_rstrip(Some(id), text, r.end);
        }
        if at < text.len() {
            self.spm_encode(spm, &text[at..], prev_special, &mut out);
        }
        Ok(out)
    }

    /// Where text after token `prev` (`None`: nothing before it) continues at byte `at`: past the whitespace
    /// there when `prev` drops it (see `rstrip`), as C's `isspace` counts it.
    fn after_rstrip(&self, prev: Option<u32>, text: &str, at: usize) -> usize {
        match prev {
            Some(id) if self.rstrip.get(id as usize).copied().unwrap_or(false) => {
                let rest = &text[at..];
                at + rest.len()
                    - rest
                        .trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r'])
                        .len()
            }
            _ => at,
        }
    }

    /// Where special tokens occur in `text`, in order: the earliest occurrence first, the longest of those
    /// starting at the same byte.
    pub fn special_matches(&self, text: &str) -> Vec<(std::ops::Range<usize>, u32)> {
        let mut found = Vec::new();
        let mut at = 0;
        while at < text.len() && !self.specials.is_empty() {
            let rest = &text[at..];
            let mut best: Option<(usize, usize, u32)> = None;
            for (s, id) in &self.specials {
                if let Some(p) = rest.find(s.as_str())
                    && best.is_none_or(|(bp, bl, _)| p < bp || (p == bp && s.len() > bl))
                {
                    best = Some((p, s.len(), *id));
                }
            }
            let Some((p, l, id)) = best else { break };
            found.push((at + p..at + p + l, id));
            at += p + l;
        }
        found
    }

    fn bpe_encode(&self, bpe: &ByteBpe, text: &str, out: &mut Vec<u32>) {
        let mut run = Bpe::default();
        // Llama 3 ignores the merges for a piece the vocabulary holds whole (`ignore_merges` in its
        // tokenizer.json; llama.cpp's LLAMA3 pre-tokenizer): merging may not reach that token (` Việt`).
        let ignore_merges = bpe.pre == PreTokenizer::LlamaBpe;
        static BYTE_ENC: std::sync::LazyLock<[char; 256]> =
            std::sync::LazyLock::new(bytes_to_unicode);
        let mut whole = String::new();
        for piece in pre_tokenize(text, bpe.pre) {
            if ignore_merges {
                whole.clear();
                whole.extend(piece.bytes().map(|b| BYTE_ENC[b as usize]));
                if let Some(&id) = self.ids.get(whole.as_str()) {
                    out.push(id);
                    continue;
                }
            }
            // A byte the vocabulary lacks has no token and is dropped, as Hugging Face's BPE
            // (without byte fallback) does; it merges with nothing.
            let byte_ids = piece.bytes().map(|b| bpe.byte_ids[b as usize]);
            run.run(byte_ids, &bpe.merges, out);
        }
    }

    /// One text fragment through SentencePiece BPE: `▁` for spaces (and before the text with `prefix`, where the
    /// vocabulary asks for it), one symbol per character, then the adjacent pair whose merged text is a piece
    /// with the highest score merges, the leftmost of equal scores first, until no pair is a piece. A symbol
    /// that is no piece becomes its bytes' tokens, or the unknown token without them.
    fn spm_encode(&self, spm: &Spm, raw: &str, prefix: bool, out: &mut Vec<u32>) {
        let mut text = String::with_capacity(raw.len() + 3);
        if prefix && self.add_space_prefix {
            text.push(SPACE);
        }
        text.extend(raw.chars().map(|c| if c == ' ' { SPACE } else { c }));
        // (start, end, prev, next) of each symbol; a merged-away one has start == end.
        const NONE: usize = usize::MAX;
        let mut syms: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(text.len());
        for (i, (b, c)) in text.char_indices().enumerate() {
            syms.push((b, b + c.len_utf8(), i.wrapping_sub(1), i + 1));
        }
        let Some(last) = syms.last_mut() else { return };
        last.3 = NONE;
        let piece_id = |s: &str| {
            self.ids
                .get(s)
                .copied()
                .filter(|&id| spm.piece[id as usize])
        };
        let mut heap = std::collections::BinaryHeap::new();
        let candidate = |syms: &[(usize, usize, usize, usize)], l: usize| {
            let r = syms[l].3;
            if r == NONE {
                return None;
            }
            let merged = &text[syms[l].0..syms[r].1];
            piece_id(merged).map(|id| SpmPair {
                score: spm.scores[id as usize],
                left: l,
                right: r,
                len: merged.len(),
            })
        };
        for l in 0..syms.len() {
            heap.extend(candidate(&syms, l));
        }
        while let Some(p) = heap.pop() {
            let (ls, le, lprev, _) = syms[p.left];
            let (rs, re, _, rnext) = syms[p.right];
            // A pair one of whose symbols has merged since is stale.
            if ls == le || rs == re || (le - ls) + (re - rs) != p.len {
                continue;
            }
            syms[p.left].1 = re;
            syms[p.left].3 = rnext;
            syms[p.right].1 = rs;
            if rnext != NONE {
                syms[rnext].2 = p.left;
            }
            if lprev != NONE {
                heap.extend(candidate(&syms, lprev));
            }
            heap.extend(candidate(&syms, p.left));
        }
        let mut i = 0;
        while i != NONE {
            let (s, e, _, next) = syms[i];
            let sym = &text[s..e];
            match piece_id(sym) {
                Some(id) => out.push(id),
                None => {
                    let bytes: Option<Vec<u32>> =
                        sym.bytes().map(|b| spm.byte_ids[b as usize]).collect();
                    match bytes {
                        Some(b) => out.extend(b),
                        None => out.extend(self.unk_id),
                    }
                }
            }
            i = next;
        }
    }

    /// Raw bytes of one token (special tokens give their text; SentencePiece `▁` is a space and `<0xNN>` its
    /// byte). Streaming decoders accumulate these and emit only complete UTF-8.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(tok) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        if self.is_special[id as usize] && matches!(self.model, Model::Bpe(_)) {
            return tok.as_bytes().to_vec();
        }
        match &self.model {
            Model::Spm(spm) => match spm.byte_of[id as usize] {
                Some(b) => vec![b],
                None if spm.piece[id as usize] => tok.replace(SPACE, " ").into_bytes(),
                None => tok.as_bytes().to_vec(),
            },
            Model::Bpe(bpe) => {
                let mut out = Vec::with_capacity(tok.len());
                for c in tok.chars() {
                    match bpe.byte_dec.get(&c) {
                        Some(b) => out.push(*b),
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                out
            }
        }
    }

    /// Decodes ids to text (invalid UTF-8 from a cut-off sequence becomes U+FFFD). Out-of-range
    /// ids are skipped. With a SentencePiece space prefix, the first non-special token's leading space (the one
    /// encoding prefixed) is dropped, as SentencePiece and llama.cpp do.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::new();
        let mut strip = self.add_space_prefix && self.is_sentencepiece();
        for &id in ids {
            let special = self.is_special(id);
            if skip_special && special {
                continue;
            }
            let b = self.token_bytes(id);
            if strip && !special && (id as usize) < self.tokens.len() {
                strip = false;
                if b.first() == Some(&b' ') {
                    bytes.extend_from_slice(&b[1..]);
                    continue;
                }
            }
            bytes.extend(b);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// A candidate SentencePiece merge: the highest score first, then the leftmost.
struct SpmPair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for SpmPair {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

impl PartialOrd for SpmPair {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl PartialEq for SpmPair {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}

impl Eq for SpmPair {}

fn md_f32_array(v: &Value, key: &str) -> Result<Vec<f32>> {
    let Value::Array(items) = v else {
        return Err(ModelError::BadKey {
            key: key.into(),
            reason: format!("expected an array of floats, found {:?}", v.value_type()),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(i, it)| match it {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            _ => Err(ModelError::BadKey {
                key: key.into(),
                reason: format!("element {i} is {:?}, expected a float", it.value_type()),
            }),
        })
        .collect()
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
        for piece in pre_tokenize(text, PreTokenizer::Gpt2) {
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
