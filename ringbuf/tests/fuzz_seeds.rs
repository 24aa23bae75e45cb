//! The fuzz target's function (`weir_ring::fuzzing::check_image`) on handmade ring images:
//! valid rings give back exactly the records written into them, each corruption is refused
//! at attach or poisons the ring on read with the reason that names it, and no image —
//! every single-bit flip of a valid one, random slots under a valid header, random bytes —
//! makes it panic or loop. The same images seed the fuzzer (see `ringbuf/fuzz/README.md`).

#![cfg(not(loom))]

use std::mem::offset_of;
use weir_ring::fuzzing::{End, Outcome, check_image, check_image_runs, check_image_scribbled};
use weir_ring::layout::{HEADER_BYTES, Liveness, MAGIC, POISONED, PRODUCER_CLOSED, RingHeader, VERSION, header_word};
use weir_ring::{AttachError, PoisonReason, RecordKind, Ring, RingConfig, RingError};

/// A ring image built byte by byte, as a ring file holds it, with a producer's bookkeeping
/// so records land where the real producer would put them (padding at the wrap included).
#[derive(Clone)]
struct Image {
    bytes: Vec<u8>,
    slot_bytes: u64,
    slot_count: u64,
    tail: u64,
}

impl Image {
    /// A fresh, valid ring: header written, positions at `start` (as after `start` slots of
    /// earlier traffic, all released).
    fn new(slot_bytes: u32, slot_count: u32, max_record_bytes: u32, start: u64) -> Image {
        let len = HEADER_BYTES as usize + (slot_bytes * slot_count) as usize;
        let mut image =
            Image { bytes: vec![0; len], slot_bytes: slot_bytes as u64, slot_count: slot_count as u64, tail: start };
        image.put_u64(offset_of!(RingHeader, magic), MAGIC);
        image.put_u32(offset_of!(RingHeader, version), VERSION);
        image.put_u32(offset_of!(RingHeader, header_bytes), HEADER_BYTES);
        image.put_u32(offset_of!(RingHeader, slot_bytes), slot_bytes);
        image.put_u32(offset_of!(RingHeader, slot_count), slot_count);
        image.put_u32(offset_of!(RingHeader, max_record_bytes), max_record_bytes);
        image.set_tail(start);
        image.set_head(start);
        image
    }

    fn put_u32(&mut self, offset: usize, value: u32) {
        self.bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
    }

    fn put_u64(&mut self, offset: usize, value: u64) {
        self.bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    }

    fn set_tail(&mut self, tail: u64) {
        self.put_u64(offset_of!(RingHeader, tail), tail);
    }

    fn set_head(&mut self, head: u64) {
        self.put_u64(offset_of!(RingHeader, head), head);
    }

    fn set_state(&mut self, state: u32) {
        self.put_u32(offset_of!(RingHeader, state), state);
    }

    /// Write a record header (and payload) at `position` (slot `position % slot_count`,
    /// with that position's lap tag: committed), as raw as a peer could.
    fn put_record(&mut self, position: u64, kind: u8, len: u32, payload: &[u8]) {
        let index = position % self.slot_count;
        let at = HEADER_BYTES as usize + (index * self.slot_bytes) as usize;
        let word = header_word(kind, len, position, self.slot_count.trailing_zeros());
        self.bytes[at..at + 8].copy_from_slice(&word.to_le_bytes());
        self.bytes[at + 8..at + 8 + payload.len()].copy_from_slice(payload);
    }

    /// Append a record the way the producer does, and publish it.
    fn send(&mut self, kind: RecordKind, payload: &[u8]) -> &mut Image {
        let slots = (8 + payload.len() as u64).div_ceil(self.slot_bytes);
        let index = self.tail % self.slot_count;
        let to_end = self.slot_count - index;
        if slots > to_end {
            let padding = (to_end * self.slot_bytes) as u32 - 8;
            self.put_record(self.tail, RecordKind::Padding as u8, padding, &[]);
            self.tail += to_end;
        }
        self.put_record(self.tail, kind as u8, payload.len() as u32, payload);
        self.tail += slots;
        self.set_tail(self.tail);
        self
    }
}

/// How the handmade frames below lay out their records.
enum Shape {
    /// Every record `stride` bytes long, the first at payload offset `start`.
    Fixed { stride: u16, start: u16 },
    /// Records of the given lengths, the first at `start`, then the end-offset table.
    Variable { start: u16 },
}

impl Image {
    /// Append a frame of `records` the way the producer lays one out, and publish it.
    fn send_frame(&mut self, shape: Shape, records: &[Vec<u8>]) -> &mut Image {
        let (stride, start) = match shape {
            Shape::Fixed { stride, start } => (stride, start),
            Shape::Variable { start } => (0, start),
        };
        let mut body = vec![0u8; start as usize];
        let word = records.len() as u64 | (stride as u64) << 32 | (start as u64) << 48;
        body[..8].copy_from_slice(&word.to_le_bytes());
        let mut ends = Vec::new();
        for r in records {
            body.extend_from_slice(r);
            ends.push((body.len() - start as usize) as u32);
        }
        if stride == 0 {
            for end in ends {
                body.extend_from_slice(&end.to_le_bytes());
            }
        }
        self.send_raw(RecordKind::Frame as u8, &body)
    }

    /// Append a record of any kind byte with `body` as its payload, and publish it.
    fn send_raw(&mut self, kind: u8, body: &[u8]) -> &mut Image {
        let slots = (8 + body.len() as u64).div_ceil(self.slot_bytes);
        let index = self.tail % self.slot_count;
        assert!(slots <= self.slot_count - index, "the test's frames do not wrap");
        self.put_record(self.tail, kind, body.len() as u32, body);
        self.tail += slots;
        self.set_tail(self.tail);
        self
    }
}

fn payload(seq: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seq.wrapping_mul(31).wrapping_add(i as u8)).collect()
}

/// The records and end of a check that attached; panics with the outcome otherwise.
fn read(image: &[u8]) -> (Vec<(RecordKind, Vec<u8>)>, End) {
    match check_image(image) {
        Outcome::Read { records, end } => (records, end),
        Outcome::Refused(e) => panic!("image refused: {e}"),
    }
}

fn refused(image: &[u8]) -> AttachError {
    match check_image(image) {
        Outcome::Refused(e) => e,
        Outcome::Read { records, end } => panic!("image attached: {} records, then {end:?}", records.len()),
    }
}

fn poisoned(image: &[u8]) -> PoisonReason {
    match read(image).1 {
        End::Failed(RingError::Poisoned { reason, .. }) => reason,
        end => panic!("expected a poison, got {end:?}"),
    }
}

/// 4 slots of 16 bytes, records up to 48 bytes, with two records published.
fn two_records() -> Image {
    let mut image = Image::new(16, 4, 48, 0);
    image.send(RecordKind::Data, &payload(1, 20)).send(RecordKind::Barrier, &payload(2, 0));
    image
}

/// Every named seed image: the valid ones and the corrupt ones below.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut wrapped = Image::new(16, 4, 48, 2);
    wrapped.send(RecordKind::Data, &payload(1, 8)).send(RecordKind::Watermark, &payload(2, 20));
    wrapped.set_state(PRODUCER_CLOSED);
    let mut bad_kind = Image::new(16, 4, 48, 0);
    bad_kind.put_record(0, 9, 4, &[]);
    bad_kind.set_tail(1);
    vec![
        ("two_records", two_records().bytes),
        ("frames", frames().bytes),
        ("wrapped_closed", wrapped.bytes),
        ("bad_kind", bad_kind.bytes),
        ("empty_2x8", Image::new(8, 2, 8, 0).bytes),
        ("tail_past_nothing", {
            let mut i = two_records();
            i.set_tail(4);
            i.bytes
        }),
    ]
}

/// 8 slots of 64 bytes, records up to 64 bytes: a fixed frame of three 64-byte records on
/// their cache lines (start 56: slot 0's payload is at byte 8 of the slot area), a
/// variable frame of three records (one empty), and a plain record after them.
fn frames() -> Image {
    let mut image = Image::new(64, 8, 64, 0);
    let fixed: Vec<Vec<u8>> = (0..3).map(|i| payload(i, 64)).collect();
    let variable = vec![payload(3, 5), vec![], payload(4, 17)];
    image
        .send_frame(Shape::Fixed { stride: 64, start: 56 }, &fixed)
        .send_frame(Shape::Variable { start: 8 }, &variable)
        .send(RecordKind::Watermark, &payload(5, 8));
    image
}

/// Frames read as their records, one by one, each as `Data`, in order.
#[test]
fn frames_read_as_records() {
    let (records, end) = read(&frames().bytes);
    let data = |seq, len| (RecordKind::Data, payload(seq, len));
    assert_eq!(
        records,
        vec![
            data(0, 64),
            data(1, 64),
            data(2, 64),
            data(3, 5),
            (RecordKind::Data, vec![]),
            data(4, 17),
            (RecordKind::Watermark, payload(5, 8)),
        ]
    );
    assert_eq!(end, End::Empty);
}

/// The real producer lays frames out as the handmade image does: `append` with a fixed
/// stride, then a variable one (closing the first frame), then a control record (closing
/// the second) give the same slot bytes.
#[test]
fn real_frames_match_the_handmade_image() {
    let dir = std::env::temp_dir().join(format!("weir-fuzz-frames-{}", std::process::id()));
    let path = dir.join("ring");
    let ring = Ring::create(&path, RingConfig { slot_bytes: 64, slot_count: 8, max_record_bytes: 64 }).unwrap();
    let mut producer = ring.producer().unwrap();
    let mut append = |stride, bytes: &[u8]| match producer.append(stride, bytes.len()).unwrap() {
        weir_ring::Append::Granted(mut slot) => {
            slot.copy_from_slice(bytes);
            slot.commit();
        }
        weir_ring::Append::NoCredit => panic!("no credit in an empty ring"),
    };
    for i in 0..3 {
        append(weir_ring::Stride::Fixed, &payload(i, 64));
    }
    for bytes in [payload(3, 5), vec![], payload(4, 17)] {
        append(weir_ring::Stride::Variable, &bytes);
    }
    assert!(producer.push(RecordKind::Watermark, &payload(5, 8)).unwrap());
    drop(producer);
    let bytes = std::fs::read(&path).unwrap();
    drop(ring);
    std::fs::remove_dir_all(&dir).unwrap();
    let handmade = frames().bytes;
    let slots = HEADER_BYTES as usize..;
    assert_eq!(bytes[slots.clone()], handmade[slots], "same slot bytes as the handmade image");
}

/// Each frame that does not describe its bytes poisons the ring with `BadFrame` before any
/// of its records is handed out; the records before it are read.
#[test]
fn corrupt_frames_poison() {
    let check = |what: &str, body: &[u8]| {
        let mut image = Image::new(64, 8, 64, 0);
        image.send(RecordKind::Data, &payload(9, 3)).send_raw(RecordKind::Frame as u8, body);
        let (records, end) = read(&image.bytes);
        assert_eq!(records, vec![(RecordKind::Data, payload(9, 3))], "{what}: only the record before it");
        match end {
            End::Failed(RingError::Poisoned { reason: PoisonReason::BadFrame, .. }) => {}
            end => panic!("{what}: expected BadFrame, got {end:?}"),
        }
    };
    let header = |count: u32, stride: u16, start: u16, extra: usize| {
        let mut body = vec![0u8; 8 + extra];
        let word = count as u64 | (stride as u64) << 32 | (start as u64) << 48;
        body[..8].copy_from_slice(&word.to_le_bytes());
        body
    };
    let frame = 6u8;
    check("no records", &header(0, 8, 8, 8));
    check("shorter than a frame header", &[1, 0, 0]);
    check("a stride that does not fill it", &header(3, 8, 8, 20));
    check("count × stride past the end", &header(u32::MAX, 0xffff, 8, 16));
    check("a stride over the max record", &header(1, 65, 8, 65));
    check("start inside the header", &header(1, 8, 4, 12));
    check("start not 8-aligned", &header(1, 4, 12, 8));
    check("start past 64", &header(1, 8, 72, 72));
    check("start past the end", &header(1, 8, 64, 8));
    let variable = |ends: &[u32], data: usize| {
        let mut body = header(ends.len() as u32, 0, 8, data);
        for e in ends {
            body.extend_from_slice(&e.to_le_bytes());
        }
        body
    };
    check("a table longer than the frame", &header(5, 0, 8, 12));
    check("end offsets out of order", &variable(&[6, 4, 10], 10));
    check("an end offset past the data", &variable(&[4, 12], 10));
    check("the last end short of the table", &variable(&[4, 8], 10));
    check("a record over the max", &variable(&[65, 66], 66));
    // The valid shapes next to those, so the checks above fail for the reason they name.
    let mut image = Image::new(64, 8, 64, 0);
    image.send_raw(frame, &variable(&[6, 6, 10], 10));
    assert_eq!(read(&image.bytes).0.len(), 3);
    let mut image = Image::new(64, 8, 64, 0);
    image.send_raw(frame, &header(3, 4, 8, 12));
    assert_eq!(read(&image.bytes).0.len(), 3);
}

/// What is readable is what the headers commit, not the stored `tail`: records committed past
/// it (a producer that died before it stored `tail`) are read; a header with the lap tag of
/// the lap before, or a zeroed word, is not a record, whatever `tail` says — and a `tail`
/// published past it is a lie (the producer stores `tail` after the headers): the consumer
/// poisons the ring (`Uncommitted`, its read position as detail) before it would wait on it.
#[test]
fn headers_say_what_is_committed() {
    let mut image = two_records();
    image.set_tail(0);
    let (records, end) = read(&image.bytes);
    assert_eq!(records, vec![(RecordKind::Data, payload(1, 20)), (RecordKind::Barrier, vec![])]);
    assert_eq!(end, End::Empty);
    let uncommitted = End::Failed(RingError::Poisoned { reason: PoisonReason::Uncommitted, detail: 4 });
    // Lap 1 starts at position 4: slot 0 still holds lap 0's record.
    let mut image = Image::new(16, 4, 48, 4);
    image.put_record(0, RecordKind::Data as u8, 4, &[1, 2, 3, 4]);
    image.set_tail(5);
    assert_eq!(read(&image.bytes), (vec![], uncommitted.clone()), "lap 0's header at lap 1's position");
    let mut image = Image::new(16, 4, 48, 4);
    image.set_tail(5);
    assert_eq!(read(&image.bytes), (vec![], uncommitted), "a zeroed word, tail past it");
}

/// Issue #47: a peer publishes `tail` one slot past the records it committed and commits
/// nothing there (random bytes in the slot, no header of this lap): the records before are
/// read, then the ring is poisoned (`Uncommitted`) instead of read as empty for ever.
#[test]
fn a_tail_published_past_nothing_poisons() {
    let mut image = two_records();
    // Slot 3: not a header of lap 0's position 3 (its lap tag bit is clear), then noise.
    let at = HEADER_BYTES as usize + 3 * 16;
    image.bytes[at..at + 16].copy_from_slice(&[0x5a, 0x11, 0, 0, 1, 0, 0, 0, 9, 8, 7, 6, 5, 4, 3, 2]);
    image.set_tail(4);
    let (records, end) = read(&image.bytes);
    assert_eq!(records.len(), 2, "the records committed before it are read");
    assert_eq!(end, End::Failed(RingError::Poisoned { reason: PoisonReason::Uncommitted, detail: 3 }));
    assert_eq!(format!("{:?}", check_image_runs(&image.bytes)), format!("{:?}", check_image(&image.bytes)));
}

/// Issue #47: a peer writes over the header of a ring in use (garbage with the `closed`
/// bit in its state word, or just another magic): the consumer never takes it for the end
/// of the stream; the ring is poisoned `HeaderChanged`, the magic as found the detail.
/// The same bytes written back unchanged change nothing.
#[test]
fn a_header_written_over_is_not_an_end_of_stream() {
    let image = two_records();
    let mut garbage = [0xa5u8; 36];
    garbage[28..32].copy_from_slice(&PRODUCER_CLOSED.to_le_bytes());
    for scribble in [&garbage[..], &b"NOTARING"[..]] {
        match check_image_scribbled(&image.bytes, scribble) {
            Outcome::Read { records, end } => {
                assert!(records.len() <= 2, "{records:?}");
                let magic = u64::from_le_bytes(scribble[..8].try_into().unwrap());
                assert_eq!(
                    end,
                    End::Failed(RingError::Poisoned { reason: PoisonReason::HeaderChanged, detail: magic })
                );
            }
            Outcome::Refused(e) => panic!("the image itself is valid: {e}"),
        }
    }
    // The fixed fields as they were, the state word closed: an honest close.
    let mut honest = image.bytes[..28].to_vec();
    honest.extend_from_slice(&PRODUCER_CLOSED.to_le_bytes());
    match check_image_scribbled(&image.bytes, &honest) {
        Outcome::Read { records, end } => assert_eq!((records.len(), end), (2, End::Closed)),
        Outcome::Refused(e) => panic!("{e}"),
    }
}

/// A valid image gives back exactly its records, in order, then `Empty`.
#[test]
fn valid_image_reads_its_records() {
    let (records, end) = read(&two_records().bytes);
    assert_eq!(records, vec![(RecordKind::Data, payload(1, 20)), (RecordKind::Barrier, vec![])]);
    assert_eq!(end, End::Empty);
}

/// Positions past a wrap: the consumer skips the padding at the end of the ring, reads the
/// record at slot 0, and sees `Closed` once everything is read.
#[test]
fn wrapped_image_skips_padding_then_closes() {
    let mut image = Image::new(16, 4, 48, 2);
    image.send(RecordKind::Data, &payload(1, 8)).send(RecordKind::Watermark, &payload(2, 20));
    assert_eq!(image.tail, 2 + 1 + 1 + 2, "one slot, padding of one slot, then two slots at slot 0");
    image.set_state(PRODUCER_CLOSED);
    let (records, end) = read(&image.bytes);
    assert_eq!(records, vec![(RecordKind::Data, payload(1, 8)), (RecordKind::Watermark, payload(2, 20))]);
    assert_eq!(end, End::Closed);
}

/// The bytes of a real ring file read the same as a handmade image: the builder above
/// follows the layout the ring writes.
#[test]
fn real_file_image_reads_the_same() {
    let dir = std::env::temp_dir().join(format!("weir-fuzz-seeds-{}", std::process::id()));
    let path = dir.join("ring");
    let ring = Ring::create(&path, RingConfig { slot_bytes: 16, slot_count: 4, max_record_bytes: 48 }).unwrap();
    let mut producer = ring.producer().unwrap();
    assert!(producer.push(RecordKind::Data, &payload(1, 20)).unwrap());
    assert!(producer.push(RecordKind::Barrier, &[]).unwrap());
    drop(producer);
    let bytes = std::fs::read(&path).unwrap();
    drop(ring);
    std::fs::remove_dir_all(&dir).unwrap();
    let (records, end) = read(&bytes);
    assert_eq!(records, vec![(RecordKind::Data, payload(1, 20)), (RecordKind::Barrier, vec![])]);
    assert_eq!(end, End::Closed);
    let handmade = two_records().bytes;
    let slots = HEADER_BYTES as usize..;
    assert_eq!(bytes[slots.clone()], handmade[slots], "same slot bytes as the handmade image");
}

/// Each header corruption is refused before any slot is read, with the error that names it.
#[test]
fn corrupt_headers_are_refused() {
    let valid = two_records();
    let corrupt = |f: &dyn Fn(&mut Image)| {
        let mut image = valid.clone();
        f(&mut image);
        refused(&image.bytes)
    };
    assert!(matches!(refused(&valid.bytes[..HEADER_BYTES as usize - 1]), AttachError::TooShort { .. }));
    assert!(matches!(refused(&[]), AttachError::TooShort { .. }));
    assert!(matches!(corrupt(&|i| i.put_u64(0, MAGIC ^ 1)), AttachError::Magic { .. }));
    assert!(matches!(
        corrupt(&|i| i.put_u32(offset_of!(RingHeader, version), VERSION + 1)),
        AttachError::Version { .. }
    ));
    let layout = |e: AttachError| matches!(e, AttachError::Layout { .. });
    assert!(layout(corrupt(&|i| i.put_u32(offset_of!(RingHeader, header_bytes), 512))));
    assert!(layout(corrupt(&|i| i.put_u32(offset_of!(RingHeader, slot_count), 3))));
    assert!(layout(corrupt(&|i| i.put_u32(offset_of!(RingHeader, slot_bytes), 4))));
    assert!(
        layout(corrupt(&|i| i.put_u32(offset_of!(RingHeader, slot_count), 8))),
        "header says more slots than the image holds"
    );
    assert!(layout(corrupt(&|i| i.put_u32(offset_of!(RingHeader, max_record_bytes), 57))));
    assert!(layout(corrupt(&|i| i.bytes.push(0))), "image longer than the header says");
    assert!(layout(corrupt(&|i| i.set_head(8))), "head more than a ring past tail");
    assert!(
        matches!(
            corrupt(&|i| i.set_head(4)),
            AttachError::Ring(RingError::Poisoned { reason: PoisonReason::HeadOutOfRange, .. })
        ),
        "head past tail, where no committed record ends"
    );
    assert!(layout(corrupt(&|i| i.set_tail(5))), "tail more than a ring ahead of head");
    let ours = std::process::id();
    let live_consumer = corrupt(&|i| i.put_u32(offset_of!(RingHeader, consumer) + offset_of!(Liveness, pid), ours));
    assert!(matches!(live_consumer, AttachError::RoleTaken { .. }), "the consumer role is held by a live process");
}

/// Each record corruption poisons the ring on read, with the reason that names it; records
/// before it are still read.
#[test]
fn corrupt_records_poison() {
    let with = |f: &dyn Fn(&mut Image)| {
        let mut image = Image::new(16, 4, 48, 0);
        f(&mut image);
        poisoned(&image.bytes)
    };
    let raw = |index, kind, len, tail| {
        move |i: &mut Image| {
            i.put_record(index, kind, len, &[]);
            i.set_tail(tail);
        }
    };
    assert_eq!(with(&raw(0, 0, 4, 1)), PoisonReason::BadKind);
    assert_eq!(with(&raw(0, 200, 4, 1)), PoisonReason::BadKind);
    assert_eq!(with(&raw(0, 1, 49, 4)), PoisonReason::BadLength, "over max_record_bytes");
    assert_eq!(
        with(&|i| {
            i.set_head(3);
            raw(3, 1, 20, 5)(i)
        }),
        PoisonReason::BadLength,
        "2 slots from the last one: crosses the end"
    );
    assert_eq!(
        with(&|i| {
            i.set_head(2);
            raw(2, 5, 8, 4)(i)
        }),
        PoisonReason::BadPadding,
        "padding of 8 bytes, 24 to the end"
    );
    let mut image = two_records();
    image.put_record(3, 1, 4, &[]);
    image.set_tail(4);
    image.bytes[HEADER_BYTES as usize + 3 * 16 + 4] = 0x7f; // the kind byte of slot 3
    let (records, end) = read(&image.bytes);
    assert_eq!(records.len(), 2, "records before the bad one are read");
    assert!(matches!(end, End::Failed(RingError::Poisoned { reason: PoisonReason::BadKind, .. })));
    let mut image = two_records();
    image.set_state(POISONED);
    assert_eq!(
        read(&image.bytes).1,
        End::Failed(RingError::Poisoned { reason: PoisonReason::Application, detail: 0 }),
        "already poisoned: records are read, then the poison"
    );
}

/// Outcomes a valid or corrupt image may have; checks what every attached read must hold,
/// and that reading it as runs finds the same.
fn sane(image: &[u8]) {
    let outcome = check_image(image);
    assert_eq!(format!("{outcome:?}"), format!("{:?}", check_image_runs(image)), "read_runs differs from read");
    if let Outcome::Read { records, .. } = outcome {
        let max = u32::from_le_bytes(image[24..28].try_into().unwrap()) as usize;
        for (kind, payload) in records {
            assert_ne!(kind, RecordKind::Padding, "padding is never handed out");
            assert!(payload.len() <= max, "a record longer than max_record_bytes was handed out");
        }
        // The same image with its magic written over after the first read: never read as
        // the end of the stream (what the `ring_scribble` target checks).
        let mut scribble = image[..36.min(image.len())].to_vec();
        scribble[0] ^= 0x80;
        if let Outcome::Read { end, .. } = check_image_scribbled(image, &scribble) {
            assert!(matches!(end, End::Failed(_) | End::Bound), "a header written over read as {end:?}");
        }
    }
}

/// Every single-bit flip of every seed image is refused, read, or poisoned: never a panic,
/// an out-of-bounds read or a loop.
#[test]
fn every_bit_flip_is_handled() {
    for (name, image) in seeds() {
        for bit in 0..image.len() * 8 {
            let mut flipped = image.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let result = std::panic::catch_unwind(|| sane(&flipped));
            assert!(result.is_ok(), "seed {name}, bit {bit} flipped");
        }
    }
}

/// A small xorshift generator: the same sequence on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random slot bytes, positions and state under a valid header, and wholly random images
/// (some of exactly a valid length): handled without a panic.
#[test]
fn random_images_are_handled() {
    let mut rng = Rng(0x5eed_f00d_1234_5678);
    for round in 0..2000u32 {
        let slot_bytes = 8u32 << (rng.next() % 3);
        let slot_count = 2u32 << (rng.next() % 3);
        let ring_bytes = (slot_bytes * slot_count) as u64;
        let max = rng.next() % (ring_bytes - 7);
        let mut image = Image::new(slot_bytes, slot_count, max as u32, 0);
        for b in &mut image.bytes[HEADER_BYTES as usize..] {
            *b = rng.next() as u8;
        }
        let head = rng.next() % 1000;
        // Kinds and lengths that mostly make sense, so reads get past the first record.
        for index in 0..slot_count as u64 {
            if rng.next().is_multiple_of(2) {
                let len = (rng.next() % (max + 9)) as u32;
                // At the position of this slot in head's lap or the next (committed there),
                // or now and then one lap off (not committed).
                let lap = head / slot_count as u64 + u64::from(index < head % slot_count as u64);
                let off = if rng.next().is_multiple_of(5) { 1 } else { 0 };
                image.put_record((lap + off) * slot_count as u64 + index, (rng.next() % 7) as u8, len, &[]);
                if rng.next().is_multiple_of(2) {
                    // A frame header that may describe the record: few records, small
                    // strides, starts near 8.
                    let word = (rng.next() % 5) | ((rng.next() % 10) << 32) | ((8 * (rng.next() % 3)) << 48);
                    let at = HEADER_BYTES as usize + (index * slot_bytes as u64) as usize + 8;
                    if at + 8 <= image.bytes.len() {
                        image.bytes[at..at + 8].copy_from_slice(&word.to_le_bytes());
                    }
                }
            }
        }
        image.set_head(head);
        image.set_tail(head + rng.next() % (slot_count as u64 + 1));
        image.set_state((rng.next() % 8) as u32);
        sane(&image.bytes);
        let len = if round.is_multiple_of(2) { image.bytes.len() } else { (rng.next() % 1024) as usize };
        let noise: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        sane(&noise);
    }
}

/// With `WEIR_FUZZ_SEED_DIR` set, write the seed images there (one file each) to start the
/// fuzzer's corpus; otherwise do nothing.
#[test]
fn write_seeds_when_asked() {
    let Some(dir) = std::env::var_os("WEIR_FUZZ_SEED_DIR") else {
        return;
    };
    std::fs::create_dir_all(&dir).unwrap();
    for (name, image) in seeds() {
        std::fs::write(std::path::Path::new(&dir).join(name), image).unwrap();
    }
}
