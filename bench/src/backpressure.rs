//! The backpressure scenario: a sink 100× slower than its source.
//!
//! generator (offers 1,000,000 records/s, open loop: it never slows its schedule, it only
//! waits for credit) → map → sink that spends 100 µs per record (10,000 records/s, paid in
//! sleeps, so it does not burn a core); chaining off, so each hop is a ring. Every subtask's
//! busy / backpressured / idle time comes from the job's counters file over the steady
//! interval: after the warm-up, while the source still runs. RSS is sampled every 100 ms
//! over the same interval; its growth is the largest sample over the first. VmHWM, the
//! process's peak RSS, is compared with the budget the job declared at start
//! (`RunningJob::budget()`): the benchmark runs in its own process (`weir-bench
//! backpressure`, as `all` starts it), so the peak is this job's. Then the same job runs again
//! with the in-flight target off (rings fill to their size): its checkpoint durations are the
//! baseline of the credit-by-time rows.

use crate::measure::{Meter, pinning};
use crate::report::{Row, Section, mib};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::operators::builtin::{CountingSink, Generator, Tally};
use weir::record::Event;
use weir::ring::counters::CountersReader;
use weir::ring::process::hwm_bytes;
use weir_tools::stat::StatView;

/// What the sink serves, records/s.
const SINK_RATE: f64 = 10_000.0;
/// How much faster the source offers records.
const SLOWDOWN: f64 = 100.0;

/// Checkpoint durations under the slow sink (ns, the final one left out) of the same job
/// with the in-flight target off: its rings fill to their size.
fn checkpoints_target_off(records: u64, source_rate: f64, delay: Duration) -> Vec<u64> {
    let tally = Arc::new(Tally::default());
    let job = Job::new("backpressure-target-off");
    let checkpoints = std::env::temp_dir().join(format!("weir-bench-bp-off-checkpoints-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&checkpoints);
    job.configure(|c| {
        c.chaining = false;
        c.inflight_target = None;
        c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
            interval: Duration::from_millis(500),
            ..weir::checkpoint::CheckpointSettings::new(&checkpoints)
        });
    });
    let t = tally.clone();
    job.source("gen", 1, move |info| Generator::events(info, records, 10_000).with_rate(source_rate))
        .map("map", |e: &Event| Event { value: e.value + 1, ..*e })
        .sink("sink", 1, move |_| CountingSink::new(t.clone()).with_delay(delay));
    let summary = job.run().expect("the backpressure job (target off) runs");
    let _ = std::fs::remove_dir_all(&checkpoints);
    assert_eq!(tally.totals(), Tally::expected(records), "target off: every record exactly once");
    let done = &summary.checkpoints.completed;
    done[..done.len().saturating_sub(1)].iter().map(|c| c.1).collect()
}

/// A sink of window results that spends `delay` on each (paid in sleeps of at least 200 µs).
struct SlowResults {
    delay: Duration,
    debt: Duration,
    results: Arc<std::sync::atomic::AtomicU64>,
}

impl weir::operators::Sink<weir::window::WindowResult> for SlowResults {
    fn write(&mut self, _r: &weir::window::WindowResult) -> Result<(), weir::operators::Halt> {
        self.debt += self.delay;
        if self.debt >= Duration::from_micros(200) {
            std::thread::sleep(self.debt);
            self.debt = Duration::ZERO;
        }
        self.results.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Checkpoints while a window fires into a slow sink: generator (event time, 1 µs per
/// record, 100,000 records/s offered) → key_by over 5,000 keys → 10 ms tumbling count →
/// sink at 200 µs a result. Each window fires ~4,300 results, which the sink takes ~0.9 s
/// to drain: a barrier that waited for the firing would take that long. Returns the
/// checkpoint durations (ns, the final one left out) and the results per window.
fn window_firing(smoke: bool) -> (Vec<u64>, f64, Duration) {
    const KEYS: u64 = 5_000;
    let records: u64 = if smoke { 100_000 } else { 600_000 };
    let delay = Duration::from_micros(200);
    let results = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let job = Job::new("window-firing");
    let checkpoints = std::env::temp_dir().join(format!("weir-bench-firing-checkpoints-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&checkpoints);
    job.configure(|c| {
        c.state.backend = weir::graph::StateBackendKind::Memory;
        c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
            interval: Duration::from_millis(250),
            timeout: Duration::from_secs(120),
            ..weir::checkpoint::CheckpointSettings::new(&checkpoints)
        });
    });
    let r = results.clone();
    job.source("gen", 1, move |info| Generator::events(info, records, KEYS).with_rate(100_000.0))
        .with_event_time("ts", |e: &Event| e.time_ns, weir::time::WatermarkStrategy::bounded(Duration::ZERO))
        .key_by("k", |e: &Event| e.key)
        .window(weir::window::Window::tumbling(Duration::from_millis(10)))
        .aggregate("per_10ms", 1, weir::window::Aggregates::of(|e: &Event| e.value).count())
        .sink("slow", 1, move |_| SlowResults { delay, debt: Duration::ZERO, results: r.clone() });
    let summary = job.run().expect("the window-firing job runs");
    let _ = std::fs::remove_dir_all(&checkpoints);
    let windows = (records * 1_000).div_ceil(10_000_000) as f64;
    let per_window = results.load(std::sync::atomic::Ordering::Relaxed) as f64 / windows;
    let done = &summary.checkpoints.completed;
    (done[..done.len().saturating_sub(1)].iter().map(|c| c.1).collect(), per_window, delay)
}

/// The report section.
pub fn section(smoke: bool) -> Section {
    let (warmup, duration) = if smoke {
        (Duration::from_millis(500), Duration::from_secs(2))
    } else {
        (Duration::from_secs(2), Duration::from_secs(12))
    };
    // The sink needs `duration` for all of them; the source is done a ring or two earlier.
    let records = (SINK_RATE * duration.as_secs_f64()) as u64;
    let source_rate = SINK_RATE * SLOWDOWN;
    let delay = Duration::from_secs_f64(1.0 / SINK_RATE);

    let tally = Arc::new(Tally::default());
    let job = Job::new("backpressure");
    // Checkpoints every 500 ms: their duration under the slow sink is a figure of the report.
    let checkpoints = std::env::temp_dir().join(format!("weir-bench-bp-checkpoints-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&checkpoints);
    // WEIR_BENCH_INFLIGHT_TARGET_MS: another in-flight target for this run (how the default
    // was chosen: see the README's "Credit by time").
    let target = std::env::var("WEIR_BENCH_INFLIGHT_TARGET_MS").ok().and_then(|v| v.parse::<u64>().ok());
    job.configure(|c| {
        c.chaining = false;
        if let Some(ms) = target {
            c.inflight_target = (ms > 0).then(|| Duration::from_millis(ms));
        }
        c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
            interval: Duration::from_millis(500),
            ..weir::checkpoint::CheckpointSettings::new(&checkpoints)
        });
    });
    let config = job.config();
    let t = tally.clone();
    job.source("gen", 1, move |info| Generator::events(info, records, 10_000).with_rate(source_rate))
        .map("map", |e: &Event| Event { value: e.value + 1, ..*e })
        .sink("sink", 1, move |_| CountingSink::new(t.clone()).with_delay(delay));

    let meter = Meter::start();
    let running = job.start().expect("the backpressure job starts");
    let budget = running.budget().clone();
    let reader = CountersReader::open(running.counters_path()).expect("the job's counters file");
    let started = Instant::now();
    let deadline = started + duration * 10 + Duration::from_secs(30);
    let mut first: Option<(Vec<weir::ring::counters::CounterValue>, Instant, Meter)> = None;
    let mut last = None;
    let mut rss = Vec::new();
    let mut fills = Vec::new();
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the backpressure job did not finish");
        std::thread::sleep(Duration::from_millis(100));
        let sample_rss = running.sample_rss();
        let snap = reader.snapshot();
        let now = Instant::now();
        let view = StatView::between(&snap, &snap, 1.0);
        let source_running = view.subtasks.iter().any(|s| s.owner == "gen#0" && s.state == 1);
        if now - started < warmup || !source_running {
            continue;
        }
        let fill: Vec<f64> = view
            .channels
            .iter()
            .filter(|c| c.owner.ends_with("->sink#0"))
            .map(|c| c.backlog as f64 / c.slots.max(1) as f64)
            .collect();
        fills.extend(fill);
        rss.push(sample_rss);
        match &first {
            None => first = Some((snap, now, Meter::start())),
            Some(_) => last = Some((snap, now)),
        }
    }
    let summary = running.wait().expect("the backpressure job finishes");
    let _ = std::fs::remove_dir_all(&checkpoints);
    let total_cost = meter.stop();
    let hwm = hwm_bytes().unwrap_or(0);
    assert_eq!(tally.totals(), Tally::expected(records), "every record exactly once");

    let mut s = Section::new("backpressure", "Backpressure: sink 100× slower than the source");
    let (Some((snap_a, at_a, steady_meter)), Some((snap_b, at_b))) = (first, last) else {
        s.rows
            .push(Row::not_run("backpressure, steady state", "too few samples after the warm-up (machine too busy?)"));
        return s;
    };
    let steady_cost = steady_meter.stop();
    let interval_s = (at_b - at_a).as_secs_f64();
    let view = StatView::between(&snap_a, &snap_b, interval_s);
    let stage = |name: &str| view.subtasks.iter().find(|v| v.owner == name);

    let (rss0, rss_max) = (rss[0] as f64, *rss.iter().max().expect("samples") as f64);
    let growth_pct = (rss_max - rss0) / rss0 * 100.0;
    s.rows.push(
        Row::new("RSS growth after warm-up (largest sample vs first)", growth_pct, "%")
            .target("≤ 2 %", |g| g <= 2.0)
            .note(format!("{} samples over {interval_s:.1} s, first {:.1} MiB", rss.len(), rss0 / 1048576.0)),
    );
    s.rows.push(
        Row::new("VmHWM (peak RSS of the process)", mib(hwm), "MiB")
            .vs(format!("declared budget {:.1} MiB", mib(budget.total_bytes())), mib(budget.total_bytes()))
            .target("≤ 1.0× budget", |x| x <= 1.0),
    );
    for name in ["gen#0", "map#0", "sink#0"] {
        if let Some(v) = stage(name) {
            s.rows.push(Row::new(
                format!("{name}: backpressured (waiting for credit)"),
                v.backpressured * 100.0,
                "% of time",
            ));
        }
    }
    for name in ["sink#0"] {
        if let Some(v) = stage(name) {
            s.rows.push(Row::new(format!("{name}: busy"), v.busy * 100.0, "% of time"));
        }
    }
    let mut sorted = fills.clone();
    sorted.sort_by(f64::total_cmp);
    if let Some(median) = sorted.get(sorted.len() / 2) {
        s.rows.push(Row::new("fill of the sink's input ring (median sample)", median * 100.0, "%"));
    }
    if let Some(g) = stage("gen#0") {
        s.rows.push(
            Row::new("source throughput under backpressure", g.records_in_per_s / 1e3, "k records/s")
                .vs(format!("offered {:.0} k/s", source_rate / 1e3), source_rate / 1e3),
        );
    }
    // Checkpoints: the final one (end of input) is the last; the others ran under the slow sink.
    let done = &summary.checkpoints.completed;
    let regular = &done[..done.len().saturating_sub(1)];
    // A barrier waits behind what is in the rings: two rings of `ring_slots` 32-byte events,
    // drained at the rate the sink really achieved (the source's rate under backpressure).
    let drained = stage("gen#0").map(|g| g.records_in_per_s).filter(|r| *r > 0.0).unwrap_or(SINK_RATE);
    let bound_ms = 2.0 * config.ring_slots as f64 / drained * 1e3;
    // The same job with the target off, in the same run: what the rings alone give.
    let off = checkpoints_target_off(records, source_rate, delay);
    let off_mean_ms = (!off.is_empty()).then(|| off.iter().sum::<u64>() as f64 / off.len() as f64 / 1e6);
    let target_ms = config.inflight_target.map(|t| t.as_secs_f64() * 1e3);
    if let Some(max) = regular.iter().map(|c| c.1).max() {
        let mean = regular.iter().map(|c| c.1).sum::<u64>() as f64 / regular.len() as f64;
        let mut mean_row = Row::new(
            format!("checkpoint duration under the slow sink, mean ({} completed)", regular.len()),
            mean / 1e6,
            "ms",
        );
        if let Some(off_ms) = off_mean_ms {
            mean_row = mean_row.vs(format!("in-flight target off, same run: {off_ms:.0} ms"), off_ms);
        }
        s.rows.push(mean_row);
        let mut max_row = Row::new("checkpoint duration under the slow sink, max", max as f64 / 1e6, "ms");
        if let Some(t) = target_ms {
            max_row =
                max_row.vs(format!("in-flight target {t:.0} ms"), t).target("≤ 2× the target", |ratio| ratio <= 2.0);
        }
        s.rows.push(max_row);
        if let Some(off_max) = off.iter().max() {
            s.rows.push(
                Row::new(
                    "checkpoint duration under the slow sink, max, in-flight target off",
                    *off_max as f64 / 1e6,
                    "ms",
                )
                .vs(format!("full rings ÷ sink rate = {bound_ms:.0} ms"), bound_ms),
            );
        }
    } else {
        s.rows.push(Row::not_run("checkpoint duration under the slow sink", "no checkpoint completed before the end"));
    }
    s.rows.push(Row::new("checkpoints expired or declined", summary.checkpoints.failed.len() as f64, "checkpoints"));
    // A window firing thousands of results into a slow sink: barriers pass between chunks.
    let (firing, per_window, result_delay) = window_firing(smoke);
    let firing_ms = per_window * result_delay.as_secs_f64() * 1e3;
    if let Some(max) = firing.iter().max() {
        let mut sorted = firing.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2] as f64 / 1e6;
        s.rows.push(
            Row::new(
                format!("checkpoint while a window fires into a slow sink, median ({} completed)", firing.len()),
                median,
                "ms",
            )
            .vs(format!("one window's firing: {per_window:.0} results ÷ sink = {firing_ms:.0} ms"), firing_ms),
        );
        s.rows.push(
            Row::new("checkpoint while a window fires into a slow sink, max", *max as f64 / 1e6, "ms")
                .vs(format!("one window's firing {firing_ms:.0} ms"), firing_ms),
        );
    }
    s.rows.push(
        Row::new("CPU while backpressured", steady_cost.cores(), "cores")
            .note("CPU-seconds per second of the whole process over the steady interval"),
    );

    s.setup = json!({
        "job": "gen (Generator, p=1, paced) → map (p=1) → sink (CountingSink with delay, p=1); chaining off: two rings",
        "source_offered_per_s": source_rate,
        "sink_per_record_us": delay.as_secs_f64() * 1e6,
        "sink_rate_per_s": SINK_RATE,
        "records": records,
        "warmup_s": warmup.as_secs_f64(),
        "pinning": pinning(&summary),
        "ring": { "slots": config.ring_slots, "slot_bytes": config.slot_bytes, "max_record_bytes": config.max_record_bytes },
        "record": { "type": "Event", "bytes": 32 },
        "idle_strategy": format!("{:?}", config.idle),
        "inflight_target_ms": target_ms,
        "target_off_checkpoint_durations_ns": off,
    });
    let subtasks: Vec<Value> = view
        .subtasks
        .iter()
        .map(|v| json!({ "subtask": v.owner, "busy": v.busy, "backpressured": v.backpressured, "idle": v.idle, "records_in_per_s": v.records_in_per_s }))
        .collect();
    s.details = json!({
        "steady_interval_s": interval_s,
        "subtasks_steady": subtasks,
        "rss_samples_bytes": rss,
        "sink_input_fill_samples": fills,
        "vm_hwm_bytes": hwm,
        "budget": budget,
        "summary": summary,
        "whole_run": total_cost.json(records),
    });
    s
}
