//! Training cycles as a background process: samples are buffered; once enough new ones wait (and, with
//! `await_verdict`, the gate has judged the last delta), a cycle trains on every sample so far on its own
//! thread, continuing from the served delta, and publishes a delta. Usable without the engine; the
//! `trainer` actor is glue over [`Cycles`].

use std::collections::HashSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

use super::artifact::recipe_sha256;
use super::{LoraTrainer, Provenance, Result, StepReport, TrainConfig, TrainError, save_delta};
use crate::message::{Delta, Sample};
use crate::model::{Base, LoraSet};
use crate::store::Store;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerSettings {
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

impl TrainerSettings {
    /// The cycles' settings for a trainer named `name` over the data directory `data_dir`.
    pub fn cycle_settings(&self, name: &str, data_dir: &Path) -> CycleSettings {
        CycleSettings {
            name: name.to_owned(),
            recipe: (*self.train).clone(),
            min_samples: self.min_samples,
            threads: self.threads,
            await_verdict: self.await_verdict,
            data_dir: data_dir.to_path_buf(),
            out_dir: self
                .out_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("deltas")),
            checkpoint_dir: data_dir.join("trainer").join(name),
        }
    }
}

impl Default for TrainerSettings {
    fn default() -> Self {
        TrainerSettings {
            model: None,
            min_samples: default_min_samples(),
            await_verdict: default_await_verdict(),
            threads: default_threads(),
            out_dir: None,
            train: Box::default(),
        }
    }
}

/// How often a cycle waiting for a verdict looks in the store.
const VERDICT_POLL: Duration = Duration::from_millis(500);

/// Finds the base a cycle trains over; called on the cycle's thread, so a graph builds without the model.
pub type BaseSource = Arc<dyn Fn() -> Result<Arc<Base>> + Send + Sync>;

/// What the cycles of one trainer share.
#[derive(Clone)]
pub struct CycleSettings {
    /// A node name for logs and metrics.
    pub name: String,
    pub recipe: TrainConfig,
    /// New samples that must wait before a cycle starts.
    pub min_samples: usize,
    /// CPU threads a cycle may use (see [`super::background_pool`]).
    pub threads: usize,
    /// Start a cycle only once the gate has judged the last delta.
    pub await_verdict: bool,
    /// The store and the default model.
    pub data_dir: PathBuf,
    /// Where deltas are written.
    pub out_dir: PathBuf,
    /// With `recipe.checkpoint_every > 0`, an interrupted cycle resumes from here.
    pub checkpoint_dir: PathBuf,
}

pub struct Cycles {
    settings: CycleSettings,
    base: BaseSource,
    /// Every sample received, in arrival order: each cycle trains on all of them.
    seen: Vec<Sample>,
    /// Ids in `seen`: a sample both reloaded from the store and received again counts once.
    seen_ids: HashSet<String>,
    new_since_cycle: usize,
    running: Option<JoinHandle<Result<Delta>>>,
    /// The last delta published while `await_verdict` is on, and when the store was last asked about it.
    awaiting: Option<(String, Instant)>,
    /// Kept open while waiting for verdicts: it is read twice a second.
    store: Option<Store>,
}

impl Cycles {
    pub fn new(settings: CycleSettings, base: BaseSource) -> Self {
        Cycles {
            settings,
            base,
            seen: Vec::new(),
            seen_ids: HashSet::new(),
            new_since_cycle: 0,
            running: None,
            awaiting: None,
            store: None,
        }
    }

    /// Adds a sample (once per id).
    pub fn add(&mut self, sample: &Sample) {
        if self.seen_ids.insert(sample.id.clone()) {
            self.seen.push(sample.clone());
            self.new_since_cycle += 1;
        }
    }

    /// Adds the training set the store holds, so what earlier runs admitted is trained on again.
    pub fn reload(&mut self) -> Result<usize> {
        if !self.settings.data_dir.join(Store::FILE_NAME).exists() {
            return Ok(0);
        }
        let set = Store::open(&self.settings.data_dir)?.training_set()?;
        for s in &set {
            self.add(s);
        }
        Ok(set.len())
    }

    /// The finished cycle's delta, if any; with `wait`, waits for a running one.
    pub fn finished(&mut self, wait: bool) -> Result<Option<Delta>> {
        let done = self.running.as_ref().is_some_and(|h| h.is_finished());
        if !(done || wait) {
            return Ok(None);
        }
        let Some(handle) = self.running.take() else {
            return Ok(None);
        };
        let delta = handle.join().map_err(|_| TrainError::Panicked)??;
        if self.settings.await_verdict {
            self.awaiting = Some((delta.id.clone(), Instant::now()));
        }
        Ok(Some(delta))
    }

    /// Starts a cycle on its own thread when enough new samples wait, none runs, and the last verdict is in.
    pub fn maybe_start(&mut self) -> Result<()> {
        if self.running.is_some()
            || self.new_since_cycle < self.settings.min_samples.max(1)
            || !self.verdict_known()?
        {
            return Ok(());
        }
        self.new_since_cycle = 0;
        let (settings, base, samples) =
            (self.settings.clone(), self.base.clone(), self.seen.clone());
        let pool = super::background_pool(settings.threads)?;
        let handle = std::thread::Builder::new()
            .name(format!("trainer-{}", settings.name))
            .spawn(move || pool.install(|| run(&settings, &*base()?, &samples)))
            .map_err(|e| TrainError::Io {
                path: "trainer thread".to_owned(),
                source: e,
            })?;
        self.running = Some(handle);
        Ok(())
    }

    /// Whether the gate has judged the last delta (always true with `await_verdict` off).
    fn verdict_known(&mut self) -> Result<bool> {
        let Some((id, checked)) = &mut self.awaiting else {
            return Ok(true);
        };
        if checked.elapsed() < VERDICT_POLL {
            return Ok(false);
        }
        *checked = Instant::now();
        if self.store.is_none() {
            self.store = Some(Store::open(&self.settings.data_dir)?);
        }
        let Some(store) = &self.store else {
            return Ok(false);
        };
        let judged = store.delta(id)?.is_some_and(|d| d.verdict.is_some());
        if judged {
            self.awaiting = None;
        }
        Ok(judged)
    }
}

/// The served delta, if the store has one for this base: what a new cycle continues from.
pub fn served_parent(
    data_dir: &Path,
    base: &Base,
    recipe: &TrainConfig,
) -> Result<Option<(String, LoraSet)>> {
    if !data_dir.join(Store::FILE_NAME).exists() {
        return Ok(None);
    }
    let store = Store::open(data_dir)?;
    let Some(id) = store.served()?.delta_id else {
        return Ok(None);
    };
    let Some(record) = store.delta(&id)? else {
        return Ok(None);
    };
    if record.base_sha256 != base.sha256 {
        return Ok(None);
    }
    let set = LoraSet::load_peft(&record.path, base.model.config())?;
    if set.config.use_dora != recipe.dora || set.config.r != recipe.rank {
        // The recipe changed kind or rank since that delta: a continuation cannot keep both, so start over.
        tracing::info!(delta = %id, "the served delta does not match the recipe (DoRA or rank); training from the base");
        return Ok(None);
    }
    Ok(Some((id, set)))
}

/// One cycle: trains on `samples` from the served delta (or the base), writes the delta, and records it
/// in the store (when the data directory has one) as a candidate.
pub fn run(settings: &CycleSettings, base: &Base, samples: &[Sample]) -> Result<Delta> {
    let recipe = &settings.recipe;
    let parent = served_parent(&settings.data_dir, base, recipe)?;
    let mut trainer = LoraTrainer::new(
        &base.model,
        &base.tok,
        recipe.clone(),
        parent.as_ref().map(|p| &p.1),
    )?;
    trainer.set_checkpoint_dir(settings.checkpoint_dir.clone());
    let progress = Progress::new(&settings.name, recipe.steps);
    let report = trainer.train_cycle(samples, |s| progress.step(s))?;
    progress.finish();
    let node = settings.name.clone();
    metrics::gauge!("hearth_trainer_tokens_per_second", "node" => node.clone())
        .set(report.tokens_per_second);
    metrics::counter!("hearth_trainer_cycles_total", "node" => node.clone()).increment(1);
    let adapter = trainer.adapter()?;
    let provenance = Provenance {
        delta_id: String::new(),
        base_sha256: base.sha256.clone(),
        recipe_sha256: recipe_sha256(recipe)?,
        recipe: recipe.clone(),
        data_digest: report.data_digest.clone(),
        num_samples: samples.len(),
        parent: parent.map(|p| p.0),
        seed: recipe.seed,
        metrics: serde_json::to_value(&report)?,
        created_at_unix_ms: crate::clock::now_unix_ms(),
    };
    let delta = save_delta(
        &settings.out_dir,
        &adapter,
        base.model.config(),
        provenance.clone(),
    )?;
    if settings.data_dir.join(Store::FILE_NAME).exists() {
        let mut prov = serde_json::to_value(&provenance)?;
        prov["delta_id"] = delta.id.clone().into();
        Store::open(&settings.data_dir)?.record_delta(&delta, &prov)?;
    }
    tracing::info!(node = %node, delta = %delta.id, steps = report.steps, "delta trained");
    Ok(delta)
}

/// A cycle's progress: a bar on a terminal, otherwise one log line per step; step and loss as metrics.
struct Progress {
    node: String,
    total: usize,
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn new(node: &str, total: usize) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} steps {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_prefix(format!("training {node}"));
            bar
        });
        Progress {
            node: node.to_owned(),
            total,
            bar,
        }
    }

    fn step(&self, s: &StepReport) {
        let node = &self.node;
        metrics::gauge!("hearth_trainer_step", "node" => node.clone()).set(s.step as f64);
        if s.loss.is_finite() {
            metrics::gauge!("hearth_trainer_loss", "node" => node.clone()).set(s.loss);
        }
        match &self.bar {
            Some(bar) => {
                bar.set_position(s.step as u64 + 1);
                bar.set_message(format!("loss {:.4}", s.loss));
            }
            None => {
                tracing::info!(node = %node, step = s.step + 1, of = self.total, loss = s.loss, "training")
            }
        }
    }

    fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
