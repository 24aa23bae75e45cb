//! Built-in sources and sinks: a replayable generator, counting and collecting sinks.

use super::{Collector, Halt, Sink, Source, SourcePoll, SubtaskInfo};
use crate::record::{Event, Record};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Records a generator emits per poll (the runtime flushes and checks its mailbox between polls).
const GENERATOR_BATCH: u64 = 256;

/// Records a generator hands down its chain at once.
const EMIT_BATCH: usize = 64;

/// A bounded or endless source of records made from sequence numbers. Subtask `i` of `p`
/// emits the sequence numbers `i, i + p, i + 2p, ...` below `count`, so the job as a whole
/// emits each number once. Optionally paced to a rate per subtask.
pub struct Generator<T> {
    next: u64,
    step: u64,
    end: u64,
    make: Arc<dyn Fn(u64) -> T + Send + Sync>,
    /// `make` over a batch: pushes `make(seq)`, `make(seq + step)`, ... onto the buffer, at
    /// most `room` of them and none from `end` on, and returns the next sequence number.
    /// One dynamic call per batch, with `make` inlined into it, so each record is built in
    /// the buffer: called per record, `make` returned it through the stack, and copying it
    /// from there waited for the stores before it (the previous batch's records, on lines
    /// the next subtask reads) — ~9 % of the unchained chain's samples.
    fill: Fill<T>,
    rate: Option<(f64, Instant, u64)>,
    /// The records being emitted (kept for its capacity; empty between polls).
    batch: Vec<T>,
}

/// See `Generator::fill`.
type Fill<T> = Arc<dyn Fn(&mut Vec<T>, u64, u64, usize, u64) -> u64 + Send + Sync>;

/// `Generator::make` and `Generator::fill` for one `make`.
#[allow(clippy::type_complexity)]
fn makers<T: 'static>(
    make: impl Fn(u64) -> T + Send + Sync + 'static,
) -> (Arc<dyn Fn(u64) -> T + Send + Sync>, Fill<T>) {
    let make = Arc::new(make);
    let each = make.clone();
    let fill: Fill<T> = Arc::new(move |buf: &mut Vec<T>, mut seq: u64, step: u64, room: usize, end: u64| {
        let mut k = 0;
        while k < room && seq < end {
            buf.push(each(seq));
            seq = seq.saturating_add(step);
            k += 1;
        }
        seq
    });
    (make, fill)
}

impl<T> std::fmt::Debug for Generator<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator").field("next", &self.next).field("end", &self.end).finish()
    }
}

impl<T: Record> Generator<T> {
    /// Records `make(seq)` for seq in `0..count` (`None`: endless), split over the subtasks.
    pub fn new(
        info: &SubtaskInfo,
        count: Option<u64>,
        make: impl Fn(u64) -> T + Send + Sync + 'static,
    ) -> Generator<T> {
        let (make, fill) = makers(make);
        Generator {
            next: info.index as u64,
            step: info.parallelism as u64,
            end: count.unwrap_or(u64::MAX),
            make,
            fill,
            rate: None,
            batch: Vec::new(),
        }
    }

    /// Pace this subtask to `per_second` records per second (open loop: it catches up after
    /// a stall rather than losing the time).
    pub fn with_rate(mut self, per_second: f64) -> Generator<T> {
        self.rate = Some((per_second, Instant::now(), 0));
        self
    }
}

impl Generator<Event> {
    /// `count` events over `keys` keys: key spread by a multiplicative hash of seq, value
    /// `seq % 100 + 1`, a synthetic event time of 1 µs per sequence number.
    pub fn events(info: &SubtaskInfo, count: u64, keys: u64) -> Generator<Event> {
        let keys = keys.max(1);
        Generator::new(info, Some(count), move |seq| Event {
            key: seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys,
            value: seq % 100 + 1,
            time_ns: seq * 1_000,
            seq,
        })
    }
}

impl Generator<Event> {
    /// Event times out of order: each up to `jitter_ns` behind the synthetic clock (by a
    /// hash of its sequence number), for event-time jobs that should see disorder.
    pub fn with_time_jitter(mut self, jitter_ns: u64) -> Generator<Event> {
        let make = self.make.clone();
        (self.make, self.fill) = makers(move |seq| {
            let e = make(seq);
            let behind = crate::record::hash_key(&seq) % jitter_ns.saturating_add(1);
            Event { time_ns: e.time_ns.saturating_sub(behind), ..e }
        });
        self
    }
}

impl<T: Record> Source<T> for Generator<T> {
    fn poll(&mut self, out: &mut dyn Collector<T>) -> Result<SourcePoll, Halt> {
        if self.next >= self.end {
            return Ok(SourcePoll::Finished);
        }
        let mut budget = GENERATOR_BATCH;
        if let Some((rate, start, emitted)) = &self.rate {
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            if due <= *emitted {
                // However slow the rate (1e-30 per second is accepted), the wait is a
                // duration and at most 100 ms: the subtask keeps answering its mailbox.
                let secs = ((*emitted + 1) as f64 / rate - start.elapsed().as_secs_f64()).max(0.0);
                let wait = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
                return Ok(SourcePoll::Idle(wait.clamp(Duration::from_micros(50), Duration::from_millis(100))));
            }
            budget = budget.min(due - emitted);
        }
        // Emitted a batch at a time (`collect_batch`: one call down the chain per batch).
        let mut n = 0;
        while n < budget && self.next < self.end {
            let room = (EMIT_BATCH as u64).min(budget - n) as usize;
            let seq = (self.fill)(&mut self.batch, self.next, self.step, room, self.end);
            let emitted = out.collect_batch(&self.batch);
            n += self.batch.len() as u64;
            self.batch.clear();
            emitted?;
            self.next = seq;
        }
        if let Some((_, _, emitted)) = &mut self.rate {
            *emitted += n;
        }
        Ok(SourcePoll::Emitted(n as usize))
    }

    /// The next sequence number: the generator replays from it.
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        Ok(self.next.to_le_bytes().to_vec())
    }

    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        let Some((id, bytes)) = from else { return Ok(()) };
        let next = bytes.try_into().map(u64::from_le_bytes).map_err(|_| {
            Halt::failed(format!("generator: checkpoint {id} holds {} bytes, not a sequence number", bytes.len()))
        })?;
        if next % self.step != self.next % self.step {
            return Err(Halt::failed(format!(
                "generator: checkpoint {id} resumes at {next}, which is not this subtask's sequence"
            )));
        }
        self.next = next;
        Ok(())
    }
}

/// A source that never emits (an idle input); it ends only when the job is cancelled.
#[derive(Debug, Default)]
pub struct Silent;

impl<T> Source<T> for Silent {
    fn poll(&mut self, _out: &mut dyn Collector<T>) -> Result<SourcePoll, Halt> {
        Ok(SourcePoll::Idle(Duration::from_secs(1)))
    }
}

/// Totals a set of sinks shares: how many events, and checksums of their sequence numbers
/// (sum and sum of squares, wrapping), so a test can prove none was lost or doubled.
#[derive(Debug, Default)]
pub struct Tally {
    /// Events seen.
    pub count: AtomicU64,
    /// Σ seq.
    pub seq_sum: AtomicU64,
    /// Σ seq², wrapping.
    pub seq_square_sum: AtomicU64,
    /// Σ value.
    pub value_sum: AtomicU64,
}

impl Tally {
    /// What a tally of exactly the sequence numbers `0..n` holds: (count, Σ, Σ²).
    pub fn expected(n: u64) -> (u64, u64, u64) {
        let (n128, sum) = (n as u128, (n as u128) * (n as u128).saturating_sub(1) / 2);
        let squares = n128.saturating_sub(1) * n128 * (2 * n128).saturating_sub(1) / 6;
        (n, sum as u64, squares as u64)
    }

    /// (count, Σ seq, Σ seq²) now.
    pub fn totals(&self) -> (u64, u64, u64) {
        (
            self.count.load(Ordering::Acquire),
            self.seq_sum.load(Ordering::Acquire),
            self.seq_square_sum.load(Ordering::Acquire),
        )
    }
}

/// Counts events into a shared [`Tally`] at the end of the job (sums kept locally until
/// then, so the hot path touches no shared line), optionally slowly.
#[derive(Debug)]
pub struct CountingSink {
    tally: Arc<Tally>,
    /// count, seq sum, seq² sum, value sum: added into the tally at `finish`.
    pub(crate) local: (u64, u64, u64, u64),
    delay: Option<Duration>,
    debt: Duration,
}

impl CountingSink {
    /// A sink adding into `tally`.
    pub fn new(tally: Arc<Tally>) -> CountingSink {
        CountingSink { tally, local: (0, 0, 0, 0), delay: None, debt: Duration::ZERO }
    }

    /// Spend `delay` on every record (a slow downstream system). Paid in sleeps of at least
    /// 200 µs, so the cost per record is exact on average and a slow sink does not burn a core.
    pub fn with_delay(mut self, delay: Duration) -> CountingSink {
        self.delay = Some(delay);
        self
    }
}

impl Default for CountingSink {
    fn default() -> Self {
        CountingSink::new(Arc::default())
    }
}

impl Sink<Event> for CountingSink {
    #[inline]
    fn write(&mut self, e: &Event) -> Result<(), Halt> {
        if let Some(d) = self.delay {
            self.debt += d;
            if self.debt >= Duration::from_micros(200) {
                // A fiber's sleep lets the other subtasks on its CPU run meanwhile.
                weir_ring::fiber::sleep(self.debt);
                self.debt = Duration::ZERO;
            }
        }
        self.local.0 += 1;
        self.local.1 = self.local.1.wrapping_add(e.seq);
        self.local.2 = self.local.2.wrapping_add(e.seq.wrapping_mul(e.seq));
        self.local.3 = self.local.3.wrapping_add(e.value);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Halt> {
        let t = &self.tally;
        t.count.fetch_add(self.local.0, Ordering::AcqRel);
        t.seq_sum.fetch_add(self.local.1, Ordering::AcqRel);
        t.seq_square_sum.fetch_add(self.local.2, Ordering::AcqRel);
        t.value_sum.fetch_add(self.local.3, Ordering::AcqRel);
        self.local = (0, 0, 0, 0);
        Ok(())
    }
}

/// Pairs of a join (job files' `count` sink after a join): the tally counts pairs, and sums
/// the left events' sequence numbers (Σ seq, Σ seq²) and the right ones' (as `value_sum`).
impl Sink<crate::record::JoinedEvents> for CountingSink {
    fn write(&mut self, j: &crate::record::JoinedEvents) -> Result<(), Halt> {
        self.local.0 += 1;
        self.local.1 = self.local.1.wrapping_add(j.left.seq);
        self.local.2 = self.local.2.wrapping_add(j.left.seq.wrapping_mul(j.left.seq));
        self.local.3 = self.local.3.wrapping_add(j.right.seq);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Halt> {
        <CountingSink as Sink<Event>>::finish(self)
    }
}

/// Collects every record into a shared vector (for tests and small jobs).
#[derive(Debug)]
pub struct CollectSink<T> {
    out: Arc<Mutex<Vec<T>>>,
}

impl<T> CollectSink<T> {
    /// A sink pushing into `out`.
    pub fn new(out: Arc<Mutex<Vec<T>>>) -> CollectSink<T> {
        CollectSink { out }
    }
}

impl<T: Record + Clone> Sink<T> for CollectSink<T> {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        self.out.lock().unwrap_or_else(|e| e.into_inner()).push(record.clone());
        Ok(())
    }
}

/// Drops every record.
#[derive(Debug, Default)]
pub struct NullSink;

impl<T> Sink<T> for NullSink {
    #[inline]
    fn write(&mut self, _record: &T) -> Result<(), Halt> {
        Ok(())
    }
}

/// Sums `value` per key; emits `(key, running sum)` at the end. The simplest keyed operator.
#[derive(Debug, Default)]
pub struct SumPerKey {
    sums: std::collections::HashMap<u64, u64>,
}

impl super::KeyedProcess<Event, Event> for SumPerKey {
    fn process(&mut self, e: &Event, _kg: u32, _out: &mut dyn FnMut(&Event) -> Result<(), Halt>) -> Result<(), Halt> {
        *self.sums.entry(e.key).or_default() += e.value;
        Ok(())
    }

    fn finish(&mut self, out: &mut dyn FnMut(&Event) -> Result<(), Halt>) -> Result<(), Halt> {
        let mut keys: Vec<_> = self.sums.iter().collect();
        keys.sort();
        for (&key, &value) in keys {
            out(&Event { key, value, time_ns: 0, seq: key })?;
        }
        Ok(())
    }

    /// Every (key, sum), 16 bytes each, little-endian.
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        let mut out = Vec::with_capacity(self.sums.len() * 16);
        for (k, v) in &self.sums {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(out)
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), Halt> {
        if !state.len().is_multiple_of(16) {
            return Err(Halt::failed(format!("sum per key: {} bytes of state is not (key, sum) pairs", state.len())));
        }
        self.sums = state
            .chunks_exact(16)
            .map(|c| {
                let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
                (word(&c[..8]), word(&c[8..]))
            })
            .collect();
        Ok(())
    }
}
