//! The window operator: a chain link at the head of its subtask's chain (it follows a hash
//! exchange), holding its keys' windows in a bounded cache over a store.
//!
//! Records: find the key's slot (cache, else store, else new), catch the key up with the
//! watermark if one of its windows became due, add the record. Watermarks: note the time;
//! if any window is due, start a *sweep* over every key (cache, then store) that fires what
//! is due in chunks of [`FIRE_CHUNK`] windows ([`Collector::resume`]), and hold the
//! watermark back until the sweep is done, so results go downstream before the watermark
//! that caused them.
//!
//! A sweep lets input in between its chunks ([`Work::Interleave`]), so a checkpoint barrier
//! does not wait for a firing the sink paces to take seconds: a record touching a key catches
//! that key up first (as outside a sweep), a watermark arriving meanwhile moves the time on
//! and is held with the first, and when the sweep ends another one starts if the keys it
//! visited before the watermark moved are due again. The cursor stays valid: a sweep in
//! progress removes no slot on the record path, and an eviction in the cache phase starts
//! the cache phase over (visited keys cost a compare). A barrier mid-sweep snapshots state
//! as it is: fired windows are gone from it, unfired ones are in it and fire after a restore,
//! at the first watermark that reaches the restored time.

use super::cache::{Cache, Slot};
use super::kinds::{Firing, Kind};
use super::store::{MemoryStore, Spill, StoreBatch, StoreError, WindowStore};
use super::{TimeDomain, WindowAggregate};
use crate::chain::{AnyCollector, LinkFn, NodeCounters, erase, unerase};
use crate::operators::{Collector, Halt, Signal, SubtaskInfo, Work};
use crate::record::Record;
use crate::record::{KeyFn, KeyGroups};
use crate::time::TimestampFn;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// Windows fired (or keys visited) per `resume` call. A window costs about a result record
/// and a ring write (~100 ns), so a chunk is well under a millisecond: the most a stop (or a
/// barrier, later) waits behind firing.
pub const FIRE_CHUNK: usize = 2048;

/// A chunk in the cache phase also ends after about this long (plus the coarse clock's
/// resolution): under backpressure its results wait for credit, and 2048 of them can take
/// the sink a second; a barrier let in between chunks should not wait that long.
const CHUNK_TIME: Duration = Duration::from_millis(5);

/// What every subtask of a window node shares.
pub(crate) struct WindowConfig<T> {
    pub kind: Kind,
    pub domain: TimeDomain,
    pub lateness_ns: u64,
    pub key: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
    pub key_hash: KeyFn<T>,
    pub time: Option<TimestampFn<T>>,
    pub on_late: Option<super::LateFn<T>>,
    pub cache_bytes: u64,
    pub clock: Arc<dyn Fn() -> u64 + Send + Sync>,
}

fn failed(node: &str, e: StoreError) -> Halt {
    Halt::failed(format!("window {node}: {e}"))
}

/// Where a sweep over every key stands.
enum Sweep {
    /// At slot `next` of the cache.
    Cache { next: usize },
    /// At this key (key group, key) in the store.
    Store { from: (u16, u64) },
}

pub(crate) struct WindowOperator<T, G: WindowAggregate<T>> {
    config: Arc<WindowConfig<T>>,
    agg: Arc<G>,
    /// A key's group: of the job's, or within this subtask's range (see `KeyGroups::within`).
    groups: KeyGroups,
    cache: Cache<G::Acc>,
    spill: Spill,
    /// The watermark (event time) or the processing time the windows are at.
    w: u64,
    /// The last watermark sent downstream.
    forwarded: u64,
    /// A watermark arrived that goes downstream when the sweep is done.
    held: bool,
    sweep: Option<Sweep>,
    /// The earliest `next_due` seen by the sweep in progress.
    sweep_next_due: u64,
    /// The earliest time any key needs attention (may be early, never late).
    next_due: u64,
    /// The time of the last completed sweep (the time it started at).
    last_sweep: u64,
    /// The time the sweep in progress started at (the time may move on while it runs).
    sweep_from: u64,
    /// Processing time, as read at the start of the subtask's current pass.
    proc_now: u64,
    /// Latency markers: the ingest time of the newest that came in (they stop here), and
    /// the newest end of a window fired since the last went out (0: none).
    marker_ingest: u64,
    fired_end: u64,
    down: Box<dyn Collector<G::Out>>,
    counters: NodeCounters,
    node: String,
    /// The store could not be opened: the subtask fails on its first pass.
    broken: Option<String>,
    /// The node's id (its column family, its checkpoint files), its key groups, and the
    /// subtask's checkpoint context.
    node_id: String,
    key_groups: std::ops::Range<u32>,
    snapshots: crate::checkpoint::Snapshots,
}

/// A window's memory bound split into (cache, filter of keys in the store, batches to and
/// from the store): the filter is 1/64, the batches 1/16, the cache the rest.
fn cache_split(bound: u64) -> (u64, u64, u64) {
    let (filter, batch) = (bound / 64, bound / 16);
    (bound - filter - batch, filter, batch)
}

/// The least a merging window's writes wait in memory before they go to RocksDB as runs
/// (`super::runs`): with less, a run holds a few windows and RocksDB's work is per window
/// again (the 64 KiB-cache row of `weir-bench window`: 0.21 M records per CPU-second with a
/// 4 KiB buffer, 0.57 M with 256 KiB), and a key group gathers hundreds of runs per window,
/// each read when it fires (the 10^6-key row with a 10^4-key cache, 1.8 MiB: 0.85 M with
/// 256 KiB, 1.25–1.27 M with 1 MiB, no better with 2 MiB; a cache ten times larger, whose
/// buffer is 0.9 MiB by its share, gains nothing from 2–8 MiB). Counted in the budget
/// ([`memory_bound`]).
pub const RUN_BUFFER_MIN: u64 = 1 << 20;

/// A window's buffer for runs: its bound's batch share, or [`RUN_BUFFER_MIN`].
fn run_buffer(bound: u64) -> u64 {
    cache_split(bound).2.max(RUN_BUFFER_MIN)
}

/// A window's memory in the job's budget: its bound, and the runs' buffer beyond the
/// bound's batch share.
pub fn memory_bound(cache_bytes: u64) -> u64 {
    cache_bytes + run_buffer(cache_bytes) - cache_split(cache_bytes).2
}

/// The smallest `cache_bytes` whose cache holds `keys` keys of one window each with the
/// built-in aggregates ([`super::Aggregates`]): to size a cache by keys rather than bytes.
pub fn cache_bytes_for_keys(keys: u64) -> u64 {
    let holds = |b: u64| Cache::<super::Stats>::capacity_for(cache_split(b).0) as u64 >= keys;
    let (mut lo, mut hi) = (super::MIN_CACHE_BYTES, super::MIN_CACHE_BYTES);
    while !holds(hi) {
        lo = hi;
        hi *= 2;
    }
    while hi - lo > 1024 {
        let mid = lo + (hi - lo) / 2;
        if holds(mid) { hi = mid } else { lo = mid }
    }
    hi
}

/// The first bytes of a window operator's checkpoint bytes.
const SNAPSHOT_MAGIC: &[u8; 8] = b"weirwin1";

impl<T: Record, G: WindowAggregate<T>> WindowOperator<T, G> {
    pub(crate) fn new(
        config: Arc<WindowConfig<T>>,
        agg: Arc<G>,
        groups: KeyGroups,
        store: Box<dyn WindowStore>,
        down: Box<dyn Collector<G::Out>>,
        counters: NodeCounters,
        node: String,
    ) -> WindowOperator<T, G> {
        let (cache_bytes, filter_bytes, batch_bytes) = cache_split(config.cache_bytes);
        WindowOperator {
            cache: Cache::new(cache_bytes, batch_bytes),
            spill: Spill::new(store, filter_bytes),
            broken: None,
            config,
            agg,
            groups,
            w: 0,
            forwarded: 0,
            held: false,
            sweep: None,
            sweep_next_due: u64::MAX,
            next_due: u64::MAX,
            last_sweep: 0,
            sweep_from: 0,
            proc_now: 0,
            marker_ingest: 0,
            fired_end: 0,
            down,
            counters,
            node,
            node_id: String::new(),
            key_groups: 0..0,
            snapshots: Default::default(),
        }
    }

    /// Checkpoint `id`, as its barrier passes. Over RocksDB, incremental: the cache's copy
    /// beside the windows is brought up to date (the keys changed since the last checkpoint
    /// written, those that left the cache deleted) and the shard snapshotted; what did not
    /// change is not written again. Over the heap, the cache is copied into the store, the
    /// store's content put into the bytes, and the copies removed again. The bytes hold the
    /// operator's clocks. A failure declines the checkpoint; the job goes on.
    fn snapshot(&mut self, id: u64) {
        if !self.snapshots.enabled() {
            return;
        }
        if self.spill.keeps_copies() {
            return self.snapshot_incremental(id);
        }
        let batch = self.cache.batch_keys();
        let result = (|| -> Result<Vec<u8>, String> {
            self.flush_partials().map_err(|h| h.to_string())?;
            let mut bytes = SNAPSHOT_MAGIC.to_vec();
            for v in [self.w, self.forwarded, self.last_sweep] {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            self.spill.copy(self.cache.slots(), batch).map_err(|e| e.to_string())?;
            let taken = match self.snapshots.shard_dir(&self.node_id, id) {
                Some(Ok((dir, rel))) => match self.spill.checkpoint(&dir) {
                    Ok(true) => {
                        crate::checkpoint::failpoint!("checkpoint::rocksdb-half-written");
                        self.snapshots.put_shard(&self.node_id, rel, self.key_groups.clone());
                        Ok(true)
                    }
                    Ok(false) => Ok(false),
                    Err(e) => Err(e.to_string()),
                },
                Some(Err(e)) => Err(e.to_string()),
                None => Ok(false),
            };
            let inline = match taken {
                Ok(false) => {
                    bytes.push(1);
                    self.spill.export(&mut bytes).map_err(|e| e.to_string())
                }
                Ok(true) => {
                    bytes.push(0);
                    Ok(())
                }
                Err(e) => Err(e),
            };
            // The copies go whatever happened: the cache holds the state.
            let removed = self.spill.uncopy(self.cache.slots(), batch).map_err(|e| e.to_string());
            inline.and(removed).map(|()| bytes)
        })();
        match result {
            Ok(bytes) => {
                self.snapshots.put_blob(&self.node_id, id, &crate::checkpoint::StateTag::new("window", 0), &bytes)
            }
            Err(e) => self.snapshots.decline(format!("window {}: {e}", self.node)),
        }
    }

    /// [`snapshot`](Self::snapshot) over a store that keeps the cache's copy.
    fn snapshot_incremental(&mut self, id: u64) {
        self.spill.hold_folds(true);
        let result = (|| -> Result<Vec<u8>, String> {
            self.flush_partials().map_err(|h| h.to_string())?;
            self.write_copies().map_err(|e| e.to_string())?;
            let mut bytes = SNAPSHOT_MAGIC.to_vec();
            for v in [self.w, self.forwarded, self.last_sweep] {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            bytes.push(0);
            match self.snapshots.shard_dir(&self.node_id, id) {
                Some(Ok((dir, rel))) => {
                    self.spill.checkpoint(&dir).map_err(|e| e.to_string())?;
                    crate::checkpoint::failpoint!("checkpoint::rocksdb-half-written");
                    self.snapshots.put_shard(&self.node_id, rel, self.key_groups.clone());
                    Ok(bytes)
                }
                Some(Err(e)) => Err(e.to_string()),
                None => Err("no directory for the snapshot".into()),
            }
        })();
        self.spill.hold_folds(false);
        match result {
            Ok(bytes) => {
                self.snapshots.put_blob(&self.node_id, id, &crate::checkpoint::StateTag::new("window", 0), &bytes)
            }
            Err(e) => self.snapshots.decline(format!("window {}: {e}", self.node)),
        }
    }

    /// Bring the cache's copy in the store up to date: delete the keys that left the cache,
    /// then write every key changed since (in batches); each written key is clean after.
    fn write_copies(&mut self) -> Result<(), StoreError> {
        self.delete_departed()?;
        let batch = self.cache.batch_keys();
        let mut puts = Vec::with_capacity(batch);
        let mut deletes = Vec::new();
        let mut from = 0;
        let len = self.cache.len();
        while from < len {
            let to = (from + batch).min(len);
            puts.clear();
            deletes.clear();
            for slot in &self.cache.slots()[from..to] {
                if !slot.dirty {
                    continue;
                }
                if slot.entries.is_empty() {
                    // Waiting for a sweep to remove it: no copy (the one there may be goes).
                    if slot.copied {
                        deletes.push((slot.kg, slot.key));
                    }
                } else {
                    puts.push((slot.kg, slot.key, super::store::encode_copy(slot)));
                }
            }
            self.spill.write_copies(&deletes, &puts)?;
            for slot in &mut self.cache.slots_mut()[from..to] {
                if slot.dirty {
                    slot.dirty = false;
                    slot.copied = !slot.entries.is_empty();
                }
            }
            from = to;
        }
        Ok(())
    }

    /// Delete the copies of the keys that left the cache (at a checkpoint, and in batches
    /// as evictions go: the live copy is only ever read from a snapshot, so a key's copy may
    /// go as soon as the key left the cache).
    fn delete_departed(&mut self) -> Result<(), StoreError> {
        let departed = self.cache.take_departed();
        if departed.is_empty() {
            return Ok(());
        }
        match self.spill.write_copies(&departed, &[]) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.cache.return_departed(departed);
                Err(e)
            }
        }
    }

    /// Restore from the checkpoint bytes of one or (restoring at another parallelism) every
    /// subtask of the node, by their index (the RocksDB state of this subtask's key groups, if
    /// any, is in the shard already; state held in the bytes is filtered to them). Each old
    /// subtask's clocks are taken at their earliest: at an aligned barrier every subtask has
    /// seen the same watermarks, and an earlier time only fires nothing that already fired.
    fn restore(&mut self, parts: &[(u32, Vec<u8>)]) -> Result<(), String> {
        let mut clocks: Option<[u64; 3]> = None;
        for (index, bytes) in parts {
            let bad =
                || format!("window {}: the checkpoint's bytes of subtask {index} are not a window snapshot", self.node);
            let rest = bytes.strip_prefix(SNAPSHOT_MAGIC.as_slice()).ok_or_else(bad)?;
            if rest.len() < 25 {
                return Err(bad());
            }
            let word = |i: usize| u64::from_le_bytes(rest[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            let these = [word(0), word(1), word(2)];
            clocks = Some(match clocks {
                None => these,
                Some(c) => [c[0].min(these[0]), c[1].min(these[1]), c[2].min(these[2])],
            });
            if rest[24] == 1 {
                self.spill.import(&rest[25..], &self.key_groups).map_err(|e| format!("window {}: {e}", self.node))?;
            }
        }
        if let Some([w, forwarded, last_sweep]) = clocks {
            (self.w, self.forwarded, self.last_sweep) = (w, forwarded, last_sweep);
        }
        self.spill.rebuild_filter().map_err(|e| format!("window {}: {e}", self.node))?;
        self.load_copies().map_err(|e| format!("window {}: {e}", self.node))?;
        // Early, never late: the first advance sweeps every key.
        self.next_due = 0;
        Ok(())
    }

    /// Restore: the cache as the checkpoint's copy holds it (whole keys, none of them in
    /// the store's windows), clean; what does not fit (restoring at a lower parallelism)
    /// is evicted to the store as usual.
    /// Read in chunks of a batch of keys, so that restoring at a lower parallelism (several
    /// old caches into one) holds no more than one batch beyond the cache.
    fn load_copies(&mut self) -> Result<(), StoreError> {
        let chunk = self.cache.batch_keys();
        let mut from = (0u16, 0u64);
        loop {
            let (mut slots, mut next, mut failure) = (Vec::with_capacity(chunk), None, None);
            self.spill.scan_copies(from, &mut |kg, key, bytes| {
                if slots.len() >= chunk {
                    next = Some((kg, key));
                    return false;
                }
                match super::store::decode_copy::<G::Acc>(kg, key, bytes) {
                    Ok(slot) => {
                        slots.push(slot);
                        true
                    }
                    Err(e) => {
                        failure = Some(e);
                        false
                    }
                }
            })?;
            if let Some(e) = failure {
                return Err(e);
            }
            for mut slot in slots {
                slot.next_due = self.config.kind.next_due(&slot, self.config.lateness_ns);
                (slot.dirty, slot.copied) = (false, true);
                if self.cache.is_full() {
                    let victims = self.cache.evict();
                    self.counters.evicted_keys.add(victims.len() as u64);
                    self.spill.put(victims)?;
                }
                self.cache.insert(slot);
            }
            match next {
                Some(n) => from = n,
                None => return Ok(()),
            }
        }
    }

    /// The slot of `key`, for a record at `t`: cached, or new (blind: partial, when the
    /// store may hold the key and the record fires nothing again), or loaded from the store.
    #[inline]
    fn slot_of(&mut self, key: u64, record: &T, t: u64) -> Result<usize, Halt> {
        if let Some(i) = self.cache.get(key) {
            return Ok(i);
        }
        self.slot_new(key, record, t)
    }

    #[cold]
    fn slot_new(&mut self, key: u64, record: &T, t: u64) -> Result<usize, Halt> {
        let kg = self.groups.key_group((self.config.key_hash)(record)) as u16;
        let slot = if !self.spill.maybe_stored(key) {
            Slot::new(key, kg, self.w)
        } else if self.spill.merges && !self.config.kind.touches_due(t, self.w) {
            // No read: the stored windows are folded in when one of the key's windows fires
            // (the sweep reads the store in order), or when a record must fire one again.
            Slot { partial: true, ..Slot::new(key, kg, self.w) }
        } else {
            match self.spill.take::<G::Acc>(kg, key).map_err(|e| failed(&self.node, e))? {
                Some(mut slot) => {
                    slot.next_due = self.config.kind.next_due(&slot, self.config.lateness_ns);
                    slot
                }
                None => Slot::new(key, kg, self.w),
            }
        };
        if self.cache.is_full() {
            let victims = self.cache.evict();
            self.counters.evicted_keys.add(victims.len() as u64);
            self.spill.put(victims).map_err(|e| failed(&self.node, e))?;
            if self.cache.departed_len() >= self.cache.batch_keys() {
                self.delete_departed().map_err(|e| failed(&self.node, e))?;
            }
            // Eviction moves slots about: a cache-phase cursor could now skip one. Start the
            // cache phase over (what it visited is caught up: a compare each); the store
            // phase that follows sees every evicted key.
            if let Some(Sweep::Cache { .. }) = self.sweep {
                self.sweep = Some(Sweep::Cache { next: 0 });
            }
        }
        Ok(self.cache.insert(slot))
    }

    /// Make partial slot `i` whole: read the key's stored windows and fold them in (a
    /// record is about to fire one of its windows again, or they became due mid-sweep).
    #[cold]
    fn complete(&mut self, i: usize) -> Result<(), Halt> {
        complete_slot(&mut self.spill, &*self.agg, &self.config, self.cache.slot(i))
            .map_err(|e| failed(&self.node, e))?;
        self.next_due = self.next_due.min(self.cache.slot(i).next_due);
        self.cache.account(i);
        Ok(())
    }

    /// Write every partial slot to the store as merge operands and drop it from the cache,
    /// so that the cache holds whole keys only: before a sweep (the store phase reads each
    /// key's windows folded, in order, instead of one read per key) and before a snapshot
    /// (whose copy of the cache into the store must be undone afterwards; operands cannot).
    fn flush_partials(&mut self) -> Result<(), Halt> {
        if !self.spill.merges {
            return Ok(());
        }
        let batch = self.cache.batch_keys();
        let (mut out, mut i, mut removed) = (Vec::new(), 0, false);
        while i < self.cache.len() {
            if self.cache.slots()[i].partial {
                // The last slot moves to `i`: look at `i` again.
                out.push(self.cache.remove(i));
                removed = true;
                if out.len() >= batch {
                    self.spill.put(std::mem::take(&mut out)).map_err(|e| failed(&self.node, e))?;
                }
            } else {
                i += 1;
            }
        }
        // A snapshot mid-sweep moved slots under a cache-phase cursor: start that phase over,
        // as an eviction does (what it visited costs a compare each).
        if removed && let Some(Sweep::Cache { .. }) = self.sweep {
            self.sweep = Some(Sweep::Cache { next: 0 });
        }
        self.spill.put(out).map_err(|e| failed(&self.node, e))
    }

    fn late(&mut self, record: &T) -> Result<(), Halt> {
        self.counters.late_records.add(1);
        if let Some(f) = &self.config.on_late {
            f(record);
        }
        // The side output of late records, when the aggregate has one.
        if let Some(out) = self.agg.late_output(record) {
            self.counters.records_out.add(1);
            self.down.collect(&out)?;
        }
        Ok(())
    }

    /// The time advanced to `w`: start a sweep if something is due. (Equal to the time the
    /// windows are at, too: after a restore from a checkpoint taken mid-sweep, windows due at
    /// that time are still in the state, and `next_due` is 0.)
    fn advance(&mut self, w: u64) -> Result<(), Halt> {
        if w < self.w || (w == self.w && self.next_due > w) {
            return Ok(());
        }
        self.w = w;
        self.maybe_sweep()
    }

    /// Data records the subtask may give a sweep in progress before its next chunk. In the
    /// cache phase a quarter of the free cache slots, so the record path rarely has to evict
    /// (which restarts that phase: a compare per cached key), and none once the cache is
    /// full (every new key would evict and restart it). In the store phase an eviction costs
    /// the sweep nothing (its cursor is in the store, and it reads what is evicted ahead of
    /// it), so at least a chunk's worth: the input keeps moving while millions of stored
    /// keys fire, and a barrier behind it reaches the snapshot within a chunk or two
    /// instead of waiting for the whole sweep (seconds at 10^7 keys).
    fn interleave_budget(&self) -> usize {
        let free = self.cache.capacity().saturating_sub(self.cache.len()) / 4;
        match self.sweep {
            Some(Sweep::Store { .. }) => free.max(FIRE_CHUNK),
            _ if self.cache.is_full() => 0,
            _ => free,
        }
    }

    /// When the next sweep may start: something is due, and (sessions) the quantum passed.
    fn next_sweep_at(&self) -> u64 {
        if self.next_due == u64::MAX {
            return u64::MAX;
        }
        self.next_due.max(self.last_sweep.saturating_add(self.config.kind.sweep_quantum()))
    }

    fn maybe_sweep(&mut self) -> Result<(), Halt> {
        if self.sweep.is_none() && (self.w >= self.next_sweep_at() || (self.w == u64::MAX && self.next_due < u64::MAX))
        {
            self.flush_partials()?;
            self.sweep = Some(Sweep::Cache { next: 0 });
            self.sweep_next_due = u64::MAX;
            self.sweep_from = self.w;
        }
        Ok(())
    }

    /// Send the watermark downstream — held back to the first window not yet fired, so no
    /// result comes after a watermark past its window.
    fn forward(&mut self) -> Result<(), Halt> {
        let w = self.w.min(self.next_due);
        if w > self.forwarded {
            self.forwarded = w;
            self.down.signal(Signal::Watermark(w))?;
        }
        Ok(())
    }

    /// One chunk of the sweep in progress. Returns whether it is done.
    fn sweep_chunk(&mut self) -> Result<bool, Halt> {
        let Some(sweep) = self.sweep.take() else { return Ok(true) };
        let config = self.config.clone();
        let mut f = Firing {
            agg: &*self.agg,
            out: &mut *self.down,
            records_out: self.counters.records_out.counter(),
            w: self.w,
            lateness: config.lateness_ns,
            fired: 0,
            newest_end: 0,
            _t: PhantomData,
        };
        match sweep {
            Sweep::Cache { mut next } => {
                let mut visited = 0;
                let deadline = weir_ring::process::coarse_monotonic_ns()
                    + CHUNK_TIME.as_nanos() as u64
                    + weir_ring::process::coarse_resolution_ns();
                while next < self.cache.len() && visited + f.fired < FIRE_CHUNK {
                    if visited % 64 == 63 && weir_ring::process::coarse_monotonic_ns() >= deadline {
                        break;
                    }
                    visited += 1;
                    let slot = self.cache.slot(next);
                    if slot.partial && slot.caught_up < f.w && slot.next_due <= f.w {
                        // Started blind during this sweep, and due since (the time moved
                        // on): it fires whole.
                        complete_slot(&mut self.spill, &*self.agg, &config, slot).map_err(|e| failed(&self.node, e))?;
                    }
                    if slot.caught_up < f.w {
                        if slot.next_due <= f.w {
                            config.kind.catch_up(slot, &mut f)?;
                        }
                        slot.caught_up = f.w;
                    }
                    if slot.entries.is_empty() {
                        // The last slot moves here: look at `next` again.
                        self.cache.remove(next);
                    } else {
                        self.sweep_next_due = self.sweep_next_due.min(slot.next_due);
                        self.cache.account(next);
                        next += 1;
                    }
                }
                if next < self.cache.len() {
                    self.sweep = Some(Sweep::Cache { next });
                } else if self.spill.stored_keys > 0 {
                    self.sweep = Some(Sweep::Store { from: (0, 0) });
                }
            }
            Sweep::Store { from } => {
                let keys = self.cache.batch_keys().min(FIRE_CHUNK);
                let (slots, next) = self.spill.read::<G::Acc>(from, keys).map_err(|e| failed(&self.node, e))?;
                // Per key read, after firing: the slot, whether it fired, and where its old
                // window starts are in `old`.
                let mut read: Vec<(Slot<G::Acc>, bool, std::ops::Range<usize>)> = Vec::with_capacity(slots.len());
                let mut old = Vec::new();
                let (mut gone, mut stay) = (0usize, 0usize);
                for mut slot in slots {
                    if let Some(i) = self.cache.get(slot.key) {
                        // A partial of this key was started during the sweep: the stored
                        // windows (older) fold into it and leave the store; it fires here.
                        let cached = self.cache.slot(i);
                        debug_assert!(cached.partial, "a whole cached key {} also in the store", slot.key);
                        let at = old.len();
                        old.extend(slot.entries.as_slice().iter().map(|e| e.start));
                        gone += slot.entries.len();
                        let (kg, key) = (slot.kg, slot.key);
                        read.push((Slot::new(key, kg, 0), true, at..old.len()));
                        super::store::fold_into(&*self.agg, cached, slot);
                        cached.next_due = config.kind.next_due(cached, config.lateness_ns);
                        if cached.caught_up < f.w && cached.next_due <= f.w {
                            config.kind.catch_up(cached, &mut f)?;
                        }
                        self.sweep_next_due = self.sweep_next_due.min(cached.next_due);
                        self.cache.account(i);
                        // (The empty stand-in pushed above deletes its windows and forgets it.)
                        continue;
                    }
                    slot.next_due = config.kind.next_due(&slot, config.lateness_ns);
                    let at = old.len();
                    let before = slot.entries.len();
                    let fired = slot.caught_up < f.w && slot.next_due <= f.w;
                    if fired {
                        old.extend(slot.entries.as_slice().iter().map(|e| e.start));
                        config.kind.catch_up(&mut slot, &mut f)?;
                    }
                    gone += before.saturating_sub(slot.entries.len());
                    stay += slot.entries.len();
                    self.sweep_next_due = self.sweep_next_due.min(slot.next_due);
                    read.push((slot, fired, at..old.len()));
                }
                let batch = if gone > stay {
                    // Most of what was read is gone (a tumbling window fired): one range delete
                    // over the keys read, and what stays written again, instead of a delete per
                    // window (each a memtable entry and a tombstone to compact).
                    self.spill.range_rewrite(from, next, read.iter().map(|(slot, _, _)| slot))
                } else {
                    let mut batch = StoreBatch::default();
                    for (slot, fired, starts) in &read {
                        if *fired {
                            self.spill.write_back(&mut batch, slot, &old[starts.clone()]);
                        }
                    }
                    batch
                };
                self.spill.write(batch).map_err(|e| failed(&self.node, e))?;
                if let Some(from) = next {
                    self.sweep = Some(Sweep::Store { from });
                }
            }
        }
        self.fired_end = self.fired_end.max(f.newest_end);
        if self.sweep.is_some() {
            return Ok(false);
        }
        // Done: every key was visited at the time the sweep started at, or later.
        self.next_due = self.sweep_next_due;
        self.last_sweep = self.sweep_from;
        Ok(true)
    }

    /// Fire everything (end of input): the time jumps to +∞ and one sweep runs to the end,
    /// unchunked — nothing else waits behind the last results.
    fn fire_all(&mut self) -> Result<(), Halt> {
        self.flush_partials()?;
        self.w = u64::MAX;
        self.sweep = Some(Sweep::Cache { next: 0 });
        self.sweep_next_due = u64::MAX;
        self.sweep_from = self.w;
        while !self.sweep_chunk()? {}
        // No marker: these fired because the input ended, not because their time came (a
        // window end may still be ahead of the clock).
        self.fired_end = 0;
        Ok(())
    }

    /// After results: a latency marker behind them, its event time the newest window end
    /// fired and its ingest time the newest marker's that came in (the data they were
    /// made of entered no later than the newest data here). So a sink after a window times
    /// its results: window end to acknowledged. Only when a marker came in since the last
    /// (markers may be off).
    fn mark_fired(&mut self) -> Result<(), Halt> {
        let end = std::mem::take(&mut self.fired_end);
        // No marker came in since the last went out (or the job sends none: markers off):
        // none goes out. Each incoming marker's ingest time is used once, so results fired
        // long after the last marker carry no old one.
        let ingest_ns = std::mem::take(&mut self.marker_ingest);
        if end == 0 || ingest_ns == 0 {
            return Ok(());
        }
        self.down.signal(Signal::Latency(crate::operators::LatencyMarker { ingest_ns, event_ns: end }))
    }
}

impl<T: Record, G: WindowAggregate<T>> Collector<T> for WindowOperator<T, G> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        self.counters.records_in.add(1);
        let config = &*self.config;
        let key = (config.key)(record);
        let t = match (config.domain, &config.time) {
            (TimeDomain::Event, Some(time)) => time(record),
            // The time a record arrives; at or after the time the windows are at, so never late.
            _ => self.proc_now.max(self.w),
        };
        let w = self.w;
        if config.kind.all_expired(t, w, config.lateness_ns) {
            return self.late(record);
        }
        let i = self.slot_of(key, record, t)?;
        let slot = self.cache.slot(i);
        if slot.partial && (slot.next_due <= w || self.config.kind.touches_due(t, w)) {
            // A window of the key fires (again) with this record: it needs the key whole.
            self.complete(i)?;
        }
        let config = &*self.config;
        let mut f = Firing {
            agg: &*self.agg,
            out: &mut *self.down,
            records_out: self.counters.records_out.counter(),
            w,
            lateness: config.lateness_ns,
            fired: 0,
            newest_end: 0,
            _t: PhantomData,
        };
        let slot = self.cache.slot(i);
        slot.touched = true;
        if slot.caught_up < w {
            if slot.next_due <= w {
                config.kind.catch_up(slot, &mut f)?;
            }
            slot.caught_up = w;
        }
        let accepted = config.kind.add(slot, t, record, &mut f)?;
        let (next_due, empty) = (slot.next_due, slot.entries.is_empty());
        self.next_due = self.next_due.min(next_due);
        if self.sweep.is_some() {
            // The sweep in progress sets `next_due` from what it visits: a key it already
            // passed must still count. And no slot moves under its cursor: an empty slot
            // waits for a sweep to remove it.
            self.sweep_next_due = self.sweep_next_due.min(next_due);
            self.cache.account(i);
        } else if empty {
            self.cache.remove(i);
        } else {
            self.cache.account(i);
        }
        if !accepted {
            return self.late(record);
        }
        Ok(())
    }

    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        match signal {
            Signal::Watermark(w) if self.config.domain == TimeDomain::Event => {
                self.advance(w)?;
                if self.sweep.is_some() {
                    // Results first: the watermark follows when the sweep is done.
                    self.held = true;
                    Ok(())
                } else {
                    self.forward()
                }
            }
            Signal::End => {
                // (Restored from a final checkpoint, the state is empty: nothing fires.)
                self.fire_all()?;
                self.down.signal(Signal::End)
            }
            Signal::Barrier(id) => {
                self.snapshot(id);
                self.down.signal(Signal::Barrier(id))
            }
            // Markers stop here: the results carry their own (`mark_fired`).
            Signal::Latency(m) => {
                self.marker_ingest = self.marker_ingest.max(m.ingest_ns);
                Ok(())
            }
            // Flush; and watermarks pass a processing-time window untouched.
            other => self.down.signal(other),
        }
    }

    fn resume(&mut self) -> Result<Work, Halt> {
        if self.sweep.is_none() {
            return Ok(Work::Done);
        }
        if self.sweep_chunk()? && self.w > self.last_sweep {
            // A watermark that came during the sweep may have made keys it visited before
            // due again: sweep again at the new time before the (held) watermark goes on.
            // (Only then: keys due at the time swept, but caught up to it — a late record
            // within the allowed lateness — wait for the next watermark, as they always did.)
            self.maybe_sweep()?;
        }
        if self.sweep.is_some() {
            return Ok(match self.interleave_budget() {
                0 => Work::More,
                n => Work::Interleave(n),
            });
        }
        self.mark_fired()?;
        if std::mem::take(&mut self.held) {
            self.forward()?;
        }
        // The sweep's last results (and the marker and watermark behind them) go out now,
        // not with the next input, which may not come for a while.
        self.down.signal(Signal::Flush)?;
        Ok(Work::Done)
    }

    fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
        if let Some(why) = self.broken.take() {
            return Err(Halt::failed(why));
        }
        if self.config.domain != TimeDomain::Processing {
            return Ok(None);
        }
        let now = (self.config.clock)();
        // Records let in during a sweep arrive now, not when it started.
        self.proc_now = now;
        if self.sweep.is_some() {
            return Ok(None);
        }
        self.advance(now)?;
        let at = self.next_sweep_at();
        Ok((at < u64::MAX).then(|| Duration::from_nanos(at.saturating_sub(now))))
    }
}

/// Fold what the store holds of `slot`'s key into it (taking it out of the store), and
/// say when the whole key is next due.
fn complete_slot<T, G: WindowAggregate<T>>(
    spill: &mut Spill,
    agg: &G,
    config: &WindowConfig<T>,
    slot: &mut Slot<G::Acc>,
) -> Result<(), StoreError> {
    if let Some(stored) = spill.take::<G::Acc>(slot.kg, slot.key)? {
        super::store::fold_into(agg, slot, stored);
    }
    slot.partial = false;
    slot.next_due = config.kind.next_due(slot, config.lateness_ns);
    Ok(())
}

/// How the accumulators `node` restores convert to `A`: `None` when they are of its type
/// (or nothing is restored), an error when they cannot (refused at start already).
fn acc_migration<A: Record>(
    snapshots: &crate::checkpoint::Snapshots,
    node: &str,
) -> Result<Option<crate::record::schema::Migration>, String> {
    let Some(old) = snapshots.restored_node(node) else { return Ok(None) };
    let Some(part) = old.state.and_then(|s| s.parts.into_iter().find(|p| p.kind == "windows")) else {
        return Ok(None);
    };
    match crate::record::schema::plan(&part.value, &A::schema()) {
        Ok(m) if m.is_same() => Ok(None),
        Ok(m) => Ok(Some(m)),
        Err(refused) => {
            let text: Vec<String> = refused.iter().map(|r| r.to_string()).collect();
            Err(format!("its accumulators cannot be read as {}: {}", A::schema(), text.join(", ")))
        }
    }
}

/// What a migration changes, in words.
#[cfg(feature = "rocksdb")]
fn changes_of(m: &crate::record::schema::Migration) -> String {
    match m {
        crate::record::schema::Migration::Convert { changes, .. } => changes.join(", "),
        crate::record::schema::Migration::Same => String::new(),
    }
}

/// A window snapshot's bytes with the windows it holds inline (the heap's) converted by `m`.
fn convert_inline(bytes: &[u8], m: &crate::record::schema::Migration) -> Result<Vec<u8>, String> {
    let Some(rest) = bytes.strip_prefix(SNAPSHOT_MAGIC.as_slice()) else { return Ok(bytes.to_vec()) };
    if rest.get(24) != Some(&1) {
        return Ok(bytes.to_vec());
    }
    let mut out = bytes[..SNAPSHOT_MAGIC.len() + 25].to_vec();
    let mut inline = &rest[25..];
    while !inline.is_empty() {
        let head = inline.get(..22).ok_or("truncated windows")?;
        let len = u32::from_le_bytes(head[18..22].try_into().expect("4 bytes")) as usize;
        let v = super::store::convert_value(inline.get(22..22 + len).ok_or("truncated windows")?, m)?;
        out.extend_from_slice(&head[..18]);
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(&v);
        inline = &inline[22 + len..];
    }
    Ok(out)
}

/// The link of a window node.
pub(crate) fn window_fn<T: Record, G: WindowAggregate<T>>(
    config: Arc<WindowConfig<T>>,
    agg: Arc<G>,
    merge: Option<crate::state::ValueMerge>,
) -> LinkFn {
    Arc::new(move |info: &SubtaskInfo, counters, env: &crate::chain::OperatorEnv, down| {
        let down = unerase::<G::Out>(down, &info.node);
        let heap = || match &merge {
            Some(m) => MemoryStore::with_merge(m.clone()),
            None => MemoryStore::default(),
        };
        // Accumulators restored from a checkpoint of another version of the job whose type
        // differs from this one's are converted once, before anything reads them.
        #[cfg_attr(not(feature = "rocksdb"), allow(unused_mut))] // converted only in RocksDB's stores
        let (migration, mut broken) = match acc_migration::<G::Acc>(&env.snapshots, &info.node) {
            Ok(m) => (m, None),
            Err(e) => (None, Some(format!("window {}: {e}", info.name()))),
        };
        // The operator's column family in the subtask's shard (with the merge operator the
        // backend was given for it); the heap without a backend.
        let (store, opened_broken): (Box<dyn WindowStore>, _) = match &env.shard {
            #[cfg(feature = "rocksdb")]
            Some(shard) => {
                let opened = shard.store(&info.node).and_then(|windows| {
                    let copies = shard.store(&crate::state::cache_copy_family(&info.node))?;
                    Ok((windows, copies))
                });
                if let (Ok((windows, copies)), Some(m)) = (&opened, &migration) {
                    match super::runs::convert_stored(windows, copies, &info.key_groups(), m) {
                        Ok(n) => tracing::info!(
                            event = "state_migrated",
                            node = %info.node,
                            subtask = %info.name(),
                            "window {}: {n} stored values converted ({})",
                            info.name(),
                            changes_of(m)
                        ),
                        Err(e) => broken = Some(format!("window {}: cannot convert its windows: {e}", info.name())),
                    }
                }
                match (opened, &merge) {
                    // Partials that merge go to RocksDB in sorted runs, a batch at a time
                    // (see `super::runs`).
                    (Ok((s, copies)), Some(m)) => {
                        let pending_max = run_buffer(config.cache_bytes) as usize;
                        let runs = super::runs::RunStore::new(s, info.key_groups(), m.clone(), pending_max);
                        (Box::new(runs.with_copies(copies)), None)
                    }
                    (Ok((s, copies)), None) => {
                        (Box::new(super::rocks::RocksWindowStore::new(s, info.key_groups()).with_copies(copies)), None)
                    }
                    (Err(e), _) => (Box::new(heap()), Some(format!("window {}: {e}", info.name()))),
                }
            }
            #[cfg(not(feature = "rocksdb"))]
            Some(never) => match *never {},
            None => (Box::new(heap()), None),
        };
        let mut op = WindowOperator::new(
            config.clone(),
            agg.clone(),
            info.key_groups_of_keys(),
            store,
            down,
            counters,
            info.name(),
        );
        op.broken = broken.or(opened_broken);
        op.node_id = info.node.clone();
        op.key_groups = info.key_groups();
        op.snapshots = env.snapshots.clone();
        if op.broken.is_none() {
            let mut none = crate::checkpoint::no_migration;
            let mut expected = crate::checkpoint::Expected::only("window", &mut none);
            let convert = |parts: Vec<(u32, Vec<u8>)>| -> Result<Vec<(u32, Vec<u8>)>, String> {
                match &migration {
                    None => Ok(parts),
                    Some(m) => parts.into_iter().map(|(i, b)| Ok((i, convert_inline(&b, m)?))).collect(),
                }
            };
            op.broken = match env.snapshots.restored(&info.node, &mut expected) {
                Ok(crate::checkpoint::Restored::Same(_, bytes)) => {
                    convert(vec![(0, bytes)]).and_then(|parts| op.restore(&parts)).err()
                }
                Ok(crate::checkpoint::Restored::Rescaled(r)) => {
                    convert(r.parts).and_then(|parts| op.restore(&parts)).err()
                }
                Ok(crate::checkpoint::Restored::Fresh) => None,
                Err(e) => Some(format!("window {}: cannot restore its checkpoint: {e}", info.name())),
            };
        }
        let op: Box<dyn Collector<T>> = Box::new(op);
        erase::<T>(op) as AnyCollector
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Event;
    use crate::window::{Aggregates, WindowKind, WindowResult};
    use std::sync::Mutex;
    use weir_ring::counters::SharedCounter;

    /// What reaches the collector after the window: results and watermarks, in order.
    #[derive(Debug, Clone, PartialEq)]
    enum Seen {
        Result(WindowResult),
        Watermark(u64),
    }

    struct Recorder(Arc<Mutex<Vec<Seen>>>);

    impl Collector<WindowResult> for Recorder {
        fn collect(&mut self, r: &WindowResult) -> Result<(), Halt> {
            self.0.lock().unwrap().push(Seen::Result(*r));
            Ok(())
        }
        fn signal(&mut self, s: Signal) -> Result<(), Halt> {
            if let Signal::Watermark(w) = s {
                self.0.lock().unwrap().push(Seen::Watermark(w));
            }
            Ok(())
        }
    }

    type Operator = WindowOperator<Event, Aggregates<Event>>;

    fn operator(kind: WindowKind, cache_bytes: u64) -> (Operator, Arc<Mutex<Vec<Seen>>>) {
        operator_over(kind, cache_bytes, false)
    }

    /// The operator over a heap store that folds merge operands when `merges` (so keys that
    /// miss the cache start partial slots, as on RocksDB).
    fn operator_over(kind: WindowKind, cache_bytes: u64, merges: bool) -> (Operator, Arc<Mutex<Vec<Seen>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let config = WindowConfig::<Event> {
            kind: Kind::of(kind),
            domain: TimeDomain::Event,
            lateness_ns: 0,
            key: Arc::new(|e: &Event| e.key),
            key_hash: Arc::new(|e: &Event| crate::record::hash_key(&e.key)),
            time: Some(Arc::new(|e: &Event| e.time_ns)),
            on_late: None,
            cache_bytes,
            clock: Arc::new(|| 0),
        };
        let counters = NodeCounters {
            records_in: SharedCounter::detached(),
            records_out: SharedCounter::detached(),
            late_records: SharedCounter::detached(),
            evicted_keys: SharedCounter::detached(),
            latency: Vec::new(),
        };
        let op = WindowOperator::new(
            Arc::new(config),
            Arc::new(Aggregates::of(|e: &Event| e.value).count().sum()),
            KeyGroups::new(1, 128),
            Box::new(if merges {
                MemoryStore::with_merge(crate::window::store::value_merge::<crate::window::Stats>(|a, b| a.merge(b)))
            } else {
                MemoryStore::default()
            }),
            Box::new(Recorder(seen.clone())),
            counters,
            "w#0".into(),
        );
        (op, seen)
    }

    /// The cache's copy: (key group, key) → encoded slot.
    type Copies = std::collections::BTreeMap<(u16, u64), Vec<u8>>;

    /// A heap store that also keeps the cache's copy (as the RocksDB store does), counting
    /// what each checkpoint writes to it.
    #[derive(Default, Clone)]
    struct Copying {
        windows: Arc<Mutex<MemoryStore>>,
        copies: Arc<Mutex<Copies>>,
        /// (puts, deletes) written so far.
        written: Arc<Mutex<(usize, usize)>>,
    }

    impl WindowStore for Copying {
        fn write(&mut self, batch: &StoreBatch) -> Result<(), StoreError> {
            self.windows.lock().unwrap().write(batch)
        }
        fn scan_key(&mut self, kg: u16, key: u64, visit: &mut dyn FnMut(u64, &[u8])) -> Result<(), StoreError> {
            self.windows.lock().unwrap().scan_key(kg, key, visit)
        }
        fn scan_from(
            &mut self,
            from: (u16, u64),
            visit: &mut super::super::store::VisitWindow<'_>,
        ) -> Result<(), StoreError> {
            self.windows.lock().unwrap().scan_from(from, visit)
        }
        fn keeps_copies(&self) -> bool {
            true
        }
        fn write_copies(&mut self, deletes: &[(u16, u64)], puts: &[(u16, u64, Vec<u8>)]) -> Result<(), StoreError> {
            let mut c = self.copies.lock().unwrap();
            for k in deletes {
                c.remove(k);
            }
            for (kg, key, v) in puts {
                c.insert((*kg, *key), v.clone());
            }
            let mut w = self.written.lock().unwrap();
            w.0 += puts.len();
            w.1 += deletes.len();
            Ok(())
        }
        fn scan_copies(
            &mut self,
            from: (u16, u64),
            visit: &mut super::super::store::VisitCopy<'_>,
        ) -> Result<(), StoreError> {
            for ((kg, key), v) in self.copies.lock().unwrap().range(from..) {
                if !visit(*kg, *key, v) {
                    break;
                }
            }
            Ok(())
        }
    }

    /// Incremental checkpoints: the first writes every cached key's copy, the next only the
    /// keys changed since (none, then three), keys that left the cache are deleted from the
    /// copy, and an operator restored from the windows and the copy fires exactly what the
    /// first would.
    #[test]
    fn a_checkpoint_writes_only_the_keys_changed_since_the_last() {
        let store = Copying::default();
        let make = |store: &Copying| {
            let (mut op, seen) = operator(WindowKind::Tumbling { size: Duration::from_secs(3600) }, 1 << 20);
            op.spill = Spill::new(Box::new(store.clone()), 1024);
            op.key_groups = 0..128;
            (op, seen)
        };
        let (mut op, seen) = make(&store);
        let event = |key: u64, t: u64| Event { key, value: key + 1, time_ns: t, seq: 0 };
        for key in 0..200 {
            op.collect(&event(key, 10)).unwrap();
        }
        op.write_copies().unwrap();
        assert_eq!(*store.written.lock().unwrap(), (200, 0), "the first writes every key");
        op.write_copies().unwrap();
        assert_eq!(*store.written.lock().unwrap(), (200, 0), "nothing changed: nothing written");
        for key in [1, 2, 3] {
            op.collect(&event(key, 20)).unwrap();
        }
        op.write_copies().unwrap();
        assert_eq!(*store.written.lock().unwrap(), (203, 0), "three keys changed");
        // Ten keys leave the cache (as an eviction takes them): their copies go.
        let gone: Vec<_> = (0..10).map(|_| op.cache.remove(0)).collect();
        op.spill.put(gone).unwrap();
        op.write_copies().unwrap();
        assert_eq!(*store.written.lock().unwrap(), (203, 10));
        assert_eq!(store.copies.lock().unwrap().len(), 190);
        // A restore from the windows and the copy: the same results at the end of input.
        let mut clocks = SNAPSHOT_MAGIC.to_vec();
        for v in [op.w, op.forwarded, op.last_sweep] {
            clocks.extend_from_slice(&v.to_le_bytes());
        }
        clocks.push(0);
        let (mut restored, seen_restored) = make(&store);
        restored.restore(&[(0, clocks)]).unwrap();
        assert_eq!(restored.cache.len(), 190, "the copy is the cache");
        restored.signal(Signal::End).unwrap();
        let mut got: Vec<(u64, u64, u64)> = seen_restored
            .lock()
            .unwrap()
            .iter()
            .filter_map(|x| match x {
                Seen::Result(r) => Some((r.key, r.count, r.sum)),
                Seen::Watermark(_) => None,
            })
            .collect();
        got.sort_unstable();
        let want: Vec<(u64, u64, u64)> =
            (0..200).map(|k| if (1..4).contains(&k) { (k, 2, 2 * (k + 1)) } else { (k, 1, k + 1) }).collect();
        assert_eq!(got, want, "every key once, as counted before the restore");
        assert!(seen.lock().unwrap().is_empty(), "nothing fired before the end");
    }

    /// A watermark that makes 10,000 windows due fires them in chunks of at most
    /// FIRE_CHUNK per `resume`, reads as `More` until the last, and sends the watermark on
    /// only after every result it caused.
    #[test]
    fn fires_in_bounded_chunks_and_holds_the_watermark() {
        let (mut op, seen) = operator(WindowKind::Tumbling { size: Duration::from_nanos(10) }, 64 << 20);
        const KEYS: u64 = 10_000;
        for key in 0..KEYS {
            op.collect(&Event { key, value: key, time_ns: key % 10, seq: key }).unwrap();
        }
        op.signal(Signal::Watermark(10)).unwrap();
        assert!(seen.lock().unwrap().is_empty(), "nothing fires inside the signal call");
        let mut calls = 0;
        loop {
            let before = seen.lock().unwrap().len();
            let work = op.resume().unwrap();
            calls += 1;
            let fired = seen.lock().unwrap().len() - before;
            assert!(fired <= FIRE_CHUNK + 1, "a chunk fired {fired}");
            if work == Work::Done {
                break;
            }
        }
        assert!(calls as u64 >= KEYS / FIRE_CHUNK as u64, "{calls} calls");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len() as u64, KEYS + 1);
        assert_eq!(seen.last(), Some(&Seen::Watermark(10)), "the watermark comes after its results");
        let total: u64 = seen.iter().map(|s| if let Seen::Result(r) = s { r.sum } else { 0 }).sum();
        assert_eq!(total, KEYS * (KEYS - 1) / 2);
    }

    /// Input between the chunks of a sweep (`Work::Interleave`), as the subtask gives it:
    /// records for keys already swept and not yet swept, for the next windows, enough new
    /// keys that the small cache evicts mid-sweep (restarting its cache phase), and a
    /// watermark that moves the time on while the first sweep runs. Every window fires
    /// exactly once with exactly its records, and no result comes after a watermark past its
    /// window's end.
    #[test]
    fn input_between_chunks_keeps_results_exact_and_in_order() {
        for (cache, merges) in [(64 << 20, false), (64 * 1024, false), (64 * 1024, true)] {
            let (mut op, seen) = operator_over(WindowKind::Tumbling { size: Duration::from_nanos(10) }, cache, merges);
            const KEYS: u64 = 6_000;
            // (key, window start) -> records sent
            let mut sent: std::collections::HashMap<(u64, u64), u64> = Default::default();
            let mut send = |op: &mut Operator, key: u64, t: u64| {
                op.collect(&Event { key, value: 1, time_ns: t, seq: key }).unwrap();
                *sent.entry((key, t / 10 * 10)).or_default() += 1;
            };
            for key in 0..KEYS {
                send(&mut op, key, key % 10);
            }
            op.signal(Signal::Watermark(10)).unwrap();
            let (mut next_key, mut interleaved, mut watermark_sent) = (0u64, 0usize, false);
            loop {
                match op.resume().unwrap() {
                    Work::Done => break,
                    Work::More => {}
                    Work::Interleave(n) => {
                        for _ in 0..n.min(97) {
                            // Keys cycling over twice the first round's: old and new keys.
                            let key = next_key % (2 * KEYS);
                            let t = if watermark_sent { 25 } else { 15 };
                            send(&mut op, key, t);
                            next_key += 7;
                            interleaved += 1;
                        }
                        if interleaved > 3_000 && !watermark_sent {
                            op.signal(Signal::Watermark(20)).unwrap();
                            watermark_sent = true;
                        }
                    }
                }
            }
            assert!(interleaved > 0, "cache {cache}: the sweep let no input in");
            op.signal(Signal::Watermark(40)).unwrap();
            while op.resume().unwrap() != Work::Done {}
            op.signal(Signal::End).unwrap();
            let seen = seen.lock().unwrap();
            let mut fired: std::collections::HashMap<(u64, u64), u64> = Default::default();
            let mut watermark = 0;
            for s in seen.iter() {
                match s {
                    Seen::Watermark(w) => {
                        assert!(*w >= watermark, "watermarks go forward");
                        watermark = *w;
                    }
                    Seen::Result(r) => {
                        assert!(
                            r.end_ns > watermark,
                            "cache {cache}: result of [{}, {}) after watermark {watermark}",
                            r.start_ns,
                            r.end_ns
                        );
                        assert!(fired.insert((r.key, r.start_ns), r.count).is_none(), "a window fired twice");
                    }
                }
            }
            assert_eq!(fired, sent, "cache {cache}: every window once, with exactly its records");
            assert_eq!(watermark, 40);
        }
    }

    /// With a cache far smaller than the keys, evicted keys fire from the store (in chunks
    /// too) and come back from it when they get more records: the results are exact.
    #[test]
    fn evicted_keys_fire_from_the_store() {
        for merges in [false, true] {
            evicted_keys_fire_from_the_store_over(merges);
        }
    }

    fn evicted_keys_fire_from_the_store_over(merges: bool) {
        let (mut op, seen) = operator_over(WindowKind::Tumbling { size: Duration::from_nanos(100) }, 64 * 1024, merges);
        const KEYS: u64 = 5_000;
        for round in 0..2u64 {
            for key in 0..KEYS {
                op.collect(&Event { key, value: 1, time_ns: round * 10, seq: key }).unwrap();
            }
        }
        assert!(op.spill.stored_keys > 0, "the cache evicted");
        op.signal(Signal::Watermark(100)).unwrap();
        while op.resume().unwrap() != Work::Done {}
        let seen = seen.lock().unwrap();
        let mut counts = vec![0u64; KEYS as usize];
        for s in seen.iter() {
            if let Seen::Result(r) = s {
                counts[r.key as usize] += r.count;
                assert_eq!((r.start_ns, r.end_ns), (0, 100));
            }
        }
        assert!(counts.iter().all(|&c| c == 2), "every key once, with both records");
        if !merges {
            // (With partials the count errs high: a key evicted twice counts twice.)
            assert_eq!(op.spill.stored_keys, 0, "fired windows left the store");
        }
    }
}
