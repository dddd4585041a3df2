//! The engine tests, in one binary: each test binary links the whole crate and its dependencies.

#[path = "../http_util/mod.rs"]
mod http_util;
#[path = "../train_util/mod.rs"]
mod train_util;

mod cli;
mod dead_letters;
mod experiment;
mod failures;
mod page;
mod reload;
mod runtime;
mod validation;
