//! Aggregation throughput: 8 workers × 10M bf16 parameters in gym blobs (the shape of the spec's 5.68 s figure).
//! Prints wall time (best and median of several runs) and effective bandwidth (bytes read + written per second).
//! `cargo bench --bench federate_aggregate [-- --params N --workers K --threads T --reps R]`

use std::time::Instant;

use hearth::federate::aggregate::{Method, aggregate_gym_blobs};
use hearth::federate::wire::{Rounding, Tensor, encode_gym};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Cheap deterministic pseudo-random values (xorshift) so setup does not dominate.
fn make_blob(seed: u64, params: usize, tensors: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let per = params / tensors;
    let ts: Vec<Tensor> = (0..tensors)
        .map(|t| {
            let n = if t + 1 == tensors {
                params - per * (tensors - 1)
            } else {
                per
            };
            let data = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
                })
                .collect();
            Tensor::new(
                format!("base_model.model.model.layers.{t}.mlp.down_proj.lora_A.weight"),
                vec![n],
                data,
            )
        })
        .collect();
    encode_gym(&ts, Rounding::Truncate).expect("encode")
}

fn main() {
    // `cargo bench` passes `--bench`; under `cargo test --all-targets` (an unoptimised build) this is a smoke run.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let params = arg("--params", if smoke { 100_000 } else { 10_000_000 });
    let workers = arg("--workers", 8);
    let threads = arg("--threads", 2);
    let reps = arg("--reps", if smoke { 1 } else { 9 });
    let blobs: Vec<Vec<u8>> = (0..workers)
        .map(|w| make_blob(w as u64 + 1, params, 10))
        .collect();
    let refs: Vec<&[u8]> = blobs.iter().map(|b| b.as_slice()).collect();
    let bytes = (workers + 1) * params * 2;
    println!(
        "federate_aggregate: {workers} workers x {params} params (bf16 gym blobs), threads={threads}"
    );
    let mut headline = 0.0;
    for (name, m) in [
        ("byzantine_robust", Method::GymRobust),
        ("median", Method::Median),
        ("trimmed_0.25", Method::Trimmed { beta: 0.25 }),
        ("mean", Method::Mean),
    ] {
        for th in [1, threads] {
            // Warm-up: first touch of the inputs and of the allocator's pages is not the kernel's cost.
            std::hint::black_box(
                aggregate_gym_blobs(&refs, None, m, Rounding::Truncate, th).expect("aggregate"),
            );
            let mut times = Vec::with_capacity(reps);
            for _ in 0..reps {
                let t0 = Instant::now();
                let out =
                    aggregate_gym_blobs(&refs, None, m, Rounding::Truncate, th).expect("aggregate");
                times.push(t0.elapsed().as_secs_f64());
                std::hint::black_box(out);
            }
            times.sort_by(f64::total_cmp);
            let (best, med) = (times[0], times[reps / 2]);
            println!(
                "  {name:<17} threads={th}: best {:.4} s, median {:.4} s, {:.2} GB/s (read+write)",
                best,
                med,
                bytes as f64 / med / 1e9
            );
            if name == "byzantine_robust" && th == threads {
                headline = med;
            }
        }
    }
    // One machine-readable line for scripts/bench_federate.sh.
    println!("RUST_SECONDS={headline:.6}");
}
