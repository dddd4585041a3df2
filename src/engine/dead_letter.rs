//! The dead-letter store: messages whose handling failed, kept with the error and node id for a person to inspect.
//!
//! An append-only JSON Lines file, synced per letter: failures are rare, and a letter must survive the crash that
//! often follows them. It rotates at a size ([`Rotation`]): `dead_letters.jsonl` becomes `dead_letters.jsonl.1`,
//! the `.1` becomes `.2`, and so on up to `keep` files; the oldest is deleted. Readers read them all.

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

/// When the dead-letter file rotates, and how many rotated files are kept (`settings.dead_letters` in a graph).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rotation {
    /// The file rotates once a letter takes it to this size or past it.
    pub max_bytes: u64,
    /// Rotated files kept beside the current one; 0 discards the full file.
    pub keep: usize,
}

impl Default for Rotation {
    fn default() -> Self {
        // At most 32 MiB in all: letters are rare, and the newest say what is wrong now.
        Rotation {
            max_bytes: 8 * 1024 * 1024,
            keep: 3,
        }
    }
}

pub struct DeadLetterStore {
    path: PathBuf,
    rotation: Rotation,
    file: Mutex<File>,
}

impl DeadLetterStore {
    pub const FILE_NAME: &'static str = "dead_letters.jsonl";

    /// Opens (creating) `dir/dead_letters.jsonl` for appending, with the default [`Rotation`].
    pub fn open(dir: &Path) -> Result<Self, DeadLetterError> {
        Self::open_rotating(dir, Rotation::default())
    }

    /// Opens (creating) `dir/dead_letters.jsonl` for appending, rotating it as `rotation` says.
    pub fn open_rotating(dir: &Path, rotation: Rotation) -> Result<Self, DeadLetterError> {
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
            rotation,
            file: Mutex::new(file),
        })
    }

    /// `dead_letters.jsonl.N`: the N-th newest rotated file.
    fn rotated(path: &Path, n: usize) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    /// Shifts the rotated files up by one (dropping what passes `keep`), moves the current file to `.1` and
    /// opens a fresh one. A crash between two renames loses no letter: every file is still under some name,
    /// and the next rotation shifts again.
    fn rotate(&self, file: &mut File) -> std::io::Result<()> {
        let keep = self.rotation.keep;
        let _ = std::fs::remove_file(Self::rotated(&self.path, keep.max(1)));
        for n in (1..keep).rev() {
            let from = Self::rotated(&self.path, n);
            if from.exists() {
                std::fs::rename(&from, Self::rotated(&self.path, n + 1))?;
            }
        }
        if keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            std::fs::rename(&self.path, Self::rotated(&self.path, 1))?;
        }
        *file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        Ok(())
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
            return;
        }
        let full = file
            .metadata()
            .is_ok_and(|m| m.len() >= self.rotation.max_bytes);
        if full && let Err(e) = self.rotate(&mut file) {
            tracing::error!(path = %self.path.display(), error = %e, "cannot rotate the dead letters");
        }
    }

    /// Every dead-letter file in `dir`, oldest first: the rotated ones (`.N` down to `.1`), then the current.
    pub fn files(dir: &Path) -> Vec<PathBuf> {
        let path = dir.join(Self::FILE_NAME);
        let mut rotated: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let n = name
                    .to_str()?
                    .strip_prefix(Self::FILE_NAME)?
                    .strip_prefix('.')?
                    .parse()
                    .ok()?;
                Some((n, e.path()))
            })
            .collect();
        rotated.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
        let mut files: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
        if path.exists() {
            files.push(path);
        }
        files
    }

    /// Reads every letter back, the rotated files' too, oldest first (for `hearth` commands and tests).
    pub fn read_all<M: Payload>(dir: &Path) -> Result<Vec<DeadLetter<M>>, DeadLetterError> {
        let mut letters = Vec::new();
        for path in Self::files(dir) {
            letters.extend(Self::read_file(&path)?);
        }
        Ok(letters)
    }

    fn read_file<M: Payload>(path: &Path) -> Result<Vec<DeadLetter<M>>, DeadLetterError> {
        let path = path.to_path_buf();
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
