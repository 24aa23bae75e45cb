//! Windows over a keyed stream, as the builder sees them: [`KeyedStream::window`]
//! returns a [`WindowedStream`], whose [`aggregate`](WindowedStream::aggregate) adds the
//! window operator ([`crate::window`]) to the job.

use super::{GraphError, KeyedStream, Stream};
use crate::record::Record;
use crate::time::TimestampFn;
use crate::window::{Window, WindowAggregate, WindowResult, WindowSpec};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A keyed stream with windows declared: choose how they aggregate with
/// [`aggregate`](WindowedStream::aggregate).
pub struct WindowedStream<T> {
    stream: Stream<T>,
    spec: WindowSpec<T>,
}

impl<T> fmt::Debug for WindowedStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowedStream")
            .field("window", &self.spec.window)
            .field("allowed_lateness", &self.spec.lateness)
            .field("cache_bytes", &self.spec.cache_bytes)
            .finish()
    }
}

impl<T: Record, K: 'static> KeyedStream<T, K> {
    /// Windows over this keyed stream: say how they aggregate with
    /// [`WindowedStream::aggregate`]. Windows key by `u64` (the key converts with
    /// `Into<u64>`), the key of their results.
    pub fn window(&self, window: Window) -> WindowedStream<T>
    where
        K: Copy + Into<u64>,
    {
        let value = self.key_value.clone();
        let spec = WindowSpec::new(self.key(), Arc::new(move |t| value(t).into()), window, self.stream.event_time());
        WindowedStream { stream: self.stream.clone(), spec }
    }
}

impl<T: Record> WindowedStream<T> {
    /// Keep windows this long after they fired, for late records to update (event time).
    pub fn allowed_lateness(mut self, lateness: Duration) -> WindowedStream<T> {
        self.spec.lateness = lateness;
        self
    }

    /// Call `f` with every late record (after counting it): the side output of late data.
    /// It runs on the window's thread, so it should be quick (push to a channel, a log).
    pub fn on_late(mut self, f: impl Fn(&T) + Send + Sync + 'static) -> WindowedStream<T> {
        self.spec.on_late = Some(Arc::new(f));
        self
    }

    /// Bound each subtask's in-memory window state (default
    /// [`DEFAULT_CACHE_BYTES`](crate::window::DEFAULT_CACHE_BYTES)); more is evicted to the
    /// store. Counted in the job's memory budget.
    pub fn cache_bytes(mut self, bytes: u64) -> WindowedStream<T> {
        self.spec.cache_bytes = bytes;
        self
    }

    /// The event time of the records, when the stream has none declared (or another one).
    pub fn timestamps(mut self, timestamp: impl Fn(&T) -> u64 + Send + Sync + 'static) -> WindowedStream<T> {
        self.spec.timestamp = Some(Arc::new(timestamp));
        self
    }

    /// The processing-time clock (ns), instead of the wall clock: for tests that script time.
    pub fn processing_clock(mut self, clock: impl Fn() -> u64 + Send + Sync + 'static) -> WindowedStream<T> {
        self.spec.clock = Some(Arc::new(clock));
        self
    }

    /// The window operator: node `id` with `parallelism` subtasks, aggregating by `agg`.
    pub fn aggregate<G: WindowAggregate<T>>(self, id: &str, parallelism: u32, agg: G) -> Stream<G::Out> {
        let problem = self.spec.check();
        let cache_bytes = self.spec.cache_bytes;
        let schema = self.spec.window.state_schema::<G::Acc>(agg.aggregates());
        let (link, merge) = self.spec.link(agg);
        let memory = crate::window::memory_bound(cache_bytes);
        let out = self.stream.keyed_node::<G::Out>(id, "window", link, parallelism, memory);
        self.stream.set_merge(id, merge);
        self.stream.set_state_schema(id, schema);
        if let Some(problem) = problem {
            self.stream.push_error(GraphError::Window { node: id.to_owned(), problem });
        }
        out
    }
}

impl<T: Record + Clone> WindowedStream<T> {
    /// [`aggregate`](Self::aggregate), with the records that come too late (behind the
    /// watermark past the allowed lateness: counted, and otherwise dropped) as a second,
    /// typed stream — the side output of late data: `(results, late records)`, through
    /// nodes `<id>-results` and `<id>-late` chained after the window.
    pub fn aggregate_with_late<G: WindowAggregate<T>>(
        self,
        id: &str,
        parallelism: u32,
        agg: G,
    ) -> (Stream<G::Out>, Stream<T>)
    where
        G::Out: Clone,
    {
        self.aggregate(id, parallelism, crate::window::WithLate(agg))
            .split(&format!("{id}-results"), &format!("{id}-late"))
    }
}

impl Stream<WindowResult> {
    /// The `n` best results of each window by `rank` (larger first; ties at the n-th kept),
    /// when the watermark closes the window: the second phase after a keyed window
    /// aggregate (see [`crate::window::TopN`]). Results are keyed by window (the edge is
    /// named `<id>-w`); a late re-firing within `lateness` (the window's allowed lateness)
    /// sends the window's top `n` again, marked late.
    ///
    /// ```no_run
    /// # use weir::graph::Job;
    /// # use weir::operators::builtin::{Generator, NullSink};
    /// # use weir::record::Event;
    /// # use weir::time::WatermarkStrategy;
    /// # use weir::window::{Aggregates, Window};
    /// # use std::time::Duration;
    /// let job = Job::new("busiest");
    /// job.source("gen", 1, |info| Generator::events(info, 1_000_000, 10_000))
    ///     .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_millis(5)))
    ///     .key_by("by_user", |e: &Event| e.key)
    ///     .window(Window::tumbling(Duration::from_millis(100)))
    ///     .aggregate("per_user", 2, Aggregates::of(|e: &Event| e.value).count())
    ///     .top_n("busiest", 1, 10, Duration::ZERO, |r| r.count)   // the 10 busiest users per window
    ///     .sink("out", 1, |_| NullSink);
    /// ```
    pub fn top_n(
        &self,
        id: &str,
        parallelism: u32,
        n: usize,
        lateness: Duration,
        rank: impl Fn(&WindowResult) -> u64 + Send + Sync + 'static,
    ) -> Stream<WindowResult> {
        let rank: crate::window::RankFn = Arc::new(rank);
        let lateness_ns = lateness.as_nanos().min(u64::MAX as u128) as u64;
        self.key_by(&format!("{id}-w"), |r: &WindowResult| r.start_ns)
            .process(id, parallelism, move |_| crate::window::TopN::new(n, lateness_ns, rank.clone()))
    }
}

/// A stream with non-keyed windows declared ([`Stream::window_all`]): choose how they
/// aggregate with [`aggregate`](AllWindowedStream::aggregate).
pub struct AllWindowedStream<T> {
    stream: Stream<T>,
    window: Window,
    timestamp: Option<TimestampFn<T>>,
}

impl<T> fmt::Debug for AllWindowedStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllWindowedStream").field("window", &self.window).finish()
    }
}

impl<T: Record> Stream<T> {
    /// Windows over every record of this stream, not per key: an aggregate in two phases
    /// ([`crate::window::all`]) — each upstream subtask folds its own records per window
    /// (chained, no ring) and sends one partial per window when the watermark closes it;
    /// a keyed final phase (by window start) merges the partials and emits the window's
    /// result once every input's watermark has passed it. Event-time tumbling and sliding
    /// windows; the records' event time is the stream's (or
    /// its `timestamps`).
    ///
    /// ```no_run
    /// # use weir::graph::Job;
    /// # use weir::operators::builtin::{Generator, NullSink};
    /// # use weir::record::Event;
    /// # use weir::time::WatermarkStrategy;
    /// # use weir::window::{Aggregates, Window};
    /// # use std::time::Duration;
    /// let job = Job::new("traffic");
    /// job.source("gen", 4, |info| Generator::events(info, 1_000_000, 10_000))
    ///     .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_millis(5)))
    ///     .window_all(Window::tumbling(Duration::from_millis(100)))
    ///     .aggregate("total", 1, Aggregates::of(|e: &Event| e.value).count().sum())  // one result per window
    ///     .sink("out", 1, |_| NullSink);
    /// ```
    pub fn window_all(&self, window: Window) -> AllWindowedStream<T> {
        AllWindowedStream { stream: self.clone(), window, timestamp: self.event_time() }
    }
}

impl<T: Record> AllWindowedStream<T> {
    /// The event time of the records, when the stream has none declared (or another one).
    pub fn timestamps(mut self, timestamp: impl Fn(&T) -> u64 + Send + Sync + 'static) -> AllWindowedStream<T> {
        self.timestamp = Some(Arc::new(timestamp));
        self
    }

    /// The two phases: node `<id>-partial` chained after the stream (its parallelism), an
    /// exchange keyed by window start (edge `<id>-w`), and the final node `id` with
    /// `parallelism` subtasks, aggregating by `agg`.
    pub fn aggregate<G: WindowAggregate<T>>(self, id: &str, parallelism: u32, agg: G) -> Stream<G::Out> {
        let problem = match (self.window.kind, self.window.domain, &self.timestamp) {
            (crate::window::WindowKind::Session { .. }, _, _) => {
                Some("window_all takes tumbling or sliding windows (a session is per key: key_by first)")
            }
            (_, crate::window::TimeDomain::Processing, _) => {
                Some("window_all follows event time (processing-time windows: key_by first)")
            }
            (_, _, None) => Some("window_all needs an event time: with_event_time upstream, or .timestamps(..)"),
            _ => None,
        };
        if let Some(problem) = problem {
            self.stream.push_error(GraphError::Window { node: id.to_owned(), problem: problem.to_owned() });
        }
        let agg = Arc::new(agg);
        // A placeholder clock when the graph is refused anyway (it never runs).
        let timestamp = self.timestamp.clone().unwrap_or_else(|| Arc::new(|_: &T| 0));
        let kind = match self.window.kind {
            k @ (crate::window::WindowKind::Tumbling { .. } | crate::window::WindowKind::Sliding { .. }) => k,
            _ => crate::window::WindowKind::Tumbling { size: Duration::from_secs(1) },
        };
        let link = crate::window::local_aggregate_fn::<T, G>(agg.clone(), kind, timestamp);
        let node = self.stream.operator(
            &format!("{id}-partial"),
            "window_partial",
            link,
            crate::chain::tee_fn::<crate::window::Partial<G::Acc>>(),
            false,
        );
        let partials: Stream<crate::window::Partial<G::Acc>> = self.stream.derived(node, None);
        partials.key_by(&format!("{id}-w"), |p: &crate::window::Partial<G::Acc>| p.start_ns).process(
            id,
            parallelism,
            move |info| crate::window::MergePartials::<T, G>::new(agg.clone(), info.key_groups()),
        )
    }
}
