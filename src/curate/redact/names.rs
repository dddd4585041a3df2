//! Person names. Regexes cannot tell `Teresa Kreutzmann` from `Entertainment Weekly`, so runs
//! of capitalised words are scored with gazetteers (given names, family names, common words,
//! places), a character n-gram name model, titles (`Mr.`, `Prof.`, `Ing.`) and context cues
//! (`my name is`, `Dear`, `says`). Accepted name words are then found again elsewhere in the
//! same text (`… early Yefremova`).

use std::collections::HashSet;
use std::sync::LazyLock;

use super::lexicon::{Kind, LEX, Tok, fold};
use super::{Cand, PiiType, prio};

fn set(words: &'static str) -> HashSet<&'static str> {
    words.split_whitespace().collect()
}

/// Honorifics and academic titles that precede a name (folded, without dots).
static TITLES: LazyLock<HashSet<&'static str>> = LazyLock::new(|| {
    set(
        "mr mrs ms miss mx dr prof sir dame lady lord herr frau ing dipl univ mag mme mlle \
         monsieur madame mademoiselle sr sra srta don dona sig dott dhr mevr ir drs fr pfr \
         senor senora signor signora mister missus doctor professor misc ind",
    )
});
/// Words that make a capitalised run an organisation, venue or place rather than a person.
static ORG: LazyLock<HashSet<&'static str>> = LazyLock::new(|| {
    set(
        "inc ltd llc gmbh ag corp co company group university college school bank hotel orchestra \
         foundation institute association club band records studios university's church museum \
         hospital airport station street avenue road lane park river lake mountain county city \
         republic kingdom state states ministry department council party team fc united systems \
         technologies solutions labs services partners holdings brothers sons & times post news \
         weekly magazine journal press research plc technologies consulting associates electronics \
         motors industries enterprises media capital ventures networks software logistics pharma \
         energy foods airlines insurance realty restaurant cafe bar pub shop store inc. corporation",
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
const DETERMINERS: &[&str] = &[
    "the", "a", "an", "this", "that", "our", "their", "its", "every", "each",
];

fn is_title(t: &Tok) -> bool {
    t.kind == Kind::Word && TITLES.contains(t.key.as_ref())
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
    t.kind == Kind::Word && !t.cap && PARTICLES.contains(&t.key.as_ref())
}

fn capword(t: &Tok) -> bool {
    t.kind == Kind::Word && t.cap && !t.sentinel && (!t.all_caps || t.key.chars().count() <= 2)
}

/// Per-word evidence.
struct Ev {
    first: bool,
    last: bool,
    common: bool,
    place: bool,
    ng: f32,
}

fn evidence(key: &str) -> Ev {
    let l = &*LEX;
    Ev {
        first: l.first.contains(key),
        last: l.last.contains(key),
        common: l.common.contains(key),
        place: l.places.contains(key),
        ng: l.name_score(key),
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
fn words_before<'a>(toks: &'a [Tok<'a>], i: usize) -> Vec<&'a str> {
    let mut v = Vec::new();
    let mut j = i;
    while j > 0 && v.len() < 3 {
        j -= 1;
        let t = &toks[j];
        if t.kind == Kind::Word {
            v.push(t.key.as_ref());
        } else if t.kind == Kind::Num {
            break;
        }
        // punctuation such as `,` or `:` is skipped: "Name: X", "Sure, X"
        if toks[j].nl_before || (t.kind == Kind::Punct && !matches!(t.key.as_ref(), "")) {
            break;
        }
    }
    v.reverse();
    v
}

fn cue(before: &[&str], list: &[&[&str]]) -> bool {
    list.iter()
        .any(|c| before.len() >= c.len() && before[before.len() - c.len()..] == **c)
}

/// Finds person names.
pub(crate) fn detect(text: &str, toks: &[Tok], known: &[String], out: &mut Vec<Cand>) {
    let mut keys: HashSet<String> = HashSet::new();
    known_names(toks, known, out);
    let n = toks.len();
    let mut last_end: Option<usize> = None;
    let mut i = 0;
    while i < n {
        let t = &toks[i];
        if t.sentinel || t.kind != Kind::Word {
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
            let cap_particle = t.cap && next_cap && CAP_PARTICLES.contains(&t.key.as_ref());
            let starts = capword(t) || (is_particle(t) && next_cap);
            if cap_particle {
                // `Le Blanchard`, `Van Dijk`: keep the particle with the name
            } else
            // a capitalised common word ("Thanks", "Okay") is context, not part of a name
            if !starts || (capword(t) && evidence(&t.key).blocker()) {
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
        let mut content: Vec<usize> = Vec::new();
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
                    && CAP_PARTICLES.contains(&w.key.as_ref())
                    && toks.get(j + 1).is_some_and(|x| capword(x) && !x.nl_before))
            {
                content.push(j);
                j += 1;
                continue;
            }
            if content.is_empty()
                && w.cap
                && CAP_PARTICLES.contains(&w.key.as_ref())
                && toks.get(j + 1).is_some_and(|x| capword(x) && !x.nl_before)
            {
                particle_lead = true;
                j += 1;
                continue;
            }
            if is_particle(w) && toks.get(j + 1).is_some_and(|x| capword(x) && !x.nl_before) {
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
        let mut evs: Vec<Ev> = content.iter().map(|&k| evidence(&toks[k].key)).collect();
        for k in 1..evs.len() {
            let prev_given = evs[k - 1].first && !evs[k - 1].common && !evs[k - 1].place;
            if prev_given && evs[k].blocker() && content[k] == content[k - 1] + 1
                || prev_given
                    && evs[k].blocker()
                    && content[k] == content[k - 1] + 2
                    && is_particle(&toks[content[k] - 1])
            {
                evs[k].last = true;
            }
        }
        let org = content.iter().any(|&k| ORG.contains(toks[k].key.as_ref()))
            || toks
                .get(j)
                .is_some_and(|x| x.kind == Kind::Word && ORG.contains(x.key.as_ref()));
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
            let header = s_tok >= 2
                && toks[s_tok - 1].is_punct(text, ':')
                && HEADERS.contains(&toks[s_tok - 2].key.as_ref());
            // `X and Y`, `X, Y`: a name right after an accepted name
            let after_name = s_tok >= 2
                && last_end.is_some_and(|le| le + 2 == s_tok)
                && (toks[s_tok - 1].key == "and"
                    || toks[s_tok - 1].is_punct(text, ',')
                    || toks[s_tok - 1].is_punct(text, '&'));
            let strong_cue = header || after_name || cue(&before, STRONG_CUES);
            let any_cue = strong_cue || cue(&before, CUES);
            let det = before.last().is_some_and(|w| DETERMINERS.contains(w));
            let mut score: f32 = evs[p..q].iter().map(Ev::score).sum();
            let words = q - p;
            if words >= 2 && evs[p..q].iter().all(|e| !e.common) {
                score += 1.0;
            }
            if has_title {
                score += 3.0;
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
            if !known_any && !has_title && !strong_cue {
                // unknown words alone need a clear name-like spelling
                let avg = evs[p..q].iter().map(|e| e.ng).sum::<f32>() / words as f32;
                if words < 2 || avg < 0.4 {
                    score -= 1.5;
                }
            }
            if p == 0 && particle_lead {
                score += 1.0;
            }
            if strong_cue && evs[p..q].iter().all(|e| !e.blocker()) {
                score = score.max(2.0);
            }
            if org {
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
                for &k in &content[p..q] {
                    let e = &evs[content.iter().position(|&c| c == k).unwrap_or(0)];
                    if toks[k].key.chars().count() >= 3 && !e.common && !e.place {
                        keys.insert(toks[k].key.to_string());
                    }
                }
            }
            p = q;
        }
        i = j.max(i + 1);
    }
    // ---- second mention: a word already accepted as part of a name is a name elsewhere too
    if keys.is_empty() {
        return;
    }
    let taken: Vec<(usize, usize)> = out
        .iter()
        .filter(|c| c.ty == Some(PiiType::Person))
        .map(|c| (c.start, c.end))
        .collect();
    for t in toks {
        if capword(t)
            && keys.contains(t.key.as_ref())
            && !taken.iter().any(|&(s, e)| s < t.e && t.s < e)
        {
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
