//! Sink I/O through io_uring: a file sink, a TCP sink, an HTTP/1.1 POST sink and a PostgreSQL sink.
//!
//! # The contract every sink here keeps
//!
//! - **One io_uring per sink subtask** (`uring.rs`), created with the sink; submissions are
//!   batched: records are encoded into a buffer, a full buffer (or batch) becomes one
//!   operation, and one `io_uring_enter` hands every queued operation to the kernel and reaps
//!   completions in the same call. The sink thread never blocks in `write(2)`/`send(2)`.
//! - **Bounded.** Each sink owns a bounded amount of buffers (a file sink two, a TCP sink two,
//!   an HTTP sink one per request in flight plus the batch being filled). When all are in the
//!   kernel, [`Sink::write`](crate::operators::Sink::write) *blocks* until one comes back.
//!   That is where backpressure starts: while the sink blocks, its subtask stops reading its
//!   input ring, the ring fills, and the upstream runs out of credit.
//! - **No barrier waits on the destination** (DESIGN.md, "A stuck world"). What a sink that can
//!   be slow (HTTP, TCP) holds or has in flight when a barrier reaches it goes into the
//!   checkpoint as its state, and the barrier passes at once; a restore sends it again (under
//!   the same idempotency keys). While a barrier is on its way
//!   ([`outside::barrier_expected`](crate::operators::outside::barrier_expected)) such a sink
//!   takes records instead of blocking, up to its own bound, and declines the checkpoint at
//!   that bound, naming the destination. The exactly-once Kafka sink cannot keep its records
//!   aside: a transaction can be prepared only with every record acknowledged by the broker,
//!   so its barrier waits for that at most `prepare_timeout` and then declines the checkpoint
//!   (the transaction stays open; the next checkpoint takes its records). A file sink's
//!   destination is the local disk: it writes and fsyncs at the barrier, each wait bounded.
//! - **Every wait is bounded, named and cut short by a stop**
//!   ([`crate::operators::outside`]): a wait that lasts shows in the subtask's
//!   waiting note (weir-stat, an expired checkpoint's reason, a stop that runs out of time).
//! - **Errors fail the job, with the cause.** An I/O error becomes
//!   [`Halt::Failed`] with a message naming the file, address
//!   or URL and the errno by name (`ENOSPC`, `ECONNREFUSED`, ...). A sink that failed is
//!   *poisoned*: every later call returns the same error; nothing is retried blindly (the HTTP
//!   sink's retries are the documented exception: 5xx and connection errors, bounded, with
//!   capped backoff).
//! - **Setup errors are deferred, not panics.** A sink's constructor cannot fail (job
//!   factories return the sink itself); what fails at setup (io_uring unavailable, a bad
//!   address) poisons the sink, and its first `write` or `finish` fails the job with the
//!   message. [`FileSink::setup_error`] and friends let a caller check early.
//! - **Two-phase commit** ([`TwoPhaseCommit`]): a checkpoint calls `prepare_commit(n)` (through
//!   [`Sink::snapshot`](crate::operators::Sink::snapshot)) when the sink subtask snapshots for
//!   checkpoint n, and `commit(n)` (through `checkpoint_complete`) once checkpoint n is
//!   durable; a restart from checkpoint n commits what n prepared (`restore`). Without
//!   checkpoints `finish` does both for the end of input.
//!
//! | sink | guarantee once checkpoints call the hooks |
//! |---|---|
//! | [`FileSink`] | exactly-once: part files become final (renamed) only at `commit` |
//! | [`TcpSink`] | at-least-once after a restart (TCP has no acknowledgement; unsent bytes are in the checkpoint) |
//! | [`HttpSink`] | at-least-once; the idempotency key lets the receiver drop duplicates (unanswered batches are in the checkpoint, with their keys) |
//! | [`postgres::PostgresSink`] | exactly-once (prepared transactions committed by name), upsert, or at-least-once |

mod file;
mod http;
pub mod ipc;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nexmark")]
pub mod nexmark;
mod partitioned;
mod poison;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "kafka")]
pub mod registry;
mod tcp;
#[cfg(feature = "tls")]
mod tls;
// Without the `tls` feature: the same names, and an `https://` URL is refused with the feature named.
#[cfg(not(feature = "tls"))]
#[path = "tls_off.rs"]
mod tls;
mod uring;

pub use file::{FileSink, FileSinkConfig, FileSinkError, FileSinkStats};
pub use http::{
    BodyFormat, HttpConfigError, HttpSink, HttpSinkConfig, HttpSinkError, HttpSinkStats, RecordKeyFn, window_result_key,
};
pub use partitioned::{PartitionEndFn, PartitionFn, PartitionedFileSink, PartitionedFileSinkConfig, SUCCESS_FILE};
pub use tcp::{TcpSink, TcpSinkConfig, TcpSinkError, TcpSinkStats};
pub use tls::ClientCert;

use crate::operators::Halt;
use crate::record::Record;
use crate::util::section::{JobFileError, Key, KeyType as T, Section};
use std::fmt::Display;
use std::io::Write;
use std::time::Duration;

/// The two phases of a transactional sink (called by its `Sink` checkpoint hooks).
///
/// Order: `prepare_commit(n)` at the sink subtask's snapshot for checkpoint n (in band, after
/// every record before barrier n), then `commit(n)` when the coordinator has made checkpoint n
/// durable. `commit(n)` also commits every earlier prepared checkpoint whose commit was not
/// called. A failed hook fails the job; recovery restarts from the last complete checkpoint.
pub trait TwoPhaseCommit {
    /// Pre-commit: make everything written so far durable, but not yet visible, and start a
    /// new transaction for the records after barrier `checkpoint_id`.
    fn prepare_commit(&mut self, checkpoint_id: u64) -> Result<(), Halt>;
    /// Checkpoint `checkpoint_id` is complete: make what was prepared for it (and before)
    /// visible.
    fn commit(&mut self, checkpoint_id: u64) -> Result<(), Halt>;
}

/// `format` in a file or TCP sink's section ([`Format::from_section`]).
pub const FORMAT_KEY: Key = Key::new(
    "format",
    T::String,
    "lines",
    "How records become bytes: `lines` (the record's text and a newline), `raw` (its ring encoding: 32 bytes an event), `length_prefixed` (a 4-byte big-endian length, then the encoding).",
);

/// How a record becomes bytes in a file or on a TCP stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// The record's `Display` text and a newline (`key=1 value=2 time_ns=3 seq=4` for events).
    #[default]
    Lines,
    /// The record's ring encoding as is. Only fixed-layout records can be split again
    /// (every record the same length: 32 bytes for an event).
    Raw,
    /// A 4-byte big-endian length, then the record's ring encoding.
    LengthPrefixed,
}

impl Format {
    /// Parse a job-file name: `lines`, `raw`, `length_prefixed`.
    pub fn from_name(name: &str) -> Option<Format> {
        match name {
            "lines" => Some(Format::Lines),
            "raw" => Some(Format::Raw),
            "length_prefixed" => Some(Format::LengthPrefixed),
            _ => None,
        }
    }

    /// `format = "lines" | "raw" | "length_prefixed"` in a file or TCP sink's section
    /// (default lines).
    pub fn from_section(s: &mut Section) -> Result<Format, JobFileError> {
        match s.take::<String>("format")? {
            None => Ok(Format::Lines),
            Some(f) => Format::from_name(f.get_ref()).ok_or_else(|| {
                s.err(
                    f.span(),
                    "format",
                    format!("unknown format `{}`; use lines, raw or length_prefixed", f.get_ref()),
                )
            }),
        }
    }

    /// Append `record` to `out`.
    #[inline]
    pub fn append<T: Record + Display>(self, record: &T, out: &mut Vec<u8>) {
        match self {
            Format::Lines => {
                // Writing into a Vec cannot fail.
                let _ = writeln!(out, "{record}");
            }
            Format::Raw => append_encoded(record, out),
            Format::LengthPrefixed => {
                let len = u32::try_from(record.encoded_len()).expect("records are far below 4 GiB");
                out.extend_from_slice(&len.to_be_bytes());
                append_encoded(record, out);
            }
        }
    }
}

fn append_encoded<T: Record>(record: &T, out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + record.encoded_len(), 0);
    record.encode(&mut out[at..]);
}

/// Capped exponential backoff: `min_delay · 2^(attempt − 1)`, at most `max_delay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay before the first retry.
    pub min_delay: Duration,
    /// The longest delay.
    pub max_delay: Duration,
}

impl Backoff {
    /// The delay before retry number `attempt` (1 = the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.saturating_sub(1).min(31)).unwrap_or(u32::MAX);
        self.min_delay.saturating_mul(factor).min(self.max_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Event;

    /// Each format writes what its doc says.
    #[test]
    fn formats() {
        let e = Event { key: 1, value: 2, time_ns: 3, seq: 4 };
        let mut out = Vec::new();
        Format::Lines.append(&e, &mut out);
        assert_eq!(out, b"key=1 value=2 time_ns=3 seq=4\n");
        out.clear();
        Format::Raw.append(&e, &mut out);
        assert_eq!(out.len(), 32);
        out.clear();
        Format::LengthPrefixed.append(&e, &mut out);
        assert_eq!(&out[..4], &[0, 0, 0, 32]);
        // The prefix leaves the record unaligned in `out`: read it by copy.
        assert_eq!(<Event as zerocopy::FromBytes>::read_from_bytes(&out[4..]).ok(), Some(e));
    }

    /// Backoff doubles from the minimum and stops at the cap, without overflow.
    #[test]
    fn backoff_is_capped() {
        let b = Backoff { min_delay: Duration::from_millis(10), max_delay: Duration::from_secs(1) };
        assert_eq!(b.delay(1), Duration::from_millis(10));
        assert_eq!(b.delay(2), Duration::from_millis(20));
        assert_eq!(b.delay(4), Duration::from_millis(80));
        assert_eq!(b.delay(8), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }
}
