//! The collapse experiment: cycles in which the training set becomes more and more the model's own served
//! answers, with the eval gate on (a candidate is served only if it passes) and off (every candidate is
//! served). Per cycle it records what is served after the decision: held-out base perplexity, general score,
//! personalisation gain on held-out phrasings of taught facts, and distinct-2 of the served answers.
//!
//! `scripts/collapse.sh` runs both arms and writes `docs/collapse/` (CSV, markdown table, SVG plot).
//!
//!   cargo run --release --example collapse -- run --arm on --out DIR [--model PATH] [--cycles 20] …
//!   cargo run --release --example collapse -- report --out DIR

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use hearth::eval::{Evaluator, GateConfig, PersonalProbe, ProbeSet, Scores, decide, recalls};
use hearth::message::{ChatMessage, Origin, Provenance, Role, Sample, SampleContent};
use hearth::model::{
    GenerateConfig, LoraSet, LoraTarget, Tokenizer, Transformer, encode_chat, generate,
};
use hearth::train::{LoraTrainer, TrainConfig};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs one arm and writes OUT/ARM.csv.
    Run(RunArgs),
    /// Reads OUT/on.csv and OUT/off.csv and writes OUT/collapse.md and OUT/collapse.svg.
    Report {
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum Arm {
    On,
    Off,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::On => "on",
            Arm::Off => "off",
        }
    }
}

#[derive(Parser)]
struct RunArgs {
    /// Gate on: a candidate is served only if the gate passes it; off: every candidate is served.
    #[arg(long, value_enum)]
    arm: Arm,
    #[arg(long)]
    out: PathBuf,
    /// The base (GGUF); default: the default model, fetched once into CACHE/models.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where the default model and the base's self-distilled replay are cached; default: OUT.
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Cycles to run; 0 prepares the model and replay caches only.
    #[arg(long, default_value_t = 20)]
    cycles: usize,
    /// Stops after this many cycles of the schedule (a quick look at a recipe); default: all.
    #[arg(long)]
    first: Option<usize>,
    /// Training samples per cycle; cycle c of C takes round(c/C) of them from the served model's answers.
    #[arg(long, default_value_t = 24)]
    samples: usize,
    /// Optimizer steps per cycle (the default graph's recipe trains 20).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// General probes answered per scoring (the first ones of the shipped set); default: all.
    #[arg(long)]
    general_probes: Option<usize>,
    /// The recipe's learning rate (the default graph's until its recipe runs: 5e-4; now 2.5e-4).
    #[arg(long, default_value_t = 5e-4)]
    learning_rate: f64,
    /// The recipe's replay share (the default graph's until its recipe runs: 0.25; now 0.5).
    #[arg(long, default_value_t = 0.25)]
    replay_fraction: f64,
    /// The recipe's LoRA rank (the default graph's: 8; alpha is twice the rank).
    #[arg(long, default_value_t = 8)]
    rank: usize,
    /// The recipe's rewordings of each taught question (the default graph's: see `prompt_variants`).
    #[arg(long, default_value_t = 0)]
    prompt_variants: usize,
    /// The recipe's replay sequences per micro-batch (the default graph's: see `replay_per_batch`).
    #[arg(long, default_value_t = 1)]
    replay_per_batch: usize,
    /// The recipe's LoRA targets, comma-separated (q,k,v,o,gate,up,down); default: all.
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// Added to every cycle's training seed: the same recipe under other draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Tokens of each served answer.
    #[arg(long, default_value_t = 48)]
    answer_tokens: usize,
}

/// Facts a user teaches: two phrasings trained on, a third held out for the personalisation probe (what the
/// gate reads; never tuned on), a fourth for tuning a recipe (dev recall, printed only).
const FACTS: &[([&str; 4], &str)] = &[
    (
        [
            "What is my dog called?",
            "Remind me of my dog's name.",
            "Do you remember what my dog's name is?",
            "Tell me the name of my dog.",
        ],
        "Your dog is called Biscuit.",
    ),
    (
        [
            "Where do I work?",
            "Which company is my employer?",
            "What is the name of my workplace?",
            "Who do I work for these days?",
        ],
        "You work at the Lindenhof bakery.",
    ),
    (
        [
            "When is my birthday?",
            "What date was I born on?",
            "On which day do I celebrate my birthday?",
            "What day is my birthday?",
        ],
        "Your birthday is on the 3rd of May.",
    ),
    (
        [
            "What is my favourite colour?",
            "Which colour do I like best?",
            "Tell me my favourite colour.",
            "What colour do I love most?",
        ],
        "Your favourite colour is teal.",
    ),
    (
        [
            "Where does my sister live?",
            "In which city is my sister's home?",
            "Which town does my sister live in?",
            "What city is my sister in?",
        ],
        "Your sister Ingrid lives in Tromsø.",
    ),
    (
        [
            "What instrument do I play?",
            "Which instrument am I learning?",
            "What do I practise every evening?",
            "Tell me which instrument I play.",
        ],
        "You play the cello.",
    ),
];

/// What the user asks day to day: the served answers to these become the self-generated share. Written for
/// this experiment, apart from the gate's probes and the replay prompts.
const USER_PROMPTS: &[&str] = &[
    "Give me a tip for sleeping better.",
    "How can I keep basil alive on a windowsill?",
    "Write a short thank-you note to a neighbour.",
    "What should I pack for a weekend hike?",
    "Suggest a quick vegetarian dinner.",
    "How do I remove a coffee stain from a shirt?",
    "Explain what a budget spreadsheet is for.",
    "Give me three ideas for a rainy Sunday.",
    "How do I politely decline an invitation?",
    "What is a good stretch after running?",
    "Suggest a name for a book club.",
    "How do I start learning to draw?",
    "Write a one-line birthday wish for a colleague.",
    "How often should I water a cactus?",
    "What are easy ways to save electricity at home?",
    "Give me a simple breakfast idea with oats.",
    "How do I make my bike chain stop squeaking?",
    "Suggest a gift for someone who likes tea.",
    "How can I focus better while studying?",
    "What is a polite way to ask for a deadline extension?",
    "Recommend a board game for four players.",
    "How do I clean a cast iron pan?",
    "Write a short reminder to pay the rent.",
    "What should I do if my phone battery drains fast?",
];

fn user(q: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::new(Role::User, q.to_owned())]
}

fn sft(id: String, prompt: &str, answer: &str) -> Sample {
    Sample {
        id,
        user: "u".into(),
        // Accepted served answers count as grounded: the share cap on self-generated data does not apply,
        // so only the gate stands between the loop and collapse.
        origin: Origin::Grounded,
        content: SampleContent::Sft {
            prompt: user(prompt),
            response: answer.to_owned(),
        },
        provenance: Provenance::default(),
        created_at_unix_ms: 0,
    }
}

/// Distinct word bigrams over all bigrams of the texts.
fn distinct_2(texts: &[String]) -> f64 {
    let mut seen = HashSet::new();
    let mut total = 0usize;
    for t in texts {
        let words: Vec<&str> = t.split_whitespace().collect();
        for w in words.windows(2) {
            total += 1;
            seen.insert((w[0].to_lowercase(), w[1].to_lowercase()));
        }
    }
    if total == 0 {
        0.0
    } else {
        seen.len() as f64 / total as f64
    }
}

fn served_answers(
    m: &Transformer,
    tok: &Tokenizer,
    lora: Option<&LoraSet>,
    tokens: usize,
    seed: u64,
) -> Result<Vec<String>> {
    USER_PROMPTS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ids = encode_chat(tok, &user(p), true)?.ids;
            // Served answers are sampled, as the product's defaults serve them.
            let cfg = GenerateConfig {
                temperature: 0.7,
                top_p: Some(0.95),
                seed: seed * 1000 + i as u64,
                ..GenerateConfig::greedy(tok, tokens)
            };
            Ok(generate(m, tok, &ids, lora, &cfg, |_| true)?.text)
        })
        .collect()
}

struct Row {
    cycle: usize,
    self_share: f64,
    promoted: bool,
    served: Scores,
    candidate: Scores,
    distinct_2: f64,
    seconds: f64,
}

const HEADER: &str = "arm,cycle,self_share,promoted,base_perplexity,general_correct,general_total,\
personal_gain,distinct_2,candidate_base_perplexity,candidate_general_correct,candidate_personal_gain,seconds";

fn run(args: RunArgs) -> Result<()> {
    hearth::model::configure_candle_threads();
    std::fs::create_dir_all(&args.out)?;
    let cache = args.cache.clone().unwrap_or_else(|| args.out.clone());
    let model = match &args.model {
        Some(p) => p.clone(),
        None => hearth::serve::default_model::ensure(&cache)?,
    };
    let (m, tok) =
        hearth::model::load(&model).with_context(|| format!("loading {}", model.display()))?;
    let sha = hearth::files::sha256_file(&model)?;
    let work = tempfile::tempdir()?;
    let (probes, _) = ProbeSet::frozen_for_base(work.path(), &sha, None)?;
    let mut cfg = GateConfig {
        general_churn_z: 1.0,
        max_new_tokens: 24,
        ..GateConfig::default()
    };
    if let Some(n) = args.general_probes {
        cfg.general_probes = n;
    }
    let ev = Evaluator::new(&m, &tok, &probes, &cfg);
    let personal: Vec<PersonalProbe> = FACTS
        .iter()
        .map(|(q, a)| PersonalProbe {
            prompt: user(q[2]),
            answer: (*a).to_owned(),
        })
        .collect();
    let targets = args
        .targets
        .iter()
        .map(|t| {
            LoraTarget::ALL
                .into_iter()
                .find(|l| l.peft_name().trim_end_matches("_proj") == t.as_str())
                .with_context(|| format!("--targets: unknown projection {t:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let dev: Vec<(Vec<u32>, &str, &str)> = FACTS
        .iter()
        .map(|(q, a)| Ok((encode_chat(&tok, &user(q[3]), true)?.ids, q[3], *a)))
        .collect::<Result<_>>()?;
    let dev_recalled = |lora: Option<&LoraSet>| -> Result<usize> {
        let mut n = 0;
        for (ids, q, a) in &dev {
            let g = GenerateConfig::greedy(&tok, cfg.general_max_tokens);
            let said = generate(&m, &tok, ids, lora, &g, |_| true)?.text;
            n += usize::from(recalls(&said, a, q));
        }
        Ok(n)
    };
    let recipe = TrainConfig {
        seed: 1,
        rank: args.rank,
        prompt_variants: args.prompt_variants,
        replay_per_batch: args.replay_per_batch,
        targets: if targets.is_empty() {
            LoraTarget::ALL.to_vec()
        } else {
            targets
        },
        alpha: 2.0 * args.rank as f64,
        learning_rate: args.learning_rate,
        warmup_steps: 4,
        steps: args.steps,
        batch_size: 4,
        max_seq_len: 96,
        dpo_sft_weight: 1.0,
        replay_fraction: args.replay_fraction,
        replay_builtin: true,
        replay_self_distilled: 64,
        holdout_fraction: 0.0,
        ..TrainConfig::default()
    };
    let replay = hearth::train::replay::self_distilled(&m, &tok, &sha, 64, &cache)?;
    if args.cycles == 0 {
        // Preparation only: the model and the replay are cached for arms that run side by side.
        return Ok(());
    }
    let t0 = Instant::now();
    let base_scores = ev.score(None, &personal)?;
    eprintln!(
        "[{}] base: perplexity {:.3}, general {}/{}, personal nll {:.3}, recalled {}/{}, dev recalled {} \
         ({:.0} s)",
        args.arm.name(),
        base_scores.base_perplexity,
        base_scores.general_correct,
        base_scores.general_total,
        base_scores.personal_nll,
        base_scores.personal_recalled,
        personal.len(),
        dev_recalled(None)?,
        t0.elapsed().as_secs_f64()
    );
    let csv_path = args.out.join(format!("{}.csv", args.arm.name()));
    let mut csv = format!("{HEADER}\n");
    let mut served: Option<LoraSet> = None;
    let mut served_scores = base_scores.clone();
    let mut answers = served_answers(&m, &tok, None, args.answer_tokens, 0)?;
    let base_row = Row {
        cycle: 0,
        self_share: 0.0,
        promoted: false,
        served: base_scores.clone(),
        candidate: base_scores.clone(),
        distinct_2: distinct_2(&answers),
        seconds: t0.elapsed().as_secs_f64(),
    };
    push_row(&mut csv, args.arm, &base_row, &base_scores);
    std::fs::write(&csv_path, &csv)?;
    for cycle in 1..=args.cycles.min(args.first.unwrap_or(usize::MAX)) {
        let t = Instant::now();
        let self_share = cycle as f64 / args.cycles as f64;
        let n_self = (args.samples as f64 * self_share).round() as usize;
        let mut data = Vec::with_capacity(args.samples);
        for i in 0..args.samples - n_self {
            let (q, a) = &FACTS[i % FACTS.len()];
            data.push(sft(format!("c{cycle}-h{i}"), q[(i / FACTS.len()) % 2], a));
        }
        for i in 0..n_self {
            let k = (cycle * 7 + i) % USER_PROMPTS.len();
            data.push(sft(format!("c{cycle}-s{i}"), USER_PROMPTS[k], &answers[k]));
        }
        let mut trainer = LoraTrainer::new(
            &m,
            &tok,
            TrainConfig {
                seed: cycle as u64 + args.seed,
                ..recipe.clone()
            },
            served.as_ref(),
        )?;
        trainer.add_replay_turns(&replay);
        trainer.train_cycle(&data, |_| {})?;
        let candidate = trainer.adapter()?;
        drop(trainer);
        let cand_scores = ev.score(Some(&candidate), &personal)?;
        let cand_dev = dev_recalled(Some(&candidate))?;
        let promoted = match args.arm {
            Arm::On => decide(&cfg, &served_scores, &cand_scores).1,
            Arm::Off => true,
        };
        if promoted {
            served = Some(candidate);
            served_scores = cand_scores.clone();
        }
        answers = served_answers(&m, &tok, served.as_ref(), args.answer_tokens, cycle as u64)?;
        let row = Row {
            cycle,
            self_share,
            promoted,
            served: served_scores.clone(),
            candidate: cand_scores,
            distinct_2: distinct_2(&answers),
            seconds: t.elapsed().as_secs_f64(),
        };
        eprintln!(
            "[{}] cycle {cycle}: self {:.2}, {} ; served perplexity {:.3}, general {}/{}, gain {:+.3}, \
             distinct-2 {:.3}; candidate general {}, perplexity {:.3}, recalled {}/{}, dev recalled {} \
             ({:.0} s)",
            args.arm.name(),
            self_share,
            if promoted { "promoted" } else { "rejected" },
            row.served.base_perplexity,
            row.served.general_correct,
            row.served.general_total,
            base_scores.personal_nll - row.served.personal_nll,
            row.distinct_2,
            row.candidate.general_correct,
            row.candidate.base_perplexity,
            row.candidate.personal_recalled,
            personal.len(),
            cand_dev,
            row.seconds
        );
        push_row(&mut csv, args.arm, &row, &base_scores);
        hearth::files::atomic_write(&csv_path, csv.as_bytes())?;
    }
    Ok(())
}

fn push_row(csv: &mut String, arm: Arm, r: &Row, base: &Scores) {
    csv.push_str(&format!(
        "{},{},{:.3},{},{:.4},{},{},{:.4},{:.4},{:.4},{},{:.4},{:.1}\n",
        arm.name(),
        r.cycle,
        r.self_share,
        r.promoted,
        r.served.base_perplexity,
        r.served.general_correct,
        r.served.general_total,
        base.personal_nll - r.served.personal_nll,
        r.distinct_2,
        r.candidate.base_perplexity,
        r.candidate.general_correct,
        base.personal_nll - r.candidate.personal_nll,
        r.seconds
    ));
}

/// One CSV row, by column name.
struct Rec(Vec<(String, String)>);

impl Rec {
    fn f(&self, k: &str) -> Result<f64> {
        let v = self
            .0
            .iter()
            .find(|(h, _)| h == k)
            .map(|(_, v)| v)
            .with_context(|| format!("no column {k}"))?;
        match v.as_str() {
            "true" => Ok(1.0),
            "false" => Ok(0.0),
            _ => v.parse().with_context(|| format!("column {k}: {v:?}")),
        }
    }
}

fn read_csv(path: &Path) -> Result<Vec<Rec>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .context("empty CSV")?
        .split(',')
        .map(str::to_owned)
        .collect();
    Ok(lines
        .map(|l| {
            Rec(header
                .iter()
                .cloned()
                .zip(l.split(',').map(str::to_owned))
                .collect())
        })
        .collect())
}

fn report(out: &Path) -> Result<()> {
    let on = read_csv(&out.join("on.csv"))?;
    let off = read_csv(&out.join("off.csv"))?;
    if on.is_empty() || off.is_empty() {
        bail!("no rows in {}", out.display());
    }
    let mut md = String::from(
        "| cycle | self share | gate on: served? | perplexity | general | gain | distinct-2 | \
         gate off: perplexity | general | gain | distinct-2 |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (a, b) in on.iter().zip(&off) {
        md += &format!(
            "| {} | {:.2} | {} | {:.2} | {} | {:+.3} | {:.3} | {:.2} | {} | {:+.3} | {:.3} |\n",
            a.f("cycle")?,
            a.f("self_share")?,
            if a.f("cycle")? == 0.0 {
                "base"
            } else if a.f("promoted")? > 0.0 {
                "promoted"
            } else {
                "rejected"
            },
            a.f("base_perplexity")?,
            a.f("general_correct")?,
            a.f("personal_gain")?,
            a.f("distinct_2")?,
            b.f("base_perplexity")?,
            b.f("general_correct")?,
            b.f("personal_gain")?,
            b.f("distinct_2")?,
        );
    }
    std::fs::write(out.join("collapse.md"), md)?;
    plot(out, &on, &off)
}

fn plot(out: &Path, on: &[Rec], off: &[Rec]) -> Result<()> {
    use plotters::prelude::*;
    let path = out.join("collapse.svg");
    let root = SVGBackend::new(&path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 2));
    let metrics = [
        (
            "base_perplexity",
            "held-out base perplexity (lower is better)",
        ),
        ("general_correct", "general probes answered right"),
        ("personal_gain", "personalisation gain (nats/token)"),
        ("distinct_2", "distinct-2 of served answers"),
    ];
    let cycles = on.len().max(off.len()) as f64;
    for (panel, (key, title)) in panels.iter().zip(metrics) {
        let series = |rows: &[Rec]| -> Result<Vec<(f64, f64)>> {
            rows.iter()
                .map(|r| Ok((r.f("cycle")?, r.f(key)?)))
                .collect()
        };
        let (a, b) = (series(on)?, series(off)?);
        let ys = a.iter().chain(&b).map(|p| p.1);
        let (lo, hi) = ys.fold((f64::MAX, f64::MIN), |(l, h), y| (l.min(y), h.max(y)));
        let pad = ((hi - lo) * 0.1).max(1e-3);
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..cycles, (lo - pad)..(hi + pad))?;
        chart.configure_mesh().x_desc("cycle").draw()?;
        chart
            .draw_series(LineSeries::new(a, BLUE.stroke_width(2)))?
            .label("gate on")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(b, RED.stroke_width(2)))?
            .label("gate off")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run(args),
        Command::Report { out } => report(&out),
    }
}
