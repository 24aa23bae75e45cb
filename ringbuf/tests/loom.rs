//! Loom models of the ring protocol: every interleaving of one producer thread and one
//! consumer (the main thread), on rings of 2 and 4 slots, up to a preemption bound.
//!
//! Run with (a target dir of its own, so the `--cfg loom` build does not evict the normal one):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p weir-ring --test loom --release
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS` overrides the default bound of 3 (about a second on 2 cores; 4 takes
//! seconds, 5 half a minute). `LOOM_LOCATION=1` names the source lines in a failure report.
//!
//! Under loom the ring keeps a shadow `loom::cell::UnsafeCell` per slot, written on every
//! slot write and read on every slot read. A record read before the Release store of `tail`
//! that published it (or a slot rewritten before the Release store of `head` that freed it)
//! is then a causality violation, and loom fails the model. The futex becomes a model whose
//! backstop-long sleeps never time out, so a lost wake-up is a deadlock (see `futex.rs`).

#![cfg(loom)]

use loom::thread;
use std::time::Duration;
use weir_ring::{
    Append, Batch, Claim, Consumer, IdleStrategy, Idler, Producer, Read, RecordKind, Ring, RingConfig, Stride,
};

/// A record to send: its kind and payload length.
type Spec = (RecordKind, usize);

/// How the producer commits.
#[derive(Clone, Copy, Debug)]
enum Commit {
    /// `commit`: publish every record at once.
    Now,
    /// `commit_deferred`, and `publish` after every `every` records (the rest is
    /// published by running out of credit, or by the drop that closes the ring).
    Deferred { every: usize },
}

/// How the consumer releases.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// `release`: publish `head` after every record.
    Now,
    /// `release_deferred`, publishing once `batch_slots` are pending or the ring reads empty.
    Deferred { batch_slots: u64 },
    /// `read_batch` of up to `max` records: one release publish per batch.
    Batch { max: usize },
}

/// The payload of record `seq`: distinct per record and per byte, so a torn or stale
/// read, or records out of order, cannot compare equal.
fn payload(seq: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq * 37 + i * 11 + 1) as u8).collect()
}

/// The model's bounds: a preemption bound of 3 unless `LOOM_MAX_PREEMPTIONS` says otherwise.
fn builder() -> loom::model::Builder {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder
}

/// The bounds of the models that park: at most 2 preemptions (see `park_wake_handshake`
/// for why more reports a deadlock C11 forbids).
fn park_builder() -> loom::model::Builder {
    let mut builder = builder();
    builder.preemption_bound = builder.preemption_bound.map(|bound| bound.min(2));
    builder
}

/// Run `model` in every interleaving `builder` allows, and say how many there were
/// (shown with `--nocapture`; useful when choosing a bound).
fn explore(builder: loom::model::Builder, name: &str, model: impl Fn() + Sync + Send + 'static) {
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        model();
    });
    let bound = builder.preemption_bound.map_or("none".to_string(), |b| b.to_string());
    eprintln!("{name}: {} interleavings, preemption bound {bound}", runs.load(std::sync::atomic::Ordering::Relaxed));
}

/// Where each record lands: the final `tail` (slots, padding included) and how many
/// padding records the sequence needs. Mirrors the producer's arithmetic so a test can say
/// (and check) that its sizes make the ring wrap with padding.
fn layout(config: RingConfig, records: &[Spec]) -> (u64, usize) {
    let (slot_bytes, slot_count) = (config.slot_bytes as u64, config.slot_count as u64);
    let (mut tail, mut paddings) = (0u64, 0usize);
    for &(_, len) in records {
        let slots = (8 + len as u64).div_ceil(slot_bytes);
        let to_end = slot_count - tail % slot_count;
        if slots > to_end {
            tail += to_end;
            paddings += 1;
        }
        tail += slots;
    }
    (tail, paddings)
}

/// Send every record, spinning (with a loom yield) on `NoCredit`; drop the producer at the
/// end, which publishes what is left and closes the ring.
fn send_all(mut producer: Producer, records: &[Spec], commit: Commit) {
    for (seq, &(kind, len)) in records.iter().enumerate() {
        loop {
            match producer.claim_kind(kind, len).expect("claim within max_record_bytes") {
                Claim::Granted(mut slot) => {
                    slot.copy_from_slice(&payload(seq, len));
                    match commit {
                        Commit::Now => slot.commit(),
                        Commit::Deferred { .. } => slot.commit_deferred(),
                    }
                    break;
                }
                Claim::NoCredit => thread::yield_now(),
            }
        }
        if let Commit::Deferred { every } = commit
            && (seq + 1).is_multiple_of(every)
        {
            producer.publish();
        }
    }
    drop(producer);
}

/// Read until `Closed`, spinning (with a loom yield) on `Empty`; check each record against
/// the next one expected, in order, by kind and exact bytes.
fn receive_all(consumer: &mut Consumer, records: &[Spec], release: Release) {
    if let Release::Deferred { batch_slots } = release {
        consumer.set_release_batch_slots(batch_slots);
    }
    let mut seq = 0;
    if let Release::Batch { max } = release {
        loop {
            let batch = consumer.read_batch(max, |kind, bytes| {
                let &(want_kind, len) = records.get(seq).expect("no more records than were sent");
                assert_eq!(kind, want_kind, "record {seq}: kind");
                assert_eq!(bytes, &payload(seq, len)[..], "record {seq}: payload");
                seq += 1;
                true
            });
            match batch.expect("a well-behaved producer never poisons the ring") {
                Batch::Records(k) => assert!(k >= 1 && k <= max, "a batch of {k}, asked for up to {max}"),
                Batch::Empty => thread::yield_now(),
                Batch::Closed => break,
            }
        }
    }
    loop {
        match consumer.read().expect("a well-behaved producer never poisons the ring") {
            Read::Record(view) => {
                let &(kind, len) = records.get(seq).expect("no more records than were sent");
                assert_eq!(view.kind(), kind, "record {seq}: kind");
                assert_eq!(view.payload(), &payload(seq, len)[..], "record {seq}: payload");
                match release {
                    Release::Now => view.release(),
                    Release::Deferred { .. } | Release::Batch { .. } => view.release_deferred(),
                }
                seq += 1;
            }
            Read::Empty => thread::yield_now(),
            Read::Closed => break,
        }
    }
    assert_eq!(seq, records.len(), "Closed only after every record");
    // Closed stays closed.
    assert!(matches!(consumer.read(), Ok(Read::Closed)));
}

/// One model: a producer thread sends `records`, the main thread receives them, then the
/// shared positions must account for every slot (padding included).
fn check(name: &str, config: RingConfig, records: &'static [Spec], commit: Commit, release: Release) {
    let (final_tail, paddings) = layout(config, records);
    assert!(paddings > 0, "the sizes are chosen so the ring wraps with padding");
    explore(builder(), name, move || {
        let ring = Ring::heap(config).expect("valid config");
        let (producer, mut consumer) = ring.clone().split().expect("fresh ring");
        let sender = thread::spawn(move || send_all(producer, records, commit));
        receive_all(&mut consumer, records, release);
        sender.join().expect("producer thread");
        drop(consumer);
        let status = ring.status();
        assert_eq!(status.tail, final_tail, "every record and padding published");
        assert_eq!(status.head, final_tail, "every slot released");
        assert!(status.producer_closed && status.consumer_closed);
    });
}

const KINDS: [RecordKind; 3] = [RecordKind::Data, RecordKind::Barrier, RecordKind::Watermark];

/// 2 slots of 8 bytes: a 1-slot record, then 2-slot records that pad at the wrap and take
/// the whole ring; immediate commit and release. Proves records are whole, in order and
/// published before read, and that freed slots are not rewritten before the consumer is done.
#[test]
fn two_slots_commit_release() {
    static RECORDS: [Spec; 4] = [(KINDS[0], 0), (KINDS[1], 5), (KINDS[2], 2), (KINDS[0], 1)];
    let config = RingConfig { slot_bytes: 8, slot_count: 2, max_record_bytes: 8 };
    check("two_slots_commit_release", config, &RECORDS, Commit::Now, Release::Now);
}

/// 4 slots of 8 bytes, batched: `commit_deferred` with a `publish` every 2 records,
/// `release_deferred` published once a whole ring is pending or the ring reads empty. Proves
/// one Release store of `tail` (or `head`) publishes a whole batch, and that running out of
/// credit (or of records) publishes what is pending.
#[test]
fn four_slots_deferred() {
    static RECORDS: [Spec; 4] = [(KINDS[0], 10), (KINDS[1], 0), (KINDS[2], 9), (KINDS[0], 4)];
    let config = RingConfig { slot_bytes: 8, slot_count: 4, max_record_bytes: 24 };
    check("four_slots_deferred", config, &RECORDS, Commit::Deferred { every: 2 }, Release::Deferred { batch_slots: 4 });
}

/// 4 slots of 8 bytes, the consumer taking records by `read_batch` of up to 2: each batch
/// hands out what one Acquire load of `tail` shows (padding skipped inside the batch) and
/// publishes its releases with one Release store of `head`. Proves a batch reads only
/// published bytes and the producer reuses slots only after the batch released them.
#[test]
fn four_slots_read_batch() {
    static RECORDS: [Spec; 4] = [(KINDS[0], 10), (KINDS[1], 0), (KINDS[2], 9), (KINDS[0], 4)];
    let config = RingConfig { slot_bytes: 8, slot_count: 4, max_record_bytes: 24 };
    check("four_slots_read_batch", config, &RECORDS, Commit::Deferred { every: 2 }, Release::Batch { max: 2 });
}

/// 4 slots of 16 bytes, mixed: `commit_deferred` published only by lack of credit or the
/// close, `release_deferred` with the default batch (one slot: published every release).
#[test]
fn four_slots_mixed() {
    static RECORDS: [Spec; 3] = [(KINDS[0], 20), (KINDS[1], 8), (KINDS[2], 30)];
    let config = RingConfig { slot_bytes: 16, slot_count: 4, max_record_bytes: 48 };
    check(
        "four_slots_mixed",
        config,
        &RECORDS,
        Commit::Deferred { every: usize::MAX },
        Release::Deferred { batch_slots: 1 },
    );
}

/// Park handshake, both sides: the consumer waits by `wait_for_record` and the producer by
/// `wait_for_credit`, both with `Park { spin: Duration::ZERO, yields: 0 }` (park at once), on a ring
/// that fills. Under loom a backstop park sleeps until woken, so a lost wake-up — the
/// waker missing `waiting`, and the sleeper missing the new position — is a deadlock.
///
/// Each side parks once before the threads start. A first park is short by design (the
/// peer may have read `parks == 0` just before it was set) and the model treats it as a
/// yield; the early park stands for "this side has parked before", and thread start makes
/// its `parks = 1` visible to the peer, which the protocol takes from the short first park.
///
/// The bound stays at 2 whatever `LOOM_MAX_PREEMPTIONS` says: at 3, loom reports a deadlock
/// that C11 forbids. Loom does not place an RMW in the modification order before a later
/// store it did not synchronize with (tokio-rs/loom#389, #282): after the consumer's
/// `waiting.swap(0)` reads 0, its load of `waiting` after the SeqCst fence may return its own
/// swap instead of the producer's newer `waiting = 1`, which the fence pair makes visible.
#[test]
fn park_wake_handshake() {
    static RECORDS: [Spec; 3] = [(KINDS[0], 0), (KINDS[1], 5), (KINDS[2], 3)];
    let config = RingConfig { slot_bytes: 8, slot_count: 2, max_record_bytes: 8 };
    let park = IdleStrategy::Park { spin: Duration::ZERO, yields: 0 };
    let builder = park_builder();
    explore(builder, "park_wake_handshake", move || {
        let ring = Ring::heap(config).expect("valid config");
        let (mut producer, mut consumer) = ring.clone().split().expect("fresh ring");
        // First parks: each returns at once (credit is there; the ring is empty, so the
        // consumer's is the short first sleep, a yield here).
        producer.park(0, Duration::from_secs(1));
        consumer.park(Duration::from_secs(1));
        let sender = thread::spawn(move || {
            let mut idler = Idler::new(park);
            for (seq, &(kind, len)) in RECORDS.iter().enumerate() {
                producer.wait_for_credit(len, &mut idler).expect("credit");
                match producer.claim_kind(kind, len).expect("claim") {
                    Claim::Granted(mut slot) => {
                        slot.copy_from_slice(&payload(seq, len));
                        slot.commit();
                    }
                    Claim::NoCredit => panic!("wait_for_credit returned without credit"),
                }
            }
        });
        let mut idler = Idler::new(park);
        let mut seq = 0;
        loop {
            consumer.wait_for_record(&mut idler).expect("not poisoned");
            match consumer.read().expect("not poisoned") {
                Read::Record(view) => {
                    let (kind, len) = RECORDS[seq];
                    assert_eq!((view.kind(), view.payload()), (kind, &payload(seq, len)[..]), "record {seq}");
                    view.release();
                    seq += 1;
                }
                Read::Empty => panic!("wait_for_record returned with nothing to read"),
                Read::Closed => break,
            }
        }
        assert_eq!(seq, RECORDS.len());
        sender.join().expect("producer thread");
    });
}

/// Credit by time: a producer parked because the consumer's announced limit is used up
/// (one slot in flight, limit 1; the ring itself has room) is woken when the consumer
/// raises the limit, without any release. The consumer publishes no release until it has
/// seen both records, so only the announcement's wake-up can let the second one through; a lost
/// wake-up leaves both sides asleep, which loom reports as a deadlock. Bound 2, as in
/// `park_wake_handshake` and for the same reason.
#[test]
fn raised_limit_wakes_parked_producer() {
    let config = RingConfig { slot_bytes: 8, slot_count: 4, max_record_bytes: 8 };
    let park = IdleStrategy::Park { spin: Duration::ZERO, yields: 0 };
    let builder = park_builder();
    explore(builder, "raised_limit_wakes_parked_producer", move || {
        let ring = Ring::heap(config).expect("valid config");
        let mut consumer = ring.consumer().expect("fresh ring");
        consumer.announce(1);
        let mut producer = ring.producer().expect("fresh ring");
        assert_eq!(producer.window(), 1);
        // First parks, as in `park_wake_handshake`: each returns at once.
        producer.park(0, Duration::from_secs(1));
        consumer.park(Duration::from_secs(1));
        let sender = thread::spawn(move || {
            let mut idler = Idler::new(park);
            for seq in 0..2 {
                producer.wait_for_credit(0, &mut idler).expect("credit");
                match producer.claim_kind(RecordKind::Data, 0).expect("claim") {
                    Claim::Granted(slot) => slot.commit(),
                    Claim::NoCredit => panic!("record {seq}: wait_for_credit returned without credit"),
                }
            }
        });
        consumer.set_release_batch_slots(4);
        consumer.announce(2);
        // Read each record as it comes, releasing without publishing (`head` stays 0 until
        // both are here): park while nothing new is committed.
        for seq in 0..2u64 {
            while !consumer.ready() {
                consumer.park(Duration::from_secs(1));
            }
            match consumer.read().expect("not poisoned") {
                Read::Record(view) => view.release_deferred(),
                other => panic!("record {seq}: {other:?}"),
            }
            assert_eq!(consumer.unpublished_slots(), seq + 1, "nothing released before both records are here");
        }
        consumer.publish();
        sender.join().expect("producer thread");
        assert!(matches!(consumer.read(), Ok(Read::Closed)));
    });
}

/// What the frame model's producer sends: a data record appended to a frame (fixed stride
/// or variable), or a plain control record (which closes the open frame first).
#[derive(Clone, Copy, Debug)]
enum Item {
    Fixed(usize),
    Variable(usize),
    Control(RecordKind),
}

/// Frames under every interleaving: 16 slots of 8 bytes, so a frame takes whatever credit
/// the producer sees when it opens (a lone first record when that is little) — the producer
/// runs out of credit, pads at the wrap and falls back on fresh frames. Records of frames
/// are handed out as `Data`, in order with the control records between them; a frame's
/// bytes are read only after the Release store of `tail` that published it, and its slots
/// are not rewritten before the consumer released its last record (the shadow cells).
#[test]
fn frames_publish_and_release() {
    static ITEMS: [Item; 7] = [
        Item::Fixed(8),
        Item::Fixed(8),
        Item::Control(RecordKind::Barrier),
        Item::Variable(3),
        Item::Variable(0),
        Item::Fixed(16),
        Item::Control(RecordKind::Watermark),
    ];
    let config = RingConfig { slot_bytes: 8, slot_count: 16, max_record_bytes: 16 };
    explore(builder(), "frames_publish_and_release", move || {
        let ring = Ring::heap(config).expect("valid config");
        let (mut producer, mut consumer) = ring.clone().split().expect("fresh ring");
        let sender = thread::spawn(move || {
            for (seq, item) in ITEMS.iter().enumerate() {
                loop {
                    let granted = match *item {
                        Item::Fixed(len) | Item::Variable(len) => {
                            let stride = if matches!(item, Item::Fixed(_)) { Stride::Fixed } else { Stride::Variable };
                            match producer.append(stride, len).expect("within the max") {
                                Append::Granted(mut slot) => {
                                    slot.copy_from_slice(&payload(seq, len));
                                    slot.commit();
                                    true
                                }
                                Append::NoCredit => false,
                            }
                        }
                        Item::Control(kind) => match producer.claim_kind(kind, 8).expect("within the max") {
                            Claim::Granted(mut slot) => {
                                slot.copy_from_slice(&payload(seq, 8));
                                slot.commit_deferred();
                                true
                            }
                            Claim::NoCredit => false,
                        },
                    };
                    if granted {
                        break;
                    }
                    thread::yield_now();
                }
            }
            drop(producer);
        });
        let mut seq = 0;
        loop {
            match consumer.read().expect("a well-behaved producer never poisons the ring") {
                Read::Record(view) => {
                    let (kind, len) = match ITEMS[seq] {
                        Item::Fixed(len) | Item::Variable(len) => (RecordKind::Data, len),
                        Item::Control(kind) => (kind, 8),
                    };
                    assert_eq!(view.kind(), kind, "record {seq}: kind");
                    assert_eq!(view.payload(), &payload(seq, len)[..], "record {seq}: payload");
                    view.release_deferred();
                    seq += 1;
                }
                Read::Empty => thread::yield_now(),
                Read::Closed => break,
            }
        }
        assert_eq!(seq, ITEMS.len(), "Closed only after every record");
        sender.join().expect("producer thread");
        drop(consumer);
        let status = ring.status();
        assert_eq!(status.head, status.tail, "every slot released");
    });
}
