//! `dedup`: keeps exact and near-duplicate samples (and over-full near-duplicate clusters) out of training.
//!
//! Thin over [`crate::curate::dedup`]. Samples are compared with samples of the same origin: the model's own
//! answers among themselves, what the user gave (feedback, edits, grounded data) among themselves. A user's
//! thumbs on an answer carries the answer's text but is a judgement of it, not a second copy: compared with
//! the answer, it would always be dropped as its exact duplicate and feedback would never reach training.
//!
//! The two states live in `DATA_DIR/dedup/<node>.state` (grounded) and `<node>.self_generated.state`, loaded
//! at start and saved atomically every [`SAVE_EVERY`] checks and when the node drains, so a restart does not
//! readmit what was seen (a crash may forget at most the last `SAVE_EVERY` checks). One worker only: the
//! state is the node's.

use std::path::PathBuf;
use std::sync::Arc;

use super::{BoxedActor, KindInfo, Outbox, PortSpec};
use crate::curate::dedup::{DedupDecision, Deduper};
use crate::engine::{Actor, ActorError, ActorFactory, BuildContext, Context, KindParams};
use crate::message::{Decision, Origin, Outcome};
use crate::message::{Message, MessageType};

pub use crate::curate::dedup::DedupConfig;

/// Checks between two saves of the state.
pub const SAVE_EVERY: u64 = 256;

static INFO: KindInfo = KindInfo {
    name: "dedup",
    about: "drops exact and near duplicates (MinHash LSH) and enforces a per-cluster diversity floor",
    inputs: &[PortSpec::new("in", MessageType::Sample)],
    outputs: &[
        PortSpec::new("out", MessageType::Sample),
        PortSpec::new("decisions", MessageType::Decision),
    ],
    source: false,
};

impl ActorFactory<Message> for DedupConfig {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<BoxedActor, ActorError> {
        if ctx.worker > 0 {
            return Err(ActorError::build(format!(
                "node `{}`: dedup keeps one state per node; use `workers: 1`",
                ctx.node_id
            )));
        }
        let dir = ctx.data_dir.join("dedup");
        std::fs::create_dir_all(&dir)?;
        let state = |name: String| {
            let path = dir.join(name);
            let deduper = if path.exists() {
                Deduper::load(&path, self.clone())
            } else {
                Deduper::new(self.clone())
            }
            .map_err(|e| ActorError::build_from(path.display().to_string(), e))?;
            Ok::<_, ActorError>((deduper, path))
        };
        Ok(Box::new(Dedup {
            grounded: state(format!("{}.state", ctx.node_id))?,
            own: state(format!("{}.self_generated.state", ctx.node_id))?,
            node: ctx.node_id.clone(),
            unsaved: 0,
        }))
    }
}

impl KindParams<Message> for DedupConfig {
    fn example() -> Self {
        DedupConfig::default()
    }
}

struct Dedup {
    /// Grounded samples (what the user gave), and the model's own answers, each with its state file.
    grounded: (Deduper, PathBuf),
    own: (Deduper, PathBuf),
    node: String,
    unsaved: u64,
}

impl Dedup {
    fn save(&mut self) -> Result<(), ActorError> {
        self.unsaved = 0;
        for (deduper, path) in [&self.grounded, &self.own] {
            deduper.save(path).context(path.display().to_string())?;
        }
        Ok(())
    }
}

impl Actor<Message> for Dedup {
    fn handle(
        &mut self,
        port: &str,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), ActorError> {
        let sample = crate::message::expect_sample(port, message)?;
        let text = sample.content.texts().join("\n");
        // Keyed by the sample id, so a sample replayed after a crash is not its own duplicate.
        let key =
            crate::curate::dedup::minhash::hash_bytes(sample.id.as_bytes(), 0x5a3d_1e00_0000_0001)
                .max(1);
        let deduper = match sample.origin {
            Origin::Grounded => &mut self.grounded.0,
            Origin::SelfGenerated => &mut self.own.0,
        };
        let decision = deduper.check_and_insert_keyed(&text, sample.origin, key);
        self.unsaved += 1;
        if self.unsaved >= SAVE_EVERY {
            self.save()?;
        }
        let reason = match decision {
            DedupDecision::Admit => {
                metrics::counter!("hearth_dedup_decisions_total", "node" => self.node.clone(), "decision" => "admit")
                    .increment(1);
                let mut sample = sample.clone();
                Arc::make_mut(&mut sample).record(&self.node, "admitted", serde_json::Value::Null);
                return out
                    .send("out", Message::Sample(sample))
                    .map_err(ActorError::from);
            }
            DedupDecision::ExactDuplicate { of } => {
                ("exact_duplicate", format!("exact duplicate of #{of}"))
            }
            DedupDecision::NearDuplicate {
                of,
                jaccard_estimate,
            } => (
                "near_duplicate",
                format!("near duplicate of #{of} (Jaccard ≈ {jaccard_estimate:.2})"),
            ),
            DedupDecision::DiversityFloor { cluster } => (
                "diversity_floor",
                format!("cluster #{cluster} is at its diversity floor"),
            ),
        };
        metrics::counter!("hearth_dedup_decisions_total", "node" => self.node.clone(), "decision" => reason.0)
            .increment(1);
        let mut sample = Arc::unwrap_or_clone(sample.clone());
        sample.record(&self.node, reason.0, serde_json::Value::Null);
        let decision = Decision {
            sample,
            node: self.node.clone(),
            outcome: Outcome::Dropped,
            reason: format!("dedup: {}", reason.1),
        };
        out.send("decisions", Message::Decision(Arc::new(decision)))
            .map_err(ActorError::from)
    }

    fn flush(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        self.save()
    }
}
