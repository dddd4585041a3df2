//! Training cycles as a background process: samples are buffered; once enough new ones wait (and, with
//! `await_verdict`, the gate has judged the last delta, and the schedule allows), a cycle trains on the
//! training window on its own thread, from the served delta or the base (`start_from`), and publishes a delta. Usable
//! without the engine; the `trainer` actor is glue over [`Cycles`].
//!
//! Per-user deltas (`per_user`): each user with at least `per_user.min_samples` samples in the window gets
//! a delta of their own, trained on their samples alone (plus the recipe's replay) and continuing from the
//! delta served to them; the samples of everyone else train the common delta, as without `per_user`. A
//! cycle trains one of them: the one with the most new samples, once `min_samples` new ones wait for it.
//!
//! Bounded over weeks: the buffer holds only the training window (the last `max_samples`, none older than
//! `max_age_secs`), and training-set rows outside it are deleted from the store, so neither memory, the
//! store nor a cycle's encoding grows with the age of the installation.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

use super::artifact::recipe_sha256;
use super::{LoraTrainer, Provenance, Result, StepReport, TrainConfig, TrainError};
use crate::message::{Delta, Sample};
use crate::model::{Base, LoraSet, Requantize};
use crate::store::Store;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerSettings {
    /// The base model (GGUF) the deltas adapt; `None`: the default model (as `serve` resolves it).
    #[serde(default)]
    pub model: Option<String>,
    /// How the base's weights are held in memory (see [`Requantize`]). Every node that loads the same `model`
    /// names the same, so that what is trained is what is served: a graph that differs is refused.
    #[serde(default)]
    pub requantize: Requantize,
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
    /// What a cycle's delta starts from: the served delta, or the base.
    #[serde(default)]
    pub start_from: StartFrom,
    /// Where deltas are written; `DATA_DIR/deltas` by default.
    #[serde(default)]
    pub out_dir: Option<PathBuf>,
    /// The samples a cycle trains on; older ones leave memory and the store's training set.
    #[serde(default)]
    pub window: TrainingWindow,
    /// Seconds from the start of one cycle (or the last delta in the store, after a restart) to the next.
    #[serde(default)]
    pub min_interval_secs: u64,
    /// Start a cycle only while the machine is idle: the 1-minute load average per CPU below this (read from
    /// `/proc/loadavg`; where that cannot be read, the machine counts as idle). `None`: any time.
    #[serde(default)]
    pub idle_load: Option<f64>,
    /// Train a delta per user (see [`PerUser`]); `None`: one common delta for everyone.
    #[serde(default)]
    pub per_user: Option<PerUser>,
    /// Where each sequence's forward and backward run (`cpu`, `cuda:N`, `rocm:N`, `auto`, `emulated`); where it
    /// does not open or does not cover the base or the recipe, on the CPU, with the reason in the cycle's report.
    #[serde(default)]
    pub device: crate::gpu::Device,
    /// Boxed: the recipe is large next to other kinds' parameters.
    #[serde(default)]
    pub train: Box<TrainConfig>,
}

/// What a cycle's delta starts from. Either way it trains on the whole window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartFrom {
    /// The delta served now (on the user's own chain, with `per_user`): each cycle adds to the last one, so a
    /// short cycle builds on what earlier ones learned, and its drift from the base adds up as well.
    #[default]
    Served,
    /// The base: each cycle trains a fresh delta on the window, so drift from the base never stacks across
    /// cycles, and what left the window is forgotten.
    Base,
}

/// Per-user deltas: who gets a delta of their own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerUser {
    /// A user with at least this many samples in the training window gets their own delta; users with fewer
    /// share the common delta.
    pub min_samples: usize,
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

/// The training window: what a cycle trains on, by count and by age since admission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingWindow {
    /// The most recently admitted samples kept; `None`: no limit by count.
    pub max_samples: Option<usize>,
    /// Samples admitted longer ago than this leave the window; `None`: no limit by age.
    pub max_age_secs: Option<u64>,
}

impl Default for TrainingWindow {
    fn default() -> Self {
        TrainingWindow {
            max_samples: Some(10_000),
            max_age_secs: None,
        }
    }
}

impl TrainingWindow {
    /// Admission times before this (Unix ms) are outside the window.
    fn cutoff_unix_ms(&self) -> Option<u64> {
        self.max_age_secs
            .map(|s| crate::clock::now_unix_ms().saturating_sub(s.saturating_mul(1000)))
    }
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
            start_from: self.start_from,
            window: self.window.clone(),
            min_interval: Duration::from_secs(self.min_interval_secs),
            idle_load: self.idle_load,
            per_user: self.per_user.clone(),
            data_dir: data_dir.to_path_buf(),
            out_dir: self
                .out_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("deltas")),
            checkpoint_dir: data_dir.join("trainer").join(name),
            device: self.device,
        }
    }
}

impl Default for TrainerSettings {
    fn default() -> Self {
        TrainerSettings {
            model: None,
            requantize: Requantize::Off,
            min_samples: default_min_samples(),
            await_verdict: default_await_verdict(),
            start_from: StartFrom::Served,
            threads: default_threads(),
            out_dir: None,
            window: TrainingWindow::default(),
            min_interval_secs: 0,
            idle_load: None,
            per_user: None,
            device: crate::gpu::Device::Cpu,
            train: Box::default(),
        }
    }
}

/// How often a cycle waiting for a verdict looks in the store.
const VERDICT_POLL: Duration = Duration::from_millis(500);

/// How often the training set in the store is cut to the window: rows outlive it by at most this much.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// How long an idleness reading holds: the load average moves over a minute, and ticks come every 20 ms.
const IDLE_RECHECK: Duration = Duration::from_secs(5);

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
    /// What a cycle's delta starts from.
    pub start_from: StartFrom,
    /// What a cycle trains on.
    pub window: TrainingWindow,
    /// From one cycle's start to the next.
    pub min_interval: Duration,
    /// Start only while the load average per CPU is below this.
    pub idle_load: Option<f64>,
    /// Per-user deltas; `None`: one common delta.
    pub per_user: Option<PerUser>,
    /// The store and the default model.
    pub data_dir: PathBuf,
    /// Where deltas are written.
    pub out_dir: PathBuf,
    /// With `recipe.checkpoint_every > 0`, an interrupted cycle resumes from here.
    pub checkpoint_dir: PathBuf,
    /// Where each sequence's forward and backward run.
    pub device: crate::gpu::Device,
}

pub struct Cycles {
    settings: CycleSettings,
    base: BaseSource,
    /// The training window, with each sample's admission time (Unix ms), in arrival order: each cycle
    /// trains on all of it.
    seen: VecDeque<(u64, Sample)>,
    /// Ids in `seen`: a sample both reloaded from the store and received again counts once.
    seen_ids: HashSet<String>,
    /// Samples that arrived since their delta's last cycle, by user.
    new_by_user: HashMap<String, usize>,
    /// When the last cycle started (Unix ms); after a restart, when the store's last delta was made.
    last_cycle_unix_ms: Option<u64>,
    /// When the store's training set was last cut to the window.
    last_prune: Option<Instant>,
    /// The last idleness reading and when it was taken.
    idle: Option<(Instant, bool)>,
    running: Option<JoinHandle<Result<Delta>>>,
    /// The last delta published while `await_verdict` is on, when the store was last asked about it, and
    /// whether the cycle recorded it there.
    awaiting: Option<(String, Instant, bool)>,
    /// Kept open while waiting for verdicts: it is read twice a second.
    store: Option<Store>,
}

impl Cycles {
    pub fn new(settings: CycleSettings, base: BaseSource) -> Self {
        Cycles {
            settings,
            base,
            seen: VecDeque::new(),
            seen_ids: HashSet::new(),
            new_by_user: HashMap::new(),
            last_cycle_unix_ms: None,
            last_prune: None,
            idle: None,
            running: None,
            awaiting: None,
            store: None,
        }
    }

    /// Adds a sample (once per id), admitted now.
    pub fn add(&mut self, sample: &Sample) {
        self.add_admitted(crate::clock::now_unix_ms(), sample);
    }

    fn add_admitted(&mut self, admitted_unix_ms: u64, sample: &Sample) {
        if self.seen_ids.insert(sample.id.clone()) {
            self.seen.push_back((admitted_unix_ms, sample.clone()));
            *self.new_by_user.entry(sample.user.clone()).or_default() += 1;
            self.evict();
        }
    }

    /// The samples in the window now, oldest first.
    pub fn window(&self) -> impl Iterator<Item = &Sample> {
        self.seen.iter().map(|(_, s)| s)
    }

    /// Drops what left the window from memory (the store is cut by [`Cycles::prune_store`]).
    fn evict(&mut self) {
        let cutoff = self.settings.window.cutoff_unix_ms();
        let max = self.settings.window.max_samples.unwrap_or(usize::MAX);
        while let Some((at, s)) = self.seen.front() {
            if self.seen.len() <= max && cutoff.is_none_or(|c| *at >= c) {
                break;
            }
            self.seen_ids.remove(&s.id);
            self.seen.pop_front();
        }
    }

    /// Adds the training window the store holds (after cutting the store to it), so what earlier runs
    /// admitted is trained on again; a restarted process keeps `min_interval` from the store's last delta.
    pub fn reload(&mut self) -> Result<usize> {
        if !self.settings.data_dir.join(Store::FILE_NAME).exists() {
            return Ok(0);
        }
        self.prune_store()?;
        let store = Store::open(&self.settings.data_dir)?;
        let set = store.training_set_admitted()?;
        for (at, s) in &set {
            self.add_admitted(*at, s);
        }
        if self.last_cycle_unix_ms.is_none() {
            self.last_cycle_unix_ms = store.last_delta_created_at()?;
        }
        Ok(set.len())
    }

    /// Cuts memory and the store's training set to the window; the store at most every [`PRUNE_EVERY`].
    /// Returns the rows deleted.
    pub fn sweep(&mut self) -> Result<usize> {
        self.evict();
        if self.last_prune.is_some_and(|t| t.elapsed() < PRUNE_EVERY)
            || !self.settings.data_dir.join(Store::FILE_NAME).exists()
        {
            return Ok(0);
        }
        self.prune_store()
    }

    fn prune_store(&mut self) -> Result<usize> {
        self.last_prune = Some(Instant::now());
        let window = &self.settings.window;
        if window.max_samples.is_none() && window.max_age_secs.is_none() {
            return Ok(0);
        }
        let (keep, cutoff) = (window.max_samples, window.cutoff_unix_ms());
        let n = self.store()?.prune_training_set(keep, cutoff)?;
        if n > 0 {
            tracing::info!(node = %self.settings.name, rows = n, "training set cut to the window");
            metrics::counter!("hearth_trainer_pruned_samples_total", "node" => self.settings.name.clone())
                .increment(n as u64);
        }
        Ok(n)
    }

    /// The store, opened once and kept: the trainer reads it twice a second while awaiting a verdict.
    fn store(&mut self) -> Result<&mut Store> {
        if self.store.is_none() {
            self.store = Some(Store::open(&self.settings.data_dir)?);
        }
        match &mut self.store {
            Some(store) => Ok(store),
            None => unreachable!("opened above"),
        }
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
        let delta = match handle.join().map_err(|_| TrainError::Panicked)? {
            Ok(delta) => delta,
            // Not a failure: the window holds nothing a cycle may train on yet (say, only the model's own
            // answers, which the collapse guard caps by the grounded ones). Retrying at once would fail the
            // same way until the node is failed; the next `min_samples` arrivals try again.
            Err(TrainError::NoData(n)) => {
                tracing::info!(node = %self.settings.name, samples = n, "no trainable example in the window yet; waiting for more samples");
                metrics::counter!("hearth_trainer_cycles_without_data_total", "node" => self.settings.name.clone())
                    .increment(1);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if self.settings.await_verdict {
            // The cycle recorded its delta if the store existed (see `run`).
            let recorded = self.settings.data_dir.join(Store::FILE_NAME).exists();
            self.awaiting = Some((delta.id.clone(), Instant::now(), recorded));
        }
        Ok(Some(delta))
    }

    /// Starts a cycle on its own thread when enough new samples wait, none runs, the last verdict is in,
    /// and the schedule allows (`min_interval` since the last cycle; the machine idle, with `idle_load`).
    pub fn maybe_start(&mut self) -> Result<()> {
        self.sweep()?;
        if self.running.is_some() || self.seen.is_empty() {
            return Ok(());
        }
        let Some(group) = self.next_group() else {
            return Ok(());
        };
        if !self.interval_passed() || !self.verdict_known()? || !self.machine_idle() {
            return Ok(());
        }
        let samples: Vec<Sample> = self
            .window()
            .filter(|s| group.users.contains(&s.user))
            .cloned()
            .collect();
        if self.settings.per_user.is_none() {
            self.new_by_user.clear();
        }
        for u in &group.users {
            self.new_by_user.remove(u);
        }
        self.last_cycle_unix_ms = Some(crate::clock::now_unix_ms());
        let (settings, base) = (self.settings.clone(), self.base.clone());
        let pool = super::background_pool(settings.threads)?;
        let user = group.user;
        let handle = std::thread::Builder::new()
            .name(format!("trainer-{}", settings.name))
            .spawn(move || {
                pool.install(|| run_for(&settings, &*base()?, &samples, user.as_deref()))
            })
            .map_err(|e| TrainError::Io {
                path: "trainer thread".to_owned(),
                source: e,
            })?;
        self.running = Some(handle);
        Ok(())
    }

    /// The delta the next cycle trains, if `min_samples` new samples wait for one: the user's own or the
    /// common one, whichever has the most new samples (the first user by name on a tie; common before users).
    fn next_group(&self) -> Option<Group> {
        let min = self.settings.min_samples.max(1);
        let mut in_window: BTreeMap<&str, usize> = BTreeMap::new();
        for s in self.window() {
            *in_window.entry(s.user.as_str()).or_default() += 1;
        }
        let new = |u: &str| self.new_by_user.get(u).copied().unwrap_or(0);
        let own_min = self.settings.per_user.as_ref().map(|p| p.min_samples);
        let (own, shared): (Vec<_>, Vec<_>) = in_window
            .iter()
            .partition(|(_, n)| own_min.is_some_and(|m| **n >= m));
        let mut best: Option<(usize, Group)> = None;
        let shared_new: usize = if own_min.is_none() {
            // Without per-user deltas, everything that arrived counts, as it always has (even samples the
            // window has dropped again).
            self.new_by_user.values().sum()
        } else {
            shared.iter().map(|(u, _)| new(u)).sum()
        };
        if shared_new >= min {
            best = Some((
                shared_new,
                Group {
                    user: None,
                    users: shared.iter().map(|(u, _)| u.to_string()).collect(),
                },
            ));
        }
        for (u, _) in own {
            let n = new(u);
            if n >= min && best.as_ref().is_none_or(|(b, _)| n > *b) {
                best = Some((
                    n,
                    Group {
                        user: Some(u.to_string()),
                        users: HashSet::from([u.to_string()]),
                    },
                ));
            }
        }
        best.map(|(_, g)| g)
    }

    fn interval_passed(&self) -> bool {
        let min = self.settings.min_interval.as_millis() as u64;
        self.last_cycle_unix_ms
            .is_none_or(|t| crate::clock::now_unix_ms().saturating_sub(t) >= min)
    }

    /// Whether the machine counts as idle (always, without `idle_load`); re-read every [`IDLE_RECHECK`].
    fn machine_idle(&mut self) -> bool {
        let Some(max) = self.settings.idle_load else {
            return true;
        };
        if let Some((at, idle)) = self.idle
            && at.elapsed() < IDLE_RECHECK
        {
            return idle;
        }
        let idle = match load_per_cpu() {
            Some(load) => load < max,
            None => {
                if self.idle.is_none() {
                    tracing::warn!(node = %self.settings.name, "no load average here (/proc/loadavg); idle_load is not applied");
                }
                true
            }
        };
        if !idle && self.idle.is_none_or(|(_, was)| was) {
            tracing::info!(node = %self.settings.name, max, "training waits for the machine to be idle");
        }
        self.idle = Some((Instant::now(), idle));
        idle
    }

    /// Whether the gate has judged the last delta (always true with `await_verdict` off).
    fn verdict_known(&mut self) -> Result<bool> {
        let Some((id, checked, recorded)) = &mut self.awaiting else {
            return Ok(true);
        };
        if checked.elapsed() < VERDICT_POLL {
            return Ok(false);
        }
        *checked = Instant::now();
        let (id, recorded) = (id.clone(), *recorded);
        let judged = match self.store()?.delta(&id)? {
            Some(d) => d.verdict.is_some(),
            // Recorded and gone: retention pruned it, and it prunes only judged deltas.
            None => recorded,
        };
        if judged {
            self.awaiting = None;
        }
        Ok(judged)
    }
}

/// The samples one cycle trains and the delta they make: a user's own (`user`), or the common one.
struct Group {
    user: Option<String>,
    users: HashSet<String>,
}

/// The 1-minute load average divided by the CPUs, from `/proc/loadavg`; `None` where it cannot be read.
pub fn load_per_cpu() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let load: f64 = text.split_whitespace().next()?.parse().ok()?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Some(load / cpus as f64)
}

/// The served delta, if the store has one for this base: what a new cycle continues from.
pub fn served_parent(
    data_dir: &Path,
    base: &Base,
    recipe: &TrainConfig,
) -> Result<Option<(String, LoraSet)>> {
    served_parent_for(data_dir, base, recipe, None)
}

/// The delta served on `user`'s own chain (`None`: the common one), if the store has one for this base: what a
/// new cycle of that delta continues from. A user's first delta starts from the base, so that it holds their
/// data alone.
pub fn served_parent_for(
    data_dir: &Path,
    base: &Base,
    recipe: &TrainConfig,
    user: Option<&str>,
) -> Result<Option<(String, LoraSet)>> {
    if !data_dir.join(Store::FILE_NAME).exists() {
        return Ok(None);
    }
    let store = Store::open(data_dir)?;
    let Some(id) = store.served_on(user)?.delta_id else {
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
    run_for(settings, base, samples, None)
}

/// [`run`] for one user's own delta (`None`: the common delta), continuing from the delta served to them.
pub fn run_for(
    settings: &CycleSettings,
    base: &Base,
    samples: &[Sample],
    user: Option<&str>,
) -> Result<Delta> {
    let delta = train_and_save(settings, base, samples, user);
    // The cycle's peak stays idle until the next one: give it back.
    crate::malloc::release_free_memory();
    delta
}

fn train_and_save(
    settings: &CycleSettings,
    base: &Base,
    samples: &[Sample],
    user: Option<&str>,
) -> Result<Delta> {
    let recipe = &settings.recipe;
    let parent = match settings.start_from {
        StartFrom::Served => served_parent_for(&settings.data_dir, base, recipe, user)?,
        StartFrom::Base => None,
    };
    let mut trainer = LoraTrainer::new(
        &base.model,
        &base.tok,
        recipe.clone(),
        parent.as_ref().map(|p| &p.1),
    )?;
    trainer.set_checkpoint_dir(settings.checkpoint_dir.clone());
    trainer.use_device(settings.device);
    if recipe.replay_self_distilled > 0 {
        let turns = super::replay::self_distilled(
            &base.model,
            &base.tok,
            &base.sha256,
            recipe.replay_self_distilled,
            &settings.data_dir,
        )?;
        trainer.add_replay_turns(&turns);
    }
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
    let has_store = settings.data_dir.join(Store::FILE_NAME).exists();
    // Whose data the delta holds: this cycle's samples' users, and through the parent it continues, theirs.
    let mut trained_on: std::collections::BTreeSet<String> =
        samples.iter().map(|s| s.user.clone()).collect();
    if let (Some(parent), true) = (&provenance.parent, has_store)
        && let Some(record) = Store::open(&settings.data_dir)?.delta(parent)?
    {
        trained_on.extend(record.trained_on().unwrap_or_default());
    }
    let mut extra = serde_json::Map::new();
    if let Some(u) = user {
        extra.insert("user".into(), u.into());
    }
    extra.insert(
        crate::store::TRAINED_ON.into(),
        trained_on.into_iter().collect::<Vec<_>>().into(),
    );
    let delta = super::artifact::save_delta_with(
        &settings.out_dir,
        &adapter,
        base.model.config(),
        provenance.clone(),
        &extra,
    )?;
    if has_store {
        let mut prov = serde_json::to_value(&provenance)?;
        prov["delta_id"] = delta.id.clone().into();
        for (k, v) in extra {
            prov[k.as_str()] = v;
        }
        Store::open(&settings.data_dir)?.record_delta(&delta, &prov)?;
    }
    tracing::info!(node = %node, delta = %delta.id, user, steps = report.steps, "delta trained");
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
