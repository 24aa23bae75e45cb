//! `weir demo`: backpressure, live. A paced source emits keyed events; a map stage
//! re-partitions them by key to four sink subtasks that stand for a REST API. The API is fast,
//! then slow, then fast again. Watch credit run out hop by hop: the sinks' input rings fill,
//! the map stage waits for credit, the source falls behind its schedule (its lag is what
//! would wait in Kafka), memory stays flat; when the API recovers, the lag burns down.
//! Ends with a verdict: every event counted exactly once, RSS under the budget.

mod plot;

use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::operators::builtin::Tally;
use weir::operators::{Collector, Halt, Sink, Source, SourcePoll};
use weir::record::Event;
use weir::ring::counters::{CountersReader, StatView};
use weir::telemetry::bytes;

/// Options of the demo.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Events per second the source is scheduled to emit.
    #[arg(long, default_value_t = 100_000)]
    rate: u64,
    /// Seconds of each phase: fast API, slow API, fast API again.
    #[arg(long, default_value_t = 4.0)]
    phase_secs: f64,
    /// Per-record cost of the API in the slow phase, microseconds (per sink subtask).
    #[arg(long, default_value_t = 100)]
    slow_us: u64,
    /// Print a line every this many milliseconds.
    #[arg(long, default_value_t = 500)]
    tick_ms: u64,
}

/// Shared between the demo's source, sinks and the live view.
struct Shared {
    started: Instant,
    phase_ns: u64,
    slow_ns_per_record: u64,
    emitted: AtomicU64,
    scheduled: AtomicU64,
    total: u64,
}

impl Shared {
    fn phase(&self) -> usize {
        (self.started.elapsed().as_nanos() as u64 / self.phase_ns).min(3) as usize
    }
}

/// An open-loop source: it owes `rate × elapsed` events; what it could not emit (no credit)
/// is its lag, which it catches up when credit returns.
struct PacedSource {
    shared: Arc<Shared>,
    rate: f64,
    next: u64,
}

impl Source<Event> for PacedSource {
    fn poll(&mut self, out: &mut dyn Collector<Event>) -> Result<SourcePoll, Halt> {
        if self.next >= self.shared.total {
            return Ok(SourcePoll::Finished);
        }
        let due = ((self.shared.started.elapsed().as_secs_f64() * self.rate) as u64).min(self.shared.total);
        self.shared.scheduled.store(due, Ordering::Relaxed);
        if due <= self.next {
            return Ok(SourcePoll::Idle(Duration::from_micros(500)));
        }
        let n = (due - self.next).min(512);
        for _ in 0..n {
            let seq = self.next;
            out.collect(&Event {
                key: seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 10_000,
                value: 1,
                time_ns: self.shared.started.elapsed().as_nanos() as u64,
                seq,
            })?;
            self.next += 1;
            self.shared.emitted.store(self.next, Ordering::Relaxed);
        }
        Ok(SourcePoll::Emitted(n as usize))
    }
}

/// The "REST API": free in the fast phases, `slow_ns_per_record` each in the slow one (paid
/// in sleeps of at least 200 µs, so a slow API does not burn a core).
struct ApiSink {
    shared: Arc<Shared>,
    tally: Arc<Tally>,
    debt_ns: u64,
    local: (u64, u64),
}

impl Sink<Event> for ApiSink {
    fn write(&mut self, e: &Event) -> Result<(), Halt> {
        if self.shared.phase() == 1 {
            self.debt_ns += self.shared.slow_ns_per_record;
            if self.debt_ns >= 200_000 {
                std::thread::sleep(Duration::from_nanos(self.debt_ns));
                self.debt_ns = 0;
            }
        }
        self.local.0 += 1;
        self.local.1 = self.local.1.wrapping_add(e.seq);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Halt> {
        self.tally.count.fetch_add(self.local.0, Ordering::AcqRel);
        self.tally.seq_sum.fetch_add(self.local.1, Ordering::AcqRel);
        Ok(())
    }
}

const PHASES: [&str; 4] = ["fast API", "SLOW API", "fast again", "draining"];

pub fn run(args: DemoArgs) -> ExitCode {
    let phase_ns = (args.phase_secs.max(0.5) * 1e9) as u64;
    let total = (args.rate as f64 * args.phase_secs.max(0.5) * 3.0) as u64;
    let shared = Arc::new(Shared {
        started: Instant::now(),
        phase_ns,
        slow_ns_per_record: args.slow_us * 1000,
        emitted: AtomicU64::new(0),
        scheduled: AtomicU64::new(0),
        total,
    });
    let tally = Arc::new(Tally::default());

    let job = Job::new("demo");
    let (s, t) = (shared.clone(), tally.clone());
    let rate = args.rate as f64;
    let s2 = shared.clone();
    job.source("events", 1, move |_| PacedSource { shared: s2.clone(), rate, next: 0 })
        .rebalance()
        .map("parse", |e: &Event| *e)
        .parallelism(2)
        .key_by("by_user", |e: &Event| e.key)
        .sink("api", 4, move |_| ApiSink { shared: s.clone(), tally: t.clone(), debt_ns: 0, local: (0, 0) });

    println!(
        "weir demo: {} events at {}/s; API fast for {:.0} s, {} us/event for {:.0} s, fast again",
        total, args.rate, args.phase_secs, args.slow_us, args.phase_secs
    );
    println!("{}", job.describe().expect("the demo graph is valid").trim_end());
    let running = match job.start() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let budget = running.budget().total_bytes();
    println!("{}", running.budget());
    println!("live counters from another terminal: weir-stat {}", running.counters_path().display());
    println!(
        "{:>5} {:<10} {:>9} {:>9} {:>9}  {:>6} {:>6} {:>6}  {:>6} {:>6}  {:>9}",
        "t(s)", "phase", "in/s", "out/s", "lag", "bp:src", "bp:map", "bp:api", "fill1", "fill2", "RSS"
    );
    let reader = CountersReader::open(running.counters_path()).expect("the job's own counters file");
    let mut before = reader.snapshot();
    let mut at = Instant::now();
    let (mut last_emitted, mut last_counted) = (0u64, 0u64);
    let mut max_rss = 0;
    let mut slow_rss: Vec<u64> = Vec::new();
    let mut lag_at_recovery = None;
    let mut burn_down = None;
    while !running.is_finished() {
        std::thread::sleep(Duration::from_millis(args.tick_ms));
        let rss = running.sample_rss();
        max_rss = max_rss.max(rss);
        let after = reader.snapshot();
        let now = Instant::now();
        let v = StatView::between(&before, &after, (now - at).as_secs_f64());
        let dt = (now - at).as_secs_f64();
        let emitted = shared.emitted.load(Ordering::Relaxed);
        let counted: u64 = v.subtasks.iter().filter(|s| s.owner.starts_with("api#")).map(|s| s.records_in).sum();
        let lag = shared.scheduled.load(Ordering::Relaxed).saturating_sub(emitted);
        let phase = shared.phase();
        if phase == 1 {
            slow_rss.push(rss);
        }
        if phase == 2 && lag_at_recovery.is_none() {
            lag_at_recovery = Some((lag, Instant::now()));
        }
        if let (Some((_, since)), None) = (lag_at_recovery, burn_down)
            && lag < args.rate / 100
        {
            burn_down = Some(since.elapsed());
        }
        let bp = |prefix: &str| {
            let s: Vec<f64> =
                v.subtasks.iter().filter(|s| s.owner.starts_with(prefix)).map(|s| s.backpressured).collect();
            100.0 * s.iter().sum::<f64>() / s.len().max(1) as f64
        };
        let fill = |to: &str| {
            v.channels
                .iter()
                .filter(|c| c.owner.contains(to))
                .map(|c| 100.0 * c.backlog as f64 / c.slots.max(1) as f64)
                .fold(0.0, f64::max)
        };
        println!(
            "{:>5.1} {:<10} {:>9.0} {:>9.0} {:>9}  {:>5.0}% {:>5.0}% {:>5.0}%  {:>5.0}% {:>5.0}%  {:>9}",
            shared.started.elapsed().as_secs_f64(),
            PHASES[phase],
            (emitted - last_emitted) as f64 / dt,
            (counted.saturating_sub(last_counted)) as f64 / dt,
            lag,
            bp("events#"),
            bp("parse#"),
            bp("api#"),
            fill("->parse#"),
            fill("->api#"),
            bytes(rss),
        );
        last_emitted = emitted;
        last_counted = counted;
        before = after;
        at = now;
    }
    let summary = match running.wait() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("the demo job failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (count, sum, _) = tally.totals();
    let (_, want_sum, _) = Tally::expected(total);
    let exact = count == total && sum == want_sum;
    let growth = match (slow_rss.first(), slow_rss.iter().max()) {
        (Some(&a), Some(&b)) if a > 0 => (b as f64 - a as f64) / a as f64,
        _ => 0.0,
    };
    println!();
    println!("{summary}");
    println!();
    println!("verdict:");
    println!(
        "  events produced {total}, counted at the API {count}, checksum {}: {}",
        if sum == want_sum { "equal" } else { "DIFFERENT" },
        if exact { "nothing lost, nothing doubled" } else { "FAILED" }
    );
    println!(
        "  max RSS {} vs budget {}: {}",
        bytes(max_rss),
        bytes(budget),
        if max_rss <= budget { "under" } else { "OVER" }
    );
    println!("  RSS growth during the slow phase: {:.2} %", growth * 100.0);
    match (lag_at_recovery, burn_down) {
        (Some((lag, _)), Some(d)) => {
            println!("  lag at recovery {lag} events, burned down in {:.1} s", d.as_secs_f64())
        }
        (Some((lag, _)), None) => println!("  lag at recovery {lag} events, not burned down before the end"),
        _ => println!("  (the run ended before the recovery phase)"),
    }
    if exact && max_rss <= budget { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
