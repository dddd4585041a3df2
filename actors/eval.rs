//! `eval`: the gate between the trainer and the served model.
//!
//! Glue over [`crate::eval::Gate`]. Each candidate delta is judged against what is served now; a passing
//! delta is promoted in the store and sent on `promoted`, which the graph wires back to `serve.deltas` (a
//! feedback edge) for the hot swap. Every verdict also goes out on `reports`. At start, candidates left
//! without a verdict (a crash mid-judgement) are judged. After each verdict, and at start, deltas outside
//! `retention` are deleted (see [`crate::store::Store::prune_deltas`]).

use std::path::Path;
use std::sync::Arc;

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, Context, KindParams};
use crate::eval::{Gate, Verdict};
use crate::message::{Delta, EvalReport, Message, MessageType};
use crate::model::{Base, BaseCache};
use crate::store::Store;

/// The node's parameters: the gate's settings.
pub use crate::eval::gate::EvalSettings as EvalParams;

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

impl ActorFactory<Message> for EvalParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn planted(&self) -> Vec<String> {
        self.gate
            .canaries
            .iter()
            .map(|c| c.secret.clone())
            .collect()
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        if ctx.worker > 0 {
            return Err(ActorError::build(format!(
                "node `{}`: one eval gate decides promotions; use `workers: 1`",
                ctx.node_id
            )));
        }
        if self.retention.keep_served == Some(0) {
            return Err(ActorError::build(
                "retention.keep_served must be at least 1: the served state is always kept",
            ));
        }
        Ok(Box::new(EvalActor {
            params: self.clone(),
            ctx: ctx.clone(),
            gate: None,
            pool: None,
        }))
    }
}

impl EvalParams {
    /// The base the gate judges over: `model` held as `requantize` says, from the graph's shared cache, so that
    /// a serve node and a trainer naming the same `model` and `requantize` use the very same weights.
    pub fn base(&self, data_dir: &Path, bases: &BaseCache) -> Result<Arc<Base>, ActorError> {
        let path = crate::serve::model_path(self.model.as_deref(), data_dir)
            .context("resolve the base model")?;
        bases
            .get_with(&path, self.requantize)
            .context("load the base model")
    }
}

impl KindParams<Message> for EvalParams {
    fn example() -> Self {
        EvalParams {
            model: Some("models/SmolLM2-135M-Instruct.Q8_0.gguf".to_owned()),
            ..EvalParams::default()
        }
    }
}

struct EvalActor {
    params: EvalParams,
    ctx: BuildContext,
    /// Made on first use, so a graph validates and builds without the model.
    gate: Option<Gate>,
    /// Compute threads for scoring, made on first use.
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl EvalActor {
    /// Deletes the deltas outside `retention` (finishing any deletion a crash interrupted).
    fn prune(&self) -> Result<(), ActorError> {
        if !self.ctx.data_dir.join(Store::FILE_NAME).exists() {
            return Ok(());
        }
        let pruned = Store::open(&self.ctx.data_dir)
            .and_then(|mut s| s.prune_deltas(&self.params.retention))
            // The candidate just judged is not at fault: nothing to dead-letter.
            .map_err(|e| ActorError::background("prune deltas", e))?;
        if !pruned.deltas.is_empty() {
            tracing::info!(node = %self.ctx.node_id, deltas = ?pruned.deltas, "pruned deltas outside retention");
            metrics::counter!("hearth_eval_pruned_deltas_total", "node" => self.ctx.node_id.clone())
                .increment(pruned.deltas.len() as u64);
        }
        Ok(())
    }

    fn judge(&mut self, delta: &Delta) -> Result<Verdict, ActorError> {
        if self.pool.is_none() {
            let pool = rayon::ThreadPoolBuilder::new()
                .thread_name(|i| format!("eval-{i}"))
                .build()
                .context("start the scoring threads")?;
            self.pool = Some(Arc::new(pool));
        }
        if self.gate.is_none() {
            let base = self
                .params
                .base(&self.ctx.data_dir, &self.ctx.resources.get::<BaseCache>())?;
            let p = &self.params;
            self.gate = Some(
                Gate::new(base, &self.ctx.data_dir, p.probes.clone(), p.gate.clone())
                    .with_device(p.device),
            );
        }
        let (Some(pool), Some(gate)) = (&self.pool, &mut self.gate) else {
            unreachable!("both made above")
        };
        // Inside a pool, candle's rayon ops run inline on its threads instead of being handed over op by op.
        let verdict = pool.install(|| gate.judge(delta));
        crate::malloc::release_free_memory();
        let verdict = verdict.with_context(|| format!("judge delta `{}`", delta.id))?;
        let outcome = if verdict.binding.promote {
            "promoted"
        } else {
            "rejected"
        };
        let node = self.ctx.node_id.clone();
        metrics::counter!("hearth_eval_verdicts_total", "node" => node.clone(), "outcome" => outcome).increment(1);
        metrics::gauge!("hearth_eval_personal_gain", "node" => node.clone())
            .set(verdict.personal_gain);
        tracing::info!(
            node = %node, delta = %delta.id, outcome, gain = verdict.personal_gain,
            reason = %verdict.binding.reason, "eval verdict"
        );
        Ok(verdict)
    }
}

impl Actor<Message> for EvalActor {
    /// Judges every candidate the store holds without a verdict. A promotion made here reaches serve through
    /// `promoted` like any other.
    fn on_start(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.prune()?;
        for delta in
            Gate::pending(&self.ctx.data_dir).context("list candidates without a verdict")?
        {
            tracing::info!(node = %self.ctx.node_id, delta = %delta.id, "judging a candidate left without a verdict");
            self.handle("candidates", &Message::Delta(Arc::new(delta)), out)?;
        }
        Ok(())
    }

    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let delta = crate::message::expect_delta(port, message)?;
        let verdict = self.judge(delta)?;
        if verdict.binding.promote {
            out.send("promoted", message.clone())?;
        }
        let report = EvalReport {
            delta: (**delta).clone(),
            promoted: verdict.binding.promote,
            legs: serde_json::to_value(&verdict.legs).context("encode the verdict's legs")?,
        };
        out.send("reports", Message::EvalReport(Arc::new(report)))?;
        self.prune()
    }
}
