//! Unicode letter classes of non-ASCII characters, looked up in a table.
//!
//! `char::is_alphabetic` and friends search std's compressed Unicode tables for every non-ASCII
//! character. The tokenizer asks three of those questions per character, a real share of
//! redaction time on non-ASCII text. The table below holds std's answers for the Basic
//! Multilingual Plane (one byte per code point, built once from std itself, so the answers are
//! the same by construction); other planes still ask std. It also records which characters
//! lower-case to themselves, so that folding a token asks std's case tables (another search)
//! only for the characters that change.

use std::sync::LazyLock;

const ALPHABETIC: u8 = 1;
const NUMERIC: u8 = 2;
const UPPERCASE: u8 = 4;
/// `char::to_lowercase` gives something other than the character itself.
const LOWERCASE_DIFFERS: u8 = 8;

static BMP: LazyLock<Box<[u8]>> = LazyLock::new(|| {
    (0..=0xFFFFu32)
        .map(|u| char::from_u32(u).map_or(0, classes))
        .collect()
});

/// ASCII answers, written out at compile time (std's ASCII classes are the `is_ascii_*` ones;
/// the test below checks every code point against std).
static ASCII: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        let b = i as u8;
        if b.is_ascii_alphabetic() {
            t[i] |= ALPHABETIC;
        }
        if b.is_ascii_digit() {
            t[i] |= NUMERIC;
        }
        if b.is_ascii_uppercase() {
            t[i] |= UPPERCASE | LOWERCASE_DIFFERS;
        }
        i += 1;
    }
    t
};

fn classes(c: char) -> u8 {
    let mut bits = 0;
    if c.is_alphabetic() {
        bits |= ALPHABETIC;
    }
    if c.is_numeric() {
        bits |= NUMERIC;
    }
    if c.is_uppercase() {
        bits |= UPPERCASE;
    }
    let mut lower = c.to_lowercase();
    if !(lower.next() == Some(c) && lower.next().is_none()) {
        bits |= LOWERCASE_DIFFERS;
    }
    bits
}

#[inline]
fn lookup(c: char) -> u8 {
    let u = c as usize;
    if u < 0x80 {
        ASCII[u]
    } else if u <= 0xFFFF {
        BMP[u]
    } else {
        classes(c)
    }
}

/// Same as [`char::is_alphabetic`].
#[inline]
pub(crate) fn is_alphabetic(c: char) -> bool {
    lookup(c) & ALPHABETIC != 0
}

/// Same as [`char::is_alphanumeric`].
#[inline]
pub(crate) fn is_alphanumeric(c: char) -> bool {
    lookup(c) & (ALPHABETIC | NUMERIC) != 0
}

/// Same as [`char::is_numeric`].
#[inline]
pub(crate) fn is_numeric(c: char) -> bool {
    lookup(c) & NUMERIC != 0
}

/// Same as [`char::is_uppercase`].
#[inline]
pub(crate) fn is_uppercase(c: char) -> bool {
    lookup(c) & UPPERCASE != 0
}

/// Whether [`char::to_lowercase`] gives exactly `c`.
#[inline]
pub(crate) fn lowercases_to_itself(c: char) -> bool {
    lookup(c) & LOWERCASE_DIFFERS == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code point, all planes: the table answers exactly as std does.
    #[test]
    fn table_matches_std_on_every_char() {
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            assert_eq!(is_alphabetic(c), c.is_alphabetic(), "{c:?}");
            assert_eq!(is_alphanumeric(c), c.is_alphanumeric(), "{c:?}");
            assert_eq!(is_numeric(c), c.is_numeric(), "{c:?}");
            assert_eq!(is_uppercase(c), c.is_uppercase(), "{c:?}");
            assert_eq!(
                lowercases_to_itself(c),
                c.to_lowercase().eq(std::iter::once(c)),
                "{c:?}"
            );
        }
    }
}
