//! Non-keyed windows in two phases (`Stream::window_all`): per-subtask partials chained
//! after the sources, one result per window from the keyed final phase — exact against the
//! generator's formulas, for tumbling and sliding windows at several parallelisms, and
//! across cancels and restores at another parallelism with an exactly-once sink.

mod common;

use common::counting::{committed, compare, run_until_checkpoints, temp_dir};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::{FileSink, FileSinkConfig};
use weir::operators::builtin::Generator;
use weir::operators::{Halt, Sink};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window, WindowResult};

const N: u64 = 50_000;
/// The generator's event time is `seq × 1000` ns: 1,000 records per 1 ms window.
const MS: u64 = 1_000_000;

/// (window start) → (count, sum) over every record, for windows of `size` every `slide`.
fn expected(n: u64, size: u64, slide: u64) -> BTreeMap<(u64, u64), (u64, u64)> {
    let mut m = BTreeMap::new();
    for seq in 0..n {
        let t = seq * 1_000;
        let mut start = t - t % slide;
        loop {
            if start + size <= t {
                break;
            }
            let e = m.entry((0, start)).or_insert((0, 0));
            e.0 += 1;
            e.1 += seq % 100 + 1;
            if start < slide {
                break;
            }
            start -= slide;
        }
    }
    m
}

struct Collect(Arc<Mutex<Vec<WindowResult>>>);

impl Sink<WindowResult> for Collect {
    fn write(&mut self, r: &WindowResult) -> Result<(), Halt> {
        self.0.lock().unwrap().push(*r);
        Ok(())
    }
}

fn run_collect(sources: u32, final_p: u32, window: Window) -> BTreeMap<(u64, u64), (u64, u64)> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = out.clone();
    let job = Job::new("window-all");
    job.configure(|c| c.pinning = false);
    job.source("gen", sources, |info| Generator::events(info, N, 1_000))
        .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO))
        .window_all(window)
        .aggregate("total", final_p, Aggregates::of(|e: &Event| e.value).count().sum())
        .sink("out", 1, move |_| Collect(sink.clone()));
    let summary = job.run().unwrap();
    assert_eq!(summary.node("total-partial").map_or(0, |n| n.late_records), 0, "no late records");
    let mut got = BTreeMap::new();
    for r in out.lock().unwrap().iter() {
        assert_eq!(r.end_ns - r.start_ns, window_size(window), "window bounds");
        assert!(got.insert((r.key, r.start_ns), (r.count, r.sum)).is_none(), "window {} twice", r.start_ns);
    }
    got
}

fn window_size(w: Window) -> u64 {
    match w.kind {
        weir::window::WindowKind::Tumbling { size } | weir::window::WindowKind::Sliding { size, .. } => {
            size.as_nanos() as u64
        }
        weir::window::WindowKind::Session { .. } => unreachable!(),
    }
}

#[test]
fn tumbling_windows_over_every_record_are_exact() {
    for (sources, final_p) in [(1, 1), (3, 1), (3, 2)] {
        let got = run_collect(sources, final_p, Window::tumbling(Duration::from_millis(1)));
        assert_eq!(got, expected(N, MS, MS), "{sources} sources, final phase at {final_p}");
    }
}

#[test]
fn sliding_windows_over_every_record_are_exact() {
    let got = run_collect(2, 2, Window::sliding(Duration::from_millis(3), Duration::from_millis(1)));
    assert_eq!(got, expected(N, 3 * MS, MS));
}

/// A session window, a processing-time window or a stream without event time is refused
/// when the job is built, naming the node and what to do.
#[test]
fn what_window_all_cannot_do_is_refused() {
    let cases: [(Window, bool, &str); 3] = [
        (Window::session(Duration::from_millis(1)), true, "a session is per key"),
        (Window::tumbling(Duration::from_millis(1)).processing_time(), true, "follows event time"),
        (Window::tumbling(Duration::from_millis(1)), false, "needs an event time"),
    ];
    for (window, timed, words) in cases {
        let job = Job::new("window-all-refused");
        let source = job.source("gen", 1, |info| Generator::events(info, 10, 1));
        let stream = if timed {
            source.with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO))
        } else {
            source
        };
        stream.window_all(window).aggregate("total", 1, Aggregates::of(|e: &Event| e.value).count()).sink(
            "out",
            1,
            |_| weir::operators::builtin::NullSink,
        );
        let e = job.start().unwrap_err().to_string();
        assert!(e.contains("total") && e.contains(words), "{e}");
    }
}

fn checkpointed(dir: &Path, final_p: u32, rate: Option<f64>) -> Job {
    let job = Job::new("window-all-cp");
    let (chk, out) = (dir.join("chk"), dir.join("out"));
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.checkpoints = Some(CheckpointSettings {
            interval: Duration::from_millis(30),
            timeout: Duration::from_secs(20),
            ..CheckpointSettings::new(&chk)
        });
    });
    job.source("gen", 2, move |info| {
        let g = Generator::events(info, N, 1_000);
        match rate {
            Some(r) => g.with_rate(r),
            None => g,
        }
    })
    .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO))
    .window_all(Window::tumbling(Duration::from_millis(1)))
    .aggregate("total", final_p, Aggregates::of(|e: &Event| e.value).count().sum())
    .sink("out", 1, move |info| FileSink::new(FileSinkConfig::new(&out), info));
    job
}

/// Cancelled after three checkpoints and restored, the final phase at 1 → 2 → 3 → 1 (its
/// open windows move with their key groups; the partial phase keeps nothing across a
/// checkpoint): the committed windows are exact, each once.
#[test]
fn restores_at_another_parallelism_are_exact() {
    let dir = temp_dir("window-all-rescale");
    let steps = [1, 2, 3];
    for (i, &p) in steps.iter().enumerate() {
        let restored = run_until_checkpoints(checkpointed(&dir, p, Some(15_000.0)), 3);
        assert_eq!(restored.is_some(), i > 0, "at {p}: restored");
    }
    checkpointed(&dir, 1, None).run().unwrap();
    compare(&committed(&dir.join("out")).unwrap(), &expected(N, MS, MS));
    std::fs::remove_dir_all(&dir).unwrap();
}
