//! Serving follows the store's served state: `hearth deltas promote|rollback` and the gate change it while
//! the process runs, and a server applies each change within a poll interval: the common served state as the
//! default adapter, and each user's own as that user's route.

use std::collections::HashMap;
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
    /// Per user, the row of their chain last applied.
    applied_users: HashMap<String, i64>,
    last_poll: Option<Instant>,
    /// Kept open once the data directory has a store: it is read every second.
    store: Option<Store>,
}

impl ServedFollower {
    pub fn new(data_dir: &Path) -> Self {
        ServedFollower {
            data_dir: data_dir.to_path_buf(),
            applied: None,
            applied_users: HashMap::new(),
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
        if served.seq.is_some() && served.seq != self.applied {
            let delta = Self::delta(store, served.delta_id.as_deref())?;
            self.applied = served.seq;
            if let Err(e) = server.swap_to(delta.as_ref()) {
                tracing::error!(node, error = %e, "cannot serve the store's served state");
            }
        }
        let users = store.served_users()?;
        // A user whose chain is gone (purged) is served the default again.
        let gone: Vec<String> = self
            .applied_users
            .keys()
            .filter(|u| !users.iter().any(|(v, _)| v == *u))
            .cloned()
            .collect();
        for user in gone {
            self.applied_users.remove(&user);
            server.swap_user(&user, None)?;
        }
        for (user, state) in users {
            let Some(seq) = state.seq else { continue };
            if self.applied_users.get(&user) == Some(&seq) {
                continue;
            }
            let delta = Self::delta(store, state.delta_id.as_deref())?;
            self.applied_users.insert(user.clone(), seq);
            if let Err(e) = server.swap_user(&user, delta.as_ref()) {
                tracing::error!(node, user, error = %e, "cannot serve the user's served state");
            }
        }
        Ok(())
    }

    fn delta(store: &Store, id: Option<&str>) -> Result<Option<crate::message::Delta>, ServeError> {
        id.map(|id| {
            store
                .delta(id)?
                .ok_or_else(|| ServeError::ServedUnknown(id.to_owned()))
                .map(|d| d.to_delta())
        })
        .transpose()
    }
}
