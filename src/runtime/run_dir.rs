//! The job's run directory (its counters file lives there): one per job, claimed with a
//! lock so a dead process's leftovers are replaced and a live job's are left alone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static JOB_SEQ: AtomicU64 = AtomicU64::new(0);

/// The lock file in a run directory: held (`flock`) by the job that uses the directory.
const RUN_LOCK: &str = "lock";

/// Take the run directory `d` for this job, and the lock that says it is in use. A directory
/// already there whose lock nobody holds is a dead process's (killed, no clean up, and pids
/// are reused): it is replaced. One whose lock is held belongs to a live job with the same
/// pid in another pid namespace sharing /dev/shm: this job takes a name of its own beside it.
pub(super) fn claim_run_dir(d: PathBuf) -> (PathBuf, Option<std::fs::File>) {
    let try_lock = |dir: &Path| -> Option<std::fs::File> {
        // The directory is ours alone (0700): the counters file is created only in one.
        weir_ring::private_file::private_dir(dir).ok()?;
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(RUN_LOCK)).ok()?;
        // flock(2), exclusive, without waiting.
        f.try_lock().ok().map(|()| f)
    };
    if d.exists() {
        match try_lock(&d) {
            Some(lock) => {
                // A dead process's: empty it, keeping the lock we hold.
                for e in std::fs::read_dir(&d).into_iter().flatten().filter_map(|e| e.ok()) {
                    if e.file_name() != RUN_LOCK {
                        let p = e.path();
                        let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
                    }
                }
                return (d, Some(lock));
            }
            None => {
                let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                let other = PathBuf::from(format!("{}-{:x}", d.display(), nanos.subsec_nanos()));
                let lock = try_lock(&other);
                return (other, lock);
            }
        }
    }
    let lock = try_lock(&d);
    (d, lock)
}

pub(super) fn default_run_dir(name: &str) -> PathBuf {
    let base =
        if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm/weir") } else { std::env::temp_dir().join("weir") };
    base.join(format!("{name}-{}-{}", std::process::id(), JOB_SEQ.fetch_add(1, Ordering::Relaxed)))
}
