//! End-to-end latency under open-loop, constant-rate load (wrk2's method).
//!
//! A source subtask emits records on a fixed schedule: record i is *intended* to leave at
//! `i × period` after a shared epoch. It spins until that time when it is less than 20 µs
//! away (about what a sleep and a wake-up cost), else sleeps until 15 µs before it; when it
//! is late — because the ring had no credit, or the thread was descheduled — it does not
//! skip or slow the schedule: it sends every overdue record at once. Each record carries its intended send
//! time and its actual send time (an `Event`: `time_ns` = intended, `value` = actual, ns since
//! the epoch). The sink, across one ring on another core, records `now − intended` in one
//! HdrHistogram — **coordinated-omission corrected**: a stall delays every record that should
//! have been sent during it, and all of them count — and `now − actual` in another, the
//! uncorrected figure a closed-loop load generator would report, for comparison.
//!
//! The rates are fractions of the maximum throughput of the same job (the same source,
//! unpaced, and the same sink), measured first in the same run; the cache-line round-trip
//! floor ([`crate::floor`]) is measured on the two CPUs the job ran on, also in the same run.
//! Records sent during the warm-up are left out of the histograms.

use crate::floor;
use crate::measure::{Cost, measure, pinning};
use crate::report::{Row, Section, fmt_num, fmt_rate};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::hint::spin_loop;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::operators::{Collector, Halt, Sink, Source, SourcePoll};
use weir::record::Event;
use weir::telemetry::hgrm::percentile_distribution;
use weir_ring::IdleStrategy;

/// Records per poll at most (the runtime publishes the batch and checks its mailbox between polls).
const BATCH: u64 = 256;
/// The source spins for a record due within this long — about what a sleep and a wake-up
/// cost — and sleeps until shortly before one due later.
const SPIN_NS: u64 = weir_ring::DEFAULT_PARK_SPIN.as_nanos() as u64;
/// A subtask's timed wait ends within 1 µs of its deadline (the runtime sets the timer
/// slack), but the wake-up itself takes 10–15 µs on a virtual machine: wake this early.
const WAKE_EARLY_NS: u64 = 15_000;
/// Largest latency the histograms hold (larger ones saturate): one hour.
const HIGHEST_NS: u64 = 3_600_000_000_000;

fn since(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// The open-loop source: record i intended at `i × period_ns` after `epoch` (unpaced: `None`).
#[derive(Debug)]
pub struct PacedSource {
    epoch: Instant,
    period_ns: Option<f64>,
    next: u64,
    end: u64,
    /// This thread's scheduling figures at its first poll; the difference goes to `shared`
    /// at the end.
    sched: Option<ThreadSched>,
    shared: Arc<Mutex<Recorded>>,
}

impl PacedSource {
    /// `count` records at `rate` per second (`None`: as fast as credit allows).
    pub fn new(epoch: Instant, rate: Option<f64>, count: u64, shared: Arc<Mutex<Recorded>>) -> PacedSource {
        PacedSource { epoch, period_ns: rate.map(|r| 1e9 / r), next: 0, end: count, sched: None, shared }
    }

    fn intended_ns(&self, seq: u64) -> u64 {
        self.period_ns.map_or(0, |p| (seq as f64 * p) as u64)
    }
}

impl Source<Event> for PacedSource {
    fn poll(&mut self, out: &mut dyn Collector<Event>) -> Result<SourcePoll, Halt> {
        if self.next >= self.end {
            if let Some(start) = self.sched.take() {
                self.shared.lock().unwrap_or_else(|e| e.into_inner()).source_sched = ThreadSched::now().since(&start);
            }
            return Ok(SourcePoll::Finished);
        }
        self.sched.get_or_insert_with(ThreadSched::now);
        let mut now = since(self.epoch);
        let first_due = self.intended_ns(self.next);
        if first_due > now {
            let wait = first_due - now;
            if wait > SPIN_NS {
                return Ok(SourcePoll::Idle(Duration::from_nanos(wait - WAKE_EARLY_NS)));
            }
            while now < first_due {
                spin_loop();
                now = since(self.epoch);
            }
        }
        let mut n = 0;
        while n < BATCH && self.next < self.end {
            let seq = self.next;
            let intended = if self.period_ns.is_some() { self.intended_ns(seq) } else { now };
            if intended > now {
                break;
            }
            // The actual send time: read just before the record goes into the ring.
            out.collect(&Event { key: seq, value: now, time_ns: intended, seq })?;
            self.next += 1;
            n += 1;
            now = since(self.epoch);
        }
        Ok(SourcePoll::Emitted(n as usize))
    }
}

/// The two histograms (ns), and how many records the sink received.
#[derive(Debug)]
pub struct Recorded {
    /// now − intended send time, records sent after the warm-up.
    pub corrected: Histogram<u64>,
    /// now − actual send time, the same records.
    pub uncorrected: Histogram<u64>,
    /// Every record received, warm-up included.
    pub received: u64,
    /// The source's thread over the run: how long it waited runnable, off its CPU.
    pub source_sched: ThreadSched,
    /// The sink's thread, the same.
    pub sink_sched: ThreadSched,
}

/// A thread's scheduling figures (`/proc/thread-self/schedstat` and `status`): what takes
/// the tail of a latency distribution that the ring does not — time runnable but not
/// running (another task had the CPU), and the switches that took the CPU away.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadSched {
    /// ns on the CPU.
    pub run_ns: u64,
    /// ns runnable, waiting for the CPU.
    pub wait_ns: u64,
    /// Times it gave the CPU up itself (sleeps, parks).
    pub voluntary: u64,
    /// Times the CPU was taken from it (preempted).
    pub involuntary: u64,
}

impl ThreadSched {
    /// The calling thread's figures now (zeros where `/proc` does not say).
    pub fn now() -> ThreadSched {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
        let mut f = stat.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
        let (run_ns, wait_ns) = (f.next().unwrap_or(0), f.next().unwrap_or(0));
        let (voluntary, involuntary) = crate::thread_switches().unwrap_or((0, 0));
        ThreadSched { run_ns, wait_ns, voluntary, involuntary }
    }

    /// What happened between `start` and `self`.
    pub fn since(&self, start: &ThreadSched) -> ThreadSched {
        ThreadSched {
            run_ns: self.run_ns.saturating_sub(start.run_ns),
            wait_ns: self.wait_ns.saturating_sub(start.wait_ns),
            voluntary: self.voluntary.saturating_sub(start.voluntary),
            involuntary: self.involuntary.saturating_sub(start.involuntary),
        }
    }

    fn json(&self) -> Value {
        json!({
            "on_cpu_ms": self.run_ns as f64 / 1e6,
            "runnable_waiting_ms": self.wait_ns as f64 / 1e6,
            "voluntary_switches": self.voluntary,
            "involuntary_switches": self.involuntary,
        })
    }
}

impl Recorded {
    fn new() -> Recorded {
        let h = || Histogram::new_with_bounds(1, HIGHEST_NS, 3).expect("valid histogram bounds");
        Recorded {
            corrected: h(),
            uncorrected: h(),
            received: 0,
            source_sched: ThreadSched::default(),
            sink_sched: ThreadSched::default(),
        }
    }
}

/// Records each record's latency into its own histograms; adds them into `shared` at the end.
pub struct LatencySink {
    epoch: Instant,
    warmup_ns: u64,
    local: Recorded,
    shared: Arc<Mutex<Recorded>>,
    /// This thread's scheduling figures at the first record.
    sched: Option<ThreadSched>,
}

impl std::fmt::Debug for LatencySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencySink").field("received", &self.local.received).finish()
    }
}

impl Sink<Event> for LatencySink {
    #[inline]
    fn write(&mut self, e: &Event) -> Result<(), Halt> {
        let now = since(self.epoch);
        if self.local.received == 0 {
            self.sched = Some(ThreadSched::now());
        }
        self.local.received += 1;
        if e.time_ns >= self.warmup_ns {
            self.local.corrected.saturating_record(now.saturating_sub(e.time_ns).max(1));
            self.local.uncorrected.saturating_record(now.saturating_sub(e.value).max(1));
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Halt> {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared.corrected.add(&self.local.corrected).map_err(|e| Halt::failed(format!("histogram: {e}")))?;
        shared.uncorrected.add(&self.local.uncorrected).map_err(|e| Halt::failed(format!("histogram: {e}")))?;
        shared.received += self.local.received;
        if let Some(start) = self.sched.take() {
            shared.sink_sched = ThreadSched::now().since(&start);
        }
        Ok(())
    }
}

/// One run of the job.
#[derive(Debug)]
pub struct Run {
    /// Offered rate, records/s (`None`: unpaced).
    pub rate: Option<f64>,
    /// Idle strategy of the job's subtasks.
    pub idle: IdleStrategy,
    /// Records sent.
    pub records: u64,
    /// The histograms.
    pub recorded: Recorded,
    /// What the whole run cost.
    pub cost: Cost,
    /// subtask → CPU.
    pub pinning: Value,
}

/// source → (one ring) → sink, parallelism 1, chaining off so the edge is a ring.
pub fn run(rate: Option<f64>, records: u64, warmup: Duration, idle: IdleStrategy) -> Run {
    let epoch = Instant::now();
    let shared = Arc::new(Mutex::new(Recorded::new()));
    let job = Job::new("latency");
    job.configure(|c| {
        c.chaining = false;
        c.idle = idle;
    });
    let warmup_ns = warmup.as_nanos() as u64;
    let s = shared.clone();
    let to_source = shared.clone();
    job.source("src", 1, move |_| PacedSource::new(epoch, rate, records, to_source.clone())).sink(
        "sink",
        1,
        move |_| LatencySink { epoch, warmup_ns, local: Recorded::new(), shared: s.clone(), sched: None },
    );
    let (summary, cost) = measure(|| job.run().unwrap_or_else(|e| panic!("latency job: {e}")));
    let recorded = std::mem::replace(&mut *shared.lock().unwrap_or_else(|e| e.into_inner()), Recorded::new());
    assert_eq!(recorded.received, records, "every record arrives once");
    Run { rate, idle, records, recorded, cost, pinning: pinning(&summary) }
}

/// Sleep 20 µs between looks: a latency budget traded for the CPU a spin would use.
const BUDGET_SLEEP: IdleStrategy = IdleStrategy::Backoff {
    spins: 0,
    yields: 0,
    min_sleep: Duration::from_micros(20),
    max_sleep: Duration::from_micros(20),
};

/// The low fixed rate, records per second: a record every 50 µs.
const LOW_RATE: f64 = 20_000.0;

/// How fast the paced source sends.
#[derive(Clone, Copy, Debug)]
enum Load {
    /// A fraction of the job's measured maximum.
    Fraction(f64),
    /// Records per second.
    Fixed(f64),
}

impl Load {
    fn rate(self, max_rate: f64) -> f64 {
        match self {
            Load::Fraction(f) => max_rate * f,
            Load::Fixed(r) => r,
        }
    }

    /// How `WEIR_BENCH_LATENCY` names it.
    fn tag(self) -> String {
        match self {
            Load::Fraction(f) => format!("{:.0}", f * 100.0),
            Load::Fixed(_) => "low".into(),
        }
    }

    fn file_tag(self) -> String {
        match self {
            Load::Fraction(f) => format!("{:.0}pct", f * 100.0),
            Load::Fixed(r) => format!("{:.0}k-per-s", r / 1e3),
        }
    }

    fn name(self) -> String {
        match self {
            Load::Fraction(f) => format!("{:.0} % of max", f * 100.0),
            Load::Fixed(r) => format!("{:.0} k/s fixed", r / 1e3),
        }
    }
}

/// Percentiles reported, as (label, quantile).
const PERCENTILES: [(&str, f64); 5] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999), ("p99.99", 0.9999)];

fn percentiles_json(h: &Histogram<u64>) -> Value {
    let mut m = serde_json::Map::new();
    for (label, q) in PERCENTILES {
        m.insert(format!("{label}_ns"), json!(h.value_at_quantile(q)));
    }
    m.insert("max_ns".into(), json!(h.max()));
    m.insert("mean_ns".into(), json!(h.mean()));
    m.insert("count".into(), json!(h.len()));
    Value::Object(m)
}

fn idle_name(idle: IdleStrategy) -> String {
    match idle {
        IdleStrategy::BusySpin => "busy-spin".into(),
        IdleStrategy::SpinYield { .. } => "spin-yield".into(),
        IdleStrategy::Backoff { min_sleep, max_sleep, .. } if min_sleep == max_sleep => {
            format!("sleep-{}us", min_sleep.as_micros())
        }
        IdleStrategy::Backoff { .. } => "backoff".into(),
        IdleStrategy::Park { .. } => "park".into(),
    }
}

/// The report section; `.hgrm` files go into `out`.
pub fn section(smoke: bool, out: &Path) -> Section {
    let mut s = Section::new("latency", "End-to-end latency, open loop at constant rate (source → ring → sink)");
    let (max_records, warmup, measured) = if smoke {
        (200_000u64, Duration::from_millis(100), Duration::from_millis(300))
    } else {
        (10_000_000, Duration::from_secs(1), Duration::from_secs(5))
    };
    let default_idle = IdleStrategy::default();

    // 1. The most this job carries: the same source unpaced, closed loop.
    let max = run(None, max_records, Duration::ZERO, default_idle);
    let max_rate = max.cost.per_s(max.records);
    s.rows.push(
        Row::new("max throughput of this job (unpaced source → sink)", max_rate / 1e6, "M records/s")
            .note("the rates below are fractions of it"),
    );
    s.rows.push(Row::new(
        "max throughput: records per CPU-second",
        max.cost.per_cpu_s(max.records) / 1e6,
        "M records/CPU-s",
    ));

    // 2. The floor, between the two CPUs the job ran on.
    let cpu = |name: &str| max.pinning.get(name).and_then(Value::as_u64).map(|c| c as usize);
    let cpus = (cpu("src#0"), cpu("sink#0"));
    let floor = if smoke { floor::measure(cpus, 20_000, 3) } else { floor::measure(cpus, 1_000_000, 7) };
    let one_way_us = floor.one_way_ns() / 1000.0;
    s.rows.push(
        Row::new("cache-line round-trip floor (RTT), src CPU ↔ sink CPU", floor.rtt_ns, "ns")
            .note("one-way floor = RTT / 2; latencies below are compared with it"),
    );

    // 3. Open loop at fractions of the maximum, and at a fixed low rate (a feed of ticks:
    // the sink waits tens of microseconds between records, where parking decides).
    let busy_spin = IdleStrategy::BusySpin;
    let mut plan: Vec<(Load, IdleStrategy)> = vec![
        (Load::Fraction(0.1), default_idle),
        (Load::Fraction(0.5), default_idle),
        (Load::Fraction(0.9), default_idle),
        (Load::Fixed(LOW_RATE), default_idle),
        // Busy-spin next to park at the low rates: what waking a parked sink costs.
        (Load::Fraction(0.1), busy_spin),
        (Load::Fixed(LOW_RATE), busy_spin),
        // A latency budget instead of a spin: the sink sleeps 20 µs between looks (precise,
        // with the subtasks' 1 µs timer slack) and the source never pays a wake-up.
        (Load::Fraction(0.1), BUDGET_SLEEP),
    ];
    // WEIR_BENCH_LATENCY=10,low,...: only these rows (10/50/90 % of max, `low`), both strategies.
    if let Ok(only) = std::env::var("WEIR_BENCH_LATENCY") {
        let picked: Vec<&str> = only.split(',').map(str::trim).collect();
        plan.retain(|(load, _)| picked.contains(&load.tag().as_str()));
    }
    let mut runs_json = Vec::new();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Latency = sink's clock − the record's send time, ns since a shared epoch (CLOCK_MONOTONIC). \
         **Coordinated-omission corrected** figures count from the *intended* send time on the \
         schedule; uncorrected ones from the *actual* send time (what a closed-loop generator \
         would report). Warm-up ({:.1} s) excluded; {:.1} s measured per rate. Values in µs. \
         One-way floor: {:.3} µs (RTT {:.0} ns).\n",
        warmup.as_secs_f64(),
        measured.as_secs_f64(),
        one_way_us,
        floor.rtt_ns
    );
    for (load, idle) in plan {
        let rate = load.rate(max_rate);
        let records = (rate * (warmup + measured).as_secs_f64()).max(1.0) as u64;
        let r = run(Some(rate), records, warmup, idle);
        let label = format!("{} ({}), idle {}", load.name(), fmt_rate(rate), idle_name(idle));
        let tag = format!("{}-{}", idle_name(idle), load.file_tag());
        let (c, u) = (&r.recorded.corrected, &r.recorded.uncorrected);
        for (name, q) in PERCENTILES.iter().copied().chain([("max", 1.0)]) {
            let v = if q >= 1.0 { c.max() } else { c.value_at_quantile(q) } as f64 / 1000.0;
            s.rows.push(
                Row::new(format!("latency {name}, CO-corrected, {label}"), v, "µs")
                    .vs(format!("one-way floor {one_way_us:.3} µs"), one_way_us),
            );
        }
        let achieved = r.cost.per_s(r.records);
        s.rows.push(
            Row::new(format!("achieved send rate, {label}"), achieved / 1e6, "M records/s")
                .vs(format!("offered {}", fmt_rate(rate)), rate / 1e6)
                .note(format!("{:.2} cores busy; below 1.0×, the source fell behind its schedule", r.cost.cores())),
        );
        // What the ring cannot cause: time each thread was runnable and kept off its CPU.
        for (who, t) in [("sink", &r.recorded.sink_sched), ("source", &r.recorded.source_sched)] {
            s.rows.push(
                Row::new(format!("{who} thread runnable but off its CPU, {label}"), t.wait_ns as f64 / 1e6, "ms").note(
                    format!(
                        "{} involuntary switches ({:.3} per 1,000 records), {} voluntary; {:.0} ms on the CPU",
                        t.involuntary,
                        t.involuntary as f64 * 1e3 / r.records.max(1) as f64,
                        t.voluntary,
                        t.run_ns as f64 / 1e6
                    ),
                ),
            );
        }
        let _ = writeln!(
            md,
            "**{label}**: sent {} records in {:.2} s ({}), {} measured; {:.2} cores busy.\n",
            r.records,
            r.cost.wall_s,
            fmt_rate(achieved),
            c.len(),
            r.cost.cores()
        );
        let _ = writeln!(
            md,
            "| percentile | CO-corrected (from intended send time) µs | uncorrected (from actual send time) µs |"
        );
        let _ = writeln!(md, "|---|---:|---:|");
        for (name, q) in PERCENTILES.iter().copied().chain([("max", 1.0)]) {
            let at = |h: &Histogram<u64>| if q >= 1.0 { h.max() } else { h.value_at_quantile(q) } as f64 / 1000.0;
            let _ = writeln!(md, "| {name} | {} | {} |", fmt_num(at(c)), fmt_num(at(u)));
        }
        let files = [format!("latency-{tag}-corrected.hgrm"), format!("latency-{tag}-uncorrected.hgrm")];
        for (file, h) in files.iter().zip([c, u]) {
            std::fs::write(out.join(file), percentile_distribution(h, 1000.0))
                .unwrap_or_else(|e| panic!("cannot write {file}: {e}"));
            s.files.push(file.clone());
        }
        let _ = writeln!(md, "\nHistograms (µs): `{}`, `{}`\n", files[0], files[1]);
        runs_json.push(json!({
            "label": label,
            "fraction_of_max": rate / max_rate,
            "offered_rate_per_s": rate,
            "idle_strategy": format!("{idle:?}"),
            "records": r.records,
            "achieved_rate_per_s": achieved,
            "cost": r.cost.json(r.records),
            "pinning": r.pinning,
            "corrected_from_intended_send_time": percentiles_json(c),
            "uncorrected_from_actual_send_time": percentiles_json(u),
            "sink_thread": r.recorded.sink_sched.json(),
            "source_thread": r.recorded.source_sched.json(),
            "hgrm": files,
        }));
    }
    s.markdown = md;
    let config = Job::new("probe").config();
    s.setup = json!({
        "job": "PacedSource (src, p=1) → one ring → LatencySink (sink, p=1); chaining off",
        "pinning": max.pinning,
        "record": { "type": "Event", "bytes": 32, "fields": "time_ns = intended send time, value = actual send time (ns since the epoch)" },
        "ring": { "slots": config.ring_slots, "slot_bytes": config.slot_bytes },
        "idle_strategy": format!("{default_idle:?} (and BusySpin in the last runs)"),
        "load_average_at_end": crate::loadavg(),
        "source": "spins until a record is due when it is ≤ 20 µs away, else sleeps until 15 µs before it; sends every overdue record at once, up to 256 per poll",
        "warmup_s": warmup.as_secs_f64(),
        "measured_s": measured.as_secs_f64(),
        "histogram": "HdrHistogram, 3 significant digits, 1 ns .. 1 h; .hgrm values in µs",
    });
    s.details = json!({
        "max_throughput": { "records": max.records, "cost": max.cost.json(max.records), "pinning": max.pinning },
        "floor": floor.json(),
        "runs": runs_json,
    });
    s
}
