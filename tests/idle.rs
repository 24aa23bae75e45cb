//! More subtasks than cores, and an idle job that costs ~0 CPU (its own test binary, so the
//! CPU time it measures is this job's alone).

mod common;

use std::sync::Arc;
use std::time::Duration;
use weir::graph::Job;
use weir::operators::builtin::{CountingSink, Generator, Tally};
use weir::record::Event;
use weir::ring::process::{CpuScope, cpu_time};
use weir::runtime::JobError;

/// 14 subtasks on however many cores the machine has (2 here): the job runs to the end
/// with exact results, then an idle job of 10 parked subtasks uses almost no CPU.
#[test]
fn more_subtasks_than_cores_and_idle_costs_nothing() {
    let cores = core_affinity::get_core_ids().map(|c| c.len()).unwrap_or(1);
    const N: u64 = 300_000;
    let tally = Arc::new(Tally::default());
    let job = Job::new("many");
    let t = tally.clone();
    job.source("gen", 2, |info| Generator::events(info, N, 1_000))
        .rebalance()
        .map("a", |e: &Event| *e)
        .parallelism(4)
        .rebalance()
        .map("b", |e: &Event| *e)
        .parallelism(4)
        .key_by("k", |e: &Event| e.key)
        .sink("sink", 4, move |_| CountingSink::new(t.clone()));
    let summary = job.run().expect("job runs");
    assert_eq!(summary.subtasks.len(), 14);
    println!("{} subtasks on {cores} cores\n{summary}", summary.subtasks.len());
    assert_eq!(tally.totals(), Tally::expected(N));

    // Idle: sources with nothing to say, 10 subtasks parked on their rings and mailboxes.
    let mut running = common::quiet_job("idle").start().expect("job starts");
    std::thread::sleep(Duration::from_millis(500)); // settle into parking
    let before = cpu_time(CpuScope::Process);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_time(CpuScope::Process) - before;
    println!("idle job of 10 subtasks used {:.1} ms of CPU in 1 s", used.as_secs_f64() * 1e3);
    // Parked subtasks wake only at the 100 ms backstop: a few ms in all. 50 ms is 5 % of one core.
    assert!(used < Duration::from_millis(50), "an idle job should use ~0 CPU, used {used:?} in 1 s");
    running.cancel();
    assert!(matches!(running.wait(), Err(JobError::Cancelled)));
}
