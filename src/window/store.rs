//! Where window state goes when the cache evicts it: a byte-level, ordered key-value store.
//!
//! A window is stored under (key group, key, window start): in bytes `key group (u16 BE) |
//! key (u64 BE) | window start (u64 BE)` ([`state_key`]; the RocksDB backend adds its key
//! length field), so one key group's state is one contiguous range (it moves as a range when
//! parallelism changes), and one key's windows are adjacent (a key loads with one scan).
//! Values are `window end (u64 LE) | caught-up time (u64 LE) | accumulator (its Record
//! encoding)`.

use super::cache::{Entries, Entry, Slot};
use crate::record::Record;
use crate::state::ValueMerge;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

/// A store operation failed; the message says what and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("window state store: {0}")]
pub struct StoreError(pub String);

/// One write of a [`StoreBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOp {
    /// Set window `window` of `key` (in key group `kg`) to `value`.
    Put {
        /// Key group.
        kg: u16,
        /// Key.
        key: u64,
        /// Window start, ns.
        window: u64,
        /// The encoded window: bytes of the batch's values ([`StoreBatch::value`]).
        value: Range<u32>,
    },
    /// Delete every window of the keys from `from` up to `to` (exclusive; `None`: to the
    /// end of the store's key groups).
    DeleteRange {
        /// The first (key group, key).
        from: (u16, u64),
        /// The first (key group, key) not deleted.
        to: Option<(u16, u64)>,
    },
    /// Fold `value` into window `window` of `key` (a blind write: what the store holds for
    /// that window, if anything, and every operand are folded by the aggregate's merge when
    /// the window is read).
    Merge {
        /// Key group.
        kg: u16,
        /// Key.
        key: u64,
        /// Window start, ns.
        window: u64,
        /// The encoded partial window: bytes of the batch's values ([`StoreBatch::value`]).
        value: Range<u32>,
    },
    /// Delete window `window` of `key`.
    Delete {
        /// Key group.
        kg: u16,
        /// Key.
        key: u64,
        /// Window start, ns.
        window: u64,
    },
}

/// Puts and deletes applied together, in order. The values lie in one buffer of the batch
/// (no allocation per window; a batch cleared and reused allocates nothing once grown).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StoreBatch {
    /// The writes.
    pub ops: Vec<StoreOp>,
    values: Vec<u8>,
}

impl StoreBatch {
    /// Put `value` as window `window` of `key`.
    pub fn put(&mut self, kg: u16, key: u64, window: u64, value: &[u8]) {
        let value = self.push_value(value);
        self.ops.push(StoreOp::Put { kg, key, window, value });
    }

    /// Fold `value` into window `window` of `key`.
    pub fn merge(&mut self, kg: u16, key: u64, window: u64, value: &[u8]) {
        let value = self.push_value(value);
        self.ops.push(StoreOp::Merge { kg, key, window, value });
    }

    /// Delete window `window` of `key`.
    pub fn delete(&mut self, kg: u16, key: u64, window: u64) {
        self.ops.push(StoreOp::Delete { kg, key, window });
    }

    /// Delete every window of the keys in `[from, to)` (`to` `None`: to the end).
    pub fn delete_range(&mut self, from: (u16, u64), to: Option<(u16, u64)>) {
        self.ops.push(StoreOp::DeleteRange { from, to });
    }

    /// The bytes of a put's or merge's `value`.
    pub fn value(&self, value: &Range<u32>) -> &[u8] {
        &self.values[value.start as usize..value.end as usize]
    }

    /// Empty, keeping the allocations.
    pub fn clear(&mut self) {
        self.ops.clear();
        self.values.clear();
    }

    /// Put (or, `merge`, fold) window `e` of `slot`, encoded straight into the values.
    pub(crate) fn put_window<A: Record>(&mut self, slot: &Slot<A>, e: &Entry<A>, merge: bool) {
        let at = self.values.len();
        encode_value_into(&mut self.values, e.end, slot.caught_up, &e.acc);
        let value = range_of(at, self.values.len());
        let (kg, key, window) = (slot.kg, slot.key, e.start);
        self.ops.push(if merge {
            StoreOp::Merge { kg, key, window, value }
        } else {
            StoreOp::Put { kg, key, window, value }
        });
    }

    fn push_value(&mut self, value: &[u8]) -> Range<u32> {
        let at = self.values.len();
        self.values.extend_from_slice(value);
        range_of(at, self.values.len())
    }

    /// Whether there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A batch's values are addressed by u32: a batch is a bounded chunk of a cache (an
/// eviction, a sweep chunk), never near 4 GiB.
fn range_of(start: usize, end: usize) -> Range<u32> {
    let at = |i: usize| u32::try_from(i).expect("a store batch holds under 4 GiB of values");
    at(start)..at(end)
}

/// What [`WindowStore::scan_from`] calls per window: `(kg, key, window, value)`; false stops.
pub type VisitWindow<'a> = dyn FnMut(u16, u64, u64, &[u8]) -> bool + 'a;

/// What [`WindowStore::scan_copies`] calls per cached key: `(kg, key, encoded slot)`; false
/// stops.
pub type VisitCopy<'a> = dyn FnMut(u16, u64, &[u8]) -> bool + 'a;

/// Where window state goes when a window subtask's cache evicts it: one operator's windows
/// in one subtask, as `(key group, key, window start) → bytes`, ordered by key group, then
/// key, then window (the RocksDB column family of the operator on the subtask's shard, or
/// [`MemoryStore`]).
///
/// Contract: `write` applies the batch in order (atomically where the store can); scans
/// visit in that order and see every write made before them.
pub trait WindowStore: Send {
    /// Apply a batch.
    fn write(&mut self, batch: &StoreBatch) -> Result<(), StoreError>;
    /// Visit every window of `key`, in window order: `visit(window, value)`.
    fn scan_key(&mut self, kg: u16, key: u64, visit: &mut dyn FnMut(u64, &[u8])) -> Result<(), StoreError>;
    /// Visit windows in order from the first key at or after `(kg, key)`, until `visit`
    /// returns false: `visit(kg, key, window, value)`.
    fn scan_from(&mut self, from: (u16, u64), visit: &mut VisitWindow<'_>) -> Result<(), StoreError>;
    /// Checkpoint: write a durable snapshot of the store to `dir` (which does not exist) and
    /// say `true`; or say `false` (the default) when the store has no files of its own, and
    /// the operator puts the store's content into its checkpoint bytes instead.
    fn checkpoint(&mut self, _dir: &std::path::Path) -> Result<bool, StoreError> {
        Ok(false)
    }
    /// Whether the store folds [`StoreOp::Merge`] operands (it was given the aggregate's
    /// merge); a store that does not fails a batch holding one.
    fn merges(&self) -> bool {
        false
    }
    /// A checkpoint's writes begin (`true`) or ended (`false`): while they go on, a store
    /// that reorganises what it holds as it writes (the run store's folds) may put that
    /// off until after, so the barrier waits for the checkpoint's own writes only.
    fn hold_folds(&mut self, _hold: bool) {}
    /// Whether the store keeps a copy of the operator's cache between checkpoints (one
    /// value per cached key, beside the windows, in the snapshot with them), so a checkpoint
    /// writes only what changed since the last one. A store without (the heap) is given the
    /// whole cache at each checkpoint (`Spill::copy`).
    fn keeps_copies(&self) -> bool {
        false
    }
    /// Change the cache's copy: delete the keys `deletes`, then put `puts` (key group, key,
    /// `encode_copy`d slot).
    fn write_copies(&mut self, _deletes: &[(u16, u64)], _puts: &[(u16, u64, Vec<u8>)]) -> Result<(), StoreError> {
        Err(StoreError("this store keeps no copy of the cache".into()))
    }
    /// Visit the cache's copy in key order from the first key at or after `from` (restore),
    /// until `visit(kg, key, encoded slot)` returns false.
    fn scan_copies(&mut self, _from: (u16, u64), _visit: &mut VisitCopy<'_>) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A cached key's windows as one value of the cache's copy: per window `start u64 LE |
/// length u32 LE |` [`encode_value`].
pub(crate) fn encode_copy<A: Record>(slot: &Slot<A>) -> Vec<u8> {
    let mut out = Vec::new();
    for e in slot.entries.as_slice() {
        let v = encode_value(e.end, slot.caught_up, &e.acc);
        out.extend_from_slice(&e.start.to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(&v);
    }
    out
}

/// The slot [`encode_copy`] wrote (whole; its `next_due` left for the operator).
pub(crate) fn decode_copy<A: Record + Clone>(kg: u16, key: u64, mut bytes: &[u8]) -> Result<Slot<A>, StoreError> {
    let mut entries = Vec::new();
    while !bytes.is_empty() {
        let head = bytes.get(..12).ok_or_else(|| StoreError(format!("key group {kg}, key {key}: a truncated copy")))?;
        let start = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
        let v = bytes
            .get(12..12 + len)
            .ok_or_else(|| StoreError(format!("key group {kg}, key {key}: a truncated copy")))?;
        entries.push((start, decode_value::<A>(v).map_err(|e| corrupt_at(kg, key, start, e))?));
        bytes = &bytes[12 + len..];
    }
    Ok(slot_of(kg, key, entries))
}

/// A window's encoded value ([`encode_value`]) with its accumulator converted by `m` (a
/// restore into a job whose accumulator type changed: `crate::checkpoint::upgrade`).
pub(crate) fn convert_value(v: &[u8], m: &crate::record::schema::Migration) -> Result<Vec<u8>, String> {
    let (head, acc) = v.split_at_checked(16).ok_or_else(|| format!("a window value of {} bytes", v.len()))?;
    let mut out = head.to_vec();
    out.extend_from_slice(&m.apply(acc).map_err(|e| e.to_string())?);
    Ok(out)
}

/// A cache copy ([`encode_copy`]) with each window's accumulator converted by `m`.
#[cfg(feature = "rocksdb")]
pub(crate) fn convert_copy(mut bytes: &[u8], m: &crate::record::schema::Migration) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(bytes.len());
    while !bytes.is_empty() {
        let head = bytes.get(..12).ok_or("a truncated copy")?;
        let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
        let v = convert_value(bytes.get(12..12 + len).ok_or("a truncated copy")?, m)?;
        out.extend_from_slice(&head[..8]);
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(&v);
        bytes = &bytes[12 + len..];
    }
    Ok(out)
}

/// How an aggregate's partial windows fold, on their encoded values (see [`encode_value`]):
/// accumulators merged, the window end kept, and the key's caught-up time the earliest
/// of them (a partial written while the key's older windows waited in the store must not
/// hide that they have not fired). `None` for bytes that are not such a value.
pub(crate) fn value_merge<A: Record + Clone>(merge: impl Fn(&mut A, &A) + Send + Sync + 'static) -> ValueMerge {
    Arc::new(move |existing: Option<&[u8]>, operands: &mut dyn Iterator<Item = &[u8]>| {
        let mut folded: Option<(u64, u64, A)> = match existing {
            Some(v) => Some(decode_value::<A>(v).ok()?),
            None => None,
        };
        for operand in operands {
            let (end, caught_up, acc) = decode_value::<A>(operand).ok()?;
            folded = Some(match folded {
                None => (end, caught_up, acc),
                Some((e, c, mut a)) => {
                    merge(&mut a, &acc);
                    (e.max(end), c.min(caught_up), a)
                }
            });
        }
        let (end, caught_up, acc) = folded?;
        Some(encode_value(end, caught_up, &acc))
    })
}

/// A [`WindowStore`] in a `BTreeMap` under the raw keys of [`state_key`]: the store when no
/// state backend is configured, and the model the others are tested against. Not bounded:
/// it holds what the cache evicted.
#[derive(Default)]
pub struct MemoryStore {
    map: BTreeMap<[u8; STATE_KEY_BYTES], Vec<u8>>,
    merge: Option<ValueMerge>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("windows", &self.map.len()).field("merges", &self.merge.is_some()).finish()
    }
}

impl MemoryStore {
    /// A store that folds merge operands with `merge` (as a RocksDB column family with that
    /// merge operator does, but at once).
    pub fn with_merge(merge: ValueMerge) -> MemoryStore {
        MemoryStore { map: BTreeMap::new(), merge: Some(merge) }
    }

    /// Windows held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl WindowStore for MemoryStore {
    fn write(&mut self, batch: &StoreBatch) -> Result<(), StoreError> {
        for op in &batch.ops {
            match *op {
                StoreOp::Put { kg, key, window, ref value } => {
                    self.map.insert(state_key(kg, key, window), batch.value(value).to_vec());
                }
                StoreOp::Merge { kg, key, window, ref value } => {
                    let merge = self.merge.as_ref().ok_or_else(|| {
                        StoreError("a merge operand for a store without the aggregate's merge".into())
                    })?;
                    let k = state_key(kg, key, window);
                    let folded = merge(self.map.get(&k).map(Vec::as_slice), &mut std::iter::once(batch.value(value)))
                        .ok_or_else(|| {
                        StoreError(format!("key group {kg}, key {key}: a window value or operand is corrupt"))
                    })?;
                    self.map.insert(k, folded);
                }
                StoreOp::Delete { kg, key, window } => {
                    self.map.remove(&state_key(kg, key, window));
                }
                StoreOp::DeleteRange { from, to } => {
                    let lower = state_key(from.0, from.1, 0);
                    let doomed: Vec<_> = match to {
                        Some(to) => self.map.range(lower..state_key(to.0, to.1, 0)).map(|(k, _)| *k).collect(),
                        None => self.map.range(lower..).map(|(k, _)| *k).collect(),
                    };
                    for k in doomed {
                        self.map.remove(&k);
                    }
                }
            }
        }
        Ok(())
    }

    fn merges(&self) -> bool {
        self.merge.is_some()
    }

    fn scan_key(&mut self, kg: u16, key: u64, visit: &mut dyn FnMut(u64, &[u8])) -> Result<(), StoreError> {
        for (k, v) in self.map.range(state_key(kg, key, 0)..=state_key(kg, key, u64::MAX)) {
            visit(split_key(k).2, v);
        }
        Ok(())
    }

    fn scan_from(&mut self, from: (u16, u64), visit: &mut VisitWindow<'_>) -> Result<(), StoreError> {
        for (k, v) in self.map.range(state_key(from.0, from.1, 0)..) {
            let (kg, key, window) = split_key(k);
            if !visit(kg, key, window, v) {
                break;
            }
        }
        Ok(())
    }
}

/// Bytes of a raw state key.
pub const STATE_KEY_BYTES: usize = 18;

/// The raw key of window `start` of `key` in key group `kg`: `kg (u16 BE) | key (u64 BE) |
/// start (u64 BE)`, so byte order is (key group, key, window) order.
pub fn state_key(kg: u16, key: u64, start: u64) -> [u8; STATE_KEY_BYTES] {
    let mut k = [0u8; STATE_KEY_BYTES];
    k[..2].copy_from_slice(&kg.to_be_bytes());
    k[2..10].copy_from_slice(&key.to_be_bytes());
    k[10..].copy_from_slice(&start.to_be_bytes());
    k
}

fn split_key(k: &[u8; STATE_KEY_BYTES]) -> (u16, u64, u64) {
    let (kg, rest) = k.split_at(2);
    let (key, start) = rest.split_at(8);
    let be = |b: &[u8]| b.iter().fold(0u64, |v, &x| (v << 8) | x as u64);
    (be(kg) as u16, be(key), be(start))
}

pub(crate) fn encode_value<A: Record>(end: u64, caught_up: u64, acc: &A) -> Vec<u8> {
    let mut v = Vec::new();
    encode_value_into(&mut v, end, caught_up, acc);
    v
}

/// [`encode_value`], appended to `out`.
pub(crate) fn encode_value_into<A: Record>(out: &mut Vec<u8>, end: u64, caught_up: u64, acc: &A) {
    let at = out.len();
    out.resize(at + 16 + acc.encoded_len(), 0);
    let v = &mut out[at..];
    v[..8].copy_from_slice(&end.to_le_bytes());
    v[8..16].copy_from_slice(&caught_up.to_le_bytes());
    acc.encode(&mut v[16..]);
}

fn decode_value<A: Record + Clone>(v: &[u8]) -> Result<(u64, u64, A), StoreError> {
    if v.len() < 16 {
        return Err(StoreError(format!("a value of {} bytes is too short for a window", v.len())));
    }
    let end = u64::from_le_bytes(v[..8].try_into().expect("8 bytes"));
    let caught_up = u64::from_le_bytes(v[8..16].try_into().expect("8 bytes"));
    let acc = decode_aligned::<A>(&v[16..]).map_err(|e| StoreError(e.to_string()))?;
    Ok((end, caught_up, acc))
}

/// Fixed-layout records decode in place, which needs their alignment (ring payloads are
/// 8-aligned); a store's bytes come at any address, so they are copied to an 8-aligned
/// buffer first.
/// (Up to 256 bytes on the stack: an allocation per stored window read is most of what
/// reading one costs.)
fn decode_aligned<A: Record + Clone>(bytes: &[u8]) -> Result<A, crate::record::CodecError> {
    let mut stack = [0u64; 32];
    let mut heap = Vec::new();
    let words: &mut [u64] = if bytes.len() <= 256 {
        &mut stack[..bytes.len().div_ceil(8)]
    } else {
        heap.resize(bytes.len().div_ceil(8), 0u64);
        &mut heap
    };
    let aligned = &mut zerocopy::IntoBytes::as_mut_bytes(words)[..bytes.len()];
    aligned.copy_from_slice(bytes);
    A::decode(aligned, |a| a.clone())
}

/// Keys read from the store, and where the next read starts (`None`: the end).
pub(crate) type ReadChunk<A> = (Vec<Slot<A>>, Option<(u16, u64)>);

/// The operator's side of the store: what it evicted, and a filter that answers "certainly
/// not in the store" for most keys that never were, so a new key costs no store read.
pub(crate) struct Spill {
    store: Box<dyn WindowStore>,
    /// The store folds merge operands: partial slots may be written blindly.
    pub merges: bool,
    /// Keys whose state is in the store now.
    pub stored_keys: u64,
    /// One bit per hash of an evicted key (a one-hash Bloom filter), cleared when the store
    /// empties.
    bits: Vec<u64>,
    /// The batch evictions are written with, reused.
    batch: StoreBatch,
}

impl Spill {
    /// A spill over `store` with a filter of `filter_bytes` (rounded to a power of two).
    pub(crate) fn new(store: Box<dyn WindowStore>, filter_bytes: u64) -> Spill {
        let words = (filter_bytes / 8).max(16).next_power_of_two() as usize;
        Spill { merges: store.merges(), store, stored_keys: 0, bits: vec![0; words], batch: StoreBatch::default() }
    }

    /// Whether `key` may have state in the store.
    #[inline]
    pub(crate) fn maybe_stored(&self, key: u64) -> bool {
        if self.stored_keys == 0 {
            return false;
        }
        let (w, m) = bit_of(&self.bits, key);
        self.bits[w] & m != 0
    }

    /// Write evicted slots to the store, in one batch: a whole key's windows as values, a
    /// partial slot's as merge operands (folded into what the store holds for them).
    /// `stored_keys` counts each slot, so it may count a key twice: it errs high, and the
    /// filter is only cleared when it reaches 0, so a stored key never reads as absent.
    pub(crate) fn put<A: Record>(&mut self, slots: Vec<Slot<A>>) -> Result<(), StoreError> {
        // The eviction's batch, reused: no allocation per window.
        let batch = &mut self.batch;
        batch.clear();
        // A slot with no windows (left by the record path during a sweep) stores nothing.
        for slot in slots.iter().filter(|s| !s.entries.is_empty()) {
            for e in slot.entries.as_slice() {
                batch.put_window(slot, e, slot.partial);
            }
            let (w, m) = bit_of(&self.bits, slot.key);
            self.bits[w] |= m;
            self.stored_keys += 1;
        }
        let written = self.store.write(&self.batch);
        // A batch grown past its usual size (an eviction of large windows) is not kept.
        if self.batch.values.capacity() > BATCH_KEEP_BYTES {
            self.batch = StoreBatch::default();
        }
        written
    }

    /// Checkpoint, step 1: copy every window of `slots` (cached keys, which are not in the
    /// store) into the store, so that a snapshot of the store holds all state. Step 3,
    /// [`uncopy`](Spill::uncopy), removes the copies again.
    pub(crate) fn copy<A: Record>(&mut self, slots: &[Slot<A>], batch_keys: usize) -> Result<(), StoreError> {
        for chunk in slots.chunks(batch_keys.max(1)) {
            let mut batch = StoreBatch::default();
            for slot in chunk {
                for e in slot.entries.as_slice() {
                    batch.put_window(slot, e, false);
                }
            }
            self.store.write(&batch)?;
        }
        Ok(())
    }

    /// Checkpoint, step 3: delete what [`copy`](Spill::copy) wrote (the cache still holds it).
    pub(crate) fn uncopy<A>(&mut self, slots: &[Slot<A>], batch_keys: usize) -> Result<(), StoreError> {
        for chunk in slots.chunks(batch_keys.max(1)) {
            let mut batch = StoreBatch::default();
            for slot in chunk {
                for e in slot.entries.as_slice() {
                    batch.delete(slot.kg, slot.key, e.start);
                }
            }
            self.store.write(&batch)?;
        }
        Ok(())
    }

    /// [`WindowStore::hold_folds`].
    pub(crate) fn hold_folds(&mut self, hold: bool) {
        self.store.hold_folds(hold)
    }

    /// Whether the store keeps the cache's copy ([`WindowStore::keeps_copies`]).
    pub(crate) fn keeps_copies(&self) -> bool {
        self.store.keeps_copies()
    }

    /// [`WindowStore::write_copies`].
    pub(crate) fn write_copies(
        &mut self,
        deletes: &[(u16, u64)],
        puts: &[(u16, u64, Vec<u8>)],
    ) -> Result<(), StoreError> {
        self.store.write_copies(deletes, puts)
    }

    /// [`WindowStore::scan_copies`].
    pub(crate) fn scan_copies(&mut self, from: (u16, u64), visit: &mut VisitCopy<'_>) -> Result<(), StoreError> {
        self.store.scan_copies(from, visit)
    }

    /// Checkpoint, step 2: a snapshot of the store in `dir` (true), or none (false).
    pub(crate) fn checkpoint(&mut self, dir: &std::path::Path) -> Result<bool, StoreError> {
        self.store.checkpoint(dir)
    }

    /// Every window in the store, encoded: `kg u16 LE | key u64 LE | start u64 LE | value
    /// length u32 LE | value`, for a store without files of its own.
    pub(crate) fn export(&mut self, out: &mut Vec<u8>) -> Result<(), StoreError> {
        self.store.scan_from((0, 0), &mut |kg, key, start, v| {
            out.extend_from_slice(&kg.to_le_bytes());
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
            true
        })
    }

    /// Restore: write back what [`export`](Spill::export) encoded, of the key groups `keep`
    /// (a subtask restored at another parallelism takes its own from each old subtask's).
    pub(crate) fn import(&mut self, mut bytes: &[u8], keep: &std::ops::Range<u32>) -> Result<(), StoreError> {
        let bad = || StoreError("the checkpoint's window state is truncated".into());
        let mut batch = StoreBatch::default();
        while !bytes.is_empty() {
            let head = bytes.get(..22).ok_or_else(bad)?;
            let kg = u16::from_le_bytes(head[..2].try_into().expect("2 bytes"));
            let key = u64::from_le_bytes(head[2..10].try_into().expect("8 bytes"));
            let start = u64::from_le_bytes(head[10..18].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(head[18..22].try_into().expect("4 bytes")) as usize;
            let value = bytes.get(22..22 + len).ok_or_else(bad)?;
            if keep.contains(&u32::from(kg)) {
                batch.put(kg, key, start, value);
            }
            bytes = &bytes[22 + len..];
            if batch.ops.len() >= 4096 {
                self.store.write(&batch)?;
                batch.clear();
            }
        }
        self.store.write(&batch)
    }

    /// Restore: count the keys in the store and set their filter bits (the store was filled
    /// from a checkpoint, not by evictions).
    pub(crate) fn rebuild_filter(&mut self) -> Result<(), StoreError> {
        self.bits.fill(0);
        let mut keys = 0u64;
        let mut last = None;
        let mut marks = Vec::new();
        self.store.scan_from((0, 0), &mut |kg, key, _, _| {
            if last != Some((kg, key)) {
                last = Some((kg, key));
                keys += 1;
                marks.push(key);
            }
            true
        })?;
        for key in marks {
            let (w, m) = bit_of(&self.bits, key);
            self.bits[w] |= m;
        }
        self.stored_keys = keys;
        Ok(())
    }

    /// Take `key`'s state out of the store, if it is there.
    pub(crate) fn take<A: Record + Clone>(&mut self, kg: u16, key: u64) -> Result<Option<Slot<A>>, StoreError> {
        let mut entries = Vec::new();
        let mut failure = None;
        self.store.scan_key(kg, key, &mut |start, v| match decode_value::<A>(v) {
            Ok(value) => entries.push((start, value)),
            Err(e) => failure = Some(corrupt_at(kg, key, start, e)),
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if entries.is_empty() {
            return Ok(None);
        }
        let mut batch = StoreBatch::default();
        for (start, _) in &entries {
            batch.delete(kg, key, *start);
        }
        self.store.write(&batch)?;
        self.forget_one();
        Ok(Some(slot_of(kg, key, entries)))
    }

    pub(crate) fn forget_one(&mut self) {
        self.stored_keys -= 1;
        if self.stored_keys == 0 {
            self.bits.fill(0);
        }
    }

    /// Up to `max_keys` keys' state, in order from key `from`; and the key the next read
    /// starts at (`None`: the end of the store).
    pub(crate) fn read<A: Record + Clone>(
        &mut self,
        from: (u16, u64),
        max_keys: usize,
    ) -> Result<ReadChunk<A>, StoreError> {
        let mut slots: Vec<Slot<A>> = Vec::new();
        let mut current: Option<(u16, u64)> = None;
        let mut entries = Vec::new();
        let mut next = None;
        let mut failure = None;
        self.store.scan_from(from, &mut |kg, key, start, v| {
            if current != Some((kg, key)) {
                if let Some((ckg, ckey)) = current {
                    slots.push(slot_of(ckg, ckey, std::mem::take(&mut entries)));
                }
                if slots.len() >= max_keys {
                    next = Some((kg, key));
                    return false;
                }
                current = Some((kg, key));
            }
            match decode_value::<A>(v) {
                Ok(value) => {
                    entries.push((start, value));
                    true
                }
                Err(e) => {
                    failure = Some(corrupt_at(kg, key, start, e));
                    false
                }
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if next.is_none()
            && let Some((kg, key)) = current
        {
            slots.push(slot_of(kg, key, entries));
        }
        Ok((slots, next))
    }

    /// Write back a slot read by [`read`](Spill::read) whose windows changed: delete the
    /// windows in `old_starts` that are gone, put the rest.
    pub(crate) fn write_back<A: Record>(&mut self, batch: &mut StoreBatch, slot: &Slot<A>, old_starts: &[u64]) {
        let entries = slot.entries.as_slice();
        for &s in old_starts {
            if entries.binary_search_by_key(&s, |e| e.start).is_err() {
                batch.delete(slot.kg, slot.key, s);
            }
        }
        for e in entries {
            batch.put_window(slot, e, false);
        }
        if entries.is_empty() {
            self.forget_one();
        }
    }

    /// Rewrite the keys read from `from` up to `next` as `slots` now are: one range delete
    /// over them, then a put of every window that stays (a key left without windows leaves
    /// the store).
    pub(crate) fn range_rewrite<'s, A: Record + 's>(
        &mut self,
        from: (u16, u64),
        next: Option<(u16, u64)>,
        slots: impl Iterator<Item = &'s Slot<A>>,
    ) -> StoreBatch {
        let mut batch = StoreBatch::default();
        batch.delete_range(from, next);
        for slot in slots {
            let entries = slot.entries.as_slice();
            for e in entries {
                batch.put_window(slot, e, false);
            }
            if entries.is_empty() {
                self.forget_one();
            }
        }
        batch
    }

    /// Apply a batch.
    pub(crate) fn write(&mut self, batch: StoreBatch) -> Result<(), StoreError> {
        if batch.is_empty() { Ok(()) } else { self.store.write(&batch) }
    }
}

/// The word and bit of `key` in a filter of `bits`.
fn bit_of(bits: &[u64], key: u64) -> (usize, u64) {
    let h = crate::record::hash_key(&key).rotate_left(17);
    let len = bits.len() as u64 * 64;
    let b = h & (len - 1);
    ((b / 64) as usize, 1u64 << (b % 64))
}

/// An eviction's batch keeps its values' buffer up to this size (its usual size is a few
/// hundred KiB: at most [`super::cache::EVICT_BATCH_MAX`] keys).
const BATCH_KEEP_BYTES: usize = 4 << 20;

/// A stored window that does not decode, named by where it is.
fn corrupt_at(kg: u16, key: u64, start: u64, e: StoreError) -> StoreError {
    StoreError(format!("key group {kg}, key {key}, window at {start} ns: {} (corrupt state)", e.0))
}

/// A slot from stored windows (sorted by start, as the store keeps them). Its `next_due` is
/// left for the operator to compute.
fn slot_of<A>(kg: u16, key: u64, entries: Vec<(u64, (u64, u64, A))>) -> Slot<A> {
    // The earliest: windows written as partials carry the time they were started at, later
    // than the key's own caught-up time if its older windows waited in the store (see
    // `value_merge`). A whole key's windows all carry the same time.
    let caught_up = entries.iter().map(|(_, (_, c, _))| *c).min().unwrap_or(0);
    let mut list = Entries::new();
    for (i, (start, (end, _, acc))) in entries.into_iter().enumerate() {
        list.insert(i, Entry { start, end, acc });
    }
    Slot { entries: list, caught_up, next_due: 0, ..Slot::new(key, kg, 0) }
}

/// Fold `stored` (a key's windows read from the store: older) into `slot` (the same key's
/// partial slot: newer), window by window, older first, so a merge that is not commutative
/// still sees records in order. The slot is whole afterwards; its `next_due` is left for the
/// caller.
pub(crate) fn fold_into<T, G: crate::window::WindowAggregate<T>>(
    agg: &G,
    slot: &mut Slot<G::Acc>,
    stored: Slot<G::Acc>,
) {
    slot.caught_up = slot.caught_up.min(stored.caught_up);
    slot.partial = false;
    match stored.entries {
        Entries::One(e) => fold_entry(agg, slot, e),
        Entries::Many(older) => older.into_iter().for_each(|e| fold_entry(agg, slot, e)),
    }
}

fn fold_entry<T, G: crate::window::WindowAggregate<T>>(agg: &G, slot: &mut Slot<G::Acc>, mut e: Entry<G::Acc>) {
    match slot.entries.as_slice().binary_search_by_key(&e.start, |x| x.start) {
        Ok(i) => {
            let newer = &mut slot.entries.as_mut_slice()[i];
            agg.merge(&mut e.acc, &newer.acc);
            newer.acc = e.acc;
            newer.end = newer.end.max(e.end);
        }
        Err(i) => slot.entries.insert(i, e),
    }
}

/// What the stores' tests share: reading a store whole, and checking a subtask's store and
/// its neighbours' on the same column family against their models (RocksDB's stores use them).
#[cfg(all(test, feature = "rocksdb"))]
pub(crate) mod testing {
    use super::{MemoryStore, StoreBatch, WindowStore};

    /// Up to `limit` windows from `(kg, key)` on: `(kg, key, window, value)`.
    pub(crate) fn visit_all(s: &mut dyn WindowStore, from: (u16, u64), limit: usize) -> Vec<(u16, u64, u64, Vec<u8>)> {
        let mut seen = Vec::new();
        s.scan_from(from, &mut |kg, key, w, v| {
            seen.push((kg, key, w, v.to_vec()));
            seen.len() < limit
        })
        .unwrap();
        seen
    }

    /// Every window of `key`: `(window, value)`.
    pub(crate) fn key_windows(s: &mut dyn WindowStore, kg: u16, key: u64) -> Vec<(u64, Vec<u8>)> {
        let mut seen = Vec::new();
        s.scan_key(kg, key, &mut |w, v| seen.push((w, v.to_vec()))).unwrap();
        seen
    }

    /// One round of random operations `(kg, key, window, op, v)` as the batches of the
    /// stores of key groups 0..1, 1..5 and 5..8 (in that order): op 0 deletes a window; op 1
    /// in key groups 1..5 deletes a range of keys — within the key group, into the next one
    /// (maybe a neighbour's, key `v % keys`), or to the end of the subtask's key groups; from
    /// the very first key now and then; any other op is `other(batch, kg, key, window, op, v)`.
    pub(crate) fn random_batches(
        ops: &[(u16, u64, u64, u8, u8)],
        keys: u64,
        mut other: impl FnMut(&mut StoreBatch, u16, u64, u64, u8, u8),
    ) -> [StoreBatch; 3] {
        let mut batches: [StoreBatch; 3] = Default::default();
        for &(kg, key, w, op, v) in ops {
            let batch = &mut batches[match kg {
                0 => 0,
                1..5 => 1,
                _ => 2,
            }];
            match op {
                0 => batch.delete(kg, key, w),
                1 if (1..5).contains(&kg) => {
                    let from = if v % 4 == 3 { (0, 0) } else { (kg, key) };
                    let to = match v % 3 {
                        0 => Some((kg, key + 3)),
                        1 => Some((kg + 1, v as u64 % keys)),
                        _ => None,
                    };
                    batch.delete_range(from, to);
                }
                _ => other(batch, kg, key, w, op, v),
            }
        }
        batches
    }

    /// A subtask's store (key groups 1..5) and its neighbours' (0..1 below, 5..8 above),
    /// each beside its model: every key's windows alike in all of them, and scans of the
    /// subtask's from `from` alike at several limits.
    pub(crate) fn matches_models(
        [(below, m_below), (mine, m), (above, m_above)]: [(&mut dyn WindowStore, &mut MemoryStore); 3],
        keys: u64,
        from: (u16, u64),
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let mut pairs = [(below, m_below), (mine, m), (above, m_above)];
        for kg in 0..8u16 {
            for key in 0..keys {
                let (store, model) = &mut pairs[match kg {
                    0 => 0,
                    1..5 => 1,
                    _ => 2,
                }];
                proptest::prop_assert_eq!(
                    key_windows(*store, kg, key),
                    key_windows(*model, kg, key),
                    "key group {}, key {}",
                    kg,
                    key
                );
            }
        }
        let (store, model) = &mut pairs[1];
        for limit in [1, 7, usize::MAX] {
            proptest::prop_assert_eq!(visit_all(*store, from, limit), visit_all(*model, from, limit));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys sort by key group, then key, then window start; a key's windows are one range.
    #[test]
    fn key_layout_orders_by_group_key_window() {
        let a = state_key(1, 5, 100);
        let b = state_key(1, 5, 200);
        let c = state_key(1, 6, 0);
        let d = state_key(2, 0, 0);
        assert!(a < b && b < c && c < d);
        assert_eq!(&a[..2], &[0, 1], "key group first, big-endian");
        assert_eq!(split_key(&c), (1, 6, 0));
    }

    /// A window value decodes at any address (a store's buffers are not aligned).
    #[test]
    fn values_decode_unaligned() {
        let stats = crate::window::Stats { count: 3, sum: 9, min: 1, max: 5 };
        let v = encode_value(10, 4, &stats);
        let mut shifted = vec![0u8; v.len() + 1];
        shifted[1..].copy_from_slice(&v);
        assert_eq!(decode_value::<crate::window::Stats>(&shifted[1..]), Ok((10, 4, stats)));
    }

    /// Evicted slots come back whole and leave the store; reads go key by key in chunks.
    #[test]
    fn spill_round_trip() {
        let mut spill = Spill::new(Box::new(MemoryStore::default()), 1024);
        let mk = |key: u64, starts: &[u64]| {
            let mut entries = Entries::new();
            for (i, &s) in starts.iter().enumerate() {
                entries.insert(i, Entry { start: s, end: s + 10, acc: s * 2 });
            }
            Slot {
                key,
                kg: (key % 3) as u16,
                touched: false,
                partial: false,
                caught_up: 7,
                next_due: 0,
                heap_bytes: 0,
                dirty: true,
                copied: false,
                entries,
            }
        };
        spill.put(vec![mk(1, &[0, 10]), mk(2, &[20]), mk(3, &[30, 40, 50])]).unwrap();
        assert_eq!(spill.stored_keys, 3);
        assert!(spill.maybe_stored(1) && spill.maybe_stored(2) && spill.maybe_stored(3));
        let (first, next) = spill.read::<u64>((0, 0), 2).unwrap();
        assert_eq!(first.len(), 2);
        let (rest, end) = spill.read::<u64>(next.unwrap(), 2).unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(end, None);
        let slot = spill.take::<u64>(0, 3).unwrap().unwrap();
        let got: Vec<(u64, u64, u64)> = slot.entries.as_slice().iter().map(|e| (e.start, e.end, e.acc)).collect();
        assert_eq!(got, vec![(30, 40, 60), (40, 50, 80), (50, 60, 100)]);
        assert_eq!(slot.caught_up, 7);
        assert_eq!(spill.take::<u64>(0, 3).unwrap().map(|s| s.key), None, "taken out of the store");
        spill.take::<u64>(1, 1).unwrap().unwrap();
        spill.take::<u64>(2, 2).unwrap().unwrap();
        assert_eq!(spill.stored_keys, 0);
        assert!(!spill.maybe_stored(1), "an empty store answers no at once");
    }
}
