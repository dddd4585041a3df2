//! Span-level PII redactor: finds personal data in chat text and replaces each span with a
//! typed sentinel (`<EMAIL>`, `<PERSON>` …) so samples can be kept for learning without the
//! personal bits. Deterministic, in-process, no model download: regexes with validators for
//! structured types, gazetteers plus a character n-gram name model for people and addresses.
//!
//! Offsets in the public API are Unicode code points, end exclusive (as in the gold data).

mod address;
mod chars;
mod cjk;
mod fields;
mod lexicon;
mod names;
mod national_id;
mod structured;
pub mod tagger;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};

use serde::{Deserialize, Serialize};

use super::secrets::{CharIndex, SecretConfig, SecretScanner};
use super::{KeptSpans, merge_rescan};

/// The shipped English vocabulary (folded), shared with the secret filter's identifier check.
pub(crate) fn english_words() -> &'static lexicon::WordSet {
    &lexicon::LEX.common
}

/// Kinds of personal data the redactor knows.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum PiiType {
    /// E-mail address.
    Email,
    /// Telephone number.
    Phone,
    /// Payment card number (Luhn-valid).
    CreditCard,
    /// Social security or national person number: the US SSN, and the number other states give
    /// each person (personnummer, INSEE, codice fiscale, PESEL, …).
    Ssn,
    /// International bank account number (mod-97 valid).
    Iban,
    /// IPv4/IPv6 address (non-personal ranges optional).
    IpAddress,
    /// API key, token, password or private key.
    ApiKey,
    /// File path embedding a user name.
    FilePath,
    /// Person name.
    Person,
    /// Street or postal address.
    Address,
    /// Date of birth (a date in birth context).
    DateOfBirth,
    /// Passport, driver's licence or national id number (in context).
    IdNumber,
    /// Hardware MAC address.
    MacAddress,
    /// `user:password@` part of a URL.
    UrlCredentials,
    /// Bitcoin or Ethereum wallet address.
    CryptoWallet,
    /// Only the user-name segment of a home path (see [`FilePathMode::UserNameOnly`]).
    UserName,
}

impl PiiType {
    /// Every type, in declaration order.
    pub const ALL: &'static [PiiType] = &[
        PiiType::Email,
        PiiType::Phone,
        PiiType::CreditCard,
        PiiType::Ssn,
        PiiType::Iban,
        PiiType::IpAddress,
        PiiType::ApiKey,
        PiiType::FilePath,
        PiiType::Person,
        PiiType::Address,
        PiiType::DateOfBirth,
        PiiType::IdNumber,
        PiiType::MacAddress,
        PiiType::UrlCredentials,
        PiiType::CryptoWallet,
        PiiType::UserName,
    ];

    /// Upper-case label as used in the gold data (`CREDIT_CARD`).
    pub fn label(&self) -> &'static str {
        match self {
            PiiType::Email => "EMAIL",
            PiiType::Phone => "PHONE",
            PiiType::CreditCard => "CREDIT_CARD",
            PiiType::Ssn => "SSN",
            PiiType::Iban => "IBAN",
            PiiType::IpAddress => "IP_ADDRESS",
            PiiType::ApiKey => "API_KEY",
            PiiType::FilePath => "FILE_PATH",
            PiiType::Person => "PERSON",
            PiiType::Address => "ADDRESS",
            PiiType::DateOfBirth => "DATE_OF_BIRTH",
            PiiType::IdNumber => "ID_NUMBER",
            PiiType::MacAddress => "MAC_ADDRESS",
            PiiType::UrlCredentials => "URL_CREDENTIALS",
            PiiType::CryptoWallet => "CRYPTO_WALLET",
            PiiType::UserName => "USER_NAME",
        }
    }

    /// Replacement text: `<LABEL>`. Only upper-case letters and `_` inside angle brackets, so
    /// no detector can mistake a sentinel for PII.
    pub fn sentinel(&self) -> &'static str {
        match self {
            PiiType::Email => "<EMAIL>",
            PiiType::Phone => "<PHONE>",
            PiiType::CreditCard => "<CREDIT_CARD>",
            PiiType::Ssn => "<SSN>",
            PiiType::Iban => "<IBAN>",
            PiiType::IpAddress => "<IP_ADDRESS>",
            PiiType::ApiKey => "<API_KEY>",
            PiiType::FilePath => "<FILE_PATH>",
            PiiType::Person => "<PERSON>",
            PiiType::Address => "<ADDRESS>",
            PiiType::DateOfBirth => "<DATE_OF_BIRTH>",
            PiiType::IdNumber => "<ID_NUMBER>",
            PiiType::MacAddress => "<MAC_ADDRESS>",
            PiiType::UrlCredentials => "<URL_CREDENTIALS>",
            PiiType::CryptoWallet => "<CRYPTO_WALLET>",
            PiiType::UserName => "<USER_NAME>",
        }
    }

    /// Parses a label (`"CREDIT_CARD"`) back to a type.
    pub fn from_label(label: &str) -> Option<PiiType> {
        PiiType::ALL.iter().copied().find(|t| t.label() == label)
    }
}

/// How home-directory paths are redacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum FilePathMode {
    /// The whole path becomes `<FILE_PATH>` (matches the gold data).
    #[default]
    WholePath,
    /// Only the user-name segment becomes `<USER_NAME>`; the rest of the path stays useful.
    UserNameOnly,
}

/// Redactor settings; every field changes behaviour (see tests/curate/redact.rs).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedactConfig {
    /// Types to report and redact; others are ignored.
    pub types: Vec<PiiType>,
    /// Leave loopback, unspecified, broadcast, multicast and documentation IPs alone, since
    /// they identify no one.
    pub keep_non_personal_ips: bool,
    /// Whole path or only the user name.
    pub file_path_mode: FilePathMode,
    /// Spans below this confidence are dropped (trade recall for precision).
    pub min_confidence: f32,
    /// Names the device already knows (the user, contacts): always redacted as PERSON.
    pub known_names: Vec<String>,
    /// Exact values never redacted (e.g. a public support e-mail), compared case-insensitively.
    pub allow: Vec<String>,
    /// Redact the `user:password@` part of URLs.
    pub url_credentials: bool,
    /// Run the learned name/address tagger ([`tagger`]) beside the rules: its PERSON and
    /// ADDRESS spans fill what the rules leave in non-Latin scripts, the rules winning where
    /// both find a span. Off by default: see docs/redact-tagger.md for its figures.
    pub tagger: bool,
}

impl Default for RedactConfig {
    fn default() -> Self {
        Self {
            types: PiiType::ALL
                .iter()
                .copied()
                .filter(|t| *t != PiiType::UserName)
                .collect(),
            keep_non_personal_ips: true,
            file_path_mode: FilePathMode::WholePath,
            min_confidence: 0.5,
            known_names: Vec::new(),
            allow: Vec::new(),
            url_credentials: true,
            tagger: false,
        }
    }
}

/// One redacted span (code-point offsets).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PiiSpan {
    /// Start, code points.
    pub start: usize,
    /// End (exclusive), code points.
    pub end: usize,
    /// What it is.
    pub pii_type: PiiType,
    /// Which detector fired (`luhn`, `gazetteer` …), for debugging and audits.
    pub detector: &'static str,
    /// Rough confidence in 0..=1.
    pub confidence: f32,
}

/// Redacted text plus the spans (offsets refer to the input text).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Redaction {
    /// Text with sentinels.
    pub text: String,
    /// Spans of the input that were replaced, sorted, non-overlapping.
    pub spans: Vec<PiiSpan>,
}

/// Errors from JSONL prediction.
#[derive(Debug, thiserror::Error)]
pub enum RedactError {
    /// A line was not a JSON object with a string `text`.
    #[error("line {line}: {reason}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        reason: String,
    },
    /// Reading or writing failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Internal candidate in byte offsets; `ty == None` is a shield (a known non-PII thing such as
/// a UUID or timestamp) that only blocks weaker detectors and is never reported.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cand {
    pub start: usize,
    pub end: usize,
    pub ty: Option<PiiType>,
    pub detector: &'static str,
    pub confidence: f32,
    pub priority: u8,
    /// Shortest end that keeps the span meaningful when a stronger span cuts into its tail
    /// (a home path stays a home path up to its user name); `end` means "not truncatable".
    pub min_end: usize,
}

impl Cand {
    pub(crate) fn new(
        start: usize,
        end: usize,
        ty: PiiType,
        detector: &'static str,
        confidence: f32,
        priority: u8,
    ) -> Self {
        Self {
            start,
            end,
            ty: Some(ty),
            detector,
            confidence,
            priority,
            min_end: end,
        }
    }

    /// Allows truncation down to `min_end`.
    pub(crate) fn truncatable(mut self, min_end: usize) -> Self {
        self.min_end = min_end;
        self
    }

    pub(crate) fn shield(start: usize, end: usize, detector: &'static str, priority: u8) -> Self {
        Self {
            start,
            end,
            ty: None,
            detector,
            confidence: 1.0,
            priority,
            min_end: end,
        }
    }
}

/// Detection priorities: on overlap the higher one wins (then the longer span).
pub(crate) mod prio {
    pub const API_KEY: u8 = 100;
    pub const URL_CRED: u8 = 96;
    pub const EMAIL: u8 = 92;
    pub const FILE_PATH: u8 = 90;
    pub const IBAN: u8 = 85;
    pub const CARD: u8 = 80;
    pub const SSN: u8 = 78;
    pub const IP: u8 = 76;
    pub const MAC: u8 = 76;
    pub const WALLET: u8 = 76;
    pub const SHIELD: u8 = 70;
    pub const DOB: u8 = 65;
    pub const ID: u8 = 64;
    pub const PHONE: u8 = 60;
    pub const ADDRESS: u8 = 50;
    pub const PERSON: u8 = 40;
    pub const TAGGER: u8 = 30;
}

/// Keywords found in a text: secret rules selected (bit per rule index) and structured
/// detector groups woken ([`structured::KEYWORD_GROUPS`] bits).
#[derive(Clone, Copy)]
struct KeywordHits {
    secret_rules: u64,
    groups: u8,
}

/// Whose keyword a pattern of a [`KeywordAutomaton`] is.
#[derive(Clone, Copy)]
enum KeywordOwner {
    /// A secret rule, by index.
    SecretRule(usize),
    /// A structured detector group bit.
    Group(u8),
}

/// The secret rules' keywords and the structured detectors' context keywords in one
/// ASCII-case-insensitive automaton, searched with overlaps (every occurrence of every
/// keyword): each pass walks the text once for both instead of twice. It holds only the
/// keywords the redactor's types consult, as a smaller DFA walks text faster.
struct KeywordAutomaton {
    ac: AhoCorasick,
    owner: Vec<KeywordOwner>,
    /// Whether it holds the secret rules' keywords.
    secret_rules: bool,
    /// The structured groups it holds: a walk may stop once it has seen them all.
    groups: u8,
}

impl KeywordAutomaton {
    /// The automaton for secret rules' keywords (if `secret_rules`) and these groups' keywords,
    /// built once per combination.
    fn shared(secret_rules: bool, groups: u8) -> std::sync::Arc<Self> {
        type Built = HashMap<(bool, u8), std::sync::Arc<KeywordAutomaton>>;
        static BUILT: LazyLock<std::sync::Mutex<Built>> = LazyLock::new(Default::default);
        let mut built = BUILT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        built
            .entry((secret_rules, groups))
            .or_insert_with(|| std::sync::Arc::new(Self::build(secret_rules, groups)))
            .clone()
    }

    fn build(secret_rules: bool, groups: u8) -> Self {
        let mut patterns = Vec::new();
        let mut owner = Vec::new();
        if secret_rules {
            for (rule, k) in super::secrets::rule_keywords() {
                patterns.push(k);
                owner.push(KeywordOwner::SecretRule(rule));
            }
        }
        for (group, ks) in structured::KEYWORD_GROUPS {
            if groups & group != 0 {
                for k in *ks {
                    patterns.push(k);
                    owner.push(KeywordOwner::Group(*group));
                }
            }
        }
        KeywordAutomaton {
            ac: AhoCorasick::builder()
                // For this many patterns the builder would pick an NFA; the DFA, built once,
                // walks short texts faster.
                .kind(Some(AhoCorasickKind::DFA))
                .ascii_case_insensitive(true)
                .match_kind(MatchKind::Standard)
                .build(&patterns)
                // constant short literals: building cannot fail
                .expect("constant keyword automaton"),
            owner,
            secret_rules,
            groups,
        }
    }
}

/// The redactor. Build once, share across threads.
pub struct Redactor {
    config: RedactConfig,
    enabled: [bool; 16],
    secrets: SecretScanner,
    allow: HashSet<String>,
    known_names: Vec<String>,
    /// Tagger weights other than the shipped ones (see [`Redactor::with_tagger_weights`]).
    tagger_weights: Option<std::sync::Arc<tagger::TaggerWeights>>,
    keywords: std::sync::Arc<KeywordAutomaton>,
}

impl Redactor {
    /// Uses these tagger weights instead of the shipped ones (weights trained by
    /// `examples/train_pii_tagger.rs`); they only act when `tagger` is on.
    pub fn with_tagger_weights(mut self, w: tagger::TaggerWeights) -> Self {
        self.tagger_weights = Some(std::sync::Arc::new(w));
        self
    }

    /// Builds a redactor from its config.
    pub fn new(config: RedactConfig) -> Self {
        let mut enabled = [false; 16];
        for t in &config.types {
            enabled[*t as usize] = true;
        }
        // FilePath in user-name mode reports UserName spans.
        if config.file_path_mode == FilePathMode::UserNameOnly
            && enabled[PiiType::FilePath as usize]
        {
            enabled[PiiType::UserName as usize] = true;
        }
        let secrets = SecretScanner::new(SecretConfig::default())
            // The default secret config is constant and valid (unit-tested).
            .expect("default secret config is valid");
        let allow = config.allow.iter().map(|s| s.to_lowercase()).collect();
        let known_names = config
            .known_names
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| s.chars().count() >= 2)
            .collect();
        let on = |t: PiiType| enabled[t as usize];
        let keywords =
            KeywordAutomaton::shared(on(PiiType::ApiKey), structured::keyword_groups_for(on));
        Self {
            config,
            enabled,
            secrets,
            allow,
            known_names,
            tagger_weights: None,
            keywords,
        }
    }

    /// The config in use.
    pub fn config(&self) -> &RedactConfig {
        &self.config
    }

    fn on(&self, t: PiiType) -> bool {
        self.enabled[t as usize]
    }

    /// Finds PII spans (code-point offsets, sorted, non-overlapping).
    pub fn find(&self, text: &str) -> Vec<PiiSpan> {
        spans_of(text, &self.find_bytes(text))
    }

    /// Redacts: each span becomes its type's sentinel.
    pub fn redact(&self, text: &str) -> Redaction {
        let (cands, redacted) = self.find_bytes_and_text(text);
        if cands.is_empty() {
            // most chat messages: nothing to splice, no offsets to convert
            return Redaction {
                spans: Vec::new(),
                text: text.to_owned(),
            };
        }
        Redaction {
            spans: spans_of(text, &cands),
            text: redacted.unwrap_or_else(|| sentinels_for(text, &cands).text),
        }
    }

    /// Byte-offset spans of `text`, closed under re-redaction: after replacing the spans with
    /// sentinels, the text is scanned again (a sentinel changes the context of glued tokens,
    /// e.g. `10.0.0.142 Main Street`); new finds are mapped back and merged, until nothing
    /// new turns up. This makes `redact(redact(x)) == redact(x)`.
    fn find_bytes(&self, text: &str) -> Vec<Cand> {
        self.find_bytes_and_text(text).0
    }

    /// [`Self::find_bytes`], plus the redacted text when the last re-scan was of exactly these
    /// spans' sentinels (then it is the output, already built).
    fn find_bytes_and_text(&self, text: &str) -> (Vec<Cand>, Option<String>) {
        // Always re-scan when something was found: a span can swallow the start of a
        // neighbour that its own detector rejected for lack of a boundary (`x.txt+1 (916) …`),
        // so no cheap local test proves the redacted text is already clean.
        //
        // Tokens for the name and address detectors: the text's own, then for each re-scan
        // those of the redacted text, copied from the text's wherever the splice left them
        // unchanged (`lexicon::retokenize`).
        let wants_tokens = self.on(PiiType::Address) || self.on(PiiType::Person);
        let toks = (wants_tokens && !text.is_empty()).then(|| lexicon::tokenize(text));
        let mut cands = self.pass(text, toks.as_deref(), false);
        for _ in 0..4 {
            if cands.is_empty() {
                break;
            }
            // redacted text and, per sentinel, (redacted start, redacted end, original start, original end)
            let spliced = sentinels_for(text, &cands);
            let spliced_toks = toks.as_deref().map(|t| lexicon::retokenize(t, &spliced));
            let new = self.pass(&spliced.text, spliced_toks.as_deref(), true);
            drop(spliced_toks);
            if new.is_empty() {
                return (cands, Some(spliced.text));
            }
            let back = |r: usize, is_end: bool| spliced.original(r, is_end);
            let new = new.into_iter().map(|n| {
                let end = back(n.end, true);
                Cand {
                    start: back(n.start, false),
                    end,
                    min_end: end,
                    ..n
                }
            });
            merge_rescan(&mut cands, new.collect(), |c| (c.start, c.end));
        }
        (cands, None)
    }

    /// Which of the redactor's keywords occur in `text`: one overlapping automaton walk,
    /// stopped once every secret rule and every structured group it holds has been seen.
    fn keyword_hits(&self, text: &str) -> KeywordHits {
        let b = text.as_bytes();
        let mut hits = KeywordHits {
            secret_rules: 0,
            groups: 0,
        };
        let kw = &*self.keywords;
        let mut rules_left = if kw.secret_rules {
            self.secrets.enabled_rules()
        } else {
            0
        };
        for m in kw.ac.find_overlapping_iter(b) {
            match kw.owner[m.pattern().as_usize()] {
                KeywordOwner::SecretRule(r) => {
                    if hits.secret_rules & 1 << r == 0
                        && self.secrets.keyword_selects(r, &b[m.start()..m.end()])
                    {
                        hits.secret_rules |= 1 << r;
                        rules_left -= 1;
                    }
                }
                KeywordOwner::Group(g) => hits.groups |= g,
            }
            if rules_left == 0 && hits.groups == kw.groups {
                break;
            }
        }
        hits
    }

    /// The tagger's PERSON and ADDRESS spans, below the rules' priority: it wakes only on
    /// words no rule span holds (most names in Latin-script chat are the rules'), so that it
    /// costs little where the rules already did the work.
    fn tag(&self, text: &str, toks: &[lexicon::Tok], rescan: bool, cands: &mut Vec<Cand>) {
        if !self.on(PiiType::Person) && !self.on(PiiType::Address) {
            return;
        }
        let w: &tagger::TaggerWeights = match &self.tagger_weights {
            Some(w) => w,
            None => tagger::shipped(),
        };
        let mut held: Vec<(usize, usize)> = cands
            .iter()
            .filter(|c| c.ty.is_some())
            .map(|c| (c.start, c.end))
            .collect();
        held.sort_unstable();
        for s in w.spans(text, toks, rescan, &held) {
            let ty = if s.address {
                PiiType::Address
            } else {
                PiiType::Person
            };
            cands.push(Cand::new(
                s.start,
                s.end,
                ty,
                "tagger",
                s.confidence,
                prio::TAGGER,
            ));
        }
    }

    /// One detection pass: candidates after filtering and overlap resolution. `toks` are
    /// `text`'s tokens when the name or address detector is on.
    fn pass(&self, text: &str, toks: Option<&[lexicon::Tok]>, rescan: bool) -> Vec<Cand> {
        let mut cands: Vec<Cand> = Vec::with_capacity(16);
        if text.is_empty() {
            return cands;
        }
        let ctx = structured::Ctx {
            keep_non_personal_ips: self.config.keep_non_personal_ips,
            user_name_only: self.config.file_path_mode == FilePathMode::UserNameOnly,
            url_credentials: self.config.url_credentials,
            enabled: self.enabled,
        };
        // One keyword walk serves both the structured detectors' context gates and the
        // secret filter's rule selection, whichever asks first.
        let keywords = std::cell::OnceCell::new();
        let keyword_hits = || *keywords.get_or_init(|| self.keyword_hits(text));
        structured::detect(text, &ctx, || keyword_hits().groups, &mut cands);
        if self.on(PiiType::ApiKey) {
            // the redactor's own re-scan (see `find_bytes`) closes secrets too
            for f in self
                .secrets
                .scan_selected(text, || keyword_hits().secret_rules)
            {
                // A URL password is reported as URL credentials by the structured pass.
                if f.rule == "url-password" {
                    continue;
                }
                cands.push(Cand::new(
                    f.start,
                    f.end,
                    PiiType::ApiKey,
                    f.rule,
                    if f.specific { 0.95 } else { 0.7 },
                    prio::API_KEY,
                ));
            }
        }
        if let Some(toks) = toks {
            if self.on(PiiType::Address) {
                address::detect(text, toks, &mut cands);
            }
            if self.on(PiiType::Person) {
                names::detect(text, toks, &self.known_names, &mut cands);
            }
        }
        if self.on(PiiType::Person) {
            cjk::detect(text, &mut cands);
        }
        if self.on(PiiType::Person) || self.on(PiiType::Address) {
            fields::detect(text, &mut cands);
        }
        if let Some(toks) = toks.filter(|_| self.config.tagger) {
            self.tag(text, toks, rescan, &mut cands);
        }
        if self.on(PiiType::Person) {
            fields::drop_everyday_signatures(text, &mut cands);
            let labels = fields::form_labels(text);
            if !labels.is_empty() {
                cands.retain(|c| {
                    c.ty != Some(PiiType::Person)
                        || !labels.iter().any(|&(s, e)| s <= c.start && c.end <= e)
                });
            }
        }
        // Drop unwanted types and weak spans before resolving, so that a disabled detector
        // never hides an enabled one.
        cands.retain(|c| match c.ty {
            None => true,
            Some(t) => {
                self.on(t)
                    && c.confidence >= self.config.min_confidence
                    && (self.allow.is_empty()
                        || !self.allow.contains(&text[c.start..c.end].to_lowercase()))
            }
        });
        resolve(text, cands)
    }
}

/// The typed candidates as reported spans, in code-point offsets of `text`.
fn spans_of(text: &str, cands: &[Cand]) -> Vec<PiiSpan> {
    let idx = CharIndex::new(text);
    cands
        .iter()
        .filter_map(|c| {
            c.ty.map(|t| PiiSpan {
                start: idx.char_of(c.start),
                end: idx.char_of(c.end),
                pii_type: t,
                detector: c.detector,
                confidence: c.confidence,
            })
        })
        .collect()
}

/// `text` with each typed candidate replaced by its sentinel (candidates sorted, disjoint).
fn sentinels_for(text: &str, cands: &[Cand]) -> crate::curate::Spliced {
    crate::curate::Spliced::new(
        text,
        cands
            .iter()
            .filter_map(|c| c.ty.map(|t| (c.start, c.end, t.sentinel()))),
    )
}

/// Greedy overlap resolution: priority, then length, then position.
fn resolve(text: &str, mut v: Vec<Cand>) -> Vec<Cand> {
    v.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then((b.end - b.start).cmp(&(a.end - a.start)))
            .then(a.start.cmp(&b.start))
    });
    // kept in place, in the order above (no second vector)
    let mut taken = KeptSpans::default();
    v.retain_mut(|c| {
        if c.end <= c.start {
            return false;
        }
        // A stronger span cutting into the tail of a truncatable one shortens it (so a second
        // pass over the redacted text finds nothing new). The cut is the start of the first
        // kept span overlapping this one.
        let cut = taken.first_overlap(c.start, c.end);
        if let Some(cut) = cut {
            if cut >= c.min_end && cut > c.start {
                c.end = cut;
                // do not end on the separator before the cut
                let b = text.as_bytes();
                while c.end > c.min_end
                    && matches!(b[c.end - 1], b' ' | b',' | b'\n' | b'\t' | b'.' | b'-')
                {
                    c.end -= 1;
                }
            } else {
                return false;
            }
            if c.end <= c.start {
                return false;
            }
        }
        taken.insert(c.start, c.end);
        true
    });
    v.retain(|c| c.ty.is_some());
    v.sort_by_key(|c| c.start);
    v
}

/// Counts from [`predict_jsonl`].
#[derive(Debug, Default)]
pub struct PredictStats {
    /// Records read and predicted.
    pub records: usize,
    /// Spans written.
    pub spans: usize,
    /// Bad lines (each names its line number); the remaining lines were still processed.
    pub errors: Vec<RedactError>,
}

#[derive(Serialize)]
struct OutSpan {
    start: usize,
    end: usize,
    #[serde(rename = "type")]
    ty: &'static str,
    score: f32,
}

#[derive(Serialize)]
struct OutRecord<'a> {
    id: &'a serde_json::Value,
    spans: Vec<OutSpan>,
}

/// Reads gold-format JSONL (fields `id`, `text`) and writes score_pii.py predictions
/// `{"id","spans":[{"start","end","type","score"}]}`. Bad lines are skipped and reported.
pub fn predict_jsonl(
    redactor: &Redactor,
    input: impl BufRead,
    mut output: impl Write,
) -> Result<PredictStats, RedactError> {
    let mut st = PredictStats::default();
    let mut errors = Vec::new();
    crate::curate::for_each_text_record(
        input,
        |rec| {
            let spans: Vec<OutSpan> = redactor
                .find(&rec.text)
                .into_iter()
                .map(|s| OutSpan {
                    start: s.start,
                    end: s.end,
                    ty: s.pii_type.label(),
                    score: s.confidence,
                })
                .collect();
            st.records += 1;
            st.spans += spans.len();
            serde_json::to_writer(&mut output, &OutRecord { id: &rec.id, spans })
                .map_err(std::io::Error::other)?;
            output.write_all(b"\n")
        },
        |line, reason| errors.push(RedactError::BadLine { line, reason }),
    )?;
    st.errors = errors;
    output.flush()?;
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Random candidates over a short text: overlapping, nested, truncatable, shields.
    fn cands() -> impl Strategy<Value = Vec<Cand>> {
        prop::collection::vec(
            (0usize..400, 0usize..12, 0u8..4, any::<bool>(), 0usize..12),
            0..120,
        )
        .prop_map(|raw| {
            raw.into_iter()
                .map(|(s, len, p, shield, keep)| {
                    let e = s + len;
                    let c = if shield {
                        Cand::shield(s, e, "shield", p * 10)
                    } else {
                        Cand::new(s, e, PiiType::Person, "test", 0.9, p * 10)
                    };
                    c.truncatable((s + 1 + keep).min(e.max(s + 1)))
                })
                .collect()
        })
    }

    /// [`resolve`] as it was written first: every kept span checked per candidate.
    fn resolve_by_scan(text: &str, mut v: Vec<Cand>) -> Vec<Cand> {
        v.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then((b.end - b.start).cmp(&(a.end - a.start)))
                .then(a.start.cmp(&b.start))
        });
        let mut kept: Vec<Cand> = Vec::new();
        for mut c in v {
            if c.end <= c.start {
                continue;
            }
            let cut = kept
                .iter()
                .filter(|k| k.start < c.end && c.start < k.end)
                .map(|k| k.start)
                .min();
            if let Some(cut) = cut {
                if cut >= c.min_end && cut > c.start {
                    c.end = cut;
                    let b = text.as_bytes();
                    while c.end > c.min_end
                        && matches!(b[c.end - 1], b' ' | b',' | b'\n' | b'\t' | b'.' | b'-')
                    {
                        c.end -= 1;
                    }
                } else {
                    continue;
                }
            }
            kept.push(c);
        }
        kept.retain(|c| c.ty.is_some());
        kept.sort_by_key(|c| c.start);
        kept
    }

    fn key(v: &[Cand]) -> Vec<(usize, usize, u8)> {
        v.iter().map(|c| (c.start, c.end, c.priority)).collect()
    }

    proptest! {
        #[test]
        fn resolve_equals_the_scan_over_every_kept_span(v in cands()) {
            let text = "ab, cd. ef-gh ij\tkl mn, op. qr-st uv wx, yz. ab-cd ef gh, ij. kl-mn op qr".repeat(6);
            let fast = resolve(&text, v.clone());
            let slow = resolve_by_scan(&text, v);
            prop_assert_eq!(key(&fast), key(&slow));
        }

        /// The shared keyword walk (stopping early) selects the same secret rules as the
        /// secret filter's own automaton and wakes exactly the structured groups one of whose
        /// keywords occurs (case-insensitively), with some secret rules disabled or none.
        #[test]
        fn one_keyword_walk_answers_both_gates(
            parts in prop::collection::vec(prop::sample::select(KEYWORD_PARTS), 0..24),
            disabled in prop::collection::vec(prop::sample::select(DISABLED), 0..3),
        ) {
            let text: String = parts.concat();
            let secrets = SecretConfig {
                disabled_rules: disabled.iter().map(|d| d.to_string()).collect(),
                ..SecretConfig::default()
            };
            let red = Redactor { secrets: SecretScanner::new(secrets).unwrap(), ..Redactor::new(RedactConfig::default()) };
            let hits = red.keyword_hits(&text);
            prop_assert_eq!(hits.secret_rules, red.secrets.keyword_hits(&text));
            let lower = text.to_ascii_lowercase();
            let groups = structured::KEYWORD_GROUPS
                .iter()
                .filter(|(_, ks)| ks.iter().any(|k| lower.contains(&k.to_ascii_lowercase())))
                .fold(0, |m, (g, _)| m | g);
            prop_assert_eq!(hits.groups, groups);
            // A redactor without API keys walks no secret keywords, and only its types' groups:
            // here birth dates, and home paths (whose shields every redactor keeps).
            let types = [PiiType::Email, PiiType::DateOfBirth];
            let narrow = Redactor::new(RedactConfig {
                types: types.to_vec(),
                ..RedactConfig::default()
            });
            let narrow_hits = narrow.keyword_hits(&text);
            prop_assert_eq!(narrow_hits.secret_rules, 0);
            let wanted = structured::KEYWORD_GROUPS
                .iter()
                .filter(|(_, ks)| ks.contains(&"born") || ks.contains(&"/home/"))
                .fold(0, |m, (g, _)| m | g);
            prop_assert_eq!(narrow_hits.groups, groups & wanted);
        }
    }

    /// Fragments that build texts full of (partial, overlapping, differently cased) keywords.
    const KEYWORD_PARTS: &[&str] = &[
        "pass", "word", "PASS", "token", "sk", "SK", "-ant-", "key", "KEY", "aws", "AKIA", "born",
        "BIRTH", "dob", "passport", "nie", "wallet", "btc", "/home/", "/Users/", "gh", "p_", "xox",
        "b-", " ", "=", ":", "né le", "Né Le", "eyJ", "hf_", "://", "a", "1",
    ];

    /// Secret rules a test may disable.
    const DISABLED: &[&str] = &[
        "twilio-api-key",
        "secret-assignment",
        "aws-access-key-id",
        "jwt",
    ];
}
