//! Credential filter: finds API keys, tokens, private keys and passwords before text is
//! stored or trained on, so a leaked secret never reaches an adapter or a federation peer.
//!
//! One pass selects candidate rules: an Aho-Corasick automaton over each rule's literal
//! keywords (like gitleaks' keyword prefilter), then only the selected rules' regexes run and
//! their hits are validated (boundaries, entropy, placeholders, allow-list). Offsets returned
//! to callers are Unicode code points (end exclusive).

use std::io::{BufRead, Write};
use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use regex::Regex;
use serde::{Deserialize, Serialize};

use super::{KeptSpans, SpanIndex, merge_rescan};

/// What to do with a sample that holds a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SecretAction {
    /// Replace each secret with `<SECRET:rule>` and keep the sample.
    #[default]
    Redact,
    /// Drop the whole sample: `redact` returns an empty string when anything was found.
    Drop,
}

/// Scanner settings. Every field is read by [`SecretScanner`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SecretConfig {
    /// Redact in place or drop the sample.
    pub action: SecretAction,
    /// Shannon entropy (bits/char) a base64-alphabet token needs to count as a secret when no
    /// provider rule vouches for it (bare tokens and generic `key=` values).
    pub min_entropy_base64: f64,
    /// Same for hex tokens; only used for values of secret-named assignments, because bare hex
    /// in chat is nearly always a hash or id.
    pub min_entropy_hex: f64,
    /// Shortest bare high-entropy token worth flagging (shorter ones are ids and words).
    pub min_token_len: usize,
    /// Regexes; a finding whose secret text matches any of them is dropped.
    pub allow: Vec<String>,
    /// Rule names to switch off (see [`SecretScanner::rule_names`]).
    pub disabled_rules: Vec<String>,
    /// Scan for bare high-entropy tokens with no keyword context (more recall, more noise).
    pub bare_tokens: bool,
}

impl Default for SecretConfig {
    fn default() -> Self {
        Self {
            action: SecretAction::Redact,
            min_entropy_base64: 4.2,
            min_entropy_hex: 3.0,
            min_token_len: 32,
            allow: Vec::new(),
            disabled_rules: Vec::new(),
            bare_tokens: true,
        }
    }
}

/// A secret found in the text: code-point offsets and the rule that fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretFinding {
    /// Start, in code points.
    pub start: usize,
    /// End (exclusive), in code points.
    pub end: usize,
    /// Name of the rule, e.g. `github-pat`.
    pub rule: &'static str,
}

/// Errors from building a scanner or reading JSONL.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// An `allow` entry is not a valid regex.
    #[error("invalid allow pattern {pattern:?}: {source}")]
    BadAllowPattern {
        /// The offending pattern.
        pattern: String,
        /// Why it failed.
        source: regex::Error,
    },
    /// A config value is out of range.
    #[error("invalid secret config: {0}")]
    BadConfig(String),
    /// `disabled_rules` names a rule that does not exist (likely a typo).
    #[error("unknown rule {0:?} in disabled_rules")]
    UnknownRule(String),
    /// An input line was not a JSON object with a string `text`.
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

/// How a rule's hit is validated after the regex matched.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Fixed-prefix provider token: boundaries + entropy of the body + placeholders.
    Token,
    /// `name = value` where the name says secret: value must look random, not like code.
    Assignment,
    /// Password inside a URL's userinfo.
    UrlPassword,
    /// PEM/PGP/OpenSSH block: body must hold real base64.
    KeyBlock,
}

struct RuleDef {
    name: &'static str,
    /// Lowercase literals; the rule runs only if one occurs (case-insensitively).
    keywords: &'static [&'static str],
    /// Capture group 1, when present, is the secret; otherwise the whole match.
    pattern: &'static str,
    check: Check,
    /// Minimum entropy of the secret (bits/char) to reject `sk-xxxxxxxx…`-style placeholders.
    min_entropy: f64,
}

/// Rules written for hearth (patterns follow each provider's documented token shapes).
const RULES: &[RuleDef] = &[
    RuleDef {
        name: "aws-access-key-id",
        keywords: &["akia", "asia", "abia", "acca", "a3t"],
        pattern: r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}",
        check: Check::Token,
        min_entropy: 2.8,
    },
    RuleDef {
        name: "aws-secret-access-key",
        keywords: &["aws"],
        pattern: r#"(?i)aws[_.\-]?(?:secret[_.\-]?(?:access[_.\-]?)?key|sk)["']?\s*(?:=|:|:=|=>)\s*["']?([A-Za-z0-9/+]{40})"#,
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "gcp-api-key",
        keywords: &["aiza"],
        pattern: r"AIza[0-9A-Za-z_\-]{35}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "gcp-service-account-key-id",
        keywords: &["private_key_id"],
        pattern: r#""private_key_id"\s*:\s*"([a-f0-9]{40})""#,
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "gcp-oauth-client-secret",
        keywords: &["gocspx-"],
        pattern: r"GOCSPX-[A-Za-z0-9_\-]{28}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "azure-storage-key",
        keywords: &["accountkey="],
        pattern: r"(?i)AccountKey=([A-Za-z0-9+/]{86}==)",
        check: Check::Token,
        min_entropy: 4.0,
    },
    RuleDef {
        name: "azure-ad-client-secret",
        keywords: &["q~"],
        pattern: r"[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "github-pat",
        keywords: &["ghp_", "gho_", "ghu_", "ghs_", "ghr_"],
        pattern: r"gh[pousr]_[A-Za-z0-9]{36,255}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "github-fine-grained-pat",
        keywords: &["github_pat_"],
        pattern: r"github_pat_[A-Za-z0-9_]{82}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "gitlab-token",
        keywords: &["glpat-", "gldt-", "glrt-", "glptt-", "glsoat-", "gr1348941"],
        pattern: r"(?:glpat|gldt|glrt|glptt|glsoat)-[A-Za-z0-9_\-]{20,}|GR1348941[A-Za-z0-9_\-]{20,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "slack-token",
        keywords: &["xox"],
        pattern: r"xox[baprse]-[0-9A-Za-z\-]{10,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "slack-app-token",
        keywords: &["xapp-"],
        pattern: r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "slack-webhook",
        keywords: &["hooks.slack.com"],
        pattern: r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_\-]{30,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "stripe-key",
        keywords: &[
            "sk_live", "sk_test", "rk_live", "rk_test", "sk_prod", "rk_prod",
        ],
        pattern: r"(?:sk|rk)_(?:live|test|prod)_[0-9A-Za-z]{10,99}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "twilio-api-key",
        keywords: &["sk"],
        pattern: r"SK[0-9a-fA-F]{32}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "sendgrid-api-key",
        keywords: &["sg."],
        pattern: r"SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "mailgun-key",
        keywords: &["key-"],
        pattern: r"key-[0-9a-f]{32}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "anthropic-api-key",
        keywords: &["sk-ant-"],
        pattern: r"sk-ant-(?:api|admin|sid)\d{2}-[A-Za-z0-9_\-]{80,}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "openai-api-key",
        keywords: &["sk-"],
        pattern: r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_\-]{20,}|sk-[A-Za-z0-9]{32,}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "huggingface-token",
        keywords: &["hf_", "api_org_"],
        pattern: r"hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "npm-token",
        keywords: &["npm_"],
        pattern: r"npm_[A-Za-z0-9]{36}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "pypi-token",
        keywords: &["pypi-ageicHlwaS5vcmc"],
        pattern: r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{50,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "discord-bot-token",
        keywords: &["discord"],
        pattern: r"[MNO][A-Za-z\d_\-]{23,25}\.[A-Za-z\d_\-]{6}\.[A-Za-z\d_\-]{27,38}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "discord-webhook",
        keywords: &["/api/webhooks/"],
        pattern: r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]{60,}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "telegram-bot-token",
        keywords: &[":aa"],
        pattern: r"\d{8,10}:AA[A-Za-z0-9_\-]{33}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "shopify-token",
        keywords: &["shpat_", "shpss_", "shpca_", "shppa_"],
        pattern: r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "digitalocean-token",
        keywords: &["dop_v1_", "doo_v1_", "dor_v1_"],
        pattern: r"do[por]_v1_[a-f0-9]{64}",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "databricks-token",
        keywords: &["dapi"],
        pattern: r"dapi[a-f0-9]{32}(?:-\d)?",
        check: Check::Token,
        min_entropy: 3.0,
    },
    RuleDef {
        name: "jwt",
        keywords: &["eyj"],
        pattern: r"eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",
        check: Check::Token,
        min_entropy: 3.5,
    },
    RuleDef {
        name: "private-key",
        keywords: &["private key"],
        pattern: r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----",
        check: Check::KeyBlock,
        min_entropy: 0.0,
    },
    RuleDef {
        name: "url-password",
        keywords: &["://"],
        pattern: r"(?i)[a-z][a-z0-9+.\-]{1,20}://[^\s:/@<>]{1,64}:([^\s/@<>]{3,128})@[A-Za-z0-9.\-\[\]]",
        check: Check::UrlPassword,
        min_entropy: 0.0,
    },
    RuleDef {
        name: "secret-assignment",
        keywords: &[
            "pass",
            "pwd",
            "secret",
            "token",
            "key",
            "auth",
            "credential",
        ],
        pattern: r#"(?i)([a-z0-9_.\-]{0,40}(?:passw(?:or)?d|passwd|pwd|secret|token|api[_.\-]?key|apikey|access[_.\-]?key|auth[_.\-]?key|private[_.\-]?key|credentials?|client[_.\-]?secret))["']?[ \t]*(?:=|:|:=|=>|->)[ \t]*(?:"([^"\s<>]{8,200})"|'([^'\s<>]{8,200})'|([^\s'"<>;,()\[\]{}]{8,200}))"#,
        check: Check::Assignment,
        min_entropy: 0.0,
    },
];

/// Every rule's keywords with the rule's index (bits of [`SecretScanner::scan_selected`]'s
/// `rule_hits`), for a caller that searches them along with keywords of its own.
pub(crate) fn rule_keywords() -> impl Iterator<Item = (usize, &'static str)> {
    const _: () = assert!(RULES.len() <= 64, "rule hits are a u64 bit set");
    RULES
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.keywords.iter().map(move |k| (i, *k)))
}

/// Keywords are found case-insensitively; rules whose pattern is case-sensitive and contains
/// the keyword literally need it in that case, so that `ask`/`desk` do not wake the Twilio
/// rule (`SK…`). Exact: every match of these patterns contains the keyword in this case.
fn keyword_case_ok(rule: &str, kw: &[u8]) -> bool {
    match rule {
        "twilio-api-key" => kw == b"SK",
        "aws-access-key-id" => !kw.iter().any(u8::is_ascii_lowercase),
        "mailgun-key" => kw == b"key-",
        _ => true,
    }
}

/// Name of the bare high-entropy token rule (no keyword, no prefix).
const BARE_RULE: &str = "high-entropy-token";

struct Compiled {
    regexes: Vec<Regex>,
    /// Per rule, a variant with the long `{m,200}` value bounds opened to `{m,}` (a much
    /// smaller NFA, so capture search is far cheaper); used while no captured value exceeds
    /// 200 bytes, which makes its matches identical to the rule's (see `scan_once`).
    fast: Vec<Option<Regex>>,
    /// Per rule with long counted repetitions, the pattern with every upper bound dropped
    /// (`{0,40}` -> `{0,}`): it matches wherever the rule does (a superset), and its lazy DFA
    /// stays small, so "no match here" is cheap; the rule itself runs only after a yes.
    probe: Vec<Option<Regex>>,
    ac: AhoCorasick,
    /// AC pattern index -> rule index.
    kw_rule: Vec<usize>,
}

static COMPILED: LazyLock<Compiled> = LazyLock::new(|| {
    let regexes = RULES
        .iter()
        // Patterns are constants checked by the unit tests; failure is a programming error.
        .map(|r| Regex::new(r.pattern).expect("constant secret rule regex"))
        .collect();
    let mut kws = Vec::new();
    let mut kw_rule = Vec::new();
    for (i, r) in RULES.iter().enumerate() {
        for k in r.keywords {
            kws.push(k.to_ascii_lowercase());
            kw_rule.push(i);
        }
    }
    let ac = AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::Standard)
        .build(&kws)
        // Constant keyword list; building cannot fail for these few short literals.
        .expect("constant keyword automaton");
    let fast = RULES
        .iter()
        .map(|r| {
            r.pattern.contains(",200}").then(|| {
                Regex::new(&r.pattern.replace(",200}", ",}")).expect("constant secret rule regex")
            })
        })
        .collect();
    let bounded = regex::Regex::new(r"\{(\d+),(\d+)\}").expect("constant regex");
    let probe = RULES
        .iter()
        .map(|r| {
            let wide = bounded.captures_iter(r.pattern).any(|c| {
                let n = |k: usize| c[k].parse::<u32>().unwrap_or(0);
                n(2).saturating_sub(n(1)) >= 16
            });
            wide.then(|| {
                let open = bounded.replace_all(r.pattern, "{$1,}");
                Regex::new(&open).expect("constant secret rule regex")
            })
        })
        .collect();
    Compiled {
        regexes,
        fast,
        probe,
        ac,
        kw_rule,
    }
});

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

/// Credential scanner; cheap to share across threads.
pub struct SecretScanner {
    config: SecretConfig,
    enabled: Vec<bool>,
    /// How many entries of `enabled` are true (the keyword scan stops once all have hit).
    enabled_rules: usize,
    allow: Vec<Regex>,
}

/// Internal hit, byte offsets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawFinding {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) rule: &'static str,
    /// Generic rules lose overlaps to provider rules.
    pub(crate) specific: bool,
}

impl SecretScanner {
    /// Builds a scanner; fails on bad allow regexes, unknown rule names or bad thresholds.
    pub fn new(config: SecretConfig) -> Result<Self, SecretError> {
        let finite = |x: f64| x.is_finite() && (0.0..=8.0).contains(&x);
        if !finite(config.min_entropy_base64) || !finite(config.min_entropy_hex) {
            return Err(SecretError::BadConfig(
                "entropy thresholds must be within 0..=8 bits/char".into(),
            ));
        }
        if config.min_token_len < 8 {
            return Err(SecretError::BadConfig("min_token_len must be >= 8".into()));
        }
        let mut enabled = vec![true; RULES.len()];
        for d in &config.disabled_rules {
            match RULES.iter().position(|r| r.name == d) {
                Some(i) => enabled[i] = false,
                None if d == BARE_RULE => {}
                None => return Err(SecretError::UnknownRule(d.clone())),
            }
        }
        let allow = config
            .allow
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|source| SecretError::BadAllowPattern {
                    pattern: p.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            config,
            enabled_rules: enabled.iter().filter(|e| **e).count(),
            enabled,
            allow,
        })
    }

    /// All rule names, including the bare-token rule.
    pub fn rule_names() -> Vec<&'static str> {
        RULES.iter().map(|r| r.name).chain([BARE_RULE]).collect()
    }

    /// The config this scanner was built with.
    pub fn config(&self) -> &SecretConfig {
        &self.config
    }

    /// Finds secrets; offsets are code points, sorted, non-overlapping.
    pub fn scan(&self, text: &str) -> Vec<SecretFinding> {
        let raw = self.scan_bytes(text);
        let idx = CharIndex::new(text);
        raw.into_iter()
            .map(|f| SecretFinding {
                start: idx.char_of(f.start),
                end: idx.char_of(f.end),
                rule: f.rule,
            })
            .collect()
    }

    /// Redacts each secret as `<SECRET:rule>`; with [`SecretAction::Drop`] returns an empty
    /// string whenever anything was found.
    pub fn redact(&self, text: &str) -> (String, Vec<SecretFinding>) {
        let raw = self.scan_bytes(text);
        let idx = CharIndex::new(text);
        let findings: Vec<SecretFinding> = raw
            .iter()
            .map(|f| SecretFinding {
                start: idx.char_of(f.start),
                end: idx.char_of(f.end),
                rule: f.rule,
            })
            .collect();
        if raw.is_empty() {
            return (text.to_string(), findings);
        }
        if self.config.action == SecretAction::Drop {
            return (String::new(), findings);
        }
        let mut out = String::with_capacity(text.len());
        let mut pos = 0;
        for f in &raw {
            out.push_str(&text[pos..f.start]);
            out.push_str("<SECRET:");
            out.push_str(f.rule);
            out.push('>');
            pos = f.end;
        }
        out.push_str(&text[pos..]);
        (out, findings)
    }

    /// Byte-offset scan used by `scan`, `redact` and the PII redactor. Closed under
    /// re-redaction: the redacted text is scanned again and new finds (whose context changed
    /// when a neighbour became a sentinel) are mapped back, so `redact` is idempotent.
    pub(crate) fn scan_bytes(&self, text: &str) -> Vec<RawFinding> {
        let mut found = self.scan_once(text);
        for _ in 0..4 {
            if found.is_empty() {
                break;
            }
            let spliced = crate::curate::Spliced::new(
                text,
                found
                    .iter()
                    .map(|f| (f.start, f.end, format!("<SECRET:{}>", f.rule))),
            );
            let new = self.scan_once(&spliced.text);
            if new.is_empty() {
                break;
            }
            let back = |r: usize, is_end: bool| spliced.original(r, is_end);
            let new = new.into_iter().map(|n| RawFinding {
                start: back(n.start, false),
                end: back(n.end, true),
                ..n
            });
            merge_rescan(&mut found, new.collect(), |f| (f.start, f.end));
        }
        found
    }

    /// One scan without the re-scan: for callers that re-scan their own redacted text (the
    /// PII redactor splices its sentinels and scans again until nothing new turns up).
    pub(crate) fn scan_once(&self, text: &str) -> Vec<RawFinding> {
        self.scan_selected(text, || self.keyword_hits(text))
    }

    /// Bit per rule (by index) whose keyword occurs in `text` and selects it.
    pub(crate) fn keyword_hits(&self, text: &str) -> u64 {
        let c = &*COMPILED;
        let mut hit = 0u64;
        let mut left = self.enabled_rules;
        let b = text.as_bytes();
        for m in c.ac.find_overlapping_iter(text) {
            let r = c.kw_rule[m.pattern().as_usize()];
            if hit & 1 << r == 0 && self.keyword_selects(r, &b[m.start()..m.end()]) {
                hit |= 1 << r;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        hit
    }

    /// Whether an occurrence `matched` of one of rule `rule`'s keywords selects the rule.
    pub(crate) fn keyword_selects(&self, rule: usize, matched: &[u8]) -> bool {
        self.enabled[rule] && keyword_case_ok(RULES[rule].name, matched)
    }

    /// How many rules are enabled (a keyword scan may stop once all are selected).
    pub(crate) fn enabled_rules(&self) -> usize {
        self.enabled_rules
    }

    /// [`Self::scan_once`] with the rules to run given as a bit per rule index: `rule_hits`
    /// is asked only for a text long enough to hold a secret.
    pub(crate) fn scan_selected(
        &self,
        text: &str,
        rule_hits: impl FnOnce() -> u64,
    ) -> Vec<RawFinding> {
        let mut out = Vec::new();
        if text.len() < 8 {
            return out;
        }
        let c = &*COMPILED;
        // bit per rule whose keyword occurs (in rule order, as findings are pushed)
        let mut hit = rule_hits();
        let b = text.as_bytes();
        while hit != 0 {
            let i = hit.trailing_zeros() as usize;
            hit &= hit - 1;
            let rule = &RULES[i];
            // Bytes every match of the rule contains: a cheap no before the regex (the
            // assignment rule's lazy DFA is large and costly to warm on short records).
            let lacks_required_byte = match rule.check {
                Check::Assignment => !(b.contains(&b'=') || b.contains(&b':')),
                Check::UrlPassword => !b.contains(&b'@'),
                _ => false,
            };
            if lacks_required_byte {
                continue;
            }
            let re = &c.regexes[i];
            // The lazy DFA answers "no match" fast; capture search (a backtracker on short
            // texts) runs only when there is something to capture.
            if !c.probe[i].as_ref().unwrap_or(re).is_match(text) {
                continue;
            }
            // Every path of the bounded regex is a path of the open one, so while no group
            // is longer than the bound both pick the same matches and groups; otherwise the
            // bounded regex itself runs.
            let fast: Option<Vec<regex::Captures>> = c.fast[i]
                .as_ref()
                .map(|f| f.captures_iter(text).collect::<Vec<_>>())
                .filter(|all| {
                    !all.iter()
                        .any(|cp| cp.iter().skip(1).flatten().any(|g| g.len() > 200))
                });
            let all = fast.unwrap_or_else(|| re.captures_iter(text).collect());
            for caps in all {
                // The secret is the first participating capture group after 0 (or the match).
                // unquoted assignment values (group 4) are held to a stricter standard: in code
                // they are usually identifiers (`token = next_token`)
                let unquoted = rule.check == Check::Assignment && caps.get(4).is_some();
                let m = match caps.iter().skip(1).flatten().last() {
                    Some(g) if rule.check == Check::Assignment => g,
                    Some(g) if caps.len() == 2 => g,
                    _ => match caps.get(0) {
                        Some(m) => m,
                        None => continue,
                    },
                };
                let whole = caps.get(0).map_or(m.start(), |w| w.start());
                let (ms, me) = if rule.check == Check::KeyBlock {
                    (m.start(), key_block_end(text, m.end()))
                } else {
                    (m.start(), m.end())
                };
                if unquoted && looks_like_code(&text[ms..me]) {
                    continue;
                }
                if self.validate(text, rule, whole, ms, me) {
                    out.push(RawFinding {
                        start: ms,
                        end: me,
                        rule: rule.name,
                        specific: matches!(rule.check, Check::Token | Check::KeyBlock),
                    });
                }
            }
        }
        if self.config.bare_tokens && !self.config.disabled_rules.iter().any(|d| d == BARE_RULE) {
            let before = out.len();
            self.bare_tokens(text, &mut out);
            if out.len() > before && text.contains("-----BEGIN ") {
                let public = SpanIndex::new(public_pem_blocks(text));
                let mut k = before;
                while k < out.len() {
                    let f = &out[k];
                    if public.contains(f.start, f.end) {
                        out.swap_remove(k);
                    } else {
                        k += 1;
                    }
                }
            }
        }
        // Our own `<SECRET:rule>` sentinels look like `secret: value`; never flag them.
        if text.as_bytes().contains(&b'<') && text.contains("<SECRET:") {
            let sentinels = SpanIndex::new(
                text.match_indices("<SECRET:")
                    .filter_map(|(i, _)| text[i..].find('>').map(|e| (i, i + e + 1)))
                    .collect(),
            );
            out.retain(|f| !sentinels.overlaps(f.start, f.end));
        }
        resolve(out)
    }

    fn allowed(&self, secret: &str) -> bool {
        self.allow.iter().any(|a| a.is_match(secret))
    }

    fn validate(&self, text: &str, rule: &RuleDef, whole: usize, s: usize, e: usize) -> bool {
        let b = text.as_bytes();
        let secret = &text[s..e];
        if self.allowed(secret) || is_placeholder(secret) {
            return false;
        }
        match rule.check {
            Check::Token => {
                // Keys glued to other word characters are part of something else
                // (identifiers, longer hashes); trailing . , " ) ] are fine.
                let before = if whole < s { whole } else { s };
                if before > 0 && is_word_byte(b[before - 1]) && rule.name != "aws-secret-access-key"
                {
                    return false;
                }
                if e < b.len() && is_word_byte(b[e]) {
                    return false;
                }
                entropy(secret.as_bytes()) >= rule.min_entropy
            }
            Check::KeyBlock => {
                // Real key blocks carry long base64 lines; docs show `...` or nothing.
                let body_b64 = secret
                    .bytes()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
                    .count();
                body_b64 >= 64 && !secret.contains("...")
            }
            Check::UrlPassword => {
                let v = secret;
                // RFC 2606 hosts are documentation (`ftp://rms:secret123@example.com`) unless
                // the password itself looks generated
                let host = text[e..]
                    .strip_prefix('@')
                    .unwrap_or("")
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'))
                    .next()
                    .unwrap_or("")
                    .to_ascii_lowercase();
                let doc_host = ["example.com", "example.org", "example.net"]
                    .iter()
                    .any(|d| host == *d || host.ends_with(&format!(".{d}")))
                    || [".example", ".test", ".invalid"]
                        .iter()
                        .any(|t| host.ends_with(t));
                !(doc_host && entropy(v.as_bytes()) < 3.2
                    || v.starts_with('$')
                    || v.starts_with('{')
                    || v.starts_with('%')
                    || v.starts_with('<')
                    || v.chars().all(|c| c == '*' || c == 'x' || c == 'X')
                    || matches!(
                        v.to_ascii_lowercase().as_str(),
                        "password"
                            | "pass"
                            | "passwd"
                            | "pwd"
                            | "secret"
                            | "token"
                            | "pw"
                            | "foo"
                            | "bar"
                            | "baz"
                    ))
            }
            Check::Assignment => self.assignment_value_ok(secret),
        }
    }

    /// A `password = X` value counts only if X looks random, not like code or prose.
    fn assignment_value_ok(&self, v: &str) -> bool {
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
    fn bare_tokens(&self, text: &str, out: &mut Vec<RawFinding>) {
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
fn public_pem_blocks(text: &str) -> Vec<(usize, usize)> {
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
fn key_block_end(text: &str, from: usize) -> usize {
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
fn looks_like_code(v: &str) -> bool {
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
    let lex = &super::redact::english_words();
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

fn is_word_byte(c: u8) -> bool {
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
fn is_placeholder(s: &str) -> bool {
    PLACEHOLDER_AC.is_match(s)
}

/// Shannon entropy in bits per byte.
pub(crate) fn entropy(b: &[u8]) -> f64 {
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

/// Sorts and removes overlaps: provider-specific rules beat generic ones, then longer wins.
fn resolve(mut v: Vec<RawFinding>) -> Vec<RawFinding> {
    v.sort_by(|a, b| {
        b.specific
            .cmp(&a.specific)
            .then((b.end - b.start).cmp(&(a.end - a.start)))
            .then(a.start.cmp(&b.start))
    });
    let mut kept: Vec<RawFinding> = Vec::with_capacity(v.len());
    let mut taken = KeptSpans::default();
    for f in v {
        if taken.first_overlap(f.start, f.end).is_none() {
            taken.insert(f.start, f.end);
            kept.push(f);
        }
    }
    kept.sort_by_key(|f| f.start);
    kept
}

/// Maps byte offsets to code-point offsets; free for ASCII text.
pub(crate) struct CharIndex {
    /// Byte offset of each char start; empty when the text is ASCII.
    starts: Vec<usize>,
}

impl CharIndex {
    pub(crate) fn new(text: &str) -> Self {
        if text.is_ascii() {
            Self { starts: Vec::new() }
        } else {
            Self {
                starts: text.char_indices().map(|(i, _)| i).collect(),
            }
        }
    }

    /// Code-point offset of a byte offset that lies on a char boundary (or the end).
    pub(crate) fn char_of(&self, byte: usize) -> usize {
        if self.starts.is_empty() {
            byte
        } else {
            self.starts.partition_point(|&s| s < byte)
        }
    }
}

/// Counts from [`findings_jsonl`].
#[derive(Debug, Default)]
pub struct ScanStats {
    /// Records read.
    pub records: usize,
    /// Findings written.
    pub findings: usize,
    /// Records with at least one finding.
    pub records_flagged: usize,
    /// Lines that could not be used (each names its line); the others were still processed.
    pub errors: Vec<SecretError>,
}

#[derive(Serialize)]
struct OutFinding<'a> {
    id: &'a serde_json::Value,
    secret: &'a str,
    rule: &'a str,
}

/// Reads gold-format JSONL (`id`, `text`) and writes one `{"id","secret","rule"}` line per
/// finding (the score_secrets.py format). Bad lines are skipped and reported in `errors`.
pub fn findings_jsonl(
    scanner: &SecretScanner,
    input: impl BufRead,
    mut output: impl Write,
) -> Result<ScanStats, SecretError> {
    let mut st = ScanStats::default();
    let mut errors = Vec::new();
    crate::curate::for_each_text_record(
        input,
        |rec| {
            st.records += 1;
            let raw = scanner.scan_bytes(&rec.text);
            if !raw.is_empty() {
                st.records_flagged += 1;
            }
            for f in raw {
                let o = OutFinding {
                    id: &rec.id,
                    secret: &rec.text[f.start..f.end],
                    rule: f.rule,
                };
                serde_json::to_writer(&mut output, &o).map_err(std::io::Error::other)?;
                output.write_all(b"\n")?;
                st.findings += 1;
            }
            Ok(())
        },
        |line, reason| errors.push(SecretError::BadLine { line, reason }),
    )?;
    st.errors = errors;
    output.flush()?;
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_compile_and_have_keywords() {
        assert_eq!(COMPILED.regexes.len(), RULES.len());
        // the assignment and URL rules get a probe (long bounds), fixed-length keys do not
        let probed = |name: &str| {
            let i = RULES.iter().position(|r| r.name == name);
            i.is_some_and(|i| COMPILED.probe[i].is_some())
        };
        assert!(probed("secret-assignment") && probed("url-password"));
        assert!(!probed("aws-access-key-id"));
        // built at run time so that the source itself holds no credential-shaped literal
        let text = format!("db_password = \"{0}{0}\" and ftp://u:{0}@h.io", "hunter2x");
        for (i, re) in COMPILED.regexes.iter().enumerate() {
            if re.is_match(&text) {
                assert!(COMPILED.probe[i].as_ref().is_none_or(|p| p.is_match(&text)));
            }
        }
        assert!(RULES.iter().all(|r| !r.keywords.is_empty()));
    }

    #[test]
    fn entropy_bounds() {
        assert_eq!(entropy(b"aaaa"), 0.0);
        assert!((entropy(b"ab") - 1.0).abs() < 1e-9);
    }

    /// [`resolve`] as first written: each finding checked against every kept one.
    fn resolve_by_scan(mut v: Vec<RawFinding>) -> Vec<RawFinding> {
        v.sort_by(|a, b| {
            b.specific
                .cmp(&a.specific)
                .then((b.end - b.start).cmp(&(a.end - a.start)))
                .then(a.start.cmp(&b.start))
        });
        let mut kept: Vec<RawFinding> = Vec::new();
        for f in v {
            if !kept.iter().any(|k| k.start < f.end && f.start < k.end) {
                kept.push(f);
            }
        }
        kept.sort_by_key(|f| f.start);
        kept
    }

    proptest::proptest! {
        /// Past `INDEX_KEPT_FROM` kept findings too, and with empty findings among them.
        #[test]
        fn resolve_equals_the_scan_over_every_kept_finding(
            raw in proptest::collection::vec((0usize..600, 0usize..8, proptest::bool::ANY), 0..200),
        ) {
            let v: Vec<RawFinding> = raw
                .into_iter()
                .map(|(start, len, specific)| RawFinding { start, end: start + len, rule: "r", specific })
                .collect();
            let key = |v: Vec<RawFinding>| -> Vec<(usize, usize, bool)> {
                v.into_iter().map(|f| (f.start, f.end, f.specific)).collect()
            };
            proptest::prop_assert_eq!(key(resolve(v.clone())), key(resolve_by_scan(v)));
        }
    }
}
