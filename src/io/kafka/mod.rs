//! Kafka through librdkafka (the `rdkafka` crate): a source that reads a topic into a job, and
//! a sink that writes one, at least once or exactly once.
//!
//! # Source: explicit assignment, no consumer group
//!
//! Partition `p` of the topic belongs to source subtask `p % parallelism`; each subtask's
//! `BaseConsumer` is given its partitions with `assign()`, at explicit offsets: those of the
//! checkpoint being restored, else the configured start (earliest, latest, or the group's
//! committed offsets) resolved to numbers at assignment, so a checkpoint taken before the first
//! record still names a real offset. The checkpoint is the truth; `group.id` only receives
//! the offsets of completed checkpoints (`commit`, async) so that the usual tools show lag.
//!
//! Because the source never joins the group (`subscribe()`), there is no group membership to
//! lose: `max.poll.interval.ms` and `session.timeout.ms` police group members, and an
//! assigned consumer is none. A source that stops polling for minutes — the whole job
//! backpressured by a slow sink — is not evicted, no rebalance moves its partitions, and when
//! credit returns it goes on at the next offset. (`tests/kafka_source.rs` stalls a source
//! far longer than a tiny `max.poll.interval.ms` and checks that nothing is lost.)
//!
//! # Backpressure and the prefetch bound
//!
//! The source takes records from the client's queue only inside `poll`, and hands each to
//! `out.collect`, which blocks while the ring has no credit. So while the job is
//! backpressured the source holds at most the record in hand; unread records stay in Kafka.
//! librdkafka prefetches on its own threads, up to a bound set by configuration:
//! [`KafkaSourceConfig::prefetch_budget_bytes`] = `queued.max.messages.kbytes` (per client:
//! with `assign()` every partition feeds the one consumer queue) plus, per broker connection,
//! one fetch response of at most `receive.message.max.bytes` and its decompressed copy. weir's
//! defaults make that 8 MiB + 3 × 2 × 1 MiB per subtask; a configuration whose bound exceeds
//! [`KafkaSourceConfig::prefetch_limit_bytes`] is refused, naming the property.
//!
//! # Waiting without spinning
//!
//! When the queue is empty, `poll` says `Idle`, and the source's `wait` sleeps in one io_uring
//! on the consumer queue's IO event (an eventfd librdkafka writes when the queue becomes
//! non-empty), the subtask's mailbox futex word (`IORING_OP_FUTEX_WAIT`) and a timeout. A
//! quiet topic costs no CPU, and a new record or a stop wakes the source at once. See
//! `native.rs` for the protocol of the event fd.
//!
//! # Bad records
//!
//! A payload that does not decode, or is larger than the job's largest record (checked on the
//! payload and on the decoded record, before the ring: never truncated), is counted and then
//! written to a dead-letter file or topic with topic, partition, offset and the reason, or
//! skipped, or fails the job, per [`OnBadRecord`]. Dead letters are made durable before a
//! checkpoint's snapshot, so a checkpoint never moves past a bad record whose dead letter
//! could be lost.
//!
//! # Sink
//!
//! See [`sink`](KafkaSink) for the producer's bounded queue (backpressure), idempotence, and
//! exactly-once through transactions, including what librdkafka cannot do on recovery.
//!
//! # Security and codecs
//!
//! librdkafka is built with OpenSSL: `security.protocol` = `SSL`, `SASL_SSL` or
//! `SASL_PLAINTEXT`, with `sasl.mechanism` PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER
//! (GSSAPI with the `kafka-gssapi` feature), and every codec a producer may use (gzip, snappy,
//! lz4, zstd; the sink's `compression.type`). Properties pass through from the job file;
//! secrets come from `${VAR}` or `${file:PATH}` and are never printed ([`is_secret`]). A client
//! that cannot connect fails the job at start with the cause — credentials refused, a
//! certificate not trusted or naming another host, TLS to a plaintext port or the reverse —
//! instead of retrying silently (`reach.rs`).

mod config;
mod decode;
mod error;
mod lag;
mod native;
mod reach;
pub mod repartition;
mod section;
mod sink;
mod source;
mod txnlog;
mod watermarks;

pub use config::{
    DeadLetter, Delivery, KafkaConfigError, KafkaSinkConfig, KafkaSourceConfig, OnBadRecord, Reset, StartFrom,
};
pub use decode::{Decode, Encode, Fixed, FixedEncode, FormatError, Json, JsonEncode, RawBytes, RawEncode};
pub use error::{KafkaConnectorError, KafkaErrorKind, KafkaRole};
pub(crate) use native::group_generation;
pub use reach::is_secret;
pub use section::{REPARTITION_KEYS, RepartitionTopic};
pub use sink::{KafkaSink, KafkaSinkStats};
pub use source::{DEFAULT_TRACKED_PARTITIONS, KafkaSource, KafkaSourceStats, PartitionStats};

use error::Problem;
use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::ProducerContext;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A Kafka error as text, with librdkafka's description of the code.
pub(crate) fn kafka_error_text(e: &KafkaError) -> String {
    match e.rdkafka_error_code() {
        // The code's Debug form is its symbolic name (`QueueFull`, `MsgSizeTooLarge`), the
        // one librdkafka's documentation and issues use: searchable, like an errno's name.
        Some(code) => format!("{e} ({code:?})"),
        None => e.to_string(),
    }
}

/// A broker connection that failed, as librdkafka's log says it (facility `FAIL`, from the
/// client's own threads, whether or not anyone polls): the broker's name, the address to try
/// for its coming back (the one it failed to connect to, else its name's), and the message
/// without its thread prefix. `None` for other lines.
///
/// `[thrd:localhost:9092/bootstrap]: localhost:9092/bootstrap: Connect to ipv4#127.0.0.1:9092
/// failed: Connection refused (after 0ms in state CONNECT)`
pub(crate) fn failed_broker(facility: &str, message: &str) -> Option<(String, Option<std::net::SocketAddr>, String)> {
    if facility != "FAIL" {
        return None;
    }
    let message = match message.strip_prefix("[thrd:") {
        Some(rest) => rest.split_once("]: ").map_or(message, |(_, m)| m),
        None => message,
    };
    let (broker, _) = message.split_once(": ")?;
    let tried = ["ipv4#", "ipv6#"].iter().find_map(|p| {
        let at = message.find(p)? + p.len();
        message[at..].split_whitespace().next()?.parse().ok()
    });
    // A name that is an address as written; no lookup here (this is librdkafka's thread).
    let named = || broker.split('/').next()?.parse().ok();
    Some((broker.to_owned(), tried.or_else(named), message.to_owned()))
}

/// Let the client's log callback have INFO lines: librdkafka logs a broker connection lost
/// while in use at INFO (`FAIL`), and that is how an outage is seen while nothing polls
/// ([`failed_broker`]). Debug stays as configured.
pub(crate) fn hear_broker_failures(client: &mut rdkafka::ClientConfig) {
    use rdkafka::config::RDKafkaLogLevel;
    if (client.log_level as i32) < RDKafkaLogLevel::Info as i32 {
        client.set_log_level(RDKafkaLogLevel::Info);
    }
}

/// A producer's delivery reports: the first failure (which fails the job), the count of
/// records delivered, and where the last one landed (partition, offset).
#[derive(Debug, Clone, Default)]
pub(crate) struct Deliveries {
    inner: Arc<DeliveryState>,
}

#[derive(Debug, Default)]
struct DeliveryState {
    /// What the client's error callback said (TLS, SASL, transport).
    connection: reach::Connection,
    first_error: Mutex<Option<String>>,
    /// The last error the client's callback reported (a broker down, a timeout), to name in
    /// a wait that lasts.
    last_error: Mutex<Option<String>>,
    delivered: AtomicU64,
    last: Mutex<Option<(i32, i64)>>,
    /// Where delivery latency (the record's create time to its report) goes, if anywhere.
    latency: Option<Arc<crate::telemetry::sinks::AckLatency>>,
    /// A broker the client cannot reach, logged while it lasts and when it ends.
    outage: crate::telemetry::waiting::Outage,
}

impl Deliveries {
    /// Delivery reports that also record each record's delivery latency into `latency`.
    pub(crate) fn with_latency(latency: Arc<crate::telemetry::sinks::AckLatency>) -> Deliveries {
        Deliveries { inner: Arc::new(DeliveryState { latency: Some(latency), ..DeliveryState::default() }) }
    }

    /// The first delivery failure, as an error.
    pub(crate) fn check(&self) -> Result<(), Problem> {
        match &*self.inner.first_error.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(Problem::from(e.clone())),
            None => Ok(()),
        }
    }

    /// Records delivered so far.
    pub(crate) fn delivered(&self) -> u64 {
        self.inner.delivered.load(Ordering::Relaxed)
    }

    /// What the producer's error callback said.
    pub(crate) fn connection(&self) -> &reach::Connection {
        &self.inner.connection
    }

    /// The last error the client's callback reported, if any.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.inner.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Take where the last record delivered since the previous call landed.
    pub(crate) fn take_last(&self) -> Option<(i32, i64)> {
        self.inner.last.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl ClientContext for Deliveries {
    fn error(&self, error: KafkaError, reason: &str) {
        self.inner.connection.record(&error, reason);
        *self.inner.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(format!("{}: {reason}", kafka_error_text(&error)));
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        self.inner.connection.record_log(facility, message);
        if let Some((broker, addr, text)) = failed_broker(facility, message) {
            let what = format!("kafka sink: broker {broker} unreachable: {}", self.inner.connection.redact(&text));
            match addr {
                Some(addr) => self.inner.outage.down_at(what, addr),
                None => self.inner.outage.down(what),
            }
        }
        tracing::debug!(target: "weir::kafka", "librdkafka {level:?} {facility}: {message}");
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                self.inner.delivered.fetch_add(1, Ordering::Relaxed);
                self.inner.outage.up();
                if let (Some(latency), Some(created)) = (&self.inner.latency, m.timestamp().to_millis()) {
                    let now = crate::time::now_ns() / 1_000_000;
                    latency.record(std::time::Duration::from_millis(now.saturating_sub(created as u64)));
                }
                *self.inner.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((m.partition(), m.offset()));
            }
            Err((e, m)) => {
                let mut first = self.inner.first_error.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(|| {
                    format!("delivery to {} partition {} failed: {}", m.topic(), m.partition(), kafka_error_text(e))
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::failed_broker;

    /// librdkafka's FAIL lines name the broker and the address it could not reach; other
    /// lines are not outages.
    #[test]
    fn a_failed_broker_is_read_from_the_log() {
        let line = "[thrd:localhost:9092/bootstrap]: localhost:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 \
                    failed: Connection refused (after 0ms in state CONNECT)";
        let (broker, addr, text) = failed_broker("FAIL", line).expect("a failed broker");
        assert_eq!(broker, "localhost:9092/bootstrap");
        assert_eq!(addr, Some("127.0.0.1:9092".parse().unwrap()));
        assert!(text.starts_with("localhost:9092/bootstrap: Connect to"), "{text}");
        let line = "[thrd:127.0.0.1:39093/1]: 127.0.0.1:39093/1: Disconnected (after 1234ms in state UP)";
        let (_, addr, _) = failed_broker("FAIL", line).unwrap();
        assert_eq!(addr, Some("127.0.0.1:39093".parse().unwrap()));
        let line = "[thrd:kafka-0.internal:9092/0]: kafka-0.internal:9092/0: Disconnected";
        assert_eq!(failed_broker("FAIL", line).unwrap().1, None, "no lookup of a name");
        assert!(failed_broker("CONNECT", line).is_none());
    }
}
