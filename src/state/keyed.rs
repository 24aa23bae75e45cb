//! Keyed state for user operators: value, list and map state by name, per key, in the
//! subtask's shard — the same key-group layout as every other operator's state
//! ([`super::key`]), so it is checkpointed with the shard and moves with its key groups
//! when a job is restored at another parallelism.
//!
//! A [`KeyedState`] is one operator subtask's state; the runtime makes it (over the
//! subtask's RocksDB shard, or in memory when the job has no state backend) and hands it to
//! the operator's factory, which takes typed handles from it by name:
//!
//! ```ignore
//! job.source(..).key_by(..).process_with_state("count", 2, |_info, state| Counter {
//!     seen: state.value::<u64, u64>("seen"),      // key u64 → u64
//!     last: state.list::<u64, Event>("last"),     // key u64 → [Event]
//!     by_kind: state.map::<u64, u32, u64>("kinds"), // key u64 → {u32 → u64}
//! });
//! // in KeyedProcess::process(record, key_group, out):
//! let n = self.seen.get(key_group, &record.key)?.unwrap_or(0) + 1;
//! self.seen.put(key_group, &record.key, &n)?;
//! ```
//!
//! Every call names the key group (the one `process` is given; timers keep it with the key)
//! and the key. Over RocksDB a read is a point lookup (through the shared block cache), a
//! write goes to the memtable, and a list `push` is a merge operand (no read); nothing is
//! cached above RocksDB, so state may be far larger than memory. Values and keys are encoded
//! with their [`Record`] codec; a value that does not decode (the operator's types changed
//! between runs) is a [`StateError::Decode`] naming the state.
//!
//! Stored as `(key group, key, namespace)` with namespace `[kind][name length][name]`
//! (kind `v`, `l` or `m`) and, for a map, the map key's bytes after it; a list's value is
//! its elements, each `[length u32 LE][bytes]`.

use super::Store;
use super::error::StateError;
use super::parts::StatePart;
use crate::record::Record;
use crate::record::schema::TypeSchema;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

/// One operator subtask's keyed state; typed handles come from it by name. Cheap to clone
/// (the handles share it); used from the subtask's thread only.
#[derive(Clone)]
pub struct KeyedState {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for KeyedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("KeyedState").field("operator", &inner.operator).field("rocksdb", &inner.is_rocks()).finish()
    }
}

struct Inner {
    /// The operator's node id (for errors).
    operator: String,
    backing: Backing,
    /// Reused buffers: an encoded key, a namespace, a value.
    key: Vec<u8>,
    namespace: Vec<u8>,
    value: Vec<u8>,
    /// What times to live are measured by: the wall clock, ns since the Unix epoch (a test
    /// may give another).
    clock: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// Every state declared (a handle taken), by namespace prefix: what checkpoints record.
    declared: BTreeMap<Vec<u8>, StatePart>,
    /// Conversions the operator gave for values written by an earlier version, by namespace
    /// prefix: the type they read, and the conversion of one value's bytes.
    hooks: BTreeMap<Vec<u8>, (TypeSchema, ConvertFn)>,
}

/// Converts one stored value's bytes (without its expiry) into the current type's.
type ConvertFn = Box<dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send>;

enum Backing {
    #[cfg(feature = "rocksdb")]
    /// The operator's column family in the subtask's shard.
    Rocks(Store),
    /// No state backend: the encoded keys and values in memory (checkpointed whole).
    Memory(BTreeMap<Vec<u8>, Vec<u8>>),
}

impl Inner {
    fn is_rocks(&self) -> bool {
        #[cfg(feature = "rocksdb")]
        return matches!(self.backing, Backing::Rocks(_));
        #[cfg(not(feature = "rocksdb"))]
        false
    }

    /// The time now, for a handle with a time to live (no clock read without one).
    fn now(&self, ttl: Option<Ttl>) -> u64 {
        if ttl.is_some() { (self.clock)() } else { 0 }
    }
}

/// What the runtime does with a [`KeyedState`] at checkpoints (not for operators).
pub(crate) enum Checkpointed<'a> {
    /// Over RocksDB: checkpoint the shard through this store.
    #[cfg_attr(not(feature = "rocksdb"), allow(dead_code))]
    Shard(&'a Store),
    /// In memory: these bytes go into the operator's checkpoint.
    Bytes(Vec<u8>),
}

impl KeyedState {
    #[cfg(feature = "rocksdb")]
    /// State in the column family `store` (the runtime's, over the subtask's shard).
    pub(crate) fn rocks(operator: &str, store: Store) -> KeyedState {
        KeyedState::with(operator, Backing::Rocks(store))
    }

    /// State in memory (a job without a state backend; tests).
    pub fn in_memory(operator: &str) -> KeyedState {
        KeyedState::with(operator, Backing::Memory(BTreeMap::new()))
    }

    fn with(operator: &str, backing: Backing) -> KeyedState {
        KeyedState {
            inner: Arc::new(Mutex::new(Inner {
                operator: operator.to_owned(),
                backing,
                key: Vec::new(),
                namespace: Vec::new(),
                value: Vec::new(),
                clock: Arc::new(wall_clock_ns),
                declared: BTreeMap::new(),
                hooks: BTreeMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Used from one thread; a panic while held leaves the state as the operator left it
        // (the subtask fails with the panic anyway).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Measure times to live by `clock` (ns since the Unix epoch) instead of the wall clock:
    /// for tests. RocksDB's compaction still drops what the wall clock says has expired.
    pub fn with_clock(self, clock: impl Fn() -> u64 + Send + Sync + 'static) -> KeyedState {
        self.lock().clock = Arc::new(clock);
        self
    }

    /// Whether the state lives in RocksDB (else in memory).
    pub fn is_rocksdb(&self) -> bool {
        self.lock().is_rocks()
    }

    /// A value per key: `K` → `V`.
    pub fn value<K: Record, V: Record + Clone>(&self, name: &str) -> ValueState<K, V> {
        let h = Handle::new(self, b'v', name);
        self.declare(&h, "value", K::schema(), None, V::schema());
        ValueState { h, _types: PhantomData }
    }

    /// A list per key: `K` → `[V]`, appended without reading it.
    pub fn list<K: Record, V: Record + Clone>(&self, name: &str) -> ListState<K, V> {
        let h = Handle::new(self, b'l', name);
        self.declare(&h, "list", K::schema(), None, V::schema());
        ListState { h, _types: PhantomData }
    }

    /// A map per key: `K` → `{M → V}`, its entries in the order of `M`'s encoded bytes.
    pub fn map<K: Record, M: Record + Clone, V: Record + Clone>(&self, name: &str) -> MapState<K, M, V> {
        let h = Handle::new(self, b'm', name);
        self.declare(&h, "map", K::schema(), Some(M::schema()), V::schema());
        MapState { h, _types: PhantomData }
    }

    fn declare(&self, h: &Handle, kind: &str, key: TypeSchema, map_key: Option<TypeSchema>, value: TypeSchema) {
        let part = StatePart { name: h.name().into_owned(), kind: kind.to_owned(), key: Some(key), map_key, value };
        self.lock().declared.insert(h.prefix.clone(), part);
    }

    /// Every state declared so far (a handle taken), as checkpoints record them.
    pub(crate) fn parts(&self) -> Vec<StatePart> {
        self.lock().declared.values().cloned().collect()
    }

    /// Bring the state restored for `key_groups` to what this version of the operator
    /// declares, given what the checkpoint's envelope says the old version declared (`old`):
    /// values of a type that changed are converted (by the operator's own conversion, or by
    /// [`crate::record::schema::plan`]'s rules), a state no longer declared is deleted if
    /// `allow_dropped`, and anything else is refused, naming the state. Run after the
    /// operator took its handles and before its first record. Returns what it did, in words.
    pub(crate) fn upgrade(
        &self,
        old: &[StatePart],
        key_groups: &std::ops::Range<u32>,
        allow_dropped: bool,
    ) -> Result<Vec<String>, String> {
        let mut inner = self.lock();
        let mut done = Vec::new();
        for part in old {
            let Some(prefix) = prefix_of(part) else { continue };
            let Some(now) = inner.declared.get(&prefix).cloned() else {
                if !allow_dropped {
                    return Err(format!(
                        "the checkpoint holds {} state `{}`, which this operator does not declare: declare it, \
                         or allow dropping state (weir run --allow-dropped-state, \
                         CheckpointSettings::allow_dropped_state) to delete it",
                        part.kind, part.name
                    ));
                }
                let n = inner.rewrite(&prefix, key_groups, None, false).map_err(|e| e.to_string())?;
                done.push(format!("{} state `{}` dropped ({n} entries)", part.kind, part.name));
                continue;
            };
            let convert: Option<ConvertFn> = match inner.hooks.remove(&prefix) {
                Some((reads, hook)) => {
                    crate::state::check_part(&inner.operator, part, &StatePart { value: reads.clone(), ..now.clone() })
                        .ok()
                        .filter(|m| m.is_same())
                        .ok_or_else(|| {
                            format!(
                                "{} state `{}`: its conversion reads values of type {} and the checkpoint holds {}",
                                part.kind, part.name, reads, part.value
                            )
                        })?;
                    Some(hook)
                }
                None => match crate::state::check_part(&inner.operator, part, &now).map_err(|e| e.to_string())? {
                    m if m.is_same() => None,
                    m => Some(Box::new(move |b: &[u8]| m.apply(b).map_err(|e| e.to_string()))),
                },
            };
            if let Some(convert) = convert {
                let n = inner.rewrite(&prefix, key_groups, Some(&convert), part.kind.starts_with("list"))?;
                done.push(format!("{} state `{}`: {n} entries converted from {}", part.kind, part.name, part.value));
            }
        }
        Ok(done)
    }

    /// Run `f` with what a checkpoint needs: the store to checkpoint the shard through, or
    /// the in-memory state as bytes (`[count u64][key len u32][key][value len u32][value]…`).
    pub(crate) fn checkpoint<R>(&self, f: impl FnOnce(Checkpointed<'_>) -> R) -> R {
        let mut inner = self.lock();
        let inner = &mut *inner;
        match &mut inner.backing {
            #[cfg(feature = "rocksdb")]
            Backing::Rocks(store) => f(Checkpointed::Shard(store)),
            Backing::Memory(map) => {
                // What expired goes first (RocksDB's compaction does it over a shard).
                let now = (inner.clock)();
                map.retain(|k, v| !expired(k, v, now));
                let mut bytes = Vec::with_capacity(8 + map.len() * 32);
                bytes.extend_from_slice(&(map.len() as u64).to_le_bytes());
                for (k, v) in map {
                    for part in [k, v] {
                        bytes.extend_from_slice(&(part.len() as u32).to_le_bytes());
                        bytes.extend_from_slice(part);
                    }
                }
                f(Checkpointed::Bytes(bytes))
            }
        }
    }

    /// Take the entries of key groups `key_groups` from in-memory checkpoint bytes (what
    /// [`checkpoint`](Self::checkpoint) made; one old subtask's, of several when the job
    /// is restored at another parallelism). Over RocksDB the shard is restored already.
    pub(crate) fn restore_bytes(&self, bytes: &[u8], key_groups: &std::ops::Range<u32>) -> Result<(), StateError> {
        let mut inner = self.lock();
        let operator = inner.operator.clone();
        #[cfg_attr(not(feature = "rocksdb"), allow(irrefutable_let_patterns))]
        let Backing::Memory(map) = &mut inner.backing else {
            return Err(StateError::Decode {
                operator,
                problem: "the checkpoint holds in-memory keyed state, and this run keeps it in RocksDB \
                          (restore with the same state backend setting)"
                    .into(),
            });
        };
        let bad = |problem: &str| StateError::Decode { operator: operator.clone(), problem: problem.to_owned() };
        let (count, mut rest) = take_u64(bytes).ok_or_else(|| bad("keyed state bytes shorter than their count"))?;
        for _ in 0..count {
            let (k, r) = take_part(rest).ok_or_else(|| bad("keyed state bytes cut inside a key"))?;
            let (v, r) = take_part(r).ok_or_else(|| bad("keyed state bytes cut inside a value"))?;
            rest = r;
            let kg = super::key::decode_key(k).ok_or_else(|| bad("a malformed key in keyed state bytes"))?.key_group;
            if key_groups.contains(&(kg as u32)) {
                map.insert(k.to_vec(), v.to_vec());
            }
        }
        Ok(())
    }
}

fn take_u64(b: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = b.split_at_checked(8)?;
    Some((u64::from_le_bytes(head.try_into().ok()?), rest))
}

fn take_part(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = b.split_at_checked(4)?;
    let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
    rest.split_at_checked(len)
}

/// `[kind][name length][name]`. Names up to 255 bytes (longer ones are cut: a name is an
/// identifier in the operator's code, not data).
fn namespace(kind: u8, name: &str) -> Vec<u8> {
    let name = &name.as_bytes()[..name.len().min(255)];
    let mut ns = Vec::with_capacity(2 + name.len());
    ns.push(kind);
    ns.push(name.len() as u8);
    ns.extend_from_slice(name);
    ns
}

/// Encode `r` into `out` (cleared first).
fn encode_into<R: Record>(r: &R, out: &mut Vec<u8>) {
    out.clear();
    out.resize(r.encoded_len(), 0);
    r.encode(out);
}

fn decode<V: Record + Clone>(operator: &str, prefix: &[u8], bytes: &[u8]) -> Result<V, StateError> {
    // Fixed-layout records decode in place and need their alignment (at most 8): stored
    // bytes (inside a list, a RocksDB buffer) have none, so they are copied to 8-aligned
    // memory first unless they are aligned already.
    let mut words = Vec::new();
    let bytes = if (bytes.as_ptr() as usize).is_multiple_of(8) {
        bytes
    } else {
        words.resize(bytes.len().div_ceil(8), 0u64);
        let aligned = &mut zerocopy::IntoBytes::as_mut_bytes(words.as_mut_slice())[..bytes.len()];
        aligned.copy_from_slice(bytes);
        &*aligned
    };
    V::decode(bytes, |v| v.clone()).map_err(|e| StateError::Decode {
        operator: operator.to_owned(),
        problem: format!("state `{}`: {e}", String::from_utf8_lossy(&prefix[2..])),
    })
}

/// Key group as stored (u16: key groups are at most 65536).
fn kg16(key_group: u32) -> u16 {
    debug_assert!(key_group < super::key::KEY_GROUPS_MAX);
    key_group as u16
}

impl Inner {
    /// Read `(key_group, key, namespace)` into `self.value`; whether there was one.
    fn get(&mut self, key_group: u32) -> Result<bool, StateError> {
        let Inner { backing, key, namespace, value, .. } = self;
        match backing {
            #[cfg(feature = "rocksdb")]
            Backing::Rocks(store) => store.get_into(kg16(key_group), key, namespace, value),
            Backing::Memory(map) => {
                let mut full = Vec::new();
                super::key::encode_key(kg16(key_group), key, namespace, &mut full);
                value.clear();
                Ok(map.get(&full).map(|v| value.extend_from_slice(v)).is_some())
            }
        }
    }

    fn put(&mut self, key_group: u32) -> Result<(), StateError> {
        let Inner { backing, key, namespace, value, .. } = self;
        match backing {
            #[cfg(feature = "rocksdb")]
            Backing::Rocks(store) => store.put(kg16(key_group), key, namespace, value),
            Backing::Memory(map) => {
                let mut full = Vec::new();
                super::key::encode_key(kg16(key_group), key, namespace, &mut full);
                map.insert(full, value.clone());
                Ok(())
            }
        }
    }

    fn delete(&mut self, key_group: u32) -> Result<(), StateError> {
        let Inner { backing, key, namespace, .. } = self;
        match backing {
            #[cfg(feature = "rocksdb")]
            Backing::Rocks(store) => store.delete(kg16(key_group), key, namespace),
            Backing::Memory(map) => {
                let mut full = Vec::new();
                super::key::encode_key(kg16(key_group), key, namespace, &mut full);
                map.remove(&full);
                Ok(())
            }
        }
    }

    /// Append `self.value` as one list element (a merge operand over RocksDB).
    fn append(&mut self, key_group: u32) -> Result<(), StateError> {
        let Inner { backing, key, namespace, value, .. } = self;
        let mut element = Vec::with_capacity(4 + value.len());
        element.extend_from_slice(&(value.len() as u32).to_le_bytes());
        element.extend_from_slice(value);
        match backing {
            #[cfg(feature = "rocksdb")]
            Backing::Rocks(store) => {
                let mut b = store.batch();
                b.merge(kg16(key_group), key, namespace, &element);
                b.commit()
            }
            Backing::Memory(map) => {
                let mut full = Vec::new();
                super::key::encode_key(kg16(key_group), key, namespace, &mut full);
                map.entry(full).or_default().extend_from_slice(&element);
                Ok(())
            }
        }
    }

    /// Every `(namespace suffix, value)` under `(key_group, key, namespace)`, in order.
    fn scan(
        &mut self,
        key_group: u32,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        let Inner { backing, key, namespace, .. } = self;
        match backing {
            #[cfg(feature = "rocksdb")]
            Backing::Rocks(store) => {
                // One key's entries sit in a block or two: a cursor over the key without
                // read-ahead, skipping its other states' entries.
                let mut cursor = store.scan_key(kg16(key_group), key);
                while let Some(e) = cursor.next()? {
                    if let Some(suffix) = e.namespace.strip_prefix(namespace.as_slice()) {
                        f(suffix, e.value)?;
                    }
                }
                Ok(())
            }
            Backing::Memory(map) => {
                let mut prefix = Vec::new();
                super::key::encode_key(kg16(key_group), key, namespace, &mut prefix);
                let at = prefix.len();
                for (k, v) in map.range(prefix.clone()..) {
                    if !k.starts_with(&prefix) {
                        break;
                    }
                    f(&k[at..], v)?;
                }
                Ok(())
            }
        }
    }

    /// Delete every entry under `(key_group, key, namespace)` (one write batch).
    fn delete_prefix(&mut self, key_group: u32) -> Result<(), StateError> {
        let mut doomed = Vec::new();
        self.scan(key_group, |suffix, _| {
            doomed.push(suffix.to_vec());
            Ok(())
        })?;
        let Inner { backing, key, namespace, .. } = self;
        let mut ns = namespace.clone();
        let base = ns.len();
        match backing {
            #[cfg(feature = "rocksdb")]
            Backing::Rocks(store) => {
                let mut b = store.batch();
                for suffix in doomed {
                    ns.truncate(base);
                    ns.extend_from_slice(&suffix);
                    b.delete(kg16(key_group), key, &ns);
                }
                b.commit()
            }
            Backing::Memory(map) => {
                let mut full = Vec::new();
                for suffix in doomed {
                    ns.truncate(base);
                    ns.extend_from_slice(&suffix);
                    super::key::encode_key(kg16(key_group), key, &ns, &mut full);
                    map.remove(&full);
                }
                Ok(())
            }
        }
    }
}

/// The namespace prefix of a recorded part (`None`: not a keyed state's part).
fn prefix_of(part: &StatePart) -> Option<Vec<u8>> {
    let (kind, ttl) = match part.kind.strip_suffix("_ttl") {
        Some(k) => (k, true),
        None => (part.kind.as_str(), false),
    };
    let byte = match kind {
        "value" => b'v',
        "list" => b'l',
        "map" => b'm',
        _ => return None,
    };
    let mut prefix = namespace(byte, &part.name);
    if ttl {
        expiring(&mut prefix);
    }
    Some(prefix)
}

impl Inner {
    /// Every entry of the state `prefix` in `key_groups`: its values converted by `convert`
    /// (each element of a list, by `list`), or deleted (`None`). Returns how many entries.
    fn rewrite(
        &mut self,
        prefix: &[u8],
        key_groups: &std::ops::Range<u32>,
        convert: Option<&ConvertFn>,
        list: bool,
    ) -> Result<u64, String> {
        let ttl = prefix.first().is_some_and(u8::is_ascii_uppercase);
        let operator = self.operator.clone();
        let one = |stored: &[u8]| -> Result<Vec<u8>, String> {
            let f = convert.expect("converting");
            let (expiry, bytes) = if ttl {
                stored.split_at_checked(8).ok_or("a value shorter than its expiry")?
            } else {
                (&[][..], stored)
            };
            let mut out = expiry.to_vec();
            out.extend_from_slice(&f(bytes)?);
            Ok(out)
        };
        let value_of = |stored: &[u8]| -> Result<Vec<u8>, String> {
            if !list {
                return one(stored);
            }
            let mut out = Vec::with_capacity(stored.len());
            let mut rest = stored;
            while !rest.is_empty() {
                let (element, r) = take_part(rest).ok_or("a list cut inside an element")?;
                let element = one(element)?;
                out.extend_from_slice(&(element.len() as u32).to_le_bytes());
                out.extend_from_slice(&element);
                rest = r;
            }
            Ok(out)
        };
        let fail = |e: String| format!("keyed state of {operator}: {e}");
        let mut n = 0;
        match &mut self.backing {
            #[cfg(feature = "rocksdb")]
            Backing::Rocks(store) => {
                let mut cursor = store.scan(key_groups.clone());
                let mut batch = store.batch();
                while let Some(e) = cursor.next().map_err(|e| e.to_string())? {
                    if !e.namespace.starts_with(prefix) {
                        continue;
                    }
                    n += 1;
                    match convert {
                        Some(_) => batch.put(e.key_group, e.key, e.namespace, &value_of(e.value).map_err(fail)?),
                        None => batch.delete(e.key_group, e.key, e.namespace),
                    }
                    if batch.size_bytes() >= super::WRITE_BATCH_BYTES_MAX {
                        std::mem::replace(&mut batch, store.batch()).commit().map_err(|e| e.to_string())?;
                    }
                }
                batch.commit().map_err(|e| e.to_string())?;
            }
            Backing::Memory(map) => {
                let mut doomed = Vec::new();
                for (k, v) in map.iter_mut() {
                    let Some(parts) = super::key::decode_key(k) else { continue };
                    if !key_groups.contains(&u32::from(parts.key_group)) || !parts.namespace.starts_with(prefix) {
                        continue;
                    }
                    n += 1;
                    match convert {
                        Some(_) => *v = value_of(v).map_err(fail)?,
                        None => doomed.push(k.clone()),
                    }
                }
                for k in doomed {
                    map.remove(&k);
                }
            }
        }
        Ok(n)
    }
}

impl Handle {
    /// Values of this state written by an earlier version of the operator were of type `O`:
    /// convert each with `f` when the job is restored (see [`ValueState::migrate_from`]).
    fn migrate_from<O: Record + Clone, V: Record>(&self, f: impl Fn(O) -> V + Send + 'static) {
        let operator = self.state.lock().operator.clone();
        let prefix = self.prefix.clone();
        let convert: ConvertFn = Box::new(move |bytes: &[u8]| {
            let old: O = decode(&operator, &prefix, bytes).map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            encode_into(&f(old), &mut out);
            Ok(out)
        });
        self.state.lock().hooks.insert(self.prefix.clone(), (O::schema(), convert));
    }
}

/// Set up the key and namespace buffers for one call.
fn prepare<K: Record>(inner: &mut Inner, key: &K, prefix: &[u8]) {
    encode_into(key, &mut inner.key);
    inner.namespace.clear();
    inner.namespace.extend_from_slice(prefix);
}

/// What a handle with a time to live does (see [`ValueState::with_ttl`]).
#[derive(Clone, Copy, Debug)]
struct Ttl {
    /// Nanoseconds an entry lives after it was written.
    ns: u64,
}

/// Give `prefix` the kind of state that expires (its kind byte in upper case): stored values
/// then start with their expiry, and the compaction filter ([`expired`]) knows to look.
fn expiring(prefix: &mut [u8]) {
    prefix[0] = prefix[0].to_ascii_uppercase();
}

/// `value` with its expiry in front, if the handle has a time to live.
fn stamp(ttl: Option<Ttl>, now: u64, value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    if let Some(t) = ttl {
        out.extend_from_slice(&now.saturating_add(t.ns).to_le_bytes());
    }
    out.extend_from_slice(value);
}

/// The live bytes of a stored value: without its expiry, or `None` if it has expired (or
/// is too short to carry one, which only a foreign writer could make).
fn live(ttl: Option<Ttl>, now: u64, stored: &[u8]) -> Option<&[u8]> {
    match ttl {
        None => Some(stored),
        Some(_) => {
            let (expiry, rest) = stored.split_at_checked(8)?;
            (u64::from_le_bytes(expiry.try_into().ok()?) > now).then_some(rest)
        }
    }
}

/// Whether the entry `(key, value)` of a column family of keyed state has expired at `now`
/// (ns since the Unix epoch): a value or map entry of a state with a time to live whose
/// expiry has passed, or a list of such a state all of whose elements have. Entries of
/// states without one never expire. For the compaction filter and the in-memory sweep.
pub(crate) fn expired(key: &[u8], value: &[u8], now: u64) -> bool {
    let Some(parts) = super::key::decode_key(key) else { return false };
    let expiry = |b: &[u8]| b.get(..8).and_then(|e| e.try_into().ok()).map(u64::from_le_bytes);
    match parts.namespace.first() {
        Some(b'V' | b'M') => expiry(value).is_some_and(|e| e <= now),
        Some(b'L') => {
            let mut rest = value;
            let mut any = false;
            while let Some((element, r)) = take_part(rest) {
                if expiry(element).is_none_or(|e| e > now) {
                    return false;
                }
                any = true;
                rest = r;
            }
            any && rest.is_empty()
        }
        _ => false,
    }
}

/// The wall clock, ns since the Unix epoch: what a time to live is measured by.
pub(crate) fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// What every typed handle is: the state, its namespace prefix and its time to live.
struct Handle {
    state: KeyedState,
    prefix: Vec<u8>,
    ttl: Option<Ttl>,
}

impl Handle {
    fn new(state: &KeyedState, kind: u8, name: &str) -> Handle {
        Handle { state: state.clone(), prefix: namespace(kind, name), ttl: None }
    }

    fn name(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.prefix[2..])
    }

    fn debug(&self, f: &mut std::fmt::Formatter<'_>, what: &str) -> std::fmt::Result {
        f.debug_struct(what).field("name", &self.name()).field("ttl", &self.ttl).finish()
    }

    /// Expire entries `ttl` after their last write: stored apart (an upper-case kind).
    fn set_ttl(&mut self, ttl: std::time::Duration) {
        let old = self.prefix.clone();
        expiring(&mut self.prefix);
        let mut inner = self.state.lock();
        if let Some(mut part) = inner.declared.remove(&old) {
            part.kind += "_ttl";
            inner.declared.insert(self.prefix.clone(), part);
        }
        if let Some(hook) = inner.hooks.remove(&old) {
            inner.hooks.insert(self.prefix.clone(), hook);
        }
        drop(inner);
        self.ttl = Some(Ttl { ns: ttl.as_nanos().min(u64::MAX as u128) as u64 });
    }

    /// Put `value`, encoded and with its expiry in front if the handle has a time to live,
    /// into `inner.value`.
    fn stage<V: Record>(&self, inner: &mut Inner, value: &V) {
        let now = inner.now(self.ttl);
        let mut one = Vec::new();
        encode_into(value, &mut one);
        let mut stored = std::mem::take(&mut inner.value);
        stamp(self.ttl, now, &one, &mut stored);
        inner.value = stored;
    }

    /// The value at the entry `inner`'s buffers name, if any and live (an expired one is
    /// removed).
    fn read<V: Record + Clone>(&self, inner: &mut Inner, key_group: u32) -> Result<Option<V>, StateError> {
        if !inner.get(key_group)? {
            return Ok(None);
        }
        let now = inner.now(self.ttl);
        let Some(bytes) = live(self.ttl, now, &inner.value) else {
            inner.delete(key_group)?;
            return Ok(None);
        };
        decode(&inner.operator, &self.prefix, bytes).map(Some)
    }
}

/// A value per key (see [`KeyedState::value`]).
pub struct ValueState<K, V> {
    h: Handle,
    _types: PhantomData<fn(&K, &V)>,
}

impl<K, V> std::fmt::Debug for ValueState<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.h.debug(f, "ValueState")
    }
}

impl<K: Record, V: Record + Clone> ValueState<K, V> {
    /// The migration hook: values of this state written by an earlier version of the
    /// operator are of type `O` (which must be the type the checkpoint recorded): when the
    /// job is restored, each is converted with `f`, once, before the first record. Without
    /// one, a changed value type converts only as [`crate::record::schema`] allows (fields
    /// added, integers widened) and is refused otherwise.
    ///
    /// ```ignore
    /// let totals = state.value::<u64, TotalsV2>("totals")
    ///     .migrate_from(|old: TotalsV1| TotalsV2 { sum: old.sum, max: 0 });
    /// ```
    pub fn migrate_from<O: Record + Clone>(self, f: impl Fn(O) -> V + Send + 'static) -> Self {
        self.h.migrate_from(f);
        self
    }

    /// Values live `ttl` after they were last written (processing time: the wall clock);
    /// after that they read as absent and are removed — when read, and by RocksDB's
    /// compaction (or at a checkpoint, in memory) for keys never read again. A state with a
    /// time to live is stored apart from one of the same name without.
    pub fn with_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.h.set_ttl(ttl);
        self
    }

    /// The value of `key` (in `key_group`), if any.
    pub fn get(&self, key_group: u32, key: &K) -> Result<Option<V>, StateError> {
        let mut inner = self.h.state.lock();
        prepare(&mut inner, key, &self.h.prefix);
        self.h.read(&mut inner, key_group)
    }

    /// Set the value of `key`.
    pub fn put(&self, key_group: u32, key: &K, value: &V) -> Result<(), StateError> {
        let mut inner = self.h.state.lock();
        prepare(&mut inner, key, &self.h.prefix);
        self.h.stage(&mut inner, value);
        inner.put(key_group)
    }

    /// Remove the value of `key`.
    pub fn clear(&self, key_group: u32, key: &K) -> Result<(), StateError> {
        let mut inner = self.h.state.lock();
        prepare(&mut inner, key, &self.h.prefix);
        inner.delete(key_group)
    }
}

/// A list per key (see [`KeyedState::list`]).
pub struct ListState<K, V> {
    h: Handle,
    _types: PhantomData<fn(&K, &V)>,
}

impl<K, V> std::fmt::Debug for ListState<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.h.debug(f, "ListState")
    }
}

impl<K: Record, V: Record + Clone> ListState<K, V> {
    /// The migration hook, for each element (see [`ValueState::migrate_from`]).
    pub fn migrate_from<O: Record + Clone>(self, f: impl Fn(O) -> V + Send + 'static) -> Self {
        self.h.migrate_from(f);
        self
    }

    /// Each element lives `ttl` after it was pushed (see [`ValueState::with_ttl`]): reads
    /// skip expired elements (and write the list back without them).
    pub fn with_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.h.set_ttl(ttl);
        self
    }

    /// Append `value` to `key`'s list (without reading it).
    pub fn push(&self, key_group: u32, key: &K, value: &V) -> Result<(), StateError> {
        let mut inner = self.h.state.lock();
        prepare(&mut inner, key, &self.h.prefix);
        self.h.stage(&mut inner, value);
        inner.append(key_group)
    }

    /// `key`'s list, oldest first (empty if none).
    pub fn get(&self, key_group: u32, key: &K) -> Result<Vec<V>, StateError> {
        let mut inner = self.h.state.lock();
        prepare(&mut inner, key, &self.h.prefix);
        if !inner.get(key_group)? {
            return Ok(Vec::new());
        }
        let now = inner.now(self.h.ttl);
        let mut out = Vec::new();
        let mut kept = Vec::new();
        let mut dropped = false;
        let mut rest = &inner.value[..];
        while !rest.is_empty() {
            let Some((element, r)) = take_part(rest) else {
                return Err(StateError::Decode {
                    operator: inner.operator.clone(),
                    problem: format!("state `{}`: a list cut inside an element", self.h.name()),
                });
            };
            match live(self.h.ttl, now, element) {
                Some(bytes) => {
                    out.push(decode(&inner.operator, &self.h.prefix, bytes)?);
                    kept.extend_from_slice(&(element.len() as u32).to_le_bytes());
                    kept.extend_from_slice(element);
                }
                None => dropped = true,
            }
            rest = r;
        }
        if dropped {
            // Write the list back without what expired (as it was stored: expiries kept).
            if kept.is_empty() {
                inner.delete(key_group)?;
            } else {
                inner.value = kept;
                inner.put(key_group)?;
            }
        }
        Ok(out)
    }

    /// Replace `key`'s list with `values` (empty: remove it).
    pub fn set(&self, key_group: u32, key: &K, values: &[V]) -> Result<(), StateError> {
        let mut inner = self.h.state.lock();
        prepare(&mut inner, key, &self.h.prefix);
        if values.is_empty() {
            return inner.delete(key_group);
        }
        let now = inner.now(self.h.ttl);
        let mut all = Vec::new();
        let (mut one, mut stamped) = (Vec::new(), Vec::new());
        for v in values {
            encode_into(v, &mut one);
            stamp(self.h.ttl, now, &one, &mut stamped);
            all.extend_from_slice(&(stamped.len() as u32).to_le_bytes());
            all.extend_from_slice(&stamped);
        }
        inner.value = all;
        inner.put(key_group)
    }

    /// Remove `key`'s list.
    pub fn clear(&self, key_group: u32, key: &K) -> Result<(), StateError> {
        let mut inner = self.h.state.lock();
        prepare(&mut inner, key, &self.h.prefix);
        inner.delete(key_group)
    }
}

/// A map per key (see [`KeyedState::map`]).
pub struct MapState<K, M, V> {
    h: Handle,
    _types: PhantomData<fn(&K, &M, &V)>,
}

impl<K, M, V> std::fmt::Debug for MapState<K, M, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.h.debug(f, "MapState")
    }
}

impl<K: Record, M: Record + Clone, V: Record + Clone> MapState<K, M, V> {
    /// The migration hook, for each entry's value (see [`ValueState::migrate_from`]); the
    /// map keys keep their type.
    pub fn migrate_from<O: Record + Clone>(self, f: impl Fn(O) -> V + Send + 'static) -> Self {
        self.h.migrate_from(f);
        self
    }

    /// Each entry lives `ttl` after it was last written (see [`ValueState::with_ttl`]).
    pub fn with_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.h.set_ttl(ttl);
        self
    }

    /// Set up the buffers for the entry `(key, map_key)`.
    fn entry(&self, inner: &mut Inner, key: &K, map_key: &M) {
        prepare(inner, key, &self.h.prefix);
        let mut mk = Vec::new();
        encode_into(map_key, &mut mk);
        inner.namespace.extend_from_slice(&mk);
    }

    /// The value of `map_key` in `key`'s map, if any.
    pub fn get(&self, key_group: u32, key: &K, map_key: &M) -> Result<Option<V>, StateError> {
        let mut inner = self.h.state.lock();
        self.entry(&mut inner, key, map_key);
        self.h.read(&mut inner, key_group)
    }

    /// Set `map_key` to `value` in `key`'s map.
    pub fn put(&self, key_group: u32, key: &K, map_key: &M, value: &V) -> Result<(), StateError> {
        let mut inner = self.h.state.lock();
        self.entry(&mut inner, key, map_key);
        self.h.stage(&mut inner, value);
        inner.put(key_group)
    }

    /// Remove `map_key` from `key`'s map.
    pub fn remove(&self, key_group: u32, key: &K, map_key: &M) -> Result<(), StateError> {
        let mut inner = self.h.state.lock();
        self.entry(&mut inner, key, map_key);
        inner.delete(key_group)
    }

    /// Every live entry of `key`'s map, in the order of the map keys' encoded bytes
    /// (expired ones are removed as they are met).
    pub fn entries(&self, key_group: u32, key: &K) -> Result<Vec<(M, V)>, StateError> {
        let mut inner = self.h.state.lock();
        prepare(&mut inner, key, &self.h.prefix);
        let operator = inner.operator.clone();
        let now = inner.now(self.h.ttl);
        let mut out = Vec::new();
        let mut gone = Vec::new();
        inner.scan(key_group, |mk, v| {
            match live(self.h.ttl, now, v) {
                Some(bytes) => out.push((
                    decode::<M>(&operator, &self.h.prefix, mk)?,
                    decode::<V>(&operator, &self.h.prefix, bytes)?,
                )),
                None => gone.push(mk.to_vec()),
            }
            Ok(())
        })?;
        let base = inner.namespace.len();
        for mk in gone {
            inner.namespace.truncate(base);
            inner.namespace.extend_from_slice(&mk);
            let deleted = inner.delete(key_group);
            inner.namespace.truncate(base);
            deleted?;
        }
        Ok(out)
    }

    /// Remove `key`'s whole map.
    pub fn clear(&self, key_group: u32, key: &K) -> Result<(), StateError> {
        let mut inner = self.h.state.lock();
        prepare(&mut inner, key, &self.h.prefix);
        inner.delete_prefix(key_group)
    }
}

/// The merge operator of a column family holding list state: operands are appended
/// (each is already `[length][bytes]`).
pub(crate) fn list_merge() -> super::ValueMerge {
    Arc::new(|existing: Option<&[u8]>, operands: &mut dyn Iterator<Item = &[u8]>| {
        let mut out = existing.map(<[u8]>::to_vec).unwrap_or_default();
        for op in operands {
            out.extend_from_slice(op);
        }
        Some(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "rocksdb")]
    use crate::state::{StateBackend, StateConfig};
    use proptest::prelude::*;
    use std::collections::BTreeMap as Model;

    #[cfg(feature = "rocksdb")]
    fn temp_dir() -> crate::util::TempDir {
        crate::util::temp_dir("keyed-state")
    }

    /// One operation on the state: (kind, key group, key, map key, value).
    type Op = (u8, u32, u64, u32, u64);

    /// What the model holds: values, lists, maps by (key group, key).
    #[derive(Default, Debug, PartialEq)]
    struct Seen {
        values: Model<(u32, u64), u64>,
        lists: Model<(u32, u64), Vec<u64>>,
        maps: Model<(u32, u64), Model<u32, u64>>,
    }

    /// Apply `ops` to `state` and to a model; after each op, the state answers as the model.
    fn run(state: &KeyedState, ops: &[Op]) -> Seen {
        let (v, l, m) = (state.value::<u64, u64>("v"), state.list::<u64, u64>("l"), state.map::<u64, u32, u64>("m"));
        // A second value state whose name prefixes nothing of the others' but shares a kind.
        let v2 = state.value::<u64, u64>("vv");
        let mut seen = Seen::default();
        for &(kind, kg, key, mk, x) in ops {
            match kind % 8 {
                0 => {
                    v.put(kg, &key, &x).unwrap();
                    seen.values.insert((kg, key), x);
                }
                1 => {
                    v.clear(kg, &key).unwrap();
                    seen.values.remove(&(kg, key));
                }
                2 | 3 => {
                    l.push(kg, &key, &x).unwrap();
                    seen.lists.entry((kg, key)).or_default().push(x);
                }
                4 => {
                    l.clear(kg, &key).unwrap();
                    seen.lists.remove(&(kg, key));
                }
                5 => {
                    m.put(kg, &key, &mk, &x).unwrap();
                    seen.maps.entry((kg, key)).or_default().insert(mk, x);
                }
                6 => {
                    m.remove(kg, &key, &mk).unwrap();
                    if let Some(map) = seen.maps.get_mut(&(kg, key)) {
                        map.remove(&mk);
                        // A map whose last entry went is no map (as `answers` reads it).
                        if map.is_empty() {
                            seen.maps.remove(&(kg, key));
                        }
                    }
                }
                _ => {
                    m.clear(kg, &key).unwrap();
                    seen.maps.remove(&(kg, key));
                    v2.put(kg, &key, &(x ^ 1)).unwrap();
                }
            }
            assert_eq!(v.get(kg, &key).unwrap(), seen.values.get(&(kg, key)).copied());
            assert_eq!(l.get(kg, &key).unwrap(), seen.lists.get(&(kg, key)).cloned().unwrap_or_default());
            let entries = m.entries(kg, &key).unwrap();
            let mut want: Vec<(u32, u64)> =
                seen.maps.get(&(kg, key)).map(|m| m.clone().into_iter().collect()).unwrap_or_default();
            // Entries come in the order of the map keys' encoded (little-endian) bytes.
            want.sort_by_key(|(mk, _)| mk.to_le_bytes());
            assert_eq!(entries, want);
            assert_eq!(m.get(kg, &key, &mk).unwrap(), seen.maps.get(&(kg, key)).and_then(|m| m.get(&mk)).copied());
        }
        seen
    }

    /// Everything `state` answers for every key the model knows of.
    fn answers(state: &KeyedState, keys: impl Iterator<Item = (u32, u64)>) -> Seen {
        let (v, l, m) = (state.value::<u64, u64>("v"), state.list::<u64, u64>("l"), state.map::<u64, u32, u64>("m"));
        let mut seen = Seen::default();
        for (kg, key) in keys {
            if let Some(x) = v.get(kg, &key).unwrap() {
                seen.values.insert((kg, key), x);
            }
            let list = l.get(kg, &key).unwrap();
            if !list.is_empty() {
                seen.lists.insert((kg, key), list);
            }
            let map: Model<u32, u64> = m.entries(kg, &key).unwrap().into_iter().collect();
            if !map.is_empty() {
                seen.maps.insert((kg, key), map);
            }
        }
        seen
    }

    fn keys_of(seen: &Seen) -> Vec<(u32, u64)> {
        let mut keys: Vec<_> = seen.values.keys().chain(seen.lists.keys()).chain(seen.maps.keys()).copied().collect();
        keys.sort();
        keys.dedup();
        keys
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec((any::<u8>(), 0u32..6, 0u64..5, 0u32..300, any::<u64>()), 1..80)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// In memory: value, list and map state answer as the model after every operation,
        /// and the checkpoint bytes restore exactly the key groups asked for.
        #[test]
        fn memory_state_matches_the_model(ops in ops(), split in 0u32..7) {
            let state = KeyedState::in_memory("op");
            let seen = run(&state, &ops);
            let bytes = state.checkpoint(|c| match c {
                Checkpointed::Bytes(b) => b,
                Checkpointed::Shard(_) => unreachable!("in memory"),
            });
            let (low, high) = (KeyedState::in_memory("op"), KeyedState::in_memory("op"));
            low.restore_bytes(&bytes, &(0..split)).unwrap();
            high.restore_bytes(&bytes, &(split..6)).unwrap();
            let mut got = answers(&low, keys_of(&seen).into_iter().filter(|(kg, _)| *kg < split));
            let more = answers(&high, keys_of(&seen).into_iter().filter(|(kg, _)| *kg >= split));
            got.values.extend(more.values);
            got.lists.extend(more.lists);
            got.maps.extend(more.maps);
            prop_assert_eq!(&got, &seen);
            // A key group outside what was asked for is not there.
            if split > 0 {
                let none = answers(&high, keys_of(&seen).into_iter().filter(|(kg, _)| *kg < split));
                prop_assert_eq!(none, Seen::default());
            }
        }

        /// Over RocksDB (list pushes as merge operands): the same answers, and a second
        /// handle on the same column family (the shard's other subtask) sees its own key
        /// groups only through its own keys.
        #[test]
        #[cfg(feature = "rocksdb")]
        fn rocksdb_state_matches_the_model(ops in ops()) {
            let dir = temp_dir();
            let merges = [("op".to_string(), list_merge())].into_iter().collect();
            let backend = StateBackend::open_with(StateConfig::new(&*dir, 1), merges).unwrap();
            let state = KeyedState::rocks("op", backend.store("op", 0).unwrap());
            prop_assert!(state.is_rocksdb());
            let seen = run(&state, &ops);
            backend.store("op", 0).unwrap().flush().unwrap();
            let again = KeyedState::rocks("op", backend.store("op", 0).unwrap());
            prop_assert_eq!(answers(&again, keys_of(&seen).into_iter()), seen);
            drop((state, again, backend, dir));
        }
    }

    /// Times to live, in memory with a test clock: a value, a list's elements and a map's
    /// entries read as absent once `ttl` has passed since they were written (and are gone
    /// from the store after the read, or after a checkpoint's sweep for keys not read);
    /// writing again restarts the time; states without a time to live never expire, and a
    /// state with one is apart from one of the same name without.
    #[test]
    fn entries_expire_after_their_time_to_live() {
        let now = Arc::new(std::sync::atomic::AtomicU64::new(1_000));
        let clock = now.clone();
        let state = KeyedState::in_memory("op").with_clock(move || clock.load(std::sync::atomic::Ordering::Relaxed));
        let at = |t: u64| now.store(t, std::sync::atomic::Ordering::Relaxed);
        let ttl = std::time::Duration::from_nanos(10);
        let v = state.value::<u64, u64>("v").with_ttl(ttl);
        let forever = state.value::<u64, u64>("v");
        let l = state.list::<u64, u64>("l").with_ttl(ttl);
        let m = state.map::<u64, u32, u64>("m").with_ttl(ttl);
        v.put(1, &7, &70).unwrap();
        forever.put(1, &7, &71).unwrap();
        l.push(1, &7, &1).unwrap();
        m.put(1, &7, &1, &100).unwrap();
        m.put(1, &8, &1, &200).unwrap();
        at(1_006);
        l.push(1, &7, &2).unwrap();
        m.put(1, &7, &2, &101).unwrap();
        assert_eq!(v.get(1, &7).unwrap(), Some(70));
        at(1_010);
        assert_eq!(v.get(1, &7).unwrap(), None, "expired at write time + ttl");
        assert_eq!(forever.get(1, &7).unwrap(), Some(71), "the state without a time to live is apart");
        assert_eq!(l.get(1, &7).unwrap(), vec![2], "the first element expired");
        assert_eq!(m.entries(1, &7).unwrap(), vec![(2, 101)]);
        assert_eq!(m.get(1, &7, &1).unwrap(), None);
        v.put(1, &7, &72).unwrap();
        at(1_019);
        assert_eq!(v.get(1, &7).unwrap(), Some(72), "writing again restarted the time");
        // Key 8 was never read: a checkpoint's sweep drops its expired entry.
        let entries = |state: &KeyedState| {
            state.checkpoint(|c| match c {
                Checkpointed::Bytes(b) => u64::from_le_bytes(b[..8].try_into().unwrap()),
                Checkpointed::Shard(_) => unreachable!(),
            })
        };
        // Left: v (72), forever (71), l ([2], pushed at 1006: expired at 1016), m key 7 entry 2 (expired at
        // 1016), m key 8 (expired at 1010).
        assert_eq!(entries(&state), 2, "only the two values are left");
    }

    /// Over RocksDB: what has expired is dropped by compaction even if never read (the
    /// column family of an expiring operator has the filter), and what has not is kept.
    #[test]
    #[cfg(feature = "rocksdb")]
    fn compaction_drops_expired_entries() {
        let dir = temp_dir();
        let merges = [("op".to_string(), list_merge())].into_iter().collect();
        let config = StateConfig { expiring: vec!["op".to_string()], ..StateConfig::new(&*dir, 1) };
        let backend = StateBackend::open_with(config, merges).unwrap();
        let state = KeyedState::rocks("op", backend.store("op", 0).unwrap());
        let short = state.value::<u64, u64>("short").with_ttl(std::time::Duration::from_nanos(1));
        let long = state.value::<u64, u64>("long").with_ttl(std::time::Duration::from_secs(3600));
        let list = state.list::<u64, u64>("list").with_ttl(std::time::Duration::from_nanos(1));
        for key in 0..100u64 {
            short.put(2, &key, &key).unwrap();
            long.put(2, &key, &key).unwrap();
            list.push(2, &key, &key).unwrap();
        }
        let raw = |prefix: &[u8]| {
            let store = backend.store("op", 0).unwrap();
            let mut count = 0;
            let mut cursor = store.scan(0..10);
            while let Some(e) = cursor.next().unwrap() {
                count += u64::from(e.namespace.starts_with(prefix));
            }
            count
        };
        let store = backend.store("op", 0).unwrap();
        store.flush().unwrap();
        assert_eq!(raw(&namespace(b'V', "short")), 100, "stored before compaction");
        std::thread::sleep(std::time::Duration::from_millis(2));
        store.compact();
        assert_eq!(raw(&namespace(b'V', "short")), 0, "expired values dropped");
        // A list pushed as merge operands is folded into one value by a compaction and
        // filtered by the next (RocksDB filters values, not operands).
        store.compact();
        assert_eq!(raw(&namespace(b'L', "list")), 0, "lists whose elements all expired dropped");
        assert_eq!(raw(&namespace(b'V', "long")), 100, "live values kept");
        assert_eq!(long.get(2, &5).unwrap(), Some(5));
        drop((state, store, backend, dir));
    }

    /// A value whose bytes its type cannot decode fails naming the operator and the state.
    #[test]
    fn a_value_that_does_not_decode_names_its_state() {
        let state = KeyedState::in_memory("counter");
        state.value::<u64, String>("label").put(3, &7, &"x".repeat(3)).unwrap();
        let e = state.value::<u64, u64>("label").get(3, &7).unwrap_err().to_string();
        assert!(e.contains("counter") && e.contains("label"), "{e}");
        let bytes = state.checkpoint(|c| match c {
            Checkpointed::Bytes(b) => b,
            Checkpointed::Shard(_) => unreachable!(),
        });
        let e = KeyedState::in_memory("counter").restore_bytes(&bytes[..bytes.len() - 1], &(0..10)).unwrap_err();
        assert!(e.to_string().contains("cut inside"), "{e}");
    }
}
