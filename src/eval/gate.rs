//! The gate as one object: judge a candidate delta against what is served now, record the verdict bound
//! to the delta's bytes, base, recipe and data, and promote it when it passes. Usable without the engine
//! (an experiment, a test); the `eval` actor is glue over it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    Binding, EvalError, Evaluator, GateConfig, ProbeSet, Result, Scores, Verdict, adapter_sha256,
    decide, personal_probes, promote_checked,
};
use crate::message::Delta;
use crate::model::{Base, LoraSet};
use crate::store::{DeltaStatus, Store};
use crate::train::Provenance;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSettings {
    /// The base (GGUF) the deltas adapt; `None`: the default model (as `serve` resolves it).
    pub model: Option<String>,
    /// How the base's weights are held in memory (see [`crate::model::Requantize`]). Every node that loads the
    /// same `model` names the same, so that what is judged is what is served: a graph that differs is refused.
    pub requantize: crate::model::Requantize,
    /// A probe-set JSON file (format of `data/eval/probes.json`); `None`: the shipped set. Frozen per base on
    /// first use under `DATA_DIR/eval/`.
    pub probes: Option<PathBuf>,
    pub gate: GateConfig,
    /// Which deltas are kept once judged; the gate prunes the rest after each verdict and at start.
    pub retention: crate::store::DeltaRetention,
    /// Where the legs' greedy answers are generated (`cpu`, `cuda:N`, `rocm:N`, `auto`, `emulated`): name the
    /// serve node's device, so that what is judged is what is served.
    pub device: crate::gpu::Device,
}

pub struct Gate {
    base: Arc<Base>,
    data_dir: PathBuf,
    /// A probe-set file; `None`: the shipped set. Frozen per base on first use under `DATA_DIR/eval/`.
    probes: Option<PathBuf>,
    cfg: GateConfig,
    /// The served state's scores, keyed by what they were computed on (served delta, probes).
    baseline: Option<(String, Scores)>,
    gpu: Option<std::sync::Mutex<crate::model::GpuDecoder>>,
    /// The likelihood legs' forward, over the decoder's copy of the weights.
    scorer: Option<std::sync::Mutex<crate::model::GpuTrainer>>,
}

impl Gate {
    pub fn new(base: Arc<Base>, data_dir: &Path, probes: Option<PathBuf>, cfg: GateConfig) -> Self {
        Gate {
            base,
            data_dir: data_dir.to_path_buf(),
            probes,
            cfg,
            baseline: None,
            gpu: None,
            scorer: None,
        }
    }

    /// Generates the legs' greedy answers and computes their likelihoods on `device`; where it does not open
    /// (or does not cover the base), on the CPU, with the reason in the log.
    pub fn with_device(mut self, device: crate::gpu::Device) -> Self {
        let (gpu, status) = crate::model::GpuDecoder::open(device, &self.base.model);
        if let Some(notice) = &status.notice {
            tracing::warn!("gate: {notice}");
        }
        self.scorer = gpu.as_ref().and_then(|d| {
            crate::model::GpuTrainer::new(d.model().clone())
                .inspect_err(|e| tracing::warn!("gate: likelihoods on the CPU: {e}"))
                .ok()
                .map(std::sync::Mutex::new)
        });
        self.gpu = gpu.map(std::sync::Mutex::new);
        self
    }

    /// Candidates the store holds without a verdict: trained before a crash, or while no gate ran.
    pub fn pending(data_dir: &Path) -> Result<Vec<Delta>> {
        if !data_dir.join(Store::FILE_NAME).exists() {
            return Ok(Vec::new());
        }
        Ok(Store::open(data_dir)?
            .deltas()?
            .into_iter()
            .filter(|d| d.verdict.is_none() && d.status == DeltaStatus::Candidate)
            .map(|d| d.to_delta())
            .collect())
    }

    /// Scores the candidate against the served state, records the verdict and promotes on a pass. A user's
    /// own delta is judged against what that user is served now, on that user's held-out data, and promoted on
    /// their chain alone. A merged delta (`members` in its provenance) is judged against the common state on
    /// its members' held-out data, with one more leg per member that must show that member's own gain, and
    /// promoted on each member's chain.
    pub fn judge(&mut self, delta: &Delta) -> Result<Verdict> {
        let base = self.base.clone();
        let mut store = Store::open(&self.data_dir)?;
        let dir = Path::new(&delta.path);
        let provenance = read_provenance(&dir.join("provenance.json"))?;
        let user = crate::train::artifact::delta_user(dir)?;
        // As written, with what the struct does not hold (`user`, `trained_on`, `members`).
        let recorded = read_json(&dir.join("provenance.json"))?;
        store.record_delta(delta, &recorded)?;
        let members = store
            .delta(&delta.id)?
            .map(|r| r.members())
            .unwrap_or_default();
        let (probes, probe_sha) = ProbeSet::frozen_for_base(
            &self.data_dir.join("eval"),
            &base.sha256,
            self.probes.as_deref(),
        )?;
        let adapter_sha = adapter_sha256(dir)?;
        // A merged delta is judged against what its members fall back to without deltas of their own: the
        // common state.
        let served = match &user {
            Some(u) if members.is_empty() => store.served_for(u)?,
            _ => store.served()?,
        };
        let served_adapter = match &served.delta_id {
            Some(id) => {
                let r = store.delta(id)?.ok_or_else(|| EvalError::Binding {
                    delta: id.clone(),
                    why: "the served delta is not in the store".into(),
                })?;
                Some(LoraSet::load_peft(&r.path, base.model.config())?)
            }
            None => None,
        };
        let mut training = store.training_set()?;
        if let Some(u) = &user {
            training.retain(|s| s.user == *u);
        }
        if !members.is_empty() {
            training.retain(|s| members.contains(&s.user));
        }
        let cfg = &self.cfg;
        let personal = personal_probes(
            &training,
            provenance.recipe.holdout_fraction,
            cfg.max_personal_probes,
        );
        let ev = Evaluator::new(&base.model, &base.tok, &probes, cfg)
            .with_gpu(self.gpu.as_ref())
            .with_scorer(self.scorer.as_ref());
        let key = format!(
            "{:?}/{}/{probe_sha}",
            served.delta_id,
            crate::files::sha256_hex(serde_json::to_string(&personal)?.as_bytes())
        );
        let baseline = match &self.baseline {
            Some((k, s)) if *k == key => s.clone(),
            _ => {
                let s = ev.score(served_adapter.as_ref(), &personal)?;
                self.baseline = Some((key, s.clone()));
                s
            }
        };
        let (legs, promote, reason) = if delta.base_sha256 == base.sha256 {
            let candidate_adapter = LoraSet::load_peft(dir, base.model.config())?;
            let candidate = ev.score(Some(&candidate_adapter), &personal)?;
            let (mut legs, mut promote, mut reason) = decide(cfg, &baseline, &candidate);
            // A merged delta must keep each member's gain, not only the pooled one.
            for m in &members {
                let own: Vec<_> = training.iter().filter(|s| s.user == *m).cloned().collect();
                let probes = personal_probes(
                    &own,
                    provenance.recipe.holdout_fraction,
                    cfg.max_personal_probes,
                );
                let (before, n) = ev.personal_nll(served_adapter.as_ref(), &probes)?;
                let (after, _) = ev.personal_nll(Some(&candidate_adapter), &probes)?;
                let gain = before - after;
                let passed = n > 0 && gain.is_finite() && gain > cfg.min_personal_gain;
                if promote && !passed {
                    promote = false;
                    reason = format!("member `{m}` loses their gain ({gain:+.4} on {n} probes)");
                }
                legs.push(super::Leg {
                    name: format!("personalisation:{m}"),
                    baseline: before,
                    candidate: after,
                    tolerance: cfg.min_personal_gain,
                    passed,
                    note: format!(
                        "member `{m}`: answer NLL per token on {n} held-out probes; gain {gain:+.4}"
                    ),
                });
            }
            (Some((legs, candidate)), promote, reason)
        } else {
            let reason = format!(
                "adapts base {}, not the served base {}",
                delta.base_sha256, base.sha256
            );
            (None, false, reason)
        };
        let (legs, candidate) = legs.unwrap_or_default();
        let mut verdict = Verdict {
            binding: Binding {
                delta_id: delta.id.clone(),
                adapter_sha256: adapter_sha,
                base_sha256: base.sha256.clone(),
                recipe_sha256: provenance.recipe_sha256.clone(),
                data_digest: provenance.data_digest.clone(),
                probe_set_sha256: probe_sha,
                promote,
                reason,
            },
            against: served.delta_id.clone(),
            personal_gain: baseline.personal_nll - candidate.personal_nll,
            legs,
            baseline,
            candidate,
            created_at_unix_ms: crate::clock::now_unix_ms(),
        };
        let records: Vec<_> = verdict.legs.iter().map(|l| l.record()).collect();
        store.record_verdict(
            &delta.id,
            &serde_json::to_value(&verdict)?,
            &records,
            promote,
        )?;
        if promote && let Err(e) = promote_checked(&mut store, &delta.id, "eval gate") {
            verdict.binding.promote = false;
            verdict.binding.reason = e.to_string();
            store.record_verdict(&delta.id, &serde_json::to_value(&verdict)?, &records, false)?;
        }
        Ok(verdict)
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = std::fs::read(path).map_err(|source| EvalError::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| EvalError::Provenance {
        path: path.display().to_string(),
        source,
    })
}

fn read_provenance(path: &Path) -> Result<Provenance> {
    let bytes = std::fs::read(path).map_err(|source| EvalError::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| EvalError::Provenance {
        path: path.display().to_string(),
        source,
    })
}
