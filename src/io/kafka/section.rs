//! Kafka nodes' job-file sections (`type = "kafka"`, as a source and as a sink): every key
//! they take, checked where it is. librdkafka properties pass through unchanged.

use super::{DeadLetter, Delivery, KafkaSinkConfig, KafkaSourceConfig, OnBadRecord, StartFrom};
use crate::util::section::{JobFileError, Section};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The librdkafka properties of a Kafka node (numbers and booleans written as TOML values
/// become their text).
fn properties(s: &mut Section) -> Result<Vec<(String, String)>, JobFileError> {
    let Some(p) = s.take::<BTreeMap<String, toml::Value>>("properties")? else { return Ok(Vec::new()) };
    Ok(p.into_inner().into_iter().map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), str::to_owned))).collect())
}

const BOOTSTRAP_HINT: &str = "the brokers, e.g. bootstrap = \"127.0.0.1:9092\"";

impl KafkaSourceConfig {
    /// The keys of a Kafka source's section.
    pub const KEYS: &'static [&'static str] = &[
        "bootstrap",
        "topic",
        "properties",
        "start",
        "bounded",
        "on_bad_record",
        "dead_letter",
        "dead_letter_topic",
        "error_timeout_ms",
        "lag_refresh_ms",
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
        config.validate().map_err(|e| s.err(s.kind_span(), "properties", e))?;
        Ok(config)
    }
}

impl KafkaSinkConfig {
    /// The keys of a Kafka sink's section.
    pub const KEYS: &'static [&'static str] =
        &["bootstrap", "topic", "properties", "delivery", "transactional_id_prefix"];

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
        config.validate().map_err(|e| s.err(s.kind_span(), "properties", e))?;
        Ok(config)
    }
}

/// The keys a `key_by` takes to run through a repartition topic ([`super::repartition`]).
pub const REPARTITION_KEYS: &[&str] = &["repartition", "bootstrap", "properties"];

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
        sink.validate().map_err(|e| s.err(s.kind_span(), "properties", e))?;
        source.validate().map_err(|e| s.err(s.kind_span(), "properties", e))?;
        Ok(Some(RepartitionTopic { sink, source }))
    }
}
