//! Keyed state: one RocksDB instance per core (a *shard*), one column family per operator,
//! keys that start with their key group.
//!
//! What it guarantees:
//! - **One memory bound for all shards.** Every shard uses the same LRU block cache and the
//!   same write buffer manager, and table readers keep their index and filter blocks in that
//!   cache, so RocksDB's memory is bounded by [`StateBackend::memory_budget_bytes`] however
//!   many shards and operators a job has. The bound is a sum of named parts, printed with
//!   the job's budget.
//! - **A key group is a contiguous range.** Keys are `[key group u16 BE][key length u32 BE]
//!   [key][namespace]` ([`key`]), so one key group's state can be scanned, deleted, or moved
//!   to another shard as a unit when parallelism changes.
//! - **Batched writes.** A [`Batch`] commits many puts and deletes in one RocksDB write; a
//!   [`WriteBackCache`] keeps hot typed state in memory, bounded, and writes it back in
//!   batches when it evicts and when flushed.
//! - **Checkpoints are cheap.** [`Store::checkpoint`] writes a RocksDB checkpoint of a shard:
//!   a flush, then hard links to the SST files.
//!
//! What it does not: durability between checkpoints. The WAL is off by default
//! ([`StateConfig::wal`]); a crash loses what was written since the last checkpoint, and a
//! restart restores that checkpoint.
//!
//! ```text
//!  state dir/                     StateBackend ── Cache (LRU, shared) ── WriteBufferManager (shared)
//!    shard-0/  RocksDB  ─┬─ cf "window-1" ◄── Store (subtask window-1#0, pinned to core 0)
//!              (core 0)  └─ cf "window-2" ◄── Store (subtask window-2#0, core 0)
//!    shard-1/  RocksDB  ─┬─ cf "window-1" ◄── Store (subtask window-1#1, core 1)
//!              (core 1)  └─ cf "window-2" ◄── Store (subtask window-2#1, core 1)
//! ```
//!
//! A `Store` is a subtask's handle: one operator's column family in one shard, at the byte
//! level. Typed state and its in-memory cache are the operator's, above it — or, for user
//! operators, [`KeyedState`]'s value, list and map handles.

#[cfg(feature = "rocksdb")]
mod backend;
#[cfg(feature = "rocksdb")]
mod cache;
mod error;
pub mod key;
mod keyed;
mod parts;
#[cfg(feature = "rocksdb")]
mod store;

#[cfg(feature = "rocksdb")]
pub use backend::{
    BACKGROUND_JOB_BYTES, RestorePart, SHARD_OVERHEAD_BYTES, StateBackend, StateConfig, TABLE_READER_BYTES, Usage,
    WRITE_BATCH_BYTES_MAX, WRITE_BUFFER_BYTES_MIN, restore_shard, shard_dir,
};
#[cfg(feature = "rocksdb")]
pub use cache::{CacheKey, CacheStats, CacheValue, WriteBackCache};
pub use error::StateError;
pub(crate) use keyed::{Checkpointed, list_merge};
pub use keyed::{KeyedState, ListState, MapState, ValueState};
pub use parts::{PartError, StatePart, check_part};
/// Without the `rocksdb` feature there are no shards, so no store exists: the type keeps the
/// one name the checkpoint code matches on ([`Checkpointed`]'s shard case), and no value of
/// it can be made.
#[cfg(not(feature = "rocksdb"))]
#[derive(Debug)]
pub(crate) enum Store {}

#[cfg(not(feature = "rocksdb"))]
impl Store {
    /// Unreachable: no store exists in this build.
    pub(crate) fn checkpoint(&self, _dir: &std::path::Path) -> Result<(), StateError> {
        match *self {}
    }
}

#[cfg(feature = "rocksdb")]
pub use store::{Batch, Cursor, Entry, Store};

/// How one operator's merge operands combine: the existing value (if any) and the operands,
/// oldest first, folded into one value; `None` when a value or operand is not one this
/// operator wrote (RocksDB then fails the read or compaction with a corruption error).
/// Associative: RocksDB also folds runs of operands without the value.
pub type ValueMerge =
    std::sync::Arc<dyn Fn(Option<&[u8]>, &mut dyn Iterator<Item = &[u8]>) -> Option<Vec<u8>> + Send + Sync>;

/// The merge operator of each operator (column family) that writes merge operands. Given
/// when the backend opens: a column family restored from a checkpoint may hold operands,
/// and RocksDB needs the operator before its first read or compaction.
pub type MergeOperators = std::collections::HashMap<String, ValueMerge>;

/// The column family in which operator `node` keeps a copy of its cache between
/// checkpoints (beside its own, `node`), restored with it.
pub fn cache_copy_family(node: &str) -> String {
    format!("{node}{CACHE_COPY_SUFFIX}")
}

const CACHE_COPY_SUFFIX: &str = "/cache";

/// Whether column family `name` is a cache copy ([`cache_copy_family`]): written only at
/// checkpoints, it gets the smallest memtable.
pub fn is_cache_copy_family(name: &str) -> bool {
    name.ends_with(CACHE_COPY_SUFFIX)
}
