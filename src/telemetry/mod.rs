//! Telemetry, one capability in one place: what the job's counters mean (kinds, labels,
//! capacity: [`counters`]), the monitor thread that samples gauges into them
//! ([`monitor`]), what sources and sinks publish ([`sources`], [`sinks`]), end-to-end
//! latency at each sink ([`latency`]), the memory
//! budget, latency histograms' text form ([`hgrm`]), where a subtask's time goes
//! ([`time`]), what a subtask waits on ([`waiting`]), and the counters as Prometheus series,
//! served over HTTP ([`prometheus`]).
//!
//! The counters *file* is `weir-ring`'s, generic; `weir-stat` (tools/) reads it through
//! [`counters::CounterKind`]. Layer: just above records; it imports nothing of the engine.

pub mod counters;
pub mod hgrm;
pub mod latency;
pub mod monitor;
#[cfg(feature = "prometheus")]
pub mod prometheus;
pub mod sinks;
pub mod sources;
pub mod time;
pub mod waiting;

use std::fmt;

/// The memory a job may use, as a sum of its owners, computed at start.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Budget {
    /// `(owner, bytes)`, e.g. `("rings: 12 x 64.6 KiB", 793_000)`.
    pub parts: Vec<(String, u64)>,
}

impl Budget {
    /// The total.
    pub fn total_bytes(&self) -> u64 {
        self.parts.iter().map(|(_, b)| b).sum()
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "memory budget {}", bytes(self.total_bytes()))?;
        for (i, (owner, b)) in self.parts.iter().enumerate() {
            write!(f, "{} {} {}", if i == 0 { " =" } else { " +" }, owner, bytes(*b))?;
        }
        Ok(())
    }
}

/// This machine's memory (`MemTotal` of /proc/meminfo); `None` where it cannot be read.
pub fn physical_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A byte count for people: `12.3 MiB`.
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

/// Flink's backpressure levels for a share of time spent backpressured.
pub fn backpressure_level(ratio: f64) -> &'static str {
    if ratio <= 0.10 {
        "OK"
    } else if ratio <= 0.50 {
        "LOW"
    } else {
        "HIGH"
    }
}
