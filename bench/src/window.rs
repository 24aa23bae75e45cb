//! Keyed event-time windows, end to end, through the engine.
//!
//! generator (10,000 keys, 1 µs of event time per event) → watermark assigner (chained) →
//! key_by → 1 s tumbling windows counting and summing per key → counting sink, at
//! parallelism 1 and 2 (source and windows both). Reports records/s (wall) and records per
//! CPU-second ([`crate::measure`]), and checks that the windows' counts add up to every
//! record.
//!
//! State: each window subtask's bounded cache over its core's RocksDB shard (the default
//! backend). 10,000 keys fit the cache, so the main rows measure the engine with RocksDB
//! opened but idle; one more row gives the windows a cache of a few hundred keys, so nearly
//! every record loads its key from RocksDB and evicts another — state larger than memory.
//! One row runs the in-memory backend for comparison. Each row says its backend, cache and
//! keys evicted. Used by `cargo bench --bench window` and `weir-bench window` / `all`.

use crate::measure::{Cost, measure, pinning};
use crate::report::{Row, Section, fmt_rate, mib};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use weir::graph::{Job, StateBackendKind};
use weir::operators::builtin::{CountingSink, Generator, Tally};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window};

/// Distinct keys.
pub const KEYS: u64 = 10_000;

/// The target of the RocksDB rows, records per CPU-second (issue #8).
pub const TARGET_PER_CPU_S: f64 = 4e6;

/// One measured configuration.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// Source and window parallelism.
    pub parallelism: u32,
    /// State backend.
    pub backend: StateBackendKind,
    /// Window cache per subtask.
    pub cache_bytes: u64,
    /// Records through the job.
    pub records: u64,
    /// Checkpoints (into a temporary directory) at this interval.
    pub checkpoints: Option<Duration>,
    /// Credit by time on (the default) or off (`inflight_target = None`).
    pub inflight_target: bool,
}

/// One measured run.
#[derive(Debug)]
pub struct Outcome {
    /// What ran.
    pub setup: Setup,
    /// Window results emitted.
    pub results: u64,
    /// What it cost (the whole `Job::run`).
    pub cost: Cost,
    /// Subtasks.
    pub subtasks: usize,
    /// subtask → CPU.
    pub pinning: Value,
    /// Largest RSS sampled while it ran.
    pub max_rss_bytes: u64,
    /// The job's declared memory budget.
    pub budget_bytes: u64,
    /// Keys the window caches evicted to the store.
    pub evicted_keys: u64,
    /// Checkpoints completed (the final one included), and their mean duration, ns.
    pub checkpoints: (usize, u64),
}

/// The job of one setup.
pub fn windows(s: Setup, tally: Arc<Tally>) -> Job {
    let (n, parallelism) = (s.records, s.parallelism);
    let job = Job::new(&format!("window-p{parallelism}"));
    job.configure(|c| {
        c.state.backend = s.backend;
        if !s.inflight_target {
            c.inflight_target = None;
        }
        if let Some(interval) = s.checkpoints {
            let dir = std::env::temp_dir().join(format!("weir-bench-checkpoints-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
                interval,
                ..weir::checkpoint::CheckpointSettings::new(dir)
            });
        }
    });
    job.source("gen", parallelism, move |info| Generator::events(info, n, KEYS))
        .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_millis(1)))
        .key_by("by_key", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_secs(1)))
        .cache_bytes(s.cache_bytes)
        .aggregate("per_second", parallelism, Aggregates::of(|e: &Event| e.value).count().sum())
        .sink("out", 1, move |_| CountingSink::new(tally.clone()));
    job
}

/// `"rocksdb"` or `"memory"`.
pub fn backend_name(b: StateBackendKind) -> &'static str {
    match b {
        StateBackendKind::RocksDb => "rocksdb",
        StateBackendKind::Memory => "memory",
    }
}

/// Run one setup and check that every record was counted once.
pub fn run(s: Setup) -> Outcome {
    let (n, parallelism) = (s.records, s.parallelism);
    let tally = Arc::new(Tally::default());
    let job = windows(s, tally.clone());
    let (summary, cost) = measure(|| job.run().unwrap_or_else(|e| panic!("p={parallelism}: {e}")));
    let (results, counted, _) = tally.totals();
    assert_eq!(counted, n, "p={parallelism}: the windows' counts add up to every record");
    let w = summary.node("per_second").expect("the window node");
    assert_eq!(w.late_records, 0, "nothing late");
    // The final checkpoint (the end of input) is the last; the mean is over the others.
    let all = &summary.checkpoints.completed;
    let done = if all.len() > 1 { &all[..all.len() - 1] } else { &all[..] };
    let mean = if done.is_empty() { 0 } else { done.iter().map(|c| c.1).sum::<u64>() / done.len() as u64 };
    if s.checkpoints.is_some() {
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("weir-bench-checkpoints-{}", std::process::id())),
        );
    }
    Outcome {
        checkpoints: (all.len(), mean),
        setup: s,
        evicted_keys: w.evicted_keys,
        results,
        cost,
        subtasks: summary.subtasks.len(),
        pinning: pinning(&summary),
        max_rss_bytes: summary.max_rss_bytes,
        budget_bytes: summary.budget.total_bytes(),
    }
}

/// The setups, in order: RocksDB p=1, p=2, memory p=1, RocksDB p=1 with a tiny cache.
pub fn setups(smoke: bool) -> Vec<Setup> {
    let n: u64 = if smoke { 200_000 } else { 20_000_000 };
    let default_cache = weir::window::DEFAULT_CACHE_BYTES;
    let setup = |parallelism, backend| Setup {
        parallelism,
        backend,
        cache_bytes: default_cache,
        records: n,
        checkpoints: None,
        inflight_target: true,
    };
    vec![
        setup(1, StateBackendKind::RocksDb),
        // p=2 without credit by time first: the baseline of the next row (its rings, from
        // two generators to two windows, are the ones the target sizes).
        Setup { inflight_target: false, ..setup(2, StateBackendKind::RocksDb) },
        setup(2, StateBackendKind::RocksDb),
        setup(1, StateBackendKind::Memory),
        // The same with checkpoints (RocksDB checkpoints of the shards, manifests). The run
        // takes about a second here: checkpoints every 200 ms, so several complete.
        Setup {
            checkpoints: Some(if smoke { Duration::from_millis(50) } else { Duration::from_millis(200) }),
            ..setup(2, StateBackendKind::RocksDb)
        },
        // A cache of a few hundred keys for 10,000: state larger than memory. Nearly every
        // record loads its key from RocksDB and evicts another, so fewer records.
        Setup { cache_bytes: weir::window::MIN_CACHE_BYTES, records: n / 40, ..setup(1, StateBackendKind::RocksDb) },
    ]
}

/// Every setup.
pub fn run_all(smoke: bool) -> Vec<Outcome> {
    setups(smoke).into_iter().map(run).collect()
}

/// The markdown table `cargo bench --bench window` prints.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::from(
        "| parallelism | state | in-flight target | cache | keys evicted | subtasks | records | results | wall s | records/s | CPU s | records per CPU-second |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for o in outcomes {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.2} M | {:.3} | {:.2} M |\n",
            o.setup.parallelism,
            backend_name(o.setup.backend),
            if o.setup.inflight_target { "on" } else { "off" },
            weir::telemetry::bytes(o.setup.cache_bytes),
            o.evicted_keys,
            o.subtasks,
            o.setup.records,
            o.results,
            o.cost.wall_s,
            o.cost.per_s(o.setup.records) / 1e6,
            o.cost.cpu_s,
            o.cost.per_cpu_s(o.setup.records) / 1e6
        ));
    }
    s
}

/// The workload and engine settings.
pub fn setup() -> Value {
    let config = Job::new("probe").config();
    json!({
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
        "rocksdb": {
            "block_cache_bytes": config.state.block_cache_bytes,
            "memtable_bytes": config.state.memtable_bytes,
        },
    })
}

/// Every run as JSON.
pub fn details(outcomes: &[Outcome]) -> Value {
    json!(
        outcomes
            .iter()
            .map(|o| json!({
                "parallelism": o.setup.parallelism,
                "state_backend": backend_name(o.setup.backend),
                "inflight_target": o.setup.inflight_target,
                "window_cache_bytes": o.setup.cache_bytes,
                "evicted_keys": o.evicted_keys,
                "subtasks": o.subtasks,
                "pinning": o.pinning,
                "records": o.setup.records,
                "window_results": o.results,
                "wall_s": o.cost.wall_s,
                "cpu_s": o.cost.cpu_s,
                "records_per_s": o.cost.per_s(o.setup.records),
                "records_per_cpu_s": o.cost.per_cpu_s(o.setup.records),
                "max_rss_bytes": o.max_rss_bytes,
                "checkpoints_completed": o.checkpoints.0,
                "checkpoint_mean_ns": o.checkpoints.1,
                "budget_bytes": o.budget_bytes,
            }))
            .collect::<Vec<_>>()
    )
}

/// The report section. The target (≥ 4 M records per CPU-second) is on the RocksDB rows with
/// the default cache; the in-memory row is the baseline they are compared with.
pub fn section(smoke: bool) -> Section {
    let outcomes = run_all(smoke);
    let mut s = Section::new("window", "Keyed 1 s tumbling count + sum over 10,000 keys (RocksDB state)");
    let memory = outcomes.iter().find(|o| o.setup.backend == StateBackendKind::Memory).map(|o| {
        let r = o.setup.records;
        (o.cost.per_s(r), o.cost.per_cpu_s(r))
    });
    for o in &outcomes {
        let r = o.setup.records;
        if !o.setup.inflight_target {
            let on = outcomes.iter().find(|x| {
                x.setup.inflight_target
                    && (x.setup.parallelism, x.setup.backend, x.setup.cache_bytes, x.setup.checkpoints)
                        == (o.setup.parallelism, o.setup.backend, o.setup.cache_bytes, o.setup.checkpoints)
            });
            if let Some(on) = on {
                let off_cpu = o.cost.per_cpu_s(r) / 1e6;
                s.rows.push(
                    Row::new(
                        format!(
                            "window p={}, {}: records per CPU-second, in-flight target on (the default) vs off",
                            o.setup.parallelism,
                            backend_name(o.setup.backend)
                        ),
                        on.cost.per_cpu_s(on.setup.records) / 1e6,
                        "M records/CPU-s",
                    )
                    .vs(format!("target off {off_cpu:.2} M/CPU-s"), off_cpu)
                    .target("≥ 0.97× off", |ratio| ratio >= 0.97),
                );
            }
            continue;
        }
        let small_cache = o.setup.cache_bytes < weir::window::DEFAULT_CACHE_BYTES;
        let label = format!(
            "window p={}, {}{}{}",
            o.setup.parallelism,
            backend_name(o.setup.backend),
            match o.setup.checkpoints {
                Some(i) => format!(
                    ", checkpoints every {} ms ({} completed, mean {:.1} ms)",
                    i.as_millis(),
                    o.checkpoints.0,
                    o.checkpoints.1 as f64 / 1e6
                ),
                None => String::new(),
            },
            if small_cache {
                format!(
                    ", cache {} (state outgrows it: {} keys evicted)",
                    weir::telemetry::bytes(o.setup.cache_bytes),
                    o.evicted_keys
                )
            } else {
                String::new()
            }
        );
        let mut wall = Row::new(format!("{label}: records/s"), o.cost.per_s(r) / 1e6, "M records/s");
        let mut cpu =
            Row::new(format!("{label}: records per CPU-second"), o.cost.per_cpu_s(r) / 1e6, "M records/CPU-s");
        let rocks = o.setup.backend == StateBackendKind::RocksDb;
        if let (true, Some((m_rate, m_cpu))) = (rocks, memory) {
            wall = wall.vs(format!("memory backend p=1 {}", fmt_rate(m_rate)), m_rate / 1e6);
            cpu = cpu.vs(format!("memory backend p=1 {:.2} M/CPU-s", m_cpu / 1e6), m_cpu / 1e6);
        }
        if rocks && !small_cache {
            // The target is on the figure itself, not on the ratio to the memory backend.
            cpu.target = Some("value ≥ 4 M records/CPU-s".into());
            cpu.met = cpu.value.map(|v| v * 1e6 >= TARGET_PER_CPU_S);
        }
        s.rows.push(wall);
        s.rows.push(cpu);
        if rocks && !small_cache {
            s.rows.push(
                Row::new(format!("{label}: max RSS"), mib(o.max_rss_bytes), "MiB")
                    .vs(format!("budget {:.1} MiB", mib(o.budget_bytes)), mib(o.budget_bytes))
                    .target("≤ 1.0× budget", |x| x <= 1.0),
            );
        }
    }
    let mut setup = setup();
    setup["pinning"] = json!(
        outcomes
            .iter()
            .map(|o| json!({ "parallelism": o.setup.parallelism, "backend": backend_name(o.setup.backend), "map": o.pinning }))
            .collect::<Vec<_>>()
    );
    s.setup = setup;
    s.details = details(&outcomes);
    s
}
