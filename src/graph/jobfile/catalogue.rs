//! Every node type a job file can name, and the keys each takes: what `type = "…"` may say
//! in each section, and whose setting a stray key is. The readers of the keys live with
//! what they configure (a connector's next to its configuration, in `io/`).

use super::*;
use crate::io::ipc::IpcConfig;
#[cfg(feature = "kafka")]
use crate::io::kafka::{KafkaSinkConfig, KafkaSourceConfig};
#[cfg(feature = "kafka")]
use crate::io::registry;
pub(super) use crate::util::section::not_built;
use crate::util::section::{Affects, Key, KeyType as T, Keys, REQUIRED, TYPE_KEY, UNSET};

/// The keys every node has.
pub(super) const COMMON: &[Key] = &[
    Key::new("id", T::String, REQUIRED, "The node's name: what `input` names, what messages, counters and checkpoints call it. State is found by it after a restart: keep it across versions.")
        .affects(Affects::Recovery),
    TYPE_KEY,
    Key::new("parallelism", T::Integer, "1; a map, filter or flat_map: its input's", "Subtasks of the node, each a thread (or a fiber) of its own; at most 4096, and at most `max_key_groups` after a key_by."),
    Key::new("cpus", T::Integers, "the job's placement", "The CPU ids the node's subtasks are pinned to, in turn (needs `pinning`)."),
    Key::new("input", T::String, "required, but for sources", "The node this one reads: a node id, or `<node>.<output>` for a side output."),
    Key::new("inputs", T::Strings, UNSET, "Several inputs, unioned (a join's: `[\"left\", \"right\"]`)."),
    Key::new("partitioning", T::String, "forward where the parallelism is equal, else rebalance", "How records reach this node's subtasks: `forward`, `rebalance` or `broadcast` (by key: put a `key_by` before it).")
        .affects(Affects::Results),
    Key::new("inflight_target_ms", T::Integer, "the job's share", "The time this node's input rings may take to drain: what its receivers announce as credit (0: they announce nothing and the rings fill).")
        .affects(Affects::Latency),
];

/// The keys of a `generator` source.
const GENERATOR_KEYS: &[Key] = &[
    Key::new(
        "count",
        T::Integer,
        "endless",
        "Events each subtask emits, then the source ends (and the job, when every source has).",
    ),
    Key::new("keys", T::Integer, "1000", "Distinct keys: event n has key `hash(n) % keys`."),
    Key::new("rate", T::Number, "as fast as it can", "Events per second per subtask, paced by the wall clock.")
        .affects(Affects::Latency),
    Key::new(
        "jitter_us",
        T::Integer,
        "0",
        "Event times out of order by up to this many µs (event n's time is `n µs` less a hash of n).",
    ),
];

/// The keys of a `map` operator.
const MAP_KEYS: &[Key] = &[
    Key::new(
        "function",
        T::String,
        REQUIRED,
        "The built-in function: `identity`, `double_value` (value × 2) or `key_mod` (key mod `modulus`).",
    ),
    Key::new("modulus", T::Integer, REQUIRED, "`key_mod`'s divisor, at least 1."),
];

/// The keys of a `filter` operator.
const FILTER_KEYS: &[Key] = &[
    Key::new(
        "function",
        T::String,
        REQUIRED,
        "The built-in predicate: `key_even`, `key_multiple_of` (key a multiple of `modulus`: Nexmark's q2) or `value_below` (value < `threshold`).",
    ),
    Key::new("threshold", T::Integer, "50", "`value_below`'s bound."),
    Key::new("modulus", T::Integer, "required by key_multiple_of", "`key_multiple_of`'s divisor, at least 1."),
    Key::new(
        "side_output",
        T::String,
        UNSET,
        "Send what the filter drops to a stream of its own, read as `<id>.<side_output>` (a dead-letter or alert output).",
    ),
];

/// The keys of a `flat_map` operator.
const FLAT_MAP_KEYS: &[Key] = &[
    Key::new("function", T::String, REQUIRED, "The built-in function: `repeat` (each record `times` times)."),
    Key::new(
        "times",
        T::Integer,
        "2",
        "Copies of each record, 1 to 1,000,000 (emitted at once: a stop waits for them).",
    ),
];

/// The keys of a `key_by` operator of its own (those of a repartition topic follow).
const KEY_BY_KEYS: &[Key] = &[Key::new(
    "field",
    T::String,
    REQUIRED,
    "The event field whose value is the key: `key`, `value` or `seq`. Records of a key meet in one subtask, by key group.",
)
.affects(Affects::Results)];

/// The keys of a `window` operator.
pub(super) const WINDOW_KEYS: &[Key] = &[
    Key::new("window", T::String, REQUIRED, "The shape: `tumbling` (`size_ms`), `sliding` (`size_ms`, `slide_ms`) or `session` (`gap_ms`).").affects(Affects::Results),
    Key::new("size_ms", T::Integer, "required by tumbling and sliding", "The window's length.").affects(Affects::Results),
    Key::new("slide_ms", T::Integer, "required by sliding", "How far apart sliding windows start; at most `size_ms`.").affects(Affects::Results),
    Key::new("gap_ms", T::Integer, "required by session", "The silence that closes a key's session.").affects(Affects::Results),
    Key::new("aggregate", T::Strings, REQUIRED, "What each result carries: any of `count`, `sum`, `min`, `max`, `mean` of `value`."),
    Key::new("value", T::String, "value", "The event field aggregated: `value`, `seq` or `key`."),
    Key::new("allowed_lateness_ms", T::Integer, "0", "How long after a window fired a late record still fires it again (a result marked late); later ones are dropped and counted, or sent to `late_output`.").affects(Affects::Results),
    Key::new("event_time", T::Boolean, "true", "Count in event time (the source needs `timestamp`); `false`: processing time, the wall clock when a record arrives.").affects(Affects::Results),
    Key::new("cache_mb", T::Integer, "64", "In-memory window state per subtask, in the budget; beyond it state goes to the state backend.").affects(Affects::Memory),
    Key::new("late_output", T::String, UNSET, "Send records too late for `allowed_lateness_ms` to a stream of their own, read as `<id>.<late_output>`.").affects(Affects::Results),
];

/// The keys of a `count` sink.
const COUNT_KEYS: &[Key] =
    &[Key::new("delay_us", T::Integer, "0", "Time the sink takes per record (a slow sink, to see backpressure).")];
/// The keys of Kafka nodes, and of a `key_by` through a repartition topic (Kafka's). A build
/// without the `kafka` feature still knows the types, to say which feature they need.
#[cfg(feature = "kafka")]
const KAFKA_SOURCE_KEYS: Keys = &[COMMON, KafkaSourceConfig::KEYS, registry::SOURCE_KEYS, WatermarkStrategy::KEYS];
#[cfg(feature = "kafka")]
const KAFKA_SINK_KEYS: Keys = &[COMMON, KafkaSinkConfig::KEYS, registry::SINK_KEYS];
#[cfg(feature = "kafka")]
pub(super) const REPARTITION_KEYS: &[Key] = crate::io::kafka::REPARTITION_KEYS;
#[cfg(not(feature = "kafka"))]
const KAFKA_SOURCE_KEYS: Keys = &[COMMON];
#[cfg(not(feature = "kafka"))]
const KAFKA_SINK_KEYS: Keys = &[COMMON];
#[cfg(not(feature = "kafka"))]
pub(super) const REPARTITION_KEYS: &[Key] = &[
    Key::new("repartition", T::Boolean, "false", "Run the key_by through a Kafka topic (needs the `kafka` feature)."),
    Key::new("bootstrap", T::String, UNSET, "The brokers of the repartition topic."),
    Key::new("properties", T::Table, UNSET, "librdkafka properties of the repartition topic's clients."),
];

#[cfg(feature = "postgres")]
const POSTGRES_KEYS: Keys = &[COMMON, crate::io::postgres::PostgresSinkConfig::KEYS];
#[cfg(not(feature = "postgres"))]
const POSTGRES_KEYS: Keys = &[COMMON];

#[cfg(feature = "nexmark")]
const NEXMARK_KEYS: Keys = &[COMMON, crate::io::nexmark::NexmarkConfig::KEYS, WatermarkStrategy::KEYS];
#[cfg(not(feature = "nexmark"))]
const NEXMARK_KEYS: Keys = &[COMMON];

/// One node type: its section (`source`, `operator`, `sink`), its `type`, its keys, and the
/// Cargo feature it needs (none: every build has it).
pub(super) struct Kind {
    pub(super) section: &'static str,
    pub(super) name: &'static str,
    pub(super) keys: Keys,
    pub(super) feature: Option<Feature>,
}

/// A Cargo feature a node type needs, and whether this build has it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Feature {
    pub(super) name: &'static str,
    pub(super) built: bool,
}

const fn kind(section: &'static str, name: &'static str, keys: Keys) -> Kind {
    Kind { section, name, keys, feature: None }
}

const fn kafka(section: &'static str, keys: Keys) -> Kind {
    Kind { section, name: "kafka", keys, feature: Some(Feature { name: "kafka", built: cfg!(feature = "kafka") }) }
}

/// The catalogue, in the order messages list the types.
pub(super) const KINDS: &[Kind] = &[
    kind("source", "generator", &[COMMON, GENERATOR_KEYS, WatermarkStrategy::KEYS]),
    kind("source", "silent", &[COMMON, WatermarkStrategy::KEYS]),
    kafka("source", KAFKA_SOURCE_KEYS),
    kind("source", "ipc", &[COMMON, IpcConfig::KEYS, WatermarkStrategy::KEYS]),
    Kind {
        section: "source",
        name: "nexmark",
        keys: NEXMARK_KEYS,
        feature: Some(Feature { name: "nexmark", built: cfg!(feature = "nexmark") }),
    },
    kind("operator", "map", &[COMMON, MAP_KEYS]),
    kind("operator", "filter", &[COMMON, FILTER_KEYS]),
    kind("operator", "flat_map", &[COMMON, FLAT_MAP_KEYS]),
    kind("operator", "key_by", &[COMMON, KEY_BY_KEYS, REPARTITION_KEYS]),
    kind("operator", "sum_per_key", &[COMMON]),
    kind("operator", "window", &[COMMON, WINDOW_KEYS]),
    kind("operator", "interval_join", &[COMMON, JOIN_KEYS]),
    kind("operator", "window_join", &[COMMON, JOIN_KEYS]),
    kind("sink", "count", &[COMMON, COUNT_KEYS]),
    kind("sink", "null", &[COMMON]),
    kind("sink", "stdout", &[COMMON]),
    kind("sink", "file", &[COMMON, FileSinkConfig::KEYS]),
    kind("sink", "tcp", &[COMMON, TcpSinkConfig::KEYS]),
    kind("sink", "http", &[COMMON, HttpSinkConfig::KEYS]),
    Kind {
        section: "sink",
        name: "postgres",
        keys: POSTGRES_KEYS,
        feature: Some(Feature { name: "postgres", built: cfg!(feature = "postgres") }),
    },
    kafka("sink", KAFKA_SINK_KEYS),
    kind("sink", "ipc", &[COMMON, IpcConfig::KEYS]),
];

/// The job-file reference (`weir::guide::reference::job_file`): `[job]`'s keys, the keys every
/// node has, then each node type's own, from the tables the parser reads. `tests/reference.rs`
/// keeps the committed page equal to this.
pub fn reference() -> String {
    let mut out = String::from(
        "# Job-file reference\n\n\
         Every key a job file may hold: its TOML type, its default, what it does, and which promise of the job it\n\
         bears on (*affects*: delivery, memory, latency, results, recovery, failures, security). Generated from\n\
         the tables the parser reads (`src/graph/jobfile/catalogue.rs` and each connector's section), so it\n\
         cannot name a key the parser does not take. `${VAR}` and `${VAR:-default}` anywhere in a file are\n\
         replaced from the environment first (`${file:PATH}`: a file's first line); every error names the\n\
         file, line, column and field.\n\n",
    );
    let table = |out: &mut String, keys: &mut dyn Iterator<Item = &Key>| {
        out.push_str("| key | type | default | what | affects |\n|---|---|---|---|---|\n");
        for k in keys {
            let doc = k.doc.replace('|', "\\|");
            // A pattern such as `weir-<job>-<node>` is code (Markdown would read `<job>` as HTML).
            let default = match k.default.contains('<') && !k.default.contains('`') {
                true => format!("`{}`", k.default),
                false => k.default.to_owned(),
            };
            out.push_str(&format!("| `{}` | {} | {default} | {doc} | {} |\n", k.name, k.ty.name(), k.affects.name()));
        }
        out.push('\n');
    };
    out.push_str("## `[job]`\n\n");
    table(&mut out, &mut super::job::JOB_KEYS.iter());
    out.push_str("## Every node\n\nEach `[[source]]`, `[[operator]]` and `[[sink]]` is a table with these keys, and those of its type.\n\n");
    table(&mut out, &mut COMMON.iter());
    for section in ["source", "operator", "sink"] {
        out.push_str(&format!("## `[[{section}]]` types\n\n"));
        for k in KINDS.iter().filter(|k| k.section == section) {
            out.push_str(&format!("### `type = \"{}\"`\n\n", k.name));
            if let Some(f) = k.feature {
                out.push_str(&format!("Needs the `{}` feature.\n\n", f.name));
            }
            let own: Vec<&Key> = k.keys.iter().filter(|g| !std::ptr::eq(**g, COMMON)).flat_map(|g| g.iter()).collect();
            if own.is_empty() {
                out.push_str("No keys but every node's.\n\n");
            } else {
                table(&mut out, &mut own.into_iter());
            }
        }
    }
    out
}

/// The catalogue's entry for a node's `type`, or the error that lists the types there are.
pub(super) fn kind_of(s: &Section) -> Result<&'static Kind, JobFileError> {
    let here = || KINDS.iter().filter(|k| k.section == s.noun());
    if let Some(k) = here().find(|k| k.name == s.kind()) {
        return match k.feature {
            Some(f) if !f.built => {
                Err(s.err(s.kind_span(), "type", not_built(&format!("a {} {}", k.name, s.noun()), f.name)))
            }
            _ => Ok(k),
        };
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
        .filter(|k| k.keys.iter().any(|group| group.iter().any(|g| g.name == key)))
        .map(|k| format!("{} {}s", k.name, k.section))
        .collect();
    match owners.split_last() {
        None => {
            let own = KINDS.iter().find(|k| k.section == section && k.name == kind).map(|k| k.keys.concat());
            let own: Vec<&str> = own.unwrap_or_default().iter().map(|k| k.name).collect();
            let own = own.join(", ");
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
            let mut keys: Vec<&str> = k.keys.concat().iter().map(|k| k.name).collect();
            let n = keys.len();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), n, "{} {} lists a key twice", k.section, k.name);
        }
    }

    #[test]
    #[cfg(feature = "kafka")]
    fn stray_keys_name_their_owners() {
        assert_eq!(stray_key("sink", "file", "url"), "`url` is not a setting of a file sink; it belongs to http sinks");
        let topic = stray_key("source", "generator", "topic");
        assert!(topic.ends_with("belongs to kafka sources and kafka sinks"), "{topic}");
        let nobody = stray_key("sink", "null", "colour");
        assert!(nobody.starts_with("unknown field `colour`; a null sink takes id, type"), "{nobody}");
    }
}
