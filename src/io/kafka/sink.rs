//! The Kafka sink: an idempotent `BaseProducer` with a bounded queue; exactly-once through
//! Kafka transactions committed when a checkpoint completes.
//!
//! # Backpressure
//!
//! librdkafka queues records until their delivery report (in-flight requests included), up to
//! `queue.buffering.max.kbytes` / `queue.buffering.max.messages`
//! ([`KafkaSinkConfig::queue_budget_bytes`]). When the queue is full, `send` says so, and
//! `write` *blocks*, serving delivery reports, until there is room: the sink subtask stops
//! reading its ring and backpressure starts there. While it blocks it sleeps in an io_uring on
//! the eventfd librdkafka writes when a delivery report reaches the producer's main queue (the
//! protocol of `native.rs`), so it neither spins nor sleeps blindly. No sink-side queue grows. A failed delivery
//! (after librdkafka's own retries, which idempotence keeps free of duplicates and reordering)
//! fails the job with the cause.
//!
//! # Exactly-once
//!
//! ```text
//!  records ──► producer k: transaction open ── barrier n: snapshot(n) = flush, k is *prepared* for n
//!  records after barrier n ──► producer k' (another of the pool): a new transaction
//!  checkpoint_complete(n) ──► commit every transaction prepared for n or before
//! ```
//!
//! A producer has one transaction at a time, and the transaction prepared for checkpoint n
//! must stay open until the coordinator says n is durable, while records after barrier n keep
//! coming. So each subtask has a small pool of transactional producers,
//! `transactional.id = <prefix>-<subtask>-<k>`, used in turn: the records after barrier n go
//! to a producer with no transaction pending. Two suffice while each commit reaches the sink
//! before the next barrier; the default of three covers a commit that arrives just after it.
//! A barrier that finds every producer prepared fails the job (raise `transactional_producers`).
//!
//! `transaction.timeout.ms` must be at least the checkpoint timeout (the sink refuses to start
//! otherwise): the broker aborts a transaction older than that, and a checkpoint that then
//! completes would have lost its records.
//!
//! ## The window between "checkpoint durable" and "transaction committed"
//!
//! Between the coordinator writing manifest n and this sink calling `commit_transaction` for
//! the producer prepared for n, a crash leaves transaction n *prepared but not committed*.
//! Flink's Kafka sink resumes such a transaction from the new process (it reflects into the Java
//! client to reuse the producer id and epoch). librdkafka cannot: a new producer with the same
//! `transactional.id` calls `init_transactions`, which fences the old producer and **aborts**
//! its open transaction. Its records are gone from Kafka, and the sources, restored at
//! checkpoint n, will not read them again.
//!
//! So the sink keeps them itself, and tells afterwards whether a transaction was committed:
//!
//! - **A log per transaction.** Every record of a transaction is also appended to a local
//!   transaction log ([`txnlog`](super::txnlog), in `transaction_log_dir`), which is fsynced and
//!   renamed when the transaction is prepared, named with its length and CRC-32 in the
//!   checkpoint, and removed after the commit.
//! - **A commit marker in the transaction.** Each transaction gets a sequence number (the
//!   subtask's commits are numbered in the order they happen, oldest checkpoint first), and
//!   commits it with its records: `send_offsets_to_transaction` stores it as the committed
//!   "offset" of partition 0 of the topic for the consumer group
//!   `weir-txn-<prefix>-<subtask>`, which nothing consumes. Kafka makes that offset visible if
//!   and only if the transaction commits, so the group's committed offset is the sequence
//!   number of the subtask's last committed transaction. (Reading the records back instead
//!   would wait behind the open transactions of the sibling subtasks, which wait for this
//!   one's restore: a deadlock until the timeout.)
//!
//! What recovery does (`restore`):
//!
//! 1. `init_transactions` on every producer of the pool: zombies are fenced, what was open is
//!    aborted (or, if its commit had reached the broker, completed).
//! 2. Read the marker. Each transaction the checkpoint recorded as prepared with a sequence
//!    number at or below it was committed before the crash. One above it was aborted: the sink
//!    writes its log again in a new transaction with the same sequence number, so that a crash
//!    during the re-write is detected the same way next time and the log is never written
//!    twice.
//! 3. Logs of transactions after the checkpoint are removed (the sources read those records
//!    again), and numbering goes on above both the checkpoint's and the marker's.
//!
//! The cost: exactly-once writes each record once more, sequentially, to local disk, fsyncs
//! that file at each checkpoint, and adds the offset commit to each transaction. A log that
//! does not match the checkpoint (length, CRC, records) fails the restore and names the file;
//! it is never written half.
//!
//! `finish` (end of input) flushes and commits what is open and prepared, as the file sink does.

use super::config::{Delivery, KafkaSinkConfig};
use super::decode::{Encode, FormatError};
use super::error::{KafkaConnectorError, KafkaRole, Problem};
use super::native::{QueueEvent, Waiter};
use super::reach;
use super::txnlog::{self, LogRef, TxnLog};
use super::{Deliveries, kafka_error_text};
use crate::io::poison::Poisoned;
use crate::operators::{Halt, Sink, SubtaskInfo, outside};
use crate::telemetry::time::Wait;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// As a fiber (`JobConfig::fibers`), how often a sink waiting on librdkafka serves its
/// delivery reports, instead of blocking its thread on them.
const FIBER_SLICE: Duration = Duration::from_millis(1);

/// A record's Kafka key, appended to the buffer given.
pub type KeyFn<T> = Arc<dyn Fn(&T, &mut Vec<u8>) + Send + Sync>;

/// Totals of a Kafka sink's subtasks, readable while the job runs.
#[derive(Debug, Default)]
pub struct KafkaSinkStats {
    /// Records taken by `write`.
    pub records: AtomicU64,
    /// Records whose delivery the broker confirmed.
    pub delivered: AtomicU64,
    /// Time `write` waited because the producer queue was full (counted while it lasts).
    pub blocked: crate::telemetry::time::Stopwatch,
    /// Transactions committed.
    pub commits: AtomicU64,
    /// Exactly-once: the newest checkpoint for which a subtask prepared a transaction that
    /// holds records (0: none yet).
    pub last_prepared: AtomicU64,
    /// Times a subtask slept in its io_uring for delivery reports (its producer queue full).
    pub waits: AtomicU64,
    /// Exactly-once recovery: transactions found aborted and written again from their log.
    pub replayed_transactions: AtomicU64,
    /// Records written again from transaction logs.
    pub replayed_records: AtomicU64,
    /// Delivery latency: a record's create time (at `send`) to its delivery report, ms
    /// resolution (Kafka timestamps are ms). On a topic with `LogAppendTime` the report
    /// carries the broker's time instead, and this compares clocks.
    pub ack_latency: Arc<crate::telemetry::sinks::AckLatency>,
}

/// Where one producer of the pool stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxnState {
    /// No transaction.
    Idle,
    /// A transaction is open and takes records.
    Open,
    /// Flushed for this checkpoint, waiting for its completion to commit: (checkpoint, commit
    /// sequence number, where its last record landed if it had any).
    Prepared(u64, u64, Option<(i32, i64)>),
}

struct Slot {
    /// Readiness of the producer's main queue (delivery reports), and the io_uring the subtask
    /// waits in while the queue is full. Declared before `producer`: dropped first.
    event: Option<(QueueEvent, Option<Waiter>)>,
    producer: BaseProducer<Deliveries>,
    deliveries: Deliveries,
    /// Records delivered, as last added to the stats.
    counted: u64,
    transactional_id: Option<String>,
    state: TxnState,
    /// Exactly-once: the log of the open transaction, or of the prepared one.
    log: Option<TxnLog>,
    prepared_log: Option<LogRef>,
}

/// A prepared transaction, as recorded in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Prepared {
    checkpoint: u64,
    /// Its commit sequence number (the marker it commits), from 1; 0: a checkpoint written
    /// before transactions were numbered.
    #[serde(default)]
    seq: u64,
    transactional_id: String,
    /// Where its last record landed: (partition, offset). `None`: it had no records.
    last: Option<(i32, i64)>,
    /// Its records' log, to write them again if the crash left it uncommitted.
    #[serde(default)]
    log: Option<LogRef>,
}

/// What a sink snapshot holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct SinkSnapshot {
    topic: String,
    prepared: Vec<Prepared>,
    /// The next commit sequence number.
    #[serde(default)]
    next_seq: u64,
}

/// Writes records to one Kafka topic. See the module docs.
pub struct KafkaSink<T, E> {
    config: KafkaSinkConfig,
    name: String,
    index: u32,
    encoder: E,
    key: Option<KeyFn<T>>,
    slots: Vec<Slot>,
    current: usize,
    payload: Vec<u8>,
    key_buf: Vec<u8>,
    started: bool,
    /// One instance of several, and this subtask's partition is another's: it opens no
    /// producer (exactly-once, `init_transactions` would fence the owner's) and takes no
    /// record.
    dormant: bool,
    /// Exactly-once: the group the commit markers go to, and the next sequence number.
    marker: Option<(BaseConsumer, ConsumerGroupMetadata)>,
    next_seq: u64,
    /// Records delivered before the first write (a restore's replay of transaction logs):
    /// not the job's writes, for [`Sink::acknowledged`].
    delivered_before: u64,
    /// When `poll_timers` next serves delivery reports (coarse monotonic ns).
    next_poll_ns: u64,
    poisoned: Poisoned,
    /// Writing a repartition topic ([`super::repartition`]).
    repartition: Option<Repartition<T>>,
    _record: PhantomData<fn(&T)>,
}

/// A repartition topic's writer: where each record goes, and the watermarks it marked.
struct Repartition<T> {
    key_hash: crate::record::KeyFn<T>,
    partitions: u32,
    max_key_groups: u32,
    /// Subtasks writing the topic (this node's parallelism).
    writers: u32,
    /// The last watermark marked in every partition (0: none yet).
    marked: u64,
    /// The topic was checked (or created).
    ensured: bool,
}

impl<T, E> std::fmt::Debug for KafkaSink<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink").field("name", &self.name).field("topic", &self.config.topic).finish()
    }
}

impl<T, E: Encode<T>> KafkaSink<T, E> {
    /// Records this subtask's producers have had delivery reports for.
    fn delivered(&self) -> u64 {
        self.slots.iter().map(|s| s.deliveries.delivered()).sum()
    }

    /// A Kafka sink for one subtask. Never fails: a setup error poisons the sink and its first
    /// call fails the job with it. Producers are created at the first call (after `restore`).
    pub fn new(mut config: KafkaSinkConfig, info: &SubtaskInfo, encoder: E) -> KafkaSink<T, E> {
        let name = info.name();
        if config.transactional_id_prefix.is_empty() {
            config.transactional_id_prefix = format!("weir-{}-{}", info.job, info.node);
        }
        let mut poisoned = Poisoned::default();
        if let Err(e) = config.validate() {
            poisoned.poison(KafkaConnectorError::new(KafkaRole::Sink, &name, &config.topic, e));
        }
        KafkaSink {
            name,
            index: info.index,
            encoder,
            key: None,
            slots: Vec::new(),
            current: 0,
            payload: Vec::new(),
            key_buf: Vec::new(),
            started: false,
            dormant: info.owned == Some(false),
            marker: None,
            next_seq: 1,
            delivered_before: 0,
            next_poll_ns: 0,
            poisoned,
            config,
            repartition: None,
            _record: PhantomData,
        }
    }

    /// Write a repartition topic of `partitions` ([`super::repartition`]): each record to
    /// the partition of its key's key group (`key_hash` is the key_by's), keyed by that
    /// partition's number; and at each advance of the watermark, a marker of it to every
    /// partition. The topic is created at the first write if it does not exist.
    pub fn with_repartition(mut self, key_hash: crate::record::KeyFn<T>, partitions: u32, info: &SubtaskInfo) -> Self {
        self.repartition = Some(Repartition {
            key_hash,
            partitions: partitions.max(1),
            max_key_groups: info.max_key_groups,
            writers: info.parallelism,
            marked: 0,
            ensured: false,
        });
        self
    }

    /// Key each record with `key` (Kafka's partitioner then places records by key).
    pub fn with_key(mut self, key: impl Fn(&T, &mut Vec<u8>) + Send + Sync + 'static) -> KafkaSink<T, E> {
        self.key = Some(Arc::new(key));
        self
    }

    /// The setup error that poisoned this sink, if any.
    pub fn setup_error(&self) -> Option<&str> {
        self.poisoned.text()
    }

    /// The producers' queue bound (see [`KafkaSinkConfig::queue_budget_bytes`]).
    pub fn queue_budget_bytes(&self) -> u64 {
        self.config.queue_budget_bytes()
    }

    fn check(&self) -> Result<(), Halt> {
        self.poisoned.check()
    }

    fn poison(&mut self, problem: impl Into<Problem>) -> Halt {
        let mut properties = self.config.properties.clone();
        properties.insert(super::source::TRANSACTIONAL_ID_PREFIX.into(), self.config.transactional_id_prefix.clone());
        let problem = super::source::refusal_of(problem.into(), &self.config.topic, &properties, "Write");
        let e = KafkaConnectorError::new(KafkaRole::Sink, &self.name, &self.config.topic, problem);
        self.poisoned.poison(e)
    }

    /// Create the producers (and, exactly-once, fence older instances: `init_transactions`).
    fn start(&mut self) -> Result<(), Halt> {
        self.check()?;
        if self.started {
            return Ok(());
        }
        self.started = true;
        if let Some(r) = &mut self.repartition
            && !r.ensured
        {
            let timeout = Duration::from_secs(30).min(self.config.flush_timeout);
            let (topic, partitions) = (self.config.topic.clone(), r.partitions);
            r.ensured = true;
            if let Err(e) = super::repartition::ensure_topic(&self.config.properties, &topic, partitions, timeout) {
                return Err(self.poison(e));
            }
        }
        for k in 0..self.config.producers() {
            let mut client = ClientConfig::new();
            for (name, value) in self.config.client_properties() {
                client.set(name, value);
            }
            super::hear_broker_failures(&mut client);
            let transactional_id = (self.config.delivery == Delivery::ExactlyOnce).then(|| self.transactional_id(k));
            if let Some(id) = &transactional_id {
                client.set("transactional.id", id);
            }
            let deliveries = Deliveries::with_latency(self.config.stats.ack_latency.clone());
            deliveries.connection().hide_secrets(&self.config.properties);
            let producer: BaseProducer<Deliveries> = match client.create_with_context(deliveries.clone()) {
                Ok(p) => p,
                Err(e) => return Err(self.poison(reach::bad_setting("cannot create a producer", &e))),
            };
            // Delivery reports come on the main queue; its eventfd lets a blocked `write` sleep
            // in io_uring until one arrives. Without it (no eventfd), `poll` waits instead.
            let event = QueueEvent::enable(producer.client().native_ptr(), false).ok().map(|e| (e, None));
            self.slots.push(Slot {
                event,
                producer,
                deliveries,
                counted: 0,
                transactional_id,
                state: TxnState::Idle,
                log: None,
                prepared_log: None,
            });
        }
        // Reach the cluster first, with a short timeout: an unreachable cluster is a clear
        // error in seconds, not a transactional init that waits for its whole timeout.
        // A refused connection (credentials, certificate, protocol) fails at once, naming it.
        let timeout = Duration::from_secs(10).min(self.config.flush_timeout);
        let slot = &self.slots[0];
        let serve = || slot.producer.poll(Duration::ZERO);
        let (connection, properties) = (slot.deliveries.connection(), &self.config.properties);
        if let Err(problem) =
            reach::reach(slot.producer.client(), &serve, &self.config.topic, timeout, connection, properties)
        {
            return Err(self.poison(problem));
        }
        if self.config.delivery == Delivery::ExactlyOnce {
            match self.marker_client() {
                Ok(m) => self.marker = Some(m),
                Err(e) => return Err(self.poison(e)),
            }
        }
        // Fence older instances, all producers at once: after a crash each init waits for the
        // broker to abort the transaction its predecessor left open.
        let timeout = self.config.flush_timeout;
        let failed = std::thread::scope(|scope| {
            let inits: Vec<_> = self
                .slots
                .iter()
                .filter_map(|slot| {
                    let id = slot.transactional_id.as_ref()?;
                    let producer = &slot.producer;
                    Some(scope.spawn(move || {
                        producer
                            .init_transactions(timeout)
                            .map_err(|e| format!("init_transactions for {id}: {}", kafka_error_text(&e)))
                    }))
                })
                .collect();
            inits.into_iter().find_map(|h| h.join().unwrap_or_else(|_| Err("init_transactions panicked".into())).err())
        });
        match failed {
            Some(e) => Err(self.poison(e)),
            None => Ok(()),
        }
    }

    /// Count new delivery reports; fail on the first failed one.
    fn settle(&mut self, k: usize) -> Result<(), Halt> {
        if let Err(e) = settle_slot(&mut self.slots[k], &self.config.stats) {
            return Err(self.poison(e));
        }
        Ok(())
    }

    /// Wait until every record of producer `k` is delivered, at most `flush_timeout`, in steps
    /// that honour a stop and name the wait while it lasts.
    fn flush(&mut self, k: usize) -> Result<(), Halt> {
        let deadline = Instant::now() + self.config.flush_timeout;
        match self.flush_until(k, deadline)? {
            None => Ok(()),
            Some(left) => {
                let message = format!(
                    "flush: {left} records not acknowledged by the broker after {} (flush_timeout){}",
                    crate::util::duration_text(self.config.flush_timeout),
                    self.last_error_text()
                );
                Err(self.poison(message))
            }
        }
    }

    /// Serve delivery reports of producer `k` until none is in flight (`None`) or `deadline`
    /// (`Some(records still in flight)`); a failed delivery fails the sink, a stop stops.
    fn flush_until(&mut self, k: usize, deadline: Instant) -> Result<Option<u64>, Halt> {
        let (name, topic) = (self.name.clone(), self.config.topic.clone());
        let result = outside::wait_for(
            || format!("kafka sink {name}: the broker's acknowledgement of records to {topic}"),
            deadline,
            |limit| {
                let producer = &self.slots[k].producer;
                if producer.in_flight_count() == 0 {
                    return Ok(Some(()));
                }
                if weir_ring::fiber::in_fiber() {
                    // A fiber must not block its thread in librdkafka: serve the reports every
                    // FIBER_SLICE, the fibers beside it running in between.
                    producer.poll(Duration::ZERO);
                    weir_ring::fiber::sleep(FIBER_SLICE.min(limit));
                } else {
                    // Serves delivery reports while it waits; returns early when all are in.
                    let _ = producer.flush(limit);
                }
                settle_slot(&mut self.slots[k], &self.config.stats).map(|()| None)
            },
        );
        match result {
            Ok(()) => self.settle(k).map(|()| None),
            Err(outside::Waited::Expired { .. }) => Ok(Some(self.slots[k].producer.in_flight_count().max(0) as u64)),
            Err(outside::Waited::Stopped) => Err(Halt::Stopped),
            Err(outside::Waited::Failed(e)) => Err(self.poison(e)),
        }
    }

    /// ", last client error: ..." when librdkafka reported one, else nothing.
    fn last_error_text(&self) -> String {
        let last = self.slots.iter().find_map(|s| s.deliveries.last_error());
        last.map_or(String::new(), |e| format!(", last client error: {e}"))
    }

    /// The consumer that names the commit-marker group (never subscribed, never polled for
    /// records) and reads the marker back on restore.
    fn marker_client(&self) -> Result<(BaseConsumer, ConsumerGroupMetadata), Problem> {
        let mut client = ClientConfig::new();
        for (name, value) in reach::connection_properties(&self.config.client_properties()) {
            client.set(name, value);
        }
        client
            .set("group.id", self.marker_group())
            .set("enable.auto.commit", "false")
            // OffsetFetch then asks for stable offsets (none pending in an open transaction).
            .set("isolation.level", "read_committed");
        let consumer: BaseConsumer = client
            .create()
            .map_err(|e| format!("cannot create the commit-marker client: {}", reach::client_error_text(&e)))?;
        let metadata = consumer.group_metadata().ok_or("the commit-marker client has no group metadata")?;
        Ok((consumer, metadata))
    }

    fn marker_group(&self) -> String {
        format!("weir-txn-{}-{}", self.config.transactional_id_prefix, self.index)
    }

    /// The sequence number of the subtask's last committed transaction (0: none).
    fn committed_seq(&self) -> Result<u64, Problem> {
        let (consumer, _) = self.marker.as_ref().ok_or("no commit-marker client")?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.config.topic, 0);
        let got = consumer.committed_offsets(tpl, self.config.flush_timeout).map_err(|e| {
            format!("cannot read the commit marker (group {}): {}", self.marker_group(), kafka_error_text(&e))
        })?;
        Ok(match got.elements().first().map(|e| e.offset()) {
            Some(Offset::Offset(o)) if o > 0 => o as u64,
            _ => 0,
        })
    }

    /// Put the commit marker `seq` into producer `k`'s open transaction.
    fn send_marker(&self, k: usize, seq: u64) -> Result<(), Problem> {
        let (_, metadata) = self.marker.as_ref().ok_or("no commit-marker client")?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.config.topic, 0, Offset::Offset(seq as i64))
            .map_err(|e| kafka_error_text(&e))?;
        let (name, producer) = (&self.name, &self.slots[k].producer);
        named(
            || format!("kafka sink {name}: the commit marker {seq} into its transaction (the broker)"),
            || producer.send_offsets_to_transaction(&tpl, metadata, self.config.flush_timeout),
        )
        .map_err(|e| {
            Problem::from(format!("send_offsets_to_transaction (commit marker {seq}): {}", kafka_error_text(&e)))
        })
    }

    fn commit(&mut self, k: usize) -> Result<(), Halt> {
        let mut seq = None;
        if self.slots[k].transactional_id.is_some() {
            let n = match self.slots[k].state {
                TxnState::Prepared(_, n, _) => n,
                _ => {
                    self.next_seq += 1;
                    self.next_seq - 1
                }
            };
            if let Err(e) = self.send_marker(k, n) {
                return Err(self.poison(e));
            }
            seq = Some(n);
        }
        let (name, timeout) = (&self.name, self.config.flush_timeout);
        let slot = &mut self.slots[k];
        let id = slot.transactional_id.as_deref().unwrap_or_default();
        let committed = named(
            || format!("kafka sink {name}: commit of transaction {id} (the broker)"),
            || slot.producer.commit_transaction(timeout),
        );
        if let Err(e) = committed {
            let id = slot.transactional_id.clone().unwrap_or_default();
            return Err(self.poison(format!("commit of transaction {id}: {}", kafka_error_text(&e))));
        }
        slot.state = TxnState::Idle;
        // Committed: its log is no longer needed (a leftover is removed at the next restore).
        if let (Some(dir), Some(log)) = (&self.config.transaction_log_dir, slot.prepared_log.take()) {
            let _ = std::fs::remove_file(dir.join(&log.file));
        }
        if let (Some(dir), Some(id), Some(_)) =
            (&self.config.transaction_log_dir, &slot.transactional_id, slot.log.take())
        {
            let _ = std::fs::remove_file(dir.join(format!("{}.open", txnlog::stem(id))));
        }
        self.config.stats.commits.fetch_add(1, Ordering::Relaxed);
        if let Some(seq) = seq
            && let Err(e) = self.record_committed(seq)
        {
            return Err(self.poison(e));
        }
        Ok(())
    }

    /// The file where the last committed sequence number is also kept.
    fn committed_file(&self) -> Option<std::path::PathBuf> {
        let dir = self.config.transaction_log_dir.as_ref()?;
        Some(dir.join(format!("{}.committed", txnlog::stem(&self.marker_group()))))
    }

    /// Keep `seq` as the last committed sequence number on local disk too (temp file, fsync,
    /// rename): restore takes the larger of this and the marker in Kafka.
    fn record_committed(&self, seq: u64) -> Result<(), Problem> {
        let Some(path) = self.committed_file() else { return Ok(()) };
        let tmp = path.with_extension("committed.tmp");
        std::fs::write(&tmp, seq.to_string())
            .and_then(|()| std::fs::File::open(&tmp).and_then(|f| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| {
                Problem::from(format!(
                    "cannot record commit {seq} in {}: {}",
                    path.display(),
                    crate::util::io_error_text(&e)
                ))
            })
    }

    /// The last committed sequence number on local disk (0: none).
    fn committed_locally(&self) -> u64 {
        self.committed_file()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Pre-commit for checkpoint n (in band, after every record before barrier n): everything
    /// written so far is delivered (at-least-once: that is all), or its transaction is flushed
    /// and left prepared (exactly-once); returns the prepared transactions for `restore`.
    pub fn prepare(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        self.start()?;
        if checkpoint_id == crate::checkpoint::FINAL {
            // The end of input: a repartition topic's readers learn this writer ended.
            self.mark_watermark(u64::MAX)?;
        }
        // The barrier waits for the broker's acknowledgements at most `prepare_timeout`: past
        // it the checkpoint is declined, naming the broker, and nothing is prepared (the
        // transaction stays open; the next checkpoint takes its records too).
        // The end of input waits (its transaction is committed at the end in any case).
        let deadline = Instant::now() + self.config.prepare_timeout;
        for k in 0..self.slots.len() {
            if checkpoint_id == crate::checkpoint::FINAL {
                self.flush(k)?;
                continue;
            }
            if let Some(left) = self.flush_until(k, deadline)? {
                let (name, topic, wait) = (&self.name, &self.config.topic, self.config.prepare_timeout);
                let error = self.last_error_text();
                let declined = outside::decline_checkpoint(checkpoint_id, || {
                    format!(
                        "kafka sink {name}: {left} records to {topic} not acknowledged by the broker within {} \
                         (prepare_timeout){error}: the transaction cannot be prepared; the next checkpoint takes its \
                         records",
                        crate::util::duration_text(wait)
                    )
                });
                if declined {
                    return Ok(self.snapshot_bytes());
                }
                // No coordinator to decline to: wait on, up to `flush_timeout`.
                self.flush(k)?;
            }
        }
        if self.config.delivery == Delivery::AtLeastOnce {
            return Ok(Vec::new());
        }
        let k = self.current;
        if self.slots[k].state == TxnState::Open {
            let last = self.slots[k].deliveries.take_last();
            if let Some(log) = self.slots[k].log.take() {
                match log.prepare(checkpoint_id) {
                    Ok(r) => self.slots[k].prepared_log = Some(r),
                    Err(e) => return Err(self.poison(e)),
                }
            }
            self.slots[k].state = TxnState::Prepared(checkpoint_id, self.next_seq, last);
            self.next_seq += 1;
            self.config.stats.last_prepared.fetch_max(checkpoint_id, Ordering::Relaxed);
            // Records after the barrier go to a producer with nothing pending (none come
            // after the end of input).
            match (0..self.slots.len()).find(|&j| self.slots[j].state == TxnState::Idle) {
                None if checkpoint_id == crate::checkpoint::FINAL => {}
                Some(j) => self.current = j,
                None => {
                    return Err(self.poison(format!(
                        "all {} transactional producers hold transactions prepared for checkpoints not yet \
                         complete; raise transactional_producers",
                        self.slots.len()
                    )));
                }
            }
        }
        Ok(self.snapshot_bytes())
    }

    /// What a checkpoint keeps: the transactions prepared and not yet committed, and the next
    /// sequence number.
    fn snapshot_bytes(&self) -> Vec<u8> {
        if self.config.delivery == Delivery::AtLeastOnce {
            return Vec::new();
        }
        let prepared = self
            .slots
            .iter()
            .filter_map(|s| match s.state {
                TxnState::Prepared(c, seq, last) => Some(Prepared {
                    checkpoint: c,
                    seq,
                    transactional_id: s.transactional_id.clone().expect("exactly-once producers have ids"),
                    last,
                    log: s.prepared_log.clone(),
                }),
                _ => None,
            })
            .collect();
        let snapshot = SinkSnapshot { topic: self.config.topic.clone(), prepared, next_seq: self.next_seq };
        serde_json::to_vec(&snapshot).expect("snapshots serialize")
    }

    /// Checkpoint n is durable: commit every transaction prepared for n or before, oldest
    /// first.
    pub fn commit_prepared(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        self.check()?;
        let mut due: Vec<(u64, usize)> = (0..self.slots.len())
            .filter_map(|k| match self.slots[k].state {
                TxnState::Prepared(c, seq, _) if c <= checkpoint_id => Some((seq, k)),
                _ => None,
            })
            .collect();
        due.sort_unstable();
        for (_, k) in due {
            self.commit(k)?;
        }
        self.remove_logs(|c| c.is_some_and(|c| c <= checkpoint_id));
        Ok(())
    }

    /// Remove this subtask's transaction-log files (logs and replay markers) whose checkpoint
    /// (`None`: an open log) `stale` says, except those of transactions still prepared.
    fn remove_logs(&self, stale: impl Fn(Option<u64>) -> bool) {
        let Some(dir) = &self.config.transaction_log_dir else { return };
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let pending: Vec<&str> =
            self.slots.iter().filter_map(|s| s.prepared_log.as_ref()).map(|l| l.file.as_str()).collect();
        let stems: Vec<String> =
            (0..self.config.producers()).map(|k| txnlog::stem(&self.transactional_id(k))).collect();
        for e in entries.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            if pending.contains(&name.as_str()) {
                continue;
            }
            let open = self.slots.iter().any(|s| {
                s.log.is_some()
                    && s.transactional_id.as_deref().map(txnlog::stem).is_some_and(|st| name == format!("{st}.open"))
            });
            if open {
                continue;
            }
            if stems.iter().any(|st| txnlog::checkpoint_of(&name, st).is_ok_and(&stale)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    fn transactional_id(&self, k: usize) -> String {
        format!("{}-{}-{k}", self.config.transactional_id_prefix, self.index)
    }

    /// Once before the first write: fence older instances (their open transactions are
    /// aborted), make sure every transaction the checkpoint prepared is committed (writing
    /// again from its log one that the crash left uncommitted), and remove the logs of what
    /// came after. See the module docs.
    pub fn restore_from(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        self.start()?;
        if self.config.delivery == Delivery::AtLeastOnce {
            return Ok(());
        }
        let committed = match self.committed_seq() {
            // The marker is an offset of a group without members, which Kafka drops after
            // offsets.retention.minutes without commits: the local record covers that.
            Ok(m) => m.max(self.committed_locally()),
            Err(e) => return Err(self.poison(e)),
        };
        self.next_seq = committed + 1;
        let Some((id, bytes)) = from.filter(|(_, b)| !b.is_empty()) else {
            // A fresh start: every log here is of a run whose output is not wanted.
            self.remove_logs(|_| true);
            return Ok(());
        };
        let snapshot: SinkSnapshot = match serde_json::from_slice(bytes) {
            Ok(s) => s,
            Err(e) => return Err(self.poison(format!("checkpoint {id}: unreadable sink snapshot: {e}"))),
        };
        if snapshot.topic != self.config.topic {
            return Err(self.poison(format!(
                "checkpoint {id} holds transactions of topic {}, not of this sink's topic; restore it with the topic \
                 it was taken with, or start without its checkpoints",
                snapshot.topic
            )));
        }
        if let Some(p) = snapshot.prepared.iter().find(|p| p.seq == 0 && p.last.is_some()) {
            return Err(self.poison(format!(
                "checkpoint {id} was written by an older weir that did not number its transactions: whether {} \
                 ({}) was committed cannot be told; restore it with that version",
                p.transactional_id,
                checkpoint_name(p.checkpoint)
            )));
        }
        if snapshot.next_seq > 0 && committed >= snapshot.next_seq {
            tracing::warn!(
                sink = %self.name,
                checkpoint = id,
                committed,
                "restoring checkpoint {id}, older than transactions this sink already committed (up to number \
                 {committed}, the checkpoint numbered up to {}): the sources read their records again, and they are \
                 written again (duplicates in the topic)",
                snapshot.next_seq - 1
            );
        }
        self.next_seq = self.next_seq.max(snapshot.next_seq);
        // Everything in the snapshot was prepared at or before its barrier (the final
        // checkpoint's barrier id is u64::MAX): oldest first, as they were numbered.
        let mut prepared: Vec<&Prepared> = snapshot.prepared.iter().collect();
        prepared.sort_by_key(|p| p.seq);
        for p in prepared
            .into_iter()
            .filter(|p| p.seq > committed && (p.last.is_some() || p.log.as_ref().is_some_and(|l| l.records > 0)))
        {
            if let Err(e) = self.write_again(id, p) {
                return Err(self.poison(e));
            }
        }
        // Logs of transactions after the checkpoint (aborted: the sources read them again),
        // and of ones before it that were committed.
        self.remove_logs(|_| true);
        Ok(())
    }

    /// Write the aborted transaction `p` again from its log, with its commit marker.
    fn write_again(&mut self, id: u64, p: &Prepared) -> Result<(), Problem> {
        let what = format!("transaction {} (prepared for {})", p.transactional_id, checkpoint_name(p.checkpoint));
        let (Some(dir), Some(log)) = (self.config.transaction_log_dir.clone(), &p.log) else {
            return Err(Problem::from(format!(
                "{what} was not committed before the crash, and librdkafka cannot resume it: init_transactions \
                 aborted it, and the checkpoint names no transaction log to write it again from. Restoring \
                 checkpoint {id} would lose its records; restore an earlier checkpoint instead (move the newer ones \
                 away), whose sources read them again"
            )));
        };
        let records = txnlog::read(&dir, log).map_err(|e| format!("{what} must be written again, but: {e}"))?;
        tracing::warn!(
            sink = %self.name,
            transaction = %p.transactional_id,
            checkpoint = %checkpoint_name(p.checkpoint),
            records = records.len(),
            "the crash left a prepared transaction uncommitted; writing its {} records again from its log",
            records.len()
        );
        let slot = &mut self.slots[0];
        slot.producer.begin_transaction().map_err(|e| format!("begin_transaction: {}", kafka_error_text(&e)))?;
        let topic = self.config.topic.as_str();
        let repartition = self.repartition.is_some();
        for (key, payload) in &records {
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(&payload[..]);
            if let Some(k) = key {
                record = record.key(&k[..]);
                // A repartition topic's record goes back to the partition its key names.
                if let Some(p) = partition_in(k).filter(|_| repartition) {
                    record = record.partition(p);
                }
            }
            let mut record = Some(record);
            while let Some(r) = record.take() {
                match slot.producer.send(r) {
                    Ok(()) => {}
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        slot.producer.poll(Duration::from_millis(10));
                        record = Some(r);
                    }
                    Err((e, _)) => {
                        return Err(Problem::from(format!("writing {what} again: send: {}", kafka_error_text(&e))));
                    }
                }
            }
        }
        slot.producer
            .flush(self.config.flush_timeout)
            .map_err(|e| format!("writing {what} again: flush: {}", kafka_error_text(&e)))?;
        settle_slot(slot, &self.config.stats).map_err(|e| format!("writing {what} again: {e}"))?;
        slot.deliveries.take_last();
        // The same sequence number: a crash before this commit leaves the marker below it, and
        // the next restore writes the log again; after it, the marker says committed.
        self.send_marker(0, p.seq)?;
        self.slots[0]
            .producer
            .commit_transaction(self.config.flush_timeout)
            .map_err(|e| format!("commit of the re-written {what}: {}", kafka_error_text(&e)))?;
        self.record_committed(p.seq)?;
        let _ = std::fs::remove_file(dir.join(&log.file));
        self.config.stats.replayed_transactions.fetch_add(1, Ordering::Relaxed);
        self.config.stats.replayed_records.fetch_add(records.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn send(&mut self) -> Result<(), Halt> {
        let k = self.current;
        let topic = self.config.topic.as_str();
        let has_key = self.key.is_some() || self.repartition.is_some();
        let partition = self.repartition.as_ref().and_then(|_| partition_in(&self.key_buf));
        let mut blocked: Option<Wait> = None;
        let mut failed: Option<Problem> = None;
        loop {
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(&self.payload[..]);
            if has_key {
                record = record.key(&self.key_buf[..]);
            }
            if let Some(p) = partition {
                record = record.partition(p);
            }
            match self.slots[k].producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    // Backpressure: serve delivery reports until the queue has room.
                    // Counted while it lasts (the stopwatch), named once it is long.
                    let since = blocked.get_or_insert_with(|| self.config.stats.blocked.start()).started();
                    wait_for_reports(&mut self.slots[k], &self.config.stats);
                    if let Err(e) = settle_slot(&mut self.slots[k], &self.config.stats) {
                        failed = Some(e);
                        break;
                    }
                    if outside::stop_requested() {
                        if let Some(wait) = blocked.take() {
                            self.config.stats.blocked.stop(wait);
                        }
                        return Err(Halt::Stopped);
                    }
                    let waited = since.elapsed();
                    if waited >= outside::SHOW_AFTER {
                        let (name, error) = (&self.name, self.last_error_text());
                        let note = move || {
                            format!(
                                "kafka sink {name}: the producer's queue to {topic} is full for {:.1} s (the broker \
                                 acknowledges nothing{error})",
                                waited.as_secs_f64()
                            )
                        };
                        crate::telemetry::waiting::waiting_on(&note);
                        // The barrier on its way cannot reach this sink while the queue stays full.
                        if waited >= self.config.prepare_timeout {
                            outside::decline(note);
                        }
                    }
                }
                Err((e, _)) => {
                    failed = Some(Problem::from(format!("send: {}", kafka_error_text(&e))));
                    break;
                }
            }
        }
        let blocked_since = blocked.map(|wait| {
            let since = wait.started();
            self.config.stats.blocked.stop(wait);
            since
        });
        if let Some(e) = failed {
            return Err(self.poison(e));
        }
        if blocked_since.is_some_and(|t| t.elapsed() >= outside::SHOW_AFTER) {
            crate::telemetry::waiting::waiting_over();
        }
        self.slots[k].producer.poll(Duration::ZERO);
        self.settle(k)
    }

    /// Take one record (see [`Sink::write`]).
    pub fn write_record(&mut self, record: &T) -> Result<(), Halt> {
        self.start()?;
        self.open_transaction()?;
        self.payload.clear();
        match self.encoder.encode(record, &mut self.payload) {
            Ok(()) => {}
            Err(FormatError::Bad(e)) => return Err(self.poison(e)),
            Err(FormatError::Unavailable(e)) => return Err(self.poison(Problem::unavailable(e))),
        }
        if let Some(r) = &self.repartition {
            let p = super::repartition::partition_of((r.key_hash)(record), r.partitions, r.max_key_groups);
            self.key_buf.clear();
            self.key_buf.extend_from_slice(&(p as u32).to_le_bytes());
        } else if let Some(key) = &self.key {
            self.key_buf.clear();
            key(record, &mut self.key_buf);
        }
        self.log_and_send(true)
    }

    /// A repartition topic's writer: mark watermark `w` in every partition, if it advanced.
    fn mark_watermark(&mut self, w: u64) -> Result<(), Halt> {
        let Some(r) = &self.repartition else { return Ok(()) };
        if w <= r.marked {
            return Ok(());
        }
        let (writer, writers, partitions) = (self.index, r.writers, r.partitions);
        self.start()?;
        self.open_transaction()?;
        for p in 0..partitions {
            self.payload.clear();
            super::repartition::WriterMark { writer, writers, watermark: w }.encode(&mut self.payload);
            self.key_buf.clear();
            self.key_buf.extend_from_slice(&p.to_le_bytes());
            self.log_and_send(false)?;
        }
        if let Some(r) = &mut self.repartition {
            r.marked = w;
        }
        Ok(())
    }

    /// Exactly-once: begin a transaction on the current producer if it has none open.
    fn open_transaction(&mut self) -> Result<(), Halt> {
        let k = self.current;
        if self.config.delivery == Delivery::ExactlyOnce && self.slots[k].state == TxnState::Idle {
            if let Err(e) = self.slots[k].producer.begin_transaction() {
                return Err(self.poison(format!("begin_transaction: {}", kafka_error_text(&e))));
            }
            self.slots[k].deliveries.take_last();
            self.slots[k].state = TxnState::Open;
            if let (Some(dir), Some(id)) = (&self.config.transaction_log_dir, &self.slots[k].transactional_id) {
                match TxnLog::create(dir, id) {
                    Ok(log) => self.slots[k].log = Some(log),
                    Err(e) => return Err(self.poison(e)),
                }
            }
        }
        Ok(())
    }

    /// Log (exactly-once) and send the payload and key in hand; `record`: a record of the
    /// job's (not a watermark marker), counted.
    fn log_and_send(&mut self, record: bool) -> Result<(), Halt> {
        let k = self.current;
        let keyed = self.key.is_some() || self.repartition.is_some();
        if let Some(log) = &mut self.slots[k].log {
            let key = keyed.then_some(&self.key_buf[..]);
            if let Err(e) = log.append(key, &self.payload) {
                return Err(self.poison(e));
            }
        }
        if record {
            self.config.stats.records.fetch_add(1, Ordering::Relaxed);
        }
        self.send()
    }

    /// End of input: deliver everything; exactly-once: commit what is open and prepared.
    pub fn finish_all(&mut self) -> Result<(), Halt> {
        self.start()?;
        self.mark_watermark(u64::MAX)?;
        for k in 0..self.slots.len() {
            self.flush(k)?;
        }
        let mut order: Vec<(u64, usize)> = (0..self.slots.len())
            .filter_map(|k| match self.slots[k].state {
                TxnState::Prepared(_, seq, _) => Some((seq, k)),
                TxnState::Open => Some((u64::MAX, k)),
                TxnState::Idle => None,
            })
            .collect();
        order.sort_unstable();
        for (_, k) in order {
            self.commit(k)?;
        }
        Ok(())
    }
}

/// Run `call`, a librdkafka call that blocks until the broker answers (within its own
/// timeout), with `what` as the subtask's waiting note meanwhile: weir-stat, an expired
/// checkpoint and a stop that runs out of time name it.
fn named<R>(what: impl FnOnce() -> String, call: impl FnOnce() -> R) -> R {
    crate::telemetry::waiting::waiting_on(what);
    let result = call();
    crate::telemetry::waiting::waiting_over();
    result
}

/// The partition a repartition topic's record key names (4 bytes, little-endian).
fn partition_in(key: &[u8]) -> Option<i32> {
    Some(u32::from_le_bytes(key.try_into().ok()?) as i32)
}

/// "checkpoint n", or "the final checkpoint" for the end of input's barrier id.
fn checkpoint_name(id: u64) -> String {
    if id == crate::checkpoint::FINAL { "the final checkpoint".into() } else { format!("checkpoint {id}") }
}

/// The producer's queue is full: sleep until a delivery report arrives (in io_uring, on the
/// main queue's eventfd; at most 100 ms), then serve the reports.
fn wait_for_reports(slot: &mut Slot, stats: &KafkaSinkStats) {
    if weir_ring::fiber::in_fiber() {
        // A fiber must not block its thread on the fd or in librdkafka: serve the reports
        // every FIBER_SLICE, the other fibers running in between.
        slot.producer.poll(Duration::ZERO);
        weir_ring::fiber::sleep(FIBER_SLICE);
        slot.producer.poll(Duration::ZERO);
        return;
    }
    let Some((event, waiter)) = &mut slot.event else {
        slot.producer.poll(Duration::from_millis(10));
        return;
    };
    // The eventfd protocol (see native.rs): drain, then look at the queue, then sleep.
    event.drain();
    if event.queue_len() == 0 {
        if waiter.is_none() {
            *waiter = Waiter::new().ok();
        }
        match waiter {
            Some(w) => {
                stats.waits.fetch_add(1, Ordering::Relaxed);
                if w.wait_readable(event.fd(), Duration::from_millis(100)).is_err() {
                    slot.producer.poll(Duration::from_millis(10));
                }
            }
            None => {
                slot.producer.poll(Duration::from_millis(10));
            }
        }
    }
    slot.producer.poll(Duration::ZERO);
}

/// Count a producer's new delivery reports into the stats; its first failure as an error.
fn settle_slot(slot: &mut Slot, stats: &KafkaSinkStats) -> Result<(), Problem> {
    let delivered = slot.deliveries.delivered();
    stats.delivered.fetch_add(delivered - slot.counted, Ordering::Relaxed);
    slot.counted = delivered;
    slot.deliveries.check()
}

impl<T: Send, E: Encode<T>> Sink<T> for KafkaSink<T, E> {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        if self.dormant {
            return Err(self.poison("a record reached the sink subtask of a partition another instance owns"));
        }
        self.write_record(record)
    }

    fn finish(&mut self) -> Result<(), Halt> {
        if self.dormant {
            return Ok(());
        }
        self.finish_all()
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        if self.dormant {
            return Ok(Vec::new());
        }
        self.prepare(checkpoint_id)
    }

    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        if self.dormant {
            return Ok(());
        }
        self.restore_from(from)?;
        self.delivered_before = self.delivered();
        Ok(())
    }

    /// Delivery reports (served at each write and timer poll), from the first write on.
    /// Counted, not by position: reports of several producers and partitions come in any
    /// order, so a latency marker may be timed when as many records as were written before
    /// it are delivered, a few of them written after it.
    fn acknowledged(&self) -> Option<u64> {
        Some(self.delivered().saturating_sub(self.delivered_before))
    }

    /// While records are in flight: serve the delivery reports that came (no wait), so
    /// they are counted while no record comes; then look again in 5 ms.
    fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
        self.check()?;
        if self.dormant {
            return Ok(None);
        }
        // Called every pass of the subtask's loop: at most once a millisecond.
        let now = weir_ring::process::coarse_monotonic_ns();
        if now < self.next_poll_ns {
            return Ok(Some(Duration::from_millis(5)));
        }
        self.next_poll_ns = now + 1_000_000;
        let mut in_flight = false;
        for k in 0..self.slots.len() {
            self.slots[k].producer.poll(Duration::ZERO);
            self.settle(k)?;
            in_flight |= self.slots[k].producer.in_flight_count() > 0;
        }
        Ok(in_flight.then_some(Duration::from_millis(5)))
    }

    /// At-least-once: nothing to take over (the replay writes again). Exactly-once: each old
    /// subtask's transactions are taken over by one new subtask (old `i` by `i %
    /// parallelism`), which restores them as subtask `i` would have: it fences `i`'s
    /// transactional ids, reads `i`'s commit marker, writes again from their logs those the
    /// crash left uncommitted, and removes `i`'s logs; then it restores its own (a new index
    /// without a predecessor starts fresh, fencing its ids). Subtask `i` itself, if it no
    /// longer exists, keeps its marker group: a later run at that parallelism numbers on.
    fn restore_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        if self.dormant {
            return Ok(());
        }
        if self.config.delivery == Delivery::AtLeastOnce {
            return self.restore_from(None);
        }
        let mut own = None;
        for (i, bytes) in from.split() {
            if *i == self.index {
                own = Some(bytes.as_slice());
            } else {
                self.restore_as(*i, from.checkpoint_id, bytes)?;
            }
        }
        self.restore_from(own.map(|b| (from.checkpoint_id, b)))?;
        self.delivered_before = self.delivered();
        Ok(())
    }

    fn checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        if self.dormant {
            return Ok(());
        }
        self.commit_prepared(checkpoint_id)
    }

    fn watermark(&mut self, w: u64) -> Result<(), Halt> {
        if self.dormant {
            return Ok(());
        }
        self.mark_watermark(w)
    }
}

impl<T, E: Encode<T>> KafkaSink<T, E> {
    /// Restore checkpoint `id`'s part of old subtask `index` (its bytes `bytes`) as that
    /// subtask would: with producers of its transactional ids, closed afterwards, and this
    /// subtask's own state put back.
    fn restore_as(&mut self, index: u32, id: u64, bytes: &[u8]) -> Result<(), Halt> {
        let saved = (
            std::mem::replace(&mut self.index, index),
            std::mem::take(&mut self.slots),
            std::mem::replace(&mut self.current, 0),
            std::mem::replace(&mut self.started, false),
            self.marker.take(),
            std::mem::replace(&mut self.next_seq, 1),
        );
        tracing::info!(sink = %self.name, checkpoint = id, "restoring the transactions of sink subtask {index} (parallelism changed)");
        let result = self.restore_from(Some((id, bytes)));
        // Its producers and marker client go (all it prepared is committed now, or failed).
        self.slots.clear();
        self.marker = None;
        (self.index, self.slots, self.current, self.started, self.marker, self.next_seq) = saved;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::kafka::RawEncode;

    /// Without a prefix, exactly-once identities come from the job and the node: two jobs,
    /// or two sink nodes, writing to one topic never share a transactional id or a marker
    /// group. A prefix given is used as is.
    #[test]
    fn identities_come_from_job_and_node() {
        let info = |job: &str, node: &str| SubtaskInfo {
            job: job.into(),
            node: node.into(),
            index: 1,
            parallelism: 2,
            max_key_groups: 128,
            owned: None,
        };
        let config = KafkaSinkConfig { delivery: Delivery::ExactlyOnce, ..KafkaSinkConfig::new("h:1", "sums") };
        let sink = |job, node, config: &KafkaSinkConfig| {
            KafkaSink::<Vec<u8>, RawEncode>::new(config.clone(), &info(job, node), RawEncode)
        };
        let a = sink("jobA", "out", &config);
        let b = sink("jobB", "out", &config);
        let c = sink("jobA", "copy", &config);
        assert_eq!(a.transactional_id(0), "weir-jobA-out-1-0");
        assert_eq!(a.marker_group(), "weir-txn-weir-jobA-out-1");
        assert_ne!(a.transactional_id(0), b.transactional_id(0));
        assert_ne!(a.marker_group(), c.marker_group());
        let given = KafkaSinkConfig { transactional_id_prefix: "mine".into(), ..config.clone() };
        assert_eq!(sink("jobA", "out", &given).transactional_id(2), "mine-1-2");
    }
}
