//! Tokens, gazetteers and the character n-gram name model shared by the person and address
//! detectors. The lists ship in `data/*.txt` (written for hearth) and are compiled in, so the
//! redactor needs no files or downloads at run time.

use compact_str::CompactString;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::ControlFlow;
use std::sync::LazyLock;

use crate::curate::Spliced;

use super::chars;

/// Small multiplicative hasher for short keys (gazetteer lookups dominate name detection;
/// SipHash's DoS resistance buys nothing for a fixed, compiled-in word list).
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w))
                .wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(i)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, i: u32) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(i)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, i: usize) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        // A product's low bits depend only on the low bits of its factors, and hashbrown picks
        // the bucket from the low bits: unrotated, a short word's bucket depended on its first
        // two bytes only. The rotation brings the well-mixed high bits down (as rustc-hash 2
        // does).
        self.0.rotate_left(26)
    }
}

/// Fast string set used for all gazetteers.
pub(crate) type WordSet = HashSet<String, BuildHasherDefault<FxHasher>>;
/// Fast set of borrowed words.
pub(crate) type StrSet<'a> = HashSet<&'a str, BuildHasherDefault<FxHasher>>;
/// Fast set of static words (titles, street types …).
pub(crate) type StaticSet = StrSet<'static>;

/// Builds a [`StaticSet`] from whitespace-separated words.
pub(crate) fn static_set(words: &'static str) -> StaticSet {
    words.split_whitespace().collect()
}

/// Word-class bits (see [`Lexicon::class`]): the four gazetteers, then the small word lists
/// of the name and address detectors. Each word token gets its bits once, in [`tokenize`], so
/// the detectors test bits instead of probing several hash sets per token.
pub(crate) const IN_FIRST: u32 = 1;
pub(crate) const IN_LAST: u32 = 2;
pub(crate) const IN_COMMON: u32 = 4;
pub(crate) const IN_PLACES: u32 = 8;
pub(crate) const C_TITLE: u32 = 1 << 4;
pub(crate) const C_ORG: u32 = 1 << 5;
pub(crate) const C_PERSON_VERB: u32 = 1 << 6;
pub(crate) const C_STRONG_SUFFIX: u32 = 1 << 7;
pub(crate) const C_WEAK_SUFFIX: u32 = 1 << 8;
pub(crate) const C_PREFIX_TYPE: u32 = 1 << 9;
pub(crate) const C_POST_TYPE: u32 = 1 << 10;
pub(crate) const C_UNIT: u32 = 1 << 11;
pub(crate) const C_NAME_PARTICLE: u32 = 1 << 12;
pub(crate) const C_NAME_CAP_PARTICLE: u32 = 1 << 13;
pub(crate) const C_ADDRESS_PARTICLE: u32 = 1 << 14;
pub(crate) const C_TOWN_PARTICLE: u32 = 1 << 15;
pub(crate) const C_PRONOUN: u32 = 1 << 16;
pub(crate) const C_HEADER: u32 = 1 << 17;
pub(crate) const C_VOCATIVE_NEXT: u32 = 1 << 18;
pub(crate) const C_OWNED: u32 = 1 << 19;
pub(crate) const C_WORK: u32 = 1 << 20;
pub(crate) const C_PERSON_FIELD: u32 = 1 << 21;
pub(crate) const C_LOWER_CORE_KEY: u32 = 1 << 22;
pub(crate) const C_PLACE_HEAD: u32 = 1 << 23;
pub(crate) const C_PLACE_TAIL: u32 = 1 << 24;
pub(crate) const C_GREETING: u32 = 1 << 25;
pub(crate) const C_MONTH: u32 = 1 << 26;

/// Token class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Starts with a letter.
    Word,
    /// Starts with a digit (`12`, `24a`, `72/15`, `3AH`).
    Num,
    /// One punctuation or symbol char.
    Punct,
}

/// A token with byte offsets and the whitespace before it.
#[derive(Debug, Clone)]
pub(crate) struct Tok<'a> {
    pub s: usize,
    pub e: usize,
    pub kind: Kind,
    /// First char is upper-case.
    pub cap: bool,
    /// Every letter is upper-case (and there are >= 2).
    pub all_caps: bool,
    /// A line break occurs between the previous token and this one.
    pub nl_before: bool,
    /// Any whitespace between the previous token and this one.
    pub sp_before: bool,
    /// Lower-case, diacritics folded (words only; empty otherwise). Borrowed from the text
    /// for plain lower-case ASCII words, so most tokens cost no allocation.
    pub key: Key<'a>,
    /// Characters in `key` (the detectors ask often, so it is counted once).
    pub key_chars: usize,
    /// Inside a `<SENTINEL>`: never PII.
    pub sentinel: bool,
    /// Word-class bits of `key` (words only; 0 otherwise).
    pub cls: u32,
}

impl Tok<'_> {
    /// True if the word has any of the class bits.
    pub(crate) fn is(&self, bits: u32) -> bool {
        self.cls & bits != 0
    }
}

impl Tok<'_> {
    pub(crate) fn text<'t>(&self, t: &'t str) -> &'t str {
        &t[self.s..self.e]
    }
    pub(crate) fn is_punct(&self, t: &str, c: char) -> bool {
        if c.is_ascii() {
            // An ASCII byte in UTF-8 is always that char, so the first byte decides; `&`
            // leaves one branch on the answer (word or punctuation alternate unpredictably).
            // `c` is a constant at every call, so this choice costs nothing.
            (self.kind == Kind::Punct) & (t.as_bytes().get(self.s) == Some(&(c as u8)))
        } else {
            self.kind == Kind::Punct && t[self.s..self.e].starts_with(c)
        }
    }
}

/// A token's folded key: borrowed from the text when already folded (plain lower-case
/// ASCII), else an owned [`CompactString`], which keeps keys up to 24 bytes inline and
/// hands out `&str` without re-checking UTF-8 (the detectors read keys many times per
/// token). Tokenizing short records thus allocates nothing per word.
#[derive(Debug, Clone)]
pub(crate) enum Key<'a> {
    Borrowed(&'a str),
    Owned(CompactString),
}

impl<'a> Key<'a> {
    /// The key of a word and its length in chars (known without counting unless the word
    /// needed folding).
    fn of(word: &'a str) -> (Self, usize) {
        let b = word.as_bytes();
        if b.iter()
            .all(|&c| c.is_ascii_lowercase() || c == b'-' || c == b'\'')
        {
            (Key::Borrowed(word), word.len())
        } else if word.is_ascii() {
            let mut k = CompactString::from(word);
            k.make_ascii_lowercase();
            (Key::Owned(k), word.len())
        } else {
            let k = fold_key(word);
            let chars = k.chars().count();
            (Key::Owned(k), chars)
        }
    }
}

impl std::ops::Deref for Key<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl AsRef<str> for Key<'_> {
    fn as_ref(&self) -> &str {
        self
    }
}

impl PartialEq<&str> for Key<'_> {
    fn eq(&self, o: &&str) -> bool {
        &**self == *o
    }
}

impl PartialEq<String> for Key<'_> {
    fn eq(&self, o: &String) -> bool {
        **self == **o
    }
}

fn joiner(c: char) -> bool {
    matches!(c, '-' | '\'' | '’' | '/')
}

// Classes of ASCII bytes inside a word or number (0: none): the tokenizer's inner loop reads
// one table entry per byte.
const DIGIT: u8 = 1;
const LOWER: u8 = 2;
const UPPER: u8 = 3;
static ASCII_CLASS: [u8; 256] = byte_table!(|b| if b.is_ascii_digit() {
    DIGIT
} else if b.is_ascii_lowercase() {
    LOWER
} else if b.is_ascii_uppercase() {
    UPPER
} else {
    0
});

/// Splits text into word, number and punctuation tokens.
pub(crate) fn tokenize(text: &str) -> Vec<Tok<'_>> {
    // about one token per three bytes in chat text (words, spaces, punctuation)
    let mut toks = Vec::with_capacity(text.len() / 3 + 4);
    scan_tokens(text, 0, |t| {
        toks.push(t);
        ControlFlow::Continue(())
    });
    mark_sentinels(text, &mut toks);
    toks
}

/// Tokenizes `text` from byte `from`, which must be 0 or the end of a token (whitespace read
/// before a token is its `sp_before`/`nl_before`), handing each token to `emit` until it
/// breaks. Returns whether it broke.
fn scan_tokens<'a>(
    text: &'a str,
    from: usize,
    mut emit: impl FnMut(Tok<'a>) -> ControlFlow<()>,
) -> bool {
    let b = text.as_bytes();
    let n = b.len();
    // ASCII bytes are decoded directly; only non-ASCII chars go through UTF-8 decoding
    let char_at = |j: usize| -> char {
        if b[j] < 0x80 {
            b[j] as char
        } else {
            text[j..].chars().next().unwrap_or('\u{fffd}')
        }
    };
    let mut nl = false;
    let mut sp = false;
    let mut pos = from;
    while pos < n {
        let i = pos;
        let c = char_at(i);
        pos += c.len_utf8();
        if c.is_whitespace() {
            sp = true;
            if c == '\n' || c == '\r' {
                nl = true;
            }
            continue;
        }
        if chars::is_alphanumeric(c) {
            let mut e = pos;
            let mut upper_letters = chars::is_uppercase(c) as usize;
            let mut letters = chars::is_alphabetic(c) as usize;
            loop {
                while e < n && ASCII_CLASS[b[e] as usize] != 0 {
                    let k = ASCII_CLASS[b[e] as usize];
                    upper_letters += usize::from(k == UPPER);
                    letters += usize::from(k != DIGIT);
                    e += 1;
                }
                if e >= n {
                    break;
                }
                let j = e;
                let d = char_at(j);
                if chars::is_alphanumeric(d) {
                    upper_letters += chars::is_uppercase(d) as usize;
                    letters += chars::is_alphabetic(d) as usize;
                    e = j + d.len_utf8();
                } else if joiner(d) {
                    // joiner only inside a token: must be followed by an alphanumeric;
                    // a possessive `'s` stays outside so `Novák's` keys as `novak`
                    let rest = &text[j + d.len_utf8()..];
                    let mut rc = rest.chars();
                    let next = rc.next();
                    let possessive = matches!(d, '\'' | '’')
                        && next == Some('s')
                        && !rc.next().is_some_and(chars::is_alphanumeric)
                        && chars::is_uppercase(c)
                        && ![
                            "it", "that", "he", "she", "what", "there", "here", "who", "let",
                            "where", "how",
                        ]
                        .iter()
                        .any(|w| text[i..j].eq_ignore_ascii_case(w));
                    if next.is_some_and(chars::is_alphanumeric) && !possessive {
                        e = j + d.len_utf8();
                    } else {
                        break;
                    }
                } else {
                    break;
                }
            }
            pos = e;
            let kind = if chars::is_numeric(c) {
                Kind::Num
            } else {
                Kind::Word
            };
            let word = &text[i..e];
            let (key, key_chars) = if kind != Kind::Word {
                (Key::Borrowed(""), 0)
            } else {
                Key::of(word)
            };
            let tok = Tok {
                s: i,
                e,
                kind,
                key_chars,
                cap: chars::is_uppercase(c),
                all_caps: letters >= 2 && upper_letters == letters,
                nl_before: nl,
                sp_before: sp,
                cls: if kind == Kind::Word {
                    LEX.class(&key)
                } else {
                    0
                },
                key,
                sentinel: false,
            };
            if emit(tok).is_break() {
                return true;
            }
        } else {
            let tok = Tok {
                s: i,
                e: pos,
                kind: Kind::Punct,
                cap: false,
                all_caps: false,
                nl_before: nl,
                sp_before: sp,
                key: Key::Borrowed(""),
                key_chars: 0,
                sentinel: false,
                cls: 0,
            };
            if emit(tok).is_break() {
                return true;
            }
        }
        nl = false;
        sp = false;
    }
    false
}

/// The tokens of `spliced.text`, given `toks`, the tokens of the text it was spliced from.
/// A token whose bytes and the whitespace before it lie outside every replaced span is the
/// same token in both texts, only shifted, and is copied; the tokenizer runs only from the
/// last such token before each sentinel until its tokens line up with the original's again.
/// Equals `tokenize(&spliced.text)` (proptest below) for less work in the redactor's re-scan.
///
/// The tokenizer also reads past a token's end (a joiner, then `s` and one more char for a
/// possessive), possibly into a replaced span, but a sentinel starts with `<`: neither a
/// letter, digit, joiner nor space. Where the original had a letter or digit there, the token
/// went on into the span, so it is not copied; where it had anything else, the token ended
/// exactly as it does before `<`.
pub(crate) fn retokenize<'a>(toks: &[Tok<'a>], spliced: &'a Spliced) -> Vec<Tok<'a>> {
    let text = spliced.text.as_str();
    let map = spliced.sentinels();
    let mut out: Vec<Tok<'a>> = Vec::with_capacity(toks.len() + 4 * map.len());
    let prev_end = |k: usize| if k == 0 { 0 } else { toks[k - 1].e };
    // replaced spans ending at or before the region under test are passed for good
    let mut span = 0;
    let mut clean = |k: usize| {
        let from = prev_end(k);
        while span < map.len() && map[span].3 <= from {
            span += 1;
        }
        span == map.len() || map[span].2 >= toks[k].e
    };
    debug_assert!(map.iter().all(|m| text.as_bytes()[m.0] == b'<'));
    // next original token to copy, end of the last token out, and the shift between them
    let mut k = 0;
    let mut cursor = 0;
    let mut shift: isize = 0;
    // sentinels wholly before the last token out's end
    let mut passed = 0;
    loop {
        while k < toks.len() && prev_end(k) as isize + shift == cursor as isize && clean(k) {
            let t = &toks[k];
            out.push(Tok {
                s: (t.s as isize + shift) as usize,
                e: (t.e as isize + shift) as usize,
                sentinel: false,
                ..t.clone()
            });
            cursor = out.last().map_or(0, |t| t.e);
            k += 1;
        }
        let mut resync = None;
        let broke = scan_tokens(text, cursor, |t| {
            let end = t.e;
            out.push(t);
            while passed < map.len() && map[passed].1 <= end {
                passed += 1;
            }
            // inside a sentinel: nothing in the original lines up here
            if passed < map.len() && map[passed].0 < end {
                return ControlFlow::Continue(());
            }
            let shift_here = passed
                .checked_sub(1)
                .map_or(0, |p| map[p].1 as isize - map[p].3 as isize);
            let original_end = (end as isize - shift_here) as usize;
            // an original token ends here too, and the next one is unaffected: copy from it
            match toks.binary_search_by_key(&original_end, |t| t.e) {
                Ok(j) if j + 1 < toks.len() && clean(j + 1) => {
                    resync = Some((j + 1, shift_here));
                    ControlFlow::Break(())
                }
                _ => ControlFlow::Continue(()),
            }
        });
        cursor = out.last().map_or(0, |t| t.e);
        match resync {
            Some((next, s)) if broke => {
                k = next;
                shift = s;
            }
            _ => break,
        }
    }
    mark_sentinels(text, &mut out);
    out
}

/// Marks `<LABEL>` and `<SECRET:rule>` sentinels so re-redaction leaves them alone.
fn mark_sentinels(text: &str, toks: &mut [Tok]) {
    let b = text.as_bytes();
    // most texts hold no `<` at all: one memchr instead of a look at every token
    if !b.contains(&b'<') {
        return;
    }
    for i in 0..toks.len() {
        if b[toks[i].s] == b'<' {
            let mut j = i + 1;
            while j < toks.len() && j < i + 8 && !toks[j].is_punct(text, '>') && !toks[j].sp_before
            {
                j += 1;
            }
            if j < toks.len() && toks[j].is_punct(text, '>') {
                for t in &mut toks[i..=j] {
                    t.sentinel = true;
                }
            }
        }
    }
}

/// Lower-cases and strips common Latin diacritics so `Jürgen` matches `jurgen`.
pub(crate) fn fold(s: &str) -> String {
    fold_into(s, String::with_capacity(s.len()))
}

/// [`fold`] for token keys: folded into a stack buffer, then made an inline string (no heap
/// allocation up to 24 bytes). Pushing each char into the `CompactString` itself re-inspects its
/// representation per char.
pub(crate) fn fold_key(s: &str) -> CompactString {
    let folded = fold_into(s, FoldBuffer::default());
    if folded.overflow {
        // Longer than the buffer: fold straight into the string.
        return fold_into(s, CompactString::with_capacity(s.len()));
    }
    // SAFETY: `FoldBuffer::push` is the only writer and appends whole chars encoded by
    // `char::encode_utf8` (or none at all), so `bytes[..len]` is UTF-8, and checking it again
    // would cost a pass over every non-ASCII key.
    CompactString::from(unsafe { std::str::from_utf8_unchecked(&folded.bytes[..folded.len]) })
}

/// A fixed stack buffer [`fold_into`] writes to; `overflow` once a char did not fit.
struct FoldBuffer {
    bytes: [u8; 64],
    len: usize,
    overflow: bool,
}

impl Default for FoldBuffer {
    fn default() -> Self {
        Self {
            bytes: [0; 64],
            len: 0,
            overflow: false,
        }
    }
}

impl Extend<char> for FoldBuffer {
    fn extend<I: IntoIterator<Item = char>>(&mut self, chars: I) {
        for c in chars {
            FoldSink::push(self, c);
        }
    }
}

impl FoldSink for FoldBuffer {
    fn push(&mut self, c: char) {
        let n = c.len_utf8();
        match self.bytes.get_mut(self.len..self.len + n) {
            Some(slot) if !self.overflow => {
                c.encode_utf8(slot);
                self.len += n;
            }
            _ => self.overflow = true,
        }
    }
    fn push_str(&mut self, s: &str) {
        for c in s.chars() {
            FoldSink::push(self, c);
        }
    }
}

/// What [`fold_into`] writes to: `String` for word lists, [`FoldBuffer`] for token keys
/// (`CompactString` for the rare key too long for it).
trait FoldSink: Extend<char> {
    fn push(&mut self, c: char);
    fn push_str(&mut self, s: &str);
}

impl FoldSink for String {
    fn push(&mut self, c: char) {
        String::push(self, c);
    }
    fn push_str(&mut self, s: &str) {
        String::push_str(self, s);
    }
}

impl FoldSink for CompactString {
    fn push(&mut self, c: char) {
        CompactString::push(self, c);
    }
    fn push_str(&mut self, s: &str) {
        CompactString::push_str(self, s);
    }
}

fn fold_into<S: FoldSink>(s: &str, mut out: S) -> S {
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c.to_ascii_lowercase());
            continue;
        }
        let f =
            match c {
                'à' | 'á' | 'â' | 'ã' | 'ä' | 'å' | 'ā' | 'ą' | 'À' | 'Á' | 'Â' | 'Ã' | 'Ä'
                | 'Å' => 'a',
                'ç' | 'ć' | 'č' | 'Ç' | 'Ć' | 'Č' => 'c',
                'ď' | 'Ď' | 'đ' => 'd',
                'è' | 'é' | 'ê' | 'ë' | 'ē' | 'ę' | 'ě' | 'È' | 'É' | 'Ê' | 'Ë' | 'Ě' => {
                    'e'
                }
                'ì' | 'í' | 'î' | 'ï' | 'ī' | 'Ì' | 'Í' | 'Î' | 'Ï' => 'i',
                'ł' | 'Ł' | 'ľ' | 'ĺ' => 'l',
                'ñ' | 'ń' | 'ň' | 'Ñ' | 'Ń' | 'Ň' => 'n',
                'ò' | 'ó' | 'ô' | 'õ' | 'ö' | 'ø' | 'ő' | 'Ò' | 'Ó' | 'Ô' | 'Õ' | 'Ö' | 'Ø'
                | 'Ő' => 'o',
                'ř' | 'Ř' => 'r',
                'ś' | 'š' | 'ş' | 'Ś' | 'Š' | 'Ş' => 's',
                'ß' => {
                    out.push_str("ss");
                    continue;
                }
                'ť' | 'Ť' | 'ţ' => 't',
                'ù' | 'ú' | 'û' | 'ü' | 'ů' | 'ű' | 'Ù' | 'Ú' | 'Û' | 'Ü' | 'Ů' | 'Ű' => {
                    'u'
                }
                'ý' | 'ÿ' | 'Ý' => 'y',
                'ź' | 'ż' | 'ž' | 'Ź' | 'Ż' | 'Ž' => 'z',
                'æ' | 'Æ' => {
                    out.push_str("ae");
                    continue;
                }
                'þ' | 'Þ' => {
                    out.push_str("th");
                    continue;
                }
                'ð' | 'Ð' => 'd',
                '’' => '\'',
                _ if chars::lowercases_to_itself(c) => c,
                _ => {
                    out.extend(c.to_lowercase());
                    continue;
                }
            };
        out.push(f);
    }
    out
}

fn load(src: &'static str) -> WordSet {
    src.lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(fold)
        .collect()
}

/// Gazetteers, folded.
pub(crate) struct Lexicon {
    pub common: WordSet,
    /// Union of all word lists with their class bits: one lookup per token.
    flags: HashMap<String, u32, BuildHasherDefault<FxHasher>>,
    model: NameModel,
}

impl Lexicon {
    /// Class bits of a folded word (`IN_*`, `C_*`).
    pub(crate) fn class(&self, key: &str) -> u32 {
        self.flags.get(key).copied().unwrap_or(0)
    }

    /// Log-odds (per trigram, averaged) that a word is a name rather than an ordinary word.
    pub(crate) fn name_score(&self, key: &str) -> f32 {
        self.model.score(key)
    }
}

/// Whether `word` (any case) is among the most frequent words of one of 42 languages
/// (`data/frequent_words.txt`, sorted). Their lists hold names too, so these words cannot count as
/// ordinary words everywhere; only a sign-off line reads them, and the list is read in place.
pub(crate) fn frequent_word(word: &str) -> bool {
    FREQUENT_WORDS
        .binary_search(&word.to_lowercase().as_str())
        .is_ok()
}

static FREQUENT_WORDS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    include_str!("data/frequent_words.txt")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::split_whitespace)
        .collect()
});

pub(crate) static LEX: LazyLock<Lexicon> = LazyLock::new(|| {
    let first = load(include_str!("data/first_names.txt"));
    let last = load(include_str!("data/surnames.txt"));
    let mut common = load(include_str!("data/common_words.txt"));
    common.extend(load(include_str!("data/english_vocab.txt")));
    let places = load(include_str!("data/places.txt"));
    let model = NameModel::train(
        first.iter().chain(last.iter()).map(String::as_str),
        common.iter().map(String::as_str),
    );
    let mut flags: HashMap<String, u32, BuildHasherDefault<FxHasher>> = HashMap::default();
    for (set, bit) in [
        (&first, IN_FIRST),
        (&last, IN_LAST),
        (&common, IN_COMMON),
        (&places, IN_PLACES),
    ] {
        for w in set {
            *flags.entry(w.clone()).or_default() |= bit;
        }
    }
    // placeholder Latin counts as ordinary words, except where a word is also a listed name
    for w in load(include_str!("data/lorem.txt")) {
        let f = flags.entry(w).or_default();
        if *f & (IN_FIRST | IN_LAST) == 0 {
            *f |= IN_COMMON;
        }
    }
    for (words, bit) in super::names::word_classes()
        .into_iter()
        .chain(super::address::word_classes())
    {
        for w in words {
            *flags.entry(w.to_string()).or_default() |= bit;
        }
    }
    Lexicon {
        common,
        flags,
        model,
    }
});

/// Character-trigram naive Bayes: name vs ordinary word, trained at first use on the shipped
/// lists (a few thousand words, cheap enough for first use). It generalises the gazetteers to unseen
/// names through spelling: diacritics and endings such as -ová, -sen, -ski, -ez weigh towards
/// a name, -tion, -ing, -ly towards a word.
struct NameModel {
    /// Keyed by [`NameModel::pack`]ed trigrams: one hash round per lookup, where a `[char; 3]`
    /// key hashes its length and each char.
    logodds: HashMap<u64, f32, BuildHasherDefault<FxHasher>>,
    prior: f32,
}

impl NameModel {
    /// A trigram as one integer (a char fits in 21 bits).
    fn pack(g: [char; 3]) -> u64 {
        (u64::from(g[0]) << 42) | (u64::from(g[1]) << 21) | u64::from(g[2])
    }

    fn grams(w: &str) -> impl Iterator<Item = [char; 3]> + '_ {
        let cs: Vec<char> = std::iter::once('^')
            .chain(w.chars())
            .chain(std::iter::once('$'))
            .collect();
        (0..cs.len().saturating_sub(2))
            .map(move |i| [cs[i], cs[i + 1], cs[i + 2]])
            .collect::<Vec<_>>()
            .into_iter()
    }

    fn train<'a>(pos: impl Iterator<Item = &'a str>, neg: impl Iterator<Item = &'a str>) -> Self {
        let mut cp: HashMap<[char; 3], u32> = HashMap::new();
        let mut cn: HashMap<[char; 3], u32> = HashMap::new();
        let (mut np, mut nn) = (0u32, 0u32);
        for w in pos {
            for g in Self::grams(w) {
                *cp.entry(g).or_default() += 1;
                np += 1;
            }
        }
        for w in neg {
            for g in Self::grams(w) {
                *cn.entry(g).or_default() += 1;
                nn += 1;
            }
        }
        let vocab: HashSet<[char; 3]> = cp.keys().chain(cn.keys()).copied().collect();
        let v = vocab.len() as f32;
        let alpha = 0.5f32;
        let dp = np as f32 + alpha * v;
        let dn = nn as f32 + alpha * v;
        let logodds = vocab
            .into_iter()
            .map(|g| {
                let p = (*cp.get(&g).unwrap_or(&0) as f32 + alpha) / dp;
                let n = (*cn.get(&g).unwrap_or(&0) as f32 + alpha) / dn;
                (Self::pack(g), (p / n).ln())
            })
            .collect();
        Self {
            logodds,
            prior: (alpha / dp / (alpha / dn)).ln(),
        }
    }

    fn score(&self, key: &str) -> f32 {
        let mut sum = 0.0;
        let mut n = 0;
        // same trigrams as `grams`, without allocating
        let mut it = key.chars().chain(std::iter::once('$'));
        let mut a = '^';
        let Some(mut b) = it.next() else {
            return 0.0;
        };
        for c in it {
            let g = [a, b, c];
            a = b;
            b = c;
            // Non-Latin-1 letters are rare in English words: count them as name evidence.
            let v = match self.logodds.get(&Self::pack(g)) {
                Some(v) => *v,
                None if g.iter().any(|c| (*c as u32) > 0x17f) => 0.5,
                None => self.prior,
            };
            sum += v;
            n += 1;
        }
        if n == 0 { 0.0 } else { sum / n as f32 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_and_model() {
        assert_eq!(fold("Jürgen"), "jurgen");
        assert_eq!(fold("Straße"), "strasse");
        let long = "Ü".repeat(40);
        for w in [
            "Jürgen",
            "Straße",
            "ÆTHELRED",
            "Αθήνα",
            "Šárka-Ottová",
            &long,
        ] {
            assert_eq!(fold_key(w).as_str(), fold(w));
        }
        let l = &*LEX;
        assert!(l.class("jurgen") & IN_FIRST != 0);
        // the frequent words are searched by bisection: written sorted, each once
        assert!(FREQUENT_WORDS.windows(2).all(|w| w[0] < w[1]));
        assert!(frequent_word("Wakker") && frequent_word("ВРЕМЯ") && !frequent_word("Lebedeva"));
        assert!(l.name_score("kowalczyk") > l.name_score("information"));
    }

    #[test]
    fn tokens() {
        let t = "Hi <PERSON>, Kurt-Schumacher-Str. 5/8";
        let toks = tokenize(t);
        assert!(toks[1].sentinel && toks[2].sentinel && toks[3].sentinel);
        assert_eq!(toks[5].text(t), "Kurt-Schumacher-Str");
        assert_eq!(toks[7].text(t), "5/8");
    }

    /// Everything a token holds, comparable.
    type Fields = (usize, usize, Kind, [bool; 5], String, usize, u32);

    fn fields(toks: &[Tok]) -> Vec<Fields> {
        toks.iter()
            .map(|t| {
                let flags = [t.cap, t.all_caps, t.nl_before, t.sp_before, t.sentinel];
                (
                    t.s,
                    t.e,
                    t.kind,
                    flags,
                    t.key.to_string(),
                    t.key_chars,
                    t.cls,
                )
            })
            .collect()
    }

    /// Text pieces that exercise every tokenizer rule near a splice: joiners, possessives
    /// (and the pronouns that are not), sentinel-like brackets, line breaks, non-ASCII.
    const PIECES: &[&str] = &[
        "Ann",
        "ann",
        "'s",
        "’s",
        "'",
        "’",
        "s",
        "-",
        "/",
        "x",
        " ",
        "  ",
        "\n",
        "\r\n",
        "\t",
        "<",
        ">",
        "<PERSON>",
        "EMAIL",
        "It",
        "it",
        "12",
        "3a",
        ".",
        ",",
        "Jürgen",
        "Αθήνα",
        "é",
        "_",
        ":",
        "SECRET:",
        "Müller's",
        "O'Brien",
        "a-b",
        "5/8",
    ];

    proptest::proptest! {
        #[test]
        fn retokenize_equals_tokenizing_the_spliced_text(
            pieces in proptest::collection::vec(proptest::sample::select(PIECES), 0..40),
            cuts in proptest::collection::vec((0usize..200, 1usize..12, 0usize..4), 0..6),
        ) {
            let text: String = pieces.concat();
            let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            // sorted, disjoint, non-empty spans on char boundaries
            let mut spans = Vec::new();
            let mut from = 0;
            for (gap, len, label) in cuts {
                let Some(&s) = bounds.iter().find(|&&b| b >= from + gap % 20) else { break };
                let Some(&e) = bounds.iter().find(|&&b| b >= s + len) else { break };
                let sentinel = ["<EMAIL>", "<PERSON>", "<SECRET:x>", "<ADDRESS>"][label];
                spans.push((s, e, sentinel));
                from = e;
            }
            let toks = tokenize(&text);
            let spliced = Spliced::new(&text, spans);
            proptest::prop_assert_eq!(
                fields(&retokenize(&toks, &spliced)),
                fields(&tokenize(&spliced.text))
            );
        }
    }
}
