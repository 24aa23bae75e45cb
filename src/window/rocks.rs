//! Window state in RocksDB: a [`WindowStore`] over the operator's column family in the
//! subtask's shard ([`crate::state::Store`]).
//!
//! A window `(key group, key, start)` is the state entry `(key group, key as u64 BE, start
//! as u64 BE)`, so the backend's key order (key group, then key, then namespace; keys all
//! 8 bytes long) is the window order the operator expects.

use super::store::{StoreBatch, StoreError, StoreOp, VisitWindow, WindowStore};
use crate::state::{Store, WRITE_BATCH_BYTES_MAX};
use std::ops::Range;

/// The window state of one subtask in its RocksDB shard.
#[derive(Debug)]
pub struct RocksWindowStore {
    store: Store,
    /// The subtask's key groups: subtasks of one operator pinned to one core share the
    /// column family, and each must see only its own windows.
    key_groups: Range<u32>,
    /// The column family has the aggregate's merge operator.
    merges: bool,
    /// The cache's copy (its own column family, [`crate::state::cache_copy_family`]): one
    /// value per cached key, kept between checkpoints so each writes only what changed.
    copies: Option<Store>,
}

impl RocksWindowStore {
    /// Windows of the key groups `key_groups` in `store`.
    pub fn new(store: Store, key_groups: Range<u32>) -> RocksWindowStore {
        RocksWindowStore { store, key_groups, merges: false, copies: None }
    }

    /// The same, over a column family that the backend opened with the aggregate's merge
    /// operator ([`crate::state::StateBackend::open_with`]): merge operands are written.
    pub fn with_merges(store: Store, key_groups: Range<u32>) -> RocksWindowStore {
        RocksWindowStore { store, key_groups, merges: true, copies: None }
    }
}

impl RocksWindowStore {
    /// The same, keeping the cache's copy in `copies` (the operator's
    /// [`crate::state::cache_copy_family`] on the same shard): incremental checkpoints.
    pub fn with_copies(mut self, copies: Store) -> RocksWindowStore {
        self.copies = Some(copies);
        self
    }
}

fn failed(e: crate::state::StateError) -> StoreError {
    StoreError(e.to_string())
}

/// A read failed at key group `kg` (or just after it: the cursor was moving on).
fn failed_in(kg: u16, e: crate::state::StateError) -> StoreError {
    StoreError(format!("reading key group {kg}: {e}"))
}

/// Visit the entries of `store` in the key groups `key_groups`, in key order, from the first
/// key at or after `from` (keys are 8 bytes, big-endian), until `visit(kg, key, entry)`
/// returns false.
fn scan_keys(
    store: &Store,
    key_groups: &Range<u32>,
    from: (u16, u64),
    visit: &mut dyn FnMut(u16, u64, &crate::state::Entry<'_>) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let start = (from.0 as u32).max(key_groups.start);
    if start >= key_groups.end {
        return Ok(());
    }
    let mut cursor = store.scan(start..key_groups.end);
    // The key group being read, for the message if RocksDB fails (a corrupt block or merge
    // operand): the last one seen, or the first of the range.
    let mut at = start as u16;
    while let Some(e) = cursor.next().map_err(|e| failed_in(at, e))? {
        at = e.key_group;
        let key = be(e.key, "key")?;
        if (e.key_group, key) < from {
            continue;
        }
        if !visit(e.key_group, key, &e)? {
            break;
        }
    }
    Ok(())
}

fn be(bytes: &[u8], what: &str) -> Result<u64, StoreError> {
    let b: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StoreError(format!("a window {what} of {} bytes, not 8: not window state", bytes.len())))?;
    Ok(u64::from_be_bytes(b))
}

impl WindowStore for RocksWindowStore {
    fn write(&mut self, batch: &StoreBatch) -> Result<(), StoreError> {
        let mut b = self.store.batch();
        for op in &batch.ops {
            match op {
                StoreOp::Put { kg, key, window, value } => {
                    b.put(*kg, &key.to_be_bytes(), &window.to_be_bytes(), batch.value(value));
                }
                StoreOp::Merge { kg, key, window, value } => {
                    if !self.merges {
                        return Err(StoreError("a merge operand for a column family without a merge operator".into()));
                    }
                    b.merge(*kg, &key.to_be_bytes(), &window.to_be_bytes(), batch.value(value));
                }
                StoreOp::Delete { kg, key, window } => b.delete(*kg, &key.to_be_bytes(), &window.to_be_bytes()),
                StoreOp::DeleteRange { from, to } => {
                    // Within this subtask's key groups only: a sweep's range starts at the
                    // first key group (0, 0), and subtasks of the operator on one shard
                    // share the column family.
                    let own_start = u16::try_from(self.key_groups.start).unwrap_or(u16::MAX);
                    let from = if from.0 < own_start { (own_start, 0) } else { *from };
                    let to = to.filter(|(kg, _)| u32::from(*kg) < self.key_groups.end);
                    let to_key = to.map(|(kg, key)| (kg, key.to_be_bytes()));
                    let to = to_key.as_ref().map(|(kg, key)| (*kg, key.as_slice()));
                    b.delete_keys(from.0, &from.1.to_be_bytes(), to, self.key_groups.end);
                }
            }
            // A write batch lands in one memtable whole: commit in pieces the backend's
            // budget allows for (an eviction is not one atomic step; it need not be).
            if b.size_bytes() >= WRITE_BATCH_BYTES_MAX / 2 {
                std::mem::replace(&mut b, self.store.batch()).commit().map_err(failed)?;
            }
        }
        b.commit().map_err(failed)
    }

    fn scan_key(&mut self, kg: u16, key: u64, visit: &mut dyn FnMut(u64, &[u8])) -> Result<(), StoreError> {
        let mut cursor = self.store.scan_key(kg, &key.to_be_bytes());
        while let Some(e) = cursor.next().map_err(|e| failed_in(kg, e))? {
            visit(be(e.namespace, "start")?, e.value);
        }
        Ok(())
    }

    /// The backend's cursors start at a key group, not at a key within one: the keys of
    /// `from`'s key group before `from` are read again and skipped. A sweep reads the
    /// store in chunks, so a chunk re-reads at most one key group's earlier keys.
    fn scan_from(&mut self, from: (u16, u64), visit: &mut VisitWindow<'_>) -> Result<(), StoreError> {
        scan_keys(&self.store, &self.key_groups, from, &mut |kg, key, e| {
            Ok(visit(kg, key, be(e.namespace, "start")?, e.value))
        })
    }

    /// A RocksDB checkpoint of the whole shard (hard links); the manifest records that it is
    /// the truth for this subtask's key groups of this column family only.
    fn checkpoint(&mut self, dir: &std::path::Path) -> Result<bool, StoreError> {
        self.store.checkpoint(dir).map_err(failed)?;
        Ok(true)
    }

    fn merges(&self) -> bool {
        self.merges
    }

    fn keeps_copies(&self) -> bool {
        self.copies.is_some()
    }

    fn write_copies(&mut self, deletes: &[(u16, u64)], puts: &[(u16, u64, Vec<u8>)]) -> Result<(), StoreError> {
        let Some(copies) = &self.copies else { return Err(StoreError("this store keeps no copy of the cache".into())) };
        write_copies_in(copies, deletes, puts)
    }

    fn scan_copies(&mut self, from: (u16, u64), visit: &mut super::store::VisitCopy<'_>) -> Result<(), StoreError> {
        let Some(copies) = &self.copies else { return Ok(()) };
        scan_copies_in(copies, &self.key_groups, from, visit)
    }
}

/// Change the cache's copy in `copies`: delete the keys `deletes`, then put `puts`.
pub(super) fn write_copies_in(
    copies: &Store,
    deletes: &[(u16, u64)],
    puts: &[(u16, u64, Vec<u8>)],
) -> Result<(), StoreError> {
    let mut b = copies.batch();
    for (kg, key) in deletes {
        b.delete(*kg, &key.to_be_bytes(), &[]);
        if b.size_bytes() >= WRITE_BATCH_BYTES_MAX / 2 {
            std::mem::replace(&mut b, copies.batch()).commit().map_err(failed)?;
        }
    }
    for (kg, key, value) in puts {
        b.put(*kg, &key.to_be_bytes(), &[], value);
        if b.size_bytes() >= WRITE_BATCH_BYTES_MAX / 2 {
            std::mem::replace(&mut b, copies.batch()).commit().map_err(failed)?;
        }
    }
    b.commit().map_err(failed)
}

/// Visit the cache's copy in `copies` (key groups `key_groups`) from the first key at or
/// after `from`.
pub(super) fn scan_copies_in(
    copies: &Store,
    key_groups: &Range<u32>,
    from: (u16, u64),
    visit: &mut super::store::VisitCopy<'_>,
) -> Result<(), StoreError> {
    scan_keys(copies, key_groups, from, &mut |kg, key, e| Ok(visit(kg, key, e.value)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{StateBackend, StateConfig};
    use crate::window::MemoryStore;
    use crate::window::store::testing::{matches_models, random_batches};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// The RocksDB store behaves as the in-memory model under random batches of puts and
        /// deletes: the same windows per key, the same order from any starting key, and
        /// only its own key groups — its neighbours on the same column family (below and
        /// above) keep theirs, even under range deletes that start at the first key (as a
        /// sweep's do) or end past its key groups.
        #[test]
        fn rocksdb_store_matches_the_model(
            batches in prop::collection::vec(
                prop::collection::vec((0u16..8, 0u64..20, 0u64..4, 0u8..5, any::<u8>()), 1..40),
                1..6,
            ),
            from_kg in 0u16..7,
            from_key in 0u64..21,
        ) {
            let dir = std::env::temp_dir().join(format!("weir-rocks-model-{}-{}", std::process::id(), rand_suffix()));
            let backend = StateBackend::open(StateConfig::new(&dir, 1)).unwrap();
            // Key groups 1..5 are this subtask's; 0..1 and 5..8 its neighbours' on the same
            // shard and column family (subtasks of one operator sharing a core).
            let mut rocks = RocksWindowStore::new(backend.store("w", 0).unwrap(), 1..5);
            let mut below = RocksWindowStore::new(backend.store("w", 0).unwrap(), 0..1);
            let mut above = RocksWindowStore::new(backend.store("w", 0).unwrap(), 5..8);
            let (mut model, mut model_below, mut model_above) =
                (MemoryStore::default(), MemoryStore::default(), MemoryStore::default());
            for ops in &batches {
                let [low, mine, high] =
                    random_batches(ops, 20, |batch, kg, key, w, _, v| batch.put(kg, key, w, &vec![v; 1 + v as usize % 5]));
                rocks.write(&mine).unwrap();
                below.write(&low).unwrap();
                above.write(&high).unwrap();
                model.write(&mine).unwrap();
                model_below.write(&low).unwrap();
                model_above.write(&high).unwrap();
            }
            matches_models(
                [(&mut below, &mut model_below), (&mut rocks, &mut model), (&mut above, &mut model_above)],
                20,
                (from_kg, from_key),
            )?;
            drop((rocks, below, above));
            drop(backend);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// Partials written as merge operands fold on read (accumulators merged, the earliest
    /// caught-up time kept); an operand that is not a window value fails the read with an
    /// error naming the key group, not a panic or a wrong value.
    #[test]
    fn merge_operands_fold_and_a_corrupt_one_is_named() {
        use crate::window::Stats;
        let dir = std::env::temp_dir().join(format!("weir-rocks-merge-{}-{}", std::process::id(), rand_suffix()));
        let merge = crate::window::store::value_merge::<Stats>(|a, b| a.merge(b));
        let merges = [("w".to_string(), merge)].into_iter().collect();
        let backend = StateBackend::open_with(StateConfig::new(&dir, 1), merges).unwrap();
        let mut rocks = RocksWindowStore::with_merges(backend.store("w", 0).unwrap(), 0..8);
        let value = |caught_up: u64, v: u64| {
            let mut s = Stats::default();
            s.add(v);
            crate::window::store::encode_value(10, caught_up, &s)
        };
        let mut batch = StoreBatch::default();
        batch.put(3, 7, 0, &value(5, 1));
        batch.merge(3, 7, 0, &value(9, 2));
        batch.merge(3, 7, 0, &value(8, 4));
        rocks.write(&batch).unwrap();
        let mut seen = Vec::new();
        rocks.scan_key(3, 7, &mut |w, v| seen.push((w, v.to_vec()))).unwrap();
        let mut want = Stats::default();
        [1, 2, 4].into_iter().for_each(|v| want.add(v));
        assert_eq!(seen, vec![(0, crate::window::store::encode_value(10, 5, &want))]);
        let mut bad = StoreBatch::default();
        bad.merge(4, 1, 0, &[1, 2, 3]);
        rocks.write(&bad).unwrap();
        let e = rocks.scan_key(4, 1, &mut |_, _| {}).unwrap_err().to_string();
        assert!(e.contains("key group 4") && e.contains("shard 0"), "{e}");
        let e = rocks.scan_from((0, 0), &mut |_, _, _, _| true).unwrap_err().to_string();
        assert!(e.contains("key group 3") || e.contains("key group 4"), "{e}");
        drop(rocks);
        drop(backend);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }
}
