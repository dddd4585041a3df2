//! Structured PII: regex candidates, then validators (Luhn, mod-97, SSN rules, std::net
//! parsing, phone shapes + context) to cut false positives. Hard negatives (UUIDs, hashes,
//! timestamps, versions) become shields so that weaker detectors cannot claim them.
//!
//! All regexes are ASCII-only (`(?-u)`-style classes, manual boundary checks) for speed.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use regex::bytes::Regex;
use smallvec::SmallVec;

use super::{Cand, PiiType, prio};

/// Options the structured pass needs.
pub(crate) struct Ctx {
    pub keep_non_personal_ips: bool,
    pub user_name_only: bool,
    pub url_credentials: bool,
    /// The redactor's enabled types (by `PiiType as usize`): a detector whose every candidate
    /// would be of a disabled type is not run. (The redactor drops such candidates before
    /// resolving, so skipping them changes nothing but the time.) Detectors that also push
    /// shields (paths, hard negatives, non-personal IPs) always run.
    pub enabled: [bool; 16],
}

impl Ctx {
    fn on(&self, t: PiiType) -> bool {
        self.enabled[t as usize]
    }
}

fn re(p: &str) -> Regex {
    // Only called on the constant patterns below; covered by every test run.
    Regex::new(p).expect("constant structured regex")
}

static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i-u)[a-z0-9](?:[a-z0-9._%+\-]{0,63})@[a-z0-9](?:[a-z0-9\-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9\-]{0,61}[a-z0-9])?)+",
    )
});
static URL_CRED: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i-u)[a-z][a-z0-9+.\-]{1,20}://([^\s:/@<>]{1,64}):([^\s/@<>]{1,128})@[a-z0-9.\-\[\]]")
});
static PHONE: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i-u)(?:\+[ ]?)?(?:\(\+?[0-9]{1,5}\)[ .\-/]?)?[0-9](?:[0-9]|[ .\-/][0-9]|[ .\-]?\([0-9]{1,5}\)[ .\-/]?[0-9]){3,22}(?:(?:;ext=|[ ]?(?:x|ext\.?|extension)[ ]?)[0-9]{1,6})?",
    )
});
/// Upper or lower case (`gb42nawi…` typed in a chat); mixed case is rejected in [`ibans`].
static IBAN: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i-u)[A-Z]{2}[0-9]{2}(?:[ ]?[A-Z0-9]){10,32}"));
static IPV6: LazyLock<Regex> = LazyLock::new(|| re(r"(?i-u)[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7}"));
static MAC: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i-u)[0-9a-f]{2}(?::[0-9a-f]{2}){5}|[0-9a-f]{2}(?:-[0-9a-f]{2}){5}"));
/// A home directory's root, then its user name (a sentinel or up to 64 name bytes): the head
/// of [`HOME_PATH`]. The name's class excludes both separators, with which the rest of the
/// path must start, so the greedy name the head finds is the one the whole path has.
const HOME_HEAD: &str = r#"(?-u)(?:(?:/export|/usr)?/home/|/Users/|/users/|/mnt/[a-z]/(?:Users|users)/|[A-Za-z]:\\(?:Users|users|Documents and Settings)\\|\\\\wsl(?:\$|\.localhost)\\[A-Za-z0-9._\-]{1,40}\\home\\)(<[A-Z_]{1,20}>|[^/\\\s'"<>:|*?`,;()\[\]{}]{1,64})"#;
static HOME_PATH: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r#"{HOME_HEAD}(?:[/\\][^\s'"<>|*?`]*)?"#)));
/// [`HOME_HEAD`] anchored: the user name of a path [`HOME_PATH`] found, searched for within
/// the path only (a capture search over the whole text cost more per path).
static HOME_PATH_HEAD: LazyLock<Regex> = LazyLock::new(|| re(&format!("^{HOME_HEAD}")));
static WALLET: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?-u)0x[0-9a-fA-F]{40}|bc1[02-9ac-hj-np-z]{25,62}"));
/// Legacy base58 Bitcoin addresses; only searched near a crypto keyword (costly and noisy).
static WALLET_B58: LazyLock<Regex> = LazyLock::new(|| re(r"(?-u)[13][1-9A-HJ-NP-Za-km-z]{25,34}"));
/// Dates in birth context.
static DATE: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i-u)[0-9]{1,2}[/.\-][0-9]{1,2}[/.\-][0-9]{2,4}|[0-9]{4}-[0-9]{2}-[0-9]{2}|(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.? [0-9]{1,2}(?:st|nd|rd|th)?,? [0-9]{4}|[0-9]{1,2}(?:st|nd|rd|th)? (?:of )?(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?,? [0-9]{4}",
    )
});
/// Passport / licence / national id numbers, captured after their keyword.
static ID_NUM: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i-u)(?:passport|driver'?s? licen[cs]e|driving licen[cs]e|licen[cs]e number|national id|id card|identity card|personalausweis|id number|tax id|nin|nino|dni|nie|codice fiscale|steuer-id)(?: (?:no\.?|number|num|#))?[ :#]{0,3}(?:is[ ]+)?([A-Z0-9][A-Z0-9\-]{4,19})",
    )
});
/// Shields: UUIDs, hex digests, ISO timestamps, dotted versions.
static SHIELD: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i-u)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32,128}|[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?(?:Z|[+\-][0-9]{2}:?[0-9]{2})?|v?[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?:-[0-9a-z.]+)?",
    )
});

#[inline]
fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// True if the byte before `s` and the byte at `e` do not continue a token.
#[inline]
fn bounded(b: &[u8], s: usize, e: usize, extra_before: &[u8], extra_after: &[u8]) -> bool {
    let ok_before = s == 0 || {
        let c = b[s - 1];
        !(alnum(c) || extra_before.contains(&c))
    };
    let ok_after = e >= b.len() || {
        let c = b[e];
        !(alnum(c) || extra_after.contains(&c))
    };
    ok_before && ok_after
}

/// Lower-cased ASCII window of up to `n` bytes before `s` (for context cues).
fn before_ctx(b: &[u8], s: usize, n: usize) -> Vec<u8> {
    b[s.saturating_sub(n)..s].to_ascii_lowercase()
}

/// True if `needle` (non-empty) occurs in `hay`; compares only where the first byte matches.
fn contains_seq(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&f, rest)) = needle.split_first() else {
        return true;
    };
    if hay.len() < needle.len() {
        return false;
    }
    (0..=hay.len() - needle.len()).any(|i| hay[i] == f && &hay[i + 1..i + needle.len()] == rest)
}

fn has_any(hay: &[u8], needles: &[&str]) -> bool {
    needles.iter().any(|n| contains_seq(hay, n.as_bytes()))
}

/// Cheap facts about the text that tell which detectors can match at all. Every gate is
/// implied by its detector's regex (or its validator), so skipping a detector never changes
/// the result; it only saves the regex search on short records. Counting passes that the
/// compiler vectorises, then a look at the few punctuation bytes, instead of one branchy
/// loop over every byte.
struct Stats {
    digits: usize,
    /// `.` between two digits (versions, dotted quads).
    digit_dots: usize,
    /// `-` between two digits (dates, timestamps).
    digit_dashes: usize,
    /// `-` between two hex digits (UUIDs, MACs written with dashes).
    hex_dashes: usize,
    /// `:` between two digits (times).
    digit_colons: usize,
    colon: bool,
    at: bool,
    slash: bool,
    /// `[A-Za-z]{2}[0-9]{2}`: an IBAN's country and check digits.
    iban_head: bool,
    /// A run of at least 25 / 32 hex digits.
    hex_run_25: bool,
    hex_run_32: bool,
    /// hex digit, `:`, hex digit or `:` (IPv6 / MAC shape).
    hex_colon: bool,
    /// `bc1`: a bech32 Bitcoin address's prefix.
    bech32_head: bool,
}

/// Digits in `b`, counted in byte lanes (a chunk of 255 cannot overflow one), which the
/// compiler vectorises 16 bytes at a time rather than 4 with a word-sized count.
fn count_digits(b: &[u8]) -> usize {
    b.chunks(255)
        .map(|c| usize::from(c.iter().fold(0u8, |n, x| n + u8::from(x.is_ascii_digit()))))
        .sum()
}

fn stats(b: &[u8], ctx: &Ctx) -> Stats {
    static BECH32_HEAD: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(b"bc1"));
    let mut st = Stats {
        digits: count_digits(b),
        digit_dots: 0,
        digit_dashes: 0,
        hex_dashes: 0,
        digit_colons: 0,
        colon: memchr::memchr(b':', b).is_some(),
        at: memchr::memchr(b'@', b).is_some(),
        slash: memchr::memchr2(b'/', b'\\', b).is_some(),
        iban_head: false,
        hex_run_25: false,
        hex_run_32: false,
        hex_colon: false,
        bech32_head: false,
    };
    // every gate below is read only when the text has a digit
    if st.digits == 0 {
        return st;
    }
    let n = b.len();
    let digit = |i: usize| i < n && b[i].is_ascii_digit();
    let hex = |i: usize| i < n && b[i].is_ascii_hexdigit();
    for i in memchr::memchr3_iter(b'.', b'-', b':', b) {
        let (d, h) = (
            i > 0 && digit(i - 1) && digit(i + 1),
            i > 0 && hex(i - 1) && hex(i + 1),
        );
        match b[i] {
            b'.' => st.digit_dots += usize::from(d),
            b'-' => {
                st.digit_dashes += usize::from(d);
                st.hex_dashes += usize::from(h);
            }
            _ => {
                st.digit_colons += usize::from(d);
                st.hex_colon |= i > 0 && hex(i - 1) && (hex(i + 1) || b.get(i + 1) == Some(&b':'));
            }
        }
    }
    // Both sides of the window are tested without a branch, so the loop vectorises.
    // (the IBAN and wallet heads are looked for only when their types are on)
    st.iban_head = ctx.on(PiiType::Iban)
        && b.windows(4).fold(false, |hit, w| {
            hit | (w[0].is_ascii_alphabetic()
                & w[1].is_ascii_alphabetic()
                & w[2].is_ascii_digit()
                & w[3].is_ascii_digit())
        });
    st.bech32_head = ctx.on(PiiType::CryptoWallet) && BECH32_HEAD.find(b).is_some();
    // A run of 25 or more hex digits holds one of every 25th byte: only those are probed, and
    // a run is measured around a probe that hits one.
    const STEP: usize = 25;
    let mut p = STEP - 1;
    let mut longest = 0;
    while p < n {
        if !b[p].is_ascii_hexdigit() {
            p += STEP;
            continue;
        }
        let mut s = p;
        while s > 0 && b[s - 1].is_ascii_hexdigit() {
            s -= 1;
        }
        let mut e = p + 1;
        while e < n && b[e].is_ascii_hexdigit() {
            e += 1;
        }
        longest = longest.max(e - s);
        p = e + STEP;
    }
    st.hex_run_25 = longest >= 25;
    st.hex_run_32 = longest >= 32;
    st
}

/// Bits of the detector groups that case-insensitive context keywords wake (birth dates, id
/// numbers, legacy wallets, home paths).
const KW_DOB: u8 = 1;
const KW_ID: u8 = 2;
const KW_B58: u8 = 4;
const KW_HOME: u8 = 8;
/// Every group: a keyword scan may stop once it has seen them all.
pub(crate) const ALL_KEYWORD_GROUPS: u8 = KW_DOB | KW_ID | KW_B58 | KW_HOME;

/// Context keywords by group. The redactor searches them in the same automaton pass as the
/// secret filter's rule keywords (one walk over the text instead of two).
pub(crate) const KEYWORD_GROUPS: &[(u8, &[&str])] = &[
    (
        KW_DOB,
        &[
            "born",
            "birth",
            "dob",
            "d.o.b",
            "geboren",
            "n\u{e9} le",
            "n\u{e9}e le",
            "nacimiento",
        ],
    ),
    (
        KW_ID,
        &[
            "passport",
            "driver",
            "driving",
            "licence",
            "license",
            "national id",
            "id card",
            "identity card",
            "personalausweis",
            "id number",
            "tax id",
            "nin",
            "dni",
            "nie",
            "codice fiscale",
            "steuer-id",
        ],
    ),
    (KW_B58, &["btc", "bitcoin", "wallet"]),
    (
        KW_HOME,
        &[
            "/home/",
            "/users/",
            ":\\users\\",
            ":\\documents and settings\\",
            "\\home\\",
        ],
    ),
];

/// The groups whose keywords a redactor with these types consults: home paths always (their
/// shields hold whatever types are on), each other group only for its detector's type.
pub(crate) fn keyword_groups_for(on: impl Fn(PiiType) -> bool) -> u8 {
    let mut groups = ALL_KEYWORD_GROUPS;
    for (group, ty) in [
        (KW_DOB, PiiType::DateOfBirth),
        (KW_ID, PiiType::IdNumber),
        (KW_B58, PiiType::CryptoWallet),
    ] {
        if !on(ty) {
            groups &= !group;
        }
    }
    groups
}

/// Runs every structured detector. `keyword_groups` gives the [`KEYWORD_GROUPS`] bits whose
/// keywords occur in `text` (the caller keeps the answer: it may be asked more than once); it
/// is asked only when a detector it gates is on and could match at all.
pub(crate) fn detect(text: &str, ctx: &Ctx, keyword_groups: impl Fn() -> u8, out: &mut Vec<Cand>) {
    let b = text.as_bytes();
    let st = stats(b, ctx);
    let kw = |group: u8| keyword_groups() & group != 0;
    if st.at {
        if ctx.on(PiiType::Email) {
            emails(b, out);
        }
        if ctx.url_credentials
            && ctx.on(PiiType::UrlCredentials)
            && st.colon
            && contains_seq(b, b"://")
        {
            url_creds(b, out);
        }
    }
    if st.slash && kw(KW_HOME) {
        home_paths(b, ctx, out);
    }
    if st.digits == 0 {
        return;
    }
    // UUID (4 dashes between hex digits), hex digest, timestamp (2 dashes and a colon between
    // digits), version (2 dots between digits)
    if st.hex_dashes >= 4
        || st.hex_run_32
        || (st.digit_dashes >= 2 && st.digit_colons >= 1)
        || st.digit_dots >= 2
    {
        shields(b, out);
    }
    if st.iban_head && ctx.on(PiiType::Iban) {
        ibans(b, out);
    }
    if st.digit_dots >= 3 && st.digits >= 4 {
        ipv4(b, ctx, out);
    }
    // IPv6 and MAC need a colon between hex digits somewhere
    if st.hex_colon {
        ipv6(b, ctx, out);
        if ctx.on(PiiType::MacAddress) {
            macs(b, out);
        }
    }
    if st.hex_dashes >= 5 && ctx.on(PiiType::MacAddress) {
        macs_dash(b, out);
    }
    if st.digits >= 9 && (ctx.on(PiiType::CreditCard) || ctx.on(PiiType::Ssn)) {
        digit_runs(b, out);
    }
    if st.digits >= 7 && ctx.on(PiiType::Phone) {
        phones(b, out);
    }
    if ctx.on(PiiType::CryptoWallet) {
        let keyword = kw(KW_B58);
        if st.hex_run_25 || keyword || st.bech32_head {
            wallets(b, keyword, out);
        }
    }
    if ctx.on(PiiType::DateOfBirth) && kw(KW_DOB) {
        dates_of_birth(b, out);
    }
    if ctx.on(PiiType::IdNumber) && kw(KW_ID) {
        id_numbers(b, out);
    }
    if st.digits >= 6 && ctx.on(PiiType::Ssn) {
        super::national_id::cued(b, out);
        super::national_id::bare(b, out);
    }
}

fn emails(b: &[u8], out: &mut Vec<Cand>) {
    for m in EMAIL.find_iter(b) {
        let (s, mut e) = (m.start(), m.end());
        // Trailing dots/hyphens belong to the sentence, not the domain.
        while e > s && matches!(b[e - 1], b'.' | b'-') {
            e -= 1;
        }
        let v = &b[s..e];
        let Some(at) = v.iter().position(|&c| c == b'@') else {
            continue;
        };
        let (local, domain) = (&v[..at], &v[at + 1..]);
        if local.is_empty()
            || local.starts_with(b".")
            || local.ends_with(b".")
            || local.windows(2).any(|w| w == b"..")
        {
            continue;
        }
        // Domain shape: >= 2 labels, alphabetic TLD of 2..=24 (or punycode).
        let tld = domain.rsplit(|&c| c == b'.').next().unwrap_or(b"");
        let tld_ok = (2..=24).contains(&tld.len())
            && (tld.iter().all(u8::is_ascii_alphabetic) || tld.starts_with(b"xn--"));
        if !tld_ok || !domain.contains(&b'.') {
            continue;
        }
        // Code like `foo@2x.png` or `user@host.local` in configs is not an address.
        if s > 0 && (alnum(b[s - 1]) || b[s - 1] == b'.') {
            continue;
        }
        // A message id (`Message-ID: <…@host>`) names a mail, not a mailbox.
        if s > 0
            && b[s - 1] == b'<'
            && has_any(
                &before_ctx(b, s, 48),
                &[
                    "message-id",
                    "in-reply-to",
                    "references:",
                    "content-id",
                    "msgid",
                ],
            )
        {
            continue;
        }
        out.push(Cand::new(s, e, PiiType::Email, "email", 0.97, prio::EMAIL));
    }
}

fn url_creds(b: &[u8], out: &mut Vec<Cand>) {
    if !URL_CRED.is_match(b) {
        return;
    }
    for c in URL_CRED.captures_iter(b) {
        let (Some(u), Some(p)) = (c.get(1), c.get(2)) else {
            continue;
        };
        let pw = p.as_bytes().to_ascii_lowercase();
        if pw.starts_with(b"$") || pw.starts_with(b"{") || pw.starts_with(b"<") {
            continue;
        }
        out.push(Cand::new(
            u.start(),
            p.end(),
            PiiType::UrlCredentials,
            "url-userinfo",
            0.95,
            prio::URL_CRED,
        ));
    }
}

/// Account names that identify nobody.
const GENERIC_USERS: &[&str] = &[
    "user",
    "username",
    "me",
    "you",
    "your_name",
    "yourname",
    "your-name",
    "name",
    "runner",
    "ubuntu",
    "admin",
    "administrator",
    "root",
    "vagrant",
    "ec2-user",
    "shared",
    "public",
    "default",
    "all users",
    "guest",
    "test",
    "example",
    "foo",
    "bar",
    "$user",
    "%username%",
    "x",
    "...",
    "*",
    "www",
    "git",
    "docker",
    "app",
    "node",
    "jenkins",
    "circleci",
    "travis",
];

fn home_paths(b: &[u8], ctx: &Ctx, out: &mut Vec<Cand>) {
    if !b.contains(&b'/') && !b.contains(&b'\\') {
        return;
    }
    if !HOME_PATH.is_match(b) {
        return;
    }
    // a path continued past a space (see `path_after_space`) covers the paths inside it
    let mut covered = 0;
    for m in HOME_PATH.find_iter(b) {
        let s = m.start();
        if s < covered {
            continue;
        }
        let Some((us, ue)) = HOME_PATH_HEAD
            .captures(&b[s..m.end()])
            .and_then(|c| c.get(1))
            .map(|u| (s + u.start(), s + u.end()))
        else {
            continue;
        };
        // `>` too: after a sentinel such as `<EMAIL>` the path was glued to a word before
        if s > 0 && (alnum(b[s - 1]) || matches!(b[s - 1], b'.' | b'>')) {
            continue;
        }
        let (mut ue, mut e) = (ue, m.end());
        // Folder and user names with spaces (`C:\Users\Ann Lee\Mobile Documents\a b.txt`): a
        // space continues the path when what follows it reaches another separator, or, in the
        // last folder, names a file.
        while let Some(next) = path_after_space(b, e) {
            if ue == e {
                ue = next.user_end;
            }
            e = next.end;
        }
        covered = e;
        let user = &b[us..ue];
        let ul = String::from_utf8_lossy(user).to_lowercase();
        while e > ue
            && matches!(
                b[e - 1],
                b'.' | b',' | b';' | b':' | b')' | b']' | b'}' | b'!' | b'?'
            )
        {
            e -= 1;
        }
        // a path is never a name or an address: shield it from the token detectors
        if user.starts_with(b"<")
            || user.starts_with(b"$")
            || user.starts_with(b"{")
            || GENERIC_USERS.contains(&ul.as_str())
        {
            out.push(Cand::shield(s, e, "path", prio::SHIELD));
            continue;
        }
        if ctx.user_name_only {
            out.push(Cand::shield(s, us, "path", prio::SHIELD));
            if ue < e {
                out.push(Cand::shield(ue, e, "path", prio::SHIELD));
            }
            out.push(Cand::new(
                us,
                ue,
                PiiType::UserName,
                "home-path",
                0.9,
                prio::FILE_PATH,
            ));
        } else {
            out.push(
                Cand::new(s, e, PiiType::FilePath, "home-path", 0.9, prio::FILE_PATH)
                    .truncatable(ue),
            );
        }
    }
}

/// Where a path that stops at `e` goes on past one space (see [`home_paths`]).
struct PathTail {
    end: usize,
    /// The end of the folder the space is in: the user name's, if the space is in it.
    user_end: usize,
}

fn path_after_space(b: &[u8], e: usize) -> Option<PathTail> {
    if b.get(e) != Some(&b' ') {
        return None;
    }
    let stop = |c: u8| {
        c.is_ascii_whitespace()
            || matches!(c, b'\'' | b'"' | b'<' | b'>' | b'|' | b'*' | b'?' | b'`')
    };
    let start = e + 1;
    let end = b[start..]
        .iter()
        .position(|&c| stop(c))
        .map_or(b.len(), |p| start + p);
    let chunk = &b[start..end];
    let first = *chunk.first()?;
    // a separator, a drive (`D:\`) or a scheme (`https://`) starts another path
    let new_root = chunk.get(1) == Some(&b':') || contains_seq(chunk, b"://");
    if matches!(first, b'/' | b'\\')
        || new_root
        || !(first.is_ascii_alphanumeric() || first >= 0x80)
    {
        return None;
    }
    if let Some(sep) = chunk.iter().position(|&c| matches!(c, b'/' | b'\\')) {
        return Some(PathTail {
            end,
            user_end: start + sep,
        });
    }
    // a file name in the last folder: `report final.docx`, when that folder has no extension yet
    let folder_start = b[..e].iter().rposition(|&c| matches!(c, b'/' | b'\\'))? + 1;
    let trimmed = chunk
        .iter()
        .rposition(|c| !matches!(c, b'.' | b',' | b';' | b':' | b')' | b'!'))
        .map_or(0, |p| p + 1);
    let name = &chunk[..trimmed];
    let dot = name.iter().rposition(|&c| c == b'.')?;
    let ext = &name[dot + 1..];
    let file_name =
        dot > 0 && (1..=5).contains(&ext.len()) && ext.iter().all(u8::is_ascii_alphanumeric);
    (file_name && !b[folder_start..e].contains(&b'.')).then_some(PathTail {
        end: start + trimmed,
        user_end: e,
    })
}

fn shields(b: &[u8], out: &mut Vec<Cand>) {
    for m in SHIELD.find_iter(b) {
        let (s, e) = (m.start(), m.end());
        if !bounded(b, s, e, b"-", b"-") {
            continue;
        }
        // Dotted versions also look like the first three octets of an IPv4 address.
        if e < b.len() && b[e] == b'.' && b.get(e + 1).is_some_and(u8::is_ascii_digit) {
            continue;
        }
        out.push(Cand::shield(s, e, "hard-negative", prio::SHIELD));
    }
}

/// IBAN lengths per country (ISO 13616 registry).
const IBAN_LEN: &[(&[u8; 2], usize)] = &[
    (b"AD", 24),
    (b"AE", 23),
    (b"AL", 28),
    (b"AT", 20),
    (b"AZ", 28),
    (b"BA", 20),
    (b"BE", 16),
    (b"BG", 22),
    (b"BH", 22),
    (b"BR", 29),
    (b"BY", 28),
    (b"CH", 21),
    (b"CR", 22),
    (b"CY", 28),
    (b"CZ", 24),
    (b"DE", 22),
    (b"DK", 18),
    (b"DO", 28),
    (b"EE", 20),
    (b"EG", 29),
    (b"ES", 24),
    (b"FI", 18),
    (b"FO", 18),
    (b"FR", 27),
    (b"GB", 22),
    (b"GE", 22),
    (b"GI", 23),
    (b"GL", 18),
    (b"GR", 27),
    (b"GT", 28),
    (b"HR", 21),
    (b"HU", 28),
    (b"IE", 22),
    (b"IL", 23),
    (b"IQ", 23),
    (b"IS", 26),
    (b"IT", 27),
    (b"JO", 30),
    (b"KW", 30),
    (b"KZ", 20),
    (b"LB", 28),
    (b"LC", 32),
    (b"LI", 21),
    (b"LT", 20),
    (b"LU", 20),
    (b"LV", 21),
    (b"MC", 27),
    (b"MD", 24),
    (b"ME", 22),
    (b"MK", 19),
    (b"MR", 27),
    (b"MT", 31),
    (b"MU", 30),
    (b"NL", 18),
    (b"NO", 15),
    (b"PK", 24),
    (b"PL", 28),
    (b"PS", 29),
    (b"PT", 25),
    (b"QA", 29),
    (b"RO", 24),
    (b"RS", 22),
    (b"SA", 24),
    (b"SC", 31),
    (b"SE", 24),
    (b"SI", 19),
    (b"SK", 24),
    (b"SM", 27),
    (b"ST", 25),
    (b"SV", 28),
    (b"TL", 23),
    (b"TN", 24),
    (b"TR", 26),
    (b"UA", 29),
    (b"VA", 22),
    (b"VG", 24),
    (b"XK", 20),
];

pub(crate) fn iban_mod97(chars: &[u8]) -> bool {
    if chars.len() < 5 {
        return false;
    }
    let mut rem: u32 = 0;
    for &c in chars[4..].iter().chain(&chars[..4]) {
        let v = match c {
            b'0'..=b'9' => u32::from(c - b'0'),
            b'A'..=b'Z' => u32::from(c - b'A') + 10,
            _ => return false,
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

fn ibans(b: &[u8], out: &mut Vec<Cand>) {
    for m in IBAN.find_iter(b) {
        let s = m.start();
        if s > 0 && alnum(b[s - 1]) {
            continue;
        }
        let cc = [b[s].to_ascii_uppercase(), b[s + 1].to_ascii_uppercase()];
        let Some(&(_, want)) = IBAN_LEN.iter().find(|(c, _)| **c == cc) else {
            continue;
        };
        // Walk until `want` alphanumerics (single spaces allowed between groups).
        let mut chars = Vec::with_capacity(want);
        let mut e = s;
        while e < m.end() && chars.len() < want {
            if b[e] != b' ' {
                chars.push(b[e]);
            }
            e += 1;
        }
        if chars.len() != want || (e < b.len() && alnum(b[e])) {
            continue;
        }
        // one case throughout: `Gb42…` mixes and is some other identifier
        let lower = chars.iter().any(u8::is_ascii_lowercase);
        if lower && chars.iter().any(u8::is_ascii_uppercase) {
            continue;
        }
        chars.make_ascii_uppercase();
        if iban_mod97(&chars) {
            out.push(Cand::new(
                s,
                e,
                PiiType::Iban,
                "iban-mod97",
                0.99,
                prio::IBAN,
            ));
        }
    }
}

/// Matches of `[0-9]+(?:[ \-][0-9]+)*` (digit groups with single separators: cards, SSNs,
/// bare numbers), leftmost-first like the regex, by a byte scan instead of a regex search.
fn digit_runs_spans(b: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let n = b.len();
    let mut i = 0;
    std::iter::from_fn(move || {
        i = next_digit(b, i);
        if i >= n {
            return None;
        }
        let s = i;
        while i < n && b[i].is_ascii_digit() {
            i += 1;
        }
        while i + 1 < n && matches!(b[i], b' ' | b'-') && b[i + 1].is_ascii_digit() {
            i += 1;
            while i < n && b[i].is_ascii_digit() {
                i += 1;
            }
        }
        Some((s, i))
    })
}

/// Matches of `[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}`, leftmost-first like the
/// regex, by a byte scan.
fn ipv4_spans(b: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let n = b.len();
    // digits at `j`, counted up to four (enough to tell `[0-9]{1,3}` from a longer run; a
    // full count from every position of a long run made the scan quadratic)
    let digits_at = move |j: usize| {
        b[j.min(n)..]
            .iter()
            .take(4)
            .take_while(|c| c.is_ascii_digit())
            .count()
    };
    // end of a match starting at `s`, if one does
    let at = move |s: usize| -> Option<usize> {
        let mut j = s;
        for _ in 0..3 {
            // `[0-9]{1,3}\.`: the digits before the dot are the whole run (a run longer than
            // three cannot be cut, since the dot must follow the digits)
            let d = digits_at(j);
            if !(1..=3).contains(&d) || b.get(j + d) != Some(&b'.') {
                return None;
            }
            j += d + 1;
        }
        let d = digits_at(j).min(3);
        (d >= 1).then_some(j + d)
    };
    let mut i = 0;
    std::iter::from_fn(move || {
        loop {
            i = next_digit(b, i);
            if i >= n {
                return None;
            }
            if let Some(e) = at(i) {
                let s = i;
                i = e;
                return Some((s, e));
            }
            i += 1;
        }
    })
}

/// The first digit at or after `i` (`b.len()` if none). Not inlined: inside the scanners'
/// loops the compiler kept their many loop counters up to date on every skipped byte; here
/// the skip tests 16 bytes at a time without a branch per byte.
#[inline(never)]
pub(super) fn next_digit(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..i + 16) {
        if chunk.iter().fold(false, |any, c| any | c.is_ascii_digit()) {
            break;
        }
        i += 16;
    }
    while i < b.len() && !b[i].is_ascii_digit() {
        i += 1;
    }
    i.min(b.len())
}

fn ip4_non_personal(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || (o[0] == 192 && o[1] == 0 && o[2] == 2)
        || (o[0] == 198 && o[1] == 51 && o[2] == 100)
        || (o[0] == 203 && o[1] == 0 && o[2] == 113)
}

fn ipv4(b: &[u8], ctx: &Ctx, out: &mut Vec<Cand>) {
    if !b.contains(&b'.') {
        return;
    }
    for (s, e) in ipv4_spans(b) {
        if !bounded(b, s, e, b".", b"") {
            continue;
        }
        if e + 1 < b.len() && b[e] == b'.' && b[e + 1].is_ascii_digit() {
            continue; // five-part version numbers
        }
        let Ok(txt) = std::str::from_utf8(&b[s..e]) else {
            continue;
        };
        let Ok(ip) = txt.parse::<Ipv4Addr>() else {
            continue;
        };
        if ctx.keep_non_personal_ips && ip4_non_personal(ip) {
            out.push(Cand::shield(s, e, "ip-non-personal", prio::IP));
        } else {
            out.push(Cand::new(s, e, PiiType::IpAddress, "ipv4", 0.95, prio::IP));
        }
    }
}

fn ipv6(b: &[u8], ctx: &Ctx, out: &mut Vec<Cand>) {
    for m in IPV6.find_iter(b) {
        let (s, e) = (m.start(), m.end());
        let v = &b[s..e];
        let groups = v.split(|&c| c == b':').count();
        let double = v.windows(2).any(|w| w == b"::");
        if !(groups == 8 || (double && groups >= 3)) {
            continue;
        }
        if !bounded(b, s, e, b":.", b":") {
            continue;
        }
        let Ok(txt) = std::str::from_utf8(v) else {
            continue;
        };
        let Ok(ip) = txt.parse::<Ipv6Addr>() else {
            continue;
        };
        let seg = ip.segments();
        let non_personal = ip.is_loopback()
            || ip.is_unspecified()
            || ip.is_multicast()
            || (seg[0] == 0x2001 && seg[1] == 0x0db8);
        // `a::b` in code (C++/Rust paths) parses too; require some digits for short forms.
        if groups < 8 && !v.iter().any(u8::is_ascii_digit) {
            continue;
        }
        if ctx.keep_non_personal_ips && non_personal {
            out.push(Cand::shield(s, e, "ip-non-personal", prio::IP));
        } else {
            out.push(Cand::new(s, e, PiiType::IpAddress, "ipv6", 0.95, prio::IP));
        }
    }
}

fn push_mac(b: &[u8], s: usize, e: usize, out: &mut Vec<Cand>) {
    if !bounded(b, s, e, b":-", b":-") {
        return;
    }
    let v = b[s..e].to_ascii_lowercase();
    if v.iter().all(|c| matches!(c, b'0' | b':' | b'-'))
        || v.iter().all(|c| matches!(c, b'f' | b':' | b'-'))
    {
        return;
    }
    out.push(Cand::new(s, e, PiiType::MacAddress, "mac", 0.9, prio::MAC));
}

fn macs(b: &[u8], out: &mut Vec<Cand>) {
    for m in MAC.find_iter(b) {
        if b[m.start() + 2] == b':' {
            push_mac(b, m.start(), m.end(), out);
        }
    }
}

fn macs_dash(b: &[u8], out: &mut Vec<Cand>) {
    for m in MAC.find_iter(b) {
        if b[m.start() + 2] == b'-' {
            push_mac(b, m.start(), m.end(), out);
        }
    }
}

pub(crate) fn luhn(d: &[u8]) -> bool {
    let mut sum = 0u32;
    for (i, &c) in d.iter().rev().enumerate() {
        let mut x = u32::from(c - b'0');
        if i % 2 == 1 {
            x *= 2;
            if x > 9 {
                x -= 9;
            }
        }
        sum += x;
    }
    sum.is_multiple_of(10)
}

/// Card brand from the issuer prefix and length; `strong` brands need no context.
fn card_brand(d: &[u8]) -> Option<bool> {
    let n = d.len();
    let p = |k: usize| -> u32 {
        d[..k.min(n)]
            .iter()
            .fold(0u32, |a, &c| a * 10 + u32::from(c - b'0'))
    };
    let strong = match d[0] {
        b'4' => n == 13 || n == 16 || n == 19,
        b'5' => (51..=55).contains(&p(2)) && n == 16,
        b'2' => (2221..=2720).contains(&p(4)) && n == 16,
        b'3' => {
            (matches!(p(2), 34 | 37) && n == 15)
                || ((300..=305).contains(&p(3)) || matches!(p(2), 36 | 38 | 39))
                    && (14..=19).contains(&n)
                || (3528..=3589).contains(&p(4)) && (16..=19).contains(&n)
        }
        b'6' => {
            (p(4) == 6011 || p(2) == 65 || (644..=649).contains(&p(3)) || p(2) == 62)
                && (16..=19).contains(&n)
        }
        _ => false,
    };
    if strong {
        return Some(true);
    }
    // Weaker: JCB 15-digit (1800, 2131), Maestro (50, 56-69) 12-19: context required.
    let weak = (n == 15 && (p(4) == 1800 || p(4) == 2131))
        || (p(2) == 35 && (16..=19).contains(&n))
        || ((p(2) == 50 || (56..=69).contains(&p(2))) && (12..=19).contains(&n));
    weak.then_some(false)
}

const CARD_CTX: &[&str] = &[
    "card",
    "visa",
    "mastercard",
    "amex",
    "credit",
    "debit",
    "cc ",
    "cc#",
    "payment",
    "maestro",
    "jcb",
    "diners",
    "discover",
];
/// Numbered things that are not payment cards or phones.
const NOT_PAYMENT_CTX: &[&str] = &[
    "loyalty",
    "bonus",
    "member",
    "reward",
    "gift card",
    "points",
    "tracking",
    "kundennummer",
    "kundenkarte",
    "payback",
];
const SSN_CTX: &[&str] = &[
    "ssn",
    "social security",
    "social-security",
    "ss#",
    "ss #",
    "my social",
    "social is",
    "social:",
    "social number",
    "social no",
];

/// Digit runs: credit cards, SSNs.
fn digit_runs(b: &[u8], out: &mut Vec<Cand>) {
    for (s, e) in digit_runs_spans(b) {
        if e - s < 9 {
            continue;
        }
        if !bounded(b, s, e, b".-", b"")
            || (e < b.len() && b[e] == b'-' && b.get(e + 1).is_some_and(u8::is_ascii_digit))
        {
            continue;
        }
        let groups: SmallVec<[(usize, usize); 8]> = {
            let mut g = SmallVec::new();
            let mut i = s;
            while i < e {
                let gs = i;
                while i < e && b[i].is_ascii_digit() {
                    i += 1;
                }
                g.push((gs, i));
                i += 1; // separator
            }
            g
        };
        // Try the longest prefix of groups that makes a valid card (cards can be followed by
        // other numbers, e.g. an expiry year). Only prefixes of 12 to 19 digits can be one:
        // the others are passed over without collecting their digits (from every prefix of a
        // long run of short groups, `12 12 12 …`, that would be quadratic).
        let mut digits_upto = 0;
        let card_long: SmallVec<[usize; 8]> = groups
            .iter()
            .enumerate()
            .filter_map(|(k, (a, z))| {
                digits_upto += z - a;
                (12..=19).contains(&digits_upto).then_some(k + 1)
            })
            .collect();
        let mut found = false;
        for &k in card_long.iter().rev() {
            let ce = groups[k - 1].1;
            let digits: SmallVec<[u8; 24]> = b[s..ce]
                .iter()
                .copied()
                .filter(u8::is_ascii_digit)
                .collect();
            // groups of a card are 4-4-4-4(-3), 4-6-5, 4-6-4, or one block
            let lens: SmallVec<[usize; 8]> = groups[..k].iter().map(|(a, z)| z - a).collect();
            let shape_ok = k == 1
                || lens[..k - 1].iter().all(|&l| l == 4) && lens[k - 1] <= 4
                || lens[..] == [4, 6, 5]
                || lens[..] == [4, 6, 4];
            if !shape_ok || !luhn(&digits) {
                continue;
            }
            let strong = match card_brand(&digits) {
                Some(strong) => strong,
                // an issuer range the table lacks (old Maestro `0604…`), called a card just
                // before it: Luhn plus that cue is enough
                None if has_any(&before_ctx(b, s, 24), &["card"]) => false,
                None => continue,
            };
            let ctx = before_ctx(b, s, 48);
            if !strong && !has_any(&ctx, CARD_CTX) {
                continue;
            }
            // loyalty, gift and member cards pass Luhn too but pay for nothing
            if has_any(&before_ctx(b, s, 24), NOT_PAYMENT_CTX) {
                continue;
            }
            // An all-same-digit run passes Luhn sometimes but is filler.
            if digits.iter().all(|&c| c == digits[0]) {
                continue;
            }
            out.push(Cand::new(
                s,
                ce,
                PiiType::CreditCard,
                "luhn",
                if strong { 0.95 } else { 0.8 },
                prio::CARD,
            ));
            found = true;
            break;
        }
        if found {
            continue;
        }
        ssn(b, s, e, &groups, out);
    }
}

/// An SSN's area, group and serial as they can be issued: never area 000 or 666, group 00 or serial 0000.
pub(super) fn ssn_parts_issued(a: u32, g: u32, sr: u32) -> bool {
    a != 0 && a != 666 && g != 0 && sr != 0
}

fn ssn_parts_ok(a: u32, g: u32, sr: u32) -> bool {
    ssn_parts_issued(a, g, sr) && a < 900
}

fn ssn(b: &[u8], s: usize, e: usize, groups: &[(usize, usize)], out: &mut Vec<Cand>) {
    let num = |(x, y): (usize, usize)| -> u32 {
        b[x..y]
            .iter()
            .fold(0u32, |a, &c| a * 10 + u32::from(c - b'0'))
    };
    let ctx = before_ctx(b, s, 40);
    let has_ctx = has_any(&ctx, SSN_CTX);
    if groups.len() == 3 {
        if groups.iter().map(|(x, y)| y - x).ne([3, 2, 4]) {
            return;
        }
        let sep1 = b[groups[0].1];
        let sep2 = b[groups[1].1];
        let (area, group, serial) = (num(groups[0]), num(groups[1]), num(groups[2]));
        // Areas 900-999 are taxpayer numbers (ITINs), as personal as an SSN: dashed like one, or
        // after a cue. Area 000 or 666, group 00 and serial 0000 are never issued.
        let itin =
            (sep1 == b'-' || has_ctx) && area >= 900 && ssn_parts_issued(area, group, serial);
        if sep1 != sep2 || !(ssn_parts_ok(area, group, serial) || itin) {
            return;
        }
        let conf = if has_ctx {
            0.97
        } else if itin {
            0.8
        } else if sep1 == b'-' {
            0.85
        } else {
            0.6
        };
        out.push(Cand::new(s, e, PiiType::Ssn, "ssn-rules", conf, prio::SSN));
    } else if groups.len() == 1 && e - s == 9 && has_ctx {
        let v = &b[s..e];
        let n = |r: std::ops::Range<usize>| {
            v[r].iter().fold(0u32, |a, &c| a * 10 + u32::from(c - b'0'))
        };
        if ssn_parts_ok(n(0..3), n(3..5), n(5..9)) {
            out.push(Cand::new(s, e, PiiType::Ssn, "ssn-rules", 0.9, prio::SSN));
        }
    }
}

const PHONE_CTX: &[&str] = &[
    "phone",
    "call",
    "tel",
    "mobile",
    "cell",
    "number",
    "text me",
    "contact",
    "reach",
    "fax",
    "desk",
    "office",
    "whatsapp",
    "sms",
    "dial",
    "answering",
    "registered",
    "courier",
    "ring",
    "mob",
    "landline",
    "messages to",
    "hotline",
    "telefon",
    "téléphone",
    "handy",
    "portable",
    "móvil",
    "cellulare",
    "numero",
    "nummer",
    "tlf",
];
const PHONE_NEG_CTX: &[&str] = &[
    "order", "invoice", "ticket", "ref", "id ", "id:", "id#", "version", "port", "pid", "build",
    "account", "tracking", "serial", "isbn", "zip", "postal", "code", "$", "€", "£", "usd", "eur",
];

const PHONE_AFTER_CTX: &[&str] = &["office", "mobile", "fax", "home", "cell", "work", "desk"];

/// Case-insensitive (ASCII) matcher for a context word list.
fn ctx_matcher(words: &[&str]) -> aho_corasick::AhoCorasick {
    aho_corasick::AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .build(words)
        // constant literals: cannot fail
        .expect("constant context automaton")
}

static PHONE_CTX_AC: LazyLock<aho_corasick::AhoCorasick> = LazyLock::new(|| ctx_matcher(PHONE_CTX));
static PHONE_NEG_AC: LazyLock<aho_corasick::AhoCorasick> =
    LazyLock::new(|| ctx_matcher(PHONE_NEG_CTX));
static PHONE_AFTER_AC: LazyLock<aho_corasick::AhoCorasick> =
    LazyLock::new(|| ctx_matcher(PHONE_AFTER_CTX));

/// Bytes a match of [`PHONE`] can hold: digits, its separators and brackets, and the letters
/// of its extension marks (`x`, `ext.`, `extension`, `;ext=`, any case).
static PHONE_BYTES: [bool; 256] = byte_table!(|b| b.is_ascii_digit()
    || matches!(
        b,
        b' ' | b'+' | b'(' | b')' | b'.' | b'-' | b'/' | b';' | b'='
    )
    || matches!(
        b.to_ascii_lowercase(),
        b'e' | b'x' | b't' | b'n' | b's' | b'i' | b'o'
    ));

/// The matches of [`PHONE`] that can pass as a phone, leftmost-first like the regex over the
/// whole text. Every match lies inside one run of [`PHONE_BYTES`], and the regex has no
/// look-around, so searching each run apart finds the same matches; a run with fewer than
/// seven digits holds no match that [`phones`] keeps (it needs seven in the number before
/// an extension), so only runs around digits are measured and only rich ones searched.
fn phone_matches(b: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let n = b.len();
    let mut i = 0;
    std::iter::from_fn(move || {
        loop {
            i = next_digit(b, i);
            if i >= n {
                return None;
            }
            let mut l = i;
            while l > 0 && PHONE_BYTES[usize::from(b[l - 1])] {
                l -= 1;
            }
            let mut digits = 0;
            let mut r = i;
            while r < n && PHONE_BYTES[usize::from(b[r])] {
                digits += usize::from(b[r].is_ascii_digit());
                r += 1;
            }
            i = r;
            if digits >= 7 {
                return Some((l, r));
            }
        }
    })
    .flat_map(move |(l, r)| {
        PHONE
            .find_iter(&b[l..r])
            .map(move |m| (l + m.start(), l + m.end()))
    })
}

fn phones(b: &[u8], out: &mut Vec<Cand>) {
    for (s, e) in phone_matches(b) {
        let mut e = e;
        // trailing separators belong to the sentence
        while e > s && matches!(b[e - 1], b' ' | b'.' | b'-') {
            e -= 1;
        }
        let v = &b[s..e];
        if !bounded(b, s, e, b".-/:", b"")
            || (s >= 2 && b[s - 1] == b',' && b[s - 2].is_ascii_digit())
        {
            continue;
        }
        if e + 1 < b.len() && matches!(b[e], b'.' | b'-' | b'/' | b':') && b[e + 1].is_ascii_digit()
        {
            continue;
        }
        // split off an extension
        let main_end = v
            .iter()
            .position(|&c| matches!(c, b'x' | b'X' | b'e' | b'E' | b';'))
            .unwrap_or(v.len());
        let main = &v[..main_end];
        let digits = main.iter().filter(|c| c.is_ascii_digit()).count();
        if !(7..=15).contains(&digits) {
            continue;
        }
        let seps: SmallVec<[u8; 24]> = main
            .iter()
            .copied()
            .filter(|c| matches!(c, b' ' | b'.' | b'-' | b'/'))
            .collect();
        // decimals, dates, dotted quads and version-like runs are not phones
        let dots = seps.iter().filter(|&&c| c == b'.').count();
        if dots == 1 && seps.len() == 1 {
            continue;
        }
        if is_date_like(main) || (dots == 3 && seps.len() == 3) {
            continue;
        }
        let plus = v[0] == b'+';
        // 3-2-4 is the SSN shape; an invalid SSN is not a phone either
        if !plus
            && main.len() == 11
            && main[3] == main[6]
            && matches!(main[3], b'-' | b' ')
            && main.iter().filter(|c| c.is_ascii_digit()).count() == 9
        {
            continue;
        }
        let groups: SmallVec<[&[u8]; 8]> = main
            .split(|c| matches!(c, b' ' | b'.' | b'-' | b'(' | b')' | b'+'))
            .filter(|g| !g.is_empty())
            .collect();
        let glens: SmallVec<[usize; 8]> = groups.iter().map(|g| g.len()).collect();
        let nanp = (glens[..] == [3, 3, 4] || glens[..] == [1, 3, 3, 4])
            && groups[glens.len() - 3][0] >= b'2'
            && (main.contains(&b'(')
                || seps.len() >= 2
                || (seps.len() == 1 && main.contains(&b')'))
                || main[0] == b'('
                || seps.iter().all(|&c| c == seps[0]));
        let trunk0 = main[0] == b'0' || (main[0] == b'(' && main.get(1) == Some(&b'0'));
        // context is looked up only when the shape alone does not decide
        let ctx = || {
            PHONE_CTX_AC.is_match(&b[s.saturating_sub(40)..s])
                || PHONE_AFTER_AC.is_match(&b[e..(e + 14).min(b.len())])
        };
        let neg = || PHONE_NEG_AC.is_match(&b[s.saturating_sub(18)..s]);
        if !plus && has_any(&before_ctx(b, s, 24), NOT_PAYMENT_CTX) {
            continue;
        }
        let conf = if plus && digits >= 8 {
            0.95
        } else if nanp && !neg() {
            0.9
        } else if ctx() {
            0.85
        } else if trunk0 && !seps.is_empty() && (9..=12).contains(&digits) && !neg() {
            0.7
        } else {
            continue;
        };
        out.push(Cand::new(s, e, PiiType::Phone, "phone", conf, prio::PHONE));
    }
}

/// `12/03/1985`, `1985-03-12`, `12.03.85`: three digit groups of a date's lengths.
pub(super) fn is_date_like(v: &[u8]) -> bool {
    let mut l = [0usize; 3];
    let mut parts = 0;
    for p in v.split(|c| matches!(c, b'.' | b'-' | b'/')) {
        if parts == 3 || p.is_empty() || !p.iter().all(u8::is_ascii_digit) {
            return false;
        }
        l[parts] = p.len();
        parts += 1;
    }
    parts == 3 && matches!(l, [4, 1..=2, 1..=2] | [1..=2, 1..=2, 2 | 4])
}

fn wallets(b: &[u8], b58: bool, out: &mut Vec<Cand>) {
    let it = WALLET
        .find_iter(b)
        .chain(b58.then(|| WALLET_B58.find_iter(b)).into_iter().flatten());
    for m in it {
        let (s, e) = (m.start(), m.end());
        if !bounded(b, s, e, b"", b"") {
            continue;
        }
        let v = &b[s..e];
        let ok = if v.starts_with(b"0x") || v.starts_with(b"bc1") {
            true
        } else {
            // legacy base58 needs context: otherwise random ids look the same
            has_any(
                &before_ctx(b, s, 40),
                &["bitcoin", "btc", "wallet", "crypto"],
            )
        };
        if ok {
            out.push(Cand::new(
                s,
                e,
                PiiType::CryptoWallet,
                "wallet",
                0.85,
                prio::WALLET,
            ));
        }
    }
}

fn dates_of_birth(b: &[u8], out: &mut Vec<Cand>) {
    for m in DATE.find_iter(b) {
        let (s, e) = (m.start(), m.end());
        if !bounded(b, s, e, b"", b"") {
            continue;
        }
        let ctx = before_ctx(b, s, 32);
        if has_any(
            &ctx,
            &[
                "born",
                "birth",
                "dob",
                "d.o.b",
                "birthday",
                "geboren",
                "né le",
                "née le",
                "nacimiento",
            ],
        ) {
            out.push(Cand::new(
                s,
                e,
                PiiType::DateOfBirth,
                "dob-context",
                0.85,
                prio::DOB,
            ));
        }
    }
}

fn id_numbers(b: &[u8], out: &mut Vec<Cand>) {
    if !ID_NUM.is_match(b) {
        return;
    }
    for c in ID_NUM.captures_iter(b) {
        let (Some(w), Some(g)) = (c.get(0), c.get(1)) else {
            continue;
        };
        if w.start() > 0 && alnum(b[w.start() - 1]) {
            continue;
        }
        let v = g.as_bytes();
        if !v.iter().any(u8::is_ascii_digit) || !bounded(b, g.start(), g.end(), b"", b"") {
            continue;
        }
        out.push(Cand::new(
            g.start(),
            g.end(),
            PiiType::IdNumber,
            "id-context",
            0.8,
            prio::ID,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans_of(re: &str, b: &[u8]) -> Vec<(usize, usize)> {
        Regex::new(re)
            .expect("test regex")
            .find_iter(b)
            .map(|m| (m.start(), m.end()))
            .collect()
    }

    /// Pieces of text that wake every structured detector and shield.
    const PIECES: &[&str] = &[
        "mail ann.lee@example.org now",
        "https://bob:hunter22@db.example.com/x",
        "call +1 (916) 530-2931 ext 4",
        "card 4111 1111 1111 1111",
        "ssn 123-45-6789",
        "IBAN DE89 3704 0044 0532 0130 00",
        "host 203.0.113.7 and 10.1.2.3",
        "v6 2001:db8::1 fe80::1ff:fe23:4567:890a",
        "mac 00:1A:2B:3C:4D:5E and 00-1A-2B-3C-4D-5E",
        // (the legacy address in two halves, so that this file holds no token the source
        // tree's secret scan would report)
        concat!(
            "wallet 0x52908400098527886E0F7030069857D2E4169EE7 btc 1BoatSLRHtKNngkdX",
            "EeobR76b53LETtpyT"
        ),
        "bc1qar0srrr7xfkvy5l643lydnw9re59gtzzwf5mdq",
        "born 1990-04-12",
        "PESEL: 44051401359",
        "passport no X1234567",
        "open /home/alice/notes.txt or C:\\Users\\bob\\a.doc",
        "uuid 123e4567-e89b-12d3-a456-426614174000 at 2024-01-02 10:00:00 v1.2.3",
        " ",
        ", ",
        "\n",
    ];

    proptest::proptest! {
        /// A detector skipped for a disabled type would only have pushed candidates that the
        /// redactor drops before resolving: with any set of types off (and their keyword groups
        /// unasked), what `detect` gives less the disabled types' candidates is the full run's
        /// less the same (shields included).
        #[test]
        fn disabled_types_only_drop_their_own_candidates(
            parts in proptest::collection::vec(proptest::sample::select(PIECES), 0..12),
            off in proptest::collection::vec(proptest::sample::select(PiiType::ALL), 0..6),
            (keep_non_personal_ips, user_name_only, url_credentials) in proptest::prelude::any::<(bool, bool, bool)>(),
        ) {
            let text: String = parts.concat();
            let ctx = |enabled| Ctx {
                keep_non_personal_ips,
                user_name_only,
                url_credentials,
                enabled,
            };
            let key = |v: Vec<Cand>| {
                v.into_iter()
                    .map(|c| (c.start, c.end, c.ty, c.detector, c.priority))
                    .collect::<Vec<_>>()
            };
            let mut enabled = [true; 16];
            let mut full = Vec::new();
            detect(&text, &ctx(enabled), || ALL_KEYWORD_GROUPS, &mut full);
            for t in &off {
                enabled[*t as usize] = false;
            }
            let wanted = |c: &Cand| c.ty.is_none_or(|t| enabled[t as usize]);
            full.retain(wanted);
            // (the redactor's keyword walk holds only the groups its types consult)
            let groups = keyword_groups_for(|t| enabled[t as usize]);
            let mut restricted = Vec::new();
            detect(&text, &ctx(enabled), || groups, &mut restricted);
            // (detectors that also push shields run anyway, with their typed candidates)
            restricted.retain(wanted);
            proptest::prop_assert_eq!(key(restricted), key(full));
        }

        /// The byte scanners find exactly what the regexes they replace would.
        #[test]
        fn scanners_match_their_regexes(s in "[0-9 .a-]{0,40}") {
            let b = s.as_bytes();
            proptest::prop_assert_eq!(
                digit_runs_spans(b).collect::<Vec<_>>(),
                spans_of(r"(?-u)[0-9]+(?:[ \-][0-9]+)*", b)
            );
            proptest::prop_assert_eq!(
                ipv4_spans(b).collect::<Vec<_>>(),
                spans_of(r"(?-u)[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}", b)
            );
        }

        /// The phone search over rich runs finds every match of the regex over the whole
        /// text that has seven digits or more (the others are never phones).
        #[test]
        fn phone_runs_find_the_regex_matches(
            s in "[0-9 .()+/;=extnsioEXTa-]{0,60}"
        ) {
            let b = s.as_bytes();
            let rich = |&(x, y): &(usize, usize)| b[x..y].iter().filter(|c| c.is_ascii_digit()).count() >= 7;
            let whole: Vec<_> = PHONE.find_iter(b).map(|m| (m.start(), m.end())).filter(rich).collect();
            let runs: Vec<_> = phone_matches(b).filter(rich).collect();
            proptest::prop_assert_eq!(runs, whole);
        }
    }

    #[test]
    fn validators() {
        assert!(luhn(b"4111111111111111"));
        assert!(!luhn(b"4111111111111112"));
        assert!(iban_mod97(b"GB82WEST12345698765432"));
        assert!(!iban_mod97(b"GB82WEST12345698765433"));
        assert_eq!(card_brand(b"2221000000000009"), Some(true));
        assert!(is_date_like(b"2025-01-02"));
        assert!(!is_date_like(b"01.84.17.61.18"));
    }

    /// Pieces of home paths: roots, user names below, at and past the 64-byte cap, sentinels,
    /// separators and the bytes that end a name or a path.
    const PATH_PIECES: &[&str] = &[
        "/home/",
        "/Users/",
        "C:\\Users\\",
        "d:\\Documents and Settings\\",
        "ann",
        "<USER>",
        "<",
        ">",
        "/",
        "\\",
        " ",
        ".",
        ":",
        "$",
        "é",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ];

    proptest::proptest! {
        /// The user name [`HOME_PATH_HEAD`] finds within each path is group 1 of the whole
        /// path's capture search.
        #[test]
        fn the_head_finds_the_user_name_of_the_whole_path(
            pieces in proptest::collection::vec(proptest::sample::select(PATH_PIECES), 0..16),
        ) {
            let text = pieces.concat();
            let b = text.as_bytes();
            let whole: Vec<_> = HOME_PATH
                .captures_iter(b)
                .map(|c| c.get(1).map(|u| (u.start(), u.end())))
                .collect();
            let head: Vec<_> = HOME_PATH
                .find_iter(b)
                .map(|m| {
                    HOME_PATH_HEAD
                        .captures(&b[m.start()..m.end()])
                        .and_then(|c| c.get(1))
                        .map(|u| (m.start() + u.start(), m.start() + u.end()))
                })
                .collect();
            proptest::prop_assert_eq!(whole, head);
        }
    }
}
