//! What the serving benches share: which model they measure, and adapters for it.

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
        lora: None,
        parse_special: true,
    }
}

/// Read bandwidth in bytes/s over a buffer far larger than the caches, summed by the current rayon pool's threads
/// (best of seven passes: other load on the machine only lowers it): what a memory-bound decode can at most stream.
/// Measured on small pages and again after moving the buffer onto huge pages as the model's weights are (see
/// `hearth::model::huge_pages`), and the higher figure kept, so that the bound is never flattered by pages.
#[allow(dead_code)]
pub fn read_bandwidth(smoke: bool) -> f64 {
    use rayon::prelude::*;
    let words: usize = if smoke { 1 << 20 } else { 64 << 20 }; // 512 MiB of u64 when measuring
    let buf: Vec<u64> = (0..words as u64).collect();
    let threads = rayon::current_num_threads().max(1);
    let mut best = 0f64;
    for pass in 0..14 {
        if pass == 7 {
            // SAFETY: any initialized u64 slice is readable as its bytes.
            let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, words * 8) };
            hearth::model::huge_pages::collapse_into_huge_pages(&[bytes]);
        }
        let t = std::time::Instant::now();
        let sum: u64 = buf
            .par_chunks(words.div_ceil(threads))
            .map(|c| {
                // Four independent lanes so the adds are not the bottleneck.
                let mut acc = [0u64; 4];
                for q in c.chunks_exact(4) {
                    for (a, v) in acc.iter_mut().zip(q) {
                        *a = a.wrapping_add(*v);
                    }
                }
                acc.iter().fold(0u64, |a, v| a.wrapping_add(*v))
            })
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / t.elapsed().as_secs_f64());
    }
    best
}

/// A rank-8 adapter on every projection with random A and B, rounded to bf16 and held in f32, as an adapter
/// loaded from a PEFT file is.
#[allow(dead_code)]
pub fn random_adapter(
    model: &hearth::model::Transformer,
    seed: u64,
) -> Result<hearth::model::LoraSet, Box<dyn std::error::Error>> {
    use candle_core::{DType, Device, Tensor};
    use hearth::model::{LoraConfig, LoraPair, LoraSet, LoraTarget};
    let fresh = LoraSet::fresh(model, LoraConfig::new(8, 16.0, &LoraTarget::ALL), seed)?;
    let mut set = LoraSet::empty(fresh.config.clone());
    let bf16 = |t: &Tensor| t.to_dtype(DType::BF16)?.to_dtype(DType::F32);
    for (&(l, t), p) in fresh.iter() {
        let b = Tensor::randn(0f32, 0.01, p.b.dims(), &Device::Cpu)?;
        set.insert(l, t, LoraPair::new(bf16(&p.a)?, bf16(&b)?, p.scale));
    }
    Ok(set)
}
