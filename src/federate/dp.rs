//! Differential privacy before egress: clip the whole update's L2 norm to C, add N(0, (z·C)²) noise per coordinate
//! from a seeded RNG, and account the privacy loss across rounds with Rényi DP.
//!
//! Accounting: one release of the Gaussian mechanism with sensitivity C and noise multiplier z is (α, α/(2z²))-RDP
//! for every order α > 1; RDP composes by addition. (ε, δ) follows from the standard conversion
//! ε = min_α [ RDP(α) + ln(1/δ)/(α−1) ] (Mironov 2017, Prop. 3), minimised over a grid of orders. Each round is a full
//! (not subsampled) release of this worker's data, so no amplification is claimed.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};

use super::wire::Tensor;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DpConfig {
    /// L2 clip norm C over the whole update.
    pub clip_norm: f64,
    /// z: noise std is z·C.
    pub noise_multiplier: f64,
    pub delta: f64,
    /// Stop contributing once a round would push ε past this.
    pub epsilon_budget: Option<f64>,
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DpError {
    #[error("privacy budget spent: next round would reach ε={next:.4} > budget {budget:.4}")]
    BudgetExhausted { next: f64, budget: f64 },
    #[error("invalid DP configuration: {0}")]
    Config(String),
}

/// RDP orders searched; dense at small α (large ε) and long-tailed for small ε.
pub fn default_orders() -> Vec<f64> {
    let mut o: Vec<f64> = (0..=30).map(|i| 1.0 + 0.1 * (i as f64 + 1.0)).collect(); // 1.1..4.1
    o.extend([
        4.5, 5.0, 5.5, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0,
    ]);
    o.extend([
        40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0,
    ]);
    o
}

/// Rényi DP accountant for the Gaussian mechanism.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RdpAccountant {
    pub orders: Vec<f64>,
    /// Accumulated RDP per order.
    pub rdp: Vec<f64>,
    pub rounds: u64,
}

impl Default for RdpAccountant {
    fn default() -> Self {
        Self::new()
    }
}

impl RdpAccountant {
    pub fn new() -> RdpAccountant {
        let orders = default_orders();
        let rdp = vec![0.0; orders.len()];
        RdpAccountant {
            orders,
            rdp,
            rounds: 0,
        }
    }

    /// RDP of one Gaussian release at order α with noise multiplier z.
    pub fn gaussian_rdp(alpha: f64, z: f64) -> f64 {
        alpha / (2.0 * z * z)
    }

    /// Accounts one release.
    pub fn step(&mut self, z: f64) {
        for (r, &a) in self.rdp.iter_mut().zip(&self.orders) {
            *r += Self::gaussian_rdp(a, z);
        }
        self.rounds += 1;
    }

    /// (ε, best order) at δ for what has been accounted so far.
    pub fn epsilon(&self, delta: f64) -> (f64, f64) {
        if self.rounds == 0 {
            // Nothing released yet: no privacy spent.
            return (0.0, f64::NAN);
        }
        Self::eps_from(&self.orders, &self.rdp, delta)
    }

    /// ε if one more release with multiplier z were accounted.
    pub fn epsilon_after(&self, z: f64, delta: f64) -> f64 {
        let rdp: Vec<f64> = self
            .rdp
            .iter()
            .zip(&self.orders)
            .map(|(r, &a)| r + Self::gaussian_rdp(a, z))
            .collect();
        Self::eps_from(&self.orders, &rdp, delta).0
    }

    fn eps_from(orders: &[f64], rdp: &[f64], delta: f64) -> (f64, f64) {
        let mut best = (f64::INFINITY, f64::NAN);
        for (&a, &r) in orders.iter().zip(rdp) {
            let e = r + (1.0 / delta).ln() / (a - 1.0);
            if e < best.0 {
                best = (e, a);
            }
        }
        (best.0.max(0.0), best.1)
    }
}

/// What one privatised round cost.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DpReport {
    pub round: u64,
    pub norm_before: f64,
    pub clipped: bool,
    pub noise_std: f64,
    /// Cumulative ε after this round, and the ε of this round alone.
    pub epsilon: f64,
    pub epsilon_round: f64,
    pub order: f64,
}

/// Clips, noises and accounts; one per worker, kept across rounds (it is serde so a node can persist it).
#[derive(Debug)]
pub struct DpEngine {
    pub config: DpConfig,
    pub accountant: RdpAccountant,
    rng: StdRng,
}

/// Global L2 norm of an update, accumulated in f64.
pub fn l2_norm(t: &[Tensor]) -> f64 {
    t.iter()
        .flat_map(|t| t.data.iter())
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt()
}

/// Scales the update so its L2 norm is at most `c`; returns the norm before.
pub fn clip_l2(t: &mut [Tensor], c: f64) -> f64 {
    let n = l2_norm(t);
    if n > c && n > 0.0 {
        let f = (c / n) as f32;
        t.iter_mut()
            .flat_map(|t| t.data.iter_mut())
            .for_each(|x| *x *= f);
    }
    n
}

impl DpEngine {
    pub fn new(config: DpConfig) -> Result<DpEngine, DpError> {
        let bad = |m: &str| Err(DpError::Config(m.to_owned()));
        if !(config.clip_norm.is_finite() && config.clip_norm > 0.0) {
            return bad("clip_norm must be > 0");
        }
        if !(config.noise_multiplier.is_finite() && config.noise_multiplier > 0.0) {
            return bad("noise_multiplier must be > 0");
        }
        if !(config.delta > 0.0 && config.delta < 1.0) {
            return bad("delta must be in (0, 1)");
        }
        let rng = StdRng::seed_from_u64(config.seed);
        Ok(DpEngine {
            config,
            accountant: RdpAccountant::new(),
            rng,
        })
    }

    /// Resumes with a persisted accountant.
    pub fn with_accountant(
        config: DpConfig,
        accountant: RdpAccountant,
    ) -> Result<DpEngine, DpError> {
        let mut e = DpEngine::new(config)?;
        e.accountant = accountant;
        Ok(e)
    }

    /// ε spent so far.
    pub fn epsilon(&self) -> f64 {
        self.accountant.epsilon(self.config.delta).0
    }

    /// Privatises `update` in place, or refuses (leaving it untouched) when the budget would be exceeded.
    pub fn privatize(&mut self, update: &mut [Tensor]) -> Result<DpReport, DpError> {
        let (c, z, delta) = (
            self.config.clip_norm,
            self.config.noise_multiplier,
            self.config.delta,
        );
        let next = self.accountant.epsilon_after(z, delta);
        if let Some(budget) = self.config.epsilon_budget
            && next > budget
        {
            return Err(DpError::BudgetExhausted { next, budget });
        }
        let before = self.epsilon();
        let norm_before = clip_l2(update, c);
        let std = z * c;
        let normal = Normal::new(0.0f64, std).map_err(|e| DpError::Config(e.to_string()))?;
        for x in update.iter_mut().flat_map(|t| t.data.iter_mut()) {
            *x += normal.sample(&mut self.rng) as f32;
        }
        self.accountant.step(z);
        let (eps, order) = self.accountant.epsilon(delta);
        metrics::gauge!("hearth_federate_dp_epsilon").set(eps);
        Ok(DpReport {
            round: self.accountant.rounds,
            norm_before,
            clipped: norm_before > c,
            noise_std: std,
            epsilon: eps,
            epsilon_round: eps - before,
            order,
        })
    }
}
