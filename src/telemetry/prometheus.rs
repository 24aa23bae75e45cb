//! Prometheus exposition of a job's counters file: `weir run --metrics ADDR`,
//! `weir-stat --serve ADDR`, or [`MetricsServer::start`] for a program that embeds a job.
//!
//! Every scrape reads the counters file (shared memory, read-only) and encodes what it
//! holds, so a job that is stuck — a subtask wedged in a sink, a checkpoint that cannot
//! complete — is still scraped, and a server outside the job's process (`weir-stat
//! --serve`) shows the same series. Names and types follow Prometheus' conventions: base
//! units in the name (`_seconds`, `_bytes`, `_records`), counters end in `_total`,
//! ratios in `_ratio`; labels say whose a series is: `weir_job`, and `subtask`
//! (`head-node#index`), `node` and `index`, `channel` with its `sender` and `receiver`, or
//! `node` and `partition` (source lag), `weir_instance` (an instance of a shared job), `topic`
//! and `partition` (the partitions it serves). The job's name is `weir_job`, not `job`: `job` is
//! the label Prometheus itself gives every target.
//!
//! The text is OpenMetrics 1.0, encoded by `prometheus-client` (the Prometheus project's
//! Rust client); the server is `tiny_http`, one thread, loopback by default.

use super::counters::{CounterKind, LATENCY, channel_fill, latency_window_current, partition_owner, unix_ms_now};
use super::waiting::Wait;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::thread::JoinHandle;
use weir_ring::counters::{CounterValue, CountersError, CountersReader};

/// Whether a latency kind is of the whole run (since the start), not of the last second.
fn latency_all(kind: CounterKind) -> bool {
    use CounterKind::*;
    matches!(
        kind,
        IngestLatencyAllP50Us
            | IngestLatencyAllP99Us
            | IngestLatencyAllP999Us
            | IngestLatencyAllMaxUs
            | EventLatencyAllP50Us
            | EventLatencyAllP99Us
            | EventLatencyAllP999Us
            | EventLatencyAllMaxUs
    )
}

/// The content type of what [`encode`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The port of `--metrics PORT` and the documented default (9464, the port OpenTelemetry's
/// Prometheus exporters use).
pub const DEFAULT_PORT: u16 = 9464;

/// Whose a counter is, by its kind: how its owner string becomes labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// `head-node#index`: label `subtask`.
    Subtask,
    /// `node#index`: labels `node`, `index`.
    Node,
    /// `node#index@subtask`: labels `node`, `index`, `subtask`.
    NodeInChain,
    /// `sender#i->receiver#j`: labels `channel`, `sender`, `receiver`.
    Channel,
    /// `node[partition]`: labels `node`, `partition`.
    Partition,
    /// `node` (a sink node, all its subtasks): label `node`.
    Sink,
    /// An instance of a shared job, by its name: label `weir_instance`.
    Instance,
    /// `topic[partition]` (a partition of an instance's lead input): labels `topic`,
    /// `partition`.
    TopicPartition,
    /// The job: no label of its own.
    Job,
}

/// One series family: its name (a counter's without `_total`, which the encoder adds),
/// help, type, the stored units per base unit (1: an integer, written as one), whose, and
/// for the sink's latency quantiles, the quantile.
struct Spec {
    name: &'static str,
    help: &'static str,
    counter: bool,
    scale: f64,
    owner: Owner,
    quantile: Option<&'static str>,
}

/// Stored units per base unit: ns, µs and ms per second. 1: stored in the base unit.
const NS: f64 = 1e9;
const US: f64 = 1e6;
const MS: f64 = 1e3;

/// What a counter kind is in Prometheus. Every kind has one (a test checks).
fn spec(kind: CounterKind) -> Spec {
    use CounterKind::*;
    use Owner::*;
    let s = |name, help, counter, scale, owner| Spec { name, help, counter, scale, owner, quantile: None };
    let ack = |q| Spec {
        name: "weir_sink_ack_latency_seconds",
        help: "Sink acknowledgement latency (sent to acknowledged) over the last completed second, by quantile (1: max)",
        counter: false,
        scale: US,
        owner: Sink,
        quantile: Some(q),
    };
    let e2e = |name, help, q| Spec { name, help, counter: false, scale: US, owner: Node, quantile: Some(q) };
    const INGEST: &str = "End-to-end latency at the sink subtask, ingest (its source emitted the record) to acknowledged \
                          by the destination, over the last completed second, by quantile (1: max); sampled by latency \
                          markers";
    const INGEST_ALL: &str =
        "End-to-end latency at the sink subtask, ingest to acknowledged, since it started, by quantile (1: max)";
    const EVENT: &str = "End-to-end latency at the sink subtask, event time (a window's result: its end) to \
                         acknowledged, over the last completed second, by quantile (1: max); sampled by latency markers";
    const EVENT_ALL: &str =
        "End-to-end latency at the sink subtask, event time to acknowledged, since it started, by quantile (1: max)";
    let (ingest, ingest_all) = ("weir_sink_ingest_latency_seconds", "weir_sink_ingest_latency_since_start_seconds");
    let (event, event_all) = ("weir_sink_event_latency_seconds", "weir_sink_event_latency_since_start_seconds");
    match kind {
        IngestLatencyP50Us => e2e(ingest, INGEST, "0.5"),
        IngestLatencyP99Us => e2e(ingest, INGEST, "0.99"),
        IngestLatencyP999Us => e2e(ingest, INGEST, "0.999"),
        IngestLatencyMaxUs => e2e(ingest, INGEST, "1"),
        IngestLatencyAllP50Us => e2e(ingest_all, INGEST_ALL, "0.5"),
        IngestLatencyAllP99Us => e2e(ingest_all, INGEST_ALL, "0.99"),
        IngestLatencyAllP999Us => e2e(ingest_all, INGEST_ALL, "0.999"),
        IngestLatencyAllMaxUs => e2e(ingest_all, INGEST_ALL, "1"),
        EventLatencyP50Us => e2e(event, EVENT, "0.5"),
        EventLatencyP99Us => e2e(event, EVENT, "0.99"),
        EventLatencyP999Us => e2e(event, EVENT, "0.999"),
        EventLatencyMaxUs => e2e(event, EVENT, "1"),
        EventLatencyAllP50Us => e2e(event_all, EVENT_ALL, "0.5"),
        EventLatencyAllP99Us => e2e(event_all, EVENT_ALL, "0.99"),
        EventLatencyAllP999Us => e2e(event_all, EVENT_ALL, "0.999"),
        EventLatencyAllMaxUs => e2e(event_all, EVENT_ALL, "1"),
        LatencyMarkers => s(
            "weir_sink_latency_markers",
            "Latency markers the sink subtask timed (acknowledged by the destination)",
            true,
            1.0,
            Node,
        ),
        BusyNs => s(
            "weir_subtask_busy_seconds",
            "Time the subtask spent processing (busy, backpressured, idle and waiting add up to its wall time, counted \
             live)",
            true,
            NS,
            Subtask,
        ),
        WaitingNs => s(
            "weir_subtask_waiting_seconds",
            "Time the subtask waited on the outside: a destination, a broker, another process",
            true,
            NS,
            Subtask,
        ),
        BackpressuredNs => s(
            "weir_subtask_backpressured_seconds",
            "Time the subtask waited for credit on an output (backpressure)",
            true,
            NS,
            Subtask,
        ),
        IdleNs => s("weir_subtask_idle_seconds", "Time the subtask waited for input", true, NS, Subtask),
        SubtaskRecordsIn => s(
            "weir_subtask_records_in",
            "Records into the subtask's chain (read from its inputs, or produced by its source)",
            true,
            1.0,
            Subtask,
        ),
        SubtaskState => s("weir_subtask_state", "Subtask state: 1 running, 2 finished, 3 failed", false, 1.0, Subtask),
        ChainPosition => s(
            "weir_node_chain_position",
            "Position of the node in the chain of operators its subtask runs (0: the head)",
            false,
            1.0,
            NodeInChain,
        ),
        RecordsIn => s("weir_node_records_in", "Records the node received (a source: produced)", true, 1.0, Node),
        RecordsOut => s("weir_node_records_out", "Records the node emitted", true, 1.0, Node),
        LateRecords => s("weir_node_late_records", "Records dropped for coming behind the watermark", true, 1.0, Node),
        EvictedKeys => s("weir_node_evicted_keys", "Keys the node's cache evicted to the state store", true, 1.0, Node),
        ChannelSlots => s("weir_channel_slots", "Slots in the channel's ring", false, 1.0, Channel),
        ChannelBacklog => s("weir_channel_used_slots", "Used slots of the channel (sampled)", false, 1.0, Channel),
        ChannelCredit => s(
            "weir_channel_free_slots",
            "Free slots of the channel: the sender's credit (sampled)",
            false,
            1.0,
            Channel,
        ),
        ChannelBlockedNs => s(
            "weir_channel_sender_blocked_seconds",
            "Time the sender waited for credit on this channel",
            true,
            NS,
            Channel,
        ),
        ChannelAnnounced => s(
            "weir_channel_announced_slots",
            "The receiver's announced credit limit (credit by time; the slot count when none)",
            false,
            1.0,
            Channel,
        ),
        ChannelDrainRate => s(
            "weir_channel_drain_rate_slots_per_second",
            "How fast the receiver drains the channel while not idle (smoothed; 0 until measured)",
            false,
            1.0,
            Channel,
        ),
        ChannelDrainUs => s(
            "weir_channel_drain_time_seconds",
            "Time the used slots take to drain at the drain rate (sampled)",
            false,
            US,
            Channel,
        ),
        RssBytes => s("weir_job_resident_memory_bytes", "Resident set size of the job's process", false, 1.0, Job),
        BudgetBytes => s("weir_job_memory_budget_bytes", "The job's declared memory budget", false, 1.0, Job),
        JobState => s("weir_job_state", "Job state: 1 running, 2 finished, 3 failed", false, 1.0, Job),
        CheckpointId => {
            s("weir_checkpoint_last_id", "Id of the last completed checkpoint (0: none yet)", false, 1.0, Job)
        }
        CheckpointDurationNs => s(
            "weir_checkpoint_duration_seconds",
            "Duration of the last completed checkpoint, trigger to manifest",
            false,
            NS,
            Job,
        ),
        CheckpointAlignmentNs => s(
            "weir_checkpoint_alignment_seconds",
            "The longest barrier alignment of the last completed checkpoint",
            false,
            NS,
            Job,
        ),
        CheckpointBytes => s("weir_checkpoint_size_bytes", "Bytes of the last completed checkpoint", false, 1.0, Job),
        CheckpointsCompleted => s("weir_checkpoints_completed", "Checkpoints completed", true, 1.0, Job),
        CheckpointsFailed => s("weir_checkpoints_failed", "Checkpoints expired or declined", true, 1.0, Job),
        SourceLag => s(
            "weir_source_lag_records",
            "Records of the source partition not yet read (consumer lag)",
            false,
            1.0,
            Partition,
        ),
        SinkRecords => s("weir_sink_records", "Records the sink took", true, 1.0, Sink),
        SinkAcked => s("weir_sink_acked_records", "Records the destination acknowledged", true, 1.0, Sink),
        SinkInFlight => s("weir_sink_in_flight", "Requests or records sent and not yet acknowledged", false, 1.0, Sink),
        SinkRetries => s("weir_sink_retries", "Retries and client errors recovered from", true, 1.0, Sink),
        SinkDeadLetters => {
            s("weir_sink_dead_letter_records", "Records sent to a dead-letter destination", true, 1.0, Sink)
        }
        SinkBlockedNs => s("weir_sink_blocked_seconds", "Time the sink waited for its destination", true, NS, Sink),
        InstanceGenerations => s(
            "weir_instance_generations",
            "Generations the instance started (one per assignment of partitions, or after a failure)",
            true,
            1.0,
            Instance,
        ),
        GroupGeneration => s(
            "weir_instance_group_generation",
            "The consumer group's generation, as its coordinator last gave it (0: not known)",
            false,
            1.0,
            Instance,
        ),
        InstanceRebalances => {
            s("weir_instance_rebalances", "Rebalances the instance took part in", true, 1.0, Instance)
        }
        HandoverNs => s(
            "weir_instance_handover_seconds",
            "The last handover: from the assignment changing to the job running on the new one",
            false,
            NS,
            Instance,
        ),
        MovedPartitions => s(
            "weir_instance_moved_partitions",
            "Partitions the instance took over from other instances",
            true,
            1.0,
            Instance,
        ),
        MovedBytes => s(
            "weir_instance_moved_bytes",
            "Bytes fetched from the checkpoint store for partitions taken over",
            true,
            1.0,
            Instance,
        ),
        RestoredBytes => s(
            "weir_instance_restored_bytes",
            "Bytes fetched from the checkpoint store to restore partitions",
            true,
            1.0,
            Instance,
        ),
        PartitionOwned => s(
            "weir_instance_partition_owned",
            "1 while this instance serves the partition of the job's lead input, 0 while another does",
            false,
            1.0,
            TopicPartition,
        ),
        SinkAckNewestMs => s(
            "weir_sink_ack_last_timestamp_seconds",
            "When the sink's newest acknowledgement was timed (Unix time; absent: none yet)",
            false,
            MS,
            Sink,
        ),
        LatencyWindowEndMs => s(
            "weir_sink_latency_window_end_timestamp_seconds",
            "When the last completed second of the sink subtask's latency figures ended (Unix time); the figures are \
             NaN once it is more than 2.5 s old",
            false,
            MS,
            Node,
        ),
        LatencyNewestMs => s(
            "weir_sink_latency_last_sample_timestamp_seconds",
            "When the sink subtask's newest latency marker was timed (Unix time; absent: none yet)",
            false,
            MS,
            Node,
        ),
        SinkAckP50Us => ack("0.5"),
        SinkAckP99Us => ack("0.99"),
        SinkAckMaxUs => ack("1"),
    }
}

type Labels = Vec<(String, String)>;

/// A label value escaped as the text format wants (`prometheus-client` writes them as
/// given): backslash, double quote and line feed. Node and job names are the user's.
fn escaped(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The labels of a counter of `owner` kind owned by `o`, after `weir_job`.
fn labels(job: &str, owner: Owner, o: &str) -> Labels {
    let mut l = vec![("weir_job".to_owned(), escaped(job))];
    let mut add = |k: &str, v: &str| l.push((k.to_owned(), escaped(v)));
    match owner {
        Owner::Subtask => add("subtask", o),
        Owner::Node => match o.rsplit_once('#') {
            Some((node, index)) => {
                add("node", node);
                add("index", index);
            }
            None => add("node", o),
        },
        Owner::NodeInChain => {
            let (node, subtask) = o.split_once('@').unwrap_or((o, ""));
            match node.rsplit_once('#') {
                Some((node, index)) => {
                    add("node", node);
                    add("index", index);
                }
                None => add("node", node),
            }
            add("subtask", subtask);
        }
        Owner::Channel => {
            add("channel", o);
            if let Some((sender, receiver)) = o.split_once("->") {
                add("sender", sender);
                add("receiver", receiver);
            }
        }
        Owner::Partition | Owner::TopicPartition => {
            let name = if owner == Owner::Partition { "node" } else { "topic" };
            match partition_owner(o) {
                Some((of, partition)) => {
                    add(name, of);
                    add("partition", partition);
                }
                None => add(name, o),
            }
        }
        Owner::Sink => add("node", o),
        Owner::Instance => add("weir_instance", o),
        Owner::Job => {}
    }
    l
}

/// A sample: an integer count or a value in a base unit.
#[derive(Clone, Copy)]
enum Value {
    Int(u64),
    Float(f64),
}

/// The series of one family, gathered before it is registered.
#[derive(Default)]
struct Gathered {
    help: &'static str,
    counter: bool,
    series: Vec<(Labels, Value)>,
}

/// The counters of job `job` (`alive`: its process still runs) as OpenMetrics text.
/// Counters of kinds this build does not know are left out. Besides the counters:
/// `weir_job_up` (1 while the job's process lives) and `weir_channel_fill_ratio` (per
/// channel, [`channel_fill`]).
///
/// No stale figure passes for a current one: a latency quantile with no sample in its window
/// is NaN (as Prometheus' own clients write a summary's quantiles with no observation), and so
/// is every quantile of a sink subtask's last second once that second ended more than
/// [`LATENCY_WINDOW_STALE_MS`](super::counters::LATENCY_WINDOW_STALE_MS) ago (the sink has not moved since); a timestamp of nothing yet is
/// left out.
pub fn encode(job: &str, alive: bool, counters: &[CounterValue]) -> String {
    encode_at(job, alive, counters, &[], unix_ms_now())
}

/// [`encode`], and the waits in progress (the job's waits file,
/// [`read_waits`](super::waiting::read_waits)) as `weir_subtask_wait_seconds{subtask, on}`:
/// how long each has lasted, labelled with what it waits on.
pub fn encode_with_waits(job: &str, alive: bool, counters: &[CounterValue], waits: &[Wait]) -> String {
    encode_at(job, alive, counters, waits, unix_ms_now())
}

/// [`encode_with_waits`] at wall clock `now_ms` (Unix ms).
fn encode_at(job: &str, alive: bool, counters: &[CounterValue], waits: &[Wait], now_ms: u64) -> String {
    // Sink subtasks whose last second is current.
    let current: std::collections::BTreeSet<&str> = counters
        .iter()
        .filter(|c| c.type_id == CounterKind::LatencyWindowEndMs.type_id() && latency_window_current(c.value, now_ms))
        .map(|c| c.owner.as_str())
        .collect();
    let mut families: BTreeMap<&'static str, Gathered> = BTreeMap::new();
    let mut put = |name: &'static str, help: &'static str, counter: bool, labels: Labels, value: Value| {
        let g = families.entry(name).or_default();
        g.help = help;
        g.counter = counter;
        g.series.push((labels, value));
    };
    put(
        "weir_job_up",
        "1 while the job's process runs",
        false,
        labels(job, Owner::Job, ""),
        Value::Int(u64::from(alive)),
    );
    // Per channel: (slots, announced, used) to derive the fill ratio.
    let mut fill: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for c in counters {
        let Some(kind) = CounterKind::from_type_id(c.type_id) else { continue };
        let spec = spec(kind);
        let timestamp = matches!(
            kind,
            CounterKind::SinkAckNewestMs | CounterKind::LatencyWindowEndMs | CounterKind::LatencyNewestMs
        );
        if timestamp && c.value == 0 {
            continue;
        }
        let mut l = labels(job, spec.owner, &c.owner);
        if let Some(q) = spec.quantile {
            l.push(("quantile".to_owned(), q.to_owned()));
        }
        // A quantile is never below 1 µs: 0 is "no sample". A last second that is not current
        // has none either.
        let last_second = LATENCY[..16].contains(&kind) && !latency_all(kind);
        let no_sample =
            spec.quantile.is_some() && (c.value == 0 || (last_second && !current.contains(c.owner.as_str())));
        let value = if no_sample {
            Value::Float(f64::NAN)
        } else if spec.scale == 1.0 {
            Value::Int(c.value)
        } else {
            Value::Float(c.value as f64 / spec.scale)
        };
        put(spec.name, spec.help, spec.counter, l, value);
        match kind {
            CounterKind::ChannelSlots => fill.entry(c.owner.as_str()).or_default().0 = c.value,
            CounterKind::ChannelAnnounced => fill.entry(c.owner.as_str()).or_default().1 = c.value,
            CounterKind::ChannelBacklog => fill.entry(c.owner.as_str()).or_default().2 = c.value,
            _ => {}
        }
    }
    for w in waits {
        let mut l = labels(job, Owner::Subtask, &w.subtask);
        l.push(("on".to_owned(), escaped(&w.what)));
        let help = "How long the subtask has been waiting on the outside, by what it waits on (while it waits)";
        let s = now_ms.saturating_sub(w.since_ms) as f64 / 1e3;
        put("weir_subtask_wait_seconds", help, false, l, Value::Float(s));
    }
    for (channel, (slots, announced, used)) in fill {
        if let Some(ratio) = channel_fill(slots, announced, used) {
            let help = "Used slots over what the sender may fill (the receiver's announced credit limit, else the \
                        slots; sampled): 1 is a full channel, its sender backpressured";
            put("weir_channel_fill_ratio", help, false, labels(job, Owner::Channel, channel), Value::Float(ratio));
        }
    }
    let mut registry = Registry::default();
    for (name, g) in families {
        // A family is all integers or all floats (one kind, or the quantiles of one).
        let float = g.series.iter().any(|(_, v)| matches!(v, Value::Float(_)));
        let f64_of = |v: Value| match v {
            Value::Int(i) => i as f64,
            Value::Float(x) => x,
        };
        match (g.counter, float) {
            (true, false) => {
                let f = Family::<Labels, Counter<u64, AtomicU64>>::default();
                for (l, v) in &g.series {
                    f.get_or_create(l).inc_by(f64_of(*v) as u64);
                }
                registry.register(name, g.help, f);
            }
            (true, true) => {
                let f = Family::<Labels, Counter<f64, AtomicU64>>::default();
                for (l, v) in &g.series {
                    f.get_or_create(l).inc_by(f64_of(*v));
                }
                registry.register(name, g.help, f);
            }
            (false, false) => {
                let f = Family::<Labels, Gauge<i64, AtomicI64>>::default();
                for (l, v) in &g.series {
                    let Value::Int(i) = *v else { unreachable!("an integer family") };
                    f.get_or_create(l).set(i64::try_from(i).unwrap_or(i64::MAX));
                }
                registry.register(name, g.help, f);
            }
            (false, true) => {
                let f = Family::<Labels, Gauge<f64, AtomicU64>>::default();
                for (l, v) in &g.series {
                    f.get_or_create(l).set(f64_of(*v));
                }
                registry.register(name, g.help, f);
            }
        }
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoding into a String cannot fail");
    text
}

/// The labels a series of `owner` kind carries besides `weir_job`.
fn label_names(owner: Owner) -> &'static [&'static str] {
    match owner {
        Owner::Subtask => &["subtask"],
        Owner::Node => &["node", "index"],
        Owner::NodeInChain => &["node", "index", "subtask"],
        Owner::Channel => &["channel", "sender", "receiver"],
        Owner::Partition => &["node", "partition"],
        Owner::Sink => &["node"],
        Owner::Instance => &["weir_instance"],
        Owner::TopicPartition => &["topic", "partition"],
        Owner::Job => &[],
    }
}

/// The reference page of every series [`encode`] writes: name, type, labels, what it
/// measures (`weir::guide::reference::metrics`; `tests/reference.rs` keeps the committed copy
/// equal to this).
pub fn reference() -> String {
    struct Row {
        name: String,
        kind: &'static str,
        labels: Vec<&'static str>,
        quantiles: Vec<&'static str>,
        help: &'static str,
    }
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    let mut add = |name: &str, counter: bool, owner: Owner, quantile: Option<&'static str>, help: &'static str| {
        let name = if counter { format!("{name}_total") } else { name.to_owned() };
        let row = rows.entry(name.clone()).or_insert_with(|| Row {
            name,
            kind: if counter { "counter" } else { "gauge" },
            labels: label_names(owner).to_vec(),
            quantiles: Vec::new(),
            help,
        });
        if let Some(q) = quantile {
            row.quantiles.push(q);
        }
    };
    add("weir_job_up", false, Owner::Job, None, "1 while the job's process runs");
    add(
        "weir_channel_fill_ratio",
        false,
        Owner::Channel,
        None,
        "Used slots over what the sender may fill (the receiver's announced credit limit, else the slots; sampled): 1 \
         is a full channel, its sender backpressured",
    );
    for kind in CounterKind::ALL {
        let s = spec(kind);
        add(s.name, s.counter, s.owner, s.quantile, s.help);
    }
    let mut out = String::from(
        "# Metrics\n\n\
         Every series `weir run --metrics ADDR`, `weir-stat --serve ADDR` and\n\
         `weir::telemetry::prometheus::MetricsServer` expose (OpenMetrics text, read from the job's counters file\n\
         on every scrape). Generated from `src/telemetry/prometheus.rs`; every series also has the label\n\
         `weir_job` (the job's name). Units are in the names: seconds, bytes, records; a `quantile` label of 1 is\n\
         the maximum.\n\n\
         | series | type | labels | what |\n|---|---|---|---|\n",
    );
    for r in rows.values() {
        let mut labels = r.labels.join(", ");
        if !r.quantiles.is_empty() {
            if !labels.is_empty() {
                labels.push_str(", ");
            }
            labels.push_str(&format!("quantile ({})", r.quantiles.join(", ")));
        }
        let labels = if labels.is_empty() { "–".to_owned() } else { labels };
        out.push_str(&format!("| `{}` | {} | {labels} | {} |\n", r.name, r.kind, r.help));
    }
    out
}

/// Why the metrics server could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address is not `PORT`, `HOST:PORT` or `[IPv6]:PORT`, or does not resolve.
    #[error(
        "metrics address {given:?}: {reason}; give PORT (served on 127.0.0.1), HOST:PORT or [IPv6]:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}"
    )]
    Address {
        /// What was given.
        given: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The address could not be bound (in use, not this host's, a privileged port).
    #[error("cannot serve metrics on {addr}: {source}{hint}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The bind error.
        source: std::io::Error,
        /// What to do about it.
        hint: String,
    },
    /// The job's counters file cannot be read.
    #[error("cannot serve metrics: {0}")]
    Counters(#[from] CountersError),
}

/// Parse a metrics address: `PORT` (on loopback), `HOST:PORT`, `[IPv6]:PORT`.
pub fn parse_address(given: &str) -> Result<SocketAddr, MetricsError> {
    let err = |reason: String| MetricsError::Address { given: given.to_owned(), reason };
    let given = given.trim();
    if given.is_empty() {
        return Err(err("empty".to_owned()));
    }
    if let Ok(port) = given.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if !given.contains(':') {
        return Err(err("no port".to_owned()));
    }
    let mut addrs = given.to_socket_addrs().map_err(|e| err(e.to_string()))?;
    addrs.next().ok_or_else(|| err("resolves to no address".to_owned()))
}

/// A bound metrics address, not yet serving: bind before the job starts (so a port in use
/// fails before the job does anything), serve once its counters file exists.
#[derive(Debug)]
pub struct MetricsListener {
    addr: SocketAddr,
    listener: TcpListener,
}

impl MetricsListener {
    /// Bind `addr` (see [`parse_address`]) for `weir run --metrics`. Errors say what was
    /// wrong and what to do.
    pub fn bind(addr: &str) -> Result<MetricsListener, MetricsError> {
        Self::bind_for(addr, "--metrics")
    }

    /// [`MetricsListener::bind`] for a tool whose flag for the address is `flag` (its
    /// hints name it: `weir-stat --serve`).
    pub fn bind_for(addr: &str, flag: &str) -> Result<MetricsListener, MetricsError> {
        let addr = parse_address(addr)?;
        let listener = TcpListener::bind(addr).map_err(|source| {
            let hint = match source.kind() {
                std::io::ErrorKind::AddrInUse => {
                    format!(
                        " (the port is in use: choose another, e.g. {flag} {}:{})",
                        addr.ip(),
                        addr.port().wrapping_add(1).max(1024)
                    )
                }
                std::io::ErrorKind::AddrNotAvailable => " (not an address of this host)".to_owned(),
                std::io::ErrorKind::PermissionDenied => {
                    " (ports below 1024 need privileges: use a higher one)".to_owned()
                }
                _ => String::new(),
            };
            MetricsError::Bind { addr, source, hint }
        })?;
        Ok(MetricsListener { addr: listener.local_addr().unwrap_or(addr), listener })
    }

    /// The bound address (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serve the counters file at `counters` (a running job's
    /// [`counters_path`](crate::runtime::RunningJob::counters_path)) on a thread of its own.
    pub fn serve(self, counters: &Path) -> Result<MetricsServer, MetricsError> {
        let MetricsListener { addr, listener } = self;
        let reader = CountersReader::open(counters)?;
        let server = tiny_http::Server::from_listener(listener, None).map_err(|e| MetricsError::Bind {
            addr,
            source: std::io::Error::other(e.to_string()),
            hint: String::new(),
        })?;
        let server = Arc::new(server);
        let serving = server.clone();
        let counters: PathBuf = counters.to_owned();
        let thread = std::thread::Builder::new()
            .name("weir-metrics".into())
            .spawn(move || serve(&serving, &reader, &counters))
            .map_err(|source| MetricsError::Bind { addr, source, hint: String::new() })?;
        tracing::info!(%addr, "serving Prometheus metrics at http://{addr}/metrics");
        Ok(MetricsServer { addr, server, thread: Some(thread) })
    }
}

/// Serves `/metrics` for one job's counters file on a thread of its own; stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Bind `addr` and serve the counters file at `counters` ([`MetricsListener::bind`],
    /// then [`MetricsListener::serve`]).
    pub fn start(addr: &str, counters: &Path) -> Result<MetricsServer, MetricsError> {
        MetricsListener::bind(addr)?.serve(counters)
    }

    /// The address it serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answer requests until the server is unblocked: `/metrics` with the counters now, `/`
/// with a pointer to it, anything else 404.
fn serve(server: &tiny_http::Server, reader: &CountersReader, counters: &Path) {
    let header = |k: &str, v: &str| tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).expect("a valid header");
    while let Ok(request) = server.recv() {
        let path = request.url().split('?').next().unwrap_or("");
        let response = match (request.method(), path) {
            (tiny_http::Method::Get, "/metrics") => {
                let waits = super::waiting::read_waits(counters);
                let text = encode_with_waits(&reader.job, reader.job_alive(), &reader.snapshot(), &waits);
                tiny_http::Response::from_string(text).with_header(header("Content-Type", CONTENT_TYPE))
            }
            (tiny_http::Method::Get, "/") => tiny_http::Response::from_string(format!(
                "weir job {} (counters {}): metrics at /metrics\n",
                reader.job,
                counters.display()
            )),
            _ => tiny_http::Response::from_string("not found: metrics are at /metrics\n").with_status_code(404),
        };
        // A scraper that hung up: nothing to do.
        let _ = request.respond(response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(kind: CounterKind, owner: &str, value: u64) -> CounterValue {
        CounterValue { type_id: kind.type_id(), owner: owner.to_owned(), label: kind.label().to_owned(), value }
    }

    /// Every kind has a family whose name follows the conventions (snake case, `weir_`,
    /// no `_total` of its own: the encoder adds it to counters).
    #[test]
    fn every_kind_has_a_conventional_name() {
        for k in CounterKind::ALL {
            let s = spec(k);
            assert!(s.name.starts_with("weir_") && !s.name.ends_with("_total"), "{k:?}: {}", s.name);
            assert!(s.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{}", s.name);
            assert!(!s.help.is_empty() && !s.help.ends_with('.'), "{k:?}");
        }
    }

    /// Counters, gauges, units and labels as a scraper reads them.
    #[test]
    fn encodes_types_units_and_labels() {
        let text = encode(
            "clicks",
            true,
            &[
                value(CounterKind::BusyNs, "gen#0", 1_500_000_000),
                value(CounterKind::RecordsOut, "per_second#1", 42),
                value(CounterKind::ChannelSlots, "gen#0->per_second#1", 256),
                value(CounterKind::ChannelBacklog, "gen#0->per_second#1", 256),
                value(CounterKind::SourceLag, "clicks[3]", 1234),
                value(CounterKind::SinkAckP99Us, "api", 2_500),
                value(CounterKind::CheckpointDurationNs, "job", 51_000_000),
                value(CounterKind::PartitionOwned, "orders[4]", 1),
                value(CounterKind::HandoverNs, "b", 1_480_000_000),
                CounterValue { type_id: 9999, owner: "x".into(), label: "another build's".into(), value: 1 },
            ],
        );
        for line in [
            "# TYPE weir_subtask_busy_seconds counter",
            "weir_subtask_busy_seconds_total{weir_job=\"clicks\",subtask=\"gen#0\"} 1.5",
            "weir_node_records_out_total{weir_job=\"clicks\",node=\"per_second\",index=\"1\"} 42",
            "weir_channel_fill_ratio{weir_job=\"clicks\",channel=\"gen#0->per_second#1\",sender=\"gen#0\",receiver=\"per_second#1\"} 1.0",
            "weir_source_lag_records{weir_job=\"clicks\",node=\"clicks\",partition=\"3\"} 1234",
            "weir_sink_ack_latency_seconds{weir_job=\"clicks\",node=\"api\",quantile=\"0.99\"} 0.0025",
            "weir_checkpoint_duration_seconds{weir_job=\"clicks\"} 0.051",
            "weir_instance_partition_owned{weir_job=\"clicks\",topic=\"orders\",partition=\"4\"} 1",
            "weir_instance_handover_seconds{weir_job=\"clicks\",weir_instance=\"b\"} 1.48",
            "weir_job_up{weir_job=\"clicks\"} 1",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in:\n{text}");
        }
        assert!(!text.contains("another build"), "{text}");
    }

    /// No stale figure passes for a current one: a quantile with no sample is NaN, so is every
    /// quantile of a last second that ended long ago (a stuck sink); the figures since the start
    /// stay; a timestamp of nothing yet is left out, the others are Unix seconds.
    #[test]
    fn empty_and_stale_latency_is_nan() {
        use CounterKind::*;
        let now = 1_700_000_000_000;
        let wait = Wait { subtask: "out#0".into(), since_ms: now - 12_500, what: "http sink out: 4 batches".into() };
        let text = encode_at(
            "j",
            true,
            &[
                value(SinkAckP50Us, "api", 0),
                value(SinkAckNewestMs, "api", 0),
                value(IngestLatencyP50Us, "out#0", 71_000),
                value(IngestLatencyAllP50Us, "out#0", 60_000),
                value(LatencyWindowEndMs, "out#0", now - 20_000),
                value(IngestLatencyP50Us, "out#1", 5_000),
                value(LatencyWindowEndMs, "out#1", now - 500),
                value(LatencyNewestMs, "out#1", now - 600),
            ],
            &[wait],
            now,
        );
        for line in [
            "weir_sink_ack_latency_seconds{weir_job=\"j\",node=\"api\",quantile=\"0.5\"} NaN",
            "weir_sink_ingest_latency_seconds{weir_job=\"j\",node=\"out\",index=\"0\",quantile=\"0.5\"} NaN",
            "weir_sink_ingest_latency_since_start_seconds{weir_job=\"j\",node=\"out\",index=\"0\",quantile=\"0.5\"} 0.06",
            "weir_sink_ingest_latency_seconds{weir_job=\"j\",node=\"out\",index=\"1\",quantile=\"0.5\"} 0.005",
            "weir_sink_latency_last_sample_timestamp_seconds{weir_job=\"j\",node=\"out\",index=\"1\"} 1699999999.4",
            "weir_subtask_wait_seconds{weir_job=\"j\",subtask=\"out#0\",on=\"http sink out: 4 batches\"} 12.5",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in:\n{text}");
        }
        assert!(!text.contains("weir_sink_ack_last_timestamp_seconds{"), "{text}");
    }

    /// Label values are escaped (a node name is the user's).
    #[test]
    fn label_values_are_escaped() {
        let text = encode("a\"b", false, &[value(CounterKind::SinkRecords, "out\\1\n", 7)]);
        assert!(text.contains("weir_sink_records_total{weir_job=\"a\\\"b\",node=\"out\\\\1\\n\"} 7"), "{text}");
        assert!(text.contains("weir_job_up{weir_job=\"a\\\"b\"} 0"), "{text}");
    }

    /// The Grafana dashboard (tools/grafana/weir-job.json) asks only for series this
    /// exporter writes, under the names it writes them.
    #[test]
    fn the_dashboard_uses_the_exported_names() {
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../tools/grafana/weir-job.json")).expect("the dashboard is JSON");
        let mut exported: Vec<String> = CounterKind::ALL
            .iter()
            .map(|k| spec(*k))
            .map(|s| if s.counter { format!("{}_total", s.name) } else { s.name.to_owned() })
            .collect();
        exported.extend([
            "weir_job_up".to_owned(),
            "weir_channel_fill_ratio".to_owned(),
            "weir_subtask_wait_seconds".to_owned(),
        ]);
        let mut used = 0;
        for panel in dashboard["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().expect("targets") {
                let expr = target["expr"].as_str().expect("an expression");
                let mut rest = expr;
                while let Some(at) = rest.find("weir_") {
                    let name: String = rest[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    rest = &rest[at + name.len()..];
                    if name == "weir_job" {
                        continue; // the label
                    }
                    assert!(exported.contains(&name), "panel {:?} asks for {name}, not exported", panel["title"]);
                    used += 1;
                }
            }
        }
        assert!(used >= 20, "{used} series used");
    }

    /// Addresses: a port alone is loopback; bad ones say what to give.
    #[test]
    fn addresses() {
        assert_eq!(parse_address("9464").unwrap(), "127.0.0.1:9464".parse().unwrap());
        assert_eq!(parse_address("0.0.0.0:1").unwrap(), "0.0.0.0:1".parse().unwrap());
        assert_eq!(parse_address("[::1]:9464").unwrap(), "[::1]:9464".parse().unwrap());
        for bad in ["", "localhost", "127.0.0.1:99999", "9464:"] {
            let e = parse_address(bad).unwrap_err().to_string();
            assert!(e.contains("HOST:PORT"), "{bad:?}: {e}");
        }
    }
}
