//! Keyed windows: tumbling, sliding and session windows over event time or processing time,
//! with built-in aggregations (count, sum, min, max, mean) or a user fold.
//!
//! ```no_run
//! use std::time::Duration;
//! use weir::graph::Job;
//! use weir::operators::builtin::{Generator, NullSink};
//! use weir::record::Event;
//! use weir::time::WatermarkStrategy;
//! use weir::window::{Aggregates, Window, WindowResult};
//!
//! let job = Job::new("clicks");
//! job.source("gen", 1, |info| Generator::events(info, 10_000_000, 10_000))
//!     .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_millis(10)))
//!     .key_by("by_user", |e: &Event| e.key)
//!     .window(Window::tumbling(Duration::from_secs(1)))
//!     .allowed_lateness(Duration::from_millis(500))
//!     .aggregate("per_second", 2, Aggregates::of(|e: &Event| e.value).count().sum())
//!     .sink("out", 1, |_| NullSink);
//! job.run().expect("job runs");
//! ```
//!
//! # When results come, and late records
//!
//! As Flink's event-time windows with `EventTimeTrigger`: a window `[start, end)` fires when
//! the watermark reaches `end` (see [`crate::time`] for what a watermark says). With allowed
//! lateness `L`, a window's state is kept until the watermark reaches `end + L`; a record that
//! arrives meanwhile updates the window and fires it again at once (the result has
//! `late = 1` and replaces the earlier one). A record whose windows are all past `end + L`
//! is *late*: it is dropped and counted (the node's `late records` counter in the counters
//! file, and [`NodeSummary::late_records`](crate::runtime::NodeSummary::late_records)), and
//! handed to the [`WindowedStream::on_late`] callback if one is set — the side output.
//!
//! Session windows merge as Flink's: two sessions merge when they touch (`a.end >= b.start`).
//!
//! # Sliding windows in panes
//!
//! A sliding window of `size` every `slide` is kept as *panes* of `gcd(size, slide)`: a
//! record updates one pane, not `size / slide` windows, and a window's result merges its
//! panes when it fires. The cost per record does not grow with `size / slide`.
//!
//! # Firing in chunks
//!
//! When a watermark makes many windows due at once (every key's window ends at the same
//! second), the operator fires at most [`FIRE_CHUNK`] of them (plus one key's) per call and
//! asks the subtask to call again ([`crate::operators::Work::More`]); the subtask checks its
//! mailbox between chunks and reads no input until all are out. The watermark goes
//! downstream after the results it caused.
//!
//! # State
//!
//! Each subtask keeps its windows in a bounded, typed cache (`cache_bytes`, counted in the
//! job's memory budget). When the cache is full it evicts the keys not used since the CLOCK
//! hand last passed, in one batch, to a [`WindowStore`] under (key group, key, window start)
//! — in bytes `key group (u16 BE) | key (u64 BE) | window start (u64 BE)` — so one key
//! group's state is one contiguous range, and a key's windows are adjacent. A key that comes
//! back is loaded from the store and removed there: a key's state lives in exactly one place.
//! The store is the operator's column family in the RocksDB shard of the subtask's core
//! ([`RocksWindowStore`], the default; RocksDB's memory is bounded and in the budget too),
//! or, with [`StateBackendKind::Memory`](crate::graph::StateBackendKind), a [`MemoryStore`]
//! in the heap, whose size is not bounded.
//!
//! Processing-time windows use the wall clock (ns since the Unix epoch), so they align to it;
//! their timers are deadlines the subtask wakes for. At the end of input every window fires,
//! processing-time ones included.

mod cache;
mod kinds;
mod operator;
mod rocks;
mod store;

pub use operator::FIRE_CHUNK;
pub use rocks::RocksWindowStore;
pub use store::{MemoryStore, StoreBatch, StoreError, StoreOp, VisitWindow, WindowStore, state_key};

use crate::exchange::KeyFn;
use crate::graph::{GraphError, Stream};
use crate::record::Record;
use crate::time::{TimestampFn, duration_ns};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The default bound of a window subtask's cache.
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// The smallest cache bound accepted (room for a few hundred keys).
pub const MIN_CACHE_BYTES: u64 = 64 * 1024;

/// The shape of the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// Back-to-back windows of `size`, aligned to time 0 (the Unix epoch).
    Tumbling {
        /// Window length.
        size: Duration,
    },
    /// Windows of `size` starting every `slide` (`slide <= size`), aligned to time 0.
    Sliding {
        /// Window length.
        size: Duration,
        /// Distance between window starts.
        slide: Duration,
    },
    /// Per key, records closer than `gap` form one session `[first, last + gap)`.
    Session {
        /// Inactivity that ends a session.
        gap: Duration,
    },
}

/// Which clock windows follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeDomain {
    /// The records' event time; windows fire by watermark.
    Event,
    /// The wall clock when the record is processed; windows fire by timer.
    Processing,
}

/// A window specification: shape and clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The shape.
    pub kind: WindowKind,
    /// The clock.
    pub domain: TimeDomain,
}

impl Window {
    /// Tumbling event-time windows of `size`.
    pub fn tumbling(size: Duration) -> Window {
        Window { kind: WindowKind::Tumbling { size }, domain: TimeDomain::Event }
    }

    /// Sliding event-time windows of `size`, one starting every `slide`.
    pub fn sliding(size: Duration, slide: Duration) -> Window {
        Window { kind: WindowKind::Sliding { size, slide }, domain: TimeDomain::Event }
    }

    /// Event-time session windows closed by `gap` of inactivity.
    pub fn session(gap: Duration) -> Window {
        Window { kind: WindowKind::Session { gap }, domain: TimeDomain::Event }
    }

    /// The same windows over processing time.
    pub fn processing_time(mut self) -> Window {
        self.domain = TimeDomain::Processing;
        self
    }
}

/// A window that fires, as an aggregate's result function sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    /// The key.
    pub key: u64,
    /// Window start, ns (inclusive).
    pub start_ns: u64,
    /// Window end, ns (exclusive).
    pub end_ns: u64,
    /// Fired by a late record within allowed lateness: replaces an earlier result.
    pub late: bool,
}

/// How windows aggregate records of type `T`: an accumulator per window (or pane, or
/// session) and a result record when the window fires.
///
/// Contract: `merge(a, b)` gives what adding `b`'s records to `a` would have given (panes and
/// merging sessions rely on it); `create` is the empty accumulator.
pub trait WindowAggregate<T>: Send + Sync + 'static {
    /// The running state of one window: a [`Record`], so it can be evicted to the store.
    type Acc: Record + Clone;
    /// What a firing window emits.
    type Out: Record;
    /// An empty accumulator.
    fn create(&self) -> Self::Acc;
    /// Add one record.
    fn add(&self, acc: &mut Self::Acc, record: &T);
    /// Add another accumulator's records.
    fn merge(&self, acc: &mut Self::Acc, other: &Self::Acc);
    /// The result of a firing window.
    fn result(&self, fired: &Fired, acc: &Self::Acc) -> Self::Out;
}

/// A built-in aggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    /// Records in the window.
    Count,
    /// Σ value (wrapping).
    Sum,
    /// Smallest value.
    Min,
    /// Largest value.
    Max,
    /// Σ value / count.
    Mean,
}

impl Aggregate {
    /// Every built-in, in result-field order.
    pub const ALL: [Aggregate; 5] = [Aggregate::Count, Aggregate::Sum, Aggregate::Min, Aggregate::Max, Aggregate::Mean];

    /// Its bit in [`WindowResult::aggregates`].
    pub fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// Its name in job files.
    pub fn name(self) -> &'static str {
        match self {
            Aggregate::Count => "count",
            Aggregate::Sum => "sum",
            Aggregate::Min => "min",
            Aggregate::Max => "max",
            Aggregate::Mean => "mean",
        }
    }

    /// The aggregate with this job-file name.
    pub fn from_name(name: &str) -> Option<Aggregate> {
        Aggregate::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// The accumulator of the built-in aggregations (fixed layout, 32 bytes).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
#[repr(C)]
pub struct Stats {
    /// Records.
    pub count: u64,
    /// Σ value, wrapping.
    pub sum: u64,
    /// Smallest value (`u64::MAX` when empty).
    pub min: u64,
    /// Largest value (0 when empty).
    pub max: u64,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats { count: 0, sum: 0, min: u64::MAX, max: 0 }
    }
}

impl Stats {
    /// Add one value.
    #[inline]
    pub fn add(&mut self, v: u64) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// Add another's values.
    #[inline]
    pub fn merge(&mut self, o: &Stats) {
        self.count += o.count;
        self.sum = self.sum.wrapping_add(o.sum);
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }
}

crate::fixed_record!(Stats);

/// The result of the built-in aggregations: one per key and window firing. Fixed layout
/// (72 bytes), read in place downstream. Aggregates not asked for are 0.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
    serde::Serialize,
    serde::Deserialize,
)]
#[repr(C)]
pub struct WindowResult {
    /// The key.
    pub key: u64,
    /// Window start, ns (inclusive).
    pub start_ns: u64,
    /// Window end, ns (exclusive).
    pub end_ns: u64,
    /// Records in the window.
    pub count: u64,
    /// Σ value, wrapping.
    pub sum: u64,
    /// Smallest value.
    pub min: u64,
    /// Largest value.
    pub max: u64,
    /// Σ value / count.
    pub mean: f64,
    /// Which aggregates were asked for: one [`Aggregate::bit`] each.
    pub aggregates: u32,
    /// 1 when a late record (within allowed lateness) fired the window again: this result
    /// replaces an earlier one for the same key and window.
    pub late: u32,
}

const _: () = assert!(std::mem::size_of::<WindowResult>() == 72);

crate::fixed_record!(WindowResult);

impl fmt::Display for WindowResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key={} window=[{}, {})", self.key, self.start_ns, self.end_ns)?;
        for a in Aggregate::ALL {
            if self.aggregates & a.bit() != 0 {
                match a {
                    Aggregate::Count => write!(f, " count={}", self.count)?,
                    Aggregate::Sum => write!(f, " sum={}", self.sum)?,
                    Aggregate::Min => write!(f, " min={}", self.min)?,
                    Aggregate::Max => write!(f, " max={}", self.max)?,
                    Aggregate::Mean => write!(f, " mean={:.3}", self.mean)?,
                }
            }
        }
        if self.late != 0 {
            write!(f, " (late update)")?;
        }
        Ok(())
    }
}

/// The built-in aggregations of one `u64` value per record, into a [`WindowResult`].
pub struct Aggregates<T> {
    value: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
    mask: u32,
}

impl<T> fmt::Debug for Aggregates<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = Aggregate::ALL.iter().filter(|a| self.mask & a.bit() != 0).map(|a| a.name()).collect();
        f.debug_struct("Aggregates").field("aggregates", &names).finish()
    }
}

impl<T> Aggregates<T> {
    /// Aggregate `value` of each record; add the aggregates with `count()`, `sum()`, ...
    pub fn of(value: impl Fn(&T) -> u64 + Send + Sync + 'static) -> Aggregates<T> {
        Aggregates { value: Arc::new(value), mask: 0 }
    }

    /// Add an aggregate.
    pub fn with(mut self, a: Aggregate) -> Aggregates<T> {
        self.mask |= a.bit();
        self
    }

    /// Count records.
    pub fn count(self) -> Aggregates<T> {
        self.with(Aggregate::Count)
    }

    /// Sum values.
    pub fn sum(self) -> Aggregates<T> {
        self.with(Aggregate::Sum)
    }

    /// Smallest value.
    pub fn min(self) -> Aggregates<T> {
        self.with(Aggregate::Min)
    }

    /// Largest value.
    pub fn max(self) -> Aggregates<T> {
        self.with(Aggregate::Max)
    }

    /// Mean value.
    pub fn mean(self) -> Aggregates<T> {
        self.with(Aggregate::Mean)
    }
}

impl<T: Record> WindowAggregate<T> for Aggregates<T> {
    type Acc = Stats;
    type Out = WindowResult;

    #[inline]
    fn create(&self) -> Stats {
        Stats::default()
    }

    #[inline]
    fn add(&self, acc: &mut Stats, record: &T) {
        acc.add((self.value)(record));
    }

    #[inline]
    fn merge(&self, acc: &mut Stats, other: &Stats) {
        acc.merge(other);
    }

    #[inline]
    fn result(&self, fired: &Fired, s: &Stats) -> WindowResult {
        let m = self.mask;
        let pick = |a: Aggregate, v: u64| if m & a.bit() != 0 { v } else { 0 };
        WindowResult {
            key: fired.key,
            start_ns: fired.start_ns,
            end_ns: fired.end_ns,
            count: pick(Aggregate::Count, s.count),
            sum: pick(Aggregate::Sum, s.sum),
            min: pick(Aggregate::Min, s.min),
            max: pick(Aggregate::Max, s.max),
            mean: if m & Aggregate::Mean.bit() != 0 && s.count > 0 { s.sum as f64 / s.count as f64 } else { 0.0 },
            aggregates: m,
            late: fired.late as u32,
        }
    }
}

/// The late-record callback (the side output of late data).
pub(crate) type LateFn<T> = Arc<dyn Fn(&T) + Send + Sync>;
type AddFn<T, A> = Arc<dyn Fn(&mut A, &T) + Send + Sync>;
type MergeFn<A> = Arc<dyn Fn(&mut A, &A) + Send + Sync>;
type ResultFn<A, U> = Arc<dyn Fn(&Fired, &A) -> U + Send + Sync>;

/// A user fold: start from `init`, `add` each record, `merge` two accumulators (sliding
/// panes and merging sessions need it), make a result record when the window fires.
///
/// ```
/// use weir::window::{Fold, Fired};
/// use weir::record::Event;
/// // The largest value and the key, as a pair.
/// let fold = Fold::new(0u64, |m: &mut u64, e: &Event| *m = (*m).max(e.value), |m, o| *m = (*m).max(*o),
///     |w: &Fired, m: &u64| (w.key, *m));
/// # let _ = fold;
/// ```
pub struct Fold<T, A, U> {
    init: A,
    add: AddFn<T, A>,
    merge: MergeFn<A>,
    result: ResultFn<A, U>,
}

impl<T, A, U> fmt::Debug for Fold<T, A, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fold").finish_non_exhaustive()
    }
}

impl<T, A, U> Fold<T, A, U> {
    /// A fold from its four parts.
    pub fn new(
        init: A,
        add: impl Fn(&mut A, &T) + Send + Sync + 'static,
        merge: impl Fn(&mut A, &A) + Send + Sync + 'static,
        result: impl Fn(&Fired, &A) -> U + Send + Sync + 'static,
    ) -> Fold<T, A, U> {
        Fold { init, add: Arc::new(add), merge: Arc::new(merge), result: Arc::new(result) }
    }
}

impl<T: 'static, A: Record + Clone, U: Record> WindowAggregate<T> for Fold<T, A, U> {
    type Acc = A;
    type Out = U;

    fn create(&self) -> A {
        self.init.clone()
    }

    fn add(&self, acc: &mut A, record: &T) {
        (self.add)(acc, record)
    }

    fn merge(&self, acc: &mut A, other: &A) {
        (self.merge)(acc, other)
    }

    fn result(&self, fired: &Fired, acc: &A) -> U {
        (self.result)(fired, acc)
    }
}

/// A keyed stream with windows declared: choose how they aggregate with
/// [`aggregate`](WindowedStream::aggregate).
pub struct WindowedStream<T> {
    stream: Stream<T>,
    key_hash: KeyFn<T>,
    key: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
    window: Window,
    lateness: Duration,
    on_late: Option<LateFn<T>>,
    cache_bytes: u64,
    timestamp: Option<TimestampFn<T>>,
    clock: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
}

impl<T> fmt::Debug for WindowedStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowedStream")
            .field("window", &self.window)
            .field("allowed_lateness", &self.lateness)
            .field("cache_bytes", &self.cache_bytes)
            .finish()
    }
}

impl<T: Record> WindowedStream<T> {
    pub(crate) fn new(
        stream: Stream<T>,
        key_hash: KeyFn<T>,
        key: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
        window: Window,
    ) -> WindowedStream<T> {
        WindowedStream {
            timestamp: stream.event_time(),
            stream,
            key_hash,
            key,
            window,
            lateness: Duration::ZERO,
            on_late: None,
            cache_bytes: DEFAULT_CACHE_BYTES,
            clock: None,
        }
    }

    /// Keep windows this long after they fired, for late records to update (event time).
    pub fn allowed_lateness(mut self, lateness: Duration) -> WindowedStream<T> {
        self.lateness = lateness;
        self
    }

    /// Call `f` with every late record (after counting it): the side output of late data.
    /// It runs on the window's thread, so it should be quick (push to a channel, a log).
    pub fn on_late(mut self, f: impl Fn(&T) + Send + Sync + 'static) -> WindowedStream<T> {
        self.on_late = Some(Arc::new(f));
        self
    }

    /// Bound each subtask's in-memory window state (default [`DEFAULT_CACHE_BYTES`]); more
    /// is evicted to the store. Counted in the job's memory budget.
    pub fn cache_bytes(mut self, bytes: u64) -> WindowedStream<T> {
        self.cache_bytes = bytes;
        self
    }

    /// The event time of the records, when the stream has none declared (or another one).
    pub fn timestamps(mut self, timestamp: impl Fn(&T) -> u64 + Send + Sync + 'static) -> WindowedStream<T> {
        self.timestamp = Some(Arc::new(timestamp));
        self
    }

    /// The processing-time clock (ns), instead of the wall clock: for tests that script time.
    pub fn processing_clock(mut self, clock: impl Fn() -> u64 + Send + Sync + 'static) -> WindowedStream<T> {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The window operator: node `id` with `parallelism` subtasks, aggregating by `agg`.
    pub fn aggregate<G: WindowAggregate<T>>(self, id: &str, parallelism: u32, agg: G) -> Stream<G::Out> {
        let problem = self.check();
        let kind = kinds::Kind::of(self.window.kind);
        let config = operator::WindowConfig {
            kind,
            domain: self.window.domain,
            lateness_ns: match self.window.domain {
                TimeDomain::Event => duration_ns(self.lateness),
                // Processing time is never late: a record's time is the time it arrives.
                TimeDomain::Processing => 0,
            },
            key: self.key,
            key_hash: self.key_hash,
            time: self.timestamp,
            on_late: self.on_late,
            cache_bytes: self.cache_bytes,
            clock: self.clock.unwrap_or_else(|| Arc::new(crate::time::now_ns)),
        };
        let link = operator::window_fn(Arc::new(config), Arc::new(agg));
        let out = self.stream.keyed_node::<G::Out>(id, "window", link, parallelism, self.cache_bytes);
        if let Some(problem) = problem {
            self.stream.push_error(GraphError::Window { node: id.to_owned(), problem });
        }
        out
    }

    /// What is wrong with this specification, if anything.
    fn check(&self) -> Option<String> {
        let positive = |name: &str, d: Duration| (d.is_zero()).then(|| format!("{name} must be positive"));
        let shape = match self.window.kind {
            WindowKind::Tumbling { size } => positive("the window size", size),
            WindowKind::Sliding { size, slide } => {
                positive("the window size", size).or_else(|| positive("the slide", slide)).or_else(|| {
                    (slide > size).then(|| {
                        format!("the slide ({slide:?}) is longer than the window ({size:?}); make it at most the size")
                    })
                })
            }
            WindowKind::Session { gap } => positive("the session gap", gap),
        };
        shape
            .or_else(|| {
                (self.window.domain == TimeDomain::Event && self.timestamp.is_none()).then(|| {
                    "event-time windows need the records' event time: call with_event_time(...) on the stream before key_by, or timestamps(...) on the windows".to_owned()
                })
            })
            .or_else(|| {
                (self.cache_bytes < MIN_CACHE_BYTES)
                    .then(|| format!("cache_bytes {} is below the minimum {MIN_CACHE_BYTES}", self.cache_bytes))
            })
    }
}
