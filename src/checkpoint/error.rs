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
