//! The Kafka source: a `BaseConsumer` per subtask, partitions assigned explicitly.
//!
//! ```text
//!  partition p ──(p % parallelism)──► subtask ── assign(p @ offset) ── poll(0) ──► decode ──► out.collect
//!                                                                    │ bad / too large ──► dead letter
//!  snapshot(n): next offset per partition ──► checkpoint n     checkpoint_complete(n): commit them (lag only)
//! ```
//!
//! See the module docs of [`crate::io::kafka`] for why there is no consumer group, how the
//! prefetch is bounded, and how the source waits.

use super::config::{DeadLetter, KafkaSourceConfig, OnBadRecord, Reset, StartFrom};
use super::decode::{Decode, FormatError};
use super::error::{KafkaConnectorError, KafkaRole, Problem};
use super::native::{Commit, QueueEvent, Waiter, cached_watermarks};
use super::reach;
use super::watermarks::{PartitionWatermarks, Writers};
use super::{Deliveries, kafka_error_text};
use crate::io::poison::Poisoned;
use crate::operators::{Collector, Halt, Signal, SourcePoll, SubtaskInfo, outside};
use crate::record::Record;
use crate::time::{TimestampFn, WatermarkStrategy};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::Write;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The most of a payload quoted in a dead-letter file line.
const QUOTE_BYTES: usize = 4096;
/// Tries of the final offset commit to the consumer group (at the end of input or a clean
/// stop), and the pause before the n-th retry (n times this).
const FINAL_COMMIT_TRIES: u32 = 5;
const FINAL_COMMIT_BACKOFF: Duration = Duration::from_millis(100);
/// How long the source subtask of a partition another instance serves asks to sleep between polls
/// (it is woken at once for a checkpoint or a stop).
const DORMANT_WAIT: Duration = Duration::from_secs(1);
/// How long reading the committed offsets back may take.
const FINAL_COMMIT_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one try of the final offset commit may wait for the group coordinator.
const FINAL_COMMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often positions, watermarks and lag are published.
const STATS_EVERY: Duration = Duration::from_millis(50);
/// A source running as a fiber looks at its queue this often while idle (it cannot block
/// its thread on the queue's fd).
const FIBER_QUEUE_SLICE: Duration = Duration::from_millis(1);
/// Partitions tracked one by one in [`KafkaSourceStats`] by default.
pub const DEFAULT_TRACKED_PARTITIONS: usize = 1024;

/// One partition's position and lag, as the runtime can publish them. `-1`: unknown.
#[derive(Debug)]
pub struct PartitionStats {
    /// The next offset the source will read (every record before it was handed on).
    pub position: AtomicI64,
    /// The partition's end at the last fetch (librdkafka's cached high watermark).
    pub high_watermark: AtomicI64,
    /// `high_watermark − position`: records in Kafka this source has not read.
    pub lag: AtomicI64,
}

impl Default for PartitionStats {
    fn default() -> PartitionStats {
        PartitionStats { position: AtomicI64::new(-1), high_watermark: AtomicI64::new(-1), lag: AtomicI64::new(-1) }
    }
}

/// Totals of a Kafka source's subtasks, and positions and lag per partition, readable while
/// the job runs (relaxed atomics, written by the subtask that owns the partition).
#[derive(Debug)]
pub struct KafkaSourceStats {
    /// Records handed on to the job.
    pub records: AtomicU64,
    /// Payload bytes read from Kafka (records handed on or not).
    pub bytes: AtomicU64,
    /// Records that could not be decoded.
    pub malformed: AtomicU64,
    /// Records larger than the job's largest record.
    pub oversized: AtomicU64,
    /// Bad records written to the dead-letter destination.
    pub dead_letters: AtomicU64,
    /// Bad records skipped (policy `skip`).
    pub skipped: AtomicU64,
    /// Errors the client reported and recovered from (a broker down, a timeout).
    pub client_errors: AtomicU64,
    /// Offset commits sent (for lag monitoring).
    pub commits: AtomicU64,
    /// Times a subtask waited in its io_uring for Kafka or its mailbox.
    pub waits: AtomicU64,
    /// Waits that Kafka ended (a record or an event arrived).
    pub kafka_wakeups: AtomicU64,
    /// Partitions `0..len` tracked one by one; higher partitions count in the totals only.
    partitions: Box<[PartitionStats]>,
}

impl Default for KafkaSourceStats {
    fn default() -> KafkaSourceStats {
        KafkaSourceStats::with_partitions(DEFAULT_TRACKED_PARTITIONS)
    }
}

impl KafkaSourceStats {
    /// Stats tracking partitions `0..tracked` one by one.
    pub fn with_partitions(tracked: usize) -> KafkaSourceStats {
        KafkaSourceStats {
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            oversized: AtomicU64::new(0),
            dead_letters: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            client_errors: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            kafka_wakeups: AtomicU64::new(0),
            partitions: (0..tracked).map(|_| PartitionStats::default()).collect(),
        }
    }

    /// Position, high watermark and lag of `partition`, if tracked.
    pub fn partition(&self, partition: i32) -> Option<&PartitionStats> {
        usize::try_from(partition).ok().and_then(|p| self.partitions.get(p))
    }

    /// Every tracked partition's stats, by partition number.
    pub fn partitions(&self) -> &[PartitionStats] {
        &self.partitions
    }

    /// The sum of the known lags.
    pub fn total_lag(&self) -> i64 {
        self.partitions.iter().map(|p| p.lag.load(Ordering::Relaxed)).filter(|&l| l > 0).sum()
    }
}

/// What a snapshot holds: the next offset of every partition this subtask owns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Positions {
    topic: String,
    /// partition → next offset.
    partitions: BTreeMap<i32, i64>,
    /// A repartition topic: partition → its writers' watermarks read before that offset.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    writers: BTreeMap<i32, Writers>,
}

/// Reads one Kafka topic into a job. See the module docs.
pub struct KafkaSource<T, D> {
    // Drop order matters: the queue event and its handle go before the consumer.
    event: Option<QueueEvent>,
    waiter: Option<Waiter>,
    consumer: Option<BaseConsumer<ErrorWatch>>,
    /// What the client has reported since it last delivered a record.
    errors: ErrorWatch,
    /// Some owned partition has records past its position (as of the last `publish`).
    behind: bool,
    dead_letter: Option<DeadLetterWriter>,
    config: KafkaSourceConfig,
    name: String,
    index: u32,
    parallelism: u32,
    /// One instance of several (`SubtaskInfo::owned`): whether partition `index` is this
    /// instance's (`None`: the job runs alone); the topic must then have `parallelism`
    /// partitions.
    owned: Option<bool>,
    decoder: D,
    topic_c: CString,
    /// Next offset per owned partition (set at assignment).
    positions: BTreeMap<i32, i64>,
    /// Bounded mode: the end offset of each owned partition (its high watermark at assignment).
    ends: BTreeMap<i32, i64>,
    /// Offsets to start from, given by `restore`.
    restored: Option<BTreeMap<i32, i64>>,
    /// A repartition topic: the writers' watermarks of the restored partitions.
    restored_writers: BTreeMap<i32, Writers>,
    assigned: bool,
    /// It was said (and marked in the watermarks) that this subtask reads no partition.
    said_empty: bool,
    /// Positions snapshotted per checkpoint, until it completes.
    snapshots: BTreeMap<u64, BTreeMap<i32, i64>>,
    last_stats: Instant,
    /// Event time and watermarks per partition, if asked for.
    clock: Option<(TimestampFn<T>, PartitionWatermarks)>,
    /// librdkafka's positions (past transaction markers), as of the last `publish` (every
    /// 50 ms: asking costs an allocation, too much for every poll).
    fetched: BTreeMap<i32, i64>,
    poisoned: Poisoned,
    /// Keeps the published lag true while this subtask is paused (see `lag.rs`).
    _lag: Option<super::lag::LagRefresher>,
    _record: PhantomData<fn() -> T>,
}

impl<T, D> std::fmt::Debug for KafkaSource<T, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource").field("name", &self.name).field("topic", &self.config.topic).finish()
    }
}

impl<T: Record, D: Decode<T>> KafkaSource<T, D> {
    /// A Kafka source for one subtask. Never fails: a setup error (bad settings, a client
    /// librdkafka refuses, no io_uring) poisons the source and its first poll fails the job
    /// with it. It connects at its first poll.
    pub fn new(config: KafkaSourceConfig, info: &SubtaskInfo, decoder: D) -> KafkaSource<T, D> {
        let name = info.name();
        let mut source = KafkaSource {
            event: None,
            waiter: None,
            consumer: None,
            dead_letter: None,
            topic_c: CString::new(config.topic.clone()).unwrap_or_default(),
            name,
            index: info.index,
            parallelism: info.parallelism.max(1),
            owned: info.owned,
            decoder,
            positions: BTreeMap::new(),
            ends: BTreeMap::new(),
            restored: None,
            restored_writers: BTreeMap::new(),
            assigned: false,
            said_empty: false,
            snapshots: BTreeMap::new(),
            last_stats: Instant::now(),
            clock: None,
            fetched: BTreeMap::new(),
            errors: ErrorWatch::default(),
            behind: false,
            poisoned: Poisoned::default(),
            config,
            _lag: None,
            _record: PhantomData,
        };
        // The subtask of a partition another instance serves reads nothing: it makes no
        // client (no connections, no librdkafka threads), and its polls are idle.
        if info.owned != Some(false)
            && let Err(problem) = source.setup()
        {
            source.poison(problem);
        }
        source
    }

    /// Emit watermarks from the source itself, per partition: the largest event time read
    /// from each partition, minus `strategy`'s out-of-orderness, and the minimum over the
    /// partitions (see `watermarks.rs`). Declare the stream's event time with
    /// [`Stream::with_source_watermarks`](crate::graph::Stream::with_source_watermarks), not
    /// `with_event_time` (whose assigner would replace these watermarks with one per subtask).
    pub fn with_event_time(
        mut self,
        timestamp: impl Fn(&T) -> u64 + Send + Sync + 'static,
        strategy: WatermarkStrategy,
    ) -> KafkaSource<T, D> {
        self.clock =
            Some((std::sync::Arc::new(timestamp), PartitionWatermarks::new(strategy, self.config.partition_idle)));
        self
    }

    /// A repartition topic's reader ([`super::repartition`]): watermarks from the writers'
    /// markers, each partition's the smallest of its writers'; `timestamp` is the records'
    /// event time (for latency markers). The subtask ends once every writer of its
    /// partitions marked the end of its input.
    pub fn with_writer_watermarks(
        mut self,
        timestamp: impl Fn(&T) -> u64 + Send + Sync + 'static,
        strategy: WatermarkStrategy,
    ) -> KafkaSource<T, D> {
        let clock = PartitionWatermarks::from_writers(strategy, self.config.partition_idle);
        self.clock = Some((std::sync::Arc::new(timestamp), clock));
        self
    }

    /// Same as [`with_event_time`](KafkaSource::with_event_time), with a shared timestamp function.
    pub fn with_event_time_fn(mut self, timestamp: TimestampFn<T>, strategy: WatermarkStrategy) -> KafkaSource<T, D> {
        self.clock = Some((timestamp, PartitionWatermarks::new(strategy, self.config.partition_idle)));
        self
    }

    /// The setup error that poisoned this source, if any.
    pub fn setup_error(&self) -> Option<&str> {
        self.poisoned.text()
    }

    /// The client's prefetch bound (see [`KafkaSourceConfig::prefetch_budget_bytes`]).
    pub fn prefetch_budget_bytes(&self) -> u64 {
        self.config.prefetch_budget_bytes()
    }

    fn setup(&mut self) -> Result<(), Problem> {
        self.config.validate()?;
        if self.config.topic.contains('\0') {
            return Err("the topic name has a NUL byte".into());
        }
        let mut client = ClientConfig::new();
        for (k, v) in self.config.client_properties() {
            client.set(k, v);
        }
        super::hear_broker_failures(&mut client);
        self.errors.connection.hide_secrets(&self.config.properties);
        let consumer: BaseConsumer<ErrorWatch> = client
            .create_with_context(self.errors.clone())
            .map_err(|e| reach::bad_setting("cannot create the consumer", &e))?;
        let group = self.config.properties.contains_key("group.id");
        self.event = Some(QueueEvent::enable(consumer.client().native_ptr(), group)?);
        self.consumer = Some(consumer);
        self.waiter = Some(Waiter::new()?);
        self.dead_letter = match (&self.config.on_bad_record, &self.config.dead_letter) {
            (OnBadRecord::DeadLetter, Some(DeadLetter::File(path))) => {
                Some(DeadLetterWriter::File { path: path.clone(), file: None })
            }
            (OnBadRecord::DeadLetter, Some(DeadLetter::Topic(topic))) => {
                // The same cluster, reached the same way (TLS, SASL) as the source's.
                let mut c = ClientConfig::new();
                for (name, value) in reach::connection_properties(&self.config.properties) {
                    c.set(name, value);
                }
                c.set("enable.idempotence", "true");
                let deliveries = Deliveries::default();
                let producer = c
                    .create_with_context(deliveries.clone())
                    .map_err(|e| reach::bad_setting("cannot create the dead-letter producer", &e))?;
                Some(DeadLetterWriter::Topic { topic: topic.clone(), producer, deliveries })
            }
            _ => None,
        };
        Ok(())
    }

    fn check(&self) -> Result<(), Halt> {
        self.poisoned.check()
    }

    fn poison(&mut self, problem: impl Into<Problem>) -> Halt {
        let problem = refusal_of(problem.into(), &self.config.topic, &self.config.properties, "Read");
        let e = KafkaConnectorError::new(KafkaRole::Source, &self.name, &self.config.topic, problem);
        self.poisoned.poison(e)
    }

    /// The partitions this subtask owns, and where each starts; then `assign()`.
    fn assign(&mut self) -> Result<(), Problem> {
        let consumer = self.consumer.as_ref().expect("a source without a consumer is poisoned");
        let topic = self.config.topic.as_str();
        let timeout = self.config.request_timeout;
        // Before assignment a poll hands out no record, only the client's errors.
        let serve = || {
            let _ = consumer.poll(Duration::ZERO);
        };
        let properties = &self.config.properties;
        if self.config.create_topic {
            super::repartition::ensure_topic(properties, topic, self.parallelism, timeout)?;
        }
        let metadata = reach::reach(consumer.client(), &serve, topic, timeout, &self.errors.connection, properties)?;
        let t = metadata.topics().iter().find(|t| t.name() == topic).ok_or("the topic is not in the metadata")?;
        if let Some(err) = t.error() {
            let code = rdkafka::types::RDKafkaErrorCode::from(err);
            return Err(format!("the topic's metadata has an error: {code} (does the topic exist?)").into());
        }
        let count = t.partitions().len() as i32;
        if count == 0 {
            return Err("the topic has no partitions (does it exist?)".into());
        }
        if self.owned.is_some() && count as u32 != self.parallelism {
            return Err(format!(
                "the topic has {count} partitions and this instance was started for {}: partitions were added while \
                 the job ran; restart the instances",
                self.parallelism
            )
            .into());
        }
        let owned: Vec<i32> =
            (0..count).filter(|p| (*p as u32) % self.parallelism == self.index && self.owned != Some(false)).collect();
        let restored = self.restored.take().unwrap_or_default();
        let committed = match self.config.start {
            StartFrom::Committed { .. } => {
                let mut tpl = TopicPartitionList::new();
                for p in owned.iter().filter(|p| !restored.contains_key(p)) {
                    tpl.add_partition(topic, *p);
                }
                let got = consumer
                    .committed_offsets(tpl, timeout)
                    .map_err(|e| format!("cannot read the group's committed offsets: {}", kafka_error_text(&e)))?;
                offsets_of(&got)
            }
            _ => BTreeMap::new(),
        };
        let mut tpl = TopicPartitionList::new();
        for &p in &owned {
            let known = restored.get(&p).or(committed.get(&p)).copied();
            let watermarks = if known.is_none() || self.config.bounded {
                let w = consumer
                    .fetch_watermarks(topic, p, timeout)
                    .map_err(|e| format!("cannot read the offsets of partition {p}: {}", kafka_error_text(&e)))?;
                Some(w)
            } else {
                None
            };
            let offset = match (known, watermarks) {
                (Some(o), _) => o,
                (None, Some((low, high))) => match self.config.start {
                    StartFrom::Earliest | StartFrom::Committed { otherwise: Reset::Earliest } => low,
                    StartFrom::Latest | StartFrom::Committed { otherwise: Reset::Latest } => high,
                },
                (None, None) => unreachable!("watermarks are read when no offset is known"),
            };
            if let (true, Some((_, high))) = (self.config.bounded, watermarks) {
                self.ends.insert(p, high);
            }
            tpl.add_partition_offset(topic, p, Offset::Offset(offset))
                .map_err(|e| format!("partition {p} offset {offset}: {}", kafka_error_text(&e)))?;
            self.positions.insert(p, offset);
            if let Some(s) = self.config.stats.partition(p) {
                s.position.store(offset, Ordering::Relaxed);
            }
        }
        consumer.assign(&tpl).map_err(|e| format!("assign: {}", kafka_error_text(&e)))?;
        if let (Some(every), false) = (self.config.lag_refresh, self.config.bounded) {
            self._lag = super::lag::LagRefresher::start(&self.config, owned.clone(), every, &self.name);
        }
        if let Some((_, clock)) = &mut self.clock {
            let now = Instant::now();
            let mut restored = std::mem::take(&mut self.restored_writers);
            restored.retain(|p, _| owned.contains(p));
            clock.restore_writers(restored, now);
            for &p in &owned {
                clock.own(p, now);
            }
        }
        self.assigned = true;
        Ok(())
    }

    /// Emit the watermark the partitions' positions allow now.
    fn emit_watermark_now(&mut self, out: &mut dyn Collector<T>) -> Result<(), Halt> {
        let consumer = self.consumer.as_ref().expect("a source without a consumer is poisoned");
        let at = Ends {
            topic: &self.topic_c,
            positions: &self.positions,
            fetched: &self.fetched,
            ends: &self.ends,
            bounded: self.config.bounded,
        };
        emit_watermark(&mut self.clock, consumer, &at, out)
    }

    /// Publish positions, cached high watermarks and lag (at most every `STATS_EVERY`).
    fn publish(&mut self, force: bool) {
        if !force && self.last_stats.elapsed() < STATS_EVERY {
            return;
        }
        self.last_stats = Instant::now();
        let Some(consumer) = &self.consumer else { return };
        let client = consumer.client().native_ptr();
        // Past transaction markers too (see `emit_watermark`): else a topic written with
        // transactions shows a lag of 1 for ever.
        self.fetched = fetch_positions(consumer);
        self.behind = false;
        for (&p, &position) in &self.positions {
            let Some(s) = self.config.stats.partition(p) else { continue };
            let position = position.max(self.fetched.get(&p).copied().unwrap_or(-1));
            s.position.store(position, Ordering::Relaxed);
            if let Some((_, high)) = cached_watermarks(client, &self.topic_c, p) {
                // The larger of the cache and what the lag refresher learned (`lag.rs`).
                let high = s.high_watermark.fetch_max(high, Ordering::Relaxed).max(high);
                s.lag.store((high - position).max(0), Ordering::Relaxed);
                self.behind |= high > position;
            }
        }
    }

    /// Take up to a batch of records from the client's queue (never waiting), hand each on.
    fn take(&mut self, out: &mut dyn Collector<T>) -> Result<(usize, usize), Halt> {
        let KafkaSource {
            consumer,
            decoder,
            dead_letter,
            config,
            positions,
            ends,
            clock,
            topic_c,
            fetched,
            errors,
            ..
        } = self;
        let consumer = consumer.as_ref().expect("a source without a consumer is poisoned");
        let stats = &*config.stats;
        let now = Instant::now();
        let (mut taken, mut emitted) = (0, 0);
        // Counted here and published once per batch: the stats are shared by every subtask of
        // the node (one cache line written from several cores per record otherwise), and the
        // error watch takes a lock.
        let (mut bytes, mut delivered) = (0u64, false);
        let mut failure: Option<Problem> = None;
        while taken < config.batch_records {
            let message = match consumer.poll(Duration::ZERO) {
                None => break,
                Some(Ok(m)) => m,
                Some(Err(e)) => match e {
                    KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset) => {
                        failure = Some(Problem::from(format!(
                            "an offset is out of range ({}): the records at the checkpointed offset are gone \
                             (retention?); refusing to skip them silently",
                            kafka_error_text(&e)
                        )));
                        break;
                    }
                    KafkaError::MessageConsumptionFatal(_) => {
                        failure = Some(format!("fatal client error: {}", kafka_error_text(&e)).into());
                        break;
                    }
                    KafkaError::MessageConsumption(
                        RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::TopicAuthorizationFailed,
                    ) => {
                        failure = Some(kafka_error_text(&e).into());
                        break;
                    }
                    // Transient (a broker down, a timeout): librdkafka retries on its own; but
                    // not silently, and not for ever (see `check_errors`).
                    _ => {
                        stats.client_errors.fetch_add(1, Ordering::Relaxed);
                        errors.report(&kafka_error_text(&e));
                        delivered = false;
                        taken += 1;
                        continue;
                    }
                },
            };
            taken += 1;
            delivered = true;
            let (partition, offset) = (message.partition(), message.offset());
            if config.bounded && ends.get(&partition).is_none_or(|&end| offset >= end) {
                // Bounded: past this partition's end; the position stays at the end.
                continue;
            }
            positions.insert(partition, offset + 1);
            let payload = message.payload();
            let len = payload.map_or(0, <[u8]>::len);
            bytes += len as u64;
            let bad = if len > config.max_record_bytes {
                Some((
                    true,
                    format!("payload of {len} bytes is over the largest record ({} bytes)", config.max_record_bytes),
                ))
            } else if let Some(mark) = decoder.writer_mark(payload) {
                // A writer's watermark (a repartition topic): no record.
                if clock.as_mut().is_some_and(|(_, c)| c.observe_mark(partition, mark, now)) {
                    let at = Ends { topic: topic_c, positions, fetched, ends, bounded: config.bounded };
                    emit_watermark(clock, consumer, &at, out)?;
                }
                None
            } else {
                match decoder.decode(payload) {
                    Ok(record) if record.encoded_len() > config.max_record_bytes => Some((
                        true,
                        format!(
                            "the decoded record is {} bytes, over the largest record ({} bytes)",
                            record.encoded_len(),
                            config.max_record_bytes
                        ),
                    )),
                    Ok(record) => {
                        let due = clock.as_mut().is_some_and(|(time, c)| c.observe(partition, time(record), now));
                        out.collect(record)?;
                        emitted += 1;
                        if due {
                            let at = Ends { topic: topic_c, positions, fetched, ends, bounded: config.bounded };
                            emit_watermark(clock, consumer, &at, out)?;
                        }
                        None
                    }
                    Err(FormatError::Bad(reason)) => Some((false, reason)),
                    Err(FormatError::Unavailable(reason)) => {
                        // Not the record's fault: fail (it is read again after recovery).
                        failure = Some(Problem::unavailable(format!(
                            "cannot decode the record at partition {partition} offset {offset}: {reason}"
                        )));
                        break;
                    }
                }
            };
            if let Some((oversized, reason)) = bad {
                let counter = if oversized { &stats.oversized } else { &stats.malformed };
                counter.fetch_add(1, Ordering::Relaxed);
                let at =
                    BadRecord { topic: &config.topic, partition, offset, reason: &reason, key: message.key(), payload };
                match config.on_bad_record {
                    OnBadRecord::Skip => {
                        stats.skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    OnBadRecord::Fail => {
                        failure = Some(
                            format!(
                                "bad record at partition {partition} offset {offset}: {reason} (on_bad_record = fail)"
                            )
                            .into(),
                        );
                        break;
                    }
                    OnBadRecord::DeadLetter => {
                        let writer = dead_letter.as_mut().expect("validate requires a destination");
                        if let Err(e) = writer.write(&at) {
                            failure = Some(e);
                            break;
                        }
                        stats.dead_letters.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        stats.records.fetch_add(emitted as u64, Ordering::Relaxed);
        stats.bytes.fetch_add(bytes, Ordering::Relaxed);
        // The client delivered records after its last error: its errors are over.
        if delivered {
            errors.delivered();
        }
        if let Some(f) = failure {
            return Err(self.poison(f));
        }
        Ok((taken, emitted))
    }

    /// Emit up to a batch (see [`crate::operators::Source::poll`]).
    pub fn poll_records(&mut self, out: &mut dyn Collector<T>) -> Result<SourcePoll, Halt> {
        self.check()?;
        if self.owned == Some(false) {
            return Ok(SourcePoll::Idle(DORMANT_WAIT));
        }
        if !self.assigned
            && let Err(e) = self.assign()
        {
            return Err(self.poison(e));
        }
        if self.positions.is_empty() && !self.said_empty {
            // No partition of the topic is this subtask's (more subtasks than partitions):
            // it would never send a watermark, and every event-time window downstream would
            // wait for it. Partitions are assigned once, at the start: it holds none back.
            self.said_empty = true;
            tracing::info!(
                source = %self.name,
                topic = %self.config.topic,
                "source subtask {} reads no partition of {} (more subtasks than partitions): it holds no watermark back",
                self.name,
                self.config.topic
            );
            if self.clock.is_some() {
                out.signal(Signal::Watermark(u64::MAX))?;
            }
        }
        let (taken, emitted) = self.take(out)?;
        // The cluster refused us an ACL (a commit to the group, the topic): that will not mend
        // by retrying; say which ACL to grant.
        if let Some(code) = self.errors.refused() {
            let refusal = acl_refusal(code, &self.config.topic, &self.config.properties, "Read")
                .expect("only authorization failures are kept as refusals");
            return Err(self.poison(refusal));
        }
        if self.clock.as_ref().is_some_and(|(_, c)| c.due_by_time()) {
            self.emit_watermark_now(out)?;
        }
        self.publish(false);
        if self.clock.as_ref().is_some_and(|(_, c)| c.writers_ended()) {
            // A repartition topic whose writers all ended: so does this reader.
            self.emit_watermark_now(out)?;
            self.publish(true);
            return Ok(SourcePoll::Finished);
        }
        if self.config.bounded && self.bounded_done(taken == 0) {
            self.publish(true);
            return Ok(SourcePoll::Finished);
        }
        // Errors that go on while there is something to read: librdkafka would retry for ever.
        if taken == 0 {
            let behind = self.behind
                || (self.config.bounded
                    && self.positions.iter().any(|(p, pos)| self.ends.get(p).is_some_and(|end| pos < end)));
            if behind && let Some(why) = self.errors.stalled(self.config.error_timeout) {
                // Credentials or a certificate that stopped working mid-run: say so.
                if let Some(cause) = self.errors.connection.cause() {
                    let bootstrap = self.config.properties.get("bootstrap.servers").map_or("?", String::as_str);
                    let problem = cause.problem(bootstrap);
                    return Err(self.poison(problem));
                }
                return Err(self.poison(why));
            }
        }
        if taken > 0 { Ok(SourcePoll::Emitted(emitted)) } else { Ok(SourcePoll::Idle(self.config.idle_wait)) }
    }

    /// Bounded: every owned partition read up to its end (past transaction markers: a topic
    /// written with transactions ends with one, which is never handed out).
    /// librdkafka's positions are asked for only when a poll found nothing (`idle`).
    fn bounded_done(&mut self, idle: bool) -> bool {
        if self.positions.iter().all(|(p, pos)| self.ends.get(p).is_none_or(|end| pos >= end)) {
            return true;
        }
        let Some(consumer) = &self.consumer else { return false };
        if !idle {
            return false;
        }
        self.fetched = fetch_positions(consumer);
        self.positions.iter().all(|(p, pos)| {
            let pos = (*pos).max(self.fetched.get(p).copied().unwrap_or(-1));
            self.ends.get(p).is_none_or(|end| pos >= *end)
        })
    }

    /// Checkpoint n: the next offset of every owned partition, as JSON; dead letters so far
    /// are made durable first (a checkpoint never skips a bad record whose dead letter is not
    /// safe).
    pub fn snapshot_positions(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        self.check()?;
        if let Some(d) = &mut self.dead_letter
            && let Err(e) = d.flush(self.config.request_timeout)
        {
            return Err(self.poison(e));
        }
        self.snapshots.insert(checkpoint_id, self.positions.clone());
        let writers = self.clock.as_ref().map(|(_, c)| c.writers()).unwrap_or_default();
        let positions = Positions { topic: self.config.topic.clone(), partitions: self.positions.clone(), writers };
        Ok(serde_json::to_vec(&positions).expect("positions serialize"))
    }

    /// Before the first poll: start from the offsets of a checkpoint (partitions of this
    /// subtask found there), the configured start for the others.
    pub fn restore_positions(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        self.check()?;
        let Some((id, bytes)) = from else { return Ok(()) };
        let positions = self.positions_of(id, bytes)?;
        self.restored = Some(positions.partitions);
        self.restored_writers = positions.writers;
        Ok(())
    }

    /// Before the first poll, restoring a checkpoint taken at another parallelism: the
    /// positions of every old subtask, of which the partitions this subtask owns now are
    /// taken at assignment (partition `p` goes to subtask `p % parallelism`, then and now).
    pub fn restore_positions_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        self.check()?;
        let mut all = BTreeMap::new();
        let mut writers = BTreeMap::new();
        for (_, bytes) in &from.parts {
            let positions = self.positions_of(from.checkpoint_id, bytes)?;
            all.extend(positions.partitions);
            writers.extend(positions.writers);
        }
        self.restored = Some(all);
        self.restored_writers = writers;
        Ok(())
    }

    /// One subtask's positions in checkpoint `id`, checked to be of this source's topic.
    fn positions_of(&mut self, id: u64, bytes: &[u8]) -> Result<Positions, Halt> {
        let positions: Positions = match serde_json::from_slice(bytes) {
            Ok(p) => p,
            Err(e) => return Err(self.poison(format!("checkpoint {id}: unreadable source positions: {e}"))),
        };
        if positions.topic != self.config.topic {
            return Err(self.poison(format!(
                "checkpoint {id} holds positions of topic {}, not of this source's topic",
                positions.topic
            )));
        }
        Ok(positions)
    }

    /// Checkpoint n is durable: commit its offsets to the group, asynchronously (for lag
    /// monitoring; the checkpoint is the truth).
    pub fn commit_positions(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        self.check()?;
        let mut newest = None;
        while let Some(entry) = self.snapshots.first_entry() {
            if *entry.key() > checkpoint_id {
                break;
            }
            newest = Some(entry.remove());
        }
        let (Some(positions), Some(consumer)) = (newest, &self.consumer) else { return Ok(()) };
        if !self.config.properties.contains_key("group.id") || positions.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in positions {
            let _ = tpl.add_partition_offset(&self.config.topic, p, Offset::Offset(o));
        }
        // The end of input (or a clean stop): the client closes next, so the last commit is
        // made before it, not left in flight — and read back, and made again if the group
        // does not show it, a few times: nothing later would correct it (a busy group
        // coordinator can refuse a commit, and an earlier asynchronous one still in flight
        // can land after it).
        if checkpoint_id != crate::checkpoint::FINAL {
            match consumer.commit(&tpl, CommitMode::Async) {
                Ok(()) => self.config.stats.commits.fetch_add(1, Ordering::Relaxed),
                // Lag monitoring only: a failed commit does not fail the job (the next
                // checkpoint's commit follows).
                Err(_) => self.config.stats.client_errors.fetch_add(1, Ordering::Relaxed),
            };
            return Ok(());
        }
        let mut problem = String::new();
        for attempt in 1..=FINAL_COMMIT_TRIES {
            if attempt > 1 {
                weir_ring::fiber::sleep(FINAL_COMMIT_BACKOFF * attempt);
            }
            if outside::stop_requested() {
                return Err(Halt::Stopped);
            }
            let group = self.config.properties.get("group.id").cloned().unwrap_or_default();
            let sent = Commit::send(consumer.client().native_ptr(), &tpl);
            let outcome = match sent {
                Err(code) => Err(code),
                Ok(mut commit) => {
                    let what = || format!("kafka group coordinator for group {group}: the final offset commit");
                    match outside::wait_for(what, Instant::now() + FINAL_COMMIT_TIMEOUT, |limit| {
                        Ok::<_, Halt>(commit.poll(limit))
                    }) {
                        Ok(result) => result,
                        Err(outside::Waited::Stopped) => return Err(Halt::Stopped),
                        Err(outside::Waited::Expired { waited, .. }) => {
                            problem = format!(
                                "the group coordinator did not answer within {}",
                                crate::util::duration_text(waited)
                            );
                            continue;
                        }
                        Err(outside::Waited::Failed(h)) => return Err(h),
                    }
                }
            };
            if let Err(code) = outcome {
                let code = RDKafkaErrorCode::from(code);
                self.config.stats.client_errors.fetch_add(1, Ordering::Relaxed);
                if let Some(refusal) = acl_refusal(code, &self.config.topic, &self.config.properties, "Read") {
                    return Err(self.poison(refusal));
                }
                problem = format!("the commit failed: {code}");
                continue;
            }
            self.config.stats.commits.fetch_add(1, Ordering::Relaxed);
            match consumer.committed_offsets(tpl.clone(), FINAL_COMMIT_READ_TIMEOUT) {
                Ok(seen) if seen.elements().iter().zip(tpl.elements()).all(|(a, b)| a.offset() == b.offset()) => {
                    return Ok(());
                }
                Ok(seen) => problem = format!("the group shows {:?} after the commit", seen.to_topic_map()),
                Err(e) => problem = format!("reading the committed offsets back failed: {e}"),
            }
        }
        // Lag monitoring only: the job does not fail for it.
        tracing::warn!(
            target: "weir::kafka",
            topic = %self.config.topic,
            "the final offset commit to the consumer group did not hold after {FINAL_COMMIT_TRIES} tries \
             ({problem}): group tools show older offsets (the checkpoint holds the position)"
        );
        Ok(())
    }

    /// After an idle poll: wait in io_uring for a Kafka event, `word` to differ from
    /// `expected` (the mailbox), or `timeout`. Returns whether it waited (false: the runtime
    /// parks instead).
    pub fn wait_on(&mut self, word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
        if self.poisoned.is_poisoned() {
            return false;
        }
        let (Some(event), Some(waiter)) = (&mut self.event, &mut self.waiter) else { return false };
        event.drain();
        if event.queue_len() > 0 {
            return true;
        }
        let stats = &self.config.stats;
        stats.waits.fetch_add(1, Ordering::Relaxed);
        if weir_ring::fiber::in_fiber() {
            // A fiber must not block its thread on the queue's fd: it parks on the mailbox
            // in slices (the other fibers run meanwhile) and looks at the queue after each.
            weir_ring::wait_any(&[weir_ring::ParkToken::new(word, expected)], timeout.min(FIBER_QUEUE_SLICE));
            self.publish(false);
            return true;
        }
        match waiter.wait(event.fd(), word, expected, timeout) {
            Ok(woken) => {
                if woken == super::native::Woken::Kafka {
                    stats.kafka_wakeups.fetch_add(1, Ordering::Relaxed);
                }
                self.publish(false);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether io_uring refused futex waits here (the source then waits in short slices).
    pub fn futex_fallback(&self) -> bool {
        self.waiter.as_ref().is_some_and(Waiter::futex_unsupported)
    }
}

/// Where a subtask's partitions stand against their ends, for telling which are caught up.
struct Ends<'a> {
    topic: &'a CString,
    /// The next offset to read, per partition.
    positions: &'a BTreeMap<i32, i64>,
    /// librdkafka's positions (past transaction markers), as of the last refresh.
    fetched: &'a BTreeMap<i32, i64>,
    /// Bounded: each partition's end.
    ends: &'a BTreeMap<i32, i64>,
    bounded: bool,
}

/// Send the watermark of the partitions' clock downstream, if it advanced. A partition is
/// caught up when its position reached its end (bounded) or the high watermark of the last
/// fetch.
fn emit_watermark<T>(
    clock: &mut Option<(TimestampFn<T>, PartitionWatermarks)>,
    consumer: &BaseConsumer<ErrorWatch>,
    at: &Ends<'_>,
    out: &mut dyn Collector<T>,
) -> Result<(), Halt> {
    let Some((_, clock)) = clock else { return Ok(()) };
    let client = consumer.client().native_ptr();
    let caught_up = |p: i32| {
        let Some(&position) = at.positions.get(&p) else { return false };
        // librdkafka's own positions move past transaction markers (control records), which
        // take offsets but are never handed out: on a topic written with transactions, the
        // offset after the last record read stays one below the end.
        let position = position.max(at.fetched.get(&p).copied().unwrap_or(-1));
        let end = if at.bounded {
            at.ends.get(&p).copied()
        } else {
            cached_watermarks(client, at.topic, p).map(|(_, high)| high)
        };
        end.is_some_and(|end| position >= end)
    };
    let w = clock.current(caught_up, Instant::now());
    match clock.advance(w) {
        Some(w) => out.signal(Signal::Watermark(w)),
        None => Ok(()),
    }
}

/// librdkafka's position of each assigned partition (past control records), where known.
fn fetch_positions(consumer: &BaseConsumer<ErrorWatch>) -> BTreeMap<i32, i64> {
    consumer.position().map(|tpl| offsets_of(&tpl)).unwrap_or_default()
}

/// The numeric offsets of a partition list, by partition (logical ones left out).
fn offsets_of(tpl: &TopicPartitionList) -> BTreeMap<i32, i64> {
    tpl.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Where a bad record was, and why.
struct BadRecord<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
    reason: &'a str,
    key: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
}

/// An open dead-letter destination.
enum DeadLetterWriter {
    File { path: std::path::PathBuf, file: Option<std::fs::File> },
    Topic { topic: String, producer: BaseProducer<Deliveries>, deliveries: Deliveries },
}

impl DeadLetterWriter {
    fn write(&mut self, bad: &BadRecord<'_>) -> Result<(), Problem> {
        match self {
            DeadLetterWriter::File { path, file } => {
                let payload = bad.payload.unwrap_or_default();
                let line = serde_json::json!({
                    "topic": bad.topic,
                    "partition": bad.partition,
                    "offset": bad.offset,
                    "reason": bad.reason,
                    "key": bad.key.map(|k| String::from_utf8_lossy(k).into_owned()),
                    "payload_bytes": payload.len(),
                    "payload": String::from_utf8_lossy(&payload[..payload.len().min(QUOTE_BYTES)]),
                });
                let written = (|| -> std::io::Result<()> {
                    if file.is_none() {
                        *file = Some(std::fs::OpenOptions::new().create(true).append(true).open(&*path)?);
                    }
                    let mut bytes = serde_json::to_vec(&line).expect("JSON values serialize");
                    bytes.push(b'\n');
                    // One write per line: lines of concurrent subtasks do not interleave (O_APPEND).
                    file.as_mut().expect("opened above").write_all(&bytes)
                })();
                written.map_err(|e| Problem::from(format!("cannot write the dead-letter file {}: {e}", path.display())))
            }
            DeadLetterWriter::Topic { topic, producer, deliveries } => {
                deliveries.check()?;
                let headers = OwnedHeaders::new()
                    .insert(Header { key: "weir.topic", value: Some(bad.topic) })
                    .insert(Header { key: "weir.partition", value: Some(&bad.partition.to_string()) })
                    .insert(Header { key: "weir.offset", value: Some(&bad.offset.to_string()) })
                    .insert(Header { key: "weir.reason", value: Some(bad.reason) });
                let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic.as_str()).headers(headers);
                if let Some(k) = bad.key {
                    record = record.key(k);
                }
                if let Some(p) = bad.payload {
                    record = record.payload(p);
                }
                let mut record = record;
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                            record = r;
                            producer.poll(Duration::from_millis(10));
                            deliveries.check()?;
                        }
                        Err((e, _)) => {
                            return Err(Problem::from(format!("dead-letter topic {topic}: {}", kafka_error_text(&e))));
                        }
                    }
                }
                producer.poll(Duration::ZERO);
                Ok(())
            }
        }
    }

    /// Make every dead letter so far durable (fsync, or delivered).
    fn flush(&mut self, timeout: Duration) -> Result<(), Problem> {
        match self {
            DeadLetterWriter::File { path, file } => match file {
                Some(f) => f
                    .sync_all()
                    .map_err(|e| Problem::from(format!("fsync of the dead-letter file {}: {e}", path.display()))),
                None => Ok(()),
            },
            DeadLetterWriter::Topic { topic, producer, deliveries } => {
                producer
                    .flush(timeout)
                    .map_err(|e| format!("dead-letter topic {topic}: flush: {}", kafka_error_text(&e)))?;
                deliveries.check()
            }
        }
    }
}

impl<T: Record, D: Decode<T>> crate::operators::Source<T> for KafkaSource<T, D> {
    fn poll(&mut self, out: &mut dyn Collector<T>) -> Result<SourcePoll, Halt> {
        self.poll_records(out)
    }

    /// With per-partition watermarks: the newest event time read (latency markers).
    fn event_time(&self) -> Option<u64> {
        self.clock.as_ref().and_then(|(_, c)| c.newest())
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        self.snapshot_positions(checkpoint_id)
    }

    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        self.restore_positions(from)
    }

    fn restore_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        self.restore_positions_rescaled(from)
    }

    fn checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        self.commit_positions(checkpoint_id)
    }

    fn wait(&mut self, wake: &crate::operators::Wake<'_>, timeout: Duration) -> bool {
        self.wait_on(wake.word(), wake.expected(), timeout)
    }
}

/// The consumer's context: what librdkafka reports (its error callback, and errors polled
/// from the queue) since the client last delivered a record. librdkafka retries a failing
/// fetch for ever (a record over `receive.message.max.bytes`, a codec this build lacks), so
/// the source fails the job once errors have lasted `error_timeout` while it is behind.
#[derive(Debug, Clone, Default)]
pub(crate) struct ErrorWatch {
    inner: std::sync::Arc<std::sync::Mutex<Errors>>,
    /// The callback's errors as causes (TLS, SASL), for reaching the cluster at assignment.
    connection: reach::Connection,
    /// Errors without a record since, as an outage: logged while it lasts and when it ends.
    outage: crate::telemetry::waiting::Outage,
    /// A broker connection that failed (librdkafka's log), as an outage that ends when the
    /// broker's address accepts a connection again — not at the next record: records keep
    /// coming from librdkafka's prefetched queue long after a broker died.
    broker: crate::telemetry::waiting::Outage,
}

#[derive(Debug, Default)]
struct Errors {
    /// An authorization the cluster refused (a group or topic ACL missing): it will not mend
    /// by retrying, and fails the source at its next poll.
    refused: Option<RDKafkaErrorCode>,
    /// The first error since the last record, and when.
    since: Option<Instant>,
    /// When the last one came.
    last_at: Option<Instant>,
    last: String,
    count: u64,
}

impl ErrorWatch {
    fn report(&self, text: &str) {
        let text = &self.connection.redact(text);
        let mut e = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if e.since.is_none() {
            e.since = Some(Instant::now());
            tracing::warn!("kafka client error (librdkafka retries): {text}");
        }
        e.count += 1;
        e.last = text.to_owned();
        e.last_at = Some(Instant::now());
        self.outage.down(format!("kafka source: {} client errors without a record, last: {text}", e.count));
    }

    fn delivered(&self) {
        self.connection.clear();
        let mut e = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if e.since.is_some() {
            let refused = e.refused;
            *e = Errors { refused, ..Errors::default() };
        }
        drop(e);
        self.outage.up();
    }

    /// Keep `code` if it is an authorization the cluster refused.
    fn note_refusal(&self, code: RDKafkaErrorCode) {
        if is_authorization(code) {
            self.inner.lock().unwrap_or_else(|e| e.into_inner()).refused.get_or_insert(code);
        }
    }

    /// An authorization the cluster refused, if any.
    fn refused(&self) -> Option<RDKafkaErrorCode> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).refused
    }

    /// Errors for longer than `limit` without a record: what to fail with.
    fn stalled(&self, limit: Duration) -> Option<String> {
        let e = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let since = e.since?;
        // Still failing: the errors go on (the last within 10 s), not one long ago.
        let recent = e.last_at.is_some_and(|t| t.elapsed() < Duration::from_secs(10));
        if since.elapsed() < limit || !recent {
            return None;
        }
        let too_large = ["response size", "receive.message.max.bytes", "BadMessage", "MessageSizeTooLarge"];
        let hint = if too_large.iter().any(|t| e.last.contains(t)) {
            "; a record is probably larger than the fetch limits (a truncated fetch reads as a bad message): \
             raise receive.message.max.bytes and fetch.max.bytes (properties) above the topic's max.message.bytes"
        } else if e.last.to_ascii_lowercase().contains("compression") || e.last.contains("codec") {
            "; the topic may be compressed with a codec this build of librdkafka lacks"
        } else {
            ""
        };
        Some(format!(
            "the Kafka client has reported {} errors over {} without delivering a record, last: {}{hint}",
            e.count,
            crate::util::duration_text(since.elapsed()),
            e.last
        ))
    }
}

impl rdkafka::ClientContext for ErrorWatch {
    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(code) = error.rdkafka_error_code() {
            self.note_refusal(code);
        }
        self.connection.record(&error, reason);
        self.report(&format!("{}: {reason}", kafka_error_text(&error)));
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        self.connection.record_log(facility, message);
        // From librdkafka's own thread: seen while the source is backpressured and polls
        // nothing (the error callback waits for a poll).
        if let Some((broker, addr, text)) = super::failed_broker(facility, message) {
            let what = format!("kafka source: broker {broker} unreachable: {}", self.connection.redact(&text));
            match addr {
                Some(addr) => self.broker.down_at(what, addr),
                // A broker named by a host name (no lookup on librdkafka's thread): its outage
                // ends with the client's errors, at the next record.
                None => self.outage.down(what),
            }
        }
        tracing::debug!(target: "weir::kafka", "librdkafka {level:?} {facility}: {message}");
    }
}

impl rdkafka::consumer::ConsumerContext for ErrorWatch {
    /// The result of an asynchronous offset commit (a checkpoint's, for lag monitoring): a
    /// group the cluster refuses us fails the source (the next poll), naming the ACL.
    fn commit_callback(&self, result: rdkafka::error::KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let Err(e) = result {
            if let Some(code) = e.rdkafka_error_code() {
                self.note_refusal(code);
            }
            self.report(&format!("offset commit: {}", kafka_error_text(&e)));
        }
    }
}

/// Whether `code` says the cluster refused an authorization (an ACL is missing).
pub(crate) fn is_authorization(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
    )
}

/// `problem`, or, when its text names an authorization the cluster refused (librdkafka's
/// code name, as `kafka_error_text` writes it), the refusal that names the ACL to grant, with
/// the original text after it.
pub(crate) fn refusal_of(
    problem: Problem,
    topic: &str,
    properties: &std::collections::BTreeMap<String, String>,
    on_topic: &str,
) -> Problem {
    if problem.kind != super::KafkaErrorKind::Failed {
        return problem;
    }
    let codes = [
        RDKafkaErrorCode::GroupAuthorizationFailed,
        RDKafkaErrorCode::TopicAuthorizationFailed,
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
        RDKafkaErrorCode::ClusterAuthorizationFailed,
    ];
    match codes.into_iter().find(|c| problem.reason.contains(&format!("({c:?})"))) {
        Some(code) => {
            let refusal = acl_refusal(code, topic, properties, on_topic).expect("an authorization code");
            Problem { kind: refusal.kind, reason: format!("{} ({})", refusal.reason, problem.reason) }
        }
        None => problem,
    }
}

/// The key under which [`acl_refusal`] finds a sink's transactional-id prefix (never a
/// librdkafka property: only in the copy of the properties the sink hands it).
pub(crate) const TRANSACTIONAL_ID_PREFIX: &str = "weir:transactional.id.prefix";

/// The problem a refused authorization is: [`KafkaErrorKind::Refused`](super::KafkaErrorKind)
/// (`weir run` exits 69), naming the ACL to grant and how. `None` if `code` is not one.
pub(crate) fn acl_refusal(
    code: RDKafkaErrorCode,
    topic: &str,
    properties: &std::collections::BTreeMap<String, String>,
    on_topic: &str,
) -> Option<Problem> {
    let principal = properties.get("sasl.username").map_or("<the job's principal>".to_owned(), |u| format!("User:{u}"));
    // What to grant, on what, and the kafka-acls.sh flag that names it.
    let grant = |operation: &str, what: &str, flag: &str| {
        format!(
            "grant {principal} {operation} on {what} (kafka-acls.sh --bootstrap-server <broker> --add \
             --allow-principal {principal} --operation {operation} {flag})"
        )
    };
    let group = properties.get("group.id").map_or("<group.id>", String::as_str);
    let reason = match code {
        RDKafkaErrorCode::GroupAuthorizationFailed => format!(
            "the cluster refused the consumer group {group} (GROUP_AUTHORIZATION_FAILED): {}; or remove group.id \
             (the group only shows lag: the checkpoint holds the positions)",
            grant("Read", &format!("group {group}"), &format!("--group {group}"))
        ),
        RDKafkaErrorCode::TopicAuthorizationFailed => format!(
            "the cluster refused the topic {topic} (TOPIC_AUTHORIZATION_FAILED): {}",
            grant(on_topic, &format!("topic {topic}"), &format!("--topic {topic}"))
        ),
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed => {
            // A sink's ids share its prefix (`<prefix>-<subtask>-<producer>`): one prefixed ACL.
            let (what, flag) = match properties.get(TRANSACTIONAL_ID_PREFIX) {
                Some(p) => (
                    format!("the transactional ids starting with {p}"),
                    format!("--transactional-id {p} --resource-pattern-type prefixed"),
                ),
                None => {
                    let id = properties.get("transactional.id").map_or("<transactional.id>", String::as_str);
                    (format!("transactional id {id}"), format!("--transactional-id {id}"))
                }
            };
            format!(
                "the cluster refused {what} (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): {}",
                grant("Write", &what, &flag)
            )
        }
        RDKafkaErrorCode::ClusterAuthorizationFailed => format!(
            "the cluster refused a cluster-wide operation (CLUSTER_AUTHORIZATION_FAILED): {}",
            grant("IdempotentWrite", "the cluster", "--cluster")
        ),
        _ => return None,
    };
    Some(Problem { kind: super::KafkaErrorKind::Refused, reason })
}
