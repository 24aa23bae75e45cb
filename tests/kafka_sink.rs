//! The Kafka sink: at-least-once against librdkafka's mock cluster (in process), and
//! exactly-once against Apache Kafka (`tools/kafka/broker.sh start`, then
//! `WEIR_KAFKA_BOOTSTRAP=127.0.0.1:PORT`): the mock cluster does not hide aborted
//! transactions from `read_committed` readers, so it cannot test them.

mod common;

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use std::sync::atomic::Ordering;
use std::time::Duration;
use weir::graph::Job;
use weir::io::kafka::{Delivery, JsonEncode, KafkaSink, KafkaSinkConfig};
use weir::operators::builtin::Generator;
use weir::operators::{Sink, SubtaskInfo};
use weir::record::Event;

fn info(index: u32) -> SubtaskInfo {
    SubtaskInfo { job: "test".into(), node: "sink".into(), index, parallelism: 1, max_key_groups: 128, owned: None }
}

/// Every record of `topic` (all `partitions`) from the start up to the end, as seq numbers
/// (JSON events), sorted, read with `isolation`.
fn read_seqs(bootstrap: &str, topic: &str, partitions: i32, isolation: &str) -> Vec<u64> {
    let mut seqs: Vec<u64> = common::kafka::read_payloads(bootstrap, topic, partitions, isolation)
        .iter()
        .map(|p| serde_json::from_slice::<Event>(p).unwrap().seq)
        .collect();
    seqs.sort_unstable();
    seqs
}

fn check_exactly(seqs: &[u64], n: u64, what: &str) {
    let dup = seqs.windows(2).filter(|w| w[0] == w[1]).count();
    let distinct: std::collections::BTreeSet<&u64> = seqs.iter().collect();
    assert_eq!((distinct.len() as u64, dup), (n, 0), "{what}: {} records, {dup} repeated, {n} expected", seqs.len());
    assert_eq!(distinct.into_iter().copied().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>(), "{what}");
}

/// generator (2) -> Kafka sink (2), keyed: read back, every record is there exactly once.
#[test]
fn produce_then_read_back_exactly() {
    const N: u64 = 20_000;
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("out", 3, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let config = KafkaSinkConfig::new(&bootstrap, "out");
    let stats = config.stats.clone();
    let job = Job::new("kafka-sink");
    job.source("gen", 2, |info| Generator::events(info, N, 100)).sink("kafka", 2, move |info| {
        KafkaSink::new(config.clone(), info, JsonEncode::<Event>::default())
            .with_key(|e: &Event, key: &mut Vec<u8>| key.extend_from_slice(&e.key.to_be_bytes()))
    });
    job.run().expect("job finishes");
    assert_eq!(stats.records.load(Ordering::Relaxed), N);
    assert_eq!(stats.delivered.load(Ordering::Relaxed), N);
    check_exactly(&read_seqs(&bootstrap, "out", 3, "read_uncommitted"), N, "read back");
}

/// A mock cluster with one single-partition `topic`, each produce request taking 5 ms at
/// the broker, and a sink config whose producer queue (200 records) stays full.
fn small_queue_on_a_slow_broker(
    topic: &str,
) -> (MockCluster<'static, rdkafka::producer::DefaultProducerContext>, KafkaSinkConfig) {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(topic, 1, 1).unwrap();
    cluster.broker_round_trip_time(1, Duration::from_millis(5)).unwrap();
    let config = KafkaSinkConfig::new(&cluster.bootstrap_servers(), topic)
        .set("queue.buffering.max.messages", 200)
        .set("batch.num.messages", 50)
        .set("linger.ms", 1);
    (cluster, config)
}

/// A producer queue far smaller than the input: `write` blocks on a full queue, sleeping in
/// its io_uring until a delivery report arrives (backpressure starts at the sink), and every
/// record still arrives once.
#[test]
fn a_full_producer_queue_waits_for_delivery_reports_in_io_uring() {
    const N: u64 = 20_000;
    let (cluster, config) = small_queue_on_a_slow_broker("small");
    let bootstrap = cluster.bootstrap_servers();
    let stats = config.stats.clone();
    let job = Job::new("kafka-sink-small-queue");
    job.source("gen", 1, |info| Generator::events(info, N, 100))
        .sink("kafka", 1, move |info| KafkaSink::new(config.clone(), info, JsonEncode::<Event>::default()));
    job.run().expect("job finishes");
    let waits = stats.waits.load(Ordering::Relaxed);
    let blocked_ms = stats.blocked.total_ns() / 1_000_000;
    println!("waits in io_uring: {waits}, blocked {blocked_ms} ms");
    assert!(waits > 0, "the sink slept waiting for delivery reports");
    assert_eq!(stats.delivered.load(Ordering::Relaxed), N);
    check_exactly(&read_seqs(&bootstrap, "small", 1, "read_uncommitted"), N, "read back");
}

/// As fibers (the sink sharing its CPU's thread with the generator), a full producer queue
/// and the flush at each checkpoint wait by serving delivery reports between fiber sleeps,
/// not by blocking the thread the generator also runs on; every record arrives once.
#[test]
fn a_sink_running_as_a_fiber_waits_without_blocking_its_thread() {
    const N: u64 = 20_000;
    let (cluster, config) = small_queue_on_a_slow_broker("fibers");
    let bootstrap = cluster.bootstrap_servers();
    let stats = config.stats.clone();
    let dir = std::env::temp_dir().join(common::unique("weir-kafka-fibers"));
    let _remove = common::RemoveOnDrop(dir.clone());
    let job = Job::new("kafka-sink-fibers");
    job.configure(|c| {
        c.fibers = true;
        c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
            interval: Duration::from_millis(50),
            ..weir::checkpoint::CheckpointSettings::new(&dir)
        });
    });
    // Two subtasks on CPU 0: the generator, and the map chained with the sink.
    job.source("gen", 1, |info| Generator::events(info, N, 100))
        .cpus(&[0])
        .rebalance()
        .map("m", |e: &Event| *e)
        .cpus(&[0])
        .sink("kafka", 1, move |info| KafkaSink::new(config.clone(), info, JsonEncode::<Event>::default()));
    let summary = job.run().expect("job finishes");
    println!("checkpoints completed: {}", summary.checkpoints.completed.len());
    assert_eq!(stats.delivered.load(Ordering::Relaxed), N);
    check_exactly(&read_seqs(&bootstrap, "fibers", 1, "read_uncommitted"), N, "read back");
}

/// The mock broker fails produce requests again and again (retriable errors, including
/// "the request timed out" after the broker may have written the batch): the idempotent
/// producer retries without duplicating or losing a record.
#[test]
fn idempotent_producer_under_broker_faults() {
    const N: u64 = 5_000;
    let cluster = MockCluster::new(3).unwrap();
    cluster.create_topic("faults", 2, 3).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let errors: Vec<RDKafkaRespErr> = [
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR__TRANSPORT,
    ]
    .repeat(5);
    cluster.request_errors(RDKafkaApiKey::Produce, &errors);
    let config = KafkaSinkConfig::new(&bootstrap, "faults").set("retry.backoff.ms", 10).set("linger.ms", 1);
    let mut sink = KafkaSink::new(config.clone(), &info(0), JsonEncode::<Event>::default());
    for seq in 0..N {
        sink.write(&Event { key: seq % 10, value: 1, time_ns: seq, seq }).expect("write");
    }
    sink.finish().expect("finish: every record delivered despite the faults");
    assert_eq!(config.stats.delivered.load(Ordering::Relaxed), N);
    check_exactly(&read_seqs(&bootstrap, "faults", 2, "read_uncommitted"), N, "after faults");
}

/// A queue bound over the limit is refused with the property named; exactly-once refuses a
/// transaction timeout below the checkpoint timeout, and needs a transaction log directory.
#[test]
fn sink_settings_are_checked() {
    let config = KafkaSinkConfig { queue_limit_bytes: Some(64 << 20), ..KafkaSinkConfig::new("h:1", "t") };
    println!("default queue bound: {} bytes", config.queue_budget_bytes());
    assert!(config.validate().is_ok());
    let error = config.set("queue.buffering.max.kbytes", 1_048_576).validate().unwrap_err().to_string();
    assert!(error.contains("queue.buffering.max.kbytes") && error.contains("over the limit"), "{error}");
    let config = KafkaSinkConfig {
        delivery: Delivery::ExactlyOnce,
        checkpoint_timeout: Duration::from_secs(120),
        ..KafkaSinkConfig::new("h:1", "t")
    };
    let error = config.validate().unwrap_err().to_string();
    assert!(error.contains("transaction_log_dir"), "{error}");
    let config = KafkaSinkConfig { transaction_log_dir: Some("/tmp/weir-txn".into()), ..config };
    assert!(config.validate().is_ok(), "the default transaction timeout follows the checkpoint timeout");
    let error = config.set("transaction.timeout.ms", 60_000).validate().unwrap_err().to_string();
    assert!(error.contains("transaction.timeout.ms=60000") && error.contains("120000"), "{error}");
    let sink: KafkaSink<Event, JsonEncode<Event>> = KafkaSink::new(
        KafkaSinkConfig::new("h:1", "t").set("enable.idempotence", false),
        &info(0),
        JsonEncode::default(),
    );
    assert!(sink.setup_error().unwrap().contains("enable.idempotence"));
}

/// The Apache Kafka broker of `tools/kafka/broker.sh`, or `None` (the test prints why it
/// skips).
fn broker() -> Option<String> {
    match std::env::var("WEIR_KAFKA_BOOTSTRAP") {
        Ok(b) if !b.is_empty() => Some(b),
        _ => {
            println!("skipped: WEIR_KAFKA_BOOTSTRAP is not set (start a broker: tools/kafka/broker.sh start)");
            None
        }
    }
}

fn unique(name: &str) -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    format!("{name}-{}-{t}", std::process::id())
}

fn eos_config(bootstrap: &str, topic: &str) -> KafkaSinkConfig {
    KafkaSinkConfig {
        delivery: Delivery::ExactlyOnce,
        transactional_id_prefix: topic.to_owned(),
        checkpoint_timeout: Duration::from_secs(30),
        flush_timeout: Duration::from_secs(30),
        transaction_log_dir: Some(std::env::temp_dir().join(format!("weir-txnlog-{topic}"))),
        ..KafkaSinkConfig::new(bootstrap, topic)
    }
}

fn write_range(sink: &mut impl Sink<Event>, seqs: std::ops::Range<u64>) {
    for seq in seqs {
        sink.write(&Event { key: seq % 5, value: 1, time_ns: seq, seq }).expect("write");
    }
}

/// Exactly-once: records become visible to read_committed readers only when their
/// checkpoint completes, records after a barrier wait for the next checkpoint (another
/// producer of the pool), and a restore after a commit goes on.
#[test]
fn exactly_once_commits_at_checkpoint_completion() {
    let Some(bootstrap) = broker() else { return };
    let topic = unique("weir-eos");
    let config = eos_config(&bootstrap, &topic);
    let mut sink = KafkaSink::new(config.clone(), &info(0), JsonEncode::<Event>::default());
    sink.restore(None).expect("fresh start");
    write_range(&mut sink, 0..100);
    let snapshot1 = sink.snapshot(1).expect("snapshot 1");
    write_range(&mut sink, 100..150); // after barrier 1: the next transaction
    assert_eq!(read_seqs(&bootstrap, &topic, 1, "read_committed").len(), 0, "nothing visible before completion");
    assert_eq!(read_seqs(&bootstrap, &topic, 1, "read_uncommitted").len(), 150, "written, not visible");
    sink.checkpoint_complete(1).expect("commit 1");
    check_exactly(&read_seqs(&bootstrap, &topic, 1, "read_committed"), 100, "checkpoint 1 visible");
    let snapshot2 = sink.snapshot(2).expect("snapshot 2");
    sink.checkpoint_complete(2).expect("commit 2");
    check_exactly(&read_seqs(&bootstrap, &topic, 1, "read_committed"), 150, "checkpoint 2 visible");
    drop(sink);
    println!("snapshot 1: {}", String::from_utf8_lossy(&snapshot1));

    // A restart from checkpoint 2 (committed) goes on; its new records are visible at 3.
    let mut sink = KafkaSink::new(config, &info(0), JsonEncode::<Event>::default());
    sink.restore(Some((2, &snapshot2))).expect("checkpoint 2 was committed: restore goes on");
    write_range(&mut sink, 150..200);
    sink.snapshot(3).unwrap();
    sink.checkpoint_complete(3).unwrap();
    check_exactly(&read_seqs(&bootstrap, &topic, 1, "read_committed"), 200, "after the restart");
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("weir-txnlog-{topic}")));
}

/// A crash between "checkpoint 1 durable" and its commit: the restarted sink's
/// init_transactions aborts the prepared transaction (librdkafka cannot resume it); the sink
/// sees that its records are not visible and writes them again from its transaction log, so
/// checkpoint 1's records are visible exactly once. Records written after the barrier stay
/// aborted (the sources read them again). A second crash right after that restore, and a
/// third restore from the same checkpoint, write nothing twice.
#[test]
fn a_crash_before_the_commit_is_repaired_from_the_transaction_log() {
    let Some(bootstrap) = broker() else { return };
    let topic = unique("weir-eos-crash");
    let config = eos_config(&bootstrap, &topic);
    let log_dir = config.transaction_log_dir.clone().unwrap();
    let mut sink = KafkaSink::new(config.clone(), &info(0), JsonEncode::<Event>::default());
    sink.restore(None).unwrap();
    write_range(&mut sink, 0..100);
    let snapshot1 = sink.snapshot(1).expect("snapshot 1");
    write_range(&mut sink, 100..120);
    sink.snapshot(2).expect("flushes the records after barrier 1");
    std::mem::forget(sink); // the crash: no commit, no clean close

    for round in 0..3 {
        let mut restarted = KafkaSink::new(config.clone(), &info(0), JsonEncode::<Event>::default());
        restarted.restore(Some((1, &snapshot1))).expect("the log repairs the aborted transaction");
        check_exactly(&read_seqs(&bootstrap, &topic, 1, "read_committed"), 100, &format!("restore {round}"));
        std::mem::forget(restarted); // crash again
    }
    assert_eq!(config.stats.replayed_transactions.load(Ordering::Relaxed), 1, "written again once");
    assert_eq!(config.stats.replayed_records.load(Ordering::Relaxed), 100);

    // The job goes on from checkpoint 1; once checkpoint 2 completes, the logs are gone.
    let mut sink = KafkaSink::new(config.clone(), &info(0), JsonEncode::<Event>::default());
    sink.restore(Some((1, &snapshot1))).unwrap();
    write_range(&mut sink, 100..130);
    sink.snapshot(2).unwrap();
    sink.checkpoint_complete(2).unwrap();
    check_exactly(&read_seqs(&bootstrap, &topic, 1, "read_committed"), 130, "after checkpoint 2");
    let left: Vec<_> = std::fs::read_dir(&log_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| !f.ends_with(".committed"))
        .collect();
    assert!(left.is_empty(), "logs left after the commit: {left:?}");
    std::fs::remove_dir_all(&log_dir).unwrap();
}

/// A transaction log that does not match its checkpoint is never written half: the restore
/// fails and names the file.
#[test]
fn a_changed_transaction_log_fails_the_restore() {
    let Some(bootstrap) = broker() else { return };
    let topic = unique("weir-eos-torn");
    let config = eos_config(&bootstrap, &topic);
    let log_dir = config.transaction_log_dir.clone().unwrap();
    let mut sink = KafkaSink::new(config.clone(), &info(0), JsonEncode::<Event>::default());
    sink.restore(None).unwrap();
    write_range(&mut sink, 0..50);
    let snapshot1 = sink.snapshot(1).unwrap();
    std::mem::forget(sink);
    let log = std::fs::read_dir(&log_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".c1.log"))
        .unwrap();
    let mut body = std::fs::read(&log).unwrap();
    body.truncate(body.len() - 3);
    std::fs::write(&log, body).unwrap();
    let mut restarted = KafkaSink::new(config, &info(0), JsonEncode::<Event>::default());
    let error = restarted.restore(Some((1, &snapshot1))).expect_err("a torn log is refused").to_string();
    assert!(error.contains("changed or torn") && error.contains(".c1.log"), "{error}");
    assert_eq!(read_seqs(&bootstrap, &topic, 1, "read_committed"), Vec::<u64>::new(), "nothing half-written");
    std::fs::remove_dir_all(&log_dir).unwrap();
}

/// Kafka drops the commit marker (an offset of a group without members) after
/// offsets.retention.minutes: the sink's local record of its last commit still says the
/// checkpoint's transaction was committed, so a restore neither re-writes it nor fails.
#[test]
fn a_commit_marker_gone_from_kafka_is_covered_by_the_local_record() {
    let Some(bootstrap) = broker() else { return };
    let topic = unique("weir-eos-expired");
    let config = eos_config(&bootstrap, &topic);
    let log_dir = config.transaction_log_dir.clone().unwrap();
    let mut sink = KafkaSink::new(config.clone(), &info(0), JsonEncode::<Event>::default());
    sink.restore(None).unwrap();
    write_range(&mut sink, 0..40);
    let snapshot1 = sink.snapshot(1).unwrap();
    sink.checkpoint_complete(1).unwrap();
    drop(sink);
    // What retention does after 7 days (the default): the group's offsets are gone.
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    let group = format!("weir-txn-{topic}-0");
    for r in
        common::kafka::block_on(admin.delete_groups(&[group.as_str()], &rdkafka::admin::AdminOptions::new())).unwrap()
    {
        r.unwrap();
    }
    let mut restarted = KafkaSink::new(config.clone(), &info(0), JsonEncode::<Event>::default());
    restarted.restore(Some((1, &snapshot1))).expect("the local record says checkpoint 1 was committed");
    assert_eq!(config.stats.replayed_transactions.load(Ordering::Relaxed), 0, "nothing written twice");
    check_exactly(&read_seqs(&bootstrap, &topic, 1, "read_committed"), 40, "checkpoint 1, once");
    std::fs::remove_dir_all(&log_dir).unwrap();
}

/// With two producers, the end of input right after a barrier (before that barrier's commit)
/// finds both prepared: no producer is needed after the end, so the final checkpoint goes on.
#[test]
fn the_final_checkpoint_needs_no_idle_producer() {
    let Some(bootstrap) = broker() else { return };
    let topic = unique("weir-eos-final");
    let config = KafkaSinkConfig { transactional_producers: 2, ..eos_config(&bootstrap, &topic) };
    let log_dir = config.transaction_log_dir.clone().unwrap();
    let mut sink = KafkaSink::new(config, &info(0), JsonEncode::<Event>::default());
    sink.restore(None).unwrap();
    write_range(&mut sink, 0..10);
    sink.snapshot(1).unwrap();
    write_range(&mut sink, 10..20);
    sink.snapshot(u64::MAX).expect("the final checkpoint prepares with both producers busy");
    sink.checkpoint_complete(u64::MAX).unwrap();
    check_exactly(&read_seqs(&bootstrap, &topic, 1, "read_committed"), 20, "everything, at the end");
    std::fs::remove_dir_all(&log_dir).unwrap();
}

/// A topic written with transactions ends with a transaction marker, an offset no reader is
/// handed: a bounded source on it must still see it has read everything (librdkafka's own
/// position moves past the marker), and finish.
#[test]
fn a_bounded_source_finishes_on_a_topic_written_with_transactions() {
    let Some(bootstrap) = broker() else { return };
    let topic = unique("weir-eos-bounded");
    let config = eos_config(&bootstrap, &topic);
    let log_dir = config.transaction_log_dir.clone().unwrap();
    let mut sink = KafkaSink::new(config, &info(0), JsonEncode::<Event>::default());
    sink.restore(None).unwrap();
    write_range(&mut sink, 0..50);
    sink.snapshot(1).unwrap();
    sink.checkpoint_complete(1).unwrap();
    drop(sink);

    let tally = std::sync::Arc::new(weir::operators::builtin::Tally::default());
    let source = weir::io::kafka::KafkaSourceConfig {
        bounded: true,
        ..weir::io::kafka::KafkaSourceConfig::new(&bootstrap, &topic).set("isolation.level", "read_committed")
    };
    let job = Job::new("kafka-bounded-txn");
    let t = tally.clone();
    job.source("in", 1, move |info| {
        weir::io::kafka::KafkaSource::new(source.clone(), info, weir::io::kafka::Json::<Event>::default())
    })
    .sink("count", 1, move |_| weir::operators::builtin::CountingSink::new(t.clone()));
    let running = job.start().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !running.is_finished() {
        assert!(std::time::Instant::now() < deadline, "watchdog: the bounded source did not finish in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    running.wait().unwrap();
    assert_eq!(tally.totals().0, 50, "every committed record, once");
    std::fs::remove_dir_all(&log_dir).unwrap();
}
