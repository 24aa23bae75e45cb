//! The job's monitor thread: every [`SAMPLE_INTERVAL`] it writes into the counters file
//! what no subtask writes itself: each subtask's time (busy, backpressured, idle, waiting,
//! from its [`TimeAccount`], the interval in progress included), RSS, each channel's backlog
//! and credit (from the shared ring positions, so no sender reads its receiver's line to keep
//! a gauge fresh), sinks' figures, per-partition consumer lag, and the rings other processes
//! write into (ipc endpoints, as channels). It runs whether or not anyone waits on the job,
//! so `weir-stat` shows a stuck job's numbers too, moving. It also logs the waits on the
//! outside that last ([`super::waiting`]), while they last.

use super::counters::{CounterKind, JobCounters, SINK};
use super::sinks::SinkGauge;
use super::sources::{EndpointGauge, LagGauge};
use super::time::TimeAccount;
use super::waiting::Waiting;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use weir_ring::Observer;
use weir_ring::counters::SharedCounter;

/// The counters of an endpoint another process writes into, as a channel's: slots, used,
/// free, the publisher's blocked time, and the announced limit (the slots: an endpoint
/// announces none).
const ENDPOINT: [CounterKind; 5] = [
    CounterKind::ChannelSlots,
    CounterKind::ChannelBacklog,
    CounterKind::ChannelCredit,
    CounterKind::ChannelBlockedNs,
    CounterKind::ChannelAnnounced,
];

/// How often the monitor rewrites the waits file when nothing changed (a heartbeat).
const HEARTBEAT: Duration = Duration::from_secs(1);

/// How often the monitor samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(50);

/// The process's RSS now, into `counter` and the running maximum `max`; returned.
pub fn sample_rss(counter: &SharedCounter, max: &AtomicU64) -> u64 {
    let rss = weir_ring::process::rss_bytes().unwrap_or(0);
    counter.set(rss);
    max.fetch_max(rss, Ordering::Relaxed);
    rss
}

/// One channel's gauges and where they are read from.
#[derive(Debug)]
pub struct ChannelGauge {
    /// The channel, `sender#i->receiver#j`.
    pub name: String,
    /// The ring, seen from outside.
    pub ring: Observer,
    /// Free slots, sampled.
    pub credit: SharedCounter,
    /// Used slots, sampled.
    pub backlog: SharedCounter,
    /// The receiver's drain rate, slots/s (written by the receiver; 0 until measured).
    pub drain_rate: SharedCounter,
    /// The time to drain the used slots at that rate, µs, sampled.
    pub drain_us: SharedCounter,
}

/// One subtask's time, and the counters it goes to.
#[derive(Debug)]
pub struct SubtaskClock {
    /// Its account.
    pub time: Arc<TimeAccount>,
    /// Its waiting note (logged while a wait lasts).
    pub waiting: Arc<Waiting>,
    /// Busy, backpressured, idle and waiting ns, in the order of
    /// [`Spent`](super::time::Spent).
    pub counters: [SharedCounter; 4],
}

/// What the monitor samples.
#[derive(Debug)]
pub struct Monitored {
    /// Every subtask's time.
    pub subtasks: Vec<SubtaskClock>,
    /// The job's RSS counter.
    pub rss: SharedCounter,
    /// The largest RSS sampled (the job's summary reports it).
    pub max_rss: Arc<AtomicU64>,
    /// Every channel.
    pub channels: Vec<ChannelGauge>,
    /// Sinks that publish figures.
    pub sinks: Vec<SinkGauge>,
    /// Sources that publish per-partition lag.
    pub lags: Vec<LagGauge>,
    /// Sources other processes write into (their rings, as channels).
    pub endpoints: Vec<EndpointGauge>,
}

/// The running monitor; stops (and joins) when dropped.
#[derive(Debug)]
pub struct Monitor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Allocate the sinks' counters and start sampling `what` into `counters`.
    pub fn spawn(what: Monitored, counters: JobCounters) -> Result<Monitor, MonitorError> {
        let sinks: Vec<(SinkGauge, Vec<Option<SharedCounter>>)> = what
            .sinks
            .iter()
            .map(|g| {
                // A full counters file costs the figure, not the job.
                let slots = SINK.iter().map(|k| counters.counter(*k, &g.node).ok()).collect();
                (g.clone(), slots)
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("weir-monitor".into())
                .spawn(move || run(what, sinks, counters, &stop))
                .map_err(MonitorError::Spawn)?
        };
        Ok(Monitor { stop, thread: Some(thread) })
    }

    /// Stop sampling and join the thread.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The monitor could not start.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// Its thread could not be spawned.
    #[error("cannot spawn the monitor thread weir-monitor")]
    Spawn(#[source] std::io::Error),
}

fn run(what: Monitored, sinks: Vec<(SinkGauge, Vec<Option<SharedCounter>>)>, counters: JobCounters, stop: &AtomicBool) {
    // Lag counters, allocated when a partition's lag is first known.
    let mut lags: HashMap<(usize, i32), Option<SharedCounter>> = HashMap::new();
    // Endpoint channel counters, allocated when an endpoint is first read.
    let mut endpoints: HashMap<(usize, u32), [Option<SharedCounter>; ENDPOINT.len()]> = HashMap::new();
    // The largest value written to each subtask time counter: they only grow.
    let mut clocks: Vec<[u64; 4]> = vec![[0; 4]; what.subtasks.len()];
    // What the waits file says now (rewritten when it changes).
    let waits_path = super::waiting::waits_path(counters.path());
    let mut waits_written: Option<Vec<(String, u64, String)>> = None;
    let mut waits_at = std::time::Instant::now();
    let notes: Vec<&Waiting> = what.subtasks.iter().map(|s| &*s.waiting).collect();
    loop {
        let stopping = stop.load(Ordering::Acquire);
        publish_time(&what.subtasks, &mut clocks);
        if stopping {
            // The last pass: subtasks that ended leave their final figures.
            return;
        }
        let now = std::time::Instant::now();
        for s in &what.subtasks {
            s.waiting.log_if_long(now);
        }
        super::waiting::watch_outages(now);
        let waits = super::waiting::waits_now(&notes);
        // A wait's text and start, not the ms its start converts to, say whether it changed.
        let key: Vec<(String, u64, String)> =
            waits.iter().map(|w| (w.subtask.clone(), w.since_ms / 1000, w.what.clone())).collect();
        // Rewritten when it changes, and every second: its time of change is the job's last
        // sign of life for a reader that finds the job dead.
        if waits_written.as_ref() != Some(&key) || now.saturating_duration_since(waits_at) >= HEARTBEAT {
            // A run directory that cannot take the file costs the tools the text, not the job.
            let _ = super::waiting::write_waits(&waits_path, &waits);
            waits_written = Some(key);
            waits_at = now;
        }
        sample_rss(&what.rss, &what.max_rss);
        for c in &what.channels {
            let backlog = c.ring.backlog();
            c.backlog.set(backlog);
            c.credit.set(c.ring.slot_count() - backlog);
            if let Some(us) = backlog.saturating_mul(1_000_000).checked_div(c.drain_rate.get()) {
                c.drain_us.set(us);
            }
        }
        for (gauge, slots) in &sinks {
            for (slot, v) in slots.iter().zip((gauge.read)().values()) {
                if let Some(c) = slot {
                    c.set(v);
                }
            }
        }
        for (g, gauge) in what.endpoints.iter().enumerate() {
            (gauge.read)(&mut |subtask, reading| {
                let set = endpoints.entry((g, subtask)).or_insert_with(|| {
                    let owner = format!("{}->{}#{subtask}", gauge.publisher, gauge.node);
                    ENDPOINT.map(|kind| counters.counter(kind, &owner).ok())
                });
                let credit = reading.slots.saturating_sub(reading.backlog);
                let values = [reading.slots, reading.backlog, credit, reading.blocked_ns, reading.slots];
                for (counter, value) in set.iter().zip(values) {
                    if let Some(c) = counter {
                        c.set(value);
                    }
                }
            });
        }
        for (g, gauge) in what.lags.iter().enumerate() {
            (gauge.read)(&mut |partition, lag| {
                let counter = lags.entry((g, partition)).or_insert_with(|| {
                    counters.counter(CounterKind::SourceLag, &format!("{}[{partition}]", gauge.node)).ok()
                });
                if let Some(c) = counter {
                    c.set(lag);
                }
            });
        }
        std::thread::sleep(SAMPLE_INTERVAL);
    }
}

/// Write each subtask's time, the interval in progress included, into its counters; a cell
/// never goes down (see [`TimeAccount::read`]).
fn publish_time(subtasks: &[SubtaskClock], last: &mut [[u64; 4]]) {
    for (s, last) in subtasks.iter().zip(last) {
        let (ns, _, _) = s.time.read();
        for ((c, v), l) in s.counters.iter().zip(ns).zip(last.iter_mut()) {
            if v > *l {
                *l = v;
                c.set(v);
            }
        }
    }
}
