//! Two-input keyed operators and the interval join, against a reference model.
//!
//! The model of an interval join: a record is *accepted* if its event time is not below the
//! watermark when it arrives (else it is late: dropped and counted); the output is every
//! pair of accepted records of one key with `lower ≤ b.time − a.time ≤ upper`, plus — left
//! outer — every accepted left record in no pair. (The operator emits a pair when its later
//! record arrives: the earlier one cannot have expired by then, since the later one is not
//! late; so the model needs no expiry at all.)
//!
//! A regular join with a time to live has a model of its own (`model_ttl`): a sequential
//! replay of its rules with plain vectors.
//!
//! - `operator_matches_the_model`: the operator driven directly with random interleavings
//!   of left records, right records and watermarks (records out of order, some late), with a
//!   checkpoint taken and restored midway — into one new instance, or split over two by key
//!   group (restore at another parallelism).
//! - `jobs_match_the_model`: whole jobs — two sources with event time, connect, key_by,
//!   interval join at parallelism 1 and 2, inner and left outer, a regular join, and window
//!   joins (tumbling inner, sliding left outer) — where each source's
//!   disorder stays within its watermark bound, so nothing is late whatever the
//!   interleaving of the two inputs, and the output is exactly the model's.
//! - Bad input: bounds the wrong way round, or an input without event time, is refused
//!   before the job starts, naming the join.

use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::graph::Job;
use weir::operators::builtin::{CollectSink, Generator};
use weir::operators::join::{Interval, IntervalJoin, JoinFns, JoinKind, JoinWindows, WindowJoin};
use weir::operators::{Halt, KeyedProcess, Rescaled, SubtaskInfo};
use weir::record::{Either, Event, hash_key, key_group};
use weir::time::WatermarkStrategy;
use weir::window::Window;

/// A join result as compared: (left seq, right seq or u64::MAX for none).
type Pair = (u64, u64);

fn fns() -> JoinFns<Event, Event, u64, Pair> {
    JoinFns {
        key_a: Arc::new(|a: &Event| a.key),
        key_b: Arc::new(|b: &Event| b.key),
        time_a: Arc::new(|a: &Event| a.time_ns),
        time_b: Arc::new(|b: &Event| b.time_ns),
        join: Arc::new(|a: &Event, b: Option<&Event>| (a.seq, b.map_or(u64::MAX, |b| b.seq))),
    }
}

fn info(index: u32, parallelism: u32) -> SubtaskInfo {
    SubtaskInfo { job: "joins".into(), node: "join".into(), index, parallelism, max_key_groups: 16, owned: None }
}

#[derive(Debug, Clone)]
enum Op {
    Left(Event),
    Right(Event),
    Watermark(u64),
}

/// The model of a regular join with a time to live: a record arriving past its time to
/// live is dropped; a held record meets every record of its key that comes until the
/// watermark passes its time plus the time to live, then goes (left outer: alone, if it met
/// none); the end of input ends every record.
fn model_ttl(ops: &[Op], interval: Interval) -> (Vec<Pair>, u64) {
    let ttl = interval.ttl.expect("a time to live");
    let (mut w, mut late) = (0u64, 0u64);
    let mut lefts: Vec<(Event, bool)> = Vec::new();
    let mut rights: Vec<Event> = Vec::new();
    let mut out = Vec::new();
    let outer = interval.kind == JoinKind::LeftOuter;
    let expire = |w: u64, lefts: &mut Vec<(Event, bool)>, rights: &mut Vec<Event>, out: &mut Vec<Pair>| {
        lefts.retain(|(a, met)| {
            let keep = a.time_ns.saturating_add(ttl) >= w;
            if !keep && !met && outer {
                out.push((a.seq, u64::MAX));
            }
            keep
        });
        rights.retain(|b| b.time_ns.saturating_add(ttl) >= w);
    };
    for op in ops {
        match op {
            Op::Watermark(x) => {
                w = w.max(*x);
                expire(w, &mut lefts, &mut rights, &mut out);
            }
            Op::Left(e) | Op::Right(e) if e.time_ns.saturating_add(ttl) < w => late += 1,
            Op::Left(a) => {
                let mut met = false;
                for b in rights.iter().filter(|b| b.key == a.key) {
                    out.push((a.seq, b.seq));
                    met = true;
                }
                lefts.push((*a, met));
            }
            Op::Right(b) => {
                for (a, met) in lefts.iter_mut().filter(|(a, _)| a.key == b.key) {
                    out.push((a.seq, b.seq));
                    *met = true;
                }
                rights.push(*b);
            }
        }
    }
    expire(u64::MAX, &mut lefts, &mut rights, &mut out);
    out.sort_unstable();
    (out, late)
}

/// The model's output and late count for `ops`.
fn model(ops: &[Op], interval: Interval) -> (Vec<Pair>, u64) {
    if interval.ttl.is_some() {
        return model_ttl(ops, interval);
    }
    let (mut w, mut late) = (0u64, 0u64);
    let (mut lefts, mut rights) = (Vec::new(), Vec::new());
    for op in ops {
        match op {
            Op::Watermark(x) => w = w.max(*x),
            Op::Left(e) | Op::Right(e) if e.time_ns < w => late += 1,
            Op::Left(e) => lefts.push(*e),
            Op::Right(e) => rights.push(*e),
        }
    }
    let mut out = Vec::new();
    for a in &lefts {
        let mut met = false;
        for b in &rights {
            let d = b.time_ns as i128 - a.time_ns as i128;
            if a.key == b.key && interval.lower as i128 <= d && d <= interval.upper as i128 {
                out.push((a.seq, b.seq));
                met = true;
            }
        }
        if !met && interval.kind == JoinKind::LeftOuter {
            out.push((a.seq, u64::MAX));
        }
    }
    out.sort_unstable();
    (out, late)
}

/// What the tests read of a join besides its output.
trait Held: KeyedProcess<Either<Event, Event>, Pair> {
    fn held(&self) -> usize;
    fn late(&self) -> u64;
}

impl Held for IntervalJoin<Event, Event, u64, Pair> {
    fn held(&self) -> usize {
        IntervalJoin::held(self)
    }
    fn late(&self) -> u64 {
        IntervalJoin::late(self)
    }
}

impl Held for WindowJoin<Event, Event, u64, Pair> {
    fn held(&self) -> usize {
        WindowJoin::held(self)
    }
    fn late(&self) -> u64 {
        WindowJoin::late(self)
    }
}

fn feed<J: Held>(join: &mut J, op: &Op, out: &mut Vec<Pair>) {
    let mut emit = |p: &Pair| -> Result<(), Halt> {
        out.push(*p);
        Ok(())
    };
    match op {
        Op::Left(e) => join.process(&Either::Left(*e), 0, &mut emit).unwrap(),
        Op::Right(e) => join.process(&Either::Right(*e), 0, &mut emit).unwrap(),
        Op::Watermark(w) => join.on_watermark(*w, &mut emit).unwrap(),
    }
}

/// Drive the operator through `ops`, checkpointing after `cut` ops and going on from the
/// restored state in `restore_into` new instances (1: the same parallelism; 2: split by key
/// group). Returns the output and the late count.
fn operator(ops: &[Op], interval: Interval, cut: usize, restore_into: u32) -> (Vec<Pair>, u64) {
    drive(ops, cut, restore_into, |info| IntervalJoin::new(info, interval, fns()))
}

/// Drive joins made by `make` through `ops` (see `operator`).
fn drive<J: Held>(ops: &[Op], cut: usize, restore_into: u32, make: impl Fn(&SubtaskInfo) -> J) -> (Vec<Pair>, u64) {
    let mut out = Vec::new();
    let mut first = make(&info(0, 1));
    for op in &ops[..cut] {
        feed(&mut first, op, &mut out);
    }
    let bytes = first.snapshot(1).unwrap();
    let mut late = first.late();
    // The watermark is not part of the state (as in Flink): after a restore it starts over,
    // and the first watermark that comes sets it. Records between the restore and that
    // watermark are judged against none; feed the last watermark again to keep the model's.
    let last_w = ops[..cut].iter().filter_map(|o| if let Op::Watermark(w) = o { Some(*w) } else { None }).max();
    let mut next: Vec<J> = (0..restore_into)
        .map(|i| {
            let mut j = make(&info(i, restore_into));
            if restore_into == 1 {
                j.restore(&bytes).unwrap();
            } else {
                let from = Rescaled {
                    checkpoint_id: 1,
                    from_parallelism: 1,
                    index: i,
                    parallelism: restore_into,
                    parts: vec![(0, bytes.clone())],
                };
                j.restore_rescaled(&from).unwrap();
            }
            j
        })
        .collect();
    let held: usize = next.iter().map(J::held).sum();
    assert_eq!(held, first.held(), "a restore keeps every record the checkpoint held, once");
    let owner = |key: u64| {
        let kg = key_group(hash_key(&key), 16);
        (0..restore_into).find(|&i| info(i, restore_into).key_groups().contains(&kg)).unwrap() as usize
    };
    for op in last_w.map(Op::Watermark).iter().chain(&ops[cut..]) {
        match op {
            Op::Left(e) | Op::Right(e) => feed(&mut next[owner(e.key)], op, &mut out),
            Op::Watermark(_) => next.iter_mut().for_each(|j| feed(j, op, &mut out)),
        }
    }
    for j in &mut next {
        let mut emit = |p: &Pair| -> Result<(), Halt> {
            out.push(*p);
            Ok(())
        };
        j.finish(&mut emit).unwrap();
        assert_eq!(j.held(), 0, "the end of input closes every interval");
        late += j.late();
    }
    out.sort_unstable();
    (out, late)
}

fn ops_strategy() -> impl Strategy<Value = (Vec<Op>, Interval, usize, u32)> {
    let op = (0u8..10, 0u64..4, 0u64..200, 0u64..40);
    (prop::collection::vec(op, 1..120), -60i64..20, 0i64..60, any::<bool>(), 0.0f64..1.0, 1u32..=2).prop_map(
        |(raw, lower, width, outer, cut, into)| {
            // Time runs forward with jitter; watermarks trail it, sometimes past a record.
            let mut ops = Vec::new();
            let mut clock = 0u64;
            for (i, (kind, key, jitter, wlag)) in raw.into_iter().enumerate() {
                clock += 3;
                let t = (clock + 100).saturating_sub(jitter);
                let e = Event { key, value: 0, time_ns: t, seq: i as u64 };
                ops.push(match kind {
                    0..=3 => Op::Left(e),
                    4..=7 => Op::Right(e),
                    _ => Op::Watermark(clock.saturating_sub(wlag)),
                });
            }
            // A third of the cases: a regular join with a time to live of `width`.
            let interval = if lower < -40 {
                Interval::unbounded().with_ttl(width as u64)
            } else {
                Interval::between(lower, lower + width)
            };
            let interval = if outer { interval.left_outer() } else { interval };
            let cut = ((ops.len() as f64) * cut) as usize;
            (ops, interval, cut, into)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The operator, checkpointed and restored midway (at the same or another parallelism),
    /// gives exactly the model's pairs and late count.
    #[test]
    fn operator_matches_the_model((ops, interval, cut, into) in ops_strategy()) {
        let (want, want_late) = model(&ops, interval);
        let (got, got_late) = operator(&ops, interval, cut, into);
        prop_assert_eq!(got, want);
        prop_assert_eq!(got_late, want_late);
    }
}

/// The model of a window join: a record goes into the windows holding its time that are
/// still open (end above the watermark) when it comes, or is late; each window's pairs of
/// one key (and, left outer, its left records in no pair) are the output.
fn window_model(ops: &[Op], windows: JoinWindows) -> (Vec<Pair>, u64) {
    let (mut w, mut late) = (0u64, 0u64);
    let mut open: std::collections::BTreeMap<(u64, u64), (Vec<Event>, Vec<Event>)> = Default::default();
    for op in ops {
        let (e, left) = match op {
            Op::Watermark(x) => {
                w = w.max(*x);
                continue;
            }
            Op::Left(e) => (e, true),
            Op::Right(e) => (e, false),
        };
        let t = e.time_ns;
        let mut placed = false;
        let mut start = t - t % windows.slide;
        loop {
            if start + windows.size <= t {
                break;
            }
            if start + windows.size > w {
                placed = true;
                let (l, r) = open.entry((e.key, start)).or_default();
                if left { l.push(*e) } else { r.push(*e) }
            }
            if start < windows.slide {
                break;
            }
            start -= windows.slide;
        }
        if !placed {
            late += 1;
        }
    }
    let mut out = Vec::new();
    for (lefts, rights) in open.values() {
        for a in lefts {
            out.extend(rights.iter().map(|b| (a.seq, b.seq)));
            if rights.is_empty() && windows.kind == JoinKind::LeftOuter {
                out.push((a.seq, u64::MAX));
            }
        }
    }
    out.sort_unstable();
    (out, late)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The window join, tumbling and sliding, inner and left outer, checkpointed and restored
    /// midway (at the same or another parallelism), gives exactly the model's pairs and late
    /// count.
    #[test]
    fn window_join_matches_the_model(
        (ops, _, cut, into) in ops_strategy(),
        size in 1u64..80,
        slide_part in 1u64..=4,
        outer in any::<bool>(),
    ) {
        let slide = size.div_ceil(slide_part).max(1);
        let kind = if outer { JoinKind::LeftOuter } else { JoinKind::Inner };
        let windows = JoinWindows { size, slide, kind };
        let (want, want_late) = window_model(&ops, windows);
        let (got, got_late) = drive(&ops, cut, into, |info| WindowJoin::new(info, windows, fns()));
        prop_assert_eq!(got, want);
        prop_assert_eq!(got_late, want_late);
    }
}

/// `n` events of `keys` keys whose times run up to `jitter` ns out of order.
fn events(n: u64, keys: u64, jitter: u64, salt: u64) -> Arc<Vec<Event>> {
    Arc::new(
        (0..n)
            .map(|seq| {
                let h = hash_key(&(seq ^ salt));
                Event { key: h % keys, value: seq, time_ns: 1_000 + seq * 10 - h % (jitter + 1), seq }
            })
            .collect(),
    )
}

/// Which join a test job runs.
#[derive(Debug, Clone, Copy)]
enum Spec {
    Interval(Interval),
    Window(JoinWindows),
}

fn run_job(left: &Arc<Vec<Event>>, right: &Arc<Vec<Event>>, spec: Spec, p: u32, bound: u64) -> Vec<Pair> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("interval-join");
    job.configure(|c| c.pinning = false);
    let strategy = WatermarkStrategy::bounded(Duration::from_nanos(bound)).every_records(Some(7)).interval(None);
    let source = |id: &str, events: &Arc<Vec<Event>>| {
        let events = events.clone();
        let n = events.len() as u64;
        job.source(id, 1, move |info| {
            let events = events.clone();
            Generator::new(info, Some(n), move |seq| events[seq as usize])
        })
        .with_event_time(&format!("{id}-ts"), |e: &Event| e.time_ns, strategy)
    };
    let (l, r) = (source("left", left), source("right", right));
    let o = out.clone();
    let keyed = l.connect(&r).key_by("by_key", |a: &Event| a.key, |b: &Event| b.key);
    let pair = |a: &Event, b: Option<&Event>| (a.seq, b.map_or(u64::MAX, |b| b.seq));
    let joined = match spec {
        Spec::Interval(interval) => keyed.interval_join("join", p, interval, pair),
        Spec::Window(w) => {
            let window = Window::sliding(Duration::from_nanos(w.size), Duration::from_nanos(w.slide));
            keyed.window_join("join", p, window, w.kind, pair)
        }
    };
    joined.sink("out", 1, move |_| CollectSink::new(o.clone()));
    let summary = job.run().expect("the join job runs");
    assert_eq!(summary.node("join").unwrap().records_in, left.len() as u64 + right.len() as u64);
    let mut got = out.lock().unwrap().clone();
    got.sort_unstable();
    got
}

/// Whole jobs, two sources at their own pace: nothing is late (each source's disorder is
/// within its bound), so the output is exactly every pair in range (and, left outer, every
/// left record in none).
#[test]
fn jobs_match_the_model() {
    let (left, right) = (events(3_000, 50, 300, 1), events(2_000, 50, 300, 2));
    let ops: Vec<Op> = left.iter().map(|e| Op::Left(*e)).chain(right.iter().map(|e| Op::Right(*e))).collect();
    let intervals = [
        Interval::between(-200, 50),
        Interval::between(0, 0).left_outer(),
        Interval::between(-30, -10),
        Interval::unbounded(),
    ];
    let windows = [
        JoinWindows { size: 500, slide: 500, kind: JoinKind::Inner },
        JoinWindows { size: 400, slide: 100, kind: JoinKind::LeftOuter },
    ];
    let specs = intervals.map(Spec::Interval).into_iter().chain(windows.map(Spec::Window));
    for spec in specs {
        let (want, late) = match spec {
            Spec::Interval(interval) => model(&ops, interval),
            Spec::Window(w) => window_model(&ops, w),
        };
        assert_eq!(late, 0);
        for p in [1, 2] {
            let got = run_job(&left, &right, spec, p, 300);
            assert_eq!(got.len(), want.len(), "{spec:?} at p={p}: result count");
            assert!(got == want, "{spec:?} at p={p}: results differ from the model");
        }
    }
}

/// A join whose bounds admit nothing, or whose input has no event time, is refused before
/// it starts, and the message names the join and says what to do.
#[test]
fn bad_joins_are_refused() {
    let refusal = |interval: Interval, right_has_time: bool| {
        let job = Job::new("bad-join");
        let lag = WatermarkStrategy::bounded(Duration::from_millis(1));
        let a = job.source("a", 1, |i| Generator::events(i, 10, 2)).with_event_time("a-ts", |e: &Event| e.time_ns, lag);
        let mut b = job.source("b", 1, |i| Generator::events(i, 10, 2));
        if right_has_time {
            b = b.with_event_time("b-ts", |e: &Event| e.time_ns, lag);
        }
        a.connect(&b)
            .key_by("k", |x: &Event| x.key, |y: &Event| y.key)
            .interval_join("j", 1, interval, |x: &Event, _: Option<&Event>| x.seq)
            .sink("out", 1, |_| weir::operators::builtin::NullSink);
        job.run().expect_err("a bad join is refused").to_string()
    };
    let err = refusal(Interval::between(10, -10), true);
    assert!(err.contains("join `j`: the lower bound 10 ns is above the upper bound -10 ns"), "{err}");
    let err = refusal(Interval::unbounded().left_outer(), true);
    assert!(err.contains("join `j`: a left outer regular join without a time to live"), "{err}");
    let err = refusal(Interval::between(-10, 10), false);
    assert!(err.contains("join `j`") && err.contains("the right input of `k` has none"), "{err}");
    assert!(err.contains("with_event_time"), "{err}");
}

mod common;

/// The crash test's streams: left and right events of 10 keys, 10 ns apart, up to 300 ns
/// out of order (within the 300 ns watermark bound: nothing is late, whatever the restarts).
const CRASH_LEFT: u64 = 60_000;
const CRASH_RIGHT: u64 = 40_000;
const CRASH_INTERVAL: Interval = Interval { lower: -200, upper: 50, kind: JoinKind::LeftOuter, ttl: None };

fn crash_line(a: &Event, b: Option<&Event>) -> String {
    format!("{} {}", a.seq, b.map_or_else(|| "-".to_owned(), |b| b.seq.to_string()))
}

/// Run by the child process only: the join job, paced (~3 s), with checkpoints and an
/// exactly-once file sink, restoring from whatever its directory holds.
#[test]
fn join_child_process() {
    let Ok(dir) = std::env::var("WEIR_JOIN_CHILD") else { return };
    let dir = std::path::Path::new(&dir);
    let job = Job::new("join-crash");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
            interval: Duration::from_millis(40),
            timeout: Duration::from_secs(20),
            ..weir::checkpoint::CheckpointSettings::new(dir.join("chk"))
        });
    });
    let strategy = WatermarkStrategy::bounded(Duration::from_nanos(300));
    let source = |id: &str, n: u64, salt: u64| {
        let events = events(n, 10, 300, salt);
        job.source(id, 1, move |info| {
            let events = events.clone();
            Generator::new(info, Some(n), move |seq| events[seq as usize]).with_rate(20_000.0)
        })
        .with_event_time(&format!("{id}-ts"), |e: &Event| e.time_ns, strategy)
    };
    let (l, r) = (source("left", CRASH_LEFT, 1), source("right", CRASH_RIGHT, 2));
    let out = dir.join("out");
    l.connect(&r)
        .key_by("by_key", |a: &Event| a.key, |b: &Event| b.key)
        .interval_join("join", 2, CRASH_INTERVAL, crash_line)
        .sink("out", 1, move |info| weir::io::FileSink::new(weir::io::FileSinkConfig::new(&out), info));
    let summary = job.run().unwrap();
    println!("CHILD restored_from={:?}", summary.checkpoints.restored_from);
}

/// Kill -9 the join job at random moments (its state: buffered records of both inputs,
/// which met, and timers), restart it each time; after the last restart its committed
/// output is exactly the model's: every pair and every unmatched left record once.
#[test]
fn kill_nine_during_a_join_loses_and_doubles_nothing() {
    let dir = std::env::temp_dir().join(common::unique("weir-join-kill9"));
    std::fs::create_dir_all(&dir).unwrap();
    let _clean = common::RemoveOnDrop(dir.clone());
    let spawn = || {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "join_child_process", "--nocapture", "--test-threads=1"])
            .env("WEIR_JOIN_CHILD", &dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap()
    };
    let mut clock = common::KillClock::from_time();
    for _ in 0..4 {
        let mut child = spawn();
        std::thread::sleep(clock.next_delay(300, 900));
        common::kill_and_clean(&mut child);
    }
    let out = common::wait_with_watchdog(spawn(), Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the last run failed: {stdout}");
    assert!(!stdout.contains("restored_from=None"), "the last run restored a checkpoint: {stdout}");

    let (left, right) = (events(CRASH_LEFT, 10, 300, 1), events(CRASH_RIGHT, 10, 300, 2));
    let ops: Vec<Op> = left.iter().map(|e| Op::Left(*e)).chain(right.iter().map(|e| Op::Right(*e))).collect();
    let (want, late) = model(&ops, CRASH_INTERVAL);
    assert_eq!(late, 0);
    let mut want: Vec<String> = want
        .iter()
        .map(|&(a, b)| format!("{a} {}", if b == u64::MAX { "-".to_owned() } else { b.to_string() }))
        .collect();
    want.sort();
    let mut got = Vec::new();
    for f in std::fs::read_dir(dir.join("out")).unwrap() {
        let p = f.unwrap().path();
        if !p.to_string_lossy().ends_with(".inprogress") {
            got.extend(std::fs::read_to_string(&p).unwrap().lines().map(str::to_owned));
        }
    }
    got.sort();
    let doubled = got.windows(2).filter(|w| w[0] == w[1]).count();
    assert_eq!(doubled, 0, "results committed twice");
    assert_eq!(got.len(), want.len(), "committed results vs the model");
    assert!(got == want, "committed results differ from the model");
}

/// A keyed operator that panics on the record with seq 7 (`in_timer`: in its timer callback
/// once it has seen that record).
struct Boom {
    in_timer: bool,
    armed: bool,
}

impl KeyedProcess<Either<Event, Event>, u64> for Boom {
    fn process(
        &mut self,
        e: &Either<Event, Event>,
        _kg: u32,
        _out: &mut dyn FnMut(&u64) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        let seq = match e {
            Either::Left(a) | Either::Right(a) => a.seq,
        };
        if seq == 7 {
            assert!(self.in_timer, "boom: record 7 is cursed");
            self.armed = true;
        }
        Ok(())
    }
    fn on_watermark(&mut self, _w: u64, _out: &mut dyn FnMut(&u64) -> Result<(), Halt>) -> Result<(), Halt> {
        assert!(!self.armed, "boom: a timer for record 7 is cursed");
        Ok(())
    }
}

/// A panic in a user's keyed operator fails the job, naming the node, the key group of the
/// record (or the timer callback and its watermark) and the panic's message.
#[test]
fn a_panicking_operator_fails_the_job_with_node_and_key_group() {
    for in_timer in [false, true] {
        let job = Job::new("panic");
        job.configure(|c| c.pinning = false);
        let lag = WatermarkStrategy::bounded(Duration::ZERO).every_records(Some(1));
        let a = job.source("a", 1, |i| Generator::events(i, 20, 4)).with_event_time("a-ts", |e: &Event| e.time_ns, lag);
        let b = job.source("b", 1, |i| Generator::events(i, 0, 4)).with_event_time("b-ts", |e: &Event| e.time_ns, lag);
        a.connect(&b)
            .key_by("k", |x: &Event| x.key, |y: &Event| y.key)
            .process("boom", 2, move |_| Boom { in_timer, armed: false })
            .sink("out", 1, |_| weir::operators::builtin::NullSink);
        let err = job.run().expect_err("the panic fails the job").to_string();
        assert!(err.contains("node boom: panicked"), "{err}");
        if in_timer {
            assert!(err.contains("in a timer callback (at ") && err.contains("a timer for record 7"), "{err}");
        } else {
            let kg = key_group(hash_key(&(7u64.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 4)), 128);
            assert!(err.contains(&format!("key group {kg}:")) && err.contains("record 7 is cursed"), "{err}");
        }
    }
}

/// Forwards each event as its sequence number; once it has seen `panic_at`, its next timer
/// callback (the watermark) panics.
struct Forward {
    panic_at: Option<u64>,
    seen: bool,
}

impl KeyedProcess<Event, String> for Forward {
    fn process(&mut self, e: &Event, _kg: u32, out: &mut dyn FnMut(&String) -> Result<(), Halt>) -> Result<(), Halt> {
        self.seen |= Some(e.seq) == self.panic_at;
        out(&e.seq.to_string())
    }
    fn on_watermark(&mut self, w: u64, _out: &mut dyn FnMut(&String) -> Result<(), Halt>) -> Result<(), Halt> {
        assert!(!self.seen, "boom: the timer after record {:?} (watermark {w})", self.panic_at);
        Ok(())
    }
}

/// A record that makes a user's timer callback panic fails the job with the node and the
/// panic's message, and commits nothing past the last completed checkpoint: run again from
/// it without the panic, the exactly-once file sink's committed output holds every record
/// once (a part file committed after that checkpoint would hold some twice).
#[test]
fn a_panic_commits_nothing_past_the_last_checkpoint() {
    const N: u64 = 30_000;
    let dir = std::env::temp_dir().join(common::unique("weir-panic-eo"));
    std::fs::create_dir_all(&dir).unwrap();
    let _clean = common::RemoveOnDrop(dir.clone());
    let job = |panic_at: Option<u64>| {
        let job = Job::new("panic-eo");
        job.configure(|c| {
            c.pinning = false;
            c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
                interval: Duration::from_millis(40),
                timeout: Duration::from_secs(20),
                ..weir::checkpoint::CheckpointSettings::new(dir.join("chk"))
            });
        });
        let out = dir.join("out");
        // ~1 s of input: the panic comes after many checkpoints, mid-stream.
        job.source("gen", 1, |info| Generator::events(info, N, 50).with_rate(30_000.0))
            .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO))
            .key_by("k", |e: &Event| e.key)
            .process("boom", 2, move |_| Forward { panic_at, seen: false })
            .sink("out", 1, move |info| weir::io::FileSink::new(weir::io::FileSinkConfig::new(&out), info));
        job
    };
    let err = job(Some(N * 2 / 3)).run().expect_err("the panic fails the job").to_string();
    assert!(err.contains("node boom: panicked") && err.contains("boom: the timer after record"), "{err}");
    let before = weir::checkpoint::restore::find(&dir.join("chk")).unwrap().manifest.map(|m| m.id);
    assert!(before.is_some(), "checkpoints completed before the panic");

    let summary = job(None).run().expect("the job runs again from its last checkpoint");
    assert_eq!(summary.checkpoints.restored_from, before, "restored from the last checkpoint before the panic");
    let mut got: Vec<u64> = Vec::new();
    for f in std::fs::read_dir(dir.join("out")).unwrap() {
        let p = f.unwrap().path();
        if !p.to_string_lossy().ends_with(".inprogress") {
            got.extend(std::fs::read_to_string(&p).unwrap().lines().map(|l| l.parse::<u64>().unwrap()));
        }
    }
    got.sort_unstable();
    println!("panic: {err}\nrestored from checkpoint {before:?}; {} records committed in all", got.len());
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "every record committed once");
}

/// Job files: an interval join and a window join of two generators, counted: the pairs (and
/// left events alone) are exactly the model's. Bad join declarations are refused with the
/// line and the field.
#[test]
fn job_file_joins_match_the_model_and_bad_ones_are_refused() {
    use weir::graph::jobfile;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jobs/joined-events.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    // Both generators make the same events: seq s, key s × golden % 100, time s µs.
    let generated = |n: u64| -> Vec<Event> {
        (0..n)
            .map(|seq| Event {
                key: seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 100,
                value: seq % 100 + 1,
                time_ns: seq * 1_000,
                seq,
            })
            .collect()
    };
    let ops: Vec<Op> =
        generated(20_000).into_iter().map(Op::Left).chain(generated(10_000).into_iter().map(Op::Right)).collect();
    let tally_of = |pairs: &[Pair]| {
        let count = pairs.len() as u64;
        let left: u64 = pairs.iter().map(|p| p.0).fold(0, u64::wrapping_add);
        let right: u64 = pairs.iter().map(|p| if p.1 == u64::MAX { 0 } else { p.1 }).fold(0, u64::wrapping_add);
        (count, left, right)
    };
    let run = |text: &str| {
        let loaded = jobfile::parse(&path, text).unwrap_or_else(|e| panic!("{e}"));
        loaded.job.run().expect("the job file runs");
        let t = &loaded.tallies[0].1;
        (
            t.count.load(std::sync::atomic::Ordering::Acquire),
            t.seq_sum.load(std::sync::atomic::Ordering::Acquire),
            t.value_sum.load(std::sync::atomic::Ordering::Acquire),
        )
    };
    let interval = Interval::between(0, 2_000_000).left_outer();
    let (want, late) = model(&ops, interval);
    assert_eq!(late, 0);
    assert_eq!(run(&text), tally_of(&want), "the interval join in {}", path.display());

    let windowed = text
        .replace("type = \"interval_join\"", "type = \"window_join\"")
        .replace("lower_ms = 0 ", "window = \"sliding\"\nsize_ms = 4\nslide_ms = 2 ")
        .replace("upper_ms = 2", "")
        .replace("join = \"left_outer\"", "join = \"inner\"");
    let (want, late) = window_model(&ops, JoinWindows { size: 4_000_000, slide: 2_000_000, kind: JoinKind::Inner });
    assert_eq!(late, 0);
    assert_eq!(run(&windowed), tally_of(&want), "the window join");

    let refused = |from: &str, to: &str| match jobfile::parse(&path, &text.replace(from, to)) {
        Ok(_) => panic!("`{to}` is refused"),
        Err(e) => e.to_string(),
    };
    let err = refused("right_key = \"key\"", "right_key = \"price\"");
    assert!(
        err.contains("joined-events.toml:29:13:")
            && err.contains("operator[0].right_key")
            && err.contains("unknown field `price`"),
        "{err}"
    );
    let err = refused("inputs = [\"orders\", \"payments\"]", "input = \"orders\"");
    assert!(err.contains("operator[0].inputs") && err.contains("takes two inputs"), "{err}");
    let err = refused("upper_ms = 2", "upper_ms = -2");
    assert!(err.contains("operator[0].lower_ms") && err.contains("lower_ms ≤ upper_ms"), "{err}");
    let err = refused(
        "count = 10000\nkeys = 100\ntimestamp = \"time_ns\"\nmax_out_of_orderness_ms = 1",
        "count = 10000\nkeys = 100",
    );
    assert!(err.contains("operator[0].inputs") && err.contains("`payments` has no event time"), "{err}");
}

/// The right input of a join stalls after its first records until three checkpoints have
/// completed (its source is told of each), while the left one keeps sending: barriers
/// still align across both inputs (the stalled source sends its barriers without data),
/// and the join's output is exact when the right input resumes.
#[test]
fn checkpoints_complete_while_one_input_of_a_join_stalls() {
    struct Stalling {
        sent: u64,
        completed: Arc<std::sync::atomic::AtomicU64>,
        since: Option<std::time::Instant>,
    }
    impl weir::operators::Source<Event> for Stalling {
        fn poll(
            &mut self,
            out: &mut dyn weir::operators::Collector<Event>,
        ) -> Result<weir::operators::SourcePoll, Halt> {
            use weir::operators::SourcePoll;
            if self.sent == 2_000 {
                return Ok(SourcePoll::Finished);
            }
            if self.sent == 100 && self.completed.load(std::sync::atomic::Ordering::Acquire) < 3 {
                let since = *self.since.get_or_insert_with(std::time::Instant::now);
                assert!(since.elapsed() < Duration::from_secs(60), "watchdog: no checkpoint completed while stalled");
                return Ok(SourcePoll::Idle(Duration::from_millis(5)));
            }
            let seq = self.sent;
            out.collect(&Event { key: seq % 10, value: 0, time_ns: 1_000 + seq * 10, seq })?;
            self.sent += 1;
            Ok(SourcePoll::Emitted(1))
        }
        fn checkpoint_complete(&mut self, _id: u64) -> Result<(), Halt> {
            self.completed.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            Ok(())
        }
    }

    let dir = std::env::temp_dir().join(common::unique("weir-join-stall"));
    let _clean = common::RemoveOnDrop(dir.clone());
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("join-stall");
    job.configure(|c| {
        c.pinning = false;
        c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
            interval: Duration::from_millis(20),
            ..weir::checkpoint::CheckpointSettings::new(dir.join("chk"))
        });
    });
    // The left input: 3,000 events, key seq % 10, 10 ns apart, paced so it is still
    // sending while the right one stalls.
    let left: Vec<Event> =
        (0..3_000).map(|seq| Event { key: seq % 10, value: 0, time_ns: 1_000 + seq * 10, seq }).collect();
    let l = Arc::new(left.clone());
    let lag = WatermarkStrategy::bounded(Duration::ZERO);
    let a = job
        .source("left", 1, move |info| {
            let l = l.clone();
            Generator::new(info, Some(3_000), move |s| l[s as usize]).with_rate(20_000.0)
        })
        .with_event_time("left-ts", |e: &Event| e.time_ns, lag);
    let completed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c = completed.clone();
    let b = job.source("right", 1, move |_| Stalling { sent: 0, completed: c.clone(), since: None }).with_event_time(
        "right-ts",
        |e: &Event| e.time_ns,
        lag,
    );
    let o = out.clone();
    a.connect(&b)
        .key_by("by_key", |x: &Event| x.key, |y: &Event| y.key)
        .interval_join("join", 2, Interval::between(0, 0), |x: &Event, y: Option<&Event>| {
            (x.seq, y.map_or(u64::MAX, |y| y.seq))
        })
        .sink("out", 1, move |_| CollectSink::new(o.clone()));
    let summary = job.run().expect("the job runs");
    assert!(completed.load(std::sync::atomic::Ordering::Acquire) >= 3, "{:?}", summary.checkpoints);
    // Equal times and keys meet: seq s on both sides, for the right's 2,000.
    let mut got = out.lock().unwrap().clone();
    got.sort_unstable();
    assert_eq!(got, (0..2_000).map(|s| (s, s)).collect::<Vec<_>>());
}

/// The left input of a join may end while the right one goes on (reference data, read once,
/// joined with an endless stream): checkpoints keep completing after it ended, its final
/// parts standing for it, and a restore from one of them has the reference data in the
/// join's state without reading it again. Run 1: ten reference records (key k → 1000 + k),
/// then the right side's first 100 events, then the right side waits (cancelled after three
/// checkpoints completed since the left ended). Run 2 restores: the left emits nothing, the
/// right resumes at 100, and every event 100..200 finds its key's reference value.
#[test]
fn checkpoints_go_on_after_one_input_of_a_join_ends_and_restore_from_them() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use weir::operators::{Collector, Source, SourcePoll};
    use weir::state::{KeyedState, ValueState};

    #[derive(Default)]
    struct Shared {
        left_ended: AtomicBool,
        completed_since: AtomicU64,
        left_emitted: AtomicU64,
    }
    /// Ten reference records, then the end; its position is its checkpoint.
    struct Reference {
        next: u64,
        shared: Arc<Shared>,
    }
    impl Source<Event> for Reference {
        fn poll(&mut self, out: &mut dyn Collector<Event>) -> Result<SourcePoll, Halt> {
            if self.next == 10 {
                self.shared.left_ended.store(true, Ordering::Release);
                return Ok(SourcePoll::Finished);
            }
            out.collect(&Event { key: self.next, value: 1_000 + self.next, time_ns: 0, seq: self.next })?;
            self.shared.left_emitted.fetch_add(1, Ordering::AcqRel);
            self.next += 1;
            Ok(SourcePoll::Emitted(1))
        }
        fn snapshot(&mut self, _id: u64) -> Result<Vec<u8>, Halt> {
            Ok(self.next.to_le_bytes().to_vec())
        }
        fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
            if let Some((_, b)) = from {
                self.next = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            }
            Ok(())
        }
    }
    /// Events 0..200 of keys `seq % 10`, sent once the left has ended; in run 1 it waits
    /// at `pause`, counting the checkpoints completed with it there and the left ended.
    struct Events {
        next: u64,
        pause: Option<u64>,
        shared: Arc<Shared>,
        /// (checkpoint, position) of each snapshot.
        taken: Vec<(u64, u64)>,
    }
    impl Source<Event> for Events {
        fn poll(&mut self, out: &mut dyn Collector<Event>) -> Result<SourcePoll, Halt> {
            if self.next == 200 {
                return Ok(SourcePoll::Finished);
            }
            if Some(self.next) == self.pause || !self.shared.left_ended.load(Ordering::Acquire) {
                return Ok(SourcePoll::Idle(Duration::from_millis(5)));
            }
            out.collect(&Event { key: self.next % 10, value: 0, time_ns: 0, seq: self.next })?;
            self.next += 1;
            Ok(SourcePoll::Emitted(1))
        }
        fn snapshot(&mut self, id: u64) -> Result<Vec<u8>, Halt> {
            self.taken.push((id, self.next));
            Ok(self.next.to_le_bytes().to_vec())
        }
        fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
            if let Some((_, b)) = from {
                self.next = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            }
            Ok(())
        }
        fn checkpoint_complete(&mut self, id: u64) -> Result<(), Halt> {
            let at = self.taken.iter().find(|(i, _)| *i == id).map(|(_, at)| *at);
            if at.is_some() && at == self.pause && self.shared.left_ended.load(Ordering::Acquire) {
                self.shared.completed_since.fetch_add(1, Ordering::AcqRel);
            }
            Ok(())
        }
    }
    /// The reference value of the key, put by the left; each event with it (u64::MAX: none).
    struct Enrich {
        names: ValueState<u64, u64>,
    }
    impl KeyedProcess<Either<Event, Event>, (u64, u64)> for Enrich {
        fn process(
            &mut self,
            r: &Either<Event, Event>,
            kg: u32,
            out: &mut dyn FnMut(&(u64, u64)) -> Result<(), Halt>,
        ) -> Result<(), Halt> {
            match r {
                Either::Left(reference) => Ok(self.names.put(kg, &reference.key, &reference.value)?),
                Either::Right(e) => out(&(e.seq, self.names.get(kg, &e.key)?.unwrap_or(u64::MAX))),
            }
        }
    }

    let dir = std::env::temp_dir().join(common::unique("weir-join-ended"));
    let _clean = common::RemoveOnDrop(dir.clone());
    let job = |pause: Option<u64>, shared: &Arc<Shared>, out: &Arc<Mutex<Vec<(u64, u64)>>>| {
        let job = Job::new("join-ended");
        job.configure(|c| {
            c.pinning = false;
            c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
                interval: Duration::from_millis(20),
                ..weir::checkpoint::CheckpointSettings::new(dir.join("chk"))
            });
        });
        let (s, t) = (shared.clone(), shared.clone());
        let left = job.source("reference", 1, move |_| Reference { next: 0, shared: s.clone() });
        let right = job.source("events", 1, move |_| Events { next: 0, pause, shared: t.clone(), taken: Vec::new() });
        let o = out.clone();
        left.connect(&right)
            .key_by("by_key", |x: &Event| x.key, |y: &Event| y.key)
            .process_with_state("enrich", 2, |_, state: &KeyedState| Enrich { names: state.value("names") })
            .sink("out", 1, move |_| CollectSink::new(o.clone()));
        job
    };

    let shared = Arc::new(Shared::default());
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut running = job(Some(100), &shared, &out).start().expect("run 1 starts");
    let t = std::time::Instant::now();
    while shared.completed_since.load(Ordering::Acquire) < 3 {
        assert!(!running.has_failed(), "run 1 failed: {:?}", running.checkpoint_stats());
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "watchdog: checkpoints stopped after the left input ended: {:?}",
            running.checkpoint_stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    running.cancel();
    let _ = running.wait();

    let shared = Arc::new(Shared { left_ended: AtomicBool::new(true), ..Shared::default() });
    let out = Arc::new(Mutex::new(Vec::new()));
    let summary = job(None, &shared, &out).run().expect("run 2 runs");
    assert!(summary.checkpoints.restored_from.is_some(), "run 2 restores: {:?}", summary.checkpoints);
    assert_eq!(shared.left_emitted.load(Ordering::Acquire), 0, "the ended input is not read again");
    let mut got = out.lock().unwrap().clone();
    got.sort_unstable();
    assert_eq!(got, (100..200).map(|s| (s, 1_000 + s % 10)).collect::<Vec<_>>());
}

/// Records a join drops for coming behind the watermark are counted where users look: the
/// node's `late_records` (summary and counters file). One stream joined with itself: each
/// record reaches the join twice, once per side (two channels, read in an order the
/// scheduler decides). The records at 50 and 40 come after the stream's watermark passed
/// 200 and 300, so at least one copy of each is late (else they would pair), and every
/// other record pairs with itself: 2 to 4 late records, whatever the interleaving.
#[test]
fn late_records_of_a_join_are_counted_on_its_node() {
    let times = [100u64, 200, 50, 300, 40];
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("join-late");
    job.configure(|c| c.pinning = false);
    let lag = WatermarkStrategy::bounded(Duration::ZERO).every_records(Some(1)).interval(None);
    let events = job
        .source("events", 1, move |info| {
            Generator::new(info, Some(times.len() as u64), move |seq| Event {
                key: 1,
                value: 0,
                time_ns: times[seq as usize],
                seq,
            })
        })
        .with_event_time("ts", |e: &Event| e.time_ns, lag);
    let o = out.clone();
    events
        .connect(&events)
        .key_by("k", |a: &Event| a.key, |b: &Event| b.key)
        .interval_join("join", 1, Interval::between(0, 0), |a: &Event, b: Option<&Event>| {
            (a.seq, b.map_or(u64::MAX, |b| b.seq))
        })
        .sink("out", 1, move |_| CollectSink::new(o.clone()));
    let summary = job.run().expect("the job runs");
    let mut got = out.lock().unwrap().clone();
    got.sort_unstable();
    assert_eq!(got, vec![(0, 0), (1, 1), (3, 3)], "the records at 50 and 40 came behind the watermark");
    let late = summary.node("join").unwrap().late_records;
    assert!((2..=4).contains(&late), "late records counted on the join's node: {late}");
}
