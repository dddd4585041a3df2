//! One run's numbers: leaks in the admitted set against gold, decisions, speed and the engine's queues.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::stream::Record;
use super::tap::Collected;
use crate::engine::RunReport;
use crate::message::Outcome;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeMetrics {
    pub id: String,
    pub handled: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Time spent in the node's handler over the whole run.
    pub busy_ms: f64,
    /// The most messages waiting at once on any edge into the node.
    pub queue_high_water: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EdgeMetrics {
    pub name: String,
    pub capacity: usize,
    pub high_water: u64,
}

/// Everything one replay of the stream through one variant measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunMetrics {
    pub variant: String,
    pub repeat: usize,
    pub seed: u64,
    pub records: u64,
    pub admitted: u64,
    pub admitted_share: f64,
    /// SHA-256 of the admitted samples' ids in the order they reached the sink: equal digests mean the same
    /// samples admitted in the same order.
    pub admitted_digest: String,
    pub decided: u64,
    /// Records neither admitted nor decided: lost on the way (a dropped edge, a dead letter).
    pub unaccounted: u64,
    pub pii_spans: u64,
    pub pii_span_leaks: u64,
    pub pii_record_leaks: u64,
    pub pii_spans_by_type: BTreeMap<String, u64>,
    pub pii_leaks_by_type: BTreeMap<String, u64>,
    pub secret_spans: u64,
    pub secret_span_leaks: u64,
    pub secret_record_leaks: u64,
    pub unsafe_records: u64,
    pub unsafe_leaks: u64,
    pub unsafe_leaks_by_category: BTreeMap<String, u64>,
    /// Records beyond the first of each duplicate group: what dedup should remove.
    pub duplicate_records: u64,
    /// Admitted records beyond the first admitted of their group.
    pub duplicate_leaks: u64,
    /// Admitted records with any PII or secret span still in them, or labelled unsafe.
    pub leaked_records: u64,
    /// `node | outcome | reason` with the reason's per-sample detail cut off.
    pub decisions: BTreeMap<String, u64>,
    pub node_errors: u64,
    pub wall_seconds: f64,
    pub throughput: f64,
    /// Handler time summed over every node: the work a variant does, which other load on a shared machine
    /// disturbs less than wall time.
    pub handler_ms: f64,
    pub nodes: Vec<NodeMetrics>,
    pub edges: Vec<EdgeMetrics>,
}

impl RunMetrics {
    /// The metrics that must not depend on timing: two identical variants, or one seed run twice, agree on
    /// all of these.
    pub fn counts(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = v.as_object_mut() {
            for timing in ["variant", "wall_seconds", "throughput", "handler_ms"] {
                map.remove(timing);
            }
            if let Some(nodes) = map.get_mut("nodes").and_then(|n| n.as_array_mut()) {
                for n in nodes {
                    if let Some(n) = n.as_object_mut() {
                        n.remove("p50_us");
                        n.remove("p99_us");
                        n.remove("busy_ms");
                        n.remove("queue_high_water");
                    }
                }
            }
            map.remove("edges");
        }
        v
    }
}

/// The reason without what is particular to one sample ("dedup: near duplicate of #12 (J 0.83)" →
/// "dedup: near duplicate"), so decisions group by kind.
pub fn reason_kind(reason: &str) -> String {
    let cut = reason.find(['#', '(']).unwrap_or(reason.len());
    let r = reason[..cut].trim();
    r.strip_suffix(" of").unwrap_or(r).trim().to_owned()
}

/// Nearest-rank percentile of nanosecond timings, in microseconds.
pub fn percentile_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

pub struct RunInput<'a> {
    pub variant: &'a str,
    pub repeat: usize,
    pub seed: u64,
    pub records: &'a [Record],
    pub collected: &'a Collected,
    pub report: &'a RunReport,
    pub timings: Vec<(String, Vec<u64>)>,
    pub wall_seconds: f64,
}

pub fn score(input: RunInput<'_>) -> RunMetrics {
    let records = input.records;
    let by_id: HashMap<&str, &Record> = records.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut m = RunMetrics {
        variant: input.variant.to_owned(),
        repeat: input.repeat,
        seed: input.seed,
        records: records.len() as u64,
        admitted: input.collected.admitted.len() as u64,
        admitted_share: input.collected.admitted.len() as f64 / records.len().max(1) as f64,
        admitted_digest: crate::files::sha256_hex(
            input
                .collected
                .admitted
                .iter()
                .map(|s| s.id.as_str())
                .collect::<Vec<_>>()
                .join("\n")
                .as_bytes(),
        ),
        decided: input.collected.decisions.len() as u64,
        unaccounted: 0,
        pii_spans: 0,
        pii_span_leaks: 0,
        pii_record_leaks: 0,
        pii_spans_by_type: BTreeMap::new(),
        pii_leaks_by_type: BTreeMap::new(),
        secret_spans: 0,
        secret_span_leaks: 0,
        secret_record_leaks: 0,
        unsafe_records: 0,
        unsafe_leaks: 0,
        unsafe_leaks_by_category: BTreeMap::new(),
        duplicate_records: 0,
        duplicate_leaks: 0,
        leaked_records: 0,
        decisions: BTreeMap::new(),
        node_errors: input.report.status.nodes.iter().map(|n| n.errors).sum(),
        wall_seconds: input.wall_seconds,
        throughput: records.len() as f64 / input.wall_seconds.max(1e-9),
        handler_ms: 0.0,
        nodes: Vec::new(),
        edges: Vec::new(),
    };
    m.unaccounted = m.records.saturating_sub(m.admitted + m.decided);

    let mut group_sizes: HashMap<&str, u64> = HashMap::new();
    for r in records {
        m.pii_spans += r.pii.len() as u64;
        for s in &r.pii {
            *m.pii_spans_by_type.entry(s.kind.clone()).or_default() += 1;
        }
        m.secret_spans += r.secrets.len() as u64;
        m.unsafe_records += u64::from(!r.unsafe_labels.is_empty());
        if let Some(g) = &r.dup_group {
            *group_sizes.entry(g.as_str()).or_default() += 1;
        }
    }
    m.duplicate_records = group_sizes.values().map(|n| n - 1).sum();

    let mut admitted_groups: HashMap<&str, u64> = HashMap::new();
    for sample in &input.collected.admitted {
        let Some(record) = by_id.get(sample.id.as_str()) else {
            continue;
        };
        let text = sample.content.texts().join("\n");
        let pii_leaks: Vec<&str> = record
            .pii
            .iter()
            .filter(|s| !s.value.is_empty() && text.contains(&s.value))
            .map(|s| s.kind.as_str())
            .collect();
        for kind in &pii_leaks {
            *m.pii_leaks_by_type.entry((*kind).to_owned()).or_default() += 1;
        }
        m.pii_span_leaks += pii_leaks.len() as u64;
        m.pii_record_leaks += u64::from(!pii_leaks.is_empty());
        let secret_leaks = record
            .secrets
            .iter()
            .filter(|s| !s.value.is_empty() && text.contains(&s.value))
            .count() as u64;
        m.secret_span_leaks += secret_leaks;
        m.secret_record_leaks += u64::from(secret_leaks > 0);
        if !record.unsafe_labels.is_empty() {
            m.unsafe_leaks += 1;
            for c in &record.unsafe_labels {
                *m.unsafe_leaks_by_category.entry(c.clone()).or_default() += 1;
            }
        }
        m.leaked_records += u64::from(
            !pii_leaks.is_empty() || secret_leaks > 0 || !record.unsafe_labels.is_empty(),
        );
        if let Some(g) = &record.dup_group {
            let n = admitted_groups.entry(g.as_str()).or_default();
            m.duplicate_leaks += u64::from(*n > 0);
            *n += 1;
        }
    }

    for d in &input.collected.decisions {
        let outcome = match d.outcome {
            Outcome::Dropped => "dropped",
            Outcome::Quarantined => "quarantined",
        };
        let key = format!("{} | {outcome} | {}", d.node, reason_kind(&d.reason));
        *m.decisions.entry(key).or_default() += 1;
    }

    let edges = &input.report.status.edges;
    m.edges = edges
        .iter()
        .map(|e| EdgeMetrics {
            name: e.name.clone(),
            capacity: e.capacity,
            high_water: e.max_depth,
        })
        .collect();
    for (id, mut times) in input.timings {
        times.sort_unstable();
        let into = format!("->{id}.");
        let queue_high_water = edges
            .iter()
            .filter(|e| e.name.contains(&into))
            .map(|e| e.max_depth)
            .max()
            .unwrap_or(0);
        let busy_ms = times.iter().sum::<u64>() as f64 / 1e6;
        m.handler_ms += busy_ms;
        m.nodes.push(NodeMetrics {
            busy_ms,
            handled: times.len() as u64,
            p50_us: percentile_us(&times, 50.0),
            p99_us: percentile_us(&times, 99.0),
            queue_high_water,
            id,
        });
    }
    m
}
