//! Two-thread stress: one producer thread and one consumer thread on one in-process ring,
//! millions of records of varying size (many of them forcing padding at the wrap), every
//! record carrying its sequence number, its length and a checksum. The consumer checks
//! that each record is exactly the next one and whole. Commits and releases mix the
//! immediate and the deferred (batched) forms, or the consumer takes records by `read_batch`
//! (batches of random size, its callback sometimes stopping early), and the sides wait by
//! the park (futex), spin and yield strategies, so every wait and wake-up path runs under load.
//!
//! Nothing here asserts a run time; a watchdog aborts the test only if it stops making
//! progress (a deadlock or a lost wake-up that the 100 ms park backstop would not cure).

mod common;

use common::{STALL, Watchdog, check_record, mix, record_len, write_record};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir_ring::{Batch, Claim, IdleStrategy, Idler, Read, RecordKind, RingConfig};

/// Records in the big run: 10 million in an optimized build, 1 million in a debug build.
const RECORDS: u64 = if cfg!(debug_assertions) { 1_000_000 } else { 10_000_000 };
/// Records in the smaller runs.
const RECORDS_SMALL: u64 = if cfg!(debug_assertions) { 200_000 } else { 2_000_000 };

/// The kind of record `seq`: mostly data, some barriers and watermarks.
fn kind_for(seq: u64) -> RecordKind {
    match mix(seq ^ 0xabcd) % 16 {
        0 => RecordKind::Barrier,
        1 => RecordKind::Watermark,
        _ => RecordKind::Data,
    }
}

/// How the producer commits record `seq`.
#[derive(Clone, Copy)]
enum CommitMode {
    /// `commit`: publish at once.
    Now,
    /// `commit_deferred`: left for a later commit, publish, or a would-block to publish.
    Deferred,
    /// `commit_deferred` then `publish`: the batch ends here.
    DeferredThenPublish,
}

fn commit_mode(seq: u64) -> CommitMode {
    match (mix(seq) >> 8) % 8 {
        0..=2 => CommitMode::Now,
        3..=6 => CommitMode::Deferred,
        _ => CommitMode::DeferredThenPublish,
    }
}

/// How the consumer releases record `seq`: at once, deferred (published in batches, or when
/// the ring reads empty), or deferred then `publish`.
fn release_mode(seq: u64) -> CommitMode {
    match (mix(seq) >> 16) % 8 {
        0..=1 => CommitMode::Now,
        2..=6 => CommitMode::Deferred,
        _ => CommitMode::DeferredThenPublish,
    }
}

/// How the consumer takes records.
#[derive(Clone, Copy)]
enum Take {
    /// `read`, then a release of the form `release_mode` picks.
    Each,
    /// `read_batch` of 1 to 64 records (by the seq of the first), the callback stopping
    /// early after one record in thirty-two.
    Batches,
}

/// Run `records` records through a fresh in-process ring of `config`, the producer on its
/// own thread idling by `producer_idle`, the consumer on this thread idling by
/// `consumer_idle` and taking records as `take` says; panic on the first record out of
/// sequence or damaged.
fn run(name: &'static str, records: u64, config: RingConfig, producer_idle: IdleStrategy, consumer_idle: IdleStrategy) {
    run_taking(name, records, config, producer_idle, consumer_idle, Take::Each, false)
}

/// The credit limit the consumer announces after record `seq` (when announcing): mostly
/// tiny ones, below one record of the largest size, and some that lift the limit.
fn announcement(seq: u64, slots: u64) -> u64 {
    [1, 1, 2, 3, slots / 8, slots / 2, 0, u64::MAX][(mix(seq ^ 0x5a5a) % 8) as usize]
}

fn run_taking(
    name: &'static str,
    records: u64,
    config: RingConfig,
    producer_idle: IdleStrategy,
    consumer_idle: IdleStrategy,
    take: Take,
    announce: bool,
) {
    let (mut tx, mut rx) = weir_ring::channel(config).expect("valid config");
    let max_len = config.max_record_bytes as usize;
    let slot_bytes = config.slot_bytes as usize;
    let watchdog = Watchdog::start(name, STALL);
    let progress = watchdog.progress();
    let start = Instant::now();

    let producer = std::thread::Builder::new()
        .name(format!("{name}-producer"))
        .spawn(move || {
            let mut idler = Idler::new(producer_idle);
            for seq in 0..records {
                let len = record_len(seq, max_len, slot_bytes);
                tx.wait_for_credit(len, &mut idler).expect("ring stays healthy");
                let mode = commit_mode(seq);
                match tx.claim_kind(kind_for(seq), len).expect("ring stays healthy") {
                    Claim::Granted(mut slot) => {
                        write_record(seq, &mut slot);
                        match mode {
                            CommitMode::Now => slot.commit(),
                            CommitMode::Deferred | CommitMode::DeferredThenPublish => slot.commit_deferred(),
                        }
                    }
                    Claim::NoCredit => panic!("seq {seq}: no credit right after wait_for_credit returned"),
                }
                if let CommitMode::DeferredThenPublish = mode {
                    tx.publish();
                }
            }
            // Dropping the producer publishes the last batch and closes the ring.
        })
        .expect("spawn producer thread");

    let mut idler = Idler::new(consumer_idle);
    let mut next = 0u64;
    let slots = config.slot_count as u64;
    loop {
        if announce && next.is_multiple_of(64) {
            rx.announce(announcement(next, slots));
        }
        rx.wait_for_record(&mut idler).expect("ring stays healthy");
        if let Take::Batches = take {
            let max = 1 + (mix(next ^ 0x77) % 64) as usize;
            let first = next;
            let outcome = rx
                .read_batch(max, |kind, payload| {
                    if let Err(e) = check_record(next, payload, max_len, slot_bytes) {
                        panic!("{name}: {e}");
                    }
                    assert_eq!(kind, kind_for(next), "{name}: seq {next}: wrong kind");
                    next += 1;
                    !mix(next ^ 0x99).is_multiple_of(32)
                })
                .expect("ring stays healthy");
            match outcome {
                Batch::Records(k) => {
                    assert_eq!(k as u64, next - first, "{name}: batch count");
                    assert!(k <= max, "{name}: batch of {k} records, asked for at most {max}");
                    assert_eq!(rx.unpublished_slots(), 0, "{name}: a batch publishes its releases");
                }
                Batch::Empty => panic!("{name}: seq {next}: batch found nothing right after wait_for_record returned"),
                Batch::Closed => break,
            }
            if next / 256 != first / 256 {
                progress.store(next, Ordering::Relaxed);
            }
            continue;
        }
        match rx.read().expect("ring stays healthy") {
            Read::Record(view) => {
                if let Err(e) = check_record(next, view.payload(), max_len, slot_bytes) {
                    panic!("{name}: {e}");
                }
                assert_eq!(view.kind(), kind_for(next), "{name}: seq {next}: wrong kind");
                match release_mode(next) {
                    CommitMode::Now => view.release(),
                    CommitMode::Deferred => view.release_deferred(),
                    CommitMode::DeferredThenPublish => {
                        view.release_deferred();
                        rx.publish();
                    }
                }
                next += 1;
                if next.is_multiple_of(256) {
                    progress.store(next, Ordering::Relaxed);
                }
            }
            Read::Empty => panic!("{name}: seq {next}: read found nothing right after wait_for_record returned"),
            Read::Closed => break,
        }
    }
    producer.join().expect("producer thread");
    assert_eq!(next, records, "{name}: the ring closed after {next} of {records} records");
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "stress {name}: {records} records in {secs:.2} s = {:.2} M records/s (information, not a limit)",
        records as f64 / secs / 1e6
    );
}

/// Ten million records (one million in debug) between two threads that both wait by the
/// default strategy (spin, yield, then park on the ring's futex): every record arrives
/// exactly once, in order, whole; deferred commits and releases are all published in the
/// end; the ring closes after the last record.
#[test]
fn park_both_sides() {
    let config = RingConfig { slot_bytes: 64, slot_count: 256, max_record_bytes: 2048 };
    run("park_both_sides", RECORDS, config, IdleStrategy::default(), IdleStrategy::default());
}

/// The same on a tiny ring (64 slots of 32 bytes, records up to 16 slots, so the ring is
/// full or empty most of the time) with sides that never park: a busy-spinning producer and
/// a spin-then-yield consumer. Exactly once, in order, whole.
#[test]
fn spin_producer_yield_consumer() {
    let config = RingConfig { slot_bytes: 32, slot_count: 64, max_record_bytes: 500 };
    run(
        "spin_producer_yield_consumer",
        RECORDS_SMALL,
        config,
        IdleStrategy::BusySpin,
        IdleStrategy::SpinYield { spins: 64 },
    );
}

/// A parking producer against a consumer that spins then yields, on the tiny ring: the
/// consumer's releases must wake the parked producer (its waiter flag is the only way the
/// consumer knows to), and the producer's park must not miss a release. Exactly once, in
/// order, whole.
#[test]
fn park_producer_yield_consumer() {
    let config = RingConfig { slot_bytes: 32, slot_count: 64, max_record_bytes: 500 };
    run(
        "park_producer_yield_consumer",
        RECORDS_SMALL,
        config,
        IdleStrategy::Park { spin: Duration::from_micros(1), yields: 1 },
        IdleStrategy::SpinYield { spins: 16 },
    );
}

/// A spin-then-yield producer against a consumer that parks almost at once, on the tiny
/// ring: the producer's publishes must wake the parked consumer. Exactly once, in order,
/// whole.
#[test]
fn yield_producer_park_consumer() {
    let config = RingConfig { slot_bytes: 32, slot_count: 64, max_record_bytes: 500 };
    run(
        "yield_producer_park_consumer",
        RECORDS_SMALL,
        config,
        IdleStrategy::SpinYield { spins: 16 },
        IdleStrategy::Park { spin: Duration::from_micros(1), yields: 1 },
    );
}

/// Ten million records (one million in debug) taken by `read_batch` in batches of 1 to 64,
/// the callback sometimes ending a batch early, both sides waiting by the default strategy
/// (so the batch's one publish must wake a parked producer): every record arrives exactly
/// once, in order, whole; every batch publishes its releases; the ring closes after the last.
#[test]
fn batches_park_both_sides() {
    let config = RingConfig { slot_bytes: 64, slot_count: 256, max_record_bytes: 2048 };
    run_taking(
        "batches_park_both_sides",
        RECORDS,
        config,
        IdleStrategy::default(),
        IdleStrategy::default(),
        Take::Batches,
        false,
    );
}

/// `read_batch` on the tiny ring (64 slots of 32 bytes, records up to 16 slots, often padded
/// at the wrap) against a busy-spinning producer: batches cross padding and the end of the
/// ring and catch up with the producer mid-batch (one tail refresh). Exactly once, in order,
/// whole.
#[test]
fn batches_spin_producer_tiny_ring() {
    let config = RingConfig { slot_bytes: 32, slot_count: 64, max_record_bytes: 500 };
    run_taking(
        "batches_spin_producer_tiny_ring",
        RECORDS_SMALL,
        config,
        IdleStrategy::BusySpin,
        IdleStrategy::SpinYield { spins: 64 },
        Take::Batches,
        false,
    );
}

/// `wait_for_record` keeps its promise even when all that arrived is the padding before a
/// wrap: the next `read` is not `Empty`. (A producer out of credit publishes the padding it
/// wrote before it finds no room for the record itself.)
#[test]
fn wait_for_record_looks_past_padding() {
    // 4 slots of 64 bytes; a 1-slot record has 56 payload bytes at most, a 2-slot one 120.
    let config = RingConfig { slot_bytes: 64, slot_count: 4, max_record_bytes: 120 };
    let (mut tx, mut rx) = weir_ring::channel(config).unwrap();
    rx.set_release_batch_slots(4);
    for i in 0..3u8 {
        assert!(tx.push(RecordKind::Data, &[i; 8]).unwrap());
    }
    // Read all three, releases deferred (head stays 0 in shared memory).
    for i in 0..3u8 {
        match rx.read().unwrap() {
            Read::Record(view) => {
                assert_eq!(view.payload(), &[i; 8]);
                view.release_deferred();
            }
            other => panic!("expected record {i}, got {other:?}"),
        }
    }
    // A 2-slot record does not fit in slot 3: the producer pads slot 3 (1 credit left), then
    // finds no credit at slot 0, publishes the padding and says so.
    assert!(matches!(tx.claim(100).unwrap(), Claim::NoCredit));
    assert_eq!(rx.backlog().unwrap(), 4, "padding published");

    // The record itself comes a little later, from another thread, once the consumer's
    // releases give it room. (Should the consumer be descheduled for that long, the test
    // passes without having probed anything; it cannot fail for timing.)
    let sender = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut idler = Idler::new(IdleStrategy::default());
        tx.wait_for_credit(100, &mut idler).unwrap();
        assert!(tx.push(RecordKind::Data, &[9; 100]).unwrap());
        tx
    });
    let watchdog = Watchdog::start("wait_for_record_looks_past_padding", STALL);
    let mut idler = Idler::new(IdleStrategy::SpinYield { spins: 8 });
    rx.wait_for_record(&mut idler).unwrap();
    match rx.read().unwrap() {
        Read::Record(view) => assert_eq!(view.payload(), &[9; 100]),
        other => panic!("wait_for_record returned, then read gave {other:?}"),
    }
    drop(watchdog);
    drop(sender.join().unwrap());
}

/// Credit by time under stress: the consumer keeps changing its announced credit limit (to
/// 1, 2 or 3 slots — less than one record of the largest size — to fractions of the ring,
/// and back to none) while records of every size up to the largest flow and both sides
/// park. The producer never stalls for good (the watchdog would fire: a record larger
/// than the limit passes once the ring is drained, a raised limit wakes a parked
/// producer), and every record arrives exactly once, in order, whole.
#[test]
fn announced_limit_changes_under_load() {
    let config = RingConfig { slot_bytes: 32, slot_count: 128, max_record_bytes: 1000 };
    run_taking(
        "announced_limit_changes_under_load",
        RECORDS_SMALL,
        config,
        IdleStrategy::default(),
        IdleStrategy::default(),
        Take::Each,
        true,
    );
}
