//! Windows through the real engine give exactly what a simple reference model gives.
//!
//! Each case is a random event stream: keys, values, and event times that run out of order
//! within the watermark bound, plus some records far behind it (late, or within allowed
//! lateness). It runs through a whole job — source, watermark assigner, hash exchange into 1
//! or 2 window subtasks, sink — with watermarks emitted every `k` records (no timer), so the
//! interleaving of records and watermarks each window sees is fixed by the stream. The
//! reference model replays the same stream window by window with plain maps (no panes, no
//! cache, no store, no chunks) and Flink's rules; results (including late re-firings) and
//! the late-record count must be equal. Small caches with many keys make the operator evict
//! to its store (RocksDB or the heap) and fire from it.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::graph::{Job, StateBackendKind};
use weir::operators::builtin::{CollectSink, Generator};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, MIN_CACHE_BYTES, Window, WindowResult};

#[derive(Debug, Clone, Copy)]
enum Shape {
    Tumbling { size: u64 },
    Sliding { size: u64, slide: u64 },
    Session { gap: u64 },
}

#[derive(Debug, Clone)]
struct Case {
    events: Vec<Event>,
    /// Evicted state in RocksDB (else in the heap).
    rocksdb: bool,
    bound: u64,
    every: u64,
    lateness: u64,
    parallelism: u32,
    cache_bytes: u64,
}

/// A result as compared: everything but the mean (checked separately against sum / count).
type Row = (u64, u64, u64, u32, u64, u64, u64, u64);

fn row(r: &WindowResult) -> Row {
    (r.key, r.start_ns, r.end_ns, r.late, r.count, r.sum, r.min, r.max)
}

fn run_engine(case: &Case, shape: Shape) -> (Vec<Row>, u64) {
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("window-prop");
    job.configure(|c| {
        c.pinning = false;
        c.state.backend = if case.rocksdb { StateBackendKind::RocksDb } else { StateBackendKind::Memory };
    });
    let events = Arc::new(case.events.clone());
    let n = events.len() as u64;
    let strategy =
        WatermarkStrategy::bounded(Duration::from_nanos(case.bound)).every_records(Some(case.every)).interval(None);
    let window = match shape {
        Shape::Tumbling { size } => Window::tumbling(Duration::from_nanos(size)),
        Shape::Sliding { size, slide } => Window::sliding(Duration::from_nanos(size), Duration::from_nanos(slide)),
        Shape::Session { gap } => Window::session(Duration::from_nanos(gap)),
    };
    let o = out.clone();
    job.source("events", 1, move |info| {
        let events = events.clone();
        Generator::new(info, Some(n), move |seq| events[seq as usize])
    })
    .with_event_time("ts", |e: &Event| e.time_ns, strategy)
    .key_by("by_key", |e: &Event| e.key)
    .window(window)
    .allowed_lateness(Duration::from_nanos(case.lateness))
    .cache_bytes(case.cache_bytes)
    .aggregate("w", case.parallelism, Aggregates::of(|e: &Event| e.value).count().sum().min().max().mean())
    .sink("out", 1, move |_| CollectSink::new(o.clone()));
    let summary = job.run().expect("the job runs");
    let results = out.lock().unwrap().clone();
    for r in &results {
        assert_eq!(r.mean, r.sum as f64 / r.count as f64, "mean of {r:?}");
    }
    let mut rows: Vec<Row> = results.iter().map(row).collect();
    rows.sort_unstable();
    (rows, summary.node("w").unwrap().late_records)
}

/// Accumulated values of one window in the model.
#[derive(Debug, Clone, Copy)]
struct Acc {
    count: u64,
    sum: u64,
    min: u64,
    max: u64,
}

impl Acc {
    fn new() -> Acc {
        Acc { count: 0, sum: 0, min: u64::MAX, max: 0 }
    }
    fn add(&mut self, v: u64) {
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
    fn merge(&mut self, o: &Acc) {
        self.count += o.count;
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }
}

/// The reference: windows as a map from (key, start) to (end, values); Flink's rules.
struct Model {
    shape: Shape,
    lateness: u64,
    w: u64,
    windows: BTreeMap<(u64, u64), (u64, Acc)>,
    out: Vec<Row>,
    late: u64,
}

impl Model {
    fn emit(&mut self, key: u64, start: u64, end: u64, acc: Acc, late: bool) {
        self.out.push((key, start, end, late as u32, acc.count, acc.sum, acc.min, acc.max));
    }

    fn record(&mut self, e: &Event) {
        let (t, w, l) = (e.time_ns, self.w, self.lateness);
        match self.shape {
            Shape::Tumbling { size } => self.aligned(e, size, size),
            Shape::Sliding { size, slide } => self.aligned(e, size, slide),
            Shape::Session { gap } => {
                let (mut start, mut end) = (t, t + gap);
                let touching: Vec<(u64, u64)> = self
                    .windows
                    .iter()
                    .filter(|((k, s), (en, _))| *k == e.key && *s <= end && *en >= start)
                    .map(|((k, s), _)| (*k, *s))
                    .collect();
                if touching.is_empty() && end + l <= w {
                    self.late += 1;
                    return;
                }
                let mut acc = Acc::new();
                for k in touching {
                    let (en, a) = self.windows.remove(&k).unwrap();
                    start = start.min(k.1);
                    end = end.max(en);
                    acc.merge(&a);
                }
                acc.add(e.value);
                self.windows.insert((e.key, start), (end, acc));
                if end <= w {
                    self.emit(e.key, start, end, acc, true);
                }
            }
        }
    }

    fn aligned(&mut self, e: &Event, size: u64, slide: u64) {
        let (t, w, l) = (e.time_ns, self.w, self.lateness);
        let mut accepted = false;
        let mut s = t - t % slide;
        loop {
            let end = s + size;
            if end + l > w {
                accepted = true;
                let entry = self.windows.entry((e.key, s)).or_insert((end, Acc::new()));
                entry.1.add(e.value);
                let acc = entry.1;
                if end <= w {
                    self.emit(e.key, s, end, acc, true);
                }
            }
            if s < slide || s - slide + size <= t {
                break;
            }
            s -= slide;
        }
        if !accepted {
            self.late += 1;
        }
    }

    fn watermark(&mut self, nw: u64) {
        let old = self.w;
        let due: Vec<_> =
            self.windows.iter().filter(|(_, (end, _))| *end > old && *end <= nw).map(|(k, v)| (*k, *v)).collect();
        for ((key, start), (end, acc)) in due {
            self.emit(key, start, end, acc, false);
        }
        let l = self.lateness;
        self.windows.retain(|_, (end, _)| end.saturating_add(l) > nw);
        self.w = nw;
    }
}

fn reference(case: &Case, shape: Shape) -> (Vec<Row>, u64) {
    let mut m = Model { shape, lateness: case.lateness, w: 0, windows: BTreeMap::new(), out: Vec::new(), late: 0 };
    // The assigner: after every `every` records, max seen − bound, if it advanced.
    let (mut max, mut since, mut emitted) = (0u64, 0u64, 0u64);
    for e in &case.events {
        m.record(e);
        max = max.max(e.time_ns);
        since += 1;
        if since >= case.every {
            since = 0;
            let w = max.saturating_sub(case.bound);
            if w > emitted {
                emitted = w;
                m.watermark(w);
            }
        }
    }
    m.watermark(u64::MAX);
    m.out.sort_unstable();
    (m.out, m.late)
}

/// Event streams: a clock that moves forward by random steps; each event is behind it by at
/// most `bound` (on time), or, one in `late_one_in`, by up to `bound + far` (maybe late).
fn case() -> impl Strategy<Value = Case> {
    (
        1usize..300,
        prop_oneof![Just(4u64), Just(40), Just(3000)],
        0u64..30,
        1u64..12,
        prop_oneof![Just(0u64), 0u64..40],
        1u32..=2,
        any::<bool>(),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(n, keys, bound, every, lateness, parallelism, small_cache, seed, rocksdb)| {
            let mut rng = seed | 1;
            let mut next = move |m: u64| {
                // xorshift64*: enough randomness for times and keys, reproducible by seed.
                rng ^= rng >> 12;
                rng ^= rng << 25;
                rng ^= rng >> 27;
                rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % m.max(1)
            };
            // Many keys need many events to reach them, and a slow clock to be live at once
            // (so the cache fills and evicts to the store).
            let many = keys > 1000;
            let n = if many { n * 10 } else { n };
            let mut clock = 1_000u64;
            let events = (0..n as u64)
                .map(|seq| {
                    if !many || next(30) == 0 {
                        clock += next(6);
                    }
                    let behind = if next(8) == 0 { bound + next(60) } else { next(bound + 1) };
                    Event { key: next(keys), value: next(100) + 1, time_ns: clock - behind, seq }
                })
                .collect();
            Case {
                events,
                rocksdb,
                bound,
                every,
                lateness,
                parallelism,
                cache_bytes: if small_cache { MIN_CACHE_BYTES } else { 8 << 20 },
            }
        })
}

fn check(case: &Case, shape: Shape) -> Result<(), TestCaseError> {
    let (got, got_late) = run_engine(case, shape);
    let (want, want_late) = reference(case, shape);
    prop_assert_eq!(got_late, want_late, "late records");
    prop_assert_eq!(got.len(), want.len(), "result count");
    prop_assert_eq!(got, want);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Tumbling windows: exact results and late count.
    #[test]
    fn tumbling_matches_the_model(case in case(), size in 1u64..60) {
        check(&case, Shape::Tumbling { size })?;
    }

    /// Sliding windows (panes of gcd(size, slide)): exact results and late count.
    #[test]
    fn sliding_matches_the_model(case in case(), slide in 1u64..25, extra in 0u64..50) {
        check(&case, Shape::Sliding { size: slide + extra, slide })?;
    }

    /// Session windows (merging, late merges within lateness): exact results and late count.
    #[test]
    fn session_matches_the_model(case in case(), gap in 1u64..40) {
        check(&case, Shape::Session { gap })?;
    }
}

/// A hand-made stream with a known answer, so the model itself is checked: tumbling windows
/// of 10 with bound 0, watermark after every record, lateness 5.
#[test]
fn the_model_agrees_with_a_hand_count() {
    let ev = |key, time_ns, seq| Event { key, value: 1, time_ns, seq };
    let case = Case {
        events: vec![ev(1, 1, 0), ev(1, 12, 1), ev(1, 5, 2), ev(1, 25, 3), ev(1, 8, 4), ev(1, 14, 5)],
        rocksdb: false,
        bound: 0,
        every: 1,
        lateness: 5,
        parallelism: 1,
        cache_bytes: 8 << 20,
    };
    // w after each record: 1, 12, 12, 25, 25, 25.
    // [0,10) fires at w=12 with 1 record; t=5 arrives in lateness (10+5 > 12): late re-fire with 2;
    // w=25 fires [10,20) with 1 (t=12) and drops [0,10) (15 <= 25); t=8 is late (counted);
    // t=14 finds [10,20) expired too (20 + 5 <= 25): late; [20,30) fires at the end.
    let (want, late) = reference(&case, Shape::Tumbling { size: 10 });
    assert_eq!(late, 2);
    let counts: Vec<(u64, u32, u64)> = want.iter().map(|r| (r.1, r.3, r.4)).collect();
    assert_eq!(counts, vec![(0, 0, 1), (0, 1, 2), (10, 0, 1), (20, 0, 1)]);
    assert_eq!(run_engine(&case, Shape::Tumbling { size: 10 }), (want, late));
}
