//! The source driver: the head of a source subtask's chain.

use super::{Counted, ErasedSource, SourceFn, restored, unerase};
use crate::checkpoint::{FINAL, Snapshots};
use crate::operators::Collector;
use crate::operators::{Halt, LatencyMarker, Signal, Source, SourcePoll, SubtaskInfo, Wake, unix_now_ns};
use crate::record::Record;
use std::sync::Arc;

struct SourceDriver<T> {
    source: Box<dyn Source<T>>,
    out: Counted<T>,
    node: String,
    snapshots: Snapshots,
    /// `restore` failed: the first poll fails with this.
    broken: Option<Halt>,
    /// Latency markers: every this many ns (`None`: none), the next due at this
    /// (coarse monotonic ns), and the records emitted when the last was sent.
    marker_every_ns: Option<u64>,
    next_marker_ns: u64,
    marked_records: u64,
}

impl<T: 'static> SourceDriver<T> {
    /// After a poll: send a latency marker behind the records it emitted, if one is due and
    /// records came since the last (an idle source sends none: there is nothing to time).
    #[inline]
    fn mark(&mut self) -> Result<(), Halt> {
        let Some(every) = self.marker_every_ns else { return Ok(()) };
        let now = weir_ring::process::coarse_monotonic_ns();
        if now < self.next_marker_ns {
            return Ok(());
        }
        let records = self.out.records.get();
        if records == self.marked_records {
            return Ok(());
        }
        self.next_marker_ns = now + every;
        self.marked_records = records;
        let marker = LatencyMarker { ingest_ns: unix_now_ns(), event_ns: self.source.event_time().unwrap_or(0) };
        self.out.signal(Signal::Latency(marker))
    }
}

impl<T: 'static> ErasedSource for SourceDriver<T> {
    fn poll(&mut self) -> Result<SourcePoll, Halt> {
        if let Some(h) = self.broken.take() {
            return Err(h);
        }
        let polled = self.source.poll(&mut self.out)?;
        self.mark()?;
        Ok(polled)
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.out.signal(signal)
    }
    fn barrier(&mut self, id: u64) -> Result<(), Halt> {
        if self.snapshots.enabled() {
            match self.source.snapshot(id) {
                Ok(bytes) => {
                    let tag = crate::checkpoint::StateTag::new("source", self.source.state_version());
                    self.snapshots.put_blob(&self.node, id, &tag, &bytes)
                }
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
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        self.out.poll_timers()
    }
}

pub(crate) fn source_fn<T: Record, S: Source<T> + 'static>(
    factory: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
) -> SourceFn {
    Arc::new(move |info, counters, env, down| {
        let down = unerase::<T>(down, &info.node);
        let mut source: Box<dyn Source<T>> = Box::new(factory(info));
        let version = source.state_version();
        let from = restored(env, &info.node, "source", version, &mut |from, b| source.migrate_state(from, b));
        let broken = from
            .and_then(|from| match &from {
                crate::checkpoint::Restored::Rescaled(r) => source.restore_rescaled(r),
                same_or_fresh => source.restore(same_or_fresh.same()),
            })
            .err();
        Box::new(SourceDriver {
            source,
            out: Counted { down, records: counters.records_out },
            node: info.node.clone(),
            snapshots: env.snapshots.clone(),
            broken,
            marker_every_ns: env.latency_interval.map(|i| i.as_nanos().min(u64::MAX as u128) as u64),
            next_marker_ns: 0,
            marked_records: 0,
        })
    })
}
