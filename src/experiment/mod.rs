//! Research runs: one recorded stream replayed through several graphs, measured the same way each time.
//!
//! An experiment file ([`spec`]) names a JSONL stream with optional gold labels and the variants to compare.
//! Each variant's graph has its input node replaced by a replay of the stream and every node timed; each run
//! gets a fresh data directory, and the stream's order depends on the seed alone. [`output`] writes CSV,
//! JSON, a markdown table and SVG plots.

pub mod downstream;
pub mod output;
pub mod plots;
pub mod score;
pub mod spec;
pub mod stream;
pub mod tap;
pub mod variant;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

pub use score::RunMetrics;
pub use spec::{Experiment, ExperimentSpec, StreamSource};

use crate::engine::schema::Location;

/// Why an experiment could not be read, run or written. Each names the file and the place in it.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{at}: {message}", file.display())]
    Parse {
        file: PathBuf,
        at: Location,
        message: String,
    },
    #[error("{}: `{field}`: {message}", file.display())]
    Field {
        file: PathBuf,
        field: String,
        message: String,
    },
    #[error("{}: variant `{variant}`: `{field}`: {message}", file.display())]
    Variant {
        file: PathBuf,
        variant: String,
        field: String,
        message: String,
    },
    #[error("variant `{variant}`: invalid graph: {errors}")]
    Graph { variant: String, errors: String },
    #[error("{}:{line}:{col}: {message}", file.display())]
    Stream {
        file: PathBuf,
        line: usize,
        col: usize,
        message: String,
    },
    #[error("{}: {source}", path.display())]
    Store {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("{}: {table} row `{id}`: {source}", path.display())]
    Captured {
        path: PathBuf,
        table: &'static str,
        id: String,
        source: serde_json::Error,
    },
    #[error("variant `{variant}`, repeat {repeat}: {message}")]
    Run {
        variant: String,
        repeat: usize,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    Output { path: PathBuf, message: String },
    #[error("downstream: {0}")]
    Downstream(#[source] Box<downstream::DownstreamError>),
}

/// How to run an experiment, as the command line gives it.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Results go here; each run's data directory is `OUT/runs/VARIANT/rN`.
    pub out: PathBuf,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// Every run of an experiment, in the order they ran (repeat by repeat, each repeat through every variant).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Results {
    pub name: String,
    pub stream: String,
    pub records: usize,
    pub seed: u64,
    pub shuffle: bool,
    pub repeats: usize,
    pub variants: Vec<String>,
    pub runs: Vec<RunMetrics>,
    /// One delta per variant with its gate legs, when the experiment has `downstream`.
    pub downstream: Vec<downstream::DownstreamResult>,
}

impl Results {
    /// The runs of one variant.
    pub fn of<'a>(&'a self, variant: &'a str) -> impl Iterator<Item = &'a RunMetrics> + 'a {
        self.runs.iter().filter(move |r| r.variant == variant)
    }
}

/// Replays the stream through every variant `repeats` times. Every variant is built once before anything
/// runs, so a broken variant fails the experiment at once rather than after hours of the others.
pub fn run(exp: &Experiment, opts: &RunOptions) -> Result<Results, ExperimentError> {
    let records = match &exp.stream {
        spec::StreamSource::Jsonl(path) => stream::read(path, exp.spec.stream.limit)?,
        spec::StreamSource::Store(dir) => stream::read_store(dir, exp.spec.stream.limit)?,
    };
    let spec = &exp.spec;
    for i in 0..spec.variants.len() {
        variant::build(exp, i, Arc::new(Vec::new()), None)?;
    }
    let total = (records.len() * spec.variants.len() * spec.repeats) as u64;
    let progress = if opts.progress {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:32} {pos}/{len} records  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    // One untimed pass first: the first run in a process pays for lazily built matchers and cold caches,
    // which would otherwise count against whichever variant happens to run first.
    progress.inc_length(records.len() as u64);
    progress.set_message("warm-up");
    let warm: Arc<Vec<_>> = Arc::new(
        records
            .iter()
            .enumerate()
            .map(|(i, r)| r.sample(i))
            .collect(),
    );
    let warm_dir = opts.out.join("runs").join(".warmup");
    run_one(exp, 0, 0, spec.seed, &records, warm, &warm_dir, &progress)?;
    let mut runs = Vec::new();
    // Each variant's first repeat's admitted samples, for `downstream`.
    let mut first_admitted: Vec<Vec<crate::message::Sample>> = Vec::new();
    for repeat in 0..spec.repeats {
        let seed = spec.seed.wrapping_add(repeat as u64);
        let order = stream::order(records.len(), spec.shuffle, seed);
        let ordered: Vec<stream::Record> = order.iter().map(|&i| records[i].clone()).collect();
        let samples: Arc<Vec<_>> = Arc::new(
            ordered
                .iter()
                .enumerate()
                .map(|(i, r)| r.sample(i))
                .collect(),
        );
        for (i, v) in spec.variants.iter().enumerate() {
            progress.set_message(format!("{} r{repeat}", v.name));
            let dir = opts
                .out
                .join("runs")
                .join(&v.name)
                .join(format!("r{repeat}"));
            let (metrics, admitted) = run_one(
                exp,
                i,
                repeat,
                seed,
                &records,
                samples.clone(),
                &dir,
                &progress,
            )?;
            runs.push(metrics);
            if repeat == 0 && spec.downstream.is_some() {
                first_admitted.push(admitted.iter().map(|s| (**s).clone()).collect());
            }
        }
    }
    let mut downstream_results = Vec::new();
    if let (Some(d), Some(model)) = (&spec.downstream, &exp.downstream_model) {
        progress.set_message("downstream: loading the base");
        let base = downstream::load_base(model)?;
        for (v, admitted) in spec.variants.iter().zip(&first_admitted) {
            progress.set_message(format!("downstream: {}", v.name));
            let dir = opts.out.join("runs").join(&v.name).join("r0");
            downstream_results.push(downstream::train_and_judge(
                d,
                exp.downstream_probes.as_deref(),
                &base,
                &v.name,
                admitted,
                &dir.join("deltas"),
                &opts.out.join("runs").join(".eval"),
            )?);
        }
    }
    progress.finish_and_clear();
    Ok(Results {
        name: spec.name.clone(),
        stream: exp.stream.path().display().to_string(),
        records: records.len(),
        seed: spec.seed,
        shuffle: spec.shuffle,
        repeats: spec.repeats,
        variants: spec.variants.iter().map(|v| v.name.clone()).collect(),
        runs,
        downstream: downstream_results,
    })
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    exp: &Experiment,
    index: usize,
    repeat: usize,
    seed: u64,
    records: &[stream::Record],
    samples: Arc<Vec<Arc<crate::message::Sample>>>,
    dir: &Path,
    progress: &ProgressBar,
) -> Result<(RunMetrics, Vec<Arc<crate::message::Sample>>), ExperimentError> {
    let name = &exp.spec.variants[index].name;
    let run_err = |message: String| ExperimentError::Run {
        variant: name.clone(),
        repeat,
        message,
    };
    // A run starts from nothing: dedup's state and the store of an earlier run would change its numbers.
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|source| ExperimentError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::create_dir_all(dir).map_err(|source| ExperimentError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let built = variant::build(exp, index, samples, Some(progress.clone()))?;
    let started = Instant::now();
    let running =
        crate::engine::start(built.graph, Some(dir)).map_err(|e| run_err(e.to_string()))?;
    let report = running.wait();
    let wall_seconds = started.elapsed().as_secs_f64();
    if let Some(trouble) = report.status.nodes.iter().find_map(|n| n.trouble()) {
        return Err(run_err(trouble));
    }
    let collected = std::mem::take(&mut *built.collected.lock().unwrap_or_else(|p| p.into_inner()));
    let timings = built
        .timings
        .into_iter()
        .map(|(id, t)| {
            let t = std::mem::take(&mut *t.lock().unwrap_or_else(|p| p.into_inner()));
            (id, t)
        })
        .collect();
    let metrics = score::score(score::RunInput {
        variant: name,
        repeat,
        seed,
        records,
        collected: &collected,
        report: &report,
        timings,
        wall_seconds,
    });
    Ok((metrics, collected.admitted))
}
