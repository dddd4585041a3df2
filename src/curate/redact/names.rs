//! Person names. Regexes cannot tell `Teresa Kreutzmann` from `Entertainment Weekly`, so runs
//! of capitalised words are scored with gazetteers (given names, family names, common words,
//! places), a character n-gram name model, titles (`Mr.`, `Prof.`, `Ing.`) and context cues
//! (`my name is`, `Dear`, `says`). Accepted name words are then found again elsewhere in the
//! same text (`… early Yefremova`).

use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;

use super::lexicon::{
    C_GREETING, C_HEADER, C_MONTH, C_NAME_CAP_PARTICLE, C_NAME_PARTICLE, C_ORG, C_OWNED,
    C_PERSON_FIELD, C_PERSON_VERB, C_PLACE_HEAD, C_PLACE_TAIL, C_PRONOUN, C_TITLE, C_VOCATIVE_NEXT,
    C_WORK, IN_COMMON, IN_FIRST, IN_LAST, IN_PLACES, Kind, LEX, StaticSet, StrSet, Tok, fold,
    static_set as set,
};
use super::{Cand, PiiType, chars, prio};
use crate::curate::SpanIndex;

/// Places of several words (folded keys, space-separated) whose words are names on their own.
#[rustfmt::skip]
const PLACE_PHRASES: &[&str] = &[
    "sierra leone", "saint helena", "saint lucia", "saint kitts", "saint vincent", "saint martin",
    "saint barthelemy", "san marino", "costa rica", "puerto rico", "el salvador", "sri lanka", "new zealand",
    "south africa", "south korea", "north korea", "south sudan", "united kingdom", "united states",
    "saudi arabia", "solomon islands", "marshall islands", "cayman islands", "faroe islands",
    "falkland islands", "virgin islands", "cook islands", "christmas island", "norfolk island",
    "isle of man", "new caledonia", "papua new guinea", "equatorial guinea", "cape verde", "ivory coast",
    "burkina faso", "dominican republic", "czech republic", "central african republic", "hong kong",
    "vatican city", "timor leste", "east timor", "western sahara", "french polynesia", "french guiana",
    "new york", "los angeles", "san francisco", "san diego", "san jose", "san antonio", "las vegas",
    "buenos aires", "rio de janeiro", "sao paulo", "kuala lumpur", "tel aviv", "new delhi", "mexico city",
    "cape town", "abu dhabi", "santo domingo", "santa cruz", "saint petersburg", "st petersburg",
    "salt lake city", "new orleans", "st louis", "saint louis", "santa fe", "santa barbara", "santa monica",
];

/// Words that open a place's name (`San Lucas`, `St. Kristina`, `Lac-Édouard`, `New Laura`, `Свети Николе`):
/// the name after them is of a town, not of a person.
#[rustfmt::skip]
const PLACE_HEADS: &[&str] = &[
    "san", "santa", "santo", "sao", "st", "ste", "saint", "sainte", "sankt", "ville", "mont", "lac", "port",
    "fort", "new", "north", "south", "east", "west", "vieja", "viejo", "nueva", "nuevo", "villa", "bad",
    "svaty", "svata", "svate", "sveti", "sveta", "свети", "света", "свята", "святой", "новая", "новый",
    "kota", "kabupaten", "tp", "lazne",
];
/// Words that close a place's name (`Robert Ouest`, `Geneviève-Nord`).
const PLACE_TAILS: &[&str] = &[
    "ouest", "est", "nord", "sud", "norte", "oeste", "sur", "ville", "city", "town", "nagar",
    "utara", "selatan", "barat", "timur",
];

/// Greetings that open a message and are capitalised there (`Olá!`, `Hallo,`), in languages whose
/// vocabulary the word lists do not hold.
#[rustfmt::skip]
const GREETINGS: &[&str] = &[
    "ola", "hola", "hallo", "bonjour", "salut", "ciao", "buongiorno", "hej", "hei", "moi", "merhaba",
    "szia", "ahoj", "czesc", "witam", "zdravo", "privet", "привет", "здравствуйте", "здраво", "γεια", "xin",
    "χαιρετε", "bom", "buenos", "buenas", "guten", "servus", "moin", "gruezi", "dobry", "dobar",
];

/// Weekday and month abbreviations, as folded keys.
const WEEKDAYS: &[&str] = &[
    "mon", "tue", "tues", "wed", "thu", "thur", "thurs", "fri", "sat", "sun",
];
const MONTHS: &[&str] = &[
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
];
/// Month names in full, as folded keys (several are given names too: June, April, Augusto).
#[rustfmt::skip]
const FULL_MONTHS: &[&str] = &[
    "january", "february", "march", "april", "june", "july", "august", "september", "october", "november",
    "december", "januar", "februar", "marz", "juni", "juli", "oktober", "dezember", "janvier", "fevrier",
    "mars", "avril", "mai", "juin", "juillet", "aout", "septembre", "octobre", "novembre", "decembre", "enero",
    "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "octubre", "noviembre",
    "diciembre",
];

/// Country and territory names in 50 languages (`data/countries.txt`, from the Unicode CLDR): each as its
/// words' keys joined by spaces, as the text's tokens give them.
struct Countries {
    names: FxSet<String>,
    /// The keys that open a name: most words are looked up no further.
    heads: FxSet<String>,
    max_words: usize,
}

type FxSet<T> = HashSet<T, std::hash::BuildHasherDefault<super::lexicon::FxHasher>>;

static COUNTRIES: LazyLock<Countries> = LazyLock::new(|| {
    let mut c = Countries {
        names: FxSet::default(),
        heads: FxSet::default(),
        max_words: 0,
    };
    for line in include_str!("data/countries.txt").lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let toks = super::lexicon::tokenize(line);
        // `Trinidad & Tobago` as the text writes it, `Trinidad and Tobago`: both without the `and`
        let words: Vec<&str> = toks
            .iter()
            .filter(|t| t.kind == Kind::Word && t.key != "and")
            .map(|t| t.key.as_ref())
            .collect();
        let Some(head) = words.first() else {
            continue;
        };
        c.heads.insert((*head).to_string());
        c.max_words = c.max_words.max(words.len());
        c.names.insert(words.join(" "));
    }
    c
});

/// The words of a country's name on one line that holds the words `first..=last` (`Trinidad` in `Trinidad and
/// Tobago`): the name may start up to six tokens before (`Demokratická republika Svätého Tomáša`) and run past
/// `last`.
fn country_around(toks: &[Tok], text: &str, first: usize, last: usize) -> Option<usize> {
    let c = &*COUNTRIES;
    let mut phrase = String::new();
    for m in first.saturating_sub(6)..=first {
        if toks[m].kind != Kind::Word || !c.heads.contains(toks[m].key.as_ref()) {
            continue;
        }
        phrase.clear();
        let mut words = 0;
        for (k, t) in toks.iter().enumerate().skip(m) {
            if words == c.max_words || k > m && t.nl_before {
                break;
            }
            match t.kind {
                Kind::Word if t.key == "and" && k > m => {}
                Kind::Word => {
                    if words > 0 {
                        phrase.push(' ');
                    }
                    phrase.push_str(t.key.as_ref());
                    words += 1;
                    if k >= last && c.names.contains(&phrase) {
                        return Some(words);
                    }
                }
                // `Guinea-Bissau`, `Côte d’Ivoire`: the list's names are split at the same marks
                Kind::Punct if matches!(t.text(text), "-" | "'" | "’" | "." | "(" | ")" | "&") => {
                }
                _ => break,
            }
        }
    }
    None
}

/// A company's legal form written with dots from token `j` on: `a.s.`, `s.r.o.`, `S.A.`, `d.o.o.`, `e.V.`.
fn dotted_legal_form(toks: &[Tok], text: &str, j: usize) -> bool {
    let letters = |k: usize, glued: bool| {
        toks.get(k).is_some_and(|t| {
            t.kind == Kind::Word && t.key_chars <= 3 && (glued != t.sp_before) && !t.nl_before
        })
    };
    let dot = |k: usize| {
        toks.get(k)
            .is_some_and(|t| t.is_punct(text, '.') && !t.sp_before)
    };
    letters(j, false) && dot(j + 1) && letters(j + 2, true) && dot(j + 3)
}

/// The line around `s..e` (a name never spans lines).
fn line_of(text: &str, s: usize, e: usize) -> &str {
    let a = text[..s].rfind('\n').map_or(0, |i| i + 1);
    let z = text[e..].find('\n').map_or(text.len(), |i| e + i);
    &text[a..z]
}

/// The word lists that become class bits on tokens: the detector tests a bit where it would
/// otherwise look a word up in a set or scan a list. An entry no key can equal (`van der`)
/// gets its bit all the same, so the bit answers exactly as the list did.
pub(super) fn word_classes() -> Vec<(Vec<&'static str>, u32)> {
    let set = |s: &StaticSet| s.iter().copied().collect();
    vec![
        (set(&TITLES), C_TITLE),
        (set(&ORG), C_ORG),
        (set(&PERSON_VERBS), C_PERSON_VERB),
        (PARTICLES.to_vec(), C_NAME_PARTICLE),
        (CAP_PARTICLES.to_vec(), C_NAME_CAP_PARTICLE),
        (PRONOUNS.to_vec(), C_PRONOUN),
        (HEADERS.to_vec(), C_HEADER),
        (VOCATIVE_NEXT.to_vec(), C_VOCATIVE_NEXT),
        (OWNED.to_vec(), C_OWNED),
        (WORKS.to_vec(), C_WORK),
        (PERSON_FIELDS.to_vec(), C_PERSON_FIELD),
        (PLACE_HEADS.to_vec(), C_PLACE_HEAD),
        (PLACE_TAILS.to_vec(), C_PLACE_TAIL),
        (GREETINGS.to_vec(), C_GREETING),
        (MONTHS.iter().chain(FULL_MONTHS).copied().collect(), C_MONTH),
    ]
}

/// Honorifics and academic titles that precede a name (folded, without dots).
static TITLES: LazyLock<StaticSet> = LazyLock::new(|| {
    set(
        "mr mrs ms miss mx dr prof sir dame lady lord herr frau ing dipl univ mag mme mlle \
         monsieur madame mademoiselle sr sra srta don dona sig dott dhr mevr ir drs fr pfr \
         senor senora signor signora mister missus doctor professor misc ind",
    )
});
/// Words that make a capitalised run an organisation, venue or place rather than a person.
static ORG: LazyLock<StaticSet> = LazyLock::new(|| {
    set(
        "inc ltd llc gmbh ag corp co company group university college school bank hotel orchestra \
         foundation institute association club band records studios university's church museum \
         hospital airport station street avenue road lane park river lake mountain county city \
         republic kingdom state states ministry department council party team fc united systems \
         technologies solutions labs services partners holdings brothers sons & times post news \
         weekly magazine journal press research plc technologies consulting associates electronics \
         motors industries enterprises media capital ventures networks software logistics pharma \
         energy foods airlines insurance realty restaurant cafe bar pub shop store inc. corporation \
         lda ltda sarl srl spa bv nv oy oyj aps asa kft zrt doo pty gruppe groupe gruppo grupo \
         industrias corporacion compania cia hermanos hnos asociados filhos fils figli hijos sohne holding \
         kg og ohg gbr hb kb kkt bt eirl tbk pd tnhh asc оао зао пао ооод оод доо дооел еоод ад ед ип сп нпо ооо տպը սպը փբը բբը հձ գրուպ հոլդինգ",
    )
});
/// Words before a run that say a name follows (folded; matched against the last 1-3 words).
const CUES: &[&[&str]] = &[
    &["name", "is"],
    &["name", "was"],
    &["named"],
    &["called"],
    &["calls", "me"],
    &["i'm"],
    &["i", "am"],
    &["it's"],
    &["this", "is"],
    &["dear"],
    &["hi"],
    &["hello"],
    &["hey"],
    &["thanks"],
    &["thank", "you"],
    &["sure"],
    &["okay"],
    &["ok"],
    &["says"],
    &["said"],
    &["asked"],
    &["told"],
    &["by"],
    &["with"],
    &["to"],
    &["from"],
    &["and"],
    &["meet"],
    &["met"],
    &["ask"],
    &["tell"],
    &["contact"],
    &["invite"],
    &["friend"],
    &["holder"],
    &["landlord", "is"],
    &["wife"],
    &["husband"],
    &["son"],
    &["daughter"],
    &["brother"],
    &["sister"],
    &["mother"],
    &["father"],
    &["boss"],
    &["colleague"],
    &["manager"],
    &["cc"],
    &["starring"],
    &["featuring"],
    &["married"],
    &["add"],
    &["remove"],
    &["under"],
    &["of"],
    &["for"],
    &["as"],
    &["about"],
    &["player"],
    &["singer"],
    &["actor"],
    &["actress"],
    &["author"],
    &["writer"],
    &["director"],
    &["ceo"],
    &["founder"],
    &["founders"],
    &["user"],
    &["name"],
    &["surname"],
    &["heard"],
    &["tribute", "to"],
    &["grandfather"],
    &["grandmother"],
    &["partner"],
    &["mom"],
    &["dad"],
    &["uncle"],
    &["aunt"],
    &["cousin"],
    &["kid"],
    &["child"],
    &["patient"],
    &["client"],
    &["customer"],
    &["mr"],
    &["mrs"],
    &["ms"],
    &["dr"],
];
/// Cues strong enough to accept a word the gazetteers and the model know nothing about.
const STRONG_CUES: &[&[&str]] = &[
    &["name", "is"],
    &["named"],
    &["called"],
    &["calls", "me"],
    &["call", "me"],
    &["named", "him"],
    &["named", "her"],
    &["my", "son"],
    &["my", "daughter"],
    &["my", "kid"],
    &["my", "wife"],
    &["my", "husband"],
    &["my", "brother"],
    &["my", "sister"],
    &["account", "holder"],
    &["my", "friend"],
    &["my", "colleague"],
    &["my", "boss"],
    &["my", "mom"],
    &["my", "dad"],
    &["my", "mother"],
    &["my", "father"],
    &["my", "partner"],
    &["my", "neighbour"],
    &["my", "neighbor"],
    &["my", "cousin"],
    &["dear"],
    &["says"],
    &["said"],
    &["name"],
    &["surname"],
    &["i'm"],
    &["it's"],
    &["user"],
    &["landlord", "is"],
];
/// `From: X`, `Name: X` headers.
const HEADERS: &[&str] = &[
    "from",
    "to",
    "cc",
    "bcc",
    "name",
    "user",
    "author",
    "contact",
    "customer",
    "patient",
    "client",
    "attn",
    "signed",
    "sender",
    "recipient",
    "owner",
    "holder",
    "employee",
    "tenant",
    "guest",
];
/// Words before an employer's name.
const ORG_CUES: &[&[&str]] = &[
    &["work", "for"],
    &["works", "for"],
    &["worked", "for"],
    &["working", "for"],
    &["work", "at"],
    &["works", "at"],
    &["worked", "at"],
    &["working", "at"],
    &["employed", "by"],
    &["acquired", "by"],
    &["shares", "of"],
];
/// Words before a place name.
const PLACE_CUES: &[&[&str]] = &[
    &["in"],
    &["near"],
    &["city"],
    &["town"],
    &["village"],
    &["returned", "to"],
    &["moved", "to"],
    &["flew", "to"],
    &["travelled", "to"],
    &["traveled", "to"],
];
/// Creative works named after their author or performer (`the Hemingway novel`).
const WORKS: &[&str] = &[
    "novel",
    "novels",
    "concert",
    "concerts",
    "song",
    "songs",
    "album",
    "albums",
    "film",
    "films",
    "movie",
    "movies",
    "biography",
    "memoir",
    "painting",
    "paintings",
    "poem",
    "poems",
    "lyrics",
    "tour",
    "interview",
    "lecture",
    "essay",
    "essays",
    "sonata",
    "symphony",
    "opera",
];
/// Field labels whose value is a person (`name: …`), for lower-case values.
const PERSON_FIELDS: &[&str] = &[
    "name",
    "contact",
    "customer",
    "patient",
    "client",
    "tenant",
    "guest",
    "employee",
    "holder",
    "owner",
    "sender",
    "recipient",
    "attn",
    "author",
];
const DETERMINERS: &[&str] = &[
    "the", "a", "an", "this", "that", "our", "their", "its", "every", "each",
];

fn is_title(t: &Tok) -> bool {
    t.kind == Kind::Word && t.is(C_TITLE)
}

fn is_initial(t: &Tok, text: &str) -> bool {
    t.kind == Kind::Word && t.cap && t.text(text).chars().count() == 1
}

/// Particles that also start a name when capitalised (`Le Blanchard`, `Van Dijk`).
const CAP_PARTICLES: &[&str] = &[
    "le", "la", "de", "del", "della", "van", "von", "du", "da", "di", "dos", "ter", "ten",
];

const PARTICLES: &[&str] = &[
    "van", "von", "de", "del", "della", "der", "den", "di", "da", "dos", "das", "du", "la", "le",
    "ten", "ter", "bin", "al", "el", "y", "zu", "vom", "van der", "mac",
];

fn is_particle(t: &Tok) -> bool {
    t.kind == Kind::Word && !t.cap && t.is(C_NAME_PARTICLE)
}

/// The word's key is one of [`CAP_PARTICLES`].
fn is_cap_particle_key(t: &Tok) -> bool {
    t.is(C_NAME_CAP_PARTICLE)
}

/// True if the particle at `i` leads, through at most two more particles on the same line, to
/// a capitalised word (`de la Daniel`, `van de Darnau`).
fn particles_to_name(toks: &[Tok], i: usize) -> bool {
    let mut k = i + 1;
    while k < toks.len() && k < i + 3 && is_particle(&toks[k]) && !toks[k].nl_before {
        k += 1;
    }
    toks.get(k).is_some_and(|x| capword(x) && !x.nl_before)
}

/// (`&` rather than `&&`: the fields are loaded anyway, and one branch on the answer
/// mispredicts less than one per field; capitalisation is about every other word.)
fn capword(t: &Tok) -> bool {
    (t.kind == Kind::Word) & t.cap & !t.sentinel & (!t.all_caps | (t.key_chars <= 2))
}

/// Per-word evidence.
struct Ev {
    first: bool,
    last: bool,
    common: bool,
    place: bool,
    ng: f32,
}

fn evidence(t: &Tok) -> Ev {
    let l = &*LEX;
    let f = t.cls;
    Ev {
        first: f & IN_FIRST != 0,
        last: f & IN_LAST != 0,
        common: f & IN_COMMON != 0,
        place: f & IN_PLACES != 0,
        // the spelling model only matters for words no list knows (see `score` and the
        // unknown-word check in `detect`)
        ng: if f & (IN_FIRST | IN_LAST | IN_COMMON | IN_PLACES) == 0 {
            l.name_score(&t.key)
        } else {
            0.0
        },
    }
}

impl Ev {
    fn known(&self) -> bool {
        self.first || self.last
    }
    /// Not a name on its own: a common word or place not also in a name list.
    fn blocker(&self) -> bool {
        (self.common || self.place) && !self.known()
    }
    fn score(&self) -> f32 {
        if self.first {
            if self.common || self.place { 0.5 } else { 2.0 }
        } else if self.last {
            if self.common || self.place { 0.3 } else { 1.5 }
        } else if self.common {
            -3.0
        } else if self.place {
            -2.0
        } else {
            (self.ng * 1.5).clamp(-1.5, 1.5)
        }
    }
}

fn sentence_start(toks: &[Tok], i: usize, text: &str) -> bool {
    if i == 0 || toks[i].nl_before {
        return true;
    }
    let p = &toks[i - 1];
    if p.is_punct(text, '.') && i >= 2 && (is_title(&toks[i - 2]) || is_initial(&toks[i - 2], text))
    {
        return false;
    }
    p.kind == Kind::Punct && {
        let c = p.text(text);
        matches!(
            c,
            "." | "!" | "?" | ":" | "\"" | "“" | "'" | ">" | "*" | "-" | "(" | "…"
        )
    }
}

/// Folded keys of up to 3 words before token `i` (stopping at line breaks), nearest last.
fn words_before<'a>(toks: &'a [Tok<'a>], i: usize) -> Before<'a> {
    let mut v = Before { buf: [""; 3], n: 0 };
    let mut j = i;
    while j > 0 && v.n < 3 {
        j -= 1;
        let t = &toks[j];
        if t.kind == Kind::Word {
            v.n += 1;
            v.buf[3 - v.n] = t.key.as_ref();
        } else if t.kind == Kind::Num {
            break;
        }
        // punctuation such as `,` or `:` is skipped: "Name: X", "Sure, X"
        if toks[j].nl_before || (t.kind == Kind::Punct && !matches!(t.key.as_ref(), "")) {
            break;
        }
    }
    v
}

/// Up to three words before a token, nearest last, without allocating.
struct Before<'a> {
    buf: [&'a str; 3],
    n: usize,
}

impl<'a> std::ops::Deref for Before<'a> {
    type Target = [&'a str];
    fn deref(&self) -> &[&'a str] {
        &self.buf[3 - self.n..]
    }
}

/// Verbs that take a person as subject (folded), used as a cue after a name.
static PERSON_VERBS: LazyLock<StaticSet> = LazyLock::new(|| {
    set(
        "said says told tells asked asks replied replies answered answers shouted shouts yelled \
         whispered explained explains spent lives lived works worked married divorced died wrote \
         writes sang sings thinks thought wants wanted feels felt smiled laughed cried \
         graduated retired resigned apologized apologised admitted insisted promised agreed \
         complained claimed began",
    )
});

/// Nouns that only people own (`Ann's kid`), after a possessive.
const OWNED: &[&str] = &[
    "address",
    "phone",
    "email",
    "number",
    "kid",
    "kids",
    "son",
    "daughter",
    "wife",
    "husband",
    "mother",
    "father",
    "mom",
    "dad",
    "brother",
    "sister",
    "friend",
    "boss",
    "birthday",
    "killers",
    "killer",
    "family",
    "parents",
    "children",
    "husband's",
    "girlfriend",
    "boyfriend",
    "partner",
    "account",
    "passport",
    "funeral",
    "wedding",
];

/// Cues that name someone (`my name is …`), strong enough for an unlisted lower-case word.
const NAMING_CUES: &[&[&str]] = &[
    &["name", "is"],
    &["name", "was"],
    &["named"],
    &["called"],
    &["call", "me"],
    &["calls", "me"],
    &["surname", "is"],
];

/// Words that follow `Name,` when someone is addressed (`Ann, can you …`).
const VOCATIVE_NEXT: &[&str] = &[
    "can", "could", "would", "will", "please", "do", "did", "are", "have", "listen", "look",
    "thanks", "thank", "i", "you", "we", "let's", "come", "wait", "stop",
];

const PRONOUNS: &[&str] = &[
    "he",
    "she",
    "it",
    "they",
    "we",
    "you",
    "i",
    "who",
    "this",
    "that",
    "everyone",
    "someone",
    "nobody",
    "everybody",
    "somebody",
    "one",
];

/// True if token `i` opens its line (only quote marks such as `>` before it).
fn line_start(toks: &[Tok], i: usize, text: &str) -> bool {
    let mut j = i;
    loop {
        if j == 0 || toks[j].nl_before {
            return true;
        }
        let p = &toks[j - 1];
        if p.kind == Kind::Punct && matches!(p.text(text), ">" | "-" | "*" | "•") {
            j -= 1;
        } else {
            return false;
        }
    }
}

fn cue(before: &[&str], list: &[&[&str]]) -> bool {
    list.iter()
        .any(|c| before.len() >= c.len() && before[before.len() - c.len()..] == **c)
}

/// Finds person names.
pub(crate) fn detect(text: &str, toks: &[Tok], known: &[String], out: &mut Vec<Cand>) {
    // keys of words accepted as names, borrowed from the tokens
    let mut keys = StrSet::default();
    // per capitalised run, reused: its content tokens and their evidence
    let mut content: Vec<usize> = Vec::new();
    let mut evs: Vec<Ev> = Vec::new();
    // Only person candidates are added below, so the addresses found so far are all there
    // will be, among the first `found_before` candidates; on a long text they are looked up by
    // start, not found by scanning `out` (which grows by a person per name) per name.
    let found_before = out.len();
    let address_starts = (found_before > SCAN_PERSONS_UP_TO).then(|| {
        let mut starts: Vec<usize> = out
            .iter()
            .filter(|c| c.ty == Some(PiiType::Address))
            .map(|c| c.start)
            .collect();
        starts.sort_unstable();
        starts
    });
    let address_at = |s: usize, out: &[Cand]| match &address_starts {
        Some(starts) => starts.binary_search(&s).is_ok(),
        None => out
            .iter()
            .take(found_before)
            .any(|c| c.ty == Some(PiiType::Address) && c.start == s),
    };
    known_names(toks, known, out);
    // asked of each `Key: value` line whose value is no speech; one scan of the text answers them all
    let transcript = std::cell::OnceCell::new();
    let n = toks.len();
    let mut last_end: Option<usize> = None;
    let mut i = 0;
    while i < n {
        let t = &toks[i];
        // Whatever follows needs a title, a capital or a particle: one test on all of them
        // (with `&`, one branch) passes over the other words and the punctuation.
        if !((t.kind == Kind::Word) & !t.sentinel & (t.cap | t.is(C_TITLE | C_NAME_PARTICLE))) {
            i += 1;
            continue;
        }
        let title_here = is_title(t)
            && (t.cap || toks.get(i + 1).is_some_and(|x| x.is_punct(text, '.')))
            && toks.get(i + 1).is_some_and(|x| {
                capword(x) || x.is_punct(text, '.') || x.is_punct(text, '-') || is_particle(x)
            });
        if !title_here {
            let next_cap = toks.get(i + 1).is_some_and(|x| capword(x) && !x.nl_before);
            let cap_particle = t.cap && next_cap && is_cap_particle_key(t);
            let starts = capword(t) || (is_particle(t) && particles_to_name(toks, i));
            if cap_particle {
                // `Le Blanchard`, `Van Dijk`: keep the particle with the name
            } else
            // a capitalised common word ("Thanks", "Okay") is context, not part of a name
            if !starts || (capword(t) && evidence(t).blocker()) {
                i += 1;
                continue;
            }
        }
        // ---- collect the raw run: titles, capitalised words, initials, particles
        let start = i;
        let mut j = i;
        let mut titles = 0;
        while j < n && is_title(&toks[j]) && (j == start || !toks[j].nl_before) {
            titles += 1;
            j += 1;
            while j < n
                && (toks[j].is_punct(text, '.') || toks[j].is_punct(text, '-'))
                && !toks[j].sp_before
            {
                j += 1;
                // `Sig.ra`, `Dott.ssa`
                if j < n
                    && toks[j].kind == Kind::Word
                    && !toks[j].cap
                    && !toks[j].sp_before
                    && toks[j].key.len() <= 3
                {
                    j += 1;
                }
            }
        }
        let j_after_titles = j;
        // `Н. Кабанов`, `J. R. Tolkien`: initials before the family name (a roman numeral is a heading's)
        let mut initials = 0;
        let mut k = j;
        while k + 1 < n
            && is_initial(&toks[k], text)
            && !matches!(toks[k].text(text), "I" | "V" | "X")
            && toks[k + 1].is_punct(text, '.')
            && !toks[k + 1].sp_before
            && (k == start || !toks[k].nl_before)
        {
            k += 2;
            initials += 1;
        }
        if initials > 0
            && toks
                .get(k)
                .is_some_and(|x| capword(x) && !x.nl_before && !is_initial(x, text))
        {
            j = k;
        } else {
            initials = 0;
        }
        content.clear();
        let mut particle_lead = is_particle(t);
        while j < n {
            let w = &toks[j];
            if j > start && w.nl_before {
                break;
            }
            if is_initial(w, text) && !content.is_empty() {
                j += 1;
                if j < n && toks[j].is_punct(text, '.') {
                    j += 1;
                }
                continue;
            }
            if capword(w)
                && !(content.is_empty()
                    && is_cap_particle_key(w)
                    && toks.get(j + 1).is_some_and(|x| capword(x) && !x.nl_before))
            {
                content.push(j);
                j += 1;
                continue;
            }
            if content.is_empty()
                && w.cap
                && is_cap_particle_key(w)
                && toks.get(j + 1).is_some_and(|x| capword(x) && !x.nl_before)
            {
                particle_lead = true;
                j += 1;
                continue;
            }
            if is_particle(w) && particles_to_name(toks, j) {
                j += 1;
                continue;
            }
            break;
        }
        if content.is_empty() {
            i = j.max(i + 1);
            continue;
        }
        // ---- split the run at blockers (common words, places) and score each piece
        evs.clear();
        evs.extend(content.iter().map(|&k| evidence(&toks[k])));
        for k in 1..evs.len() {
            let prev_given = evs[k - 1].first && !evs[k - 1].common && !evs[k - 1].place;
            // only initials (`L`, `D.`) between
            let initials_between = (content[k - 1] + 1..content[k])
                .all(|m| is_initial(&toks[m], text) || toks[m].is_punct(text, '.'));
            if prev_given && evs[k].blocker() && initials_between
                || prev_given
                    && evs[k].blocker()
                    && content[k] == content[k - 1] + 2
                    && is_particle(&toks[content[k] - 1])
            {
                evs[k].last = true;
            }
        }
        // `Mr. Spears`, `Dr. Brown`: right after a title a capitalised common word is a surname
        if titles > 0 && evs[0].blocker() && content[0] == j_after_titles {
            evs[0].last = true;
        }
        let org = content.iter().any(|&k| toks[k].is(C_ORG))
            || toks
                .get(j)
                .is_some_and(|x| x.kind == Kind::Word && x.is(C_ORG))
            || dotted_legal_form(toks, text, j)
            // `ИП «Давыдова Сидорова»`, `НПО "…"`: a legal form before the quoted name
            || start >= 2
                && toks[start - 1].kind == Kind::Punct
                && matches!(toks[start - 1].text(text), "«" | "\"" | "„" | "“")
                && toks[start - 2].is(C_ORG);
        let mut p = 0;
        while p < content.len() {
            if evs[p].blocker() {
                p += 1;
                continue;
            }
            let mut q = p;
            while q < content.len() && !evs[q].blocker() && q - p < 4 {
                q += 1;
            }
            let first_tok = content[p];
            // the span starts at the titles / leading particle when this piece opens the run
            let s_tok = if p == 0 { start } else { first_tok };
            let e_tok = content[q - 1];
            let has_title = p == 0 && titles > 0;
            let before = words_before(toks, s_tok);
            let sent0 = sentence_start(toks, s_tok, text) && !has_title;
            let header =
                s_tok >= 2 && toks[s_tok - 1].is_punct(text, ':') && toks[s_tok - 2].is(C_HEADER);
            // `X and Y`, `X, Y`: a name right after an accepted name
            let after_name = s_tok >= 2
                && last_end.is_some_and(|le| le + 2 == s_tok)
                && (toks[s_tok - 1].key == "and"
                    || toks[s_tok - 1].is_punct(text, ',')
                    || toks[s_tok - 1].is_punct(text, '&'));
            let next = toks.get(e_tok + 1);
            // `Ann: see you`, `> Ann: …`: a speaker label opening a line of a transcript
            let speaker = p == 0
                && q == content.len()
                && line_start(toks, s_tok, text)
                && next.is_some_and(|x| x.is_punct(text, ':') && !x.sp_before)
                // speech follows on the same line (a field label such as `Fax:` has a value)
                && toks.get(e_tok + 2).is_some_and(|x| {
                    !x.nl_before
                        && (x.kind == Kind::Word
                            || x.kind == Kind::Punct && matches!(x.text(text), "\"" | "“"))
                })
                && !toks[first_tok].is(C_HEADER)
                && !evs[p..q].iter().any(|e| e.common || e.place)
                // `Filed: 7630`, `Nemo: pariatur`: a form's key with its value, not a speaker with speech
                // (unless the text is a transcript, where `Okafor: yes` is a speaker's answer)
                && next.is_some_and(|x| {
                    let rest = &text[x.e..];
                    super::fields::utterance_like(&rest[..rest.find('\n').unwrap_or(rest.len())])
                        || *transcript.get_or_init(|| super::fields::is_transcript(text))
                });
            // `Hi Ann,`, `Hello Ann!`: a greeting addressing someone
            let vocative = before.last().is_some_and(|w| {
                matches!(
                    *w,
                    "hi" | "hello" | "hey" | "bye" | "thanks" | "okay" | "ok" | "sure"
                )
            }) && next.is_none_or(|x| {
                x.kind == Kind::Punct && matches!(x.text(text), "," | "!" | "." | "?")
            });
            // `Ann said`, `Ann shouted at …`: a verb only people do
            let person_verb = next
                .is_some_and(|x| x.kind == Kind::Word && !x.cap && x.is(C_PERSON_VERB))
                && !toks[first_tok].is(C_PRONOUN);
            // `Ann, can you …` (sentence start) and `…, Ann!`: addressing someone
            let vocative = vocative
                || sent0
                    && q - p == 1
                    && next.is_some_and(|x| x.is_punct(text, ','))
                    && toks
                        .get(e_tok + 2)
                        .is_some_and(|x| x.kind == Kind::Word && x.is(C_VOCATIVE_NEXT))
                || s_tok >= 1
                    && toks[s_tok - 1].is_punct(text, ',')
                    && next.is_some_and(|x| x.is_punct(text, '!'));
            // a line holding only a name (signature, address block): `Debra Neal`
            let own_line = q - p >= 2
                && line_start(toks, s_tok, text)
                && next.is_none_or(|x| x.nl_before)
                && evs[p..q].iter().any(|e| e.first && !e.common);
            // a word already accepted as (part of) a name earlier in this text
            let seen = content[p..q]
                .iter()
                .any(|&k| toks[k].key_chars >= 3 && keys.contains(toks[k].key.as_ref()));
            // `Matej's address`, `Asya's kid`: a possessive before a personal noun
            let possessive = toks.get(e_tok + 1).is_some_and(|x| {
                x.kind == Kind::Punct && matches!(x.text(text), "'" | "’") && !x.sp_before
            }) && toks.get(e_tok + 2).is_some_and(|x| x.key == "s")
                && toks
                    .get(e_tok + 3)
                    .is_some_and(|x| x.kind == Kind::Word && x.is(C_OWNED));
            // `the Hemingway novel`, `a Nina Simone concert`: a name used for a creative work
            // by its author or performer
            let work = q == content.len()
                && next.is_some_and(|x| x.kind == Kind::Word && !x.cap && x.is(C_WORK));
            // `Jenna Houston (jh@example.com)`, `Eerden <x@y.de>`: a name with its e-mail
            let with_email = next.is_some_and(|x| {
                (x.is_punct(text, '(') || x.is_punct(text, '<')) && {
                    // the bracket closes within 100 bytes, so the search looks no further (to
                    // the text's end from every such name, it would be quadratic)
                    let rest = &text[x.e..];
                    rest.as_bytes()[..rest.len().min(101)]
                        .iter()
                        .position(|&b| b == b')' || b == b'>')
                        .is_some_and(|c| {
                            rest[..c].contains('@') && !rest[..c].contains(char::is_whitespace)
                        })
                }
            });
            // `Ship it to Remigio, 12 Oak Road`: a name heading an address (after `at` it is
            // rather a venue: `meet at Incadence, 4 Rue …`)
            let before_address = before.last().is_none_or(|w| *w != "at")
                && next.is_some_and(|x| x.is_punct(text, ','))
                && toks.get(e_tok + 2).is_some_and(|a| address_at(a.s, out));
            let strong_cue = header
                || with_email
                || before_address
                || after_name
                || seen
                || possessive
                || own_line
                || speaker
                || vocative
                || person_verb
                || cue(&before, STRONG_CUES);
            let any_cue = strong_cue || work || cue(&before, CUES);
            let det = before.last().is_some_and(|w| DETERMINERS.contains(w)) && !work;
            let mut score: f32 = evs[p..q].iter().map(Ev::score).sum();
            let words = q - p;
            if words >= 2 && evs[p..q].iter().all(|e| !e.common) {
                score += 1.0;
            }
            if has_title {
                score += 3.0;
            } else if p == 0 && initials > 0 {
                score += 2.0;
            }
            if strong_cue {
                score += 2.0;
            } else if any_cue {
                score += 1.0;
            }
            if det {
                score -= 2.0;
            }
            if sent0 && words == 1 && !evs[p].first {
                score -= 1.0;
            }
            let known_any = evs[p..q].iter().any(Ev::known);
            let marked = has_title || p == 0 && initials > 0;
            if !(known_any || marked || strong_cue) {
                // unknown words alone need a clear name-like spelling
                let avg = evs[p..q].iter().map(|e| e.ng).sum::<f32>() / words as f32;
                if words < 2 || avg < 0.0 {
                    score -= 1.5;
                }
            }
            if p == 0 && particle_lead {
                score += 1.0;
            }
            if (strong_cue || has_title) && evs[p..q].iter().all(|e| !e.blocker()) {
                score = score.max(2.0);
            }
            // `Margaret Hoover`: a listed given name (no common word or place) followed by words no list
            // blocks is a full name; the spelling model only ranks unknown words, it does not veto a
            // family name that happens to spell like an English word.
            if words >= 2
                && evs[p].first
                && !evs[p].common
                && !evs[p].place
                && evs[p + 1..q].iter().all(|e| !e.common && !e.place)
            {
                score = score.max(2.0);
            }
            if org {
                score -= 4.0;
            }
            // `Sierra Leone`, `Costa Rica`: a place of several words, each of which may be a name
            if words >= 2 && {
                let phrase: Vec<&str> = content[p..q]
                    .iter()
                    .map(|&k| toks[k].key.as_ref())
                    .collect();
                PLACE_PHRASES.contains(&phrase.join(" ").as_str())
            } {
                score -= 4.0;
            }
            // `Sat Jan 27 10:16:41 2007`, `Thu Jul 11`: a date's weekday and month, each also a given name
            // somewhere (Sat, Thu, Sun; Jan, Jun, Jul), before the day's number
            if words >= 2
                && WEEKDAYS.contains(&toks[content[p]].key.as_ref())
                && MONTHS.contains(&toks[content[p + 1]].key.as_ref())
                && toks
                    .get(content[p + 1] + 1)
                    .is_some_and(|x| x.kind == Kind::Num || x.is_punct(text, '.'))
            {
                score -= 4.0;
            }
            // `San Lucas`, `St. Kristina`, `Mont- René`, `Robert Ouest`: a town named after a person
            let head_before = (s_tok.saturating_sub(3)..s_tok).rev().find(|&m| {
                toks[m].kind == Kind::Word
                    && (m + 1..s_tok)
                        .all(|k| toks[k].is_punct(text, '.') || toks[k].is_punct(text, '-'))
            });
            let head_word = |k: usize| toks[k].cap && toks[k].is(C_PLACE_HEAD);
            // `L'Île-Claire-sur-Mer`, `Noël -sur-Mer`
            let sur_after = {
                let rest = text[toks[e_tok].e..].trim_start_matches(' ');
                ["-sur-", "-sous-", "-en-", "-les-", "-lès-", "-lez-"]
                    .iter()
                    .any(|t| rest.starts_with(t))
            };
            if p == 0 && words >= 2 && head_word(content[p])
                || head_before.is_some_and(|m| head_word(m) && !toks[s_tok].nl_before)
                || words >= 2 && toks[e_tok].is(C_PLACE_TAIL)
                || sur_after
            {
                score -= 4.0;
            }
            // `06 Jun 2005`, `Jan 27`: a month beside a day's number is a date, not `Jan` or `June`
            if words == 1
                && (next.is_some_and(|x| x.kind == Kind::Num && !x.nl_before)
                    || s_tok > 0 && toks[s_tok - 1].kind == Kind::Num && !toks[s_tok].nl_before)
                && toks[first_tok].is(C_MONTH)
            {
                score -= 4.0;
            }
            // `Galaxy S24`, `Amazon S3`: a model number makes it a product; no name has a digit
            if content[p..q]
                .iter()
                .any(|&k| toks[k].text(text).bytes().any(|b| b.is_ascii_digit()))
            {
                score -= 4.0;
            }
            // `Olá! Looking for …`, `Viele Grüße,`: a greeting or a closing, not a name
            if p == 0
                && words == 1
                && next.is_none_or(|x| x.kind == Kind::Punct || !x.cap)
                && toks[first_tok].is(C_GREETING)
                || line_start(toks, s_tok, text)
                    && super::fields::is_valediction(line_of(text, toks[s_tok].s, toks[e_tok].e))
            {
                score -= 4.0;
            }
            // `I work for Wolters Kluwer`, `in Villafranca del Cid`: an employer or a place,
            // unless a listed given name says otherwise
            let given = evs[p..q].iter().any(|e| e.first && !e.common && !e.place);
            if !given && !has_title && (cue(&before, ORG_CUES) || cue(&before, PLACE_CUES)) {
                score -= 4.0;
            }
            // `Nova Zelândia`, `Ηνωμένο Βασίλειο`: a country, in any of the listed languages (a given name
            // alone, such as `Jordan` or `Georgia`, stays a name)
            if score >= 2.0
                && country_around(toks, text, first_tok, e_tok)
                    .is_some_and(|n| n > 1 || !(words == 1 && evs[p].first))
            {
                score -= 4.0;
            }
            if score >= 2.0 {
                let conf = if score >= 4.0 {
                    0.9
                } else if score >= 3.0 {
                    0.8
                } else {
                    0.65
                };
                let span_s = toks[s_tok].s;
                let span_e = toks[e_tok].e;
                out.push(
                    Cand::new(
                        span_s,
                        span_e,
                        PiiType::Person,
                        "name-model",
                        conf,
                        prio::PERSON,
                    )
                    .truncatable(toks[first_tok].e),
                );
                last_end = Some(e_tok);
                for (e, &k) in evs[p..q].iter().zip(&content[p..q]) {
                    if toks[k].key_chars >= 3 && !e.common && !e.place {
                        keys.insert(toks[k].key.as_ref());
                    }
                }
            }
            p = q;
        }
        i = j.max(i + 1);
    }
    let mut persons = Persons::default();
    before_and(text, toks, out, &mut persons);
    named_common_word(text, toks, out, &mut persons);
    lowercase_names(text, toks, out, &mut persons);
    name_lists(text, toks, out, &mut persons);
    // ---- second mention: a word already accepted as part of a name is a name elsewhere too
    if keys.is_empty() {
        firm_names(text, toks, out);
        return;
    }
    let taken = SpanIndex::new(
        out.iter()
            .filter(|c| c.ty == Some(PiiType::Person))
            .map(|c| (c.start, c.end))
            .collect(),
    );
    for t in toks {
        if capword(t) && keys.contains(t.key.as_ref()) && !taken.overlaps(t.s, t.e) {
            out.push(Cand::new(
                t.s,
                t.e,
                PiiType::Person,
                "name-coref",
                0.7,
                prio::PERSON,
            ));
        }
    }
    firm_names(text, toks, out);
}

/// Names the caller already knows, matched word by word on folded keys.
fn known_names(toks: &[Tok], known: &[String], out: &mut Vec<Cand>) {
    for name in known {
        let parts: Vec<String> = name.split_whitespace().map(fold).collect();
        if parts.is_empty() {
            continue;
        }
        let words: Vec<usize> = (0..toks.len())
            .filter(|&k| toks[k].kind == Kind::Word)
            .collect();
        for w in 0..words.len() {
            if w + parts.len() > words.len() {
                break;
            }
            if (0..parts.len()).all(|d| toks[words[w + d]].key == parts[d]) {
                let s = toks[words[w]].s;
                let e = toks[words[w + parts.len() - 1]].e;
                out.push(Cand::new(
                    s,
                    e,
                    PiiType::Person,
                    "known-name",
                    1.0,
                    prio::PERSON + 1,
                ));
            }
        }
    }
}

fn flags_of(t: &Tok) -> u32 {
    t.cls & (IN_FIRST | IN_LAST | IN_COMMON | IN_PLACES)
}

/// A lower-case word that only the name lists know (`olga`, `kleist`).
fn lower_name_word(t: &Tok, want: u32) -> bool {
    // (`&`: one branch, see `capword`; of `want` only the name-list bits can hold, since
    // the word must be in no other list)
    (t.kind == Kind::Word)
        & !t.cap
        & !t.sentinel
        & (t.key.len() >= 3)
        & t.is(want & (IN_FIRST | IN_LAST))
        & !t.is(IN_COMMON | IN_PLACES | C_PRONOUN)
}

/// Up to this many candidates, [`Persons::at`] scans `out` instead of indexing it.
const SCAN_PERSONS_UP_TO: usize = 32;

/// The person spans in `out`, for "is there a person at `s..e`?" without scanning all of
/// `out` per token (that makes name detection quadratic in the length of a paste).
/// Detectors only append to `out` while they ask, so each question first takes in the
/// candidates appended since the last one and the answer stays exact.
#[derive(Default)]
struct Persons {
    /// How many entries of `out` have been taken in.
    seen: usize,
    /// Person spans by start; the furthest end per start.
    by_start: BTreeMap<usize, usize>,
    /// Length of the longest person span: none starting `longest` or more bytes before `s`
    /// can reach it.
    longest: usize,
}

impl Persons {
    /// Some person candidate in `out` overlaps `s..e`.
    fn at(&mut self, out: &[Cand], s: usize, e: usize) -> bool {
        // A short record's few candidates are scanned faster than any index is built; `out`
        // only grows, so once it is past this size the index takes over for good.
        if self.seen == 0 && out.len() <= SCAN_PERSONS_UP_TO {
            return out
                .iter()
                .any(|c| c.ty == Some(PiiType::Person) && c.start < e && s < c.end);
        }
        for c in out.get(self.seen..).unwrap_or_default() {
            if c.ty == Some(PiiType::Person) {
                let end = self.by_start.entry(c.start).or_insert(c.end);
                *end = (*end).max(c.end);
                self.longest = self.longest.max(c.end.saturating_sub(c.start));
            }
        }
        self.seen = out.len();
        // (`min(e)`: a reversed question has an empty range, not a panicking one)
        self.by_start
            .range(s.saturating_sub(self.longest).min(e)..e)
            .any(|(_, &end)| end > s)
    }
}

/// Names typed in lower case: a given name followed by a family name (`olga krylova`,
/// `eric g. samoylova`), or a lone listed name after a strong cue (`my name is vitoria`,
/// `mr. elliott`) or as a speaker label (`mika: …`).
/// A lower-case name (`name-lower`): weaker evidence than capitalisation, hence 0.65.
fn lower_name(start: usize, end: usize) -> Cand {
    Cand::new(
        start,
        end,
        PiiType::Person,
        "name-lower",
        0.65,
        prio::PERSON,
    )
}

fn lowercase_names(text: &str, toks: &[Tok], out: &mut Vec<Cand>, persons: &mut Persons) {
    let n = toks.len();
    let mut i = 0;
    while i < n {
        let t = &toks[i];
        // `my name is vitoria`, `call me borna jerković`: after a naming cue any lower-case
        // word that is no ordinary word (nor place) is a name, with a following one as surname
        // (`&`: one branch, see `capword`)
        let plain = |x: &Tok| {
            (x.kind == Kind::Word)
                & !x.cap
                & !x.sentinel
                & (x.key_chars >= 3)
                & !x.is(IN_COMMON | IN_PLACES | C_PRONOUN)
        };
        // `name:    hyuuma t. maida`: a lower-case run after a person field label, with
        // initials, up to its line end
        if i >= 2
            && toks[i - 1].is_punct(text, ':')
            && toks[i - 2].is(C_PERSON_FIELD)
            && plain(t)
            && !t.nl_before
            && !persons.at(out, t.s, t.e)
        {
            // letters only (no `server01`), and a given name with a family name (a lone
            // word after `name:` is as often a config value)
            let alpha = |x: &Tok| x.key.chars().all(chars::is_alphabetic);
            let mut e = i;
            let mut words = 1;
            let mut j = i + 1;
            while j < n && !toks[j].nl_before && j < i + 6 {
                let x = &toks[j];
                if plain(x) {
                    e = j;
                    words += 1;
                } else if !(x.kind == Kind::Word && !x.cap && x.key.len() == 1
                    || x.is_punct(text, '.') && toks[j - 1].key.len() == 1)
                {
                    break;
                }
                j += 1;
            }
            // the whole line is the name
            if words >= 2
                && (i..=e).all(|m| toks[m].kind != Kind::Word || alpha(&toks[m]))
                && toks.get(e + 1).is_none_or(|x| x.nl_before)
            {
                out.push(lower_name(t.s, toks[e].e));
                i = e + 1;
                continue;
            }
        }
        if plain(t) && !persons.at(out, t.s, t.e) && cue(&words_before(toks, i), NAMING_CUES) {
            let e = if toks.get(i + 1).is_some_and(|x| plain(x) && !x.nl_before) {
                i + 1
            } else {
                i
            };
            out.push(lower_name(t.s, toks[e].e));
            i = e + 1;
            continue;
        }
        if !lower_name_word(t, IN_FIRST | IN_LAST) || persons.at(out, t.s, t.e) {
            i += 1;
            continue;
        }
        // given name + optional initial + family name (listed, or name-like and unlisted)
        let mut j = i + 1;
        if toks
            .get(j)
            .is_some_and(|x| x.kind == Kind::Word && x.key.len() == 1 && !x.nl_before)
        {
            j += 1;
            if toks.get(j).is_some_and(|x| x.is_punct(text, '.')) {
                j += 1;
            }
        }
        let pair = flags_of(t) & IN_FIRST != 0
            && toks.get(j).is_some_and(|x| {
                !x.nl_before
                    && !x.cap
                    && x.kind == Kind::Word
                    && (lower_name_word(x, IN_LAST)
                        || flags_of(x) == 0 && x.key.len() >= 4 && LEX.name_score(&x.key) >= 0.4)
            });
        if pair {
            out.push(lower_name(t.s, toks[j].e));
            i = j + 1;
            continue;
        }
        let before = words_before(toks, i);
        let titled = i >= 1
            && (is_title(&toks[i - 1])
                || i >= 2 && toks[i - 1].is_punct(text, '.') && is_title(&toks[i - 2]));
        let speaker = line_start(toks, i, text)
            && toks.get(i + 1).is_some_and(|x| x.is_punct(text, ':'))
            && toks.get(i + 2).is_some_and(|x| {
                !x.nl_before
                    && (x.kind == Kind::Word
                        || x.kind == Kind::Punct && matches!(x.text(text), "\"" | "“"))
            });
        // `selma began writing …`: a listed name opening a sentence, before a verb of people
        let subject = sentence_start(toks, i, text)
            && toks
                .get(i + 1)
                .is_some_and(|x| x.kind == Kind::Word && !x.cap && x.is(C_PERSON_VERB));
        if titled || speaker || subject || cue(&before, STRONG_CUES) {
            out.push(lower_name(t.s, t.e));
        }
        i += 1;
    }
}

/// `Her maiden name is Key.`: after someone's `name is`, a capitalised word that closes the
/// sentence is a name even when it is also an ordinary word.
fn named_common_word(text: &str, toks: &[Tok], out: &mut Vec<Cand>, persons: &mut Persons) {
    for i in 3..toks.len() {
        let t = &toks[i];
        // the rare `is` first: a test that almost always fails the same way is predicted,
        // one on capitalisation (about every other word) is not
        if toks[i - 1].key != "is"
            || !capword(t)
            || t.nl_before
            || toks[i - 2].key != "name"
            || !matches!(
                &*toks[i - 3].key,
                "my" | "his" | "her" | "your" | "their" | "maiden" | "first" | "last" | "middle"
            )
            || persons.at(out, t.s, t.e)
        {
            continue;
        }
        let closes = toks.get(i + 1).is_none_or(|x| {
            x.nl_before || x.kind == Kind::Punct && matches!(x.text(text), "." | "!" | "," | ";")
        });
        if closes {
            out.push(Cand::new(
                t.s,
                t.e,
                PiiType::Person,
                "name-cue",
                0.65,
                prio::PERSON,
            ));
        }
    }
}

/// `Basilio and Julian Fisher are …`: a name run opening its sentence right before `and` and
/// an accepted name, when each of its words is a listed name or spelled like one.
fn before_and(text: &str, toks: &[Tok], out: &mut Vec<Cand>, persons: &mut Persons) {
    let starts: Vec<usize> = out
        .iter()
        .filter(|c| c.ty == Some(PiiType::Person))
        .map(|c| c.start)
        .collect();
    for st in starts {
        let Ok(k) = toks.binary_search_by_key(&st, |t| t.s) else {
            continue;
        };
        if k < 2 || toks[k - 1].key != "and" || toks[k].nl_before || toks[k - 1].nl_before {
            continue;
        }
        let e = k - 2;
        let mut b = e;
        let namey = |x: &Tok| {
            capword(x) && {
                let ev = evidence(x);
                ev.known() || !ev.blocker() && ev.ng > 0.0
            }
        };
        if !namey(&toks[e]) {
            continue;
        }
        while b > 0
            && e - b < 3
            && !toks[b].nl_before
            && (namey(&toks[b - 1]) || is_particle(&toks[b - 1]) || {
                let x = &toks[b - 1];
                x.cap && is_cap_particle_key(x)
            })
        {
            b -= 1;
        }
        if !sentence_start(toks, b, text)
            || persons.at(out, toks[b].s, toks[e].e)
            || toks[b].is(C_PRONOUN)
        {
            continue;
        }
        out.push(Cand::new(
            toks[b].s,
            toks[e].e,
            PiiType::Person,
            "name-pair",
            0.65,
            prio::PERSON,
        ));
    }
}

/// Words before a name that make it a business's: `we use`, `shipped by`, `invoice from`, `our
/// vendor is` (not `hired`: people are hired too).
fn firm_cue_before(toks: &[Tok], i: usize) -> bool {
    const USE: &[&str] = &["use", "uses", "using", "used"];
    const BY: &[&str] = &[
        "shipped",
        "sold",
        "made",
        "delivered",
        "supplied",
        "provided",
        "manufactured",
        "distributed",
        "hosted",
        "powered",
        "operated",
        "represented",
    ];
    const FROM: &[&str] = &[
        "invoice",
        "order",
        "bill",
        "quote",
        "receipt",
        "purchased",
        "bought",
        "ordered",
    ];
    const ROLE: &[&str] = &[
        "vendor",
        "supplier",
        "provider",
        "contractor",
        "firm",
        "company",
        "agency",
        "employer",
        "landlord",
    ];
    let word = |k: usize| {
        toks.get(k)
            .filter(|t| t.kind == Kind::Word && !t.nl_before)
            .map(|t| &*t.key)
    };
    if i == 0 || toks[i].nl_before {
        return false;
    }
    let (w1, w2) = (word(i - 1), i.checked_sub(2).and_then(word));
    match w1 {
        Some(w) if USE.contains(&w) => true,
        Some("by") => w2.is_some_and(|w| BY.contains(&w)),
        Some("from") => w2.is_some_and(|w| FROM.contains(&w)),
        Some("is") => w2.is_some_and(|w| ROLE.contains(&w)),
        _ => false,
    }
}

/// Firm names made of three family names (`Barnett, Melton and Garcia` on a letterhead line,
/// `The Clark, Romero and Hall Orchestra`, `we use Lewis, Alexander and Wilson`): an
/// organisation, so its words are no person. Only the firm shape counts: exactly three single
/// capitalised words, none only a given name, alone on their line, or after `The` or a
/// business's cue, or before an organisation word or `and`.
fn firm_names(text: &str, toks: &[Tok], out: &mut Vec<Cand>) {
    let n = toks.len();
    let single = |k: usize| {
        toks.get(k).is_some_and(|x| {
            capword(x)
                && x.key != "and"
                && (!x.is(IN_FIRST) || x.is(IN_LAST))
                && !x.is(IN_COMMON | IN_PLACES)
        })
    };
    let mut i = 0;
    while i + 4 < n {
        // the rare separators first (see `named_common_word`)
        let separators = toks[i + 1].is_punct(text, ',')
            & ((toks[i + 3].key == "and") | toks[i + 3].is_punct(text, '&'))
            && !toks[i + 1..=i + 4].iter().any(|x| x.nl_before);
        if !separators {
            i += 1;
            continue;
        }
        // After a business's cue the words may be anything capitalised (`we use Dean, Jones and
        // Green`): the cue already says whose name it is.
        let cued = firm_cue_before(toks, i);
        let member = |k: usize| {
            if cued {
                toks.get(k).is_some_and(|x| capword(x) && x.key != "and")
            } else {
                single(k)
            }
        };
        if !(member(i) && member(i + 2) && member(i + 4)) {
            i += 1;
            continue;
        }
        let before_ok =
            line_start(toks, i, text) || i >= 1 && toks[i - 1].key == "the" && !toks[i].nl_before;
        let after_ok = toks.get(i + 5).is_none_or(|x| {
            x.nl_before
                || x.kind == Kind::Word && (x.is(C_ORG) || x.key == "and")
                || x.is_punct(text, '&')
        });
        if cued || before_ok && after_ok {
            let (s, e) = (toks[i].s, toks[i + 4].e);
            out.retain(|c| {
                !(c.ty == Some(PiiType::Person)
                    && c.detector != "known-name"
                    && c.start >= s
                    && c.end <= e)
            });
        }
        i += 5;
    }
}

/// Lists of single names (`Kónya, Becker and Vasquez`, `silvana, adam, chad and caleb`): when
/// one member is already a name, or most members are listed given names, the others are
/// names too.
fn name_lists(text: &str, toks: &[Tok], out: &mut Vec<Cand>, persons: &mut Persons) {
    let n = toks.len();
    let member = |k: usize, cap: bool| -> bool {
        toks.get(k).is_some_and(|x| {
            x.kind == Kind::Word
                && !x.sentinel
                && x.cap == cap
                && (!cap || capword(x))
                && x.key != "and"
                // a single word: not followed by another word of its case (`Torpy and
                // Salinas were …` ends a list of capitalised names)
                && toks.get(k + 1).is_none_or(|y| {
                    y.kind != Kind::Word || y.key == "and" || (cap && !y.cap && !y.nl_before)
                })
        })
    };
    // a run's member tokens, reused: most words open no list and free it at once
    let mut members: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < n {
        // A list has a separator right after its first member; without one the word opens
        // nothing (tested first: see `named_common_word`).
        if !toks
            .get(i + 1)
            .is_some_and(|x| x.is_punct(text, ',') | (x.key == "and") | x.is_punct(text, '&'))
        {
            i += 1;
            continue;
        }
        let cap = toks[i].cap;
        // a sentence-opening word no list knows and not spelled like a name (`Honestly, …`)
        // is no list member
        let opener = cap
            && sentence_start(toks, i, text)
            && flags_of(&toks[i]) == 0
            && LEX.name_score(&toks[i].key) < 0.0;
        if !member(i, cap)
            || opener
            || (i >= 1 && toks[i - 1].kind == Kind::Word && !toks[i - 1].nl_before)
        {
            i += 1;
            continue;
        }
        members.clear();
        members.push(i);
        let mut j = i + 1;
        loop {
            let mut k = j;
            let mut sep = false;
            if toks.get(k).is_some_and(|x| x.is_punct(text, ',')) {
                k += 1;
                sep = true;
            }
            if toks
                .get(k)
                .is_some_and(|x| x.key == "and" || x.is_punct(text, '&'))
            {
                k += 1;
                sep = true;
            }
            if !sep || toks.get(k).is_none_or(|x| x.nl_before) || !member(k, cap) {
                break;
            }
            members.push(k);
            j = k + 1;
        }
        if members.len() >= 2 {
            let evs: Vec<u32> = members.iter().map(|&k| flags_of(&toks[k])).collect();
            let clean = evs
                .iter()
                .all(|f| f & (IN_FIRST | IN_LAST) != 0 || f & (IN_COMMON | IN_PLACES) == 0)
                && !members.iter().any(|&k| toks[k].is(C_PRONOUN))
                // `Trinidad and Tobago`: one country, not two people
                && !members
                    .iter()
                    .any(|&k| country_around(toks, text, k, k).is_some_and(|n| n > 1));
            let named = members
                .iter()
                .filter(|&&k| persons.at(out, toks[k].s, toks[k].e))
                .count();
            let given = evs
                .iter()
                .filter(|f| **f & IN_FIRST != 0 && **f & IN_COMMON == 0)
                .count();
            let org_after = toks
                .get(j)
                .is_some_and(|x| x.kind == Kind::Word && x.is(C_ORG));
            if clean
                && !org_after
                && (named >= 1 || members.len() >= 3 && given * 2 >= members.len())
            {
                for &k in &members {
                    let t = &toks[k];
                    if !persons.at(out, t.s, t.e) {
                        out.push(Cand::new(
                            t.s,
                            t.e,
                            PiiType::Person,
                            "name-list",
                            0.65,
                            prio::PERSON,
                        ));
                    }
                }
            }
        }
        i = j.max(i + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Questions interleaved with appends to `out` get the answers a scan of `out` gives,
        /// before and after `out` outgrows the scanning fast path.
        #[test]
        fn persons_answer_as_a_scan_of_out_does(
            steps in prop::collection::vec((any::<bool>(), 0usize..80, 0usize..15, any::<bool>()), 1..120),
        ) {
            let mut out: Vec<Cand> = Vec::new();
            let mut persons = Persons::default();
            for (append, s, len, person) in steps {
                let e = s + len;
                if append {
                    let ty = if person { PiiType::Person } else { PiiType::Address };
                    out.push(Cand::new(s, e, ty, "test", 0.9, prio::PERSON));
                } else {
                    let scan = out
                        .iter()
                        .any(|c| c.ty == Some(PiiType::Person) && c.start < e && s < c.end);
                    prop_assert_eq!(persons.at(&out, s, e), scan, "query {}..{}", s, e);
                }
            }
        }
    }
}
