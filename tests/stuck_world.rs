//! A stuck world (issue #46): a destination that hangs holds no checkpoint and no stop.
//!
//! - Checkpoints keep completing while the REST API the job's HTTP sink posts to stops
//!   answering (connections accepted, requests held): the barrier does not wait for the API,
//!   what the sink has not had answered goes into the checkpoint; when the API recovers every
//!   window reaches it exactly once by idempotency key.
//! - The first SIGTERM stops `weir run` while its HTTP requests hang (exit 143, the clean stop,
//!   not 75, the stop that ran out of time); the next run restores the checkpoint, sends again
//!   what the checkpoint held under the same keys, and the API has every window once.
//! - The file sink's io_uring never waits for a completion that already came (the hang seen
//!   once after a checkpoint: a commit's fsync reaped the next part's write completion).
//!
//! Nothing here asserts a time: "during the hang" is counted in checkpoints, and every wait
//! has a watchdog.

mod common;

use common::counting::{accepted_by_api, compare, counting_job_into, expected, logging_api, temp_dir};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use weir::io::{HttpSink, HttpSinkConfig};

const WATCHDOG: Duration = Duration::from_secs(120);

/// An API that hangs: requests wait this long (until the latency is set back).
const HANG: Duration = Duration::from_secs(3600);

/// Wait until `done()`, failing with `what()` after the watchdog.
fn wait_until(mut done: impl FnMut() -> bool, what: impl Fn() -> String) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < WATCHDOG, "watchdog: {}", what());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While the API holds every request, checkpoints go on completing (at least five of them,
/// counted after the hang began and after the API had requests held); once it answers again,
/// every window reaches it exactly once.
#[test]
fn checkpoints_keep_completing_while_the_api_hangs() {
    let dir = temp_dir("stuck-api");
    let (api, log) = logging_api(&dir);
    let n = 240_000;
    let config = HttpSinkConfig {
        batch_records: 50,
        key_prefix: "stuck".into(),
        request_timeout: HANG,
        ..HttpSinkConfig::new(api.url("/ingest"))
    };
    let job = counting_job_into(&dir, n, Some(30_000.0), Duration::from_millis(100), move |info| {
        HttpSink::new(config.clone(), info).window_results()
    });
    let running = job.start().unwrap();
    wait_until(|| running.checkpoint_stats().completed.len() >= 2, || format!("{:?}", running.checkpoint_stats()));
    api.set_latency(HANG);
    // Requests in their last millisecond are answered; from then on every one is held.
    std::thread::sleep(Duration::from_millis(300));
    let answered = api.stats().requests;
    let before = running.checkpoint_stats();
    let during = 5;
    wait_until(
        || running.checkpoint_stats().completed.len() >= before.completed.len() + during || running.has_failed(),
        || format!("checkpoints stopped completing while the API hangs: {:?}", running.checkpoint_stats()),
    );
    assert!(!running.has_failed(), "the job failed: {:?}", running.checkpoint_stats());
    let stats = running.checkpoint_stats();
    assert_eq!(api.stats().requests, answered, "the API answered nothing during the hang (it held every request)");
    println!(
        "{} checkpoints completed while the API held every request ({} failed: {:?})",
        stats.completed.len() - before.completed.len(),
        stats.failed.len() - before.failed.len(),
        &stats.failed[before.failed.len()..]
    );
    api.set_latency(Duration::from_millis(1));
    let summary = running.wait().unwrap();
    assert!(summary.checkpoints.completed.len() > stats.completed.len());
    drop(api); // writes out its log
    let got = accepted_by_api(&log).unwrap();
    compare(&got, &expected(n));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The job file of the SIGTERM test: the counting job's shape into the API at `$WEIR_URL`.
fn job_file(dir: &std::path::Path, n: u64) -> std::path::PathBuf {
    let text = format!(
        r#"[job]
name = "stuck-sigterm"
checkpoint_dir = "{chk}"
checkpoint_interval_ms = 100
stop_timeout_ms = 20000
pinning = false
ring_slots = 512

[[source]]
id = "gen"
type = "generator"
count = {n}
keys = {keys}
rate = 40000
timestamp = "time_ns"
max_out_of_orderness_ms = 0

[[operator]]
id = "by_key"
type = "key_by"
field = "key"
input = "gen"

[[operator]]
id = "count"
type = "window"
input = "by_key"
window = "tumbling"
size_ms = 10
aggregate = ["count", "sum"]
parallelism = 2

[[sink]]
id = "api"
type = "http"
input = "count"
url = "${{WEIR_URL}}"
batch_records = 50
request_timeout_ms = 3600000
"#,
        chk = dir.join("chk").display(),
        keys = common::counting::KEYS,
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn weir_run(job: &std::path::Path, url: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["run", &job.display().to_string()])
        .env("WEIR_URL", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The first SIGTERM stops a job whose HTTP requests hang: a clean stop (143), within the
/// job's stop_timeout (else it would exit 75). The next run restores the last checkpoint and
/// sends what it held again, under the same keys: the API has every window exactly once.
#[test]
fn sigterm_stops_a_job_waiting_on_a_hung_api_and_nothing_is_lost() {
    let dir = temp_dir("stuck-sigterm");
    let (api, log) = logging_api(&dir);
    let n = 200_000;
    let job = job_file(&dir, n);
    let mut child = weir_run(&job, &api.url("/ingest"));
    let pid = child.id() as i32;
    wait_until(
        || {
            if let Ok(Some(status)) = child.try_wait() {
                let mut stderr = String::new();
                let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr);
                panic!("weir run ended before its first checkpoint ({status}):\n{stderr}");
            }
            std::fs::read_dir(dir.join("chk"))
                .is_ok_and(|d| d.flatten().any(|e| e.path().join("_manifest.json").is_file()))
        },
        || "no checkpoint completed".into(),
    );
    api.set_latency(HANG);
    // Requests are held (some were sent after the hang began) before the signal comes.
    std::thread::sleep(Duration::from_millis(500));
    let requests = api.stats().requests;
    // SAFETY: plain system call on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = common::wait_with_watchdog(child, WATCHDOG);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "a clean stop on the first SIGTERM; stderr:\n{stderr}");
    assert_eq!(api.stats().requests, requests, "the API answered nothing while hung");
    api.set_latency(Duration::from_millis(1));
    let again = common::wait_with_watchdog(weir_run(&job, &api.url("/ingest")), WATCHDOG);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "the second run failed:\n{stderr}");
    assert!(stderr.contains("restoring checkpoint"), "the second run restored a checkpoint:\n{stderr}");
    drop(api); // writes out its log
    let got = accepted_by_api(&log).unwrap();
    compare(&got, &expected(n));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The file sink at a checkpoint every few milliseconds, with parts of one buffer each, over
/// and over: a commit (its fsync of the directory) while the next part's write is in the
/// kernel must leave that write's completion to the write, not take it for its own — the
/// job then waited for ever in `io_cqring_wait` (seen once, after checkpoint 1). Many rounds,
/// each to the end, exact.
#[test]
fn file_sink_commits_never_swallow_a_write_completion() {
    for round in 0..6 {
        let dir = temp_dir(&format!("stuck-file-{round}"));
        let n = 120_000;
        let out = dir.join("out");
        let job = counting_job_into(&dir, n, None, Duration::from_millis(5), move |info| {
            let config = weir::io::FileSinkConfig { buffer_bytes: 4096, ..weir::io::FileSinkConfig::new(&out) };
            weir::io::FileSink::new(config, info)
        });
        let running = job.start().unwrap();
        let t = Instant::now();
        while !running.is_finished() {
            assert!(t.elapsed() < WATCHDOG, "round {round}: the job hangs: {:?}", running.checkpoint_stats());
            std::thread::sleep(Duration::from_millis(20));
        }
        running.wait().unwrap();
        let got = common::counting::committed(&dir.join("out")).unwrap();
        compare(&got, &expected(n));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
