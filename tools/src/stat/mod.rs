//! `weir-stat`: find a job's counters file and print its numbers, as a table or JSON.
//!
//! The view model ([`StatView`], from two snapshots of the file) is `view.rs`; what each
//! counter means comes from the engine ([`weir::telemetry::counters::CounterKind`]), and the
//! OK/LOW/HIGH level from [`weir::telemetry::backpressure_level`], the one the job's own
//! summary prints.

mod view;

use std::path::{Path, PathBuf};
pub use view::{ChannelView, CheckpointView, InstanceView, LatencyView, SinkView, StatView, SubtaskView};
use weir::telemetry::backpressure_level as level;
use weir::telemetry::counters::channel_fill;

/// The counters file for `target`: a counters file, a job's run directory, or (None) the
/// newest job under this user's run root (`/dev/shm/weir-<uid>`).
pub fn find_counters(target: Option<&Path>) -> Result<PathBuf, String> {
    match target {
        Some(p) if p.is_dir() => Ok(p.join("counters")),
        Some(p) => Ok(p.to_owned()),
        None => {
            let base = &weir::runtime::run_root();
            let newest = std::fs::read_dir(base)
                .map_err(|e| {
                    format!(
                        "no job found: cannot read {}: {e}; is a job running? (pass its counters file)",
                        base.display()
                    )
                })?
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("counters"))
                .filter(|p| p.is_file())
                .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
            newest.ok_or_else(|| {
                format!("no job found under {}; is a job running? (pass its counters file)", base.display())
            })
        }
    }
}

/// One ipc endpoint of the job (found under this user's root; a job that names its own
/// endpoint directory is not looked up) and its figures.
#[derive(Debug, Clone)]
pub struct EndpointView {
    /// `<endpoint>.<subtask>`.
    pub name: String,
    /// The job's role: "source" (the other process publishes) or "sink" (it subscribes).
    pub role: &'static str,
    /// The other process (None: none attached).
    pub peer_pid: Option<u32>,
    /// Whether it lives.
    pub peer_alive: bool,
    /// Slots published and not yet read.
    pub backlog: u64,
    /// The next record's number.
    pub next_seq: u64,
    /// Records below this are in a completed checkpoint.
    pub durable_seq: u64,
    /// ns the producer (the publisher, or the job's sink) waited for room, in total.
    pub producer_blocked_ns: u64,
}

/// The job's ipc endpoints under `/dev/shm/weir-<uid>/ipc/<job>/`, sorted by name.
pub fn endpoints(job: &str) -> Vec<EndpointView> {
    let dir = weir_ring::ipc::user_root().join("ipc").join(weir_ring::ipc::safe_name(job));
    let mut out: Vec<EndpointView> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let status = weir_ring::ipc::peek(&e.path()).ok()?;
            let (role, peer) = match status.job_consumes {
                Some(true) => ("source", status.ring.producer.clone()),
                Some(false) => ("sink", status.ring.consumer.clone()),
                None => ("-", None),
            };
            Some(EndpointView {
                name: e.file_name().to_string_lossy().into_owned(),
                role,
                peer_pid: peer.as_ref().map(|p| p.pid),
                peer_alive: peer.is_some_and(|p| p.alive),
                backlog: status.ring.backlog,
                next_seq: status.next_seq,
                durable_seq: status.durable_seq,
                producer_blocked_ns: status.producer_blocked_ns,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The endpoints as table lines (none: nothing).
pub fn endpoints_table(endpoints: &[EndpointView]) -> String {
    if endpoints.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "{:<24} {:>7} {:>16} {:>9} {:>12} {:>12} {:>11}\n",
        "ipc endpoint", "job is", "peer", "backlog", "next", "durable", "blocked s"
    );
    for e in endpoints {
        let peer = match (e.peer_pid, e.peer_alive) {
            (Some(pid), true) => format!("pid {pid}"),
            (Some(pid), false) => format!("pid {pid} (gone)"),
            (None, _) => "none".to_owned(),
        };
        out += &format!(
            "{:<24} {:>7} {:>16} {:>9} {:>12} {:>12} {:>11.1}\n",
            e.name,
            e.role,
            peer,
            e.backlog,
            e.next_seq,
            e.durable_seq,
            e.producer_blocked_ns as f64 / 1e9
        );
    }
    out
}

/// The endpoints as JSON.
pub fn endpoints_json(endpoints: &[EndpointView]) -> serde_json::Value {
    serde_json::json!(
        endpoints
            .iter()
            .map(|e| serde_json::json!({
                "name": e.name,
                "job_is": e.role,
                "peer_pid": e.peer_pid,
                "peer_alive": e.peer_alive,
                "backlog_slots": e.backlog,
                "next_seq": e.next_seq,
                "durable_seq": e.durable_seq,
                "producer_blocked_ns": e.producer_blocked_ns,
            }))
            .collect::<Vec<_>>()
    )
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// The sinks' table (a header, then a line per sink; nothing without sinks): `weir-stat`'s
/// and `weir top`'s.
pub fn sink_rows(v: &StatView) -> Vec<String> {
    if v.sinks.is_empty() {
        return Vec::new();
    }
    let mut rows = vec![format!(
        "{:<16} {:>12} {:>10} {:>9} {:>8} {:>8} {:>9} {:>21}",
        "sink", "acked", "acked/s", "in flight", "retries", "dead", "blocked%", "ack ms p50/p99/max"
    )];
    for s in &v.sinks {
        rows.push(format!(
            "{:<16} {:>12} {:>10.0} {:>9} {:>8} {:>8} {:>9.1} {:>21}",
            s.node,
            s.acked,
            s.acked_per_s,
            s.in_flight,
            s.retries,
            s.dead_letters,
            100.0 * s.blocked,
            format!(
                "{:.1}/{:.1}/{:.1}",
                s.ack_p50_us as f64 / 1e3,
                s.ack_p99_us as f64 / 1e3,
                s.ack_max_us as f64 / 1e3
            )
        ));
    }
    rows
}

/// End-to-end latency per sink subtask, as table rows (none when no sink timed a marker):
/// ingest and event time to acknowledged, the last second's p50/p99/p99.9/max and since
/// the start's p99/max, ms.
pub fn latency_rows(v: &StatView) -> Vec<String> {
    let timed: Vec<_> = v.latencies.iter().filter(|l| l.markers > 0).collect();
    if timed.is_empty() {
        return Vec::new();
    }
    let ms = |us: u64| us as f64 / 1e3;
    let cell = |q: &[u64; 8]| {
        if q == &[0; 8] {
            "-".to_owned()
        } else {
            format!("{:.1}/{:.1}/{:.1}/{:.1} ({:.1}/{:.1})", ms(q[0]), ms(q[1]), ms(q[2]), ms(q[3]), ms(q[5]), ms(q[7]))
        }
    };
    let mut rows = vec![format!(
        "{:<16} {:>8} {:>40} {:>40}",
        "e2e latency", "markers", "ingest->ack ms p50/p99/p99.9/max (all: p99/max)", "event->ack ms, the same"
    )];
    for l in timed {
        rows.push(format!("{:<16} {:>8} {:>40} {:>40}", l.owner, l.markers, cell(&l.ingest), cell(&l.event)));
    }
    rows
}

/// The counters file `target` names (see [`find_counters`]), opened; on failure `tool`
/// says why and exits (69: no job found, 66: the file cannot be read).
pub fn open_or_exit(target: Option<&Path>, tool: &str) -> (PathBuf, weir_ring::counters::CountersReader) {
    let path = match find_counters(target) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{tool}: {e}");
            std::process::exit(69);
        }
    };
    match weir_ring::counters::CountersReader::open(&path) {
        Ok(r) => (path, r),
        Err(e) => {
            eprintln!("{tool}: {e}");
            std::process::exit(66);
        }
    }
}

/// The view as a table for people.
pub fn table(job: &str, alive: bool, v: &StatView) -> String {
    let mut out = String::new();
    let state = match (v.job_state, alive) {
        (2, _) => "finished",
        (3, _) => "failed",
        (_, false) => "dead (process gone)",
        _ => "running",
    };
    out += &format!(
        "job {job} ({state})  RSS {:.1} MiB of budget {:.1} MiB ({:.0} %)\n",
        mib(v.rss_bytes),
        mib(v.budget_bytes),
        100.0 * v.rss_bytes as f64 / v.budget_bytes.max(1) as f64
    );
    if let Some(line) = instance_line(v) {
        out += &line;
        out.push('\n');
    }
    let k = &v.checkpoints;
    if k.completed + k.failed > 0 {
        out += &format!(
            "checkpoint {} ({} completed, {} expired/declined): took {:.1} ms, alignment {:.1} ms, {:.1} MiB\n",
            k.last_id,
            k.completed,
            k.failed,
            k.duration_ns as f64 / 1e6,
            k.alignment_ns as f64 / 1e6,
            mib(k.bytes)
        );
    }
    if !v.lags.is_empty() {
        let total: u64 = v.lags.iter().map(|(_, l)| l).sum();
        let parts: Vec<String> = v.lags.iter().map(|(p, l)| format!("{p} {l}")).collect();
        out += &format!("consumer lag {total} records: {}\n", parts.join(", "));
    }
    for line in sink_rows(v).into_iter().chain(latency_rows(v)) {
        out += &line;
        out.push('\n');
    }
    out += &format!("{:<24} {:>7} {:>7} {:>7} {:>12}  backpressure\n", "subtask", "busy%", "bp%", "idle%", "in/s");
    for s in &v.subtasks {
        out += &format!(
            "{:<24} {:>7.1} {:>7.1} {:>7.1} {:>12.0}  {}\n",
            s.owner,
            100.0 * s.busy,
            100.0 * s.backpressured,
            100.0 * s.idle,
            s.records_in_per_s,
            level(s.backpressured)
        );
    }
    if !v.channels.is_empty() {
        out += &format!(
            "{:<36} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}\n",
            "channel", "slots", "fill%", "credit", "blocked%", "announced", "inflight", "drain ms"
        );
        for c in &v.channels {
            let drain = if c.drain_rate > 0 { format!("{:.1}", c.drain_ms) } else { "-".to_owned() };
            out += &format!(
                "{:<36} {:>8} {:>8.1} {:>8} {:>9.1} {:>9} {:>9} {:>9}\n",
                c.owner,
                c.slots,
                100.0 * channel_fill(c.slots, c.announced, c.backlog).unwrap_or(0.0),
                c.credit,
                100.0 * c.blocked,
                c.announced,
                c.backlog,
                drain
            );
        }
    }
    out
}

/// The instance of a shared job this job is, in one line (None: it is not one).
pub fn instance_line(v: &StatView) -> Option<String> {
    let i = v.instance.as_ref()?;
    let owned: Vec<String> = i.owned().iter().map(u32::to_string).collect();
    let group = if i.group_generation > 0 { i.group_generation.to_string() } else { "unknown".to_owned() };
    Some(format!(
        "instance {}: serves partitions {{{}}} of {} ({}), generation {}, group generation {group}, {} rebalances; \
         last handover {:.0} ms; {} partitions moved in ({:.1} MiB), {:.1} MiB restored in all",
        i.name,
        owned.join(", "),
        i.partitions.len(),
        i.topic,
        i.generations,
        i.rebalances,
        i.handover_ns as f64 / 1e6,
        i.moved_partitions,
        mib(i.moved_bytes),
        mib(i.restored_bytes)
    ))
}

/// The view as one JSON object.
pub fn json(job: &str, alive: bool, v: &StatView) -> serde_json::Value {
    serde_json::json!({
        "job": job,
        "alive": alive,
        "job_state": v.job_state,
        "interval_s": v.interval_s,
        "rss_bytes": v.rss_bytes,
        "budget_bytes": v.budget_bytes,
        "lags": v.lags.iter().map(|(p, l)| serde_json::json!({ "partition": p, "lag": l })).collect::<Vec<_>>(),
        "sinks": v.sinks.iter().map(|s| serde_json::json!({
            "node": s.node,
            "records": s.records,
            "acked": s.acked,
            "acked_per_s": s.acked_per_s,
            "in_flight": s.in_flight,
            "retries": s.retries,
            "dead_letters": s.dead_letters,
            "blocked": s.blocked,
            "ack_latency_us": { "p50": s.ack_p50_us, "p99": s.ack_p99_us, "max": s.ack_max_us },
        })).collect::<Vec<_>>(),
        "latency": v.latencies.iter().map(|l| {
            let q = |x: &[u64; 8]| serde_json::json!({
                "last_second": { "p50": x[0], "p99": x[1], "p999": x[2], "max": x[3] },
                "since_start": { "p50": x[4], "p99": x[5], "p999": x[6], "max": x[7] },
            });
            serde_json::json!({
                "subtask": l.owner,
                "markers": l.markers,
                "ingest_to_ack_us": q(&l.ingest),
                "event_to_ack_us": q(&l.event),
            })
        }).collect::<Vec<_>>(),
        "instance": v.instance.as_ref().map(|i| serde_json::json!({
            "name": i.name,
            "topic": i.topic,
            "partitions": i.partitions.len(),
            "owned": i.owned(),
            "generations": i.generations,
            "group_generation": i.group_generation,
            "rebalances": i.rebalances,
            "handover_ns": i.handover_ns,
            "moved_partitions": i.moved_partitions,
            "moved_bytes": i.moved_bytes,
            "restored_bytes": i.restored_bytes,
        })),
        "checkpoints": {
            "last_id": v.checkpoints.last_id,
            "duration_ns": v.checkpoints.duration_ns,
            "alignment_ns": v.checkpoints.alignment_ns,
            "bytes": v.checkpoints.bytes,
            "completed": v.checkpoints.completed,
            "failed": v.checkpoints.failed,
        },
        "subtasks": v.subtasks.iter().map(|s| serde_json::json!({
            "name": s.owner,
            "busy": s.busy,
            "backpressured": s.backpressured,
            "idle": s.idle,
            "level": level(s.backpressured),
            "records_in": s.records_in,
            "records_in_per_s": s.records_in_per_s,
            "state": s.state,
        })).collect::<Vec<_>>(),
        "channels": v.channels.iter().map(|c| serde_json::json!({
            "name": c.owner,
            "slots": c.slots,
            "backlog": c.backlog,
            "credit": c.credit,
            "fill": channel_fill(c.slots, c.announced, c.backlog).unwrap_or(0.0),
            "blocked": c.blocked,
            "announced": c.announced,
            "in_flight": c.backlog,
            "drain_rate_slots_per_s": c.drain_rate,
            "drain_ms": c.drain_ms,
        })).collect::<Vec<_>>(),
    })
}
