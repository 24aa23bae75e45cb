//! The counting job the checkpoint tests crash and restore, and how its output is checked.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::{FileSink, FileSinkConfig};
use weir::operators::builtin::Generator;
use weir::operators::{Sink, SubtaskInfo};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window, WindowResult};

/// (key, window start) → (count, sum).
pub type Counts = BTreeMap<(u64, u64), (u64, u64)>;

pub const KEYS: u64 = 300;
pub const WINDOW_NS: u64 = 10_000_000;

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weir-cp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The counting job: `n` events from 2 generator subtasks (each paced to `rate` per second
/// if given), checkpoints every `interval` into `dir/chk`, results into `dir/out`.
pub fn counting_job(dir: &Path, n: u64, rate: Option<f64>, interval: Duration) -> Job {
    let out = dir.join("out");
    counting_job_into(dir, n, rate, interval, move |info| FileSink::new(FileSinkConfig::new(&out), info))
}

/// The counting job with its results into the sink `sink` makes.
pub fn counting_job_into<S: Sink<WindowResult> + 'static>(
    dir: &Path,
    n: u64,
    rate: Option<f64>,
    interval: Duration,
    sink: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
) -> Job {
    counting_job_shaped(dir, n, rate, interval, KEYS, weir::window::DEFAULT_CACHE_BYTES, sink)
}

/// Keys when the counting job spills: ten times what its smallest window cache holds.
pub const SPILL_KEYS: u64 = 4_000;

/// The counting job over `SPILL_KEYS` keys with the smallest window cache (about 400 keys):
/// nearly every record starts a partial slot that is evicted as RocksDB merge operands, so a
/// kill finds operands in memtables and SST files, and checkpoints hold them.
pub fn counting_job_spilling(dir: &Path, n: u64, rate: Option<f64>, interval: Duration) -> Job {
    let out = dir.join("out");
    counting_job_shaped(dir, n, rate, interval, SPILL_KEYS, weir::window::MIN_CACHE_BYTES, move |info| {
        FileSink::new(FileSinkConfig::new(&out), info)
    })
}

fn counting_job_shaped<S: Sink<WindowResult> + 'static>(
    dir: &Path,
    n: u64,
    rate: Option<f64>,
    interval: Duration,
    keys: u64,
    cache_bytes: u64,
    sink: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
) -> Job {
    let shape =
        Shape { keys, cache_bytes, sources: 2, count: 2, sink: 1, backend: weir::graph::StateBackendKind::RocksDb };
    counting_job_as(dir, n, rate, interval, shape, sink)
}

/// How a counting job is laid out: its keys, window cache, the parallelism of the source, of
/// the window (`count`) and of the sink, and the state backend.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub keys: u64,
    pub cache_bytes: u64,
    pub sources: u32,
    pub count: u32,
    pub sink: u32,
    pub backend: weir::graph::StateBackendKind,
}

/// The counting job laid out as `shape`, results into the file sink in `dir/out`.
pub fn counting_job_shape(dir: &Path, n: u64, rate: Option<f64>, interval: Duration, shape: Shape) -> Job {
    let out = dir.join("out");
    counting_job_as(dir, n, rate, interval, shape, move |info| FileSink::new(FileSinkConfig::new(&out), info))
}

fn counting_job_as<S: Sink<WindowResult> + 'static>(
    dir: &Path,
    n: u64,
    rate: Option<f64>,
    interval: Duration,
    shape: Shape,
    sink: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
) -> Job {
    let Shape { keys, cache_bytes, .. } = shape;
    let job = Job::new("counting");
    let chk = dir.join("chk");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.checkpoints =
            Some(CheckpointSettings { interval, timeout: Duration::from_secs(20), ..CheckpointSettings::new(&chk) });
        c.state.backend = shape.backend;
    });
    job.source("gen", shape.sources, move |info| {
        let g = Generator::events(info, n, keys);
        match rate {
            Some(r) => g.with_rate(r),
            None => g,
        }
    })
    .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO))
    .key_by("k", |e: &Event| e.key)
    .window(Window::tumbling(Duration::from_nanos(WINDOW_NS)))
    .timestamps(|e: &Event| e.time_ns)
    .cache_bytes(cache_bytes)
    .aggregate("count", shape.count, Aggregates::of(|e: &Event| e.value).count().sum())
    .sink("out", shape.sink, sink);
    job
}

/// (key, window start) → (count, sum), from the generator's formulas.
pub fn expected(n: u64) -> Counts {
    expected_over(n, KEYS)
}

/// The same over `keys` keys.
pub fn expected_over(n: u64, keys: u64) -> Counts {
    let mut m = BTreeMap::new();
    for seq in 0..n {
        let key = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys;
        let start = seq * 1_000 / WINDOW_NS * WINDOW_NS;
        let e = m.entry((key, start)).or_insert((0, 0));
        e.0 += 1;
        e.1 += seq % 100 + 1;
    }
    m
}

/// Every result line in the committed part files; a (key, window) seen twice is an error.
pub fn committed(out: &Path) -> Result<Counts, String> {
    let mut m = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(out)
        .map_err(|e| e.to_string())?
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().ends_with(".inprogress"))
        .collect();
    files.sort();
    for f in files {
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            let (k, w, c, s) = parse_line(line).ok_or_else(|| format!("{}: bad line {line:?}", f.display()))?;
            if m.insert((k, w), (c, s)).is_some() {
                return Err(format!("{}: window ({k}, {w}) emitted twice: double-counted", f.display()));
            }
        }
    }
    Ok(m)
}

pub fn parse_line(line: &str) -> Option<(u64, u64, u64, u64)> {
    // key=K window=[S, E) count=C sum=X
    let mut it = line.split_whitespace();
    let key = it.next()?.strip_prefix("key=")?.parse().ok()?;
    let start = it.next()?.strip_prefix("window=[")?.trim_end_matches(',').parse().ok()?;
    let _end = it.next()?;
    let count = it.next()?.strip_prefix("count=")?.parse().ok()?;
    let sum = it.next()?.strip_prefix("sum=")?.parse().ok()?;
    Some((key, start, count, sum))
}

pub fn compare(got: &Counts, want: &Counts) {
    let missing = want.keys().filter(|k| !got.contains_key(k)).count();
    let extra = got.keys().filter(|k| !want.contains_key(k)).count();
    let wrong: Vec<_> = want.iter().filter(|(k, v)| got.get(k).is_some_and(|g| g != *v)).take(5).collect();
    assert!(
        missing == 0 && extra == 0 && wrong.is_empty(),
        "{missing} windows lost, {extra} unexpected, wrong counts (first 5): {wrong:?}"
    );
}

/// The window results in the bodies the slow API accepted (first time their key was seen), from its
/// log; a (key, window) accepted twice is an error (a duplicate the keys did not catch).
pub fn accepted_by_api(log: &Path) -> Result<Counts, String> {
    let mut got = Counts::new();
    for line in std::fs::read_to_string(log).unwrap().lines() {
        let entry: serde_json::Value = serde_json::from_str(line).unwrap();
        let Some(body) = entry["body"].as_str() else { continue };
        for record in body.lines() {
            let r: WindowResult = serde_json::from_str(record).unwrap();
            if got.insert((r.key, r.start_ns), (r.count, r.sum)).is_some() {
                return Err(format!(
                    "window ({}, {}) accepted twice (request key {}): a duplicate with another key",
                    r.key, r.start_ns, entry["key"]
                ));
            }
        }
    }
    Ok(got)
}

/// The slow API (1 ms per request) logging every request, accepted bodies included, to
/// `dir/api.jsonl`, which [`accepted_by_api`] reads back.
pub fn logging_api(dir: &Path) -> (weir_tools::slow_api::SlowApi, PathBuf) {
    use weir_tools::slow_api::{SlowApi, SlowApiConfig};
    let log = dir.join("api.jsonl");
    let api = SlowApi::start(SlowApiConfig {
        latency: Duration::from_millis(1),
        log: Some(log.clone()),
        ..SlowApiConfig::default()
    })
    .expect("the slow API starts");
    (api, log)
}

/// Start `job`, let it complete `n` checkpoints (a 60 s watchdog), then cancel it and wait:
/// a checkpoint directory to restart from, or to damage.
pub fn run_until_checkpoints(job: Job, n: usize) -> Option<u64> {
    let mut running = job.start().unwrap();
    let restored_from = running.checkpoint_stats().restored_from;
    let t = std::time::Instant::now();
    while running.checkpoint_stats().completed.len() < n {
        assert!(!running.has_failed(), "the job failed: {:?}", running.checkpoint_stats());
        assert!(t.elapsed() < Duration::from_secs(60), "no checkpoints: {:?}", running.checkpoint_stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    running.cancel();
    let _ = running.wait();
    restored_from
}
