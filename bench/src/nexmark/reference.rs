//! Each query's result computed the plain way: one thread, all events at hand, the SQL read
//! literally (no watermarks, no timers, no state to expire) — what the jobs' results are
//! checked against. Where the SQL leaves an order open (ties in `ROW_NUMBER`), the reference
//! uses the same total order as the job ([`super::process`]'s `q9_rank`, `q18_rank`,
//! `q19_rank`): that is part of what the query means here.

use super::output::{Digest, Row};
use super::parts::B9;
use super::process::{TOP, TUMBLE_MS, q9_row, q18_rank, q18_row, q19_rank, q19_row, q20_row};
use super::rows::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use weir::io::nexmark::{Auction, Bid, NexmarkEvent, Person};

/// A reference result: its digest, and its rows as sorted JSON when asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The rows' digest (q12: of its rows summed per bidder, see [`q12_totals`]).
    pub digest: Digest,
    /// The rows as JSON, sorted (when kept).
    pub rows: Option<Vec<String>>,
}

fn expected<R: Row>(rows: Vec<R>, keep: bool) -> Expected {
    let digest = Digest::of(&rows);
    let rows = keep.then(|| {
        let mut json: Vec<String> = rows.iter().map(|r| serde_json::to_string(r).expect("rows serialize")).collect();
        json.sort_unstable();
        json
    });
    Expected { digest, rows }
}

fn bids(events: &[NexmarkEvent]) -> impl Iterator<Item = &Bid> + Clone {
    events.iter().filter_map(NexmarkEvent::as_bid)
}

fn auctions(events: &[NexmarkEvent]) -> impl Iterator<Item = &Auction> + Clone {
    events.iter().filter_map(NexmarkEvent::as_auction)
}

fn persons(events: &[NexmarkEvent]) -> impl Iterator<Item = &Person> + Clone {
    events.iter().filter_map(NexmarkEvent::as_person)
}

/// q12's check: its rows depend on when the job ran (processing time), so what is compared
/// is their count summed per bidder — every bid counted once — as rows `(bidder, count)`.
pub fn q12_totals(rows: impl IntoIterator<Item = (u64, u64)>) -> Vec<Q2Row> {
    let mut totals: BTreeMap<u64, u64> = BTreeMap::new();
    for (bidder, n) in rows {
        *totals.entry(bidder).or_default() += n;
    }
    totals.into_iter().map(|(auction, price)| Q2Row { auction, price }).collect()
}

/// Query `q`'s result over `events`; `side` is q13's side input.
pub fn expected_of(q: &str, events: &[NexmarkEvent], side: &HashMap<u64, String>, keep: bool) -> Expected {
    match q {
        "q0" => expected(
            bids(events)
                .map(|b| Q0Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                })
                .collect(),
            keep,
        ),
        "q1" => expected(
            bids(events)
                .map(|b| Q1Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: Decimal { unscaled: b.price as i128 * 908, scale: 3 },
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                })
                .collect(),
            keep,
        ),
        "q2" => expected(
            bids(events)
                .filter(|b| b.auction % 123 == 0)
                .map(|b| Q2Row { auction: b.auction, price: b.price })
                .collect(),
            keep,
        ),
        "q3" => {
            let sellers: HashMap<u64, &Person> =
                persons(events).filter(|p| ["or", "id", "ca"].contains(&p.state.as_str())).map(|p| (p.id, p)).collect();
            let rows = auctions(events)
                .filter(|a| a.category == 10)
                .filter_map(|a| {
                    sellers.get(&a.seller).map(|p| Q3Row {
                        name: p.name.clone(),
                        city: p.city.clone(),
                        state: p.state.clone(),
                        id: a.id,
                    })
                })
                .collect();
            expected(rows, keep)
        }
        "q4" => {
            let mut finals: HashMap<u64, (u64, u64)> = HashMap::new();
            let by_id: HashMap<u64, &Auction> = auctions(events).map(|a| (a.id, a)).collect();
            for b in bids(events) {
                if let Some(a) = by_id.get(&b.auction)
                    && a.date_time <= b.date_time
                    && b.date_time <= a.expires
                {
                    let f = finals.entry(a.id).or_insert((a.category, 0));
                    f.1 = f.1.max(b.price);
                }
            }
            let mut per_category: HashMap<u64, (u64, u64)> = HashMap::new();
            for (category, price) in finals.into_values() {
                let c = per_category.entry(category).or_default();
                c.0 += price;
                c.1 += 1;
            }
            expected(per_category.into_iter().map(|(id, (sum, n))| Q4Row { id, r#final: sum / n }).collect(), keep)
        }
        "q5" => {
            // Every 2 s window start s with s <= t < s + 10 s.
            let mut counts: HashMap<(u64, u64), u64> = HashMap::new();
            for b in bids(events) {
                let last = b.date_time - b.date_time % 2_000;
                for k in 0..5u64 {
                    let Some(start) = last.checked_sub(k * 2_000) else { break };
                    *counts.entry((start, b.auction)).or_default() += 1;
                }
            }
            let mut max: HashMap<u64, u64> = HashMap::new();
            for (&(start, _), &n) in &counts {
                let m = max.entry(start).or_default();
                *m = (*m).max(n);
            }
            let rows = counts
                .iter()
                .filter(|((start, _), n)| **n >= max[start])
                .map(|(&(_, auction), &num)| Q5Row { auction, num })
                .collect();
            expected(rows, keep)
        }
        "q7" => {
            let mut max: HashMap<u64, u64> = HashMap::new();
            for b in bids(events) {
                let m = max.entry(b.date_time / TUMBLE_MS).or_default();
                *m = (*m).max(b.price);
            }
            // B.dateTime BETWEEN window_end - 10 s AND window_end, B.price = that window's max.
            let mut rows = Vec::new();
            for b in bids(events) {
                let own = b.date_time / TUMBLE_MS;
                let ends = [(own + 1) * TUMBLE_MS, own * TUMBLE_MS];
                for end in ends {
                    let start = end.saturating_sub(TUMBLE_MS);
                    if end == 0 || !(start <= b.date_time && b.date_time <= end) {
                        continue;
                    }
                    if max.get(&(start / TUMBLE_MS)) == Some(&b.price) {
                        rows.push(Q7Row {
                            auction: b.auction,
                            price: b.price,
                            bidder: b.bidder,
                            date_time: b.date_time,
                            extra: b.extra.clone(),
                        });
                    }
                }
            }
            expected(rows, keep)
        }
        "q8" => {
            let window = |t: u64| t - t % TUMBLE_MS;
            let sellers: HashSet<(u64, u64)> = auctions(events).map(|a| (a.seller, window(a.date_time))).collect();
            let people: HashSet<(u64, String, u64)> =
                persons(events).map(|p| (p.id, p.name.clone(), window(p.date_time))).collect();
            let rows = people
                .into_iter()
                .filter(|(id, _, start)| sellers.contains(&(*id, *start)))
                .map(|(id, name, stime)| Q8Row { id, name, stime })
                .collect();
            expected(rows, keep)
        }
        "q9" => {
            let mut by_auction: HashMap<u64, Vec<B9>> = HashMap::new();
            for b in bids(events) {
                by_auction.entry(b.auction).or_default().push(B9 {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                });
            }
            let mut rows = Vec::new();
            for a in auctions(events) {
                let mut fitting: Vec<&B9> = by_auction
                    .get(&a.id)
                    .map(|v| v.iter().filter(|b| a.date_time <= b.date_time && b.date_time <= a.expires).collect())
                    .unwrap_or_default();
                // ORDER BY price DESC, dateTime ASC, then bidder and extra ascending.
                fitting.sort_by(|x, y| {
                    y.price
                        .cmp(&x.price)
                        .then(x.date_time.cmp(&y.date_time))
                        .then(x.bidder.cmp(&y.bidder))
                        .then(x.extra.cmp(&y.extra))
                });
                if let Some(best) = fitting.first() {
                    rows.push(q9_row(a.clone(), (*best).clone()));
                }
            }
            expected(rows, keep)
        }
        "q10" => expected(
            bids(events)
                .map(|b| Q10Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                    dt: day_text(day_of(b.date_time)).into(),
                    hm: minute_text(minute_of_day(b.date_time)).into(),
                })
                .collect(),
            keep,
        ),
        "q11" => {
            let mut times: HashMap<u64, Vec<u64>> = HashMap::new();
            for b in bids(events) {
                times.entry(b.bidder).or_default().push(b.date_time);
            }
            let gap = 10_000;
            let mut rows = Vec::new();
            for (bidder, mut ts) in times {
                ts.sort_unstable();
                let (mut start, mut last, mut n) = (ts[0], ts[0], 0);
                for t in ts {
                    if t > last + gap {
                        rows.push(Q11Row { bidder, bid_count: n, starttime: start, endtime: last + gap });
                        (start, n) = (t, 0);
                    }
                    last = t;
                    n += 1;
                }
                rows.push(Q11Row { bidder, bid_count: n, starttime: start, endtime: last + gap });
            }
            expected(rows, keep)
        }
        "q12" => expected(q12_totals(bids(events).map(|b| (b.bidder, 1))), keep),
        "q13" => expected(
            bids(events)
                .filter_map(|b| {
                    side.get(&(b.auction % 10_000)).map(|v| Q13Row {
                        auction: b.auction,
                        bidder: b.bidder,
                        price: b.price,
                        date_time: b.date_time,
                        value: v.clone(),
                    })
                })
                .collect(),
            keep,
        ),
        "q14" => expected(
            bids(events)
                .filter(|b| {
                    // 0.908 * price > 1000000 AND 0.908 * price < 50000000, in thousandths.
                    let milli = b.price as i128 * 908;
                    milli > 1_000_000_000 && milli < 50_000_000_000
                })
                .map(|b| Q14Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: Decimal { unscaled: b.price as i128 * 908, scale: 3 },
                    bid_time_type: bid_time_type(b.date_time).to_owned(),
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                    c_counts: b.extra.chars().filter(|&c| c == 'c').count() as u64,
                })
                .collect(),
            keep,
        ),
        "q15" | "q16" => {
            // Group by (channel, day) for q16, by day for q15.
            let mut groups: BTreeMap<(String, String), Vec<&Bid>> = BTreeMap::new();
            for b in bids(events) {
                let channel = if q == "q16" { b.channel.clone() } else { String::new() };
                groups.entry((channel, day_text(day_of(b.date_time)))).or_default().push(b);
            }
            let distinct = |v: &[&Bid], rank: Option<usize>, f: fn(&Bid) -> u64| {
                v.iter()
                    .filter(|b| rank.is_none_or(|r| price_rank(b.price) == r))
                    .map(|b| f(b))
                    .collect::<HashSet<_>>()
                    .len() as u64
            };
            let count = |v: &[&Bid], rank: usize| v.iter().filter(|b| price_rank(b.price) == rank).count() as u64;
            let bidder = |b: &Bid| b.bidder;
            let auction = |b: &Bid| b.auction;
            if q == "q15" {
                let rows = groups
                    .into_iter()
                    .map(|((_, day), v)| Q15Row {
                        day,
                        total_bids: v.len() as u64,
                        rank1_bids: count(&v, 1),
                        rank2_bids: count(&v, 2),
                        rank3_bids: count(&v, 3),
                        total_bidders: distinct(&v, None, bidder),
                        rank1_bidders: distinct(&v, Some(1), bidder),
                        rank2_bidders: distinct(&v, Some(2), bidder),
                        rank3_bidders: distinct(&v, Some(3), bidder),
                        total_auctions: distinct(&v, None, auction),
                        rank1_auctions: distinct(&v, Some(1), auction),
                        rank2_auctions: distinct(&v, Some(2), auction),
                        rank3_auctions: distinct(&v, Some(3), auction),
                    })
                    .collect();
                expected(rows, keep)
            } else {
                let rows = groups
                    .into_iter()
                    .map(|((channel, day), v)| Q16Row {
                        channel,
                        day,
                        minute: v.iter().map(|b| minute_text(minute_of_day(b.date_time))).max().expect("a bid"),
                        total_bids: v.len() as u64,
                        rank1_bids: count(&v, 1),
                        rank2_bids: count(&v, 2),
                        rank3_bids: count(&v, 3),
                        total_bidders: distinct(&v, None, bidder),
                        rank1_bidders: distinct(&v, Some(1), bidder),
                        rank2_bidders: distinct(&v, Some(2), bidder),
                        rank3_bidders: distinct(&v, Some(3), bidder),
                        total_auctions: distinct(&v, None, auction),
                        rank1_auctions: distinct(&v, Some(1), auction),
                        rank2_auctions: distinct(&v, Some(2), auction),
                        rank3_auctions: distinct(&v, Some(3), auction),
                    })
                    .collect();
                expected(rows, keep)
            }
        }
        "q17" => {
            let mut groups: HashMap<(u64, String), Vec<u64>> = HashMap::new();
            for b in bids(events) {
                groups.entry((b.auction, day_text(day_of(b.date_time)))).or_default().push(b.price);
            }
            let rows = groups
                .into_iter()
                .map(|((auction, day), prices)| {
                    let n = prices.len() as u64;
                    let sum: u64 = prices.iter().sum();
                    let rank = |r: usize| prices.iter().filter(|p| price_rank(**p) == r).count() as u64;
                    Q17Row {
                        auction,
                        day,
                        total_bids: n,
                        rank1_bids: rank(1),
                        rank2_bids: rank(2),
                        rank3_bids: rank(3),
                        min_price: *prices.iter().min().expect("a bid"),
                        max_price: *prices.iter().max().expect("a bid"),
                        avg_price: sum / n,
                        sum_price: sum,
                    }
                })
                .collect();
            expected(rows, keep)
        }
        "q18" => {
            let mut last: HashMap<(u64, u64), &Bid> = HashMap::new();
            for b in bids(events) {
                let l = last.entry((b.bidder, b.auction)).or_insert(b);
                if q18_rank(b) > q18_rank(l) {
                    *l = b;
                }
            }
            expected(last.into_values().map(q18_row).collect(), keep)
        }
        "q19" => {
            let mut by_auction: HashMap<u64, Vec<&Bid>> = HashMap::new();
            for b in bids(events) {
                by_auction.entry(b.auction).or_default().push(b);
            }
            let mut rows = Vec::new();
            for (_, mut v) in by_auction {
                v.sort_by(|x, y| q19_rank(x).cmp(&q19_rank(y)));
                rows.extend(v.iter().take(TOP).enumerate().map(|(i, b)| q19_row(b, i + 1)));
            }
            expected(rows, keep)
        }
        "q20" => {
            let ten: HashMap<u64, &Auction> =
                auctions(events).filter(|a| a.category == 10).map(|a| (a.id, a)).collect();
            let rows = bids(events).filter_map(|b| ten.get(&b.auction).map(|a| q20_row(b, a))).collect();
            expected(rows, keep)
        }
        "q21" => {
            let hot = ["apple", "google", "facebook", "baidu"];
            let rows = bids(events)
                .filter_map(|b| {
                    let lower = b.channel.to_lowercase();
                    let id = match hot.iter().position(|h| *h == lower) {
                        Some(i) => Some(["0", "1", "2", "3"][i].to_owned()),
                        None => channel_id_of(&b.url).map(str::to_owned),
                    };
                    id.map(|channel_id| Q21Row {
                        auction: b.auction,
                        bidder: b.bidder,
                        price: b.price,
                        channel: b.channel.clone(),
                        channel_id,
                    })
                })
                .collect();
            expected(rows, keep)
        }
        "q22" => expected(
            bids(events)
                .map(|b| {
                    let parts: Vec<&str> = b.url.split('/').collect();
                    let dir = |i: usize| parts.get(i).map(|s| (*s).to_owned());
                    Q22Row {
                        auction: b.auction,
                        bidder: b.bidder,
                        price: b.price,
                        channel: b.channel.clone(),
                        dir1: dir(3),
                        dir2: dir(4),
                        dir3: dir(5),
                    }
                })
                .collect(),
            keep,
        ),
        other => panic!("no reference for {other}"),
    }
}
