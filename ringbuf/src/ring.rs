//! A ring with no role yet: create or attach it, take the producer or consumer role,
//! inspect it. Also the few protocol steps both sides share (poison, wake, liveness).

use crate::consumer::Consumer;
use crate::error::{AttachError, ConfigError, PoisonReason, RingError};
use crate::futex;
use crate::layout::{CONSUMER_CLOSED, Liveness, POISONED, PRODUCER_CLOSED, ParkLine, RecordKind};
use crate::process;
use crate::producer::Producer;
use crate::region::{Region, RingConfig};
use crate::sync::{Arc, Ordering, fence};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A parked side wakes at least this often to look at its peer's liveness and the ring state.
pub(crate) const PARK_BACKSTOP: Duration = Duration::from_millis(100);
/// The first park of a side is short: the peer may have read `parks == 0` just before we set it.
pub(crate) const FIRST_PARK: Duration = Duration::from_millis(1);

/// The two roles on a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Producer,
    Consumer,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Consumer => "consumer",
        }
    }

    fn liveness(self, region: &Region) -> &Liveness {
        match self {
            Role::Producer => &region.header().producer,
            Role::Consumer => &region.header().consumer,
        }
    }
}

/// A mapped ring, not yet used as either side. Cheap to clone within a process.
#[derive(Debug, Clone)]
pub struct Ring {
    region: Arc<Region>,
}

/// An in-process channel in anonymous memory: the two role handles from one constructor.
#[cfg(not(loom))]
pub fn channel(config: RingConfig) -> Result<(Producer, Consumer), ConfigError> {
    Ring::anonymous(config)?.split()
}

impl Ring {
    /// A ring on the heap (tests; the only kind under loom).
    pub fn heap(config: RingConfig) -> Result<Ring, ConfigError> {
        Ok(Ring { region: Arc::new(Region::heap(&config)?) })
    }

    /// A ring from a copy of a ring image (header and slots), checked as [`Ring::attach`]
    /// checks a file (less the file's owner and mode). For fuzzing those checks.
    #[cfg(not(loom))]
    pub(crate) fn from_image(image: &[u8]) -> Result<Ring, AttachError> {
        Ok(Ring { region: Arc::new(Region::from_image(image)?) })
    }

    /// A ring in anonymous shared memory, for channels inside one process.
    #[cfg(not(loom))]
    pub fn anonymous(config: RingConfig) -> Result<Ring, ConfigError> {
        Ok(Ring { region: Arc::new(Region::anonymous(&config)?) })
    }

    /// Create a ring file another process can attach to (O_EXCL | O_NOFOLLOW, 0600, in a
    /// 0700 directory, created if missing).
    #[cfg(not(loom))]
    pub fn create(path: impl AsRef<Path>, config: RingConfig) -> Result<Ring, crate::error::CreateError> {
        Ok(Ring { region: Arc::new(Region::create_file(path.as_ref(), &config)?) })
    }

    /// Create a ring another process can attach to but not resize: sealed shared memory
    /// (a memfd, 0600, sealed against shrinking and growing) reached at `path` by a link to
    /// `/proc/<our pid>/fd/<n>` (made like a private file: in a 0700 directory of ours,
    /// never over an existing name). A peer that truncates it gets EPERM, and one that
    /// replaces the link changes nothing this ring maps: neither can make this process
    /// fault. The link dangles once the ring is dropped (remove it then).
    #[cfg(not(loom))]
    pub fn create_sealed(path: impl AsRef<Path>, config: RingConfig) -> Result<Ring, crate::error::CreateError> {
        Ok(Ring { region: Arc::new(Region::create_sealed(path.as_ref(), &config, 0, 0)?) })
    }

    /// [`create_sealed`](Ring::create_sealed), for an ipc endpoint whose next record is
    /// `next_seq`, durable below `durable_seq` (its endpoint line set before any peer can
    /// see the ring).
    #[cfg(not(loom))]
    pub(crate) fn create_endpoint(
        path: &Path,
        config: RingConfig,
        next_seq: u64,
        durable_seq: u64,
    ) -> Result<Ring, crate::error::CreateError> {
        Ok(Ring { region: Arc::new(Region::create_sealed(path, &config, next_seq, durable_seq)?) })
    }

    /// The header, for the ipc endpoint module (not built under loom).
    #[cfg(not(loom))]
    pub(crate) fn header(&self) -> &crate::layout::RingHeader {
        self.region.header()
    }

    /// Attach to an existing ring file: owner, mode, magic, version and layout are checked
    /// before any slot is touched; each refusal says what is wrong.
    #[cfg(not(loom))]
    pub fn attach(path: impl AsRef<Path>) -> Result<Ring, AttachError> {
        Ok(Ring { region: Arc::new(Region::attach(path.as_ref())?) })
    }

    /// Both roles at once (for in-process channels).
    pub fn split(self) -> Result<(Producer, Consumer), ConfigError> {
        let producer = self.producer().expect("a fresh ring has no producer");
        let consumer = self.consumer().expect("a fresh ring has no consumer");
        Ok((producer, consumer))
    }

    /// Take the producer role. Refused while a live process holds it (this one included);
    /// taken over from a dead one, continuing at the published tail. Refused with the
    /// poison if the shared positions are out of range (head past tail, or tail more than
    /// a ring ahead).
    pub fn producer(&self) -> Result<Producer, AttachError> {
        self.take_role(Role::Producer)?;
        Producer::new(self.region.clone()).map_err(|e| {
            release_role(&self.region, Role::Producer);
            e.into()
        })
    }

    /// Take the consumer role. Refused while a live process holds it; taken over from a
    /// dead one, continuing at the published head (records it read but had not released
    /// are read again). Refused with the poison if the shared positions are out of range.
    pub fn consumer(&self) -> Result<Consumer, AttachError> {
        self.take_role(Role::Consumer)?;
        Consumer::new(self.region.clone()).map_err(|e| {
            release_role(&self.region, Role::Consumer);
            e.into()
        })
    }

    fn take_role(&self, role: Role) -> Result<(), AttachError> {
        let live = role.liveness(&self.region);
        let me = process::pid();
        let my_ticks = process::start_ticks(me).unwrap_or(0);
        loop {
            let holder = live.pid.load(Ordering::Acquire);
            if holder != 0 {
                let ticks = live.start_ticks.load(Ordering::Relaxed);
                if holder == me || process::alive(holder, ticks) {
                    return Err(AttachError::RoleTaken {
                        path: self.region.path().map(Path::to_owned).unwrap_or_else(|| PathBuf::from("(in-process)")),
                        role: role.name(),
                        pid: holder,
                    });
                }
            }
            // Free, or held by a dead process: take it. The CAS makes one taker win.
            if live.pid.compare_exchange(holder, me, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                live.start_ticks.store(my_ticks, Ordering::Relaxed);
                heartbeat(live);
                return Ok(());
            }
        }
    }

    /// The ring's shape.
    pub fn config(&self) -> RingConfig {
        RingConfig {
            slot_bytes: self.region.slot_bytes() as u32,
            slot_count: self.region.slot_count as u32,
            max_record_bytes: self.region.max_record_bytes,
        }
    }

    /// The file behind the ring, if any.
    pub fn path(&self) -> Option<&Path> {
        self.region.path()
    }

    /// Whether the header's magic, version and layout are still what they were when this
    /// ring was made or attached; if someone wrote over them, the ring is poisoned
    /// ([`PoisonReason::HeaderChanged`]) and nothing else in the header (a state bit, a pid)
    /// is to be believed. A few loads of the header's first line.
    pub fn check_header(&self) -> Result<(), RingError> {
        check_header(&self.region)
    }

    /// A snapshot of the ring's shared state, for tools and tests.
    pub fn status(&self) -> RingStatus {
        let h = self.region.header();
        let tail = h.tail.value.load(Ordering::Acquire);
        let head = h.head.value.load(Ordering::Acquire);
        let state = h.state.load(Ordering::Acquire);
        let side = |live: &Liveness| {
            let pid = live.pid.load(Ordering::Acquire);
            (pid != 0).then(|| SideStatus {
                pid,
                alive: side_alive(live),
                heartbeat_age_ms: process::monotonic_ms().saturating_sub(live.heartbeat_ms.load(Ordering::Relaxed)),
            })
        };
        let creator_pid = h.creator_pid.load(Ordering::Relaxed);
        RingStatus {
            slot_count: self.region.slot_count,
            slot_bytes: self.region.slot_bytes(),
            tail,
            head,
            backlog: tail.saturating_sub(head),
            credit: self.region.slot_count.saturating_sub(tail.saturating_sub(head)),
            announced: crate::layout::window_of(h.head.announced.load(Ordering::Relaxed), self.region.slot_count),
            producer_closed: state & PRODUCER_CLOSED != 0,
            consumer_closed: state & CONSUMER_CLOSED != 0,
            poisoned: (state & POISONED != 0).then(|| poison_error(&self.region)),
            producer: side(&h.producer),
            consumer: side(&h.consumer),
            creator_alive: process::alive(creator_pid, h.creator_start_ticks.load(Ordering::Relaxed)),
        }
    }
}

/// Remove a ring file if nothing alive uses it: no live producer, consumer or creator.
/// Returns whether it was removed. A file that is not a valid ring is left alone.
#[cfg(not(loom))]
pub fn remove_if_stale(path: impl AsRef<Path>) -> Result<bool, AttachError> {
    let path = path.as_ref();
    let ring = Ring::attach(path)?;
    let status = ring.status();
    let live = |s: &Option<SideStatus>| s.as_ref().is_some_and(|s| s.alive);
    if live(&status.producer) || live(&status.consumer) || status.creator_alive {
        return Ok(false);
    }
    std::fs::remove_file(path).map_err(|source| AttachError::Io { path: path.to_owned(), source })?;
    Ok(true)
}

/// One side as the header shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideStatus {
    /// Its process.
    pub pid: u32,
    /// Whether that process (same start time) still runs.
    pub alive: bool,
    /// Milliseconds since its last heartbeat.
    pub heartbeat_age_ms: u64,
}

/// A snapshot of a ring's shared state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingStatus {
    /// Slots in the ring.
    pub slot_count: u64,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// Slots published.
    pub tail: u64,
    /// Slots released.
    pub head: u64,
    /// `tail − head`: used slots.
    pub backlog: u64,
    /// `slot_count − backlog`: free slots, the producer's credit.
    pub credit: u64,
    /// The consumer's announced credit limit in slots (`slot_count` when none is).
    pub announced: u64,
    /// The producer closed its stream.
    pub producer_closed: bool,
    /// The consumer went away.
    pub consumer_closed: bool,
    /// Why the ring is poisoned, if it is.
    pub poisoned: Option<RingError>,
    /// The producer, if one is attached.
    pub producer: Option<SideStatus>,
    /// The consumer, if one is attached.
    pub consumer: Option<SideStatus>,
    /// Whether the process that created the ring still runs.
    pub creator_alive: bool,
}

/// Both positions, `(tail, head)`, for a new handle, checked against each other: a handle's
/// arithmetic assumes `head <= tail <= head + slot_count`, and a peer (or memory corruption)
/// may have left them otherwise since attach checked them, or on a ring never attached.
/// Out of range poisons the ring. The handle uses exactly the values checked here.
///
/// `tail` is where the committed records end: the stored `tail`, or past it if a producer
/// committed headers and died before it stored `tail` after them (a consumer may already
/// have read those, and released them: `head` past the stored `tail` is then fine). The
/// walk stops at the first header that is not committed in its lap or not well formed
/// (the consumer's reads judge those), within one ring of `head`.
pub(crate) fn positions(region: &Region) -> Result<(u64, u64), RingError> {
    let h = region.header();
    // SYNC POINT Acquire: pairs with the Release store of `tail` in Producer::publish (a new
    // consumer may read every slot before it).
    let stored = h.tail.value.load(Ordering::Acquire);
    // SYNC POINT Acquire: pairs with the Release store of `head` in Consumer::publish (a new
    // producer may reuse every slot before it).
    let head = h.head.value.load(Ordering::Acquire);
    if stored > head && stored - head > region.slot_count {
        return Err(poison(region, PoisonReason::TailOutOfRange, stored));
    }
    // `head` past the stored `tail`: a live producer is about to store it (a reader ran
    // ahead by one publish), or a dead one never will and its committed records must end
    // there. A live one may meanwhile reuse those slots, so look at `tail` again first.
    let stored = if head > stored { h.tail.value.load(Ordering::Acquire).max(stored) } else { stored };
    if head > stored && (head - stored > region.slot_count || !committed_through(region, stored, head)) {
        return Err(poison(region, PoisonReason::HeadOutOfRange, head));
    }
    Ok((committed_end(region, stored.max(head), head), head))
}

/// Where the chain of committed records from `from` ends, at most one ring past `head`.
fn committed_end(region: &Region, from: u64, head: u64) -> u64 {
    let base = region.base();
    let (mask, shift, lap_shift) = (region.slot_count - 1, region.slot_shift, region.slot_count.trailing_zeros());
    let mut pos = from;
    while pos - head < region.slot_count {
        let index = pos & mask;
        // SYNC POINT Acquire: pairs with the Release store of a batch's first header in
        // Producer::publish_tail (the records it commits were written before it).
        let word = u64::from_le(base.commit_word(index, shift).load(Ordering::Acquire));
        let to_end = region.slot_count - index;
        let slots = match RecordKind::from_byte((word >> 32) as u8) {
            _ if !crate::layout::committed(word, pos, lap_shift) => break,
            Some(RecordKind::Padding) => to_end,
            Some(_) => crate::layout::record_slots(word as u32 as usize, shift),
            None => break,
        };
        if slots > to_end || pos + slots - head > region.slot_count {
            break;
        }
        pos += slots;
    }
    pos
}

/// Whether the committed records from `from` reach exactly `to` (a `head` past the stored
/// `tail` must sit on that chain).
fn committed_through(region: &Region, from: u64, to: u64) -> bool {
    let base = region.base();
    let (mask, shift, lap_shift) = (region.slot_count - 1, region.slot_shift, region.slot_count.trailing_zeros());
    let mut pos = from;
    while pos < to {
        let index = pos & mask;
        let word = u64::from_le(base.commit_word(index, shift).load(Ordering::Acquire));
        if !crate::layout::committed(word, pos, lap_shift) {
            return false;
        }
        pos += match RecordKind::from_byte((word >> 32) as u8) {
            Some(RecordKind::Padding) => region.slot_count - index,
            Some(_) => crate::layout::record_slots(word as u32 as usize, shift),
            None => return false,
        };
    }
    pos == to
}

/// Poison the ring: the first reason stored wins; both sides see `POISONED` from now on.
#[cold]
pub(crate) fn poison(region: &Region, reason: PoisonReason, detail: u64) -> RingError {
    let h = region.header();
    if h.poison_code.compare_exchange(0, reason as u32, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        h.poison_detail.store(detail, Ordering::Relaxed);
    }
    h.state.fetch_or(POISONED, Ordering::AcqRel);
    wake_if_waiting(&h.consumer_park);
    wake_if_waiting(&h.producer_park);
    poison_error(region)
}

/// The header's fixed fields changed under a live ring ([`Region::header_intact`]): poison
/// it, whatever its (untrustworthy) poison fields say, and say so.
#[cold]
pub(crate) fn poison_header(region: &Region, magic: u64) -> RingError {
    let h = region.header();
    h.poison_code.store(PoisonReason::HeaderChanged as u32, Ordering::Release);
    h.poison_detail.store(magic, Ordering::Relaxed);
    h.state.fetch_or(POISONED, Ordering::AcqRel);
    wake_if_waiting(&h.consumer_park);
    wake_if_waiting(&h.producer_park);
    RingError::Poisoned { reason: PoisonReason::HeaderChanged, detail: magic }
}

/// The header as it stands, as a side sees it in a cold path: intact, or poisoned
/// (`HeaderChanged`).
/// (Not under loom: its models are of the positions' protocol between two honest sides, and
/// every load is a point its scheduler explores.)
#[cold]
pub(crate) fn check_header(region: &Region) -> Result<(), RingError> {
    #[cfg(loom)]
    {
        let _ = region;
        Ok(())
    }
    #[cfg(not(loom))]
    region.header_intact().map_err(|magic| poison_header(region, magic))
}

/// The error for a poisoned ring, as stored in its header.
#[cold]
pub(crate) fn poison_error(region: &Region) -> RingError {
    let h = region.header();
    let code = h.poison_code.load(Ordering::Acquire);
    RingError::Poisoned {
        reason: PoisonReason::from_code(code).unwrap_or(PoisonReason::Application),
        detail: h.poison_detail.load(Ordering::Relaxed),
    }
}

/// After publishing a position: wake the other side if it may be parked on `line`.
/// Costs one relaxed load when the other side never parks; a fence and a load when it may;
/// a system call only when it is actually waiting.
#[inline]
pub(crate) fn wake_if_waiting(line: &ParkLine) {
    if line.parks.load(Ordering::Relaxed) == 0 {
        return;
    }
    // SYNC POINT SeqCst fence: pairs with the fence in Producer::park / Consumer::park, after
    // they set `waiting` and before they re-read our position (Dekker: one of us sees the other).
    fence(Ordering::SeqCst);
    if line.waiting.load(Ordering::Relaxed) != 0 && line.waiting.swap(0, Ordering::AcqRel) != 0 {
        line.wake.fetch_add(1, Ordering::Release);
        futex::wake(&line.wake);
    }
}

/// Record a sign of life.
pub(crate) fn heartbeat(live: &Liveness) {
    live.heartbeat_ms.store(process::monotonic_ms(), Ordering::Relaxed);
}

/// Whether the side in `live` is attached and its process runs.
pub(crate) fn side_alive(live: &Liveness) -> bool {
    let pid = live.pid.load(Ordering::Acquire);
    pid != 0 && process::alive(pid, live.start_ticks.load(Ordering::Relaxed))
}

/// Give up a role (on drop of its handle).
pub(crate) fn release_role(region: &Region, role: Role) {
    let live = role.liveness(region);
    let _ = live.pid.compare_exchange(process::pid(), 0, Ordering::AcqRel, Ordering::Relaxed);
}
