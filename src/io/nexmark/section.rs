//! A Nexmark source's job-file section (`type = "nexmark"`): every generator setting, and
//! which events become the job file's records and how.
//!
//! | key | default | what |
//! |---|---|---|
//! | `events` | endless | events in all (persons, auctions and bids) |
//! | `rate` | 10000 | events per second of event time: `first_rate` and `next_rate` both |
//! | `first_rate`, `next_rate` | `rate` | the two rates the shape moves between |
//! | `rate_shape` | `"sine"` | `"square"` or `"sine"` (matters when the rates differ) |
//! | `rate_period_s`, `sine_approx_steps` | 600, 10 | the shape's period and steps |
//! | `rate_limited` | false | emit no faster than the event times say |
//! | `base_time_ms` | now | the first event's time, ms since the Unix epoch |
//! | `person_proportion`, `auction_proportion`, `bid_proportion` | 1, 3, 46 | the mix |
//! | `avg_person_bytes`, `avg_auction_bytes`, `avg_bid_bytes` | 200, 500, 100 | sizes |
//! | `hot_seller_ratio`, `hot_auction_ratio`, `hot_bidder_ratio`, `hot_channel_ratio` | 4, 2, 4, 2 | 1 in n is random, the rest hot |
//! | `active_people`, `in_flight_auctions` | 1000, 100 | |
//! | `out_of_order_group_size` | 1 | events shuffled within groups of this many |
//! | `num_categories` | 5 | |
//! | `first_event_id`, `first_event_number` | 0, 0 | where the sequence starts |
//! | `first_auction_id`, `first_person_id`, `first_category_id` | 1000, 1000, 10 | |
//! | `auction_id_lead`, `person_id_lead` | 10, 10 | how far ahead a bid may name an auction or person |
//! | `num_event_generators`, `us_per_unit` | 1, 1000000 | |
//! | `emit` | `"bids"` | which events become records: `bids`, `auctions` or `persons` |
//! | `key`, `value` | see below | the event's fields that become the record's key and value |
//!
//! Fields: a bid's `auction` (default key), `bidder`, `price` (default value), `date_time`;
//! an auction's `id` (default key), `seller`, `category` (default value), `initial_bid`,
//! `reserve`, `expires`, `date_time`; a person's `id` (default key and value), `date_time`.
//! A record's `time_ns` is the event's time in ns, its `seq` the event's offset in the
//! sequence (unique, so sinks can check for loss and duplicates).

use super::{NexmarkConfig, NexmarkEvent, RateShape};
use crate::record::Event;
use crate::util::section::{JobFileError, Section};

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
    pub const KEYS: &'static [&'static str] = &[
        "events",
        "rate",
        "first_rate",
        "next_rate",
        "rate_shape",
        "rate_period_s",
        "sine_approx_steps",
        "rate_limited",
        "base_time_ms",
        "person_proportion",
        "auction_proportion",
        "bid_proportion",
        "avg_person_bytes",
        "avg_auction_bytes",
        "avg_bid_bytes",
        "hot_seller_ratio",
        "hot_auction_ratio",
        "hot_bidder_ratio",
        "hot_channel_ratio",
        "active_people",
        "in_flight_auctions",
        "out_of_order_group_size",
        "num_categories",
        "first_event_id",
        "first_event_number",
        "first_auction_id",
        "first_person_id",
        "first_category_id",
        "auction_id_lead",
        "person_id_lead",
        "num_event_generators",
        "us_per_unit",
        "emit",
        "key",
        "value",
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
