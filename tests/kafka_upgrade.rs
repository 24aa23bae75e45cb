//! Upgrading a windowed Kafka → Kafka exactly-once job twice, with kill -9 in between
//! (issue #49).
//!
//! Version 1 counts and sums a value per key and window, and keeps a per-key count in a
//! keyed operator `seen` beside; it is killed at a random moment, restarted from its
//! checkpoint, and stopped at a savepoint (`weir stop --savepoint`'s control socket).
//! Version 2 starts from that savepoint with a filter added before the window, the map
//! before it changed and an aggregate (`max`) added; it is killed, restarted, and stopped at
//! a second savepoint. Version 3 removes `seen`: refused without `--allow-dropped-state`,
//! started with it, killed, restarted, and run to the end of the input.
//!
//! The output topic, read with `read_committed`, must hold every (key, window) exactly once,
//! with what one uninterrupted run of each version over its span gives: each record counted
//! by the version whose span its offset falls in (the savepoints' source offsets, read with
//! `weir state dump`), a window's `max` (versions 2 and 3) over all its records, v1's
//! included (the built-in accumulator kept it).
//!
//! Needs Apache Kafka (`WEIR_KAFKA_BOOTSTRAP`, as `.ci/test` sets it). The job runs in a
//! child process: this test binary started again with `WEIR_UPG_CHILD` set.

mod common;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::kafka::{Delivery, Json, JsonEncode, KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use weir::operators::builtin::NullSink;
use weir::operators::{Halt, KeyedProcess};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window, WindowResult};

const N: u64 = 240_000;
const KEYS: u64 = 200;
const PARTITIONS: i32 = 4;
const OUTPUT_PARTITIONS: i32 = 2;
const WINDOW_NS: u64 = 20_000_000;

/// Counts records per key in keyed state: the stateful node version 3 removes.
struct Seen(weir::state::ValueState<u64, u64>);

impl KeyedProcess<Event, Event> for Seen {
    fn process(&mut self, e: &Event, kg: u32, out: &mut dyn FnMut(&Event) -> Result<(), Halt>) -> Result<(), Halt> {
        let n = self.0.get(kg, &e.key)?.unwrap_or(0) + 1;
        self.0.put(kg, &e.key, &n)?;
        out(e)
    }
}

/// Run by the child process only: version `WEIR_UPG_VERSION` of the job.
#[test]
fn child_process() {
    let Ok(dir) = std::env::var("WEIR_UPG_CHILD") else { return };
    let var = |name: &str| std::env::var(name).unwrap();
    let (bootstrap, topic, version) = (var("WEIR_KAFKA_BOOTSTRAP"), var("WEIR_UPG_TOPIC"), var("WEIR_UPG_VERSION"));
    let version: u32 = version.parse().unwrap();
    let dir = Path::new(&dir);
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stdout)
        .with_env_filter(tracing_subscriber::EnvFilter::new("weir=warn"))
        .try_init();
    let job = Job::new("kafka-upgrade");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.run_dir = Some(PathBuf::from(var("WEIR_UPG_RUN")));
        c.checkpoints = Some(CheckpointSettings {
            interval: Duration::from_millis(200),
            timeout: Duration::from_secs(30),
            from_savepoint: std::env::var("WEIR_UPG_FROM").ok().map(PathBuf::from),
            allow_dropped_state: std::env::var("WEIR_UPG_ALLOW_DROPPED").is_ok(),
            ..CheckpointSettings::new(dir.join("chk"))
        });
    });
    // Versions 1 and 2 never end (they are stopped at a savepoint); version 3 reads to the end.
    let source =
        KafkaSourceConfig { bounded: version == 3, ..KafkaSourceConfig::new(&bootstrap, &format!("{topic}-in")) };
    let sink = KafkaSinkConfig {
        delivery: Delivery::ExactlyOnce,
        transactional_id_prefix: topic.clone(),
        checkpoint_timeout: Duration::from_secs(30),
        transaction_log_dir: Some(dir.join("txn")),
        ..KafkaSinkConfig::new(&bootstrap, &format!("{topic}-out"))
    };
    let events = job
        .source("in", 2, move |info| {
            KafkaSource::new(source.clone(), info, Json::<Event>::default())
                .with_event_time(|e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO))
        })
        .with_source_watermarks(|e: &Event| e.time_ns)
        // About 20 000 records a second per subtask, so that each version gets a part.
        .filter("pace", |_: &Event| {
            thread_local!(static SEEN: Cell<u64> = const { Cell::new(0) });
            if SEEN.with(|s| s.replace(s.get() + 1)).is_multiple_of(20) {
                std::thread::sleep(Duration::from_millis(1));
            }
            true
        });
    if version < 3 {
        events.key_by("k", |e: &Event| e.key).process_with_state("seen", 2, |_, state| Seen(state.value("seen"))).sink(
            "seen-out",
            1,
            |_| NullSink,
        );
    }
    let windows = match version {
        1 => events.map("adjust", |e: &Event| Event { value: e.value * 2, ..*e }),
        _ => events
            .filter("thin", |e: &Event| !e.seq.is_multiple_of(3))
            .map("adjust", |e: &Event| Event { value: e.value * 3, ..*e }),
    };
    let aggregates = match version {
        1 => Aggregates::of(|e: &Event| e.value).count().sum(),
        _ => Aggregates::of(|e: &Event| e.value).count().sum().max(),
    };
    windows
        .key_by("k", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_nanos(WINDOW_NS)))
        .timestamps(|e: &Event| e.time_ns)
        .aggregate("count", 2, aggregates)
        .sink("out", 2, move |info| {
            KafkaSink::new(sink.clone(), info, JsonEncode::<WindowResult>::default())
                .with_key(|r: &WindowResult, key: &mut Vec<u8>| key.extend_from_slice(&r.key.to_le_bytes()))
        });
    match job.run() {
        Ok(summary) => println!(
            "CHILD version={version} restored_from={:?} savepoints={:?}",
            summary.checkpoints.restored_from,
            summary.checkpoints.savepoints.iter().map(|s| s.id).collect::<Vec<_>>()
        ),
        Err(e) => {
            println!("CHILD error={e}");
            panic!("version {version}: {e}");
        }
    }
}

/// The child running `version`, its run directory `dir/run-<n>`.
fn child(dir: &Path, bootstrap: &str, topic: &str, version: u32, n: &mut u32) -> (Command, PathBuf) {
    *n += 1;
    let run = dir.join(format!("run-{n}"));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_process", "--nocapture", "--test-threads=1"])
        .env("WEIR_UPG_CHILD", dir)
        .env("WEIR_KAFKA_BOOTSTRAP", bootstrap)
        .env("WEIR_UPG_TOPIC", topic)
        .env("WEIR_UPG_VERSION", version.to_string())
        .env("WEIR_UPG_RUN", &run)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if version > 1 {
        cmd.env("WEIR_UPG_FROM", dir.join(format!("sp{}", version - 1)));
    }
    (cmd, run)
}

/// Wait until the job in `run` listens for savepoints (it started), at most a minute.
fn wait_started(run: &Path) {
    let t = std::time::Instant::now();
    while !run.join(weir::runtime::control::CONTROL_SOCKET).exists() {
        assert!(t.elapsed() < Duration::from_secs(60), "watchdog: the child did not start in a minute");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Start `version`, kill it at a random moment, start it again; return the second run.
fn run_killed_once(
    dir: &Path,
    bootstrap: &str,
    topic: &str,
    version: u32,
    n: &mut u32,
    clock: &mut common::KillClock,
) -> (std::process::Child, PathBuf) {
    let (mut cmd, run) = child(dir, bootstrap, topic, version, n);
    let mut first = cmd.spawn().unwrap();
    wait_started(&run);
    std::thread::sleep(clock.next_delay(300, 1200));
    common::kill_and_clean(&mut first);
    let (mut cmd, run) = child(dir, bootstrap, topic, version, n);
    let second = cmd.spawn().unwrap();
    wait_started(&run);
    (second, run)
}

/// Stop the job in `run` at a savepoint in `sp`; its process exits well.
fn stop_at_savepoint(running: std::process::Child, run: &Path, sp: &Path) -> String {
    let taken = weir::runtime::control::request_savepoint(run, sp, true).unwrap();
    assert!(taken.stopped);
    let out = common::wait_with_watchdog(running, Duration::from_secs(120));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the child stopped at a savepoint exits well: {said}");
    assert!(said.contains(&format!("savepoints=[{}]", taken.id)), "{said}");
    said
}

/// The next offset of each input partition in a savepoint: its source's state, read back
/// with `weir state dump`.
fn cut(sp: &Path) -> BTreeMap<i32, i64> {
    let opened = weir::runtime::inspect::open(sp).unwrap();
    let mut out = Vec::new();
    weir::runtime::inspect::dump(&opened, "in", None, &mut out).unwrap();
    let mut cut = BTreeMap::new();
    for line in String::from_utf8(out).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for (p, offset) in v["state"]["partitions"].as_object().unwrap() {
            cut.insert(p.parse().unwrap(), offset.as_i64().unwrap());
        }
    }
    assert_eq!(cut.len(), PARTITIONS as usize, "every partition's offset: {cut:?}");
    cut
}

/// The input: event `seq` has key `seq * φ % KEYS`, goes to partition `key % 4` (so a
/// partition's records are in event-time order, and keyed), value `seq % 100 + 1`.
fn event(seq: u64) -> (i32, Event) {
    let key = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS;
    ((key % PARTITIONS as u64) as i32, Event { key, value: seq % 100 + 1, time_ns: seq * 1_000, seq })
}

/// The input topic with the events of [`event`], and an empty output topic.
fn prepare_topics(bootstrap: &str, topic: &str) {
    let (input, output) = (format!("{topic}-in"), format!("{topic}-out"));
    common::kafka::create_topics(bootstrap, &[(&input, PARTITIONS), (&output, OUTPUT_PARTITIONS)]);
    common::kafka::produce_events(bootstrap, &input, N, |seq| {
        let (partition, e) = event(seq);
        (Some(partition), e)
    });
}

/// A window's result: count, sum, and max if computed (versions 2 and 3).
type Results = BTreeMap<(u64, u64), (u64, u64, Option<u64>)>;

/// What one uninterrupted run of each version over its span gives: records before `cut1`
/// (per partition) by version 1, before `cut2` by version 2, the rest by version 3.
fn expected(cut1: &BTreeMap<i32, i64>, cut2: &BTreeMap<i32, i64>) -> BTreeMap<(u64, u64), (u64, u64, u64)> {
    let mut offsets = [0i64; PARTITIONS as usize];
    let mut want: BTreeMap<(u64, u64), (u64, u64, u64)> = BTreeMap::new();
    for seq in 0..N {
        let (p, e) = event(seq);
        let offset = offsets[p as usize];
        offsets[p as usize] += 1;
        let value = if offset < cut1[&p] {
            e.value * 2
        } else if e.seq.is_multiple_of(3) {
            continue; // versions 2 and 3 filter it out
        } else {
            e.value * 3
        };
        let _ = cut2; // versions 2 and 3 treat records alike; cut2 splits their spans only
        let w = want.entry((e.key, e.time_ns / WINDOW_NS * WINDOW_NS)).or_default();
        (w.0, w.1, w.2) = (w.0 + 1, w.1 + value, w.2.max(value));
    }
    want
}

fn read_committed(bootstrap: &str, topic: &str) -> Results {
    let mut got = Results::new();
    for payload in common::kafka::read_payloads(bootstrap, topic, OUTPUT_PARTITIONS, "read_committed") {
        let r: WindowResult = serde_json::from_slice(&payload).unwrap();
        let max_asked = r.aggregates & weir::window::Aggregate::Max.bit() != 0;
        let value = (r.count, r.sum, max_asked.then_some(r.max));
        assert!(
            got.insert((r.key, r.start_ns), value).is_none(),
            "window ({}, {}) committed twice: double-counted",
            r.key,
            r.start_ns
        );
    }
    got
}

#[test]
fn upgraded_twice_with_kill_nine_between_writes_each_window_once() {
    if std::env::var("WEIR_UPG_CHILD").is_ok() {
        return;
    }
    let Some(bootstrap) = common::kafka::bootstrap_or_skip() else { return };
    let (topic, dir) = common::kafka::fresh_topic_and_dir("weir-upg");
    prepare_topics(&bootstrap, &topic);
    let mut clock = common::KillClock::from_time();
    let mut n = 0;

    // Version 1: killed once, then stopped at savepoint 1.
    let (running, run) = run_killed_once(&dir, &bootstrap, &topic, 1, &mut n, &mut clock);
    std::thread::sleep(clock.next_delay(500, 1000));
    stop_at_savepoint(running, &run, &dir.join("sp1"));
    // Version 2, from savepoint 1: killed once (its restart resumes from its own checkpoint
    // if it took one, else from the savepoint), then stopped at savepoint 2.
    let (running, run) = run_killed_once(&dir, &bootstrap, &topic, 2, &mut n, &mut clock);
    std::thread::sleep(clock.next_delay(500, 1000));
    let said = stop_at_savepoint(running, &run, &dir.join("sp2"));
    assert!(said.contains("version=2 restored_from=Some("), "{said}");
    // Version 3 lacks `seen`: refused, naming it, unless dropping its state is allowed.
    let (mut cmd, _) = child(&dir, &bootstrap, &topic, 3, &mut n);
    let out = common::wait_with_watchdog(cmd.spawn().unwrap(), Duration::from_secs(120));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "version 3 without --allow-dropped-state starts: {said}");
    assert!(said.contains("holds state of node seen that this job does not have"), "{said}");
    let allowed = |cmd: &mut Command| {
        cmd.env("WEIR_UPG_ALLOW_DROPPED", "1");
    };
    let (mut cmd, run) = child(&dir, &bootstrap, &topic, 3, &mut n);
    allowed(&mut cmd);
    let mut first = cmd.spawn().unwrap();
    wait_started(&run);
    std::thread::sleep(clock.next_delay(300, 1200));
    common::kill_and_clean(&mut first);
    let (mut cmd, _) = child(&dir, &bootstrap, &topic, 3, &mut n);
    allowed(&mut cmd);
    let out = common::wait_with_watchdog(cmd.spawn().unwrap(), Duration::from_secs(300));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("version=3 restored_from=Some("), "{said}");

    let (cut1, cut2) = (cut(&dir.join("sp1")), cut(&dir.join("sp2")));
    let read: i64 = cut1.values().sum();
    let read2: i64 = cut2.values().sum();
    println!("version 1 read {read} records, version 2 {}, version 3 {}", read2 - read, N as i64 - read2);
    assert!(cut1.iter().all(|(p, o)| *o <= cut2[p]), "savepoint 2 is after savepoint 1: {cut1:?} {cut2:?}");
    let want = expected(&cut1, &cut2);
    let got = read_committed(&bootstrap, &format!("{topic}-out"));
    println!("{} windows committed, {} expected", got.len(), want.len());
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(k)).take(5).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(k)).take(5).collect();
    assert!(missing.is_empty() && extra.is_empty(), "windows missing {missing:?}, unexpected {extra:?}");
    let wrong: Vec<_> = want
        .iter()
        .filter(|(k, w)| match got[*k] {
            // Fired by version 1: no max.
            (c, s, None) => (c, s) != (w.0, w.1),
            (c, s, Some(m)) => (c, s, m) != **w,
        })
        .take(5)
        .map(|(k, w)| (k, w, got[k]))
        .collect();
    assert!(wrong.is_empty(), "(window, want, got), first 5: {wrong:?}");
    let by_v1 = got.values().filter(|v| v.2.is_none()).count();
    println!("{by_v1} windows fired by version 1, {} by versions 2 and 3", got.len() - by_v1);
    std::fs::remove_dir_all(&dir).unwrap();
}
