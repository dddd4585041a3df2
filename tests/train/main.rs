//! The train tests, in one binary: each test binary links the whole crate and its dependencies.

#[path = "../train_util/mod.rs"]
mod train_util;

mod actor;
mod bounds;
mod checkpoint;
mod device;
mod dora;
mod lora;
mod memory;
mod merge;
mod options;
mod peft;
mod replay;
mod requantize;
mod scores;
