//! The HTTP/1.1 POST sink: batches of records POSTed to a REST API over keep-alive
//! connections driven by io_uring, with a bounded number of requests in flight.
//!
//! ```text
//!  write ──► batch body (JSON) ──(batch_records)──► request ──► queue ──► free connection? ──► send + recv in the kernel
//!                                                                 │ no: write blocks (backpressure starts here),
//!                                                                 │ unless a barrier is on its way (then queued, bounded)
//!  response 2xx ──► acknowledged          5xx, 408, 429, connection error, timeout ──► retry after backoff
//!  other 4xx    ──► dead-letter file with the reason (or the job fails when none is configured)
//! ```
//!
//! - **In flight.** At most `max_in_flight` requests are outstanding: sent and unanswered, or
//!   waiting to be retried. One request per connection at a time (no pipelining: a failed
//!   pipelined request would take the ones behind it along), so `max_in_flight` keep-alive
//!   connections at most. A sealed batch that finds no free connection waits in a queue, and
//!   `write` blocks while one waits: when the API slows from 2 ms to 200 ms per call, the
//!   sink subtask stops reading its input ring and backpressure propagates upstream. Sealing
//!   never blocks (a watermark that releases a second's results queues them at once).
//! - **Checkpoints never wait for the API** (the rule of a stuck world, DESIGN.md). A barrier
//!   passes the sink at once: the batches not yet answered — queued, in flight, waiting for a
//!   retry — go into the checkpoint with their idempotency keys, beside the records held for
//!   their watermark, and a restore sends them again under the same keys (the receiver drops
//!   what it already has). While a checkpoint's barrier is on its way, `write` queues instead
//!   of blocking, so the barrier reaches the sink behind what the rings hold, not behind the
//!   API; the queue is bounded by `max_pending_bytes` (with `max_held_bytes`, in the job's
//!   memory budget), and at that bound the sink declines the checkpoint, naming the URL. An
//!   API that hangs for a minute therefore costs each checkpoint what reached the sink since
//!   the last one, not the minute. A stop ends every wait (the job's `stop_timeout`).
//! - **Retries** with capped exponential backoff (a numeric `Retry-After` stretches the delay
//!   up to the cap) on 5xx, 408, 429, connection errors and timeouts, `max_retries` times;
//!   then the job fails with the last error. A retry sends the same bytes with the same
//!   idempotency key.
//! - **Idempotency key** per request, so that the receiver can drop what it already has after
//!   a replay. Two ways to name a batch:
//!   - *By content* ([`HttpSink::with_record_keys`]; window results:
//!     [`HttpSink::window_results`]). Each record names the event time that completes it (a
//!     window's end) and its identity there (its key, and for an update after allowed lateness
//!     its count too). The sink holds records until the watermark passes their time — for
//!     window results that is at once: a window's results travel just before the watermark
//!     that fired them — then sorts that time's records by identity and cuts them into
//!     batches named by what they hold:
//!     `Idempotency-Key: <prefix>/<node>-<subtask>/w<time>/<first>..<last>/<CRC-32 of the identities>`
//!     (a batch released later for the same time, such as an update after allowed lateness,
//!     so gets a key of its own). A replay
//!     after a crash emits the same results for that window, so it makes the same batches
//!     with the same keys, however differently its input interleaved or where its barriers
//!     fell. Records held at a barrier go into the checkpoint. Exact when each result reaches
//!     the same sink subtask every time (one sink subtask, or keyed routing) and the results
//!     are deterministic (event time).
//!   - *By position* (the default): `<prefix>/<node>-<subtask>/<epoch>/<seq>`, where epoch is
//!     the id of the last checkpoint prepared (0 before the first) and seq counts the batches
//!     since. Batches are cut by count only (never by time), so this dedups a replay only when
//!     the records reach the sink in the same order as before — retries always, a replay from
//!     a checkpoint when the upstream order is deterministic.
//! - **Dead letters.** A 4xx other than 408/429 will not succeed by retrying: the batch goes to
//!   the dead-letter file as one JSON line with the status, the reason, the response body and
//!   the request body; the job goes on. Without a dead-letter file, the job fails instead (a
//!   batch is never dropped silently).
//! - **Connecting** uses a blocking connect bounded by `connect_timeout` (on loopback or a LAN
//!   it takes microseconds; completions of other requests wait meanwhile, they are not lost).
//! - **HTTPS** (`https://` URLs): rustls between the sink's buffers and io_uring, certificates
//!   checked against the system's roots or `ca_file`, SNI, an optional client certificate;
//!   the handshake runs at connect. A certificate that fails verification fails the job with
//!   the cause (see `io/tls.rs`). Bounds and backpressure are those of plain HTTP.
//! - The batch being filled when the input stops waits for the next record, a checkpoint or
//!   `finish` (the sink contract has no flush call yet).
//!
//! | file | what |
//! |---|---|
//! | `sink.rs` | the sink: batches, in-flight bound, retries, dead letters, idempotency keys, checkpoints |
//! | `client.rs` | HTTP/1.1: URLs, connecting, the request head |
//! | `response.rs` | responses, parsed incrementally with bounds on head and body |
//! | `../tls.rs` | HTTPS: rustls between the buffers and io_uring, certificate checks |

mod client;
mod response;
mod section;
mod sink;

pub use sink::{
    BodyFormat, HttpConfigError, HttpSink, HttpSinkConfig, HttpSinkError, HttpSinkStats, RecordKeyFn, window_result_key,
};
