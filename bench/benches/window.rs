//! Window benchmark: keyed event-time windows, end to end, through the engine.
//!
//! generator (10,000 keys, 1 µs of event time per event) → watermark assigner (chained) →
//! key_by → 1 s tumbling windows counting and summing per key → counting sink, at
//! parallelism 1 and 2 (source and windows both). Reports records/s (wall) and records per
//! CPU-second (getrusage of the process: every thread's work, idle spinning included), and
//! checks that the windows' counts add up to every record.
//!
//! State: each window subtask's bounded cache over its core's RocksDB shard (the default
//! backend). 10,000 keys fit the cache, so the main rows measure the engine with RocksDB
//! opened but idle; one more row gives the windows a cache of a few hundred keys, so nearly
//! every record loads its key from RocksDB and evicts another — state larger than memory.
//! Each row says its backend, cache and keys evicted.
//!
//! Run: `cargo bench -p weir-bench --bench window` (prints a markdown table, writes
//! `target/weir-bench/window.json`); `WEIR_BENCH_SMOKE=1` runs it tiny (CI).

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir::graph::{Job, StateBackendKind};
use weir::operators::builtin::{CountingSink, Generator, Tally};
use weir::record::Event;
use weir::ring::process::{CpuScope, cpu_time};
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window};

const KEYS: u64 = 10_000;

/// One measured configuration.
#[derive(Clone, Copy)]
struct Setup {
    parallelism: u32,
    backend: StateBackendKind,
    cache_bytes: u64,
    records: u64,
}

struct Outcome {
    setup: Setup,
    records: u64,
    results: u64,
    wall_s: f64,
    cpu_s: f64,
    subtasks: usize,
    cpus: Vec<Option<usize>>,
    max_rss_bytes: u64,
    budget_bytes: u64,
    evicted_keys: u64,
}

fn windows(s: Setup, tally: Arc<Tally>) -> Job {
    let (n, parallelism) = (s.records, s.parallelism);
    let job = Job::new(&format!("window-p{parallelism}"));
    job.configure(|c| c.state.backend = s.backend);
    job.source("gen", parallelism, move |info| Generator::events(info, n, KEYS))
        .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_millis(1)))
        .key_by("by_key", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_secs(1)))
        .cache_bytes(s.cache_bytes)
        .aggregate("per_second", parallelism, Aggregates::of(|e: &Event| e.value).count().sum())
        .sink("out", 1, move |_| CountingSink::new(tally.clone()));
    job
}

fn backend_name(b: StateBackendKind) -> &'static str {
    match b {
        StateBackendKind::RocksDb => "rocksdb",
        StateBackendKind::Memory => "memory",
    }
}

fn run(s: Setup) -> Outcome {
    let (n, parallelism) = (s.records, s.parallelism);
    let tally = Arc::new(Tally::default());
    let job = windows(s, tally.clone());
    let cpu0 = cpu_time(CpuScope::Process);
    let t0 = Instant::now();
    let summary = job.run().unwrap_or_else(|e| panic!("p={parallelism}: {e}"));
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_s = (cpu_time(CpuScope::Process) - cpu0).as_secs_f64();
    let (results, counted, _) = tally.totals();
    assert_eq!(counted, n, "p={parallelism}: the windows' counts add up to every record");
    let w = summary.node("per_second").expect("the window node");
    assert_eq!(w.late_records, 0, "nothing late");
    Outcome {
        setup: s,
        evicted_keys: w.evicted_keys,
        records: n,
        results,
        wall_s,
        cpu_s,
        subtasks: summary.subtasks.len(),
        cpus: summary.subtasks.iter().map(|s| s.cpu).collect(),
        max_rss_bytes: summary.max_rss_bytes,
        budget_bytes: summary.budget.total_bytes(),
    }
}

fn main() {
    // cargo bench passes `--bench`; `--test` (cargo bench -- --test) means run tiny, once.
    let test_mode = std::env::args().any(|a| a == "--test");
    let smoke = weir_bench::smoke() || test_mode;
    let n: u64 = if smoke { 200_000 } else { 20_000_000 };
    let config = Job::new("probe").config();
    let default_cache = weir::window::DEFAULT_CACHE_BYTES;
    let setups = [
        Setup { parallelism: 1, backend: StateBackendKind::RocksDb, cache_bytes: default_cache, records: n },
        Setup { parallelism: 2, backend: StateBackendKind::RocksDb, cache_bytes: default_cache, records: n },
        Setup { parallelism: 1, backend: StateBackendKind::Memory, cache_bytes: default_cache, records: n },
        // A cache of a few hundred keys for 10,000: state larger than memory. Nearly every
        // record loads its key from RocksDB and evicts another, so fewer records.
        Setup {
            parallelism: 1,
            backend: StateBackendKind::RocksDb,
            cache_bytes: weir::window::MIN_CACHE_BYTES,
            records: n / 40,
        },
    ];
    let outcomes: Vec<Outcome> = setups.into_iter().map(run).collect();

    println!("\nkeyed 1 s tumbling count + sum over {KEYS} keys");
    println!(
        "\n| parallelism | state | cache | keys evicted | subtasks | records | results | wall s | records/s | CPU s | records per CPU-second |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for o in &outcomes {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.2} M | {:.3} | {:.2} M |",
            o.setup.parallelism,
            backend_name(o.setup.backend),
            weir::telemetry::bytes(o.setup.cache_bytes),
            o.evicted_keys,
            o.subtasks,
            o.records,
            o.results,
            o.wall_s,
            o.records as f64 / o.wall_s / 1e6,
            o.cpu_s,
            o.records as f64 / o.cpu_s.max(1e-9) / 1e6
        );
    }
    let report = json!({
        "benchmark": "window",
        "environment": weir_bench::environment(),
        "workload": {
            "window": "tumbling 1 s, event time",
            "aggregates": ["count", "sum"],
            "keys": KEYS,
            "event_time_per_record_ns": 1_000,
            "watermark": "bounded out-of-orderness 1 ms, every 1024 records or 200 ms",
            "record": { "type": "Event", "bytes": 32 },
            "result": { "type": "WindowResult", "bytes": 72 },
        },
        "ring": { "slots": config.ring_slots, "slot_bytes": config.slot_bytes },
        "idle_strategy": format!("{:?}", config.idle),
        "results": outcomes.iter().map(|o| json!({
            "parallelism": o.setup.parallelism,
            "state_backend": backend_name(o.setup.backend),
            "window_cache_bytes": o.setup.cache_bytes,
            "evicted_keys": o.evicted_keys,
            "subtasks": o.subtasks,
            "pinning": o.cpus,
            "records": o.records,
            "window_results": o.results,
            "wall_s": o.wall_s,
            "cpu_s": o.cpu_s,
            "records_per_s": o.records as f64 / o.wall_s,
            "records_per_cpu_s": o.records as f64 / o.cpu_s.max(1e-9),
            "max_rss_bytes": o.max_rss_bytes,
            "budget_bytes": o.budget_bytes,
        })).collect::<Vec<_>>(),
    });
    let path = weir_bench::report_dir().join("window.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json")).expect("write report");
    println!("\nwritten: {}", path.display());
}
