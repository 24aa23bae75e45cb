//! Starting a job, as named stages run in order by [`start`]. Each stage takes what the ones
//! before it made and returns what the ones after it need; nothing is spawned before every
//! fallible stage has succeeded, except the coordinator, which must listen before subtasks
//! can ack.

use super::StartError;
use super::coordinator::{self, Coordinator, CoordinatorHandle};
use super::plan::Plan;
use super::run_dir::RunDir;
use super::running::{Outcome, RunningJob, SubtaskHandle, SubtaskThread};
use super::state::{JobState, Restore, find_restore, open_state, rocksdb_budget};
use super::subtask::{self, Body, Subtask, SubtaskCounters};
use crate::chain::{AnyCollector, NodeCounters, OperatorEnv};
use crate::checkpoint::Snapshots;
use crate::exchange::credit::Drain;
use crate::exchange::{InputChannel, InputGate, Mailbox, OutputChannel, OutputGate, SubtaskContext};
use crate::graph::{GraphError, GraphInner, NodeKind};
use crate::operators::{StateShard, SubtaskInfo};
use crate::record::Partitioning;
use crate::telemetry::counters::{
    CHANNEL, CHECKPOINT, JOB, JobCounters, LAG_HEADROOM, LATENCY, NODE, Owners, SINK, SUBTASK,
};
use crate::telemetry::monitor::{ChannelGauge, Monitor, MonitorError, Monitored, SubtaskClock};
use crate::telemetry::time::TimeAccount;
use crate::telemetry::waiting::Waiting;
use crate::telemetry::{Budget, bytes};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};
use weir_ring::IdleStrategy;
use weir_ring::counters::SharedCounter;

/// Touched stack and scratch per subtask thread, counted in the budget.
const SUBTASK_ALLOWANCE_BYTES: u64 = 512 * 1024;
/// Allocator and runtime slack counted in the budget (per-thread malloc arenas, code paged in).
const RUNTIME_ALLOWANCE_BYTES: u64 = 8 * 1024 * 1024;

/// Start a described job.
pub(super) fn start(g: &GraphInner) -> Result<RunningJob, StartError> {
    let plan = Plan::build(g)?;
    let restore = find_restore(g)?;
    let files = create_counters(g, &plan)?;
    let job = job_counters(&files.counters, restore.as_ref())?;
    let placement = place(g, &plan);
    let (contexts, clocks) = subtask_contexts(g, &plan, &placement, &files.counters)?;
    if g.config.idle == IdleStrategy::BusySpin {
        let cpus: Vec<String> = placement.iter().flatten().map(|c| c.map_or("-".into(), |c| c.to_string())).collect();
        tracing::info!(
            job = %g.config.name,
            "busy-spin (latency profile): {} subtasks spin on CPUs [{}]: that many CPUs fully busy for the whole run, idle or not",
            cpus.len(),
            cpus.join(", ")
        );
    }
    let changed: Vec<IdleStrategy> =
        contexts.iter().flatten().map(|(c, _)| c.idle).filter(|&idle| idle != g.config.idle).collect();
    let parking = changed.iter().filter(|&&idle| idle == PARK_AT_ONCE).count();
    if parking > 0 {
        tracing::info!(job = %g.config.name, "{parking} subtasks share a CPU: idle, they park at once (no spinning or yielding)");
    }
    if changed.len() > parking {
        tracing::info!(
            job = %g.config.name,
            "{} subtasks, as many as the CPUs or more: idle, they spin (at most {:?}) and park, never yield",
            changed.len() - parking,
            weir_ring::DEFAULT_PARK_SPIN
        );
    }
    let mut rings = make_rings(g, &plan, &files.counters)?;
    let state = open_state(g, &plan, &placement, files.run_dir.path(), restore.as_ref())?;
    let (ack_tx, ack_rx) = std::sync::mpsc::channel();
    let allow_dropped = g.config.checkpoints.as_ref().is_some_and(|c| c.allow_dropped_state);
    let checkpoints = restore.as_ref().map(|r| CheckpointWiring::new(r, allow_dropped, ack_tx));
    let chains = build_chains(
        g,
        &plan,
        &files.counters,
        &contexts,
        &mut rings,
        &placement,
        state.as_ref(),
        checkpoints.as_ref(),
    )?;
    let budget = budget(g, &rings, chains.subtasks.len(), files.capacity, state.as_ref());
    job.budget.set(budget.total_bytes());
    job.state.set(1);
    let coordinator = match (restore, job.checkpoints, checkpoints) {
        (Some(r), Some(counters), Some(wiring)) => {
            Some(start_coordinator(g, r, counters, wiring, ack_rx, &chains, &rings)?)
        }
        _ => None,
    };
    // The tables that sized the file cover what the stages allocated; what is left is the
    // sinks' figures (the monitor's) and the lag headroom. A mismatch is a bug here.
    let (allocated, capacity) = files.counters.usage();
    assert!(
        allocated as u64 + (g.config.sink_gauges.len() * SINK.len()) as u64 + LAG_HEADROOM <= capacity as u64,
        "counters: {allocated} allocated of {capacity}; the tables in telemetry/counters.rs miss an owner"
    );
    let savepoint_timeout = g.config.checkpoints.as_ref().map_or(Duration::from_secs(600), |c| c.timeout * 2);
    let control = match &coordinator {
        Some(c) => Some(
            super::control::ControlServer::spawn(files.run_dir.path(), c.sender(), savepoint_timeout)
                .map_err(|source| StartError::Spawn { name: "weir-control".into(), source })?,
        ),
        None => None,
    };
    let handles = spawn(g, chains.subtasks)?;
    let max_rss = Arc::new(AtomicU64::new(0));
    let monitor = Monitor::spawn(
        Monitored {
            subtasks: clocks,
            rss: job.rss.clone(),
            max_rss: max_rss.clone(),
            channels: rings.gauges,
            sinks: g.config.sink_gauges.clone(),
            lags: g.config.lag_gauges.clone(),
            endpoints: g.config.endpoint_gauges.clone(),
        },
        files.counters.clone(),
    )
    .map_err(|MonitorError::Spawn(source)| StartError::Spawn { name: "weir-monitor".into(), source })?;
    Ok(RunningJob {
        name: g.config.name.clone(),
        subtasks: handles,
        node_counters: chains.node_counters,
        counters: files.counters,
        run_dir: files.run_dir,
        rss: job.rss,
        job_state: job.state,
        budget,
        started: Instant::now(),
        cancelled: false,
        stop_timeout: g.config.stop_timeout,
        max_rss,
        monitor: Some(monitor),
        state,
        coordinator,
        control,
        savepoint_timeout,
    })
}

/// The counters file, in the job's run directory, and how it was sized.
struct CounterFiles {
    counters: JobCounters,
    capacity: u32,
    run_dir: RunDir,
}

/// Stage: size the counters file from what the job has, claim the run directory, create it.
fn create_counters(g: &GraphInner, plan: &Plan) -> Result<CounterFiles, StartError> {
    let owners = Owners {
        subtasks: plan.chains.iter().map(|c| c.parallelism as u64).sum(),
        node_subtasks: g.nodes.iter().map(|n| n.parallelism as u64).sum(),
        channels: plan
            .exchanges
            .iter()
            .map(|x| {
                let (a, b) = (plan.chains[x.from_chain].parallelism as u64, plan.chains[x.to_chain].parallelism as u64);
                if x.partitioning == Partitioning::Forward { a } else { a * b }
            })
            .sum(),
        sinks: g.config.sink_gauges.len() as u64,
        sink_subtasks: g
            .nodes
            .iter()
            .filter(|n| matches!(n.kind, NodeKind::Sink(_)))
            .map(|n| n.parallelism as u64)
            .sum(),
        instance_partitions: g.config.instance.as_ref().map_or(0, |i| u64::from(i.partitions)),
    };
    let capacity = owners.capacity().ok_or_else(|| GraphError::Setting {
        field: "parallelism",
        problem: format!(
            "{} subtasks and {} channels need more counters than a counters file holds (2^32); lower the parallelism",
            owners.subtasks, owners.channels
        ),
    })?;
    let run_dir = match &g.config.run_dir {
        Some(d) => RunDir::given(d.clone())?,
        None => RunDir::claim(&g.config.name)?,
    };
    let counters = JobCounters::create(&run_dir.path().join("counters"), &g.config.name, capacity)?;
    Ok(CounterFiles { counters, capacity, run_dir })
}

/// The job's own counters.
struct JobCountersSet {
    rss: SharedCounter,
    budget: SharedCounter,
    state: SharedCounter,
    checkpoints: Option<coordinator::Counters>,
}

/// Stage: the job's counters (and the coordinator's, when the job takes checkpoints).
fn job_counters(counters: &JobCounters, restore: Option<&Restore>) -> Result<JobCountersSet, StartError> {
    let [rss, budget, state] = counters.counters(&JOB, "job")?;
    let checkpoints = match restore {
        Some(r) => {
            let c = coordinator::Counters::new(counters.counters(&CHECKPOINT, "job")?);
            if let Some(m) = &r.manifest {
                c.last_id.set(m.id);
            }
            Some(c)
        }
        None => None,
    };
    Ok(JobCountersSet { rss, budget, state, checkpoints })
}

/// Each subtask's context and counters, `[chain][index]`.
type Contexts = Vec<Vec<(Arc<SubtaskContext>, SubtaskCounters)>>;

/// Stage: each subtask's context (mailbox, idle strategy, time account, waiting note) and its
/// counters, `[chain][index]`; and the subtasks' clocks for the monitor.
fn subtask_contexts(
    g: &GraphInner,
    plan: &Plan,
    placement: &[Vec<Option<usize>>],
    counters: &JobCounters,
) -> Result<(Contexts, Vec<SubtaskClock>), StartError> {
    let shared = shared_cpus(placement);
    let crowded = placement.iter().flatten().count() >= super::plan::host_cpus(false);
    let mut contexts = Vec::new();
    let mut clocks = Vec::new();
    for (c, chain) in plan.chains.iter().enumerate() {
        let head = &g.nodes[chain.nodes[0]].id;
        let mut per = Vec::new();
        for i in 0..chain.parallelism {
            let name = format!("{head}#{i}");
            let [busy_ns, backpressured_ns, idle_ns, waiting_ns, records_in, state] =
                counters.counters(&SUBTASK, &name)?;
            // Idle until its thread starts (`Subtask::run`).
            let time = Arc::new(TimeAccount::default());
            time.set_idle(true, time.start());
            let waiting = Arc::new(Waiting::new(name, time.clone()));
            let ctx = Arc::new(SubtaskContext {
                mailbox: Arc::new(Mailbox::default()),
                idle: idle_strategy(g.config.idle, shared(placement[c][i as usize]), crowded),
                time: time.clone(),
                waiting: waiting.clone(),
            });
            clocks.push(SubtaskClock { time, waiting, counters: [busy_ns, backpressured_ns, idle_ns, waiting_ns] });
            per.push((ctx, SubtaskCounters { records_in, state }));
        }
        contexts.push(per);
    }
    Ok((contexts, clocks))
}

/// Whether a subtask placed on a CPU shares it with other subtasks of the job (unpinned
/// subtasks share the host's cores when they outnumber them).
fn shared_cpus(placement: &[Vec<Option<usize>>]) -> impl Fn(Option<usize>) -> bool {
    let mut per_cpu: HashMap<usize, usize> = HashMap::new();
    let mut unpinned = 0;
    for cpu in placement.iter().flatten() {
        match cpu {
            Some(c) => *per_cpu.entry(*c).or_default() += 1,
            None => unpinned += 1,
        }
    }
    let cores = super::plan::host_cpus(false);
    move |cpu| match cpu {
        Some(c) => per_cpu.get(&c).copied().unwrap_or(0) > 1,
        None => unpinned > cores,
    }
}

/// A subtask's idle strategy. The default (park after spinning and yielding) parks at
/// once on a CPU the subtask shares: spinning there takes the CPU from the very subtasks
/// it waits for (its thread-mates may be its producer or consumer), and `sched_yield`
/// under CFS gives no CPU time away for sure. Measured on the unchained 5-subtask chain on
/// 2 vCPUs (medians of 5 alternating runs, `bench/examples/chain_unchained.rs`): 2.65 M
/// records per CPU-s with 64 spins and 8 yields, 2.98 M with no yields, 3.32 M parking
/// at once, and a third fewer context switches. Where the job has as many subtasks as the
/// host has CPUs or more (`crowded`), it spins but never yields: every CPU has a subtask
/// that may want it. An explicit other strategy is kept.
fn idle_strategy(configured: IdleStrategy, shared_cpu: bool, crowded: bool) -> IdleStrategy {
    match configured {
        IdleStrategy::Park { .. } if configured != IdleStrategy::default() => configured,
        IdleStrategy::Park { .. } if shared_cpu => PARK_AT_ONCE,
        IdleStrategy::Park { spin, .. } if crowded => IdleStrategy::Park { spin, yields: 0 },
        _ => configured,
    }
}

/// The idle strategy of a subtask that shares its CPU.
const PARK_AT_ONCE: IdleStrategy = IdleStrategy::Park { spin: Duration::ZERO, yields: 0 };

/// Every ring of the job: sending halves by (exchange, sender), receiving halves by
/// [chain][receiver], and what the monitor and the coordinator watch.
struct Rings {
    outputs: HashMap<(usize, u32), Vec<OutputChannel>>,
    inputs: Vec<Vec<Vec<InputChannel>>>,
    gauges: Vec<ChannelGauge>,
    count: usize,
    /// Their regions' bytes, together (an exchange's rings may be smaller than a forward
    /// edge's: `Plan::ring_config`).
    bytes: u64,
}

/// Stage: one ring per (sender subtask, receiver subtask) pair of every exchange (one per
/// sender on a forward edge), with its counters.
fn make_rings(g: &GraphInner, plan: &Plan, counters: &JobCounters) -> Result<Rings, StartError> {
    let mut rings = Rings {
        outputs: HashMap::new(),
        inputs: plan.chains.iter().map(|ch| (0..ch.parallelism).map(|_| Vec::new()).collect()).collect(),
        gauges: Vec::new(),
        count: 0,
        bytes: 0,
    };
    for (xi, x) in plan.exchanges.iter().enumerate() {
        let ring_config = plan.ring_config(x, &g.config);
        let slot_count = ring_config.slot_count as u64;
        let edge = &g.edges[x.edge];
        let (from, to) = (&g.nodes[edge.from].id, &g.nodes[edge.to].id);
        let (pa, pb) = (plan.chains[x.from_chain].parallelism, plan.chains[x.to_chain].parallelism);
        for j in 0..pa {
            let receivers: Vec<u32> = if x.partitioning == Partitioning::Forward { vec![j] } else { (0..pb).collect() };
            for i in receivers {
                let name = format!("{from}#{j}->{to}#{i}");
                let (producer, consumer) = weir_ring::channel(ring_config)
                    .map_err(|e| StartError::Graph(GraphError::Setting { field: "ring", problem: e.to_string() }))?;
                rings.count += 1;
                rings.bytes += ring_config.region_bytes();
                let [slots, credit, backlog, blocked_ns, announced, drain_rate, drain_us] =
                    counters.counters(&CHANNEL, &name)?;
                slots.set(slot_count);
                credit.set(slot_count);
                announced.set(slot_count);
                rings.gauges.push(ChannelGauge {
                    name: name.clone(),
                    ring: producer.observer(),
                    credit,
                    backlog,
                    drain_rate: drain_rate.clone(),
                    drain_us,
                });
                rings.outputs.entry((xi, j)).or_default().push(OutputChannel {
                    producer,
                    name: name.clone(),
                    blocked_ns,
                });
                rings.inputs[x.to_chain][i as usize].push(InputChannel {
                    consumer,
                    name,
                    ended: false,
                    blocked: false,
                    drain: x.inflight_target.map(|t| Drain::new(t, announced, drain_rate)),
                });
            }
        }
    }
    Ok(rings)
}

/// Stage: where each subtask runs, `[chain][index]`, decided before the chains are built:
/// keyed state is sharded by core, and a stateful subtask gets the shard of the core it is
/// pinned to. A node's cpus if given, else round robin over the host's cores, in the order
/// subtasks are built and spawned.
fn place(g: &GraphInner, plan: &Plan) -> Vec<Vec<Option<usize>>> {
    let cores = if g.config.pinning { core_affinity::get_core_ids().unwrap_or_default() } else { Vec::new() };
    let mut placement = Vec::new();
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
    placement
}

/// What every subtask needs to take part in checkpoints.
struct CheckpointWiring {
    root: PathBuf,
    manifest: Option<Arc<crate::checkpoint::Manifest>>,
    /// Where `manifest`'s files are (the checkpoint directory, or a savepoint's).
    restored_root: PathBuf,
    allow_dropped_state: bool,
    /// This run's final-checkpoint directory: unique, so a rerun never writes over the
    /// files of a final checkpoint it restored.
    final_dir: String,
    acks: std::sync::mpsc::Sender<coordinator::Msg>,
}

impl CheckpointWiring {
    fn new(r: &Restore, allow_dropped: bool, acks: std::sync::mpsc::Sender<coordinator::Msg>) -> CheckpointWiring {
        let final_dir = format!(
            "final-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        );
        CheckpointWiring {
            root: r.root.clone(),
            manifest: r.manifest.clone(),
            restored_root: r.restored_root.clone(),
            allow_dropped_state: allow_dropped,
            final_dir,
            acks,
        }
    }

    /// The checkpoint context of subtask `index` of `parallelism`, named `subtask`.
    fn snapshots(&self, subtask: &str, index: u32, parallelism: u32) -> Snapshots {
        Snapshots::new(
            subtask.to_owned(),
            (index, parallelism),
            self.root.clone(),
            self.final_dir.clone(),
            self.manifest.clone().map(|m| (m, self.restored_root.clone())),
            self.allow_dropped_state,
        )
    }
}

/// Every subtask, built, in spawn order: its name, its CPU, the subtask.
struct Chains {
    subtasks: Vec<Placed>,
    /// Per node: id, op, parallelism, each subtask's counters (for the summary).
    node_counters: Vec<(String, &'static str, u32, Vec<NodeCounters>)>,
}

/// Stage: each subtask's operator chain, built from its tail (the ring writers or the sink)
/// to its head (the source, or the decoder of its input rings).
#[allow(clippy::too_many_arguments)]
fn build_chains(
    g: &GraphInner,
    plan: &Plan,
    counters: &JobCounters,
    contexts: &Contexts,
    rings: &mut Rings,
    placement: &[Vec<Option<usize>>],
    #[cfg_attr(not(feature = "rocksdb"), allow(unused_variables))] state: Option<&JobState>,
    checkpoints: Option<&CheckpointWiring>,
) -> Result<Chains, StartError> {
    let config = &g.config;
    let mut chains = Chains {
        subtasks: Vec::new(),
        node_counters: g.nodes.iter().map(|n| (n.id.clone(), n.op, n.parallelism, Vec::new())).collect(),
    };
    for (ci, chain) in plan.chains.iter().enumerate() {
        let tail = *chain.nodes.last().expect("chains are not empty");
        for i in 0..chain.parallelism {
            let (ctx, sub_counters) = contexts[ci][i as usize].clone();
            let subtask_name = format!("{}#{i}", g.nodes[chain.nodes[0]].id);
            let snapshots = checkpoints.map(|c| c.snapshots(&subtask_name, i, chain.parallelism)).unwrap_or_default();
            let mut down: Option<AnyCollector> = None;
            if !matches!(g.nodes[tail].kind, NodeKind::Sink(_)) {
                let writers: Vec<AnyCollector> = plan
                    .exchanges
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.from_chain == ci)
                    .map(|(xi, x)| {
                        let channels = rings.outputs.remove(&(xi, i)).expect("rings were made for every sender");
                        let gate = OutputGate::new(
                            channels,
                            x.partitioning,
                            config.max_key_groups,
                            config.record_frames,
                            ctx.clone(),
                        );
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
                    job: config.name.clone(),
                    node: node.id.clone(),
                    index: i,
                    parallelism: node.parallelism,
                    max_key_groups: config.max_key_groups,
                    owned: config.instance.as_ref().map(|s| s.owned.contains(&i)),
                };
                #[cfg(feature = "rocksdb")]
                let shard = match (state, node.state_bytes > 0) {
                    (Some(s), true) => s.backend.as_ref().map(|b| StateShard::new(b.clone(), s.shard_of[&(ci, i)])),
                    _ => None,
                };
                // No RocksDB in this build: keyed state is on the heap.
                #[cfg(not(feature = "rocksdb"))]
                let shard: Option<StateShard> = None;
                let env =
                    OperatorEnv { shard, snapshots: snapshots.clone(), latency_interval: config.latency_interval };
                let position = chain.nodes.iter().position(|&n| n == ni).expect("a node of its chain");
                let kind = NodeCounterKinds {
                    window: node.op == "window",
                    stateful: node.state_bytes > 0,
                    sink: matches!(node.kind, NodeKind::Sink(_)),
                };
                let nc = node_counters(counters, &info.name(), kind, (&subtask_name, position))?;
                chains.node_counters[ni].3.push(nc.clone());
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
                let channels = std::mem::take(&mut rings.inputs[ci][i as usize]);
                Body::Input {
                    gate: InputGate::new(channels, config.watermark_idle_timeout),
                    input: decoder(down.take().expect("a chain has a head collector"), &head.id),
                }
            });
            let checkpoints = checkpoints.map(|c| subtask::Checkpoints {
                snapshots,
                acks: c.acks.clone(),
                index: chains.subtasks.len(),
                held: Default::default(),
            });
            if let Some(cp) = &checkpoints {
                // Code waiting on the outside inside this subtask (a sink at its bound) can
                // fail the checkpoint on its way at once, saying why.
                let (acks, index) = (cp.acks.clone(), cp.index);
                ctx.mailbox.flags.on_decline(Box::new(move |id, why| {
                    let parts = crate::checkpoint::Parts { errors: vec![why], ..Default::default() };
                    let _ =
                        acks.send(coordinator::Msg::Ack(coordinator::Ack { id, subtask: index, parts, timing: None }));
                }));
            }
            chains.subtasks.push((
                subtask_name,
                placement[ci][i as usize],
                Subtask { body, ctx, counters: sub_counters, checkpoints },
            ));
        }
    }
    Ok(chains)
}

/// Which of a node's optional counters it has: late records for windows, evicted keys for
/// stateful nodes (both counted in the file's capacity for every node), end-to-end latency
/// for sinks.
struct NodeCounterKinds {
    window: bool,
    stateful: bool,
    sink: bool,
}

/// One node subtask's counters ([`NODE`]), `owner` being `node#index`, run at `position` in
/// the chain of subtask `in_subtask` (its chain position counter, owned by
/// `node#index@subtask`, is written here once).
fn node_counters(
    counters: &JobCounters,
    owner: &str,
    kind: NodeCounterKinds,
    (in_subtask, position): (&str, usize),
) -> Result<NodeCounters, StartError> {
    let [records_in, records_out, late, evicted, chain_position] = NODE;
    let maybe = |on: bool, kind| if on { counters.counter(kind, owner) } else { Ok(SharedCounter::detached()) };
    counters.counter(chain_position, &format!("{owner}@{in_subtask}"))?.set(position as u64);
    Ok(NodeCounters {
        records_in: counters.counter(records_in, owner)?,
        records_out: counters.counter(records_out, owner)?,
        late_records: maybe(kind.window, late)?,
        evicted_keys: maybe(kind.stateful, evicted)?,
        latency: if kind.sink {
            LATENCY.iter().map(|k| counters.counter(*k, owner)).collect::<Result<_, _>>()?
        } else {
            Vec::new()
        },
    })
}

/// Stage: the memory budget, as a sum of its owners.
fn budget(g: &GraphInner, rings: &Rings, subtasks: usize, capacity: u32, state: Option<&JobState>) -> Budget {
    let baseline = weir_ring::process::rss_bytes().unwrap_or(0);
    let state_parts = g.nodes.iter().filter(|n| n.state_bytes > 0).map(|n| {
        (
            format!("{} state cache ({} x {})", n.id, n.parallelism, bytes(n.state_bytes)),
            n.parallelism as u64 * n.state_bytes,
        )
    });
    Budget {
        parts: vec![
            (format!("rings ({})", rings.count), rings.bytes),
            (
                format!("subtasks ({subtasks} x {})", bytes(SUBTASK_ALLOWANCE_BYTES)),
                subtasks as u64 * SUBTASK_ALLOWANCE_BYTES,
            ),
            ("counters file".into(), 128 * 2 * capacity as u64 + 128),
            ("process at start".into(), baseline),
            ("runtime allowance".into(), RUNTIME_ALLOWANCE_BYTES),
        ]
        .into_iter()
        .chain(g.config.connector_memory.iter().cloned())
        .chain(state_parts)
        // RocksDB's own bound, now that every stateful operator has opened its column family,
        // and the allocator's slack over it.
        .chain(rocksdb_budget(state))
        .collect(),
    }
}

/// Stage: the checkpoint coordinator (before the subtasks: they may finish at once and ack).
fn start_coordinator(
    g: &GraphInner,
    r: Restore,
    counters: coordinator::Counters,
    wiring: CheckpointWiring,
    acks: std::sync::mpsc::Receiver<coordinator::Msg>,
    chains: &Chains,
    rings: &Rings,
) -> Result<CoordinatorHandle, StartError> {
    let settings = g.config.checkpoints.clone().expect("a job that restores takes checkpoints");
    if let Some(m) = &r.manifest {
        tracing::info!(
            event = "restore",
            job = %g.config.name,
            checkpoint = m.id,
            dir = %settings.dir.display(),
            "restoring {} {}: sources resume from its positions",
            if m.savepoint.is_some() { "savepoint" } else { "checkpoint" },
            m.id
        );
    }
    let stats = Arc::new(std::sync::Mutex::new(super::CheckpointStats {
        restored_from: r.manifest.as_ref().map(|m| m.id),
        rescaled: r.rescaled.iter().map(|x| (x.node.clone(), x.from, x.to)).collect(),
        ..Default::default()
    }));
    let members = chains
        .subtasks
        .iter()
        .map(|(name, _, s)| coordinator::Member {
            name: name.clone(),
            mailbox: s.ctx.mailbox.clone(),
            waiting: s.ctx.waiting.clone(),
            is_source: matches!(s.body, Body::Source(_)),
        })
        .collect();
    let c = Coordinator {
        settings,
        job: g.config.name.clone(),
        max_key_groups: g.config.max_key_groups,
        members,
        channels: rings.gauges.iter().map(|c| (c.name.clone(), c.ring.clone())).collect(),
        counters,
        next_id: r.next_id,
        stats,
        final_dir: wiring.final_dir.clone(),
        last_blobs: Default::default(),
        nodes: r.nodes,
        fingerprint: r.fingerprint,
        lineage: r.lineage,
        stop_timeout: g.config.stop_timeout,
        stopped_at: Default::default(),
    };
    c.spawn(wiring.acks, acks).map_err(|source| StartError::Spawn { name: "weir-checkpoint".into(), source })
}

/// A subtask built, with its name and its CPU.
type Placed = (String, Option<usize>, Subtask);

/// Stage: one thread per subtask, pinned where placed; with `fibers`, one thread per CPU
/// for the subtasks pinned to it, each a fiber ([`weir_ring::fiber`]). Handles come back in
/// the order of `subtasks`.
fn spawn(g: &GraphInner, subtasks: Vec<Placed>) -> Result<Vec<SubtaskHandle>, StartError> {
    let failures = Arc::new(AtomicU64::new(0));
    let exits = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let pin = g.config.pinning;
    // Which subtasks share a thread: those pinned to one CPU, when fibers are on.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of_cpu: HashMap<usize, usize> = HashMap::new();
    for (i, (_, cpu, _)) in subtasks.iter().enumerate() {
        match cpu {
            Some(c) if g.config.fibers && pin => {
                let k = *group_of_cpu.entry(*c).or_insert_with(|| {
                    groups.push(Vec::new());
                    groups.len() - 1
                });
                groups[k].push(i);
            }
            _ => groups.push(vec![i]),
        }
    }
    let shared: Vec<String> = groups
        .iter()
        .filter(|m| m.len() > 1)
        .map(|m| format!("{} on CPU {}", m.len(), subtasks[m[0]].1.unwrap_or_default()))
        .collect();
    if !shared.is_empty() {
        tracing::info!(job = %g.config.name, "fibers: one thread per CPU for its subtasks ({})", shared.join(", "));
    }
    let mut slots: Vec<Option<Placed>> = subtasks.into_iter().map(Some).collect();
    let mut handles: Vec<Option<SubtaskHandle>> = (0..slots.len()).map(|_| None).collect();
    for group in groups {
        let members: Vec<(usize, Placed)> =
            group.iter().map(|&i| (i, slots[i].take().expect("each subtask in one group"))).collect();
        let cpu = members[0].1.1;
        if members.len() == 1 {
            let (i, (name, cpu, subtask)) = members.into_iter().next().expect("one member");
            let mailbox = subtask.ctx.mailbox.clone();
            let waiting = subtask.ctx.waiting.clone();
            let outcome = Arc::new(Outcome::new(failures.clone(), exits.clone()));
            let thread = std::thread::Builder::new()
                .name(thread_name(&name))
                .spawn({
                    let outcome = outcome.clone();
                    move || {
                        // Dropped last: the exit is counted after everything else.
                        let _on_exit = outcome.on_exit();
                        let _on_panic = outcome.on_panic();
                        crate::telemetry::waiting::install(subtask.ctx.waiting.clone());
                        crate::operators::outside::install(subtask.ctx.mailbox.flags.clone());
                        if let (true, Some(id)) = (pin, cpu) {
                            core_affinity::set_for_current(core_affinity::CoreId { id });
                        }
                        weir_ring::set_timer_slack(TIMER_SLACK);
                        subtask.run(|failed| outcome.ended(failed))
                    }
                })
                .map_err(|source| StartError::Spawn { name: name.clone(), source })?;
            let cpu = if pin { cpu } else { None };
            handles[i] =
                Some(SubtaskHandle { name, outcome, cpu, mailbox, waiting, thread: SubtaskThread::Own(thread) });
            continue;
        }
        // Fibers of one thread: each fills its own `ended` and counts its own exit.
        let thread_slot = Arc::new(std::sync::Mutex::new(None));
        let mut fibers = Vec::new();
        for (i, (name, cpu, subtask)) in members {
            let mailbox = subtask.ctx.mailbox.clone();
            let waiting = subtask.ctx.waiting.clone();
            let outcome = Arc::new(Outcome::new(failures.clone(), exits.clone()));
            let ended = Arc::new(std::sync::Mutex::new(None));
            fibers.push((name.clone(), subtask, outcome.clone(), ended.clone()));
            let thread = SubtaskThread::Fiber { ended, thread: thread_slot.clone() };
            handles[i] = Some(SubtaskHandle { name, outcome, cpu, mailbox, waiting, thread });
        }
        let name = format!("weir-cpu{}", cpu.unwrap_or_default());
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || run_fibers(cpu, fibers))
            .map_err(|source| StartError::Spawn { name, source })?;
        *thread_slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
    }
    Ok(handles.into_iter().map(|h| h.expect("every subtask spawned")).collect())
}

/// A subtask to run as a fiber: its name, itself, its outcome and where its end goes.
type FiberMember = (String, Subtask, Arc<Outcome>, Arc<std::sync::Mutex<Option<super::running::Ended>>>);

/// The thread of one CPU's fibers: pin it, run each subtask as a fiber to its end (each
/// fills its own `ended` and counts its own exit, as a thread of its own would), and warn
/// of a turn that held the others.
fn run_fibers(cpu: Option<usize>, fibers: Vec<FiberMember>) {
    if let Some(id) = cpu {
        core_affinity::set_for_current(core_affinity::CoreId { id });
    }
    weir_ring::set_timer_slack(TIMER_SLACK);
    let mut set = weir_ring::fiber::Fibers::new();
    let mut names = Vec::new();
    for (name, subtask, outcome, ended) in fibers {
        let (waiting, flags) = (subtask.ctx.waiting.clone(), subtask.ctx.mailbox.flags.clone());
        let (failed, failed_ended) = (outcome.clone(), ended.clone());
        let body = move || {
            // Dropped last: the exit is counted after `ended` is filled.
            let _on_exit = outcome.on_exit();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _on_panic = outcome.on_panic();
                subtask.run(|failed| outcome.ended(failed))
            }));
            *ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        };
        let on_resume = move || {
            crate::telemetry::waiting::install(waiting.clone());
            crate::operators::outside::install(flags.clone());
        };
        match set.spawn(weir_ring::fiber::FIBER_STACK, on_resume, body) {
            Ok(()) => names.push(name),
            Err(e) => {
                // No stack for it: it fails (and the job stops the others).
                let _on_exit = failed.on_exit();
                failed.ended(true);
                let message = format!("no stack for this subtask's fiber: {e}");
                *failed_ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(Err(Box::new(message)));
            }
        }
    }
    // A turn that holds the thread long held every other subtask of the CPU: say which, at
    // most once a minute per subtask.
    let mut warned: Vec<Option<Instant>> = vec![None; names.len()];
    let others = names.len().saturating_sub(1);
    set.run_watched(LONG_FIBER_TURN, |i, took| {
        if warned[i].is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
            return;
        }
        warned[i] = Some(Instant::now());
        tracing::warn!(
            subtask = %names[i],
            "{} kept CPU {}'s thread for {} ms without parking, and the {others} other subtasks there \
             (fibers) waited that long; an operator that blocks (a sleep, a synchronous call) holds them \
             all: give its node a CPU of its own (`cpus`), or turn fibers off",
            names[i],
            cpu.unwrap_or_default(),
            took.as_millis()
        );
    });
}

/// A fiber's turn this long is reported (see `run_fibers`): longer than any pass should take but
/// a snapshot of much state or a firing of many windows.
const LONG_FIBER_TURN: Duration = Duration::from_millis(100);

/// How late a subtask's timed wait (a source's next record, the next timer, a park with a
/// latency budget) may end: the kernel's default of 50 µs would be added to the latency of
/// every record a sleeping side waits for.
const TIMER_SLACK: Duration = Duration::from_micros(1);

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The default park strategy parks at once on a shared CPU and never yields where the
    /// job has as many subtasks as CPUs; explicit strategies are kept as given.
    #[test]
    fn the_default_strategy_follows_the_placement() {
        let default = IdleStrategy::default();
        let IdleStrategy::Park { spin, .. } = default else { panic!("the default parks") };
        assert_eq!(idle_strategy(default, false, false), default);
        assert_eq!(idle_strategy(default, true, false), PARK_AT_ONCE);
        assert_eq!(idle_strategy(default, true, true), PARK_AT_ONCE);
        assert_eq!(idle_strategy(default, false, true), IdleStrategy::Park { spin, yields: 0 });
        let explicit = IdleStrategy::Park { spin: Duration::from_micros(3), yields: 2 };
        for (shared, crowded) in [(false, false), (true, false), (false, true)] {
            assert_eq!(idle_strategy(explicit, shared, crowded), explicit);
            assert_eq!(idle_strategy(IdleStrategy::BusySpin, shared, crowded), IdleStrategy::BusySpin);
        }
    }
}
