//! A subtask's handle on its operator's column family in one shard.

use super::backend::{Db, Shard, checkpoint_shard};
use super::error::StateError;
use super::key::{self, KeyParts};
use rocksdb::{BoundColumnFamily, DBRawIteratorWithThreadMode, ReadOptions, WriteBatch, WriteOptions};
use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// One operator's state in one shard, as bytes: `(key group, key, namespace) → value`.
///
/// Contract: single-key reads see every write committed before them through any `Store` of
/// the same operator and shard; a [`Batch`] commits atomically; scans run in key order
/// ([`super::key`]) over a consistent snapshot taken when the scan starts. Durability
/// comes from checkpoints: with the WAL off (the default) a crash loses what was written
/// since the last one.
///
/// A `Store` is `Send` (a subtask thread owns it); several may exist for one operator and
/// shard.
pub struct Store {
    shard: Arc<Shard>,
    operator: String,
    write_opts: WriteOptions,
    /// Options of single-key reads, made once: creating them is a call into RocksDB.
    read_opts: ReadOptions,
    /// The encoded key of the last single-key operation, reused to avoid allocating.
    scratch: Vec<u8>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("operator", &self.operator).field("shard", &self.shard.index).finish()
    }
}

impl Store {
    pub(crate) fn new(shard: Arc<Shard>, operator: String, wal: bool) -> Store {
        let mut write_opts = WriteOptions::default();
        write_opts.disable_wal(!wal);
        Store { shard, operator, write_opts, read_opts: ReadOptions::default(), scratch: Vec::with_capacity(64) }
    }

    /// The operator (column family) this store reads and writes.
    pub fn operator(&self) -> &str {
        &self.operator
    }

    /// The shard's index.
    pub fn shard_index(&self) -> usize {
        self.shard.index
    }

    fn db(&self) -> &Db {
        &self.shard.db
    }

    fn cf(&self) -> Arc<BoundColumnFamily<'_>> {
        // The column family was created by StateBackend::store and is never dropped while
        // the backend lives.
        self.db().cf_handle(&self.operator).expect("state column family vanished")
    }

    fn io(&self, op: &'static str) -> impl Fn(rocksdb::Error) -> StateError + '_ {
        move |source| StateError::Io { op, operator: self.operator.clone(), shard: self.shard.index, source }
    }

    /// The value of `(key_group, key, namespace)`, if any.
    pub fn get(&mut self, key_group: u16, key: &[u8], namespace: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let mut out = Vec::new();
        Ok(self.get_into(key_group, key, namespace, &mut out)?.then_some(out))
    }

    /// Read the value of `(key_group, key, namespace)` into `out` (cleared first); `false` if
    /// there is none. Allocates nothing once `out` is large enough.
    pub fn get_into(
        &mut self,
        key_group: u16,
        key: &[u8],
        namespace: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool, StateError> {
        key::encode_key(key_group, key, namespace, &mut self.scratch);
        out.clear();
        let cf = self.cf();
        let got = self.db().get_pinned_cf_opt(&cf, &self.scratch, &self.read_opts).map_err(self.io("get"))?;
        Ok(match got {
            Some(v) => {
                out.extend_from_slice(&v);
                true
            }
            None => false,
        })
    }

    /// Write one value (a batch of one; prefer [`Store::batch`] for many).
    pub fn put(&mut self, key_group: u16, key: &[u8], namespace: &[u8], value: &[u8]) -> Result<(), StateError> {
        let mut b = self.batch();
        b.put(key_group, key, namespace, value);
        b.commit()
    }

    /// Delete one value (a batch of one).
    pub fn delete(&mut self, key_group: u16, key: &[u8], namespace: &[u8]) -> Result<(), StateError> {
        let mut b = self.batch();
        b.delete(key_group, key, namespace);
        b.commit()
    }

    /// A write batch: puts and deletes collected in memory, committed with one RocksDB write.
    pub fn batch(&self) -> Batch<'_> {
        Batch { store: self, cf: self.cf(), batch: WriteBatch::default(), key: Vec::with_capacity(64) }
    }

    /// Scan the key groups `key_groups` (as [`crate::operators::SubtaskInfo::key_groups`]
    /// gives them) in key order. Panics if the range ends past 65536.
    pub fn scan(&self, key_groups: Range<u32>) -> Cursor<'_> {
        let (lower, upper) = key::key_group_bounds(&key_groups);
        self.cursor(lower, Some(upper))
    }

    /// Compact the whole column family now (tests: what a compaction filter does).
    #[cfg(test)]
    pub(crate) fn compact(&self) {
        self.db().compact_range_cf(&self.cf(), None::<&[u8]>, None::<&[u8]>);
    }

    /// Scan every namespace of one key, in namespace order. A key's entries sit in one or
    /// two blocks: no read-ahead (which would read 256 KiB for them once the state has
    /// outgrown the block cache).
    pub fn scan_key(&self, key_group: u16, key: &[u8]) -> Cursor<'_> {
        let mut prefix = Vec::new();
        key::encode_key_prefix(key_group, key, &mut prefix);
        let (lower, upper) = key::prefix_bounds(&prefix);
        self.cursor_with(lower, upper, 0)
    }

    /// Scan every entry whose *encoded* key starts with `prefix` (build prefixes with
    /// [`super::key`]), in key order.
    pub fn scan_prefix(&self, prefix: &[u8]) -> Cursor<'_> {
        let (lower, upper) = key::prefix_bounds(prefix);
        self.cursor(lower, upper)
    }

    /// A cursor over `[lower, upper)`: scans read many blocks, so it reads ahead.
    fn cursor(&self, lower: Vec<u8>, upper: Option<Vec<u8>>) -> Cursor<'_> {
        self.cursor_with(lower, upper, 256 << 10)
    }

    /// A cursor over `[lower, upper)` reading `readahead` bytes ahead (0: none).
    fn cursor_with(&self, lower: Vec<u8>, upper: Option<Vec<u8>>, readahead: usize) -> Cursor<'_> {
        let mut opts = ReadOptions::default();
        let empty = upper.as_ref().is_some_and(|u| *u <= lower);
        opts.set_iterate_lower_bound(lower);
        if let Some(u) = upper {
            opts.set_iterate_upper_bound(u);
        }
        if readahead > 0 {
            opts.set_readahead_size(readahead);
        }
        let cf = self.cf();
        let mut iter = self.db().raw_iterator_cf_opt(&cf, opts);
        if !empty {
            iter.seek_to_first();
        }
        Cursor { store: self, iter, started: false, empty }
    }

    /// Delete every entry of the key groups `key_groups` (a range tombstone: cheap whatever
    /// the amount of data; the space is reclaimed by compaction).
    pub fn delete_range(&self, key_groups: Range<u32>) -> Result<(), StateError> {
        let (lower, upper) = key::key_group_bounds(&key_groups);
        if upper <= lower {
            return Ok(());
        }
        let cf = self.cf();
        self.db().delete_range_cf_opt(&cf, lower, upper, &self.write_opts).map_err(self.io("delete_range"))
    }

    /// Flush this operator's memtable in this shard to an SST file, and wait. Frees the
    /// memtable's memory; not needed for durability of checkpoints (they flush themselves).
    pub fn flush(&self) -> Result<(), StateError> {
        let cf = self.cf();
        self.db().flush_cf(&cf).map_err(self.io("flush"))
    }

    /// Write a RocksDB checkpoint of this store's whole shard (every operator's column
    /// family in it) to `dir`, which must not exist and should be on the state dir's file
    /// system: SST files are hard links, so a checkpoint costs a flush and some metadata.
    /// Open it again by placing it at [`super::shard_dir`] of a state dir.
    pub fn checkpoint(&self, dir: &Path) -> Result<(), StateError> {
        checkpoint_shard(&self.shard, dir)
    }
}

/// Puts and deletes of one [`Store`], committed with one RocksDB `WriteBatch` write:
/// atomically, and at the cost of one write instead of one per entry. A batch lands in one
/// memtable whole, so keep batches to about a megabyte.
pub struct Batch<'s> {
    store: &'s Store,
    cf: Arc<BoundColumnFamily<'s>>,
    batch: WriteBatch,
    key: Vec<u8>,
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch").field("store", self.store).field("entries", &self.len()).finish()
    }
}

impl Batch<'_> {
    /// Set `(key_group, key, namespace)` to `value`.
    pub fn put(&mut self, key_group: u16, key: &[u8], namespace: &[u8], value: &[u8]) {
        key::encode_key(key_group, key, namespace, &mut self.key);
        self.batch.put_cf(&self.cf, &self.key, value);
    }

    /// Add a merge operand to `(key_group, key, namespace)`: a blind write, folded with
    /// the value and the other operands by the column family's merge operator (given at
    /// [`StateBackend::open_with`](super::StateBackend::open_with)) when read or compacted.
    pub fn merge(&mut self, key_group: u16, key: &[u8], namespace: &[u8], operand: &[u8]) {
        key::encode_key(key_group, key, namespace, &mut self.key);
        self.batch.merge_cf(&self.cf, &self.key, operand);
    }

    /// Delete `(key_group, key, namespace)`.
    pub fn delete(&mut self, key_group: u16, key: &[u8], namespace: &[u8]) {
        key::encode_key(key_group, key, namespace, &mut self.key);
        self.batch.delete_cf(&self.cf, &self.key);
    }

    /// Delete every entry of the keys from `(key_group, key)` up to `to` (exclusive; `None`:
    /// to the end of key group `end_key_group - 1`), every namespace: one range tombstone.
    /// Keys order by key group, then length, then bytes ([`super::key`]).
    pub fn delete_keys(&mut self, key_group: u16, key: &[u8], to: Option<(u16, &[u8])>, end_key_group: u32) {
        let mut lower = Vec::new();
        key::encode_key_prefix(key_group, key, &mut lower);
        let upper = match to {
            Some((kg, k)) => {
                let mut u = Vec::new();
                key::encode_key_prefix(kg, k, &mut u);
                u
            }
            None => key::key_group_bounds(&(0..end_key_group)).1,
        };
        if lower < upper {
            self.batch.delete_range_cf(&self.cf, lower, upper);
        }
    }

    /// Entries (puts and deletes) in the batch.
    pub fn len(&self) -> usize {
        self.batch.len()
    }

    /// Whether the batch holds nothing.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// The batch's encoded size: what it adds to a memtable.
    pub fn size_bytes(&self) -> usize {
        self.batch.size_in_bytes()
    }

    /// Write the batch, all or nothing.
    pub fn commit(self) -> Result<(), StateError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let store = self.store;
        store.db().write_opt(self.batch, &store.write_opts).map_err(store.io("write batch"))
    }
}

/// One entry seen by a [`Cursor`], borrowing the cursor's current position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The key group.
    pub key_group: u16,
    /// The key's bytes.
    pub key: &'a [u8],
    /// The namespace's bytes.
    pub namespace: &'a [u8],
    /// The value.
    pub value: &'a [u8],
}

/// A scan in key order over a consistent snapshot (see [`Store::scan`]). Not an `Iterator`:
/// each entry borrows RocksDB's buffers until the next call, which saves a copy per entry.
///
/// ```ignore
/// let mut c = store.scan(info.key_groups());
/// while let Some(e) = c.next()? { /* e.key_group, e.key, e.namespace, e.value */ }
/// ```
pub struct Cursor<'s> {
    store: &'s Store,
    iter: DBRawIteratorWithThreadMode<'s, Db>,
    started: bool,
    empty: bool,
}

impl fmt::Debug for Cursor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cursor").field("store", self.store).field("started", &self.started).finish()
    }
}

impl Cursor<'_> {
    /// The next entry, or `None` at the end of the range.
    #[allow(clippy::should_implement_trait)] // a lending cursor cannot be an Iterator
    pub fn next(&mut self) -> Result<Option<Entry<'_>>, StateError> {
        if self.empty {
            return Ok(None);
        }
        if self.started {
            self.iter.next();
        }
        self.started = true;
        if !self.iter.valid() {
            self.iter.status().map_err(self.store.io("scan"))?;
            return Ok(None);
        }
        let (k, value) = self.iter.item().expect("valid iterator has an item");
        let Some(KeyParts { key_group, key, namespace }) = key::decode_key(k) else {
            return Err(StateError::Corrupt {
                operator: self.store.operator.clone(),
                len: k.len(),
                problem: "shorter than its key length field says",
            });
        };
        Ok(Some(Entry { key_group, key, namespace, value }))
    }

    /// Visit every remaining entry; returns how many.
    pub fn for_each(mut self, mut f: impl FnMut(Entry<'_>)) -> Result<u64, StateError> {
        let mut n = 0;
        while let Some(e) = self.next()? {
            f(e);
            n += 1;
        }
        Ok(n)
    }
}
