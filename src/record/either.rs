//! [`Either`]: one record type for two streams, so a two-input operator reads both through
//! one input gate (barriers aligned across both, the watermark the minimum of both).

use super::{CodecError, Record};

/// A record of one of two streams: what a two-input operator receives
/// ([`crate::graph::Stream::connect`]).
///
/// Encoding: the side's record, zero bytes up to a multiple of 8, then one little-endian
/// `u64` trailer (`side | record length << 8`). The record stays first, so a fixed-layout
/// record is read in place; the padding keeps every record of a variable frame 8-aligned.
/// Decoding hands the operator an owned `Either`, which costs one copy of the side's record
/// (hence `Clone`): a fixed record is a `memcpy` of its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Either<A, B> {
    /// A record of the first stream.
    Left(A),
    /// A record of the second stream.
    Right(B),
}

const LEFT: u64 = 0;
const RIGHT: u64 = 1;
const TRAILER: usize = 8;

impl<A, B> Either<A, B> {
    /// The left record, if this is one.
    pub fn left(&self) -> Option<&A> {
        match self {
            Either::Left(a) => Some(a),
            Either::Right(_) => None,
        }
    }

    /// The right record, if this is one.
    pub fn right(&self) -> Option<&B> {
        match self {
            Either::Left(_) => None,
            Either::Right(b) => Some(b),
        }
    }
}

impl<A: Record + Clone, B: Record + Clone> Record for Either<A, B> {
    #[inline]
    fn encoded_len(&self) -> usize {
        let inner = match self {
            Either::Left(a) => a.encoded_len(),
            Either::Right(b) => b.encoded_len(),
        };
        inner.next_multiple_of(8) + TRAILER
    }

    #[inline]
    fn encode(&self, out: &mut [u8]) {
        let (side, inner) = match self {
            Either::Left(a) => (LEFT, a.encoded_len()),
            Either::Right(b) => (RIGHT, b.encoded_len()),
        };
        match self {
            Either::Left(a) => a.encode(&mut out[..inner]),
            Either::Right(b) => b.encode(&mut out[..inner]),
        }
        let n = out.len();
        out[inner..n - TRAILER].fill(0);
        out[n - TRAILER..].copy_from_slice(&(side | (inner as u64) << 8).to_le_bytes());
    }

    #[inline]
    fn decode<R>(bytes: &[u8], f: impl FnOnce(&Self) -> R) -> Result<R, CodecError> {
        let bad = |reason: String| CodecError { type_name: std::any::type_name::<Self>(), len: bytes.len(), reason };
        let Some(body) = bytes.len().checked_sub(TRAILER) else {
            return Err(bad("shorter than its 8-byte trailer".to_owned()));
        };
        let trailer = u64::from_le_bytes(bytes[body..].try_into().expect("8 bytes"));
        let (side, inner) = (trailer & 0xff, (trailer >> 8) as usize);
        if inner > body || inner.next_multiple_of(8) != body {
            return Err(bad(format!("the trailer says {inner} record bytes in a body of {body}")));
        }
        let record = &bytes[..inner];
        match side {
            LEFT => A::decode(record, |a| f(&Either::Left(a.clone()))),
            RIGHT => B::decode(record, |b| f(&Either::Right(b.clone()))),
            other => Err(bad(format!("side {other} is neither left (0) nor right (1)"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Event;

    fn round_trip(value: Either<Event, String>) {
        let mut buf = vec![0u8; value.encoded_len()];
        assert_eq!(buf.len() % 8, 0, "every encoding is a multiple of 8 bytes");
        value.encode(&mut buf);
        assert_eq!(Either::<Event, String>::decode(&buf, |v| v == &value), Ok(true), "{value:?}");
    }

    /// Both sides round-trip, fixed and variable, at every padding.
    #[test]
    fn both_sides_round_trip() {
        round_trip(Either::Left(Event { key: 1, value: 2, time_ns: 3, seq: 4 }));
        for n in 0..20 {
            round_trip(Either::Right("x".repeat(n)));
        }
    }

    /// A trailer that lies, a short buffer or an unknown side is an error, not a panic.
    #[test]
    fn bad_bytes_are_errors() {
        type E = Either<Event, String>;
        assert!(E::decode(&[0u8; 3], |_| ()).is_err());
        let mut buf = vec![0u8; 40];
        Either::<Event, String>::Left(Event::default()).encode(&mut buf);
        let mut lie = buf.clone();
        lie[32] = 7;
        assert!(E::decode(&lie, |_| ()).unwrap_err().reason.contains("side 7"));
        let mut long = buf.clone();
        long[33] = 0xff;
        assert!(E::decode(&long, |_| ()).is_err());
        assert!(E::decode(&buf[8..], |_| ()).is_err());
    }
}
