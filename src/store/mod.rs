//! The durable store: one SQLite database (WAL mode) in the data directory, openable with any SQLite tool.
//!
//! It holds what was captured (interactions, feedback), each item's curation state (pending until exactly one
//! terminal decision: admitted, dropped or quarantined), the training set, quarantined samples awaiting a
//! person, deltas, eval results and dead letters. Every write that belongs together is one transaction, and
//! state changes are conditional (`WHERE state = 'pending'`), so replaying unfinished work after a crash is
//! idempotent: nothing is lost and nothing is counted twice.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

mod deltas;
mod timeline;

pub use deltas::{
    DeltaRecord, DeltaRetention, DeltaStatus, LegRecord, MEMBERS, PrunedDeltas, RestoredChain,
    RetiredDeltas, ServedState, TRAINED_ON,
};
pub use timeline::CurationTimeline;

use crate::clock::now_unix_ms;
use crate::message::{
    Decision, Feedback, FeedbackKind, Interaction, Origin, Outcome, Provenance, Sample,
    SampleContent,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("store {path}: cannot create directory: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store: corrupt JSON in {table}.{column} for id {id}: {source}")]
    Json {
        table: &'static str,
        column: &'static str,
        id: String,
        source: serde_json::Error,
    },
    #[error("store: cannot remove {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store: {0}")]
    Refused(String),
    #[error(
        "store {path} has schema version {found}, newer than this hearth ({known}); upgrade hearth"
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        known: usize,
    },
}

/// Versioned migrations, applied in order inside one transaction each; `PRAGMA user_version` records progress.
const MIGRATIONS: &[&str] = &[
    // 1: capture, curation, training set, quarantine, deltas, eval results, dead letters.
    "CREATE TABLE interactions (
        id TEXT PRIMARY KEY, user TEXT NOT NULL, adapter TEXT, prompt_json TEXT, response TEXT,
        sampling_json TEXT NOT NULL, created_at_unix_ms INTEGER NOT NULL, latency_ms INTEGER NOT NULL,
        raw_purged_at_unix_ms INTEGER);
     CREATE TABLE feedback (
        id TEXT PRIMARY KEY, response_id TEXT NOT NULL, user TEXT NOT NULL, kind_json TEXT,
        created_at_unix_ms INTEGER NOT NULL, raw_purged_at_unix_ms INTEGER);
     CREATE INDEX feedback_by_response ON feedback(response_id);
     CREATE TABLE curation (
        sample_id TEXT PRIMARY KEY, user TEXT NOT NULL, source TEXT NOT NULL CHECK (source IN ('interaction','feedback')),
        state TEXT NOT NULL CHECK (state IN ('pending','admitted','dropped','quarantined')),
        node TEXT, reason TEXT, updated_at_unix_ms INTEGER NOT NULL);
     CREATE INDEX curation_by_state ON curation(state);
     CREATE TABLE training_set (
        sample_id TEXT PRIMARY KEY REFERENCES curation(sample_id), user TEXT NOT NULL,
        sample_json TEXT NOT NULL, admitted_at_unix_ms INTEGER NOT NULL);
     CREATE TABLE quarantine (
        sample_id TEXT PRIMARY KEY REFERENCES curation(sample_id), user TEXT NOT NULL, node TEXT NOT NULL,
        reason TEXT NOT NULL, sample_json TEXT NOT NULL, created_at_unix_ms INTEGER NOT NULL);
     CREATE TABLE deltas (
        id TEXT PRIMARY KEY, path TEXT NOT NULL, base_sha256 TEXT NOT NULL, recipe_sha256 TEXT NOT NULL,
        data_digest TEXT NOT NULL, parent TEXT,
        status TEXT NOT NULL CHECK (status IN ('candidate','promoted','rejected','rolled_back')),
        provenance_json TEXT NOT NULL, created_at_unix_ms INTEGER NOT NULL);
     CREATE TABLE eval_results (
        delta_id TEXT NOT NULL REFERENCES deltas(id), leg TEXT NOT NULL, base_score REAL, candidate_score REAL,
        tolerance REAL, passed INTEGER NOT NULL, created_at_unix_ms INTEGER NOT NULL, PRIMARY KEY (delta_id, leg));
     CREATE TABLE dead_letters (
        id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, worker INTEGER NOT NULL, error TEXT NOT NULL,
        message_json TEXT NOT NULL, at_unix_ms INTEGER NOT NULL);",
    // 2: the eval gate's verdicts and the served state. `serving_log` is append-only (retention deletes only
    // rows no rollback can reach): each row is the state entered (`delta_id`, NULL = the base alone) and the
    // row that was current before it, so rollback walks back exactly, any number of times.
    "ALTER TABLE deltas ADD COLUMN verdict_json TEXT;
     ALTER TABLE deltas ADD COLUMN promoted_at_unix_ms INTEGER;
     CREATE TABLE serving_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, delta_id TEXT REFERENCES deltas(id),
        action TEXT NOT NULL CHECK (action IN ('promote','rollback')), previous INTEGER,
        reason TEXT NOT NULL, at_unix_ms INTEGER NOT NULL);",
    // 3: retention. Files whose rows are already deleted (a pruned delta's adapter directory) wait here until
    // they are gone from disk, so a crash between the two leaves a list to finish, not unreferenced files.
    // Admission time is what the training window ages by.
    "CREATE TABLE file_trash (path TEXT PRIMARY KEY, at_unix_ms INTEGER NOT NULL);
     CREATE INDEX training_set_by_admission ON training_set(admitted_at_unix_ms);",
    // 4: per-user deltas. A delta's `user` (NULL: the common delta everyone without their own is served), and
    // the served state per user: each `serving_log` row belongs to one user's chain (NULL: the common chain,
    // all there was before), and its `previous` is a row of the same chain.
    "ALTER TABLE deltas ADD COLUMN user TEXT;
     ALTER TABLE serving_log ADD COLUMN user TEXT;
     CREATE INDEX deltas_by_user ON deltas(user);
     CREATE INDEX serving_log_by_user ON serving_log(user, seq);",
    // 5: route or merge. Each run of the decision over users' deltas, with its measures and outcome, as JSON
    // (`train::reconcile::Reconciliation`).
    "CREATE TABLE reconciliations (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at_unix_ms INTEGER NOT NULL, report_json TEXT NOT NULL);",
];

/// Counts for reports: how many items sit in each curation state, and why items were dropped.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CurationCounts {
    pub interactions: u64,
    pub feedback: u64,
    pub pending: u64,
    pub admitted: u64,
    pub dropped: u64,
    pub quarantined: u64,
    /// `(node, reason, count)` for dropped and quarantined items, most frequent first.
    pub reasons: Vec<(String, String, u64)>,
}

/// A quarantined sample as `hearth quarantine list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuarantinedSample {
    pub sample: Sample,
    pub node: String,
    pub reason: String,
}

/// What `purge_user` removed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PurgeCounts {
    pub interactions: usize,
    pub feedback: usize,
    pub curation: usize,
    pub training_set: usize,
    pub quarantine: usize,
    /// The user's own deltas (rows, verdicts and adapter directories) and their served states.
    pub deltas: usize,
    /// Recorded route-or-merge decisions that named the user.
    pub reconciliations: usize,
    /// Other deltas trained partly on the user's data (common or merged ones), retired, and the chains that
    /// served them, moved back.
    pub trained_on: RetiredDeltas,
}

pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    pub const FILE_NAME: &'static str = "hearth.sqlite";

    /// Opens (creating and migrating) `dir/hearth.sqlite`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(Self::FILE_NAME);
        // Actors open the store concurrently; while one converts a fresh file to WAL, SQLite can answer
        // "busy" without consulting the busy handler, so the whole setup retries for a while.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match Self::configure(&path) {
                Err(StoreError::Sqlite { source, .. })
                    if is_busy(&source) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                result => return result,
            }
        }
    }

    fn configure(path: &Path) -> Result<Store, StoreError> {
        let sq = sq_err(path);
        let conn = Connection::open(path).map_err(&sq)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(&sq)?;
        // WAL: readers never block the writer. synchronous=NORMAL in WAL mode keeps every committed
        // transaction across a process crash (kill -9); only an OS crash or power loss can lose the last ones.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(&sq)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(&sq)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(&sq)?;
        // Purged and erased text must not linger in freed space.
        conn.pragma_update(None, "secure_delete", "ON")
            .map_err(&sq)?;
        let mut store = Store {
            conn,
            path: path.to_path_buf(),
        };
        store.migrate()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sq(&self) -> impl Fn(rusqlite::Error) -> StoreError + use<> {
        sq_err(&self.path)
    }

    /// Applies missing migrations. Each runs in an IMMEDIATE transaction that re-reads the version inside it,
    /// so actors opening the store concurrently never apply one twice.
    fn migrate(&mut self) -> Result<(), StoreError> {
        let sq = sq_err(&self.path);
        // The common case, an up-to-date file, needs no write lock (actors that poll the store open it often).
        let current: i64 = self
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(&sq)?;
        if current == MIGRATIONS.len() as i64 {
            return Ok(());
        }
        loop {
            let tx = self
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(&sq)?;
            let version: i64 = tx
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(&sq)?;
            let version = version.max(0) as usize;
            if version > MIGRATIONS.len() {
                return Err(StoreError::TooNew {
                    path: self.path.clone(),
                    found: version as i64,
                    known: MIGRATIONS.len(),
                });
            }
            let Some(sql) = MIGRATIONS.get(version) else {
                return Ok(());
            };
            tx.execute_batch(sql).map_err(&sq)?;
            tx.pragma_update(None, "user_version", (version + 1) as i64)
                .map_err(&sq)?;
            tx.commit().map_err(&sq)?;
        }
    }

    /// Records an interaction and its pending curation entry in one transaction. Returns the samples to curate:
    /// the interaction's own, plus any feedback on it that arrived first; none if it was captured before (a
    /// replayed or resent request).
    pub fn capture_interaction(&mut self, i: &Interaction) -> Result<Vec<Sample>, StoreError> {
        let sq = sq_err(&self.path);
        let tx = self.conn.transaction().map_err(&sq)?;
        let inserted = tx
            .execute(
                "INSERT OR IGNORE INTO interactions
                 (id, user, adapter, prompt_json, response, sampling_json, created_at_unix_ms, latency_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    i.id,
                    i.user,
                    i.adapter,
                    json(&i.prompt),
                    i.response,
                    i.sampling.to_string(),
                    i.created_at_unix_ms as i64,
                    i.latency_ms as i64
                ],
            )
            .map_err(&sq)?;
        if inserted == 0 {
            return Ok(Vec::new());
        }
        insert_pending(&tx, &i.id, &i.user, "interaction").map_err(&sq)?;
        tx.commit().map_err(&sq)?;
        let mut samples = vec![interaction_sample(i)];
        for f in self.pending_feedback_on(&i.id)? {
            samples.push(feedback_sample(&f, i));
        }
        Ok(samples)
    }

    /// Pending feedback on one response: feedback that arrived before its interaction waits here.
    fn pending_feedback_on(&self, response_id: &str) -> Result<Vec<Feedback>, StoreError> {
        let ids = self.ids(
            "SELECT f.id FROM feedback f JOIN curation c ON c.sample_id = f.id AND c.state = 'pending'
             WHERE f.response_id = ?1 ORDER BY f.rowid",
            [response_id],
        )?;
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            found.extend(self.feedback(&id)?);
        }
        Ok(found)
    }

    /// The first column of a query's rows.
    fn ids<P: rusqlite::Params>(&self, sql: &str, params: P) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.conn.prepare(sql).map_err(self.sq())?;
        stmt.query_map(params, |r| r.get(0))
            .map_err(self.sq())?
            .collect::<Result<_, _>>()
            .map_err(self.sq())
    }

    /// One feedback event; `None` if unknown or if retention already erased it.
    fn feedback(&self, id: &str) -> Result<Option<Feedback>, StoreError> {
        let row: Option<(String, String, Option<String>, i64)> = self
            .conn
            .query_row(
                "SELECT response_id, user, kind_json, created_at_unix_ms FROM feedback WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(self.sq())?;
        let Some((response_id, user, Some(kind), created)) = row else {
            return Ok(None);
        };
        let kind = serde_json::from_str(&kind).map_err(|source| StoreError::Json {
            table: "feedback",
            column: "kind_json",
            id: id.to_owned(),
            source,
        })?;
        Ok(Some(Feedback {
            id: id.to_owned(),
            response_id,
            user,
            kind,
            created_at_unix_ms: created as u64,
            commit: Default::default(),
        }))
    }

    /// Records feedback and its pending curation entry. Returns the derived training sample; none if this
    /// feedback was captured before, or if its interaction has not arrived yet (interactions and feedback
    /// travel on different edges): capturing that interaction returns it then.
    pub fn capture_feedback(&mut self, f: &Feedback) -> Result<Vec<Sample>, StoreError> {
        let sq = sq_err(&self.path);
        let tx = self.conn.transaction().map_err(&sq)?;
        let inserted = tx
            .execute(
                "INSERT OR IGNORE INTO feedback (id, response_id, user, kind_json, created_at_unix_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    f.id,
                    f.response_id,
                    f.user,
                    json(&f.kind),
                    f.created_at_unix_ms as i64
                ],
            )
            .map_err(&sq)?;
        if inserted == 0 {
            return Ok(Vec::new());
        }
        insert_pending(&tx, &f.id, &f.user, "feedback").map_err(&sq)?;
        tx.commit().map_err(&sq)?;
        Ok(match self.interaction(&f.response_id)? {
            Some(i) => vec![feedback_sample(f, &i)],
            None => Vec::new(),
        })
    }

    fn interaction(&self, id: &str) -> Result<Option<Interaction>, StoreError> {
        let row = self
            .conn
            .query_row(
                "SELECT id, user, adapter, prompt_json, response, sampling_json, created_at_unix_ms, latency_ms
                 FROM interactions WHERE id = ?1",
                [id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, Option<String>>(2)?,
                        r.get::<_, Option<String>>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, String>(5)?,
                        r.get::<_, i64>(6)?,
                        r.get::<_, i64>(7)?,
                    ))
                },
            )
            .optional()
            .map_err(self.sq())?;
        let Some((id, user, adapter, prompt, response, sampling, created, latency)) = row else {
            return Ok(None);
        };
        let parse = |column: &'static str, text: &str| -> Result<serde_json::Value, StoreError> {
            serde_json::from_str(text).map_err(|source| StoreError::Json {
                table: "interactions",
                column,
                id: id.clone(),
                source,
            })
        };
        let prompt = match prompt {
            Some(p) => serde_json::from_value(parse("prompt_json", &p)?).map_err(|source| {
                StoreError::Json {
                    table: "interactions",
                    column: "prompt_json",
                    id: id.clone(),
                    source,
                }
            })?,
            None => Vec::new(),
        };
        Ok(Some(Interaction {
            sampling: parse("sampling_json", &sampling)?,
            id,
            user,
            adapter,
            prompt,
            response: response.unwrap_or_default(),
            created_at_unix_ms: created as u64,
            latency_ms: latency as u64,
            commit: Default::default(),
        }))
    }

    /// Rebuilds the samples of every item still pending, oldest first: what a restart must curate again.
    pub fn pending_samples(&self) -> Result<Vec<Sample>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT sample_id, source FROM curation WHERE state = 'pending' ORDER BY rowid",
            )
            .map_err(self.sq())?;
        let rows: Vec<(String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(self.sq())?
            .collect::<Result<_, _>>()
            .map_err(self.sq())?;
        let mut samples = Vec::with_capacity(rows.len());
        for (id, source) in rows {
            if source == "interaction" {
                samples.extend(self.interaction(&id)?.map(|i| interaction_sample(&i)));
            } else if let Some(f) = self.feedback(&id)?
                && let Some(i) = self.interaction(&f.response_id)?
            {
                // Feedback whose interaction has not arrived yet stays pending until it does.
                samples.push(feedback_sample(&f, &i));
            }
        }
        Ok(samples)
    }

    /// Moves a pending item to the training set. Returns false if it already had a terminal state (a replay).
    pub fn admit(&mut self, sample: &Sample) -> Result<bool, StoreError> {
        let sq = sq_err(&self.path);
        let now = now_unix_ms() as i64;
        let tx = self.conn.transaction().map_err(&sq)?;
        let changed = tx
            .execute(
                "UPDATE curation SET state = 'admitted', node = NULL, reason = NULL, updated_at_unix_ms = ?2
                 WHERE sample_id = ?1 AND state = 'pending'",
                params![sample.id, now],
            )
            .map_err(&sq)?;
        if changed == 1 {
            insert_training(&tx, sample, now).map_err(&sq)?;
        }
        tx.commit().map_err(&sq)?;
        Ok(changed == 1)
    }

    /// Records a drop or quarantine for a pending item. Quarantined samples are kept (already redacted as far
    /// as curation got) for a person to review. Returns false if the item already had a terminal state.
    pub fn decide(&mut self, d: &Decision) -> Result<bool, StoreError> {
        let sq = sq_err(&self.path);
        let now = now_unix_ms() as i64;
        let state = match d.outcome {
            Outcome::Dropped => "dropped",
            Outcome::Quarantined => "quarantined",
        };
        let tx = self.conn.transaction().map_err(&sq)?;
        let changed = tx
            .execute(
                "UPDATE curation SET state = ?2, node = ?3, reason = ?4, updated_at_unix_ms = ?5
                 WHERE sample_id = ?1 AND state = 'pending'",
                params![d.sample.id, state, d.node, d.reason, now],
            )
            .map_err(&sq)?;
        if changed == 1 && d.outcome == Outcome::Quarantined {
            tx.execute(
                "INSERT INTO quarantine (sample_id, user, node, reason, sample_json, created_at_unix_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![d.sample.id, d.sample.user, d.node, d.reason, json(&d.sample), now],
            )
            .map_err(&sq)?;
        }
        tx.commit().map_err(&sq)?;
        Ok(changed == 1)
    }

    pub fn quarantine_list(&self) -> Result<Vec<QuarantinedSample>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT sample_id, node, reason, sample_json FROM quarantine ORDER BY created_at_unix_ms, rowid")
            .map_err(self.sq())?;
        let rows: Vec<(String, String, String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(self.sq())?
            .collect::<Result<_, _>>()
            .map_err(self.sq())?;
        rows.into_iter()
            .map(|(id, node, reason, sample)| {
                Ok(QuarantinedSample {
                    sample: serde_json::from_str(&sample).map_err(|source| StoreError::Json {
                        table: "quarantine",
                        column: "sample_json",
                        id,
                        source,
                    })?,
                    node,
                    reason,
                })
            })
            .collect()
    }

    /// A person judged a quarantined sample fine: it joins the training set. Returns false if no such sample.
    pub fn quarantine_release(&mut self, sample_id: &str) -> Result<bool, StoreError> {
        let Some(q) = self
            .quarantine_list()?
            .into_iter()
            .find(|q| q.sample.id == sample_id)
        else {
            return Ok(false);
        };
        let sq = sq_err(&self.path);
        let now = now_unix_ms() as i64;
        let mut sample = q.sample;
        sample.record("quarantine", "released", serde_json::Value::Null);
        let tx = self.conn.transaction().map_err(&sq)?;
        tx.execute("DELETE FROM quarantine WHERE sample_id = ?1", [sample_id])
            .map_err(&sq)?;
        tx.execute(
            "UPDATE curation SET state = 'admitted', node = 'quarantine', reason = 'released by a person',
             updated_at_unix_ms = ?2 WHERE sample_id = ?1",
            params![sample_id, now],
        )
        .map_err(&sq)?;
        insert_training(&tx, &sample, now).map_err(&sq)?;
        tx.commit().map_err(&sq)?;
        Ok(true)
    }

    /// Deletes quarantined samples (one, or all with `None`); their items become `dropped`.
    pub fn quarantine_purge(&mut self, sample_id: Option<&str>) -> Result<usize, StoreError> {
        let sq = sq_err(&self.path);
        let now = now_unix_ms() as i64;
        let tx = self.conn.transaction().map_err(&sq)?;
        let filter = "(?1 IS NULL OR sample_id = ?1)";
        tx.execute(
            &format!(
                "UPDATE curation SET state = 'dropped', reason = 'purged from quarantine by a person',
                 updated_at_unix_ms = ?2 WHERE state = 'quarantined' AND {filter}"
            ),
            params![sample_id, now],
        )
        .map_err(&sq)?;
        let n = tx
            .execute(
                &format!("DELETE FROM quarantine WHERE {filter}"),
                params![sample_id],
            )
            .map_err(&sq)?;
        tx.commit().map_err(&sq)?;
        Ok(n)
    }

    /// Deletes everything held about one user, in every table, in one transaction: with their own deltas, every
    /// delta trained partly on their data (see [`RetiredDeltas`]).
    pub fn purge_user(&mut self, user: &str) -> Result<PurgeCounts, StoreError> {
        let sq = sq_err(&self.path);
        let tx = self.conn.transaction().map_err(&sq)?;
        let counts = PurgeCounts {
            training_set: tx
                .execute("DELETE FROM training_set WHERE user = ?1", [user])
                .map_err(&sq)?,
            quarantine: tx
                .execute("DELETE FROM quarantine WHERE user = ?1", [user])
                .map_err(&sq)?,
            curation: tx
                .execute("DELETE FROM curation WHERE user = ?1", [user])
                .map_err(&sq)?,
            feedback: tx
                .execute("DELETE FROM feedback WHERE user = ?1", [user])
                .map_err(&sq)?,
            interactions: tx
                .execute("DELETE FROM interactions WHERE user = ?1", [user])
                .map_err(&sq)?,
            deltas: deltas::purge_user_deltas(&tx, user, &sq)?,
            reconciliations: deltas::purge_user_reconciliations(&tx, user, &sq)?,
            trained_on: deltas::retire_trained_on(&tx, user, &sq)?,
        };
        tx.commit().map_err(&sq)?;
        self.empty_file_trash()?;
        // A purge is rare and must be complete: rebuild the file so no freed page keeps the user's text.
        self.conn.execute_batch("VACUUM;").map_err(&sq)?;
        self.checkpoint()?;
        Ok(counts)
    }

    /// Folds the WAL back into the database and truncates it, so erased text does not survive in old WAL
    /// frames either.
    fn checkpoint(&self) -> Result<(), StoreError> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(self.sq())
    }

    /// Deletes the records of items decided (admitted or dropped) more than `older_than` ago whose raw text is
    /// already erased: the item rows, and their curation rows once the training window no longer holds their
    /// samples, so a long run's store stays bounded. Kept: an
    /// interaction that feedback still waits on, and quarantined items (a person decides those). Feedback
    /// still pending after `older_than` whose interaction is gone (a reaction to a pruned response) is deleted
    /// too, as it can never be paired. What training needs is in the training set, under its own window.
    pub fn prune_records(&mut self, older_than: Duration) -> Result<usize, StoreError> {
        let cutoff = now_unix_ms().saturating_sub(older_than.as_millis() as u64) as i64;
        let sq = sq_err(&self.path);
        let tx = self.conn.transaction().map_err(&sq)?;
        let decided = "SELECT sample_id FROM curation
                       WHERE state IN ('admitted', 'dropped') AND updated_at_unix_ms <= ?1";
        let interactions = tx
            .execute(
                &format!(
                    "DELETE FROM interactions WHERE raw_purged_at_unix_ms IS NOT NULL AND id IN ({decided})
                     AND NOT EXISTS (SELECT 1 FROM curation c JOIN feedback f ON f.id = c.sample_id
                       WHERE f.response_id = interactions.id AND c.state = 'pending')"
                ),
                [cutoff],
            )
            .map_err(&sq)?;
        let feedback = tx
            .execute(
                &format!(
                    "DELETE FROM feedback WHERE (raw_purged_at_unix_ms IS NOT NULL AND id IN ({decided}))
                     OR (id IN (SELECT sample_id FROM curation
                                WHERE state = 'pending' AND updated_at_unix_ms <= ?1)
                         AND response_id NOT IN (SELECT id FROM interactions))"
                ),
                [cutoff],
            )
            .map_err(&sq)?;
        // A curation row goes with its item, except while the training window still holds the sample.
        tx.execute(
            "DELETE FROM curation WHERE state != 'quarantined'
             AND sample_id NOT IN (SELECT id FROM interactions)
             AND sample_id NOT IN (SELECT id FROM feedback)
             AND sample_id NOT IN (SELECT sample_id FROM training_set)",
            [],
        )
        .map_err(&sq)?;
        tx.commit().map_err(&sq)?;
        Ok(interactions + feedback)
    }

    /// Erases the raw captured text of items whose curation finished more than `older_than` ago. Raw text is the
    /// most sensitive thing held; what training needs is already in the training set, redacted.
    pub fn apply_retention(&mut self, older_than: Duration) -> Result<usize, StoreError> {
        let cutoff = now_unix_ms().saturating_sub(older_than.as_millis() as u64) as i64;
        let now = now_unix_ms() as i64;
        let sq = sq_err(&self.path);
        let tx = self.conn.transaction().map_err(&sq)?;
        let n = tx
            .execute(
                "UPDATE interactions SET prompt_json = NULL, response = NULL, raw_purged_at_unix_ms = ?2
                 WHERE raw_purged_at_unix_ms IS NULL AND id IN (
                   SELECT sample_id FROM curation WHERE state != 'pending' AND updated_at_unix_ms <= ?1)
                 AND NOT EXISTS (SELECT 1 FROM curation c JOIN feedback f ON f.id = c.sample_id
                   WHERE f.response_id = interactions.id AND c.state = 'pending')",
                params![cutoff, now],
            )
            .map_err(&sq)?;
        let m = tx
            .execute(
                "UPDATE feedback SET kind_json = NULL, raw_purged_at_unix_ms = ?2
                 WHERE raw_purged_at_unix_ms IS NULL AND id IN (
                   SELECT sample_id FROM curation WHERE state != 'pending' AND updated_at_unix_ms <= ?1)",
                params![cutoff, now],
            )
            .map_err(&sq)?;
        tx.commit().map_err(&sq)?;
        if n + m > 0 {
            self.checkpoint()?;
        }
        Ok(n + m)
    }

    pub fn counts(&self) -> Result<CurationCounts, StoreError> {
        let one = |sql: &str| -> Result<u64, StoreError> {
            self.conn
                .query_row(sql, [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(self.sq())
        };
        let state = |s: &str| {
            one(&format!(
                "SELECT COUNT(*) FROM curation WHERE state = '{s}'"
            ))
        };
        let mut stmt = self
            .conn
            .prepare(
                "SELECT COALESCE(node, ''), COALESCE(reason, ''), COUNT(*) FROM curation
                 WHERE state IN ('dropped', 'quarantined') GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2",
            )
            .map_err(self.sq())?;
        let reasons = stmt
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64))
            })
            .map_err(self.sq())?
            .collect::<Result<_, _>>()
            .map_err(self.sq())?;
        Ok(CurationCounts {
            interactions: one("SELECT COUNT(*) FROM interactions")?,
            feedback: one("SELECT COUNT(*) FROM feedback")?,
            pending: state("pending")?,
            admitted: state("admitted")?,
            dropped: state("dropped")?,
            quarantined: state("quarantined")?,
            reasons,
        })
    }

    /// Every sample in the training set, in admission order.
    pub fn training_set(&self) -> Result<Vec<Sample>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT sample_id, sample_json FROM training_set ORDER BY rowid")
            .map_err(self.sq())?;
        let rows: Vec<(String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(self.sq())?
            .collect::<Result<_, _>>()
            .map_err(self.sq())?;
        rows.into_iter()
            .map(|(id, s)| {
                serde_json::from_str(&s).map_err(|source| StoreError::Json {
                    table: "training_set",
                    column: "sample_json",
                    id,
                    source,
                })
            })
            .collect()
    }

    /// The training set with each sample's admission time (Unix ms), in admission order.
    pub fn training_set_admitted(&self) -> Result<Vec<(u64, Sample)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT sample_id, sample_json, admitted_at_unix_ms FROM training_set ORDER BY rowid",
            )
            .map_err(self.sq())?;
        let rows: Vec<(String, String, i64)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(self.sq())?
            .collect::<Result<_, _>>()
            .map_err(self.sq())?;
        rows.into_iter()
            .map(|(id, s, at)| {
                let sample = serde_json::from_str(&s).map_err(|source| StoreError::Json {
                    table: "training_set",
                    column: "sample_json",
                    id,
                    source,
                })?;
                Ok((at.max(0) as u64, sample))
            })
            .collect()
    }

    /// Deletes training-set rows outside the training window: all but the `keep_last` most recently admitted,
    /// and those admitted before `admitted_before_unix_ms`. Their items stay `admitted` in `curation`.
    pub fn prune_training_set(
        &mut self,
        keep_last: Option<usize>,
        admitted_before_unix_ms: Option<u64>,
    ) -> Result<usize, StoreError> {
        let sq = sq_err(&self.path);
        let tx = self.conn.transaction().map_err(&sq)?;
        let mut n = 0;
        if let Some(cutoff) = admitted_before_unix_ms {
            n += tx
                .execute(
                    "DELETE FROM training_set WHERE admitted_at_unix_ms < ?1",
                    [cutoff as i64],
                )
                .map_err(&sq)?;
        }
        if let Some(keep) = keep_last {
            n += tx
                .execute(
                    "DELETE FROM training_set WHERE rowid NOT IN
                     (SELECT rowid FROM training_set ORDER BY rowid DESC LIMIT ?1)",
                    [keep as i64],
                )
                .map_err(&sq)?;
        }
        tx.commit().map_err(&sq)?;
        Ok(n)
    }

    /// `PRAGMA integrity_check`: "ok" when the database is sound.
    pub fn integrity_check(&self) -> Result<String, StoreError> {
        self.conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(self.sq())
    }
}

/// A new item's curation entry: pending until exactly one terminal decision.
fn insert_pending(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    user: &str,
    source: &str,
) -> rusqlite::Result<usize> {
    tx.execute(
        "INSERT INTO curation (sample_id, user, source, state, updated_at_unix_ms) VALUES (?1, ?2, ?3, 'pending', ?4)",
        params![id, user, source, now_unix_ms() as i64],
    )
}

fn insert_training(
    tx: &rusqlite::Transaction<'_>,
    sample: &Sample,
    now: i64,
) -> rusqlite::Result<usize> {
    tx.execute(
        "INSERT INTO training_set (sample_id, user, sample_json, admitted_at_unix_ms) VALUES (?1, ?2, ?3, ?4)",
        params![sample.id, sample.user, json(sample), now],
    )
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Wraps a SQLite error with the database path; owns its copy so it can live across `&mut self.conn` borrows.
fn sq_err(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + use<> {
    let path = path.to_path_buf();
    move |source| StoreError::Sqlite {
        path: path.clone(),
        source,
    }
}

fn json<T: Serialize>(value: &T) -> String {
    // Serialising our own plain data types to JSON cannot fail (no maps with non-string keys, no I/O).
    serde_json::to_string(value).unwrap_or_default()
}

/// The sample an interaction becomes: the model's own answer, so it counts as self-generated.
pub fn interaction_sample(i: &Interaction) -> Sample {
    Sample {
        id: i.id.clone(),
        user: i.user.clone(),
        origin: Origin::SelfGenerated,
        content: SampleContent::Sft {
            prompt: i.prompt.clone(),
            response: i.response.clone(),
        },
        provenance: Provenance {
            sources: vec![i.id.clone()],
            steps: Vec::new(),
        },
        created_at_unix_ms: i.created_at_unix_ms,
    }
}

/// The sample a piece of feedback becomes: grounded in what the person did.
pub fn feedback_sample(f: &Feedback, i: &Interaction) -> Sample {
    let prompt = i.prompt.clone();
    let content = match &f.kind {
        FeedbackKind::Thumbs { up } => SampleContent::Unpaired {
            prompt,
            response: i.response.clone(),
            desirable: *up,
        },
        FeedbackKind::Edit { text } => SampleContent::Preference {
            prompt,
            chosen: text.clone(),
            rejected: i.response.clone(),
        },
        FeedbackKind::Accepted => SampleContent::Sft {
            prompt,
            response: i.response.clone(),
        },
        FeedbackKind::Score { value } => SampleContent::Scored {
            prompt,
            response: i.response.clone(),
            score: *value,
        },
    };
    Sample {
        id: f.id.clone(),
        user: f.user.clone(),
        origin: Origin::Grounded,
        content,
        provenance: Provenance {
            sources: vec![i.id.clone(), f.id.clone()],
            steps: Vec::new(),
        },
        created_at_unix_ms: f.created_at_unix_ms,
    }
}
