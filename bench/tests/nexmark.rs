//! Nexmark's suite, every query exact: each query's result (its rows, or an updating query's
//! last row per key) is the single-threaded reference's over the same events, at p = 1, 2
//! and 4, under settings chosen so windows fire mid-stream and events come out of order; and
//! the queries a job file can express give the same rows from their job files.
//!
//! Small sizes (CI's share); `weir-bench nexmark` checks the same at full size.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir::io::nexmark::NexmarkConfig;
use weir_bench::nexmark::output::Digest;
use weir_bench::nexmark::queries::QUERIES;
use weir_bench::nexmark::reference::{Expected, expected_of};
use weir_bench::nexmark::rows::Q12Row;
use weir_bench::nexmark::{Bench, Scratch, q10_expected};

/// Fails the test (ends the process) if a job is still running after `limit`: a hung job.
struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn start(what: String, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while start.elapsed() < limit {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("watchdog: {what} still running after {limit:?}");
            std::process::exit(101);
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The wall clock, ms since the Unix epoch (processing time).
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis() as u64
}

/// Run every query at p = 1, 2, 4 over `config`'s events: each result must be the
/// reference's, with no record behind the watermark, and not empty.
fn suite(name: &str, config: NexmarkConfig) {
    config.check().unwrap_or_else(|e| panic!("{name}: {e:?}"));
    let mut bench = Bench::new(config, true).unwrap_or_else(|e| panic!("{name}: {e}"));
    bench.keep = true;
    for q in QUERIES {
        let expected = match q {
            // q10's rows are lines in partition directories, read back and compared as
            // (partition, line) pairs.
            "q10" => {
                Expected { digest: Digest::of(&q10_expected(bench.events.as_ref().expect("checking"))), rows: None }
            }
            _ => bench.expected(q).expect("checking"),
        };
        for p in [1, 2, 4] {
            let watchdog = Watchdog::start(format!("{name} {q} p={p}"), Duration::from_secs(120));
            let started_ms = wall_clock_ms();
            let (o, out) = bench.run(q, p, Some(&expected)).unwrap_or_else(|e| panic!("{name} {q} p={p}: {e}"));
            let ended_ms = wall_clock_ms();
            drop(watchdog);
            if q == "q12" {
                // Processing time: which bids share a window depends on when they came, so the
                // digest compares each bidder's bids summed over its windows; here, every
                // window is 10 s of the wall clock, aligned, and open while the job ran.
                for row in out.rows() {
                    let r: Q12Row = serde_json::from_str(&row).expect("q12 rows read back");
                    assert_eq!(r.endtime - r.starttime, 10_000, "{name} q12 p={p}: {row}");
                    assert_eq!(r.starttime % 10_000, 0, "{name} q12 p={p}: {row}");
                    assert!(
                        r.endtime > started_ms && r.starttime <= ended_ms,
                        "{name} q12 p={p}: {row} not while it ran"
                    );
                }
            }
            assert_eq!(o.late, 0, "{name} {q} p={p}: records came behind the watermark");
            // Rows compared one by one where both sides kept them (q12: totals per bidder,
            // compares digests).
            if let Some(want) = expected.rows.as_ref().filter(|_| q != "q12") {
                let got = out.rows();
                if &got != want {
                    let missing: Vec<&String> = want.iter().filter(|r| got.binary_search(r).is_err()).take(3).collect();
                    let extra: Vec<&String> = got.iter().filter(|r| want.binary_search(r).is_err()).take(3).collect();
                    panic!(
                        "{name} {q} p={p}: {} rows, the reference has {}; missing {missing:#?}, extra {extra:#?}",
                        got.len(),
                        want.len()
                    );
                }
            }
            assert_eq!(o.exact, Some(true), "{name} {q} p={p}: {} rows against {}", o.rows, expected.digest.rows);
            assert!(o.rows > 0, "{name} {q} p={p}: no rows; the setting tests nothing here");
        }
    }
}

/// In order, 1,000 events a second: 24 s of event time from 12 s before midnight (a new day
/// and new minutes mid-stream, for q10 and q15–q17), so every 10 s window fires mid-stream.
#[test]
fn in_order_across_midnight() {
    let base = 1_735_689_600_000 - 12_000; // 2024-12-31T23:59:48Z
    suite("in-order", NexmarkConfig::new(Some(24_000), 1_000, base));
}

/// Out of order within groups of 400 events (0.2 s), 2,000 events a second from a time on
/// no second boundary, a third of the bids on hot auctions.
#[test]
fn out_of_order_unaligned() {
    let mut c = NexmarkConfig::new(Some(30_000), 2_000, 1_741_507_193_217);
    c.out_of_order_group_size = 400;
    c.hot_auction_ratio = 3;
    suite("out-of-order", c);
}

/// Other mixes and sizes: bids of 300 bytes, three categories, no hot sellers, groups of 50,
/// across 19:00 (q14's day/other time) at 800 events a second.
#[test]
fn other_settings() {
    let mut c = NexmarkConfig::new(Some(16_000), 800, 1_751_309_995_500); // 2025-06-30T18:59:55.5Z
    c.out_of_order_group_size = 50;
    c.avg_bid_bytes = 300;
    c.num_categories = 3;
    c.hot_seller_ratio = 1;
    suite("other", c);
}

/// Run a job file of `tests/jobs/` with `vars`, its file sink into a fresh directory; the
/// lines of its part files.
fn run_job_file(name: &str, vars: &[(&str, String)], out_var: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/jobs").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let scratch = Scratch::new("jobfile").unwrap();
    let out = scratch.path().join("out");
    let lookup = |k: &str| {
        if k == out_var {
            return Some(out.display().to_string());
        }
        vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    };
    let loaded = weir::graph::jobfile::parse_with(&path, &text, &lookup).unwrap_or_else(|e| panic!("{e}"));
    let watchdog = Watchdog::start(name.to_owned(), Duration::from_secs(120));
    loaded.job.run().unwrap_or_else(|e| panic!("{name}: {e}"));
    drop(watchdog);
    let mut lines = Vec::new();
    for part in std::fs::read_dir(&out).unwrap().flatten() {
        lines.extend(std::fs::read_to_string(part.path()).unwrap().lines().map(str::to_owned));
    }
    lines
}

/// The `name=value` fields of a job file's output line (`window=[a, b)` as `a`, `b`).
fn fields(line: &str) -> BTreeMap<String, u64> {
    let line = line.replace("window=[", "start=").replace(", ", " end=").replace(')', "");
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_owned(), v)))
        .collect()
}

/// The queries a job file can express — q2, q11 and q12 — give the reference's rows from
/// their job files in `tests/jobs/` (see `weir_bench::nexmark::queries` for why the others
/// cannot), at p = 1 and 2.
#[test]
fn job_files_give_the_same_rows() {
    let base = 1_735_689_600_000;
    for p in [1, 2] {
        // q2 at the file's rate (10 M/s): (auction, price) per line.
        let events = 40_000;
        let config = NexmarkConfig::new(Some(events), 10_000_000, base);
        let all: Vec<_> = config.events_in_order(u64::MAX).collect();
        let side = Default::default();
        let vars = [("NEXMARK_EVENTS", events.to_string()), ("NEXMARK_P", p.to_string())];
        let mut got: Vec<String> = run_job_file("nexmark-q2.toml", &vars, "Q2_OUT")
            .iter()
            .map(|l| {
                let f = fields(l);
                format!(r#"{{"auction":{},"price":{}}}"#, f["key"], f["value"])
            })
            .collect();
        got.sort();
        assert_eq!(Some(got), expected_of("q2", &all, &side, true).rows, "q2 p={p}");

        // q11 at 1,000 events a second, sessions closing mid-stream.
        let events = 24_000;
        let config = NexmarkConfig::new(Some(events), 1_000, base);
        let all: Vec<_> = config.events_in_order(u64::MAX).collect();
        let vars =
            [("NEXMARK_EVENTS", events.to_string()), ("NEXMARK_P", p.to_string()), ("NEXMARK_RATE", "1000".to_owned())];
        let mut got: Vec<String> = run_job_file("nexmark-q11.toml", &vars, "Q11_OUT")
            .iter()
            .map(|l| {
                let f = fields(l);
                format!(
                    r#"{{"bidder":{},"bid_count":{},"starttime":{},"endtime":{}}}"#,
                    f["key"],
                    f["count"],
                    f["start"] / 1_000_000,
                    f["end"] / 1_000_000
                )
            })
            .collect();
        got.sort();
        assert_eq!(Some(got), expected_of("q11", &all, &side, true).rows, "q11 p={p}");

        // q12: processing-time windows; each bidder's bids summed over them.
        let events = 20_000;
        let config = NexmarkConfig::new(Some(events), 10_000_000, base);
        let all: Vec<_> = config.events_in_order(u64::MAX).collect();
        let vars = [("NEXMARK_EVENTS", events.to_string()), ("NEXMARK_P", p.to_string())];
        let lines = run_job_file("nexmark-q12.toml", &vars, "Q12_OUT");
        let totals = weir_bench::nexmark::reference::q12_totals(lines.iter().map(|l| {
            let f = fields(l);
            assert_eq!(f["end"] - f["start"], 10_000_000_000, "{l}");
            assert_eq!(f["start"] % 10_000_000_000, 0, "{l}");
            (f["key"], f["count"])
        }));
        assert_eq!(Digest::of(&totals), expected_of("q12", &all, &side, false).digest, "q12 p={p}");
    }
}
