//! Exchanges: how records leave one subtask and reach another. One ring per (sender subtask, receiver subtask)
//! pair; a partitioning picks the ring for each record.
//!
//! - **forward**: sender i → receiver i (equal parallelism); chained away when possible.
//! - **hash** (`key_by`): key → key group (`hash(key) % max_key_groups`) → the receiver that
//!   owns that group. Receivers own contiguous ranges of key groups, so a key group's state
//!   moves as one range when parallelism changes.
//! - **rebalance**: round robin.
//! - **broadcast**: every receiver gets every record.
//!
//! Emitting into a ring with no credit blocks the sender (that is backpressure): it
//! publishes what it wrote elsewhere, waits by its idle strategy (parking on the ring and its
//! mailbox at once), and counts the wait as backpressured time.
//!
//! Both halves of a channel live here, as Flink keeps its result partitions and input gates
//! under one `io/network/`:
//!
//! | file | what |
//! |---|---|
//! | `output.rs` | the sender: `OutputGate` over an edge's rings, the ring writer that partitions |
//! | `input.rs` | the receiver: `InputGate`, fair reads, barrier alignment |
//! | `valve.rs` | the receiver's watermark: the minimum over its channels, idleness |
//! | `credit.rs` | credit by time: the receiver measures its drain rate, announces what it drains in the target |
//! | `mailbox.rs` | control messages into a subtask (stop, checkpoint trigger and completion) |
//!
//! and `SubtaskContext`, what a subtask shares with its gates: the mailbox, the idle
//! strategy, the backpressured-time counter.
//!
//! Layer: above the chain assembly (a ring writer is the last link of a chain), below time,
//! windows, connectors, the graph and the runtime.

pub(crate) mod credit;
mod input;
mod mailbox;
mod output;
pub(crate) mod valve;

pub(crate) use input::{InputChannel, InputGate};
pub use mailbox::{Control, Mailbox};
pub(crate) use output::{OutputChannel, OutputGate, WriterFn, writer_fn};

use std::sync::Arc;
use std::time::Duration;
use weir_ring::IdleStrategy;

/// A parked subtask wakes at least this often (to refresh live counters and look around).
pub(crate) const PARK_BACKSTOP: Duration = Duration::from_millis(100);

/// What a subtask shares with the code that runs inside it (its output gates).
pub(crate) struct SubtaskContext {
    pub mailbox: Arc<Mailbox>,
    pub idle: IdleStrategy,
    /// Where the subtask's time goes (the gates say when they wait for credit).
    pub time: Arc<crate::telemetry::time::TimeAccount>,
    /// What the subtask waits on, for an expired checkpoint's reason and the log.
    pub waiting: Arc<crate::telemetry::waiting::Waiting>,
}
