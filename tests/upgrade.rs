//! Upgrading a job (issue #49): savepoints, a restore into a changed job, state that carries
//! its schema, and `weir state`. In-process jobs over a scripted source that emits its
//! events and then idles, so that windows stay open until the test stops the job at a
//! savepoint; the next version restores it. (`tests/kafka_upgrade.rs` does the same end to
//! end through Kafka, with kill -9.)

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use weir::checkpoint::CheckpointSettings;
use weir::graph::{Job, KeyedStream};
use weir::io::{FileSink, FileSinkConfig};
use weir::operators::builtin::NullSink;
use weir::operators::{Collector, Halt, KeyedProcess, Source, SourcePoll};
use weir::record::Event;
use weir::runtime::RunningJob;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Fold, Window};

/// Emits `events` in order (its position is its checkpoint), then idles (or ends, `end`).
struct Scripted {
    events: Arc<Vec<Event>>,
    at: usize,
    emitted: Arc<AtomicUsize>,
    end: bool,
}

impl Source<Event> for Scripted {
    fn poll(&mut self, out: &mut dyn Collector<Event>) -> Result<SourcePoll, Halt> {
        if self.at >= self.events.len() {
            return Ok(if self.end { SourcePoll::Finished } else { SourcePoll::Idle(Duration::from_millis(5)) });
        }
        let n = (self.events.len() - self.at).min(256);
        for e in &self.events[self.at..self.at + n] {
            out.collect(e)?;
        }
        self.at += n;
        self.emitted.store(self.at, Ordering::Release);
        Ok(SourcePoll::Emitted(n))
    }
    fn snapshot(&mut self, _id: u64) -> Result<Vec<u8>, Halt> {
        Ok((self.at as u64).to_le_bytes().to_vec())
    }
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        if let Some((_, b)) = from {
            self.at = u64::from_le_bytes(b.try_into().map_err(|_| Halt::failed("not a position"))?) as usize;
            self.emitted.store(self.at, Ordering::Release);
        }
        Ok(())
    }
}

const WINDOW: Duration = Duration::from_millis(250);

/// Events 0..n: key i % keys, value i % 977 + 1, one every 0.1 ms of event time.
fn events(n: usize, keys: u64) -> Arc<Vec<Event>> {
    Arc::new((0..n as u64).map(|i| Event { key: i % keys, value: i % 977 + 1, time_ns: i * 100_000, seq: i }).collect())
}

/// A job of `name` checkpointing into `dir/chk`: the scripted source `in` with event time.
fn base(
    name: &str,
    dir: &Path,
    evs: &Arc<Vec<Event>>,
    emitted: &Arc<AtomicUsize>,
    end: bool,
) -> (Job, weir::graph::Stream<Event>) {
    let job = Job::new(name);
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.checkpoints = Some(CheckpointSettings {
            interval: Duration::from_millis(50),
            timeout: Duration::from_secs(30),
            ..CheckpointSettings::new(dir.join("chk"))
        });
    });
    let (evs, emitted) = (evs.clone(), emitted.clone());
    let stream = job
        .source("in", 1, move |_| Scripted { events: evs.clone(), at: 0, emitted: emitted.clone(), end })
        .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO));
    (job, stream)
}

/// Windows of `WINDOW` by the events' time (a map before them keeps the watermarks, not
/// the timestamps), kept an hour after they fire (so every window is in the state).
fn windows(keyed: &KeyedStream<Event, u64>) -> weir::graph::WindowedStream<Event> {
    keyed
        .window(Window::tumbling(WINDOW))
        .timestamps(|e: &Event| e.time_ns)
        .allowed_lateness(Duration::from_secs(3600))
        .cache_bytes(weir::window::MIN_CACHE_BYTES)
}

/// Wait (at most a minute) until the source emitted `n` records.
fn wait_emitted(emitted: &AtomicUsize, n: usize) {
    let t = Instant::now();
    while emitted.load(Ordering::Acquire) < n {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the source emitted {} of {n} in a minute",
            emitted.load(Ordering::Acquire)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Run `job` until its source emitted `n`, then stop it at a savepoint in `sp`.
fn run_to_savepoint(job: &Job, emitted: &AtomicUsize, n: usize, sp: &Path) -> weir::runtime::SavepointTaken {
    let running = job.start().unwrap();
    wait_emitted(emitted, n);
    let taken = running.stop_with_savepoint(sp).unwrap();
    assert!(taken.stopped);
    let summary = running.wait().expect("a job stopped at a savepoint ends well");
    assert_eq!(summary.checkpoints.savepoints.last(), Some(&taken));
    taken
}

/// The start of `job` fails with a checkpoint error: its text.
fn refused(job: &Job) -> String {
    match job.start() {
        Ok(r) => {
            drop(r);
            panic!("the job started")
        }
        Err(e) => e.to_string(),
    }
}

/// The run of `job` fails (a subtask's restore): its text.
fn failed(job: &Job) -> String {
    match job.start().map(RunningJob::wait) {
        Ok(Ok(_)) => panic!("the job ran"),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}

/// (key, window start) → (count, sum, min, max), from the events.
type Model = BTreeMap<(u64, u64), (u64, u64, u64, u64)>;

fn model(evs: &[Event]) -> Model {
    let w = WINDOW.as_nanos() as u64;
    let mut m = Model::new();
    for e in evs {
        let s = m.entry((e.key, e.time_ns / w * w)).or_insert((0, 0, u64::MAX, 0));
        s.0 += 1;
        s.1 += e.value;
        s.2 = s.2.min(e.value);
        s.3 = s.3.max(e.value);
    }
    m
}

/// What `weir state dump` lines of a window say, as a model.
fn dumped(lines: &str) -> Model {
    let mut m = Model::new();
    for line in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let acc = &v["acc"];
        let got = (
            acc["count"].as_u64().unwrap(),
            acc["sum"].as_u64().unwrap(),
            acc["min"].as_u64().unwrap(),
            acc["max"].as_u64().unwrap(),
        );
        assert!(
            m.insert((v["key"].as_u64().unwrap(), v["start_ns"].as_u64().unwrap()), got).is_none(),
            "{line}: twice"
        );
    }
    m
}

/// `weir state dump` (the program and the library) reads back exactly the windows a job
/// wrote: 20 000 events over 3 001 keys into a window operator of parallelism 2 whose
/// cache holds a few hundred keys (most windows spilled into RocksDB's runs, the rest in the
/// cache's copy), stopped at a savepoint. `weir state ls` names the node and its state.
#[test]
fn state_dump_reads_back_exactly_the_windows_written() {
    let dir = common::counting::temp_dir("upgrade-dump");
    let evs = events(20_000, 3001);
    let emitted = Arc::new(AtomicUsize::new(0));
    let (job, stream) = base("dump", &dir, &evs, &emitted, false);
    windows(&stream.key_by("k", |e: &Event| e.key))
        .aggregate("count", 2, Aggregates::of(|e: &Event| e.value).count().sum().min().max())
        .sink("out", 1, |_| NullSink);
    let sp = dir.join("sp");
    run_to_savepoint(&job, &emitted, evs.len(), &sp);
    let want = model(&evs);

    let opened = weir::runtime::inspect::open(&sp).unwrap();
    let mut out = Vec::new();
    let lines = weir::runtime::inspect::dump(&opened, "count", None, &mut out).unwrap();
    let got = dumped(&String::from_utf8(out).unwrap());
    assert_eq!(lines as usize, want.len());
    assert_eq!(got, want, "the windows dumped are the windows written");

    let weir = env!("CARGO_BIN_EXE_weir");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(weir).args(args).output().unwrap();
        assert!(out.status.success(), "weir {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let sp_str = sp.to_str().unwrap();
    assert_eq!(dumped(&run(&["state", "dump", sp_str, "--node", "count"])), want);
    let one = run(&["state", "dump", sp_str, "--node", "count", "--key", "7"]);
    assert_eq!(dumped(&one), want.iter().filter(|((k, _), _)| *k == 7).map(|(k, v)| (*k, *v)).collect());
    let ls = run(&["state", "ls", sp_str]);
    assert!(ls.starts_with("savepoint ") && ls.contains("the job stopped at it"), "{ls}");
    let count_line = ls.lines().find(|l| l.starts_with("count ")).unwrap_or_else(|| panic!("{ls}"));
    assert!(
        count_line.contains("window") && count_line.contains("keyed by k (u64)") && count_line.contains("0..128"),
        "{ls}"
    );
    assert!(count_line.contains("aggregates count,sum,min,max") && count_line.contains("tumbling 250 ms"), "{ls}");
    let source = run(&["state", "dump", sp_str, "--node", "in"]);
    assert!(source.contains("\"kind\":\"source\""), "{source}");
    // The checkpoint directory reads too (its newest checkpoint: the savepoint's).
    assert_eq!(dumped(&run(&["state", "dump", dir.join("chk").to_str().unwrap(), "--node", "count"])), want);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A job stopped at a savepoint and started again changed — a filter added before the
/// window, the map before it changed, an aggregate added, the window at another
/// parallelism — goes on from the savepoint: each window's result is v1's records (as v1
/// mapped them) and v2's (filtered, mapped by v2), each once; `max`, added in v2, is exact
/// for the windows open at the savepoint too (the built-in accumulator keeps it).
#[test]
fn a_changed_job_goes_on_from_a_savepoint() {
    let dir = common::counting::temp_dir("upgrade-v2");
    let evs = events(12_000, 50);
    let cut = 7_000;
    let emitted = Arc::new(AtomicUsize::new(0));
    let v1_events = Arc::new(evs[..cut].to_vec());
    let (job, stream) = base("upgrade", &dir, &v1_events, &emitted, false);
    let out = dir.join("out");
    let o = out.clone();
    windows(&stream.map("double", |e: &Event| Event { value: e.value * 2, ..*e }).key_by("k", |e: &Event| e.key))
        .aggregate("count", 2, Aggregates::of(|e: &Event| e.value).count().sum())
        .sink("out", 1, move |info| FileSink::new(FileSinkConfig::new(&o), info));
    let sp = dir.join("sp");
    let taken = run_to_savepoint(&job, &emitted, cut, &sp);

    // v2: the whole input (it resumes at the savepoint's position), ending.
    let emitted = Arc::new(AtomicUsize::new(0));
    let (job, stream) = base("upgrade", &dir, &evs, &emitted, true);
    job.configure(|c| c.checkpoints.as_mut().unwrap().from_savepoint = Some(sp.clone()));
    let o = out.clone();
    windows(
        &stream
            .filter("odd", |e: &Event| e.seq % 2 == 1)
            .map("double", |e: &Event| Event { value: e.value * 3, ..*e })
            .key_by("k", |e: &Event| e.key),
    )
    .aggregate("count", 3, Aggregates::of(|e: &Event| e.value).count().sum().max())
    .sink("out", 1, move |info| FileSink::new(FileSinkConfig::new(&o), info));
    let summary = job.run().unwrap();
    assert_eq!(summary.checkpoints.restored_from, Some(taken.id));
    // Every window fires at the end (and again for none: each once).
    let w = WINDOW.as_nanos() as u64;
    let mut want: BTreeMap<(u64, u64), (u64, u64, u64)> = BTreeMap::new();
    for e in &evs[..cut] {
        let s = want.entry((e.key, e.time_ns / w * w)).or_default();
        (s.0, s.1, s.2) = (s.0 + 1, s.1 + e.value * 2, s.2.max(e.value * 2));
    }
    for e in evs[cut..].iter().filter(|e| e.seq % 2 == 1) {
        let s = want.entry((e.key, e.time_ns / w * w)).or_default();
        (s.0, s.1, s.2) = (s.0 + 1, s.1 + e.value * 3, s.2.max(e.value * 3));
    }
    // key=K window=[S, E) count=C sum=X [max=M]: v1's results have no max (v1 did not
    // compute it), v2's have.
    let mut got: BTreeMap<(u64, u64), (u64, u64, Option<u64>)> = BTreeMap::new();
    for f in std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().path()) {
        if f.to_string_lossy().ends_with(".inprogress") {
            continue;
        }
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .map(|v| v.trim_end_matches(',').parse::<u64>().unwrap())
            };
            let (key, start) = (field("key=").unwrap(), field("window=[").unwrap());
            let value = (field("count=").unwrap(), field("sum=").unwrap(), field("max="));
            assert!(got.insert((key, start), value).is_none(), "window ({key}, {start}) emitted twice: {line}");
        }
    }
    assert_eq!(got.len(), want.len(), "every window has one result");
    let by_v1 = got.values().filter(|v| v.2.is_none()).count();
    assert!(by_v1 > 0 && by_v1 < got.len(), "v1 fired some windows, v2 the rest: {by_v1} of {}", got.len());
    let wrong: Vec<_> = want
        .iter()
        .filter(|(k, w)| match got.get(k) {
            Some((c, s, None)) => (*c, *s) != (w.0, w.1),
            Some((c, s, Some(m))) => (*c, *s, *m) != **w,
            None => true,
        })
        .take(5)
        .map(|(k, w)| (k, w, got.get(k)))
        .collect();
    assert!(wrong.is_empty(), "(window, want, got), first 5: {wrong:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// v1 of the refusal tests: `in` → ts → key_by k → window `count` (count, sum) → `out`,
/// stopped at a savepoint after 3 000 events.
fn v1(dir: &Path) -> PathBuf {
    let evs = events(3000, 20);
    let emitted = Arc::new(AtomicUsize::new(0));
    let (job, stream) = base("refusals", dir, &evs, &emitted, false);
    windows(&stream.key_by("k", |e: &Event| e.key))
        .aggregate("count", 1, Aggregates::of(|e: &Event| e.value).count().sum())
        .sink("out", 1, |_| NullSink);
    let sp = dir.join("sp");
    run_to_savepoint(&job, &emitted, evs.len(), &sp);
    sp
}

/// A v2 of the refusal tests restoring `sp` (into a fresh checkpoint directory).
fn v2(dir: &Path, sp: &Path, name: &str) -> (Job, weir::graph::Stream<Event>) {
    let evs = events(10, 20);
    let emitted = Arc::new(AtomicUsize::new(0));
    let sub = dir.join(name);
    let (job, stream) = base("refusals", &sub, &evs, &emitted, false);
    job.configure(|c| c.checkpoints.as_mut().unwrap().from_savepoint = Some(sp.to_owned()));
    (job, stream)
}

/// Each change a restore cannot make sense of is refused at start, naming the node and
/// what changed: the window's node removed (unless dropping it is allowed), its key_by,
/// its key type, its shape, its operator, its accumulator type. An aggregate added is not.
#[test]
fn a_restore_into_a_changed_job_refuses_what_it_cannot_read() {
    let dir = common::counting::temp_dir("upgrade-refusals");
    let sp = v1(&dir);
    let agg = || Aggregates::of(|e: &Event| e.value).count().sum();

    let (job, stream) = v2(&dir, &sp, "removed");
    stream.sink("out", 1, |_| NullSink);
    let e = refused(&job);
    assert!(
        e.contains("holds state of node count that this job does not have") && e.contains("--allow-dropped-state"),
        "{e}"
    );
    job.configure(|c| c.checkpoints.as_mut().unwrap().allow_dropped_state = true);
    let mut running = job.start().expect("dropping the window's state is allowed");
    running.cancel();
    let _ = running.wait();

    let (job, stream) = v2(&dir, &sp, "key_by");
    windows(&stream.key_by("user", |e: &Event| e.key)).aggregate("count", 1, agg()).sink("out", 1, |_| NullSink);
    let e = refused(&job);
    assert!(e.contains("node count was keyed by `k` and is now keyed by `user`"), "{e}");

    let (job, stream) = v2(&dir, &sp, "key_type");
    stream.key_by("k", |e: &Event| e.key as u32).window(Window::tumbling(WINDOW)).aggregate("count", 1, agg()).sink(
        "out",
        1,
        |_| NullSink,
    );
    let e = refused(&job);
    assert!(e.contains("node count's key was of type u64 and is now u32"), "{e}");

    let (job, stream) = v2(&dir, &sp, "shape");
    stream.key_by("k", |e: &Event| e.key).window(Window::tumbling(WINDOW * 2)).aggregate("count", 1, agg()).sink(
        "out",
        1,
        |_| NullSink,
    );
    let e = refused(&job);
    assert!(
        e.contains("node count: its window shape was tumbling 250 ms, event time and is now tumbling 500 ms"),
        "{e}"
    );

    let (job, stream) = v2(&dir, &sp, "operator");
    stream.key_by("k", |e: &Event| e.key).process("count", 1, |_| Echo).sink("out", 1, |_| NullSink);
    let e = refused(&job);
    assert!(e.contains("node count was a window and is now a keyed operator"), "{e}");

    let (job, stream) = v2(&dir, &sp, "accumulator");
    let fold = Fold::new(
        0u64,
        |a: &mut u64, e: &Event| *a += e.value,
        |a, b| *a += *b,
        |w: &weir::window::Fired, a: &u64| Event { key: w.key, value: *a, time_ns: w.start_ns, seq: 0 },
    );
    windows(&stream.key_by("k", |e: &Event| e.key)).aggregate("count", 1, fold).sink("out", 1, |_| NullSink);
    let e = refused(&job);
    assert!(
        e.contains("node count, windows state `windows`, value: a u64 became")
            || e.contains("node count, windows state `windows`, value:"),
        "{e}"
    );
    assert!(e.contains("Stats"), "{e}");

    let (job, stream) = v2(&dir, &sp, "aggregate");
    windows(&stream.key_by("k", |e: &Event| e.key))
        .aggregate("count", 2, Aggregates::of(|e: &Event| e.value).count().sum().mean())
        .sink("out", 1, |_| NullSink);
    let mut running = job.start().expect("an aggregate added restores");
    running.cancel();
    let _ = running.wait();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A keyed operator that passes records on.
struct Echo;

impl KeyedProcess<Event, Event> for Echo {
    fn process(&mut self, e: &Event, _kg: u32, out: &mut dyn FnMut(&Event) -> Result<(), Halt>) -> Result<(), Halt> {
        out(e)
    }
}

#[derive(
    Clone, Copy, Debug, PartialEq, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout,
)]
#[repr(C)]
struct TotalsV1 {
    count: u32,
    pad: u32,
    sum: u64,
}
weir::fixed_record!(TotalsV1 { count: u32, pad: u32, sum: u64 });

/// `TotalsV1` with `count` and `pad` widened, the fields moved, and `max` added (default
/// 7, so a test can tell).
#[derive(
    Clone, Copy, Debug, PartialEq, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout,
)]
#[repr(C)]
struct TotalsV2 {
    sum: u64,
    count: u64,
    max: u64,
    pad: u64,
}
weir::fixed_record!(TotalsV2 { sum: u64, count: u64, max: u64 = 7, pad: u64 });

/// `TotalsV1` without `sum`.
#[derive(
    Clone, Copy, Debug, PartialEq, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout,
)]
#[repr(C)]
struct TotalsLost {
    count: u64,
}
weir::fixed_record!(TotalsLost { count: u64 });

/// An operator's conversion of its own bytes: from version, bytes → bytes of its version.
type Convert = fn(u32, Vec<u8>) -> Result<Vec<u8>, String>;

/// Declares value state `totals` of type `V` (the restore converts what v1 wrote into it) and
/// passes records on. Its own bytes are what it restored, written back at `version`.
struct Totals<V: weir::record::Record + Clone> {
    _totals: weir::state::ValueState<u64, V>,
    version: u32,
    own: Vec<u8>,
    convert: Option<Convert>,
}

impl<V: weir::record::Record + Clone + Send> KeyedProcess<Event, Event> for Totals<V> {
    fn process(&mut self, e: &Event, _kg: u32, out: &mut dyn FnMut(&Event) -> Result<(), Halt>) -> Result<(), Halt> {
        out(e)
    }
    fn snapshot(&mut self, _id: u64) -> Result<Vec<u8>, Halt> {
        Ok(self.own.clone())
    }
    fn restore(&mut self, state: &[u8]) -> Result<(), Halt> {
        self.own = state.to_vec();
        Ok(())
    }
    fn restore_rescaled(&mut self, from: &weir::checkpoint::Rescaled) -> Result<(), Halt> {
        // Every old subtask wrote the same bytes: any one is the operator's.
        self.own = from.parts.first().map(|(_, b)| b.clone()).unwrap_or_default();
        Ok(())
    }
    fn state_version(&self) -> u32 {
        self.version
    }
    fn migrate_state(&mut self, from: u32, bytes: Vec<u8>) -> Result<Vec<u8>, Halt> {
        match self.convert {
            Some(f) => f(from, bytes).map_err(Halt::failed),
            None => Err(Halt::failed(format!("no conversion from version {from}"))),
        }
    }
}

/// Writes totals for keys 0..20 into value state `totals` at its first record, then passes
/// records on: v1 of the keyed-state tests.
struct WriteTotals {
    totals: weir::state::ValueState<u64, TotalsV1>,
    written: bool,
}

impl KeyedProcess<Event, Event> for WriteTotals {
    fn process(&mut self, e: &Event, kg: u32, out: &mut dyn FnMut(&Event) -> Result<(), Halt>) -> Result<(), Halt> {
        let t = self.totals.get(kg, &e.key)?.unwrap_or(TotalsV1 { count: 0, pad: 0, sum: 0 });
        self.totals.put(kg, &e.key, &TotalsV1 { count: t.count + 1, pad: 0, sum: t.sum + e.value })?;
        self.written = true;
        out(e)
    }
    fn snapshot(&mut self, _id: u64) -> Result<Vec<u8>, Halt> {
        Ok(b"own-v0".to_vec())
    }
}

/// Keyed state carries its schema: v2 of a keyed operator whose value state gained a field
/// and widened another converts every value at restore (`weir state dump` shows them);
/// one that removed a field is refused naming it; one that no longer declares the state is
/// refused unless dropping it is allowed; the operator's own bytes of version 0 are
/// refused by a version-1 operator without a conversion and converted by one with; a
/// conversion hook (`migrate_from`) reads the old type.
#[test]
fn keyed_state_converts_or_is_refused_by_its_schema() {
    let dir = common::counting::temp_dir("upgrade-keyed");
    let evs = events(2000, 20);
    let emitted = Arc::new(AtomicUsize::new(0));
    let (job, stream) = base("keyed", &dir, &evs, &emitted, false);
    stream
        .key_by("k", |e: &Event| e.key)
        .process_with_state("totals", 2, |_, state| WriteTotals { totals: state.value("totals"), written: false })
        .sink("out", 1, |_| NullSink);
    let sp = dir.join("sp");
    run_to_savepoint(&job, &emitted, evs.len(), &sp);
    // What v1 wrote, by key: (count, sum).
    let mut v1: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for e in evs.iter() {
        let t = v1.entry(e.key).or_default();
        (t.0, t.1) = (t.0 + 1, t.1 + e.value);
    }
    let opened = weir::runtime::inspect::open(&sp).unwrap();
    let mut out = Vec::new();
    weir::runtime::inspect::dump(&opened, "totals", None, &mut out).unwrap();
    let mut seen = BTreeMap::new();
    for line in String::from_utf8(out).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["state"], "totals", "{line}");
        seen.insert(
            v["key"].as_u64().unwrap(),
            (v["value"]["count"].as_u64().unwrap(), v["value"]["sum"].as_u64().unwrap()),
        );
    }
    assert_eq!(seen, v1, "weir state dump reads the keyed state back by its schema");

    // v2 runs with a state of another version in its own checkpoint directory: `name`.
    let v2 = |name: &str, f: &dyn Fn(weir::graph::KeyedStream<Event, u64>) -> weir::graph::Stream<Event>| {
        let evs = events(0, 20);
        let emitted = Arc::new(AtomicUsize::new(0));
        let (job, stream) = base("keyed", &dir.join(name), &evs, &emitted, false);
        job.configure(|c| c.checkpoints.as_mut().unwrap().from_savepoint = Some(sp.clone()));
        f(stream.key_by("k", |e: &Event| e.key)).sink("out", 1, |_| NullSink);
        job
    };
    let widened = v2("widened", &|s| {
        s.process_with_state("totals", 3, |_, st| Totals::<TotalsV2> {
            _totals: st.value("totals"),
            version: 0,
            own: vec![],
            convert: None,
        })
    });
    let sp2 = dir.join("sp2");
    let running = widened.start().unwrap();
    running.stop_with_savepoint(&sp2).unwrap();
    running.wait().unwrap();
    let mut out = Vec::new();
    weir::runtime::inspect::dump(&weir::runtime::inspect::open(&sp2).unwrap(), "totals", None, &mut out).unwrap();
    let mut converted = BTreeMap::new();
    for line in String::from_utf8(out).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let t = &v["value"];
        assert_eq!(t["max"], 7, "the added field has its default: {line}");
        converted.insert(v["key"].as_u64().unwrap(), (t["count"].as_u64().unwrap(), t["sum"].as_u64().unwrap()));
    }
    assert_eq!(converted, v1, "every value converted, at parallelism 3");

    let lost = v2("lost", &|s| {
        s.process_with_state("totals", 2, |_, st| Totals::<TotalsLost> {
            _totals: st.value("totals"),
            version: 0,
            own: vec![],
            convert: None,
        })
    });
    let e = failed(&lost);
    assert!(e.contains("node totals, value state `totals`, value: ") && e.contains("field `sum`: removed"), "{e}");

    let undeclared = v2("undeclared", &|s| s.process_with_state("totals", 2, |_, _st| Echo));
    let e = failed(&undeclared);
    assert!(e.contains("the checkpoint holds value state `totals`, which this operator does not declare"), "{e}");

    let versioned = v2("versioned", &|s| {
        s.process_with_state("totals", 2, |_, st| Totals::<TotalsV1> {
            _totals: st.value("totals"),
            version: 1,
            own: vec![],
            convert: None,
        })
    });
    let e = failed(&versioned);
    assert!(e.contains("written in version 0 of the keyed's format and this job's keyed writes version 1"), "{e}");

    // With a conversion of its own bytes, and a hook for the state (v1's type → v2's).
    let hooked = v2("hooked", &|s| {
        s.process_with_state("totals", 2, |_, st| Totals::<TotalsV2> {
            _totals: st.value("totals").migrate_from(|old: TotalsV1| TotalsV2 {
                sum: old.sum,
                count: old.count as u64,
                max: 1,
                pad: 0,
            }),
            version: 1,
            own: vec![],
            convert: Some(|from, mut b| {
                b.extend_from_slice(format!("+{from}").as_bytes());
                Ok(b)
            }),
        })
    });
    let sp3 = dir.join("sp3");
    let running = hooked.start().unwrap();
    running.stop_with_savepoint(&sp3).unwrap();
    running.wait().unwrap();
    let opened = weir::runtime::inspect::open(&sp3).unwrap();
    let mut out = Vec::new();
    weir::runtime::inspect::dump(&opened, "totals", None, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.lines().count() == 20 && text.lines().all(|l| l.contains("\"max\":1")), "{text}");
    let listing = weir::runtime::inspect::list(&opened).unwrap();
    let node = listing.nodes.iter().find(|n| n.node == "totals").unwrap();
    assert_eq!(node.written_by.as_deref(), Some("keyed v1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A savepoint leaves the job running (`RunningJob::savepoint`); a job started from it that
/// crashes before its first checkpoint restarts from the savepoint, and after one from its
/// own checkpoint (the lineage), never from the savepoint again. A savepoint directory that
/// is not empty is refused; a directory that is not a savepoint is named as such.
#[test]
fn savepoints_and_the_checkpoints_that_follow_them() {
    let dir = common::counting::temp_dir("upgrade-lineage");
    let evs = events(3000, 20);
    let emitted = Arc::new(AtomicUsize::new(0));
    let (job, stream) = base("lineage", &dir, &evs, &emitted, false);
    windows(&stream.key_by("k", |e: &Event| e.key))
        .aggregate("count", 1, Aggregates::of(|e: &Event| e.value).count())
        .sink("out", 1, |_| NullSink);
    let mut running = job.start().unwrap();
    wait_emitted(&emitted, evs.len());
    let sp = dir.join("sp");
    let taken = running.savepoint(&sp).unwrap();
    assert!(!taken.stopped && taken.bytes > 0);
    let e = running.savepoint(&sp).unwrap_err().to_string();
    assert!(e.contains("is not empty"), "{e}");
    assert!(!running.is_finished(), "the job goes on after a savepoint");
    running.cancel();
    let _ = running.wait();
    assert!(weir::checkpoint::savepoint::read(&sp).unwrap().savepoint.is_some());
    let e = weir::checkpoint::savepoint::read(&dir.join("chk")).unwrap_err().to_string();
    assert!(e.contains("is a checkpoint directory, not a savepoint"), "{e}");

    // v2 from the savepoint into chk2: restored from it; then, with checkpoints of its own,
    // restored from those.
    let run_v2 = |wait_checkpoint: bool| {
        let evs = events(3000, 20);
        let emitted = Arc::new(AtomicUsize::new(0));
        let (job, stream) = base("lineage", &dir.join("v2"), &evs, &emitted, false);
        job.configure(|c| {
            let k = c.checkpoints.as_mut().unwrap();
            k.from_savepoint = Some(sp.clone());
            // A run that is not to take a checkpoint takes none before it is cancelled.
            if !wait_checkpoint {
                k.interval = Duration::from_secs(3600);
            }
        });
        windows(&stream.key_by("k", |e: &Event| e.key))
            .aggregate("count", 1, Aggregates::of(|e: &Event| e.value).count())
            .sink("out", 1, |_| NullSink);
        let mut running = job.start().unwrap();
        let restored = running.checkpoint_stats().restored_from;
        if wait_checkpoint {
            let t = Instant::now();
            while running.checkpoint_stats().completed.is_empty() {
                assert!(t.elapsed() < Duration::from_secs(60));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let last = running.checkpoint_stats().completed.last().map(|c| c.0);
        running.cancel();
        let _ = running.wait();
        (restored, last)
    };
    let (restored, _) = run_v2(false);
    assert_eq!(restored, Some(taken.id));
    let (restored, own) = run_v2(true);
    assert_eq!(restored, Some(taken.id), "no checkpoint of its own yet");
    let own = own.unwrap();
    let (restored, _) = run_v2(false);
    assert!(
        restored.is_some_and(|r| r >= own),
        "resumed from its own checkpoint {own}, not the savepoint: {restored:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
