//! Engine overhead against its peer, a raw chain of crossbeam channels, measured in the same run.
//!
//! 1. Throughput and p99 latency of a 4-stage pipeline of trivial actors (source -> 4 pass-through stages ->
//!    sink) versus the same shape built from bare threads and bounded crossbeam channels. Reports hearth/raw.
//! 2. Overload: a source ~10x faster than its sink for `HEARTH_BENCH_OVERLOAD_SECS` (default 60) under `Block`
//!    and under `DropOldest`; peak RSS is sampled every second and must stay flat.
//!
//! Run: `cargo bench --bench engine_pipeline` (set `HEARTH_BENCH_MESSAGES`, `HEARTH_BENCH_OVERLOAD_SECS`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hearth::actors::{KindInfo, Outbox, Plan, PortSpec};
use hearth::engine::{
    Actor, ActorError, ActorFactory, BuildContext, EdgeSpec, Produce, WhenFull, start,
};
use hearth::message::{Message, MessageType, Origin, Provenance, Sample, SampleContent};

const STAGES: usize = 4;
const CAPACITY: usize = 1024;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// A sample stamped with its send time (nanoseconds since the bench epoch) in its id.
fn stamped(seq: u64) -> Message {
    let nanos = epoch().elapsed().as_nanos() as u64;
    Message::Sample(Arc::new(Sample {
        id: nanos.to_string(),
        user: String::new(),
        origin: Origin::Grounded,
        content: SampleContent::Sft {
            prompt: Vec::new(),
            response: String::new(),
        },
        provenance: Provenance::default(),
        created_at_unix_ms: seq,
    }))
}

fn latency_ns(message: &Message) -> u64 {
    let sent: u64 = message.id().parse().unwrap_or(0);
    (epoch().elapsed().as_nanos() as u64).saturating_sub(sent)
}

static SOURCE: KindInfo = KindInfo {
    name: "bench_source",
    about: "",
    inputs: &[],
    outputs: &[PortSpec::new("out", MessageType::Sample)],
    source: true,
};
static STAGE: KindInfo = KindInfo {
    name: "bench_stage",
    about: "",
    inputs: &[PortSpec::new("in", MessageType::Sample)],
    outputs: &[PortSpec::new("out", MessageType::Sample)],
    source: false,
};
static SINK: KindInfo = KindInfo {
    name: "bench_sink",
    about: "",
    inputs: &[PortSpec::new("in", MessageType::Sample)],
    outputs: &[],
    source: false,
};

struct Source {
    count: u64,
    /// Pause per message (overload run); zero for the throughput run.
    pace: Duration,
}
struct SourceActor {
    left: u64,
    pace: Duration,
}
impl ActorFactory<Message> for Source {
    fn info(&self) -> &'static KindInfo {
        &SOURCE
    }
    fn build(&self, _: &BuildContext) -> Result<Box<dyn Actor<Message>>, ActorError> {
        Ok(Box::new(SourceActor {
            left: self.count,
            pace: self.pace,
        }))
    }
}
impl Actor<Message> for SourceActor {
    fn handle(&mut self, _: &str, _: &Message, _: &mut Outbox) -> Result<(), ActorError> {
        Ok(())
    }
    fn produce(&mut self, out: &mut Outbox) -> Result<Produce, ActorError> {
        if self.left == 0 {
            return Ok(Produce::Exhausted);
        }
        self.left -= 1;
        out.send("out", stamped(self.left))
            .map_err(ActorError::from)?;
        if !self.pace.is_zero() {
            spin(self.pace);
        }
        Ok(Produce::Produced)
    }
}

struct Stage;
struct StageActor;
impl ActorFactory<Message> for Stage {
    fn info(&self) -> &'static KindInfo {
        &STAGE
    }
    fn build(&self, _: &BuildContext) -> Result<Box<dyn Actor<Message>>, ActorError> {
        Ok(Box::new(StageActor))
    }
}
impl Actor<Message> for StageActor {
    fn handle(&mut self, _: &str, m: &Message, out: &mut Outbox) -> Result<(), ActorError> {
        out.send("out", m.clone()).map_err(ActorError::from)
    }
}

struct Sink {
    latencies: Arc<Mutex<Vec<u64>>>,
    pace: Duration,
    seen: Arc<AtomicU64>,
}
struct SinkActor {
    local: Vec<u64>,
    shared: Arc<Mutex<Vec<u64>>>,
    pace: Duration,
    seen: Arc<AtomicU64>,
}
impl ActorFactory<Message> for Sink {
    fn info(&self) -> &'static KindInfo {
        &SINK
    }
    fn build(&self, _: &BuildContext) -> Result<Box<dyn Actor<Message>>, ActorError> {
        Ok(Box::new(SinkActor {
            local: Vec::new(),
            shared: self.latencies.clone(),
            pace: self.pace,
            seen: self.seen.clone(),
        }))
    }
}
impl Actor<Message> for SinkActor {
    fn handle(&mut self, _: &str, m: &Message, _: &mut Outbox) -> Result<(), ActorError> {
        if self.pace.is_zero() {
            self.local.push(latency_ns(m));
        } else {
            spin(self.pace);
        }
        self.seen.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn flush(&mut self, _: &mut Outbox) -> Result<(), ActorError> {
        self.shared
            .lock()
            .map_err(|_| ActorError::Message("poisoned".into()))?
            .append(&mut self.local);
        Ok(())
    }
}

/// Busy-waits: sleeping for microseconds would measure the scheduler, not the pipeline.
fn spin(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

fn edge(from: &str, to: &str, when_full: WhenFull) -> EdgeSpec {
    EdgeSpec {
        from: from.to_owned(),
        to: to.to_owned(),
        capacity: CAPACITY,
        when_full,
        feedback: false,
    }
}

fn pipeline(source: Source, sink: Sink, when_full: WhenFull) -> Plan {
    let mut plan =
        Plan::new("bench")
            .node("source", Arc::new(source), 1)
            .node("sink", Arc::new(sink), 1);
    let mut prev = "source".to_owned();
    for i in 0..STAGES {
        let id = format!("stage{i}");
        plan = plan.node(&id, Arc::new(Stage), 1).edge(edge(
            &format!("{prev}.out"),
            &format!("{id}.in"),
            when_full,
        ));
        prev = id;
    }
    plan.edge(edge(&format!("{prev}.out"), "sink.in", when_full))
}

#[derive(Clone, Copy)]
struct Figures {
    msgs_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

fn figures(n: u64, elapsed: Duration, mut lat: Vec<u64>) -> Figures {
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1e3;
    Figures {
        msgs_per_sec: n as f64 / elapsed.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

fn run_hearth(n: u64, dir: &std::path::Path) -> Figures {
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(n as usize)));
    let plan = pipeline(
        Source {
            count: n,
            pace: Duration::ZERO,
        },
        Sink {
            latencies: latencies.clone(),
            pace: Duration::ZERO,
            seen: Arc::new(AtomicU64::new(0)),
        },
        WhenFull::Block,
    );
    let graph =
        hearth::engine::validate::validate(plan, Vec::new(), &[]).expect("valid bench graph");
    let t = Instant::now();
    let report = start(graph, Some(dir)).expect("start").wait();
    let elapsed = t.elapsed();
    assert!(report.failed_nodes.is_empty());
    let lat = std::mem::take(&mut *latencies.lock().expect("lock"));
    assert_eq!(lat.len() as u64, n);
    figures(n, elapsed, lat)
}

fn run_raw(n: u64) -> Figures {
    let (first_tx, mut rx) = crossbeam_channel::bounded::<Message>(CAPACITY);
    let mut threads = Vec::new();
    for _ in 0..STAGES {
        let (tx, next_rx) = crossbeam_channel::bounded::<Message>(CAPACITY);
        let stage_rx = std::mem::replace(&mut rx, next_rx);
        threads.push(std::thread::spawn(move || {
            for m in stage_rx {
                if tx.send(m).is_err() {
                    break;
                }
            }
        }));
    }
    let t = Instant::now();
    let sink = std::thread::spawn(move || rx.iter().map(|m| latency_ns(&m)).collect::<Vec<u64>>());
    for i in 0..n {
        if first_tx.send(stamped(i)).is_err() {
            break;
        }
    }
    drop(first_tx);
    let lat = sink.join().expect("sink");
    let elapsed = t.elapsed();
    for th in threads {
        th.join().expect("stage");
    }
    figures(n, elapsed, lat)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn overload(secs: u64, when_full: WhenFull, dir: &std::path::Path) {
    // The sink spends 20 µs per message, the source 2 µs: the source is ~10x faster.
    let seen = Arc::new(AtomicU64::new(0));
    let plan = pipeline(
        Source {
            count: u64::MAX,
            pace: Duration::from_micros(2),
        },
        Sink {
            latencies: Arc::new(Mutex::new(Vec::new())),
            pace: Duration::from_micros(20),
            seen: seen.clone(),
        },
        when_full,
    );
    let graph =
        hearth::engine::validate::validate(plan, Vec::new(), &[]).expect("valid bench graph");
    let running = start(graph, Some(dir)).expect("start");
    let status = running.status();
    let mut samples = Vec::new();
    for _ in 0..secs {
        std::thread::sleep(Duration::from_secs(1));
        samples.push(rss_kib());
    }
    let report = running.shutdown();
    let first_edge = &report
        .status
        .edges
        .iter()
        .find(|e| e.name == "source.out->stage0.in");
    let early = samples
        .iter()
        .take(samples.len().div_ceil(6))
        .max()
        .copied()
        .unwrap_or(0);
    let peak = samples.iter().max().copied().unwrap_or(0);
    let max_depth = status
        .snapshot()
        .edges
        .iter()
        .map(|e| e.max_depth)
        .max()
        .unwrap_or(0);
    println!(
        "overload {when_full:?} {secs}s: sink took {} msgs, source edge dropped {}, max depth {max_depth}/{CAPACITY}; \
         RSS early peak {early} KiB, overall peak {peak} KiB, growth {:.1}%",
        seen.load(Ordering::Relaxed),
        first_edge.map(|e| e.dropped).unwrap_or(0),
        (peak as f64 - early as f64) / early.max(1) as f64 * 100.0
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with a tiny load as a smoke test.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = if smoke {
        10_000
    } else {
        env("HEARTH_BENCH_MESSAGES", 1_000_000)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let _ = epoch();
    // Overload first, so its RSS is not inflated by the throughput runs' latency buffers.
    let secs = if smoke {
        2
    } else {
        env("HEARTH_BENCH_OVERLOAD_SECS", 60)
    };
    overload(secs.div_ceil(2).max(1), WhenFull::Block, dir.path());
    overload(secs.div_ceil(2).max(1), WhenFull::DropOldest, dir.path());
    // Warm up both, then alternate to share the machine's noise fairly.
    run_raw(n / 10);
    run_hearth(n / 10, dir.path());
    let mut raw = Vec::new();
    let mut hearth = Vec::new();
    for _ in 0..3 {
        raw.push(run_raw(n));
        hearth.push(run_hearth(n, dir.path()));
    }
    let best = |v: &[Figures]| {
        v.iter()
            .max_by(|a, b| a.msgs_per_sec.total_cmp(&b.msgs_per_sec))
            .copied()
            .expect("runs")
    };
    let (r, h) = (best(&raw), best(&hearth));
    println!(
        "pipeline: {STAGES} pass-through stages, capacity {CAPACITY}, {n} messages, best of 3"
    );
    println!(
        "  raw crossbeam chain: {:>12.0} msgs/s  p50 {:>8.1} µs  p99 {:>8.1} µs",
        r.msgs_per_sec, r.p50_us, r.p99_us
    );
    println!(
        "  hearth runtime:      {:>12.0} msgs/s  p50 {:>8.1} µs  p99 {:>8.1} µs",
        h.msgs_per_sec, h.p50_us, h.p99_us
    );
    println!(
        "  hearth/raw throughput {:.2} (goal >= 0.8); p99 latency ratio hearth/raw {:.2}",
        h.msgs_per_sec / r.msgs_per_sec,
        h.p99_us / r.p99_us
    );
}
