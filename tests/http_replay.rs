//! At-least-once into a REST API, exactly once after deduplication (issue #6): the counting job
//! (generator → key_by → 10 ms event-time windows → HTTP POST of the results) is killed with
//! SIGKILL at random moments and restarted. The slow API, running in this (parent) process
//! throughout, drops every request whose idempotency key it has seen. The HTTP sink names
//! batches of window results by content (window end, sorted keys, index), so a replay after a
//! crash re-sends the same batches under the same keys however its input interleaved: what the
//! API accepted must be every (key, window) exactly once, with the exact count and sum.
//!
//! The job runs in a child process: this test binary started again with `WEIR_HTTP_CHILD`
//! set, running only the test `child_process`.

mod common;

use common::counting::{accepted_by_api, compare, counting_job_into, expected, logging_api};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use weir::io::{HttpSink, HttpSinkConfig};

const N: u64 = 240_000;

/// Run by the child process only: the counting job into the API at `WEIR_HTTP_URL`,
/// restoring from whatever checkpoint its directory holds, paced to take ~5 s.
#[test]
fn child_process() {
    let Ok(dir) = std::env::var("WEIR_HTTP_CHILD") else { return };
    let url = std::env::var("WEIR_HTTP_URL").unwrap();
    let config = HttpSinkConfig { batch_records: 50, key_prefix: "replay".into(), ..HttpSinkConfig::new(url) };
    let summary = counting_job_into(Path::new(&dir), N, Some(25_000.0), Duration::from_millis(40), move |info| {
        HttpSink::new(config.clone(), info).window_results()
    })
    .run()
    .unwrap();
    println!("CHILD restored_from={:?}", summary.checkpoints.restored_from);
}

fn spawn_child(dir: &Path, url: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process", "--nocapture", "--test-threads=1"])
        .env("WEIR_HTTP_CHILD", dir)
        .env("WEIR_HTTP_URL", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

#[test]
fn kill_nine_then_dedup_by_idempotency_key_is_exact() {
    if std::env::var("WEIR_HTTP_CHILD").is_ok() {
        return;
    }
    let dir = common::counting::temp_dir("http-replay");
    let (api, log) = logging_api(&dir);
    let url = api.url("/ingest");
    let mut clock = common::KillClock::from_time();
    for _ in 0..8 {
        let mut child = spawn_child(&dir, &url);
        std::thread::sleep(clock.next_delay(200, 600));
        common::kill_and_clean(&mut child);
    }
    let out = spawn_child(&dir, &url).wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the last run failed: {stdout}");
    assert!(stdout.contains("restored_from=Some("), "the last run restored a checkpoint: {stdout}");
    let stats = api.stop();
    println!(
        "API: {} requests, {} accepted, {} duplicates dropped ({} records)",
        stats.requests, stats.accepted_requests, stats.duplicate_requests, stats.duplicate_records
    );
    let got = accepted_by_api(&log).unwrap();
    compare(&got, &expected(N));
    println!("{} windows accepted once each, as expected", got.len());
    std::fs::remove_dir_all(&dir).unwrap();
}
