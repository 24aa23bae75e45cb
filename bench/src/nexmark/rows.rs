//! What each query emits: one row type per query, with Flink's columns (`nexmark_qN` tables),
//! and the few SQL functions the queries use (exact decimals, `DATE_FORMAT`, `HOUR`).
//!
//! Every row is `Serialize` (the JSON lines `weir-bench nexmark --rows` writes), `Hash` (the
//! digest the checks compare) and a [`weir::record::Record`] (postcard, for when a row
//! crosses a ring). Times are ms since the Unix epoch, as Flink's `TIMESTAMP(3)`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// An exact decimal: `unscaled / 10^scale` (Flink's `DECIMAL(p, s)`). JSON: a string,
/// `"1234.500"`, so no reader rounds it through a float.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Decimal {
    /// The value times `10^scale`.
    pub unscaled: i128,
    /// Digits after the point.
    pub scale: u32,
}

impl Decimal {
    /// `0.908 × price`: q1's and q14's euro price, `DECIMAL(23, 3)`.
    pub fn euro(price: u64) -> Decimal {
        Decimal { unscaled: price as i128 * 908, scale: 3 }
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = 10i128.pow(self.scale);
        let (sign, abs) = if self.unscaled < 0 { ("-", -self.unscaled) } else { ("", self.unscaled) };
        if self.scale == 0 {
            return write!(f, "{sign}{abs}");
        }
        write!(f, "{sign}{}.{:0width$}", abs / p, abs % p, width = self.scale as usize)
    }
}

impl Serialize for Decimal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Decimal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Decimal, D::Error> {
        let text = String::deserialize(d)?;
        let bad = || serde::de::Error::custom(format!("`{text}` is not a decimal"));
        let (neg, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let all = format!("{int}{frac}");
        let v: i128 = all.parse().map_err(|_| bad())?;
        Ok(Decimal { unscaled: if neg { -v } else { v }, scale: frac.len() as u32 })
    }
}

/// Days since the Unix epoch → (year, month, day), proleptic Gregorian (H. Hinnant's
/// `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

const DAY_MS: u64 = 86_400_000;

/// The day of a time: days since the epoch (what q15–q17 group by).
pub fn day_of(ms: u64) -> u64 {
    ms / DAY_MS
}

/// `DATE_FORMAT(t, 'yyyy-MM-dd')` of a day number (UTC).
pub fn day_text(day: u64) -> String {
    match timestamp_bytes(day.saturating_mul(DAY_MS)) {
        Some(b) => ascii(&b[..10]).to_owned(),
        None => {
            let (y, m, d) = civil(day as i64);
            format!("{y:04}-{m:02}-{d:02}")
        }
    }
}

/// Two decimal digits of `v` (below 100) into `out[..2]`.
fn put2(out: &mut [u8], v: u64) {
    out[0] = b'0' + (v / 10 % 10) as u8;
    out[1] = b'0' + (v % 10) as u8;
}

/// `yyyy-MM-dd HH:mm:ss.SSS` of `ms` (UTC) as bytes, written digit by digit (the rows of q10
/// format one per bid); `None` past the year 9999.
fn timestamp_bytes(ms: u64) -> Option<[u8; 23]> {
    let (y, m, d) = civil((ms / DAY_MS) as i64);
    let y = u64::try_from(y).ok().filter(|y| *y <= 9999)?;
    let mut b = *b"0000-00-00 00:00:00.000";
    put2(&mut b[0..2], y / 100);
    put2(&mut b[2..4], y % 100);
    put2(&mut b[5..7], u64::from(m));
    put2(&mut b[8..10], u64::from(d));
    let t = ms % DAY_MS;
    put2(&mut b[11..13], t / 3_600_000);
    put2(&mut b[14..16], t / 60_000 % 60);
    put2(&mut b[17..19], t / 1000 % 60);
    b[20] = b'0' + (t % 1000 / 100) as u8;
    put2(&mut b[21..23], t % 100);
    Some(b)
}

/// Bytes this module wrote from ASCII digits and separators, as text.
fn ascii(b: &[u8]) -> &str {
    std::str::from_utf8(b).expect("digits and separators are ASCII")
}

thread_local! {
    /// The last minute q10 named, with its day and minute texts: bids come in time order
    /// (give or take), so most find theirs here.
    static LAST_MINUTE: std::cell::RefCell<(u64, Arc<str>, Arc<str>)> =
        std::cell::RefCell::new((u64::MAX, Arc::from(""), Arc::from("")));
}

fn with_minute<R>(ms: u64, f: impl FnOnce(&Arc<str>, &Arc<str>) -> R) -> R {
    LAST_MINUTE.with_borrow_mut(|(minute, day, hm)| {
        if *minute != ms / 60_000 {
            *minute = ms / 60_000;
            *day = day_text(day_of(ms)).into();
            *hm = minute_text(minute_of_day(ms)).into();
        }
        f(day, hm)
    })
}

/// [`day_text`] of the day of `ms`, through a per-thread cache of the last minute.
pub fn cached_day_text(ms: u64) -> Arc<str> {
    with_minute(ms, |day, _| day.clone())
}

/// [`minute_text`] of the minute of `ms`, through a per-thread cache of the last minute.
pub fn cached_minute_text(ms: u64) -> Arc<str> {
    with_minute(ms, |_, hm| hm.clone())
}

/// `HOUR(t)` (UTC).
pub fn hour_of(ms: u64) -> u64 {
    ms % DAY_MS / 3_600_000
}

/// Minutes into the day: `DATE_FORMAT(t, 'HH:mm')` as a number (ordered as the text).
pub fn minute_of_day(ms: u64) -> u64 {
    ms % DAY_MS / 60_000
}

/// `HH:mm` of a minute of the day.
pub fn minute_text(minute: u64) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

/// `yyyy-MM-dd HH:mm:ss.SSS` (UTC), as Flink writes a `TIMESTAMP(3)` in CSV.
pub fn timestamp_text(ms: u64) -> String {
    match timestamp_bytes(ms) {
        Some(b) => ascii(&b).to_owned(),
        None => {
            let m = ms % DAY_MS;
            format!(
                "{} {:02}:{:02}:{:02}.{:03}",
                day_text(day_of(ms)),
                m / 3_600_000,
                m / 60_000 % 60,
                m / 1000 % 60,
                m % 1000
            )
        }
    }
}

macro_rules! rows {
    ($($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident : $ty:ty),+ $(,)? })+) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub struct $name { $($(#[$fdoc])* pub $field: $ty),+ }
        weir::serde_record!($name);
    )+};
}

rows! {
    /// q0: a bid passed through.
    Q0Row { auction: u64, bidder: u64, price: u64, date_time: u64, extra: String }
    /// q1: a bid's price in euro.
    Q1Row { auction: u64, bidder: u64, price: Decimal, date_time: u64, extra: String }
    /// q2: bids on every 123rd auction.
    Q2Row { auction: u64, price: u64 }
    /// q3: a seller in or, id or ca, and their auction in category 10.
    Q3Row { name: String, city: String, state: String, id: u64 }
    /// q4: a category's average winning price (an updating row, by category).
    Q4Row { id: u64, r#final: u64 }
    /// q5: an auction with the most bids of a sliding window.
    Q5Row { auction: u64, num: u64 }
    /// q7: a bid at the highest price of a 10 s window (Flink's columns, in their order).
    Q7Row { auction: u64, price: u64, bidder: u64, date_time: u64, extra: String }
    /// q8: a person who opened an auction in the 10 s window they registered in.
    Q8Row { id: u64, name: String, stime: u64 }
    /// q9: an auction and its winning bid.
    Q9Row {
        id: u64, item_name: String, description: String, initial_bid: u64, reserve: u64,
        date_time: u64, expires: u64, seller: u64, category: u64, extra: String,
        auction: u64, bidder: u64, price: u64, bid_date_time: u64, bid_extra: String,
    }
    /// q10: a bid in its partition (`dt`, `hm`; directories of the file sink; shared by the
    /// rows of a minute).
    Q10Row { auction: u64, bidder: u64, price: u64, date_time: u64, extra: String, dt: Arc<str>, hm: Arc<str> }
    /// q11: a bidder's session and its bids.
    Q11Row { bidder: u64, bid_count: u64, starttime: u64, endtime: u64 }
    /// q12: a bidder's bids in a 10 s window of processing time.
    Q12Row { bidder: u64, bid_count: u64, starttime: u64, endtime: u64 }
    /// q13: a bid with the side input's value for its auction.
    Q13Row { auction: u64, bidder: u64, price: u64, date_time: u64, value: String }
    /// q14: a bid priced between 1 M and 50 M euro, with its time of day and its `c`s.
    Q14Row {
        auction: u64, bidder: u64, price: Decimal, bid_time_type: String, date_time: u64,
        extra: String, c_counts: u64,
    }
    /// q15: a day's bids, bidders and auctions, in all and by price rank (updating, by day).
    Q15Row {
        day: String, total_bids: u64, rank1_bids: u64, rank2_bids: u64, rank3_bids: u64,
        total_bidders: u64, rank1_bidders: u64, rank2_bidders: u64, rank3_bidders: u64,
        total_auctions: u64, rank1_auctions: u64, rank2_auctions: u64, rank3_auctions: u64,
    }
    /// q16: q15 per channel and day, with the latest minute (updating, by channel and day).
    Q16Row {
        channel: String, day: String, minute: String, total_bids: u64, rank1_bids: u64,
        rank2_bids: u64, rank3_bids: u64, total_bidders: u64, rank1_bidders: u64,
        rank2_bidders: u64, rank3_bidders: u64, total_auctions: u64, rank1_auctions: u64,
        rank2_auctions: u64, rank3_auctions: u64,
    }
    /// q17: an auction's bids of a day (updating, by auction and day).
    Q17Row {
        auction: u64, day: String, total_bids: u64, rank1_bids: u64, rank2_bids: u64,
        rank3_bids: u64, min_price: u64, max_price: u64, avg_price: u64, sum_price: u64,
    }
    /// q18: a bidder's last bid on an auction (updating, by bidder and auction).
    Q18Row {
        auction: u64, bidder: u64, price: u64, channel: String, url: String, date_time: u64,
        extra: String,
    }
    /// q19: one of an auction's ten highest bids (updating, by auction and rank).
    Q19Row {
        auction: u64, bidder: u64, price: u64, channel: String, url: String, date_time: u64,
        extra: String, rank_number: u64,
    }
    /// q20: a bid with its auction, of category 10.
    Q20Row {
        auction: u64, bidder: u64, price: u64, channel: String, url: String,
        bid_date_time: u64, bid_extra: String, item_name: String, description: String,
        initial_bid: u64, reserve: u64, auction_date_time: u64, expires: u64, seller: u64,
        category: u64, auction_extra: String,
    }
    /// q21: a bid with its channel's id.
    Q21Row { auction: u64, bidder: u64, price: u64, channel: String, channel_id: String }
    /// q22: a bid with its URL's first three directories.
    Q22Row {
        auction: u64, bidder: u64, price: u64, channel: String, dir1: Option<String>,
        dir2: Option<String>, dir3: Option<String>,
    }
}

/// q10's line in its part file: Flink's CSV of the columns that are not partition keys.
impl fmt::Display for Q10Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut digits = itoa::Buffer::new();
        for n in [self.auction, self.bidder, self.price] {
            f.write_str(digits.format(n))?;
            f.write_str(",")?;
        }
        match timestamp_bytes(self.date_time) {
            Some(b) => f.write_str(ascii(&b))?,
            None => f.write_str(&timestamp_text(self.date_time))?,
        }
        f.write_str(",")?;
        f.write_str(&self.extra)
    }
}

/// Price ranks of q15–q17: 1 below 10,000, 2 below 1,000,000, 3 from there on.
pub fn price_rank(price: u64) -> usize {
    if price < 10_000 {
        1
    } else if price < 1_000_000 {
        2
    } else {
        3
    }
}

/// q14's `bidTimeType`.
pub fn bid_time_type(ms: u64) -> &'static str {
    match hour_of(ms) {
        8..=18 => "dayTime",
        0..=6 | 20..=23 => "nightTime",
        _ => "otherTime",
    }
}

/// q21's `REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)`: the value of the first
/// `channel_id=` at the start of the URL or after a `&`.
pub fn channel_id_of(url: &str) -> Option<&str> {
    const KEY: &str = "channel_id=";
    let mut from = 0;
    while let Some(at) = url[from..].find(KEY).map(|i| i + from) {
        if at == 0 || url.as_bytes()[at - 1] == b'&' {
            let value = &url[at + KEY.len()..];
            return Some(value.split('&').next().unwrap_or(""));
        }
        from = at + 1;
    }
    None
}

/// q21's `channel_id`: the hot channels' fixed ids, else the one in the URL.
pub fn channel_id(channel: &str, url: &str) -> Option<String> {
    let fixed = [("apple", "0"), ("google", "1"), ("facebook", "2"), ("baidu", "3")];
    fixed
        .iter()
        .find(|(name, _)| channel.eq_ignore_ascii_case(name))
        .map(|(_, id)| (*id).to_owned())
        .or_else(|| channel_id_of(url).map(str::to_owned))
}

/// `SPLIT_INDEX(s, '/', i)`: the `i`-th piece (empty pieces counted), or none.
pub fn split_index(s: &str, i: usize) -> Option<String> {
    s.split('/').nth(i).map(str::to_owned)
}

/// q14's `count_char(extra, 'c')`.
pub fn count_char(s: &str, c: u8) -> u64 {
    s.bytes().filter(|&b| b == c).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SQL functions as Flink computes them, on cases with known answers.
    #[test]
    fn functions_match_their_sql() {
        assert_eq!(Decimal::euro(1234).to_string(), "1120.472");
        assert_eq!(Decimal::euro(1).to_string(), "0.908");
        assert_eq!(Decimal { unscaled: -5, scale: 3 }.to_string(), "-0.005");
        let back: Decimal = serde_json::from_str("\"1120.472\"").expect("parses");
        assert_eq!(back, Decimal::euro(1234));
        assert_eq!(day_text(0), "1970-01-01");
        assert_eq!(day_text(day_of(1_735_689_600_000)), "2025-01-01");
        assert_eq!(day_text(day_of(951_782_400_000)), "2000-02-29");
        assert_eq!(timestamp_text(1_735_689_599_999), "2024-12-31 23:59:59.999");
        assert_eq!(minute_text(minute_of_day(1_735_689_599_999)), "23:59");
        assert_eq!(timestamp_text(1_735_689_600_007), "2025-01-01 00:00:00.007");
        assert_eq!(timestamp_text(951_825_723_450), "2000-02-29 12:02:03.450");
        assert_eq!(&*cached_day_text(1_735_689_599_999), "2024-12-31");
        assert_eq!(&*cached_minute_text(1_735_689_600_000), "00:00");
        assert_eq!(&*cached_day_text(1_735_689_600_000), "2025-01-01");
        // Past the year 9999 the texts come from the general formatter.
        assert_eq!(day_text(2_932_896), "9999-12-31");
        assert_eq!(day_text(2_932_897), "10000-01-01");
        assert_eq!(bid_time_type(7 * 3_600_000), "otherTime");
        assert_eq!(bid_time_type(18 * 3_600_000 + 59 * 60_000), "dayTime");
        assert_eq!(bid_time_type(20 * 3_600_000), "nightTime");
        assert_eq!(channel_id_of("https://x/item.htm?query=1&channel_id=42"), Some("42"));
        assert_eq!(channel_id_of("channel_id=7&a=b"), Some("7"));
        assert_eq!(channel_id_of("https://x/?xchannel_id=1&channel_id=&z"), Some(""));
        assert_eq!(channel_id_of("https://x/?query=1"), None);
        assert_eq!(channel_id("Google", "https://x/?channel_id=9"), Some("1".to_owned()));
        let url = "https://www.nexmark.com/ab/c_d/efg/item.htm?query=1";
        assert_eq!(split_index(url, 3).as_deref(), Some("ab"));
        assert_eq!(split_index(url, 5).as_deref(), Some("efg"));
        assert_eq!(split_index("a/b", 5), None);
        assert_eq!(count_char("ccabc", b'c'), 3);
        assert_eq!(price_rank(9_999), 1);
        assert_eq!(price_rank(10_000), 2);
        assert_eq!(price_rank(1_000_000), 3);
    }
}
