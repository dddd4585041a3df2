//! Differential privacy: clipping, seeded Gaussian noise, RDP accounting and the budget stop.

use hearth::federate::dp::{self, DpConfig, DpEngine, DpError, RdpAccountant};
use hearth::federate::wire::Tensor;

fn update(scale: f32, n: usize) -> Vec<Tensor> {
    vec![
        Tensor::new(
            "a",
            vec![n],
            (0..n).map(|i| scale * ((i % 7) as f32 - 3.0)).collect(),
        ),
        Tensor::new("b", vec![2], vec![scale, -scale]),
    ]
}

fn cfg(z: f64, budget: Option<f64>) -> DpConfig {
    DpConfig {
        clip_norm: 1.0,
        noise_multiplier: z,
        delta: 1e-5,
        epsilon_budget: budget,
        seed: 42,
    }
}

#[test]
fn clip_bounds_the_l2_norm_and_keeps_small_updates() {
    let mut u = update(10.0, 1000);
    let before = dp::clip_l2(&mut u, 1.0);
    assert!(before > 1.0);
    assert!((dp::l2_norm(&u) - 1.0).abs() < 1e-5);
    let mut small = update(1e-4, 10);
    let orig = small.clone();
    dp::clip_l2(&mut small, 1.0);
    assert_eq!(small, orig);
}

#[test]
fn noise_is_seeded_and_has_the_configured_std() {
    let run = || {
        let mut e = DpEngine::new(cfg(0.5, None)).unwrap();
        let mut u = vec![Tensor::new("x", vec![200_000], vec![0.0; 200_000])];
        e.privatize(&mut u).unwrap();
        u
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b, "same seed, same noise");
    let d = &a[0].data;
    let mean = d.iter().map(|&x| x as f64).sum::<f64>() / d.len() as f64;
    let var = d.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / d.len() as f64;
    assert!(mean.abs() < 0.01, "{mean}");
    assert!((var.sqrt() - 0.5).abs() < 0.01, "std {}", var.sqrt());
}

#[test]
fn rdp_accountant_matches_closed_form_optimum() {
    // For T Gaussian releases, ε(α) = αρ + ln(1/δ)/(α−1) with ρ = T/(2z²); the optimum is ρ + 2·sqrt(ρ·ln(1/δ)).
    for (z, t) in [(1.0, 1u64), (1.1, 10), (4.0, 100), (0.8, 3)] {
        let mut acc = RdpAccountant::new();
        for _ in 0..t {
            acc.step(z);
        }
        let (eps, order) = acc.epsilon(1e-5);
        let rho = t as f64 / (2.0 * z * z);
        let l = (1e5f64).ln();
        let exact = rho + 2.0 * (rho * l).sqrt();
        assert!(eps >= exact - 1e-9, "grid can't beat the optimum");
        assert!(eps <= exact * 1.02, "z={z} T={t}: {eps} vs {exact}");
        assert!(order > 1.0);
    }
}

#[test]
fn epsilon_reported_per_round_and_budget_stops_contribution() {
    let mut e = DpEngine::new(cfg(1.0, Some(8.0))).unwrap();
    let mut last = 0.0;
    let mut sent = 0;
    loop {
        let mut u = update(1.0, 100);
        match e.privatize(&mut u) {
            Ok(r) => {
                assert!(r.epsilon > last, "ε grows every round");
                assert!((r.epsilon - last - r.epsilon_round).abs() < 1e-9);
                assert!(r.clipped);
                last = r.epsilon;
                sent += 1;
            }
            Err(DpError::BudgetExhausted { next, budget }) => {
                assert!(next > budget && last <= budget);
                assert_eq!(u, update(1.0, 100), "a refused update is left untouched");
                break;
            }
            Err(other) => panic!("{other}"),
        }
        assert!(sent < 100);
    }
    assert!(sent >= 1);
    assert!(e.epsilon() <= 8.0);
    assert!(DpEngine::new(cfg(0.0, None)).is_err());
}
