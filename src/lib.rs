//! # weir: a zero-copy streaming dataplane for one multicore host
//!
//! A job is a graph of operator subtasks ([`graph`]); each subtask is a pinned thread running
//! a single-threaded loop ([`runtime`]); subtasks are joined by lock-free shared-memory rings
//! (`weir-ring`, re-exported as [`ring`]) whose free slots are the credit that lets a sender
//! send ([`exchange`]). When a stage is slow, credit runs out hop by hop back to the source:
//! memory stays flat and the source simply stops.
//!
//! # Layers
//!
//! Each folder is one layer, and a layer imports only from the layers below it
//! (`tests/layers.rs` reads every `crate::` path in `src/` and fails, naming file and line,
//! when one points up; no import circle spans two folders). Bottom to top:
//!
//! | layer | what it holds |
//! |---|---|
//! | `util` | errno texts; the job-file format ([`util::section`]: interpolation, located errors, one node's keys) |
//! | `record` | the [`Record`](record::Record) codecs; key groups, key hashing, partitioning |
//! | `telemetry` | the memory budget, counter kinds and labels, gauges (lag, sinks), histograms, the monitor |
//! | `state` | one RocksDB shard per core: a store that knows nothing of operators |
//! | `checkpoint` | the subtask side of checkpoints: snapshots, manifests, restore |
//! | `operators` | the operator contracts ([`Source`](operators::Source), [`Sink`](operators::Sink), [`Collector`](operators::Collector), ...), typed failures, built-in operators |
//! | `chain` | chain assembly: each operator wrapped in a link of one subtask's chain |
//! | `exchange` | both halves of a channel: output gate, input gate (alignment, watermark valve), mailbox |
//! | `time` | event time, watermark strategies and the watermark generator |
//! | `window` | keyed windows and their state |
//! | `io` | connectors: file, TCP and HTTP sinks on io_uring; Kafka source and sink; each reads its own job-file section |
//! | `graph` | describing a job: the typed builder and job files (the catalogue of node types) |
//! | `runtime` | planning, starting and running a job; the checkpoint coordinator |
//! | `cluster` | instances of a job on several hosts: Kafka group membership, the checkpoint store, handover (the `kafka` feature) |
//! | `guide` | the user guide: tutorial, how-tos, concepts, reference (documentation only; [`guide`] starts it) |
//!
//! # Features
//!
//! The default, `full`, is everything the `weir` command needs. A program that embeds weir
//! names what it uses (`default-features = false`): without features it is pure Rust —
//! rings, graph, job files, runtime, operators, windows and keyed state on the heap,
//! checkpoints, file, TCP, HTTP and ipc connectors. `rocksdb`, `kafka`, `tls`, `registry`,
//! `prometheus`, `s3` and `cli` add the rest ([`guide::howto::embedding`]).
//!
//! Describing a job is separate from running it: [`graph`] only describes; [`runtime`] adds
//! [`Job::start`](graph::Job::start) and [`Job::run`](graph::Job::run). The `weir` command
//! (`src/main.rs`) sits on top; the demo is a package of its own (`tools/demo`).

#![deny(unsafe_code)]

mod chain;
pub mod checkpoint;
#[cfg(feature = "kafka")]
pub mod cluster;
pub mod exchange;
pub mod graph;
pub mod guide;
// Sink I/O through io_uring; `unsafe` is allowed in src/io/uring.rs alone (its own attribute).
pub mod io;
pub mod operators;
pub mod record;
pub mod runtime;
pub mod state;
pub mod telemetry;
pub mod time;
pub mod util;
pub mod window;

pub use weir_ring as ring;
