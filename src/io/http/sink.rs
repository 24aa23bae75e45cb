//! The sink's semantics: batching, bounded requests in flight, retries, dead letters,
//! idempotency keys, two-phase commit; connections driven by io_uring. The HTTP/1.1 wire
//! format is `client.rs` and `response.rs`.

use super::client::{QUOTE_BYTES, Target, connect, parse_url, quote, write_post_head};
use super::response::{Parsed, Response, ResponseParser};
use crate::io::Backoff;
use crate::io::poison::Poisoned;
use crate::io::tls::{ClientCert, HandshakeError, Tls};
use crate::io::uring::{Completion, Uring};
use crate::operators::{Halt, OperatorFailure, Sink, SubtaskInfo, outside};
use crate::util::{errno_text, io_error_text};
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::marker::PhantomData;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes a response buffer grows by before each receive.
const RECV_CHUNK_BYTES: usize = 16 * 1024;

/// How a batch of records becomes a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BodyFormat {
    /// One JSON object per line (`application/x-ndjson`).
    #[default]
    JsonLines,
    /// One JSON array of objects (`application/json`).
    JsonArray,
}

impl BodyFormat {
    /// Parse a job-file name: `json_lines` or `json_array`.
    pub fn from_name(name: &str) -> Option<BodyFormat> {
        match name {
            "json_lines" => Some(BodyFormat::JsonLines),
            "json_array" => Some(BodyFormat::JsonArray),
            _ => None,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            BodyFormat::JsonLines => "application/x-ndjson",
            BodyFormat::JsonArray => "application/json",
        }
    }
}

/// Settings of an HTTP sink (every subtask has its own connections).
#[derive(Debug, Clone)]
pub struct HttpSinkConfig {
    /// `http://host[:port][/path]` or `https://...`.
    pub url: String,
    /// HTTPS: the CA certificates (PEM) that may sign the server's; `None`: the system's store.
    pub ca_file: Option<PathBuf>,
    /// HTTPS: a client certificate and key, for servers that ask for one.
    pub client_cert: Option<ClientCert>,
    /// Requests in flight at most (sent and unanswered, or waiting for a retry); 1 to 256.
    pub max_in_flight: usize,
    /// Records per POST body.
    pub batch_records: usize,
    /// How the body is written.
    pub body: BodyFormat,
    /// Retries of one batch before the job fails, at least; see `retry_for`.
    pub max_retries: u32,
    /// How long one batch may keep failing before the job fails (after `max_retries` too):
    /// an API that is down for less is ridden out, the sink blocking meanwhile.
    pub retry_for: Duration,
    /// Delays between retries.
    pub backoff: Backoff,
    /// How long a request may wait for its response before it counts as failed (and is retried).
    pub request_timeout: Duration,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// Where 4xx batches go, one JSON line each; `None`: a 4xx fails the job.
    pub dead_letter: Option<PathBuf>,
    /// First part of the idempotency key (the job's name, say); letters, digits, `._-` kept.
    pub key_prefix: String,
    /// The largest response body read.
    pub max_response_bytes: usize,
    /// Idempotency by content: the most record bytes held waiting for a watermark. Past it,
    /// the oldest event time is sent at once (its records may then be cut into other batches
    /// than a replay would make: dedup of those is no longer exact), with a warning; memory
    /// stays bounded whatever the watermarks do.
    pub max_held_bytes: usize,
    /// The most bytes of sealed batches (requests) the sink keeps toward its destination: in
    /// flight, waiting for a retry, or queued for a connection. Beyond `max_in_flight` batches
    /// the sink queues only while a checkpoint's barrier is on its way (so the barrier reaches
    /// it and passes at once; what is queued goes into the checkpoint); otherwise it blocks, and
    /// backpressure starts there. At this bound a checkpoint on its way is declined, naming the
    /// destination. Counted in the job's memory budget with `max_held_bytes`.
    pub max_pending_bytes: usize,
    /// Shared totals of every subtask made from this configuration.
    pub stats: Arc<HttpSinkStats>,
}

impl HttpSinkConfig {
    /// POST to `url`: 4 requests in flight, 100 records per JSON-lines body, retries with
    /// backoff from 10 ms to 1 s for 2 minutes (and at least 8 times), a 30 s response
    /// timeout, no dead-letter file.
    pub fn new(url: impl Into<String>) -> HttpSinkConfig {
        HttpSinkConfig {
            url: url.into(),
            ca_file: None,
            client_cert: None,
            max_in_flight: 4,
            batch_records: 100,
            body: BodyFormat::JsonLines,
            max_retries: 8,
            retry_for: Duration::from_secs(120),
            backoff: Backoff { min_delay: Duration::from_millis(10), max_delay: Duration::from_secs(1) },
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            dead_letter: None,
            key_prefix: "weir".into(),
            max_response_bytes: 1024 * 1024,
            max_held_bytes: 16 << 20,
            max_pending_bytes: 16 << 20,
            stats: Arc::default(),
        }
    }

    /// What the sinks made from this configuration publish, for
    /// [`JobConfig::sink_gauges`](crate::graph::JobConfig::sink_gauges).
    pub fn sink_gauge(&self, node: &str) -> crate::telemetry::sinks::SinkGauge {
        let stats = self.stats.clone();
        crate::telemetry::sinks::SinkGauge {
            node: node.to_owned(),
            read: Arc::new(move || crate::telemetry::sinks::SinkReading {
                records: stats.records.load(Ordering::Relaxed),
                acked: stats.records_acked.load(Ordering::Relaxed),
                in_flight: stats.in_flight.load(Ordering::Relaxed),
                retries: stats.retries.load(Ordering::Relaxed),
                dead_letters: stats.dead_letter_records.load(Ordering::Relaxed),
                blocked_ns: stats.blocked.total_ns(),
                latency: stats.ack_latency.summary(),
            }),
        }
    }

    /// The most memory one subtask of this sink holds toward its destination: the records held
    /// for their watermark and the requests outstanding (`max_held_bytes` +
    /// `max_pending_bytes`), for the job's memory budget.
    pub fn budget_bytes(&self) -> u64 {
        (self.max_held_bytes + self.max_pending_bytes) as u64
    }

    /// Check the settings without connecting anywhere: the URL's form, the bounds, and for
    /// HTTPS the CA and client certificate files.
    pub fn validate(&self) -> Result<(), HttpConfigError> {
        self.checked().map(|_| ())
    }

    /// Every check of [`validate`](HttpSinkConfig::validate), and what they found: the URL,
    /// and for `https://` the TLS settings (read once: a CA file that changes between two
    /// reads cannot make them disagree).
    fn checked(&self) -> Result<(Target, Option<TlsSettings>), HttpConfigError> {
        let found = self.tls()?;
        if !(1..=256).contains(&self.max_in_flight) {
            return Err(HttpConfigError::MaxInFlight { max_in_flight: self.max_in_flight });
        }
        if self.batch_records == 0 {
            return Err(HttpConfigError::BatchRecords);
        }
        Ok(found)
    }

    /// The URL, and for `https://` the TLS settings and the name the server's certificate must
    /// carry.
    fn tls(&self) -> Result<(Target, Option<TlsSettings>), HttpConfigError> {
        let target = parse_url(&self.url)?;
        let Some(host) = &target.tls else {
            if self.ca_file.is_some() || self.client_cert.is_some() {
                return Err(HttpConfigError::TlsForHttp { url: self.url.clone() });
            }
            return Ok((target, None));
        };
        let config = crate::io::tls::client_config(self.ca_file.as_deref(), self.client_cert.as_ref())
            .map_err(HttpConfigError::Tls)?;
        let name = crate::io::tls::server_name(host).map_err(HttpConfigError::Tls)?;
        Ok((target, Some((config, name))))
    }
}

/// Totals of an HTTP sink's subtasks, readable while the job runs.
#[derive(Debug, Default)]
pub struct HttpSinkStats {
    /// Records taken by `write`.
    pub records: AtomicU64,
    /// Records in batches answered 2xx.
    pub records_acked: AtomicU64,
    /// POST requests sent, retries included.
    pub requests: AtomicU64,
    /// Retries scheduled (after a 5xx, 408, 429, connection error or timeout).
    pub retries: AtomicU64,
    /// Batches sent to the dead-letter file.
    pub dead_letter_batches: AtomicU64,
    /// Records in those batches.
    pub dead_letter_records: AtomicU64,
    /// Requests outstanding now (on a connection or waiting for a retry; at most
    /// `max_in_flight` per subtask), summed over subtasks. Batches queued behind them are in
    /// the sink's pending bytes, not here.
    pub in_flight: AtomicU64,
    /// The largest `in_flight` seen by one subtask.
    pub in_flight_max: AtomicU64,
    /// Time `write` waited because `max_in_flight` batches were outstanding (counted while it
    /// lasts: `total_ns` grows during an outage, not after it).
    pub blocked: crate::telemetry::time::Stopwatch,
    /// Connections opened.
    pub connections: AtomicU64,
    /// Batch latency, sealed to answered 2xx (retries included).
    pub ack_latency: crate::telemetry::sinks::AckLatency,
}

/// The TLS settings of every connection of an `https://` sink, and the name to verify.
type TlsSettings = crate::io::tls::Settings;

/// A batch of records on its way.
#[derive(Debug)]
struct Batch {
    key: String,
    /// The request's length (head and body), counted in `pending_bytes` until it settles.
    bytes: usize,
    /// When it was sealed (its first attempt).
    sealed: Instant,
    records: u64,
    /// The write position of its first record (the least of its records'; for records held
    /// by event time, the first of their time's): what `acknowledged` waits for.
    first: u64,
    /// The whole request (head and body); empty while the kernel holds it (plain HTTP: over
    /// TLS the kernel holds the ciphertext, `Conn::tx`).
    request: Vec<u8>,
    /// Where the body starts in `request`.
    body_at: usize,
    /// Attempts that failed so far.
    failures: u32,
    /// When its first attempt failed.
    failing_since: Option<Instant>,
}

/// One request on a connection.
#[derive(Debug)]
struct Exchange {
    batch: Batch,
    /// Request bytes (over TLS: ciphertext bytes) the kernel reported sent.
    sent: usize,
    request_len: usize,
    response: Option<Response>,
    error: Option<String>,
    deadline: Instant,
}

/// One keep-alive connection with at most one exchange.
#[derive(Debug, Default)]
struct Conn {
    stream: Option<TcpStream>,
    /// HTTPS: the TLS session of `stream`.
    tls: Option<Tls>,
    /// HTTPS: the request's ciphertext; empty while the kernel holds it.
    tx: Vec<u8>,
    /// Response bytes so far (over TLS: ciphertext not yet decrypted); empty while the kernel
    /// holds it.
    rx: Vec<u8>,
    /// Where parsing the response in `rx` stands (each receive goes on from there).
    parser: ResponseParser,
    exchange: Option<Exchange>,
    send_in_kernel: bool,
    recv_in_kernel: bool,
}

impl Conn {
    /// Forget the connection (and its TLS session).
    fn close(&mut self) {
        self.stream = None;
        self.tls = None;
    }

    /// Abort the exchange: shut the socket down so the kernel completes its operations soon
    /// (a pending receive returns 0), and never reuse the connection.
    fn fail(&mut self, why: String) {
        if let Some(ex) = &mut self.exchange {
            ex.error.get_or_insert(why);
        }
        if let Some(s) = &self.stream {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Operation kind in the low bit of a tag; the connection index above it.
const SEND: u64 = 0;
const RECV: u64 = 1;

/// How a record names itself for idempotency by content: it appends its identity (unique
/// among the records completed at the same event time) to the string and returns that event
/// time (a window result's end). See the module docs.
pub type RecordKeyFn<T> = Arc<dyn Fn(&T, &mut String) -> u64 + Send + Sync>;

/// A window result's name: its key (and its count, for an update after allowed lateness:
/// each update counts more records), completed at the window's end.
pub fn window_result_key(r: &crate::window::WindowResult, identity: &mut String) -> u64 {
    use std::fmt::Write as _;
    let _ = write!(identity, "{}", r.key);
    if r.late != 0 {
        let _ = write!(identity, ".{}", r.count);
    }
    r.end_ns
}

/// Why an HTTP sink's settings cannot work ([`HttpSinkConfig::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpConfigError {
    /// The URL is not one the sink can POST to.
    #[error("{problem}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong with it.
        problem: String,
    },
    /// `max_in_flight` outside 1 to 256.
    #[error("max_in_flight {max_in_flight} is out of range; use 1 to 256")]
    MaxInFlight {
        /// The value given.
        max_in_flight: usize,
    },
    /// `batch_records` 0.
    #[error("batch_records 0; a batch needs at least 1 record")]
    BatchRecords,
    /// `ca_file` or `client_cert` with an `http://` URL.
    #[error("ca_file and client_cert are for https:// URLs, not `{url}`")]
    TlsForHttp {
        /// The URL.
        url: String,
    },
    /// The CA file, the client certificate or key, or the server's name does not load.
    #[error("{0}")]
    Tls(String),
}

/// Why an HTTP sink failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpSinkError {
    /// A bad setting (URL, bounds), or io_uring unavailable.
    #[error("http sink {sink}: {reason}")]
    Setup {
        /// The sink subtask (`node#index`).
        sink: String,
        /// What is wrong.
        reason: String,
    },
    /// io_uring failed.
    #[error("http sink {sink}: io_uring {what}: {}", io_error_text(source))]
    Uring {
        /// The sink subtask.
        sink: String,
        /// `submit` or `wait`.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A batch failed more often than `max_retries` allows and for longer than `retry_for`
    /// (5xx, 408, 429, connection errors).
    #[error(
        "http sink {sink}: POST {url} (idempotency key {key}, {records} records) failed {attempts} times over {}, \
         last: {last}; giving up (max_retries {max_retries} and retry_for {}: raise retry_for to ride out a longer \
         outage)",
        crate::util::duration_text(*failing_for),
        crate::util::duration_text(*retry_for)
    )]
    GaveUp {
        /// The sink subtask.
        sink: String,
        /// The URL.
        url: String,
        /// The batch's idempotency key.
        key: String,
        /// Records in the batch.
        records: u64,
        /// Times it failed.
        attempts: u32,
        /// The last failure.
        last: String,
        /// The setting.
        max_retries: u32,
        /// How long it had been failing.
        failing_for: Duration,
        /// The setting.
        retry_for: Duration,
    },
    /// The API refused a batch (4xx) and no dead-letter file is configured.
    #[error(
        "http sink {sink}: POST {url} (idempotency key {key}, {records} records) was refused: {why}; no dead_letter \
         file is configured, so the job fails rather than drop the batch"
    )]
    Refused {
        /// The sink subtask.
        sink: String,
        /// The URL.
        url: String,
        /// The batch's idempotency key.
        key: String,
        /// Records in the batch.
        records: u64,
        /// The HTTP status.
        status: u16,
        /// Status line and the start of the body.
        why: String,
    },
    /// The dead-letter file could not be written or fsynced.
    #[error("http sink {sink}: cannot write the dead-letter file {}: {}", path.display(), io_error_text(source))]
    DeadLetter {
        /// The sink subtask.
        sink: String,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A record could not be written as JSON.
    #[error("http sink {sink}: cannot write a record as JSON: {reason}")]
    Encode {
        /// The sink subtask.
        sink: String,
        /// Why.
        reason: String,
    },
    /// HTTPS: the server's certificate failed verification (untrusted, another host's,
    /// expired), or the server refused ours. Not retried: it will not mend by itself.
    #[error("http sink {sink}: {url}: {reason}")]
    Tls {
        /// The sink subtask.
        sink: String,
        /// The URL.
        url: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// The checkpoint being restored holds what this sink cannot read.
    #[error("http sink {sink}: checkpoint {checkpoint}: unreadable held records: {reason}")]
    Restore {
        /// The sink subtask.
        sink: String,
        /// The checkpoint.
        checkpoint: u64,
        /// Why.
        reason: String,
    },
}

impl OperatorFailure for HttpSinkError {
    fn is_retryable(&self) -> bool {
        matches!(self, HttpSinkError::GaveUp { .. })
    }
}

/// POSTs batches of records to a REST API. See the module docs.
pub struct HttpSink<T> {
    config: HttpSinkConfig,
    target: Option<Target>,
    /// HTTPS: every connection's TLS settings.
    tls: Option<TlsSettings>,
    name: String,
    /// `<prefix>/<node>-<subtask>`.
    key_base: String,
    ring: Option<Uring>,
    conns: Vec<Conn>,
    /// Batches waiting to be retried, with when.
    retry: Vec<(Instant, Batch)>,
    /// Batches sealed and waiting for a connection (released for a watermark, taken while a
    /// barrier was on its way, restored from a checkpoint), oldest first.
    queue: VecDeque<Batch>,
    /// Bytes of the requests outstanding (queued, in flight, waiting for a retry).
    pending_bytes: usize,
    /// The body being filled, and its record count.
    body: Vec<u8>,
    body_records: u64,
    /// Request buffers to reuse.
    pool: Vec<Vec<u8>>,
    epoch: u64,
    seq: u64,
    /// Idempotency by content: how records name themselves, the records held per event time
    /// (identity, JSON), and the last watermark.
    record_key: Option<RecordKeyFn<T>>,
    held: BTreeMap<u64, Vec<(String, String)>>,
    /// Bytes of the identities and JSON held.
    held_bytes: usize,
    watermark: u64,
    dead_letter: Option<std::fs::File>,
    /// Write positions, for `acknowledged`: records written by this subtask so far; the
    /// first written of each event time held (0: held since a restore); the first of the
    /// body being filled.
    written: u64,
    held_first: BTreeMap<u64, u64>,
    filling_first: u64,
    poisoned: Poisoned,
    _record: PhantomData<fn(&T)>,
}

impl<T> std::fmt::Debug for HttpSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink").field("name", &self.name).field("url", &self.config.url).finish()
    }
}

impl<T> HttpSink<T> {
    /// An HTTP sink for one subtask. Never fails: a setup error (a bad URL, io_uring
    /// unavailable) poisons the sink and its first `write` or `finish` fails the job with it.
    /// It connects when the first batch is ready.
    pub fn new(config: HttpSinkConfig, info: &SubtaskInfo) -> HttpSink<T> {
        let name = info.name();
        let mut poisoned = Poisoned::default();
        let (target, tls) = match config.checked() {
            Ok((target, tls)) => (Some(target), tls),
            Err(e) => {
                poisoned.poison(HttpSinkError::Setup { sink: name.clone(), reason: e.to_string() });
                (None, None)
            }
        };
        let max_in_flight = config.max_in_flight.clamp(1, 256);
        let ring = match Uring::new(2 * max_in_flight as u32) {
            Ok(r) => Some(r),
            Err(e) => {
                poisoned.poison(HttpSinkError::Setup { sink: name.clone(), reason: e.to_string() });
                None
            }
        };
        let prefix: String =
            config.key_prefix.chars().filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c)).collect();
        HttpSink {
            key_base: format!("{prefix}/{}-{}", info.node, info.index),
            target,
            tls,
            name,
            ring,
            conns: (0..max_in_flight).map(|_| Conn::default()).collect(),
            retry: Vec::new(),
            queue: VecDeque::new(),
            pending_bytes: 0,
            body: Vec::new(),
            body_records: 0,
            pool: Vec::new(),
            epoch: 0,
            seq: 0,
            record_key: None,
            held: BTreeMap::new(),
            held_bytes: 0,
            watermark: 0,
            dead_letter: None,
            written: 0,
            held_first: BTreeMap::new(),
            filling_first: 0,
            poisoned,
            config: HttpSinkConfig { max_in_flight, batch_records: config.batch_records.max(1), ..config },
            _record: PhantomData,
        }
    }

    /// Name batches by their content (see the module docs): `key` appends a record's identity
    /// and returns the event time that completes it. The input must carry watermarks (event
    /// time): records wait for the watermark to pass their time (at most `max_held_bytes`).
    pub fn with_record_keys(mut self, key: impl Fn(&T, &mut String) -> u64 + Send + Sync + 'static) -> HttpSink<T> {
        self.record_key = Some(Arc::new(key));
        self
    }

    /// The setup error that poisoned this sink, if any.
    pub fn setup_error(&self) -> Option<&str> {
        self.poisoned.text()
    }

    fn check(&self) -> Result<(), Halt> {
        self.poisoned.check()
    }

    fn poison(&mut self, error: HttpSinkError) -> Halt {
        self.poisoned.poison(error)
    }

    /// io_uring failed (`what`: submit, wait).
    fn uring_failed(&mut self, what: &'static str, source: std::io::Error) -> Halt {
        let sink = self.name.clone();
        self.poison(HttpSinkError::Uring { sink, what, source })
    }

    /// The next request deadline or retry due, if any.
    fn next_due(&self) -> Option<Instant> {
        let deadlines = self.conns.iter().filter_map(|c| c.exchange.as_ref().map(|e| e.deadline));
        deadlines.chain(self.retry.iter().map(|(due, _)| *due)).min()
    }

    /// Batches outstanding: on a connection, waiting for a retry, or queued.
    fn outstanding(&self) -> usize {
        self.busy() + self.queue.len()
    }

    /// Batches that hold a connection or a retry: at most `max_in_flight`.
    fn busy(&self) -> usize {
        self.conns.iter().filter(|c| c.exchange.is_some()).count() + self.retry.len()
    }

    /// Publish `busy()` (requests in flight or waiting for a retry; never more than
    /// `max_in_flight`) to the stats, given its value `before` the change.
    fn publish_in_flight(&self, before: usize) {
        let now = self.busy();
        let stats = &self.config.stats;
        if now > before {
            stats.in_flight.fetch_add((now - before) as u64, Ordering::Relaxed);
        } else {
            stats.in_flight.fetch_sub((before - now) as u64, Ordering::Relaxed);
        }
        stats.in_flight_max.fetch_max(now as u64, Ordering::Relaxed);
    }

    /// Turn the body being filled into a request and queue it (sent as soon as a connection
    /// is free; `write` blocks while batches wait, see `make_room`).
    fn seal(&mut self) -> Result<(), Halt> {
        if self.body_records == 0 {
            return Ok(());
        }
        let key = format!("{}/{}/{}", self.key_base, self.epoch, self.seq);
        self.seq += 1;
        self.seal_as(key)
    }

    /// Append one record's JSON to the body being filled.
    fn push_json(&mut self, json: &[u8]) {
        if self.config.body == BodyFormat::JsonArray {
            self.body.push(if self.body_records == 0 { b'[' } else { b',' });
        }
        self.body.extend_from_slice(json);
        if self.config.body == BodyFormat::JsonLines {
            self.body.push(b'\n');
        }
        self.body_records += 1;
    }

    /// Held records went over `max_held_bytes` (no watermark comes, or it lags far behind):
    /// send the oldest event time's records now.
    #[cold]
    fn release_oldest(&mut self) -> Result<(), Halt> {
        let Some(&oldest) = self.held.keys().next() else { return Ok(()) };
        tracing::warn!(
            sink = %self.name,
            held_bytes = self.held_bytes,
            limit = self.config.max_held_bytes,
            "records held for their watermark exceed max_held_bytes: sending the oldest event time's now (their \
             batches may differ from a replay's, so deduplication of them is no longer exact); does the input \
             carry watermarks (event time)?"
        );
        self.release(oldest)
    }

    /// Send the records held for event times up to `w`: per time, sorted by identity, in
    /// batches named by time and index.
    fn release(&mut self, w: u64) -> Result<(), Halt> {
        while let Some(entry) = self.held.first_entry() {
            if *entry.key() > w {
                break;
            }
            let (time, mut records) = entry.remove_entry();
            self.filling_first = self.held_first.remove(&time).unwrap_or(0);
            self.held_bytes -= records.iter().map(|(i, j)| i.len() + j.len()).sum::<usize>();
            records.sort_unstable();
            for chunk in records.chunks(self.config.batch_records) {
                // Named by what it holds: the first and last identity and a CRC-32 of all of
                // them, so a batch released later for the same time (an update after allowed
                // lateness, a result behind an input that went idle) gets a key of its own.
                let mut crc = crc32fast::Hasher::new();
                for (identity, json) in chunk {
                    crc.update(identity.as_bytes());
                    crc.update(b"\n");
                    self.push_json(json.as_bytes());
                }
                let (first, last) = (&chunk[0].0, &chunk[chunk.len() - 1].0);
                let key = format!("{}/w{time}/{first}..{last}/{:08x}", self.key_base, crc.finalize());
                self.seal_as(key)?;
            }
        }
        Ok(())
    }

    /// Turn the body being filled into a request named `key`, queue it, and start what a free
    /// connection can take. Never waits: `write` does (`make_room`), between records.
    fn seal_as(&mut self, key: String) -> Result<(), Halt> {
        if self.config.body == BodyFormat::JsonArray {
            self.body.push(b']');
        }
        let target = self.target.as_ref().expect("a sink with a bad URL is poisoned");
        let mut request = self.pool.pop().unwrap_or_default();
        request.clear();
        write_post_head(&mut request, target, self.config.body.content_type(), self.body.len(), &key);
        let body_at = request.len();
        request.extend_from_slice(&self.body);
        self.body.clear();
        let batch = Batch {
            key,
            bytes: request.len(),
            sealed: Instant::now(),
            records: self.body_records,
            first: self.filling_first,
            request,
            body_at,
            failures: 0,
            failing_since: None,
        };
        self.body_records = 0;
        self.enqueue(batch)
    }

    /// Queue `batch` behind the others and start what fits.
    fn enqueue(&mut self, batch: Batch) -> Result<(), Halt> {
        let before = self.busy();
        self.pending_bytes += batch.bytes;
        self.queue.push_back(batch);
        let pumped = self.pump();
        self.publish_in_flight(before);
        pumped
    }

    /// Start queued batches, oldest first, while fewer than `max_in_flight` hold a connection
    /// or a retry.
    fn pump(&mut self) -> Result<(), Halt> {
        while self.busy() < self.config.max_in_flight {
            let Some(batch) = self.queue.pop_front() else { break };
            self.start(batch)?;
        }
        Ok(())
    }

    /// Block while batches wait for a connection — that is backpressure: the subtask reads no
    /// more input meanwhile — except while a checkpoint's barrier is on its way: then the sink
    /// takes records (queued, up to `max_pending_bytes`) so that the barrier reaches it and
    /// passes at once, with what is queued in the checkpoint; at the bound it declines that
    /// checkpoint, naming the destination. A stop ends the wait (what is outstanding is
    /// replayed from the last checkpoint). The wait is counted in `blocked` while it lasts and
    /// named in the subtask's waiting note once it is long.
    fn make_room(&mut self) -> Result<(), Halt> {
        if self.queue.is_empty() {
            return Ok(());
        }
        let waited = Instant::now();
        let wait = self.config.stats.blocked.start();
        let mut shown = false;
        let result = loop {
            if self.queue.is_empty() {
                break Ok(());
            }
            if outside::stop_requested() {
                break Err(Halt::Stopped);
            }
            let (name, url, bytes) = (&self.name, &self.config.url, self.pending_bytes);
            if outside::take_for_barrier(bytes < self.config.max_pending_bytes, || {
                format!(
                    "http sink {name} holds {} toward {url} (max_pending_bytes) and has waited {:.1} s for a \
                     connection: the barrier cannot reach it until the API answers",
                    crate::telemetry::bytes(bytes as u64),
                    waited.elapsed().as_secs_f64()
                )
            }) {
                break Ok(());
            }
            if let Err(e) = self.drive(true) {
                break Err(e);
            }
            let now = Instant::now();
            if now - waited >= outside::SHOW_AFTER {
                shown = true;
                let (name, url) = (&self.name, &self.config.url);
                let (busy, queued) = (self.busy(), self.queue.len());
                crate::telemetry::waiting::waiting_on(|| {
                    format!("http sink {name}: {busy} requests to {url} unanswered, {queued} batches queued")
                });
            }
        };
        self.config.stats.blocked.stop(wait);
        if shown && self.retry.is_empty() {
            crate::telemetry::waiting::waiting_over();
        }
        result
    }

    /// Put `batch` on a free connection (connecting if needed), or schedule its retry if the
    /// connection cannot be made. The caller made sure a connection is free.
    fn start(&mut self, batch: Batch) -> Result<(), Halt> {
        let free = |c: &Conn| c.exchange.is_none() && !c.send_in_kernel && !c.recv_in_kernel;
        let i = self
            .conns
            .iter()
            .position(|c| free(c) && c.stream.is_some())
            .or_else(|| self.conns.iter().position(free))
            .expect("fewer than max_in_flight batches outstanding leaves a connection free");
        if self.conns[i].stream.is_none() {
            let target = self.target.as_ref().expect("a sink with a bad URL is poisoned");
            let timeout = self.config.connect_timeout;
            let mut stream = match connect(&target.authority, timeout) {
                Ok(s) => s,
                Err(e) => return self.schedule_retry(batch, format!("connect to {}: {e}", target.authority), None),
            };
            let _ = stream.set_nodelay(true);
            if let Some((config, name)) = &self.tls {
                match Tls::handshake(&mut stream, config, name, timeout) {
                    Ok(tls) => self.conns[i].tls = Some(tls),
                    Err(HandshakeError::Certificate { kind, detail }) => {
                        let (sink, url) = (self.name.clone(), self.config.url.clone());
                        let reason = HandshakeError::http_reason(kind, &detail);
                        return Err(self.poison(HttpSinkError::Tls { sink, url, reason }));
                    }
                    Err(HandshakeError::Other(why)) => {
                        return self.schedule_retry(batch, format!("{}: {why}", target.authority), None);
                    }
                }
            }
            self.conns[i].stream = Some(stream);
            self.config.stats.connections.fetch_add(1, Ordering::Relaxed);
        }
        let conn = &mut self.conns[i];
        let fd = conn.stream.as_ref().expect("connected above").as_raw_fd();
        let mut rx = std::mem::take(&mut conn.rx);
        rx.clear();
        rx.reserve(RECV_CHUNK_BYTES);
        conn.parser = ResponseParser::default();
        let mut batch = batch;
        // Plain HTTP lends the request itself to the kernel; TLS its ciphertext (the request
        // stays with the batch, for a retry).
        let request = match &mut conn.tls {
            None => std::mem::take(&mut batch.request),
            Some(tls) => {
                tls.plain.clear();
                let mut tx = std::mem::take(&mut conn.tx);
                if let Err(why) = tls.seal(&batch.request, &mut tx) {
                    conn.tx = tx;
                    conn.close();
                    return self.schedule_retry(batch, why, None);
                }
                tx
            }
        };
        let request_len = request.len();
        let ring = self.ring.as_mut().expect("a sink with a ring is not poisoned at setup");
        // Send and receive go to the kernel together: one system call per request.
        let queued = ring
            .send(fd, request, 0, (i as u64) << 1 | SEND)
            .and_then(|()| ring.recv(fd, rx, (i as u64) << 1 | RECV))
            .and_then(|()| ring.submit());
        if let Err(e) = queued {
            return Err(self.uring_failed("submit", e));
        }
        conn.send_in_kernel = true;
        conn.recv_in_kernel = true;
        conn.exchange = Some(Exchange {
            batch,
            sent: 0,
            request_len,
            response: None,
            error: None,
            deadline: Instant::now() + self.config.request_timeout,
        });
        self.config.stats.requests.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One round: start due retries, time out late requests, wait (if `block`) for a
    /// completion or the next deadline, handle what completed, settle finished exchanges.
    fn drive(&mut self, block: bool) -> Result<(), Halt> {
        let before = self.busy();
        let result = self.drive_inner(block);
        self.publish_in_flight(before);
        result
    }

    fn drive_inner(&mut self, block: bool) -> Result<(), Halt> {
        let now = Instant::now();
        while let Some(pos) = self.retry.iter().position(|(due, _)| *due <= now) {
            let (_, batch) = self.retry.swap_remove(pos);
            self.start(batch)?;
        }
        let timeout = self.config.request_timeout;
        for conn in &mut self.conns {
            if let Some(ex) = &conn.exchange
                && ex.error.is_none()
                && ex.response.is_none()
                && ex.deadline <= now
            {
                conn.fail(format!("no response within {}", crate::util::duration_text(timeout)));
            }
        }
        if block {
            let next = self.next_due();
            let wait = next.map_or(outside::WAIT_STEP, |t| t.saturating_duration_since(now)).min(outside::WAIT_STEP);
            let ring = self.ring.as_mut().expect("a sink with a ring is not poisoned at setup");
            // Nothing in the kernel (every batch waits for a retry): sleep until one is due,
            // never wait for a completion that cannot come.
            if ring.in_kernel() == 0 {
                std::thread::sleep(wait);
            } else if let Err(e) = ring.wait(Some(wait.max(Duration::from_micros(100)))) {
                return Err(self.uring_failed("wait", e));
            }
        }
        self.reap()?;
        self.pump()
    }

    /// Handle every completion that is ready (no system call), then settle exchanges whose
    /// operations are all out of the kernel.
    fn reap(&mut self) -> Result<(), Halt> {
        while let Some(c) = self.ring.as_mut().and_then(|r| r.next_completion()) {
            self.completed(c)?;
        }
        for i in 0..self.conns.len() {
            let c = &self.conns[i];
            let settled = c.exchange.as_ref().is_some_and(|e| e.error.is_some() || e.response.is_some());
            if settled && !c.send_in_kernel && !c.recv_in_kernel {
                self.settle(i)?;
            }
        }
        Ok(())
    }

    fn completed(&mut self, c: Completion) -> Result<(), Halt> {
        let i = (c.tag >> 1) as usize;
        let max_response = self.config.max_response_bytes;
        let conn = &mut self.conns[i];
        let result = c.bytes();
        let buffer = c.buffer.expect("sends and receives lend a buffer");
        let Some(ex) = conn.exchange.as_mut() else { unreachable!("operations belong to an exchange") };
        if c.tag & 1 == SEND {
            conn.send_in_kernel = false;
            // Where the lent buffer goes back: the batch (plain HTTP) or the connection (TLS).
            let home = if conn.tls.is_some() { &mut conn.tx } else { &mut ex.batch.request };
            match result {
                Err(code) => {
                    *home = buffer;
                    // A server may answer and close before reading the whole request.
                    if ex.response.is_none() {
                        conn.fail(format!("send: {}", errno_text(code)));
                    }
                }
                Ok(n) => {
                    ex.sent += n;
                    if n > 0 && ex.sent < ex.request_len && ex.error.is_none() && ex.response.is_none() {
                        let fd = conn.stream.as_ref().expect("an exchange has a connection").as_raw_fd();
                        let ring = self.ring.as_mut().expect("a sink with a ring is not poisoned at setup");
                        if let Err(e) = ring.send(fd, buffer, ex.sent, c.tag).and_then(|()| ring.submit()) {
                            return Err(self.uring_failed("submit", e));
                        }
                        conn.send_in_kernel = true;
                    } else {
                        *home = buffer;
                        if ex.sent < ex.request_len && ex.response.is_none() {
                            conn.fail("send: the kernel sent 0 bytes".into());
                        }
                    }
                }
            }
            return Ok(());
        }
        conn.recv_in_kernel = false;
        let mut rx = buffer;
        let n = match result {
            Err(code) => {
                conn.rx = rx;
                conn.fail(format!("receive: {}", errno_text(code)));
                return Ok(());
            }
            Ok(n) => n,
        };
        if ex.error.is_some() {
            conn.rx = rx;
            return Ok(());
        }
        // Over TLS the parser reads the decrypted bytes; the ciphertext buffer is reused.
        let mut eof = n == 0;
        let parsed = match &mut conn.tls {
            None => conn.parser.parse(&rx, eof, max_response).map(|p| (p, rx.len())),
            Some(tls) => {
                let opened = tls.open(&rx, eof);
                rx.clear();
                if let Err(why) = opened {
                    conn.rx = rx;
                    conn.fail(why);
                    return Ok(());
                }
                eof |= tls.closed;
                conn.parser.parse(&tls.plain, eof, max_response).map(|p| (p, tls.plain.len()))
            }
        };
        match parsed {
            Ok((Parsed::Complete(mut r, used), len)) => {
                // Bytes after the response were never asked for, or the server said it closes
                // (close_notify, or the end of the stream): do not use the connection again.
                r.keep_alive &= used == len && !eof;
                ex.response = Some(r);
                conn.rx = rx;
            }
            Ok((Parsed::Incomplete, got)) if eof => {
                conn.rx = rx;
                conn.fail(format!("the server closed the connection before a whole response ({got} bytes)"));
            }
            Ok((Parsed::Incomplete, _)) => {
                if rx.capacity() - rx.len() < RECV_CHUNK_BYTES / 4 {
                    rx.reserve(RECV_CHUNK_BYTES);
                }
                let fd = conn.stream.as_ref().expect("an exchange has a connection").as_raw_fd();
                let ring = self.ring.as_mut().expect("a sink with a ring is not poisoned at setup");
                if let Err(e) = ring.recv(fd, rx, c.tag).and_then(|()| ring.submit()) {
                    return Err(self.uring_failed("submit", e));
                }
                conn.recv_in_kernel = true;
            }
            Err(e) => {
                conn.rx = rx;
                conn.fail(e.to_string());
            }
        }
        Ok(())
    }

    /// The exchange on connection `i` is over: acknowledge, retry or dead-letter its batch.
    fn settle(&mut self, i: usize) -> Result<(), Halt> {
        let conn = &mut self.conns[i];
        let ex = conn.exchange.take().expect("settled exchanges exist");
        conn.rx.clear();
        if let Some(tls) = &mut conn.tls {
            tls.plain.clear();
        }
        let response = match (ex.response, ex.error) {
            (Some(r), _) => r,
            (None, error) => {
                conn.close();
                return self.schedule_retry(ex.batch, error.unwrap_or_default(), None);
            }
        };
        // A request the server answered before reading all of it leaves the rest in the
        // stream (and, over TLS, rustls out of step with it): never reuse that connection.
        if !response.keep_alive || ex.sent < ex.request_len {
            conn.close();
        }
        let stats = &self.config.stats;
        match response.status {
            200..=299 => {
                stats.records_acked.fetch_add(ex.batch.records, Ordering::Relaxed);
                stats.ack_latency.record(ex.batch.sealed.elapsed());
                self.pending_bytes -= ex.batch.bytes;
                self.pool.push(ex.batch.request);
                if self.retry.is_empty() {
                    crate::telemetry::waiting::waiting_over();
                }
                Ok(())
            }
            408 | 429 | 500..=599 => {
                let why = format!("HTTP {} {}{}", response.status, response.reason, quote(&response.body));
                self.schedule_retry(ex.batch, why, response.retry_after_s)
            }
            _ => self.dead_letter(ex.batch, &response),
        }
    }

    /// Retry `batch` after the backoff, or fail the job once it failed `max_retries + 1` times.
    fn schedule_retry(&mut self, mut batch: Batch, why: String, retry_after_s: Option<u64>) -> Result<(), Halt> {
        batch.failures += 1;
        let now = Instant::now();
        let failing_for = now - *batch.failing_since.get_or_insert(now);
        // An outage is ridden out by time: the batch waits (and the sink blocks: backpressure
        // upstream, memory bounded by max_in_flight) until it has failed max_retries times
        // *and* for retry_for.
        if batch.failures > self.config.max_retries && failing_for >= self.config.retry_for {
            return Err(self.poison(HttpSinkError::GaveUp {
                sink: self.name.clone(),
                url: self.config.url.clone(),
                key: batch.key.clone(),
                records: batch.records,
                attempts: batch.failures,
                last: why,
                max_retries: self.config.max_retries,
                failing_for,
                retry_for: self.config.retry_for,
            }));
        }
        self.config.stats.retries.fetch_add(1, Ordering::Relaxed);
        let backoff = self.config.backoff;
        let mut delay = backoff.delay(batch.failures);
        if let Some(s) = retry_after_s {
            delay = delay.max(Duration::from_secs(s).min(backoff.max_delay));
        }
        let attempts = batch.failures;
        self.retry.push((Instant::now() + delay, batch));
        let retrying = self.retry.len();
        crate::telemetry::waiting::waiting_on(|| {
            format!(
                "http sink {} retrying {retrying} batch{} ({attempts} attempts, failing for {:.1} s), last: {why}",
                self.name,
                if retrying == 1 { "" } else { "es" },
                failing_for.as_secs_f64()
            )
        });
        Ok(())
    }

    /// Write `batch` to the dead-letter file with the reason (or fail the job without one).
    fn dead_letter(&mut self, batch: Batch, response: &Response) -> Result<(), Halt> {
        let why = format!("HTTP {} {}", response.status, response.reason);
        let Some(path) = self.config.dead_letter.clone() else {
            return Err(self.poison(HttpSinkError::Refused {
                sink: self.name.clone(),
                url: self.config.url.clone(),
                key: batch.key.clone(),
                records: batch.records,
                status: response.status,
                why: format!("{why}{}", quote(&response.body)),
            }));
        };
        let line = serde_json::json!({
            "url": self.config.url,
            "idempotency_key": batch.key,
            "status": response.status,
            "reason": why,
            "response": String::from_utf8_lossy(&response.body[..response.body.len().min(QUOTE_BYTES)]),
            "records": batch.records,
            "body": String::from_utf8_lossy(&batch.request[batch.body_at..]),
        });
        let written = (|| -> std::io::Result<()> {
            if self.dead_letter.is_none() {
                self.dead_letter = Some(std::fs::OpenOptions::new().create(true).append(true).open(&path)?);
            }
            let file = self.dead_letter.as_mut().expect("opened above");
            // One write per line: lines of concurrent subtasks do not interleave (O_APPEND).
            let mut bytes = serde_json::to_vec(&line).expect("JSON values serialize");
            bytes.push(b'\n');
            file.write_all(&bytes)
        })();
        if let Err(e) = written {
            return Err(self.poison(HttpSinkError::DeadLetter { sink: self.name.clone(), path, source: e }));
        }
        self.pending_bytes -= batch.bytes;
        let stats = &self.config.stats;
        stats.dead_letter_batches.fetch_add(1, Ordering::Relaxed);
        stats.dead_letter_records.fetch_add(batch.records, Ordering::Relaxed);
        self.pool.push(batch.request);
        Ok(())
    }

    /// Seal the open batch and wait until every batch is answered (or dead-lettered); make
    /// the dead-letter file durable. The end of input waits so (named in the waiting note
    /// while it lasts); a stop ends the wait.
    fn drain(&mut self) -> Result<(), Halt> {
        self.check()?;
        self.seal()?;
        let waited = Instant::now();
        let mut shown = false;
        while self.outstanding() > 0 {
            if outside::stop_requested() {
                return Err(Halt::Stopped);
            }
            self.drive(true)?;
            if waited.elapsed() >= outside::SHOW_AFTER {
                shown = true;
                let (name, url, left) = (&self.name, &self.config.url, self.outstanding());
                crate::telemetry::waiting::waiting_on(|| {
                    format!(
                        "http sink {name}: the end of input waits for {left} batches to {url}, for {:.1} s",
                        waited.elapsed().as_secs_f64()
                    )
                });
            }
        }
        if shown {
            crate::telemetry::waiting::waiting_over();
        }
        if let Some(f) = &self.dead_letter
            && let Err(e) = f.sync_all()
        {
            let path = self.config.dead_letter.clone().unwrap_or_default();
            return Err(self.poison(HttpSinkError::DeadLetter { sink: self.name.clone(), path, source: e }));
        }
        Ok(())
    }

    /// Checkpoint `checkpoint_id`, at once: the open batch is sealed, and every batch not yet
    /// answered (queued, in flight, waiting for a retry) goes into the checkpoint with its
    /// idempotency key, beside the records held for their watermark. Nothing waits for the
    /// API: a restore sends those batches again under the same keys. Batches after the barrier
    /// belong to epoch `checkpoint_id` (their keys start over from sequence 0).
    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        self.check()?;
        self.seal()?;
        self.epoch = checkpoint_id;
        self.seq = 0;
        let mut batches = Vec::new();
        // Oldest first: those on a connection or waiting for a retry, then the queue.
        for (i, conn) in self.conns.iter().enumerate() {
            if let Some(ex) = &conn.exchange {
                let request = if ex.batch.request.is_empty() {
                    // Plain HTTP lends the request itself to the kernel while it sends.
                    self.ring.as_ref().and_then(|r| r.lent((i as u64) << 1 | SEND)).unwrap_or_default()
                } else {
                    &ex.batch.request[..]
                };
                batches.push(Unsent::of(&ex.batch, request)?);
            }
        }
        for (_, batch) in &self.retry {
            batches.push(Unsent::of(batch, &batch.request)?);
        }
        for batch in &self.queue {
            batches.push(Unsent::of(batch, &batch.request)?);
        }
        if self.held.is_empty() && batches.is_empty() {
            return Ok(Vec::new());
        }
        let state =
            SinkState { version: STATE_VERSION, watermark: self.watermark, records: self.held.clone(), batches };
        Ok(serde_json::to_vec(&state).expect("the sink's state serializes"))
    }
}

impl<T> HttpSink<T> {
    /// Outstanding requests: drive them without blocking (start due retries, time out late
    /// requests, handle completions), and say when the next deadline or retry is due.
    fn timers(&mut self) -> Result<Option<Duration>, Halt> {
        if self.ring.is_none() || self.outstanding() == 0 {
            return Ok(None);
        }
        self.check()?;
        self.drive(false)?;
        let now = Instant::now();
        let next = self.next_due();
        // Completions come without a deadline: look again soon while requests are out.
        Ok(Some(
            next.map_or(Duration::from_millis(10), |t| t.saturating_duration_since(now)).min(Duration::from_millis(10)),
        ))
    }
}

impl<T: serde::Serialize> Sink<T> for HttpSink<T> {
    fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
        self.timers()
    }

    /// Records settled (a 2xx for their batch, or the dead-letter file) as a prefix of what
    /// this subtask wrote: the least write position still held, being filled, in flight or
    /// waiting for a retry, else everything written. Latency markers are timed then.
    fn acknowledged(&self) -> Option<u64> {
        let held = self.held_first.values().copied();
        let filling = (self.body_records > 0).then_some(self.filling_first);
        let in_flight = self.conns.iter().filter_map(|c| c.exchange.as_ref().map(|ex| ex.batch.first));
        let retrying = self.retry.iter().map(|(_, b)| b.first);
        Some(held.chain(filling).chain(in_flight).chain(retrying).fold(self.written, u64::min))
    }

    fn write(&mut self, record: &T) -> Result<(), Halt> {
        self.check()?;
        if let Some(key) = &self.record_key {
            let mut identity = String::new();
            let time = key(record, &mut identity);
            let json = match serde_json::to_string(record) {
                Ok(j) => j,
                Err(e) => {
                    return Err(self.poison(HttpSinkError::Encode { sink: self.name.clone(), reason: e.to_string() }));
                }
            };
            self.held_bytes += identity.len() + json.len();
            self.held.entry(time).or_default().push((identity, json));
            self.held_first.entry(time).or_insert(self.written);
            self.written += 1;
            self.config.stats.records.fetch_add(1, Ordering::Relaxed);
            // Already complete (an update after allowed lateness): no watermark will come for it.
            if time <= self.watermark {
                self.release(self.watermark)?;
            } else if self.held_bytes > self.config.max_held_bytes {
                self.release_oldest()?;
            }
            // Results a watermark released wait for connections: take no more meanwhile.
            return self.make_room();
        }
        if self.body_records == 0 {
            self.filling_first = self.written;
        }
        self.written += 1;
        if self.config.body == BodyFormat::JsonArray {
            self.body.push(if self.body_records == 0 { b'[' } else { b',' });
        }
        if let Err(e) = serde_json::to_writer(&mut self.body, record) {
            return Err(self.poison(HttpSinkError::Encode { sink: self.name.clone(), reason: e.to_string() }));
        }
        if self.config.body == BodyFormat::JsonLines {
            self.body.push(b'\n');
        }
        self.body_records += 1;
        self.config.stats.records.fetch_add(1, Ordering::Relaxed);
        if self.body_records as usize >= self.config.batch_records {
            self.seal()?;
            return self.make_room();
        }
        // Answers that arrived free their connections early (a look at the completion queue,
        // no system call).
        if self.ring.as_ref().is_some_and(|r| r.in_kernel() > 0) {
            let before = self.busy();
            self.reap()?;
            self.pump()?;
            self.publish_in_flight(before);
        }
        Ok(())
    }

    /// The watermark passed `w`: records held for times up to `w` are complete; send them.
    fn watermark(&mut self, w: u64) -> Result<(), Halt> {
        self.check()?;
        self.watermark = self.watermark.max(w);
        if self.held.first_key_value().is_some_and(|(t, _)| *t <= w) { self.release(w) } else { Ok(()) }
    }

    /// End of input: send the last batch, wait for every answer, close the connections.
    fn finish(&mut self) -> Result<(), Halt> {
        self.check()?;
        self.release(u64::MAX)?;
        self.drain()?;
        for c in &mut self.conns {
            c.close();
        }
        Ok(())
    }

    /// Checkpoint: what is not yet answered goes into the checkpoint, with its keys, and the
    /// barrier passes at once (see `snapshot_state`); the next batches are keyed by this
    /// checkpoint. Records held for their watermark go into the checkpoint too.
    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        if checkpoint_id == crate::checkpoint::FINAL {
            // The end of input completes every event time.
            self.check()?;
            self.release(u64::MAX)?;
        }
        self.snapshot_state(checkpoint_id)
    }

    /// A replay after checkpoint `id` keys its batches as the first run did after it
    /// (epoch `id`, sequence from 0; or by content), so the receiver can drop what it already
    /// has; records held at the checkpoint are held again.
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        if let Some((id, bytes)) = from {
            self.restore_held(id, &[bytes])?;
        }
        Ok(())
    }

    /// At another parallelism: the records each old subtask held go to one new subtask
    /// (old `i` to new `i % parallelism`), at the earliest of their watermarks. Batches keyed
    /// by epoch and sequence are keyed otherwise than in the first run after the checkpoint
    /// (other subtasks send other records), so the receiver cannot drop what it already has
    /// there: at-least-once for that span. Keys by content (`with_record_keys`) still match.
    fn restore_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        let parts: Vec<&[u8]> = from.split().map(|(_, b)| b.as_slice()).collect();
        self.restore_held(from.checkpoint_id, &parts)
    }

    /// Nothing to make visible: the API has (or will be sent) the records; keys dedup replays.
    fn checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<(), Halt> {
        self.check()
    }
}

impl<T> HttpSink<T> {
    /// Restore checkpoint `id`: batches keyed by epoch `id` from sequence 0; the records held
    /// in `parts` (snapshots of one or several old subtasks) held again; the batches they had
    /// not had answered queued again under their keys, before anything this run sends.
    fn restore_held(&mut self, id: u64, parts: &[&[u8]]) -> Result<(), Halt> {
        self.epoch = id;
        self.seq = 0;
        let mut watermark: Option<u64> = None;
        for bytes in parts.iter().filter(|b| !b.is_empty()) {
            let state = match serde_json::from_slice::<SinkState>(bytes) {
                Ok(s) if s.version <= STATE_VERSION => s,
                Ok(s) => {
                    let reason = format!(
                        "its state is version {}, this build reads up to {STATE_VERSION} (restore it with the version \
                         that took it)",
                        s.version
                    );
                    return Err(self.poison(HttpSinkError::Restore {
                        sink: self.name.clone(),
                        checkpoint: id,
                        reason,
                    }));
                }
                Err(e) => {
                    return Err(self.poison(HttpSinkError::Restore {
                        sink: self.name.clone(),
                        checkpoint: id,
                        reason: e.to_string(),
                    }));
                }
            };
            watermark = Some(watermark.map_or(state.watermark, |w| w.min(state.watermark)));
            self.held_bytes += state.records.values().flatten().map(|(i, j)| i.len() + j.len()).sum::<usize>();
            for (t, mut records) in state.records {
                // Written before anything this run writes.
                self.held_first.insert(t, 0);
                self.held.entry(t).or_default().append(&mut records);
            }
            let Some(target) = self.target.as_ref() else { continue };
            for unsent in state.batches {
                let mut request = Vec::with_capacity(unsent.body.len() + 256);
                write_post_head(&mut request, target, self.config.body.content_type(), unsent.body.len(), &unsent.key);
                let body_at = request.len();
                request.extend_from_slice(unsent.body.as_bytes());
                let batch = Batch {
                    key: unsent.key,
                    bytes: request.len(),
                    sealed: Instant::now(),
                    records: unsent.records,
                    first: 0,
                    request,
                    body_at,
                    failures: 0,
                    failing_since: None,
                };
                self.pending_bytes += batch.bytes;
                self.queue.push_back(batch);
            }
        }
        if let Some(w) = watermark {
            self.watermark = w;
        }
        Ok(())
    }
}

/// The version of what an HTTP sink's snapshot holds (1: held records only; 2: and the batches
/// not yet answered).
const STATE_VERSION: u32 = 2;

/// What an HTTP sink's snapshot holds: records waiting for their watermark, and batches not
/// yet answered, with their keys (sent again at a restore).
#[derive(serde::Serialize, serde::Deserialize)]
struct SinkState {
    /// 1 when absent (the first format had no version and no batches).
    #[serde(default = "first_version")]
    version: u32,
    watermark: u64,
    records: BTreeMap<u64, Vec<(String, String)>>,
    #[serde(default)]
    batches: Vec<Unsent>,
}

fn first_version() -> u32 {
    1
}

/// A batch the checkpoint holds: its key, its record count and its body.
#[derive(serde::Serialize, serde::Deserialize)]
struct Unsent {
    key: String,
    records: u64,
    body: String,
}

impl Unsent {
    /// `batch`, whose whole request is `request` (head and body).
    fn of(batch: &Batch, request: &[u8]) -> Result<Unsent, Halt> {
        let body = request.get(batch.body_at..).unwrap_or_default();
        // The body is JSON the sink wrote: UTF-8.
        let body = String::from_utf8(body.to_vec()).map_err(|e| Halt::failed(format!("a batch body: {e}")))?;
        Ok(Unsent { key: batch.key.clone(), records: batch.records, body })
    }
}

impl HttpSink<crate::window::WindowResult> {
    /// Name batches of window results by content: window end, and key (see the module docs).
    pub fn window_results(self) -> HttpSink<crate::window::WindowResult> {
        self.with_record_keys(window_result_key)
    }
}

impl<T> Drop for HttpSink<T> {
    fn drop(&mut self) {
        // Shut the sockets down first, so that dropping the ring finds its receives completing.
        for c in &self.conns {
            if let Some(s) = &c.stream {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        let before = self.busy();
        self.config.stats.in_flight.fetch_sub(before as u64, Ordering::Relaxed);
    }
}
