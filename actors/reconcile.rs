//! `reconcile`: route or merge the deltas users are served.
//!
//! Glue over [`crate::train::reconcile::reconcile`]. Wired after the eval gate (`eval.promoted ->
//! reconcile.deltas`): each time a user's own delta is promoted, the deltas served on users' own chains are
//! measured pairwise; the groups that agree are merged into candidates the same gate judges (a merge is served
//! to its members only if it passes) and the rest stay routed. Each decision is recorded in the store
//! (`reconciliations`); serve follows the store, so nothing is sent on.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, Context, KindParams};
use crate::eval::GateConfig;
use crate::message::{Message, MessageType};
use crate::model::BaseCache;
use crate::store::Store;
use crate::train::reconcile::{GateSettings, ReconcileOptions, reconcile};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileParams {
    /// The base (GGUF) the deltas adapt; `None`: the default model (as `serve` resolves it).
    pub model: Option<String>,
    /// How the base's weights are held (see [`crate::model::Requantize`]); as the serve, trainer and eval
    /// nodes that load the same `model` hold it, which the graph check enforces.
    pub requantize: crate::model::Requantize,
    /// The probe-set file the gate judging merged deltas reads (as the eval node's `probes`).
    pub probes: Option<std::path::PathBuf>,
    /// The gate's settings for merged deltas (as the eval node's `gate`).
    pub gate: GateConfig,
    /// Thresholds, merge method and rank, which users, dry run.
    pub options: ReconcileOptions,
}

static INFO: KindInfo = KindInfo {
    name: "reconcile",
    about: "route or merge: merges users' deltas that agree into candidates the eval gate judges, keeps conflicting ones routed",
    inputs: &[PortSpec::new("deltas", MessageType::Delta)],
    outputs: &[],
    source: false,
};

impl ActorFactory<Message> for ReconcileParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        if ctx.worker > 0 {
            return Err(ActorError::build(format!(
                "node `{}`: one reconcile node decides merges; use `workers: 1`",
                ctx.node_id
            )));
        }
        Ok(Box::new(ReconcileActor {
            params: self.clone(),
            ctx: ctx.clone(),
        }))
    }
}

impl KindParams<Message> for ReconcileParams {
    fn example() -> Self {
        ReconcileParams {
            model: Some("models/SmolLM2-135M-Instruct.Q8_0.gguf".to_owned()),
            ..ReconcileParams::default()
        }
    }
}

struct ReconcileActor {
    params: ReconcileParams,
    ctx: BuildContext,
}

impl Actor<Message> for ReconcileActor {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        _out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let delta = crate::message::expect_delta(port, message)?;
        let data_dir = &self.ctx.data_dir;
        // Only a user's own delta changes what there is to merge; a common one (or a merge) does not.
        let own = Store::open(data_dir)
            .and_then(|s| s.delta(&delta.id))
            .context("read the promoted delta")?
            .is_some_and(|r| r.user.is_some());
        if !own {
            return Ok(());
        }
        let path = crate::serve::model_path(self.params.model.as_deref(), data_dir)
            .context("resolve the base model")?;
        let base = self
            .ctx
            .resources
            .get::<BaseCache>()
            .get_with(&path, self.params.requantize)
            .context("load the base model")?;
        let settings = GateSettings {
            probes: self.params.probes.clone(),
            cfg: self.params.gate.clone(),
        };
        let rec = reconcile(data_dir, Arc::clone(&base), settings, &self.params.options)
            .with_context(|| format!("reconcile after delta `{}`", delta.id))?;
        crate::malloc::release_free_memory();
        for line in rec.lines() {
            tracing::info!(node = %self.ctx.node_id, "{line}");
        }
        Ok(())
    }
}
