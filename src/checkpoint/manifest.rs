//! The manifest: what one completed checkpoint consists of. JSON, with a CRC-32 of its own
//! content, written by write-temp, fsync, rename, fsync of the directory, so it is either
//! there whole or not at all, and a torn or edited one is detected rather than trusted.

use super::CheckpointError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The manifest's file name inside `chk-<id>/`.
pub const MANIFEST_FILE: &str = "_manifest.json";
/// Its format version: 2 adds the job's nodes, its fingerprint, the lineage and savepoint
/// fields, and an envelope around every operator's bytes ([`super::upgrade`]). Format 1 is
/// still read.
pub const FORMAT: u32 = 2;

/// An operator's bytes in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRef {
    /// The node.
    pub node: String,
    /// The file, relative to the checkpoint directory root.
    pub file: String,
    /// Its length.
    pub bytes: u64,
    /// Its CRC-32.
    pub crc32: u32,
}

/// A RocksDB snapshot of a shard, and what in it this checkpoint takes from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRef {
    /// The node (its column family).
    pub node: String,
    /// The directory (a RocksDB checkpoint), relative to the checkpoint directory root.
    pub dir: String,
    /// The key groups of the node this snapshot is the truth for: `[start, end)`.
    pub key_groups: (u32, u32),
    /// Bytes of its SST files (hard links: shared with the live shard and other snapshots).
    pub bytes: u64,
    /// Of which in SST files that the subtask's previous snapshot of the node did not have:
    /// what this checkpoint added (all of it for a subtask's first in a run). Left out of
    /// the JSON when 0, so a manifest written before the field existed re-serializes to the
    /// same bytes and its checksum still matches.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub new_bytes: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// One subtask's part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskSnapshot {
    /// `head-node#index`.
    pub subtask: String,
    /// Operator bytes, by node.
    pub blobs: Vec<BlobRef>,
    /// Shard snapshots, by node.
    pub shards: Vec<ShardRef>,
}

/// What makes a checkpoint's manifest a savepoint's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavepointInfo {
    /// Unique to this savepoint (job, checkpoint id, time): the lineage of runs started from it.
    pub uid: String,
    /// Whether the job stopped right after it (`weir stop --savepoint`).
    pub stopped: bool,
}

/// A completed checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The manifest's format version (`FORMAT` for what this build writes).
    pub format: u32,
    /// The job's name.
    pub job: String,
    /// The checkpoint id (increasing).
    pub id: u64,
    /// Whether this is the end of input: every source was exhausted; a job restored from it
    /// only commits what its sinks prepared, and ends.
    #[serde(rename = "final")]
    pub is_final: bool,
    /// When it completed, ms since the Unix epoch.
    pub completed_unix_ms: u64,
    /// Trigger to manifest, ns.
    pub duration_ns: u64,
    /// Key groups of the job (state is laid out by them).
    pub max_key_groups: u32,
    /// Every subtask of the job, with its parts; a restore refuses a job of other subtasks.
    pub subtasks: Vec<SubtaskSnapshot>,
    /// Every node of the job that took it, by id (format 2; empty in format 1).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nodes: BTreeMap<String, super::upgrade::NodeRecord>,
    /// The fingerprint of the job that took it (`Job::fingerprint`: its nodes and edges; format 2).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fingerprint: String,
    /// The savepoint the run that took it started from (itself, or through the checkpoints
    /// of runs that did): its `uid`. A job started from a savepoint restores its own newer
    /// checkpoints of the same lineage rather than the savepoint again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<String>,
    /// Set in a savepoint's manifest only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub savepoint: Option<SavepointInfo>,
    /// CRC-32 of the manifest's JSON with this field 0.
    pub checksum: u32,
}

impl Manifest {
    fn checksum_of(&self) -> u32 {
        let body = serde_json::to_vec(&Manifest { checksum: 0, ..self.clone() }).expect("a manifest serializes");
        crc32fast::hash(&body)
    }

    /// The subtask's part.
    pub fn subtask(&self, name: &str) -> Option<&SubtaskSnapshot> {
        self.subtasks.iter().find(|s| s.subtask == name)
    }

    /// Where `node`'s parts are: its parallelism when this checkpoint was taken, and by
    /// subtask index the subtask part that holds them. `None`: nothing of `node` is in it
    /// (a stateless node, or one the job did not have).
    ///
    /// Subtasks are named `head#index` after the first node of their chain; the node's
    /// parallelism is that of the chain: how many subtasks bear the head's name.
    pub fn node_layout(&self, node: &str) -> Option<NodeLayout<'_>> {
        let mut subtasks = Vec::new();
        let mut head = None;
        for s in &self.subtasks {
            if s.blobs.iter().any(|b| b.node == node) || s.shards.iter().any(|r| r.node == node) {
                let (h, index) = split_subtask_name(&s.subtask)?;
                head = Some(h);
                subtasks.push((index, s));
            }
        }
        let head = head?;
        let parallelism =
            self.subtasks.iter().filter(|s| split_subtask_name(&s.subtask).is_some_and(|(h, _)| h == head)).count();
        subtasks.sort_by_key(|(i, _)| *i);
        Some(NodeLayout { parallelism: parallelism as u32, subtasks })
    }

    /// Every node with a part (operator bytes or a shard snapshot) in this checkpoint.
    pub fn nodes_with_parts(&self) -> std::collections::BTreeSet<&str> {
        self.subtasks
            .iter()
            .flat_map(|s| s.blobs.iter().map(|b| b.node.as_str()).chain(s.shards.iter().map(|r| r.node.as_str())))
            .collect()
    }

    /// Bytes of its files (shard snapshots counted whole).
    pub fn bytes(&self) -> u64 {
        self.subtasks.iter().flat_map(|s| s.blobs.iter().map(|b| b.bytes).chain(s.shards.iter().map(|r| r.bytes))).sum()
    }

    /// Bytes this checkpoint added: operator bytes, and SST files the subtasks' previous
    /// snapshots did not have (the rest are hard links shared with them).
    pub fn new_bytes(&self) -> u64 {
        self.subtasks
            .iter()
            .flat_map(|s| s.blobs.iter().map(|b| b.bytes).chain(s.shards.iter().map(|r| r.new_bytes)))
            .sum()
    }

    /// Write it as `dir/_manifest.json`: temp file, fsync, rename, fsync of `dir`.
    pub fn write(mut self, dir: &Path) -> Result<Manifest, CheckpointError> {
        self.checksum = self.checksum_of();
        let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
        let path = dir.join(MANIFEST_FILE);
        let body = serde_json::to_vec_pretty(&self).expect("a manifest serializes");
        let mut f = std::fs::File::create(&tmp).map_err(CheckpointError::io("cannot create", &tmp))?;
        f.write_all(&body).map_err(CheckpointError::io("cannot write", &tmp))?;
        f.sync_all().map_err(CheckpointError::io("cannot fsync", &tmp))?;
        drop(f);
        super::failpoint!("checkpoint::before-manifest-rename");
        std::fs::rename(&tmp, &path).map_err(CheckpointError::io("cannot rename the manifest to", &path))?;
        sync_dir(dir)?;
        Ok(self)
    }

    /// Read and check `chk_dir/_manifest.json`: it parses, its checksum matches, and every
    /// file it names exists with the recorded length and CRC-32.
    pub fn read(root: &Path, chk_dir: &Path) -> Result<Manifest, CheckpointError> {
        let path = chk_dir.join(MANIFEST_FILE);
        let body = std::fs::read(&path).map_err(CheckpointError::io("cannot read", &path))?;
        let m: Manifest = serde_json::from_slice(&body)
            .map_err(|e| CheckpointError::corrupt(&path, format!("not a readable manifest: {e}")))?;
        if m.format != FORMAT && m.format != 1 {
            return Err(CheckpointError::corrupt(
                &path,
                format!("format {} (this build reads 1 and {FORMAT}: was it written by a newer weir?)", m.format),
            ));
        }
        if m.checksum != m.checksum_of() {
            return Err(CheckpointError::corrupt(&path, "checksum mismatch (the file was changed or torn)"));
        }
        for s in &m.subtasks {
            for b in &s.blobs {
                let file = root.join(&b.file);
                let bytes = std::fs::read(&file).map_err(CheckpointError::io("the manifest names", &file))?;
                if bytes.len() as u64 != b.bytes || crc32fast::hash(&bytes) != b.crc32 {
                    return Err(CheckpointError::corrupt(&file, "length or CRC-32 differs from the manifest's"));
                }
            }
            for r in &s.shards {
                let dir = root.join(&r.dir);
                if !dir.join("CURRENT").is_file() {
                    return Err(CheckpointError::corrupt(&dir, "not a complete RocksDB checkpoint (no CURRENT)"));
                }
            }
        }
        Ok(m)
    }

    /// The bytes of `node` of subtask `subtask` (checked when the manifest was read), as the
    /// operator wrote them, with the tag of their envelope (format 2; `None` in format 1 and
    /// for empty bytes).
    pub fn blob(
        &self,
        root: &Path,
        subtask: &str,
        node: &str,
    ) -> Option<Result<super::upgrade::TaggedBytes, CheckpointError>> {
        let b = self.subtask(subtask)?.blobs.iter().find(|b| b.node == node)?;
        let file = root.join(&b.file);
        let bytes = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) => return Some(Err(CheckpointError::io("cannot read", &file)(e))),
        };
        if self.format < 2 {
            return Some(Ok((None, bytes)));
        }
        Some(match super::upgrade::open_envelope(&bytes) {
            Ok((tag, payload)) => Ok((tag, payload.to_vec())),
            Err(source) => Err(CheckpointError::Envelope { path: file, source }),
        })
    }
}

/// Where one node's parts are in a checkpoint ([`Manifest::node_layout`]).
#[derive(Debug, Clone)]
pub struct NodeLayout<'a> {
    /// The node's parallelism when the checkpoint was taken.
    pub parallelism: u32,
    /// The subtask parts holding the node's parts, by subtask index, in index order.
    pub subtasks: Vec<(u32, &'a SubtaskSnapshot)>,
}

/// `head#index` → (head, index).
fn split_subtask_name(name: &str) -> Option<(&str, u32)> {
    let (head, index) = name.rsplit_once('#')?;
    Some((head, index.parse().ok()?))
}

/// fsync a directory, so the names created or renamed in it survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    let d = std::fs::File::open(dir).map_err(CheckpointError::io("cannot open directory", dir))?;
    d.sync_all().map_err(CheckpointError::io("cannot fsync directory", dir))
}

/// `chk-<id>` directories under `root`, by id, newest first.
pub(crate) fn checkpoint_dirs(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut dirs: Vec<(u64, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_prefix("chk-")?.parse().ok()?;
            Some((id, e.path()))
        })
        .collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format: FORMAT,
            job: "j".into(),
            id: 7,
            is_final: false,
            completed_unix_ms: 1,
            duration_ns: 2,
            max_key_groups: 128,
            subtasks: vec![SubtaskSnapshot { subtask: "src#0".into(), blobs: vec![], shards: vec![] }],
            nodes: BTreeMap::new(),
            fingerprint: String::new(),
            lineage: None,
            savepoint: None,
            checksum: 0,
        }
    }

    /// A node's layout is found by node and subtask index, with the parallelism of the
    /// chain it ran in (how many subtasks bear the chain head's name); `check_layout`
    /// reports what changed parallelism and refuses other key groups, `check_upgrade`
    /// missing nodes.
    #[test]
    fn node_layout_and_what_a_restore_may_change() {
        let blob = |node: &str| BlobRef { node: node.into(), file: String::new(), bytes: 1, crc32: 0 };
        let node = |op: &str| crate::checkpoint::upgrade::NodeRecord {
            op: op.into(),
            parallelism: 2,
            keyed: None,
            state: None,
        };
        let sub = |name: &str, blobs: Vec<BlobRef>| SubtaskSnapshot { subtask: name.into(), blobs, shards: vec![] };
        let m = Manifest {
            subtasks: vec![
                sub("src#0", vec![blob("src")]),
                sub("src#1", vec![blob("src")]),
                sub("count#0", vec![blob("count")]),
                sub("count#1", vec![blob("count")]),
                sub("count#2", vec![blob("count")]),
                sub("out#0", vec![]),
            ],
            ..sample()
        };
        let layout = m.node_layout("count").unwrap();
        assert_eq!(layout.parallelism, 3);
        assert_eq!(
            layout.subtasks.iter().map(|(i, s)| (*i, s.subtask.as_str())).collect::<Vec<_>>(),
            [(0, "count#0"), (1, "count#1"), (2, "count#2")]
        );
        assert!(m.node_layout("out").is_none(), "a node without parts");
        let check = |nodes: &[(&str, u32)], kg| {
            let nodes: Vec<(String, u32)> = nodes.iter().map(|(n, p)| (n.to_string(), *p)).collect();
            crate::checkpoint::restore::check_layout(&m, &nodes, kg)
        };
        let changed = check(&[("src", 2), ("count", 1), ("out", 4), ("new", 1)], 128).unwrap();
        assert_eq!(changed, vec![crate::checkpoint::restore::Rescale { node: "count".into(), from: 3, to: 1 }]);
        let e = check(&[("src", 2), ("count", 3)], 256).unwrap_err().to_string();
        assert!(e.contains("128 key groups") && e.contains("max_key_groups = 128"), "{e}");
        let e = crate::checkpoint::upgrade::check_upgrade(&m, &[("src".into(), node("source"))].into(), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("node count that this job does not have"), "{e}");
    }

    /// A manifest written before `ShardRef::new_bytes` existed (a shard without the field)
    /// still reads: its checksum is over the same bytes. One with the field reads it back.
    #[test]
    fn a_manifest_without_new_bytes_still_reads() {
        let root = std::env::temp_dir().join(format!("weir-manifest-old-{}", std::process::id()));
        let dir = root.join("chk-7");
        std::fs::create_dir_all(dir.join("s.rocksdb")).unwrap();
        std::fs::write(dir.join("s.rocksdb").join("CURRENT"), b"x").unwrap();
        let shard = |new_bytes| ShardRef {
            node: "count".into(),
            dir: "chk-7/s.rocksdb".into(),
            key_groups: (0, 128),
            bytes: 10,
            new_bytes,
        };
        let m = Manifest {
            subtasks: vec![SubtaskSnapshot { subtask: "count#0".into(), blobs: vec![], shards: vec![shard(0)] }],
            ..sample()
        };
        m.write(&dir).unwrap();
        let text = std::fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
        assert!(!text.contains("new_bytes"), "the old format: {text}");
        assert_eq!(Manifest::read(&root, &dir).unwrap().subtasks[0].shards[0].new_bytes, 0);
        let m = Manifest {
            subtasks: vec![SubtaskSnapshot { subtask: "count#0".into(), blobs: vec![], shards: vec![shard(5)] }],
            ..sample()
        };
        m.write(&dir).unwrap();
        assert_eq!(Manifest::read(&root, &dir).unwrap().subtasks[0].shards[0].new_bytes, 5);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A written manifest reads back equal; one changed byte is refused by its checksum; a
    /// torn one does not parse.
    #[test]
    fn write_read_and_detect_damage() {
        let root = std::env::temp_dir().join(format!("weir-manifest-{}", std::process::id()));
        let dir = root.join("chk-7");
        std::fs::create_dir_all(&dir).unwrap();
        let written = sample().write(&dir).unwrap();
        assert_eq!(Manifest::read(&root, &dir).unwrap(), written);
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"id\": 7", "\"id\": 8")).unwrap();
        assert!(Manifest::read(&root, &dir).unwrap_err().to_string().contains("checksum"));
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        assert!(Manifest::read(&root, &dir).unwrap_err().to_string().contains("not a readable manifest"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
