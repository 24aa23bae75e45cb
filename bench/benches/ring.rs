//! Ring benchmark: what one `weir_ring` channel costs, next to `rtrb` (the SPSC ring weir's
//! design copies) and `crossbeam_queue::ArrayQueue` (a bounded MPMC queue), measured in the
//! same run on the same cores. Two threads, producer and consumer (or ping and echo), are
//! pinned to two different cores and busy-spin while they wait. Throughput: records 0..n of
//! 8 or 64 bytes go through one ring, either one at a time (weir `commit`/`release`, which
//! publish at once; rtrb `push`/`pop`) or in batches of 64 (weir `commit_deferred` ×64 then
//! `publish`, and `read_batch` of up to 64, which releases and publishes once; rtrb
//! `write_chunk_uninit`/`read_chunk`; ArrayQueue has no batch API and does 64 pushes/pops);
//! the consumer sums the first and last 8 bytes of every record and the sum is checked, so
//! nothing is optimized away or lost.
//! Round trip (RTT): one record goes out on one ring and is echoed back on a second; the
//! floor, measured first in each round-trip group, is two threads bouncing one atomic on its
//! own 128-byte-aligned line — and timed again inside every RTT sample, on the same two
//! threads just before the queue's round trips: the "paired" RTT/floor (median over the
//! samples) that the target is checked on cannot mix two placements of the vCPUs. Weir's
//! rings are sized to hold as close to the baselines' 4096 records as a power-of-two slot
//! count allows (8 B: 4096 slots of 16 B, a record plus its
//! 8-byte header fills one slot; 64 B: 32768 slots of 8 B = 256 KiB, the same bytes as
//! 4096 × 64 B, 3640 records of 9 slots).
//! Run it with `cargo bench -p weir-bench --bench ring`; after criterion's groups it prints a
//! markdown table (records/s, ns, weir/rtrb and RTT/floor) and writes it, with the CPU model,
//! the pinning map, ring sizes and git revision, to `target/weir-bench/ring.json`.
//! `WEIR_BENCH_SMOKE=1` makes every benchmark tiny (a few seconds in all, for CI), and
//! `cargo bench -p weir-bench --bench ring -- --test` runs each benchmark once, untimed.
//! On a machine busy with other work, `chrt -f 10 cargo bench ...` (root) keeps that work
//! off the two cores while the threads spin (the kernel still leaves it 5% of each second).

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::hint::spin_loop;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};
use weir_bench::measure::Meter;
use weir_bench::{
    cpu_model, floor, git, loadavg, median, nice, smt_siblings, steal_ticks, target_dir, thread_context_switches,
};
use weir_ring::{Append, Batch, Claim, Consumer, IdleStrategy, Idler, Producer, Read, RingConfig, Stride};

/// Records the baseline queues hold (items of `[u8; N]`).
const CAPACITY_RECORDS: usize = 4096;
/// Records per batch in the batched workloads.
const BATCH: usize = 64;

// ---------------------------------------------------------------------------------------
// Records: sequence number in the first and the last 8 bytes, the rest zero.

/// Record `seq` of `N` bytes (N >= 8). Every implementation writes all N bytes.
#[inline(always)]
fn record<const N: usize>(seq: u64) -> [u8; N] {
    let mut r = [0u8; N];
    r[..8].copy_from_slice(&seq.to_le_bytes());
    r[N - 8..].copy_from_slice(&seq.to_le_bytes());
    r
}

/// What the consumer takes from a record: first + last u64 (equal for 8-byte records).
#[inline(always)]
fn digest(payload: &[u8]) -> u64 {
    debug_assert!(payload.len() >= 8);
    let first = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
    let last = u64::from_le_bytes(payload[payload.len() - 8..].try_into().expect("8 bytes"));
    first.wrapping_add(last)
}

/// The sum of digests of records 0..n: 2 · n(n−1)/2.
fn expected_digest(n: u64) -> u64 {
    n.wrapping_mul(n.wrapping_sub(1))
}

/// The sequence number of a record.
#[inline(always)]
fn seq_of(payload: &[u8]) -> u64 {
    u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"))
}

// ---------------------------------------------------------------------------------------
// The queues under test, behind one small interface.

/// One SPSC queue implementation carrying `N`-byte records.
trait Queue<const N: usize> {
    const NAME: &'static str;
    type Tx: Send;
    type Rx: Send;
    fn channel() -> (Self::Tx, Self::Rx);
    /// The queue's shape, for the JSON.
    fn shape() -> Value;
    /// Send records 0..n, publishing every `batch` records (1 = each at once).
    fn send(tx: &mut Self::Tx, n: u64, batch: usize);
    /// Receive n records, up to `batch` per release; returns the sum of their digests.
    fn recv(rx: &mut Self::Rx, n: u64, batch: usize) -> u64;
    /// Ping side of the round trip: send record i, wait for it to come back, n times.
    fn ping(tx: &mut Self::Tx, rx: &mut Self::Rx, n: u64);
    /// Echo side: send every record received straight back, n times.
    fn echo(rx: &mut Self::Rx, tx: &mut Self::Tx, n: u64);
    /// Send and receive one record; where it sat: address % 64 (`None`: not exposed).
    fn probe_alignment(tx: &mut Self::Tx, rx: &mut Self::Rx) -> Option<usize>;
}

/// weir's ring; `PARK`: the sides wait by the engine's default `Park` strategy (spin, yield,
/// then sleep on the ring's futex word) instead of busy-spinning.
struct WeirQ<const PARK: bool>;
type Weir = WeirQ<false>;
type WeirPark = WeirQ<true>;

impl<const PARK: bool> WeirQ<PARK> {
    fn config<const N: usize>() -> RingConfig {
        // See the crate doc: 8 B → 4096 × 16 B (one slot per record); 64 B → 32768 × 8 B
        // (nine slots per record, the same 256 KiB as the baselines' 4096 × 64 B).
        let (slot_bytes, slot_count) = if N <= 8 { (16, 4096) } else { (8, 32768) };
        RingConfig { slot_bytes, slot_count, max_record_bytes: N as u32 }
    }

    /// Claim, fill and commit one record, waiting while there is no credit.
    #[inline(always)]
    fn write<const N: usize>(tx: &mut Producer, seq: u64, publish_now: bool, idler: &mut Idler) {
        loop {
            match tx.claim(N).expect("claim on a live ring") {
                Claim::Granted(mut slot) => {
                    slot.copy_from_slice(&record::<N>(seq));
                    if publish_now {
                        slot.commit();
                    } else {
                        slot.commit_deferred();
                    }
                    return;
                }
                Claim::NoCredit => Self::no_credit(tx, N, idler),
            }
        }
    }

    /// No credit: spin once, or (Park) wait by the strategy until there is.
    #[inline(always)]
    fn no_credit(tx: &mut Producer, len: usize, idler: &mut Idler) {
        if PARK {
            tx.wait_for_credit(len, idler).expect("wait on a live ring");
        } else {
            spin_loop();
        }
    }

    /// Nothing to read: spin once, or (Park) wait by the strategy until a record is there.
    #[inline(always)]
    fn empty(rx: &mut Consumer, idler: &mut Idler) {
        if PARK {
            rx.wait_for_record(idler).expect("wait on a live ring");
        } else {
            spin_loop();
        }
    }

    fn idler() -> Idler {
        Idler::new(IdleStrategy::default())
    }
}

impl<const N: usize, const PARK: bool> Queue<N> for WeirQ<PARK> {
    const NAME: &'static str = if PARK { "weir-park" } else { "weir" };
    type Tx = Producer;
    type Rx = Consumer;

    fn channel() -> (Producer, Consumer) {
        weir_ring::channel(Self::config::<N>()).expect("valid ring config")
    }

    fn shape() -> Value {
        let c = Self::config::<N>();
        let slots_per_record = (8 + N as u32).div_ceil(c.slot_bytes);
        json!({
            "slot_bytes": c.slot_bytes,
            "slot_count": c.slot_count,
            "ring_bytes": c.ring_bytes(),
            "slots_per_record": slots_per_record,
            "records_held": c.slot_count / slots_per_record,
            "record_header_bytes": 8,
        })
    }

    fn send(tx: &mut Producer, n: u64, batch: usize) {
        let mut idler = Self::idler();
        if batch <= 1 {
            for seq in 0..n {
                Self::write::<N>(tx, seq, true, &mut idler);
            }
            return;
        }
        let mut seq = 0;
        while seq < n {
            let end = (seq + batch as u64).min(n);
            for s in seq..end {
                // A claim that finds no credit publishes what was committed, so a batch
                // larger than the free space still drains.
                Self::write::<N>(tx, s, false, &mut idler);
            }
            tx.publish();
            seq = end;
        }
    }

    fn recv(rx: &mut Consumer, n: u64, batch: usize) -> u64 {
        let mut idler = Self::idler();
        let mut sum = 0u64;
        let mut got = 0;
        if batch > 1 {
            // `read_batch`: up to `batch` records with one tail refresh and one head publish.
            while got < n {
                let want = (n - got).min(batch as u64) as usize;
                match rx.read_batch(want, |_, payload| {
                    sum = sum.wrapping_add(digest(payload));
                    true
                }) {
                    Ok(Batch::Records(k)) => got += k as u64,
                    Ok(Batch::Empty) => Self::empty(rx, &mut idler),
                    Ok(Batch::Closed) => panic!("weir: producer closed after {got} of {n} records"),
                    Err(e) => panic!("weir: read on a live ring: {e}"),
                }
            }
            return sum;
        }
        while got < n {
            match rx.read().expect("read on a live ring") {
                Read::Record(view) => {
                    sum = sum.wrapping_add(digest(view.payload()));
                    view.release();
                    got += 1;
                }
                Read::Empty => Self::empty(rx, &mut idler),
                Read::Closed => panic!("weir: producer closed after {got} of {n} records"),
            }
        }
        sum
    }

    fn ping(tx: &mut Producer, rx: &mut Consumer, n: u64) {
        let mut idler = Self::idler();
        for seq in 0..n {
            Self::write::<N>(tx, seq, true, &mut idler);
            loop {
                match rx.read().expect("read on a live ring") {
                    Read::Record(view) => {
                        assert_eq!(seq_of(view.payload()), seq, "weir: echo out of order");
                        view.release();
                        break;
                    }
                    Read::Empty => Self::empty(rx, &mut idler),
                    Read::Closed => panic!("weir: echo side closed"),
                }
            }
        }
    }

    fn echo(rx: &mut Consumer, tx: &mut Producer, n: u64) {
        let (mut idler, mut credit_idler) = (Self::idler(), Self::idler());
        for _ in 0..n {
            loop {
                match rx.read().expect("read on a live ring") {
                    Read::Record(view) => {
                        // Zero copy: from the incoming view straight into the outgoing claim;
                        // reply first, release after, so the release is off the critical path.
                        loop {
                            match tx.claim(N).expect("claim on a live ring") {
                                Claim::Granted(mut slot) => {
                                    slot.copy_from_slice(view.payload());
                                    slot.commit();
                                    break;
                                }
                                Claim::NoCredit => Self::no_credit(tx, N, &mut credit_idler),
                            }
                        }
                        view.release();
                        break;
                    }
                    Read::Empty => Self::empty(rx, &mut idler),
                    Read::Closed => panic!("weir: ping side closed"),
                }
            }
        }
    }

    fn probe_alignment(tx: &mut Producer, rx: &mut Consumer) -> Option<usize> {
        Self::write::<N>(tx, 0, true, &mut Self::idler());
        match rx.read().expect("read on a live ring") {
            Read::Record(view) => {
                let at = view.payload().as_ptr() as usize % 64;
                view.release();
                Some(at)
            }
            _ => None,
        }
    }
}

/// weir's ring with records appended to frames (`Producer::append`, fixed stride; a batch
/// as one run with `FrameSlot::grow`): the way the engine sends fixed-layout records. One header per frame, records addressed by index,
/// 64-byte records on their own cache lines. The ring has the baselines' bytes: 4096 × 8 B
/// slots for 8-byte records, 32768 × 8 B for 64-byte ones. Busy-spin. `SCALE`: rings that
/// many times larger (`WeirFrameLarge`, against `RtrbLarge` of the same bytes).
struct WeirFrameQ<const SCALE: u32>;
type WeirFrame = WeirFrameQ<1>;
type WeirFrameLarge = WeirFrameQ<LARGE>;

/// How many times larger the rings of the large-ring pair are: 512 KiB for 8-byte records.
/// A ring that fits what the two cores hand over hot and one that does not behave apart
/// (`ringbuf/examples/hot_path.rs`, `RING_SCALE`).
const LARGE: u32 = 16;

impl<const SCALE: u32> WeirFrameQ<SCALE> {
    fn config<const N: usize>() -> RingConfig {
        let slots = if N <= 8 { 4096 } else { 32768 };
        RingConfig { slot_bytes: 8, slot_count: slots * SCALE, max_record_bytes: N as u32 }
    }

    /// Append record `seq` to the open frame, spinning while there is no credit.
    #[inline(always)]
    fn append<const N: usize>(tx: &mut Producer, seq: u64) {
        loop {
            match tx.append(Stride::Fixed, N).expect("append on a live ring") {
                Append::Granted(mut slot) => {
                    slot.copy_from_slice(&record::<N>(seq));
                    slot.commit();
                    return;
                }
                Append::NoCredit => spin_loop(),
            }
        }
    }
}

impl<const N: usize, const SCALE: u32> Queue<N> for WeirFrameQ<SCALE> {
    const NAME: &'static str = if SCALE == 1 { "weir-frame" } else { "weir-frame-large" };
    type Tx = Producer;
    type Rx = Consumer;

    fn channel() -> (Producer, Consumer) {
        weir_ring::channel(Self::config::<N>()).expect("valid ring config")
    }

    fn shape() -> Value {
        let c = Self::config::<N>();
        json!({
            "slot_bytes": c.slot_bytes,
            "slot_count": c.slot_count,
            "ring_bytes": c.ring_bytes(),
            "frame_bytes_max": 4096,
            "record_header_bytes": 0,
            "frame_header_bytes": 16,
            "records_start_on": if N.is_multiple_of(64) { "a cache line" } else { "8 bytes" },
        })
    }

    fn send(tx: &mut Producer, n: u64, batch: usize) {
        let batch = batch.max(1) as u64;
        let mut seq = 0;
        while seq < n {
            let end = (seq + batch).min(n);
            while seq < end {
                match tx.append_run(N, (end - seq) as usize).expect("append on a live ring") {
                    Append::Granted(mut slot) => {
                        // The rest of the batch as one run, as far as the open frame has
                        // room: rtrb's write_chunk, in a frame.
                        let k = slot.records();
                        for (i, r) in slot.chunks_exact_mut(N).enumerate() {
                            r.copy_from_slice(&record::<N>(seq + i as u64));
                        }
                        slot.commit();
                        seq += k as u64;
                    }
                    Append::NoCredit => spin_loop(),
                }
            }
            // Closes the frame and publishes it.
            tx.publish();
        }
    }

    /// Batches as runs (`read_runs`): a frame's records come as one slice, read like rtrb's
    /// `read_chunk`; one at a time as `weir` reads them.
    fn recv(rx: &mut Consumer, n: u64, batch: usize) -> u64 {
        if batch <= 1 {
            return <Weir as Queue<N>>::recv(rx, n, batch);
        }
        let mut sum = 0u64;
        let mut got = 0;
        while got < n {
            let want = (n - got).min(batch as u64) as usize;
            match rx.read_runs(want, |_, run, stride| {
                // A reader of fixed-layout records knows their size, as rtrb's typed items
                // do (the engine's `Record::decode_run` views a run as `&[T]`): a run of
                // another stride is a broken peer here.
                assert_eq!(stride, N, "weir-frame: a run of another stride");
                for r in run.chunks_exact(N) {
                    sum = sum.wrapping_add(digest(r));
                }
                true
            }) {
                Ok(Batch::Records(k)) => got += k as u64,
                Ok(Batch::Empty) => spin_loop(),
                Ok(Batch::Closed) => panic!("weir-frame: producer closed after {got} of {n} records"),
                Err(e) => panic!("weir-frame: read on a live ring: {e}"),
            }
        }
        sum
    }

    fn ping(tx: &mut Producer, rx: &mut Consumer, n: u64) {
        for seq in 0..n {
            Self::append::<N>(tx, seq);
            tx.publish();
            loop {
                match rx.read().expect("read on a live ring") {
                    Read::Record(view) => {
                        assert_eq!(seq_of(view.payload()), seq, "weir-frame: echo out of order");
                        view.release();
                        break;
                    }
                    Read::Empty => spin_loop(),
                    Read::Closed => panic!("weir-frame: echo side closed"),
                }
            }
        }
    }

    fn echo(rx: &mut Consumer, tx: &mut Producer, n: u64) {
        for _ in 0..n {
            loop {
                match rx.read().expect("read on a live ring") {
                    Read::Record(view) => {
                        loop {
                            match tx.append(Stride::Fixed, N).expect("append on a live ring") {
                                Append::Granted(mut slot) => {
                                    slot.copy_from_slice(view.payload());
                                    slot.commit();
                                    break;
                                }
                                Append::NoCredit => spin_loop(),
                            }
                        }
                        tx.publish();
                        view.release();
                        break;
                    }
                    Read::Empty => spin_loop(),
                    Read::Closed => panic!("weir-frame: ping side closed"),
                }
            }
        }
    }

    fn probe_alignment(tx: &mut Producer, rx: &mut Consumer) -> Option<usize> {
        Self::append::<N>(tx, 0);
        tx.publish();
        match rx.read().expect("read on a live ring") {
            Read::Record(view) => {
                let at = view.payload().as_ptr() as usize % 64;
                view.release();
                Some(at)
            }
            _ => None,
        }
    }
}

/// What the baseline queues carry for an `N`-byte record.
trait Item<const N: usize>: Copy + Send + std::fmt::Debug + 'static {
    /// The queue names with this item.
    const RTRB: &'static str;
    const CROSSBEAM: &'static str;
    fn make(seq: u64) -> Self;
    /// The record's N bytes.
    fn payload(&self) -> &[u8];
    fn describe() -> String;
}

/// `[u8; N]`: the record's bytes alone (alignment 1: where an item falls on a cache line
/// depends on where the allocator put the buffer, which the report logs).
impl<const N: usize> Item<N> for [u8; N] {
    const RTRB: &'static str = "rtrb";
    const CROSSBEAM: &'static str = "crossbeam";
    fn make(seq: u64) -> Self {
        record::<N>(seq)
    }
    fn payload(&self) -> &[u8] {
        self
    }
    fn describe() -> String {
        format!("[u8; {N}]")
    }
}

/// Control: the bytes weir moves per record (the record and its 8-byte header), `M = N + 8`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Wide<const M: usize>([u8; M]);

impl<const N: usize, const M: usize> Item<N> for Wide<M> {
    const RTRB: &'static str = if M == 16 { "rtrb[u8;16]" } else { "rtrb[u8;72]" };
    const CROSSBEAM: &'static str = "crossbeam-wide";
    fn make(seq: u64) -> Self {
        let mut w = [0u8; M];
        w[..N].copy_from_slice(&record::<N>(seq));
        Wide(w)
    }
    fn payload(&self) -> &[u8] {
        &self.0[..N]
    }
    fn describe() -> String {
        format!("[u8; {M}] (an {N}-byte record in the first bytes)")
    }
}

/// Control: a 64-byte record on its own cache line (`#[repr(C, align(64))]`).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl Item<64> for Line {
    const RTRB: &'static str = "rtrb-align64";
    const CROSSBEAM: &'static str = "crossbeam-align64";
    fn make(seq: u64) -> Self {
        Line(record::<64>(seq))
    }
    fn payload(&self) -> &[u8] {
        &self.0
    }
    fn describe() -> String {
        "#[repr(C, align(64))] [u8; 64]".into()
    }
}

/// Where each queue's first slot sits relative to a cache line (address % 64; `None`: the
/// queue does not expose it), by `queue/N`: a 64-byte record off a line boundary touches
/// two lines. Probed on the very queue measured, before its runs.
static ALIGNMENT: Mutex<BTreeMap<String, Option<usize>>> = Mutex::new(BTreeMap::new());

/// rtrb carrying items of type `I` (plain `[u8; N]`, or a control: see [`Item`]).
struct RtrbOf<I>(std::marker::PhantomData<I>);
type Rtrb<const N: usize> = RtrbOf<[u8; N]>;

/// rtrb of `[u8; N]` items in a ring `LARGE` times larger: the baseline of `WeirFrameLarge`
/// (the same bytes).
struct RtrbLarge<const N: usize>;

impl<const N: usize> Queue<N> for RtrbLarge<N> {
    const NAME: &'static str = "rtrb-large";
    type Tx = rtrb::Producer<[u8; N]>;
    type Rx = rtrb::Consumer<[u8; N]>;

    fn channel() -> (Self::Tx, Self::Rx) {
        rtrb::RingBuffer::new(CAPACITY_RECORDS * LARGE as usize)
    }

    fn shape() -> Value {
        let records = CAPACITY_RECORDS * LARGE as usize;
        json!({ "capacity_records": records, "item_bytes": N, "ring_bytes": records * N })
    }

    fn send(tx: &mut Self::Tx, n: u64, batch: usize) {
        <Rtrb<N> as Queue<N>>::send(tx, n, batch)
    }

    fn recv(rx: &mut Self::Rx, n: u64, batch: usize) -> u64 {
        <Rtrb<N> as Queue<N>>::recv(rx, n, batch)
    }

    fn ping(tx: &mut Self::Tx, rx: &mut Self::Rx, n: u64) {
        <Rtrb<N> as Queue<N>>::ping(tx, rx, n)
    }

    fn echo(rx: &mut Self::Rx, tx: &mut Self::Tx, n: u64) {
        <Rtrb<N> as Queue<N>>::echo(rx, tx, n)
    }

    fn probe_alignment(tx: &mut Self::Tx, rx: &mut Self::Rx) -> Option<usize> {
        <Rtrb<N> as Queue<N>>::probe_alignment(tx, rx)
    }
}

impl<const N: usize, I: Item<N>> Queue<N> for RtrbOf<I> {
    const NAME: &'static str = I::RTRB;
    type Tx = rtrb::Producer<I>;
    type Rx = rtrb::Consumer<I>;

    fn channel() -> (Self::Tx, Self::Rx) {
        rtrb::RingBuffer::new(CAPACITY_RECORDS)
    }

    fn shape() -> Value {
        json!({ "capacity_records": CAPACITY_RECORDS, "item": I::describe(), "item_bytes": size_of::<I>(), "item_align": align_of::<I>(), "ring_bytes": CAPACITY_RECORDS * size_of::<I>() })
    }

    fn send(tx: &mut Self::Tx, n: u64, batch: usize) {
        if batch <= 1 {
            for seq in 0..n {
                let mut item = I::make(seq);
                while let Err(rtrb::PushError::Full(back)) = tx.push(item) {
                    item = back;
                    spin_loop();
                }
            }
            return;
        }
        let mut seq = 0;
        while seq < n {
            let want = (n - seq).min(batch as u64) as usize;
            // Like weir's batch: write what fits when fewer than `want` slots are free.
            let chunk = match tx.write_chunk_uninit(want) {
                Ok(chunk) => chunk,
                Err(rtrb::chunks::ChunkError::TooFewSlots(0)) => {
                    spin_loop();
                    continue;
                }
                Err(rtrb::chunks::ChunkError::TooFewSlots(free)) => {
                    tx.write_chunk_uninit(free).expect("free slots stay free")
                }
            };
            let len = chunk.len() as u64;
            let written = chunk.fill_from_iter((seq..seq + len).map(I::make));
            debug_assert_eq!(written as u64, len);
            seq += len;
        }
    }

    fn recv(rx: &mut Self::Rx, n: u64, batch: usize) -> u64 {
        let mut sum = 0u64;
        let mut got = 0;
        if batch <= 1 {
            while got < n {
                match rx.pop() {
                    Ok(item) => {
                        sum = sum.wrapping_add(digest(item.payload()));
                        got += 1;
                    }
                    Err(_) => spin_loop(),
                }
            }
            return sum;
        }
        while got < n {
            let want = (n - got).min(batch as u64) as usize;
            let chunk = match rx.read_chunk(want) {
                Ok(chunk) => chunk,
                Err(rtrb::chunks::ChunkError::TooFewSlots(0)) => {
                    spin_loop();
                    continue;
                }
                Err(rtrb::chunks::ChunkError::TooFewSlots(some)) => rx.read_chunk(some).expect("published slots stay"),
            };
            let (a, b) = chunk.as_slices();
            for item in a.iter().chain(b) {
                sum = sum.wrapping_add(digest(item.payload()));
            }
            got += chunk.len() as u64;
            chunk.commit_all();
        }
        sum
    }

    fn ping(tx: &mut Self::Tx, rx: &mut Self::Rx, n: u64) {
        for seq in 0..n {
            tx.push(I::make(seq)).expect("the ping ring holds one record at most");
            loop {
                match rx.pop() {
                    Ok(item) => {
                        assert_eq!(seq_of(item.payload()), seq, "rtrb: echo out of order");
                        break;
                    }
                    Err(_) => spin_loop(),
                }
            }
        }
    }

    fn echo(rx: &mut Self::Rx, tx: &mut Self::Tx, n: u64) {
        for _ in 0..n {
            loop {
                match rx.pop() {
                    Ok(item) => {
                        tx.push(item).expect("the echo ring holds one record at most");
                        break;
                    }
                    Err(_) => spin_loop(),
                }
            }
        }
    }

    fn probe_alignment(tx: &mut Self::Tx, rx: &mut Self::Rx) -> Option<usize> {
        tx.push(I::make(0)).ok()?;
        let chunk = rx.read_chunk(1).ok()?;
        let at = chunk.as_slices().0.as_ptr() as usize % 64;
        chunk.commit_all();
        Some(at)
    }
}

/// crossbeam's ArrayQueue carrying items of type `I`.
struct CrossbeamOf<I>(std::marker::PhantomData<I>);
type Crossbeam<const N: usize> = CrossbeamOf<[u8; N]>;

impl<const N: usize, I: Item<N>> Queue<N> for CrossbeamOf<I> {
    const NAME: &'static str = I::CROSSBEAM;
    type Tx = Arc<ArrayQueue<I>>;
    type Rx = Arc<ArrayQueue<I>>;

    fn channel() -> (Self::Tx, Self::Rx) {
        let q = Arc::new(ArrayQueue::new(CAPACITY_RECORDS));
        (q.clone(), q)
    }

    fn shape() -> Value {
        json!({ "capacity_records": CAPACITY_RECORDS, "item": I::describe(), "item_bytes": size_of::<I>(), "item_align": align_of::<I>(), "ring_bytes": CAPACITY_RECORDS * size_of::<I>(), "note": "MPMC; no batch API: a batch is 64 single pushes/pops" })
    }

    fn send(tx: &mut Self::Tx, n: u64, _batch: usize) {
        // No batch API: the batched workload is the same 64 single pushes.
        for seq in 0..n {
            let mut item = I::make(seq);
            while let Err(back) = tx.push(item) {
                item = back;
                spin_loop();
            }
        }
    }

    fn recv(rx: &mut Self::Rx, n: u64, _batch: usize) -> u64 {
        let mut sum = 0u64;
        let mut got = 0;
        while got < n {
            match rx.pop() {
                Some(item) => {
                    sum = sum.wrapping_add(digest(item.payload()));
                    got += 1;
                }
                None => spin_loop(),
            }
        }
        sum
    }

    fn ping(tx: &mut Self::Tx, rx: &mut Self::Rx, n: u64) {
        for seq in 0..n {
            tx.push(I::make(seq)).expect("the ping queue holds one record at most");
            loop {
                match rx.pop() {
                    Some(item) => {
                        assert_eq!(seq_of(item.payload()), seq, "crossbeam: echo out of order");
                        break;
                    }
                    None => spin_loop(),
                }
            }
        }
    }

    fn echo(rx: &mut Self::Rx, tx: &mut Self::Tx, n: u64) {
        for _ in 0..n {
            loop {
                match rx.pop() {
                    Some(item) => {
                        tx.push(item).expect("the echo queue holds one record at most");
                        break;
                    }
                    None => spin_loop(),
                }
            }
        }
    }

    fn probe_alignment(_tx: &mut Self::Tx, _rx: &mut Self::Rx) -> Option<usize> {
        None // ArrayQueue hands items out by value.
    }
}

// ---------------------------------------------------------------------------------------
// Two pinned threads.

/// Where the two threads run: producer (ping) and consumer (echo) on different cores.
#[derive(Clone, Copy, Debug)]
enum Pinning {
    Pinned {
        producer: core_affinity::CoreId,
        consumer: core_affinity::CoreId,
    },
    /// Fewer than two cores available (or the list unreadable): threads float.
    Unpinned {
        cores: usize,
    },
}

impl Pinning {
    fn detect() -> Pinning {
        match core_affinity::get_core_ids() {
            Some(ids) if ids.len() >= 2 => Pinning::Pinned { producer: ids[0], consumer: ids[1] },
            Some(ids) => Pinning::Unpinned { cores: ids.len() },
            None => Pinning::Unpinned { cores: 0 },
        }
    }

    fn pin(&self, producer_side: bool) {
        if let Pinning::Pinned { producer, consumer } = *self {
            let core = if producer_side { producer } else { consumer };
            assert!(core_affinity::set_for_current(core), "cannot pin to core {}", core.id);
        }
    }

    fn describe(&self) -> String {
        match self {
            Pinning::Pinned { producer, consumer } => {
                format!("producer/ping on core {}, consumer/echo on core {}", producer.id, consumer.id)
            }
            Pinning::Unpinned { cores } => {
                format!("NOT pinned: only {cores} core(s) available; producer and consumer share the CPU")
            }
        }
    }

    fn json(&self) -> Value {
        match self {
            Pinning::Pinned { producer, consumer } => json!({
                "pinned": true, "cores_used": 2,
                "map": { "producer_or_ping": producer.id, "consumer_or_echo": consumer.id },
            }),
            Pinning::Unpinned { cores } => json!({ "pinned": false, "cores_used": cores, "map": null }),
        }
    }
}

/// Run `a` (producer side) and `b` (consumer side) on their pinned threads, started together
/// by a spin rendezvous so neither waits on a wake-up when the clock starts.
fn pair<RA: Send, RB: Send>(
    pinning: Pinning,
    a: impl FnOnce() -> RA + Send,
    b: impl FnOnce() -> RB + Send,
) -> (RA, RB) {
    // First a blocking wait until both threads are pinned: run under a real-time policy
    // (`chrt -f`), a thread spinning on the core where the other still waits to run (to pin
    // itself) would keep it out for good. Then the spin rendezvous, which starts both at once.
    let pinned = std::sync::Barrier::new(2);
    let ready = AtomicUsize::new(0);
    let rendezvous = || {
        pinned.wait();
        ready.fetch_add(1, Ordering::AcqRel);
        while ready.load(Ordering::Acquire) < 2 {
            spin_loop();
        }
    };
    // Each thread counts its context switches over its run (read outside the timed closures).
    LAST_SWITCHES.store(0, Ordering::Relaxed);
    std::thread::scope(|s| {
        let hb = s.spawn(|| {
            pinning.pin(false);
            let before = thread_context_switches();
            rendezvous();
            let r = b();
            count_switches(before);
            r
        });
        let ha = s.spawn(|| {
            pinning.pin(true);
            let before = thread_context_switches();
            rendezvous();
            let r = a();
            count_switches(before);
            r
        });
        let ra = ha.join().expect("producer thread panicked");
        let rb = hb.join().expect("consumer thread panicked");
        (ra, rb)
    })
}

/// Context switches of both threads of the last [`pair`] run.
static LAST_SWITCHES: AtomicU64 = AtomicU64::new(0);

fn count_switches(before: Option<u64>) {
    if let (Some(b), Some(a)) = (before, thread_context_switches()) {
        LAST_SWITCHES.fetch_add(a.saturating_sub(b), Ordering::Relaxed);
    }
}

/// n records through the queue: from the producer's first claim to the consumer's last read.
fn throughput_run<const N: usize, Q: Queue<N>>(
    tx: &mut Q::Tx,
    rx: &mut Q::Rx,
    n: u64,
    batch: usize,
    pinning: Pinning,
) -> Duration {
    let (start, (end, sum)) = pair(
        pinning,
        || {
            let start = Instant::now();
            Q::send(tx, n, batch);
            start
        },
        || {
            let sum = Q::recv(rx, n, batch);
            (Instant::now(), sum)
        },
    );
    assert_eq!(sum, expected_digest(n), "{}: records lost or corrupted", Q::NAME);
    end.saturating_duration_since(start)
}

/// n round trips, timed by the ping side.
///
/// Each RTT sample also times the floor on the same two threads just before (as many
/// round trips, at least [`PAIRED_FLOOR_MIN`]), and notes `queue / floor` under
/// `group/queue`: a ratio whose two figures cannot come from different placements of the
/// vCPUs (the group's own floor is measured seconds apart, by other threads; on this VM
/// the host moved them in between, and that ratio once read 0.34×).
fn rtt_run<const N: usize, Q: Queue<N>>(
    out: &mut (CachePadded<Q::Tx>, CachePadded<Q::Rx>),
    back: &mut (CachePadded<Q::Tx>, CachePadded<Q::Rx>),
    n: u64,
    pinning: Pinning,
    key: &str,
) -> Duration {
    let (ping_tx, echo_rx) = (&mut out.0, &mut out.1);
    let (echo_tx, ping_rx) = (&mut back.0, &mut back.1);
    let line = CachePadded::new(AtomicU64::new(0));
    let floor_n = n.max(PAIRED_FLOOR_MIN);
    let ((floor_t, elapsed), ()) = pair(
        pinning,
        || {
            let start = Instant::now();
            floor::ping(&line, floor_n);
            let floor_t = start.elapsed();
            let start = Instant::now();
            Q::ping(ping_tx, ping_rx, n);
            (floor_t, start.elapsed())
        },
        || {
            floor::echo(&line, floor_n);
            Q::echo(echo_rx, echo_tx, n)
        },
    );
    let per = |t: Duration, k: u64| t.as_secs_f64() / k as f64;
    if n > 0 && floor_t > Duration::ZERO {
        let r = per(elapsed, n) / per(floor_t, floor_n);
        PAIRED.lock().unwrap_or_else(|e| e.into_inner()).entry(key.to_string()).or_default().push(r);
    }
    elapsed
}

/// The fewest floor round trips a paired floor times (criterion's first samples are a
/// handful of iterations).
const PAIRED_FLOOR_MIN: u64 = 1_000;

/// Per `group/queue`: each RTT sample's ratio to the floor timed just before it on the same
/// threads (see [`rtt_run`]).
static PAIRED: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

/// The median of the paired ratios of `group/queue`, if it ran.
fn paired_ratio(group: &str, id: &str) -> Option<f64> {
    let v = PAIRED.lock().unwrap_or_else(|e| e.into_inner()).get(&format!("{group}/{id}"))?.clone();
    (!v.is_empty()).then(|| median(v))
}

/// The floor: one atomic on its own 128-byte line, bounced n times (odd = ping, even = echo).
/// The loops are `weir_bench::floor`'s, which the latency benchmark measures with too.
fn floor_run(line: &CachePadded<AtomicU64>, n: u64, pinning: Pinning) -> Duration {
    line.store(0, Ordering::Relaxed);
    let (elapsed, ()) = pair(
        pinning,
        || {
            let start = Instant::now();
            floor::ping(line, n);
            start.elapsed()
        },
        || floor::echo(line, n),
    );
    elapsed
}

// ---------------------------------------------------------------------------------------
// Criterion groups. Names are `<group>/<queue>`; the summary reads them back.

const WORKLOADS: [(usize, usize); 4] = [(8, 1), (8, BATCH), (64, 1), (64, BATCH)];

fn workload_group(bytes: usize, batch: usize) -> String {
    let mode = if batch <= 1 { "single".to_string() } else { format!("batch{batch}") };
    format!("spsc_{bytes}B_{mode}")
}

fn rtt_group(bytes: usize) -> String {
    format!("rtt_{bytes}B")
}

/// The floor's id inside each round-trip group: measured there, first, so each RTT/floor
/// ratio compares figures taken seconds apart (on a VM the cross-core latency drifts).
const FLOOR_ID: &str = "floor";

/// CPU time of every timed throughput run (warm-up included), by `group/queue`: (records,
/// CPU seconds of the process, wall seconds, context switches of the two threads), for
/// records per CPU-second and switches per record.
static CPU_COST: Mutex<BTreeMap<String, (u64, f64, f64, u64)>> = Mutex::new(BTreeMap::new());

/// The queues measured in each group, in the order they ran.
static MEASURED: Mutex<Vec<(String, &'static str)>> = Mutex::new(Vec::new());

fn bench_throughput<const N: usize, Q: Queue<N>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    group_name: &str,
    batch: usize,
    pinning: Pinning,
) {
    // Each handle on its own 128-byte line: they live here, between the two threads that
    // use them, and their private positions must not share a line (false sharing).
    let (tx, rx) = Q::channel();
    let (mut tx, mut rx) = (CachePadded::new(tx), CachePadded::new(rx));
    note_queue::<N, Q>(group_name, &mut tx, &mut rx);
    let key = format!("{group_name}/{}", Q::NAME);
    group.bench_function(Q::NAME, |b| {
        b.iter_custom(|iters| {
            // getrusage(RUSAGE_SELF) around the run: both threads, spinning included.
            let meter = Meter::start();
            let elapsed = throughput_run::<N, Q>(&mut tx, &mut rx, iters, batch, pinning);
            let cost = meter.stop();
            let switches = LAST_SWITCHES.load(Ordering::Relaxed);
            let mut log = CPU_COST.lock().unwrap_or_else(|e| e.into_inner());
            let entry = log.entry(key.clone()).or_default();
            *entry = (entry.0 + iters, entry.1 + cost.cpu_s, entry.2 + cost.wall_s, entry.3 + switches);
            elapsed
        })
    });
}

/// Record that `Q` runs in `group`, and where its first slot sits on a cache line.
fn note_queue<const N: usize, Q: Queue<N>>(group: &str, tx: &mut Q::Tx, rx: &mut Q::Rx) {
    MEASURED.lock().unwrap_or_else(|e| e.into_inner()).push((group.to_string(), Q::NAME));
    let at = Q::probe_alignment(tx, rx);
    ALIGNMENT.lock().unwrap_or_else(|e| e.into_inner()).insert(format!("{group}/{}", Q::NAME), at);
}

/// Records per CPU-second and cores busy of `group/queue`, over all its timed runs.
fn cpu_figures(group: &str, queue: &str) -> (Option<f64>, Option<f64>) {
    let log = CPU_COST.lock().unwrap_or_else(|e| e.into_inner());
    match log.get(&format!("{group}/{queue}")) {
        Some(&(records, cpu_s, wall_s, _)) if cpu_s > 0.0 => (Some(records as f64 / cpu_s), Some(cpu_s / wall_s)),
        _ => (None, None),
    }
}

/// Context switches per 1,000 records of `group/queue`, over all its timed runs.
fn switches_per_k(group: &str, queue: &str) -> Option<f64> {
    let log = CPU_COST.lock().unwrap_or_else(|e| e.into_inner());
    log.get(&format!("{group}/{queue}")).filter(|e| e.0 > 0).map(|e| e.3 as f64 * 1000.0 / e.0 as f64)
}

fn bench_rtt<const N: usize, Q: Queue<N>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    group_name: &str,
    pinning: Pinning,
) {
    // As in bench_throughput: every handle on its own line.
    let (out_tx, out_rx) = Q::channel();
    let (back_tx, back_rx) = Q::channel();
    let mut out = (CachePadded::new(out_tx), CachePadded::new(out_rx));
    let mut back = (CachePadded::new(back_tx), CachePadded::new(back_rx));
    note_queue::<N, Q>(group_name, &mut out.0, &mut out.1);
    let key = format!("{group_name}/{}", Q::NAME);
    group
        .bench_function(Q::NAME, |b| b.iter_custom(|iters| rtt_run::<N, Q>(&mut out, &mut back, iters, pinning, &key)));
}

type ThroughputFn = fn(&mut BenchmarkGroup<'_, WallTime>, &str, usize, Pinning);
type RttFn = fn(&mut BenchmarkGroup<'_, WallTime>, &str, Pinning);

/// The queues of an 8-byte group: weir (busy-spin and park), the baselines, and the
/// control that moves weir's bytes per record (record + header = 16).
fn queues_8() -> (Vec<ThroughputFn>, Vec<RttFn>) {
    (
        vec![
            bench_throughput::<8, Weir>,
            bench_throughput::<8, WeirFrame>,
            bench_throughput::<8, WeirPark>,
            bench_throughput::<8, Rtrb<8>>,
            bench_throughput::<8, Crossbeam<8>>,
            bench_throughput::<8, RtrbOf<Wide<16>>>,
            bench_throughput::<8, WeirFrameLarge>,
            bench_throughput::<8, RtrbLarge<8>>,
        ],
        vec![
            bench_rtt::<8, Weir>,
            bench_rtt::<8, WeirFrame>,
            bench_rtt::<8, WeirPark>,
            bench_rtt::<8, Rtrb<8>>,
            bench_rtt::<8, Crossbeam<8>>,
            bench_rtt::<8, RtrbOf<Wide<16>>>,
        ],
    )
}

/// The queues of a 64-byte group: as for 8 bytes (the control moves 72), plus rtrb and
/// crossbeam with each record on its own cache line.
fn queues_64() -> (Vec<ThroughputFn>, Vec<RttFn>) {
    (
        vec![
            bench_throughput::<64, Weir>,
            bench_throughput::<64, WeirFrame>,
            bench_throughput::<64, WeirPark>,
            bench_throughput::<64, Rtrb<64>>,
            bench_throughput::<64, Crossbeam<64>>,
            bench_throughput::<64, RtrbOf<Wide<72>>>,
            bench_throughput::<64, RtrbOf<Line>>,
            bench_throughput::<64, CrossbeamOf<Line>>,
        ],
        vec![
            bench_rtt::<64, Weir>,
            bench_rtt::<64, WeirFrame>,
            bench_rtt::<64, WeirPark>,
            bench_rtt::<64, Rtrb<64>>,
            bench_rtt::<64, Crossbeam<64>>,
            bench_rtt::<64, RtrbOf<Wide<72>>>,
            bench_rtt::<64, RtrbOf<Line>>,
        ],
    )
}

/// Each group runs its queues in a different order (rotated by the group's index), so no
/// queue always runs first, on a cold machine, or last, on a warm one.
fn benches(c: &mut Criterion, pinning: Pinning) {
    for (i, (bytes, batch)) in WORKLOADS.into_iter().enumerate() {
        let name = workload_group(bytes, batch);
        let mut group = c.benchmark_group(&name);
        group.throughput(Throughput::Elements(1));
        let mut queues = if bytes == 8 { queues_8().0 } else { queues_64().0 };
        let by = i % queues.len();
        queues.rotate_left(by);
        for run in queues {
            run(&mut group, &name, batch, pinning);
        }
        group.finish();
    }
    for (i, bytes) in [8usize, 64].into_iter().enumerate() {
        let name = rtt_group(bytes);
        let mut group = c.benchmark_group(&name);
        // The floor first, in every group: each RTT/floor ratio compares figures taken
        // seconds apart.
        let line = CachePadded::new(AtomicU64::new(0));
        group.bench_function(FLOOR_ID, |b| b.iter_custom(|iters| floor_run(&line, iters, pinning)));
        let mut queues = if bytes == 8 { queues_8().1 } else { queues_64().1 };
        let by = (i + 1) % queues.len();
        queues.rotate_left(by);
        for run in queues {
            run(&mut group, &name, pinning);
        }
        group.finish();
    }
}

// ---------------------------------------------------------------------------------------
// Summary: criterion's medians of this run, as a table and as JSON.

/// Criterion's median time per iteration (ns) for `group/id` and its 95% confidence
/// interval, if this run wrote it (an older file, from a filtered run, does not count).
fn median_ns(criterion_dir: &Path, group: &str, id: &str, since: SystemTime) -> Option<(f64, [f64; 2])> {
    let path = criterion_dir.join(group).join(id).join("new").join("estimates.json");
    let fresh = std::fs::metadata(&path).and_then(|m| m.modified()).is_ok_and(|t| t >= since);
    if !fresh {
        return None;
    }
    let v: Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    let median = &v["median"];
    let ci = &median["confidence_interval"];
    Some((median["point_estimate"].as_f64()?, [ci["lower_bound"].as_f64()?, ci["upper_bound"].as_f64()?]))
}

/// This process's scheduling policy and real-time priority (fields 41 and 40 of
/// /proc/self/stat): "fifo 10" for a run under `chrt -f 10`, "normal" otherwise.
fn sched_policy() -> Option<String> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let rt_priority: u32 = fields.get(40 - 3)?.parse().ok()?;
    let policy = match fields.get(41 - 3)?.parse::<u32>().ok()? {
        0 => "normal",
        1 => "fifo",
        2 => "rr",
        3 => "batch",
        5 => "idle",
        _ => "other",
    };
    Some(if rt_priority > 0 { format!("{policy} {rt_priority}") } else { policy.to_string() })
}

fn fmt_rate(per_s: Option<f64>) -> String {
    per_s.map_or("–".into(), |r| format!("{:.1} M/s", r / 1e6))
}

fn fmt_ns(ns: Option<f64>) -> String {
    ns.map_or("–".into(), |t| format!("{t:.0} ns"))
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}x"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?)
}

struct RunInfo {
    pinning: Pinning,
    smoke: bool,
    started: SystemTime,
    load_start: Option<String>,
    steal_start: Option<u64>,
}

fn summary(criterion_dir: &Path, out_path: &Path, info: &RunInfo) {
    let get = |group: &str, id: &str| median_ns(criterion_dir, group, id, info.started).map(|(ns, _)| ns);
    // 95% confidence interval of each median, in ns per record / per round trip.
    let ci = |group: &str| -> Value {
        let by_name = |id: &str| median_ns(criterion_dir, group, id, info.started).map(|(_, ci)| ci);
        json!({
            "weir": by_name("weir"),
            "weir-frame": by_name("weir-frame"),
            "rtrb": by_name("rtrb"),
            "crossbeam": by_name("crossbeam"),
        })
    };
    let names = ["weir", "rtrb", "crossbeam", "weir-frame"];
    // Records per CPU-second (getrusage over every timed run) and cores busy, per queue.
    let cpu_json = |group: &str| -> Value {
        let mut m = serde_json::Map::new();
        for id in names {
            let (per_cpu_s, cores) = cpu_figures(group, id);
            m.insert(id.into(), json!({ "records_per_cpu_s": per_cpu_s, "cores_busy": cores }));
        }
        Value::Object(m)
    };
    let mut table = String::new();
    table.push_str(
        "| workload | weir | weir-frame | rtrb | crossbeam | weir/rtrb | weir-frame/rtrb | RTT/floor, paired (group's floor): weir, weir-frame, rtrb, crossbeam | target | met |\n",
    );
    table.push_str("|---|---|---|---|---|---|---|---|---|---|\n");

    // A filtered run (`cargo bench ... -- spsc_8B`) leaves figures missing: it prints what it
    // has but does not overwrite the JSON of a full run.
    let mut complete = true;
    let mut throughput_rows = Vec::new();
    for (bytes, batch) in WORKLOADS {
        let group = workload_group(bytes, batch);
        let rates: Vec<Option<f64>> = names.iter().map(|id| get(&group, id).map(|ns| 1e9 / ns)).collect();
        complete &= rates.iter().all(Option::is_some);
        let weir_over_rtrb = ratio(rates[0], rates[1]);
        let frame_over_rtrb = ratio(rates[3], rates[1]);
        let batched = batch > 1;
        // Batches go in frames (the engine's writer appends fixed-layout records): the
        // target is judged on the frame row.
        let met = if batched { frame_over_rtrb.map(|r| r >= 1.0) } else { None };
        let mode = if batched { format!("batches of {batch}") } else { "one at a time".into() };
        let label = format!("throughput {bytes} B, {mode}");
        table.push_str(&format!(
            "| {label} | {} | {} | {} | {} | {} | {} | | {} | {} |\n",
            fmt_rate(rates[0]),
            fmt_rate(rates[3]),
            fmt_rate(rates[1]),
            fmt_rate(rates[2]),
            fmt_ratio(weir_over_rtrb),
            fmt_ratio(frame_over_rtrb),
            if batched { "weir-frame/rtrb >= 1.0" } else { "" },
            met.map_or(String::new(), |m| if m { "yes".into() } else { "NO".into() }),
        ));
        // The large-ring pair (8-byte groups only): frames against rtrb, the same bytes.
        let large = |id: &str| get(&group, id).map(|ns| 1e9 / ns);
        let (frame_large, rtrb_large) = (large("weir-frame-large"), large("rtrb-large"));
        throughput_rows.push(json!({
            "workload": label, "criterion_group": group, "record_bytes": bytes, "batch": batch,
            "unit": "records/s",
            "weir": rates[0], "weir_frame": rates[3], "rtrb": rates[1], "crossbeam": rates[2],
            "large_rings": { "times": LARGE, "weir_frame": frame_large, "rtrb": rtrb_large,
                "weir_frame_over_rtrb": ratio(frame_large, rtrb_large) },
            "weir_over_rtrb": weir_over_rtrb,
            "weir_frame_over_rtrb": frame_over_rtrb,
            "weir_over_crossbeam": ratio(rates[0], rates[2]),
            "records_per_cpu_s": cpu_json(&group),
            "median_ci95_ns_per_record": ci(&group),
            "target": if batched { json!("weir-frame/rtrb >= 1.0") } else { Value::Null },
            "met": met,
        }));
    }

    let mut rtt_rows = Vec::new();
    let mut floors = Vec::new();
    for bytes in [8usize, 64] {
        let group = rtt_group(bytes);
        let floor = get(&group, FLOOR_ID);
        let ns: Vec<Option<f64>> = names.iter().map(|id| get(&group, id)).collect();
        complete &= floor.is_some() && ns.iter().all(Option::is_some);
        let over_floor: Vec<Option<f64>> = ns.iter().map(|t| ratio(*t, floor)).collect();
        // The paired ratio (each sample against a floor timed just before it on the same
        // threads) decides the target; the group's floor is shown beside it.
        let paired: Vec<Option<f64>> = names.iter().map(|id| paired_ratio(&group, id)).collect();
        let met = paired[0].or(over_floor[0]).map(|r| r <= 1.3);
        let both = |i: usize| format!("{} ({})", fmt_ratio(paired[i]), fmt_ratio(over_floor[i]));
        let label = format!("round trip {bytes} B");
        table.push_str(&format!(
            "| {label} | {} | {} | {} | {} | {} | {} | {} / {} / {} / {} | weir RTT/floor <= 1.3 | {} |\n",
            fmt_ns(ns[0]),
            fmt_ns(ns[3]),
            fmt_ns(ns[1]),
            fmt_ns(ns[2]),
            fmt_ratio(ratio(ns[0], ns[1])),
            fmt_ratio(ratio(ns[3], ns[1])),
            both(0),
            both(3),
            both(1),
            both(2),
            met.map_or(String::new(), |m| if m { "yes".into() } else { "NO".into() }),
        ));
        rtt_rows.push(json!({
            "workload": label, "criterion_group": group, "record_bytes": bytes, "unit": "ns per round trip",
            "weir": ns[0], "weir_frame": ns[3], "rtrb": ns[1], "crossbeam": ns[2],
            "weir_over_rtrb": ratio(ns[0], ns[1]),
            "median_ci95_ns": ci(&group),
            "floor_ns": floor,
            "floor_ci95_ns": median_ns(criterion_dir, &group, FLOOR_ID, info.started).map(|(_, ci)| ci),
            "weir_over_floor": over_floor[0], "weir_frame_over_floor": over_floor[3],
            "rtrb_over_floor": over_floor[1], "crossbeam_over_floor": over_floor[2],
            "weir_over_paired_floor": paired[0], "weir_frame_over_paired_floor": paired[3],
            "rtrb_over_paired_floor": paired[1], "crossbeam_over_paired_floor": paired[2],
            "target": "weir RTT/floor <= 1.3",
            "met": met,
        }));
        floors.push((bytes, floor));
    }
    for (bytes, floor) in floors {
        table.push_str(&format!(
            "| round-trip floor (one atomic on its own 128-byte line), taken with the {bytes} B group | {} | | | | | | 1.00x | | |\n",
            fmt_ns(floor)
        ));
    }

    // Every queue of every group, controls included: the figure, weir's figure over it,
    // records per CPU-second, context switches per 1,000 records, where its first slot sits.
    let mut controls = String::from(
        "| group | queue | figure | weir vs it | records per CPU-s | context switches per 1k records | first slot % 64 |\n|---|---|---|---|---|---|---|\n",
    );
    let mut control_rows = Vec::new();
    let measured = MEASURED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let alignment = ALIGNMENT.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (group, queue) in &measured {
        let rtt = group.starts_with("rtt_");
        let ns = get(group, queue);
        let weir = get(group, "weir");
        // Throughput: weir's rate over the queue's; round trip: the queue's time over weir's
        // (above 1 is better for weir either way).
        let weir_vs = if rtt { ratio(ns, weir) } else { ratio(weir, ns) };
        let (per_cpu_s, _) = cpu_figures(group, queue);
        let switches = switches_per_k(group, queue);
        let at = alignment.get(&format!("{group}/{queue}")).copied().flatten();
        let figure = if rtt { fmt_ns(ns) } else { fmt_rate(ns.map(|t| 1e9 / t)) };
        controls.push_str(&format!(
            "| {group} | {queue} | {figure} | {} | {} | {} | {} |\n",
            fmt_ratio(weir_vs),
            per_cpu_s.map_or("–".into(), |r| format!("{:.1} M", r / 1e6)),
            switches.map_or("–".into(), |k| format!("{k:.3}")),
            at.map_or("–".into(), |a| a.to_string()),
        ));
        control_rows.push(json!({
            "group": group, "queue": queue, "ns": ns, "weir_vs_it": weir_vs,
            "records_per_cpu_s": per_cpu_s, "context_switches_per_1k_records": switches,
            "first_slot_mod_64": at,
        }));
    }
    let steal_end = steal_ticks();
    let steal = match (info.steal_start, steal_end) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let siblings = match info.pinning {
        Pinning::Pinned { producer, consumer } => {
            json!({ "producer": smt_siblings(producer.id), "consumer": smt_siblings(consumer.id) })
        }
        Pinning::Unpinned { .. } => Value::Null,
    };

    let mode = if info.smoke { " (SMOKE MODE: tiny runs, figures are not meaningful)" } else { "" };
    println!();
    println!("## weir ring vs rtrb vs crossbeam ArrayQueue{mode}");
    println!();
    println!(
        "CPU: {}; {}; idle: busy-spin; criterion median per record / per round trip.",
        cpu_model(),
        info.pinning.describe()
    );
    println!("weir/rtrb is the ratio of the figures shown: above 1 is better for throughput, worse for round trips.");
    println!(
        "Load average at start / end: {} / {} (other work on these cores makes the figures noisy); scheduling: {}, nice {}.",
        info.load_start.as_deref().unwrap_or("?"),
        loadavg().as_deref().unwrap_or("?"),
        sched_policy().as_deref().unwrap_or("?"),
        nice().map_or("?".to_string(), |n| n.to_string()),
    );
    println!(
        "SMT siblings of the two cores: {siblings}; steal time during the run: {} ticks of the whole machine (USER_HZ, usually 100 per second).",
        steal.map_or("?".to_string(), |t| t.to_string())
    );
    println!();
    print!("{table}");
    println!();
    println!(
        "Every queue, controls included (weir-frame: weir's records appended to frames, one header per batch; weir-park: weir with the engine's default Park strategy; rtrb[u8;16]/[u8;72]: rtrb moving the bytes weir moves per record; -align64: each 64-byte record on its own cache line):"
    );
    println!();
    print!("{controls}");
    println!();

    let load_end = loadavg();
    let doc = json!({
        "bench": "ring",
        "smoke": info.smoke,
        "statistic": "criterion median of sample means (ns per iteration; records/s = 1e9 / ns)",
        "machine": {
            "cpu_model": cpu_model(),
            "cpus_available": core_affinity::get_core_ids().map_or(0, |v| v.len()),
            "loadavg_start": info.load_start,
            "loadavg_end": load_end,
            "nice": nice(),
            "sched_policy": sched_policy(),
        },
        "pinning": info.pinning.json(),
        "smt_siblings": siblings,
        "steal_ticks_during_run": steal,
        "queues": control_rows,
        "controls_markdown": controls,
        "idle_strategy": "busy-spin (core::hint::spin_loop, as weir_ring::IdleStrategy::BusySpin) on both sides of every queue, except weir-park (IdleStrategy::default(): spin, yield, park on the ring's futex)",
        "batch_records": BATCH,
        "record_bytes": [8, 64],
        "record_layout": "sequence number in the first and last 8 bytes, zeros between; the consumer sums both and the total is checked",
        "rings": {
            "8B": { "weir": <Weir as Queue<8>>::shape(), "weir-frame": <WeirFrame as Queue<8>>::shape(), "rtrb": <Rtrb<8> as Queue<8>>::shape(), "crossbeam": <Crossbeam<8> as Queue<8>>::shape(), "rtrb[u8;16]": <RtrbOf<Wide<16>> as Queue<8>>::shape() },
            "64B": { "weir": <Weir as Queue<64>>::shape(), "weir-frame": <WeirFrame as Queue<64>>::shape(), "rtrb": <Rtrb<64> as Queue<64>>::shape(), "crossbeam": <Crossbeam<64> as Queue<64>>::shape(), "rtrb[u8;72]": <RtrbOf<Wide<72>> as Queue<64>>::shape(), "rtrb-align64": <RtrbOf<Line> as Queue<64>>::shape() },
        },
        "git_revision": git(&["rev-parse", "HEAD"]),
        "git_dirty": git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
        "throughput": throughput_rows,
        "round_trip": rtt_rows,
        "table_markdown": table,
    });
    if !complete {
        println!("weir-bench: partial run (filtered?): some figures missing, {} left as it was", out_path.display());
        return;
    }
    if let Some(dir) = out_path.parent() {
        std::fs::create_dir_all(dir).expect("create the output directory");
    }
    std::fs::write(out_path, serde_json::to_string_pretty(&doc).expect("serializable") + "\n")
        .expect("write the summary JSON");
    println!("wrote {}", out_path.display());
}

fn main() {
    let smoke = std::env::var("WEIR_BENCH_SMOKE").is_ok_and(|v| !v.is_empty() && v != "0");
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    // As criterion decides: timed only under `--bench` without `--test`, `--list` or profiling.
    let timed =
        has("--bench") && !has("--test") && !has("--list") && !args.iter().any(|a| a.starts_with("--profile-time"));

    let target = target_dir();
    let criterion_dir = std::env::var_os("CRITERION_HOME").map_or_else(|| target.join("criterion"), PathBuf::from);
    let mut c = Criterion::default().output_directory(&criterion_dir);
    c = if smoke {
        c.sample_size(10)
            .warm_up_time(Duration::from_millis(10))
            .measurement_time(Duration::from_millis(30))
            .nresamples(1000)
            .without_plots()
    } else {
        c.sample_size(50).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3))
    };
    let mut c = c.configure_from_args();

    let pinning = Pinning::detect();
    if let Pinning::Unpinned { .. } = pinning {
        eprintln!("weir-bench: {}", pinning.describe());
    }
    let info =
        RunInfo { pinning, smoke, started: SystemTime::now(), load_start: loadavg(), steal_start: steal_ticks() };
    benches(&mut c, pinning);
    c.final_summary();

    if timed {
        summary(&criterion_dir, &target.join("weir-bench").join("ring.json"), &info);
    } else {
        println!("weir-bench: not a timed run (--test / --list / cargo test): no summary written");
    }
}
