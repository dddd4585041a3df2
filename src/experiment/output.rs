//! An experiment's results as files: CSV (one row per run, per node, per decision kind, per leak type), JSON,
//! a markdown table of means with their spread across repeats, and SVG plots.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::plots::{Bars, grouped_bars};
use super::{ExperimentError, Results, RunMetrics};

/// A metric's mean and range over a variant's repeats.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return Spread {
                mean: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        Spread {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

type Scalar = fn(&RunMetrics) -> f64;

/// The per-run numbers that the CSV and the summary carry, by column name.
pub const SCALARS: &[(&str, Scalar)] = &[
    ("admitted", |m| m.admitted as f64),
    ("admitted_share", |m| m.admitted_share),
    ("decided", |m| m.decided as f64),
    ("unaccounted", |m| m.unaccounted as f64),
    ("pii_spans", |m| m.pii_spans as f64),
    ("pii_span_leaks", |m| m.pii_span_leaks as f64),
    ("pii_record_leaks", |m| m.pii_record_leaks as f64),
    ("secret_spans", |m| m.secret_spans as f64),
    ("secret_span_leaks", |m| m.secret_span_leaks as f64),
    ("secret_record_leaks", |m| m.secret_record_leaks as f64),
    ("unsafe_records", |m| m.unsafe_records as f64),
    ("unsafe_leaks", |m| m.unsafe_leaks as f64),
    ("duplicate_records", |m| m.duplicate_records as f64),
    ("duplicate_leaks", |m| m.duplicate_leaks as f64),
    ("leaked_records", |m| m.leaked_records as f64),
    ("node_errors", |m| m.node_errors as f64),
    ("wall_seconds", |m| m.wall_seconds),
    ("throughput", |m| m.throughput),
    ("handler_ms", |m| m.handler_ms),
];

/// One variant's metrics over its repeats.
#[derive(Debug, Clone, Serialize)]
pub struct VariantSummary {
    pub variant: String,
    pub scalars: Vec<(String, Spread)>,
    /// Per node: handled, p50 and p99 latency (µs), queue high-water mark.
    pub nodes: Vec<(String, Spread, Spread, Spread, Spread)>,
}

impl VariantSummary {
    pub fn get(&self, name: &str) -> Spread {
        self.scalars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| *s)
            .unwrap_or(Spread::of([]))
    }
}

pub fn summarize(results: &Results) -> Vec<VariantSummary> {
    results
        .variants
        .iter()
        .map(|v| {
            let runs: Vec<&RunMetrics> = results.of(v).collect();
            let scalars = SCALARS
                .iter()
                .map(|(name, f)| (name.to_string(), Spread::of(runs.iter().map(|m| f(m)))))
                .collect();
            let ids: Vec<String> = runs
                .first()
                .map(|r| r.nodes.iter().map(|n| n.id.clone()).collect())
                .unwrap_or_default();
            let nodes = ids
                .into_iter()
                .map(|id| {
                    let of = |f: fn(&super::score::NodeMetrics) -> f64| {
                        Spread::of(
                            runs.iter()
                                .flat_map(|r| r.nodes.iter().filter(|n| n.id == id).map(f)),
                        )
                    };
                    (
                        id.clone(),
                        of(|n| n.handled as f64),
                        of(|n| n.p50_us),
                        of(|n| n.p99_us),
                        of(|n| n.queue_high_water as f64),
                    )
                })
                .collect();
            VariantSummary {
                variant: v.clone(),
                scalars,
                nodes,
            }
        })
        .collect()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The runs as CSV, one row per run.
pub fn runs_csv(results: &Results) -> String {
    let mut out = String::from("variant,repeat,seed,records");
    for (name, _) in SCALARS {
        out.push(',');
        out.push_str(name);
    }
    out.push('\n');
    for m in &results.runs {
        let _ = write!(
            out,
            "{},{},{},{}",
            csv_field(&m.variant),
            m.repeat,
            m.seed,
            m.records
        );
        for (_, f) in SCALARS {
            let _ = write!(out, ",{}", f(m));
        }
        out.push('\n');
    }
    out
}

fn nodes_csv(results: &Results) -> String {
    let mut out = String::from("variant,repeat,node,handled,p50_us,p99_us,queue_high_water\n");
    for m in &results.runs {
        for n in &m.nodes {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{}",
                csv_field(&m.variant),
                m.repeat,
                csv_field(&n.id),
                n.handled,
                n.p50_us,
                n.p99_us,
                n.queue_high_water
            );
        }
    }
    out
}

fn decisions_csv(results: &Results) -> String {
    let mut out = String::from("variant,repeat,node,outcome,reason,count\n");
    for m in &results.runs {
        for (key, count) in &m.decisions {
            let parts: Vec<&str> = key.splitn(3, " | ").collect();
            let _ = writeln!(
                out,
                "{},{},{},{}",
                csv_field(&m.variant),
                m.repeat,
                parts
                    .iter()
                    .map(|p| csv_field(p))
                    .collect::<Vec<_>>()
                    .join(","),
                count
            );
        }
    }
    out
}

fn leaks_csv(results: &Results) -> String {
    let mut out = String::from("variant,repeat,label,gold,leaks\n");
    for m in &results.runs {
        for (kind, gold) in &m.pii_spans_by_type {
            let leaks = m.pii_leaks_by_type.get(kind).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "{},{},pii:{},{gold},{leaks}",
                csv_field(&m.variant),
                m.repeat,
                csv_field(kind)
            );
        }
        for (cat, leaks) in &m.unsafe_leaks_by_category {
            let _ = writeln!(
                out,
                "{},{},unsafe:{},,{leaks}",
                csv_field(&m.variant),
                m.repeat,
                csv_field(cat)
            );
        }
    }
    out
}

fn fmt_spread(s: Spread, digits: usize) -> String {
    if (s.max - s.min).abs() < 1e-12 {
        format!("{:.digits$}", s.mean)
    } else {
        format!(
            "{:.digits$} [{:.digits$}–{:.digits$}]",
            s.mean, s.min, s.max
        )
    }
}

/// The markdown tables: headline metrics, PII leaks by type, decisions by node and reason, per-node latency
/// and queues. Numbers are means over repeats; `[min–max]` follows where repeats differ.
pub fn markdown(results: &Results, summary: &[VariantSummary]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## {}\n\n{} records from `{}`, {} repeat(s), seed {}{}.\n",
        results.name,
        results.records,
        results.stream,
        results.repeats,
        results.seed,
        if results.shuffle {
            " (shuffled per repeat)"
        } else {
            ""
        }
    );
    md.push_str(
        "| variant | admitted share | PII span leaks | PII record leaks | secret leaks | unsafe leaks | duplicate leaks | leaked records | records/s | handler ms |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in summary {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.variant,
            fmt_spread(s.get("admitted_share"), 3),
            fmt_spread(s.get("pii_span_leaks"), 1),
            fmt_spread(s.get("pii_record_leaks"), 1),
            fmt_spread(s.get("secret_span_leaks"), 1),
            fmt_spread(s.get("unsafe_leaks"), 1),
            fmt_spread(s.get("duplicate_leaks"), 1),
            fmt_spread(s.get("leaked_records"), 1),
            fmt_spread(s.get("throughput"), 0),
            fmt_spread(s.get("handler_ms"), 0),
        );
    }
    if let Some(first) = results.runs.first() {
        let _ = writeln!(
            md,
            "\nGold in the stream: {} PII spans, {} secrets, {} unsafe records, {} duplicates beyond the first of their group.",
            first.pii_spans, first.secret_spans, first.unsafe_records, first.duplicate_records
        );
    }

    let types: BTreeSet<&String> = results
        .runs
        .iter()
        .flat_map(|r| r.pii_spans_by_type.keys())
        .collect();
    if !types.is_empty() {
        md.push_str("\n### PII span leaks by type (mean)\n\n| variant |");
        for t in &types {
            let _ = write!(md, " {t} |");
        }
        md.push_str("\n|---|");
        md.push_str(&"---|".repeat(types.len()));
        md.push('\n');
        for v in &results.variants {
            let _ = write!(md, "| {v} |");
            for t in &types {
                let s = Spread::of(
                    results
                        .of(v)
                        .map(|r| r.pii_leaks_by_type.get(*t).copied().unwrap_or(0) as f64),
                );
                let _ = write!(md, " {} |", fmt_spread(s, 1));
            }
            md.push('\n');
        }
    }

    let keys: BTreeSet<&String> = results
        .runs
        .iter()
        .flat_map(|r| r.decisions.keys())
        .collect();
    if !keys.is_empty() {
        md.push_str("\n### Decisions by node and reason (mean)\n\n| node / outcome / reason |");
        for v in &results.variants {
            let _ = write!(md, " {v} |");
        }
        md.push_str("\n|---|");
        md.push_str(&"---|".repeat(results.variants.len()));
        md.push('\n');
        for k in &keys {
            let _ = write!(md, "| {} |", k.replace('|', "/"));
            for v in &results.variants {
                let s = Spread::of(
                    results
                        .of(v)
                        .map(|r| r.decisions.get(*k).copied().unwrap_or(0) as f64),
                );
                let _ = write!(md, " {} |", fmt_spread(s, 1));
            }
            md.push('\n');
        }
    }

    md.push_str(
        "\n### Per node: handler latency and queue high-water mark\n\n| variant | node | handled | p50 µs | p99 µs | queue high-water |\n|---|---|---|---|---|---|\n",
    );
    for s in summary {
        for (id, handled, p50, p99, hwm) in &s.nodes {
            let _ = writeln!(
                md,
                "| {} | {id} | {} | {} | {} | {} |",
                s.variant,
                fmt_spread(*handled, 0),
                fmt_spread(*p50, 1),
                fmt_spread(*p99, 1),
                fmt_spread(*hwm, 0)
            );
        }
    }
    if !results.downstream.is_empty() {
        md.push_str(&downstream_markdown(results));
    }
    md
}

/// One delta per variant: what it trained on, and the gate's legs against the bare base.
fn downstream_markdown(results: &Results) -> String {
    let mut md = String::from(
        "\n### Downstream: one delta per variant (first repeat's admitted set), gate legs against the base\n\n\
         | variant | samples | held out | steps | loss first → last | personal gain | gate |\n\
         |---|---:|---:|---:|---|---:|---|\n",
    );
    let loss = |l: Option<f64>| l.map_or("–".to_owned(), |l| format!("{l:.3}"));
    for d in &results.downstream {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} → {} | {:.4} | {} |",
            d.variant,
            d.samples,
            d.held_out,
            d.steps,
            loss(d.first_loss),
            loss(d.last_loss),
            d.personal_gain,
            if d.passed { "pass" } else { "fail" }
        );
    }
    md.push_str("\n| variant | leg | base | candidate | tolerance | passed |\n|---|---|---:|---:|---:|---|\n");
    for d in &results.downstream {
        for l in &d.legs {
            let _ = writeln!(
                md,
                "| {} | {} | {:.4} | {:.4} | {} | {} |",
                d.variant, l.leg, l.baseline, l.candidate, l.tolerance, l.passed
            );
        }
    }
    md
}

/// The gate's legs per variant, one row each.
fn downstream_csv(results: &Results) -> String {
    let mut out = String::from("variant,samples,steps,leg,baseline,candidate,tolerance,passed\n");
    for d in &results.downstream {
        for l in &d.legs {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{}",
                csv_field(&d.variant),
                d.samples,
                d.steps,
                csv_field(&l.leg),
                l.baseline,
                l.candidate,
                l.tolerance,
                l.passed
            );
        }
    }
    out
}

/// The SVG plots by file name: leaks, admitted share, throughput and per-node p99 latency, each bar a mean
/// over repeats with a whisker from the smallest to the largest.
pub fn plots(
    results: &Results,
    summary: &[VariantSummary],
) -> Result<Vec<(String, String)>, String> {
    let variants = &results.variants;
    let series = |names: &[(&str, &str)]| -> Vec<(String, Vec<Spread>)> {
        names
            .iter()
            .map(|(metric, label)| {
                (
                    label.to_string(),
                    summary.iter().map(|s| s.get(metric)).collect(),
                )
            })
            .collect()
    };
    let mut out = vec![(
        "leaks.svg".to_owned(),
        grouped_bars(&Bars {
            title: "Leaks in the admitted set",
            y_desc: "count",
            categories: variants,
            series: &series(&[
                ("pii_span_leaks", "PII spans"),
                ("secret_span_leaks", "secrets"),
                ("unsafe_leaks", "unsafe records"),
                ("duplicate_leaks", "duplicates"),
            ]),
        })?,
    )];
    out.push((
        "admitted.svg".to_owned(),
        grouped_bars(&Bars {
            title: "Admitted share",
            y_desc: "share of records",
            categories: variants,
            series: &series(&[("admitted_share", "admitted")]),
        })?,
    ));
    out.push((
        "throughput.svg".to_owned(),
        grouped_bars(&Bars {
            title: "Throughput",
            y_desc: "records/s",
            categories: variants,
            series: &series(&[("throughput", "records/s")]),
        })?,
    ));
    out.push((
        "handler_time.svg".to_owned(),
        grouped_bars(&Bars {
            title: "Handler time over all nodes",
            y_desc: "ms per run",
            categories: variants,
            series: &series(&[("handler_ms", "handler ms")]),
        })?,
    ));
    let node_ids: Vec<String> = summary
        .iter()
        .flat_map(|s| s.nodes.iter().map(|n| n.0.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let latency: Vec<(String, Vec<Spread>)> = node_ids
        .iter()
        .map(|id| {
            (
                id.clone(),
                summary
                    .iter()
                    .map(|s| {
                        s.nodes
                            .iter()
                            .find(|n| &n.0 == id)
                            .map(|n| n.3)
                            .unwrap_or(Spread::of([]))
                    })
                    .collect(),
            )
        })
        .collect();
    out.push((
        "latency_p99.svg".to_owned(),
        grouped_bars(&Bars {
            title: "Handler latency p99 per node",
            y_desc: "µs",
            categories: variants,
            series: &latency,
        })?,
    ));
    Ok(out)
}

/// Writes `results.{json,md}`, `runs.csv`, `nodes.csv`, `decisions.csv`, `leaks.csv`, `downstream.csv`
/// (with `downstream`) and the plots into
/// `dir`, returning the paths written.
pub fn write(results: &Results, dir: &Path) -> Result<Vec<PathBuf>, ExperimentError> {
    let summary = summarize(results);
    let out_err = |path: &Path, message: String| ExperimentError::Output {
        path: path.to_path_buf(),
        message,
    };
    std::fs::create_dir_all(dir).map_err(|e| out_err(dir, e.to_string()))?;
    #[derive(Serialize)]
    struct Json<'a> {
        #[serde(flatten)]
        results: &'a Results,
        summary: &'a [VariantSummary],
    }
    let json = serde_json::to_string_pretty(&Json {
        results,
        summary: &summary,
    })
    .map_err(|e| out_err(dir, e.to_string()))?;
    let mut files = vec![
        ("results.json".to_owned(), json),
        ("results.md".to_owned(), markdown(results, &summary)),
        ("runs.csv".to_owned(), runs_csv(results)),
        ("nodes.csv".to_owned(), nodes_csv(results)),
        ("decisions.csv".to_owned(), decisions_csv(results)),
        ("leaks.csv".to_owned(), leaks_csv(results)),
    ];
    if !results.downstream.is_empty() {
        files.push(("downstream.csv".to_owned(), downstream_csv(results)));
    }
    files.extend(plots(results, &summary).map_err(|e| out_err(dir, format!("plot: {e}")))?);
    let mut written = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| out_err(&path, e.to_string()))?;
        written.push(path);
    }
    Ok(written)
}
