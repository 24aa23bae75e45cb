//! Running a job: one pinned thread per subtask, joined by rings, with live counters.
//!
//! [`start`] resolves the graph into chains ([`plan`]), creates one ring per (sender subtask,
//! receiver subtask) pair of every exchange, builds each subtask's operator chain, computes
//! the memory budget, creates the counters file, and spawns the threads. [`RunningJob::wait`]
//! samples RSS into the counters while the job runs and returns a [`JobSummary`].

mod gate;
mod mailbox;
pub(crate) mod plan;
mod subtask;

pub use mailbox::{Control, Mailbox};

use crate::exchange::{OutputChannel, OutputGate};
use crate::graph::{GraphError, GraphInner, NodeKind};
use crate::operators::{AnyCollector, Halt, NodeCounters, SubtaskInfo};
use crate::telemetry::{Budget, backpressure_level, bytes};
use gate::{InputChannel, InputGate};
use plan::Plan;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use subtask::{Body, Subtask, SubtaskCounters, SubtaskReport};
use weir_ring::counters::{Counter, CounterKind, CountersError, CountersWriter};
use weir_ring::{IdleStrategy, RingConfig};

/// A parked subtask wakes at least this often (to refresh live counters and look around).
pub(crate) const PARK_BACKSTOP: Duration = Duration::from_millis(100);

/// How often the monitor thread samples RSS.
const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(50);

fn sample_rss(counter: Counter, max: &AtomicU64) -> u64 {
    let rss = weir_ring::process::rss_bytes().unwrap_or(0);
    counter.set(rss);
    max.fetch_max(rss, Ordering::Relaxed);
    rss
}

/// Touched stack and scratch per subtask thread, counted in the budget.
const SUBTASK_ALLOWANCE_BYTES: u64 = 512 * 1024;
/// Allocator and runtime slack counted in the budget (per-thread malloc arenas, code paged in).
const RUNTIME_ALLOWANCE_BYTES: u64 = 8 * 1024 * 1024;

/// What a subtask shares with the code that runs inside it (its output gates).
pub(crate) struct SubtaskContext {
    pub mailbox: Arc<Mailbox>,
    pub idle: IdleStrategy,
    pub backpressured_ns: Counter,
}

/// The job could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The graph is invalid.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The counters file could not be created.
    #[error(transparent)]
    Counters(#[from] CountersError),
    /// The state backend could not be opened.
    #[error("cannot open the state backend in {dir}: {source}")]
    State {
        /// The state directory.
        dir: PathBuf,
        /// The error.
        source: crate::state::StateError,
    },
    /// The checkpoint directory holds no usable checkpoint, one of another graph, or the
    /// state could not be restored from it.
    #[error("cannot start from the checkpoints: {reason}")]
    Checkpoint {
        /// What was wrong, and what to do.
        reason: String,
    },
    /// A thread could not be spawned.
    #[error("cannot spawn subtask thread {name}: {source}")]
    Spawn {
        /// The subtask.
        name: String,
        /// The error.
        source: std::io::Error,
    },
}

/// The job did not finish normally.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// It could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A subtask failed; the others were stopped.
    #[error("subtask {subtask} failed: {message}")]
    Failed {
        /// The subtask (`node#index`).
        subtask: String,
        /// What went wrong.
        message: String,
    },
    /// The job was cancelled.
    #[error("the job was cancelled")]
    Cancelled,
}

struct SubtaskHandle {
    name: String,
    state: Counter,
    cpu: Option<usize>,
    mailbox: Arc<Mailbox>,
    thread: JoinHandle<Result<SubtaskReport, Halt>>,
}

/// A started job.
pub struct RunningJob {
    name: String,
    subtasks: Vec<SubtaskHandle>,
    node_counters: Vec<(String, &'static str, u32, Vec<NodeCounters>)>,
    counters: Arc<CountersWriter>,
    run_dir: PathBuf,
    rss: Counter,
    job_state: Counter,
    budget: Budget,
    started: Instant,
    cancelled: bool,
    max_rss: Arc<AtomicU64>,
    monitor: Option<(Arc<std::sync::atomic::AtomicBool>, JoinHandle<()>)>,
    /// Closed (and its directory removed) once the subtasks are joined: no store is left open.
    state: Option<JobState>,
    /// The checkpoint coordinator, when the job takes checkpoints.
    coordinator: Option<crate::checkpoint::CoordinatorHandle>,
    /// The run directory's lock, held while the job runs (see `claim_run_dir`).
    _run_lock: Option<std::fs::File>,
}

/// RocksDB's part of the budget: the backend's parts, and the allocator's slack over them.
/// No RocksDB setting bounds the slack: glibc gives each allocating thread its own arena,
/// and memtable chunks and cache blocks are allocated by some threads and freed by others,
/// so each arena keeps its own high-water mark. tests/state_memory.rs measured RSS growth
/// up to 1.15 x the backend's parts with glibc's defaults; half of them is allowed.
fn rocksdb_budget(backend: &crate::state::StateBackend) -> Vec<(String, u64)> {
    let mut parts = backend.budget_parts();
    let total: u64 = parts.iter().map(|(_, b)| b).sum();
    parts.push(("rocksdb allocator slack (glibc arenas): half the rocksdb parts".into(), total / 2));
    parts
}

/// Where the job's checkpoints are, and the one it starts from.
struct Restore {
    root: PathBuf,
    manifest: Option<Arc<crate::checkpoint::Manifest>>,
    next_id: u64,
}

/// Find the checkpoint to start from (and check it fits this graph).
fn find_restore(g: &GraphInner, plan: &Plan) -> Result<Option<Restore>, StartError> {
    let Some(settings) = &g.config.checkpoints else { return Ok(None) };
    let fail = |reason: String| StartError::Checkpoint { reason };
    std::fs::create_dir_all(&settings.dir).map_err(|e| {
        fail(crate::checkpoint::io_failure("cannot create the checkpoint directory", &settings.dir, &e))
    })?;
    let found = crate::checkpoint::restore::find(&settings.dir).map_err(fail)?;
    for w in &found.warnings {
        tracing::warn!(job = %g.config.name, "{w}");
    }
    if let Some(m) = &found.manifest {
        if !settings.restore {
            return Err(fail(format!(
                "{} holds checkpoint {} and restoring is off; remove the directory, or allow restoring",
                settings.dir.display(),
                m.id
            )));
        }
        crate::checkpoint::restore::check_topology(m, &subtask_names(g, plan), g.config.max_key_groups)
            .map_err(fail)?;
    }
    Ok(Some(Restore { root: settings.dir.clone(), manifest: found.manifest.map(Arc::new), next_id: found.next_id }))
}

/// Every subtask's name, `head-node#index`, in the order subtasks are built and spawned.
fn subtask_names(g: &GraphInner, plan: &Plan) -> Vec<String> {
    plan.chains
        .iter()
        .flat_map(|c| (0..c.parallelism).map(move |i| format!("{}#{i}", g.nodes[c.nodes[0]].id)))
        .collect()
}

/// The job's state backend, and whether its directory goes with the job.
struct JobState {
    backend: Option<Arc<crate::state::StateBackend>>,
    dir: PathBuf,
    /// The directory was made for this job (not given): remove it at the end.
    owned: bool,
    /// The shard of each stateful subtask, by (chain, index).
    shard_of: HashMap<(usize, u32), usize>,
}

impl Drop for JobState {
    fn drop(&mut self) {
        // Close every shard before removing their files.
        drop(self.backend.take());
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Open the state backend if the job keeps keyed state and uses RocksDB: one shard per core
/// the stateful subtasks are pinned to (unpinned: one per host core, at most one per
/// subtask, assigned round robin).
fn open_state(
    g: &GraphInner,
    plan: &Plan,
    placement: &[Vec<Option<usize>>],
    run_dir: &Path,
    restore: Option<&Restore>,
) -> Result<Option<JobState>, StartError> {
    use crate::graph::StateBackendKind;
    use crate::state::{StateBackend, StateConfig, WRITE_BUFFER_BYTES_MIN};
    let settings = &g.config.state;
    if settings.backend != StateBackendKind::RocksDb {
        return Ok(None);
    }
    let stateful: Vec<(usize, u32)> = plan
        .chains
        .iter()
        .enumerate()
        .filter(|(_, chain)| chain.nodes.iter().any(|&n| g.nodes[n].state_bytes > 0))
        .flat_map(|(ci, chain)| (0..chain.parallelism).map(move |i| (ci, i)))
        .collect();
    if stateful.is_empty() {
        return Ok(None);
    }
    let mut shard_of = HashMap::new();
    let shards = if stateful.iter().all(|&(ci, i)| placement[ci][i as usize].is_some()) {
        let mut cpus: Vec<usize> = stateful.iter().filter_map(|&(ci, i)| placement[ci][i as usize]).collect();
        cpus.sort_unstable();
        cpus.dedup();
        for &(ci, i) in &stateful {
            let cpu = placement[ci][i as usize].expect("all placed");
            shard_of.insert((ci, i), cpus.binary_search(&cpu).expect("listed"));
        }
        cpus.len()
    } else {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get()).min(stateful.len());
        for (j, &(ci, i)) in stateful.iter().enumerate() {
            shard_of.insert((ci, i), j % n);
        }
        n
    };
    let (dir, owned) = match (&settings.dir, restore) {
        (Some(d), _) => (d.clone(), false),
        // Next to the checkpoints: their snapshots are hard links of its files.
        (None, Some(r)) => (crate::checkpoint::restore::live_state_dir(&r.root), true),
        (None, None) => {
            let run = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "job".into());
            (std::env::temp_dir().join("weir-state").join(run), true)
        }
    };
    if let Some(r) = restore {
        // The live shards are ahead of (or unrelated to) any checkpoint: rebuild them from
        // the restored one, or empty them on a fresh start.
        let restored = match &r.manifest {
            Some(m) => {
                let names: HashMap<String, usize> = shard_of
                    .iter()
                    .map(|(&(ci, i), &shard)| (format!("{}#{i}", g.nodes[plan.chains[ci].nodes[0]].id), shard))
                    .collect();
                crate::checkpoint::restore::restore_shards(&r.root, m, &dir, shards, |s| names.get(s).copied())
            }
            None => (0..shards).try_for_each(|i| crate::state::restore_shard(&dir, i, &[])),
        };
        restored.map_err(|reason| StartError::Checkpoint { reason })?;
    }
    let config = StateConfig {
        block_cache_bytes: settings.block_cache_bytes,
        memtable_bytes: settings.memtable_bytes,
        write_buffer_bytes_max: (settings.memtable_bytes / 4).clamp(WRITE_BUFFER_BYTES_MIN, 8 << 20),
        ..StateConfig::new(&dir, shards)
    };
    let backend = StateBackend::open(config).map_err(|source| StartError::State { dir: dir.clone(), source })?;
    Ok(Some(JobState { backend: Some(Arc::new(backend)), dir, owned, shard_of }))
}

impl fmt::Debug for RunningJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningJob").field("name", &self.name).field("subtasks", &self.subtasks.len()).finish()
    }
}

/// One node's totals over its subtasks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeSummary {
    /// Node id.
    pub id: String,
    /// What it is ("source", "map", ...).
    pub op: &'static str,
    /// Its parallelism.
    pub parallelism: u32,
    /// Records it received (sources: produced).
    pub records_in: u64,
    /// Records it emitted (sinks: 0).
    pub records_out: u64,
    /// Late records it dropped (windows; 0 for other nodes).
    pub late_records: u64,
    /// Keys its caches evicted to the state store (windows; 0 for other nodes).
    pub evicted_keys: u64,
}

/// One subtask's time accounting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SubtaskSummary {
    /// `head-node#index`.
    pub name: String,
    /// CPU it was pinned to.
    pub cpu: Option<usize>,
    /// ns processing.
    pub busy_ns: u64,
    /// ns waiting for credit.
    pub backpressured_ns: u64,
    /// ns waiting for input.
    pub idle_ns: u64,
    /// Records into the chain.
    pub records_in: u64,
}

/// What a finished job reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobSummary {
    /// Job name.
    pub name: String,
    /// Wall time.
    pub elapsed_ns: u64,
    /// Per node.
    pub nodes: Vec<NodeSummary>,
    /// Per subtask.
    pub subtasks: Vec<SubtaskSummary>,
    /// Largest RSS sampled while running.
    pub max_rss_bytes: u64,
    /// The budget.
    pub budget: Budget,
    /// Checkpoints taken (empty when the job takes none).
    pub checkpoints: crate::checkpoint::CheckpointStats,
}

impl JobSummary {
    /// The node with this id.
    pub fn node(&self, id: &str) -> Option<&NodeSummary> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

impl fmt::Display for JobSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.elapsed_ns as f64 / 1e9;
        writeln!(f, "job {} finished in {secs:.3} s", self.name)?;
        writeln!(
            f,
            "{:<20} {:<9} {:>4} {:>14} {:>14} {:>14}",
            "node", "op", "par", "records in", "records out", "in/s"
        )?;
        for n in &self.nodes {
            writeln!(
                f,
                "{:<20} {:<9} {:>4} {:>14} {:>14} {:>14.0}",
                n.id,
                n.op,
                n.parallelism,
                n.records_in,
                n.records_out,
                n.records_in.max(n.records_out) as f64 / secs.max(1e-9)
            )?;
        }
        writeln!(f, "{:<20} {:>4} {:>7} {:>7} {:>7}  backpressure", "subtask", "cpu", "busy%", "bp%", "idle%")?;
        for s in &self.subtasks {
            let total = (s.busy_ns + s.backpressured_ns + s.idle_ns).max(1) as f64;
            let bp = s.backpressured_ns as f64 / total;
            writeln!(
                f,
                "{:<20} {:>4} {:>7.1} {:>7.1} {:>7.1}  {}",
                s.name,
                s.cpu.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
                100.0 * s.busy_ns as f64 / total,
                100.0 * bp,
                100.0 * s.idle_ns as f64 / total,
                backpressure_level(bp)
            )?;
        }
        write!(f, "max RSS {} of {}", bytes(self.max_rss_bytes), self.budget)
    }
}

static JOB_SEQ: AtomicU64 = AtomicU64::new(0);

/// The lock file in a run directory: held (`flock`) by the job that uses the directory.
const RUN_LOCK: &str = "lock";

/// Take the run directory `d` for this job, and the lock that says it is in use. A directory
/// already there whose lock nobody holds is a dead process's (killed, no clean up, and pids
/// are reused): it is replaced. One whose lock is held belongs to a live job with the same
/// pid in another pid namespace sharing /dev/shm: this job takes a name of its own beside it.
fn claim_run_dir(d: PathBuf) -> (PathBuf, Option<std::fs::File>) {
    let try_lock = |dir: &Path| -> Option<std::fs::File> {
        std::fs::create_dir_all(dir).ok()?;
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(RUN_LOCK)).ok()?;
        // flock(2), exclusive, without waiting.
        f.try_lock().ok().map(|()| f)
    };
    if d.exists() {
        match try_lock(&d) {
            Some(lock) => {
                // A dead process's: empty it, keeping the lock we hold.
                for e in std::fs::read_dir(&d).into_iter().flatten().filter_map(|e| e.ok()) {
                    if e.file_name() != RUN_LOCK {
                        let p = e.path();
                        let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
                    }
                }
                return (d, Some(lock));
            }
            None => {
                let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                let other = PathBuf::from(format!("{}-{:x}", d.display(), nanos.subsec_nanos()));
                let lock = try_lock(&other);
                return (other, lock);
            }
        }
    }
    let lock = try_lock(&d);
    (d, lock)
}

fn default_run_dir(name: &str) -> PathBuf {
    let base =
        if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm/weir") } else { std::env::temp_dir().join("weir") };
    base.join(format!("{name}-{}-{}", std::process::id(), JOB_SEQ.fetch_add(1, Ordering::Relaxed)))
}

/// Start a described job.
pub(crate) fn start(g: &GraphInner) -> Result<RunningJob, StartError> {
    let plan = Plan::build(g)?;
    let config = &g.config;
    let restore = find_restore(g, &plan)?;
    let ring_config = RingConfig {
        slot_bytes: config.slot_bytes,
        slot_count: config.ring_slots,
        max_record_bytes: config.max_record_bytes,
    };

    // Count what the counters file must hold.
    let subtask_count: usize = plan.chains.iter().map(|c| c.parallelism as usize).sum();
    let node_subtasks: usize = g.nodes.iter().map(|n| n.parallelism as usize).sum();
    let ring_count: usize = plan
        .exchanges
        .iter()
        .map(|x| {
            let (a, b) = (plan.chains[x.from_chain].parallelism as usize, plan.chains[x.to_chain].parallelism as usize);
            if x.partitioning == crate::exchange::Partitioning::Forward { a } else { a * b }
        })
        .sum();
    // Headroom for per-partition lag counters, allocated as partitions become known.
    let capacity =
        (subtask_count * 6 + node_subtasks * 4 + ring_count * 4 + config.sink_gauges.len() * 9 + 16 + 256) as u32;

    let (run_dir, run_lock) = match &config.run_dir {
        Some(d) => (d.clone(), None),
        None => claim_run_dir(default_run_dir(&config.name)),
    };
    let counters = Arc::new(CountersWriter::create(run_dir.join("counters"), &config.name, capacity)?);
    let c = |kind, owner: &str, label: &str| counters.allocate(kind, owner, label);
    let rss = c(CounterKind::RssBytes, "job", "resident set size")?;
    let budget_counter = c(CounterKind::BudgetBytes, "job", "memory budget")?;
    let job_state = c(CounterKind::JobState, "job", "1 running, 2 finished, 3 failed")?;
    let checkpoint_counters = match &restore {
        Some(_) => Some(crate::checkpoint::coordinator::Counters {
            last_id: c(CounterKind::CheckpointId, "job", "last completed checkpoint")?,
            duration_ns: c(CounterKind::CheckpointDurationNs, "job", "its duration, ns")?,
            alignment_ns: c(CounterKind::CheckpointAlignmentNs, "job", "its longest alignment, ns")?,
            bytes: c(CounterKind::CheckpointBytes, "job", "its bytes")?,
            completed: c(CounterKind::CheckpointsCompleted, "job", "checkpoints completed")?,
            failed: c(CounterKind::CheckpointsFailed, "job", "checkpoints expired or declined")?,
        }),
        None => None,
    };
    if let (Some(counters), Some(m)) = (&checkpoint_counters, restore.as_ref().and_then(|r| r.manifest.as_ref())) {
        counters.last_id.set(m.id);
    }
    let (ack_tx, ack_rx) = std::sync::mpsc::channel();
    // This run's final-checkpoint directory: unique, so a rerun never writes over the files
    // of a final checkpoint it restored.
    let final_dir = format!(
        "final-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    );

    // Subtask contexts and counters, [chain][index].
    let mut contexts: Vec<Vec<(Arc<SubtaskContext>, SubtaskCounters)>> = Vec::new();
    for chain in &plan.chains {
        let head = &g.nodes[chain.nodes[0]].id;
        let mut per = Vec::new();
        for i in 0..chain.parallelism {
            let owner = format!("{head}#{i}");
            let ctx = Arc::new(SubtaskContext {
                mailbox: Arc::new(Mailbox::default()),
                idle: config.idle,
                backpressured_ns: c(CounterKind::BackpressuredNs, &owner, "ns waiting for credit")?,
            });
            let counters = SubtaskCounters {
                busy_ns: c(CounterKind::BusyNs, &owner, "ns processing")?,
                idle_ns: c(CounterKind::IdleNs, &owner, "ns waiting for input")?,
                records_in: c(CounterKind::RecordsIn, &owner, "records into the chain")?,
                state: c(CounterKind::SubtaskState, &owner, "1 running, 2 finished, 3 failed")?,
            };
            per.push((ctx, counters));
        }
        contexts.push(per);
    }

    // Rings: outputs[(exchange, sender)] ordered by receiver; inputs[chain][receiver].
    let mut outputs: HashMap<(usize, u32), Vec<OutputChannel>> = HashMap::new();
    let mut inputs: Vec<Vec<Vec<InputChannel>>> =
        plan.chains.iter().map(|ch| (0..ch.parallelism).map(|_| Vec::new()).collect()).collect();
    let mut ring_bytes = 0u64;
    let mut channel_credits = Vec::new();
    for (xi, x) in plan.exchanges.iter().enumerate() {
        let edge = &g.edges[x.edge];
        let (from, to) = (&g.nodes[edge.from].id, &g.nodes[edge.to].id);
        let (pa, pb) = (plan.chains[x.from_chain].parallelism, plan.chains[x.to_chain].parallelism);
        for j in 0..pa {
            let receivers: Vec<u32> =
                if x.partitioning == crate::exchange::Partitioning::Forward { vec![j] } else { (0..pb).collect() };
            for i in receivers {
                let name = format!("{from}#{j}->{to}#{i}");
                let (producer, consumer) = weir_ring::channel(ring_config)
                    .map_err(|e| StartError::Graph(GraphError::Setting { field: "ring", problem: e.to_string() }))?;
                ring_bytes += ring_config.region_bytes();
                c(CounterKind::ChannelSlots, &name, "slots")?.set(config.ring_slots as u64);
                let credit = c(CounterKind::ChannelCredit, &name, "free slots (sender's view)")?;
                credit.set(config.ring_slots as u64);
                channel_credits.push((name.clone(), credit, config.ring_slots as u64));
                outputs.entry((xi, j)).or_default().push(OutputChannel {
                    producer,
                    name: name.clone(),
                    blocked_ns: c(CounterKind::ChannelBlockedNs, &name, "ns the sender waited for credit")?,
                    backlog: c(CounterKind::ChannelBacklog, &name, "used slots (sender's view)")?,
                    credit,
                });
                inputs[x.to_chain][i as usize].push(InputChannel { consumer, name, ended: false, blocked: false });
            }
        }
    }

    // Where each subtask runs, decided before the chains are built: keyed state is sharded
    // by core, and a stateful subtask gets the shard of the core it is pinned to. A node's
    // cpus if given, else round robin over the host's cores, in the order subtasks are built
    // and spawned.
    let cores = if config.pinning { core_affinity::get_core_ids().unwrap_or_default() } else { Vec::new() };
    let mut placement: Vec<Vec<Option<usize>>> = Vec::new();
    let mut spawned = 0usize;
    for chain in &plan.chains {
        let cpus = chain.nodes.iter().find_map(|&n| g.nodes[n].cpus.clone());
        let mut per = Vec::new();
        for i in 0..chain.parallelism as usize {
            let cpu = match &cpus {
                Some(c) => Some(c[i % c.len()]),
                None => (!cores.is_empty()).then(|| cores[spawned % cores.len()].id),
            };
            per.push(cpu);
            spawned += 1;
        }
        placement.push(per);
    }
    let state = open_state(g, &plan, &placement, &run_dir, restore.as_ref())?;

    // Operator chains, one per subtask.
    let mut node_counters: Vec<(String, &'static str, u32, Vec<NodeCounters>)> =
        g.nodes.iter().map(|n| (n.id.clone(), n.op, n.parallelism, Vec::new())).collect();
    let mut subtasks = Vec::new();
    for (ci, chain) in plan.chains.iter().enumerate() {
        let tail = *chain.nodes.last().expect("chains are not empty");
        for i in 0..chain.parallelism {
            let (ctx, sub_counters) = contexts[ci][i as usize].clone();
            let subtask_name = format!("{}#{i}", g.nodes[chain.nodes[0]].id);
            let snapshots = match &restore {
                Some(r) => crate::checkpoint::Snapshots::new(
                    subtask_name.clone(),
                    r.root.clone(),
                    final_dir.clone(),
                    r.manifest.clone(),
                ),
                None => crate::checkpoint::Snapshots::default(),
            };
            let mut down: Option<AnyCollector> = None;
            if !matches!(g.nodes[tail].kind, NodeKind::Sink(_)) {
                let writers: Vec<AnyCollector> = plan
                    .exchanges
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.from_chain == ci)
                    .map(|(xi, x)| {
                        let channels = outputs.remove(&(xi, i)).expect("rings were made for every sender");
                        let gate = OutputGate::new(channels, x.partitioning, config.max_key_groups, ctx.clone());
                        (g.edges[x.edge].writer)(gate)
                    })
                    .collect();
                let tee = g.nodes[tail].tee.as_ref().expect("non-sinks have a tee");
                down = Some(tee(writers, &g.nodes[tail].id));
            }
            let mut body = None;
            for &ni in chain.nodes.iter().rev() {
                let node = &g.nodes[ni];
                let info = SubtaskInfo {
                    node: node.id.clone(),
                    index: i,
                    parallelism: node.parallelism,
                    max_key_groups: config.max_key_groups,
                };
                let shard = match (&state, node.state_bytes > 0) {
                    (Some(s), true) => {
                        s.backend.as_ref().map(|b| crate::operators::StateShard::new(b.clone(), s.shard_of[&(ci, i)]))
                    }
                    _ => None,
                };
                let env = crate::operators::OperatorEnv { shard, snapshots: snapshots.clone() };
                let owner = info.name();
                let nc = NodeCounters {
                    records_in: c(CounterKind::RecordsIn, &owner, "records in")?,
                    records_out: c(CounterKind::RecordsOut, &owner, "records out")?,
                    late_records: if node.op == "window" {
                        c(CounterKind::LateRecords, &owner, "late records dropped")?
                    } else {
                        Counter::detached()
                    },
                    evicted_keys: if node.state_bytes > 0 {
                        c(CounterKind::Other, &owner, "keys evicted to the state store")?
                    } else {
                        Counter::detached()
                    },
                };
                node_counters[ni].3.push(nc);
                match &node.kind {
                    NodeKind::Sink(f) => down = Some(f(&info, nc, &env)),
                    NodeKind::Operator(f) => {
                        down = Some(f(&info, nc, &env, down.take().expect("an operator feeds something")))
                    }
                    NodeKind::Source(f) => {
                        body = Some(Body::Source(f(&info, nc, &env, down.take().expect("a source feeds something"))))
                    }
                }
            }
            let head = &g.nodes[chain.nodes[0]];
            let body = body.unwrap_or_else(|| {
                let decoder = head.decoder.as_ref().expect("non-sources decode their input");
                let channels = std::mem::take(&mut inputs[ci][i as usize]);
                Body::Input {
                    gate: InputGate::new(channels, config.watermark_idle_timeout),
                    input: decoder(down.take().expect("a chain has a head collector"), &head.id),
                }
            });
            let checkpoints = restore.as_ref().map(|_| subtask::Checkpoints {
                snapshots,
                acks: ack_tx.clone(),
                index: subtasks.len(),
            });
            subtasks.push((
                subtask_name,
                placement[ci][i as usize],
                Subtask { body, ctx, counters: sub_counters, checkpoints },
            ));
        }
    }

    // The budget, as a sum of its owners.
    let baseline = weir_ring::process::rss_bytes().unwrap_or(0);
    let stateful: Vec<&crate::graph::Node> = g.nodes.iter().filter(|n| n.state_bytes > 0).collect();
    let mut state_parts: Vec<(String, u64)> = stateful
        .iter()
        .map(|n| {
            (
                format!("{} state cache ({} x {})", n.id, n.parallelism, bytes(n.state_bytes)),
                n.parallelism as u64 * n.state_bytes,
            )
        })
        .collect();
    let budget = Budget {
        parts: vec![
            (format!("rings ({ring_count} x {})", bytes(ring_config.region_bytes())), ring_bytes),
            (
                format!("subtasks ({subtask_count} x {})", bytes(SUBTASK_ALLOWANCE_BYTES)),
                subtask_count as u64 * SUBTASK_ALLOWANCE_BYTES,
            ),
            ("counters file".into(), 128 * 2 * capacity as u64 + 128),
            ("process at start".into(), baseline),
            ("runtime allowance".into(), RUNTIME_ALLOWANCE_BYTES),
        ]
        .into_iter()
        .chain(config.connector_memory.iter().cloned())
        .chain(state_parts.drain(..))
        // RocksDB's own bound, now that every stateful operator has opened its column family,
        // and the allocator's slack over it.
        .chain(state.iter().flat_map(|s| s.backend.iter().flat_map(|b| rocksdb_budget(b))))
        .collect(),
    };
    budget_counter.set(budget.total_bytes());
    job_state.set(1);

    // The checkpoint coordinator (before the subtasks: they may finish at once and ack).
    let mut coordinator = None;
    if let (Some(r), Some(counters), Some(settings)) = (&restore, checkpoint_counters, &config.checkpoints) {
        let stats = Arc::new(std::sync::Mutex::new(crate::checkpoint::CheckpointStats {
            restored_from: r.manifest.as_ref().map(|m| m.id),
            ..Default::default()
        }));
        let members = subtasks
            .iter()
            .map(|(name, _, s)| crate::checkpoint::coordinator::Member {
                name: name.clone(),
                mailbox: s.ctx.mailbox.clone(),
                is_source: matches!(s.body, Body::Source(_)),
            })
            .collect();
        let c = crate::checkpoint::Coordinator {
            settings: settings.clone(),
            job: config.name.clone(),
            max_key_groups: config.max_key_groups,
            members,
            channels: channel_credits,
            counters,
            next_id: r.next_id,
            stats,
            final_dir: final_dir.clone(),
        };
        coordinator = Some(
            c.spawn(ack_tx, ack_rx).map_err(|source| StartError::Spawn { name: "weir-checkpoint".into(), source })?,
        );
    }

    // Spawn, pinned where placed.
    let mut handles = Vec::new();
    for (name, cpu, subtask) in subtasks {
        let mailbox = subtask.ctx.mailbox.clone();
        let state = subtask.counters.state;
        let pin = config.pinning;
        let thread = std::thread::Builder::new()
            .name(thread_name(&name))
            .spawn(move || {
                if let (true, Some(id)) = (pin, cpu) {
                    core_affinity::set_for_current(core_affinity::CoreId { id });
                }
                subtask.run()
            })
            .map_err(|source| StartError::Spawn { name: name.clone(), source })?;
        handles.push(SubtaskHandle { name, state, cpu: if pin { cpu } else { None }, mailbox, thread });
    }

    // RSS is sampled by a small thread of its own, so the counters show it while the job runs
    // (and while it is stuck) whether or not anyone calls `wait`.
    let max_rss = Arc::new(AtomicU64::new(0));
    let monitor_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let (max_rss, stop) = (max_rss.clone(), monitor_stop.clone());
        let (gauges, counters) = (config.lag_gauges.clone(), counters.clone());
        let sinks: Vec<(crate::telemetry::sinks::SinkGauge, Vec<Option<Counter>>)> = config
            .sink_gauges
            .iter()
            .map(|g| {
                let kinds = [
                    (CounterKind::SinkRecords, "records taken"),
                    (CounterKind::SinkAcked, "records acknowledged"),
                    (CounterKind::SinkInFlight, "in flight (requests or records)"),
                    (CounterKind::SinkRetries, "retries"),
                    (CounterKind::SinkDeadLetters, "records dead-lettered"),
                    (CounterKind::SinkBlockedNs, "ns waiting for the destination"),
                    (CounterKind::SinkAckP50Us, "ack latency p50 us"),
                    (CounterKind::SinkAckP99Us, "ack latency p99 us"),
                    (CounterKind::SinkAckMaxUs, "ack latency max us"),
                ];
                let slots = kinds.iter().map(|(k, label)| counters.allocate(*k, &g.node, label).ok()).collect();
                (g.clone(), slots)
            })
            .collect();
        std::thread::Builder::new()
            .name("weir-monitor".into())
            .spawn(move || {
                // Lag counters, allocated when a partition's lag is first known.
                let mut lags: HashMap<(usize, i32), Option<Counter>> = HashMap::new();
                while !stop.load(Ordering::Acquire) {
                    sample_rss(rss, &max_rss);
                    for (gauge, slots) in &sinks {
                        let r = (gauge.read)();
                        let values = [
                            r.records,
                            r.acked,
                            r.in_flight,
                            r.retries,
                            r.dead_letters,
                            r.blocked_ns,
                            r.latency.p50_us,
                            r.latency.p99_us,
                            r.latency.max_us,
                        ];
                        for (slot, v) in slots.iter().zip(values) {
                            if let Some(c) = slot {
                                c.set(v);
                            }
                        }
                    }
                    for (g, gauge) in gauges.iter().enumerate() {
                        (gauge.read)(&mut |partition, lag| {
                            let counter = lags.entry((g, partition)).or_insert_with(|| {
                                let owner = format!("{}[{partition}]", gauge.node);
                                counters.allocate(CounterKind::SourceLag, &owner, "consumer lag, records").ok()
                            });
                            if let Some(c) = counter {
                                c.set(lag);
                            }
                        });
                    }
                    std::thread::sleep(RSS_SAMPLE_INTERVAL);
                }
            })
            .map_err(|source| StartError::Spawn { name: "weir-monitor".into(), source })?
    };

    Ok(RunningJob {
        name: config.name.clone(),
        subtasks: handles,
        node_counters,
        counters,
        run_dir,
        _run_lock: run_lock,
        rss,
        job_state,
        budget,
        started: Instant::now(),
        cancelled: false,
        max_rss,
        monitor: Some((monitor_stop, monitor)),
        state,
        coordinator,
    })
}

/// Linux thread names hold 15 bytes: keep the end (the index) and as much of the id as fits.
fn thread_name(name: &str) -> String {
    if name.len() <= 15 {
        return name.to_owned();
    }
    let (id, index) = name.rsplit_once('#').unwrap_or((name, ""));
    let keep = 15usize.saturating_sub(index.len() + 1);
    let mut cut = keep.min(id.len());
    while !id.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}#{index}", &id[..cut])
}

impl RunningJob {
    /// The counters file `weir-stat` reads.
    pub fn counters_path(&self) -> &Path {
        self.counters.path()
    }

    /// The memory budget computed at start.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The job's checkpoints so far (empty when it takes none).
    pub fn checkpoint_stats(&self) -> crate::checkpoint::CheckpointStats {
        self.coordinator.as_ref().map(|c| c.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()).unwrap_or_default()
    }

    /// Ask every subtask to stop; `wait` then returns `JobError::Cancelled`.
    pub fn cancel(&mut self) {
        self.cancelled = true;
        self.stop_all();
    }

    /// Stop every subtask: mark all, then ring all (see `Mailbox::request_stop`).
    fn stop_all(&self) {
        for s in &self.subtasks {
            s.mailbox.request_stop();
        }
        for s in &self.subtasks {
            s.mailbox.post(Control::Stop);
        }
    }

    /// Whether a subtask has failed (`wait` then stops the others and returns its error).
    pub fn has_failed(&self) -> bool {
        self.any_failed()
    }

    /// Whether every subtask has ended.
    pub fn is_finished(&self) -> bool {
        self.subtasks.iter().all(|s| s.thread.is_finished())
    }

    /// Sample RSS now into the counters file (and the summary's maximum); returns it. A
    /// monitor thread also does this every 50 ms.
    pub fn sample_rss(&self) -> u64 {
        sample_rss(self.rss, &self.max_rss)
    }

    fn stop_monitor(&mut self) {
        if let Some((stop, thread)) = self.monitor.take() {
            stop.store(true, Ordering::Release);
            let _ = thread.join();
        }
    }

    /// Wait for the job to end, sampling RSS meanwhile. A failed subtask stops the others.
    pub fn wait(mut self) -> Result<JobSummary, JobError> {
        let mut stopping = false;
        loop {
            self.sample_rss();
            if self.is_finished() {
                break;
            }
            // A subtask that failed stops the rest (they may be blocked on it).
            if !stopping && self.any_failed() {
                stopping = true;
                self.stop_all();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let elapsed_ns = self.started.elapsed().as_nanos() as u64;
        self.sample_rss();
        self.stop_monitor();
        let checkpoints = match self.coordinator.take() {
            Some(mut c) => {
                c.stop();
                c.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
            }
            None => Default::default(),
        };
        let mut failure = None;
        let mut summaries = Vec::new();
        for s in self.subtasks.drain(..) {
            match s.thread.join() {
                Ok(Ok(r)) => summaries.push(SubtaskSummary {
                    name: s.name,
                    cpu: s.cpu,
                    busy_ns: r.busy_ns,
                    backpressured_ns: r.backpressured_ns,
                    idle_ns: r.idle_ns,
                    records_in: r.records_in,
                }),
                Ok(Err(Halt::Stopped)) => {}
                Ok(Err(Halt::Failed(message))) => {
                    failure.get_or_insert(JobError::Failed { subtask: s.name, message });
                }
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panic".into());
                    failure
                        .get_or_insert(JobError::Failed { subtask: s.name, message: format!("panicked: {message}") });
                }
            }
        }
        if let Some(message) = &checkpoints.fatal {
            failure
                .get_or_insert(JobError::Failed { subtask: "checkpoint coordinator".into(), message: message.clone() });
        }
        self.job_state.set(if failure.is_some() { 3 } else { 2 });
        drop(self.state.take());
        let _ = std::fs::remove_dir_all(&self.run_dir);
        if let Some(f) = failure {
            return Err(f);
        }
        if self.cancelled {
            return Err(JobError::Cancelled);
        }
        let nodes = self
            .node_counters
            .iter()
            .map(|(id, op, parallelism, cs)| NodeSummary {
                id: id.clone(),
                op,
                parallelism: *parallelism,
                records_in: cs.iter().map(|c| c.records_in.get()).sum(),
                records_out: cs.iter().map(|c| c.records_out.get()).sum(),
                late_records: cs.iter().map(|c| c.late_records.get()).sum(),
                evicted_keys: cs.iter().map(|c| c.evicted_keys.get()).sum(),
            })
            .collect();
        Ok(JobSummary {
            name: self.name.clone(),
            elapsed_ns,
            nodes,
            subtasks: summaries,
            max_rss_bytes: self.max_rss.load(Ordering::Relaxed),
            budget: self.budget.clone(),
            checkpoints,
        })
    }

    /// Whether a subtask ended without finishing well: its state counter says 2 only after a
    /// clean end (3 after an error; a panic leaves 1 on a finished thread).
    fn any_failed(&self) -> bool {
        self.subtasks.iter().any(|s| s.thread.is_finished() && s.state.get() != 2)
    }
}

impl Drop for RunningJob {
    fn drop(&mut self) {
        self.stop_monitor();
        if let Some(mut c) = self.coordinator.take() {
            c.stop();
        }
        if !self.subtasks.is_empty() {
            self.stop_all();
            for s in self.subtasks.drain(..) {
                let _ = s.thread.join();
            }
            drop(self.state.take());
            let _ = std::fs::remove_dir_all(&self.run_dir);
        }
    }
}
