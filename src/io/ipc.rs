//! `ipc` sources and sinks: rings another process on the host feeds or reads, in place.
//!
//! Each subtask of an ipc source or sink creates one endpoint
//! ([`weir_ring::ipc::Endpoint`]): sealed shared memory at
//! `<dir>/<endpoint>.<subtask index>`, where `dir` is `/dev/shm/weir-<uid>/ipc/<job>` unless
//! the job names one. The other program attaches with `weir_ring::ipc::Publisher` (a
//! source's) or `Subscriber` (a sink's) — in Rust, or through the C ABI — and sees back
//! pressure as "no credit".
//!
//! - **Records**: each ring record is a u64 sequence number (little-endian), then the
//!   record's own encoding ([`Record::encode`]; a job file's `Event` is 32 bytes: key,
//!   value, time_ns, seq, each a little-endian u64).
//! - **Delivery** (see [`weir_ring::ipc`]): the source drops a record numbered below the
//!   one it expects (a re-send), fails or resets on one above (records were lost), and
//!   keeps the number it expects in its checkpoints; when a checkpoint completes it
//!   publishes the number below which everything is durable (`durable_seq`). After a
//!   restart the endpoint asks for the checkpoint's number next. A publisher that keeps
//!   what is not durable and sends again from there gets exactly-once. Restored at a larger
//!   parallelism, each endpoint goes on from its own number and the new ones start at 0; at
//!   a smaller one the restore is refused, naming the endpoints that would be gone. An ipc sink
//!   is not restored at another parallelism (refused, saying why: its numbers would move to
//!   other records).
//! - **A broken peer**: a publisher that breaks the ring protocol (a bad header poisons the
//!   ring), sends a record that does not decode, or skips numbers, fails the job with what
//!   it did and where (`on_poison = fail`, the default), or the endpoint is made anew at the
//!   number expected and the publisher must connect again (`reset`; counted). Payloads are
//!   copied out of shared memory before they are checked and decoded.
//! - **Sinks** write each record as it comes (numbered like a source's; after a restart,
//!   again from the checkpoint's number). For a deterministic job (a replay writes the same
//!   records under the same numbers) a subscriber dropping numbers below the next it
//!   expects reads each record once; otherwise delivery is at least once, and the header's
//!   `durable_seq` says below which number nothing will be written again. A sink that fails
//!   leaves its endpoint without ending the stream (a subscriber sees no false end). A subscriber that does not read holds the sink back
//!   (back pressure); a sink with no live subscriber for `reader_timeout` fails, as a TCP
//!   sink whose peer stops reading does, so a job cannot hang for ever on a reader that is
//!   gone.

use crate::operators::{Collector, Halt, Sink, Source, SourcePoll, SubtaskInfo, Wake};
use crate::record::Record;
use crate::telemetry::time::Wait;
use crate::util::section::{Affects, JobFileError, Key, KeyType as T, Section};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_ring::ipc::{Endpoint, EndpointStatus, SEQ_BYTES};
use weir_ring::{Claim, Consumer, IdleStep, IdleStrategy, Idler, ParkToken, Producer, Read, RingConfig};

/// Records an ipc source takes from its ring per poll, at most.
const POLL_BATCH: usize = 256;

/// What a source endpoint does when its publisher breaks the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnPoison {
    /// Fail the job, saying what the publisher did (the default).
    #[default]
    Fail,
    /// Make the endpoint anew at the number expected; the publisher connects again.
    Reset,
}

/// Where an endpoint lives and what its ring looks like.
#[derive(Debug, Clone)]
pub struct IpcConfig {
    /// The endpoint's name (default: the node's id).
    pub endpoint: Option<String>,
    /// The directory of the job's endpoints (yours, 0700; made if missing); default
    /// `/dev/shm/weir-<uid>/ipc/<job>`.
    pub dir: Option<PathBuf>,
    /// The ring's shape: its slots are the credit the other process gets.
    pub ring: RingConfig,
    /// A source's answer to a publisher that breaks the protocol.
    pub on_poison: OnPoison,
    /// A sink fails after this long without a live subscriber while it has records to
    /// write (`None`: it waits for one for ever).
    pub reader_timeout: Option<Duration>,
    /// How a source waits for the publisher's next record (and a sink for room): the
    /// default spins briefly, then sleeps on the ring; `BusySpin` answers fastest and burns
    /// a core (for isolated cores).
    pub idle: IdleStrategy,
}

impl Default for IpcConfig {
    fn default() -> IpcConfig {
        IpcConfig {
            endpoint: None,
            dir: None,
            ring: RingConfig { slot_bytes: 64, slot_count: 4096, max_record_bytes: 64 * 1024 },
            on_poison: OnPoison::Fail,
            reader_timeout: Some(Duration::from_secs(30)),
            idle: IdleStrategy::default(),
        }
    }
}

impl IpcConfig {
    /// The keys a job file's ipc source or sink takes.
    pub const KEYS: &'static [Key] = &[
        Key::new("endpoint", T::String, "the node's id", "The endpoint's name: subtask i's ring is `<dir>/<endpoint>.<i>`."),
        Key::new("dir", T::String, "/dev/shm/weir-<uid>/ipc/<job>", "The directory of the job's endpoints (yours, 0700; made if missing).")
            .affects(Affects::Security),
        Key::new("slots", T::Integer, "4096", "Slots of each endpoint's ring, a power of two: the credit the other process gets.")
            .affects(Affects::Memory),
        Key::new("slot_bytes", T::Integer, "64", "Bytes per slot, a power of two, at least 8.").affects(Affects::Memory),
        Key::new("max_record_bytes", T::Integer, "half the ring, at most 65536", "The largest record a peer may write; a larger one is a protocol breach."),
        Key::new("on_poison", T::String, "fail", "A source's answer to a publisher that breaks the protocol: `fail` the job saying what it did, or `reset` the endpoint at the record expected.")
            .affects(Affects::Failures),
        Key::new("reader_timeout_ms", T::Integer, "30000", "A sink fails after this long with records to write and no live subscriber (0: waits for ever).")
            .affects(Affects::Failures),
    ];

    /// Read an `ipc` node's keys.
    pub fn from_section(s: &mut Section) -> Result<IpcConfig, JobFileError> {
        let mut config =
            IpcConfig { endpoint: s.take::<String>("endpoint")?.map(|e| e.into_inner()), ..Default::default() };
        config.dir = s.take::<String>("dir")?.map(|d| PathBuf::from(d.into_inner()));
        let slots = s.take::<u32>("slots")?;
        let slot_bytes = s.take::<u32>("slot_bytes")?;
        let max = s.take::<u32>("max_record_bytes")?;
        if let Some(n) = &slots {
            config.ring.slot_count = *n.get_ref();
        }
        if let Some(b) = &slot_bytes {
            config.ring.slot_bytes = *b.get_ref();
        }
        // Unless given, the largest record is what half the ring holds (64 KiB at most).
        config.ring.max_record_bytes = match &max {
            Some(m) => *m.get_ref(),
            None => (config.ring.ring_bytes() / 2).min(64 * 1024) as u32,
        };
        if let Err(e) = config.ring.validate() {
            let (span, key) = match (&max, &slot_bytes, &slots) {
                (Some(m), _, _) => (m.span(), "max_record_bytes"),
                (None, Some(b), _) if !b.get_ref().is_power_of_two() || *b.get_ref() < 8 => (b.span(), "slot_bytes"),
                (None, _, Some(n)) => (n.span(), "slots"),
                (None, Some(b), None) => (b.span(), "slot_bytes"),
                (None, None, None) => unreachable!("the defaults are valid"),
            };
            return Err(s.err(span, key, e.to_string()));
        }
        if let Some(p) = s.take::<String>("on_poison")? {
            config.on_poison = match p.get_ref().as_str() {
                "fail" => OnPoison::Fail,
                "reset" => OnPoison::Reset,
                other => {
                    return Err(s.err(p.span(), "on_poison", format!("`{other}`: use \"fail\" or \"reset\"")));
                }
            };
        }
        if let Some(t) = s.take::<u64>("reader_timeout_ms")? {
            config.reader_timeout = (*t.get_ref() > 0).then(|| Duration::from_millis(*t.get_ref()));
        }
        Ok(config)
    }

    /// The endpoint of subtask `info.index` of node `info.node`.
    pub fn path(&self, info: &SubtaskInfo) -> PathBuf {
        let name = self.endpoint.as_deref().unwrap_or(&info.node);
        match &self.dir {
            Some(dir) => dir.join(format!("{}.{}", weir_ring::ipc::safe_name(name), info.index)),
            None => weir_ring::ipc::endpoint_path(&weir_ring::ipc::user_root(), &info.job, name, info.index as usize),
        }
    }
}

/// Totals of an ipc node's subtasks, readable while the job runs.
#[derive(Debug, Default)]
pub struct IpcStats {
    /// Records taken from (source) or written to (sink) the endpoints.
    pub records: AtomicU64,
    /// Records a source dropped as re-sent (numbered below the one it expected).
    pub duplicates: AtomicU64,
    /// Endpoints made anew after a publisher broke the protocol (`on_poison = reset`).
    pub resets: AtomicU64,
    /// Records a source dropped because they did not decode (`on_poison = reset`).
    pub rejected: AtomicU64,
    /// Time a sink waited for its subscriber to make room (counted while it lasts).
    pub blocked: crate::telemetry::time::Stopwatch,
    /// Per subtask: a source's records sent by its publisher and not yet taken (by the
    /// number the publisher last stored); a sink's slots its subscriber has not read.
    pub backlog: std::sync::Mutex<std::collections::BTreeMap<u32, u64>>,
    /// Per source subtask: its ring as a channel from the publisher (slots, in use, the
    /// publisher's blocked time from the ring's header).
    pub endpoints: std::sync::Mutex<std::collections::BTreeMap<u32, crate::telemetry::sources::EndpointReading>>,
}

impl IpcStats {
    fn set_backlog(&self, subtask: u32, value: u64) {
        self.backlog.lock().unwrap_or_else(|e| e.into_inner()).insert(subtask, value);
    }

    /// A source node's gauge for the counters file: each subtask's backlog as the "lag" of
    /// "partition" = subtask index (`weir-stat` shows `node[i]`).
    pub fn lag_gauge(self: &Arc<Self>, node: &str) -> crate::telemetry::sources::LagGauge {
        let stats = self.clone();
        crate::telemetry::sources::LagGauge {
            node: node.to_owned(),
            read: Arc::new(move |f: &mut dyn FnMut(i32, u64)| {
                for (&i, &lag) in stats.backlog.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    f(i as i32, lag);
                }
            }),
        }
    }

    /// A source node's endpoints as channels from their publishers, for the counters file:
    /// `ipc:<endpoint>-><node>#<i>` (slots, fill, the publisher's blocked time).
    pub fn endpoint_gauge(self: &Arc<Self>, node: &str, endpoint: &str) -> crate::telemetry::sources::EndpointGauge {
        let stats = self.clone();
        crate::telemetry::sources::EndpointGauge {
            node: node.to_owned(),
            publisher: format!("ipc:{endpoint}"),
            read: Arc::new(move |f: &mut dyn FnMut(u32, crate::telemetry::sources::EndpointReading)| {
                for (&i, &r) in stats.endpoints.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    f(i, r);
                }
            }),
        }
    }

    /// A sink node's gauge for the counters file: records written, slots the subscribers
    /// have not read (in flight), time waited for them (blocked).
    pub fn sink_gauge(self: &Arc<Self>, node: &str) -> crate::telemetry::sinks::SinkGauge {
        let stats = self.clone();
        crate::telemetry::sinks::SinkGauge {
            node: node.to_owned(),
            read: Arc::new(move || crate::telemetry::sinks::SinkReading {
                records: stats.records.load(Ordering::Relaxed),
                in_flight: stats.backlog.lock().unwrap_or_else(|e| e.into_inner()).values().sum(),
                blocked_ns: stats.blocked.total_ns(),
                ..Default::default()
            }),
        }
    }
}

/// Subtask `subtask` of ipc node `node` at `path`: for messages.
fn where_(info: &SubtaskInfo, path: &std::path::Path) -> String {
    format!("ipc {}[{}] at {}", info.node, info.index, path.display())
}

/// An endpoint's record numbers, as a source or sink subtask keeps them: the next record's,
/// the durable one (below it, everything is in a completed checkpoint), and the number each
/// checkpoint taken and not yet complete holds. A checkpoint holds the next number alone.
#[derive(Debug, Default)]
struct Numbers {
    next: u64,
    durable: u64,
    /// (checkpoint id, `next` at it).
    pending: VecDeque<(u64, u64)>,
}

impl Numbers {
    /// Checkpoint `id`: its bytes (the next number), remembered until it completes.
    fn snapshot(&mut self, id: u64) -> Vec<u8> {
        self.pending.push_back((id, self.next));
        self.next.to_le_bytes().to_vec()
    }

    /// Go on from a checkpoint's bytes (`None`: a fresh start, at 0). What a completed
    /// checkpoint holds is durable. `at` names the subtask, `kind` its node (`source`,
    /// `sink`), for the error.
    fn restore(&mut self, from: Option<(u64, &[u8])>, kind: &str, at: impl FnOnce() -> String) -> Result<(), Halt> {
        if let Some((id, bytes)) = from {
            let Ok(word) = <[u8; 8]>::try_from(bytes) else {
                return Err(Halt::failed(format!(
                    "{}: checkpoint {id} holds {} bytes for this {kind}, not its 8-byte record number",
                    at(),
                    bytes.len()
                )));
            };
            self.next = u64::from_le_bytes(word);
            self.durable = self.next;
        }
        Ok(())
    }

    /// Checkpoint `id` (and every one before it) completed: the durable number now.
    fn complete(&mut self, id: u64) -> u64 {
        while let Some(&(pending, next)) = self.pending.front() {
            if pending > id {
                break;
            }
            self.durable = self.durable.max(next);
            self.pending.pop_front();
        }
        self.durable
    }
}

/// One subtask of an ipc source: the consumer of its endpoint's ring.
#[derive(Debug)]
pub struct IpcSource<T> {
    config: IpcConfig,
    info: SubtaskInfo,
    path: PathBuf,
    endpoint: Option<Endpoint>,
    consumer: Option<Consumer>,
    /// The next record's number (the one expected), what is durable, what checkpoints hold.
    numbers: Numbers,
    /// The payload copied out of shared memory (8-aligned), and its length in bytes.
    copy: Vec<u64>,
    copy_len: usize,
    stats: Arc<IpcStats>,
    closed: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T: Record> IpcSource<T> {
    /// Subtask `info` of an ipc source; its endpoint is made when the subtask starts.
    pub fn new(config: IpcConfig, info: &SubtaskInfo) -> IpcSource<T> {
        IpcSource::with_stats(config, info, Arc::new(IpcStats::default()))
    }

    /// The same, counting into `stats` (shared by the node's subtasks).
    pub fn with_stats(config: IpcConfig, info: &SubtaskInfo, stats: Arc<IpcStats>) -> IpcSource<T> {
        let path = config.path(info);
        let info = info.clone();
        IpcSource {
            config,
            info,
            path,
            endpoint: None,
            consumer: None,
            numbers: Numbers::default(),
            copy: Vec::new(),
            copy_len: 0,
            stats,
            closed: false,
            _t: PhantomData,
        }
    }

    /// Make the endpoint (anew), its next record `self.numbers.next`.
    fn open(&mut self) -> Result<(), Halt> {
        self.consumer = None;
        self.endpoint = None;
        // Durable: what the last completed checkpoint holds (after a reset, not what was read).
        let endpoint = Endpoint::create(&self.path, self.config.ring, self.numbers.next, self.numbers.durable)
            .map_err(|e| Halt::failed(format!("{}: {e}", where_(&self.info, &self.path))))?;
        let consumer =
            endpoint.consumer().map_err(|e| Halt::failed(format!("{}: {e}", where_(&self.info, &self.path))))?;
        tracing::info!(
            "ipc source {}[{}]: endpoint {} ready, next record {}",
            self.info.node,
            self.info.index,
            self.path.display(),
            self.numbers.next
        );
        self.endpoint = Some(endpoint);
        self.consumer = Some(consumer);
        Ok(())
    }

    /// The publisher broke the protocol (`what`): fail, or reset the endpoint, by policy.
    fn broken(&mut self, what: String) -> Result<(), Halt> {
        let at = where_(&self.info, &self.path);
        match self.config.on_poison {
            OnPoison::Fail => Err(Halt::failed(format!(
                "{at}: {what}; the publisher broke the endpoint's protocol: fix it and restart the job, or set on_poison = \"reset\" to make the endpoint anew instead"
            ))),
            OnPoison::Reset => {
                tracing::warn!(
                    "{at}: {what}; endpoint made anew at record {} (on_poison = reset): the publisher must connect again",
                    self.numbers.next
                );
                self.stats.resets.fetch_add(1, Ordering::Relaxed);
                self.open()
            }
        }
    }

    /// The endpoint's figures (`None` before the subtask started).
    pub fn status(&self) -> Option<EndpointStatus> {
        self.endpoint.as_ref().map(Endpoint::status)
    }
}

/// What one read found, taken out of the ring's borrow.
enum Took {
    Record,
    Empty,
    Closed,
    Broken(String),
}

impl<T: Record> Source<T> for IpcSource<T> {
    fn poll(&mut self, out: &mut dyn Collector<T>) -> Result<SourcePoll, Halt> {
        if self.consumer.is_none() {
            self.open()?;
        }
        if self.closed {
            return Ok(SourcePoll::Finished);
        }
        let mut emitted = 0;
        // Bounded in records read, not only emitted: a publisher flooding re-sent records
        // (dropped) cannot keep the poll from returning to barriers and the mailbox.
        let mut read = 0;
        while emitted < POLL_BATCH && read < 4 * POLL_BATCH {
            read += 1;
            let consumer = self.consumer.as_mut().expect("opened above");
            let took = match consumer.read() {
                Ok(Read::Record(view)) => {
                    self.copy_len = view.copy_payload(&mut self.copy).len();
                    view.release_deferred();
                    Took::Record
                }
                Ok(Read::Empty) => Took::Empty,
                Ok(Read::Closed) => Took::Closed,
                Err(e) => Took::Broken(e.to_string()),
            };
            match took {
                Took::Empty => break,
                Took::Closed => {
                    self.closed = true;
                    return Ok(if emitted > 0 { SourcePoll::Emitted(emitted) } else { SourcePoll::Finished });
                }
                Took::Broken(what) => {
                    self.broken(what)?;
                    break;
                }
                Took::Record => {}
            }
            let record_len = self.copy_len;
            if record_len < SEQ_BYTES {
                self.broken(format!("a record of {record_len} bytes has no sequence number (8 bytes)"))?;
                break;
            }
            let seq = u64::from_le_bytes(self.copy[0].to_ne_bytes());
            if seq < self.numbers.next {
                self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if seq > self.numbers.next {
                let expected = self.numbers.next;
                self.broken(format!(
                    "record {seq} came when {expected} was expected: records {expected}..{seq} are missing"
                ))?;
                break;
            }
            let payload = &zerocopy::IntoBytes::as_bytes(&self.copy[..])[SEQ_BYTES..record_len];
            match T::decode(payload, |r| out.collect(r)) {
                Ok(done) => done?,
                Err(e) if self.config.on_poison == OnPoison::Reset => {
                    // Dropped and counted: a reset would only ask for the same record again.
                    tracing::warn!(
                        "{}: record {seq} does not decode ({e}); dropped (on_poison = reset)",
                        where_(&self.info, &self.path)
                    );
                    self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    self.numbers.next += 1;
                    continue;
                }
                Err(e) => {
                    self.broken(format!("record {seq} does not decode: {e}"))?;
                    break;
                }
            }
            self.numbers.next += 1;
            emitted += 1;
        }
        self.stats.records.fetch_add(emitted as u64, Ordering::Relaxed);
        if let Some(e) = &self.endpoint {
            let sent = e.status_next_seq();
            self.stats.set_backlog(self.info.index, sent.saturating_sub(self.numbers.next));
            let reading = crate::telemetry::sources::EndpointReading {
                slots: u64::from(e.ring().config().slot_count),
                backlog: e.backlog_slots(),
                blocked_ns: e.producer_blocked_ns(),
            };
            self.stats.endpoints.lock().unwrap_or_else(|p| p.into_inner()).insert(self.info.index, reading);
        }
        if emitted > 0 {
            return Ok(SourcePoll::Emitted(emitted));
        }
        // Nothing: publish our releases (credit back to the publisher) and wait.
        if let Some(c) = self.consumer.as_mut() {
            c.publish();
            c.heartbeat();
        }
        Ok(SourcePoll::Idle(Duration::from_millis(100)))
    }

    /// Wait by the endpoint's idle strategy for a record (or the subtask's mailbox): spin and
    /// yield as it says, then sleep on the ring's futex and the mailbox's at once; a
    /// busy-spinning endpoint spins until something comes or `timeout` passes.
    fn wait(&mut self, wake: &Wake<'_>, timeout: Duration) -> bool {
        let Some(consumer) = self.consumer.as_mut() else { return false };
        let mut idler = Idler::new(self.config.idle);
        let mut rounds = 0u32;
        let mut deadline = None;
        loop {
            match idler.step() {
                // A fiber lets the others on its thread run instead of spinning or yielding.
                IdleStep::Spin if weir_ring::fiber::yield_now() => {}
                IdleStep::Spin => std::hint::spin_loop(),
                IdleStep::Yield if weir_ring::fiber::yield_now() => {}
                IdleStep::Yield => std::thread::yield_now(),
                IdleStep::Sleep(d) => weir_ring::fiber::sleep(d.min(timeout)),
                IdleStep::Park => {
                    if let Some(token) = consumer.prepare_park() {
                        weir_ring::wait_any(&[token, ParkToken::new(wake.word(), wake.expected())], timeout);
                    }
                    consumer.end_park();
                    return true;
                }
            }
            if wake.is_woken() || consumer.backlog().map_or(true, |b| b > 0) {
                return true;
            }
            rounds += 1;
            if rounds.is_multiple_of(1024)
                && Instant::now() >= *deadline.get_or_insert_with(|| Instant::now() + timeout)
            {
                return true;
            }
        }
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        Ok(self.numbers.snapshot(checkpoint_id))
    }

    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        self.numbers.restore(from, "source", || where_(&self.info, &self.path))?;
        self.open()
    }

    /// Each endpoint is a stream of its own, numbered by its publisher: endpoint `i` goes on
    /// from old subtask `i`'s number, and one the old run did not have starts at 0 (a
    /// fresh endpoint). Fewer endpoints than the checkpoint's is refused: the publisher of
    /// an endpoint that would be gone may hold records no checkpoint has, which no other
    /// endpoint takes (its numbers are its own).
    fn restore_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        let gone: Vec<u32> = from.parts.iter().map(|(i, _)| *i).filter(|&i| i >= from.parallelism).collect();
        if !gone.is_empty() {
            let endpoint = self.config.endpoint.as_deref().unwrap_or(&self.info.node).to_owned();
            let names: Vec<String> = gone.iter().map(|i| format!("{endpoint}.{i}")).collect();
            return Err(Halt::failed(format!(
                "{}: checkpoint {} was taken with {} endpoints and this run has {}: endpoint{} {} would be gone, \
                 and {} publisher may hold records no checkpoint has (an endpoint's numbers are its own; no other \
                 endpoint can take them); run the source at parallelism {} or more, or start with an empty \
                 checkpoint directory once those publishers have nothing left to send",
                where_(&self.info, &self.path),
                from.checkpoint_id,
                from.from_parallelism,
                from.parallelism,
                if names.len() == 1 { "" } else { "s" },
                names.join(", "),
                if names.len() == 1 { "its" } else { "their" },
                from.from_parallelism
            )));
        }
        match from.parts.iter().find(|(i, _)| *i == self.info.index) {
            Some((_, bytes)) => self.restore(Some((from.checkpoint_id, bytes))),
            None => self.restore(None),
        }
    }

    fn checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        let durable = self.numbers.complete(checkpoint_id);
        if let Some(e) = &self.endpoint {
            e.set_durable(durable);
        }
        Ok(())
    }
}

/// One subtask of an ipc sink: the producer of its endpoint's ring.
#[derive(Debug)]
pub struct IpcSink<T> {
    config: IpcConfig,
    info: SubtaskInfo,
    path: PathBuf,
    endpoint: Option<Endpoint>,
    producer: Option<Producer>,
    /// The next record's number (the one written next), what is durable (a restart writes
    /// nothing below it), what checkpoints hold.
    numbers: Numbers,
    stats: Arc<IpcStats>,
    _t: PhantomData<fn(&T)>,
}

impl<T: Record> IpcSink<T> {
    /// Subtask `info` of an ipc sink; its endpoint is made when the subtask starts.
    pub fn new(config: IpcConfig, info: &SubtaskInfo) -> IpcSink<T> {
        IpcSink::with_stats(config, info, Arc::new(IpcStats::default()))
    }

    /// The same, counting into `stats` (shared by the node's subtasks).
    pub fn with_stats(config: IpcConfig, info: &SubtaskInfo, stats: Arc<IpcStats>) -> IpcSink<T> {
        let path = config.path(info);
        let info = info.clone();
        IpcSink {
            config,
            info,
            path,
            endpoint: None,
            producer: None,
            numbers: Numbers::default(),
            stats,
            _t: PhantomData,
        }
    }

    fn open(&mut self) -> Result<(), Halt> {
        let at = || where_(&self.info, &self.path);
        let endpoint = Endpoint::create(&self.path, self.config.ring, self.numbers.next, self.numbers.durable)
            .map_err(|e| Halt::failed(format!("{}: {e}", at())))?;
        let producer = endpoint.producer().map_err(|e| Halt::failed(format!("{}: {e}", at())))?;
        tracing::info!("ipc sink {}[{}]: endpoint {} ready", self.info.node, self.info.index, self.path.display());
        self.endpoint = Some(endpoint);
        self.producer = Some(producer);
        Ok(())
    }

    /// The endpoint's figures (`None` before the subtask started).
    pub fn status(&self) -> Option<EndpointStatus> {
        self.endpoint.as_ref().map(Endpoint::status)
    }

    /// Make every record written visible to the subscriber, and say in the header which
    /// number comes next.
    fn publish(&mut self) {
        if let (Some(p), Some(e)) = (self.producer.as_mut(), self.endpoint.as_ref())
            && p.unpublished_slots() > 0
        {
            p.publish();
            e.set_next_seq(self.numbers.next);
            self.stats.set_backlog(self.info.index, e.backlog_slots());
        }
    }

    /// Wait for room for a record of `len` bytes; fail once no live subscriber has been
    /// attached for `reader_timeout`.
    fn wait_for_room(&mut self, len: usize, since: Instant) -> Result<(), Halt> {
        let producer = self.producer.as_mut().expect("opened");
        producer.park(len, Duration::from_millis(20));
        let endpoint = self.endpoint.as_ref().expect("opened");
        let reader = endpoint.ring().status().consumer.is_some_and(|c| c.alive);
        if !reader
            && let Some(limit) = self.config.reader_timeout
            && since.elapsed() >= limit
        {
            return Err(Halt::failed(format!(
                "{}: no subscriber has read for {} ms and the ring is full; start one (weir_ring::ipc::Subscriber), or raise reader_timeout_ms",
                where_(&self.info, &self.path),
                limit.as_millis()
            )));
        }
        Ok(())
    }
}

impl<T: Record> Sink<T> for IpcSink<T> {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        if self.producer.is_none() {
            self.open()?;
        }
        let len = SEQ_BYTES + record.encoded_len();
        let mut blocked: Option<Wait> = None;
        loop {
            let producer = self.producer.as_mut().expect("opened");
            let claim =
                producer.claim(len).map_err(|e| Halt::failed(format!("{}: {e}", where_(&self.info, &self.path))))?;
            match claim {
                Claim::Granted(mut slot) => {
                    slot[..SEQ_BYTES].copy_from_slice(&self.numbers.next.to_le_bytes());
                    record.encode(&mut slot[SEQ_BYTES..]);
                    // Made visible at the end of the subtask's pass (`poll_timers`), when the
                    // ring is full, or at the end: one shared store per batch, not per record.
                    slot.commit_deferred();
                    self.numbers.next += 1;
                    self.stats.records.fetch_add(1, Ordering::Relaxed);
                    if let Some(wait) = blocked.take() {
                        self.stats.blocked.stop(wait);
                        crate::telemetry::waiting::waiting_over();
                    }
                    return Ok(());
                }
                Claim::NoCredit => {
                    // (The claim published what was committed: say so in the header too.)
                    if let Some(e) = &self.endpoint {
                        e.set_next_seq(self.numbers.next);
                    }
                    let since = match &blocked {
                        Some(wait) => wait.started(),
                        None => {
                            let wait = self.stats.blocked.start();
                            let path = &self.path;
                            crate::telemetry::waiting::waiting_on(|| {
                                format!(
                                    "ipc sink {}: the subscriber of {} makes no room",
                                    self.info.node,
                                    path.display()
                                )
                            });
                            blocked.insert(wait).started()
                        }
                    };
                    if let Err(e) = self.wait_for_room(len, since) {
                        if let Some(wait) = blocked.take() {
                            self.stats.blocked.stop(wait);
                        }
                        crate::telemetry::waiting::waiting_over();
                        return Err(e);
                    }
                }
            }
        }
    }

    /// End the stream, and give the subscriber the time `reader_timeout` allows to read
    /// what is left (the endpoint goes when the job ends).
    fn finish(&mut self) -> Result<(), Halt> {
        if self.producer.is_none() {
            self.open()?;
        }
        self.publish();
        if let Some(p) = self.producer.take() {
            p.close();
        }
        let Some(endpoint) = self.endpoint.as_ref() else { return Ok(()) };
        let mut idle_since = Instant::now();
        loop {
            let status = endpoint.ring().status();
            if status.backlog == 0 || status.consumer_closed {
                return Ok(());
            }
            if status.consumer.as_ref().is_some_and(|c| c.alive) {
                idle_since = Instant::now();
            } else if self.config.reader_timeout.is_some_and(|limit| idle_since.elapsed() >= limit) {
                return Err(Halt::failed(format!(
                    "{}: the job ended with {} slots of records unread and no subscriber for {} ms; they are lost",
                    where_(&self.info, &self.path),
                    status.backlog,
                    self.config.reader_timeout.map_or(0, |l| l.as_millis())
                )));
            }
            // A fiber's sleep: the subscriber may be a fiber on this very thread.
            weir_ring::fiber::sleep(Duration::from_millis(5));
        }
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        self.publish();
        Ok(self.numbers.snapshot(checkpoint_id))
    }

    /// The end of a pass of the subtask's loop: make what was written visible.
    fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
        self.publish();
        Ok(None)
    }

    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        self.numbers.restore(from, "sink", || where_(&self.info, &self.path))?;
        self.open()
    }

    /// Refused: a sink endpoint's numbers promise a subscriber that a record written again
    /// after a restart carries the number it had, so one that drops numbers it has seen
    /// reads each record once. At another parallelism the records after the checkpoint are
    /// routed to other endpoints, so the numbers a subscriber has already seen would arrive
    /// on different records, and it would drop those.
    fn restore_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        if from.is_empty() {
            return self.restore(None);
        }
        let endpoint = self.config.endpoint.as_deref().unwrap_or(&self.info.node).to_owned();
        Err(Halt::failed(format!(
            "{}: checkpoint {} was taken with {} sink endpoint{} and this run has {}: the records written after it \
             would go to other endpoints than before, under numbers their subscribers may already have seen (a \
             subscriber that drops seen numbers would lose them); run the sink at parallelism {}, or, once the \
             subscribers of {endpoint}.* have read everything, start with an empty checkpoint directory",
            where_(&self.info, &self.path),
            from.checkpoint_id,
            from.from_parallelism,
            if from.from_parallelism == 1 { "" } else { "s" },
            from.parallelism,
            from.from_parallelism
        )))
    }

    /// Say in the header which records a restart will not write again.
    fn checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        let durable = self.numbers.complete(checkpoint_id);
        if let Some(e) = &self.endpoint {
            e.set_durable(durable);
        }
        Ok(())
    }
}

impl<T> Drop for IpcSink<T> {
    /// A sink that did not finish (the job failed or was stopped) leaves its endpoint
    /// without ending the stream: a subscriber must not take a failure for the end.
    fn drop(&mut self) {
        if let Some(p) = self.producer.take() {
            p.detach();
        }
    }
}
