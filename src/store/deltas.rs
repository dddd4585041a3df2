//! Deltas, the eval gate's verdicts, and the served state.
//!
//! A delta enters as a `candidate`, becomes `rejected` or stays a candidate with a passing verdict, and is
//! `promoted` (served) or `rolled_back`. What is served is the last row of the `serving_log`, which only
//! grows but for retention; each row remembers the row that was current before it, so `rollback` restores
//! the previous served state exactly, however many times it is repeated, down to the base alone (or to the
//! oldest state retention keeps, then the base alone). Retention ([`Store::prune_deltas`]) deletes what no
//! rollback can reach.
//!
//! Per-user deltas: a delta may belong to one user (`user`, from its provenance). Each user has a served state
//! of their own, a chain of `serving_log` rows apart from the common chain (`user` NULL) that everyone else
//! is served from; promotion, rollback and retention work on the delta's own chain, so one user's deltas
//! never move another's. A user whose own chain serves nothing (never promoted, or rolled back past their
//! first delta) is served the common state.

use std::path::{Path, PathBuf};

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::{Store, StoreError, json, sq_err};
use crate::clock::now_unix_ms;
use crate::message::Delta;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeltaStatus {
    Candidate,
    Promoted,
    Rejected,
    RolledBack,
}

impl DeltaStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeltaStatus::Candidate => "candidate",
            DeltaStatus::Promoted => "promoted",
            DeltaStatus::Rejected => "rejected",
            DeltaStatus::RolledBack => "rolled_back",
        }
    }

    fn parse(s: &str) -> DeltaStatus {
        match s {
            "promoted" => DeltaStatus::Promoted,
            "rejected" => DeltaStatus::Rejected,
            "rolled_back" => DeltaStatus::RolledBack,
            // The table's CHECK constraint admits nothing else.
            _ => DeltaStatus::Candidate,
        }
    }
}

/// One probe leg of a verdict as stored in `eval_results`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LegRecord {
    pub leg: String,
    /// The score of the state served when the verdict was computed.
    pub baseline: f64,
    pub candidate: f64,
    pub tolerance: f64,
    pub passed: bool,
}

/// A delta as `hearth deltas list|show` reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeltaRecord {
    pub id: String,
    pub path: String,
    pub base_sha256: String,
    pub recipe_sha256: String,
    pub data_digest: String,
    pub parent: Option<String>,
    /// The user whose own delta this is; `None`: the common delta.
    pub user: Option<String>,
    pub status: DeltaStatus,
    pub provenance: serde_json::Value,
    /// The eval gate's verdict, bound to this delta's bytes, base, recipe and data.
    pub verdict: Option<serde_json::Value>,
    pub legs: Vec<LegRecord>,
    pub created_at_unix_ms: u64,
    pub promoted_at_unix_ms: Option<u64>,
}

/// The `provenance.json` key listing, sorted, every user whose data went into a delta: the samples it was
/// trained on and, through its parent (a continuation) or its parents (a merge), theirs. `hearth purge --user`
/// retires every delta that lists the user.
pub const TRAINED_ON: &str = "trained_on";

/// The `provenance.json` key of a merged delta listing the users it is made for: the gate judges it on their
/// held-out data and promotes it on each one's chain.
pub const MEMBERS: &str = "members";

fn string_list(v: &serde_json::Value) -> Option<Vec<String>> {
    v.as_array().map(|a| {
        a.iter()
            .filter_map(|u| u.as_str().map(str::to_owned))
            .collect()
    })
}

impl DeltaRecord {
    /// The users whose data went into this delta ([`TRAINED_ON`]). A delta recorded before deltas listed them
    /// is known only if it is a user's own (their data alone); a common one gives `None`.
    pub fn trained_on(&self) -> Option<Vec<String>> {
        match self.provenance.get(TRAINED_ON).and_then(string_list) {
            Some(users) => Some(users),
            None if self
                .provenance
                .get("metrics")
                .and_then(|m| m.get("merge"))
                .is_some() =>
            {
                None
            }
            None => self.user.clone().map(|u| vec![u]),
        }
    }

    /// The users a merged delta is made for ([`MEMBERS`]); empty for any other delta.
    pub fn members(&self) -> Vec<String> {
        self.provenance
            .get(MEMBERS)
            .and_then(string_list)
            .unwrap_or_default()
    }

    /// The delta as it travels on an edge.
    pub fn to_delta(&self) -> Delta {
        Delta {
            id: self.id.clone(),
            path: self.path.clone(),
            base_sha256: self.base_sha256.clone(),
            recipe_sha256: self.recipe_sha256.clone(),
            data_digest: self.data_digest.clone(),
            parent: self.parent.clone(),
        }
    }
}

/// What is served now on one chain: a delta over the base, or the base alone (`delta_id: None`; on a user's
/// chain: the common state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServedState {
    /// The `serving_log` row that entered this state; `None` before any promotion.
    pub seq: Option<i64>,
    pub delta_id: Option<String>,
}

/// Which deltas retention keeps (see [`Store::prune_deltas`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeltaRetention {
    /// Deltas kept that no rollback can reach (rejected by the gate, or rolled back), newest first, per user
    /// (and for the common deltas): kept to show why they lost; older ones are deleted.
    pub keep_rejected: usize,
    /// Served states `hearth deltas rollback` can walk back through, the current one included, per user (and
    /// on the common chain); past them a rollback reaches the base alone. `None`: every served state since
    /// the first promotion.
    pub keep_served: Option<usize>,
}

impl Default for DeltaRetention {
    fn default() -> Self {
        DeltaRetention {
            keep_rejected: 8,
            keep_served: None,
        }
    }
}

/// What [`Store::prune_deltas`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PrunedDeltas {
    /// Deltas whose rows (with their eval results) and adapter directories were deleted.
    pub deltas: Vec<String>,
    /// `serving_log` rows no rollback could reach any more.
    pub serving_log_rows: usize,
}

impl Store {
    /// Deletes deltas outside `retention`, rows first, then files. One transaction deletes the rows (the delta,
    /// its eval results, `serving_log` rows no rollback can reach) and lists each adapter directory in
    /// `file_trash`; the directories are removed after it commits. A crash in between leaves the list, which
    /// the next call (the gate's start) finishes first; a concurrent `hearth deltas promote` of a pruned delta
    /// finds no row rather than a half-deleted directory. Kept: every candidate (a verdict may still come),
    /// every delta on the rollback chain (the served one and what rollbacks restore, down to `keep_served`
    /// states), and the newest `keep_rejected` of the rest.
    pub fn prune_deltas(&mut self, retention: &DeltaRetention) -> Result<PrunedDeltas, StoreError> {
        if retention.keep_served == Some(0) {
            return Err(StoreError::Refused(
                "keep_served must be at least 1: the served state is always kept".into(),
            ));
        }
        self.empty_file_trash()?;
        let sq = sq_err(&self.path);
        let now = now_unix_ms() as i64;
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(&sq)?;
        // The rollback chains, one per user and the common one: the chain's last row, then each row's
        // `previous`.
        let mut chain: Vec<(i64, Option<String>)> = Vec::new();
        let heads: Vec<i64> = tx
            .prepare("SELECT MAX(seq) FROM serving_log GROUP BY user")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(&sq)?;
        for head in heads {
            let start = chain.len();
            let mut next = Some(head);
            while let Some(seq) = next {
                let (delta, previous): (Option<String>, Option<i64>) = tx
                    .query_row(
                        "SELECT delta_id, previous FROM serving_log WHERE seq = ?1",
                        [seq],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .map_err(&sq)?;
                chain.push((seq, delta));
                if retention
                    .keep_served
                    .is_some_and(|k| chain.len() - start >= k)
                    && previous.is_some()
                {
                    // The oldest state kept: a rollback from it reaches the base alone.
                    tx.execute(
                        "UPDATE serving_log SET previous = NULL WHERE seq = ?1",
                        [seq],
                    )
                    .map_err(&sq)?;
                    break;
                }
                next = previous;
            }
        }
        let on_chain: std::collections::HashSet<String> =
            chain.iter().filter_map(|(_, d)| d.clone()).collect();
        let kept_seqs: Vec<i64> = chain.iter().map(|(seq, _)| *seq).collect();
        let serving_log_rows = tx
            .execute(
                &format!(
                    "DELETE FROM serving_log WHERE seq NOT IN ({})",
                    if kept_seqs.is_empty() {
                        "NULL".to_owned()
                    } else {
                        kept_seqs
                            .iter()
                            .map(i64::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                ),
                [],
            )
            .map_err(&sq)?;
        let rows: Vec<(String, String, String, Option<String>)> = tx
            .prepare(
                "SELECT id, path, status, user FROM deltas WHERE status != 'candidate'
                 ORDER BY created_at_unix_ms DESC, rowid DESC",
            )
            .and_then(|mut s| {
                s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect()
            })
            .map_err(&sq)?;
        // Per user, so one user's rejections never push out another's.
        let mut rejected_kept: std::collections::HashMap<Option<String>, usize> =
            Default::default();
        let mut pruned = Vec::new();
        for (id, path, status, user) in rows {
            if on_chain.contains(&id) {
                continue;
            }
            // A promoted delta off the chain left it by truncation: nothing can serve it again.
            let kept = rejected_kept.entry(user).or_default();
            if status != "promoted" && *kept < retention.keep_rejected {
                *kept += 1;
                continue;
            }
            delete_delta_rows(&tx, &id, &path, now, &sq)?;
            pruned.push(id);
        }
        tx.commit().map_err(&sq)?;
        self.empty_file_trash()?;
        Ok(PrunedDeltas {
            deltas: pruned,
            serving_log_rows,
        })
    }

    /// Removes every file or directory listed in `file_trash`, then its row. One already gone counts as
    /// removed (a crash after the removal, before the row's deletion).
    pub(super) fn empty_file_trash(&mut self) -> Result<(), StoreError> {
        let paths: Vec<String> = self.ids("SELECT path FROM file_trash ORDER BY rowid", [])?;
        for path in paths {
            let p = PathBuf::from(&path);
            let removed = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            match removed {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(StoreError::Remove { path: p, source }),
            }
            self.conn
                .execute("DELETE FROM file_trash WHERE path = ?1", [&path])
                .map_err(self.sq())?;
        }
        Ok(())
    }

    /// Records a trained delta as a candidate, as the user's own when `provenance` names a `user`. Returns
    /// false if it was recorded before (a replay).
    pub fn record_delta(
        &mut self,
        delta: &Delta,
        provenance: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        let user = provenance.get("user").and_then(|u| u.as_str());
        let n = self
            .conn
            .execute(
                "INSERT OR IGNORE INTO deltas (id, path, base_sha256, recipe_sha256, data_digest, parent, status,
                 provenance_json, created_at_unix_ms, user) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'candidate', ?7, ?8, ?9)",
                params![
                    delta.id,
                    delta.path,
                    delta.base_sha256,
                    delta.recipe_sha256,
                    delta.data_digest,
                    delta.parent,
                    json(provenance),
                    now_unix_ms() as i64,
                    user
                ],
            )
            .map_err(self.sq())?;
        Ok(n == 1)
    }

    /// Stores the eval gate's verdict and its legs in one transaction; a failed verdict rejects the delta.
    pub fn record_verdict(
        &mut self,
        delta_id: &str,
        verdict: &serde_json::Value,
        legs: &[LegRecord],
        passed: bool,
    ) -> Result<(), StoreError> {
        let sq = sq_err(&self.path);
        let now = now_unix_ms() as i64;
        let tx = self.conn.transaction().map_err(&sq)?;
        let n = tx
            .execute(
                "UPDATE deltas SET verdict_json = ?2,
                 status = CASE WHEN ?3 THEN status ELSE 'rejected' END WHERE id = ?1",
                params![delta_id, json(verdict), passed],
            )
            .map_err(&sq)?;
        if n == 0 {
            return Err(StoreError::Refused(format!(
                "no delta `{delta_id}` to attach a verdict to"
            )));
        }
        tx.execute("DELETE FROM eval_results WHERE delta_id = ?1", [delta_id])
            .map_err(&sq)?;
        for l in legs {
            tx.execute(
                "INSERT INTO eval_results (delta_id, leg, base_score, candidate_score, tolerance, passed,
                 created_at_unix_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![delta_id, l.leg, l.baseline, l.candidate, l.tolerance, l.passed, now],
            )
            .map_err(&sq)?;
        }
        tx.commit().map_err(&sq)
    }

    /// Makes `delta_id` the served delta on its own chain (its user's, or the common one; a merged delta's: each
    /// of its members'). Refuses a delta
    /// without a verdict or with a failing one; the caller (the eval gate) has checked that the verdict is
    /// bound to this delta's bytes and to the served base.
    pub fn promote(&mut self, delta_id: &str, reason: &str) -> Result<ServedState, StoreError> {
        let record = self
            .delta(delta_id)?
            .ok_or_else(|| StoreError::Refused(format!("no delta `{delta_id}`")))?;
        if record.verdict.is_none() {
            return Err(StoreError::Refused(format!(
                "delta `{delta_id}` has no eval verdict"
            )));
        }
        if record.status == DeltaStatus::Rejected {
            return Err(StoreError::Refused(format!(
                "delta `{delta_id}` was rejected by the eval gate"
            )));
        }
        let sq = sq_err(&self.path);
        let now = now_unix_ms() as i64;
        let tx = self.conn.transaction().map_err(&sq)?;
        // A merged delta serves each of its members; any other, its own chain.
        let members = record.members();
        let chains: Vec<Option<String>> = if members.is_empty() {
            vec![record.user.clone()]
        } else {
            members.into_iter().map(Some).collect()
        };
        let mut seq = 0;
        for chain in &chains {
            let current: Option<i64> = tx
                .query_row(
                    "SELECT MAX(seq) FROM serving_log WHERE user IS ?1",
                    [chain],
                    |r| r.get(0),
                )
                .map_err(&sq)?;
            tx.execute(
                "INSERT INTO serving_log (delta_id, action, previous, reason, at_unix_ms, user)
                 VALUES (?1, 'promote', ?2, ?3, ?4, ?5)",
                params![delta_id, current, reason, now, chain],
            )
            .map_err(&sq)?;
            seq = tx.last_insert_rowid();
        }
        tx.execute(
            "UPDATE deltas SET status = 'promoted', promoted_at_unix_ms = ?2 WHERE id = ?1",
            params![delta_id, now],
        )
        .map_err(&sq)?;
        tx.commit().map_err(&sq)?;
        Ok(ServedState {
            seq: Some(seq),
            delta_id: Some(delta_id.to_owned()),
        })
    }

    /// Restores the common state served before the current one. The delta left is marked `rolled_back`.
    /// Returns `None` when nothing was ever promoted (the base alone is already served).
    pub fn rollback(&mut self, reason: &str) -> Result<Option<ServedState>, StoreError> {
        self.rollback_for(None, reason)
    }

    /// [`Store::rollback`] on one user's chain (`None`: the common one). Rolled back past the user's first
    /// delta, the user is served the common state again.
    pub fn rollback_for(
        &mut self,
        user: Option<&str>,
        reason: &str,
    ) -> Result<Option<ServedState>, StoreError> {
        let sq = sq_err(&self.path);
        let now = now_unix_ms() as i64;
        let tx = self.conn.transaction().map_err(&sq)?;
        let current: Option<(i64, Option<String>, Option<i64>)> = tx
            .query_row(
                "SELECT seq, delta_id, previous FROM serving_log WHERE user IS ?1
                 ORDER BY seq DESC LIMIT 1",
                [user],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(&sq)?;
        let Some((_, left, previous)) = current else {
            return Ok(None);
        };
        if left.is_none() && previous.is_none() {
            // Already back at the base with nothing before it.
            return Ok(None);
        }
        // The state to restore is the one `previous` entered, with that row's own predecessor.
        let (restored, before): (Option<String>, Option<i64>) = match previous {
            Some(p) => tx
                .query_row(
                    "SELECT delta_id, previous FROM serving_log WHERE seq = ?1",
                    [p],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(&sq)?,
            None => (None, None),
        };
        tx.execute(
            "INSERT INTO serving_log (delta_id, action, previous, reason, at_unix_ms, user)
             VALUES (?1, 'rollback', ?2, ?3, ?4, ?5)",
            params![restored, before, reason, now, user],
        )
        .map_err(&sq)?;
        let seq = tx.last_insert_rowid();
        if let Some(left) = &left
            && restored.as_deref() != Some(left.as_str())
            && !served_elsewhere(&tx, left, &sq)?
        {
            tx.execute(
                "UPDATE deltas SET status = 'rolled_back' WHERE id = ?1",
                [left],
            )
            .map_err(&sq)?;
        }
        if let Some(r) = &restored {
            tx.execute("UPDATE deltas SET status = 'promoted' WHERE id = ?1", [r])
                .map_err(&sq)?;
        }
        tx.commit().map_err(&sq)?;
        Ok(Some(ServedState {
            seq: Some(seq),
            delta_id: restored,
        }))
    }

    /// The common served state: the last row of the common chain.
    pub fn served(&self) -> Result<ServedState, StoreError> {
        self.served_on(None)
    }

    /// What `user` is served: their own chain's state when it serves a delta, else the common state.
    pub fn served_for(&self, user: &str) -> Result<ServedState, StoreError> {
        let own = self.served_on(Some(user))?;
        if own.delta_id.is_some() {
            return Ok(own);
        }
        self.served()
    }

    /// The served state of every user with a chain of their own, by user.
    pub fn served_users(&self) -> Result<Vec<(String, ServedState)>, StoreError> {
        self.conn
            .prepare(
                "SELECT s.user, s.seq, s.delta_id FROM serving_log s
                 JOIN (SELECT user, MAX(seq) AS seq FROM serving_log WHERE user IS NOT NULL GROUP BY user) h
                 ON s.seq = h.seq ORDER BY s.user",
            )
            .and_then(|mut s| {
                s.query_map([], |r| {
                    Ok((
                        r.get(0)?,
                        ServedState {
                            seq: Some(r.get(1)?),
                            delta_id: r.get(2)?,
                        },
                    ))
                })?
                .collect()
            })
            .map_err(self.sq())
    }

    /// The state of one chain (`None`: the common one), without falling back.
    pub fn served_on(&self, user: Option<&str>) -> Result<ServedState, StoreError> {
        let row: Option<(i64, Option<String>)> = self
            .conn
            .query_row(
                "SELECT seq, delta_id FROM serving_log WHERE user IS ?1 ORDER BY seq DESC LIMIT 1",
                [user],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(self.sq())?;
        Ok(match row {
            Some((seq, delta_id)) => ServedState {
                seq: Some(seq),
                delta_id,
            },
            None => ServedState {
                seq: None,
                delta_id: None,
            },
        })
    }

    /// When the newest delta was recorded (Unix ms); `None` before the first.
    pub fn last_delta_created_at(&self) -> Result<Option<u64>, StoreError> {
        let at: Option<i64> = self
            .conn
            .query_row("SELECT MAX(created_at_unix_ms) FROM deltas", [], |r| {
                r.get(0)
            })
            .map_err(self.sq())?;
        Ok(at.map(|t| t.max(0) as u64))
    }

    /// Every delta, oldest first.
    pub fn deltas(&self) -> Result<Vec<DeltaRecord>, StoreError> {
        let ids: Vec<String> = self
            .conn
            .prepare("SELECT id FROM deltas ORDER BY created_at_unix_ms, rowid")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(self.sq())?;
        ids.iter()
            .filter_map(|id| self.delta(id).transpose())
            .collect()
    }

    pub fn delta(&self, id: &str) -> Result<Option<DeltaRecord>, StoreError> {
        type Row = (
            String,
            String,
            String,
            String,
            Option<String>,
            String,
            String,
            Option<String>,
            i64,
            Option<i64>,
            Option<String>,
        );
        let row: Option<Row> = self
            .conn
            .query_row(
                "SELECT path, base_sha256, recipe_sha256, data_digest, parent, status, provenance_json, verdict_json,
                 created_at_unix_ms, promoted_at_unix_ms, user FROM deltas WHERE id = ?1",
                [id],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                        r.get(9)?,
                        r.get(10)?,
                    ))
                },
            )
            .optional()
            .map_err(self.sq())?;
        let Some((
            path,
            base,
            recipe,
            data,
            parent,
            status,
            provenance,
            verdict,
            created,
            promoted,
            user,
        )) = row
        else {
            return Ok(None);
        };
        let parse = |column: &'static str, text: &str| {
            serde_json::from_str(text).map_err(|source| StoreError::Json {
                table: "deltas",
                column,
                id: id.to_owned(),
                source,
            })
        };
        let legs = self
            .conn
            .prepare(
                "SELECT leg, base_score, candidate_score, tolerance, passed FROM eval_results
                 WHERE delta_id = ?1 ORDER BY rowid",
            )
            .and_then(|mut s| {
                s.query_map([id], |r| {
                    Ok(LegRecord {
                        leg: r.get(0)?,
                        baseline: r.get::<_, Option<f64>>(1)?.unwrap_or(f64::NAN),
                        candidate: r.get::<_, Option<f64>>(2)?.unwrap_or(f64::NAN),
                        tolerance: r.get::<_, Option<f64>>(3)?.unwrap_or(f64::NAN),
                        passed: r.get(4)?,
                    })
                })?
                .collect()
            })
            .map_err(self.sq())?;
        Ok(Some(DeltaRecord {
            id: id.to_owned(),
            path,
            base_sha256: base,
            recipe_sha256: recipe,
            data_digest: data,
            parent,
            user,
            status: DeltaStatus::parse(&status),
            provenance: parse("provenance_json", &provenance)?,
            verdict: verdict
                .as_deref()
                .map(|v| parse("verdict_json", v))
                .transpose()?,
            legs,
            created_at_unix_ms: created as u64,
            promoted_at_unix_ms: promoted.map(|p| p as u64),
        }))
    }
}

/// Deletes a delta's rows (its eval results, then the delta) and lists its adapter directory in `file_trash`,
/// inside the caller's transaction.
fn delete_delta_rows(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    path: &str,
    now: i64,
    sq: &impl Fn(rusqlite::Error) -> StoreError,
) -> Result<(), StoreError> {
    tx.execute("DELETE FROM eval_results WHERE delta_id = ?1", [id])
        .map_err(sq)?;
    tx.execute("DELETE FROM deltas WHERE id = ?1", [id])
        .map_err(sq)?;
    // Only a directory named for the delta is removed: it was made for it by `save_delta`.
    if Path::new(path).file_name() == Some(std::ffi::OsStr::new(id)) {
        tx.execute(
            "INSERT OR IGNORE INTO file_trash (path, at_unix_ms) VALUES (?1, ?2)",
            params![path, now],
        )
        .map_err(sq)?;
    }
    Ok(())
}

/// Deletes every delta of `user` with its verdicts and the user's served states, inside the caller's
/// transaction; the adapter directories wait in `file_trash` for [`Store::empty_file_trash`]. Returns the
/// deltas deleted.
pub(super) fn purge_user_deltas(
    tx: &rusqlite::Transaction<'_>,
    user: &str,
    sq: &impl Fn(rusqlite::Error) -> StoreError,
) -> Result<usize, StoreError> {
    tx.execute("DELETE FROM serving_log WHERE user = ?1", [user])
        .map_err(sq)?;
    let rows: Vec<(String, String)> = tx
        .prepare("SELECT id, path FROM deltas WHERE user = ?1")
        .and_then(|mut s| {
            s.query_map([user], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(sq)?;
    let now = now_unix_ms() as i64;
    for (id, path) in &rows {
        delete_delta_rows(tx, id, path, now, sq)?;
    }
    Ok(rows.len())
}

/// Whether any chain's served state is `delta_id` (a merged delta stays promoted while one member is served it).
fn served_elsewhere(
    tx: &rusqlite::Transaction<'_>,
    delta_id: &str,
    sq: &impl Fn(rusqlite::Error) -> StoreError,
) -> Result<bool, StoreError> {
    let n: i64 = tx
        .query_row(
            "SELECT COUNT(*) FROM serving_log s
             JOIN (SELECT MAX(seq) AS seq FROM serving_log GROUP BY user) h ON s.seq = h.seq
             WHERE s.delta_id = ?1",
            [delta_id],
            |r| r.get(0),
        )
        .map_err(sq)?;
    Ok(n > 0)
}

/// What a purge did to deltas other than the user's own: those trained partly on the user's data.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RetiredDeltas {
    /// Deltas whose [`TRAINED_ON`] lists the user, deleted with their verdicts and files.
    pub retired: Vec<String>,
    /// Each chain that served a retired delta, and what it serves now: the newest state on its rollback chain
    /// not trained on the user's data (`delta_id: None`: the base alone, or on a user's chain the common state).
    pub restored: Vec<RestoredChain>,
    /// Common deltas recorded before deltas listed their users: whether the user's data went into them is not
    /// known, so they are kept.
    pub unknown: Vec<String>,
}

/// One chain a purge moved back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestoredChain {
    /// `None`: the common chain.
    pub user: Option<String>,
    pub from: String,
    pub delta_id: Option<String>,
}

/// Retires, inside the caller's transaction, every delta whose [`TRAINED_ON`] lists `user` (run after the
/// user's own deltas are gone): each chain serving one is moved back, by a `rollback` row, to the newest state
/// on its rollback chain that is not retired; the retired deltas' `serving_log` rows are deleted and the rows
/// that pointed back to them point past them, so later rollbacks never reach one; then the deltas go.
pub(super) fn retire_trained_on(
    tx: &rusqlite::Transaction<'_>,
    user: &str,
    sq: &impl Fn(rusqlite::Error) -> StoreError,
) -> Result<RetiredDeltas, StoreError> {
    let rows: Vec<(String, String, Option<String>, String)> = tx
        .prepare(
            "SELECT id, path, user, provenance_json FROM deltas ORDER BY created_at_unix_ms, rowid",
        )
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect()
        })
        .map_err(sq)?;
    let mut out = RetiredDeltas::default();
    let mut paths = Vec::new();
    for (id, path, owner, prov) in rows {
        let provenance: serde_json::Value =
            serde_json::from_str(&prov).map_err(|source| StoreError::Json {
                table: "deltas",
                column: "provenance_json",
                id: id.clone(),
                source,
            })?;
        let record = DeltaRecord {
            id: id.clone(),
            path: path.clone(),
            base_sha256: String::new(),
            recipe_sha256: String::new(),
            data_digest: String::new(),
            parent: None,
            user: owner,
            status: DeltaStatus::Candidate,
            provenance,
            verdict: None,
            legs: Vec::new(),
            created_at_unix_ms: 0,
            promoted_at_unix_ms: None,
        };
        match record.trained_on() {
            Some(users) if users.iter().any(|u| u == user) => {
                out.retired.push(id.clone());
                paths.push((id, path));
            }
            Some(_) => {}
            None => out.unknown.push(id),
        }
    }
    if out.retired.is_empty() {
        return Ok(out);
    }
    let retired: std::collections::HashSet<&str> = out.retired.iter().map(String::as_str).collect();
    // The whole log: seq -> (delta, previous, chain).
    type LogRow = (Option<String>, Option<i64>, Option<String>);
    let log: std::collections::BTreeMap<i64, LogRow> = tx
        .prepare("SELECT seq, delta_id, previous, user FROM serving_log")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?))))?
                .collect()
        })
        .map_err(sq)?;
    let gone = |seq: &i64| {
        log.get(seq)
            .and_then(|(d, _, _)| d.as_deref())
            .is_some_and(|d| retired.contains(d))
    };
    // The nearest row at or before `seq` on its rollback chain that stays.
    let kept_from = |mut seq: Option<i64>| {
        while let Some(s) = seq {
            if !gone(&s) {
                return Some(s);
            }
            seq = log.get(&s).and_then(|(_, p, _)| *p);
        }
        None
    };
    let mut heads: std::collections::BTreeMap<Option<String>, i64> = Default::default();
    for (&seq, (_, _, chain)) in &log {
        heads.insert(chain.clone(), seq);
    }
    for (&seq, (_, previous, _)) in &log {
        if !gone(&seq)
            && let Some(p) = previous
            && gone(p)
        {
            tx.execute(
                "UPDATE serving_log SET previous = ?2 WHERE seq = ?1",
                params![seq, kept_from(Some(*p))],
            )
            .map_err(sq)?;
        }
    }
    let now = now_unix_ms() as i64;
    for (chain, head) in heads {
        if !gone(&head) {
            continue;
        }
        let from = log[&head].0.clone().unwrap_or_default();
        let restored = kept_from(Some(head));
        let (delta_id, before) = match restored {
            Some(r) => (log[&r].0.clone(), kept_from(log[&r].1)),
            None => (None, None),
        };
        tx.execute(
            "INSERT INTO serving_log (delta_id, action, previous, reason, at_unix_ms, user)
             VALUES (?1, 'rollback', ?2, ?3, ?4, ?5)",
            params![
                delta_id,
                before,
                format!("purge of user `{user}`: `{from}` was trained partly on their data"),
                now,
                chain
            ],
        )
        .map_err(sq)?;
        if let Some(d) = &delta_id {
            tx.execute("UPDATE deltas SET status = 'promoted' WHERE id = ?1", [d])
                .map_err(sq)?;
        }
        out.restored.push(RestoredChain {
            user: chain,
            from,
            delta_id,
        });
    }
    for seq in log.keys().filter(|&s| gone(s)) {
        tx.execute("DELETE FROM serving_log WHERE seq = ?1", [seq])
            .map_err(sq)?;
    }
    for (id, path) in &paths {
        delete_delta_rows(tx, id, path, now, sq)?;
    }
    Ok(out)
}

/// How many route-or-merge decisions the store keeps, newest first.
pub const KEEP_RECONCILIATIONS: usize = 64;

impl Store {
    /// Records one route-or-merge decision, and keeps the newest [`KEEP_RECONCILIATIONS`].
    pub fn record_reconciliation(&mut self, report: &serde_json::Value) -> Result<i64, StoreError> {
        let sq = sq_err(&self.path);
        let tx = self.conn.transaction().map_err(&sq)?;
        tx.execute(
            "INSERT INTO reconciliations (at_unix_ms, report_json) VALUES (?1, ?2)",
            params![now_unix_ms() as i64, json(report)],
        )
        .map_err(&sq)?;
        let id = tx.last_insert_rowid();
        tx.execute(
            "DELETE FROM reconciliations WHERE id <= ?1",
            [id - KEEP_RECONCILIATIONS as i64],
        )
        .map_err(&sq)?;
        tx.commit().map_err(&sq)?;
        Ok(id)
    }

    /// The newest `limit` route-or-merge decisions, newest first: (id, when, the record).
    pub fn reconciliations(
        &self,
        limit: usize,
    ) -> Result<Vec<(i64, u64, serde_json::Value)>, StoreError> {
        let rows: Vec<(i64, i64, String)> = self
            .conn
            .prepare(
                "SELECT id, at_unix_ms, report_json FROM reconciliations ORDER BY id DESC LIMIT ?1",
            )
            .and_then(|mut s| {
                s.query_map([limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect()
            })
            .map_err(self.sq())?;
        rows.into_iter()
            .map(|(id, at, text)| {
                let v = serde_json::from_str(&text).map_err(|source| StoreError::Json {
                    table: "reconciliations",
                    column: "report_json",
                    id: id.to_string(),
                    source,
                })?;
                Ok((id, at.max(0) as u64, v))
            })
            .collect()
    }
}

/// Deletes the recorded route-or-merge decisions whose inputs name `user`, inside the caller's transaction.
pub(super) fn purge_user_reconciliations(
    tx: &rusqlite::Transaction<'_>,
    user: &str,
    sq: &impl Fn(rusqlite::Error) -> StoreError,
) -> Result<usize, StoreError> {
    let rows: Vec<(i64, String)> = tx
        .prepare("SELECT id, report_json FROM reconciliations")
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(sq)?;
    let mut n = 0;
    for (id, text) in rows {
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        // Unreadable rows go too: they may name the user.
        let names = v["inputs"].as_array().is_none_or(|inputs| {
            inputs.iter().any(|i| {
                i["users"]
                    .as_array()
                    .is_some_and(|us| us.iter().any(|u| u.as_str() == Some(user)))
            })
        });
        if names {
            n += tx
                .execute("DELETE FROM reconciliations WHERE id = ?1", [id])
                .map_err(sq)?;
        }
    }
    Ok(n)
}
