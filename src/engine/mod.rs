//! The actor engine: graph files, validation, bounded edges, supervised workers, metrics.
//!
//! Generic over what a graph's nodes are ([`NodeKind`]) and what travels on its edges ([`Payload`]): the
//! engine knows no domain, as a graph file's kinds and messages belong to the application that runs it.

pub mod actor;
pub mod dead_letter;
pub mod draw;
pub mod edge;
pub mod metrics;
pub mod reload;
pub mod resources;
pub mod runtime;
pub mod schema;
pub mod validate;

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use actor::{
    Actor, ActorError, ActorFactory, BuildContext, Context, KindInfo, KindParams, Outbox, PortSpec,
    Produce,
};
pub use reload::{ReloadError, ReloadSummary, Reloader};
pub use resources::Resources;
pub use runtime::{RunReport, RunningGraph, start};
pub use schema::{EdgeSpec, GraphError, RestartPolicy, WhenFull};
pub use validate::{Graph, Plan};

/// A message on an edge. Shared by every edge it fans out to, so cloning must be cheap (an `Arc`).
pub trait Payload:
    Clone + Send + Sync + fmt::Debug + Serialize + DeserializeOwned + 'static
{
    /// The type a port declares; an edge connects an output and an input of the same type.
    type Type: Copy + Eq + Hash + fmt::Debug + fmt::Display + Send + Sync + 'static;

    fn message_type(&self) -> Self::Type;

    /// A short id for logs and dead letters.
    fn id(&self) -> &str;
}

/// What a graph file's `kind:` field parses into: one variant per actor kind, with its parameters.
pub trait NodeKind:
    DeserializeOwned + Serialize + Clone + fmt::Debug + Send + Sync + 'static
{
    type Message: Payload;

    fn factory(&self) -> Arc<dyn ActorFactory<Self::Message>>;
}
