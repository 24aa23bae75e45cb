//! Two streams into one keyed operator, as the builder sees them: [`Stream::connect`] pairs
//! two streams, [`ConnectedStreams::key_by`] keys both alike, and the result feeds a
//! two-input keyed operator — an [`interval_join`](KeyedConnectedStreams::interval_join),
//! a [`window_join`](KeyedConnectedStreams::window_join), a
//! [`regular_join`](KeyedConnectedStreams::regular_join), or any [`KeyedProcess`] over
//! [`Either`] records
//! ([`process`](KeyedConnectedStreams::process)).
//!
//! How: each side is mapped to [`Either`] (a map chained into the node before it), the two
//! are unioned and keyed, so one subtask's input gate reads both — barriers align across
//! both inputs and the watermark is the minimum of both, with no new runtime machinery.
//!
//! ```no_run
//! use weir::graph::Job;
//! use weir::operators::builtin::{Generator, NullSink};
//! use weir::operators::join::Interval;
//! use weir::record::Event;
//! use weir::time::WatermarkStrategy;
//! use std::time::Duration;
//!
//! let job = Job::new("trades-quotes");
//! let lag = WatermarkStrategy::bounded(Duration::from_millis(10));
//! let trades = job.source("trades", 1, |i| Generator::events(i, 1_000, 10))
//!     .with_event_time("trades-ts", |e: &Event| e.time_ns, lag);
//! let quotes = job.source("quotes", 1, |i| Generator::events(i, 1_000, 10))
//!     .with_event_time("quotes-ts", |e: &Event| e.time_ns, lag);
//! // Each trade with every quote of its key at most 5 ms before it.
//! trades.connect(&quotes)
//!     .key_by("by_key", |t: &Event| t.key, |q: &Event| q.key)
//!     .interval_join("trade_quote", 2, Interval::between(-5_000_000, 0), |t: &Event, q: Option<&Event>| {
//!         (t.seq, q.map_or(0, |q| q.seq))
//!     })
//!     .sink("out", 1, |_| NullSink);
//! ```

use super::{GraphError, KeyedStream, Stream};
use crate::operators::join::{Interval, IntervalJoin, JoinFns, JoinKind, JoinWindows, WindowJoin};
use crate::operators::{KeyedProcess, SubtaskInfo};
use crate::record::{Either, Record};
use crate::time::TimestampFn;
use crate::window::{TimeDomain, Window, WindowKind};
use std::hash::Hash;
use std::sync::Arc;

/// Two streams paired for a two-input operator: key them with
/// [`key_by`](ConnectedStreams::key_by).
pub struct ConnectedStreams<A, B> {
    left: Stream<A>,
    right: Stream<B>,
}

/// Two streams keyed alike: one subtask sees both inputs of its key groups.
pub struct KeyedConnectedStreams<A, B, K> {
    id: String,
    keyed: KeyedStream<Either<A, B>, K>,
    key_a: Arc<dyn Fn(&A) -> K + Send + Sync>,
    key_b: Arc<dyn Fn(&B) -> K + Send + Sync>,
    time_a: Option<TimestampFn<A>>,
    time_b: Option<TimestampFn<B>>,
}

impl<A, B> std::fmt::Debug for ConnectedStreams<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectedStreams").field("left", &self.left).field("right", &self.right).finish()
    }
}

impl<A, B, K> std::fmt::Debug for KeyedConnectedStreams<A, B, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedConnectedStreams").field("key_by", &self.id).field("stream", &self.keyed).finish()
    }
}

impl<A: Record + Clone> Stream<A> {
    /// Pair this stream (the left) with `other` (the right) for a two-input operator.
    pub fn connect<B: Record + Clone>(&self, other: &Stream<B>) -> ConnectedStreams<A, B> {
        ConnectedStreams { left: self.clone(), right: other.clone() }
    }
}

impl<A: Record + Clone, B: Record + Clone> ConnectedStreams<A, B> {
    /// Key both sides (equal keys meet in one subtask). Adds two maps named `<id>-left` and
    /// `<id>-right`, chained into the nodes before them, which wrap each record in
    /// [`Either`]; the event times declared on the two streams carry on.
    pub fn key_by<K: Hash + 'static>(
        &self,
        id: &str,
        key_a: impl Fn(&A) -> K + Send + Sync + 'static,
        key_b: impl Fn(&B) -> K + Send + Sync + 'static,
    ) -> KeyedConnectedStreams<A, B, K> {
        let (time_a, time_b) = (self.left.event_time(), self.right.event_time());
        let left = self.left.map(&format!("{id}-left"), |a: &A| Either::<A, B>::Left(a.clone()));
        let right = self.right.map(&format!("{id}-right"), |b: &B| Either::<A, B>::Right(b.clone()));
        let mut both = left.union(&right);
        if let (Some(ta), Some(tb)) = (time_a.clone(), time_b.clone()) {
            both.time = Some(Arc::new(move |e: &Either<A, B>| match e {
                Either::Left(a) => ta(a),
                Either::Right(b) => tb(b),
            }));
        }
        let key_a: Arc<dyn Fn(&A) -> K + Send + Sync> = Arc::new(key_a);
        let key_b: Arc<dyn Fn(&B) -> K + Send + Sync> = Arc::new(key_b);
        let (ka, kb) = (key_a.clone(), key_b.clone());
        let keyed = both.key_by(id, move |e: &Either<A, B>| match e {
            Either::Left(a) => ka(a),
            Either::Right(b) => kb(b),
        });
        KeyedConnectedStreams { id: id.to_owned(), keyed, key_a, key_b, time_a, time_b }
    }
}

impl<A: Record + Clone, B: Record + Clone, K: Hash + 'static> KeyedConnectedStreams<A, B, K> {
    /// A two-input keyed operator: `factory` builds one [`KeyedProcess`] per subtask, which
    /// sees the records of both inputs (as [`Either`]) with their key group, and the
    /// watermark of both ([`KeyedProcess::on_watermark`]).
    pub fn process<U: Record, P: KeyedProcess<Either<A, B>, U> + 'static>(
        &self,
        id: &str,
        parallelism: u32,
        factory: impl Fn(&SubtaskInfo) -> P + Send + Sync + 'static,
    ) -> Stream<U> {
        self.keyed.process(id, parallelism, factory)
    }

    /// [`process`](Self::process) with keyed state (see
    /// [`KeyedStream::process_with_state`](crate::graph::KeyedStream::process_with_state)).
    pub fn process_with_state<U: Record, P: KeyedProcess<Either<A, B>, U> + 'static>(
        &self,
        id: &str,
        parallelism: u32,
        factory: impl Fn(&SubtaskInfo, &crate::state::KeyedState) -> P + Send + Sync + 'static,
    ) -> Stream<U> {
        self.keyed.process_with_state(id, parallelism, factory)
    }

    /// Join each left record `a` with every right record `b` of its key whose event time
    /// lies in `interval` around `a`'s (see [`crate::operators::join`]); `join` makes the
    /// result (`None` for the right: a left record that met none, in a left outer join).
    /// Both streams need an event time (`with_event_time` before `connect`).
    pub fn interval_join<U: Record>(
        &self,
        id: &str,
        parallelism: u32,
        interval: Interval,
        join: impl Fn(&A, Option<&B>) -> U + Send + Sync + 'static,
    ) -> Stream<U>
    where
        K: Eq + Ord + Clone + Send,
    {
        self.join_node(id, parallelism, interval, true, join)
    }

    /// A regular (unbounded) inner join: each left record with every right record of its
    /// key, whenever either comes. State is kept for ever, or `ttl` of event time after each
    /// record's time (then both streams need an event time: the watermark expires it).
    pub fn regular_join<U: Record>(
        &self,
        id: &str,
        parallelism: u32,
        ttl: Option<std::time::Duration>,
        join: impl Fn(&A, &B) -> U + Send + Sync + 'static,
    ) -> Stream<U>
    where
        K: Eq + Ord + Clone + Send,
    {
        let interval = match ttl {
            Some(ttl) => Interval::unbounded().with_ttl(ttl.as_nanos().min(u64::MAX as u128) as u64),
            None => Interval::unbounded(),
        };
        let join = move |a: &A, b: Option<&B>| join(a, b.expect("an inner join emits pairs only"));
        self.join_node(id, parallelism, interval, ttl.is_some(), join)
    }

    /// Join the left and right records of each key that fall in the same window (tumbling
    /// or sliding, event time): a window's pairs — and, with [`JoinKind::LeftOuter`], its
    /// left records that met none, with `None` — come out when the watermark closes it.
    /// Both streams need an event time.
    pub fn window_join<U: Record>(
        &self,
        id: &str,
        parallelism: u32,
        window: Window,
        kind: JoinKind,
        join: impl Fn(&A, Option<&B>) -> U + Send + Sync + 'static,
    ) -> Stream<U>
    where
        K: Eq + Ord + Clone + Send,
    {
        let stream = &self.keyed.stream;
        let ns = |d: std::time::Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        let windows = match window.kind {
            WindowKind::Tumbling { size } => JoinWindows { size: ns(size), slide: ns(size), kind },
            WindowKind::Sliding { size, slide } => JoinWindows { size: ns(size), slide: ns(slide), kind },
            WindowKind::Session { .. } => {
                stream.push_error(GraphError::Join {
                    node: id.to_owned(),
                    problem: "a window join takes tumbling or sliding windows, not session windows".to_owned(),
                });
                JoinWindows { size: 1, slide: 1, kind }
            }
        };
        if window.domain != TimeDomain::Event {
            stream.push_error(GraphError::Join {
                node: id.to_owned(),
                problem: "a window join runs on event time; drop processing_time()".to_owned(),
            });
        }
        if let Some(problem) = windows.problem() {
            stream.push_error(GraphError::Join { node: id.to_owned(), problem });
        }
        let fns = self.fns(id, "a window join", true, join);
        self.keyed.process(id, parallelism, move |info| WindowJoin::new(info, windows, fns.clone()))
    }

    /// The functions a join reads its records with; an error when it `needs_time` and an
    /// input has no event time.
    fn fns<U: Record>(
        &self,
        id: &str,
        what: &str,
        needs_time: bool,
        join: impl Fn(&A, Option<&B>) -> U + Send + Sync + 'static,
    ) -> JoinFns<A, B, K, U> {
        let missing: Vec<&str> = [("left", self.time_a.is_none()), ("right", self.time_b.is_none())]
            .into_iter()
            .filter_map(|(side, none)| none.then_some(side))
            .collect();
        if needs_time && !missing.is_empty() {
            self.keyed.stream.push_error(GraphError::Join {
                node: id.to_owned(),
                problem: format!(
                    "{what} needs the event time of both inputs; the {} input of `{}` has none: call with_event_time(...) on it before connect",
                    missing.join(" and "),
                    self.id
                ),
            });
        }
        let never: TimestampFn<A> = Arc::new(|_| 0);
        let never_b: TimestampFn<B> = Arc::new(|_| 0);
        JoinFns {
            key_a: self.key_a.clone(),
            key_b: self.key_b.clone(),
            time_a: self.time_a.clone().unwrap_or(never),
            time_b: self.time_b.clone().unwrap_or(never_b),
            join: Arc::new(join),
        }
    }

    fn join_node<U: Record>(
        &self,
        id: &str,
        parallelism: u32,
        interval: Interval,
        needs_time: bool,
        join: impl Fn(&A, Option<&B>) -> U + Send + Sync + 'static,
    ) -> Stream<U>
    where
        K: Eq + Ord + Clone + Send,
    {
        let stream = &self.keyed.stream;
        if let Some(problem) = interval.problem() {
            stream.push_error(GraphError::Join { node: id.to_owned(), problem });
        }
        let what = if interval.is_unbounded() { "a join with a time to live" } else { "an interval join" };
        let fns = self.fns(id, what, needs_time, join);
        self.keyed.process(id, parallelism, move |info| IntervalJoin::new(info, interval, fns.clone()))
    }
}
