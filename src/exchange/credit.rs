//! Credit by time: each input channel announces, in its ring's header, what its receiver
//! drains in the channel's in-flight target, so data in flight — what a barrier waits
//! behind, and what a result queues behind — is bounded by time, not by ring size.
//!
//! The receiver measures, per channel, the slots it read over the time it was *not idle*
//! (busy or backpressured: the time it would have read had the data been there). That is
//! its capacity for the channel, not the rate the sender happens to offer: a receiver held
//! back by a small announcement idles more, and its measured rate stays where it is, so an
//! announcement cannot shrink itself (Flink's debloating measures the same way). The rate
//! is smoothed (an exponential average of its logarithm over samples every quarter target, at least
//! [`MIN_PERIOD`] apart), the announcement is `rate × target` slots, at least
//! [`MIN_ANNOUNCED_SLOTS`] and at most the ring, and it is stored only when it moves by more
//! than an eighth (no jitter of the limit, FLINK-24230). A sample with under [`MIN_BUSY`] of
//! non-idle time is not taken: a nearly idle receiver keeps its announcement.
//!
//! The sender applies it as `in flight < announced`, within the free slots
//! ([`weir_ring::Producer::window`]): a record may end past the limit, so even the smallest
//! announcement lets a sender finish the record it emits (no FLINK-33077 deadlock), and a
//! peer's value is clamped by the ring, never trusted. Rings are still allocated whole: the
//! target changes how much data is in flight (alignment time, latency), not the memory.

use std::time::Duration;
use weir_ring::Consumer;
use weir_ring::counters::SharedCounter;

/// The smallest announcement, slots: below this a hop's round trip, not the receiver,
/// would set the throughput.
pub(crate) const MIN_ANNOUNCED_SLOTS: u64 = 4;
/// The shortest sampling period.
pub(crate) const MIN_PERIOD: Duration = Duration::from_millis(2);
/// A sample needs this much non-idle time to count.
pub(crate) const MIN_BUSY: Duration = Duration::from_micros(500);
/// Weight of a new sample in the smoothed (log) rate: after the 8 samples of two target
/// periods, what was measured before weighs 1/256.
const ALPHA: f64 = 0.5;
/// Rates below this (slots/s) count as this: a channel read not at all while the receiver
/// was busy has a rate, not a logarithm of zero.
const MIN_RATE: f64 = 0.1;

/// One channel's drain measurement and announcement.
pub(crate) struct Drain {
    /// What the channel's in-flight data may take to drain.
    target: Duration,
    /// The channel's read position at the last sample.
    last_pos: u64,
    /// ln(slots per non-idle second), smoothed; `None` until the first sample.
    rate: Option<f64>,
    /// What was announced last (0: nothing yet, the whole ring).
    announced: u64,
    /// Counters: the announcement and the rate.
    announced_counter: SharedCounter,
    rate_counter: SharedCounter,
}

impl Drain {
    /// A channel whose in-flight data should drain in `target`.
    pub(crate) fn new(target: Duration, announced_counter: SharedCounter, rate_counter: SharedCounter) -> Drain {
        Drain { target, last_pos: 0, rate: None, announced: 0, announced_counter, rate_counter }
    }

    /// How often this channel wants a sample.
    pub(crate) fn period(&self) -> Duration {
        (self.target / 4).max(MIN_PERIOD)
    }

    /// A sample: `consumer` read up to its position over `busy` of non-idle time since the
    /// last one. Announces a new limit if it moved enough.
    pub(crate) fn sample(&mut self, consumer: &mut Consumer, busy: Duration) {
        let pos = consumer.position();
        let slots = pos.wrapping_sub(self.last_pos);
        self.last_pos = pos;
        // Smoothed in the log domain (a geometric mean): a 1000× change settles as fast as a
        // 2× one, so the limit follows within about two target periods either way.
        let now = (slots as f64 / busy.as_secs_f64()).max(MIN_RATE).ln();
        let log_rate = match self.rate {
            Some(r) => r + ALPHA * (now - r),
            None => now,
        };
        self.rate = Some(log_rate);
        let rate = log_rate.exp();
        self.rate_counter.set(rate as u64);
        let ring = consumer.slot_count();
        let limit = ((rate * self.target.as_secs_f64()).ceil() as u64).clamp(MIN_ANNOUNCED_SLOTS.min(ring), ring);
        let current = if self.announced == 0 { ring } else { self.announced };
        if limit.abs_diff(current) * 8 > current || (limit == ring) != (current == ring) {
            self.announced = limit;
            consumer.announce(limit);
            self.announced_counter.set(limit);
        }
    }

    /// Measure from `consumer`'s position now: what it read before does not count (the
    /// start, or a sample it sat out).
    pub(crate) fn skip(&mut self, consumer: &Consumer) {
        self.last_pos = consumer.position();
    }
}

/// When a gate samples its channels: every `period` of wall time, if the subtask was not
/// idle for at least [`MIN_BUSY`] of it.
pub(crate) struct DrainClock {
    period_ns: u64,
    next_ns: u64,
    last_busy_ns: u64,
}

impl DrainClock {
    /// A clock sampling every `period`.
    pub(crate) fn new(period: Duration) -> DrainClock {
        DrainClock { period_ns: period.as_nanos() as u64, next_ns: 0, last_busy_ns: 0 }
    }

    /// The subtask's clock now: `wall_ns` since it started, `idle_ns` of them idle. The
    /// non-idle time since the last sample when one is due and long enough, else `None`
    /// (cheap: one compare until a period has passed).
    #[inline]
    pub(crate) fn due(&mut self, wall_ns: u64, idle_ns: u64) -> Option<Duration> {
        if wall_ns < self.next_ns {
            return None;
        }
        self.next_ns = wall_ns + self.period_ns;
        let busy_ns = wall_ns.saturating_sub(idle_ns);
        let busy = busy_ns.saturating_sub(self.last_busy_ns);
        if busy < MIN_BUSY.as_nanos() as u64 {
            return None;
        }
        self.last_busy_ns = busy_ns;
        Some(Duration::from_nanos(busy))
    }
}
