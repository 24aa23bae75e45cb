//! "RocksDB memory bound holds with many shards" — alone in this file so that it runs in a
//! process of its own: its RSS measurement must not see other tests' memory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::ring::process::rss_bytes;
use weir::state::{StateBackend, StateConfig, Usage};
use weir::telemetry::bytes;

const SHARDS: usize = 8;
const CACHE_BYTES: usize = 8 << 20;
const MEMTABLE_BYTES: usize = 8 << 20;
const VALUE_BYTES: usize = 1024;
/// 25 MiB of values per shard, 200 MiB in all: 25× the cache and memtables together.
const ENTRIES_PER_SHARD: u64 = 25 * 1024;
const READS_PER_SHARD: u64 = 20_000;
/// Slack on the block cache's own counter: the LRU cache is not strict (a block being read
/// is inserted before older ones are evicted, and pinned L0 index/filter blocks and blocks
/// held by a read in flight cannot be evicted), so its usage can pass its capacity by about
/// a block per reading thread plus the pinned blocks. 1 MiB covers 8 threads × 16 KiB
/// blocks with room for the pinned ones.
const CACHE_SLACK_BYTES: u64 = 1 << 20;
/// What RSS may grow beyond the backend's declared budget: the allocator's own slack, which
/// no RocksDB setting bounds. glibc malloc gives each allocating thread its own arena (up to
/// 8 per core) and an arena keeps freed memory for its next allocations; here memtable
/// chunks and cache blocks are allocated by 8 writer threads and RocksDB's background
/// threads and freed by others, so each arena holds its own high-water mark of that churn.
/// Measured on the 2-core development machine: RSS growth 27–31 MiB with MALLOC_ARENA_MAX=1
/// or 2, 48–55 MiB with glibc's default, against a 48.5 MiB budget. Allowance: half the
/// budget.
fn rss_allowance_bytes(budget: u64) -> u64 {
    budget / 2
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The value of a key: 1 KiB of splitmix64 output seeded by the key — incompressible, so
/// lz4 does not shrink the test's data volume, and checkable on read.
fn value_of(key: u64, out: &mut Vec<u8>) {
    out.clear();
    let mut s = key;
    while out.len() < VALUE_BYTES {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
}

/// The key of entry `i` of shard `shard`: spread over key groups, scrambled so that writes
/// are not in key order.
fn key_of(shard: usize, i: u64) -> (u16, u64) {
    let k = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ shard as u64) | 1;
    ((k % 128) as u16, k)
}

#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    usage: Usage,
    rss_bytes: u64,
}

fn sample(backend: &StateBackend, peaks: &Mutex<Peaks>) {
    let u = backend.usage();
    let rss = rss_bytes().unwrap_or(0);
    let mut p = peaks.lock().unwrap();
    p.usage.block_cache_bytes = p.usage.block_cache_bytes.max(u.block_cache_bytes);
    p.usage.block_cache_pinned_bytes = p.usage.block_cache_pinned_bytes.max(u.block_cache_pinned_bytes);
    p.usage.write_buffer_manager_bytes = p.usage.write_buffer_manager_bytes.max(u.write_buffer_manager_bytes);
    p.usage.memtable_bytes = p.usage.memtable_bytes.max(u.memtable_bytes);
    p.usage.table_readers_bytes = p.usage.table_readers_bytes.max(u.table_readers_bytes);
    p.rss_bytes = p.rss_bytes.max(rss);
}

/// Eight shards share an 8 MiB block cache and an 8 MiB write buffer manager; eight writer
/// threads (one per shard, as subtasks would be) write 200 MiB of 1 KiB values, then read
/// 160,000 of them at random, checking each. A monitor samples RocksDB's own counters and
/// RSS throughout. Proves: the block cache stays within its capacity (+ documented slack),
/// all memtables within the memtable part of the budget, table readers within theirs, and
/// RSS growth within the backend's declared budget plus a documented allocator allowance.
#[test]
fn rocksdb_memory_bound_holds_with_many_shards() {
    let tmp = TempDir(std::env::temp_dir().join(format!("weir-state-memory-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&tmp.0);
    let rss_before = rss_bytes().expect("VmRSS in /proc/self/status");

    let mut config = StateConfig::new(Path::new(&tmp.0), SHARDS);
    config.block_cache_bytes = CACHE_BYTES;
    config.memtable_bytes = MEMTABLE_BYTES;
    let backend = Arc::new(StateBackend::open(config).unwrap());
    let stores: Vec<_> = (0..SHARDS).map(|s| backend.store("window-1", s).unwrap()).collect();
    let rss_opened = rss_bytes().unwrap();
    let budget = backend.memory_budget_bytes();
    let parts = backend.budget_parts();

    let peaks = Arc::new(Mutex::new(Peaks::default()));
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (backend, peaks, done) = (backend.clone(), peaks.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                sample(&backend, &peaks);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    let writers: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(shard, mut store)| {
            std::thread::spawn(move || {
                let mut value = Vec::with_capacity(VALUE_BYTES);
                let mut batch = store.batch();
                for i in 0..ENTRIES_PER_SHARD {
                    let (kg, k) = key_of(shard, i);
                    value_of(k, &mut value);
                    batch.put(kg, &k.to_be_bytes(), b"w", &value);
                    // 128 KiB batches: a write batch lands in one memtable whole.
                    if batch.len() == 128 {
                        batch.commit().unwrap();
                        batch = store.batch();
                    }
                }
                batch.commit().unwrap();
                let (mut got, mut want) = (Vec::new(), Vec::new());
                let mut r = shard as u64 + 1;
                for _ in 0..READS_PER_SHARD {
                    r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let (kg, k) = key_of(shard, (r >> 33) % ENTRIES_PER_SHARD);
                    assert!(store.get_into(kg, &k.to_be_bytes(), b"w", &mut got).unwrap(), "shard {shard} key {k}");
                    value_of(k, &mut want);
                    assert!(got == want, "shard {shard} key {k}: wrong value");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    sample(&backend, &peaks);
    done.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    let p = *peaks.lock().unwrap();
    let sst_files = (0..SHARDS)
        .flat_map(|i| std::fs::read_dir(weir::state::shard_dir(&tmp.0, i)).unwrap())
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "sst"))
        .count();
    let readers_now = backend.usage().table_readers_bytes;
    let rss_growth = p.rss_bytes.saturating_sub(rss_before);

    let part = |prefix: &str| parts.iter().find(|(o, _)| o.starts_with(prefix)).map(|(_, b)| *b).unwrap();
    let memtable_part = part("rocksdb memtables");
    let readers_part = part("rocksdb table readers");
    println!("budget: {} total", bytes(budget));
    for (owner, b) in &parts {
        println!("  {owner}: {b} ({})", bytes(*b));
    }
    println!(
        "peaks: block cache {} (pinned {}) of {}; memtables: manager {} / size-all-mem-tables {} of {}; \
         table readers {} of {} (now {} B for {} SST files); RSS {} -> {} after open (shards' overhead {}), peak {} (growth {} of \
         budget {} + allowance {})",
        bytes(p.usage.block_cache_bytes),
        bytes(p.usage.block_cache_pinned_bytes),
        bytes(CACHE_BYTES as u64),
        bytes(p.usage.write_buffer_manager_bytes),
        bytes(p.usage.memtable_bytes),
        bytes(memtable_part),
        bytes(p.usage.table_readers_bytes),
        bytes(readers_part),
        readers_now,
        sst_files,
        bytes(rss_before),
        bytes(rss_opened),
        bytes(rss_opened.saturating_sub(rss_before)),
        bytes(p.rss_bytes),
        bytes(rss_growth),
        bytes(budget),
        bytes(rss_allowance_bytes(budget)),
    );

    assert!(
        p.usage.block_cache_bytes <= CACHE_BYTES as u64 + CACHE_SLACK_BYTES,
        "block cache usage {} over capacity {} + slack",
        p.usage.block_cache_bytes,
        CACHE_BYTES
    );
    assert!(
        p.usage.write_buffer_manager_bytes <= memtable_part,
        "write buffer manager {} > {memtable_part}",
        p.usage.write_buffer_manager_bytes
    );
    assert!(p.usage.memtable_bytes <= memtable_part, "memtables {} > {memtable_part}", p.usage.memtable_bytes);
    assert!(
        p.usage.table_readers_bytes <= readers_part,
        "table readers {} > {readers_part}",
        p.usage.table_readers_bytes
    );
    assert!(
        rss_growth <= budget + rss_allowance_bytes(budget),
        "RSS grew {} over budget {} + allowance {}",
        bytes(rss_growth),
        bytes(budget),
        bytes(rss_allowance_bytes(budget))
    );
    drop(backend);
}
