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

use crate::measure::{Cost, ThreadCpu, io_bytes, measure, pinning};
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
    /// Distinct keys.
    pub keys: u64,
    /// Tumbling window size.
    pub window: Duration,
    /// Keys drawn Zipf(1.1) by rank (else uniformly).
    pub zipf: bool,
    /// The cache was sized to hold this many keys (`None`: given in bytes).
    pub cache_keys: Option<u64>,
}

impl Setup {
    /// Whether the state outgrows the window cache.
    pub fn outgrows_cache(&self) -> bool {
        self.cache_bytes < weir::window::DEFAULT_CACHE_BYTES
    }
}

/// Zipf(s) over `n` ranks by Walker's alias method: O(1) per draw (two table reads), so the
/// generator's cost does not depend on the distribution.
struct Alias {
    prob: Vec<f32>,
    alias: Vec<u32>,
}

impl Alias {
    fn zipf(n: u64, s: f64) -> Alias {
        let n = n as usize;
        let weights: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-s)).collect();
        let total: f64 = weights.iter().sum();
        let mut scaled: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| scaled[i] < 1.0);
        let (mut prob, mut alias) = (vec![1.0f32; n], (0..n as u32).collect::<Vec<u32>>());
        while let (Some(l), Some(g)) = (small.pop(), large.last().copied()) {
            prob[l] = scaled[l] as f32;
            alias[l] = g as u32;
            scaled[g] -= 1.0 - scaled[l];
            if scaled[g] < 1.0 {
                large.pop();
                small.push(g);
            }
        }
        Alias { prob, alias }
    }

    /// The rank drawn by the 64 random bits `r`.
    #[inline]
    fn draw(&self, r: u64) -> u64 {
        let i = ((r >> 32) * self.prob.len() as u64) >> 32;
        let frac = (r & 0xFFFF_FFFF) as f32 / 4_294_967_296.0;
        if frac < self.prob[i as usize] { i } else { self.alias[i as usize] as u64 }
    }
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
    /// The longest checkpoint (the final one excluded), ns, and the mean bytes per checkpoint.
    pub checkpoint_max_ns: u64,
    pub checkpoint_bytes_mean: u64,
    /// The mean bytes a checkpoint added (files its predecessor did not have).
    pub checkpoint_added_bytes_mean: u64,
    /// Where the checkpoints' duration went, each phase's mean over them (the final one
    /// excluded), ns: `id` is the number of checkpoints averaged.
    pub checkpoint_phases_mean: weir::runtime::CheckpointPhases,
    /// CPU seconds of the window subtasks' threads and of RocksDB's background threads.
    pub window_cpu_s: f64,
    pub rocksdb_cpu_s: f64,
    /// Bytes read and written through system calls while it ran (RocksDB's file I/O).
    pub io_read_bytes: u64,
    pub io_written_bytes: u64,
}

/// The mean of `f` over `items` (0 for none).
fn mean_of<T>(items: &[T], f: impl Fn(&T) -> u64) -> u64 {
    if items.is_empty() { 0 } else { items.iter().map(f).sum::<u64>() / items.len() as u64 }
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
    let keys = s.keys;
    let zipf = s.zipf.then(|| Arc::new(Alias::zipf(keys, 1.1)));
    job.source("gen", parallelism, move |info| match &zipf {
        None => Generator::events(info, n, keys),
        Some(z) => {
            let z = z.clone();
            Generator::new(info, Some(n), move |seq| {
                let r = weir::record::hash_key(&seq);
                // Ranks to keys by an odd multiplier: hot keys spread over the key groups.
                let key = z.draw(r).wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys;
                Event { key, value: seq % 100 + 1, time_ns: seq * 1_000, seq }
            })
        }
    })
    .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_millis(1)))
    .key_by("by_key", |e: &Event| e.key)
    .window(Window::tumbling(s.window))
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
    let threads = ThreadCpu::start();
    let io_before = io_bytes();
    let (summary, cost) = measure(|| job.run().unwrap_or_else(|e| panic!("p={parallelism}: {e}")));
    let io_after = io_bytes();
    let [window_cpu_s, rocksdb_cpu_s]: [f64; 2] = threads
        .stop(&[&|name: &str| name.starts_with("per_second"), &|name: &str| name.starts_with("rocksdb")])
        .try_into()
        .expect("two picks");
    let (results, counted, _) = tally.totals();
    assert_eq!(counted, n, "p={parallelism}: the windows' counts add up to every record");
    let w = summary.node("per_second").expect("the window node");
    assert_eq!(w.late_records, 0, "nothing late");
    // The final checkpoint (the end of input) is the last; the mean is over the others.
    let all = &summary.checkpoints.completed;
    let done = if all.len() > 1 { &all[..all.len() - 1] } else { &all[..] };
    let mean = mean_of(done, |c| c.1);
    let checkpoint_max_ns = done.iter().map(|c| c.1).max().unwrap_or(0);
    let checkpoint_bytes_mean = mean_of(done, |c| c.2);
    let added = &summary.checkpoints.added;
    let added = if added.len() > 1 { &added[..added.len() - 1] } else { &added[..] };
    let checkpoint_added_bytes_mean = mean_of(added, |c| c.1);
    let phases = &summary.checkpoints.phases;
    let checkpoint_phases_mean = weir::runtime::CheckpointPhases {
        id: phases.len() as u64,
        start_delay_ns: mean_of(phases, |p| p.start_delay_ns),
        alignment_ns: mean_of(phases, |p| p.alignment_ns),
        sync_ns: mean_of(phases, |p| p.sync_ns),
    };
    if s.checkpoints.is_some() {
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("weir-bench-checkpoints-{}", std::process::id())),
        );
    }
    eprintln!(
        "window: {} keys{}, cache {}, p={}, {} records: {:.2} M/CPU-s ({:.1} s wall, window threads {:.1} s, rocksdb {:.1} s CPU), {} checkpoints; max RSS {}, {}",
        s.keys,
        if s.zipf { " zipf" } else { "" },
        weir::telemetry::bytes(s.cache_bytes),
        s.parallelism,
        n,
        cost.per_cpu_s(n) / 1e6,
        cost.wall_s,
        window_cpu_s,
        rocksdb_cpu_s,
        all.len(),
        weir::telemetry::bytes(summary.max_rss_bytes),
        summary.budget
    );
    Outcome {
        checkpoints: (all.len(), mean),
        checkpoint_max_ns,
        checkpoint_bytes_mean,
        checkpoint_added_bytes_mean,
        checkpoint_phases_mean,
        window_cpu_s,
        rocksdb_cpu_s,
        io_read_bytes: io_after.0 - io_before.0,
        io_written_bytes: io_after.1 - io_before.1,
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
        keys: KEYS,
        window: Duration::from_secs(1),
        zipf: false,
        cache_keys: None,
    };
    let mut rows = vec![
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
    ];
    rows.extend(large_setups(smoke));
    rows
}

/// State far larger than the cache (issue #14): 10^6 keys with 1 s windows (about 632,000
/// keys live per window) and 10^7 keys with 10 s windows (about 6.3 M live); the cache holds
/// a tenth or a hundredth of the keys. Three windows each (the 10^7 row one and a half).
pub fn large_setups(smoke: bool) -> Vec<Setup> {
    let (keys, big) = if smoke { (10_000, 100_000) } else { (1_000_000, 10_000_000) };
    let large = |keys: u64, ratio: u64, window_s: u64| {
        let cache_keys = keys / ratio;
        Setup {
            parallelism: 1,
            backend: StateBackendKind::RocksDb,
            cache_bytes: weir::window::cache_bytes_for_keys(cache_keys),
            // 1 µs of event time per record: a window of `window_s` is that many million.
            records: 3 * window_s * if smoke { 100_000 } else { 1_000_000 },
            checkpoints: None,
            inflight_target: true,
            keys,
            window: Duration::from_secs(window_s),
            zipf: false,
            cache_keys: Some(cache_keys),
        }
    };
    let every_s = Some(Duration::from_secs(1));
    // (Smoke: 1 s windows, so the row stays as small as the others.)
    let big_window_s = if smoke { 1 } else { 10 };
    vec![
        large(keys, 10, 1),
        large(keys, 100, 1),
        Setup { zipf: true, ..large(keys, 10, 1) },
        Setup { parallelism: 2, ..large(keys, 10, 1) },
        // Ten windows (about ten 1 s checkpoints): enough to set its checkpoint figures
        // against the 10^7-key row's.
        Setup {
            checkpoints: every_s,
            records: large(keys, 10, 1).records / 3 * if smoke { 3 } else { 10 },
            ..large(keys, 10, 1)
        },
        // One and a half windows: every window fires once with ~6.3 M keys live. Not run by
        // default (`WEIR_BENCH_WINDOW=largest`): about three minutes of two cores. (Before
        // checkpoints were incremental each 1 s checkpoint copied the whole cache, 10^6
        // keys, into RocksDB and deleted it again; compaction fell behind and the row did
        // not finish within 600 s.)
        Setup {
            checkpoints: every_s,
            records: large(big, 10, big_window_s).records / 2,
            ..large(big, 10, big_window_s)
        },
        // The same 10^7 keys with the 10^6-key row's cache (10^5 keys): what a checkpoint
        // writes is bounded by the cache either way, so against that row only the total
        // state differs (about 10× the live keys). The row above changes 10× as many keys
        // per checkpoint (its cache is 10× larger). Also only on request, with the row above.
        Setup {
            checkpoints: every_s,
            records: large(big, 100, big_window_s).records / 2,
            ..large(big, 100, big_window_s)
        },
    ]
}

/// Every setup but the 10^7-key row; `WEIR_BENCH_WINDOW=large` runs only the
/// state-larger-than-cache rows (10^6 keys; `=tenfold` the first of them, `=hundredfold` the
/// second), `=largest` the 10^7-key rows (with the 10^6-key checkpointed row, their
/// baseline), `=small` the
/// others, `=cached` the all-cached RocksDB row at p=1, `=checkpointed` the 10^6-key row
/// with 1 s checkpoints.
pub fn run_all(smoke: bool) -> Vec<Outcome> {
    let only = std::env::var("WEIR_BENCH_WINDOW").unwrap_or_default();
    setups(smoke)
        .into_iter()
        .filter(|s| match only.as_str() {
            "large" => s.cache_keys.is_some() && s.keys < 10_000_000,
            // The first of those alone (10^6 uniform keys, cache 10×, p=1; for A/B runs).
            "tenfold" => {
                s.cache_keys.is_some_and(|c| c * 10 == s.keys)
                    && s.keys < 10_000_000
                    && !s.zipf
                    && s.parallelism == 1
                    && s.checkpoints.is_none()
            }
            // The same with a cache of a hundredth of the keys.
            "hundredfold" => {
                s.cache_keys.is_some_and(|c| c * 100 == s.keys)
                    && s.keys < 10_000_000
                    && s.parallelism == 1
                    && s.checkpoints.is_none()
            }
            // With the 10^6-key checkpointed row: the baseline of their checkpoint figures.
            "largest" => s.cache_keys.is_some() && (s.keys >= 10_000_000 || s.checkpoints.is_some()),
            "small" => s.cache_keys.is_none(),
            // The 10^6-key row with 1 s checkpoints alone (for A/B runs of checkpoint cost).
            "checkpointed" => s.cache_keys.is_some() && s.keys < 10_000_000 && s.checkpoints.is_some(),
            // The all-cached RocksDB row at p=1 alone (for A/B runs).
            "cached" => {
                s.cache_keys.is_none()
                    && !s.outgrows_cache()
                    && s.parallelism == 1
                    && s.backend == StateBackendKind::RocksDb
                    && s.checkpoints.is_none()
            }
            // The 10^7-key row takes minutes (see large_setups): only on request.
            _ => !(s.cache_keys.is_some() && s.keys >= 10_000_000 && !smoke),
        })
        .map(run)
        .collect()
}

/// The markdown table `cargo bench --bench window` prints.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::from(
        "| parallelism | state | in-flight target | keys | cache | keys evicted | subtasks | records | results | wall s | records/s | CPU s | records per CPU-second |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for o in outcomes {
        s.push_str(&format!(
            "| {} | {} | {} | {}{} | {} | {} | {} | {} | {} | {:.3} | {:.2} M | {:.3} | {:.2} M |\n",
            o.setup.parallelism,
            backend_name(o.setup.backend),
            if o.setup.inflight_target { "on" } else { "off" },
            o.setup.keys,
            if o.setup.zipf { " zipf" } else { "" },
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
                "keys": o.setup.keys,
                "key_distribution": if o.setup.zipf { "zipf 1.1" } else { "uniform" },
                "window_s": o.setup.window.as_secs_f64(),
                "cache_keys": o.setup.cache_keys,
                "window_threads_cpu_s": o.window_cpu_s,
                "rocksdb_background_cpu_s": o.rocksdb_cpu_s,
                "io_read_bytes": o.io_read_bytes,
                "io_written_bytes": o.io_written_bytes,
                "checkpoint_max_ns": o.checkpoint_max_ns,
                "checkpoint_bytes_mean": o.checkpoint_bytes_mean,
                "checkpoint_added_bytes_mean": o.checkpoint_added_bytes_mean,
                "checkpoints_completed": o.checkpoints.0,
                "checkpoint_mean_ns": o.checkpoints.1,
                "checkpoint_start_delay_mean_ns": o.checkpoint_phases_mean.start_delay_ns,
                "checkpoint_alignment_mean_ns": o.checkpoint_phases_mean.alignment_ns,
                "checkpoint_sync_mean_ns": o.checkpoint_phases_mean.sync_ns,
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
        if o.setup.cache_keys.is_some() {
            large_rows(&mut s, o, &outcomes);
            continue;
        }
        let small_cache = o.setup.cache_bytes < weir::window::DEFAULT_CACHE_BYTES;
        let label = format!(
            "window p={}, {}{}{}",
            o.setup.parallelism,
            backend_name(o.setup.backend),
            match o.setup.checkpoints {
                Some(i) => format!(
                    ", checkpoints every {} ms ({} completed, mean {:.1} ms: barrier's start delay {:.1}, \
                     alignment {:.1}, sync {:.1})",
                    i.as_millis(),
                    o.checkpoints.0,
                    o.checkpoints.1 as f64 / 1e6,
                    o.checkpoint_phases_mean.start_delay_ns as f64 / 1e6,
                    o.checkpoint_phases_mean.alignment_ns as f64 / 1e6,
                    o.checkpoint_phases_mean.sync_ns as f64 / 1e6
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

/// "10^6" for powers of ten, else the number.
fn keys_text(n: u64) -> String {
    let exp = (n as f64).log10().round() as u32;
    if 10u64.pow(exp) == n { format!("10^{exp}") } else { n.to_string() }
}

/// The label of a state-larger-than-cache row.
fn large_label(o: &Outcome) -> String {
    let st = &o.setup;
    let keys = st.keys;
    let cache_keys = st.cache_keys.unwrap_or(0);
    format!(
        "window state ≫ cache: {} keys {}, {} s windows, cache holds {} keys ({}×), p={}{}",
        keys_text(keys),
        if st.zipf { "Zipf(1.1)" } else { "uniform" },
        st.window.as_secs(),
        keys_text(cache_keys),
        keys / cache_keys.max(1),
        st.parallelism,
        if st.checkpoints.is_some() { ", checkpoints every 1 s" } else { "" }
    )
}

/// The rows of one state-larger-than-cache run: throughput against the targets, where
/// the CPU goes, RocksDB's I/O, memory against the budget, and checkpoints.
fn large_rows(s: &mut Section, o: &Outcome, outcomes: &[Outcome]) {
    let st = &o.setup;
    let r = st.records;
    let label = large_label(o);
    let ratio = st.keys / st.cache_keys.unwrap_or(1).max(1);
    let cpu = o.cost.per_cpu_s(r) / 1e6;
    let mut row = Row::new(format!("{label}: records per CPU-second"), cpu, "M records/CPU-s");
    if !st.zipf && st.parallelism == 1 && st.checkpoints.is_none() {
        let want = if ratio >= 100 { 1.0 } else { 2.0 };
        row.target = Some(format!("value ≥ {want} M records/CPU-s"));
        row.met = Some(cpu >= want);
    }
    row.note = Some(format!(
        "{:.2} M records/s; CPU {:.2} s: window threads {:.2} s, RocksDB background {:.2} s, other {:.2} s;          RocksDB file I/O {:.0} MiB read, {:.0} MiB written; {} keys evicted",
        o.cost.per_s(r) / 1e6,
        o.cost.cpu_s,
        o.window_cpu_s,
        o.rocksdb_cpu_s,
        (o.cost.cpu_s - o.window_cpu_s - o.rocksdb_cpu_s).max(0.0),
        mib(o.io_read_bytes),
        mib(o.io_written_bytes),
        o.evicted_keys
    ));
    s.rows.push(row);
    s.rows.push(
        Row::new(format!("{label}: max RSS"), mib(o.max_rss_bytes), "MiB")
            .vs(format!("budget {:.1} MiB", mib(o.budget_bytes)), mib(o.budget_bytes))
            .target("≤ 1.0× budget", |x| x <= 1.0),
    );
    if st.checkpoints.is_some() {
        let mut ck = Row::new(format!("{label}: checkpoint duration, mean"), o.checkpoints.1 as f64 / 1e6, "ms");
        // At 10^7 keys: within 2× of the same at 10^6 keys.
        let small = outcomes
            .iter()
            .find(|x| x.setup.checkpoints.is_some() && x.setup.cache_keys.is_some() && x.setup.keys < st.keys);
        if let Some(small) = small {
            ck = ck
                .vs(
                    format!("{} keys {:.1} ms", keys_text(small.setup.keys), small.checkpoints.1 as f64 / 1e6),
                    small.checkpoints.1 as f64 / 1e6,
                )
                .target("≤ 2×", |x| x <= 2.0);
        }
        ck.note = Some(format!(
            "{} completed, max {:.1} ms, mean {:.1} MiB per checkpoint, of which {:.1} MiB new (the rest hard links \
             to the one before)",
            o.checkpoints.0,
            o.checkpoint_max_ns as f64 / 1e6,
            mib(o.checkpoint_bytes_mean),
            mib(o.checkpoint_added_bytes_mean)
        ));
        s.rows.push(ck);
    }
}
