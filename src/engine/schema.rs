//! The graph file format (`graphs/*.ron`) and its parsing.
//!
//! Nodes and edges are parsed one by one from raw RON slices so that a mistake in one node does not hide the
//! mistakes in the others: `hearth check` reports every error at once, each with its `file:line:col`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

use super::NodeKind;

/// What a full mailbox does to the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum WhenFull {
    /// Block the sender until there is room: backpressure flows upstream and nothing is lost.
    #[default]
    Block,
    /// Discard the message being sent, and count it.
    DropNewest,
    /// Discard the oldest queued message to make room, and count it.
    DropOldest,
}

/// How a node's workers are restarted after a failed message.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RestartPolicy {
    /// Restarts allowed within `window_secs`; one more marks the node failed.
    pub max_restarts: u32,
    pub window_secs: f64,
    /// First backoff; doubles with each restart in the window, up to `max_backoff_ms`.
    pub backoff_ms: u64,
    pub max_backoff_ms: u64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 5,
            window_secs: 60.0,
            backoff_ms: 100,
            max_backoff_ms: 10_000,
        }
    }
}

impl RestartPolicy {
    pub fn window(&self) -> Duration {
        Duration::from_secs_f64(self.window_secs.max(0.0))
    }

    /// Backoff before the `n`-th restart in the window (n starts at 1).
    pub fn backoff(&self, n: u32) -> Duration {
        let factor = 1u64 << n.saturating_sub(1).min(20);
        Duration::from_millis(
            self.backoff_ms
                .saturating_mul(factor)
                .min(self.max_backoff_ms),
        )
    }
}

fn default_workers() -> usize {
    1
}

/// One node of the graph: an actor kind `K` with its parameters, run by `workers` instances sharing one mailbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec<K> {
    pub id: String,
    pub kind: K,
    #[serde(default = "default_workers")]
    pub workers: usize,
    #[serde(default)]
    pub restart: RestartPolicy,
}

/// A `node.port` reference as written in an edge.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortRef {
    pub node: String,
    pub port: String,
}

impl PortRef {
    pub fn parse(s: &str) -> Option<PortRef> {
        let (node, port) = s.split_once('.')?;
        if node.is_empty() || port.is_empty() || port.contains('.') {
            return None;
        }
        Some(PortRef {
            node: node.to_owned(),
            port: port.to_owned(),
        })
    }
}

impl fmt::Display for PortRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.node, self.port)
    }
}

/// A bounded mailbox from one output port to one input port.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeSpec {
    pub from: String,
    pub to: String,
    pub capacity: usize,
    #[serde(default)]
    pub when_full: WhenFull,
    /// Marks an intended cycle (e.g. trainer -> serve hot-swap); any other cycle is an error.
    #[serde(default)]
    pub feedback: bool,
}

impl EdgeSpec {
    /// The edge's name in metrics, status and logs: `from->to`.
    pub fn name(&self) -> String {
        format!("{}->{}", self.from, self.to)
    }
}

fn default_data_dir() -> String {
    "hearth-data".to_owned()
}

/// Graph-wide settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphSettings {
    /// Address of the control endpoints (`/healthz`, `/status`, `/metrics`); `None` runs without them.
    #[serde(default)]
    pub control: Option<String>,
    /// Where dead letters and other state live, relative to the working directory.
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// When `DATA_DIR/dead_letters.jsonl` rotates and how many rotated files are kept.
    #[serde(default)]
    pub dead_letters: super::dead_letter::Rotation,
}

impl Default for GraphSettings {
    fn default() -> Self {
        GraphSettings {
            control: None,
            data_dir: default_data_dir(),
            dead_letters: Default::default(),
        }
    }
}

/// A position in a graph file, 1-based like editors show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Location {
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// Byte offset -> 1-based line and column (in characters).
pub fn location_of(src: &str, offset: usize) -> Location {
    let offset = offset.min(src.len());
    let before = &src[..src.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    Location {
        line,
        col: before[line_start..].chars().count() + 1,
    }
}

/// 1-based line and column (in characters) -> byte offset.
fn offset_of(src: &str, loc: Location) -> usize {
    let mut offset = 0;
    for (i, line) in src.split_inclusive('\n').enumerate() {
        if i + 1 == loc.line {
            let col_bytes: usize = line
                .chars()
                .take(loc.col.saturating_sub(1))
                .map(char::len_utf8)
                .sum();
            return offset + col_bytes;
        }
        offset += line.len();
    }
    src.len()
}

/// The top level of a graph file, with nodes and edges left raw so each parses (and fails) on its own.
#[derive(Deserialize)]
#[serde(rename = "Graph", deny_unknown_fields)]
struct RawGraph<'a> {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    settings: GraphSettings,
    #[serde(borrow)]
    nodes: Vec<&'a ron::value::RawValue>,
    #[serde(borrow)]
    edges: Vec<&'a ron::value::RawValue>,
}

/// A node or edge together with where it was written.
#[derive(Debug, Clone)]
pub struct Located<T> {
    pub value: T,
    pub at: Location,
}

/// A parsed graph file; semantic checks happen in [`crate::engine::validate`].
#[derive(Debug, Clone)]
pub struct GraphFile<K> {
    pub name: String,
    pub settings: GraphSettings,
    pub nodes: Vec<Located<NodeSpec<K>>>,
    pub edges: Vec<Located<EdgeSpec>>,
    /// Ids of nodes that failed to parse; edges naming them are not reported again as unknown.
    pub unparsed_nodes: Vec<String>,
}

/// A problem in a graph file, with where it is. Messages are written for the person editing the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphError {
    pub at: Option<Location>,
    pub message: String,
}

impl GraphError {
    pub fn at(at: Location, message: impl Into<String>) -> Self {
        GraphError {
            at: Some(at),
            message: message.into(),
        }
    }
}

/// Converts a ron error inside `slice` (a sub-slice of `src`) into a located [`GraphError`].
fn ron_error(src: &str, slice: &str, err: &ron::error::SpannedError, what: &str) -> GraphError {
    let base = slice.as_ptr() as usize - src.as_ptr() as usize;
    let inner = offset_of(
        slice,
        Location {
            line: err.span.start.line,
            col: err.span.start.col,
        },
    );
    GraphError::at(
        location_of(src, base + inner),
        format!("{what}: {}", err.code),
    )
}

/// Where `slice` (a sub-slice of `src`) starts, skipping leading whitespace.
fn start_of(src: &str, slice: &str) -> Location {
    let trimmed = slice.trim_start();
    location_of(src, trimmed.as_ptr() as usize - src.as_ptr() as usize)
}

/// The `id` of a node written in `raw`, when it can be read despite other errors, to name the node in messages.
fn node_id_hint(raw: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct IdOnly {
        id: String,
    }
    // Reparse leniently: only `id` is wanted, everything else is ignored.
    let value: ron::Value = ron_options().from_str(raw).ok()?;
    value.into_rust::<IdOnly>().ok().map(|n| n.id)
}

impl<K: NodeKind> GraphFile<K> {
    /// Parses graph text. A top-level syntax error stops parsing; otherwise every node and edge that fails is
    /// reported and the rest is returned, so validation can go on to find the remaining errors too.
    pub fn parse(src: &str) -> Result<(GraphFile<K>, Vec<GraphError>), Vec<GraphError>> {
        let raw: RawGraph<'_> = match ron_options().from_str(src) {
            Ok(raw) => raw,
            Err(e) => return Err(vec![ron_error(src, src, &e, "syntax")]),
        };
        let mut errors = Vec::new();
        let mut nodes = Vec::new();
        let mut unparsed_nodes = Vec::new();
        for raw_node in &raw.nodes {
            let text = raw_node.get_ron();
            let at = start_of(src, text);
            match ron_options().from_str::<NodeSpec<K>>(text) {
                Ok(node) => nodes.push(Located { value: node, at }),
                Err(e) => {
                    let id = node_id_hint(text);
                    let what = match &id {
                        Some(id) => format!("node `{id}`"),
                        None => "node".to_owned(),
                    };
                    errors.push(ron_error(src, text, &e, &what));
                    unparsed_nodes.extend(id);
                }
            }
        }
        let mut edges = Vec::new();
        for raw_edge in &raw.edges {
            let text = raw_edge.get_ron();
            let at = start_of(src, text);
            match ron_options().from_str::<EdgeSpec>(text) {
                Ok(edge) => edges.push(Located { value: edge, at }),
                Err(e) => errors.push(ron_error(src, text, &e, "edge")),
            }
        }
        let file = GraphFile {
            name: raw.name.unwrap_or_else(|| "graph".to_owned()),
            settings: raw.settings,
            nodes,
            edges,
            unparsed_nodes,
        };
        Ok((file, errors))
    }
}

/// RON as graph files are written: `Redact(types: [Email])` for a kind with parameters, `Some` implied.
pub fn ron_options() -> ron::Options {
    ron::Options::default()
        .with_default_extension(ron::extensions::Extensions::UNWRAP_VARIANT_NEWTYPES)
        .with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME)
}
