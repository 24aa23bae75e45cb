//! Job files: the same graph as the builder, written in TOML.
//!
//! ```toml
//! [job]
//! name = "clicks"
//!
//! [[source]]
//! id = "gen"
//! type = "generator"      # events: key, value, time_ns, seq
//! count = 1000000         # omit for an endless source
//! keys = 1000
//!
//! [[operator]]
//! id = "double"
//! type = "map"
//! function = "double_value"
//! input = "gen"
//!
//! [[operator]]
//! id = "by_key"
//! type = "key_by"
//! field = "key"
//! input = "double"
//!
//! [[sink]]
//! id = "count"
//! type = "count"
//! input = "by_key"
//! parallelism = 2
//! ```
//!
//! Windows (see `tests/jobs/windowed-counts.toml`): the source declares event time and its
//! watermarks, a `window` operator after a `key_by` aggregates, and its results (one
//! [`WindowResult`] per key and window) go to a sink (`count` counts results, and sums
//! their record counts into the seq checksum).
//!
//! ```toml
//! [[source]]
//! id = "events"
//! type = "generator"
//! timestamp = "time_ns"           # event time: the events' time_ns field
//! max_out_of_orderness_ms = 5     # watermark = largest time seen - this
//! watermark_every = 1024          # emit after this many records (and every
//! watermark_interval_ms = 200     # this long), if it advanced
//! jitter_us = 2000                # generator: event times out of order by up to this
//!
//! [[operator]]
//! id = "per_second"
//! type = "window"
//! input = "by_user"               # a key_by node
//! window = "tumbling"             # tumbling (size_ms) | sliding (size_ms, slide_ms) | session (gap_ms)
//! size_ms = 1000
//! aggregate = ["count", "sum"]    # count, sum, min, max, mean of `value` (or value = "seq")
//! allowed_lateness_ms = 100
//! event_time = true               # false: processing time
//! cache_mb = 64                   # in-memory state per subtask, in the budget
//! ```
//!
//! Sinks through io_uring (see [`crate::io`]): part files in a directory, a TCP stream, or
//! POSTs to a REST API.
//!
//! ```toml
//! [[sink]]
//! id = "files"
//! type = "file"
//! path = "out/"                   # part-<subtask>-<n> files, final at the end (or a checkpoint)
//! format = "lines"                # lines | raw | length_prefixed
//!
//! [[sink]]
//! id = "stream"
//! type = "tcp"
//! address = "127.0.0.1:9000"
//! format = "length_prefixed"      # lines | raw | length_prefixed
//! max_in_flight_bytes = 262144
//!
//! [[sink]]
//! id = "api"
//! type = "http"
//! url = "http://127.0.0.1:8080/ingest"
//! max_in_flight = 4               # requests outstanding; more makes the sink block (backpressure)
//! batch_records = 100             # records per POST body
//! body = "json_lines"             # json_lines | json_array
//! dead_letter = "rejected.jsonl"  # 4xx batches go here with the reason (else the job fails)
//! max_retries = 8                 # 5xx / connection errors, capped exponential backoff
//! request_timeout_ms = 30000
//! ```
//!
//! Kafka (see `tests/jobs/kafka-events.toml` and [`crate::io::kafka`]): JSON events in,
//! JSON records out; librdkafka properties pass through unchanged.
//!
//! ```toml
//! [[source]]
//! id = "events"
//! type = "kafka"
//! bootstrap = "127.0.0.1:9092"
//! topic = "events"
//! start = "earliest"              # earliest | latest | committed: where unrestored partitions start
//! bounded = false                 # true: stop at the end offsets seen at start
//! on_bad_record = "dead_letter"   # dead_letter | skip | fail
//! dead_letter = "bad.jsonl"       # or dead_letter_topic = "events-dlq"
//! timestamp = "time_ns"           # event time, watermarks per partition (from the source)
//! properties = { "fetch.wait.max.ms" = 100 }
//!
//! [[sink]]
//! id = "out"
//! type = "kafka"
//! bootstrap = "127.0.0.1:9092"
//! topic = "sums"
//! delivery = "exactly_once"       # at_least_once (idempotent) | exactly_once (a transaction per
//!                                 # checkpoint; its records logged in <checkpoint_dir>/kafka-transactions)
//! ```
//!
//! In `[job]`, `watermark_idle_timeout_ms` lets an input that sends nothing for that long
//! stop holding watermarks back; `state_backend = "rocksdb"` (the default) or `"memory"`
//! says where window state goes beyond the caches, `state_dir` where the RocksDB shards live.
//! `checkpoint_dir` turns checkpoints on (and a restart resumes from the newest one there),
//! with `checkpoint_interval_ms` (1000), `checkpoint_timeout_ms` (600000) and
//! `checkpoints_retained` (3).
//!
//! `${VAR}` and `${VAR:-default}` anywhere in the file are replaced with the environment's
//! value before parsing (`$$` is a literal `$`).
//!
//! Every error names the file, line and column, and the field (`operator[1].input`).

mod connectors;
mod format;
mod job;
mod nodes;
mod windows;

pub use format::{JobFileError, interpolate};

use super::{GraphError, Job, KeyedStream, StateBackendKind, Stream};
use crate::io::{BodyFormat, FileSink, FileSinkConfig, Format, HttpSink, HttpSinkConfig, TcpSink, TcpSinkConfig};
use crate::operators::builtin::{CountingSink, Generator, NullSink, Silent, SumPerKey, Tally};
use crate::operators::{Halt, Sink, SubtaskInfo};
use crate::record::{Event, Record};
use crate::time::WatermarkStrategy;
use crate::window::{Aggregate, Aggregates, Window, WindowResult};
use connectors::*;
use format::Loc;
use job::*;
use nodes::*;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toml::Spanned;
use weir_ring::IdleStrategy;
use windows::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NodeSection {
    id: Spanned<String>,
    #[serde(rename = "type")]
    kind: Spanned<String>,
    parallelism: Option<Spanned<u32>>,
    cpus: Option<Vec<usize>>,
    input: Option<Spanned<String>>,
    inputs: Option<Vec<Spanned<String>>>,
    partitioning: Option<Spanned<String>>,
    // generator
    count: Option<u64>,
    keys: Option<u64>,
    rate: Option<f64>,
    // map / filter / flat_map / key_by
    function: Option<Spanned<String>>,
    modulus: Option<u64>,
    threshold: Option<u64>,
    times: Option<u64>,
    field: Option<Spanned<String>>,
    // sinks
    delay_us: Option<u64>,
    // io sinks (file, tcp, http)
    path: Option<Spanned<String>>,
    format: Option<Spanned<String>>,
    address: Option<Spanned<String>>,
    max_in_flight_bytes: Option<Spanned<u64>>,
    url: Option<Spanned<String>>,
    max_in_flight: Option<Spanned<u64>>,
    batch_records: Option<Spanned<u64>>,
    body: Option<Spanned<String>>,
    dead_letter: Option<Spanned<String>>,
    max_retries: Option<Spanned<u32>>,
    request_timeout_ms: Option<Spanned<u64>>,
    // Kafka (source and sink).
    bootstrap: Option<Spanned<String>>,
    topic: Option<Spanned<String>>,
    properties: Option<Spanned<BTreeMap<String, toml::Value>>>,
    start: Option<Spanned<String>>,
    on_bad_record: Option<Spanned<String>>,
    dead_letter_topic: Option<Spanned<String>>,
    delivery: Option<Spanned<String>>,
    bounded: Option<Spanned<bool>>,
    // event time (sources)
    timestamp: Option<Spanned<String>>,
    max_out_of_orderness_ms: Option<u64>,
    watermark_every: Option<Spanned<u64>>,
    watermark_interval_ms: Option<u64>,
    jitter_us: Option<u64>,
    // windows
    window: Option<Spanned<String>>,
    size_ms: Option<Spanned<u64>>,
    slide_ms: Option<Spanned<u64>>,
    gap_ms: Option<Spanned<u64>>,
    aggregate: Option<Spanned<Vec<Spanned<String>>>>,
    value: Option<Spanned<String>>,
    allowed_lateness_ms: Option<u64>,
    event_time: Option<Spanned<bool>>,
    cache_mb: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    #[serde(default)]
    job: JobSection,
    #[serde(default)]
    source: Vec<NodeSection>,
    #[serde(default)]
    operator: Vec<NodeSection>,
    #[serde(default)]
    sink: Vec<NodeSection>,
}

/// A loaded job file: the job, and the shared tallies of its `count` sinks.
#[derive(Debug)]
pub struct LoadedJob {
    /// The job, ready to start.
    pub job: Job,
    /// One tally per `count` sink id.
    pub tallies: Vec<(String, Arc<Tally>)>,
}

/// Read, parse and check a job file, and build the job.
pub fn load(path: impl AsRef<Path>) -> Result<LoadedJob, JobFileError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| JobFileError {
        path: path.to_owned(),
        line: 0,
        column: 0,
        field: String::new(),
        message: format!("cannot read the job file: {e}"),
    })?;
    parse(path, &text)
}

/// One node of the file, with where it sits.
pub(super) struct Decl<'a> {
    section: &'static str,
    index: usize,
    node: &'a NodeSection,
}

impl Decl<'_> {
    fn field(&self, name: &str) -> String {
        format!("{}[{}].{name}", self.section, self.index)
    }

    fn inputs(&self) -> Vec<&Spanned<String>> {
        let mut v: Vec<&Spanned<String>> = self.node.input.iter().collect();
        if let Some(more) = &self.node.inputs {
            v.extend(more.iter());
        }
        v
    }
}

pub(super) enum Built {
    Plain(Stream<Event>),
    Keyed(KeyedStream<Event, u64>),
    /// Window results, and whether the window counts in event time.
    Results(Stream<WindowResult>, bool),
}

/// Parse and check job-file text (`path` is only for messages).
pub fn parse(path: &Path, text: &str) -> Result<LoadedJob, JobFileError> {
    let text = &interpolate(path, text, &|name| std::env::var(name).ok())?;
    let loc = Loc { path, text };
    let file: File = toml::from_str(text).map_err(|e| loc.err(e.span(), "", e.message().trim().to_owned()))?;

    let name =
        file.job.name.clone().unwrap_or_else(|| {
            path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "job".into())
        });
    let job = Job::new(&name);
    apply_job_section(&loc, &job, &file.job)?;

    let decls: Vec<Decl> = [("source", &file.source), ("operator", &file.operator), ("sink", &file.sink)]
        .into_iter()
        .flat_map(|(section, nodes)| nodes.iter().enumerate().map(move |(index, node)| Decl { section, index, node }))
        .collect();
    if file.source.is_empty() {
        return Err(loc.err(None, "source", "the job has no [[source]]; add one (type = \"generator\")"));
    }
    let mut by_id: HashMap<&str, usize> = HashMap::new();
    for (i, d) in decls.iter().enumerate() {
        if by_id.insert(d.node.id.get_ref().as_str(), i).is_some() {
            return Err(loc.err(
                Some(d.node.id.span()),
                d.field("id"),
                format!("id `{}` is used twice; ids must be unique", d.node.id.get_ref()),
            ));
        }
        if let Some(p) = &d.node.parallelism
            && *p.get_ref() == 0
        {
            return Err(loc.err(Some(p.span()), d.field("parallelism"), "parallelism 0; give it at least 1 subtask"));
        }
        let inputs = d.inputs();
        match (d.section, inputs.is_empty()) {
            ("source", false) => {
                return Err(loc.err(Some(inputs[0].span()), d.field("input"), "a source has no input; remove it"));
            }
            ("operator" | "sink", true) => {
                return Err(loc.err(
                    Some(d.node.id.span()),
                    d.field("input"),
                    format!("node `{}` has no input; add `input = \"<id>\"`", d.node.id.get_ref()),
                ));
            }
            _ => {}
        }
    }
    for d in &decls {
        for input in d.inputs() {
            if !by_id.contains_key(input.get_ref().as_str()) {
                return Err(loc.err(
                    Some(input.span()),
                    d.field("input"),
                    format!("`{}` is not a node of this job; check the spelling, or define it", input.get_ref()),
                ));
            }
        }
    }

    // Build in topological order; what cannot be ordered is on a cycle.
    let mut built: HashMap<String, Built> = HashMap::new();
    let mut tallies = Vec::new();
    let mut remaining: Vec<usize> = (0..decls.len()).collect();
    while !remaining.is_empty() {
        let ready = remaining
            .iter()
            .position(|&i| decls[i].inputs().iter().all(|inp| built.contains_key(inp.get_ref().as_str())));
        let Some(pos) = ready else {
            let d = &decls[remaining[0]];
            let ids: Vec<&str> = remaining.iter().map(|&i| decls[i].node.id.get_ref().as_str()).collect();
            return Err(loc.err(
                Some(d.inputs()[0].span()),
                d.field("input"),
                format!("the graph has a cycle through {}; remove an edge of the cycle", ids.join(", ")),
            ));
        };
        let d = &decls[remaining.remove(pos)];
        let out = build_node(&loc, &job, d, &built, &mut tallies)?;
        if let Some(out) = out {
            built.insert(d.node.id.get_ref().clone(), out);
        }
    }
    // What the builder accepts but the runtime cannot run (forward parallelism, key groups, ...).
    job.validate().map_err(|e| graph_error(&loc, &decls, e))?;
    Ok(LoadedJob { job, tallies })
}

pub(super) fn required<'a, T>(
    loc: &Loc,
    d: &Decl,
    value: &'a Option<Spanned<T>>,
    name: &str,
    hint: &str,
) -> Result<&'a T, JobFileError> {
    value.as_ref().map(|v| v.get_ref()).ok_or_else(|| {
        loc.err(
            Some(d.node.kind.span()),
            d.field(name),
            format!("a `{}` node needs `{name}`; {hint}", d.node.kind.get_ref()),
        )
    })
}

/// Map a runtime graph error to the node it names.
pub(super) fn graph_error(loc: &Loc, decls: &[Decl], e: GraphError) -> JobFileError {
    let node = match &e {
        GraphError::ForwardParallelism { to, .. } => Some((to.as_str(), "partitioning")),
        GraphError::KeyGroups { node, .. } | GraphError::Parallelism { node } => Some((node.as_str(), "parallelism")),
        GraphError::Dangling { node } => Some((node.as_str(), "id")),
        GraphError::DuplicateId { node } | GraphError::BadId { node } => Some((node.as_str(), "id")),
        GraphError::KeyedWithoutKeyBy { node, .. } | GraphError::NoInput { node } => Some((node.as_str(), "input")),
        GraphError::Window { node, .. } => Some((node.as_str(), "window")),
        _ => None,
    };
    match node.and_then(|(id, field)| decls.iter().find(|d| d.node.id.get_ref() == id).map(|d| (d, field))) {
        Some((d, field)) => {
            let span = match field {
                "parallelism" => d.node.parallelism.as_ref().map(|p| p.span()),
                "partitioning" => d.node.partitioning.as_ref().map(|p| p.span()),
                "window" => d.node.window.as_ref().map(|p| p.span()),
                _ => None,
            }
            .unwrap_or_else(|| d.node.id.span());
            loc.err(Some(span), d.field(field), e.to_string())
        }
        None => loc.err(None, "", e.to_string()),
    }
}
