//! `weir-stat`: find a job's counters file and print its numbers, as a table or JSON.
//!
//! The view model ([`StatView`], from two snapshots of the file) is `view.rs`; what each
//! counter means comes from the engine ([`weir::telemetry::counters::CounterKind`]), and the
//! OK/LOW/HIGH level from [`weir::telemetry::backpressure_level`], the one the job's own
//! summary prints.

mod view;

use std::path::{Path, PathBuf};
pub use view::{ChannelView, CheckpointView, InstanceView, LatencyView, SinkView, StatView, SubtaskView, age_s};
use weir::telemetry::backpressure_level as level;
use weir::telemetry::counters::channel_fill;

/// A job whose process is gone, as its run directory says: the counters file is a link into
/// the process (`/proc/<pid>/fd/<n>`), dangling once it died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadJob {
    /// Its run directory.
    pub dir: PathBuf,
    /// Its process.
    pub pid: u32,
    /// When it last showed a sign of life (its monitor rewrites the waits file every second;
    /// else: when its counters file was made), Unix ms.
    pub last_seen_ms: Option<u64>,
}

impl std::fmt::Display for DeadJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the job in {} is dead: its process {} is gone", self.dir.display(), self.pid)?;
        if let Some(ms) = self.last_seen_ms {
            let ago = weir::telemetry::counters::unix_ms_now().saturating_sub(ms) as f64 / 1e3;
            write!(f, " (last seen alive {ago:.0} s ago)")?;
        }
        write!(f, "; the next job to start removes its run directory")
    }
}

/// The job whose counters file is (or should be) at `counters`, if its process is gone.
pub fn dead_job(counters: &Path) -> Option<DeadJob> {
    let link = std::fs::read_link(counters).ok()?;
    let pid: u32 = link.strip_prefix("/proc").ok()?.iter().next()?.to_str()?.parse().ok()?;
    if Path::new("/proc").join(pid.to_string()).exists() && counters.exists() {
        return None;
    }
    let mtime_ms = |p: &Path| {
        let t = std::fs::symlink_metadata(p).and_then(|m| m.modified()).ok()?;
        t.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis() as u64)
    };
    let waits = weir::telemetry::waiting::waits_path(counters);
    Some(DeadJob {
        dir: counters.parent().unwrap_or(Path::new(".")).to_owned(),
        pid,
        last_seen_ms: mtime_ms(&waits).or_else(|| mtime_ms(counters)),
    })
}

/// The counters file for `target`: a counters file, a job's run directory, or (None) the
/// newest live job under this user's run root (`/dev/shm/weir-<uid>`). A job whose process
/// is gone is named as dead.
pub fn find_counters(target: Option<&Path>) -> Result<PathBuf, String> {
    match target {
        Some(p) if p.is_dir() => {
            let counters = p.join("counters");
            match dead_job(&counters) {
                Some(dead) => Err(dead.to_string()),
                None => Ok(counters),
            }
        }
        Some(p) => match dead_job(p) {
            Some(dead) => Err(dead.to_string()),
            None => Ok(p.to_owned()),
        },
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
                let dead: Vec<String> = std::fs::read_dir(base)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| dead_job(&e.path().join("counters")))
                    .map(|d| d.to_string())
                    .collect();
                if dead.is_empty() {
                    format!("no job found under {}; is a job running? (pass its counters file)", base.display())
                } else {
                    format!("no live job under {}: {}", base.display(), dead.join("; "))
                }
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
        "{:<16} {:>12} {:>10} {:>9} {:>8} {:>8} {:>9} {:>21} {:>9}",
        "sink", "acked", "acked/s", "in flight", "retries", "dead", "blocked%", "ack ms p50/p99/max", "last ack"
    )];
    for s in &v.sinks {
        rows.push(format!(
            "{:<16} {:>12} {:>10.0} {:>9} {:>8} {:>8} {:>9.1} {:>21} {:>9}",
            s.node,
            s.acked,
            s.acked_per_s,
            s.in_flight,
            s.retries,
            s.dead_letters,
            100.0 * s.blocked,
            ms_figures(&[s.ack_p50_us, s.ack_p99_us, s.ack_max_us]),
            age_text(s.ack_newest_ms, v.at_ms)
        ));
    }
    rows
}

/// Latency figures in ms, `a/b/c`; `-` when the window had no sample (a figure is never
/// below 1 µs: 0 is none).
pub fn ms_figures(us: &[u64]) -> String {
    if us.iter().all(|u| *u == 0) {
        return "-".to_owned();
    }
    us.iter().map(|u| format!("{:.1}", *u as f64 / 1e3)).collect::<Vec<_>>().join("/")
}

/// How long ago a timestamp was, for people: `0.4 s ago`, `-` for never.
pub fn age_text(ms: u64, now_ms: u64) -> String {
    match age_s(ms, now_ms) {
        None => "-".to_owned(),
        Some(s) if s < 100.0 => format!("{s:.1} s ago"),
        Some(s) => format!("{s:.0} s ago"),
    }
}

/// End-to-end latency per sink subtask, as table rows (none when no sink timed a marker):
/// ingest and event time to acknowledged, the last second's p50/p99/p99.9/max and since
/// the start's p99/max, ms.
pub fn latency_rows(v: &StatView) -> Vec<String> {
    let timed: Vec<_> = v.latencies.iter().filter(|l| l.markers > 0).collect();
    if timed.is_empty() {
        return Vec::new();
    }
    let cell = |q: &[u64; 8]| format!("{} ({})", ms_figures(&q[..4]), ms_figures(&[q[5], q[7]]));
    let mut rows = vec![format!(
        "{:<16} {:>8} {:>40} {:>40} {:>11}",
        "e2e latency",
        "markers",
        "ingest->ack ms p50/p99/p99.9/max (all: p99/max)",
        "event->ack ms, the same",
        "newest"
    )];
    for l in timed {
        rows.push(format!(
            "{:<16} {:>8} {:>40} {:>40} {:>11}",
            l.owner,
            l.markers,
            cell(&l.ingest),
            cell(&l.event),
            age_text(l.newest_ms, v.at_ms)
        ));
    }
    rows
}

/// What the job's subtasks wait on now, one line each ("api#0 waiting 12.3 s: ..."), from
/// the waits file beside its counters file (none: nothing waits).
pub fn waits(counters: &Path, now_ms: u64) -> Vec<String> {
    weir::telemetry::waiting::read_waits(counters).iter().map(|w| w.describe(now_ms)).collect()
}

/// The counters file `target` names (see [`find_counters`]), opened; on failure `tool`
/// says why and exits (69: no job found, or it is dead; 66: the file cannot be read).
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
            // The process died between the look and the open.
            if let Some(dead) = dead_job(&path) {
                eprintln!("{tool}: {dead}");
                std::process::exit(69);
            }
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
    out += &format!(
        "{:<24} {:>7} {:>7} {:>7} {:>7} {:>12}  backpressure\n",
        "subtask", "busy%", "bp%", "idle%", "wait%", "in/s"
    );
    for s in &v.subtasks {
        out += &format!(
            "{:<24} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>12.0}  {}\n",
            s.owner,
            100.0 * s.busy,
            100.0 * s.backpressured,
            100.0 * s.idle,
            100.0 * s.waiting,
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

/// A latency figure, µs, or null for none (a figure is never below 1 µs).
fn us_or_null(us: u64) -> serde_json::Value {
    if us == 0 { serde_json::Value::Null } else { us.into() }
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
            "ack_latency_us": { "p50": us_or_null(s.ack_p50_us), "p99": us_or_null(s.ack_p99_us), "max": us_or_null(s.ack_max_us) },
            "last_ack_age_s": age_s(s.ack_newest_ms, v.at_ms),
        })).collect::<Vec<_>>(),
        "latency": v.latencies.iter().map(|l| {
            let q = |x: &[u64; 8]| serde_json::json!({
                "last_second": { "p50": us_or_null(x[0]), "p99": us_or_null(x[1]), "p999": us_or_null(x[2]), "max": us_or_null(x[3]) },
                "since_start": { "p50": us_or_null(x[4]), "p99": us_or_null(x[5]), "p999": us_or_null(x[6]), "max": us_or_null(x[7]) },
            });
            serde_json::json!({
                "subtask": l.owner,
                "markers": l.markers,
                "newest_age_s": age_s(l.newest_ms, v.at_ms),
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
            "waiting": s.waiting,
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
