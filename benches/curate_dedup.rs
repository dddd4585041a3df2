//! Dedup throughput and quality on generated short records.
//!
//! First a single timed pass over 100k records (the figure `scripts/bench_dedup.sh` compares with
//! datasketch, which reads the same records from the JSONL written here), then criterion
//! measurements. `HEARTH_BENCH_QUICK=1` skips the criterion part (the script sets it unless told otherwise).

use std::hint::black_box;
use std::io::Write;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use hearth::curate::dedup::{DedupConfig, Deduper, Origin, near_dup_corpus};

const N: usize = 100_000;
const SEED: u64 = 42;

fn single_pass() {
    let recs = near_dup_corpus(N, SEED);
    let path = std::env::var("HEARTH_DEDUP_CORPUS")
        .unwrap_or_else(|_| "target/curate_dedup_corpus.jsonl".into());
    if let Some(dir) = std::path::Path::new(&path).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::File::create(&path) {
        Ok(f) => {
            let mut w = std::io::BufWriter::new(f);
            for r in &recs {
                let line = serde_json::to_string(r).expect("record serialises");
                writeln!(w, "{line}").expect("write corpus");
            }
            w.flush().expect("flush corpus");
        }
        Err(e) => eprintln!("cannot write {path}: {e}"),
    }
    let config = DedupConfig {
        // Measure duplicate detection only: the diversity floor is off.
        max_per_cluster: u32::MAX,
        ..DedupConfig::default()
    };
    let mut d = Deduper::new(config).expect("valid config");
    let t = Instant::now();
    let flagged: Vec<bool> = recs
        .iter()
        .map(|r| d.check_and_insert(&r.text, Origin::Grounded).is_duplicate())
        .collect();
    let secs = t.elapsed().as_secs_f64();
    let (mut tp, mut fp, mut fneg) = (0u64, 0u64, 0u64);
    for (r, &f) in recs.iter().zip(&flagged) {
        match (r.is_duplicate(), f) {
            (true, true) => tp += 1,
            (false, true) => fp += 1,
            (true, false) => fneg += 1,
            _ => {}
        }
    }
    println!(
        "HEARTH_DEDUP docs_per_s={:.0} recall={:.4} precision={:.4} n={N} secs={secs:.3} corpus={path}",
        N as f64 / secs,
        tp as f64 / (tp + fneg).max(1) as f64,
        tp as f64 / (tp + fp).max(1) as f64,
    );
}

fn criterion_benches(c: &mut Criterion) {
    let recs = near_dup_corpus(10_000, SEED);
    let mut g = c.benchmark_group("curate_dedup");
    g.sample_size(10);
    g.throughput(Throughput::Elements(recs.len() as u64));
    g.bench_with_input(
        BenchmarkId::new("check_and_insert", recs.len()),
        &recs,
        |b, recs| {
            b.iter(|| {
                let mut d = Deduper::new(DedupConfig::default()).expect("valid config");
                for r in recs {
                    black_box(d.check_and_insert(&r.text, Origin::Grounded));
                }
            })
        },
    );
    g.finish();
}

fn main() {
    single_pass();
    let quick = std::env::var("HEARTH_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    if !quick {
        let mut c = Criterion::default().configure_from_args();
        criterion_benches(&mut c);
        c.final_summary();
    }
}
