//! What sinks publish while the job runs: totals and acknowledgement latency, read by the job's
//! monitor thread into the counters file (`weir-stat` shows them per sink node).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one latency window lasts: the counters show the last completed one.
const WINDOW: Duration = Duration::from_secs(1);

/// One reading of a sink node's figures (all its subtasks together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkReading {
    /// Records taken.
    pub records: u64,
    /// Records the destination acknowledged.
    pub acked: u64,
    /// Outstanding now: HTTP requests, or Kafka records not yet reported delivered.
    pub in_flight: u64,
    /// Retries, or client errors recovered from.
    pub retries: u64,
    /// Records sent to a dead-letter destination.
    pub dead_letters: u64,
    /// ns subtasks waited for the destination.
    pub blocked_ns: u64,
    /// Acknowledgement latency of the last completed window, µs.
    pub latency: LatencySummary,
}

impl SinkReading {
    /// The figures in the order of the counters of [`SINK`](super::counters::SINK).
    pub fn values(&self) -> [u64; 10] {
        [
            self.records,
            self.acked,
            self.in_flight,
            self.retries,
            self.dead_letters,
            self.blocked_ns,
            self.latency.p50_us,
            self.latency.p99_us,
            self.latency.max_us,
            self.latency.newest_ms,
        ]
    }
}

/// Median, 99th percentile and maximum, µs (all 0: nothing acknowledged in the window), and
/// when the newest acknowledgement was timed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatencySummary {
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Maximum.
    pub max_us: u64,
    /// When the newest acknowledgement (of any window) was timed, wall clock (Unix) ms; 0:
    /// none yet.
    pub newest_ms: u64,
}

/// Reads a sink node's figures; the monitor thread calls it every 50 ms.
#[derive(Clone)]
pub struct SinkGauge {
    /// The sink node.
    pub node: String,
    /// The reading.
    pub read: Arc<dyn Fn() -> SinkReading + Send + Sync>,
}

impl std::fmt::Debug for SinkGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkGauge").field("node", &self.node).finish()
    }
}

impl PartialEq for SinkGauge {
    fn eq(&self, other: &SinkGauge) -> bool {
        self.node == other.node && Arc::ptr_eq(&self.read, &other.read)
    }
}

/// Acknowledgement latencies in one-second windows (an HdrHistogram each, 2 significant
/// digits, 1 µs to 1 h). The HTTP sink records once per batch; the Kafka sink once per
/// delivery report, i.e. per record, under an uncontended mutex (about the cost of the report
/// itself). The summary is of the last completed window.
#[derive(Debug)]
pub struct AckLatency {
    inner: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    current: hdrhistogram::Histogram<u64>,
    started: Instant,
    last: LatencySummary,
    newest_ms: u64,
}

impl Default for AckLatency {
    fn default() -> AckLatency {
        AckLatency {
            inner: Mutex::new(Window {
                current: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("valid bounds"),
                started: Instant::now(),
                last: LatencySummary::default(),
                newest_ms: 0,
            }),
        }
    }
}

impl Window {
    /// A window is over: its figures become the last ones. However long since the last call,
    /// the last completed window is the one before `now`'s: if more than one window passed,
    /// the one just before now had nothing (the samples are of an older one).
    fn rotate(&mut self, now: Instant) {
        let age = now.duration_since(self.started);
        if age < WINDOW {
            return;
        }
        let h = &self.current;
        self.last = if h.is_empty() || age >= 2 * WINDOW {
            LatencySummary::default()
        } else {
            LatencySummary {
                p50_us: h.value_at_quantile(0.5),
                p99_us: h.value_at_quantile(0.99),
                max_us: h.max(),
                newest_ms: 0,
            }
        };
        self.current.reset();
        self.started = if age >= 2 * WINDOW { now } else { self.started + WINDOW };
    }
}

impl AckLatency {
    /// One acknowledgement that took `latency`.
    pub fn record(&self, latency: Duration) {
        let mut w = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        w.rotate(Instant::now());
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).clamp(1, 3_600_000_000);
        let _ = w.current.record(us);
        w.newest_ms = super::counters::unix_ms_now();
    }

    /// The last completed window's summary.
    pub fn summary(&self) -> LatencySummary {
        let mut w = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        w.rotate(Instant::now());
        LatencySummary { newest_ms: w.newest_ms, ..w.last }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_of_the_last_completed_window() {
        let a = AckLatency::default();
        for ms in 1..=100 {
            a.record(Duration::from_millis(ms));
        }
        assert_eq!(
            LatencySummary { newest_ms: 0, ..a.summary() },
            LatencySummary::default(),
            "the first window is not complete yet"
        );
        a.inner.lock().unwrap().started -= WINDOW;
        let s = a.summary();
        assert!((49_000..=51_000).contains(&s.p50_us), "{s:?}");
        assert!((98_000..=100_500).contains(&s.p99_us) && s.max_us >= 99_000, "{s:?}");
        assert!(s.newest_ms > 0, "{s:?}");
        a.inner.lock().unwrap().started -= WINDOW;
        let none = LatencySummary { newest_ms: s.newest_ms, ..LatencySummary::default() };
        assert_eq!(a.summary(), none, "a second with nothing acknowledged");
        // Samples of a window long past are not the last second's, however late the look.
        a.record(Duration::from_millis(5));
        a.inner.lock().unwrap().started -= 3 * WINDOW;
        assert_eq!(a.summary().p50_us, 0, "a window that ended seconds ago");
    }
}
