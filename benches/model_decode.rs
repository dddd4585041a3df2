//! Decode throughput. `cargo bench --bench model_decode` runs a synthetic Q8_0 model; set
//! `HEARTH_GGUF=/path/model.gguf` to measure a real one (e.g. SmolLM2-135M). Prints prefill and
//! steady decode tokens/s (best of 3), without and with a rank-8 adapter on all projections.
//! Set `RAYON_NUM_THREADS=1` for the single-thread serving figure. Under `cargo test --all-targets` (no
//! `--bench` argument, an unoptimised build) it only smoke-tests a two-layer model for a few steps.
//!
//! First it times one weight's products at decode (1 row) and prefill (64 rows) sizes for each type with an
//! int8 kernel (`q8::kquant`): that kernel, candle's path (its quantized matmul for one row; for many rows
//! the weight dequantized and multiplied in f32, what hearth did before), and the weight requantized to
//! Q8_0 through hearth's Q8_0 kernel. `HEARTH_BENCH_DTYPE=Q4K` (any `GgmlDType` name) stores the synthetic
//! model's matrices in that type (`Q4_K_M`: Q4_K and Q6_K, as llama.cpp's mix); `HEARTH_REQUANT_Q8=1` requantizes the model to Q8_0 at load.

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use hearth::model::q8::{self, PanelWeights, QuantizedRows, kquant, q8k};
use hearth::model::{Arch, LoraConfig, LoraPair, LoraSet, LoraTarget, TinySpec, write_tiny_model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Inside a pool, as the serve engine runs generation: candle's rayon ops then run inline instead of being
    // handed to a pool thread per op.
    let pool = rayon::ThreadPoolBuilder::new().build()?;
    pool.install(run).map_err(|e| e.to_string().into())
}

fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let smoke = !std::env::args().any(|a| a == "--bench");
    kernels(smoke)?;
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
            let name = std::env::var("HEARTH_BENCH_DTYPE").unwrap_or_else(|_| "Q8_0".into());
            if name == "Q4_K_M" {
                spec.dtype = GgmlDType::F32;
                let f32_path = dir.join("bench-f32.gguf");
                write_tiny_model(&f32_path, &spec)?;
                write_q4_k_m(&f32_path, &p)?;
            } else {
                spec.dtype = dtype_named(&name)?;
                write_tiny_model(&p, &spec)?;
            }
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
    println!("int8 kernels: {}", hearth::model::q8::int8_kernel());
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

fn dtype_named(name: &str) -> Result<GgmlDType, Box<dyn std::error::Error + Send + Sync>> {
    Ok(match name {
        "Q8_0" => GgmlDType::Q8_0,
        "Q4_0" => GgmlDType::Q4_0,
        "Q4K" => GgmlDType::Q4K,
        "Q5K" => GgmlDType::Q5K,
        "Q6K" => GgmlDType::Q6K,
        "F32" => GgmlDType::F32,
        other => {
            return Err(format!("HEARTH_BENCH_DTYPE={other}: not a type this bench writes").into());
        }
    })
}

/// `src` (an F32 model) re-encoded at `dst` as llama.cpp's Q4_K_M mixes types, simplified: Q6_K for the
/// embeddings, the output, `attn_v` and `ffn_down` (llama.cpp gives Q6_K to some of those layers), Q4_K for
/// the other matrices, norms kept F32.
fn write_q4_k_m(
    src: &std::path::Path,
    dst: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use candle_core::quantized::gguf_file;
    let mut f = std::fs::File::open(src)?;
    let content = gguf_file::Content::read(&mut f)?;
    let mut tensors = Vec::new();
    for name in content.tensor_infos.keys() {
        let t = content.tensor(&mut f, name, &Device::Cpu)?;
        let dtype = if t.shape().rank() != 2 {
            GgmlDType::F32
        } else if ["token_embd", "output.", "attn_v", "ffn_down"]
            .iter()
            .any(|p| name.contains(p))
        {
            GgmlDType::Q6K
        } else {
            GgmlDType::Q4K
        };
        let t = QTensor::quantize(&t.dequantize(&Device::Cpu)?, dtype)?;
        tensors.push((name.clone(), t));
    }
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut std::fs::File::create(dst)?, &metadata, &tensors)?;
    Ok(())
}

/// Best of `rounds` runs of `f`, in microseconds.
fn best_us(rounds: usize, mut f: impl FnMut()) -> f64 {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .fold(f64::INFINITY, f64::min)
}

/// One weight's products per type: hearth's int8 kernel, candle's path, and the weight requantized to Q8_0.
fn kernels(smoke: bool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (n_out, k, rounds) = if smoke {
        (64, 256, 1)
    } else {
        (2048, 2048, 20)
    };
    let w: Vec<f32> = (0..n_out * k)
        .map(|i| ((i * 7919 % 509) as f32 - 254.0) / 2000.0)
        .collect();
    let dense = Tensor::from_vec(w, (n_out, k), &Device::Cpu)?;
    println!("one {n_out}x{k} weight, µs per product (best of {rounds}):");
    for dtype in [
        GgmlDType::Q4_0,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ] {
        let q = QTensor::quantize(&dense, dtype)?;
        let kind = kquant::KQuant::of(dtype).ok_or("no kernel")?;
        let bytes = q.data()?.into_owned();
        let q8 = QTensor::quantize(&q.dequantize(&Device::Cpu)?, GgmlDType::Q8_0)?;
        let q8_bytes = q8.data()?.into_owned();
        let panels = q8::panels_usable()
            .then(|| PanelWeights::from_q8_0(&q8_bytes, n_out, k))
            .transpose()?;
        let qmm = QMatMul::from_qtensor(QTensor::quantize(&dense, dtype)?)?;
        for m in [1usize, 64] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
            let xv: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let mut y = vec![0f32; m * n_out];
            let native = best_us(rounds, || {
                if q8k::supports(kind) {
                    let xq = q8k::KRows::new(&xv, k).expect("quantize");
                    q8k::matmul(kind, &bytes, n_out, &xq, &mut y).expect("q8k");
                } else {
                    let xq = QuantizedRows::new(&xv, k).expect("quantize");
                    kquant::matmul(kind, &bytes, n_out, &xq, &mut y).expect("kquant");
                }
            });
            let candle = if m == 1 {
                best_us(rounds, || {
                    qmm.forward(&x).expect("candle");
                })
            } else {
                best_us(rounds, || {
                    let d = q.dequantize(&Device::Cpu).expect("dequantize");
                    x.matmul(&d.t().expect("t")).expect("matmul");
                })
            };
            let requant = best_us(rounds, || {
                let xq = QuantizedRows::new(&xv, k).expect("quantize");
                match &panels {
                    Some(p) => q8::matmul_panels(p, &xq, &mut y).expect("panels"),
                    None => q8::matmul_quantized(&q8_bytes, n_out, &xq, &mut y).expect("q8_0"),
                }
            });
            println!(
                "{:>6} m={m:>2}: int8 kernel {native:>9.1}  candle {candle:>9.1}  requantized Q8_0 {requant:>9.1}",
                format!("{dtype:?}")
            );
        }
    }
    Ok(())
}
