//! The HTTP sink over plain HTTP and over HTTPS, into the slow API (no latency) in this
//! process: what TLS costs per request. Generator → HTTP sink (4 requests in flight, 100
//! records a request), each protocol run three times, alternating, medians reported. The
//! server runs in this process, so the CPU figures count both ends of each request (and TLS
//! on both ends): the difference per request is an upper bound of the sink's own TLS cost.
//! Connections are kept alive, so a handshake is paid per connection (4 per run), not per
//! request; the rows say how many there were.

use crate::measure::{Cost, measure};
use crate::median;
use crate::report::{Row, Section};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use weir::graph::Job;
use weir::io::{HttpSink, HttpSinkConfig, HttpSinkStats};
use weir::operators::builtin::Generator;
use weir_tools::slow_api::{SlowApi, SlowApiConfig};
use weir_tools::test_pki::{TestPki, Validity};

/// Records per request.
const BATCH: usize = 100;

/// Run `run`: `n` records through the sink into `api`; its cost, and the sink's counters.
/// Each run's idempotency keys are its own, so the API counts every run's records.
fn run(api: &SlowApi, ca: Option<&std::path::Path>, n: u64, run: usize) -> (Cost, Arc<HttpSinkStats>) {
    let config = HttpSinkConfig {
        batch_records: BATCH,
        ca_file: ca.map(std::path::Path::to_path_buf),
        key_prefix: format!("bench-run{run}"),
        ..HttpSinkConfig::new(api.url("/ingest"))
    };
    let stats = config.stats.clone();
    let job = Job::new("bench-http");
    job.configure(|c| c.pinning = false);
    job.source("gen", 1, move |info| Generator::events(info, n, 1000))
        .sink("api", 1, move |info| HttpSink::new(config.clone(), info));
    let (result, cost) = measure(|| job.run());
    result.expect("the HTTP job runs");
    (cost, stats)
}

/// The section: plain and TLS rows, and TLS's cost per request.
pub fn section(smoke: bool) -> Section {
    let n: u64 = if smoke { 5_000 } else { 400_000 };
    let runs = if smoke { 1 } else { 3 };
    let mut s = Section::new("http", "HTTP sink into the slow API (no latency): plain HTTP vs HTTPS");
    let pki = TestPki::new();
    let ca = std::env::temp_dir().join(format!("weir-bench-http-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, pki.ca_pem()).expect("the CA file");
    let quiet = SlowApiConfig { latency: Duration::ZERO, max_run: Duration::from_secs(3600), ..Default::default() };
    let plain = SlowApi::start(quiet.clone()).expect("the slow API");
    let tls = SlowApi::start(SlowApiConfig { tls: Some(pki.server(&["127.0.0.1"], Validity::Current)), ..quiet })
        .expect("the slow API over TLS");
    let (mut plain_runs, mut tls_runs) = (Vec::new(), Vec::new());
    let mut connections = (0, 0);
    for i in 0..runs {
        let (c, st) = run(&plain, None, n, i);
        connections.0 += st.connections.load(Ordering::Relaxed);
        plain_runs.push(c);
        let (c, st) = run(&tls, Some(&ca), n, i);
        connections.1 += st.connections.load(Ordering::Relaxed);
        tls_runs.push(c);
    }
    let _ = std::fs::remove_file(&ca);
    let requests = n.div_ceil(BATCH as u64);
    for (api, name) in [(plain, "http"), (tls, "https")] {
        let seen = api.stop();
        assert_eq!(seen.records, n * runs as u64, "{name}: every record arrived");
    }
    let rate = |c: &[Cost]| median(c.iter().map(|c| c.per_s(requests)).collect());
    let cpu_us = |c: &[Cost]| median(c.iter().map(|c| c.cpu_s * 1e6 / requests as f64).collect());
    let (plain_rate, tls_rate) = (rate(&plain_runs), rate(&tls_runs));
    let (plain_cpu, tls_cpu) = (cpu_us(&plain_runs), cpu_us(&tls_runs));
    s.rows.push(Row::new("HTTP: requests/s (100 records each)", plain_rate / 1e3, "k requests/s"));
    s.rows.push(
        Row::new("HTTPS: requests/s (100 records each)", tls_rate / 1e3, "k requests/s")
            .vs(format!("HTTP {:.1} k/s", plain_rate / 1e3), plain_rate / 1e3),
    );
    s.rows.push(Row::new("HTTP: CPU per request, client and server", plain_cpu, "µs"));
    s.rows.push(
        Row::new("HTTPS: CPU per request, client and server", tls_cpu, "µs")
            .vs(format!("HTTP {plain_cpu:.1} µs"), plain_cpu)
            .note(format!(
                "TLS adds {:.1} µs per request on both ends together; {} connections (handshakes) over {} runs",
                tls_cpu - plain_cpu,
                connections.1,
                runs
            )),
    );
    s.setup = json!({
        "records_per_run": n, "records_per_request": BATCH, "requests_per_run": requests, "runs_each": runs,
        "max_in_flight": 4, "server": "weir-slow-api in process, latency 0", "pinning": false,
    });
    s.details = json!({
        "http": plain_runs.iter().map(|c| c.json(requests)).collect::<Vec<_>>(),
        "https": tls_runs.iter().map(|c| c.json(requests)).collect::<Vec<_>>(),
        "connections": { "http": connections.0, "https": connections.1 },
    });
    s
}
