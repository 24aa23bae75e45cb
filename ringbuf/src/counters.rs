//! The counters file: a job's live numbers in shared memory (Aeron's CnC idea).
//!
//! One file per job in its run directory. Each counter has a metadata record (what it is,
//! whose it is) and a value alone on its own 128-byte line, written with relaxed stores by
//! the one thread that owns it. A reader maps the file read-only and needs nothing from
//! the job: it works while the job is stuck, and after it died (the pid tells which).
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
//!                                        0  4  kind (CounterKind)
//!                                        4  4  (reserved)
//!                                        8 56  owner (subtask "map#0", channel "map#0->sink#1", "job")
//!                                       64 64  label (free text)
//!    128 + capacity * 128   capacity * 128   values: u64 at the start of each 128-byte line
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// "WEIRCNT\0" as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"WEIRCNT\0");
/// Layout version of the counters file.
pub const VERSION: u32 = 1;
const HEADER_BYTES: usize = 128;
const RECORD_BYTES: usize = 128;
const OWNER_BYTES: usize = 56;
const LABEL_BYTES: usize = 64;
const NAME_BYTES: usize = 84;

/// What a counter measures. The number is stored in the file: append only.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CounterKind {
    /// Subtask: ns spent processing.
    BusyNs = 1,
    /// Subtask: ns spent waiting for credit on an output.
    BackpressuredNs = 2,
    /// Subtask: ns spent waiting for input.
    IdleNs = 3,
    /// Subtask: records read from inputs (or produced, for a source).
    RecordsIn = 4,
    /// Subtask: records written to outputs (or consumed, for a sink).
    RecordsOut = 5,
    /// Channel: slots in the ring.
    ChannelSlots = 10,
    /// Channel: used slots as the sender last saw them.
    ChannelBacklog = 11,
    /// Channel: free slots as the sender last saw them.
    ChannelCredit = 12,
    /// Channel: ns the sender was blocked on this channel.
    ChannelBlockedNs = 13,
    /// Job: resident set size, bytes.
    RssBytes = 20,
    /// Job: declared memory budget, bytes.
    BudgetBytes = 21,
    /// Job: 1 while running, 2 finished, 3 failed.
    JobState = 22,
    /// Subtask: 1 while running, 2 finished.
    SubtaskState = 23,
    /// Operator (windows): late records dropped.
    LateRecords = 30,
    /// Job: id of the last completed checkpoint (0: none yet).
    CheckpointId = 40,
    /// Job: duration of the last completed checkpoint, trigger to manifest, ns.
    CheckpointDurationNs = 41,
    /// Job: the longest barrier alignment of the last completed checkpoint, ns.
    CheckpointAlignmentNs = 42,
    /// Job: bytes the last completed checkpoint wrote (state files and blobs).
    CheckpointBytes = 43,
    /// Job: checkpoints completed.
    CheckpointsCompleted = 44,
    /// Job: checkpoints expired (timeout) or declined (a snapshot failed).
    CheckpointsFailed = 45,
    /// Source partition (owner `node[partition]`): consumer lag, records behind the end.
    SourceLag = 50,
    /// Sink node (all its subtasks): records taken.
    SinkRecords = 60,
    /// Sink node: records the destination acknowledged (HTTP 2xx, Kafka delivery report).
    SinkAcked = 61,
    /// Sink node: requests (HTTP batches, Kafka records) sent and not yet acknowledged.
    SinkInFlight = 62,
    /// Sink node: retries (HTTP) or client errors recovered from.
    SinkRetries = 63,
    /// Sink node: records sent to a dead-letter destination.
    SinkDeadLetters = 64,
    /// Sink node: ns its subtasks waited for the destination (in-flight bound, full queue).
    SinkBlockedNs = 65,
    /// Sink node: acknowledgement latency (sent to acknowledged), median of the last
    /// completed second, µs.
    SinkAckP50Us = 66,
    /// Sink node: the same, 99th percentile.
    SinkAckP99Us = 67,
    /// Sink node: the same, maximum.
    SinkAckMaxUs = 68,
    /// Anything else (the label says what).
    Other = 99,
}

impl CounterKind {
    /// The kind for a stored number.
    pub fn from_u32(v: u32) -> Option<CounterKind> {
        use CounterKind::*;
        Some(match v {
            1 => BusyNs,
            2 => BackpressuredNs,
            3 => IdleNs,
            4 => RecordsIn,
            5 => RecordsOut,
            10 => ChannelSlots,
            11 => ChannelBacklog,
            12 => ChannelCredit,
            13 => ChannelBlockedNs,
            20 => RssBytes,
            21 => BudgetBytes,
            22 => JobState,
            23 => SubtaskState,
            30 => LateRecords,
            40 => CheckpointId,
            41 => CheckpointDurationNs,
            42 => CheckpointAlignmentNs,
            43 => CheckpointBytes,
            44 => CheckpointsCompleted,
            45 => CheckpointsFailed,
            50 => SourceLag,
            60 => SinkRecords,
            61 => SinkAcked,
            62 => SinkInFlight,
            63 => SinkRetries,
            64 => SinkDeadLetters,
            65 => SinkBlockedNs,
            66 => SinkAckP50Us,
            67 => SinkAckP99Us,
            68 => SinkAckMaxUs,
            99 => Other,
            _ => return None,
        })
    }
}

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
    /// All counters are allocated.
    #[error("counters file full: {capacity} counters allocated; raise the capacity")]
    Full {
        /// Its capacity.
        capacity: u32,
    },
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
    capacity: u32,
    next: std::sync::Mutex<u32>,
    path: PathBuf,
}

/// One counter's value, owned by one thread. Cheap to pass around; valid while its
/// [`CountersWriter`] lives (hold an `Arc` of the writer to be sure).
#[derive(Debug, Clone, Copy)]
pub struct Counter {
    value: *const AtomicU64,
}

// SAFETY: a Counter points at an AtomicU64 in a mapping that outlives it (the writer is held
// in an Arc by every owner of counters); atomics may be used from any thread.
unsafe impl Send for Counter {}
// SAFETY: as above.
unsafe impl Sync for Counter {}

impl Counter {
    /// A counter that goes nowhere (for code paths with no counters file).
    pub fn detached() -> Counter {
        static SINK: AtomicU64 = AtomicU64::new(0);
        Counter { value: &SINK }
    }

    #[inline]
    fn atomic(&self) -> &AtomicU64 {
        // SAFETY: see the `Send` impl: the mapping outlives every Counter made from it.
        unsafe { &*self.value }
    }

    /// Set the value (relaxed: one writer, readers want a recent value, not an ordering).
    #[inline]
    pub fn set(&self, v: u64) {
        self.atomic().store(v, Ordering::Relaxed);
    }

    /// Add to the value. Owner-only: a load and a store, not an RMW.
    #[inline]
    pub fn add(&self, v: u64) {
        let a = self.atomic();
        a.store(a.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
    }

    /// The value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.atomic().load(Ordering::Relaxed)
    }
}

fn put_str(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len());
    // Cut at a char boundary so the stored text stays valid UTF-8.
    let n = (0..=n).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(src: &[u8]) -> String {
    let end = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    String::from_utf8_lossy(&src[..end]).into_owned()
}

impl CountersWriter {
    /// Create the counters file at `path` (O_EXCL, 0600; the directory is made 0700).
    pub fn create(path: impl AsRef<Path>, job: &str, capacity: u32) -> Result<CountersWriter, CountersError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let path = path.as_ref();
        let io = |source| CountersError::Io { path: path.to_owned(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(io)?;
        file.set_len(file_bytes(capacity as usize) as u64).map_err(io)?;
        // SAFETY: a file we just created; readers map it read-only and only load atomics.
        let mut map = unsafe { memmap2::MmapOptions::new().map_mut(&file) }.map_err(io)?;
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
        let writer = CountersWriter { map, capacity, next: std::sync::Mutex::new(0), path: path.to_owned() };
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

    /// Allocate a counter (control plane: at job start).
    pub fn allocate(&self, kind: CounterKind, owner: &str, label: &str) -> Result<Counter, CountersError> {
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
        record[..4].copy_from_slice(&(kind as u32).to_le_bytes());
        put_str(&mut record[8..8 + OWNER_BYTES], owner);
        put_str(&mut record[64..64 + LABEL_BYTES], label);
        *next += 1;
        // SYNC POINT Release: pairs with the Acquire load of `allocated` in CountersReader::snapshot.
        self.word32(40).store(*next, Ordering::Release);
        let value = self.word64(values_offset(self.capacity as usize) + id * RECORD_BYTES);
        Ok(Counter { value })
    }
}

/// One counter as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterValue {
    /// What it measures.
    pub kind: CounterKind,
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
    /// Map `path` read-only and check its header.
    pub fn open(path: impl AsRef<Path>) -> Result<CountersReader, CountersError> {
        let path = path.as_ref();
        let io = |source| CountersError::Io { path: path.to_owned(), source };
        let fmt = |what: String| CountersError::Format { path: path.to_owned(), what };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: mapped read-only; every word we read is read as an atomic or validated.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        if map.len() < HEADER_BYTES {
            return Err(fmt(format!("{} bytes, shorter than the header", map.len())));
        }
        // SAFETY: offset 0 is 8-aligned and inside the mapping.
        let magic = unsafe { &*(map.as_ptr() as *const AtomicU64) }.load(Ordering::Acquire);
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
        // SYNC POINT Acquire: pairs with the Release store in CountersWriter::allocate.
        let n = (allocated.load(Ordering::Acquire) as usize).min(self.capacity);
        (0..n)
            .filter_map(|id| {
                let meta = &self.map[HEADER_BYTES + id * RECORD_BYTES..][..RECORD_BYTES];
                let kind = CounterKind::from_u32(u32::from_le_bytes(meta[..4].try_into().ok()?))?;
                let offset = values_offset(self.capacity) + id * RECORD_BYTES;
                // SAFETY: inside the mapping (id < capacity, length checked at open), 8-aligned.
                let value = unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU64) }.load(Ordering::Relaxed);
                Some(CounterValue {
                    kind,
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
        let a = w.allocate(CounterKind::BusyNs, "map#0", "busy").unwrap();
        let b = w.allocate(CounterKind::RecordsIn, "map#0", "in").unwrap();
        a.add(5);
        a.add(7);
        b.set(3);
        let r = CountersReader::open(&path).unwrap();
        assert_eq!(r.job, "job-x");
        assert!(r.job_alive());
        let snap = r.snapshot();
        assert_eq!(snap.len(), 2);
        assert_eq!(
            snap[0],
            CounterValue { kind: CounterKind::BusyNs, owner: "map#0".into(), label: "busy".into(), value: 12 }
        );
        assert_eq!(snap[1].value, 3);
        w.allocate(CounterKind::Other, "x", "y").unwrap();
        w.allocate(CounterKind::Other, "x", "y").unwrap();
        assert!(matches!(w.allocate(CounterKind::Other, "x", "y"), Err(CountersError::Full { capacity: 4 })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// One subtask's share of an interval, from two snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct SubtaskView {
    /// `node#index`.
    pub owner: String,
    /// Share of the interval processing, 0..=1.
    pub busy: f64,
    /// Share waiting for credit.
    pub backpressured: f64,
    /// Share waiting for input.
    pub idle: f64,
    /// Records into the chain per second.
    pub records_in_per_s: f64,
    /// Records into the chain, total.
    pub records_in: u64,
    /// 1 running, 2 finished, 3 failed.
    pub state: u64,
}

/// One channel now (fill) and over the interval (blocked share).
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelView {
    /// `sender#i->receiver#j`.
    pub owner: String,
    /// Slots in the ring.
    pub slots: u64,
    /// Used slots, as the sender last saw them.
    pub backlog: u64,
    /// Free slots.
    pub credit: u64,
    /// Share of the interval the sender was blocked on this channel.
    pub blocked: f64,
}

/// A job's numbers over an interval: what `weir-stat` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct StatView {
    /// Interval length, seconds.
    pub interval_s: f64,
    /// Per subtask.
    pub subtasks: Vec<SubtaskView>,
    /// Per channel.
    pub channels: Vec<ChannelView>,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Budget, bytes.
    pub budget_bytes: u64,
    /// 1 running, 2 finished, 3 failed.
    pub job_state: u64,
    /// Checkpoints (all zero when the job takes none).
    pub checkpoints: CheckpointView,
    /// Consumer lag per source partition (`node[partition]`, records), as last published.
    pub lags: Vec<(String, u64)>,
    /// Per sink node that publishes its figures (connectors).
    pub sinks: Vec<SinkView>,
}

/// One sink node's figures, as the counters last say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SinkView {
    /// The sink node.
    pub node: String,
    /// Records taken, in all.
    pub records: u64,
    /// Records acknowledged by the destination, in all, and per second over the interval.
    pub acked: u64,
    /// Acknowledged records per second over the interval.
    pub acked_per_s: f64,
    /// Requests outstanding now.
    pub in_flight: u64,
    /// Retries, in all.
    pub retries: u64,
    /// Records dead-lettered, in all.
    pub dead_letters: u64,
    /// Share of the interval its subtasks waited for the destination (summed over subtasks).
    pub blocked: f64,
    /// Acknowledgement latency of the last completed second, µs: median, 99th, max.
    pub ack_p50_us: u64,
    /// 99th percentile.
    pub ack_p99_us: u64,
    /// Maximum.
    pub ack_max_us: u64,
}

/// The job's checkpoints, as the counters last say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointView {
    /// Id of the last completed checkpoint (0: none).
    pub last_id: u64,
    /// Its duration, trigger to manifest, ns.
    pub duration_ns: u64,
    /// Its longest barrier alignment, ns.
    pub alignment_ns: u64,
    /// Bytes it wrote.
    pub bytes: u64,
    /// Checkpoints completed.
    pub completed: u64,
    /// Checkpoints expired or declined.
    pub failed: u64,
}

impl StatView {
    /// Compare two snapshots taken `interval_s` apart.
    pub fn between(before: &[CounterValue], after: &[CounterValue], interval_s: f64) -> StatView {
        use std::collections::BTreeMap;
        let old: std::collections::HashMap<(CounterKind, &str), u64> =
            before.iter().map(|c| ((c.kind, c.owner.as_str()), c.value)).collect();
        let delta =
            |c: &CounterValue| c.value.saturating_sub(old.get(&(c.kind, c.owner.as_str())).copied().unwrap_or(0));
        let ns = (interval_s * 1e9).max(1.0);
        // A share of the interval: counters are sampled, not frozen, so clamp small overshoots.
        let share = |v: u64| (v as f64 / ns).min(1.0);
        let mut subtasks: BTreeMap<String, SubtaskView> = BTreeMap::new();
        let mut channels: BTreeMap<String, ChannelView> = BTreeMap::new();
        let mut view = StatView {
            interval_s,
            subtasks: vec![],
            channels: vec![],
            rss_bytes: 0,
            budget_bytes: 0,
            job_state: 0,
            checkpoints: CheckpointView::default(),
            lags: Vec::new(),
            sinks: Vec::new(),
        };
        let mut sinks: BTreeMap<String, SinkView> = BTreeMap::new();
        // A subtask has busy/idle/backpressured counters; node-level in/out counters share the
        // owner name of a chain head, so a subtask's records-in is told apart by its label.
        for c in after {
            let o = c.owner.as_str();
            match c.kind {
                CounterKind::BusyNs => subtask(&mut subtasks, o).busy = share(delta(c)),
                CounterKind::BackpressuredNs => subtask(&mut subtasks, o).backpressured = share(delta(c)),
                CounterKind::IdleNs => subtask(&mut subtasks, o).idle = share(delta(c)),
                CounterKind::SubtaskState => subtask(&mut subtasks, o).state = c.value,
                CounterKind::RecordsIn if c.label.starts_with("records into") => {
                    let s = subtask(&mut subtasks, o);
                    s.records_in = c.value;
                    s.records_in_per_s = delta(c) as f64 / interval_s.max(1e-9);
                }
                CounterKind::ChannelSlots => channel(&mut channels, o).slots = c.value,
                CounterKind::ChannelBacklog => channel(&mut channels, o).backlog = c.value,
                CounterKind::ChannelCredit => channel(&mut channels, o).credit = c.value,
                CounterKind::ChannelBlockedNs => channel(&mut channels, o).blocked = share(delta(c)),
                CounterKind::RssBytes => view.rss_bytes = c.value,
                CounterKind::BudgetBytes => view.budget_bytes = c.value,
                CounterKind::JobState => view.job_state = c.value,
                CounterKind::CheckpointId => view.checkpoints.last_id = c.value,
                CounterKind::CheckpointDurationNs => view.checkpoints.duration_ns = c.value,
                CounterKind::CheckpointAlignmentNs => view.checkpoints.alignment_ns = c.value,
                CounterKind::CheckpointBytes => view.checkpoints.bytes = c.value,
                CounterKind::CheckpointsCompleted => view.checkpoints.completed = c.value,
                CounterKind::CheckpointsFailed => view.checkpoints.failed = c.value,
                CounterKind::SourceLag => view.lags.push((c.owner.clone(), c.value)),
                CounterKind::SinkRecords
                | CounterKind::SinkAcked
                | CounterKind::SinkInFlight
                | CounterKind::SinkRetries
                | CounterKind::SinkDeadLetters
                | CounterKind::SinkBlockedNs
                | CounterKind::SinkAckP50Us
                | CounterKind::SinkAckP99Us
                | CounterKind::SinkAckMaxUs => {
                    let s = sinks
                        .entry(o.to_owned())
                        .or_insert_with(|| SinkView { node: o.to_owned(), ..SinkView::default() });
                    match c.kind {
                        CounterKind::SinkRecords => s.records = c.value,
                        CounterKind::SinkAcked => {
                            s.acked = c.value;
                            s.acked_per_s = delta(c) as f64 / interval_s.max(1e-9);
                        }
                        CounterKind::SinkInFlight => s.in_flight = c.value,
                        CounterKind::SinkRetries => s.retries = c.value,
                        CounterKind::SinkDeadLetters => s.dead_letters = c.value,
                        CounterKind::SinkBlockedNs => s.blocked = delta(c) as f64 / ns,
                        CounterKind::SinkAckP50Us => s.ack_p50_us = c.value,
                        CounterKind::SinkAckP99Us => s.ack_p99_us = c.value,
                        _ => s.ack_max_us = c.value,
                    }
                }
                _ => {}
            }
        }
        // Busy is what is neither idle nor backpressured (as Flink derives it): a subtask stuck
        // inside an operator's own code updates no counter, yet it is busy.
        for s in subtasks.values_mut() {
            if s.state == 1 {
                s.busy = (1.0 - s.idle - s.backpressured).max(0.0);
            }
        }
        // Lag counters are allocated as partitions become known: list them by node, then
        // partition number.
        view.lags.sort_by_key(|(owner, _)| {
            let (node, rest) = owner.split_once('[').unwrap_or((owner, ""));
            (node.to_owned(), rest.trim_end_matches(']').parse::<u64>().unwrap_or(u64::MAX))
        });
        view.subtasks = subtasks.into_values().collect();
        view.channels = channels.into_values().collect();
        view.sinks = sinks.into_values().collect();
        view
    }
}

fn subtask<'a>(m: &'a mut std::collections::BTreeMap<String, SubtaskView>, owner: &str) -> &'a mut SubtaskView {
    m.entry(owner.to_owned()).or_insert_with(|| SubtaskView {
        owner: owner.to_owned(),
        busy: 0.0,
        backpressured: 0.0,
        idle: 0.0,
        records_in_per_s: 0.0,
        records_in: 0,
        state: 0,
    })
}

fn channel<'a>(m: &'a mut std::collections::BTreeMap<String, ChannelView>, owner: &str) -> &'a mut ChannelView {
    m.entry(owner.to_owned()).or_insert_with(|| ChannelView {
        owner: owner.to_owned(),
        slots: 0,
        backlog: 0,
        credit: 0,
        blocked: 0.0,
    })
}
