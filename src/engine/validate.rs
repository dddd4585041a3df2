//! Semantic validation of a graph with petgraph: every error is collected, each naming where it is.

use std::collections::HashMap;
use std::sync::Arc;

use petgraph::algo::{tarjan_scc, toposort};
use petgraph::graph::{DiGraph, NodeIndex};

use super::actor::{ActorFactory, PortSpec};
use super::schema::{
    EdgeSpec, GraphError, GraphFile, GraphSettings, Location, PortRef, RestartPolicy,
};
use super::{NodeKind, Payload};

/// A node ready to run: its factory (from a graph file's actor kind, or built in code by a test or bench).
pub struct PlanNode<M> {
    pub id: String,
    pub factory: Arc<dyn ActorFactory<M>>,
    pub workers: usize,
    pub restart: RestartPolicy,
    pub at: Option<Location>,
    /// The node's kind and parameters as written (graph files only): a reload compares them to tell a changed
    /// node from an unchanged one. A node built in code compares by factory identity instead.
    pub params: Option<String>,
}

impl<M> PlanNode<M> {
    /// Whether `other` would run exactly as this node does (same kind, parameters, workers and restart policy).
    pub fn same_as(&self, other: &PlanNode<M>) -> bool {
        let same_params = match (&self.params, &other.params) {
            (Some(a), Some(b)) => a == b,
            (None, None) => Arc::ptr_eq(&self.factory, &other.factory),
            _ => false,
        };
        same_params
            && self.id == other.id
            && self.workers == other.workers
            && self.restart == other.restart
    }
}

#[derive(Debug, Clone)]
pub struct PlanEdge {
    pub spec: EdgeSpec,
    pub at: Option<Location>,
}

impl<M> Clone for PlanNode<M> {
    fn clone(&self) -> Self {
        PlanNode {
            id: self.id.clone(),
            factory: self.factory.clone(),
            workers: self.workers,
            restart: self.restart,
            at: self.at,
            params: self.params.clone(),
        }
    }
}

/// A graph before validation: what a graph file declares, or what code assembles.
pub struct Plan<M> {
    pub name: String,
    pub settings: GraphSettings,
    pub nodes: Vec<PlanNode<M>>,
    pub edges: Vec<PlanEdge>,
}

impl<M> Clone for Plan<M> {
    fn clone(&self) -> Self {
        Plan {
            name: self.name.clone(),
            settings: self.settings.clone(),
            nodes: self.nodes.clone(),
            edges: self.edges.clone(),
        }
    }
}

impl<M: Payload> Plan<M> {
    pub fn new(name: &str) -> Self {
        Plan {
            name: name.to_owned(),
            settings: GraphSettings::default(),
            nodes: Vec::new(),
            edges: Vec::new(),
        }
    }

    /// Adds a node built in code (tests, benches).
    pub fn node(mut self, id: &str, factory: Arc<dyn ActorFactory<M>>, workers: usize) -> Self {
        self.nodes.push(PlanNode {
            id: id.to_owned(),
            factory,
            workers,
            restart: RestartPolicy::default(),
            at: None,
            params: None,
        });
        self
    }

    pub fn edge(mut self, spec: EdgeSpec) -> Self {
        self.edges.push(PlanEdge { spec, at: None });
        self
    }

    fn from_file<K: NodeKind<Message = M>>(file: GraphFile<K>) -> Self {
        Plan {
            name: file.name,
            settings: file.settings,
            nodes: file
                .nodes
                .into_iter()
                .map(|n| PlanNode {
                    factory: n.value.kind.factory(),
                    params: ron::to_string(&n.value.kind).ok(),
                    id: n.value.id,
                    workers: n.value.workers,
                    restart: n.value.restart,
                    at: Some(n.at),
                })
                .collect(),
            edges: file
                .edges
                .into_iter()
                .map(|e| PlanEdge {
                    spec: e.value,
                    at: Some(e.at),
                })
                .collect(),
        }
    }
}

/// A resolved edge endpoint pair.
#[derive(Debug, Clone)]
pub struct ResolvedEdge {
    pub spec: EdgeSpec,
    pub from_node: usize,
    pub from_port: &'static str,
    pub to_node: usize,
    pub to_port: &'static str,
}

/// A graph that passed validation; the runtime only accepts this.
pub struct Graph<M> {
    pub plan: Plan<M>,
    pub edges: Vec<ResolvedEdge>,
    /// Node indices in topological order of the non-feedback edges: the order shutdown drains in.
    pub topo_order: Vec<usize>,
}

impl<M: Payload> Graph<M> {
    /// Parses and validates graph text whose nodes are of kind `K`.
    pub fn from_ron<K: NodeKind<Message = M>>(src: &str) -> Result<Graph<M>, Vec<GraphError>> {
        let (file, errors) = GraphFile::<K>::parse(src)?;
        let unparsed = file.unparsed_nodes.clone();
        validate(Plan::from_file(file), errors, &unparsed)
    }

    /// A one-line summary for `hearth check`.
    pub fn summary(&self) -> String {
        let feedback = self.edges.iter().filter(|e| e.spec.feedback).count();
        let sources = self
            .plan
            .nodes
            .iter()
            .filter(|n| n.factory.info().source)
            .count();
        let workers: usize = self.plan.nodes.iter().map(|n| n.workers).sum();
        format!(
            "graph `{}` is valid: {} nodes ({} workers, {} sources), {} edges ({} feedback)",
            self.plan.name,
            self.plan.nodes.len(),
            workers,
            sources,
            self.edges.len(),
            feedback
        )
    }
}

fn err(at: Option<Location>, message: String) -> GraphError {
    GraphError { at, message }
}

/// Checks ids, ports, types, capacities, fed inputs and cycles, collecting every error.
pub fn validate<M: Payload>(
    plan: Plan<M>,
    mut errors: Vec<GraphError>,
    unparsed: &[String],
) -> Result<Graph<M>, Vec<GraphError>> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, node) in plan.nodes.iter().enumerate() {
        if let Some(&first) = index.get(node.id.as_str()) {
            let first_at = plan.nodes[first]
                .at
                .map(|l| format!(" (first at {l})"))
                .unwrap_or_default();
            errors.push(err(
                node.at,
                format!("duplicate node id `{}`{first_at}", node.id),
            ));
        } else {
            index.insert(&node.id, i);
        }
        if node.workers == 0 {
            errors.push(err(
                node.at,
                format!("node `{}`: workers must be at least 1", node.id),
            ));
        }
    }

    let mut resolved = Vec::new();
    let mut fed: Vec<Vec<&'static str>> = vec![Vec::new(); plan.nodes.len()];
    // Nodes named as a target by an edge that failed to resolve: their inputs are not reported as unfed too.
    let mut targeted_by_broken_edge: Vec<String> = Vec::new();
    for edge in &plan.edges {
        let spec = &edge.spec;
        let name = spec.name();
        if spec.capacity == 0 {
            errors.push(err(
                edge.at,
                format!("edge `{name}`: capacity must be at least 1"),
            ));
        }
        let from = resolve(
            &plan,
            &index,
            unparsed,
            edge,
            &spec.from,
            Side::From,
            &mut errors,
        );
        let to = resolve(
            &plan,
            &index,
            unparsed,
            edge,
            &spec.to,
            Side::To,
            &mut errors,
        );
        let (Some((from_node, from_port)), Some((to_node, to_port))) = (from, to) else {
            if let Some(target) = PortRef::parse(&spec.to) {
                targeted_by_broken_edge.push(target.node);
            }
            continue;
        };
        if from_port.message_type != to_port.message_type {
            errors.push(err(
                edge.at,
                format!(
                    "edge `{name}`: message-type mismatch: {} emits {}, {} expects {}",
                    spec.from, from_port.message_type, spec.to, to_port.message_type
                ),
            ));
            continue;
        }
        fed[to_node].push(to_port.name);
        resolved.push(ResolvedEdge {
            spec: spec.clone(),
            from_node,
            from_port: from_port.name,
            to_node,
            to_port: to_port.name,
        });
    }

    for (i, node) in plan.nodes.iter().enumerate() {
        let canonical = index.get(node.id.as_str()) == Some(&i);
        if !canonical || targeted_by_broken_edge.contains(&node.id) {
            continue;
        }
        for port in node.factory.info().inputs {
            if port.required && !fed[i].contains(&port.name) {
                errors.push(err(
                    node.at,
                    format!(
                        "input port `{}.{}` ({}) is fed by no edge",
                        node.id, port.name, port.message_type
                    ),
                ));
            }
        }
    }

    let mut graph: DiGraph<usize, usize> = DiGraph::new();
    let ids: Vec<NodeIndex> = (0..plan.nodes.len()).map(|i| graph.add_node(i)).collect();
    for (e, edge) in resolved.iter().enumerate() {
        if !edge.spec.feedback {
            graph.add_edge(ids[edge.from_node], ids[edge.to_node], e);
        }
    }
    for scc in tarjan_scc(&graph) {
        let is_cycle = scc.len() > 1 || graph.contains_edge(scc[0], scc[0]);
        if !is_cycle {
            continue;
        }
        let path = cycle_path(&graph, &scc);
        let names: Vec<&str> = path
            .iter()
            .map(|n| plan.nodes[graph[*n]].id.as_str())
            .collect();
        let first_edge = graph
            .find_edge(path[0], path[1 % path.len()])
            .map(|e| graph[e]);
        let at = first_edge.and_then(|e| {
            plan.edges
                .iter()
                .find(|pe| pe.spec.name() == resolved[e].spec.name())
                .and_then(|pe| pe.at)
        });
        errors.push(err(
            at,
            format!(
                "cycle not marked `feedback: true`: {} -> {}",
                names.join(" -> "),
                names[0]
            ),
        ));
    }

    if !errors.is_empty() {
        errors.sort_by_key(|e| e.at.map(|l| (l.line, l.col)).unwrap_or((usize::MAX, 0)));
        return Err(errors);
    }
    // No cycle remains among non-feedback edges (checked above), so toposort cannot fail; fall back to
    // declaration order rather than panic if that reasoning is ever broken.
    let topo_order = toposort(&graph, None)
        .map(|order| order.into_iter().map(|n| graph[n]).collect())
        .unwrap_or_else(|_| (0..plan.nodes.len()).collect());
    Ok(Graph {
        plan,
        edges: resolved,
        topo_order,
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    From,
    To,
}

fn resolve<M: Payload>(
    plan: &Plan<M>,
    index: &HashMap<&str, usize>,
    unparsed: &[String],
    edge: &PlanEdge,
    text: &str,
    side: Side,
    errors: &mut Vec<GraphError>,
) -> Option<(usize, &'static PortSpec<M::Type>)> {
    let field = if side == Side::From { "from" } else { "to" };
    let Some(port_ref) = PortRef::parse(text) else {
        errors.push(err(
            edge.at,
            format!(
                "edge `{}`: `{field}: \"{text}\"` must be \"node.port\"",
                edge.spec.name()
            ),
        ));
        return None;
    };
    let Some(&node) = index.get(port_ref.node.as_str()) else {
        if !unparsed.contains(&port_ref.node) {
            let mut known: Vec<&str> = index.keys().copied().collect();
            known.sort_unstable();
            errors.push(err(
                edge.at,
                format!(
                    "edge `{}`: unknown node `{}` in `{field}` (nodes: {})",
                    edge.spec.name(),
                    port_ref.node,
                    known.join(", ")
                ),
            ));
        }
        return None;
    };
    let info = plan.nodes[node].factory.info();
    let (port, ports, dir) = match side {
        Side::From => (info.output(&port_ref.port), info.outputs, "output"),
        Side::To => (info.input(&port_ref.port), info.inputs, "input"),
    };
    match port {
        Some(p) => Some((node, p)),
        None => {
            let names: Vec<&str> = ports.iter().map(|p| p.name).collect();
            errors.push(err(
                edge.at,
                format!(
                    "edge `{}`: node `{}` ({}) has no {dir} port `{}` ({dir} ports: {})",
                    edge.spec.name(),
                    port_ref.node,
                    info.name,
                    port_ref.port,
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                ),
            ));
            None
        }
    }
}

/// One cycle through a strongly connected component, as a node path (the first node is not repeated).
fn cycle_path(graph: &DiGraph<usize, usize>, scc: &[NodeIndex]) -> Vec<NodeIndex> {
    let start = *scc.iter().min().unwrap_or(&scc[0]);
    if scc.len() == 1 {
        return vec![start];
    }
    // Breadth-first search inside the component from `start` back to `start` gives a shortest cycle.
    let mut prev: HashMap<NodeIndex, NodeIndex> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(n) = queue.pop_front() {
        for next in graph.neighbors(n) {
            if !scc.contains(&next) {
                continue;
            }
            if next == start {
                let mut path = vec![n];
                let mut cur = n;
                while let Some(&p) = prev.get(&cur) {
                    path.push(p);
                    cur = p;
                }
                path.reverse();
                return path;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = prev.entry(next) {
                e.insert(n);
                queue.push_back(next);
            }
        }
    }
    scc.to_vec()
}
