//! The sending side: claim → write in place → commit → publish.

use crate::error::{ClaimError, PoisonReason, RingError};
use crate::futex::{self, ParkToken};
use crate::idle::{IdleStep, Idler};
use crate::layout::{CONSUMER_CLOSED, POISONED, PRODUCER_CLOSED, RECORD_HEADER_BYTES, RecordKind, window_of};
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
    cached_head: u64,
    /// The consumer's announced limit as last read, clamped to `1..=slot_count`
    /// (`slot_count` when it announced nothing): claims are granted while fewer slots than
    /// this are in flight, within the free slots.
    window: u64,
    slot_count: u64,
    region: Arc<Region>,
}

impl Producer {
    /// A handle continuing at the published tail; fails (poisoning the ring) if the shared
    /// positions are already broken, since credit is computed from them.
    pub(crate) fn new(region: Arc<Region>) -> Result<Producer, RingError> {
        let (tail, head) = ring::positions(&region)?;
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
            cached_head: head,
            window,
            slot_count,
        };
        producer.set_limit();
        Ok(producer)
    }

    /// Recompute `limit` from `cached_head` and `tail` (see the field's doc).
    #[inline(always)]
    fn set_limit(&mut self) {
        let lap_end = (self.tail | self.mask) + 1;
        self.limit = (self.cached_head + self.window).min(lap_end);
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

    /// Make room for `len` bytes at the tail: returns the slot index where the record
    /// starts, padding to the end of the ring first if it would not fit there. The slow
    /// path of a claim; it leaves `limit` recomputed.
    fn reserve(&mut self, len: usize) -> Result<Option<u64>, RingError> {
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
        let state = self.base.header().state.load(Ordering::Acquire);
        if state & POISONED != 0 {
            return Err(ring::poison_error(&self.region));
        }
        if state & CONSUMER_CLOSED != 0 {
            return Err(RingError::ConsumerClosed);
        }
        Ok(())
    }

    #[inline(always)]
    fn write_header(&self, index: u64, kind: RecordKind, len: usize) {
        let word = (len as u64) | ((kind as u64) << 32);
        self.region.track_write(index, 1);
        // SAFETY: slot `index` lies in [tail, head + slot_count): credit says the consumer is
        // done with it, and only this producer writes slots. Slots are 8-aligned (slot_bytes
        // is a power of two >= 8, the slot area starts 128-aligned).
        unsafe { (self.base.slot_ptr(index, self.shift) as *mut u64).write_volatile(word.to_le()) };
    }

    /// Publish every committed record: one Release store of `tail` for the whole batch,
    /// and a wake-up only if the consumer is parked.
    #[inline(always)]
    pub fn publish(&mut self) {
        if self.tail == self.published {
            return;
        }
        self.published = self.tail;
        let h = self.base.header();
        // SYNC POINT Release: pairs with the Acquire load of `tail` in Consumer::refresh_tail;
        // publishes the slot bytes written before it.
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

impl<'a> WriteSlot<'a> {
    /// Commit and publish at once (lowest latency).
    #[inline(always)]
    pub fn commit(self) {
        let producer = self.commit_inner();
        producer.publish();
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
