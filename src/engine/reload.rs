//! Live rewiring: a running graph takes a new graph's nodes and edges while what both share keeps running.
//!
//! As in Vector's topology reload, the new graph is validated first and only the difference is applied:
//! nodes added, removed or changed (kind, parameters, workers, restart policy) and edges added or removed.
//! An edge both graphs declare keeps its channel, and with it every message queued on it. A changed node's
//! old workers finish the message in hand, flush and hand their channel ends to the new ones. A removed
//! edge stops taking messages and its receiver drains what is queued; a removed node drains and exits.
//!
//! New and changed nodes are built and started before anything running is rewired; if one fails, they
//! stand down, the changed nodes' old workers are started again on their channels, and the running graph
//! is what it was.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde::Serialize;

use super::Payload;
use super::actor::BuildContext;
use super::edge::{EdgeReceiver, EdgeSender, bounded};
use super::runtime::{
    Command, Commands, Ends, NodeHandle, NodeStats, OutPorts, RunningEdge, RunningGraph,
    RuntimeError, Shared, output_ports,
};
use super::schema::EdgeSpec;
use super::validate::{Graph, PlanNode};

/// How long a reload waits for a worker to reach a point between two messages (a handler that runs for
/// minutes, such as a gate judging a delta, delays a reload that touches its node).
const SAFE_POINT_WAIT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the graph is stopping")]
    Stopping,
    #[error(
        "`settings.{field}` cannot change while the graph runs (running: {running}, new: {new}); restart to change it"
    )]
    Settings {
        field: &'static str,
        running: String,
        new: String,
    },
    #[error("node `{node}` cannot be built: {error}; the running graph is unchanged")]
    Build { node: String, error: String },
    #[error("node `{node}` failed to start: {error}; the running graph is unchanged")]
    Start { node: String, error: String },
    #[error(
        "node `{node}` did not reach a point between messages within {}s; the reload stopped there",
        SAFE_POINT_WAIT.as_secs()
    )]
    Timeout { node: String },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReloadSummary {
    pub graph: String,
    pub nodes_added: Vec<String>,
    pub nodes_removed: Vec<String>,
    pub nodes_changed: Vec<String>,
    pub edges_added: Vec<String>,
    pub edges_removed: Vec<String>,
}

impl ReloadSummary {
    pub fn is_empty(&self) -> bool {
        self.nodes_added.is_empty()
            && self.nodes_removed.is_empty()
            && self.nodes_changed.is_empty()
            && self.edges_added.is_empty()
            && self.edges_removed.is_empty()
    }
}

impl fmt::Display for ReloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return write!(f, "graph `{}`: nothing to change", self.graph);
        }
        write!(f, "graph `{}` reloaded:", self.graph)?;
        for (what, list) in [
            ("nodes added", &self.nodes_added),
            ("nodes removed", &self.nodes_removed),
            ("nodes changed", &self.nodes_changed),
            ("edges added", &self.edges_added),
            ("edges removed", &self.edges_removed),
        ] {
            if !list.is_empty() {
                write!(f, " {what}: {};", list.join(", "))?;
            }
        }
        Ok(())
    }
}

/// An edge is the same in both graphs when it joins the same ports with the same mailbox.
fn edge_key(spec: &EdgeSpec) -> String {
    format!(
        "{}\u{0}{}\u{0}{}\u{0}{:?}\u{0}{}",
        spec.from, spec.to, spec.capacity, spec.when_full, spec.feedback
    )
}

/// Commands for one worker of a node (named for errors).
type Batch<M> = (String, Sender<Commands<M>>, Vec<Command<M>>);
/// Commands for one worker.
type WorkerBatch<M> = (Sender<Commands<M>>, Vec<Command<M>>);
/// A changed node's old plan and counters, and the channel ends its old workers handed back.
type Handed<M> = (PlanNode<M>, Arc<NodeStats>, Ends<M>);
/// The ends of a kept edge that a changed node's new workers take over (sender, receiver).
type TakenOver<M> = (Option<EdgeSender<M>>, Option<EdgeReceiver<M>>);

/// A node of the new graph that gets new workers, with the channel ends they start on.
struct Starting<M: Payload> {
    plan: PlanNode<M>,
    inputs: Vec<(EdgeReceiver<M>, bool)>,
    outputs: OutPorts<M>,
    /// For a changed node: its old plan and the ends its old workers handed back, to restart it if the reload
    /// is abandoned.
    old: Option<Handed<M>>,
}

impl<M: Payload> RunningGraph<M> {
    /// Rewires the running graph into `new` (already validated): see the module documentation. Returns what
    /// changed, or why nothing did.
    pub fn reload(&self, new: Graph<M>) -> Result<ReloadSummary, ReloadError> {
        self.shared.reload(new)
    }

    /// A handle that reloads this graph from another thread (a signal handler, the control endpoint).
    pub fn reloader(&self) -> Reloader<M> {
        Reloader {
            shared: self.shared.clone(),
        }
    }
}

/// Reloads a running graph; see [`RunningGraph::reload`].
pub struct Reloader<M: Payload> {
    shared: Arc<Shared<M>>,
}

impl<M: Payload> Clone for Reloader<M> {
    fn clone(&self) -> Self {
        Reloader {
            shared: self.shared.clone(),
        }
    }
}

impl<M: Payload> Reloader<M> {
    pub fn reload(&self, new: Graph<M>) -> Result<ReloadSummary, ReloadError> {
        self.shared.reload(new)
    }
}

/// Sends each batch and waits until every worker applied its own. A worker that has exited has nothing left
/// to rewire.
fn apply<M>(batches: Vec<Batch<M>>) -> Result<(), ReloadError> {
    let mut waiting = Vec::new();
    for (node, worker, list) in batches {
        let (applied, done) = crossbeam_channel::bounded(1);
        if worker.send(Commands { list, applied }).is_ok() {
            waiting.push((node, done));
        }
    }
    for (node, done) in waiting {
        match done.recv_timeout(SAFE_POINT_WAIT) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {}
            Err(RecvTimeoutError::Timeout) => return Err(ReloadError::Timeout { node }),
        }
    }
    Ok(())
}

impl<M: Payload> Shared<M> {
    fn reload(&self, new: Graph<M>) -> Result<ReloadSummary, ReloadError> {
        let mut wiring = self.wiring_lock();
        if self.stop.load(Ordering::Acquire) {
            return Err(ReloadError::Stopping);
        }
        let settings = &new.plan.settings;
        if settings.data_dir != self.settings.data_dir {
            return Err(ReloadError::Settings {
                field: "data_dir",
                running: self.settings.data_dir.clone(),
                new: settings.data_dir.clone(),
            });
        }
        let rotation = |s: &super::schema::GraphSettings| format!("{:?}", s.dead_letters);
        if rotation(settings) != rotation(&self.settings) {
            return Err(ReloadError::Settings {
                field: "dead_letters",
                running: rotation(&self.settings),
                new: rotation(settings),
            });
        }
        if settings.control != self.settings.control {
            let show = |c: &Option<String>| c.clone().unwrap_or_else(|| "none".to_owned());
            return Err(ReloadError::Settings {
                field: "control",
                running: show(&self.settings.control),
                new: show(&settings.control),
            });
        }

        // The difference, by node id and edge key.
        let old_index: HashMap<String, usize> = wiring
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.plan.id.clone(), i))
            .collect();
        let new_ids: HashSet<&str> = new.plan.nodes.iter().map(|n| n.id.as_str()).collect();
        let mut summary = ReloadSummary {
            graph: new.plan.name.clone(),
            ..Default::default()
        };
        let mut kept: HashSet<String> = HashSet::new();
        for node in &new.plan.nodes {
            match old_index.get(&node.id) {
                None => summary.nodes_added.push(node.id.clone()),
                Some(&i) if wiring.nodes[i].plan.same_as(node) => {
                    kept.insert(node.id.clone());
                }
                Some(_) => summary.nodes_changed.push(node.id.clone()),
            }
        }
        summary.nodes_removed = wiring
            .nodes
            .iter()
            .filter(|n| !new_ids.contains(n.plan.id.as_str()))
            .map(|n| n.plan.id.clone())
            .collect();
        let old_edges: HashMap<String, RunningEdge> = wiring
            .edges
            .iter()
            .map(|e| (edge_key(&e.spec), e.clone()))
            .collect();
        let new_keys: HashSet<String> = new.edges.iter().map(|e| edge_key(&e.spec)).collect();
        summary.edges_added = new
            .edges
            .iter()
            .filter(|e| !old_edges.contains_key(&edge_key(&e.spec)))
            .map(|e| e.spec.name())
            .collect();
        let removed_edges: Vec<RunningEdge> = wiring
            .edges
            .iter()
            .filter(|e| !new_keys.contains(&edge_key(&e.spec)))
            .cloned()
            .collect();
        summary.edges_removed = removed_edges.iter().map(|e| e.spec.name()).collect();
        if summary.is_empty() {
            wiring.name = summary.graph.clone();
            self.status.replace(
                &summary.graph,
                wiring.nodes.iter().map(|n| n.stats.clone()).collect(),
                wiring.edges.iter().map(|e| e.stats.clone()).collect(),
            );
            return Ok(summary);
        }

        // A node that cannot even be built is refused before anything running is touched.
        for node in new.plan.nodes.iter().filter(|n| !kept.contains(&n.id)) {
            let ctx = BuildContext {
                node_id: node.id.clone(),
                worker: 0,
                data_dir: self.data_dir.clone(),
                resources: self.resources.clone(),
            };
            if let Err(e) = node.factory.build(&ctx) {
                return Err(ReloadError::Build {
                    node: node.id.clone(),
                    error: e.chain(),
                });
            }
        }

        // Changed nodes' old workers flush and hand back their ends (a replacement may need the port or the
        // file the old one holds).
        let mut handed: HashMap<String, Handed<M>> = HashMap::new();
        for id in &summary.nodes_changed {
            let handle = &wiring.nodes[old_index[id]];
            let ends = self.retire(handle)?;
            handed.insert(
                id.clone(),
                (handle.plan.clone(), handle.stats.clone(), ends),
            );
        }

        // Channels: an edge both graphs declare keeps its own, unless an end of it is gone (a worker that
        // had exited handed nothing back); every other edge gets a new one.
        let mut edges: Vec<RunningEdge> = Vec::new();
        let mut fresh: Vec<(RunningEdge, EdgeSender<M>, EdgeReceiver<M>)> = Vec::new();
        let mut kept_ends: HashMap<String, TakenOver<M>> = HashMap::new();
        for edge in &new.edges {
            let key = edge_key(&edge.spec);
            let from = &new.plan.nodes[edge.from_node];
            let to = &new.plan.nodes[edge.to_node];
            if let Some(old) = old_edges.get(&key) {
                let sender = handed
                    .get(&from.id)
                    .map(|(_, _, ends)| find_sender(&ends.outputs, &old.stats));
                let receiver = handed
                    .get(&to.id)
                    .map(|(_, _, ends)| find_receiver(&ends.inputs, &old.stats));
                let whole = sender.as_ref().is_none_or(Option::is_some)
                    && receiver.as_ref().is_none_or(Option::is_some);
                if whole {
                    kept_ends.insert(key, (sender.flatten(), receiver.flatten()));
                    edges.push(old.clone());
                    continue;
                }
            }
            let (tx, rx) = bounded(
                edge.spec.name(),
                edge.spec.capacity,
                edge.spec.when_full,
                edge.spec.feedback,
                edge.to_port,
            );
            let running = RunningEdge {
                spec: edge.spec.clone(),
                from_node: from.id.clone(),
                from_port: edge.from_port,
                to_node: to.id.clone(),
                stats: rx.stats.clone(),
            };
            edges.push(running.clone());
            fresh.push((running, tx, rx));
        }

        // The workers of new and changed nodes, on their channel ends.
        let mut starting: Vec<Starting<M>> = Vec::new();
        // Queued for a changed node on an edge the new graph drops, at a port its new kind lacks.
        let mut orphans: Vec<(String, EdgeReceiver<M>)> = Vec::new();
        for node in new.plan.nodes.iter().filter(|n| !kept.contains(&n.id)) {
            let mut inputs = Vec::new();
            let mut outputs = output_ports(node);
            for (edge, running) in new.edges.iter().zip(&edges) {
                let key = edge_key(&edge.spec);
                let fresh_ends = fresh
                    .iter()
                    .find(|(r, _, _)| Arc::ptr_eq(&r.stats, &running.stats));
                if running.to_node == node.id {
                    let rx = match fresh_ends {
                        Some((_, _, rx)) => Some(rx.clone()),
                        None => kept_ends.get(&key).and_then(|(_, rx)| rx.clone()),
                    };
                    inputs.extend(rx.map(|rx| (rx, edge.spec.feedback)));
                }
                if running.from_node == node.id {
                    let tx = match fresh_ends {
                        Some((_, tx, _)) => Some(tx.clone()),
                        None => kept_ends.get(&key).and_then(|(tx, _)| tx.clone()),
                    };
                    if let (Some(tx), Some((_, list))) = (
                        tx,
                        outputs.iter_mut().find(|(p, _)| *p == running.from_port),
                    ) {
                        list.push(tx);
                    }
                }
            }
            let old = handed.remove(&node.id);
            if let Some((_, _, ends)) = &old {
                // What was queued for the old node on an edge the new graph drops: the new one drains it.
                let ports = node.factory.info().inputs;
                for (rx, feedback) in &ends.inputs {
                    let gone = !edges.iter().any(|e| Arc::ptr_eq(&e.stats, &rx.stats));
                    if !gone {
                        continue;
                    }
                    if ports.iter().any(|p| p.name == rx.port) {
                        inputs.push((rx.clone(), *feedback));
                    } else {
                        orphans.push((node.id.clone(), rx.clone()));
                    }
                }
            }
            starting.push(Starting {
                plan: node.clone(),
                inputs,
                outputs,
                old,
            });
        }

        // Start them; every one must start, or none runs.
        let mut started: Vec<(NodeHandle<M>, Vec<Sender<bool>>)> = Vec::new();
        let mut failure: Option<ReloadError> = None;
        for s in &starting {
            let inbound = s.inputs.iter().map(|(rx, _)| rx.stats.clone()).collect();
            let stats = NodeStats::new(&s.plan, s.plan.factory.info().name, inbound);
            let (handle, gates) = match self.spawn_node(&s.plan, stats, &s.inputs, &s.outputs, true)
            {
                Ok(spawned) => spawned,
                Err(e) => {
                    failure = Some(e.into());
                    break;
                }
            };
            let mut go = Vec::new();
            for (ready, go_tx) in gates {
                match ready.recv() {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        failure.get_or_insert(ReloadError::Start {
                            node: s.plan.id.clone(),
                            error,
                        });
                    }
                    Err(_) => {
                        failure.get_or_insert(ReloadError::Start {
                            node: s.plan.id.clone(),
                            error: "the worker exited while starting".to_owned(),
                        });
                    }
                }
                go.push(go_tx);
            }
            started.push((handle, go));
            if failure.is_some() {
                break;
            }
        }
        if let Some(failure) = failure {
            for (_, go) in &started {
                for g in go {
                    let _ = g.send(false);
                }
            }
            // Only the changed nodes were touched: their old workers go back on the channels they left.
            for s in starting {
                if let Some((plan, stats, ends)) = s.old {
                    let (handle, _) =
                        self.spawn_node(&plan, stats, &ends.inputs, &ends.outputs, false)?;
                    let i = old_index[&plan.id];
                    wiring.nodes[i].commands = handle.commands;
                    wiring.nodes[i].stop = handle.stop;
                }
            }
            return Err(failure);
        }
        for (_, go) in &started {
            for g in go {
                let _ = g.send(true);
            }
        }

        // Running nodes take their new edges first, so none sees its last input close before the new one
        // opens; then they let go of the removed ones.
        let kept_handle = |id: &str| {
            wiring
                .nodes
                .iter()
                .find(|n| n.plan.id == id && kept.contains(id))
        };
        let mut add = Vec::new();
        let mut new_outputs = Vec::new();
        for (running, tx, rx) in &fresh {
            if let Some(h) = kept_handle(&running.to_node) {
                for w in &h.commands {
                    let cmd = Command::AddInput(rx.clone(), running.spec.feedback);
                    add.push((h.plan.id.clone(), w.clone(), vec![cmd]));
                }
            }
            if let Some(h) = kept_handle(&running.from_node) {
                for w in &h.commands {
                    let cmd = Command::AddOutput(running.from_port, tx.clone());
                    new_outputs.push((h.plan.id.clone(), w.clone(), vec![cmd]));
                }
            }
        }
        apply(add)?;
        // A kept node's outputs change in one batch, so it never lacks a destination in between.
        let mut outputs: HashMap<String, Vec<WorkerBatch<M>>> = HashMap::new();
        for (id, w, cmds) in new_outputs {
            outputs.entry(id).or_default().push((w, cmds));
        }
        for edge in &removed_edges {
            if let Some(h) = kept_handle(&edge.from_node) {
                let list = outputs.entry(h.plan.id.clone()).or_default();
                for w in &h.commands {
                    list.push((w.clone(), vec![Command::RemoveOutput(edge.stats.clone())]));
                }
            }
        }
        let mut batches = Vec::new();
        for (id, list) in outputs {
            let mut by_worker: Vec<WorkerBatch<M>> = Vec::new();
            for (w, mut cmds) in list {
                match by_worker.iter_mut().find(|(s, _)| s.same_channel(&w)) {
                    Some((_, all)) => all.append(&mut cmds),
                    None => by_worker.push((w, cmds)),
                }
            }
            batches.extend(by_worker.into_iter().map(|(w, c)| (id.clone(), w, c)));
        }
        apply(batches)?;
        for id in &summary.nodes_removed {
            // A removed node drains what its inputs still hold once their senders are gone; a source stops.
            wiring.nodes[old_index[id]]
                .stop
                .store(true, Ordering::Release);
        }

        // The new wiring, and what `/status` shows.
        let mut nodes: Vec<NodeHandle<M>> = Vec::new();
        let mut old_nodes: Vec<Option<NodeHandle<M>>> = std::mem::take(&mut wiring.nodes)
            .into_iter()
            .map(Some)
            .collect();
        let mut started: HashMap<String, NodeHandle<M>> = started
            .into_iter()
            .map(|(h, _)| (h.plan.id.clone(), h))
            .collect();
        for node in &new.plan.nodes {
            let handle = match started.remove(&node.id) {
                Some(h) => h,
                None => old_nodes[old_index[&node.id]]
                    .take()
                    .expect("a kept node is in the old wiring once"),
            };
            let inbound = edges
                .iter()
                .filter(|e| e.to_node == node.id)
                .map(|e| e.stats.clone())
                .collect();
            handle.stats.set_inbound(inbound);
            nodes.push(handle);
        }
        self.status.replace(
            &new.plan.name,
            nodes.iter().map(|n| n.stats.clone()).collect(),
            edges.iter().map(|e| e.stats.clone()).collect(),
        );
        *wiring = super::runtime::Wiring {
            name: new.plan.name.clone(),
            nodes,
            edges,
        };
        for (node, rx) in orphans {
            while let Ok(message) = rx.rx.try_recv() {
                let why =
                    "its edge was removed by a reload and the node's new kind has no such input";
                self.dead_letters.put(&node, 0, why, &message);
            }
        }
        // Only the workers hold channel ends from here on, so a closed channel means its sender is gone.
        drop(fresh);
        drop(kept_ends);
        drop(starting);
        tracing::info!(%summary, "graph reloaded");
        Ok(summary)
    }

    /// Asks every worker of a node to flush and exit, and takes back their channel ends (those of one worker
    /// serve all: workers share their channels).
    fn retire(&self, handle: &NodeHandle<M>) -> Result<Ends<M>, ReloadError> {
        let mut replies: Vec<Receiver<Ends<M>>> = Vec::new();
        let mut batches = Vec::new();
        for w in &handle.commands {
            let (reply, ends) = crossbeam_channel::bounded(1);
            batches.push((
                handle.plan.id.clone(),
                w.clone(),
                vec![Command::Retire(reply)],
            ));
            replies.push(ends);
        }
        apply(batches)?;
        let mut all: Option<Ends<M>> = None;
        for ends in replies {
            match ends.recv_timeout(SAFE_POINT_WAIT) {
                Ok(ends) => {
                    all.get_or_insert(ends);
                }
                Err(RecvTimeoutError::Disconnected) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(ReloadError::Timeout {
                        node: handle.plan.id.clone(),
                    });
                }
            }
        }
        Ok(all.unwrap_or(Ends {
            inputs: Vec::new(),
            outputs: Vec::new(),
        }))
    }
}

fn find_sender<M>(
    outputs: &OutPorts<M>,
    edge: &Arc<super::edge::EdgeStats>,
) -> Option<EdgeSender<M>> {
    outputs
        .iter()
        .flat_map(|(_, list)| list)
        .find(|tx| Arc::ptr_eq(tx.stats(), edge))
        .cloned()
}

fn find_receiver<M>(
    inputs: &[(EdgeReceiver<M>, bool)],
    edge: &Arc<super::edge::EdgeStats>,
) -> Option<EdgeReceiver<M>> {
    inputs
        .iter()
        .find(|(rx, _)| Arc::ptr_eq(&rx.stats, edge))
        .map(|(rx, _)| rx.clone())
}
