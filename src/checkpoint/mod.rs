//! Checkpoints: aligned barriers, snapshots, a manifest, and recovery.
//!
//! ```text
//!  coordinator ──Trigger(n)──► source subtasks: snapshot position, emit barrier n in band
//!       ▲                          │ rings (barriers are paced by credit, like records)
//!       │                          ▼
//!       │                      subtask with k inputs: barrier n on a channel blocks that
//!       │                      channel until barrier n came on all k (alignment); then each
//!       │                      operator of the chain snapshots as the barrier passes it
//!       │                      (caches flushed into the shard, a RocksDB checkpoint of the
//!       │                      shard, operator bytes), and the barrier goes on downstream
//!       └──────── Ack(n) ──────┘ from every subtask
//!  all acked ──► manifest n: write temp, fsync, rename, fsync dir ──► Complete(n) to every
//!                subtask (sinks commit: part files renamed, transactions committed; sources
//!                commit offsets for monitoring) ──► older checkpoints pruned (keep K)
//! ```
//!
//! On disk, under the checkpoint directory:
//!
//! ```text
//!  chk-<n>/                     one checkpoint
//!    _manifest.json             written last (rename); without it the directory is partial
//!    <subtask>/<node>.state     an operator's bytes (source position, sink pending parts,
//!                               window metadata, keyed operator state)
//!    <subtask>/<node>.rocksdb/  a RocksDB checkpoint (hard links) of the subtask's shard
//!  final-<run>/<subtask>/...    the end of input: the final checkpoint's files
//!  live-state/                  the running job's RocksDB shards (not part of any checkpoint)
//! ```
//!
//! **Recovery** ([`restore`]): the newest `chk-*` whose manifest reads and checks (its
//! checksum, every file it names) is restored; an unreadable one is skipped with a warning
//! for the one before it; none usable while some exist is an error. Each RocksDB shard is
//! rebuilt from the snapshots — never from the live database, which is ahead of the
//! checkpoint — and each operator gets its bytes back before its first record.
//!
//! **At another parallelism.** State is found by node id and subtask index, not by chain,
//! so parallelism (and chaining) may change; the number of key groups may not. A shard takes
//! each of its subtasks' key-group ranges from whichever snapshots of the node hold them
//! ([`restore::restore_shards`]); an operator whose node changed parallelism gets every old
//! subtask's bytes ([`Rescaled`]) and takes its share: by key group (windows), by partition
//! (Kafka sources), or each old part once (sinks' prepared commits). One that cannot divide
//! its bytes refuses, naming the node.
//!
//! **Shards are shared, snapshots are not.** Several stateful subtasks pinned to one core
//! share one RocksDB shard, and they meet barrier n at different moments. Each takes its own
//! RocksDB checkpoint of the shard when its barrier passes and the manifest records, per
//! snapshot, the column family and key groups it is the truth for; restoring copies each
//! subtask's range from its own snapshot.
//!
//! **The end of input is a checkpoint too.** When a source is exhausted, end-of-stream flows
//! like a barrier: every operator flushes, sinks pre-commit instead of committing, every
//! subtask acks, and the coordinator writes a final manifest before sinks commit. So a crash
//! at any moment, even while sinks commit their last files, recovers without a duplicate.
//!
//! **What a checkpoint costs the pipeline.** A barrier waits behind the records before it,
//! so under a slow sink checkpoint n takes about (in-flight records) ÷ (sink rate): the
//! rings bound the in-flight records, so checkpoints keep completing. Under a stopped sink
//! they expire after the timeout, with a reason that names the subtasks that did not ack and
//! the channels without credit.

#[doc = include_str!("upgrading.md")]
pub mod upgrading {}

mod error;
mod manifest;
pub mod restore;
pub mod savepoint;
mod snapshot;
pub mod upgrade;

pub use error::CheckpointError;
pub use manifest::{BlobRef, Manifest, NodeLayout, SavepointInfo, ShardRef, SubtaskSnapshot};
pub(crate) use manifest::{FORMAT as MANIFEST_FORMAT, MANIFEST_FILE, checkpoint_dirs};
pub(crate) use snapshot::{Expected, Parts, Restored, Snapshots, no_migration};
pub use snapshot::{LatePart, Rescaled};
pub use upgrade::{EnvelopeError, StatePart, StateTag};

use std::path::PathBuf;
use std::time::Duration;

/// The barrier id sinks and operators see for the end of input (the final checkpoint); the
/// manifest gives it the next regular id.
pub const FINAL: u64 = u64::MAX;

/// A job's checkpoint settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// Where checkpoints go (and, unless the state settings say otherwise, the live RocksDB
    /// shards: hard links need one file system).
    pub dir: PathBuf,
    /// Time from one checkpoint's trigger to the next: a checkpoint every `interval`, however
    /// long each takes; one that takes longer is followed as soon as it completes, is
    /// declined or expires.
    pub interval: Duration,
    /// A checkpoint not complete after this long expires (and the next one is triggered).
    pub timeout: Duration,
    /// Completed checkpoints kept; older ones are removed.
    pub retained: usize,
    /// Start from the newest usable checkpoint in `dir` (the default); false: refuse to
    /// start if `dir` holds one (so a fresh run cannot resume by accident... or vice versa).
    pub restore: bool,
    /// Called with each completed checkpoint once its manifest is durable here and before
    /// any sink commits for it: a job run as one instance of several copies the checkpoint
    /// to the store the instances share (`crate::cluster`), so that what sinks commit is
    /// always covered by a checkpoint another instance can restore. An error fails the
    /// checkpoint (sinks do not commit; the next one tries again).
    pub publish: Option<Publish>,
    /// Start from this savepoint (`weir run --from-savepoint`): restored unless `dir` holds a
    /// newer checkpoint of a run that started from it (a restart after a crash resumes from
    /// there, not from the savepoint again).
    pub from_savepoint: Option<PathBuf>,
    /// State the restored checkpoint holds and this job does not (a node removed, a keyed
    /// state no longer declared) is dropped instead of refusing the restore
    /// (`weir run --allow-dropped-state`; see [`upgrade`]).
    pub allow_dropped_state: bool,
}

/// The function of a [`Publish`]; its error (any type: the checkpoint store's own, say) fails
/// the checkpoint, and its message is logged with it.
pub type PublishFn = dyn Fn(&std::path::Path, &std::path::Path, &Manifest) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    + Send
    + Sync;

/// What [`CheckpointSettings::publish`] calls: `(checkpoint root, the checkpoint's
/// directory, its manifest)`.
#[derive(Clone)]
pub struct Publish(pub std::sync::Arc<PublishFn>);

impl std::fmt::Debug for Publish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Publish(..)")
    }
}

impl PartialEq for Publish {
    fn eq(&self, other: &Publish) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Publish {}

impl CheckpointSettings {
    /// Checkpoints in `dir` every second, 10 minutes timeout, 3 kept, restoring.
    pub fn new(dir: impl Into<PathBuf>) -> CheckpointSettings {
        CheckpointSettings {
            dir: dir.into(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(600),
            retained: 3,
            restore: true,
            publish: None,
            from_savepoint: None,
            allow_dropped_state: false,
        }
    }
}

/// Failpoints (the `fail` crate, with feature `failpoints`): a test configures one to crash
/// the process at that phase. Without the feature they compile to nothing.
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name);
    };
}
pub(crate) use failpoint;
