//! The `hearth` command line. anyhow lives only here, at the binary's edge; the library returns typed errors.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use anyhow::Context;
use clap::{Parser, Subcommand};

use hearth::actors::{ActorKind, Graph};
use hearth::control::{ControlServer, ReloadHook, ReloadRefused};
use hearth::engine::draw::{DrawFormat, draw};
use hearth::engine::runtime;
use hearth::engine::schema::GraphError;

#[derive(Parser)]
#[command(
    name = "hearth",
    version,
    about = "A private AI that keeps learning from you, on your machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a graph until its sources finish or SIGINT/SIGTERM, then drain and report.
    Run {
        graph: PathBuf,
        /// Data directory (overrides the graph's `settings.data_dir`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Control endpoints address (overrides `settings.control`), e.g. 127.0.0.1:9090.
        #[arg(long)]
        control: Option<String>,
        /// Stop the sources after this many seconds.
        #[arg(long)]
        duration: Option<f64>,
    },
    /// Rewire a running graph from GRAPH through its control port: validated here first (exit 2 with every
    /// error), then applied there, keeping what both graphs share running. SIGHUP reloads the graph file a
    /// run started with.
    Reload {
        graph: PathBuf,
        /// The running graph's control address (default: GRAPH's `settings.control`).
        #[arg(long)]
        control: Option<String>,
        /// Where the API key file is (default: GRAPH's `settings.data_dir`); HEARTH_API_KEY wins.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Validate graph files, reporting every error with file:line:col; exit 2 if any is invalid.
    Check {
        #[arg(required = true)]
        graphs: Vec<PathBuf>,
    },
    /// Draw a graph with ports, capacities and policies.
    Graph {
        graph: PathBuf,
        #[arg(long, value_enum, default_value = "dot")]
        format: DrawFormat,
    },
    /// List every actor kind with its ports, message types and an example of its parameters.
    Actors,
    /// Review samples the guard quarantined.
    Quarantine {
        #[command(subcommand)]
        action: QuarantineAction,
        #[arg(long, default_value = "hearth-data", global = true)]
        data_dir: PathBuf,
    },
    /// Trained deltas: list them, show one with its eval verdict, promote one the gate passed, or roll back.
    Deltas {
        #[command(subcommand)]
        action: DeltasAction,
        #[arg(long, default_value = "hearth-data", global = true)]
        data_dir: PathBuf,
    },
    /// Print the run report (capture, curation, deltas and their eval legs, privacy check) from the store.
    Report {
        #[arg(long, default_value = "hearth-data")]
        data_dir: PathBuf,
        /// The graph that ran, so the report checks what its nodes planted (demo PII, canaries).
        #[arg(long)]
        graph: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Delete everything held about one user, everywhere in the store.
    Purge {
        #[arg(long)]
        user: String,
        #[arg(long, default_value = "hearth-data")]
        data_dir: PathBuf,
    },
    /// Run a federation coordinator from a RON settings file (secrets come from a file or the environment).
    Coordinator { settings: PathBuf },
    /// Replay one recorded stream (a labelled JSONL file, or a store's captured interactions and feedback,
    /// read-only) through several graph variants and write CSV, JSON, markdown and SVG results (see
    /// docs/experiments/README.md).
    Experiment {
        experiment: PathBuf,
        /// Where results and each run's data directory go.
        #[arg(long, default_value = "hearth-experiments")]
        out: PathBuf,
    },
    /// Find PII spans in a JSONL file (`id`, `text` per line) and write score_pii.py predictions.
    Redact {
        #[arg(long)]
        jsonl: PathBuf,
        #[arg(long)]
        spans_out: PathBuf,
        /// Redactor settings as RON, e.g. `(types: [Email, Phone], keep_non_personal_ips: false)`.
        #[arg(long, default_value = "()")]
        config: String,
        /// Name/address tagger weights (safetensors from examples/train_pii_tagger.rs) instead
        /// of the shipped ones.
        #[arg(long)]
        tagger_weights: Option<PathBuf>,
    },
    /// Find credentials in a JSONL file (`id`, `text` per line) and write score_secrets.py findings.
    Secrets {
        #[arg(long)]
        jsonl: PathBuf,
        #[arg(long)]
        findings_out: PathBuf,
        /// Secret-filter settings as RON, e.g. `(min_entropy_base64: 4.5)`.
        #[arg(long, default_value = "()")]
        config: String,
    },
}

#[derive(Subcommand)]
enum QuarantineAction {
    /// List quarantined samples with the node and reason that held them.
    List,
    /// Admit one sample to the training set after review.
    Release { sample_id: String },
    /// Delete one quarantined sample, or all of them.
    Purge { sample_id: Option<String> },
}

#[derive(Subcommand)]
enum DeltasAction {
    /// Every delta with its status, owner and personalisation gain; `*` marks each served one (the common one,
    /// and each user's own).
    List {
        /// Only this user's own deltas.
        #[arg(long)]
        user: Option<String>,
    },
    /// One delta's provenance, verdict and eval legs, as JSON.
    Show { id: String },
    /// Serve a delta whose eval verdict passed and is bound to its exact bytes, base, recipe and data (a
    /// user's own delta: to that user).
    Promote { id: String },
    /// Restore the state served before the current one (down to the base alone; with `--user`, that user's
    /// own, down to the common delta).
    Rollback {
        #[arg(long)]
        user: Option<String>,
    },
    /// Merge deltas in ΔW = scale·B·A into a new candidate delta of rank `--rank`, for the eval gate to judge.
    Merge {
        /// linear (weighted mean), task_arithmetic (weighted sum), ties or dare.
        #[arg(long)]
        method: String,
        #[arg(long)]
        rank: usize,
        /// One weight per delta, comma-separated; default: equal (linear) or 1 each.
        #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
        weights: Option<Vec<f64>>,
        /// ties: the share of each delta's update kept, by magnitude.
        #[arg(long, default_value_t = 0.2)]
        density: f64,
        /// dare: the probability each entry of an update is dropped.
        #[arg(long, default_value_t = 0.9)]
        drop: f64,
        /// Seeds dare's masks and the randomized SVD.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The base GGUF the deltas adapt; default: the default model.
        #[arg(long)]
        model: Option<String>,
        /// Judge the merged delta now with the eval gate's default settings, and promote it if it passes.
        #[arg(long)]
        judge: bool,
        #[arg(required = true, num_args = 2..)]
        ids: Vec<String>,
    },
    /// Measure how two deltas conflict (sign conflicts and cosine of ΔW) and say whether to merge or route them.
    Conflict {
        a: String,
        b: String,
        /// The base GGUF the deltas adapt; default: the default model.
        #[arg(long)]
        model: Option<String>,
        /// Merge only at a cosine of at least this.
        #[arg(long, allow_negative_numbers = true,
              default_value_t = hearth::train::merge::ConflictThresholds::default().min_cosine)]
        min_cosine: f64,
        /// Merge only with at most this magnitude-weighted share of sign conflicts.
        #[arg(long, default_value_t = hearth::train::merge::ConflictThresholds::default().max_sign_conflict)]
        max_sign_conflict: f64,
    },
    /// Route or merge: measure the conflict between the deltas users are served (questions both taught with
    /// different answers, the gain the two combined keep; without probes, sign conflicts and cosine of ΔW), merge the groups that agree
    /// into candidates the eval gate judges (served to each member only if it passes), keep the rest routed,
    /// and record the decision in the store.
    Reconcile {
        /// Only these users' deltas (repeat the flag); default: every user served a delta of their own.
        #[arg(long = "user")]
        users: Vec<String>,
        /// How a group is merged: task_arithmetic (adds the updates), linear, ties or dare.
        #[arg(long, default_value = "task_arithmetic")]
        method: String,
        /// Rank of a merged delta; default: the sum of the group's ranks (an exact merge).
        #[arg(long)]
        rank: Option<usize>,
        /// The base GGUF the deltas adapt; default: the default model.
        #[arg(long)]
        model: Option<String>,
        /// Merge only at a cosine of at least this.
        #[arg(long, allow_negative_numbers = true,
              default_value_t = hearth::train::merge::ConflictThresholds::default().min_cosine)]
        min_cosine: f64,
        /// Merge only with at most this magnitude-weighted share of sign conflicts.
        #[arg(long, default_value_t = hearth::train::merge::ConflictThresholds::default().max_sign_conflict)]
        max_sign_conflict: f64,
        /// Merge only if the two combined keep this share of each one's gain on its held-out probes.
        #[arg(long, default_value_t = hearth::train::reconcile::ReconcileOptions::default().min_kept)]
        min_kept: f64,
        /// Measure and decide, but merge nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Parses a `--config` RON value, naming the flag and position on error.
fn parse_config<T: serde::de::DeserializeOwned>(text: &str) -> anyhow::Result<T> {
    hearth::engine::schema::ron_options()
        .from_str(text)
        .map_err(|e| anyhow::anyhow!("--config {}: {}", e.span, e.code))
}

/// Opens the input and a fresh output for a JSONL conversion command.
fn jsonl_files(
    input: &Path,
    output: &Path,
) -> anyhow::Result<(
    std::io::BufReader<std::fs::File>,
    std::io::BufWriter<std::fs::File>,
)> {
    let reader =
        std::fs::File::open(input).with_context(|| format!("opening {}", input.display()))?;
    let writer =
        std::fs::File::create(output).with_context(|| format!("creating {}", output.display()))?;
    Ok((
        std::io::BufReader::new(reader),
        std::io::BufWriter::new(writer),
    ))
}

/// Prints the lines a conversion skipped; they never stop the rest of the file.
fn report_bad_lines(input: &Path, errors: &[impl std::fmt::Display]) {
    for e in errors {
        eprintln!("{}: skipped {e}", input.display());
    }
}

fn main() -> ExitCode {
    hearth::malloc::tune_for_long_runs();
    hearth::model::configure_candle_threads();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_errors(path: &Path, errors: &[GraphError]) {
    for e in errors {
        match e.at {
            Some(at) => eprintln!("{}:{at}: error: {}", path.display(), e.message),
            None => eprintln!("{}: error: {}", path.display(), e.message),
        }
    }
    eprintln!("{}: {} error(s)", path.display(), errors.len());
}

/// Reads and validates a graph file; `Ok(None)` after printing its errors.
fn load(path: &Path) -> anyhow::Result<Option<Graph>> {
    let src =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match ActorKind::graph(&src) {
        Ok(g) => Ok(Some(g)),
        Err(errors) => {
            print_errors(path, &errors);
            Ok(None)
        }
    }
}

const INVALID: u8 = 2;

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run {
            graph,
            data_dir,
            control,
            duration,
        } => run_graph(&graph, data_dir, control, duration),
        Command::Reload {
            graph,
            control,
            data_dir,
        } => reload_graph(&graph, control, data_dir),
        Command::Check { graphs } => check(&graphs),
        Command::Graph { graph, format } => draw_graph(&graph, format),
        Command::Actors => list_actors(),
        Command::Quarantine { action, data_dir } => quarantine(action, &data_dir),
        Command::Deltas { action, data_dir } => deltas(action, &data_dir),
        Command::Report {
            data_dir,
            graph,
            json,
        } => report(&data_dir, graph.as_deref(), json),
        Command::Purge { user, data_dir } => purge(&user, &data_dir),
        Command::Coordinator { settings } => coordinator(&settings),
        Command::Experiment { experiment, out } => run_experiment(&experiment, out),
        Command::Redact {
            jsonl,
            spans_out,
            config,
            tagger_weights,
        } => redact(&jsonl, &spans_out, &config, tagger_weights.as_deref()),
        Command::Secrets {
            jsonl,
            findings_out,
            config,
        } => secrets(&jsonl, &findings_out, &config),
    }
}

fn run_experiment(path: &Path, out: PathBuf) -> anyhow::Result<ExitCode> {
    use hearth::experiment::{Experiment, ExperimentError, RunOptions, output, run};
    let exp = match Experiment::load(path) {
        Ok(exp) => exp,
        Err(e @ (ExperimentError::Parse { .. } | ExperimentError::Field { .. })) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(INVALID));
        }
        Err(e) => return Err(e.into()),
    };
    let results = run(
        &exp,
        &RunOptions {
            out: out.clone(),
            // indicatif draws only when stderr is a terminal.
            progress: true,
        },
    )?;
    for file in output::write(&results, &out)? {
        println!("{}", file.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn check(graphs: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let mut ok = true;
    for path in graphs {
        match load(path)? {
            Some(g) => println!("{}: {}", path.display(), g.summary()),
            None => ok = false,
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(INVALID)
    })
}

fn draw_graph(graph: &Path, format: DrawFormat) -> anyhow::Result<ExitCode> {
    let Some(g) = load(graph)? else {
        return Ok(ExitCode::from(INVALID));
    };
    print!("{}", draw(&g, format));
    Ok(ExitCode::SUCCESS)
}

fn list_actors() -> anyhow::Result<ExitCode> {
    let ports = |ps: &[hearth::actors::PortSpec]| {
        ps.iter()
            .map(|p| {
                format!(
                    "{}: {}{}",
                    p.name,
                    p.message_type,
                    if p.required { "" } else { " (optional)" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    for kind in ActorKind::examples() {
        let info = kind.info();
        println!("{} — {}", info.name, info.about);
        println!("  inputs:  {}", ports(info.inputs));
        println!("  outputs: {}", ports(info.outputs));
        println!("  source:  {}", info.source);
        println!("  example: kind: {}", kind.to_ron());
    }
    Ok(ExitCode::SUCCESS)
}

fn quarantine(action: QuarantineAction, data_dir: &Path) -> anyhow::Result<ExitCode> {
    let mut store = open_store(data_dir)?;
    match action {
        QuarantineAction::List => {
            for q in store.quarantine_list()? {
                println!("{}\t{}\t{}", q.sample.id, q.node, q.reason);
                println!("  {}", serde_json::to_string(&q.sample.content)?);
            }
        }
        QuarantineAction::Release { sample_id } => {
            if !store.quarantine_release(&sample_id)? {
                anyhow::bail!(
                    "no quarantined sample `{sample_id}` in {}",
                    store.path().display()
                );
            }
            println!("released {sample_id} to the training set");
        }
        QuarantineAction::Purge { sample_id } => {
            let n = store.quarantine_purge(sample_id.as_deref())?;
            println!("purged {n} quarantined sample(s)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn deltas(action: DeltasAction, data_dir: &Path) -> anyhow::Result<ExitCode> {
    let mut store = open_store(data_dir)?;
    match action {
        DeltasAction::List { user } => {
            let served = store.served()?.delta_id;
            let users = store.served_users()?;
            for d in store.deltas()? {
                if user.is_some() && d.user != user {
                    continue;
                }
                let on_chain = match &d.user {
                    // A merge serves its members' chains.
                    None => {
                        served.as_deref() == Some(d.id.as_str())
                            || users
                                .iter()
                                .any(|(_, s)| s.delta_id.as_deref() == Some(d.id.as_str()))
                    }
                    Some(u) => users
                        .iter()
                        .any(|(v, s)| v == u && s.delta_id.as_deref() == Some(d.id.as_str())),
                };
                let members = d.members();
                let owner = if members.is_empty() {
                    d.user.as_deref().unwrap_or("(common)").to_owned()
                } else {
                    format!("(merged: {})", members.join(","))
                };
                let mark = if on_chain { "*" } else { " " };
                let gain = d.verdict.as_ref().and_then(|v| v["personal_gain"].as_f64());
                println!(
                    "{mark} {}  {:<11}  user={}  samples={}  gain={}  parent={}",
                    d.id,
                    d.status.as_str(),
                    owner,
                    d.provenance["num_samples"],
                    gain.map_or("-".to_owned(), |g| format!("{g:+.4}")),
                    d.parent.as_deref().unwrap_or("base")
                );
            }
            if served.is_none() {
                println!("serving the base alone");
            }
        }
        DeltasAction::Show { id } => {
            let d = store
                .delta(&id)?
                .with_context(|| format!("no delta `{id}` in {}", store.path().display()))?;
            println!("{}", serde_json::to_string_pretty(&d)?);
        }
        DeltasAction::Promote { id } => {
            hearth::eval::promote_checked(&mut store, &id, "promoted by a person")?;
            println!("serving {id} (a running serve node follows within a second)");
        }
        DeltasAction::Rollback { user } => {
            let alone = if user.is_some() {
                "the common delta"
            } else {
                "the base alone"
            };
            match store.rollback_for(user.as_deref(), "rolled back by a person")? {
                Some(s) => println!(
                    "serving {}{} (a running serve node follows within a second)",
                    s.delta_id.as_deref().unwrap_or(alone),
                    user.as_deref()
                        .map_or(String::new(), |u| format!(" to user `{u}`"))
                ),
                None => println!("nothing to roll back: serving {alone}"),
            }
        }
        DeltasAction::Merge {
            method,
            rank,
            weights,
            density,
            drop,
            seed,
            model,
            judge,
            ids,
        } => {
            use hearth::train::merge::{MergeOptions, merge_stored};
            let opts = MergeOptions {
                weights,
                density,
                drop,
                seed,
                ..MergeOptions::new(method.parse()?, rank)
            };
            let base = load_base(model.as_deref(), data_dir)?;
            let (delta, report) = merge_stored(data_dir, &base, &ids, &opts)?;
            println!(
                "merged {} by {} at rank {rank}: {}  relative residual {:.3e}",
                ids.join(" + "),
                opts.method.as_str(),
                delta.id,
                report.rel_residual
            );
            if judge {
                let mut gate = hearth::eval::Gate::new(
                    std::sync::Arc::new(base),
                    data_dir,
                    None,
                    Default::default(),
                );
                let verdict = gate.judge(&delta)?;
                println!(
                    "{} {}: {}",
                    if verdict.binding.promote {
                        "promoted"
                    } else {
                        "rejected"
                    },
                    delta.id,
                    verdict.binding.reason
                );
            } else {
                println!(
                    "candidate {}: the eval gate judges it when an eval node starts",
                    delta.id
                );
            }
        }
        DeltasAction::Conflict {
            a,
            b,
            model,
            min_cosine,
            max_sign_conflict,
        } => {
            use hearth::train::merge::{ConflictThresholds, conflict_stored, decide};
            let base = load_base(model.as_deref(), data_dir)?;
            let c = conflict_stored(data_dir, &base, &a, &b)?;
            let th = ConflictThresholds {
                min_cosine,
                max_sign_conflict,
            };
            let decision = decide(&c, &th);
            println!(
                "sign_conflict={:.4} cosine={:+.4} -> {}",
                c.sign_conflict,
                c.cosine,
                match decision {
                    hearth::train::merge::Decision::Merge => "merge",
                    hearth::train::merge::Decision::Route => "route",
                }
            );
        }
        DeltasAction::Reconcile {
            users,
            method,
            rank,
            model,
            min_cosine,
            max_sign_conflict,
            min_kept,
            dry_run,
        } => {
            drop(store);
            let opts = hearth::train::reconcile::ReconcileOptions {
                thresholds: hearth::train::merge::ConflictThresholds {
                    min_cosine,
                    max_sign_conflict,
                },
                min_kept,
                method: method.parse()?,
                rank,
                users,
                dry_run,
                seed: 0,
            };
            reconcile_deltas(data_dir, model.as_deref(), &opts)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `hearth deltas reconcile`: runs the decision and prints it line by line.
fn reconcile_deltas(
    data_dir: &Path,
    model: Option<&str>,
    opts: &hearth::train::reconcile::ReconcileOptions,
) -> anyhow::Result<()> {
    use hearth::train::reconcile::{GateSettings, reconcile};
    let base = std::sync::Arc::new(load_base(model, data_dir)?);
    let gate = GateSettings {
        probes: None,
        cfg: Default::default(),
    };
    for line in reconcile(data_dir, base, gate, opts)?.lines() {
        println!("{line}");
    }
    Ok(())
}

/// The base a `hearth deltas` command loads deltas against: `--model`, or the default model.
fn load_base(model: Option<&str>, data_dir: &Path) -> anyhow::Result<hearth::model::Base> {
    let path = hearth::serve::model_path(model, data_dir)?;
    hearth::model::Base::load(&path).with_context(|| format!("loading {}", path.display()))
}

fn report(data_dir: &Path, graph: Option<&Path>, json: bool) -> anyhow::Result<ExitCode> {
    let planted = match graph {
        Some(path) => match load(path)? {
            Some(g) => planted(&g),
            None => return Ok(ExitCode::from(INVALID)),
        },
        None => Vec::new(),
    };
    let store = open_store(data_dir)?;
    let report = hearth::report::Report::build(&store, &planted)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_markdown());
    }
    Ok(ExitCode::SUCCESS)
}

fn purge(user: &str, data_dir: &Path) -> anyhow::Result<ExitCode> {
    let mut store = open_store(data_dir)?;
    let counts = store.purge_user(user)?;
    println!("purged user `{user}`: {}", serde_json::to_string(&counts)?);
    let t = &counts.trained_on;
    for id in &t.retired {
        println!("retired {id}: trained partly on `{user}`'s data");
    }
    for c in &t.restored {
        println!(
            "{} now serves {} instead of {}",
            c.user
                .as_deref()
                .map_or("the common chain".to_owned(), |u| format!(
                    "user `{u}`'s chain"
                )),
            c.delta_id.as_deref().unwrap_or(if c.user.is_some() {
                "the common state"
            } else {
                "the base alone"
            }),
            c.from
        );
    }
    if !t.unknown.is_empty() {
        println!(
            "kept {} common delta(s) recorded before deltas listed whose data trained them: {}",
            t.unknown.len(),
            t.unknown.join(" ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn coordinator(settings: &Path) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(settings)
        .with_context(|| format!("reading {}", settings.display()))?;
    let parsed: hearth::federate::coordinator::CoordinatorSettings =
        hearth::engine::schema::ron_options()
            .from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}:{}: {}", settings.display(), e.span.start, e.code))?;
    let config = parsed.into_config()?;
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let coordinator = hearth::federate::coordinator::Coordinator::start(config)?;
    // Tests and scripts read the bound address from this line (port 0 picks a free one).
    eprintln!("coordinator listening on {scheme}://{}", coordinator.addr);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    install_signal_handler(stop.clone())?;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    coordinator.stop();
    Ok(ExitCode::SUCCESS)
}

fn redact(
    jsonl: &Path,
    spans_out: &Path,
    config: &str,
    tagger_weights: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let mut redactor = hearth::curate::redact::Redactor::new(parse_config(config)?);
    if let Some(p) = tagger_weights {
        let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        let w = hearth::curate::redact::tagger::TaggerWeights::from_safetensors(&bytes)
            .with_context(|| p.display().to_string())?;
        redactor = redactor.with_tagger_weights(w);
    }
    let (reader, writer) = jsonl_files(jsonl, spans_out)?;
    let stats = hearth::curate::redact::predict_jsonl(&redactor, reader, writer)?;
    report_bad_lines(jsonl, &stats.errors);
    eprintln!(
        "{} records, {} spans -> {}",
        stats.records,
        stats.spans,
        spans_out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn secrets(jsonl: &Path, findings_out: &Path, config: &str) -> anyhow::Result<ExitCode> {
    let scanner = hearth::curate::secrets::SecretScanner::new(parse_config(config)?)?;
    let (reader, writer) = jsonl_files(jsonl, findings_out)?;
    let stats = hearth::curate::secrets::findings_jsonl(&scanner, reader, writer)?;
    report_bad_lines(jsonl, &stats.errors);
    eprintln!(
        "{} records, {} flagged, {} findings -> {}",
        stats.records,
        stats.records_flagged,
        stats.findings,
        findings_out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs a graph to its end, then prints each node's and edge's counters and writes the run report.
fn run_graph(
    graph: &Path,
    data_dir: Option<PathBuf>,
    control: Option<String>,
    duration: Option<f64>,
) -> anyhow::Result<ExitCode> {
    let Some(g) = load(graph)? else {
        return Ok(ExitCode::from(INVALID));
    };
    let control = control.or_else(|| g.plan.settings.control.clone());
    let g_data_dir = g.plan.settings.data_dir.clone();
    let planted_values = planted(&g);
    // The serve nodes resolve the same key from the same place; a bad key file stops the run before it starts.
    let key_dir = data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&g_data_dir));
    let api_key = hearth::access::ApiKey::resolve(&key_dir)?;
    if let Some(addr) = &control {
        hearth::access::check_listen(addr, api_key.as_ref())?;
    }
    eprintln!("{}", g.summary());
    let running = runtime::start(g, data_dir.as_deref()).context("starting graph")?;
    let hook = reload_hook(running.reloader());
    let server = match control {
        Some(addr) => {
            let page = hearth::page::PageSource {
                data_dir: data_dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(&g_data_dir)),
                planted: planted_values.clone(),
            };
            let options = hearth::control::ControlOptions {
                key: api_key,
                reload: Some(hook.clone()),
                page: Some(page),
            };
            let server = ControlServer::start_with(&addr, running.status(), options)?;
            eprintln!(
                "control endpoints on http://{}/{{healthz,status,metrics,reload}}; status page at http://{}/",
                server.addr, server.addr
            );
            Some(server)
        }
        None => None,
    };
    install_signal_handler(running.stop_flag())?;
    reload_on_sighup(graph.to_path_buf(), hook)?;
    if let Some(secs) = duration {
        let stop = running.stop_flag();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs_f64(secs.max(0.0)));
            stop.store(true, Ordering::Release);
        });
    }
    let data_dir = data_dir.unwrap_or_else(|| PathBuf::from(&g_data_dir));
    let progress = spawn_status_lines(data_dir.clone(), running.stop_flag(), running.status());
    let report = running.wait();
    progress.store(true, Ordering::Release);
    if let Some(server) = server {
        server.stop();
    }
    write_run_report(&data_dir, &planted_values, &report.status);
    for n in &report.status.nodes {
        eprintln!(
            "node {:<16} {:<12} {:?} processed={} errors={} restarts={}",
            n.id, n.kind, n.state, n.processed, n.errors, n.restarts
        );
    }
    for e in &report.status.edges {
        eprintln!(
            "edge {:<40} pushed={} popped={} dropped={} undeliverable={} blocked={:.3}s",
            e.name, e.pushed, e.popped, e.dropped, e.undeliverable, e.blocked_seconds
        );
    }
    if report.failed_nodes.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for n in &report.status.nodes {
            if let Some(line) = n.trouble() {
                eprintln!("{line}");
            }
        }
        eprintln!(
            "failed nodes: {} (dead letters in {})",
            report.failed_nodes.join(", "),
            report.dead_letters.display()
        );
        Ok(ExitCode::FAILURE)
    }
}

/// The store of a data directory a graph has run in. The commands that read or change it never create one:
/// a mistyped `--data-dir` is an error, not an empty store.
fn open_store(data_dir: &Path) -> anyhow::Result<hearth::store::Store> {
    if !data_dir.join(hearth::store::Store::FILE_NAME).exists() {
        anyhow::bail!(
            "no hearth store in {} (run a graph there first, or pass --data-dir)",
            data_dir.display()
        );
    }
    Ok(hearth::store::Store::open(data_dir)?)
}

/// What the graph's nodes plant on purpose (see `ActorFactory::planted`).
fn planted(g: &Graph) -> Vec<String> {
    g.plan
        .nodes
        .iter()
        .flat_map(|n| n.factory.planted())
        .collect()
}

/// Prints a status line every ten seconds while the graph runs: the three loops (if the graph writes a
/// store), then every node that has failed or is erroring, with its last error. The returned flag stops it.
fn spawn_status_lines(
    data_dir: PathBuf,
    graph_stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    status: std::sync::Arc<hearth::engine::runtime::RunStatus>,
) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let _ = std::thread::Builder::new()
        .name("status-lines".to_owned())
        .spawn(move || {
            let mut last = std::time::Instant::now();
            while !flag.load(Ordering::Acquire) && !graph_stop.load(Ordering::Acquire) {
                std::thread::sleep(std::time::Duration::from_millis(200));
                if last.elapsed() < std::time::Duration::from_secs(10) {
                    continue;
                }
                last = std::time::Instant::now();
                let nodes = status.snapshot();
                let report = data_dir
                    .join(hearth::store::Store::FILE_NAME)
                    .exists()
                    .then(|| {
                        hearth::store::Store::open(&data_dir)
                            .and_then(|s| hearth::report::Report::build(&s, &[]))
                    });
                match report {
                    Some(Ok(r)) => eprintln!("[status] {}", r.with_nodes(&nodes).status_line()),
                    // Without a store (or while it cannot be read), the nodes in trouble still show.
                    _ => {
                        if let Some(line) = hearth::report::troubled_nodes(&nodes.nodes) {
                            eprintln!("[status] {line}");
                        }
                    }
                }
            }
        });
    done
}

/// The run report of a graph that wrote to the store, with the nodes that failed or had errors: printed,
/// and written to `DATA_DIR/report.md` and `report.json` (atomically).
fn write_run_report(
    data_dir: &Path,
    planted: &[String],
    status: &hearth::engine::runtime::StatusSnapshot,
) {
    if !data_dir.join(hearth::store::Store::FILE_NAME).exists() {
        return;
    }
    let report = hearth::store::Store::open(data_dir)
        .and_then(|s| hearth::report::Report::build(&s, planted))
        .map(|r| r.with_nodes(status));
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("run report unavailable: {e}");
            return;
        }
    };
    let markdown = report.to_markdown();
    eprint!("{markdown}");
    let write = |name: &str, bytes: &[u8]| hearth::files::atomic_write(&data_dir.join(name), bytes);
    let json = serde_json::to_vec_pretty(&report).unwrap_or_default();
    if let Err(e) =
        write("report.md", markdown.as_bytes()).and_then(|_| write("report.json", &json))
    {
        eprintln!("cannot write the run report to {}: {e}", data_dir.display());
    } else {
        eprintln!("report written to {}", data_dir.join("report.md").display());
    }
}

/// Validates graph text and applies it to the running graph.
fn reload_hook(reloader: hearth::engine::Reloader<hearth::message::Message>) -> ReloadHook {
    std::sync::Arc::new(move |text: &str| match ActorKind::graph(text) {
        Err(errors) => Err(ReloadRefused::Invalid(errors.iter().map(located).collect())),
        Ok(g) => reloader
            .reload(g)
            .map(|summary| summary.to_string())
            .map_err(|e| ReloadRefused::Failed(e.to_string())),
    })
}

/// `line:col: error: message`, as a graph file's errors are printed after the file's name.
fn located(e: &GraphError) -> String {
    match e.at {
        Some(at) => format!("{at}: error: {}", e.message),
        None => format!("error: {}", e.message),
    }
}

/// Prints an error from [`located`] after the graph file's name.
fn print_located(path: &Path, located: &str) {
    if located.starts_with("error") {
        eprintln!("{}: {located}", path.display());
    } else {
        eprintln!("{}:{located}", path.display());
    }
}

/// SIGHUP re-reads the graph file the run started with and reloads it; the outcome goes to stderr.
fn reload_on_sighup(graph: PathBuf, hook: ReloadHook) -> anyhow::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])?;
    std::thread::Builder::new()
        .name("sighup".to_owned())
        .spawn(move || {
            for _ in signals.forever() {
                let outcome = std::fs::read_to_string(&graph)
                    .map_err(|e| ReloadRefused::Failed(format!("reading the graph file: {e}")))
                    .and_then(|text| hook(&text));
                let path = graph.display();
                match outcome {
                    Ok(summary) => eprintln!("SIGHUP: {path}: {summary}"),
                    Err(ReloadRefused::Invalid(errors)) => {
                        for e in &errors {
                            print_located(&graph, e);
                        }
                        eprintln!(
                            "SIGHUP: {path}: {} error(s); still running the old graph",
                            errors.len()
                        );
                    }
                    Err(ReloadRefused::Failed(why)) => eprintln!("SIGHUP: {path}: {why}"),
                }
            }
        })?;
    Ok(())
}

/// `hearth reload`: validates GRAPH here, then posts it to the running graph's control port.
fn reload_graph(
    graph: &Path,
    control: Option<String>,
    data_dir: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(graph).with_context(|| format!("reading {}", graph.display()))?;
    let settings = match ActorKind::graph(&text) {
        Ok(g) => g.plan.settings,
        Err(errors) => {
            print_errors(graph, &errors);
            return Ok(ExitCode::from(INVALID));
        }
    };
    let Some(addr) = control.or(settings.control) else {
        anyhow::bail!(
            "{}: no `settings.control` address to reach the running graph; pass --control",
            graph.display()
        );
    };
    let data_dir = data_dir.unwrap_or_else(|| PathBuf::from(&settings.data_dir));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut request = agent
        .post(format!("http://{addr}/reload"))
        .content_type("application/json");
    if let Some(key) = client_key(&data_dir)? {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let body = serde_json::json!({ "graph": text }).to_string();
    let mut response = request
        .send(&body)
        .with_context(|| format!("posting the graph to http://{addr}/reload"))?;
    let status = response.status().as_u16();
    let answer = response.body_mut().read_to_string().unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&answer).unwrap_or_default();
    match (status, &json) {
        (200, _) => {
            eprintln!("{}", json["reloaded"].as_str().unwrap_or(&answer));
            Ok(ExitCode::SUCCESS)
        }
        (400, serde_json::Value::Object(o)) if o.contains_key("invalid") => {
            let errors = o["invalid"].as_array().cloned().unwrap_or_default();
            for e in &errors {
                print_located(graph, e.as_str().unwrap_or_default());
            }
            eprintln!(
                "{}: {} error(s); the running graph is unchanged",
                graph.display(),
                errors.len()
            );
            Ok(ExitCode::from(INVALID))
        }
        (401, _) => anyhow::bail!(
            "http://{addr}/reload wants the API key: set {} or keep it in {} (mode 600)",
            hearth::access::KEY_ENV,
            data_dir.join(hearth::access::KEY_FILE).display()
        ),
        (409, _) => {
            eprintln!(
                "reload refused: {}",
                json["failed"].as_str().unwrap_or(&answer)
            );
            Ok(ExitCode::FAILURE)
        }
        _ => anyhow::bail!("http://{addr}/reload answered {status}: {answer}"),
    }
}

/// The API key a client sends: HEARTH_API_KEY, else the data directory's key file, as the server reads them.
fn client_key(data_dir: &Path) -> anyhow::Result<Option<String>> {
    if let Ok(key) = std::env::var(hearth::access::KEY_ENV) {
        return Ok(Some(key.trim().to_owned()));
    }
    let file = data_dir.join(hearth::access::KEY_FILE);
    if !file.exists() {
        return Ok(None);
    }
    Ok(Some(
        hearth::files::read_private_file(&file)?.trim().to_owned(),
    ))
}

/// First SIGINT/SIGTERM stops the sources and drains; a second one exits at once.
fn install_signal_handler(
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new()
        .name("signals".to_owned())
        .spawn(move || {
            let mut seen = 0;
            for signal in signals.forever() {
                seen += 1;
                if seen > 1 {
                    eprintln!("second signal: exiting without drain");
                    std::process::exit(130);
                }
                eprintln!("signal {signal}: stopping sources and draining");
                stop.store(true, Ordering::Release);
            }
        })?;
    Ok(())
}
