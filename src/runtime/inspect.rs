//! Looking inside a checkpoint or a savepoint without running its job (`weir state`).
//!
//! [`open`] finds the manifest (a savepoint's directory, one `chk-<n>` directory, or a
//! checkpoint directory: its newest usable checkpoint); [`list`] says what it holds, node by
//! node; [`dump`] writes one node's state as JSON lines:
//!
//! - a **window**: one line per window (a sliding window's pane) and key, with its
//!   accumulator's fields — read as the operator would restore them: its RocksDB snapshots
//!   rebuilt into a temporary directory and read through the window store, windows kept in
//!   the operator's cache copy and in its store folded into one;
//! - a **keyed operator with keyed state**: one line per entry (key, state name, map key,
//!   value), values read by the schemas its checkpoint recorded;
//! - **anything else** (sources, sinks, user operators' own bytes): one line per subtask, its
//!   bytes as JSON where they are JSON (a Kafka source's offsets), in hex otherwise.
//!
//! Keys and values of types declared with their fields
//! ([`fixed_record!`](crate::fixed_record)`(T { .. })`) read as objects, scalars as
//! themselves, opaque types in hex.

use crate::checkpoint::upgrade::{StatePart, StateTag};
use crate::checkpoint::{CheckpointError, Manifest};
use crate::record::schema::{TypeSchema, hex, to_json};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A checkpoint or savepoint opened for reading.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The directory its manifest's paths are relative to.
    pub root: PathBuf,
    /// Its manifest (checked: every file it names is there, whole).
    pub manifest: Manifest,
}

/// Open `path`: a savepoint's directory, a `chk-<n>` directory, or a checkpoint directory
/// (its newest usable checkpoint). Reads only: nothing there is changed or removed.
pub fn open(path: &Path) -> Result<Opened, CheckpointError> {
    let manifest_here = path.join(crate::checkpoint::MANIFEST_FILE);
    if manifest_here.is_file() {
        let is_chk = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("chk-"));
        let root = if is_chk { path.parent().unwrap_or(path).to_path_buf() } else { path.to_path_buf() };
        let manifest = Manifest::read(&root, path)?;
        return Ok(Opened { root, manifest });
    }
    let mut problems = Vec::new();
    for (id, dir) in crate::checkpoint::checkpoint_dirs(path) {
        if !dir.join(crate::checkpoint::MANIFEST_FILE).is_file() {
            continue;
        }
        match Manifest::read(path, &dir) {
            Ok(manifest) => return Ok(Opened { root: path.to_path_buf(), manifest }),
            Err(e) => problems.push(format!("checkpoint {id}: {e}")),
        }
    }
    Err(CheckpointError::Unusable(if problems.is_empty() {
        format!(
            "{}: no checkpoint or savepoint there (give a savepoint's directory, a checkpoint directory, or one \
             of its chk-<n> directories)",
            path.display()
        )
    } else {
        format!("{}: no usable checkpoint: {}", path.display(), problems.join("; "))
    }))
}

/// What [`list`] says of a checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// `checkpoint` or `savepoint`.
    pub kind: &'static str,
    /// Where it is.
    pub path: PathBuf,
    /// The job that took it.
    pub job: String,
    /// Its id.
    pub id: u64,
    /// The manifest format.
    pub format: u32,
    /// The fingerprint of the job that took it (its nodes and edges).
    pub fingerprint: String,
    /// When it completed, ms since the Unix epoch.
    pub completed_unix_ms: u64,
    /// Whether it is the end of input's.
    pub is_final: bool,
    /// A savepoint: whether the job stopped at it.
    pub stopped: Option<bool>,
    /// The savepoint the run that took it started from.
    pub lineage: Option<String>,
    /// Key groups of the job.
    pub max_key_groups: u32,
    /// Every node with a part in it, or that the manifest records.
    pub nodes: Vec<NodeListing>,
}

/// One node in a [`Listing`].
#[derive(Debug, Clone, Serialize)]
pub struct NodeListing {
    /// Its id.
    pub node: String,
    /// Its operator (format 2), or what wrote its bytes.
    pub op: String,
    /// Its parallelism when the checkpoint was taken.
    pub parallelism: u32,
    /// Subtasks with a part of its state.
    pub subtasks: u32,
    /// Key-group ranges its RocksDB snapshots are the truth for.
    pub key_groups: Vec<(u32, u32)>,
    /// Bytes of its operator files and snapshots (snapshots count whole: they share files).
    pub bytes: u64,
    /// What wrote its bytes: kind and version of the format.
    pub written_by: Option<String>,
    /// How its input was keyed: `key_by` id and key type.
    pub keyed_by: Option<String>,
    /// The state its graph declared (a window's shape and aggregates) and its typed parts.
    pub state: Option<String>,
    /// Typed parts, with their schemas.
    pub parts: Vec<StatePart>,
}

/// The first envelope tag of `node`'s bytes in `o`, if any.
fn tag_of(o: &Opened, node: &str) -> Result<Option<StateTag>, CheckpointError> {
    for s in &o.manifest.subtasks {
        if let Some(found) = o.manifest.blob(&o.root, &s.subtask, node)
            && let (Some(tag), _) = found?
        {
            return Ok(Some(tag));
        }
    }
    Ok(None)
}

/// What `o` holds, node by node.
pub fn list(o: &Opened) -> Result<Listing, CheckpointError> {
    let m = &o.manifest;
    let mut names: Vec<String> = m.nodes_with_parts().into_iter().map(str::to_owned).collect();
    for n in m.nodes.keys() {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    let mut nodes = Vec::new();
    for node in names {
        let record = m.nodes.get(&node);
        let layout = m.node_layout(&node);
        let mut bytes = 0;
        let mut key_groups = Vec::new();
        for s in &m.subtasks {
            bytes += s.blobs.iter().filter(|b| b.node == node).map(|b| b.bytes).sum::<u64>();
            for r in s.shards.iter().filter(|r| r.node == node) {
                bytes += r.bytes;
                key_groups.push(r.key_groups);
            }
        }
        key_groups.sort_unstable();
        let tag = tag_of(o, &node)?;
        let mut parts = tag.as_ref().map(|t| t.parts.clone()).unwrap_or_default();
        let state = record.and_then(|r| r.state.as_ref()).map(|s| {
            parts.extend(s.parts.iter().cloned());
            let props: Vec<String> = s.properties.iter().map(|(k, v)| format!("{k} {v}")).collect();
            format!("{}: {}", s.kind, props.join("; "))
        });
        nodes.push(NodeListing {
            op: record.map(|r| r.op.clone()).or_else(|| tag.as_ref().map(|t| t.kind.clone())).unwrap_or_default(),
            parallelism: record.map(|r| r.parallelism).or(layout.as_ref().map(|l| l.parallelism)).unwrap_or(0),
            subtasks: layout.as_ref().map_or(0, |l| l.subtasks.len() as u32),
            key_groups,
            bytes,
            written_by: tag.as_ref().map(|t| format!("{} v{}", t.kind, t.version)),
            keyed_by: record
                .and_then(|r| r.keyed.as_ref())
                .map(|k| format!("{} ({})", k.key_by, crate::record::schema::short_type_name(&k.key_type))),
            state,
            parts,
            node,
        });
    }
    Ok(Listing {
        kind: if m.savepoint.is_some() { "savepoint" } else { "checkpoint" },
        path: o.root.clone(),
        job: m.job.clone(),
        id: m.id,
        format: m.format,
        fingerprint: m.fingerprint.clone(),
        completed_unix_ms: m.completed_unix_ms,
        is_final: m.is_final,
        stopped: m.savepoint.as_ref().map(|s| s.stopped),
        lineage: m.lineage.clone(),
        max_key_groups: m.max_key_groups,
        nodes,
    })
}

impl std::fmt::Display for Listing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} {} of job {:?} in {} (format {}{}{}{})",
            self.kind,
            self.id,
            self.job,
            self.path.display(),
            self.format,
            if self.fingerprint.is_empty() { String::new() } else { format!(", fingerprint {}", self.fingerprint) },
            if self.is_final { ", final: the input had ended" } else { "" },
            match self.stopped {
                Some(true) => ", the job stopped at it",
                _ => "",
            }
        )?;
        writeln!(
            f,
            "{} key groups{}",
            self.max_key_groups,
            match &self.lineage {
                Some(l) => format!("; started from savepoint {l}"),
                None => String::new(),
            }
        )?;
        writeln!(
            f,
            "{:<24} {:<12} {:>4} {:>8} {:>12} {:>12}  state",
            "node", "op", "par", "subtasks", "key groups", "bytes"
        )?;
        for n in &self.nodes {
            let kg = match (n.key_groups.iter().map(|k| k.0).min(), n.key_groups.iter().map(|k| k.1).max()) {
                (Some(a), Some(b)) => format!("{a}..{b}"),
                _ => "-".into(),
            };
            let mut what = Vec::new();
            if let Some(k) = &n.keyed_by {
                what.push(format!("keyed by {k}"));
            }
            if let Some(s) = &n.state {
                what.push(s.clone());
            }
            if let Some(w) = &n.written_by {
                what.push(format!("bytes of {w}"));
            }
            for p in &n.parts {
                what.push(format!("{} `{}`: {}", p.kind, p.name, p.value));
            }
            writeln!(
                f,
                "{:<24} {:<12} {:>4} {:>8} {:>12} {:>12}  {}",
                n.node,
                n.op,
                n.parallelism,
                n.subtasks,
                kg,
                n.bytes,
                what.join("; ")
            )?;
        }
        Ok(())
    }
}

/// Why [`dump`] could not read a node.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The checkpoint's files.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The node is not there, or weir cannot read its state without the job's code.
    #[error("{0}")]
    Unreadable(String),
    /// Writing the lines.
    #[error("cannot write: {0}")]
    Write(#[from] std::io::Error),
}

/// Write `node`'s state in `o` as JSON lines into `out` (only key `key`'s, if given: a
/// window's key as a number, a keyed state's key as its JSON). Returns the lines written.
pub fn dump(o: &Opened, node: &str, key: Option<&str>, out: &mut dyn Write) -> Result<u64, DumpError> {
    let m = &o.manifest;
    let Some(layout) = m.node_layout(node) else {
        let known: Vec<&str> = m.nodes_with_parts().into_iter().collect();
        return Err(DumpError::Unreadable(format!(
            "checkpoint {} holds no state of node {node} (nodes with state: {})",
            m.id,
            known.join(", ")
        )));
    };
    let record = m.nodes.get(node);
    let tag = tag_of(o, node)?;
    let op = record.map(|r| r.op.as_str()).or(tag.as_ref().map(|t| t.kind.as_str())).unwrap_or("");
    let has_shards = m.subtasks.iter().flat_map(|s| &s.shards).any(|r| r.node == node);
    match op {
        "window" => dump_window(o, node, record, key, out),
        "keyed_state" => dump_keyed_state(o, node, tag.map(|t| t.parts).unwrap_or_default(), key, has_shards, out),
        _ => {
            let mut lines = 0;
            for (index, s) in &layout.subtasks {
                let Some(found) = m.blob(&o.root, &s.subtask, node) else { continue };
                let (tag, bytes) = found?;
                let state = match serde_json::from_slice::<serde_json::Value>(&bytes) {
                    Ok(json) if !bytes.is_empty() => json,
                    _ => serde_json::Value::String(hex(&bytes)),
                };
                let line = serde_json::json!({
                    "subtask": index,
                    "kind": tag.as_ref().map(|t| t.kind.clone()),
                    "version": tag.as_ref().map(|t| t.version),
                    "bytes": bytes.len(),
                    "state": state,
                });
                writeln!(out, "{line}")?;
                lines += 1;
            }
            Ok(lines)
        }
    }
}

/// A temporary directory, removed when dropped.
#[cfg(feature = "rocksdb")]
struct TempDir(PathBuf);

#[cfg(feature = "rocksdb")]
impl TempDir {
    fn new(what: &str) -> std::io::Result<TempDir> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("weir-state-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

#[cfg(feature = "rocksdb")]
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `node`'s RocksDB snapshots rebuilt into shards of a temporary state directory, one per
/// snapshot, with their key groups, and the backend over them.
#[cfg(feature = "rocksdb")]
struct Rebuilt {
    backend: crate::state::StateBackend,
    /// (shard, key groups) per snapshot.
    shards: Vec<(usize, std::ops::Range<u32>)>,
    _dir: TempDir,
}

#[cfg(feature = "rocksdb")]
fn rebuild(o: &Opened, node: &str, merges: &crate::state::MergeOperators) -> Result<Option<Rebuilt>, DumpError> {
    let refs: Vec<&crate::checkpoint::ShardRef> =
        o.manifest.subtasks.iter().flat_map(|s| &s.shards).filter(|r| r.node == node).collect();
    if refs.is_empty() {
        return Ok(None);
    }
    let dir = TempDir::new(node).map_err(DumpError::Write)?;
    let mut shards = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        let key_groups = r.key_groups.0..r.key_groups.1;
        let parts: Vec<crate::state::RestorePart> = [node.to_owned(), crate::state::cache_copy_family(node)]
            .into_iter()
            .map(|family| crate::state::RestorePart {
                snapshot: o.root.join(&r.dir),
                operator: family,
                key_groups: key_groups.clone(),
            })
            .collect();
        crate::state::restore_shard(&dir.0, i, &parts, merges)
            .map_err(|e| DumpError::Unreadable(format!("cannot read the snapshot {}: {e}", r.dir)))?;
        shards.push((i, key_groups));
    }
    let config = crate::state::StateConfig {
        block_cache_bytes: 8 << 20,
        memtable_bytes: 8 << 20,
        ..crate::state::StateConfig::new(&dir.0, shards.len())
    };
    let backend = crate::state::StateBackend::open_with(config, merges.clone())
        .map_err(|e| DumpError::Unreadable(format!("cannot open the rebuilt snapshots of {node}: {e}")))?;
    Ok(Some(Rebuilt { backend, shards, _dir: dir }))
}

/// Without the `rocksdb` feature this build cannot open RocksDB snapshots: a node that has
/// them is refused with the feature named (state on the heap backend is read all the same).
#[cfg(not(feature = "rocksdb"))]
fn refuse_snapshots(o: &Opened, node: &str) -> Result<(), DumpError> {
    match o.manifest.subtasks.iter().flat_map(|s| &s.shards).any(|r| r.node == node) {
        true => Err(DumpError::Unreadable(crate::util::section::not_built(
            &format!("reading node {node}'s RocksDB snapshots"),
            "rocksdb",
        ))),
        false => Ok(()),
    }
}

/// A window's encoded value: `end u64 LE | caught-up u64 LE | accumulator`.
fn window_line(kg: u16, key: u64, start: u64, value: &[u8], acc: &TypeSchema) -> serde_json::Value {
    let word = |at: usize| value.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let bytes = value.get(16..).unwrap_or(&[]);
    let json = to_json(acc, bytes).unwrap_or_else(|| serde_json::Value::String(hex(bytes)));
    serde_json::json!({
        "key_group": kg,
        "key": key,
        "start_ns": start,
        "end_ns": word(0),
        "acc": json,
    })
}

/// The merge operators a window's rebuilt snapshots are opened with.
#[cfg(feature = "rocksdb")]
fn merges_of(node: &str, merge: &Option<crate::state::ValueMerge>) -> crate::state::MergeOperators {
    merge.iter().map(|m| (node.to_owned(), m.clone())).collect()
}

fn dump_window(
    o: &Opened,
    node: &str,
    record: Option<&crate::checkpoint::upgrade::NodeRecord>,
    key: Option<&str>,
    out: &mut dyn Write,
) -> Result<u64, DumpError> {
    let key: Option<u64> = match key {
        Some(k) => {
            Some(k.parse().map_err(|_| DumpError::Unreadable(format!("--key {k}: a window's key is a number (u64)")))?)
        }
        None => None,
    };
    let schema = record.and_then(|r| r.state.as_ref());
    let part = schema.and_then(|s| s.parts.iter().find(|p| p.kind == "windows"));
    let Some((schema, part)) = schema.zip(part) else {
        return Err(DumpError::Unreadable(format!(
            "checkpoint {} does not describe node {node}'s windows (manifest format {}: taken by an older weir)",
            o.manifest.id, o.manifest.format
        )));
    };
    let session = schema.properties.get("shape").is_some_and(|s| s.starts_with("session"));
    // Partial windows of aligned shapes fold by the aggregate's merge: weir has it for its
    // built-in aggregates only.
    let builtin = schema.properties.contains_key("aggregates")
        && plan_same(&part.value, &<crate::window::Stats as crate::record::Record>::schema());
    let merge: Option<crate::state::ValueMerge> =
        builtin.then(|| crate::window::value_merge::<crate::window::Stats>(|a, b| a.merge(b)));
    if !session && merge.is_none() {
        return Err(DumpError::Unreadable(format!(
            "node {node} aggregates {} windows with a fold of its own ({}): its partial windows fold only with the \
             job's code; weir state dump reads windows of the built-in aggregates and session windows",
            schema.properties.get("shape").map_or("", String::as_str),
            part.value
        )));
    }
    // (kg, key, start) → value; partials of one window folded.
    let mut windows: BTreeMap<(u16, u64, u64), Vec<u8>> = BTreeMap::new();
    let mut put = |kg: u16, k: u64, start: u64, value: &[u8]| {
        if key.is_some_and(|want| want != k) {
            return;
        }
        match windows.entry((kg, k, start)) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(value.to_vec());
            }
            std::collections::btree_map::Entry::Occupied(mut e) => {
                if let Some(m) = &merge
                    && let Some(folded) = m(Some(e.get()), &mut std::iter::once(value))
                {
                    e.insert(folded);
                }
            }
        }
    };
    #[cfg(not(feature = "rocksdb"))]
    refuse_snapshots(o, node)?;
    #[cfg(feature = "rocksdb")]
    if let Some(rebuilt) = rebuild(o, node, &merges_of(node, &merge))? {
        for (shard, key_groups) in &rebuilt.shards {
            let store = |family: &str| {
                rebuilt.backend.store(family, *shard).map_err(|e| DumpError::Unreadable(format!("{node}: {e}")))
            };
            let (windows_cf, copies) = (store(node)?, store(&crate::state::cache_copy_family(node))?);
            let mut ws: Box<dyn crate::window::WindowStore> = match &merge {
                Some(m) => Box::new(
                    crate::window::RunStore::new(windows_cf, key_groups.clone(), m.clone(), 1 << 20)
                        .with_copies(copies),
                ),
                None => {
                    Box::new(crate::window::RocksWindowStore::new(windows_cf, key_groups.clone()).with_copies(copies))
                }
            };
            let fail = |e: crate::window::StoreError| DumpError::Unreadable(format!("node {node}: {e}"));
            ws.scan_from((0, 0), &mut |kg, k, start, v| {
                put(kg, k, start, v);
                true
            })
            .map_err(fail)?;
            let mut bad = None;
            ws.scan_copies((0, 0), &mut |kg, k, mut copy| {
                while !copy.is_empty() {
                    let Some((start, len, rest)) = copy.get(..12).map(|h| {
                        (
                            u64::from_le_bytes(h[..8].try_into().expect("8")),
                            u32::from_le_bytes(h[8..12].try_into().expect("4")) as usize,
                            &copy[12..],
                        )
                    }) else {
                        bad = Some(format!("key group {kg}, key {k}: a truncated copy"));
                        return false;
                    };
                    let Some(v) = rest.get(..len) else {
                        bad = Some(format!("key group {kg}, key {k}: a truncated copy"));
                        return false;
                    };
                    put(kg, k, start, v);
                    copy = &rest[len..];
                }
                true
            })
            .map_err(fail)?;
            if let Some(b) = bad {
                return Err(DumpError::Unreadable(format!("node {node}: {b}")));
            }
        }
    }
    // The heap backend keeps windows in the operator's bytes: `kg u16 | key u64 | start
    // u64 | length u32 | value`, after the window snapshot's header.
    for s in &o.manifest.subtasks {
        let Some(found) = o.manifest.blob(&o.root, &s.subtask, node) else { continue };
        let (_, bytes) = found?;
        let Some(rest) = bytes.strip_prefix(b"weirwin1".as_slice()) else { continue };
        if rest.get(24) != Some(&1) {
            continue;
        }
        let mut inline = &rest[25..];
        while !inline.is_empty() {
            let head =
                inline.get(..22).ok_or_else(|| DumpError::Unreadable(format!("node {node}: truncated windows")))?;
            let kg = u16::from_le_bytes(head[..2].try_into().expect("2"));
            let k = u64::from_le_bytes(head[2..10].try_into().expect("8"));
            let start = u64::from_le_bytes(head[10..18].try_into().expect("8"));
            let len = u32::from_le_bytes(head[18..22].try_into().expect("4")) as usize;
            let v = inline
                .get(22..22 + len)
                .ok_or_else(|| DumpError::Unreadable(format!("node {node}: truncated windows")))?;
            put(kg, k, start, v);
            inline = &inline[22 + len..];
        }
    }
    let mut lines = 0;
    for ((kg, k, start), v) in &windows {
        writeln!(out, "{}", window_line(*kg, *k, *start, v, &part.value))?;
        lines += 1;
    }
    Ok(lines)
}

fn plan_same(a: &TypeSchema, b: &TypeSchema) -> bool {
    crate::record::schema::plan(a, b).is_ok_and(|m| m.is_same())
}

/// One keyed-state entry as a line: its key and value read by the part's schemas.
fn state_line(
    parts: &[StatePart],
    kg: u16,
    key: &[u8],
    namespace: &[u8],
    value: &[u8],
    want: Option<&str>,
) -> Option<serde_json::Value> {
    let (&kind, rest) = namespace.split_first()?;
    let (&len, rest) = rest.split_first()?;
    let (name, map_key) = rest.split_at_checked(len as usize)?;
    let name = String::from_utf8_lossy(name).into_owned();
    let ttl = kind.is_ascii_uppercase();
    let word = match kind.to_ascii_lowercase() {
        b'v' => "value",
        b'l' => "list",
        b'm' => "map",
        _ => return None,
    };
    let kind_name = if ttl { format!("{word}_ttl") } else { word.to_owned() };
    let part = parts.iter().find(|p| p.name == name && p.kind == kind_name);
    let read = |schema: Option<&TypeSchema>, bytes: &[u8]| {
        schema.and_then(|s| to_json(s, bytes)).unwrap_or_else(|| serde_json::Value::String(hex(bytes)))
    };
    let key_json = read(part.and_then(|p| p.key.as_ref()), key);
    if let Some(w) = want {
        let wanted =
            serde_json::from_str::<serde_json::Value>(w).unwrap_or_else(|_| serde_json::Value::String(w.into()));
        if key_json != wanted && key_json.as_str() != Some(w) {
            return None;
        }
    }
    let one = |stored: &[u8]| -> (Option<u64>, serde_json::Value) {
        let (expiry, bytes) = match ttl {
            true if stored.len() >= 8 => (Some(u64::from_le_bytes(stored[..8].try_into().expect("8"))), &stored[8..]),
            _ => (None, stored),
        };
        (expiry, read(part.map(|p| &p.value), bytes))
    };
    let mut line = serde_json::json!({ "key_group": kg, "key": key_json, "state": name, "kind": kind_name });
    match word {
        "list" => {
            let mut items = Vec::new();
            let mut rest = value;
            while let Some((len, r)) = rest.split_first_chunk::<4>() {
                let len = u32::from_le_bytes(*len) as usize;
                let Some((element, r)) = r.split_at_checked(len) else { break };
                let (expiry, v) = one(element);
                items.push(match expiry {
                    Some(e) => serde_json::json!({ "value": v, "expires_unix_ns": e }),
                    None => v,
                });
                rest = r;
            }
            line["value"] = serde_json::Value::Array(items);
        }
        _ => {
            if word == "map" {
                line["map_key"] = read(part.and_then(|p| p.map_key.as_ref()), map_key);
            }
            let (expiry, v) = one(value);
            line["value"] = v;
            if let Some(e) = expiry {
                line["expires_unix_ns"] = serde_json::json!(e);
            }
        }
    }
    Some(line)
}

fn dump_keyed_state(
    o: &Opened,
    node: &str,
    parts: Vec<StatePart>,
    key: Option<&str>,
    has_shards: bool,
    out: &mut dyn Write,
) -> Result<u64, DumpError> {
    let mut lines = 0;
    #[cfg(not(feature = "rocksdb"))]
    if has_shards {
        refuse_snapshots(o, node)?;
    }
    #[cfg(feature = "rocksdb")]
    if has_shards {
        let merges: crate::state::MergeOperators =
            [(node.to_owned(), crate::state::list_merge())].into_iter().collect();
        let rebuilt = rebuild(o, node, &merges)?.expect("has shards");
        for (shard, key_groups) in &rebuilt.shards {
            let store =
                rebuilt.backend.store(node, *shard).map_err(|e| DumpError::Unreadable(format!("{node}: {e}")))?;
            let mut cursor = store.scan(key_groups.clone());
            while let Some(e) = cursor.next().map_err(|e| DumpError::Unreadable(format!("{node}: {e}")))? {
                if let Some(line) = state_line(&parts, e.key_group, e.key, e.namespace, e.value, key) {
                    writeln!(out, "{line}")?;
                    lines += 1;
                }
            }
        }
        return Ok(lines);
    }
    // In memory, in the operator's bytes (`WKS1`, its own bytes, then 1 and the entries:
    // `count u64 | (length u32 | encoded key | length u32 | value)*`).
    for s in &o.manifest.subtasks {
        let Some(found) = o.manifest.blob(&o.root, &s.subtask, node) else { continue };
        let (_, bytes) = found?;
        let bad =
            || DumpError::Unreadable(format!("node {node}: its bytes are not a keyed operator's with keyed state"));
        let rest = bytes.strip_prefix(b"WKS1".as_slice()).ok_or_else(bad)?;
        let (own_len, rest) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
        let rest = rest.get(u64::from_le_bytes(*own_len) as usize..).ok_or_else(bad)?;
        let Some((1, entries)) = rest.split_first().map(|(a, b)| (*a, b)) else { continue };
        let (_, mut entries) = entries.split_first_chunk::<8>().ok_or_else(bad)?;
        while !entries.is_empty() {
            let (k, r) = take_len(entries).ok_or_else(bad)?;
            let (v, r) = take_len(r).ok_or_else(bad)?;
            entries = r;
            let parsed = crate::state::key::decode_key(k).ok_or_else(bad)?;
            if let Some(line) = state_line(&parts, parsed.key_group, parsed.key, parsed.namespace, v, key) {
                writeln!(out, "{line}")?;
                lines += 1;
            }
        }
    }
    Ok(lines)
}

/// `length u32 LE | bytes` at the front of `b`: (bytes, rest).
fn take_len(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, r) = b.split_first_chunk::<4>()?;
    r.split_at_checked(u32::from_le_bytes(*len) as usize)
}
