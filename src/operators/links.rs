//! The runtime's side of operators: each user operator wrapped in a link of a chain, and
//! the type-erased factories the graph stores (a graph holds nodes of many record types;
//! each factory knows its own types and checks them once, when a subtask is built).

use super::{Collector, Halt, KeyedProcess, Signal, Sink, Source, SourcePoll, StateShard, SubtaskInfo, Wake, Work};
use crate::checkpoint::{FINAL, Snapshots};
use crate::record::Record;
use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;
use weir_ring::counters::Counter;

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
/// and keys evicted to the state store.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeCounters {
    pub records_in: Counter,
    pub records_out: Counter,
    pub late_records: Counter,
    pub evicted_keys: Counter,
}

/// What the runtime gives an operator besides its counters: its subtask's state shard
/// (stateful nodes with a RocksDB backend) and its subtask's checkpoint context.
#[derive(Debug, Clone, Default)]
pub(crate) struct OperatorEnv {
    pub shard: Option<StateShard>,
    pub snapshots: Snapshots,
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
}

/// A chain head fed with encoded records.
pub(crate) trait ErasedInput: Send {
    fn on_bytes(&mut self, bytes: &[u8]) -> Result<(), Halt>;
    fn signal(&mut self, signal: Signal) -> Result<(), Halt>;
    /// [`Collector::resume`] of the chain's head.
    fn resume(&mut self) -> Result<Work, Halt>;
    /// [`Collector::poll_timers`] of the chain's head.
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt>;
}

struct Counted<T> {
    down: Box<dyn Collector<T>>,
    records: Counter,
}

impl<T: 'static> Collector<T> for Counted<T> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        self.records.add(1);
        self.down.collect(record)
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.down.signal(signal)
    }
}

struct SourceDriver<T> {
    source: Box<dyn Source<T>>,
    out: Counted<T>,
    node: String,
    snapshots: Snapshots,
    /// `restore` failed: the first poll fails with this.
    broken: Option<Halt>,
}

impl<T: 'static> ErasedSource for SourceDriver<T> {
    fn poll(&mut self) -> Result<SourcePoll, Halt> {
        if let Some(h) = self.broken.take() {
            return Err(h);
        }
        self.source.poll(&mut self.out)
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.out.signal(signal)
    }
    fn barrier(&mut self, id: u64) -> Result<(), Halt> {
        if self.snapshots.enabled() {
            match self.source.snapshot(id) {
                Ok(bytes) => self.snapshots.put_blob(&self.node, id, &bytes),
                Err(h) => self.snapshots.decline(format!("source {}: {h}", self.node)),
            }
        }
        self.out.signal(if id == FINAL { Signal::End } else { Signal::Barrier(id) })
    }
    fn complete(&mut self, id: u64) -> Result<(), Halt> {
        self.source.checkpoint_complete(id)?;
        self.out.signal(Signal::CheckpointComplete(id))
    }
    fn wait(&mut self, wake: &Wake<'_>, timeout: std::time::Duration) -> bool {
        self.source.wait(wake, timeout)
    }
}

/// What `node` put into the checkpoint being restored, or the error that fails its subtask.
fn restored(env: &OperatorEnv, node: &str) -> Result<Option<(u64, Vec<u8>)>, Halt> {
    env.snapshots.restored(node).map_err(|e| Halt::Failed(format!("node {node}: cannot restore its checkpoint: {e}")))
}

pub(crate) fn source_fn<T: Record, S: Source<T> + 'static>(
    factory: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
) -> SourceFn {
    Arc::new(move |info, counters, env, down| {
        let down = unerase::<T>(down, &info.node);
        let mut source: Box<dyn Source<T>> = Box::new(factory(info));
        let broken = restored(env, &info.node)
            .and_then(|from| source.restore(from.as_ref().map(|(id, b)| (*id, b.as_slice()))))
            .err();
        Box::new(SourceDriver {
            source,
            out: Counted { down, records: counters.records_out },
            node: info.node.clone(),
            snapshots: env.snapshots.clone(),
            broken,
        })
    })
}

struct Map<T, U, F> {
    f: Arc<F>,
    down: Box<dyn Collector<U>>,
    counters: NodeCounters,
    _in: PhantomData<fn(&T)>,
}

impl<T: Record, U: Record, F: Fn(&T) -> U + Send + Sync> Collector<T> for Map<T, U, F> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        self.counters.records_in.add(1);
        let out = (self.f)(record);
        self.counters.records_out.add(1);
        self.down.collect(&out)
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.down.signal(signal)
    }
}

pub(crate) fn map_fn<T: Record, U: Record>(f: impl Fn(&T) -> U + Send + Sync + 'static) -> LinkFn {
    let f = Arc::new(f);
    Arc::new(move |info, counters, _env, down| {
        erase::<T>(Box::new(Map { f: f.clone(), down: unerase::<U>(down, &info.node), counters, _in: PhantomData }))
    })
}

struct Filter<T, F> {
    f: Arc<F>,
    down: Box<dyn Collector<T>>,
    counters: NodeCounters,
}

impl<T: Record, F: Fn(&T) -> bool + Send + Sync> Collector<T> for Filter<T, F> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        self.counters.records_in.add(1);
        if (self.f)(record) {
            self.counters.records_out.add(1);
            self.down.collect(record)
        } else {
            Ok(())
        }
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.down.signal(signal)
    }
}

pub(crate) fn filter_fn<T: Record>(f: impl Fn(&T) -> bool + Send + Sync + 'static) -> LinkFn {
    let f = Arc::new(f);
    Arc::new(move |info, counters, _env, down| {
        erase::<T>(Box::new(Filter { f: f.clone(), down: unerase::<T>(down, &info.node), counters }))
    })
}

struct FlatMap<T, U, F> {
    f: Arc<F>,
    down: Box<dyn Collector<U>>,
    counters: NodeCounters,
    _in: PhantomData<fn(&T)>,
}

impl<T, U, I, F> Collector<T> for FlatMap<T, U, F>
where
    T: Record,
    U: Record,
    I: IntoIterator<Item = U>,
    F: Fn(&T) -> I + Send + Sync,
{
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        self.counters.records_in.add(1);
        for out in (self.f)(record) {
            self.counters.records_out.add(1);
            self.down.collect(&out)?;
        }
        Ok(())
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.down.signal(signal)
    }
}

pub(crate) fn flat_map_fn<T: Record, U: Record, I: IntoIterator<Item = U> + 'static>(
    f: impl Fn(&T) -> I + Send + Sync + 'static,
) -> LinkFn {
    let f = Arc::new(f);
    Arc::new(move |info, counters, _env, down| {
        erase::<T>(Box::new(FlatMap { f: f.clone(), down: unerase::<U>(down, &info.node), counters, _in: PhantomData }))
    })
}

struct Keyed<T, U, P> {
    process: P,
    key: crate::exchange::KeyFn<T>,
    max_key_groups: u32,
    down: Box<dyn Collector<U>>,
    counters: NodeCounters,
    node: String,
    snapshots: Snapshots,
    /// `restore` failed: the first call fails with this.
    broken: Option<Halt>,
}

impl<T: Record, U: Record, P: KeyedProcess<T, U>> Keyed<T, U, P> {
    #[cold]
    fn fail_restore(&mut self) -> Result<(), Halt> {
        self.broken.take().map_or(Ok(()), Err)
    }
}

impl<T: Record, U: Record, P: KeyedProcess<T, U>> Collector<T> for Keyed<T, U, P> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        if self.broken.is_some() {
            self.fail_restore()?;
        }
        self.counters.records_in.add(1);
        let kg = crate::exchange::key_group((self.key)(record), self.max_key_groups);
        let (down, out_count) = (&mut self.down, self.counters.records_out);
        self.process.process(record, kg, &mut |u| {
            out_count.add(1);
            down.collect(u)
        })
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.fail_restore()?;
        match signal {
            // A job restored from its final checkpoint emitted its last results already.
            Signal::End if self.snapshots.restored_final() => {}
            Signal::End => {
                let (down, out_count) = (&mut self.down, self.counters.records_out);
                self.process.finish(&mut |u| {
                    out_count.add(1);
                    down.collect(u)
                })?;
                self.snapshot(FINAL);
            }
            Signal::Barrier(id) => self.snapshot(id),
            _ => {}
        }
        self.down.signal(signal)
    }
}

impl<T: Record, U: Record, P: KeyedProcess<T, U>> Keyed<T, U, P> {
    fn snapshot(&mut self, id: u64) {
        if !self.snapshots.enabled() {
            return;
        }
        match self.process.snapshot(id) {
            Ok(bytes) => self.snapshots.put_blob(&self.node, id, &bytes),
            Err(h) => self.snapshots.decline(format!("keyed operator {}: {h}", self.node)),
        }
    }
}

pub(crate) fn keyed_fn<T: Record, U: Record, P: KeyedProcess<T, U> + 'static>(
    key: crate::exchange::KeyFn<T>,
    factory: impl Fn(&SubtaskInfo) -> P + Send + Sync + 'static,
) -> LinkFn {
    Arc::new(move |info, counters, env, down| {
        let mut process = factory(info);
        let broken =
            restored(env, &info.node).and_then(|from| from.map_or(Ok(()), |(_, bytes)| process.restore(&bytes))).err();
        erase::<T>(Box::new(Keyed {
            process,
            key: key.clone(),
            max_key_groups: info.max_key_groups,
            down: unerase::<U>(down, &info.node),
            counters,
            node: info.node.clone(),
            snapshots: env.snapshots.clone(),
            broken,
        }))
    })
}

struct SinkLink<T, S> {
    sink: S,
    counters: NodeCounters,
    node: String,
    snapshots: Snapshots,
    /// `restore` failed: the first call fails with this.
    broken: Option<Halt>,
    _in: PhantomData<fn(&T)>,
}

impl<T: Record, S: Sink<T>> SinkLink<T, S> {
    #[cold]
    fn fail_restore(&mut self) -> Result<(), Halt> {
        self.broken.take().map_or(Ok(()), Err)
    }

    /// Pre-commit for checkpoint `id` and put what restore needs. A sink that cannot
    /// pre-commit fails the job (it is poisoned; recovery restarts from the last checkpoint).
    fn snapshot(&mut self, id: u64) -> Result<(), Halt> {
        let bytes = self.sink.snapshot(id)?;
        self.snapshots.put_blob(&self.node, id, &bytes);
        Ok(())
    }
}

impl<T: Record, S: Sink<T>> Collector<T> for SinkLink<T, S> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        if self.broken.is_some() {
            self.fail_restore()?;
        }
        self.counters.records_in.add(1);
        self.sink.write(record)
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.fail_restore()?;
        match signal {
            Signal::Flush => Ok(()),
            Signal::Watermark(w) => self.sink.watermark(w),
            // With checkpoints the end of input is the final checkpoint: pre-commit now,
            // commit when the coordinator says it is durable.
            Signal::End if self.snapshots.enabled() => self.snapshot(FINAL),
            Signal::End => self.sink.finish(),
            Signal::Barrier(id) if self.snapshots.enabled() => self.snapshot(id),
            Signal::Barrier(_) => Ok(()),
            Signal::CheckpointComplete(FINAL) => {
                self.sink.checkpoint_complete(FINAL)?;
                self.sink.finish()
            }
            Signal::CheckpointComplete(id) => self.sink.checkpoint_complete(id),
        }
    }
}

pub(crate) fn sink_fn<T: Record, S: Sink<T> + 'static>(
    factory: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
) -> SinkFn {
    Arc::new(move |info, counters, env| {
        let mut sink = factory(info);
        let broken = restored(env, &info.node)
            .and_then(|from| sink.restore(from.as_ref().map(|(id, b)| (*id, b.as_slice()))))
            .err();
        erase::<T>(Box::new(SinkLink {
            sink,
            counters,
            node: info.node.clone(),
            snapshots: env.snapshots.clone(),
            broken,
            _in: PhantomData,
        }))
    })
}

struct Tee<T> {
    outs: Vec<Box<dyn Collector<T>>>,
}

impl<T: Record> Collector<T> for Tee<T> {
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        for out in &mut self.outs {
            out.collect(record)?;
        }
        Ok(())
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        for out in &mut self.outs {
            out.signal(signal)?;
        }
        Ok(())
    }
}

pub(crate) fn tee_fn<T: Record>() -> TeeFn {
    Arc::new(|outs, node| {
        let mut outs: Vec<Box<dyn Collector<T>>> = outs.into_iter().map(|o| unerase::<T>(o, node)).collect();
        if outs.len() == 1 { erase::<T>(outs.pop().expect("one")) } else { erase::<T>(Box::new(Tee { outs })) }
    })
}

struct Decoder<T> {
    down: Box<dyn Collector<T>>,
    node: String,
}

impl<T: Record> ErasedInput for Decoder<T> {
    #[inline]
    fn on_bytes(&mut self, bytes: &[u8]) -> Result<(), Halt> {
        let down = &mut self.down;
        match T::decode(bytes, |record| down.collect(record)) {
            Ok(result) => result,
            Err(e) => Err(Halt::Failed(format!("node {}: input record: {e}", self.node))),
        }
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.down.signal(signal)
    }
    fn resume(&mut self) -> Result<Work, Halt> {
        self.down.resume()
    }
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        self.down.poll_timers()
    }
}

pub(crate) fn decoder_fn<T: Record>() -> DecoderFn {
    Arc::new(|down, node| Box::new(Decoder { down: unerase::<T>(down, node), node: node.to_owned() }))
}
