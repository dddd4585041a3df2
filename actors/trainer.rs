//! `trainer`: turns the admitted training set into LoRA deltas over the frozen base.
//!
//! Thin over [`crate::train`]. Samples are buffered; once `min_samples` new ones wait and no cycle
//! is running, a cycle starts on its own thread over every sample received so far, continuing
//! from the previous delta (its parent). The engine thread never trains, so curation keeps
//! flowing; `train.step_sleep_ms` yields the CPU to serving between steps. A finished delta is
//! sent on `deltas` with the next sample, or when the node drains (which waits for a running
//! cycle, then trains once more on samples that arrived meanwhile). The model is loaded by the first cycle, so a graph validates and builds without it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::engine::message::{Delta, Sample};
use crate::engine::{
    Actor, ActorError, ActorFactory, BuildContext, KindInfo, KindParams, Message, MessageType, Outbox, PortSpec,
};
use crate::model::{LoraSet, Tokenizer, Transformer};
use crate::train::artifact::recipe_sha256;
use crate::train::{LoraTrainer, Provenance, TrainConfig, TrainError, data_digest, save_delta, sha256_file};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerParams {
    /// The base model (GGUF) the deltas adapt.
    pub model: PathBuf,
    /// New samples that must wait before a cycle starts.
    #[serde(default = "default_min_samples")]
    pub min_samples: usize,
    /// Where deltas are written; `DATA_DIR/deltas` by default.
    #[serde(default)]
    pub out_dir: Option<PathBuf>,
    /// Boxed: the recipe is large next to other kinds' parameters.
    #[serde(default)]
    pub train: Box<TrainConfig>,
}

fn default_min_samples() -> usize {
    32
}

static INFO: KindInfo = KindInfo {
    name: "trainer",
    about: "trains LoRA deltas (SFT, DPO, KTO, GRPO, with replay) on the admitted samples over the frozen base",
    inputs: &[PortSpec::new("samples", MessageType::Sample)],
    outputs: &[PortSpec::new("deltas", MessageType::Delta)],
    source: false,
};

/// The base, loaded once by the first cycle and shared by later ones.
struct Base {
    model: Transformer,
    tok: Tokenizer,
    sha256: String,
}

type Shared<T> = Arc<Mutex<Option<Arc<T>>>>;

impl ActorFactory for TrainerParams {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Actor>, ActorError> {
        if ctx.worker > 0 {
            return Err(ActorError::Build(format!(
                "node `{}`: trainer keeps one adapter per node; use `workers: 1`",
                ctx.node_id
            )));
        }
        self.train.validate().map_err(|e| ActorError::Build(e.to_string()))?;
        Ok(Box::new(Trainer {
            params: self.clone(),
            node: ctx.node_id.clone(),
            out_dir: self.out_dir.clone().unwrap_or_else(|| ctx.data_dir.join("deltas")),
            checkpoint_dir: ctx.data_dir.join("trainer").join(&ctx.node_id),
            base: Arc::new(Mutex::new(None)),
            seen: Vec::new(),
            new_since_cycle: 0,
            parent: None,
            running: None,
        }))
    }
}

impl KindParams for TrainerParams {
    fn example() -> Self {
        TrainerParams {
            model: PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            min_samples: default_min_samples(),
            out_dir: None,
            train: Box::default(),
        }
    }
}

type CycleResult = Result<(Delta, Arc<LoraSet>), TrainError>;

struct Trainer {
    params: TrainerParams,
    node: String,
    out_dir: PathBuf,
    /// With `train.checkpoint_every > 0`, a cycle interrupted by a crash resumes from here when
    /// the same samples arrive again.
    checkpoint_dir: PathBuf,
    base: Shared<Base>,
    /// Every sample received, in arrival order: each cycle trains on all of them.
    seen: Vec<Sample>,
    new_since_cycle: usize,
    parent: Option<(String, Arc<LoraSet>)>,
    running: Option<JoinHandle<CycleResult>>,
}

fn load_base(params: &TrainerParams, cell: &Shared<Base>) -> Result<Arc<Base>, TrainError> {
    let mut guard = cell.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = guard.as_ref() {
        return Ok(b.clone());
    }
    let (model, tok) = crate::model::load(&params.model)?;
    let base = Arc::new(Base {
        model,
        tok,
        sha256: sha256_file(&params.model)?,
    });
    *guard = Some(base.clone());
    Ok(base)
}

/// Where a cycle writes: deltas and its checkpoint.
struct Dirs {
    out: PathBuf,
    checkpoint: PathBuf,
}

fn run_cycle(
    params: TrainerParams,
    node: String,
    dirs: Dirs,
    cell: Shared<Base>,
    samples: Vec<Sample>,
    parent: Option<(String, Arc<LoraSet>)>,
) -> CycleResult {
    let base = load_base(&params, &cell)?;
    let mut trainer = LoraTrainer::new(&base.model, &base.tok, (*params.train).clone(), parent.as_ref().map(|p| &*p.1))?;
    trainer.set_checkpoint_dir(dirs.checkpoint);
    let report = trainer.train_cycle(&samples, |s| {
        metrics::gauge!("hearth_trainer_step", "node" => node.clone()).set(s.step as f64);
        if s.loss.is_finite() {
            metrics::gauge!("hearth_trainer_loss", "node" => node.clone()).set(s.loss);
        }
    })?;
    metrics::gauge!("hearth_trainer_tokens_per_second", "node" => node.clone()).set(report.tokens_per_second);
    let adapter = trainer.adapter()?;
    let provenance = Provenance {
        delta_id: String::new(),
        base_sha256: base.sha256.clone(),
        recipe_sha256: recipe_sha256(&params.train)?,
        recipe: (*params.train).clone(),
        data_digest: data_digest(&samples),
        num_samples: samples.len(),
        parent: parent.map(|p| p.0),
        seed: params.train.seed,
        metrics: serde_json::to_value(&report)?,
        created_at_unix_ms: crate::engine::message::now_unix_ms(),
    };
    let delta = save_delta(&dirs.out, &adapter, base.model.config(), provenance)?;
    tracing::info!(node = %node, delta = %delta.id, steps = report.steps, "delta trained");
    Ok((delta, Arc::new(adapter)))
}

impl Trainer {
    /// Sends the finished cycle's delta, if any; with `wait`, waits for a running one.
    fn collect(&mut self, out: &mut Outbox, wait: bool) -> Result<(), ActorError> {
        let done = self.running.as_ref().is_some_and(|h| h.is_finished());
        if !(done || wait) {
            return Ok(());
        }
        let Some(handle) = self.running.take() else { return Ok(()) };
        let result = handle
            .join()
            .map_err(|_| ActorError::Failed("training thread panicked".into()))?;
        let (delta, adapter) = result.map_err(|e| ActorError::Failed(format!("training cycle: {e}")))?;
        self.parent = Some((delta.id.clone(), adapter));
        out.send("deltas", Message::Delta(Arc::new(delta)))
            .map_err(|e| ActorError::Failed(e.to_string()))
    }

    fn maybe_start(&mut self) -> Result<(), ActorError> {
        if self.running.is_some() || self.new_since_cycle < self.params.min_samples.max(1) {
            return Ok(());
        }
        self.new_since_cycle = 0;
        let dirs = Dirs {
            out: self.out_dir.clone(),
            checkpoint: self.checkpoint_dir.clone(),
        };
        let (params, node, cell, samples, parent) = (
            self.params.clone(),
            self.node.clone(),
            self.base.clone(),
            self.seen.clone(),
            self.parent.clone(),
        );
        let handle = std::thread::Builder::new()
            .name(format!("trainer-{}", self.node))
            .spawn(move || run_cycle(params, node, dirs, cell, samples, parent))?;
        self.running = Some(handle);
        Ok(())
    }
}

impl Actor for Trainer {
    fn handle(&mut self, port: &str, message: &Message, out: &mut Outbox) -> Result<(), ActorError> {
        let Message::Sample(sample) = message else {
            return Err(ActorError::Unexpected {
                port: port.to_owned(),
                got: message.message_type(),
            });
        };
        self.seen.push((**sample).clone());
        self.new_since_cycle += 1;
        self.collect(out, false)?;
        self.maybe_start()
    }

    /// Waits for the running cycle, then trains once more if `min_samples` new ones arrived
    /// meanwhile, so a drained graph has trained on everything it was given.
    fn flush(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.collect(out, true)?;
        self.maybe_start()?;
        self.collect(out, true)
    }
}
