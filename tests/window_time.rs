//! Time in a running job: processing-time windows fire by timer while input still flows,
//! an input that stays silent stops holding the watermark back after the idle timeout, and
//! watermarks cross a second exchange behind the results they caused.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::operators::builtin::{CollectSink, Generator, Silent};
use weir::operators::{Halt, Sink};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window, WindowResult};

/// Fails the test instead of hanging when a job does not get where it should.
fn watchdog(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "watchdog: {what} did not happen within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Counts results as they arrive (the test watches it while the job runs).
struct Arrivals {
    results: Arc<Mutex<Vec<WindowResult>>>,
}

impl Sink<WindowResult> for Arrivals {
    fn write(&mut self, r: &WindowResult) -> Result<(), Halt> {
        self.results.lock().unwrap().push(*r);
        Ok(())
    }
}

/// Processing-time tumbling windows fire from their timer while the (endless) source still
/// runs — no end of input flushes them — aligned to the wall clock.
#[test]
fn processing_time_windows_fire_by_timer() {
    let results = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("proc-time");
    job.configure(|c| c.pinning = false);
    let r = results.clone();
    job.source("gen", 1, |info| Generator::events(info, u64::MAX, 10).with_rate(20_000.0))
        .key_by("k", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_millis(50)).processing_time())
        .aggregate("w", 1, Aggregates::of(|e: &Event| e.value).count())
        .sink("out", 1, move |_| Arrivals { results: r.clone() });
    let mut running = job.start().unwrap();
    let seen = results.clone();
    watchdog("three processing-time windows firing", Duration::from_secs(30), || {
        let r = seen.lock().unwrap();
        let mut starts: Vec<u64> = r.iter().map(|x| x.start_ns).collect();
        starts.dedup();
        starts.len() >= 3
    });
    running.cancel();
    let _ = running.wait();
    let r = results.lock().unwrap();
    for x in r.iter() {
        assert_eq!(x.end_ns - x.start_ns, 50_000_000, "{x:?}");
        assert_eq!(x.start_ns % 50_000_000, 0, "aligned to the clock: {x:?}");
        assert!(x.count > 0 && x.late == 0);
    }
}

/// A processing-time job that ends fires its last windows at the end: every record counted
/// exactly once.
#[test]
fn processing_time_windows_count_every_record() {
    const N: u64 = 200_000;
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("proc-time-exact");
    job.configure(|c| c.pinning = false);
    let o = out.clone();
    job.source("gen", 2, |info| Generator::events(info, N, 1_000))
        .key_by("k", |e: &Event| e.key)
        .window(Window::sliding(Duration::from_millis(20), Duration::from_millis(20)).processing_time())
        .aggregate("w", 2, Aggregates::of(|e: &Event| e.value).count().sum())
        .sink("out", 1, move |_| CollectSink::new(o.clone()));
    let summary = job.run().unwrap();
    let r = out.lock().unwrap();
    assert_eq!(r.iter().map(|x| x.count).sum::<u64>(), N);
    assert_eq!(r.iter().map(|x| x.sum).sum::<u64>(), (0..N).map(|s| s % 100 + 1).sum::<u64>());
    assert_eq!(summary.node("w").unwrap().late_records, 0, "processing time is never late");
}

/// Two inputs, one silent for good (it never sends a record or a watermark): with an idle
/// timeout, the silent channel steps aside and event-time windows fire while the job runs.
#[test]
fn a_silent_input_stops_holding_the_watermark_back() {
    let results = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("idle-input");
    job.configure(|c| {
        c.pinning = false;
        c.watermark_idle_timeout = Some(Duration::from_millis(200));
    });
    // 10k events per second, 10 us of event time each: a 10 ms window closes every 100 ms.
    let busy = job.source("busy", 1, |info| Generator::events(info, u64::MAX, 50).with_rate(10_000.0)).with_event_time(
        "ts",
        |e: &Event| e.time_ns * 10,
        WatermarkStrategy::bounded(Duration::ZERO).every_records(Some(16)),
    );
    let quiet = job.source("quiet", 1, |_| Silent);
    let r = results.clone();
    busy.union(&quiet)
        .key_by("k", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_millis(10)))
        .timestamps(|e: &Event| e.time_ns * 10)
        .aggregate("w", 1, Aggregates::of(|e: &Event| e.value).count())
        .sink("out", 1, move |_| Arrivals { results: r.clone() });
    let mut running = job.start().unwrap();
    let seen = results.clone();
    watchdog("windows firing past a silent input", Duration::from_secs(30), || {
        let r = seen.lock().unwrap();
        r.iter().map(|x| x.end_ns).collect::<BTreeSet<_>>().len() >= 3
    });
    running.cancel();
    let _ = running.wait();
    assert!(results.lock().unwrap().iter().all(|x| x.late == 0 && x.count > 0));
}

/// Two window stages: the second aggregates the first's results by their window end, with
/// no watermark assigner of its own — its event time advances only by the watermarks the
/// first stage forwards, after the results each one caused. So no result is late there, and
/// the second stage's sums add up to every event.
#[test]
fn watermarks_follow_results_across_stages() {
    const N: u64 = 400_000;
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("two-stages");
    job.configure(|c| c.pinning = false);
    let o = out.clone();
    job.source("gen", 2, |info| Generator::events(info, N, 300).with_time_jitter(3_000))
        .with_event_time(
            "ts",
            |e: &Event| e.time_ns,
            WatermarkStrategy::bounded(Duration::from_micros(3)).every_records(Some(64)),
        )
        .key_by("k", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_micros(500)))
        .aggregate("per_key", 2, Aggregates::of(|e: &Event| e.value).count())
        .key_by("all", |r: &WindowResult| r.key % 7)
        .window(Window::tumbling(Duration::from_millis(5)))
        .timestamps(|r: &WindowResult| r.end_ns - 1)
        .aggregate("per_5ms", 2, Aggregates::of(|r: &WindowResult| r.count).count().sum())
        .sink("out", 1, move |_| CollectSink::new(o.clone()));
    let summary = job.run().unwrap();
    assert_eq!(summary.node("per_key").unwrap().late_records, 0, "within the bound: nothing late");
    assert_eq!(summary.node("per_5ms").unwrap().late_records, 0, "results came before their watermark");
    let results = out.lock().unwrap();
    assert_eq!(results.iter().map(|r| r.sum).sum::<u64>(), N, "every event, once");
    assert_eq!(
        results.iter().map(|r| r.count).sum::<u64>(),
        summary.node("per_key").unwrap().records_out,
        "every first-stage result, once"
    );
    assert!(results.iter().filter(|r| r.late == 0).count() > 10, "the second stage fired as the job ran");
}

/// Late records as a side output (`aggregate_with_late`): events up to 5 ms out of order
/// under a watermark that allows 1 ms, so some come after their window closed. Every event
/// is either counted in a window result or in the late stream, once; the late stream holds
/// exactly as many as the node counted late (more than none), each behind its window.
#[test]
fn late_records_go_to_their_own_stream() {
    const N: u64 = 200_000;
    let (results, late) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let job = Job::new("late-output");
    job.configure(|c| c.pinning = false);
    let (r, l) = (results.clone(), late.clone());
    let (counted, dropped) = job
        .source("gen", 1, |info| Generator::events(info, N, 50).with_time_jitter(5_000_000))
        .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_millis(1)))
        .key_by("k", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_millis(10)))
        .aggregate_with_late("w", 2, Aggregates::of(|e: &Event| e.value).count());
    counted.sink("out", 1, move |_| CollectSink::<WindowResult>::new(r.clone()));
    dropped.sink("late", 1, move |_| CollectSink::<Event>::new(l.clone()));
    let summary = job.run().unwrap();
    let late = late.lock().unwrap();
    let late_records = summary.node("w").unwrap().late_records;
    assert!(late_records > 0, "the jitter makes some records late");
    assert_eq!(late.len() as u64, late_records, "the late stream holds what was counted late");
    let in_windows: u64 = results.lock().unwrap().iter().map(|r| r.count).sum();
    assert_eq!(in_windows + late_records, N, "every event counted once: in a window or late");
    let seqs: BTreeSet<u64> = late.iter().map(|e| e.seq).collect();
    assert_eq!(seqs.len(), late.len(), "each late record once");
}
