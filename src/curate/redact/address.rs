//! Street and postal addresses. A street "core" is anchored on shapes that plain capitalised
//! text rarely has (house number + street-type word, a street-type prefix such as `rue`/`via`,
//! a compound street word such as `…straße 5`, PO boxes), then extended over unit, city,
//! state, postcode and country segments. Weak anchors need an extension or a context cue.

use std::sync::LazyLock;

use super::lexicon::{
    C_ADDRESS_PARTICLE, C_LOWER_CORE_KEY, C_POST_TYPE, C_PREFIX_TYPE, C_STRONG_SUFFIX, C_TITLE,
    C_TOWN_PARTICLE, C_UNIT, C_WEAK_SUFFIX, IN_COMMON, IN_FIRST, IN_PLACES, Kind, LEX, StaticSet,
    Tok, static_set as set,
};
use super::{Cand, PiiType, chars, prio};
use crate::curate::SpanIndex;

/// The word lists that become class bits on tokens (see `names::word_classes`).
pub(super) fn word_classes() -> Vec<(Vec<&'static str>, u32)> {
    let set = |s: &StaticSet| s.iter().copied().collect();
    vec![
        (set(&STRONG_SUFFIX), C_STRONG_SUFFIX),
        (set(&WEAK_SUFFIX), C_WEAK_SUFFIX),
        (set(&PREFIX_TYPE), C_PREFIX_TYPE),
        (set(&POST_TYPE), C_POST_TYPE),
        (set(&UNIT), C_UNIT),
        (PARTICLES.to_vec(), C_ADDRESS_PARTICLE),
        (TOWN_PARTICLES.to_vec(), C_TOWN_PARTICLE),
        (LOWER_CORE_KEYS.to_vec(), C_LOWER_CORE_KEY),
    ]
}

/// Keys with which [`core`] opens a street core even in lower case, besides the prefix
/// street types: `p.o. box`, `psc 7951, box 9972`, `unit 1009 box 0219`.
const LOWER_CORE_KEYS: &[&str] = &["p", "psc", "unit"];

/// Whether [`core`] can find anything at `t`: every rule opens at a number, a capitalised
/// word, a prefix street type or one of [`LOWER_CORE_KEYS`]. Most tokens are none of these
/// and skip the call and its string comparisons (one branch, with `&`).
fn may_open_core(t: &Tok) -> bool {
    let word = (t.kind == Kind::Word) & (t.cap | t.is(C_PREFIX_TYPE | C_LOWER_CORE_KEY));
    !t.sentinel & (word | (t.kind == Kind::Num))
}

/// Street-type words that follow the name (US/UK style), folded. Strong ones are rarely
/// anything but a street.
static STRONG_SUFFIX: LazyLock<StaticSet> = LazyLock::new(|| {
    set(
        "street st avenue ave av road rd lane ln drive dr boulevard blvd court ct crescent terrace \
         highway hwy parkway pkwy circle cir alley expressway freeway turnpike plaza square sq str \
         close gardens mews row place pl way trail trl",
    )
});
static WEAK_SUFFIX: LazyLock<StaticSet> = LazyLock::new(|| {
    set(
        "bank branch bridge brook brooks burg burgs bypass camp canyon cape causeway center centers \
         circles cliff cliffs club common commons corner corners course courts cove coves creek crest \
         crossing crossroad curve dale dam divide drives estate estates extension extensions fall falls \
         ferry field fields flat flats ford fords forest forge forges fork forks fort garden gateway glen \
         glens green greens grove groves harbor harbors haven heights hill hills hollow inlet island \
         islands isle junction junctions key keys knoll knolls lake lakes land landing light lights loaf \
         lock locks lodge loop mall manor manors meadow meadows mill mills mission motorway mount \
         mountain mountains neck orchard oval overpass park parks parkways pass passage path pike pine \
         pines plain plains point points port ports prairie radial ramp ranch rapid rapids rest ridge \
         ridges river roads route run shoal shoals shore shores skyway spring springs spur spurs squares \
         station stravenue stream streets summit throughway trace track trafficway trailer tunnel \
         underpass union unions valley valleys viaduct view views village villages ville vista walk \
         walks wall ways well wells rue via arcade quay approach copse alleyway esplanade \
         promenade rise grange wynd",
    )
});
/// Street-type words that come before the name (Romance, Slavic, Portuguese …), folded.
static PREFIX_TYPE: LazyLock<StaticSet> = LazyLock::new(|| {
    set(
        "rue avenue boulevard bd chemin allee impasse place quai route cours square via viale piazza \
         corso largo vicolo strada calle avenida paseo plaza camino carrer ronda glorieta travesia rua \
         travessa praca estrada alameda ul ulica aleja al plac rambla carretera callejon pasaje vale \
         contrada piazzale lungomare av avda c λεωφόρος οδός οδος улица ул проспект пр переулок \
         бульвар просп бул пер наб ш шоссе пл площадь проезд тупик набережная аллея pl cuesta \
         stretto borgo vico piazzetta ladeira recanto vereda viela rodovia travesía travesia jalan \
         jl",
    )
});
/// Endings of one-word street names (German, Dutch, Nordic, Finnish, Icelandic …), folded.
const COMPOUND_SUFFIX: &[&str] = &[
    "strasse", "str", "weg", "gasse", "platz", "allee", "ring", "damm", "ufer", "chaussee",
    "steig", "pfad", "markt", "vagen", "gatan", "gata", "gade", "vej", "veien", "vegen", "gate",
    "laan", "straat", "plein", "gracht", "kade", "dijk", "singel", "kuja", "katu", "tie", "polku",
    "straeti", "stigur", "braut", "utca", "ulice", "cesta", "torget", "torv", "stien", "backe",
    "gränd", "grand", "straede", "plads", "vaenge", "gyde", "kaari", "rinne", "raitti", "baan",
    "dreef",
];
/// Separate street-type words that follow the name (Hungarian, Greek transliterations …).
static POST_TYPE: LazyLock<StaticSet> = LazyLock::new(|| {
    set(
        "ut utca u utja kapu ter korut sor str odos rkp rakpart terrasse vei veg veien gate gata \
             gaten vej gade plass tee tie iela gatve pot",
    )
});
static UNIT: LazyLock<StaticSet> = LazyLock::new(|| {
    set(
        "apt apartment suite ste unit flat floor fl room rm studio bldg building box level piso puerta \
         planta piano appartamento interno scala escalera esc etage stock lgh кв квартира стр \
         строение корп корпус к д",
    )
});
/// Places inside a building or site that take a number (`Gate 12`): never a street name.
static VENUE: LazyLock<StaticSet> = LazyLock::new(|| {
    set(
        "gate terminal platform pier dock berth track stage booth table exit door entrance level \
         floor room hall lot bay counter window desk seat row section zone area block wing hangar \
         studio lab ward bed building house chapter page step version",
    )
});
const CUES: &[&str] = &[
    "address",
    "live at",
    "lives at",
    "living at",
    "ship to",
    "ships to",
    "shipped to",
    "deliver",
    "located at",
    "moved to",
    "mail to",
    "send it to",
    "lives on",
    "live on",
    "living on",
    "located on",
    "is at",
    "sent to",
    "send to",
    "drops you off at",
    "drop me off at",
    "enter on",
    "meet me at",
    "meet you at",
    "return to",
    "adresse",
    "direccion",
    "indirizzo",
    "anschrift",
    "property is at",
];

fn key<'a>(t: &'a Tok) -> &'a str {
    t.key.as_ref()
}

fn is_house_no(t: &Tok, text: &str) -> bool {
    if t.kind != Kind::Num || t.sentinel {
        return false;
    }
    let s = t.text(text);
    let lead = s.bytes().take_while(u8::is_ascii_digit).count();
    (1..=6).contains(&lead) && s.len() <= 10
}

/// A postcode in one token: 4, 5, 6 or 8 digits (`1050`, `75008`, `236374`, a Brazilian
/// `72486598`), digits with a dash (`12345-6789`, `01310-100`, `30-312`, `1000-001`), or a
/// country letter prefix (`H-6607`, `D-10115`, `CH-8001`).
fn is_zip(t: &Tok, text: &str) -> bool {
    let s = t.text(text).as_bytes();
    let digits = |b: &[u8]| b.iter().take_while(|c| c.is_ascii_digit()).count();
    match t.kind {
        Kind::Num => {
            let d = digits(s);
            if d == s.len() {
                return matches!(d, 4 | 5 | 6 | 8);
            }
            s[d] == b'-' && {
                let r = &s[d + 1..];
                digits(r) == r.len() && matches!((d, r.len()), (5, 4) | (5, 3) | (2, 3) | (4, 3))
            }
        }
        Kind::Word => {
            // `H-6607`, or a town joined to its postcode (`Jaunpur-809275`)
            let Some(p) = s.iter().rposition(|&c| c == b'-') else {
                return false;
            };
            let (head, r) = (&s[..p], &s[p + 1..]);
            digits(r) == r.len()
                && (4..=6).contains(&r.len())
                && (head.len() <= 2 && head.iter().all(u8::is_ascii_uppercase)
                    || t.cap && head.len() >= 3 && !head.iter().any(u8::is_ascii_digit))
        }
        Kind::Punct => false,
    }
}

/// (`&`: one branch on the answer, as in `names::capword`.)
fn is_capword(t: &Tok) -> bool {
    (t.kind == Kind::Word) & t.cap & !t.sentinel
}

fn compound_street(t: &Tok) -> bool {
    if !is_capword(t) {
        return false;
    }
    let k = key(t).as_bytes();
    let Some(&last) = k.last() else {
        return false;
    };
    COMPOUND_SUFFIX_BY_LAST_BYTE[usize::from(last)]
        .iter()
        .any(|s| k.len() >= s.len() + 3 && k.ends_with(s))
}

/// [`COMPOUND_SUFFIX`] grouped by last byte, so a word meets only the few suffixes ending as it
/// does, rather than the whole list for every capitalised word.
static COMPOUND_SUFFIX_BY_LAST_BYTE: LazyLock<Vec<Vec<&'static [u8]>>> = LazyLock::new(|| {
    let mut by_last = vec![Vec::new(); 256];
    for s in COMPOUND_SUFFIX {
        if let Some(&last) = s.as_bytes().last() {
            by_last[usize::from(last)].push(s.as_bytes());
        }
    }
    by_last
});

const PARTICLES: &[&str] = &[
    "de", "du", "des", "la", "le", "les", "del", "della", "di", "da", "dos", "das", "do", "der",
    "den", "van", "von", "am", "an", "im", "sur", "sous", "en", "y", "e", "i", "l'", "d'", "of",
    "the", "dei", "degli", "delle", "ten", "ter",
];

/// Particles inside town names only (`Črni Vrh nad Idrijo`, `Ostrov nad Ohří`, `Stratford
/// upon Avon`); too ambiguous inside street names.
const TOWN_PARTICLES: &[&str] = &["nad", "pod", "na", "u", "upon", "bei"];

fn is_particle(t: &Tok) -> bool {
    t.kind == Kind::Word && !t.cap && t.is(C_ADDRESS_PARTICLE)
}

/// `L1B 3AH`, `SW1A 1AA`, `H2X 1Y4` (UK and Canadian postcodes) starting at `i`.
fn postcode(toks: &[Tok], i: usize, text: &str) -> Option<usize> {
    let a = toks.get(i)?.text(text).as_bytes();
    let b = toks.get(i + 1)?.text(text).as_bytes();
    let up = |s: &[u8]| {
        s.iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
    };
    let uk_out = (2..=4).contains(&a.len())
        && a[0].is_ascii_uppercase()
        && a.iter().any(u8::is_ascii_digit)
        && up(a);
    let uk_in = b.len() == 3
        && b[0].is_ascii_digit()
        && b[1].is_ascii_uppercase()
        && b[2].is_ascii_uppercase();
    let ca = a.len() == 3
        && b.len() == 3
        && up(a)
        && up(b)
        && a[1].is_ascii_digit()
        && b[0].is_ascii_digit();
    if (uk_out && uk_in) || ca {
        Some(i + 2)
    } else {
        None
    }
}

/// Skips a separator (`,`, line breaks, spaces) and returns the next index and whether it was
/// a strong separator (comma or line break).
fn sep(toks: &[Tok], i: usize, text: &str) -> (usize, bool) {
    let mut j = i;
    let mut strong = toks.get(j).is_some_and(|t| t.nl_before);
    let mut in_mark = false;
    while let Some(t) = toks.get(j) {
        // commas, and line-prefix marks of quoted or listed text (`>`, `???`, `*`): any run of
        // punctuation opening a line
        let line_mark = t.kind == Kind::Punct
            && !t.is_punct(text, '#')
            && !t.is_punct(text, '(')
            && (t.nl_before || in_mark);
        in_mark = line_mark;
        if t.is_punct(text, ',') || line_mark {
            strong = true;
            j += 1;
            if toks.get(j).is_some_and(|t| t.nl_before) {
                strong = true;
            }
        } else {
            break;
        }
    }
    (j, strong)
}

/// A run of capitalised (or all-caps) words forming a town name, with particles and hyphens.
fn city(toks: &[Tok], text: &str, i: usize) -> Option<usize> {
    let mut j = i;
    let mut words = 0;
    while let Some(t) = toks.get(j) {
        if j > i && t.nl_before {
            break;
        }
        let town_particle = t.kind == Kind::Word && !t.cap && t.is(C_TOWN_PARTICLE);
        if is_capword(t) || (words > 0 && (is_particle(t) || town_particle)) {
            if is_capword(t) {
                words += 1;
            }
            j += 1;
            if words >= 4 {
                break;
            }
        } else {
            break;
        }
    }
    // do not end on a particle; a lone common word ("Thanks") is no town
    while j > i && !is_capword(&toks[j - 1]) {
        j -= 1;
    }
    // an all-caps line (`LOW STREET`) is an address-block town even if made of common words
    let all_common = toks[i..j]
        .iter()
        .filter(|t| is_capword(t))
        .all(|t| t.is(IN_COMMON) && !t.is(IN_PLACES) && !t.all_caps);
    (words > 0 && !all_common).then(|| paren_tail(toks, j, text))
}

/// Skips a parenthesised gloss on the same line after a town or country (`ΑΓΛΑΝΤΖΙΑ
/// (ΑΓΛΑΓΓΙΑ)`, `Cyprus (Greek)`): one or two capitalised words in brackets.
fn paren_tail(toks: &[Tok], j: usize, text: &str) -> usize {
    if !toks
        .get(j)
        .is_some_and(|t| t.is_punct(text, '(') && !t.nl_before)
    {
        return j;
    }
    let mut k = j + 1;
    while k < toks.len() && k < j + 3 && is_capword(&toks[k]) && !toks[k].nl_before {
        k += 1;
    }
    if k > j + 1 && toks.get(k).is_some_and(|t| t.is_punct(text, ')')) {
        k + 1
    } else {
        j
    }
}

/// Up to three capitalised or all-caps words on one line, not all common words (a town with
/// its region or country).
fn town_run(toks: &[Tok], i: usize) -> Option<usize> {
    let mut j = i;
    while j < toks.len() && j - i < 3 && is_capword(&toks[j]) && (j == i || !toks[j].nl_before) {
        j += 1;
    }
    let all_common = toks[i..j]
        .iter()
        .all(|t| t.is(IN_COMMON) && !t.is(IN_PLACES));
    (j > i && !all_common).then_some(j)
}

fn country(toks: &[Tok], text: &str, i: usize) -> Option<usize> {
    let t = toks.get(i)?;
    if !is_capword(t) {
        return None;
    }
    let k = key(t);
    if matches!(
        k,
        "united" | "south" | "north" | "new" | "czech" | "saudi" | "costa" | "sri" | "el"
    ) {
        let n = toks.get(i + 1)?;
        if is_capword(n) {
            return Some(paren_tail(toks, i + 2, text));
        }
        return None;
    }
    t.is(IN_PLACES).then(|| paren_tail(toks, i + 1, text))
}

/// A short region code in an address block: up to three letters (`VWV`, `mp`) or a one- or
/// two-digit number (`13`).
fn region_code(t: &Tok, text: &str) -> bool {
    let s = t.text(text);
    !t.sentinel
        && match t.kind {
            Kind::Word => {
                s.chars().count() <= 3
                    && s.chars().all(chars::is_alphabetic)
                    && !matches!(
                        &*t.key,
                        "and" | "or" | "the" | "to" | "in" | "at" | "on" | "of" | "for" | "via"
                    )
            }
            Kind::Num => s.len() <= 2 && s.bytes().all(|c| c.is_ascii_digit()),
            Kind::Punct => false,
        }
}

/// A region code at `j` followed by a postcode that closes the address (nothing but
/// lower-case words or punctuation after it on its line) or by a country.
fn region_then_code(toks: &[Tok], j: usize, text: &str) -> bool {
    if !toks.get(j).is_some_and(|t| region_code(t, text)) {
        return false;
    }
    let (n, _) = sep(toks, j + 1, text);
    let Some(z) = toks.get(n) else {
        return false;
    };
    (is_zip(z, text)
        && toks
            .get(n + 1)
            .is_none_or(|x| x.nl_before || x.kind == Kind::Punct || x.kind == Kind::Word && !x.cap))
        || country(toks, text, n).is_some()
}

fn is_state(t: &Tok, text: &str) -> bool {
    t.kind == Kind::Word && t.text(text).len() == 2 && t.all_caps
}

/// Unit designator `Apt. 810`, `Suite 433`, `Flat 6`, `# 5` starting at `i`.
fn unit(toks: &[Tok], i: usize, text: &str) -> Option<usize> {
    let t = toks.get(i)?;
    if t.kind == Kind::Num && !t.sentinel {
        return floor(toks, i, text);
    }
    let mut j = i;
    if t.kind == Kind::Word && t.is(C_UNIT) {
        j += 1;
        if toks.get(j).is_some_and(|t| t.is_punct(text, '.')) {
            j += 1;
        }
    } else if t.is_punct(text, '#') {
        j += 1;
    } else {
        return None;
    }
    let n = toks.get(j)?;
    (n.kind == Kind::Num || (n.kind == Kind::Word && n.text(text).len() <= 3 && n.all_caps))
        .then_some(j + 1)
}

/// A floor and door after the house number: `6º A`, `3ª` (Spanish), `5. th.`, `2. tv.`
/// (Danish: floor, then the side of the landing).
fn floor(toks: &[Tok], i: usize, text: &str) -> Option<usize> {
    let t = toks.get(i)?;
    let s = t.text(text);
    if s.ends_with(['º', 'ª']) && s.bytes().next().is_some_and(|c| c.is_ascii_digit()) {
        let door = toks.get(i + 1).is_some_and(|x| {
            !x.nl_before && x.kind == Kind::Word && x.cap && x.text(text).len() == 1
        });
        return Some(i + 1 + usize::from(door));
    }
    let side = toks.get(i + 2)?;
    if s.len() <= 2
        && s.bytes().all(|c| c.is_ascii_digit())
        && toks
            .get(i + 1)
            .is_some_and(|x| x.is_punct(text, '.') && !x.sp_before)
        && !side.nl_before
        && matches!(side.text(text), "th" | "tv" | "mf")
    {
        let dot = toks
            .get(i + 3)
            .is_some_and(|x| x.is_punct(text, '.') && !x.sp_before);
        return Some(i + 3 + usize::from(dot));
    }
    None
}

/// APO/FPO/DPO line: `APO AA 69974`.
fn military_line(toks: &[Tok], i: usize, text: &str) -> Option<usize> {
    let t = toks.get(i)?;
    if !matches!(t.text(text), "APO" | "FPO" | "DPO" | "apo" | "fpo" | "dpo") {
        return None;
    }
    let s = toks.get(i + 1)?;
    let z = toks.get(i + 2)?;
    (s.kind == Kind::Word && s.text(text).len() == 2 && is_zip(z, text)).then_some(i + 3)
}

/// Extends a street core ending at `k` over following address segments.
/// Returns (end token index, segments consumed, saw postcode/zip/state).
fn extend(toks: &[Tok], mut k: usize, text: &str) -> (usize, usize, bool) {
    let mut segs = 0;
    let mut strong_seg = false;
    let mut prev_zip = false;
    let mut prev_unit = false;
    for _ in 0..8 {
        // `u. 97.` / `tér 19.` at a line end or before a unit (`13. Suite 104`): the house
        // number's dot, not a full stop
        if k >= 1
            && toks
                .get(k)
                .is_some_and(|t| t.is_punct(text, '.') && !t.sp_before)
            && toks[k - 1].kind == Kind::Num
            && toks.get(k + 1).is_some_and(|t| {
                t.nl_before || (is_capword(t) && t.is(C_UNIT)) || t.is_punct(text, ',')
            })
        {
            k += 1;
        }
        let (j, strong) = sep(toks, k, text);
        let after_unit = std::mem::take(&mut prev_unit);
        if j >= toks.len() {
            break;
        }
        if toks[j].sentinel {
            break;
        }
        if let Some(e) = unit(toks, j, text).or_else(|| military_line(toks, j, text)) {
            prev_unit = unit(toks, j, text).is_some();
            k = e;
            segs += 1;
            prev_zip = false;
            if military_line(toks, j, text).is_some() {
                strong_seg = true;
            }
            continue;
        }
        if let Some(e) = postcode(toks, j, text) {
            k = e;
            segs += 1;
            strong_seg = true;
            prev_zip = true;
            continue;
        }
        if is_zip(&toks[j], text) {
            k = j + 1;
            segs += 1;
            strong_seg = true;
            // `3779 EP`: the letters of a Dutch postcode
            if toks.get(k).is_some_and(|t| {
                !t.nl_before && t.kind == Kind::Word && t.all_caps && t.text(text).len() == 2
            }) && toks
                .get(k + 1)
                .is_none_or(|t| t.nl_before || t.kind == Kind::Punct)
            {
                k += 1;
            }
            // `12345 City`, `72486598 Albuquerque / MT`
            if let Some(e) = city(toks, text, k).filter(|_| !toks[k].nl_before) {
                k = e;
                if toks
                    .get(k)
                    .is_some_and(|t| t.is_punct(text, '/') && !t.nl_before)
                    && toks
                        .get(k + 1)
                        .is_some_and(|t| is_state(t, text) && !t.nl_before)
                {
                    k += 2;
                }
            } else {
                prev_zip = true;
            }
            continue;
        }
        if is_state(&toks[j], text) && toks.get(j + 1).is_some_and(|t| is_zip(t, text)) {
            k = j + 2;
            segs += 1;
            strong_seg = true;
            continue;
        }
        // `, VWV\n 04494`, `, 13\n 44939`, `, mp 35739`: a region code after a town line,
        // then a postcode or a country
        if strong && segs > 0 && region_then_code(toks, j, text) {
            k = j + 1;
            segs += 1;
            continue;
        }
        // a country, unless it opens a longer town name that an address segment follows
        // (`Porto Alegre, RS`, `Colorado Springs, CO`)
        if let Some(e) = country(toks, text, j).filter(|&e| {
            (strong || prev_zip)
                && !(e == j + 1
                    && city(toks, text, j).is_some_and(|c| c > e && addr_follows(toks, c, text)))
        }) {
            k = e;
            segs += 1;
            if toks.get(k).is_some_and(|t| is_zip(t, text)) {
                k += 1;
                strong_seg = true;
            }
            continue;
        }
        // `Apt. 615 Moosleerau Switzerland`, `Suite 019 CHARLEROI Victoria`: a town (and region
        // or country) right after a unit, closing the line or the sentence
        if after_unit
            && !strong
            && !toks[j].nl_before
            && let Some(e) = town_run(toks, j)
            && toks.get(e).is_none_or(|t| {
                t.nl_before
                    || t.kind == Kind::Word && !t.cap
                    || t.kind == Kind::Punct
                        && matches!(t.text(text), "." | "," | "?" | "!" | ";" | ")")
            })
        {
            k = e;
            segs += 1;
            continue;
        }
        if !(strong || prev_zip) {
            break;
        }
        // `Spain 97197`, `Greenlander 26364`: a place line ending in a postcode
        if let Some(e) = city(toks, text, j)
            && toks.get(e).is_some_and(|z| is_zip(z, text) && !z.nl_before)
        {
            k = e + 1;
            segs += 1;
            strong_seg = true;
            continue;
        }
        if let Some(e) = city(toks, text, j) {
            // a town must be followed by another address segment, or be a known place
            let next_is_addr = addr_follows(toks, e, text);
            let known = e == j + 1 && toks[j].is(IN_PLACES);
            if next_is_addr || known || prev_zip {
                k = e;
                segs += 1;
                prev_zip = false;
                // `, nan` (missing state in some data) and bare state codes
                continue;
            }
        }
        // bare 2-letter state followed by nothing (`, CO`)
        if is_state(&toks[j], text) && strong && segs > 0 {
            k = j + 1;
            segs += 1;
            continue;
        }
        break;
    }
    (k, segs, strong_seg)
}

/// True if another address segment follows token `e` (after a separator): a ZIP, state,
/// postcode, country, military line, unit, or a place line ending in a postcode
/// (`Greenlander 07609`).
fn addr_follows(toks: &[Tok], e: usize, text: &str) -> bool {
    let (n, _) = sep(toks, e, text);
    toks.get(n).is_some_and(|t| {
        is_zip(t, text)
            || (is_state(t, text) && toks.get(n + 1).is_some_and(|z| is_zip(z, text)))
            || t.all_caps && t.kind == Kind::Word && t.text(text).len() == 2
    }) || region_then_code(toks, n, text)
        || postcode(toks, n, text).is_some()
        || country(toks, text, n).is_some()
        || military_line(toks, n, text).is_some()
        || unit(toks, n, text).is_some()
        || city(toks, text, n)
            .is_some_and(|c| toks.get(c).is_some_and(|z| is_zip(z, text) && !z.nl_before))
}

/// The cues as one ASCII-case-insensitive automaton (the cues are ASCII): one pass over the
/// window instead of lower-casing it and searching it once per cue.
static CUE_AC: LazyLock<aho_corasick::AhoCorasick> = LazyLock::new(|| {
    aho_corasick::AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .build(CUES)
        // constant literals: cannot fail
        .expect("constant address cue automaton")
});

/// True if an address cue (`lives at`, `ship to` …) occurs in the 48 bytes before `s`.
fn cue_before(text: &str, s: usize) -> bool {
    let mut lo = s.saturating_sub(48);
    while !text.is_char_boundary(lo) {
        lo += 1;
    }
    CUE_AC.is_match(&text[lo..s])
}

/// How much evidence a street core carries on its own.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    /// Accept as is (house number + strong street type, PO box, compound street + number).
    Strong,
    /// Needs one more address segment (unit, town, postcode) or a context cue.
    Weak,
    /// Needs a postcode or ZIP after it (street name without a number).
    NeedsCode,
}

/// Finds the street core starting at token `i`: (start tok, end tok exclusive, level).
fn core(toks: &[Tok], i: usize, text: &str) -> Option<(usize, usize, Level)> {
    let t = &toks[i];
    if t.sentinel {
        return None;
    }
    // D: PO boxes and military addresses
    if t.kind == Kind::Word {
        let k = key(t);
        if k == "p"
            && toks.get(i + 1).is_some_and(|x| x.is_punct(text, '.'))
            && let (Some(o), Some(b)) = (toks.get(i + 2), toks.get(i + 4))
            && key(o) == "o"
            && key(b) == "box"
            && toks.get(i + 5).is_some_and(|n| n.kind == Kind::Num)
        {
            return Some((lead_no(toks, i, text), i + 6, Level::Strong));
        }
        if (k == "po" || k == "postbox" || k == "pobox") && t.cap {
            let mut j = i + 1;
            if k == "po" {
                if toks.get(j).is_some_and(|x| key(x) == "box") {
                    j += 1;
                } else {
                    return None;
                }
            }
            if toks.get(j).is_some_and(|n| n.kind == Kind::Num) {
                return Some((lead_no(toks, i, text), j + 1, Level::Strong));
            }
        }
        if k == "psc" || k == "unit" {
            // PSC 7951, Box 9972 / Unit 5477 Box 8244; in lower case only before an
            // APO/FPO/DPO line (`unit 1009 box 0219\ndpo ap 51065`)
            let n = toks.get(i + 1)?;
            if n.kind == Kind::Num {
                let (j, _) = sep(toks, i + 2, text);
                if toks.get(j).is_some_and(|b| key(b) == "box")
                    && toks.get(j + 1).is_some_and(|n| n.kind == Kind::Num)
                    && (t.cap || military_line(toks, sep(toks, j + 2, text).0, text).is_some())
                {
                    return Some((i, j + 2, Level::Strong));
                }
            }
        }
        if matches!(t.text(text), "USNS" | "USNV" | "USS" | "USCGC") {
            let mut j = i + 1;
            while toks.get(j).is_some_and(|x| is_capword(x) && !x.nl_before) {
                j += 1;
            }
            let (n, _) = sep(toks, j, text);
            if j > i + 1 && military_line(toks, n, text).is_some() {
                return Some((i, j, Level::Strong));
            }
        }
        // E: Flat 6, Garry Neck
        if matches!(k, "flat" | "studio" | "apartment") && t.cap {
            let n = toks.get(i + 1)?;
            if n.kind == Kind::Num {
                let (j, _) = sep(toks, i + 2, text);
                if let Some(e) = us_street_words(toks, j, text) {
                    return Some((i, e, Level::Strong));
                }
            }
        }
        // B: prefix street types (rue de X, Via Tasso 129, ul. Miła 57)
        if t.is(C_PREFIX_TYPE) {
            let mut j = i + 1;
            if toks.get(j).is_some_and(|x| x.is_punct(text, '.')) {
                j += 1;
            } else if k == "c" && toks.get(j).is_some_and(|x| x.is_punct(text, '/')) {
                // `C/ Mayor 5` (Spanish `calle`)
                j += 1;
            } else if matches!(k, "ul" | "al" | "bd") || is_bare_street_abbreviation(k) {
                return None;
            }
            let start_words = j;
            let mut caps = 0;
            // after a house number (`26 rue des lieutenants Thomazo`) lower-case name words
            // that are no ordinary English words count too
            let numbered = i >= 1 && is_house_no(&toks[i - 1], text) && !t.nl_before;
            let name_word = |x: &Tok| {
                is_capword(x)
                    || numbered
                        && x.kind == Kind::Word
                        && !x.cap
                        && !x.sentinel
                        && !is_particle(x)
                        && !x.is(IN_COMMON | C_UNIT | C_STRONG_SUFFIX)
            };
            let mut last_name = j;
            while let Some(x) = toks.get(j) {
                if x.nl_before || x.sentinel {
                    break;
                }
                // a unit (`Apt. 087`) ends the street name
                if is_capword(x) && x.is(C_UNIT) && unit(toks, j, text).is_some() {
                    break;
                }
                if name_word(x) {
                    caps += 1;
                    last_name = j + 1;
                } else if !is_particle(x) {
                    break;
                }
                j += 1;
                if j - start_words >= 6 {
                    break;
                }
            }
            j = j.min(last_name);
            if caps == 0 {
                return None;
            }
            let mut strong = false;
            if toks
                .get(j)
                .is_some_and(|x| is_house_no(x, text) && !x.nl_before)
            {
                j += 1;
                strong = true;
            } else if let Some(e) = house_after_comma(toks, j, text) {
                // `Via Ricciardi, 327`, `ул. Лермонтова, д. 44`
                j = e;
                strong = true;
            }
            // leading house number: `11, avenue …` or `62 Rue …`
            let mut s = i;
            if i >= 1 && is_house_no(&toks[i - 1], text) {
                s = i - 1;
                strong = true;
            } else if i >= 2 && toks[i - 1].is_punct(text, ',') && is_house_no(&toks[i - 2], text) {
                s = i - 2;
                strong = true;
            }
            // bare abbreviations (`Av`, `C/`) are too short to stand without a number
            if !strong && (matches!(k, "av" | "avda" | "ул") || is_bare_street_abbreviation(k)) {
                return None;
            }
            return Some((
                s,
                j,
                if strong {
                    Level::Strong
                } else {
                    Level::NeedsCode
                },
            ));
        }
        // C: compound street word + number (Scholzstraße 7877, Kurt-Schumacher-Str. 5/8)
        if compound_street(t) {
            let mut j = i + 1;
            if toks.get(j).is_some_and(|x| x.is_punct(text, '.')) {
                j += 1;
            }
            if toks
                .get(j)
                .is_some_and(|x| is_house_no(x, text) && !x.nl_before)
            {
                let mut s = i;
                if i >= 1 && is_house_no(&toks[i - 1], text) && !toks[i].nl_before {
                    s = i - 1;
                }
                let mut e = j + 1;
                if toks
                    .get(e)
                    .is_some_and(|x| x.is_punct(text, '.') && !x.sp_before)
                    && toks.get(e + 1).is_some_and(|x| {
                        x.kind != Kind::Word || !x.cap || x.nl_before || x.sp_before
                    })
                {
                    // Hungarian-style `39.` house numbers keep their dot only mid-sentence
                    if toks.get(e + 1).is_some_and(|x| !x.cap) {
                        e += 1;
                    }
                }
                return Some((s, e, Level::Strong));
            }
        }
        // Hungarian/Greek/Nordic: Rákóczi út 66., Kálmán Imre u. 12., Árpád fejedelem útja 62.,
        // Stensås terrasse 38: up to three name words (a leading common word only right
        // before the type) then a lower-case street type and a number
        if is_capword(t)
            && let Some(p) = (i + 1..(i + 4).min(toks.len())).find(|&p| {
                let pt = &toks[p];
                pt.kind == Kind::Word && !pt.cap && pt.is(C_POST_TYPE) && !pt.nl_before
            })
            && (i + 1..p).all(|m| toks[m].kind == Kind::Word && !toks[m].nl_before)
            && (p == i + 1 || !t.is(IN_COMMON) || t.is(IN_PLACES))
        {
            let mut j = p + 1;
            if toks.get(j).is_some_and(|x| x.is_punct(text, '.')) {
                j += 1;
            }
            if toks.get(j).is_some_and(|x| is_house_no(x, text)) {
                let s = if i >= 1 && is_house_no(&toks[i - 1], text) {
                    i - 1
                } else {
                    i
                };
                return Some((s, j + 1, Level::Strong));
            }
        }
        // G: number-last street right after an address cue (`lives on Joaquin Suarez 2906`,
        // `enter on Hoge Wei 32`): a name run (not only common words) and a house number
        if is_capword(t)
            && (i == 0 || !is_capword(&toks[i - 1]))
            && i >= 1
            && (toks[i - 1].is_punct(text, ':')
                || matches!(key(&toks[i - 1]), "on" | "at" | "to" | "of" | "in"))
            && cue_before(text, t.s)
        {
            let mut j = i;
            while j < toks.len()
                && j < i + 4
                && !toks[j].nl_before
                && (is_capword(&toks[j]) || (j > i && is_particle(&toks[j])))
            {
                j += 1;
            }
            while j > i + 1 && !is_capword(&toks[j - 1]) {
                j -= 1;
            }
            // a venue with a number (`Gate 12`, `Terminal 2`) is no street; a lone word must
            // look like a name
            let words: Vec<&Tok> = toks[i..j].iter().filter(|x| is_capword(x)).collect();
            let named = words.iter().any(|x| !x.is(IN_COMMON) || x.is(IN_PLACES))
                && !words.iter().any(|x| VENUE.contains(key(x)))
                && (words.len() >= 2
                    || words.iter().any(|x| {
                        !x.key.is_ascii() || x.is(IN_PLACES) || LEX.name_score(&x.key) > 0.0
                    }));
            if named
                && toks
                    .get(j)
                    .is_some_and(|x| is_house_no(x, text) && !x.nl_before)
            {
                return Some((i, j + 1, Level::Strong));
            }
        }
        // F: street words without a number; accepted only with a postcode later
        if is_capword(t)
            && (i == 0 || !is_capword(&toks[i - 1]))
            && let Some(e) = us_street_words(toks, i, text)
        {
            return Some((i, e, Level::NeedsCode));
        }
        return None;
    }
    // A: house number + street words + street type
    if is_house_no(t, text) {
        if i >= 1
            && (toks[i - 1].is_punct(text, '$')
                || toks[i - 1].is_punct(text, '€')
                || toks[i - 1].is_punct(text, '£'))
        {
            return None;
        }
        let j = i + 1;
        let n = toks.get(j)?;
        if n.nl_before {
            return None;
        }
        // `54, Deshpande Street`, `85/260, Subramanian Path`: the number, a comma, then the
        // street; as weak as a street without its town
        if n.is_punct(text, ',') {
            if toks.get(j + 1).is_none_or(|x| x.nl_before) {
                return None;
            }
            let e = us_street_words(toks, j + 1, text)?;
            return toks[last_word(toks, e)]
                .is(C_STRONG_SUFFIX)
                .then_some((i, e, Level::Weak));
        }
        // `3378 217 Lovers Lane`: two numbers (postcode or house range) before the street
        let s = if i >= 1 && is_house_no(&toks[i - 1], text) && !t.nl_before {
            i - 1
        } else {
            i
        };
        if let Some(e) = us_street_words(toks, j, text) {
            let strong = toks[last_word(toks, e)].is(C_STRONG_SUFFIX);
            return Some((s, e, if strong { Level::Strong } else { Level::Weak }));
        }
        // `20789 Allika 46`, `0138 Brisas 6802`: number, street words, house number
        let mut k = j;
        while k < toks.len() && k < j + 4 && is_capword(&toks[k]) && !toks[k].nl_before {
            k += 1;
        }
        if k > j
            && toks
                .get(k)
                .is_some_and(|x| is_house_no(x, text) && !x.nl_before)
        {
            return Some((s, k + 1, Level::Weak));
        }
        // number before a prefix type or compound street: let those anchors handle it
        return None;
    }
    None
}

/// The house number after a street name and a comma, as Romance and Slavic addresses write
/// it: `, 327`, `, д. 44` (Russian `дом`). Returns the end token.
fn house_after_comma(toks: &[Tok], j: usize, text: &str) -> Option<usize> {
    if !toks.get(j)?.is_punct(text, ',') {
        return None;
    }
    let mut n = j + 1;
    if toks.get(n).is_some_and(|x| key(x) == "д" && !x.nl_before)
        && toks.get(n + 1).is_some_and(|x| x.is_punct(text, '.'))
    {
        n += 2;
    }
    let h = toks.get(n)?;
    (!h.nl_before && is_house_no(h, text) && !is_zip(h, text)).then_some(n + 1)
}

/// Settlement abbreviations before a town (Russian `г.` city, `ст.` stanitsa, `д.` village,
/// `с.` village, `пос.` settlement …).
const SETTLEMENTS: &[&str] = &[
    "г", "гор", "ст", "с", "пос", "п", "д", "дер", "пгт", "рп", "х",
];

/// The start of a town written before the street, as Russian addresses do: `г. Сасово, ул. …`
/// (a settlement abbreviation, then the town) or `Верхний Баскунчак, 516980, просп. …` (a
/// town and a postcode). `s` is the street's first token; returns `s` when there is none.
fn town_before(toks: &[Tok], s: usize, text: &str) -> usize {
    if s < 2 || !toks[s - 1].is_punct(text, ',') || toks[s].nl_before || toks[s - 1].nl_before {
        return s;
    }
    let mut e = s - 1;
    let zip = toks[e - 1].kind == Kind::Num && is_zip(&toks[e - 1], text);
    if zip {
        if e < 3 || !toks[e - 2].is_punct(text, ',') || toks[e - 1].nl_before {
            return s;
        }
        e -= 2;
    }
    let mut b = e;
    while b > 0 && e - b < 3 && is_capword(&toks[b - 1]) && !toks[b].nl_before {
        b -= 1;
    }
    if b == e {
        return s;
    }
    if b >= 2
        && toks[b - 1].is_punct(text, '.')
        && !toks[b - 1].sp_before
        && toks[b - 2].kind == Kind::Word
        && !toks[b - 2].cap
        && SETTLEMENTS.contains(&key(&toks[b - 2]))
        && !toks[b].nl_before
    {
        return b - 2;
    }
    if zip { b } else { s }
}

/// Start of a PO box core at token `i`, with a leading postcode-like number on the same line
/// (`0912 P.O. Box 287`).
fn lead_no(toks: &[Tok], i: usize, text: &str) -> usize {
    if i >= 1 && !toks[i].nl_before && is_house_no(&toks[i - 1], text) {
        i - 1
    } else {
        i
    }
}

fn last_word(toks: &[Tok], e: usize) -> usize {
    let mut k = e - 1;
    while k > 0 && toks[k].kind != Kind::Word {
        k -= 1;
    }
    k
}

/// `Crown Street`, `Hicks Forge`, `Eleftheriou Venizelou str`: 1-4 capitalised words then a
/// street-type word (optionally `St.`). Returns the end token index.
fn us_street_words(toks: &[Tok], i: usize, text: &str) -> Option<usize> {
    let mut best = None;
    let mut j = i;
    let mut words = 0;
    while let Some(t) = toks.get(j) {
        if t.sentinel || (j > i && t.nl_before) || t.kind != Kind::Word {
            break;
        }
        let k = key(t);
        if words >= 1
            && t.is(C_STRONG_SUFFIX | C_WEAK_SUFFIX)
            && (t.cap || matches!(k, "str" | "st"))
        {
            let mut e = j + 1;
            if matches!(
                k,
                "st" | "ave"
                    | "rd"
                    | "dr"
                    | "blvd"
                    | "ln"
                    | "ct"
                    | "str"
                    | "pl"
                    | "sq"
                    | "pkwy"
                    | "hwy"
                    | "cir"
                    | "trl"
            ) && toks.get(e).is_some_and(|x| x.is_punct(text, '.'))
            {
                e += 1;
            }
            // `Devon Street West`, `Main St NW`
            if toks.get(e).is_some_and(|x| {
                !x.nl_before
                    && x.kind == Kind::Word
                    && x.cap
                    && matches!(
                        x.text(text),
                        "North"
                            | "South"
                            | "East"
                            | "West"
                            | "N"
                            | "S"
                            | "E"
                            | "W"
                            | "NE"
                            | "NW"
                            | "SE"
                            | "SW"
                    )
            }) {
                e += 1;
            }
            best = Some(e);
        }
        if !t.cap {
            break;
        }
        words += 1;
        j += 1;
        if words >= 5 {
            break;
        }
    }
    best
}

/// Finds address spans.
pub(crate) fn detect(text: &str, toks: &[Tok], out: &mut Vec<Cand>) {
    intersections(text, toks, out);
    // Byte ranges of the numbers that open accepted addresses; phone candidates inside them
    // are dropped once at the end (one pass over `out`, not one per address). The loop reads
    // `out` only through `out.last()`, which after each accepted address is that address
    // whether or not a phone was dropped before it, so dropping late changes no decision.
    let mut house_numbers: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if !may_open_core(&toks[i]) {
            i += 1;
            continue;
        }
        let Some((mut s, mut e, level)) = core(toks, i, text) else {
            i += 1;
            continue;
        };
        // `Storgarden 52 Trajanka Forks`, `P.O. Box 149 Monika Union`: a core ending in a
        // number continues with street words on the same line (a building or estate name)
        if toks[e - 1].kind == Kind::Num
            && toks.get(e).is_some_and(|x| !x.nl_before)
            && let Some(x) = us_street_words(toks, e, text)
        {
            e = x;
        }
        // `Storgarden 52 Trajanka Forks`: one or two name words before a number-first street
        // (not common words, given names, units or titles)
        if level != Level::NeedsCode
            && toks[s].kind == Kind::Num
            && !toks[s].nl_before
            && toks.get(s + 1).is_some_and(is_capword)
            && toks[e - 1].kind == Kind::Word
        {
            let lead = |x: &Tok| {
                is_capword(x)
                    && !x.is(IN_COMMON | IN_FIRST | C_UNIT | C_TITLE)
                    && out.last().is_none_or(|c| c.end <= x.s)
            };
            let mut b = s;
            while b > 0 && s - b < 2 && lead(&toks[b - 1]) && !toks[b].nl_before {
                b -= 1;
            }
            if b < s && (b == 0 || toks[b].nl_before || !is_capword(&toks[b - 1])) {
                s = b;
            }
        }
        // `9554 62 Rue Gafsa`, `704 1436 Redbud Drive`: a building or unit number before the
        // house number
        if level == Level::Strong
            && s >= 1
            && toks[s].kind == Kind::Num
            && !toks[s].nl_before
            && toks[s - 1].kind == Kind::Num
            && !toks[s - 1].sentinel
            && toks[s - 1].text(text).bytes().all(|c| c.is_ascii_digit())
            && toks[s - 1].e - toks[s - 1].s <= 6
            && out.last().is_none_or(|c| c.end <= toks[s - 1].s)
        {
            s -= 1;
        }
        // `Suite 541 6343 Skogstien 106`: a unit line written before the street
        if s >= 2
            && toks[s].kind == Kind::Num
            && !toks[s].nl_before
            && is_capword(&toks[s - 1])
            && toks[s - 1].is(C_UNIT)
            && toks[s - 1].kind == Kind::Word
            && unit(toks, s - 1, text) == Some(s + 1)
            && out.last().is_none_or(|c| c.end <= toks[s - 1].s)
        {
            s -= 1;
        }
        // `г. Сасово, ул. …`: the town before a prefix-type street
        if toks[s].is(C_PREFIX_TYPE) && level == Level::Strong {
            let b = town_before(toks, s, text);
            if b < s && out.last().is_none_or(|c| c.end <= toks[b].s) {
                s = b;
            }
        }
        // `Unit 69, 125 Mitchell Avenue`, `Apt. 383, 740 …`: a unit before the street, with a comma
        if s >= 3
            && toks[s].kind == Kind::Num
            && toks[s - 1].is_punct(text, ',')
            && !toks[s].nl_before
            && !toks[s - 1].nl_before
            && let Some(u) = [s - 3, s.saturating_sub(4)].into_iter().find(|&u| {
                is_capword(&toks[u]) && toks[u].is(C_UNIT) && unit(toks, u, text) == Some(s - 1)
            })
            && out.last().is_none_or(|c| c.end <= toks[u].s)
        {
            s = u;
        }
        let (end, segs, saw_code) = extend(toks, e, text);
        let no_number_street =
            toks[s].kind == Kind::Word && level == Level::NeedsCode && e - s <= 4;
        let accept = match level {
            Level::Strong => true,
            Level::Weak => segs > 0 || cue_before(text, toks[s].s),
            // a bare `Gail Rue` needs a postcode and a town; `rue de Noël` needs a postcode
            Level::NeedsCode => {
                saw_code && (segs >= 2 || !no_number_street || toks[s].is(C_PREFIX_TYPE))
            }
        };
        let strong = level == Level::Strong;
        if !accept {
            i += 1;
            continue;
        }
        // `17031 2202 Rissik St`: building and house numbers that the structured pass read as a phone
        // number. A phone number does not run into a street name, so the digits before the street's first
        // word are the address's.
        if toks[s].kind == Kind::Num
            && let Some(first_word) = (s..e).find(|&k| toks[k].kind == Kind::Word)
        {
            house_numbers.push((toks[s].s, toks[first_word].s));
        }
        let conf = if segs > 0 || strong { 0.85 } else { 0.7 };
        out.push(
            Cand::new(
                toks[s].s,
                toks[end - 1].e,
                PiiType::Address,
                "street",
                conf,
                prio::ADDRESS,
            )
            .truncatable(toks[e - 1].e),
        );
        i = end;
    }
    if !house_numbers.is_empty() {
        let house_numbers = SpanIndex::new(house_numbers);
        out.retain(|c| c.ty != Some(PiiType::Phone) || !house_numbers.contains(c.start, c.end));
    }
}

/// One side of an intersection: capitalised words, numbers, particles and street-type words
/// (`159 Eleftheriou Venizelou str`, `Rennie Union`, `ul. Jesionowa 127`) on one line.
/// Returns the end token (exclusive) and whether it has a number or a street-type word.
fn street_side(toks: &[Tok], i: usize, text: &str) -> Option<(usize, bool)> {
    let first = toks.get(i)?;
    if first.nl_before
        || first.sentinel
        || !(is_capword(first) || first.kind == Kind::Num || first.is(C_PREFIX_TYPE))
    {
        return None;
    }
    let mut j = i;
    let mut last_content = i;
    let mut typed = false;
    while let Some(t) = toks.get(j) {
        if (j > i && t.nl_before) || t.sentinel || j - i >= 9 {
            break;
        }
        let k = key(t);
        let content = match t.kind {
            Kind::Num => {
                typed = true;
                true
            }
            Kind::Word if k == "and" => false,
            Kind::Word if is_capword(t) => {
                typed |=
                    t.is(C_STRONG_SUFFIX | C_WEAK_SUFFIX | C_PREFIX_TYPE) || compound_street(t);
                true
            }
            Kind::Word if t.is(C_STRONG_SUFFIX | C_POST_TYPE | C_PREFIX_TYPE) => {
                typed = true;
                true
            }
            Kind::Word => is_particle(t),
            // `ul.`, `St.`, `u.`: an abbreviation's dot
            Kind::Punct => {
                t.is_punct(text, '.')
                    && !t.sp_before
                    && toks
                        .get(j + 1)
                        .is_some_and(|n| n.kind != Kind::Punct && !n.nl_before && n.key != "and")
            }
        };
        if !content {
            break;
        }
        if t.kind != Kind::Punct {
            last_content = j;
        }
        j += 1;
    }
    (last_content >= i && j > i).then_some((last_content + 1, typed))
}

/// Street intersections: `the corner of Dalbraut 99 and Frederikke Coves`.
fn intersections(text: &str, toks: &[Tok], out: &mut Vec<Cand>) {
    for i in 0..toks.len().saturating_sub(2) {
        if key(&toks[i]) != "corner" || key(&toks[i + 1]) != "of" || toks[i].sentinel {
            continue;
        }
        let Some((a_end, a_typed)) = street_side(toks, i + 2, text) else {
            continue;
        };
        // `… 39. and …`, `… Str. and …`
        let mut a = a_end;
        if toks
            .get(a)
            .is_some_and(|t| t.is_punct(text, '.') || t.is_punct(text, ','))
        {
            a += 1;
        }
        if !toks.get(a).is_some_and(|t| key(t) == "and" && !t.nl_before) {
            continue;
        }
        let Some((b_end, b_typed)) = street_side(toks, a + 1, text) else {
            continue;
        };
        // two capitalised names joined by `and` after `corner of` are streets; a number or a
        // street type on either side makes it certain
        let s = if i >= 1 && key(&toks[i - 1]) == "the" && !toks[i].nl_before {
            i - 1
        } else {
            i
        };
        out.push(Cand::new(
            toks[s].s,
            toks[b_end - 1].e,
            PiiType::Address,
            "intersection",
            if a_typed || b_typed { 0.85 } else { 0.7 },
            prio::ADDRESS,
        ));
    }
}

/// Street-type abbreviations (folded) that name no street without a dot or a number after them: `C/`, `пр`,
/// `pl`, Indonesian `jl` …
fn is_bare_street_abbreviation(k: &str) -> bool {
    matches!(
        k,
        "c" | "пр" | "просп" | "бул" | "пер" | "наб" | "ш" | "пл" | "pl" | "jl"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cue_before` matches ASCII-case-insensitively, which equals lower-casing the window
    /// only while every cue is lower-case ASCII.
    #[test]
    fn cues_are_lower_case_ascii_and_found_in_any_case() {
        assert!(
            CUES.iter()
                .all(|c| c.bytes().all(|b| !b.is_ascii_uppercase() && b.is_ascii()))
        );
        assert!(cue_before("She LIVES AT ", 13));
        assert!(!cue_before("She lives at ", 5));
    }
}
