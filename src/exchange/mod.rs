//! Exchanges: how records leave a subtask. One ring per (sender subtask, receiver subtask)
//! pair; a partitioning picks the ring for each record.
//!
//! - **forward**: sender i → receiver i (equal parallelism); chained away when possible.
//! - **hash** (`key_by`): key → key group (`hash(key) % max_key_groups`) → the receiver that
//!   owns that group. Receivers own contiguous ranges of key groups, so a key group's state
//!   moves as one range when parallelism changes.
//! - **rebalance**: round robin.
//! - **broadcast**: every receiver gets every record.
//!
//! Emitting into a ring with no credit blocks the sender (that is backpressure): it
//! publishes what it wrote elsewhere, waits by its idle strategy (parking on the ring and its
//! mailbox at once), and counts the wait as backpressured time.

use crate::operators::{AnyCollector, Collector, Halt, Signal, erase};
use crate::record::Record;
use crate::runtime::SubtaskContext;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;
use weir_ring::counters::Counter;
use weir_ring::{Claim, ClaimError, IdleStep, Idler, ParkToken, Producer, RecordKind};

/// How records of an edge are spread over the receiving subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitioning {
    /// Sender i to receiver i; needs equal parallelism.
    Forward,
    /// By key group of the record's key.
    Hash,
    /// Round robin.
    Rebalance,
    /// To every receiver.
    Broadcast,
}

/// The key group of a key hash: `hash % max_key_groups`, after a finalizer so that keys
/// that differ only in high bits still spread.
#[inline]
pub fn key_group(key_hash: u64, max_key_groups: u32) -> u32 {
    // murmur3's fmix64.
    let mut h = key_hash;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    (h % max_key_groups as u64) as u32
}

/// Which receiver owns key group `kg` (Flink's formula: contiguous ranges).
#[inline]
pub fn subtask_for_key_group(kg: u32, parallelism: u32, max_key_groups: u32) -> u32 {
    (kg as u64 * parallelism as u64 / max_key_groups as u64) as u32
}

/// The key groups subtask `index` of `parallelism` owns.
pub fn key_group_range(index: u32, parallelism: u32, max_key_groups: u32) -> std::ops::Range<u32> {
    let start = (index as u64 * max_key_groups as u64).div_ceil(parallelism as u64) as u32;
    let end = ((index as u64 + 1) * max_key_groups as u64).div_ceil(parallelism as u64) as u32;
    start..end
}

/// Hash a key with a fixed, fast hasher (the same in every process and run).
pub fn hash_key<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// A record's key, hashed (what `key_by` turns its key function into).
pub type KeyFn<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

/// One outgoing ring and its counters.
pub(crate) struct OutputChannel {
    pub producer: Producer,
    pub name: String,
    pub blocked_ns: Counter,
    pub backlog: Counter,
    pub credit: Counter,
}

/// The rings of one edge, seen from one sending subtask.
pub(crate) struct OutputGate {
    channels: Vec<OutputChannel>,
    partitioning: Partitioning,
    next: usize,
    max_key_groups: u32,
    ctx: Arc<SubtaskContext>,
    closed: bool,
}

impl OutputGate {
    pub(crate) fn new(
        channels: Vec<OutputChannel>,
        partitioning: Partitioning,
        max_key_groups: u32,
        ctx: Arc<SubtaskContext>,
    ) -> OutputGate {
        assert!(!channels.is_empty(), "an output gate has at least one channel");
        OutputGate { channels, partitioning, next: 0, max_key_groups, ctx, closed: false }
    }

    /// Write one record into channel `ch`, waiting for credit if needed.
    #[inline]
    fn write<T: Record>(&mut self, ch: usize, record: &T) -> Result<(), Halt> {
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
        Halt::Failed(format!("output {}: {e}", self.channels[ch].name))
    }

    /// Block until channel `ch` has credit for `len` bytes: publish every channel first (so
    /// receivers can drain), then idle by the subtask's strategy, waking on the ring or the
    /// mailbox. The wait counts as backpressured time, live (so a stuck job shows it).
    #[cold]
    fn wait_for_credit(&mut self, ch: usize, len: usize) -> Result<(), Halt> {
        self.flush();
        let mut idler = Idler::new(self.ctx.idle);
        let mut mark = Instant::now();
        let account = |ctx: &SubtaskContext, blocked: Counter, mark: &mut Instant| {
            let now = Instant::now();
            let ns = (now - *mark).as_nanos() as u64;
            ctx.backpressured_ns.add(ns);
            blocked.add(ns);
            *mark = now;
        };
        loop {
            let channel = &mut self.channels[ch];
            match channel.producer.poll_credit(len) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => return Err(self.claim_failed(ch, e)),
            }
            let seq = self.ctx.mailbox.seq();
            if self.ctx.mailbox.stop_requested() {
                account(&self.ctx, channel.blocked_ns, &mut mark);
                return Err(Halt::Stopped);
            }
            match idler.step() {
                IdleStep::Spin => std::hint::spin_loop(),
                IdleStep::Yield => std::thread::yield_now(),
                IdleStep::Sleep(d) => std::thread::sleep(d),
                IdleStep::Park => {
                    channel.credit.set(channel.producer.credit());
                    channel.backlog.set(channel.producer.slot_count() - channel.producer.credit());
                    if let Some(token) = channel.producer.prepare_park(len) {
                        weir_ring::wait_any(
                            &[token, ParkToken::new(&self.ctx.mailbox.doorbell, seq)],
                            crate::runtime::PARK_BACKSTOP,
                        );
                    }
                    channel.producer.end_park();
                    account(&self.ctx, channel.blocked_ns, &mut mark);
                }
            }
        }
        account(&self.ctx, self.channels[ch].blocked_ns, &mut mark);
        Ok(())
    }

    /// Publish every channel and refresh its fill counters.
    pub(crate) fn flush(&mut self) {
        for c in &mut self.channels {
            c.producer.publish();
            let credit = c.producer.credit();
            c.credit.set(credit);
            c.backlog.set(c.producer.slot_count() - credit);
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
                let kg = key_group(key(record), gate.max_key_groups);
                let ch = subtask_for_key_group(kg, gate.channels.len() as u32, gate.max_key_groups);
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
        }
    }
}

/// Builds the writer of an edge carrying `T`.
pub(crate) type WriterFn = Arc<dyn Fn(OutputGate) -> AnyCollector + Send + Sync>;

pub(crate) fn writer_fn<T: Record>(key: Option<KeyFn<T>>) -> WriterFn {
    Arc::new(move |gate| erase::<T>(Box::new(RingWriter { gate, key: key.clone() })))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Key-group ranges cover 0..max exactly once, and agree with subtask_for_key_group.
    #[test]
    fn key_group_ranges_partition() {
        for p in 1..=16u32 {
            let mut next = 0;
            for i in 0..p {
                let r = key_group_range(i, p, 128);
                assert_eq!(r.start, next);
                for kg in r.clone() {
                    assert_eq!(subtask_for_key_group(kg, p, 128), i, "kg {kg} p {p}");
                }
                next = r.end;
            }
            assert_eq!(next, 128);
        }
    }

    /// Sequential keys spread over key groups.
    #[test]
    fn keys_spread() {
        let mut counts = [0u32; 128];
        for k in 0..128_000u64 {
            counts[key_group(hash_key(&k), 128) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 500 && c < 1500), "{counts:?}");
    }
}
