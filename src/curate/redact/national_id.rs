//! National person numbers, typed SSN: the number a state gives each person for social security, tax or identity
//! (the US SSN, a personnummer, an INSEE number, a codice fiscale, a PESEL, …). Two ways in:
//! - after a cue that names one (`SSN:`, `personnummer`, `PESEL`, `ЕГН`, `주민등록번호`, …), a value shaped like an
//!   identifier: runs of capitals and digits joined by `-`, `.` or `/`, or by a space before more digits;
//! - bare, where the format and its check digit (or the birth date it holds) are specific enough to stand alone:
//!   Swiss AHV, Brazilian CPF, Korean RRN, Swedish personnummer, Finnish HETU, Chinese resident id, Italian codice
//!   fiscale, Spanish DNI and NIE, French INSEE, Taiwanese id, Argentine CUIL, Thai id, Belgian national number and
//!   the British NINO. Numbers that only a cue tells apart from other digits (PESEL, BSN, SIN, …) need the cue.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, MatchKind};
use regex::bytes::Regex;
use smallvec::SmallVec;

use super::{Cand, PiiType, prio, structured};

/// Words that name a national person number, lower case where ASCII (matched without regard to ASCII case), each
/// of three bytes or more (see [`cue_heads`]).
pub(super) const CUES: &[&str] = &[
    "ssn",
    "social security",
    "social-security",
    "social insurance",
    "national insurance",
    "ni number",
    "nino",
    "taxpayer id",
    "tax id",
    "tax identification",
    "tax number",
    "national id",
    "national identity",
    "national identification",
    "national number",
    "identity number",
    "identification number",
    "personal id",
    "personal identification",
    "personal code",
    "citizen id",
    "s\u{e9}curit\u{e9} sociale",
    "securite sociale",
    "seguridad social",
    "seguran\u{e7}a social",
    "sozialversicherungsnummer",
    "versicherungsnummer",
    "sv-nummer",
    "steuer-id",
    "steueridentifikationsnummer",
    "personnummer",
    "personnr",
    "f\u{f8}dselsnummer",
    "fodselsnummer",
    "henkil\u{f6}tunnus",
    "hetu",
    "pesel",
    "burgerservicenummer",
    "rijksregisternummer",
    "codice fiscale",
    "isikukood",
    "asmens kodas",
    "personas kods",
    "rodn\u{e9} \u{10d}\u{ed}slo",
    "rodne cislo",
    "em\u{161}o",
    "emso",
    "jmbg",
    "tckn",
    "kimlik",
    "dni",
    "curp",
    "cuil",
    "cpf",
    "aadhaar",
    "nric",
    "hkid",
    "mykad",
    "\u{415}\u{413}\u{41d}",
    "\u{415}\u{41c}\u{411}\u{413}",
    "\u{408}\u{41c}\u{411}\u{413}",
    "\u{421}\u{41d}\u{418}\u{41b}\u{421}",
    "\u{418}\u{41d}\u{41d}",
    "\u{420}\u{41d}\u{41e}\u{41a}\u{41f}\u{41f}",
    "\u{391}\u{39c}\u{39a}\u{391}",
    "\u{391}\u{3a6}\u{39c}",
    "\u{c8fc}\u{bbfc}\u{b4f1}\u{b85d}\u{bc88}\u{d638}",
    "\u{8eab}\u{4efd}\u{8bc1}",
    "\u{8eab}\u{5206}\u{8b49}",
    "\u{30de}\u{30a4}\u{30ca}\u{30f3}\u{30d0}\u{30fc}",
    "\u{500b}\u{4eba}\u{756a}\u{53f7}",
    "\u{e40}\u{e25}\u{e02}\u{e1b}\u{e23}\u{e30}\u{e08}\u{e33}\u{e15}\u{e31}\u{e27}",
];

const _: () = {
    let mut i = 0;
    while i < CUES.len() {
        assert!(CUES[i].len() >= 3, "a cue's head is three bytes");
        i += 1;
    }
};

/// Cues that are also everyday words, parts of words or other acronyms in lower or mixed case (`sin`, `run`,
/// `setting`, `apps`, `nie` in Polish and German): they count only in capitals, so their automaton is apart from
/// [`CUES`]' and heeds case.
const CAPITAL_CUES: &[&str] = &[
    "SIN", "TIN", "ITIN", "INSEE", "NIR", "AHV", "AVS", "CPR", "BSN", "EGN", "OIB", "CNP", "AMKA",
    "NIE", "NIF", "NSS", "RFC", "CUIT", "RUT", "RUN", "PPS", "PPSN", "TFN", "SSS",
];

/// Words between a cue and its value (`SSN no.: `, `personnummer är `, `PESEL: `).
const FILLERS: &[&str] = &[
    "no",
    "nr",
    "number",
    "num",
    "nummer",
    "numero",
    "n\u{fa}mero",
    "num\u{e9}ro",
    "n\u{b0}",
    "n\u{ba}",
    "is",
    "was",
    "ist",
    "lautet",
    "est",
    "es",
    "\u{e4}r",
    "er",
    "on",
    "je",
    "jest",
    "\u{e9}",
    "code",
    "kod",
    "card",
];

static CUE_AC: LazyLock<AhoCorasick> = LazyLock::new(|| {
    AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::LeftmostLongest)
        .build(CUES)
        // constant short literals: building cannot fail
        .expect("constant national id cue automaton")
});

static CAPITAL_CUE_AC: LazyLock<AhoCorasick> = LazyLock::new(|| {
    AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(CAPITAL_CUES)
        // constant short literals: building cannot fail
        .expect("constant national id cue automaton")
});

fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

/// A hash of a cue's first three bytes, ASCII lower-cased, into [`CUE_HEADS`].
fn head_hash(h: &[u8]) -> usize {
    let l = |c: u8| usize::from(c.to_ascii_lowercase());
    (l(h[0]) * 961 + l(h[1]) * 31 + l(h[2])) % 4096
}

/// A bit per [`head_hash`] of each of [`CUES`].
static CUE_HEADS: LazyLock<[u64; 64]> = LazyLock::new(|| {
    let mut t = [0u64; 64];
    for c in CUES {
        let h = head_hash(c.as_bytes());
        t[h / 64] |= 1 << (h % 64);
    }
    t
});

/// Bit `i` set where `piece[i]` is not an ASCII letter or digit, and bit `i` set where it is not one and ASCII
/// (punctuation, space, control): on x86-64 SSE2's compares and byte masks, 16 bytes at a time.
#[cfg(target_arch = "x86_64")]
fn boundary_masks(piece: &[u8; 16]) -> (u16, u16) {
    // SAFETY: SSE2 is part of every x86-64 CPU.
    unsafe { boundary_masks_sse2(piece) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn boundary_masks_sse2(piece: &[u8; 16]) -> (u16, u16) {
    use std::arch::x86_64::*;
    // SAFETY: an unaligned 16-byte load from a 16-byte array.
    let v = unsafe { _mm_loadu_si128(piece.as_ptr().cast()) };
    // a byte is a digit when `v - '0'` is at most 9 unsigned, a letter when `(v | 0x20) - 'a'` is at most 25
    let d = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
    let digit = _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d);
    let l = _mm_sub_epi8(
        _mm_or_si128(v, _mm_set1_epi8(0x20)),
        _mm_set1_epi8(b'a' as i8),
    );
    let letter = _mm_cmpeq_epi8(_mm_min_epu8(l, _mm_set1_epi8(25)), l);
    let alnum = _mm_movemask_epi8(_mm_or_si128(digit, letter)) as u16;
    let non_ascii = _mm_movemask_epi8(v) as u16;
    (!alnum, !alnum & !non_ascii)
}

#[cfg(not(target_arch = "x86_64"))]
fn boundary_masks(piece: &[u8; 16]) -> (u16, u16) {
    boundary_masks_portable(piece)
}

#[cfg(any(test, not(target_arch = "x86_64")))]
fn boundary_masks_portable(piece: &[u8; 16]) -> (u16, u16) {
    piece.iter().enumerate().fold((0, 0), |(b, a), (i, &x)| {
        let other = !x.is_ascii_alphanumeric();
        (
            b | u16::from(other) << i,
            a | u16::from(other && x.is_ascii()) << i,
        )
    })
}

/// Whether one of [`CUES`], and whether one of [`CAPITAL_CUES`], may start where [`cued`] takes a cue: after a byte
/// that is not an ASCII letter or digit. A look at those places' first three bytes answers for most texts, so that
/// the automata run only where a cue may be.
fn cue_heads(b: &[u8]) -> (bool, bool) {
    let t = &*CUE_HEADS;
    let (mut lower, mut capital) = (false, false);
    // after a byte that is not an ASCII letter or digit, and not itself ASCII punctuation or space
    let mut after_boundary = true;
    for (c, chunk) in b.chunks(16).enumerate() {
        // (the tail padded with spaces, which start nothing)
        let mut piece = [b' '; 16];
        piece[..chunk.len()].copy_from_slice(chunk);
        let (boundary, ascii_other) = boundary_masks(&piece);
        let mut starts = (boundary << 1 | u16::from(after_boundary)) & !ascii_other;
        after_boundary = boundary >> 15 != 0;
        while starts != 0 {
            let p = c * 16 + starts.trailing_zeros() as usize;
            starts &= starts - 1;
            let Some(h) = b.get(p..p + 3) else {
                break;
            };
            let k = head_hash(h);
            lower |= t[k / 64] >> (k % 64) & 1 != 0;
            capital |= h.iter().all(u8::is_ascii_uppercase);
            if lower && capital {
                return (true, true);
            }
        }
    }
    (lower, capital)
}

/// Values after a cue: one of [`CUES`] or of [`CAPITAL_CUES`].
pub(super) fn cued(b: &[u8], out: &mut Vec<Cand>) {
    let (lower, capital) = cue_heads(b);
    cued_by(b, lower, capital, out);
}

/// [`cued`], searching for [`CUES`] if `lower` and for [`CAPITAL_CUES`] if `capital`.
fn cued_by(b: &[u8], lower: bool, capital: bool, out: &mut Vec<Cand>) {
    let cues = lower.then(|| CUE_AC.find_iter(b)).into_iter().flatten();
    let capitals = capital
        .then(|| CAPITAL_CUE_AC.find_iter(b))
        .into_iter()
        .flatten();
    for m in cues.chain(capitals) {
        let (s, e) = (m.start(), m.end());
        if (s > 0 && alnum(b[s - 1])) || (e < b.len() && b[e].is_ascii_alphabetic()) {
            continue;
        }
        let Some(vs) = skip_fillers(b, e) else {
            continue;
        };
        // `SIN` is also Sinaloa, before its postcode in a Mexican address: it needs more than a
        // space before its value.
        if &b[s..e] == b"SIN" && b[e..vs].iter().all(|&c| c == b' ') {
            continue;
        }
        if let Some(ve) = value_end(b, vs) {
            out.push(Cand::new(
                vs,
                ve,
                PiiType::Ssn,
                "national-id-cue",
                0.9,
                prio::SSN,
            ));
        }
    }
}

/// Where the value after a cue ending at `i` starts: past punctuation, quotes, a bracketed aside and filler words,
/// within 40 bytes.
fn skip_fillers(b: &[u8], mut i: usize) -> Option<usize> {
    let limit = (i + 40).min(b.len());
    while i < limit {
        let c = b[i];
        if matches!(
            c,
            b' ' | b'\t' | b':' | b'#' | b'=' | b'-' | b'.' | b'"' | b'\'' | b'>' | b','
        ) {
            i += 1;
        } else if b[i..].starts_with("\u{2013}".as_bytes())
            || b[i..].starts_with("\u{2014}".as_bytes())
            || b[i..].starts_with("\u{ff1a}".as_bytes())
        {
            i += 3;
        } else if c == b'(' {
            let close = b[i..limit].iter().position(|&x| x == b')')?;
            i += close + 1;
        } else if let Some(f) = FILLERS.iter().find(|f| {
            let f = f.as_bytes();
            b.len() >= i + f.len()
                && b[i..i + f.len()].eq_ignore_ascii_case(f)
                && b.get(i + f.len()).is_none_or(|&n| !n.is_ascii_alphabetic())
        }) {
            i += f.len();
        } else {
            return Some(i);
        }
    }
    None
}

/// A run of capitals and digits starting at `i`, and its end.
fn group(b: &[u8], i: usize) -> usize {
    let mut e = i;
    while e < b.len() && (b[e].is_ascii_uppercase() || b[e].is_ascii_digit()) {
        e += 1;
    }
    e
}

/// The end of an identifier starting at `s`, if one does: 6 to 24 capitals and digits, at least 6 of them digits,
/// in groups joined by `-`, `.` or `/`, or by a space before a group with a digit (the British NINO's closing letter
/// too), and not a date.
fn value_end(b: &[u8], s: usize) -> Option<usize> {
    let mut e = group(b, s);
    if e == s {
        return None;
    }
    let first_letters = b[s..e].iter().all(u8::is_ascii_uppercase);
    while let Some(&sep) = b.get(e) {
        let next = group(b, e + 1);
        if next == e + 1 {
            break;
        }
        let has_digit = b[e + 1..next].iter().any(u8::is_ascii_digit);
        let nino_tail =
            sep == b' ' && first_letters && next == e + 2 && b.get(next).is_none_or(|&c| !alnum(c));
        if matches!(sep, b'-' | b'.' | b'/') || (sep == b' ' && (has_digit || nino_tail)) {
            e = next;
        } else {
            break;
        }
    }
    if b.get(e).is_some_and(|&c| alnum(c)) {
        return None;
    }
    let v = &b[s..e];
    let (digits, letters) = v.iter().fold((0, 0), |(d, l), c| {
        (
            d + usize::from(c.is_ascii_digit()),
            l + usize::from(c.is_ascii_uppercase()),
        )
    });
    // (five digits, a dash and four more are a US ZIP+4 code)
    let zip4 = v.len() == 10 && v[5] == b'-' && digits == 9;
    if digits < 6 || digits + letters > 24 || structured::is_date_like(v) || zip4 || unissued_ssn(v)
    {
        return None;
    }
    Some(e)
}

/// A US SSN's shape (`123-45-6789`, `123 45 6789`) with a part never issued: area 000 or 666, group 00, serial
/// 0000. Such numbers are placeholders, whatever cue names them.
fn unissued_ssn(v: &[u8]) -> bool {
    let shaped = v.len() == 11
        && matches!(v[3], b'-' | b' ')
        && v[6] == v[3]
        && [0..3, 4..6, 7..11]
            .iter()
            .all(|r| v[r.clone()].iter().all(u8::is_ascii_digit));
    let part = |r: std::ops::Range<usize>| num(&digits_of(&v[r])) as u32;
    shaped && !structured::ssn_parts_issued(part(0..3), part(4..6), part(7..11))
}

/// Every bare format written without spaces, one alternative each, matched against a whole token; [`valid_bare`]
/// tells them apart by shape and validates.
static BARE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?-u)^(?:756\.[0-9]{4}\.[0-9]{4}\.[0-9]{2}",
        r"|[0-9]{3}\.[0-9]{3}\.[0-9]{3}-[0-9]{2}",
        r"|[0-9]{2}\.[0-9]{2}\.[0-9]{2}-[0-9]{3}\.[0-9]{2}",
        r"|[0-9]-[0-9]{4}-[0-9]{5}-[0-9]{2}-[0-9]",
        r"|(?:20|23|24|27|30|33|34)-[0-9]{8}-[0-9]",
        r"|[0-9]{17}[0-9X]",
        r"|[0-9]{8}-[0-9]{4}",
        r"|[0-9]{6}-[0-9]{7}",
        r"|[0-9]{6}[-+A-FU-Y][0-9]{3}[0-9A-Y]",
        r"|[12][0-9]{4}(?:[0-9]{2}|2[AB])[0-9]{8}",
        r"|[A-Z]{6}[0-9LMNP-V]{2}[A-EHLMPR-T][0-9LMNP-V]{2}[A-Z][0-9LMNP-V]{3}[A-Z]",
        r"|[XYZ]-?[0-9]{7}-?[A-Z]|[0-9]{8}-?[A-Z]",
        r"|[A-Z][12][0-9]{8}",
        r"|[A-Z]{2}[0-9]{6}[A-D])$",
    ))
    // a constant pattern, covered by every test run
    .expect("constant national id regex")
});

/// The two formats written with spaces, from their first group: INSEE `1 75 09 17 300 379 64` and NINO
/// `AB 12 34 56 C`.
static BARE_SPACED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?-u)^(?:[12] [0-9]{2} [0-9]{2} (?:[0-9]{2}|2[AB]) [0-9]{3} [0-9]{3} [0-9]{2}|[A-Z]{2} [0-9]{2} [0-9]{2} [0-9]{2} [A-Z])$")
        // a constant pattern, covered by every test run
        .expect("constant national id regex")
});

/// Bare national numbers whose format and check hold (see the module's list). A walk from digit to digit picks
/// the few candidate tokens, so that the formats' regex only matches whole tokens: searched for all at once and
/// unanchored, its states multiply.
pub(super) fn bare(b: &[u8], out: &mut Vec<Cand>) {
    let n = b.len();
    let sep = |c: u8| matches!(c, b'-' | b'.' | b'+');
    let mut i = 0;
    loop {
        // every token this looks at holds a digit: from one, back to the token's start
        let d = super::structured::next_digit(b, i);
        if d >= n {
            break;
        }
        let mut s = d;
        while s > i && (alnum(b[s - 1]) || (s >= 2 && sep(b[s - 1]) && alnum(b[s - 2]))) {
            s -= 1;
        }
        // the head of a spaced NINO is two capitals before the first digits
        if s >= 3
            && b[s - 1] == b' '
            && b[s - 3..s - 1].iter().all(u8::is_ascii_uppercase)
            && (s == 3 || !alnum(b[s - 4]))
        {
            s -= 3;
        }
        let mut e = s;
        while e < n && (alnum(b[e]) || (sep(b[e]) && e + 1 < n && alnum(b[e + 1]))) {
            e += 1;
        }
        i = e.max(d + 1);
        // glued to more: `x_756…`, `v1.870708…`, `…/12345678Z`
        let glued = |c: u8| matches!(c, b'_' | b'/' | b'-' | b'.');
        if (s > 0 && glued(b[s - 1])) || (e < n && (b[e] == b'_' || b[e] == b'/')) {
            continue;
        }
        let tok = &b[s..e];
        let spaced_head = (tok.len() == 1 && matches!(tok[0], b'1' | b'2'))
            || (tok.len() == 2 && tok.iter().all(u8::is_ascii_uppercase));
        let (s, e) = if spaced_head {
            let len = if tok.len() == 1 { 21 } else { 13 };
            let e = s + len;
            if e > n || b.get(e).is_some_and(|&c| alnum(c)) || !BARE_SPACED.is_match(&b[s..e]) {
                continue;
            }
            i = e;
            (s, e)
        } else {
            let digits = tok.iter().filter(|c| c.is_ascii_digit()).count();
            if digits < 6 || !(9..=18).contains(&tok.len()) || !BARE.is_match(tok) {
                continue;
            }
            (s, e)
        };
        if valid_bare(&b[s..e]) {
            out.push(Cand::new(
                s,
                e,
                PiiType::Ssn,
                "national-id",
                0.85,
                prio::SSN,
            ));
        }
    }
}

fn digits_of(v: &[u8]) -> Vec<u32> {
    v.iter()
        .filter(|c| c.is_ascii_digit())
        .map(|&c| u32::from(c - b'0'))
        .collect()
}

fn num(d: &[u32]) -> u64 {
    d.iter().fold(0u64, |a, &x| a * 10 + u64::from(x))
}

fn valid_bare(v: &[u8]) -> bool {
    let d = digits_of(v);
    if v.starts_with(b"756.") {
        return ean13(&d);
    }
    if v[0].is_ascii_uppercase() {
        return match v.len() {
            16 => codice_fiscale(v),
            10 if v[1].is_ascii_digit() => taiwanese(v),
            _ if d.len() == 6 => nino(v),
            _ => spanish(v),
        };
    }
    if v.contains(&b'.') {
        return match v.len() {
            14 => cpf(&d),
            _ => belgian(&d),
        };
    }
    if v.contains(&b' ') || (v.len() == 15 && d.len() >= 14) {
        return insee(v);
    }
    match (v.len(), d.len()) {
        (17, 13) => thai(&d),
        (13, 11) => cuil(&d),
        (13, 12) => date_ok(num(&d[4..6]), num(&d[6..8])) && luhn(&d[2..]),
        (14, 13) => korean(&d),
        (11, 10) => swedish(&d) || finnish(v),
        (11, 9) => finnish(v),
        (18, _) => chinese(v),
        (9 | 10, 8) => spanish(v),
        _ => false,
    }
}

/// The card check ([`structured::luhn`]) over digit values.
fn luhn(d: &[u32]) -> bool {
    let ascii: SmallVec<[u8; 16]> = d.iter().map(|&x| b'0' + x as u8).collect();
    structured::luhn(&ascii)
}

fn date_ok(m: u64, d: u64) -> bool {
    (1..=12).contains(&m) && (1..=31).contains(&d)
}

/// Swiss AHV (EAN-13 check digit).
fn ean13(d: &[u32]) -> bool {
    let s: u32 = d[..12]
        .iter()
        .enumerate()
        .map(|(i, &x)| if i % 2 == 0 { x } else { 3 * x })
        .sum();
    (10 - s % 10) % 10 == d[12]
}

/// Brazilian CPF: two mod-11 check digits.
fn cpf(d: &[u32]) -> bool {
    if d.iter().all(|&x| x == d[0]) {
        return false;
    }
    let c1 = (0..9).map(|i| d[i] * (10 - i as u32)).sum::<u32>() * 10 % 11 % 10;
    let c2 = (0..10).map(|i| d[i] * (11 - i as u32)).sum::<u32>() * 10 % 11 % 10;
    c1 == d[9] && c2 == d[10]
}

/// Belgian national number `YY.MM.DD-NNN.CC`: mod 97, born before or after 2000.
fn belgian(d: &[u32]) -> bool {
    let base = num(&d[..9]);
    let check = num(&d[9..]);
    date_ok(num(&d[2..4]), num(&d[4..6]))
        && (97 - base % 97 == check || 97 - (2_000_000_000 + base) % 97 == check)
}

/// Thai citizen id: mod-11 check digit.
fn thai(d: &[u32]) -> bool {
    let s: u32 = (0..12).map(|i| d[i] * (13 - i as u32)).sum();
    (11 - s % 11) % 10 == d[12]
}

/// Argentine CUIL/CUIT: mod-11 check digit.
fn cuil(d: &[u32]) -> bool {
    const W: [u32; 10] = [5, 4, 3, 2, 7, 6, 5, 4, 3, 2];
    let r = 11 - W.iter().zip(d).map(|(w, x)| w * x).sum::<u32>() % 11;
    let r = match r {
        11 => 0,
        10 => 9,
        r => r,
    };
    r == d[10]
}

/// Chinese resident id: region, birth date, ISO 7064 MOD 11-2 check.
fn chinese(v: &[u8]) -> bool {
    const W: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
    let d = digits_of(&v[..17]);
    let year = num(&d[6..10]);
    let s: u32 = W.iter().zip(&d).map(|(w, x)| w * x).sum();
    (1..=8).contains(&d[0])
        && (1900..=2099).contains(&year)
        && date_ok(num(&d[10..12]), num(&d[12..14]))
        && b"10X98765432"[(s % 11) as usize] == v[17]
}

/// Korean RRN `YYMMDD-GNNNNNN`: a birth date and a sex-and-century digit (the check digit was dropped in 2020).
fn korean(d: &[u32]) -> bool {
    date_ok(num(&d[2..4]), num(&d[4..6])) && (1..=8).contains(&d[6])
}

/// Swedish personnummer `YYMMDD-NNNC`: a birth date (day + 60 for a coordination number) and Luhn.
fn swedish(d: &[u32]) -> bool {
    let day = num(&d[4..6]);
    date_ok(num(&d[2..4]), if day > 60 { day - 60 } else { day }) && luhn(d)
}

/// Finnish HETU `DDMMYY-NNNC`: a birth date and a check character, mod 31.
fn finnish(v: &[u8]) -> bool {
    const CHECK: &[u8] = b"0123456789ABCDEFHJKLMNPRSTUVWXY";
    if v.len() != 11 || !v[7..10].iter().all(u8::is_ascii_digit) {
        return false;
    }
    let d = digits_of(&v[..6]);
    let n = num(&d) * 1000 + num(&digits_of(&v[7..10]));
    date_ok(num(&d[2..4]), num(&d[..2])) && CHECK[(n % 31) as usize] == v[10]
}

/// Italian codice fiscale: the check letter over the 15 characters before it.
fn codice_fiscale(v: &[u8]) -> bool {
    const ODD: [u32; 26] = [
        1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24,
        23,
    ];
    let s: u32 = v[..15]
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let k = if c.is_ascii_digit() {
                u32::from(c - b'0')
            } else {
                u32::from(c - b'A')
            };
            if i % 2 == 0 { ODD[k as usize] } else { k }
        })
        .sum();
    u32::from(v[15] - b'A') == s % 26
}

/// French INSEE (NIR): sex, year, month, department (2A/2B for Corsica), and a key, mod 97.
fn insee(v: &[u8]) -> bool {
    let c: Vec<u8> = v.iter().copied().filter(|&x| x != b' ').collect();
    if c.len() != 15 || !(1..=12).contains(&num(&digits_of(&c[3..5]))) {
        return false;
    }
    let mut body = c[..13].to_vec();
    match &body[5..7] {
        b"2A" => body[5..7].copy_from_slice(b"19"),
        b"2B" => body[5..7].copy_from_slice(b"18"),
        _ => {}
    }
    if !body.iter().all(u8::is_ascii_digit) || !c[13..].iter().all(u8::is_ascii_digit) {
        return false;
    }
    97 - num(&digits_of(&body)) % 97 == num(&digits_of(&c[13..]))
}

/// Taiwanese national id: a letter for the place of registration, the sex digit, and a check digit.
fn taiwanese(v: &[u8]) -> bool {
    const LETTERS: &[u8] = b"ABCDEFGHJKLMNPQRSTUVXYWZIO";
    let Some(code) = LETTERS.iter().position(|&c| c == v[0]) else {
        return false;
    };
    let code = code as u32 + 10;
    let d = digits_of(&v[1..]);
    let w = [8, 7, 6, 5, 4, 3, 2, 1, 1];
    let s = code / 10 + code % 10 * 9 + w.iter().zip(&d).map(|(w, x)| w * x).sum::<u32>();
    s.is_multiple_of(10)
}

/// British NINO: spaced `AB 12 34 56 C` as written on the card, or run together with a valid prefix and suffix.
fn nino(v: &[u8]) -> bool {
    if v.contains(&b' ') {
        return true;
    }
    const NOT_FIRST: &[u8] = b"DFIQUV";
    const NOT_SECOND: &[u8] = b"DFIOQUV";
    const NOT_PAIRS: &[&[u8]] = &[b"BG", b"GB", b"KN", b"NK", b"NT", b"TN", b"ZZ"];
    !NOT_FIRST.contains(&v[0]) && !NOT_SECOND.contains(&v[1]) && !NOT_PAIRS.contains(&&v[..2])
}

/// Spanish DNI `12345678Z` and NIE `X1234567L`: the letter is the number mod 23.
fn spanish(v: &[u8]) -> bool {
    const LETTERS: &[u8] = b"TRWAGMYFPDXBNJZSQVHLCKE";
    let c: Vec<u8> = v.iter().copied().filter(|&x| x != b'-').collect();
    let (lead, rest) = match c[0] {
        b'X' => (0, &c[1..]),
        b'Y' => (1, &c[1..]),
        b'Z' => (2, &c[1..]),
        _ => (0, &c[..]),
    };
    let Some((&letter, digits)) = rest.split_last() else {
        return false;
    };
    if !digits.iter().all(u8::is_ascii_digit) || c.len() != 9 {
        return false;
    }
    let n = lead * 10_000_000 + num(&digits_of(digits));
    LETTERS[(n % 23) as usize] == letter
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        cued(text.as_bytes(), &mut out);
        bare(text.as_bytes(), &mut out);
        let mut v: Vec<&str> = out.iter().map(|c| &text[c.start..c.end]).collect();
        v.dedup();
        v
    }

    #[test]
    fn bare_numbers_need_their_check() {
        // Each: a number with a valid check, then the same with its check digit or letter changed.
        let cases = [
            ("756.7893.4510.65", "756.7893.4510.66"),
            ("459.455.156-47", "459.455.156-48"),
            ("870708-2932879", "871308-2932879"),
            ("680512-8862", "680512-8863"),
            ("210543-464M", "210543-464N"),
            ("450100196805127786", "450100196805127787"),
            ("ZCCRSR57P68G294X", "ZCCRSR57P68G294Y"),
            ("12345678Z", "12345678A"),
            ("X1234567L", "X1234567M"),
            ("271085746352196", "271085746352197"),
            ("2 23 07 2B 033 781 23", "2 23 07 2B 033 781 24"),
            ("O278932873", "O278932874"),
            ("23-31358677-4", "23-31358677-5"),
            ("8-8115-59223-66-7", "8-8115-59223-66-8"),
            ("95.10.04-574.13", "95.10.04-574.14"),
            ("AB 12 34 56 C", "AB 12 34 56"),
            ("AB123456C", "ZZ123456C"),
        ];
        for (ok, bad) in cases {
            let text = format!("here: {ok} and");
            assert_eq!(found(&text), vec![ok], "{ok}");
            assert!(found(&format!("here: {bad} and")).is_empty(), "{bad}");
        }
    }

    #[test]
    fn a_cue_takes_any_identifier_shape() {
        for (text, want) in [
            ("SSN: 982-59-7919.", "982-59-7919"),
            ("PESEL 95100487787", "95100487787"),
            (
                "Mein Sozialversicherungsnummer lautet 8879041095!",
                "8879041095",
            ),
            ("personnummer: 19870807-6065", "19870807-6065"),
            (
                "national insurance number ZZ 98 25 97 T please",
                "ZZ 98 25 97 T",
            ),
            ("SIN (Canada): 448 844 142", "448 844 142"),
            ("SIN no. 046 454 286", "046 454 286"),
            ("\"ssn\": \"V-9752525\"", "V-9752525"),
            ("ЕГН 7523169263", "7523169263"),
            ("주민등록번호: 980215-1979190", "980215-1979190"),
        ] {
            assert_eq!(found(text), vec![want], "{text}");
        }
    }

    #[test]
    fn a_cue_without_an_identifier_finds_nothing() {
        for text in [
            "What is a SIN number? It has 9 digits.",
            "sin 123456789 is an odd way to start", // a word, not the acronym
            "SSN format is three digits, two, four",
            "social security: 2021-03-04",
            "born 12/03/1985, SSN pending",
            "run 1234567 times",
            "my SSN is 123 and the rest",
            // Sinaloa and its postcode, in a Mexican address
            "Privada Zambia 927, Vieja Bahamas, SIN 05932-1482",
            "SSN: 89932-5041",
            // placeholders: parts never issued
            "ssn 666-12-3456 and 000-12-3456 and 123-00-4567",
            "SSN: 123 45 0000",
        ] {
            assert!(found(text).is_empty(), "{text}: {:?}", found(text));
        }
    }

    #[test]
    fn a_number_glued_to_more_is_not_bare() {
        for text in [
            "id 12345678Z9",
            "x756.7893.4510.65",
            "450100196805127786-1",
            "v1.870708-2932879",
        ] {
            assert!(found(text).is_empty(), "{text}: {:?}", found(text));
        }
    }

    /// Fragments of texts with cues at and off word starts, in any case, glued to letters, digits or non-ASCII
    /// letters, beside values.
    const CUE_PARTS: &[&str] = &[
        "SSN",
        "ssn",
        "Ssn",
        "xssn",
        "PESEL",
        "pesel",
        "personnummer",
        "Personnummer",
        "NIE",
        "nie",
        "SIN",
        "ЕГН",
        "é",
        "ö",
        "fødselsnummer",
        "sécurité sociale",
        "tax id",
        "TAX ID",
        "vers",
        "versicherungsnummer",
        " ",
        ": ",
        "-",
        ".",
        "(",
        "1",
        "12",
        "123-45-6789",
        "870708-2932879",
        "AB 12 34 56 C",
        "a",
        "Z",
        "_",
        "\n",
        "ЕГН: 7501020018",
        "pesel 44051401359",
        "SIN 046 454 286",
    ];

    proptest::proptest! {
        /// The look at word starts never keeps an automaton from a text where it would find a cue's value.
        #[test]
        fn cue_heads_skip_only_texts_without_a_cue(
            parts in proptest::collection::vec(proptest::sample::select(CUE_PARTS), 0..8),
        ) {
            let text = parts.concat();
            let (mut gated, mut full) = (Vec::new(), Vec::new());
            cued(text.as_bytes(), &mut gated);
            cued_by(text.as_bytes(), true, true, &mut full);
            let spans = |v: &[Cand]| v.iter().map(|c| (c.start, c.end)).collect::<Vec<_>>();
            proptest::prop_assert_eq!(spans(&gated), spans(&full));
        }
    }

    #[test]
    fn boundary_masks_hold_for_every_byte_in_every_lane() {
        for first in (0..=255u8).step_by(16) {
            for turn in 0..16 {
                let piece: [u8; 16] = std::array::from_fn(|i| first + ((i + turn) % 16) as u8);
                assert_eq!(
                    boundary_masks(&piece),
                    boundary_masks_portable(&piece),
                    "{piece:?}"
                );
            }
        }
    }

    #[test]
    fn cue_heads_see_each_kind_of_cue() {
        assert_eq!(cue_heads(b"my pesel: 1"), (true, false));
        assert_eq!(cue_heads(b"(PESEL) 1"), (true, true));
        assert_eq!(cue_heads(b"the SIN is"), (false, true));
        assert_eq!(cue_heads("é ЕГН".as_bytes()), (true, false));
        assert_eq!(cue_heads(b"xpesel no"), (false, false));
        assert_eq!(cue_heads(b"a plain line of text"), (false, false));
    }
}
