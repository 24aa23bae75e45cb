//! A Nexmark source's job-file section (`type = "nexmark"`): every generator setting, and
//! which events become the job file's records and how.
//!
//! Its keys, with their defaults and what each does, are [`NexmarkConfig::KEYS`], the table
//! the parser takes them by and the job-file reference (`weir::guide::reference::job_file`) is
//! generated from.
//!
//! Fields: a bid's `auction` (default key), `bidder`, `price` (default value), `date_time`;
//! an auction's `id` (default key), `seller`, `category` (default value), `initial_bid`,
//! `reserve`, `expires`, `date_time`; a person's `id` (default key and value), `date_time`.
//! A record's `time_ns` is the event's time in ns, its `seq` the event's offset in the
//! sequence (unique, so sinks can check for loss and duplicates).

use super::{NexmarkConfig, NexmarkEvent, RateShape};
use crate::record::Event;
use crate::util::section::{Affects, JobFileError, Key, KeyType as T, Section};

/// Which Nexmark events a job file's source emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectedKind {
    /// Persons.
    Persons,
    /// Auctions.
    Auctions,
    /// Bids.
    Bids,
}

/// How a job file's Nexmark source makes its events ([`Event`]) of Nexmark events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventProjection {
    /// Which events.
    pub kind: ProjectedKind,
    /// The field that becomes `key` (a name from [`EventProjection::fields`]).
    pub key: &'static str,
    /// The field that becomes `value`.
    pub value: &'static str,
}

impl EventProjection {
    /// The numeric fields of `kind`'s events.
    pub fn fields(kind: ProjectedKind) -> &'static [&'static str] {
        match kind {
            ProjectedKind::Bids => &["auction", "bidder", "price", "date_time"],
            ProjectedKind::Auctions => &["id", "seller", "category", "initial_bid", "reserve", "expires", "date_time"],
            ProjectedKind::Persons => &["id", "date_time"],
        }
    }

    /// Field `name` of `e`, if `e` is of this projection's kind.
    fn field(&self, e: &NexmarkEvent, name: &str) -> Option<u64> {
        Some(match (self.kind, e) {
            (ProjectedKind::Bids, NexmarkEvent::Bid(b)) => match name {
                "auction" => b.auction,
                "bidder" => b.bidder,
                "price" => b.price,
                _ => b.date_time,
            },
            (ProjectedKind::Auctions, NexmarkEvent::Auction(a)) => match name {
                "id" => a.id,
                "seller" => a.seller,
                "category" => a.category,
                "initial_bid" => a.initial_bid,
                "reserve" => a.reserve,
                "expires" => a.expires,
                _ => a.date_time,
            },
            (ProjectedKind::Persons, NexmarkEvent::Person(p)) => match name {
                "id" => p.id,
                _ => p.date_time,
            },
            _ => return None,
        })
    }

    /// About how many records `config`'s sequence makes (its events of this kind, by the
    /// proportions; `None`: endless): what a progress bar counts toward.
    pub fn expected_records(&self, config: &NexmarkConfig) -> Option<u64> {
        let part = match self.kind {
            ProjectedKind::Persons => config.person_proportion,
            ProjectedKind::Auctions => config.auction_proportion,
            ProjectedKind::Bids => config.bid_proportion,
        };
        let whole = config.person_proportion + config.auction_proportion + config.bid_proportion;
        config.events.map(|n| (n as u128 * part as u128 / whole.max(1) as u128) as u64)
    }

    /// The record of the event at `offset`, if it is of this projection's kind.
    pub fn project(&self, offset: u64, e: &NexmarkEvent) -> Option<Event> {
        Some(Event {
            key: self.field(e, self.key)?,
            value: self.field(e, self.value)?,
            time_ns: e.date_time_ns(),
            seq: offset,
        })
    }
}

impl NexmarkConfig {
    /// The keys of a Nexmark source's section.
    pub const KEYS: &'static [Key] = &[
        Key::new("events", T::Integer, "endless", "Events in all (persons, auctions and bids together), then the source ends."),
        Key::new("rate", T::Integer, "10000", "Events per second of event time: `first_rate` and `next_rate` both."),
        Key::new("first_rate", T::Integer, "`rate`", "Events per second of event time at first (Flink's `first-event.rate`)."),
        Key::new("next_rate", T::Integer, "`rate`", "Events per second of event time after the first change (`next-event.rate`)."),
        Key::new("rate_shape", T::String, "sine", "How the rate moves between the two: `square` or `sine` (matters when they differ)."),
        Key::new("rate_period_s", T::Integer, "600", "The period of the rate's shape."),
        Key::new("sine_approx_steps", T::Integer, "10", "Steps of the sine shape's approximation."),
        Key::new("rate_limited", T::Boolean, "false", "Emit no faster than the events' times say; `false`: as fast as the job takes them (the event times are the same).")
            .affects(Affects::Latency),
        Key::new("base_time_ms", T::Integer, "now", "The first event's time, ms since the Unix epoch (set it for the same events run after run)."),
        Key::new("person_proportion", T::Integer, "1", "Of every `person + auction + bid` events, this many are persons."),
        Key::new("auction_proportion", T::Integer, "3", "... this many auctions."),
        Key::new("bid_proportion", T::Integer, "46", "... and this many bids."),
        Key::new("avg_person_bytes", T::Integer, "200", "Average bytes of a person."),
        Key::new("avg_auction_bytes", T::Integer, "500", "Average bytes of an auction."),
        Key::new("avg_bid_bytes", T::Integer, "100", "Average bytes of a bid."),
        Key::new("hot_seller_ratio", T::Integer, "4", "1 in this many auctions is by a random seller, the rest by a hot one."),
        Key::new("hot_auction_ratio", T::Integer, "2", "1 in this many bids is on a random auction, the rest on a hot one."),
        Key::new("hot_bidder_ratio", T::Integer, "4", "1 in this many bids is by a random bidder, the rest by a hot one."),
        Key::new("hot_channel_ratio", T::Integer, "2", "1 in this many bids comes through a random channel, the rest through a hot one."),
        Key::new("active_people", T::Integer, "1000", "Persons considered active (who sell and bid)."),
        Key::new("in_flight_auctions", T::Integer, "100", "Auctions open at any time, on average."),
        Key::new("out_of_order_group_size", T::Integer, "1", "Events shuffled within groups of this many (1: in order); keep a group's span of event time under the watermark's bound.")
            .affects(Affects::Results),
        Key::new("num_categories", T::Integer, "5", "Auction categories."),
        Key::new("first_event_id", T::Integer, "0", "The first event's id (each event's random choices are seeded by it)."),
        Key::new("first_event_number", T::Integer, "0", "The first event's number (its time and kind follow from it)."),
        Key::new("first_auction_id", T::Integer, "1000", "The first auction's id."),
        Key::new("first_person_id", T::Integer, "1000", "The first person's id."),
        Key::new("first_category_id", T::Integer, "10", "The first category's id."),
        Key::new("auction_id_lead", T::Integer, "10", "How far ahead of the newest auction a bid may name one."),
        Key::new("person_id_lead", T::Integer, "10", "How far ahead of the newest person a bid or auction may name one."),
        Key::new("num_event_generators", T::Integer, "1", "Generators the timeline is spread over (each event's delay is multiplied by it)."),
        Key::new("us_per_unit", T::Integer, "1000000", "Microseconds per unit of `1 / rate` (1,000,000: rates are per second)."),
        Key::new("emit", T::String, "bids", "Which events become records: `bids`, `auctions` or `persons`."),
        Key::new("key", T::String, "a bid's `auction`, an auction's or person's `id`", "The event field that becomes the record's key: a bid's `auction`, `bidder`, `price`, `date_time`; an auction's `id`, `seller`, `category`, `initial_bid`, `reserve`, `expires`, `date_time`; a person's `id`, `date_time`.")
            .affects(Affects::Results),
        Key::new("value", T::String, "a bid's `price`, an auction's `category`, a person's `id`", "The event field that becomes the record's value (the same fields as `key`).")
            .affects(Affects::Results),
    ];

    /// Read a Nexmark source's section: the generator's settings and what to emit.
    pub fn from_section(s: &mut Section) -> Result<(NexmarkConfig, EventProjection), JobFileError> {
        let mut c = NexmarkConfig::default();
        let mut spans = Vec::new();
        c.events = s.take::<u64>("events")?.map(|v| v.into_inner());
        if let Some(rate) = s.take::<u64>("rate")? {
            spans.push(("rate", rate.span()));
            (c.first_rate, c.next_rate) = (*rate.get_ref(), *rate.get_ref());
        }
        if let Some(shape) = s.take::<String>("rate_shape")? {
            c.rate_shape = match shape.get_ref().as_str() {
                "square" => RateShape::Square,
                "sine" => RateShape::Sine,
                other => {
                    return Err(s.err(
                        shape.span(),
                        "rate_shape",
                        format!("unknown shape `{other}`; use square or sine"),
                    ));
                }
            };
        }
        if let Some(v) = s.take::<bool>("rate_limited")? {
            c.rate_limited = v.into_inner();
        }
        // `first_rate` and `next_rate` come after `rate`: the last word is theirs.
        for (key, field) in c.numbers() {
            if let Some(v) = s.take::<u64>(key)? {
                spans.push((key, v.span()));
                *field = v.into_inner();
            }
        }
        if let Err((field, problem)) = c.check() {
            let span = spans.iter().find(|(k, _)| *k == field).map_or_else(|| s.kind_span(), |(_, sp)| sp.clone());
            return Err(s.err(span, field, format!("`{field}`: {problem}")));
        }
        let kind = match s.take::<String>("emit")? {
            None => ProjectedKind::Bids,
            Some(k) => match k.get_ref().as_str() {
                "bids" => ProjectedKind::Bids,
                "auctions" => ProjectedKind::Auctions,
                "persons" => ProjectedKind::Persons,
                other => {
                    return Err(s.err(
                        k.span(),
                        "emit",
                        format!("unknown events `{other}`; use bids, auctions or persons"),
                    ));
                }
            },
        };
        let fields = EventProjection::fields(kind);
        let (key_default, value_default) = match kind {
            ProjectedKind::Bids => ("auction", "price"),
            ProjectedKind::Auctions => ("id", "category"),
            ProjectedKind::Persons => ("id", "id"),
        };
        let pick = |s: &mut Section, name: &'static str, default: &'static str| -> Result<&'static str, JobFileError> {
            match s.take::<String>(name)? {
                None => Ok(default),
                Some(f) => fields.iter().copied().find(|x| *x == f.get_ref()).ok_or_else(|| {
                    s.err(
                        f.span(),
                        name,
                        format!("`{}` is not a field of these events; use one of {}", f.get_ref(), fields.join(", ")),
                    )
                }),
            }
        };
        let key = pick(s, "key", key_default)?;
        let value = pick(s, "value", value_default)?;
        Ok((c, EventProjection { kind, key, value }))
    }
}
