//! Checkpoints and recovery, end to end: a keyed counting job (replayable generator →
//! key_by → 10 ms tumbling count + sum on RocksDB → exactly-once file sink) is killed with
//! SIGKILL at random moments and restarted, and its committed output must equal what the
//! generator's formulas say — every (key, window) once, with the exact count and sum.
//!
//! The job runs in a child process: this test binary started again with `WEIR_CP_CHILD`
//! set, running only the test `child_process`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::operators::builtin::Generator;
use weir::operators::{Halt, Sink};
use weir::record::Event;

mod common;
use common::counting::{
    SPILL_KEYS, committed, compare, counting_job, counting_job_spilling, expected, expected_over, parse_line,
    run_until_checkpoints, temp_dir,
};

const CHILD_N: u64 = 240_000;

/// Run by the child process only: the counting job, paced so it takes ~5 s, restoring
/// from whatever checkpoint its directory holds.
#[test]
fn child_process() {
    let Ok(dir) = std::env::var("WEIR_CP_CHILD") else { return };
    let (dir, spill) = (Path::new(&dir), std::env::var("WEIR_CP_SPILL").is_ok());
    let job = match std::env::var("WEIR_CP_COUNT_P").ok().and_then(|p| p.parse().ok()) {
        // The spilling job with its window at this parallelism (and the sink one less).
        Some(count) => {
            let shape = common::counting::Shape {
                keys: SPILL_KEYS,
                cache_bytes: weir::window::MIN_CACHE_BYTES,
                sources: 2,
                count,
                sink: (count - 1).max(1),
                backend: weir::graph::StateBackendKind::RocksDb,
            };
            common::counting::counting_job_shape(dir, CHILD_N, Some(25_000.0), Duration::from_millis(40), shape)
        }
        None if spill => counting_job_spilling(dir, CHILD_N, Some(25_000.0), Duration::from_millis(40)),
        None => counting_job(dir, CHILD_N, Some(25_000.0), Duration::from_millis(40)),
    };
    let summary = job.run().unwrap();
    println!(
        "CHILD restored_from={:?} completed={} failed={} evicted={}",
        summary.checkpoints.restored_from,
        summary.checkpoints.completed.len(),
        summary.checkpoints.failed.len(),
        summary.node("count").map_or(0, |n| n.evicted_keys)
    );
}

/// The child, running the spilling job (`counting_job_spilling`) when `spill`.
fn spawn_child_as(dir: &Path, spill: bool) -> std::process::Child {
    spawn_child_with(dir, spill, None)
}

/// The same, with the window at parallelism `count` if given (spilling, sink `count - 1`).
fn spawn_child_with(dir: &Path, spill: bool, count: Option<u32>) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if spill {
        cmd.env("WEIR_CP_SPILL", "1");
    }
    if let Some(p) = count {
        cmd.env("WEIR_CP_COUNT_P", p.to_string());
    }
    cmd.args(["--exact", "child_process", "--nocapture", "--test-threads=1"])
        .env("WEIR_CP_CHILD", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Issue test 1: kill -9 at random moments, many times; after the last restart the job
/// finishes, and its committed output equals the run without failures exactly.
#[test]
fn kill_nine_at_random_moments_loses_and_doubles_nothing() {
    kill_nine_loop("kill9", false, 12, (100, 500), &expected(CHILD_N));
}

/// The same with state ten times the window cache: kills land while merge operands are in
/// memtables and SST files, and checkpoints hold operands; after the last restart the output
/// is exact.
#[test]
fn kill_nine_while_merge_operands_are_pending_loses_and_doubles_nothing() {
    let line = kill_nine_loop("kill9-spill", true, 6, (200, 900), &expected_over(CHILD_N, SPILL_KEYS));
    assert!(!line.contains("evicted=0"), "the windows spilled to RocksDB: {line}");
}

/// Kill -9 at random moments, each restart at another window (and sink) parallelism,
/// 1 → 3 → 2 → 4 → 1 → 2, state ten times the cache in RocksDB: after the last restart the
/// output is exact.
#[test]
fn kill_nine_while_changing_parallelism_loses_and_doubles_nothing() {
    let dir = temp_dir("kill9-rescale");
    let mut clock = common::KillClock::from_time();
    let steps = [1, 3, 2, 4, 1];
    for p in steps {
        let mut child = spawn_child_with(&dir, true, Some(p));
        std::thread::sleep(clock.next_delay(300, 900));
        common::kill_and_clean(&mut child);
    }
    let child = spawn_child_with(&dir, true, Some(2));
    let out = common::wait_with_watchdog(child, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the last run failed: {stdout}");
    let line = stdout.lines().find_map(|l| l.split_once("CHILD").map(|(_, r)| r)).expect("the child reports");
    println!("{line}");
    assert!(!line.contains("restored_from=None"), "the last run restored a checkpoint: {line}");
    compare(&committed(&dir.join("out")).unwrap(), &expected_over(CHILD_N, SPILL_KEYS));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Start the child (the spilling job when `spill`) and kill -9 it `kills` times after a
/// random delay (`delay_ms`: least, spread), then let it finish: it must restore a checkpoint and its
/// committed output must be `want`. Returns the child's report line.
fn kill_nine_loop(
    name: &str,
    spill: bool,
    kills: usize,
    delay_ms: (u64, u64),
    want: &common::counting::Counts,
) -> String {
    let dir = temp_dir(name);
    let mut clock = common::KillClock::from_time();
    for _ in 0..kills {
        let mut child = spawn_child_as(&dir, spill);
        std::thread::sleep(clock.next_delay(delay_ms.0, delay_ms.1));
        common::kill_and_clean(&mut child);
    }
    let child = spawn_child_as(&dir, spill);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the last run failed: {stdout}");
    let line = stdout.lines().find_map(|l| l.split_once("CHILD").map(|(_, r)| r)).expect("the child reports");
    println!("{line}");
    assert!(!line.contains("restored_from=None"), "the last run restored a checkpoint: {line}");
    compare(&committed(&dir.join("out")).unwrap(), want);
    std::fs::remove_dir_all(&dir).unwrap();
    line.to_owned()
}

/// Without failures: exact output, checkpoints completed, and the end of input is a final
/// checkpoint; running the job again on the same directory adds nothing.
#[test]
fn uninterrupted_run_is_exact_and_a_rerun_adds_nothing() {
    let dir = temp_dir("plain");
    const N: u64 = 200_000;
    let summary = counting_job(&dir, N, Some(100_000.0), Duration::from_millis(30)).run().unwrap();
    assert!(summary.checkpoints.completed.len() >= 2, "{:?}", summary.checkpoints);
    // Phases for each but the final checkpoint (it waits for the end of input, not a barrier).
    assert_eq!(summary.checkpoints.phases.len(), summary.checkpoints.completed.len() - 1);
    compare(&committed(&dir.join("out")).unwrap(), &expected(N));
    let again = counting_job(&dir, N, None, Duration::from_millis(30)).run().unwrap();
    assert!(again.checkpoints.restored_from.is_some());
    compare(&committed(&dir.join("out")).unwrap(), &expected(N));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue test 4: the newest manifest corrupted → the job starts from the one before it,
/// with a warning; the state is exact (each window counted once in state). Windows that
/// the corrupted checkpoint had already committed are emitted again (a fallback past a
/// committed checkpoint is at-least-once for that span), with identical values.
#[test]
fn corrupted_manifest_falls_back_to_the_previous_checkpoint() {
    let dir = temp_dir("corrupt");
    const N: u64 = 200_000;
    run_until_checkpoints(counting_job(&dir, N, Some(40_000.0), Duration::from_millis(30)), 3);
    let found = weir::checkpoint::restore::find(&dir.join("chk")).unwrap();
    let newest = found.manifest.unwrap().id;
    let path = dir.join("chk").join(format!("chk-{newest}")).join("_manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("\"bytes\": ", "\"bytes\": 1", 1)).unwrap();
    let found = weir::checkpoint::restore::find(&dir.join("chk")).unwrap();
    assert!(found.manifest.as_ref().unwrap().id < newest);
    assert!(found.warnings[0].contains(&format!("checkpoint {newest} is not usable")), "{:?}", found.warnings);
    let summary = counting_job(&dir, N, None, Duration::from_millis(30)).run().unwrap();
    assert!(summary.checkpoints.restored_from.unwrap() < newest);
    // Every line holds the exact value; a window may appear twice (re-emitted), never with
    // another value.
    let mut seen: common::counting::Counts = BTreeMap::new();
    for f in std::fs::read_dir(dir.join("out")).unwrap().map(|e| e.unwrap().path()) {
        assert!(!f.to_string_lossy().ends_with(".inprogress"), "a finished job leaves no in-progress part");
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            let (k, w, c, s) = parse_line(line).unwrap();
            if let Some(old) = seen.insert((k, w), (c, s)) {
                assert_eq!(old, (c, s), "a re-emitted window with another value: state double-counted");
            }
        }
    }
    compare(&seen, &expected(N));
    // None usable at all: a clear error, nothing started.
    for (_, d) in std::fs::read_dir(dir.join("chk")).unwrap().map(|e| ((), e.unwrap().path())) {
        let m = d.join("_manifest.json");
        if m.is_file() {
            std::fs::write(&m, "{").unwrap();
        }
    }
    let err = counting_job(&dir, N, None, Duration::from_millis(30)).start().unwrap_err().to_string();
    assert!(err.contains("no usable checkpoint") && err.contains("move the directory away"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #14 item 3: a checkpoint taken at one parallelism restores at another, three
/// changes in a row (window 1 → 2 → 4 → 1, sink 1 → 2 → 3 → 1), with the window state in
/// RocksDB ten times its cache (key groups move as ranges between shards, merge operands
/// included) and on the heap (in the checkpoint's bytes): the output is exact.
#[test]
fn restore_at_another_parallelism_up_and_down_is_exact_on_rocksdb() {
    let steps = [(1, 1), (2, 2), (4, 3), (1, 1)];
    rescale_loop("rescale-rocksdb", weir::graph::StateBackendKind::RocksDb, SPILL_KEYS, &steps);
}

/// The same with the window state on the heap (in the checkpoint's bytes, filtered by key
/// group as each subtask restores).
#[test]
fn restore_at_another_parallelism_up_and_down_is_exact_on_the_heap() {
    let steps = [(1, 1), (2, 2), (4, 3), (1, 1)];
    rescale_loop("rescale-heap", weir::graph::StateBackendKind::Memory, common::counting::KEYS, &steps);
}

/// Run the counting job at each (window, sink) parallelism of `steps` in turn, each run
/// restoring the last one's checkpoint; all but the last are cancelled after three
/// checkpoints, the last runs to the end and its output must be exact.
fn rescale_loop(name: &str, backend: weir::graph::StateBackendKind, keys: u64, steps: &[(u32, u32)]) {
    use common::counting::{Shape, counting_job_shape};
    const N: u64 = 200_000;
    let dir = temp_dir(name);
    let cache_bytes =
        if keys == SPILL_KEYS { weir::window::MIN_CACHE_BYTES } else { weir::window::DEFAULT_CACHE_BYTES };
    let job = |(count, sink): (u32, u32), rate| {
        let shape = Shape { keys, cache_bytes, sources: 2, count, sink, backend };
        counting_job_shape(&dir, N, rate, Duration::from_millis(30), shape)
    };
    let changed = |from: Option<(u32, u32)>, to: (u32, u32)| -> Vec<(String, u32, u32)> {
        let Some(from) = from else { return Vec::new() };
        let mut v = Vec::new();
        if from.0 != to.0 {
            v.push(("count".to_string(), from.0, to.0));
        }
        if from.1 != to.1 {
            v.push(("out".to_string(), from.1, to.1));
        }
        v
    };
    let (last, runs) = steps.split_last().unwrap();
    let mut before: Option<(u32, u32)> = None;
    for &step in runs {
        let mut running = job(step, Some(30_000.0)).start().unwrap();
        let stats = running.checkpoint_stats();
        assert_eq!(stats.restored_from.is_some(), before.is_some(), "{name} at {step:?}: restored");
        assert_eq!(stats.rescaled, changed(before, step), "{name}: what changed parallelism");
        let t = Instant::now();
        while running.checkpoint_stats().completed.len() < 3 {
            assert!(!running.has_failed(), "{name} at {step:?}: {:?}", running.checkpoint_stats());
            assert!(t.elapsed() < Duration::from_secs(60), "{name}: no checkpoints: {:?}", running.checkpoint_stats());
            std::thread::sleep(Duration::from_millis(10));
        }
        running.cancel();
        let _ = running.wait();
        before = Some(step);
    }
    let summary = job(*last, None).run().unwrap();
    assert_eq!(summary.checkpoints.rescaled, changed(before, *last), "{name}: the last run");
    let want = if keys == common::counting::KEYS { expected(N) } else { expected_over(N, keys) };
    println!("{name}: comparing");
    compare(&committed(&dir.join("out")).unwrap(), &want);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What cannot move is refused with the reason and what to do: another number of key
/// groups and RocksDB state into a heap backend (at start, exit 78 from `weir run`), and a
/// source whose position is its own (a generator's sequence is split by subtask index: the
/// job fails naming the node).
#[test]
fn restore_at_another_parallelism_refuses_what_cannot_move() {
    let dir = temp_dir("rescale-refused");
    run_until_checkpoints(counting_job(&dir, 100_000, Some(40_000.0), Duration::from_millis(30)), 1);
    let job = counting_job(&dir, 100_000, None, Duration::from_millis(30));
    job.configure(|c| c.max_key_groups = 256);
    let err = job.start().unwrap_err().to_string();
    assert!(err.contains("128 key groups") && err.contains("max_key_groups = 128"), "{err}");
    // State in RocksDB, restored into a job keeping its state on the heap: it would be lost.
    let job = counting_job(&dir, 100_000, None, Duration::from_millis(30));
    job.configure(|c| c.state.backend = weir::graph::StateBackendKind::Memory);
    let err = job.start().unwrap_err().to_string();
    assert!(err.contains("holds state in RocksDB") && err.contains("restore it with the RocksDB backend"), "{err}");
    // The generator at parallelism 3 instead of 2.
    let shape = common::counting::Shape {
        keys: common::counting::KEYS,
        cache_bytes: weir::window::DEFAULT_CACHE_BYTES,
        sources: 3,
        count: 2,
        sink: 1,
        backend: weir::graph::StateBackendKind::RocksDb,
    };
    let job = common::counting::counting_job_shape(&dir, 100_000, None, Duration::from_millis(30), shape);
    let err = job.run().unwrap_err().to_string();
    assert!(err.contains("gen") && err.contains("parallelism 2") && err.contains("has 3"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A sink that takes `delay` per record, or blocks while `stopped`.
struct SlowSink {
    delay: Duration,
    stopped: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
}

impl Sink<Event> for SlowSink {
    fn write(&mut self, _e: &Event) -> Result<(), Halt> {
        while self.stopped.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        while t.elapsed() < self.delay {
            std::hint::spin_loop();
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn slow_job(
    name: &str,
    dir: &Path,
    delay: Duration,
    stopped: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    timeout: Duration,
) -> Job {
    let job = Job::new(name);
    let chk = dir.join("chk");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.checkpoints =
            Some(CheckpointSettings { interval: Duration::from_millis(100), timeout, ..CheckpointSettings::new(&chk) });
    });
    job.source("gen", 1, |info| Generator::events(info, u64::MAX, 100))
        .key_by("k", |e: &Event| e.key)
        .map("m", |e: &Event| *e)
        .sink("slow", 1, move |_| SlowSink { delay, stopped: stopped.clone(), count: count.clone() });
    job
}

/// Issue test 5: a checkpoint completes while the sink is far slower than the source (the
/// source alone makes millions per second; the sink takes 100 µs per record): the barrier
/// waits only behind the records in the rings. Prints duration vs in-flight ÷ sink rate.
#[test]
fn checkpoints_complete_under_a_slow_sink() {
    let dir = temp_dir("slow");
    let count = Arc::new(AtomicU64::new(0));
    let job =
        slow_job("slow", &dir, Duration::from_micros(100), Arc::default(), count.clone(), Duration::from_secs(30));
    let mut running = job.start().unwrap();
    let t = Instant::now();
    while running.checkpoint_stats().completed.len() < 3 {
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", running.checkpoint_stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = running.checkpoint_stats();
    let rate = count.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64();
    running.cancel();
    let _ = running.wait();
    // Two rings of 256 slots (32-byte events take one 64-byte slot) are in flight.
    let bound_s = 512.0 / rate;
    let durations: Vec<f64> = stats.completed.iter().map(|c| c.1 as f64 / 1e6).collect();
    let delays: Vec<f64> = stats.phases.iter().map(|p| p.start_delay_ns as f64 / 1e6).collect();
    println!(
        "sink {rate:.0} rec/s; in-flight / sink rate = {:.1} ms; checkpoint durations ms {durations:?}, \
         barriers' start delays ms {delays:?}",
        bound_s * 1e3
    );
    assert!(stats.failed.is_empty(), "{:?}", stats.failed);
    // Each completed checkpoint says where its duration went; no phase outlasts the whole.
    assert_eq!(stats.phases.len(), stats.completed.len(), "{stats:?}");
    for (p, c) in stats.phases.iter().zip(&stats.completed) {
        assert_eq!(p.id, c.0);
        assert!(p.start_delay_ns.max(p.alignment_ns).max(p.sync_ns) <= c.1, "{p:?} in {c:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Under a stopped sink a checkpoint expires with a reason naming the blocked channel; the
/// first one after the sink returns completes.
#[test]
fn a_stopped_sink_expires_checkpoints_with_the_blocked_channel_named() {
    let dir = temp_dir("stopped");
    let stopped = Arc::new(AtomicBool::new(true));
    let job = slow_job("stopped", &dir, Duration::ZERO, stopped.clone(), Arc::default(), Duration::from_millis(400));
    let mut running = job.start().unwrap();
    let t = Instant::now();
    while running.checkpoint_stats().failed.is_empty() {
        assert!(t.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, reason) = running.checkpoint_stats().failed[0].clone();
    assert!(reason.contains("expired") && reason.contains("no ack from"), "{reason}");
    assert!(reason.contains("m#0->slow#0") || reason.contains("gen#0->m#0"), "names a full channel: {reason}");
    assert!(running.checkpoint_stats().completed.is_empty());
    stopped.store(false, Ordering::Release);
    while running.checkpoint_stats().completed.is_empty() {
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", running.checkpoint_stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    running.cancel();
    let _ = running.wait();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue test 3: the disk fills during checkpoints (a 4 MiB tmpfs holds the checkpoints;
/// the live state is elsewhere): the checkpoint fails with a message naming ENOSPC, the
/// previous one stays intact and restorable, and the next completes once space returns.
/// Needs root for the mount; skipped with a message otherwise.
#[test]
fn disk_full_fails_the_checkpoint_and_the_next_completes() {
    let dir = temp_dir("enospc");
    let chk = dir.join("chk");
    std::fs::create_dir_all(&chk).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&chk)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        println!("SKIPPED: cannot mount a size-limited tmpfs here (needs root)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(chk.clone());
    let job = counting_job(&dir, u64::MAX, Some(20_000.0), Duration::from_millis(50));
    let live = dir.join("live");
    job.configure(|c| c.state.dir = Some(live.clone()));
    let mut running = job.start().unwrap();
    let wait_for = |what: &str, f: &dyn Fn(&weir::runtime::CheckpointStats) -> bool, r: &weir::runtime::RunningJob| {
        let t = Instant::now();
        while !f(&r.checkpoint_stats()) {
            assert!(t.elapsed() < Duration::from_secs(60), "{what}: {:?}", r.checkpoint_stats());
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_for("a first checkpoint", &|s| !s.completed.is_empty(), &running);
    // Fill the file system.
    let ballast = chk.join("ballast");
    let _ = std::fs::write(&ballast, vec![0u8; 8 << 20]);
    let failed_before = running.checkpoint_stats().failed.len();
    wait_for("a checkpoint failing on the full disk", &|s| s.failed.len() > failed_before, &running);
    let reason = running.checkpoint_stats().failed.last().unwrap().1.clone();
    assert!(reason.contains("ENOSPC"), "{reason}");
    let last_good = running.checkpoint_stats().completed.last().unwrap().0;
    let found = weir::checkpoint::restore::find(&chk).unwrap();
    assert_eq!(found.manifest.unwrap().id, last_good, "the previous checkpoint is intact and restorable");
    std::fs::remove_file(&ballast).unwrap();
    let done = running.checkpoint_stats().completed.len();
    wait_for("a checkpoint after space returned", &|s| s.completed.len() > done, &running);
    running.cancel();
    let _ = running.wait();
    drop(_unmount);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// weir-stat's view shows the checkpoint counters.
#[test]
fn counters_show_checkpoints() {
    let dir = temp_dir("counters");
    let mut running = counting_job(&dir, u64::MAX, Some(20_000.0), Duration::from_millis(20)).start().unwrap();
    let path = running.counters_path().to_owned();
    let reader = weir::ring::counters::CountersReader::open(&path).unwrap();
    let t = Instant::now();
    let seen = Mutex::new(weir_tools::stat::CheckpointView::default());
    while seen.lock().unwrap().completed < 2 {
        assert!(t.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(20));
        let snap = reader.snapshot();
        *seen.lock().unwrap() = weir_tools::stat::StatView::between(&snap, &snap, 1.0).checkpoints;
    }
    let v = *seen.lock().unwrap();
    assert!(v.last_id >= 2 && v.duration_ns > 0 && v.bytes > 0, "{v:?}");
    running.cancel();
    let _ = running.wait();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What a [`LaterSink`] was restored with: the checkpoint's id and its bytes.
type Restored = Arc<Mutex<Option<(u64, Vec<u8>)>>>;

/// A sink that puts its part of each checkpoint later (`Sink::snapshot_later`), `after`
/// records past the barrier — its bytes the checkpoint's id — or drops it (`after: None`).
/// What it is restored with is recorded.
struct LaterSink {
    after: Option<u64>,
    waiting: Option<(weir::operators::LatePart, u64)>,
    restored: Restored,
}

impl Sink<weir::record::Event> for LaterSink {
    fn write(&mut self, _e: &weir::record::Event) -> Result<(), Halt> {
        if let Some((_, left)) = self.waiting.as_mut() {
            *left = left.saturating_sub(1);
            if *left == 0 {
                let (part, _) = self.waiting.take().expect("a part waits");
                let id = part.checkpoint_id();
                part.put(&id.to_le_bytes());
            }
        }
        Ok(())
    }
    fn snapshot_later(&mut self, part: weir::operators::LatePart) -> Result<(), Halt> {
        assert!(self.waiting.is_none(), "a part is put before the next checkpoint's barrier comes");
        match self.after {
            Some(n) => self.waiting = Some((part, n)),
            None => drop(part),
        }
        Ok(())
    }
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        *self.restored.lock().unwrap() = from.map(|(id, b)| (id, b.to_vec()));
        Ok(())
    }
}

/// A job of `n` paced events into a [`LaterSink`], checkpointing every 30 ms into `chk`.
fn later_job(name: &str, chk: &Path, n: u64, after: Option<u64>, restored: Restored) -> Job {
    let job = Job::new(name);
    let chk = chk.to_owned();
    job.configure(|c| {
        c.pinning = false;
        c.checkpoints =
            Some(CheckpointSettings { interval: Duration::from_millis(30), ..CheckpointSettings::new(&chk) });
    });
    job.source("gen", 1, move |info| Generator::events(info, n, 10).with_rate(20_000.0))
        .sink("late", 1, move |_| LaterSink { after, waiting: None, restored: restored.clone() });
    job
}

/// A sink's part put after the barrier passed it (records flowing meanwhile) completes its
/// checkpoint with those bytes, and a restore gets them; a part dropped without being put
/// declines its checkpoint, naming the node, and the job goes on to its end.
#[test]
fn a_part_put_later_completes_its_checkpoint_and_one_dropped_declines_it() {
    if std::env::var("WEIR_CP_CHILD").is_ok() {
        return;
    }
    let dir = temp_dir("late-part");
    let chk = dir.join("chk");
    let restored = Arc::new(Mutex::new(None));
    // Endless, cancelled after three checkpoints (no final one: the next run restores the
    // newest of those).
    let mut running = later_job("late-put", &chk, u64::MAX, Some(200), restored.clone()).start().unwrap();
    let t = Instant::now();
    while running.checkpoint_stats().completed.len() < 3 {
        assert!(t.elapsed() < Duration::from_secs(60), "watchdog: {:?}", running.checkpoint_stats());
        assert!(!running.has_failed(), "the job failed");
        std::thread::sleep(Duration::from_millis(10));
    }
    running.cancel();
    let stats = running.checkpoint_stats();
    let _ = running.wait();
    assert!(stats.failed.is_empty(), "none failed: {:?}", stats.failed);
    let last = stats.completed.last().unwrap().0;
    let again = later_job("late-put", &chk, 100, Some(1), restored.clone()).run().unwrap();
    assert_eq!(again.checkpoints.restored_from, Some(last), "the newest checkpoint, of late parts, restored");
    assert_eq!(*restored.lock().unwrap(), Some((last, last.to_le_bytes().to_vec())), "its late part restored");

    let dropped = later_job("late-drop", &dir.join("chk-drop"), 3_000, None, restored).run().unwrap();
    let stats = &dropped.checkpoints;
    assert!(!stats.failed.is_empty(), "checkpoints declined: {stats:?}");
    for (_, why) in &stats.failed {
        assert!(why.contains("late") && why.contains("dropped before it was put"), "{why}");
    }
    // The end of input's final checkpoint takes its parts at once: the job ends committed.
    assert!(!stats.completed.is_empty(), "the final checkpoint: {stats:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
