//! Operator contracts and the built-in operators.
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
//! calls, before it reads any more input. Other work (a stop, a barrier later) so waits at
//! most one chunk.

pub mod builtin;
mod links;

pub(crate) use links::*;

use std::time::Duration;

/// Why processing stops early.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Halt {
    /// The job was cancelled (mailbox stop); not an error.
    #[error("stopped")]
    Stopped,
    /// Something failed; the message says what and where.
    #[error("{0}")]
    Failed(String),
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
}

/// Whether an operator left work for later (see [`Collector::resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Nothing pending: the chain may take more input.
    Done,
    /// More is pending: call `resume` again before giving the chain more input.
    More,
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
}

/// Consumes records at the end of a chain. One instance per sink subtask.
pub trait Sink<T>: Send {
    /// Take one record.
    fn write(&mut self, record: &T) -> Result<(), Halt>;
    /// All input ended: make everything durable / visible.
    fn finish(&mut self) -> Result<(), Halt> {
        Ok(())
    }
}

/// A keyed operator: one instance per subtask, called with each record and the key group
/// it belongs to; emits through `out`.
pub trait KeyedProcess<T, U>: Send {
    /// Process one record of key group `key_group`.
    fn process(&mut self, record: &T, key_group: u32, out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt>;
    /// End of input: emit what is left.
    fn finish(&mut self, _out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        Ok(())
    }
}

/// Which subtask an operator instance runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtaskInfo {
    /// The node's id.
    pub node: String,
    /// This subtask's index, `0..parallelism`.
    pub index: u32,
    /// The node's parallelism.
    pub parallelism: u32,
    /// Key groups of the job.
    pub max_key_groups: u32,
}

/// One shard of the job's state backend (one RocksDB instance per core), as a stateful
/// subtask pinned to that core gets it: where its keyed state lives beyond its caches.
#[derive(Clone)]
pub(crate) struct StateShard {
    backend: std::sync::Arc<crate::state::StateBackend>,
    shard: usize,
}

impl StateShard {
    pub(crate) fn new(backend: std::sync::Arc<crate::state::StateBackend>, shard: usize) -> StateShard {
        StateShard { backend, shard }
    }

    /// The state of `operator` in this shard (its column family, created if new).
    pub(crate) fn store(&self, operator: &str) -> Result<crate::state::Store, crate::state::StateError> {
        self.backend.store(operator, self.shard)
    }
}

impl std::fmt::Debug for StateShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateShard").field("shard", &self.shard).finish()
    }
}

impl PartialEq for StateShard {
    fn eq(&self, other: &StateShard) -> bool {
        std::sync::Arc::ptr_eq(&self.backend, &other.backend) && self.shard == other.shard
    }
}

impl Eq for StateShard {}

impl SubtaskInfo {
    /// The key groups this subtask owns when its input is hash-partitioned: a contiguous range.
    pub fn key_groups(&self) -> std::ops::Range<u32> {
        crate::exchange::key_group_range(self.index, self.parallelism, self.max_key_groups)
    }

    /// `node#index`, as threads and counters are named.
    pub fn name(&self) -> String {
        format!("{}#{}", self.node, self.index)
    }
}
