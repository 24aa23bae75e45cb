//! Nexmark's three events as records: [`Person`], [`Auction`], [`Bid`], and [`NexmarkEvent`],
//! one of them. Their fields are Flink's suite's columns (`ddl_gen.sql`), strings included.
//!
//! # Encoding
//!
//! Variable length, little-endian, the numbers first and then the strings, each string's
//! length in the fixed part (so a reader finds every field without scanning):
//!
//! ```text
//!  Person   id | date_time | 6 × u32 lengths           | name email credit_card city state extra
//!  Auction  id | item... 7 numbers | 3 × u32 lengths, pad | item_name description extra
//!  Bid      auction | bidder | price | date_time | 3 × u32 lengths, pad | channel url extra
//!  NexmarkEvent   kind (u64: 0 person, 1 auction, 2 bid) | the event's encoding
//! ```
//!
//! A decode checks every length against the bytes and every string for UTF-8, and refuses
//! the record (a [`CodecError`]) otherwise. It fills a value kept per thread and per type,
//! whose strings keep their capacity, so decoding a record in a ring allocates nothing once
//! the strings have grown to the longest seen: the bytes are copied into it, once. (A decode
//! inside the closure of another decode of the same type — a fiber that switches while the
//! first holds its record — gets a fresh value instead.)

use crate::record::{CodecError, Record};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::fmt;
use std::thread::LocalKey;

/// A person who sells or bids: Flink's `person` columns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Person {
    /// The person's id (from `first_person_id` on).
    pub id: u64,
    /// First and last name, e.g. `"vicky noris"`.
    pub name: String,
    /// E-mail address.
    pub email_address: String,
    /// A 19-character card number, `"dddd dddd dddd dddd"`.
    pub credit_card: String,
    /// A US city, lower case.
    pub city: String,
    /// A US state, two lower-case letters (Flink's Java generator writes them upper case).
    pub state: String,
    /// Event time, ms since the Unix epoch.
    pub date_time: u64,
    /// Padding up to the configured average size.
    pub extra: String,
}

/// An item put up for auction: Flink's `auction` columns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Auction {
    /// The auction's id (from `first_auction_id` on).
    pub id: u64,
    /// The item's name.
    pub item_name: String,
    /// A short description.
    pub description: String,
    /// The opening price.
    pub initial_bid: u64,
    /// The lowest price for the auction to succeed.
    pub reserve: u64,
    /// Event time, ms since the Unix epoch.
    pub date_time: u64,
    /// When the auction ends, ms since the Unix epoch.
    pub expires: u64,
    /// The person selling.
    pub seller: u64,
    /// The item's category (from `first_category_id` on).
    pub category: u64,
    /// Padding up to the configured average size.
    pub extra: String,
}

/// A bid on an auction: Flink's `bid` columns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Bid {
    /// The auction bid on.
    pub auction: u64,
    /// The person bidding.
    pub bidder: u64,
    /// The price offered.
    pub price: u64,
    /// Where the bid came from (`"Google"`, `"channel-1234"`, ...).
    pub channel: String,
    /// The URL of the bid.
    pub url: String,
    /// Event time, ms since the Unix epoch.
    pub date_time: u64,
    /// Padding up to the configured average size.
    pub extra: String,
}

/// One Nexmark event, as the generator makes them: what a Nexmark source emits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NexmarkEvent {
    /// A new person.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A bid.
    Bid(Bid),
}

impl Default for NexmarkEvent {
    fn default() -> NexmarkEvent {
        NexmarkEvent::Bid(Bid::default())
    }
}

impl NexmarkEvent {
    /// Event time, ms since the Unix epoch.
    #[inline]
    pub fn date_time(&self) -> u64 {
        match self {
            NexmarkEvent::Person(p) => p.date_time,
            NexmarkEvent::Auction(a) => a.date_time,
            NexmarkEvent::Bid(b) => b.date_time,
        }
    }

    /// Event time in ns (what `with_event_time` takes).
    #[inline]
    pub fn date_time_ns(&self) -> u64 {
        self.date_time().saturating_mul(1_000_000)
    }

    /// The person, if this is one.
    #[inline]
    pub fn as_person(&self) -> Option<&Person> {
        match self {
            NexmarkEvent::Person(p) => Some(p),
            _ => None,
        }
    }

    /// The auction, if this is one.
    #[inline]
    pub fn as_auction(&self) -> Option<&Auction> {
        match self {
            NexmarkEvent::Auction(a) => Some(a),
            _ => None,
        }
    }

    /// The bid, if this is one.
    #[inline]
    pub fn as_bid(&self) -> Option<&Bid> {
        match self {
            NexmarkEvent::Bid(b) => Some(b),
            _ => None,
        }
    }

    /// Flink's `event_type`: 0 person, 1 auction, 2 bid.
    #[inline]
    pub fn kind(&self) -> u64 {
        match self {
            NexmarkEvent::Person(_) => PERSON,
            NexmarkEvent::Auction(_) => AUCTION,
            NexmarkEvent::Bid(_) => BID,
        }
    }
}

impl From<nexmark::event::Event> for NexmarkEvent {
    /// The crate's event, its strings moved (not copied).
    fn from(e: nexmark::event::Event) -> NexmarkEvent {
        match e {
            nexmark::event::Event::Person(p) => NexmarkEvent::Person(Person {
                id: p.id as u64,
                name: p.name,
                email_address: p.email_address,
                credit_card: p.credit_card,
                city: p.city,
                state: p.state,
                date_time: p.date_time,
                extra: p.extra,
            }),
            nexmark::event::Event::Auction(a) => NexmarkEvent::Auction(Auction {
                id: a.id as u64,
                item_name: a.item_name,
                description: a.description,
                initial_bid: a.initial_bid as u64,
                reserve: a.reserve as u64,
                date_time: a.date_time,
                expires: a.expires,
                seller: a.seller as u64,
                category: a.category as u64,
                extra: a.extra,
            }),
            nexmark::event::Event::Bid(b) => NexmarkEvent::Bid(Bid {
                auction: b.auction as u64,
                bidder: b.bidder as u64,
                price: b.price as u64,
                channel: b.channel,
                url: b.url,
                date_time: b.date_time,
                extra: b.extra,
            }),
        }
    }
}

/// [`NexmarkEvent::kind`] of a person.
pub const PERSON: u64 = 0;
/// [`NexmarkEvent::kind`] of an auction.
pub const AUCTION: u64 = 1;
/// [`NexmarkEvent::kind`] of a bid.
pub const BID: u64 = 2;

/// Fixed part of each encoding, bytes.
const PERSON_FIXED: usize = 2 * 8 + 6 * 4;
const AUCTION_FIXED: usize = 7 * 8 + 4 * 4;
const BID_FIXED: usize = 4 * 8 + 4 * 4;

/// Writes fields at increasing offsets of a slice sized by `encoded_len`.
struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.out[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
    #[inline]
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    #[inline]
    fn len(&mut self, s: &str) {
        // Records are far below 4 GiB (the ring's record bound is checked by its writer).
        self.bytes(&(s.len() as u32).to_le_bytes());
    }
}

/// Reads fields at increasing offsets, every read bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], FieldError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or(FieldError::PastEnd {
            n,
            at: self.at,
            len: self.bytes.len(),
        })?;
        let b = &self.bytes[self.at..end];
        self.at = end;
        Ok(b)
    }
    #[inline]
    fn u64(&mut self) -> Result<u64, FieldError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    #[inline]
    fn len(&mut self) -> Result<usize, FieldError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize)
    }
    /// The next `n` bytes into `into`, checked for UTF-8; `into` keeps its capacity.
    #[inline]
    fn string(&mut self, n: usize, into: &mut String) -> Result<(), FieldError> {
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|source| FieldError::Utf8 { at: self.at - n, source })?;
        into.clear();
        into.push_str(s);
        Ok(())
    }
    /// Every byte read.
    fn end(&self) -> Result<(), FieldError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(FieldError::Left { left: self.bytes.len() - self.at, read: self.at })
        }
    }
}

/// What is wrong with an event's bytes (the reason of its [`CodecError`]).
#[derive(Debug, thiserror::Error)]
enum FieldError {
    /// A field runs past the end of the bytes.
    #[error("a field of {n} bytes at offset {at} runs past the end ({len} bytes)")]
    PastEnd { n: usize, at: usize, len: usize },
    /// A string that is not UTF-8.
    #[error("a string at offset {at} is not UTF-8: {source}")]
    Utf8 { at: usize, source: std::str::Utf8Error },
    /// Bytes after the last field.
    #[error("{left} bytes left after the record's {read} bytes")]
    Left { left: usize, read: usize },
}

impl Person {
    fn encoded(&self) -> usize {
        PERSON_FIXED
            + self.name.len()
            + self.email_address.len()
            + self.credit_card.len()
            + self.city.len()
            + self.state.len()
            + self.extra.len()
    }
    fn write(&self, w: &mut Writer) {
        w.u64(self.id);
        w.u64(self.date_time);
        let strings = [&self.name, &self.email_address, &self.credit_card, &self.city, &self.state, &self.extra];
        for s in strings {
            w.len(s);
        }
        for s in strings {
            w.bytes(s.as_bytes());
        }
    }
    fn read(r: &mut Reader, p: &mut Person) -> Result<(), FieldError> {
        p.id = r.u64()?;
        p.date_time = r.u64()?;
        let lens = [r.len()?, r.len()?, r.len()?, r.len()?, r.len()?, r.len()?];
        let strings = [&mut p.name, &mut p.email_address, &mut p.credit_card, &mut p.city, &mut p.state, &mut p.extra];
        for (s, n) in strings.into_iter().zip(lens) {
            r.string(n, s)?;
        }
        Ok(())
    }
}

impl Auction {
    fn encoded(&self) -> usize {
        AUCTION_FIXED + self.item_name.len() + self.description.len() + self.extra.len()
    }
    fn write(&self, w: &mut Writer) {
        for v in [self.id, self.initial_bid, self.reserve, self.date_time, self.expires, self.seller, self.category] {
            w.u64(v);
        }
        let strings = [&self.item_name, &self.description, &self.extra];
        for s in strings {
            w.len(s);
        }
        w.bytes(&[0; 4]);
        for s in strings {
            w.bytes(s.as_bytes());
        }
    }
    fn read(r: &mut Reader, a: &mut Auction) -> Result<(), FieldError> {
        a.id = r.u64()?;
        a.initial_bid = r.u64()?;
        a.reserve = r.u64()?;
        a.date_time = r.u64()?;
        a.expires = r.u64()?;
        a.seller = r.u64()?;
        a.category = r.u64()?;
        let lens = [r.len()?, r.len()?, r.len()?];
        r.take(4)?;
        for (s, n) in [&mut a.item_name, &mut a.description, &mut a.extra].into_iter().zip(lens) {
            r.string(n, s)?;
        }
        Ok(())
    }
}

impl Bid {
    fn encoded(&self) -> usize {
        BID_FIXED + self.channel.len() + self.url.len() + self.extra.len()
    }
    fn write(&self, w: &mut Writer) {
        for v in [self.auction, self.bidder, self.price, self.date_time] {
            w.u64(v);
        }
        let strings = [&self.channel, &self.url, &self.extra];
        for s in strings {
            w.len(s);
        }
        w.bytes(&[0; 4]);
        for s in strings {
            w.bytes(s.as_bytes());
        }
    }
    fn read(r: &mut Reader, b: &mut Bid) -> Result<(), FieldError> {
        b.auction = r.u64()?;
        b.bidder = r.u64()?;
        b.price = r.u64()?;
        b.date_time = r.u64()?;
        let lens = [r.len()?, r.len()?, r.len()?];
        r.take(4)?;
        for (s, n) in [&mut b.channel, &mut b.url, &mut b.extra].into_iter().zip(lens) {
            r.string(n, s)?;
        }
        Ok(())
    }
}

/// Decode `bytes` into this thread's value of `T` (or a fresh one while that is lent out)
/// by `read`, and call `f` with it.
#[inline]
fn decode_into<T: Default + 'static, R>(
    scratch: &'static LocalKey<RefCell<T>>,
    bytes: &[u8],
    read: impl FnOnce(&mut Reader, &mut T) -> Result<(), FieldError>,
    f: impl FnOnce(&T) -> R,
) -> Result<R, CodecError> {
    let bad = |reason: String| CodecError { type_name: std::any::type_name::<T>(), len: bytes.len(), reason };
    let fill = |value: &mut T| {
        let mut r = Reader { bytes, at: 0 };
        read(&mut r, value).and_then(|()| r.end()).map_err(|e| bad(e.to_string()))
    };
    scratch.with(|cell| match cell.try_borrow_mut() {
        Ok(mut value) => {
            fill(&mut value)?;
            Ok(f(&value))
        }
        Err(_) => {
            let mut value = T::default();
            fill(&mut value)?;
            Ok(f(&value))
        }
    })
}

/// One value of each kind, so a thread decoding events of all three kinds reuses each one's
/// strings.
#[derive(Debug)]
struct EventScratch {
    person: NexmarkEvent,
    auction: NexmarkEvent,
    bid: NexmarkEvent,
}

impl Default for EventScratch {
    fn default() -> EventScratch {
        EventScratch {
            person: NexmarkEvent::Person(Person::default()),
            auction: NexmarkEvent::Auction(Auction::default()),
            bid: NexmarkEvent::Bid(Bid::default()),
        }
    }
}

thread_local! {
    static PERSONS: RefCell<Person> = RefCell::default();
    static AUCTIONS: RefCell<Auction> = RefCell::default();
    static BIDS: RefCell<Bid> = RefCell::default();
    static EVENTS: RefCell<EventScratch> = RefCell::default();
}

macro_rules! event_record {
    ($t:ty, $scratch:ident) => {
        impl Record for $t {
            #[inline]
            fn encoded_len(&self) -> usize {
                self.encoded()
            }
            #[inline]
            fn encode(&self, out: &mut [u8]) {
                let mut w = Writer { out, at: 0 };
                self.write(&mut w);
                debug_assert_eq!(w.at, w.out.len(), "encoded_len and encode agree");
            }
            #[inline]
            fn decode<R>(bytes: &[u8], f: impl FnOnce(&Self) -> R) -> Result<R, CodecError> {
                decode_into(&$scratch, bytes, <$t>::read, f)
            }
        }
    };
}

event_record!(Person, PERSONS);
event_record!(Auction, AUCTIONS);
event_record!(Bid, BIDS);

impl Record for NexmarkEvent {
    #[inline]
    fn encoded_len(&self) -> usize {
        8 + match self {
            NexmarkEvent::Person(p) => p.encoded(),
            NexmarkEvent::Auction(a) => a.encoded(),
            NexmarkEvent::Bid(b) => b.encoded(),
        }
    }

    #[inline]
    fn encode(&self, out: &mut [u8]) {
        let mut w = Writer { out, at: 0 };
        w.u64(self.kind());
        match self {
            NexmarkEvent::Person(p) => p.write(&mut w),
            NexmarkEvent::Auction(a) => a.write(&mut w),
            NexmarkEvent::Bid(b) => b.write(&mut w),
        }
        debug_assert_eq!(w.at, w.out.len(), "encoded_len and encode agree");
    }

    #[inline]
    fn decode<R>(bytes: &[u8], f: impl FnOnce(&Self) -> R) -> Result<R, CodecError> {
        let bad = |reason: String| CodecError { type_name: "NexmarkEvent", len: bytes.len(), reason };
        let kind = match bytes.first_chunk::<8>() {
            Some(k) => u64::from_le_bytes(*k),
            None => return Err(bad("shorter than its 8-byte kind".to_owned())),
        };
        if kind > BID {
            return Err(bad(format!("kind {kind} is none of person (0), auction (1), bid (2)")));
        }
        let body = &bytes[8..];
        let decoded = decode_into(
            &EVENTS,
            body,
            |r, s: &mut EventScratch| match (kind, s) {
                (PERSON, EventScratch { person: NexmarkEvent::Person(p), .. }) => Person::read(r, p),
                (AUCTION, EventScratch { auction: NexmarkEvent::Auction(a), .. }) => Auction::read(r, a),
                (BID, EventScratch { bid: NexmarkEvent::Bid(b), .. }) => Bid::read(r, b),
                _ => unreachable!("the scratch holds one event of each kind, and the kind was checked"),
            },
            |s| match kind {
                PERSON => f(&s.person),
                AUCTION => f(&s.auction),
                _ => f(&s.bid),
            },
        );
        decoded.map_err(|e| CodecError { type_name: "NexmarkEvent", ..e })
    }
}

/// One JSON object, as serde writes it: `{"Bid":{"auction":1000,...}}`.
impl fmt::Display for NexmarkEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| fmt::Error)?)
    }
}

macro_rules! json_display {
    ($($t:ty),+) => {$(
        /// One JSON object, as serde writes it.
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&serde_json::to_string(self).map_err(|_| fmt::Error)?)
            }
        }
    )+};
}

json_display!(Person, Auction, Bid);

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Record + PartialEq + fmt::Debug>(value: &T) {
        let mut buf = vec![0u8; value.encoded_len()];
        value.encode(&mut buf);
        assert_eq!(T::decode(&buf, |v| v == value), Ok(true), "{value:?}");
        // Every shorter cut is refused, never a panic.
        for cut in 0..buf.len() {
            assert!(T::decode(&buf[..cut], |_| ()).is_err(), "{cut} of {} bytes decoded", buf.len());
        }
    }

    fn events() -> Vec<NexmarkEvent> {
        let config = nexmark::config::NexmarkConfig { base_time: 1_700_000_000_000, ..Default::default() };
        nexmark::EventGenerator::new(config).take(100).map(NexmarkEvent::from).collect()
    }

    /// Every kind of event comes back as it went in, through its own codec and as a
    /// `NexmarkEvent`; a cut record is an error.
    #[test]
    fn events_round_trip() {
        let events = events();
        assert!(events.iter().any(|e| e.kind() == PERSON) && events.iter().any(|e| e.kind() == AUCTION));
        for e in &events {
            round_trip(e);
            match e {
                NexmarkEvent::Person(p) => round_trip(p),
                NexmarkEvent::Auction(a) => round_trip(a),
                NexmarkEvent::Bid(b) => round_trip(b),
            }
        }
    }

    /// Decoding one after another reuses the thread's value, and what `f` sees is each
    /// record's own fields (no string left over from a longer one); a decode inside another
    /// decode's closure gets a value of its own.
    #[test]
    fn decodes_reuse_without_leftovers() {
        let long = Bid { channel: "a long channel name".into(), extra: "x".repeat(300), ..Bid::default() };
        let short = Bid { auction: 7, channel: "c".into(), ..Bid::default() };
        let enc = |b: &Bid| {
            let mut buf = vec![0u8; b.encoded_len()];
            b.encode(&mut buf);
            buf
        };
        let (l, s) = (enc(&long), enc(&short));
        assert_eq!(Bid::decode(&l, |b| b.clone()), Ok(long.clone()));
        assert_eq!(Bid::decode(&s, |b| b.clone()), Ok(short.clone()));
        let nested = Bid::decode(&l, |outer| Bid::decode(&s, |inner| (outer.clone(), inner.clone())));
        assert_eq!(nested, Ok(Ok((long, short))));
    }

    /// Bytes that are no event: an unknown kind, a length past the end, bytes left over,
    /// a string that is not UTF-8.
    #[test]
    fn bad_bytes_are_refused() {
        let e = NexmarkEvent::Bid(Bid { channel: "abc".into(), ..Bid::default() });
        let mut buf = vec![0u8; e.encoded_len()];
        e.encode(&mut buf);
        let mut kind = buf.clone();
        kind[0] = 9;
        assert!(NexmarkEvent::decode(&kind, |_| ()).unwrap_err().to_string().contains("kind 9"));
        let mut longer = buf.clone();
        longer.push(0);
        assert!(NexmarkEvent::decode(&longer, |_| ()).unwrap_err().to_string().contains("left after"));
        let mut utf8 = buf.clone();
        let at = utf8.len() - 3;
        utf8[at] = 0xff;
        assert!(NexmarkEvent::decode(&utf8, |_| ()).unwrap_err().to_string().contains("UTF-8"));
        let mut huge = buf;
        huge[8 + 32..8 + 36].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(NexmarkEvent::decode(&huge, |_| ()).is_err());
    }
}
