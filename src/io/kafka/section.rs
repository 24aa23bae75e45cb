//! Kafka nodes' job-file sections (`type = "kafka"`, as a source and as a sink): every key
//! they take, checked where it is. librdkafka properties pass through unchanged.

use super::{DeadLetter, Delivery, KafkaSinkConfig, KafkaSourceConfig, OnBadRecord, StartFrom};
use crate::util::section::{Affects, JobFileError, Key, KeyType as T, REQUIRED, Section, UNSET};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The librdkafka properties of a Kafka node (numbers and booleans written as TOML values
/// become their text).
fn properties(s: &mut Section) -> Result<Vec<(String, String)>, JobFileError> {
    let Some(p) = s.take::<BTreeMap<String, toml::Value>>("properties")? else { return Ok(Vec::new()) };
    Ok(p.into_inner().into_iter().map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), str::to_owned))).collect())
}

/// `properties`: librdkafka's properties, passed through.
const PROPERTIES_KEY: Key = Key::new(
    "properties",
    T::Table,
    "weir's bounded prefetch and queues",
    "librdkafka properties, unchanged (`\"security.protocol\" = \"SASL_SSL\"`, …); secrets stay out of logs. weir's defaults bound the client's memory, counted in the budget.",
)
.affects(Affects::Security);

const BOOTSTRAP_HINT: &str = "the brokers, e.g. bootstrap = \"127.0.0.1:9092\"";

impl KafkaSourceConfig {
    /// The keys of a Kafka source's section.
    pub const KEYS: &'static [Key] = &[
        Key::new("bootstrap", T::String, REQUIRED, "The brokers, `host:port[,host:port…]` (`bootstrap.servers`)."),
        Key::new("topic", T::String, REQUIRED, "The topic read; partition p goes to subtask p mod parallelism, assigned explicitly (no group membership to lose)."),
        PROPERTIES_KEY,
        Key::new("start", T::String, "earliest", "Where a partition without a checkpointed offset starts: `earliest`, `latest`, `committed` (the group's offset, else earliest) or `committed_or_latest`.")
            .affects(Affects::Delivery),
        Key::new("bounded", T::Boolean, "false", "Stop at the end offsets seen at start (the job then ends)."),
        Key::new("on_bad_record", T::String, "dead_letter with a dead letter, else fail", "A record that does not decode or is too large: `dead_letter` (written with the reason, counted), `skip` (counted) or `fail` the job.")
            .affects(Affects::Failures),
        Key::new("dead_letter", T::String, UNSET, "A file (JSON lines) for bad records, with topic, partition, offset and the reason; durable before a checkpoint passes them.")
            .affects(Affects::Failures),
        Key::new("dead_letter_topic", T::String, UNSET, "A topic for bad records instead of a file (not both).").affects(Affects::Failures),
        Key::new("error_timeout_ms", T::Integer, "60000", "Client errors this long with no record read fail the job (exit 69: Kafka unavailable).")
            .affects(Affects::Failures),
        Key::new("lag_refresh_ms", T::Integer, "1000", "How often each subtask asks the brokers for its partitions' end offsets, so lag stays true while the job is backpressured (0: never)."),
    ];

    /// Read a Kafka source's section: JSON records with the fields of an event, from `topic`
    /// at `bootstrap`; `max_record_bytes` is the job's.
    pub fn from_section(s: &mut Section, max_record_bytes: usize) -> Result<KafkaSourceConfig, JobFileError> {
        let bootstrap = s.required::<String>("bootstrap", BOOTSTRAP_HINT)?;
        let topic = s.required::<String>("topic", "the topic to read")?;
        let mut config = KafkaSourceConfig::new(bootstrap.get_ref(), topic.get_ref());
        config.properties.extend(properties(s)?);
        config.max_record_bytes = max_record_bytes;
        config.bounded = s.take::<bool>("bounded")?.is_some_and(|b| b.into_inner());
        if let Some(t) = s.take::<u64>("error_timeout_ms")? {
            if *t.get_ref() == 0 {
                return Err(s.err(
                    t.span(),
                    "error_timeout_ms",
                    "a timeout of 0 fails at the first error; give it time",
                ));
            }
            config.error_timeout = Duration::from_millis(t.into_inner());
        }
        if let Some(ms) = s.take::<u64>("lag_refresh_ms")? {
            config.lag_refresh = (*ms.get_ref() > 0).then(|| Duration::from_millis(ms.into_inner()));
        }
        if let Some(v) = s.take::<String>("start")? {
            config.start = StartFrom::from_name(v.get_ref()).ok_or_else(|| {
                let message =
                    format!("unknown start `{}`; use earliest, latest, committed or committed_or_latest", v.get_ref());
                s.err(v.span(), "start", message)
            })?;
        }
        config.dead_letter = match (s.take::<String>("dead_letter")?, s.take::<String>("dead_letter_topic")?) {
            (Some(_), Some(t)) => {
                return Err(s.err(
                    t.span(),
                    "dead_letter_topic",
                    "give dead_letter (a file) or dead_letter_topic, not both",
                ));
            }
            (Some(f), None) => Some(DeadLetter::File(f.into_inner().into())),
            (None, Some(t)) => Some(DeadLetter::Topic(t.into_inner())),
            (None, None) => None,
        };
        config.on_bad_record = match s.take::<String>("on_bad_record")? {
            Some(v) => OnBadRecord::from_name(v.get_ref()).ok_or_else(|| {
                s.err(
                    v.span(),
                    "on_bad_record",
                    format!("unknown policy `{}`; use dead_letter, skip or fail", v.get_ref()),
                )
            })?,
            None if config.dead_letter.is_some() => OnBadRecord::DeadLetter,
            None => OnBadRecord::Fail,
        };
        config.validate().map_err(|e| s.err(s.kind_span(), "properties", e.to_string()))?;
        Ok(config)
    }
}

impl KafkaSinkConfig {
    /// The keys of a Kafka sink's section.
    pub const KEYS: &'static [Key] = &[
        Key::new("bootstrap", T::String, REQUIRED, "The brokers, `host:port[,host:port…]` (`bootstrap.servers`)."),
        Key::new("topic", T::String, REQUIRED, "The topic written."),
        PROPERTIES_KEY,
        Key::new("delivery", T::String, "at_least_once", "`at_least_once` (an idempotent producer: a replay writes again what followed the checkpoint) or `exactly_once` (a transaction per checkpoint, committed when it completes; needs `checkpoint_dir`).")
            .affects(Affects::Delivery),
        Key::new("transactional_id_prefix", T::String, "weir-<job>-<node>", "`exactly_once`: transactional ids are `<prefix>-<subtask>-<k>`; this sink's alone (another user of them would fence it).")
            .affects(Affects::Delivery),
    ];

    /// Read a Kafka sink's section: records as JSON into `topic` at `bootstrap`.
    /// `checkpoints` is the job's checkpoint directory and timeout, if it takes checkpoints
    /// (exactly-once needs them: a transaction per checkpoint, logged under the directory).
    pub fn from_section(
        s: &mut Section,
        checkpoints: Option<(&Path, Duration)>,
    ) -> Result<KafkaSinkConfig, JobFileError> {
        let bootstrap = s.required::<String>("bootstrap", BOOTSTRAP_HINT)?;
        let topic = s.required::<String>("topic", "the topic to write")?;
        let mut config = KafkaSinkConfig::new(bootstrap.get_ref(), topic.get_ref());
        config.properties.extend(properties(s)?);
        if let Some(p) = s.take::<String>("transactional_id_prefix")? {
            if p.get_ref().trim().is_empty() {
                let message = "an empty prefix; remove the setting for the default (weir-<job>-<node>)";
                return Err(s.err(p.span(), "transactional_id_prefix", message));
            }
            config.transactional_id_prefix = p.into_inner();
        }
        if let Some(v) = s.take::<String>("delivery")? {
            config.delivery = match v.get_ref().as_str() {
                "at_least_once" => Delivery::AtLeastOnce,
                "exactly_once" => Delivery::ExactlyOnce,
                other => {
                    let message = format!("unknown delivery `{other}`; use at_least_once or exactly_once");
                    return Err(s.err(v.span(), "delivery", message));
                }
            };
            if config.delivery == Delivery::ExactlyOnce {
                let Some((dir, timeout)) = checkpoints else {
                    return Err(s.err(
                        v.span(),
                        "delivery",
                        "exactly_once commits a transaction per checkpoint: set checkpoint_dir in [job]",
                    ));
                };
                config.checkpoint_timeout = timeout;
                config.transaction_log_dir = Some(dir.join("kafka-transactions"));
            }
        }
        config.validate().map_err(|e| s.err(s.kind_span(), "properties", e.to_string()))?;
        Ok(config)
    }
}

/// The keys a `key_by` takes to run through a repartition topic ([`super::repartition`]).
pub const REPARTITION_KEYS: &[Key] = &[
    Key::new("repartition", T::Boolean, "false", "Run the key_by's edge through the topic `<job>-<id>-repartition` (P partitions, written in the checkpoint's transaction): instances on several hosts then meet every key's records in one place.")
        .affects(Affects::Delivery),
    Key::new("bootstrap", T::String, "required with repartition", "The brokers of the repartition topic."),
    Key::new("properties", T::Table, UNSET, "librdkafka properties of the repartition topic's clients (TLS, SASL).").affects(Affects::Security),
];

/// A `key_by` through Kafka: how its writer and its reader reach the topic.
#[derive(Debug, Clone)]
pub struct RepartitionTopic {
    /// The upstream side: exactly once when the job checkpoints.
    pub sink: KafkaSinkConfig,
    /// The downstream side: `read_committed`, one partition per subtask.
    pub source: KafkaSourceConfig,
}

impl RepartitionTopic {
    /// Read a `key_by` section's `repartition`, `bootstrap` and `properties`: `None` unless
    /// `repartition = true`. The topic is `<job>-<node>-repartition`.
    pub fn from_section(
        s: &mut Section,
        job: &str,
        node: &str,
        checkpoints: Option<(&Path, Duration)>,
        max_record_bytes: usize,
    ) -> Result<Option<RepartitionTopic>, JobFileError> {
        let on = s.take::<bool>("repartition")?.is_some_and(|b| b.into_inner());
        if !on {
            for key in ["bootstrap", "properties"] {
                if let Some(span) = s.span_of(key) {
                    return Err(s.err(
                        span,
                        key,
                        "only a key_by with repartition = true reaches Kafka; add it, or remove this",
                    ));
                }
            }
            return Ok(None);
        }
        let bootstrap = s.required::<String>("bootstrap", BOOTSTRAP_HINT)?;
        let properties = properties(s)?;
        let topic = format!("{job}-{node}-repartition");
        let mut sink = KafkaSinkConfig::new(bootstrap.get_ref(), &topic);
        sink.properties.extend(properties.iter().cloned());
        if let Some((dir, timeout)) = checkpoints {
            sink.delivery = Delivery::ExactlyOnce;
            sink.checkpoint_timeout = timeout;
            sink.transaction_log_dir = Some(dir.join("kafka-transactions"));
        }
        let mut source = KafkaSourceConfig::new(bootstrap.get_ref(), &topic);
        source.properties.extend(properties);
        source.max_record_bytes = max_record_bytes;
        source.create_topic = true;
        sink.validate().map_err(|e| s.err(s.kind_span(), "properties", e.to_string()))?;
        source.validate().map_err(|e| s.err(s.kind_span(), "properties", e.to_string()))?;
        Ok(Some(RepartitionTopic { sink, source }))
    }
}
