//! The runtime: one OS thread per worker, bounded edges between them, supervision, and an orderly drain.
//!
//! Shutdown needs no coordinator: stopping the sources drops their senders, each downstream worker drains its
//! mailbox until every non-feedback input is disconnected, flushes, and exits, dropping its own senders in
//! turn. The drain therefore runs in topological order and loses nothing that was accepted.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender, TryRecvError};
use serde::Serialize;

use super::Payload;
use super::actor::{Actor, ActorError, ActorFactory, BuildContext, Outbox, Produce};
use super::dead_letter::{DeadLetterError, DeadLetterStore};
use super::edge::{EdgeReceiver, EdgeSender, EdgeSnapshot, EdgeStats, bounded};
use super::resources::Resources;
use super::schema::{EdgeSpec, GraphSettings, RestartPolicy};
use super::validate::{Graph, PlanNode};
use crate::clock::now_unix_ms;

/// Lifecycle of a node as `/status` and the run report show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NodeState {
    Running,
    /// Restarting after a failure, within its restart budget.
    Restarting,
    /// Exceeded `max_restarts` in its window: its mailbox is now drained to the dead-letter store.
    Failed,
    /// Every worker exited after draining its inputs.
    Finished,
}

impl NodeState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => NodeState::Running,
            1 => NodeState::Restarting,
            2 => NodeState::Failed,
            _ => NodeState::Finished,
        }
    }
}

/// Which call into an actor failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Building the actor from its parameters.
    Build,
    /// [`Actor::on_start`].
    Start,
    /// [`Actor::on_restart`].
    Restart,
    /// Handling a message.
    Handle,
    /// A source producing.
    Produce,
    /// [`Actor::tick`], the idle call.
    Tick,
    /// [`Actor::flush`] at shutdown.
    Flush,
    /// Work the actor runs off its thread or on a schedule ([`ActorError::Background`]), whichever call
    /// reported it.
    Background,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Build => "build",
            Stage::Start => "start",
            Stage::Restart => "restart",
            Stage::Handle => "handle",
            Stage::Produce => "produce",
            Stage::Tick => "tick",
            Stage::Flush => "flush",
            Stage::Background => "background work",
        }
    }
}

/// The last failure of a node, as `/status`, `/healthz`, the status line and the run report show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeError {
    /// The error and every cause under it, joined by `: `.
    pub error: String,
    pub during: Stage,
    pub at_unix_ms: u64,
}

/// Counters for one node, mirrored into `hearth_node_*` metrics.
pub struct NodeStats {
    pub id: String,
    pub kind: &'static str,
    pub workers: usize,
    policy: RestartPolicy,
    state: AtomicU8,
    live_workers: AtomicU64,
    processed: AtomicU64,
    errors: AtomicU64,
    restarts: AtomicU64,
    /// The edges into the node; a reload changes them.
    inbound: Mutex<Vec<Arc<EdgeStats>>>,
    restart_times: Mutex<Vec<Instant>>,
    /// The last failure, and when it happened on the monotonic clock (for the restart window).
    last_error: Mutex<Option<(NodeError, Instant)>>,
    processed_metric: metrics::Counter,
    errors_metric: metrics::Counter,
    restarts_metric: metrics::Counter,
    failed_metric: metrics::Gauge,
    handler_metric: metrics::Histogram,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeSnapshot {
    pub id: String,
    pub kind: &'static str,
    pub state: NodeState,
    pub workers: usize,
    pub queue_depth: usize,
    pub processed: u64,
    pub errors: u64,
    pub restarts: u64,
    /// Restarts that count against `max_restarts` now (those within `window_secs`).
    pub restarts_in_window: u32,
    /// Restarting, or running with a failure within its restart window: see [`NodeStats::erroring`].
    pub erroring: bool,
    pub last_error: Option<NodeError>,
}

impl NodeSnapshot {
    /// One line naming a failed or erroring node and its last error; `None` for a node in good health.
    pub fn trouble(&self) -> Option<String> {
        let what = match self.state {
            NodeState::Failed => format!(
                "node `{}` failed (restart limit reached after {} errors)",
                self.id, self.errors
            ),
            _ if self.erroring => format!(
                "node `{}` is erroring ({}, {} restarts in its window, {} errors in all)",
                self.id,
                if self.state == NodeState::Restarting {
                    "restarting"
                } else {
                    "running again"
                },
                self.restarts_in_window,
                self.errors
            ),
            _ => return None,
        };
        Some(match &self.last_error {
            Some(e) => format!("{what}; last error in {}: {}", e.during.as_str(), e.error),
            None => what,
        })
    }
}

impl NodeStats {
    pub(super) fn new<M>(
        node: &PlanNode<M>,
        kind: &'static str,
        inbound: Vec<Arc<EdgeStats>>,
    ) -> Arc<Self> {
        let labels = [("node", node.id.clone())];
        Arc::new(NodeStats {
            id: node.id.clone(),
            kind,
            workers: node.workers,
            policy: node.restart,
            state: AtomicU8::new(NodeState::Running as u8),
            live_workers: AtomicU64::new(node.workers as u64),
            processed: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            inbound: Mutex::new(inbound),
            restart_times: Mutex::new(Vec::new()),
            last_error: Mutex::new(None),
            processed_metric: metrics::counter!("hearth_node_processed_total", &labels),
            errors_metric: metrics::counter!("hearth_node_errors_total", &labels),
            restarts_metric: metrics::counter!("hearth_node_restarts_total", &labels),
            failed_metric: metrics::gauge!("hearth_node_failed", &labels),
            handler_metric: metrics::histogram!("hearth_node_handler_seconds", &labels),
        })
    }

    pub(super) fn set_inbound(&self, inbound: Vec<Arc<EdgeStats>>) {
        *self.inbound.lock().unwrap_or_else(|p| p.into_inner()) = inbound;
    }

    fn state(&self) -> NodeState {
        NodeState::from_u8(self.state.load(Ordering::Acquire))
    }

    fn set_state(&self, state: NodeState) {
        // Failed and Finished are terminal: a late update from another worker must not undo them.
        let new = state as u8;
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                let old_state = NodeState::from_u8(old);
                match (old_state, state) {
                    (NodeState::Failed | NodeState::Finished, _) => None,
                    _ => Some(new),
                }
            });
        self.failed_metric
            .set(if self.state() == NodeState::Failed {
                1.0
            } else {
                0.0
            });
    }

    pub fn snapshot(&self) -> NodeSnapshot {
        NodeSnapshot {
            id: self.id.clone(),
            kind: self.kind,
            state: self.state(),
            workers: self.workers,
            queue_depth: self
                .inbound
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|e| e.depth())
                .sum(),
            processed: self.processed.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            restarts_in_window: self.restarts_in_window(),
            erroring: self.erroring(),
            last_error: self.last_error(),
        }
    }

    /// The node's last failure, if it has had one.
    pub fn last_error(&self) -> Option<NodeError> {
        self.last_error_lock().as_ref().map(|(e, _)| e.clone())
    }

    /// Whether the node is failing now without having failed for good: restarting, or running with its last
    /// failure within its restart window (the span over which failures count against `max_restarts`).
    /// A node that keeps failing stays erroring until it recovers for a window or exhausts its budget.
    pub fn erroring(&self) -> bool {
        match self.state() {
            NodeState::Restarting => true,
            NodeState::Running => self
                .last_error_lock()
                .as_ref()
                .is_some_and(|(_, at)| at.elapsed() <= self.policy.window()),
            NodeState::Failed | NodeState::Finished => false,
        }
    }

    fn restarts_in_window(&self) -> u32 {
        let window = self.policy.window();
        self.restart_times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|t| t.elapsed() <= window)
            .count() as u32
    }

    fn last_error_lock(&self) -> std::sync::MutexGuard<'_, Option<(NodeError, Instant)>> {
        // A poisoned lock only means another worker panicked while holding it; the value is still valid.
        self.last_error.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a failure and keeps it as the node's last error.
    fn record_error(&self, during: Stage, error: &ActorError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.errors_metric.increment(1);
        let during = if error.is_background() {
            Stage::Background
        } else {
            during
        };
        let record = NodeError {
            error: error.chain(),
            during,
            at_unix_ms: now_unix_ms(),
        };
        *self.last_error_lock() = Some((record, Instant::now()));
    }

    /// Records a failure and decides: `Some(backoff)` to restart, `None` when the restart budget is spent.
    fn on_failure(&self, during: Stage, error: &ActorError) -> Option<Duration> {
        self.record_error(during, error);
        let policy = &self.policy;
        let now = Instant::now();
        // A poisoned lock only means another worker panicked while holding it; the Vec is still valid.
        let mut times = self.restart_times.lock().unwrap_or_else(|p| p.into_inner());
        times.retain(|t| now.duration_since(*t) <= policy.window());
        if times.len() as u32 >= policy.max_restarts {
            self.set_state(NodeState::Failed);
            return None;
        }
        times.push(now);
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.restarts_metric.increment(1);
        Some(policy.backoff(times.len() as u32))
    }
}

/// Live view of a running graph, shared with the control endpoints. A reload replaces what it lists.
pub struct RunStatus {
    graph: RwLock<String>,
    nodes: RwLock<Vec<Arc<NodeStats>>>,
    edges: RwLock<Vec<Arc<EdgeStats>>>,
    pub started: Instant,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusSnapshot {
    pub graph: String,
    pub uptime_seconds: f64,
    pub nodes: Vec<NodeSnapshot>,
    pub edges: Vec<EdgeSnapshot>,
}

impl RunStatus {
    fn nodes(&self) -> Vec<Arc<NodeStats>> {
        self.nodes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What a reload leaves running.
    pub(super) fn replace(
        &self,
        graph: &str,
        nodes: Vec<Arc<NodeStats>>,
        edges: Vec<Arc<EdgeStats>>,
    ) {
        *self.graph.write().unwrap_or_else(|p| p.into_inner()) = graph.to_owned();
        *self.nodes.write().unwrap_or_else(|p| p.into_inner()) = nodes;
        *self.edges.write().unwrap_or_else(|p| p.into_inner()) = edges;
    }

    pub fn snapshot(&self) -> StatusSnapshot {
        let edges = self.edges.read().unwrap_or_else(|p| p.into_inner());
        StatusSnapshot {
            graph: self.graph.read().unwrap_or_else(|p| p.into_inner()).clone(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            nodes: self.nodes().iter().map(|n| n.snapshot()).collect(),
            edges: edges.iter().map(|e| e.snapshot()).collect(),
        }
    }

    /// Healthy while no node has failed.
    pub fn healthy(&self) -> bool {
        self.nodes().iter().all(|n| n.state() != NodeState::Failed)
    }

    /// The nodes that have failed and those erroring now (see [`NodeStats::erroring`]), with their last errors.
    pub fn health(&self) -> Health {
        let mut health = Health {
            failed: Vec::new(),
            erroring: Vec::new(),
        };
        for node in &self.nodes() {
            let snap = node.snapshot();
            if snap.state == NodeState::Failed {
                health.failed.push(snap);
            } else if snap.erroring {
                health.erroring.push(snap);
            }
        }
        health
    }
}

/// What `/healthz` reports: unhealthy (503) once a node has failed; degraded (still 200) while a node is
/// erroring within its restart budget; each such node named with its last error.
#[derive(Debug, Clone, Serialize)]
pub struct Health {
    pub failed: Vec<NodeSnapshot>,
    pub erroring: Vec<NodeSnapshot>,
}

impl Health {
    /// No node has failed (a node that is erroring does not make the graph unhealthy yet).
    pub fn healthy(&self) -> bool {
        self.failed.is_empty()
    }

    /// No node has failed or is erroring.
    pub fn is_clean(&self) -> bool {
        self.failed.is_empty() && self.erroring.is_empty()
    }
}

/// `ok`, or one line per failed node (`failed: …`) and per erroring node (`degraded: …`).
impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return writeln!(f, "ok");
        }
        for (label, nodes) in [("failed", &self.failed), ("degraded", &self.erroring)] {
            for line in nodes.iter().filter_map(NodeSnapshot::trouble) {
                writeln!(f, "{label}: {line}")?;
            }
        }
        Ok(())
    }
}

/// What a finished run reports.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub status: StatusSnapshot,
    pub failed_nodes: Vec<String>,
    pub dead_letters: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    DeadLetters(#[from] DeadLetterError),
    #[error("cannot spawn worker thread for node `{node}`: {source}")]
    Spawn {
        node: String,
        source: std::io::Error,
    },
}

/// A graph that is running. [`RunningGraph::reload`] (in `reload.rs`) rewires it in place.
pub struct RunningGraph<M: Payload> {
    pub(super) shared: Arc<Shared<M>>,
}

/// What the workers, the control endpoints and a reload share.
pub(super) struct Shared<M: Payload> {
    pub(super) data_dir: PathBuf,
    /// The settings the graph started with: a reload may not change them.
    pub(super) settings: GraphSettings,
    pub(super) resources: Arc<Resources>,
    pub(super) dead_letters: Arc<DeadLetterStore>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
    pub(super) status: Arc<RunStatus>,
    /// The nodes and edges running now. Held for the whole of a reload, so reloads run one at a time.
    pub(super) wiring: Mutex<Wiring<M>>,
}

pub(super) struct Wiring<M: Payload> {
    pub(super) name: String,
    pub(super) nodes: Vec<NodeHandle<M>>,
    pub(super) edges: Vec<RunningEdge>,
}

/// A running node as a reload sees it.
pub(super) struct NodeHandle<M: Payload> {
    pub(super) plan: PlanNode<M>,
    pub(super) stats: Arc<NodeStats>,
    /// One per worker: how a reload reaches it.
    pub(super) commands: Vec<Sender<Commands<M>>>,
    /// Stops this node alone (a removed source); the global stop flag still stops it too.
    pub(super) stop: Arc<AtomicBool>,
}

/// A running edge: what it connects, and its counters, whose identity names it to the workers.
#[derive(Clone)]
pub(super) struct RunningEdge {
    pub(super) spec: EdgeSpec,
    pub(super) from_node: String,
    pub(super) from_port: &'static str,
    pub(super) to_node: String,
    pub(super) stats: Arc<EdgeStats>,
}

/// Instructions for one worker from a reload, applied together between two messages; `applied` is told
/// when they are.
pub(super) struct Commands<M> {
    pub(super) list: Vec<Command<M>>,
    pub(super) applied: Sender<()>,
}

pub(super) enum Command<M> {
    /// Take messages from one more edge (`true`: a feedback edge).
    AddInput(EdgeReceiver<M>, bool),
    /// Send on one more edge from this port.
    AddOutput(&'static str, EdgeSender<M>),
    /// Stop sending on the edge with these counters; its receiver drains what is queued, then closes it.
    RemoveOutput(Arc<EdgeStats>),
    /// Flush the actor and exit, handing back the channel ends so that a replacement takes them over with
    /// whatever is queued on them.
    Retire(Sender<Ends<M>>),
}

/// A worker's channel ends.
pub(super) struct Ends<M> {
    pub(super) inputs: Vec<(EdgeReceiver<M>, bool)>,
    pub(super) outputs: OutPorts<M>,
}

/// A reload's side of a worker's [`Gate`]: whether it started, and where to send the word.
pub(super) type GateEnds = (Receiver<Result<(), String>>, Sender<bool>);

/// For a worker started by a reload: it reports whether its actor built and started, then waits for the
/// word to run (`true`) or to stand down (`false`: another new node failed, the old graph stays).
pub(super) struct Gate {
    pub(super) ready: Sender<Result<(), String>>,
    pub(super) go: Receiver<bool>,
}

struct Worker<M: Payload> {
    stats: Arc<NodeStats>,
    factory: Arc<dyn ActorFactory<M>>,
    ctx: BuildContext,
    source: bool,
    inputs: Vec<(EdgeReceiver<M>, bool)>,
    outbox: Outbox<M>,
    stop: Arc<AtomicBool>,
    node_stop: Arc<AtomicBool>,
    commands: Receiver<Commands<M>>,
    /// Set by [`Command::Retire`]: where the channel ends go once the actor is flushed.
    retire: Option<Sender<Ends<M>>>,
    gate: Option<Gate>,
    dead_letters: Arc<DeadLetterStore>,
    /// Receives per input and handled messages counted locally, published every `COUNT_BATCH` deliveries and
    /// whenever the worker is about to block or exit (see [`Worker::publish_counts`]).
    pending_pops: Vec<u64>,
    pending_processed: u64,
    /// False once an input is disconnected and empty: nothing more will come on it.
    input_open: Vec<bool>,
    deliveries: u64,
}

/// A node's output ports, each with the edges it fans out to.
pub(super) type OutPorts<M> = Vec<(&'static str, Vec<EdgeSender<M>>)>;

/// Starts every worker of a validated graph. `data_dir` overrides the graph's own setting (tests use temp dirs).
pub fn start<M: Payload>(
    graph: Graph<M>,
    data_dir: Option<&Path>,
) -> Result<RunningGraph<M>, RuntimeError> {
    super::metrics::install();
    let data_dir = data_dir
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(&graph.plan.settings.data_dir));
    let plan = &graph.plan;

    // Edges first: each node needs its senders (outputs) and receivers (inputs).
    let mut senders: Vec<OutPorts<M>> = plan.nodes.iter().map(|n| output_ports(n)).collect();
    let mut receivers: Vec<Vec<(EdgeReceiver<M>, bool)>> =
        (0..plan.nodes.len()).map(|_| Vec::new()).collect();
    let mut edges = Vec::new();
    for edge in &graph.edges {
        let (tx, rx) = bounded(
            edge.spec.name(),
            edge.spec.capacity,
            edge.spec.when_full,
            edge.spec.feedback,
            edge.to_port,
        );
        edges.push(RunningEdge {
            spec: edge.spec.clone(),
            from_node: plan.nodes[edge.from_node].id.clone(),
            from_port: edge.from_port,
            to_node: plan.nodes[edge.to_node].id.clone(),
            stats: rx.stats.clone(),
        });
        if let Some((_, list)) = senders[edge.from_node]
            .iter_mut()
            .find(|(p, _)| *p == edge.from_port)
        {
            list.push(tx);
        }
        receivers[edge.to_node].push((rx, edge.spec.feedback));
    }

    let node_stats: Vec<Arc<NodeStats>> = plan
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let inbound = receivers[i].iter().map(|(r, _)| r.stats.clone()).collect();
            NodeStats::new(n, n.factory.info().name, inbound)
        })
        .collect();
    let status = Arc::new(RunStatus {
        graph: RwLock::new(plan.name.clone()),
        nodes: RwLock::new(node_stats.clone()),
        edges: RwLock::new(edges.iter().map(|e| e.stats.clone()).collect()),
        started: Instant::now(),
    });
    let shared = Arc::new(Shared {
        dead_letters: Arc::new(DeadLetterStore::open_rotating(
            &data_dir,
            plan.settings.dead_letters,
        )?),
        data_dir,
        settings: plan.settings.clone(),
        resources: Arc::new(Resources::default()),
        stop: Arc::new(AtomicBool::new(false)),
        threads: Mutex::new(Vec::new()),
        status,
        wiring: Mutex::new(Wiring {
            name: plan.name.clone(),
            nodes: Vec::new(),
            edges,
        }),
    });

    let mut handles: Vec<Option<NodeHandle<M>>> = (0..plan.nodes.len()).map(|_| None).collect();
    for &i in &graph.topo_order {
        let (handle, _) = shared.spawn_node(
            &plan.nodes[i],
            node_stats[i].clone(),
            &receivers[i],
            &senders[i],
            false,
        )?;
        handles[i] = Some(handle);
    }
    // Drop the originals so that only workers hold channel ends: disconnection then means "upstream is done".
    drop(senders);
    drop(receivers);
    shared.wiring_lock().nodes = handles.into_iter().flatten().collect();
    Ok(RunningGraph { shared })
}

/// Every output port of a node's kind, with no edge yet.
pub(super) fn output_ports<M: Payload>(node: &PlanNode<M>) -> OutPorts<M> {
    node.factory
        .info()
        .outputs
        .iter()
        .map(|p| (p.name, Vec::new()))
        .collect()
}

impl<M: Payload> Shared<M> {
    pub(super) fn wiring_lock(&self) -> std::sync::MutexGuard<'_, Wiring<M>> {
        // A poisoned lock only means a reload panicked; the wiring it holds is what the workers run.
        self.wiring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawns a node's workers, each with its own clones of the channel ends. With `gated`, each worker
    /// builds and starts its actor, reports through its [`Gate`] and waits for the word to run.
    pub(super) fn spawn_node(
        &self,
        node: &PlanNode<M>,
        stats: Arc<NodeStats>,
        inputs: &[(EdgeReceiver<M>, bool)],
        outputs: &OutPorts<M>,
        gated: bool,
    ) -> Result<(NodeHandle<M>, Vec<GateEnds>), RuntimeError> {
        let node_id: Arc<str> = Arc::from(node.id.as_str());
        let node_stop = Arc::new(AtomicBool::new(false));
        let mut commands = Vec::new();
        let mut gates = Vec::new();
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        for w in 0..node.workers {
            let (command_tx, command_rx) = crossbeam_channel::unbounded();
            let gate = gated.then(|| {
                let (ready, ready_rx) = crossbeam_channel::bounded(1);
                let (go_tx, go) = crossbeam_channel::bounded(1);
                gates.push((ready_rx, go_tx));
                Gate { ready, go }
            });
            let worker = Worker {
                stats: stats.clone(),
                factory: node.factory.clone(),
                ctx: BuildContext {
                    node_id: node.id.clone(),
                    worker: w,
                    data_dir: self.data_dir.clone(),
                    resources: self.resources.clone(),
                },
                source: node.factory.info().source,
                inputs: inputs.to_vec(),
                outbox: Outbox::new(node_id.clone(), outputs.clone()),
                stop: self.stop.clone(),
                node_stop: node_stop.clone(),
                commands: command_rx,
                retire: None,
                gate,
                dead_letters: self.dead_letters.clone(),
                pending_pops: vec![0; inputs.len()],
                input_open: vec![true; inputs.len()],
                pending_processed: 0,
                deliveries: 0,
            };
            let handle = std::thread::Builder::new()
                .name(format!("{}#{w}", node.id))
                .spawn(move || worker.run())
                .map_err(|source| RuntimeError::Spawn {
                    node: node.id.clone(),
                    source,
                })?;
            threads.push(handle);
            commands.push(command_tx);
        }
        Ok((
            NodeHandle {
                plan: node.clone(),
                stats,
                commands,
                stop: node_stop,
            },
            gates,
        ))
    }
}

impl<M: Payload> RunningGraph<M> {
    pub fn status(&self) -> Arc<RunStatus> {
        self.shared.status.clone()
    }

    /// A flag that, once set, stops the sources (what SIGINT/SIGTERM do).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.shared.stop.clone()
    }

    /// Asks sources to stop; the rest drains on its own.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
    }

    /// Waits for every worker (those a reload started too) to finish draining and returns the report.
    pub fn wait(self) -> RunReport {
        loop {
            let next = self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop();
            let Some(thread) = next else { break };
            // A worker thread only ends by returning: handler panics are caught inside it.
            let _ = thread.join();
        }
        let status = self.shared.status.snapshot();
        let failed_nodes = status
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Failed)
            .map(|n| n.id.clone())
            .collect();
        RunReport {
            status,
            failed_nodes,
            dead_letters: self.shared.dead_letters.path().to_path_buf(),
        }
    }

    /// Stops the sources and waits for the drain.
    pub fn shutdown(self) -> RunReport {
        self.stop();
        self.wait()
    }
}

/// One message in this many has its handler time recorded in `hearth_node_handler_seconds`.
const HANDLER_SAMPLE: u64 = 16;

/// A busy worker looks for a reload's commands once in this many messages (an idle one at once).
const COMMAND_CHECK_EVERY: u32 = 64;

/// How long a worker waits on empty mailboxes before it publishes its batched counts.
const IDLE_PUBLISH: Duration = Duration::from_millis(1);

/// How long an idle worker sleeps between checks of the stop flag when it has nothing to wait on.
const STOP_POLL: Duration = Duration::from_millis(20);

impl<M: Payload> Worker<M> {
    fn run(mut self) {
        let mut actor = match self.gate.take() {
            Some(gate) => match self.start_gated(gate) {
                Some(actor) => Some(actor),
                None => return,
            },
            None => {
                let mut actor = self.build_until_ok();
                if let Some(a) = actor.as_mut()
                    && let Err(e) = guarded(|| a.on_start(&mut self.outbox))
                {
                    tracing::error!(node = %self.ctx.node_id, error = %e.chain(), "start failed");
                    self.restart(&mut actor, Stage::Start, &e);
                }
                actor
            }
        };
        if self.source {
            self.run_source(&mut actor);
        }
        if self.retire.is_none() {
            self.run_inputs(&mut actor);
        }
        if let Some(actor) = actor.as_mut()
            && let Err(e) = guarded(|| actor.flush(&mut self.outbox))
        {
            // Nothing is left to restart for; the failure is still the node's last error.
            self.stats.record_error(Stage::Flush, &e);
            tracing::error!(node = %self.ctx.node_id, error = %e.chain(), "flush failed");
        }
        self.publish_counts();
        if let Some(reply) = self.retire.take() {
            let ends = Ends {
                inputs: std::mem::take(&mut self.inputs),
                outputs: self.outbox.take_ports(),
            };
            let _ = reply.send(ends);
            return;
        }
        if self.stats.live_workers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.stats.set_state(NodeState::Finished);
        }
    }

    /// A worker a reload started: builds and starts its actor once (no retries: a failure keeps the old
    /// graph), reports, and runs only when every new node has started.
    fn start_gated(&mut self, gate: Gate) -> Option<Box<dyn Actor<M>>> {
        let started = guarded(|| self.factory.build(&self.ctx))
            .and_then(|mut actor| guarded(|| actor.on_start(&mut self.outbox)).map(|()| actor));
        match started {
            Err(e) => {
                let _ = gate.ready.send(Err(e.chain()));
                None
            }
            Ok(mut actor) => {
                let _ = gate.ready.send(Ok(()));
                if gate.go.recv() == Ok(true) {
                    return Some(actor);
                }
                // Standing down: release what starting took (a listening port).
                let _ = guarded(|| actor.flush(&mut self.outbox));
                None
            }
        }
    }

    /// This node is to stop producing: the graph is stopping, or a reload removed the node.
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.node_stop.load(Ordering::Acquire)
    }

    /// Applies what a reload asked of this worker. True once it is to retire.
    fn apply_commands(&mut self) -> bool {
        while let Ok(Commands { list, applied }) = self.commands.try_recv() {
            for command in list {
                match command {
                    Command::AddInput(rx, feedback) => {
                        self.inputs.push((rx, feedback));
                        self.input_open.push(true);
                        self.pending_pops.push(0);
                    }
                    Command::AddOutput(port, tx) => self.outbox.add_edge(port, tx),
                    Command::RemoveOutput(edge) => self.outbox.remove_edge(&edge),
                    Command::Retire(reply) => self.retire = Some(reply),
                }
            }
            let _ = applied.send(());
        }
        self.retire.is_some()
    }

    /// Publishes locally batched counts (receives, handled messages, sends) to the shared stats and metrics.
    fn publish_counts(&mut self) {
        for (i, n) in self.pending_pops.iter_mut().enumerate() {
            self.inputs[i].0.stats.add_popped(std::mem::take(n));
        }
        let processed = std::mem::take(&mut self.pending_processed);
        if processed > 0 {
            self.stats.processed.fetch_add(processed, Ordering::Relaxed);
            self.stats.processed_metric.increment(processed);
        }
        self.outbox.publish_counts();
    }

    /// Builds the actor, retrying under the restart policy; `None` once the node has failed.
    fn build_until_ok(&self) -> Option<Box<dyn Actor<M>>> {
        loop {
            if self.stats.state() == NodeState::Failed {
                return None;
            }
            match guarded(|| self.factory.build(&self.ctx)) {
                Ok(actor) => {
                    self.stats.set_state(NodeState::Running);
                    return Some(actor);
                }
                Err(e) => {
                    tracing::error!(node = %self.ctx.node_id, error = %e.chain(), "cannot build actor");
                    self.backoff_or_fail(Stage::Build, &e)?;
                }
            }
        }
    }

    /// After a failure: record it, sleep the backoff and return `Some`, or return `None` when the node has
    /// failed.
    fn backoff_or_fail(&self, during: Stage, error: &ActorError) -> Option<()> {
        match self.stats.on_failure(during, error) {
            Some(backoff) => {
                self.stats.set_state(NodeState::Restarting);
                tracing::warn!(node = %self.ctx.node_id, ?backoff, "restarting worker");
                std::thread::sleep(backoff);
                Some(())
            }
            None => {
                tracing::error!(node = %self.ctx.node_id, "restart limit reached: node failed");
                None
            }
        }
    }

    /// After a failure of `during`: drops the actor and, within the restart budget, rebuilds it and lets it
    /// reload its state ([`Actor::on_restart`]); `actor` stays `None` once the node has failed.
    fn restart(
        &mut self,
        actor: &mut Option<Box<dyn Actor<M>>>,
        during: Stage,
        error: &ActorError,
    ) {
        *actor = None;
        if self.backoff_or_fail(during, error).is_none() {
            return;
        }
        loop {
            let Some(mut rebuilt) = self.build_until_ok() else {
                return;
            };
            match guarded(|| rebuilt.on_restart(&mut self.outbox)) {
                Ok(()) => {
                    *actor = Some(rebuilt);
                    return;
                }
                Err(e) => {
                    tracing::error!(node = %self.ctx.node_id, error = %e.chain(), "restart failed");
                    if self.backoff_or_fail(Stage::Restart, &e).is_none() {
                        return;
                    }
                }
            }
        }
    }

    fn run_source(&mut self, actor: &mut Option<Box<dyn Actor<M>>>) {
        while !self.stopping() {
            if self.apply_commands() {
                return;
            }
            let Some(a) = actor.as_mut() else { return };
            let produced = guarded(|| a.produce(&mut self.outbox));
            match produced {
                Ok(Produce::Produced) => {}
                Ok(Produce::Idle(wait)) => {
                    self.publish_counts();
                    self.wait_for_input(actor, wait);
                }
                Ok(Produce::Exhausted) => return,
                Err(e) => {
                    tracing::error!(node = %self.ctx.node_id, error = %e.chain(), "source failed");
                    self.restart(actor, Stage::Produce, &e);
                }
            }
            // Feedback (e.g. a promoted delta) must reach a busy source too.
            self.poll_inputs_once(actor);
        }
    }

    /// Waits up to `wait` for input (handled as it comes) or for the stop flag.
    fn wait_for_input(&mut self, actor: &mut Option<Box<dyn Actor<M>>>, wait: Duration) {
        let deadline = Instant::now() + wait;
        loop {
            self.poll_inputs_once(actor);
            let now = Instant::now();
            if now >= deadline || self.stopping() || self.apply_commands() {
                return;
            }
            let timeout = STOP_POLL.min(deadline - now);
            let open: Vec<usize> = (0..self.inputs.len())
                .filter(|&i| self.input_open[i])
                .collect();
            if open.is_empty() {
                std::thread::sleep(timeout);
                continue;
            }
            let mut select = Select::new();
            for &i in &open {
                select.recv(&self.inputs[i].0.rx);
            }
            // Readiness only: the next poll receives (and notices disconnection).
            let _ = select.ready_timeout(timeout);
        }
    }

    /// Takes whatever the open inputs hold right now, without blocking.
    fn poll_inputs_once(&mut self, actor: &mut Option<Box<dyn Actor<M>>>) {
        for i in 0..self.inputs.len() {
            while self.input_open[i] {
                match self.inputs[i].0.rx.try_recv() {
                    Ok(message) => self.deliver(actor, i, message),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => self.input_open[i] = false,
                }
            }
        }
    }

    /// The main loop of a non-source worker (and the tail of a source's): take messages until every
    /// non-feedback input is disconnected and empty, then take what feedback inputs still hold.
    fn run_inputs(&mut self, actor: &mut Option<Box<dyn Actor<M>>>) {
        // A node fed only by feedback edges runs until stop, serving what arrives.
        let feedback_only = !self.has_live_input() && !self.source;
        let mut watched: Vec<usize> = (0..self.inputs.len())
            .filter(|&i| self.input_open[i])
            .collect();
        let mut cursor = 0;
        let mut busy = 0u32;
        while self.has_live_input() || (feedback_only && !self.stopping()) {
            // A reload's commands are looked for when idle and every so often when busy: a check per message
            // would be a shared-memory read in the hottest loop.
            busy += 1;
            if busy >= COMMAND_CHECK_EVERY {
                busy = 0;
                if self.rewired(&mut watched, &mut cursor) {
                    return;
                }
            }
            // Fast path, no allocation: a round-robin sweep of non-blocking receives.
            let mut delivered = false;
            let mut closed_any = false;
            for k in 0..watched.len() {
                let idx = watched[(cursor + k) % watched.len()];
                match self.inputs[idx].0.rx.try_recv() {
                    Ok(message) => {
                        cursor = (cursor + k + 1) % watched.len();
                        self.deliver(actor, idx, message);
                        delivered = true;
                        break;
                    }
                    Err(TryRecvError::Empty) => {}
                    Err(TryRecvError::Disconnected) => {
                        self.input_open[idx] = false;
                        closed_any = true;
                    }
                }
            }
            if closed_any {
                watched.retain(|&i| self.input_open[i]);
                cursor = 0;
            }
            if delivered || closed_any {
                continue;
            }
            if self.rewired(&mut watched, &mut cursor) {
                return;
            }
            // Slow path: every watched mailbox was empty. Wait briefly first: a pipeline's queues run empty
            // between most messages, and publishing counts on every such gap would cost as much as the
            // per-message updates that batching avoids. Only a worker idle for IDLE_PUBLISH publishes.
            let mut waited = Duration::ZERO;
            let mut published = false;
            loop {
                let step = if published { STOP_POLL } else { IDLE_PUBLISH };
                let got = match watched.as_slice() {
                    [] => {
                        std::thread::sleep(step);
                        false
                    }
                    [only] => match self.inputs[*only].0.rx.recv_timeout(step) {
                        Ok(message) => {
                            self.deliver(actor, *only, message);
                            true
                        }
                        Err(RecvTimeoutError::Timeout) => false,
                        Err(RecvTimeoutError::Disconnected) => {
                            self.input_open[*only] = false;
                            watched.clear();
                            true
                        }
                    },
                    many => {
                        let mut select = Select::new();
                        for &i in many {
                            select.recv(&self.inputs[i].0.rx);
                        }
                        // Readiness only: the next sweep receives (and notices disconnection).
                        select.ready_timeout(step).is_ok()
                    }
                };
                waited += step;
                if got {
                    break;
                }
                if waited >= STOP_POLL {
                    self.tick(actor);
                    break;
                }
                if !published {
                    self.publish_counts();
                    published = true;
                }
            }
        }
        for i in 0..self.inputs.len() {
            if self.inputs[i].1 {
                while let Ok(message) = self.inputs[i].0.rx.try_recv() {
                    self.deliver(actor, i, message);
                }
            }
        }
    }

    /// Applies a reload's commands; a new input joins the watched ones. True once the worker is to retire.
    fn rewired(&mut self, watched: &mut Vec<usize>, cursor: &mut usize) -> bool {
        let before = self.inputs.len();
        if self.apply_commands() {
            return true;
        }
        if self.inputs.len() != before {
            *watched = (0..self.inputs.len())
                .filter(|&i| self.input_open[i])
                .collect();
            *cursor = 0;
        }
        false
    }

    /// Whether a non-feedback input may still bring messages.
    fn has_live_input(&self) -> bool {
        (0..self.inputs.len()).any(|i| self.input_open[i] && !self.inputs[i].1)
    }

    /// Lets an idle actor emit work it finished off its thread (see [`Actor::tick`]); a failure restarts it.
    fn tick(&mut self, actor: &mut Option<Box<dyn Actor<M>>>) {
        let Some(a) = actor.as_mut() else { return };
        if let Err(e) = guarded(|| a.tick(&mut self.outbox)) {
            tracing::error!(node = %self.ctx.node_id, error = %e.chain(), "tick failed");
            self.restart(actor, Stage::Tick, &e);
        }
    }

    /// Handles one message with supervision: a panic or error dead-letters it and restarts the worker; a
    /// failed node dead-letters everything it still receives so upstream never blocks on it.
    fn deliver(&mut self, actor: &mut Option<Box<dyn Actor<M>>>, input: usize, message: M) {
        self.pending_pops[input] += 1;
        let port = self.inputs[input].0.port;
        let Some(a) = actor.as_mut() else {
            self.dead_letters.put(
                &self.ctx.node_id,
                self.ctx.worker,
                "node failed: restart limit reached",
                &message,
            );
            return;
        };
        self.deliveries += 1;
        // Handler time is sampled (one message in HANDLER_SAMPLE): reading the clock twice per message and
        // buffering every observation would cost more than a trivial handler.
        let timed = self.deliveries.is_multiple_of(HANDLER_SAMPLE);
        let started = timed.then(Instant::now);
        let result = guarded(|| a.handle(port, &message, &mut self.outbox));
        if let Some(started) = started {
            self.stats
                .handler_metric
                .record(started.elapsed().as_secs_f64());
        }
        if self.deliveries.is_multiple_of(super::edge::COUNT_BATCH) {
            self.publish_counts();
        }
        match result {
            Ok(()) => {
                self.pending_processed += 1;
            }
            Err(e) if e.is_background() => {
                // The message was taken; what failed is the actor's background work, reported here.
                self.pending_processed += 1;
                tracing::error!(node = %self.ctx.node_id, error = %e.chain(), "background work failed");
                self.restart(actor, Stage::Handle, &e);
            }
            Err(e) => {
                let error = e.chain();
                tracing::warn!(node = %self.ctx.node_id, message = message.id(), %error, "handler failed");
                self.dead_letters
                    .put(&self.ctx.node_id, self.ctx.worker, &error, &message);
                self.restart(actor, Stage::Handle, &e);
            }
        }
        if self.stats.state() == NodeState::Failed {
            *actor = None;
        }
    }
}

/// Runs `f`, turning a panic into an error so one bad message cannot take the worker thread down.
fn guarded<T>(f: impl FnOnce() -> Result<T, ActorError>) -> Result<T, ActorError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned());
            Err(ActorError::Message(format!("panicked: {text}")))
        }
    }
}
