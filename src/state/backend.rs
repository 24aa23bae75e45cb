//! The shards: one RocksDB instance per core, sharing one block cache and one write buffer
//! manager, so that RocksDB's memory has one bound however many shards a job opens.

use super::error::StateError;
use super::store::Store;
use super::{MergeOperators, ValueMerge};
use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, DBCompressionType, LogLevel, MultiThreaded, Options,
    WriteBufferManager,
};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The RocksDB type of a shard: column families created and looked up through `&self`, so a
/// shard can be shared by the subtasks pinned to its core while operators add their column
/// families.
pub(crate) type Db = rocksdb::DBWithThreadMode<MultiThreaded>;

/// How the state backend is laid out and bounded. Every limit here is in the budget
/// ([`StateBackend::budget_parts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// The job's state directory; shard `i` lives in `dir/shard-<i>` ([`shard_dir`]).
    pub dir: PathBuf,
    /// Shards: one per core the job's keyed subtasks use.
    pub shards: usize,
    /// The one LRU block cache shared by all shards: data blocks, and index and filter blocks
    /// (which are cached, not held by table readers, so they are bounded too).
    pub block_cache_bytes: usize,
    /// The cap on all memtables of all shards: each column family's memtables are sized so
    /// that all of them, full at once, fit (see [`StateBackend::store`]), and the shared
    /// write buffer manager flushes early once memtables pass 7/8 of it. Capped on its own,
    /// not charged to the block cache: two separate bounds are easy to check against
    /// RocksDB's own counters, and a write burst cannot evict the whole read cache.
    pub memtable_bytes: usize,
    /// The largest memtable of one column family (smaller when many share the cap).
    pub write_buffer_bytes_max: usize,
    /// Memtables per column family: the active one plus those waiting for flush. When all
    /// are full, that column family's writes wait for its own flush.
    pub max_write_buffers: i32,
    /// Open SST files per shard (table readers outside the cache are per open file).
    pub max_open_files: i32,
    /// Write RocksDB's write-ahead log. Off by default: checkpoints give durability, and a
    /// restart restores the last checkpoint rather than replaying a log.
    pub wal: bool,
    /// Background flush and compaction threads (one process-wide pool, shared by all shards).
    pub background_jobs: i32,
    /// Size of an SST data block (uncompressed).
    pub block_bytes: usize,
    /// Column families of keyed state whose entries may expire ([`super::KeyedState`]'s
    /// handles with a time to live): their compaction drops what has expired.
    pub expiring: Vec<String>,
}

impl StateConfig {
    /// Defaults for a state dir and a shard count: 64 MiB block cache, 32 MiB of memtables,
    /// WAL off.
    pub fn new(dir: impl Into<PathBuf>, shards: usize) -> StateConfig {
        StateConfig {
            dir: dir.into(),
            shards,
            block_cache_bytes: 64 << 20,
            memtable_bytes: 32 << 20,
            write_buffer_bytes_max: 8 << 20,
            max_write_buffers: 2,
            max_open_files: 256,
            wal: false,
            background_jobs: 2,
            block_bytes: 4 << 10,
            expiring: Vec::new(),
        }
    }
}

/// Where shard `index` of a state dir lives: `dir/shard-<index>`. A checkpoint of a shard
/// ([`Store::checkpoint`]) is a complete RocksDB directory; put it here to restore it.
pub fn shard_dir(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("shard-{index}"))
}

/// The smallest memtable a column family gets however many share the cap: smaller ones
/// would flush uselessly small files. With so many column families that they get this
/// size, the memtable part of the budget grows past `memtable_bytes` (and says so).
pub const WRITE_BUFFER_BYTES_MIN: usize = 256 << 10;
/// Memory of a table reader outside the block cache, per open SST file (table properties,
/// the reader object; index and filter blocks are in the cache). tests/state_memory.rs
/// measures about 1.4 KiB per file by `rocksdb.estimate-table-readers-mem`; rounded up to
/// cover what that estimate leaves out (the file handle, allocator rounding).
pub const TABLE_READER_BYTES: u64 = 4 << 10;
/// A shard's own memory besides caches and memtables: the DB object, version set, column
/// family data, the info log's buffer, thread-local state. tests/state_memory.rs measures
/// about 0.5 MiB per shard from RSS when opening 8 shards; doubled.
pub const SHARD_OVERHEAD_BYTES: u64 = 1 << 20;
/// Buffers of one running flush or compaction: the output file's write buffer
/// (`writable_file_max_buffer_size`, set to 1 MiB), the block being built and the input
/// blocks, which compactions read without caching.
pub const BACKGROUND_JOB_BYTES: u64 = 4 << 20;
/// The largest write batch the budget assumes, and the most [`super::WriteBackCache`]
/// sends in one: a batch lands in one memtable whole (the memtable is switched before the
/// next write, not in the middle of one), so a memtable can pass its size by one batch.
pub const WRITE_BATCH_BYTES_MAX: usize = 256 << 10;

/// Put `merge` on column family options (under a name RocksDB records in its OPTIONS file).
pub(crate) fn set_merge(o: &mut Options, merge: &ValueMerge) {
    let merge = merge.clone();
    o.set_merge_operator_associative("weir-fold", move |_key: &[u8], existing, operands: &rocksdb::MergeOperands| {
        merge(existing, &mut operands.iter())
    });
}

/// One shard: a RocksDB instance and its directory.
pub(crate) struct Shard {
    pub(crate) index: usize,
    pub(crate) path: PathBuf,
    pub(crate) db: Db,
    /// The options of the column families made while the shard is open: RocksDB keeps raw
    /// pointers into what they own (a compaction filter), which the `rocksdb` crate keeps
    /// alive only for column families opened with the database. Dropped after `db`
    /// (declared after it).
    made_with: Mutex<Vec<Options>>,
}

impl fmt::Debug for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard").field("index", &self.index).field("path", &self.path).finish()
    }
}

/// Column families known across all shards, to size write buffers (see `store`).
#[derive(Debug, Default)]
struct Families {
    /// `(shard, operator)` of every column family created or opened (default excluded).
    all: Vec<(usize, String)>,
    /// The memtable size now given to each column family.
    write_buffer_bytes: usize,
    /// The memtable size now given to each cache copy's column family.
    copy_write_buffer_bytes: usize,
}

/// The state of a job: one RocksDB shard per core under the job's state directory, one shared
/// block cache and one write buffer manager.
///
/// Contract: memory is bounded by [`StateBackend::memory_budget_bytes`] (block cache,
/// memtables, table readers, per-shard and background overhead), however many shards and
/// operators there are; each operator's data is its own column family in each shard; keys
/// are laid out as in [`super::key`], so a key group is a contiguous range.
pub struct StateBackend {
    config: StateConfig,
    cache: Cache,
    write_buffer_manager: WriteBufferManager,
    shards: Vec<Arc<Shard>>,
    families: Mutex<Families>,
    merges: MergeOperators,
}

impl fmt::Debug for StateBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateBackend")
            .field("config", &self.config)
            .field("block_cache_usage_bytes", &self.cache.get_usage())
            .field("memtable_usage_bytes", &self.write_buffer_manager.get_usage())
            .field("families", &self.families)
            .finish()
    }
}

impl StateBackend {
    /// Open (or create) the shards of `config.dir`, with the column families they already
    /// hold (e.g. a restored checkpoint).
    pub fn open(config: StateConfig) -> Result<StateBackend, StateError> {
        StateBackend::open_with(config, MergeOperators::new())
    }

    /// Open as [`StateBackend::open`], with the merge operators of the column families
    /// whose operators write merge operands ([`Batch::merge`](super::Batch::merge)).
    pub fn open_with(config: StateConfig, merges: MergeOperators) -> Result<StateBackend, StateError> {
        if config.shards == 0 {
            return Err(StateError::Config("shards is 0; a keyed job needs at least one shard".into()));
        }
        if config.max_write_buffers < 2 {
            return Err(StateError::Config(format!(
                "max_write_buffers {} must be at least 2 (one to write while one flushes)",
                config.max_write_buffers
            )));
        }
        let min = WRITE_BUFFER_BYTES_MIN * config.max_write_buffers as usize;
        if config.memtable_bytes < min || config.write_buffer_bytes_max < WRITE_BUFFER_BYTES_MIN {
            return Err(StateError::Config(format!(
                "memtable_bytes {} must be at least {min} (max_write_buffers x 256 KiB), write_buffer_bytes_max {} \
                 at least 256 KiB",
                config.memtable_bytes, config.write_buffer_bytes_max
            )));
        }
        let cache = Cache::new_lru_cache(config.block_cache_bytes);
        // No stalling: a stall waits for memory that *any* shard frees, and a shard nobody
        // writes never flushes, so idle memtables could stall every writer for good. The cap
        // holds without it (see `store`); the manager only makes flushes start early.
        let write_buffer_manager = WriteBufferManager::new_write_buffer_manager(config.memtable_bytes, false);
        let mut backend = StateBackend {
            families: Mutex::new(Families {
                all: Vec::new(),
                write_buffer_bytes: WRITE_BUFFER_BYTES_MIN,
                copy_write_buffer_bytes: WRITE_BUFFER_BYTES_MIN,
            }),
            config,
            cache,
            write_buffer_manager,
            shards: Vec::new(),
            merges,
        };
        for index in 0..backend.config.shards {
            let shard = backend.open_shard(index)?;
            backend.shards.push(Arc::new(shard));
        }
        // Existing column families count towards the write buffer sizing like new ones.
        backend.resize_write_buffers(&mut backend.families.lock().unwrap_or_else(|e| e.into_inner()))?;
        Ok(backend)
    }

    fn open_shard(&self, index: usize) -> Result<Shard, StateError> {
        let path = shard_dir(&self.config.dir, index);
        let open_err =
            |source: Box<dyn std::error::Error + Send + Sync>| StateError::Open { path: path.clone(), source };
        // Damage RocksDB finds is told apart from the causes `Open` names.
        let rocks_err = |e: rocksdb::Error| {
            if e.kind() == rocksdb::ErrorKind::Corruption {
                StateError::Damaged { shard: index, path: path.clone(), source: e }
            } else {
                open_err(e.into())
            }
        };
        std::fs::create_dir_all(&path).map_err(|e| open_err(e.into()))?;
        // Every column family opens at the smallest memtable and is then resized with the
        // others (resize_write_buffers): a memtable sizes its bloom filter when it is made,
        // so one made larger than the column family's share would outlive the resize.
        let opts = self.options(WRITE_BUFFER_BYTES_MIN);
        let existing = if path.join("CURRENT").exists() {
            Db::list_cf(&opts, &path).map_err(rocks_err)?
        } else {
            vec![rocksdb::DEFAULT_COLUMN_FAMILY_NAME.to_string()]
        };
        let descriptors: Vec<_> = existing
            .iter()
            .map(|name| {
                let mut o = self.family_options(name, WRITE_BUFFER_BYTES_MIN);
                if name == rocksdb::DEFAULT_COLUMN_FAMILY_NAME {
                    // Never written: without a bloom filter its empty memtable allocates nothing.
                    o.set_memtable_prefix_bloom_ratio(0.0);
                }
                rocksdb::ColumnFamilyDescriptor::new(name, o)
            })
            .collect();
        let db = Db::open_cf_descriptors(&opts, &path, descriptors).map_err(rocks_err)?;
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        for name in existing.into_iter().filter(|n| n != rocksdb::DEFAULT_COLUMN_FAMILY_NAME) {
            families.all.push((index, name));
        }
        Ok(Shard { index, path, db, made_with: Mutex::new(Vec::new()) })
    }

    /// The options of column family `name`: [`options`](Self::options) and its merge
    /// operator, if its operator has one.
    fn family_options(&self, name: &str, write_buffer_bytes: usize) -> Options {
        let mut o = self.options(write_buffer_bytes);
        if let Some(merge) = self.merges.get(name) {
            set_merge(&mut o, merge);
            // A merge operator is a merging window's: its column family holds runs (see
            // `window::runs`), values of KiBs each that are read back and replaced within
            // about a window. In the SST files every compaction would rewrite them; as blob
            // files (RocksDB's BlobDB) they are written once, at flush, and compactions move
            // only their keys and references. Measured on the 10^6-key, 10x-cache row of
            // `weir-bench window`: RocksDB CPU 0.6 -> 0.5 s, peak RSS 83 -> 50 MiB (run values
            // no longer pass through the block cache), records per CPU-second +5 %.
            // A blob file goes when none of its runs is referenced any more. No garbage
            // collection: the run store replaces every run within `window::runs::MAX_RUN_AGE`
            // flushes itself, and RocksDB's relocation of the live runs in the oldest files
            // mostly rewrote runs about to be replaced (see there).
            o.set_enable_blob_files(true);
            o.set_min_blob_size(RUN_BLOB_BYTES_MIN);
            o.set_blob_file_size(64 << 20);
            o.set_enable_blob_gc(false);
        }
        if super::is_cache_copy_family(name) {
            // A checkpoint rewrites most of the copy, a dozen or more memtables in a burst
            // whose keys span the whole copy: merging L0 files four at a time (the default)
            // would rewrite all of L1 several times per checkpoint. Merge them sixteen at a
            // time, with the write slowdown and stop triggers moved up to match.
            o.set_level_zero_file_num_compaction_trigger(16);
            o.set_level_zero_slowdown_writes_trigger(32);
            o.set_level_zero_stop_writes_trigger(48);
        }
        if self.config.expiring.iter().any(|n| n == name) {
            o.set_compaction_filter("weir-ttl", |_level: u32, key: &[u8], value: &[u8]| {
                if super::keyed::expired(key, value, super::keyed::wall_clock_ns()) {
                    rocksdb::CompactionDecision::Remove
                } else {
                    rocksdb::CompactionDecision::Keep
                }
            });
        }
        o
    }

    /// DB and column family options: every memory-relevant setting is here.
    fn options(&self, write_buffer_bytes: usize) -> Options {
        let c = &self.config;
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&self.cache);
        table.set_block_size(c.block_bytes);
        // Index and filter blocks in the cache, not held by table readers: otherwise they
        // grow with the data, outside any bound. High priority so data blocks go first.
        table.set_cache_index_and_filter_blocks(true);
        table.set_cache_index_and_filter_blocks_with_high_priority(true);
        // L0 files are read on every get; keeping their index and filter pinned avoids
        // reloading them. They are few (compaction keeps L0 short) and count in the cache.
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        // Partitioned index and filters: with index and filters in a bounded cache, a get
        // must not need a whole file's index (hundreds of KiB for a large file) in memory;
        // it loads one small partition, found through a top-level index kept pinned (a few
        // KiB per file, counted in the cache).
        table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4 << 10);
        table.set_pin_top_level_index_and_filter(true);
        // Gets of absent keys are common (a new key, a new window): a bloom filter answers
        // them without reading data blocks. Whole-key, about 1 % false positives.
        table.set_bloom_filter(10.0, false);
        table.set_optimize_filters_for_memory(true);
        table.set_format_version(6);

        let mut o = Options::default();
        o.create_if_missing(true);
        o.create_missing_column_families(true);
        o.set_block_based_table_factory(&table);
        o.set_write_buffer_manager(&self.write_buffer_manager);
        o.set_write_buffer_size(write_buffer_bytes);
        // The arena grows in blocks of this size, and the manager counts whole blocks: small
        // and fixed, so that a memtable passes its size by at most one block, also after a
        // resize.
        o.set_arena_block_size(ARENA_BLOCK_BYTES);
        o.set_max_write_buffer_number(c.max_write_buffers);
        // Most gets are for keys not in the memtable (they were flushed, or never written):
        // a small bloom filter per memtable (2 % of it, in its arena, so counted) spares
        // them the skip-list search, which profiling showed was a fifth of a get.
        o.set_memtable_whole_key_filtering(true);
        o.set_memtable_prefix_bloom_ratio(1.0 / MEMTABLE_BLOOM_PER_BYTES as f64);
        o.set_max_open_files(c.max_open_files);
        o.set_max_background_jobs(c.background_jobs);
        o.set_max_subcompactions(1);
        o.set_writable_file_max_buffer_size(1 << 20);
        // Compactions read their inputs with this much readahead per input file (RocksDB's
        // default is 2 MiB, times every L0 file and overlapping L1 file of a compaction).
        o.set_compaction_readahead_size(256 << 10);
        // Hot levels uncompressed (they are rewritten soon), lz4 below.
        o.set_compression_per_level(&[
            DBCompressionType::None,
            DBCompressionType::None,
            DBCompressionType::Lz4,
            DBCompressionType::Lz4,
            DBCompressionType::Lz4,
            DBCompressionType::Lz4,
            DBCompressionType::Lz4,
        ]);
        // The WAL, when on, is bounded too: past this it forces flushes of old memtables.
        o.set_max_total_wal_size((c.memtable_bytes as u64 / c.shards as u64).max(4 << 20));
        // A quiet info log that cannot fill the disk; no in-memory stats history.
        o.set_log_level(LogLevel::Warn);
        o.set_keep_log_file_num(2);
        o.set_max_log_file_size(4 << 20);
        o.set_stats_dump_period_sec(0);
        o.set_stats_persist_period_sec(0);
        o
    }

    /// The handle through which subtask(s) of `operator` on shard `shard` read and write
    /// their state: the operator's column family in that shard, created if new. Several
    /// subtasks pinned to one core share a shard; each takes its own `Store`.
    ///
    /// Adding a column family lowers every column family's memtable size to
    /// `memtable_bytes / (max_write_buffers × column families)` (within
    /// [`WRITE_BUFFER_BYTES_MIN`]..=`write_buffer_bytes_max`), so that all memtables of all
    /// shards, every one full, fit in `memtable_bytes`. That makes the cap hard without any
    /// wait across shards: a column family with all its memtables full waits for its own
    /// flush only. Take the stores before reading the budget: its memtable part counts the
    /// column families that exist.
    ///
    /// Panics if `shard >= shards` (a programmer error).
    pub fn store(&self, operator: &str, shard: usize) -> Result<Store, StateError> {
        assert!(shard < self.shards.len(), "state shard {shard} of {}", self.shards.len());
        let s = &self.shards[shard];
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        if s.db.cf_handle(operator).is_none() {
            // Made at the smallest memtable, then resized with all the others.
            let options = self.family_options(operator, WRITE_BUFFER_BYTES_MIN);
            s.db.create_cf(operator, &options).map_err(|source| StateError::ColumnFamily {
                operator: operator.into(),
                path: s.path.clone(),
                source,
            })?;
            s.made_with.lock().unwrap_or_else(|e| e.into_inner()).push(options);
            families.all.push((shard, operator.to_string()));
            self.resize_write_buffers(&mut families)?;
        }
        drop(families);
        Ok(Store::new(s.clone(), operator.to_string(), self.config.wal))
    }

    /// Recompute the per-column-family memtable size for the families now known, apply it to
    /// the existing ones.
    fn resize_write_buffers(&self, families: &mut Families) -> Result<(), StateError> {
        // Cache copies (written once per checkpoint, only what changed) are sure of the
        // smallest memtable; the others share the rest, each up to its largest size, and the
        // copies take what that leaves of the cap (up to the same largest size). A small
        // memtable flushes a checkpoint's copy writes as hundreds of tiny files: at 10^7
        // keys (a 10^6-key cache) their flushes and compactions stalled writes for 70 % of
        // the run.
        let copies = families.all.iter().filter(|(_, n)| super::is_cache_copy_family(n)).count();
        let n = (families.all.len() - copies).max(1);
        let per_family = self.config.max_write_buffers as usize;
        let rest = self.config.memtable_bytes.saturating_sub(copies * per_family * WRITE_BUFFER_BYTES_MIN);
        let fair = rest / (per_family * n);
        let wb = fair.clamp(WRITE_BUFFER_BYTES_MIN, self.config.write_buffer_bytes_max);
        let spare = self.config.memtable_bytes.saturating_sub(n * per_family * wb);
        let copy_wb = (spare / (per_family * copies.max(1)))
            .clamp(WRITE_BUFFER_BYTES_MIN, self.config.write_buffer_bytes_max.max(WRITE_BUFFER_BYTES_MIN));
        families.write_buffer_bytes = wb;
        families.copy_write_buffer_bytes = copy_wb;
        for (shard, name) in &families.all {
            let s = &self.shards[*shard];
            let size = if super::is_cache_copy_family(name) { copy_wb } else { wb };
            let wb_s = size.to_string();
            if let Some(cf) = s.db.cf_handle(name) {
                s.db.set_options_cf(&cf, &[("write_buffer_size", &wb_s)]).map_err(|source| {
                    StateError::ColumnFamily { operator: name.clone(), path: s.path.clone(), source }
                })?;
            }
        }
        Ok(())
    }

    /// The memtable size each column family has now (see [`StateBackend::store`]).
    pub fn write_buffer_bytes(&self) -> usize {
        self.families.lock().unwrap_or_else(|e| e.into_inner()).write_buffer_bytes
    }

    /// The configuration.
    pub fn config(&self) -> &StateConfig {
        &self.config
    }

    /// Shards opened.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The bound on RocksDB's memory that these settings imply, as `(owner, bytes)` parts in
    /// the engine's budget style (see [`crate::telemetry::Budget`]).
    ///
    /// Not included: a [`super::WriteBackCache`] (its owner counts it, see
    /// [`super::WriteBackCache::bound_bytes`]), open [`super::Cursor`]s (each pins the
    /// memtables and files it reads until dropped), and the allocator's own slack.
    pub fn budget_parts(&self) -> Vec<(String, u64)> {
        let c = &self.config;
        let shards = self.shards.len() as u64;
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let (wb, copy_wb) = (families.write_buffer_bytes as u64, families.copy_write_buffer_bytes as u64);
        // Every memtable full, each past its size by its bloom filter, an arena block and one
        // write batch.
        let copies = families.all.iter().filter(|(_, n)| super::is_cache_copy_family(n)).count() as u64;
        let n = families.all.len() as u64 - copies;
        let per_memtable =
            |wb: u64| wb + wb / MEMTABLE_BLOOM_PER_BYTES + (ARENA_BLOCK_BYTES + WRITE_BATCH_BYTES_MAX) as u64;
        let memtables = (
            format!(
                "rocksdb memtables: {n} column families x {} x ({} memtable + bloom + arena block + write batch){}, \
                 flushed early at 7/8 of {}",
                c.max_write_buffers,
                crate::telemetry::bytes(wb),
                if copies > 0 {
                    format!(" + {copies} cache copies x {} x {}", c.max_write_buffers, crate::telemetry::bytes(copy_wb))
                } else {
                    String::new()
                },
                crate::telemetry::bytes(c.memtable_bytes as u64)
            ),
            c.max_write_buffers as u64 * (n * per_memtable(wb) + copies * per_memtable(copy_wb)),
        );
        vec![
            (format!("rocksdb block cache (shared by {shards} shards)"), c.block_cache_bytes as u64),
            memtables,
            (
                format!("rocksdb table readers: {shards} shards x {} open files", c.max_open_files),
                shards * c.max_open_files.max(0) as u64 * TABLE_READER_BYTES,
            ),
            (format!("rocksdb shards: {shards} x fixed overhead"), shards * SHARD_OVERHEAD_BYTES),
            (
                format!("rocksdb background jobs: {}", c.background_jobs),
                c.background_jobs.max(0) as u64 * BACKGROUND_JOB_BYTES,
            ),
        ]
    }

    /// The sum of [`StateBackend::budget_parts`].
    pub fn memory_budget_bytes(&self) -> u64 {
        self.budget_parts().iter().map(|(_, b)| b).sum()
    }

    /// What RocksDB reports it uses now, by its own counters, for checking against the budget.
    pub fn usage(&self) -> Usage {
        let mut u = Usage {
            block_cache_bytes: self.cache.get_usage() as u64,
            block_cache_pinned_bytes: self.cache.get_pinned_usage() as u64,
            write_buffer_manager_bytes: self.write_buffer_manager.get_usage() as u64,
            ..Usage::default()
        };
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        for (shard, name) in &families.all {
            let db = &self.shards[*shard].db;
            if let Some(cf) = db.cf_handle(name) {
                let prop = |p| db.property_int_value_cf(&cf, p).ok().flatten().unwrap_or(0);
                u.memtable_bytes += prop(rocksdb::properties::SIZE_ALL_MEM_TABLES);
                u.table_readers_bytes += prop(rocksdb::properties::ESTIMATE_TABLE_READERS_MEM);
            }
        }
        u
    }

    /// Flush every shard's memtables to SST files (all column families), and wait.
    pub fn flush_all(&self) -> Result<(), StateError> {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner()).all.clone();
        for (shard, name) in &families {
            let s = &self.shards[*shard];
            if let Some(cf) = s.db.cf_handle(name) {
                s.db.flush_cf(&cf).map_err(|source| StateError::Io {
                    op: "flush",
                    operator: name.clone(),
                    shard: s.index,
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// Write a RocksDB checkpoint of shard `shard` (all its column families) to `dir`, which
    /// must not exist: SST files are hard-linked, memtables flushed first. See
    /// [`Store::checkpoint`].
    pub fn checkpoint(&self, shard: usize, dir: &Path) -> Result<(), StateError> {
        assert!(shard < self.shards.len(), "state shard {shard} of {}", self.shards.len());
        checkpoint_shard(&self.shards[shard], dir)
    }
}

/// A RocksDB checkpoint of one shard (see `StateBackend::checkpoint`).
pub(crate) fn checkpoint_shard(shard: &Shard, dir: &Path) -> Result<(), StateError> {
    let err = |source| StateError::Checkpoint { shard: shard.index, dir: dir.to_path_buf(), source };
    // create_checkpoint flushes the memtables first (its log size trigger is 0), so the
    // checkpoint holds everything written, WAL or not.
    rocksdb::checkpoint::Checkpoint::new(&shard.db).map_err(err)?.create_checkpoint(dir).map_err(err)
}

/// RocksDB's memory by its own counters ([`StateBackend::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The shared block cache's usage (`rocksdb.block-cache-usage`: data, index, filter).
    pub block_cache_bytes: u64,
    /// Of which pinned (L0 index and filter, blocks held by open iterators).
    pub block_cache_pinned_bytes: u64,
    /// The write buffer manager's count: all memtables' arenas of all shards.
    pub write_buffer_manager_bytes: u64,
    /// `rocksdb.size-all-mem-tables`, summed over shards and column families.
    pub memtable_bytes: u64,
    /// `rocksdb.estimate-table-readers-mem`, summed: table readers outside the cache.
    pub table_readers_bytes: u64,
}

/// The memtable arena's block size. RocksDB's default is an eighth of the memtable, up to
/// 1 MiB; a fixed small one keeps the overshoot small and independent of resizes.
/// Allocations over a quarter block (a large memtable's bloom filter) get blocks of their
/// own size.
const ARENA_BLOCK_BYTES: usize = 64 << 10;
/// The smallest value a merging window's column family keeps in a blob file rather than in
/// its tables: a run of a few dozen windows (smaller runs stay inline).
const RUN_BLOB_BYTES_MIN: u64 = 1 << 10;
/// A memtable's bloom filter is this many times smaller than the memtable (2 %).
const MEMTABLE_BLOOM_PER_BYTES: u64 = 50;

/// One piece of a shard to restore: the RocksDB checkpoint at `snapshot`, whose column
/// family `operator` is the truth for the key groups `key_groups`.
#[derive(Debug, Clone)]
pub struct RestorePart {
    /// A RocksDB checkpoint directory (of some shard).
    pub snapshot: PathBuf,
    /// The column family (operator node id).
    pub operator: String,
    /// The key groups to take from it.
    pub key_groups: std::ops::Range<u32>,
}

/// Rebuild shard `index` of the state dir `dir` from checkpoint snapshots, replacing what is
/// there (the live shard is ahead of the checkpoint and never trusted). The first part's
/// snapshot becomes the shard (SST files hard-linked, the rest copied: RocksDB appends to
/// its MANIFEST, which must not change the snapshot), and everything in it that no part takes
/// from it is removed by range deletes (other subtasks' key groups, which other shards now
/// own or other snapshots hold the truth for); every other part's key groups are then
/// copied from its own snapshot, opened read-only. So a shard holds exactly its subtasks'
/// key groups, at any parallelism the checkpoint was taken with.
///
/// `merges` are the job's merge operators: a snapshot's column family may hold operands,
/// which the copy reads folded.
pub fn restore_shard(
    dir: &Path,
    index: usize,
    parts: &[RestorePart],
    merges: &MergeOperators,
) -> Result<(), StateError> {
    let live = shard_dir(dir, index);
    fn fail<E: std::error::Error + Send + Sync + 'static>(
        what: &'static str,
        p: &Path,
    ) -> impl FnOnce(E) -> StateError {
        move |e| StateError::Restore { what, path: p.to_owned(), source: Box::new(e) }
    }
    match std::fs::remove_dir_all(&live) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail("cannot remove the live shard", &live)(e)),
    }
    let Some(base) = parts.first() else { return Ok(()) };
    std::fs::create_dir_all(&live).map_err(fail("cannot create", &live))?;
    for entry in std::fs::read_dir(&base.snapshot).map_err(fail("cannot read", &base.snapshot))? {
        let entry = entry.map_err(fail("cannot read", &base.snapshot))?;
        let (src, dst) = (entry.path(), live.join(entry.file_name()));
        // Table and blob files are immutable: linked, not copied (a copy where linking fails).
        let immutable = src.extension().is_some_and(|x| x == "sst" || x == "blob");
        let linked = immutable && std::fs::hard_link(&src, &dst).is_ok();
        if !linked {
            std::fs::copy(&src, &dst).map_err(fail("cannot copy", &src))?;
        }
    }
    let rest: Vec<&RestorePart> = parts[1..].iter().filter(|p| p.snapshot != base.snapshot).collect();
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // Open without reading the tables (no table readers preloaded, no statistics gathered
    // from them): the restore only writes range deletes and copies on top, and a corrupt
    // SST is then met when the operator reads it, with the key group named.
    opts.set_max_open_files(64);
    opts.set_skip_stats_update_on_db_open(true);
    let family = |name: &str| {
        let mut o = opts.clone();
        if let Some(merge) = merges.get(name) {
            set_merge(&mut o, merge);
        }
        o
    };
    let cfs = Db::list_cf(&opts, &live).map_err(fail("cannot list column families of", &live))?;
    let descriptors = cfs.iter().map(|n| rocksdb::ColumnFamilyDescriptor::new(n, family(n)));
    let db = Db::open_cf_descriptors(&opts, &live, descriptors).map_err(fail("cannot open", &live))?;
    for name in &cfs {
        let Some(cf) = db.cf_handle(name) else { continue };
        let mut kept: Vec<std::ops::Range<u32>> = parts
            .iter()
            .filter(|p| p.snapshot == base.snapshot && &p.operator == name)
            .map(|p| p.key_groups.clone())
            .collect();
        kept.sort_by_key(|r| r.start);
        let mut from = 0;
        for gap in kept.iter().map(|k| k.start..k.end).chain(std::iter::once(super::key::KEY_GROUPS_MAX..u32::MAX)) {
            if from < gap.start {
                let (lower, upper) = super::key::key_group_bounds(&(from..gap.start));
                db.delete_range_cf(&cf, &lower, &upper).map_err(fail("cannot delete a range in", &live))?;
            }
            from = from.max(gap.end);
        }
    }
    for part in rest {
        if db.cf_handle(&part.operator).is_none() {
            db.create_cf(&part.operator, &family(&part.operator))
                .map_err(fail("cannot create a column family in", &live))?;
        }
        let cf = db.cf_handle(&part.operator).expect("created");
        let (lower, upper) = super::key::key_group_bounds(&part.key_groups);
        db.delete_range_cf(&cf, &lower, &upper).map_err(fail("cannot delete a range in", &live))?;
        let snap_cfs = Db::list_cf(&opts, &part.snapshot).map_err(fail("cannot open", &part.snapshot))?;
        if !snap_cfs.contains(&part.operator) {
            continue;
        }
        let snap_descriptors = snap_cfs.iter().map(|n| rocksdb::ColumnFamilyDescriptor::new(n, family(n)));
        let snap = Db::open_cf_descriptors_read_only(&Options::default(), &part.snapshot, snap_descriptors, false)
            .map_err(fail("cannot open", &part.snapshot))?;
        let scf = snap.cf_handle(&part.operator).expect("listed");
        let mut read = rocksdb::ReadOptions::default();
        read.set_iterate_upper_bound(upper.clone());
        let mut batch = rocksdb::WriteBatch::default();
        for item in snap.iterator_cf_opt(&scf, read, rocksdb::IteratorMode::From(&lower, rocksdb::Direction::Forward)) {
            let (k, v) = item.map_err(fail("cannot read", &part.snapshot))?;
            batch.put_cf(&cf, k, v);
            if batch.size_in_bytes() >= WRITE_BATCH_BYTES_MAX {
                db.write(std::mem::take(&mut batch)).map_err(fail("cannot write", &live))?;
            }
        }
        db.write(batch).map_err(fail("cannot write", &live))?;
        db.flush_cf(&cf).map_err(fail("cannot flush", &live))?;
    }
    Ok(())
}
