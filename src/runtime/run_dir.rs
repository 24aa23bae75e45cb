//! The job's run directory (its counters file lives there), under this user's run root.
//!
//! The root is `/dev/shm/weir-<uid>` (the temp dir's `weir-<uid>` where there is no
//! /dev/shm): one per user, so another user can neither plant files in it nor keep a job
//! from starting by owning it. The root and every run directory are created 0700 and
//! checked after opening them `O_DIRECTORY | O_NOFOLLOW` (`fstat` of what was opened: a
//! real directory, ours, 0700); one that is not is refused with what to do, never adopted.
//! A run directory is `<name>-<pid>-<n>` (the job's name made a safe file name: it never
//! leaves the root), made fresh by `mkdir`, and claimed with a lock file opened
//! `O_NOFOLLOW`. The leftovers of dead processes (killed, so no clean up: their lock is
//! free and their pid gone) are removed when the next job starts.

use super::StartError;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use weir_ring::private_file::{PrivateFileError, our_uid, private_dir};

static JOB_SEQ: AtomicU64 = AtomicU64::new(0);

/// The lock file in a run directory: held (`flock`) by the job that uses the directory.
const RUN_LOCK: &str = "lock";

/// This user's root of run directories: `/dev/shm/weir-<uid>`, or `<temp dir>/weir-<uid>`
/// (the ring crate's [`weir_ring::ipc::user_root`]: endpoints live under it too).
pub fn run_root() -> PathBuf {
    weir_ring::ipc::user_root()
}

/// Where jobs without a `state_dir` keep their RocksDB shards: `<temp dir>/weir-state-<uid>`
/// (on disk, not tmpfs), one directory per run directory's name.
pub fn state_root() -> PathBuf {
    std::env::temp_dir().join(format!("weir-state-{}", our_uid()))
}

/// A job's name as one safe path component (the ring crate's
/// [`weir_ring::ipc::safe_name`], which endpoint paths use too): letters, digits, `.`, `_`
/// and `-` kept, anything else `_`, no leading `.`, at most 64 bytes; `job` if empty.
pub(crate) fn file_name_of(name: &str) -> String {
    weir_ring::ipc::safe_name(name)
}

/// A job's run directory, removed when dropped if the job made it.
#[derive(Debug)]
pub(super) struct RunDir {
    path: PathBuf,
    /// Held while the job runs: a directory whose lock is free belongs to nobody alive.
    _lock: Option<File>,
    /// Made by this job (removed at the end), or the caller's (`JobConfig::run_dir`: only
    /// the files the job made in it are removed).
    owned: bool,
}

impl RunDir {
    /// The caller's directory (`JobConfig::run_dir`), checked like ours.
    pub(super) fn given(path: PathBuf) -> Result<RunDir, StartError> {
        private_dir(&path).map_err(|source| StartError::RunDir { path: path.clone(), source })?;
        Ok(RunDir { path, _lock: None, owned: false })
    }

    /// A fresh run directory for job `name` under this user's root, after removing what dead
    /// processes left there.
    pub(super) fn claim(name: &str) -> Result<RunDir, StartError> {
        let root = run_root();
        let refused = |path: &Path, source| StartError::RunDir { path: path.to_owned(), source };
        private_dir(&root).map_err(|e| refused(&root, e))?;
        reclaim_dead(&root);
        let stem = file_name_of(name);
        loop {
            let path = root.join(format!("{stem}-{}-{}", std::process::id(), JOB_SEQ.fetch_add(1, Ordering::Relaxed)));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {}
                // A dead process's with our pid (pids are reused), or a live one's in another
                // pid namespace: take the next name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(refused(&path, PrivateFileError::Io { path: path.clone(), source: e })),
            }
            private_dir(&path).map_err(|e| refused(&path, e))?;
            let lock = open_lock(&path)
                .map_err(|e| refused(&path, PrivateFileError::Io { path: path.join(RUN_LOCK), source: e }))?;
            if lock.try_lock().is_ok() {
                return Ok(RunDir { path, _lock: Some(lock), owned: true });
            }
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Remove what the job made: its run directory, or in the caller's, its counters file and
    /// its waits file.
    pub(super) fn remove(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.path);
            self.owned = false;
        } else {
            let counters = self.path.join("counters");
            let _ = std::fs::remove_file(crate::telemetry::waiting::waits_path(&counters));
            let _ = std::fs::remove_file(counters);
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        // A start that failed half way leaves nothing (its counters file included).
        self.remove();
    }
}

/// The run directory's lock file: created 0600 if missing, never through a symlink.
fn open_lock(dir: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(RUN_LOCK))
}

/// Remove the run directories under `root` (ours alone: checked 0700) whose process is gone
/// and whose lock nobody holds, with the state directories named after them.
fn reclaim_dead(root: &Path) {
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        // Held: a live job in another pid namespace. Missing: died before taking it.
        let mut lock = std::fs::OpenOptions::new();
        lock.write(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        let free = match lock.open(path.join(RUN_LOCK)) {
            Ok(lock) => lock.try_lock().is_ok(),
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        };
        if free {
            tracing::debug!(dir = %path.display(), "removing the run directory of dead process {pid}");
            let _ = std::fs::remove_dir_all(&path);
            let _ = std::fs::remove_dir_all(state_root().join(&name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_names_stay_one_component() {
        assert_eq!(file_name_of("clicks-1.v2"), "clicks-1.v2");
        assert_eq!(file_name_of("../../../tmp/x"), "_._.._.._tmp_x");
        assert_eq!(file_name_of("/tmp/x"), "_tmp_x");
        assert_eq!(file_name_of(".."), "_.");
        assert_eq!(file_name_of("a\0b c"), "a_b_c");
        assert_eq!(file_name_of(""), "job");
        assert_eq!(file_name_of(&"x".repeat(500)).len(), 64);
    }
}
