//! The run report: what was captured, where curation sent it and why, which deltas were trained, promoted
//! or rejected with their eval legs, and the privacy check (planted personal values and secrets found in the
//! training set; canary exposure). Built from the store alone, so it is the same during a run, after it, and
//! after a crash; a running graph adds its nodes' failures ([`Report::with_nodes`]).

use serde::Serialize;

use crate::engine::runtime::{NodeSnapshot, NodeState, StatusSnapshot};
use crate::store::{CurationCounts, DeltaRecord, DeltaStatus, ServedState, Store, StoreError};

/// A delta line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct DeltaLine {
    pub id: String,
    /// Whose own delta it is; `None`: common (or a merge, see its provenance's `members`).
    pub user: Option<String>,
    pub status: DeltaStatus,
    pub num_samples: u64,
    pub personal_gain: Option<f64>,
    /// Held-out taught answers that what was served, and then the candidate, recalled in a greedy answer,
    /// of how many: `(served, candidate, probes)`.
    pub recalled: Option<(u64, u64, u64)>,
    pub reason: Option<String>,
    pub legs: Vec<crate::store::LegRecord>,
}

/// One user with a delta of their own (or served a merged one): what their chain serves and how their deltas
/// fared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UserLine {
    pub user: String,
    /// What their own chain serves; `None`: nothing of their own, so the common state.
    pub served: Option<String>,
    /// The served delta's members when it is a merge of several users' deltas.
    pub merged_with: Vec<String>,
    /// The gate's personalisation gain for the served delta.
    pub personal_gain: Option<f64>,
    /// Their own deltas: all, promoted (served now or before), rejected.
    pub deltas: usize,
    pub promoted: usize,
    pub rejected: usize,
    /// Their samples in the training set.
    pub training_samples: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub curation: CurationCounts,
    pub training_set: usize,
    pub deltas: Vec<DeltaLine>,
    pub served: ServedState,
    /// Per user with deltas of their own, by name.
    pub users: Vec<UserLine>,
    /// The newest route-or-merge decision (`hearth deltas reconcile`, the `reconcile` node), as recorded.
    pub reconciliation: Option<serde_json::Value>,
    /// Planted values (personal data, secrets) checked for.
    pub planted_checked: usize,
    /// Planted values found anywhere in the training set: must be 0.
    pub planted_in_training_set: usize,
    /// Their first characters, to find them without the report repeating a secret.
    pub planted_found_prefixes: Vec<String>,
    /// The largest canary exposure (bits) of any promoted delta, and sampled leaks.
    pub max_promoted_canary_exposure_bits: Option<f64>,
    pub promoted_canary_leaks: u64,
    /// Nodes of the running graph that failed or had errors, failed first; empty for a report from the
    /// store alone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_errors: Vec<NodeSnapshot>,
}

fn line(d: &DeltaRecord) -> DeltaLine {
    let verdict = d.verdict.as_ref();
    DeltaLine {
        id: d.id.clone(),
        user: d.user.clone(),
        status: d.status,
        num_samples: d.provenance["num_samples"].as_u64().unwrap_or(0),
        personal_gain: verdict.and_then(|v| v["personal_gain"].as_f64()),
        recalled: verdict.and_then(|v| {
            Some((
                v["baseline"]["personal_recalled"].as_u64()?,
                v["candidate"]["personal_recalled"].as_u64()?,
                v["candidate"]["personal_probes"].as_u64()?,
            ))
        }),
        reason: verdict
            .and_then(|v| v["reason"].as_str())
            .map(str::to_owned),
        legs: d.legs.clone(),
    }
}

fn user_lines(
    store: &Store,
    deltas: &[DeltaRecord],
    training: &[crate::message::Sample],
) -> Result<Vec<UserLine>, StoreError> {
    let mut names: std::collections::BTreeSet<String> =
        deltas.iter().filter_map(|d| d.user.clone()).collect();
    let chains = store.served_users()?;
    names.extend(chains.iter().map(|(u, _)| u.clone()));
    Ok(names
        .into_iter()
        .map(|user| {
            let served = chains
                .iter()
                .find(|(u, _)| *u == user)
                .and_then(|(_, s)| s.delta_id.clone());
            let record = served
                .as_deref()
                .and_then(|id| deltas.iter().find(|d| d.id == id));
            let own = || {
                deltas
                    .iter()
                    .filter(|d| d.user.as_deref() == Some(user.as_str()))
            };
            UserLine {
                merged_with: record.map(|r| r.members()).unwrap_or_default(),
                personal_gain: record
                    .and_then(|r| r.verdict.as_ref())
                    .and_then(|v| v["personal_gain"].as_f64()),
                deltas: own().count(),
                promoted: own().filter(|d| d.promoted_at_unix_ms.is_some()).count(),
                rejected: own().filter(|d| d.status == DeltaStatus::Rejected).count(),
                training_samples: training.iter().filter(|s| s.user == user).count(),
                served,
                user,
            }
        })
        .collect())
}

/// The newest route-or-merge decision as lines: each group, what became of it, and why.
pub fn reconciliation_lines(r: &serde_json::Value) -> Vec<String> {
    let list = |v: &serde_json::Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let mut out = vec![format!(
        "at {} (route on any question both taught differently; merge when the two combined keep {} of each one's \
         gain; without probes: cosine >= {}, \
         sign conflicts <= {})",
        utc(r["at_unix_ms"].as_u64().unwrap_or(0)),
        r["min_kept"],
        r["thresholds"]["min_cosine"],
        r["thresholds"]["max_sign_conflict"]
    )];
    for g in r["groups"].as_array().into_iter().flatten() {
        let who = format!("{} ({})", list(&g["deltas"]), list(&g["users"]));
        out.push(match g["outcome"].as_str().unwrap_or("") {
            "routed" => format!("routed: {who}: {}", g["why"].as_str().unwrap_or("")),
            "merged" => format!(
                "merged: {who} into `{}`, {} ({})",
                g["delta_id"].as_str().unwrap_or(""),
                if g["promoted"].as_bool() == Some(true) {
                    "promoted to each member"
                } else {
                    "rejected by the gate"
                },
                g["reason"].as_str().unwrap_or("")
            ),
            other => format!("{other}: {who}"),
        });
    }
    out
}

impl Report {
    /// Reads the report from the store; `planted` are values that must never reach the training set.
    pub fn build(store: &Store, planted: &[String]) -> Result<Report, StoreError> {
        let training = store.training_set()?;
        let texts: Vec<String> = training
            .iter()
            .map(|s| s.content.texts().join("\n"))
            .collect();
        let mut found: Vec<String> = planted
            .iter()
            .filter(|p| !p.is_empty() && texts.iter().any(|t| t.contains(p.as_str())))
            .cloned()
            .collect();
        found.sort();
        found.dedup();
        let deltas = store.deltas()?;
        let promoted: Vec<&DeltaRecord> = deltas
            .iter()
            .filter(|d| d.promoted_at_unix_ms.is_some())
            .collect();
        let exposure = |d: &&DeltaRecord| {
            d.verdict
                .as_ref()
                .and_then(|v| v["candidate"]["canary_exposure_bits"].as_f64())
        };
        let users = user_lines(store, &deltas, &training)?;
        let reconciliation = store.reconciliations(1)?.into_iter().next().map(|r| r.2);
        Ok(Report {
            users,
            reconciliation,
            curation: store.counts()?,
            training_set: training.len(),
            served: store.served()?,
            planted_checked: planted.len(),
            planted_in_training_set: found.len(),
            planted_found_prefixes: found
                .iter()
                .map(|f| f.chars().take(4).chain("…".chars()).collect())
                .collect(),
            max_promoted_canary_exposure_bits: promoted
                .iter()
                .filter_map(exposure)
                .reduce(f64::max),
            promoted_canary_leaks: promoted
                .iter()
                .filter_map(|d| {
                    d.verdict
                        .as_ref()
                        .and_then(|v| v["candidate"]["canary_leaks"].as_u64())
                })
                .sum(),
            deltas: deltas.iter().map(line).collect(),
            node_errors: Vec::new(),
        })
    }

    /// Adds the nodes of a running (or finished) graph that failed or had any error.
    pub fn with_nodes(mut self, status: &StatusSnapshot) -> Report {
        self.node_errors = status
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Failed || n.errors > 0)
            .cloned()
            .collect();
        self.node_errors
            .sort_by_key(|n| n.state != NodeState::Failed);
        self
    }

    /// One line per loop, for a long-running process's progress output; then each node that has failed or
    /// is erroring, with its last error.
    pub fn status_line(&self) -> String {
        let c = &self.curation;
        let count = |s: DeltaStatus| self.deltas.iter().filter(|d| d.status == s).count();
        let mut line = format!(
            "capture: {} interactions, {} feedback | curate: admitted {}, dropped {}, quarantined {}, pending {} | \
             train: {} deltas ({} promoted, {} rejected, {} awaiting eval) | serving {}",
            c.interactions,
            c.feedback,
            c.admitted,
            c.dropped,
            c.quarantined,
            c.pending,
            self.deltas.len(),
            count(DeltaStatus::Promoted),
            count(DeltaStatus::Rejected),
            self.deltas.iter().filter(|d| d.reason.is_none()).count(),
            self.served.delta_id.as_deref().unwrap_or("the base"),
        );
        if let Some(nodes) = troubled_nodes(&self.node_errors) {
            line += " | ";
            line += &nodes;
        }
        line
    }

    pub fn to_markdown(&self) -> String {
        let c = &self.curation;
        let mut s = String::from("# hearth run report\n\n## Capture and curation\n");
        s += &format!(
            "- captured: {} interactions, {} feedback events\n- admitted {}, dropped {}, quarantined {}, pending {} \
             (training set: {} samples)\n",
            c.interactions,
            c.feedback,
            c.admitted,
            c.dropped,
            c.quarantined,
            c.pending,
            self.training_set
        );
        if !c.reasons.is_empty() {
            // Reasons name the sample they point at ("exact duplicate of #11"); the table counts by kind.
            let mut by_kind: Vec<(String, String, u64)> = Vec::new();
            for (node, reason, n) in &c.reasons {
                let kind = reason.split(" of #").next().unwrap_or(reason).to_owned();
                match by_kind
                    .iter_mut()
                    .find(|(nd, k, _)| nd == node && *k == kind)
                {
                    Some(row) => row.2 += n,
                    None => by_kind.push((node.clone(), kind, *n)),
                }
            }
            by_kind.sort_by_key(|row| std::cmp::Reverse(row.2));
            s += "\n| count | node | reason |\n|---:|---|---|\n";
            for (node, reason, n) in &by_kind {
                s += &format!("| {n} | {node} | {reason} |\n");
            }
        }
        s += "\n## Deltas\n";
        if self.deltas.is_empty() {
            s += "- none trained yet\n";
        }
        for d in &self.deltas {
            s += &format!(
                "- `{}` {} on {} samples; personalisation gain {}{}; {}\n",
                d.id,
                d.status.as_str(),
                d.num_samples,
                d.personal_gain
                    .map_or("-".to_owned(), |g| format!("{g:+.4} nats/token")),
                d.recalled.map_or(String::new(), |(b, c, n)| format!(
                    "; taught answers recalled on held-out prompts {b} -> {c} of {n}"
                )),
                d.reason.as_deref().unwrap_or("awaiting eval")
            );
            for l in &d.legs {
                s += &format!(
                    "  - {}: served {:.4} -> candidate {:.4} (tolerance {}) {}\n",
                    l.leg,
                    l.baseline,
                    l.candidate,
                    l.tolerance,
                    if l.passed { "pass" } else { "FAIL" }
                );
            }
        }
        s += &format!(
            "\nServing: {}\n",
            self.served.delta_id.as_deref().unwrap_or("the base alone")
        );
        if !self.users.is_empty() {
            s += "\n## Per-user deltas\n\n| user | served | gain | own deltas (promoted, rejected) | samples |\n                  |---|---|---:|---|---:|\n";
            for u in &self.users {
                s += &format!(
                    "| {} | {}{} | {} | {} ({}, {}) | {} |\n",
                    u.user,
                    u.served
                        .as_deref()
                        .map_or("(common)".to_owned(), |d| format!("`{d}`")),
                    if u.merged_with.is_empty() {
                        String::new()
                    } else {
                        format!(" merged: {}", u.merged_with.join(", "))
                    },
                    u.personal_gain
                        .map_or("-".to_owned(), |g| format!("{g:+.4}")),
                    u.deltas,
                    u.promoted,
                    u.rejected,
                    u.training_samples
                );
            }
        }
        if let Some(r) = &self.reconciliation {
            s += "\n## Route or merge\n";
            for l in reconciliation_lines(r) {
                s += &format!("- {l}\n");
            }
        }
        s += &format!(
            "\n## Privacy check\n- planted values checked: {}; found in the training set: {}{}\n",
            self.planted_checked,
            self.planted_in_training_set,
            if self.planted_in_training_set == 0 {
                String::new()
            } else {
                format!(
                    " ({}: a privacy failure)",
                    self.planted_found_prefixes.join(", ")
                )
            }
        );
        s += &format!(
            "- canary exposure of promoted deltas: {} bits max; sampled leaks {}\n",
            self.max_promoted_canary_exposure_bits
                .map_or("-".to_owned(), |e| format!("{e:.2}")),
            self.promoted_canary_leaks
        );
        if !self.node_errors.is_empty() {
            s += "\n## Node errors\n";
            for n in &self.node_errors {
                s += &format!(
                    "- `{}` ({}): {:?}, {} errors, {} restarts",
                    n.id, n.kind, n.state, n.errors, n.restarts
                );
                if let Some(e) = &n.last_error {
                    s += &format!(
                        "; last error in {} at {}: {}",
                        e.during.as_str(),
                        utc(e.at_unix_ms),
                        e.error
                    );
                }
                s += "\n";
            }
        }
        s
    }
}

/// The longest a node's error runs in a status line; `/status` and the report keep it whole.
const STATUS_ERROR_CHARS: usize = 160;

/// `FAILED: …; erroring: …` for the nodes in `nodes` that have failed or are erroring now, with their last
/// errors cut to [`STATUS_ERROR_CHARS`]; `None` when there are none.
pub fn troubled_nodes(nodes: &[NodeSnapshot]) -> Option<String> {
    let describe = |n: &NodeSnapshot, note: String| {
        let error = n.last_error.as_ref().map_or(String::new(), |e| {
            let mut text: String = e.error.chars().take(STATUS_ERROR_CHARS).collect();
            if e.error.chars().count() > STATUS_ERROR_CHARS {
                text.push('…');
            }
            format!(": {text}")
        });
        format!("{}{note}{error}", n.id)
    };
    let failed: Vec<String> = nodes
        .iter()
        .filter(|n| n.state == NodeState::Failed)
        .map(|n| describe(n, String::new()))
        .collect();
    let erroring: Vec<String> = nodes
        .iter()
        .filter(|n| n.state != NodeState::Failed && n.erroring)
        .map(|n| describe(n, format!(" ({} restarts in window)", n.restarts_in_window)))
        .collect();
    let mut parts = Vec::new();
    if !failed.is_empty() {
        parts.push(format!("FAILED: {}", failed.join("; ")));
    }
    if !erroring.is_empty() {
        parts.push(format!("erroring: {}", erroring.join("; ")));
    }
    (!parts.is_empty()).then(|| parts.join(" | "))
}

/// `YYYY-MM-DD HH:MM:SS UTC` for milliseconds since the Unix epoch.
fn utc(unix_ms: u64) -> String {
    format!("{} UTC", crate::clock::utc_datetime(unix_ms))
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn utc_formats_civil_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        // 2000-02-29 (a leap day of a century leap year) 12:34:56.
        assert_eq!(utc(951_827_696_000), "2000-02-29 12:34:56 UTC");
        assert_eq!(utc(1_735_689_599_999), "2024-12-31 23:59:59 UTC");
    }
}
