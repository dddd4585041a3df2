//! Curation: everything a captured datum passes before it may train. Nothing personal leaves this stage.

pub mod dedup;
pub mod guard;
pub mod redact;
pub mod secrets;
