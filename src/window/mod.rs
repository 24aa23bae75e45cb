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
//! handed to the [`WindowedStream::on_late`](crate::graph::WindowedStream::on_late) callback if one is set — the side output.
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
//! asks the subtask to call again ([`crate::operators::Work::Interleave`]); the subtask checks
//! its mailbox between chunks and may give it some input in between — records, a checkpoint
//! barrier (so a firing that a slow sink paces to take seconds does not hold a checkpoint
//! back), a watermark (held until the firing is done). With the cache full it reads no
//! input until all are out ([`crate::operators::Work::More`]). The watermark goes downstream
//! after the results it caused.
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
//! (the default; RocksDB's memory is bounded and in the budget too), or, with
//! [`StateBackendKind::Memory`](crate::graph::StateBackendKind), a [`MemoryStore`] in the
//! heap, whose size is not bounded. Over RocksDB, an aggregate whose partials merge (every
//! built-in one, and a `Fold`) keeps its windows in sorted runs, a key group and a batch at
//! a time ([`RunStore`]: RocksDB's work is per batch, not per evicted key); session windows
//! one entry per window ([`RocksWindowStore`]).
//!
//! Processing-time windows use the wall clock (ns since the Unix epoch), so they align to it;
//! their timers are deadlines the subtask wakes for. At the end of input every window fires,
//! processing-time ones included.

pub mod all;
mod cache;
mod kinds;
mod operator;
mod rank;
#[cfg(feature = "rocksdb")]
mod rocks;
#[cfg(feature = "rocksdb")]
mod runs;
mod store;

pub use all::Partial;
pub(crate) use all::{MergePartials, local_aggregate_fn};
pub use operator::{FIRE_CHUNK, RUN_BUFFER_MIN, cache_bytes_for_keys, memory_bound};
pub use rank::{RankFn, TopN};
#[cfg(feature = "rocksdb")]
pub use rocks::RocksWindowStore;
#[cfg(feature = "rocksdb")]
pub use runs::RunStore;
pub(crate) use store::value_merge;
pub use store::{MemoryStore, StoreBatch, StoreError, StoreOp, VisitWindow, WindowStore, state_key};

use crate::chain::LinkFn;
use crate::record::KeyFn;
use crate::record::Record;
use crate::time::{TimestampFn, duration_ns};
use crate::util::duration_text;
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

    /// In words, as checkpoints record it: `tumbling 10 ms, event time`.
    pub fn describe(&self) -> String {
        let shape = match self.kind {
            WindowKind::Tumbling { size } => format!("tumbling {}", duration_text(size)),
            WindowKind::Sliding { size, slide } => {
                format!("sliding {} every {}", duration_text(size), duration_text(slide))
            }
            WindowKind::Session { gap } => format!("session gap {}", duration_text(gap)),
        };
        let clock = match self.domain {
            TimeDomain::Event => "event time",
            TimeDomain::Processing => "processing time",
        };
        format!("{shape}, {clock}")
    }

    /// The schema of the state of windows of this shape aggregating into accumulators of
    /// type `A` (checkpoints record it; [`crate::checkpoint::upgrade`]).
    pub(crate) fn state_schema<A: Record>(
        &self,
        aggregates: Option<String>,
    ) -> crate::checkpoint::upgrade::StateSchema {
        let mut properties = std::collections::BTreeMap::new();
        properties.insert("shape".to_owned(), self.describe());
        if let Some(a) = aggregates {
            properties.insert("aggregates".to_owned(), a);
        }
        crate::checkpoint::upgrade::StateSchema {
            kind: "window".into(),
            properties,
            parts: vec![crate::state::StatePart {
                name: "windows".into(),
                kind: "windows".into(),
                key: Some(<u64 as Record>::schema()),
                map_key: None,
                value: A::schema(),
            }],
        }
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
    /// What a record that came too late (its windows closed, past the allowed lateness)
    /// sends downstream besides being counted: nothing (the default), or the record itself
    /// as a side output ([`WithLate`], through
    /// [`WindowedStream::aggregate_with_late`](crate::graph::WindowedStream::aggregate_with_late)).
    fn late_output(&self, _record: &T) -> Option<Self::Out> {
        None
    }
    /// The built-in aggregates it computes from its accumulator (`count,sum`), if that is
    /// what it is: checkpoints record them, and a later version of the job may compute
    /// others from the same accumulator ([`crate::checkpoint::upgrade`]). `None` (the
    /// default): a fold of its own, whose accumulator type is what is checked.
    fn aggregates(&self) -> Option<String> {
        None
    }
}

/// An aggregate whose results and late records go downstream together, results `Left` and
/// late records `Right` (split into two streams by
/// [`WindowedStream::aggregate_with_late`](crate::graph::WindowedStream::aggregate_with_late)).
#[derive(Debug)]
pub struct WithLate<G>(pub G);

impl<T: Record + Clone, G: WindowAggregate<T>> WindowAggregate<T> for WithLate<G>
where
    G::Out: Clone,
{
    type Acc = G::Acc;
    type Out = crate::record::Either<G::Out, T>;

    #[inline]
    fn create(&self) -> G::Acc {
        self.0.create()
    }

    #[inline]
    fn add(&self, acc: &mut G::Acc, record: &T) {
        self.0.add(acc, record)
    }

    #[inline]
    fn merge(&self, acc: &mut G::Acc, other: &G::Acc) {
        self.0.merge(acc, other)
    }

    #[inline]
    fn result(&self, fired: &Fired, acc: &G::Acc) -> Self::Out {
        crate::record::Either::Left(self.0.result(fired, acc))
    }

    fn late_output(&self, record: &T) -> Option<Self::Out> {
        Some(crate::record::Either::Right(record.clone()))
    }

    fn aggregates(&self) -> Option<String> {
        self.0.aggregates()
    }
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

crate::fixed_record!(Stats { count: u64, sum: u64, min: u64, max: u64 });

/// The result of the built-in aggregations: one per key and window firing. Fixed layout
/// (72 bytes), read in place downstream. Aggregates not asked for are 0 in memory, and
/// absent from its JSON: `{"key":7,"start_ns":..,"end_ns":..,"count":12,"sum":340,"late":0}`
/// for a window asked for count and sum — a consumer never reads a 0 that was not computed.
/// (A result whose `aggregates` says nothing, 0, shows all five.) Read back from JSON, the
/// aggregates present are the ones asked for.
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

impl WindowResult {
    /// Whether aggregate `a` was asked for (all are, when `aggregates` says nothing).
    pub fn has(&self, a: Aggregate) -> bool {
        self.aggregates == 0 || self.aggregates & a.bit() != 0
    }
}

impl serde::Serialize for WindowResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("key", &self.key)?;
        m.serialize_entry("start_ns", &self.start_ns)?;
        m.serialize_entry("end_ns", &self.end_ns)?;
        for a in Aggregate::ALL.into_iter().filter(|a| self.has(*a)) {
            match a {
                Aggregate::Count => m.serialize_entry("count", &self.count)?,
                Aggregate::Sum => m.serialize_entry("sum", &self.sum)?,
                Aggregate::Min => m.serialize_entry("min", &self.min)?,
                Aggregate::Max => m.serialize_entry("max", &self.max)?,
                Aggregate::Mean => m.serialize_entry("mean", &self.mean)?,
            }
        }
        m.serialize_entry("late", &self.late)?;
        m.end()
    }
}

impl<'de> serde::Deserialize<'de> for WindowResult {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<WindowResult, D::Error> {
        /// The JSON as written: the aggregates asked for, and only those.
        #[derive(serde::Deserialize)]
        struct Wire {
            key: u64,
            start_ns: u64,
            end_ns: u64,
            count: Option<u64>,
            sum: Option<u64>,
            min: Option<u64>,
            max: Option<u64>,
            mean: Option<f64>,
            aggregates: Option<u32>,
            #[serde(default)]
            late: u32,
        }
        let w = Wire::deserialize(d)?;
        let present = [
            (Aggregate::Count, w.count.is_some()),
            (Aggregate::Sum, w.sum.is_some()),
            (Aggregate::Min, w.min.is_some()),
            (Aggregate::Max, w.max.is_some()),
            (Aggregate::Mean, w.mean.is_some()),
        ];
        let aggregates = w.aggregates.unwrap_or_else(|| present.iter().filter(|p| p.1).map(|p| p.0.bit()).sum());
        Ok(WindowResult {
            key: w.key,
            start_ns: w.start_ns,
            end_ns: w.end_ns,
            count: w.count.unwrap_or(0),
            sum: w.sum.unwrap_or(0),
            min: w.min.unwrap_or(0),
            max: w.max.unwrap_or(0),
            mean: w.mean.unwrap_or(0.0),
            aggregates,
            late: w.late,
        })
    }
}

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

/// For window results: `count` counts results, `seq_sum` sums their record counts (so a
/// job that drops nothing has `seq_sum` equal to the records in), `value_sum` their sums.
impl crate::operators::Sink<WindowResult> for crate::operators::builtin::CountingSink {
    #[inline]
    fn write(&mut self, r: &WindowResult) -> Result<(), crate::operators::Halt> {
        self.local.0 += 1;
        self.local.1 = self.local.1.wrapping_add(r.count);
        self.local.2 = self.local.2.wrapping_add(r.count.wrapping_mul(r.count));
        self.local.3 = self.local.3.wrapping_add(r.sum);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), crate::operators::Halt> {
        <crate::operators::builtin::CountingSink as crate::operators::Sink<crate::record::Event>>::finish(self)
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

    fn aggregates(&self) -> Option<String> {
        let names: Vec<&str> = Aggregate::ALL.iter().filter(|a| self.mask & a.bit() != 0).map(|a| a.name()).collect();
        Some(names.join(","))
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

/// What one window operator is made of: built by
/// [`WindowedStream`](crate::graph::WindowedStream), which a keyed stream's `window` returns.
pub(crate) struct WindowSpec<T> {
    pub key_hash: KeyFn<T>,
    pub key: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
    pub window: Window,
    pub lateness: Duration,
    pub on_late: Option<LateFn<T>>,
    pub cache_bytes: u64,
    pub timestamp: Option<TimestampFn<T>>,
    pub clock: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
}

impl<T: Record> WindowSpec<T> {
    /// Windows of `window` keyed by `key`, with the defaults: no lateness, no late output,
    /// [`DEFAULT_CACHE_BYTES`], the wall clock.
    pub(crate) fn new(
        key_hash: KeyFn<T>,
        key: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
        window: Window,
        timestamp: Option<TimestampFn<T>>,
    ) -> WindowSpec<T> {
        WindowSpec {
            key_hash,
            key,
            window,
            lateness: Duration::ZERO,
            on_late: None,
            cache_bytes: DEFAULT_CACHE_BYTES,
            timestamp,
            clock: None,
        }
    }

    /// The operator's link, aggregating by `agg`, and the merge operator of its state when
    /// it writes partial windows blindly (aligned windows: a pane's partials merge as the
    /// aggregate does; session windows merge windows, and read a key's state instead).
    pub(crate) fn link<G: WindowAggregate<T>>(self, agg: G) -> (LinkFn, Option<crate::state::ValueMerge>) {
        let kind = kinds::Kind::of(self.window.kind);
        let agg = Arc::new(agg);
        let merge = matches!(kind, kinds::Kind::Aligned { .. }).then(|| {
            let agg = agg.clone();
            store::value_merge::<G::Acc>(move |a, b| agg.merge(a, b))
        });
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
        (operator::window_fn(Arc::new(config), agg, merge.clone()), merge)
    }

    /// What is wrong with this specification, if anything.
    pub(crate) fn check(&self) -> Option<String> {
        let positive = |name: &str, d: Duration| (d.is_zero()).then(|| format!("{name} must be positive"));
        let shape = match self.window.kind {
            WindowKind::Tumbling { size } => positive("the window size", size),
            WindowKind::Sliding { size, slide } => {
                positive("the window size", size).or_else(|| positive("the slide", slide)).or_else(|| {
                    (slide > size).then(|| {
                        format!(
                            "the slide ({}) is longer than the window ({}); make it at most the size",
                            duration_text(slide),
                            duration_text(size)
                        )
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

#[cfg(test)]
mod result_json {
    use super::*;

    /// A result carries in JSON the aggregates asked for and no others, and reads back the
    /// same (issue #47: `"min":0` for a window that was not asked for its min).
    #[test]
    fn only_what_was_asked() {
        let r = WindowResult {
            key: 7,
            start_ns: 1_000,
            end_ns: 2_000,
            count: 12,
            sum: 340,
            aggregates: Aggregate::Count.bit() | Aggregate::Sum.bit(),
            ..WindowResult::default()
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, r#"{"key":7,"start_ns":1000,"end_ns":2000,"count":12,"sum":340,"late":0}"#);
        assert_eq!(serde_json::from_str::<WindowResult>(&json).unwrap(), r);
        let all = WindowResult { aggregates: 0, ..r };
        let json = serde_json::to_string(&all).unwrap();
        for field in ["count", "sum", "min", "max", "mean"] {
            assert!(json.contains(&format!("\"{field}\":")), "{json}");
        }
    }
}
