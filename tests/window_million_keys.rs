//! 10^6 distinct keys live at once in event-time windows, with window caches that hold a
//! tenth of them: the rest is evicted to the RocksDB shards and fires from there. Every
//! result is exact, and the process stays under the job's memory budget, which counts the
//! caches' bound and RocksDB's (block cache, memtables, table readers, shards). (Its own test
//! file, so the RSS the job samples is this job's alone.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weir::graph::{Job, StateBackendKind};
use weir::operators::builtin::Generator;
use weir::operators::{Halt, Sink};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window, WindowResult};

const KEYS: u64 = 1_000_000;
const PER_KEY: u64 = 3;

/// Checks each result as it comes (keeping them would cost more memory than the job) and
/// adds up what it saw: results, Σ key, Σ key² (so a missing key and a doubled one show).
#[derive(Default)]
struct Check {
    results: AtomicU64,
    key_sum: AtomicU64,
    key_square_sum: AtomicU64,
    wrong: AtomicU64,
}

struct CheckSink(Arc<Check>);

impl Sink<WindowResult> for CheckSink {
    fn write(&mut self, r: &WindowResult) -> Result<(), Halt> {
        let c = &self.0;
        let exact = r.count == PER_KEY && r.sum == PER_KEY * (r.key % 1000 + 1) && r.start_ns == 0 && r.late == 0;
        if !exact {
            c.wrong.fetch_add(1, Ordering::Relaxed);
        }
        c.results.fetch_add(1, Ordering::Relaxed);
        c.key_sum.fetch_add(r.key, Ordering::Relaxed);
        c.key_square_sum.fetch_add(r.key.wrapping_mul(r.key), Ordering::Relaxed);
        Ok(())
    }
}

/// 3 × 10^6 events over 10^6 keys (three in a row each), all in one 1 s tumbling window, so
/// every key's state is live at once when the window fires; 2 window subtasks with 16 MiB of
/// cache each (about 70,000 keys): one exact result per key, and max RSS under the budget.
#[test]
fn a_million_keys_exact_and_under_budget() {
    let check = Arc::new(Check::default());
    let job = Job::new("million-keys");
    job.configure(|c| {
        c.pinning = false;
        c.state.backend = StateBackendKind::RocksDb;
    });
    let c = check.clone();
    job.source("gen", 1, |info| {
        Generator::new(info, Some(KEYS * PER_KEY), |seq| {
            let key = seq / PER_KEY;
            Event { key, value: key % 1000 + 1, time_ns: seq * 300, seq }
        })
    })
    .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_millis(1)))
    .key_by("k", |e: &Event| e.key)
    .window(Window::tumbling(Duration::from_secs(1)))
    .cache_bytes(16 << 20)
    .aggregate("w", 2, Aggregates::of(|e: &Event| e.value).count().sum())
    .sink("out", 1, move |_| CheckSink(c.clone()));
    let summary = job.run().expect("the job runs");
    assert_eq!(check.wrong.load(Ordering::Relaxed), 0, "every result exact");
    assert_eq!(check.results.load(Ordering::Relaxed), KEYS, "one result per key");
    assert_eq!(check.key_sum.load(Ordering::Relaxed), KEYS * (KEYS - 1) / 2);
    let squares = (0..KEYS).fold(0u64, |s, k| s.wrapping_add(k.wrapping_mul(k)));
    assert_eq!(check.key_square_sum.load(Ordering::Relaxed), squares, "no key twice");
    let w = summary.node("w").unwrap();
    assert_eq!(w.late_records, 0);
    assert!(w.evicted_keys >= KEYS / 2, "state larger than the caches went to RocksDB ({} keys)", w.evicted_keys);
    let budget = summary.budget.total_bytes();
    assert!(summary.max_rss_bytes < budget, "max RSS {} over the budget: {}", summary.max_rss_bytes, summary.budget);
    println!("max RSS {} MiB of {}", summary.max_rss_bytes >> 20, summary.budget);
}
