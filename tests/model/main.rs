//! The model tests, in one binary: each test binary links the whole crate and its dependencies.

#[path = "../train_util/mod.rs"]
mod train_util;

mod chat_templates;
mod exactness;
mod generate;
mod gguf;
mod kquant;
mod lora;
mod peft_scales;
mod q8_layout;
mod real;
mod spm;
mod switches;
mod tokenizer;
mod transpose_cache;
mod util;
