//! Every setting of the `nexmark` crate's generator, with its defaults, checked before a
//! job starts (a bad setting would otherwise panic inside the generator, in a source thread).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How the event rate moves between `first_rate` and `next_rate` (when they differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateShape {
    /// Alternate between the two rates every half period.
    Square,
    /// Follow a cosine between them over the period, in `sine_approx_steps` steps (the
    /// crate's default).
    #[default]
    Sine,
}

/// A Nexmark source's settings: how many events, at what (event-time) rate, and the
/// generator's own knobs. The defaults are the `nexmark` crate's (Flink's suite overrides the
/// rates: 10 M events/s, and `events` 10^8), except `base_time_ms`, which is the wall clock
/// when the configuration is made — give one to get the same events on every run.
///
/// Subtask `i` of `p` generates the sequence's events `i, i + p, i + 2p, ...` (the crate's
/// offset and step): each event once over the job, each subtask's in sequence order.
#[derive(Debug, Clone)]
pub struct NexmarkConfig {
    /// Events in all (persons, auctions and bids together); `None`: endless.
    pub events: Option<u64>,
    /// Event time of the first event, ms since the Unix epoch.
    pub base_time_ms: u64,
    /// Events per second of event time at first (`first-event.rate` in Flink's suite).
    pub first_rate: u64,
    /// Events per second of event time after the first change (`next-event.rate`).
    pub next_rate: u64,
    /// How the rate moves between the two.
    pub rate_shape: RateShape,
    /// The period of the rate's shape, s.
    pub rate_period_s: u64,
    /// Steps of the sine shape's approximation.
    pub sine_approx_steps: u64,
    /// Emit no faster than the events' times say (Flink's `rate.limited`): an event is
    /// emitted once the wall clock since the source started has passed its time since
    /// `base_time_ms`. `false`: as fast as the job takes them (the event times are the same).
    pub rate_limited: bool,
    /// Of every `person + auction + bid` events, this many are persons ...
    pub person_proportion: u64,
    /// ... this many auctions ...
    pub auction_proportion: u64,
    /// ... and this many bids (1 : 3 : 46 by default: 2 %, 6 %, 92 %).
    pub bid_proportion: u64,
    /// Average bytes of a person (its `extra` pads up to it).
    pub avg_person_bytes: u64,
    /// Average bytes of an auction.
    pub avg_auction_bytes: u64,
    /// Average bytes of a bid.
    pub avg_bid_bytes: u64,
    /// 1 in this many auctions is by a random seller; the rest by a hot one.
    pub hot_seller_ratio: u64,
    /// 1 in this many bids is on a random auction; the rest on a hot one.
    pub hot_auction_ratio: u64,
    /// 1 in this many bids is by a random bidder; the rest by a hot one.
    pub hot_bidder_ratio: u64,
    /// 1 in this many bids comes through a random channel; the rest through a hot one.
    pub hot_channel_ratio: u64,
    /// Persons considered active (who sell and bid).
    pub active_people: u64,
    /// Auctions open at any time, on average.
    pub in_flight_auctions: u64,
    /// Events are emitted in pseudo-random order within groups of this many (1: in order).
    /// An event may then come up to a group's span of event time after a later one: keep that
    /// under the watermark's bound, or windows count such events as late.
    pub out_of_order_group_size: u64,
    /// Auction categories (`first_category_id ..`).
    pub num_categories: u64,
    /// The first event's id (each event's random choices are seeded by its id).
    pub first_event_id: u64,
    /// The first event's number (its time and kind follow from it).
    pub first_event_number: u64,
    /// The first auction's id.
    pub first_auction_id: u64,
    /// The first person's id.
    pub first_person_id: u64,
    /// The first category's id.
    pub first_category_id: u64,
    /// A bid may name an auction up to this many ahead of the newest (one not opened yet).
    pub auction_id_lead: u64,
    /// A bid or auction may name a person up to this many ahead of the newest.
    pub person_id_lead: u64,
    /// Generators the timeline is spread over (each event's delay is multiplied by it).
    pub num_event_generators: u64,
    /// Microseconds per unit of `1 / rate` (1,000,000: rates are per second).
    pub us_per_unit: u64,
    /// What every source subtask made from this configuration adds up, readable while and
    /// after the job runs.
    pub stats: Arc<NexmarkStats>,
}

/// What a Nexmark source's subtasks add up.
#[derive(Debug, Default)]
pub struct NexmarkStats {
    /// Events emitted.
    pub events: AtomicU64,
    /// CPU time the subtasks spent in the generator (making events and dropping them after
    /// they were emitted), ns: what a benchmark takes off the job's CPU time to count the
    /// engine alone.
    pub generator_cpu_ns: AtomicU64,
}

impl NexmarkStats {
    /// CPU time spent in the generator so far.
    pub fn generator_cpu(&self) -> Duration {
        Duration::from_nanos(self.generator_cpu_ns.load(Ordering::Relaxed))
    }

    /// Events emitted so far.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }
}

impl Default for NexmarkConfig {
    fn default() -> NexmarkConfig {
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        NexmarkConfig {
            events: None,
            base_time_ms: now_ms,
            first_rate: 10_000,
            next_rate: 10_000,
            rate_shape: RateShape::Sine,
            rate_period_s: 600,
            sine_approx_steps: 10,
            rate_limited: false,
            person_proportion: 1,
            auction_proportion: 3,
            bid_proportion: 46,
            avg_person_bytes: 200,
            avg_auction_bytes: 500,
            avg_bid_bytes: 100,
            hot_seller_ratio: 4,
            hot_auction_ratio: 2,
            hot_bidder_ratio: 4,
            hot_channel_ratio: 2,
            active_people: 1000,
            in_flight_auctions: 100,
            out_of_order_group_size: 1,
            num_categories: 5,
            first_event_id: 0,
            first_event_number: 0,
            first_auction_id: 1000,
            first_person_id: 1000,
            first_category_id: 10,
            auction_id_lead: 10,
            person_id_lead: 10,
            num_event_generators: 1,
            us_per_unit: 1_000_000,
            stats: Arc::default(),
        }
    }
}

/// Largest value a setting may take: the generator works in `usize` and `f32`, and sums
/// settings; a bound far below where that overflows.
const LARGE: u64 = 1 << 40;

impl NexmarkConfig {
    /// `events` events at `rate` events per second from `base_time_ms`, the rest default.
    pub fn new(events: Option<u64>, rate: u64, base_time_ms: u64) -> NexmarkConfig {
        NexmarkConfig { events, first_rate: rate, next_rate: rate, base_time_ms, ..NexmarkConfig::default() }
    }

    /// The settings that cannot work, with the setting's name: `Err((field, problem))`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let at_least_one: [(&'static str, u64); 17] = [
            ("first_rate", self.first_rate),
            ("next_rate", self.next_rate),
            ("rate_period_s", self.rate_period_s),
            ("sine_approx_steps", self.sine_approx_steps),
            ("person_proportion", self.person_proportion),
            ("auction_proportion", self.auction_proportion),
            ("bid_proportion", self.bid_proportion),
            ("hot_seller_ratio", self.hot_seller_ratio),
            ("hot_auction_ratio", self.hot_auction_ratio),
            ("hot_bidder_ratio", self.hot_bidder_ratio),
            ("hot_channel_ratio", self.hot_channel_ratio),
            ("active_people", self.active_people),
            ("in_flight_auctions", self.in_flight_auctions),
            ("out_of_order_group_size", self.out_of_order_group_size),
            ("num_categories", self.num_categories),
            ("num_event_generators", self.num_event_generators),
            ("us_per_unit", self.us_per_unit),
        ];
        for (field, v) in at_least_one {
            if v == 0 {
                return Err((field, "must be at least 1 (the generator divides by it or draws from 0..it)".to_owned()));
            }
        }
        let all = [
            ("first_rate", self.first_rate),
            ("next_rate", self.next_rate),
            ("rate_period_s", self.rate_period_s),
            ("sine_approx_steps", self.sine_approx_steps),
            ("person_proportion", self.person_proportion),
            ("auction_proportion", self.auction_proportion),
            ("bid_proportion", self.bid_proportion),
            ("avg_person_bytes", self.avg_person_bytes),
            ("avg_auction_bytes", self.avg_auction_bytes),
            ("avg_bid_bytes", self.avg_bid_bytes),
            ("active_people", self.active_people),
            ("in_flight_auctions", self.in_flight_auctions),
            ("out_of_order_group_size", self.out_of_order_group_size),
            ("num_categories", self.num_categories),
            ("first_event_id", self.first_event_id),
            ("first_event_number", self.first_event_number),
            ("first_auction_id", self.first_auction_id),
            ("first_person_id", self.first_person_id),
            ("first_category_id", self.first_category_id),
            ("auction_id_lead", self.auction_id_lead),
            ("person_id_lead", self.person_id_lead),
            ("num_event_generators", self.num_event_generators),
            ("us_per_unit", self.us_per_unit),
        ];
        for (field, v) in all {
            if v > LARGE {
                return Err((field, format!("{v} is more than the generator can use (at most 2^40)")));
            }
        }
        for (field, v) in [("avg_person_bytes", self.avg_person_bytes), ("avg_auction_bytes", self.avg_auction_bytes)] {
            if v > 1 << 20 {
                return Err((field, format!("{v} bytes an event is more than a ring record may hold (1 MiB here)")));
            }
        }
        if self.avg_bid_bytes > 1 << 20 {
            return Err(("avg_bid_bytes", "more than a ring record may hold (1 MiB here)".to_owned()));
        }
        if self.base_time_ms > u64::MAX / 4_000_000 {
            return Err(("base_time_ms", format!("{} ms is past what event times in ns can hold", self.base_time_ms)));
        }
        if self.first_rate != self.next_rate {
            // The crate finds an event's time by walking the shape's cycles, and returns 0 (the
            // Unix epoch) for an event past a cycle that is not longer than an out-of-order
            // group; a cycle of no events divides by zero.
            let cycles = self.cycle_events();
            if cycles.contains(&0) {
                return Err((
                    "rate_period_s",
                    format!(
                        "a step of the rate's shape ({} s over {} steps) holds no event at these rates; give a longer period or higher rates",
                        self.rate_period_s,
                        self.steps()
                    ),
                ));
            }
            if cycles.iter().any(|&n| self.out_of_order_group_size >= n) {
                return Err((
                    "out_of_order_group_size",
                    format!(
                        "with changing rates the generator needs out-of-order groups shorter than a step of the rate's shape ({} events); give a smaller group",
                        cycles.iter().min().copied().unwrap_or(0)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Steps in one period of the rate's shape.
    fn steps(&self) -> u64 {
        match self.rate_shape {
            RateShape::Square => 2,
            RateShape::Sine => self.sine_approx_steps,
        }
    }

    /// Events in each step of the rate's shape, as the crate counts them (changing rates).
    fn cycle_events(&self) -> Vec<u64> {
        let generators = self.num_event_generators as f32;
        let delay = |rate: u64| self.us_per_unit as f32 / rate as f32 * generators;
        let delays: Vec<f32> = match self.rate_shape {
            RateShape::Square => vec![delay(self.first_rate), delay(self.next_rate)],
            RateShape::Sine => {
                let mid = (self.first_rate + self.next_rate) as f64 / 2.0;
                let amp = (self.first_rate as f64 - self.next_rate as f64) / 2.0;
                (0..self.sine_approx_steps)
                    .map(|i| {
                        let r = 2.0 * std::f64::consts::PI * i as f64 / self.sine_approx_steps as f64;
                        delay((mid + amp * r.cos()).round() as u64)
                    })
                    .collect()
            }
        };
        let step_length = self.rate_period_s.div_ceil(self.steps());
        delays.iter().map(|d| ((step_length * 1_000_000) as f32 / d).round() as u64).collect()
    }

    /// Every numeric setting by its name (a job file's key): what [`NexmarkConfig::set`] and
    /// the job-file reader write. `first_rate` and `next_rate` come first, so a `rate`
    /// given with them is overridden.
    pub(crate) fn numbers(&mut self) -> [(&'static str, &mut u64); 28] {
        [
            ("first_rate", &mut self.first_rate),
            ("next_rate", &mut self.next_rate),
            ("rate_period_s", &mut self.rate_period_s),
            ("sine_approx_steps", &mut self.sine_approx_steps),
            ("base_time_ms", &mut self.base_time_ms),
            ("person_proportion", &mut self.person_proportion),
            ("auction_proportion", &mut self.auction_proportion),
            ("bid_proportion", &mut self.bid_proportion),
            ("avg_person_bytes", &mut self.avg_person_bytes),
            ("avg_auction_bytes", &mut self.avg_auction_bytes),
            ("avg_bid_bytes", &mut self.avg_bid_bytes),
            ("hot_seller_ratio", &mut self.hot_seller_ratio),
            ("hot_auction_ratio", &mut self.hot_auction_ratio),
            ("hot_bidder_ratio", &mut self.hot_bidder_ratio),
            ("hot_channel_ratio", &mut self.hot_channel_ratio),
            ("active_people", &mut self.active_people),
            ("in_flight_auctions", &mut self.in_flight_auctions),
            ("out_of_order_group_size", &mut self.out_of_order_group_size),
            ("num_categories", &mut self.num_categories),
            ("first_event_id", &mut self.first_event_id),
            ("first_event_number", &mut self.first_event_number),
            ("first_auction_id", &mut self.first_auction_id),
            ("first_person_id", &mut self.first_person_id),
            ("first_category_id", &mut self.first_category_id),
            ("auction_id_lead", &mut self.auction_id_lead),
            ("person_id_lead", &mut self.person_id_lead),
            ("num_event_generators", &mut self.num_event_generators),
            ("us_per_unit", &mut self.us_per_unit),
        ]
    }

    /// Set the setting a job file calls `key` from its text (`events`, `rate`, `rate_shape`,
    /// `rate_limited` and every numeric one): for command lines (`weir-bench nexmark --set
    /// key=value`). Call [`NexmarkConfig::check`] after the last one.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), SetError> {
        let number = || {
            value.trim().replace('_', "").parse::<u64>().map_err(|source| SetError::Number {
                key: key.to_owned(),
                value: value.to_owned(),
                source,
            })
        };
        match key {
            "events" => self.events = if value == "endless" { None } else { Some(number()?) },
            "rate" => (self.first_rate, self.next_rate) = (number()?, number()?),
            "rate_shape" => {
                self.rate_shape = match value {
                    "square" => RateShape::Square,
                    "sine" => RateShape::Sine,
                    _ => return Err(SetError::RateShape { value: value.to_owned() }),
                }
            }
            "rate_limited" => {
                self.rate_limited = value.parse().map_err(|_| SetError::RateLimited { value: value.to_owned() })?
            }
            _ => {
                let n = number();
                match self.numbers().into_iter().find(|(k, _)| *k == key) {
                    Some((_, field)) => *field = n?,
                    None => {
                        let known: Vec<&'static str> = NexmarkConfig::KEYS
                            .iter()
                            .map(|k| k.name)
                            .filter(|k| !["emit", "key", "value"].contains(k))
                            .collect();
                        return Err(SetError::Unknown { key: key.to_owned(), known });
                    }
                }
            }
        }
        Ok(())
    }

    /// The crate's configuration.
    pub(crate) fn generator(&self) -> nexmark::config::NexmarkConfig {
        let u = |v: u64| v as usize;
        nexmark::config::NexmarkConfig {
            active_people: u(self.active_people),
            in_flight_auctions: u(self.in_flight_auctions),
            out_of_order_group_size: u(self.out_of_order_group_size),
            avg_person_byte_size: u(self.avg_person_bytes),
            avg_auction_byte_size: u(self.avg_auction_bytes),
            avg_bid_byte_size: u(self.avg_bid_bytes),
            hot_seller_ratio: u(self.hot_seller_ratio),
            hot_auction_ratio: u(self.hot_auction_ratio),
            hot_bidder_ratio: u(self.hot_bidder_ratio),
            hot_channel_ratio: u(self.hot_channel_ratio),
            first_event_id: u(self.first_event_id),
            first_event_number: u(self.first_event_number),
            base_time: self.base_time_ms,
            num_categories: u(self.num_categories),
            auction_id_lead: u(self.auction_id_lead),
            person_proportion: u(self.person_proportion),
            auction_proportion: u(self.auction_proportion),
            bid_proportion: u(self.bid_proportion),
            first_auction_id: u(self.first_auction_id),
            first_person_id: u(self.first_person_id),
            first_category_id: u(self.first_category_id),
            person_id_lead: u(self.person_id_lead),
            sine_approx_steps: u(self.sine_approx_steps),
            num_event_generators: u(self.num_event_generators),
            rate_shape: match self.rate_shape {
                RateShape::Square => nexmark::config::RateShape::Square,
                RateShape::Sine => nexmark::config::RateShape::Sine,
            },
            rate_period: u(self.rate_period_s),
            first_rate: u(self.first_rate),
            next_rate: u(self.next_rate),
            us_per_unit: u(self.us_per_unit),
            ..nexmark::config::NexmarkConfig::default()
        }
    }

    /// The whole sequence's events, in order, on this thread (what a job's sources emit
    /// together, in the order one subtask alone would): for references and tests. Endless
    /// sequences are cut at `limit`.
    pub fn events_in_order(&self, limit: u64) -> impl Iterator<Item = super::NexmarkEvent> + use<> {
        let n = self.events.unwrap_or(u64::MAX).min(limit);
        nexmark::EventGenerator::new(self.generator()).take(n as usize).map(super::NexmarkEvent::from)
    }
}

/// Why [`NexmarkConfig::set`] refused a setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SetError {
    /// A numeric setting whose value is not a number.
    #[error("{key}: `{value}`: {source}")]
    Number {
        /// The setting.
        key: String,
        /// Its value.
        value: String,
        /// What the parse said.
        #[source]
        source: std::num::ParseIntError,
    },
    /// `rate_shape` other than `square` or `sine`.
    #[error("rate_shape: `{value}`: use square or sine")]
    RateShape {
        /// The value given.
        value: String,
    },
    /// `rate_limited` other than `true` or `false`.
    #[error("rate_limited: `{value}`: use true or false")]
    RateLimited {
        /// The value given.
        value: String,
    },
    /// A key that is no generator setting.
    #[error("`{key}` is not a generator setting; use one of {}", known.join(", "))]
    Unknown {
        /// The key given.
        key: String,
        /// The settings there are.
        known: Vec<&'static str>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeros the generator would divide by or draw from are refused by name, as are rates
    /// whose shape leaves the crate without a time for some events.
    #[test]
    fn bad_settings_are_named() {
        assert!(NexmarkConfig::default().check().is_ok());
        let zero = NexmarkConfig { hot_auction_ratio: 0, ..NexmarkConfig::default() };
        assert_eq!(zero.check().unwrap_err().0, "hot_auction_ratio");
        let group = NexmarkConfig {
            first_rate: 1000,
            next_rate: 2000,
            rate_period_s: 10,
            out_of_order_group_size: 100_000,
            ..NexmarkConfig::default()
        };
        assert_eq!(group.check().unwrap_err().0, "out_of_order_group_size");
        let varying = NexmarkConfig { first_rate: 1000, next_rate: 2000, ..NexmarkConfig::default() };
        assert!(varying.check().is_ok());
        let late = NexmarkConfig { base_time_ms: u64::MAX / 2, ..NexmarkConfig::default() };
        assert_eq!(late.check().unwrap_err().0, "base_time_ms");
    }

    /// Settings by name, as command lines give them; an unknown name lists the known ones.
    #[test]
    fn settings_by_name() {
        let mut c = NexmarkConfig::default();
        c.set("rate", "1_000").unwrap();
        c.set("next_rate", "2000").unwrap();
        c.set("events", "5000").unwrap();
        c.set("rate_shape", "square").unwrap();
        c.set("hot_auction_ratio", "1").unwrap();
        assert_eq!((c.first_rate, c.next_rate, c.events, c.hot_auction_ratio), (1000, 2000, Some(5000), 1));
        assert_eq!(c.rate_shape, RateShape::Square);
        let err = c.set("hot_auctions", "1").unwrap_err().to_string();
        assert!(err.contains("not a generator setting") && err.contains("hot_auction_ratio"), "{err}");
        assert!(c.set("rate", "fast").is_err());
    }
}
