//! The sending half of a channel: an output gate over one edge's rings, and the ring
//! writer at the end of a chain that picks a ring per record by the edge's partitioning.
//!
//! Emitting into a ring with no credit blocks the sender (that is backpressure): it
//! publishes what it wrote elsewhere, waits by its idle strategy (parking on the ring and its
//! mailbox at once), and counts the wait as backpressured time.

use super::{PARK_BACKSTOP, SubtaskContext};
use crate::chain::{AnyCollector, erase};
use crate::operators::{Collector, Halt, OperatorError, Signal};
use crate::record::{KeyFn, KeyGroups, Partitioning, Record};
use std::sync::Arc;
use std::time::Instant;
use weir_ring::counters::SharedCounter;
use weir_ring::{Append, Claim, ClaimError, IdleStep, Idler, ParkToken, Producer, RecordKind, Stride};

/// One outgoing ring and its counters.
pub(crate) struct OutputChannel {
    pub producer: Producer,
    pub name: String,
    /// ns the sender waited for credit on this ring. (Backlog and credit are sampled by the
    /// monitor from the ring itself: the sender does not read the receiver's line for them.)
    pub blocked_ns: SharedCounter,
}

/// The rings of one edge, seen from one sending subtask.
pub(crate) struct OutputGate {
    channels: Vec<OutputChannel>,
    partitioning: Partitioning,
    next: usize,
    key_groups: KeyGroups,
    /// Records go in frames (`JobConfig::record_frames`); else one header each.
    frames: bool,
    ctx: Arc<SubtaskContext>,
    closed: bool,
    /// The channel of the next latency marker (in turn).
    next_marker: usize,
}

impl OutputGate {
    pub(crate) fn new(
        channels: Vec<OutputChannel>,
        partitioning: Partitioning,
        max_key_groups: u32,
        frames: bool,
        ctx: Arc<SubtaskContext>,
    ) -> OutputGate {
        assert!(!channels.is_empty(), "an output gate has at least one channel");
        let key_groups = KeyGroups::new(channels.len() as u32, max_key_groups);
        OutputGate { channels, partitioning, next: 0, key_groups, frames, ctx, closed: false, next_marker: 0 }
    }

    /// Write one record into channel `ch`, waiting for credit if needed. Records go into
    /// the channel's open frame (one header per batch: see `weir_ring::frame`), which the
    /// next flush, a control record or a full frame closes.
    #[inline]
    fn write<T: Record>(&mut self, ch: usize, record: &T) -> Result<(), Halt> {
        if !self.frames {
            return self.write_plain(ch, record);
        }
        let len = record.encoded_len();
        let stride = if T::FIXED_SIZE { Stride::Fixed } else { Stride::Variable };
        loop {
            let producer = &mut self.channels[ch].producer;
            match producer.append(stride, len) {
                Ok(Append::Granted(mut slot)) => {
                    record.encode(&mut slot);
                    slot.commit();
                    return Ok(());
                }
                Ok(Append::NoCredit) => self.wait_for_credit(ch, len)?,
                Err(e) => return Err(self.claim_failed(ch, e)),
            }
        }
    }

    /// Write `records` into channel `ch` in order, as `write` one by one would: records of
    /// a fixed layout go into the open frame a run at a time (one append, one commit for as
    /// many as the frame has room for, `Producer::append_run`).
    #[inline]
    fn write_batch<T: Record>(&mut self, ch: usize, records: &[T]) -> Result<(), Halt> {
        if !(self.frames && T::FIXED_SIZE) {
            for record in records {
                self.write(ch, record)?;
            }
            return Ok(());
        }
        let mut rest = records;
        while let Some(first) = rest.first() {
            let len = first.encoded_len();
            let producer = &mut self.channels[ch].producer;
            match producer.append_run(len, rest.len()) {
                Ok(Append::Granted(mut slot)) => {
                    let n = slot.records();
                    if len == 0 {
                        // Empty records go plain, one by one (`append_run` grants one).
                        first.encode(&mut slot);
                    } else {
                        for (record, out) in rest[..n].iter().zip(slot.chunks_exact_mut(len)) {
                            debug_assert_eq!(record.encoded_len(), len, "a FIXED_SIZE record changed its size");
                            record.encode(out);
                        }
                    }
                    slot.commit();
                    rest = &rest[n..];
                }
                Ok(Append::NoCredit) => self.wait_for_credit(ch, len)?,
                Err(e) => return Err(self.claim_failed(ch, e)),
            }
        }
        Ok(())
    }

    /// `write` with a header per record (`JobConfig::record_frames` off).
    fn write_plain<T: Record>(&mut self, ch: usize, record: &T) -> Result<(), Halt> {
        let len = record.encoded_len();
        loop {
            match self.channels[ch].producer.claim(len) {
                Ok(Claim::Granted(mut slot)) => {
                    record.encode(&mut slot);
                    slot.commit_deferred();
                    return Ok(());
                }
                Ok(Claim::NoCredit) => self.wait_for_credit(ch, len)?,
                Err(e) => return Err(self.claim_failed(ch, e)),
            }
        }
    }

    #[cold]
    fn claim_failed(&self, ch: usize, e: ClaimError) -> Halt {
        OperatorError::Output { channel: self.channels[ch].name.clone(), source: e }.into()
    }

    /// Block until channel `ch` has credit for a record of `len` payload bytes: publish every channel first (so
    /// receivers can drain), then idle by the subtask's strategy, waking on the ring or the
    /// mailbox. The wait counts as backpressured time, live (so a stuck job shows it).
    #[cold]
    fn wait_for_credit(&mut self, ch: usize, len: usize) -> Result<(), Halt> {
        self.flush();
        let mut idler = Idler::new(self.ctx.idle);
        let mut mark = Instant::now();
        self.ctx.time.set_backpressured(true, mark);
        // The channel's own blocked time, after each park (the subtask's is the time account's:
        // the monitor counts it live).
        let account = |ctx: &SubtaskContext, blocked: &SharedCounter, mark: &mut Instant, over: bool| {
            let now = Instant::now();
            blocked.add((now - *mark).as_nanos() as u64);
            if over {
                ctx.time.set_backpressured(false, now);
            }
            *mark = now;
        };
        loop {
            let channel = &mut self.channels[ch];
            match channel.producer.poll_credit(len) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    account(&self.ctx, &channel.blocked_ns, &mut mark, true);
                    return Err(self.claim_failed(ch, e));
                }
            }
            let seq = self.ctx.mailbox.seq();
            if self.ctx.mailbox.stop_requested() {
                account(&self.ctx, &channel.blocked_ns, &mut mark, true);
                return Err(Halt::Stopped);
            }
            // Spin, yield or sleep by the strategy; when it says park, park on the ring and
            // the mailbox at once.
            if let Some(IdleStep::Park) = idler.idle(0) {
                if let Some(token) = channel.producer.prepare_park(len) {
                    weir_ring::wait_any(&[token, ParkToken::new(&self.ctx.mailbox.doorbell, seq)], PARK_BACKSTOP);
                }
                channel.producer.end_park();
                account(&self.ctx, &channel.blocked_ns, &mut mark, false);
            }
        }
        account(&self.ctx, &self.channels[ch].blocked_ns, &mut mark, true);
        Ok(())
    }

    /// Publish every channel (the receivers see what was written; no shared load).
    pub(crate) fn flush(&mut self) {
        for c in &mut self.channels {
            c.producer.publish();
        }
    }

    /// Send end-of-stream on every channel, publish, and close the rings.
    fn end(&mut self) -> Result<(), Halt> {
        if self.closed {
            return Ok(());
        }
        for ch in 0..self.channels.len() {
            self.write_kind(ch, RecordKind::EndOfStream, &[])?;
        }
        self.flush();
        self.closed = true;
        Ok(())
    }

    /// Send a watermark on every channel, in band: whatever the partitioning, each receiver
    /// must learn that event time advanced (it takes the minimum over its inputs). Published
    /// with the next flush, like records.
    fn watermark(&mut self, watermark: u64) -> Result<(), Halt> {
        if self.closed {
            return Ok(());
        }
        for ch in 0..self.channels.len() {
            self.write_kind(ch, RecordKind::Watermark, &watermark.to_le_bytes())?;
        }
        Ok(())
    }

    /// Send checkpoint barrier `id` on every channel, behind the records before it, and
    /// publish at once (a barrier should not wait for the next batch).
    fn barrier(&mut self, id: u64) -> Result<(), Halt> {
        if self.closed {
            return Ok(());
        }
        for ch in 0..self.channels.len() {
            self.write_kind(ch, RecordKind::Barrier, &id.to_le_bytes())?;
        }
        self.flush();
        Ok(())
    }

    /// Send a latency marker on one channel, the next in turn: a sample needs one path to a
    /// sink, and a marker on every channel would multiply at each shuffle. In band, behind
    /// the records before it; published with the next flush, like them.
    fn latency(&mut self, marker: crate::operators::LatencyMarker) -> Result<(), Halt> {
        if self.closed {
            return Ok(());
        }
        let ch = self.next_marker % self.channels.len();
        self.next_marker = self.next_marker.wrapping_add(1);
        self.write_kind(ch, RecordKind::Latency, &marker.to_bytes())
    }

    /// Write a control record (not data) into channel `ch`, waiting for credit if needed.
    fn write_kind(&mut self, ch: usize, kind: RecordKind, payload: &[u8]) -> Result<(), Halt> {
        loop {
            match self.channels[ch].producer.claim_kind(kind, payload.len()) {
                Ok(Claim::Granted(mut slot)) => {
                    slot.copy_from_slice(payload);
                    slot.commit_deferred();
                    return Ok(());
                }
                Ok(Claim::NoCredit) => self.wait_for_credit(ch, payload.len())?,
                Err(e) => return Err(self.claim_failed(ch, e)),
            }
        }
    }
}

/// The collector at the end of a chain that writes into an edge's rings.
struct RingWriter<T> {
    gate: OutputGate,
    key: Option<KeyFn<T>>,
}

impl<T: Record> Collector<T> for RingWriter<T> {
    #[inline]
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        let gate = &mut self.gate;
        match gate.partitioning {
            Partitioning::Forward => gate.write(0, record),
            Partitioning::Rebalance => {
                let ch = gate.next;
                gate.next = if ch + 1 == gate.channels.len() { 0 } else { ch + 1 };
                gate.write(ch, record)
            }
            Partitioning::Hash => {
                let key = self.key.as_ref().expect("hash edges carry a key function");
                let ch = gate.key_groups.subtask(gate.key_groups.key_group(key(record)));
                gate.write(ch as usize, record)
            }
            Partitioning::Broadcast => {
                for ch in 0..gate.channels.len() {
                    gate.write(ch, record)?;
                }
                Ok(())
            }
        }
    }
    #[inline]
    fn collect_batch(&mut self, records: &[T]) -> Result<(), Halt> {
        let gate = &mut self.gate;
        match gate.partitioning {
            Partitioning::Forward => gate.write_batch(0, records),
            // Each channel gets the whole batch: its order is the order it would have seen.
            Partitioning::Broadcast => {
                for ch in 0..gate.channels.len() {
                    gate.write_batch(ch, records)?;
                }
                Ok(())
            }
            Partitioning::Rebalance | Partitioning::Hash => {
                for record in records {
                    self.collect(record)?;
                }
                Ok(())
            }
        }
    }

    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        match signal {
            Signal::Flush => {
                self.gate.flush();
                Ok(())
            }
            Signal::Watermark(w) => self.gate.watermark(w),
            Signal::End => self.gate.end(),
            Signal::Barrier(id) => self.gate.barrier(id),
            // Each subtask hears of a completed checkpoint from the coordinator itself.
            Signal::CheckpointComplete(_) => Ok(()),
            Signal::Latency(m) => self.gate.latency(m),
        }
    }
}

/// Builds the writer of an edge carrying `T`.
pub(crate) type WriterFn = Arc<dyn Fn(OutputGate) -> AnyCollector + Send + Sync>;

pub(crate) fn writer_fn<T: Record>(key: Option<KeyFn<T>>) -> WriterFn {
    Arc::new(move |gate| erase::<T>(Box::new(RingWriter { gate, key: key.clone() })))
}
