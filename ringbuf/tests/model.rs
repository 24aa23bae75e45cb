//! Property test: random claim/commit/publish/read/release/read_batch sequences, with random
//! record sizes and kinds on small rings (so padding at the wrap happens often), give exactly
//! the records a `VecDeque` model holds, in order; claims succeed exactly when the model says
//! the published head leaves enough free slots; a batch read hands out exactly
//! `min(max, published, where its callback stops)` records and publishes their release.

use proptest::prelude::*;
use std::collections::VecDeque;
use weir_ring::{Batch, Claim, Read, RecordKind, Ring, RingConfig};

#[derive(Debug, Clone)]
enum Op {
    /// Claim `len` bytes; commit now (true) or deferred (false); or abandon the claim.
    Send { len: usize, kind: u8, publish: bool, abandon: bool },
    /// Publish deferred commits.
    PublishTail,
    /// Read one record and release it (now or deferred), or read and drop the view.
    Recv { release: bool, deferred: bool },
    /// Publish deferred releases.
    PublishHead,
    /// `read_batch` of up to `max` records, the callback asking to stop after record `stop`.
    RecvBatch { max: usize, stop: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..80, prop_oneof![1u8..5, Just(7u8)], any::<bool>(), prop::bool::weighted(0.1))
            .prop_map(|(len, kind, publish, abandon)| Op::Send { len, kind, publish, abandon }),
        1 => Just(Op::PublishTail),
        4 => (prop::bool::weighted(0.9), any::<bool>()).prop_map(|(release, deferred)| Op::Recv { release, deferred }),
        1 => Just(Op::PublishHead),
        2 => (0usize..8, 0usize..10).prop_map(|(max, stop)| Op::RecvBatch { max, stop }),
    ]
}

fn payload(seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq as usize * 31 + i * 7) as u8).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The ring behaves as a FIFO of whole records, and its credit is exact.
    #[test]
    fn ring_matches_vecdeque(
        slot_shift in 3u32..6,
        count_shift in 1u32..5,
        ops in prop::collection::vec(op(), 1..300),
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
        let slots_for = |len: usize| (8 + len as u64).div_ceil(slot_bytes as u64);

        // The model: records committed, how many of them are published; our own tail position.
        let mut committed: VecDeque<(RecordKind, Vec<u8>)> = VecDeque::new();
        let mut published = 0usize;
        let mut tail = 0u64;
        let mut seq = 0u64;

        for op in ops {
            match op {
                Op::Send { len, kind, publish, abandon } => {
                    let kind = RecordKind::from_byte(kind).unwrap();
                    let head = ring.status().head;
                    if len > max_record_bytes as usize {
                        prop_assert!(tx.claim_kind(kind, len).is_err());
                        continue;
                    }
                    // Expected outcome, from the model's tail and the ring's published head.
                    let slots = slots_for(len);
                    let mut t = tail;
                    let idx = t % n;
                    let mut ok = true;
                    if slots > n - idx {
                        if n - (t - head) >= n - idx { t += n - idx; } else { ok = false; }
                    }
                    ok = ok && n - (t - head) >= slots;
                    let unpublished = committed.len() - published;
                    match tx.claim_kind(kind, len).unwrap() {
                        Claim::Granted(mut w) => {
                            prop_assert!(ok, "granted, model says no credit");
                            prop_assert_eq!(w.len(), len);
                            let bytes = payload(seq, len);
                            w.copy_from_slice(&bytes);
                            if abandon {
                                let _abandoned = w;
                                tail = t; // padding stays committed
                            } else {
                                if publish { w.commit(); } else { w.commit_deferred(); }
                                committed.push_back((kind, bytes));
                                seq += 1;
                                tail = t + slots;
                                if publish { published = committed.len(); }
                            }
                        }
                        Claim::NoCredit => {
                            prop_assert!(!ok, "no credit, model says granted");
                            // Would-block publishes what was committed.
                            if unpublished > 0 || t != tail { published = committed.len(); }
                            tail = t.max(tail);
                        }
                    }
                }
                Op::PublishTail => {
                    tx.publish();
                    published = committed.len();
                }
                Op::Recv { release, deferred } => {
                    match rx.read().unwrap() {
                        Read::Record(view) => {
                            prop_assert!(published > 0, "read a record that was not published");
                            let (kind, bytes) = committed.front().unwrap();
                            prop_assert_eq!(view.kind(), *kind);
                            prop_assert_eq!(view.payload(), &bytes[..]);
                            if release {
                                if deferred { view.release_deferred(); } else { view.release(); }
                                committed.pop_front();
                                published -= 1;
                            }
                        }
                        Read::Empty => prop_assert_eq!(published, 0, "empty, model has published records"),
                        Read::Closed => prop_assert!(false, "closed while the producer lives"),
                    }
                }
                Op::PublishHead => rx.publish(),
                Op::RecvBatch { max, stop } => {
                    let mut seen: Vec<(RecordKind, Vec<u8>)> = Vec::new();
                    let outcome = rx.read_batch(max, |kind, payload| {
                        seen.push((kind, payload.to_vec()));
                        seen.len() <= stop
                    }).unwrap();
                    let expected = max.min(published).min(stop + 1);
                    match outcome {
                        Batch::Records(k) => {
                            prop_assert_eq!(k, expected, "batch size");
                            prop_assert!(max == 0 || published > 0, "records from an empty ring");
                        }
                        Batch::Empty => prop_assert!(max > 0 && published == 0, "empty, model has published records"),
                        Batch::Closed => prop_assert!(false, "closed while the producer lives"),
                    }
                    prop_assert_eq!(seen.len(), expected);
                    for (kind, bytes) in seen {
                        let (want_kind, want_bytes) = committed.pop_front().expect("model has the record");
                        prop_assert_eq!(kind, want_kind);
                        prop_assert_eq!(bytes, want_bytes);
                        published -= 1;
                    }
                    // The batch published its releases (and any deferred before it).
                    let status = ring.status();
                    prop_assert_eq!(rx.unpublished_slots(), 0);
                    prop_assert_eq!(status.tail - status.head, status.backlog);
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
                match rx.read_batch(3, |kind, payload| {
                    seen.push((kind, payload.to_vec()));
                    true
                }).unwrap() {
                    Batch::Records(k) => prop_assert_eq!(k, seen.len()),
                    Batch::Empty => prop_assert!(false, "empty after close"),
                    Batch::Closed => break,
                }
                for (kind, bytes) in seen {
                    let (want_kind, want_bytes) = committed.pop_front().expect("more records than committed");
                    prop_assert_eq!(kind, want_kind);
                    prop_assert_eq!(bytes, want_bytes);
                }
            }
        }
        loop {
            match rx.read().unwrap() {
                Read::Record(view) => {
                    let (kind, bytes) = committed.pop_front().expect("more records than committed");
                    prop_assert_eq!(view.kind(), kind);
                    prop_assert_eq!(view.payload(), &bytes[..]);
                    view.release_deferred();
                }
                Read::Empty => prop_assert!(false, "empty after close"),
                Read::Closed => break,
            }
        }
        prop_assert!(committed.is_empty());
    }
}
