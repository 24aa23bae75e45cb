//! Watermarks per partition, for a Kafka source that reads several partitions.
//!
//! One watermark per source subtask, computed from the records it emits, is wrong as soon as
//! the subtask reads its partitions unevenly — and it does: librdkafka fetches partition by
//! partition, and under backpressure a subtask may read a megabyte of partition 0 before it
//! reads any of partition 1. Partition 1's records are then behind the watermark partition 0
//! pushed, and count as late. So, as Flink's Kafka source does, the source keeps the largest
//! event time *per partition* and emits the minimum over its partitions:
//!
//! ```text
//!  watermark = min over held partitions p of (largest event time read from p − max_out_of_orderness)
//!  held: every owned partition, except one that is caught up (nothing left to read: position
//!        ≥ its end) and has had no record for `idle`
//! ```
//!
//! A partition not read yet holds the watermark at 0, so records waiting in Kafka are never
//! late because the source has not got to them; a partition with nothing to read stops
//! holding it back after `idle`, so one quiet partition does not stall every window. When
//! every partition is idle, the watermark is the minimum over the partitions that had
//! records (the job's input gates then treat the quiet channel as idle after
//! `watermark_idle_timeout`).

use crate::time::{WatermarkStrategy, duration_ns};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
struct Part {
    /// Largest event time read, if any record was; of a repartition topic's partition: the
    /// smallest of its writers' watermarks, once each has written one.
    max: Option<u64>,
    /// When its last record (or its assignment) was.
    last_record: Instant,
    /// A repartition topic's partition: how many write it, and each one's last watermark.
    writers: Writers,
}

/// The writers of a partition of a repartition topic (see [`super::repartition`]): how many
/// there are, and the watermark each wrote last. Checkpointed with the partition's offset:
/// the markers before it are not read again.
pub(crate) type Writers = (u32, BTreeMap<u32, u64>);

fn fresh(now: Instant) -> Part {
    Part { max: None, last_record: now, writers: (0, BTreeMap::new()) }
}

/// The event-time clock of one source subtask: largest event time per partition.
#[derive(Debug)]
pub(crate) struct PartitionWatermarks {
    bound_ns: u64,
    every: u64,
    interval: Option<Duration>,
    idle: Duration,
    parts: BTreeMap<i32, Part>,
    /// Watermarks come from the writers' markers (a repartition topic), not event times.
    markers: bool,
    /// Last watermark emitted (0: none).
    emitted: u64,
    since: u64,
    last_emit: Instant,
}

impl PartitionWatermarks {
    pub(crate) fn new(strategy: WatermarkStrategy, idle: Duration) -> PartitionWatermarks {
        PartitionWatermarks {
            bound_ns: duration_ns(strategy.max_out_of_orderness),
            every: strategy.every_records.unwrap_or(u64::MAX),
            interval: strategy.interval,
            idle,
            parts: BTreeMap::new(),
            markers: false,
            emitted: 0,
            since: 0,
            last_emit: Instant::now(),
        }
    }

    /// Watermarks from the writers' markers of a repartition topic: each partition's is the
    /// smallest its writers wrote (no bound is subtracted: theirs already hold one).
    pub(crate) fn from_writers(strategy: WatermarkStrategy, idle: Duration) -> PartitionWatermarks {
        let mut clock = PartitionWatermarks::new(strategy, idle);
        clock.bound_ns = 0;
        clock.markers = true;
        clock
    }

    /// The subtask owns `partition` (from its assignment on).
    pub(crate) fn own(&mut self, partition: i32, now: Instant) {
        self.parts.entry(partition).or_insert_with(|| fresh(now));
    }

    /// A record of `partition` with event time `t` was emitted; says whether a watermark is
    /// due by count.
    #[inline]
    pub(crate) fn observe(&mut self, partition: i32, t: u64, now: Instant) -> bool {
        let part = self.parts.entry(partition).or_insert_with(|| fresh(now));
        if !self.markers {
            part.max = Some(part.max.map_or(t, |m| m.max(t)));
        }
        part.last_record = now;
        self.since += 1;
        self.since >= self.every
    }

    /// A writer's marker was read from `partition`; says whether a watermark is due by count.
    /// A marker naming another number of writers (the upstream was rescaled) starts the
    /// partition's table again from it.
    pub(crate) fn observe_mark(&mut self, partition: i32, mark: super::repartition::WriterMark, now: Instant) -> bool {
        let part = self.parts.entry(partition).or_insert_with(|| fresh(now));
        let (count, marks) = &mut part.writers;
        if *count != mark.writers {
            *count = mark.writers;
            marks.clear();
        }
        let w = marks.entry(mark.writer).or_insert(0);
        *w = (*w).max(mark.watermark);
        part.max = Self::writers_min(&part.writers);
        part.last_record = now;
        self.since += 1;
        self.since >= self.every
    }

    fn writers_min((count, marks): &Writers) -> Option<u64> {
        if *count == 0 || (0..*count).any(|w| !marks.contains_key(&w)) {
            return None;
        }
        marks.range(..*count).map(|(_, &w)| w).min()
    }

    /// Every owned partition's writers ended (marked `u64::MAX`).
    pub(crate) fn writers_ended(&self) -> bool {
        self.markers && !self.parts.is_empty() && self.parts.values().all(|p| p.max == Some(u64::MAX))
    }

    /// The writers' tables of the partitions, for a checkpoint.
    pub(crate) fn writers(&self) -> BTreeMap<i32, Writers> {
        if !self.markers {
            return BTreeMap::new();
        }
        self.parts.iter().filter(|(_, p)| p.writers.0 > 0).map(|(&id, p)| (id, p.writers.clone())).collect()
    }

    /// Writers' tables from a checkpoint (before the assignment).
    pub(crate) fn restore_writers(&mut self, restored: BTreeMap<i32, Writers>, now: Instant) {
        for (id, writers) in restored {
            let part = self.parts.entry(id).or_insert_with(|| fresh(now));
            part.max = Self::writers_min(&writers);
            part.writers = writers;
        }
    }

    /// The largest event time read on any partition (latency markers carry it).
    pub(crate) fn newest(&self) -> Option<u64> {
        self.parts.values().filter_map(|p| p.max).max()
    }

    /// Whether a watermark is due by time.
    pub(crate) fn due_by_time(&self) -> bool {
        self.interval.is_some_and(|i| self.last_emit.elapsed() >= i)
    }

    /// The watermark now, given which partitions are caught up.
    pub(crate) fn current(&self, caught_up: impl Fn(i32) -> bool, now: Instant) -> Option<u64> {
        let mark = |p: &Part| p.max.map_or(0, |m| m.saturating_sub(self.bound_ns));
        let held = self
            .parts
            .iter()
            .filter(|(id, p)| !(caught_up(**id) && now.duration_since(p.last_record) >= self.idle))
            .map(|(_, p)| mark(p))
            .min();
        held.or_else(|| self.parts.values().filter(|p| p.max.is_some()).map(mark).min())
    }

    /// Note an emission attempt; returns the watermark to send if `w` advances the last one.
    pub(crate) fn advance(&mut self, w: Option<u64>) -> Option<u64> {
        self.since = 0;
        self.last_emit = Instant::now();
        let w = w?;
        (w > self.emitted).then(|| {
            self.emitted = w;
            w
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock() -> PartitionWatermarks {
        let strategy = WatermarkStrategy::bounded(Duration::from_nanos(10)).every_records(Some(2)).interval(None);
        PartitionWatermarks::new(strategy, Duration::from_millis(100))
    }

    #[test]
    fn the_slowest_partition_holds_the_watermark() {
        let now = Instant::now();
        let mut c = clock();
        c.own(0, now);
        c.own(1, now);
        assert!(!c.observe(0, 1_000, now));
        assert!(c.observe(0, 2_000, now), "due after 2 records");
        // Partition 1 not read yet: it holds the watermark at 0.
        assert_eq!(c.current(|_| false, now), Some(0));
        assert_eq!(c.advance(Some(0)), None, "0 is no watermark");
        c.observe(1, 500, now);
        assert_eq!(c.current(|_| false, now), Some(490));
        assert_eq!(c.advance(c.current(|_| false, now)), Some(490));
        assert_eq!(c.advance(Some(400)), None, "never backwards");
    }

    #[test]
    fn a_caught_up_partition_stops_holding_after_the_idle_time() {
        let t0 = Instant::now();
        let mut c = clock();
        c.own(0, t0);
        c.own(1, t0);
        c.observe(0, 5_000, t0);
        c.observe(1, 100, t0);
        let caught_up = |p: i32| p == 1;
        assert_eq!(c.current(caught_up, t0 + Duration::from_millis(50)), Some(90), "not idle yet");
        assert_eq!(c.current(caught_up, t0 + Duration::from_millis(150)), Some(4_990), "idle: released");
        assert_eq!(c.current(|_| false, t0 + Duration::from_millis(150)), Some(90), "data left: held");
        // Everything idle: the minimum over the partitions that had records.
        assert_eq!(c.current(|_| true, t0 + Duration::from_millis(150)), Some(90));
        // A partition with records left never idles, however long it was not read.
        c.own(2, t0);
        assert_eq!(c.current(|p| p != 2, t0 + Duration::from_secs(60)), Some(0));
    }
}
