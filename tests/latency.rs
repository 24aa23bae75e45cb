//! End-to-end latency: sources send latency markers behind their records, every sink times
//! them once its destination has acknowledged what came before them, into the counters
//! that weir-stat, weir top and Prometheus read. (Lower bounds only: a figure can be made
//! longer by a loaded machine, never shorter than what the job waits on purpose.)

mod common;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weir::graph::Job;
use weir::operators::builtin::{CountingSink, Generator, Tally};
use weir::operators::{Halt, Sink};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window, WindowResult};

fn wall_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_nanos() as u64
}

/// A sink whose destination acknowledges each record `delay` after it was written (an
/// asynchronous client: the write returns at once).
struct DelayedAck {
    inner: CountingSink,
    delay: Duration,
    written: VecDeque<Instant>,
    acked: u64,
}

impl DelayedAck {
    fn settle(&mut self) {
        while self.written.front().is_some_and(|t| t.elapsed() >= self.delay) {
            self.written.pop_front();
            self.acked += 1;
        }
    }
}

impl Sink<Event> for DelayedAck {
    fn write(&mut self, e: &Event) -> Result<(), Halt> {
        self.written.push_back(Instant::now());
        self.settle();
        Sink::<Event>::write(&mut self.inner, e)
    }
    fn finish(&mut self) -> Result<(), Halt> {
        // The destination drains what is outstanding before the sink is done.
        while !self.written.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
            self.settle();
        }
        Sink::<Event>::finish(&mut self.inner)
    }
    fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
        self.settle();
        Ok(self.written.front().map(|_| Duration::from_millis(1)))
    }
    fn acknowledged(&self) -> Option<u64> {
        Some(self.acked)
    }
}

/// generator (20,000 records/s, event time = the wall clock) → map → a sink whose
/// destination acknowledges each record 20 ms after it was written: markers are timed at
/// the acknowledgement, so ingest → acknowledged and event time → acknowledged are at least
/// 20 ms at every quantile, the markers reach the sink through the ring, and the counters
/// say so while the job runs. Nothing is lost to them.
#[test]
fn a_sink_times_markers_when_its_destination_acknowledges() {
    const N: u64 = 30_000;
    let delay = Duration::from_millis(20);
    let tally = Arc::new(Tally::default());
    let job = Job::new("latency-acks");
    job.configure(|c| {
        c.chaining = false;
        c.pinning = false;
    });
    let t = tally.clone();
    job.source("gen", 1, |info| {
        Generator::new(info, Some(N), |seq| Event { key: seq % 16, value: seq % 100 + 1, time_ns: wall_ns(), seq })
            .with_rate(20_000.0)
    })
    .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO))
    .map("map", |e: &Event| *e)
    .sink("sink", 1, move |_| DelayedAck {
        inner: CountingSink::new(t.clone()),
        delay,
        written: VecDeque::new(),
        acked: 0,
    });
    let seen = common::latencies_while_running(&job);
    assert_eq!(tally.totals(), Tally::expected(N), "every record exactly once");
    let last = seen.last().expect("the sink timed latency markers while the job ran");
    assert_eq!(last.owner, "sink#0");
    let floor = delay.as_micros() as u64;
    for l in &seen {
        // Since the start: p50, p99, p99.9, max, of ingest and of event time.
        for (what, q) in [("ingest", &l.ingest[4..]), ("event time", &l.event[4..])] {
            assert!(
                q.iter().all(|&us| us >= floor),
                "{what} to acknowledged below the 20 ms the destination takes: {l:?}"
            );
        }
    }
    println!(
        "{} markers timed; ingest → acknowledged since the start p50 {} µs, p99 {} µs, max {} µs (the destination takes 20 ms)",
        last.markers, last.ingest[4], last.ingest[5], last.ingest[7]
    );
}

/// A window's results carry their own markers: event time (the window's end) to
/// acknowledged at a sink after a 200 ms tumbling window with 100 ms of allowed disorder is
/// at least those 100 ms (a window fires when the watermark, 100 ms behind the newest event
/// time, passes its end). With `latency_interval` off, no marker is sent or timed.
#[test]
fn a_sink_after_a_window_times_its_results_and_markers_can_be_off() {
    for markers_on in [true, false] {
        let job = Job::new(if markers_on { "latency-window" } else { "latency-off" });
        job.configure(|c| {
            c.chaining = false;
            c.pinning = false;
            if !markers_on {
                c.latency_interval = None;
            }
        });
        let bound = Duration::from_millis(100);
        job.source("gen", 1, |info| {
            Generator::new(info, Some(40_000), |seq| Event { key: seq % 8, value: 1, time_ns: wall_ns(), seq })
                .with_rate(20_000.0)
        })
        .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(bound))
        .key_by("k", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_millis(200)))
        .timestamps(|e: &Event| e.time_ns)
        .aggregate("w", 1, Aggregates::of(|e: &Event| e.value).count())
        .sink("out", 1, |_| Discard);
        let seen = common::latencies_while_running(&job);
        if !markers_on {
            assert!(seen.is_empty(), "markers were timed with latency_interval off: {seen:?}");
            continue;
        }
        let last = seen.last().expect("the sink after the window timed markers");
        for l in &seen {
            assert!(
                l.event[4..].iter().all(|&us| us >= bound.as_micros() as u64),
                "window end to acknowledged below the watermark's 100 ms delay: {l:?}"
            );
        }
        println!(
            "{} markers after the window; window end → acknowledged since the start p50 {} µs, p99 {} µs, max {} µs",
            last.markers, last.event[4], last.event[5], last.event[7]
        );
    }
}

/// A sink that drops what it gets (its write is its acknowledgement).
struct Discard;

impl Sink<WindowResult> for Discard {
    fn write(&mut self, _: &WindowResult) -> Result<(), Halt> {
        Ok(())
    }
}
