//! Checkpoints against the latency of the API a job's HTTP sink posts to: 2 ms, 200 ms,
//! 500 ms, and an API that hangs (connections accepted, requests held). Generator (paced) →
//! key_by → 100 ms tumbling count → HTTP sink (window results keyed by content) → the slow API
//! in this process; checkpoints every second. After a warm-up at 2 ms the API takes the
//! latency for the measured phase; the rows give how many checkpoints completed in it, how
//! long the longest took, the longest time between two completions, and what was declined or
//! expired — the rule being that no barrier waits on the API (each checkpoint costs what the
//! rings hold, not the API's pace). RSS is sampled against the job's budget meanwhile.

use crate::report::{Row, Section, mib};
use serde_json::json;
use std::time::{Duration, Instant};
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::{HttpSink, HttpSinkConfig};
use weir::operators::builtin::Generator;
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window};
use weir_tools::slow_api::{SlowApi, SlowApiConfig};

/// What one latency's phase showed.
struct Phase {
    label: String,
    completed: usize,
    /// Durations of the checkpoints that completed in the phase, ms.
    durations_ms: Vec<f64>,
    /// The longest time between two completions in the phase (or from its start to the
    /// first), ms.
    longest_gap_ms: f64,
    /// Declined or expired in the phase, with their reasons.
    failed: Vec<String>,
    rss_max: u64,
    budget: u64,
}

fn run_phase(label: &str, latency: Duration, warm: Duration, measured: Duration, interval: Duration) -> Phase {
    let dir = std::env::temp_dir().join(format!("weir-bench-stuck-{}-{}", std::process::id(), label.replace(' ', "_")));
    let _ = std::fs::remove_dir_all(&dir);
    let api = SlowApi::start(SlowApiConfig {
        latency: Duration::from_millis(2),
        max_run: Duration::from_secs(3600),
        ..Default::default()
    })
    .expect("the slow API");
    let config = HttpSinkConfig {
        batch_records: 100,
        key_prefix: "bench-stuck".into(),
        request_timeout: Duration::from_secs(3600),
        ..HttpSinkConfig::new(api.url("/ingest"))
    };
    let held = config.budget_bytes();
    let job = Job::new("bench-stuck");
    job.configure(|c| {
        c.pinning = false;
        c.checkpoints = Some(CheckpointSettings {
            interval,
            timeout: Duration::from_secs(60),
            ..CheckpointSettings::new(dir.join("chk"))
        });
        c.connector_memory.push(("http sink held and pending".into(), held));
    });
    // Far more events than the run takes: it is stopped after the phase.
    job.source("gen", 1, |info| Generator::events(info, u64::MAX / 2, 2_000).with_rate(20_000.0))
        .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO))
        .key_by("k", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_millis(100)))
        .timestamps(|e: &Event| e.time_ns)
        .aggregate("count", 1, Aggregates::of(|e: &Event| e.value).count())
        .sink("api", 1, move |info| HttpSink::new(config.clone(), info).window_results());
    let running = job.start().expect("the job starts");
    let budget = running.budget().total_bytes();
    std::thread::sleep(warm);
    api.set_latency(latency);
    let start = Instant::now();
    let before = running.checkpoint_stats();
    let (mut seen, mut last_at, mut longest_gap) = (before.completed.len(), start, Duration::ZERO);
    let mut rss_max = 0;
    while start.elapsed() < measured && !running.has_failed() {
        std::thread::sleep(Duration::from_millis(10));
        rss_max = rss_max.max(running.sample_rss());
        let now = running.checkpoint_stats().completed.len();
        if now > seen {
            longest_gap = longest_gap.max(last_at.elapsed());
            (seen, last_at) = (now, Instant::now());
        }
    }
    longest_gap = longest_gap.max(last_at.elapsed());
    let after = running.checkpoint_stats();
    assert!(!running.has_failed(), "{label}: the job failed: {after:?}");
    // The API answers again, so the stop is not held by it (it would not be either way).
    api.set_latency(Duration::ZERO);
    let _ = running.stop();
    drop(api);
    let _ = std::fs::remove_dir_all(&dir);
    Phase {
        label: label.to_owned(),
        completed: after.completed.len() - before.completed.len(),
        durations_ms: after.completed[before.completed.len()..].iter().map(|c| c.1 as f64 / 1e6).collect(),
        longest_gap_ms: longest_gap.as_secs_f64() * 1e3,
        failed: after.failed[before.failed.len()..].iter().map(|(id, why)| format!("{id}: {why}")).collect(),
        rss_max,
        budget,
    }
}

/// The section: per latency, checkpoints in the phase, the longest, the longest gap.
pub fn section(smoke: bool) -> Section {
    let (warm, measured, interval) = if smoke {
        (Duration::from_millis(500), Duration::from_secs(2), Duration::from_millis(200))
    } else {
        (Duration::from_secs(5), Duration::from_secs(20), Duration::from_secs(1))
    };
    let mut s = Section::new("stuck", "Checkpoints against the API's latency (HTTP sink; the API slow, then hung)");
    let cases = [
        ("API 2 ms", Duration::from_millis(2)),
        ("API 200 ms", Duration::from_millis(200)),
        ("API 500 ms", Duration::from_millis(500)),
        ("API hung", Duration::from_secs(3600)),
    ];
    let mut details = Vec::new();
    for (label, latency) in cases {
        let p = run_phase(label, latency, warm, measured, interval);
        let longest = p.durations_ms.iter().copied().fold(0.0, f64::max);
        let mut sorted = p.durations_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        s.rows.push(
            Row::new(format!("{}: longest checkpoint", p.label), longest, "ms")
                .target("≤ 1500 ms", |v| v <= 1500.0)
                .note(format!(
                    "{} completed in {} s at a {} ms interval (median {median:.0} ms); at most {:.0} ms between two \
                     completions; {} declined or expired; RSS max {:.0} of {:.0} MiB budget",
                    p.completed,
                    measured.as_secs(),
                    interval.as_millis(),
                    p.longest_gap_ms,
                    p.failed.len(),
                    mib(p.rss_max),
                    mib(p.budget)
                )),
        );
        details.push(json!({
            "case": p.label, "latency_ms": latency.as_millis() as u64, "completed": p.completed,
            "durations_ms": p.durations_ms, "longest_gap_ms": p.longest_gap_ms, "failed": p.failed,
            "rss_max_bytes": p.rss_max, "budget_bytes": p.budget,
        }));
    }
    s.setup = json!({
        "source": "generator, 20,000 events/s, 2,000 keys", "window": "100 ms tumbling count, p=1",
        "sink": "HTTP, 4 requests in flight, 100 results a request, keys by content",
        "checkpoint_interval_ms": interval.as_millis() as u64, "warm_up_s": warm.as_secs_f64(),
        "measured_s": measured.as_secs_f64(), "pinning": false,
    });
    s.details = json!(details);
    s
}
