//! Sinks, and the connectors' settings: file, TCP, HTTP and Kafka nodes.

use super::*;

#[allow(clippy::too_many_arguments)] // the node's context, as the other builders take it
pub(super) fn sink_node<T: Record + std::fmt::Display + serde::Serialize>(
    loc: &Loc,
    job: &Job,
    d: &Decl,
    id: &str,
    kind: &str,
    parallelism: Option<u32>,
    tallies: &mut Vec<(String, Arc<Tally>)>,
    record_keys: Option<crate::io::RecordKeyFn<T>>,
    attach: impl FnOnce(&str, u32, SinkMaker<T>),
) -> Result<(), JobFileError>
where
    CountingSink: Sink<T>,
{
    let delay = d.node.delay_us.map(Duration::from_micros);
    let maker: SinkMaker<T> = match kind {
        "count" => {
            let tally = Arc::new(Tally::default());
            tallies.push((id.to_owned(), tally.clone()));
            Arc::new(move |_| {
                let s = CountingSink::new(tally.clone());
                Box::new(match delay {
                    Some(d) => s.with_delay(d),
                    None => s,
                })
            })
        }
        "null" => Arc::new(|_| Box::new(NullSink)),
        "stdout" => Arc::new(|_| Box::new(StdoutSink)),
        "file" => {
            let config = file_sink_config(loc, d)?;
            Arc::new(move |info| Box::new(FileSink::new(config.clone(), info)))
        }
        "tcp" => {
            let config = tcp_sink_config(loc, d)?;
            Arc::new(move |info| Box::new(TcpSink::new(config.clone(), info)))
        }
        "http" => {
            let config = http_sink_config(loc, d, &job.config().name)?;
            let gauge = config.sink_gauge(id);
            job.configure(|c| c.sink_gauges.push(gauge));
            Arc::new(move |info| {
                let sink = HttpSink::new(config.clone(), info);
                Box::new(match record_keys.clone() {
                    Some(keys) => sink.with_record_keys(move |r: &T, identity: &mut String| keys(r, identity)),
                    None => sink,
                })
            })
        }
        "kafka" => {
            let config = kafka_sink_config(loc, d, job)?;
            let gauge = config.sink_gauge(id);
            job.configure(|c| c.sink_gauges.push(gauge));
            let p = parallelism.unwrap_or(1) as u64;
            // Per subtask, all its producers (one, or the transactional pool).
            let queue = config.queue_budget_bytes();
            job.configure(|c| {
                c.connector_memory
                    .push((format!("kafka sink {id} queues ({p} x {})", crate::telemetry::bytes(queue)), p * queue))
            });
            Arc::new(move |info| {
                Box::new(crate::io::kafka::KafkaSink::new(
                    config.clone(),
                    info,
                    crate::io::kafka::JsonEncode::<T>::default(),
                ))
            })
        }
        _ => {
            return Err(loc.err(
                Some(d.node.kind.span()),
                d.field("type"),
                format!("unknown sink type `{kind}`; use count, null, stdout, file, tcp, http or kafka"),
            ));
        }
    };
    attach(id, parallelism.unwrap_or(1), maker);
    Ok(())
}

/// An io-sink setting: its name, where it is in the file (if given), the sink types that take it.
type IoField = (&'static str, Option<std::ops::Range<usize>>, &'static [&'static str]);

/// The io-sink settings of a node.
pub(super) fn io_fields(n: &NodeSection) -> [IoField; 11] {
    fn at<T>(v: &Option<Spanned<T>>) -> Option<std::ops::Range<usize>> {
        v.as_ref().map(|v| v.span())
    }
    [
        ("path", at(&n.path), &["file"]),
        ("format", at(&n.format), &["file", "tcp"]),
        ("address", at(&n.address), &["tcp"]),
        ("max_in_flight_bytes", at(&n.max_in_flight_bytes), &["tcp"]),
        ("url", at(&n.url), &["http"]),
        ("max_in_flight", at(&n.max_in_flight), &["http"]),
        ("batch_records", at(&n.batch_records), &["http"]),
        ("body", at(&n.body), &["http"]),
        ("dead_letter", at(&n.dead_letter), &["http"]),
        ("max_retries", at(&n.max_retries), &["http"]),
        ("request_timeout_ms", at(&n.request_timeout_ms), &["http"]),
    ]
}

/// An io-sink setting on a node whose type does not take it is a mistake, not something
/// to ignore silently (a `url` on a file sink, say).
pub(super) fn check_io_fields(loc: &Loc, d: &Decl) -> Result<(), JobFileError> {
    let kind = d.node.kind.get_ref().as_str();
    let n = d.node;
    let kafka_source = d.section == "source" && kind == "kafka";
    let kafka_sink = d.section == "sink" && kind == "kafka";
    let kafka_fields = [
        ("bootstrap", n.bootstrap.as_ref().map(|v| v.span()), kafka_source || kafka_sink),
        ("topic", n.topic.as_ref().map(|v| v.span()), kafka_source || kafka_sink),
        ("properties", n.properties.as_ref().map(|v| v.span()), kafka_source || kafka_sink),
        ("start", n.start.as_ref().map(|v| v.span()), kafka_source),
        ("on_bad_record", n.on_bad_record.as_ref().map(|v| v.span()), kafka_source),
        ("dead_letter_topic", n.dead_letter_topic.as_ref().map(|v| v.span()), kafka_source),
        ("delivery", n.delivery.as_ref().map(|v| v.span()), kafka_sink),
        ("bounded", n.bounded.as_ref().map(|v| v.span()), kafka_source),
    ];
    for (name, span, ok) in kafka_fields {
        if let (Some(span), false) = (span, ok) {
            return Err(loc.err(
                Some(span),
                d.field(name),
                format!("`{name}` is not a setting of a {kind} {}; it belongs to Kafka nodes", d.section),
            ));
        }
    }
    for (name, span, types) in io_fields(d.node) {
        if let Some(span) = span
            && !(d.section == "sink" && types.contains(&kind))
            && !(kafka_source && name == "dead_letter")
        {
            return Err(loc.err(
                Some(span),
                d.field(name),
                format!(
                    "`{name}` is not a setting of a {kind} {}; it belongs to {} sinks",
                    d.section,
                    types.join(" and ")
                ),
            ));
        }
    }
    Ok(())
}

/// The librdkafka properties of a Kafka node, passed through unchanged (numbers and
/// booleans written as TOML values become their text).
pub(super) fn kafka_properties(d: &Decl) -> Vec<(String, String)> {
    d.node
        .properties
        .as_ref()
        .map(|p| {
            p.get_ref()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
                .collect()
        })
        .unwrap_or_default()
}

/// A `type = "kafka"` source: JSON records with the fields of an event (key, value, time_ns,
/// seq), read from `topic` at `bootstrap`.
pub(super) fn kafka_source_config(
    loc: &Loc,
    d: &Decl,
    job: &Job,
) -> Result<crate::io::kafka::KafkaSourceConfig, JobFileError> {
    use crate::io::kafka::{DeadLetter, KafkaSourceConfig, OnBadRecord, StartFrom};
    let n = d.node;
    let bootstrap = required(loc, d, &n.bootstrap, "bootstrap", "the brokers, e.g. bootstrap = \"127.0.0.1:9092\"")?;
    let topic = required(loc, d, &n.topic, "topic", "the topic to read")?;
    let mut config = KafkaSourceConfig::new(bootstrap, topic);
    for (k, v) in kafka_properties(d) {
        config.properties.insert(k, v);
    }
    config.max_record_bytes = job.config().max_record_bytes as usize;
    config.bounded = n.bounded.as_ref().is_some_and(|b| *b.get_ref());
    if let Some(v) = &n.start {
        config.start = StartFrom::from_name(v.get_ref()).ok_or_else(|| {
            loc.err(
                Some(v.span()),
                d.field("start"),
                format!("unknown start `{}`; use earliest, latest, committed or committed_or_latest", v.get_ref()),
            )
        })?;
    }
    config.dead_letter = match (&n.dead_letter, &n.dead_letter_topic) {
        (Some(_), Some(t)) => {
            return Err(loc.err(
                Some(t.span()),
                d.field("dead_letter_topic"),
                "give dead_letter (a file) or dead_letter_topic, not both",
            ));
        }
        (Some(f), None) => Some(DeadLetter::File(f.get_ref().into())),
        (None, Some(t)) => Some(DeadLetter::Topic(t.get_ref().clone())),
        (None, None) => None,
    };
    config.on_bad_record = match &n.on_bad_record {
        Some(v) => OnBadRecord::from_name(v.get_ref()).ok_or_else(|| {
            loc.err(
                Some(v.span()),
                d.field("on_bad_record"),
                format!("unknown policy `{}`; use dead_letter, skip or fail", v.get_ref()),
            )
        })?,
        None if config.dead_letter.is_some() => OnBadRecord::DeadLetter,
        None => OnBadRecord::Fail,
    };
    config.validate().map_err(|e| loc.err(Some(n.kind.span()), d.field("properties"), e))?;
    Ok(config)
}

/// A `type = "kafka"` sink: records as JSON into `topic` at `bootstrap`.
pub(super) fn kafka_sink_config(
    loc: &Loc,
    d: &Decl,
    job: &Job,
) -> Result<crate::io::kafka::KafkaSinkConfig, JobFileError> {
    use crate::io::kafka::{Delivery, KafkaSinkConfig};
    let n = d.node;
    let bootstrap = required(loc, d, &n.bootstrap, "bootstrap", "the brokers, e.g. bootstrap = \"127.0.0.1:9092\"")?;
    let topic = required(loc, d, &n.topic, "topic", "the topic to write")?;
    let mut config = KafkaSinkConfig::new(bootstrap, topic);
    for (k, v) in kafka_properties(d) {
        config.properties.insert(k, v);
    }
    if let Some(v) = &n.delivery {
        config.delivery = match v.get_ref().as_str() {
            "at_least_once" => Delivery::AtLeastOnce,
            "exactly_once" => Delivery::ExactlyOnce,
            other => {
                return Err(loc.err(
                    Some(v.span()),
                    d.field("delivery"),
                    format!("unknown delivery `{other}`; use at_least_once or exactly_once"),
                ));
            }
        };
        if config.delivery == Delivery::ExactlyOnce {
            match &job.config().checkpoints {
                Some(k) => {
                    config.checkpoint_timeout = k.timeout;
                    config.transaction_log_dir = Some(k.dir.join("kafka-transactions"));
                }
                None => {
                    return Err(loc.err(
                        Some(v.span()),
                        d.field("delivery"),
                        "exactly_once commits a transaction per checkpoint: set checkpoint_dir in [job]",
                    ));
                }
            }
        }
    }
    config.validate().map_err(|e| loc.err(Some(n.kind.span()), d.field("properties"), e))?;
    Ok(config)
}

/// `format = "lines" | "raw" | "length_prefixed"` (default lines).
pub(super) fn format_field(loc: &Loc, d: &Decl) -> Result<Format, JobFileError> {
    match &d.node.format {
        None => Ok(Format::Lines),
        Some(f) => Format::from_name(f.get_ref()).ok_or_else(|| {
            loc.err(
                Some(f.span()),
                d.field("format"),
                format!("unknown format `{}`; use lines, raw or length_prefixed", f.get_ref()),
            )
        }),
    }
}

pub(super) fn file_sink_config(loc: &Loc, d: &Decl) -> Result<FileSinkConfig, JobFileError> {
    let path = required(loc, d, &d.node.path, "path", "the directory for the part files")?;
    if path.trim().is_empty() {
        let span = d.node.path.as_ref().map(|p| p.span());
        return Err(loc.err(span, d.field("path"), "an empty path; name the directory for the part files"));
    }
    Ok(FileSinkConfig { format: format_field(loc, d)?, ..FileSinkConfig::new(path) })
}

pub(super) fn tcp_sink_config(loc: &Loc, d: &Decl) -> Result<TcpSinkConfig, JobFileError> {
    let address = required(loc, d, &d.node.address, "address", "host:port of the receiver")?;
    let port_ok = address.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok {
        let span = d.node.address.as_ref().map(|a| a.span());
        return Err(loc.err(span, d.field("address"), format!("`{address}` is not host:port (e.g. 127.0.0.1:9000)")));
    }
    let mut config = TcpSinkConfig { format: format_field(loc, d)?, ..TcpSinkConfig::new(address.clone()) };
    if let Some(b) = &d.node.max_in_flight_bytes {
        let bytes = *b.get_ref();
        if !(64..=1 << 30).contains(&bytes) {
            return Err(loc.err(Some(b.span()), d.field("max_in_flight_bytes"), "use 64 bytes to 1 GiB"));
        }
        config.max_in_flight_bytes = bytes as usize;
        config.batch_bytes = config.batch_bytes.min(bytes as usize);
    }
    Ok(config)
}

pub(super) fn http_sink_config(loc: &Loc, d: &Decl, job_name: &str) -> Result<HttpSinkConfig, JobFileError> {
    let n = d.node;
    let url = required(loc, d, &n.url, "url", "the endpoint, e.g. http://127.0.0.1:8080/ingest")?;
    let mut config = HttpSinkConfig { key_prefix: job_name.to_owned(), ..HttpSinkConfig::new(url.clone()) };
    if let Err(e) = config.validate() {
        return Err(loc.err(n.url.as_ref().map(|u| u.span()), d.field("url"), e));
    }
    if let Some(m) = &n.max_in_flight {
        if !(1..=256).contains(m.get_ref()) {
            return Err(loc.err(Some(m.span()), d.field("max_in_flight"), "use 1 to 256 requests in flight"));
        }
        config.max_in_flight = *m.get_ref() as usize;
    }
    if let Some(b) = &n.batch_records {
        if !(1..=1_000_000).contains(b.get_ref()) {
            return Err(loc.err(Some(b.span()), d.field("batch_records"), "use 1 to 1000000 records per request"));
        }
        config.batch_records = *b.get_ref() as usize;
    }
    if let Some(b) = &n.body {
        config.body = BodyFormat::from_name(b.get_ref()).ok_or_else(|| {
            loc.err(
                Some(b.span()),
                d.field("body"),
                format!("unknown body `{}`; use json_lines or json_array", b.get_ref()),
            )
        })?;
    }
    if let Some(p) = &n.dead_letter {
        if p.get_ref().trim().is_empty() {
            return Err(loc.err(
                Some(p.span()),
                d.field("dead_letter"),
                "an empty path; name a file, or remove the setting",
            ));
        }
        config.dead_letter = Some(PathBuf::from(p.get_ref()));
    }
    if let Some(r) = &n.max_retries {
        config.max_retries = *r.get_ref();
    }
    if let Some(t) = &n.request_timeout_ms {
        if *t.get_ref() == 0 {
            return Err(loc.err(Some(t.span()), d.field("request_timeout_ms"), "a timeout of 0; give requests time"));
        }
        config.request_timeout = Duration::from_millis(*t.get_ref());
    }
    Ok(config)
}

/// Prints each record on a line.
pub(super) struct StdoutSink;

impl<T: std::fmt::Display> Sink<T> for StdoutSink {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        use std::io::Write;
        writeln!(std::io::stdout().lock(), "{record}").map_err(|e| Halt::failed(format!("stdout: {e}")))
    }
}
