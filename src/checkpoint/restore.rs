//! Recovery: find the newest usable checkpoint, and rebuild the state shards from it.

use super::CheckpointError;
use super::manifest::{MANIFEST_FILE, Manifest, checkpoint_dirs};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
            "{} is not empty ({}{}) and not a weir checkpoint directory (no {MARKER_FILE}); weir removes old              checkpoints there, so give it an empty or new directory",
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

/// Check that `m` was taken of a job with these subtasks and key groups.
pub fn check_topology(m: &Manifest, subtasks: &[String], max_key_groups: u32) -> Result<(), CheckpointError> {
    let theirs: Vec<&str> = m.subtasks.iter().map(|s| s.subtask.as_str()).collect();
    let ours: Vec<&str> = subtasks.iter().map(String::as_str).collect();
    if theirs != ours || m.max_key_groups != max_key_groups {
        return Err(CheckpointError::Unusable(format!(
            "checkpoint {} was taken of a job with subtasks [{}] and {} key groups; this job has [{}] and {}: \
             restoring into a changed graph (other node ids or parallelism) is not supported; start with an \
             empty checkpoint directory",
            m.id,
            theirs.join(", "),
            m.max_key_groups,
            ours.join(", "),
            max_key_groups
        )));
    }
    Ok(())
}

/// Rebuild every shard of the state dir `state_dir` from `m`: subtask `s`'s snapshots go to
/// shard `shard_of(s)`. Shards no subtask restores into are emptied.
pub fn restore_shards(
    root: &Path,
    m: &Manifest,
    state_dir: &Path,
    shards: usize,
    shard_of: impl Fn(&str) -> Option<usize>,
    merges: &crate::state::MergeOperators,
) -> Result<(), CheckpointError> {
    let mut parts: BTreeMap<usize, Vec<crate::state::RestorePart>> = BTreeMap::new();
    for s in &m.subtasks {
        for r in &s.shards {
            let shard = shard_of(&s.subtask).ok_or_else(|| {
                CheckpointError::Unusable(format!(
                    "checkpoint {}: subtask {} has RocksDB state but no shard in this job",
                    m.id, s.subtask
                ))
            })?;
            parts.entry(shard).or_default().push(crate::state::RestorePart {
                snapshot: root.join(&r.dir),
                operator: r.node.clone(),
                key_groups: r.key_groups.0..r.key_groups.1,
            });
        }
    }
    for shard in 0..shards {
        let p = parts.remove(&shard).unwrap_or_default();
        crate::state::restore_shard(state_dir, shard, &p, merges).map_err(|e| {
            CheckpointError::Unusable(format!("cannot restore state shard {shard} from checkpoint {}: {e}", m.id))
        })?;
    }
    Ok(())
}

/// The checkpoint directory's default place for the live state shards.
pub(crate) fn live_state_dir(root: &Path) -> PathBuf {
    root.join("live-state")
}
