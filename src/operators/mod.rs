//! Operator contracts and the built-in operators.
//!
//! Layer: above records, telemetry, state and the subtask side of checkpoints (a failed
//! restore is a typed checkpoint error); below everything that runs operators (chain
//! assembly, the exchange and up).
//!
//! What a user writes: a [`Source`] (produces records), closures for map / filter /
//! flat_map, a [`Sink`] (consumes records). What the runtime composes them into: a chain of
//! [`Collector`]s, one per operator, each calling the next with `&T` — plain calls, no ring —
//! ending in a ring writer or a sink. [`Signal`]s (flush, watermarks, end of stream; barriers
//! later) travel down the same chain, so chained operators see them in order with the records.
//!
//! An operator that has more to do than one call should take (windows firing by the
//! thousand when a watermark passes) does it in bounded chunks: it says [`Work::More`] from
//! [`Collector::resume`], and the subtask calls `resume` again, checking its mailbox between
//! calls, before it reads any more input. Other work (a stop) so waits at most one chunk.
//! An operator whose pending work tolerates input in between says [`Work::Interleave`]: the
//! subtask then reads a bounded number of records (and barriers, and watermarks) between
//! chunks, so a checkpoint barrier does not wait for a firing that the sink paces to take
//! seconds (Flink's interruptible timers, FLIP-443).

pub mod builtin;
mod error;
pub mod join;
pub mod outside;
pub mod timers;

pub use crate::checkpoint::{LatePart, Rescaled};
pub(crate) use error::panic_message;
pub use error::{Failure, OperatorError, OperatorFailure};

use std::time::Duration;

/// Why processing stops early.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Halt {
    /// The job was cancelled (mailbox stop); not an error.
    #[error("stopped")]
    Stopped,
    /// Something failed: the typed error says what and where, and why.
    #[error("{0}")]
    Failed(Failure),
}

impl Halt {
    /// A failure described by text alone (for operators without an error type of their own).
    pub fn failed(text: impl Into<String>) -> Halt {
        Halt::Failed(Failure::msg(text))
    }

    /// The failure, if this is one.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Halt::Failed(f) => Some(f),
            Halt::Stopped => None,
        }
    }
}

impl<E: OperatorFailure> From<E> for Halt {
    fn from(e: E) -> Halt {
        Halt::Failed(Failure::new(e))
    }
}

/// An in-band event that travels down a chain in order with the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// End of a batch: publish what was written (ring writers), nothing else changes.
    Flush,
    /// Event time has advanced: records with an event time below this many ns are complete
    /// (a later one is late). Ring writers send it on every channel; input gates forward the
    /// minimum over their channels ([`crate::time`]). `u64::MAX` means the input ended.
    Watermark(u64),
    /// End of input: flush operator state, send end-of-stream downstream, close.
    End,
    /// Checkpoint barrier n: everything before it belongs to checkpoint n. Each operator
    /// snapshots its state as the barrier passes it, then passes it on; ring writers send
    /// it on every channel ([`crate::checkpoint`]).
    Barrier(u64),
    /// Checkpoint n is durable (its manifest is written): sinks make what they prepared for
    /// it visible, sources commit offsets for monitoring. Not sent across rings: the
    /// coordinator tells every subtask itself.
    CheckpointComplete(u64),
    /// A latency marker ([`LatencyMarker`]): sources send one after a record every
    /// `JobConfig::latency_interval`; it queues behind the records before it in every ring
    /// and each sink measures, when the destination has acknowledged everything written
    /// before it, how long ago its record entered the job and what event time it had.
    /// Operators pass it on at once (a window, which holds records, sends its own when it
    /// fires instead); a ring writer sends it on one channel, in turn.
    Latency(LatencyMarker),
}

/// A sample of end-to-end latency in flight: when the record before it entered the job
/// and its event time. (Flink's latency markers measure the first only and skip operators'
/// buffering; weir's windows re-stamp them with what they fire, so a sink after a window
/// measures its results' latency.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencyMarker {
    /// Wall clock, ns since the Unix epoch, when the record entered the job (its source
    /// emitted it); 0: not known.
    pub ingest_ns: u64,
    /// The record's event time, ns (the newest the source had emitted; a window's result:
    /// the window's end); 0: not known or not on the wall clock.
    pub event_ns: u64,
}

impl LatencyMarker {
    /// The marker's bytes in a ring (16, little-endian).
    pub(crate) fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.ingest_ns.to_le_bytes());
        out[8..].copy_from_slice(&self.event_ns.to_le_bytes());
        out
    }

    /// A marker from its ring bytes (`None`: not 16 bytes).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<LatencyMarker> {
        let b: &[u8; 16] = bytes.try_into().ok()?;
        let (ingest, event) = b.split_at(8);
        Some(LatencyMarker {
            ingest_ns: u64::from_le_bytes(ingest.try_into().ok()?),
            event_ns: u64::from_le_bytes(event.try_into().ok()?),
        })
    }
}

/// Wall clock, ns since the Unix epoch (0 before it).
pub(crate) fn unix_now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Whether an operator left work for later (see [`Collector::resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Nothing pending: the chain may take more input.
    Done,
    /// More is pending: call `resume` again before giving the chain more input.
    More,
    /// More is pending, and the chain may take up to this many data records — and any
    /// barrier or watermark — before `resume` is called again. The operator keeps what it
    /// emits in order with the watermarks itself (a window holds a watermark that arrives
    /// during a firing until the firing is done).
    Interleave(usize),
}

/// The receiving end of an operator: takes records one at a time, by reference.
///
/// Only the head of a chain can leave work pending or own timers: operators with state
/// (keyed operators, windows) always follow a hash exchange, which is never chained, so they
/// head their chain. The defaults of [`resume`](Collector::resume) and
/// [`poll_timers`](Collector::poll_timers) (nothing pending, no timers) are right for every
/// other link.
pub trait Collector<T: ?Sized>: Send {
    /// Process one record fully (including emitting downstream).
    fn collect(&mut self, record: &T) -> Result<(), Halt>;
    /// Process `records` in order, as `collect` one by one would (the default does that; the
    /// first error ends the batch — a link that works on the whole batch first may have
    /// counted or called its function on records past the one that failed). The runtime hands records from a ring's
    /// fixed-stride frames down a chain in batches, so a link that does its per-record work
    /// in one loop (and passes a batch on) saves a call per record per link.
    fn collect_batch(&mut self, records: &[T]) -> Result<(), Halt>
    where
        T: Sized,
    {
        for record in records {
            self.collect(record)?;
        }
        Ok(())
    }
    /// Handle a signal and pass it on downstream.
    fn signal(&mut self, signal: Signal) -> Result<(), Halt>;
    /// Do one bounded chunk of pending work (firing windows); say whether more is left. The
    /// subtask calls this before it reads input, and reads none while it says `More`.
    fn resume(&mut self) -> Result<Work, Halt> {
        Ok(Work::Done)
    }
    /// Processing time: note the time, start what is due (as pending work), and say how
    /// soon to call again (`None`: no timer). Called once per pass of the subtask's loop;
    /// the loop also wakes from a park for it.
    fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
        Ok(None)
    }
}

/// What a source poll did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePoll {
    /// Emitted this many records; poll again soon.
    Emitted(usize),
    /// Nothing to emit now; poll again after at most this long (the subtask parks meanwhile
    /// and also wakes on its mailbox).
    Idle(Duration),
    /// The source is exhausted: the subtask sends end-of-stream and finishes.
    Finished,
}

/// Produces records. One instance per source subtask, built by the factory given to
/// [`crate::graph::Job::source`], which is told the subtask's index and the parallelism.
///
/// Contract: `poll` emits a bounded batch (the runtime checks its mailbox and flushes outputs
/// between polls) and returns; emitting may block while the output has no credit — that is
/// backpressure, and the source does nothing meanwhile (a Kafka source stops polling Kafka).
pub trait Source<T>: Send {
    /// Emit up to a batch of records into `out`.
    fn poll(&mut self, out: &mut dyn Collector<T>) -> Result<SourcePoll, Halt>;
    /// Checkpoint `checkpoint_id`: the position to resume from (after every record emitted
    /// so far), as bytes. Called between polls; barrier `checkpoint_id` follows at once.
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        Ok(Vec::new())
    }
    /// Called once before the first poll: `Some((id, bytes))` with what `snapshot` returned
    /// when the job restores checkpoint `id`, `None` on a fresh start.
    fn restore(&mut self, _from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        Ok(())
    }
    /// Called once before the first poll, instead of [`restore`](Source::restore), when the
    /// checkpoint was taken with this node at another parallelism: every old subtask's
    /// bytes, to take this subtask's share of (a Kafka source takes the offsets of the
    /// partitions it owns now). The default accepts only a source without state of its own
    /// (every old part empty) and refuses the restore otherwise, saying why.
    fn restore_rescaled(&mut self, from: &Rescaled) -> Result<(), Halt> {
        if from.is_empty() {
            self.restore(Some((from.checkpoint_id, &[])))
        } else {
            Err(Halt::failed(from.refusal("source")))
        }
    }
    /// The version of the bytes [`snapshot`](Source::snapshot) writes: 0 (the default) until
    /// their format changes. Checkpoints record it beside the bytes ([`crate::checkpoint::upgrade`]);
    /// a restore of bytes of another version goes through [`migrate_state`](Source::migrate_state) first.
    fn state_version(&self) -> u32 {
        0
    }
    /// Convert checkpoint bytes written at version `from` into bytes of
    /// [`state_version`](Source::state_version), before they are restored. The default has no
    /// conversion: a restore of another version is refused, naming the node and both versions.
    fn migrate_state(&mut self, from: u32, bytes: Vec<u8>) -> Result<Vec<u8>, Halt> {
        let _ = bytes;
        Err(Halt::failed(format!("it has no conversion from version {from} (implement migrate_state)")))
    }
    /// Checkpoint `checkpoint_id` is durable (e.g. commit offsets to Kafka, for lag
    /// monitoring only: the checkpoint is the truth).
    fn checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<(), Halt> {
        Ok(())
    }
    /// After `poll` said [`SourcePoll::Idle`]: wait for input or for `wake`, at most
    /// `timeout`, and say `true`; or say `false` (the default) and the runtime parks on the
    /// subtask's mailbox for the timeout. A source with its own readiness signal (a Kafka
    /// queue's event fd) waits on both at once, so it neither spins nor sleeps blindly.
    fn wait(&mut self, _wake: &Wake<'_>, _timeout: Duration) -> bool {
        false
    }
    /// The event time of the newest record emitted so far, ns, if this source knows event
    /// times itself (a Kafka source with per-partition watermarks): latency markers carry
    /// it. `None` (the default): the stream's `with_event_time` fills it in, if any.
    fn event_time(&self) -> Option<u64> {
        None
    }
}

/// The subtask's wake-up, for a [`Source`] that waits by itself: a futex word (the mailbox
/// doorbell) and the value it had when the subtask last looked. The source must return
/// from [`Source::wait`] once the word differs from [`expected`](Wake::expected) (a stop
/// or a checkpoint trigger is waiting).
#[derive(Debug)]
pub struct Wake<'a> {
    word: &'a std::sync::atomic::AtomicU32,
    expected: u32,
}

impl<'a> Wake<'a> {
    pub(crate) fn new(word: &'a std::sync::atomic::AtomicU32, expected: u32) -> Wake<'a> {
        Wake { word, expected }
    }

    /// The futex word (32 bits, shared; wait with FUTEX_WAIT or io_uring's FutexWait).
    pub fn word(&self) -> &'a std::sync::atomic::AtomicU32 {
        self.word
    }

    /// Its value when the subtask last looked: wake when the word differs.
    pub fn expected(&self) -> u32 {
        self.expected
    }

    /// Whether the word moved already (something is waiting for the subtask).
    pub fn is_woken(&self) -> bool {
        self.word.load(std::sync::atomic::Ordering::Acquire) != self.expected
    }
}

/// Consumes records at the end of a chain. One instance per sink subtask.
pub trait Sink<T>: Send {
    /// Take one record.
    fn write(&mut self, record: &T) -> Result<(), Halt>;
    /// All input ended: make everything durable / visible.
    fn finish(&mut self) -> Result<(), Halt> {
        Ok(())
    }
    /// Checkpoint `checkpoint_id`, in band after every record before its barrier:
    /// pre-commit (make what was written durable, not yet visible) and return what
    /// [`restore`](Sink::restore) needs (pending part names, transactional ids).
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        Ok(Vec::new())
    }
    /// Checkpoint `part.checkpoint_id()` (not the final one), with the bytes put through
    /// `part` now or later: a sink whose writes are on their way to the destination when the
    /// barrier comes may wait — without blocking, the records after the barrier flowing —
    /// until the destination has them, and put their names rather than the writes
    /// themselves. The subtask's ack, so the checkpoint, waits for the part; the sink puts it
    /// within a deadline of its own (falling back to what `snapshot` returns), and before
    /// its next `snapshot`. The default puts what [`snapshot`](Sink::snapshot) returns at once.
    fn snapshot_later(&mut self, part: LatePart) -> Result<(), Halt> {
        let bytes = self.snapshot(part.checkpoint_id())?;
        part.put(&bytes);
        Ok(())
    }
    /// Called once before the first write: `Some((id, bytes))` with what `snapshot` returned
    /// when the job restores checkpoint `id` (commit what it prepared if that did not happen
    /// yet, discard what was written after it), `None` on a fresh start.
    fn restore(&mut self, _from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        Ok(())
    }
    /// Called once before the first write, instead of [`restore`](Sink::restore), when the
    /// checkpoint was taken with this node at another parallelism: every old subtask's
    /// bytes. What an old subtask prepared must be committed once, so a sink usually takes
    /// [`Rescaled::split`]'s share. The default accepts only a sink without state of its
    /// own (every old part empty) and refuses the restore otherwise, saying why.
    fn restore_rescaled(&mut self, from: &Rescaled) -> Result<(), Halt> {
        if from.is_empty() {
            self.restore(Some((from.checkpoint_id, &[])))
        } else {
            Err(Halt::failed(from.refusal("sink")))
        }
    }
    /// The version of the bytes [`snapshot`](Sink::snapshot) writes: 0 (the default) until
    /// their format changes. Checkpoints record it beside the bytes ([`crate::checkpoint::upgrade`]);
    /// a restore of bytes of another version goes through [`migrate_state`](Sink::migrate_state) first.
    fn state_version(&self) -> u32 {
        0
    }
    /// Convert checkpoint bytes written at version `from` into bytes of
    /// [`state_version`](Sink::state_version), before they are restored. The default has no
    /// conversion: a restore of another version is refused, naming the node and both versions.
    fn migrate_state(&mut self, from: u32, bytes: Vec<u8>) -> Result<Vec<u8>, Halt> {
        let _ = bytes;
        Err(Halt::failed(format!("it has no conversion from version {from} (implement migrate_state)")))
    }
    /// Checkpoint `checkpoint_id` is durable: make visible what was prepared for it and
    /// for every checkpoint before it.
    fn checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<(), Halt> {
        Ok(())
    }
    /// The input's watermark advanced to `w` (records with event times below it are
    /// complete). Most sinks ignore it; one that names its output by event time (the HTTP
    /// sink's idempotency keys) releases what `w` completes.
    fn watermark(&mut self, _w: u64) -> Result<(), Halt> {
        Ok(())
    }
    /// Processing time, while no record comes: do what is due (a retry, a request past its
    /// timeout) and say how soon to call again (`None`: nothing pending). Called on every
    /// pass of the subtask's loop (and at least every park backstop), so a sink waiting on
    /// a peer notices deadlines without new input.
    fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
        Ok(None)
    }
    /// Records this subtask has had acknowledged by its destination since it started (HTTP
    /// 2xx, a Kafka delivery report; records dead-lettered count too: they are settled).
    /// A latency marker is acknowledged once this reaches the records written before it.
    /// `None` (the default): a sink whose `write` is its acknowledgement.
    fn acknowledged(&self) -> Option<u64> {
        None
    }
}

/// A boxed sink is a sink (every hook forwarded: a box that dropped one would lose the
/// checkpoint behaviour of what it holds).
impl<T> Sink<T> for Box<dyn Sink<T>> {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        (**self).write(record)
    }
    fn finish(&mut self) -> Result<(), Halt> {
        (**self).finish()
    }
    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        (**self).snapshot(checkpoint_id)
    }
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        (**self).restore(from)
    }
    fn restore_rescaled(&mut self, from: &Rescaled) -> Result<(), Halt> {
        (**self).restore_rescaled(from)
    }
    fn state_version(&self) -> u32 {
        (**self).state_version()
    }
    fn migrate_state(&mut self, from: u32, bytes: Vec<u8>) -> Result<Vec<u8>, Halt> {
        (**self).migrate_state(from, bytes)
    }
    fn checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        (**self).checkpoint_complete(checkpoint_id)
    }
    fn watermark(&mut self, w: u64) -> Result<(), Halt> {
        (**self).watermark(w)
    }
    fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
        (**self).poll_timers()
    }
    fn acknowledged(&self) -> Option<u64> {
        (**self).acknowledged()
    }
}

/// A boxed source is a source (every hook forwarded).
impl<T> Source<T> for Box<dyn Source<T>> {
    fn poll(&mut self, out: &mut dyn Collector<T>) -> Result<SourcePoll, Halt> {
        (**self).poll(out)
    }
    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        (**self).snapshot(checkpoint_id)
    }
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        (**self).restore(from)
    }
    fn restore_rescaled(&mut self, from: &Rescaled) -> Result<(), Halt> {
        (**self).restore_rescaled(from)
    }
    fn state_version(&self) -> u32 {
        (**self).state_version()
    }
    fn migrate_state(&mut self, from: u32, bytes: Vec<u8>) -> Result<Vec<u8>, Halt> {
        (**self).migrate_state(from, bytes)
    }
    fn checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        (**self).checkpoint_complete(checkpoint_id)
    }
    fn wait(&mut self, wake: &Wake<'_>, timeout: Duration) -> bool {
        (**self).wait(wake, timeout)
    }
    fn event_time(&self) -> Option<u64> {
        (**self).event_time()
    }
}

/// A keyed operator: one instance per subtask, called with each record and the key group
/// it belongs to; emits through `out`.
pub trait KeyedProcess<T, U>: Send {
    /// Process one record of key group `key_group`.
    fn process(&mut self, record: &T, key_group: u32, out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt>;
    /// The input's watermark advanced to `watermark` (ns; no record with an earlier event
    /// time will come): fire what it completes — event-time timers
    /// ([`timers::EventTimers`]), closed join intervals, expired state — emitting through
    /// `out`. Called in the subtask's loop before the watermark goes downstream, so what
    /// it emits is not late there. `u64::MAX` when the input ended (then `finish`).
    fn on_watermark(&mut self, _watermark: u64, _out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        Ok(())
    }
    /// Records this instance dropped for coming too late, so far (a join's records behind
    /// the watermark): the runtime adds what it grew by to the node's `late records`
    /// counter (`NodeSummary::late_records`, the counters file) after each call.
    fn late_records(&self) -> u64 {
        0
    }
    /// Whether this operator keeps processing-time timers: if so, the subtask calls
    /// [`on_processing_time`](KeyedProcess::on_processing_time) on every pass of its loop
    /// (one clock read each); if not (the default), never.
    fn processing_timers(&self) -> bool {
        false
    }
    /// Processing time is `now_ns` (the wall clock, ns since the Unix epoch): fire the
    /// processing-time timers due, emitting through `out`, and say when the next one is due
    /// (ns since the epoch; `None`: none). The subtask's loop wakes for it — no timer thread —
    /// so a timer fires while no record comes. Keep them in an
    /// [`timers::EventTimers`] keyed by wall-clock time. Pending ones do not fire when the
    /// input ends (as in Flink).
    fn on_processing_time(
        &mut self,
        _now_ns: u64,
        _out: &mut dyn FnMut(&U) -> Result<(), Halt>,
    ) -> Result<Option<u64>, Halt> {
        Ok(None)
    }
    /// End of input: emit what is left.
    fn finish(&mut self, _out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        Ok(())
    }
    /// Checkpoint `checkpoint_id`: this instance's state as bytes (an operator that keeps
    /// its state in memory must return all of it, or a restart loses it).
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        Ok(Vec::new())
    }
    /// Called once before the first record when the job restores a checkpoint: what
    /// `snapshot` returned.
    fn restore(&mut self, _state: &[u8]) -> Result<(), Halt> {
        Ok(())
    }
    /// Called instead of [`restore`](KeyedProcess::restore) when the checkpoint was taken
    /// with this node at another parallelism: every old subtask's bytes, from which this
    /// instance keeps the state of its key groups (`SubtaskInfo::key_groups`). The default
    /// accepts only an operator without state of its own and refuses the restore otherwise.
    fn restore_rescaled(&mut self, from: &Rescaled) -> Result<(), Halt> {
        if from.is_empty() { self.restore(&[]) } else { Err(Halt::failed(from.refusal("keyed operator"))) }
    }
    /// The version of the bytes [`snapshot`](KeyedProcess::snapshot) writes: 0 (the default) until
    /// their format changes. Checkpoints record it beside the bytes ([`crate::checkpoint::upgrade`]);
    /// a restore of bytes of another version goes through [`migrate_state`](KeyedProcess::migrate_state) first.
    fn state_version(&self) -> u32 {
        0
    }
    /// Convert checkpoint bytes written at version `from` into bytes of
    /// [`state_version`](KeyedProcess::state_version), before they are restored. The default has no
    /// conversion: a restore of another version is refused, naming the node and both versions.
    fn migrate_state(&mut self, from: u32, bytes: Vec<u8>) -> Result<Vec<u8>, Halt> {
        let _ = bytes;
        Err(Halt::failed(format!("it has no conversion from version {from} (implement migrate_state)")))
    }
}

/// Which subtask an operator instance runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtaskInfo {
    /// The job's name.
    pub job: String,
    /// The node's id.
    pub node: String,
    /// This subtask's index, `0..parallelism`.
    pub index: u32,
    /// The node's parallelism.
    pub parallelism: u32,
    /// Key groups of the job.
    pub max_key_groups: u32,
    /// When the job runs as one of several instances (`weir run --instance`): whether this
    /// subtask's input partition is this instance's. Subtask `i` of every node then serves
    /// partition `i` of the lead input, its keys stay in it, and a subtask of a partition the
    /// instance does not own is dormant (its sources read nothing, its sinks open nothing).
    /// `None`: the job runs alone.
    pub owned: Option<bool>,
}

/// One shard of the job's state backend (one RocksDB instance per core), as a stateful
/// subtask pinned to that core gets it: where its keyed state lives beyond its caches.
#[cfg(feature = "rocksdb")]
#[derive(Clone)]
pub(crate) struct StateShard {
    backend: std::sync::Arc<crate::state::StateBackend>,
    shard: usize,
}

/// No state backend in a build without the `rocksdb` feature: no shard exists.
#[cfg(not(feature = "rocksdb"))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StateShard {}

#[cfg(feature = "rocksdb")]
impl StateShard {
    pub(crate) fn new(backend: std::sync::Arc<crate::state::StateBackend>, shard: usize) -> StateShard {
        StateShard { backend, shard }
    }

    /// The state of `operator` in this shard (its column family, created if new).
    pub(crate) fn store(&self, operator: &str) -> Result<crate::state::Store, crate::state::StateError> {
        self.backend.store(operator, self.shard)
    }
}

#[cfg(feature = "rocksdb")]
impl std::fmt::Debug for StateShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateShard").field("shard", &self.shard).finish()
    }
}

#[cfg(feature = "rocksdb")]
impl PartialEq for StateShard {
    fn eq(&self, other: &StateShard) -> bool {
        std::sync::Arc::ptr_eq(&self.backend, &other.backend) && self.shard == other.shard
    }
}

#[cfg(feature = "rocksdb")]
impl Eq for StateShard {}

impl SubtaskInfo {
    /// The key groups this subtask owns when its input is hash-partitioned: a contiguous range.
    pub fn key_groups(&self) -> std::ops::Range<u32> {
        crate::record::key_group_range(self.index, self.parallelism, self.max_key_groups)
    }

    /// Whether this subtask serves input: always, unless the job runs as one of several
    /// instances and this subtask's partition belongs to another.
    pub fn is_owned(&self) -> bool {
        self.owned != Some(false)
    }

    /// How a key of this subtask's input finds its key group: hashed over the job's key
    /// groups, or, in an instance of a job run by several (where a subtask's keys are those of
    /// one input partition), within this subtask's own range, so that the partition's state
    /// is one contiguous range that moves with it.
    pub fn key_groups_of_keys(&self) -> crate::record::KeyGroups {
        match self.owned {
            None => crate::record::KeyGroups::new(1, self.max_key_groups),
            Some(_) => crate::record::KeyGroups::within(self.key_groups()),
        }
    }

    /// `node#index`, as threads and counters are named.
    pub fn name(&self) -> String {
        format!("{}#{}", self.node, self.index)
    }
}
