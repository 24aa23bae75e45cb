//! End-to-end latency at a sink: the latency markers a sink subtask has seen, waiting until
//! the destination acknowledged every record written before them, then timed into
//! HdrHistograms — ingest to acknowledged, and event time to acknowledged, over the last
//! completed second and since the start — published as the counters of
//! [`LATENCY`](super::counters::LATENCY).
//!
//! One per sink subtask, on its thread: no lock. What it holds is one sample per marker
//! (sources send one every `latency_interval`), not one per record: sampling, which keeps
//! the record path free of it (a marker costs a compare at each batch's end).

use std::collections::VecDeque;
use weir_ring::counters::SharedCounter;

/// How long one window of the "last second" figures lasts, ns.
const WINDOW_NS: u64 = 1_000_000_000;
/// Histograms hold 1 µs to 30 days (a replay of old data is days behind in event time), to
/// two significant digits.
const MAX_US: u64 = 30 * 24 * 3_600_000_000;
/// An event time this far behind the wall clock is not on it (a synthetic clock from 0):
/// not timed.
const NOT_WALL_CLOCK_NS: u64 = MAX_US * 1000;
/// Where the markers-timed counter is in [`LATENCY`](super::counters::LATENCY).
const MARKERS: usize = 16;
const _: () = assert!(matches!(super::counters::LATENCY[MARKERS], super::counters::CounterKind::LatencyMarkers));
/// Markers waiting for their acknowledgement at most: past this a sink that acknowledges
/// nothing stops collecting them (no sample rather than unbounded memory).
const MAX_PENDING: usize = 4096;

/// One quantity over the last completed second and since the start.
#[derive(Debug)]
struct Pair {
    window: hdrhistogram::Histogram<u64>,
    all: hdrhistogram::Histogram<u64>,
    /// The last completed second's p50, p99, p99.9, max (all 0: no sample in it).
    last: [u64; 4],
}

impl Pair {
    fn new() -> Pair {
        let h = || hdrhistogram::Histogram::new_with_bounds(1, MAX_US, 2).expect("valid bounds");
        Pair { window: h(), all: h(), last: [0; 4] }
    }

    fn record(&mut self, ns: u64) {
        let us = (ns / 1000).clamp(1, MAX_US);
        let _ = self.window.record(us);
        let _ = self.all.record(us);
    }

    fn quantiles(h: &hdrhistogram::Histogram<u64>) -> [u64; 4] {
        if h.is_empty() {
            return [0; 4];
        }
        [h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.value_at_quantile(0.999), h.max()]
    }

    /// The second ended: its figures become the last ones (none when `stale`: the second
    /// that just ended is not the one the samples are of); a new one starts.
    fn rotate(&mut self, stale: bool) {
        self.last = if stale { [0; 4] } else { Self::quantiles(&self.window) };
        self.window.reset();
    }

    /// Last second's four figures, then since the start's four.
    fn figures(&self) -> [u64; 8] {
        let all = Self::quantiles(&self.all);
        let mut out = [0; 8];
        out[..4].copy_from_slice(&self.last);
        out[4..].copy_from_slice(&all);
        out
    }
}

/// A sink subtask's end-to-end latency (see the module docs).
#[derive(Debug)]
pub struct EndToEnd {
    /// In the order of [`LATENCY`](super::counters::LATENCY); empty: nothing published.
    counters: Vec<SharedCounter>,
    /// (records written before it, ingest ns, event ns) of each marker not yet acknowledged.
    pending: VecDeque<(u64, u64, u64)>,
    ingest: Pair,
    event: Pair,
    timed: u64,
    /// Coarse monotonic ns when the current second started, and of the last publication.
    window_start: u64,
    published: u64,
    /// Wall clock ms when the last completed second ended (0: none yet), and when the newest
    /// marker was timed (0: none yet): readers tell current figures from old ones by them.
    window_end_ms: u64,
    newest_ms: u64,
}

impl EndToEnd {
    /// Publishing into `counters` (the [`LATENCY`](super::counters::LATENCY) counters of
    /// the sink subtask; empty for none).
    pub fn new(counters: Vec<SharedCounter>) -> EndToEnd {
        EndToEnd {
            counters,
            pending: VecDeque::new(),
            ingest: Pair::new(),
            event: Pair::new(),
            timed: 0,
            window_start: weir_ring::process::coarse_monotonic_ns(),
            published: 0,
            window_end_ms: 0,
            newest_ms: 0,
        }
    }

    /// A marker came after `written` records: its record entered the job at `ingest_ns`
    /// (wall clock; 0: not known) with event time `event_ns` (0: not known). Timed once the
    /// destination acknowledged `written` records.
    pub fn marker(&mut self, written: u64, ingest_ns: u64, event_ns: u64) {
        if self.pending.len() < MAX_PENDING && (ingest_ns > 0 || event_ns > 0) {
            self.pending.push_back((written, ingest_ns, event_ns));
        }
    }

    /// Whether markers wait for acknowledgements.
    pub fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The destination acknowledged `acked` records: time the markers they cover, at
    /// `now_ns` (wall clock).
    pub fn acknowledged(&mut self, acked: u64, now_ns: u64) {
        if self.pending.front().is_some_and(|p| p.0 <= acked) {
            // Samples go into the second they are of: close the one that is over first.
            self.roll(weir_ring::process::coarse_monotonic_ns());
        }
        while let Some(&(written, ingest, event)) = self.pending.front() {
            if written > acked {
                break;
            }
            self.pending.pop_front();
            self.timed += 1;
            self.newest_ms = now_ns / 1_000_000;
            if ingest > 0 {
                self.ingest.record(now_ns.saturating_sub(ingest));
            }
            // An event time ahead of the clock (a producer's skew) has no latency to give.
            if event > 0 && event <= now_ns && now_ns - event < NOT_WALL_CLOCK_NS {
                self.event.record(now_ns - event);
            }
        }
    }

    /// Called at each batch's end: once a second the second's figures rotate; the counters
    /// are written then, and at most every 100 ms while markers are timed (the since-start
    /// figures and the count follow within that, however short the job).
    #[inline]
    pub fn tick(&mut self) {
        let now = weir_ring::process::coarse_monotonic_ns();
        let rolled = self.roll(now);
        let unpublished = self.timed != self.counters.get(MARKERS).map_or(0, |c| c.get())
            && now.saturating_sub(self.published) >= WINDOW_NS / 10;
        if rolled || unpublished {
            self.publish();
        }
    }

    /// Close the current second if it is over at `now` (coarse monotonic ns); whether it was.
    /// A second closed late (the sink's thread did not come by for a while: stuck, or idle)
    /// holds samples from before the second that just ended, which had none: its figures are
    /// none, not the old samples' ("no latency window reports a sample from before a stall").
    fn roll(&mut self, now: u64) -> bool {
        let age = now.saturating_sub(self.window_start);
        if age < WINDOW_NS {
            return false;
        }
        let stale = age >= 2 * WINDOW_NS;
        self.window_start = if stale { now } else { self.window_start + WINDOW_NS };
        self.window_end_ms = super::counters::unix_ms_now();
        self.ingest.rotate(stale);
        self.event.rotate(stale);
        true
    }

    /// Write the figures into the counters (also at the end, so the last ones stay).
    pub fn publish(&mut self) {
        self.published = weir_ring::process::coarse_monotonic_ns();
        if self.counters.len() != super::counters::LATENCY.len() {
            return;
        }
        let values = self.ingest.figures().into_iter().chain(self.event.figures()).chain([
            self.timed,
            self.window_end_ms,
            self.newest_ms,
        ]);
        for (c, v) in self.counters.iter().zip(values) {
            c.set(v);
        }
    }

    /// Ingest to acknowledged over the last completed second and since the start: p50, p99,
    /// p99.9, max, µs.
    pub fn ingest_figures(&self) -> [u64; 8] {
        self.ingest.figures()
    }

    /// Event time to acknowledged, the same.
    pub fn event_figures(&self) -> [u64; 8] {
        self.event.figures()
    }

    /// Markers timed.
    pub fn timed(&self) -> u64 {
        self.timed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A marker is timed only once everything written before it is acknowledged, from its
    /// ingest and event times; a marker with a synthetic event time is not timed for it.
    #[test]
    fn markers_wait_for_their_acknowledgement() {
        let mut e = EndToEnd::new(Vec::new());
        let s = 1_000_000_000_000_000_000u64; // 2001, in ns
        e.marker(10, s, s - 5_000_000);
        e.marker(20, s + 1_000_000, 7); // an event time from a synthetic clock
        e.acknowledged(9, s + 2_000_000);
        assert_eq!(e.timed(), 0, "9 of the 10 records before the first marker");
        e.acknowledged(10, s + 3_000_000);
        assert_eq!(e.timed(), 1);
        assert!(e.waiting());
        e.acknowledged(25, s + 4_000_000);
        assert_eq!(e.timed(), 2);
        assert!(!e.waiting());
        let ingest = e.ingest_figures();
        // Since start: 3 ms and 3 ms (2 significant digits).
        assert_eq!(ingest[7], e.ingest.all.highest_equivalent(3_000));
        assert_eq!(e.ingest.all.len(), 2);
        assert_eq!(e.event.all.len(), 1, "the synthetic event time is not timed");
        assert_eq!(e.event.all.max(), e.event.all.highest_equivalent(8_000));
        // The last second's figures move only at a rotation.
        assert_eq!(ingest[..4], [0; 4]);
        e.ingest.rotate(false);
        assert_eq!(e.ingest_figures()[3], e.ingest.all.max());
        // A second closed late shows nothing of its old samples.
        e.ingest.record(1_000_000);
        e.ingest.rotate(true);
        assert_eq!(e.ingest_figures()[..4], [0; 4]);
    }

    /// Markers pile up to a bound when nothing is acknowledged.
    #[test]
    fn pending_markers_are_bounded() {
        let mut e = EndToEnd::new(Vec::new());
        for i in 0..MAX_PENDING as u64 + 10 {
            e.marker(i, 1, 1);
        }
        assert_eq!(e.pending.len(), MAX_PENDING);
    }
}
