//! The counters file: a job's live numbers in shared memory (Aeron's CnC idea).
//!
//! One file per job in its run directory. Each counter has a metadata record (a type id,
//! whose it is, a label) and a value alone on its own 128-byte line, written with relaxed
//! stores by the one thread that owns it. A reader maps the file read-only and needs nothing
//! from the job: it works while the job is stuck, and after it died (the pid tells which).
//!
//! This file is generic: the type ids are the writer's vocabulary (weir's engine defines
//! its counter kinds in `weir::telemetry`), not this crate's.
//!
//! A [`Counter`] borrows its writer, so it cannot outlive the mapping it points into:
//!
//! ```compile_fail,E0505
//! use weir_ring::counters::CountersWriter;
//! let path = std::env::temp_dir().join("weir-doc-counters-compile-fail");
//! let writer = CountersWriter::create(&path, "job", 4).unwrap();
//! let counter = writer.allocate(1, "map#0", "records").unwrap();
//! drop(writer); // error: `writer` is borrowed by `counter`
//! counter.add(1);
//! ```
//!
//! A thread that outlives the scope that allocated its counters holds [`SharedCounter`]s
//! instead: each keeps the writer, and so the mapping, alive.
//!
//! ```text
//! offset                       size   field
//!      0                          8   magic "WEIRCNT\0" (written last, Release)
//!      8                          4   version
//!     12                          4   capacity (counters)
//!     16                          4   pid of the job
//!     20                          4   (reserved)
//!     24                          8   pid start ticks
//!     32                          8   job start, CLOCK_REALTIME ms
//!     40                          4   allocated (counters in use; Release after each record)
//!     44                         84   job name, UTF-8, zero padded
//!    128         capacity * 128      metadata records:
//!                                        0  4  type id (the writer's; 0: none)
//!                                        4  4  (reserved)
//!                                        8 56  owner (subtask "map#0", channel "map#0->sink#1", "job")
//!                                       64 64  label (free text)
//!    128 + capacity * 128   capacity * 128   values: u64 at the start of each 128-byte line
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// "WEIRCNT\0" as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"WEIRCNT\0");
/// Layout version of the counters file. 2: the type ids are the writer's (weir's engine
/// moved subtask records-in to its own id and added evicted keys), so a reader of another
/// version refuses the file instead of misreading it. 3: weir's engine counts a fourth
/// state of a subtask's time (waiting on the outside) apart from busy, and latency
/// timestamps: a reader of version 2 would read a stuck sink's waiting as nothing.
pub const VERSION: u32 = 3;
const HEADER_BYTES: usize = 128;
const RECORD_BYTES: usize = 128;
/// The bytes a counter's owner holds; a longer owner is cut (at a char boundary).
pub const OWNER_BYTES: usize = 56;
const LABEL_BYTES: usize = 64;
const NAME_BYTES: usize = 84;

/// Errors opening or creating a counters file.
#[derive(Debug, thiserror::Error)]
pub enum CountersError {
    /// A system call failed.
    #[error("counters file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Not a counters file of this version.
    #[error(
        "counters file {path}: {what}; is this a weir counters file of this version? (the job may have been started by another weir build)"
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
    /// The path is not a regular file (a FIFO, a device, a directory): refused unread.
    #[error("{path}: {what}, not a counters file; pass a job's counters file or its run directory")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// All counters are allocated.
    #[error("counters file full: {capacity} counters allocated; raise the capacity")]
    Full {
        /// Its capacity.
        capacity: u32,
    },
    /// The file could not be created for this user alone.
    #[error("counters file: {0}")]
    Create(#[from] crate::private_file::PrivateFileError),
}

fn values_offset(capacity: usize) -> usize {
    HEADER_BYTES + capacity * RECORD_BYTES
}

fn file_bytes(capacity: usize) -> usize {
    values_offset(capacity) + capacity * RECORD_BYTES
}

/// The job's side: creates the file and allocates counters.
#[derive(Debug)]
pub struct CountersWriter {
    map: memmap2::MmapMut,
    /// The sealed memory (see `create`): open while the writer lives, so the link at `path`
    /// reaches it.
    _file: std::fs::File,
    capacity: u32,
    next: std::sync::Mutex<u32>,
    path: PathBuf,
}

/// One counter's value, owned by one thread, borrowed from its [`CountersWriter`] (so it
/// cannot outlive the mapping).
#[derive(Debug, Clone, Copy)]
pub struct Counter<'a> {
    cell: &'a AtomicU64,
}

impl Counter<'_> {
    /// Set the value (relaxed: one writer, readers want a recent value, not an ordering).
    #[inline]
    pub fn set(&self, v: u64) {
        self.cell.store(v, Ordering::Relaxed);
    }

    /// Add to the value. Owner-only: a load and a store, not an RMW.
    #[inline]
    pub fn add(&self, v: u64) {
        self.cell.store(self.cell.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }

    /// The value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.cell.load(Ordering::Relaxed)
    }
}

/// A counter that keeps its counters file mapped: for threads that outlive the scope that
/// allocated it (a job's subtasks). Cloning it is cheap (a reference count).
#[derive(Clone)]
pub struct SharedCounter {
    /// Inside the mapping `_file` keeps alive, or the static of [`SharedCounter::detached`].
    cell: std::ptr::NonNull<AtomicU64>,
    _file: Option<std::sync::Arc<CountersWriter>>,
}

// SAFETY: `cell` points into the mapping that `_file` keeps alive (or into a static), so it
// is valid wherever the SharedCounter goes; it is an atomic, usable from any thread.
unsafe impl Send for SharedCounter {}
// SAFETY: as above: every access is an atomic operation.
unsafe impl Sync for SharedCounter {}

impl std::fmt::Debug for SharedCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCounter").field("value", &self.get()).finish()
    }
}

impl SharedCounter {
    /// A counter that goes nowhere (for code paths with no counters file). Every detached
    /// counter shares one word: what it says is meaningless.
    pub fn detached() -> SharedCounter {
        static SINK: AtomicU64 = AtomicU64::new(0);
        SharedCounter { cell: std::ptr::NonNull::from(&SINK), _file: None }
    }

    /// The counter, borrowed.
    #[inline]
    pub fn counter(&self) -> Counter<'_> {
        // SAFETY: valid while `self` lives (see the `Send` impl).
        Counter { cell: unsafe { self.cell.as_ref() } }
    }

    /// Set the value (relaxed: one writer, readers want a recent value, not an ordering).
    #[inline]
    pub fn set(&self, v: u64) {
        self.counter().set(v);
    }

    /// Add to the value. Owner-only: a load and a store, not an RMW.
    #[inline]
    pub fn add(&self, v: u64) {
        self.counter().add(v);
    }

    /// The value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.counter().get()
    }
}

fn put_str(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len());
    // Cut at a char boundary so the stored text stays valid UTF-8.
    let n = (0..=n).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// A name from the file, as a reader shows it: any writer (any process of this user) can
/// put bytes there, so control characters (a terminal's escape sequences) become U+FFFD.
fn get_str(src: &[u8]) -> String {
    let end = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    String::from_utf8_lossy(&src[..end]).chars().map(|c| if c.is_control() { '\u{FFFD}' } else { c }).collect()
}

impl CountersWriter {
    /// Create the counters file at `path`, for this user alone, as sealed shared memory
    /// ([`create_sealed`](crate::private_file::create_sealed): a memfd that cannot be
    /// truncated, linked at `path` in a directory that is 0700 and ours, never over an
    /// existing name). Once mapped, it is sealed against writes from anyone else: another
    /// process can read it (`weir-stat`), but neither kill the job with SIGBUS by truncating
    /// it nor change what the job counts.
    pub fn create(path: impl AsRef<Path>, job: &str, capacity: u32) -> Result<CountersWriter, CountersError> {
        let path = path.as_ref();
        let io = |source| CountersError::Io { path: path.to_owned(), source };
        let file = crate::private_file::create_sealed(path, file_bytes(capacity as usize) as u64)?;
        // SAFETY: memory we just created and sealed against resizing; readers map it
        // read-only and only load atomics.
        let mut map = unsafe { memmap2::MmapOptions::new().map_mut(&file) }.map_err(io)?;
        crate::private_file::seal_writes(&file).map_err(io)?;
        let pid = crate::process::pid();
        map[8..12].copy_from_slice(&VERSION.to_le_bytes());
        map[12..16].copy_from_slice(&capacity.to_le_bytes());
        map[16..20].copy_from_slice(&pid.to_le_bytes());
        map[24..32].copy_from_slice(&crate::process::start_ticks(pid).unwrap_or(0).to_le_bytes());
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        map[32..40].copy_from_slice(&now_ms.to_le_bytes());
        put_str(&mut map[44..44 + NAME_BYTES], job);
        let writer =
            CountersWriter { map, _file: file, capacity, next: std::sync::Mutex::new(0), path: path.to_owned() };
        // SYNC POINT Release: pairs with the Acquire load of the magic in CountersReader::open.
        writer.word64(0).store(MAGIC, Ordering::Release);
        Ok(writer)
    }

    fn word64(&self, offset: usize) -> &AtomicU64 {
        assert!(offset + 8 <= self.map.len() && offset.is_multiple_of(8));
        // SAFETY: in bounds and 8-aligned (checked above; the mapping is page aligned).
        unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU64) }
    }

    fn word32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset + 4 <= self.map.len() && offset.is_multiple_of(4));
        // SAFETY: in bounds and 4-aligned (checked above).
        unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU32) }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Allocate a counter (control plane: at job start) of type `type_id` (the writer's
    /// vocabulary), owned by `owner` (a subtask `map#0`, a channel `map#0->sink#1`, `job`).
    pub fn allocate(&self, type_id: u32, owner: &str, label: &str) -> Result<Counter<'_>, CountersError> {
        let offset = self.allocate_cell(type_id, owner, label)?;
        Ok(Counter { cell: self.word64(offset) })
    }

    /// [`allocate`](CountersWriter::allocate) a counter that keeps this writer alive.
    pub fn allocate_shared(
        self: &std::sync::Arc<Self>,
        type_id: u32,
        owner: &str,
        label: &str,
    ) -> Result<SharedCounter, CountersError> {
        let offset = self.allocate_cell(type_id, owner, label)?;
        Ok(SharedCounter { cell: std::ptr::NonNull::from(self.word64(offset)), _file: Some(self.clone()) })
    }

    /// Write the next metadata record and publish it; the offset of its value.
    fn allocate_cell(&self, type_id: u32, owner: &str, label: &str) -> Result<usize, CountersError> {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        if *next >= self.capacity {
            return Err(CountersError::Full { capacity: self.capacity });
        }
        let id = *next as usize;
        let meta = HEADER_BYTES + id * RECORD_BYTES;
        // Metadata bytes are written before `allocated` is published with Release.
        // SAFETY: the record lies inside the mapping (id < capacity) and no reader looks at it
        // before `allocated` covers it; we hold the allocation lock.
        let record = unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(meta) as *mut u8, RECORD_BYTES) };
        record[..4].copy_from_slice(&type_id.to_le_bytes());
        put_str(&mut record[8..8 + OWNER_BYTES], owner);
        put_str(&mut record[64..64 + LABEL_BYTES], label);
        *next += 1;
        // SYNC POINT Release: pairs with the Acquire fence after the load of `allocated` in
        // CountersReader::snapshot.
        self.word32(40).store(*next, Ordering::Release);
        Ok(values_offset(self.capacity as usize) + id * RECORD_BYTES)
    }

    /// Counters allocated so far.
    pub fn allocated(&self) -> u32 {
        *self.next.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counters the file holds.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}

/// One counter as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterValue {
    /// What it measures: the writer's type id.
    pub type_id: u32,
    /// Whose it is.
    pub owner: String,
    /// Free text.
    pub label: String,
    /// Its value.
    pub value: u64,
}

/// A read-only view of a counters file (for `weir-stat`).
#[derive(Debug)]
pub struct CountersReader {
    map: memmap2::Mmap,
    capacity: usize,
    /// Pid of the job that writes the file.
    pub pid: u32,
    /// Start ticks of that process.
    pub start_ticks: u64,
    /// Job name.
    pub job: String,
    /// Job start, ms since the Unix epoch.
    pub started_ms: u64,
}

impl CountersReader {
    /// Map `path` read-only and check its header. Anything but a regular file (a FIFO, a
    /// device, a directory) is refused without blocking: opened non-blocking, checked before
    /// anything is read.
    pub fn open(path: impl AsRef<Path>) -> Result<CountersReader, CountersError> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let path = path.as_ref();
        let io = |source| CountersError::Io { path: path.to_owned(), source };
        let fmt = |what: String| CountersError::Format { path: path.to_owned(), what };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
            .map_err(io)?;
        let kind = file.metadata().map_err(io)?.file_type();
        if !kind.is_file() {
            let what = if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_dir() {
                "a directory"
            } else if kind.is_socket() {
                "a socket"
            } else if kind.is_char_device() || kind.is_block_device() {
                "a device"
            } else {
                "not a regular file"
            };
            return Err(CountersError::NotAFile { path: path.to_owned(), what });
        }
        // SAFETY: mapped read-only; every word we read is read as an atomic or validated.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        if map.len() < HEADER_BYTES {
            return Err(fmt(format!("{} bytes, shorter than the header", map.len())));
        }
        // SAFETY: offset 0 is 8-aligned and inside the mapping.
        let magic = unsafe { &*(map.as_ptr() as *const AtomicU64) }.load(Ordering::Relaxed);
        // SYNC POINT Acquire (a fence: an Acquire load is not allowed on a read-only mapping):
        // pairs with the Release store of the magic in CountersWriter::create.
        std::sync::atomic::fence(Ordering::Acquire);
        if magic != MAGIC {
            return Err(fmt(format!("magic {magic:#x}")));
        }
        let u32_at = |o: usize| u32::from_le_bytes(map[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(map[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(8);
        if version != VERSION {
            return Err(fmt(format!("version {version}, this build reads {VERSION}")));
        }
        let capacity = u32_at(12) as usize;
        if map.len() != file_bytes(capacity) {
            return Err(fmt(format!("{} bytes, capacity {capacity} needs {}", map.len(), file_bytes(capacity))));
        }
        Ok(CountersReader {
            pid: u32_at(16),
            start_ticks: u64_at(24),
            started_ms: u64_at(32),
            job: get_str(&map[44..44 + NAME_BYTES]),
            capacity,
            map,
        })
    }

    /// Whether the job that writes the file still runs.
    pub fn job_alive(&self) -> bool {
        crate::process::alive(self.pid, self.start_ticks)
    }

    /// Every allocated counter, now.
    pub fn snapshot(&self) -> Vec<CounterValue> {
        // SAFETY: offset 40 is 4-aligned and inside the header.
        let allocated = unsafe { &*(self.map.as_ptr().add(40) as *const AtomicU32) };
        let n = (allocated.load(Ordering::Relaxed) as usize).min(self.capacity);
        // SYNC POINT Acquire (a fence, as the mapping is read-only): pairs with the Release
        // store of `allocated` in CountersWriter::allocate_cell; the records below it are
        // complete.
        std::sync::atomic::fence(Ordering::Acquire);
        (0..n)
            .filter_map(|id| {
                let meta = &self.map[HEADER_BYTES + id * RECORD_BYTES..][..RECORD_BYTES];
                let type_id = u32::from_le_bytes(meta[..4].try_into().ok()?);
                let offset = values_offset(self.capacity) + id * RECORD_BYTES;
                // SAFETY: inside the mapping (id < capacity, length checked at open), 8-aligned.
                let value = unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU64) }.load(Ordering::Relaxed);
                Some(CounterValue {
                    type_id,
                    owner: get_str(&meta[8..8 + OWNER_BYTES]),
                    label: get_str(&meta[64..64 + LABEL_BYTES]),
                    value,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters written by the job are read back, with owner and label, by a reader.
    #[test]
    fn write_then_read() {
        let dir = std::env::temp_dir().join(format!("weir-counters-test-{}", std::process::id()));
        let path = dir.join("counters");
        let _ = std::fs::remove_file(&path);
        let w = CountersWriter::create(&path, "job-x", 4).unwrap();
        let a = w.allocate(1, "map#0", "busy").unwrap();
        let b = w.allocate(4, "map#0", "in").unwrap();
        a.add(5);
        a.add(7);
        b.set(3);
        let r = CountersReader::open(&path).unwrap();
        assert_eq!(r.job, "job-x");
        assert!(r.job_alive());
        let snap = r.snapshot();
        assert_eq!(snap.len(), 2);
        assert_eq!(snap[0], CounterValue { type_id: 1, owner: "map#0".into(), label: "busy".into(), value: 12 });
        assert_eq!(snap[1].value, 3);
        let w = std::sync::Arc::new(w);
        let shared = w.allocate_shared(99, "x", "y").unwrap();
        w.allocate(99, "x", "y").unwrap();
        assert!(matches!(w.allocate(99, "x", "y"), Err(CountersError::Full { capacity: 4 })));
        // A shared counter keeps the mapping: it still works once the writer's last other
        // owner is gone.
        drop(w);
        shared.add(41);
        shared.add(1);
        assert_eq!(shared.get(), 42);
        assert_eq!(r.snapshot()[2].value, 42);
        // A name with a terminal escape sequence is read back without it.
        let escaped = dir.join("escaped");
        let _ = std::fs::remove_file(&escaped);
        let w = CountersWriter::create(&escaped, "\x1b[2Jforged", 4).unwrap();
        w.allocate(1, "op\x1b]0;title\x07", "busy").unwrap();
        let r = CountersReader::open(&escaped).unwrap();
        assert_eq!(r.job, "\u{FFFD}[2Jforged");
        assert!(!r.snapshot()[0].owner.contains('\x1b'));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Truncating the file through its path (`> counters`, a stray `set_len`) fails instead
    /// of killing the writer with SIGBUS, and nobody else can write or map it writable:
    /// what the job counts is the job's.
    #[test]
    fn others_can_neither_truncate_nor_write_it() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("weir-counters-sealed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("counters");
        let w = CountersWriter::create(&path, "sealed", 4).unwrap();
        let c = w.allocate(1, "op#0", "busy").unwrap();
        c.add(1);
        let truncated = std::fs::OpenOptions::new().write(true).truncate(true).open(&path);
        assert!(truncated.is_err(), "O_TRUNC through the link is refused");
        if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(&path) {
            assert!(f.set_len(0).is_err() && f.set_len(1 << 30).is_err(), "no resizing");
            assert!(f.write(b"forged").is_err(), "no writes");
            // SAFETY: a test mapping that must fail.
            assert!(unsafe { memmap2::MmapOptions::new().map_mut(&f) }.is_err(), "no writable mapping");
        }
        c.add(1);
        let r = CountersReader::open(&path).unwrap();
        assert_eq!((r.job.as_str(), r.snapshot()[0].value), ("sealed", 2));
        assert!(CountersWriter::create(&path, "again", 4).is_err(), "an existing name is never replaced");
        use std::os::unix::fs::MetadataExt;
        let inode = |p: &std::path::Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
        let memfd = inode(&path);
        drop(w);
        // Tests run in parallel in this process: another may have reused the fd number
        // already, so the link may resolve again — but not to the counters' memfd.
        assert_ne!(inode(&path), memfd, "the link no longer leads to the counters once the writer is gone");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
