//! Savepoints: a checkpoint copied out of the checkpoint directory into one the user chose,
//! whole and on its own, never pruned, to start another version of the job from.
//!
//! A savepoint is taken like any checkpoint (barriers from the sources, every subtask's
//! snapshot, a manifest in the checkpoint directory); once that is complete, its files are
//! linked (or, across file systems, copied) into the savepoint's directory and its manifest
//! written there last, marked as a savepoint's. The directory then holds:
//!
//! ```text
//!  <savepoint>/
//!    WEIR-SAVEPOINT             what this directory is (and the format of what follows)
//!    _manifest.json             the manifest (format 2, `savepoint` set), written last
//!    chk-<n>/<subtask>/...      the checkpoint's files, at the paths the manifest names
//!    final-<run>/<subtask>/...  those of subtasks that had ended, if any
//! ```
//!
//! The manifest is the checkpoint's ([`super::Manifest`]: JSON, checksummed, every file
//! named with its length and CRC-32, each operator's bytes in an envelope that says what
//! wrote them, [`super::upgrade`]). Without `_manifest.json` the directory is not a
//! savepoint (one interrupted while copying); weir writes into an empty or new directory
//! only, and never removes one.

use super::CheckpointError;
use super::manifest::{MANIFEST_FILE, Manifest, SavepointInfo, sync_dir};
use std::path::Path;

/// The marker file of a savepoint directory.
pub const MARKER_FILE: &str = "WEIR-SAVEPOINT";

/// Copy checkpoint `m` (complete, its files under `root`) into the savepoint directory
/// `target` (new or empty), and write its manifest there marked as a savepoint's (`stopped`:
/// the job stops right after it). Returns that manifest.
pub fn write(root: &Path, m: &Manifest, target: &Path, stopped: bool) -> Result<Manifest, CheckpointError> {
    match std::fs::read_dir(target) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(CheckpointError::Unusable(format!(
                    "{} is not empty: a savepoint goes into a new or empty directory (weir never writes over one)",
                    target.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(target).map_err(CheckpointError::io("cannot create", target))?;
        }
        Err(e) => return Err(CheckpointError::io("cannot read", target)(e)),
    }
    std::fs::write(
        target.join(MARKER_FILE),
        format!(
            "weir savepoint of job {:?}, checkpoint {} (manifest format {}); start a job from it with \
             `weir run --from-savepoint {}`\n",
            m.job,
            m.id,
            super::manifest::FORMAT,
            target.display()
        ),
    )
    .map_err(CheckpointError::io("cannot write", &target.join(MARKER_FILE)))?;
    let mut dirs = std::collections::BTreeSet::new();
    for s in &m.subtasks {
        for b in &s.blobs {
            copy_file(&root.join(&b.file), &target.join(&b.file), &mut dirs)?;
        }
        for r in &s.shards {
            let from = root.join(&r.dir);
            for entry in std::fs::read_dir(&from).map_err(CheckpointError::io("cannot read", &from))? {
                let entry = entry.map_err(CheckpointError::io("cannot read", &from))?;
                if entry.file_type().is_ok_and(|t| t.is_file()) {
                    copy_file(&entry.path(), &target.join(&r.dir).join(entry.file_name()), &mut dirs)?;
                }
            }
        }
    }
    for d in dirs.iter().rev() {
        sync_dir(d)?;
    }
    let uid = format!("{}:{}:{}", m.job, m.id, m.completed_unix_ms);
    let saved = Manifest { savepoint: Some(SavepointInfo { uid, stopped }), checksum: 0, ..m.clone() };
    let saved = saved.write(target)?;
    sync_dir(target)?;
    Ok(saved)
}

/// Link `from` to `to` (both exist on one file system: checkpoint files are never changed
/// after they are written, so a link is a copy), else copy it and fsync the copy. `dirs`
/// collects the directories made, to fsync.
fn copy_file(
    from: &Path,
    to: &Path,
    dirs: &mut std::collections::BTreeSet<std::path::PathBuf>,
) -> Result<(), CheckpointError> {
    let dir = to.parent().expect("a file has a directory");
    if !dirs.contains(dir) {
        std::fs::create_dir_all(dir).map_err(CheckpointError::io("cannot create", dir))?;
        let mut d = dir;
        while dirs.insert(d.to_path_buf()) {
            match d.parent() {
                Some(p) => d = p,
                None => break,
            }
        }
    }
    // RocksDB appends to a live database's MANIFEST, never to a checkpoint's; the files of
    // a checkpoint are written once.
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    std::fs::copy(from, to).map_err(CheckpointError::io("cannot copy", from))?;
    let f = std::fs::File::open(to).map_err(CheckpointError::io("cannot open", to))?;
    f.sync_all().map_err(CheckpointError::io("cannot fsync", to))
}

/// Read the savepoint in `dir`: its manifest, checked with every file it names.
pub fn read(dir: &Path) -> Result<Manifest, CheckpointError> {
    if !dir.join(MANIFEST_FILE).is_file() {
        let why = if dir.join(MARKER_FILE).is_file() {
            "it has no manifest: the savepoint was not completed (take another)"
        } else if dir.join(super::restore::MARKER_FILE).is_file() {
            "it is a checkpoint directory, not a savepoint: give it as the job's checkpoint directory, or take a \
             savepoint with `weir savepoint`"
        } else {
            "no savepoint there (no _manifest.json)"
        };
        return Err(CheckpointError::Unusable(format!("{} is not a savepoint: {why}", dir.display())));
    }
    let m = Manifest::read(dir, dir)?;
    if m.savepoint.is_none() {
        return Err(CheckpointError::Unusable(format!(
            "{}: the manifest there is a checkpoint's, not a savepoint's",
            dir.display()
        )));
    }
    Ok(m)
}
