//! Every node type a job file can name, and the keys each takes: what `type = "…"` may say
//! in each section, and whose setting a stray key is. The readers of the keys live with
//! what they configure (a connector's next to its configuration, in `io/`).

use super::*;
use crate::io::ipc::IpcConfig;
use crate::io::kafka::{KafkaSinkConfig, KafkaSourceConfig};
use crate::io::nexmark::NexmarkConfig;
use crate::io::registry;
use crate::util::section::Keys;

/// The keys every node has.
pub(super) const COMMON: &[&str] =
    &["id", "type", "parallelism", "cpus", "input", "inputs", "partitioning", "inflight_target_ms"];

/// The keys of a `window` operator.
pub(super) const WINDOW_KEYS: &[&str] = &[
    "window",
    "size_ms",
    "slide_ms",
    "gap_ms",
    "aggregate",
    "value",
    "allowed_lateness_ms",
    "event_time",
    "cache_mb",
    "late_output",
];

/// One node type: its section (`source`, `operator`, `sink`), its `type`, its keys.
pub(super) struct Kind {
    pub(super) section: &'static str,
    pub(super) name: &'static str,
    pub(super) keys: Keys,
}

const fn kind(section: &'static str, name: &'static str, keys: Keys) -> Kind {
    Kind { section, name, keys }
}

/// The catalogue, in the order messages list the types.
pub(super) const KINDS: &[Kind] = &[
    kind("source", "generator", &[COMMON, &["count", "keys", "rate", "jitter_us"], WatermarkStrategy::KEYS]),
    kind("source", "silent", &[COMMON, WatermarkStrategy::KEYS]),
    kind("source", "kafka", &[COMMON, KafkaSourceConfig::KEYS, registry::SOURCE_KEYS, WatermarkStrategy::KEYS]),
    kind("source", "ipc", &[COMMON, IpcConfig::KEYS, WatermarkStrategy::KEYS]),
    kind("source", "nexmark", &[COMMON, NexmarkConfig::KEYS, WatermarkStrategy::KEYS]),
    kind("operator", "map", &[COMMON, &["function", "modulus"]]),
    kind("operator", "filter", &[COMMON, &["function", "threshold", "modulus", "side_output"]]),
    kind("operator", "flat_map", &[COMMON, &["function", "times"]]),
    kind("operator", "key_by", &[COMMON, &["field"], crate::io::kafka::REPARTITION_KEYS]),
    kind("operator", "sum_per_key", &[COMMON]),
    kind("operator", "window", &[COMMON, WINDOW_KEYS]),
    kind("operator", "interval_join", &[COMMON, JOIN_KEYS]),
    kind("operator", "window_join", &[COMMON, JOIN_KEYS]),
    kind("sink", "count", &[COMMON, &["delay_us"]]),
    kind("sink", "null", &[COMMON]),
    kind("sink", "stdout", &[COMMON]),
    kind("sink", "file", &[COMMON, FileSinkConfig::KEYS]),
    kind("sink", "tcp", &[COMMON, TcpSinkConfig::KEYS]),
    kind("sink", "http", &[COMMON, HttpSinkConfig::KEYS]),
    kind("sink", "postgres", &[COMMON, crate::io::postgres::PostgresSinkConfig::KEYS]),
    kind("sink", "kafka", &[COMMON, KafkaSinkConfig::KEYS, registry::SINK_KEYS]),
    kind("sink", "ipc", &[COMMON, IpcConfig::KEYS]),
];

/// The catalogue's entry for a node's `type`, or the error that lists the types there are.
pub(super) fn kind_of(s: &Section) -> Result<&'static Kind, JobFileError> {
    let here = || KINDS.iter().filter(|k| k.section == s.noun());
    if let Some(k) = here().find(|k| k.name == s.kind()) {
        return Ok(k);
    }
    let names: Vec<&str> = here().map(|k| k.name).collect();
    let (last, rest) = names.split_last().expect("every section has types");
    Err(s.err(
        s.kind_span(),
        "type",
        format!("unknown {} type `{}`; use {} or {last}", s.noun(), s.kind(), rest.join(", ")),
    ))
}

/// Why `key` is not a setting of a `kind` node of `section`: whose setting it is, or that it
/// is nobody's.
pub(super) fn stray_key(section: &str, kind: &str, key: &str) -> String {
    let owners: Vec<String> = KINDS
        .iter()
        .filter(|k| k.keys.iter().any(|group| group.contains(&key)))
        .map(|k| format!("{} {}s", k.name, k.section))
        .collect();
    match owners.split_last() {
        None => {
            let own = KINDS.iter().find(|k| k.section == section && k.name == kind).map(|k| k.keys.concat());
            let own = own.unwrap_or_default().join(", ");
            format!("unknown field `{key}`; a {kind} {section} takes {own}")
        }
        Some((last, [])) => format!("`{key}` is not a setting of a {kind} {section}; it belongs to {last}"),
        Some((last, rest)) => {
            format!("`{key}` is not a setting of a {kind} {section}; it belongs to {} and {last}", rest.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type's keys are its own: no key twice in one type (a reader would take it once and
    /// a second group would claim it for nothing).
    #[test]
    fn no_type_lists_a_key_twice() {
        for k in KINDS {
            let mut keys = k.keys.concat();
            let n = keys.len();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), n, "{} {} lists a key twice", k.section, k.name);
        }
    }

    #[test]
    fn stray_keys_name_their_owners() {
        assert_eq!(stray_key("sink", "file", "url"), "`url` is not a setting of a file sink; it belongs to http sinks");
        let topic = stray_key("source", "generator", "topic");
        assert!(topic.ends_with("belongs to kafka sources and kafka sinks"), "{topic}");
        let nobody = stray_key("sink", "null", "colour");
        assert!(nobody.starts_with("unknown field `colour`; a null sink takes id, type"), "{nobody}");
    }
}
