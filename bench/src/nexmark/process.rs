//! The queries' keyed operators: what Flink's planner makes of joins with time bounds,
//! window joins, Top-N, deduplication and unbounded aggregations, written as
//! [`KeyedProcess`]es over the public API.
//!
//! State is in memory (per subtask, its key groups' keys) and these operators take no part
//! in checkpoints (`weir-bench` runs none). Where the query lets state end — an auction that
//! expired, a window the watermark passed — it is dropped then; the unbounded aggregations
//! (q15–q19) and regular joins (q3, q20) keep theirs for the run, as Flink's do without a
//! state TTL.
//!
//! Each counts the records that come behind the watermark ([`KeyedProcess::late_records`]);
//! the checks require none (every setting they use keeps the disorder under the watermark's
//! 4 s), so a result is exact and not merely consistent.

use super::parts::*;
use super::rows::*;
use std::cmp::Reverse;
// FxHash: the keys are ids and small tuples of them, hashed per record.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use weir::io::nexmark::{Auction, Bid};
use weir::operators::timers::EventTimers;
use weir::operators::{Halt, KeyedProcess};
use weir::record::Either;

/// A query's output function.
type Out<'a, U> = &'a mut dyn FnMut(&U) -> Result<(), Halt>;

/// ns per ms.
const MS: u64 = 1_000_000;

/// The watermark seen, and the records that came behind it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Lateness {
    /// The input's watermark (ns; records below it are complete).
    pub w: u64,
    /// Records with a time below the watermark when they came.
    pub late: u64,
}

impl Lateness {
    fn see(&mut self, t_ns: u64) {
        if t_ns < self.w {
            self.late += 1;
        }
    }
}

/// Why an operator keeps a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// An auction's end: its result is final.
    Close(u64),
    /// Bids that came before their auction, of this time (ms): no auction that comes later
    /// (on time) can start at or before it.
    Waiting(u64),
}

/// Bids that came before their auction (whose time may still fall in it: an auction and
/// its bids share milliseconds, and out-of-order groups reorder them), by auction; dropped
/// once the watermark passes their time.
#[derive(Debug)]
struct Waiting<B> {
    bids: HashMap<u64, Vec<B>>,
}

impl<B> Default for Waiting<B> {
    fn default() -> Waiting<B> {
        Waiting { bids: HashMap::default() }
    }
}

impl<B> Waiting<B> {
    fn add(&mut self, auction: u64, bid: B, time_ms: u64, timers: &mut EventTimers<Due>) {
        self.bids.entry(auction).or_default().push(bid);
        timers.register(Due::Waiting(time_ms), time_ms * MS);
    }

    fn take(&mut self, auction: u64) -> Vec<B> {
        self.bids.remove(&auction).unwrap_or_default()
    }

    /// Drop the bids of time `time_ms` and before.
    fn expire(&mut self, time_ms: u64, time: impl Fn(&B) -> u64) {
        self.bids.retain(|_, v| {
            v.retain(|b| time(b) > time_ms);
            !v.is_empty()
        });
    }
}

/// q3: auctions of category 10 joined with their sellers in or, id or ca — a regular join
/// on the seller's id, its state kept for the run (as Flink's without a TTL): every person
/// seen, and the auctions whose seller has not come yet.
#[derive(Debug, Default)]
pub struct SellersJoin {
    persons: HashMap<u64, Vec<P3>>,
    waiting: HashMap<u64, Vec<u64>>,
}

fn q3_row(p: &P3, auction: u64) -> Q3Row {
    Q3Row { name: p.name.clone(), city: p.city.clone(), state: p.state.clone(), id: auction }
}

impl KeyedProcess<Either<A3, P3>, Q3Row> for SellersJoin {
    fn process(&mut self, e: &Either<A3, P3>, _kg: u32, out: Out<Q3Row>) -> Result<(), Halt> {
        match e {
            Either::Left(a) => {
                for p in self.persons.get(&a.seller).into_iter().flatten() {
                    out(&q3_row(p, a.id))?;
                }
                self.waiting.entry(a.seller).or_default().push(a.id);
            }
            Either::Right(p) => {
                for &auction in self.waiting.get(&p.id).into_iter().flatten() {
                    out(&q3_row(p, auction))?;
                }
                self.persons.entry(p.id).or_default().push(p.clone());
            }
        }
        Ok(())
    }
}

/// q4, first stage: each auction's winning price — the highest bid whose time lies in
/// `[auction.date_time, auction.expires]` (SQL's inclusive `BETWEEN`) — emitted once, when the
/// watermark passes the auction's end (no bid that can count comes after). Auctions with no
/// such bid emit nothing (an inner join).
#[derive(Debug, Default)]
pub struct WinningPrices {
    open: HashMap<u64, (A4, Option<u64>)>,
    waiting: Waiting<B4>,
    timers: EventTimers<Due>,
    clock: Lateness,
}

impl WinningPrices {
    fn bid(open: &mut (A4, Option<u64>), b: &B4) {
        let (a, max) = open;
        if (a.date_time..=a.expires).contains(&b.date_time) {
            *max = Some(max.map_or(b.price, |m| m.max(b.price)));
        }
    }
}

impl KeyedProcess<Either<A4, B4>, W4> for WinningPrices {
    fn process(&mut self, e: &Either<A4, B4>, _kg: u32, _out: Out<W4>) -> Result<(), Halt> {
        match e {
            Either::Left(a) => {
                self.clock.see(a.date_time * MS);
                let mut open = (*a, None);
                for b in self.waiting.take(a.id) {
                    Self::bid(&mut open, &b);
                }
                self.open.insert(a.id, open);
                self.timers.register(Due::Close(a.id), a.expires * MS);
            }
            Either::Right(b) => {
                self.clock.see(b.date_time * MS);
                match self.open.get_mut(&b.auction) {
                    Some(open) => Self::bid(open, b),
                    None => self.waiting.add(b.auction, *b, b.date_time, &mut self.timers),
                }
            }
        }
        Ok(())
    }

    fn on_watermark(&mut self, w: u64, out: Out<W4>) -> Result<(), Halt> {
        self.clock.w = w;
        while let Some((_, due)) = self.timers.pop_due(w) {
            match due {
                Due::Close(id) => {
                    if let Some((a, Some(price))) = self.open.remove(&id) {
                        out(&W4 { category: a.category, price })?;
                    }
                }
                Due::Waiting(t) => self.waiting.expire(t, |b| b.date_time),
            }
        }
        Ok(())
    }

    fn late_records(&self) -> u64 {
        self.clock.late
    }
}

/// q4, second stage: per category, the average of its auctions' winning prices so far
/// (Flink's `AVG` of a `BIGINT`: the sum divided by the count, in integers), after each one.
#[derive(Debug, Default)]
pub struct CategoryAverages {
    totals: HashMap<u64, (u64, u64)>,
}

impl KeyedProcess<W4, Q4Row> for CategoryAverages {
    fn process(&mut self, w: &W4, _kg: u32, out: Out<Q4Row>) -> Result<(), Halt> {
        let (sum, count) = self.totals.entry(w.category).or_default();
        *sum += w.price;
        *count += 1;
        out(&Q4Row { id: w.category, r#final: *sum / *count })
    }
}

/// q7: per 10 s window (the key), the bids at its highest price, emitted when the watermark
/// passes the window's end (inclusive: a bid at exactly the end counts, as in Flink's
/// `BETWEEN window_end - 10 s AND window_end`).
#[derive(Debug, Default)]
pub struct Highest {
    /// window → (the highest price of its own bids, the candidates at or above it).
    windows: HashMap<u64, (Option<u64>, Vec<C7>)>,
    timers: EventTimers<u64>,
    clock: Lateness,
}

/// q7's window, ms.
pub const TUMBLE_MS: u64 = 10_000;

impl KeyedProcess<C7, Q7Row> for Highest {
    fn process(&mut self, c: &C7, _kg: u32, _out: Out<Q7Row>) -> Result<(), Halt> {
        if c.member == 1 {
            self.clock.see(c.date_time * MS);
        }
        let timers = &mut self.timers;
        let (max, cands) = self.windows.entry(c.window).or_insert_with(|| {
            // The end is inclusive: fire once every record at the end's ms is in.
            timers.register(c.window, (c.window + 1) * TUMBLE_MS * MS);
            (None, Vec::new())
        });
        if c.member == 1 && max.is_none_or(|m| c.price > m) {
            *max = Some(c.price);
            cands.retain(|x| x.price >= c.price);
        }
        if max.is_none_or(|m| c.price >= m) {
            cands.push(c.clone());
        }
        Ok(())
    }

    fn on_watermark(&mut self, w: u64, out: Out<Q7Row>) -> Result<(), Halt> {
        self.clock.w = w;
        while let Some((_, window)) = self.timers.pop_due(w) {
            let Some((Some(max), cands)) = self.windows.remove(&window) else { continue };
            for c in cands.into_iter().filter(|c| c.price == max) {
                out(&Q7Row {
                    auction: c.auction,
                    price: c.price,
                    bidder: c.bidder,
                    date_time: c.date_time,
                    extra: c.extra,
                })?;
            }
        }
        Ok(())
    }

    fn late_records(&self) -> u64 {
        self.clock.late
    }
}

/// q8: per person and 10 s window, their name if they registered in it and whether they
/// opened an auction in it; when the watermark passes the window, each person with both.
#[derive(Debug, Default)]
pub struct NewUsers {
    windows: HashMap<(u64, u64), (Option<String>, bool)>,
    timers: EventTimers<(u64, u64)>,
    clock: Lateness,
}

impl NewUsers {
    fn slot(&mut self, person: u64, ms: u64) -> &mut (Option<String>, bool) {
        let start = ms - ms % TUMBLE_MS;
        let timers = &mut self.timers;
        self.windows.entry((person, start)).or_insert_with(|| {
            timers.register((person, start), (start + TUMBLE_MS) * MS - 1);
            (None, false)
        })
    }
}

impl KeyedProcess<Either<P8, A8>, Q8Row> for NewUsers {
    fn process(&mut self, e: &Either<P8, A8>, _kg: u32, _out: Out<Q8Row>) -> Result<(), Halt> {
        match e {
            Either::Left(p) => {
                self.clock.see(p.date_time * MS);
                self.slot(p.id, p.date_time).0 = Some(p.name.clone());
            }
            Either::Right(a) => {
                self.clock.see(a.date_time * MS);
                self.slot(a.seller, a.date_time).1 = true;
            }
        }
        Ok(())
    }

    fn on_watermark(&mut self, w: u64, out: Out<Q8Row>) -> Result<(), Halt> {
        self.clock.w = w;
        while let Some((_, (id, start))) = self.timers.pop_due(w) {
            if let Some((Some(name), true)) = self.windows.remove(&(id, start)) {
                out(&Q8Row { id, name, stime: start })?;
            }
        }
        Ok(())
    }

    fn late_records(&self) -> u64 {
        self.clock.late
    }
}

/// q9's order of bids: the highest price first, then the earliest (Flink's `ORDER BY price
/// DESC, dateTime ASC`), then — where Flink takes whichever came first — the smallest bidder
/// and `extra`, so the result does not depend on arrival order.
fn q9_rank(b: &B9) -> (u64, Reverse<u64>, Reverse<u64>, Reverse<&str>) {
    (b.price, Reverse(b.date_time), Reverse(b.bidder), Reverse(b.extra.as_str()))
}

/// q9: each auction with its winning bid — the first by `q9_rank` of its bids in
/// `[date_time, expires]` — emitted once, when the watermark passes the auction's end.
#[derive(Debug, Default)]
pub struct WinningBids {
    open: HashMap<u64, (Auction, Option<B9>)>,
    waiting: Waiting<B9>,
    timers: EventTimers<Due>,
    clock: Lateness,
}

impl WinningBids {
    fn bid(open: &mut (Auction, Option<B9>), b: &B9) {
        let (a, best) = open;
        if (a.date_time..=a.expires).contains(&b.date_time) && best.as_ref().is_none_or(|x| q9_rank(b) > q9_rank(x)) {
            *best = Some(b.clone());
        }
    }
}

impl KeyedProcess<Either<Auction, B9>, Q9Row> for WinningBids {
    fn process(&mut self, e: &Either<Auction, B9>, _kg: u32, _out: Out<Q9Row>) -> Result<(), Halt> {
        match e {
            Either::Left(a) => {
                self.clock.see(a.date_time * MS);
                let mut open = (a.clone(), None);
                for b in self.waiting.take(a.id) {
                    Self::bid(&mut open, &b);
                }
                self.timers.register(Due::Close(a.id), a.expires * MS);
                self.open.insert(a.id, open);
            }
            Either::Right(b) => {
                self.clock.see(b.date_time * MS);
                match self.open.get_mut(&b.auction) {
                    Some(open) => Self::bid(open, b),
                    None => self.waiting.add(b.auction, b.clone(), b.date_time, &mut self.timers),
                }
            }
        }
        Ok(())
    }

    fn on_watermark(&mut self, w: u64, out: Out<Q9Row>) -> Result<(), Halt> {
        self.clock.w = w;
        while let Some((_, due)) = self.timers.pop_due(w) {
            match due {
                Due::Close(id) => {
                    if let Some((a, Some(b))) = self.open.remove(&id) {
                        out(&q9_row(a, b))?;
                    }
                }
                Due::Waiting(t) => self.waiting.expire(t, |b| b.date_time),
            }
        }
        Ok(())
    }

    fn late_records(&self) -> u64 {
        self.clock.late
    }
}

/// q9's row of an auction and its winning bid.
pub fn q9_row(a: Auction, b: B9) -> Q9Row {
    Q9Row {
        id: a.id,
        item_name: a.item_name,
        description: a.description,
        initial_bid: a.initial_bid,
        reserve: a.reserve,
        date_time: a.date_time,
        expires: a.expires,
        seller: a.seller,
        category: a.category,
        extra: a.extra,
        auction: b.auction,
        bidder: b.bidder,
        price: b.price,
        bid_date_time: b.date_time,
        bid_extra: b.extra,
    }
}

/// Bids, bidders and auctions of q15's and q16's groups: in all and by price rank.
#[derive(Debug, Default, Clone)]
pub struct RankedCounts {
    bids: [u64; 4],
    bidders: [HashSet<u64>; 4],
    auctions: [HashSet<u64>; 4],
}

impl RankedCounts {
    fn add(&mut self, price: u64, bidder: u64, auction: u64) {
        for r in [0, price_rank(price)] {
            self.bids[r] += 1;
            self.bidders[r].insert(bidder);
            self.auctions[r].insert(auction);
        }
    }

    /// Flink's 12 columns: bids, bidders, auctions; each in all, then ranks 1 to 3.
    fn columns(&self) -> [u64; 12] {
        let mut c = [0; 12];
        for r in 0..4 {
            c[r] = self.bids[r];
            c[4 + r] = self.bidders[r].len() as u64;
            c[8 + r] = self.auctions[r].len() as u64;
        }
        c
    }
}

/// Groups whose rows changed since they were last emitted: an updating query emits each
/// changed group's new row when the watermark advances (and at the end), as Flink's
/// mini-batches do, not one per input record.
#[derive(Debug)]
struct Changed<K> {
    keys: Vec<K>,
    marked: HashSet<K>,
}

impl<K> Default for Changed<K> {
    fn default() -> Changed<K> {
        Changed { keys: Vec::new(), marked: HashSet::default() }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Changed<K> {
    fn mark(&mut self, k: &K) {
        if !self.marked.contains(k) {
            self.marked.insert(k.clone());
            self.keys.push(k.clone());
        }
    }

    fn take(&mut self) -> Vec<K> {
        self.marked.clear();
        std::mem::take(&mut self.keys)
    }
}

/// q15: per day, the bids, bidders and auctions, in all and by price rank.
#[derive(Debug, Default)]
pub struct DailyStats {
    days: HashMap<u64, RankedCounts>,
    changed: Changed<u64>,
}

impl DailyStats {
    fn emit(&mut self, out: Out<Q15Row>) -> Result<(), Halt> {
        for day in self.changed.take() {
            let c = self.days[&day].columns();
            out(&Q15Row {
                day: day_text(day),
                total_bids: c[0],
                rank1_bids: c[1],
                rank2_bids: c[2],
                rank3_bids: c[3],
                total_bidders: c[4],
                rank1_bidders: c[5],
                rank2_bidders: c[6],
                rank3_bidders: c[7],
                total_auctions: c[8],
                rank1_auctions: c[9],
                rank2_auctions: c[10],
                rank3_auctions: c[11],
            })?;
        }
        Ok(())
    }
}

impl KeyedProcess<B15, Q15Row> for DailyStats {
    fn process(&mut self, b: &B15, _kg: u32, _out: Out<Q15Row>) -> Result<(), Halt> {
        self.days.entry(b.day).or_default().add(b.price, b.bidder, b.auction);
        self.changed.mark(&b.day);
        Ok(())
    }
    fn on_watermark(&mut self, _w: u64, out: Out<Q15Row>) -> Result<(), Halt> {
        self.emit(out)
    }
    fn finish(&mut self, out: Out<Q15Row>) -> Result<(), Halt> {
        self.emit(out)
    }
}

/// q16: per channel and day, q15's figures and the latest minute.
#[derive(Debug, Default)]
pub struct ChannelStats {
    groups: HashMap<(String, u64), (RankedCounts, u64)>,
    changed: Changed<(String, u64)>,
}

impl ChannelStats {
    fn emit(&mut self, out: Out<Q16Row>) -> Result<(), Halt> {
        for key in self.changed.take() {
            let (counts, minute) = &self.groups[&key];
            let c = counts.columns();
            out(&Q16Row {
                channel: key.0.clone(),
                day: day_text(key.1),
                minute: minute_text(*minute),
                total_bids: c[0],
                rank1_bids: c[1],
                rank2_bids: c[2],
                rank3_bids: c[3],
                total_bidders: c[4],
                rank1_bidders: c[5],
                rank2_bidders: c[6],
                rank3_bidders: c[7],
                total_auctions: c[8],
                rank1_auctions: c[9],
                rank2_auctions: c[10],
                rank3_auctions: c[11],
            })?;
        }
        Ok(())
    }
}

impl KeyedProcess<B16, Q16Row> for ChannelStats {
    fn process(&mut self, b: &B16, _kg: u32, _out: Out<Q16Row>) -> Result<(), Halt> {
        let key = (b.channel.clone(), b.day);
        let (counts, minute) = self.groups.entry(key.clone()).or_default();
        counts.add(b.price, b.bidder, b.auction);
        *minute = (*minute).max(b.minute);
        self.changed.mark(&key);
        Ok(())
    }
    fn on_watermark(&mut self, _w: u64, out: Out<Q16Row>) -> Result<(), Halt> {
        self.emit(out)
    }
    fn finish(&mut self, out: Out<Q16Row>) -> Result<(), Halt> {
        self.emit(out)
    }
}

/// q17's figures of one auction and day.
#[derive(Debug, Clone, Copy)]
struct AuctionDay {
    bids: [u64; 4],
    min: u64,
    max: u64,
    sum: u64,
}

/// q17: per auction and day, its bids in all and by rank, and the prices' min, max,
/// average (Flink's integer `AVG`) and sum.
#[derive(Debug, Default)]
pub struct AuctionStats {
    groups: HashMap<(u64, u64), AuctionDay>,
    changed: Changed<(u64, u64)>,
}

impl AuctionStats {
    fn emit(&mut self, out: Out<Q17Row>) -> Result<(), Halt> {
        for key in self.changed.take() {
            let g = self.groups[&key];
            out(&Q17Row {
                auction: key.0,
                day: day_text(key.1),
                total_bids: g.bids[0],
                rank1_bids: g.bids[1],
                rank2_bids: g.bids[2],
                rank3_bids: g.bids[3],
                min_price: g.min,
                max_price: g.max,
                avg_price: g.sum / g.bids[0],
                sum_price: g.sum,
            })?;
        }
        Ok(())
    }
}

impl KeyedProcess<B17, Q17Row> for AuctionStats {
    fn process(&mut self, b: &B17, _kg: u32, _out: Out<Q17Row>) -> Result<(), Halt> {
        let key = (b.auction, b.day);
        let g = self.groups.entry(key).or_insert(AuctionDay { bids: [0; 4], min: u64::MAX, max: 0, sum: 0 });
        g.bids[0] += 1;
        g.bids[price_rank(b.price)] += 1;
        g.min = g.min.min(b.price);
        g.max = g.max.max(b.price);
        g.sum += b.price;
        self.changed.mark(&key);
        Ok(())
    }
    fn on_watermark(&mut self, _w: u64, out: Out<Q17Row>) -> Result<(), Halt> {
        self.emit(out)
    }
    fn finish(&mut self, out: Out<Q17Row>) -> Result<(), Halt> {
        self.emit(out)
    }
}

/// q18's order: the latest bid (Flink's `ORDER BY dateTime DESC`), and among bids of one
/// millisecond — where Flink keeps whichever came last — the highest price, then the larger
/// 64-bit hash of channel, URL and `extra`, so the result does not depend on arrival order.
/// (A hash, not the strings themselves: the operator then decides with 24 bytes a pair
/// instead of keeping every pair's strings; two bids of one pair, millisecond and price
/// whose strings differ but hash alike would be ordered by arrival — odds of about 2^-64
/// per such tie.)
pub fn q18_rank(b: &Bid) -> (u64, u64, u64) {
    (b.date_time, b.price, super::output::hash_of(&(b.channel.as_str(), b.url.as_str(), b.extra.as_str())))
}

/// q18: per bidder and auction, the last bid — deduplication whose state grows with every
/// (bidder, auction) pair seen (about 30 million at Flink's 10^8 events). Each pair keeps
/// only the [`q18_rank`] of its last bid (40 bytes with the key; the strings were what made
/// a row-per-pair map outgrow 24 GB at 10^8 events); the rows that changed since the last
/// watermark are held whole, and emitted at the watermark in the order they first changed.
#[derive(Debug, Default)]
pub struct LastBids {
    /// (bidder, auction) → the rank of its last bid, as emitted.
    last: HashMap<(u64, u64), (u64, u64, u64)>,
    /// The pairs changed since the last watermark → their index in `rows`.
    changed: HashMap<(u64, u64), usize>,
    /// The changed rows with their rank, in the order they first changed.
    rows: Vec<((u64, u64, u64), Q18Row)>,
}

impl LastBids {
    fn emit(&mut self, out: Out<Q18Row>) -> Result<(), Halt> {
        let LastBids { last, changed, rows } = self;
        changed.clear();
        for (rank, row) in rows.drain(..) {
            last.insert((row.bidder, row.auction), rank);
            out(&row)?;
        }
        Ok(())
    }
}

/// Make `row` the row of `b` (of the same bidder and auction).
fn q18_update(row: &mut Q18Row, b: &Bid) {
    row.price = b.price;
    row.date_time = b.date_time;
    row.channel.clone_from(&b.channel);
    row.url.clone_from(&b.url);
    row.extra.clone_from(&b.extra);
}

/// q18's row of a bid.
pub fn q18_row(b: &Bid) -> Q18Row {
    Q18Row {
        auction: b.auction,
        bidder: b.bidder,
        price: b.price,
        channel: b.channel.clone(),
        url: b.url.clone(),
        date_time: b.date_time,
        extra: b.extra.clone(),
    }
}

impl KeyedProcess<Bid, Q18Row> for LastBids {
    fn process(&mut self, b: &Bid, _kg: u32, _out: Out<Q18Row>) -> Result<(), Halt> {
        let key = (b.bidder, b.auction);
        let rank = q18_rank(b);
        if let Some(&i) = self.changed.get(&key) {
            let (last, row) = &mut self.rows[i];
            if rank > *last {
                *last = rank;
                q18_update(row, b);
            }
            return Ok(());
        }
        if self.last.get(&key).is_some_and(|last| rank <= *last) {
            return Ok(());
        }
        self.changed.insert(key, self.rows.len());
        self.rows.push((rank, q18_row(b)));
        Ok(())
    }
    fn on_watermark(&mut self, _w: u64, out: Out<Q18Row>) -> Result<(), Halt> {
        self.emit(out)
    }
    fn finish(&mut self, out: Out<Q18Row>) -> Result<(), Halt> {
        self.emit(out)
    }
}

/// q19's order: the highest price first (Flink's `ORDER BY price DESC`), and among equal
/// prices — where Flink ranks by arrival — the earliest, then the smallest bidder, channel,
/// URL and `extra`.
pub fn q19_rank(b: &Bid) -> (Reverse<u64>, u64, u64, &str, &str, &str) {
    (Reverse(b.price), b.date_time, b.bidder, b.channel.as_str(), b.url.as_str(), b.extra.as_str())
}

/// [`q19_rank`] of the row a bid became.
fn q19_row_rank(r: &Q19Row) -> (Reverse<u64>, u64, u64, &str, &str, &str) {
    (Reverse(r.price), r.date_time, r.bidder, r.channel.as_str(), r.url.as_str(), r.extra.as_str())
}

/// q19's ranks.
pub const TOP: usize = 10;

/// q19: per auction, its ten best bids by [`q19_rank`], each row with its rank; when the
/// ranks of an auction change, the rows from the first changed rank on are emitted again
/// (as they are held: no copy).
#[derive(Debug, Default)]
pub struct TopBids {
    /// auction → (its best bids' rows in rank order, the first rank changed since last
    /// emitted: [`TOP`] when none).
    top: HashMap<u64, (Vec<Q19Row>, usize)>,
    /// The changed auctions, in the order they changed.
    changed: Vec<u64>,
}

/// q19's row of a bid at `rank` (from 1).
pub fn q19_row(b: &Bid, rank: usize) -> Q19Row {
    Q19Row {
        auction: b.auction,
        bidder: b.bidder,
        price: b.price,
        channel: b.channel.clone(),
        url: b.url.clone(),
        date_time: b.date_time,
        extra: b.extra.clone(),
        rank_number: rank as u64,
    }
}

impl TopBids {
    fn emit(&mut self, out: Out<Q19Row>) -> Result<(), Halt> {
        let mut changed = std::mem::take(&mut self.changed);
        for auction in changed.drain(..) {
            let (rows, from) = self.top.get_mut(&auction).expect("a changed auction has bids");
            for (i, r) in rows.iter_mut().enumerate().skip(*from) {
                r.rank_number = i as u64 + 1;
                out(r)?;
            }
            *from = TOP;
        }
        self.changed = changed;
        Ok(())
    }
}

impl KeyedProcess<Bid, Q19Row> for TopBids {
    fn process(&mut self, b: &Bid, _kg: u32, _out: Out<Q19Row>) -> Result<(), Halt> {
        let (rows, from) = self.top.entry(b.auction).or_insert_with(|| (Vec::with_capacity(TOP), TOP));
        let rank = q19_rank(b);
        let at = rows.partition_point(|x| q19_row_rank(x) < rank);
        if at >= TOP {
            return Ok(());
        }
        if rows.len() == TOP {
            rows.pop();
        }
        rows.insert(at, q19_row(b, 0));
        if *from == TOP {
            self.changed.push(b.auction);
        }
        *from = (*from).min(at);
        Ok(())
    }
    fn on_watermark(&mut self, _w: u64, out: Out<Q19Row>) -> Result<(), Halt> {
        self.emit(out)
    }
    fn finish(&mut self, out: Out<Q19Row>) -> Result<(), Halt> {
        self.emit(out)
    }
}

/// q20's row of a bid and its auction.
pub fn q20_row(b: &Bid, a: &Auction) -> Q20Row {
    Q20Row {
        auction: b.auction,
        bidder: b.bidder,
        price: b.price,
        channel: b.channel.clone(),
        url: b.url.clone(),
        bid_date_time: b.date_time,
        bid_extra: b.extra.clone(),
        item_name: a.item_name.clone(),
        description: a.description.clone(),
        initial_bid: a.initial_bid,
        reserve: a.reserve,
        auction_date_time: a.date_time,
        expires: a.expires,
        seller: a.seller,
        category: a.category,
        auction_extra: a.extra.clone(),
    }
}

/// The category q20 keeps.
pub const Q20_CATEGORY: u64 = 10;

/// q20: bids joined with their auction when it is of category 10 — a regular join, the
/// auction's id its key (one auction per id, as the generator makes them): the auctions of
/// category 10 are kept, the ids of the others, and bids that come before their auction
/// wait for it.
#[derive(Debug, Default)]
pub struct BidsWithAuctions {
    /// id → the auction if of category 10, else `None` (its bids are dropped).
    auctions: HashMap<u64, Option<Auction>>,
    waiting: HashMap<u64, Vec<Bid>>,
}

impl KeyedProcess<Either<Auction, Bid>, Q20Row> for BidsWithAuctions {
    fn process(&mut self, e: &Either<Auction, Bid>, _kg: u32, out: Out<Q20Row>) -> Result<(), Halt> {
        match e {
            Either::Left(a) => {
                let keep = (a.category == Q20_CATEGORY).then(|| a.clone());
                if let Some(a) = &keep {
                    for b in self.waiting.remove(&a.id).unwrap_or_default() {
                        out(&q20_row(&b, a))?;
                    }
                } else {
                    self.waiting.remove(&a.id);
                }
                self.auctions.insert(a.id, keep);
            }
            Either::Right(b) => match self.auctions.get(&b.auction) {
                Some(Some(a)) => out(&q20_row(b, a))?,
                Some(None) => {}
                None => self.waiting.entry(b.auction).or_default().push(b.clone()),
            },
        }
        Ok(())
    }
}
