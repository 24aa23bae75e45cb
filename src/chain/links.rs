//! The links between a chain's head and its end: map, filter, flat_map, keyed process,
//! and the tee into several outputs.

use super::{LinkFn, NodeCounters, TeeFn, erase, restored, unerase};
use crate::checkpoint::{FINAL, Snapshots};
use crate::operators::{Collector, Halt, KeyedProcess, Signal, SubtaskInfo};
use crate::record::Record;
use std::marker::PhantomData;
use std::sync::Arc;

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
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        self.down.poll_timers()
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
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        self.down.poll_timers()
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
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        self.down.poll_timers()
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
    key: crate::record::KeyFn<T>,
    key_groups: crate::record::KeyGroups,
    down: Box<dyn Collector<U>>,
    counters: NodeCounters,
    node: String,
    snapshots: Snapshots,
    /// `restore` failed: the first call fails with this.
    broken: Option<Halt>,
    /// The operator keeps processing-time timers (asked once, when built).
    processing_timers: bool,
    /// `late_records()` as last added to the counter.
    late_seen: u64,
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
        let kg = self.key_groups.key_group((self.key)(record));
        let (down, out_count) = (&mut self.down, self.counters.records_out.counter());
        let process = &mut self.process;
        // A panic in the user's code fails the job with the node and the key group (the
        // state it leaves is not used again: the subtask ends). Free until one happens.
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            process.process(record, kg, &mut |u| {
                out_count.add(1);
                down.collect(u)
            })
        }))
        .unwrap_or_else(|panic| Err(keyed_panic(&self.node, Some(kg), 0, panic)));
        let late = self.process.late_records();
        if late != self.late_seen {
            self.counters.late_records.add(late.wrapping_sub(self.late_seen));
            self.late_seen = late;
        }
        done
    }
    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        self.fail_restore()?;
        match signal {
            // A job restored from its final checkpoint emitted its last results already.
            Signal::End if self.snapshots.restored_final() => {}
            Signal::End => {
                let (down, out_count) = (&mut self.down, self.counters.records_out.counter());
                self.process.finish(&mut |u| {
                    out_count.add(1);
                    down.collect(u)
                })?;
                self.snapshot(FINAL);
            }
            Signal::Barrier(id) => self.snapshot(id),
            Signal::Watermark(w) => {
                let (down, out_count) = (&mut self.down, self.counters.records_out.counter());
                let process = &mut self.process;
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    process.on_watermark(w, &mut |u| {
                        out_count.add(1);
                        down.collect(u)
                    })
                }))
                .unwrap_or_else(|panic| Err(keyed_panic(&self.node, None, w, panic)))?;
            }
            _ => {}
        }
        self.down.signal(signal)
    }
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        // The links after this one in its chain (a sink's retries) have timers too.
        let down = self.down.poll_timers()?;
        if !self.processing_timers {
            return Ok(down);
        }
        // Wall-clock ns since the Unix epoch (the time layer is above this one).
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let (down_link, out_count) = (&mut self.down, self.counters.records_out.counter());
        let process = &mut self.process;
        let mut emitted = false;
        let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            process.on_processing_time(now, &mut |u| {
                emitted = true;
                out_count.add(1);
                down_link.collect(u)
            })
        }))
        .unwrap_or_else(|panic| Err(keyed_panic(&self.node, None, now, panic)))?;
        if emitted {
            // Fired while no record may come: send it now, not with the next batch.
            self.down.signal(Signal::Flush)?;
        }
        let mine = next.map(|t| std::time::Duration::from_nanos(t.saturating_sub(now)));
        Ok(match (mine, down) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
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

/// The failure of a keyed operator that panicked.
#[cold]
fn keyed_panic(node: &str, key_group: Option<u32>, watermark: u64, panic: Box<dyn std::any::Any + Send>) -> Halt {
    let message = crate::operators::panic_message(&*panic).unwrap_or_else(|| "a panic with no message".to_owned());
    crate::operators::OperatorError::KeyedPanicked { node: node.to_owned(), key_group, watermark, message }.into()
}

pub(crate) fn keyed_fn<T: Record, U: Record, P: KeyedProcess<T, U> + 'static>(
    key: crate::record::KeyFn<T>,
    factory: impl Fn(&SubtaskInfo) -> P + Send + Sync + 'static,
) -> LinkFn {
    Arc::new(move |info, counters, env, down| {
        let mut process = factory(info);
        let broken = restored(env, &info.node)
            .and_then(|from| match &from {
                crate::checkpoint::Restored::Fresh => Ok(()),
                crate::checkpoint::Restored::Same(_, bytes) => process.restore(bytes),
                crate::checkpoint::Restored::Rescaled(r) => process.restore_rescaled(r),
            })
            .err();
        let processing_timers = process.processing_timers();
        erase::<T>(Box::new(Keyed {
            process,
            key: key.clone(),
            key_groups: crate::record::KeyGroups::new(1, info.max_key_groups),
            down: unerase::<U>(down, &info.node),
            counters,
            node: info.node.clone(),
            snapshots: env.snapshots.clone(),
            broken,
            processing_timers,
            late_seen: 0,
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
    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        let mut next: Option<std::time::Duration> = None;
        for out in &mut self.outs {
            if let Some(t) = out.poll_timers()? {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        Ok(next)
    }
}

pub(crate) fn tee_fn<T: Record>() -> TeeFn {
    Arc::new(|outs, node| {
        let mut outs: Vec<Box<dyn Collector<T>>> = outs.into_iter().map(|o| unerase::<T>(o, node)).collect();
        if outs.len() == 1 { erase::<T>(outs.pop().expect("one")) } else { erase::<T>(Box::new(Tee { outs })) }
    })
}
