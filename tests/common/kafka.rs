//! The Apache Kafka broker of `.ci/test` in the Kafka tests: finding it, fresh topics filled
//! with events, reading a topic back, and waiting for rdkafka's admin calls.
#![allow(dead_code)]

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weir::record::Event;

/// The broker's address (`WEIR_KAFKA_BOOTSTRAP`, as `.ci/test` sets it); `None`, after
/// saying the test is skipped, when it is not set.
pub fn bootstrap_or_skip() -> Option<String> {
    let bootstrap = std::env::var("WEIR_KAFKA_BOOTSTRAP").ok();
    if bootstrap.is_none() {
        println!("SKIPPED: needs Apache Kafka (tools/kafka/broker.sh start; WEIR_KAFKA_BOOTSTRAP not set)");
    }
    bootstrap
}

/// A topic name no run has used (the broker keeps its topics between test runs), made from
/// `prefix`, and a directory of the same name under the temp dir for the test's jobs.
pub fn fresh_topic_and_dir(prefix: &str) -> (String, PathBuf) {
    let topic = super::unique(prefix);
    let dir = std::env::temp_dir().join(&topic);
    std::fs::create_dir_all(&dir).unwrap();
    (topic, dir)
}

/// Create `topics` (name, partitions), replication 1; panics if the broker refuses one (a
/// name already taken, too).
pub fn create_topics(bootstrap: &str, topics: &[(&str, i32)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
    let topics: Vec<_> = topics.iter().map(|(name, p)| NewTopic::new(name, *p, TopicReplication::Fixed(1))).collect();
    for r in block_on(admin.create_topics(&topics, &AdminOptions::new())).unwrap() {
        r.unwrap();
    }
}

/// Write events `0..n` to `topic` with an idempotent producer: `event(seq)` gives the event
/// and its partition (`None`: the producer's partitioner hashes the key). The record's key is
/// the event's key (little endian), its value the event as JSON (`weir::io::kafka::Json`).
pub fn produce_events(bootstrap: &str, topic: &str, n: u64, event: impl Fn(u64) -> (Option<i32>, Event)) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("enable.idempotence", "true").create().unwrap();
    for seq in 0..n {
        let (partition, e) = event(seq);
        let payload = serde_json::to_vec(&e).unwrap();
        let key = e.key.to_le_bytes();
        let mut record = BaseRecord::to(topic).key(&key[..]).payload(&payload[..]);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        let mut record = Some(record);
        while let Some(r) = record.take() {
            if let Err((_, r)) = producer.send(r) {
                // The producer's queue is full: serve delivery reports, then try again.
                producer.poll(Duration::from_millis(5));
                record = Some(r);
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

/// Every payload of `topic` (all `partitions`) from the start up to the end, read with
/// `isolation` (`read_committed` or `read_uncommitted`).
pub fn read_payloads(bootstrap: &str, topic: &str, partitions: i32, isolation: &str) -> Vec<Vec<u8>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "weir-test-reader")
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut payloads = Vec::new();
    let mut ended = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ended.len() < partitions as usize {
        assert!(Instant::now() < deadline, "watchdog: reading {topic} back took over 60 s");
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => payloads.push(m.payload().unwrap_or_default().to_vec()),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic} back: {e}"),
            None => {}
        }
    }
    payloads
}

/// Wait for an rdkafka admin future without an async runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(Instant::now() < deadline, "watchdog: an admin request took over 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}
