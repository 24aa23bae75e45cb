//! # weir-ring: the shared-memory ring whose free slots are credits
//!
//! One ring joins one sending subtask to one receiving subtask (single producer, single
//! consumer). It lives in memory that another process can map: a file under the job's run
//! directory (the engine's default: `/dev/shm/weir-<uid>/...`), anonymous memory for
//! in-process channels, or the heap in tests.
//!
//! ## What it guarantees
//!
//! - **Bounded.** A ring has `slot_count` slots, fixed at creation; nothing grows.
//! - **Credit.** `credit = slot_count − (tail − head)` free slots. A producer with no credit
//!   gets [`Claim::NoCredit`] — a value, not an error — and writes nothing. That is the whole of
//!   backpressure: the sender cannot send until the receiver releases.
//! - **Credit by time.** The consumer may *announce* less: [`Consumer::announce`] stores, beside
//!   `head`, the most slots it wants in flight (what it drains in a target time; the engine
//!   measures that). The producer then claims only while `tail − head < announced`, within
//!   the free slots; a record that starts inside the window may end past it, so no announced
//!   value — zero, one, huge — can keep a sender from finishing the record it emits, and the
//!   ring is still allocated whole. Padding at the wrap needs only free slots.
//! - **Zero copy.** The producer claims space and serializes into it in place; the consumer
//!   reads a borrowed `&[u8]` in place. Records are contiguous: they never wrap.
//! - **No torn records.** A record becomes visible only when its header is committed (stored
//!   last, with Release, carrying its lap's tag), after all its bytes are written. A producer
//!   killed mid-write leaves nothing half-visible.
//! - **A bad peer cannot make us misbehave.** Positions and record headers read from shared
//!   memory are checked; a violation poisons the ring (both sides then get
//!   [`RingError::Poisoned`]) — never a panic, an out-of-bounds read or an endless loop.
//! - **No system call on the hot path.** A side that may park says so in the header; the other
//!   side checks a waiter flag after publishing and calls `futex_wake` only if it is set.
//!
//! ## The protocol
//!
//! Positions are u64 slot counts that only ever increase (2^64 slots is centuries of traffic);
//! a slot's index is `position & (slot_count − 1)`. The producer alone stores `tail`, the
//! consumer alone stores `head`, each on its own 128-byte line so they never share a cache line.
//!
//! The producer keeps a *cached* copy of `head` and re-reads the shared one only when the cached
//! view shows too little credit. The consumer does not read `tail` to find records: it polls
//! the record header at its read position, which is the record's *commit word* (see
//! [`layout`]), so a record crossing from one core to another moves one cache line — the
//! record's own — not `tail`'s line and then the record's. In the steady state each side
//! touches only its own line and the slots.
//!
//! To send, the producer `claim`s `ceil((8 + len) / slot_bytes)` slots at its tail. If the
//! record would cross the end of the ring it first writes a *padding* record over the rest
//! and claims at slot 0 (the padding is committed on its own, so it needs only its own
//! credit). It writes the payload in place, then `commit` writes the 8-byte record header
//! (length, kind, lap tag) and advances its private tail — except the header of a batch's
//! first record, which it keeps back. `publish` zeroes the word where the next record will
//! start (when that slot is free), stores the kept-back header with Release — which makes
//! the whole batch visible at once — and then stores the shared `tail`, for backlog figures,
//! tools, parking and a successor.
//!
//! To receive, the consumer loads the header word at its read position with Acquire; if it
//! carries this lap's tag, every byte of the record (and of the batch after it) is visible.
//! It validates the header (kind, length ≤ max, record before the end of the ring) and hands
//! out a view. `release` advances its private read position; `publish` stores `head` with
//! Release — once for a batch. Padding is skipped (after checking it reaches exactly to the
//! end). [`Consumer::read_batch`] does the same for up to a given number of records, handing
//! each to a closure, with one `publish` at the end.
//!
//! ## Frames
//!
//! [`Producer::append`] puts data records into a *frame*: one ring record (kind `Frame`)
//! whose payload holds a frame header (count, stride, start) and many records — at
//! `start + i × stride` when they share a size, or found through a table of end offsets at
//! the frame's end. The producer keeps one frame open and closes it (writes the headers,
//! moves its private tail) when it publishes, when the frame is full, or before it claims
//! any other record, so records and control records stay in order. A frame opens on the
//! credit of its first record alone, written where a plain record's payload goes; closed
//! with that one record it is written as a plain record, and a second record turns it into
//! a frame within the room the credit gave (so frames never take more of an announced
//! window than records would). The consumer checks a
//! frame once, from its own copy of the header (a variable frame's table in one pass),
//! then hands its records out one by one as `Data` — through [`Consumer::read`] and
//! [`Consumer::read_batch`] alike — without a dependent load per record; an 8-byte record
//! moves 8 bytes, not 16, and 64-byte records start on a cache line. The frame's slots are
//! released with its last record. A frame that does not describe its bytes poisons the ring
//! (`BadFrame`). The synchronisation is that of any record: a frame is seen only after the
//! Release store of the header that publishes it.
//!
//! ## Fast paths
//!
//! The producer keeps a *limit* derived from its cached positions,
//! `min(cached head + window, end of the tail's lap)` (window: the announced limit, at most
//! `slot_count`): a claim with `tail + slots <= limit`
//! has the credit and fits before the end of the ring, so it is granted with one compare and
//! no shared load. The limit only grows between recomputations, so a stale one sends a claim
//! down the general path, never past what was freed. The consumer hands out at once a
//! header committed in its lap whose kind is a record kind, whose length is at most the max
//! and whose record ends before the end of the ring. Everything else — nothing committed,
//! padding, would-block, a header that fails a check — takes the general path (out of line,
//! `#[cold]`), which reads the header again and poisons on a violation.
//!
//! The next record's position depends on this record's header, so a consumer taking records
//! one after another would wait for each cache miss (on lines the producer's core wrote) in
//! turn. It prefetches the line 1 KiB ahead of its read position when that line is below the
//! `tail` it last read, so the misses overlap; a batch that hands out more than 8 records
//! reads `tail` once for that (a round trip, a record or two, never does). It never
//! prefetches past it: the producer may be writing there, and would only have to take the
//! line back.
//!
//! Idle sides wait by an [`IdleStrategy`]. The `Park` strategy sleeps on a futex word in the
//! header (no `FUTEX_PRIVATE_FLAG`, so it works across processes). It sets `parks` once, then on
//! each park: set `waiting`, SeqCst fence, re-read the other side's position (the consumer:
//! the header word at its read position), sleep only if nothing changed. The other side, after publishing: if `parks`, SeqCst fence, read `waiting`,
//! and only if set, bump the futex word and wake. The two fences make it impossible for both to
//! miss each other (Dekker). Parked sides still wake every 100 ms to look at liveness.
//!
//! ## Ordering pairs
//!
//! | store (side)                                   | load (side)                               | what it carries |
//! |------------------------------------------------|-------------------------------------------|-----------------|
//! | a batch's first header Release, `Producer::publish` | the header word Acquire, `Consumer::read` (`FastView::check`, `next_slow`), `ready`, `ring::positions` | the batch's record bytes and later headers, and the zeroed word after it |
//! | `tail` Release, `Producer::publish` (after the header) | `tail` Acquire, `ring::positions`, `Consumer::backlog` | the records before it (for a new handle and figures) |
//! | `head` Release, `Consumer::publish`            | `head` Acquire, `Producer::refresh_head`  | the consumer is done with the slots (it may reuse them) |
//! | `announced` Relaxed + SeqCst fence (`Consumer::announce`) | `announced` after the fence in `Producer::prepare_park` | a raised limit wakes a parked producer |
//! | `magic` Release, `Region::init_header`         | `magic` Acquire, `validate_header`        | every other header field |
//! | `state` AcqRel `fetch_or(PRODUCER_CLOSED)`     | `state` Acquire, `Consumer::empty_or_closed` | the last header committed before the close |
//! | SeqCst fence after `waiting = 1` (`park`)      | SeqCst fence after position store (`wake_if_waiting`) | no lost wake-up |
//!
//! ## Liveness and files
//!
//! Each side records its pid, its process start time (so a reused pid is not mistaken for it)
//! and a heartbeat. Taking a role held by a live process is refused ([`AttachError::RoleTaken`]);
//! a role held by a dead process is taken over. A ring whose creator and sides are all dead is
//! stale and [`remove_if_stale`] deletes it. Attaching checks owner, mode 0600, no symlink,
//! magic, version and layout before touching a slot.

#![deny(missing_docs)]

#[cfg(not(loom))]
pub mod capi;
mod consumer;
#[cfg(not(loom))]
pub mod counters;
mod error;
#[cfg(not(loom))]
pub mod fiber;
mod frame;
mod futex;
pub use futex::{ParkToken, set_timer_slack, wait_any, wake};
#[cfg(not(loom))]
#[doc(hidden)]
pub mod fuzzing;
mod idle;
#[cfg(not(loom))]
pub mod ipc;
pub mod layout;
#[cfg(not(loom))]
mod observer;
#[cfg(not(loom))]
pub mod private_file;
pub mod process;
mod producer;
mod region;
mod ring;
mod sync;

pub use consumer::{Batch, Consumer, Read, RecordView};
pub use error::{AttachError, ClaimError, ConfigError, CreateError, PoisonReason, RingError};
pub use frame::Stride;
pub use idle::{DEFAULT_PARK_SPIN, IdleStep, IdleStrategy, Idler};
pub use layout::RecordKind;
#[cfg(not(loom))]
pub use observer::Observer;
pub use producer::{Append, Claim, FrameSlot, Producer, WriteSlot};
pub use region::RingConfig;
pub use ring::{Ring, RingStatus, SideStatus};
#[cfg(not(loom))]
pub use ring::{channel, remove_if_stale};
