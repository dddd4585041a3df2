//! `trainer`: turns the admitted training set into LoRA deltas over the frozen base.
//!
//! Thin over [`crate::train`]. Samples are buffered; once `min_samples` new ones wait and no cycle
//! is running, a cycle starts on its own thread over every sample received so far, continuing
//! from the served delta (the one the eval gate promoted), or from the base. The engine thread never
//! trains, so curation keeps flowing; a cycle runs in its own pool of `threads` in the idle scheduling
//! class (see [`crate::train::background_pool`]), and `train.step_sleep_ms` pauses between steps, so
//! serving always gets a core first. With `await_verdict`, the next cycle waits for the gate's verdict.
//! A finished delta is recorded in the store as a candidate and sent on `deltas` as soon as it is
//! written. At start the trainer reloads the training set from the store, so a crash or restart
//! loses no training data; drain waits for a running cycle, then trains once more on samples that
//! arrived meanwhile. The model is loaded by the first cycle, so a graph validates and builds
//! without it.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::engine::message::{Delta, Sample};
use crate::engine::{
    Actor, ActorError, ActorFactory, BuildContext, KindInfo, KindParams, Message, MessageType, Outbox, PortSpec,
};
use crate::store::Store;
use crate::model::{LoraSet, Tokenizer, Transformer};
use crate::train::artifact::recipe_sha256;
use crate::train::{LoraTrainer, Provenance, TrainConfig, TrainError, save_delta, sha256_file};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerParams {
    /// The base model (GGUF) the deltas adapt; `None`: the default model (as `serve` resolves it).
    #[serde(default)]
    pub model: Option<String>,
    /// New samples that must wait before a cycle starts.
    #[serde(default = "default_min_samples")]
    pub min_samples: usize,
    /// CPU threads a cycle may use (its own pool, at a lower priority than serving).
    #[serde(default = "default_threads")]
    pub threads: usize,
    /// Start a new cycle only once the eval gate has judged the last delta, so the next cycle continues from
    /// it if it was promoted (rather than racing it from the same parent). Turn off in a graph without a gate.
    #[serde(default = "default_await_verdict")]
    pub await_verdict: bool,
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

fn default_threads() -> usize {
    1
}

fn default_await_verdict() -> bool {
    true
}

/// How often a trainer waiting for a verdict looks in the store.
const VERDICT_POLL: std::time::Duration = std::time::Duration::from_millis(500);

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
            data_dir: ctx.data_dir.clone(),
            checkpoint_dir: ctx.data_dir.join("trainer").join(&ctx.node_id),
            base: Arc::new(Mutex::new(None)),
            seen: Vec::new(),
            seen_ids: HashSet::new(),
            new_since_cycle: 0,
            running: None,
            awaiting: None,
            store: None,
        }))
    }
}

impl KindParams for TrainerParams {
    fn example() -> Self {
        TrainerParams {
            model: Some("models/SmolLM2-135M-Instruct.Q8_0.gguf".to_owned()),
            min_samples: default_min_samples(),
            await_verdict: default_await_verdict(),
            threads: default_threads(),
            out_dir: None,
            train: Box::default(),
        }
    }
}

type CycleResult = Result<Delta, TrainError>;

struct Trainer {
    params: TrainerParams,
    node: String,
    out_dir: PathBuf,
    data_dir: PathBuf,
    /// With `train.checkpoint_every > 0`, a cycle interrupted by a crash resumes from here when
    /// the same samples arrive again.
    checkpoint_dir: PathBuf,
    base: Shared<Base>,
    /// Every sample received, in arrival order: each cycle trains on all of them.
    seen: Vec<Sample>,
    /// Ids in `seen`: a sample both reloaded from the store and sent on the edge counts once.
    seen_ids: HashSet<String>,
    new_since_cycle: usize,
    running: Option<JoinHandle<CycleResult>>,
    /// The last delta sent while `await_verdict` is on, and when the store was last asked about it.
    awaiting: Option<(String, std::time::Instant)>,
    /// Kept open while waiting for verdicts: it is read twice a second.
    store: Option<Store>,
}

fn load_base(params: &TrainerParams, data_dir: &std::path::Path, cell: &Shared<Base>) -> Result<Arc<Base>, TrainError> {
    let mut guard = cell.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = guard.as_ref() {
        return Ok(b.clone());
    }
    let path = crate::serve::model_path(params.model.as_deref(), data_dir)
        .map_err(|e| TrainError::Config(format!("model: {e}")))?;
    let (model, tok) = crate::model::load(&path)?;
    let base = Arc::new(Base {
        model,
        tok,
        sha256: sha256_file(&path)?,
    });
    *guard = Some(base.clone());
    Ok(base)
}

/// The served delta, if the store has one for this base: what a new cycle continues from.
fn served_parent(
    data_dir: &std::path::Path,
    base: &Base,
    train: &TrainConfig,
) -> Result<Option<(String, LoraSet)>, TrainError> {
    if !data_dir.join(Store::FILE_NAME).exists() {
        return Ok(None);
    }
    let store = Store::open(data_dir).map_err(|e| TrainError::Config(e.to_string()))?;
    let served = store.served().map_err(|e| TrainError::Config(e.to_string()))?;
    let Some(id) = served.delta_id else { return Ok(None) };
    let Some(record) = store.delta(&id).map_err(|e| TrainError::Config(e.to_string()))? else {
        return Ok(None);
    };
    if record.base_sha256 != base.sha256 {
        return Ok(None);
    }
    let set = LoraSet::load_peft(&record.path, base.model.config())?;
    if set.config.use_dora != train.dora || set.config.r != train.rank {
        // The recipe changed kind or rank since that delta: a continuation cannot keep both, so start over.
        tracing::info!(delta = %id, "the served delta does not match the recipe (DoRA or rank); training from the base");
        return Ok(None);
    }
    Ok(Some((id, set)))
}

/// Where a cycle writes: deltas and its checkpoint.
struct Dirs {
    out: PathBuf,
    checkpoint: PathBuf,
    /// The data directory: the store and the default model.
    data: PathBuf,
}

fn run_cycle(params: TrainerParams, node: String, dirs: Dirs, cell: Shared<Base>, samples: Vec<Sample>) -> CycleResult {
    let base = load_base(&params, &dirs.data, &cell)?;
    let parent = served_parent(&dirs.data, &base, &params.train)?;
    let mut trainer = LoraTrainer::new(&base.model, &base.tok, (*params.train).clone(), parent.as_ref().map(|p| &p.1))?;
    trainer.set_checkpoint_dir(dirs.checkpoint);
    let total = params.train.steps;
    // A progress bar on a terminal; otherwise one log line per step.
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(total as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} steps {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_prefix(format!("training {node}"));
        bar
    });
    let report = trainer.train_cycle(&samples, |s| {
        metrics::gauge!("hearth_trainer_step", "node" => node.clone()).set(s.step as f64);
        if s.loss.is_finite() {
            metrics::gauge!("hearth_trainer_loss", "node" => node.clone()).set(s.loss);
        }
        match &bar {
            Some(bar) => {
                bar.set_position(s.step as u64 + 1);
                bar.set_message(format!("loss {:.4}", s.loss));
            }
            None => tracing::info!(node = %node, step = s.step + 1, of = total, loss = s.loss, "training"),
        }
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    metrics::gauge!("hearth_trainer_tokens_per_second", "node" => node.clone()).set(report.tokens_per_second);
    metrics::counter!("hearth_trainer_cycles_total", "node" => node.clone()).increment(1);
    let adapter = trainer.adapter()?;
    let provenance = Provenance {
        delta_id: String::new(),
        base_sha256: base.sha256.clone(),
        recipe_sha256: recipe_sha256(&params.train)?,
        recipe: (*params.train).clone(),
        data_digest: report.data_digest.clone(),
        num_samples: samples.len(),
        parent: parent.map(|p| p.0),
        seed: params.train.seed,
        metrics: serde_json::to_value(&report)?,
        created_at_unix_ms: crate::engine::message::now_unix_ms(),
    };
    let delta = save_delta(&dirs.out, &adapter, base.model.config(), provenance.clone())?;
    if dirs.data.join(Store::FILE_NAME).exists() {
        let mut prov = serde_json::to_value(&provenance)?;
        prov["delta_id"] = delta.id.clone().into();
        Store::open(&dirs.data)
            .and_then(|mut s| s.record_delta(&delta, &prov))
            .map_err(|e| TrainError::Config(e.to_string()))?;
    }
    tracing::info!(node = %node, delta = %delta.id, steps = report.steps, "delta trained");
    Ok(delta)
}

impl Trainer {
    /// Sends the finished cycle's delta, if any; with `wait`, waits for a running one.
    fn collect(&mut self, out: &mut Outbox, wait: bool) -> Result<bool, ActorError> {
        let done = self.running.as_ref().is_some_and(|h| h.is_finished());
        if !(done || wait) {
            return Ok(false);
        }
        let Some(handle) = self.running.take() else { return Ok(false) };
        let result = handle
            .join()
            .map_err(|_| ActorError::Failed("training thread panicked".into()))?;
        let delta = result.map_err(|e| ActorError::Failed(format!("training cycle: {e}")))?;
        if self.params.await_verdict {
            self.awaiting = Some((delta.id.clone(), std::time::Instant::now()));
        }
        out.send("deltas", Message::Delta(Arc::new(delta)))
            .map_err(|e| ActorError::Failed(e.to_string()))?;
        Ok(true)
    }

    /// Whether the gate has judged the last delta (always true with `await_verdict` off).
    fn verdict_known(&mut self) -> Result<bool, ActorError> {
        let Some((id, checked)) = &mut self.awaiting else { return Ok(true) };
        if checked.elapsed() < VERDICT_POLL {
            return Ok(false);
        }
        *checked = std::time::Instant::now();
        if self.store.is_none() {
            self.store = Some(Store::open(&self.data_dir).map_err(|e| ActorError::Failed(e.to_string()))?);
        }
        let Some(store) = &self.store else { return Ok(false) };
        let judged = store
            .delta(id)
            .map_err(|e| ActorError::Failed(e.to_string()))?
            .is_some_and(|d| d.verdict.is_some());
        if judged {
            self.awaiting = None;
        }
        Ok(judged)
    }

    fn maybe_start(&mut self) -> Result<(), ActorError> {
        if self.running.is_some() || self.new_since_cycle < self.params.min_samples.max(1) || !self.verdict_known()? {
            return Ok(());
        }
        self.new_since_cycle = 0;
        let dirs = Dirs {
            out: self.out_dir.clone(),
            checkpoint: self.checkpoint_dir.clone(),
            data: self.data_dir.clone(),
        };
        let (params, node, cell, samples) = (self.params.clone(), self.node.clone(), self.base.clone(), self.seen.clone());
        let pool = crate::train::background_pool(self.params.threads).map_err(|e| ActorError::Failed(e.to_string()))?;
        let handle = std::thread::Builder::new()
            .name(format!("trainer-{}", self.node))
            .spawn(move || pool.install(|| run_cycle(params, node, dirs, cell, samples)))?;
        self.running = Some(handle);
        Ok(())
    }

    fn add(&mut self, sample: &Sample) {
        if self.seen_ids.insert(sample.id.clone()) {
            self.seen.push(sample.clone());
            self.new_since_cycle += 1;
        }
    }
}

impl Actor for Trainer {
    fn handle(&mut self, port: &str, message: &Message, out: &mut Outbox) -> Result<(), ActorError> {
        let sample = crate::engine::expect_sample(port, message)?;
        self.add(sample);
        self.collect(out, false)?;
        self.maybe_start()
    }

    /// Reloads the training set the store holds: what earlier runs admitted is trained on again.
    fn on_start(&mut self, _out: &mut Outbox) -> Result<(), ActorError> {
        if !self.data_dir.join(Store::FILE_NAME).exists() {
            return Ok(());
        }
        let store = Store::open(&self.data_dir).map_err(|e| ActorError::Build(e.to_string()))?;
        let set = store.training_set().map_err(|e| ActorError::Failed(e.to_string()))?;
        for s in &set {
            self.add(s);
        }
        if !set.is_empty() {
            tracing::info!(node = %self.node, samples = set.len(), "reloaded the training set from the store");
        }
        Ok(())
    }

    /// Sends a cycle's delta as soon as it is written, and starts the next cycle if data waits.
    fn tick(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.collect(out, false)?;
        self.maybe_start()
    }

    /// Waits for the running cycle, then trains once more if `min_samples` new ones arrived
    /// meanwhile, so a drained graph has trained on everything it was given.
    fn flush(&mut self, out: &mut Outbox) -> Result<(), ActorError> {
        self.collect(out, true)?;
        self.maybe_start()?;
        self.collect(out, true).map(|_| ())
    }
}
