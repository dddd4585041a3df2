//! The serving cost of per-user deltas: decode tokens/s through the serve engine with 1, 8 and 64 resident
//! per-user adapters (each request routed by its `user` to that user's adapter, the users taken in turn), against
//! the base alone, and the memory each resident adapter takes (its tensors' bytes, and the process's resident
//! set growth while the adapters are installed).
//!
//! `cargo bench --bench serve_adapters`, on the default model (as `serve_decode`: `HEARTH_DATA_DIR`, or
//! `HEARTH_GGUF=path`), one generation thread. `cargo test --benches` runs a tiny smoke version.

mod bench_util;

use bench_util::{bench_model, fixed_length_request, random_adapter, timed};

use std::sync::Arc;

use hearth::model::LoraSet;
use hearth::serve::{ServeConfig, Server};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The bytes an adapter's tensors hold.
fn adapter_bytes(set: &LoraSet) -> usize {
    set.iter()
        .map(|(_, p)| {
            p.a.elem_count() * p.a.dtype().size_in_bytes()
                + p.b.elem_count() * p.b.dtype().size_in_bytes()
        })
        .sum()
}

/// The process's resident set in bytes (Linux; 0 elsewhere).
fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Decode tokens/s of one request from `user` (after its first token).
fn decode(server: &Server, user: &str, prompt: &str, max_tokens: usize) -> Res<f64> {
    let mut req = fixed_length_request(None, prompt, max_tokens);
    req.user = user.to_owned();
    Ok(timed(server, req)?.1)
}

fn main() -> Res<()> {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs a tiny smoke version.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let scratch = tempfile::tempdir()?;
    let path = bench_model(smoke, scratch.path())?;
    let server = Server::load(
        &path,
        ServeConfig {
            model_name: "base".to_owned(),
            threads: 1,
            // Every request pays its own prefill: no adapter's cache helps another's.
            prompt_cache_bytes: 0,
            ..ServeConfig::default()
        },
    )?;
    let model = server.engine().model();
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(2);
    let (max_tokens, requests) = if smoke { (4, 2) } else { (64, 16) };
    println!(
        "model {} | {} generation thread, rayon {} threads | {max_tokens} tokens per request",
        path.display(),
        1,
        rayon::current_num_threads()
    );
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut installed = 0;
    for n in [1usize, 8, 64] {
        let before = rss_bytes();
        let mut bytes = 0;
        for i in installed..n {
            let set = random_adapter(model, i as u64)?;
            bytes += adapter_bytes(&set);
            let id = format!("user{i}-delta");
            server.engine().insert_adapter(&id, Arc::new(set))?;
            server
                .engine()
                .set_user_adapter(&format!("user{i}"), Some(&id))?;
        }
        let added = n - installed;
        let grown = rss_bytes().saturating_sub(before);
        installed = n;
        assert_eq!(server.engine().adapters().len(), n);
        // Users in turn, so with many adapters each request reads another adapter's weights; each routed
        // request follows one from a user without an adapter (the base alone), so that load from elsewhere on
        // the machine weighs on both alike.
        let (mut rates, mut base) = (Vec::new(), Vec::new());
        for i in 0..requests {
            base.push(decode(&server, "nobody", &prompt, max_tokens)?);
            rates.push(decode(
                &server,
                &format!("user{}", i % n),
                &prompt,
                max_tokens,
            )?);
        }
        let (rate, base) = (median(rates), median(base));
        println!(
            "resident adapters {n:>3} | decode {rate:7.1} tokens/s routed, {base:7.1} the base alone ({:+.1}%) | per adapter: {:.2} MiB of tensors, {:.2} MiB resident set growth",
            (rate / base - 1.0) * 100.0,
            bytes as f64 / added as f64 / (1 << 20) as f64,
            grown as f64 / added as f64 / (1 << 20) as f64,
        );
    }
    server.shutdown();
    Ok(())
}
