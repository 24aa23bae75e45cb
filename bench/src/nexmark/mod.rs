//! Nexmark on weir: Flink's suite (q0–q22 but q6, as there), over Nexmark's own events with
//! their strings, from weir's Nexmark source ([`weir::io::nexmark`], the `nexmark` crate's
//! generator), each query a job written with the public API ([`queries`]), each result
//! checked exactly against a plain single-threaded reference over the same events
//! ([`mod@reference`]).
//!
//! ```sh
//! cargo run --release -p weir-bench -- nexmark                       # every query, 5·10^6 events, p=1
//! cargo run --release -p weir-bench -- nexmark --queries q5,q7 --parallelism 1,2 \
//!     --events 1000000 --rate 1000 --set out_of_order_group_size=1000
//! cargo run --release -p weir-bench -- nexmark --flink                # Flink's size: 10^8 events at 10 M/s
//! cargo run --release -p weir-bench -- nexmark --rows out/            # each query's rows, JSON lines
//! ```
//!
//! **What is measured.** Events per CPU-second: the events of the sequence (persons,
//! auctions and bids) over the CPU time of the whole process while the job ran, less the
//! CPU time the source subtasks spent in the generator (measured per poll with their
//! thread's clock, [`weir::io::nexmark::NexmarkStats`]) — the engine's cost alone, as the
//! issue's targets count it; with the generator too, in the details. The rows go to a sink
//! that digests them (FxHash per row), counted in the query's cost (Flink's suite uses a
//! blackhole sink).
//!
//! **Fresh memory.** On a VM that reports free memory to its host (virtio-balloon free page
//! reporting) a page the guest gave back costs 10–20 µs to touch again instead of a fraction
//! of a microsecond ([`crate::measure::page_touch_us`]), charged to whoever touches it. q10
//! writes ~100 bytes of page cache per bid and is the query this moves most: 5·10^6 events
//! measured 3.1–4.0 M events/CPU-s with the pages at hand and 0.9–1.8 M without, on one
//! build. The report's `setup.fresh_page_touch_us` says how the host stood before and after.
//!
//! **Exact.** The check generates the same events again on one thread and compares the
//! digest of the reference's rows with the job's (an updating query's last row per key).
//! Where a query's SQL leaves an order open (ties in `ROW_NUMBER`), both use one total
//! order. q12 counts in processing time, so its windows depend on when the job ran: its
//! rows are checked summed per bidder (every bid in exactly one window). Every check also
//! requires that no record came behind the watermark (the settings keep the disorder under
//! Flink's 4 s); a job with late records is reported, not called exact.
//!
//! Deviations from Flink's SQL, each named where the query is built ([`queries`],
//! [`process`]): the crate's states are lower case (q3 compares `or`, `id`, `ca`); updating
//! queries (q4, q15–q19) emit a group's new row when the watermark advances, not one per input
//! record (as Flink's mini-batches), and their result is the last row per key; q4 and q9 emit
//! an auction's result once, when the watermark passes its end (no bid can change it after);
//! q7's row carries Flink's columns under their own names (Flink's `INSERT` writes the price
//! into `bidder`).

pub mod fixed;
pub mod output;
pub mod parts;
pub mod process;
pub mod queries;
pub mod reference;
pub mod rows;

use crate::measure::{Cost, measure};
use crate::report::{Row, Section};
use output::{Digest, Output};
use queries::{QUERIES, Setup};
use reference::Expected;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use weir::io::nexmark::{NexmarkConfig, NexmarkEvent};

/// `weir-bench nexmark`'s command line.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Queries, comma-separated (default: all of q0–q22 but q6).
    #[arg(long, value_delimiter = ',')]
    pub queries: Vec<String>,
    /// Parallelism of every node, comma-separated: each query runs at each (default 1).
    #[arg(long, value_delimiter = ',')]
    pub parallelism: Vec<u32>,
    /// Events in all (persons, auctions, bids; default 5,000,000; 20,000 in a smoke run).
    #[arg(long)]
    pub events: Option<u64>,
    /// Events per second of event time (default 10,000,000: Flink's suite).
    #[arg(long)]
    pub rate: Option<u64>,
    /// The first event's time, ms since the Unix epoch (default 2025-01-01T00:00:00Z).
    #[arg(long)]
    pub base_time_ms: Option<u64>,
    /// Any other generator setting, by its job-file name (repeatable):
    /// `--set out_of_order_group_size=1000 --set hot_auction_ratio=1`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Flink's suite size: 10^8 events at 10 M events/s (what --events and --rate give
    /// otherwise).
    #[arg(long)]
    pub flink: bool,
    /// Write each query's rows as JSON lines into DIR (`<query>-p<p>.jsonl`; q10's rows are
    /// its partition directories, `q10-p<p>/`).
    #[arg(long, value_name = "DIR")]
    pub rows: Option<PathBuf>,
    /// Check every result against the reference (default: up to 10^7 events; the
    /// reference holds every event in memory).
    #[arg(long, conflicts_with = "no_check")]
    pub check: bool,
    /// Do not check.
    #[arg(long)]
    pub no_check: bool,
    /// q5's window cache per subtask, MiB (default: the window operator's 64 MiB).
    #[arg(long)]
    pub q5_cache_mb: Option<u64>,
    /// Also run the fixed 64-byte events (no strings) of the earlier suite, q0–q5, q7, q8,
    /// as rows of their own.
    #[arg(long)]
    pub fixed: bool,
}

/// The fixed base time of every run unless given: 2025-01-01T00:00:00Z.
pub const BASE_TIME_MS: u64 = 1_735_689_600_000;

/// Events up to which a run checks by default.
const CHECK_UP_TO: u64 = 10_000_000;

impl Args {
    /// No argument given: every default.
    pub const NONE: Args = Args {
        queries: Vec::new(),
        parallelism: Vec::new(),
        events: None,
        rate: None,
        base_time_ms: None,
        set: Vec::new(),
        flink: false,
        rows: None,
        check: false,
        no_check: false,
        q5_cache_mb: None,
        fixed: false,
    };

    /// The generator's settings these arguments give.
    pub fn config(&self, smoke: bool) -> Result<NexmarkConfig, String> {
        let events = match (self.flink, self.events) {
            (true, _) => 100_000_000,
            (false, Some(n)) => n,
            (false, None) if smoke => 20_000,
            (false, None) => 5_000_000,
        };
        let rate = if self.flink { 10_000_000 } else { self.rate.unwrap_or(10_000_000) };
        let mut c = NexmarkConfig::new(Some(events), rate, self.base_time_ms.unwrap_or(BASE_TIME_MS));
        for kv in &self.set {
            let (k, v) = kv.split_once('=').ok_or_else(|| format!("--set {kv}: write KEY=VALUE"))?;
            c.set(k.trim(), v.trim()).map_err(|e| format!("--set {kv}: {e}"))?;
        }
        c.check().map_err(|(field, problem)| format!("{field}: {problem}"))?;
        Ok(c)
    }

    /// The queries chosen.
    pub fn queries(&self) -> Result<Vec<&'static str>, String> {
        if self.queries.is_empty() {
            return Ok(QUERIES.to_vec());
        }
        self.queries
            .iter()
            .map(|q| {
                QUERIES.iter().copied().find(|x| x == q).ok_or_else(|| {
                    format!("`{q}` is not a query of the suite (q6 is in none); use {}", QUERIES.join(", "))
                })
            })
            .collect()
    }

    fn parallelism(&self) -> Vec<u32> {
        if self.parallelism.is_empty() { vec![1] } else { self.parallelism.clone() }
    }

    fn checking(&self, events: u64) -> bool {
        self.check || (!self.no_check && events <= CHECK_UP_TO)
    }
}

/// One query run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Query.
    pub query: &'static str,
    /// Parallelism.
    pub parallelism: u32,
    /// Events generated.
    pub events: u64,
    /// Rows in the result (an updating query: its last row per key).
    pub rows: u64,
    /// Rows the query emitted (updating queries: every update).
    pub emitted: u64,
    /// The job's cost: the whole process while it ran.
    pub cost: Cost,
    /// CPU seconds the source spent in the generator (in `cost`).
    pub generator_cpu_s: f64,
    /// Records that came behind the watermark (all nodes).
    pub late: u64,
    /// Keys windows evicted to RocksDB.
    pub evicted_keys: u64,
    /// `Some(true)`: the result is the reference's; `None`: not checked.
    pub exact: Option<bool>,
    /// The rows' JSON lines (or q10's directory), if written.
    pub written: Option<PathBuf>,
    /// The job's peak RSS sample.
    pub max_rss_bytes: u64,
}

impl Outcome {
    /// Events per CPU-second, the generator's CPU taken off.
    pub fn per_engine_cpu_s(&self) -> f64 {
        self.events as f64 / (self.cost.cpu_s - self.generator_cpu_s).max(1e-9)
    }
}

/// A working directory for a run (q10's partitions, q13's side input), removed on drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory under the temp dir.
    pub fn new(what: &str) -> std::io::Result<Scratch> {
        use std::sync::atomic::AtomicU64;
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "weir-nexmark-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Everything needed to run queries over one event sequence.
#[derive(Debug)]
pub struct Bench {
    /// The generator's settings.
    pub config: NexmarkConfig,
    /// The reference's events, when checking.
    pub events: Option<Vec<NexmarkEvent>>,
    /// Holds q13's side input and q10's partitions; removed with the bench.
    scratch: Scratch,
    side_input: PathBuf,
    side: HashMap<u64, String>,
    /// Where rows go, if written.
    pub rows_dir: Option<PathBuf>,
    /// q5's cache.
    pub q5_cache_bytes: Option<u64>,
    /// Keep rows as JSON in memory for a test's messages.
    pub keep: bool,
}

impl Bench {
    /// Runs over `config`'s sequence; `check`: generate the reference's events now.
    pub fn new(config: NexmarkConfig, check: bool) -> Result<Bench, String> {
        let scratch = Scratch::new("run").map_err(|e| format!("cannot make a scratch directory: {e}"))?;
        let side_input = scratch.path().join("side_input.txt");
        queries::write_side_input(&side_input).map_err(|e| format!("{}: {e}", side_input.display()))?;
        let side = queries::read_side_input(&side_input)?;
        let events = check.then(|| config.events_in_order(u64::MAX).collect());
        Ok(Bench { config, events, scratch, side_input, side, rows_dir: None, q5_cache_bytes: None, keep: false })
    }

    /// The reference's result of `q` (when checking).
    pub fn expected(&self, q: &str) -> Option<Expected> {
        self.events.as_ref().map(|events| reference::expected_of(q, events, &self.side, self.keep || q == "q12"))
    }

    /// Run `q` at parallelism `p`; compare with `expected` if given.
    pub fn run(&self, q: &'static str, p: u32, expected: Option<&Expected>) -> Result<(Outcome, Output), String> {
        let out = match &self.rows_dir {
            Some(dir) if q != "q10" => Output::json_lines(dir.join(format!("{q}-p{p}.jsonl")))
                .map_err(|e| format!("cannot write {q}'s rows into {}: {e}", dir.display()))?,
            _ => Output::digest(),
        };
        let out = out.keep(self.keep || q == "q12");
        let q10_dir = match &self.rows_dir {
            Some(dir) => dir.join(format!("q10-p{p}")),
            None => self.scratch.path().join(format!("q10-p{p}")),
        };
        if q == "q10" {
            // A fresh directory: the check reads back every partition in it.
            let _ = std::fs::remove_dir_all(&q10_dir);
        }
        // Each run counts its own generator time.
        let config = NexmarkConfig { stats: Default::default(), ..self.config.clone() };
        let setup = Setup {
            config: config.clone(),
            p,
            out: out.clone(),
            q5_cache_bytes: self.q5_cache_bytes,
            side_input: self.side_input.clone(),
            q10_dir: q10_dir.clone(),
        };
        let job = queries::job(q, &setup)?;
        let (summary, cost) = measure(|| job.run());
        let summary = summary.map_err(|e| format!("nexmark {q} p={p}: {e}"))?;
        let late: u64 = summary.nodes.iter().map(|n| n.late_records).sum();
        let evicted_keys: u64 = summary.nodes.iter().map(|n| n.evicted_keys).sum();
        let (digest, emitted) = match q {
            "q10" => {
                let d = q10_digest(&q10_dir)?;
                (d, d.rows)
            }
            "q12" => (q12_digest(&out.rows()), out.emitted()),
            _ => (out.result(), out.emitted()),
        };
        let exact = expected.map(|e| e.digest == digest && late == 0);
        let written = match (&self.rows_dir, q) {
            (Some(_), "q10") => Some(q10_dir),
            (Some(_), _) => out.path().cloned(),
            _ => None,
        };
        if self.rows_dir.is_none() && q == "q10" {
            let _ = std::fs::remove_dir_all(setup.q10_dir);
        }
        let outcome = Outcome {
            query: q,
            parallelism: p,
            events: config.events.unwrap_or(0),
            rows: digest.rows,
            emitted,
            cost,
            generator_cpu_s: config.stats.generator_cpu().as_secs_f64(),
            late,
            evicted_keys,
            exact,
            written,
            max_rss_bytes: summary.max_rss_bytes,
        };
        Ok((outcome, out))
    }
}

/// q10's result read back from its partitions: each line with its partition, and every
/// partition committed (its `_SUCCESS` there, no part in progress).
///
/// Read part file by part file, each line hashed as `(partition, line)` (the digest of
/// [`q10_expected`]'s pairs): at 10^8 events the parts hold ~10 GB, more than memory.
pub fn q10_digest(dir: &Path) -> Result<Digest, String> {
    use std::io::BufRead;
    let mut out = Digest::default();
    let read = |p: &Path| std::fs::read_dir(p).map_err(|e| format!("q10: cannot list {}: {e}", p.display()));
    for dt in read(dir)?.flatten() {
        for hm in read(&dt.path())?.flatten() {
            let partition = format!("{}/{}", dt.file_name().to_string_lossy(), hm.file_name().to_string_lossy());
            if !hm.path().join(weir::io::SUCCESS_FILE).exists() {
                return Err(format!("q10: partition {partition} was not committed (no _SUCCESS)"));
            }
            for part in read(&hm.path())?.flatten() {
                let name = part.file_name().to_string_lossy().into_owned();
                if name.ends_with(".inprogress") {
                    return Err(format!("q10: {partition}/{name} is still in progress"));
                }
                if !name.starts_with("part-") {
                    continue;
                }
                // Line by line: at Flink's size one part holds gigabytes.
                let file = std::fs::File::open(part.path()).map_err(|e| format!("q10: {name}: {e}"))?;
                let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
                let mut line = String::new();
                loop {
                    line.clear();
                    let n = reader.read_line(&mut line).map_err(|e| format!("q10: {name}: {e}"))?;
                    if n == 0 {
                        break;
                    }
                    let text = line.strip_suffix('\n').unwrap_or(&line);
                    let text = text.strip_suffix('\r').unwrap_or(text);
                    out.add(output::hash_of(&(partition.as_str(), text)));
                }
            }
        }
    }
    Ok(out)
}

/// The reference's q10 lines.
pub fn q10_expected(events: &[NexmarkEvent]) -> Vec<(String, String)> {
    let rows = events.iter().filter_map(NexmarkEvent::as_bid).map(|b| rows::Q10Row {
        auction: b.auction,
        bidder: b.bidder,
        price: b.price,
        date_time: b.date_time,
        extra: b.extra.clone(),
        dt: rows::day_text(rows::day_of(b.date_time)).into(),
        hm: rows::minute_text(rows::minute_of_day(b.date_time)).into(),
    });
    rows.map(|r| (format!("dt={}/hm={}", r.dt, r.hm), r.to_string())).collect()
}

/// q12's rows summed per bidder.
fn q12_digest(rows: &[String]) -> Digest {
    let pairs = rows.iter().map(|r| {
        let row: rows::Q12Row = serde_json::from_str(r).expect("q12 rows read back");
        (row.bidder, row.bid_count)
    });
    Digest::of(&reference::q12_totals(pairs))
}

/// Run the chosen queries at the chosen parallelisms; a mismatch with the reference fails
/// the run (a wrong figure is worse than none).
pub fn run_all(args: &Args, smoke: bool) -> Result<(Vec<Outcome>, NexmarkConfig, Cost, bool), String> {
    let config = args.config(smoke)?;
    let n = config.events.unwrap_or(0);
    let check = args.checking(n);
    let (bench, generation) = measure(|| Bench::new(config.clone(), check));
    let mut bench = bench?;
    bench.q5_cache_bytes = args.q5_cache_mb.map(|mb| mb << 20);
    if let Some(dir) = &args.rows {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        bench.rows_dir = Some(dir.clone());
    }
    let mut outcomes = Vec::new();
    for q in args.queries()? {
        let expected = bench.events.as_ref().map(|events| match q {
            "q10" => Expected { digest: Digest::of(&q10_expected(events)), rows: None },
            _ => bench.expected(q).expect("checking"),
        });
        for p in args.parallelism() {
            let (o, _) = bench.run(q, p, expected.as_ref())?;
            eprintln!(
                "nexmark {q} p={p}: {:.3} M events/CPU-s (generator apart), {} rows, {}",
                o.per_engine_cpu_s() / 1e6,
                o.rows,
                match o.exact {
                    Some(true) => "exact".to_owned(),
                    Some(false) => "NOT EXACT".to_owned(),
                    None => "not checked".to_owned(),
                }
            );
            if o.exact == Some(false) {
                return Err(format!(
                    "nexmark {q} p={p}: the result differs from the reference ({} rows against {}, {} late records)",
                    o.rows,
                    expected.as_ref().map_or(0, |e| e.digest.rows),
                    o.late
                ));
            }
            outcomes.push(o);
        }
    }
    Ok((outcomes, config, generation, check))
}

/// The per-core figures published for Flink 1.13 (nexmark/nexmark's README, 8 × 8-core
/// workers, 10^8 events at 10 M/s) in events per core-second, per query.
pub const FLINK_PER_CORE: [(&str, f64); 22] = [
    ("q0", 155_020.0),
    ("q1", 157_940.0),
    ("q2", 175_210.0),
    ("q3", 152_120.0),
    ("q4", 34_330.0),
    ("q5", 22_140.0),
    ("q7", 12_330.0),
    ("q8", 146_140.0),
    ("q9", 14_240.0),
    ("q10", 57_810.0),
    ("q11", 39_700.0),
    ("q12", 75_670.0),
    ("q13", 130_730.0),
    ("q14", 161_230.0),
    ("q15", 72_420.0),
    ("q16", 18_650.0),
    ("q17", 116_800.0),
    ("q18", 53_700.0),
    ("q19", 44_040.0),
    ("q20", 18_980.0),
    ("q21", 98_490.0),
    ("q22", 129_960.0),
];

/// The issue's target for query `q`, events per CPU-second: at or above Feldera's published
/// per-core figure and 10× Flink 1.13's.
pub fn target(q: &str) -> f64 {
    let named = [
        ("q5", 0.41e6),
        ("q7", 0.2e6),
        ("q9", 0.14e6),
        ("q11", 0.4e6),
        ("q16", 0.19e6),
        ("q18", 0.54e6),
        ("q19", 0.44e6),
        ("q20", 0.19e6),
    ];
    let flink = FLINK_PER_CORE.iter().find(|(x, _)| *x == q).map_or(0.0, |(_, v)| 10.0 * v);
    named.iter().find(|(x, _)| *x == q).map_or(flink.max(if queries::stateless(q) { 2e6 } else { 0.0 }), |(_, v)| *v)
}

/// The report section.
pub fn section(smoke: bool, args: &Args) -> Section {
    let touch_before = crate::measure::page_touch_us();
    let (outcomes, config, generation, check) = run_all(args, smoke).unwrap_or_else(|e| panic!("{e}"));
    let touch_after = crate::measure::page_touch_us();
    println!(
        "nexmark: a fresh page took {touch_before:.2} µs to touch before the runs, {touch_after:.2} µs after \
         (64 MiB; well above 0.3 µs: this VM's host takes back free memory, and runs that touch fresh \
         pages, q10's page cache above all, pay for getting it back as their own CPU time)"
    );
    let n = config.events.unwrap_or(0);
    let mut s =
        Section::new("nexmark", "Nexmark q0–q22 (but q6) on Nexmark's events (events per CPU-second, generator apart)");
    if check {
        s.rows.push(
            Row::new("reference events generated (one thread)", generation.per_cpu_s(n) / 1e6, "M events/CPU-s")
                .note("for the checks; not in any query's figure"),
        );
    }
    for o in &outcomes {
        let t = target(o.query);
        let flink = FLINK_PER_CORE.iter().find(|(q, _)| *q == o.query).map_or(f64::NAN, |(_, v)| *v);
        s.rows.push(
            Row::new(
                format!("{} p={}: events per CPU-second", o.query, o.parallelism),
                o.per_engine_cpu_s() / 1e6,
                "M events/CPU-s",
            )
            .target(format!("≥ {:.2} M", t / 1e6), |v| v * 1e6 >= t)
            .vs(format!("Flink 1.13 {:.3} M/core", flink / 1e6), flink / 1e6)
            .note(format!(
                "{:.2} M/CPU-s with the generator, {:.2} M events/s wall, {} rows, {}{}{}",
                o.cost.per_cpu_s(o.events) / 1e6,
                o.cost.per_s(o.events) / 1e6,
                o.rows,
                match o.exact {
                    Some(true) => "exact",
                    Some(false) => "NOT EXACT",
                    None => "not checked",
                },
                if o.late > 0 { format!(", {} late records", o.late) } else { String::new() },
                if o.evicted_keys > 0 {
                    format!(", {} keys evicted to RocksDB", o.evicted_keys)
                } else {
                    String::new()
                },
            )),
        );
    }
    if args.fixed {
        s.rows.extend(fixed::rows(n.min(20_000_000) as usize));
    }
    let details: Vec<Value> = outcomes
        .iter()
        .map(|o| {
            json!({
                "query": o.query,
                "parallelism": o.parallelism,
                "events": o.events,
                "rows": o.rows,
                "emitted": o.emitted,
                "exact": o.exact,
                "late_records": o.late,
                "cost": o.cost.json(o.events),
                "generator_cpu_s": o.generator_cpu_s,
                "events_per_engine_cpu_s": o.per_engine_cpu_s(),
                "evicted_keys": o.evicted_keys,
                "max_rss_bytes": o.max_rss_bytes,
                "rows_written": o.written,
            })
        })
        .collect();
    s.setup = json!({
        "events": n,
        "rate_events_per_s": config.first_rate,
        "base_time_ms": config.base_time_ms,
        "out_of_order_group_size": config.out_of_order_group_size,
        "settings": args.set,
        "checked": check,
        "peak_rss_bytes": weir::ring::process::hwm_bytes(),
        "fresh_page_touch_us": { "before": touch_before, "after": touch_after },
    });
    s.details = json!(details);
    s
}
