//! The receiving side: read a borrowed view in place → release → publish.

use crate::error::{PoisonReason, RingError};
use crate::futex::{self, ParkToken};
use crate::idle::{IdleStep, Idler};
use crate::layout::{POISONED, PRODUCER_CLOSED, RECORD_HEADER_BYTES, RecordKind};
use crate::region::Region;
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

/// The one receiving handle of a ring.
///
/// Positions kept here: `read_pos` (the next record to read), `released` (the last
/// `head` stored to shared memory, `<= read_pos`), `cached_tail` (the producer's
/// position as last read; refreshed only when the ring looks empty).
#[derive(Debug)]
pub struct Consumer {
    region: Arc<Region>,
    read_pos: u64,
    released: u64,
    cached_tail: u64,
    slot_count: u64,
    mask: u64,
    shift: u32,
    max_record_bytes: u32,
    /// Deferred releases are published once this many slots are pending.
    release_batch_slots: u64,
}

impl Consumer {
    /// A handle continuing at the published head; fails (poisoning the ring) if the shared
    /// positions are already broken, since what is readable is computed from them.
    pub(crate) fn new(region: Arc<Region>) -> Result<Consumer, RingError> {
        let (tail, head) = ring::positions(&region)?;
        Ok(Consumer {
            slot_count: region.slot_count,
            mask: region.slot_count - 1,
            shift: region.slot_shift,
            max_record_bytes: region.max_record_bytes,
            release_batch_slots: (region.slot_count / 4).max(1),
            region,
            read_pos: head,
            released: head,
            cached_tail: tail,
        })
    }

    /// Used slots: `tail − head`, with a fresh tail and our released head.
    pub fn backlog(&mut self) -> Result<u64, RingError> {
        self.refresh_tail()?;
        Ok(self.cached_tail - self.released)
    }

    /// The next record, borrowed in place; `Empty` if none is published; `Closed` once the
    /// producer closed and all was read. Reading again without releasing returns the same
    /// record. Everything read from shared memory is checked: a violation poisons the ring.
    #[inline]
    pub fn read(&mut self) -> Result<Read<'_>, RingError> {
        loop {
            if self.read_pos == self.cached_tail {
                // Hand back credit before we say "empty": the producer may be waiting for it.
                self.publish();
                self.refresh_tail()?;
                if self.read_pos == self.cached_tail {
                    return self.empty_or_closed();
                }
            }
            let index = self.read_pos & self.mask;
            self.region.track_read(index, 1);
            // SAFETY: read_pos < cached_tail (published, Acquire), so slot `index` holds a
            // header the producer finished writing; 8-aligned as in Producer::write_header.
            // Volatile: a misbehaving peer may still write it; we validate what we got.
            let word = u64::from_le(unsafe { (self.region.slot_ptr(index) as *const u64).read_volatile() });
            let len = word as u32;
            let kind_byte = (word >> 32) as u8;
            let available = self.cached_tail - self.read_pos;
            let to_end = self.slot_count - index;
            match RecordKind::from_byte(kind_byte) {
                Some(RecordKind::Padding) => {
                    if len as u64 + RECORD_HEADER_BYTES as u64 != to_end << self.shift || to_end > available {
                        return Err(ring::poison(&self.region, PoisonReason::BadPadding, len as u64));
                    }
                    self.read_pos += to_end;
                }
                Some(kind) => {
                    if len > self.max_record_bytes {
                        return Err(ring::poison(&self.region, PoisonReason::BadLength, len as u64));
                    }
                    let slots = crate::layout::record_slots(len as usize, self.shift);
                    if slots > available || slots > to_end {
                        return Err(ring::poison(&self.region, PoisonReason::BadLength, len as u64));
                    }
                    self.region.track_read(index, slots);
                    return Ok(Read::Record(RecordView { consumer: self, index, len: len as usize, kind, slots }));
                }
                None => return Err(ring::poison(&self.region, PoisonReason::BadKind, kind_byte as u64)),
            }
        }
    }

    #[cold]
    fn empty_or_closed(&mut self) -> Result<Read<'_>, RingError> {
        let h = self.region.header();
        // SYNC POINT Acquire: pairs with the AcqRel fetch_or of PRODUCER_CLOSED in Producer::drop,
        // which comes after its last Release store of `tail`.
        let state = h.state.load(Ordering::Acquire);
        if state & POISONED != 0 {
            return Err(ring::poison_error(&self.region));
        }
        if state & PRODUCER_CLOSED != 0 {
            self.refresh_tail()?;
            if self.read_pos == self.cached_tail {
                return Ok(Read::Closed);
            }
            return self.read();
        }
        Ok(Read::Empty)
    }

    fn refresh_tail(&mut self) -> Result<(), RingError> {
        // SYNC POINT Acquire: pairs with the Release store of `tail` in Producer::publish;
        // makes the slot bytes before it visible.
        let tail = self.region.header().tail.value.load(Ordering::Acquire);
        if tail < self.cached_tail || tail - self.released > self.slot_count {
            return Err(ring::poison(&self.region, PoisonReason::TailOutOfRange, tail));
        }
        self.cached_tail = tail;
        Ok(())
    }

    /// Publish every release: one Release store of `head`, a wake-up only if the producer
    /// is parked waiting for credit.
    #[inline]
    pub fn publish(&mut self) {
        if self.read_pos == self.released {
            return;
        }
        self.released = self.read_pos;
        let h = self.region.header();
        // SYNC POINT Release: pairs with the Acquire load of `head` in Producer::refresh_head;
        // says we are done reading every slot before it.
        h.head.value.store(self.read_pos, Ordering::Release);
        ring::wake_if_waiting(&h.producer_park);
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
            match idler.step() {
                IdleStep::Spin => crate::sync::spin_hint(),
                IdleStep::Yield => crate::sync::yield_now(),
                IdleStep::Sleep(d) => std::thread::sleep(d),
                IdleStep::Park => self.park(ring::PARK_BACKSTOP),
            }
        }
    }

    /// Sleep on the consumer's futex word until the producer publishes (or `timeout`).
    pub fn park(&mut self, timeout: Duration) {
        let first = self.region.header().consumer_park.parks.load(Ordering::Relaxed) == 0;
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
        let h = self.region.header();
        let line = &h.consumer_park;
        if line.parks.load(Ordering::Relaxed) == 0 {
            line.parks.store(1, Ordering::SeqCst);
        }
        let expected = line.wake.load(Ordering::Acquire);
        line.waiting.store(1, Ordering::Relaxed);
        // SYNC POINT SeqCst fence: pairs with the fence in `ring::wake_if_waiting` called by
        // Producer::publish. Either the producer sees `waiting` and wakes us, or we see its tail.
        fence(Ordering::SeqCst);
        let tail = h.tail.value.load(Ordering::Relaxed);
        let state = h.state.load(Ordering::Relaxed);
        if tail != self.cached_tail || state != 0 || self.read_pos != self.cached_tail {
            return None;
        }
        ring::heartbeat(&h.consumer);
        Some(ParkToken { word: &line.wake, expected })
    }

    /// Done sleeping (or decided not to).
    pub fn end_park(&self) {
        self.region.header().consumer_park.waiting.store(0, Ordering::Relaxed);
    }

    /// Mark the ring poisoned on purpose.
    pub fn poison(&self, detail: u64) -> RingError {
        ring::poison(&self.region, PoisonReason::Application, detail)
    }

    /// Record a sign of life in the header.
    pub fn heartbeat(&self) {
        ring::heartbeat(&self.region.header().consumer);
    }

    /// Whether the producer is still attached and alive (a system call: not for hot loops).
    pub fn producer_alive(&self) -> bool {
        ring::side_alive(&self.region.header().producer)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.publish();
        let h = self.region.header();
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
    index: u64,
    len: usize,
    kind: RecordKind,
    slots: u64,
}

impl RecordView<'_> {
    /// What the record is.
    #[inline]
    pub fn kind(&self) -> RecordKind {
        self.kind
    }

    /// The payload, in place.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        // SAFETY: the record lies in [read_pos, cached_tail), published by the producer
        // (Acquire in refresh_tail) and not yet released, so the producer will not write
        // it; `read` checked that it fits before the end of the ring.
        unsafe {
            std::slice::from_raw_parts(self.consumer.region.slot_ptr(self.index).add(RECORD_HEADER_BYTES), self.len)
        }
    }

    /// Slots this record takes.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Release and publish at once: the producer gets the credit now.
    #[inline]
    pub fn release(self) {
        let consumer = self.consumer;
        consumer.read_pos += self.slots;
        consumer.publish();
    }

    /// Release without publishing; published by [`Consumer::publish`], by a read that
    /// finds the ring empty, or once `release_batch_slots` are pending.
    #[inline]
    pub fn release_deferred(self) {
        let consumer = self.consumer;
        consumer.read_pos += self.slots;
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
