//! Safety guard for candidate training samples, speaking the Qwen3Guard verdict structure
//! (`shared/specs/guard-format.md`): a severity and categories per side, plus refusal for the
//! response side.
//!
//! Why the structure is fixed: a user may point the guard actor at a real Qwen3Guard model (the
//! [`ModelGuard`] backend) or use the small [`BuiltinGuard`]; [`GuardPolicy::decide`] treats both
//! the same way. The generative model answers in lines such as `Safety: Unsafe\nCategories: Violent`,
//! read by [`parse_verdict`].
//!
//! PII here is a whole-turn label, not spans: span redaction is the redactor's job. A text whose
//! personal values were all replaced by sentinels (`Email <PERSON> at <EMAIL>`) is *not* PII —
//! nothing personal remains — but free-text disclosures (health, debts, where someone lives)
//! and values the redactor missed are.

mod builtin;
pub mod data;
pub mod embed;
mod model;
mod policy;
pub mod probe;
mod sample;

pub use builtin::{BuiltinGuard, CategoryScores};
pub use model::{ModelGuard, moderation_prompt};
pub use policy::{ControversialAction, GuardDecision, GuardPolicy, GuardReason};
pub use probe::{ProbeGuard, ProbeHead};
pub use sample::{GuardBackendKind, Judgement, judge_sample};

use serde::{Deserialize, Serialize};

/// Qwen3Guard severity levels. Their evaluation counts `Controversial` as unsafe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Severity {
    Safe,
    Controversial,
    Unsafe,
}

/// The nine Qwen3Guard categories (variant names are RON-friendly; [`Category::name`] gives the
/// canonical text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Category {
    Violent,
    NonViolentIllegalActs,
    SexualContent,
    Pii,
    SuicideSelfHarm,
    UnethicalActs,
    PoliticallySensitive,
    CopyrightViolation,
    /// Prompts only.
    Jailbreak,
}

impl Category {
    /// All categories in the order of the generative format's list.
    pub const ALL: [Category; 9] = [
        Category::Violent,
        Category::NonViolentIllegalActs,
        Category::SexualContent,
        Category::Pii,
        Category::SuicideSelfHarm,
        Category::UnethicalActs,
        Category::PoliticallySensitive,
        Category::CopyrightViolation,
        Category::Jailbreak,
    ];

    /// Canonical name as Qwen3Guard prints it.
    pub fn name(self) -> &'static str {
        match self {
            Category::Violent => "Violent",
            Category::NonViolentIllegalActs => "Non-violent Illegal Acts",
            Category::SexualContent => "Sexual Content or Sexual Acts",
            Category::Pii => "PII",
            Category::SuicideSelfHarm => "Suicide & Self-Harm",
            Category::UnethicalActs => "Unethical Acts",
            Category::PoliticallySensitive => "Politically Sensitive Topics",
            Category::CopyrightViolation => "Copyright Violation",
            Category::Jailbreak => "Jailbreak",
        }
    }

    /// Position in [`Category::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which turn of a sample a verdict is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Side {
    Prompt,
    Response,
}

/// Verdict on one side of a sample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub severity: Severity,
    pub categories: Vec<Category>,
    /// Whether the response refused; `None` for prompts or when the backend did not say.
    pub refusal: Option<bool>,
}

impl Verdict {
    pub fn safe() -> Self {
        Self {
            severity: Severity::Safe,
            categories: Vec::new(),
            refusal: None,
        }
    }

    /// Canonical generative format, newline-joined: `Safety: …`, `Categories: …` (`None` when
    /// empty, comma-separated otherwise), and `Refusal: Yes|No` when known.
    pub fn to_lines(&self) -> String {
        let sev = match self.severity {
            Severity::Safe => "Safe",
            Severity::Controversial => "Controversial",
            Severity::Unsafe => "Unsafe",
        };
        let cats = if self.categories.is_empty() {
            "None".to_string()
        } else {
            self.categories
                .iter()
                .map(|c| c.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut s = format!("Safety: {sev}\nCategories: {cats}");
        if let Some(r) = self.refusal {
            s.push_str(if r { "\nRefusal: Yes" } else { "\nRefusal: No" });
        }
        s
    }
}

/// Verdicts for both sides of a (prompt, response) sample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleVerdict {
    pub prompt: Verdict,
    pub response: Verdict,
}

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("guard output has no `Safety:` line: {0:?}")]
    MissingSafety(String),
    #[error("guard output has an unknown severity {0:?} (expected Safe, Unsafe or Controversial)")]
    BadSeverity(String),
    #[error("guard output has an unknown refusal value {0:?} (expected Yes or No)")]
    BadRefusal(String),
    #[error("guard output has an unknown category {0:?}")]
    UnknownCategory(String),
    #[error("guard output repeats the {0} field with a different value")]
    Conflict(&'static str),
    #[error("guard training data: {0}")]
    Data(String),
    #[error("invalid guard policy: {0}")]
    InvalidPolicy(String),
    #[error("guard model: {0}")]
    Model(String),
    #[error("guard probe file {file}: {source}")]
    ProbeFile {
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "the guard probe was trained on {trained} (sha256 {expected}), but the base at {path} has sha256 \
         {found}: a probe reads one base's representation only; use `backend: Builtin`, point the guard's \
         `model` at that base, or retrain the probe (examples/guard_probe.rs) on this one"
    )]
    WrongBase {
        path: String,
        found: String,
        trained: String,
        expected: String,
    },
    #[error("guard probe does not fit its base: {0}")]
    InvalidProbe(String),
}

/// A guard implementation. `Send + Sync` so one instance can serve several actor threads.
pub trait GuardBackend: Send + Sync {
    fn classify(&self, prompt: &str, response: &str) -> Result<SampleVerdict, GuardError>;
    fn name(&self) -> &'static str;
}

/// Category names as they may appear in generative output, longest first so that
/// `Sexual Content or Sexual Acts` is not read as the shortened `Sexual Content` plus junk.
const NAMES: [(&str, Category); 11] = [
    ("Sexual Content or Sexual Acts", Category::SexualContent),
    (
        "Politically Sensitive Topics",
        Category::PoliticallySensitive,
    ),
    ("Non-violent Illegal Acts", Category::NonViolentIllegalActs),
    ("Suicide & Self-Harm", Category::SuicideSelfHarm),
    ("Politically Sensitive", Category::PoliticallySensitive),
    ("Copyright Violation", Category::CopyrightViolation),
    ("Unethical Acts", Category::UnethicalActs),
    ("Sexual Content", Category::SexualContent),
    ("Jailbreak", Category::Jailbreak),
    ("Violent", Category::Violent),
    ("PII", Category::Pii),
];

/// Parses generative guard output (`Safety: …`, `Categories: …`, `Refusal: …`), with fields
/// joined by newlines or by `; ` (the design paper's form). Keys and values are matched
/// case-insensitively; lines that are not one of the three fields are ignored (models sometimes
/// add chatter), but an unknown severity, refusal value or category name is an error, because
/// guessing would silently weaken the gate.
pub fn parse_verdict(text: &str) -> Result<Verdict, GuardError> {
    let mut severity: Option<Severity> = None;
    let mut categories: Vec<Category> = Vec::new();
    let mut seen_categories = false;
    let mut refusal: Option<bool> = None;
    for field in text.split(['\n', ';']) {
        let field = field.trim();
        let Some((key, value)) = field.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim().to_ascii_lowercase().as_str() {
            "safety" => {
                let s = match value.to_ascii_lowercase().as_str() {
                    "safe" => Severity::Safe,
                    "unsafe" => Severity::Unsafe,
                    "controversial" => Severity::Controversial,
                    _ => return Err(GuardError::BadSeverity(value.to_string())),
                };
                if severity.is_some_and(|old| old != s) {
                    return Err(GuardError::Conflict("Safety"));
                }
                severity = Some(s);
            }
            "refusal" => {
                let r = match value.to_ascii_lowercase().as_str() {
                    "yes" => true,
                    "no" => false,
                    _ => return Err(GuardError::BadRefusal(value.to_string())),
                };
                if refusal.is_some_and(|old| old != r) {
                    return Err(GuardError::Conflict("Refusal"));
                }
                refusal = Some(r);
            }
            "categories" | "category" => {
                let cats = parse_categories(value)?;
                if seen_categories && cats != categories {
                    return Err(GuardError::Conflict("Categories"));
                }
                seen_categories = true;
                categories = cats;
            }
            _ => {}
        }
    }
    let severity = severity.ok_or_else(|| GuardError::MissingSafety(text.to_string()))?;
    Ok(Verdict {
        severity,
        categories,
        refusal,
    })
}

/// Reads a comma- (or `and`-) separated list of category names, longest match first.
fn parse_categories(value: &str) -> Result<Vec<Category>, GuardError> {
    let mut out: Vec<Category> = Vec::new();
    let mut rest = value.trim();
    while !rest.is_empty() {
        rest = rest.trim_start_matches([',', ' ', '\t']);
        if rest.is_empty() {
            break;
        }
        if let Some(r) = strip_prefix_ci(rest, "and ") {
            rest = r;
            continue;
        }
        if let Some(r) = strip_prefix_ci(rest, "None")
            && (r.is_empty() || r.starts_with([',', ' ']))
        {
            rest = r;
            continue;
        }
        let mut matched = false;
        for (name, cat) in NAMES {
            if let Some(r) = strip_prefix_ci(rest, name)
                && (r.is_empty() || r.starts_with([',', ' ', '.']))
            {
                if !out.contains(&cat) {
                    out.push(cat);
                }
                rest = r.trim_start_matches('.');
                matched = true;
                break;
            }
        }
        if !matched {
            let bad = rest.split(',').next().unwrap_or(rest).trim();
            return Err(GuardError::UnknownCategory(bad.to_string()));
        }
    }
    Ok(out)
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}
