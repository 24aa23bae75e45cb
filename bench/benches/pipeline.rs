//! Runtime benchmark: whole jobs, end to end, through the engine's own subtasks and rings.
//!
//! - **stateless chain**: generator → map → filter → map → null sink, parallelism 1, once
//!   chained (one thread, plain calls) and once unchained (five threads, four rings);
//! - **key_by exchange**: generator → key_by → counting sink, at parallelism 1 and 2 (the
//!   exchange is one ring at p=1 and four at p=2).
//!
//! Each reports records/s (wall) and records per CPU-second (getrusage of the process, so it
//! counts every thread's work, idle spinning included) — per CPU-second is what compares
//! across machines. Records are 32-byte fixed-layout `Event`s, read in place from the rings.
//! Run: `cargo bench -p weir-bench --bench pipeline` (prints a markdown table, writes
//! `target/weir-bench/pipeline.json`); `WEIR_BENCH_SMOKE=1` runs it tiny (CI).

use serde_json::json;
use std::sync::Arc;
use std::time::Instant;
use weir::graph::Job;
use weir::operators::builtin::{CountingSink, Generator, NullSink, Tally};
use weir::record::Event;
use weir::ring::process::{CpuScope, cpu_time};

struct Outcome {
    name: String,
    records: u64,
    wall_s: f64,
    cpu_s: f64,
    subtasks: usize,
    cpus: Vec<Option<usize>>,
}

fn run(name: &str, job: &Job, records: u64, check: impl FnOnce()) -> Outcome {
    let cpu0 = cpu_time(CpuScope::Process);
    let t0 = Instant::now();
    let summary = job.run().unwrap_or_else(|e| panic!("{name}: {e}"));
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_s = (cpu_time(CpuScope::Process) - cpu0).as_secs_f64();
    check();
    Outcome {
        name: name.into(),
        records,
        wall_s,
        cpu_s,
        subtasks: summary.subtasks.len(),
        cpus: summary.subtasks.iter().map(|s| s.cpu).collect(),
    }
}

fn chain(n: u64, chaining: bool) -> Job {
    let job = Job::new(if chaining { "chain-chained" } else { "chain-unchained" });
    job.configure(|c| c.chaining = chaining);
    job.source("gen", 1, move |info| Generator::events(info, n, 10_000))
        .map("m1", |e: &Event| Event { value: e.value + 1, ..*e })
        .filter("f", |e: &Event| e.value > 0)
        .map("m2", |e: &Event| Event { key: e.key ^ 1, ..*e })
        .sink("sink", 1, |_| NullSink);
    job
}

fn keyed(n: u64, parallelism: u32, tally: Arc<Tally>) -> Job {
    let job = Job::new(&format!("keyby-p{parallelism}"));
    job.source("gen", parallelism, move |info| Generator::events(info, n, 10_000)).key_by("k", |e: &Event| e.key).sink(
        "count",
        parallelism,
        move |_| CountingSink::new(tally.clone()),
    );
    job
}

fn main() {
    // cargo bench passes `--bench`; `--test` (cargo bench -- --test) means run tiny, once.
    let test_mode = std::env::args().any(|a| a == "--test");
    let smoke = weir_bench::smoke() || test_mode;
    let n: u64 = if smoke { 100_000 } else { 10_000_000 };
    let config = Job::new("probe").config();

    let mut outcomes = vec![run("stateless chain, chained", &chain(n, true), n, || {})];
    outcomes.push(run("stateless chain, unchained", &chain(n, false), n, || {}));
    for p in [1u32, 2] {
        let tally = Arc::new(Tally::default());
        let t = tally.clone();
        outcomes.push(run(&format!("key_by exchange, p={p}"), &keyed(n, p, tally), n, move || {
            assert_eq!(t.totals(), Tally::expected(n), "key_by p={p}: every record exactly once");
        }));
    }

    println!("\n| workload | subtasks | records | wall s | records/s | CPU s | records per CPU-second |");
    println!("|---|---|---|---|---|---|---|");
    for o in &outcomes {
        println!(
            "| {} | {} | {} | {:.3} | {:.2} M | {:.3} | {:.2} M |",
            o.name,
            o.subtasks,
            o.records,
            o.wall_s,
            o.records as f64 / o.wall_s / 1e6,
            o.cpu_s,
            o.records as f64 / o.cpu_s.max(1e-9) / 1e6
        );
    }
    let report = json!({
        "benchmark": "pipeline",
        "environment": weir_bench::environment(),
        "record": { "type": "Event", "bytes": 32, "codec": "fixed layout, read in place" },
        "ring": { "slots": config.ring_slots, "slot_bytes": config.slot_bytes },
        "idle_strategy": format!("{:?}", config.idle),
        "results": outcomes.iter().map(|o| json!({
            "workload": o.name,
            "subtasks": o.subtasks,
            "pinning": o.cpus,
            "records": o.records,
            "wall_s": o.wall_s,
            "cpu_s": o.cpu_s,
            "records_per_s": o.records as f64 / o.wall_s,
            "records_per_cpu_s": o.records as f64 / o.cpu_s.max(1e-9),
        })).collect::<Vec<_>>(),
    });
    let path = weir_bench::report_dir().join("pipeline.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json")).expect("write report");
    println!("\nwritten: {}", path.display());
}
