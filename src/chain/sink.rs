//! The sink link: the end of a sink subtask's chain, driving a [`Sink`]'s checkpoint hooks
//! from the signals that reach it.

use super::{NodeCounters, SinkFn, erase, restored};
use crate::checkpoint::{FINAL, Snapshots};
use crate::operators::{Collector, Halt, Signal, Sink, SubtaskInfo, unix_now_ns};
use crate::record::Record;
use crate::telemetry::latency::EndToEnd;
use std::marker::PhantomData;
use std::sync::Arc;

/// How soon a sink subtask with markers waiting looks at its acknowledgements again while
/// no record comes.
const MARKER_POLL: std::time::Duration = std::time::Duration::from_millis(5);

struct SinkLink<T, S> {
    sink: S,
    counters: NodeCounters,
    node: String,
    /// The job, and the subtask (`node#index`), for the `sink_poisoned` event.
    job: String,
    subtask: String,
    /// Whether that event went out (once per subtask).
    reported: bool,
    snapshots: Snapshots,
    /// `restore` failed: the first call fails with this.
    broken: Option<Halt>,
    /// Latency markers seen, timed as the destination acknowledges what came before them.
    latency: EndToEnd,
    _in: PhantomData<fn(&T)>,
}

impl<T: Record, S: Sink<T>> SinkLink<T, S> {
    #[cold]
    fn fail_restore(&mut self) -> Result<(), Halt> {
        self.broken.take().map_or(Ok(()), Err)
    }

    /// Time the markers whose records the destination acknowledged, and publish the
    /// figures (`EndToEnd::tick`: within 100 ms, rotating each second). At each batch's end
    /// (and each timer poll): a compare while none waits.
    #[inline]
    fn settle_markers(&mut self) {
        if self.latency.waiting() {
            let written = self.counters.records_in.get();
            let acked = self.sink.acknowledged().unwrap_or(written);
            self.latency.acknowledged(acked, unix_now_ns());
        }
        self.latency.tick();
    }

    /// What a call into the sink returned: its first failure is one structured event
    /// (`sink_poisoned`, with the job, node and subtask) — the sink fails the job, and a
    /// log shipper sees which sink and why before the job's own `job_failed`.
    #[inline]
    fn watch(&mut self, result: Result<(), Halt>) -> Result<(), Halt> {
        if let Err(Halt::Failed(f)) = &result {
            self.poisoned(f);
        }
        result
    }

    #[cold]
    fn poisoned(&mut self, failure: &crate::operators::Failure) {
        if std::mem::replace(&mut self.reported, true) {
            return;
        }
        tracing::error!(
            event = "sink_poisoned",
            job = %self.job,
            node = %self.node,
            subtask = %self.subtask,
            "sink {} failed (the job fails and restarts from its last checkpoint, if any): {failure}",
            self.subtask
        );
    }

    /// The sink's last call: make everything durable, then time the markers that settles
    /// and leave the final figures in the counters.
    fn finish(&mut self) -> Result<(), Halt> {
        let finished = self.sink.finish();
        self.settle_markers();
        self.latency.publish();
        finished
    }

    /// Pre-commit for checkpoint `id` and put what restore needs. A sink that cannot
    /// pre-commit fails the job (it is poisoned; recovery restarts from the last checkpoint).
    ///
    /// A checkpoint but the final one may have its part put later (`Sink::snapshot_later`):
    /// the subtask's ack waits for it, the records after the barrier do not.
    fn snapshot(&mut self, id: u64) -> Result<(), Halt> {
        let tag = crate::checkpoint::StateTag::new("sink", self.sink.state_version());
        if id == FINAL {
            let bytes = self.sink.snapshot(id)?;
            self.snapshots.put_blob(&self.node, id, &tag, &bytes);
            return Ok(());
        }
        self.sink.snapshot_later(self.snapshots.late(&self.node, id, tag))
    }
}

impl<T: Record, S: Sink<T>> Collector<T> for SinkLink<T, S> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        if self.broken.is_some() {
            let restored = self.fail_restore();
            return self.watch(restored);
        }
        self.counters.records_in.add(1);
        let written = self.sink.write(record);
        if written.is_err() {
            return self.watch(written);
        }
        Ok(())
    }
    /// As `collect` for each record, with the records counted once per batch: a counter
    /// bumped per record is a read-modify-write chained through memory, ~5 cycles a record
    /// (one in 20 of an unchained chain's samples). A failing write is counted, as there.
    #[inline]
    fn collect_batch(&mut self, records: &[T]) -> Result<(), Halt> {
        if self.broken.is_some() {
            let restored = self.fail_restore();
            return self.watch(restored);
        }
        for (i, record) in records.iter().enumerate() {
            let written = self.sink.write(record);
            if written.is_err() {
                self.counters.records_in.add(i as u64 + 1);
                return self.watch(written);
            }
        }
        self.counters.records_in.add(records.len() as u64);
        Ok(())
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        let result = self.signal_sink(signal);
        self.watch(result)
    }
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        let next = match self.sink.poll_timers() {
            Ok(next) => next,
            Err(h) => return self.watch(Err(h)).map(|()| None),
        };
        self.settle_markers();
        // Markers waiting on an acknowledgement are looked at again soon.
        Ok(if self.latency.waiting() { Some(next.map_or(MARKER_POLL, |n| n.min(MARKER_POLL))) } else { next })
    }
}

impl<T: Record, S: Sink<T>> SinkLink<T, S> {
    /// A signal, to the sink's hooks.
    fn signal_sink(&mut self, signal: Signal) -> Result<(), Halt> {
        self.fail_restore()?;
        match signal {
            // A source's chain flushes on every poll: the sink's timers run then too.
            Signal::Flush => {
                let polled = self.sink.poll_timers().map(|_| ());
                self.settle_markers();
                polled
            }
            Signal::Latency(m) => {
                self.latency.marker(self.counters.records_in.get(), m.ingest_ns, m.event_ns);
                self.settle_markers();
                Ok(())
            }
            Signal::Watermark(w) => self.sink.watermark(w),
            // With checkpoints the end of input is the final checkpoint: pre-commit now,
            // commit when the coordinator says it is durable.
            Signal::End if self.snapshots.enabled() => self.snapshot(FINAL),
            Signal::End => self.finish(),
            Signal::Barrier(id) if self.snapshots.enabled() => self.snapshot(id),
            Signal::Barrier(_) => Ok(()),
            Signal::CheckpointComplete(FINAL) => {
                self.sink.checkpoint_complete(FINAL)?;
                self.finish()
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
        let version = sink.state_version();
        let from = restored(env, &info.node, "sink", version, &mut |from, b| sink.migrate_state(from, b));
        let broken = from
            .and_then(|from| match &from {
                crate::checkpoint::Restored::Rescaled(r) => sink.restore_rescaled(r),
                same_or_fresh => sink.restore(same_or_fresh.same()),
            })
            .err();
        erase::<T>(Box::new(SinkLink {
            sink,
            latency: EndToEnd::new(counters.latency.clone()),
            counters,
            node: info.node.clone(),
            job: info.job.clone(),
            subtask: info.name(),
            reported: false,
            snapshots: env.snapshots.clone(),
            broken,
            _in: PhantomData,
        }))
    })
}
