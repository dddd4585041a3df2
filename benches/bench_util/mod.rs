//! What the serving benches share: which model they measure.

use std::path::{Path, PathBuf};

use hearth::model::{Arch, TinySpec, write_tiny_model};
use hearth::serve::{GenerateRequest, PromptInput, default_model};

/// The model a bench measures: a tiny one written into `scratch` for the smoke run; else `HEARTH_GGUF`,
/// or the default model prepared in `HEARTH_DATA_DIR` (default `target/hearth-bench-data`).
pub fn bench_model(smoke: bool, scratch: &Path) -> Result<PathBuf, Box<dyn std::error::Error>> {
    if smoke {
        let p = scratch.join("tiny.gguf");
        write_tiny_model(&p, &TinySpec::new(Arch::Llama))?;
        return Ok(p);
    }
    if let Ok(p) = std::env::var("HEARTH_GGUF") {
        return Ok(p.into());
    }
    let data = std::env::var("HEARTH_DATA_DIR").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/hearth-bench-data").to_owned()
    });
    Ok(default_model::ensure(Path::new(&data))?)
}

/// A greedy request for exactly `max_tokens` tokens (EOS ignored), so every run decodes the same amount.
pub fn fixed_length_request(
    model: Option<&str>,
    prompt: &str,
    max_tokens: usize,
) -> GenerateRequest {
    GenerateRequest {
        model: model.map(str::to_owned),
        prompt: PromptInput::Text(prompt.to_owned()),
        user: "bench".to_owned(),
        max_tokens: Some(max_tokens),
        temperature: None,
        top_p: None,
        top_k: None,
        seed: None,
        stop: Vec::new(),
        ignore_eos: true,
    }
}
