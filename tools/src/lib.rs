//! Operator tools for weir. They read shared memory only (the counters file, ring headers),
//! so they work while a job is stuck, and need nothing from it.
//!
//! - `weir-stat`: live counters of a running job (see [`stat`]); `--serve ADDR` serves them
//!   to Prometheus.
//! - `weir-top` (`weir top`): a live terminal view of the job's graph (see [`top`]).
//!
//! And test peers, which are no operator tools and touch no job:
//!
//! - `weir-slow-api`: a slow REST API on loopback for testing the HTTP sink (see [`slow_api`]);
//!   tests start it in process through the library.
//! - [`hostile_http`]: an HTTP server that answers with floods meant to grow a client's
//!   buffers for ever (trailers, interim responses, trickled chunks).
//! - [`registry`]: a stand-in schema registry (Confluent's API, in memory) for the Avro and
//!   Protobuf tests.
//! - [`stuck`]: a sink that stops answering until released (tests of stuck jobs).
//! - [`test_pki`]: certificates made at test time (a CA; server certificates valid, expired, or
//!   for other names) for the slow API over HTTPS.

pub mod hostile_http;
pub mod registry;
pub mod slow_api;
pub mod stat;
pub mod stuck;
pub mod test_pki;
pub mod top;
