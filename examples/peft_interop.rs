//! hearth's half of the PEFT interop check run by `scripts/peft_interop.sh` (outside CI: it needs
//! torch, transformers and peft from PyPI).
//!
//! ```text
//! peft_interop write DIR [llama|qwen3]
//!     DIR/base.gguf               tiny base, F32 matrices (TinySpec, seed 7; Qwen3 gets head_dim
//!                                 128, as transformers' GGUF loader ignores key_length)
//!     DIR/hearth_adapter/         rank-4 LoRA on all seven projections, random non-zero A and B,
//!                                 saved with LoraSet::save_peft
//!     DIR/hearth_dora_adapter/    the same A and B as DoRA (use_dora true), each magnitude the row
//!                                 norms of W + scale·B·A times a random jitter 1 + 0.1·N(0, 1)
//!     DIR/hearth_logits.json      {"arch", "tokens", "base", "adapted", "adapted_dora"}: hearth's
//!                                 logits for TOKENS (base alone, + adapter, + DoRA adapter)
//! peft_interop logits DIR ADAPTER_DIR OUT.json
//!     loads DIR/base.gguf and a PEFT adapter directory with LoraSet::load_peft and writes
//!     {"tokens", "base", "adapted", "adapter": {r, lora_alpha, use_rslora, use_dora, pairs,
//!     modules}} to OUT.json, `modules` holding each module's rank, scale and whether it has a DoRA
//!     magnitude, as hearth derived them
//! ```
//!
//! The adapters' A, B and magnitudes are rounded to bf16 before anything else, so the in-memory sets
//! whose logits are written are exactly the ones `save_peft` puts on disk (PEFT files are bf16).

use std::error::Error;
use std::path::Path;
use std::process::ExitCode;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use hearth::model::lora::row_norms;
use hearth::model::{
    Arch, LoraConfig, LoraPair, LoraSet, LoraTarget, TinySpec, Transformer, write_tiny_model,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use serde_json::{Value, json};

type Res<T> = Result<T, Box<dyn Error>>;

/// A fixed token sequence (ids below the tiny vocabulary's 307), shared with the Python side
/// through the JSON files.
const TOKENS: [u32; 12] = [1, 50, 72, 300, 101, 7, 256, 33, 199, 5, 280, 64];
const RANK: usize = 4;
const ALPHA: f64 = 8.0;

fn usage() -> Res<()> {
    Err("usage: peft_interop write DIR [llama|qwen3] | peft_interop logits DIR ADAPTER_DIR OUT.json".into())
}

fn bf16(t: &Tensor) -> Res<Tensor> {
    Ok(t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?)
}

fn logits(m: &Transformer, lora: Option<&LoraSet>) -> Res<Vec<Vec<f32>>> {
    Ok(m.forward_ids(&TOKENS, None, lora)?.to_vec2::<f32>()?)
}

fn write_json(path: &Path, v: &Value) -> Res<()> {
    std::fs::write(path, serde_json::to_string(v)?)
        .map_err(|e| format!("{}: {e}", path.display()).into())
}

fn write(dir: &Path, arch: Arch) -> Res<()> {
    std::fs::create_dir_all(dir)?;
    let mut spec = TinySpec::new(arch);
    spec.dtype = GgmlDType::F32;
    if arch == Arch::Qwen3 {
        // transformers' GGUF loader does not read `qwen3.attention.key_length`: it takes
        // Qwen3Config's default head_dim, 128, so the tiny Qwen3 uses that (4 x 128 = 512 > 64,
        // q/k width differing from hidden as in real Qwen3 models).
        spec.head_dim = 128;
    }
    let base = dir.join("base.gguf");
    write_tiny_model(&base, &spec)?;
    let m = Transformer::from_gguf(&base)?;

    // A as PEFT initialises it (kaiming-uniform), B random too, so every projection's delta is
    // non-zero; both rounded to bf16, the precision save_peft writes.
    let fresh = LoraSet::fresh(&m, LoraConfig::new(RANK, ALPHA, &LoraTarget::ALL), 11)?;
    let mut rng = StdRng::seed_from_u64(12);
    let mut set = LoraSet::empty(fresh.config.clone());
    for (&(l, t), p) in fresh.iter() {
        let (out, r) = p.b.dims2()?;
        let b: Vec<f32> = (0..out * r)
            .map(|_| rng.random_range(-0.1f32..0.1))
            .collect();
        let b = Tensor::from_vec(b, (out, r), &Device::Cpu)?;
        set.insert(l, t, LoraPair::new(bf16(&p.a)?, bf16(&b)?, p.scale));
    }
    set.save_peft(dir.join("hearth_adapter"), m.config())?;

    // DoRA: the same A and B, and a magnitude away from ‖W + scale·B·A‖_row (where DoRA would equal
    // the plain LoRA above), so that the magnitude and its row order matter.
    let mut dora_config = set.config.clone();
    dora_config.use_dora = true;
    let mut dora = LoraSet::empty(dora_config);
    for (&(l, t), p) in set.iter() {
        let w = m.blocks()[l].linear(t).dequantize()?;
        let norms = row_norms(&(w + p.delta()?)?)?;
        let jitter: Vec<f32> = (0..norms.dim(0)?)
            .map(|_| 1.0 + 0.1 * rng.sample::<f32, _>(StandardNormal))
            .collect();
        let jitter = Tensor::from_vec(jitter, norms.dims(), &Device::Cpu)?;
        let magnitude = bf16(&(norms * jitter)?)?;
        dora.insert(
            l,
            t,
            LoraPair::with_magnitude(p.a.clone(), p.b.clone(), p.scale, Some(magnitude)),
        );
    }
    dora.save_peft(dir.join("hearth_dora_adapter"), m.config())?;

    write_json(
        &dir.join("hearth_logits.json"),
        &json!({
            "arch": arch.as_str(),
            "tokens": TOKENS,
            "base": logits(&m, None)?,
            "adapted": logits(&m, Some(&set))?,
            "adapted_dora": logits(&m, Some(&dora))?,
        }),
    )?;
    println!(
        "hearth: wrote {} ({:?}, {} layers, vocab {}), {} adapter pairs (r {RANK}, alpha {ALPHA}) as LoRA and as DoRA, logits for {} tokens",
        base.display(),
        arch,
        m.config().num_layers,
        m.config().vocab_size,
        set.len(),
        TOKENS.len()
    );
    Ok(())
}

fn logits_cmd(dir: &Path, adapter: &Path, out: &Path) -> Res<()> {
    let m = Transformer::from_gguf(dir.join("base.gguf"))?;
    let set = LoraSet::load_peft(adapter, m.config())?;
    let scales: serde_json::Map<String, Value> = set
        .iter()
        .map(|(&(l, t), p)| {
            (
                t.module_path(l),
                json!({"rank": p.rank(), "scale": p.scale, "dora": p.magnitude.is_some()}),
            )
        })
        .collect();
    write_json(
        out,
        &json!({
            "tokens": TOKENS,
            "base": logits(&m, None)?,
            "adapted": logits(&m, Some(&set))?,
            "adapter": {
                "r": set.config.r,
                "lora_alpha": set.config.lora_alpha,
                "use_rslora": set.config.use_rslora,
                "use_dora": set.config.use_dora,
                "pairs": set.len(),
                "modules": scales,
            },
        }),
    )?;
    println!(
        "hearth: loaded {} ({} pairs) with load_peft, wrote {}",
        adapter.display(),
        set.len(),
        out.display()
    );
    Ok(())
}

fn run(args: &[&str]) -> Res<()> {
    match args {
        ["write", dir] | ["write", dir, "llama"] => write(Path::new(dir), Arch::Llama),
        ["write", dir, "qwen3"] => write(Path::new(dir), Arch::Qwen3),
        ["logits", dir, adapter, out] => {
            logits_cmd(Path::new(dir), Path::new(adapter), Path::new(out))
        }
        _ => usage(),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peft_interop: {e}");
            ExitCode::FAILURE
        }
    }
}
