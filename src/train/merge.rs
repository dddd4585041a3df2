//! Merging LoRA deltas, exactly in weight space, and measuring whether two deltas conflict.
//!
//! Every method works on each module's update `ΔW = scale·B·A` (`[out, in]`, f64), never on `A` and `B`
//! separately: `mean(B)·mean(A) ≠ mean(B·A)`, and two adapters of different rank or scale (rsLoRA's
//! `alpha/√r`) only agree in `ΔW`. A DoRA input's update is what it does to the weight,
//! `m ⊙ (W + ΔW)/‖W + ΔW‖_row − W`, so it needs the base weight `W`. The merged update is re-factored to the
//! target rank by truncated SVD and written as a plain LoRA with scale 1 (`lora_alpha = r`); the relative
//! residual `‖ΔW − B'A'‖_F / ‖ΔW‖_F` of that truncation is measured, not estimated, and reported per module.
//!
//! Methods, per entry `e` of each module, with weights `w_i` over inputs `i`:
//! - `linear`: the weighted mean `Σ w_i ΔW_i / Σ w_i` (weights default equal).
//! - `task_arithmetic`: the weighted sum `Σ w_i ΔW_i` (weights default 1).
//! - `ties` (Yadav et al. 2023): trim each `ΔW_i` to its `density` share of largest magnitudes, `τ_i = w_i ·
//!   trim(ΔW_i)`; elect the sign `γ = sign(Σ_i τ_i)`; the result is the mean of the nonzero `τ_i` whose sign is
//!   `γ` (disjoint mean), 0 where none.
//! - `dare` (Yu et al. 2023): drop each entry of `ΔW_i` with probability `drop`, scale the survivors by
//!   `1/(1 − drop)`, then the weighted sum as `task_arithmetic`. The masks are seeded (see [`dare_seed`]) so a
//!   merge is reproducible.

use std::collections::{BTreeMap, BTreeSet};

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::federate::linalg::{Mat, randomized_svd};
use crate::model::lora::TargetModules;
use crate::model::{LoraConfig, LoraPair, LoraSet, LoraTarget, ModelError};

/// Why a merge or a conflict measure could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("nothing to merge: give at least one delta")]
    Empty,
    #[error("{got} weights for {inputs} deltas")]
    WeightCount { got: usize, inputs: usize },
    #[error("invalid merge option: {0}")]
    Option(String),
    #[error("{module}: {why}")]
    Shape { module: String, why: String },
    #[error(
        "{module}: a DoRA delta changes the weight by m⊙(W+ΔW)/‖W+ΔW‖ − W, which needs the base weight W; \
         none was given"
    )]
    DoraNeedsBase { module: String },
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("delta `{id}`: {why}")]
    Delta { id: String, why: String },
    #[error(transparent)]
    Train(#[from] super::TrainError),
}

pub type Result<T> = std::result::Result<T, MergeError>;

/// How deltas are combined (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeMethod {
    Linear,
    TaskArithmetic,
    Ties,
    Dare,
}

impl MergeMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            MergeMethod::Linear => "linear",
            MergeMethod::TaskArithmetic => "task_arithmetic",
            MergeMethod::Ties => "ties",
            MergeMethod::Dare => "dare",
        }
    }
}

impl std::str::FromStr for MergeMethod {
    type Err = MergeError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "linear" => Ok(MergeMethod::Linear),
            "task_arithmetic" => Ok(MergeMethod::TaskArithmetic),
            "ties" => Ok(MergeMethod::Ties),
            "dare" => Ok(MergeMethod::Dare),
            _ => Err(MergeError::Option(format!(
                "unknown method `{s}` (linear, task_arithmetic, ties, dare)"
            ))),
        }
    }
}

/// What to merge and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeOptions {
    pub method: MergeMethod,
    /// One weight per input; `None`: equal (`linear`) or 1 each (the others).
    pub weights: Option<Vec<f64>>,
    /// Rank of the merged adapter.
    pub rank: usize,
    /// `ties`: the share of each update's entries kept, by magnitude, in (0, 1].
    pub density: f64,
    /// `dare`: the probability an entry is dropped, in [0, 1).
    pub drop: f64,
    /// Seeds `dare`'s masks and the randomized SVD.
    pub seed: u64,
}

impl MergeOptions {
    /// The method's usual settings: TIES keeps the top fifth, DARE drops nine in ten (the papers' defaults).
    pub fn new(method: MergeMethod, rank: usize) -> Self {
        MergeOptions {
            method,
            weights: None,
            rank,
            density: 0.2,
            drop: 0.9,
            seed: 0,
        }
    }

    fn check(&self, inputs: usize) -> Result<Vec<f64>> {
        if inputs == 0 {
            return Err(MergeError::Empty);
        }
        if self.rank == 0 {
            return Err(MergeError::Option("rank must be at least 1".into()));
        }
        if !(self.density > 0.0 && self.density <= 1.0) {
            return Err(MergeError::Option(format!(
                "density {} is not in (0, 1]",
                self.density
            )));
        }
        if !(self.drop >= 0.0 && self.drop < 1.0) {
            return Err(MergeError::Option(format!(
                "drop {} is not in [0, 1)",
                self.drop
            )));
        }
        let w = match &self.weights {
            Some(w) if w.len() != inputs => {
                return Err(MergeError::WeightCount {
                    got: w.len(),
                    inputs,
                });
            }
            Some(w) => w.clone(),
            None if self.method == MergeMethod::Linear => vec![1.0 / inputs as f64; inputs],
            None => vec![1.0; inputs],
        };
        if let Some(x) = w.iter().find(|x| !x.is_finite()) {
            return Err(MergeError::Option(format!("weight {x} is not finite")));
        }
        if self.method == MergeMethod::Linear {
            let sum: f64 = w.iter().sum();
            if sum.abs() < 1e-12 {
                return Err(MergeError::Option(
                    "linear weights sum to zero: a mean needs a nonzero total".into(),
                ));
            }
            return Ok(w.iter().map(|x| x / sum).collect());
        }
        Ok(w)
    }
}

/// The seed of DARE's mask for one input's module: `seed`, input, layer and target mixed by one splitmix64
/// step each, so masks differ between modules and inputs yet a merge is reproducible.
pub fn dare_seed(seed: u64, input: usize, layer: usize, target: LoraTarget) -> u64 {
    let t = LoraTarget::ALL
        .iter()
        .position(|x| *x == target)
        .unwrap_or(0) as u64;
    [input as u64, layer as u64, t]
        .iter()
        .fold(seed, |h, &x| splitmix64(h ^ x))
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The base weight `[out, in]` (GGUF row order, like the adapters' `B`) of one module, for DoRA inputs.
pub type BaseWeight<'a> =
    &'a (dyn Fn(usize, LoraTarget) -> std::result::Result<Tensor, ModelError> + Sync);

/// What re-factoring one module cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleMerge {
    pub layer: usize,
    pub target: LoraTarget,
    /// `‖ΔW‖_F` of the merged update before truncation.
    pub norm: f64,
    /// `‖ΔW − B'A'‖_F / ‖ΔW‖_F` (0 for a zero update).
    pub rel_residual: f64,
}

/// What a merge did, for the delta's provenance and the CLI.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MergeReport {
    pub method: MergeMethod,
    pub rank: usize,
    pub weights: Vec<f64>,
    /// Over all modules: `√(Σ residual²) / √(Σ ‖ΔW‖²)`.
    pub rel_residual: f64,
    pub modules: Vec<ModuleMerge>,
}

/// Every module any input adapts, with its `[out, in]` shape, checked to agree between inputs.
fn modules(sets: &[&LoraSet]) -> Result<BTreeMap<(usize, LoraTarget), (usize, usize)>> {
    let mut shapes: BTreeMap<(usize, LoraTarget), (usize, usize)> = BTreeMap::new();
    for set in sets {
        for (&(l, t), p) in set.iter() {
            let module = t.module_path(l);
            let (ra, n_in) = p.a.dims2()?;
            let (n_out, rb) = p.b.dims2()?;
            if ra != rb {
                return Err(MergeError::Shape {
                    module,
                    why: format!("A {:?} and B {:?} disagree on rank", p.a.dims(), p.b.dims()),
                });
            }
            match shapes.get(&(l, t)) {
                Some(&s) if s != (n_out, n_in) => {
                    return Err(MergeError::Shape {
                        module,
                        why: format!("[{n_out}, {n_in}] in one delta, {s:?} in another"),
                    });
                }
                _ => {
                    shapes.insert((l, t), (n_out, n_in));
                }
            }
        }
    }
    Ok(shapes)
}

fn to_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
}

/// The update one pair makes to its module's weight, `[out, in]` row-major: `scale·B·A`, or with DoRA
/// `m ⊙ (W + scale·B·A)/‖W + scale·B·A‖_row − W`.
pub fn effective_delta(
    layer: usize,
    target: LoraTarget,
    pair: &LoraPair,
    base: Option<BaseWeight<'_>>,
) -> Result<Mat> {
    let (r, n_in) = pair.a.dims2()?;
    let n_out = pair.b.dim(0)?;
    let a = to_f64(&pair.a)?;
    let b = to_f64(&pair.b)?;
    let mut d = Mat::zeros(n_out, n_in);
    for o in 0..n_out {
        for j in 0..r {
            let f = pair.scale * b[o * r + j];
            if f == 0.0 {
                continue;
            }
            for (x, &av) in d.data[o * n_in..(o + 1) * n_in]
                .iter_mut()
                .zip(&a[j * n_in..(j + 1) * n_in])
            {
                *x += f * av;
            }
        }
    }
    let Some(m) = &pair.magnitude else {
        return Ok(d);
    };
    let module = target.module_path(layer);
    let base = base.ok_or_else(|| MergeError::DoraNeedsBase {
        module: module.clone(),
    })?;
    let w = to_f64(&base(layer, target)?)?;
    let m = to_f64(m)?;
    if w.len() != n_out * n_in || m.len() != n_out {
        return Err(MergeError::Shape {
            module,
            why: format!(
                "base weight of {} values and magnitude of {} do not fit [{n_out}, {n_in}]",
                w.len(),
                m.len()
            ),
        });
    }
    for o in 0..n_out {
        let row = &mut d.data[o * n_in..(o + 1) * n_in];
        let wrow = &w[o * n_in..(o + 1) * n_in];
        let norm = row
            .iter()
            .zip(wrow)
            .map(|(x, w)| (x + w) * (x + w))
            .sum::<f64>()
            .sqrt();
        // A zero row stays the base's zero row: there is no direction to scale.
        let f = if norm > 0.0 { m[o] / norm } else { 0.0 };
        for (x, &wv) in row.iter_mut().zip(wrow) {
            *x = f * (*x + wv) - wv;
        }
    }
    Ok(d)
}

/// Zeroes all but the `ceil(density·n)` entries of largest magnitude (earlier entries win ties).
fn trim(d: &mut [f64], density: f64) {
    let keep = ((density * d.len() as f64).ceil() as usize).min(d.len());
    if keep == d.len() {
        return;
    }
    let mut idx: Vec<usize> = (0..d.len()).collect();
    idx.sort_by(|&x, &y| d[y].abs().total_cmp(&d[x].abs()).then(x.cmp(&y)));
    for &i in &idx[keep..] {
        d[i] = 0.0;
    }
}

/// Combines the inputs' updates of one module by `opts.method`.
fn combine(
    key: (usize, LoraTarget),
    mut deltas: Vec<Option<Mat>>,
    shape: (usize, usize),
    w: &[f64],
    opts: &MergeOptions,
) -> Mat {
    let (layer, target) = key;
    let mut out = Mat::zeros(shape.0, shape.1);
    match opts.method {
        MergeMethod::Linear | MergeMethod::TaskArithmetic => {
            for (d, &wi) in deltas.iter().zip(w) {
                if let Some(d) = d {
                    out.data
                        .iter_mut()
                        .zip(&d.data)
                        .for_each(|(o, x)| *o += wi * x);
                }
            }
        }
        MergeMethod::Dare => {
            for (i, (d, &wi)) in deltas.iter().zip(w).enumerate() {
                if let Some(d) = d {
                    let mut rng = StdRng::seed_from_u64(dare_seed(opts.seed, i, layer, target));
                    let keep = 1.0 / (1.0 - opts.drop);
                    for (o, x) in out.data.iter_mut().zip(&d.data) {
                        if rng.random::<f64>() >= opts.drop {
                            *o += wi * keep * x;
                        }
                    }
                }
            }
        }
        MergeMethod::Ties => {
            for (d, &wi) in deltas.iter_mut().zip(w) {
                if let Some(d) = d {
                    trim(&mut d.data, opts.density);
                    d.data.iter_mut().for_each(|x| *x *= wi);
                }
            }
            let present: Vec<&Mat> = deltas.iter().flatten().collect();
            for (e, o) in out.data.iter_mut().enumerate() {
                let total: f64 = present.iter().map(|d| d.data[e]).sum();
                let sign = total.signum();
                if total == 0.0 {
                    continue;
                }
                let (mut sum, mut n) = (0.0, 0usize);
                for d in &present {
                    let x = d.data[e];
                    if x != 0.0 && x.signum() == sign {
                        sum += x;
                        n += 1;
                    }
                }
                if n > 0 {
                    *o = sum / n as f64;
                }
            }
        }
    }
    out
}

/// `ΔW ≈ B'·A'` at rank `rank` by truncated SVD, split evenly (`B' = U√σ`, `A' = √σVᵀ`), zero-padded to `rank`
/// when the update has lower rank. Returns `(A' [rank, in], B' [out, rank], ‖ΔW − B'A'‖_F)`.
pub fn refactor(d: &Mat, rank: usize, seed: u64) -> (Vec<f32>, Vec<f32>, f64) {
    let (n_out, n_in) = (d.rows, d.cols);
    let mut a = vec![0f32; rank * n_in];
    let mut b = vec![0f32; n_out * rank];
    if d.frob2() == 0.0 {
        return (a, b, 0.0);
    }
    // Power iterations make the randomized range exact for an update of rank ≤ rank + oversampling and close
    // to the optimum otherwise; the residual below is measured either way.
    let (left, s, right) = randomized_svd(d, rank, 8, 4, seed);
    for (j, &sv) in s.iter().enumerate().take(rank) {
        let f = sv.max(0.0).sqrt();
        for o in 0..n_out {
            b[o * rank + j] = (left.at(o, j) * f) as f32;
        }
        for i in 0..n_in {
            a[j * n_in + i] = (right.at(i, j) * f) as f32;
        }
    }
    let mut res2 = 0.0;
    for o in 0..n_out {
        for i in 0..n_in {
            let approx: f64 = (0..rank)
                .map(|j| b[o * rank + j] as f64 * a[j * n_in + i] as f64)
                .sum();
            let e = d.at(o, i) - approx;
            res2 += e * e;
        }
    }
    (a, b, res2.sqrt())
}

/// Merges `sets` by `opts` into a plain LoRA adapter of rank `opts.rank` (scale 1), with what the truncation
/// lost. `base` supplies base weights for DoRA inputs; without it a DoRA input is an error.
pub fn merge(
    sets: &[&LoraSet],
    opts: &MergeOptions,
    base: Option<BaseWeight<'_>>,
) -> Result<(LoraSet, MergeReport)> {
    let w = opts.check(sets.len())?;
    let shapes = modules(sets)?;
    let merged: Vec<(Vec<f32>, Vec<f32>, ModuleMerge)> = shapes
        .par_iter()
        .map(|(&(l, t), &shape)| {
            let deltas = sets
                .iter()
                .map(|s| {
                    s.get(l, t)
                        .map(|p| effective_delta(l, t, p, base))
                        .transpose()
                })
                .collect::<Result<Vec<_>>>()?;
            let d = combine((l, t), deltas, shape, &w, opts);
            let norm = d.frob2().sqrt();
            let seed = dare_seed(opts.seed ^ 0x5356_4400, usize::MAX, l, t);
            let (a, b, res) = refactor(&d, opts.rank, seed);
            let report = ModuleMerge {
                layer: l,
                target: t,
                norm,
                rel_residual: if norm > 0.0 { res / norm } else { 0.0 },
            };
            Ok((a, b, report))
        })
        .collect::<Result<_>>()?;
    let targets: BTreeSet<LoraTarget> = shapes.keys().map(|&(_, t)| t).collect();
    let mut config = LoraConfig {
        r: opts.rank,
        lora_alpha: opts.rank as f64,
        target_modules: TargetModules::List(
            targets.iter().map(|t| t.peft_name().to_string()).collect(),
        ),
        use_rslora: false,
        use_dora: false,
        rank_pattern: BTreeMap::new(),
        alpha_pattern: BTreeMap::new(),
        ..sets[0].config.clone()
    };
    config.lora_dropout = 0.0;
    let mut out = LoraSet::empty(config);
    let (mut res2, mut norm2) = (0.0, 0.0);
    let mut modules = Vec::with_capacity(merged.len());
    for (a, b, report) in merged {
        let (l, t) = (report.layer, report.target);
        let n_in = a.len() / opts.rank;
        let n_out = b.len() / opts.rank;
        let a = Tensor::from_vec(a, (opts.rank, n_in), &Device::Cpu)?;
        let b = Tensor::from_vec(b, (n_out, opts.rank), &Device::Cpu)?;
        out.insert(l, t, LoraPair::new(a, b, 1.0));
        res2 += (report.rel_residual * report.norm).powi(2);
        norm2 += report.norm.powi(2);
        modules.push(report);
    }
    let report = MergeReport {
        method: opts.method,
        rank: opts.rank,
        weights: w,
        rel_residual: if norm2 > 0.0 {
            (res2 / norm2).sqrt()
        } else {
            0.0
        },
        modules,
    };
    Ok((out, report))
}

/// How much two deltas pull against each other, per module and over all of them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleConflict {
    pub layer: usize,
    pub target: LoraTarget,
    /// Magnitude-weighted share of entries where the two updates have opposite signs (see [`conflict`]).
    pub sign_conflict: f64,
    /// `⟨ΔW_a, ΔW_b⟩ / (‖ΔW_a‖‖ΔW_b‖)`; 0 where either is zero.
    pub cosine: f64,
}

/// The conflict between two deltas (see [`conflict`]) and what [`decide`] made of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conflict {
    /// Over every module both adapt, weighted as in each module.
    pub sign_conflict: f64,
    /// The cosine of the two updates concatenated over every module either adapts.
    pub cosine: f64,
    pub modules: Vec<ModuleConflict>,
}

/// Where two deltas are merged rather than routed. Two deltas taught the same thing point the same way
/// (cosine near 1, few sign conflicts); opposite teachings point apart (cosine near −1, conflicts near 1);
/// unrelated deltas sit between (cosine near 0, conflicts near one half), where a merge dilutes each one
/// and gains nothing, so they stay routed: a merge needs positive evidence of agreement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ConflictThresholds {
    /// Merge only at a cosine of at least this.
    pub min_cosine: f64,
    /// Merge only with at most this magnitude-weighted share of sign conflicts.
    pub max_sign_conflict: f64,
}

impl Default for ConflictThresholds {
    fn default() -> Self {
        ConflictThresholds {
            min_cosine: 0.3,
            max_sign_conflict: 0.35,
        }
    }
}

/// Merge two deltas into one, or keep both and route requests between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Merge,
    Route,
}

/// Measures the conflict between `a` and `b` in their weight updates (DoRA inputs need `base`, as in
/// [`merge`]). The sign-conflict share weighs each entry by `min(|a_e|, |b_e|)`: an entry only one delta moves
/// cannot conflict, and small entries (mostly noise) count for little, as TIES trims them.
pub fn conflict(a: &LoraSet, b: &LoraSet, base: Option<BaseWeight<'_>>) -> Result<Conflict> {
    let shapes = modules(&[a, b])?;
    let per: Vec<(ModuleConflict, [f64; 5])> = shapes
        .par_iter()
        .map(|(&(l, t), _)| {
            let da = a
                .get(l, t)
                .map(|p| effective_delta(l, t, p, base))
                .transpose()?;
            let db = b
                .get(l, t)
                .map(|p| effective_delta(l, t, p, base))
                .transpose()?;
            let (mut dot, mut na, mut nb, mut opposed, mut weight) = (0.0, 0.0, 0.0, 0.0, 0.0);
            if let Some(da) = &da {
                na = da.frob2();
            }
            if let Some(db) = &db {
                nb = db.frob2();
            }
            if let (Some(da), Some(db)) = (&da, &db) {
                for (&x, &y) in da.data.iter().zip(&db.data) {
                    dot += x * y;
                    let m = x.abs().min(y.abs());
                    weight += m;
                    if x * y < 0.0 {
                        opposed += m;
                    }
                }
            }
            let m = ModuleConflict {
                layer: l,
                target: t,
                sign_conflict: if weight > 0.0 { opposed / weight } else { 0.0 },
                cosine: if na > 0.0 && nb > 0.0 {
                    dot / (na * nb).sqrt()
                } else {
                    0.0
                },
            };
            Ok((m, [dot, na, nb, opposed, weight]))
        })
        .collect::<Result<_>>()?;
    let mut sums = [0.0; 5];
    for (_, s) in &per {
        sums.iter_mut().zip(s).for_each(|(x, y)| *x += y);
    }
    let [dot, na, nb, opposed, weight] = sums;
    Ok(Conflict {
        sign_conflict: if weight > 0.0 { opposed / weight } else { 0.0 },
        cosine: if na > 0.0 && nb > 0.0 {
            dot / (na * nb).sqrt()
        } else {
            0.0
        },
        modules: per.into_iter().map(|(m, _)| m).collect(),
    })
}

/// Merge when both measures show agreement (see [`ConflictThresholds`]); otherwise route.
pub fn decide(c: &Conflict, th: &ConflictThresholds) -> Decision {
    if c.cosine >= th.min_cosine && c.sign_conflict <= th.max_sign_conflict {
        Decision::Merge
    } else {
        Decision::Route
    }
}

/// The stored delta `id`: its adapter (loaded for `base`) and provenance.
pub(super) fn load_stored(
    store: &crate::store::Store,
    base: &crate::model::Base,
    id: &str,
) -> Result<(LoraSet, super::Provenance)> {
    let record = store.delta(id)?.ok_or_else(|| MergeError::Delta {
        id: id.to_owned(),
        why: format!("not in the store {}", store.path().display()),
    })?;
    let dir = std::path::Path::new(&record.path);
    let prov_path = dir.join("provenance.json");
    let bytes = std::fs::read(&prov_path).map_err(|e| super::io_err(&prov_path, e))?;
    let prov: super::Provenance =
        serde_json::from_slice(&bytes).map_err(super::TrainError::from)?;
    if prov.base_sha256 != base.sha256 {
        return Err(MergeError::Delta {
            id: id.to_owned(),
            why: format!(
                "adapts base {}, not the given base {}",
                prov.base_sha256, base.sha256
            ),
        });
    }
    Ok((LoraSet::load_peft(dir, base.model.config())?, prov))
}

/// Base weights of `base`, dequantized, for DoRA inputs.
pub(super) fn base_weight(
    base: &crate::model::Base,
) -> impl Fn(usize, LoraTarget) -> std::result::Result<Tensor, ModelError> + Sync + '_ {
    move |l, t| {
        let blk = base.model.blocks().get(l).ok_or_else(|| {
            ModelError::Adapter(format!("{}: the base has no such layer", t.module_path(l)))
        })?;
        blk.linear(t).dequantize()
    }
}

/// Merges the deltas `ids` held in the store of `data_dir` and publishes the result under `data_dir/deltas` as
/// a candidate, exactly as a trained delta arrives: the eval gate judges it against what is served (at the eval
/// node's start, or through [`crate::eval::Gate::judge`]). Its provenance names the method, the parents and what
/// the re-factoring lost; its data digest binds the parents' data and the merge options.
pub fn merge_stored(
    data_dir: &std::path::Path,
    base: &crate::model::Base,
    ids: &[String],
    opts: &MergeOptions,
) -> Result<(crate::message::Delta, MergeReport)> {
    merge_stored_for(data_dir, base, ids, opts, &[], serde_json::Value::Null)
}

/// [`merge_stored`] for the users `members` (none: a merge made by hand, judged as a common delta): the gate
/// judges the result on their held-out data and promotes it on each one's chain. `why` goes into the
/// provenance (`metrics.merge.why`): the measures that made the merge.
pub fn merge_stored_for(
    data_dir: &std::path::Path,
    base: &crate::model::Base,
    ids: &[String],
    opts: &MergeOptions,
    members: &[String],
    why: serde_json::Value,
) -> Result<(crate::message::Delta, MergeReport)> {
    let mut store = crate::store::Store::open(data_dir)?;
    // Whose data the merge holds: every parent's; unknown if any parent's is.
    let mut trained_on = Some(BTreeSet::new());
    for id in ids {
        let known = store.delta(id)?.and_then(|r| r.trained_on());
        trained_on = trained_on.zip(known).map(|(mut all, k)| {
            all.extend(k);
            all
        });
    }
    let loaded = ids
        .iter()
        .map(|id| load_stored(&store, base, id))
        .collect::<Result<Vec<_>>>()?;
    let sets: Vec<&LoraSet> = loaded.iter().map(|(s, _)| s).collect();
    let weight = base_weight(base);
    let (set, report) = merge(&sets, opts, Some(&weight))?;
    let first = &loaded.first().ok_or(MergeError::Empty)?.1;
    let parents: Vec<serde_json::Value> = ids
        .iter()
        .zip(&loaded)
        .map(|(id, (_, p))| serde_json::json!({"id": id, "data_digest": p.data_digest}))
        .collect();
    let spec = serde_json::json!({"options": opts, "parents": parents});
    let provenance = super::Provenance {
        delta_id: String::new(),
        base_sha256: base.sha256.clone(),
        recipe_sha256: first.recipe_sha256.clone(),
        recipe: first.recipe.clone(),
        data_digest: super::sha256_hex(format!("merge {spec}").as_bytes()),
        num_samples: loaded.iter().map(|(_, p)| p.num_samples).sum(),
        parent: ids.first().cloned(),
        seed: opts.seed,
        metrics: serde_json::json!({"merge": {
            "method": opts.method, "parents": parents, "weights": report.weights, "rank": opts.rank,
            "density": opts.density, "drop": opts.drop, "seed": opts.seed,
            "rel_residual": report.rel_residual,
        }}),
        created_at_unix_ms: crate::clock::now_unix_ms(),
    };
    let mut provenance = provenance;
    if !why.is_null() {
        provenance.metrics["merge"]["why"] = why;
    }
    let mut extra = serde_json::Map::new();
    if let Some(users) = trained_on {
        extra.insert(
            crate::store::TRAINED_ON.into(),
            users.into_iter().collect::<Vec<_>>().into(),
        );
    }
    if !members.is_empty() {
        extra.insert(crate::store::MEMBERS.into(), members.to_vec().into());
    }
    let delta = super::artifact::save_delta_with(
        &data_dir.join("deltas"),
        &set,
        base.model.config(),
        provenance,
        &extra,
    )?;
    let prov_path = std::path::Path::new(&delta.path).join("provenance.json");
    let bytes = std::fs::read(&prov_path).map_err(|e| super::io_err(&prov_path, e))?;
    let prov: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(super::TrainError::from)?;
    store.record_delta(&delta, &prov)?;
    Ok((delta, report))
}

/// [`conflict`] between two deltas held in the store of `data_dir`.
pub fn conflict_stored(
    data_dir: &std::path::Path,
    base: &crate::model::Base,
    a: &str,
    b: &str,
) -> Result<Conflict> {
    let store = crate::store::Store::open(data_dir)?;
    let (sa, _) = load_stored(&store, base, a)?;
    let (sb, _) = load_stored(&store, base, b)?;
    let weight = base_weight(base);
    conflict(&sa, &sb, Some(&weight))
}

/// `Σ c_i · ΔW_i` exactly, without SVD, for serving several adapters at once: per module, `A` stacks the
/// inputs' `A`s and `B` sets their `c_i·scale_i·B_i` side by side, so `B·A` is the weighted sum and the rank is
/// the sum of ranks. DoRA inputs are refused: their update depends on `W` and does not add.
pub fn mix(parts: &[(&LoraSet, f64)]) -> Result<LoraSet> {
    let first = parts.first().ok_or(MergeError::Empty)?;
    let sets: Vec<&LoraSet> = parts.iter().map(|(s, _)| *s).collect();
    let shapes = modules(&sets)?;
    let mut out = LoraSet::empty(LoraConfig {
        use_dora: false,
        use_rslora: false,
        rank_pattern: BTreeMap::new(),
        alpha_pattern: BTreeMap::new(),
        ..first.0.config.clone()
    });
    for &(l, t) in shapes.keys() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        for (set, c) in parts {
            let Some(p) = set.get(l, t) else { continue };
            if p.magnitude.is_some() {
                return Err(MergeError::Option(format!(
                    "{}: a DoRA adapter cannot be mixed with a scale; its update does not add",
                    t.module_path(l)
                )));
            }
            a.push(p.a.to_dtype(DType::F32)?);
            b.push(p.b.to_dtype(DType::F32)?.affine(c * p.scale, 0.0)?);
        }
        let a = Tensor::cat(&a, 0)?;
        let b = Tensor::cat(&b, 1)?.contiguous()?;
        out.insert(l, t, LoraPair::new(a, b, 1.0));
    }
    Ok(out)
}
