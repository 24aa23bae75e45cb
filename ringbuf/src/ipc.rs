//! Endpoints: rings a job shares with another process on the host.
//!
//! A job's `ipc` source or sink creates one ring per subtask, an *endpoint*, at a path
//! another program of the same user finds by the job's and the endpoint's names
//! ([`endpoint_path`]). That program feeds a source endpoint with a [`Publisher`] and
//! reads a sink endpoint with a [`Subscriber`], in place, with the ring's credit as back
//! pressure: a full ring is "no credit" ([`Sent::NoCredit`]), a value, and the publisher
//! waits or drops by its own policy.
//!
//! ## Safety against the other process
//!
//! An endpoint is sealed shared memory ([`Ring::create_sealed`]): a memfd, mode 0600,
//! sealed against shrinking and growing, reached through a link (in the user's 0700 run
//! root) to `/proc/<job pid>/fd/<n>`. A peer can write records but cannot truncate the
//! memory (EPERM) or make the job fault (no SIGBUS); replacing the link changes nothing
//! the job maps. Everything the job reads from the ring is checked as for any ring (a bad
//! header poisons it); an ipc source copies each payload out of shared memory before it
//! decodes it, so a peer rewriting bytes under the reader cannot change what was checked.
//! A second publisher (or subscriber) is refused while the first lives; one that died is
//! taken over. Another user cannot attach (owner and mode are checked on what is opened).
//!
//! ## Sequence numbers and delivery
//!
//! Every record on an endpoint starts with a u64 sequence number (little-endian), then the
//! payload. On a source endpoint the publisher numbers its records 0, 1, 2, … for the
//! life of the endpoint (across job restarts); the job keeps the next number it expects in
//! its checkpoints, and:
//!
//! - **duplicates are dropped**: a record below the number expected was delivered already
//!   (a publisher that took over re-sent it) and is skipped;
//! - **a gap is an error**: a record above it means records were lost; the endpoint fails
//!   (or is reset, by the job's policy) and says so;
//! - **what is durable is published**: [`Publisher::durable_seq`] is the number below
//!   which the job has every record in a completed checkpoint. A publisher keeps what is
//!   not durable yet; after the job restarts from its last checkpoint the new endpoint
//!   says which record it wants next ([`Publisher::next_seq`], at most what it had), and
//!   the publisher sends again from there. Kept and re-sent that way, every record is
//!   delivered exactly once; a publisher that keeps nothing gets at-most-once for what was
//!   in flight at a crash.
//!
//! [`Publisher::next_seq`] is stored in the ring header after each publish, so a
//! publisher that restarts (or another that takes the role over) starts where the last
//! one stopped; if it died between publishing and storing the number, it sends a few
//! records twice and the job drops the copies.
//!
//! On a sink endpoint the job numbers what it writes the same way, and after a restart
//! from a checkpoint writes again from the checkpoint's number: for a deterministic job a
//! subscriber that drops what it already saw (a number below the next it expects) reads
//! each record once; otherwise at least once (`durable_seq` says below which number the job
//! will write nothing again).

use crate::error::{AttachError, ClaimError, CreateError, RingError};
use crate::idle::{IdleStep, Idler};
use crate::layout::{EndpointLine, RingHeader};
use crate::process;
use crate::sync::Ordering;
use crate::{Claim, Consumer, Producer, Read, Ring, RingConfig, RingStatus};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes of the sequence number in front of every endpoint record.
pub const SEQ_BYTES: usize = 8;

/// FNV-1a of a path's bytes, its directory made canonical (so `./ep/x.0` and the absolute
/// spelling agree): the endpoint line's `path_hash`.
pub(crate) fn path_hash(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let canonical = match (path.parent().and_then(|d| d.canonicalize().ok()), path.file_name()) {
        (Some(dir), Some(name)) => dir.join(name),
        _ => path.to_owned(),
    };
    canonical
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Whether `ring` is the endpoint made at `path` (not another reached through a stale link).
fn made_at(ring: &Ring, path: &Path) -> bool {
    ring.header().endpoint.path_hash.load(Ordering::Relaxed) == path_hash(path)
}

/// This user's root of run files: `/dev/shm/weir-<uid>` (or `<temp dir>/weir-<uid>` where
/// there is no /dev/shm). Jobs' run directories and endpoints live under it.
pub fn user_root() -> PathBuf {
    let name = format!("weir-{}", crate::private_file::our_uid());
    if Path::new("/dev/shm").is_dir() { Path::new("/dev/shm").join(name) } else { std::env::temp_dir().join(name) }
}

/// A name as one safe path component: letters, digits, `.`, `_` and `-` kept, anything
/// else made `_`, a leading `.` too (no `..`, no hidden name), at most 64 bytes; `job` if
/// nothing is left.
pub fn safe_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .take(64)
        .collect();
    if out.starts_with('.') {
        out.replace_range(0..1, "_");
    }
    if out.is_empty() { "job".into() } else { out }
}

/// Where subtask `subtask` of endpoint `endpoint` of job `job` lives under `root`
/// (usually [`user_root`]): `<root>/ipc/<job>/<endpoint>.<subtask>`, names made safe by
/// [`safe_name`].
pub fn endpoint_path(root: &Path, job: &str, endpoint: &str, subtask: usize) -> PathBuf {
    root.join("ipc").join(safe_name(job)).join(format!("{}.{subtask}", safe_name(endpoint)))
}

/// Why an endpoint could not be created or connected to.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Another live process (a second instance of the job) serves this endpoint.
    #[error(
        "endpoint {path} is served by pid {pid}, which is alive: another instance of the job runs; stop it, or give this one another job or endpoint name"
    )]
    InUse {
        /// The endpoint.
        path: PathBuf,
        /// The process that created it.
        pid: u32,
    },
    /// Something that is not an endpoint is where one must go.
    #[error("{path} is not an endpoint ({what}); it was left alone: remove it, or pick another endpoint path")]
    NotAnEndpoint {
        /// The path.
        path: PathBuf,
        /// What is there.
        what: String,
    },
    /// No job serves the endpoint (yet).
    #[error("no job serves endpoint {path} (yet): start the job, or check the job and endpoint names")]
    Absent {
        /// The endpoint.
        path: PathBuf,
    },
    /// The job that created the endpoint is gone; a restarted job makes a new one.
    #[error("the job that served endpoint {path} (pid {pid}) is gone; connect again once it restarts")]
    JobGone {
        /// The endpoint.
        path: PathBuf,
        /// The job's process.
        pid: u32,
    },
    /// A record that is not an endpoint record (shorter than its sequence number).
    #[error("endpoint {path}: a record of {len} bytes has no sequence number (8 bytes); not an endpoint record")]
    Malformed {
        /// The endpoint.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// Creating the ring failed.
    #[error(transparent)]
    Create(#[from] CreateError),
    /// Attaching failed (owner, mode, version, a live holder of the role, ...).
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// The ring is poisoned or closed.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// A record over the endpoint's largest.
    #[error(transparent)]
    Claim(#[from] ClaimError),
}

/// The figures an endpoint's header carries, for tools and the job's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointStatus {
    /// The sequence number of the next record the publisher sends, as it last stored it.
    pub next_seq: u64,
    /// Records below this number are in a completed checkpoint of the job.
    pub durable_seq: u64,
    /// Nanoseconds the producer waited for credit, in total.
    pub producer_blocked_ns: u64,
    /// Records the producer sent, in total.
    pub records_sent: u64,
    /// The job's process (the endpoint's creator).
    pub job_pid: u32,
    /// The job consumes the ring (an ipc source; another process publishes): `Some(true)`;
    /// produces it (an ipc sink): `Some(false)`; `None` before the job took its role.
    pub job_consumes: Option<bool>,
    /// The ring's positions, sides and state.
    pub ring: RingStatus,
}

fn status_of(ring: &Ring) -> EndpointStatus {
    let e = &ring.header().endpoint;
    EndpointStatus {
        next_seq: e.next_seq.load(Ordering::Acquire),
        durable_seq: e.durable_seq.load(Ordering::Acquire),
        producer_blocked_ns: e.producer_blocked_ns.load(Ordering::Relaxed),
        records_sent: e.records_sent.load(Ordering::Relaxed),
        job_pid: ring.header().creator_pid.load(Ordering::Relaxed),
        job_consumes: match e.job_role.load(Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        },
        ring: ring.status(),
    }
}

/// Read the figures of the endpoint at `path` without taking a role (for tools): refused
/// like a connect when nothing, or another endpoint, is there.
pub fn peek(path: &Path) -> Result<EndpointStatus, EndpointError> {
    Ok(status_of(&attach_made_at(path)?))
}

/// The job's side of an endpoint: the sealed ring it created, and its path (removed when
/// dropped, if it still names this ring).
#[derive(Debug)]
pub struct Endpoint {
    ring: Ring,
    path: PathBuf,
    /// What the link at `path` points to: ours while it does.
    link: PathBuf,
    /// Directories removed at the end if empty (innermost first): those this endpoint made,
    /// and a job's directory under the user's root (`<root>/ipc/<job>`) whoever made it —
    /// the last of a job's endpoints to go removes it, whichever made it.
    made_dirs: Vec<PathBuf>,
}

impl Endpoint {
    /// Create the endpoint at `path`, its next record `next_seq` (0 on a fresh start, the
    /// checkpoint's number on a restore), records below `durable_seq` durable (on a restore,
    /// the same number; after a reset, the last completed checkpoint's). A link left by a
    /// dead job is replaced; an endpoint whose job is alive is refused
    /// ([`EndpointError::InUse`]), and so is anything else at `path`. The directory is made
    /// 0700 if missing, and must be ours and 0700.
    pub fn create(path: &Path, config: RingConfig, next_seq: u64, durable_seq: u64) -> Result<Endpoint, EndpointError> {
        clear_stale(path)?;
        let mut made_dirs: Vec<PathBuf> =
            path.ancestors().skip(1).take_while(|d| !d.exists()).map(Path::to_owned).collect();
        let ring = match Ring::create_endpoint(path, config, next_seq, durable_seq) {
            // The directory was removed under us by an endpoint that ended (it removes the
            // directories it made once empty): make it again, once.
            Err(CreateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                made_dirs = path.ancestors().skip(1).take_while(|d| !d.exists()).map(Path::to_owned).collect();
                Ring::create_endpoint(path, config, next_seq, durable_seq)?
            }
            other => other?,
        };
        let link = std::fs::read_link(path).map_err(|source| CreateError::Io { path: path.to_owned(), source })?;
        if let Some(job_dir) = path.parent()
            && job_dir.parent() == Some(user_root().join("ipc").as_path())
            && !made_dirs.iter().any(|d| d == job_dir)
        {
            made_dirs.insert(0, job_dir.to_owned());
        }
        Ok(Endpoint { ring, path: path.to_owned(), link, made_dirs })
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Take the consumer role, as an ipc source does (another process publishes).
    pub fn consumer(&self) -> Result<Consumer, EndpointError> {
        let c = self.ring.consumer()?;
        self.ring.header().endpoint.job_role.store(1, Ordering::Relaxed);
        Ok(c)
    }

    /// Take the producer role, as an ipc sink does (another process subscribes).
    pub fn producer(&self) -> Result<Producer, EndpointError> {
        let p = self.ring.producer()?;
        self.ring.header().endpoint.job_role.store(2, Ordering::Relaxed);
        Ok(p)
    }

    /// The endpoint's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records below `seq` are in a completed checkpoint: publish it for the publisher.
    pub fn set_durable(&self, seq: u64) {
        self.ring.header().endpoint.durable_seq.fetch_max(seq, Ordering::AcqRel);
    }

    /// Store the next sequence number (the job writing a sink endpoint does, as a publisher
    /// does on a source endpoint).
    pub fn set_next_seq(&self, seq: u64) {
        self.ring.header().endpoint.next_seq.store(seq, Ordering::Release);
    }

    /// The header's figures, and the sides' processes (looked up under `/proc`: tens of
    /// microseconds, for tools and telemetry, not for every poll).
    pub fn status(&self) -> EndpointStatus {
        status_of(&self.ring)
    }

    /// The publisher's next number as it last stored it (one load: cheap enough per poll).
    pub fn status_next_seq(&self) -> u64 {
        self.ring.header().endpoint.next_seq.load(Ordering::Acquire)
    }

    /// Nanoseconds the publisher waited for credit, in total (one load; [`status`] reads
    /// the sides' processes under `/proc` as well, tens of microseconds: not for every poll).
    ///
    /// [`status`]: Endpoint::status
    pub fn producer_blocked_ns(&self) -> u64 {
        self.ring.header().endpoint.producer_blocked_ns.load(Ordering::Relaxed)
    }

    /// Slots published and not yet released (two loads; no system call).
    pub fn backlog_slots(&self) -> u64 {
        let h = self.ring.header();
        h.tail.value.load(Ordering::Acquire).saturating_sub(h.head.value.load(Ordering::Acquire))
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Only our own link: a restarted job may have made a new one at the same path.
        if std::fs::read_link(&self.path).is_ok_and(|l| l == self.link) {
            let _ = std::fs::remove_file(&self.path);
        }
        // And the directories we made, once empty (another endpoint's keep them).
        for dir in &self.made_dirs {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }
}

/// Make room for a new endpoint at `path`: nothing there, or a link of ours to the memory
/// of a process that is gone (removed). A live endpoint, or anything else, is refused.
fn clear_stale(path: &Path) -> Result<(), EndpointError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !meta.file_type().is_symlink() {
        let what = if meta.is_dir() { "a directory" } else { "a file that is not a link to sealed memory" };
        return Err(EndpointError::NotAnEndpoint { path: path.to_owned(), what: what.into() });
    }
    match Ring::attach(path) {
        // Another endpoint reached through a stale link (its pid and descriptor reused).
        Ok(ring) if !made_at(&ring, path) => {}
        Ok(ring) => {
            let status = ring.status();
            if status.creator_alive {
                let pid = ring.header().creator_pid.load(Ordering::Relaxed);
                return Err(EndpointError::InUse { path: path.to_owned(), pid });
            }
        }
        // A link of ours into /proc that names no ring: dangling (its process is gone) or
        // its pid reused by a process whose descriptor is not a ring. While the process the
        // link names lives, it may be an endpoint being made (no header yet): refused.
        Err(e) if link_to_proc(path) => {
            let live = link_pid(path).filter(|&pid| Path::new(&format!("/proc/{pid}")).exists());
            if let (Some(pid), AttachError::Magic { .. }) = (live, &e) {
                return Err(EndpointError::InUse { path: path.to_owned(), pid });
            }
        }
        Err(e) => return Err(EndpointError::NotAnEndpoint { path: path.to_owned(), what: e.to_string() }),
    }
    std::fs::remove_file(path).map_err(|source| CreateError::Io { path: path.to_owned(), source })?;
    Ok(())
}

fn link_to_proc(path: &Path) -> bool {
    std::fs::read_link(path).is_ok_and(|t| t.starts_with("/proc/"))
}

/// The pid in a link to `/proc/<pid>/fd/<n>`.
fn link_pid(path: &Path) -> Option<u32> {
    let target = std::fs::read_link(path).ok()?;
    target.strip_prefix("/proc/").ok()?.components().next()?.as_os_str().to_str()?.parse().ok()
}

/// Attach to the ring at `path` if it is the endpoint made there: absent when nothing is
/// there, or when it is a stale link of a dead job whose pid and descriptor number another
/// job reused.
fn attach_made_at(path: &Path) -> Result<Ring, EndpointError> {
    let ring = match Ring::attach(path) {
        Ok(ring) => ring,
        Err(AttachError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(EndpointError::Absent { path: path.to_owned() });
        }
        Err(e) => return Err(e.into()),
    };
    if !made_at(&ring, path) {
        return Err(EndpointError::Absent { path: path.to_owned() });
    }
    Ok(ring)
}

/// Attach to the endpoint at `path`, refusing one whose job is gone.
fn attach_endpoint(path: &Path) -> Result<Ring, EndpointError> {
    let ring = attach_made_at(path)?;
    if !job_alive(&ring) {
        return Err(job_gone(&ring, path));
    }
    Ok(ring)
}

/// What [`Publisher::try_send`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Sent with this sequence number.
    Sent(u64),
    /// The job has no room now (back pressure): nothing was written. Try again later, wait
    /// ([`Publisher::send`]), or drop the record.
    NoCredit,
}

/// Feeds a job's ipc source endpoint: the producer of its ring, numbering its records.
/// Dropped, it detaches (the stream goes on with the next publisher); only
/// [`close`](Publisher::close) ends it.
#[derive(Debug)]
pub struct Publisher {
    producer: Option<Producer>,
    ring: Ring,
    path: PathBuf,
    next_seq: u64,
    /// When the current stretch without credit began.
    blocked_since: Option<Instant>,
    sent: u64,
    /// Records are made visible (published) every `batch` records: 1 (the default) makes
    /// each visible at once; more saves a shared store per record.
    batch: u64,
    /// Records committed since the last publish.
    unpublished: u64,
    /// Rounds spent waiting for room (to look at the job's liveness now and then).
    waits: u64,
}

impl Publisher {
    /// Connect to the endpoint at `path` and take the publisher role: refused while another
    /// live process holds it, taken over from a dead one. Sending continues at the number
    /// the endpoint holds ([`next_seq`](Publisher::next_seq)).
    pub fn connect(path: impl AsRef<Path>) -> Result<Publisher, EndpointError> {
        let path = path.as_ref();
        let ring = attach_endpoint(path)?;
        let producer = ring.producer()?;
        let e = endpoint_of(ring.header());
        let next_seq = e.next_seq.load(Ordering::Acquire);
        let sent = e.records_sent.load(Ordering::Relaxed);
        Ok(Publisher {
            producer: Some(producer),
            ring,
            path: path.to_owned(),
            next_seq,
            blocked_since: None,
            sent,
            batch: 1,
            unpublished: 0,
            waits: 0,
        })
    }

    /// [`connect`](Publisher::connect) to subtask `subtask` of endpoint `endpoint` of job
    /// `job`, under this user's root.
    pub fn connect_to(job: &str, endpoint: &str, subtask: usize) -> Result<Publisher, EndpointError> {
        Publisher::connect(endpoint_path(&user_root(), job, endpoint, subtask))
    }

    /// The sequence number the next record gets: where the job wants the stream to go on.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Records below this number are in a completed checkpoint of the job: forget them.
    pub fn durable_seq(&self) -> u64 {
        endpoint_of(self.ring.header()).durable_seq.load(Ordering::Acquire)
    }

    /// Make records visible to the job every `records` records instead of one by one (at
    /// least 1): fewer shared stores and cache-line transfers per record, at the price of
    /// latency for the last ones. Records not yet visible are published by
    /// [`flush`](Publisher::flush), by a send that finds no credit, and by close or detach:
    /// call `flush` when you stop sending for a while.
    pub fn set_batch(&mut self, records: u64) {
        self.batch = records.max(1);
    }

    /// Make every record sent so far visible to the job.
    pub fn flush(&mut self) {
        if self.unpublished == 0 {
            return;
        }
        self.producer_mut().publish();
        self.unpublished = 0;
        let e = endpoint_of(self.ring.header());
        // After the publish: a successor starting here may send a record again (dropped as
        // a duplicate), never skip one.
        e.next_seq.store(self.next_seq, Ordering::Release);
        e.records_sent.store(self.sent, Ordering::Relaxed);
    }

    /// The largest payload a record may carry.
    pub fn max_payload(&self) -> usize {
        (self.producer().max_record_bytes() as usize).saturating_sub(SEQ_BYTES)
    }

    /// Send `payload` if the job has room, without waiting.
    pub fn try_send(&mut self, payload: &[u8]) -> Result<Sent, EndpointError> {
        self.try_send_with(payload.len(), |buf| buf.copy_from_slice(payload))
    }

    /// Send a record of `len` bytes written in place by `write` (zero copy: `write` gets the
    /// record's bytes in the ring), if the job has room, without waiting.
    pub fn try_send_with(&mut self, len: usize, write: impl FnOnce(&mut [u8])) -> Result<Sent, EndpointError> {
        let seq = self.next_seq;
        let Some(record_len) = len.checked_add(SEQ_BYTES) else {
            let max = self.producer().max_record_bytes();
            return Err(ClaimError::TooLarge { len, max }.into());
        };
        match self.producer.as_mut().expect("taken only by close").claim(record_len)? {
            Claim::Granted(mut slot) => {
                slot[..SEQ_BYTES].copy_from_slice(&seq.to_le_bytes());
                write(&mut slot[SEQ_BYTES..]);
                slot.commit_deferred();
                self.next_seq += 1;
                self.sent += 1;
                self.unpublished += 1;
                if self.unpublished >= self.batch {
                    self.flush();
                }
                if let Some(since) = self.blocked_since.take() {
                    let e = endpoint_of(self.ring.header());
                    e.producer_blocked_ns.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
                }
                Ok(Sent::Sent(seq))
            }
            Claim::NoCredit => {
                // (The claim published what was committed: say so in the header too.)
                self.flush();
                self.blocked_since.get_or_insert_with(Instant::now);
                Ok(Sent::NoCredit)
            }
        }
    }

    /// Send `payload`, waiting by `idler` while the job has no room. Fails when the job is
    /// gone (check [`job_alive`](Publisher::job_alive) and connect again after a restart).
    pub fn send(&mut self, payload: &[u8], idler: &mut Idler) -> Result<u64, EndpointError> {
        loop {
            if let Sent::Sent(seq) = self.try_send(payload)? {
                idler.reset();
                return Ok(seq);
            }
            self.wait_for_room(SEQ_BYTES + payload.len(), idler)?;
        }
    }

    fn wait_for_room(&mut self, len: usize, idler: &mut Idler) -> Result<(), EndpointError> {
        self.waits = self.waits.wrapping_add(1);
        let parked = matches!(idler.idle(0), Some(IdleStep::Park));
        if parked {
            self.producer_mut().park(len, Duration::from_millis(100));
        }
        // Whatever the strategy (a busy-spinning one never parks): look at the job now and then
        // — by a header that is still the job's (garbage over it names no job: poisoned).
        if parked || self.waits.is_multiple_of(1 << 16) {
            self.ring.check_header()?;
            if !self.job_alive() {
                return Err(job_gone(&self.ring, &self.path));
            }
        }
        Ok(())
    }

    /// Whether the job that serves the endpoint is alive (a system call: not per record).
    pub fn job_alive(&self) -> bool {
        job_alive(&self.ring)
    }

    /// The endpoint's figures.
    pub fn status(&self) -> EndpointStatus {
        status_of(&self.ring)
    }

    /// End the stream: the job reads what was sent, and its source finishes.
    pub fn close(mut self) {
        self.flush();
        if let Some(p) = self.producer.take() {
            p.close()
        }
    }

    /// End the stream, then wait until the job holds every record in a completed
    /// checkpoint (its final one, taken when its source reaches the end): `Ok(true)`; or
    /// `Ok(false)` after `timeout`. Fails with [`EndpointError::JobGone`] if the job goes
    /// first — it crashed before the end was durable: connect again once it restarts and
    /// send from [`next_seq`](Publisher::next_seq) (it asks again for what its checkpoint
    /// lacks), then close again. Only for jobs that take checkpoints: without them nothing
    /// becomes durable.
    pub fn close_and_wait(mut self, timeout: Duration) -> Result<bool, EndpointError> {
        self.flush();
        if let Some(p) = self.producer.take() {
            p.close()
        }
        let end = self.next_seq;
        let deadline = Instant::now() + timeout;
        loop {
            if self.durable_seq() >= end {
                return Ok(true);
            }
            if !self.job_alive() {
                return Err(job_gone(&self.ring, &self.path));
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Leave without ending the stream: the job keeps waiting, and a publisher that connects
    /// later goes on at [`next_seq`](Publisher::next_seq). (Dropping does the same.)
    pub fn detach(self) {}

    fn producer(&self) -> &Producer {
        self.producer.as_ref().expect("taken only by close")
    }

    fn producer_mut(&mut self) -> &mut Producer {
        self.producer.as_mut().expect("taken only by close")
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if self.producer.is_some() {
            self.flush();
        }
        if let Some(p) = self.producer.take() {
            p.detach()
        }
    }
}

/// Whether the process that made the endpoint lives.
fn job_alive(ring: &Ring) -> bool {
    let h = ring.header();
    process::alive(h.creator_pid.load(Ordering::Relaxed), h.creator_start_ticks.load(Ordering::Relaxed))
}

/// The error for an endpoint whose job is gone.
fn job_gone(ring: &Ring, path: &Path) -> EndpointError {
    EndpointError::JobGone { path: path.to_owned(), pid: ring.header().creator_pid.load(Ordering::Relaxed) }
}

fn endpoint_of(h: &RingHeader) -> &EndpointLine {
    &h.endpoint
}

/// What [`Subscriber::try_recv`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A record with this sequence number (handed to the closure, then released).
    Record(u64),
    /// Nothing yet.
    Empty,
    /// The job ended the stream (the sink finished); nothing follows.
    Closed,
}

/// Reads a job's ipc sink endpoint: the consumer of its ring. Dropped, it detaches (the
/// job keeps writing while there is room, and a new subscriber goes on where it stopped).
#[derive(Debug)]
pub struct Subscriber {
    consumer: Option<Consumer>,
    ring: Ring,
    path: PathBuf,
    /// Rounds spent waiting (to look at the job's liveness now and then).
    waits: u64,
}

impl Subscriber {
    /// Connect to the endpoint at `path` and take the subscriber role: refused while
    /// another live process holds it, taken over from a dead one (records it had read but
    /// not released come again).
    pub fn connect(path: impl AsRef<Path>) -> Result<Subscriber, EndpointError> {
        let path = path.as_ref();
        let ring = attach_endpoint(path)?;
        let consumer = ring.consumer()?;
        Ok(Subscriber { consumer: Some(consumer), ring, path: path.to_owned(), waits: 0 })
    }

    /// [`connect`](Subscriber::connect) to subtask `subtask` of endpoint `endpoint` of job
    /// `job`, under this user's root.
    pub fn connect_to(job: &str, endpoint: &str, subtask: usize) -> Result<Subscriber, EndpointError> {
        Subscriber::connect(endpoint_path(&user_root(), job, endpoint, subtask))
    }

    /// Hand the next record to `read` (its sequence number and payload, borrowed in place)
    /// and release it; or say there is none yet, or that the stream ended.
    pub fn try_recv(&mut self, read: impl FnOnce(u64, &[u8])) -> Result<Received, EndpointError> {
        self.try_recv_if(|seq, bytes| {
            read(seq, bytes);
            true
        })
    }

    /// [`try_recv`](Subscriber::try_recv), where `read` decides whether the record is
    /// released (`true`) or stays to be read again (`false`: say, the caller's buffer was
    /// too small for it).
    pub fn try_recv_if(&mut self, read: impl FnOnce(u64, &[u8]) -> bool) -> Result<Received, EndpointError> {
        match self.consumer_mut().read()? {
            Read::Record(view) => {
                let bytes = view.payload();
                if bytes.len() < SEQ_BYTES {
                    let len = bytes.len();
                    return Err(EndpointError::Malformed { path: self.path.clone(), len });
                }
                let seq = u64::from_le_bytes(bytes[..SEQ_BYTES].try_into().expect("8 bytes"));
                if read(seq, &bytes[SEQ_BYTES..]) {
                    view.release_deferred();
                }
                Ok(Received::Record(seq))
            }
            Read::Empty => Ok(Received::Empty),
            Read::Closed => Ok(Received::Closed),
        }
    }

    /// [`try_recv`](Subscriber::try_recv), waiting by `idler` while there is nothing.
    /// Fails when the job is gone with nothing left to read.
    pub fn recv(&mut self, idler: &mut Idler, read: impl FnOnce(u64, &[u8])) -> Result<Received, EndpointError> {
        let mut read = Some(read);
        loop {
            let got = self.try_recv(|seq, bytes| (read.take().expect("called once"))(seq, bytes))?;
            if got != Received::Empty {
                idler.reset();
                return Ok(got);
            }
            self.wait(idler)?;
        }
    }

    /// One round of waiting for a record by `idler` (spin, yield or sleep on the ring);
    /// fails when the job is gone with nothing left to read.
    pub fn wait(&mut self, idler: &mut Idler) -> Result<(), EndpointError> {
        self.waits = self.waits.wrapping_add(1);
        let parked = matches!(idler.idle(0), Some(IdleStep::Park));
        if parked {
            self.consumer_mut().park(Duration::from_millis(100));
        }
        if (parked || self.waits.is_multiple_of(1 << 16))
            && !self.job_alive()
            && matches!(self.consumer_mut().read()?, Read::Empty)
        {
            return Err(job_gone(&self.ring, &self.path));
        }
        Ok(())
    }

    /// Whether the job that serves the endpoint is alive (a system call: not per record).
    pub fn job_alive(&self) -> bool {
        job_alive(&self.ring)
    }

    /// The endpoint's figures.
    pub fn status(&self) -> EndpointStatus {
        status_of(&self.ring)
    }

    /// Return released records' room to the job now (it is otherwise returned in batches).
    pub fn flush(&mut self) {
        self.consumer_mut().publish();
    }

    /// The number the job gives the next record it writes (one load: cheap enough per call).
    pub fn next_seq(&self) -> u64 {
        endpoint_of(self.ring.header()).next_seq.load(Ordering::Acquire)
    }

    /// Records below this number are in a completed checkpoint of the job: it will not write
    /// them again after a restart (records from here on may come again: drop those numbered
    /// below the next you expect).
    pub fn durable_seq(&self) -> u64 {
        endpoint_of(self.ring.header()).durable_seq.load(Ordering::Acquire)
    }

    /// The largest payload a record may carry (the job writes none larger).
    pub fn max_payload(&self) -> usize {
        (self.ring.config().max_record_bytes as usize).saturating_sub(SEQ_BYTES)
    }

    fn consumer_mut(&mut self) -> &mut Consumer {
        self.consumer.as_mut().expect("taken only by drop")
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        if let Some(c) = self.consumer.take() {
            c.detach()
        }
    }
}
