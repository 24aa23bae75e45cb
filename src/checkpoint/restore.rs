//! Recovery: find the newest usable checkpoint, and rebuild the state shards from it.

use super::CheckpointError;
use super::manifest::{MANIFEST_FILE, Manifest, checkpoint_dirs};
#[cfg(feature = "rocksdb")]
use std::collections::BTreeMap;
use std::path::Path;

/// What a job starts from.
#[derive(Debug, Clone)]
pub struct Found {
    /// The newest usable checkpoint, if any.
    pub manifest: Option<Manifest>,
    /// Newer checkpoints skipped, and why (printed as warnings).
    pub warnings: Vec<String>,
    /// The id the next checkpoint of this run gets: after every id in the directory.
    pub next_id: u64,
}

/// The file that says a directory is weir's checkpoint directory: only in one that holds it
/// does weir remove anything (partial checkpoints, old ones, final directories).
pub const MARKER_FILE: &str = "WEIR-CHECKPOINTS";

/// Make `root` weir's checkpoint directory, or check that it is. Created (or empty): the
/// marker is written. Marked: it is ours. Not marked but holding a weir manifest (written
/// before the marker existed): adopted, the marker written. Anything else (a directory that
/// holds other files) is refused: weir would delete what is not its own.
pub fn claim(root: &Path) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(root).map_err(CheckpointError::io("cannot create the checkpoint directory", root))?;
    let marker = root.join(MARKER_FILE);
    if marker.is_file() {
        return Ok(());
    }
    let entries: Vec<String> = std::fs::read_dir(root)
        .map_err(CheckpointError::io("cannot read the checkpoint directory", root))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let weirs = checkpoint_dirs(root).iter().any(|(_, d)| d.join(MANIFEST_FILE).is_file());
    if !entries.is_empty() && !weirs {
        let mut shown: Vec<&str> = entries.iter().map(String::as_str).take(3).collect();
        shown.sort_unstable();
        return Err(CheckpointError::Unusable(format!(
            "{} is not empty ({}{}) and not a weir checkpoint directory (no {MARKER_FILE}); weir removes old checkpoints there, so give it an empty or new directory",
            root.display(),
            shown.join(", "),
            if entries.len() > 3 { ", ..." } else { "" }
        )));
    }
    std::fs::write(&marker, b"weir checkpoints: weir removes chk-*, final-* and partial checkpoints here\n")
        .map_err(CheckpointError::io("cannot write", &marker))
}

/// Look for the newest usable checkpoint in `root`. Partial checkpoints (no manifest) are
/// removed; an unreadable manifest is skipped with a warning for the one before it; if
/// every manifest is unreadable, that is an error (starting fresh would silently drop
/// the state they were meant to hold).
pub fn find(root: &Path) -> Result<Found, CheckpointError> {
    let dirs = checkpoint_dirs(root);
    let next_id = dirs.first().map_or(1, |(id, _)| id + 1);
    let mut warnings = Vec::new();
    let mut unreadable = 0;
    for (id, dir) in &dirs {
        if !dir.join(MANIFEST_FILE).exists() {
            // Partial: a crash or failure before its manifest was renamed into place.
            let _ = std::fs::remove_dir_all(dir);
            continue;
        }
        match Manifest::read(root, dir) {
            Ok(m) => return Ok(Found { manifest: Some(m), warnings, next_id }),
            Err(e) => {
                unreadable += 1;
                warnings.push(format!("checkpoint {id} is not usable, falling back to the one before it: {e}"));
            }
        }
    }
    if unreadable > 0 {
        return Err(CheckpointError::Unusable(format!(
            "no usable checkpoint in {}: {}; move the directory away to start the job without its state",
            root.display(),
            warnings.join("; ")
        )));
    }
    Ok(Found { manifest: None, warnings, next_id })
}

/// A node whose parallelism differs from the checkpoint's: its state moves between subtasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rescale {
    /// The node.
    pub node: String,
    /// Its parallelism in the checkpoint.
    pub from: u32,
    /// Its parallelism in this run.
    pub to: u32,
}

/// Check that `m` can be restored into a job of these nodes (id, parallelism) and key
/// groups, and say which nodes change parallelism. Key groups are the unit state moves in,
/// so their number is fixed for a job's life. Parallelism may change, and chains may be cut
/// otherwise: state is found by node and subtask index. (Which nodes must be there, and
/// what else may change, is [`super::upgrade::check_upgrade`]'s.)
pub fn check_layout(
    m: &Manifest,
    nodes: &[(String, u32)],
    max_key_groups: u32,
) -> Result<Vec<Rescale>, CheckpointError> {
    if m.max_key_groups != max_key_groups {
        return Err(CheckpointError::Unusable(format!(
            "checkpoint {} was taken of a job with {} key groups and this job has {max_key_groups}: state is laid \
             out by key group, so their number cannot change; set max_key_groups = {} to restore it, or start \
             with an empty checkpoint directory",
            m.id, m.max_key_groups, m.max_key_groups
        )));
    }
    let mut rescaled = Vec::new();
    for (id, parallelism) in nodes {
        if let Some(layout) = m.node_layout(id)
            && layout.parallelism != *parallelism
        {
            rescaled.push(Rescale { node: id.clone(), from: layout.parallelism, to: *parallelism });
        }
    }
    Ok(rescaled)
}

/// One node's key groups in one shard of this run: where restore puts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardTarget {
    /// The shard.
    pub shard: usize,
    /// The node (its column family).
    pub node: String,
    /// The key groups of the node the subtask on that shard owns.
    pub key_groups: std::ops::Range<u32>,
}

/// Rebuild every shard of the state dir `state_dir` from `m`: each target takes its key
/// groups from whichever snapshots of its node hold them (one, at the parallelism of the
/// checkpoint; parts of several when it changed). Shards no target restores into are emptied.
/// `progress(done, shards)` after each shard.
#[cfg(feature = "rocksdb")]
pub fn restore_shards(
    root: &Path,
    m: &Manifest,
    state_dir: &Path,
    shards: usize,
    targets: &[ShardTarget],
    merges: &crate::state::MergeOperators,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(), CheckpointError> {
    let mut parts: BTreeMap<usize, Vec<crate::state::RestorePart>> = BTreeMap::new();
    for t in targets {
        if t.shard >= shards {
            return Err(CheckpointError::Unusable(format!("state shard {} of {shards} does not exist", t.shard)));
        }
        for r in m.subtasks.iter().flat_map(|s| &s.shards).filter(|r| r.node == t.node) {
            let key_groups = r.key_groups.0.max(t.key_groups.start)..r.key_groups.1.min(t.key_groups.end);
            if key_groups.is_empty() {
                continue;
            }
            // The node's column family, and the copy of its cache beside it.
            for family in [r.node.clone(), crate::state::cache_copy_family(&r.node)] {
                parts.entry(t.shard).or_default().push(crate::state::RestorePart {
                    snapshot: root.join(&r.dir),
                    operator: family,
                    key_groups: key_groups.clone(),
                });
            }
        }
    }
    for shard in 0..shards {
        let p = parts.remove(&shard).unwrap_or_default();
        crate::state::restore_shard(state_dir, shard, &p, merges).map_err(|e| {
            // What was being restored there: each node's key groups (its cache copy's too).
            let mut what: Vec<String> = p
                .iter()
                .filter(|part| !crate::state::is_cache_copy_family(&part.operator))
                .map(|part| format!("{} key groups {}..{}", part.operator, part.key_groups.start, part.key_groups.end))
                .collect();
            what.dedup();
            CheckpointError::Shard { shard, restoring: what.join(", "), checkpoint: m.id, source: e }
        })?;
        progress(shard + 1, shards);
    }
    Ok(())
}

/// The checkpoint directory's default place for the live state shards.
#[cfg(feature = "rocksdb")]
pub(crate) fn live_state_dir(root: &Path) -> std::path::PathBuf {
    root.join("live-state")
}
