//! What can fail in the state backend, each with what to do about it.

use std::path::PathBuf;

/// RocksDB's own error, the source of most variants.
#[cfg(feature = "rocksdb")]
type RocksError = rocksdb::Error;

/// An operating error of the state backend. Each message names what failed, the path or
/// operator involved, RocksDB's own words, and the likely cause.
///
/// Programmer errors (a key group range past 65536, a key longer than 4 GiB, a shard index
/// past the shard count) are panics, not `StateError`s.
///
/// Without the `rocksdb` feature only the variants of in-memory keyed state exist.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    #[cfg(feature = "rocksdb")]
    /// A shard's directory could not be created or its RocksDB opened.
    #[error(
        "cannot open state shard {path}: {source} (is another job using this directory? stop it or \
         pick another state dir; or is the disk full or read-only?)"
    )]
    Open {
        /// The shard's directory.
        path: PathBuf,
        /// RocksDB's (or the file system's) error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[cfg(feature = "rocksdb")]
    /// RocksDB found a shard's files damaged as it opened them (a checksum mismatch, a
    /// truncated file): not a setting or another job, so the hint is about the files.
    #[error(
        "state shard {shard} ({path}) is damaged: {source} (its files were changed or cut short \
         after they were written: a failing disk, or another program writing there; its state \
         cannot be trusted)"
    )]
    Damaged {
        /// The shard index.
        shard: usize,
        /// The shard's directory.
        path: PathBuf,
        /// RocksDB's error.
        source: RocksError,
    },
    #[cfg(feature = "rocksdb")]
    /// An operator's column family could not be created in a shard.
    #[error(
        "cannot create column family for operator `{operator}` in state shard {path}: {source} \
         (is the disk full? operator ids must be valid file-name-safe strings)"
    )]
    ColumnFamily {
        /// The operator's node id (the column family's name).
        operator: String,
        /// The shard's directory.
        path: PathBuf,
        /// RocksDB's error.
        source: RocksError,
    },
    #[cfg(feature = "rocksdb")]
    /// A read, write, scan, delete or flush failed.
    #[error(
        "state {op} failed for operator `{operator}` in shard {shard}: {source} (a full disk, or \
         a corrupt or deleted state dir; the job's state cannot be trusted: restore from a \
         checkpoint)"
    )]
    Io {
        /// What was being done: `get`, `write batch`, `scan`, `delete_range`, `flush`.
        op: &'static str,
        /// The operator's node id.
        operator: String,
        /// The shard index.
        shard: usize,
        /// RocksDB's error.
        source: RocksError,
    },
    #[cfg(feature = "rocksdb")]
    /// A checkpoint of a shard could not be written.
    #[error(
        "cannot checkpoint state shard {shard} to {dir}: {source} (the target must not exist yet \
         and must be on the same file system as the state dir, for hard links; is the disk full?)"
    )]
    Checkpoint {
        /// The shard index.
        shard: usize,
        /// The checkpoint's target directory.
        dir: PathBuf,
        /// RocksDB's error.
        source: RocksError,
    },
    /// A stored key did not have the layout of [`crate::state::key`].
    #[error(
        "state key of {len} bytes in operator `{operator}` is malformed ({problem}); was the state \
         dir written by another weir version, or another program?"
    )]
    Corrupt {
        /// The operator's node id.
        operator: String,
        /// The encoded key's length.
        len: usize,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A cached value's bytes could not be decoded by its codec.
    #[error("cannot decode a state value of operator `{operator}`: {problem} (a codec change between runs?)")]
    Decode {
        /// The operator's node id.
        operator: String,
        /// The codec's words.
        problem: String,
    },
    /// The configuration cannot work.
    #[error("state config: {0}")]
    Config(String),
    /// A shard could not be rebuilt from checkpoint snapshots ([`restore_shard`](super::restore_shard)).
    #[error("{what} {}: {source}", path.display())]
    Restore {
        /// What was being done (`cannot open`, `cannot copy`, ...).
        what: &'static str,
        /// On which file or directory.
        path: PathBuf,
        /// The file system's or RocksDB's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
