//! State backend micro-benchmark: operations per second through a `Store` and a `WriteBackCache`
//! on one RocksDB shard (64 MiB block cache, 32 MiB memtables, WAL off — the defaults).
//!
//! - **store batch put**: 8-byte keys, 16-byte values, 1,000 per WriteBatch, random order;
//! - **store get, present / absent**: random gets of written keys (from the block cache and
//!   memtable) and of keys never written (answered by bloom filters);
//! - **store scan**: all entries of all key groups, in key order;
//! - **cache update, hot**: count+sum updates over 10,000 keys that all fit in the cache —
//!   what a window operator pays per record when its state is hot;
//! - **cache update, cold**: the same over 1,000,000 keys through a 50,000-entry cache: most
//!   updates miss, load from RocksDB and evict in batches.
//!
//! Each reports operations/s (wall) and per CPU-second (getrusage of the process, RocksDB's
//! background flushes and compactions included). Used by `cargo bench --bench
//! state` and `weir-bench state` / `all`.

use crate::measure::Cost;
use crate::report::{Row, Section};
use serde_json::json;
use weir::state::{CacheKey, CacheValue, StateBackend, StateConfig, WriteBackCache};

fn measure(name: &'static str, ops: u64, f: impl FnOnce()) -> Outcome {
    let ((), cost) = crate::measure::measure(f);
    Outcome { name, ops, cost }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key(u64);
impl CacheKey for Key {
    fn key_group(&self) -> u16 {
        (mix(self.0) % 128) as u16
    }
    fn encode(&self, key: &mut Vec<u8>, namespace: &mut Vec<u8>) {
        key.extend_from_slice(&self.0.to_be_bytes());
        namespace.extend_from_slice(&1_000u64.to_be_bytes());
    }
}

#[derive(Default)]
struct Agg {
    count: u64,
    sum: u64,
}
impl CacheValue for Agg {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.sum.to_le_bytes());
    }
    fn decode(b: &[u8]) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let b: &[u8; 16] = b.try_into().map_err(|_| "want 16 bytes".to_string())?;
        Ok(Agg {
            count: u64::from_le_bytes(b[..8].try_into().unwrap()),
            sum: u64::from_le_bytes(b[8..].try_into().unwrap()),
        })
    }
}

/// One measured workload.
#[derive(Debug)]
pub struct Outcome {
    /// Workload name.
    pub name: &'static str,
    /// Operations.
    pub ops: u64,
    /// What it cost.
    pub cost: Cost,
}

/// Run every workload on a fresh RocksDB shard under the temp dir; returns the outcomes and
/// the JSON `cargo bench --bench state` writes (config, budget, results).
pub fn run_all(smoke: bool) -> (Vec<Outcome>, serde_json::Value) {
    let n: u64 = if smoke { 20_000 } else { 1_000_000 };
    let hot_updates: u64 = if smoke { 100_000 } else { 10_000_000 };
    let dir = std::env::temp_dir().join(format!("weir-bench-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = StateConfig::new(&dir, 1);
    let backend = StateBackend::open(config.clone()).expect("open state");
    let mut store = backend.store("bench", 0).expect("store");
    let key = |i: u64| {
        let k = mix(i);
        ((k % 128) as u16, k.to_be_bytes())
    };
    let mut outcomes = Vec::new();

    outcomes.push(measure("store batch put (1,000 per batch)", n, || {
        let mut batch = store.batch();
        for i in 0..n {
            let (kg, k) = key(i);
            batch.put(kg, &k, b"", &[i as u8; 16]);
            if batch.len() == 1000 {
                batch.commit().unwrap();
                batch = store.batch();
            }
        }
        batch.commit().unwrap();
    }));
    let mut buf = Vec::new();
    outcomes.push(measure("store get, present", n, || {
        for i in 0..n {
            let (kg, k) = key(mix(i ^ 0xABCD) % n);
            assert!(store.get_into(kg, &k, b"", &mut buf).unwrap());
        }
    }));
    outcomes.push(measure("store get, absent", n, || {
        for i in 0..n {
            let (kg, k) = key(n + i);
            assert!(!store.get_into(kg, &k, b"", &mut buf).unwrap());
        }
    }));
    outcomes.push(measure("store scan", n, || {
        assert_eq!(store.scan(0..65536).for_each(|_| ()).unwrap(), n);
    }));

    let mut hot: WriteBackCache<Key, Agg> = WriteBackCache::new(20_000);
    let mut hot_store = backend.store("bench-hot", 0).expect("store");
    outcomes.push(measure("cache update, hot (10,000 keys)", hot_updates, || {
        for i in 0..hot_updates {
            let k = Key(mix(i) % 10_000);
            hot.update(&mut hot_store, &k, Agg::default, |a| {
                a.count += 1;
                a.sum += i
            })
            .unwrap();
        }
        hot.flush(&mut hot_store).unwrap();
    }));
    let mut cold: WriteBackCache<Key, Agg> = WriteBackCache::new(50_000);
    let mut cold_store = backend.store("bench-cold", 0).expect("store");
    outcomes.push(measure("cache update, cold (1 M keys, 50,000 cached)", n, || {
        for i in 0..n {
            let k = Key(mix(i) % n);
            cold.update(&mut cold_store, &k, Agg::default, |a| {
                a.count += 1;
                a.sum += i
            })
            .unwrap();
        }
        cold.flush(&mut cold_store).unwrap();
    }));
    let cold_stats = cold.stats();

    let report = json!({
        "benchmark": "state",
        "environment": crate::environment(),
        "config": {
            "shards": config.shards,
            "block_cache_bytes": config.block_cache_bytes,
            "memtable_bytes": config.memtable_bytes,
            "wal": config.wal,
        },
        "budget": backend.budget_parts(),
        "cold_cache": format!("{cold_stats:?}"),
        "results": outcomes.iter().map(|o| json!({
            "workload": o.name,
            "ops": o.ops,
            "wall_s": o.cost.wall_s,
            "cpu_s": o.cost.cpu_s,
            "ops_per_s": o.cost.per_s(o.ops),
            "ops_per_cpu_s": o.cost.per_cpu_s(o.ops),
        })).collect::<Vec<_>>(),
    });
    drop((store, hot_store, cold_store, backend));
    let _ = std::fs::remove_dir_all(&dir);
    (outcomes, report)
}

/// The markdown table `cargo bench --bench state` prints.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s =
        String::from("| workload | ops | wall s | ops/s | CPU s | ops per CPU-second |\n|---|---|---|---|---|---|\n");
    for o in outcomes {
        s.push_str(&format!(
            "| {} | {} | {:.3} | {:.2} M | {:.3} | {:.2} M |\n",
            o.name,
            o.ops,
            o.cost.wall_s,
            o.cost.per_s(o.ops) / 1e6,
            o.cost.cpu_s,
            o.cost.per_cpu_s(o.ops) / 1e6
        ));
    }
    s
}

/// The report section: operations/s and per CPU-second of each workload.
pub fn section(smoke: bool) -> Section {
    let (outcomes, report) = run_all(smoke);
    let mut s = Section::new("state", "State backend: one RocksDB shard and the write-back cache (micro)");
    for o in &outcomes {
        s.rows.push(Row::new(format!("{}: ops/s", o.name), o.cost.per_s(o.ops) / 1e6, "M ops/s"));
        s.rows.push(Row::new(format!("{}: ops per CPU-second", o.name), o.cost.per_cpu_s(o.ops) / 1e6, "M ops/CPU-s"));
    }
    s.setup = json!({ "config": report["config"], "budget": report["budget"], "cold_cache": report["cold_cache"] });
    s.details = report["results"].clone();
    s
}
