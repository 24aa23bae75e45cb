//! The cache-line round-trip floor: two threads on two cores bouncing one atomic that sits
//! alone on its own 128-byte line (odd values: ping's turn is over; even: echo's). Nothing
//! that crosses cores through memory can answer faster, so ring round trips and end-to-end
//! latencies are quoted as multiples of it. The ring benchmark measures it inside each of its
//! round-trip groups ([`ping`] and [`echo`] are its loop bodies); the latency benchmark
//! measures it with [`measure`] in the same process, right before its runs.

use serde_json::{Value, json};
use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// An atomic alone on a 128-byte line (Intel prefetches lines in pairs, so 64 is not enough
/// to keep a neighbour off it).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Line(pub AtomicU64);

/// Ping side of `n` round trips on `line` (which must start at 0).
#[inline(never)]
pub fn ping(line: &AtomicU64, n: u64) {
    for i in 0..n {
        // Release/Acquire as a ring's position store/load would use; pairs with echo's.
        line.store(2 * i + 1, Ordering::Release);
        while line.load(Ordering::Acquire) != 2 * i + 2 {
            spin_loop();
        }
    }
}

/// Echo side of `n` round trips on `line`.
#[inline(never)]
pub fn echo(line: &AtomicU64, n: u64) {
    for i in 0..n {
        // Acquire: pairs with the Release store in `ping`.
        while line.load(Ordering::Acquire) != 2 * i + 1 {
            spin_loop();
        }
        line.store(2 * i + 2, Ordering::Release);
    }
}

/// The floor as measured: round-trip time, ns.
#[derive(Debug, Clone)]
pub struct Floor {
    /// Median of the rounds' mean round trip, ns.
    pub rtt_ns: f64,
    /// Each round's mean round trip, ns.
    pub rounds_ns: Vec<f64>,
    /// CPUs of ping and echo (None: not pinned).
    pub cpus: (Option<usize>, Option<usize>),
    /// Round trips per round.
    pub round_trips: u64,
}

impl Floor {
    /// One-way: half a round trip (one cache-line transfer).
    pub fn one_way_ns(&self) -> f64 {
        self.rtt_ns / 2.0
    }

    /// As JSON.
    pub fn json(&self) -> Value {
        json!({
            "rtt_ns_median": self.rtt_ns,
            "one_way_ns": self.one_way_ns(),
            "rounds_rtt_ns": self.rounds_ns,
            "round_trips_per_round": self.round_trips,
            "cpus": { "ping": self.cpus.0, "echo": self.cpus.1 },
            "method": "one AtomicU64 alone on a 128-byte line, Release store / Acquire load, both threads busy-spinning",
        })
    }
}

/// Measure the floor between `cpus` (ping, echo): `rounds` rounds of `n` round trips each;
/// the figure is the median of the rounds' means.
pub fn measure(cpus: (Option<usize>, Option<usize>), n: u64, rounds: usize) -> Floor {
    let line = Line::default();
    let mut rounds_ns = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        line.0.store(0, Ordering::Relaxed);
        let ready = AtomicUsize::new(0);
        let rendezvous = |cpu: Option<usize>| {
            if let Some(id) = cpu {
                core_affinity::set_for_current(core_affinity::CoreId { id });
            }
            ready.fetch_add(1, Ordering::AcqRel);
            while ready.load(Ordering::Acquire) < 2 {
                spin_loop();
            }
        };
        let ns = std::thread::scope(|s| {
            s.spawn(|| {
                rendezvous(cpus.1);
                echo(&line.0, n);
            });
            let h = s.spawn(|| {
                rendezvous(cpus.0);
                let t = Instant::now();
                ping(&line.0, n);
                t.elapsed().as_nanos() as f64 / n as f64
            });
            h.join().expect("ping thread")
        });
        rounds_ns.push(ns);
    }
    let mut sorted = rounds_ns.clone();
    sorted.sort_by(f64::total_cmp);
    Floor { rtt_ns: sorted[sorted.len() / 2], rounds_ns, cpus, round_trips: n }
}
