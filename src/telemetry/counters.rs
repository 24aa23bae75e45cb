//! What the job's counters mean: the kinds (the type ids of `weir-ring`'s generic counters
//! file), their labels, which counters each owner has, and so how many the file must hold.
//!
//! The counters file is `weir-ring`'s ([`weir_ring::counters`]): a header, metadata records
//! (type id, owner, label) and values on their own cache lines. This module is the one place
//! that says what the type ids are; `weir-stat` (tools/) reads them through [`CounterKind`].
//!
//! Capacity comes from the tables below, by owner: every subtask has [`SUBTASK`], every
//! node subtask [`NODE`], every channel [`CHANNEL`], the job [`JOB`] and
//! [`CHECKPOINT`], every sink that publishes figures [`SINK`], an instance of a shared job
//! [`INSTANCE`] and one per partition of its lead input; lag counters, one per source
//! partition, are allocated while the job runs as partitions become known, within
//! [`LAG_HEADROOM`].

use std::path::Path;
use std::sync::Arc;
use weir_ring::counters::{CountersError, CountersWriter, SharedCounter};

/// What a counter measures: its type id in the counters file. The numbers are stored in
/// files that other builds read: append only.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CounterKind {
    /// Subtask: ns spent processing (not waiting for credit, input or the outside).
    BusyNs = 1,
    /// Subtask: ns spent waiting for credit on an output.
    BackpressuredNs = 2,
    /// Subtask: ns spent waiting for input.
    IdleNs = 3,
    /// Node subtask: records it received (a source: produced).
    RecordsIn = 4,
    /// Node subtask: records it emitted.
    RecordsOut = 5,
    /// Subtask: records into its chain (read from its inputs, or produced by its source).
    SubtaskRecordsIn = 6,
    /// Node subtask (owner `node#index@subtask`: the node, and the subtask whose chain runs
    /// it): its position in that chain, 0 for the head. How readers map a channel's sender
    /// (the chain's last node) and a node's counters to the subtask that runs them.
    ChainPosition = 7,
    /// Subtask: ns spent waiting on the outside (a destination, a broker, another process:
    /// while a [`waiting`](super::waiting) note is up). Busy, backpressured, idle and waiting
    /// add up to the subtask's wall time; all four are counted live ([`super::time`]).
    WaitingNs = 8,
    /// Channel: slots in the ring.
    ChannelSlots = 10,
    /// Channel: used slots, as last sampled.
    ChannelBacklog = 11,
    /// Channel: free slots, as last sampled.
    ChannelCredit = 12,
    /// Channel: ns the sender was blocked on this channel.
    ChannelBlockedNs = 13,
    /// Channel: the receiver's announced credit limit, slots (credit by time; the ring's
    /// slot count when it announces none).
    ChannelAnnounced = 14,
    /// Channel: how fast the receiver drains it while not idle, slots per second (smoothed;
    /// 0 until measured).
    ChannelDrainRate = 15,
    /// Channel: the estimated time to drain the used slots at that rate, µs (sampled).
    ChannelDrainUs = 16,
    /// Job: resident set size, bytes.
    RssBytes = 20,
    /// Job: declared memory budget, bytes.
    BudgetBytes = 21,
    /// Job: 1 while running, 2 finished, 3 failed.
    JobState = 22,
    /// Subtask: 1 while running, 2 finished, 3 failed.
    SubtaskState = 23,
    /// Node subtask (windows): late records dropped.
    LateRecords = 30,
    /// Node subtask (stateful): keys its caches evicted to the state store.
    EvictedKeys = 31,
    /// Job: id of the last completed checkpoint (0: none yet).
    CheckpointId = 40,
    /// Job: duration of the last completed checkpoint, trigger to manifest, ns.
    CheckpointDurationNs = 41,
    /// Job: the longest barrier alignment of the last completed checkpoint, ns.
    CheckpointAlignmentNs = 42,
    /// Job: bytes the last completed checkpoint wrote (state files and blobs).
    CheckpointBytes = 43,
    /// Job: checkpoints completed.
    CheckpointsCompleted = 44,
    /// Job: checkpoints expired (timeout) or declined (a snapshot failed).
    CheckpointsFailed = 45,
    /// Source partition (owner `node[partition]`): consumer lag, records behind the end.
    SourceLag = 50,
    /// Sink node (all its subtasks): records taken.
    SinkRecords = 60,
    /// Sink node: records the destination acknowledged (HTTP 2xx, Kafka delivery report).
    SinkAcked = 61,
    /// Sink node: requests (HTTP batches, Kafka records) sent and not yet acknowledged.
    SinkInFlight = 62,
    /// Sink node: retries (HTTP) or client errors recovered from.
    SinkRetries = 63,
    /// Sink node: records sent to a dead-letter destination.
    SinkDeadLetters = 64,
    /// Sink node: ns its subtasks waited for the destination (in-flight bound, full queue).
    SinkBlockedNs = 65,
    /// Sink node: acknowledgement latency (sent to acknowledged), median of the last
    /// completed second, µs.
    SinkAckP50Us = 66,
    /// Sink node: the same, 99th percentile.
    SinkAckP99Us = 67,
    /// Sink node: the same, maximum.
    SinkAckMaxUs = 68,
    /// Sink node: when the newest acknowledgement was timed, wall clock (Unix) ms; 0: none yet.
    SinkAckNewestMs = 69,
    /// Sink node subtask: end-to-end latency, ingest (the record's source emitted it) to
    /// acknowledged by the destination, median of the last completed second, µs; sampled by
    /// latency markers ([`crate::operators::LatencyMarker`]).
    IngestLatencyP50Us = 70,
    /// Sink node subtask: the same, 99th percentile.
    IngestLatencyP99Us = 71,
    /// Sink node subtask: the same, 99.9th percentile.
    IngestLatencyP999Us = 72,
    /// Sink node subtask: the same, maximum.
    IngestLatencyMaxUs = 73,
    /// Sink node subtask: ingest to acknowledged since the subtask started, median, µs.
    IngestLatencyAllP50Us = 74,
    /// Sink node subtask: the same, 99th percentile.
    IngestLatencyAllP99Us = 75,
    /// Sink node subtask: the same, 99.9th percentile.
    IngestLatencyAllP999Us = 76,
    /// Sink node subtask: the same, maximum.
    IngestLatencyAllMaxUs = 77,
    /// Sink node subtask: when the "last completed second" of its latency figures ended, wall
    /// clock (Unix) ms; 0: none yet. A figure of a second that ended more than
    /// [`LATENCY_WINDOW_STALE_MS`] ago is not current (the sink has not moved since: stuck, or
    /// idle with nothing to time) and readers show none.
    LatencyWindowEndMs = 78,
    /// Sink node subtask: when the newest latency marker was timed, wall clock (Unix) ms; 0:
    /// none yet.
    LatencyNewestMs = 79,
    /// Sink node subtask: event time (a window's result: its end) to acknowledged, median of
    /// the last completed second, µs.
    EventLatencyP50Us = 80,
    /// Sink node subtask: the same, 99th percentile.
    EventLatencyP99Us = 81,
    /// Sink node subtask: the same, 99.9th percentile.
    EventLatencyP999Us = 82,
    /// Sink node subtask: the same, maximum.
    EventLatencyMaxUs = 83,
    /// Sink node subtask: event time to acknowledged since the subtask started, median, µs.
    EventLatencyAllP50Us = 84,
    /// Sink node subtask: the same, 99th percentile.
    EventLatencyAllP99Us = 85,
    /// Sink node subtask: the same, 99.9th percentile.
    EventLatencyAllP999Us = 86,
    /// Sink node subtask: the same, maximum.
    EventLatencyAllMaxUs = 87,
    /// Sink node subtask: latency markers timed (acknowledged) since it started.
    LatencyMarkers = 88,
    /// Instance (owner: its name; [`crate::cluster`]): generations it started since its
    /// process began, this job's included (one per assignment, or after a failure).
    InstanceGenerations = 90,
    /// Instance: the consumer group's generation, as its coordinator last gave it (0: not
    /// known).
    GroupGeneration = 91,
    /// Instance: rebalances it took part in (assignments and revocations seen).
    InstanceRebalances = 92,
    /// Instance: the last handover, from the assignment changing (or the instance joining) to
    /// this job running on the new one, ns.
    HandoverNs = 93,
    /// Instance: partitions it took over from other instances, in all.
    MovedPartitions = 94,
    /// Instance: bytes fetched from the checkpoint store for those, in all.
    MovedBytes = 95,
    /// Instance: bytes fetched from the checkpoint store to restore partitions, in all.
    RestoredBytes = 96,
    /// Lead input partition (owner `topic[partition]`): 1 while this instance serves it, 0
    /// while another one does.
    PartitionOwned = 97,
}

impl CounterKind {
    /// Every kind, in type-id order.
    pub const ALL: [CounterKind; 65] = {
        use CounterKind::*;
        [
            BusyNs,
            BackpressuredNs,
            IdleNs,
            RecordsIn,
            RecordsOut,
            SubtaskRecordsIn,
            ChainPosition,
            WaitingNs,
            ChannelSlots,
            ChannelBacklog,
            ChannelCredit,
            ChannelBlockedNs,
            ChannelAnnounced,
            ChannelDrainRate,
            ChannelDrainUs,
            RssBytes,
            BudgetBytes,
            JobState,
            SubtaskState,
            LateRecords,
            EvictedKeys,
            CheckpointId,
            CheckpointDurationNs,
            CheckpointAlignmentNs,
            CheckpointBytes,
            CheckpointsCompleted,
            CheckpointsFailed,
            SourceLag,
            SinkRecords,
            SinkAcked,
            SinkInFlight,
            SinkRetries,
            SinkDeadLetters,
            SinkBlockedNs,
            SinkAckP50Us,
            SinkAckP99Us,
            SinkAckMaxUs,
            SinkAckNewestMs,
            IngestLatencyP50Us,
            IngestLatencyP99Us,
            IngestLatencyP999Us,
            IngestLatencyMaxUs,
            IngestLatencyAllP50Us,
            IngestLatencyAllP99Us,
            IngestLatencyAllP999Us,
            IngestLatencyAllMaxUs,
            LatencyWindowEndMs,
            LatencyNewestMs,
            EventLatencyP50Us,
            EventLatencyP99Us,
            EventLatencyP999Us,
            EventLatencyMaxUs,
            EventLatencyAllP50Us,
            EventLatencyAllP99Us,
            EventLatencyAllP999Us,
            EventLatencyAllMaxUs,
            LatencyMarkers,
            InstanceGenerations,
            GroupGeneration,
            InstanceRebalances,
            HandoverNs,
            MovedPartitions,
            MovedBytes,
            RestoredBytes,
            PartitionOwned,
        ]
    };

    /// The kind of a stored type id (`None`: another build's kind, or not weir's).
    pub fn from_type_id(id: u32) -> Option<CounterKind> {
        Self::ALL.iter().copied().find(|k| *k as u32 == id)
    }

    /// Its type id in the counters file.
    pub fn type_id(self) -> u32 {
        self as u32
    }

    /// The label the file carries for it (what `weir-stat --raw` and other readers show).
    pub fn label(self) -> &'static str {
        use CounterKind::*;
        match self {
            BusyNs => "ns processing",
            BackpressuredNs => "ns waiting for credit",
            IdleNs => "ns waiting for input",
            RecordsIn => "records in",
            RecordsOut => "records out",
            SubtaskRecordsIn => "records into the chain",
            ChainPosition => "position in its subtask's chain",
            WaitingNs => "ns waiting on the outside",
            ChannelSlots => "slots",
            ChannelBacklog => "used slots (sampled)",
            ChannelCredit => "free slots (sampled)",
            ChannelBlockedNs => "ns the sender waited for credit",
            ChannelAnnounced => "announced credit limit, slots",
            ChannelDrainRate => "drain rate, slots/s",
            ChannelDrainUs => "time to drain the used slots, us (sampled)",
            RssBytes => "resident set size",
            BudgetBytes => "memory budget",
            JobState => "1 running, 2 finished, 3 failed",
            SubtaskState => "1 running, 2 finished, 3 failed",
            LateRecords => "late records dropped",
            EvictedKeys => "keys evicted to the state store",
            CheckpointId => "last completed checkpoint",
            CheckpointDurationNs => "its duration, ns",
            CheckpointAlignmentNs => "its longest alignment, ns",
            CheckpointBytes => "its bytes",
            CheckpointsCompleted => "checkpoints completed",
            CheckpointsFailed => "checkpoints expired or declined",
            SourceLag => "consumer lag, records",
            SinkRecords => "records taken",
            SinkAcked => "records acknowledged",
            SinkInFlight => "in flight (requests or records)",
            SinkRetries => "retries",
            SinkDeadLetters => "records dead-lettered",
            SinkBlockedNs => "ns waiting for the destination",
            SinkAckP50Us => "ack latency p50 us",
            SinkAckP99Us => "ack latency p99 us",
            SinkAckMaxUs => "ack latency max us",
            SinkAckNewestMs => "newest ack timed, unix ms",
            IngestLatencyP50Us => "ingest to ack p50 us (last second)",
            IngestLatencyP99Us => "ingest to ack p99 us (last second)",
            IngestLatencyP999Us => "ingest to ack p99.9 us (last second)",
            IngestLatencyMaxUs => "ingest to ack max us (last second)",
            IngestLatencyAllP50Us => "ingest to ack p50 us (since start)",
            IngestLatencyAllP99Us => "ingest to ack p99 us (since start)",
            IngestLatencyAllP999Us => "ingest to ack p99.9 us (since start)",
            IngestLatencyAllMaxUs => "ingest to ack max us (since start)",
            LatencyWindowEndMs => "last second's window ended, unix ms",
            LatencyNewestMs => "newest marker timed, unix ms",
            EventLatencyP50Us => "event time to ack p50 us (last second)",
            EventLatencyP99Us => "event time to ack p99 us (last second)",
            EventLatencyP999Us => "event time to ack p99.9 us (last second)",
            EventLatencyMaxUs => "event time to ack max us (last second)",
            EventLatencyAllP50Us => "event time to ack p50 us (since start)",
            EventLatencyAllP99Us => "event time to ack p99 us (since start)",
            EventLatencyAllP999Us => "event time to ack p99.9 us (since start)",
            EventLatencyAllMaxUs => "event time to ack max us (since start)",
            LatencyMarkers => "latency markers timed",
            InstanceGenerations => "generations started",
            GroupGeneration => "consumer group generation",
            InstanceRebalances => "rebalances seen",
            HandoverNs => "last handover, ns",
            MovedPartitions => "partitions taken over",
            MovedBytes => "bytes fetched for them",
            RestoredBytes => "bytes restored from the store",
            PartitionOwned => "1 served here, 0 elsewhere",
        }
    }
}

/// The counters of every subtask (owner `head-node#index`). The first four are its time, in
/// the order of [`Spent`](super::time::Spent), written by the monitor.
pub const SUBTASK: [CounterKind; 6] = [
    CounterKind::BusyNs,
    CounterKind::BackpressuredNs,
    CounterKind::IdleNs,
    CounterKind::WaitingNs,
    CounterKind::SubtaskRecordsIn,
    CounterKind::SubtaskState,
];
/// The counters of every node subtask (owner `node#index`; the chain position's
/// `node#index@subtask`). Late records and evicted keys are allocated only for windows and
/// stateful nodes, but counted for every node.
pub const NODE: [CounterKind; 5] = [
    CounterKind::RecordsIn,
    CounterKind::RecordsOut,
    CounterKind::LateRecords,
    CounterKind::EvictedKeys,
    CounterKind::ChainPosition,
];
/// The counters of every channel (owner `sender#i->receiver#j`).
pub const CHANNEL: [CounterKind; 7] = [
    CounterKind::ChannelSlots,
    CounterKind::ChannelCredit,
    CounterKind::ChannelBacklog,
    CounterKind::ChannelBlockedNs,
    CounterKind::ChannelAnnounced,
    CounterKind::ChannelDrainRate,
    CounterKind::ChannelDrainUs,
];
/// The job's own counters (owner `job`).
pub const JOB: [CounterKind; 3] = [CounterKind::RssBytes, CounterKind::BudgetBytes, CounterKind::JobState];
/// The checkpoint coordinator's counters (owner `job`), when the job takes checkpoints.
pub const CHECKPOINT: [CounterKind; 6] = [
    CounterKind::CheckpointId,
    CounterKind::CheckpointDurationNs,
    CounterKind::CheckpointAlignmentNs,
    CounterKind::CheckpointBytes,
    CounterKind::CheckpointsCompleted,
    CounterKind::CheckpointsFailed,
];
/// The counters of every sink node that publishes its figures (owner: the node), in the
/// order of [`SinkReading::values`](super::sinks::SinkReading::values).
pub const SINK: [CounterKind; 10] = [
    CounterKind::SinkRecords,
    CounterKind::SinkAcked,
    CounterKind::SinkInFlight,
    CounterKind::SinkRetries,
    CounterKind::SinkDeadLetters,
    CounterKind::SinkBlockedNs,
    CounterKind::SinkAckP50Us,
    CounterKind::SinkAckP99Us,
    CounterKind::SinkAckMaxUs,
    CounterKind::SinkAckNewestMs,
];
/// The end-to-end latency counters of every sink node subtask (owner `node#index`): ingest
/// and event time to acknowledged, each over the last completed second and since the start
/// (p50, p99, p99.9, max), the markers timed, when the last second ended and when the newest
/// marker was timed.
pub const LATENCY: [CounterKind; 19] = [
    CounterKind::IngestLatencyP50Us,
    CounterKind::IngestLatencyP99Us,
    CounterKind::IngestLatencyP999Us,
    CounterKind::IngestLatencyMaxUs,
    CounterKind::IngestLatencyAllP50Us,
    CounterKind::IngestLatencyAllP99Us,
    CounterKind::IngestLatencyAllP999Us,
    CounterKind::IngestLatencyAllMaxUs,
    CounterKind::EventLatencyP50Us,
    CounterKind::EventLatencyP99Us,
    CounterKind::EventLatencyP999Us,
    CounterKind::EventLatencyMaxUs,
    CounterKind::EventLatencyAllP50Us,
    CounterKind::EventLatencyAllP99Us,
    CounterKind::EventLatencyAllP999Us,
    CounterKind::EventLatencyAllMaxUs,
    CounterKind::LatencyMarkers,
    CounterKind::LatencyWindowEndMs,
    CounterKind::LatencyNewestMs,
];

/// A "last completed second" of latency whose second ended longer ago than this is not
/// current: a window is closed by the sink's own thread about a second after it began, so one
/// that is older has not been followed by another (the sink is stuck, or idle with nothing to
/// time). Readers show no figure for it.
pub const LATENCY_WINDOW_STALE_MS: u64 = 2_500;

/// Whether the latency figures of a window that ended at `window_end_ms` are current at
/// `now_ms` (wall clock, Unix ms). A window that never ended (0) is not.
pub fn latency_window_current(window_end_ms: u64, now_ms: u64) -> bool {
    window_end_ms > 0 && now_ms.saturating_sub(window_end_ms) <= LATENCY_WINDOW_STALE_MS
}

/// Wall clock now, Unix ms (what the `…Ms` timestamps hold).
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
/// The counters of an instance of a job shared by several (owner: the instance's name), when
/// the job runs as one ([`crate::cluster`]); besides these, one [`CounterKind::PartitionOwned`]
/// per partition of the lead input.
pub const INSTANCE: [CounterKind; 7] = [
    CounterKind::InstanceGenerations,
    CounterKind::GroupGeneration,
    CounterKind::InstanceRebalances,
    CounterKind::HandoverNs,
    CounterKind::MovedPartitions,
    CounterKind::MovedBytes,
    CounterKind::RestoredBytes,
];
/// Lag counters the file keeps room for: one per source partition, allocated as the
/// partitions become known (a topic's partitions are learned at run time). Partitions past
/// this many show no lag counter; the job runs on.
pub const LAG_HEADROOM: u64 = 256;

/// What a job has, to size its counters file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owners {
    /// Subtasks (one per chain and index).
    pub subtasks: u64,
    /// Node subtasks (one per node and index; chained nodes share a subtask).
    pub node_subtasks: u64,
    /// Channels (rings).
    pub channels: u64,
    /// Sink nodes that publish figures.
    pub sinks: u64,
    /// Sink node subtasks (each times latency markers).
    pub sink_subtasks: u64,
    /// Partitions of the lead input, when the job runs as an instance (0: it does not).
    pub instance_partitions: u64,
}

impl Owners {
    /// Counters the file must hold, from the tables: `None` when that is more than a
    /// counters file can hold (`u32::MAX`).
    pub fn capacity(&self) -> Option<u32> {
        let n = |count: u64, per: usize| count.checked_mul(per as u64);
        let total = [
            n(self.subtasks, SUBTASK.len())?,
            n(self.node_subtasks, NODE.len())?,
            n(self.channels, CHANNEL.len())?,
            n(self.sinks, SINK.len())?,
            n(self.sink_subtasks, LATENCY.len())?,
            (JOB.len() + CHECKPOINT.len()) as u64,
            if self.instance_partitions > 0 { self.instance_partitions.checked_add(INSTANCE.len() as u64)? } else { 0 },
            LAG_HEADROOM,
        ]
        .iter()
        .try_fold(0u64, |a, &b| a.checked_add(b))?;
        u32::try_from(total).ok()
    }
}

/// An owner `name[partition]` (a source's lag, a lead partition an instance serves), split:
/// `None` for another shape.
pub fn partition_owner(owner: &str) -> Option<(&str, &str)> {
    owner.strip_suffix(']').and_then(|s| s.rsplit_once('['))
}

/// How full a channel is, 0 to 1: its used slots over the room its sender may fill — the
/// receiver's announced credit limit under credit by time (`announced`, 0 when none), else
/// the ring's slots. 1 is a sender held back by this channel. `None` for a ring of no slots
/// (a channel not yet sampled). The one definition for `weir top`, `weir-stat` and the
/// Prometheus `weir_channel_fill_ratio`.
pub fn channel_fill(slots: u64, announced: u64, used: u64) -> Option<f64> {
    let room = if announced > 0 { announced.min(slots) } else { slots };
    (room > 0).then(|| (used as f64 / room as f64).min(1.0))
}

/// A job's counters file: allocates each counter with its kind's label.
#[derive(Debug, Clone)]
pub struct JobCounters {
    writer: Arc<CountersWriter>,
}

impl JobCounters {
    /// Create the counters file at `path` for job `job`, sized for `capacity` counters.
    pub fn create(path: &Path, job: &str, capacity: u32) -> Result<JobCounters, CountersError> {
        Ok(JobCounters { writer: Arc::new(CountersWriter::create(path, job, capacity)?) })
    }

    /// A counter of `kind` owned by `owner`, labelled by its kind.
    pub fn counter(&self, kind: CounterKind, owner: &str) -> Result<SharedCounter, CountersError> {
        self.writer.allocate_shared(kind.type_id(), owner, kind.label())
    }

    /// The counters of `kinds` owned by `owner`, in order.
    pub fn counters<const N: usize>(
        &self,
        kinds: &[CounterKind; N],
        owner: &str,
    ) -> Result<[SharedCounter; N], CountersError> {
        let mut out: [SharedCounter; N] = std::array::from_fn(|_| SharedCounter::detached());
        for (slot, kind) in out.iter_mut().zip(kinds) {
            *slot = self.counter(*kind, owner)?;
        }
        Ok(out)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.writer.path()
    }

    /// Counters allocated so far, and the file's capacity.
    pub fn usage(&self) -> (u32, u32) {
        (self.writer.allocated(), self.writer.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Type ids are unique, round-trip, and each kind has a label.
    #[test]
    fn kinds_round_trip() {
        let mut ids = std::collections::BTreeSet::new();
        for k in CounterKind::ALL {
            assert!(ids.insert(k.type_id()), "{k:?} repeats a type id");
            assert_eq!(CounterKind::from_type_id(k.type_id()), Some(k));
            assert!(!k.label().is_empty());
        }
        assert_eq!(CounterKind::from_type_id(0), None);
    }

    /// The capacity is the tables' sum, and refuses what a file cannot hold.
    #[test]
    fn capacity_from_the_tables() {
        let o =
            Owners { subtasks: 3, node_subtasks: 5, channels: 4, sinks: 1, sink_subtasks: 2, instance_partitions: 0 };
        assert_eq!(o.capacity(), Some(3 * 6 + 5 * 5 + 4 * 7 + 10 + 2 * 19 + 3 + 6 + 256));
        let shared = Owners { instance_partitions: 6, ..o };
        assert_eq!(shared.capacity(), Some(o.capacity().unwrap() + 7 + 6));
        assert_eq!(Owners { channels: u64::MAX / 2, ..o }.capacity(), None);
        assert_eq!(Owners { channels: 2_000_000_000, ..o }.capacity(), None);
    }
}
