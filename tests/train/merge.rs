//! Merging deltas in ΔW = scale·B·A: each method against a plain computation written here with loops over
//! `Vec<f64>`, the SVD re-factoring checked by reconstruction and by the optimal (Eckart–Young) residual of a
//! matrix whose singular values are known, rsLoRA and DoRA inputs, typed errors, and the conflict measure's
//! decision on agreeing and opposing deltas.

use crate::train_util;

use candle_core::{Device, Tensor};
use hearth::model::{LoraConfig, LoraPair, LoraSet, LoraTarget};
use hearth::train::merge::{
    ConflictThresholds, Decision, MergeError, MergeMethod, MergeOptions, conflict, dare_seed,
    decide, merge,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Dense = Vec<Vec<f64>>;

const OUT: usize = 5;
const IN: usize = 7;

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// A pair with random `A [r, IN]`, `B [OUT, r]` and the given scale, with its factors as plain vectors.
struct Raw {
    a: Vec<f32>,
    b: Vec<f32>,
    r: usize,
    scale: f64,
}

impl Raw {
    fn new(rng: &mut StdRng, r: usize, scale: f64) -> Raw {
        Raw {
            a: random(rng, r * IN),
            b: random(rng, OUT * r),
            r,
            scale,
        }
    }

    fn pair(&self) -> LoraPair {
        let a = Tensor::from_vec(self.a.clone(), (self.r, IN), &Device::Cpu).unwrap();
        let b = Tensor::from_vec(self.b.clone(), (OUT, self.r), &Device::Cpu).unwrap();
        LoraPair::new(a, b, self.scale)
    }

    /// `scale·B·A` by the definition.
    fn delta(&self) -> Dense {
        let mut d = vec![vec![0.0; IN]; OUT];
        for (o, row) in d.iter_mut().enumerate() {
            for (i, x) in row.iter_mut().enumerate() {
                for j in 0..self.r {
                    *x += self.scale * self.b[o * self.r + j] as f64 * self.a[j * IN + i] as f64;
                }
            }
        }
        d
    }
}

fn set_of(config: LoraConfig, pairs: &[(usize, LoraTarget, &Raw)]) -> LoraSet {
    let mut s = LoraSet::empty(config);
    for (l, t, raw) in pairs {
        s.insert(*l, *t, raw.pair());
    }
    s
}

fn plain_config(r: usize) -> LoraConfig {
    LoraConfig::new(r, 2.0 * r as f64, &[LoraTarget::Q, LoraTarget::Down])
}

/// `scale·B·A` of a merged pair.
fn merged_delta(set: &LoraSet, l: usize, t: LoraTarget) -> Dense {
    let p = set.get(l, t).expect("merged module");
    let a: Vec<Vec<f32>> = p.a.to_vec2().unwrap();
    let b: Vec<Vec<f32>> = p.b.to_vec2().unwrap();
    (0..b.len())
        .map(|o| {
            (0..a[0].len())
                .map(|i| {
                    p.scale
                        * (0..a.len())
                            .map(|j| b[o][j] as f64 * a[j][i] as f64)
                            .sum::<f64>()
                })
                .collect()
        })
        .collect()
}

fn assert_close(got: &Dense, want: &Dense, tol: f64, what: &str) {
    let scale = want
        .iter()
        .flatten()
        .fold(0.0f64, |m, x| m.max(x.abs()))
        .max(1e-9);
    for (o, (g, w)) in got.iter().zip(want).enumerate() {
        for (i, (g, w)) in g.iter().zip(w).enumerate() {
            assert!(
                (g - w).abs() <= tol * scale,
                "{what}: [{o}][{i}] merged {g}, reference {w}"
            );
        }
    }
}

fn zeros() -> Dense {
    vec![vec![0.0; IN]; OUT]
}

/// Three inputs of different rank and scale: layer 0's Q in all, layer 1's Down in the first two.
fn three(seed: u64) -> (Vec<Raw>, Vec<Raw>, Vec<LoraSet>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let q = vec![
        Raw::new(&mut rng, 2, 2.0),
        Raw::new(&mut rng, 3, 0.5),
        Raw::new(&mut rng, 1, 1.5),
    ];
    let down = vec![Raw::new(&mut rng, 2, 1.0), Raw::new(&mut rng, 4, 0.25)];
    let sets = vec![
        set_of(
            plain_config(2),
            &[(0, LoraTarget::Q, &q[0]), (1, LoraTarget::Down, &down[0])],
        ),
        set_of(
            plain_config(3),
            &[(0, LoraTarget::Q, &q[1]), (1, LoraTarget::Down, &down[1])],
        ),
        set_of(plain_config(1), &[(0, LoraTarget::Q, &q[2])]),
    ];
    (q, down, sets)
}

fn refs(sets: &[LoraSet]) -> Vec<&LoraSet> {
    sets.iter().collect()
}

/// Full rank, so the re-factoring loses nothing and the merged ΔW is the method's result itself.
const FULL: usize = OUT;

fn weighted_sum(deltas: &[Dense], w: &[f64]) -> Dense {
    let mut out = zeros();
    for (d, wi) in deltas.iter().zip(w) {
        for o in 0..OUT {
            for i in 0..IN {
                out[o][i] += wi * d[o][i];
            }
        }
    }
    out
}

#[test]
fn linear_is_the_weighted_mean_of_the_updates_not_of_the_factors() {
    let (q, down, sets) = three(1);
    let mut opts = MergeOptions::new(MergeMethod::Linear, FULL);
    opts.weights = Some(vec![2.0, 1.0, 1.0]);
    let (m, report) = merge(&refs(&sets), &opts, None).unwrap();
    let w = [0.5, 0.25, 0.25];
    let want_q = weighted_sum(&q.iter().map(Raw::delta).collect::<Vec<_>>(), &w);
    // The third input has no Down: it counts as a zero update in the mean.
    let want_down = weighted_sum(&[down[0].delta(), down[1].delta(), zeros()], &w);
    assert_close(&merged_delta(&m, 0, LoraTarget::Q), &want_q, 1e-5, "Q");
    assert_close(
        &merged_delta(&m, 1, LoraTarget::Down),
        &want_down,
        1e-5,
        "Down",
    );
    assert!(report.rel_residual < 1e-6, "{report:?}");
    assert_eq!(report.weights, w.to_vec());
    assert_eq!(m.config.r, FULL);
    assert!(m.iter().all(|(_, p)| p.rank() == FULL && p.scale == 1.0));
}

#[test]
fn task_arithmetic_sums_the_weighted_updates() {
    let (q, _, sets) = three(2);
    let mut opts = MergeOptions::new(MergeMethod::TaskArithmetic, FULL);
    opts.weights = Some(vec![1.0, -0.5, 2.0]);
    let (m, _) = merge(&refs(&sets), &opts, None).unwrap();
    let want = weighted_sum(
        &q.iter().map(Raw::delta).collect::<Vec<_>>(),
        &[1.0, -0.5, 2.0],
    );
    assert_close(&merged_delta(&m, 0, LoraTarget::Q), &want, 1e-5, "Q");
    // Weights default to 1 each: the plain sum.
    let (m, _) = merge(
        &refs(&sets),
        &MergeOptions::new(MergeMethod::TaskArithmetic, FULL),
        None,
    )
    .unwrap();
    let want = weighted_sum(&q.iter().map(Raw::delta).collect::<Vec<_>>(), &[1.0; 3]);
    assert_close(
        &merged_delta(&m, 0, LoraTarget::Q),
        &want,
        1e-5,
        "Q, unweighted",
    );
}

/// TIES by the paper: keep each update's top `density` share by magnitude, weight, elect each entry's sign by
/// the sum, average the kept entries of that sign.
fn ties_reference(deltas: &[Dense], w: &[f64], density: f64) -> Dense {
    let n = OUT * IN;
    let keep = (density * n as f64).ceil() as usize;
    let trimmed: Vec<Dense> = deltas
        .iter()
        .zip(w)
        .map(|(d, wi)| {
            let mut mags: Vec<f64> = d.iter().flatten().map(|x| x.abs()).collect();
            mags.sort_by(|a, b| b.total_cmp(a));
            let threshold = mags[keep - 1];
            d.iter()
                .map(|row| {
                    row.iter()
                        .map(|&x| if x.abs() >= threshold { wi * x } else { 0.0 })
                        .collect()
                })
                .collect()
        })
        .collect();
    let mut out = zeros();
    for o in 0..OUT {
        for i in 0..IN {
            let total: f64 = trimmed.iter().map(|t| t[o][i]).sum();
            let agreeing: Vec<f64> = trimmed
                .iter()
                .map(|t| t[o][i])
                .filter(|&x| x != 0.0 && (x > 0.0) == (total > 0.0))
                .collect();
            if total != 0.0 && !agreeing.is_empty() {
                out[o][i] = agreeing.iter().sum::<f64>() / agreeing.len() as f64;
            }
        }
    }
    out
}

#[test]
fn ties_trims_elects_signs_and_takes_the_disjoint_mean() {
    let (q, down, sets) = three(3);
    for density in [0.3, 0.6, 1.0] {
        let mut opts = MergeOptions::new(MergeMethod::Ties, FULL);
        opts.weights = Some(vec![1.0, 0.7, 1.2]);
        opts.density = density;
        let (m, _) = merge(&refs(&sets), &opts, None).unwrap();
        let want = ties_reference(
            &q.iter().map(Raw::delta).collect::<Vec<_>>(),
            &[1.0, 0.7, 1.2],
            density,
        );
        assert_close(
            &merged_delta(&m, 0, LoraTarget::Q),
            &want,
            1e-5,
            &format!("Q at density {density}"),
        );
        // A module two of three adapt: the absent one takes no part in the vote or the mean.
        let want = ties_reference(&[down[0].delta(), down[1].delta()], &[1.0, 0.7], density);
        assert_close(
            &merged_delta(&m, 1, LoraTarget::Down),
            &want,
            1e-5,
            &format!("Down at density {density}"),
        );
    }
}

#[test]
fn dare_drops_with_p_rescales_and_is_seeded() {
    let (q, _, sets) = three(4);
    let (p, seed) = (0.5, 11u64);
    let mut opts = MergeOptions::new(MergeMethod::Dare, FULL);
    opts.drop = p;
    opts.seed = seed;
    opts.weights = Some(vec![1.0, 0.5, 2.0]);
    let (m, _) = merge(&refs(&sets), &opts, None).unwrap();
    // The mask: one uniform draw per entry in row-major order from the documented per-module seed.
    let mut want = zeros();
    let mut dropped = 0usize;
    for (i, (raw, wi)) in q.iter().zip([1.0, 0.5, 2.0]).enumerate() {
        let d = raw.delta();
        let mut rng = StdRng::seed_from_u64(dare_seed(seed, i, 0, LoraTarget::Q));
        for o in 0..OUT {
            for c in 0..IN {
                if rng.random::<f64>() < p {
                    dropped += 1;
                } else {
                    want[o][c] += wi * d[o][c] / (1.0 - p);
                }
            }
        }
    }
    assert_close(&merged_delta(&m, 0, LoraTarget::Q), &want, 1e-5, "Q");
    let share = dropped as f64 / (3 * OUT * IN) as f64;
    assert!((share - p).abs() < 0.15, "dropped {share}");
    // Same seed, same merge; another seed, another mask.
    let (again, _) = merge(&refs(&sets), &opts, None).unwrap();
    assert_eq!(
        merged_delta(&again, 0, LoraTarget::Q),
        merged_delta(&m, 0, LoraTarget::Q)
    );
    opts.seed = seed + 1;
    let (other, _) = merge(&refs(&sets), &opts, None).unwrap();
    assert_ne!(
        merged_delta(&other, 0, LoraTarget::Q),
        merged_delta(&m, 0, LoraTarget::Q)
    );
    // Dropping nothing is task arithmetic.
    opts.drop = 0.0;
    let (none, _) = merge(&refs(&sets), &opts, None).unwrap();
    let sum = weighted_sum(
        &q.iter().map(Raw::delta).collect::<Vec<_>>(),
        &[1.0, 0.5, 2.0],
    );
    assert_close(&merged_delta(&none, 0, LoraTarget::Q), &sum, 1e-5, "p = 0");
}

/// ΔW = Σ σ_j e_{row_j} e_{col_j}ᵀ has singular values σ: truncated to rank k, the best possible residual is
/// √(Σ_{j>k} σ_j²) / √(Σ σ_j²), and the kept part is exactly the k largest terms.
#[test]
fn the_svd_refactoring_keeps_the_top_singular_directions_and_reports_the_residual() {
    let sigma = [4.0f64, 3.0, 2.0, 1.0];
    let rows = [3usize, 0, 4, 1];
    let cols = [6usize, 2, 0, 5];
    let r = sigma.len();
    let mut a = vec![0f32; r * IN];
    let mut b = vec![0f32; OUT * r];
    for j in 0..r {
        a[j * IN + cols[j]] = 1.0;
        b[rows[j] * r + j] = sigma[j] as f32;
    }
    let raw = Raw {
        a,
        b,
        r,
        scale: 1.0,
    };
    let set = set_of(plain_config(r), &[(0, LoraTarget::Q, &raw)]);
    for k in 1..=r {
        let (m, report) = merge(&[&set], &MergeOptions::new(MergeMethod::Linear, k), None).unwrap();
        let total: f64 = sigma.iter().map(|s| s * s).sum();
        let lost: f64 = sigma[k..].iter().map(|s| s * s).sum();
        let want_residual = (lost / total).sqrt();
        assert!(
            (report.rel_residual - want_residual).abs() < 1e-5,
            "rank {k}: residual {} vs optimal {want_residual}",
            report.rel_residual
        );
        assert!((report.modules[0].norm - total.sqrt()).abs() < 1e-5);
        let mut want = zeros();
        for j in 0..k {
            want[rows[j]][cols[j]] = sigma[j];
        }
        assert_close(
            &merged_delta(&m, 0, LoraTarget::Q),
            &want,
            1e-5,
            &format!("rank {k}"),
        );
        assert_eq!(m.get(0, LoraTarget::Q).unwrap().rank(), k);
    }
    // Asking for more rank than the update has pads with zeros and loses nothing.
    let (m, report) = merge(&[&set], &MergeOptions::new(MergeMethod::Linear, 6), None).unwrap();
    assert!(report.rel_residual < 1e-6);
    assert_eq!(m.get(0, LoraTarget::Q).unwrap().rank(), 6);
    assert_close(
        &merged_delta(&m, 0, LoraTarget::Q),
        &raw.delta(),
        1e-5,
        "padded",
    );
}

/// rsLoRA scales by alpha/√r: an adapter saved with `use_rslora` and loaded back merges to alpha/√r·B·A.
#[test]
fn rslora_adapters_merge_at_alpha_over_root_r() {
    let dir = tempfile::tempdir().unwrap();
    let (_, model, _) = train_util::tiny(dir.path());
    let mut cfg = LoraConfig::new(4, 8.0, &[LoraTarget::V]);
    cfg.use_rslora = true;
    let set = train_util::with_random_b(&LoraSet::fresh(&model, cfg, 5).unwrap(), 6);
    set.save_peft(dir.path().join("rs"), model.config())
        .unwrap();
    let loaded = LoraSet::load_peft(dir.path().join("rs"), model.config()).unwrap();
    let (&(l, t), p) = loaded.iter().next().unwrap();
    let (m, report) = merge(&[&loaded], &MergeOptions::new(MergeMethod::Linear, 4), None).unwrap();
    assert!(report.rel_residual < 1e-5, "{report:?}");
    let a: Vec<Vec<f32>> = p.a.to_vec2().unwrap();
    let b: Vec<Vec<f32>> = p.b.to_vec2().unwrap();
    let scale = 8.0 / 2.0; // alpha / √r with r = 4
    let want: Dense = (0..b.len())
        .map(|o| {
            (0..a[0].len())
                .map(|i| scale * (0..4).map(|j| b[o][j] as f64 * a[j][i] as f64).sum::<f64>())
                .collect()
        })
        .collect();
    assert_close(&merged_delta(&m, l, t), &want, 1e-4, "rsLoRA");
}

/// A DoRA input changes the weight by m ⊙ (W + ΔW)/‖W + ΔW‖_row − W: the merge uses that update and needs W.
#[test]
fn dora_inputs_merge_by_their_effective_weight_update() {
    let mut rng = StdRng::seed_from_u64(9);
    let w: Vec<f32> = random(&mut rng, OUT * IN);
    let raw = Raw::new(&mut rng, 2, 0.5);
    let m: Vec<f32> = (0..OUT).map(|_| rng.random_range(0.5f32..2.0)).collect();
    let mut cfg = plain_config(2);
    cfg.use_dora = true;
    let mut dora = LoraSet::empty(cfg);
    let mag = Tensor::from_vec(m.clone(), OUT, &Device::Cpu).unwrap();
    let p = raw.pair();
    dora.insert(
        0,
        LoraTarget::Q,
        LoraPair::with_magnitude(p.a, p.b, p.scale, Some(mag)),
    );
    let plain_raw = Raw::new(&mut rng, 3, 1.0);
    let plain = set_of(plain_config(3), &[(0, LoraTarget::Q, &plain_raw)]);

    let opts = MergeOptions::new(MergeMethod::Linear, FULL);
    let err = merge(&[&dora, &plain], &opts, None).unwrap_err();
    assert!(matches!(err, MergeError::DoraNeedsBase { .. }), "{err}");

    let wt = Tensor::from_vec(w.clone(), (OUT, IN), &Device::Cpu).unwrap();
    let base = move |_l: usize, _t: LoraTarget| Ok(wt.clone());
    let (merged, _) = merge(&[&dora, &plain], &opts, Some(&base)).unwrap();
    let d = raw.delta();
    let mut eff = zeros();
    for o in 0..OUT {
        let norm = (0..IN)
            .map(|i| (w[o * IN + i] as f64 + d[o][i]).powi(2))
            .sum::<f64>()
            .sqrt();
        for i in 0..IN {
            let wv = w[o * IN + i] as f64;
            eff[o][i] = m[o] as f64 * (wv + d[o][i]) / norm - wv;
        }
    }
    let want = weighted_sum(&[eff, plain_raw.delta()], &[0.5, 0.5]);
    assert_close(
        &merged_delta(&merged, 0, LoraTarget::Q),
        &want,
        1e-5,
        "DoRA",
    );
    assert!(!merged.config.use_dora);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let (_, _, sets) = three(5);
    let mut opts = MergeOptions::new(MergeMethod::Linear, 2);
    opts.weights = Some(vec![1.0]);
    assert!(matches!(
        merge(&refs(&sets), &opts, None),
        Err(MergeError::WeightCount { got: 1, inputs: 3 })
    ));
    assert!(matches!(
        merge(&[], &MergeOptions::new(MergeMethod::Linear, 2), None),
        Err(MergeError::Empty)
    ));
    for bad in [
        MergeOptions::new(MergeMethod::Ties, 0),
        MergeOptions {
            density: 0.0,
            ..MergeOptions::new(MergeMethod::Ties, 2)
        },
        MergeOptions {
            drop: 1.0,
            ..MergeOptions::new(MergeMethod::Dare, 2)
        },
        MergeOptions {
            weights: Some(vec![1.0, -1.0, 0.0]),
            ..MergeOptions::new(MergeMethod::Linear, 2)
        },
    ] {
        assert!(
            matches!(merge(&refs(&sets), &bad, None), Err(MergeError::Option(_))),
            "{bad:?}"
        );
    }
    // The same module with another shape.
    let mut rng = StdRng::seed_from_u64(1);
    let mut odd = LoraSet::empty(plain_config(2));
    let a = Tensor::from_vec(random(&mut rng, 2 * 3), (2, 3), &Device::Cpu).unwrap();
    let b = Tensor::from_vec(random(&mut rng, OUT * 2), (OUT, 2), &Device::Cpu).unwrap();
    odd.insert(0, LoraTarget::Q, LoraPair::new(a, b, 1.0));
    let err = merge(
        &[&sets[0], &odd],
        &MergeOptions::new(MergeMethod::Linear, 2),
        None,
    )
    .unwrap_err();
    assert!(matches!(err, MergeError::Shape { .. }), "{err}");
    assert!("bogus".parse::<MergeMethod>().is_err());
    assert_eq!("ties".parse::<MergeMethod>().unwrap(), MergeMethod::Ties);
}

/// Deltas taught the same thing (one a scaled, noisy copy of the other) merge; opposite teachings stay routed,
/// and so do unrelated deltas.
#[test]
fn agreeing_deltas_merge_and_opposing_ones_stay_routed() {
    let mut rng = StdRng::seed_from_u64(12);
    let base = Raw::new(&mut rng, 3, 1.0);
    let noisy = |rng: &mut StdRng, sign: f32| Raw {
        a: base.a.clone(),
        b: base
            .b
            .iter()
            .map(|x| sign * 0.8 * x + 0.1 * rng.random_range(-1.0f32..1.0))
            .collect(),
        r: 3,
        scale: 1.0,
    };
    let same = noisy(&mut rng, 1.0);
    let opposite = noisy(&mut rng, -1.0);
    let unrelated = Raw::new(&mut rng, 3, 1.0);
    let a = set_of(plain_config(3), &[(0, LoraTarget::Q, &base)]);
    let th = ConflictThresholds::default();

    let agree = conflict(
        &a,
        &set_of(plain_config(3), &[(0, LoraTarget::Q, &same)]),
        None,
    )
    .unwrap();
    assert!(agree.cosine > 0.9 && agree.sign_conflict < 0.1, "{agree:?}");
    assert_eq!(decide(&agree, &th), Decision::Merge);

    let oppose = conflict(
        &a,
        &set_of(plain_config(3), &[(0, LoraTarget::Q, &opposite)]),
        None,
    )
    .unwrap();
    assert!(
        oppose.cosine < -0.9 && oppose.sign_conflict > 0.9,
        "{oppose:?}"
    );
    assert_eq!(decide(&oppose, &th), Decision::Route);

    let apart = conflict(
        &a,
        &set_of(plain_config(3), &[(0, LoraTarget::Q, &unrelated)]),
        None,
    )
    .unwrap();
    assert_eq!(decide(&apart, &th), Decision::Route, "{apart:?}");

    // The thresholds are what decides: a lax cosine bound and conflict ceiling merge even the opposite pair.
    let lax = ConflictThresholds {
        min_cosine: -1.0,
        max_sign_conflict: 1.0,
    };
    assert_eq!(decide(&oppose, &lax), Decision::Merge);
    // A delta against itself: no conflict at all.
    let itself = conflict(&a, &a, None).unwrap();
    assert!((itself.cosine - 1.0).abs() < 1e-9 && itself.sign_conflict == 0.0);
}

/// Two deltas stored as the trainer stores them: `b` is `a`'s update times `sign` (B scaled, A kept).
fn stored_pair(root: &std::path::Path, sign: f32) -> (std::path::PathBuf, String, String) {
    use hearth::train::{Provenance, save_delta};
    let (base, model, _) = train_util::tiny(root);
    let fresh = LoraSet::fresh(
        &model,
        LoraConfig::new(4, 8.0, &[LoraTarget::Q, LoraTarget::Up]),
        1,
    )
    .unwrap();
    let a = train_util::with_random_b(&fresh, 2);
    let mut b = LoraSet::empty(a.config.clone());
    for (&(l, t), p) in a.iter() {
        let scaled = (&p.b * sign as f64).unwrap();
        b.insert(l, t, LoraPair::new(p.a.clone(), scaled, p.scale));
    }
    let data = root.join("data");
    let mut store = hearth::store::Store::open(&data).unwrap();
    let mut ids = Vec::new();
    for (set, digest) in [(&a, "da"), (&b, "db")] {
        let prov = Provenance {
            delta_id: String::new(),
            base_sha256: hearth::train::sha256_file(&base).unwrap(),
            recipe_sha256: "r".into(),
            recipe: train_util::fast_cfg(),
            data_digest: digest.into(),
            num_samples: 3,
            parent: None,
            seed: 1,
            metrics: serde_json::json!({}),
            created_at_unix_ms: 0,
        };
        let delta = save_delta(&data.join("deltas"), set, model.config(), prov.clone()).unwrap();
        store
            .record_delta(&delta, &serde_json::to_value(&prov).unwrap())
            .unwrap();
        ids.push(delta.id);
    }
    let b_id = ids.pop().unwrap();
    (base, ids.pop().unwrap(), b_id)
}

fn hearth(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `hearth deltas merge` stores a candidate naming its parents and method, which the gate then judges
/// (`--judge`); its options change the result; `hearth deltas conflict` says merge or route.
#[test]
fn the_cli_merges_stored_deltas_into_a_candidate_and_decides_merge_or_route() {
    let dir = tempfile::tempdir().unwrap();
    let (base, a, b) = stored_pair(dir.path(), 0.5);
    let data = dir.path().join("data");
    let (base, data) = (base.display().to_string(), data.display().to_string());
    let common = ["--model", base.as_str(), "--data-dir", data.as_str()];
    let run = |extra: &[&str]| {
        let mut args = vec!["deltas", "merge"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&common);
        args.extend_from_slice(&[a.as_str(), b.as_str()]);
        hearth(&args)
    };
    let id_of = |text: &str| {
        text.split_whitespace()
            .find(|w| w.starts_with("delta-") && *w != a && *w != b)
            .unwrap()
            .to_owned()
    };
    let linear = run(&["--method", "linear", "--rank", "4"]);
    let merged = id_of(&linear);
    let store = hearth::store::Store::open(std::path::Path::new(&data)).unwrap();
    let rec = store.delta(&merged).unwrap().unwrap();
    assert_eq!(rec.status.as_str(), "candidate");
    assert!(rec.verdict.is_none());
    assert_eq!(rec.parent.as_deref(), Some(a.as_str()));
    let m = &rec.provenance["metrics"]["merge"];
    assert_eq!(m["method"], "linear");
    assert_eq!(m["parents"][1]["id"], b.as_str());
    // b is a's update halved: their mean has a's rank, so rank 4 loses nothing.
    assert!(m["rel_residual"].as_f64().unwrap() < 1e-4, "{m}");

    // Each option reaches the merge: another weighting, density, drop or seed makes another delta.
    let weighted = id_of(&run(&[
        "--method",
        "linear",
        "--rank",
        "4",
        "--weights",
        "1,3",
    ]));
    let ties = id_of(&run(&[
        "--method",
        "ties",
        "--rank",
        "4",
        "--density",
        "0.5",
    ]));
    let ties2 = id_of(&run(&[
        "--method",
        "ties",
        "--rank",
        "4",
        "--density",
        "0.9",
    ]));
    let dare = id_of(&run(&["--method", "dare", "--rank", "4", "--drop", "0.5"]));
    let dare2 = id_of(&run(&["--method", "dare", "--rank", "4", "--drop", "0.3"]));
    let dare3 = id_of(&run(&[
        "--method", "dare", "--rank", "4", "--drop", "0.3", "--seed", "5",
    ]));
    let low = id_of(&run(&[
        "--method",
        "ties",
        "--rank",
        "2",
        "--density",
        "0.5",
    ]));
    let all = [
        &merged, &weighted, &ties, &ties2, &dare, &dare2, &dare3, &low,
    ];
    let distinct: std::collections::BTreeSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), all.len(), "{all:?}");
    let store = hearth::store::Store::open(std::path::Path::new(&data)).unwrap();
    let low = store.delta(&low).unwrap().unwrap();
    assert_eq!(low.provenance["metrics"]["merge"]["rank"], 2);

    // --judge runs the gate on the candidate: it leaves with a verdict.
    let judged = run(&["--method", "task_arithmetic", "--rank", "4", "--judge"]);
    let judged_id = id_of(&judged);
    assert!(
        judged.contains("promoted") || judged.contains("rejected"),
        "{judged}"
    );
    let store = hearth::store::Store::open(std::path::Path::new(&data)).unwrap();
    assert!(store.delta(&judged_id).unwrap().unwrap().verdict.is_some());

    let conflict = |x: &str, y: &str, extra: &[&str]| {
        let mut args = vec!["deltas", "conflict", x, y];
        args.extend_from_slice(extra);
        args.extend_from_slice(&common);
        hearth(&args)
    };
    let agree = conflict(&a, &b, &[]);
    assert!(agree.trim_end().ends_with("-> merge"), "{agree}");
    // A threshold above what the pair reaches routes it.
    let strict = conflict(&a, &b, &["--min-cosine", "1.01"]);
    assert!(strict.trim_end().ends_with("-> route"), "{strict}");

    let dir2 = tempfile::tempdir().unwrap();
    let (base2, a2, b2) = stored_pair(dir2.path(), -1.0);
    let data2 = dir2.path().join("data");
    let oppose = hearth(&[
        "deltas",
        "conflict",
        &a2,
        &b2,
        "--model",
        &base2.display().to_string(),
        "--data-dir",
        &data2.display().to_string(),
    ]);
    assert!(oppose.trim_end().ends_with("-> route"), "{oppose}");
    assert!(oppose.contains("cosine=-1.0000"), "{oppose}");
    let lax = hearth(&[
        "deltas",
        "conflict",
        &a2,
        &b2,
        "--max-sign-conflict",
        "1",
        "--min-cosine",
        "-1",
        "--model",
        &base2.display().to_string(),
        "--data-dir",
        &data2.display().to_string(),
    ]);
    assert!(lax.trim_end().ends_with("-> merge"), "{lax}");
}
