//! Labelled data for the builtin guard, expanded deterministically from the templates and filler
//! lists the repository ships under `data/guard/`.
//!
//! Why templates: a few hundred hand-written sentences per split, each filled several times from
//! split-specific filler lists, give a few thousand varied examples while keeping the held-out
//! split honest — held-out templates *and* fillers never appear in training.
//!
//! `values` templates carry personal values (`{email}`, `{phone}`, `{person}`, …). Each expansion
//! picks one of three renderings: every value replaced by its redaction sentinel (`<EMAIL>` …,
//! labelled benign: the redactor already removed the values), every value raw, or one value raw
//! among sentinels (a redactor miss) — both labelled with the template's categories (PII).

use std::collections::{HashMap, HashSet};

use serde::Deserialize;

use super::{Category, GuardError, Side};
use crate::curate::dedup::minhash::SplitMix64;
use crate::curate::redact::{RedactConfig, Redactor};

const TEMPLATES: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/guard/templates.jsonl"
));
const FILLERS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/guard/fillers.json"
));
/// Compositional prompts (`scripts/gen_guard_train.py`), training split only.
const COMPOSED: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/guard/compose_train.jsonl"
));
/// Prompts written one by one, not from templates or parts, training split only.
const WRITTEN: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/guard/written_train.jsonl"
));
/// [`LabelledSample::template`] of composed and written prompts starts here, apart from template
/// lines.
pub const COMPOSED_BASE: usize = 1 << 20;
/// [`LabelledSample::template`] of written prompts starts here, apart from composed lines.
const WRITTEN_BASE: usize = 1 << 21;

/// Which part of the shipped data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    HeldOut,
}

/// One labelled example.
#[derive(Clone, Debug, PartialEq)]
pub struct LabelledSample {
    pub text: String,
    pub side: Side,
    pub labels: Vec<Category>,
    pub refusal: Option<bool>,
    /// Line number (0-based, non-comment lines) of the template it came from.
    pub template: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Template {
    split: String,
    side: Side2,
    labels: Vec<Category>,
    #[serde(default)]
    values: bool,
    #[serde(default)]
    refusal: Option<bool>,
    text: String,
}

#[derive(Deserialize, Clone, Copy, Default)]
#[serde(rename_all = "lowercase")]
enum Side2 {
    #[default]
    Prompt,
    Response,
}

impl From<Side2> for Side {
    fn from(s: Side2) -> Self {
        match s {
            Side2::Prompt => Side::Prompt,
            Side2::Response => Side::Response,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FillerList {
    train: Vec<String>,
    test: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Composed {
    kind: String,
    labels: Vec<Category>,
    text: String,
    #[serde(default)]
    side: Side2,
    /// The written prompts' language (ISO 639-1), for readers of the file.
    #[serde(default, rename = "lang")]
    _lang: Option<String>,
}

/// Reads a file of labelled turns (`compose_train.jsonl`, `written_train.jsonl`; a first line
/// holding only `_comment` is skipped). With `redactor`, each text is what that redactor leaves
/// of it: the guard reads redacted turns, and prompts written with raw names would teach it that
/// raw personal values are harmless.
fn labelled_turns(
    file: &str,
    data: &str,
    base: usize,
    redactor: Option<&Redactor>,
) -> Result<Vec<LabelledSample>, GuardError> {
    let mut out = Vec::new();
    for (i, line) in data.lines().enumerate() {
        if line.trim().is_empty() || (i == 0 && line.starts_with("{\"_comment\"")) {
            continue;
        }
        let c: Composed = serde_json::from_str(line)
            .map_err(|e| GuardError::Data(format!("{file} line {}: {e}", i + 1)))?;
        if (c.kind == "unsafe") == c.labels.is_empty() {
            return Err(GuardError::Data(format!(
                "{file} line {}: kind {:?} with labels {:?}",
                i + 1,
                c.kind,
                c.labels
            )));
        }
        out.push(LabelledSample {
            text: match redactor {
                Some(r) => r.redact(&c.text).text,
                None => c.text,
            },
            side: c.side.into(),
            labels: c.labels,
            refusal: None,
            template: base + i,
        });
    }
    Ok(out)
}

/// Expansions per template (duplicates after filling are dropped).
const PER_TEMPLATE: usize = 14;

/// Expands the shipped templates of `split` (same output on every run); the training split also
/// holds the composed and the written prompts.
pub fn dataset(split: Split) -> Result<Vec<LabelledSample>, GuardError> {
    let fillers: HashMap<String, FillerList> = serde_json::from_str(FILLERS)
        .map_err(|e| GuardError::Data(format!("fillers.json: {e}")))?;
    let want = match split {
        Split::Train => "train",
        Split::HeldOut => "heldout",
    };
    let pick_list = |name: &str| -> Option<&Vec<String>> {
        fillers.get(name).map(|f| match split {
            Split::Train => &f.train,
            Split::HeldOut => &f.test,
        })
    };
    let mut rng = SplitMix64(match split {
        Split::Train => 0x7261_696e,
        Split::HeldOut => 0x7465_7374,
    });
    let mut out = Vec::new();
    for (i, line) in TEMPLATES.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let t: Template = serde_json::from_str(line)
            .map_err(|e| GuardError::Data(format!("templates.jsonl line {}: {e}", i + 1)))?;
        if t.split != want {
            if t.split != "train" && t.split != "heldout" {
                return Err(GuardError::Data(format!(
                    "templates.jsonl line {}: unknown split {:?}",
                    i + 1,
                    t.split
                )));
            }
            continue;
        }
        let side = Side::from(t.side);
        let mut seen = HashSet::new();
        for _ in 0..PER_TEMPLATE {
            // 0: all sentinels (benign), 1: all raw, 2: one raw value among sentinels.
            let mode = if t.values { rng.below(3) } else { 1 };
            let n_slots = t.text.matches('{').count();
            let raw_slot = if n_slots > 0 { rng.below(n_slots) } else { 0 };
            let mut text = String::new();
            let mut rest = t.text.as_str();
            let mut slot = 0;
            while let Some(open) = rest.find('{') {
                text.push_str(&rest[..open]);
                let close = rest[open..].find('}').ok_or_else(|| {
                    GuardError::Data(format!("templates.jsonl line {}: unclosed slot", i + 1))
                })? + open;
                let name = &rest[open + 1..close];
                let raw = match mode {
                    0 => false,
                    1 => true,
                    _ => slot == raw_slot,
                };
                let value = if let Some(v) = value_slot(name, &mut rng, split, &pick_list) {
                    match sentinel(name) {
                        Some(s) if !raw => s.to_string(),
                        _ => v,
                    }
                } else {
                    let list = pick_list(name).filter(|l| !l.is_empty()).ok_or_else(|| {
                        GuardError::Data(format!(
                            "templates.jsonl line {}: no filler list {name:?}",
                            i + 1
                        ))
                    })?;
                    list[rng.below(list.len())].clone()
                };
                text.push_str(&value);
                rest = &rest[close + 1..];
                slot += 1;
            }
            text.push_str(rest);
            let (opener, closer) = (pick_list("opener"), pick_list("closer"));
            if side == Side::Prompt {
                if let Some(o) = opener.filter(|l| !l.is_empty()) {
                    text = format!("{}{}", o[rng.below(o.len())], text);
                }
                if let Some(c) = closer.filter(|l| !l.is_empty()) {
                    text.push_str(&c[rng.below(c.len())]);
                }
            }
            let labels = if mode == 0 {
                Vec::new()
            } else {
                t.labels.clone()
            };
            if seen.insert(text.clone()) {
                out.push(LabelledSample {
                    text,
                    side,
                    labels,
                    refusal: if side == Side::Response {
                        t.refusal
                    } else {
                        None
                    },
                    template: i,
                });
            }
        }
    }
    if split == Split::Train {
        // The composed prompts' personal values were rendered as sentinels (or raw, standing
        // for a redactor miss) by their generator.
        out.extend(labelled_turns(
            "compose_train.jsonl",
            COMPOSED,
            COMPOSED_BASE,
            None,
        )?);
        let redactor = Redactor::new(RedactConfig::default());
        out.extend(labelled_turns(
            "written_train.jsonl",
            WRITTEN,
            WRITTEN_BASE,
            Some(&redactor),
        )?);
    }
    Ok(out)
}

/// Redaction sentinel for a personal-value slot, as the redactor writes it; `None` for
/// generated slots that are not personal (amounts, versions, hashes: always rendered raw).
fn sentinel(name: &str) -> Option<&'static str> {
    Some(match name {
        "email" => "<EMAIL>",
        "phone" => "<PHONE>",
        "ssn" => "<SSN>",
        "card" => "<CREDIT_CARD>",
        "iban" => "<IBAN>",
        "ip" => "<IP_ADDRESS>",
        "apikey" => "<API_KEY>",
        "person" => "<PERSON>",
        "address" => "<ADDRESS>",
        "path" => "<FILE_PATH>",
        _ => return None,
    })
}

fn hex(rng: &mut SplitMix64, n: usize) -> String {
    const H: &[u8] = b"0123456789abcdef";
    (0..n).map(|_| char::from(H[rng.below(16)])).collect()
}

fn digits(rng: &mut SplitMix64, n: usize) -> String {
    (0..n)
        .map(|_| char::from(b'0' + rng.below(10) as u8))
        .collect()
}

/// `n` random digits whose last one makes the Luhn checksum valid (card-number shaped).
fn luhn_digits(rng: &mut SplitMix64, n: usize) -> String {
    let mut d: Vec<u32> = (0..n - 1).map(|_| rng.below(10) as u32).collect();
    let mut sum = 0;
    for (k, &x) in d.iter().rev().enumerate() {
        let v = if k % 2 == 0 { x * 2 } else { x };
        sum += if v > 9 { v - 9 } else { v };
    }
    d.push((10 - sum % 10) % 10);
    d.into_iter().map(|x| char::from(b'0' + x as u8)).collect()
}

fn alnum(rng: &mut SplitMix64, n: usize) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..n).map(|_| char::from(A[rng.below(A.len())])).collect()
}

/// Generated personal values (and other numeric fillers); `None` if `name` is a list filler.
fn value_slot<'a>(
    name: &str,
    rng: &mut SplitMix64,
    split: Split,
    list: &dyn Fn(&str) -> Option<&'a Vec<String>>,
) -> Option<String> {
    let from = |n: &str, rng: &mut SplitMix64| -> String {
        list(n)
            .filter(|l| !l.is_empty())
            .map(|l| l[rng.below(l.len())].clone())
            .unwrap_or_else(|| n.to_string())
    };
    let held = split == Split::HeldOut;
    Some(match name {
        "email" => {
            let (f, l, d) = (from("first", rng), from("last", rng), from("domain", rng));
            match rng.below(3) {
                0 => format!("{}.{}@{d}", f.to_lowercase(), l.to_lowercase()),
                1 => {
                    let initial: String = f.chars().take(1).collect();
                    format!("{}{}@{d}", initial.to_lowercase(), l.to_lowercase())
                }
                _ => format!("{}{}@{d}", f.to_lowercase(), rng.below(99)),
            }
        }
        "phone" => match rng.below(3) {
            0 => format!("({}) {}-{}", digits(rng, 3), digits(rng, 3), digits(rng, 4)),
            1 => format!("+44 7{} {}", digits(rng, 3), digits(rng, 6)),
            _ => format!("{}.{}.{}", digits(rng, 3), digits(rng, 3), digits(rng, 4)),
        },
        "ssn" => format!("{}-{}-{}", digits(rng, 3), digits(rng, 2), digits(rng, 4)),
        "card" => {
            let d = luhn_digits(rng, 16);
            if held {
                d
            } else {
                format!("{} {} {} {}", &d[..4], &d[4..8], &d[8..12], &d[12..])
            }
        }
        "iban" => format!(
            "{}{} {} {} {} {}",
            ["GB", "DE", "FR", "NL"][rng.below(4)],
            digits(rng, 2),
            alnum(rng, 4).to_uppercase(),
            digits(rng, 4),
            digits(rng, 4),
            digits(rng, 4)
        ),
        "ip" => format!(
            "{}.{}.{}.{}",
            10 + rng.below(200),
            rng.below(256),
            rng.below(256),
            1 + rng.below(254)
        ),
        "apikey" => match rng.below(3) {
            0 => format!("sk-{}", alnum(rng, 40)),
            1 => format!("AKIA{}", alnum(rng, 16).to_uppercase()),
            _ => format!("ghp_{}", alnum(rng, 36)),
        },
        "person" => format!("{} {}", from("first", rng), from("last", rng)),
        "address" => format!(
            "{} {}, {} {}",
            1 + rng.below(300),
            from("street", rng),
            from("city", rng),
            digits(rng, 5)
        ),
        "path" => format!(
            "/home/{}/{}/secrets.env",
            from("first", rng).to_lowercase(),
            ["projects", "work", "dev"][rng.below(3)]
        ),
        "money" => match rng.below(3) {
            0 => format!("${}k", 2 + rng.below(90)),
            1 => format!("£{},{}00", 1 + rng.below(60), rng.below(10)),
            _ => format!("${}", 100 + rng.below(9000)),
        },
        "digits4" => digits(rng, 4),
        // Hard negatives: numbers and identifiers that are not personal.
        "uuid" => format!(
            "{}-{}-{}-{}-{}",
            hex(rng, 8),
            hex(rng, 4),
            hex(rng, 4),
            hex(rng, 4),
            hex(rng, 12)
        ),
        "semver" => format!("{}.{}.{}", rng.below(20), rng.below(40), rng.below(30)),
        "sha" => {
            let n = if rng.chance(0.5) { 40 } else { 64 };
            hex(rng, n)
        }
        "shortsha" => hex(rng, 7),
        "timestamp" => format!(
            "20{}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            20 + rng.below(8),
            1 + rng.below(12),
            1 + rng.below(28),
            rng.below(24),
            rng.below(60),
            rng.below(60)
        ),
        "math" => format!(
            "{} {} {} {} {}",
            rng.below(1000),
            ["*", "+", "/"][rng.below(3)],
            rng.below(1000),
            ["-", "+"][rng.below(2)],
            rng.below(10000)
        ),
        "ordernum" => {
            let n = 10 + rng.below(7);
            digits(rng, n)
        }
        "port" => format!("{}", 1024 + rng.below(60000)),
        "lineno" => format!("{}", 1 + rng.below(900)),
        "price" => format!("${}.{:02}", 1 + rng.below(500), rng.below(100)),
        "clock" => format!("{}:{:02}", 1 + rng.below(12), rng.below(60)),
        "bignum" => format!("{}", 1000 + rng.below(1_000_000)),
        _ => return None,
    })
}
