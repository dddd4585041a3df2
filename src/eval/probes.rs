//! The eval gate's fixed probe set (base text, QA, behaviour prompts, general probes), frozen per base, and the
//! personalisation probes drawn from the user's held-out curated data.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::general::{DEFAULT_GENERAL, GeneralFile, GeneralProbe};
use super::{EvalError, Result};
use crate::message::{ChatMessage, Sample, SampleContent};
use crate::train::data::is_held_out;

/// The probes hearth ships (general knowledge, no personal data).
pub const DEFAULT_PROBES: &str = include_str!("../../data/eval/probes.json");

/// A multiple-choice question, scored by which choice the model finds most likely.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QaProbe {
    pub question: String,
    pub choices: Vec<String>,
    /// Index of the right choice.
    pub answer: usize,
}

/// The probes every candidate for one base is measured on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSet {
    #[serde(default)]
    pub about: String,
    /// Held-out base-language text: its perplexity must not rise (forgetting, collapse).
    pub base_texts: Vec<String>,
    pub qa: Vec<QaProbe>,
    /// Prompts whose answers must stay valid JSON as often as before.
    pub json_prompts: Vec<String>,
    /// Prompts that must stay refused as often as before.
    pub refusal_prompts: Vec<String>,
    /// Prompts whose greedy answers are checked without a model (the `general` leg). Absent from a probe
    /// file: [`ProbeSet::frozen_for_base`] adds the shipped ones (`data/eval/general.json`).
    #[serde(default)]
    pub general: Vec<GeneralProbe>,
}

impl ProbeSet {
    /// Parses and checks a probe set; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<ProbeSet> {
        let set: ProbeSet = serde_json::from_str(text).map_err(|e| EvalError::Probes {
            path: origin.to_owned(),
            message: format!("line {} column {}: {e}", e.line(), e.column()),
        })?;
        for (i, q) in set.qa.iter().enumerate() {
            if q.answer >= q.choices.len() || q.choices.len() < 2 {
                return Err(EvalError::Probes {
                    path: origin.to_owned(),
                    message: format!("qa[{i}]: needs >= 2 choices and `answer` < their count"),
                });
            }
        }
        if let Some(dup) = duplicate_id(&set.general) {
            return Err(EvalError::Probes {
                path: origin.to_owned(),
                message: format!("general: id `{dup}` appears twice"),
            });
        }
        if set.base_texts.is_empty() {
            return Err(EvalError::Probes {
                path: origin.to_owned(),
                message: "base_texts: at least one text".into(),
            });
        }
        Ok(set)
    }

    /// The probe set for a base, frozen on first use: `dir/<base sha256>.json` is written once (atomically)
    /// from `source` (or the shipped set) and read back from then on, so every candidate over that base is
    /// compared on the same probes even if the source file changes later. A set without general probes gets
    /// the shipped ones, frozen the same way in `dir/<base sha256>.general.json` (so a base frozen before the
    /// general leg existed gains it once, then keeps it). The digest covers both files.
    pub fn frozen_for_base(
        dir: &Path,
        base_sha256: &str,
        source: Option<&Path>,
    ) -> Result<(ProbeSet, String)> {
        let frozen = dir.join(format!("{base_sha256}.json"));
        let io = |path: &Path, e: std::io::Error| EvalError::Io {
            path: path.display().to_string(),
            source: e,
        };
        if !frozen.exists() {
            let text = match source {
                Some(p) => std::fs::read_to_string(p).map_err(|e| io(p, e))?,
                None => DEFAULT_PROBES.to_owned(),
            };
            let origin = source.map_or_else(
                || "data/eval/probes.json".to_owned(),
                |p| p.display().to_string(),
            );
            ProbeSet::parse(&text, &origin)?;
            crate::files::atomic_write(&frozen, text.as_bytes()).map_err(|e| io(&frozen, e))?;
        }
        let text = std::fs::read_to_string(&frozen).map_err(|e| io(&frozen, e))?;
        let mut set = ProbeSet::parse(&text, &frozen.display().to_string())?;
        if !set.general.is_empty() {
            return Ok((set, crate::train::sha256_hex(text.as_bytes())));
        }
        let general = dir.join(format!("{base_sha256}.general.json"));
        if !general.exists() {
            parse_general(DEFAULT_GENERAL, "data/eval/general.json")?;
            crate::files::atomic_write(&general, DEFAULT_GENERAL.as_bytes())
                .map_err(|e| io(&general, e))?;
        }
        let general_text = std::fs::read_to_string(&general).map_err(|e| io(&general, e))?;
        set.general = parse_general(&general_text, &general.display().to_string())?;
        let digest = crate::train::sha256_hex(format!("{text}\n{general_text}").as_bytes());
        Ok((set, digest))
    }
}

/// The general probes of a file in `data/eval/general.json`'s format.
pub fn parse_general(text: &str, origin: &str) -> Result<Vec<GeneralProbe>> {
    let file: GeneralFile = serde_json::from_str(text).map_err(|e| EvalError::Probes {
        path: origin.to_owned(),
        message: format!("line {} column {}: {e}", e.line(), e.column()),
    })?;
    if let Some(dup) = duplicate_id(&file.probes) {
        return Err(EvalError::Probes {
            path: origin.to_owned(),
            message: format!("id `{dup}` appears twice"),
        });
    }
    Ok(file.probes)
}

/// Ids name what a candidate lost or gained, so they must be unique.
fn duplicate_id(probes: &[GeneralProbe]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    probes
        .iter()
        .map(|p| p.id.as_str())
        .find(|id| !seen.insert(*id))
}

/// A held-out prompt and the answer the user wanted.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PersonalProbe {
    pub prompt: Vec<ChatMessage>,
    pub answer: String,
}

/// The personalisation probes: held-out samples (the same split the trainer skips) that say what the user
/// wanted — an accepted answer, an edit, a thumbs-up, a positive score. Distinct, in a stable order, at most
/// `max`.
pub fn personal_probes(
    samples: &[Sample],
    holdout_fraction: f64,
    max: usize,
) -> Vec<PersonalProbe> {
    let mut probes: Vec<PersonalProbe> = samples
        .iter()
        .filter(|s| {
            s.origin == crate::message::Origin::Grounded && is_held_out(s, holdout_fraction)
        })
        .filter_map(|s| {
            let (prompt, answer) = match &s.content {
                SampleContent::Sft { prompt, response } => (prompt, response),
                SampleContent::Preference { prompt, chosen, .. } => (prompt, chosen),
                SampleContent::Unpaired {
                    prompt,
                    response,
                    desirable: true,
                } => (prompt, response),
                SampleContent::Scored {
                    prompt,
                    response,
                    score,
                } if *score > 0.0 => (prompt, response),
                _ => return None,
            };
            Some(PersonalProbe {
                prompt: prompt.clone(),
                answer: answer.clone(),
            })
        })
        .collect();
    probes.sort();
    probes.dedup();
    probes.truncate(max);
    probes
}
