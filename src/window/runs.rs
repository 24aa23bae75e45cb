//! Window state as sorted runs in RocksDB: the store of windows whose partials merge.
//!
//! [`super::RocksWindowStore`] keeps one RocksDB entry per (key, window): every evicted key
//! is a memtable insert, flushed, compacted, read back and range-deleted within about one
//! window — per record, RocksDB work that costs more than the operator itself once state
//! outgrows the cache. This store makes that work per *batch*:
//!
//! - Writes (evicted partials as merge operands, puts, deletes) collect in memory, one list
//!   per key group, up to `pending_max` bytes (the window's share for batches to the store).
//!   Then each key group's list is sorted, the operations on one window folded into one,
//!   and written as one RocksDB value: a **run** under `(key group, sequence number u64 BE,
//!   "run")`. A key group's state is still one contiguous range (it moves as a range when
//!   parallelism changes), and its runs read in the order they were written. Runs of 1 KiB
//!   or more live in RocksDB's blob files (the column family's options, `crate::state`):
//!   written once at flush, never rewritten by compactions, as values read back and replaced
//!   within about a window should be.
//! - A scan works a key group at a time: it reads the group's runs (a few large values,
//!   sequentially), folds them in order with what is pending into the group's **view** (a
//!   sorted map, the truth for that group while it is held), and visits it. Writes to the
//!   viewed group change the view; a range delete of a whole group is one RocksDB range
//!   tombstone. When the scan moves on (or a checkpoint comes), a changed view is written back
//!   as the group's one run, replacing the others: a tumbling window that fired leaves nothing
//!   to write.
//! - A key group that gathers [`MAX_RUNS`] runs between scans (or fewer, down to half of
//!   it: the threshold is spread over the groups so that they do not all fold at one
//!   flush) is folded into one at its next flush; so is a group whose oldest run is
//!   [`MAX_RUN_AGE`] flushes old (a quiet one), so that every run is replaced within that
//!   many flushes and RocksDB's blob files go without its garbage collection.
//!
//! A point read ([`WindowStore::scan_key`], for a record that must fire a window again)
//! finds the key in each run by binary search over the run's index, but reads the group's
//! runs to do so: rare on the merging path, where a miss starts a blind partial.
//!
//! Run format (little-endian): `version u8 = 1 | 3 zero bytes | count u32 | count × (key u64 |
//! window u64 | op u8 (0 put, 1 merge, 2 delete) | 3 zero bytes | end of value u32) | values`,
//! entries in strictly increasing (key, window) order. A run that breaks any of that fails
//! the read naming the shard and key group. Entries an older version of weir wrote (one per
//! window, `(key group, key, window)`) are read as the oldest state of their group and
//! folded into its first run written.

use super::rocks::{scan_copies_in, write_copies_in};
use super::store::{StoreBatch, StoreError, StoreOp, VisitCopy, VisitWindow, WindowStore};
use crate::state::{Store, ValueMerge, WRITE_BATCH_BYTES_MAX};
use std::collections::BTreeMap;
use std::collections::btree_map::Entry as MapEntry;
use std::ops::Range;

/// The namespace of a run's RocksDB key (a window entry's namespace is 8 bytes).
const RUN_NAMESPACE: &[u8] = b"run";
const RUN_VERSION: u8 = 1;
const RUN_HEADER: usize = 8;
const INDEX_ENTRY: usize = 24;
/// Runs a key group may hold before its next flush folds them into one.
pub const MAX_RUNS: u32 = 256;

/// The runs at which key group `kg` is folded: from `MAX_RUNS / 2` to just under
/// `MAX_RUNS`, spread over the groups by a hash. Every flush writes a run to each group with
/// pending writes, so with one threshold for all, the groups reached it at the same flush,
/// and that flush read and rewrote the subtask's whole state on the window thread: at 10^7
/// keys a stall of 2–3 s every few windows, with records and checkpoint barriers waiting
/// behind it. Spread, a flush folds about one group in `MAX_RUNS / 2` (each group a little
/// more often).
fn fold_at(kg: u16) -> u32 {
    let half = MAX_RUNS / 2;
    half + (u32::from(kg).wrapping_mul(0x9E37_79B9) >> 16) % half
}

/// Flushes after which a key group's oldest run is rewritten even if the group gathered
/// few runs since (it had few writes, and no sweep changed it). Runs live in RocksDB's blob
/// files, and a blob file goes only once none of its runs is referenced; RocksDB's own
/// garbage collection would relocate the live runs of old files, but the runs of a busy
/// group are replaced within about a window anyway (by a sweep, or a fold at
/// [`fold_at`] runs), so that relocation rewrote mostly runs about to die: on the 10^7-key,
/// 100×-cache row of `weir-bench window` it was three quarters of RocksDB's 11.7 GB of
/// writes. Instead every run is replaced within this many flushes — a busy group's by its
/// folds, a quiet group's by this rule — so no blob file outlives it by much, and RocksDB's
/// garbage collection is off (`crate::state`'s options of a merging family).
pub const MAX_RUN_AGE: u64 = 2 * MAX_RUNS as u64;

/// Bytes counted per pending operation beside its value.
const OP_OVERHEAD: usize = 40;
/// Key groups held as views at once: a scan chunk ends in one group and its range delete
/// starts in the one before, so two keep each group read and written once per sweep.
const MAX_VIEWS: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Put,
    Merge,
    Delete,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Put => 0,
            Kind::Merge => 1,
            Kind::Delete => 2,
        }
    }

    fn of(code: u8) -> Option<Kind> {
        match code {
            0 => Some(Kind::Put),
            1 => Some(Kind::Merge),
            2 => Some(Kind::Delete),
            _ => None,
        }
    }
}

/// One write waiting to go into a run; its value is bytes `at..at + len` of the store's
/// arena.
#[derive(Debug, Clone, Copy)]
struct Op {
    key: u64,
    window: u64,
    kind: Kind,
    at: u32,
    len: u32,
}

impl Op {
    fn value<'a>(&self, arena: &'a [u8]) -> &'a [u8] {
        &arena[self.at as usize..self.at as usize + self.len as usize]
    }
}

/// One key group's windows, folded: the truth for that group while it is held. Values lie
/// in one buffer (no allocation per window).
struct View {
    kg: u16,
    /// The windows in (key, window) order.
    entries: Vec<ViewEntry>,
    bytes: Vec<u8>,
    /// Bytes of `bytes` no entry refers to any more.
    dead: usize,
    /// Changed since it was read: RocksDB's runs of the group are stale.
    dirty: bool,
}

#[derive(Debug, Clone, Copy)]
struct ViewEntry {
    key: u64,
    window: u64,
    at: usize,
    len: u32,
}

impl View {
    fn new(kg: u16) -> View {
        View { kg, entries: Vec::new(), bytes: Vec::new(), dead: 0, dirty: false }
    }

    fn value(&self, e: &ViewEntry) -> &[u8] {
        &self.bytes[e.at..e.at + e.len as usize]
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Append a window after every other (building the view in order).
    fn push(&mut self, key: u64, window: u64, value: &[u8]) {
        debug_assert!(self.entries.last().is_none_or(|e| (e.key, e.window) < (key, window)));
        let at = self.bytes.len();
        self.bytes.extend_from_slice(value);
        self.entries.push(ViewEntry { key, window, at, len: value.len() as u32 });
    }

    /// The index of the first window at or after `(key, window)`.
    fn lower_bound(&self, at: (u64, u64)) -> usize {
        self.entries.partition_point(|e| (e.key, e.window) < at)
    }

    /// Fold one operation in; what is corrupt if the merge refuses.
    fn apply(&mut self, merge: &ValueMerge, key: u64, window: u64, kind: Kind, value: &[u8]) -> Result<(), RunCorrupt> {
        self.dirty = true;
        let i = self.lower_bound((key, window));
        let found = self.entries.get(i).is_some_and(|e| (e.key, e.window) == (key, window));
        let folded;
        let value = match (kind, found) {
            (Kind::Delete, false) => return Ok(()),
            (Kind::Delete, true) => {
                self.dead += self.entries.remove(i).len as usize;
                return Ok(());
            }
            (Kind::Merge, true) => {
                folded = merge(Some(self.value(&self.entries[i])), &mut std::iter::once(value))
                    .ok_or(RunCorrupt::Merge { key, window })?;
                &folded[..]
            }
            (Kind::Put | Kind::Merge, _) => value,
        };
        let at = self.bytes.len();
        self.bytes.extend_from_slice(value);
        let entry = ViewEntry { key, window, at, len: value.len() as u32 };
        if found {
            self.dead += self.entries[i].len as usize;
            self.entries[i] = entry;
        } else {
            self.entries.insert(i, entry);
        }
        self.compact();
        Ok(())
    }

    /// Drop the windows of the keys from `lo` up to `hi` (exclusive; `None`: all after).
    fn remove_keys(&mut self, lo: u64, hi: Option<u64>) {
        let from = self.lower_bound((lo, 0));
        let to = hi.map_or(self.entries.len(), |hi| self.lower_bound((hi, 0)));
        if from < to {
            self.dead += self.entries.drain(from..to).map(|e| e.len as usize).sum::<usize>();
            self.dirty = true;
            self.compact();
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes.clear();
        self.dead = 0;
        self.dirty = true;
    }

    /// Copy the live values to a new buffer once most of it is dead.
    fn compact(&mut self) {
        if self.dead < (64 << 10) || self.dead * 2 < self.bytes.len() {
            return;
        }
        let mut bytes = Vec::with_capacity(self.bytes.len() - self.dead);
        for e in &mut self.entries {
            let at = bytes.len();
            bytes.extend_from_slice(&self.bytes[e.at..e.at + e.len as usize]);
            e.at = at;
        }
        self.bytes = bytes;
        self.dead = 0;
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64, &[u8])> {
        self.entries.iter().map(|e| (e.key, e.window, self.value(e)))
    }

    fn run(&self) -> Vec<u8> {
        encode_run(self.entries.len(), self.bytes.len() - self.dead, self.iter().map(|(k, w, v)| (k, w, Kind::Put, v)))
    }
}

/// What this store knows of a key group's runs in RocksDB.
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    /// The sequence number of the group's next run.
    next_seq: u64,
    /// Runs the group holds (an entry of the older layout counts as [`MAX_RUNS`]).
    runs: u32,
    /// The flush ([`RunStore::flushes`]) at which its oldest run was written (or the group
    /// was first read, for runs an earlier run of the job wrote).
    since: u64,
}

impl Known {
    /// The group's oldest run is `max_age` flushes old at flush `now`: fold the group into
    /// one run.
    fn aged(&self, now: u64, max_age: u64) -> bool {
        self.runs > 0 && now.saturating_sub(self.since) >= max_age
    }
}

/// An operation on a window while a group is read: (key, window, source, position in the
/// source, operation, value).
type Tagged<'a> = (u64, u64, u32, u32, Kind, &'a [u8]);

/// One run, parsed: its index and values, checked on the way.
struct Run<'a> {
    index: &'a [u8],
    values: &'a [u8],
    count: usize,
}

impl<'a> Run<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Run<'a>, RunCorrupt> {
        let head = bytes.get(..RUN_HEADER).ok_or(RunCorrupt::Short { len: bytes.len() })?;
        if head[0] != RUN_VERSION || head[1..4] != [0, 0, 0] {
            return Err(RunCorrupt::Version { version: head[0] });
        }
        let count = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) as usize;
        let index_end = count
            .checked_mul(INDEX_ENTRY)
            .and_then(|n| n.checked_add(RUN_HEADER))
            .filter(|&n| n <= bytes.len())
            .ok_or(RunCorrupt::Count { count, len: bytes.len() })?;
        Ok(Run { index: &bytes[RUN_HEADER..index_end], values: &bytes[index_end..], count })
    }

    fn window_of(&self, i: usize) -> (u64, u64) {
        let e = &self.index[i * INDEX_ENTRY..];
        let key = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
        let window = u64::from_le_bytes(e[8..16].try_into().expect("8 bytes"));
        (key, window)
    }

    fn end_of(&self, i: usize) -> usize {
        let e = &self.index[i * INDEX_ENTRY..];
        u32::from_le_bytes(e[20..24].try_into().expect("4 bytes")) as usize
    }

    /// Entry `i`: (key, window, op, value).
    fn entry(&self, i: usize) -> Result<(u64, u64, Kind, &'a [u8]), RunCorrupt> {
        let e = &self.index[i * INDEX_ENTRY..(i + 1) * INDEX_ENTRY];
        let kind = Kind::of(e[16]).ok_or(RunCorrupt::Operation { entry: i, op: e[16] })?;
        let start = if i == 0 { 0 } else { self.end_of(i - 1) };
        let end = self.end_of(i);
        let value =
            self.values.get(start..end).ok_or(RunCorrupt::Span { entry: i, start, end, len: self.values.len() })?;
        let (key, window) = self.window_of(i);
        Ok((key, window, kind, value))
    }

    /// The first entry at or after `(key, window)`.
    fn lower_bound(&self, at: (u64, u64)) -> usize {
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.window_of(mid) < at { lo = mid + 1 } else { hi = mid }
        }
        lo
    }
}

/// What is wrong with a stored run, or with a merge of a window's values: the key group is
/// added by [`RunStore::corrupt`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum RunCorrupt {
    /// Fewer bytes than a run's header.
    #[error("a run of {len} bytes, shorter than its header")]
    Short { len: usize },
    /// A run's version this build does not read.
    #[error("a run of version {version} (this build reads {RUN_VERSION})")]
    Version { version: u8 },
    /// An index longer than the run.
    #[error("a run of {count} entries in {len} bytes")]
    Count { count: usize, len: usize },
    /// An entry's operation code is none weir writes.
    #[error("entry {entry} of a run has operation {op}")]
    Operation { entry: usize, op: u8 },
    /// An entry's value lies outside the run.
    #[error("entry {entry} of a run spans bytes {start}..{end} of {len}")]
    Span { entry: usize, start: usize, end: usize, len: usize },
    /// The merge operator refused a window's value or operand.
    #[error("key {key}, window at {window} ns: a value or merge operand")]
    Merge { key: u64, window: u64 },
    /// The merge operator refused an operand of pending writes.
    #[error("key {key}, window at {window} ns: a merge operand")]
    Operand { key: u64, window: u64 },
    /// The pending writes' arena outgrew its 32-bit offsets.
    #[error("4 GiB of pending writes")]
    Pending,
}

/// Fold `ops` (in write order) into one per window, sorted, into `out` (cleared first): a
/// run's entries. A merge of two writes to one window appends its value to `arena`.
fn fold_ops(
    merge: &ValueMerge,
    ops: &mut [Op],
    arena: &mut Vec<u8>,
    order: &mut Vec<(u64, u64, u32)>,
    out: &mut Vec<Op>,
) -> Result<(), RunCorrupt> {
    // Sorted by (key, window, position): write order kept per window.
    order.clear();
    order.extend(ops.iter().enumerate().map(|(i, o)| (o.key, o.window, i as u32)));
    order.sort_unstable();
    out.clear();
    for &(key, window, i) in order.iter() {
        let op = ops[i as usize];
        match out.last_mut() {
            Some(last) if (last.key, last.window) == (key, window) => match (op.kind, last.kind) {
                (Kind::Put | Kind::Delete, _) => *last = op,
                // Nothing below a delete: the operand is the window.
                (Kind::Merge, Kind::Delete) => *last = Op { kind: Kind::Put, ..op },
                (Kind::Merge, _) => {
                    let folded = merge(Some(last.value(arena)), &mut std::iter::once(op.value(arena)))
                        .ok_or(RunCorrupt::Operand { key, window })?;
                    let at = u32::try_from(arena.len()).map_err(|_| RunCorrupt::Pending)?;
                    arena.extend_from_slice(&folded);
                    (last.at, last.len) = (at, folded.len() as u32);
                }
            },
            _ => out.push(op),
        }
    }
    Ok(())
}

/// Fold one operation into `map`; what is corrupt if the merge refuses.
fn fold(
    merge: &ValueMerge,
    map: &mut BTreeMap<(u64, u64), Vec<u8>>,
    at: (u64, u64),
    kind: Kind,
    value: &[u8],
) -> Result<(), RunCorrupt> {
    match kind {
        Kind::Put => {
            map.insert(at, value.to_vec());
        }
        Kind::Delete => {
            map.remove(&at);
        }
        Kind::Merge => match map.entry(at) {
            MapEntry::Occupied(mut o) => {
                let folded = merge(Some(o.get()), &mut std::iter::once(value))
                    .ok_or(RunCorrupt::Merge { key: at.0, window: at.1 })?;
                *o.get_mut() = folded;
            }
            MapEntry::Vacant(v) => {
                v.insert(value.to_vec());
            }
        },
    }
    Ok(())
}

/// Encode a run of `entries` (sorted by (key, window), one per window).
/// `value_bytes`: their values' total length (the run is allocated once).
fn encode_run<'v>(
    count: usize,
    value_bytes: usize,
    entries: impl Iterator<Item = (u64, u64, Kind, &'v [u8])>,
) -> Vec<u8> {
    let mut run = Vec::new();
    encode_run_into(&mut run, count, value_bytes, entries);
    run
}

/// [`encode_run`] into `run` (cleared first; its allocation reused).
fn encode_run_into<'v>(
    run: &mut Vec<u8>,
    count: usize,
    value_bytes: usize,
    entries: impl Iterator<Item = (u64, u64, Kind, &'v [u8])>,
) {
    let values_at = RUN_HEADER + count * INDEX_ENTRY;
    run.clear();
    run.reserve(values_at + value_bytes);
    run.push(RUN_VERSION);
    run.extend_from_slice(&[0, 0, 0]);
    run.extend_from_slice(&(count as u32).to_le_bytes());
    run.resize(values_at, 0);
    for (i, (key, window, kind, value)) in entries.enumerate() {
        assert!(i < count, "a run of {count} entries given more");
        run.extend_from_slice(value);
        let end = u32::try_from(run.len() - values_at).expect("a run under 4 GiB");
        let e = &mut run[RUN_HEADER + i * INDEX_ENTRY..RUN_HEADER + (i + 1) * INDEX_ENTRY];
        e[..8].copy_from_slice(&key.to_le_bytes());
        e[8..16].copy_from_slice(&window.to_le_bytes());
        e[16] = kind.code();
        e[20..].copy_from_slice(&end.to_le_bytes());
    }
}

/// Convert every window a subtask restored, in place, before it reads any: each
/// accumulator in the windows' column family `windows` (runs, and entries of the older
/// one-per-window layout or of session windows) and in the cache's copy `copies`, of the
/// key groups `key_groups`, by `m`. Returns how many values it converted.
pub(crate) fn convert_stored(
    windows: &Store,
    copies: &Store,
    key_groups: &Range<u32>,
    m: &crate::record::schema::Migration,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let mut n = 0;
    for (store, copy) in [(windows, false), (copies, true)] {
        let mut cursor = store.scan(key_groups.clone());
        let mut batch = store.batch();
        while let Some(e) = cursor.next()? {
            let value = if copy {
                super::store::convert_copy(e.value, m)?
            } else if e.namespace == RUN_NAMESPACE {
                let run = Run::parse(e.value)?;
                let mut entries = Vec::with_capacity(run.count);
                for i in 0..run.count {
                    let (key, window, kind, v) = run.entry(i)?;
                    let v = if kind == Kind::Delete { v.to_vec() } else { super::store::convert_value(v, m)? };
                    entries.push((key, window, kind, v));
                }
                let bytes = entries.iter().map(|e| e.3.len()).sum();
                encode_run(entries.len(), bytes, entries.iter().map(|(k, w, kind, v)| (*k, *w, *kind, v.as_slice())))
            } else {
                super::store::convert_value(e.value, m)?
            };
            n += 1;
            batch.put(e.key_group, e.key, e.namespace, &value);
            if batch.size_bytes() >= WRITE_BATCH_BYTES_MAX {
                std::mem::replace(&mut batch, store.batch()).commit()?;
            }
        }
        batch.commit()?;
    }
    Ok(n)
}

/// Replace the runs of `view`'s key group by one run of the view (none if it is empty), in
/// `b`, at flush `now`: a write-out of a changed view, and a fold.
fn replace_runs(b: &mut crate::state::Batch<'_>, known: &mut Known, view: &View, now: u64) {
    b.delete_keys(view.kg, &[], None, u32::from(view.kg) + 1);
    (known.runs, known.since) = (0, now);
    if !view.is_empty() {
        b.put(view.kg, &known.next_seq.to_be_bytes(), RUN_NAMESPACE, &view.run());
        known.next_seq += 1;
        known.runs = 1;
    }
}

/// Window state of one subtask as runs in its RocksDB shard (see the module docs).
pub struct RunStore {
    store: Store,
    key_groups: Range<u32>,
    merge: ValueMerge,
    copies: Option<Store>,
    /// Writes not yet in a run, per key group of the subtask (index: key group − first).
    pending: Vec<Vec<Op>>,
    /// The values of the pending writes, in one buffer: a write copies its value here (no
    /// allocation per window, as a `Vec` per write was: ~7 % of all CPU in malloc and free
    /// on the 10^6-key window row). Emptied when every group's writes went out as runs or
    /// were taken (by views, range deletes); what taken writes leave counts towards the
    /// next flush.
    arena: Vec<u8>,
    pending_bytes: usize,
    pending_max: usize,
    known: Vec<Option<Known>>,
    /// Flushes so far: the clock of [`MAX_RUN_AGE`].
    flushes: u64,
    /// A checkpoint's writes are going on ([`WindowStore::hold_folds`]): a flush folds a
    /// group only at twice its run count and age thresholds.
    folds_held: bool,
    /// The groups held as views, the one used last at the end.
    views: Vec<View>,
    /// Buffers a flush reuses from one group to the next (and one flush to the next): a
    /// run, a group's ops folded, their sort order. Allocated per group they were much of
    /// the ~6 % of all CPU that a profile of the 10^6-key window row put in malloc and free
    /// under `flush_pending`; reused, that row gained 2–3 % (`weir-bench window`,
    /// `=tenfold` and `=hundredfold`, old and new builds alternated, three pairs each).
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    run: Vec<u8>,
    folded: Vec<Op>,
    order: Vec<(u64, u64, u32)>,
}

impl std::fmt::Debug for RunStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStore")
            .field("store", &self.store)
            .field("key_groups", &self.key_groups)
            .field("pending_bytes", &self.pending_bytes)
            .field("views", &self.views.iter().map(|v| (v.kg, v.entries.len(), v.dirty)).collect::<Vec<_>>())
            .finish()
    }
}

impl RunStore {
    /// Windows of the key groups `key_groups` in `store`, folded by `merge`; writes wait in
    /// memory up to `pending_max` bytes before they go to RocksDB as runs.
    pub fn new(store: Store, key_groups: Range<u32>, merge: ValueMerge, pending_max: usize) -> RunStore {
        let groups = key_groups.len();
        RunStore {
            store,
            key_groups,
            merge,
            copies: None,
            pending: (0..groups).map(|_| Vec::new()).collect(),
            arena: Vec::new(),
            pending_bytes: 0,
            pending_max,
            known: vec![None; groups],
            flushes: 0,
            folds_held: false,
            views: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    /// The same, keeping the cache's copy in `copies` (see [`super::RocksWindowStore::with_copies`]).
    pub fn with_copies(mut self, copies: Store) -> RunStore {
        self.copies = Some(copies);
        self
    }

    fn slot(&self, kg: u16) -> Result<usize, StoreError> {
        let g = u32::from(kg);
        if self.key_groups.contains(&g) {
            Ok((g - self.key_groups.start) as usize)
        } else {
            Err(StoreError(format!("key group {kg} is not this subtask's ({:?})", self.key_groups)))
        }
    }

    fn corrupt(&self, kg: u16, what: impl std::fmt::Display) -> StoreError {
        StoreError(format!(
            "{} in shard {}, key group {kg}: {what} (corrupt window state)",
            self.store.operator(),
            self.store.shard_index()
        ))
    }

    fn read_failed(&self, kg: u16, e: crate::state::StateError) -> StoreError {
        StoreError(format!("reading key group {kg}: {e}"))
    }

    /// Fold one operation into `map`.
    fn fold(
        &self,
        kg: u16,
        map: &mut BTreeMap<(u64, u64), Vec<u8>>,
        at: (u64, u64),
        kind: Kind,
        value: &[u8],
    ) -> Result<(), StoreError> {
        fold(&self.merge, map, at, kind, value).map_err(|e| self.corrupt(kg, e))
    }

    /// Read key group `kg` from RocksDB and fold it with `ops` (its writes since, in
    /// order): its windows (runs in order, entries of the older layout first), and what is
    /// known of its runs.
    fn read_group(&self, kg: u16, ops: &[Op], arena: &[u8]) -> Result<(View, Known), StoreError> {
        let mut older: Vec<(u64, u64, Vec<u8>)> = Vec::new();
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut cursor = self.store.scan(u32::from(kg)..u32::from(kg) + 1);
        while let Some(e) = cursor.next().map_err(|e| self.read_failed(kg, e))? {
            let key: [u8; 8] =
                e.key.try_into().map_err(|_| self.corrupt(kg, format!("a key of {} bytes", e.key.len())))?;
            if e.namespace == RUN_NAMESPACE {
                runs.push((u64::from_be_bytes(key), e.value.to_vec()));
            } else {
                let window: [u8; 8] = e
                    .namespace
                    .try_into()
                    .map_err(|_| self.corrupt(kg, format!("a namespace of {} bytes", e.namespace.len())))?;
                older.push((u64::from_be_bytes(key), u64::from_be_bytes(window), e.value.to_vec()));
            }
        }
        drop(cursor);
        // Keys of one length order by their bytes: runs come in sequence order already.
        let mut known = Known {
            next_seq: 1,
            runs: runs.len() as u32 + if older.is_empty() { 0 } else { MAX_RUNS },
            since: self.flushes,
        };
        // Every operation on the group, tagged (key, window, source, position): the older
        // layout's windows first, then each run, then `ops`; sorted, each window's
        // operations are together and in the order they were written.
        let mut all: Vec<Tagged<'_>> = Vec::new();
        all.extend(older.iter().map(|(k, w, v)| (*k, *w, 0, 0, Kind::Put, v.as_slice())));
        for (r, (seq, bytes)) in runs.iter().enumerate() {
            known.next_seq = known.next_seq.max(seq + 1);
            let run = Run::parse(bytes).map_err(|e| self.corrupt(kg, e))?;
            let mut last = None;
            for i in 0..run.count {
                let (key, window, kind, value) = run.entry(i).map_err(|e| self.corrupt(kg, e))?;
                if last.is_some_and(|l| l >= (key, window)) {
                    return Err(self.corrupt(kg, format!("entry {i} of run {seq} is out of order")));
                }
                last = Some((key, window));
                all.push((key, window, r as u32 + 1, 0, kind, value));
            }
        }
        let last_source = runs.len() as u32 + 1;
        all.extend(
            ops.iter().enumerate().map(|(i, o)| (o.key, o.window, last_source, i as u32, o.kind, o.value(arena))),
        );
        all.sort_unstable_by_key(|&(k, w, source, at, _, _)| (k, w, source, at));
        let mut view = View::new(kg);
        let mut i = 0;
        while i < all.len() {
            let (key, window) = (all[i].0, all[i].1);
            let mut value: Option<std::borrow::Cow<'_, [u8]>> = None;
            while i < all.len() && (all[i].0, all[i].1) == (key, window) {
                let (_, _, _, _, kind, v) = all[i];
                value = match (kind, value) {
                    (Kind::Put, _) => Some(v.into()),
                    (Kind::Delete, _) => None,
                    (Kind::Merge, None) => Some(v.into()),
                    (Kind::Merge, Some(before)) => Some(
                        (self.merge)(Some(&before), &mut std::iter::once(v))
                            .ok_or_else(|| {
                                self.corrupt(kg, format!("key {key}, window at {window} ns: a value or merge operand"))
                            })?
                            .into(),
                    ),
                };
                i += 1;
            }
            if let Some(v) = value {
                view.push(key, window, &v);
            }
        }
        view.dirty = !ops.is_empty();
        Ok((view, known))
    }

    /// What is known of `kg`'s runs, reading the group once if nothing is.
    fn known_of(&mut self, kg: u16) -> Result<Known, StoreError> {
        let i = self.slot(kg)?;
        if let Some(k) = self.known[i] {
            return Ok(k);
        }
        let (_, known) = self.read_group(kg, &[], &[])?;
        self.known[i] = Some(known);
        Ok(known)
    }

    /// Write `view` back if it changed: the group's runs replaced by one (none if the view
    /// is empty). Returns it, clean.
    fn write_out(&mut self, mut view: View) -> Result<View, StoreError> {
        if view.dirty {
            let mut known = self.known_of(view.kg)?;
            let mut b = self.store.batch();
            replace_runs(&mut b, &mut known, &view, self.flushes);
            b.commit().map_err(|e| StoreError(e.to_string()))?;
            let i = self.slot(view.kg)?;
            self.known[i] = Some(known);
            view.dirty = false;
        }
        Ok(view)
    }

    /// The view of `kg`, if it is held.
    fn view_mut(&mut self, kg: u16) -> Option<&mut View> {
        self.views.iter_mut().find(|v| v.kg == kg)
    }

    fn view(&self, kg: u16) -> Option<&View> {
        self.views.iter().find(|v| v.kg == kg)
    }

    /// Hold `kg` as a view (the last used): read the group and fold its pending writes in;
    /// the view used longest ago written back if [`MAX_VIEWS`] are held.
    fn switch_view(&mut self, kg: u16) -> Result<&View, StoreError> {
        if let Some(at) = self.views.iter().position(|v| v.kg == kg) {
            let v = self.views.remove(at);
            self.views.push(v);
            return Ok(self.views.last().expect("pushed"));
        }
        if self.views.len() >= MAX_VIEWS {
            let oldest = self.views.remove(0);
            self.write_out(oldest)?;
        }
        let i = self.slot(kg)?;
        let ops = std::mem::take(&mut self.pending[i]);
        self.pending_bytes -= ops.iter().map(|o| o.len as usize + OP_OVERHEAD).sum::<usize>();
        let (view, known) = self.read_group(kg, &ops, &self.arena)?;
        self.forget_taken();
        self.known[i] = Some(known);
        self.views.push(view);
        Ok(self.views.last().expect("pushed"))
    }

    fn push(&mut self, kg: u16, key: u64, window: u64, kind: Kind, value: &[u8]) -> Result<(), StoreError> {
        let i = self.slot(kg)?;
        if let Some(at) = self.views.iter().position(|v| v.kg == kg) {
            return self.views[at].apply(&self.merge, key, window, kind, value).map_err(|e| self.corrupt(kg, e));
        }
        if self.arena.len() + value.len() > u32::MAX as usize {
            self.flush_pending()?;
        }
        let at = self.arena.len() as u32;
        self.arena.extend_from_slice(value);
        self.pending_bytes += value.len() + OP_OVERHEAD;
        self.pending[i].push(Op { key, window, kind, at, len: value.len() as u32 });
        Ok(())
    }

    /// After writes were taken out of the pending lists: the arena is emptied if none are
    /// left in it.
    fn forget_taken(&mut self) {
        if self.pending_bytes == 0 {
            self.arena.clear();
        }
    }

    /// Write every key group's pending writes as a run (a group at its [`fold_at`] folded
    /// whole into one). Each run goes into the write batch as it is made, and the batch is
    /// committed whenever it is half its bound: several groups may fold in one flush (each
    /// flush writes a run to every group with pending writes), so runs gathered before the
    /// first commit could hold much of the state in memory at once.
    fn flush_pending(&mut self) -> Result<(), StoreError> {
        // The arena is out of `self` while the groups are written (their runs are encoded
        // from it, and merges fold into it); back, emptied, when they are.
        let mut arena = std::mem::take(&mut self.arena);
        let result = self.flush_groups(&mut arena);
        if result.is_ok() {
            arena.clear();
            self.pending_bytes = 0;
            // A burst bigger than the buffer (one batch of large values) is not kept.
            if arena.capacity() > 2 * self.pending_max.max(64 << 10) {
                arena = Vec::new();
            }
        }
        self.arena = arena;
        result
    }

    fn flush_groups(&mut self, arena: &mut Vec<u8>) -> Result<(), StoreError> {
        self.flushes += 1;
        let now = self.flushes;
        // While a checkpoint's writes go on, its folds wait for the next flush after (the
        // barrier waits for the checkpoint's writes, not for folds): the thresholds double,
        // so a job whose every flush is a checkpoint's still folds.
        let held = if self.folds_held { 2 } else { 1 };
        let mut b = self.store.batch();
        for i in 0..self.pending.len() {
            let kg = (self.key_groups.start as usize + i) as u16;
            // A group whose oldest run is [`MAX_RUN_AGE`] flushes old is folded, new writes
            // or not (a viewed group's runs are replaced when its view is written out).
            let aged = self.known[i].is_some_and(|k| k.aged(now, held * MAX_RUN_AGE)) && self.view(kg).is_none();
            if self.pending[i].is_empty() && !aged {
                continue;
            }
            let mut ops = std::mem::take(&mut self.pending[i]);
            let mut known = match self.known[i] {
                Some(k) => k,
                None => self.read_group(kg, &[], &[])?.1,
            };
            let mut scratch = std::mem::take(&mut self.scratch);
            if aged || known.runs >= held as u32 * fold_at(kg) {
                let (view, _) = self.read_group(kg, &ops, arena)?;
                replace_runs(&mut b, &mut known, &view, now);
            } else {
                // (On an error the buffers are dropped: the job fails.)
                fold_ops(&self.merge, &mut ops, arena, &mut scratch.order, &mut scratch.folded)
                    .map_err(|e| self.corrupt(kg, e))?;
                let f = &scratch.folded;
                let bytes = f.iter().map(|o| o.len as usize).sum();
                if known.runs == 0 {
                    known.since = now;
                }
                known.runs += 1;
                encode_run_into(
                    &mut scratch.run,
                    f.len(),
                    bytes,
                    f.iter().map(|o| (o.key, o.window, o.kind, o.value(arena))),
                );
                scratch.folded.clear();
                b.put(kg, &known.next_seq.to_be_bytes(), RUN_NAMESPACE, &scratch.run);
                known.next_seq += 1;
            }
            // A run of a burst into one group may be far larger than the buffer's share:
            // not kept.
            if scratch.run.capacity() > 2 * (self.pending_max / self.pending.len().max(1)).max(64 << 10) {
                scratch.run = Vec::new();
            }
            self.scratch = scratch;
            // The group's list keeps its allocation for the next writes, unless it grew
            // past twice a fair share of the buffer (ops of a 48-byte window and their
            // overhead, spread over the groups): a burst into one group does not stay
            // allocated.
            let fair = self.pending_max / (OP_OVERHEAD + 48) / self.pending.len().max(1);
            ops.clear();
            if ops.capacity() <= 2 * fair.max(16) {
                self.pending[i] = ops;
            }
            self.known[i] = Some(known);
            if b.size_bytes() >= WRITE_BATCH_BYTES_MAX / 2 {
                std::mem::replace(&mut b, self.store.batch()).commit().map_err(|e| StoreError(e.to_string()))?;
            }
        }
        b.commit().map_err(|e| StoreError(e.to_string()))
    }

    /// Delete the windows of the keys `[from, to)` (`to` `None`: to the end of the
    /// subtask's key groups).
    fn delete_range(&mut self, from: (u16, u64), to: Option<(u16, u64)>) -> Result<(), StoreError> {
        let own = self.key_groups.clone();
        let from = if u32::from(from.0) < own.start { (own.start as u16, 0) } else { from };
        let to = to.filter(|(kg, _)| u32::from(*kg) < own.end);
        let last = match to {
            Some((kg, 0)) => u32::from(kg).saturating_sub(1),
            Some((kg, _)) => u32::from(kg),
            None => own.end.saturating_sub(1),
        };
        let mut whole = Vec::new();
        for g in u32::from(from.0)..=last.min(own.end.saturating_sub(1)) {
            let kg = g as u16;
            let lo = if kg == from.0 { from.1 } else { 0 };
            let hi = to.filter(|t| t.0 == kg).map(|t| t.1);
            if hi.is_some_and(|hi| lo >= hi) {
                continue;
            }
            let i = self.slot(kg)?;
            if lo == 0 && hi.is_none() {
                for op in std::mem::take(&mut self.pending[i]) {
                    self.pending_bytes -= op.len as usize + OP_OVERHEAD;
                }
                self.forget_taken();
                match self.view_mut(kg) {
                    Some(v) => v.clear(),
                    None => {
                        whole.push(kg);
                        if let Some(k) = self.known[i].as_mut() {
                            k.runs = 0;
                        }
                    }
                }
                continue;
            }
            self.switch_view(kg)?;
            self.views.last_mut().expect("switched to").remove_keys(lo, hi);
        }
        let mut b = self.store.batch();
        for kg in whole {
            b.delete_keys(kg, &[], None, u32::from(kg) + 1);
        }
        b.commit().map_err(|e| StoreError(e.to_string()))
    }

    /// The first key group at or after `from` that may hold windows: a view, a group with
    /// pending writes, or one with entries in RocksDB.
    fn next_group(&self, from: u32) -> Result<Option<u16>, StoreError> {
        let end = self.key_groups.end;
        let viewed = |g: u32| self.views.iter().any(|v| u32::from(v.kg) == g);
        let mut best = self
            .views
            .iter()
            .filter(|v| u32::from(v.kg) >= from && !v.is_empty())
            .map(|v| u32::from(v.kg))
            .min()
            .unwrap_or(end);
        for g in from..best {
            if !self.pending[(g - self.key_groups.start) as usize].is_empty() {
                best = g;
                break;
            }
        }
        // RocksDB's first group in [from, best), viewed ones left out (a view is the truth).
        let mut lo = from;
        while lo < best {
            if viewed(lo) {
                lo += 1;
                continue;
            }
            let hi = (lo + 1..best).find(|&g| viewed(g)).unwrap_or(best);
            let mut cursor = self.store.scan(lo..hi);
            if let Some(e) = cursor.next().map_err(|e| self.read_failed(lo as u16, e))? {
                best = u32::from(e.key_group);
                break;
            }
            lo = hi;
        }
        Ok((best < end).then_some(best as u16))
    }

    /// Write what is held in memory to RocksDB (a checkpoint follows).
    fn persist(&mut self) -> Result<(), StoreError> {
        for view in std::mem::take(&mut self.views) {
            let clean = self.write_out(view)?;
            self.views.push(clean);
        }
        self.flush_pending()
    }
}

impl WindowStore for RunStore {
    fn write(&mut self, batch: &StoreBatch) -> Result<(), StoreError> {
        for op in &batch.ops {
            match *op {
                StoreOp::Put { kg, key, window, ref value } => {
                    self.push(kg, key, window, Kind::Put, batch.value(value))?
                }
                StoreOp::Merge { kg, key, window, ref value } => {
                    self.push(kg, key, window, Kind::Merge, batch.value(value))?
                }
                StoreOp::Delete { kg, key, window } => self.push(kg, key, window, Kind::Delete, &[])?,
                StoreOp::DeleteRange { from, to } => self.delete_range(from, to)?,
            }
        }
        // (The arena also holds what taken writes left: bounded by the buffer too.)
        if self.pending_bytes.max(self.arena.len()) >= self.pending_max {
            self.flush_pending()?;
        }
        Ok(())
    }

    fn scan_key(&mut self, kg: u16, key: u64, visit: &mut dyn FnMut(u64, &[u8])) -> Result<(), StoreError> {
        let Ok(i) = self.slot(kg) else { return Ok(()) };
        if let Some(view) = self.view(kg) {
            for e in view.entries[view.lower_bound((key, 0))..].iter().take_while(|e| e.key == key) {
                visit(e.window, view.value(e));
            }
            return Ok(());
        }
        // The key's windows in each run (binary search), then its pending writes.
        let mut map = BTreeMap::new();
        let mut cursor = self.store.scan(u32::from(kg)..u32::from(kg) + 1);
        while let Some(e) = cursor.next().map_err(|e| self.read_failed(kg, e))? {
            if e.namespace != RUN_NAMESPACE {
                if e.key == key.to_be_bytes() {
                    let window: [u8; 8] = e
                        .namespace
                        .try_into()
                        .map_err(|_| self.corrupt(kg, format!("a namespace of {} bytes", e.namespace.len())))?;
                    map.insert((key, u64::from_be_bytes(window)), e.value.to_vec());
                }
                continue;
            }
            let run = Run::parse(e.value).map_err(|e| self.corrupt(kg, e))?;
            for j in run.lower_bound((key, 0))..run.count {
                let (k, window, kind, value) = run.entry(j).map_err(|e| self.corrupt(kg, e))?;
                if k != key {
                    break;
                }
                self.fold(kg, &mut map, (k, window), kind, value)?;
            }
        }
        drop(cursor);
        for op in self.pending[i].iter().filter(|o| o.key == key) {
            self.fold(kg, &mut map, (key, op.window), op.kind, op.value(&self.arena))?;
        }
        for (&(_, window), v) in &map {
            visit(window, v);
        }
        Ok(())
    }

    fn scan_from(&mut self, from: (u16, u64), visit: &mut VisitWindow<'_>) -> Result<(), StoreError> {
        let start = u32::from(from.0).max(self.key_groups.start);
        let mut key_from = if u32::from(from.0) == start { from.1 } else { 0 };
        let mut g = start;
        while let Some(kg) = self.next_group(g)? {
            if u32::from(kg) != start {
                key_from = 0;
            }
            let view = self.switch_view(kg)?;
            for e in &view.entries[view.lower_bound((key_from, 0))..] {
                if !visit(kg, e.key, e.window, view.value(e)) {
                    return Ok(());
                }
            }
            g = u32::from(kg) + 1;
        }
        Ok(())
    }

    /// Runs and views written first; then a RocksDB checkpoint of the whole shard.
    fn checkpoint(&mut self, dir: &std::path::Path) -> Result<bool, StoreError> {
        self.persist()?;
        self.store.checkpoint(dir).map_err(|e| StoreError(e.to_string()))?;
        Ok(true)
    }

    fn merges(&self) -> bool {
        true
    }

    fn keeps_copies(&self) -> bool {
        self.copies.is_some()
    }

    fn hold_folds(&mut self, hold: bool) {
        self.folds_held = hold;
    }

    fn write_copies(&mut self, deletes: &[(u16, u64)], puts: &[(u16, u64, Vec<u8>)]) -> Result<(), StoreError> {
        let Some(copies) = &self.copies else { return Err(StoreError("this store keeps no copy of the cache".into())) };
        write_copies_in(copies, deletes, puts)
    }

    fn scan_copies(&mut self, from: (u16, u64), visit: &mut VisitCopy<'_>) -> Result<(), StoreError> {
        let Some(copies) = &self.copies else { return Ok(()) };
        scan_copies_in(copies, &self.key_groups, from, visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{StateBackend, StateConfig};
    use crate::window::store::testing::{key_windows, matches_models, random_batches, visit_all};
    use crate::window::store::{encode_value, value_merge};
    use crate::window::{MemoryStore, Stats};
    use proptest::prelude::*;

    fn merge() -> ValueMerge {
        value_merge::<Stats>(|a, b| a.merge(b))
    }

    fn value(caught_up: u64, v: u64) -> Vec<u8> {
        let mut s = Stats::default();
        s.add(v);
        encode_value(1_000, caught_up, &s)
    }

    fn temp_dir(what: &str) -> crate::util::TempDir {
        crate::util::temp_dir(&format!("runs-{what}"))
    }

    fn backend(dir: &std::path::Path) -> StateBackend {
        let merges = [("w".to_string(), merge())].into_iter().collect();
        StateBackend::open_with(StateConfig::new(dir, 1), merges).unwrap()
    }

    /// A run store over key groups `groups` with a buffer smaller than one write (every
    /// write is a flush), and the model beside it.
    fn flushing_store(what: &str, groups: Range<u32>) -> (crate::util::TempDir, StateBackend, RunStore, MemoryStore) {
        let dir = temp_dir(what);
        let backend = backend(&dir);
        let runs = RunStore::new(backend.store("w", 0).unwrap(), groups, merge(), 1);
        (dir, backend, runs, MemoryStore::with_merge(merge()))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// The run store behaves as the in-memory model under random batches of merges,
        /// puts, deletes and range deletes, with writes held in memory, flushed as runs
        /// (a tiny buffer: a flush every few writes; groups folded at MAX_RUNS), held in a
        /// view that scans and point reads move between groups, and the store opened anew
        /// now and then over what the last one wrote (its pending writes persisted, as a
        /// checkpoint does): the same windows per key, the same order from any starting
        /// key, and the neighbours on the same column family (key groups below and above)
        /// keep theirs.
        #[test]
        fn run_store_matches_the_model(
            batches in prop::collection::vec(
                (prop::collection::vec((0u16..8, 0u64..12, 0u64..3, 0u8..8, any::<u8>()), 1..30), 0u8..6),
                1..10,
            ),
            pending_max in prop::sample::select(vec![1usize, 300, 5_000, 1 << 20]),
            from_kg in 0u16..7,
            from_key in 0u64..13,
        ) {
            let dir = temp_dir("model");
            let backend = backend(&dir);
            let open = |groups: Range<u32>| RunStore::new(backend.store("w", 0).unwrap(), groups, merge(), pending_max);
            // Key groups 1..5 are this subtask's; 0..1 and 5..8 its neighbours' on the
            // same shard and column family.
            let (mut runs, mut below, mut above) = (open(1..5), open(0..1), open(5..8));
            let model = || MemoryStore::with_merge(merge());
            let (mut m, mut m_below, mut m_above) = (model(), model(), model());
            for (ops, then) in &batches {
                let [low, mine, high] = random_batches(ops, 12, |batch, kg, key, w, op, v| match op {
                    2 => batch.put(kg, key, w, &value(v as u64, v as u64)),
                    _ => batch.merge(kg, key, w, &value(v as u64 % 7, v as u64)),
                });
                for (store, model, batch) in [(&mut runs, &mut m, mine), (&mut below, &mut m_below, low), (&mut above, &mut m_above, high)] {
                    store.write(&batch).unwrap();
                    model.write(&batch).unwrap();
                }
                match then {
                    // A point read (may leave the view where it was), a scan from the
                    // middle (moves it), or a new store over what this one persisted.
                    0 => { prop_assert_eq!(key_windows(&mut runs, 2, 3), key_windows(&mut m, 2, 3)); }
                    1 => { prop_assert_eq!(visit_all(&mut runs, (3, 5), 4), visit_all(&mut m, (3, 5), 4)); }
                    2 => {
                        runs.persist().unwrap();
                        runs = open(1..5);
                    }
                    _ => {}
                }
            }
            matches_models([(&mut below, &mut m_below), (&mut runs, &mut m), (&mut above, &mut m_above)], 13, (from_kg, from_key))?;
            drop((runs, below, above));
            drop(backend);
        }
    }

    /// Every flush writes a run to each group with pending writes, so all groups gather
    /// runs at the same pace; each is folded at its own threshold, so a flush folds few of
    /// them (not the whole state at once), and the windows stay exactly the model's through
    /// several folds, in every group.
    #[test]
    fn groups_folded_at_their_thresholds_keep_their_windows() {
        const GROUPS: u16 = 64;
        // Every write is a flush of every group.
        let (_dir, backend, mut runs, mut model) = flushing_store("fold", 0..u32::from(GROUPS));
        let mut most_folded = 0;
        for round in 0..(2 * MAX_RUNS as u64 + 7) {
            let mut batch = StoreBatch::default();
            for kg in 0..GROUPS {
                let key = u64::from(kg) * 100 + round % 13;
                batch.merge(kg, key, round % 3, &value(round, key + round));
            }
            runs.write(&batch).unwrap();
            model.write(&batch).unwrap();
            // A group folded in this flush holds one run.
            let folded = (0..GROUPS).filter(|&kg| runs.known[kg as usize].is_some_and(|k| k.runs == 1)).count();
            if round > 0 {
                most_folded = most_folded.max(folded);
            }
        }
        // 64 groups over 128 thresholds, folding with different periods: a few coincide
        // (5 here), where a single threshold folded all 64 at once.
        assert!(most_folded <= GROUPS as usize / 8, "{most_folded} of {GROUPS} groups folded in one flush");
        for kg in 0..GROUPS {
            let k = runs.known[kg as usize].expect("written");
            assert!(k.next_seq > 2 * u64::from(MAX_RUNS) && k.runs < MAX_RUNS, "group {kg}: {k:?}, not folded");
            for key in (0..13).map(|k| u64::from(kg) * 100 + k) {
                assert_eq!(key_windows(&mut runs, kg, key), key_windows(&mut model, kg, key), "group {kg}, key {key}");
            }
        }
        drop(runs);
        drop(backend);
    }

    /// A group that gets no more writes keeps its runs only [`MAX_RUN_AGE`] flushes: then
    /// the flush folds it into a new run (so the blob file its old run lives in can go)
    /// and its windows stay exactly the model's; a busy group beside it is folded by its
    /// run count only.
    #[test]
    fn a_quiet_groups_runs_are_replaced_within_max_run_age() {
        let (_dir, backend, mut runs, mut model) = flushing_store("age", 0..2);
        let run_keys = |runs: &RunStore| {
            let mut seqs = Vec::new();
            let mut cursor = runs.store.scan(1..2);
            while let Some(e) = cursor.next().unwrap() {
                seqs.push(u64::from_be_bytes(e.key.try_into().unwrap()));
            }
            seqs
        };
        let mut batch = StoreBatch::default();
        for key in 0..5 {
            batch.merge(1, key, 0, &value(1, key));
        }
        for round in 0..=MAX_RUN_AGE + 1 {
            if round > 0 {
                batch.clear();
                batch.merge(0, round % 7, 0, &value(round, round));
            }
            runs.write(&batch).unwrap();
            model.write(&batch).unwrap();
            let quiet = runs.known[1].expect("written");
            match round {
                // Written at the first flush: its run is sequence 1 until it ages.
                r if r < MAX_RUN_AGE => assert_eq!((run_keys(&runs), quiet.since), (vec![1], 1), "round {r}"),
                r => assert_eq!((run_keys(&runs), quiet.since, quiet.runs), (vec![2], MAX_RUN_AGE + 1, 1), "round {r}"),
            }
        }
        let busy = runs.known[0].expect("written");
        assert!(busy.runs < MAX_RUNS && busy.next_seq > u64::from(MAX_RUNS), "{busy:?}");
        for kg in 0..2 {
            for key in 0..7 {
                assert_eq!(key_windows(&mut runs, kg, key), key_windows(&mut model, kg, key), "group {kg}, key {key}");
            }
        }
        drop(runs);
        drop(backend);
    }

    /// While a checkpoint's writes go on ([`WindowStore::hold_folds`]) a flush folds no
    /// group below twice its threshold; the first flush after folds what waited; at twice
    /// the threshold a held flush folds too (a job whose every flush is a checkpoint's must
    /// still fold). The windows are the model's throughout.
    #[test]
    fn folds_held_during_a_checkpoint_come_after_it() {
        let (_dir, backend, mut runs, mut model) = flushing_store("held", 0..1);
        let mut round = 0u64;
        let mut write = |runs: &mut RunStore| {
            round += 1;
            let mut batch = StoreBatch::default();
            batch.merge(0, round % 5, round % 2, &value(round, round));
            runs.write(&batch).unwrap();
            model.write(&batch).unwrap();
        };
        for _ in 1..fold_at(0) {
            write(&mut runs);
        }
        assert_eq!(runs.known[0].expect("written").runs, fold_at(0) - 1);
        runs.hold_folds(true);
        for _ in 0..10 {
            write(&mut runs);
        }
        assert_eq!(runs.known[0].expect("written").runs, fold_at(0) + 9, "no fold while held");
        runs.hold_folds(false);
        write(&mut runs);
        assert_eq!(runs.known[0].expect("written").runs, 1, "folded at the first flush after");
        runs.hold_folds(true);
        for _ in 1..2 * fold_at(0) {
            write(&mut runs);
        }
        assert_eq!(runs.known[0].expect("written").runs, 2 * fold_at(0), "held up to twice the threshold");
        write(&mut runs);
        assert_eq!(runs.known[0].expect("written").runs, 1, "then folded, held or not");
        runs.hold_folds(false);
        for key in 0..5 {
            assert_eq!(key_windows(&mut runs, 0, key), key_windows(&mut model, 0, key), "key {key}");
        }
        drop(runs);
        drop(backend);
    }

    /// Runs of hundreds of KiB (20,000 windows per group) go through a checkpoint of the
    /// shard: a store opened over it reads every window exactly, and a blob file (where
    /// runs that large live) with flipped bytes fails the read naming the shard and the key
    /// group.
    #[test]
    fn large_runs_restore_exactly_from_a_checkpoint() {
        let dir = temp_dir("blobs");
        let backend = backend(&dir);
        let mut runs = RunStore::new(backend.store("w", 0).unwrap(), 0..4, merge(), 1 << 20);
        let mut model = MemoryStore::with_merge(merge());
        for round in 0..3u64 {
            let mut batch = StoreBatch::default();
            for key in 0..20_000u64 {
                batch.merge((key % 4) as u16, key, round % 2, &value(round, key));
            }
            runs.write(&batch).unwrap();
            model.write(&batch).unwrap();
        }
        let chk = dir.join("chk");
        assert!(runs.checkpoint(&chk).unwrap());
        let files = |ext: &str| -> Vec<_> {
            std::fs::read_dir(&chk)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .filter(|p| p.to_string_lossy().ends_with(ext))
                .collect()
        };
        assert!(!files(".sst").is_empty(), "the checkpoint holds table files");
        let blobs = files(".blob");
        assert!(!blobs.is_empty(), "the checkpoint holds blob files");
        let want = visit_all(&mut model, (0, 0), usize::MAX);
        assert_eq!(visit_all(&mut runs, (0, 0), usize::MAX), want);
        drop(runs);
        drop(backend);
        // The checkpoint as the shard of another state dir.
        let restored = temp_dir("blobs-restored");
        std::fs::create_dir_all(&restored).unwrap();
        std::fs::rename(&chk, crate::state::shard_dir(&restored, 0)).unwrap();
        let reopened = super::tests::backend(&restored);
        let mut again = RunStore::new(reopened.store("w", 0).unwrap(), 0..4, merge(), 1 << 20);
        assert_eq!(visit_all(&mut again, (0, 0), usize::MAX), want);
        assert_eq!(key_windows(&mut again, 3, 7), key_windows(&mut model, 3, 7));
        drop(again);
        drop(reopened);
        for blob in blobs {
            let path = crate::state::shard_dir(&restored, 0).join(blob);
            let mut bytes = std::fs::read(&path).unwrap();
            let mid = bytes.len() / 3;
            for b in &mut bytes[mid..mid + 64] {
                *b ^= 0x5A;
            }
            std::fs::write(&path, bytes).unwrap();
        }
        let reopened = super::tests::backend(&restored);
        let mut corrupt = RunStore::new(reopened.store("w", 0).unwrap(), 0..4, merge(), 1 << 20);
        let e = corrupt.scan_from((0, 0), &mut |_, _, _, _| true).unwrap_err().to_string();
        assert!(e.contains("key group") && e.contains("shard 0"), "{e}");
        drop(corrupt);
        drop(reopened);
    }

    /// Windows an older weir wrote (one RocksDB entry per window, merge operands folded by
    /// the column family's operator) read as the oldest state of their group, under the
    /// runs written since.
    #[test]
    fn windows_of_the_older_layout_read_under_new_runs() {
        let dir = temp_dir("older");
        let backend = backend(&dir);
        let mut older = crate::window::RocksWindowStore::with_merges(backend.store("w", 0).unwrap(), 0..4);
        let mut batch = StoreBatch::default();
        batch.put(2, 7, 0, &value(5, 1));
        batch.merge(2, 7, 0, &value(9, 2));
        batch.put(2, 8, 0, &value(5, 10));
        older.write(&batch).unwrap();
        let mut runs = RunStore::new(backend.store("w", 0).unwrap(), 0..4, merge(), 1);
        let mut batch = StoreBatch::default();
        batch.merge(2, 7, 0, &value(3, 4));
        batch.delete(2, 8, 0);
        runs.write(&batch).unwrap();
        let mut want = MemoryStore::with_merge(merge());
        let mut batch = StoreBatch::default();
        batch.put(2, 7, 0, &value(5, 1));
        batch.merge(2, 7, 0, &value(9, 2));
        batch.merge(2, 7, 0, &value(3, 4));
        want.write(&batch).unwrap();
        assert_eq!(key_windows(&mut runs, 2, 7), key_windows(&mut want, 2, 7));
        assert_eq!(visit_all(&mut runs, (0, 0), usize::MAX), visit_all(&mut want, (0, 0), usize::MAX));
        drop((older, runs));
        drop(backend);
    }

    /// A run whose bytes are wrong (a bad operation, an index past its values, a bad
    /// version) fails the read with an error naming the shard and the key group, not a
    /// panic or a wrong value.
    #[test]
    fn a_corrupt_run_is_named() {
        let dir = temp_dir("corrupt");
        let backend = backend(&dir);
        let mut runs = RunStore::new(backend.store("w", 0).unwrap(), 0..8, merge(), 1);
        let mut batch = StoreBatch::default();
        batch.merge(3, 7, 0, &value(5, 1));
        batch.merge(5, 1, 0, &value(5, 1));
        runs.write(&batch).unwrap();
        let v = value(5, 1);
        let good = encode_run(1, v.len(), std::iter::once((7u64, 0u64, Kind::Put, v.as_slice())));
        let mut bad_op = good.clone();
        bad_op[RUN_HEADER + 16] = 9;
        let mut bad_end = good.clone();
        bad_end[RUN_HEADER + 20] = 0xFF;
        let mut bad_version = good.clone();
        bad_version[0] = 7;
        for bad in [bad_op, bad_end, bad_version, vec![1, 2, 3]] {
            let mut fresh = RunStore::new(backend.store("w", 0).unwrap(), 0..8, merge(), 1);
            backend.store("w", 0).unwrap().put(4, &99u64.to_be_bytes(), RUN_NAMESPACE, &bad).unwrap();
            let e = fresh.scan_from((0, 0), &mut |_, _, _, _| true).unwrap_err().to_string();
            assert!(e.contains("key group 4") && e.contains("shard 0") && e.contains("corrupt"), "{e}");
            let e = fresh.scan_key(4, 7, &mut |_, _| {}).unwrap_err().to_string();
            assert!(e.contains("key group 4") && e.contains("shard 0"), "{e}");
        }
        drop(runs);
        drop(backend);
    }
}
