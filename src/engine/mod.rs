//! The actor engine: graph files, validation, bounded edges, supervised workers, metrics.

pub mod actor;
pub mod dead_letter;
pub mod draw;
pub mod edge;
pub mod message;
pub mod metrics;
pub mod runtime;
pub mod schema;
pub mod validate;

pub use actor::{
    Actor, ActorError, ActorFactory, BuildContext, KindInfo, KindParams, Outbox, PortSpec, Produce,
    expect_delta, expect_sample,
};
pub use message::{Message, MessageType};
pub use runtime::{RunReport, RunningGraph, start};
pub use schema::{EdgeSpec, GraphError, RestartPolicy, WhenFull};
pub use validate::{Graph, Plan};
