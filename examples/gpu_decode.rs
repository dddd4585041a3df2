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
//! gpu_decode train GGUF DEVICE SEQ BATCH STEPS RANK [CPU_STEPS]
//!     LoRA training's forward and backward on DEVICE as the trainer runs them there (per sequence: the
//!     log-probs, then the forward again and the backward), rank RANK on all seven projections, BATCH random
//!     sequences of SEQ tokens per step, STEPS timed steps after one untimed: tokens/s. With CPU_STEPS > 0, the
//!     CPU's forward and backward of as many batches too, and how far the device's gradients of the first
//!     batch are from the CPU's (relative L2). One JSON line.
//! ```

use std::error::Error;
use std::path::Path;
use std::time::Instant;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use hearth::gpu::{Device as GpuDevice, Gpu};
use hearth::model::{
    Arch, GpuDecoder, GpuModel, GpuTrainer, LoraConfig, LoraPair, LoraSet, LoraTarget, Targets,
    TinySpec, Transformer, write_tiny_model,
};

type Res<T> = Result<T, Box<dyn Error>>;

fn usage() -> Res<()> {
    Err("usage: gpu_decode write OUT.gguf smollm2-135m|smollm2-1.7b | run GGUF DEVICE PREFILL DECODE \
| train GGUF DEVICE SEQ BATCH STEPS RANK [CPU_STEPS]"
        .into())
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

/// A rank-`rank` set on every projection with `B` drawn small and non-zero, so that every `A` has a gradient.
fn adapter(model: &Transformer, rank: usize) -> Res<LoraSet> {
    let cfg = LoraConfig::new(rank, 2.0 * rank as f64, &LoraTarget::ALL);
    let fresh = LoraSet::fresh(model, cfg.clone(), 1)?;
    let mut set = LoraSet::empty(cfg);
    for (&(l, t), p) in fresh.iter() {
        let n = p.b.elem_count();
        let b: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 997) as f32 / 997.0 - 0.5) * 0.02)
            .collect();
        let b = Tensor::from_vec(b, p.b.dims(), &Device::Cpu)?;
        set.insert(l, t, LoraPair::new(p.a.clone(), b, p.scale));
    }
    Ok(set)
}

/// Each position scored against the next token, as SFT on a whole sequence.
fn next_token_targets(ids: &[u32]) -> Targets {
    let mut t = Targets::with_capacity(ids.len());
    for i in 0..ids.len() {
        match ids.get(i + 1) {
            Some(&next) => t.push_token(next),
            None => t.push_none(),
        }
    }
    t
}

fn flat_grads(g: &[hearth::model::PairGradient]) -> Res<Vec<f32>> {
    let mut out = Vec::new();
    for p in g {
        out.extend(p.a.flatten_all()?.to_vec1::<f32>()?);
        out.extend(p.b.flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn train(
    path: &str,
    device: &str,
    (seq, batch, steps): (usize, usize, usize),
    rank: usize,
    cpu_steps: usize,
) -> Res<()> {
    let model = Transformer::from_gguf(path)?;
    let vocab = model.config().vocab_size;
    let gpu = Gpu::open(device.parse::<GpuDevice>()?)?;
    let lora = adapter(&model, rank)?;
    let batches: Vec<Vec<Vec<u32>>> = (0..=steps.max(cpu_steps))
        .map(|s| {
            (0..batch)
                .map(|b| {
                    (0..seq)
                        .map(|i| ((i * 131 + b * 17 + s * 7919) % (vocab - 1) + 1) as u32)
                        .collect()
                })
                .collect()
        })
        .collect();
    let weight = -1.0 / (batch * (seq - 1)) as f32;
    let mut tr = GpuTrainer::new(std::sync::Arc::new(GpuModel::new(&gpu, &model, seq)?))?;
    tr.set_adapter(Some(&lora))?;
    let mut gpu_step = |ids: &[Vec<u32>]| -> Res<Vec<hearth::model::PairGradient>> {
        for s in ids {
            let t = next_token_targets(s);
            tr.target_logps(s, &t)?;
            let mut d = vec![weight; seq];
            d[seq - 1] = 0.0;
            tr.accumulate(s, &t, &d)?;
        }
        Ok(tr.take_gradients()?)
    };
    let first = gpu_step(&batches[0])?;
    let t = Instant::now();
    for ids in &batches[1..=steps] {
        gpu_step(ids)?;
    }
    let gpu_tps = (steps * batch * seq) as f64 / t.elapsed().as_secs_f64();
    let (mut cpu_tps, mut rel_err) = (f64::NAN, f64::NAN);
    if cpu_steps > 0 {
        let (set, _vars) = lora.to_vars()?;
        let cpu_step = |ids: &[Vec<u32>]| -> Res<Vec<hearth::model::PairGradient>> {
            let flat: Vec<u32> = ids.concat();
            let tokens = Tensor::from_vec(flat.clone(), (batch, seq), &Device::Cpu)?;
            let mut targets = Targets::with_capacity(batch * seq);
            for s in ids {
                let t = next_token_targets(s);
                for i in 0..seq {
                    match t.at(i).0.first() {
                        Some(&id) => targets.push_token(id),
                        None => targets.push_none(),
                    }
                }
            }
            let lp = model.target_logps(&tokens, Some(&set), &targets)?;
            let store = (lp.sum_all()? * weight as f64)?.backward()?;
            let mut out = Vec::new();
            for l in 0..model.config().num_layers {
                for t in LoraTarget::ALL {
                    if let Some(p) = set.get(l, t) {
                        out.push(hearth::model::PairGradient {
                            layer: l,
                            target: t,
                            a: store.get(&p.a).ok_or("no gradient")?.clone(),
                            b: store.get(&p.b).ok_or("no gradient")?.clone(),
                        });
                    }
                }
            }
            Ok(out)
        };
        let t = Instant::now();
        let reference = cpu_step(&batches[0])?;
        for ids in &batches[1..cpu_steps] {
            cpu_step(ids)?;
        }
        cpu_tps = (cpu_steps * batch * seq) as f64 / t.elapsed().as_secs_f64();
        let (g, c) = (flat_grads(&first)?, flat_grads(&reference)?);
        let diff: f64 = g
            .iter()
            .zip(&c)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let norm: f64 = c.iter().map(|b| (*b as f64).powi(2)).sum();
        rel_err = (diff / norm.max(1e-30)).sqrt();
    }
    println!(
        "{{\"gguf\":{path:?},\"device\":{:?},\"seq\":{seq},\"batch\":{batch},\"steps\":{steps},\"rank\":{rank},\
\"gpu_train_tokens_per_s\":{gpu_tps:.1},\"cpu_threads\":{},\"cpu_train_tokens_per_s\":{cpu_tps:.1},\
\"grad_rel_err\":{rel_err:.3e}}}",
        gpu.describe(),
        rayon::current_num_threads(),
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
        ["train", path, device, seq, batch, steps, rank, rest @ ..] => {
            let (q, b, s, r) = (num(seq)?, num(batch)?, num(steps)?, num(rank)?);
            let cpu = match rest {
                [] => 0,
                [c] => num(c)?,
                _ => return usage(),
            };
            if q < 2 || b == 0 || s == 0 || r == 0 {
                return Err("SEQ must be at least 2, BATCH, STEPS and RANK at least 1".into());
            }
            train(path, device, (q, b, s), r, cpu)
        }
        _ => usage(),
    }
}
