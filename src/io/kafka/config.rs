//! Settings of the Kafka source and sink, and the memory bounds of the client they imply.
//!
//! librdkafka properties pass through unchanged (`properties`, a map of property name to
//! value, as in librdkafka's CONFIGURATION.md). weir sets a few defaults of its own where
//! librdkafka's would make the memory budget large (a 64 MiB consumer queue, 1 GiB producer
//! queue); a value the user gives always wins, and is checked against the budget.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::source::KafkaSourceStats;

/// Where a partition starts when there is no checkpointed offset for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartFrom {
    /// The partition's first offset (low watermark).
    #[default]
    Earliest,
    /// The partition's end (high watermark) at the time of assignment.
    Latest,
    /// The group's committed offset (`group.id`); `otherwise` when the group has none.
    Committed {
        /// Where to start when the group has no committed offset for the partition.
        otherwise: Reset,
    },
}

/// The fallback of [`StartFrom::Committed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reset {
    /// The first offset.
    #[default]
    Earliest,
    /// The end.
    Latest,
}

impl StartFrom {
    /// Parse a job-file name: `earliest`, `latest`, `committed` (else earliest),
    /// `committed_or_latest`.
    pub fn from_name(name: &str) -> Option<StartFrom> {
        Some(match name {
            "earliest" => StartFrom::Earliest,
            "latest" => StartFrom::Latest,
            "committed" | "committed_or_earliest" => StartFrom::Committed { otherwise: Reset::Earliest },
            "committed_or_latest" => StartFrom::Committed { otherwise: Reset::Latest },
            _ => return None,
        })
    }
}

/// What happens to a record that cannot be decoded, or is larger than the job's largest
/// record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBadRecord {
    /// Write it to the dead-letter destination with the reason, count it, go on. The source
    /// refuses to start without a destination.
    #[default]
    DeadLetter,
    /// Count it and go on.
    Skip,
    /// Fail the job, naming topic, partition, offset and reason.
    Fail,
}

impl OnBadRecord {
    /// Parse a job-file name: `dead_letter`, `skip`, `fail`.
    pub fn from_name(name: &str) -> Option<OnBadRecord> {
        Some(match name {
            "dead_letter" => OnBadRecord::DeadLetter,
            "skip" => OnBadRecord::Skip,
            "fail" => OnBadRecord::Fail,
            _ => return None,
        })
    }
}

/// Where bad records go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetter {
    /// One JSON line per record, appended: `{"topic","partition","offset","reason","key",
    /// "payload_bytes","payload"}` (key and payload as text, invalid UTF-8 replaced, the
    /// payload cut at 4 KiB: a file is for reading by people).
    File(PathBuf),
    /// The original key and payload, whole, to a Kafka topic, with headers `weir.topic`,
    /// `weir.partition`, `weir.offset`, `weir.reason`. Its producer uses the source's
    /// `bootstrap.servers`; deliveries are confirmed before each checkpoint's snapshot.
    Topic(String),
}

/// Settings of a Kafka source node (each subtask has its own client). Its `Debug` form
/// hides the values of secret properties ([`is_secret`](super::is_secret)).
#[derive(Clone)]
pub struct KafkaSourceConfig {
    /// The topic to read.
    pub topic: String,
    /// librdkafka properties, unchanged: `bootstrap.servers` at least. `group.id` is only
    /// used to commit offsets for lag monitoring (default `weir-<topic>`).
    pub properties: BTreeMap<String, String>,
    /// Where partitions without a checkpointed offset start.
    pub start: StartFrom,
    /// Records taken per poll at most (the runtime checks its mailbox between polls).
    pub batch_records: usize,
    /// How long the source waits when Kafka has nothing, before polling again.
    pub idle_wait: Duration,
    /// With per-partition watermarks ([`KafkaSource::with_event_time`](super::KafkaSource::with_event_time)):
    /// a partition with nothing left to read stops holding the watermark back after this
    /// long without a record.
    pub partition_idle: Duration,
    /// Stop at the end: each partition is read up to its high watermark at assignment, then
    /// the subtask finishes (a bounded replay; tests). `false`: read forever.
    pub bounded: bool,
    /// The job's largest record (encoded): a Kafka record whose payload, or decoded record,
    /// is larger is refused before the ring (never truncated). Use the job's
    /// `max_record_bytes`.
    pub max_record_bytes: usize,
    /// Brokers that may lead this source's partitions, at most (each can have one fetch
    /// response in flight to a client): a factor of the prefetch bound.
    pub brokers: u32,
    /// The most memory one subtask's client may prefetch; a configuration whose
    /// [`prefetch_budget_bytes`](KafkaSourceConfig::prefetch_budget_bytes) is larger is
    /// refused. `None`: not checked.
    pub prefetch_limit_bytes: Option<u64>,
    /// What to do with bad records.
    pub on_bad_record: OnBadRecord,
    /// Where bad records go under [`OnBadRecord::DeadLetter`].
    pub dead_letter: Option<DeadLetter>,
    /// How long metadata and offset look-ups at assignment may take.
    pub request_timeout: Duration,
    /// How long the client may report errors without delivering a record before the job
    /// fails with them (librdkafka retries a failing fetch for ever: a record over
    /// `receive.message.max.bytes`, a codec this build lacks, a broker that refuses us).
    pub error_timeout: Duration,
    /// How often each subtask asks the brokers for its partitions' high watermarks, so the
    /// published lag grows with what is produced even while the job backpressures the
    /// source (it then neither fetches nor publishes; see `lag.rs`): one ListOffsets
    /// request per owned partition, on a client of its own. `None`: only the source's own
    /// publishing, from librdkafka's cache. Not for bounded sources (their end is fixed).
    pub lag_refresh: Option<Duration>,
    /// A repartition topic ([`super::repartition`]): created at assignment if absent, with
    /// one partition per subtask of the source (and checked to have that many if present).
    pub create_topic: bool,
    /// Shared totals and per-partition positions of every subtask made from this configuration.
    pub stats: Arc<KafkaSourceStats>,
}

/// weir's defaults for the consumer's prefetch (librdkafka's allow about 64 MiB queued plus
/// 50 MiB fetch responses per broker connection, per subtask).
const SOURCE_DEFAULTS: &[(&str, &str)] = &[
    ("queued.max.messages.kbytes", "8192"),
    // queued.min.messages stays at librdkafka's 100000: the memory bound is the kbytes
    // above; a smaller count only makes the client stop fetching early (measured: 10000 made
    // the source read 5x slower than a bare consumer loop over 8 partitions; weir-bench kafka).
    ("fetch.max.bytes", "1048576"),
    ("fetch.message.max.bytes", "1048576"),
    ("receive.message.max.bytes", "1049088"),
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    ("enable.partition.eof", "false"),
    // A checkpointed offset that retention deleted must fail the job, not skip silently.
    ("auto.offset.reset", "error"),
];

/// A numeric librdkafka property of `props`, or `default` when it is absent or not a number.
fn number(props: &BTreeMap<String, String>, name: &str, default: u64) -> u64 {
    props.get(name).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(default)
}

impl KafkaSourceConfig {
    /// Read `topic` from the cluster at `bootstrap`: from the earliest offset, 500 records per
    /// poll, 16 KiB records at most, bad records fail the job (give a dead-letter destination
    /// to keep going), weir's prefetch defaults (8 MiB queue, 1 MiB fetches).
    pub fn new(bootstrap: &str, topic: &str) -> KafkaSourceConfig {
        let mut properties = BTreeMap::new();
        properties.insert("bootstrap.servers".to_owned(), bootstrap.to_owned());
        properties.insert("group.id".to_owned(), format!("weir-{topic}"));
        KafkaSourceConfig {
            topic: topic.to_owned(),
            properties,
            start: StartFrom::Earliest,
            batch_records: 500,
            idle_wait: Duration::from_millis(100),
            partition_idle: Duration::from_secs(1),
            bounded: false,
            max_record_bytes: 16 * 1024,
            brokers: 3,
            prefetch_limit_bytes: None,
            on_bad_record: OnBadRecord::Fail,
            dead_letter: None,
            request_timeout: Duration::from_secs(10),
            error_timeout: Duration::from_secs(60),
            lag_refresh: Some(Duration::from_secs(1)),
            create_topic: false,
            stats: Arc::default(),
        }
    }

    /// The per-partition lag of the sources made from this configuration (they share its
    /// stats), for [`crate::graph::JobConfig::lag_gauges`]: `job.configure(|c|
    /// c.lag_gauges.push(config.lag_gauge("clicks")))` shows it in `weir-stat`.
    pub fn lag_gauge(&self, node: &str) -> crate::telemetry::sources::LagGauge {
        let stats = self.stats.clone();
        crate::telemetry::sources::LagGauge {
            node: node.to_owned(),
            read: Arc::new(move |f: &mut dyn FnMut(i32, u64)| {
                for (p, s) in stats.partitions().iter().enumerate() {
                    let lag = s.lag.load(std::sync::atomic::Ordering::Relaxed);
                    if lag >= 0 {
                        f(p as i32, lag as u64);
                    }
                }
            }),
        }
    }

    /// Set a librdkafka property (builder style).
    pub fn set(mut self, name: &str, value: impl ToString) -> KafkaSourceConfig {
        self.properties.insert(name.to_owned(), value.to_string());
        self
    }

    /// The properties handed to librdkafka: weir's defaults, then the user's.
    pub fn client_properties(&self) -> BTreeMap<String, String> {
        let mut all: BTreeMap<String, String> =
            SOURCE_DEFAULTS.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        // A user who raises fetch.max.bytes without receive.message.max.bytes gets librdkafka's
        // own adjustment (fetch.max.bytes + 512), not our fixed default.
        if self.properties.contains_key("fetch.max.bytes") && !self.properties.contains_key("receive.message.max.bytes")
        {
            all.remove("receive.message.max.bytes");
        }
        all.extend(self.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }

    /// The most memory one subtask's client holds in prefetched data:
    ///
    /// `queued.max.messages.kbytes` × 1024 (the consumer queue: with `assign()` and one
    /// consumer queue it is a per-client bound, not per partition), plus, for each broker
    /// connection (`brokers`), one fetch response being received and its decompressed copy,
    /// each at most `receive.message.max.bytes` (librdkafka refuses larger responses; it sets
    /// it to `fetch.max.bytes` + 512 when not given). The queue bound may be overshot by one
    /// response, which the second term covers.
    pub fn prefetch_budget_bytes(&self) -> u64 {
        self.prefetch_parts().iter().map(|(_, bytes)| bytes).sum()
    }

    /// The terms of [`prefetch_budget_bytes`](KafkaSourceConfig::prefetch_budget_bytes), named.
    fn prefetch_parts(&self) -> Vec<(String, u64)> {
        let props = self.client_properties();
        let get = |name: &str, default: u64| number(&props, name, default);
        let queue = get("queued.max.messages.kbytes", 65536) * 1024;
        let fetch_max = get("fetch.max.bytes", 52_428_800);
        let response = get("receive.message.max.bytes", fetch_max + 512);
        vec![
            (format!("queued.max.messages.kbytes={}", queue / 1024), queue),
            (
                format!("{} brokers × 2 × receive.message.max.bytes={response}", self.brokers.max(1)),
                u64::from(self.brokers.max(1)) * 2 * response,
            ),
        ]
    }

    /// Check the settings without connecting: required properties, numbers, the prefetch bound
    /// against the limit, a dead-letter destination where the policy needs one.
    pub fn validate(&self) -> Result<(), KafkaConfigError> {
        if self.topic.is_empty() {
            return Err(KafkaConfigError::NoTopic);
        }
        if !self.properties.contains_key("bootstrap.servers") {
            return Err(KafkaConfigError::MissingProperty("bootstrap.servers"));
        }
        let props = self.client_properties();
        for name in ["queued.max.messages.kbytes", "fetch.max.bytes", "receive.message.max.bytes"] {
            if let Some(v) = props.get(name)
                && v.trim().parse::<u64>().is_err()
            {
                return Err(KafkaConfigError::Property {
                    property: name.to_owned(),
                    problem: format!("property {name}={v} is not a number"),
                });
            }
        }
        if self.batch_records == 0 {
            return Err(KafkaConfigError::Setting {
                setting: "batch_records",
                problem: "batch_records 0; a poll takes at least 1 record".into(),
            });
        }
        if let Some(limit) = self.prefetch_limit_bytes {
            let parts = self.prefetch_parts();
            let total: u64 = parts.iter().map(|(_, b)| b).sum();
            if total > limit {
                let (largest, _) = parts.iter().max_by_key(|(_, b)| *b).expect("two parts");
                return Err(KafkaConfigError::OverLimit {
                    bound_bytes: total,
                    limit_bytes: limit,
                    problem: format!(
                        "the client's prefetch bound is {total} bytes ({}), over the limit of {limit} bytes; \
                         lower {largest} (or raise the budget)",
                        parts.iter().map(|(n, b)| format!("{n} → {b}")).collect::<Vec<_>>().join(" + "),
                    ),
                });
            }
        }
        if self.on_bad_record == OnBadRecord::DeadLetter && self.dead_letter.is_none() {
            return Err(KafkaConfigError::Setting {
                setting: "dead_letter",
                problem: "on_bad_record is dead_letter but no dead-letter destination is given".into(),
            });
        }
        check_client_properties(&props)
    }
}

/// The SASL mechanisms this build of librdkafka speaks (GSSAPI only with `kafka-gssapi`).
const MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"];

/// What librdkafka would refuse, found without connecting: an unknown property (a typo), a
/// value it rejects, a SASL mechanism it does not speak. Secrets are never quoted.
fn check_client_properties(props: &BTreeMap<String, String>) -> Result<(), KafkaConfigError> {
    let mut client = rdkafka::ClientConfig::new();
    for (k, v) in props {
        client.set(k, v);
    }
    client.create_native_config().map_err(|e| KafkaConfigError::Refused(super::reach::client_error_text(&e)))?;
    for key in ["sasl.mechanism", "sasl.mechanisms"] {
        if let Some(m) = props.get(key)
            && !MECHANISMS.contains(&m.trim())
        {
            return Err(KafkaConfigError::Property {
                property: key.to_owned(),
                problem: format!(
                    "{key} `{m}` is not a SASL mechanism weir's librdkafka speaks; use {}",
                    MECHANISMS.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// Why a Kafka source's or sink's settings cannot work, found without connecting
/// ([`KafkaSourceConfig::validate`], [`KafkaSinkConfig::validate`]). Secrets are never quoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaConfigError {
    /// The topic is empty.
    #[error("no topic")]
    NoTopic,
    /// A librdkafka property that must be given is not.
    #[error("the property {0} is missing")]
    MissingProperty(&'static str),
    /// A librdkafka property with a value weir cannot use.
    #[error("{problem}")]
    Property {
        /// The property (`transaction.timeout.ms`, `sasl.mechanism`, ...).
        property: String,
        /// What is wrong, and what to do.
        problem: String,
    },
    /// A memory bound of the client (the consumer's prefetch, the producer's queue) over the
    /// limit it was given.
    #[error("{problem}")]
    OverLimit {
        /// The bound the properties give, in bytes.
        bound_bytes: u64,
        /// The limit, in bytes.
        limit_bytes: u64,
        /// The parts of the bound, and which property to lower.
        problem: String,
    },
    /// A setting of weir's own (not a librdkafka property) that cannot work.
    #[error("{problem}")]
    Setting {
        /// The setting (`batch_records`, `dead_letter`, `transaction_log_dir`).
        setting: &'static str,
        /// What is wrong, and what to do.
        problem: String,
    },
    /// librdkafka refuses a property: an unknown one (a typo), or a value it rejects.
    #[error("librdkafka refuses a property: {0}")]
    Refused(String),
}

impl From<KafkaConfigError> for super::error::Problem {
    fn from(e: KafkaConfigError) -> super::error::Problem {
        super::error::Problem::from(e.to_string())
    }
}

/// How the sink makes records visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// Idempotent producer: every record written at least once (a replay after a restart
    /// writes again what was written after the checkpoint).
    #[default]
    AtLeastOnce,
    /// Kafka transactions committed when a checkpoint completes: readers with
    /// `isolation.level=read_committed` see every record exactly once. See the sink's docs
    /// for the window a crash can leave, and what recovery does with it.
    ExactlyOnce,
}

/// Settings of a Kafka sink node (each subtask has its own producers). Its `Debug` form hides
/// the values of secret properties ([`is_secret`](super::is_secret)).
#[derive(Clone)]
pub struct KafkaSinkConfig {
    /// The topic to write.
    pub topic: String,
    /// librdkafka properties, unchanged: `bootstrap.servers` at least.
    pub properties: BTreeMap<String, String>,
    /// At-least-once or exactly-once.
    pub delivery: Delivery,
    /// Exactly-once: transactional ids are `<prefix>-<subtask>-<k>` and the commit markers'
    /// group `weir-txn-<prefix>-<subtask>`; must be unique to this sink node among everything
    /// that writes to the cluster, and stable across restarts. Empty (the default): `weir-`,
    /// the job's name, `-`, the node's id, so two jobs or two sink nodes writing exactly-once
    /// to one topic never fence each other or read each other's markers.
    pub transactional_id_prefix: String,
    /// Exactly-once: producers per subtask, each with one open or prepared transaction at a
    /// time (2 to 8). Two suffice while each checkpoint's commit reaches the sink before the
    /// next barrier; a third covers a commit that arrives just after it.
    pub transactional_producers: usize,
    /// Exactly-once: the job's checkpoint timeout. The sink refuses to start when
    /// `transaction.timeout.ms` is shorter: the broker would abort a transaction the
    /// checkpoint may still complete.
    pub checkpoint_timeout: Duration,
    /// How long a flush (at the end) or a transaction call may take.
    pub flush_timeout: Duration,
    /// How long a checkpoint's pre-commit waits for the broker to acknowledge the records
    /// before the barrier. Past it the checkpoint is declined at once, naming the broker (the
    /// transaction stays open and the next checkpoint takes its records), instead of holding the
    /// barrier for `flush_timeout`. Outside a job (no coordinator to decline to) the pre-commit
    /// waits up to `flush_timeout` as before.
    pub prepare_timeout: Duration,
    /// Exactly-once: where each transaction's records are also logged until its commit is
    /// confirmed, so that a recovery can write again a transaction the crash left uncommitted
    /// (see the sink's module docs). Required for exactly-once; job files put it under the
    /// checkpoint directory.
    pub transaction_log_dir: Option<std::path::PathBuf>,
    /// The most memory one subtask's producers may queue; a configuration whose
    /// [`queue_budget_bytes`](KafkaSinkConfig::queue_budget_bytes) is larger is refused.
    pub queue_limit_bytes: Option<u64>,
    /// Shared totals of every subtask made from this configuration.
    pub stats: Arc<super::sink::KafkaSinkStats>,
}

/// weir's defaults for the producer queue (librdkafka's allow 1 GiB).
const SINK_DEFAULTS: &[(&str, &str)] = &[
    ("queue.buffering.max.kbytes", "16384"),
    ("queue.buffering.max.messages", "50000"),
    ("linger.ms", "5"),
    ("enable.idempotence", "true"),
];

/// librdkafka's fixed cost per queued message, roughly (`rd_kafka_msg_t` and its payload
/// copy's allocation header); used for the queue bound.
const PER_MESSAGE_OVERHEAD_BYTES: u64 = 256;

impl KafkaSinkConfig {
    /// Write to `topic` on the cluster at `bootstrap`, at least once (idempotent producer),
    /// weir's queue defaults (16 MiB, 50 000 messages).
    pub fn new(bootstrap: &str, topic: &str) -> KafkaSinkConfig {
        let mut properties = BTreeMap::new();
        properties.insert("bootstrap.servers".to_owned(), bootstrap.to_owned());
        KafkaSinkConfig {
            topic: topic.to_owned(),
            properties,
            delivery: Delivery::AtLeastOnce,
            transactional_id_prefix: String::new(),
            transactional_producers: 3,
            checkpoint_timeout: Duration::from_secs(60),
            flush_timeout: Duration::from_secs(60),
            prepare_timeout: Duration::from_secs(5),
            transaction_log_dir: None,
            queue_limit_bytes: None,
            stats: Arc::default(),
        }
    }

    /// Set a librdkafka property (builder style).
    pub fn set(mut self, name: &str, value: impl ToString) -> KafkaSinkConfig {
        self.properties.insert(name.to_owned(), value.to_string());
        self
    }

    /// The properties handed to librdkafka: weir's defaults, then the user's.
    pub fn client_properties(&self) -> BTreeMap<String, String> {
        let mut all: BTreeMap<String, String> =
            SINK_DEFAULTS.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        if self.delivery == Delivery::ExactlyOnce && !self.properties.contains_key("transaction.timeout.ms") {
            // At least the checkpoint timeout, plus room for the commit itself.
            let ms = (self.checkpoint_timeout + Duration::from_secs(60)).as_millis().max(60_000);
            all.insert("transaction.timeout.ms".into(), ms.to_string());
        }
        all.extend(self.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }

    /// Producers one subtask has at once: 1, or `transactional_producers` for exactly-once.
    pub fn producers(&self) -> usize {
        match self.delivery {
            Delivery::AtLeastOnce => 1,
            Delivery::ExactlyOnce => self.transactional_producers.clamp(2, 8),
        }
    }

    /// The most memory one subtask's producers hold in queued (unacknowledged) records:
    /// per producer `queue.buffering.max.kbytes` × 1024 plus
    /// `queue.buffering.max.messages` × a per-message overhead (a message stays counted
    /// until its delivery report, so in-flight requests are inside this bound).
    pub fn queue_budget_bytes(&self) -> u64 {
        let props = self.client_properties();
        let get = |name: &str, default: u64| number(&props, name, default);
        let per = get("queue.buffering.max.kbytes", 1_048_576) * 1024
            + get("queue.buffering.max.messages", 100_000) * PER_MESSAGE_OVERHEAD_BYTES;
        per * self.producers() as u64
    }

    /// What the sinks made from this configuration publish, for
    /// [`JobConfig::sink_gauges`](crate::graph::JobConfig::sink_gauges): in flight are the
    /// records sent and not yet reported delivered.
    pub fn sink_gauge(&self, node: &str) -> crate::telemetry::sinks::SinkGauge {
        let stats = self.stats.clone();
        crate::telemetry::sinks::SinkGauge {
            node: node.to_owned(),
            read: Arc::new(move || {
                let records = stats.records.load(std::sync::atomic::Ordering::Relaxed);
                let acked = stats.delivered.load(std::sync::atomic::Ordering::Relaxed);
                crate::telemetry::sinks::SinkReading {
                    records,
                    acked,
                    in_flight: records.saturating_sub(acked),
                    retries: 0,
                    dead_letters: 0,
                    blocked_ns: stats.blocked.total_ns(),
                    latency: stats.ack_latency.summary(),
                }
            }),
        }
    }

    /// Check the settings without connecting.
    pub fn validate(&self) -> Result<(), KafkaConfigError> {
        if self.topic.is_empty() {
            return Err(KafkaConfigError::NoTopic);
        }
        if !self.properties.contains_key("bootstrap.servers") {
            return Err(KafkaConfigError::MissingProperty("bootstrap.servers"));
        }
        let props = self.client_properties();
        if props.get("enable.idempotence").map(String::as_str) != Some("true") {
            return Err(KafkaConfigError::Property {
                property: "enable.idempotence".into(),
                problem: "enable.idempotence must stay true: without it a retried send can duplicate or reorder \
                          records"
                    .into(),
            });
        }
        if let Some(limit) = self.queue_limit_bytes {
            let bound = self.queue_budget_bytes();
            if bound > limit {
                return Err(KafkaConfigError::OverLimit {
                    bound_bytes: bound,
                    limit_bytes: limit,
                    problem: format!(
                        "the producer queue bound is {bound} bytes ({} producer(s) × (queue.buffering.max.kbytes={} \
                         KiB + queue.buffering.max.messages={} × {PER_MESSAGE_OVERHEAD_BYTES} B)), over the limit \
                         of {limit} bytes; lower queue.buffering.max.kbytes",
                        self.producers(),
                        props.get("queue.buffering.max.kbytes").map_or("1048576", String::as_str),
                        props.get("queue.buffering.max.messages").map_or("100000", String::as_str),
                    ),
                });
            }
        }
        if self.delivery == Delivery::ExactlyOnce {
            let timeout_ms: u64 =
                props.get("transaction.timeout.ms").and_then(|v| v.trim().parse().ok()).ok_or_else(|| {
                    KafkaConfigError::Property {
                        property: "transaction.timeout.ms".into(),
                        problem: "transaction.timeout.ms is not a number".into(),
                    }
                })?;
            let checkpoint_ms = self.checkpoint_timeout.as_millis() as u64;
            if timeout_ms < checkpoint_ms {
                return Err(KafkaConfigError::Property {
                    property: "transaction.timeout.ms".into(),
                    problem: format!(
                        "transaction.timeout.ms={timeout_ms} is below the checkpoint timeout of {checkpoint_ms} ms: \
                         the broker could abort a transaction whose checkpoint then completes, losing its records; \
                         raise transaction.timeout.ms (the broker's transaction.max.timeout.ms caps it)"
                    ),
                });
            }
            if self.transaction_log_dir.is_none() {
                return Err(KafkaConfigError::Setting {
                    setting: "transaction_log_dir",
                    problem: "exactly-once needs a transaction_log_dir: each transaction's records are logged there \
                              until its commit is confirmed, so that a crash between a checkpoint and its commit \
                              loses nothing (librdkafka cannot resume the transaction); put it on the disk of the \
                              checkpoints"
                        .into(),
                });
            }
            if props.contains_key("transactional.id") {
                return Err(KafkaConfigError::Property {
                    property: "transactional.id".into(),
                    problem: "do not set transactional.id: the sink derives one per producer from \
                              transactional_id_prefix"
                        .into(),
                });
            }
        }
        check_client_properties(&props)
    }
}

/// librdkafka properties for `Debug`: secrets' values replaced.
struct Redacted<'a>(&'a BTreeMap<String, String>);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, if super::is_secret(k) { "<redacted>" } else { v.as_str() })))
            .finish()
    }
}

impl std::fmt::Debug for KafkaSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSourceConfig")
            .field("topic", &self.topic)
            .field("properties", &Redacted(&self.properties))
            .field("start", &self.start)
            .field("bounded", &self.bounded)
            .field("on_bad_record", &self.on_bad_record)
            .field("dead_letter", &self.dead_letter)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for KafkaSinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSinkConfig")
            .field("topic", &self.topic)
            .field("properties", &Redacted(&self.properties))
            .field("delivery", &self.delivery)
            .field("transactional_id_prefix", &self.transactional_id_prefix)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    /// A secret set on a source or sink never shows in its `Debug` form.
    #[test]
    fn debug_hides_secrets() {
        let source = KafkaSourceConfig::new("b:9093", "t").set("sasl.password", "hunter2").set("sasl.username", "u");
        let sink = KafkaSinkConfig::new("b:9093", "t").set("ssl.key.password", "hunter2");
        for text in [format!("{source:?}"), format!("{sink:?}")] {
            assert!(!text.contains("hunter2") && text.contains("<redacted>"), "{text}");
        }
        assert!(format!("{source:?}").contains("\"u\""));
    }
}
