//! The shared-memory layout of one ring: header, positions, slots.
//!
//! ```text
//! offset  size  field                  written by
//!      0     8  magic "WEIRRNG\0"      creator (last, Release: a valid magic means a whole header)
//!      8     4  version                creator
//!     12     4  header_bytes (= 768)   creator
//!     16     4  slot_bytes             creator   power of two, >= 8
//!     20     4  slot_count             creator   power of two, >= 2
//!     24     4  max_record_bytes       creator   payload bytes, <= slot_bytes * slot_count - 8
//!     28     4  (reserved, zero)
//!     32     4  creator_pid            creator
//!     40     8  creator_start_ticks    creator   /proc/<pid>/stat field 22: tells pid reuse apart
//!     48     4  state                  either    bit flags: PRODUCER_CLOSED | CONSUMER_CLOSED | POISONED
//!     52     4  poison_code            first side to see a violation
//!     56     8  poison_detail          first side to see a violation
//!     64    24  producer liveness      producer  pid, start ticks, heartbeat (ms, CLOCK_MONOTONIC)
//!     88    24  consumer liveness      consumer  pid, start ticks, heartbeat
//!    128     8  tail  ─┐ own 128-byte line: slots published, only the producer stores it
//!    256     8  head  ─┘ own 128-byte line: slots released, only the consumer stores it
//!    264     8  announced              consumer  credit limit in slots (0: none, the whole ring)
//!    384    12  consumer park line     consumer_parks, consumer_waiting (consumer), consumer_wake (producer)
//!    512    12  producer park line     producer_parks, producer_waiting (producer), producer_wake (consumer)
//!    640    32  endpoint line          used by ipc endpoints only (zero otherwise), see below
//!    768     …  slot 0, slot 1, …, slot (slot_count - 1), each slot_bytes long
//! ```
//!
//! The *endpoint line* serves a ring that a job shares with another process (an ipc
//! endpoint, [`crate::ipc`]), whose records each start with a u64 sequence number:
//!
//! ```text
//!    640     8  next_seq               producer  the sequence number of the next record it sends
//!                                                (stored after each publish; a successor starts there)
//!    648     8  durable_seq            job       records below it are in a completed checkpoint
//!    656     8  producer_blocked_ns    producer  time it waited for credit, in total
//!    664     8  records_sent           producer  records it sent, in total
//!    672     8  path_hash              job       FNV-1a of the path it made the endpoint at
//!    680     8  job_role               job       1: the job consumes (ipc source), 2: produces (sink)
//! ```
//!
//! Positions are u64 slot counts that only increase; a slot's index is `position & (slot_count - 1)`.
//!
//! `announced` is the receiver's *credit by time* (see the crate docs): the most slots it
//! wants in flight. It shares `head`'s line, so the producer reads it with the `head` it
//! loads anyway when its cached credit runs out: no extra cache line per hop. Any value is
//! safe: 0 (nothing announced) and anything above `slot_count` mean the whole ring; the
//! producer claims while fewer than `announced` slots are in flight, so even 1 lets a record
//! of any size through once the ring is drained (no value can stop a sender for good).
//! A 128-byte line, not 64: Intel's spatial prefetcher pulls cache lines in pairs, so two hot
//! words 64 bytes apart would still fight.
//!
//! A record starts at a slot boundary with an 8-byte header and takes `ceil((8 + len) / slot_bytes)`
//! adjacent slots. It never wraps: when it does not fit before the end, the producer writes a
//! padding record over the rest of the ring and starts again at slot 0.
//!
//! ```text
//!  0      4      5          8
//!  +------+------+----------+---------------------------+
//!  | len  | kind | lap tag  | payload (len bytes) ...   |
//!  +------+------+----------+---------------------------+
//! ```
//! `len` is the payload length; for padding it is the number of bytes from the end of this
//! header to the end of the ring, so a reader can check it against where it stands.
//!
//! The header word is also the record's *commit word*: the consumer polls it, not `tail`, so
//! a hop moves one cache line (the record's) from producer to consumer. The lap tag
//! ([`lap_tag`]: bit 23 set, the low 23 bits of `position / slot_count`) says which lap of
//! the ring wrote it; a header counts as committed at a position only with that position's
//! tag. The producer stores it last, with Release (the first of a batch last of all, at
//! `publish`), and before that clears the word where the record after it will start,
//! whenever that slot is free; when it is not (the ring is full), the word there is the
//! header of the record at `head`, one lap older, whose tag does not match. So the word the
//! consumer finds where the next record goes is a header of this lap, zero, or one lap old
//! — never stale payload bytes that happen to look like a header. `tail` is still stored at
//! each publish (after the headers), for backlog, tools, a successor and parking; a reader
//! may run ahead of it by one publish, and a producer taking over from a dead one first
//! walks the committed headers past the stored tail ([`crate::Ring`] does it for both roles).
//!
//! A *frame* (kind 6) carries many data records under that one header, so a reader checks
//! one header per batch and finds each record from a loop index, not from the record
//! before it. Its payload starts with a frame header:
//!
//! ```text
//!  payload offset
//!  0       4        6       8      start                         start + count × stride
//!  +-------+--------+-------+------+------+------+-- … --+------+
//!  | count | stride | start | gap  | rec 0| rec 1|       | rec n|          fixed: stride ≥ 1
//!  +-------+--------+-------+------+------+------+-- … --+------+
//!
//!  0       4        6       8      start            table = len − 4 × count          len
//!  +-------+--------+-------+------+---------------+------+------+-- … --+------+
//!  | count |   0    | start | gap  | data          | end 0| end 1|       | end n|   variable
//!  +-------+--------+-------+------+---------------+------+------+-- … --+------+
//! ```
//! `count` ≥ 1 records. `start` (8 ≤ start ≤ 64, a multiple of 8) is where the first record
//! begins: the writer pads so that a record of stride 2^k·m (k ≤ 6) starts on a 2^k-byte
//! boundary — 64-byte records take exactly one cache line each. A fixed frame is exactly
//! `start + count × stride` bytes long. A variable frame ends in a table of `count` u32
//! end offsets, relative to `start`, non-decreasing, the last one where the table begins.
//! Every record is at most `max_record_bytes`; a frame as a whole may be longer (it is
//! bounded by the ring). A reader copies the header once, checks it (and a variable frame's
//! table, in one pass) before it hands out a record, and poisons the ring on any violation.

use crate::sync::{AtomicU32, AtomicU64};

/// "WEIRRNG\0" as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"WEIRRNG\0");
/// Layout version; bump it on any change to this file's layout or record format.
pub const VERSION: u32 = 6;
/// Bytes before slot 0.
pub const HEADER_BYTES: u32 = 768;
/// Bytes of a record header.
pub const RECORD_HEADER_BYTES: usize = 8;
/// Bytes of a frame header (count, stride, start), at the start of a frame's payload.
pub const FRAME_HEADER_BYTES: usize = 8;
/// The most a frame's first record may sit past the start of its payload: the header and
/// up to 56 bytes of padding to a cache line.
pub const FRAME_START_MAX: usize = 64;

/// `state` bit: the producer closed the ring (end of its stream) or detached for good.
pub const PRODUCER_CLOSED: u32 = 1;
/// `state` bit: the consumer closed the ring; the producer's writes would go nowhere.
pub const CONSUMER_CLOSED: u32 = 2;
/// `state` bit: a side saw a protocol violation; `poison_code` says which.
pub const POISONED: u32 = 4;

/// What one record is, for the runtime.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// An application record.
    Data = 1,
    /// A checkpoint barrier.
    Barrier = 2,
    /// An event-time watermark.
    Watermark = 3,
    /// The sender's stream ended; nothing follows.
    EndOfStream = 4,
    /// Filler to the end of the ring; never shown to readers.
    Padding = 5,
    /// Data records under one header (see the module docs); readers see each record as
    /// `Data`, never the frame.
    Frame = 6,
    /// A latency marker: when the record before it entered the job, and its event time
    /// (16 bytes; the runtime's, like barriers and watermarks).
    Latency = 7,
}

impl RecordKind {
    /// The kind for a header byte, or `None` for a byte no kind has.
    pub fn from_byte(byte: u8) -> Option<RecordKind> {
        match byte {
            1 => Some(RecordKind::Data),
            2 => Some(RecordKind::Barrier),
            3 => Some(RecordKind::Watermark),
            4 => Some(RecordKind::EndOfStream),
            5 => Some(RecordKind::Padding),
            6 => Some(RecordKind::Frame),
            7 => Some(RecordKind::Latency),
            _ => None,
        }
    }
}

/// Liveness of one side: who it is and when it last showed a sign of life.
#[repr(C)]
#[derive(Debug)]
pub struct Liveness {
    /// Process id of the side's process; 0 = no one attached.
    pub pid: AtomicU32,
    /// Reserved, zero.
    pub _reserved: AtomicU32,
    /// Start time of that process (clock ticks since boot), to tell a reused pid apart.
    pub start_ticks: AtomicU64,
    /// CLOCK_MONOTONIC milliseconds at the side's last heartbeat.
    pub heartbeat_ms: AtomicU64,
}

/// One side's park words, alone on a 128-byte line.
#[repr(C)]
#[derive(Debug)]
pub struct ParkLine {
    /// 1 when this side may park (so the other side must check `waiting` after it publishes).
    pub parks: AtomicU32,
    /// 1 while this side is, or is about to be, asleep on `wake`.
    pub waiting: AtomicU32,
    /// The futex word this side sleeps on; the other side bumps it before waking.
    pub wake: AtomicU32,
    _pad: [u8; 116],
}

/// What an ipc endpoint's two processes tell each other beyond the positions (see the
/// module docs), alone on a 128-byte line. Zero on rings that are not endpoints.
#[repr(C)]
#[derive(Debug)]
pub struct EndpointLine {
    /// The sequence number of the next record the producer sends (stored after each
    /// publish, so a producer that takes the role over starts there; may lag the ring).
    pub next_seq: AtomicU64,
    /// Records below this sequence number are in a completed checkpoint of the job: a
    /// publisher may forget them (the job will not ask for them again).
    pub durable_seq: AtomicU64,
    /// Nanoseconds the producer waited for credit, in total.
    pub producer_blocked_ns: AtomicU64,
    /// Records the producer sent, in total.
    pub records_sent: AtomicU64,
    /// A hash of the path the job made the endpoint at: a peer that reached it through
    /// another path (a stale link whose pid and descriptor number were reused) is refused.
    pub path_hash: AtomicU64,
    /// The job's role on the endpoint: 0 not yet taken, 1 consumer (an ipc source: another
    /// process publishes), 2 producer (an ipc sink: another process subscribes).
    pub job_role: AtomicU64,
    _pad: [u8; 80],
}

/// A u64 position alone on a 128-byte line.
#[repr(C)]
#[derive(Debug)]
pub struct PositionLine {
    /// The position.
    pub value: AtomicU64,
    _pad: [u8; 120],
}

/// `head` and the receiver's announced credit limit, alone on a 128-byte line.
#[repr(C)]
#[derive(Debug)]
pub struct HeadLine {
    /// Slots released by the consumer.
    pub value: AtomicU64,
    /// The most slots the consumer wants in flight; 0: no limit (the whole ring).
    pub announced: AtomicU64,
    _pad: [u8; 112],
}

/// Ring header, at offset 0 of the mapped region. See the module docs for the diagram.
///
/// Every field is an atomic, so either side may read it while the other writes without a
/// data race, even across processes.
#[repr(C)]
#[derive(Debug)]
pub struct RingHeader {
    /// [`MAGIC`] once the header is complete.
    pub magic: AtomicU64,
    /// [`VERSION`].
    pub version: AtomicU32,
    /// [`HEADER_BYTES`].
    pub header_bytes: AtomicU32,
    /// Bytes per slot, power of two, >= 8.
    pub slot_bytes: AtomicU32,
    /// Slots in the ring, power of two, >= 2.
    pub slot_count: AtomicU32,
    /// Largest payload a record may carry.
    pub max_record_bytes: AtomicU32,
    /// Reserved, zero.
    pub _reserved0: AtomicU32,
    /// Process that created the ring.
    pub creator_pid: AtomicU32,
    /// Reserved, zero.
    pub _reserved1: AtomicU32,
    /// Its start time (clock ticks since boot).
    pub creator_start_ticks: AtomicU64,
    /// `PRODUCER_CLOSED | CONSUMER_CLOSED | POISONED`.
    pub state: AtomicU32,
    /// A [`crate::PoisonReason`] code, 0 if not poisoned.
    pub poison_code: AtomicU32,
    /// A number that goes with the code (the bad length, position, ...).
    pub poison_detail: AtomicU64,
    /// The producer's liveness.
    pub producer: Liveness,
    /// The consumer's liveness.
    pub consumer: Liveness,
    _pad0: [u8; 16],
    /// Slots published by the producer.
    pub tail: PositionLine,
    /// Slots released by the consumer, and its announced credit limit.
    pub head: HeadLine,
    /// The consumer's park words.
    pub consumer_park: ParkLine,
    /// The producer's park words.
    pub producer_park: ParkLine,
    /// Sequence numbers and figures of an ipc endpoint.
    pub endpoint: EndpointLine,
}

#[cfg(not(loom))]
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(offset_of!(RingHeader, version) == 8);
    assert!(offset_of!(RingHeader, slot_bytes) == 16);
    assert!(offset_of!(RingHeader, creator_start_ticks) == 40);
    assert!(offset_of!(RingHeader, state) == 48);
    assert!(offset_of!(RingHeader, producer) == 64);
    assert!(offset_of!(RingHeader, consumer) == 88);
    assert!(offset_of!(RingHeader, tail) == 128);
    assert!(offset_of!(RingHeader, head) == 256);
    assert!(offset_of!(RingHeader, head) + offset_of!(HeadLine, announced) == 264);
    assert!(offset_of!(RingHeader, consumer_park) == 384);
    assert!(offset_of!(RingHeader, producer_park) == 512);
    assert!(offset_of!(RingHeader, endpoint) == 640);
    assert!(offset_of!(RingHeader, endpoint) + offset_of!(EndpointLine, durable_seq) == 648);
    assert!(size_of::<RingHeader>() == HEADER_BYTES as usize);
    assert!(offset_of!(RingHeader, tail) % 128 == 0);
    assert!(offset_of!(RingHeader, head) % 128 == 0);
};

impl RingHeader {
    /// A zeroed header, for heap-backed rings (tests and loom).
    #[cfg(loom)]
    pub(crate) fn new_zeroed() -> RingHeader {
        fn live() -> Liveness {
            Liveness {
                pid: AtomicU32::new(0),
                _reserved: AtomicU32::new(0),
                start_ticks: AtomicU64::new(0),
                heartbeat_ms: AtomicU64::new(0),
            }
        }
        fn park() -> ParkLine {
            ParkLine { parks: AtomicU32::new(0), waiting: AtomicU32::new(0), wake: AtomicU32::new(0), _pad: [0; 116] }
        }
        fn pos() -> PositionLine {
            PositionLine { value: AtomicU64::new(0), _pad: [0; 120] }
        }
        RingHeader {
            magic: AtomicU64::new(0),
            version: AtomicU32::new(0),
            header_bytes: AtomicU32::new(0),
            slot_bytes: AtomicU32::new(0),
            slot_count: AtomicU32::new(0),
            max_record_bytes: AtomicU32::new(0),
            _reserved0: AtomicU32::new(0),
            creator_pid: AtomicU32::new(0),
            _reserved1: AtomicU32::new(0),
            creator_start_ticks: AtomicU64::new(0),
            state: AtomicU32::new(0),
            poison_code: AtomicU32::new(0),
            poison_detail: AtomicU64::new(0),
            producer: live(),
            consumer: live(),
            _pad0: [0; 16],
            tail: pos(),
            head: HeadLine { value: AtomicU64::new(0), announced: AtomicU64::new(0), _pad: [0; 112] },
            consumer_park: park(),
            producer_park: park(),
            endpoint: EndpointLine {
                next_seq: AtomicU64::new(0),
                durable_seq: AtomicU64::new(0),
                producer_blocked_ns: AtomicU64::new(0),
                records_sent: AtomicU64::new(0),
                path_hash: AtomicU64::new(0),
                job_role: AtomicU64::new(0),
                _pad: [0; 80],
            },
        }
    }
}

/// The credit window an `announced` value stands for: 0 (nothing announced) and anything
/// above the ring mean the whole ring. Every value is safe: the producer claims whenever
/// fewer slots than the window are in flight, so even 1 passes a record of any size once the
/// consumer has drained the ring.
#[inline]
pub fn window_of(announced: u64, slot_count: u64) -> u64 {
    if announced == 0 || announced > slot_count { slot_count } else { announced }
}

/// A frame header word: `count` (bits 0–31), `stride` (32–47, 0: variable), `start` (48–63).
#[inline(always)]
pub fn frame_word(count: u32, stride: u16, start: u16) -> u64 {
    count as u64 | (stride as u64) << 32 | (start as u64) << 48
}

/// The lap tag of a record header at `position` in a ring of `1 << lap_shift` slots: bit 23
/// set (so a zeroed word never carries one), then the low 23 bits of the lap number. Only
/// the lap before must differ from it (see the module docs); 23 bits make a stale match
/// need 8 million laps of one word left untouched.
#[inline(always)]
pub fn lap_tag(position: u64, lap_shift: u32) -> u32 {
    ((position >> lap_shift) as u32 & 0x7f_ffff) | 0x80_0000
}

/// A record header word: `len` (bits 0–31), `kind` (32–39), the lap tag of `position`
/// (40–63).
#[inline(always)]
pub fn header_word(kind: u8, len: u32, position: u64, lap_shift: u32) -> u64 {
    len as u64 | (kind as u64) << 32 | (lap_tag(position, lap_shift) as u64) << 40
}

/// Whether a header word read at `position` was committed in that position's lap.
#[inline(always)]
pub fn committed(word: u64, position: u64, lap_shift: u32) -> bool {
    (word >> 40) as u32 == lap_tag(position, lap_shift)
}

/// Slots a record of `len` payload bytes takes: `ceil((8 + len) / slot_bytes)`.
#[inline]
pub fn record_slots(len: usize, slot_shift: u32) -> u64 {
    let bytes = (RECORD_HEADER_BYTES + len) as u64;
    (bytes + (1u64 << slot_shift) - 1) >> slot_shift
}
