//! Reading a topic back, and waiting for rdkafka's admin calls, in the Kafka tests.
#![allow(dead_code)]

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

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
