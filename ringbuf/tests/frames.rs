//! Property test for frames: random appends (fixed stride and variable, some abandoned),
//! plain records and control records between them, publishes, reads one by one and in
//! batches, on small rings (so frames fill, wrap and, where a frame cannot fit, fall back to
//! plain records) give exactly the records a `VecDeque` model holds, in order, each as it
//! was written; a record becomes visible exactly when the model says the producer published
//! (a publish, a plain commit, or a would-block); records of a fixed frame sit on the
//! boundary their stride allows (64-byte records on a cache line).

#![cfg(not(loom))]

use proptest::prelude::*;
use std::collections::VecDeque;
use weir_ring::{Append, Batch, Claim, Read, RecordKind, Ring, RingConfig, Stride};

#[derive(Debug, Clone)]
enum Op {
    /// Append a data record of `len` bytes to the open frame; or abandon the slot.
    Append { fixed: bool, len: usize, abandon: bool },
    /// Append a fixed record of `len` bytes and grow the slot by up to `more` records (a run);
    /// or, `direct`, ask `append_run` for `more + 1` records at once; or abandon the run.
    AppendRun { len: usize, more: usize, direct: bool, abandon: bool },
    /// A plain record of `kind` (data or control), committed now or deferred.
    Send { kind: u8, len: usize, publish: bool },
    /// Publish (closes the open frame).
    Publish,
    /// Read one record; release it now, deferred, or drop the view (read again later).
    Recv { release: bool, deferred: bool },
    /// Publish deferred releases.
    PublishHead,
    /// `read_batch` of up to `max` records, the callback asking to stop after record `stop`.
    RecvBatch { max: usize, stop: usize },
    /// `read_runs` of up to `max` records, the callback asking to stop after run `stop`.
    RecvRuns { max: usize, stop: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let fixed_len = prop_oneof![Just(8usize), Just(16), Just(24), Just(32), Just(64), 0usize..70];
    prop_oneof![
        6 => (any::<bool>(), fixed_len, 0usize..70, prop::bool::weighted(0.05)).prop_map(|(fixed, f, v, abandon)| {
            Op::Append { fixed, len: if fixed { f } else { v }, abandon }
        }),
        3 => (prop_oneof![Just(8usize), Just(24), Just(64), 0usize..70], 0usize..12, any::<bool>(), prop::bool::weighted(0.05))
            .prop_map(|(len, more, direct, abandon)| Op::AppendRun { len, more, direct, abandon }),
        1 => (prop_oneof![1u8..5, Just(7u8)], 0usize..40, any::<bool>()).prop_map(|(kind, len, publish)| Op::Send { kind, len, publish }),
        1 => Just(Op::Publish),
        4 => (prop::bool::weighted(0.9), any::<bool>()).prop_map(|(release, deferred)| Op::Recv { release, deferred }),
        1 => Just(Op::PublishHead),
        2 => (0usize..12, 0usize..14).prop_map(|(max, stop)| Op::RecvBatch { max, stop }),
        2 => (0usize..20, 0usize..6).prop_map(|(max, stop)| Op::RecvRuns { max, stop }),
    ]
}

fn payload(seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq as usize * 31 + i * 7) as u8).collect()
}

/// A record of the model: kind, bytes, and the alignment its first byte must have if it
/// is read from a frame (1: none promised).
type Entry = (RecordKind, Vec<u8>, usize);

fn alignment(fixed: bool, len: usize) -> usize {
    if fixed && len > 0 { 1usize << len.trailing_zeros().min(6) } else { 1 }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Frames keep the ring a FIFO of whole records, visible exactly when published.
    #[test]
    fn frames_match_vecdeque(
        slot_shift in 3u32..7,
        count_shift in 1u32..7,
        ops in prop::collection::vec(op(), 1..400),
        drain_batched in any::<bool>(),
    ) {
        let slot_bytes = 1u32 << slot_shift;
        let slot_count = 1u32 << count_shift;
        let ring_bytes = (slot_bytes * slot_count) as usize;
        let max_record_bytes = (ring_bytes - 8).min(64) as u32;
        let config = RingConfig { slot_bytes, slot_count, max_record_bytes };
        let ring = Ring::heap(config).unwrap();
        let (mut tx, mut rx) = ring.clone().split().unwrap();
        let n = slot_count as u64;

        let mut committed: VecDeque<Entry> = VecDeque::new();
        let mut published = 0usize;
        let mut seq = 0u64;
        let check = |view_kind: RecordKind, bytes: &[u8], from_frame: bool, want: &Entry| -> Result<(), TestCaseError> {
            prop_assert_eq!(view_kind, want.0);
            prop_assert_eq!(bytes, &want.1[..]);
            if from_frame && !bytes.is_empty() {
                prop_assert_eq!(bytes.as_ptr() as usize % want.2, 0, "record of {} bytes off its boundary", bytes.len());
            }
            Ok(())
        };

        for op in ops {
            match op {
                Op::Append { fixed, len, abandon } => {
                    let stride = if fixed { Stride::Fixed } else { Stride::Variable };
                    if len > max_record_bytes as usize {
                        prop_assert!(tx.append(stride, len).is_err());
                        continue;
                    }
                    match tx.append(stride, len).unwrap() {
                        Append::Granted(mut slot) => {
                            prop_assert_eq!(slot.len(), len);
                            let bytes = payload(seq, len);
                            slot.copy_from_slice(&bytes);
                            if !abandon {
                                slot.commit();
                                committed.push_back((RecordKind::Data, bytes, alignment(fixed, len)));
                                seq += 1;
                            }
                        }
                        // Would-block closed the frame and published everything.
                        Append::NoCredit => published = committed.len(),
                    }
                }
                Op::AppendRun { len, more, direct, abandon } => {
                    if len > max_record_bytes as usize {
                        prop_assert!(tx.append_run(len, more + 1).is_err());
                        continue;
                    }
                    let granted = if direct { tx.append_run(len, more + 1) } else { tx.append(Stride::Fixed, len) };
                    match granted.unwrap() {
                        Append::Granted(mut slot) => {
                            let k = if direct { slot.records() } else { 1 + slot.grow(more) };
                            prop_assert_eq!(slot.records(), k);
                            prop_assert!((1..=more + 1).contains(&k));
                            prop_assert_eq!(slot.len(), k * len);
                            for i in 0..k {
                                let bytes = payload(seq + i as u64, len);
                                slot[i * len..(i + 1) * len].copy_from_slice(&bytes);
                                if !abandon {
                                    committed.push_back((RecordKind::Data, bytes, alignment(true, len)));
                                }
                            }
                            if !abandon {
                                seq += k as u64;
                                slot.commit();
                            }
                        }
                        Append::NoCredit => published = committed.len(),
                    }
                }
                Op::Send { kind, len, publish } => {
                    let kind = RecordKind::from_byte(kind).unwrap();
                    if len > max_record_bytes as usize {
                        continue;
                    }
                    match tx.claim_kind(kind, len).unwrap() {
                        Claim::Granted(mut w) => {
                            let bytes = payload(seq, len);
                            w.copy_from_slice(&bytes);
                            if publish { w.commit(); } else { w.commit_deferred(); }
                            committed.push_back((kind, bytes, 8));
                            seq += 1;
                            if publish { published = committed.len(); }
                        }
                        Claim::NoCredit => published = committed.len(),
                    }
                }
                Op::Publish => {
                    tx.publish();
                    published = committed.len();
                }
                Op::Recv { release, deferred } => match rx.read().unwrap() {
                    Read::Record(view) => {
                        prop_assert!(published > 0, "read a record that was not published");
                        check(view.kind(), view.payload(), view.slots() == 0, committed.front().unwrap())?;
                        if release {
                            if deferred { view.release_deferred(); } else { view.release(); }
                            committed.pop_front();
                            published -= 1;
                        }
                    }
                    Read::Empty => prop_assert_eq!(published, 0, "empty, model has published records"),
                    Read::Closed => prop_assert!(false, "closed while the producer lives"),
                },
                Op::PublishHead => rx.publish(),
                Op::RecvBatch { max, stop } => {
                    let mut seen: Vec<(RecordKind, Vec<u8>, usize)> = Vec::new();
                    let outcome = rx.read_batch(max, |kind, bytes| {
                        seen.push((kind, bytes.to_vec(), bytes.as_ptr() as usize));
                        seen.len() <= stop
                    }).unwrap();
                    let expected = max.min(published).min(stop + 1);
                    match outcome {
                        Batch::Records(k) => prop_assert_eq!(k, expected, "batch size"),
                        Batch::Empty => prop_assert!(max > 0 && published == 0, "empty, model has published records"),
                        Batch::Closed => prop_assert!(false, "closed while the producer lives"),
                    }
                    prop_assert_eq!(seen.len(), expected);
                    for (kind, bytes, _) in seen {
                        let want = committed.pop_front().expect("model has the record");
                        check(kind, &bytes, false, &want)?;
                        published -= 1;
                    }
                    prop_assert_eq!(rx.unpublished_slots(), 0);
                }
                Op::RecvRuns { max, stop } => {
                    let mut seen: Vec<(RecordKind, Vec<u8>)> = Vec::new();
                    let (mut runs, mut stopped) = (0usize, false);
                    let outcome = rx.read_runs(max, |kind, run, stride| {
                        runs += 1;
                        if stride == 0 {
                            seen.push((kind, Vec::new()));
                        } else {
                            assert_eq!(run.len() % stride, 0, "a run is whole records");
                            seen.extend(run.chunks_exact(stride).map(|r| (kind, r.to_vec())));
                        }
                        stopped = runs > stop;
                        !stopped
                    }).unwrap();
                    let available = max.min(published);
                    match outcome {
                        Batch::Records(k) => {
                            prop_assert_eq!(k, seen.len(), "records counted as handed out");
                            prop_assert!(k <= available);
                            if !stopped { prop_assert_eq!(k, available, "all there was, unless told to stop"); }
                        }
                        Batch::Empty => prop_assert!(max > 0 && published == 0, "empty, model has published records"),
                        Batch::Closed => prop_assert!(false, "closed while the producer lives"),
                    }
                    for (kind, bytes) in seen {
                        let want = committed.pop_front().expect("model has the record");
                        check(kind, &bytes, false, &want)?;
                        published -= 1;
                    }
                    prop_assert_eq!(rx.unpublished_slots(), 0);
                }
            }
            let status = ring.status();
            prop_assert!(status.tail >= status.head);
            prop_assert!(status.backlog <= n);
            prop_assert_eq!(status.credit, n - status.backlog);
            prop_assert!(status.poisoned.is_none());
        }
        // Drain: publish and close; everything committed arrives, then Closed.
        drop(tx);
        if drain_batched {
            loop {
                let mut seen = Vec::new();
                match rx.read_batch(5, |kind, bytes| {
                    seen.push((kind, bytes.to_vec()));
                    true
                }).unwrap() {
                    Batch::Records(k) => prop_assert_eq!(k, seen.len()),
                    Batch::Empty => prop_assert!(false, "empty after close"),
                    Batch::Closed => break,
                }
                for (kind, bytes) in seen {
                    let want = committed.pop_front().expect("more records than committed");
                    check(kind, &bytes, false, &want)?;
                }
            }
        }
        loop {
            match rx.read().unwrap() {
                Read::Record(view) => {
                    let want = committed.pop_front().expect("more records than committed");
                    check(view.kind(), view.payload(), view.slots() == 0, &want)?;
                    view.release_deferred();
                }
                Read::Empty => prop_assert!(false, "empty after close"),
                Read::Closed => break,
            }
        }
        prop_assert!(committed.is_empty());
        let status = ring.status();
        prop_assert_eq!(status.tail, status.head, "every slot released");
    }
}

/// A frame's 64-byte records each take exactly one cache line, 32-byte records never
/// straddle one, and 24-byte records are 8-aligned, wherever in the ring the frame starts
/// (slot sizes 8 to 64 bytes).
#[test]
fn fixed_frames_keep_records_on_their_lines() {
    for slot_bytes in [8u32, 16, 32, 64] {
        let config = RingConfig { slot_bytes, slot_count: 4096 / slot_bytes, max_record_bytes: 256 };
        let (mut tx, mut rx) = weir_ring::channel(config).unwrap();
        for round in 0..50u64 {
            for len in [64usize, 32, 24] {
                // A plain record of a varying size first, so frames start at many offsets.
                assert!(tx.push(RecordKind::Data, &vec![1; (round % 13) as usize]).unwrap());
                for i in 0..5 {
                    match tx.append(Stride::Fixed, len).unwrap() {
                        Append::Granted(mut slot) => {
                            slot.fill(i);
                            slot.commit();
                        }
                        Append::NoCredit => panic!("no credit in a drained ring"),
                    }
                }
                tx.publish();
                let (mut seen, mut all) = (0, 0);
                while let Read::Record(view) = rx.read().unwrap() {
                    all += 1;
                    if view.slots() == 0 {
                        let at = view.payload().as_ptr() as usize;
                        if len != 24 {
                            let line = |a: usize| a / 64;
                            assert_eq!(
                                line(at),
                                line(at + len - 1),
                                "{len}-byte record straddles a line (slot {slot_bytes})"
                            );
                        }
                        // The largest power of two dividing the length: 8, 32, 64.
                        let align = len & len.wrapping_neg();
                        assert_eq!(at % align, 0, "{len}-byte record off its boundary (slot {slot_bytes})");
                        seen += 1;
                    }
                    view.release();
                }
                // Near the end of the ring a frame holds what fits before the end (one
                // record alone is a plain record); the rest share a frame at slot 0.
                assert_eq!(all, 6, "the plain record and the five appended");
                assert!(seen >= 2, "{seen} of five went in a frame");
            }
        }
    }
}

/// A frame that closes with one record is written as a plain record (so a record alone in
/// a flush costs no more than before frames), with two it is a frame; both read the same.
#[test]
fn a_frame_of_one_is_a_plain_record() {
    let config = RingConfig { slot_bytes: 8, slot_count: 1024, max_record_bytes: 64 };
    let (mut tx, mut rx) = weir_ring::channel(config).unwrap();
    for (stride, n) in [(Stride::Fixed, 1), (Stride::Variable, 1), (Stride::Fixed, 2), (Stride::Variable, 2)] {
        for i in 0..n {
            match tx.append(stride, 32).unwrap() {
                Append::Granted(mut slot) => {
                    slot.fill(i as u8 + 1);
                    slot.commit();
                }
                Append::NoCredit => panic!("no credit in a drained ring"),
            }
        }
        tx.publish();
        for i in 0..n {
            match rx.read().unwrap() {
                Read::Record(view) => {
                    assert_eq!(view.kind(), RecordKind::Data);
                    assert_eq!(view.payload(), &[i as u8 + 1; 32]);
                    assert_eq!(view.slots() == 0, n > 1, "{stride:?} × {n}: in a frame only with two");
                    view.release();
                }
                other => panic!("{stride:?} × {n}: record {i} missing: {other:?}"),
            }
        }
        assert!(matches!(rx.read().unwrap(), Read::Empty));
    }
}

/// `read_runs` hands a fixed frame's records as one run (as far as `max` allows, the rest
/// in the next call), a variable frame's and a plain record's one at a time.
#[test]
fn a_fixed_frame_reads_as_one_run() {
    let config = RingConfig { slot_bytes: 8, slot_count: 1024, max_record_bytes: 64 };
    let (mut tx, mut rx) = weir_ring::channel(config).unwrap();
    let append =
        |tx: &mut weir_ring::Producer, stride: Stride, len: usize, fill: u8| match tx.append(stride, len).unwrap() {
            Append::Granted(mut slot) => {
                slot.fill(fill);
                slot.commit();
            }
            Append::NoCredit => panic!("room in an empty ring"),
        };
    for i in 0..10 {
        append(&mut tx, Stride::Fixed, 16, i);
    }
    tx.publish();
    for i in 0..3 {
        append(&mut tx, Stride::Variable, 8 + i as usize, 100 + i);
    }
    tx.publish();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut read = |max: usize, runs: &mut Vec<(usize, usize)>| {
        rx.read_runs(max, |kind, run, stride| {
            assert_eq!(kind, RecordKind::Data);
            runs.push((run.len(), stride));
            true
        })
        .unwrap()
    };
    assert_eq!(read(4, &mut runs), Batch::Records(4));
    assert_eq!(read(100, &mut runs), Batch::Records(9));
    assert_eq!(runs, [(64, 16), (96, 16), (8, 8), (9, 9), (10, 10)]);
    assert_eq!(read(100, &mut runs), Batch::Empty);
}
