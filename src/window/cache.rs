//! The bounded, typed window cache of one subtask.
//!
//! Keys live in a dense vector of slots (each with its windows, panes or sessions), found
//! through a hash index. Dense, so a sweep over every key can stop after any chunk and
//! resume at an index: firing in bounded chunks needs a cursor that a hash map does not
//! give. Both are allocated once, at start, for the most keys the bound allows (TigerBeetle's
//! habit: what is bounded is allocated up front), so the cache never reallocates and its
//! memory is known.
//!
//! ```text
//!  index: key -> slot        slots (dense, capacity fixed at start)
//!  +-----+-----+             +------+------+------+-----+------+- - - - - - -+
//!  | k 7 |  2  |------------>| k 3  | k 9  | k 7  | ... | k 1  |  (unused)   |
//!  +-----+-----+             +------+------+------+-----+------+- - - - - - -+
//!                                          one window inline; more in a Vec
//! ```
//!
//! The bound covers the index and the slots at full capacity, plus a share (1/8) for keys
//! with more than one window, whose windows live in a separate allocation. When either is
//! full, a CLOCK hand evicts keys not touched since it last passed (second chance) until
//! both are at 7/8, in one batch, to the store.
//!
//! The index holds slot numbers only (4 bytes and a control byte a bucket), hashed by the
//! slot's key, and has twice the buckets the slots need: a removal leaves a tombstone, and
//! hashbrown rehashes a table whose tombstones used up its free buckets in place only while
//! it is at most half full; fuller, it allocates a table twice the size (which, before
//! this layout, took the 10^7-key row of `weir-bench window` 35 MiB over its budget).

use hashbrown::HashTable;
use std::hash::BuildHasher;

/// One window (tumbling), pane (sliding) or session, with its accumulator.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry<A> {
    /// Start, ns (inclusive).
    pub start: u64,
    /// End, ns (exclusive).
    pub end: u64,
    pub acc: A,
}

/// A key's entries, sorted by start. Most keys have one live window at a time, so one is
/// kept inline: no allocation per key.
#[derive(Debug, Clone)]
pub(crate) enum Entries<A> {
    One(Entry<A>),
    Many(Vec<Entry<A>>),
}

impl<A> Entries<A> {
    pub(crate) fn new() -> Entries<A> {
        Entries::Many(Vec::new())
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[Entry<A>] {
        match self {
            Entries::One(e) => std::slice::from_ref(e),
            Entries::Many(v) => v,
        }
    }

    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [Entry<A>] {
        match self {
            Entries::One(e) => std::slice::from_mut(e),
            Entries::Many(v) => v,
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.as_slice().len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn insert(&mut self, i: usize, e: Entry<A>) {
        match self {
            Entries::Many(v) if v.is_empty() => *self = Entries::One(e),
            Entries::Many(v) => v.insert(i, e),
            Entries::One(_) => {
                let Entries::One(first) = std::mem::replace(self, Entries::Many(Vec::with_capacity(2))) else {
                    unreachable!("matched One")
                };
                let Entries::Many(v) = self else { unreachable!("just set") };
                v.push(first);
                v.insert(i, e);
            }
        }
    }

    pub(crate) fn remove(&mut self, i: usize) -> Entry<A> {
        match self {
            Entries::One(_) => {
                let Entries::One(e) = std::mem::replace(self, Entries::new()) else { unreachable!("matched One") };
                e
            }
            Entries::Many(v) => {
                let e = v.remove(i);
                self.normalize();
                e
            }
        }
    }

    /// Keep the entries for which `keep` is true.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Entry<A>) -> bool) {
        match self {
            Entries::One(e) => {
                if !keep(e) {
                    *self = Entries::new();
                }
            }
            Entries::Many(v) => {
                v.retain(|e| keep(e));
                self.normalize();
            }
        }
    }

    /// Back to inline storage when one entry is left (frees the allocation).
    fn normalize(&mut self) {
        if let Entries::Many(v) = self
            && v.len() <= 1
            && v.capacity() > 0
        {
            *self = match v.pop() {
                Some(e) => Entries::One(e),
                None => Entries::new(),
            };
        }
    }

    /// Bytes allocated outside the slot (with malloc's per-allocation overhead).
    pub(crate) fn heap_bytes(&self) -> u64 {
        match self {
            Entries::Many(v) if v.capacity() > 0 => (v.capacity() * std::mem::size_of::<Entry<A>>()) as u64 + 16,
            _ => 0,
        }
    }
}

/// One key's state.
#[derive(Debug, Clone)]
pub(crate) struct Slot<A> {
    pub key: u64,
    pub kg: u16,
    /// Used since the CLOCK hand last passed.
    pub touched: bool,
    /// The store may hold more of this key's windows: the slot was started blind, without
    /// reading them (its windows are folded with the stored ones before any of them fires).
    pub partial: bool,
    /// Every window of this key that ends at or before this time has fired (the watermark at
    /// the key's last catch-up).
    pub caught_up: u64,
    /// The earliest time at which one of its windows must fire or be dropped; `u64::MAX`
    /// when none. May be early (then a catch-up finds nothing to do), never late.
    pub next_due: u64,
    /// What `entries.heap_bytes()` was when last accounted.
    pub heap_bytes: u64,
    /// Changed since the last checkpoint wrote the cache's copy of it (set by every
    /// mutable access through [`Cache::slot`]: conservative, never missed).
    pub dirty: bool,
    /// The cache's copy in the store holds this key (as of the last checkpoint that wrote
    /// it): when the key leaves the cache, the copy must be deleted.
    pub copied: bool,
    pub entries: Entries<A>,
}

impl<A> Slot<A> {
    /// An empty slot, caught up to `now`.
    pub(crate) fn new(key: u64, kg: u16, now: u64) -> Slot<A> {
        Slot {
            key,
            kg,
            touched: true,
            partial: false,
            caught_up: now,
            next_due: u64::MAX,
            heap_bytes: 0,
            dirty: true,
            copied: false,
            entries: Entries::new(),
        }
    }
}

/// The most keys one eviction writes (unless the cache is still full): an eviction runs in
/// the record path, so its size bounds the pause; 4096 keys are a write batch of about
/// half a MiB.
pub(crate) const EVICT_BATCH_MAX: usize = 4096;

/// Bytes a key costs in a batch to or from the store, about: the operation, its encoded
/// window, a slot when read back.
const BATCH_BYTES_PER_KEY: usize = 192;

/// Hash index bytes per bucket: the slot number and its control byte.
const INDEX_BUCKET_BYTES: u64 = std::mem::size_of::<u32>() as u64 + 1;

/// A key's hash in the index.
#[inline]
fn hash(key: u64) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(key)
}

/// The cache of one window subtask.
pub(crate) struct Cache<A> {
    slots: Vec<Slot<A>>,
    /// Slot numbers, hashed by their slot's key.
    index: HashTable<u32>,
    max_slots: usize,
    heap_limit: u64,
    heap_bytes: u64,
    hand: usize,
    /// Keys per batch to or from the store.
    batch_keys: usize,
    /// Keys that left the cache while the store's copy of the cache held them: their
    /// copies are deleted at the next checkpoint (or sooner, in batches).
    departed: Vec<(u16, u64)>,
}

impl<A> Cache<A> {
    /// A cache that stays within `bound_bytes`, allocated now, whose batches to and from the
    /// store stay within `batch_bytes`.
    pub(crate) fn new(bound_bytes: u64, batch_bytes: u64) -> Cache<A> {
        let heap_limit = bound_bytes / 8;
        let max_slots = Self::max_slots(bound_bytes - heap_limit);
        Cache {
            slots: Vec::with_capacity(max_slots),
            // Twice the slots: never more than half full (see the module docs).
            index: HashTable::with_capacity(2 * max_slots),
            max_slots,
            heap_limit,
            heap_bytes: 0,
            hand: 0,
            batch_keys: (batch_bytes as usize / BATCH_BYTES_PER_KEY).clamp(16, EVICT_BATCH_MAX),
            departed: Vec::new(),
        }
    }

    /// Every cached slot, to change without marking them dirty (a checkpoint that just
    /// wrote their copies clears the mark).
    pub(crate) fn slots_mut(&mut self) -> &mut [Slot<A>] {
        &mut self.slots
    }

    /// Keys that left the cache with a copy in the store, since the last call.
    pub(crate) fn take_departed(&mut self) -> Vec<(u16, u64)> {
        std::mem::take(&mut self.departed)
    }

    /// Give back departed keys whose copies could not be deleted (a failed checkpoint).
    pub(crate) fn return_departed(&mut self, mut keys: Vec<(u16, u64)>) {
        keys.append(&mut self.departed);
        self.departed = keys;
    }

    /// How many keys left the cache with a copy in the store, not yet deleted.
    pub(crate) fn departed_len(&self) -> usize {
        self.departed.len()
    }

    /// The keys a cache of `bound_bytes` holds (as [`Cache::new`] would size it).
    pub(crate) fn capacity_for(bound_bytes: u64) -> usize {
        Self::max_slots(bound_bytes - bound_bytes / 8)
    }

    /// Every cached slot.
    pub(crate) fn slots(&self) -> &[Slot<A>] {
        &self.slots
    }

    /// Keys per batch to or from the store.
    pub(crate) fn batch_keys(&self) -> usize {
        self.batch_keys
    }

    /// The most slots whose index and slots fit in `bytes`. hashbrown keeps a power of two
    /// of buckets at most 7/8 full, and the index is never more than half that (see the
    /// module docs), so the slots are 7/16 of the largest bucket count that fits.
    fn max_slots(bytes: u64) -> usize {
        let slot = std::mem::size_of::<Slot<A>>() as u64;
        let mut buckets = 1u64 << 40;
        while buckets >= 32 {
            let slots = buckets / 16 * 7;
            if buckets * INDEX_BUCKET_BYTES + slots * slot <= bytes {
                return slots as usize;
            }
            buckets /= 2;
        }
        14
    }

    /// The most keys it holds.
    pub(crate) fn capacity(&self) -> usize {
        self.max_slots
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<usize> {
        let slots = &self.slots;
        self.index.find(hash(key), |&i| slots[i as usize].key == key).map(|&i| i as usize)
    }

    /// Slot `i`, to change: it is marked dirty (its copy in the store is out of date).
    #[inline]
    pub(crate) fn slot(&mut self, i: usize) -> &mut Slot<A> {
        let s = &mut self.slots[i];
        s.dirty = true;
        s
    }

    /// Whether a new key needs an eviction first.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.slots.len() >= self.max_slots || self.heap_bytes > self.heap_limit
    }

    /// Add a key (the caller made room); returns its slot index.
    pub(crate) fn insert(&mut self, slot: Slot<A>) -> usize {
        debug_assert!(self.slots.len() < self.max_slots, "insert into a full cache");
        debug_assert!(self.get(slot.key).is_none(), "key {} cached twice", slot.key);
        let (i, key) = (self.slots.len(), slot.key);
        // The slot first: a rehash reads every indexed slot's key.
        self.slots.push(slot);
        let slots = &self.slots;
        self.index.insert_unique(hash(key), i as u32, |&j| hash(slots[j as usize].key));
        self.account(i);
        i
    }

    /// Note a change of slot `i`'s entries' allocation.
    #[inline]
    pub(crate) fn account(&mut self, i: usize) {
        let s = &mut self.slots[i];
        let now = s.entries.heap_bytes();
        if now != s.heap_bytes {
            self.heap_bytes = self.heap_bytes + now - s.heap_bytes;
            s.heap_bytes = now;
        }
    }

    /// Remove slot `i`: the last slot moves into its place (a sweep at `i` must look at `i`
    /// again).
    pub(crate) fn remove(&mut self, i: usize) -> Slot<A> {
        let last = self.slots.len() - 1;
        let key = self.slots[i].key;
        match self.index.find_entry(hash(key), |&j| j as usize == i) {
            Ok(entry) => drop(entry.remove()),
            Err(_) => unreachable!("slot {i} (key {key}) is indexed"),
        }
        if i < last {
            // The last slot moves to `i`: its bucket now says `i`.
            let moved = self.slots[last].key;
            let j = self.index.find_mut(hash(moved), |&j| j as usize == last).expect("the last slot is indexed");
            *j = i as u32;
        }
        let slot = self.slots.swap_remove(i);
        if slot.copied {
            self.departed.push((slot.kg, slot.key));
        }
        self.heap_bytes -= slot.heap_bytes;
        slot
    }

    /// Bytes the index has allocated: fixed at start (a test's check that it never grows).
    #[cfg(test)]
    fn index_bytes(&self) -> usize {
        self.index.allocation_size()
    }

    /// Evict keys until both shares are at 7/8, or a batch of keys once there is room:
    /// second chance for keys touched since the hand last passed.
    pub(crate) fn evict(&mut self) -> Vec<Slot<A>> {
        let (target_slots, target_heap) = (self.max_slots / 8 * 7, self.heap_limit / 8 * 7);
        let mut victims = Vec::new();
        let mut passes = 0usize;
        while (self.slots.len() > target_slots || self.heap_bytes > target_heap)
            && !self.slots.is_empty()
            && (victims.len() < self.batch_keys || self.is_full())
        {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            // After two full turns every key has lost its second chance; the bound on the
            // loop keeps a cache where everything is hot from spinning.
            if self.slots[self.hand].touched && passes < 2 * self.max_slots {
                self.slots[self.hand].touched = false;
                self.hand += 1;
                passes += 1;
                continue;
            }
            victims.push(self.remove(self.hand));
        }
        victims
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64) -> Entry<u64> {
        Entry { start, end: start + 1, acc: start }
    }

    /// One entry lives inline; a second moves them to a Vec; back to one frees it.
    #[test]
    fn entries_inline_and_heap() {
        let mut e = Entries::new();
        assert!(e.is_empty());
        e.insert(0, entry(5));
        assert_eq!(e.heap_bytes(), 0, "one entry is inline");
        e.insert(0, entry(1));
        e.insert(2, entry(9));
        assert_eq!(e.as_slice().iter().map(|x| x.start).collect::<Vec<_>>(), vec![1, 5, 9]);
        assert!(e.heap_bytes() > 0);
        e.retain(|x| x.start != 5);
        assert_eq!(e.remove(0).start, 1);
        assert_eq!(e.heap_bytes(), 0, "one left: inline again");
        assert_eq!(e.remove(0).start, 9);
        assert!(e.is_empty());
    }

    /// The cache never holds more keys than its capacity, evicts untouched keys first, and
    /// its index follows the slots that move.
    #[test]
    fn evicts_cold_keys_first_and_keeps_the_index() {
        let mut c: Cache<u64> = Cache::new(64 * 1024, 64 * 1024);
        let cap = c.capacity();
        assert!(cap > 100, "{cap}");
        for k in 0..cap as u64 {
            assert!(!c.is_full());
            c.insert(Slot::new(k, 0, 0));
        }
        assert!(c.is_full());
        // Keys 0..10 stay hot; the hand clears everyone's first chance, then evicts.
        for k in 0..10 {
            let i = c.get(k).unwrap();
            c.slot(i).touched = true;
        }
        for i in 0..c.len() {
            if c.slot(i).key >= 10 {
                c.slot(i).touched = false;
            }
        }
        let victims = c.evict();
        assert!(!victims.is_empty() && !c.is_full());
        assert!(victims.iter().all(|s| s.key >= 10), "hot keys kept");
        for i in 0..c.len() {
            let key = c.slot(i).key;
            assert_eq!(c.get(key), Some(i));
        }
        assert_eq!(c.len() + victims.len(), cap);
    }

    /// A cache that keeps evicting and taking new keys (each removal leaves a tombstone in
    /// the index) never reallocates its index, and the index keeps finding every key.
    #[test]
    fn churn_never_grows_the_index() {
        let mut c: Cache<u64> = Cache::new(256 * 1024, 64 * 1024);
        let (cap, bytes) = (c.capacity(), c.index_bytes());
        for next in 0..50 * cap as u64 {
            if c.is_full() {
                for s in c.slots_mut() {
                    s.touched = false;
                }
                assert!(!c.evict().is_empty());
            }
            // Keys spread over the hash space, as a stream of new keys is.
            c.insert(Slot::new(next.wrapping_mul(0x9E37_79B9_7F4A_7C15), 0, 0));
        }
        assert_eq!(c.index_bytes(), bytes, "the index was reallocated");
        for i in 0..c.len() {
            let key = c.slots()[i].key;
            assert_eq!(c.get(key), Some(i));
        }
        assert_eq!(c.get(u64::MAX), None);
    }
}
