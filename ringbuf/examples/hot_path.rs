//! The ring's hot paths, measured two ways.
//!
//! **Instructions** (`hot_path`), for a noisy machine where wall-clock figures drift: one
//! thread fills the ring with a batch of records and then drains it, so every run executes
//! exactly the same instructions. Run it under callgrind and divide the inclusive counts of
//! the `produce_*` / `consume_*` functions by the records they handled;
//! `ringbuf/examples/hot_path.sh` does all of it:
//!
//! ```text
//! ringbuf/examples/hot_path.sh
//! produce_batch_8      claim + commit_deferred, a publish per 64
//! consume_batch_8      read + release_deferred, a publish per 64
//! consume_read_batch_8 read_batch of 64
//! produce_single_8     claim + commit (publishes)
//! consume_single_8     read + release (publishes); it reads the `single` and the `lone`
//!                      workloads' records (the script divides by both)
//! produce_frame_8      append (fixed stride) ×64, then publish (closes the frame)
//! consume_frame_8      read + release_deferred of a frame's records, a publish per 64
//! consume_frame_read_batch_8  read_batch of 64 over frames
//! consume_frame_read_runs_8   read_runs of 64 over frames (a frame's records as one run)
//! produce_frame_run_8         append_run: a batch as one run, then publish
//! consume_frame_runs_typed_8  read_runs of 64, records viewed at their known size
//! produce_rtrb_8              rtrb's write_chunk_uninit of 64 (the baseline)
//! consume_rtrb_8              rtrb's read_chunk of 64 (the baseline)
//! ```
//!
//! **Time** (`hot_path threads [filter]`): the same workloads between two threads pinned to
//! cores 0 and 1, plus round trips over two rings, each run many times round robin; it
//! prints the minimum and the median ns per record (per round trip). The `rtrb chunks` rows
//! are the baseline of the batched rows, in the same run (`frame runs` is how the engine
//! moves fixed-layout records: compare those two). On a machine busy with
//! other work, `chrt -f 10` (root) keeps that work off the two cores.
//!
//! The shapes match `bench/benches/ring.rs`: 8-byte records in 4096 slots of 16 B (one slot
//! each), 64-byte records in 32768 slots of 8 B (nine slots each); batches of 64.
//! `RING_SCALE=16` makes the frame rings and rtrb's 16 times larger.

use std::hint::black_box;
use weir_ring::{Append, Batch, Claim, Consumer, Producer, Read, RingConfig, Stride};

/// Records per batch, as in the benchmark.
const BATCH: u64 = 64;
/// Batches per measured function.
const ROUNDS: u64 = 2_000;

#[inline(always)]
fn record<const N: usize>(seq: u64) -> [u8; N] {
    let mut r = [0u8; N];
    r[..8].copy_from_slice(&seq.to_le_bytes());
    r[N - 8..].copy_from_slice(&seq.to_le_bytes());
    r
}

/// First + last u64 of an `N`-byte record (a record of another length panics).
#[inline(always)]
fn digest<const N: usize>(payload: &[u8]) -> u64 {
    let payload: &[u8; N] = payload.try_into().expect("N bytes");
    let first = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
    let last = u64::from_le_bytes(payload[N - 8..].try_into().expect("8 bytes"));
    first.wrapping_add(last)
}

#[inline(always)]
fn write<const N: usize>(tx: &mut Producer, seq: u64, publish_now: bool) {
    match tx.claim(N).expect("live ring") {
        Claim::Granted(mut slot) => {
            slot.copy_from_slice(&record::<N>(seq));
            if publish_now {
                slot.commit();
            } else {
                slot.commit_deferred();
            }
        }
        Claim::NoCredit => panic!("no credit in a drained ring"),
    }
}

/// One batch: `BATCH` deferred commits, one publish.
#[inline(always)]
fn produce_batch<const N: usize>(tx: &mut Producer, seq: u64) {
    for s in seq..seq + BATCH {
        write::<N>(tx, s, false);
    }
    tx.publish();
}

/// One batch appended to a frame (fixed stride), one publish (which closes the frame).
#[inline(always)]
fn produce_frame<const N: usize>(tx: &mut Producer, seq: u64) {
    for s in seq..seq + BATCH {
        match tx.append(Stride::Fixed, N).expect("live ring") {
            Append::Granted(mut slot) => {
                slot.copy_from_slice(&record::<N>(s));
                slot.commit();
            }
            Append::NoCredit => panic!("no credit in a drained ring"),
        }
    }
    tx.publish();
}

/// `consume_batch` over frames: the same code, kept apart from it (the linker folds
/// identical functions, and callgrind would then count both under one name) by a marker
/// bit in the sum that `run_frames` strips.
#[inline(always)]
fn consume_frames<const N: usize>(rx: &mut Consumer) -> u64 {
    consume_batch::<N>(rx) ^ (1 << 63)
}

/// `consume_read_batch` over frames, kept apart the same way.
#[inline(always)]
fn consume_frames_read_batch<const N: usize>(rx: &mut Consumer) -> u64 {
    consume_read_batch::<N>(rx) ^ (1 << 62)
}

/// Add the digests of a run's records to `sum`. `TYPED`: the reader knows the records'
/// size (a typed view of fixed-layout records; a run of another stride is a broken peer),
/// else it steps by the stride the run came with.
#[inline(always)]
fn sum_run<const N: usize, const TYPED: bool>(sum: &mut u64, run: &[u8], stride: usize) {
    if TYPED {
        assert_eq!(stride, N, "a run of another stride");
    }
    for r in run.chunks_exact(if TYPED { N } else { stride }) {
        *sum = sum.wrapping_add(digest::<N>(r));
    }
}

/// One batch through `read_runs` over frames: each frame's records as one run.
#[inline(always)]
fn read_runs_sum<const N: usize, const TYPED: bool>(rx: &mut Consumer) -> u64 {
    let mut sum = 0u64;
    let got = rx.read_runs(BATCH as usize, |_, run, stride| {
        sum_run::<N, TYPED>(&mut sum, run, stride);
        true
    });
    assert_eq!(got, Ok(Batch::Records(BATCH as usize)), "records missing");
    sum
}

/// `read_runs_sum`, stepping by the run's stride (kept apart by its marker bit, as above).
#[inline(always)]
fn consume_frames_read_runs<const N: usize>(rx: &mut Consumer) -> u64 {
    read_runs_sum::<N, false>(rx) ^ (1 << 61)
}

/// `read_runs_sum`, the records viewed at their known size (a typed view).
#[inline(always)]
fn consume_frame_runs_typed<const N: usize>(rx: &mut Consumer) -> u64 {
    read_runs_sum::<N, true>(rx) ^ (1 << 60)
}

/// Append records `seq..end` as one run (`append` + `grow`), as far as the open frame has
/// room: the next sequence number, or `None` when there is no credit.
#[inline(always)]
fn append_run<const N: usize>(tx: &mut Producer, seq: u64, end: u64) -> Option<u64> {
    match tx.append_run(N, (end - seq) as usize).expect("live ring") {
        Append::Granted(mut slot) => {
            let k = slot.records();
            for (i, r) in slot.chunks_exact_mut(N).enumerate() {
                r.copy_from_slice(&record::<N>(seq + i as u64));
            }
            slot.commit();
            Some(seq + k as u64)
        }
        Append::NoCredit => None,
    }
}

/// One batch appended as runs, then published: as the engine's forward edges and the
/// benchmark's `weir-frame` write a batch.
#[inline(always)]
fn produce_frame_run<const N: usize>(tx: &mut Producer, seq: u64) {
    let (mut s, end) = (seq, seq + BATCH);
    while s < end {
        s = append_run::<N>(tx, s, end).expect("credit in a drained ring");
    }
    tx.publish();
}

/// rtrb's batch of 64, written as `produce_frame_run` writes one (the baseline).
#[inline(always)]
fn produce_rtrb<const N: usize>(tx: &mut rtrb::Producer<[u8; N]>, seq: u64) {
    let chunk = tx.write_chunk_uninit(BATCH as usize).expect("room in a drained ring");
    chunk.fill_from_iter((seq..seq + BATCH).map(record::<N>));
}

/// The digests of an rtrb chunk's records, summed; the chunk is then released.
#[inline(always)]
fn sum_chunk<const N: usize>(chunk: rtrb::chunks::ReadChunk<'_, [u8; N]>) -> u64 {
    let (a, b) = chunk.as_slices();
    let mut sum = 0u64;
    for r in a.iter().chain(b) {
        sum = sum.wrapping_add(digest::<N>(r));
    }
    chunk.commit_all();
    sum
}

/// rtrb's batch of 64, read as `consume_frame_runs_typed` reads one.
#[inline(always)]
fn consume_rtrb<const N: usize>(rx: &mut rtrb::Consumer<[u8; N]>) -> u64 {
    sum_chunk(rx.read_chunk(BATCH as usize).expect("records missing")) ^ (1 << 59)
}

/// One record appended and published at once: a frame of one (written as a plain record).
#[inline(always)]
fn produce_lone<const N: usize>(tx: &mut Producer, seq: u64) {
    match tx.append(Stride::Fixed, N).expect("live ring") {
        Append::Granted(mut slot) => {
            slot.copy_from_slice(&record::<N>(seq));
            slot.commit();
        }
        Append::NoCredit => panic!("no credit in a drained ring"),
    }
    tx.publish();
}

/// One batch through `read` / `release_deferred`, one publish.
#[inline(always)]
fn consume_batch<const N: usize>(rx: &mut Consumer) -> u64 {
    let mut sum = 0u64;
    for _ in 0..BATCH {
        match rx.read().expect("live ring") {
            Read::Record(view) => {
                sum = sum.wrapping_add(digest::<N>(view.payload()));
                view.release_deferred();
            }
            _ => panic!("record missing"),
        }
    }
    rx.publish();
    sum
}

/// One batch through `read_batch`: one tail refresh at most, one publish.
#[inline(always)]
fn consume_read_batch<const N: usize>(rx: &mut Consumer) -> u64 {
    let mut sum = 0u64;
    let got = rx.read_batch(BATCH as usize, |_, payload| {
        sum = sum.wrapping_add(digest::<N>(payload));
        true
    });
    assert_eq!(got, Ok(Batch::Records(BATCH as usize)), "records missing");
    sum
}

/// One record, committed and published at once.
#[inline(always)]
fn produce_single<const N: usize>(tx: &mut Producer, seq: u64) {
    write::<N>(tx, seq, true);
}

/// One record, read and released at once.
#[inline(always)]
fn consume_single<const N: usize>(rx: &mut Consumer) -> u64 {
    match rx.read().expect("live ring") {
        Read::Record(view) => {
            let d = digest::<N>(view.payload());
            view.release();
            d
        }
        _ => panic!("record missing"),
    }
}

// The measured functions: one per record size, so callgrind names each apart.
macro_rules! measured {
    ($($name:ident => $inner:ident::<$n:literal>($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        #[inline(never)]
        fn $name($($arg: $ty),*) -> $ret {
            $inner::<$n>($($arg),*)
        }
    )*};
}

measured! {
    produce_batch_8 => produce_batch::<8>(tx: &mut Producer, seq: u64) -> ();
    consume_batch_8 => consume_batch::<8>(rx: &mut Consumer) -> u64;
    consume_read_batch_8 => consume_read_batch::<8>(rx: &mut Consumer) -> u64;
    produce_single_8 => produce_single::<8>(tx: &mut Producer, seq: u64) -> ();
    consume_single_8 => consume_single::<8>(rx: &mut Consumer) -> u64;
    produce_batch_64 => produce_batch::<64>(tx: &mut Producer, seq: u64) -> ();
    consume_batch_64 => consume_batch::<64>(rx: &mut Consumer) -> u64;
    consume_read_batch_64 => consume_read_batch::<64>(rx: &mut Consumer) -> u64;
    produce_single_64 => produce_single::<64>(tx: &mut Producer, seq: u64) -> ();
    consume_single_64 => consume_single::<64>(rx: &mut Consumer) -> u64;
    produce_frame_8 => produce_frame::<8>(tx: &mut Producer, seq: u64) -> ();
    consume_frame_8 => consume_frames::<8>(rx: &mut Consumer) -> u64;
    consume_frame_read_batch_8 => consume_frames_read_batch::<8>(rx: &mut Consumer) -> u64;
    consume_frame_read_runs_8 => consume_frames_read_runs::<8>(rx: &mut Consumer) -> u64;
    produce_frame_64 => produce_frame::<64>(tx: &mut Producer, seq: u64) -> ();
    consume_frame_64 => consume_frames::<64>(rx: &mut Consumer) -> u64;
    consume_frame_read_batch_64 => consume_frames_read_batch::<64>(rx: &mut Consumer) -> u64;
    consume_frame_read_runs_64 => consume_frames_read_runs::<64>(rx: &mut Consumer) -> u64;
    produce_frame_run_8 => produce_frame_run::<8>(tx: &mut Producer, seq: u64) -> ();
    consume_frame_runs_typed_8 => consume_frame_runs_typed::<8>(rx: &mut Consumer) -> u64;
    produce_frame_run_64 => produce_frame_run::<64>(tx: &mut Producer, seq: u64) -> ();
    consume_frame_runs_typed_64 => consume_frame_runs_typed::<64>(rx: &mut Consumer) -> u64;
    produce_rtrb_8 => produce_rtrb::<8>(tx: &mut rtrb::Producer<[u8; 8]>, seq: u64) -> ();
    consume_rtrb_8 => consume_rtrb::<8>(rx: &mut rtrb::Consumer<[u8; 8]>) -> u64;
    produce_rtrb_64 => produce_rtrb::<64>(tx: &mut rtrb::Producer<[u8; 64]>, seq: u64) -> ();
    consume_rtrb_64 => consume_rtrb::<64>(rx: &mut rtrb::Consumer<[u8; 64]>) -> u64;
    produce_lone_8 => produce_lone::<8>(tx: &mut Producer, seq: u64) -> ();
    produce_lone_64 => produce_lone::<64>(tx: &mut Producer, seq: u64) -> ();
}

/// Frames in a ring of the baselines' bytes: 8-byte slots (a frame's records carry no
/// header of their own, so slots only round the frame).
fn frame_config<const N: usize>() -> RingConfig {
    RingConfig {
        slot_bytes: 8,
        slot_count: ring_scale() * if N <= 8 { 4096 } else { 32768 },
        max_record_bytes: N as u32,
    }
}

/// The frame workloads: batches appended and read one by one, then with `read_batch`,
/// then with `read_runs`.
fn run_frames<const N: usize>(
    produce: fn(&mut Producer, u64),
    consume: fn(&mut Consumer) -> u64,
    consume_read_batch: fn(&mut Consumer) -> u64,
    consume_read_runs: fn(&mut Consumer) -> u64,
) {
    let (mut tx, mut rx) = weir_ring::channel(frame_config::<N>()).expect("valid config");
    let mut sum = 0u64;
    let mut seq = 0;
    for _ in 0..ROUNDS {
        produce(&mut tx, seq);
        sum = sum.wrapping_add(consume(&mut rx) ^ (1 << 63));
        seq += BATCH;
    }
    for _ in 0..ROUNDS {
        produce(&mut tx, seq);
        sum = sum.wrapping_add(consume_read_batch(&mut rx) ^ (1 << 62));
        seq += BATCH;
    }
    for _ in 0..ROUNDS {
        produce(&mut tx, seq);
        sum = sum.wrapping_add(consume_read_runs(&mut rx) ^ (1 << 61));
        seq += BATCH;
    }
    black_box(sum);
    assert_eq!(sum, seq.wrapping_mul(seq.wrapping_sub(1)), "records lost or damaged");
}

/// Batches written as runs and read as typed runs, then the same through rtrb (the
/// baseline): `produce_frame_run_N` / `consume_frame_runs_typed_N` against
/// `produce_rtrb_N` / `consume_rtrb_N`, per record.
fn run_runs<const N: usize>(
    produce: fn(&mut Producer, u64),
    consume: fn(&mut Consumer) -> u64,
    produce_rtrb: fn(&mut rtrb::Producer<[u8; N]>, u64),
    consume_rtrb: fn(&mut rtrb::Consumer<[u8; N]>) -> u64,
) {
    let (mut tx, mut rx) = weir_ring::channel(frame_config::<N>()).expect("valid config");
    let mut sum = 0u64;
    let mut seq = 0;
    for _ in 0..ROUNDS {
        produce(&mut tx, seq);
        sum = sum.wrapping_add(consume(&mut rx) ^ (1 << 60));
        seq += BATCH;
    }
    let (mut rtx, mut rrx) = rtrb::RingBuffer::<[u8; N]>::new(4096);
    for _ in 0..ROUNDS {
        produce_rtrb(&mut rtx, seq);
        sum = sum.wrapping_add(consume_rtrb(&mut rrx) ^ (1 << 59));
        seq += BATCH;
    }
    black_box(sum);
    assert_eq!(sum, seq.wrapping_mul(seq.wrapping_sub(1)), "records lost or damaged");
}

/// Records appended one at a time, each published at once (frames of one), in the ring
/// `produce_single` uses.
fn run_lone<const N: usize>(produce: fn(&mut Producer, u64), consume: fn(&mut Consumer) -> u64) {
    let (mut tx, mut rx) = weir_ring::channel(config::<N>()).expect("valid config");
    let mut sum = 0u64;
    for seq in 0..ROUNDS * BATCH {
        produce(&mut tx, seq);
        sum = sum.wrapping_add(consume(&mut rx));
    }
    black_box(sum);
}

fn config<const N: usize>() -> RingConfig {
    let (slot_bytes, slot_count) = if N <= 8 { (16, 4096) } else { (8, 32768) };
    RingConfig { slot_bytes, slot_count, max_record_bytes: N as u32 }
}

/// The four measured functions for one record size.
struct Sized {
    produce_batch: fn(&mut Producer, u64),
    consume_batch: fn(&mut Consumer) -> u64,
    consume_read_batch: fn(&mut Consumer) -> u64,
    produce_single: fn(&mut Producer, u64),
    consume_single: fn(&mut Consumer) -> u64,
}

fn run<const N: usize>(f: Sized) {
    let (mut tx, mut rx) = weir_ring::channel(config::<N>()).expect("valid config");
    let mut sum = 0u64;
    let mut seq = 0;
    for _ in 0..ROUNDS {
        (f.produce_batch)(&mut tx, seq);
        sum = sum.wrapping_add((f.consume_batch)(&mut rx));
        seq += BATCH;
    }
    for _ in 0..ROUNDS {
        (f.produce_batch)(&mut tx, seq);
        sum = sum.wrapping_add((f.consume_read_batch)(&mut rx));
        seq += BATCH;
    }
    for _ in 0..ROUNDS * BATCH {
        (f.produce_single)(&mut tx, seq);
        sum = sum.wrapping_add((f.consume_single)(&mut rx));
        seq += 1;
    }
    black_box(sum);
    assert_eq!(sum, seq.wrapping_mul(seq.wrapping_sub(1)), "records lost or damaged");
    // produce_batch ran twice as often as the others (for consume_batch and consume_read_batch).
    println!("{N} B: batched {} records, single {} records", ROUNDS * BATCH, ROUNDS * BATCH);
}

// ---------------------------------------------------------------------------------------
// `hot_path threads [name filter]`: the same workloads on two pinned threads, wall clock.
// On a loaded machine the minimum over many short runs is the figure least disturbed by
// other work; `chrt -f 10 hot_path threads` (root) keeps other work off the two cores.

/// Pin the calling thread to `core` (best effort: ignored if the core is not ours).
fn pin(core: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it;
    // sched_setaffinity reads it and only changes this thread's affinity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A value alone on its 128-byte line (two, for Intel's adjacent-line prefetcher).
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Padded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// How the two threads of a timed run hand records over.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// 64 `commit_deferred` then `publish`; `read_batch` of up to 64.
    Batched,
    /// `commit` (publish at once); `read` and `release` (publish at once).
    Single,
    /// `commit`; `read` and `release_deferred` (published every quarter ring or when empty).
    SingleDeferredRelease,
    /// 64 records appended to a frame as one run (`append_run`), then `publish`;
    /// `read_batch` of up to 64; in a ring of 8-byte slots (the frame layout).
    Frames,
    /// As `Frames`, read with `read_runs` of up to 64 (a frame's records as one run).
    FrameRuns,
    /// One record appended and published at once (a frame of one, written as a plain
    /// record), as `Single` but through `append`, in the same ring.
    Lone,
}

/// The baseline of the batched rows: rtrb (`[u8; N]` items, 4096 of them, the bytes of the
/// frame rings), written with `write_chunk_uninit` of up to 64 and read with `read_chunk`
/// of up to 64, as `bench/benches/ring.rs` does; same pinning, same digest.
fn rtrb_run<const N: usize>(n: u64, _mode: Mode) -> f64 {
    let (tx, rx) = rtrb::RingBuffer::<[u8; N]>::new(4096 * ring_scale() as usize);
    let produce = move |tx: &mut rtrb::Producer<[u8; N]>| {
        let mut seq = 0;
        while seq < n {
            let want = (n - seq).min(BATCH) as usize;
            let chunk = match tx.write_chunk_uninit(want) {
                Ok(chunk) => chunk,
                Err(rtrb::chunks::ChunkError::TooFewSlots(0)) => {
                    std::hint::spin_loop();
                    continue;
                }
                Err(rtrb::chunks::ChunkError::TooFewSlots(free)) => tx.write_chunk_uninit(free).expect("free"),
            };
            let len = chunk.len() as u64;
            chunk.fill_from_iter((seq..seq + len).map(record::<N>));
            seq += len;
        }
    };
    let consume = |rx: &mut rtrb::Consumer<[u8; N]>| {
        let mut sum = 0u64;
        let mut got = 0;
        while got < n {
            let want = (n - got).min(BATCH) as usize;
            let chunk = match rx.read_chunk(want) {
                Ok(chunk) => chunk,
                Err(rtrb::chunks::ChunkError::TooFewSlots(0)) => {
                    std::hint::spin_loop();
                    continue;
                }
                Err(rtrb::chunks::ChunkError::TooFewSlots(some)) => rx.read_chunk(some).expect("published"),
            };
            got += chunk.len() as u64;
            sum = sum.wrapping_add(sum_chunk(chunk));
        }
        sum
    };
    pinned_pair(tx, rx, n, produce, consume)
}

/// ns per record of `n` records: `produce` on a thread pinned to core 0, `consume` on this
/// thread, pinned to core 1; `consume` returns the sum of the records' digests, checked.
fn pinned_pair<T: Send + 'static, R>(
    tx: T,
    rx: R,
    n: u64,
    produce: impl FnOnce(&mut T) + Send + 'static,
    consume: impl FnOnce(&mut R) -> u64,
) -> f64 {
    let (mut tx, mut rx) = (Padded(tx), Padded(rx));
    let pinned = std::sync::Arc::new(std::sync::Barrier::new(2));
    let pinned2 = pinned.clone();
    let producer = std::thread::spawn(move || {
        pin(0);
        pinned2.wait();
        let start = std::time::Instant::now();
        produce(&mut tx);
        start
    });
    pin(1);
    // Both threads pinned before either spins (a blocking wait: under SCHED_FIFO a thread
    // spinning on the core where the other waits to be pinned would keep it out for good).
    pinned.wait();
    let sum = consume(&mut rx);
    let end = std::time::Instant::now();
    let start = producer.join().expect("producer");
    assert_eq!(sum, n.wrapping_mul(n.wrapping_sub(1)), "records lost or damaged");
    (end - start).as_nanos() as f64 / n as f64
}

/// ns per record of `n` records from a producer thread (core 0) to this thread (core 1).
fn timed_run<const N: usize>(n: u64, mode: Mode) -> f64 {
    let frames = matches!(mode, Mode::Frames | Mode::FrameRuns);
    let config = if frames { frame_config::<N>() } else { config::<N>() };
    let (tx, rx) = weir_ring::channel(config).expect("valid config");
    let produce = move |tx: &mut Producer| {
        let mut seq = 0;
        let batch = if mode == Mode::Batched || frames { BATCH } else { 1 };
        while seq < n {
            let end = (seq + batch).min(n);
            while seq < end && frames {
                // The rest of the batch as one run, as far as the frame has room.
                match append_run::<N>(tx, seq, end) {
                    Some(next) => seq = next,
                    None => std::hint::spin_loop(),
                }
            }
            while seq < end && mode == Mode::Lone {
                match tx.append(Stride::Fixed, N).expect("live ring") {
                    Append::Granted(mut slot) => {
                        slot.copy_from_slice(&record::<N>(seq));
                        slot.commit();
                        seq += 1;
                    }
                    Append::NoCredit => std::hint::spin_loop(),
                }
            }
            while seq < end {
                match tx.claim(N).expect("live ring") {
                    Claim::Granted(mut slot) => {
                        slot.copy_from_slice(&record::<N>(seq));
                        if batch > 1 {
                            slot.commit_deferred();
                        } else {
                            slot.commit();
                        }
                        seq += 1;
                    }
                    Claim::NoCredit => std::hint::spin_loop(),
                }
            }
            tx.publish();
        }
    };
    let consume = |rx: &mut Consumer| {
        let mut sum = 0u64;
        let mut got = 0;
        while got < n {
            if mode == Mode::FrameRuns {
                match rx.read_runs(BATCH as usize, |_, run, stride| {
                    // Fixed-layout records: the reader knows their size (a typed view).
                    sum_run::<N, true>(&mut sum, run, stride);
                    true
                }) {
                    Ok(Batch::Records(k)) => got += k as u64,
                    Ok(Batch::Empty) => std::hint::spin_loop(),
                    other => panic!("{other:?}"),
                }
            } else if mode == Mode::Batched || mode == Mode::Frames {
                match rx.read_batch(BATCH as usize, |_, p| {
                    sum = sum.wrapping_add(digest::<N>(p));
                    true
                }) {
                    Ok(Batch::Records(k)) => got += k as u64,
                    Ok(Batch::Empty) => std::hint::spin_loop(),
                    other => panic!("{other:?}"),
                }
            } else {
                match rx.read().expect("live ring") {
                    Read::Record(view) => {
                        sum = sum.wrapping_add(digest::<N>(view.payload()));
                        if mode == Mode::Single || mode == Mode::Lone {
                            view.release();
                        } else {
                            view.release_deferred();
                        }
                        got += 1;
                    }
                    Read::Empty => std::hint::spin_loop(),
                    Read::Closed => panic!("closed"),
                }
            }
        }
        sum
    };
    pinned_pair(tx, rx, n, produce, consume)
}

/// ns per round trip of `n` round trips: one record out on one ring (core 0), echoed back
/// on a second (core 1), as the benchmark's round trip.
fn rtt_run<const N: usize>(n: u64, _mode: Mode) -> f64 {
    let (out_tx, out_rx) = weir_ring::channel(config::<N>()).expect("valid config");
    let (back_tx, back_rx) = weir_ring::channel(config::<N>()).expect("valid config");
    // Each handle on its own 128-byte line (as the benchmark's CachePadded), so that where
    // the allocator and the stack put them does not make the two threads share a line.
    let (mut out_tx, mut out_rx, mut back_tx, mut back_rx) =
        (Padded(out_tx), Padded(out_rx), Padded(back_tx), Padded(back_rx));
    let pinned = std::sync::Arc::new(std::sync::Barrier::new(2));
    let pinned2 = pinned.clone();
    let echo = std::thread::spawn(move || {
        pin(1);
        pinned2.wait();
        for _ in 0..n {
            loop {
                match out_rx.read().expect("live ring") {
                    Read::Record(view) => {
                        match back_tx.claim(N).expect("live ring") {
                            Claim::Granted(mut slot) => {
                                slot.copy_from_slice(view.payload());
                                slot.commit();
                            }
                            Claim::NoCredit => panic!("one record in flight"),
                        }
                        view.release();
                        break;
                    }
                    Read::Empty => std::hint::spin_loop(),
                    Read::Closed => panic!("closed"),
                }
            }
        }
        (out_rx, back_tx)
    });
    pin(0);
    pinned.wait();
    let start = std::time::Instant::now();
    for seq in 0..n {
        match out_tx.claim(N).expect("live ring") {
            Claim::Granted(mut slot) => {
                slot.copy_from_slice(&record::<N>(seq));
                slot.commit();
            }
            Claim::NoCredit => panic!("one record in flight"),
        }
        loop {
            match back_rx.read().expect("live ring") {
                Read::Record(view) => {
                    assert_eq!(digest::<N>(view.payload()), 2 * seq, "echo out of order");
                    view.release();
                    break;
                }
                Read::Empty => std::hint::spin_loop(),
                Read::Closed => panic!("closed"),
            }
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    drop(echo.join().expect("echo"));
    ns
}

fn threads() {
    let runs: usize = std::env::var("RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(15);
    let n: u64 = std::env::var("RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    type Run = fn(u64, Mode) -> f64;
    let workloads: [(&str, Run, Mode, u64); 16] = [
        ("8 B rtrb chunks", rtrb_run::<8>, Mode::Batched, n),
        ("64 B rtrb chunks", rtrb_run::<64>, Mode::Batched, n),
        ("8 B batched", timed_run::<8>, Mode::Batched, n),
        ("64 B batched", timed_run::<64>, Mode::Batched, n),
        ("8 B frames", timed_run::<8>, Mode::Frames, n),
        ("64 B frames", timed_run::<64>, Mode::Frames, n),
        ("8 B frame runs", timed_run::<8>, Mode::FrameRuns, n),
        ("64 B frame runs", timed_run::<64>, Mode::FrameRuns, n),
        ("8 B single", timed_run::<8>, Mode::Single, n),
        ("64 B single", timed_run::<64>, Mode::Single, n),
        ("8 B lone", timed_run::<8>, Mode::Lone, n),
        ("64 B lone", timed_run::<64>, Mode::Lone, n),
        ("8 B single, deferred release", timed_run::<8>, Mode::SingleDeferredRelease, n),
        ("64 B single, deferred release", timed_run::<64>, Mode::SingleDeferredRelease, n),
        ("8 B round trip", rtt_run::<8>, Mode::Single, n / 10),
        ("64 B round trip", rtt_run::<64>, Mode::Single, n / 10),
    ];
    // `hot_path threads round` runs only the workloads whose name contains "round".
    let only = std::env::args().nth(2).unwrap_or_default();
    let workloads: Vec<_> = workloads.into_iter().filter(|w| w.0.contains(only.as_str())).collect();
    // Round robin over the workloads, so that load from other work falls on all of them.
    let mut ns = vec![Vec::new(); workloads.len()];
    for _ in 0..runs {
        for (i, &(_, f, mode, n)) in workloads.iter().enumerate() {
            ns[i].push(f(n, mode));
        }
    }
    for ((name, ..), ns) in workloads.iter().zip(&mut ns) {
        ns.sort_by(f64::total_cmp);
        println!("{name:>30}: min {:7.2} ns, median {:7.2} ({runs} runs)", ns[0], ns[runs / 2]);
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("threads") {
        threads();
        return;
    }
    run::<8>(Sized {
        produce_batch: produce_batch_8,
        consume_batch: consume_batch_8,
        consume_read_batch: consume_read_batch_8,
        produce_single: produce_single_8,
        consume_single: consume_single_8,
    });
    run::<64>(Sized {
        produce_batch: produce_batch_64,
        consume_batch: consume_batch_64,
        consume_read_batch: consume_read_batch_64,
        produce_single: produce_single_64,
        consume_single: consume_single_64,
    });
    run_frames::<8>(produce_frame_8, consume_frame_8, consume_frame_read_batch_8, consume_frame_read_runs_8);
    run_frames::<64>(produce_frame_64, consume_frame_64, consume_frame_read_batch_64, consume_frame_read_runs_64);
    run_runs::<8>(produce_frame_run_8, consume_frame_runs_typed_8, produce_rtrb_8, consume_rtrb_8);
    run_runs::<64>(produce_frame_run_64, consume_frame_runs_typed_64, produce_rtrb_64, consume_rtrb_64);
    run_lone::<8>(produce_lone_8, consume_single_8);
    run_lone::<64>(produce_lone_64, consume_single_64);
}

/// `RING_SCALE=k`: the frame rings and rtrb's ring in `threads` mode hold k times as many
/// bytes (a power of two; 1 by default).
fn ring_scale() -> u32 {
    std::env::var("RING_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}
