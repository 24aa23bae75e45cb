//! What a user's keyed operator can do besides `process`: processing-time timers that fire
//! while no record comes, and side outputs (an operator's second typed output, and a map's
//! dead letters) as streams of their own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::operators::builtin::{CollectSink, Generator};
use weir::operators::timers::EventTimers;
use weir::operators::{Collector, Halt, KeyedProcess, Source, SourcePoll};
use weir::record::{Either, Event};

/// Emits `n` events, then nothing until `done` is set (or a 60 s watchdog runs out), then
/// ends: the job can only end well if something fires while no record comes.
struct WaitingSource {
    n: u64,
    sent: u64,
    done: Arc<AtomicBool>,
    since: Option<Instant>,
    /// Set if the watchdog, not `done`, ended it.
    gave_up: Arc<AtomicBool>,
}

impl Source<Event> for WaitingSource {
    fn poll(&mut self, out: &mut dyn Collector<Event>) -> Result<SourcePoll, Halt> {
        if self.sent < self.n {
            out.collect(&Event { key: self.sent % 3, value: 1, time_ns: self.sent, seq: self.sent })?;
            self.sent += 1;
            return Ok(SourcePoll::Emitted(1));
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if self.done.load(Ordering::Acquire) {
            return Ok(SourcePoll::Finished);
        }
        if since.elapsed() > Duration::from_secs(60) {
            self.gave_up.store(true, Ordering::Release);
            return Ok(SourcePoll::Finished);
        }
        Ok(SourcePoll::Idle(Duration::from_millis(5)))
    }
}

/// Per key, a processing-time timer 20 ms after its first record; when it fires, the key is
/// emitted (its count of records so far).
#[derive(Default)]
struct Reminder {
    timers: EventTimers<u64>,
    counts: std::collections::HashMap<u64, u64>,
}

impl KeyedProcess<Event, (u64, u64)> for Reminder {
    fn process(
        &mut self,
        e: &Event,
        _kg: u32,
        _out: &mut dyn FnMut(&(u64, u64)) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        let c = self.counts.entry(e.key).or_default();
        if *c == 0 {
            self.timers.register(e.key, weir::time::now_ns() + 20_000_000);
        }
        *c += 1;
        Ok(())
    }
    fn processing_timers(&self) -> bool {
        true
    }
    fn on_processing_time(
        &mut self,
        now_ns: u64,
        out: &mut dyn FnMut(&(u64, u64)) -> Result<(), Halt>,
    ) -> Result<Option<u64>, Halt> {
        while let Some((_, key)) = self.timers.pop_due(now_ns + 1) {
            out(&(key, self.counts[&key]))?;
        }
        Ok(self.timers.next_time())
    }
}

/// Sets `done` once it has seen `want` records.
struct Watch {
    seen: Arc<Mutex<Vec<(u64, u64)>>>,
    want: usize,
    done: Arc<AtomicBool>,
}

impl weir::operators::Sink<(u64, u64)> for Watch {
    fn write(&mut self, r: &(u64, u64)) -> Result<(), Halt> {
        let mut seen = self.seen.lock().unwrap();
        seen.push(*r);
        if seen.len() >= self.want {
            self.done.store(true, Ordering::Release);
        }
        Ok(())
    }
}

/// Processing-time timers fire in the subtask's loop while no record comes: the source
/// waits, after its last record, for the timers' output, and the job ends only once every
/// key's timer fired (each once, with every record of its key counted).
#[test]
fn processing_time_timers_fire_without_input() {
    let (done, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
    let job = Job::new("reminders");
    job.configure(|c| c.pinning = false);
    let (d, gave_up) = (done.clone(), Arc::new(AtomicBool::new(false)));
    let (s, d2, g) = (seen.clone(), done.clone(), gave_up.clone());
    job.source("events", 1, move |_| WaitingSource {
        n: 30,
        sent: 0,
        done: d.clone(),
        since: None,
        gave_up: g.clone(),
    })
    .key_by("k", |e: &Event| e.key)
    .process("remind", 2, |_| Reminder::default())
    .sink("out", 1, move |_| Watch { seen: s.clone(), want: 3, done: d2.clone() });
    job.run().expect("the job runs");
    assert!(!gave_up.load(Ordering::Acquire), "the timers fired while the source waited (its watchdog did not end it)");
    let mut got = seen.lock().unwrap().clone();
    got.sort_unstable();
    assert_eq!(got, vec![(0, 10), (1, 10), (2, 10)], "one reminder per key, after all its records");
}

/// Flags records whose value is 90 or more on a side output, passes the rest on.
struct Alerts;

impl KeyedProcess<Event, Either<Event, String>> for Alerts {
    fn process(
        &mut self,
        e: &Event,
        kg: u32,
        out: &mut dyn FnMut(&Either<Event, String>) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        if e.value >= 90 {
            out(&Either::Right(format!("seq {} value {} key group {kg}", e.seq, e.value)))
        } else {
            out(&Either::Left(*e))
        }
    }
}

/// A keyed operator's side output and a map's dead letters are streams of their own, and
/// every record lands in exactly one of the two.
#[test]
fn side_outputs_are_streams_of_their_own() {
    const N: u64 = 20_000;
    let (main, side) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let (ok, dead) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let job = Job::new("side-outputs");
    job.configure(|c| c.pinning = false);
    let events = job.source("events", 1, |i| Generator::events(i, N, 100));
    let (kept, alerts) =
        events.key_by("k", |e: &Event| e.key).process("alerts", 2, |_| Alerts).split("kept", "alerted");
    let (m, s) = (main.clone(), side.clone());
    kept.sink("main", 1, move |_| CollectSink::new(m.clone()));
    alerts.sink("side", 1, move |_| CollectSink::new(s.clone()));
    let (parsed, letters) = events.try_map("parse", |e: &Event| {
        if e.seq.is_multiple_of(7) { Err(format!("seq {} is a multiple of 7", e.seq)) } else { Ok(e.seq) }
    });
    let (o, d) = (ok.clone(), dead.clone());
    parsed.sink("parsed", 1, move |_| CollectSink::new(o.clone()));
    letters.sink("dead", 1, move |_| CollectSink::new(d.clone()));
    job.run().expect("the job runs");

    // Generator::events: value = seq % 100 + 1, so values 90..=100 are seq % 100 in 89..=99.
    let alerted = (0..N).filter(|s| s % 100 >= 89).count();
    let mut main_seqs: Vec<u64> = main.lock().unwrap().iter().map(|e: &Event| e.seq).collect();
    main_seqs.sort_unstable();
    assert_eq!(main_seqs, (0..N).filter(|s| s % 100 < 89).collect::<Vec<_>>(), "the main output");
    let side = side.lock().unwrap();
    assert_eq!(side.len(), alerted, "the side output");
    assert!(side.iter().all(|a: &String| a.contains("key group")), "alerts carry what the operator put in them");
    let mut parsed: Vec<u64> = ok.lock().unwrap().clone();
    parsed.sort_unstable();
    assert_eq!(parsed, (0..N).filter(|s| s % 7 != 0).collect::<Vec<_>>(), "what parsed");
    let dead = dead.lock().unwrap();
    assert_eq!(dead.len(), (0..N).filter(|s| s % 7 == 0).count(), "the dead letters");
    assert!(dead.iter().all(|d: &String| d.ends_with("is a multiple of 7")), "{:?}", dead.first());
}
