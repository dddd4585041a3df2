//! Edges: bounded crossbeam channels with a `when_full` policy and per-edge counters.
//!
//! Every data path is bounded. The workers of one node share the receiving end (crossbeam channels are MPMC),
//! so `workers: 4` means four instances pulling from one mailbox.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::schema::WhenFull;

/// Counters for one edge, mirrored into the `metrics` registry (`hearth_edge_*`) and read back by `/status`
/// and by tests, which the `metrics` facade cannot do.
#[derive(Debug)]
pub struct EdgeStats {
    pub name: String,
    pub capacity: usize,
    pub when_full: WhenFull,
    pub feedback: bool,
    pushed: AtomicU64,
    popped: AtomicU64,
    dropped: AtomicU64,
    undeliverable: AtomicU64,
    blocked_nanos: AtomicU64,
    /// Highest queue depth seen by a sender, to show that a bounded edge stayed bounded.
    max_depth: AtomicU64,
    pushed_metric: metrics::Counter,
    popped_metric: metrics::Counter,
    dropped_metric: metrics::Counter,
    blocked_metric: metrics::Histogram,
}

/// A point-in-time copy of an edge's counters.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EdgeSnapshot {
    pub name: String,
    pub capacity: usize,
    pub depth: usize,
    pub max_depth: u64,
    pub pushed: u64,
    pub popped: u64,
    pub dropped: u64,
    /// Sent after every receiver had exited (only possible on feedback edges at shutdown).
    pub undeliverable: u64,
    pub blocked_seconds: f64,
}

impl EdgeStats {
    fn new(name: String, capacity: usize, when_full: WhenFull, feedback: bool) -> Self {
        let labels = [("edge", name.clone())];
        EdgeStats {
            pushed_metric: metrics::counter!("hearth_edge_pushed_total", &labels),
            popped_metric: metrics::counter!("hearth_edge_popped_total", &labels),
            dropped_metric: metrics::counter!("hearth_edge_dropped_total", &labels),
            blocked_metric: metrics::histogram!("hearth_edge_send_blocked_seconds", &labels),
            name,
            capacity,
            when_full,
            feedback,
            pushed: AtomicU64::new(0),
            popped: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            undeliverable: AtomicU64::new(0),
            blocked_nanos: AtomicU64::new(0),
            max_depth: AtomicU64::new(0),
        }
    }

    /// Publishes `n` receives counted locally by a worker.
    pub(crate) fn add_popped(&self, n: u64) {
        if n > 0 {
            self.popped.fetch_add(n, Ordering::Relaxed);
            self.popped_metric.increment(n);
        }
    }

    /// Messages queued now. Derived from the counters rather than the channel, so that holding this view does
    /// not keep a channel connected after its workers exit.
    pub fn depth(&self) -> usize {
        let pushed = self.pushed.load(Ordering::Relaxed);
        let gone = self.popped.load(Ordering::Relaxed)
            + match self.when_full {
                // Evictions remove queued messages; DropNewest drops were never queued.
                WhenFull::DropOldest => self.dropped.load(Ordering::Relaxed),
                _ => 0,
            };
        pushed.saturating_sub(gone) as usize
    }

    pub fn snapshot(&self) -> EdgeSnapshot {
        let depth = self.depth();
        EdgeSnapshot {
            name: self.name.clone(),
            capacity: self.capacity,
            depth,
            max_depth: self.max_depth.load(Ordering::Relaxed),
            pushed: self.pushed.load(Ordering::Relaxed),
            popped: self.popped.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            undeliverable: self.undeliverable.load(Ordering::Relaxed),
            blocked_seconds: self.blocked_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// How many sends a worker counts locally before publishing to the shared counters. Per-message atomic
/// updates on counters shared by sender and receiver threads cost more than the channel itself.
pub(crate) const COUNT_BATCH: u64 = 64;

/// Counts not yet published to [`EdgeStats`].
#[derive(Default)]
struct Pending {
    pushed: Cell<u64>,
    dropped: Cell<u64>,
    max_depth: Cell<u64>,
}

/// The sending half of an edge, cloned into every worker of the upstream node. Each clone counts locally and
/// publishes every [`COUNT_BATCH`] sends, before its worker blocks, and when dropped.
pub struct EdgeSender<M> {
    tx: Sender<M>,
    /// Only for `DropOldest`: lets the sender evict the head of a full queue. Kept `None` otherwise so that the
    /// channel disconnects when its consumers exit.
    evict: Option<Receiver<M>>,
    stats: Arc<EdgeStats>,
    pending: Pending,
}

impl<M> Clone for EdgeSender<M> {
    /// A clone starts with nothing pending, so no count is published twice.
    fn clone(&self) -> Self {
        EdgeSender {
            tx: self.tx.clone(),
            evict: self.evict.clone(),
            stats: self.stats.clone(),
            pending: Pending::default(),
        }
    }
}

impl<M> Drop for EdgeSender<M> {
    fn drop(&mut self) {
        self.publish();
    }
}

/// The receiving half, shared by every worker of the downstream node.
pub struct EdgeReceiver<M> {
    pub rx: Receiver<M>,
    pub port: &'static str,
    pub stats: Arc<EdgeStats>,
}

impl<M> Clone for EdgeReceiver<M> {
    fn clone(&self) -> Self {
        EdgeReceiver {
            rx: self.rx.clone(),
            port: self.port,
            stats: self.stats.clone(),
        }
    }
}

/// Makes one bounded edge. `capacity` is at least 1 (validation rejects 0; crossbeam's 0 is a rendezvous).
pub fn bounded<M>(
    name: String,
    capacity: usize,
    when_full: WhenFull,
    feedback: bool,
    port: &'static str,
) -> (EdgeSender<M>, EdgeReceiver<M>) {
    let capacity = capacity.max(1);
    let (tx, rx) = crossbeam_channel::bounded(capacity);
    let stats = Arc::new(EdgeStats::new(name, capacity, when_full, feedback));
    let evict = (when_full == WhenFull::DropOldest).then(|| rx.clone());
    (
        EdgeSender {
            tx,
            evict,
            stats: stats.clone(),
            pending: Pending::default(),
        },
        EdgeReceiver { rx, port, stats },
    )
}

impl<M> EdgeSender<M> {
    /// The counters of the edge this sender feeds; their identity names the edge across a reload.
    pub fn stats(&self) -> &Arc<EdgeStats> {
        &self.stats
    }

    /// Sends under the edge's policy. Never loses a message silently: drops are counted, and a message that no
    /// receiver can ever take is counted as undeliverable.
    pub fn send(&self, message: M) {
        let stats = &self.stats;
        match stats.when_full {
            WhenFull::Block => match self.tx.try_send(message) {
                Ok(()) => self.count_push(),
                Err(TrySendError::Full(message)) => {
                    self.saw_full();
                    let start = Instant::now();
                    let sent = self.tx.send(message);
                    let waited = start.elapsed();
                    stats
                        .blocked_nanos
                        .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
                    stats.blocked_metric.record(waited.as_secs_f64());
                    match sent {
                        Ok(()) => self.count_push(),
                        Err(_) => self.undeliverable(),
                    }
                }
                Err(TrySendError::Disconnected(_)) => self.undeliverable(),
            },
            WhenFull::DropNewest => match self.tx.try_send(message) {
                Ok(()) => self.count_push(),
                Err(TrySendError::Full(_)) => {
                    self.saw_full();
                    self.count_drop();
                }
                Err(TrySendError::Disconnected(_)) => self.undeliverable(),
            },
            WhenFull::DropOldest => {
                let mut message = message;
                loop {
                    match self.tx.try_send(message) {
                        Ok(()) => {
                            self.count_push();
                            break;
                        }
                        Err(TrySendError::Full(back)) => {
                            message = back;
                            self.saw_full();
                            // Another sender or a consumer may empty the slot first; either way we retry.
                            if let Some(evict) = &self.evict
                                && evict.try_recv().is_ok()
                            {
                                self.count_drop();
                            }
                        }
                        Err(TrySendError::Disconnected(_)) => {
                            self.undeliverable();
                            break;
                        }
                    }
                }
            }
        }
    }

    fn count_push(&self) {
        let p = &self.pending;
        p.pushed.set(p.pushed.get() + 1);
        // Reading the depth touches the channel's shared head and tail; sample it (full queues are also
        // recorded where a send meets a full queue).
        if p.pushed.get() % 8 == 1 {
            p.max_depth.set(p.max_depth.get().max(self.tx.len() as u64));
        }
        if p.pushed.get() >= COUNT_BATCH {
            self.publish();
        }
    }

    fn saw_full(&self) {
        self.pending.max_depth.set(self.stats.capacity as u64);
    }

    fn count_drop(&self) {
        let p = &self.pending;
        p.dropped.set(p.dropped.get() + 1);
        if p.dropped.get() >= COUNT_BATCH {
            self.publish();
        }
    }

    /// Publishes locally counted sends to the shared counters and metrics.
    pub fn publish(&self) {
        let stats = &self.stats;
        let pushed = self.pending.pushed.replace(0);
        if pushed > 0 {
            stats.pushed.fetch_add(pushed, Ordering::Relaxed);
            stats.pushed_metric.increment(pushed);
        }
        let dropped = self.pending.dropped.replace(0);
        if dropped > 0 {
            stats.dropped.fetch_add(dropped, Ordering::Relaxed);
            stats.dropped_metric.increment(dropped);
        }
        stats
            .max_depth
            .fetch_max(self.pending.max_depth.replace(0), Ordering::Relaxed);
    }

    fn undeliverable(&self) {
        self.stats.undeliverable.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(edge = %self.stats.name, "message undeliverable: every receiver has exited");
    }
}
