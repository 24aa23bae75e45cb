//! Issue #47, "done when": a job through an API that stops answering, its counters file read
//! every 100 ms. While the API hangs, the counters tell the truth as it passes: the sink's
//! blocked time and its subtask's waiting time grow at about a second per second (not in one
//! jump at the end), the shares weir-stat shows are the ones the raw counters give, no
//! latency window shows a sample from before the stall (Prometheus: NaN), the waits file
//! names what the subtask waits on, and the log names the outage while it lasts and once
//! more when it ends, with its length.
//!
//! No time is asserted: "while it lasts" is checked by events (the log line comes before the
//! API is released), rates are ratios of counters to the wall time between two readings,
//! with wide bounds, and every wait has a watchdog.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
mod common;

use common::log::Captured;
use weir::graph::Job;
use weir::io::{HttpSink, HttpSinkConfig};
use weir::operators::builtin::Generator;
use weir::ring::counters::{CounterValue, CountersReader};
use weir::telemetry::counters::{CounterKind, LATENCY_WINDOW_STALE_MS, unix_ms_now};
use weir_tools::slow_api::{SlowApi, SlowApiConfig};
use weir_tools::stat::StatView;

/// One reading of the counters file: when (monotonic and wall clock), and what.
struct Sample {
    at: Instant,
    unix_ms: u64,
    counters: Vec<CounterValue>,
}

fn value(s: &Sample, kind: CounterKind, owner: &str) -> u64 {
    s.counters.iter().find(|c| c.type_id == kind.type_id() && c.owner == owner).map_or(0, |c| c.value)
}

/// The four time counters of `owner` between two readings.
fn time_deltas(a: &Sample, b: &Sample, owner: &str) -> [u64; 4] {
    [CounterKind::BusyNs, CounterKind::BackpressuredNs, CounterKind::IdleNs, CounterKind::WaitingNs]
        .map(|k| value(b, k, owner).saturating_sub(value(a, k, owner)))
}

#[test]
fn a_hung_sink_is_told_truthfully_while_it_lasts() {
    let log = Captured::default();
    tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new("weir=warn"))
        .try_init()
        .expect("this test binary's only subscriber");
    let api = SlowApi::start(SlowApiConfig { latency: Duration::from_millis(1), ..Default::default() }).unwrap();
    let config = HttpSinkConfig {
        batch_records: 50,
        max_in_flight: 2,
        request_timeout: Duration::from_secs(600),
        key_prefix: "outage".into(),
        ..HttpSinkConfig::new(api.url("/ingest"))
    };
    let gauge = config.sink_gauge("api");
    let job = Job::new("outage-hung-sink");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.sink_gauges.push(gauge);
    });
    job.source("gen", 1, |info| Generator::events(info, 100_000_000, 1000).with_rate(5_000.0)).rebalance().sink(
        "api",
        1,
        move |info| HttpSink::new(config.clone(), info),
    );
    let mut running = job.start().expect("job starts");
    let path = running.counters_path().to_owned();
    let reader = CountersReader::open(&path).expect("counters file");

    // Read the counters file every 100 ms until told to stop.
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (samples, stop) = (samples.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let counters = reader.snapshot();
                samples.lock().unwrap().push(Sample { at: Instant::now(), unix_ms: unix_ms_now(), counters });
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let latest = |kind, owner| samples.lock().unwrap().last().map_or(0, |s| value(s, kind, owner));
    // Flowing, with latency markers timed at the sink.
    while api.stats().records < 5_000 || latest(CounterKind::LatencyMarkers, "api#0") < 20 {
        assert!(Instant::now() < deadline, "watchdog: records and markers flow to the API");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1_500));

    // The API stops answering.
    let (held_at, held_ms) = (Instant::now(), unix_ms_now());
    api.hold(true);
    let during = log.wait_for(&["api#0 waiting", "http sink api"], Duration::from_secs(60)).0;
    println!("logged while it lasts: {during}");
    // The waits file says the same, for weir-stat and weir top.
    let waits = weir_tools::stat::waits(&path, unix_ms_now());
    assert!(waits.iter().any(|w| w.starts_with("api#0 waiting") && w.contains("http sink api")), "{waits:?}");
    assert!(!log.text().contains("no longer waiting"), "the end is not logged before the end");
    while held_at.elapsed() < Duration::from_secs(8) {
        assert!(Instant::now() < deadline, "watchdog");
        std::thread::sleep(Duration::from_millis(50));
    }
    api.hold(false);
    let after = log.wait_for(&["api#0 no longer waiting", "after"], Duration::from_secs(60)).0;
    println!("logged at the end: {after}");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Release);
    sampler.join().unwrap();
    running.cancel();
    let _ = running.wait();
    drop(api);

    let samples = samples.lock().unwrap();
    // The stall, once settled: from 3 s after the hold to its end.
    let stall: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= held_at + Duration::from_secs(3) && s.at <= held_at + Duration::from_secs(8))
        .collect();
    assert!(stall.len() >= 20, "{} readings in the stall", stall.len());
    let (first, last) = (stall[0], stall[stall.len() - 1]);
    let wall_ns = (last.at - first.at).as_nanos() as f64;
    // Blocked and waiting time grow at about a second per second while it lasts.
    let blocked = value(last, CounterKind::SinkBlockedNs, "api") - value(first, CounterKind::SinkBlockedNs, "api");
    let waiting = time_deltas(first, last, "api#0")[3];
    println!(
        "over {:.2} s of the stall: blocked {:.2} s, waiting {:.2} s; RSS {:.1} -> {:.1} MiB of a {:.1} MiB budget",
        wall_ns / 1e9,
        blocked as f64 / 1e9,
        waiting as f64 / 1e9,
        value(first, CounterKind::RssBytes, "job") as f64 / 1048576.0,
        value(last, CounterKind::RssBytes, "job") as f64 / 1048576.0,
        value(last, CounterKind::BudgetBytes, "job") as f64 / 1048576.0
    );
    for (what, ns) in [("blocked", blocked), ("waiting", waiting)] {
        let rate = ns as f64 / wall_ns;
        assert!((0.8..=1.2).contains(&rate), "{what} grew {rate:.2} s per s during the stall");
    }
    // Every reading's shares are the raw counters' shares, as weir-stat computes them; the
    // hung sink's subtask is waiting, not busy.
    for pair in stall.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let view = StatView::between_at(&a.counters, &b.counters, (b.at - a.at).as_secs_f64(), b.unix_ms);
        for s in &view.subtasks {
            let raw = weir::telemetry::time::shares(time_deltas(a, b, &s.owner)).unwrap_or_default();
            assert_eq!([s.busy, s.backpressured, s.idle, s.waiting], raw, "{}", s.owner);
        }
        let sink = view.subtasks.iter().find(|s| s.owner == "api#0").expect("the sink's subtask");
        assert!(sink.waiting > 0.9, "the hung sink shows as waiting: {sink:?}");
    }
    // No latency window shows a sample from before the stall: none was timed in it.
    let markers_before =
        samples.iter().filter(|s| s.unix_ms < held_ms).any(|s| value(s, CounterKind::IngestLatencyP50Us, "api#0") > 0);
    assert!(markers_before, "the sink timed latency before the stall (else this proves nothing)");
    for pair in samples.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.unix_ms < held_ms + LATENCY_WINDOW_STALE_MS + 500 || b.at > held_at + Duration::from_secs(8) {
            continue;
        }
        let view = StatView::between_at(&a.counters, &b.counters, (b.at - a.at).as_secs_f64(), b.unix_ms);
        let l = view.latencies.iter().find(|l| l.owner == "api#0").expect("the sink's latency");
        assert_eq!((l.ingest[..4].to_vec(), l.event[..4].to_vec()), (vec![0; 4], vec![0; 4]), "{l:?}");
        let s = view.sinks.iter().find(|s| s.node == "api").expect("the sink's figures");
        assert_eq!((s.ack_p50_us, s.ack_p99_us, s.ack_max_us), (0, 0, 0), "{s:?}");
    }
    let text = weir::telemetry::prometheus::encode("outage-hung-sink", true, &last.counters);
    let line = text
        .lines()
        .find(|l| l.starts_with("weir_sink_ingest_latency_seconds{") && l.contains("quantile=\"0.5\""))
        .expect("the sink's ingest latency is exported");
    assert!(line.ends_with(" NaN"), "{line}");
}
