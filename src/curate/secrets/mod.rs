//! Credential filter: finds API keys, tokens, private keys and passwords before text is
//! stored or trained on, so a leaked secret never reaches an adapter or a federation peer.
//!
//! One pass selects candidate rules: an Aho-Corasick automaton over each rule's literal
//! keywords (like gitleaks' keyword prefilter), then only the selected rules' regexes run and
//! their hits are validated (boundaries, entropy, placeholders, allow-list). Offsets returned
//! to callers are Unicode code points (end exclusive).

use std::io::{BufRead, Write};

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::{KeptSpans, SpanIndex, merge_rescan};

mod heuristics;
mod rules;

use heuristics::{
    entropy, is_placeholder, is_word_byte, key_block_end, looks_like_code, public_pem_blocks,
};
pub(crate) use rules::rule_keywords;
use rules::{BARE_RULE, COMPILED, Check, RULES, RuleDef, keyword_case_ok};

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
