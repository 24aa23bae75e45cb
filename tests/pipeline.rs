//! End-to-end runs of small jobs: every record arrives exactly once, through chains,
//! every partitioning and a union.

mod common;

use std::sync::{Arc, Mutex};
use weir::graph::Job;
use weir::operators::builtin::{CollectSink, CountingSink, Generator, SumPerKey, Tally};
use weir::record::Event;

/// generator -> map -> key_by -> 4 sinks: counts and checksums are exact, keys land on the
/// subtask that owns their key group, and the summary counts every node.
#[test]
fn keyed_pipeline_is_exact() {
    const N: u64 = 200_000;
    let tally = Arc::new(Tally::default());
    let job = Job::new("keyed-exact");
    let t = tally.clone();
    job.source("gen", 1, |info| Generator::events(info, N, 1_000))
        .map("double", |e: &Event| Event { value: e.value * 2, ..*e })
        .parallelism(2)
        .key_by("by_key", |e: &Event| e.key)
        .sink("count", 4, move |_| CountingSink::new(t.clone()));
    let summary = job.run().expect("job runs");
    assert_eq!(tally.totals(), Tally::expected(N));
    assert_eq!(summary.node("gen").unwrap().records_out, N);
    assert_eq!(summary.node("double").unwrap().records_in, N);
    assert_eq!(summary.node("count").unwrap().records_in, N);
}

/// Chained and unchained runs of the same stateless chain give the same records, and the
/// same counts per node. Unchained, records cross each ring a frame's run at a time and go
/// down the receiving chain as a batch: the filter passes on the runs of neighbours that
/// pass it (here runs of 4 of every 7), so order and counts show any record lost, doubled
/// or moved within a batch.
#[test]
fn chaining_does_not_change_results() {
    for chaining in [true, false] {
        let out = Arc::new(Mutex::new(Vec::new()));
        let job = Job::new("chain");
        job.configure(|c| c.chaining = chaining);
        let o = out.clone();
        job.source("gen", 1, |info| Generator::new(info, Some(10_000), |s| s))
            .map("plus", |x: &u64| x + 1)
            .filter("even", |x: &u64| x.is_multiple_of(2))
            .filter("runs", |x: &u64| x % 7 < 4)
            .flat_map("twice", |x: &u64| [*x, *x])
            .sink("out", 1, move |_| CollectSink::new(o.clone()));
        let plan = job.describe().unwrap();
        if chaining {
            assert!(
                plan.contains(
                    "chain 0: gen (source) -> plus (map) -> even (filter) -> runs (filter) -> twice (flat_map) -> out (sink) x1"
                ),
                "{plan}"
            );
        } else {
            assert_eq!(plan.matches("exchange").count(), 5, "{plan}");
        }
        let summary = job.run().unwrap();
        let got = out.lock().unwrap().clone();
        let kept: Vec<u64> = (1..=10_000u64).filter(|x| x.is_multiple_of(2) && x % 7 < 4).collect();
        let want: Vec<u64> = kept.iter().flat_map(|&x| [x, x]).collect();
        assert_eq!(got, want, "chaining {chaining}");
        let node = |name: &str| summary.node(name).unwrap();
        assert_eq!((node("even").records_in, node("even").records_out), (10_000, 5_000), "chaining {chaining}");
        assert_eq!((node("runs").records_in, node("runs").records_out), (5_000, kept.len() as u64));
        assert_eq!((node("twice").records_in, node("out").records_in), (kept.len() as u64, want.len() as u64));
    }
}

/// Broadcast gives every receiver every record; rebalance spreads them; union merges.
#[test]
fn broadcast_rebalance_union() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("bru");
    let a = job.source("a", 2, |info| Generator::new(info, Some(1000), |s| s));
    let b = job.source("b", 1, |info| Generator::new(info, Some(1000), |s| s + 1_000_000));
    let o = out.clone();
    a.union(&b)
        .rebalance()
        .map("id", |x: &u64| *x)
        .parallelism(3)
        .broadcast()
        .sink("all", 2, move |_| CollectSink::new(o.clone()));
    job.run().unwrap();
    let mut got = out.lock().unwrap().clone();
    got.sort();
    let mut want: Vec<u64> = (0..1000).chain(1_000_000..1_001_000).flat_map(|x| [x, x]).collect();
    want.sort();
    assert_eq!(got, want);
}

/// A keyed operator sees all records of a key in one subtask: per-key sums are exact.
#[test]
fn keyed_sum_is_exact() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("sum");
    let o = out.clone();
    job.source("gen", 2, |info| Generator::events(info, 50_000, 97))
        .key_by("k", |e: &Event| e.key)
        .process("sum", 3, |_| SumPerKey::default())
        .sink("out", 1, move |_| CollectSink::new(o.clone()));
    job.run().unwrap();
    let got = out.lock().unwrap().clone();
    let mut want = std::collections::HashMap::<u64, u64>::new();
    for seq in 0..50_000u64 {
        *want.entry(seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 97).or_default() += seq % 100 + 1;
    }
    assert_eq!(got.len(), want.len(), "one result per key");
    for e in got {
        assert_eq!(want[&e.key], e.value, "key {}", e.key);
    }
}

/// A stop posted before a subtask's thread has started (a job cancelled, or failing, at
/// once) still stops it: 20 jobs of 10 subtasks on however many cores, each cancelled right
/// after `start`, each ends within a watchdog.
#[test]
fn a_cancel_right_after_start_stops_every_subtask() {
    use std::time::Duration;
    for round in 0..20 {
        let mut running = common::quiet_job("cancel-at-once").start().expect("job starts");
        running.cancel();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(running.wait().is_err()).unwrap());
        let cancelled = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("watchdog: round {round}: a subtask did not see the stop"));
        assert!(cancelled, "a cancelled job reports it");
    }
}

/// A subtask idling by busy-spin (it never parks) still shows as idle while it spins: the
/// duty cycle reads the clock every so many spin rounds, not only when work resumes.
#[test]
fn a_spinning_idle_subtask_shows_as_idle_live() {
    use std::time::Duration;
    use weir::operators::builtin::{NullSink, Silent};
    use weir::ring::counters::CountersReader;
    use weir_tools::stat::StatView;
    if core_affinity::get_core_ids().map_or(0, |c| c.len()) < 2 {
        println!("needs 2 CPUs for 2 busy-spinning subtasks; skipped");
        return;
    }
    let job = Job::new("spin-idle");
    job.configure(|c| c.idle = weir::ring::IdleStrategy::BusySpin);
    job.source::<Event, _>("quiet", 1, |_| Silent).rebalance().sink("sink", 1, |_| NullSink);
    let mut running = job.start().expect("job starts");
    let reader = CountersReader::open(running.counters_path()).expect("counters file");
    std::thread::sleep(Duration::from_millis(200));
    let before = reader.snapshot();
    std::thread::sleep(Duration::from_millis(300));
    let view = StatView::between(&before, &reader.snapshot(), 0.3);
    let sink = view.subtasks.iter().find(|s| s.owner == "sink#0").expect("the sink's counters");
    println!("spinning sink: busy {:.2}, idle {:.2}", sink.busy, sink.idle);
    assert!(sink.idle > 0.5, "an idle spinner counts as idle: {sink:?}");
    running.cancel();
    assert!(running.wait().is_err(), "cancelled");
}

/// A sink chained behind an idle source still gets its timers when it asks: the source's
/// wait is cut to the sink's next timer (5 ms here), not the source's 100 ms. Checked on
/// the timeouts the runtime hands the source's `wait`, not on a clock.
#[test]
fn a_sink_behind_an_idle_source_gets_its_timers() {
    use std::time::Duration;
    use weir::operators::{Collector, Halt, Sink, Source, SourcePoll, Wake};

    /// Idle for `idle` polls (asking for 100 ms each), then one record, then the end; records
    /// the timeouts it was given to wait.
    struct Quiet {
        idle: u32,
        sent: bool,
        timeouts: Arc<Mutex<Vec<Duration>>>,
    }
    impl Source<Event> for Quiet {
        fn poll(&mut self, out: &mut dyn Collector<Event>) -> Result<SourcePoll, Halt> {
            if self.idle > 0 {
                self.idle -= 1;
                return Ok(SourcePoll::Idle(Duration::from_millis(100)));
            }
            if !self.sent {
                self.sent = true;
                out.collect(&Event { key: 1, value: 1, time_ns: 0, seq: 0 })?;
                return Ok(SourcePoll::Emitted(1));
            }
            Ok(SourcePoll::Finished)
        }
        fn wait(&mut self, _wake: &Wake<'_>, timeout: Duration) -> bool {
            self.timeouts.lock().unwrap().push(timeout);
            std::thread::sleep(timeout);
            true
        }
    }

    /// Wants its timers every 5 ms.
    struct Retrying;
    impl Sink<Event> for Retrying {
        fn write(&mut self, _: &Event) -> Result<(), Halt> {
            Ok(())
        }
        fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
            Ok(Some(Duration::from_millis(5)))
        }
    }

    let timeouts = Arc::new(Mutex::new(Vec::new()));
    let t = timeouts.clone();
    let job = Job::new("sink-timers");
    job.source("quiet", 1, move |_| Quiet { idle: 10, sent: false, timeouts: t.clone() })
        .sink("retrying", 1, |_| Retrying);
    job.run().expect("job runs");
    let timeouts = timeouts.lock().unwrap();
    assert_eq!(timeouts.len(), 10, "the source waited after each idle poll");
    assert!(
        timeouts.iter().all(|t| *t <= Duration::from_millis(5)),
        "the source's waits are cut to the sink's timer: {timeouts:?}"
    );
}

/// The name of the thread each subtask ran on, collected by a map.
fn thread_of(
    seen: &Arc<Mutex<std::collections::BTreeSet<String>>>,
) -> impl Fn(&Event) -> Event + Send + Sync + 'static {
    let seen = seen.clone();
    move |e: &Event| {
        if e.seq.is_multiple_of(1024) {
            let name = std::thread::current().name().unwrap_or("-").to_owned();
            seen.lock().unwrap().insert(name);
        }
        *e
    }
}

/// With fibers, the subtasks pinned to one CPU share its thread, and a job of more subtasks
/// than CPUs — writers out of credit waiting inside `collect` for a reader on their own
/// thread, tiny rings so that happens all the time — still delivers every record exactly
/// once, with checkpoints taken between. Every subtask ran on a `weir-cpu<n>` thread. A
/// watchdog ends the test if a hand-over is lost.
#[test]
fn fibers_deliver_every_record_exactly_once() {
    use std::time::Duration;
    const N: u64 = 300_000;
    let cpus = core_affinity::get_core_ids().map_or(0, |c| c.len());
    let dir = std::env::temp_dir().join(common::unique("weir-fibers"));
    let _remove = common::RemoveOnDrop(dir.clone());
    let chk = dir.join("chk");
    let tally = Arc::new(Tally::default());
    let seen = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let (t, s) = (tally.clone(), seen.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let job = Job::new("fibers-exact");
        job.configure(|c| {
            c.fibers = true;
            c.chaining = false;
            c.ring_slots = 8;
            c.max_record_bytes = 256;
            c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
                interval: Duration::from_millis(20),
                ..weir::checkpoint::CheckpointSettings::new(&chk)
            });
        });
        // Pinned to at most two CPUs, so they share them on any host.
        let shared: &[usize] = if cpus >= 2 { &[0, 1] } else { &[0] };
        job.source("gen", 2, |info| Generator::events(info, N, 1_000))
            .cpus(shared)
            .map("m1", thread_of(&s))
            .cpus(shared)
            .map("m2", thread_of(&s))
            .parallelism(3)
            .cpus(shared)
            .key_by("k", |e: &Event| e.key)
            .sink("count", 2, move |_| CountingSink::new(t.clone()));
        tx.send(job.run().map_err(|e| e.to_string())).unwrap()
    });
    let summary = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("watchdog: a fibered job did not end in 120 s")
        .expect("the job runs");
    assert_eq!(tally.totals(), Tally::expected(N), "every record exactly once");
    assert!(!summary.checkpoints.completed.is_empty(), "checkpoints completed: {:?}", summary.checkpoints);
    let seen = seen.lock().unwrap();
    println!("{} subtasks on {cpus} CPUs ran on threads {seen:?}", summary.subtasks.len());
    assert!(!seen.is_empty() && seen.iter().all(|n| n.starts_with("weir-cpu")), "{seen:?}");
    assert!(seen.len() <= 2, "the maps ran on at most a thread per CPU (two): {seen:?}");
}

/// A panic in one fiber fails the job with the operator's name and message, and the other
/// fibers on its thread stop with the rest of the job (within a watchdog).
#[test]
fn a_panicking_fiber_fails_the_job_and_the_others_stop() {
    use std::time::Duration;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let job = Job::new("fiber-panic");
        job.configure(|c| c.fibers = true);
        // Two subtasks on CPU 0: the generator, and ok → boom → sink chained.
        job.source("gen", 1, |info| Generator::events(info, u64::MAX, 100))
            .cpus(&[0])
            .rebalance()
            .map("ok", |e: &Event| *e)
            .cpus(&[0])
            .map("boom", |e: &Event| {
                assert!(e.seq < 5_000, "boom at record {}", e.seq);
                *e
            })
            .sink("sink", 1, |_| weir::operators::builtin::NullSink);
        tx.send(job.run().map(|_| ()).map_err(|e| e.to_string())).unwrap()
    });
    let err = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("watchdog: the other fibers did not stop")
        .expect_err("the panic fails the job");
    assert!(err.contains("boom") && err.contains("panicked") && err.contains("boom at record 5000"), "{err}");
}

/// Fibers share a CPU's thread, so they need pinning, and a busy-spinning fiber would never
/// hand its thread over: both are refused at start, saying what to change.
#[test]
fn fibers_refuse_settings_they_cannot_work_with() {
    use weir::operators::builtin::NullSink;
    for (pinning, idle, says) in [
        (false, weir::ring::IdleStrategy::default(), "pinning is off"),
        (true, weir::ring::IdleStrategy::BusySpin, "busy-spinning fiber"),
    ] {
        let job = Job::new("fiber-settings");
        job.configure(|c| {
            c.fibers = true;
            c.pinning = pinning;
            c.idle = idle;
        });
        job.source("gen", 1, |info| Generator::events(info, 10, 1)).rebalance().sink("sink", 1, |_| NullSink);
        let err = job.run().expect_err("refused").to_string();
        assert!(err.contains("fibers") && err.contains(says), "{err}");
    }
}
