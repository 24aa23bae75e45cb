//! The file sink: appends records to part files through io_uring; part files become final at
//! checkpoint completion (exactly-once file output once checkpoints call the hooks).
//!
//! ```text
//!  write ──► filling buffer ──(full)──► one write in the kernel ──► part-<subtask>-<n>.inprogress
//!  prepare_commit(c) ──► flush, wait, fsync ──► the part is *pending* for checkpoint c
//!  commit(c)         ──► rename pending parts to part-<subtask>-<n>, fsync the directory
//!  finish            ──► prepare_commit + commit of everything
//! ```
//!
//! Two buffers: one being filled by `write`, one in the kernel. Only one write is in the
//! kernel at a time, so the file never has a hole: when a write fails, every byte before it
//! is on disk, and the part is cut back to the last completed write (a record boundary), so
//! the records written before stay intact and no torn record is left.
//!
//! A write or fsync error *poisons* the sink: the job fails with the file and the errno, and
//! every later call fails the same way. An fsync is never retried: after a failed fsync the
//! kernel may have dropped the dirty pages, and a second fsync that succeeds proves nothing
//! (the PostgreSQL "fsyncgate" lesson). Recovery restarts from the last checkpoint instead.
//!
//! Part numbers continue after the highest one this subtask already has in the directory, so
//! a restarted job never overwrites final output. A directory belongs to one sink node.

use super::uring::{Completion, Uring};
use super::{FORMAT_KEY, Format, TwoPhaseCommit};
use crate::io::poison::Poisoned;
use crate::operators::{Halt, OperatorFailure, Sink, SubtaskInfo, outside};
use crate::record::Record;
use crate::util::section::{Affects, JobFileError, Key, KeyType as T, REQUIRED, Section};
use crate::util::{errno_text, io_error_text};
use std::fmt::Display;
use std::fs::{File, OpenOptions};
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Tag of a data write.
const TAG_WRITE: u64 = 1;
/// Tag of an fsync.
const TAG_FSYNC: u64 = 2;

/// How long one write or fsync may take before the sink fails: a disk or a network
/// filesystem that hangs is a stuck destination too (a stop ends the wait sooner).
const IO_DEADLINE: Duration = Duration::from_secs(120);

/// Settings of a file sink (one per sink node; every subtask writes its own part files).
#[derive(Debug, Clone)]
pub struct FileSinkConfig {
    /// The directory for the part files; created if missing.
    pub dir: PathBuf,
    /// How records become bytes.
    pub format: Format,
    /// Bytes encoded before a write is issued; also the size of each of the two buffers
    /// (a larger record makes its buffer grow to fit it).
    pub buffer_bytes: usize,
    /// Shared totals of every subtask made from this configuration.
    pub stats: Arc<FileSinkStats>,
}

impl FileSinkConfig {
    /// Part files in `dir`, newline-delimited text, 256 KiB buffers.
    pub fn new(dir: impl Into<PathBuf>) -> FileSinkConfig {
        FileSinkConfig { dir: dir.into(), format: Format::Lines, buffer_bytes: 256 * 1024, stats: Arc::default() }
    }

    /// The keys of a file sink's job-file section (`type = "file"`).
    pub const KEYS: &'static [Key] = &[
        Key::new("path", T::String, REQUIRED, "The directory of the part files (`part-<subtask>-<n>`, made if missing): in-progress parts are hidden and become final when a checkpoint completes, or at the end.")
            .affects(Affects::Delivery),
        FORMAT_KEY,
    ];

    /// Read a file sink's job-file section.
    pub fn from_section(s: &mut Section) -> Result<FileSinkConfig, JobFileError> {
        let path = s.required::<String>("path", "the directory for the part files")?;
        if path.get_ref().trim().is_empty() {
            return Err(s.err(path.span(), "path", "an empty path; name the directory for the part files"));
        }
        Ok(FileSinkConfig { format: Format::from_section(s)?, ..FileSinkConfig::new(path.get_ref()) })
    }
}

/// Totals of a file sink's subtasks, readable while the job runs.
#[derive(Debug, Default)]
pub struct FileSinkStats {
    /// Records taken by `write`.
    pub records: AtomicU64,
    /// Bytes the kernel reported written.
    pub bytes_written: AtomicU64,
    /// fsyncs completed.
    pub fsyncs: AtomicU64,
    /// Part files made final.
    pub parts_committed: AtomicU64,
}

/// A part file being written.
#[derive(Debug)]
struct Part {
    file: File,
    inprogress: PathBuf,
    final_path: PathBuf,
    /// Bytes the kernel reported written (always a record boundary between writes).
    written_bytes: u64,
}

/// The one write in the kernel.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    /// File offset of the buffer's first byte.
    offset: u64,
    /// Bytes of the buffer the kernel has written so far (short writes are continued).
    done: usize,
}

/// Why a file sink failed. None is retryable: a failed write or fsync poisons the sink, and
/// recovery restarts the job from its last checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileSinkError {
    /// io_uring is unavailable (see the message for the setting that would allow it).
    #[error("file sink {sink}: {reason}")]
    Uring {
        /// The sink subtask (`node#index`).
        sink: String,
        /// Why.
        reason: String,
    },
    /// A file operation failed.
    #[error("file sink {sink}: {what} {}: {}{hint}", path.display(), io_error_text(source))]
    Io {
        /// The sink subtask.
        sink: String,
        /// What was attempted.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
        /// What may be behind it (empty or starting with a space).
        hint: &'static str,
    },
    /// A write failed; the part was cut back to its whole records.
    #[error(
        "file sink {sink}: write to {path} failed: {why}; the part keeps its first {kept_bytes} bytes \
         (whole records); the sink is poisoned, restart the job from its last checkpoint"
    )]
    Write {
        /// The sink subtask.
        sink: String,
        /// The part file.
        path: String,
        /// The errno text, or what else went wrong.
        why: String,
        /// Bytes the part keeps.
        kept_bytes: u64,
    },
    /// An fsync failed. It is never retried: the kernel may have dropped the unwritten pages.
    #[error(
        "file sink {sink}: fsync of {} failed: {}; the sink is poisoned (an fsync is never retried: the \
         kernel may have dropped the unwritten pages); restart the job from its last checkpoint",
        path.display(),
        errno_text(*errno)
    )]
    Fsync {
        /// The sink subtask.
        sink: String,
        /// The file or directory.
        path: PathBuf,
        /// The errno.
        errno: i32,
    },
    /// A part could not be renamed to its final name (the commit).
    #[error("file sink {sink}: cannot rename {} to {}: {}", from.display(), to.display(), io_error_text(source))]
    Rename {
        /// The sink subtask.
        sink: String,
        /// The in-progress part.
        from: PathBuf,
        /// Its final name.
        to: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint being restored names a file that is not this subtask's part.
    #[error("file sink {sink}: checkpoint {checkpoint} names `{name}`, not an in-progress part of this subtask")]
    ForeignPart {
        /// The sink subtask.
        sink: String,
        /// The checkpoint.
        checkpoint: u64,
        /// The name it holds.
        name: String,
    },
}

impl OperatorFailure for FileSinkError {}

/// Appends records to part files in a directory through io_uring. See the module docs.
pub struct FileSink<T> {
    config: FileSinkConfig,
    /// `node#index`, for messages.
    name: String,
    subtask: u32,
    ring: Option<Uring>,
    part: Option<Part>,
    next_part: Option<u64>,
    filling: Vec<u8>,
    /// The second buffer, when it is not in the kernel.
    spare: Option<Vec<u8>>,
    in_flight: Option<InFlight>,
    /// Parts fsynced for a checkpoint, waiting for its commit.
    pending: Vec<(u64, Part)>,
    poisoned: Poisoned,
    records: u64,
    _record: PhantomData<fn(&T)>,
}

impl<T> std::fmt::Debug for FileSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSink").field("name", &self.name).field("dir", &self.config.dir).finish()
    }
}

impl<T> FileSink<T> {
    /// A file sink for one subtask. Never fails: a setup error (io_uring unavailable, the
    /// directory cannot be made) poisons the sink, and its first `write` or `finish` fails
    /// the job with it (see [`FileSink::setup_error`]).
    pub fn new(config: FileSinkConfig, info: &SubtaskInfo) -> FileSink<T> {
        let name = info.name();
        let mut poisoned = Poisoned::default();
        let ring = match Uring::new(4) {
            Ok(r) => Some(r),
            Err(e) => {
                poisoned.poison(FileSinkError::Uring { sink: name.clone(), reason: e.to_string() });
                None
            }
        };
        if !poisoned.is_poisoned()
            && let Err(e) = std::fs::create_dir_all(&config.dir)
        {
            poisoned.poison(FileSinkError::Io {
                sink: name.clone(),
                what: "cannot create the directory",
                path: config.dir.clone(),
                source: e,
                hint: "",
            });
        }
        let buffer_bytes = config.buffer_bytes.max(64);
        FileSink {
            name,
            subtask: info.index,
            ring,
            part: None,
            next_part: None,
            filling: Vec::with_capacity(buffer_bytes),
            spare: Some(Vec::with_capacity(buffer_bytes)),
            in_flight: None,
            pending: Vec::new(),
            poisoned,
            records: 0,
            config: FileSinkConfig { buffer_bytes, ..config },
            _record: PhantomData,
        }
    }

    /// The setup error that poisoned this sink, if any.
    pub fn setup_error(&self) -> Option<&str> {
        self.poisoned.text()
    }

    /// Parts prepared for a checkpoint and not yet committed: `(checkpoint id, in-progress
    /// path)`. A snapshot records these, so that recovery from that checkpoint can commit them.
    pub fn pending_parts(&self) -> Vec<(u64, PathBuf)> {
        self.pending.iter().map(|(id, p)| (*id, p.inprogress.clone())).collect()
    }

    fn check(&self) -> Result<(), Halt> {
        self.poisoned.check()
    }

    /// Remember the first error and return it; the sink fails every call from now on.
    fn poison(&mut self, error: FileSinkError) -> Halt {
        self.poisoned.poison(error)
    }

    /// A file operation on `path` failed.
    fn io_failed(&mut self, what: &'static str, path: &Path, source: std::io::Error) -> Halt {
        let sink = self.name.clone();
        self.poison(FileSinkError::Io { sink, what, path: path.to_owned(), source, hint: "" })
    }

    /// Open the next part file (after the highest part number this subtask has in the dir).
    fn open_part(&mut self) -> Result<(), Halt> {
        let n = match self.next_part {
            Some(n) => n,
            None => highest_part(&self.config.dir, self.subtask).map_or(0, |n| n + 1),
        };
        self.next_part = Some(n + 1);
        let final_path = self.config.dir.join(format!("part-{}-{n}", self.subtask));
        let inprogress = self.config.dir.join(format!("part-{}-{n}.inprogress", self.subtask));
        // create_new: never overwrite output; a leftover in-progress part with this number
        // would mean two sinks share the directory.
        match OpenOptions::new().write(true).create_new(true).open(&inprogress) {
            Ok(file) => {
                self.part = Some(Part { file, inprogress, final_path, written_bytes: 0 });
                Ok(())
            }
            Err(source) => Err(self.poison(FileSinkError::Io {
                sink: self.name.clone(),
                what: "cannot create",
                path: inprogress,
                source,
                hint: " (does another sink write into this directory?)",
            })),
        }
    }

    /// Issue a write of the filling buffer (waiting for the previous write first).
    fn flush_buffer(&mut self) -> Result<(), Halt> {
        if self.filling.is_empty() {
            return Ok(());
        }
        if self.part.is_none() {
            self.open_part()?;
        }
        self.wait_write()?;
        let mut next = self.spare.take().expect("the spare buffer is back once no write is in flight");
        next.clear();
        let buffer = std::mem::replace(&mut self.filling, next);
        let part = self.part.as_ref().expect("opened above");
        let (fd, offset) = (part.file.as_raw_fd(), part.written_bytes);
        let ring = self.ring.as_mut().expect("a sink with a ring is not poisoned at setup");
        let queued = ring.write_at(fd, buffer, 0, offset, TAG_WRITE).and_then(|()| ring.submit());
        if let Err(e) = queued {
            return Err(self.write_failed(&io_error_text(&e)));
        }
        self.in_flight = Some(InFlight { offset, done: 0 });
        Ok(())
    }

    /// Wait until no write is in the kernel.
    fn wait_write(&mut self) -> Result<(), Halt> {
        let started = Instant::now();
        while self.in_flight.is_some() {
            self.wait_ring("a write", started)?;
            self.reap()?;
        }
        shown_over(started);
        Ok(())
    }

    /// One bounded wait for a completion (at most `outside::WAIT_STEP`): a stop ends it, one
    /// that lasts is named in the subtask's waiting note, one past `IO_DEADLINE` fails the sink.
    fn wait_ring(&mut self, what: &str, started: Instant) -> Result<(), Halt> {
        let ring = self.ring.as_mut().expect("waits need a ring");
        if let Err(e) = ring.wait(Some(outside::WAIT_STEP)) {
            return Err(self.io_failed("io_uring wait on", &self.config.dir.clone(), e));
        }
        if outside::stop_requested() {
            return Err(Halt::Stopped);
        }
        let waited = started.elapsed();
        if waited >= IO_DEADLINE {
            let why = format!(
                "{what} has not completed in {} (is the disk or filesystem stuck?)",
                crate::util::duration_text(waited)
            );
            return Err(self.write_failed(&why));
        }
        if waited >= outside::SHOW_AFTER {
            let (name, dir) = (&self.name, self.config.dir.display());
            crate::telemetry::waiting::waiting_on(|| {
                format!("file sink {name}: {what} in {dir} for {:.1} s", waited.as_secs_f64())
            });
        }
        Ok(())
    }

    /// Handle every completion that is ready (no system call).
    fn reap(&mut self) -> Result<(), Halt> {
        while let Some(c) = self.ring.as_mut().and_then(|r| r.next_completion()) {
            match c.tag {
                TAG_WRITE => self.write_done(c)?,
                // Only `fsync` has one in the kernel, and it reaps until it has its own.
                _ => unreachable!("an fsync completion outside `fsync`"),
            }
        }
        Ok(())
    }

    fn write_done(&mut self, c: Completion) -> Result<(), Halt> {
        let result = c.bytes();
        let buffer = c.buffer.expect("writes lend a buffer");
        let mut op = self.in_flight.take().expect("a completion for the write in flight");
        match result {
            Err(code) => {
                self.spare = Some(buffer);
                Err(self.write_failed(&errno_text(code)))
            }
            Ok(0) => {
                self.spare = Some(buffer);
                Err(self.write_failed("the kernel wrote 0 bytes"))
            }
            Ok(n) => {
                op.done += n;
                if op.done < buffer.len() {
                    // A short write (the disk filling up, a signal): continue where it stopped;
                    // the next attempt reports the error if there is one.
                    let part = self.part.as_ref().expect("a write has a part");
                    let (fd, offset) = (part.file.as_raw_fd(), op.offset + op.done as u64);
                    let ring = self.ring.as_mut().expect("writes need a ring");
                    if let Err(e) = ring.write_at(fd, buffer, op.done, offset, TAG_WRITE).and_then(|()| ring.submit()) {
                        return Err(self.write_failed(&io_error_text(&e)));
                    }
                    self.in_flight = Some(op);
                    return Ok(());
                }
                let part = self.part.as_mut().expect("a write has a part");
                part.written_bytes += buffer.len() as u64;
                self.config.stats.bytes_written.fetch_add(buffer.len() as u64, Ordering::Relaxed);
                self.spare = Some(buffer);
                Ok(())
            }
        }
    }

    /// A write failed: cut the part back to the last completed write (whole records only)
    /// and poison the sink.
    fn write_failed(&mut self, why: &str) -> Halt {
        let (path, kept) = match &self.part {
            Some(p) => {
                // Best effort: shrinking frees space, so it works on a full disk.
                let _ = p.file.set_len(p.written_bytes);
                (p.inprogress.display().to_string(), p.written_bytes)
            }
            None => (self.config.dir.display().to_string(), 0),
        };
        self.poison(FileSinkError::Write { sink: self.name.clone(), path, why: why.to_owned(), kept_bytes: kept })
    }

    /// fsync `fd` through the ring and wait for it. `what` names the file for messages. A
    /// write still in the kernel (the next part's, when a checkpoint completes meanwhile)
    /// completes on its own path: each completion goes where its tag says.
    fn fsync(&mut self, fd: std::os::fd::RawFd, what: &Path) -> Result<(), Halt> {
        let ring = self.ring.as_mut().expect("a sink with a ring is not poisoned at setup");
        if let Err(e) = ring.fsync(fd, TAG_FSYNC) {
            let code = e.raw_os_error().unwrap_or(libc::EIO);
            return Err(self.poison(FileSinkError::Fsync {
                sink: self.name.clone(),
                path: what.to_owned(),
                errno: code,
            }));
        }
        let started = Instant::now();
        let done = loop {
            let mut done = None;
            while let Some(c) = self.ring.as_mut().and_then(|r| r.next_completion()) {
                match c.tag {
                    TAG_FSYNC => done = Some(c),
                    _ => self.write_done(c)?,
                }
            }
            if let Some(c) = done {
                break c;
            }
            self.wait_ring("an fsync", started)?;
        };
        shown_over(started);
        match done.bytes() {
            Ok(_) => {
                self.config.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(code) => {
                Err(self.poison(FileSinkError::Fsync { sink: self.name.clone(), path: what.to_owned(), errno: code }))
            }
        }
    }

    /// fsync the directory, so creations and renames in it survive a crash.
    fn fsync_dir(&mut self) -> Result<(), Halt> {
        let dir = match File::open(&self.config.dir) {
            Ok(d) => d,
            Err(e) => {
                return Err(self.io_failed("cannot open, to fsync it, the directory", &self.config.dir.clone(), e));
            }
        };
        let path = self.config.dir.clone();
        self.fsync(dir.as_raw_fd(), &path)
    }

    /// Records `write` has taken (this subtask).
    pub fn records(&self) -> u64 {
        self.records
    }
}

/// A wait that began at `started` is over: if it lasted long enough to be named, the
/// subtask's waiting note is cleared.
fn shown_over(started: Instant) {
    if started.elapsed() >= outside::SHOW_AFTER {
        crate::telemetry::waiting::waiting_over();
    }
}

impl<T> TwoPhaseCommit for FileSink<T> {
    /// Flush, wait for the write, fsync the part and the directory (which holds its name);
    /// the part becomes pending for `checkpoint_id`. The next record opens a new part.
    fn prepare_commit(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        self.check()?;
        self.flush_buffer()?;
        self.wait_write()?;
        let Some(part) = self.part.take() else { return Ok(()) };
        let fd = part.file.as_raw_fd();
        let path = part.inprogress.clone();
        self.pending.push((checkpoint_id, part));
        self.fsync(fd, &path)?;
        self.fsync_dir()
    }

    /// Rename every part pending for a checkpoint up to `checkpoint_id` to its final name,
    /// then fsync the directory.
    fn commit(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        self.check()?;
        let (ready, later): (Vec<_>, Vec<_>) = self.pending.drain(..).partition(|(id, _)| *id <= checkpoint_id);
        self.pending = later;
        if ready.is_empty() {
            return Ok(());
        }
        for (_, part) in &ready {
            if let Err(e) = std::fs::rename(&part.inprogress, &part.final_path) {
                return Err(self.poison(FileSinkError::Rename {
                    sink: self.name.clone(),
                    from: part.inprogress.clone(),
                    to: part.final_path.clone(),
                    source: e,
                }));
            }
        }
        self.fsync_dir()?;
        self.config.stats.parts_committed.fetch_add(ready.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl<T: Record + Display> Sink<T> for FileSink<T> {
    #[inline]
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        self.check()?;
        if self.part.is_none() {
            // The first record after a barrier (or at start) opens the next part.
            self.open_part()?;
        }
        self.config.format.append(record, &mut self.filling);
        self.records += 1;
        self.config.stats.records.fetch_add(1, Ordering::Relaxed);
        if self.filling.len() >= self.config.buffer_bytes {
            self.flush_buffer()?;
        }
        // Reap a finished write early (a look at the completion queue, no system call), so
        // an error fails the job at the next record rather than at the next flush.
        self.reap()
    }

    /// Pre-commit for checkpoint `checkpoint_id`; the bytes name every part pending a
    /// commit (`<checkpoint id> <file name>` per line), so a restore can commit them.
    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        self.prepare_commit(checkpoint_id)?;
        let mut out = String::new();
        for (id, path) in self.pending_parts() {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            out += &format!("{id} {name}\n");
        }
        Ok(out.into_bytes())
    }

    /// Commit the parts the restored checkpoint prepared (if a crash came before their
    /// commit), and delete this subtask's other in-progress parts: they hold records after
    /// the checkpoint, which the job replays.
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        self.check()?;
        let (id, listed) = match from {
            Some((id, bytes)) => (id, vec![(self.subtask, bytes)]),
            None => (0, Vec::new()),
        };
        self.restore_parts(id, &listed, &[self.subtask])
    }

    /// At another parallelism: each old subtask's parts are taken by one new subtask (old
    /// index `i` by `i % parallelism`), which commits what it prepared and deletes its other
    /// in-progress parts; a new subtask without a predecessor of its index cleans its own.
    fn restore_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        self.check()?;
        let listed: Vec<(u32, &[u8])> = from.split().map(|(i, b)| (*i, b.as_slice())).collect();
        let p = from.parallelism.max(1);
        let mut owners: Vec<u32> = (0..from.from_parallelism).filter(|i| i % p == self.subtask).collect();
        if !owners.contains(&self.subtask) {
            owners.push(self.subtask);
        }
        self.restore_parts(from.checkpoint_id, &listed, &owners)
    }

    fn checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        self.commit(checkpoint_id)
    }

    /// End of input: flush, fsync and make every part final.
    fn finish(&mut self) -> Result<(), Halt> {
        self.prepare_commit(u64::MAX)?;
        self.commit(u64::MAX)
    }
}

impl<T> FileSink<T> {
    /// Restore checkpoint `id`: commit the parts that `listed` (old subtask index, snapshot
    /// bytes) name, each of which must be that subtask's, and delete every other in-progress
    /// part of the subtasks `owners` (their records after the checkpoint are replayed).
    fn restore_parts(&mut self, id: u64, listed: &[(u32, &[u8])], owners: &[u32]) -> Result<(), Halt> {
        let mut commit = Vec::new();
        for (index, bytes) in listed {
            for line in String::from_utf8_lossy(bytes).lines() {
                let name = line.split_once(' ').map(|(_, n)| n).unwrap_or_default();
                if !name.starts_with(&format!("part-{index}-")) || !name.ends_with(".inprogress") {
                    return Err(self.poison(FileSinkError::ForeignPart {
                        sink: self.name.clone(),
                        checkpoint: id,
                        name: name.to_owned(),
                    }));
                }
                commit.push(name.to_owned());
            }
        }
        let prefixes: Vec<String> = owners.iter().map(|i| format!("part-{i}-")).collect();
        let entries = match std::fs::read_dir(&self.config.dir) {
            Ok(e) => e,
            Err(e) => {
                return Err(self.io_failed("cannot list", &self.config.dir.clone(), e));
            }
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(prefixes.iter().any(|p| name.starts_with(p)) && name.ends_with(".inprogress")) {
                continue;
            }
            let path = entry.path();
            let done = if commit.contains(&name) {
                std::fs::rename(&path, path.with_extension(""))
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(e) = done {
                return Err(self.io_failed("cannot commit or remove", &path, e));
            }
        }
        self.fsync_dir()
    }
}

/// The highest part number subtask `subtask` has in `dir` (final or in progress).
fn highest_part(dir: &Path, subtask: u32) -> Option<u64> {
    let prefix = format!("part-{subtask}-");
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix(&prefix)?;
            rest.strip_suffix(".inprogress").unwrap_or(rest).parse::<u64>().ok()
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Event;

    fn info(index: u32) -> SubtaskInfo {
        SubtaskInfo {
            job: "test".into(),
            node: "files".into(),
            index,
            parallelism: 1,
            max_key_groups: 128,
            owned: None,
        }
    }

    fn temp_dir(name: &str) -> crate::util::TempDir {
        crate::util::temp_dir(&format!("file-{name}"))
    }

    fn event(seq: u64) -> Event {
        Event { key: seq % 7, value: seq, time_ns: 0, seq }
    }

    /// An fsync error poisons the sink: the message names the file and errno, and every later
    /// call fails the same way (no second fsync is tried).
    #[test]
    fn failed_fsync_poisons() {
        let dir = temp_dir("poison");
        let mut sink: FileSink<Event> = FileSink::new(FileSinkConfig::new(dir.to_path_buf()), &info(0));
        sink.write(&event(1)).unwrap();
        // An fsync of a descriptor that is not open fails (EBADF) the way a failing disk would (EIO).
        let err = sink.fsync(-1, Path::new("/the/part")).unwrap_err();
        let Halt::Failed(failure) = err else { panic!("a failure") };
        let message = failure.to_string();
        assert!(
            message.contains("/the/part") && message.contains("EBADF") && message.contains("poisoned"),
            "{message}"
        );
        assert_eq!(sink.write(&event(2)), Err(Halt::Failed(failure.clone())));
        assert_eq!(sink.prepare_commit(1), Err(Halt::Failed(failure.clone())));
        assert_eq!(Sink::finish(&mut sink), Err(Halt::Failed(failure)));
        assert_eq!(sink.config.stats.fsyncs.load(Ordering::Relaxed), 0);
    }

    /// Part numbers continue after the highest existing one.
    #[test]
    fn part_numbers_continue() {
        let dir = temp_dir("numbers");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("part-3-4"), "").unwrap();
        std::fs::write(dir.join("part-3-6.inprogress"), "").unwrap();
        std::fs::write(dir.join("part-30-9"), "").unwrap();
        assert_eq!(highest_part(&dir, 3), Some(6));
        assert_eq!(highest_part(&dir, 2), None);
    }
}
