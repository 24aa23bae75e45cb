//! A peer that breaks the protocol, or memory that gets corrupted, cannot make a side
//! misbehave: every position and record header read from shared memory is checked, a
//! violation poisons the ring with its reason, both sides then get `RingError::Poisoned`
//! (the consumer at once, the producer at the latest when it runs out of credit), and
//! nothing panics, reads out of bounds or loops forever.
//!
//! The "peer" here is this test writing into the ring file with `pwrite` while both role
//! handles map it (`MAP_SHARED`, so the ring sees each write at once). Offsets are those
//! of `weir_ring::layout`: tail at 128, head at 256, slots from 768; a record header is
//! `len: u32 LE`, `kind: u8` at +4, its lap tag in the 3 bytes after. Reads go by the
//! headers (a committed one carries its lap's tag); `tail` is checked where it is read:
//! `backlog`, and a new handle.

mod common;

use common::{TempDir, XorShift};
use std::fs::File;
use std::os::unix::fs::FileExt;
use weir_ring::layout::{HEADER_BYTES, header_word};
use weir_ring::{
    Append, AttachError, ClaimError, Consumer, PoisonReason, Producer, Read, RecordKind, Ring, RingConfig, RingError,
    Stride,
};

/// 16 slots of 64 bytes; records up to 512 bytes (8 slots).
const CONFIG: RingConfig = RingConfig { slot_bytes: 64, slot_count: 16, max_record_bytes: 512 };
const SLOTS: u64 = CONFIG.slot_count as u64;
const TAIL_AT: u64 = 128;
const HEAD_AT: u64 = 256;
/// The consumer's announced credit limit, beside `head`.
const ANNOUNCED_AT: u64 = 264;

/// Offset of slot `index`'s first byte (its record header) in the file.
fn slot_at(index: u64) -> u64 {
    HEADER_BYTES as u64 + index * CONFIG.slot_bytes as u64
}

/// A ring file with both roles taken, and the file opened again for scribbling.
struct Rig {
    _dir: TempDir,
    ring: Ring,
    file: File,
    tx: Producer,
    rx: Consumer,
}

impl Rig {
    fn new(tag: &str) -> Rig {
        let dir = TempDir::new(tag);
        let path = dir.join("ring");
        let ring = Ring::create(&path, CONFIG).unwrap();
        let (tx, rx) = (ring.producer().unwrap(), ring.consumer().unwrap());
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        Rig { _dir: dir, ring, file, tx, rx }
    }

    fn poke_u64(&self, offset: u64, value: u64) {
        self.file.write_all_at(&value.to_le_bytes(), offset).unwrap();
    }

    fn poke_u32(&self, offset: u64, value: u32) {
        self.file.write_all_at(&value.to_le_bytes(), offset).unwrap();
    }

    fn poke_u8(&self, offset: u64, value: u8) {
        self.file.write_all_at(&[value], offset).unwrap();
    }

    /// Send `n` records of `len` bytes, each published at once.
    fn send(&mut self, n: usize, len: usize) {
        for i in 0..n {
            assert!(self.tx.push(RecordKind::Data, &vec![i as u8; len]).unwrap(), "no credit for record {i}");
        }
    }

    /// Send 1-slot records until the producer says NoCredit.
    fn fill(&mut self) {
        for _ in 0..SLOTS {
            assert!(self.tx.push(RecordKind::Data, &[1; 8]).unwrap());
        }
        assert!(!self.tx.push(RecordKind::Data, &[1; 8]).unwrap(), "a full ring granted credit");
    }

    /// Read and release `n` records.
    fn take(&mut self, n: usize) {
        for i in 0..n {
            match self.rx.read().unwrap() {
                Read::Record(view) => view.release(),
                other => panic!("record {i}: got {other:?}"),
            }
        }
    }

    /// The poison the ring header shows.
    fn poison(&self) -> (PoisonReason, u64) {
        match self.ring.status().poisoned {
            Some(RingError::Poisoned { reason, detail }) => (reason, detail),
            other => panic!("ring not poisoned: {other:?}"),
        }
    }

    /// The consumer's next read fails with the ring's poison.
    fn read_fails(&mut self, reason: PoisonReason, detail: u64) {
        match self.rx.read() {
            Err(RingError::Poisoned { reason: r, detail: d }) => assert_eq!((r, d), (reason, detail)),
            other => panic!("expected Poisoned {{ {reason:?}, {detail} }}, read gave {other:?}"),
        }
        assert_eq!(self.poison(), (reason, detail), "status shows another poison");
    }

    /// The consumer reads at most a ring of leftover records, then gets the poison
    /// (never `Empty`, never `Closed`).
    fn consumer_sees_poison(&mut self) -> RingError {
        for _ in 0..=SLOTS {
            match self.rx.read() {
                Ok(Read::Record(view)) => view.release(),
                Ok(other) => panic!("poisoned ring: consumer read {other:?}"),
                Err(e) => return e,
            }
        }
        panic!("consumer of a poisoned ring read more than a ring of records");
    }

    /// The producer sends at most a ring of records on its remaining credit, then gets the
    /// poison (never `NoCredit` forever).
    fn producer_sees_poison(&mut self) -> RingError {
        for _ in 0..=SLOTS {
            match self.tx.push(RecordKind::Data, &[2; 8]) {
                Ok(true) => {}
                Ok(false) => panic!("poisoned ring: producer got NoCredit instead of the poison"),
                Err(ClaimError::Ring(e)) => return e,
                Err(e) => panic!("{e:?}"),
            }
        }
        panic!("producer of a poisoned ring sent more than a ring of records");
    }
}

/// A fresh ring (header just written, slots all zero) reads `Empty`, again and again, and
/// grants its whole credit.
#[test]
fn fresh_ring_reads_empty() {
    let mut rig = Rig::new("fresh");
    for _ in 0..3 {
        assert!(matches!(rig.rx.read().unwrap(), Read::Empty));
    }
    assert_eq!(rig.rx.backlog().unwrap(), 0);
    assert_eq!(rig.tx.credit(), SLOTS);
    assert!(rig.ring.status().poisoned.is_none());
}

/// `tail` set more than a ring ahead of `head`: reads do not go by it, so the consumer reads
/// what the headers commit; its `backlog` fails with `TailOutOfRange` (the bad tail as
/// detail), the header shows it, reads then fail after the leftovers, and the producer, out
/// of credit, gets the same poison from `claim` and `wait_for_credit` instead of waiting.
#[test]
fn tail_beyond_a_ring_ahead() {
    let mut rig = Rig::new("tailfar");
    rig.fill();
    rig.poke_u64(TAIL_AT, SLOTS + 1);
    let poisoned = RingError::Poisoned { reason: PoisonReason::TailOutOfRange, detail: SLOTS + 1 };
    assert_eq!(rig.rx.backlog().unwrap_err(), poisoned);
    assert_eq!(rig.poison(), (PoisonReason::TailOutOfRange, SLOTS + 1));
    match rig.tx.claim(8) {
        Err(ClaimError::Ring(e)) => assert_eq!(e, poisoned),
        other => panic!("producer out of credit on a poisoned ring: {other:?}"),
    }
    let mut idler = weir_ring::Idler::new(weir_ring::IdleStrategy::default());
    assert_eq!(rig.tx.wait_for_credit(8, &mut idler).unwrap_err(), ClaimError::Ring(poisoned.clone()));
    assert_eq!(rig.consumer_sees_poison(), poisoned);
}

/// `tail` moved backwards (below what the consumer already saw): reads do not go by it (Empty
/// as before); `backlog` fails with `TailOutOfRange`; the producer gets the poison once its
/// credit is spent.
#[test]
fn tail_backwards() {
    let mut rig = Rig::new("tailback");
    rig.send(3, 8);
    rig.take(3);
    assert!(matches!(rig.rx.read().unwrap(), Read::Empty));
    assert_eq!(rig.rx.backlog().unwrap(), 0);
    rig.poke_u64(TAIL_AT, 1);
    assert!(matches!(rig.rx.read().unwrap(), Read::Empty));
    assert_eq!(rig.rx.backlog().unwrap_err(), RingError::Poisoned { reason: PoisonReason::TailOutOfRange, detail: 1 });
    assert_eq!(rig.poison(), (PoisonReason::TailOutOfRange, 1));
    let e = rig.producer_sees_poison();
    assert_eq!(e, RingError::Poisoned { reason: PoisonReason::TailOutOfRange, detail: 1 });
}

/// A committed record header whose kind byte no kind has (9, or 0): `BadKind` with the byte
/// as detail. A `tail` published over slots never written is not a record: `Empty`.
#[test]
fn unknown_kind() {
    let mut rig = Rig::new("kind");
    rig.send(1, 8);
    rig.poke_u8(slot_at(0) + 4, 9);
    rig.read_fails(PoisonReason::BadKind, 9);
    rig.producer_sees_poison();

    // The peer publishes a tail over slots it never wrote; then a header of this lap with
    // kind 0.
    let mut rig = Rig::new("kindzero");
    rig.poke_u64(TAIL_AT, 2);
    assert!(matches!(rig.rx.read().unwrap(), Read::Empty));
    rig.poke_u64(slot_at(0), header_word(0, 8, 0, SLOTS.trailing_zeros()));
    rig.read_fails(PoisonReason::BadKind, 0);
}

/// A record length above the ring's max record size (513, and u32::MAX): `BadLength` with
/// the length as detail; nothing past the ring is read.
#[test]
fn length_above_max() {
    for len in [CONFIG.max_record_bytes + 1, u32::MAX] {
        let mut rig = Rig::new("lenmax");
        rig.send(2, 8);
        rig.poke_u32(slot_at(0), len);
        rig.read_fails(PoisonReason::BadLength, len as u64);
        rig.producer_sees_poison();
    }
}

/// A record length within the max whose slots run past the end of the ring (a record in
/// the last slot claiming 2 slots): `BadLength`.
#[test]
fn length_past_ring_end() {
    // Records at slots 15, 0 and 1: three slots published, but the one at 15 is the last.
    let mut rig = Rig::new("lenend");
    rig.send(15, 8);
    rig.take(15);
    rig.send(3, 8);
    rig.poke_u32(slot_at(15), 100);
    rig.read_fails(PoisonReason::BadLength, 100);
    rig.producer_sees_poison();
}

/// A padding record whose length does not reach exactly to the end of the ring (too
/// short, too long), or padding in slot 0 (which no record needs): `BadPadding` with the
/// length as detail. Untouched, the same padding is skipped and the
/// record after it read.
#[test]
fn bad_padding() {
    // 14 one-slot records read and released, then a 3-slot record: padding over slots 14
    // and 15 (length 2 * 64 - 8 = 120), the record at slot 0.
    let setup = |tag: &str| {
        let mut rig = Rig::new(tag);
        rig.send(14, 8);
        rig.take(14);
        rig.send(1, 150);
        rig
    };
    let mut rig = setup("padok");
    match rig.rx.read().unwrap() {
        Read::Record(view) => assert_eq!(view.payload(), &[0; 150]),
        other => panic!("untouched padding: got {other:?}"),
    }
    for len in [56, 184] {
        let mut rig = setup("padlen");
        rig.poke_u32(slot_at(14), len);
        rig.read_fails(PoisonReason::BadPadding, len as u64);
        rig.producer_sees_poison();
    }

    let mut rig = Rig::new("pad0");
    rig.send(1, 8);
    rig.poke_u32(slot_at(0), (SLOTS * 64 - 8) as u32);
    rig.poke_u8(slot_at(0) + 4, RecordKind::Padding as u8);
    rig.read_fails(PoisonReason::BadPadding, SLOTS * 64 - 8);
}

/// `head` moved past `tail`, or backwards: the producer's next look at `head` (when out of
/// credit) fails with `HeadOutOfRange`, the bad head as detail; the consumer reads what
/// was published and then gets the poison.
#[test]
fn head_out_of_range() {
    let mut rig = Rig::new("headfar");
    rig.fill();
    rig.poke_u64(HEAD_AT, SLOTS + 1);
    let poisoned = RingError::Poisoned { reason: PoisonReason::HeadOutOfRange, detail: SLOTS + 1 };
    match rig.tx.claim(8) {
        Err(ClaimError::Ring(e)) => assert_eq!(e, poisoned),
        other => panic!("expected HeadOutOfRange, claim gave {other:?}"),
    }
    assert_eq!(rig.poison(), (PoisonReason::HeadOutOfRange, SLOTS + 1));
    assert_eq!(rig.consumer_sees_poison(), poisoned);

    let mut rig = Rig::new("headback");
    rig.fill();
    rig.take(4);
    assert!(rig.tx.push(RecordKind::Data, &[3; 8]).unwrap(), "4 slots released: credit");
    rig.poke_u64(HEAD_AT, 2);
    for _ in 0..3 {
        assert!(rig.tx.push(RecordKind::Data, &[3; 8]).unwrap());
    }
    match rig.tx.claim(8) {
        Err(ClaimError::Ring(RingError::Poisoned { reason: PoisonReason::HeadOutOfRange, detail: 2 })) => {}
        other => panic!("expected HeadOutOfRange, claim gave {other:?}"),
    }
}

/// Taking a role on a ring whose positions a peer has already broken (head past tail, or
/// tail more than a ring ahead of head) is refused with the poison, naming the bad
/// position, instead of building a handle whose credit arithmetic would overflow; the role
/// stays free.
#[test]
fn role_refused_on_broken_positions() {
    let dir = TempDir::new("takeover");
    let cases = [
        ("headpast", 0u64, 5u64, PoisonReason::HeadOutOfRange, 5u64),
        ("tailfar", SLOTS + 3, 1, PoisonReason::TailOutOfRange, SLOTS + 3),
    ];
    for (name, tail, head, reason, detail) in cases {
        let path = dir.join(name);
        let ring = Ring::create(&path, CONFIG).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&tail.to_le_bytes(), TAIL_AT).unwrap();
        file.write_all_at(&head.to_le_bytes(), HEAD_AT).unwrap();
        let poisoned = RingError::Poisoned { reason, detail };
        match ring.producer() {
            Err(AttachError::Ring(e)) => assert_eq!(e, poisoned, "{name}"),
            other => panic!("{name}: producer() on broken positions: {other:?}"),
        }
        match ring.consumer() {
            Err(e @ AttachError::Ring(_)) => assert!(e.to_string().contains(&format!("{reason:?}")), "{name}: {e}"),
            other => panic!("{name}: consumer() on broken positions: {other:?}"),
        }
        let status = ring.status();
        assert_eq!(status.poisoned, Some(poisoned), "{name}");
        assert!(status.producer.is_none() && status.consumer.is_none(), "{name}: a refused role stays taken");
    }
}

/// A producer that died after committing records and before storing `tail` after them: the
/// consumer reads them all the same (its `head` then passes the stored `tail`), and a
/// producer that takes the role over goes on after them — past the stored `tail`, which it
/// stores — so nothing is read twice or lost, and the ring is not poisoned.
#[test]
fn producer_died_before_storing_tail() {
    let dir = TempDir::new("diedtail");
    let path = dir.join("ring");
    let ring = Ring::create(&path, CONFIG).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut rx = ring.consumer().unwrap();
    let mut tx = ring.producer().unwrap();
    // 10 one-slot records, then 3 more in one batch whose `tail` the dead producer never
    // stored (the test puts the old value back, as if it had died before the store).
    for seq in 0..10u8 {
        assert!(tx.push(RecordKind::Data, &[seq; 8]).unwrap());
    }
    for seq in 10..13u8 {
        match tx.claim(8).unwrap() {
            weir_ring::Claim::Granted(mut slot) => {
                slot.copy_from_slice(&[seq; 8]);
                slot.commit_deferred();
            }
            weir_ring::Claim::NoCredit => panic!("credit"),
        }
    }
    tx.detach();
    file.write_all_at(&10u64.to_le_bytes(), TAIL_AT).unwrap();
    let read = |rx: &mut Consumer, n: u8, from: u8| {
        for seq in from..from + n {
            match rx.read().unwrap() {
                Read::Record(view) => {
                    assert_eq!(view.payload(), &[seq; 8], "record {seq}");
                    view.release();
                }
                other => panic!("record {seq}: {other:?}"),
            }
        }
        assert!(matches!(rx.read().unwrap(), Read::Empty), "nothing after record {}", from + n - 1);
    };
    read(&mut rx, 13, 0);
    assert_eq!(ring.status().head, 13, "head passed the stored tail");
    assert_eq!(ring.status().tail, 10);
    // A successor takes over, and again after the consumer read only some of the records.
    let mut tx = ring.producer().expect("takeover with head past the stored tail");
    assert_eq!(ring.status().tail, 13, "the successor stores where the committed records end");
    for seq in 13..20u8 {
        assert!(tx.push(RecordKind::Data, &[seq; 8]).unwrap());
    }
    read(&mut rx, 7, 13);
    assert!(ring.status().poisoned.is_none());
    // And with records committed past the stored tail that the consumer has not read yet.
    for seq in 20..25u8 {
        assert!(tx.push(RecordKind::Data, &[seq; 8]).unwrap());
    }
    tx.detach();
    file.write_all_at(&21u64.to_le_bytes(), TAIL_AT).unwrap();
    let mut tx = ring.producer().expect("takeover");
    assert_eq!(ring.status().tail, 25);
    assert!(tx.push(RecordKind::Data, &[25; 8]).unwrap());
    read(&mut rx, 6, 20);
    assert!(ring.status().poisoned.is_none());
}

/// Seeded random scribbles — positions nudged or replaced, record headers overwritten,
/// random words in the slots — at random moments of ordinary traffic: over 500 rings,
/// no panic, no endless loop; whenever a side reports an error it is the poison the
/// header shows; records that are handed out fit the max record size.
#[test]
fn random_scribbles_never_panic() {
    let dir = TempDir::new("scribble");
    let mut rng = XorShift::new(0xbad_5eed);
    let mut poisoned_rings = 0;
    for round in 0..500 {
        let path = dir.join(&format!("ring{round}"));
        let ring = Ring::create(&path, CONFIG).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let (mut tx, mut rx) = (ring.producer().unwrap(), ring.consumer().unwrap());
        let mut poisoned = None::<RingError>;
        for step in 0..200 {
            match rng.below(10) {
                0..=3 => {
                    let len = rng.below(CONFIG.max_record_bytes as u64 + 1) as usize;
                    let bytes = vec![step as u8; len];
                    match tx.push(RecordKind::Data, &bytes) {
                        Ok(_) => {}
                        Err(ClaimError::Ring(e)) => poisoned = Some(e),
                        Err(e) => panic!("round {round}: {e:?}"),
                    }
                }
                4..=7 => match rx.read() {
                    Ok(Read::Record(view)) => {
                        assert!(view.len() <= CONFIG.max_record_bytes as usize, "round {round}: oversized record");
                        if rng.below(2) == 0 { view.release() } else { view.release_deferred() }
                    }
                    Ok(_) => {}
                    Err(e) => poisoned = Some(e),
                },
                8 => {
                    if rng.below(2) == 0 {
                        tx.publish()
                    } else {
                        rx.publish()
                    }
                }
                _ => {
                    // The scribble: 1 in 10 steps.
                    let status = ring.status();
                    let (offset, value): (u64, Vec<u8>) = match rng.below(7) {
                        6 => (
                            ANNOUNCED_AT,
                            [0, 1, 2, SLOTS - 1, SLOTS, SLOTS + 1, u64::MAX][rng.below(7) as usize]
                                .to_le_bytes()
                                .to_vec(),
                        ),
                        0 => (TAIL_AT, (status.tail as i64 + rng.below(40) as i64 - 20).max(0).to_le_bytes().to_vec()),
                        1 => (HEAD_AT, (status.head as i64 + rng.below(40) as i64 - 20).max(0).to_le_bytes().to_vec()),
                        2 => (if rng.below(2) == 0 { TAIL_AT } else { HEAD_AT }, rng.next_u64().to_le_bytes().to_vec()),
                        3 => {
                            // A plausible-looking header: small length, kind 0..=6.
                            let len = rng.below(1200) as u32;
                            let kind = rng.below(7) as u8;
                            let mut h = len.to_le_bytes().to_vec();
                            h.push(kind);
                            (slot_at(rng.below(SLOTS)), h)
                        }
                        4 => (slot_at(rng.below(SLOTS)) + 4, vec![rng.below(256) as u8]),
                        _ => (slot_at(0) + rng.below(SLOTS * 64 - 8), rng.next_u64().to_le_bytes().to_vec()),
                    };
                    file.write_all_at(&value, offset).unwrap();
                }
            }
            if let Some(e) = &poisoned {
                assert_eq!(ring.status().poisoned.as_ref(), Some(e), "round {round}: error is not the header's poison");
                poisoned_rings += 1;
                break;
            }
        }
    }
    eprintln!("random_scribbles_never_panic: {poisoned_rings} of 500 rings ended poisoned, none panicked");
}

/// Whatever a peer writes as its announced credit limit, the producer neither trusts it past
/// the ring nor stops for good: 0 and anything above the ring are the whole ring; 1 still
/// lets a record of any size through once the ring is drained. Nothing poisons.
#[test]
fn announced_limit_is_clamped() {
    for (announced, window) in [(0, SLOTS), (SLOTS + 1, SLOTS), (u64::MAX, SLOTS), (1u64 << 63, SLOTS)] {
        let mut rig = Rig::new("announce-huge");
        rig.poke_u64(ANNOUNCED_AT, announced);
        // The producer reads it with `head`, when its cached credit runs out.
        rig.fill();
        assert_eq!(rig.tx.window(), window, "announced {announced}");
        assert_eq!(rig.ring.status().announced, window);
        rig.take(SLOTS as usize);
        assert!(rig.ring.status().poisoned.is_none());
    }
    // 1: one record in flight at a time, the largest one included.
    // The producer reads a new value with `head`, when its cached credit runs out: after
    // this ring's worth it has.
    let mut rig = Rig::new("announce-one");
    rig.poke_u64(ANNOUNCED_AT, 1);
    rig.fill();
    rig.take(SLOTS as usize);
    rig.send(1, 8);
    assert!(!rig.tx.push(RecordKind::Data, &[3; 8]).unwrap(), "a second record while one is in flight");
    assert_eq!(rig.tx.window(), 1);
    rig.take(1);
    let max = CONFIG.max_record_bytes as usize;
    assert!(rig.tx.push(RecordKind::Data, &vec![4; max]).unwrap(), "the largest record passes an empty ring");
    assert!(!rig.tx.push(RecordKind::Data, &[5; 8]).unwrap());
    match rig.rx.read().unwrap() {
        Read::Record(view) => {
            assert_eq!(view.len(), max);
            view.release();
        }
        other => panic!("{other:?}"),
    }
    // A peer flipping the value between claims: every claim still respects the free slots.
    for (i, v) in [3u64, 0, 1, u64::MAX, 2, SLOTS].into_iter().enumerate() {
        rig.poke_u64(ANNOUNCED_AT, v);
        let mut sent = 0;
        while rig.tx.push(RecordKind::Data, &[i as u8; 8]).unwrap() {
            sent += 1;
            assert!(sent <= SLOTS, "more records than slots");
        }
        assert!(sent >= 1, "announced {v}: no record passed an empty ring");
        rig.take(sent as usize);
    }
    assert!(rig.ring.status().poisoned.is_none());
}

/// A peer that rewrites a variable frame's end-offset table after the consumer checked it
/// (one record read) cannot make it hand out bytes outside the frame: the next record's end
/// is checked again as it is used, and the ring is poisoned with `BadFrame`. A frame whose
/// headers (frame and record) the peer rewrites after the consumer opened it changes
/// nothing (the consumer keeps its own copy): every record comes out as written.
#[test]
fn frame_rewritten_after_its_check() {
    let mut rig = Rig::new("frame-table");
    for i in 0..3u8 {
        match rig.tx.append(Stride::Variable, 10).unwrap() {
            Append::Granted(mut slot) => {
                slot.fill(i);
                slot.commit();
            }
            Append::NoCredit => panic!("no credit in an empty ring"),
        }
    }
    rig.tx.publish();
    match rig.rx.read().unwrap() {
        Read::Record(view) => {
            assert_eq!(view.payload(), &[0; 10]);
            view.release();
        }
        other => panic!("expected the first record, got {other:?}"),
    }
    // The frame at slot 0: record header, frame header (8), data from payload offset 8,
    // 30 bytes, then the table of three u32 end offsets: the second at payload offset 42.
    let payload_at = slot_at(0) + 8;
    rig.poke_u32(payload_at + 8 + 30 + 4, 1000);
    match rig.rx.read() {
        Err(RingError::Poisoned { reason: PoisonReason::BadFrame, .. }) => {}
        other => panic!("expected BadFrame, got {other:?}"),
    }
    assert_eq!(rig.poison().0, PoisonReason::BadFrame);

    let mut rig = Rig::new("frame-header");
    for i in 0..3u8 {
        match rig.tx.append(Stride::Fixed, 16).unwrap() {
            Append::Granted(mut slot) => {
                slot.fill(i);
                slot.commit();
            }
            Append::NoCredit => panic!("no credit in an empty ring"),
        }
    }
    rig.tx.publish();
    let mut got = Vec::new();
    match rig.rx.read().unwrap() {
        Read::Record(view) => {
            got.push(view.payload().to_vec());
            view.release();
        }
        other => panic!("expected the first record, got {other:?}"),
    }
    // Count 1000, stride 1: would describe bytes far past the frame; and the record
    // header made a plain data record of 4 bytes.
    rig.poke_u64(slot_at(0) + 8, 1000 | 1 << 32 | 8 << 48);
    rig.poke_u64(slot_at(0), 4 | 1 << 32);
    while let Read::Record(view) = rig.rx.read().unwrap() {
        got.push(view.payload().to_vec());
        view.release();
    }
    assert_eq!(got, (0..3u8).map(|i| vec![i; 16]).collect::<Vec<_>>());
}

/// Issue #47: a peer writes random bytes over the slot after the last record and moves the
/// published `tail` one slot forward, committing nothing. The consumer reads the records
/// before it, then — within a bounded number of empty reads, or at once before it would
/// park — poisons the ring (`Uncommitted`, the read position as detail) instead of waiting
/// for ever on a header nothing will commit; the producer then gets the same poison.
#[test]
fn tail_moved_past_garbage_poisons() {
    for park in [false, true] {
        let mut rig = Rig::new(if park { "uncommitted-park" } else { "uncommitted-spin" });
        rig.send(2, 8);
        rig.file.write_all_at(&[0xa5; 64], slot_at(2)).unwrap();
        rig.poke_u64(TAIL_AT, 3);
        rig.take(2);
        if park {
            // Before a sleep the consumer looks: no sleep, and the next read fails.
            assert!(rig.rx.prepare_park().is_none(), "the consumer would sleep on a lie");
            rig.rx.end_park();
            rig.read_fails(PoisonReason::Uncommitted, 2);
        } else {
            let mut empties = 0;
            let e = loop {
                match rig.rx.read() {
                    Ok(Read::Empty) => empties += 1,
                    Ok(other) => panic!("read {other:?}"),
                    Err(e) => break e,
                }
                assert!(empties <= 1000, "still Empty after {empties} reads: not detected");
            };
            assert_eq!(e, RingError::Poisoned { reason: PoisonReason::Uncommitted, detail: 2 });
        }
        assert_eq!(rig.poison(), (PoisonReason::Uncommitted, 2));
        assert!(matches!(rig.producer_sees_poison(), RingError::Poisoned { reason: PoisonReason::Uncommitted, .. }));
    }
}

/// Issue #47: a peer writes garbage over the whole 768-byte header of a ring in use — its
/// state word with the `closed` bit among it. Neither side believes any of it: the consumer
/// reads what was committed, then gets `HeaderChanged` (never `Closed`, which an ipc source
/// would take for the end of its stream); the producer, once it has no credit, the same
/// (never "the consumer closed", never a pid out of the garbage).
#[test]
fn garbage_over_the_header_poisons_not_closes() {
    let mut rig = Rig::new("header-garbage");
    rig.send(3, 8);
    let mut rng = XorShift::new(47);
    let mut garbage = vec![0u8; HEADER_BYTES as usize];
    for chunk in garbage.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    // Every state bit set: closed by both sides and poisoned, as far as the garbage says.
    garbage[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
    rig.file.write_all_at(&garbage, 0).unwrap();
    let magic = u64::from_le_bytes(garbage[..8].try_into().unwrap());
    let mut read = 0;
    let e = loop {
        match rig.rx.read() {
            Ok(Read::Record(view)) => {
                view.release();
                read += 1;
            }
            Ok(other) => panic!("a header of garbage read as {other:?}"),
            Err(e) => break e,
        }
        assert!(read <= 3, "more records than were sent");
    };
    assert_eq!(e, RingError::Poisoned { reason: PoisonReason::HeaderChanged, detail: magic });
    assert!(matches!(rig.producer_sees_poison(), RingError::Poisoned { reason: PoisonReason::HeaderChanged, .. }));
}
