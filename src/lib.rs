//! # weir: a zero-copy streaming dataplane for one multicore host
//!
//! A job is a graph of operator subtasks ([`graph`]); each subtask is a pinned thread running
//! a single-threaded loop ([`runtime`]); subtasks are joined by lock-free shared-memory rings
//! (`weir-ring`, re-exported as [`ring`]) whose free slots are the credit that lets a sender
//! send ([`exchange`]). When a stage is slow, credit runs out hop by hop back to the source:
//! memory stays flat and the source simply stops.
//!
//! The folders follow the design: `graph/` describes a job (builder and job files),
//! `operators/` holds the operator contracts and built-ins, `record/` the codecs, `exchange/`
//! the partitioners and ring writers, `runtime/` the subtasks, gates and mailboxes,
//! `state/` the RocksDB shards, `checkpoint/` barriers, manifests and recovery, `io/` the
//! sinks, `telemetry/` the budget and counters, `time/` event time and watermarks,
//! `window/` keyed windows and their state.

#![deny(unsafe_code)]

pub mod checkpoint;
pub mod exchange;
pub mod graph;
// Sink I/O through io_uring; `unsafe` is allowed in src/io/uring.rs alone (its own attribute).
pub mod io;
pub mod operators;
pub mod record;
pub mod runtime;
pub mod state;
pub mod telemetry;
pub mod time;
pub mod window;

pub use weir_ring as ring;
