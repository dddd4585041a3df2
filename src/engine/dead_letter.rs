//! The dead-letter store: messages whose handling failed, kept with the error and node id for a person to inspect.
//!
//! An append-only JSON Lines file, synced per letter: failures are rare, and a letter must survive the crash that
//! often follows them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::Payload;
use crate::clock::now_unix_ms;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "M: serde::de::DeserializeOwned"))]
pub struct DeadLetter<M> {
    pub node: String,
    pub worker: usize,
    pub error: String,
    pub message: M,
    pub at_unix_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    #[error("dead-letter store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("dead-letter store {path}:{line}: {source}")]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

pub struct DeadLetterStore {
    path: PathBuf,
    file: Mutex<File>,
}

impl DeadLetterStore {
    pub const FILE_NAME: &'static str = "dead_letters.jsonl";

    /// Opens (creating) `dir/dead_letters.jsonl` for appending.
    pub fn open(dir: &Path) -> Result<Self, DeadLetterError> {
        let path = dir.join(Self::FILE_NAME);
        let io = |source| DeadLetterError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io)?;
        Ok(DeadLetterStore {
            path,
            file: Mutex::new(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends and syncs one letter. Failing to record is logged, never fatal: the worker must go on.
    pub fn put<M: Payload>(&self, node: &str, worker: usize, error: &str, message: &M) {
        let letter = DeadLetter {
            node: node.to_owned(),
            worker,
            error: error.to_owned(),
            message: message.clone(),
            at_unix_ms: now_unix_ms(),
        };
        metrics::counter!("hearth_node_dead_letters_total", "node" => node.to_owned()).increment(1);
        let mut line = match serde_json::to_vec(&letter) {
            Ok(line) => line,
            Err(e) => {
                tracing::error!(node, error = %e, "cannot encode dead letter");
                return;
            }
        };
        line.push(b'\n');
        // A poisoned lock only means another writer panicked mid-append; the file handle itself is still usable.
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(&line).and_then(|_| file.sync_data()) {
            tracing::error!(node, path = %self.path.display(), error = %e, "cannot write dead letter");
        }
    }

    /// Reads every letter back (for `hearth` commands and tests).
    pub fn read_all<M: Payload>(dir: &Path) -> Result<Vec<DeadLetter<M>>, DeadLetterError> {
        let path = dir.join(Self::FILE_NAME);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(DeadLetterError::Io { path, source }),
        };
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|source| DeadLetterError::Parse {
                    path: path.clone(),
                    line: i + 1,
                    source,
                })
            })
            .collect()
    }
}
