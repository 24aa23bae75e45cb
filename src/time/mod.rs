//! Event time and watermarks.
//!
//! **Event time** is read from each record by a timestamp function (ns, `u64`), declared once
//! on the stream with [`Stream::with_event_time`](crate::graph::Stream::with_event_time); the
//! stream carries the function on to the windows that need it.
//!
//! **A watermark `w`** says: records with an event time below `w` are complete; one that
//! comes later is *late*. (Flink's watermark `W` means "nothing at or below `W`", so weir's
//! `w` is Flink's `W + 1`; weir's is exclusive because times are unsigned and "no watermark
//! yet" is then simply 0.) A window `[start, end)` fires when the watermark reaches `end`.
//!
//! **Where watermarks come from.** `with_event_time` adds a small operator that tracks the
//! largest event time seen and emits `max − max_out_of_orderness` downstream, in band, as
//! [`Signal::Watermark`], when it advanced and either `every_records` records passed or
//! `interval` elapsed ([`WatermarkStrategy`]). Put it right after the source: it is chained
//! into the source's thread, so it is "at the source".
//!
//! **How they travel.** A ring writer sends a watermark on every channel of its edge. An
//! input gate keeps the watermark of each input channel and forwards the minimum over them
//! when that advances (`exchange/valve.rs`). End-of-stream counts as `+∞` for its channel. A channel
//! that sends nothing for the job's `watermark_idle_timeout` stops holding the minimum back
//! (Flink's `withIdleness`), and rejoins when it sends again.

mod section;

use crate::chain::{AnyCollector, LinkFn, NodeCounters, erase, unerase};
use crate::operators::{Collector, Halt, Signal};
use crate::record::Record;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A record's event time, ns (since the Unix epoch, or any clock the job agrees on).
pub type TimestampFn<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

/// How a source's watermarks follow its event times: bounded out-of-orderness, emitted
/// periodically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatermarkStrategy {
    /// How far behind the largest event time seen a record may be and still be on time.
    pub max_out_of_orderness: Duration,
    /// Emit (if advanced) after this many records; `None`: not by count.
    pub every_records: Option<u64>,
    /// Emit (if advanced) at the end of a source batch once this long has passed since the
    /// last one; `None`: not by time. Flink's `autoWatermarkInterval` (200 ms there too).
    pub interval: Option<Duration>,
}

impl WatermarkStrategy {
    /// Records may arrive up to `max_out_of_orderness` behind the largest event time seen.
    /// Emits every 1024 records and every 200 ms, whichever comes first.
    pub fn bounded(max_out_of_orderness: Duration) -> WatermarkStrategy {
        WatermarkStrategy {
            max_out_of_orderness,
            every_records: Some(1024),
            interval: Some(Duration::from_millis(200)),
        }
    }

    /// Emit after every `n` records (`None`: not by count). A smaller `n` fires windows
    /// sooner and costs a watermark record per channel each time.
    pub fn every_records(mut self, n: Option<u64>) -> WatermarkStrategy {
        self.every_records = n.map(|n| n.max(1));
        self
    }

    /// Emit when this long has passed, checked at each end of a source batch (`None`: not by
    /// time; then the watermarks depend on the records alone, which tests use).
    pub fn interval(mut self, interval: Option<Duration>) -> WatermarkStrategy {
        self.interval = interval;
        self
    }
}

/// The assigner: forwards records, tracks the largest event time, emits watermarks.
struct Watermarks<T> {
    time: TimestampFn<T>,
    bound_ns: u64,
    every: u64,
    interval: Option<Duration>,
    /// Largest event time seen, and whether any record was seen.
    max_time: u64,
    seen: bool,
    /// Last watermark sent (0: none).
    emitted: u64,
    since: u64,
    last_emit: Instant,
    down: Box<dyn Collector<T>>,
    counters: NodeCounters,
}

impl<T: Record> Watermarks<T> {
    fn emit(&mut self) -> Result<(), Halt> {
        self.last_emit = Instant::now();
        if !self.seen {
            return Ok(());
        }
        let w = self.max_time.saturating_sub(self.bound_ns);
        if w > self.emitted {
            self.emitted = w;
            self.down.signal(Signal::Watermark(w))?;
        }
        Ok(())
    }
}

impl<T: Record> Collector<T> for Watermarks<T> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        self.counters.records_in.add(1);
        let t = (self.time)(record);
        if t > self.max_time || !self.seen {
            self.max_time = self.max_time.max(t);
            self.seen = true;
        }
        self.counters.records_out.add(1);
        self.down.collect(record)?;
        self.since += 1;
        if self.since >= self.every {
            self.since = 0;
            self.emit()?;
        }
        Ok(())
    }

    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        match signal {
            Signal::Flush => {
                if self.interval.is_some_and(|i| self.last_emit.elapsed() >= i) {
                    self.emit()?;
                }
                self.down.signal(Signal::Flush)
            }
            // This operator *is* the event-time clock of its stream: watermarks from further
            // up are replaced by its own (as Flink's assigner does), except the end of input.
            Signal::Watermark(w) if w < u64::MAX => Ok(()),
            // A marker from a source that does not know event times gets this stream's: the
            // largest seen so far (the record it follows, or one a little later in time).
            Signal::Latency(mut m) if m.event_ns == 0 && self.seen => {
                m.event_ns = self.max_time;
                self.down.signal(Signal::Latency(m))
            }
            other => self.down.signal(other),
        }
    }
}

/// The link of a `with_event_time` node.
pub(crate) fn watermarks_fn<T: Record>(time: TimestampFn<T>, strategy: WatermarkStrategy) -> LinkFn {
    Arc::new(move |info, counters, _env, down| {
        let down: Box<dyn Collector<T>> = unerase::<T>(down, &info.node);
        let link: Box<dyn Collector<T>> = Box::new(Watermarks {
            time: time.clone(),
            bound_ns: duration_ns(strategy.max_out_of_orderness),
            every: strategy.every_records.unwrap_or(u64::MAX),
            interval: strategy.interval,
            max_time: 0,
            seen: false,
            emitted: 0,
            since: 0,
            last_emit: Instant::now(),
            down,
            counters,
        });
        erase::<T>(link) as AnyCollector
    })
}

/// A duration in ns, saturating (durations of centuries are "forever").
pub fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The processing-time clock of windows: ns since the Unix epoch, so processing-time windows
/// align to the wall clock as Flink's do.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(duration_ns).unwrap_or(0)
}
