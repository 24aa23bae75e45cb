//! The TCP sink: a stream of newline- or length-delimited records to `host:port`, sent
//! through io_uring with a bounded number of bytes in flight.
//!
//! Two buffers: `write` encodes into one while the other is in the kernel (one send at a time,
//! so a short send can be continued without reordering the stream). The gathered bytes are
//! sent once they reach `batch_bytes`, or once the first of them has waited `linger` (checked
//! at each record), whichever comes first, and only when no send is in flight; so one system
//! call carries many records under load and a trickle still goes out promptly. When the
//! gathered bytes reach `max_in_flight_bytes` while a send is still in the kernel, `write`
//! blocks until the send completes: a slow receiver (a full socket buffer) backpressures the
//! job. Records gathered when the input stops wait for the next record or `finish` (the sink
//! contract has no flush call yet).
//!
//! # Reconnect policy
//!
//! - *Connecting* (at the first record) is retried `connect_attempts` times with capped
//!   exponential backoff; nothing was sent yet, so nothing can be lost or doubled.
//! - *An established connection that fails* (`EPIPE`, `ECONNRESET`, ...) fails the job; the
//!   sink does not reconnect. TCP acknowledges nothing to the application: bytes the kernel
//!   accepted for the dead connection may or may not have reached the peer, so resending would
//!   double records and not resending would lose them, silently either way. Restarting the job
//!   from its last checkpoint replays the records after it: at-least-once, and the peer knows a
//!   new connection started.
//! - *A peer that stops reading* fails the job after `send_timeout` (the socket buffers fill,
//!   a send stays in the kernel); before that, it simply backpressures the job.
//!
//! # Checkpoints never wait for the peer
//!
//! A barrier does not wait for the kernel to take the bytes before it: the bytes not yet
//! reported sent (the rest of the send in flight, and what is gathered) go into the
//! checkpoint, and a restore sends them first on its new connection (at-least-once, as every
//! replay here). While a barrier is on its way the sink gathers past `max_in_flight_bytes` (up
//! to four times it) instead of blocking, so the barrier reaches it; at that bound it declines
//! the checkpoint, naming the peer. A stop ends any wait for the peer.

use super::uring::{Completion, Uring};
use super::{Backoff, FORMAT_KEY, Format};
use crate::io::poison::Poisoned;
use crate::operators::{Halt, OperatorFailure, Sink, SubtaskInfo, outside};
use crate::record::Record;
use crate::util::section::{Affects, JobFileError, Key, KeyType as T, REQUIRED, Section};
use crate::util::{errno_text, io_error_text};
use std::fmt::Display;
use std::marker::PhantomData;
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Tag of a send.
const TAG_SEND: u64 = 1;

/// Settings of a TCP sink (every subtask opens its own connection).
#[derive(Debug, Clone)]
pub struct TcpSinkConfig {
    /// `host:port`.
    pub address: String,
    /// How records are delimited: [`Format::Lines`] (newline) or [`Format::LengthPrefixed`].
    pub format: Format,
    /// Gathered bytes that make a send.
    pub batch_bytes: usize,
    /// A smaller batch is sent once its first record has waited this long.
    pub linger: Duration,
    /// The bound: at most this many bytes in the kernel (one send), and gathered bytes of this
    /// size make `write` wait for the kernel.
    pub max_in_flight_bytes: usize,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// A send still in the kernel after this long fails the job: the peer has stopped reading
    /// (a dead peer would otherwise hold the sink, and with it the job's stop, for ever).
    /// Backpressure from a slow peer that still reads is not a stall: each send is at most
    /// `max_in_flight_bytes`.
    pub send_timeout: Duration,
    /// Connection attempts before the job fails (at least 1).
    pub connect_attempts: u32,
    /// Delays between connection attempts.
    pub backoff: Backoff,
    /// Shared totals of every subtask made from this configuration.
    pub stats: Arc<TcpSinkStats>,
}

impl TcpSinkConfig {
    /// Newline-delimited records to `address`: 64 KiB batches, 2 ms linger, 256 KiB in
    /// flight, 5 connection attempts.
    pub fn new(address: impl Into<String>) -> TcpSinkConfig {
        TcpSinkConfig {
            address: address.into(),
            format: Format::Lines,
            batch_bytes: 64 * 1024,
            linger: Duration::from_millis(2),
            max_in_flight_bytes: 256 * 1024,
            connect_timeout: Duration::from_secs(5),
            send_timeout: Duration::from_secs(60),
            connect_attempts: 5,
            backoff: Backoff { min_delay: Duration::from_millis(50), max_delay: Duration::from_secs(2) },
            stats: Arc::default(),
        }
    }

    /// The keys of a TCP sink's job-file section (`type = "tcp"`).
    pub const KEYS: &'static [Key] = &[
        Key::new(
            "address",
            T::String,
            REQUIRED,
            "`host:port` of the receiver; connected with up to 5 attempts, backing off.",
        ),
        FORMAT_KEY,
        Key::new(
            "max_in_flight_bytes",
            T::Integer,
            "262144",
            "Bytes sent and not yet taken by the kernel, 64 to 2³⁰: past it the sink blocks (backpressure). While a checkpoint's barrier is on its way it gathers up to four times this instead, then declines that checkpoint, naming the peer.",
        )
        .affects(Affects::Memory),
    ];

    /// Read a TCP sink's job-file section.
    pub fn from_section(s: &mut Section) -> Result<TcpSinkConfig, JobFileError> {
        let address = s.required::<String>("address", "host:port of the receiver")?;
        let port_ok = address
            .get_ref()
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            let message = format!("`{}` is not host:port (e.g. 127.0.0.1:9000)", address.get_ref());
            return Err(s.err(address.span(), "address", message));
        }
        let mut config = TcpSinkConfig { format: Format::from_section(s)?, ..TcpSinkConfig::new(address.get_ref()) };
        if let Some(b) = s.take::<u64>("max_in_flight_bytes")? {
            let bytes = *b.get_ref();
            if !(64..=1 << 30).contains(&bytes) {
                return Err(s.err(b.span(), "max_in_flight_bytes", "use 64 bytes to 1 GiB"));
            }
            config.max_in_flight_bytes = bytes as usize;
            config.batch_bytes = config.batch_bytes.min(bytes as usize);
        }
        Ok(config)
    }
}

/// Totals of a TCP sink's subtasks, readable while the job runs.
#[derive(Debug, Default)]
pub struct TcpSinkStats {
    /// Records taken by `write`.
    pub records: AtomicU64,
    /// Bytes the kernel reported sent.
    pub bytes_sent: AtomicU64,
    /// Sends issued (each one batch of records).
    pub sends: AtomicU64,
    /// Connection attempts that failed.
    pub connect_failures: AtomicU64,
}

/// Why a TCP sink failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpSinkError {
    /// io_uring is unavailable, or failed.
    #[error("tcp sink {sink}: {reason}")]
    Uring {
        /// The sink subtask (`node#index`).
        sink: String,
        /// Why.
        reason: String,
    },
    /// No connection after every attempt (the peer is down or refuses: retryable later).
    #[error("tcp sink {sink}: cannot connect to {address} after {attempts} attempts: {last}")]
    Connect {
        /// The sink subtask.
        sink: String,
        /// Where to.
        address: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: String,
    },
    /// The peer took no data for the send timeout.
    #[error(
        "tcp sink {sink}: the peer at {address} has taken no data for {} (a send is still in the kernel); is it still reading?",
        crate::util::duration_text(*timeout)
    )]
    Stalled {
        /// The sink subtask.
        sink: String,
        /// The peer.
        address: String,
        /// The send timeout.
        timeout: Duration,
    },
    /// A send failed: the connection broke, and what the peer got is unknown.
    #[error(
        "tcp sink {sink}: send to {address} failed: {why}; the sink does not reconnect after a connection \
         broke (what the peer got is unknown); restart the job from its last checkpoint"
    )]
    Send {
        /// The sink subtask.
        sink: String,
        /// The peer.
        address: String,
        /// The errno text.
        why: String,
    },
}

impl OperatorFailure for TcpSinkError {
    fn is_retryable(&self) -> bool {
        matches!(self, TcpSinkError::Connect { .. } | TcpSinkError::Stalled { .. })
    }
}

/// Sends records over one TCP connection per subtask through io_uring. See the module docs.
pub struct TcpSink<T> {
    config: TcpSinkConfig,
    name: String,
    ring: Option<Uring>,
    stream: Option<TcpStream>,
    filling: Vec<u8>,
    /// When the first gathered record arrived (None: nothing gathered).
    gathered_at: Option<Instant>,
    /// The second buffer, when it is not in the kernel.
    spare: Option<Vec<u8>>,
    /// Bytes of the buffer in the kernel already reported sent, while a send is in flight.
    in_flight: Option<usize>,
    /// When the send in flight was handed to the kernel.
    sent_at: Instant,
    poisoned: Poisoned,
    _record: PhantomData<fn(&T)>,
}

impl<T> std::fmt::Debug for TcpSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpSink").field("name", &self.name).field("address", &self.config.address).finish()
    }
}

impl<T> TcpSink<T> {
    /// A TCP sink for one subtask. Never fails: a setup error poisons the sink and its first
    /// `write` or `finish` fails the job with it. It connects at the first record.
    pub fn new(config: TcpSinkConfig, info: &SubtaskInfo) -> TcpSink<T> {
        let name = info.name();
        let mut poisoned = Poisoned::default();
        let ring = match Uring::new(4) {
            Ok(r) => Some(r),
            Err(e) => {
                poisoned.poison(TcpSinkError::Uring { sink: name.clone(), reason: e.to_string() });
                None
            }
        };
        let bytes = config.max_in_flight_bytes.max(64);
        TcpSink {
            config: TcpSinkConfig {
                max_in_flight_bytes: bytes,
                batch_bytes: config.batch_bytes.clamp(1, bytes),
                connect_attempts: config.connect_attempts.max(1),
                ..config
            },
            name,
            ring,
            stream: None,
            gathered_at: None,
            filling: Vec::with_capacity(bytes),
            spare: Some(Vec::with_capacity(bytes)),
            in_flight: None,
            sent_at: Instant::now(),
            poisoned,
            _record: PhantomData,
        }
    }

    /// The setup error that poisoned this sink, if any.
    pub fn setup_error(&self) -> Option<&str> {
        self.poisoned.text()
    }

    fn check(&self) -> Result<(), Halt> {
        self.poisoned.check()
    }

    fn poison(&mut self, error: TcpSinkError) -> Halt {
        self.poisoned.poison(error)
    }

    /// Connect, retrying with backoff (see the module docs).
    fn connect(&mut self) -> Result<(), Halt> {
        let mut last = String::new();
        for attempt in 1..=self.config.connect_attempts {
            if attempt > 1 {
                weir_ring::fiber::sleep(self.config.backoff.delay(attempt - 1));
            }
            match connect_once(&self.config.address, self.config.connect_timeout) {
                Ok(stream) => {
                    // Batches are already large: do not let Nagle hold back the tail.
                    let _ = stream.set_nodelay(true);
                    self.stream = Some(stream);
                    return Ok(());
                }
                Err(e) => {
                    self.config.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                    last = e.to_string();
                }
            }
        }
        Err(self.poison(TcpSinkError::Connect {
            sink: self.name.clone(),
            address: self.config.address.clone(),
            attempts: self.config.connect_attempts,
            last,
        }))
    }

    /// Send the filling buffer if no send is in flight (and there is something to send).
    fn send_gathered(&mut self) -> Result<(), Halt> {
        if self.in_flight.is_some() || self.filling.is_empty() {
            return Ok(());
        }
        if self.stream.is_none() {
            self.connect()?;
        }
        let mut next = self.spare.take().expect("the spare buffer is back once no send is in flight");
        next.clear();
        let buffer = std::mem::replace(&mut self.filling, next);
        self.gathered_at = None;
        let fd = self.stream.as_ref().expect("connected above").as_raw_fd();
        let ring = self.ring.as_mut().expect("a sink with a ring is not poisoned at setup");
        if let Err(e) = ring.send(fd, buffer, 0, TAG_SEND).and_then(|()| ring.submit()) {
            return Err(self.send_failed(&io_error_text(&e)));
        }
        self.config.stats.sends.fetch_add(1, Ordering::Relaxed);
        self.in_flight = Some(0);
        self.sent_at = Instant::now();
        Ok(())
    }

    /// Wait for the send in flight to complete (at most `send_timeout` after it was issued),
    /// in steps that honour a stop; a wait that lasts is named in the subtask's waiting note.
    fn wait_send(&mut self) -> Result<(), Halt> {
        let started = Instant::now();
        while self.in_flight.is_some() {
            let left = (self.sent_at + self.config.send_timeout).saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.poison(TcpSinkError::Stalled {
                    sink: self.name.clone(),
                    address: self.config.address.clone(),
                    timeout: self.config.send_timeout,
                }));
            }
            let ring = self.ring.as_mut().expect("sends need a ring");
            if let Err(e) = ring.wait(Some(left.min(outside::WAIT_STEP))) {
                return Err(self.poison(TcpSinkError::Uring {
                    sink: self.name.clone(),
                    reason: format!("io_uring wait: {}", io_error_text(&e)),
                }));
            }
            self.reap()?;
            if self.in_flight.is_some() && outside::stop_requested() {
                return Err(Halt::Stopped);
            }
            if started.elapsed() >= outside::SHOW_AFTER {
                let (name, address) = (&self.name, &self.config.address);
                crate::telemetry::waiting::waiting_on(|| {
                    format!("tcp sink {name}: the peer at {address} has not taken a send for {:.1} s", {
                        self.sent_at.elapsed().as_secs_f64()
                    })
                });
            }
        }
        if started.elapsed() >= outside::SHOW_AFTER {
            crate::telemetry::waiting::waiting_over();
        }
        Ok(())
    }

    /// The bytes not yet reported sent, in stream order: the rest of the send in flight, then
    /// what is gathered. A checkpoint keeps them (see the module docs).
    fn unsent(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(done) = self.in_flight
            && let Some(buffer) = self.ring.as_ref().and_then(|r| r.lent(TAG_SEND))
        {
            out.extend_from_slice(&buffer[done.min(buffer.len())..]);
        }
        out.extend_from_slice(&self.filling);
        out
    }

    fn reap(&mut self) -> Result<(), Halt> {
        while let Some(c) = self.ring.as_mut().and_then(|r| r.next_completion()) {
            debug_assert_eq!(c.tag, TAG_SEND);
            self.send_done(c)?;
        }
        Ok(())
    }

    fn send_done(&mut self, c: Completion) -> Result<(), Halt> {
        let result = c.bytes();
        let buffer = c.buffer.expect("sends lend a buffer");
        let done = self.in_flight.take().expect("a completion for the send in flight");
        match result {
            Err(code) => {
                self.spare = Some(buffer);
                Err(self.send_failed(&errno_text(code)))
            }
            Ok(0) => {
                self.spare = Some(buffer);
                Err(self.send_failed("the kernel sent 0 bytes"))
            }
            Ok(n) => {
                self.config.stats.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
                let done = done + n;
                if done < buffer.len() {
                    // A short send (a signal): continue with the rest, in order.
                    let fd = self.stream.as_ref().expect("a send has a connection").as_raw_fd();
                    let ring = self.ring.as_mut().expect("sends need a ring");
                    if let Err(e) = ring.send(fd, buffer, done, TAG_SEND).and_then(|()| ring.submit()) {
                        return Err(self.send_failed(&io_error_text(&e)));
                    }
                    self.in_flight = Some(done);
                    self.sent_at = Instant::now();
                    return Ok(());
                }
                self.spare = Some(buffer);
                Ok(())
            }
        }
    }

    fn send_failed(&mut self, why: &str) -> Halt {
        self.poison(TcpSinkError::Send {
            sink: self.name.clone(),
            address: self.config.address.clone(),
            why: why.to_owned(),
        })
    }

    /// Send everything gathered and wait until the kernel has taken all of it.
    fn flush(&mut self) -> Result<(), Halt> {
        self.check()?;
        self.wait_send()?;
        self.send_gathered()?;
        self.wait_send()
    }
}

impl<T: Record + Display> Sink<T> for TcpSink<T> {
    #[inline]
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        self.check()?;
        self.config.format.append(record, &mut self.filling);
        self.config.stats.records.fetch_add(1, Ordering::Relaxed);
        let gathered_at = *self.gathered_at.get_or_insert_with(Instant::now);
        // Look at the completion queue (no system call): a finished send frees the kernel.
        self.reap()?;
        if self.in_flight.is_some() {
            if self.filling.len() < self.config.max_in_flight_bytes {
                return Ok(());
            }
            // A barrier on its way: gather on (bounded), so it reaches the sink and passes.
            let (name, address, bytes) = (&self.name, &self.config.address, self.filling.len());
            if outside::take_for_barrier(bytes < PENDING_FACTOR * self.config.max_in_flight_bytes, || {
                format!(
                    "tcp sink {name} has gathered {} for {address}, which has not taken a send for {:.1} s: the \
                     barrier cannot reach the sink until it reads",
                    crate::telemetry::bytes(bytes as u64),
                    self.sent_at.elapsed().as_secs_f64()
                )
            }) {
                return Ok(());
            }
            // The bound: the kernel holds one buffer, the other is full. Wait for the kernel;
            // the subtask stops reading its input meanwhile.
            self.wait_send()?;
        }
        if self.filling.len() >= self.config.batch_bytes || gathered_at.elapsed() >= self.config.linger {
            self.send_gathered()?;
        }
        Ok(())
    }

    /// End of input: send the rest, wait for it, and close the connection (the peer reads
    /// end-of-file).
    fn finish(&mut self) -> Result<(), Halt> {
        self.flush()?;
        if let Some(stream) = self.stream.take() {
            let _ = stream.shutdown(Shutdown::Write);
        }
        Ok(())
    }

    /// Checkpoint: the bytes not yet reported sent go into the checkpoint, and the barrier
    /// passes at once (see the module docs). TCP acknowledges nothing: at-least-once.
    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        self.check()?;
        // A send that finished frees the kernel first (a look, no system call).
        self.reap()?;
        Ok(self.unsent())
    }

    /// Restore: the bytes the checkpoint kept are sent first, on the new connection.
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        if let Some((_, bytes)) = from {
            self.restore_unsent(&[bytes]);
        }
        Ok(())
    }

    /// At another parallelism: each old subtask's bytes go to one new subtask (old `i` to new
    /// `i % parallelism`), whole (records are not split across subtasks).
    fn restore_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        let parts: Vec<&[u8]> = from.split().map(|(_, b)| b.as_slice()).collect();
        self.restore_unsent(&parts);
        Ok(())
    }

    /// Nothing to make visible: the peer has (or will be sent) the bytes.
    fn checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<(), Halt> {
        self.check()
    }
}

impl<T> TcpSink<T> {
    /// Bytes a checkpoint kept, to send before anything this run writes.
    fn restore_unsent(&mut self, parts: &[&[u8]]) {
        for bytes in parts {
            self.filling.extend_from_slice(bytes);
        }
        if !self.filling.is_empty() {
            self.gathered_at = Some(Instant::now());
        }
    }
}

/// While a barrier is on its way, a TCP sink gathers up to this many times
/// `max_in_flight_bytes` instead of blocking.
const PENDING_FACTOR: usize = 4;

/// One connection attempt to `address` (every resolved address in turn).
fn connect_once(address: &str, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let addrs: Vec<SocketAddr> = address.to_socket_addrs().map_err(ConnectError::Resolve)?.collect();
    let mut last = ConnectError::NoAddress { address: address.to_owned() };
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => return Ok(s),
            Err(source) => last = ConnectError::Connect { addr, source },
        }
    }
    Err(last)
}

/// Why one connection attempt failed ([`connect_once`]).
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    /// The address does not resolve.
    #[error("cannot resolve: {0}")]
    Resolve(#[source] std::io::Error),
    /// It resolves to no address.
    #[error("`{address}` resolves to no address")]
    NoAddress { address: String },
    /// The last address tried refused, or did not answer in time.
    #[error("{addr}: {}", io_error_text(source))]
    Connect { addr: SocketAddr, source: std::io::Error },
}
