//! Chain assembly: how the operators of one subtask are wired into one chain of plain
//! calls. Each user operator is wrapped in a *link* (a [`Collector`] that counts, calls the
//! operator, and passes records and signals on); the graph stores type-erased factories
//! for them (a graph holds nodes of many record types; each factory knows its own types and
//! checks them once, when a subtask is built).
//!
//! | file | links |
//! |---|---|
//! | `source.rs` | the source driver: polls a [`Source`], puts its position at barriers |
//! | `links.rs` | map, filter, flat_map, keyed process, and the tee that feeds several edges |
//! | `sink.rs` | the sink link: a [`Sink`]'s checkpoint hooks driven by signals |
//! | `decode.rs` | the chain head of a subtask fed by rings: decodes records in place |
//!
//! Layer: above the operator contracts and the subtask side of checkpoints, below the
//! exchange (whose ring writer is a chain's last link) and everything built on it.
//!
//! [`Source`]: crate::operators::Source
//! [`Sink`]: crate::operators::Sink

mod decode;
mod links;
mod sink;
mod source;

pub(crate) use decode::decoder_fn;
pub(crate) use links::{filter_fn, flat_map_fn, keyed_fn, keyed_state_fn, map_fn, tee_fn};
pub(crate) use sink::sink_fn;
pub(crate) use source::source_fn;

use crate::checkpoint::Snapshots;
use crate::operators::{Collector, Halt, OperatorError, Signal, SourcePoll, StateShard, SubtaskInfo, Wake, Work};
use std::any::Any;
use std::sync::Arc;
use weir_ring::counters::SharedCounter;

/// A `Box<dyn Collector<T>>` with its `T` erased.
pub(crate) type AnyCollector = Box<dyn Any + Send>;

/// Erase a collector's record type.
pub(crate) fn erase<T: 'static>(collector: Box<dyn Collector<T>>) -> AnyCollector {
    Box::new(collector)
}

/// Recover a collector's record type. A mismatch is a bug in the graph builder.
pub(crate) fn unerase<T: 'static>(collector: AnyCollector, node: &str) -> Box<dyn Collector<T>> {
    match collector.downcast::<Box<dyn Collector<T>>>() {
        Ok(c) => *c,
        Err(_) => panic!(
            "graph builder bug: node {node} was wired to a collector of another type than {}",
            std::any::type_name::<T>()
        ),
    }
}

/// Per node and subtask: records in and out; for windows (detached elsewhere) late records
/// and keys evicted to the state store; for sinks (empty elsewhere) the end-to-end latency
/// counters, in the order of [`crate::telemetry::counters::LATENCY`].
#[derive(Debug, Clone)]
pub(crate) struct NodeCounters {
    pub records_in: SharedCounter,
    pub records_out: SharedCounter,
    pub late_records: SharedCounter,
    pub evicted_keys: SharedCounter,
    pub latency: Vec<SharedCounter>,
}

/// What the runtime gives an operator besides its counters: its subtask's state shard
/// (stateful nodes with a RocksDB backend) and its subtask's checkpoint context.
#[derive(Debug, Clone, Default)]
pub(crate) struct OperatorEnv {
    pub shard: Option<StateShard>,
    pub snapshots: Snapshots,
    /// How often a source sends a latency marker (`JobConfig::latency_interval`).
    pub latency_interval: Option<std::time::Duration>,
}

/// Builds an operator's link, given its environment and what it feeds.
pub(crate) type LinkFn =
    Arc<dyn Fn(&SubtaskInfo, NodeCounters, &OperatorEnv, AnyCollector) -> AnyCollector + Send + Sync>;
/// Builds a source, given what it feeds.
pub(crate) type SourceFn =
    Arc<dyn Fn(&SubtaskInfo, NodeCounters, &OperatorEnv, AnyCollector) -> Box<dyn ErasedSource> + Send + Sync>;
/// Builds a sink link.
pub(crate) type SinkFn = Arc<dyn Fn(&SubtaskInfo, NodeCounters, &OperatorEnv) -> AnyCollector + Send + Sync>;
/// Wraps a node's input collector into a byte-level input (decoding from ring slots).
pub(crate) type DecoderFn = Arc<dyn Fn(AnyCollector, &str) -> Box<dyn ErasedInput> + Send + Sync>;
/// Joins several collectors of one type into one (a node whose output feeds several).
pub(crate) type TeeFn = Arc<dyn Fn(Vec<AnyCollector>, &str) -> AnyCollector + Send + Sync>;

/// A source with its record type erased.
pub(crate) trait ErasedSource: Send {
    fn poll(&mut self) -> Result<SourcePoll, Halt>;
    fn signal(&mut self, signal: Signal) -> Result<(), Halt>;
    /// Checkpoint `id` (`FINAL`: the source is exhausted): put the source's position, then
    /// send the barrier (or, for `FINAL`, end-of-stream) down the chain.
    fn barrier(&mut self, id: u64) -> Result<(), Halt>;
    /// Checkpoint `id` is durable: tell the source, then the chain.
    fn complete(&mut self, id: u64) -> Result<(), Halt>;
    /// [`Source::wait`].
    fn wait(&mut self, wake: &Wake<'_>, timeout: std::time::Duration) -> bool;
    /// [`Collector::poll_timers`] of the chain behind the source (a sink's retries): how
    /// soon it wants to run again.
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt>;
}

/// A chain head fed with encoded records.
pub(crate) trait ErasedInput: Send {
    fn on_bytes(&mut self, bytes: &[u8]) -> Result<(), Halt>;
    /// A run of data records laid end to end, `stride` bytes each (a fixed-stride frame's;
    /// a lone record is a run of one, its stride its length, 0 for an empty one): handed
    /// down the chain as one batch where the record type's layout allows it.
    fn on_run(&mut self, run: &[u8], stride: usize) -> Result<(), Halt>;
    fn signal(&mut self, signal: Signal) -> Result<(), Halt>;
    /// [`Collector::resume`] of the chain's head.
    fn resume(&mut self) -> Result<Work, Halt>;
    /// [`Collector::poll_timers`] of the chain's head.
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt>;
}

/// What `node` put into the checkpoint being restored, or the error that fails its subtask.
/// The bytes were written by an operator of `kind` (`source`, `sink`, `keyed`); bytes of
/// another version than `version` go through `migrate` first.
pub(super) fn restored(
    env: &OperatorEnv,
    node: &str,
    kind: &str,
    version: u32,
    migrate: &mut dyn FnMut(u32, Vec<u8>) -> Result<Vec<u8>, Halt>,
) -> Result<crate::checkpoint::Restored, Halt> {
    let mut convert = |from, bytes| migrate(from, bytes).map_err(|h| h.to_string());
    let mut expected = crate::checkpoint::Expected { kind, version, migrate: &mut convert };
    env.snapshots
        .restored(node, &mut expected)
        .map_err(|source| OperatorError::Restore { node: node.to_owned(), source }.into())
}

pub(super) struct Counted<T> {
    pub(super) down: Box<dyn Collector<T>>,
    pub(super) records: SharedCounter,
}

impl<T: 'static> Collector<T> for Counted<T> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        self.records.add(1);
        self.down.collect(record)
    }
    #[inline]
    fn collect_batch(&mut self, records: &[T]) -> Result<(), Halt> {
        self.records.add(records.len() as u64);
        self.down.collect_batch(records)
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.down.signal(signal)
    }
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        self.down.poll_timers()
    }
}
