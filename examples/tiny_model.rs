//! Writes the tests' tiny GGUF model (a seeded random Llama with a byte-level tokenizer) to try a graph
//! without downloading a real model: `cargo run --example tiny_model -- OUT.gguf [llama|qwen3] [seed]`.

use std::process::ExitCode;

use hearth::model::{Arch, TinySpec, write_tiny_model};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = args.first() else {
        eprintln!("usage: tiny_model OUT.gguf [llama|qwen3] [seed]");
        return ExitCode::from(2);
    };
    let arch = match args.get(1).map(String::as_str) {
        None | Some("llama") => Arch::Llama,
        Some("qwen3") => Arch::Qwen3,
        Some(other) => {
            eprintln!("unknown architecture `{other}` (llama, qwen3)");
            return ExitCode::from(2);
        }
    };
    let mut spec = TinySpec::new(arch);
    spec.dtype = candle_core::quantized::GgmlDType::Q8_0;
    if let Some(seed) = args.get(2) {
        match seed.parse() {
            Ok(s) => spec.seed = s,
            Err(e) => {
                eprintln!("seed `{seed}`: {e}");
                return ExitCode::from(2);
            }
        }
    }
    match write_tiny_model(std::path::Path::new(out), &spec) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{out}: {e}");
            ExitCode::FAILURE
        }
    }
}
