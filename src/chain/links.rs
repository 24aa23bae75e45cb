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
    /// A batch's results, passed on as a batch (kept for its capacity; empty between).
    batch: Vec<U>,
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
    #[inline]
    fn collect_batch(&mut self, records: &[T]) -> Result<(), Halt> {
        let n = records.len() as u64;
        self.counters.records_in.add(n);
        let f = &*self.f;
        self.batch.extend(records.iter().map(f));
        self.counters.records_out.add(n);
        let passed = self.down.collect_batch(&self.batch);
        self.batch.clear();
        passed
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
        let down = unerase::<U>(down, &info.node);
        erase::<T>(Box::new(Map { f: f.clone(), down, counters, batch: Vec::new(), _in: PhantomData }))
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
    #[inline]
    fn collect_batch(&mut self, records: &[T]) -> Result<(), Halt> {
        self.counters.records_in.add(records.len() as u64);
        // The records that pass go on in place, as the runs of neighbours they form.
        let mut rest = records;
        while !rest.is_empty() {
            let kept = rest.iter().position(|r| !(self.f)(r)).unwrap_or(rest.len());
            if kept > 0 {
                self.counters.records_out.add(kept as u64);
                self.down.collect_batch(&rest[..kept])?;
            }
            rest = rest.get(kept + 1..).unwrap_or(&[]);
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
    /// The operator's keyed state, when it was built with some (`process_with_state`):
    /// checkpointed with the operator's bytes.
    state: Option<(crate::state::KeyedState, std::ops::Range<u32>)>,
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
        let bytes = self.process.snapshot(id).map_err(|h| h.to_string()).and_then(|own| match &self.state {
            None => Ok(own),
            Some((state, key_groups)) => state.checkpoint(|c| match c {
                // Over RocksDB the shard's snapshot holds the state; the bytes say so.
                crate::state::Checkpointed::Shard(store) => match self.snapshots.shard_dir(&self.node, id) {
                    Some(Ok((dir, rel))) => {
                        store.checkpoint(&dir).map_err(|e| e.to_string())?;
                        self.snapshots.put_shard(&self.node, rel, key_groups.clone());
                        Ok(with_state(&own, None))
                    }
                    Some(Err(e)) => Err(e.to_string()),
                    None => Err("no directory for the snapshot".to_owned()),
                },
                crate::state::Checkpointed::Bytes(state) => Ok(with_state(&own, Some(&state))),
            }),
        });
        let tag = crate::checkpoint::StateTag {
            parts: self.state.as_ref().map(|(s, _)| s.parts()).unwrap_or_default(),
            ..crate::checkpoint::StateTag::new("keyed", self.process.state_version())
        };
        match bytes {
            Ok(bytes) => self.snapshots.put_blob(&self.node, id, &tag, &bytes),
            Err(e) => self.snapshots.decline(format!("keyed operator {}: {e}", self.node)),
        }
    }
}

/// The checkpoint bytes of an operator with keyed state: `WKS1`, the operator's own bytes
/// (length u64 LE, bytes), then 0 (the state is in the shard's snapshot) or 1 and the
/// in-memory state's bytes.
const STATE_MAGIC: &[u8; 4] = b"WKS1";

fn with_state(own: &[u8], state: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + own.len() + state.map_or(0, <[u8]>::len));
    out.extend_from_slice(STATE_MAGIC);
    out.extend_from_slice(&(own.len() as u64).to_le_bytes());
    out.extend_from_slice(own);
    match state {
        Some(s) => {
            out.push(1);
            out.extend_from_slice(s);
        }
        None => out.push(0),
    }
    out
}

/// Split [`with_state`]'s bytes: the operator's own, and the in-memory state's if any.
fn split_state<'a>(node: &str, bytes: &'a [u8]) -> Result<(&'a [u8], Option<&'a [u8]>), Halt> {
    let bad = || {
        Halt::failed(format!(
            "keyed operator {node}: its checkpoint bytes are not those of an operator with keyed state"
        ))
    };
    let rest = bytes.strip_prefix(STATE_MAGIC.as_slice()).ok_or_else(bad)?;
    let (len, rest) = rest.split_at_checked(8).ok_or_else(bad)?;
    let len = usize::try_from(u64::from_le_bytes(len.try_into().map_err(|_| bad())?)).map_err(|_| bad())?;
    let (own, rest) = rest.split_at_checked(len).ok_or_else(bad)?;
    match rest.split_first() {
        Some((0, [])) => Ok((own, None)),
        Some((1, state)) => Ok((own, Some(state))),
        _ => Err(bad()),
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
        let version = process.state_version();
        let from = restored(env, &info.node, "keyed", version, &mut |from, b| process.migrate_state(from, b));
        let broken = from
            .and_then(|from| match &from {
                crate::checkpoint::Restored::Fresh => Ok(()),
                crate::checkpoint::Restored::Same(_, bytes) => process.restore(bytes),
                crate::checkpoint::Restored::Rescaled(r) => process.restore_rescaled(r),
            })
            .err();
        keyed_link(process, key.clone(), info, counters, env, down, broken, None)
    })
}

/// The keyed link of `process`, built (its restore done, `broken` if it failed).
#[allow(clippy::too_many_arguments)]
fn keyed_link<T: Record, U: Record, P: KeyedProcess<T, U> + 'static>(
    process: P,
    key: crate::record::KeyFn<T>,
    info: &SubtaskInfo,
    counters: NodeCounters,
    env: &super::OperatorEnv,
    down: super::AnyCollector,
    broken: Option<Halt>,
    state: Option<(crate::state::KeyedState, std::ops::Range<u32>)>,
) -> super::AnyCollector {
    let processing_timers = process.processing_timers();
    erase::<T>(Box::new(Keyed {
        process,
        key,
        key_groups: info.key_groups_of_keys(),
        down: unerase::<U>(down, &info.node),
        counters,
        node: info.node.clone(),
        snapshots: env.snapshots.clone(),
        broken,
        processing_timers,
        late_seen: 0,
        state,
    }))
}

/// [`keyed_fn`] for an operator with keyed state: the factory gets the subtask's
/// [`crate::state::KeyedState`] (over its shard, or in memory without a state backend),
/// which is checkpointed and restored with the operator.
pub(crate) fn keyed_state_fn<T: Record, U: Record, P: KeyedProcess<T, U> + 'static>(
    key: crate::record::KeyFn<T>,
    factory: impl Fn(&SubtaskInfo, &crate::state::KeyedState) -> P + Send + Sync + 'static,
) -> LinkFn {
    Arc::new(move |info, counters, env, down| {
        let key_groups = info.key_groups();
        let (state, mut broken) = match &env.shard {
            // The copy family beside it is what every shard snapshot of a node holds
            // (restore moves both); here it stays empty.
            #[cfg(feature = "rocksdb")]
            Some(shard) => match shard.store(&info.node).and_then(|s| {
                shard.store(&crate::state::cache_copy_family(&info.node))?;
                Ok(s)
            }) {
                Ok(store) => (crate::state::KeyedState::rocks(&info.node, store), None),
                Err(e) => (
                    crate::state::KeyedState::in_memory(&info.node),
                    Some(Halt::failed(format!("keyed operator {}: cannot open its state: {e}", info.name()))),
                ),
            },
            #[cfg(not(feature = "rocksdb"))]
            Some(never) => match *never {},
            None => (crate::state::KeyedState::in_memory(&info.node), None),
        };
        let mut process = factory(info, &state);
        if broken.is_none() {
            // The operator's own bytes convert by its version; the keyed state's by its schema.
            let version = process.state_version();
            let node = info.node.clone();
            let mut migrate = |from, bytes: Vec<u8>| {
                let (own, kept) = split_state(&node, &bytes)?;
                let own = process.migrate_state(from, own.to_vec())?;
                Ok(with_state(&own, kept))
            };
            // The keyed state first (a shard's was restored with the shard; an in-memory
            // state's is in the operator's bytes), then converted to what this version
            // declares, then the operator's own bytes: it may read its state in `restore`.
            let upgrade = |state: &crate::state::KeyedState| -> Result<(), Halt> {
                let parts = env
                    .snapshots
                    .restored_parts(&info.node)
                    .map_err(|source| crate::operators::OperatorError::Restore { node: info.node.clone(), source })?;
                let done = state
                    .upgrade(&parts, &key_groups, env.snapshots.allow_dropped_state())
                    .map_err(|e| Halt::failed(format!("keyed operator {}: {e}", info.name())))?;
                for d in done {
                    tracing::info!(event = "state_migrated", node = %info.node, subtask = %info.name(), "{d}");
                }
                Ok(())
            };
            broken = restored(env, &info.node, "keyed", version, &mut migrate)
                .and_then(|from| match &from {
                    crate::checkpoint::Restored::Fresh => Ok(()),
                    crate::checkpoint::Restored::Same(_, bytes) => {
                        let (own, kept) = split_state(&info.node, bytes)?;
                        if let Some(kept) = kept {
                            state.restore_bytes(kept, &key_groups)?;
                        }
                        upgrade(&state)?;
                        process.restore(own)
                    }
                    crate::checkpoint::Restored::Rescaled(r) => {
                        let mut own_parts = Vec::with_capacity(r.parts.len());
                        for (index, bytes) in &r.parts {
                            let (own, kept) = split_state(&info.node, bytes)?;
                            if let Some(kept) = kept {
                                state.restore_bytes(kept, &key_groups)?;
                            }
                            own_parts.push((*index, own.to_vec()));
                        }
                        upgrade(&state)?;
                        process.restore_rescaled(&crate::checkpoint::Rescaled { parts: own_parts, ..r.clone() })
                    }
                })
                .err();
        }
        keyed_link(process, key.clone(), info, counters, env, down, broken, Some((state, key_groups)))
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
