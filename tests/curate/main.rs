//! The curate tests, in one binary: each test binary links the whole crate and its dependencies.

mod dedup;
mod graphs;
mod guard;
mod guard_model;
mod guard_probe;
mod props;
mod redact;
mod redact_cjk;
mod redact_layout;
mod redact_tagger;
mod secrets;
