//! The serve tests, in one binary: each test binary links the whole crate and its dependencies.

#[path = "../http_util/mod.rs"]
mod http_util;

mod api;
mod graph;
mod mix;
mod security;
