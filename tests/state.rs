//! The state backend (src/state/): round trips, key-group ranges, delete_range, checkpoints,
//! the write-back cache, and a million keys. The memory bound is tested on its own, in its
//! own process, in tests/state_memory.rs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use weir::state::{CacheKey, CacheValue, StateBackend, StateConfig, Store, WriteBackCache, key, shard_dir};

/// A temp dir under std::env::temp_dir() named with the test and the pid, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("weir-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small deterministic PRNG (splitmix64), so every run writes the same data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn small_config(dir: &Path, shards: usize) -> StateConfig {
    let mut c = StateConfig::new(dir, shards);
    c.block_cache_bytes = 8 << 20;
    c.memtable_bytes = 8 << 20;
    c
}

/// Writes read back as written: single puts, batches, deletes, absent keys, across two
/// operators that share a shard without seeing each other's keys.
#[test]
fn round_trip() {
    let tmp = TempDir::new("roundtrip");
    let backend = StateBackend::open(small_config(tmp.path(), 2)).unwrap();
    let mut a = backend.store("win-a", 0).unwrap();
    let mut b = backend.store("win-b", 0).unwrap();
    assert_eq!(a.get(1, b"k", b"w").unwrap(), None);
    a.put(1, b"k", b"w", b"va").unwrap();
    b.put(1, b"k", b"w", b"vb").unwrap();
    assert_eq!(a.get(1, b"k", b"w").unwrap().as_deref(), Some(&b"va"[..]));
    assert_eq!(b.get(1, b"k", b"w").unwrap().as_deref(), Some(&b"vb"[..]));
    // Same key, other namespace / key group / shard: distinct entries.
    assert_eq!(a.get(1, b"k", b"x").unwrap(), None);
    assert_eq!(a.get(2, b"k", b"w").unwrap(), None);
    let mut a1 = backend.store("win-a", 1).unwrap();
    assert_eq!(a1.get(1, b"k", b"w").unwrap(), None);

    let mut batch = a.batch();
    for i in 0u32..100 {
        batch.put(7, &i.to_be_bytes(), b"", &(i * 3).to_le_bytes());
    }
    batch.delete(1, b"k", b"w");
    assert_eq!(batch.len(), 101);
    batch.commit().unwrap();
    let mut buf = Vec::new();
    for i in 0u32..100 {
        assert!(a.get_into(7, &i.to_be_bytes(), b"", &mut buf).unwrap());
        assert_eq!(buf, (i * 3).to_le_bytes());
    }
    assert!(!a.get_into(1, b"k", b"w", &mut buf).unwrap());
    assert!(buf.is_empty());
    a.delete(7, &5u32.to_be_bytes(), b"").unwrap();
    assert_eq!(a.get(7, &5u32.to_be_bytes(), b"").unwrap(), None);
    // Flushed to SST files, the data reads the same.
    a.flush().unwrap();
    assert!(a.get_into(7, &6u32.to_be_bytes(), b"", &mut buf).unwrap());
    assert_eq!(buf, 18u32.to_le_bytes());
    assert_eq!(backend.budget_parts().len(), 5);
}

/// An entry as `(key group, key, namespace, value)`.
type Owned = (u16, Vec<u8>, Vec<u8>, Vec<u8>);

fn model_entries(rng: &mut Rng, n: usize) -> BTreeMap<Vec<u8>, Owned> {
    let mut m = BTreeMap::new();
    let mut enc = Vec::new();
    for _ in 0..n {
        // Few key groups, including the first and last, keys of varying length (so that
        // length-prefixing matters) and namespaces.
        let kg = [0u16, 1, 2, 5, 6, 200, 65534, 65535][(rng.next() % 8) as usize];
        let klen = (rng.next() % 5) as usize;
        let k: Vec<u8> = (0..klen).map(|_| (rng.next() % 3) as u8).collect();
        let ns: Vec<u8> = (0..(rng.next() % 3)).map(|_| (rng.next() % 256) as u8).collect();
        let v = rng.next().to_le_bytes().to_vec();
        key::encode_key(kg, &k, &ns, &mut enc);
        m.insert(enc.clone(), (kg, k, ns, v));
    }
    m
}

fn scan_all(store: &Store, range: std::ops::Range<u32>) -> Vec<Owned> {
    let mut out = Vec::new();
    store
        .scan(range)
        .for_each(|e| out.push((e.key_group, e.key.to_vec(), e.namespace.to_vec(), e.value.to_vec())))
        .unwrap();
    out
}

/// Scanning a key-group range returns exactly the entries of those key groups, in key order
/// (key group, then key length, then key, then namespace), checked against a BTreeMap model
/// of the encoded keys, for many ranges including ones that end at 65536. Scanning a key
/// returns exactly its namespaces.
#[test]
fn key_group_ranges_are_contiguous_and_exact() {
    let tmp = TempDir::new("order");
    let backend = StateBackend::open(small_config(tmp.path(), 1)).unwrap();
    let mut store = backend.store("op", 0).unwrap();
    let model = model_entries(&mut Rng(7), 3000);
    let mut batch = store.batch();
    for (kg, k, ns, v) in model.values() {
        batch.put(*kg, k, ns, v);
    }
    batch.commit().unwrap();
    // Half the data in SST files, half in the memtable: scans merge both.
    store.flush().unwrap();
    store.put(6, b"late", b"", b"x").unwrap();
    let mut model = model;
    let mut enc = Vec::new();
    key::encode_key(6, b"late", b"", &mut enc);
    model.insert(enc, (6, b"late".to_vec(), vec![], b"x".to_vec()));

    let all = scan_all(&store, 0..65536);
    let expect: Vec<_> = model.values().cloned().collect();
    assert_eq!(all, expect, "a full scan is the model in encoded order");
    assert!(all.windows(2).all(|w| w[0].0 <= w[1].0), "key groups never interleave");
    for range in [0..1, 1..3, 2..6, 3..5, 5..7, 6..201, 0..65535, 65534..65536, 65535..65536, 300..65534, 4..4] {
        let got = scan_all(&store, range.clone());
        let want: Vec<_> = model.values().filter(|e| range.contains(&(e.0 as u32))).cloned().collect();
        assert_eq!(got, want, "key groups {range:?}");
    }
    // One key's namespaces, and nothing of keys it prefixes ([0] vs [0, 0]).
    for (kg, k) in [(5u16, vec![0u8]), (0, vec![]), (65535, vec![1, 2])] {
        let mut got = Vec::new();
        store.scan_key(kg, &k).for_each(|e| got.push((e.key_group, e.key.to_vec(), e.namespace.to_vec()))).unwrap();
        let want: Vec<_> =
            model.values().filter(|e| e.0 == kg && e.1 == k).map(|e| (e.0, e.1.clone(), e.2.clone())).collect();
        assert_eq!(got, want, "key {k:?} of key group {kg}");
    }
}

/// delete_range removes exactly a key-group range (including one ending at 65536), whether
/// the data is in SST files or the memtable; other key groups and operators are untouched.
#[test]
fn delete_range_removes_exactly_the_key_groups() {
    let tmp = TempDir::new("delrange");
    let backend = StateBackend::open(small_config(tmp.path(), 1)).unwrap();
    let mut store = backend.store("op", 0).unwrap();
    let mut other = backend.store("other", 0).unwrap();
    let model = model_entries(&mut Rng(11), 2000);
    let mut batch = store.batch();
    for (kg, k, ns, v) in model.values() {
        batch.put(*kg, k, ns, v);
    }
    batch.commit().unwrap();
    other.put(2, b"k", b"", b"kept").unwrap();
    store.flush().unwrap();
    store.put(200, b"mem", b"", b"in the memtable").unwrap();

    store.delete_range(2..6).unwrap();
    store.delete_range(100..201).unwrap();
    store.delete_range(65535..65536).unwrap();
    store.delete_range(9..9).unwrap();
    let deleted = |kg: u16| (2..6).contains(&kg) || (100..201).contains(&kg) || kg == 65535;
    let want: Vec<_> = model.values().filter(|e| !deleted(e.0)).cloned().collect();
    assert!(!want.is_empty() && want.len() < model.len());
    assert_eq!(scan_all(&store, 0..65536), want);
    assert_eq!(store.get(200, b"mem", b"").unwrap(), None);
    assert_eq!(other.get(2, b"k", b"").unwrap().as_deref(), Some(&b"kept"[..]));
    // Writes after a range delete are visible again.
    store.put(3, b"new", b"", b"v").unwrap();
    assert_eq!(store.get(3, b"new", b"").unwrap().as_deref(), Some(&b"v"[..]));
}

/// A checkpoint of a shard (WAL off, data partly only in memtables) opens as the shard of a
/// new state dir with the same data in every operator's column family; writes after the
/// checkpoint are not in it.
#[test]
fn checkpoint_then_reopen_reads_the_same() {
    let tmp = TempDir::new("checkpoint");
    let cp = tmp.path().join("chk-1");
    let mut model = BTreeMap::new();
    {
        let backend = StateBackend::open(small_config(&tmp.path().join("job"), 2)).unwrap();
        let mut a = backend.store("win-a", 1).unwrap();
        let mut b = backend.store("win-b", 1).unwrap();
        let mut rng = Rng(3);
        for i in 0u64..5000 {
            let kg = (i % 128) as u16;
            let v = rng.next().to_le_bytes();
            a.put(kg, &i.to_be_bytes(), b"w1", &v).unwrap();
            model.insert(("win-a", kg, i), v);
            if i % 3 == 0 {
                b.put(kg, &i.to_be_bytes(), b"", &v).unwrap();
                model.insert(("win-b", kg, i), v);
            }
            if i == 2500 {
                a.flush().unwrap();
            }
        }
        a.checkpoint(&cp).unwrap();
        a.put(0, b"after", b"", b"not in the checkpoint").unwrap();
        // A second checkpoint to the same place is refused with a message saying why.
        let e = a.checkpoint(&cp).unwrap_err().to_string();
        assert!(e.contains("must not exist"), "{e}");
    }
    let restored = tmp.path().join("restored");
    std::fs::create_dir_all(&restored).unwrap();
    std::fs::rename(&cp, shard_dir(&restored, 0)).unwrap();
    let backend = StateBackend::open(small_config(&restored, 1)).unwrap();
    let mut a = backend.store("win-a", 0).unwrap();
    let mut b = backend.store("win-b", 0).unwrap();
    for ((op, kg, i), v) in &model {
        let s = if *op == "win-a" { &mut a } else { &mut b };
        let ns: &[u8] = if *op == "win-a" { b"w1" } else { b"" };
        assert_eq!(s.get(*kg, &i.to_be_bytes(), ns).unwrap().as_deref(), Some(&v[..]), "{op} {i}");
    }
    assert_eq!(a.scan(0..65536).for_each(|_| ()).unwrap(), 5000);
    assert_eq!(b.scan(0..65536).for_each(|_| ()).unwrap(), 1667);
    assert_eq!(a.get(0, b"after", b"").unwrap(), None);
}

/// A shard directory in use by another backend is refused, and the message says what to do.
#[test]
fn a_shard_in_use_is_refused_with_advice() {
    let tmp = TempDir::new("locked");
    let _first = StateBackend::open(small_config(tmp.path(), 1)).unwrap();
    let e = StateBackend::open(small_config(tmp.path(), 1)).unwrap_err().to_string();
    assert!(e.contains("cannot open state shard") && e.contains("another job"), "{e}");
}

/// Each column family added shrinks every memtable so that all of them, full at once, fit
/// in the memtable cap — until memtables reach WRITE_BUFFER_BYTES_MIN, past which the
/// budget's memtable part grows beyond the cap, as it must to stay a bound.
/// A window's copy of its cache (written only at checkpoints) is sure of the smallest
/// memtable, taken from the cap (not a fair share like an operator's), and gets more only
/// from what the operators' memtables leave of the cap; the budget counts it.
#[test]
fn cache_copies_get_the_smallest_memtable() {
    let tmp = TempDir::new("copies");
    let backend = StateBackend::open(small_config(tmp.path(), 1)).unwrap();
    let memtable_part = |b: &StateBackend| b.budget_parts().into_iter().find(|(o, _)| o.contains("memtables")).unwrap();
    backend.store("count", 0).unwrap();
    let (wb, before) = (backend.write_buffer_bytes(), memtable_part(&backend).1);
    backend.store(&weir::state::cache_copy_family("count"), 0).unwrap();
    let min = weir::state::WRITE_BUFFER_BYTES_MIN;
    let now = backend.write_buffer_bytes();
    assert!(now < wb && now >= wb - min, "the operator's memtable gives up the copy's share only: {wb} -> {now}");
    let (text, after) = memtable_part(&backend);
    assert!(text.contains("1 cache copies"), "{text}");
    assert!(after > before && after - before < 2 * before, "{before} -> {after}");
}

#[test]
fn memtables_shrink_as_operators_are_added() {
    let tmp = TempDir::new("many-ops");
    let backend = StateBackend::open(small_config(tmp.path(), 2)).unwrap();
    let cap = backend.config().memtable_bytes;
    let memtable_part =
        |b: &StateBackend| b.budget_parts().into_iter().find(|(o, _)| o.contains("memtables")).unwrap().1;
    let mut last = usize::MAX;
    let mut n = 0;
    // 8 MiB / (2 memtables x 16 column families) = 256 KiB, the minimum.
    for op in 0..8 {
        for shard in 0..2 {
            backend.store(&format!("op-{op}"), shard).unwrap();
            n += 1;
            let wb = backend.write_buffer_bytes();
            assert!(wb <= last && n * 2 * wb <= cap, "{n} column families get {wb} B memtables");
            assert!(memtable_part(&backend) >= (n * 2 * wb) as u64);
            last = wb;
        }
    }
    assert_eq!(backend.write_buffer_bytes(), weir::state::WRITE_BUFFER_BYTES_MIN);
    let before = memtable_part(&backend);
    backend.store("op-8", 0).unwrap();
    assert_eq!(backend.write_buffer_bytes(), weir::state::WRITE_BUFFER_BYTES_MIN);
    assert!(17 * 2 * weir::state::WRITE_BUFFER_BYTES_MIN > cap);
    assert!(memtable_part(&backend) > before);
    // Every store still works, and taking a store twice reuses the column family.
    let mut s = backend.store("op-3", 1).unwrap();
    s.put(1, b"k", b"", b"v").unwrap();
    assert_eq!(backend.store("op-3", 1).unwrap().get(1, b"k", b"").unwrap().as_deref(), Some(&b"v"[..]));
}

/// Idle memtables cannot stall writers forever: eight shards each hold a partly filled
/// memtable that nobody writes again, and one shard then writes 6× the memtable cap. No
/// writer ever waits on another shard's flush (the write buffer manager does not stall;
/// see StateBackend::open), so this completes. A watchdog turns a stall into a failure.
#[test]
fn idle_memtables_cannot_stall_writers_forever() {
    let tmp = TempDir::new("idle-stall");
    let backend = std::sync::Arc::new(StateBackend::open(small_config(tmp.path(), 8)).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let b = backend.clone();
    let writer = std::thread::spawn(move || {
        let value = [7u8; 1000];
        // 8 MiB / (2 x 8) = 512 KiB memtables; 400 KiB each stays below the switch.
        for shard in 0..8 {
            let s = b.store("op", shard).unwrap();
            let mut batch = s.batch();
            for i in 0u32..400 {
                batch.put(0, &i.to_be_bytes(), b"", &value);
            }
            batch.commit().unwrap();
        }
        let s = b.store("op", 0).unwrap();
        for round in 0u32..48 {
            let mut batch = s.batch();
            for i in 0u32..1000 {
                batch.put(1, &(round * 1000 + i).to_be_bytes(), b"", &value);
            }
            batch.commit().unwrap();
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(300))
        .expect("writers stalled for 5 minutes: a write waited on memtables nobody flushes");
    // The writer's handles go before the directory does: a shard still open when the
    // directory is removed would write its files into it again, and they would be left.
    writer.join().expect("the writer ends");
    let mut s = backend.store("op", 0).unwrap();
    assert!(s.get(1, &47_999u32.to_be_bytes(), b"").unwrap().is_some());
}

/// A key: user id in a key group, and a window end as the namespace.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct WinKey {
    kg: u16,
    user: u64,
    window_end: u64,
}

impl CacheKey for WinKey {
    fn key_group(&self) -> u16 {
        self.kg
    }
    fn encode(&self, key: &mut Vec<u8>, namespace: &mut Vec<u8>) {
        key.extend_from_slice(&self.user.to_be_bytes());
        namespace.extend_from_slice(&self.window_end.to_be_bytes());
    }
}

/// A count and sum.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
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
        let b: &[u8; 16] = b.try_into().map_err(|_| format!("{} bytes, want 16", b.len()))?;
        Ok(Agg {
            count: u64::from_le_bytes(b[..8].try_into().unwrap()),
            sum: u64::from_le_bytes(b[8..].try_into().unwrap()),
        })
    }
}

fn win_key(user: u64) -> WinKey {
    WinKey { kg: (user % 128) as u16, user, window_end: 1000 + user % 3 }
}

/// The write-back cache against a BTreeMap model: random updates, inserts, removes and
/// gets over 5× more keys than the cache holds, flushes in between; every read agrees with
/// the model, the cache never holds more than its capacity, and after a final flush the
/// store holds exactly the model.
#[test]
fn write_back_cache_matches_a_model() {
    let tmp = TempDir::new("cache-model");
    let backend = StateBackend::open(small_config(tmp.path(), 1)).unwrap();
    let mut store = backend.store("op", 0).unwrap();
    let mut cache: WriteBackCache<WinKey, Agg> = WriteBackCache::new(200);
    let mut model: BTreeMap<u64, Agg> = BTreeMap::new();
    let mut rng = Rng(42);
    for step in 0..50_000u64 {
        let user = rng.next() % 1000;
        let k = win_key(user);
        match rng.next() % 10 {
            0..=4 => {
                let add = rng.next() % 100;
                cache
                    .update(&mut store, &k, Agg::default, |a| {
                        a.count += 1;
                        a.sum += add
                    })
                    .unwrap();
                let m = model.entry(user).or_default();
                m.count += 1;
                m.sum += add;
            }
            5 => {
                let v = Agg { count: step, sum: user };
                cache.insert(&mut store, k, v).unwrap();
                model.insert(user, v);
            }
            6 => {
                cache.remove(&mut store, &k).unwrap();
                model.remove(&user);
            }
            7 => {
                if let Some(v) = cache.get_mut(&mut store, &k).unwrap() {
                    v.sum += 1;
                }
                if let Some(m) = model.get_mut(&user) {
                    m.sum += 1;
                }
            }
            _ => assert_eq!(cache.get(&mut store, &k).unwrap().copied(), model.get(&user).copied(), "step {step}"),
        }
        assert!(cache.len() <= 200);
        if step % 9973 == 0 {
            cache.flush(&mut store).unwrap();
        }
    }
    cache.flush(&mut store).unwrap();
    let stats = cache.stats();
    assert!(stats.evictions > 0 && stats.misses > 0 && stats.hits > 0, "{stats:?}");
    let mut stored = BTreeMap::new();
    store
        .scan(0..65536)
        .for_each(|e| {
            stored.insert(u64::from_be_bytes(e.key.try_into().unwrap()), Agg::decode(e.value).unwrap());
        })
        .unwrap();
    assert_eq!(stored, model);
    assert!(WriteBackCache::<WinKey, Agg>::bound_bytes(200, 0) > 200 * 40);
}

/// 10^6 distinct keys through a write-back cache of 50,000 entries (so almost all of the
/// state lives only in RocksDB) across 2 shards, read back exactly via the cache and via
/// scans. Prints put/get rates (`--nocapture`); they are not asserted.
#[test]
fn a_million_keys_read_back_exactly() {
    const N: u64 = 1_000_000;
    let tmp = TempDir::new("million");
    let backend = StateBackend::open(small_config(tmp.path(), 2)).unwrap();
    let mut stores = [backend.store("count", 0).unwrap(), backend.store("count", 1).unwrap()];
    let mut caches: [WriteBackCache<WinKey, Agg>; 2] = [WriteBackCache::new(50_000), WriteBackCache::new(50_000)];
    let shard = |user: u64| (win_key(user).kg / 64) as usize;

    let t0 = Instant::now();
    for user in 0..N {
        let s = shard(user);
        caches[s].insert(&mut stores[s], win_key(user), Agg { count: user, sum: user * 7 }).unwrap();
    }
    for s in 0..2 {
        caches[s].flush(&mut stores[s]).unwrap();
    }
    let put_s = t0.elapsed().as_secs_f64();

    // Raw store puts and gets, for a rate without the cache.
    let t1 = Instant::now();
    let mut batch = stores[0].batch();
    for user in 0..N / 4 {
        batch.put(0, &user.to_be_bytes(), b"raw", &user.to_le_bytes());
        if batch.len() == 1000 {
            batch.commit().unwrap();
            batch = stores[0].batch();
        }
    }
    batch.commit().unwrap();
    let raw_put_s = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    let mut buf = Vec::new();
    let mut rng = Rng(5);
    for _ in 0..N / 4 {
        let user = rng.next() % (N / 4);
        assert!(stores[0].get_into(0, &user.to_be_bytes(), b"raw", &mut buf).unwrap());
        assert_eq!(buf, user.to_le_bytes());
    }
    let raw_get_s = t2.elapsed().as_secs_f64();

    // Every key through the caches (misses load from RocksDB), in a scrambled order.
    let t3 = Instant::now();
    for i in 0..N {
        let user = (i * 611_953) % N; // 611953 is prime and coprime with 10^6: a permutation
        let s = shard(user);
        let got = caches[s].get(&mut stores[s], &win_key(user)).unwrap().copied();
        assert_eq!(got, Some(Agg { count: user, sum: user * 7 }), "user {user}");
    }
    let get_s = t3.elapsed().as_secs_f64();

    // And by scans: each key exactly once.
    let mut seen = vec![false; N as usize];
    for s in &stores {
        s.scan(0..65536)
            .for_each(|e| {
                if e.namespace == b"raw" {
                    return;
                }
                let user = u64::from_be_bytes(e.key.try_into().unwrap());
                assert!(!seen[user as usize], "user {user} twice");
                seen[user as usize] = true;
                assert_eq!(Agg::decode(e.value).unwrap(), Agg { count: user, sum: user * 7 });
            })
            .unwrap();
    }
    assert!(seen.iter().all(|&s| s), "every key was scanned");
    let u = backend.usage();
    println!(
        "state rates (release, this machine): cache insert+flush {:.2} M/s, cache get (miss-heavy) {:.2} M/s, \
         store batch put {:.2} M/s, store get {:.2} M/s; rocksdb usage {u:?}",
        N as f64 / put_s / 1e6,
        N as f64 / get_s / 1e6,
        (N / 4) as f64 / raw_put_s / 1e6,
        (N / 4) as f64 / raw_get_s / 1e6,
    );
}
