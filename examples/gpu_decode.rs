//! The GPU decode step beside the CPU's on one GGUF, for `scripts/gpu_device_check.sh` on a lent GPU (build with
//! `--release --features cuda`; without a GPU, `emulated` runs the same path slowly).
//!
//! ```text
//! gpu_decode write OUT.gguf SHAPE
//!     a random-weight Q8_0 model shaped like smollm2-135m or smollm2-1.7b (layers, widths, heads) with the
//!     tests' small byte-level vocabulary, written on the machine that measures it (a real-size file is too
//!     large to carry there); llama.cpp reads the same file for the side-by-side figure.
//! gpu_decode run GGUF DEVICE PREFILL DECODE
//!     PREFILL fixed tokens then DECODE greedy steps on the CPU (threads: RAYON_NUM_THREADS), and the same on
//!     DEVICE fed the CPU's tokens: prefill and decode tokens/s of each, and how the DEVICE's logits agree with
//!     the CPU's at each decode step (top-1, max relative error). One JSON line.
//! ```

use std::error::Error;
use std::path::Path;
use std::time::Instant;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use hearth::gpu::{Device as GpuDevice, Gpu};
use hearth::model::{Arch, GpuDecoder, TinySpec, Transformer, write_tiny_model};

type Res<T> = Result<T, Box<dyn Error>>;

fn usage() -> Res<()> {
    Err("usage: gpu_decode write OUT.gguf smollm2-135m|smollm2-1.7b | run GGUF DEVICE PREFILL DECODE".into())
}

fn num(s: &str) -> Res<usize> {
    s.parse().map_err(|e| format!("{s:?}: {e}").into())
}

fn write(out: &str, shape: &str) -> Res<()> {
    let mut spec = TinySpec::new(Arch::Llama);
    let (hidden, ffn, layers, heads, kv_heads) = match shape {
        "smollm2-135m" => (576, 1536, 30, 9, 3),
        "smollm2-1.7b" => (2048, 8192, 24, 32, 32),
        other => return Err(format!("shape `{other}`: smollm2-135m or smollm2-1.7b").into()),
    };
    spec.hidden_size = hidden;
    spec.intermediate_size = ffn;
    spec.num_layers = layers;
    spec.num_heads = heads;
    spec.num_kv_heads = kv_heads;
    spec.head_dim = 64;
    spec.tied_embeddings = true;
    spec.dtype = GgmlDType::Q8_0;
    spec.context_length = 2048;
    write_tiny_model(Path::new(out), &spec)?;
    Ok(())
}

fn top1(v: &[f32]) -> usize {
    (0..v.len())
        .max_by(|&a, &b| v[a].total_cmp(&v[b]))
        .unwrap_or(0)
}

fn run(path: &str, device: &str, prefill: usize, decode: usize) -> Res<()> {
    let model = Transformer::from_gguf(path)?;
    let vocab = model.config().vocab_size;
    let device: GpuDevice = device.parse()?;
    let gpu = Gpu::open(device)?;
    let prompt: Vec<u32> = (0..prefill)
        .map(|i| (i * 37 % (vocab - 1) + 1) as u32)
        .collect();

    // The CPU: one prefill forward, then greedy steps through the cache.
    let mut cache = model.new_cache();
    let t = Instant::now();
    let input = Tensor::from_vec(prompt.clone(), (1, prefill), &Device::Cpu)?;
    let mut logits: Vec<f32> = model
        .forward_last(&input, Some(&mut cache), None)?
        .squeeze(0)?
        .to_vec1()?;
    let cpu_prefill = t.elapsed().as_secs_f64();
    let mut fed = Vec::with_capacity(decode);
    let mut cpu_logits = Vec::with_capacity(decode);
    let t = Instant::now();
    for _ in 0..decode {
        let next = top1(&logits) as u32;
        fed.push(next);
        let input = Tensor::from_vec(vec![next], (1, 1), &Device::Cpu)?;
        logits = model
            .forward_last(&input, Some(&mut cache), None)?
            .squeeze(0)?
            .to_vec1()?;
        cpu_logits.push(logits.clone());
    }
    let cpu_decode = t.elapsed().as_secs_f64();

    // The device, fed the CPU's tokens so that each step's logits compare; one untimed warm-up sequence
    // compiles the kernels and records the step.
    let mut dec = GpuDecoder::new(&gpu, &model, prefill + decode + 8, None)?;
    dec.prefill(&prompt[..prefill.min(16)])?;
    dec.step(fed[0])?;
    dec.reset()?;
    let t = Instant::now();
    dec.prefill(&prompt)?;
    let gpu_prefill = t.elapsed().as_secs_f64();
    let (mut agree, mut max_rel) = (0usize, 0f32);
    let t = Instant::now();
    let mut gpu_logits = Vec::with_capacity(decode);
    for &tok in &fed {
        gpu_logits.push(dec.step(tok)?);
    }
    let gpu_decode = t.elapsed().as_secs_f64();
    for (g, c) in gpu_logits.iter().zip(&cpu_logits) {
        agree += usize::from(top1(g) == top1(c));
        let scale = c.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
        let err = g.iter().zip(c).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        max_rel = max_rel.max(err / scale);
    }
    println!(
        "{{\"gguf\":{path:?},\"device\":{:?},\"prefill\":{prefill},\"decode\":{decode},\"cpu_threads\":{},\
\"cpu_prefill_tokens_per_s\":{:.1},\"cpu_decode_tokens_per_s\":{:.1},\"gpu_prefill_tokens_per_s\":{:.1},\
\"gpu_decode_tokens_per_s\":{:.1},\"graph\":{},\"top1_agree\":{agree},\"max_rel_err\":{max_rel:.3e}}}",
        gpu.describe(),
        rayon::current_num_threads(),
        prefill as f64 / cpu_prefill,
        decode as f64 / cpu_decode,
        prefill as f64 / gpu_prefill,
        decode as f64 / gpu_decode,
        dec.replays_graph(),
    );
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["write", out, shape] => write(out, shape),
        ["run", path, device, prefill, decode] => {
            let (p, d) = (num(prefill)?, num(decode)?);
            if p == 0 || d == 0 {
                return Err("PREFILL and DECODE must be at least 1".into());
            }
            run(path, device, p, d)
        }
        _ => usage(),
    }
}
