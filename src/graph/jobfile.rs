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

use super::{GraphError, Job, KeyedStream, StateBackendKind, Stream};
use crate::io::{BodyFormat, FileSink, FileSinkConfig, Format, HttpSink, HttpSinkConfig, TcpSink, TcpSinkConfig};
use crate::operators::builtin::{CountingSink, Generator, NullSink, Silent, SumPerKey, Tally};
use crate::operators::{Halt, Sink, SubtaskInfo};
use crate::record::{Event, Record};
use crate::time::WatermarkStrategy;
use crate::window::{Aggregate, Aggregates, Window, WindowResult};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toml::Spanned;
use weir_ring::IdleStrategy;

/// A job file that cannot be run, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFileError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line (0 if unknown).
    pub line: usize,
    /// 1-based column (0 if unknown).
    pub column: usize,
    /// The field, e.g. `operator[1].input` (empty for syntax errors).
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl std::fmt::Display for JobFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // file:line:column, as compilers print it, so editors jump there; no position if unknown.
        match self.line {
            0 => write!(f, "{}: ", self.path.display())?,
            _ => write!(f, "{}:{}:{}: ", self.path.display(), self.line, self.column)?,
        }
        if !self.field.is_empty() {
            write!(f, "field `{}`: ", self.field)?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for JobFileError {}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct JobSection {
    name: Option<String>,
    max_key_groups: Option<Spanned<u32>>,
    ring_slots: Option<Spanned<u32>>,
    slot_bytes: Option<Spanned<u32>>,
    max_record_bytes: Option<Spanned<u32>>,
    idle: Option<Spanned<String>>,
    chaining: Option<bool>,
    pinning: Option<bool>,
    watermark_idle_timeout_ms: Option<u64>,
    state_backend: Option<Spanned<String>>,
    state_dir: Option<PathBuf>,
    checkpoint_dir: Option<PathBuf>,
    checkpoint_interval_ms: Option<Spanned<u64>>,
    checkpoint_timeout_ms: Option<Spanned<u64>>,
    checkpoints_retained: Option<Spanned<usize>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeSection {
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
struct File {
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

/// Replace `${VAR}` and `${VAR:-default}` with the environment's value (or the default);
/// `$$` is a literal `$`. An unset variable without a default is an error at its line and
/// column. Substitution stays within its line (a value with a newline is refused), so the
/// lines of later errors still match the file.
pub fn interpolate(path: &Path, text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, JobFileError> {
    let err = |line: usize, column: usize, message: String| JobFileError {
        path: path.to_owned(),
        line,
        column,
        field: String::new(),
        message,
    };
    let mut out = String::with_capacity(text.len());
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let column = line.len() - rest.len() + at + 1;
            let after = &rest[at + 1..];
            if let Some(r) = after.strip_prefix('$') {
                out.push('$');
                rest = r;
                continue;
            }
            let Some(body) = after.strip_prefix('{') else {
                out.push('$');
                rest = after;
                continue;
            };
            let Some(end) = body.find('}') else {
                return Err(err(n + 1, column, "`${` without a closing `}`; write `$$` for a literal `$`".into()));
            };
            let (name, default) = match body[..end].split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (&body[..end], None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(err(
                    n + 1,
                    column,
                    format!("`${{{}}}` is not a variable name (letters, digits, _)", &body[..end]),
                ));
            }
            let value = match (env(name), default) {
                (Some(v), _) => v,
                (None, Some(d)) => d.to_owned(),
                (None, None) => {
                    return Err(err(
                        n + 1,
                        column,
                        format!("environment variable {name} is not set; set it, or write ${{{name}:-default}}"),
                    ));
                }
            };
            if value.contains('\n') {
                return Err(err(n + 1, column, format!("environment variable {name} holds a newline")));
            }
            out.push_str(&value);
            rest = &body[end + 1..];
        }
        out.push_str(rest);
    }
    Ok(out)
}

struct Loc<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Loc<'_> {
    fn err(
        &self,
        span: Option<std::ops::Range<usize>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> JobFileError {
        let (line, column) = match span {
            Some(s) => {
                let before = &self.text[..s.start.min(self.text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
                (line, column)
            }
            None => (0, 0),
        };
        JobFileError { path: self.path.to_owned(), line, column, field: field.into(), message: message.into() }
    }
}

/// One node of the file, with where it sits.
struct Decl<'a> {
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

enum Built {
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

fn apply_job_section(loc: &Loc, job: &Job, s: &JobSection) -> Result<(), JobFileError> {
    let idle = match &s.idle {
        None => None,
        Some(v) => Some(match v.get_ref().as_str() {
            "park" => IdleStrategy::default(),
            "busy-spin" => IdleStrategy::BusySpin,
            "spin-yield" => IdleStrategy::SpinYield { spins: 100 },
            "backoff" => IdleStrategy::Backoff {
                spins: 64,
                yields: 8,
                min_sleep: Duration::from_micros(50),
                max_sleep: Duration::from_millis(1),
            },
            other => {
                return Err(loc.err(
                    Some(v.span()),
                    "job.idle",
                    format!("unknown idle strategy `{other}`; use park, busy-spin, spin-yield or backoff"),
                ));
            }
        }),
    };
    let backend = match &s.state_backend {
        None => None,
        Some(v) => Some(match v.get_ref().as_str() {
            "rocksdb" => StateBackendKind::RocksDb,
            "memory" => StateBackendKind::Memory,
            other => {
                return Err(loc.err(
                    Some(v.span()),
                    "job.state_backend",
                    format!("unknown state backend `{other}`; use rocksdb or memory"),
                ));
            }
        }),
    };
    for (v, field) in [
        (&s.checkpoint_interval_ms, "job.checkpoint_interval_ms"),
        (&s.checkpoint_timeout_ms, "job.checkpoint_timeout_ms"),
    ] {
        if let Some(v) = v
            && *v.get_ref() == 0
        {
            return Err(loc.err(Some(v.span()), field, "must be at least 1 ms"));
        }
    }
    if let Some(v) = &s.checkpoints_retained
        && *v.get_ref() == 0
    {
        return Err(loc.err(Some(v.span()), "job.checkpoints_retained", "must be at least 1 (the newest checkpoint)"));
    }
    let checkpoint_field = [&s.checkpoint_interval_ms, &s.checkpoint_timeout_ms]
        .into_iter()
        .flatten()
        .next()
        .map(|v| v.span())
        .or_else(|| s.checkpoints_retained.as_ref().map(|v| v.span()));
    if s.checkpoint_dir.is_none()
        && let Some(span) = checkpoint_field
    {
        return Err(loc.err(
            Some(span),
            "job.checkpoint_dir",
            "checkpoint settings need `checkpoint_dir` (where they go)",
        ));
    }
    job.configure(|c| {
        if let Some(dir) = &s.checkpoint_dir {
            let mut k = crate::checkpoint::CheckpointSettings::new(dir);
            if let Some(v) = &s.checkpoint_interval_ms {
                k.interval = Duration::from_millis(*v.get_ref());
            }
            if let Some(v) = &s.checkpoint_timeout_ms {
                k.timeout = Duration::from_millis(*v.get_ref());
            }
            if let Some(v) = &s.checkpoints_retained {
                k.retained = *v.get_ref();
            }
            c.checkpoints = Some(k);
        }
        if let Some(v) = &s.max_key_groups {
            c.max_key_groups = *v.get_ref();
        }
        if let Some(v) = &s.ring_slots {
            c.ring_slots = *v.get_ref();
        }
        if let Some(v) = &s.slot_bytes {
            c.slot_bytes = *v.get_ref();
        }
        if let Some(v) = &s.max_record_bytes {
            c.max_record_bytes = *v.get_ref();
        }
        if let Some(i) = idle {
            c.idle = i;
        }
        if let Some(v) = s.chaining {
            c.chaining = v;
        }
        if let Some(v) = s.pinning {
            c.pinning = v;
        }
        if let Some(ms) = s.watermark_idle_timeout_ms {
            c.watermark_idle_timeout = Some(Duration::from_millis(ms));
        }
        if let Some(b) = backend {
            c.state.backend = b;
        }
        if let Some(dir) = &s.state_dir {
            c.state.dir = Some(dir.clone());
        }
    });
    if let Err(e) = job.validate_settings() {
        let span = match &e {
            GraphError::Setting { field: "max_key_groups", .. } => s.max_key_groups.as_ref().map(|v| v.span()),
            _ => s.ring_slots.as_ref().or(s.slot_bytes.as_ref()).or(s.max_record_bytes.as_ref()).map(|v| v.span()),
        };
        let field = match &e {
            GraphError::Setting { field: "max_key_groups", .. } => "job.max_key_groups",
            _ => "job.ring_slots",
        };
        return Err(loc.err(span, field, e.to_string()));
    }
    Ok(())
}

fn required<'a, T>(
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

fn build_node(
    loc: &Loc,
    job: &Job,
    d: &Decl,
    built: &HashMap<String, Built>,
    tallies: &mut Vec<(String, Arc<Tally>)>,
) -> Result<Option<Built>, JobFileError> {
    let n = d.node;
    let id = n.id.get_ref().as_str();
    let kind = n.kind.get_ref().as_str();
    let parallelism = n.parallelism.as_ref().map(|p| *p.get_ref());
    check_io_fields(loc, d)?;
    let bad_kind = |expected: &str| {
        loc.err(Some(n.kind.span()), d.field("type"), format!("unknown {} type `{kind}`; use {expected}", d.section))
    };

    if d.section == "source" {
        let stream = match kind {
            "generator" => {
                let (count, keys, rate) = (n.count, n.keys.unwrap_or(1000), n.rate);
                if rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
                    return Err(loc.err(
                        Some(n.kind.span()),
                        d.field("rate"),
                        "rate must be a positive number of records per second per subtask",
                    ));
                }
                let jitter_ns = n.jitter_us.unwrap_or(0).saturating_mul(1000);
                job.source(id, parallelism.unwrap_or(1), move |info| {
                    let g = match count {
                        Some(c) => Generator::events(info, c, keys),
                        None => Generator::events(info, u64::MAX, keys),
                    };
                    let g = if jitter_ns > 0 { g.with_time_jitter(jitter_ns) } else { g };
                    match rate {
                        Some(r) => g.with_rate(r),
                        None => g,
                    }
                })
            }
            "silent" => job.source(id, parallelism.unwrap_or(1), |_| Silent),
            "kafka" => {
                let config = kafka_source_config(loc, d, job)?;
                let p = parallelism.unwrap_or(1);
                let prefetch = config.prefetch_budget_bytes();
                let gauge = config.lag_gauge(id);
                job.configure(|c| {
                    c.lag_gauges.push(gauge);
                    c.connector_memory.push((
                        format!("kafka source {id} prefetch ({p} x {})", crate::telemetry::bytes(prefetch)),
                        p as u64 * prefetch,
                    ))
                });
                // Event time on a Kafka source: watermarks per partition, from the source.
                let strategy = watermark_strategy(loc, d)?;
                let stream = job.source(id, p, move |info| {
                    let source = crate::io::kafka::KafkaSource::new(
                        config.clone(),
                        info,
                        crate::io::kafka::Json::<Event>::default(),
                    );
                    match strategy {
                        Some(s) => source.with_event_time(|e: &Event| e.time_ns, s),
                        None => source,
                    }
                });
                let stream = match &n.cpus {
                    Some(c) => stream.cpus(c),
                    None => stream,
                };
                return Ok(Some(Built::Plain(match strategy {
                    Some(_) => stream.with_source_watermarks(|e: &Event| e.time_ns),
                    None => stream,
                })));
            }
            _ => return Err(bad_kind("generator, silent or kafka")),
        };
        let stream = match &n.cpus {
            Some(c) => stream.cpus(c),
            None => stream,
        };
        let stream = event_time(loc, d, stream)?;
        return Ok(Some(Built::Plain(stream)));
    }

    // The input: one stream, or a union of plain streams.
    let inputs = d.inputs();
    let keyed_input = inputs.iter().any(|i| matches!(built[i.get_ref().as_str()], Built::Keyed(_)));
    if let Some(results) = inputs.iter().find(|i| matches!(built[i.get_ref().as_str()], Built::Results(..))) {
        let Built::Results(stream, event_time) = &built[results.get_ref().as_str()] else { unreachable!("matched") };
        if d.section != "sink" || inputs.len() > 1 {
            return Err(loc.err(
                Some(results.span()),
                d.field("input"),
                format!("`{}` emits window results; feed them into a sink, alone", results.get_ref()),
            ));
        }
        // Event-time window results name HTTP batches by window and key (idempotency by
        // content: a replay makes the same results). Processing-time ones keep keys by
        // position: no watermark would release them, and a replay counts differently anyway.
        let keys: Option<crate::io::RecordKeyFn<WindowResult>> =
            event_time.then(|| Arc::new(crate::io::window_result_key) as crate::io::RecordKeyFn<WindowResult>);
        sink_node(loc, job, d, id, kind, parallelism, tallies, keys, |i, p, s| stream.sink(i, p, move |info| s(info)))?;
        return Ok(None);
    }
    let keyed_ops = ["sum_per_key", "window"];
    if keyed_ops.contains(&kind) && !keyed_input {
        return Err(loc.err(
            Some(inputs[0].span()),
            d.field("input"),
            format!("`{id}` is keyed (type {kind}), but its input `{}` is not partitioned by key; put a key_by node between them", inputs[0].get_ref()),
        ));
    }
    if keyed_input && inputs.len() > 1 {
        return Err(loc.err(
            Some(inputs[1].span()),
            d.field("inputs"),
            "a keyed input cannot be unioned with others; key_by after the union instead",
        ));
    }
    if keyed_input {
        let Built::Keyed(keyed) = &built[inputs[0].get_ref().as_str()] else { unreachable!("checked above") };
        let out = match kind {
            "sum_per_key" => keyed.process(id, parallelism.unwrap_or(1), |_| SumPerKey::default()),
            "window" => {
                let out = window_node(loc, d, keyed, id, parallelism.unwrap_or(1))?;
                let event_time = n.event_time.as_ref().is_none_or(|e| *e.get_ref());
                return Ok(Some(Built::Results(out, event_time)));
            }
            "map" | "filter" | "flat_map" => {
                return Err(loc.err(Some(n.kind.span()), d.field("type"), "after a key_by, use a keyed operator (sum_per_key, window) or a sink; stateless operators go before the key_by"));
            }
            _ if d.section == "sink" => {
                sink_node(loc, job, d, id, kind, parallelism, tallies, None, |i, p, s| {
                    keyed.sink(i, p, move |info| s(info))
                })?;
                return Ok(None);
            }
            _ => return Err(bad_kind("sum_per_key, window, or a sink")),
        };
        return Ok(Some(Built::Plain(with_cpus(out, n))));
    }
    let mut stream = match &built[inputs[0].get_ref().as_str()] {
        Built::Plain(s) => s.clone(),
        Built::Keyed(_) | Built::Results(..) => unreachable!("keyed inputs and results handled above"),
    };
    for more in &inputs[1..] {
        if let Built::Plain(s) = &built[more.get_ref().as_str()] {
            stream = stream.union(s);
        }
    }
    if let Some(p) = &n.partitioning {
        stream = match p.get_ref().as_str() {
            "forward" => stream.forward(),
            "rebalance" => stream.rebalance(),
            "broadcast" => stream.broadcast(),
            other => {
                return Err(loc.err(
                    Some(p.span()),
                    d.field("partitioning"),
                    format!(
                        "unknown partitioning `{other}`; use forward, rebalance or broadcast (hash: add a key_by node)"
                    ),
                ));
            }
        };
    }

    if d.section == "sink" {
        sink_node(loc, job, d, id, kind, parallelism, tallies, None, |i, p, s| stream.sink(i, p, move |info| s(info)))?;
        return Ok(None);
    }
    let out = match kind {
        "key_by" => {
            let field = required(loc, d, &n.field, "field", "one of key, value, seq")?;
            let keyed = match field.as_str() {
                "key" => stream.key_by(id, |e: &Event| e.key),
                "value" => stream.key_by(id, |e: &Event| e.value),
                "seq" => stream.key_by(id, |e: &Event| e.seq),
                other => {
                    let span = n.field.as_ref().map(|f| f.span());
                    return Err(loc.err(
                        span,
                        d.field("field"),
                        format!("unknown field `{other}`; events have key, value, seq"),
                    ));
                }
            };
            return Ok(Some(Built::Keyed(keyed)));
        }
        "map" => {
            let f = required(loc, d, &n.function, "function", "one of identity, double_value, key_mod")?;
            match f.as_str() {
                "identity" => stream.map(id, |e: &Event| *e),
                "double_value" => stream.map(id, |e: &Event| Event { value: e.value * 2, ..*e }),
                "key_mod" => {
                    let m = n.modulus.unwrap_or(0);
                    if m == 0 {
                        return Err(loc.err(Some(n.kind.span()), d.field("modulus"), "key_mod needs `modulus` >= 1"));
                    }
                    stream.map(id, move |e: &Event| Event { key: e.key % m, ..*e })
                }
                other => return Err(unknown_function(loc, d, other, "identity, double_value, key_mod")),
            }
        }
        "filter" => {
            let f = required(loc, d, &n.function, "function", "one of key_even, value_below")?;
            match f.as_str() {
                "key_even" => stream.filter(id, |e: &Event| e.key.is_multiple_of(2)),
                "value_below" => {
                    let t = n.threshold.unwrap_or(50);
                    stream.filter(id, move |e: &Event| e.value < t)
                }
                other => return Err(unknown_function(loc, d, other, "key_even, value_below")),
            }
        }
        "flat_map" => {
            let f = required(loc, d, &n.function, "function", "repeat")?;
            match f.as_str() {
                "repeat" => {
                    let times = n.times.unwrap_or(2);
                    stream.flat_map(id, move |e: &Event| std::iter::repeat_n(*e, times as usize))
                }
                other => return Err(unknown_function(loc, d, other, "repeat")),
            }
        }
        "sum_per_key" | "window" => unreachable!("keyed operators were checked above"),
        _ => return Err(bad_kind("map, filter, flat_map, key_by, sum_per_key or window")),
    };
    let out = match parallelism {
        Some(p) => out.parallelism(p),
        None => out,
    };
    Ok(Some(Built::Plain(with_cpus(out, n))))
}

fn with_cpus<T: Record>(stream: Stream<T>, n: &NodeSection) -> Stream<T> {
    match &n.cpus {
        Some(c) => stream.cpus(c),
        None => stream,
    }
}

fn unknown_function(loc: &Loc, d: &Decl, name: &str, known: &str) -> JobFileError {
    let span = d.node.function.as_ref().map(|f| f.span());
    loc.err(span, d.field("function"), format!("unknown function `{name}`; built-ins here: {known}"))
}

/// A sink factory of any sink type, boxed so every branch below has one type.
type SinkMaker<T> = Arc<dyn Fn(&SubtaskInfo) -> Box<dyn Sink<T>> + Send + Sync>;

#[allow(clippy::too_many_arguments)] // the node's context, as the other builders take it
fn sink_node<T: Record + std::fmt::Display + serde::Serialize>(
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
fn io_fields(n: &NodeSection) -> [IoField; 11] {
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
fn check_io_fields(loc: &Loc, d: &Decl) -> Result<(), JobFileError> {
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
fn kafka_properties(d: &Decl) -> Vec<(String, String)> {
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
fn kafka_source_config(loc: &Loc, d: &Decl, job: &Job) -> Result<crate::io::kafka::KafkaSourceConfig, JobFileError> {
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
fn kafka_sink_config(loc: &Loc, d: &Decl, job: &Job) -> Result<crate::io::kafka::KafkaSinkConfig, JobFileError> {
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
fn format_field(loc: &Loc, d: &Decl) -> Result<Format, JobFileError> {
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

fn file_sink_config(loc: &Loc, d: &Decl) -> Result<FileSinkConfig, JobFileError> {
    let path = required(loc, d, &d.node.path, "path", "the directory for the part files")?;
    if path.trim().is_empty() {
        let span = d.node.path.as_ref().map(|p| p.span());
        return Err(loc.err(span, d.field("path"), "an empty path; name the directory for the part files"));
    }
    Ok(FileSinkConfig { format: format_field(loc, d)?, ..FileSinkConfig::new(path) })
}

fn tcp_sink_config(loc: &Loc, d: &Decl) -> Result<TcpSinkConfig, JobFileError> {
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

fn http_sink_config(loc: &Loc, d: &Decl, job_name: &str) -> Result<HttpSinkConfig, JobFileError> {
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
struct StdoutSink;

impl<T: std::fmt::Display> Sink<T> for StdoutSink {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        use std::io::Write;
        writeln!(std::io::stdout().lock(), "{record}").map_err(|e| Halt::failed(format!("stdout: {e}")))
    }
}

/// Map a runtime graph error to the node it names.
fn graph_error(loc: &Loc, decls: &[Decl], e: GraphError) -> JobFileError {
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

/// A source's event time and watermarks (`timestamp = "time_ns"` and friends): an
/// assigner after the source.
fn event_time(loc: &Loc, d: &Decl, stream: Stream<Event>) -> Result<Stream<Event>, JobFileError> {
    match watermark_strategy(loc, d)? {
        Some(strategy) => {
            let id = format!("{}.wm", d.node.id.get_ref());
            Ok(stream.with_event_time(&id, |e: &Event| e.time_ns, strategy))
        }
        None => Ok(stream),
    }
}

/// The watermark strategy of a source declaration, `None` without `timestamp`.
fn watermark_strategy(loc: &Loc, d: &Decl) -> Result<Option<WatermarkStrategy>, JobFileError> {
    let n = d.node;
    let Some(field) = &n.timestamp else {
        let stray = [
            ("max_out_of_orderness_ms", n.max_out_of_orderness_ms.is_some()),
            ("watermark_every", n.watermark_every.is_some()),
            ("watermark_interval_ms", n.watermark_interval_ms.is_some()),
        ];
        if let Some((name, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(loc.err(
                Some(n.kind.span()),
                d.field(name),
                format!("`{name}` needs event time: add `timestamp = \"time_ns\"`"),
            ));
        }
        return Ok(None);
    };
    if field.get_ref() != "time_ns" {
        return Err(loc.err(
            Some(field.span()),
            d.field("timestamp"),
            format!("unknown timestamp field `{}`; events carry their event time in `time_ns`", field.get_ref()),
        ));
    }
    let mut strategy = WatermarkStrategy::bounded(Duration::from_millis(n.max_out_of_orderness_ms.unwrap_or(0)));
    if let Some(every) = &n.watermark_every {
        if *every.get_ref() == 0 {
            return Err(loc.err(
                Some(every.span()),
                d.field("watermark_every"),
                "watermark_every must be at least 1 record",
            ));
        }
        strategy = strategy.every_records(Some(*every.get_ref()));
    }
    if let Some(ms) = n.watermark_interval_ms {
        strategy = strategy.interval(Some(Duration::from_millis(ms)));
    }
    Ok(Some(strategy))
}

/// A `window` operator after a key_by.
fn window_node(
    loc: &Loc,
    d: &Decl,
    keyed: &KeyedStream<Event, u64>,
    id: &str,
    parallelism: u32,
) -> Result<Stream<WindowResult>, JobFileError> {
    let n = d.node;
    let shape = required(loc, d, &n.window, "window", "one of tumbling, sliding, session")?;
    let ms = |value: &Option<Spanned<u64>>, name: &str| -> Result<Duration, JobFileError> {
        let v = value.as_ref().ok_or_else(|| {
            let span = n.window.as_ref().map(|w| w.span());
            loc.err(span, d.field(name), format!("a {shape} window needs `{name}`"))
        })?;
        if *v.get_ref() == 0 {
            return Err(loc.err(Some(v.span()), d.field(name), format!("`{name}` must be at least 1")));
        }
        Ok(Duration::from_millis(*v.get_ref()))
    };
    let window = match shape.as_str() {
        "tumbling" => Window::tumbling(ms(&n.size_ms, "size_ms")?),
        "sliding" => {
            let (size, slide) = (ms(&n.size_ms, "size_ms")?, ms(&n.slide_ms, "slide_ms")?);
            if slide > size {
                let span = n.slide_ms.as_ref().map(|s| s.span());
                return Err(loc.err(
                    span,
                    d.field("slide_ms"),
                    "the slide is longer than the window; make slide_ms at most size_ms",
                ));
            }
            Window::sliding(size, slide)
        }
        "session" => Window::session(ms(&n.gap_ms, "gap_ms")?),
        other => {
            let span = n.window.as_ref().map(|w| w.span());
            return Err(loc.err(
                span,
                d.field("window"),
                format!("unknown window `{other}`; use tumbling, sliding or session"),
            ));
        }
    };
    let event_time = n.event_time.as_ref().is_none_or(|e| *e.get_ref());
    let window = if event_time { window } else { window.processing_time() };
    if event_time && keyed.event_time().is_none() {
        let span = n.event_time.as_ref().map(|e| e.span()).unwrap_or_else(|| n.kind.span());
        return Err(loc.err(
            Some(span),
            d.field("event_time"),
            "an event-time window needs event time on its input: set `timestamp = \"time_ns\"` on the source, or `event_time = false` for processing time",
        ));
    }
    let Some(names) = &n.aggregate else {
        return Err(loc.err(
            Some(n.kind.span()),
            d.field("aggregate"),
            "a window needs `aggregate`, e.g. [\"count\", \"sum\"]",
        ));
    };
    if names.get_ref().is_empty() {
        return Err(loc.err(
            Some(names.span()),
            d.field("aggregate"),
            "aggregate nothing? list at least one of count, sum, min, max, mean",
        ));
    }
    let value: fn(&Event) -> u64 = match n.value.as_ref().map(|v| v.get_ref().as_str()) {
        None | Some("value") => |e| e.value,
        Some("seq") => |e| e.seq,
        Some("key") => |e| e.key,
        Some(other) => {
            let span = n.value.as_ref().map(|v| v.span());
            return Err(loc.err(
                span,
                d.field("value"),
                format!("unknown field `{other}`; aggregate value, seq or key"),
            ));
        }
    };
    let mut aggregates = Aggregates::of(value);
    for name in names.get_ref() {
        match Aggregate::from_name(name.get_ref()) {
            Some(a) => aggregates = aggregates.with(a),
            None => {
                return Err(loc.err(
                    Some(name.span()),
                    d.field("aggregate"),
                    format!("unknown aggregate `{}`; use count, sum, min, max or mean", name.get_ref()),
                ));
            }
        }
    }
    let mut windowed = keyed.window(window).allowed_lateness(Duration::from_millis(n.allowed_lateness_ms.unwrap_or(0)));
    if let Some(mb) = &n.cache_mb {
        let bytes = mb.get_ref().saturating_mul(1024 * 1024);
        if bytes < crate::window::MIN_CACHE_BYTES {
            return Err(loc.err(Some(mb.span()), d.field("cache_mb"), "cache_mb must be at least 1"));
        }
        windowed = windowed.cache_bytes(bytes);
    }
    Ok(with_cpus(windowed.aggregate(id, parallelism, aggregates), n))
}

#[cfg(test)]
mod interpolation_tests {
    use super::*;

    fn run(text: &str) -> Result<String, JobFileError> {
        interpolate(Path::new("j.toml"), text, &|n| (n == "HOST").then(|| "kafka:9092".to_owned()))
    }

    /// Set variables, defaults, `$$`, and the errors with line and column.
    #[test]
    fn variables_defaults_and_errors() {
        assert_eq!(run("a = \"${HOST}\"\nb = \"${PORT:-80}\"\n").unwrap(), "a = \"kafka:9092\"\nb = \"80\"\n");
        assert_eq!(run("price = \"$$5 and $x\"").unwrap(), "price = \"$5 and $x\"");
        let e = run("a = 1\nb = \"${MISSING}\"\n").unwrap_err();
        assert_eq!((e.line, e.column), (2, 6));
        assert!(e.message.contains("MISSING is not set") && e.message.contains("${MISSING:-default}"), "{}", e.message);
        assert!(run("a = \"${HOST\"").unwrap_err().message.contains("closing"));
        assert!(run("a = \"${HO ST}\"").unwrap_err().message.contains("not a variable name"));
    }
}
