//! The eval tests, in one binary: each test binary links the whole crate and its dependencies.

#[path = "../train_util/mod.rs"]
mod train_util;

mod base_text;
mod gate;
mod general;
mod retention;
