//! What the serving benches share: which model they measure, and adapters for it.

use std::path::{Path, PathBuf};

use std::time::Instant;

use hearth::message::{ChatMessage, Origin, Provenance, Role, Sample, SampleContent};
use hearth::model::{Arch, TinySpec, Tokenizer, Transformer, write_tiny_model};
use hearth::serve::{
    Completion, GenerateRequest, PromptInput, ServeConfig, Server, StreamEvent, default_model,
};
use hearth::train::{CycleReport, LoraTrainer, TrainConfig};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The model a bench measures: a tiny one written into `scratch` for the smoke run; else `HEARTH_GGUF`,
/// or the default model prepared in `HEARTH_DATA_DIR` (default `target/hearth-bench-data`).
#[allow(dead_code)]
pub fn bench_model(smoke: bool, scratch: &Path) -> Res<PathBuf> {
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

/// Serving as the benches measure it: the model named `base`, answers up to 4096 tokens, and no prompt cache,
/// so that every request prefills its whole prompt (repetitions send the same prompt, which the cache would
/// otherwise serve).
#[allow(dead_code)]
pub fn uncached_config() -> ServeConfig {
    ServeConfig {
        model_name: "base".to_owned(),
        max_tokens_limit: 4096,
        prompt_cache_bytes: 0,
        ..ServeConfig::default()
    }
}

/// A greedy request for exactly `max_tokens` tokens (EOS ignored), so every run decodes the same amount.
#[allow(dead_code)]
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

/// Submits `req` and follows it to its end: prefill tokens/s (the prompt over the time to the first token),
/// decode tokens/s after the first token, and the completion.
#[allow(dead_code)]
pub fn timed(server: &Server, req: GenerateRequest) -> Res<(f64, f64, Completion)> {
    let t0 = Instant::now();
    let admitted = server.engine().submit(req, "bench")?;
    let mut first = None;
    loop {
        match admitted.pipe.next_event() {
            StreamEvent::Text(_) => {
                first.get_or_insert_with(Instant::now);
            }
            StreamEvent::Done(c) => {
                let end = Instant::now();
                let first = first.unwrap_or(end);
                let prefill = c.prompt_tokens as f64 / (first - t0).as_secs_f64().max(1e-9);
                let decode_s = (end - first).as_secs_f64().max(1e-9);
                let decode = c.completion_tokens.saturating_sub(1) as f64 / decode_s;
                return Ok((prefill, decode, c));
            }
            StreamEvent::Failed(m) => return Err(m.into()),
            StreamEvent::Uncommitted(e) => return Err(e.into()),
        }
    }
}

/// Eight SFT samples of one long response each, for the training benches.
#[allow(dead_code)]
pub fn story_samples() -> Vec<Sample> {
    let long = "the quick brown fox jumps over the lazy dog and then runs into the forest where "
        .repeat(8);
    (0..8)
        .map(|i| Sample {
            id: format!("b{i}"),
            user: "bench".into(),
            origin: Origin::Grounded,
            content: SampleContent::Sft {
                prompt: vec![ChatMessage {
                    role: Role::User,
                    content: format!("tell story {i}"),
                }],
                response: long.clone(),
            },
            provenance: Provenance::default(),
            created_at_unix_ms: 0,
        })
        .collect()
}

/// `steps` LoRA SFT steps (forward, backward, AdamW) at sequence 128, batch 4, rank `rank` on all seven
/// projections, after one untimed step (as the PEFT script's warm-up: it faults the step's memory in and
/// builds the layers' backward transposes), inside a pool as the trainer actor runs a cycle.
#[allow(dead_code)]
pub fn lora_cycle(
    model: &Transformer,
    tok: &Tokenizer,
    rank: usize,
    steps: usize,
) -> Res<CycleReport> {
    let pool = hearth::train::background_pool(rayon::current_num_threads())?;
    let cfg = TrainConfig {
        rank,
        alpha: 2.0 * rank as f64,
        steps,
        batch_size: 4,
        max_seq_len: 128,
        warmup_steps: 1,
        replay_fraction: 0.0,
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    // The memory budgets, when set: `HEARTH_BENCH_ACTIVATION_MIB`, `HEARTH_BENCH_TRANSPOSE_MIB`.
    let mib = |var: &str, default: usize| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let cfg = TrainConfig {
        activation_budget_mib: mib("HEARTH_BENCH_ACTIVATION_MIB", cfg.activation_budget_mib),
        transpose_cache_mib: mib("HEARTH_BENCH_TRANSPOSE_MIB", cfg.transpose_cache_mib),
        ..cfg
    };
    let warm = TrainConfig {
        steps: 1,
        ..cfg.clone()
    };
    let samples = story_samples();
    pool.install(|| LoraTrainer::new(model, tok, warm, None)?.train_cycle(&samples, |_| {}))?;
    let mut tr = LoraTrainer::new(model, tok, cfg, None)?;
    Ok(pool.install(|| tr.train_cycle(&samples, |_| {}))?)
}
