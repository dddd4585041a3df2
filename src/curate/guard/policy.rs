//! What the guard actor does with a verdict (graph parameters).

use serde::{Deserialize, Serialize};

use super::{Category, GuardError, SampleVerdict, Severity, Side, Verdict};

/// What to do with a `Controversial` verdict, or an `Unsafe` one outside `drop_categories`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControversialAction {
    Drop,
    /// Keep aside for the user to review instead of training on it.
    Quarantine,
    Admit,
}

/// Guard policy. Unknown fields are rejected so a typo in a graph file does not silently weaken
/// the gate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardPolicy {
    /// `Unsafe` in any of these categories drops the sample (default: all nine).
    pub drop_categories: Vec<Category>,
    /// Action for `Controversial` verdicts and for `Unsafe` in other categories.
    pub controversial: ControversialAction,
    /// Score at or above which a scoring backend (the builtin guard) calls a category `Unsafe`;
    /// generative backends decide severity themselves and ignore it.
    pub threshold: f32,
    /// Width of the band below `threshold` that scoring backends call `Controversial`.
    pub controversial_band: f32,
    /// Whether to judge the prompt side (off: only the response decides).
    pub check_prompt: bool,
    /// Whether to judge the response side.
    pub check_response: bool,
}

impl Default for GuardPolicy {
    fn default() -> Self {
        Self {
            drop_categories: Category::ALL.to_vec(),
            controversial: ControversialAction::Quarantine,
            // Drop only on high confidence; the wide band below sends doubtful prompts to a
            // person instead of silently out of the training set.
            threshold: 0.8,
            controversial_band: 0.6,
            check_prompt: true,
            check_response: true,
        }
    }
}

/// Why a sample was not admitted: the side, its severity and the categories behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardReason {
    pub side: Side,
    pub severity: Severity,
    pub categories: Vec<Category>,
}

impl std::fmt::Display for GuardReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = match self.side {
            Side::Prompt => "prompt",
            Side::Response => "response",
        };
        let cats: Vec<&str> = self.categories.iter().map(|c| c.name()).collect();
        let cats = if cats.is_empty() {
            "no category".to_string()
        } else {
            cats.join(", ")
        };
        write!(f, "{side}: {:?} ({cats})", self.severity)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GuardDecision {
    Admit,
    Drop { reason: GuardReason },
    Quarantine { reason: GuardReason },
}

impl GuardPolicy {
    pub fn validate(&self) -> Result<(), GuardError> {
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(GuardError::InvalidPolicy(format!(
                "threshold must be in (0, 1], got {}",
                self.threshold
            )));
        }
        if !(self.controversial_band >= 0.0 && self.controversial_band < self.threshold) {
            return Err(GuardError::InvalidPolicy(format!(
                "controversial_band must be in [0, threshold), got {}",
                self.controversial_band
            )));
        }
        if !self.check_prompt && !self.check_response {
            return Err(GuardError::InvalidPolicy(
                "at least one of check_prompt and check_response must be on".into(),
            ));
        }
        Ok(())
    }

    /// Drop beats quarantine beats admit across the two sides; the reason names the side and
    /// the categories that decided.
    pub fn decide(&self, v: &SampleVerdict) -> GuardDecision {
        let mut out = GuardDecision::Admit;
        let sides = [
            (Side::Prompt, &v.prompt, self.check_prompt),
            (Side::Response, &v.response, self.check_response),
        ];
        for (side, verdict, on) in sides {
            if !on {
                continue;
            }
            let d = self.decide_side(side, verdict);
            out = match (&out, d) {
                (GuardDecision::Drop { .. }, _) => out,
                (_, d @ GuardDecision::Drop { .. }) => d,
                (GuardDecision::Quarantine { .. }, _) => out,
                (_, d) => d,
            };
        }
        out
    }

    fn decide_side(&self, side: Side, v: &Verdict) -> GuardDecision {
        let reason = |categories: Vec<Category>| GuardReason {
            side,
            severity: v.severity,
            categories,
        };
        if v.severity == Severity::Unsafe {
            let hard: Vec<Category> = v
                .categories
                .iter()
                .copied()
                .filter(|c| self.drop_categories.contains(c))
                .collect();
            // Unsafe with no category named (a terse model) is treated as droppable.
            if !hard.is_empty() || v.categories.is_empty() {
                return GuardDecision::Drop {
                    reason: reason(hard),
                };
            }
        }
        if v.severity == Severity::Safe {
            return GuardDecision::Admit;
        }
        let r = reason(v.categories.clone());
        match self.controversial {
            ControversialAction::Drop => GuardDecision::Drop { reason: r },
            ControversialAction::Quarantine => GuardDecision::Quarantine { reason: r },
            ControversialAction::Admit => GuardDecision::Admit,
        }
    }
}
