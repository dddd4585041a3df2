//! hearth's half of `scripts/bench_real_sizes.sh`: speed, logits and training throughput on one GGUF (random
//! weights shaped like Qwen3-1.7B or Llama-3.2-1B there), each printed as one line the script parses.
//!
//! ```text
//! real_sizes speed GGUF PREFILL DECODE
//!     through the serve engine, as `serve_decode` measures: a greedy request whose prompt is about PREFILL
//!     tokens (the count is printed), DECODE tokens generated; prefill tokens/s from the time to the first
//!     token, decode tokens/s after it. One untimed warm-up request first. Threads: RAYON_NUM_THREADS.
//!     `requantize-q8_0` after DECODE loads the weights as `Serve(requantize: Q8_0)` does.
//! real_sizes prompt-tokens GGUF PREFILL
//!     the token count of the prompt `speed` sends (PREFILL unless the text cannot be cut there), for llama-bench.
//! real_sizes logits GGUF N OUT [TEXT]
//!     N fixed token ids (OUT.tokens.json) through one full-sequence forward; the logits as little-endian f32,
//!     N rows of the vocabulary (OUT.f32); and the same through an f32 reference, every product in f32 over the
//!     file's weights dequantized (OUT.ref.f32). The ids are spread over the vocabulary, or with TEXT (a file)
//!     its first N tokens: a trained model's predictions on text it can read.
//! real_sizes train GGUF STEPS RANK
//!     LoRA SFT steps (forward, backward, AdamW) at sequence 128, batch 4, all seven projections, on the weights
//!     as the file has them (what the main job trains with `requantize: Off`), after one untimed step.
//! ```

#[allow(dead_code)]
#[path = "../benches/bench_util/mod.rs"]
mod bench_util;

use bench_util::{fixed_length_request, lora_cycle, timed, uncached_config};

use std::error::Error;
use std::path::Path;
use std::time::Instant;

use hearth::model::{Base, Requantize, Tokenizer};
use hearth::serve::Server;

type Res<T> = Result<T, Box<dyn Error>>;

const PROSE: &str = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins \
    with a single step, and the river keeps its own counsel as it winds toward the sea. ";

fn usage() -> Res<()> {
    Err(
        "usage: real_sizes speed GGUF PREFILL DECODE [requantize-q8_0] | prompt-tokens GGUF PREFILL | logits GGUF N OUT [TEXT] | train GGUF STEPS RANK"
            .into(),
    )
}

fn num(s: &str) -> Res<usize> {
    s.parse().map_err(|e| format!("{s:?}: {e}").into())
}

/// A prompt of `prefill` tokens: the prose's first tokens as text again, one fewer while the round trip merges
/// a token or two into more or fewer.
fn prompt_text(tok: &Tokenizer, prefill: usize) -> Res<String> {
    let ids = tok.encode(&PROSE.repeat(prefill / 20 + 2), false)?;
    let mut k = prefill.min(ids.len());
    loop {
        let text = tok.decode(&ids[..k], false);
        if tok.encode(&text, false)?.len() == prefill || k == 0 {
            return Ok(text);
        }
        k -= 1;
    }
}

fn speed(path: &Path, prefill: usize, decode: usize, requantize: Requantize) -> Res<()> {
    let config = uncached_config();
    let t0 = Instant::now();
    let server = Server::from_base(&Base::load_with(path, requantize)?, config)?;
    println!(
        "{} loaded in {:.1}s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    let prompt = prompt_text(server.engine().tokenizer(), prefill)?;
    let run = |max_tokens: usize| -> Res<(f64, f64, usize, usize)> {
        let mut req = fixed_length_request(Some("base"), &prompt, max_tokens);
        req.parse_special = false;
        let (p, d, c) = timed(&server, req)?;
        Ok((p, d, c.prompt_tokens, c.completion_tokens))
    };
    run(2)?;
    let (p, d, n, m) = run(decode)?;
    if n != prefill {
        return Err(format!("the prompt took {n} tokens, not {prefill}").into());
    }
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "default".into());
    let form = match requantize {
        Requantize::Off => "",
        Requantize::Q8_0 => " requantize Q8_0",
    };
    println!(
        "hearth{form} threads {threads} | prefill {n} tokens: {p:.2} tok/s | decode {m} tokens: {d:.2} tok/s"
    );
    Ok(())
}

fn logits(path: &Path, n: usize, out: &Path, text: Option<&Path>) -> Res<()> {
    let (model, tok) = hearth::model::load(path)?;
    let ids: Vec<u32> = match text {
        Some(file) => {
            let ids = tok.encode(&std::fs::read_to_string(file)?, false)?;
            if ids.len() < n {
                return Err(
                    format!("{} holds {} tokens, not {n}", file.display(), ids.len()).into(),
                );
            }
            ids[..n].to_vec()
        }
        None => {
            // Fixed ids spread over the source vocabulary's real tokens (the first 49152 of SmolLM2's; the
            // padding after them is never produced by the tokenizer).
            let vocab = model.config().vocab_size.min(49152) as u64;
            let mut x = 0x2545_f491_4f6c_dd1du64;
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % vocab) as u32
                })
                .collect()
        }
    };
    let t0 = Instant::now();
    let logits = model.forward_ids(&ids, None, None)?.to_vec2::<f32>()?;
    println!(
        "hearth forward of {n} tokens in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    write_f32(&out.with_extension("f32"), &logits)?;
    // The reference both sides are held to: every product in f32 over the file's weights dequantized.
    let reference = model
        .merged(None)?
        .forward_ids(&ids, None, None)?
        .to_vec2::<f32>()?;
    write_f32(&out.with_extension("ref.f32"), &reference)?;
    std::fs::write(
        out.with_extension("tokens.json"),
        serde_json::to_string(&ids)?,
    )?;
    Ok(())
}

fn write_f32(path: &Path, rows: &[Vec<f32>]) -> Res<()> {
    let bytes: Vec<u8> = rows
        .iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(path, bytes)?;
    Ok(())
}

fn train(path: &Path, steps: usize, rank: usize) -> Res<()> {
    let (model, tok) = hearth::model::load(path)?;
    let r = lora_cycle(&model, &tok, rank, steps)?;
    let threads = rayon::current_num_threads();
    println!(
        "hearth train threads {threads} | rank {rank}, seq 128, batch 4, all linear: {:.2} tokens/s ({} tokens in {:.1} s, {} steps)",
        r.tokens_per_second, r.tokens, r.seconds, r.steps
    );
    Ok(())
}

fn main() -> Res<()> {
    // The hearth binary's allocator and thread settings, so the figures are the main job's.
    hearth::malloc::tune_for_long_runs();
    hearth::model::configure_candle_threads();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a[..] {
        ["speed", gguf, prefill, decode] => speed(
            Path::new(gguf),
            num(prefill)?,
            num(decode)?,
            Requantize::Off,
        ),
        ["speed", gguf, prefill, decode, "requantize-q8_0"] => speed(
            Path::new(gguf),
            num(prefill)?,
            num(decode)?,
            Requantize::Q8_0,
        ),
        ["logits", gguf, n, out, ref text @ ..] if text.len() <= 1 => {
            let n = num(n)?;
            let text = text.first().map(|t| Path::new(*t));
            let pool = rayon::ThreadPoolBuilder::new().build()?;
            pool.install(|| {
                logits(Path::new(gguf), n, Path::new(out), text).map_err(|e| e.to_string())
            })?;
            Ok(())
        }
        ["prompt-tokens", gguf, prefill] => {
            let g = hearth::model::GgufFile::open(gguf)?;
            let tok = Tokenizer::from_gguf_metadata(g.metadata())?;
            let text = prompt_text(&tok, num(prefill)?)?;
            println!("{}", tok.encode(&text, false)?.len());
            Ok(())
        }
        ["train", gguf, steps, rank] => train(Path::new(gguf), num(steps)?, num(rank)?),
        _ => usage(),
    }
}
