//! hearth: a private AI that keeps learning from its user, on their own machine.
//!
//! Library areas live under `src/`; the actor kinds a graph file can name live under `actors/`, one thin file
//! each over a library module.

pub mod access;
#[path = "../actors/mod.rs"]
pub mod actors;
pub mod clock;
pub mod control;
pub mod curate;
pub mod demo;
pub mod engine;
pub mod eval;
pub mod experiment;
pub mod federate;
pub mod files;
pub mod gpu;
pub mod malloc;
pub mod message;
pub mod model;
pub mod page;
pub mod report;
pub mod serve;
pub mod server_thread;
pub mod store;
pub mod train;
