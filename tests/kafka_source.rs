//! The Kafka source against librdkafka's mock cluster (in process: `assign()` needs no group,
//! so a test starts in a fraction of a second).

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::io::kafka::{DeadLetter, Json, KafkaSource, KafkaSourceConfig, OnBadRecord, RawBytes};
use weir::operators::{Collector, Halt, Signal, Sink, Source, SourcePoll, SubtaskInfo};
use weir::record::Event;
use weir::runtime::{JobError, JobSummary};

type Mock = MockCluster<'static, rdkafka::producer::DefaultProducerContext>;

fn mock(topic: &str, partitions: i32) -> (Mock, String) {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(topic, partitions, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    (cluster, bootstrap)
}

fn producer(bootstrap: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "2")
        .create()
        .expect("producer")
}

/// Produce `payloads` to `topic`, record i to partition i % partitions; wait for delivery.
fn produce(bootstrap: &str, topic: &str, partitions: i32, payloads: impl IntoIterator<Item = Option<Vec<u8>>>) {
    let p = producer(bootstrap);
    for (i, payload) in payloads.into_iter().enumerate() {
        let key = i.to_string();
        let mut record = BaseRecord::to(topic).key(&key).partition(i as i32 % partitions);
        if let Some(bytes) = &payload {
            record = record.payload(bytes);
        }
        let mut record = record;
        loop {
            match p.send(record) {
                Ok(()) => break,
                Err((_, r)) => {
                    record = r;
                    p.poll(Duration::from_millis(10));
                }
            }
        }
    }
    p.flush(Duration::from_secs(30)).expect("delivered");
}

fn event_json(seq: u64) -> Option<Vec<u8>> {
    Some(format!(r#"{{"key":{},"value":1,"time_ns":{},"seq":{seq}}}"#, seq % 7, seq * 1000).into_bytes())
}

fn info(index: u32, parallelism: u32) -> SubtaskInfo {
    SubtaskInfo { job: "test".into(), node: "kafka".into(), index, parallelism, max_key_groups: 128, owned: None }
}

/// Run `job`, failing the test if it has not ended after `limit` (a watchdog, not a speed test).
fn run(job: &Job, limit: Duration) -> Result<JobSummary, JobError> {
    let running = job.start().expect("job starts");
    let deadline = Instant::now() + limit;
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not end in {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    running.wait()
}

/// Collects the seq of every event it is given.
#[derive(Clone, Default)]
struct Seqs(Arc<Mutex<Vec<u64>>>);

/// Check that `seqs` (sorted) is exactly `expected`; on failure say what is missing and repeated
/// (not the whole list).
fn assert_exactly(seqs: &[u64], expected: &[u64], what: &str) {
    if seqs == expected {
        return;
    }
    let have: std::collections::BTreeSet<u64> = seqs.iter().copied().collect();
    let missing: Vec<u64> = expected.iter().filter(|s| !have.contains(s)).copied().collect();
    let repeated = seqs.windows(2).filter(|w| w[0] == w[1]).count();
    panic!(
        "{what}: {} records, {} expected; {} missing (first {:?}), {repeated} repeated",
        seqs.len(),
        expected.len(),
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

impl Seqs {
    fn sorted(&self) -> Vec<u64> {
        let mut v = self.0.lock().unwrap().clone();
        v.sort_unstable();
        v
    }
}

struct SeqSink {
    seqs: Seqs,
    /// Sleep this long on the first record (a stall), then this long every `every` records.
    first_delay: Duration,
    delay: Duration,
    every: u64,
    n: u64,
}

impl SeqSink {
    fn new(seqs: Seqs) -> SeqSink {
        SeqSink { seqs, first_delay: Duration::ZERO, delay: Duration::ZERO, every: 1, n: 0 }
    }
}

impl Sink<Event> for SeqSink {
    fn write(&mut self, e: &Event) -> Result<(), Halt> {
        if self.n == 0 && !self.first_delay.is_zero() {
            std::thread::sleep(self.first_delay);
        }
        self.n += 1;
        if !self.delay.is_zero() && self.n.is_multiple_of(self.every) {
            std::thread::sleep(self.delay);
        }
        self.seqs.0.lock().unwrap().push(e.seq);
        Ok(())
    }
}

/// A collector for driving a source by hand.
#[derive(Default)]
struct VecOut(Vec<Event>);

impl Collector<Event> for VecOut {
    fn collect(&mut self, e: &Event) -> Result<(), Halt> {
        self.0.push(*e);
        Ok(())
    }
    fn signal(&mut self, _: Signal) -> Result<(), Halt> {
        Ok(())
    }
}

/// 4 partitions read by 3 source subtasks (partition p by subtask p % 3) in a job, then a
/// rebalance to 2 sinks: every record produced arrives exactly once (bounded mode ends the
/// job at the end of each partition).
#[test]
fn reads_exactly_what_was_produced_across_partitions_and_subtasks() {
    const N: u64 = 20_000;
    let (_cluster, bootstrap) = mock("events", 4);
    produce(&bootstrap, "events", 4, (0..N).map(event_json));
    let config = KafkaSourceConfig { bounded: true, ..KafkaSourceConfig::new(&bootstrap, "events") };
    let stats = config.stats.clone();
    let seqs = Seqs::default();
    let job = Job::new("kafka-read");
    let s = seqs.clone();
    job.source("kafka", 3, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default()))
        .rebalance()
        .sink("seqs", 2, move |_| SeqSink::new(s.clone()));
    let summary = run(&job, Duration::from_secs(120)).expect("job finishes");
    println!("{summary}");
    assert_exactly(&seqs.sorted(), &(0..N).collect::<Vec<_>>(), "every record exactly once");
    assert_eq!(stats.records.load(Ordering::Relaxed), N);
    for p in 0..4 {
        let s = stats.partition(p).unwrap();
        assert_eq!(s.position.load(Ordering::Relaxed), (N / 4) as i64, "partition {p} read to its end");
        assert_eq!(s.lag.load(Ordering::Relaxed), 0, "partition {p} has no lag left");
    }
}

/// Poll a source by hand until it has emitted at least `want` records (watchdog 60 s).
fn poll_until(source: &mut KafkaSource<Event, Json<Event>>, out: &mut VecOut, want: usize) -> SourcePoll {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = source.poll(out).expect("poll");
        if out.0.len() >= want || r == SourcePoll::Finished {
            return r;
        }
        assert!(Instant::now() < deadline, "watchdog: {} of {want} records after 60 s", out.0.len());
        if let SourcePoll::Idle(_) = r {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A source snapshots its positions mid-stream; a new source restored from that snapshot
/// reads exactly the rest: the two together saw every record once, none skipped or repeated.
#[test]
fn restore_resumes_without_skip_or_duplicate() {
    const N: u64 = 6_000;
    let (_cluster, bootstrap) = mock("restore", 3);
    produce(&bootstrap, "restore", 3, (0..N).map(event_json));
    let config = KafkaSourceConfig { batch_records: 100, ..KafkaSourceConfig::new(&bootstrap, "restore") };

    let mut first = KafkaSource::new(config.clone(), &info(0, 1), Json::<Event>::default());
    let mut before = VecOut::default();
    poll_until(&mut first, &mut before, 2_500);
    let snapshot = first.snapshot_positions(1).expect("snapshot");
    // Records the first source takes after the snapshot are lost with it (a crash).
    poll_until(&mut first, &mut VecOut::default(), 500);
    drop(first);
    println!("snapshot after {} records: {}", before.0.len(), String::from_utf8_lossy(&snapshot));

    let restored = KafkaSourceConfig { bounded: true, ..config };
    let mut second = KafkaSource::new(restored, &info(0, 1), Json::<Event>::default());
    second.restore_positions(Some((1, &snapshot))).expect("restore");
    let mut after = VecOut::default();
    assert_eq!(poll_until(&mut second, &mut after, usize::MAX), SourcePoll::Finished);

    let mut all: Vec<u64> = before.0.iter().chain(&after.0).map(|e| e.seq).collect();
    all.sort_unstable();
    assert_exactly(&all, &(0..N).collect::<Vec<_>>(), "no skip, no duplicate across the restore");
}

/// Restoring at another parallelism: two sources snapshot mid-stream; three (then one)
/// sources restored from both snapshots take the offsets of the partitions they own now,
/// and together with the first two read every record once.
#[test]
fn restore_at_another_parallelism_takes_each_partition_once() {
    const N: u64 = 10_000;
    let (_cluster, bootstrap) = mock("rescale", 5);
    produce(&bootstrap, "rescale", 5, (0..N).map(event_json));
    let config = KafkaSourceConfig { batch_records: 100, ..KafkaSourceConfig::new(&bootstrap, "rescale") };
    let mut before = VecOut::default();
    let mut parts = Vec::new();
    for i in 0..2 {
        let mut first = KafkaSource::new(config.clone(), &info(i, 2), Json::<Event>::default());
        let want = before.0.len() + 1_500;
        poll_until(&mut first, &mut before, want);
        parts.push((i, first.snapshot_positions(1).expect("snapshot")));
        poll_until(&mut first, &mut VecOut::default(), 300);
    }
    for to in [3, 1] {
        let mut after = VecOut::default();
        for j in 0..to {
            let restored = KafkaSourceConfig { bounded: true, ..config.clone() };
            let mut second = KafkaSource::new(restored, &info(j, to), Json::<Event>::default());
            let from = weir::operators::Rescaled {
                checkpoint_id: 1,
                from_parallelism: 2,
                index: j,
                parallelism: to,
                parts: parts.clone(),
            };
            second.restore_positions_rescaled(&from).expect("restore");
            assert_eq!(poll_until(&mut second, &mut after, usize::MAX), SourcePoll::Finished);
        }
        let mut all: Vec<u64> = before.0.iter().chain(&after.0).map(|e| e.seq).collect();
        all.sort_unstable();
        assert_exactly(&all, &(0..N).collect::<Vec<_>>(), &format!("2 -> {to} subtasks: no skip, no duplicate"));
    }
}

/// Malformed JSON, a tombstone and oversized payloads go to the dead-letter file with topic,
/// partition, offset and the reason; they are counted; every good record still arrives.
#[test]
fn bad_and_oversized_records_reach_the_dead_letter_file() {
    let dead_letter = std::env::temp_dir().join(format!("weir-kafka-dead-letter-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&dead_letter);
    let (_cluster, bootstrap) = mock("bad", 2);
    // seq % 10: 3 malformed, 5 oversized (2,000 bytes > 1,024), 7 a tombstone; the rest good.
    let payloads = (0..1_000u64).map(|seq| match seq % 10 {
        3 => Some(b"{not json".to_vec()),
        5 => Some(vec![b'x'; 2_000]),
        7 => None,
        _ => event_json(seq),
    });
    produce(&bootstrap, "bad", 2, payloads);
    let config = KafkaSourceConfig {
        bounded: true,
        max_record_bytes: 1024,
        on_bad_record: OnBadRecord::DeadLetter,
        dead_letter: Some(DeadLetter::File(dead_letter.clone())),
        ..KafkaSourceConfig::new(&bootstrap, "bad")
    };
    let stats = config.stats.clone();
    let seqs = Seqs::default();
    let s = seqs.clone();
    let job = Job::new("kafka-bad");
    job.source("kafka", 2, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default())).sink(
        "seqs",
        2,
        move |_| SeqSink::new(s.clone()),
    );
    run(&job, Duration::from_secs(60)).expect("bad records do not fail the job");

    let good: Vec<u64> = (0..1_000).filter(|s| ![3, 5, 7].contains(&(s % 10))).collect();
    assert_exactly(&seqs.sorted(), &good, "good records");
    assert_eq!(stats.malformed.load(Ordering::Relaxed), 200, "malformed and tombstones");
    assert_eq!(stats.oversized.load(Ordering::Relaxed), 100);
    assert_eq!(stats.dead_letters.load(Ordering::Relaxed), 300);
    let text = std::fs::read_to_string(&dead_letter).expect("dead-letter file");
    let mut reasons = std::collections::BTreeMap::<u64, String>::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["topic"], "bad");
        let (partition, offset) = (v["partition"].as_i64().unwrap(), v["offset"].as_i64().unwrap());
        // Record i went to partition i % 2 at offset i / 2.
        let seq = (offset * 2 + partition) as u64;
        assert_eq!(v["key"].as_str().unwrap(), seq.to_string(), "{v}");
        reasons.insert(seq, v["reason"].as_str().unwrap().to_owned());
        if seq % 10 == 5 {
            assert_eq!(v["payload_bytes"], 2_000, "the size is recorded, the record never truncated in the job");
        }
    }
    assert_eq!(reasons.len(), 300);
    for (seq, reason) in reasons {
        match seq % 10 {
            3 => assert!(reason.contains("not JSON"), "{seq}: {reason}"),
            5 => assert!(reason.contains("2000 bytes") && reason.contains("1024"), "{seq}: {reason}"),
            7 => assert!(reason.contains("tombstone"), "{seq}: {reason}"),
            _ => panic!("a good record {seq} was dead-lettered: {reason}"),
        }
    }
    let _ = std::fs::remove_file(&dead_letter);
}

/// With on_bad_record = fail, the first bad record fails the job naming partition, offset and
/// reason; a dead_letter policy without a destination is refused before anything is read.
#[test]
fn bad_record_policy_fail_and_missing_destination() {
    let (_cluster, bootstrap) = mock("fail", 1);
    produce(&bootstrap, "fail", 1, [event_json(0), Some(b"oops".to_vec())]);
    let config = KafkaSourceConfig { bounded: true, ..KafkaSourceConfig::new(&bootstrap, "fail") };
    let job = Job::new("kafka-fail");
    job.source("kafka", 1, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default())).sink(
        "seqs",
        1,
        |_| SeqSink::new(Seqs::default()),
    );
    let message = run(&job, Duration::from_secs(60)).expect_err("a bad record fails the job").to_string();
    assert!(message.contains("partition 0 offset 1") && message.contains("not JSON"), "{message}");

    let config =
        KafkaSourceConfig { on_bad_record: OnBadRecord::DeadLetter, ..KafkaSourceConfig::new(&bootstrap, "x") };
    let source = KafkaSource::new(config, &info(0, 1), RawBytes::default());
    let error: &str = source.setup_error().expect("refused");
    assert!(error.contains("no dead-letter destination"), "{error}");
}

/// A prefetch configuration over the limit is refused, naming the property and the bound.
#[test]
fn prefetch_over_the_limit_is_refused() {
    let config =
        KafkaSourceConfig { prefetch_limit_bytes: Some(32 << 20), ..KafkaSourceConfig::new("127.0.0.1:1", "t") };
    println!("default prefetch bound: {} bytes", config.prefetch_budget_bytes());
    assert!(config.validate().is_ok(), "weir's defaults fit in 32 MiB");
    let config = config.set("queued.max.messages.kbytes", 65536);
    let error = config.validate().unwrap_err().to_string();
    println!("{error}");
    assert!(error.contains("queued.max.messages.kbytes=65536") && error.contains("over the limit"), "{error}");
    let config = KafkaSourceConfig { prefetch_limit_bytes: Some(32 << 20), ..KafkaSourceConfig::new("h:1", "t") }
        .set("fetch.max.bytes", 52_428_800);
    let error = config.validate().unwrap_err().to_string();
    assert!(error.contains("receive.message.max.bytes=52429312"), "{error}");
}

/// The sink stalls for 3 s, far longer than `max.poll.interval.ms` (1 s) and
/// `session.timeout.ms`, so the source cannot poll: with `assign()` there is no group
/// membership to lose. Nothing is lost, nothing repeated, and the client reports no error.
#[test]
fn a_stall_longer_than_max_poll_interval_loses_nothing() {
    const N: u64 = 3_000;
    let (_cluster, bootstrap) = mock("stall", 2);
    produce(&bootstrap, "stall", 2, (0..N).map(event_json));
    let config = KafkaSourceConfig { bounded: true, ..KafkaSourceConfig::new(&bootstrap, "stall") }
        .set("max.poll.interval.ms", 1000)
        .set("session.timeout.ms", 1000)
        .set("heartbeat.interval.ms", 100)
        // Small prefetch, so the stall happens with most records still in Kafka.
        .set("queued.max.messages.kbytes", 16)
        .set("message.max.bytes", 4096)
        .set("fetch.max.bytes", 4096)
        .set("fetch.message.max.bytes", 2048);
    let stats = config.stats.clone();
    let seqs = Seqs::default();
    let s = seqs.clone();
    let job = Job::new("kafka-stall");
    job.configure(|c| {
        c.ring_slots = 64;
        c.max_record_bytes = 1024;
    });
    job.source("kafka", 1, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default()))
        .rebalance()
        .sink("slow", 1, move |_| SeqSink { first_delay: Duration::from_secs(3), ..SeqSink::new(s.clone()) });
    run(&job, Duration::from_secs(120)).expect("job finishes");
    assert_exactly(&seqs.sorted(), &(0..N).collect::<Vec<_>>(), "after the stall");
    assert_eq!(stats.client_errors.load(Ordering::Relaxed), 0, "no group eviction, no client error");
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat.
fn process_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are 12 and 13 after the command name and state.
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

/// An idle source waits in io_uring on the client's queue event, the mailbox word and a
/// timeout: a quiet topic costs (almost) no CPU, a new record ends the wait (a Kafka wakeup,
/// not the timeout), and so does a change of the mailbox word. Prints the CPU figure; asserts
/// no time bound.
#[test]
fn idle_source_waits_on_kafka_and_mailbox_in_io_uring() {
    let (_cluster, bootstrap) = mock("idle", 1);
    let config = KafkaSourceConfig::new(&bootstrap, "idle");
    let stats = config.stats.clone();
    let mut source = KafkaSource::new(config, &info(0, 1), Json::<Event>::default());
    let mut out = VecOut::default();
    let word = AtomicU32::new(0);
    // Assign, drain whatever connection events there are.
    let settle = Instant::now() + Duration::from_millis(500);
    while Instant::now() < settle {
        if let SourcePoll::Idle(_) = source.poll(&mut out).unwrap() {
            source.wait_on(&word, 0, Duration::from_millis(50));
        }
    }

    // Idle: 3 s of poll + wait, as the runtime would drive it.
    let (cpu0, t0) = (process_cpu_s(), Instant::now());
    while t0.elapsed() < Duration::from_secs(3) {
        if let SourcePoll::Idle(d) = source.poll(&mut out).unwrap() {
            assert!(source.wait_on(&word, 0, d), "the source waits itself");
        }
    }
    let cpu = process_cpu_s() - cpu0;
    println!(
        "idle source: {:.1} % of a core over {:?} ({} waits, futex fallback: {})",
        cpu * 100.0 / t0.elapsed().as_secs_f64(),
        t0.elapsed(),
        stats.waits.load(Ordering::Relaxed),
        source.futex_fallback()
    );
    assert!(out.0.is_empty());

    // A record arrives during a long wait: the wait ends early, woken by Kafka.
    let wakeups = stats.kafka_wakeups.load(Ordering::Relaxed);
    let b = bootstrap.clone();
    let producer = std::thread::spawn(move || {
        // Connected before the clock starts, so the figure is the source's reaction.
        let p = producer(&b);
        p.client().fetch_metadata(Some("idle"), Duration::from_secs(10)).expect("metadata");
        std::thread::sleep(Duration::from_millis(300));
        let sent = Instant::now();
        p.send(BaseRecord::to("idle").key("k").payload(&event_json(42).unwrap())).expect("queued");
        p.flush(Duration::from_secs(30)).expect("delivered");
        sent
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.0.is_empty() {
        assert!(Instant::now() < deadline, "watchdog: the record did not arrive in 60 s");
        if let SourcePoll::Idle(_) = source.poll(&mut out).unwrap() {
            source.wait_on(&word, 0, Duration::from_secs(30));
        }
    }
    let seen = Instant::now();
    let sent = producer.join().unwrap();
    println!(
        "a new record reached the idle source {:?} after send() (linger.ms=2 included)",
        seen.saturating_duration_since(sent)
    );
    assert_eq!(out.0[0].seq, 42);
    assert!(stats.kafka_wakeups.load(Ordering::Relaxed) > wakeups, "a Kafka event ended a wait");

    // The mailbox word changes during a long wait: the wait ends.
    let word = Arc::new(AtomicU32::new(7));
    let w = word.clone();
    let waker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        w.fetch_add(1, Ordering::Release);
        // Shared FUTEX_WAKE, as the runtime's mailbox rings.
        weir::ring::wake(&w);
    });
    let t = Instant::now();
    assert!(source.wait_on(&word, 7, Duration::from_secs(30)));
    waker.join().unwrap();
    println!("mailbox wake ended the wait after {:?} (timeout 30 s)", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(30) || source.futex_fallback());
}

/// A record larger than the client's fetch limits (`receive.message.max.bytes`, 1 MiB by
/// default): librdkafka fails the fetch and retries for ever. The source does not swallow
/// that: it logs and counts the errors, and once they have lasted `error_timeout` without a
/// record, fails the job naming the setting to raise. With the limits raised the same records
/// are read and the big one is dead-lettered.
#[test]
fn a_record_over_the_fetch_limits_fails_the_job_naming_the_setting() {
    let dead_letter = std::env::temp_dir().join(format!("weir-kafka-big-{}.jsonl", std::process::id()));
    let (_cluster, bootstrap) = mock("big", 1);
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("message.max.bytes", "4000000")
        .create()
        .expect("producer");
    let big = vec![b'x'; 1_500_000];
    for payload in [event_json(0).unwrap(), big, event_json(2).unwrap()] {
        p.send(BaseRecord::<(), _>::to("big").partition(0).payload(&payload)).map_err(|(e, _)| e).unwrap();
        p.flush(Duration::from_secs(30)).unwrap();
    }
    let job_with = |properties: &[(&str, &str)]| {
        let mut config = KafkaSourceConfig {
            bounded: true,
            error_timeout: Duration::from_secs(3),
            on_bad_record: OnBadRecord::DeadLetter,
            dead_letter: Some(DeadLetter::File(dead_letter.clone())),
            ..KafkaSourceConfig::new(&bootstrap, "big")
        };
        for (k, v) in properties {
            config.properties.insert((*k).into(), (*v).into());
        }
        let stats = config.stats.clone();
        let seqs = Seqs::default();
        let s = seqs.clone();
        let job = Job::new("kafka-big");
        job.configure(|c| c.pinning = false);
        job.source("kafka", 1, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default())).sink(
            "seqs",
            1,
            move |_| SeqSink::new(s.clone()),
        );
        (job, stats, seqs)
    };
    let (job, stats, _) = job_with(&[]);
    let e = run(&job, Duration::from_secs(120)).expect_err("the fetch never succeeds");
    println!("{e}\nclient errors: {}", stats.client_errors.load(Ordering::Relaxed));
    assert!(e.to_string().contains("receive.message.max.bytes"), "{e}");

    let (job, stats, seqs) = job_with(&[("receive.message.max.bytes", "8000000"), ("fetch.max.bytes", "7000000")]);
    run(&job, Duration::from_secs(120)).expect("read with the limits raised");
    assert_exactly(&seqs.sorted(), &[0, 2], "the small records");
    assert_eq!(stats.oversized.load(Ordering::Relaxed), 1, "the big one, dead-lettered");
    let _ = std::fs::remove_file(&dead_letter);
}

/// Issue #20 item 6: while the job backpressures the source (a sink that stopped
/// answering), the source neither fetches nor publishes, yet its lag grows with what is
/// produced: the lag refresher asks the brokers for the high watermark (`lag.rs`).
#[test]
fn lag_grows_with_what_is_produced_while_the_source_is_paused() {
    let (_cluster, bootstrap) = mock("paused", 1);
    produce(&bootstrap, "paused", 1, (0..1_000).map(event_json));
    let config = KafkaSourceConfig {
        batch_records: 50,
        lag_refresh: Some(Duration::from_millis(200)),
        ..KafkaSourceConfig::new(&bootstrap, "paused")
    };
    let stats = config.stats.clone();
    let gate = weir_tools::stuck::Gate::new();
    let stuck = gate.sink();
    let job = Job::new("kafka-paused-lag");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 64;
        c.max_record_bytes = 256;
    });
    job.source("kafka", 1, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default()))
        .rebalance()
        .sink("out", 1, move |_| stuck.clone());
    let mut running = job.start().unwrap();
    let gate = gate; // dropped before the job, however the test ends (see `Gate`)
    let p = stats.partition(0).unwrap();
    // Stuck: the position stops well short of the 1,000 records.
    let t = Instant::now();
    let mut last = (-1, Instant::now());
    let position = loop {
        let now = p.position.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if now >= 0 && last.1.elapsed() > Duration::from_millis(500) && p.lag.load(Ordering::Relaxed) >= 0 {
            break now;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "watchdog: the source never got stuck");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(position < 1_000, "the blocked sink holds the source back: position {position}");
    produce(&bootstrap, "paused", 1, (1_000..6_000).map(event_json));
    let t = Instant::now();
    loop {
        let lag = p.lag.load(Ordering::Relaxed);
        if lag == 6_000 - position {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "watchdog: the lag stayed at {lag} while 5,000 more records were produced (position {position})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(p.position.load(Ordering::Relaxed), position, "the source stayed paused meanwhile");
    drop(gate);
    running.cancel();
    let _ = running.wait();
}
