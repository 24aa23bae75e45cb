//! Records and their codecs: how a value becomes bytes in a ring slot and back.
//!
//! Two paths:
//! - **Fixed layout** ([`fixed_record!`](crate::fixed_record)): a `#[repr(C)]` plain-data type (zerocopy's
//!   `FromBytes + IntoBytes + Immutable + KnownLayout`). Encoding is one copy into the claimed
//!   slot; decoding is no copy at all: the consumer gets `&T` pointing into the ring.
//! - **Variable length** ([`serde_record!`](crate::serde_record)): any serde type, in postcard's compact format
//!   (varints, length-prefixed strings and sequences). Decoding builds an owned value.
//!
//! Operators always see `&T`, so a chain of operators over a fixed-layout record reads the
//! sender's bytes in place.

mod either;
mod partition;
pub mod schema;

pub use either::Either;
pub use partition::{KeyFn, KeyGroups, Partitioning, hash_key, key_group, key_group_range, subtask_for_key_group};

use std::fmt;

/// A decode failed: the bytes are not a `T`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode a {type_name} from {len} bytes: {reason}")]
pub struct CodecError {
    /// The record type.
    pub type_name: &'static str,
    /// Bytes offered.
    pub len: usize,
    /// What was wrong.
    pub reason: String,
}

/// A value that can travel through a ring.
///
/// Contract: `encode` writes exactly `encoded_len()` bytes; `decode` of those bytes yields a
/// value equal to the original. `decode` must not panic on arbitrary bytes.
pub trait Record: Send + Sync + 'static {
    /// Whether every value encodes to the same number of bytes (a fixed layout). Rings
    /// then carry the records in fixed-stride frames (addressed by index, each on the
    /// boundary its size allows); otherwise in frames with a table of end offsets.
    const FIXED_SIZE: bool = false;
    /// Bytes `encode` will write.
    fn encoded_len(&self) -> usize;
    /// Write the record into `out` (exactly `encoded_len()` bytes long).
    fn encode(&self, out: &mut [u8]);
    /// Decode `bytes` and call `f` with the value: borrowed in place for fixed layouts.
    fn decode<R>(bytes: &[u8], f: impl FnOnce(&Self) -> R) -> Result<R, CodecError>;
    /// A run of records laid end to end, `stride` bytes each (a fixed-stride frame), as one
    /// slice borrowed in place, for `f` — when the layout allows it: a fixed-layout type whose
    /// size is the stride, the bytes aligned for it. `None`: decode them one by one (the
    /// default, and any type that is not a fixed layout).
    fn decode_run<R>(run: &[u8], stride: usize, f: impl FnOnce(&[Self]) -> R) -> Option<R>
    where
        Self: Sized,
    {
        let _ = (run, stride, f);
        None
    }
    /// What checkpoints record of this type ([`schema`]): its name, codec and, for a type
    /// declared with its fields (`fixed_record!(T { a: u64, .. })`), its fields, so that a
    /// later version of the job can check and convert state written with it. The default:
    /// the type's name and codec, its inside opaque.
    fn schema() -> schema::TypeSchema
    where
        Self: Sized,
    {
        let codec = if Self::FIXED_SIZE {
            schema::Codec::Fixed { size: std::mem::size_of::<Self>() as u32 }
        } else {
            schema::Codec::Postcard
        };
        schema::TypeSchema::named(std::any::type_name::<Self>(), codec)
    }
}

/// Implement [`Record`] for a fixed-layout type (zerocopy's `FromBytes + IntoBytes +
/// Immutable + KnownLayout`): zero-copy reads, one-copy writes. The type's alignment must
/// be at most 8 (ring payloads start 8-aligned).
#[macro_export]
macro_rules! fixed_record {
    (@impl $t:ty, { $($schema:tt)* }) => {
        impl $crate::record::Record for $t {
            const FIXED_SIZE: bool = true;
            #[inline]
            fn encoded_len(&self) -> usize {
                ::core::mem::size_of::<$t>()
            }
            #[inline]
            fn encode(&self, out: &mut [u8]) {
                out.copy_from_slice(::zerocopy::IntoBytes::as_bytes(self));
            }
            #[inline]
            fn decode_run<R>(run: &[u8], stride: usize, f: impl FnOnce(&[Self]) -> R) -> Option<R> {
                let size = ::core::mem::size_of::<$t>();
                if stride != size {
                    return None;
                }
                // A zero-sized type has no run (and its records go one by one).
                let count = run.len().checked_div(size)?;
                <[$t] as ::zerocopy::FromBytes>::ref_from_bytes_with_elems(run, count).ok().map(f)
            }
            #[inline]
            fn decode<R>(bytes: &[u8], f: impl FnOnce(&Self) -> R) -> Result<R, $crate::record::CodecError> {
                match <$t as ::zerocopy::FromBytes>::ref_from_bytes(bytes) {
                    Ok(value) => Ok(f(value)),
                    Err(e) => Err($crate::record::CodecError {
                        type_name: ::core::any::type_name::<$t>(),
                        len: bytes.len(),
                        reason: e.to_string(),
                    }),
                }
            }
            $($schema)*
        }
    };
    ($t:ident { $($f:ident : $ft:ty $(= $d:expr)?),* $(,)? }) => {
        $crate::fixed_record!(@impl $t, { fn schema() -> $crate::record::schema::TypeSchema {
            $crate::record::schema::TypeSchema {
                name: ::core::any::type_name::<$t>().to_owned(),
                codec: $crate::record::schema::Codec::Fixed { size: ::core::mem::size_of::<$t>() as u32 },
                shape: $crate::record::schema::Shape::Struct(vec![$(
                    $crate::record::schema::Field {
                        name: stringify!($f).to_owned(),
                        ty: $crate::record::schema::Scalar::of_field(
                            ::core::any::type_name::<$ft>(),
                            Some(::core::mem::size_of::<$ft>() as u32),
                        ),
                        offset: Some(::core::mem::offset_of!($t, $f) as u32),
                        default: None $(.or(Some($crate::record::schema::Value::from($d))))?,
                    }
                ),*]),
            }
        } });
        // Each field named is the struct's, of the type given.
        const _: () = {
            #[allow(dead_code)]
            fn fields_are_the_structs(v: &$t) { $(let _: &$ft = &v.$f;)* }
        };
    };
    ($($t:ty),+ $(,)?) => {$($crate::fixed_record!(@impl $t, {});)+};
}

/// Implement [`Record`] for a serde type, encoded with postcard (variable length).
#[macro_export]
macro_rules! serde_record {
    (@impl $t:ty, { $($schema:tt)* }) => {
        impl $crate::record::Record for $t {
            fn encoded_len(&self) -> usize {
                $crate::record::postcard_len(self)
            }
            fn encode(&self, out: &mut [u8]) {
                $crate::record::postcard_encode(self, out)
            }
            fn decode<R>(bytes: &[u8], f: impl FnOnce(&Self) -> R) -> Result<R, $crate::record::CodecError> {
                $crate::record::postcard_decode::<$t, R>(bytes, f)
            }
            $($schema)*
        }
    };
    ($t:ident { $($f:ident : $ft:ty $(= $d:expr)?),* $(,)? }) => {
        $crate::serde_record!(@impl $t, { fn schema() -> $crate::record::schema::TypeSchema {
            $crate::record::schema::TypeSchema {
                name: ::core::any::type_name::<$t>().to_owned(),
                codec: $crate::record::schema::Codec::Postcard,
                shape: $crate::record::schema::Shape::Struct(vec![$(
                    $crate::record::schema::Field {
                        name: stringify!($f).to_owned(),
                        ty: $crate::record::schema::Scalar::of_field(::core::any::type_name::<$ft>(), None),
                        offset: None,
                        default: None $(.or(Some($crate::record::schema::Value::from($d))))?,
                    }
                ),*]),
            }
        } });
        // Each field named is the struct's, of the type given.
        const _: () = {
            #[allow(dead_code)]
            fn fields_are_the_structs(v: &$t) { $(let _: &$ft = &v.$f;)* }
        };
    };
    ($($t:ty),+ $(,)?) => {$($crate::serde_record!(@impl $t, {});)+};
}

#[doc(hidden)]
pub fn postcard_len<T: serde::Serialize>(value: &T) -> usize {
    postcard::experimental::serialized_size(value).expect("postcard sizes any serde value")
}

#[doc(hidden)]
pub fn postcard_encode<T: serde::Serialize>(value: &T, out: &mut [u8]) {
    let written = postcard::to_slice(value, out).expect("buffer sized by postcard_len").len();
    debug_assert_eq!(written, out.len());
}

#[doc(hidden)]
pub fn postcard_decode<T: serde::de::DeserializeOwned, R>(
    bytes: &[u8],
    f: impl FnOnce(&T) -> R,
) -> Result<R, CodecError> {
    match postcard::from_bytes::<T>(bytes) {
        Ok(value) => Ok(f(&value)),
        Err(e) => Err(CodecError { type_name: std::any::type_name::<T>(), len: bytes.len(), reason: e.to_string() }),
    }
}

/// Append `record` to `out`, its length first (u32, little-endian): how operators put
/// records into their checkpoint bytes. [`take_record`] reads it back.
pub fn put_record<T: Record>(out: &mut Vec<u8>, record: &T) {
    let len = record.encoded_len();
    out.extend_from_slice(&(len as u32).to_le_bytes());
    let at = out.len();
    out.resize(at + len, 0);
    record.encode(&mut out[at..]);
}

/// Read the record [`put_record`] wrote at the front of `bytes`, call `f` with it, and move
/// `bytes` past it. Checkpoint bytes carry no alignment, so a record that is not 8-aligned
/// there is copied to an aligned buffer first (a fixed-layout record is read in place).
pub fn take_record<T: Record, R>(bytes: &mut &[u8], f: impl FnOnce(&T) -> R) -> Result<R, CodecError> {
    let short = |len: usize, reason: String| CodecError { type_name: std::any::type_name::<T>(), len, reason };
    let Some((head, rest)) = bytes.split_first_chunk::<4>() else {
        return Err(short(bytes.len(), "no length before the record: the bytes end early".to_owned()));
    };
    let len = u32::from_le_bytes(*head) as usize;
    if rest.len() < len {
        return Err(short(rest.len(), format!("the record is said to be {len} bytes, only {} are left", rest.len())));
    }
    let (record, rest) = rest.split_at(len);
    *bytes = rest;
    if (record.as_ptr() as usize).is_multiple_of(8) {
        return T::decode(record, f);
    }
    let mut aligned = vec![0u64; len.div_ceil(8)];
    let copy = &mut zerocopy::IntoBytes::as_mut_bytes(&mut aligned[..])[..len];
    copy.copy_from_slice(record);
    T::decode(copy, f)
}

fixed_record!(u8, u16, u32, u64, i32, i64, f64);
serde_record!(String, Vec<u8>, (u64, u64), (String, u64));

/// The record of job files and the demo: a keyed event with an event time and a sequence
/// number (so sinks can check for loss and duplicates). Fixed layout, 32 bytes.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
    serde::Serialize,
    serde::Deserialize,
)]
#[repr(C)]
pub struct Event {
    /// The key (a user id, say).
    pub key: u64,
    /// A value to aggregate.
    pub value: u64,
    /// Event time, ns since the Unix epoch (or a synthetic clock).
    pub time_ns: u64,
    /// Sequence number from the source, unique per job run.
    pub seq: u64,
}

fixed_record!(Event { key: u64, value: u64, time_ns: u64, seq: u64 });

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key={} value={} time_ns={} seq={}", self.key, self.value, self.time_ns, self.seq)
    }
}

/// Two events a join matched: what a join in a job file emits. `matched` 0: a left outer
/// join's left event that met none (`right` is then all zero). Fixed layout, 72 bytes.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
    serde::Serialize,
    serde::Deserialize,
)]
#[repr(C)]
pub struct JoinedEvents {
    /// The left input's event.
    pub left: Event,
    /// The right input's event (zero when `matched` is 0).
    pub right: Event,
    /// 1: a pair; 0: the left event alone.
    pub matched: u64,
}

fixed_record!(JoinedEvents);

impl JoinedEvents {
    /// The pair, or the left event alone.
    pub fn new(left: &Event, right: Option<&Event>) -> JoinedEvents {
        JoinedEvents { left: *left, right: right.copied().unwrap_or_default(), matched: right.is_some() as u64 }
    }
}

impl fmt::Display for JoinedEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.matched == 0 {
            write!(f, "left=[{}] right=none", self.left)
        } else {
            write!(f, "left=[{}] right=[{}]", self.left, self.right)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Record + PartialEq + fmt::Debug>(value: T) {
        let mut buf = vec![0u8; value.encoded_len()];
        value.encode(&mut buf);
        assert_eq!(T::decode(&buf, |v| v == &value), Ok(true), "{value:?}");
    }

    /// Both codecs give back what they were given; fixed records decode in place.
    #[test]
    fn codecs_round_trip() {
        round_trip(42u64);
        round_trip(Event { key: 1, value: 2, time_ns: 3, seq: 4 });
        round_trip(String::from("hello, ring"));
        round_trip(vec![1u8, 2, 3]);
        round_trip((7u64, 9u64));
        let e = Event { key: 5, ..Event::default() };
        let mut buf = [0u64; 4];
        e.encode(zerocopy::IntoBytes::as_mut_bytes(&mut buf[..]));
        let bytes = zerocopy::IntoBytes::as_bytes(&buf[..]);
        let addr = Event::decode(bytes, |v| v as *const Event as usize).unwrap();
        assert_eq!(addr, bytes.as_ptr() as usize, "fixed records are read in place");
    }

    /// A run of fixed records is one slice in place when the stride is the type's size and
    /// the bytes are aligned for it; anything else is left to decoding one by one.
    #[test]
    fn runs_decode_in_place_only_when_the_layout_allows() {
        let events: Vec<Event> = (0..5).map(|i| Event { key: i, value: 10 * i, time_ns: i, seq: i }).collect();
        let mut buf = vec![0u64; 4 * events.len() + 1];
        let bytes = zerocopy::IntoBytes::as_mut_bytes(&mut buf[..]);
        for (e, out) in events.iter().zip(bytes.chunks_exact_mut(32)) {
            e.encode(out);
        }
        let run = &bytes[..32 * events.len()];
        let seen = Event::decode_run(run, 32, |records| (records.to_vec(), records.as_ptr() as usize));
        assert_eq!(seen, Some((events.clone(), run.as_ptr() as usize)), "the slice is the ring's bytes");
        // Another stride (a peer's frame that is not of this type), misalignment, a ragged
        // run, a variable-length type: no slice.
        assert_eq!(Event::decode_run(run, 16, |r| r.len()), None);
        assert_eq!(Event::decode_run(&bytes[4..4 + 32], 32, |r| r.len()), None);
        assert_eq!(Event::decode_run(&run[..40], 32, |r| r.len()), None);
        assert_eq!(String::decode_run(&run[..8], 8, |r| r.len()), None);
        assert_eq!(u64::decode_run(&run[..16], 8, |r| r.to_vec()), Some(vec![0, 0]));
        // A zero-sized fixed record compiles, round-trips, and has no runs.
        round_trip(Nothing);
        assert_eq!(Nothing::decode_run(&[], 0, |r| r.len()), None);
    }

    #[derive(
        Debug,
        Clone,
        Copy,
        PartialEq,
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::Immutable,
        zerocopy::KnownLayout,
    )]
    #[repr(C)]
    struct Nothing;
    fixed_record!(Nothing);

    /// Bad bytes give an error that names the type, never a panic.
    #[test]
    fn bad_bytes() {
        let err = Event::decode(&[0u8; 5], |_| ()).unwrap_err();
        assert!(err.to_string().contains("Event"), "{err}");
        assert!(String::decode(&[0xff, 0xff, 0xff], |_| ()).is_err());
    }

    /// Records put into checkpoint bytes come back, at any alignment; a cut is an error.
    #[test]
    fn checkpoint_bytes_round_trip() {
        let mut out = vec![0u8; 3];
        put_record(&mut out, &Event { key: 9, value: 8, time_ns: 7, seq: 6 });
        put_record(&mut out, &String::from("after"));
        let mut bytes = &out[3..];
        assert_eq!(take_record(&mut bytes, |e: &Event| e.key), Ok(9));
        assert_eq!(take_record(&mut bytes, |s: &String| s.clone()), Ok("after".to_owned()));
        assert!(bytes.is_empty());
        let mut cut = &out[3..20];
        assert!(take_record(&mut cut, |_: &Event| ()).is_err());
    }
}
