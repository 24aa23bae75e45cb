//! weir-slow-api: a slow REST API on 127.0.0.1 for testing sinks. It counts POSTed records,
//! drops duplicates by idempotency key, answers after a latency that follows a schedule of
//! phases (and can be changed while it runs), and stops by itself after its phases.
//!
//! ```sh
//! weir-slow-api --port 8080 --phases 2ms:10s,40ms:10s,200ms:10s,2ms:10s --fail-every 50
//! curl -X POST 'http://127.0.0.1:8080/control?latency_ms=40'   # change the latency now
//! curl http://127.0.0.1:8080/stats                             # records, duplicates, ...
//! ```

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;
use weir_tools::slow_api::{Phase, SlowApi, SlowApiConfig, parse_duration, parse_phases};

/// A parsed `--phases` (a newtype, so clap takes it as one value, not a list).
#[derive(Debug, Clone)]
struct Schedule(Vec<Phase>);

/// A slow REST API on 127.0.0.1.
#[derive(Parser, Debug)]
#[command(name = "weir-slow-api", version, about)]
struct Args {
    /// Port on 127.0.0.1 (0: any free one; the address is printed).
    #[arg(short, long, default_value_t = 0)]
    port: u16,
    /// Latency schedule, latency:duration per phase; the server stops after the last phase.
    #[arg(long, value_parser = |s: &str| parse_phases(s).map(Schedule))]
    phases: Option<Schedule>,
    /// Latency without a schedule.
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    latency: Duration,
    /// Answer every Nth ingest request 503.
    #[arg(long)]
    fail_every: Option<u64>,
    /// Answer every Nth ingest request 400.
    #[arg(long)]
    reject_every: Option<u64>,
    /// Record every Nth ingest request, then close its connection without an answer.
    #[arg(long)]
    lose_response_every: Option<u64>,
    /// Stop after this long in any case.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    max_run: Duration,
    /// Append one JSON line per ingest request to this file.
    #[arg(long)]
    log: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let config = SlowApiConfig {
        port: args.port,
        phases: args.phases.map(|s| s.0).unwrap_or_default(),
        latency: args.latency,
        fail_every: args.fail_every,
        reject_every: args.reject_every,
        lose_response_every: args.lose_response_every,
        max_run: args.max_run,
        log: args.log,
        ..SlowApiConfig::default()
    };
    let api = match SlowApi::start(config) {
        Ok(api) => api,
        Err(e) => {
            eprintln!("weir-slow-api: cannot listen on 127.0.0.1:{}: {e}", args.port);
            std::process::exit(1);
        }
    };
    println!("weir-slow-api: listening on {}", api.url("/"));
    let mut last_phase = usize::MAX;
    while !api.is_stopped() {
        let s = api.stats();
        if s.phase != last_phase {
            println!("phase {}: latency {:.1} ms", s.phase, s.latency_ms);
            last_phase = s.phase;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let stats = api.wait();
    println!("{}", serde_json::to_string(&stats).expect("stats serialize"));
}
