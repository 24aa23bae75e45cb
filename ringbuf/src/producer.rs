//! The sending side: claim → write in place → commit → publish.

use crate::error::{ClaimError, PoisonReason, RingError};
use crate::frame::{FRAME_MAX_BYTES, Stride, VARIABLE_MAX_RECORDS, start_for};
use crate::futex::{self, ParkToken};
use crate::idle::{IdleStep, Idler};
use crate::layout::{
    CONSUMER_CLOSED, FRAME_HEADER_BYTES, FRAME_START_MAX, POISONED, PRODUCER_CLOSED, RECORD_HEADER_BYTES, RecordKind,
    frame_word, window_of,
};
use crate::region::{Region, RegionBase};
use crate::ring::{self, Role};
use crate::sync::{Arc, Ordering, fence};
use std::time::Duration;

/// Outcome of a claim: space granted, or no credit right now (would block).
#[derive(Debug)]
pub enum Claim<'a> {
    /// Space for the record; write the payload, then commit.
    Granted(WriteSlot<'a>),
    /// Not enough free slots; committed records were published so the consumer can drain.
    NoCredit,
}

/// Outcome of an append: room in the open frame (or a new one), or no credit right now.
#[derive(Debug)]
pub enum Append<'a> {
    /// Room for the record; write the payload, then commit.
    Granted(FrameSlot<'a>),
    /// Not enough free slots for the record; the open frame was closed and everything
    /// committed published, so the consumer can drain. Wait for credit for the record's own
    /// bytes ([`Producer::wait_for_credit`] with its length): a new frame opens on that.
    NoCredit,
}

/// `OpenFrame::stride` of a lone frame: no record is this long, so no append matches it.
const LONE: usize = usize::MAX;

/// The frame a producer is filling: records appended since it opened, not yet visible.
#[derive(Debug, Default)]
struct OpenFrame {
    /// Payload bytes claimed for it; 0: no frame is open.
    cap: usize,
    /// Payload bytes used: header, gap and the records so far.
    used: usize,
    /// A fixed frame's stride; 0: a variable frame.
    stride: usize,
    /// Records so far.
    count: u32,
    /// Where the first record starts, from the start of the payload.
    start: usize,
    /// Byte offset of the payload in the slot area.
    at: usize,
    /// Slot index of the frame's record header (the tail's when it opened).
    index: u64,
    /// A variable frame's end offsets so far, relative to `start` (capacity
    /// `VARIABLE_MAX_RECORDS`, taken when the first variable frame opens).
    ends: Vec<u32>,
    /// The frame holds at most its first record, written where a plain record's payload
    /// goes (`start` 0; `stride` is `LONE`, which no append matches, so every append takes
    /// the slow path). Closed so, it is written as a plain record: a frame of one record
    /// costs what a record costs. A second record that fits the frame's layout turns it
    /// into a frame (the first record moves to `start`), with `lone_cap` as its capacity.
    lone: bool,
    /// The stride the lone frame was opened with.
    lone_stride: Option<Stride>,
    /// The producer's `limit` when the lone frame opened (at least the end of its first
    /// record): the frame may grow up to it when a second record makes it a frame. Its
    /// capacity is worked out then (`Producer::lone_cap`), not on the path of a record
    /// that stays alone.
    lone_limit: u64,
}

/// The one sending handle of a ring.
///
/// Positions kept here: `tail` (slots committed, ahead of or equal to what is published),
/// `published` (the last `tail` stored to shared memory), `cached_head` (the consumer's
/// position as last read; refreshed only when the ring looks full), `window` (the consumer's
/// announced credit limit as last read, with it) and `limit`, the claim limit derived from
/// them.
#[derive(Debug)]
pub struct Producer {
    // The fields a claim and a commit touch come first, in one cache line.
    tail: u64,
    /// A record of `slots` slots claimed at `tail` is granted at once when
    /// `tail + slots <= limit`. `limit = min(cached_head + window, end of tail's lap)`:
    /// the first bound is the credit, the second keeps the record before the end of the
    /// ring (records never wrap). Recomputed by `set_limit` whenever `cached_head` or
    /// `window` moves or padding moves `tail` to the next lap. A stale limit is too low
    /// (a claim takes the slow path) or, after the consumer lowered its announcement, too
    /// high by what it announced before: in flight data then stays within the older window
    /// until the next refresh, never beyond the free slots.
    limit: u64,
    base: RegionBase,
    mask: u64,
    shift: u32,
    max_record_bytes: u32,
    published: u64,
    /// The header word of the record at `published`, the first of the batch not yet
    /// published: stored last of all, with Release, by `publish` (see the layout docs).
    first_header: u64,
    /// `log2(slot_count)`: a position's lap is `position >> lap_shift`.
    lap_shift: u32,
    cached_head: u64,
    /// The consumer's announced limit as last read, clamped to `1..=slot_count`
    /// (`slot_count` when it announced nothing): claims are granted while fewer slots than
    /// this are in flight, within the free slots.
    window: u64,
    slot_count: u64,
    /// The frame being filled by `append`. While one is open, `limit` is `tail`, so a
    /// claim of any other record takes the slow path, which closes the frame first.
    frame: OpenFrame,
    /// The longest record a fixed frame can hold in this ring (≥ 1; 0: none can).
    frame_max_fixed: usize,
    /// The longest record a variable frame can hold in this ring.
    frame_max_variable: usize,
    region: Arc<Region>,
    /// Dropped after [`detach`](Producer::detach): leave the role without closing the ring.
    detached: bool,
}

impl Producer {
    /// A handle continuing at the published tail; fails (poisoning the ring) if the shared
    /// positions are already broken, since credit is computed from them.
    pub(crate) fn new(region: Arc<Region>) -> Result<Producer, RingError> {
        let (tail, head) = ring::positions(&region)?;
        // A predecessor may have died between committing records and storing `tail` after
        // them: go on past them (`positions` walked them), and say so in `tail`.
        // SYNC POINT Release: as in `publish_tail`.
        region.header().tail.value.store(tail, Ordering::Release);
        let slot_count = region.slot_count;
        let window = window_of(region.header().head.announced.load(Ordering::Relaxed), slot_count);
        let mut producer = Producer {
            tail,
            limit: 0,
            base: region.base(),
            mask: slot_count - 1,
            shift: region.slot_shift,
            max_record_bytes: region.max_record_bytes,
            region,
            published: tail,
            first_header: 0,
            lap_shift: slot_count.trailing_zeros(),
            cached_head: head,
            window,
            slot_count,
            frame: OpenFrame::default(),
            frame_max_fixed: 0,
            frame_max_variable: 0,
            detached: false,
        };
        // `frames(stride, len)` for every length at once: a frame of one record of `len`
        // (the largest start, the record, one table entry) fits the ring.
        let ring = (slot_count << producer.shift) as usize;
        let variable =
            ring.saturating_sub(RECORD_HEADER_BYTES + FRAME_START_MAX + 4).min(producer.max_record_bytes as usize);
        producer.frame_max_variable = variable;
        producer.frame_max_fixed = variable.min(u16::MAX as usize);
        producer.set_limit();
        Ok(producer)
    }

    /// Recompute `limit` from `cached_head` and `tail` (see the field's doc).
    #[inline(always)]
    fn set_limit(&mut self) {
        let lap_end = (self.tail | self.mask) + 1;
        self.limit = if self.frame.cap != 0 { self.tail } else { (self.cached_head + self.window).min(lap_end) };
    }

    /// The consumer's announced credit limit as this producer last read it, in slots
    /// (`slot_count` when it announced none).
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Largest payload a record may carry.
    pub fn max_record_bytes(&self) -> u32 {
        self.max_record_bytes
    }

    /// Slots in the ring.
    pub fn slot_count(&self) -> u64 {
        self.slot_count
    }

    /// A handle for a monitor thread to sample this ring's backlog and credit, so the
    /// producer need not read the consumer's line to keep gauges fresh.
    #[cfg(not(loom))]
    pub fn observer(&self) -> crate::Observer {
        crate::Observer::new(self.region.clone())
    }

    /// Free slots: `slot_count − (tail − head)`, with our committed tail and a fresh head
    /// (the announced window aside: see [`Producer::window`]).
    pub fn credit(&mut self) -> u64 {
        self.close_frame();
        let _ = self.refresh_head();
        self.slot_count - (self.tail - self.cached_head)
    }

    /// Slots a record of `len` payload bytes takes.
    #[inline(always)]
    pub fn slots_for(&self, len: usize) -> u64 {
        crate::layout::record_slots(len, self.shift)
    }

    /// Claim space for a data record of `len` payload bytes.
    #[inline(always)]
    pub fn claim(&mut self, len: usize) -> Result<Claim<'_>, ClaimError> {
        self.claim_kind(RecordKind::Data, len)
    }

    /// Claim space for a record of `kind`. `NoCredit` is a value: the caller decides
    /// whether to wait ([`Producer::wait_for_credit`]) or do other work.
    #[inline(always)]
    pub fn claim_kind(&mut self, kind: RecordKind, len: usize) -> Result<Claim<'_>, ClaimError> {
        debug_assert!(kind != RecordKind::Padding, "padding is written by the ring itself");
        if len > self.max_record_bytes as usize {
            return Err(self.too_large(len));
        }
        // The fast path: credit and room before the end of the ring, both known from our own
        // cached positions; no shared memory is read. Everything else (refreshing `head`,
        // padding at the wrap, would-block) is `claim_slow`.
        let slots = self.slots_for(len);
        if self.tail + slots <= self.limit {
            let index = self.tail & self.mask;
            self.region.track_write(index, slots);
            return Ok(Claim::Granted(WriteSlot { producer: self, index, len, slots, kind }));
        }
        self.claim_slow(kind, len)
    }

    /// `claim_kind` when the cached view does not grant the claim at once.
    #[cold]
    #[inline(never)]
    fn claim_slow(&mut self, kind: RecordKind, len: usize) -> Result<Claim<'_>, ClaimError> {
        // An open frame comes before this record (its `limit` sent us here).
        self.close_frame();
        match self.reserve(len)? {
            Some(index) => {
                let slots = self.slots_for(len);
                Ok(Claim::Granted(WriteSlot { producer: self, index, len, slots, kind }))
            }
            None => Ok(Claim::NoCredit),
        }
    }

    #[cold]
    #[inline(never)]
    fn too_large(&self, len: usize) -> ClaimError {
        ClaimError::TooLarge { len, max: self.max_record_bytes }
    }

    /// Copy `payload` into a new record and commit it (published at once).
    /// Returns `Ok(false)` without writing when there is no credit.
    pub fn push(&mut self, kind: RecordKind, payload: &[u8]) -> Result<bool, ClaimError> {
        match self.claim_kind(kind, payload.len())? {
            Claim::Granted(mut slot) => {
                slot.copy_from_slice(payload);
                slot.commit();
                Ok(true)
            }
            Claim::NoCredit => Ok(false),
        }
    }

    /// Append a data record of `len` payload bytes to the open frame, opening one if there
    /// is none, it has another stride, or it is full (see the `frame` module): many records
    /// under one header, which the consumer reads without a dependent load per record and
    /// hands out one by one as `Data`. Write the payload, then [`FrameSlot::commit`]; the
    /// frame becomes visible when it closes — on [`Producer::publish`], when it is full, or
    /// before any other record is claimed — so order is kept. `Stride::Fixed` for records
    /// of one size (a fixed-layout type: each frame holds records of one length, placed on
    /// a cache-line-friendly boundary), `Stride::Variable` for any sizes. A record that no
    /// frame could hold in this ring (or a fixed one of 0 or over 65,535 bytes) goes as a
    /// plain record, read the same way.
    #[inline(always)]
    pub fn append(&mut self, stride: Stride, len: usize) -> Result<Append<'_>, ClaimError> {
        let f = &self.frame;
        let fits = match stride {
            // A fixed frame's stride is never 0 (an empty fixed record goes plain), so with
            // `len != 0` a closed or variable frame (stride 0) never matches.
            Stride::Fixed => len != 0 && f.stride == len && f.used + len <= f.cap,
            Stride::Variable => {
                f.stride == 0
                    && f.cap != 0
                    && len <= self.max_record_bytes as usize
                    && (f.count as usize) < VARIABLE_MAX_RECORDS
                    && f.used + len + 4 * (f.count as usize + 1) <= f.cap
            }
        };
        if fits {
            let at = f.at + f.used;
            return Ok(Append::Granted(FrameSlot { producer: self, at, len, plain_slots: 0, records: 1 }));
        }
        // No frame is open and the cached view grants the record: open a lone frame here,
        // as cheaply as a claim (a record published alone takes this path every time).
        if f.cap == 0 {
            let framed = match stride {
                Stride::Fixed => len.wrapping_sub(1) < self.frame_max_fixed,
                Stride::Variable => len <= self.frame_max_variable,
            };
            let slots = self.slots_for(len);
            if framed && self.tail + slots <= self.limit {
                let index = self.tail & self.mask;
                let lone_limit = self.limit;
                return Ok(Append::Granted(self.open_lone(stride, len, index, slots, lone_limit)));
            }
        }
        self.append_slow(stride, len)
    }

    /// Append a run of up to `records` records of `len` bytes each (a fixed layout) to the
    /// open frame: what `append(Stride::Fixed, len)` and then [`FrameSlot::grow`] by the
    /// rest do, except that when no frame is open (or the open one of this stride is full)
    /// and more than one record comes, a frame opens at its full size at once, instead of as
    /// a lone record that the second record turns into a frame — the fixed cost a batch paid
    /// on every publish. The slot derefs to
    /// the records it took (at least one, [`FrameSlot::records`], `len` bytes each); write
    /// them, then commit. A batch of one record takes `append`'s path: a frame of one record
    /// costs what a record costs.
    #[inline(always)]
    pub fn append_run(&mut self, len: usize, records: usize) -> Result<Append<'_>, ClaimError> {
        let f = &self.frame;
        // As in `append`: a closed, lone or variable frame never matches a non-zero `len`.
        let open = len != 0 && f.stride == len && f.cap != 0;
        let run = if open && f.used + len <= f.cap {
            Some((f.at + f.used, run_records(records, len, f.cap - f.used).max(1)))
        } else {
            if open {
                // The open frame of this stride is full (at its 4 KiB, or at the end of the
                // ring's lap): the rest of the run opens the next one at once.
                self.close_frame();
            }
            if self.frame.cap == 0 && records > 1 && len.wrapping_sub(1) < self.frame_max_fixed {
                self.open_fixed(len, records)?
            } else {
                None
            }
        };
        if let Some((at, n)) = run {
            return Ok(Append::Granted(FrameSlot {
                producer: self,
                at,
                len: n * len,
                plain_slots: 0,
                records: n as u32,
            }));
        }
        match self.append(Stride::Fixed, len)? {
            Append::Granted(mut slot) => {
                slot.grow(records.saturating_sub(1));
                Ok(Append::Granted(slot))
            }
            Append::NoCredit => Ok(Append::NoCredit),
        }
    }

    /// Open a fixed frame of `len`-byte records (0 < `len` ≤ `frame_max_fixed`) at the tail,
    /// as large as the cached view of credit grants, up to `FRAME_MAX_BYTES` (as a lone frame
    /// would grow to): returns where its first record goes and how many of `records` (> 1)
    /// it takes. `None`, with nothing changed, when it would hold fewer than two: `append`
    /// then opens a lone frame (or refreshes its view of the consumer's position first).
    /// Where the cached credit is short of the whole run, it refreshes that view first
    /// (an error: the consumer's position is out of range, and the ring is poisoned).
    #[inline(always)]
    fn open_fixed(&mut self, len: usize, records: usize) -> Result<Option<(usize, usize)>, RingError> {
        debug_assert_eq!(self.frame.cap, 0, "no frame is open");
        let most = self.slots_for(FRAME_MAX_BYTES.max(FRAME_START_MAX + len + 4));
        let want = records.saturating_mul(len).saturating_add(FRAME_START_MAX).min(FRAME_MAX_BYTES);
        if self.tail + self.slots_for(want) > self.limit && self.limit < (self.tail | self.mask) + 1 {
            // The cached credit is short of the run, and not because of the lap's end:
            // learn the consumer's position now rather than cut the run into a small frame
            // here and another after the slow path's refresh.
            self.refresh_head()?;
        }
        // `limit` stays within the tail's lap, so the frame never wraps.
        let cap_slots = self.limit.saturating_sub(self.tail).min(most);
        if cap_slots == 0 {
            return Ok(None);
        }
        let cap = ((cap_slots << self.shift) as usize) - RECORD_HEADER_BYTES;
        let index = self.tail & self.mask;
        let at = ((index << self.shift) as usize) + RECORD_HEADER_BYTES;
        let start = start_for(at, Some(len));
        if start + 2 * len > cap {
            return Ok(None);
        }
        debug_assert!(cap_slots <= self.slot_count - index);
        self.region.track_write(index, cap_slots);
        if start > FRAME_HEADER_BYTES {
            // The gap between the frame header and the first record holds zeros, not stale
            // bytes of an earlier lap (as `frame_from_lone` leaves it).
            // SAFETY: [at + 8, at + start) lies in the claimed slots (start + 2 × len <= cap).
            unsafe {
                std::ptr::write_bytes(self.base.area_ptr(at + FRAME_HEADER_BYTES), 0, start - FRAME_HEADER_BYTES)
            };
        }
        let f = &mut self.frame;
        debug_assert_eq!(f.count, 0, "a closed frame has no records");
        f.lone = false;
        f.cap = cap;
        f.used = start;
        f.start = start;
        f.stride = len;
        f.at = at;
        f.index = index;
        // Plain claims go the slow way (which closes this frame) while it is open.
        self.limit = self.tail;
        Ok(Some((at + start, run_records(records, len, cap - start))))
    }

    /// Open a lone frame at slot `index` (the tail's) for a first record of `len` bytes
    /// (`slots` slots, granted): its payload goes where a plain record's would, and the
    /// frame may grow up to `lone_limit` if a second record comes.
    #[inline(always)]
    fn open_lone(&mut self, stride: Stride, len: usize, index: u64, slots: u64, lone_limit: u64) -> FrameSlot<'_> {
        self.region.track_write(index, slots);
        let at = ((index << self.shift) as usize) + RECORD_HEADER_BYTES;
        let f = &mut self.frame;
        debug_assert_eq!(f.count, 0, "a closed frame has no records");
        f.lone = true;
        f.lone_stride = Some(stride);
        f.lone_limit = lone_limit;
        f.cap = 1;
        f.used = 0;
        f.stride = LONE;
        f.at = at;
        f.index = index;
        // Plain claims go the slow way (which closes this frame) while it is open.
        self.limit = self.tail;
        FrameSlot { producer: self, at, len, plain_slots: 0, records: 1 }
    }

    /// The payload bytes the open lone frame may use as a frame: up to `FRAME_MAX_BYTES`
    /// (or its first record, `first` bytes, alone), within the limit it opened under.
    #[inline(always)]
    fn lone_cap(&self, first: usize) -> usize {
        let f = &self.frame;
        let most = self.slots_for(FRAME_MAX_BYTES.max(FRAME_START_MAX + first + 4));
        let cap_slots = f.lone_limit.saturating_sub(self.tail).min(most).max(self.slots_for(first));
        debug_assert!(cap_slots <= self.slot_count - f.index);
        self.region.track_write(f.index, cap_slots);
        ((cap_slots << self.shift) as usize) - RECORD_HEADER_BYTES
    }

    /// Whether a record of `len` bytes goes in a frame (else as a plain record).
    fn frames(&self, stride: Stride, len: usize) -> bool {
        match stride {
            Stride::Fixed => len.wrapping_sub(1) < self.frame_max_fixed,
            Stride::Variable => len <= self.frame_max_variable,
        }
    }

    /// `append` when the open frame cannot take the record: close it, open a new one (or
    /// claim a plain record).
    #[cold]
    #[inline(never)]
    fn append_slow(&mut self, stride: Stride, len: usize) -> Result<Append<'_>, ClaimError> {
        if len > self.max_record_bytes as usize {
            return Err(self.too_large(len));
        }
        if self.frame.cap != 0 {
            if self.frame.lone
                && self.frame.count == 1
                && let Some(at) = self.frame_from_lone(stride, len)
            {
                return Ok(Append::Granted(FrameSlot { producer: self, at, len, plain_slots: 0, records: 1 }));
            }
            self.close_frame();
        }
        if !self.frames(stride, len) {
            let Some(index) = self.reserve(len)? else { return Ok(Append::NoCredit) };
            let at = ((index << self.shift) as usize) + RECORD_HEADER_BYTES;
            let plain_slots = self.slots_for(len);
            return Ok(Append::Granted(FrameSlot { producer: self, at, len, plain_slots, records: 1 }));
        }
        let need_slots = self.slots_for(len);
        // The cached view grants the record (as a claim's fast path would): no `reserve`.
        let index = if self.tail + need_slots <= self.limit {
            self.tail & self.mask
        } else {
            let Some(index) = self.reserve(len)? else { return Ok(Append::NoCredit) };
            index
        };
        // `reserve` found credit for the record alone (it may end past the window).
        let lone_limit = self.limit.max(self.tail + need_slots);
        Ok(Append::Granted(self.open_lone(stride, len, index, need_slots, lone_limit)))
    }

    /// A second record of `len` bytes comes to a lone frame: if it fits the frame's layout
    /// and room, move the first record to where a frame's first record starts, make the
    /// frame a frame, and return where the second record goes.
    fn frame_from_lone(&mut self, stride: Stride, len: usize) -> Option<usize> {
        let f = &self.frame;
        if f.lone_stride != Some(stride) {
            return None;
        }
        let first = f.used;
        let fixed = stride == Stride::Fixed;
        if fixed && first != len {
            return None;
        }
        let start = start_for(f.at, fixed.then_some(len));
        let table = if fixed { 0 } else { 8 };
        let lone_cap = self.lone_cap(first);
        if start + first + len + table > lone_cap {
            return None;
        }
        let f = &mut self.frame;
        // SAFETY: both ranges lie in the frame's claimed payload (start + first <= lone_cap),
        // which only this producer writes until it publishes; `copy` allows the overlap.
        unsafe { std::ptr::copy(self.base.area_ptr(f.at), self.base.area_ptr(f.at + start), first) };
        // The gap between the frame header and `start` is zeroed rather than left holding a
        // stale copy of the record (at most 56 bytes, once per frame).
        // SAFETY: [at + 8, at + start) lies in the claimed payload (start <= lone_cap).
        unsafe { std::ptr::write_bytes(self.base.area_ptr(f.at + FRAME_HEADER_BYTES), 0, start - FRAME_HEADER_BYTES) };
        f.lone = false;
        f.cap = lone_cap;
        f.start = start;
        f.used = start + first;
        f.stride = if fixed { len } else { 0 };
        if !fixed {
            if f.ends.capacity() == 0 {
                f.ends = Vec::with_capacity(VARIABLE_MAX_RECORDS);
            }
            f.ends.clear();
            f.ends.push(first as u32);
        }
        Some(f.at + f.used)
    }

    /// Close the open frame, if any: write its table (variable), its header and its record
    /// header, and move `tail` past it (published by the next `publish`). A frame with no
    /// record (its only slot dropped uncommitted) leaves nothing. Out of line: it runs once
    /// per frame, and `publish`, which calls it, stays small.
    #[inline(never)]
    fn close_frame(&mut self) {
        if self.frame.cap == 0 {
            return;
        }
        if self.frame.lone {
            // One record at most, written where a plain record's payload goes: a plain record.
            self.close_lone();
            return;
        }
        self.frame.cap = 0;
        let f = &self.frame;
        if f.count != 0 {
            let mut len = f.used;
            if f.stride == 0 {
                for (i, end) in f.ends.iter().enumerate() {
                    // SAFETY: the table lies in the frame's claimed payload (`append` kept
                    // used + 4 × count within cap), which only this producer writes until
                    // it publishes; `[u8; 4]` has alignment 1.
                    unsafe { (self.base.area_ptr(f.at + len + 4 * i) as *mut [u8; 4]).write(end.to_le_bytes()) };
                }
                len += 4 * f.ends.len();
            }
            let word = frame_word(f.count, f.stride as u16, f.start as u16);
            // SAFETY: the frame header is the first 8 bytes of the claimed payload, 8-aligned
            // (a slot boundary plus the 8-byte record header).
            unsafe { (self.base.area_ptr(f.at) as *mut u64).write_volatile(word.to_le()) };
            let index = f.index;
            self.write_header(index, RecordKind::Frame, len);
            self.tail += self.slots_for(len);
        }
        self.frame.count = 0;
        self.frame.lone = false;
        self.frame.ends.clear();
        self.set_limit();
    }

    /// Make room for `len` bytes at the tail: returns the slot index where the record
    /// starts, padding to the end of the ring first if it would not fit there. The slow
    /// path of a claim; it leaves `limit` recomputed.
    fn reserve(&mut self, len: usize) -> Result<Option<u64>, RingError> {
        self.close_frame();
        // A commit that ended exactly at the end of the ring left `limit` at the old lap's
        // end; without this, every claim of the new lap would come here until a refresh.
        self.set_limit();
        let slots = self.slots_for(len);
        let index = self.tail & self.mask;
        let to_end = self.slot_count - index;
        if slots > to_end {
            // The record would wrap: pad to the end first (needs `to_end` free slots, not
            // window: padding carries no data to drain), then claim at slot 0. The padding
            // is committed on its own, so a ring too small for padding + record at once
            // still makes progress.
            if !self.has_credit(to_end, false)? {
                return Ok(None);
            }
            self.write_header(index, RecordKind::Padding, (to_end << self.shift) as usize - RECORD_HEADER_BYTES);
            self.tail += to_end;
            // `tail` starts a new lap: the old limit's lap bound no longer applies.
            self.set_limit();
            return self.reserve(len);
        }
        if !self.has_credit(slots, true)? {
            return Ok(None);
        }
        self.region.track_write(index, slots);
        Ok(Some(index))
    }

    /// Whether `slots` slots may be claimed: that many are free and, if `windowed`, fewer
    /// than `window` are in flight. Refreshes the cached head (and window) only when the
    /// cached view says no, and publishes committed records before saying no.
    fn has_credit(&mut self, slots: u64, windowed: bool) -> Result<bool, RingError> {
        let fits = |p: &Producer| {
            grants(p.tail - p.cached_head, slots, p.slot_count, if windowed { p.window } else { u64::MAX })
        };
        if fits(self) {
            return Ok(true);
        }
        self.refresh_head()?;
        if fits(self) {
            return Ok(true);
        }
        // Would block: publish, so the consumer can drain what we committed.
        self.publish();
        self.check_state()?;
        Ok(false)
    }

    fn refresh_head(&mut self) -> Result<(), RingError> {
        // SYNC POINT Acquire: pairs with the Release store of `head` in Consumer::publish;
        // the consumer is done with every slot before it.
        let line = &self.base.header().head;
        let head = line.value.load(Ordering::Acquire);
        if head < self.cached_head || head > self.published {
            return Err(ring::poison(&self.region, PoisonReason::HeadOutOfRange, head));
        }
        self.cached_head = head;
        // The same line as `head`: no further miss. Any value is safe (see `window_of`).
        self.window = window_of(line.announced.load(Ordering::Relaxed), self.slot_count);
        self.set_limit();
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn check_state(&self) -> Result<(), RingError> {
        // A header written over says nothing true about the consumer (a `closed` bit, its
        // pid): poisoned, before anything in it is believed.
        ring::check_header(&self.region)?;
        let state = self.base.header().state.load(Ordering::Acquire);
        if state & POISONED != 0 {
            return Err(ring::poison_error(&self.region));
        }
        if state & CONSUMER_CLOSED != 0 {
            return Err(RingError::ConsumerClosed);
        }
        Ok(())
    }

    /// Write the header of the record at `tail` (slot `index`): kept back as `first_header`
    /// if it is the first of the batch (`publish` stores it, last), else stored now — the
    /// consumer cannot reach it before it has read the first.
    #[inline(always)]
    fn write_header(&mut self, index: u64, kind: RecordKind, len: usize) {
        debug_assert_eq!(index, self.tail & self.mask, "headers are written at the tail");
        let word = crate::layout::header_word(kind as u8, len as u32, self.tail, self.lap_shift);
        self.region.track_write(index, 1);
        if self.tail == self.published {
            self.first_header = word;
        } else {
            // Relaxed: the Release store of the batch's first header, after this in program
            // order, publishes it.
            self.base.commit_word(index, self.shift).store(word.to_le(), Ordering::Relaxed);
        }
    }

    /// Publish every committed record: one Release store of `tail` for the whole batch,
    /// and a wake-up only if the consumer is parked.
    #[inline(always)]
    pub fn publish(&mut self) {
        if self.frame.cap != 0 {
            if self.frame.lone {
                self.close_lone();
            } else {
                self.close_frame();
            }
        }
        self.publish_tail();
    }

    /// Close a lone frame: its record, if committed, becomes a plain record. In line: a
    /// record published alone takes this path every time.
    #[inline(always)]
    fn close_lone(&mut self) {
        let f = &mut self.frame;
        f.cap = 0;
        f.lone = false;
        // The limit the frame opened under still holds (or, after a `reserve`, its own
        // record's end, which grants nothing more): no `set_limit`.
        self.limit = f.lone_limit;
        if f.count == 1 {
            f.count = 0;
            let (index, len) = (f.index, f.used);
            self.write_header(index, RecordKind::Data, len);
            self.tail += self.slots_for(len);
        }
    }

    /// `publish` when no frame can be open (a plain record was just committed: its claim
    /// closed any frame). Kept apart because the frame check in `publish`, on the path of
    /// every record committed one at a time, cost 8-byte records 7.0 → 10.5 ns each
    /// (`ringbuf/examples/hot_path.rs threads single`).
    #[inline(always)]
    fn publish_tail(&mut self) {
        debug_assert!(self.frame.cap == 0, "an open frame is closed before a plain record is claimed");
        if self.tail == self.published {
            return;
        }
        let first = self.published & self.mask;
        // Where the next record will start: zero it while its slot is free, so the consumer,
        // once it has read this batch, finds no commit there until we make one. A slot not
        // free holds the header at `head`, a lap older: its tag does not match.
        if self.tail - self.cached_head < self.slot_count {
            self.base.commit_word(self.tail & self.mask, self.shift).store(0, Ordering::Relaxed);
        }
        self.published = self.tail;
        // SYNC POINT Release: pairs with the Acquire load of a header word in Consumer's
        // reads (FastView::check, next_slow); publishes the batch's slot bytes and headers,
        // and the zeroed word after it, all written before it.
        self.base.commit_word(first, self.shift).store(self.first_header.to_le(), Ordering::Release);
        let h = self.base.header();
        // SYNC POINT Release: pairs with the Acquire load of `tail` in `ring::positions` (a
        // new handle) and Consumer::refresh_tail (backlog); after the headers, so a reader
        // may be ahead of `tail`, never behind what it says.
        h.tail.value.store(self.tail, Ordering::Release);
        ring::wake_if_waiting(&h.consumer_park);
    }

    /// Committed records not yet published.
    pub fn unpublished_slots(&self) -> u64 {
        self.tail - self.published
    }

    /// Wait until a record of `len` bytes can be claimed, idling by `idler`. Returns at
    /// once if it can already. Errors if the ring is poisoned or the consumer closed it.
    pub fn wait_for_credit(&mut self, len: usize, idler: &mut Idler) -> Result<(), ClaimError> {
        loop {
            if self.poll_credit(len)? {
                idler.reset();
                return Ok(());
            }
            if let Some(IdleStep::Park) = idler.idle(0) {
                self.park(len, ring::PARK_BACKSTOP);
            }
        }
    }

    /// Whether a record of `len` bytes can be claimed now, without blocking. Writes the
    /// padding at the end of the ring if that is what stands in the way and it has the
    /// credit for it; publishes committed records when the answer is no.
    pub fn poll_credit(&mut self, len: usize) -> Result<bool, ClaimError> {
        self.close_frame();
        if len > self.max_record_bytes as usize {
            return Err(ClaimError::TooLarge { len, max: self.max_record_bytes });
        }
        let slots = self.slots_for(len);
        let index = self.tail & self.mask;
        let to_end = self.slot_count - index;
        if slots <= to_end {
            return Ok(self.has_credit(slots, true)?);
        }
        // The record needs padding first; reserve writes it when it has the credit.
        Ok(self.reserve(len)?.is_some())
    }

    /// Slots we must see free before a record of `len` bytes can make progress, and
    /// whether the window applies (not to the padding before a wrap).
    fn slots_needed(&self, len: usize) -> (u64, bool) {
        let slots = self.slots_for(len);
        let to_end = self.slot_count - (self.tail & self.mask);
        if slots > to_end { (to_end, false) } else { (slots, true) }
    }

    /// Sleep on the producer's futex word until the consumer releases slots (or `timeout`).
    pub fn park(&mut self, len: usize, timeout: Duration) {
        let first = self.base.header().producer_park.parks.load(Ordering::Relaxed) == 0;
        if let Some(token) = self.prepare_park(len) {
            // The first park may have raced with the consumer reading `parks` as 0: keep it short.
            futex::wait(token.word, token.expected, if first { ring::FIRST_PARK } else { timeout });
        }
        self.end_park();
    }

    /// Announce that we are about to sleep until there is credit for a record of `len`
    /// bytes, for a caller that waits on several words at once ([`crate::wait_any`]).
    /// `None`: the credit, a close or a poison is visible already — don't sleep. Either way
    /// call [`Producer::end_park`] after.
    pub fn prepare_park(&self, len: usize) -> Option<ParkToken<'_>> {
        let (need, windowed) = self.slots_needed(len);
        let h = self.base.header();
        let line = &h.producer_park;
        if line.parks.load(Ordering::Relaxed) == 0 {
            line.parks.store(1, Ordering::SeqCst);
        }
        let expected = line.wake.load(Ordering::Acquire);
        line.waiting.store(1, Ordering::Relaxed);
        // SYNC POINT SeqCst fence: pairs with the fence in `ring::wake_if_waiting` called by
        // Consumer::publish and Consumer::announce. Either the consumer sees `waiting` and
        // wakes us, or we see its head and its announcement.
        fence(Ordering::SeqCst);
        let head = h.head.value.load(Ordering::Relaxed);
        let window =
            if windowed { window_of(h.head.announced.load(Ordering::Relaxed), self.slot_count) } else { u64::MAX };
        let state = h.state.load(Ordering::Relaxed);
        // A head out of range is the slow path's to poison: don't sleep on it.
        if head < self.cached_head || head > self.published || state != 0 {
            return None;
        }
        if grants(self.tail - head, need, self.slot_count, window) {
            return None;
        }
        ring::heartbeat(&h.producer);
        Some(ParkToken { word: &line.wake, expected })
    }

    /// Done sleeping (or decided not to).
    pub fn end_park(&self) {
        self.base.header().producer_park.waiting.store(0, Ordering::Relaxed);
    }

    /// Mark the ring poisoned on purpose (the application found something wrong).
    pub fn poison(&self, detail: u64) -> RingError {
        ring::poison(&self.region, PoisonReason::Application, detail)
    }

    /// Record a sign of life in the header (for `weir-stat` and stale detection).
    pub fn heartbeat(&self) {
        ring::heartbeat(&self.base.header().producer);
    }

    /// Publish, then close: the consumer reads what was sent and then sees `Closed`.
    pub fn close(self) {
        drop(self)
    }

    /// Publish, then leave the producer role without ending the stream: the consumer
    /// keeps waiting for records, and another producer may take the role over (it goes on
    /// at the published tail).
    pub fn detach(mut self) {
        self.detached = true;
    }
}

/// How many of `records` records of `len` (> 0) bytes fit in `room` bytes: all of them
/// without a division when they do (the usual case: a frame holds 4 KiB).
#[inline(always)]
fn run_records(records: usize, len: usize, room: usize) -> usize {
    match records.checked_mul(len) {
        Some(bytes) if bytes <= room => records,
        _ => records.min(room / len),
    }
}

/// Whether `slots` may be claimed with `in_flight` slots published or committed and not yet
/// released: they are free, and fewer than `window` are in flight (a record may end past the
/// window, so the sender can always finish the record it emits).
#[inline(always)]
fn grants(in_flight: u64, slots: u64, slot_count: u64, window: u64) -> bool {
    slot_count - in_flight >= slots && in_flight < window
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.publish();
        let h = self.base.header();
        if self.detached {
            ring::release_role(&self.region, Role::Producer);
            return;
        }
        h.state.fetch_or(PRODUCER_CLOSED, Ordering::AcqRel);
        ring::release_role(&self.region, Role::Producer);
        ring::wake_if_waiting(&h.consumer_park);
    }
}

/// Space claimed for one record. Derefs to exactly the payload bytes; write them, then
/// [`commit`](WriteSlot::commit). Dropped without commit, the record is abandoned.
#[derive(Debug)]
pub struct WriteSlot<'a> {
    producer: &'a mut Producer,
    /// Slot index where the record starts: `producer.tail & mask`.
    index: u64,
    /// Payload bytes.
    len: usize,
    /// Slots the record takes, `record_slots(len)`; `index + slots <= slot_count`.
    slots: u64,
    kind: RecordKind,
}

/// Room for one record in the open frame (or, where no frame fits, a plain record). Derefs
/// to exactly the payload bytes; write them, then [`commit`](FrameSlot::commit). Dropped
/// without commit, the record is abandoned.
#[derive(Debug)]
pub struct FrameSlot<'a> {
    producer: &'a mut Producer,
    /// Byte offset of the payload in the slot area.
    at: usize,
    /// Payload bytes.
    len: usize,
    /// 0: a record of the open frame; else a plain record of this many slots.
    plain_slots: u64,
    /// Records in it: 1, and those `grow` added.
    records: u32,
}

impl FrameSlot<'_> {
    /// Grow the slot by up to `records` more records of a fixed frame, as far as the open
    /// frame has room: write many records with one append (a run, as `rtrb`'s chunks).
    /// Returns how many were added (0 for a variable frame or a plain record). The slot
    /// then derefs to all of them, `stride` bytes each, and `commit` adds them all. Call
    /// it before writing into the slot: growing the first slot of a frame may move it.
    #[inline(always)]
    pub fn grow(&mut self, records: usize) -> usize {
        if self.producer.frame.lone
            && records > 0
            && self.plain_slots == 0
            && let Some(at) = self.producer.unlone(self.len)
        {
            self.at = at;
        }
        let f = &self.producer.frame;
        if self.plain_slots != 0 || f.stride == 0 || f.lone {
            return 0;
        }
        let room = (f.cap - (self.at - f.at) - self.len) / f.stride;
        let add = records.min(room);
        self.len += add * f.stride;
        // A frame holds at most FRAME_MAX_BYTES: the count fits.
        self.records += add as u32;
        add
    }

    /// Records in the slot: 1, and those [`grow`](FrameSlot::grow) added (or as many as
    /// [`Producer::append_run`] granted).
    #[inline(always)]
    pub fn records(&self) -> usize {
        self.records as usize
    }
}

impl Producer {
    /// The first slot of the open lone frame, `len` bytes, uncommitted, is to grow: lay the
    /// frame out as a fixed frame now (nothing was committed, and the caller writes after
    /// `grow`); returns where the slot's payload now starts (`None`: it stays lone).
    ///
    /// A method of the producer, not of the slot, on purpose: a slot passed by reference to
    /// a call that is not inlined has to live in memory, and the compiler then copies it
    /// through the stack in pieces that the store buffer cannot forward to the loads that
    /// read it back, so every batch waited there for the stores before it — the records
    /// of the previous batch, whose lines the consumer had — to reach the cache (~70 % of
    /// the producer's samples in `hot_path threads "frame runs"`).
    #[inline(always)]
    fn unlone(&mut self, len: usize) -> Option<usize> {
        let f = &self.frame;
        if f.count != 0 || f.lone_stride != Some(Stride::Fixed) {
            return None;
        }
        let start = start_for(f.at, Some(len));
        let lone_cap = self.lone_cap(len);
        if start + len > lone_cap {
            return None;
        }
        let f = &mut self.frame;
        f.lone = false;
        f.cap = lone_cap;
        f.start = start;
        f.used = start;
        f.stride = len;
        Some(f.at + start)
    }
}

impl FrameSlot<'_> {
    /// Add the record (or, after [`FrameSlot::grow`], the records) to the frame: visible
    /// when the frame closes (publish).
    #[inline(always)]
    pub fn commit(self) {
        let FrameSlot { producer: p, at, len, plain_slots, records } = self;
        if plain_slots != 0 {
            let index = ((at - RECORD_HEADER_BYTES) >> p.shift) as u64;
            p.write_header(index, RecordKind::Data, len);
            p.tail += plain_slots;
            return;
        }
        let f = &mut p.frame;
        f.used += len;
        if f.stride == 0 {
            f.count += 1;
            f.ends.push((f.used - f.start) as u32);
        } else {
            f.count += records;
        }
    }
}

impl std::ops::Deref for FrameSlot<'_> {
    type Target = [u8];
    #[inline(always)]
    fn deref(&self) -> &[u8] {
        // SAFETY: [at, at + len) lies in slots this producer claimed (the open frame's
        // capacity or a plain record's slots) and will not hand out again before commit;
        // the bytes are initialized memory (zeroed at creation).
        unsafe { std::slice::from_raw_parts(self.producer.base.area_ptr(self.at), self.len) }
    }
}

impl std::ops::DerefMut for FrameSlot<'_> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only view of those bytes.
        unsafe { std::slice::from_raw_parts_mut(self.producer.base.area_ptr(self.at), self.len) }
    }
}

impl<'a> WriteSlot<'a> {
    /// Commit and publish at once (lowest latency).
    #[inline(always)]
    pub fn commit(self) {
        let producer = self.commit_inner();
        producer.publish_tail();
    }

    /// Commit without publishing; [`Producer::publish`] (or running out of credit)
    /// publishes the batch with one store.
    #[inline(always)]
    pub fn commit_deferred(self) {
        self.commit_inner();
    }

    #[inline(always)]
    fn commit_inner(self) -> &'a mut Producer {
        let WriteSlot { producer, index, len, slots, kind } = self;
        // The header last: it is what makes the record whole (once `tail` is published).
        producer.write_header(index, kind, len);
        producer.tail += slots;
        producer
    }
}

impl std::ops::Deref for WriteSlot<'_> {
    type Target = [u8];
    #[inline(always)]
    fn deref(&self) -> &[u8] {
        let p = &*self.producer;
        // SAFETY: the claimed slots [index, index + slots) are ours until commit (see
        // `write_header`); the payload starts after the 8-byte header and fits (slots were
        // computed from len); the bytes are initialized memory (zeroed at creation).
        unsafe { std::slice::from_raw_parts(p.base.slot_ptr(self.index, p.shift).add(RECORD_HEADER_BYTES), self.len) }
    }
}

impl std::ops::DerefMut for WriteSlot<'_> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [u8] {
        let p = &*self.producer;
        // SAFETY: as in `deref`; `&mut self` makes this the only view of those bytes.
        unsafe {
            std::slice::from_raw_parts_mut(p.base.slot_ptr(self.index, p.shift).add(RECORD_HEADER_BYTES), self.len)
        }
    }
}
