//! The receiving side: read a borrowed view in place → release → publish.

use crate::error::{PoisonReason, RingError};
use crate::frame::{self, Cursor};
use crate::futex::{self, ParkToken};
use crate::idle::{IdleStep, Idler};
use crate::layout::{POISONED, PRODUCER_CLOSED, RECORD_HEADER_BYTES, RecordKind};
use crate::region::{Region, RegionBase};
use crate::ring::{self, Role};
use crate::sync::{Arc, Ordering, fence};
use std::time::Duration;

/// Outcome of a read.
#[derive(Debug)]
pub enum Read<'a> {
    /// The next record, borrowed in place.
    Record(RecordView<'a>),
    /// Nothing published yet (would block). Deferred releases were published first.
    Empty,
    /// The producer closed the ring and every record was read.
    Closed,
}

/// Outcome of a [`Consumer::read_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    /// This many records were handed out, released, and the releases published: at least
    /// one, unless the batch asked for none.
    Records(usize),
    /// Nothing published yet (would block). Earlier deferred releases were published first.
    Empty,
    /// The producer closed the ring and every record was read.
    Closed,
}

/// The one receiving handle of a ring.
///
/// Positions kept here: `read_pos` (the next record to read), `released` (the last
/// `head` stored to shared memory, `<= read_pos`) and `cached_tail` (the producer's `tail`
/// as last read: only for `backlog` and as the bound of prefetching — what is readable is
/// told by the record headers themselves, see the layout docs).
#[derive(Debug)]
pub struct Consumer {
    // The fields a read and a release touch come first, in one cache line.
    read_pos: u64,
    base: RegionBase,
    mask: u64,
    shift: u32,
    /// `log2(slot_count)`: a position's lap, whose tag a committed header carries.
    lap_shift: u32,
    max_record_bytes: u32,
    cached_tail: u64,
    /// Slots ahead of `read_pos` to prefetch (`PREFETCH_BYTES` worth), see `prefetch_ahead`.
    prefetch_slots: u64,
    released: u64,
    /// Deferred releases are published once this many slots are pending.
    release_batch_slots: u64,
    slot_count: u64,
    /// The frame being read (`left == 0`: none). `read_pos` stays at the frame's record
    /// until its last record is released, then moves past the whole frame.
    frame: Cursor,
    region: Arc<Region>,
    /// Dropped after [`detach`](Consumer::detach): leave the role without closing the ring.
    detached: bool,
    /// Reads that found nothing, for the look at `tail` every [`EMPTIES_PER_CHECK`].
    empties: u32,
}

/// Every this many reads that find nothing, the consumer checks that `tail` was not
/// published past a record that is not committed ([`PoisonReason::Uncommitted`]); it also
/// checks before each park. A peer that moves `tail` and commits nothing is caught within
/// that many empty reads or one park, not waited on for ever.
const EMPTIES_PER_CHECK: u32 = 64;

/// A record the fast path found valid at `read_pos`.
struct Found {
    index: u64,
    len: usize,
    kind: RecordKind,
    slots: u64,
}

/// What the slow path found at `read_pos`.
enum Next {
    /// A valid record (padding already skipped); `limit` covers it.
    Record(Found),
    /// Nothing committed at `read_pos`.
    Empty,
    /// Closed and everything read.
    Closed,
}

/// Bytes ahead of the read position whose cache line the consumer prefetches. Measured with
/// `examples/hot_path.rs threads` (two pinned threads, SCHED_FIFO, Xeon VM): 8-byte records
/// in batches took 8.0 ns each without prefetch, 5.0 at 256 bytes ahead, 3.3 at 512 and at
/// 1024; 64-byte records 8.0, 6.9, 5.8 and 5.0 ns (2048: no better).
const PREFETCH_BYTES: u64 = 1024;

/// Records a batch hands out before it reads `tail` once, to prefetch within what is
/// published: a batch of a few records (a round trip) never reads `tail`, so a hop moves one
/// cache line.
const PREFETCH_AFTER: usize = 8;

/// What the fast path needs, copied out of a `Consumer` so that a loop over records keeps it
/// in registers.
#[derive(Clone, Copy)]
struct FastView {
    base: RegionBase,
    mask: u64,
    shift: u32,
    lap_shift: u32,
    max_record_bytes: u32,
    slot_count: u64,
    // Only the prefetch reads these, and there is none under loom.
    #[cfg_attr(loom, allow(dead_code))]
    prefetch_bound: u64,
    #[cfg_attr(loom, allow(dead_code))]
    prefetch_slots: u64,
}

impl FastView {
    #[inline(always)]
    fn of(c: &Consumer) -> FastView {
        FastView {
            base: c.base,
            mask: c.mask,
            shift: c.shift,
            lap_shift: c.lap_shift,
            max_record_bytes: c.max_record_bytes,
            slot_count: c.slot_count,
            prefetch_bound: c.cached_tail,
            prefetch_slots: c.prefetch_slots,
        }
    }

    /// The record at `pos` if its header is committed (this lap's tag) and checks out, else
    /// `None`. Everything that passes here passes `next_slow`'s checks too (kind a
    /// non-padding kind, `len <= max_record_bytes`, the record before the end of the ring);
    /// what fails is left to `next_slow`, which reads the header again and says Empty, or
    /// poisons the ring if it is bad. (Under loom the caller notes the read.)
    #[inline(always)]
    fn check(&self, pos: u64) -> Option<Found> {
        let index = pos & self.mask;
        // SYNC POINT Acquire: pairs with the Release store of a batch's first header in
        // Producer::publish_tail: a committed header's record, and every header and record
        // after it in the batch, were written before it. One load, so the value we check is
        // the value we use even if a misbehaving peer writes the word meanwhile.
        let word = u64::from_le(self.base.commit_word(index, self.shift).load(Ordering::Acquire));
        if !crate::layout::committed(word, pos, self.lap_shift) {
            return None;
        }
        let len = word as u32;
        let kind_byte = (word >> 32) as u8;
        // Data, Barrier, Watermark, EndOfStream are 1..=4; padding (5), frames (6: opened
        // once per frame, by the slow path) and bad kinds go slow.
        if kind_byte.wrapping_sub(1) >= 4 || len > self.max_record_bytes {
            return None;
        }
        let slots = crate::layout::record_slots(len as usize, self.shift);
        // len < 2^32, so index + slots cannot overflow.
        if index + slots > self.slot_count {
            return None;
        }
        self.prefetch_ahead(pos);
        let kind = match kind_byte {
            1 => RecordKind::Data,
            2 => RecordKind::Barrier,
            3 => RecordKind::Watermark,
            _ => RecordKind::EndOfStream,
        };
        Some(Found { index, len: len as usize, kind, slots })
    }

    /// The payload of the record at slot `index`, `len` bytes.
    #[inline(always)]
    fn payload<'a>(&self, index: u64, len: usize) -> &'a [u8] {
        // SAFETY: the caller has `check`ed the record: it starts at read_pos, committed by the
        // producer (Acquire of its header), lies inside the ring, and is not yet released,
        // so the producer will not write it. The caller ties 'a to its borrow
        // of the consumer (it hands the slice only to a call that cannot keep it).
        unsafe { std::slice::from_raw_parts(self.base.slot_ptr(index, self.shift).add(RECORD_HEADER_BYTES), len) }
    }

    /// Prefetch the cache line `PREFETCH_BYTES` ahead of `pos` if it is published (below the
    /// `tail` last read): the next record's position depends on this record's header, so
    /// without it the misses on consecutive lines (written by the producer's core) would be
    /// taken one after another. Lines past it are left alone: the producer may still be
    /// writing them, and pulling them here would only make it take them back.
    #[inline(always)]
    fn prefetch_ahead(&self, pos: u64) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        {
            let ahead = pos + self.prefetch_slots;
            if ahead < self.prefetch_bound {
                let p = self.base.slot_ptr(ahead & self.mask, self.shift);
                // SAFETY: a prefetch is a hint: it reads nothing the program sees and cannot
                // fault; `p` is inside our mapping anyway (the index is masked). SSE, which
                // `_mm_prefetch` needs, is part of x86_64.
                unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8) };
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(loom))))]
        let _ = pos;
    }
}

impl Consumer {
    /// A handle continuing at the published head; fails (poisoning the ring) if the shared
    /// positions are already broken, since what is readable is computed from them.
    pub(crate) fn new(region: Arc<Region>) -> Result<Consumer, RingError> {
        let (tail, head) = ring::positions(&region)?;
        let consumer = Consumer {
            read_pos: head,
            base: region.base(),
            slot_count: region.slot_count,
            mask: region.slot_count - 1,
            shift: region.slot_shift,
            lap_shift: region.slot_count.trailing_zeros(),
            max_record_bytes: region.max_record_bytes,
            cached_tail: tail,
            prefetch_slots: (PREFETCH_BYTES >> region.slot_shift).max(1),
            released: head,
            release_batch_slots: (region.slot_count / 4).max(1),
            frame: Cursor::default(),
            region,
            detached: false,
            empties: 0,
        };
        // A new consumer (a takeover after a crash, an attach) has measured nothing yet: an
        // announcement its predecessor left would throttle the producer for good.
        let h = consumer.base.header();
        if h.head.announced.swap(0, Ordering::Relaxed) != 0 {
            ring::wake_if_waiting(&h.producer_park);
        }
        Ok(consumer)
    }

    /// Whether a read now finds something: a header committed at the read position (a
    /// record, or padding before one), or records left in the frame being read. Publishes
    /// nothing (a read that finds the ring empty publishes the releases); one load.
    pub fn ready(&self) -> bool {
        if self.frame.left != 0 {
            return true;
        }
        // SYNC POINT Acquire: as in FastView::check.
        let word = self.base.commit_word(self.read_pos & self.mask, self.shift).load(Ordering::Acquire);
        crate::layout::committed(u64::from_le(word), self.read_pos, self.lap_shift)
    }

    /// Used slots: `tail − head`, with a fresh tail and our released head (0 while we are
    /// ahead of the stored `tail`, which the producer stores after the headers).
    pub fn backlog(&mut self) -> Result<u64, RingError> {
        self.refresh_tail()?;
        Ok(self.cached_tail.saturating_sub(self.released))
    }

    /// The next record, borrowed in place; `Empty` if none is published; `Closed` once the
    /// producer closed and all was read. Reading again without releasing returns the same
    /// record. Everything read from shared memory is checked: a violation poisons the ring.
    #[inline(always)]
    pub fn read(&mut self) -> Result<Read<'_>, RingError> {
        // A frame being read comes first, before anything is read at `read_pos` (where its
        // header sits, and where a peer could rewrite it: the checked copy is what counts).
        if self.frame.left != 0 {
            return self.read_in_frame();
        }
        let found = match self.next_fast() {
            Some(found) => found,
            None => match self.next_warm()? {
                Next::Record(found) => found,
                Next::Empty => return Ok(Read::Empty),
                Next::Closed => return Ok(Read::Closed),
            },
        };
        if found.kind == RecordKind::Frame {
            return self.read_new_frame(&found);
        }
        let Found { index, len, kind, slots } = found;
        let at = ((index << self.shift) as usize) + RECORD_HEADER_BYTES;
        Ok(Read::Record(RecordView { consumer: self, at, len, kind, slots }))
    }

    /// The frame record `found` is next: check it and start reading it (poisoning the
    /// ring if it does not describe its bytes).
    #[cold]
    #[inline(never)]
    fn enter_frame(&mut self, found: &Found) -> Result<(), RingError> {
        let at = ((found.index << self.shift) as usize) + RECORD_HEADER_BYTES;
        match frame::open(self.base, at, found.len, found.slots, self.max_record_bytes) {
            Ok(cursor) => {
                self.frame = cursor;
                Ok(())
            }
            Err(word) => Err(ring::poison(&self.region, PoisonReason::BadFrame, word)),
        }
    }

    /// Open the frame `found` and return its first record (out of line: once per frame).
    #[inline(never)]
    fn read_new_frame(&mut self, found: &Found) -> Result<Read<'_>, RingError> {
        self.enter_frame(found)?;
        self.read_in_frame()
    }

    /// The next record of the frame being read, as a view (not released). Out of line, so
    /// that `read` of plain records stays as small as it was before frames.
    #[inline(never)]
    fn read_in_frame(&mut self) -> Result<Read<'_>, RingError> {
        match self.frame.peek(self.base) {
            Some((at, len)) => {
                Ok(Read::Record(RecordView { consumer: self, at, len, kind: RecordKind::Data, slots: 0 }))
            }
            None => Err(self.frame_changed()),
        }
    }

    /// A variable frame's table changed after it was checked: a peer wrote into published
    /// bytes.
    #[cold]
    fn frame_changed(&self) -> RingError {
        ring::poison(&self.region, PoisonReason::BadFrame, self.frame.left as u64)
    }

    /// The frame's current record (ending at `end`) was released: step past it, and past
    /// the whole frame after its last record.
    #[inline(always)]
    fn frame_step(&mut self, end: usize) {
        if self.frame.step(end) {
            self.read_pos += self.frame.slots;
        }
    }

    /// Hand up to `room` records of the frame being read to `f`, releasing each after `f`
    /// returns (so a panic in `f` leaves its record unreleased). Returns how many were
    /// handed out and whether `f` wants more. `RUNS`: a fixed frame's records go to `f` as
    /// one run (`count × stride` bytes), released together once `f` returns.
    #[inline(always)]
    fn drain_frame<F, const RUNS: bool>(&mut self, room: usize, f: &mut F) -> Result<(usize, bool), RingError>
    where
        F: FnMut(RecordKind, &[u8], usize) -> bool,
    {
        let n = (self.frame.left as usize).min(room);
        let base = self.base;
        if self.frame.stride != 0 {
            // Fixed: addresses from the loop index; nothing is loaded from the ring but the
            // records themselves.
            let stride = self.frame.stride as usize;
            let mut at = self.frame.next;
            if RUNS {
                // SAFETY: as below, for the n records from `at` on: `frame::open` checked
                // start + count × stride == the frame's length, and n <= the records left.
                let run = unsafe { std::slice::from_raw_parts(base.area_ptr(at), n * stride) };
                let go_on = f(RecordKind::Data, run, stride);
                if self.frame.step_run(n as u32, at + n * stride) {
                    self.read_pos += self.frame.slots;
                }
                return Ok((n, go_on));
            }
            for i in 0..n {
                // SAFETY: `frame::open` checked start + count × stride == the frame's
                // length, and the frame record starts at read_pos: committed (Acquire of its
                // header), inside the ring, not yet released.
                let payload = unsafe { std::slice::from_raw_parts(base.area_ptr(at), stride) };
                let go_on = f(RecordKind::Data, payload, stride);
                at += stride;
                self.frame_step(at);
                if !go_on {
                    return Ok((i + 1, false));
                }
            }
            return Ok((n, true));
        }
        for i in 0..n {
            let Some((at, len)) = self.frame.peek(base) else { return Err(self.frame_changed()) };
            // SAFETY: `peek` checked the record lies in the frame's data, which lies in the
            // frame record at read_pos, as above.
            let payload = unsafe { std::slice::from_raw_parts(base.area_ptr(at), len) };
            let go_on = f(RecordKind::Data, payload, len);
            self.frame_step(at + len);
            if !go_on {
                return Ok((i + 1, false));
            }
        }
        Ok((n, true))
    }

    /// Read up to `max` records in order, handing each to `f` with its kind and payload
    /// (borrowed in place for the call), releasing each once `f` returns, and publishing
    /// the releases once, at the end. `f` returns whether to go on: `false` ends the batch
    /// after that record (which counts as read and released).
    ///
    /// It hands out records while their headers say they are committed, up to `max`, and
    /// publishes its releases once, at the end (records taken one by one may cost a store of
    /// `head` each). A batch that hands out more than a few records reads `tail` once, to
    /// prefetch ahead within what is published. `Empty` (after publishing earlier deferred
    /// releases) and `Closed` are as from [`Consumer::read`]; `max == 0` reads nothing and
    /// returns `Records(0)`.
    ///
    /// Records are checked as `read` checks them; a violation poisons the ring and is
    /// returned, after the records before it were released. If `f` panics, its record is
    /// not released; those before it are (published by the next publish or by the drop).
    #[inline]
    pub fn read_batch<F>(&mut self, max: usize, mut f: F) -> Result<Batch, RingError>
    where
        F: FnMut(RecordKind, &[u8]) -> bool,
    {
        self.read_batch_of::<_, false>(max, |kind, payload, _| f(kind, payload))
    }

    /// Read up to `max` records as [`read_batch`] does, a run at a time: the records of a
    /// frame of fixed stride (the engine's frames of fixed-layout records) come to `f` as
    /// one run, `count × stride` bytes with record i at `i × stride` (`chunks_exact(stride)`,
    /// or a typed slice of a fixed-layout type), any other record as a run of one (its
    /// stride is its length; an empty record is a run of one with stride 0). `f(kind, run, stride)` returns whether to go on; a run counts
    /// as read and is released once `f` returns (a panic in `f` leaves its whole run
    /// unreleased). What `read_batch` checks, this checks: a frame's shape is validated once,
    /// when it is opened, and a run never reaches past it.
    ///
    /// [`read_batch`]: Consumer::read_batch
    #[inline]
    pub fn read_runs<F>(&mut self, max: usize, f: F) -> Result<Batch, RingError>
    where
        F: FnMut(RecordKind, &[u8], usize) -> bool,
    {
        self.read_batch_of::<_, true>(max, f)
    }

    #[inline(always)]
    fn read_batch_of<F, const RUNS: bool>(&mut self, max: usize, mut f: F) -> Result<Batch, RingError>
    where
        F: FnMut(RecordKind, &[u8], usize) -> bool,
    {
        let mut count = 0;
        while count < max {
            if self.frame.left != 0 {
                match self.drain_frame::<F, RUNS>(max - count, &mut f) {
                    Ok((n, go_on)) => {
                        count += n;
                        if !go_on {
                            break;
                        }
                        continue;
                    }
                    Err(e) => {
                        self.publish();
                        return Err(e);
                    }
                }
            }
            // The fast loop, on local copies: `f` and the slot bytes are reached through
            // pointers the compiler cannot tell apart from `self`, so fields read inside the
            // loop would be loaded again for every record. `self.read_pos` is stored per
            // record, so a panic in `f` leaves exactly the records before it released.
            let mut fast = FastView::of(self);
            let mut pos = self.read_pos;
            while count < max {
                if count == PREFETCH_AFTER {
                    // A batch is flowing: learn how far is published, to prefetch within it.
                    self.refresh_prefetch_bound();
                    fast.prefetch_bound = self.cached_tail;
                }
                let Some(found) = fast.check(pos) else { break };
                self.region.track_read(found.index, found.slots);
                let go_on = f(found.kind, fast.payload(found.index, found.len), found.len);
                pos += found.slots;
                self.read_pos = pos;
                count += 1;
                if !go_on {
                    self.publish();
                    return Ok(Batch::Records(count));
                }
            }
            if count == max {
                break;
            }
            // Nothing committed (or padding, a frame, a bad header). Until a record is handed
            // out this is `read`'s slow path: publish, look at the state, so `Empty` and
            // `Closed` mean what they mean there. After, our releases are published once, at
            // the end.
            let found = match self.next_slow(count == 0) {
                Ok(Next::Record(found)) => found,
                Ok(Next::Empty) if count == 0 => return Ok(Batch::Empty),
                Ok(Next::Closed) if count == 0 => return Ok(Batch::Closed),
                Ok(Next::Empty | Next::Closed) => break,
                Err(e) => {
                    self.publish();
                    return Err(e);
                }
            };
            if found.kind == RecordKind::Frame {
                if let Err(e) = self.enter_frame(&found) {
                    self.publish();
                    return Err(e);
                }
                continue;
            }
            let go_on = f(found.kind, self.payload(found.index, found.len), found.len);
            self.read_pos += found.slots;
            count += 1;
            if !go_on {
                break;
            }
        }
        self.publish();
        Ok(Batch::Records(count))
    }

    /// The payload of the record at slot `index`, `len` bytes.
    #[inline(always)]
    fn payload(&self, index: u64, len: usize) -> &[u8] {
        // SAFETY: the record starts at read_pos, committed by the producer (Acquire of its
        // header) and not yet released, so the producer will not write it; the read that
        // found it checked that it fits before the end of the ring.
        unsafe { std::slice::from_raw_parts(self.base.slot_ptr(index, self.shift).add(RECORD_HEADER_BYTES), len) }
    }

    /// The record at `read_pos`, if its header is committed and checks out; `None` sends
    /// the caller to `next_slow` (nothing committed, padding, a frame, or a bad header, which
    /// the slow path reads again and poisons on).
    #[inline(always)]
    fn next_fast(&mut self) -> Option<Found> {
        let found = FastView::of(self).check(self.read_pos)?;
        self.region.track_read(found.index, found.slots);
        Some(found)
    }

    /// `read` past the fast path: publish our releases first (the producer may be waiting
    /// for them), then `next_slow`. Inlined into `read`: as a call, with its result returned
    /// through memory, it added about 4% to a round trip.
    #[inline(always)]
    fn next_warm(&mut self) -> Result<Next, RingError> {
        self.next_slow(true)
    }

    /// The general read: read the header at `read_pos` again; not committed: Empty or
    /// Closed, as the state says (publishing our releases first if `publish_first`); skip
    /// padding, check the header, and poison on a violation.
    #[cold]
    #[inline(never)]
    fn next_slow(&mut self, publish_first: bool) -> Result<Next, RingError> {
        loop {
            let index = self.read_pos & self.mask;
            // SYNC POINT Acquire: as in FastView::check. One load: a misbehaving peer may
            // still write the word; we validate what we got.
            let word = u64::from_le(self.base.commit_word(index, self.shift).load(Ordering::Acquire));
            if !crate::layout::committed(word, self.read_pos, self.lap_shift) {
                // Hand back credit before we say "empty": the producer may be waiting for it.
                if publish_first {
                    self.publish();
                }
                return self.empty_or_closed();
            }
            self.region.track_read(index, 1);
            let len = word as u32;
            let kind_byte = (word >> 32) as u8;
            let to_end = self.slot_count - index;
            match RecordKind::from_byte(kind_byte) {
                Some(RecordKind::Padding) => {
                    // Padding reaches exactly to the end, and never fills the whole ring (no
                    // record needs that: a record fits the ring).
                    if len as u64 + RECORD_HEADER_BYTES as u64 != to_end << self.shift || index == 0 {
                        return Err(ring::poison(&self.region, PoisonReason::BadPadding, len as u64));
                    }
                    self.read_pos += to_end;
                }
                Some(kind) => {
                    // A frame is bounded by the ring; its records by the max (when opened).
                    if len > self.max_record_bytes && kind != RecordKind::Frame {
                        return Err(ring::poison(&self.region, PoisonReason::BadLength, len as u64));
                    }
                    let slots = crate::layout::record_slots(len as usize, self.shift);
                    if slots > to_end {
                        return Err(ring::poison(&self.region, PoisonReason::BadLength, len as u64));
                    }
                    self.region.track_read(index, slots);
                    return Ok(Next::Record(Found { index, len: len as usize, kind, slots }));
                }
                None => return Err(ring::poison(&self.region, PoisonReason::BadKind, kind_byte as u64)),
            }
        }
    }

    #[cold]
    fn empty_or_closed(&mut self) -> Result<Next, RingError> {
        let h = self.base.header();
        // SYNC POINT Acquire: pairs with the AcqRel fetch_or of PRODUCER_CLOSED in Producer::drop,
        // which comes after its last publish.
        let state = h.state.load(Ordering::Acquire);
        // A `closed` (or any) bit is believed only from a header that is still the one we
        // attached to: garbage over the header is not an end of stream. (The same cache line
        // as `state`: no extra miss.)
        ring::check_header(&self.region)?;
        self.empties = self.empties.wrapping_add(1);
        if self.empties.is_multiple_of(EMPTIES_PER_CHECK) {
            self.check_published()?;
        }
        if state & POISONED != 0 {
            return Err(ring::poison_error(&self.region));
        }
        if state & PRODUCER_CLOSED != 0 {
            // Everything the producer committed is visible now: a record at `read_pos` is
            // the slow path's again, else the stream is over.
            let index = self.read_pos & self.mask;
            let word = u64::from_le(self.base.commit_word(index, self.shift).load(Ordering::Acquire));
            if crate::layout::committed(word, self.read_pos, self.lap_shift) {
                return self.next_slow(false);
            }
            return Ok(Next::Closed);
        }
        Ok(Next::Empty)
    }

    /// `tail` published past our read position while the header there is not committed: the
    /// producer stores `tail` after the headers it publishes (Release; our load is Acquire),
    /// so that header should be visible. Poisoned ([`PoisonReason::Uncommitted`]): nothing
    /// would ever fill it. Cold (a load of the producer's line): every
    /// [`EMPTIES_PER_CHECK`] empty reads, and before a park.
    #[cold]
    fn check_published(&self) -> Result<(), RingError> {
        // (Not under loom: see `ring::check_header`.)
        if cfg!(loom) || self.frame.left != 0 {
            return Ok(());
        }
        // SYNC POINT Acquire: pairs with the Release store of `tail` in Producer::publish_tail;
        // every header before the tail it stored is visible after it.
        let tail = self.base.header().tail.value.load(Ordering::Acquire);
        if tail <= self.read_pos || tail - self.read_pos > self.slot_count {
            // Nothing published ahead of us, or a tail out of range (`backlog` says so).
            return Ok(());
        }
        let word = self.base.commit_word(self.read_pos & self.mask, self.shift).load(Ordering::Acquire);
        if crate::layout::committed(u64::from_le(word), self.read_pos, self.lap_shift) {
            return Ok(());
        }
        Err(ring::poison(&self.region, PoisonReason::Uncommitted, self.read_pos))
    }

    /// Load `tail` (for `backlog`), poisoning the ring if it went back or is more than a
    /// ring past what we released. (We may be ahead of it: the producer stores it after the
    /// headers it publishes.)
    fn refresh_tail(&mut self) -> Result<(), RingError> {
        // SYNC POINT Acquire: pairs with the Release store of `tail` in Producer::publish_tail.
        let tail = self.base.header().tail.value.load(Ordering::Acquire);
        if tail < self.cached_tail || tail > self.released + self.slot_count {
            return Err(ring::poison(&self.region, PoisonReason::TailOutOfRange, tail));
        }
        self.cached_tail = tail;
        Ok(())
    }

    /// Load `tail` as the bound of prefetching only: a hint, so a bad value is not an error
    /// (it is clamped to a ring ahead of us, and the prefetch masks its index anyway).
    #[inline(never)]
    fn refresh_prefetch_bound(&mut self) {
        let tail = self.base.header().tail.value.load(Ordering::Relaxed);
        self.cached_tail = tail.clamp(self.cached_tail, self.released + self.slot_count);
    }

    /// Publish every release: one Release store of `head`, a wake-up only if the producer
    /// is parked waiting for credit.
    #[inline(always)]
    pub fn publish(&mut self) {
        if self.read_pos == self.released {
            return;
        }
        self.released = self.read_pos;
        let h = self.base.header();
        // SYNC POINT Release: pairs with the Acquire load of `head` in Producer::refresh_head;
        // says we are done reading every slot before it.
        h.head.value.store(self.read_pos, Ordering::Release);
        ring::wake_if_waiting(&h.producer_park);
    }

    /// Announce the most slots we want in flight (credit by time): the producer claims only
    /// while fewer are, within the free slots, from its next refresh of `head` on. 0, or
    /// anything from `slot_count` up, lifts the limit. Costs a store and, if the producer
    /// may park, a fence: call it when the limit changes, not per record. A producer parked
    /// for credit is woken, so a raised limit is seen at once.
    pub fn announce(&mut self, slots: u64) {
        let h = self.base.header();
        let slots = if slots >= self.slot_count { 0 } else { slots };
        if h.head.announced.load(Ordering::Relaxed) == slots {
            return;
        }
        h.head.announced.store(slots, Ordering::Relaxed);
        // The fence inside pairs with the producer's in `prepare_park` (see the crate docs).
        ring::wake_if_waiting(&h.producer_park);
    }

    /// Slots in the ring.
    pub fn slot_count(&self) -> u64 {
        self.slot_count
    }

    /// Slots read so far (only ever grows): the drain rate is its change over time.
    pub fn position(&self) -> u64 {
        self.read_pos
    }

    /// Released slots not yet published.
    pub fn unpublished_slots(&self) -> u64 {
        self.read_pos - self.released
    }

    /// Deferred releases are published once this many slots are pending (default: a
    /// quarter of the ring), so a consumer that never runs dry still returns credit.
    pub fn set_release_batch_slots(&mut self, slots: u64) {
        self.release_batch_slots = slots.clamp(1, self.slot_count);
    }

    /// Wait until a record is published or the ring closes, idling by `idler`. Then
    /// [`Consumer::read`] will not return `Empty`. Errors if the ring is poisoned.
    pub fn wait_for_record(&mut self, idler: &mut Idler) -> Result<(), RingError> {
        loop {
            // Ask `read`, not the positions: what was published may be only the padding
            // before a wrap (a producer out of credit publishes it on its own), and then
            // `read` would say Empty. `read` skips padding, publishes our releases, refreshes
            // the tail and looks at the state; the record it finds is not released, so the
            // caller's next `read` returns it again.
            if !matches!(self.read()?, Read::Empty) {
                idler.reset();
                return Ok(());
            }
            if let Some(IdleStep::Park) = idler.idle(0) {
                self.park(ring::PARK_BACKSTOP);
            }
        }
    }

    /// Sleep on the consumer's futex word until the producer publishes (or `timeout`).
    pub fn park(&mut self, timeout: Duration) {
        let first = self.base.header().consumer_park.parks.load(Ordering::Relaxed) == 0;
        if let Some(token) = self.prepare_park() {
            // The first park may have raced with the producer reading `parks` as 0: keep it short.
            futex::wait(token.word, token.expected, if first { ring::FIRST_PARK } else { timeout });
        }
        self.end_park();
    }

    /// Announce that we are about to sleep until the producer publishes, for a caller that
    /// waits on several words at once ([`crate::wait_any`]). `None`: a record, a close or a
    /// poison is visible already — don't sleep. Either way call [`Consumer::end_park`] after.
    pub fn prepare_park(&self) -> Option<ParkToken<'_>> {
        let h = self.base.header();
        let line = &h.consumer_park;
        if line.parks.load(Ordering::Relaxed) == 0 {
            line.parks.store(1, Ordering::SeqCst);
        }
        let expected = line.wake.load(Ordering::Acquire);
        line.waiting.store(1, Ordering::Relaxed);
        // SYNC POINT SeqCst fence: pairs with the fence in `ring::wake_if_waiting` called by
        // Producer::publish. Either the producer sees `waiting` and wakes us, or we see the
        // header it committed at our read position.
        fence(Ordering::SeqCst);
        let word = u64::from_le(self.base.commit_word(self.read_pos & self.mask, self.shift).load(Ordering::Relaxed));
        let state = h.state.load(Ordering::Relaxed);
        if crate::layout::committed(word, self.read_pos, self.lap_shift) || state != 0 || self.frame.left != 0 {
            return None;
        }
        // Before a sleep: a peer that published a tail past nothing, or wrote over the
        // header, is not waited on (the ring is poisoned: the next read says so).
        if ring::check_header(&self.region).is_err() || self.check_published().is_err() {
            return None;
        }
        ring::heartbeat(&h.consumer);
        Some(ParkToken { word: &line.wake, expected })
    }

    /// Done sleeping (or decided not to).
    pub fn end_park(&self) {
        self.base.header().consumer_park.waiting.store(0, Ordering::Relaxed);
    }

    /// Write `bytes` over the header as a scribbling peer would, for the fuzzer: in order the
    /// magic (8 bytes), version, header, slot and max record sizes, then the state and the
    /// poison code (4 bytes each); fields past the end of `bytes` keep their value.
    #[cfg(not(loom))]
    pub(crate) fn scribble_header(&self, bytes: &[u8]) {
        let h = self.base.header();
        let word = |at: usize, n: usize| -> Option<u64> {
            let b = bytes.get(at..at + n)?;
            let mut w = [0u8; 8];
            w[..n].copy_from_slice(b);
            Some(u64::from_le_bytes(w))
        };
        if let Some(v) = word(0, 8) {
            h.magic.store(v, Ordering::Relaxed);
        }
        let fields =
            [&h.version, &h.header_bytes, &h.slot_bytes, &h.slot_count, &h.max_record_bytes, &h.state, &h.poison_code];
        for (i, f) in fields.into_iter().enumerate() {
            if let Some(v) = word(8 + 4 * i, 4) {
                f.store(v as u32, Ordering::Relaxed);
            }
        }
    }

    /// Check what a peer may have broken that no read shows: the header's fixed fields
    /// written over ([`PoisonReason::HeaderChanged`]), or `tail` published past a record that
    /// is not committed ([`PoisonReason::Uncommitted`]); either poisons the ring. Reads that
    /// find nothing and parks do it on their own (see `EMPTIES_PER_CHECK`); a caller that
    /// waits some other way calls it before it waits.
    pub fn check_peer(&self) -> Result<(), RingError> {
        ring::check_header(&self.region)?;
        self.check_published()
    }

    /// Mark the ring poisoned on purpose.
    pub fn poison(&self, detail: u64) -> RingError {
        ring::poison(&self.region, PoisonReason::Application, detail)
    }

    /// Record a sign of life in the header.
    pub fn heartbeat(&self) {
        ring::heartbeat(&self.base.header().consumer);
    }

    /// Whether the producer is still attached and alive (a system call: not for hot loops).
    pub fn producer_alive(&self) -> bool {
        ring::side_alive(&self.base.header().producer)
    }
}

impl Consumer {
    /// Publish the releases, then leave the consumer role without closing the ring: the
    /// producer keeps sending while there is room, and another consumer may take the role
    /// over (it goes on at the published head).
    pub fn detach(mut self) {
        self.detached = true;
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.publish();
        let h = self.base.header();
        if self.detached {
            ring::release_role(&self.region, Role::Consumer);
            return;
        }
        h.state.fetch_or(crate::layout::CONSUMER_CLOSED, Ordering::AcqRel);
        ring::release_role(&self.region, Role::Consumer);
        ring::wake_if_waiting(&h.producer_park);
    }
}

/// One record, borrowed in place from the ring. Release it when done; dropped without
/// release, the same record is read again.
#[derive(Debug)]
pub struct RecordView<'a> {
    consumer: &'a mut Consumer,
    /// Byte offset of the payload in the slot area.
    at: usize,
    len: usize,
    kind: RecordKind,
    /// Slots of a plain record; 0 for a record of a frame.
    slots: u64,
}

impl RecordView<'_> {
    /// What the record is.
    #[inline]
    pub fn kind(&self) -> RecordKind {
        self.kind
    }

    /// The payload, in place.
    #[inline(always)]
    pub fn payload(&self) -> &[u8] {
        // SAFETY: the read that made this view checked the record: it lies at read_pos (or in
        // the frame there), committed (Acquire of its header), inside the ring, and
        // not yet released, so the producer will not write it while the view borrows the
        // consumer.
        unsafe { std::slice::from_raw_parts(self.consumer.base.area_ptr(self.at), self.len) }
    }

    /// Copy the payload out of shared memory into `out` (8-aligned words, resized to fit)
    /// and return the copy, without making a reference to the shared bytes: for a reader
    /// that must not trust its peer (an ipc endpoint's publisher may rewrite a record while
    /// it is read; what is checked and decoded is then the private copy).
    pub fn copy_payload<'b>(&self, out: &'b mut Vec<u64>) -> &'b [u8] {
        out.clear();
        out.resize(self.len.div_ceil(8), 0);
        let dst = out.as_mut_ptr() as *mut u8;
        // SAFETY: the record lies inside the slot area (checked by the read that made this
        // view); `out` holds at least `len` bytes (resized above) and does not overlap the
        // mapping. The bytes are read once, by raw pointer: a peer writing them meanwhile
        // can change what we copy, not what we later check and decode.
        unsafe {
            std::ptr::copy_nonoverlapping(self.consumer.base.area_ptr(self.at), dst, self.len);
            std::slice::from_raw_parts(dst, self.len)
        }
    }

    /// Slots this record takes; 0 for a record of a frame (the frame's slots are released
    /// with its last record).
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Step past this record (not published).
    #[inline(always)]
    fn step(&mut self) {
        if self.slots == 0 {
            self.consumer.frame_step(self.at + self.len);
        } else {
            self.consumer.read_pos += self.slots;
        }
    }

    /// Release and publish at once: the producer gets the credit now.
    #[inline(always)]
    pub fn release(mut self) {
        self.step();
        self.consumer.publish();
    }

    /// Release without publishing; published by [`Consumer::publish`], by a read that
    /// finds the ring empty, or once `release_batch_slots` are pending.
    #[inline]
    pub fn release_deferred(mut self) {
        self.step();
        let consumer = self.consumer;
        if consumer.read_pos - consumer.released >= consumer.release_batch_slots {
            consumer.publish();
        }
    }
}

impl std::ops::Deref for RecordView<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.payload()
    }
}
