//! A subtask's side of a checkpoint: the operators of its chain put their parts here as the
//! barrier passes them; the subtask sends them to the coordinator as its ack.

use super::CheckpointError;
use super::manifest::{BlobRef, Manifest, ShardRef};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What a subtask's operators put into the checkpoint being taken.
#[derive(Debug, Default, Clone)]
pub(crate) struct Parts {
    pub blobs: Vec<BlobRef>,
    pub shards: Vec<ShardRef>,
    /// Why a part could not be taken: the checkpoint is declined (the job goes on).
    pub errors: Vec<String>,
    /// Nodes whose part comes later ([`LatePart`]): the subtask's ack waits for them.
    pub late: Vec<String>,
}

/// What a subtask restores when its node ran at another parallelism when the checkpoint was
/// taken: the bytes each subtask of the node put then, by its index. Which of them a subtask
/// takes is its operator's choice: each old part once over all new subtasks
/// ([`split`](Rescaled::split)) for what must happen once (a sink's prepared commits), or all
/// of them, filtered, for what each subtask picks its own share of (a Kafka source's
/// partitions, a window's key groups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rescaled {
    /// The checkpoint restored.
    pub checkpoint_id: u64,
    /// The node's parallelism when it was taken.
    pub from_parallelism: u32,
    /// This subtask's index.
    pub index: u32,
    /// The node's parallelism now.
    pub parallelism: u32,
    /// (old subtask index, what it put), in index order; an old subtask that put nothing is
    /// absent.
    pub parts: Vec<(u32, Vec<u8>)>,
}

impl Rescaled {
    /// The old parts this subtask takes when each goes to exactly one new subtask: old
    /// index `i` to new index `i % parallelism`.
    pub fn split(&self) -> impl Iterator<Item = &(u32, Vec<u8>)> {
        self.parts.iter().filter(|(i, _)| i % self.parallelism.max(1) == self.index)
    }

    /// Whether every old part is empty (an operator without state of its own).
    pub fn is_empty(&self) -> bool {
        self.parts.iter().all(|(_, b)| b.is_empty())
    }

    /// Why an operator of kind `what` (source, sink, keyed operator) whose bytes cannot be
    /// divided refuses this restore, and what to do.
    pub fn refusal(&self, what: &str) -> String {
        format!(
            "checkpoint {} was taken with this node at parallelism {} and this run has {}: this {what} keeps \
             state of its own that it cannot divide among another number of subtasks (it does not implement \
             restore_rescaled); run the node at parallelism {} to restore the checkpoint, or start with an empty \
             checkpoint directory",
            self.checkpoint_id, self.from_parallelism, self.parallelism, self.from_parallelism
        )
    }
}

/// What an operator expects of its restored bytes: the kind of operator that wrote them,
/// the version of its format, and how it converts bytes of another version.
pub(crate) struct Expected<'a> {
    /// `window`, `keyed`, `source`, `sink`.
    pub kind: &'a str,
    /// The version it writes now.
    pub version: u32,
    /// Bytes written at version `from` → bytes of `version`, or why not.
    pub migrate: &'a mut dyn FnMut(u32, Vec<u8>) -> Result<Vec<u8>, String>,
}

impl Expected<'_> {
    /// An operator that has one format (version 0) and converts nothing.
    pub(crate) fn only<'a>(
        kind: &'a str,
        none: &'a mut dyn FnMut(u32, Vec<u8>) -> Result<Vec<u8>, String>,
    ) -> Expected<'a> {
        Expected { kind, version: 0, migrate: none }
    }

    /// The payload of one part: its tag checked, converted if its version differs (bytes of
    /// format 1, without a tag, are version 0 of the expected kind).
    fn open(&mut self, node: &str, tag: Option<super::StateTag>, bytes: Vec<u8>) -> Result<Vec<u8>, CheckpointError> {
        let (kind, version) = tag.as_ref().map_or((self.kind, 0), |t| (t.kind.as_str(), t.version));
        if kind != self.kind {
            return Err(CheckpointError::Unusable(format!(
                "node {node}: its state was written by a {kind} and this job's node {node} is a {}: give the new \
                 operator another id to start it empty",
                self.kind
            )));
        }
        if version == self.version || bytes.is_empty() {
            return Ok(bytes);
        }
        (self.migrate)(version, bytes).map_err(|e| {
            CheckpointError::Unusable(format!(
                "node {node}: its state was written in version {version} of the {kind}'s format and this job's \
                 {kind} writes version {}: {e}",
                self.version
            ))
        })
    }
}

/// A `migrate` for [`Expected`] that converts nothing: another version is refused.
pub(crate) fn no_migration(from: u32, _: Vec<u8>) -> Result<Vec<u8>, String> {
    Err(format!("it has no conversion from version {from} (implement migrate_state)"))
}

/// What a node's subtask gets back from the checkpoint being restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Restored {
    /// Nothing: a fresh start, or the node put nothing.
    Fresh,
    /// What this subtask's predecessor (same index, same parallelism) put.
    Same(u64, Vec<u8>),
    /// The node's parallelism changed.
    Rescaled(Rescaled),
}

impl Restored {
    /// The bytes of [`Restored::Same`], as `Source::restore`/`Sink::restore` take them.
    pub(crate) fn same(&self) -> Option<(u64, &[u8])> {
        match self {
            Restored::Same(id, b) => Some((*id, b.as_slice())),
            _ => None,
        }
    }
}

struct Inner {
    subtask: String,
    /// Where the restored checkpoint's files are: the checkpoint directory, or a savepoint's.
    restored_root: PathBuf,
    /// The subtask's index and its chain's parallelism.
    index: u32,
    parallelism: u32,
    root: PathBuf,
    /// The directory of this run's final checkpoint files (unique per run).
    final_dir: String,
    restored: Option<Arc<Manifest>>,
    /// State the restored checkpoint holds and this job no longer declares may be dropped.
    allow_dropped_state: bool,
    parts: Mutex<Parts>,
    /// A checkpoint whose ack waits for late parts ([`LatePart`]), with the parts so far.
    held: Mutex<Option<(u64, Parts)>>,
    /// Each node's last snapshot directory in this run (what the next one adds is counted
    /// against it).
    previous: Mutex<std::collections::HashMap<String, PathBuf>>,
}

/// The checkpoint context of one subtask, shared by the links of its chain. `None` inside:
/// the job takes no checkpoints (every call is a no-op).
#[derive(Clone, Default)]
pub(crate) struct Snapshots(Option<Arc<Inner>>);

impl std::fmt::Debug for Snapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(i) => f.debug_struct("Snapshots").field("subtask", &i.subtask).finish(),
            None => f.write_str("Snapshots(off)"),
        }
    }
}

impl Snapshots {
    /// The context of subtask `index` (of `parallelism`) named `subtask`, writing into
    /// `root` and restoring `restored` (whose files are under `restored_root`).
    pub(crate) fn new(
        subtask: String,
        (index, parallelism): (u32, u32),
        root: PathBuf,
        final_dir: String,
        restored: Option<(Arc<Manifest>, PathBuf)>,
        allow_dropped_state: bool,
    ) -> Snapshots {
        let (restored, restored_root) = match restored {
            Some((m, r)) => (Some(m), r),
            None => (None, root.clone()),
        };
        Snapshots(Some(Arc::new(Inner {
            subtask,
            restored_root,
            index,
            parallelism,
            root,
            final_dir,
            restored,
            allow_dropped_state,
            parts: Mutex::default(),
            held: Mutex::default(),
            previous: Mutex::default(),
        })))
    }

    /// Whether the job takes checkpoints.
    pub(crate) fn enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Whether state the restored checkpoint holds and this job no longer declares may be
    /// dropped (`CheckpointSettings::allow_dropped_state`).
    pub(crate) fn allow_dropped_state(&self) -> bool {
        self.0.as_ref().is_some_and(|i| i.allow_dropped_state)
    }

    /// Whether the job restored a final checkpoint (its input had ended: operators must not
    /// emit their last results again).
    pub(crate) fn restored_final(&self) -> bool {
        self.0.as_ref().and_then(|i| i.restored.as_ref()).is_some_and(|m| m.is_final)
    }

    /// What `node` of this subtask gets back from the restored checkpoint: by node and
    /// subtask index (the chains may be cut otherwise than when it was taken); every old
    /// subtask's bytes if the node's parallelism changed. Each part's envelope is checked
    /// against `expected` (the kind of operator that wrote it; bytes of another version go
    /// through its `migrate`). A file that cannot be read is an error.
    pub(crate) fn restored(&self, node: &str, expected: &mut Expected<'_>) -> Result<Restored, CheckpointError> {
        let Some(inner) = &self.0 else { return Ok(Restored::Fresh) };
        let Some(m) = &inner.restored else { return Ok(Restored::Fresh) };
        let Some(layout) = m.node_layout(node) else { return Ok(Restored::Fresh) };
        let mut read = |subtask: &str| -> Result<Option<Vec<u8>>, CheckpointError> {
            match m.blob(&inner.restored_root, subtask, node) {
                None => Ok(None),
                Some(Err(e)) => Err(e),
                Some(Ok((tag, bytes))) => expected.open(node, tag, bytes).map(Some),
            }
        };
        if layout.parallelism == inner.parallelism {
            let Some((_, s)) = layout.subtasks.iter().find(|(i, _)| *i == inner.index) else {
                return Ok(Restored::Fresh);
            };
            return Ok(match read(&s.subtask)? {
                None => Restored::Fresh,
                Some(bytes) => Restored::Same(m.id, bytes),
            });
        }
        let mut parts = Vec::new();
        for (i, s) in &layout.subtasks {
            if let Some(bytes) = read(&s.subtask)? {
                parts.push((*i, bytes));
            }
        }
        Ok(Restored::Rescaled(Rescaled {
            checkpoint_id: m.id,
            from_parallelism: layout.parallelism,
            index: inner.index,
            parallelism: inner.parallelism,
            parts,
        }))
    }

    /// The typed parts of `node`'s state as the restored checkpoint's envelopes declare them
    /// (a keyed operator's states; the first non-empty part of the node says for all).
    pub(crate) fn restored_parts(&self, node: &str) -> Result<Vec<super::StatePart>, CheckpointError> {
        let Some(inner) = &self.0 else { return Ok(Vec::new()) };
        let Some(m) = &inner.restored else { return Ok(Vec::new()) };
        let Some(layout) = m.node_layout(node) else { return Ok(Vec::new()) };
        for (_, s) in &layout.subtasks {
            if let Some(found) = m.blob(&inner.restored_root, &s.subtask, node)
                && let (Some(tag), _) = found?
            {
                return Ok(tag.parts);
            }
        }
        Ok(Vec::new())
    }

    /// What the restored checkpoint's manifest says of `node` (format 2), if the job
    /// restores one that has it.
    pub(crate) fn restored_node(&self, node: &str) -> Option<super::upgrade::NodeRecord> {
        self.0.as_ref()?.restored.as_ref()?.nodes.get(node).cloned()
    }

    /// The directory of this subtask's files for checkpoint `id`, relative to the root.
    fn rel_dir(inner: &Inner, id: u64) -> String {
        let base = if id == super::FINAL { inner.final_dir.clone() } else { format!("chk-{id}") };
        format!("{base}/{}", inner.subtask)
    }

    fn with_parts<R>(&self, f: impl FnOnce(&mut Parts) -> R) -> Option<R> {
        let inner = self.0.as_ref()?;
        Some(f(&mut inner.parts.lock().unwrap_or_else(|e| e.into_inner())))
    }

    /// Start checkpoint `id` (forget parts of an earlier one that was never acked).
    pub(crate) fn begin(&self, _id: u64) {
        self.with_parts(|p| *p = Parts::default());
    }

    /// Record why a part of checkpoint `id` could not be taken.
    pub(crate) fn decline(&self, reason: String) {
        self.with_parts(|p| p.errors.push(reason));
    }

    /// Put `bytes` as `node`'s part of checkpoint `id`, in an envelope tagged `tag`: a file,
    /// fsynced. A failure declines the checkpoint (the message names the file and errno).
    pub(crate) fn put_blob(&self, node: &str, id: u64, tag: &super::StateTag, bytes: &[u8]) {
        let Some(inner) = &self.0 else { return };
        let result = Self::write_blob(inner, node, id, tag, bytes);
        self.with_parts(|p| match result {
            Ok(blob) => p.blobs.push(blob),
            Err(e) => p.errors.push(e),
        });
    }

    /// Write `bytes` as `node`'s part of checkpoint `id`, enveloped (the payload is not
    /// copied: the envelope's head and it are written one after the other), fsynced.
    fn write_blob(inner: &Inner, node: &str, id: u64, tag: &super::StateTag, bytes: &[u8]) -> Result<BlobRef, String> {
        let head = super::upgrade::envelope_head(tag, bytes.len());
        let rel = format!("{}/{}.state", Self::rel_dir(inner, id), file_safe(node));
        let path = inner.root.join(&rel);
        let result = (|| {
            let dir = path.parent().expect("a state file has a directory");
            std::fs::create_dir_all(dir).map_err(CheckpointError::io("cannot create", dir))?;
            let mut f = std::fs::File::create(&path).map_err(CheckpointError::io("cannot create", &path))?;
            f.write_all(&head).map_err(CheckpointError::io("cannot write", &path))?;
            if !head.is_empty() {
                f.write_all(bytes).map_err(CheckpointError::io("cannot write", &path))?;
            }
            f.sync_all().map_err(CheckpointError::io("cannot fsync", &path))
        })();
        result.map_err(|e| format!("{}: {e}", inner.subtask))?;
        let (len, crc32) = if head.is_empty() {
            (0, crc32fast::hash(&[]))
        } else {
            let mut crc = crc32fast::Hasher::new();
            crc.update(&head);
            crc.update(bytes);
            ((head.len() + bytes.len()) as u64, crc.finalize())
        };
        Ok(BlobRef { node: node.to_owned(), file: rel, bytes: len, crc32 })
    }

    /// `node`'s part of checkpoint `id` comes later, through the [`LatePart`] returned: the
    /// subtask's ack waits for it (see [`hold`](Snapshots::hold)).
    pub(crate) fn late(&self, node: &str, id: u64, tag: super::StateTag) -> LatePart {
        self.with_parts(|p| p.late.push(node.to_owned()));
        LatePart { snapshots: self.clone(), node: node.to_owned(), id, tag, put: false }
    }

    /// The subtask acks checkpoint `id` with `parts` of which some come later: keep them
    /// until they have. A checkpoint held before is dropped (its ack was never sent: the
    /// coordinator expired it, or the job is ending).
    pub(crate) fn hold(&self, id: u64, parts: Parts) {
        let Some(inner) = &self.0 else { return };
        *inner.held.lock().unwrap_or_else(|e| e.into_inner()) = Some((id, parts));
    }

    /// The held checkpoint, once every late part of it came: its id and parts.
    pub(crate) fn take_held(&self) -> Option<(u64, Parts)> {
        let inner = self.0.as_ref()?;
        let mut held = inner.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.as_ref().is_some_and(|(_, p)| p.late.is_empty()) { held.take() } else { None }
    }

    /// A late part of checkpoint `id` came (a blob, or why it could not be taken).
    fn put_late(&self, node: &str, id: u64, part: Result<BlobRef, String>) {
        let Some(inner) = &self.0 else { return };
        let settle = |p: &mut Parts| {
            let Some(at) = p.late.iter().position(|n| n == node) else { return false };
            p.late.swap_remove(at);
            match part.clone() {
                Ok(blob) => p.blobs.push(blob),
                Err(e) => p.errors.push(e),
            }
            true
        };
        let mut held = inner.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((held_id, parts)) = held.as_mut()
            && *held_id == id
            && settle(parts)
        {
            return;
        }
        drop(held);
        // Before the subtask acked (the part came at once): into the parts being taken. A
        // part of a checkpoint no longer held (expired) goes nowhere.
        self.with_parts(|p| settle(p));
    }

    /// Where `node` writes its RocksDB snapshot for checkpoint `id` (absolute; its parent
    /// exists; it does not), and the same relative to the root.
    pub(crate) fn shard_dir(&self, node: &str, id: u64) -> Option<Result<(PathBuf, String), CheckpointError>> {
        let inner = self.0.as_ref()?;
        let rel = format!("{}/{}.rocksdb", Self::rel_dir(inner, id), file_safe(node));
        let path = inner.root.join(&rel);
        let parent = path.parent().expect("a snapshot has a directory");
        Some(
            std::fs::create_dir_all(parent)
                .map_err(CheckpointError::io("cannot create", parent))
                .and_then(|()| match std::fs::remove_dir_all(&path) {
                    // A leftover of a run that crashed while taking the same checkpoint id.
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(CheckpointError::io("cannot remove the leftover", &path)(e)),
                })
                .map(|()| (path, rel)),
        )
    }

    /// Record `node`'s RocksDB snapshot at `rel` as the truth for `key_groups`.
    pub(crate) fn put_shard(&self, node: &str, rel: String, key_groups: std::ops::Range<u32>) {
        let Some(inner) = &self.0 else { return };
        let dir = inner.root.join(&rel);
        let previous = inner.previous.lock().unwrap_or_else(|e| e.into_inner()).insert(node.to_owned(), dir.clone());
        let (bytes, new_bytes) = dir_bytes(&dir, previous.as_deref());
        self.with_parts(|p| {
            p.shards.push(ShardRef {
                node: node.to_owned(),
                dir: rel,
                key_groups: (key_groups.start, key_groups.end),
                bytes,
                new_bytes,
            })
        });
    }

    /// The parts of the checkpoint being taken, handed over for the ack.
    pub(crate) fn take(&self) -> Parts {
        self.with_parts(std::mem::take).unwrap_or_default()
    }
}

/// A node's part of a checkpoint that it puts later, after the barrier passed it: a sink
/// whose batches are on their way to the destination puts their names once the destination
/// has them, instead of their rows now (see [`Sink::snapshot_later`]). The subtask's ack of
/// the checkpoint waits for it; the checkpoint completes only with it. Dropped without
/// [`put`](LatePart::put), it declines the checkpoint (the job goes on). A sink must put it
/// within a deadline of its own: until then the next checkpoint is not triggered.
///
/// [`Sink::snapshot_later`]: crate::operators::Sink::snapshot_later
#[derive(Debug)]
pub struct LatePart {
    snapshots: Snapshots,
    node: String,
    id: u64,
    tag: super::StateTag,
    put: bool,
}

impl LatePart {
    /// The checkpoint this part is of.
    pub fn checkpoint_id(&self) -> u64 {
        self.id
    }

    /// Put `bytes` as the part (what `snapshot` would have returned): written and fsynced
    /// now; a failure declines the checkpoint.
    pub fn put(mut self, bytes: &[u8]) {
        self.put = true;
        let Some(inner) = &self.snapshots.0 else { return };
        let part = Snapshots::write_blob(inner, &self.node, self.id, &self.tag, bytes);
        self.snapshots.put_late(&self.node, self.id, part);
    }
}

impl Drop for LatePart {
    fn drop(&mut self) {
        if !self.put {
            let why = format!("node {}: its part of checkpoint {} was dropped before it was put", self.node, self.id);
            self.snapshots.put_late(&self.node, self.id, Err(why));
        }
    }
}

/// A node id as a file name: `/` and NUL cannot appear in one; `..` must not.
fn file_safe(node: &str) -> String {
    node.chars().map(|c| if c == '/' || c == '\0' { '_' } else { c }).collect::<String>().replace("..", "__")
}

/// Bytes of the files in `dir` (not recursive: a RocksDB checkpoint is flat), and of those
/// the SST files that `previous` (an earlier RocksDB checkpoint of the same database: file
/// names are never reused) does not have; all of them without one. One pass over `dir`.
fn dir_bytes(dir: &Path, previous: Option<&Path>) -> (u64, u64) {
    let (mut all, mut new) = (0, 0);
    for e in std::fs::read_dir(dir).into_iter().flatten().filter_map(|e| e.ok()) {
        let Ok(m) = e.metadata() else { continue };
        if !m.is_file() {
            continue;
        }
        all += m.len();
        let sst = e.file_name().to_string_lossy().ends_with(".sst");
        if sst && previous.is_none_or(|p| !p.join(e.file_name()).exists()) {
            new += m.len();
        }
    }
    (all, new)
}
