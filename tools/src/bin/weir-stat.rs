//! weir-stat: print a running job's live counters (busy / backpressured / idle per subtask,
//! fill and credit per channel, RSS against the budget). Reads the job's counters file in
//! shared memory, read-only: it works while the job is stuck.

// The doc comments of the arguments below are the command's --help text, read as plain text:
// `[IPv6]:PORT` and `weir-<uid>` are what a user types, not links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use clap::Parser;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weir_tools::stat::{self, StatView};

/// Live counters of a weir job.
#[derive(Parser, Debug)]
#[command(name = "weir-stat", version, about)]
struct Args {
    /// The job's counters file or run directory (default: the newest job under /dev/shm/weir-<uid>).
    target: Option<PathBuf>,
    /// Milliseconds between prints.
    #[arg(short, long, default_value_t = 1000)]
    interval_ms: u64,
    /// Print this many times, then exit (default: until the job ends).
    #[arg(short, long)]
    count: Option<u64>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Instead of printing, serve the counters to Prometheus at http://ADDR/metrics (PORT on
    /// 127.0.0.1, HOST:PORT or [IPv6]:PORT) until the job's process is gone.
    #[arg(long, value_name = "ADDR")]
    serve: Option<String>,
}

fn main() {
    let args = Args::parse();
    let (path, reader) = stat::open_or_exit(args.target.as_deref(), "weir-stat");
    if let Some(addr) = &args.serve {
        let bound = weir::telemetry::prometheus::MetricsListener::bind_for(addr, "--serve");
        let server = match bound.and_then(|l| l.serve(&path)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("weir-stat: {e}");
                std::process::exit(2);
            }
        };
        eprintln!("weir-stat: serving job {} at http://{}/metrics until it ends", reader.job, server.local_addr());
        while reader.job_alive() {
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("weir-stat: job {} ended", reader.job);
        return;
    }
    let interval = Duration::from_millis(args.interval_ms.max(10));
    let mut before = reader.snapshot();
    let mut at = Instant::now();
    let mut printed = 0u64;
    loop {
        std::thread::sleep(interval);
        let after = reader.snapshot();
        let now = Instant::now();
        let view = StatView::between(&before, &after, (now - at).as_secs_f64());
        let alive = reader.job_alive();
        let endpoints = stat::endpoints(&reader.job);
        let waits = weir::telemetry::waiting::read_waits(&path);
        if args.json {
            let mut j = stat::json(&reader.job, alive, &view);
            j["endpoints"] = stat::endpoints_json(&endpoints);
            j["waiting"] = serde_json::json!(
                waits
                    .iter()
                    .map(|w| serde_json::json!({
                        "subtask": w.subtask,
                        "for_s": view.at_ms.saturating_sub(w.since_ms) as f64 / 1e3,
                        "on": w.what,
                    }))
                    .collect::<Vec<_>>()
            );
            println!("{j}");
        } else {
            let waits: String = waits.iter().map(|w| w.describe(view.at_ms) + "\n").collect();
            println!("{}{waits}{}", stat::table(&reader.job, alive, &view), stat::endpoints_table(&endpoints));
        }
        printed += 1;
        if args.count.is_some_and(|c| printed >= c) || !alive || view.job_state >= 2 {
            break;
        }
        before = after;
        at = now;
    }
}
