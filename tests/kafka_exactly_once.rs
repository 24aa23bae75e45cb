//! Kafka → key_by → window → Kafka (exactly once) and → HTTP (at least once), killed with
//! SIGKILL at random moments (issue #6): the output topic, read back with
//! `isolation.level=read_committed`, holds every (key, window) once with its exact count and
//! sum; the slow API, after dropping requests whose idempotency key it had seen, holds the
//! same.
//!
//! A crash can fall anywhere, including between a checkpoint becoming durable and the sink's
//! commit of its transaction — which librdkafka cannot resume, so the sink writes it again
//! from its transaction log on restore. Event time comes from the Kafka source with
//! watermarks per partition: each source subtask reads two partitions, unevenly, and a
//! watermark per subtask would make records of the slower partition late (lost windows).
//!
//! Needs Apache Kafka (`WEIR_KAFKA_BOOTSTRAP`, as `.ci/test` sets it; the mock cluster does not
//! hide aborted transactions). The job runs in a child process: this test binary started again
//! with `WEIR_EOS_CHILD` set, running only the test `child_process`.

mod common;

use common::counting::{Counts, accepted_by_api, compare, expected, logging_api};
use std::cell::Cell;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::kafka::{Delivery, Json, JsonEncode, KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use weir::io::{HttpSink, HttpSinkConfig};
use weir::record::Event;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window, WindowResult};

const N: u64 = 400_000;
const INPUT_PARTITIONS: i32 = 4;
const OUTPUT_PARTITIONS: i32 = 2;

/// Run by the child process only: the job, restoring from whatever checkpoint its directory
/// holds, paced to about 40 000 records per second so that the kills land mid-run. Warnings
/// (recovery steps) go to stdout, for the parent to count.
#[test]
fn child_process() {
    let Ok(dir) = std::env::var("WEIR_EOS_CHILD") else { return };
    let bootstrap = std::env::var("WEIR_KAFKA_BOOTSTRAP").unwrap();
    let topic = std::env::var("WEIR_EOS_TOPIC").unwrap();
    let dir = Path::new(&dir);
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stdout)
        .with_env_filter(tracing_subscriber::EnvFilter::new("weir=warn"))
        .try_init();
    let interval_ms = std::env::var("WEIR_EOS_INTERVAL_MS").map_or(100, |v| v.parse().unwrap());
    // Parallelism of source, window and sink (default 2 each): a restart may change them.
    let p = |name: &str| std::env::var(name).map_or(2, |v| v.parse::<u32>().unwrap());
    let (source_p, count_p, sink_p) = (p("WEIR_EOS_SOURCE_P"), p("WEIR_EOS_COUNT_P"), p("WEIR_EOS_SINK_P"));
    let job = Job::new("kafka-eos");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.checkpoints = Some(CheckpointSettings {
            interval: Duration::from_millis(interval_ms),
            timeout: Duration::from_secs(30),
            ..CheckpointSettings::new(dir.join("chk"))
        });
    });
    let source = KafkaSourceConfig { bounded: true, ..KafkaSourceConfig::new(&bootstrap, &format!("{topic}-in")) };
    let sink = KafkaSinkConfig {
        delivery: Delivery::ExactlyOnce,
        transactional_id_prefix: topic.clone(),
        checkpoint_timeout: Duration::from_secs(30),
        transaction_log_dir: Some(dir.join("txn")),
        ..KafkaSinkConfig::new(&bootstrap, &format!("{topic}-out"))
    };
    let stats = sink.stats.clone();
    // The crash window: abort right after the manifest of the first checkpoint, from the
    // `WEIR_FP_HIT`-th on, for which a sink subtask prepared a transaction holding records
    // (checkpoint ids count from 1 on a fresh directory, one per pass of the failpoint), so
    // there is always something to repair however slowly this machine runs.
    #[cfg(feature = "failpoints")]
    if let Ok(name) = std::env::var("WEIR_FP") {
        let from: u64 = std::env::var("WEIR_FP_HIT").unwrap().parse().unwrap();
        let seen = std::sync::atomic::AtomicU64::new(0);
        let prepared = stats.clone();
        fail::cfg_callback(name, move || {
            let id = seen.fetch_add(1, Ordering::Relaxed) + 1;
            if id >= from && prepared.last_prepared.load(Ordering::Relaxed) == id {
                println!("\nCHILD crashed_after={id}");
                let _ = std::io::Write::flush(&mut std::io::stdout());
                std::process::abort();
            }
        })
        .unwrap();
    }
    let results = job
        .source("in", source_p, move |info| {
            KafkaSource::new(source.clone(), info, Json::<Event>::default())
                .with_event_time(|e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::ZERO))
        })
        .with_source_watermarks(|e: &Event| e.time_ns)
        .filter("pace", |_: &Event| {
            thread_local!(static SEEN: Cell<u64> = const { Cell::new(0) });
            if SEEN.with(|s| s.replace(s.get() + 1)).is_multiple_of(20) {
                std::thread::sleep(Duration::from_millis(1));
            }
            true
        })
        .key_by("k", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_nanos(common::counting::WINDOW_NS)))
        .timestamps(|e: &Event| e.time_ns)
        .aggregate("count", count_p, Aggregates::of(|e: &Event| e.value).count().sum());
    results.sink("out", sink_p, move |info| {
        KafkaSink::new(sink.clone(), info, JsonEncode::<WindowResult>::default())
            .with_key(|r: &WindowResult, key: &mut Vec<u8>| key.extend_from_slice(&r.key.to_le_bytes()))
    });
    // The same results, at least once, into the parent's slow API too (batches named by
    // window and keys).
    if let Ok(url) = std::env::var("WEIR_HTTP_URL") {
        let config = HttpSinkConfig { batch_records: 50, key_prefix: "eos".into(), ..HttpSinkConfig::new(url) };
        results.sink("api", 1, move |info| HttpSink::new(config.clone(), info).window_results());
    }
    let summary = job.run().unwrap();
    println!(
        "CHILD restored_from={:?} completed={} replayed_transactions={} replayed_records={} commits={}",
        summary.checkpoints.restored_from,
        summary.checkpoints.completed.len(),
        stats.replayed_transactions.load(Ordering::Relaxed),
        stats.replayed_records.load(Ordering::Relaxed),
        stats.commits.load(Ordering::Relaxed),
    );
}

fn child(dir: &Path, bootstrap: &str, topic: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_process", "--nocapture", "--test-threads=1"])
        .env("WEIR_EOS_CHILD", dir)
        .env("WEIR_KAFKA_BOOTSTRAP", bootstrap)
        .env("WEIR_EOS_TOPIC", topic)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// What the child that ran to the end reported.
fn last_run(out: std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the last run failed: {stdout}");
    let line = stdout.lines().find_map(|l| l.split_once("CHILD").map(|(_, r)| r)).expect("the child reports");
    println!("{line}");
    assert!(!line.contains("restored_from=None"), "the last run restored a checkpoint: {line}");
    line.to_owned()
}

/// The output topic holds exactly the windows of the generator's formulas.
fn check_output(bootstrap: &str, topic: &str) {
    let got = read_committed(bootstrap, &format!("{topic}-out")).unwrap();
    let want = expected(N);
    println!("{} windows committed, {} expected", got.len(), want.len());
    compare(&got, &want);
}

/// A fresh pair of topics and a directory for one test.
fn fresh(name: &str, bootstrap: &str) -> (String, std::path::PathBuf) {
    let (topic, dir) = common::kafka::fresh_topic_and_dir(&format!("weir-eos-{name}"));
    prepare_topics(bootstrap, &topic);
    (topic, dir)
}

/// The input topic (4 partitions) with the events of the generator's formulas, keyed by key
/// (each partition in event-time order), and an empty output topic (2 partitions).
fn prepare_topics(bootstrap: &str, topic: &str) {
    let (input, output) = (format!("{topic}-in"), format!("{topic}-out"));
    common::kafka::create_topics(bootstrap, &[(&input, INPUT_PARTITIONS), (&output, OUTPUT_PARTITIONS)]);
    common::kafka::produce_events(bootstrap, &input, N, |seq| {
        let key = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % common::counting::KEYS;
        (None, Event { key, value: seq % 100 + 1, time_ns: seq * 1_000, seq })
    });
}

/// Every window result of the output topic that `read_committed` readers see; a (key,
/// window) seen twice is an error.
fn read_committed(bootstrap: &str, topic: &str) -> Result<Counts, String> {
    let mut got = Counts::new();
    for payload in common::kafka::read_payloads(bootstrap, topic, OUTPUT_PARTITIONS, "read_committed") {
        let r: WindowResult = serde_json::from_slice(&payload).unwrap();
        if got.insert((r.key, r.start_ns), (r.count, r.sum)).is_some() {
            return Err(format!("window ({}, {}) committed twice: double-counted", r.key, r.start_ns));
        }
    }
    Ok(got)
}

#[test]
fn kill_nine_at_random_moments_writes_every_window_once() {
    if std::env::var("WEIR_EOS_CHILD").is_ok() {
        return;
    }
    let Some(bootstrap) = common::kafka::bootstrap_or_skip() else { return };
    let (topic, dir) = fresh("kill", &bootstrap);
    let (api, log) = logging_api(&dir);
    let url = api.url("/ingest");
    let mut clock = common::KillClock::from_time();
    const KILLS: usize = 8;
    let mut repaired = 0;
    for _ in 0..KILLS {
        let mut running = child(&dir, &bootstrap, &topic).env("WEIR_HTTP_URL", &url).spawn().unwrap();
        std::thread::sleep(clock.next_delay(800, 2000));
        common::kill_and_clean(&mut running);
        let mut said = String::new();
        std::io::Read::read_to_string(&mut running.stdout.take().unwrap(), &mut said).unwrap();
        repaired += said.matches("writing its").count();
    }
    // How often a kill fell between a checkpoint and its commit varies from run to run; the
    // failpoint test below makes sure of it.
    println!("{KILLS} kills; transactions written again from their logs on restart: {repaired}");
    last_run(child(&dir, &bootstrap, &topic).env("WEIR_HTTP_URL", &url).output().unwrap());
    check_output(&bootstrap, &topic);
    // The HTTP copy: at least once, and exact once the API dropped repeated keys.
    let stats = api.stop();
    println!(
        "API: {} requests, {} accepted, {} repeated keys dropped ({} records)",
        stats.requests, stats.accepted_requests, stats.duplicate_requests, stats.duplicate_records
    );
    compare(&accepted_by_api(&log).unwrap(), &expected(N));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The crash window itself: the process aborts right after a manifest (the sixth or a later
/// one whose transactions hold records) is durable, before any sink commits its transaction
/// (failpoint `checkpoint::after-manifest-before-commit`; build with `--features failpoints`). The restart finds those transactions aborted by its
/// `init_transactions`, writes them again from their logs, and the output is still exact.
#[cfg(feature = "failpoints")]
#[test]
fn a_crash_between_checkpoint_and_commit_is_repaired_exactly() {
    if std::env::var("WEIR_EOS_CHILD").is_ok() {
        return;
    }
    let Some(bootstrap) = common::kafka::bootstrap_or_skip() else { return };
    let (topic, dir) = fresh("window", &bootstrap);
    // 400 ms between checkpoints: windows fire every ~250 ms at this pace once the first has
    // waited for all four partitions; the child crashes at the sixth checkpoint or the first
    // after it whose transaction holds window results, so there are records to repair.
    let out = common::output_and_clean(
        child(&dir, &bootstrap, &topic)
            .env("WEIR_EOS_INTERVAL_MS", "400")
            .env("WEIR_FP", "checkpoint::after-manifest-before-commit")
            .env("WEIR_FP_HIT", "6"),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the child should have crashed: {said}");
    let crashed = said
        .lines()
        .find_map(|l| l.split("CHILD crashed_after=").nth(1)) // the harness's "test ... " may come first
        .unwrap_or_else(|| panic!("the child crashed elsewhere than at the failpoint: {said}"));
    let line = last_run(child(&dir, &bootstrap, &topic).env("WEIR_EOS_INTERVAL_MS", "400").output().unwrap());
    let restored = format!("restored_from=Some({crashed})");
    assert!(line.contains(&restored), "restored the checkpoint whose commit was lost ({restored}): {line}");
    assert!(!line.contains("replayed_transactions=0 "), "transactions written again from their logs: {line}");
    check_output(&bootstrap, &topic);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Restore at another parallelism with an exactly-once sink: the process aborts between a
/// checkpoint and its commits at source, window and sink parallelism 2; the restart runs
/// them at 3, 3 and 1. Its one sink subtask takes over both old subtasks' transactions
/// (fencing their ids, writing again from their logs what the crash left uncommitted), the
/// three sources take the four partitions' offsets from the two old ones, and the output
/// is exact. Then a kill -9 at sink parallelism 3, and the last run at 2.
#[cfg(feature = "failpoints")]
#[test]
fn restore_at_another_parallelism_with_an_exactly_once_sink_is_exact() {
    if std::env::var("WEIR_EOS_CHILD").is_ok() {
        return;
    }
    let Some(bootstrap) = common::kafka::bootstrap_or_skip() else { return };
    let (topic, dir) = fresh("rescale", &bootstrap);
    let out = common::output_and_clean(
        child(&dir, &bootstrap, &topic)
            .env("WEIR_EOS_INTERVAL_MS", "400")
            .env("WEIR_FP", "checkpoint::after-manifest-before-commit")
            .env("WEIR_FP_HIT", "4"),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the child should have crashed: {said}");
    assert!(said.contains("CHILD crashed_after="), "the child crashed elsewhere than at the failpoint: {said}");
    // At 3 / 3 / 1, killed after a while (or it finishes first: both are fine).
    let mut running = child(&dir, &bootstrap, &topic)
        .env("WEIR_EOS_SOURCE_P", "3")
        .env("WEIR_EOS_COUNT_P", "3")
        .env("WEIR_EOS_SINK_P", "1")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    common::kill_and_clean(&mut running);
    let mut said = String::new();
    std::io::Read::read_to_string(&mut running.stdout.take().unwrap(), &mut said).unwrap();
    assert!(said.contains("writing its"), "the old subtasks' uncommitted transactions were written again: {said}");
    // At 2 / 1 / 3, killed again; the last run at the defaults (2 / 2 / 2).
    let mut running =
        child(&dir, &bootstrap, &topic).env("WEIR_EOS_COUNT_P", "1").env("WEIR_EOS_SINK_P", "3").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    common::kill_and_clean(&mut running);
    last_run(common::wait_with_watchdog(child(&dir, &bootstrap, &topic).spawn().unwrap(), Duration::from_secs(180)));
    check_output(&bootstrap, &topic);
    std::fs::remove_dir_all(&dir).unwrap();
}
