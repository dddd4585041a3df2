//! Turns a variant (a graph file, its overrides and reordering) into a graph ready to run on the stream.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use indicatif::ProgressBar;

use super::tap::{Collected, ReplayFactory, TapFactory, Timings};
use super::{Experiment, ExperimentError};
use crate::actors::{ActorKind, Graph, Plan};
use crate::engine::schema::{EdgeSpec, GraphError, GraphFile, Located, PortRef};
use crate::engine::validate::{PlanEdge, PlanNode, validate};
use crate::message::Sample;

/// A variant's graph with the experiment's taps in place.
pub struct Built {
    pub graph: Graph,
    /// Handler times per node id, in the graph's node order (the replay source is not timed).
    pub timings: Vec<(String, Timings)>,
    pub collected: Arc<Mutex<Collected>>,
}

fn graph_errors(file: &std::path::Path, errors: &[GraphError]) -> String {
    errors
        .iter()
        .map(|e| match e.at {
            Some(at) => format!("{}:{at}: {}", file.display(), e.message),
            None => format!("{}: {}", file.display(), e.message),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Builds variant `index` of `exp` over `samples`. Every node runs one worker, so the order in which curation
/// sees the stream, and so every count, depends on the stream and seed alone.
pub fn build(
    exp: &Experiment,
    index: usize,
    samples: Arc<Vec<Arc<Sample>>>,
    progress: Option<ProgressBar>,
) -> Result<Built, ExperimentError> {
    let spec = &exp.spec.variants[index];
    let path = &exp.graphs[index];
    let variant_err = |field: &str, message: String| ExperimentError::Variant {
        file: exp.file.clone(),
        variant: spec.name.clone(),
        field: field.to_owned(),
        message,
    };
    let src = std::fs::read_to_string(path).map_err(|source| ExperimentError::Io {
        path: path.clone(),
        source,
    })?;
    let graph_err = |errors: &[GraphError]| ExperimentError::Graph {
        variant: spec.name.clone(),
        errors: graph_errors(path, errors),
    };
    let (mut file, errors) = GraphFile::<ActorKind>::parse(&src).map_err(|e| graph_err(&e))?;
    if !errors.is_empty() {
        return Err(graph_err(&errors));
    }
    let ids = |file: &GraphFile<ActorKind>| {
        file.nodes
            .iter()
            .map(|n| n.value.id.clone())
            .collect::<Vec<_>>()
            .join(", ")
    };

    for (id, kind) in &spec.set {
        let Some(node) = file.nodes.iter_mut().find(|n| &n.value.id == id) else {
            return Err(variant_err(
                "set",
                format!(
                    "no node `{id}` in {} (nodes: {})",
                    path.display(),
                    ids(&file)
                ),
            ));
        };
        node.value.kind = kind.clone();
    }
    for (key, value) in &spec.params {
        let (id, param) = key.split_once('.').unwrap_or((key.as_str(), ""));
        let Some(node) = file.nodes.iter_mut().find(|n| n.value.id == id) else {
            return Err(variant_err(
                "params",
                format!(
                    "`{key}`: no node `{id}` in {} (nodes: {})",
                    path.display(),
                    ids(&file)
                ),
            ));
        };
        node.value.kind = with_param(&node.value.kind, param, value)
            .map_err(|m| variant_err("params", format!("`{key}`: {m}")))?;
    }

    let input = exp.spec.input.as_str();
    let sink = exp.spec.sink.as_str();
    for (field, id) in [("input", input), ("sink", sink)] {
        if !file.nodes.iter().any(|n| n.value.id == id) {
            return Err(variant_err(
                field,
                format!(
                    "no node `{id}` in {} (nodes: {})",
                    path.display(),
                    ids(&file)
                ),
            ));
        }
    }

    if let Some(order) = &spec.order {
        reorder(&mut file, input, sink, order)
            .map_err(|m| variant_err("order", format!("{m} in {}", path.display())))?;
    }
    drop_feeders(&mut file, input);

    let collected = Arc::new(Mutex::new(Collected::default()));
    let mut timings = Vec::new();
    let mut plan = Plan::new(&file.name);
    plan.settings = file.settings.clone();
    for node in &file.nodes {
        let spec = &node.value;
        let factory: Arc<dyn crate::engine::ActorFactory<crate::message::Message>> =
            if spec.id == input {
                Arc::new(ReplayFactory {
                    samples: samples.clone(),
                })
            } else {
                let t: Timings = Arc::default();
                timings.push((spec.id.clone(), t.clone()));
                let at_sink = spec.id == sink;
                Arc::new(TapFactory {
                    inner: spec.kind.factory(),
                    timings: t,
                    collect: at_sink.then(|| collected.clone()),
                    progress: if at_sink { progress.clone() } else { None },
                })
            };
        plan.nodes.push(PlanNode {
            id: spec.id.clone(),
            factory,
            workers: 1,
            restart: spec.restart,
            at: Some(node.at),
            params: None,
        });
    }
    plan.edges = file
        .edges
        .iter()
        .map(|e| PlanEdge {
            spec: e.value.clone(),
            at: Some(e.at),
        })
        .collect();
    let graph = validate(plan, Vec::new(), &[]).map_err(|e| graph_err(&e))?;
    Ok(Built {
        graph,
        timings,
        collected,
    })
}

/// `kind` with the parameter at the dotted `path` set to `value`. The kind goes through its JSON form, so any
/// parameter a graph file can write can be set; the result is read back to make sure the kind took it.
fn with_param(kind: &ActorKind, path: &str, value: &ron::Value) -> Result<ActorKind, String> {
    if path.is_empty() {
        return Err("name a parameter: `node.parameter`".to_owned());
    }
    let value = serde_json::to_value(value).map_err(|e| e.to_string())?;
    let mut json = serde_json::to_value(kind).map_err(|e| e.to_string())?;
    // An externally tagged variant: `{"Dedup": {...params}}`.
    let Some(params) = json
        .as_object_mut()
        .and_then(|o| o.values_mut().next())
        .filter(|p| p.is_object())
    else {
        return Err("this node's kind has no parameters".to_owned());
    };
    let mut at = params;
    let keys: Vec<&str> = path.split('.').collect();
    for (i, k) in keys.iter().enumerate() {
        let Some(obj) = at.as_object_mut() else {
            return Err(format!(
                "`{}` is not a group of parameters",
                keys[..i].join(".")
            ));
        };
        if i + 1 == keys.len() {
            obj.insert((*k).to_owned(), value.clone());
            break;
        }
        at = obj
            .entry((*k).to_owned())
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
    }
    let kind: ActorKind = serde_json::from_value(json).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&kind).map_err(|e| e.to_string())?;
    let read = back
        .as_object()
        .and_then(|o| o.values().next())
        .and_then(|p| keys.iter().try_fold(p, |v, k| v.get(k)));
    let same = match (read, &value) {
        // f32 parameters come back rounded.
        (Some(serde_json::Value::Number(a)), serde_json::Value::Number(b)) => {
            let (a, b) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            (a - b).abs() <= 1e-6 * b.abs().max(1.0)
        }
        (Some(a), b) => a == b,
        (None, _) => false,
    };
    if !same {
        return Err(format!("no parameter `{path}` takes {value}"));
    }
    Ok(kind)
}

fn port(s: &str) -> Option<PortRef> {
    PortRef::parse(s)
}

/// Removes every edge into `input` and every node whose edges all led into what is removed: the nodes that
/// only fed the input (scripted users, a server) have no place in a replay.
fn drop_feeders(file: &mut GraphFile<ActorKind>, input: &str) {
    let node_of = |s: &str| port(s).map(|p| p.node).unwrap_or_default();
    let mut dropped: HashSet<String> = HashSet::new();
    loop {
        let mut changed = false;
        for node in &file.nodes {
            let id = &node.value.id;
            if id == input || dropped.contains(id) {
                continue;
            }
            let mut outs = file
                .edges
                .iter()
                .filter(|e| node_of(&e.value.from) == *id)
                .peekable();
            if outs.peek().is_some()
                && outs.all(|e| {
                    let to = node_of(&e.value.to);
                    to == input || dropped.contains(&to)
                })
            {
                dropped.insert(id.clone());
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    file.nodes.retain(|n| !dropped.contains(&n.value.id));
    file.edges.retain(|e| {
        let (from, to) = (node_of(&e.value.from), node_of(&e.value.to));
        to != input && !dropped.contains(&from) && !dropped.contains(&to)
    });
}

/// Rewires the chain of `out` → `in` edges from `input` to the sink as `order`; chain nodes not in `order`
/// are removed with all their edges.
fn reorder(
    file: &mut GraphFile<ActorKind>,
    input: &str,
    sink: &str,
    order: &[String],
) -> Result<(), String> {
    let mut chain: Vec<String> = Vec::new();
    let mut chain_edges: Vec<usize> = Vec::new();
    let mut cur = input.to_owned();
    let exit = loop {
        let from = format!("{cur}.out");
        let outs: Vec<usize> = (0..file.edges.len())
            .filter(|&i| file.edges[i].value.from == from)
            .collect();
        let &[i] = outs.as_slice() else {
            return Err(format!(
                "`{from}` feeds {} edges; `order` needs one chain of `out` -> `in` edges from `{input}` to `{sink}`",
                outs.len()
            ));
        };
        chain_edges.push(i);
        let to = port(&file.edges[i].value.to)
            .ok_or_else(|| format!("edge to `{}` is not `node.port`", file.edges[i].value.to))?;
        if to.node == sink || to.port != "in" {
            break file.edges[i].value.to.clone();
        }
        if chain.contains(&to.node) || to.node == input {
            return Err(format!("the chain from `{input}` loops at `{}`", to.node));
        }
        chain.push(to.node.clone());
        cur = to.node;
    };
    let known: HashSet<&str> = file.nodes.iter().map(|n| n.value.id.as_str()).collect();
    let mut seen = BTreeSet::new();
    for id in order {
        if !known.contains(id.as_str()) {
            return Err(format!("no node `{id}`"));
        }
        if id == input || id == sink {
            return Err(format!(
                "`{id}` is the experiment's input or sink, not a chain node"
            ));
        }
        if !seen.insert(id.as_str()) {
            return Err(format!("`{id}` is named twice"));
        }
    }
    let template = file.edges[chain_edges[0]].clone();
    let removed: HashSet<&String> = chain.iter().filter(|c| !order.contains(c)).collect();
    let rewired: HashSet<&String> = order.iter().collect();
    let mut kept: Vec<Located<EdgeSpec>> = Vec::new();
    for (i, e) in file.edges.iter().enumerate() {
        if chain_edges.contains(&i) {
            continue;
        }
        let (Some(from), Some(to)) = (port(&e.value.from), port(&e.value.to)) else {
            kept.push(e.clone());
            continue;
        };
        if removed.contains(&from.node) || removed.contains(&to.node) {
            continue;
        }
        if (rewired.contains(&from.node) && from.port == "out")
            || (rewired.contains(&to.node) && to.port == "in")
        {
            continue;
        }
        kept.push(e.clone());
    }
    let mut stops: Vec<String> = vec![format!("{input}.out")];
    for id in order {
        stops.push(format!("{id}.in"));
        stops.push(format!("{id}.out"));
    }
    stops.push(exit);
    for pair in stops.chunks(2) {
        let mut edge = template.clone();
        edge.value.from = pair[0].clone();
        edge.value.to = pair[1].clone();
        kept.push(edge);
    }
    file.edges = kept;
    file.nodes.retain(|n| !removed.contains(&n.value.id));
    Ok(())
}
