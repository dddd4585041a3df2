//! Aggregation rules against a straightforward f64 reference, Byzantine bounds, and exact LoRA aggregation.

use hearth::federate::aggregate::{self, Bf16Bytes, Method, Out};
use hearth::federate::linalg::{Mat, jacobi_svd, randomized_svd};
use hearth::federate::lora::{self, ExactOptions};
use hearth::federate::wire::{self, Rounding, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// Per-coordinate reference in f64: sort, drop k each end, average (weighted if asked).
fn reference(
    inputs: &[Vec<f32>],
    weights: Option<&[f64]>,
    k: usize,
    median_weighted: bool,
) -> Vec<f64> {
    let n = inputs.len();
    (0..inputs[0].len())
        .map(|i| {
            let mut col: Vec<(f64, f64)> = (0..n)
                .map(|w| (inputs[w][i] as f64, weights.map_or(1.0, |ws| ws[w])))
                .collect();
            col.sort_by(|a, b| a.0.total_cmp(&b.0));
            if median_weighted {
                let tot: f64 = col.iter().map(|c| c.1).sum();
                let mut c = 0.0;
                for p in &col {
                    c += p.1;
                    if c >= 0.5 * tot - 1e-9 {
                        return p.0;
                    }
                }
                return col[n - 1].0;
            }
            let kept = &col[k..n - k];
            let ws: f64 = kept.iter().map(|c| c.1).sum();
            kept.iter().map(|c| c.0 * c.1).sum::<f64>() / ws
        })
        .collect()
}

fn random_inputs(n: usize, len: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect()
}

fn run(inputs: &[Vec<f32>], weights: Option<&[f32]>, m: Method, threads: usize) -> Vec<f32> {
    let srcs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![0f32; inputs[0].len()];
    aggregate::aggregate_flat(&srcs, weights, m, Out::F32(&mut out), threads).unwrap();
    out
}

fn assert_close(got: &[f32], want: &[f64], tol: f64) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "coord {i}: {g} vs {w}"
        );
    }
}

#[test]
fn honest_aggregate_equals_f64_reference_all_rules_and_sizes() {
    for n in [1usize, 2, 3, 4, 5, 7, 8, 9] {
        let inputs = random_inputs(n, 10_007, n as u64);
        for m in [
            Method::Mean,
            Method::Median,
            Method::Trimmed { beta: 0.25 },
            Method::GymRobust,
        ] {
            let want = reference(&inputs, None, m.trim(n), false);
            assert_close(&run(&inputs, None, m, 1), &want, 1e-6);
            // Threads split the range without changing a single bit.
            assert_eq!(
                run(&inputs, None, m, 2),
                run(&inputs, None, m, 1),
                "n={n} {m:?}"
            );
        }
    }
}

#[test]
fn weighted_rules_equal_reference() {
    let inputs = random_inputs(6, 3001, 42);
    let w = [1.0f32, 2.0, 3.0, 0.5, 0.5, 1.0];
    let wn: Vec<f64> = w.iter().map(|&x| x as f64).collect();
    assert_close(
        &run(&inputs, Some(&w), Method::Mean, 2),
        &reference(&inputs, Some(&wn), 0, false),
        1e-6,
    );
    let t = Method::Trimmed { beta: 0.2 };
    assert_close(
        &run(&inputs, Some(&w), t, 2),
        &reference(&inputs, Some(&wn), t.trim(6), false),
        1e-6,
    );
    assert_close(
        &run(&inputs, Some(&w), Method::Median, 1),
        &reference(&inputs, Some(&wn), 0, true),
        1e-6,
    );
    // Capacity score as in the spec.
    assert!((aggregate::capacity_score(16.0, 4.0) - 8.0).abs() < 1e-12);
    let srcs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![0f32; 3001];
    assert!(
        aggregate::aggregate_flat(&srcs, Some(&[-1.0; 6]), Method::Mean, Out::F32(&mut out), 1)
            .is_err()
    );
}

#[test]
fn byzantine_worker_bounded_by_trimmed_mean() {
    let mut inputs = random_inputs(8, 50_000, 7);
    inputs[3].iter_mut().for_each(|x| *x = 1e30);
    for m in [
        Method::GymRobust,
        Method::Trimmed { beta: 0.125 },
        Method::Median,
    ] {
        let out = run(&inputs, None, m, 2);
        assert!(
            out.iter().all(|x| x.abs() <= 1.0),
            "{m:?} let the Byzantine value through"
        );
        assert_close(&out, &reference(&inputs, None, m.trim(8), false), 1e-6);
    }
    let mean = run(&inputs, None, Method::Mean, 2);
    assert!(
        mean.iter().all(|x| *x > 1e28),
        "the plain mean is not robust (sanity)"
    );
}

#[test]
fn byzantine_gym_blob_path_matches_reference_in_bf16() {
    let mut inputs = random_inputs(8, 20_000, 9);
    inputs[0].iter_mut().for_each(|x| *x = -3e38);
    let blobs: Vec<Vec<u8>> = inputs
        .iter()
        .map(|v| {
            wire::encode_gym(
                &[Tensor::new("w", vec![100, 200], v.clone())],
                Rounding::Truncate,
            )
            .unwrap()
        })
        .collect();
    let refs: Vec<&[u8]> = blobs.iter().map(|b| b.as_slice()).collect();
    let out = aggregate::aggregate_gym_blobs(&refs, None, Method::GymRobust, Rounding::Truncate, 2)
        .unwrap();
    let got = &wire::decode_gym(&out).unwrap()[0];
    assert_eq!(got.shape, vec![100, 200]);
    let decoded: Vec<Vec<f32>> = blobs
        .iter()
        .map(|b| wire::decode_gym(b).unwrap()[0].data.clone())
        .collect();
    let want = reference(&decoded, None, 1, false);
    for (g, w) in got.data.iter().zip(&want) {
        // Truncation to bf16 loses at most one bf16 ulp (2^-8 relative).
        assert!(
            (*g as f64 - w).abs() <= w.abs() / 128.0 + 1e-30,
            "{g} vs {w}"
        );
        assert!(g.abs() <= 1.0);
    }
}

#[test]
fn bf16_source_reads_unaligned_bytes() {
    let mut bytes = vec![0u8];
    for x in [1.0f32, -2.5, 3.0] {
        bytes.extend_from_slice(&wire::f32_to_bf16_trunc(x).to_le_bytes());
    }
    let s = [Bf16Bytes(&bytes[1..])];
    let mut out = vec![0f32; 3];
    aggregate::aggregate_flat(&s, None, Method::Mean, Out::F32(&mut out), 1).unwrap();
    assert_eq!(out, vec![1.0, -2.5, 3.0]);
}

#[test]
fn jacobi_svd_reconstructs() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut a = Mat::zeros(9, 5);
    a.data
        .iter_mut()
        .for_each(|x| *x = rng.random_range(-1.0..1.0));
    let (u, s, v) = jacobi_svd(&a);
    for w in s.windows(2) {
        assert!(w[0] >= w[1]);
    }
    let mut us = u.clone();
    for r in 0..9 {
        for (c, &sc) in s.iter().enumerate() {
            us.set(r, c, u.at(r, c) * sc);
        }
    }
    let back = us.matmul(&v.transpose());
    for (x, y) in back.data.iter().zip(&a.data) {
        assert!((x - y).abs() < 1e-10);
    }
}

fn lora_state(
    rng: &mut StdRng,
    r: usize,
    n_in: usize,
    n_out: usize,
    shared_a: Option<&[f32]>,
) -> Vec<Tensor> {
    let a: Vec<f32> = match shared_a {
        Some(a) => a.to_vec(),
        None => (0..r * n_in)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect(),
    };
    let b: Vec<f32> = (0..n_out * r)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    vec![
        Tensor::new(
            wire::peft_lora_key(0, "self_attn.q_proj", 'A'),
            vec![r, n_in],
            a,
        ),
        Tensor::new(
            wire::peft_lora_key(0, "self_attn.q_proj", 'B'),
            vec![n_out, r],
            b,
        ),
        Tensor::new(
            "base_model.model.lm_head.bias",
            vec![3],
            vec![1.0, 2.0, 3.0],
        ),
    ]
}

/// Mean of ΔW_k in f64, straight from the definition.
fn mean_dw(states: &[Vec<Tensor>], w: &[f64], scale: f64) -> Mat {
    let pair = &lora::find_lora_pairs(&states[0])[0];
    let mut acc: Option<Mat> = None;
    for (s, &wk) in states.iter().zip(w) {
        let mut d = lora::delta_w(s, pair, scale);
        d.data.iter_mut().for_each(|x| *x *= wk);
        acc = Some(match acc {
            None => d,
            Some(mut a) => {
                a.data.iter_mut().zip(&d.data).for_each(|(x, y)| *x += y);
                a
            }
        });
    }
    acc.unwrap()
}

fn rel_err(a: &Mat, b: &Mat) -> f64 {
    let num: f64 = a
        .data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| (x - y) * (x - y))
        .sum();
    (num / b.frob2()).sqrt()
}

#[test]
fn exact_lora_mean_with_shared_a_is_lossless_and_naive_mean_is_not() {
    // Same A on every worker: mean ΔW has rank ≤ r, so re-factoring is exact.
    let mut rng = StdRng::seed_from_u64(11);
    let a: Vec<f32> = (0..4 * 32)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let states: Vec<Vec<Tensor>> = (0..4)
        .map(|_| lora_state(&mut rng, 4, 32, 24, Some(&a)))
        .collect();
    let scale = 2.0;
    let opts = ExactOptions {
        scale,
        rank: 4,
        method: Method::Mean,
        seed: 1,
        threads: 1,
    };
    let (out, reps) = lora::aggregate_exact(&states, None, opts).unwrap();
    assert!(reps[0].rel_residual < 1e-6, "{:?}", reps);
    let pair = &lora::find_lora_pairs(&out)[0];
    let want = mean_dw(&states, &[0.25; 4], scale);
    assert!(rel_err(&lora::delta_w(&out, pair, scale), &want) < 1e-5);
    assert_eq!(out[2].data, vec![1.0, 2.0, 3.0]);
}

#[test]
fn exact_lora_residual_matches_independent_computation() {
    let mut rng = StdRng::seed_from_u64(12);
    let states: Vec<Vec<Tensor>> = (0..3)
        .map(|_| lora_state(&mut rng, 4, 40, 30, None))
        .collect();
    let scale = 0.5;
    let w = [1.0f32, 2.0, 1.0];
    let opts = ExactOptions {
        scale,
        rank: 4,
        method: Method::Mean,
        seed: 1,
        threads: 1,
    };
    let (out, reps) = lora::aggregate_exact(&states, Some(&w), opts).unwrap();
    assert_eq!(reps[0].rank_before, 12);
    let pair = &lora::find_lora_pairs(&out)[0];
    let want = mean_dw(&states, &[0.25, 0.5, 0.25], scale);
    let got = lora::delta_w(&out, pair, scale);
    let measured = rel_err(&got, &want);
    assert!(
        (measured - reps[0].rel_residual).abs() < 1e-5,
        "{measured} vs {:?}",
        reps[0]
    );
    // Optimality (Eckart–Young): equals the best rank-4 error from an SVD of the dense mean.
    let (_, s, _) = jacobi_svd(&want.transpose());
    let best =
        (s[4..].iter().map(|x| x * x).sum::<f64>() / s.iter().map(|x| x * x).sum::<f64>()).sqrt();
    assert!((best - reps[0].rel_residual).abs() < 1e-6);
    // The naive A/B mean is a worse approximation of the mean update.
    let naive = aggregate::aggregate_deltas(&states, Some(&w), Method::Mean, 1).unwrap();
    assert!(rel_err(&lora::delta_w(&naive, pair, scale), &want) > measured + 0.05);
}

#[test]
fn exact_lora_robust_rule_uses_randomized_svd() {
    let mut rng = StdRng::seed_from_u64(13);
    let mut states: Vec<Vec<Tensor>> = (0..5)
        .map(|_| lora_state(&mut rng, 2, 24, 20, None))
        .collect();
    states[4][1].data.iter_mut().for_each(|x| *x = 1e6); // Byzantine B
    let opts = ExactOptions {
        scale: 1.0,
        rank: 2,
        method: Method::Median,
        seed: 5,
        threads: 1,
    };
    let (out, reps) = lora::aggregate_exact(&states, None, opts).unwrap();
    let pair = &lora::find_lora_pairs(&out)[0];
    let got = lora::delta_w(&out, pair, 1.0);
    assert!(
        got.data.iter().all(|x| x.abs() < 100.0),
        "median bounded the Byzantine worker"
    );
    // Independent: dense per-coordinate median, then its residual vs the re-factored result.
    let dws: Vec<Vec<f32>> = states
        .iter()
        .map(|s| {
            lora::delta_w(s, pair, 1.0)
                .data
                .iter()
                .map(|&x| x as f32)
                .collect()
        })
        .collect();
    let med = reference(&dws, None, 2, false);
    let medm = Mat {
        rows: 20,
        cols: 24,
        data: med,
    };
    assert!(
        (rel_err(&got, &medm) - reps[0].rel_residual).abs() < 1e-4,
        "{:?}",
        reps[0]
    );
    let (_, s, _) = randomized_svd(&medm, 2, 8, 2, 1);
    assert!(s[0] > 0.0);
}
