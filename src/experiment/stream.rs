//! The recorded stream: JSONL records, each a prompt and response with optional gold labels, or a data
//! directory's captured interactions and feedback (no gold).
//!
//! A record is `{"id", "prompt", "response"?, "user"?, "pii"?: [{"type", "value"}], "secrets"?: [{"value",
//! "rule"?}], "unsafe"?: [category], "dup_group"?}`. Gold spans are matched by value: a span leaks when its
//! value still appears verbatim in an admitted sample, whatever curation did to the text around it.

use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::ExperimentError;
use crate::message::{ChatMessage, Origin, Provenance, Role, Sample, SampleContent};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldSpan {
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
    /// Offsets as the source data set gives them; kept for reference, matching is by value.
    #[serde(default)]
    pub start: Option<usize>,
    #[serde(default)]
    pub end: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldSecret {
    pub value: String,
    #[serde(default)]
    pub rule: Option<String>,
}

/// One line of the stream file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub id: String,
    #[serde(default = "default_user")]
    pub user: String,
    pub prompt: String,
    #[serde(default)]
    pub response: String,
    #[serde(default)]
    pub pii: Vec<GoldSpan>,
    #[serde(default)]
    pub secrets: Vec<GoldSecret>,
    #[serde(default, rename = "unsafe")]
    pub unsafe_labels: Vec<String>,
    #[serde(default)]
    pub dup_group: Option<String>,
    /// The sample as a store captured it; replayed as it is instead of one built from `prompt`/`response`.
    #[serde(skip)]
    pub captured: Option<Sample>,
}

fn default_user() -> String {
    "experiment".to_owned()
}

/// Fixed creation times, so nothing a variant sees depends on the clock of the run.
const EPOCH_MS: u64 = 1_767_225_600_000;

impl Record {
    /// The sample curation sees: a grounded SFT pair, as capture would emit it.
    pub fn sample(&self, index: usize) -> Arc<Sample> {
        if let Some(s) = &self.captured {
            return Arc::new(s.clone());
        }
        Arc::new(Sample {
            id: self.id.clone(),
            user: self.user.clone(),
            origin: Origin::Grounded,
            content: SampleContent::Sft {
                prompt: vec![ChatMessage::new(Role::User, self.prompt.clone())],
                response: self.response.clone(),
            },
            provenance: Provenance {
                sources: vec![self.id.clone()],
                steps: Vec::new(),
            },
            created_at_unix_ms: EPOCH_MS + index as u64,
        })
    }
}

/// Reads every record, naming the line of the first that does not parse.
pub fn read(path: &Path, limit: Option<usize>) -> Result<Vec<Record>, ExperimentError> {
    let io = |source| ExperimentError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut records = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|n| records.len() >= n) {
            break;
        }
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let stream_err = |col: usize, message: String| ExperimentError::Stream {
            file: path.to_path_buf(),
            line: i + 1,
            col,
            message,
        };
        let record: Record =
            serde_json::from_str(&line).map_err(|e| stream_err(e.column(), e.to_string()))?;
        if !ids.insert(record.id.clone()) {
            return Err(stream_err(1, format!("id `{}` is used twice", record.id)));
        }
        records.push(record);
    }
    if records.is_empty() {
        return Err(ExperimentError::Stream {
            file: path.to_path_buf(),
            line: 1,
            col: 1,
            message: "the stream has no records".to_owned(),
        });
    }
    Ok(records)
}

/// Reads a data directory's captured interactions and feedback as curation first saw them: each interaction
/// becomes its self-generated sample, each piece of feedback its grounded one, in capture order. The store is
/// opened read-only, so an experiment never changes the data it replays. Items whose raw text retention has
/// already erased, and feedback on an interaction the store does not hold, have no sample and are skipped.
pub fn read_store(dir: &Path, limit: Option<usize>) -> Result<Vec<Record>, ExperimentError> {
    use rusqlite::{Connection, OpenFlags};

    use crate::message::{Feedback, Interaction};
    use crate::store::{Store, feedback_sample, interaction_sample};

    let path = dir.join(Store::FILE_NAME);
    let sq = |source| ExperimentError::Store {
        path: path.clone(),
        source,
    };
    let json = |table: &'static str, id: &str, source| ExperimentError::Captured {
        path: path.clone(),
        table,
        id: id.to_owned(),
        source,
    };
    if !path.is_file() {
        return Err(ExperimentError::Io {
            path: path.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no store here: `stream.store` names a data directory holding hearth.sqlite",
            ),
        });
    }
    // Without a write-ahead log no hearth has the store open, and `immutable` reads it without creating the
    // `-wal` and `-shm` files a read-only WAL reader otherwise leaves beside it. With one, a hearth may be
    // writing: read through the log, as any reader does.
    let live = dir.join(format!("{}-wal", Store::FILE_NAME)).exists();
    let uri = format!(
        "file:{}?mode=ro{}",
        path.display()
            .to_string()
            .replace('%', "%25")
            .replace('?', "%3f")
            .replace('#', "%23"),
        if live { "" } else { "&immutable=1" }
    );
    let conn = Connection::open_with_flags(
        &uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sq)?;
    // A running hearth may be writing; wait for it rather than fail.
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(sq)?;
    // Both tables are read in one snapshot, so feedback never names an interaction read later.
    conn.execute_batch("BEGIN").map_err(sq)?;
    type InteractionRow = (
        i64,
        String,
        String,
        Option<String>,
        String,
        Option<String>,
        String,
        i64,
        i64,
    );
    let rows: Vec<InteractionRow> = conn
        .prepare(
            "SELECT rowid, id, user, adapter, prompt_json, response, sampling_json, created_at_unix_ms,
                    latency_ms
             FROM interactions WHERE prompt_json IS NOT NULL",
        )
        .and_then(|mut st| {
            st.query_map([], |r| {
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
                ))
            })?
            .collect()
        })
        .map_err(sq)?;
    let mut interactions = std::collections::HashMap::new();
    // (created, source: interactions first, rowid) orders the samples as capture saw them.
    let mut items: Vec<((i64, u8, i64), Sample)> = Vec::new();
    for (rowid, id, user, adapter, prompt, response, sampling, created, latency) in rows {
        let i = Interaction {
            prompt: serde_json::from_str(&prompt).map_err(|e| json("interactions", &id, e))?,
            sampling: serde_json::from_str(&sampling).map_err(|e| json("interactions", &id, e))?,
            id,
            user,
            adapter,
            response: response.unwrap_or_default(),
            created_at_unix_ms: created.max(0) as u64,
            latency_ms: latency.max(0) as u64,
            commit: Default::default(),
        };
        items.push(((created, 0, rowid), interaction_sample(&i)));
        interactions.insert(i.id.clone(), i);
    }
    let rows: Vec<(i64, String, String, String, String, i64)> = conn
        .prepare(
            "SELECT rowid, id, response_id, user, kind_json, created_at_unix_ms
             FROM feedback WHERE kind_json IS NOT NULL",
        )
        .and_then(|mut st| {
            st.query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })?
            .collect()
        })
        .map_err(sq)?;
    conn.execute_batch("COMMIT").map_err(sq)?;
    for (rowid, id, response_id, user, kind, created) in rows {
        let Some(i) = interactions.get(&response_id) else {
            continue;
        };
        let f = Feedback {
            kind: serde_json::from_str(&kind).map_err(|e| json("feedback", &id, e))?,
            id,
            response_id,
            user,
            created_at_unix_ms: created.max(0) as u64,
            commit: Default::default(),
        };
        items.push(((created, 1, rowid), feedback_sample(&f, i)));
    }
    items.sort_by_key(|(key, _)| *key);
    let records: Vec<Record> = items
        .into_iter()
        .take(limit.unwrap_or(usize::MAX))
        .map(|(_, s)| Record {
            id: s.id.clone(),
            user: s.user.clone(),
            prompt: String::new(),
            response: String::new(),
            pii: Vec::new(),
            secrets: Vec::new(),
            unsafe_labels: Vec::new(),
            dup_group: None,
            captured: Some(s),
        })
        .collect();
    if records.is_empty() {
        return Err(ExperimentError::Io {
            path,
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the store holds no captured interaction or feedback to replay",
            ),
        });
    }
    Ok(records)
}

/// The replay order for one repeat: file order, or a seeded shuffle (Fisher–Yates over SplitMix64, so the
/// order depends on the seed alone, not on a library's generator).
pub fn order(n: usize, shuffle: bool, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for i in (1..n).rev() {
            let j = (next() % (i as u64 + 1)) as usize;
            idx.swap(i, j);
        }
    }
    idx
}
