//! Where a query's rows go: an order-independent digest (always), the rows themselves (tests),
//! and JSON lines in a file (`weir-bench nexmark --rows DIR`), for a check outside weir.
//!
//! An *updating* query's rows replace earlier ones with the same key (an upsert, as a
//! key-value store or a compacted topic takes Flink's retract/insert pairs): its result is
//! the last row of each key at the end, and that table is what is digested and written.

use super::rows::*;
use serde::Serialize;
// FxHash: a sink looks a key up per row.
use rustc_hash::FxHashMap as HashMap;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use weir::operators::{Halt, Sink};
use weir::record::Record;

/// A query's row.
pub trait Row: Record + Clone + Hash + Serialize + Debug + Send + Sync + 'static {
    /// For an updating query, the key a later row replaces an earlier one by; `None`: every
    /// row is one of the result (an append-only query).
    fn key(&self) -> Option<(u64, u64)> {
        None
    }
}

/// A 64-bit hash of `v`, the same in every run of this binary (FxHash, then a finalizer so
/// the digest's sum mixes well).
pub fn hash_of<T: Hash + ?Sized>(v: &T) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    v.hash(&mut h);
    let mut x = h.finish();
    // splitmix64's finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

macro_rules! append_rows {
    ($($t:ty),+) => {$( impl Row for $t {} )+};
}

append_rows!(Q0Row, Q1Row, Q2Row, Q3Row, Q5Row, Q7Row, Q8Row, Q9Row, Q10Row, Q11Row, Q12Row, Q13Row, Q14Row);
append_rows!(Q20Row, Q21Row, Q22Row);

impl Row for Q4Row {
    fn key(&self) -> Option<(u64, u64)> {
        Some((self.id, 0))
    }
}
impl Row for Q15Row {
    fn key(&self) -> Option<(u64, u64)> {
        Some((hash_of(&self.day), 0))
    }
}
impl Row for Q16Row {
    fn key(&self) -> Option<(u64, u64)> {
        Some((hash_of(&self.channel), hash_of(&self.day)))
    }
}
impl Row for Q17Row {
    fn key(&self) -> Option<(u64, u64)> {
        Some((self.auction, hash_of(&self.day)))
    }
}
impl Row for Q18Row {
    fn key(&self) -> Option<(u64, u64)> {
        Some((self.bidder, self.auction))
    }
}
impl Row for Q19Row {
    fn key(&self) -> Option<(u64, u64)> {
        Some((self.auction, self.rank_number))
    }
}

/// An order-independent digest of a multiset of rows: how many, and the wrapping sum of
/// their hashes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digest {
    /// Rows.
    pub rows: u64,
    /// Σ [`hash_of`] each row.
    pub sum: u64,
}

impl Digest {
    /// Add one row's hash.
    pub fn add(&mut self, hash: u64) {
        self.rows += 1;
        self.sum = self.sum.wrapping_add(hash);
    }

    /// Add another digest's rows.
    pub fn merge(&mut self, other: Digest) {
        self.rows += other.rows;
        self.sum = self.sum.wrapping_add(other.sum);
    }

    /// The digest of `rows`.
    pub fn of<'a, R: Hash + 'a>(rows: impl IntoIterator<Item = &'a R>) -> Digest {
        let mut d = Digest::default();
        for r in rows {
            d.add(hash_of(r));
        }
        d
    }
}

/// What a query's sinks fill, shared by their subtasks.
#[derive(Debug, Default)]
struct Shared {
    digest: Digest,
    /// Rows kept for a test (as JSON, sorted by the caller).
    rows: Vec<String>,
    /// Rows emitted (updating queries: before the upsert).
    emitted: u64,
}

/// One query's output: its sinks' shared digest, and what else to keep of the rows.
#[derive(Debug, Clone)]
pub struct Output {
    shared: Arc<Mutex<Shared>>,
    /// Keep every row (as JSON) for [`Output::rows`].
    keep: bool,
    /// Append JSON lines here.
    json: Option<Arc<Mutex<std::io::BufWriter<std::fs::File>>>>,
    path: Option<PathBuf>,
}

impl Output {
    /// A digest only.
    pub fn digest() -> Output {
        Output { shared: Arc::default(), keep: false, json: None, path: None }
    }

    /// Also keep every row (as JSON) for [`Output::rows`], if `yes`.
    pub fn keep(mut self, yes: bool) -> Output {
        self.keep = yes;
        self
    }

    /// A digest, and the rows as JSON lines in `path` (created; truncated).
    pub fn json_lines(path: PathBuf) -> std::io::Result<Output> {
        let file = std::fs::File::create(&path)?;
        let writer = std::io::BufWriter::with_capacity(1 << 20, file);
        Ok(Output { json: Some(Arc::new(Mutex::new(writer))), path: Some(path), ..Output::digest() })
    }

    /// The digest of what the sinks finished with.
    pub fn result(&self) -> Digest {
        self.lock().digest
    }

    /// Rows the query emitted (an updating query's before the upsert).
    pub fn emitted(&self) -> u64 {
        self.lock().emitted
    }

    /// The rows kept, as JSON, sorted.
    pub fn rows(&self) -> Vec<String> {
        let mut rows = self.lock().rows.clone();
        rows.sort_unstable();
        rows
    }

    /// The JSON lines file, if any.
    pub fn path(&self) -> Option<&PathBuf> {
        self.path.as_ref()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A sink subtask writing into this output.
    pub fn sink<R: Row>(&self) -> RowSink<R> {
        RowSink {
            out: self.clone(),
            digest: Digest::default(),
            emitted: 0,
            latest: HashMap::default(),
            latest_rows: HashMap::default(),
            lines: Vec::new(),
            kept: Vec::new(),
        }
    }
}

/// Bytes of JSON a sink buffers before appending them to the shared file.
const JSON_FLUSH_BYTES: usize = 1 << 20;

/// A query's sink subtask: digests append-only rows as they come, keeps the last row per key
/// of an updating query until the end.
#[derive(Debug)]
pub struct RowSink<R: Row> {
    out: Output,
    digest: Digest,
    emitted: u64,
    /// Updating: key → the last row's hash (24 bytes a key: q18 at 10^8 events has tens of
    /// millions of keys).
    latest: HashMap<(u64, u64), u64>,
    /// Updating, when rows are written or kept: key → the last row itself.
    latest_rows: HashMap<(u64, u64), R>,
    lines: Vec<u8>,
    kept: Vec<String>,
}

impl<R: Row> RowSink<R> {
    fn take(&mut self, r: &R) -> Result<(), Halt> {
        let hash = hash_of(r);
        self.digest.add(hash);
        if self.out.keep {
            self.kept.push(serde_json::to_string(r).map_err(|e| Halt::failed(e.to_string()))?);
        }
        if let Some(json) = &self.out.json {
            serde_json::to_writer(&mut self.lines, r).map_err(|e| Halt::failed(e.to_string()))?;
            self.lines.push(b'\n');
            if self.lines.len() >= JSON_FLUSH_BYTES {
                let mut w = json.lock().unwrap_or_else(|e| e.into_inner());
                w.write_all(&self.lines).map_err(|e| Halt::failed(format!("writing rows: {e}")))?;
                self.lines.clear();
            }
        }
        Ok(())
    }
}

impl<R: Row> Sink<R> for RowSink<R> {
    fn write(&mut self, r: &R) -> Result<(), Halt> {
        self.emitted += 1;
        match r.key() {
            None => self.take(r),
            Some(key) => {
                self.latest.insert(key, hash_of(r));
                if self.out.keep || self.out.json.is_some() {
                    self.latest_rows.insert(key, r.clone());
                }
                Ok(())
            }
        }
    }

    fn finish(&mut self) -> Result<(), Halt> {
        let mut rows = std::mem::take(&mut self.latest_rows);
        for (key, hash) in std::mem::take(&mut self.latest) {
            match rows.remove(&key) {
                Some(r) => self.take(&r)?,
                None => self.digest.add(hash),
            }
        }
        if let Some(json) = &self.out.json {
            let mut w = json.lock().unwrap_or_else(|e| e.into_inner());
            w.write_all(&self.lines)
                .and_then(|()| w.flush())
                .map_err(|e| Halt::failed(format!("writing rows: {e}")))?;
            self.lines.clear();
        }
        let mut shared = self.out.lock();
        shared.digest.merge(self.digest);
        shared.emitted += self.emitted;
        shared.rows.append(&mut self.kept);
        Ok(())
    }
}

/// The result of an updating query from all its rows in order: the last row per key.
pub fn upsert<R: Row>(rows: impl IntoIterator<Item = R>) -> Vec<R> {
    let mut latest: HashMap<(u64, u64), R> = HashMap::default();
    let mut append = Vec::new();
    for r in rows {
        match r.key() {
            Some(k) => {
                latest.insert(k, r);
            }
            None => append.push(r),
        }
    }
    append.extend(latest.into_values());
    append
}
