//! Serving latency while a training cycle runs, against the same requests on an idle machine: the goal is a
//! p99 ratio of at most 1.5 (training must never starve serving).
//!
//! One process holds the serve engine (1 generation thread, as `graphs/default.ron`) and, in the second
//! phase, a trainer thread running cycles with the main job's recipe (`step_sleep_ms` included) over the
//! same base. Each phase sends the same sequence of chat requests one after another and records end-to-end
//! latency. `cargo bench --bench serve_under_training` measures the default model (prepared in
//! `HEARTH_DATA_DIR`, default `target/hearth-bench-data`; `HEARTH_GGUF=path` for another);
//! `cargo test --benches` runs a tiny smoke version.

mod bench_util;

use bench_util::{bench_model, fixed_length_request};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use hearth::message::{ChatMessage, Origin, Provenance, Sample, SampleContent};
use hearth::serve::{ServeConfig, Server, StreamEvent};
use hearth::train::{LoraTrainer, TrainConfig};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn request(server: &Server, prompt: &str, max_tokens: usize) -> Res<f64> {
    let req = fixed_length_request(None, prompt, max_tokens);
    let t0 = Instant::now();
    let admitted = server.engine().submit(req, "bench")?;
    loop {
        match admitted.pipe.next_event() {
            StreamEvent::Text(_) => {}
            StreamEvent::Done(_) => return Ok(t0.elapsed().as_secs_f64()),
            StreamEvent::Failed(m) => return Err(m.into()),
            StreamEvent::Uncommitted(e) => return Err(e.into()),
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn phase(server: &Server, prompts: &[String], max_tokens: usize) -> Res<Vec<f64>> {
    let mut lat = prompts
        .iter()
        .map(|p| request(server, p, max_tokens))
        .collect::<Res<Vec<f64>>>()?;
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

fn sample(i: usize) -> Sample {
    Sample {
        id: format!("s{i}"),
        user: "bench".into(),
        origin: Origin::Grounded,
        content: SampleContent::Sft {
            prompt: vec![ChatMessage {
                role: hearth::message::Role::User,
                content: format!("Tell me fact number {i} about the garden."),
            }],
            response: format!(
                "Fact {i}: the garden has tomatoes, beans and a small pond with fish."
            ),
        },
        provenance: Provenance::default(),
        created_at_unix_ms: 0,
    }
}

fn run(smoke: bool) -> Res<()> {
    let scratch =
        std::env::temp_dir().join(format!("hearth-serve-train-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let path = bench_model(smoke, &scratch)?;
    // Every request prefills its whole prompt, as before the prompt cache, so the figures stay comparable with
    // earlier runs (the prompts share their opening, which the cache would serve).
    let config = ServeConfig {
        model_name: "base".to_owned(),
        threads: 1,
        prompt_cache_bytes: 0,
        ..ServeConfig::default()
    };
    let server = Server::load(&path, config)?;
    let (n, max_tokens) = if smoke { (4, 4) } else { (60, 16) };
    let prompts: Vec<String> = (0..n)
        .map(|i| format!("Question {i}: what is a good way to spend a rainy afternoon?"))
        .collect();
    // Warm-up, then idle.
    phase(&server, &prompts[..2.min(n)], max_tokens)?;
    let idle = phase(&server, &prompts, max_tokens)?;

    // The main job's recipe, on its own thread over a second copy of the base (as the trainer actor loads it).
    let stop = Arc::new(AtomicBool::new(false));
    let steps = Arc::new(AtomicUsize::new(0));
    let trainer = {
        let (stop, steps, path) = (stop.clone(), steps.clone(), path.clone());
        // As the trainer actor runs a cycle: in its own one-thread pool at a lower priority.
        let pool = hearth::train::background_pool(1)?;
        std::thread::spawn(move || -> Result<(), String> {
            let (model, tok) = hearth::model::load(&path).map_err(|e| e.to_string())?;
            let cfg = TrainConfig {
                seed: 1,
                rank: 8,
                alpha: 16.0,
                learning_rate: 1e-3,
                warmup_steps: 4,
                steps: if smoke { 2 } else { 24 },
                batch_size: 4,
                max_seq_len: 96,
                step_sleep_ms: 20,
                holdout_fraction: 0.0,
                ..TrainConfig::default()
            };
            let data: Vec<Sample> = (0..32).map(sample).collect();
            let mut tr = LoraTrainer::new(&model, &tok, cfg, None).map_err(|e| e.to_string())?;
            pool.install(|| {
                while !stop.load(Ordering::Acquire) {
                    tr.train_cycle(&data, |_| {
                        steps.fetch_add(1, Ordering::Relaxed);
                    })
                    .map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
    };
    // Measure once training is under way.
    while steps.load(Ordering::Relaxed) == 0 && !trainer.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let busy = phase(&server, &prompts, max_tokens)?;
    stop.store(true, Ordering::Release);
    trainer.join().map_err(|_| "trainer panicked")??;
    let trained = steps.load(Ordering::Relaxed);
    server.shutdown();

    let (p50_i, p99_i) = (percentile(&idle, 0.5), percentile(&idle, 0.99));
    let (p50_b, p99_b) = (percentile(&busy, 0.5), percentile(&busy, 0.99));
    println!(
        "{} requests of {max_tokens} tokens on {}",
        n,
        path.display()
    );
    println!(
        "idle:            p50 {:.1} ms  p99 {:.1} ms",
        p50_i * 1e3,
        p99_i * 1e3
    );
    println!(
        "while training:  p50 {:.1} ms  p99 {:.1} ms  ({trained} optimizer steps meanwhile)",
        p50_b * 1e3,
        p99_b * 1e3
    );
    println!(
        "p99 ratio training/idle: {:.2} (goal <= 1.5); p50 ratio {:.2}",
        p99_b / p99_i,
        p50_b / p50_i
    );
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

fn main() -> Res<()> {
    // The allocator and candle settings of the hearth binary, so the figures are the main job's.
    hearth::malloc::tune_for_long_runs();
    hearth::model::configure_candle_threads();
    // `cargo bench` passes `--bench`; `cargo test --benches` runs a tiny smoke version.
    let smoke = !std::env::args().any(|a| a == "--bench");
    run(smoke)
}
