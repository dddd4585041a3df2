//! Route or merge: the decision over the deltas users are served.
//!
//! [`reconcile`] takes the deltas served on users' own chains (each user's own delta, or a merged delta that
//! already serves several users) and measures every pair three ways. Contested prompts: questions both
//! deltas' users taught (same words) with different wanted answers; one delta cannot give both, so any such
//! prompt routes the pair (opposite preferences). Kept gain ([`Pair::kept`]): the share of each one's gain
//! on its held-out probes (answer NLL against the base) that the two combined, as the merge combines them,
//! still show; a pair that undoes more than `1 − min_kept` of either's gain is routed. Weight space
//! ([`super::merge::conflict`]: sign conflicts and cosine of ΔW): reported, and deciding only where neither
//! of the others can be measured: deltas of unrelated facts and of opposite preferences can look alike in
//! weight space and in kept gain, where contested prompts tell them apart (figures in docs/store.md). A
//! delta joins the first group all of whose deltas it agrees with, else it starts its own. A group of two or
//! more is merged ([`super::merge::merge_stored_for`]) into a candidate for its members, which the eval gate
//! judges like any delta: against the common state on the members' held-out data, with one leg per member
//! that must show that member's own gain. Only a passing merge is promoted, on each member's chain; a failing
//! one leaves the members routed to their own deltas. A delta in a group alone stays routed. Every decision,
//! with its measures and reasons, is recorded in the store (`reconciliations`) and returned.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::merge::{
    ConflictThresholds, Decision, MergeError, MergeMethod, MergeOptions, base_weight, conflict,
    decide, load_stored, merge_stored_for, mix,
};
use crate::eval::{EvalError, Gate, GateConfig};
use crate::model::{Base, LoraSet};
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("reconcile: {0}")]
    Merge(#[from] MergeError),
    #[error("reconcile: judging merged delta `{delta}`: {source}")]
    Judge { delta: String, source: EvalError },
    #[error("reconcile: {0}")]
    Store(#[from] StoreError),
    #[error("reconcile: scoring held-out probes: {source}")]
    Probes { source: EvalError },
    #[error("reconcile: encoding the record: {0}")]
    Json(#[from] serde_json::Error),
}

pub type Result<T> = std::result::Result<T, ReconcileError>;

/// How the decision is made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileOptions {
    /// Where two deltas count as agreeing in weight space; decides a pair only where the other measures
    /// cannot be measured.
    pub thresholds: ConflictThresholds,
    /// Merge two deltas only if, combined as the merge combines them, they keep at least this share of each
    /// one's gain on its held-out probes (see [`Pair::kept`]).
    pub min_kept: f64,
    /// How a group is merged. `task_arithmetic` (the default) adds the updates, so each member's delta enters
    /// whole; `linear` averages them, which halves each of two.
    pub method: MergeMethod,
    /// Rank of a merged delta; `None`: the sum of the group's ranks, so the merge is exact.
    pub rank: Option<usize>,
    /// Only these users' served deltas; empty: every user served a delta on their own chain.
    pub users: Vec<String>,
    /// Measure and decide, but merge nothing.
    pub dry_run: bool,
    /// Seeds the merge (see [`MergeOptions::seed`]).
    pub seed: u64,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            thresholds: ConflictThresholds::default(),
            min_kept: 0.5,
            method: MergeMethod::TaskArithmetic,
            rank: None,
            users: Vec::new(),
            dry_run: false,
            seed: 0,
        }
    }
}

/// A served delta that took part, and the users it serves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Input {
    pub delta_id: String,
    pub users: Vec<String>,
}

/// The measures between two inputs and what they say.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pair {
    pub a: String,
    pub b: String,
    pub sign_conflict: f64,
    pub cosine: f64,
    /// Prompts both deltas' users taught (the same words), and how many of them with different answers.
    pub shared_prompts: usize,
    pub contested_prompts: usize,
    /// `[a's, b's]`: the share of each delta's gain on its users' held-out probes (answer NLL per token, base
    /// minus delta) that the two combined as the merge combines them (exactly, before re-factoring) keep.
    /// `None` where either has no probes or no gain on them, or the two cannot be combined exactly (DoRA).
    pub kept: Option<[f64; 2]>,
    pub decision: Decision,
    /// Which measure decided: `contested_prompts`, `kept_gain` or `weights`.
    pub decided_by: &'static str,
}

/// What became of one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Outcome {
    /// Kept as it is; requests stay routed to it.
    Routed { why: String },
    /// Merged into `delta_id`, which the gate promoted (served to every member) or rejected.
    Merged {
        delta_id: String,
        promoted: bool,
        reason: String,
        rel_residual: f64,
    },
    /// Would be merged (a dry run).
    WouldMerge,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    pub deltas: Vec<String>,
    pub users: Vec<String>,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// One run of the decision, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reconciliation {
    pub at_unix_ms: u64,
    pub thresholds: ConflictThresholds,
    pub min_kept: f64,
    pub method: MergeMethod,
    pub inputs: Vec<Input>,
    pub pairs: Vec<Pair>,
    pub groups: Vec<Group>,
}

impl Reconciliation {
    /// One line per pair and per group, for a terminal.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.pairs {
            out.push(format!(
                "{} vs {}: contested prompts {}/{} kept gain={} sign_conflict={:.4} cosine={:+.4} -> {} (by {})",
                p.a,
                p.b,
                p.contested_prompts,
                p.shared_prompts,
                p.kept
                    .map_or("-".to_owned(), |[x, y]| format!("{x:.2},{y:.2}")),
                p.sign_conflict,
                p.cosine,
                decision_str(p.decision),
                p.decided_by
            ));
        }
        for g in &self.groups {
            let who = g.users.join(",");
            out.push(match &g.outcome {
                Outcome::Routed { why } => format!("route {} ({who}): {why}", g.deltas.join(" + ")),
                Outcome::WouldMerge => format!("would merge {} ({who})", g.deltas.join(" + ")),
                Outcome::Merged {
                    delta_id,
                    promoted,
                    reason,
                    rel_residual,
                } => format!(
                    "merge {} ({who}) into {delta_id} (relative residual {rel_residual:.2e}): {} ({reason})",
                    g.deltas.join(" + "),
                    if *promoted {
                        "promoted to each member"
                    } else {
                        "rejected by the gate, members stay routed"
                    }
                ),
            });
        }
        if self.inputs.len() < 2 {
            out.push(format!(
                "{} delta(s) served on users' own chains: nothing to merge",
                self.inputs.len()
            ));
        }
        out
    }
}

pub fn decision_str(d: Decision) -> &'static str {
    match d {
        Decision::Merge => "merge",
        Decision::Route => "route",
    }
}

/// Where the gate that judges merged deltas reads its probes, and with what settings.
pub struct GateSettings {
    pub probes: Option<PathBuf>,
    pub cfg: GateConfig,
}

/// Runs the decision over the deltas served on users' own chains in `data_dir` (see the module docs), records
/// it in the store and returns it.
pub fn reconcile(
    data_dir: &Path,
    base: Arc<Base>,
    settings: GateSettings,
    opts: &ReconcileOptions,
) -> Result<Reconciliation> {
    let mut store = Store::open(data_dir)?;
    let mut by_delta: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (user, state) in store.served_users()? {
        if !opts.users.is_empty() && !opts.users.contains(&user) {
            continue;
        }
        if let Some(id) = state.delta_id {
            by_delta.entry(id).or_default().push(user);
        }
    }
    let inputs: Vec<Input> = by_delta
        .into_iter()
        .map(|(delta_id, users)| Input { delta_id, users })
        .collect();
    let sets: Vec<LoraSet> = inputs
        .iter()
        .map(|i| load_stored(&store, &base, &i.delta_id).map(|(s, _)| s))
        .collect::<std::result::Result<_, _>>()?;
    let weight = base_weight(&base);
    let (probe_set, _) = crate::eval::ProbeSet::frozen_for_base(
        &data_dir.join("eval"),
        &base.sha256,
        settings.probes.as_deref(),
    )
    .map_err(|source| ReconcileError::Probes { source })?;
    let probes = Probes::new(&store, &base, &settings, &inputs, &probe_set)?;
    let gain: Vec<(f64, f64)> = sets
        .iter()
        .enumerate()
        .map(|(k, set)| Ok((probes.nll(None, k)?, probes.nll(Some(set), k)?)))
        .collect::<Result<_>>()?;
    // The weight each delta has in the merge's combination.
    let w = match opts.method {
        MergeMethod::Linear => 0.5,
        _ => 1.0,
    };
    let mut pairs = Vec::new();
    let mut agree = vec![vec![false; inputs.len()]; inputs.len()];
    for i in 0..inputs.len() {
        for j in i + 1..inputs.len() {
            let c = conflict(&sets[i], &sets[j], Some(&weight))?;
            let (shared, contested) = probes.contested(i, j);
            let kept = match mix(&[(&sets[i], w), (&sets[j], w)]) {
                Ok(both) => {
                    let share = |k: usize| -> Result<Option<f64>> {
                        let (base_nll, own) = gain[k];
                        let g = base_nll - own;
                        Ok((g > 0.0 && g.is_finite())
                            .then_some(())
                            .map(|()| probes.nll(Some(&both), k))
                            .transpose()?
                            .map(|comb| (base_nll - comb) / g))
                    };
                    share(i)?.zip(share(j)?).map(|(x, y)| [x, y])
                }
                Err(_) => None,
            };
            let (decision, decided_by) = match kept {
                _ if contested > 0 => (Decision::Route, "contested_prompts"),
                Some([x, y]) if x.min(y) >= opts.min_kept => (Decision::Merge, "kept_gain"),
                Some(_) => (Decision::Route, "kept_gain"),
                None => (decide(&c, &opts.thresholds), "weights"),
            };
            agree[i][j] = decision == Decision::Merge;
            agree[j][i] = agree[i][j];
            pairs.push(Pair {
                a: inputs[i].delta_id.clone(),
                b: inputs[j].delta_id.clone(),
                sign_conflict: c.sign_conflict,
                cosine: c.cosine,
                shared_prompts: shared,
                contested_prompts: contested,
                kept,
                decision,
                decided_by,
            });
        }
    }
    // Each delta joins the first group it agrees with entirely: every merged pair was measured to agree.
    let mut members: Vec<Vec<usize>> = Vec::new();
    for (i, with) in agree.iter().enumerate() {
        match members.iter_mut().find(|g| g.iter().all(|&j| with[j])) {
            Some(g) => g.push(i),
            None => members.push(vec![i]),
        }
    }
    let mut gate = None;
    let mut groups = Vec::new();
    for g in members {
        let deltas: Vec<String> = g.iter().map(|&i| inputs[i].delta_id.clone()).collect();
        let mut users: Vec<String> = g
            .iter()
            .flat_map(|&i| inputs[i].users.iter().cloned())
            .collect();
        users.sort();
        let outcome = if g.len() == 1 {
            Outcome::Routed {
                why: routed_why(&deltas[0], &pairs, &opts.thresholds, opts.min_kept),
            }
        } else if opts.dry_run {
            Outcome::WouldMerge
        } else {
            let rank = opts
                .rank
                .unwrap_or_else(|| g.iter().map(|&i| sets[i].config.r).sum());
            let merge = MergeOptions {
                seed: opts.seed,
                ..MergeOptions::new(opts.method, rank)
            };
            let why: Vec<&Pair> = pairs
                .iter()
                .filter(|p| deltas.contains(&p.a) && deltas.contains(&p.b))
                .collect();
            let why =
                serde_json::json!({"reconcile": {"thresholds": opts.thresholds, "pairs": why}});
            let (delta, report) = merge_stored_for(data_dir, &base, &deltas, &merge, &users, why)?;
            let verdict = gate
                .get_or_insert_with(|| {
                    Gate::new(
                        base.clone(),
                        data_dir,
                        settings.probes.clone(),
                        settings.cfg.clone(),
                    )
                })
                .judge(&delta)
                .map_err(|source| ReconcileError::Judge {
                    delta: delta.id.clone(),
                    source,
                })?;
            Outcome::Merged {
                delta_id: delta.id.clone(),
                promoted: verdict.binding.promote,
                reason: verdict.binding.reason.clone(),
                rel_residual: report.rel_residual,
            }
        };
        groups.push(Group {
            deltas,
            users,
            outcome,
        });
    }
    let rec = Reconciliation {
        at_unix_ms: crate::clock::now_unix_ms(),
        thresholds: opts.thresholds,
        min_kept: opts.min_kept,
        method: opts.method,
        inputs,
        pairs,
        groups,
    };
    store.record_reconciliation(&serde_json::to_value(&rec)?)?;
    Ok(rec)
}

/// Each input's users' taught answers: all of them (for contested prompts) and the held-out ones (probes).
struct Probes<'a> {
    ev: crate::eval::Evaluator<'a>,
    held_out: Vec<Vec<crate::eval::PersonalProbe>>,
    /// Every taught (prompt, answer), by the prompt's words, lowercased.
    taught: Vec<BTreeMap<String, String>>,
}

/// Lowercased alphanumeric words, space-separated: two phrasings that differ only in case and punctuation match.
fn words(t: &str) -> String {
    t.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

impl<'a> Probes<'a> {
    fn new(
        store: &Store,
        base: &'a Base,
        settings: &'a GateSettings,
        inputs: &[Input],
        probe_set: &'a crate::eval::ProbeSet,
    ) -> Result<Self> {
        let training = store.training_set()?;
        let (mut held_out, mut taught) = (Vec::new(), Vec::new());
        for i in inputs {
            let holdout = store
                .delta(&i.delta_id)?
                .and_then(|r| r.provenance["recipe"]["holdout_fraction"].as_f64())
                .unwrap_or(0.0);
            let mine: Vec<_> = training
                .iter()
                .filter(|s| i.users.contains(&s.user))
                .cloned()
                .collect();
            held_out.push(crate::eval::personal_probes(
                &mine,
                holdout,
                settings.cfg.max_personal_probes,
            ));
            // A fraction of 1 holds every prompt out: all the taught answers.
            taught.push(
                crate::eval::personal_probes(&mine, 1.0, usize::MAX)
                    .into_iter()
                    .map(|p| {
                        let asked: Vec<&str> =
                            p.prompt.iter().map(|m| m.content.as_str()).collect();
                        (words(&asked.join(" ")), words(&p.answer))
                    })
                    .collect(),
            );
        }
        Ok(Probes {
            ev: crate::eval::Evaluator::new(&base.model, &base.tok, probe_set, &settings.cfg),
            held_out,
            taught,
        })
    }

    /// Answer NLL per token of input `k`'s held-out answers under `lora`.
    fn nll(&self, lora: Option<&LoraSet>, k: usize) -> Result<f64> {
        self.ev
            .personal_nll(lora, &self.held_out[k])
            .map(|(nll, _)| nll)
            .map_err(|source| ReconcileError::Probes { source })
    }

    /// Prompts inputs `a` and `b` both taught, and how many of them with different answers.
    fn contested(&self, a: usize, b: usize) -> (usize, usize) {
        let (ta, tb) = (&self.taught[a], &self.taught[b]);
        let shared: Vec<&String> = ta.keys().filter(|k| tb.contains_key(*k)).collect();
        let contested = shared.iter().filter(|k| ta[**k] != tb[**k]).count();
        (shared.len(), contested)
    }
}

/// Why a delta alone in its group stays routed: the pairs that disagreed, by how much.
fn routed_why(id: &str, pairs: &[Pair], th: &ConflictThresholds, min_kept: f64) -> String {
    let against: Vec<String> = pairs
        .iter()
        .filter(|p| p.a == id || p.b == id)
        .map(|p| {
            let other = if p.a == id { &p.b } else { &p.a };
            match p.kept {
                _ if p.contested_prompts > 0 => format!(
                    "{other}: {} of {} questions both taught have different answers",
                    p.contested_prompts, p.shared_prompts
                ),
                Some([x, y]) => {
                    let (ours, theirs) = if p.a == id { (x, y) } else { (y, x) };
                    format!(
                        "{other}: combined, they keep {:.0}% of this delta's gain and {:.0}% of its (merge needs \
                         {:.0}% of each)",
                        ours * 100.0,
                        theirs * 100.0,
                        min_kept * 100.0
                    )
                }
                None => format!(
                    "{other}: cosine {:+.3}{} {:.3}, sign conflicts {:.3}{} {:.3}",
                    p.cosine,
                    if p.cosine >= th.min_cosine { " >=" } else { " <" },
                    th.min_cosine,
                    p.sign_conflict,
                    if p.sign_conflict <= th.max_sign_conflict {
                        " <="
                    } else {
                        " >"
                    },
                    th.max_sign_conflict
                ),
            }
        })
        .collect();
    if against.is_empty() {
        "no other delta to merge with".to_owned()
    } else {
        format!("conflicts with {}", against.join("; "))
    }
}
