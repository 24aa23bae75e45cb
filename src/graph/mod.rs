//! Describing a job: a typed builder of sources, operators and sinks joined by edges.
//! Describing is separate from running: [`Job::start`] hands the description to the runtime.
//!
//! ```no_run
//! use weir::graph::Job;
//! use weir::operators::builtin::{Generator, CountingSink};
//! use weir::record::Event;
//!
//! let job = Job::new("clicks");
//! let events = job.source("gen", 1, |info| Generator::events(info, 1_000_000, 1_000));
//! let doubled = events.map("double", |e: &Event| Event { value: e.value * 2, ..*e });
//! doubled.key_by("by_user", |e: &Event| e.key).sink("count", 2, |_| CountingSink::default());
//! let summary = job.run().expect("job runs");
//! println!("{summary}");
//! ```

mod error;
pub mod jobfile;
mod join;
mod side;
mod window;

pub use error::GraphError;
pub use join::{ConnectedStreams, KeyedConnectedStreams};
pub use window::WindowedStream;

use crate::chain::{
    DecoderFn, LinkFn, SinkFn, SourceFn, TeeFn, decoder_fn, filter_fn, flat_map_fn, keyed_fn, map_fn, sink_fn,
    source_fn, tee_fn,
};
use crate::exchange::{WriterFn, writer_fn};
use crate::operators::{KeyedProcess, Sink, Source, SubtaskInfo};
use crate::record::Record;
use crate::record::{KeyFn, Partitioning, hash_key};
use crate::time::{TimestampFn, WatermarkStrategy};
use std::cell::RefCell;
use std::hash::Hash;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use weir_ring::{IdleStrategy, RingConfig};

/// What a node does.
pub(crate) enum NodeKind {
    Source(SourceFn),
    Operator(LinkFn),
    Sink(SinkFn),
}

/// One logical node: an operator with an id and a parallelism.
pub(crate) struct Node {
    pub id: String,
    /// "source", "map", "filter", "flat_map", "watermark", "keyed", "keyed_state" (a keyed
    /// operator with [`crate::state::KeyedState`]), "window", "sink".
    pub op: &'static str,
    pub parallelism: u32,
    pub cpus: Option<Vec<usize>>,
    pub kind: NodeKind,
    /// Decodes this node's input type from ring bytes (None for sources).
    pub decoder: Option<DecoderFn>,
    /// Joins collectors of this node's output type (None for sinks).
    pub tee: Option<TeeFn>,
    /// Whether the operator is keyed (needs a hash input).
    pub keyed: bool,
    /// Bytes of state each subtask may keep in memory (a window's cache), for the budget.
    pub state_bytes: u64,
    /// How the merge operands this node writes to its state combine (see
    /// [`crate::state::ValueMerge`]); given to the state backend when it opens.
    pub merge: Option<crate::state::ValueMerge>,
    /// The state its graph declares (a window's shape, aggregates and accumulator type):
    /// checkpoints record it, and a restore into another version of the job checks it
    /// ([`crate::checkpoint::upgrade`]).
    pub state_schema: Option<crate::checkpoint::upgrade::StateSchema>,
}

/// An edge between two nodes.
pub(crate) struct Edge {
    pub from: usize,
    pub to: usize,
    /// `None`: forward if parallelism is equal, else rebalance (decided at start).
    pub partitioning: Option<Partitioning>,
    pub writer: WriterFn,
    /// The id given to `key_by`, for messages (and checkpoints: it names how state is keyed).
    pub key_by: Option<String>,
    /// The type of the `key_by` key (`std::any::type_name`).
    pub key_type: Option<&'static str>,
}

/// Job-wide settings.
#[derive(Debug, Clone, PartialEq)]
pub struct JobConfig {
    /// Job name (counters file, thread names in tools).
    pub name: String,
    /// Key groups for hash partitioning (the most parallelism a keyed node can have).
    pub max_key_groups: u32,
    /// Slots per ring ([`DEFAULT_RING_SLOTS`] unless given). Where an exchange's rings
    /// together would hold more than 64 MiB of slots (an all-to-all exchange has
    /// parallelism² rings), its rings are halved until they fit, down to 1024 slots (or
    /// `ring_slots`, if smaller), and never below what the largest record needs.
    pub ring_slots: u32,
    /// Bytes per ring slot.
    pub slot_bytes: u32,
    /// Largest encoded record.
    pub max_record_bytes: u32,
    /// How idle subtasks wait.
    pub idle: IdleStrategy,
    /// Credit by time: how long data in flight may take to drain along the longest path of
    /// rings from a source to a sink — what a barrier waits behind, and a result queues
    /// behind, when a stage is slow. Each channel gets an equal share (this over the number
    /// of rings on the longest path through it) and its receiver announces what it drains
    /// in that time ([`crate::exchange`]'s `credit.rs`). `None`: rings fill up to their size.
    /// Rings are allocated whole either way: this bounds data in flight, not memory.
    pub inflight_target: Option<Duration>,
    /// Per receiving node id: the in-flight target of each of its input channels, instead
    /// of its share of `inflight_target` (`None`: its channels announce nothing).
    pub node_inflight_targets: std::collections::BTreeMap<String, Option<Duration>>,
    /// Chain forward edges of equal parallelism into one subtask.
    pub chaining: bool,
    /// Records travel between subtasks in frames: one header per batch, records found by
    /// index (fixed-layout types) or through an offset table ([`weir_ring::Stride`]).
    /// `false` gives each record a header of its own — the layout before frames, kept as
    /// the baseline `weir-bench pipeline` measures frames against.
    pub record_frames: bool,
    /// Pin each subtask to a CPU (its node's `cpus`, else round robin over the host's).
    pub pinning: bool,
    /// Subtasks pinned to the same CPU run as fibers of one thread ([`weir_ring::fiber`]):
    /// a hand-over between them is a switch of stacks where one would park, not a futex
    /// wake and a trip through the scheduler. For more subtasks than CPUs. Needs `pinning`;
    /// not with busy-spin (a spinning fiber would keep its thread).
    pub fibers: bool,
    /// Directory for the counters file (yours: 0700, checked); default a fresh
    /// `<name>-<pid>-<n>` under [`run_root`](crate::runtime::run_root), removed at the end.
    pub run_dir: Option<PathBuf>,
    /// An input channel that sends nothing for this long stops holding its receiver's
    /// watermark back until it sends again (Flink's `withIdleness`); `None`: never. Too short,
    /// and a channel that is merely slow makes its records late.
    pub watermark_idle_timeout: Option<Duration>,
    /// Where keyed state goes beyond the operators' in-memory caches.
    pub state: StateSettings,
    /// Checkpoints (`None`: the job takes none, and a restart starts over).
    pub checkpoints: Option<crate::checkpoint::CheckpointSettings>,
    /// Memory the job's connectors hold outside what weir allocates itself (a Kafka
    /// client's prefetch, a producer's queue), as `(owner, bytes)`: added to the budget.
    pub connector_memory: Vec<(String, u64)>,
    /// Per-partition consumer lag of the job's sources, published as counters
    /// (`node[partition]`) while the job runs, for `weir-stat`.
    pub lag_gauges: Vec<crate::telemetry::sources::LagGauge>,
    /// Rings other processes write into the job's sources (ipc endpoints), published as
    /// channels (`ipc:<endpoint>-><node>#<i>`: slots, fill, the publisher's blocked time).
    pub endpoint_gauges: Vec<crate::telemetry::sources::EndpointGauge>,
    /// End-to-end latency: each source subtask sends a latency marker behind its records
    /// this often (while it emits any), and every sink measures, per marker, ingest →
    /// acknowledged and event time → acknowledged ([`crate::operators::LatencyMarker`];
    /// published per sink subtask as counters). `None`: no markers. Sampling: what the
    /// sinks' histograms hold is one sample per marker, not one per record.
    pub latency_interval: Option<Duration>,
    /// How long a stop may take ([`RunningJob::stop`](crate::runtime::RunningJob::stop); the
    /// first SIGINT or SIGTERM of `weir run`): subtasks waiting on the outside give up their
    /// waits (what was in flight is replayed from the last checkpoint); one still running
    /// after this is named with what it waits on, and the job ends without it. Default 10 s.
    pub stop_timeout: Duration,
    /// Sink nodes' figures (records acknowledged, in flight, retries, dead letters,
    /// acknowledgement latency), published as counters while the job runs. Connector sinks
    /// offer theirs (`HttpSinkConfig::sink_gauge`, `KafkaSinkConfig::sink_gauge`).
    pub sink_gauges: Vec<crate::telemetry::sinks::SinkGauge>,
    /// This process runs the job as one instance of several that share its input partitions
    /// (`weir run --instance`, [`crate::cluster`]); `None`: it runs the whole job alone.
    pub instance: Option<InstanceShare>,
}

/// How instances of a job share it (`[job] group`, `checkpoint_store`, `session_timeout_ms`
/// in job files; used by `weir run --instance`, [`crate::cluster`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSettings {
    /// The Kafka consumer group the instances form (default: the job's name).
    pub group: Option<String>,
    /// Where they keep checkpoints: a directory path or `file://`, `s3://` URL.
    pub store: Option<String>,
    /// Kafka's `session.timeout.ms` for the group: how long a silent instance keeps its
    /// partitions (a restart within it keeps them: static membership).
    pub session_timeout: Option<Duration>,
}

/// What one instance of a job run by several serves: every node gets `partitions` subtasks,
/// subtask `i` serving partition `i` of the lead input; key_by edges keep each key in its
/// subtask (the input must be keyed by the job's key: a key in one partition only) and key
/// groups are taken within each subtask's range, so partition `i`'s state is the key-group
/// range of subtask `i` wherever it runs. Subtasks of partitions not `owned` are dormant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceShare {
    /// Partitions of the lead input (the parallelism of every node).
    pub partitions: u32,
    /// The partitions this instance serves now.
    pub owned: std::collections::BTreeSet<u32>,
}

/// Where keyed state (window state beyond the caches) lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateBackendKind {
    /// One RocksDB instance per core the stateful subtasks run on ([`crate::state`]), its
    /// memory bounded and counted in the budget: state larger than memory works. Needs the
    /// `rocksdb` feature (a job asking for it in a build without it does not start).
    RocksDb,
    /// Evicted state stays in the heap, unbounded (tests, and jobs whose state fits).
    Memory,
}

impl StateBackendKind {
    /// RocksDB where the build has it (the `rocksdb` feature), else the heap.
    pub const DEFAULT: StateBackendKind =
        if cfg!(feature = "rocksdb") { StateBackendKind::RocksDb } else { StateBackendKind::Memory };
}

/// State backend settings of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSettings {
    /// Which backend.
    pub backend: StateBackendKind,
    /// The directory of the RocksDB shards. Default: a new directory under the system's temp
    /// dir, removed when the job ends (state does not outlive its job until checkpoints
    /// exist); a directory given here is left in place.
    pub dir: Option<PathBuf>,
    /// RocksDB's block cache, shared by all shards.
    pub block_cache_bytes: usize,
    /// The cap on all RocksDB memtables of all shards.
    pub memtable_bytes: usize,
}

impl Default for StateSettings {
    fn default() -> StateSettings {
        StateSettings {
            backend: StateBackendKind::DEFAULT,
            dir: None,
            block_cache_bytes: 32 << 20,
            memtable_bytes: 16 << 20,
        }
    }
}

/// The default [`JobConfig::inflight_target`]. Measured with `weir-bench backpressure` at 10
/// to 200 ms (README, "Backpressure and credit by time"): below ~50 ms checkpoints stop
/// getting shorter (the protocol's own ~30 ms) and small credit windows cost CPU; 100 ms
/// leaves 20 ms per ring five rings deep, at no cost in throughput.
pub const DEFAULT_INFLIGHT_TARGET: Duration = Duration::from_millis(100);

/// The default [`JobConfig::ring_slots`]: 4096 slots of 64 bytes, 256 KiB a ring. Where
/// subtasks outnumber CPUs, a subtask runs until its output ring is full or its input ring
/// empty, then parks, and the other side is woken: the context switches per record go as
/// one over the ring's size, and they were most of the cost of a hop. Measured on the
/// unchained 5-subtask chain on 2 vCPUs (`bench/examples/chain_unchained.rs`, rings of
/// 1024 / 2048 / 4096 slots, two rounds in one sitting): 26.0–28.1 / 42.2–43.7 / 56.8–61.1
/// M records per CPU-second, 2.96 / 1.47 / 0.72 context switches per 1,000 records (16,384
/// slots: 69.9 M, 0.24). Credit by time still bounds what is in flight
/// ([`JobConfig::inflight_target`]); the ring's bytes are what a ring costs in memory, and
/// an exchange of many rings gets smaller ones (see [`JobConfig::ring_slots`]), so an
/// all-to-all exchange at parallelism 32 and up uses what it did with 1024-slot rings.
pub const DEFAULT_RING_SLOTS: u32 = 4096;

/// The default [`JobConfig::latency_interval`]: 100 samples a second per source subtask,
/// enough for a p99 over one second; a marker is one 24-byte control record in one ring
/// per hop (`weir-bench pipeline` measures the cost against none).
pub const DEFAULT_LATENCY_INTERVAL: Duration = Duration::from_millis(10);

/// How long a stop may take by default ([`JobConfig::stop_timeout`]).
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);

impl JobConfig {
    pub(crate) fn new(name: &str) -> JobConfig {
        JobConfig {
            name: name.to_owned(),
            max_key_groups: 128,
            ring_slots: DEFAULT_RING_SLOTS,
            slot_bytes: 64,
            max_record_bytes: 16 * 1024,
            idle: IdleStrategy::default(),
            inflight_target: Some(DEFAULT_INFLIGHT_TARGET),
            node_inflight_targets: std::collections::BTreeMap::new(),
            chaining: true,
            record_frames: true,
            pinning: true,
            fibers: false,
            run_dir: None,
            watermark_idle_timeout: None,
            state: StateSettings::default(),
            checkpoints: None,
            connector_memory: Vec::new(),
            lag_gauges: Vec::new(),
            endpoint_gauges: Vec::new(),
            latency_interval: Some(DEFAULT_LATENCY_INTERVAL),
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            sink_gauges: Vec::new(),
            instance: None,
        }
    }

    /// The job-wide settings the runtime cannot work with.
    pub(crate) fn check(&self) -> Result<(), GraphError> {
        let c = self;
        // The name labels the counters file, HTTP idempotency keys and the run directory
        // (made a safe file name there); what a terminal or a log would garble is refused.
        if c.name.is_empty() || c.name.len() > 200 || c.name.chars().any(char::is_control) {
            return Err(GraphError::Setting {
                field: "name",
                problem: format!("{:?} is not a job name: give 1 to 200 characters, no control characters", c.name),
            });
        }
        if c.max_key_groups == 0 || c.max_key_groups > 32_768 {
            return Err(GraphError::Setting {
                field: "max_key_groups",
                problem: format!("{} is outside 1..=32768", c.max_key_groups),
            });
        }
        for (what, target) in std::iter::once(("inflight_target", &c.inflight_target))
            .chain(c.node_inflight_targets.values().map(|t| ("node inflight_target", t)))
        {
            if let Some(t) = target
                && (t.is_zero() || *t > Duration::from_secs(3600))
            {
                return Err(GraphError::Setting {
                    field: "inflight_target",
                    problem: format!(
                        "{what} of {t:?} is outside 1 ms..=1 h; give a time data in flight may take to drain, or none to let rings fill"
                    ),
                });
            }
        }
        if let Some(i) = c.latency_interval
            && (i < Duration::from_millis(1) || i > Duration::from_secs(3600))
        {
            return Err(GraphError::Setting {
                field: "latency_interval",
                problem: format!(
                    "{i:?} is outside 1 ms..=1 h; give how often sources send a latency marker, or none for no markers"
                ),
            });
        }
        RingConfig { slot_bytes: c.slot_bytes, slot_count: c.ring_slots, max_record_bytes: c.max_record_bytes }
            .validate()
            .map_err(|e| GraphError::Setting { field: "ring", problem: e.to_string() })
    }
}

pub(crate) struct GraphInner {
    pub config: JobConfig,
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
    /// Problems found while building, reported by `validate` (the builder itself never fails).
    pub errors: Vec<GraphError>,
    /// Every node's id, to find a duplicate without scanning the nodes.
    pub ids: std::collections::HashSet<String>,
}

impl GraphInner {
    /// [`Job::fingerprint`].
    pub(crate) fn fingerprint(&self) -> String {
        let mut text = String::new();
        for n in &self.nodes {
            text.push_str(&format!("node {} {}\n", n.id, n.op));
        }
        for e in &self.edges {
            let how = e.partitioning.map_or("auto", |p| p.name());
            text.push_str(&format!("edge {} {} {how}\n", self.nodes[e.from].id, self.nodes[e.to].id));
        }
        format!("{:016x}", crate::util::fnv1a(text.as_bytes()))
    }
}

/// A job being described. Cheap to clone (handles share the graph); not `Send`: describe on
/// one thread, then run.
#[derive(Clone)]
pub struct Job {
    pub(crate) inner: Rc<RefCell<GraphInner>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.inner.borrow();
        f.debug_struct("Job").field("name", &g.config.name).field("nodes", &g.nodes.len()).finish()
    }
}

/// An input a stream will feed into the next node: where from, and how.
struct Pending<T> {
    node: usize,
    partitioning: Option<Partitioning>,
    /// The `key_by` id, its hash function and its key's type name.
    key: Option<(String, KeyFn<T>, &'static str)>,
}

impl<T> Clone for Pending<T> {
    fn clone(&self) -> Self {
        Pending { node: self.node, partitioning: self.partitioning, key: self.key.clone() }
    }
}

/// A stream of `T` records: the output of a node (or a union of several).
pub struct Stream<T> {
    job: Job,
    inputs: Vec<Pending<T>>,
    /// The event time of its records, once declared by `with_event_time`; kept by operators
    /// that keep the record type (filter, partitionings, key_by), lost by those that change it.
    time: Option<TimestampFn<T>>,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Stream<T> {
    fn clone(&self) -> Self {
        Stream { job: self.job.clone(), inputs: self.inputs.clone(), time: self.time.clone(), _t: PhantomData }
    }
}

impl<T> std::fmt::Debug for Stream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.job.inner.borrow();
        let ids: Vec<&str> = self.inputs.iter().map(|p| g.nodes[p.node].id.as_str()).collect();
        f.debug_struct("Stream").field("from", &ids).finish()
    }
}

/// A stream partitioned by a key of type `K`: the next operator gets a hash edge, and
/// keyed operators (and windows, for keys that convert into `u64`) become available.
pub struct KeyedStream<T, K> {
    stream: Stream<T>,
    key_value: Arc<dyn Fn(&T) -> K + Send + Sync>,
}

impl<T, K> std::fmt::Debug for KeyedStream<T, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedStream").field("stream", &self.stream).finish()
    }
}

impl Job {
    /// A new, empty job.
    pub fn new(name: &str) -> Job {
        Job {
            inner: Rc::new(RefCell::new(GraphInner {
                config: JobConfig::new(name),
                nodes: Vec::new(),
                edges: Vec::new(),
                errors: Vec::new(),
                ids: Default::default(),
            })),
        }
    }

    /// Change job-wide settings.
    pub fn configure(&self, f: impl FnOnce(&mut JobConfig)) -> &Job {
        f(&mut self.inner.borrow_mut().config);
        self
    }

    /// The settings.
    pub fn config(&self) -> JobConfig {
        self.inner.borrow().config.clone()
    }

    /// A fingerprint of the graph's shape: every node's id and operator kind, and every edge
    /// with its partitioning, as 16 hex digits (FNV-1a of a canonical text). The same job file
    /// gives the same fingerprint on every host and run; parallelism and settings do not enter
    /// it (instances of one job run it at other parallelisms), a node added, removed or rewired
    /// changes it. Instances carry it in their group membership to tell another job's members
    /// from another version of their own; checkpoints and savepoints record it (`weir state ls`
    /// shows it).
    pub fn fingerprint(&self) -> String {
        self.inner.borrow().fingerprint()
    }

    /// Add a source with `parallelism` subtasks; `factory` builds one per subtask.
    pub fn source<T: Record, S: Source<T> + 'static>(
        &self,
        id: &str,
        parallelism: u32,
        factory: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
    ) -> Stream<T> {
        let node = self.add_node(Node {
            id: id.to_owned(),
            op: "source",
            parallelism,
            cpus: None,
            kind: NodeKind::Source(source_fn::<T, S>(factory)),
            decoder: None,
            tee: Some(tee_fn::<T>()),
            keyed: false,
            state_bytes: 0,
            merge: None,
            state_schema: None,
        });
        Stream {
            job: self.clone(),
            inputs: vec![Pending { node, partitioning: None, key: None }],
            time: None,
            _t: PhantomData,
        }
    }

    fn add_node(&self, node: Node) -> usize {
        let mut g = self.inner.borrow_mut();
        if node.parallelism == 0 {
            let id = node.id.clone();
            g.errors.push(GraphError::Parallelism { node: id });
        }
        if !g.ids.insert(node.id.clone()) {
            let id = node.id.clone();
            g.errors.push(GraphError::DuplicateId { node: id });
        }
        if node.id.is_empty()
            || node.id.len() > 40
            || !node.id.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            let id = node.id.clone();
            g.errors.push(GraphError::BadId { node: id });
        }
        g.nodes.push(node);
        g.nodes.len() - 1
    }

    /// Check the job-wide settings alone.
    pub(crate) fn validate_settings(&self) -> Result<(), GraphError> {
        self.inner.borrow().config.check()
    }
}

impl<T: Record> Stream<T> {
    fn add(&self, mut node: Node) -> usize {
        let parallelism = {
            let g = self.job.inner.borrow();
            self.inputs.iter().map(|p| g.nodes[p.node].parallelism).max().unwrap_or(1)
        };
        if node.parallelism == u32::MAX {
            node.parallelism = parallelism;
        }
        node.decoder = Some(decoder_fn::<T>());
        let to = self.job.add_node(node);
        let mut g = self.job.inner.borrow_mut();
        for p in &self.inputs {
            let writer = writer_fn::<T>(p.key.as_ref().map(|(_, k, _)| k.clone()));
            g.edges.push(Edge {
                from: p.node,
                to,
                partitioning: p.partitioning,
                writer,
                key_by: p.key.as_ref().map(|(id, _, _)| id.clone()),
                key_type: p.key.as_ref().map(|(_, _, t)| *t),
            });
        }
        to
    }

    fn derived<U: Record>(&self, node: usize, time: Option<TimestampFn<U>>) -> Stream<U> {
        Stream {
            job: self.job.clone(),
            inputs: vec![Pending { node, partitioning: None, key: None }],
            time,
            _t: PhantomData,
        }
    }

    pub(crate) fn operator(&self, id: &str, op: &'static str, link: LinkFn, tee: TeeFn, keyed: bool) -> usize {
        self.add(Node {
            id: id.to_owned(),
            op,
            parallelism: u32::MAX,
            cpus: None,
            kind: NodeKind::Operator(link),
            decoder: None,
            tee: Some(tee),
            keyed,
            state_bytes: 0,
            merge: None,
            state_schema: None,
        })
    }

    /// A keyed node after this (hash-partitioned) stream, with its own parallelism and the
    /// state bound of each subtask (for the budget).
    pub(crate) fn keyed_node<U: Record>(
        &self,
        id: &str,
        op: &'static str,
        link: LinkFn,
        parallelism: u32,
        state_bytes: u64,
    ) -> Stream<U> {
        let node = self.operator(id, op, link, tee_fn::<U>(), true);
        {
            let mut g = self.job.inner.borrow_mut();
            g.nodes[node].parallelism = parallelism;
            g.nodes[node].state_bytes = state_bytes;
            if parallelism == 0 {
                g.errors.push(GraphError::Parallelism { node: id.to_owned() });
            }
        }
        self.derived(node, None)
    }

    /// Give node `id` the schema of the state its graph declares.
    pub(crate) fn set_state_schema(&self, id: &str, schema: crate::checkpoint::upgrade::StateSchema) {
        let mut g = self.job.inner.borrow_mut();
        if let Some(n) = g.nodes.iter_mut().rev().find(|n| n.id == id) {
            n.state_schema = Some(schema);
        }
    }

    /// Give node `id`'s state its merge operator.
    pub(crate) fn set_merge(&self, id: &str, merge: Option<crate::state::ValueMerge>) {
        let mut g = self.job.inner.borrow_mut();
        if let Some(n) = g.nodes.iter_mut().rev().find(|n| n.id == id) {
            n.merge = merge;
        }
    }

    /// Record a problem found while building (reported by `validate` and `start`).
    pub(crate) fn push_error(&self, e: GraphError) {
        self.job.inner.borrow_mut().errors.push(e);
    }

    /// Declare the event time of these records, and emit watermarks that follow it by
    /// `strategy` (see [`crate::time`]). Adds an operator `id` that is chained into the node
    /// before it: put it right after the source. The returned stream carries `timestamp` on
    /// to the event-time windows after it (through filters, partitionings and `key_by`).
    ///
    /// ```no_run
    /// # use weir::graph::Job;
    /// # use weir::operators::builtin::{Generator, NullSink};
    /// # use weir::record::Event;
    /// # use weir::time::WatermarkStrategy;
    /// # use std::time::Duration;
    /// let job = Job::new("clicks");
    /// job.source("gen", 1, |info| Generator::events(info, 1_000, 10))
    ///     .with_event_time("ts", |e: &Event| e.time_ns, WatermarkStrategy::bounded(Duration::from_millis(50)))
    ///     .sink("out", 1, |_| NullSink);
    /// ```
    pub fn with_event_time(
        &self,
        id: &str,
        timestamp: impl Fn(&T) -> u64 + Send + Sync + 'static,
        strategy: WatermarkStrategy,
    ) -> Stream<T> {
        let time: TimestampFn<T> = Arc::new(timestamp);
        let link = crate::time::watermarks_fn::<T>(time.clone(), strategy);
        let node = self.operator(id, "watermark", link, tee_fn::<T>(), false);
        self.derived(node, Some(time))
    }

    /// Declare the records' event time, trusting the watermarks the source emits itself (a
    /// Kafka source with [`with_event_time`](crate::io::kafka::KafkaSource::with_event_time)
    /// emits them per partition). Adds no operator; use it right after such a source.
    pub fn with_source_watermarks(&self, timestamp: impl Fn(&T) -> u64 + Send + Sync + 'static) -> Stream<T> {
        Stream { time: Some(Arc::new(timestamp)), ..self.clone() }
    }

    /// The event time declared upstream, if any.
    pub fn event_time(&self) -> Option<TimestampFn<T>> {
        self.time.clone()
    }

    /// One output record per input record.
    pub fn map<U: Record>(&self, id: &str, f: impl Fn(&T) -> U + Send + Sync + 'static) -> Stream<U> {
        let node = self.operator(id, "map", map_fn::<T, U>(f), tee_fn::<U>(), false);
        self.derived(node, None)
    }

    /// Keep the records for which `f` is true.
    pub fn filter(&self, id: &str, f: impl Fn(&T) -> bool + Send + Sync + 'static) -> Stream<T> {
        let node = self.operator(id, "filter", filter_fn::<T>(f), tee_fn::<T>(), false);
        self.derived(node, self.time.clone())
    }

    /// Zero or more output records per input record.
    pub fn flat_map<U: Record, I: IntoIterator<Item = U> + 'static>(
        &self,
        id: &str,
        f: impl Fn(&T) -> I + Send + Sync + 'static,
    ) -> Stream<U> {
        let node = self.operator(id, "flat_map", flat_map_fn::<T, U, I>(f), tee_fn::<U>(), false);
        self.derived(node, None)
    }

    /// Partition by key: records with equal keys go to the same subtask of the next node.
    pub fn key_by<K: Hash + 'static>(
        &self,
        id: &str,
        key: impl Fn(&T) -> K + Send + Sync + 'static,
    ) -> KeyedStream<T, K> {
        let key_value: Arc<dyn Fn(&T) -> K + Send + Sync> = Arc::new(key);
        let value = key_value.clone();
        let key: KeyFn<T> = Arc::new(move |t| hash_key(&value(t)));
        let inputs = self
            .inputs
            .iter()
            .map(|p| Pending {
                node: p.node,
                partitioning: Some(Partitioning::Hash),
                key: Some((id.to_owned(), key.clone(), std::any::type_name::<K>())),
            })
            .collect();
        KeyedStream {
            stream: Stream { job: self.job.clone(), inputs, time: self.time.clone(), _t: PhantomData },
            key_value,
        }
    }

    fn with_partitioning(mut self, partitioning: Partitioning) -> Stream<T> {
        for p in &mut self.inputs {
            p.partitioning = Some(partitioning);
            p.key = None;
        }
        self
    }

    /// The next node receives round robin.
    pub fn rebalance(self) -> Stream<T> {
        self.with_partitioning(Partitioning::Rebalance)
    }

    /// Every subtask of the next node receives every record.
    pub fn broadcast(self) -> Stream<T> {
        self.with_partitioning(Partitioning::Broadcast)
    }

    /// Subtask i feeds subtask i of the next node (parallelism must be equal).
    pub fn forward(self) -> Stream<T> {
        self.with_partitioning(Partitioning::Forward)
    }

    /// Merge with another stream of the same type: the next node reads both.
    pub fn union(&self, other: &Stream<T>) -> Stream<T> {
        let mut inputs = self.inputs.clone();
        inputs.extend(other.inputs.iter().cloned());
        // One event time for the union only if both sides declared one (this side's function).
        let time = if other.time.is_some() { self.time.clone() } else { None };
        Stream { job: self.job.clone(), inputs, time, _t: PhantomData }
    }

    /// The parallelism of the node(s) that produce this stream (the largest).
    #[cfg(feature = "kafka")]
    pub(crate) fn producer_parallelism(&self) -> u32 {
        let g = self.job.inner.borrow();
        self.inputs.iter().map(|p| g.nodes[p.node].parallelism).max().unwrap_or(1)
    }

    /// Set the parallelism of the node that produces this stream.
    pub fn parallelism(self, parallelism: u32) -> Stream<T> {
        {
            let mut g = self.job.inner.borrow_mut();
            for p in &self.inputs {
                g.nodes[p.node].parallelism = parallelism;
                if parallelism == 0 {
                    let id = g.nodes[p.node].id.clone();
                    g.errors.push(GraphError::Parallelism { node: id });
                }
            }
        }
        self
    }

    /// Pin the subtasks of the node that produces this stream to these CPUs (subtask i to
    /// `cpus[i % len]`).
    pub fn cpus(self, cpus: &[usize]) -> Stream<T> {
        {
            let mut g = self.job.inner.borrow_mut();
            if cpus.is_empty() {
                let nodes: Vec<String> = self.inputs.iter().map(|p| g.nodes[p.node].id.clone()).collect();
                g.errors.push(GraphError::Setting {
                    field: "cpus",
                    problem: format!("node {}: cpus is empty; list CPU ids, or leave it out", nodes.join(", ")),
                });
            }
            for p in &self.inputs {
                g.nodes[p.node].cpus = Some(cpus.to_vec());
            }
        }
        self
    }

    /// End the stream in a sink with `parallelism` subtasks.
    pub fn sink<S: Sink<T> + 'static>(
        &self,
        id: &str,
        parallelism: u32,
        factory: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
    ) {
        self.add(Node {
            id: id.to_owned(),
            op: "sink",
            parallelism,
            cpus: None,
            kind: NodeKind::Sink(sink_fn::<T, S>(factory)),
            decoder: None,
            tee: None,
            keyed: false,
            state_bytes: 0,
            merge: None,
            state_schema: None,
        });
    }
}

/// What a keyed operator's state holds in memory beyond RocksDB's bounded caches (its
/// buffers), for the budget; its state itself is in the shard.
const KEYED_STATE_BYTES: u64 = 64 << 10;

/// The `op` of a keyed operator with [`crate::state::KeyedState`]: its column family gets
/// the compaction filter that drops expired entries.
pub(crate) const KEYED_STATE_OP: &str = "keyed_state";

impl<T: Record, K: 'static> KeyedStream<T, K> {
    fn key(&self) -> KeyFn<T> {
        self.stream.inputs[0].key.as_ref().expect("a keyed stream has a key").1.clone()
    }

    /// A keyed operator: `factory` builds one [`KeyedProcess`] per subtask, which sees each
    /// record with its key group.
    pub fn process<U: Record, P: KeyedProcess<T, U> + 'static>(
        &self,
        id: &str,
        parallelism: u32,
        factory: impl Fn(&SubtaskInfo) -> P + Send + Sync + 'static,
    ) -> Stream<U> {
        let link = keyed_fn::<T, U, P>(self.key(), factory);
        self.stream.keyed_node(id, "keyed", link, parallelism, 0)
    }

    /// A keyed operator with keyed state: `factory` gets the subtask's
    /// [`KeyedState`](crate::state::KeyedState) and takes value, list and map handles from
    /// it by name. With a state backend the state is in the subtask's RocksDB shard (so it
    /// may be far larger than memory), checkpointed with the shard and moved with its key
    /// groups when the job is restored at another parallelism; without one it is in memory
    /// and goes whole into each checkpoint.
    pub fn process_with_state<U: Record, P: KeyedProcess<T, U> + 'static>(
        &self,
        id: &str,
        parallelism: u32,
        factory: impl Fn(&SubtaskInfo, &crate::state::KeyedState) -> P + Send + Sync + 'static,
    ) -> Stream<U> {
        let link = crate::chain::keyed_state_fn::<T, U, P>(self.key(), factory);
        let out = self.stream.keyed_node(id, KEYED_STATE_OP, link, parallelism, KEYED_STATE_BYTES);
        self.stream.set_merge(id, Some(crate::state::list_merge()));
        out
    }

    /// The event time declared upstream, if any.
    pub fn event_time(&self) -> Option<TimestampFn<T>> {
        self.stream.event_time()
    }

    /// Map over the hash-partitioned stream (a stateless operator after the exchange).
    pub fn map<U: Record>(&self, id: &str, f: impl Fn(&T) -> U + Send + Sync + 'static) -> Stream<U> {
        self.stream.map(id, f)
    }

    /// End in a sink whose subtasks each receive their key groups' records.
    pub fn sink<S: Sink<T> + 'static>(
        &self,
        id: &str,
        parallelism: u32,
        factory: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
    ) {
        self.stream.sink(id, parallelism, factory)
    }
}
