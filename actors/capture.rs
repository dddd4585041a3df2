//! `capture`: makes every interaction and piece of feedback durable in the store before it is curated.
//!
//! Thin over [`crate::store`]. Each captured item gets a pending curation entry in the same transaction; the
//! item then flows on as a sample. At start, worker 0 replays every item still pending (in flight when the
//! process died), so nothing captured is ever lost; the store's conditional state changes make the replay
//! idempotent. It also applies the raw-text retention policy every `sweep_every_secs`, whether items arrive
//! or not: the sweep runs between messages and, when the mailbox is idle, from [`Actor::tick`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, Context, KindParams};
use crate::message::{Message, MessageType};
use crate::store::Store;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureParams {
    /// Erase raw captured text this many seconds after its curation finished (`None`: keep it).
    pub retention_secs: Option<u64>,
    /// Delete an item's record (its rows in `interactions`/`feedback` and `curation`) this many seconds after
    /// its curation finished, once its raw text is erased (`None`: keep records). See
    /// [`Store::prune_records`].
    pub record_retention_secs: Option<u64>,
    /// Seconds between two retention sweeps: raw text outlives `retention_secs` by at most this much.
    pub sweep_every_secs: u64,
}

impl Default for CaptureParams {
    fn default() -> Self {
        CaptureParams {
            retention_secs: None,
            record_retention_secs: None,
            sweep_every_secs: 60,
        }
    }
}

static INFO: KindInfo = KindInfo {
    name: "capture",
    about: "stores interactions and feedback durably, then emits them as samples; replays pending items at start",
    inputs: &[
        PortSpec::optional("interactions", MessageType::Interaction),
        PortSpec::optional("feedback", MessageType::Feedback),
    ],
    outputs: &[PortSpec::new("out", MessageType::Sample)],
    source: false,
};

impl ActorFactory<Message> for CaptureParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        let store =
            Store::open(&ctx.data_dir).map_err(|e| ActorError::build_from("open the store", e))?;
        Ok(Box::new(Capture {
            store,
            retention: self.retention_secs.map(Duration::from_secs),
            record_retention: self.record_retention_secs.map(Duration::from_secs),
            sweep_every: Duration::from_secs(self.sweep_every_secs),
            replay_pending: ctx.worker == 0,
            last_retention: None,
        }))
    }
}

impl KindParams<Message> for CaptureParams {
    fn example() -> Self {
        CaptureParams {
            retention_secs: Some(7 * 24 * 3600),
            record_retention_secs: Some(90 * 24 * 3600),
            sweep_every_secs: 60,
        }
    }
}

struct Capture {
    store: Store,
    retention: Option<Duration>,
    record_retention: Option<Duration>,
    sweep_every: Duration,
    replay_pending: bool,
    /// `None` until the first sweep, which runs at once: a restart must not postpone retention.
    last_retention: Option<Instant>,
}

impl Capture {
    /// Applies retention if a sweep is due: raw text first, then the records whose text is gone.
    fn sweep(&mut self) -> Result<(), ActorError> {
        if self.retention.is_none() && self.record_retention.is_none() {
            return Ok(());
        }
        if self
            .last_retention
            .is_some_and(|t| t.elapsed() < self.sweep_every)
        {
            return Ok(());
        }
        self.last_retention = Some(Instant::now());
        if let Some(retention) = self.retention {
            let erased = self
                .store
                .apply_retention(retention)
                .map_err(|e| ActorError::background("apply retention", e))?;
            metrics::counter!("hearth_capture_raw_erased_total").increment(erased as u64);
        }
        if let Some(retention) = self.record_retention {
            let pruned = self
                .store
                .prune_records(retention)
                .map_err(|e| ActorError::background("prune records", e))?;
            metrics::counter!("hearth_capture_records_pruned_total").increment(pruned as u64);
        }
        Ok(())
    }
}

impl Actor<Message> for Capture {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        // Committed (or stored before): whoever acknowledges the item may now answer.
        let samples = match message {
            Message::Interaction(i) => {
                let samples = self
                    .store
                    .capture_interaction(i)
                    .context("capture an interaction")?;
                i.commit.done();
                samples
            }
            Message::Feedback(f) => {
                let samples = self.store.capture_feedback(f).context("capture feedback")?;
                f.commit.done();
                samples
            }
            other => {
                return Err(crate::message::unexpected(port, other));
            }
        };
        // Empty when captured before (a resent request or a replay): it is already on its way or decided.
        for sample in samples {
            out.send("out", Message::Sample(Arc::new(sample)))?;
        }
        self.sweep()
    }

    /// Retention runs on its timer while no items arrive, too.
    fn tick(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        self.sweep()
    }

    fn on_start(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        if !self.replay_pending {
            return Ok(());
        }
        let pending = self
            .store
            .pending_samples()
            .context("read pending samples")?;
        if !pending.is_empty() {
            tracing::info!(
                items = pending.len(),
                "replaying items left pending by the last run"
            );
        }
        for sample in pending {
            out.send("out", Message::Sample(Arc::new(sample)))?;
        }
        Ok(())
    }
}
