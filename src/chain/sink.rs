//! The sink link: the end of a sink subtask's chain, driving a [`Sink`]'s checkpoint hooks
//! from the signals that reach it.

use super::{NodeCounters, SinkFn, erase, restored};
use crate::checkpoint::{FINAL, Snapshots};
use crate::operators::{Collector, Halt, Signal, Sink, SubtaskInfo};
use crate::record::Record;
use std::marker::PhantomData;
use std::sync::Arc;

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
            // A source's chain flushes on every poll: the sink's timers run then too.
            Signal::Flush => self.sink.poll_timers().map(|_| ()),
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
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        self.sink.poll_timers()
    }
}

pub(crate) fn sink_fn<T: Record, S: Sink<T> + 'static>(
    factory: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
) -> SinkFn {
    Arc::new(move |info, counters, env| {
        let mut sink = factory(info);
        let broken = restored(env, &info.node)
            .and_then(|from| match &from {
                crate::checkpoint::Restored::Rescaled(r) => sink.restore_rescaled(r),
                same_or_fresh => sink.restore(same_or_fresh.same()),
            })
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
