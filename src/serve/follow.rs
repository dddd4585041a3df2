//! Serving follows the store's served state: `hearth deltas promote|rollback` and the gate change it while
//! the process runs, and a server applies each change within a poll interval.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{ServeError, Server};
use crate::store::Store;

/// How often the store's served state is checked.
pub const SERVED_POLL: Duration = Duration::from_secs(1);

pub struct ServedFollower {
    data_dir: PathBuf,
    /// The `serving_log` row last applied.
    applied: Option<i64>,
    last_poll: Option<Instant>,
    /// Kept open once the data directory has a store: it is read every second.
    store: Option<Store>,
}

impl ServedFollower {
    pub fn new(data_dir: &Path) -> Self {
        ServedFollower {
            data_dir: data_dir.to_path_buf(),
            applied: None,
            last_poll: None,
            store: None,
        }
    }

    /// Applies a change of the served state, at most once per [`SERVED_POLL`]. A state this server cannot
    /// serve is logged once, not every poll, and the server keeps serving what it served.
    pub fn poll(&mut self, server: &Server, node: &str) -> Result<(), ServeError> {
        if self.last_poll.is_some_and(|t| t.elapsed() < SERVED_POLL) {
            return Ok(());
        }
        self.last_poll = Some(Instant::now());
        if !self.data_dir.join(Store::FILE_NAME).exists() {
            return Ok(());
        }
        if self.store.is_none() {
            self.store = Some(Store::open(&self.data_dir)?);
        }
        let Some(store) = &self.store else {
            return Ok(());
        };
        let served = store.served()?;
        if served.seq.is_none() || served.seq == self.applied {
            return Ok(());
        }
        let delta = match &served.delta_id {
            Some(id) => Some(
                store
                    .delta(id)?
                    .ok_or_else(|| ServeError::ServedUnknown(id.clone()))?
                    .to_delta(),
            ),
            None => None,
        };
        self.applied = served.seq;
        if let Err(e) = server.swap_to(delta.as_ref()) {
            tracing::error!(node, error = %e, "cannot serve the store's served state");
        }
        Ok(())
    }
}
