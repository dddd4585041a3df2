//! `eval`: the gate between the trainer and the served model.
//!
//! Thin over [`crate::eval`]. Each candidate delta is scored, with what is served now as the baseline, on the
//! probe set frozen for the base and on the user's held-out curated data; the verdict (bound to the delta's
//! bytes, base, recipe and data digest) goes to the store. A passing delta is promoted in the store and sent on
//! `promoted`, which the graph wires back to `serve.deltas` (a feedback edge) for the hot swap. Every verdict
//! also goes out on `reports`. At start, candidates left without a verdict (a crash mid-judgement) are judged.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::message::{Delta, EvalReport};
use crate::engine::{
    Actor, ActorError, ActorFactory, BuildContext, KindInfo, KindParams, Message, MessageType, Outbox, PortSpec,
};
use crate::eval::{Binding, Evaluator, GateConfig, ProbeSet, Scores, Verdict, adapter_sha256, decide};
use crate::model::{LoraSet, Tokenizer, Transformer};
use crate::store::Store;
use crate::train::Provenance;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalParams {
    /// The base (GGUF) the deltas adapt; `None`: the default model (as `serve` resolves it).
    pub model: Option<String>,
    /// A probe-set JSON file (format of `data/eval/probes.json`); `None`: the shipped set. Frozen per base on
    /// first use under `DATA_DIR/eval/`.
    pub probes: Option<PathBuf>,
    pub gate: GateConfig,
}

static INFO: KindInfo = KindInfo {
    name: "eval",
    about: "the eval gate: promotes a candidate delta only if personalisation improves and no probe leg regresses",
    inputs: &[PortSpec::new("candidates", MessageType::Delta)],
    outputs: &[
        PortSpec::new("promoted", MessageType::Delta),
        PortSpec::new("reports", MessageType::EvalReport),
    ],
    source: false,
};

impl ActorFactory for EvalParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn planted(&self) -> Vec<String> {
        self.gate.canaries.iter().map(|c| c.secret.clone()).collect()
    }

    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Actor>, ActorError> {
        if ctx.worker > 0 {
            return Err(ActorError::Build(format!(
                "node `{}`: one eval gate decides promotions; use `workers: 1`",
                ctx.node_id
            )));
        }
        Ok(Box::new(EvalGate {
            params: self.clone(),
            node: ctx.node_id.clone(),
            data_dir: ctx.data_dir.clone(),
            base: None,
            baseline: None,
            pool: None,
        }))
    }
}

impl KindParams for EvalParams {
    fn example() -> Self {
        EvalParams {
            model: Some("models/SmolLM2-135M-Instruct.Q8_0.gguf".to_owned()),
            ..EvalParams::default()
        }
    }
}

struct Base {
    model: Transformer,
    tok: Tokenizer,
    sha256: String,
}

struct EvalGate {
    params: EvalParams,
    node: String,
    data_dir: PathBuf,
    base: Option<Arc<Base>>,
    /// The served state's scores, keyed by what they were computed on (served delta, personal probes).
    baseline: Option<(String, Scores)>,
    /// Compute threads for scoring, made on first use.
    pool: Option<Arc<rayon::ThreadPool>>,
}

fn failed(e: impl std::fmt::Display) -> ActorError {
    ActorError::Failed(e.to_string())
}

impl EvalGate {
    fn pool(&mut self) -> Result<Arc<rayon::ThreadPool>, ActorError> {
        if let Some(p) = &self.pool {
            return Ok(p.clone());
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("eval-{i}"))
            .build()
            .map_err(failed)?;
        let pool = Arc::new(pool);
        self.pool = Some(pool.clone());
        Ok(pool)
    }

    fn base(&mut self) -> Result<Arc<Base>, ActorError> {
        if let Some(b) = &self.base {
            return Ok(b.clone());
        }
        let path = crate::serve::model_path(self.params.model.as_deref(), &self.data_dir).map_err(failed)?;
        let (model, tok) = crate::model::load(&path).map_err(failed)?;
        let base = Arc::new(Base {
            model,
            tok,
            sha256: crate::train::sha256_file(&path).map_err(failed)?,
        });
        self.base = Some(base.clone());
        Ok(base)
    }

    /// Scores the candidate against the served state and records the verdict; promotes on a pass.
    fn judge(&mut self, delta: &Delta) -> Result<Verdict, ActorError> {
        let base = self.base()?;
        let mut store = Store::open(&self.data_dir).map_err(failed)?;
        let dir = Path::new(&delta.path);
        let prov_path = dir.join("provenance.json");
        let provenance: Provenance = std::fs::read(&prov_path)
            .map_err(|e| failed(format!("{}: {e}", prov_path.display())))
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| failed(format!("{}: {e}", prov_path.display()))))?;
        store
            .record_delta(delta, &serde_json::to_value(&provenance).map_err(failed)?)
            .map_err(failed)?;
        let (probes, probe_sha) =
            ProbeSet::frozen_for_base(&self.data_dir.join("eval"), &base.sha256, self.params.probes.as_deref())
                .map_err(failed)?;
        let adapter_sha = adapter_sha256(dir).map_err(failed)?;
        let served = store.served().map_err(failed)?;
        let served_adapter = match &served.delta_id {
            Some(id) => {
                let r = store.delta(id).map_err(failed)?.ok_or_else(|| failed(format!("served delta `{id}` unknown")))?;
                Some(LoraSet::load_peft(&r.path, base.model.config()).map_err(failed)?)
            }
            None => None,
        };
        let training = store.training_set().map_err(failed)?;
        let cfg = &self.params.gate;
        let personal = crate::eval::personal_probes(&training, provenance.recipe.holdout_fraction, cfg.max_personal_probes);
        let ev = Evaluator::new(&base.model, &base.tok, &probes, cfg);
        let key = format!(
            "{:?}/{}/{probe_sha}",
            served.delta_id,
            crate::train::sha256_hex(serde_json::to_string(&personal).unwrap_or_default().as_bytes())
        );
        let baseline = match &self.baseline {
            Some((k, s)) if *k == key => s.clone(),
            _ => {
                let s = ev.score(served_adapter.as_ref(), &personal).map_err(failed)?;
                self.baseline = Some((key, s.clone()));
                s
            }
        };
        let (legs, promote, reason) = if delta.base_sha256 == base.sha256 {
            let candidate_adapter = LoraSet::load_peft(dir, base.model.config()).map_err(failed)?;
            let candidate = ev.score(Some(&candidate_adapter), &personal).map_err(failed)?;
            let (legs, promote, reason) = decide(cfg, &baseline, &candidate);
            (Some((legs, candidate)), promote, reason)
        } else {
            (None, false, format!("adapts base {}, not the served base {}", delta.base_sha256, base.sha256))
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
            created_at_unix_ms: crate::engine::message::now_unix_ms(),
        };
        let records: Vec<_> = verdict.legs.iter().map(|l| l.record()).collect();
        let verdict_json = serde_json::to_value(&verdict).map_err(failed)?;
        store.record_verdict(&delta.id, &verdict_json, &records, promote).map_err(failed)?;
        if promote && let Err(e) = crate::eval::promote_checked(&mut store, &delta.id, "eval gate") {
            verdict.binding.promote = false;
            verdict.binding.reason = e.to_string();
            let verdict_json = serde_json::to_value(&verdict).map_err(failed)?;
            store.record_verdict(&delta.id, &verdict_json, &records, false).map_err(failed)?;
        }
        let outcome = if verdict.binding.promote { "promoted" } else { "rejected" };
        metrics::counter!("hearth_eval_verdicts_total", "node" => self.node.clone(), "outcome" => outcome).increment(1);
        metrics::gauge!("hearth_eval_personal_gain", "node" => self.node.clone()).set(verdict.personal_gain);
        tracing::info!(
            node = %self.node, delta = %delta.id, outcome, gain = verdict.personal_gain,
            reason = %verdict.binding.reason, "eval verdict"
        );
        Ok(verdict)
    }
}

impl Actor for EvalGate {
    /// Judges every candidate the store holds without a verdict: one trained before a crash, or while no
    /// gate ran. A promotion made here reaches serve through `promoted` like any other.
    fn on_start(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        if !self.data_dir.join(Store::FILE_NAME).exists() {
            return Ok(());
        }
        let pending: Vec<Delta> = Store::open(&self.data_dir)
            .and_then(|s| s.deltas())
            .map_err(failed)?
            .into_iter()
            .filter(|d| d.verdict.is_none() && d.status == crate::store::DeltaStatus::Candidate)
            .map(|d| d.to_delta())
            .collect();
        for delta in pending {
            tracing::info!(node = %self.node, delta = %delta.id, "judging a candidate left without a verdict");
            self.handle("candidates", &Message::Delta(Arc::new(delta)), out)?;
        }
        Ok(())
    }

    fn handle(&mut self, port: &str, message: &Message, out: &mut Outbox) -> Result<(), ActorError> {
        let delta = crate::engine::expect_delta(port, message)?;
        // Inside a pool, candle's rayon ops (and the model's parallel projections) run inline on its threads
        // instead of being handed over from this engine thread op by op.
        let pool = self.pool()?;
        let verdict = pool.install(|| self.judge(delta))?;
        if verdict.binding.promote {
            out.send("promoted", message.clone())?;
        }
        let report = EvalReport {
            delta: (**delta).clone(),
            promoted: verdict.binding.promote,
            legs: serde_json::to_value(&verdict.legs).map_err(failed)?,
        };
        out.send("reports", Message::EvalReport(Arc::new(report)))?;
        Ok(())
    }
}
