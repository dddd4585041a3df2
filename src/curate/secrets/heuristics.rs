//! Heuristics that tell a credential from what merely looks like one: placeholders, code identifiers, prose,
//! encoded data and public key material, measured by character mix and entropy; and the bare high-entropy
//! token pass, which has no rule to go by.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder};

use super::rules::BARE_RULE;
use super::{RawFinding, SecretScanner};

/// Literal fragments that mark a value as a placeholder, not a credential.
const PLACEHOLDERS: &[&str] = &[
    "example",
    "xxxx",
    "****",
    "your-",
    "your_",
    "yourkey",
    "your key",
    "placeholder",
    "dummy",
    "sample",
    "changeme",
    "change_me",
    "redacted",
    "<secret",
    "insert",
    "replace",
    "fake",
    "notreal",
    "not-real",
    "not_real",
    "abcdefgh",
    "12345678",
    "000000",
    "secret:",
];

impl SecretScanner {
    /// A `password = X` value counts only if X looks random, not like code or prose.
    pub(super) fn assignment_value_ok(&self, v: &str) -> bool {
        let vb = v.as_bytes();
        let first = vb[0];
        if matches!(
            first,
            b'$' | b'%' | b'&' | b'@' | b'*' | b'#' | b'!' | b'/' | b'.'
        ) || v.contains("::")
            || v.contains('\\')
            || v.contains("${")
            || v.contains("{{")
            || v.contains("->")
            || v.contains("=>")
            || v.starts_with("self.")
            || v.starts_with("os.")
            || v.starts_with("process.")
            || v.starts_with("env.")
            || v.starts_with("http")
            || v.ends_with(".")
        {
            return false;
        }
        let digits = vb.iter().filter(|c| c.is_ascii_digit()).count();
        let upper = vb.iter().filter(|c| c.is_ascii_uppercase()).count();
        let lower = vb.iter().filter(|c| c.is_ascii_lowercase()).count();
        let other = vb.len() - digits - upper - lower;
        // Identifiers (snake_case, CamelCase, dotted paths) are code, not secrets.
        if digits == 0 && other <= 1 {
            return false;
        }
        // a constant's name (`"CLIENT_HANDSHAKE_TRAFFIC_SECRET"`): upper-case words joined by `_`
        if lower == 0
            && digits == 0
            && v.split('_')
                .all(|w| w.len() >= 2 && w.bytes().all(|c| c.is_ascii_uppercase()))
        {
            return false;
        }
        if digits == vb.len() {
            return false;
        }
        let h = entropy(vb);
        if vb.iter().all(|c| c.is_ascii_hexdigit()) {
            return vb.len() >= 16 && h >= self.config.min_entropy_hex;
        }
        // Short passwords (8..16) only need some mix; long tokens need randomness.
        let classes =
            (digits > 0) as u8 + (upper > 0) as u8 + (lower > 0) as u8 + (other > 0) as u8;
        if vb.len() < 16 {
            classes >= 3 && h >= 2.5
        } else {
            classes >= 2 && h >= self.config.min_entropy_base64 - 0.7
        }
    }

    /// Bare tokens: long runs of base64/url-safe characters with high entropy and mixed
    /// character classes, that are not hex hashes, UUIDs or paths.
    pub(super) fn bare_tokens(&self, text: &str, out: &mut Vec<RawFinding>) {
        let b = text.as_bytes();
        let n = b.len();
        let min = self.config.min_token_len;
        // A run of `min` or more token bytes covers `min` consecutive positions, so it holds
        // one of every `min`-th byte: only those are probed, and a run is measured around a
        // probe that hits one. On prose that reads a fraction of the bytes and leaves out the
        // mispredicted loop exit at the end of every word.
        let step = min.max(1);
        let mut probe = step - 1;
        while probe < n {
            if !is_tok_byte(b[probe]) {
                probe += step;
                continue;
            }
            let mut s = probe;
            while s > 0 && is_tok_byte(b[s - 1]) {
                s -= 1;
            }
            let mut i = probe + 1;
            while i < n && is_tok_byte(b[i]) {
                i += 1;
            }
            // the first probe at or past the run's end (`b[i]` is no token byte)
            probe = i - i % step + step - 1;
            if i - s < min {
                // too short even with its padding (most words)
                continue;
            }
            let mut e = i;
            while e > s && b[e - 1] == b'=' {
                e -= 1;
            }
            // padding only at the end
            let pad_end = (e..i).count();
            if e - s < min || pad_end > 2 {
                continue;
            }
            // glued to non-ASCII letters or path separators: part of a word or a path
            if (s > 0 && (b[s - 1] >= 0x80 || b[s - 1] == b'\\' || b[s - 1] == b'.'))
                || (i < n && (b[i] >= 0x80 || b[i] == b'\\'))
            {
                continue;
            }
            let tok = &b[s..e];
            // Long padded base64 is encoded content (a test vector, a file, a certificate body) unless it
            // decodes to DER, as a key pasted on one line does.
            if pad_end > 0 && e - s >= ENCODED_DATA_MIN_LEN && !decodes_to_der(tok) {
                continue;
            }
            if self.bare_token_ok(tok) {
                let t = &text[s..i];
                if !self.allowed(t) && !is_placeholder(t) {
                    out.push(RawFinding {
                        start: s,
                        end: i,
                        rule: BARE_RULE,
                        specific: false,
                    });
                }
            }
        }
    }

    fn bare_token_ok(&self, tok: &[u8]) -> bool {
        if tok.iter().all(|c| c.is_ascii_hexdigit() || *c == b'-') {
            return false; // hashes, UUIDs, ids
        }
        if is_alphabet(tok) {
            return false;
        }
        let slashes = tok.iter().filter(|c| **c == b'/').count();
        if slashes > 0 && (tok.contains(&b'.') || slashes * 12 > tok.len()) {
            return false; // paths and URLs
        }
        let (mut d, mut u, mut l) = (0usize, 0usize, 0usize);
        for &c in tok {
            d += c.is_ascii_digit() as usize;
            u += c.is_ascii_uppercase() as usize;
            l += c.is_ascii_lowercase() as usize;
        }
        if d == 0 || u == 0 || l == 0 || d * 16 < tok.len() || vowel_ratio(tok) > 0.45 {
            return false;
        }
        // identifiers joined by `_`: several word-like segments
        if tok
            .split(|c| *c == b'_' || *c == b'-')
            .filter(|s| s.len() >= 3)
            .count()
            >= 3
        {
            return false;
        }
        if english_segments(tok) >= 2
            || camel_case_identifier(tok)
            || decodes_to_text(tok)
            || decodes_to_progression(tok)
        {
            return false;
        }
        // identifiers joined by _ or - (snake/kebab/Camel words) have long letter runs
        let mut run = 0usize;
        let mut max_run = 0usize;
        for &c in tok {
            if c.is_ascii_lowercase() {
                run += 1;
                max_run = max_run.max(run);
            } else {
                run = 0;
            }
        }
        if max_run >= 9 {
            return false;
        }
        entropy(tok) >= self.config.min_entropy_base64
    }
}

/// Byte ranges of PEM blocks whose label names no private key (`CERTIFICATE`, `PUBLIC KEY`):
/// their base64 is public by design, so it is not a bare secret token.
pub(super) fn public_pem_blocks(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // The first `-----END ` at or after each body: searched once per END and reused by the
    // BEGINs before it (a paste of BEGIN lines without END searched to the end of the text
    // for each).
    let mut next_end: Option<(usize, Option<usize>)> = None;
    for (s, _) in text.match_indices("-----BEGIN ") {
        let rest = &text[s + 11..];
        let Some(label_end) = rest.find("-----") else {
            continue;
        };
        let label = &rest[..label_end];
        if label.len() > 64 || label.contains('\n') || label.contains("PRIVATE") {
            continue;
        }
        let body = s + 11 + label_end + 5;
        let found = match next_end {
            // searched from at or before `body` and found nothing before `found`
            Some((from, found)) if from <= body && found.is_none_or(|f| f >= body) => found,
            _ => {
                let found = text[body..].find("-----END ").map(|p| body + p);
                next_end = Some((body, found));
                found
            }
        };
        out.push((s, found.map_or(text.len(), |p| p + 9)));
    }
    out
}

/// End of a private-key block that starts its body at `from`: after the `-----END …-----`
/// line, or (truncated paste) after the last base64 line, at most 16 KiB on.
pub(super) fn key_block_end(text: &str, from: usize) -> usize {
    let mut lim = (from + 16 * 1024).min(text.len());
    while !text.is_char_boundary(lim) {
        lim -= 1;
    }
    let body = &text[from..lim];
    if let Some(p) = body.find("-----END") {
        let after = &body[p + 8..];
        if let Some(q) = after.find("-----") {
            return from + p + 8 + q + 5;
        }
    }
    // no END marker: take the base64-looking lines
    let mut end = from;
    for line in body.split_inclusive('\n') {
        let l = line.trim();
        let b64 = !l.is_empty()
            && l.bytes().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b':' | b'-' | b' ')
            });
        if !b64 && end > from {
            break;
        }
        end += line.len();
    }
    end
}

/// Identifiers, constants, member paths and type names: `next_token`, `WIN32_ERROR`,
/// `node.dot2_token`, `:parse`. A random secret rarely has `_`/`.` between word-like parts.
pub(super) fn looks_like_code(v: &str) -> bool {
    let b = v.as_bytes();
    if b.first()
        .is_some_and(|c| matches!(c, b':' | b'_' | b'&' | b'*'))
    {
        return true;
    }
    let ident = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.'));
    ident && (v.contains('_') || v.contains('.') || vowel_ratio(b) > 0.3)
}

/// Number of CamelCase / snake_case segments (3+ letters) that are English words: code
/// identifiers such as `PtpV2OverUdpTransmit` have several, random tokens almost never two.
fn english_segments(tok: &[u8]) -> usize {
    let lex = &crate::curate::redact::english_words();
    let mut n = 0;
    let mut i = 0;
    while i < tok.len() {
        if !tok[i].is_ascii_alphabetic() {
            i += 1;
            continue;
        }
        let s = i;
        i += 1;
        // an upper-case run followed by lower case starts a new word at its last capital
        while i < tok.len() && tok[i].is_ascii_lowercase() {
            i += 1;
        }
        if i - s >= 3 {
            let w = tok[s..i].to_ascii_lowercase();
            if std::str::from_utf8(&w).is_ok_and(|w| lex.contains(w)) {
                n += 1;
            }
        }
    }
    n
}

/// True if the token is a CamelCase identifier with numbers (`ChaCha20Poly1305Decrypter`):
/// every capital starts a lower-case run of 2+ letters and no lower-case run stands alone.
/// A random base62 token almost always has a lone lower-case letter somewhere.
fn camel_case_identifier(tok: &[u8]) -> bool {
    if !tok.iter().all(u8::is_ascii_alphanumeric) {
        return false;
    }
    let mut i = 0;
    let mut words = 0;
    while i < tok.len() {
        let c = tok[i];
        if c.is_ascii_digit() {
            i += 1;
            continue;
        }
        if !c.is_ascii_uppercase() {
            return false;
        }
        let s = i;
        i += 1;
        while i < tok.len() && tok[i].is_ascii_lowercase() {
            i += 1;
        }
        if i - s < 3 {
            return false;
        }
        words += 1;
    }
    words >= 3
}

/// Standard base64 alphabet value of a byte (URL-safe `-`/`_` accepted).
fn b64_val(c: u8) -> Option<u32> {
    Some(match c {
        b'A'..=b'Z' => u32::from(c - b'A'),
        b'a'..=b'z' => u32::from(c - b'a') + 26,
        b'0'..=b'9' => u32::from(c - b'0') + 52,
        b'+' | b'-' => 62,
        b'/' | b'_' => 63,
        _ => return None,
    })
}

/// Decodes base64 (padding ignored); `None` if any byte is outside the alphabet.
fn b64_decode(tok: &[u8]) -> Option<Vec<u8>> {
    let body: Vec<u8> = tok.iter().copied().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(body.len());
    for chunk in body.chunks(4) {
        let mut acc = 0u32;
        for (k, &c) in chunk.iter().enumerate() {
            acc |= b64_val(c)? << (18 - 6 * k);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// Bare tokens with `=` padding from this many characters on are encoded data, not credentials: key
/// material runs to 88 characters (64 bytes) in base64, and longer keys come as PEM blocks or DER.
const ENCODED_DATA_MIN_LEN: usize = 100;

/// True if the token is standard base64 of DER (an ASN.1 SEQUENCE: `0x30` and a long-form length), the
/// encoding of private keys pasted without their PEM lines.
fn decodes_to_der(tok: &[u8]) -> bool {
    b64_decode(&tok[..tok.len().min(8)])
        .is_some_and(|d| d.len() >= 2 && d[0] == 0x30 && d[1] & 0x80 != 0)
}

/// True if no character repeats in a token of 40 or more: an alphabet or a permutation written out (a
/// custom base64 alphabet in code). Random key material of that length repeats a character with near
/// certainty (over 64 symbols the chance that 40 draws are all distinct is about 2·10⁻⁷).
fn is_alphabet(tok: &[u8]) -> bool {
    if tok.len() < 40 {
        return false;
    }
    let mut seen = [false; 256];
    tok.iter()
        .all(|&c| !std::mem::replace(&mut seen[c as usize], true))
}

/// True if the token is base64 of a byte progression (`/wMHCw8TFxsf…` is 0xff, 0x03, 0x07 …):
/// encoder test vectors, not key material.
fn decodes_to_progression(tok: &[u8]) -> bool {
    let Some(out) = b64_decode(tok) else {
        return false;
    };
    if out.len() < 8 {
        return false;
    }
    let step = out[1].wrapping_sub(out[0]);
    let same = out
        .windows(2)
        .filter(|w| w[1].wrapping_sub(w[0]) == step)
        .count();
    same * 10 >= (out.len() - 1) * 9
}

/// True if the token is standard base64 of mostly printable text (test vectors, encoded
/// prose), which is data rather than a credential.
fn decodes_to_text(tok: &[u8]) -> bool {
    let Some(out) = b64_decode(tok) else {
        return false;
    };
    !out.is_empty()
        && out
            .iter()
            .filter(|&&c| c == b' ' || c == b'\n' || c.is_ascii_graphic())
            .count()
            * 10
            >= out.len() * 9
}

/// Share of vowels among ASCII letters: English-like identifiers sit near 0.4, random
/// base62 near 0.19.
fn vowel_ratio(b: &[u8]) -> f64 {
    let letters = b.iter().filter(|c| c.is_ascii_alphabetic()).count();
    if letters == 0 {
        return 0.0;
    }
    let v = b
        .iter()
        .filter(|c| matches!(c.to_ascii_lowercase(), b'a' | b'e' | b'i' | b'o' | b'u'))
        .count();
    v as f64 / letters as f64
}

pub(super) fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// Bytes of a base64/url-safe token, as a table: the bare-token pass tests every byte.
static TOK_BYTES: [bool; 256] =
    byte_table!(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'_' | b'-'));

fn is_tok_byte(c: u8) -> bool {
    TOK_BYTES[c as usize]
}

static PLACEHOLDER_AC: LazyLock<AhoCorasick> = LazyLock::new(|| {
    AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .build(PLACEHOLDERS)
        // Constant literal list; building cannot fail.
        .expect("constant placeholder automaton")
});

/// True if the value holds a placeholder fragment (ASCII case-insensitively).
pub(super) fn is_placeholder(s: &str) -> bool {
    PLACEHOLDER_AC.is_match(s)
}

/// Shannon entropy in bits per byte.
pub(super) fn entropy(b: &[u8]) -> f64 {
    if b.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &c in b {
        counts[c as usize] += 1;
    }
    let n = b.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}
