//! Nexmark's events as a source: persons, auctions and bids, strings and all, from the
//! `nexmark` crate's generator (a port of the generator of Flink's and Beam's Nexmark suites),
//! for benchmarks and for trying a job on realistic input.
//!
//! - [`NexmarkEvent`] ([`Person`], [`Auction`], [`Bid`]): the events, with Flink's columns;
//!   variable-length records (see `event.rs` for their encoding), so they travel through a
//!   ring's frames like any other.
//! - [`NexmarkConfig`]: every setting of the generator — events, rates and their shape, base
//!   time, proportions, sizes, hot ratios, out-of-order groups, ids — with the crate's
//!   defaults; the same settings give the same events, whatever the parallelism.
//! - [`NexmarkSource`]: subtask `i` of `p` emits the sequence's offsets `i, i + p, ...`; the
//!   generator's CPU time is counted apart ([`NexmarkStats`]), so a benchmark can report the
//!   engine's cost alone.
//!
//! In a job file (`type = "nexmark"`), the source emits the job file's events (`key`,
//! `value`, `time_ns`, `seq`): one kind of Nexmark event, two of its numeric fields as key and
//! value, its time in ns and its offset in the sequence as `seq` (see `section.rs` for the
//! keys, and `tests/jobs/nexmark-*.toml`).
//!
//! ```toml
//! [[source]]
//! id = "bids"
//! type = "nexmark"
//! events = 1000000          # the whole sequence: persons, auctions and bids; omit: endless
//! rate = 10000000           # events per second of event time (first_rate = next_rate)
//! base_time_ms = 1735689600000
//! emit = "bids"             # bids | auctions | persons
//! key = "bidder"            # a bid's auction | bidder | price
//! value = "price"
//! timestamp = "time_ns"     # event time: the event's date_time
//! max_out_of_orderness_ms = 4000
//! ```

mod config;
mod event;
mod section;
mod source;

pub use config::{NexmarkConfig, NexmarkStats, RateShape, SetError};
pub use event::{AUCTION, Auction, BID, Bid, NexmarkEvent, PERSON, Person};
pub use section::{EventProjection, ProjectedKind};
pub use source::{NexmarkSource, Projection};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::{Collector, Halt, Signal, Source, SourcePoll, SubtaskInfo};

    struct Collect(Vec<NexmarkEvent>);

    impl Collector<NexmarkEvent> for Collect {
        fn collect(&mut self, record: &NexmarkEvent) -> Result<(), Halt> {
            self.0.push(record.clone());
            Ok(())
        }
        fn signal(&mut self, _: Signal) -> Result<(), Halt> {
            Ok(())
        }
    }

    fn info(index: u32, parallelism: u32) -> SubtaskInfo {
        SubtaskInfo { job: "t".into(), node: "nexmark".into(), index, parallelism, max_key_groups: 128, owned: None }
    }

    fn drain(source: &mut NexmarkSource) -> Vec<NexmarkEvent> {
        let mut out = Collect(Vec::new());
        while let Ok(SourcePoll::Emitted(_)) = source.poll(&mut out) {}
        out.0
    }

    /// Subtasks split the sequence by offset: together they emit every event once, the same
    /// events as the generator alone in order, whatever the parallelism; the stats count
    /// them and some generator time.
    #[test]
    fn subtasks_split_the_sequence() {
        let config = NexmarkConfig { out_of_order_group_size: 7, ..NexmarkConfig::new(Some(2_003), 1_000, 1_000) };
        let alone: Vec<NexmarkEvent> = config.events_in_order(u64::MAX).collect();
        assert_eq!(alone.len(), 2_003);
        for p in [1u32, 3] {
            let mut merged = vec![None; alone.len()];
            for i in 0..p {
                let events = drain(&mut NexmarkSource::new(&config, &info(i, p)));
                for (k, e) in events.into_iter().enumerate() {
                    let offset = i as usize + k * p as usize;
                    assert!(merged[offset].replace(e).is_none());
                }
            }
            let merged: Vec<NexmarkEvent> = merged.into_iter().map(|e| e.expect("every offset")).collect();
            assert_eq!(merged, alone, "p={p}");
        }
        assert_eq!(config.stats.events(), 2 * 2_003);
        // The thread's CPU clock counts nanoseconds: generating 4,006 events takes some.
        assert!(config.stats.generator_cpu() > std::time::Duration::ZERO);
    }

    /// A restored subtask resumes at its checkpoint's offset; an offset of another subtask
    /// is refused.
    #[test]
    fn restore_resumes_at_the_offset() {
        let config = NexmarkConfig::new(Some(1_000), 1_000, 1_000);
        let all = drain(&mut NexmarkSource::new(&config, &info(1, 2)));
        let mut first = NexmarkSource::new(&config, &info(1, 2));
        let mut out = Collect(Vec::new());
        first.poll(&mut out).expect("polls");
        let snapshot = first.snapshot(1).expect("snapshots");
        let mut second = NexmarkSource::new(&config, &info(1, 2));
        second.restore(Some((1, &snapshot))).expect("restores");
        let rest = drain(&mut second);
        assert_eq!([out.0, rest].concat(), all);
        let mut other = NexmarkSource::new(&config, &info(0, 2));
        assert!(other.restore(Some((1, &snapshot))).is_err());
    }
}
