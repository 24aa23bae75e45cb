//! Repartition topics: a `key_by` edge that runs through Kafka, so that a key's records meet
//! in one subtask even when the input is not keyed the job's way and the job runs as several
//! instances on several hosts ([`crate::cluster`]).
//!
//! ```text
//!   upstream subtask w (any host)            topic <job>-<key_by>-repartition, P partitions
//!   ── records ─► KafkaSink, exactly once ─► partition = the subtask of the key's key group
//!   ── watermark W ─► a marker (w, writers, W) to every partition, in the same transaction
//!                                            │ read_committed
//!   downstream subtask p (the owner of p) ◄──┘ KafkaSource: partition p only;
//!                                              watermark = min over writers of their markers
//! ```
//!
//! - **Exactly once.** The upstream side is an exactly-once Kafka sink: its records and
//!   markers are committed when its checkpoint completes (and written again from its log if a
//!   crash left the commit undone); the downstream side reads `read_committed` and
//!   checkpoints its offsets with the writers' watermarks it had seen there. Each side's
//!   checkpoint is consistent by itself, so the instances need no common barrier.
//! - **Partitions.** The topic has as many partitions as the downstream node has subtasks (P,
//!   the lead input's partitions when instances share the job): downstream subtask `p` reads
//!   partition `p`. A record goes to the partition of the subtask that owns its key's key
//!   group, so on one host the records of a partition are already that subtask's keys. The
//!   sink keys each record with its partition number (4 bytes), so a transaction written
//!   again from its log lands where it first did.
//! - **Watermarks.** Records of several writers interleave in a partition, each writer's in
//!   its own order, so no bound on out-of-orderness read off the records holds. Each writer
//!   instead writes its watermark to every partition as it advances (a marker, in the same
//!   transaction as its records, so after them); a partition's watermark is the minimum over
//!   the `writers` its markers name, and holds at 0 until each has written one. At the end of
//!   input a writer marks `u64::MAX`; a downstream subtask whose writers all ended ends.
//! - **The topic** is created (by whichever side comes first, through the admin API) with P
//!   partitions and the cluster's default replication; one with another partition count is
//!   refused (a key would reach a subtask that does not own it).
//!
//! Payloads: a record is `[0][the record's fixed layout]`, a marker `[1][writer u32 LE]
//! [writers u32 LE][watermark u64 LE]`.

use super::decode::{Decode, Encode, FormatError};
use super::error::Problem;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const RECORD: u8 = 0;
const MARKER: u8 = 1;
const MARKER_BYTES: usize = 1 + 4 + 4 + 8;

/// A writer's watermark, as one partition of a repartition topic received it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterMark {
    /// The writing (upstream) subtask.
    pub writer: u32,
    /// How many subtasks write the topic.
    pub writers: u32,
    /// Its watermark; `u64::MAX`: its input ended.
    pub watermark: u64,
}

impl WriterMark {
    /// The marker's payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(MARKER);
        out.extend_from_slice(&self.writer.to_le_bytes());
        out.extend_from_slice(&self.writers.to_le_bytes());
        out.extend_from_slice(&self.watermark.to_le_bytes());
    }

    fn decode(payload: &[u8]) -> Option<WriterMark> {
        if payload.len() != MARKER_BYTES || payload[0] != MARKER {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(payload[i..i + 4].try_into().expect("4 bytes"));
        Some(WriterMark {
            writer: u32_at(1),
            writers: u32_at(5),
            watermark: u64::from_le_bytes(payload[9..17].try_into().expect("8 bytes")),
        })
    }
}

/// Records of a fixed layout in a repartition topic, both ways: `[0][the record's bytes]`.
#[derive(Debug)]
pub struct RepartitionCodec<T> {
    value: Option<T>,
}

impl<T> Default for RepartitionCodec<T> {
    fn default() -> RepartitionCodec<T> {
        RepartitionCodec { value: None }
    }
}

impl<T: zerocopy::IntoBytes + zerocopy::Immutable + Send> Encode<T> for RepartitionCodec<T> {
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), FormatError> {
        out.push(RECORD);
        out.extend_from_slice(record.as_bytes());
        Ok(())
    }
}

impl<T: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + Send> Decode<T> for RepartitionCodec<T> {
    fn decode(&mut self, payload: Option<&[u8]>) -> Result<&T, FormatError> {
        let payload = payload.ok_or("no value (a tombstone) in a repartition topic")?;
        match payload.split_first() {
            Some((&RECORD, bytes)) => match T::read_from_bytes(bytes) {
                Ok(v) => Ok(self.value.insert(v)),
                Err(_) => Err(format!(
                    "a record of {} bytes, but a {} is {} (a repartition topic written by another job or version?)",
                    bytes.len(),
                    std::any::type_name::<T>(),
                    std::mem::size_of::<T>()
                )
                .into()),
            },
            _ => Err("not a weir repartition record (the topic is written by something else?)".into()),
        }
    }

    fn writer_mark(&self, payload: Option<&[u8]>) -> Option<WriterMark> {
        WriterMark::decode(payload?)
    }
}

/// The partition of a key hash in a topic of `partitions`: the subtask that owns its key
/// group among `partitions` subtasks.
pub fn partition_of(key_hash: u64, partitions: u32, max_key_groups: u32) -> i32 {
    let kg = crate::record::key_group(key_hash, max_key_groups);
    crate::record::subtask_for_key_group(kg, partitions, max_key_groups) as i32
}

/// The topic with `partitions`: created if it does not exist (its replication the cluster's
/// default), checked if it does. `properties` are the client's (how to reach the cluster).
pub(crate) fn ensure_topic(
    properties: &BTreeMap<String, String>,
    topic: &str,
    partitions: u32,
    timeout: Duration,
) -> Result<(), Problem> {
    let mut config = ClientConfig::new();
    for (k, v) in super::reach::connection_properties(properties) {
        config.set(k, v);
    }
    let deadline = Instant::now() + timeout;
    let count = |c: &BaseConsumer| -> Result<Option<usize>, Problem> {
        let metadata = c.fetch_metadata(Some(topic), timeout).map_err(|e| {
            Problem::unavailable(format!("cannot read the metadata of {topic}: {}", super::kafka_error_text(&e)))
        })?;
        Ok(metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len())
            .filter(|&n| n > 0))
    };
    let consumer: BaseConsumer =
        config.create().map_err(|e| super::reach::bad_setting("cannot create a metadata client", &e))?;
    if count(&consumer)?.is_none() {
        let admin: AdminClient<DefaultClientContext> =
            config.create().map_err(|e| super::reach::bad_setting("cannot create an admin client", &e))?;
        let new = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(-1));
        let options = AdminOptions::new().operation_timeout(Some(timeout));
        let results = futures::executor::block_on(admin.create_topics([&new], &options)).map_err(|e| {
            Problem::unavailable(format!(
                "cannot create the repartition topic {topic}: {}",
                super::kafka_error_text(&e)
            ))
        })?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => {
                    return Err(format!(
                        "cannot create the repartition topic {topic}: {code} (create it with {partitions} partitions, \
                         or give the job's principal the right to create topics)"
                    )
                    .into());
                }
            }
        }
    }
    // A topic just created takes a moment to show in every broker's metadata.
    loop {
        match count(&consumer)? {
            Some(n) if n == partitions as usize => return Ok(()),
            Some(n) => {
                return Err(format!(
                    "the repartition topic {topic} has {n} partitions and this job needs {partitions} (one per \
                     subtask after the key_by): delete it while no instance of the job runs, or give it {partitions}"
                )
                .into());
            }
            None if Instant::now() >= deadline => {
                return Err(Problem::unavailable(format!(
                    "the repartition topic {topic} did not appear in the metadata within {timeout:?}"
                )));
            }
            None => weir_ring::fiber::sleep(Duration::from_millis(100)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Event;

    #[test]
    fn records_and_markers_round_trip_and_are_told_apart() {
        let mut codec = RepartitionCodec::<Event>::default();
        let e = Event { key: 7, value: 8, time_ns: 9, seq: 10 };
        let mut bytes = Vec::new();
        codec.encode(&e, &mut bytes).unwrap();
        assert_eq!(bytes.len(), 33);
        assert_eq!(codec.writer_mark(Some(&bytes)), None);
        assert_eq!(*codec.decode(Some(&bytes)).unwrap(), e);
        let m = WriterMark { writer: 2, writers: 6, watermark: u64::MAX };
        let mut marker = Vec::new();
        m.encode(&mut marker);
        assert_eq!(codec.writer_mark(Some(&marker)), Some(m));
        assert!(codec.decode(Some(b"{\"key\":1}")).unwrap_err().reason().contains("not a weir repartition"));
        assert!(codec.decode(Some(&bytes[..20])).unwrap_err().reason().contains("a record of 19 bytes"));
    }

    /// A key's partition is the subtask its key group belongs to at that parallelism.
    #[test]
    fn a_key_goes_to_the_partition_of_its_key_group() {
        for key in 0..1000u64 {
            let h = crate::record::hash_key(&key);
            let p = partition_of(h, 6, 128);
            let kg = crate::record::key_group(h, 128);
            assert!(crate::record::key_group_range(p as u32, 6, 128).contains(&kg));
        }
    }
}
