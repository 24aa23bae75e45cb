//! Running a job: one pinned thread per subtask, joined by rings, with live counters.
//!
//! [`Job::start`](crate::graph::Job::start) resolves the graph into chains (`plan.rs`),
//! then runs the stages of `start.rs` in order: find the checkpoint to restore, create the
//! counters file, the rings of every exchange, place subtasks on cores, open the state
//! shards, build each subtask's chain, compute the memory budget, start the checkpoint
//! coordinator (`coordinator.rs`), spawn the subtasks (`subtask.rs`: one duty cycle each)
//! and the monitor. [`RunningJob::wait`] (`running.rs`) returns a [`JobSummary`]
//! (`summary.rs`).
//!
//! Layer: the top one; it may use every other.

pub mod control;
mod coordinator;
pub mod inspect;
pub(crate) mod plan;
mod run_dir;
mod running;
mod start;
mod state;
mod subtask;
mod summary;

pub use coordinator::{CheckpointPhases, CheckpointStats, SavepointTaken};
pub use plan::{MAX_CHAINED, MAX_PARALLELISM};
pub use run_dir::{run_root, state_root};
pub use running::RunningJob;
pub use summary::{JobSummary, NodeSummary, SubtaskSummary};

use crate::graph::GraphError;
use std::path::PathBuf;
use weir_ring::counters::CountersError;

/// The job could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The graph is invalid.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The counters file could not be created.
    #[error(transparent)]
    Counters(#[from] CountersError),
    /// The state backend could not be opened.
    #[error("cannot open the state backend in {dir}: {source}")]
    State {
        /// The state directory.
        dir: PathBuf,
        /// The error.
        source: crate::state::StateError,
    },
    /// The checkpoint directory holds no usable checkpoint, one of another graph, or the
    /// state could not be restored from it.
    #[error("cannot start from the checkpoints: {source}")]
    Checkpoint {
        /// What was wrong, and what to do.
        #[source]
        source: crate::checkpoint::CheckpointError,
    },
    /// The run directory (or its root, or the default state root) is not this user's alone,
    /// or could not be made.
    #[error("cannot use the run directory {path}: {source}")]
    RunDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it, and what to do.
        #[source]
        source: weir_ring::private_file::PrivateFileError,
    },
    /// A thread could not be spawned.
    #[error("cannot spawn subtask thread {name}: {source}")]
    Spawn {
        /// The subtask.
        name: String,
        /// The error.
        source: std::io::Error,
    },
}

/// A savepoint could not be taken ([`RunningJob::savepoint`]).
#[derive(Debug, thiserror::Error)]
pub enum SavepointError {
    /// The job takes no checkpoints (a savepoint is one).
    #[error("the job takes no checkpoints (give it a checkpoint directory to take savepoints)")]
    NoCheckpoints,
    /// It was tried and failed, or timed out: why.
    #[error("savepoint failed: {0}")]
    Failed(String),
}

/// The job did not finish normally.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// It could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A subtask failed; the others were stopped.
    #[error("subtask {subtask} failed: {error}")]
    Failed {
        /// The subtask (`node#index`).
        subtask: String,
        /// What went wrong: the operator's or connector's typed error
        /// ([`Failure::downcast_ref`](crate::operators::Failure::downcast_ref)).
        #[source]
        error: crate::operators::Failure,
    },
    /// The job was cancelled.
    #[error("the job was cancelled")]
    Cancelled,
    /// A stop ([`RunningJob::stop`]) did not finish within the job's `stop_timeout`: these
    /// subtasks were still running (each with what it waits on), and were left behind. Nothing
    /// they held is committed; the next run replays it from the last checkpoint.
    #[error(
        "the job did not stop within {}: still running: {}; what they held is replayed from the last checkpoint",
        crate::util::duration_text(*timeout),
        running.join(", ")
    )]
    StopTimedOut {
        /// The job's `stop_timeout`.
        timeout: std::time::Duration,
        /// Each subtask still running, with what it waits on.
        running: Vec<String>,
    },
}

impl crate::graph::Job {
    /// Start the job: one pinned thread per subtask. Returns at once.
    pub fn start(&self) -> Result<RunningJob, StartError> {
        // One instance of several: every node serves every partition's subtask index.
        let partitions = self.inner.borrow().config.instance.as_ref().map(|s| s.partitions);
        if let Some(p) = partitions {
            for node in &mut self.inner.borrow_mut().nodes {
                node.parallelism = p;
            }
        }
        start::start(&self.inner.borrow())
    }

    /// Start the job and wait for it to finish (bounded sources end it).
    pub fn run(&self) -> Result<JobSummary, JobError> {
        self.start()?.wait()
    }
}
