//! What the queries send between their operators: each query projects the events to the
//! fields it needs before an exchange (as Flink's planner pushes projections down), so a
//! ring carries 16 to 40 bytes a record where it can, and the strings only where the result
//! needs them.

use serde::{Deserialize, Serialize};

/// q3: an auction of category 10 and its seller.
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
)]
#[repr(C)]
#[allow(missing_docs)]
pub struct A3 {
    pub id: u64,
    pub seller: u64,
}

/// q4: an auction: when bids count for it, and its category.
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
)]
#[repr(C)]
#[allow(missing_docs)]
pub struct A4 {
    pub id: u64,
    pub category: u64,
    pub date_time: u64,
    pub expires: u64,
}

/// q4: a bid.
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
)]
#[repr(C)]
#[allow(missing_docs)]
pub struct B4 {
    pub auction: u64,
    pub price: u64,
    pub date_time: u64,
}

/// q4: an auction's winning price, once the auction is over.
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
)]
#[repr(C)]
#[allow(missing_docs)]
pub struct W4 {
    pub category: u64,
    pub price: u64,
}

/// q5: a bid on an auction at a time (ns).
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
)]
#[repr(C)]
#[allow(missing_docs)]
pub struct B5 {
    pub auction: u64,
    pub t_ns: u64,
}

/// q8: an auction's seller at a time (ms).
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
)]
#[repr(C)]
#[allow(missing_docs)]
pub struct A8 {
    pub seller: u64,
    pub date_time: u64,
}

/// q11, q12: a bid by a bidder at a time (ns).
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
)]
#[repr(C)]
#[allow(missing_docs)]
pub struct B11 {
    pub bidder: u64,
    pub t_ns: u64,
}

/// q15: a bid, by day.
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
)]
#[repr(C)]
#[allow(missing_docs)]
pub struct B15 {
    pub day: u64,
    pub bidder: u64,
    pub auction: u64,
    pub price: u64,
}

/// q17: a bid, by auction and day.
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
)]
#[repr(C)]
#[allow(missing_docs)]
pub struct B17 {
    pub auction: u64,
    pub day: u64,
    pub price: u64,
}

weir::fixed_record!(A3, A4, B4, W4, B5, A8, B11, B15, B17);

macro_rules! variable {
    ($($(#[$doc:meta])* $name:ident { $($field:ident : $ty:ty),+ })+) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[allow(missing_docs)]
        pub struct $name { $(pub $field: $ty),+ }
        weir::serde_record!($name);
    )+};
}

variable! {
    /// q3: a person in or, id or ca.
    P3 { id: u64, name: String, city: String, state: String }
    /// q7: a bid as a candidate for the highest of window `window` (10 s windows since the
    /// epoch); `member` 0: the bid is at the window's end, in the next window, and counts for
    /// this one only because Flink's `BETWEEN` includes its end.
    C7 { window: u64, member: u64, auction: u64, price: u64, bidder: u64, date_time: u64, extra: String }
    /// q8: a person at a time (ms).
    P8 { id: u64, name: String, date_time: u64 }
    /// q9: a bid, the fields q9 shows.
    B9 { auction: u64, bidder: u64, price: u64, date_time: u64, extra: String }
    /// q16: a bid, by channel and day, with its minute.
    B16 { channel: String, day: u64, minute: u64, bidder: u64, auction: u64, price: u64 }
}
