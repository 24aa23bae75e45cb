//! The queries as weir jobs, each after its SQL in Flink's suite (`nexmark-flink/src/main/
//! resources/queries/qN.sql`), written with the public API as a user would: a Nexmark source,
//! event time where the query needs it (Flink's watermark: 4 s behind the largest event
//! time), projections chained into the source, an exchange where the query groups or joins.
//!
//! A join of two kinds of event (q3, q4, q8, q9, q20) projects both in one `flat_map` into
//! an [`Either`] and keys that one stream by either side's key into a keyed process over
//! `Either` (what `connect` would feed it). Two `flat_map`s of the source and `connect` say
//! the same, but a node with two outputs does not chain: every event, strings and all, would
//! cross two rings to be dropped by one of the projections (q3 ran 4.7× slower so).
//!
//! # As job files
//!
//! A job file's records are the fixed four-number events (`key`, `value`, `time_ns`, `seq`);
//! its Nexmark source makes one of them of each event of one kind, two of its numbers as key
//! and value. Three queries fit that language whole, and are in `tests/jobs/` (the test
//! `job_files_give_the_same_rows` checks their rows against the reference):
//!
//! - **q2** (`nexmark-q2.toml`): bids as (auction, price), a `key_multiple_of` filter;
//! - **q11** (`nexmark-q11.toml`): bids keyed by bidder, session windows of 10 s, `count`;
//! - **q12** (`nexmark-q12.toml`): the same in tumbling 10 s windows of processing time.
//!
//! The job-file language's gap list — what each other query needs that a job file cannot say:
//!
//! | query | what is missing |
//! |---|---|
//! | q0, q1, q10, q13, q14, q18–q22 | strings in records: bids' `channel`, `url`, `extra` (and q1, q14: decimals; q10: a partitioned file sink; q13: a side input; q14: a function on `extra`; q21: a regular expression; q22: `SPLIT_INDEX`) |
//! | q3, q8, q9, q20 | persons' and auctions' strings, and a join that emits its two records' fields (a job file's joins emit the pair of events) — q3 and q20: a regular join; q8: distinct rows per window |
//! | q4, q9 | a join bounded by another record's fields (`B.dateTime BETWEEN A.dateTime AND A.expires`), then a second aggregation of its results |
//! | q5 | the top auctions per window (`top_n` after a window), or a join of two aggregations |
//! | q7 | a window's maximum joined back to the window's records |
//! | q15, q16, q17 | unbounded (not windowed) aggregations that update, `COUNT(DISTINCT ...)`, `FILTER (WHERE ...)`, integer `AVG`, grouping by a formatted day |
//! | q18, q19 | keyed process functions: deduplication (the last row per key), Top-N per key |

use super::output::{Output, Row};
use super::parts::*;
use super::process::*;
use super::rows::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use weir::graph::{Job, Stream};
use weir::io::nexmark::{Auction, Bid, NexmarkConfig, NexmarkEvent, NexmarkSource};
use weir::record::Either;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window, WindowResult};

/// Flink's suite: watermarks 4 s behind the largest event time.
pub const WATERMARK_DELAY: Duration = Duration::from_secs(4);

/// Every query of the suite, in order (q6 is not in Flink's suite either).
pub const QUERIES: [&str; 22] = [
    "q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q9", "q10", "q11", "q12", "q13", "q14", "q15", "q16", "q17",
    "q18", "q19", "q20", "q21", "q22",
];

/// Whether query `q` keeps no state (its figure's target is 2 M events per CPU-second).
pub fn stateless(q: &str) -> bool {
    matches!(q, "q0" | "q1" | "q2" | "q10" | "q13" | "q14" | "q21" | "q22")
}

/// What a query job needs besides its events.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The generator's settings (its stats count this job's source).
    pub config: NexmarkConfig,
    /// Parallelism of every node.
    pub p: u32,
    /// Where the rows go.
    pub out: Output,
    /// q5's window cache per subtask (`None`: the window operator's default).
    pub q5_cache_bytes: Option<u64>,
    /// q13's side input: `key,value` lines (Flink's `side_input.txt`).
    pub side_input: PathBuf,
    /// q10's directory of partitions.
    pub q10_dir: PathBuf,
}

/// q13's side input as Flink's suite makes it (`SideInputGenerator`): keys 0 to 9,999, each
/// its own value, in `path`.
pub fn write_side_input(path: &std::path::Path) -> std::io::Result<()> {
    let text: String = (0..10_000).map(|i| format!("{i},{i}\n")).collect();
    std::fs::write(path, text)
}

/// Read a side input of `key,value` lines.
pub fn read_side_input(path: &std::path::Path) -> Result<HashMap<u64, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("q13's side input {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let (k, v) = l.split_once(',').ok_or_else(|| format!("{}:{}: not `key,value`", path.display(), i + 1))?;
            let k = k.trim().parse::<u64>().map_err(|e| format!("{}:{}: key `{k}`: {e}", path.display(), i + 1))?;
            Ok((k, v.to_owned()))
        })
        .collect()
}

/// ns of an event time in ms.
fn ns(ms: u64) -> u64 {
    ms * 1_000_000
}

/// Query `q` as a job.
pub fn job(q: &str, s: &Setup) -> Result<Job, String> {
    let job = Job::new(&format!("nexmark-{q}-p{}", s.p));
    let config = s.config.clone();
    let p = s.p;
    let events = job.source("nexmark", p, move |info| NexmarkSource::new(&config, info));
    let timed = || {
        events.with_event_time("ts", |e: &NexmarkEvent| e.date_time_ns(), WatermarkStrategy::bounded(WATERMARK_DELAY))
    };
    let out = s.out.clone();
    match q {
        // SELECT auction, bidder, price, dateTime, extra FROM bid
        "q0" => finish(
            events.flat_map("q0", |e: &NexmarkEvent| {
                e.as_bid().map(|b| Q0Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                })
            }),
            p,
            &out,
        ),
        // SELECT auction, bidder, 0.908 * price, dateTime, extra FROM bid  (DECIMAL(23, 3))
        "q1" => finish(
            events.flat_map("q1", |e: &NexmarkEvent| {
                e.as_bid().map(|b| Q1Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: Decimal::euro(b.price),
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                })
            }),
            p,
            &out,
        ),
        // SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0
        "q2" => finish(
            events.flat_map("q2", |e: &NexmarkEvent| {
                e.as_bid()
                    .filter(|b| b.auction.is_multiple_of(123))
                    .map(|b| Q2Row { auction: b.auction, price: b.price })
            }),
            p,
            &out,
        ),
        // SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id
        // WHERE A.category = 10 AND P.state IN ('or', 'id', 'ca')  (the crate's states are lower case)
        "q3" => {
            let parts = events.flat_map("q3_parts", |e: &NexmarkEvent| match e {
                NexmarkEvent::Auction(a) if a.category == 10 => Some(Either::Left(A3 { id: a.id, seller: a.seller })),
                NexmarkEvent::Person(p) if matches!(p.state.as_str(), "or" | "id" | "ca") => Some(Either::Right(P3 {
                    id: p.id,
                    name: p.name.clone(),
                    city: p.city.clone(),
                    state: p.state.clone(),
                })),
                _ => None,
            });
            let joined = parts
                .key_by("by_seller", |e: &Either<A3, P3>| match e {
                    Either::Left(a) => a.seller,
                    Either::Right(p) => p.id,
                })
                .process("join", p, |_| SellersJoin::default());
            finish(joined, p, &out)
        }
        // SELECT category, AVG(final) FROM (SELECT MAX(B.price) AS final, A.category FROM auction A,
        // bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
        // GROUP BY A.id, A.category) GROUP BY category
        "q4" => {
            let parts = timed().flat_map("q4_parts", |e: &NexmarkEvent| match e {
                NexmarkEvent::Auction(a) => Some(Either::Left(A4 {
                    id: a.id,
                    category: a.category,
                    date_time: a.date_time,
                    expires: a.expires,
                })),
                NexmarkEvent::Bid(b) => {
                    Some(Either::Right(B4 { auction: b.auction, price: b.price, date_time: b.date_time }))
                }
                NexmarkEvent::Person(_) => None,
            });
            let averages = parts
                .key_by("by_auction", |e: &Either<A4, B4>| match e {
                    Either::Left(a) => a.id,
                    Either::Right(b) => b.auction,
                })
                .process("winning", p, |_| WinningPrices::default())
                .key_by("by_category", |w: &W4| w.category)
                .process("average", p, |_| CategoryAverages::default());
            finish(averages, p, &out)
        }
        // Per 10 s window sliding by 2 s, the auctions with the most bids (ties kept).
        "q5" => {
            let windowed = timed()
                .flat_map("bids", |e: &NexmarkEvent| {
                    e.as_bid().map(|b| B5 { auction: b.auction, t_ns: ns(b.date_time) })
                })
                .key_by("by_auction", |b: &B5| b.auction)
                .window(Window::sliding(Duration::from_secs(10), Duration::from_secs(2)))
                .timestamps(|b: &B5| b.t_ns);
            let windowed = match s.q5_cache_bytes {
                Some(bytes) => windowed.cache_bytes(bytes),
                None => windowed,
            };
            let hot = windowed
                .aggregate("counts", p, Aggregates::of(|_: &B5| 0).count())
                .top_n("hottest", p, 1, Duration::ZERO, |r: &WindowResult| r.count)
                .map("q5", |r: &WindowResult| Q5Row { auction: r.key, num: r.count });
            finish(hot, p, &out)
        }
        // The bids at the highest price of each 10 s window, the window's end included.
        "q7" => {
            let highest = timed()
                .flat_map("candidates", |e: &NexmarkEvent| {
                    let (own, edge) = match e.as_bid() {
                        None => (None, None),
                        Some(b) => {
                            let window = b.date_time / TUMBLE_MS;
                            let c = C7 {
                                window,
                                member: 1,
                                auction: b.auction,
                                price: b.price,
                                bidder: b.bidder,
                                date_time: b.date_time,
                                extra: b.extra.clone(),
                            };
                            // A bid at a window's start is also at the previous window's end.
                            let edge = (b.date_time % TUMBLE_MS == 0 && window > 0).then(|| C7 {
                                window: window - 1,
                                member: 0,
                                ..c.clone()
                            });
                            (Some(c), edge)
                        }
                    };
                    own.into_iter().chain(edge)
                })
                .key_by("by_window", |c: &C7| c.window)
                .process("highest", p, |_| Highest::default());
            finish(highest, p, &out)
        }
        // Persons who opened an auction in the 10 s window they registered in.
        "q8" => {
            let parts = timed().flat_map("q8_parts", |e: &NexmarkEvent| match e {
                NexmarkEvent::Person(p) => {
                    Some(Either::Left(P8 { id: p.id, name: p.name.clone(), date_time: p.date_time }))
                }
                NexmarkEvent::Auction(a) => Some(Either::Right(A8 { seller: a.seller, date_time: a.date_time })),
                NexmarkEvent::Bid(_) => None,
            });
            let users = parts
                .key_by("by_person", |e: &Either<P8, A8>| match e {
                    Either::Left(p) => p.id,
                    Either::Right(a) => a.seller,
                })
                .process("new_users", p, |_| NewUsers::default());
            finish(users, p, &out)
        }
        // Each auction's winning bid: ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price
        // DESC, B.dateTime ASC) = 1 among its bids in [A.dateTime, A.expires].
        "q9" => {
            let parts = timed().flat_map("q9_parts", |e: &NexmarkEvent| match e {
                NexmarkEvent::Auction(a) => Some(Either::Left(a.clone())),
                NexmarkEvent::Bid(b) => Some(Either::Right(B9 {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                })),
                NexmarkEvent::Person(_) => None,
            });
            let winners = parts
                .key_by("by_auction", |e: &Either<Auction, B9>| match e {
                    Either::Left(a) => a.id,
                    Either::Right(b) => b.auction,
                })
                .process("winning", p, |_| WinningBids::default());
            finish(winners, p, &out)
        }
        // Every bid into part files partitioned by day and minute (`dt=yyyy-MM-dd/hm=HH:mm`).
        "q10" => {
            let rows = timed().flat_map("q10", |e: &NexmarkEvent| {
                e.as_bid().map(|b| Q10Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                    dt: cached_day_text(b.date_time),
                    hm: cached_minute_text(b.date_time),
                })
            });
            let config = q10_sink(&s.q10_dir);
            rows.sink("out", p, move |info| weir::io::PartitionedFileSink::new(config.clone(), info));
            Ok(())
        }
        // Bids per bidder and session (10 s gap).
        "q11" => {
            let sessions = timed()
                .flat_map("bids", |e: &NexmarkEvent| {
                    e.as_bid().map(|b| B11 { bidder: b.bidder, t_ns: ns(b.date_time) })
                })
                .key_by("by_bidder", |b: &B11| b.bidder)
                .window(Window::session(Duration::from_secs(10)))
                .timestamps(|b: &B11| b.t_ns)
                .aggregate("sessions", p, Aggregates::of(|_: &B11| 0).count())
                .map("q11", |r: &WindowResult| Q11Row {
                    bidder: r.key,
                    bid_count: r.count,
                    starttime: r.start_ns / 1_000_000,
                    endtime: r.end_ns / 1_000_000,
                });
            finish(sessions, p, &out)
        }
        // Bids per bidder in 10 s windows of processing time.
        "q12" => {
            let windows = events
                .flat_map("bids", |e: &NexmarkEvent| e.as_bid().map(|b| B11 { bidder: b.bidder, t_ns: 0 }))
                .key_by("by_bidder", |b: &B11| b.bidder)
                .window(Window::tumbling(Duration::from_secs(10)).processing_time())
                .aggregate("windows", p, Aggregates::of(|_: &B11| 0).count())
                .map("q12", |r: &WindowResult| Q12Row {
                    bidder: r.key,
                    bid_count: r.count,
                    starttime: r.start_ns / 1_000_000,
                    endtime: r.end_ns / 1_000_000,
                });
            finish(windows, p, &out)
        }
        // Bids joined with a side input on MOD(auction, 10000) = key.
        "q13" => {
            let side = Arc::new(read_side_input(&s.side_input)?);
            finish(
                events.flat_map("q13", move |e: &NexmarkEvent| {
                    let b = e.as_bid()?;
                    side.get(&(b.auction % 10_000)).map(|v| Q13Row {
                        auction: b.auction,
                        bidder: b.bidder,
                        price: b.price,
                        date_time: b.date_time,
                        value: v.clone(),
                    })
                }),
                p,
                &out,
            )
        }
        // Bids priced over 1 M and under 50 M euro, their time of day and their extra's 'c's.
        "q14" => finish(
            events.flat_map("q14", |e: &NexmarkEvent| {
                let b = e.as_bid()?;
                let euro = Decimal::euro(b.price);
                (euro.unscaled > 1_000_000_000 && euro.unscaled < 50_000_000_000).then(|| Q14Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: euro,
                    bid_time_type: bid_time_type(b.date_time).to_owned(),
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                    c_counts: count_char(&b.extra, b'c'),
                })
            }),
            p,
            &out,
        ),
        // Per day: bids, distinct bidders and auctions, in all and by price rank.
        "q15" => {
            let stats = timed()
                .flat_map("bids", |e: &NexmarkEvent| {
                    e.as_bid().map(|b| B15 {
                        day: day_of(b.date_time),
                        bidder: b.bidder,
                        auction: b.auction,
                        price: b.price,
                    })
                })
                .key_by("by_day", |b: &B15| b.day)
                .process("daily", p, |_| DailyStats::default());
            finish(stats, p, &out)
        }
        // q15 per channel and day, with the latest minute.
        "q16" => {
            let stats = timed()
                .flat_map("bids", |e: &NexmarkEvent| {
                    e.as_bid().map(|b| B16 {
                        channel: b.channel.clone(),
                        day: day_of(b.date_time),
                        minute: minute_of_day(b.date_time),
                        bidder: b.bidder,
                        auction: b.auction,
                        price: b.price,
                    })
                })
                .key_by("by_channel_day", |b: &B16| (super::output::hash_of(&b.channel), b.day))
                .process("channels", p, |_| ChannelStats::default());
            finish(stats, p, &out)
        }
        // Per auction and day: bids in all and by rank, min, max, avg and sum of prices.
        "q17" => {
            let stats = timed()
                .flat_map("bids", |e: &NexmarkEvent| {
                    e.as_bid().map(|b| B17 { auction: b.auction, day: day_of(b.date_time), price: b.price })
                })
                .key_by("by_auction_day", |b: &B17| (b.auction, b.day))
                .process("auctions", p, |_| AuctionStats::default());
            finish(stats, p, &out)
        }
        // Each bidder's last bid on each auction.
        "q18" => {
            let last = timed()
                .flat_map("bids", |e: &NexmarkEvent| e.as_bid().cloned())
                .key_by("by_bidder_auction", |b: &Bid| (b.bidder, b.auction))
                .process("last", p, |_| LastBids::default());
            finish(last, p, &out)
        }
        // Each auction's ten highest bids, ranked.
        "q19" => {
            let top = timed()
                .flat_map("bids", |e: &NexmarkEvent| e.as_bid().cloned())
                .key_by("by_auction", |b: &Bid| b.auction)
                .process("top", p, |_| TopBids::default());
            finish(top, p, &out)
        }
        // Bids with their auction, where the auction is of category 10.
        "q20" => {
            let parts = events.flat_map("q20_parts", |e: &NexmarkEvent| match e {
                // The others' ids only: their bids are dropped.
                NexmarkEvent::Auction(a) => Some(Either::Left(match a.category {
                    Q20_CATEGORY => a.clone(),
                    _ => Auction { id: a.id, category: a.category, ..Auction::default() },
                })),
                NexmarkEvent::Bid(b) => Some(Either::Right(b.clone())),
                NexmarkEvent::Person(_) => None,
            });
            let joined = parts
                .key_by("by_auction", |e: &Either<Auction, Bid>| match e {
                    Either::Left(a) => a.id,
                    Either::Right(b) => b.auction,
                })
                .process("join", p, |_| BidsWithAuctions::default());
            finish(joined, p, &out)
        }
        // Bids with a channel id: the hot channels' own, else the URL's `channel_id`.
        "q21" => finish(
            events.flat_map("q21", |e: &NexmarkEvent| {
                let b = e.as_bid()?;
                channel_id(&b.channel, &b.url).map(|channel_id| Q21Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    channel: b.channel.clone(),
                    channel_id,
                })
            }),
            p,
            &out,
        ),
        // Bids with their URL's directories: SPLIT_INDEX(url, '/', 3), 4 and 5.
        "q22" => finish(
            events.flat_map("q22", |e: &NexmarkEvent| {
                e.as_bid().map(|b| Q22Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    channel: b.channel.clone(),
                    dir1: split_index(&b.url, 3),
                    dir2: split_index(&b.url, 4),
                    dir3: split_index(&b.url, 5),
                })
            }),
            p,
            &out,
        ),
        other => return Err(format!("`{other}` is not a query of the suite; use one of {}", QUERIES.join(", "))),
    }?;
    Ok(job)
}

/// End `rows` in the query's sink: `p` subtasks (chained to the operator before), each
/// writing into `out`.
fn finish<R: Row>(rows: Stream<R>, p: u32, out: &Output) -> Result<(), String> {
    let out = out.clone();
    rows.sink("out", p, move |_| out.sink::<R>());
    Ok(())
}

/// q10's sink: lines in part files under `dir`, one directory per day and minute, each
/// committed (with a `_SUCCESS` file) once the watermark is a minute past its end.
pub fn q10_sink(dir: &std::path::Path) -> weir::io::PartitionedFileSinkConfig<Q10Row> {
    weir::io::PartitionedFileSinkConfig::new(
        dir,
        Arc::new(|r: &Q10Row, partition: &mut String| {
            for piece in ["dt=", &*r.dt, "/hm=", &*r.hm] {
                partition.push_str(piece);
            }
        }),
        Arc::new(|r: &Q10Row| {
            let minute = r.date_time - r.date_time % 60_000;
            ns(minute + 60_000)
        }),
    )
    .commit_delay(Duration::from_secs(60))
}
