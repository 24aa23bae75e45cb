//! Event time in a source's job-file section: `timestamp = "time_ns"` and the watermark
//! settings, shared by every source type that carries events.

use super::WatermarkStrategy;
use crate::util::section::{Affects, JobFileError, Key, KeyType as T, Section, UNSET};
use std::time::Duration;

impl WatermarkStrategy {
    /// The event-time keys of a source's section.
    pub const KEYS: &'static [Key] = &[
        Key::new("timestamp", T::String, UNSET, "Count in event time, taken from this event field (`time_ns`): the source emits watermarks (per partition, for Kafka).")
            .affects(Affects::Results),
        Key::new("max_out_of_orderness_ms", T::Integer, "0", "How far behind the largest event time seen a record may be and not be late: watermark = largest time − this.")
            .affects(Affects::Results),
        Key::new("watermark_every", T::Integer, "every record", "Emit a watermark after this many records, if it advanced.").affects(Affects::Latency),
        Key::new("watermark_interval_ms", T::Integer, "unset: by records only", "Also emit one this often, if it advanced.").affects(Affects::Latency),
    ];

    /// The watermark strategy a source's section declares; `None` without `timestamp`.
    pub fn from_section(s: &mut Section) -> Result<Option<WatermarkStrategy>, JobFileError> {
        let bound = s.take::<u64>("max_out_of_orderness_ms")?;
        let every = s.take::<u64>("watermark_every")?;
        let interval = s.take::<u64>("watermark_interval_ms")?;
        let Some(field) = s.take::<String>("timestamp")? else {
            let stray = [("max_out_of_orderness_ms", bound.is_some()), ("watermark_every", every.is_some())];
            let stray = stray.into_iter().chain([("watermark_interval_ms", interval.is_some())]);
            if let Some((name, _)) = stray.into_iter().find(|(_, set)| *set) {
                return Err(s.err(
                    s.kind_span(),
                    name,
                    format!("`{name}` needs event time: add `timestamp = \"time_ns\"`"),
                ));
            }
            return Ok(None);
        };
        if field.get_ref() != "time_ns" {
            let message =
                format!("unknown timestamp field `{}`; events carry their event time in `time_ns`", field.get_ref());
            return Err(s.err(field.span(), "timestamp", message));
        }
        let mut strategy = WatermarkStrategy::bounded(Duration::from_millis(bound.map_or(0, |b| b.into_inner())));
        if let Some(every) = every {
            if *every.get_ref() == 0 {
                return Err(s.err(every.span(), "watermark_every", "watermark_every must be at least 1 record"));
            }
            strategy = strategy.every_records(Some(*every.get_ref()));
        }
        if let Some(ms) = interval {
            strategy = strategy.interval(Some(Duration::from_millis(ms.into_inner())));
        }
        Ok(Some(strategy))
    }
}
