//! The experiment file: one input stream, the variants it is replayed through, and how often.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ExperimentError;
use crate::actors::ActorKind;
use crate::engine::schema::{Location, ron_options};

/// An experiment as written in its RON file. Relative paths are relative to the file's own directory, so an
/// experiment runs the same from any working directory.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename = "Experiment", deny_unknown_fields)]
pub struct ExperimentSpec {
    #[serde(default = "default_name")]
    pub name: String,
    pub stream: StreamSpec,
    /// Seeds the order of the stream when `shuffle` is on; repeat `r` uses `seed + r`.
    #[serde(default)]
    pub seed: u64,
    /// Replay the stream in a seeded random order rather than file order.
    #[serde(default)]
    pub shuffle: bool,
    #[serde(default = "default_repeats")]
    pub repeats: usize,
    /// The node the replayed stream stands in for; the nodes that only fed it are left out.
    #[serde(default = "default_input")]
    pub input: String,
    /// The node whose inputs are counted: samples reaching it are admitted, decisions reaching it are decided.
    #[serde(default = "default_sink")]
    pub sink: String,
    pub variants: Vec<VariantSpec>,
    /// Train one delta per variant on its admitted set and report the gate's legs; off when absent.
    #[serde(default)]
    pub downstream: Option<super::downstream::DownstreamSpec>,
}

/// The stream every variant is fed: exactly one of a JSONL file of records with optional gold labels, or a
/// data directory whose store's captured interactions and feedback are replayed (read-only, without gold).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSpec {
    #[serde(default)]
    pub jsonl: Option<String>,
    /// A data directory (the one holding `hearth.sqlite`).
    #[serde(default)]
    pub store: Option<String>,
    /// Replay at most this many records (the first ones in file order, before any shuffle).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One graph to replay the stream through: a graph file, optionally with nodes' kinds replaced and the
/// curation chain reordered.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantSpec {
    pub name: String,
    pub graph: String,
    /// The chain of `in`/`out` nodes between `input` and `sink`, in this order; chain nodes left out are
    /// removed with their edges.
    #[serde(default)]
    pub order: Option<Vec<String>>,
    /// Replaces a node's kind and parameters, e.g. `{"dedup": Dedup(threshold: 0.7)}`.
    #[serde(default)]
    pub set: BTreeMap<String, ActorKind>,
    /// Sets single parameters of a node, keeping the rest as the graph file has them:
    /// `{"dedup.threshold": 0.9, "guard.policy.controversial": "Drop"}` (enum values as strings).
    /// Applied after `set`.
    #[serde(default)]
    pub params: BTreeMap<String, ron::Value>,
}

fn default_name() -> String {
    "experiment".to_owned()
}
fn default_repeats() -> usize {
    1
}
fn default_input() -> String {
    "capture".to_owned()
}
fn default_sink() -> String {
    "store".to_owned()
}

/// Where the stream comes from, its path resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamSource {
    Jsonl(PathBuf),
    /// A data directory; its store is opened read-only.
    Store(PathBuf),
}

impl StreamSource {
    pub fn path(&self) -> &Path {
        match self {
            StreamSource::Jsonl(p) | StreamSource::Store(p) => p,
        }
    }
}

/// A parsed experiment with the paths it names resolved.
#[derive(Debug, Clone)]
pub struct Experiment {
    pub file: PathBuf,
    pub spec: ExperimentSpec,
    pub stream: StreamSource,
    /// Each variant's graph file, in the order of `spec.variants`.
    pub graphs: Vec<PathBuf>,
    /// `downstream.model` and `downstream.probes`, resolved.
    pub downstream_model: Option<PathBuf>,
    pub downstream_probes: Option<PathBuf>,
}

impl Experiment {
    /// Reads and checks an experiment file; every error names the file and where in it.
    pub fn load(path: &Path) -> Result<Experiment, ExperimentError> {
        let src = std::fs::read_to_string(path).map_err(|source| ExperimentError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Experiment::parse(path, &src)
    }

    /// Parses experiment text as if read from `path` (relative paths resolve beside it).
    pub fn parse(path: &Path, src: &str) -> Result<Experiment, ExperimentError> {
        let spec: ExperimentSpec =
            ron_options()
                .from_str(src)
                .map_err(|e| ExperimentError::Parse {
                    file: path.to_path_buf(),
                    at: Location {
                        line: e.span.start.line,
                        col: e.span.start.col,
                    },
                    message: e.code.to_string(),
                })?;
        let field = |field: &str, message: &str| ExperimentError::Field {
            file: path.to_path_buf(),
            field: field.to_owned(),
            message: message.to_owned(),
        };
        if spec.repeats == 0 {
            return Err(field("repeats", "must be at least 1"));
        }
        if spec.variants.is_empty() {
            return Err(field("variants", "name at least one variant"));
        }
        if spec.stream.limit == Some(0) {
            return Err(field("stream.limit", "must be at least 1"));
        }
        let mut seen = std::collections::HashSet::new();
        for v in &spec.variants {
            if !seen.insert(v.name.as_str()) {
                return Err(field(
                    "variants",
                    &format!("variant name `{}` is used twice", v.name),
                ));
            }
            if v.name.is_empty() || v.name.contains(['/', '\\', ',', '\n']) {
                return Err(field(
                    "variants",
                    &format!(
                        "variant name `{}` must be non-empty, without `/`, `\\` or `,`",
                        v.name
                    ),
                ));
            }
        }
        let base = path.parent().unwrap_or(Path::new(""));
        let resolve = |p: &str| base.join(p);
        let stream = match (&spec.stream.jsonl, &spec.stream.store) {
            (Some(f), None) => StreamSource::Jsonl(resolve(f)),
            (None, Some(d)) => StreamSource::Store(resolve(d)),
            _ => {
                return Err(field(
                    "stream",
                    "name exactly one of `jsonl` (a file) or `store` (a data directory)",
                ));
            }
        };
        if let Some(d) = &spec.downstream {
            d.train
                .validate()
                .map_err(|e| field("downstream.train", &e.to_string()))?;
        }
        Ok(Experiment {
            file: path.to_path_buf(),
            downstream_model: spec.downstream.as_ref().map(|d| resolve(&d.model)),
            downstream_probes: spec
                .downstream
                .as_ref()
                .and_then(|d| d.probes.as_deref())
                .map(resolve),
            stream,
            graphs: spec.variants.iter().map(|v| resolve(&v.graph)).collect(),
            spec,
        })
    }
}
