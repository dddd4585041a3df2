//! Decode throughput. `cargo bench --bench model_decode` runs a synthetic Q8_0 model; set
//! `HEARTH_GGUF=/path/model.gguf` to measure a real one (e.g. SmolLM2-135M). Prints prefill and
//! steady decode tokens/s (best of 3), without and with a rank-8 adapter on all projections.
//! Set `RAYON_NUM_THREADS=1` for the single-thread serving figure. Under `cargo test --all-targets` (no
//! `--bench` argument, an unoptimised build) it only smoke-tests a two-layer model for a few steps.

use std::time::Instant;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use hearth::model::{Arch, LoraConfig, LoraPair, LoraSet, LoraTarget, TinySpec, write_tiny_model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Inside a pool, as the serve engine runs generation: candle's rayon ops then run inline instead of being
    // handed to a pool thread per op.
    let pool = rayon::ThreadPoolBuilder::new().build()?;
    pool.install(run).map_err(|e| e.to_string().into())
}

fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let dir = std::env::temp_dir().join(format!("hearth-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = match std::env::var("HEARTH_GGUF") {
        Ok(p) => p.into(),
        Err(_) => {
            let p = dir.join("bench.gguf");
            let mut spec = TinySpec::new(Arch::Llama);
            spec.hidden_size = 512;
            spec.intermediate_size = 1536;
            spec.num_layers = if smoke { 2 } else { 8 };
            spec.num_heads = 8;
            spec.num_kv_heads = 4;
            spec.head_dim = 64;
            spec.dtype = GgmlDType::Q8_0;
            write_tiny_model(&p, &spec)?;
            p
        }
    };
    let t0 = Instant::now();
    let (mut model, tok) = hearth::model::load(&path)?;
    if std::env::var("HEARTH_REQUANT_Q8").is_ok() {
        model = model.requantized(GgmlDType::Q8_0)?;
        println!("requantized to Q8_0");
    }
    println!(
        "{} loaded in {:.2}s: {:?}",
        path.display(),
        t0.elapsed().as_secs_f64(),
        model.config()
    );
    let prompt = tok.encode(
        &"The quick brown fox jumps over the lazy dog. ".repeat(4),
        false,
    )?;
    let fresh = LoraSet::fresh(&model, LoraConfig::new(8, 16.0, &LoraTarget::ALL), 1)?;
    let mut adapter = LoraSet::empty(fresh.config.clone());
    for (&(l, t), p) in fresh.iter() {
        let b = Tensor::randn(0f32, 0.01, p.b.dims(), &Device::Cpu)?;
        adapter.insert(l, t, LoraPair::new(p.a.clone(), b, p.scale));
    }
    let (steps, rounds) = if smoke { (4, 1) } else { (64, 3) };
    for (name, lora) in [("base", None), ("lora r8 all", Some(&adapter))] {
        let (mut prefill, mut decode) = (0f64, 0f64);
        for _ in 0..rounds {
            let mut cache = model.new_cache();
            let input = Tensor::from_slice(&prompt, (1, prompt.len()), &Device::Cpu)?;
            let t = Instant::now();
            let mut logits = model.forward_last(&input, Some(&mut cache), lora)?;
            prefill = prefill.max(prompt.len() as f64 / t.elapsed().as_secs_f64());
            let t = Instant::now();
            for _ in 0..steps {
                let next = logits.squeeze(0)?.argmax(0)?.to_scalar::<u32>()?;
                let input = Tensor::from_slice(&[next], (1, 1), &Device::Cpu)?;
                logits = model.forward_last(&input, Some(&mut cache), lora)?;
            }
            decode = decode.max(steps as f64 / t.elapsed().as_secs_f64());
        }
        println!(
            "{name:>12}: prefill {} tok at {prefill:.0} tok/s, decode {decode:.1} tok/s",
            prompt.len()
        );
    }
    // Batched decode (equal-length rows): total tokens/s, i.e. what a server gains by batching.
    for batch in [2usize, 4] {
        let mut best = 0f64;
        for _ in 0..rounds {
            let mut cache = model.new_cache();
            let rows: Vec<u32> = prompt
                .iter()
                .copied()
                .cycle()
                .take(prompt.len() * batch)
                .collect();
            let input = Tensor::from_vec(rows, (batch, prompt.len()), &Device::Cpu)?;
            let mut logits = model.forward_last(&input, Some(&mut cache), None)?;
            let t = Instant::now();
            for _ in 0..steps {
                let next = logits.argmax(1)?.reshape((batch, 1))?;
                logits = model.forward_last(&next, Some(&mut cache), None)?;
            }
            best = best.max((steps * batch) as f64 / t.elapsed().as_secs_f64());
        }
        println!(
            "{:>12}: decode {best:.1} tok/s in total",
            format!("batch {batch}")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
