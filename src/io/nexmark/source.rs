//! The Nexmark source: the `nexmark` crate's generator in a source subtask.

use super::{NexmarkConfig, NexmarkEvent, NexmarkStats};
use crate::operators::{Collector, Halt, Source, SourcePoll, SubtaskInfo};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir_ring::process::thread_cpu_time;

/// Events generated per poll (the subtask checks its mailbox and flushes between polls).
const POLL_EVENTS: usize = 256;
/// Events handed down the chain at once.
const EMIT_EVENTS: usize = 64;

/// What a source makes of each generated event: `(offset in the sequence, event)` → a
/// record, or none.
pub type Projection<T> = Arc<dyn Fn(u64, NexmarkEvent) -> Option<T> + Send + Sync>;

/// A source subtask's share of a Nexmark event sequence ([`NexmarkConfig`]): offsets
/// `index, index + parallelism, ...` below `events`, each made by the crate's generator
/// (`EventGenerator::with_offset(..).with_step(..)`), so the job's subtasks together emit
/// the sequence once, and the same settings give the same events. Checkpoints record the
/// next offset; a restore at another parallelism is refused (each subtask's offsets depend
/// on it).
///
/// The CPU time spent generating events (and dropping them once emitted) is measured per
/// poll with the thread's CPU clock and added to [`NexmarkStats::generator_cpu_ns`].
///
/// ```no_run
/// use weir::graph::Job;
/// use weir::io::nexmark::{NexmarkConfig, NexmarkEvent, NexmarkSource};
/// use weir::operators::builtin::NullSink;
///
/// let config = NexmarkConfig::new(Some(1_000_000), 10_000_000, 1_735_689_600_000);
/// let job = Job::new("bids");
/// job.source("nexmark", 2, move |info| NexmarkSource::new(&config, info))
///     .filter("bids", |e: &NexmarkEvent| e.as_bid().is_some())
///     .sink("out", 2, |_| NullSink);
/// job.run().expect("job runs");
/// ```
pub struct NexmarkSource<T = NexmarkEvent> {
    generator: nexmark::EventGenerator,
    /// The next offset to emit (the generator's, once the batch is out).
    next: u64,
    step: u64,
    /// Offsets from here on are not this job's.
    end: u64,
    make: Projection<T>,
    /// The events of the current poll; emitted in pieces, dropped at the next poll.
    batch: Vec<T>,
    /// Offsets the batch covers (events a projection dropped included).
    batch_offsets: u64,
    stats: Arc<NexmarkStats>,
    /// Rate-limited: when this subtask's first event was due, and its event time.
    pace: Option<Option<(Instant, u64)>>,
    dormant: bool,
}

impl<T> std::fmt::Debug for NexmarkSource<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NexmarkSource").field("next", &self.next).field("step", &self.step).finish()
    }
}

impl NexmarkSource<NexmarkEvent> {
    /// Subtask `info.index` of `info.parallelism`'s share of `config`'s sequence.
    pub fn new(config: &NexmarkConfig, info: &SubtaskInfo) -> NexmarkSource<NexmarkEvent> {
        NexmarkSource::with_projection(config, info, Arc::new(|_: u64, e: NexmarkEvent| Some(e)))
    }
}

impl<T> NexmarkSource<T> {
    /// Like [`NexmarkSource::new`], each event made into a record by `make` (given its offset
    /// in the sequence), or dropped (`None`). `make` runs in the source's thread and counts as
    /// generator time.
    pub fn with_projection(config: &NexmarkConfig, info: &SubtaskInfo, make: Projection<T>) -> NexmarkSource<T> {
        let (start, step) = (u64::from(info.index), u64::from(info.parallelism.max(1)));
        NexmarkSource {
            generator: nexmark::EventGenerator::new(config.generator()).with_offset(start).with_step(step),
            next: start,
            step,
            end: config.events.unwrap_or(u64::MAX),
            make,
            batch: Vec::with_capacity(POLL_EVENTS),
            batch_offsets: 0,
            stats: config.stats.clone(),
            pace: config.rate_limited.then_some(None),
            dormant: !info.is_owned(),
        }
    }

    /// The next offset this subtask emits.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// How many of the next events are due now (rate-limited), or how long until one is.
    fn due(&mut self, want: usize) -> Result<usize, Duration> {
        let Some(pace) = &mut self.pace else { return Ok(want) };
        let now = Instant::now();
        let (origin, first_ms) = *pace.get_or_insert((now, self.generator.timestamp()));
        let elapsed_ms = now.duration_since(origin).as_millis() as u64;
        let mut probe = self.generator.clone();
        let mut n = 0;
        while n < want && self.next + n as u64 * self.step < self.end {
            let ts = probe.timestamp();
            if ts.saturating_sub(first_ms) > elapsed_ms {
                break;
            }
            n += 1;
            let next = probe.offset() + self.step;
            probe = probe.with_offset(next);
        }
        if n > 0 {
            return Ok(n);
        }
        let wait = Duration::from_millis(probe.timestamp().saturating_sub(first_ms) - elapsed_ms);
        // The subtask keeps answering its mailbox: wait at most 100 ms at a time.
        Err(wait.clamp(Duration::from_micros(50), Duration::from_millis(100)))
    }
}

impl<T: Send> Source<T> for NexmarkSource<T> {
    fn poll(&mut self, out: &mut dyn Collector<T>) -> Result<SourcePoll, Halt> {
        let started = thread_cpu_time();
        // Drop the last poll's events (their strings) inside the generator's time.
        self.batch.clear();
        if self.dormant || self.next >= self.end {
            self.stats.generator_cpu_ns.fetch_add(elapsed_ns(started), Ordering::Relaxed);
            return Ok(SourcePoll::Finished);
        }
        let left = (self.end - self.next).div_ceil(self.step);
        let want = (POLL_EVENTS as u64).min(left) as usize;
        let n = match self.due(want) {
            Ok(n) => n,
            Err(wait) => {
                self.stats.generator_cpu_ns.fetch_add(elapsed_ns(started), Ordering::Relaxed);
                return Ok(SourcePoll::Idle(wait));
            }
        };
        for _ in 0..n {
            let offset = self.generator.offset();
            let event = self.generator.next().expect("the generator is endless");
            if let Some(record) = (self.make)(offset, event.into()) {
                self.batch.push(record);
            }
        }
        self.batch_offsets = n as u64;
        self.stats.generator_cpu_ns.fetch_add(elapsed_ns(started), Ordering::Relaxed);
        for piece in self.batch.chunks(EMIT_EVENTS) {
            if let Err(halt) = out.collect_batch(piece) {
                // Stopping: what was not emitted is generated again from the checkpoint.
                self.generator = self.generator.clone().with_offset(self.next);
                return Err(halt);
            }
        }
        self.next += self.batch_offsets * self.step;
        self.stats.events.fetch_add(self.batch.len() as u64, Ordering::Relaxed);
        Ok(SourcePoll::Emitted(self.batch.len()))
    }

    /// The next offset: the source resumes there.
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        Ok(self.next.to_le_bytes().to_vec())
    }

    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        let Some((id, bytes)) = from else { return Ok(()) };
        let next = bytes.try_into().map(u64::from_le_bytes).map_err(|_| {
            Halt::failed(format!("nexmark source: checkpoint {id} holds {} bytes, not an offset", bytes.len()))
        })?;
        if next % self.step != self.next % self.step {
            return Err(Halt::failed(format!(
                "nexmark source: checkpoint {id} resumes at offset {next}, which is not this subtask's \
                 (offsets {} + k × {}); restore it at the parallelism it was taken with",
                self.next, self.step
            )));
        }
        self.next = next;
        self.generator = self.generator.clone().with_offset(next);
        Ok(())
    }
}

fn elapsed_ns(since: Duration) -> u64 {
    thread_cpu_time().saturating_sub(since).as_nanos() as u64
}
