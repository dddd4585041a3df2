//! hearth: a private AI that keeps learning from its user, on their own machine.
//!
//! Library areas live under `src/`; the actor kinds a graph file can name live under `actors/`, one thin file
//! each over a library module.

#[path = "../actors/mod.rs"]
pub mod actors;
pub mod curate;
pub mod engine;
pub mod eval;
pub mod federate;
pub mod http;
pub mod malloc;
pub mod model;
pub mod report;
pub mod serve;
pub mod store;
pub mod train;
