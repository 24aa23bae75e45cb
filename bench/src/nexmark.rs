//! Nexmark on weir: the queries written with the public API as a user would write them,
//! over events from the `nexmark` crate (Flink's generator, ported), each checked exactly
//! against a plain single-threaded reference over the same events.
//!
//! Events are generated before timing (`base_time` fixed, so every run sees the same
//! events; Flink's 10 M events/s rate for the event times; persons : auctions : bids
//! 1 : 3 : 46 from one sequence) into a fixed-size 64-byte record, [`NxEvent`], and the
//! sources replay them; the generator's CPU is reported apart. Strings (names, channel,
//! url, extra) are not carried: the queries built so far read none of them.
//!
//! Built: q0 (pass-through of bids), q1 (prices in euro), q2 (bids of auctions whose id is
//! a multiple of 123), each at parallelism 1 and 2 (sources, operators and sink alike; the
//! operators chain into their source, as Flink chains them). Not built: q3, q4, q5, q7, q8
//! (joins with windows, two-phase aggregates, top-N): they are reported as not run.
//!
//! Each query's output is folded into an order-independent digest (count, and the wrapping
//! sum of a 64-bit hash of each record's bytes) and compared with the reference's.

use crate::measure::{Cost, measure};
use crate::report::{Row, Section};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use weir::graph::Job;
use weir::operators::builtin::Generator;
use weir::operators::{Halt, Sink};
use weir::record::hash_key;

/// A Nexmark event in a fixed layout: `kind` says which fields mean what.
///
/// | field | person | auction | bid |
/// |---|---|---|---|
/// | id | id | id | auction |
/// | a | – | seller | bidder |
/// | b | – | category | price |
/// | c | – | initial bid | – |
/// | d | – | reserve | – |
/// | expires | – | expires | – |
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
#[repr(C)]
pub struct NxEvent {
    /// [`PERSON`], [`AUCTION`] or [`BID`].
    pub kind: u64,
    /// See the table.
    pub id: u64,
    /// See the table.
    pub a: u64,
    /// See the table.
    pub b: u64,
    /// See the table.
    pub c: u64,
    /// See the table.
    pub d: u64,
    /// Event time, ms since the epoch.
    pub date_time: u64,
    /// See the table.
    pub expires: u64,
}

weir::fixed_record!(NxEvent);

/// `NxEvent::kind` of a person.
pub const PERSON: u64 = 0;
/// `NxEvent::kind` of an auction.
pub const AUCTION: u64 = 1;
/// `NxEvent::kind` of a bid.
pub const BID: u64 = 2;

/// q0's and q1's output: a bid (q1: price in euro, `price_eur`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
#[repr(C)]
pub struct NxBid {
    /// The auction bid on.
    pub auction: u64,
    /// Who bid.
    pub bidder: u64,
    /// Price in dollars (q0), or 0 (q1).
    pub price: u64,
    /// `0.908 × price` (q1), or 0 (q0).
    pub price_eur: f64,
    /// Event time, ms.
    pub date_time: u64,
}

/// q2's output.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
#[repr(C)]
pub struct NxAuctionPrice {
    /// The auction.
    pub auction: u64,
    /// The bid's price.
    pub price: u64,
}

weir::fixed_record!(NxBid, NxAuctionPrice);

/// The fixed `base_time` (ms) of every run: 2025-01-01T00:00:00Z.
pub const BASE_TIME_MS: u64 = 1_735_689_600_000;

/// `n` events from the `nexmark` crate's generator (Flink's defaults, 10 M events/s).
pub fn generate(n: usize) -> Vec<NxEvent> {
    let config = nexmark::config::NexmarkConfig {
        base_time: BASE_TIME_MS,
        first_rate: 10_000_000,
        next_rate: 10_000_000,
        ..Default::default()
    };
    nexmark::EventGenerator::new(config)
        .take(n)
        .map(|e| match e {
            nexmark::event::Event::Person(p) => {
                NxEvent { kind: PERSON, id: p.id as u64, date_time: p.date_time, ..NxEvent::default() }
            }
            nexmark::event::Event::Auction(a) => NxEvent {
                kind: AUCTION,
                id: a.id as u64,
                a: a.seller as u64,
                b: a.category as u64,
                c: a.initial_bid as u64,
                d: a.reserve as u64,
                date_time: a.date_time,
                expires: a.expires,
            },
            nexmark::event::Event::Bid(b) => NxEvent {
                kind: BID,
                id: b.auction as u64,
                a: b.bidder as u64,
                b: b.price as u64,
                date_time: b.date_time,
                ..NxEvent::default()
            },
        })
        .collect()
}

/// q0's projection of a bid.
fn q0_bid(e: &NxEvent) -> NxBid {
    NxBid { auction: e.id, bidder: e.a, price: e.b, price_eur: 0.0, date_time: e.date_time }
}

/// q1's projection: the price in euro.
fn q1_bid(e: &NxEvent) -> NxBid {
    NxBid { auction: e.id, bidder: e.a, price: 0, price_eur: 0.908 * e.b as f64, date_time: e.date_time }
}

/// q2's filter.
fn q2_keep(e: &NxEvent) -> bool {
    e.kind == BID && e.id.is_multiple_of(123)
}

/// An order-independent digest of a stream of fixed records: how many, and the wrapping sum
/// of a hash of each one's bytes.
#[derive(Debug, Default)]
pub struct Digest {
    count: AtomicU64,
    sum: AtomicU64,
}

impl Digest {
    /// (count, sum).
    pub fn get(&self) -> (u64, u64) {
        (self.count.load(Ordering::Relaxed), self.sum.load(Ordering::Relaxed))
    }
}

/// The digest of `records`.
fn digest_of<T: zerocopy::IntoBytes + zerocopy::Immutable>(records: impl Iterator<Item = T>) -> (u64, u64) {
    records.fold((0, 0), |(n, s), r| (n + 1, s.wrapping_add(hash_key(r.as_bytes()))))
}

/// A sink that folds what it receives into a shared [`Digest`] (per subtask, added at the end).
#[derive(Debug)]
pub struct DigestSink {
    into: Arc<Digest>,
    count: u64,
    sum: u64,
}

impl DigestSink {
    /// Fold into `into`.
    pub fn new(into: Arc<Digest>) -> DigestSink {
        DigestSink { into, count: 0, sum: 0 }
    }
}

impl<T: zerocopy::IntoBytes + zerocopy::Immutable> Sink<T> for DigestSink {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        self.count += 1;
        self.sum = self.sum.wrapping_add(hash_key(record.as_bytes()));
        Ok(())
    }
    fn finish(&mut self) -> Result<(), Halt> {
        self.into.count.fetch_add(self.count, Ordering::Relaxed);
        self.into.sum.fetch_add(self.sum, Ordering::Relaxed);
        Ok(())
    }
}

/// The queries built so far.
pub const QUERIES: [&str; 3] = ["q0", "q1", "q2"];
/// The queries of the suite not built yet.
pub const NOT_BUILT: [&str; 5] = ["q3", "q4", "q5", "q7", "q8"];

/// Query `q` as a job over `events` at parallelism `p`, its output into `digest`.
pub fn job(q: &str, events: &Arc<Vec<NxEvent>>, p: u32, digest: Arc<Digest>) -> Job {
    let job = Job::new(&format!("nexmark-{q}-p{p}"));
    let n = events.len() as u64;
    let events = events.clone();
    let source = job.source("events", p, move |info| {
        let events = events.clone();
        Generator::new(info, Some(n), move |seq| events[seq as usize])
    });
    let sink = move |_: &weir::operators::SubtaskInfo| DigestSink::new(digest.clone());
    match q {
        // SELECT auction, bidder, price, dateTime FROM bid
        "q0" => source.filter("bids", |e: &NxEvent| e.kind == BID).map("project", q0_bid).sink("out", p, sink),
        // SELECT auction, bidder, 0.908 * price AS price, dateTime FROM bid
        "q1" => source.filter("bids", |e: &NxEvent| e.kind == BID).map("euro", q1_bid).sink("out", p, sink),
        // SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0
        "q2" => source
            .filter("bids", q2_keep)
            .map("project", |e: &NxEvent| NxAuctionPrice { auction: e.id, price: e.b })
            .sink("out", p, sink),
        other => panic!("nexmark query {other} is not built"),
    }
    job
}

/// The reference digest of query `q` over `events`: a plain loop.
pub fn reference(q: &str, events: &[NxEvent]) -> (u64, u64) {
    let bids = events.iter().filter(|e| e.kind == BID);
    match q {
        "q0" => digest_of(bids.map(q0_bid)),
        "q1" => digest_of(bids.map(q1_bid)),
        "q2" => digest_of(events.iter().filter(|e| q2_keep(e)).map(|e| NxAuctionPrice { auction: e.id, price: e.b })),
        other => panic!("nexmark query {other} is not built"),
    }
}

/// One query run.
#[derive(Debug)]
pub struct Outcome {
    /// Query.
    pub query: &'static str,
    /// Parallelism.
    pub parallelism: u32,
    /// Events in.
    pub events: u64,
    /// Results out.
    pub results: u64,
    /// The job's cost.
    pub cost: Cost,
}

/// Events per run.
pub fn events_per_run(smoke: bool) -> usize {
    if smoke { 20_000 } else { 5_000_000 }
}

/// Run every built query at p = 1 and 2 over `events`, each checked against the reference
/// (a mismatch panics: a wrong figure is worse than none).
pub fn run_all(events: &Arc<Vec<NxEvent>>) -> Vec<Outcome> {
    let mut out = Vec::new();
    for q in QUERIES {
        let want = reference(q, events);
        for p in [1, 2] {
            let digest = Arc::new(Digest::default());
            let job = job(q, events, p, digest.clone());
            let (_, cost) = measure(|| job.run().unwrap_or_else(|e| panic!("nexmark {q} p={p}: {e}")));
            assert_eq!(digest.get(), want, "nexmark {q} p={p}: the output differs from the reference");
            out.push(Outcome { query: q, parallelism: p, events: events.len() as u64, results: want.0, cost });
        }
    }
    out
}

/// The report section.
pub fn section(smoke: bool) -> Section {
    let n = events_per_run(smoke);
    let (events, gen_cost) = measure(|| Arc::new(generate(n)));
    let outcomes = run_all(&events);
    let mut s = Section::new("nexmark", "Nexmark q0–q2 (exact against a reference; events per CPU-second)");
    s.rows.push(
        Row::new(
            "event generation (nexmark crate, before timing)",
            gen_cost.per_cpu_s(n as u64) / 1e6,
            "M events/CPU-s",
        )
        .note("not counted in the queries' figures"),
    );
    for o in &outcomes {
        s.rows.push(
            Row::new(
                format!("{} p={}: events per CPU-second", o.query, o.parallelism),
                o.cost.per_cpu_s(o.events) / 1e6,
                "M events/CPU-s",
            )
            .target("≥ 2 M", |v| v >= 2.0)
            .note(format!(
                "{:.2} M events/s wall, {} results, exact",
                o.cost.per_s(o.events) / 1e6,
                o.results
            )),
        );
    }
    for q in NOT_BUILT {
        s.rows.push(Row::not_run(format!("{q}: events per CPU-second"), "query not built yet (issue #16)"));
    }
    let details: Vec<Value> = outcomes
        .iter()
        .map(|o| {
            json!({
                "query": o.query,
                "parallelism": o.parallelism,
                "events": o.events,
                "results": o.results,
                "exact": true,
                "cost": o.cost.json(o.events),
                "state_bytes": 0,
            })
        })
        .collect();
    s.setup = json!({
        "events": n,
        "base_time_ms": BASE_TIME_MS,
        "rate_events_per_s": 10_000_000,
        "record": { "type": "NxEvent", "bytes": std::mem::size_of::<NxEvent>() },
        "generator": gen_cost.json(n as u64),
        "peak_rss_bytes": weir::ring::process::hwm_bytes(),
    });
    s.details = json!(details);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every built query, at parallelism 1 and 2, gives exactly the reference's output (the
    /// benchmark checks the same at full size); the events are the same on every run.
    #[test]
    fn queries_are_exact_and_events_deterministic() {
        let events = Arc::new(generate(5_000));
        assert_eq!(*events, generate(5_000), "a fixed base_time gives the same events");
        let bids = events.iter().filter(|e| e.kind == BID).count();
        assert_eq!(bids, 4_600, "bids are 46 of every 50 events");
        let outcomes = run_all(&events);
        assert_eq!(outcomes.len(), QUERIES.len() * 2);
        assert!(outcomes.iter().any(|o| o.query == "q2" && o.results > 0), "q2 keeps some bids");
    }
}
