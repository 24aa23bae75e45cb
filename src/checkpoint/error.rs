//! How checkpoint files fail: a file operation (the errno named, ENOSPC included), a file
//! that is not what its manifest says, or checkpoints that do not fit this job.

use crate::util::io_error_text;
use std::path::{Path, PathBuf};

/// Why a checkpoint could not be written, read or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A file operation failed.
    #[error("{what} {}: {}", path.display(), io_error_text(source))]
    Io {
        /// What was attempted (`cannot fsync`).
        what: &'static str,
        /// On which file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not what the manifest says: torn, changed, or of another format.
    #[error("{}: {problem}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A part's bytes do not open as a state envelope (torn, or of another format).
    #[error("{}: {source}", path.display())]
    Envelope {
        /// The part's file.
        path: PathBuf,
        /// What is wrong with its envelope.
        #[source]
        source: super::upgrade::EnvelopeError,
    },
    /// A state shard could not be rebuilt from a checkpoint's snapshots.
    #[error("cannot restore state shard {shard} ({restoring}) from checkpoint {checkpoint}: {source}")]
    Shard {
        /// The shard index.
        shard: usize,
        /// What was being restored there: each node's key groups.
        restoring: String,
        /// The checkpoint's id.
        checkpoint: u64,
        /// What failed.
        #[source]
        source: crate::state::StateError,
    },
    /// The state backend failed while the checkpoint was being restored.
    #[error("{0}")]
    State(#[source] crate::state::StateError),
    /// The checkpoints cannot be used by this job (none readable, another graph), with what
    /// to do.
    #[error("{0}")]
    Unusable(String),
}

impl CheckpointError {
    /// A file operation on `path` failed: for `map_err`.
    pub(crate) fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CheckpointError + 'a {
        move |source| CheckpointError::Io { what, path: path.to_owned(), source }
    }

    /// `path` is not what the manifest says.
    pub(crate) fn corrupt(path: &Path, problem: impl Into<String>) -> CheckpointError {
        CheckpointError::Corrupt { path: path.to_owned(), problem: problem.into() }
    }
}
