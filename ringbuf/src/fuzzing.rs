//! An entry point for fuzzing what the ring reads from shared memory (`ringbuf/fuzz`) and for
//! the seed tests that run it under plain `cargo test`. Not part of the API.
//!
//! A peer that maps the ring file may write anything into it, so every byte a consumer
//! reads — the header, the positions, each record header — is the fuzzer's to choose.

use crate::{AttachError, Batch, Consumer, Read, RecordKind, Ring, RingError};

/// How the consumer's reading of an image stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Nothing more was published (`Read::Empty`).
    Empty,
    /// The producer closed the ring and every record was read (`Read::Closed`).
    Closed,
    /// A read failed: the image broke the protocol and the ring is now poisoned.
    Failed(RingError),
    /// `ring bytes + 2` records were read, more than a valid image can hold (a frame of
    /// 1-byte records holds at most one per byte); the bound that keeps one run finite
    /// whatever the bytes say.
    Bound,
}

/// What [`check_image`] found.
#[derive(Debug)]
pub enum Outcome {
    /// The header was refused as attach refuses a file (or the consumer role in it is held
    /// by a live process, or its positions are out of range).
    Refused(AttachError),
    /// The header was valid; the consumer read these records (kind, payload), then `end`.
    Read {
        /// Every record read, in order.
        records: Vec<(RecordKind, Vec<u8>)>,
        /// Why reading stopped.
        end: End,
    },
}

/// Treat `image` as the bytes of a ring file (header and slots): copy it to fresh 128-aligned
/// memory, validate the header as attach does, and if it is valid take the consumer role and
/// read — copying out each payload and releasing it — until `Empty`, `Closed`, an error, or
/// `ring bytes + 2` reads. Whatever the bytes, this must not panic, read out of bounds or
/// loop forever; that is what the fuzzer checks.
/// `Empty` only if the consumer would wait on it: the checks it makes before a park (the
/// header intact, no `tail` published past an uncommitted record) pass.
fn empty_or_broken(consumer: &Consumer) -> End {
    match consumer.check_peer() {
        Ok(()) => End::Empty,
        Err(e) => End::Failed(e),
    }
}

pub fn check_image(image: &[u8]) -> Outcome {
    read_image(image, |consumer, _room, records| match consumer.read() {
        Ok(Read::Record(view)) => {
            records.push((view.kind(), view.payload().to_vec()));
            view.release();
            None
        }
        Ok(Read::Empty) => Some(empty_or_broken(consumer)),
        Ok(Read::Closed) => Some(End::Closed),
        Err(e) => Some(End::Failed(e)),
    })
}

/// [`check_image`], with `scribble` written over the start of the header (its fixed fields
/// first: magic, version, sizes; then the state and poison words) of the live ring after
/// the first read, as a peer writing over a ring in use would. Whatever it writes, what is
/// read must hold as for `check_image`, and if the fixed fields changed the reading never
/// ends `Closed` (a garbage state word is not an end of stream): it ends poisoned with
/// `HeaderChanged` (or earlier, by another poison).
pub fn check_image_scribbled(image: &[u8], scribble: &[u8]) -> Outcome {
    let mut first = true;
    read_image(image, |consumer, _room, records| {
        let read = consumer.read();
        let end = match read {
            Ok(Read::Record(view)) => {
                records.push((view.kind(), view.payload().to_vec()));
                view.release();
                None
            }
            Ok(Read::Empty) => Some(empty_or_broken(consumer)),
            Ok(Read::Closed) => Some(End::Closed),
            Err(e) => Some(End::Failed(e)),
        };
        if std::mem::take(&mut first) && !scribble.is_empty() {
            consumer.scribble_header(scribble);
            // What was read before the scribble ended nothing: read on.
            if matches!(end, Some(End::Empty | End::Closed)) {
                return None;
            }
        }
        end
    })
}

/// What both checks share: attach to `image` as a consumer, then call `step` with room for
/// at most that many more records (so that `ring bytes + 2` is never passed) until it says
/// how reading ended.
fn read_image(
    image: &[u8],
    mut step: impl FnMut(&mut Consumer, usize, &mut Vec<(RecordKind, Vec<u8>)>) -> Option<End>,
) -> Outcome {
    let ring = match Ring::from_image(image) {
        Ok(ring) => ring,
        Err(e) => return Outcome::Refused(e),
    };
    let mut consumer = match ring.consumer() {
        Ok(consumer) => consumer,
        Err(e) => return Outcome::Refused(e),
    };
    let bound = ring.config().ring_bytes() as usize + 2;
    let mut records = Vec::new();
    let end = loop {
        if records.len() >= bound {
            break End::Bound;
        }
        if let Some(end) = step(&mut consumer, bound - records.len(), &mut records) {
            break end;
        }
    };
    Outcome::Read { records, end }
}

/// [`check_image`] reading with [`Consumer::read_runs`] instead
/// of one record at a time (a fixed frame's records as one run, split here by its stride):
/// the same bounds hold, and on any image it must find what `check_image` finds.
pub fn check_image_runs(image: &[u8]) -> Outcome {
    read_image(image, |consumer, room, records| {
        let read = consumer.read_runs(room, |kind, run, stride| {
            if stride == 0 {
                records.push((kind, Vec::new()));
            } else {
                records.extend(run.chunks_exact(stride).map(|r| (kind, r.to_vec())));
            }
            true
        });
        match read {
            Ok(Batch::Records(_)) => None,
            Ok(Batch::Empty) => Some(empty_or_broken(consumer)),
            Ok(Batch::Closed) => Some(End::Closed),
            Err(e) => Some(End::Failed(e)),
        }
    })
}
