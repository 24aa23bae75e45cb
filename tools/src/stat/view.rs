//! What `weir-stat` shows: two snapshots of a job's counters file, turned into shares of
//! an interval per subtask, fill per channel, and the job's figures.
//!
//! Shares come from the counters alone, as Prometheus computes them: a state's share is its
//! counter's increase over the four time counters' increase
//! ([`weir::telemetry::time::shares`]); the engine counts all four live, so a stuck subtask's
//! shares are right while it is stuck. A latency figure of a second that is not current
//! ([`weir::telemetry::counters::latency_window_current`]) is shown as none.

use weir::telemetry::counters::{CounterKind, INSTANCE, LATENCY, latency_window_current, partition_owner, unix_ms_now};
use weir_ring::counters::CounterValue;

/// One subtask's share of an interval, from two snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct SubtaskView {
    /// `node#index`.
    pub owner: String,
    /// Share of the interval processing, 0..=1.
    pub busy: f64,
    /// Share waiting for credit.
    pub backpressured: f64,
    /// Share waiting for input.
    pub idle: f64,
    /// Share waiting on the outside (a destination, a broker, another process).
    pub waiting: f64,
    /// Records into the chain per second.
    pub records_in_per_s: f64,
    /// Records into the chain, total.
    pub records_in: u64,
    /// 1 running, 2 finished, 3 failed.
    pub state: u64,
}

/// One channel now (fill) and over the interval (blocked share).
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelView {
    /// `sender#i->receiver#j`.
    pub owner: String,
    /// Slots in the ring.
    pub slots: u64,
    /// Used slots, as the sender last saw them.
    pub backlog: u64,
    /// Free slots.
    pub credit: u64,
    /// Share of the interval the sender was blocked on this channel.
    pub blocked: f64,
    /// The receiver's announced credit limit, slots (credit by time; `slots` when none).
    pub announced: u64,
    /// How fast the receiver drains the channel while not idle, slots/s (0: not measured).
    pub drain_rate: u64,
    /// The time the used slots take to drain at that rate, ms (sampled).
    pub drain_ms: f64,
}

/// A job's numbers over an interval: what `weir-stat` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct StatView {
    /// Interval length, seconds.
    pub interval_s: f64,
    /// Per subtask.
    pub subtasks: Vec<SubtaskView>,
    /// Per channel.
    pub channels: Vec<ChannelView>,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Budget, bytes.
    pub budget_bytes: u64,
    /// 1 running, 2 finished, 3 failed.
    pub job_state: u64,
    /// Checkpoints (all zero when the job takes none).
    pub checkpoints: CheckpointView,
    /// Consumer lag per source partition (`node[partition]`, records), as last published.
    pub lags: Vec<(String, u64)>,
    /// Per sink node that publishes its figures (connectors).
    pub sinks: Vec<SinkView>,
    /// Which subtask runs each node subtask: `(node#index, subtask)`, by node.
    pub chained: Vec<(String, String)>,
    /// End-to-end latency per sink node subtask (every sink's, timed by latency markers).
    pub latencies: Vec<LatencyView>,
    /// The job runs as an instance of a job shared by several (`weir run --instance`).
    pub instance: Option<InstanceView>,
    /// When the second snapshot was read, wall clock (Unix) ms: what ages are counted from.
    pub at_ms: u64,
}

/// How long ago `ms` (Unix ms; 0: never) was at `now_ms`, in seconds (None: never).
pub fn age_s(ms: u64, now_ms: u64) -> Option<f64> {
    (ms > 0).then(|| now_ms.saturating_sub(ms) as f64 / 1e3)
}

/// An instance of a shared job, as the counters last say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceView {
    /// Its name (`--instance`).
    pub name: String,
    /// Generations it started since its process began (one per assignment).
    pub generations: u64,
    /// The consumer group's generation (0: not known).
    pub group_generation: u64,
    /// Rebalances it took part in.
    pub rebalances: u64,
    /// The last handover: assignment changed to job running, ns.
    pub handover_ns: u64,
    /// Partitions taken over from other instances, and the bytes fetched for them, in all.
    pub moved_partitions: u64,
    /// Bytes fetched for those.
    pub moved_bytes: u64,
    /// Bytes fetched from the store to restore partitions, in all.
    pub restored_bytes: u64,
    /// The lead input's topic (as its counters name it).
    pub topic: String,
    /// Its partitions, and which of them this instance serves.
    pub partitions: Vec<(u32, bool)>,
}

impl InstanceView {
    /// The partitions it serves.
    pub fn owned(&self) -> Vec<u32> {
        self.partitions.iter().filter(|(_, o)| *o).map(|(p, _)| *p).collect()
    }
}

/// One sink subtask's end-to-end latency, as the counters last say (µs; 0: no sample — none
/// timed yet, none with that time known, or for the last second: none in it, or the second is
/// not current).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencyView {
    /// The sink node subtask (`node#index`).
    pub owner: String,
    /// Ingest to acknowledged: p50, p99, p99.9, max of the last completed second, then the
    /// same since the subtask started.
    pub ingest: [u64; 8],
    /// Event time to acknowledged, the same.
    pub event: [u64; 8],
    /// Markers timed, in all.
    pub markers: u64,
    /// When the last second ended, Unix ms (0: none yet).
    pub window_end_ms: u64,
    /// When the newest marker was timed, Unix ms (0: none yet).
    pub newest_ms: u64,
}

/// One sink node's figures, as the counters last say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SinkView {
    /// The sink node.
    pub node: String,
    /// Records taken, in all.
    pub records: u64,
    /// Records acknowledged by the destination, in all, and per second over the interval.
    pub acked: u64,
    /// Acknowledged records per second over the interval.
    pub acked_per_s: f64,
    /// Requests outstanding now.
    pub in_flight: u64,
    /// Retries, in all.
    pub retries: u64,
    /// Records dead-lettered, in all.
    pub dead_letters: u64,
    /// Share of the interval its subtasks waited for the destination (summed over subtasks).
    pub blocked: f64,
    /// Acknowledgement latency of the last completed second, µs: median, 99th, max.
    pub ack_p50_us: u64,
    /// 99th percentile.
    pub ack_p99_us: u64,
    /// Maximum.
    pub ack_max_us: u64,
    /// When the newest acknowledgement was timed, Unix ms (0: none yet).
    pub ack_newest_ms: u64,
}

/// The job's checkpoints, as the counters last say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointView {
    /// Id of the last completed checkpoint (0: none).
    pub last_id: u64,
    /// Its duration, trigger to manifest, ns.
    pub duration_ns: u64,
    /// Its longest barrier alignment, ns.
    pub alignment_ns: u64,
    /// Bytes it wrote.
    pub bytes: u64,
    /// Checkpoints completed.
    pub completed: u64,
    /// Checkpoints expired or declined.
    pub failed: u64,
}

impl StatView {
    /// Compare two snapshots taken `interval_s` apart, the second one now.
    pub fn between(before: &[CounterValue], after: &[CounterValue], interval_s: f64) -> StatView {
        Self::between_at(before, after, interval_s, unix_ms_now())
    }

    /// [`StatView::between`], the second snapshot read at wall clock `now_ms` (Unix ms).
    pub fn between_at(before: &[CounterValue], after: &[CounterValue], interval_s: f64, now_ms: u64) -> StatView {
        use std::collections::BTreeMap;
        let old: std::collections::HashMap<(u32, &str), u64> =
            before.iter().map(|c| ((c.type_id, c.owner.as_str()), c.value)).collect();
        let delta =
            |c: &CounterValue| c.value.saturating_sub(old.get(&(c.type_id, c.owner.as_str())).copied().unwrap_or(0));
        let ns = (interval_s * 1e9).max(1.0);
        // A share of the interval: counters are sampled, not frozen, so clamp small overshoots.
        let share = |v: u64| (v as f64 / ns).min(1.0);
        let mut subtasks: BTreeMap<String, SubtaskView> = BTreeMap::new();
        let mut channels: BTreeMap<String, ChannelView> = BTreeMap::new();
        let mut view = StatView {
            interval_s,
            subtasks: vec![],
            channels: vec![],
            rss_bytes: 0,
            budget_bytes: 0,
            job_state: 0,
            checkpoints: CheckpointView::default(),
            lags: Vec::new(),
            sinks: Vec::new(),
            chained: Vec::new(),
            latencies: Vec::new(),
            instance: None,
            at_ms: now_ms,
        };
        let mut latencies: BTreeMap<String, LatencyView> = BTreeMap::new();
        let mut sinks: BTreeMap<String, SinkView> = BTreeMap::new();
        // Per subtask, the ns it accounted in the interval: (busy, backpressured, idle, waiting).
        let mut accounted: BTreeMap<String, [u64; 4]> = BTreeMap::new();
        for c in after {
            let o = c.owner.as_str();
            // Kinds of another build (or not weir's) are skipped.
            let Some(kind) = CounterKind::from_type_id(c.type_id) else { continue };
            match kind {
                CounterKind::BusyNs | CounterKind::BackpressuredNs | CounterKind::IdleNs | CounterKind::WaitingNs => {
                    subtask(&mut subtasks, o);
                    let i = match kind {
                        CounterKind::BusyNs => 0,
                        CounterKind::BackpressuredNs => 1,
                        CounterKind::IdleNs => 2,
                        _ => 3,
                    };
                    accounted.entry(o.to_owned()).or_default()[i] = delta(c);
                }
                CounterKind::SubtaskState => subtask(&mut subtasks, o).state = c.value,
                CounterKind::SubtaskRecordsIn => {
                    let s = subtask(&mut subtasks, o);
                    s.records_in = c.value;
                    s.records_in_per_s = delta(c) as f64 / interval_s.max(1e-9);
                }
                CounterKind::ChannelSlots => channel(&mut channels, o).slots = c.value,
                CounterKind::ChannelBacklog => channel(&mut channels, o).backlog = c.value,
                CounterKind::ChannelCredit => channel(&mut channels, o).credit = c.value,
                CounterKind::ChannelBlockedNs => channel(&mut channels, o).blocked = share(delta(c)),
                CounterKind::ChannelAnnounced => channel(&mut channels, o).announced = c.value,
                CounterKind::ChannelDrainRate => channel(&mut channels, o).drain_rate = c.value,
                CounterKind::ChannelDrainUs => channel(&mut channels, o).drain_ms = c.value as f64 / 1e3,
                CounterKind::RssBytes => view.rss_bytes = c.value,
                CounterKind::BudgetBytes => view.budget_bytes = c.value,
                CounterKind::JobState => view.job_state = c.value,
                CounterKind::CheckpointId => view.checkpoints.last_id = c.value,
                CounterKind::CheckpointDurationNs => view.checkpoints.duration_ns = c.value,
                CounterKind::CheckpointAlignmentNs => view.checkpoints.alignment_ns = c.value,
                CounterKind::CheckpointBytes => view.checkpoints.bytes = c.value,
                CounterKind::CheckpointsCompleted => view.checkpoints.completed = c.value,
                CounterKind::CheckpointsFailed => view.checkpoints.failed = c.value,
                CounterKind::SourceLag => view.lags.push((c.owner.clone(), c.value)),
                CounterKind::ChainPosition => {
                    if let Some((node, subtask)) = o.split_once('@') {
                        view.chained.push((node.to_owned(), subtask.to_owned()));
                    }
                }
                CounterKind::SinkRecords
                | CounterKind::SinkAcked
                | CounterKind::SinkInFlight
                | CounterKind::SinkRetries
                | CounterKind::SinkDeadLetters
                | CounterKind::SinkBlockedNs
                | CounterKind::SinkAckP50Us
                | CounterKind::SinkAckP99Us
                | CounterKind::SinkAckMaxUs
                | CounterKind::SinkAckNewestMs => {
                    let s = sinks
                        .entry(o.to_owned())
                        .or_insert_with(|| SinkView { node: o.to_owned(), ..SinkView::default() });
                    match kind {
                        CounterKind::SinkRecords => s.records = c.value,
                        CounterKind::SinkAcked => {
                            s.acked = c.value;
                            s.acked_per_s = delta(c) as f64 / interval_s.max(1e-9);
                        }
                        CounterKind::SinkInFlight => s.in_flight = c.value,
                        CounterKind::SinkRetries => s.retries = c.value,
                        CounterKind::SinkDeadLetters => s.dead_letters = c.value,
                        CounterKind::SinkBlockedNs => s.blocked = share(delta(c)),
                        CounterKind::SinkAckP50Us => s.ack_p50_us = c.value,
                        CounterKind::SinkAckP99Us => s.ack_p99_us = c.value,
                        CounterKind::SinkAckMaxUs => s.ack_max_us = c.value,
                        _ => s.ack_newest_ms = c.value,
                    }
                }
                k if INSTANCE.contains(&k) => {
                    let i = view.instance.get_or_insert_with(InstanceView::default);
                    i.name = o.to_owned();
                    match k {
                        CounterKind::InstanceGenerations => i.generations = c.value,
                        CounterKind::GroupGeneration => i.group_generation = c.value,
                        CounterKind::InstanceRebalances => i.rebalances = c.value,
                        CounterKind::HandoverNs => i.handover_ns = c.value,
                        CounterKind::MovedPartitions => i.moved_partitions = c.value,
                        CounterKind::MovedBytes => i.moved_bytes = c.value,
                        _ => i.restored_bytes = c.value,
                    }
                }
                CounterKind::PartitionOwned => {
                    if let Some((topic, p)) = partition_owner(o)
                        && let Ok(p) = p.parse::<u32>()
                    {
                        let i = view.instance.get_or_insert_with(InstanceView::default);
                        i.topic = topic.to_owned();
                        i.partitions.push((p, c.value == 1));
                    }
                }
                k if LATENCY.contains(&k) => {
                    let l = latencies
                        .entry(o.to_owned())
                        .or_insert_with(|| LatencyView { owner: o.to_owned(), ..LatencyView::default() });
                    let i = LATENCY.iter().position(|x| *x == k).expect("a latency kind");
                    match k {
                        CounterKind::LatencyMarkers => l.markers = c.value,
                        CounterKind::LatencyWindowEndMs => l.window_end_ms = c.value,
                        CounterKind::LatencyNewestMs => l.newest_ms = c.value,
                        _ if i < 8 => l.ingest[i] = c.value,
                        _ => l.event[i - 8] = c.value,
                    }
                }
                _ => {}
            }
        }
        // Shares from the counters alone, as Prometheus' rate() sees them: the engine counts
        // all four live (the interval in progress included), so their increases add up to
        // the time between the snapshots' writes, whatever the subtask is doing.
        for s in subtasks.values_mut() {
            let delta = accounted.get(&s.owner).copied().unwrap_or_default();
            [s.busy, s.backpressured, s.idle, s.waiting] = weir::telemetry::time::shares(delta).unwrap_or_default();
        }
        // A last second that is not current has no sample to show.
        for l in latencies.values_mut() {
            if !latency_window_current(l.window_end_ms, now_ms) {
                l.ingest[..4].fill(0);
                l.event[..4].fill(0);
            }
        }
        // Lag counters are allocated as partitions become known: list them by node, then
        // partition number.
        view.lags.sort_by_key(|(owner, _)| {
            let (node, rest) = owner.split_once('[').unwrap_or((owner, ""));
            (node.to_owned(), rest.trim_end_matches(']').parse::<u64>().unwrap_or(u64::MAX))
        });
        if let Some(i) = &mut view.instance {
            i.partitions.sort_unstable();
        }
        view.subtasks = subtasks.into_values().collect();
        view.channels = channels.into_values().collect();
        view.sinks = sinks.into_values().collect();
        view.latencies = latencies.into_values().collect();
        view
    }
}

fn subtask<'a>(m: &'a mut std::collections::BTreeMap<String, SubtaskView>, owner: &str) -> &'a mut SubtaskView {
    m.entry(owner.to_owned()).or_insert_with(|| SubtaskView {
        owner: owner.to_owned(),
        busy: 0.0,
        backpressured: 0.0,
        idle: 0.0,
        waiting: 0.0,
        records_in_per_s: 0.0,
        records_in: 0,
        state: 0,
    })
}

fn channel<'a>(m: &'a mut std::collections::BTreeMap<String, ChannelView>, owner: &str) -> &'a mut ChannelView {
    m.entry(owner.to_owned()).or_insert_with(|| ChannelView {
        owner: owner.to_owned(),
        slots: 0,
        backlog: 0,
        credit: 0,
        blocked: 0.0,
        announced: 0,
        drain_rate: 0,
        drain_ms: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(kind: CounterKind, owner: &str, value: u64) -> CounterValue {
        CounterValue { type_id: kind.type_id(), owner: owner.into(), label: String::new(), value }
    }

    /// An instance's counters read back: its name, figures, and the partitions it serves in
    /// partition order.
    #[test]
    fn an_instance_and_its_partitions() {
        let after = vec![
            counter(CounterKind::InstanceGenerations, "b", 3),
            counter(CounterKind::GroupGeneration, "b", 7),
            counter(CounterKind::HandoverNs, "b", 412_000_000),
            counter(CounterKind::MovedPartitions, "b", 2),
            counter(CounterKind::PartitionOwned, "events[2]", 0),
            counter(CounterKind::PartitionOwned, "events[10]", 1),
            counter(CounterKind::PartitionOwned, "events[1]", 1),
        ];
        let v = StatView::between(&[], &after, 1.0);
        let i = v.instance.expect("an instance");
        assert_eq!((i.name.as_str(), i.generations, i.group_generation, i.moved_partitions), ("b", 3, 7, 2));
        assert_eq!(i.topic, "events");
        assert_eq!(i.partitions, vec![(1, true), (2, false), (10, true)]);
        assert_eq!(i.owned(), vec![1, 10]);
        assert!(StatView::between(&[], &after[..0], 1.0).instance.is_none());
    }

    /// Shares are each time counter's increase over the four's: they add up to 1, a stuck
    /// subtask waiting on its destination shows as waiting, and a sink's blocked share stays at
    /// most 100 %.
    #[test]
    fn shares_come_from_the_counters() {
        let before = vec![
            counter(CounterKind::SubtaskState, "m#0", 1),
            counter(CounterKind::BusyNs, "m#0", 5_000_000_000),
            counter(CounterKind::IdleNs, "m#0", 0),
            counter(CounterKind::BackpressuredNs, "m#0", 0),
            counter(CounterKind::WaitingNs, "m#0", 0),
            counter(CounterKind::SinkBlockedNs, "out", 0),
        ];
        let after = vec![
            counter(CounterKind::SubtaskState, "m#0", 1),
            counter(CounterKind::BusyNs, "m#0", 5_100_000_000),
            counter(CounterKind::IdleNs, "m#0", 0),
            counter(CounterKind::BackpressuredNs, "m#0", 50_000_000),
            counter(CounterKind::WaitingNs, "m#0", 850_000_000),
            counter(CounterKind::SinkBlockedNs, "out", 1_012_000_000),
        ];
        let v = StatView::between(&before, &after, 1.0);
        let s = &v.subtasks[0];
        assert!((s.busy + s.backpressured + s.idle + s.waiting - 1.0).abs() < 1e-12, "{s:?}");
        assert!((s.waiting - 0.85).abs() < 1e-12 && (s.busy - 0.1).abs() < 1e-12, "{s:?}");
        assert!(v.sinks[0].blocked <= 1.0, "{:?}", v.sinks[0]);
    }

    /// A last second that ended long ago (a stuck sink) shows no figure; the figures since
    /// the start stay.
    #[test]
    fn a_stale_second_shows_nothing() {
        let now = 1_700_000_000_000;
        let after = vec![
            counter(CounterKind::IngestLatencyP50Us, "out#0", 71_000),
            counter(CounterKind::IngestLatencyAllP50Us, "out#0", 60_000),
            counter(CounterKind::LatencyWindowEndMs, "out#0", now - 20_000),
            counter(CounterKind::LatencyNewestMs, "out#0", now - 21_000),
            counter(CounterKind::LatencyMarkers, "out#0", 9),
        ];
        let v = StatView::between_at(&[], &after, 1.0, now);
        let l = &v.latencies[0];
        assert_eq!((l.ingest[0], l.ingest[4], l.markers), (0, 60_000, 9));
        assert_eq!(age_s(l.newest_ms, v.at_ms), Some(21.0));
        let fresh = StatView::between_at(&[], &after, 1.0, now - 19_000);
        assert_eq!(fresh.latencies[0].ingest[0], 71_000);
    }
}
