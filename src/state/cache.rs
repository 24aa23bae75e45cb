//! A bounded write-back cache of typed state in front of a [`Store`].
//!
//! An operator keeps its hot state here as Rust values, reads and updates them without
//! touching RocksDB, and the cache writes them back in batches: when it is full it evicts a
//! chunk of entries (CLOCK: an entry used since the hand last passed gets a second chance,
//! so eviction is LRU-ish at O(1) per entry) and writes the dirty ones in one batch; at a
//! checkpoint the operator calls [`WriteBackCache::flush`]. State larger than the cache
//! lives in RocksDB and is loaded back on a miss.
//!
//! Bound: at most `capacity_entries` entries and `capacity_entries` pending deletes, in
//! tables allocated at construction; [`WriteBackCache::bound_bytes`] gives the memory, to be
//! counted in the owner's budget.
//!
//! Write ordering: every write to the store sends all pending deletes first, then puts, so a
//! delete is never written after a newer value of the same key; a key whose delete is
//! pending reads as absent without asking the store.

use super::backend::WRITE_BATCH_BYTES_MAX;
use super::error::StateError;
use super::store::{Batch, Store};
use rustc_hash::{FxHashMap, FxHashSet};
use std::fmt;
use std::hash::Hash;

/// A cache key: where its entry lives in the store.
pub trait CacheKey: Eq + Hash + Clone {
    /// The key group.
    fn key_group(&self) -> u16;
    /// Append the key's bytes to `key` and the namespace's bytes (e.g. the window) to
    /// `namespace`; both arrive empty.
    fn encode(&self, key: &mut Vec<u8>, namespace: &mut Vec<u8>);
}

/// A cache value: how it is stored.
pub trait CacheValue: Sized {
    /// Append the value's bytes to `out` (arrives empty).
    fn encode(&self, out: &mut Vec<u8>);
    /// The value from the bytes `encode` wrote; an error says what is wrong (a `String`
    /// converts into it with `?` or `.into()`).
    fn decode(bytes: &[u8]) -> Result<Self, Box<dyn std::error::Error + Send + Sync>>;
}

struct Slot<K, V> {
    key: K,
    value: V,
    /// Changed since last written to the store.
    dirty: bool,
    /// Used since the clock hand last passed (the second chance).
    referenced: bool,
}

/// Counters of a [`WriteBackCache`], since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from memory (including "absent, delete pending").
    pub hits: u64,
    /// Lookups that asked the store.
    pub misses: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Puts and deletes written to the store.
    pub writes: u64,
    /// Write batches committed.
    pub batches: u64,
}

/// A bounded write-back cache of `K → V` in front of one [`Store`] (see the module docs).
pub struct WriteBackCache<K, V> {
    capacity_entries: usize,
    /// Entries evicted per eviction round: a chunk, so that evictions write batches.
    evict_entries: usize,
    slots: Vec<Option<Slot<K, V>>>,
    free: Vec<u32>,
    index: FxHashMap<K, u32>,
    /// Keys to delete from the store at the next write (removed from the cache meanwhile).
    deletes: FxHashSet<K>,
    hand: usize,
    bufs: Buffers,
    stats: CacheStats,
}

/// Encode buffers, reused for every key and value written or read.
#[derive(Default)]
struct Buffers {
    key: Vec<u8>,
    namespace: Vec<u8>,
    value: Vec<u8>,
}

impl Buffers {
    fn encode_key<K: CacheKey>(&mut self, key: &K) {
        self.key.clear();
        self.namespace.clear();
        key.encode(&mut self.key, &mut self.namespace);
    }
}

impl<K, V> fmt::Debug for WriteBackCache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteBackCache")
            .field("capacity_entries", &self.capacity_entries)
            .field("len", &self.index.len())
            .field("pending_deletes", &self.deletes.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<K: CacheKey, V: CacheValue> WriteBackCache<K, V> {
    /// A cache of at most `capacity_entries` entries (and as many pending deletes), its
    /// tables allocated now. Panics if `capacity_entries` is 0 or over `u32::MAX`.
    pub fn new(capacity_entries: usize) -> Self {
        assert!(capacity_entries > 0 && capacity_entries <= u32::MAX as usize, "cache capacity {capacity_entries}");
        let mut index = FxHashMap::default();
        index.reserve(capacity_entries);
        let mut deletes = FxHashSet::default();
        deletes.reserve(capacity_entries);
        WriteBackCache {
            capacity_entries,
            evict_entries: (capacity_entries / 16).max(1),
            slots: Vec::with_capacity(capacity_entries),
            free: Vec::with_capacity(capacity_entries),
            index,
            deletes,
            hand: 0,
            bufs: Buffers::default(),
            stats: CacheStats::default(),
        }
    }

    /// The memory of a cache of `capacity_entries` entries of this type, full: the slot
    /// array, the free list, the index and the pending-delete set (hash tables at their
    /// allocated size, a power of two of buckets at 7/8 load), plus `heap_bytes_per_entry`
    /// for what a key and value own on the heap (0 for plain data), plus the encode buffers
    /// (at most one write batch's worth).
    pub fn bound_bytes(capacity_entries: usize, heap_bytes_per_entry: usize) -> u64 {
        let n = capacity_entries as u64;
        let buckets = hash_buckets(capacity_entries) as u64;
        let slots = n * std::mem::size_of::<Option<Slot<K, V>>>() as u64;
        let free = n * 4;
        // hashbrown: one control byte per bucket plus a group's width of trailing ones.
        let index = buckets * (std::mem::size_of::<(K, u32)>() as u64 + 1) + 16;
        let deletes = buckets * (std::mem::size_of::<K>() as u64 + 1) + 16;
        slots + free + index + deletes + n * heap_bytes_per_entry as u64 + WRITE_BATCH_BYTES_MAX as u64
    }

    /// Entries cached.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The most entries it holds.
    pub fn capacity_entries(&self) -> usize {
        self.capacity_entries
    }

    /// Counters since construction.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The value of `key`, from memory or else loaded from `store` (and then cached).
    pub fn get(&mut self, store: &mut Store, key: &K) -> Result<Option<&V>, StateError> {
        Ok(match self.locate(store, key)? {
            Some(i) => Some(&self.slot_mut(i).value),
            None => None,
        })
    }

    /// The value of `key` to change in place, marked dirty (loaded from `store` on a miss).
    pub fn get_mut(&mut self, store: &mut Store, key: &K) -> Result<Option<&mut V>, StateError> {
        Ok(match self.locate(store, key)? {
            Some(i) => {
                let slot = self.slot_mut(i);
                slot.dirty = true;
                Some(&mut slot.value)
            }
            None => None,
        })
    }

    /// Change the value of `key` with `f`, first creating it with `init` if it exists
    /// neither here nor in `store`: the aggregate-update path, one lookup.
    pub fn update(
        &mut self,
        store: &mut Store,
        key: &K,
        init: impl FnOnce() -> V,
        f: impl FnOnce(&mut V),
    ) -> Result<(), StateError> {
        let i = match self.locate(store, key)? {
            Some(i) => i,
            None => self.place(store, key.clone(), init(), true)?,
        };
        let slot = self.slot_mut(i);
        slot.dirty = true;
        f(&mut slot.value);
        Ok(())
    }

    /// Set `key` to `value` (dirty), evicting to the store if full.
    pub fn insert(&mut self, store: &mut Store, key: K, value: V) -> Result<(), StateError> {
        if let Some(&i) = self.index.get(&key) {
            let slot = self.slot_mut(i);
            slot.value = value;
            slot.dirty = true;
            slot.referenced = true;
            return Ok(());
        }
        self.place(store, key, value, true)?;
        Ok(())
    }

    /// Remove `key`: from memory now, from the store at the next write. Returns the cached
    /// value, if it was cached.
    pub fn remove(&mut self, store: &mut Store, key: &K) -> Result<Option<V>, StateError> {
        if self.deletes.len() >= self.capacity_entries {
            write_back(store, &mut self.deletes, &mut self.bufs, &mut self.stats, std::iter::empty::<&Slot<K, V>>())?;
        }
        // The store may hold an older value whether or not this one was cached.
        self.deletes.insert(key.clone());
        Ok(self.index.remove(key).map(|i| {
            let slot = self.slots[i as usize].take().expect("indexed slot is occupied");
            self.free.push(i);
            slot.value
        }))
    }

    /// Write every dirty entry and pending delete to `store`, in batches of about
    /// [`WRITE_BATCH_BYTES_MAX`]; entries stay cached, clean. Returns entries written.
    pub fn flush(&mut self, store: &mut Store) -> Result<u64, StateError> {
        let before = self.stats.writes;
        let dirty = self.slots.iter().flatten().filter(|s| s.dirty);
        write_back(store, &mut self.deletes, &mut self.bufs, &mut self.stats, dirty)?;
        for slot in self.slots.iter_mut().flatten() {
            slot.dirty = false;
        }
        Ok(self.stats.writes - before)
    }

    /// Drop every cached entry without writing (after the store's state was replaced, e.g.
    /// on restore). Pending deletes are dropped too.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.index.clear();
        self.deletes.clear();
        self.hand = 0;
    }

    fn slot_mut(&mut self, i: u32) -> &mut Slot<K, V> {
        self.slots[i as usize].as_mut().expect("indexed slot is occupied")
    }

    /// The slot of `key`, loading it from the store on a miss; `None` if absent everywhere.
    fn locate(&mut self, store: &mut Store, key: &K) -> Result<Option<u32>, StateError> {
        if let Some(&i) = self.index.get(key) {
            self.stats.hits += 1;
            self.slot_mut(i).referenced = true;
            return Ok(Some(i));
        }
        if self.deletes.contains(key) {
            self.stats.hits += 1;
            return Ok(None);
        }
        self.stats.misses += 1;
        self.bufs.encode_key(key);
        let b = &mut self.bufs;
        if !store.get_into(key.key_group(), &b.key, &b.namespace, &mut b.value)? {
            return Ok(None);
        }
        let value = V::decode(&b.value)
            .map_err(|e| StateError::Decode { operator: store.operator().into(), problem: e.to_string() })?;
        Ok(Some(self.place(store, key.clone(), value, false)?))
    }

    /// Put a new entry in a free slot, evicting a chunk first if there is none.
    fn place(&mut self, store: &mut Store, key: K, value: V, dirty: bool) -> Result<u32, StateError> {
        if self.free.is_empty() && self.slots.len() == self.capacity_entries {
            self.evict(store)?;
        }
        let slot = Some(Slot { key: key.clone(), value, dirty, referenced: true });
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(key, i);
        Ok(i)
    }

    /// Evict a chunk of entries by CLOCK, writing the dirty ones (after pending deletes).
    fn evict(&mut self, store: &mut Store) -> Result<(), StateError> {
        let mut victims = Vec::with_capacity(self.evict_entries);
        let n = self.slots.len();
        // Two passes at most: the first clears every second chance it meets.
        for _ in 0..2 * n {
            if victims.len() == self.evict_entries {
                break;
            }
            let i = self.hand;
            self.hand = (self.hand + 1) % n;
            if let Some(slot) = self.slots[i].as_mut() {
                if slot.referenced {
                    slot.referenced = false;
                } else {
                    // Taken out now so that the sweep cannot pick it twice.
                    victims.push((i as u32, self.slots[i].take().expect("slot is occupied")));
                }
            }
        }
        let dirty = victims.iter().map(|(_, slot)| slot).filter(|s| s.dirty);
        if let Err(e) = write_back(store, &mut self.deletes, &mut self.bufs, &mut self.stats, dirty) {
            // Nothing was evicted: put the victims back.
            for (i, slot) in victims {
                self.slots[i as usize] = Some(slot);
            }
            return Err(e);
        }
        for (i, slot) in victims {
            self.index.remove(&slot.key);
            self.free.push(i);
            self.stats.evictions += 1;
        }
        Ok(())
    }
}

/// Write all pending `deletes`, then `puts`, in batches of about WRITE_BATCH_BYTES_MAX.
fn write_back<'a, K: CacheKey + 'a, V: CacheValue + 'a>(
    store: &Store,
    deletes: &mut FxHashSet<K>,
    bufs: &mut Buffers,
    stats: &mut CacheStats,
    puts: impl Iterator<Item = &'a Slot<K, V>>,
) -> Result<(), StateError> {
    let mut batch = store.batch();
    for key in deletes.iter() {
        bufs.encode_key(key);
        batch.delete(key.key_group(), &bufs.key, &bufs.namespace);
        stats.writes += 1;
        batch = commit_if_full(batch, store, stats)?;
    }
    // Deletes go in their own batches before any put (see the module docs).
    if !batch.is_empty() {
        stats.batches += 1;
        batch.commit()?;
        batch = store.batch();
    }
    deletes.clear();
    for slot in puts {
        bufs.encode_key(&slot.key);
        bufs.value.clear();
        slot.value.encode(&mut bufs.value);
        batch.put(slot.key.key_group(), &bufs.key, &bufs.namespace, &bufs.value);
        stats.writes += 1;
        batch = commit_if_full(batch, store, stats)?;
    }
    if !batch.is_empty() {
        stats.batches += 1;
        batch.commit()?;
    }
    Ok(())
}

/// Commit `batch` and start a new one once it reaches WRITE_BATCH_BYTES_MAX.
fn commit_if_full<'s>(batch: Batch<'s>, store: &'s Store, stats: &mut CacheStats) -> Result<Batch<'s>, StateError> {
    if batch.size_bytes() < WRITE_BATCH_BYTES_MAX {
        return Ok(batch);
    }
    stats.batches += 1;
    batch.commit()?;
    Ok(store.batch())
}

/// Buckets hashbrown allocates for `capacity` entries: a power of two at 7/8 load.
fn hash_buckets(capacity: usize) -> usize {
    if capacity < 4 {
        4
    } else if capacity < 8 {
        8
    } else {
        (capacity * 8 / 7).next_power_of_two()
    }
}
