//! The engine tests, in one binary: each test binary links the whole crate and its dependencies.

mod cli;
mod runtime;
mod validation;
