//! The optional downstream step: one delta trained per variant on what that variant admitted (its first
//! repeat), judged by the eval gate's legs against the bare base, so an ordering's effect on training shows
//! beside its leaks.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ExperimentError;
use crate::eval::{EvalError, Evaluator, GateConfig, ProbeSet, decide, personal_probes};
use crate::message::Sample;
use crate::model::Base;
use crate::train::{LoraTrainer, Provenance, TrainConfig, TrainError, save_delta};

/// `downstream: (model: "base.gguf", train: (...), gate: (...), probes: "probes.json")` in an experiment.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownstreamSpec {
    /// The base GGUF every variant's delta adapts (relative to the experiment file).
    pub model: String,
    /// The training recipe, as in a trainer node.
    #[serde(default)]
    pub train: TrainConfig,
    /// The gate's tolerances and sizes, as in an eval node.
    #[serde(default)]
    pub gate: GateConfig,
    /// A probe-set JSON file; default: the shipped set.
    #[serde(default)]
    pub probes: Option<String>,
}

/// One gate leg as reported per variant.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LegResult {
    pub leg: String,
    pub baseline: f64,
    pub candidate: f64,
    pub tolerance: f64,
    pub passed: bool,
}

/// What training on one variant's admitted set gave.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DownstreamResult {
    pub variant: String,
    /// Admitted samples the delta was trained on (before the recipe's hold-out).
    pub samples: usize,
    pub held_out: usize,
    pub steps: usize,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    pub delta: String,
    /// Whether the gate would promote this delta over the bare base, and why.
    pub passed: bool,
    pub reason: String,
    pub personal_gain: f64,
    pub legs: Vec<LegResult>,
}

/// Why a variant's downstream step failed.
#[derive(Debug, thiserror::Error)]
pub enum DownstreamError {
    #[error("base model {}: {source}", path.display())]
    Model {
        path: PathBuf,
        source: crate::model::ModelError,
    },
    #[error("variant `{variant}`: training: {source}")]
    Train { variant: String, source: TrainError },
    #[error("variant `{variant}`: gate: {source}")]
    Eval { variant: String, source: EvalError },
}

impl From<DownstreamError> for ExperimentError {
    fn from(e: DownstreamError) -> Self {
        ExperimentError::Downstream(Box::new(e))
    }
}

/// Loads the base once for every variant.
pub fn load_base(path: &Path) -> Result<Base, DownstreamError> {
    Base::load(path).map_err(|source| DownstreamError::Model {
        path: path.to_path_buf(),
        source,
    })
}

/// Trains one delta on `admitted` into `out` and scores it and the bare base on the gate's legs. The probe
/// set is frozen under `eval_dir`, shared by every variant, so all are judged on the same probes.
pub fn train_and_judge(
    spec: &DownstreamSpec,
    probes: Option<&Path>,
    base: &Base,
    variant: &str,
    admitted: &[Sample],
    out: &Path,
    eval_dir: &Path,
) -> Result<DownstreamResult, DownstreamError> {
    let train_err = |source| DownstreamError::Train {
        variant: variant.to_owned(),
        source,
    };
    let eval_err = |source| DownstreamError::Eval {
        variant: variant.to_owned(),
        source,
    };
    let recipe = &spec.train;
    let mut trainer =
        LoraTrainer::new(&base.model, &base.tok, recipe.clone(), None).map_err(train_err)?;
    let report = trainer.train_cycle(admitted, |_| {}).map_err(train_err)?;
    let adapter = trainer.adapter().map_err(train_err)?;
    let provenance = Provenance {
        delta_id: String::new(),
        base_sha256: base.sha256.clone(),
        recipe_sha256: crate::train::artifact::recipe_sha256(recipe).map_err(train_err)?,
        recipe: recipe.clone(),
        data_digest: report.data_digest.clone(),
        num_samples: admitted.len(),
        parent: None,
        seed: recipe.seed,
        metrics: serde_json::to_value(&report).map_err(|e| train_err(TrainError::Json(e)))?,
        created_at_unix_ms: crate::clock::now_unix_ms(),
    };
    let delta = save_delta(out, &adapter, base.model.config(), provenance).map_err(train_err)?;

    let (probe_set, _) =
        ProbeSet::frozen_for_base(eval_dir, &base.sha256, probes).map_err(eval_err)?;
    let cfg = &spec.gate;
    let personal = personal_probes(admitted, recipe.holdout_fraction, cfg.max_personal_probes);
    let ev = Evaluator::new(&base.model, &base.tok, &probe_set, cfg);
    let baseline = ev.score(None, &personal).map_err(eval_err)?;
    let candidate = ev.score(Some(&adapter), &personal).map_err(eval_err)?;
    let (legs, passed, reason) = decide(cfg, &baseline, &candidate);
    Ok(DownstreamResult {
        variant: variant.to_owned(),
        samples: admitted.len(),
        held_out: report.held_out,
        steps: report.steps,
        first_loss: report.first_loss(),
        last_loss: report.last_loss(),
        delta: delta.path,
        passed,
        reason,
        personal_gain: baseline.personal_nll - candidate.personal_nll,
        legs: legs
            .into_iter()
            .map(|l| LegResult {
                leg: l.name,
                baseline: l.baseline,
                candidate: l.candidate,
                tolerance: l.tolerance,
                passed: l.passed,
            })
            .collect(),
    })
}
