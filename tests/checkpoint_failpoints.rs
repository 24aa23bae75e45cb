//! Issue test 2: a crash at each phase of the checkpoint protocol (failpoints of the `fail`
//! crate; build with `--features failpoints`), then a restart without the failpoint: the job
//! recovers to the last durable checkpoint and its committed output is exact.

mod common;

use common::counting::{SPILL_KEYS, committed, compare, counting_job, counting_job_spilling, expected_over, temp_dir};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const N: u64 = 120_000;

/// Run by the child process only: the counting job, crashing (abort, no cleanup) the
/// `WEIR_FP_HIT`-th time the failpoint `WEIR_FP` is passed.
#[test]
fn child_process() {
    let Ok(dir) = std::env::var("WEIR_FP_CHILD") else { return };
    if let Ok(name) = std::env::var("WEIR_FP") {
        let hit: usize = std::env::var("WEIR_FP_HIT").unwrap().parse().unwrap();
        let seen = AtomicUsize::new(0);
        fail::cfg_callback(name, move || {
            if seen.fetch_add(1, Ordering::Relaxed) + 1 == hit {
                std::process::abort();
            }
        })
        .unwrap();
    }
    let job = if std::env::var("WEIR_FP_SPILL").is_ok() { counting_job_spilling } else { counting_job };
    let summary = job(Path::new(&dir), N, Some(40_000.0), Duration::from_millis(40)).run().unwrap();
    println!("CHILD restored_from={:?}", summary.checkpoints.restored_from);
}

fn run_child(dir: &Path, failpoint: Option<(&str, usize)>, spill: bool) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if spill {
        cmd.env("WEIR_FP_SPILL", "1");
    }
    cmd.args(["--exact", "child_process", "--nocapture", "--test-threads=1"])
        .env("WEIR_FP_CHILD", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some((name, hit)) = failpoint {
        cmd.env("WEIR_FP", name).env("WEIR_FP_HIT", hit.to_string());
    }
    let out = common::output_and_clean(&mut cmd);
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Each phase, with the usual state (all cached) and with state ten times the window cache
/// (merge operands in the shards and in the checkpoint being written).
#[test]
fn a_crash_at_every_phase_recovers_exactly() {
    for spill in [false, true] {
        for (name, hit) in [
            ("checkpoint::barrier-injected", 3),
            ("checkpoint::snapshot-taken", 12),
            ("checkpoint::rocksdb-half-written", 4),
            ("checkpoint::before-manifest-rename", 3),
            ("checkpoint::after-manifest-before-commit", 3),
        ] {
            let dir = temp_dir(&format!("fp-{}-{spill}", name.replace("::", "-")));
            let (ok, out) = run_child(&dir, Some((name, hit)), spill);
            assert!(!ok, "{name} (spill {spill}): the child should have crashed: {out}");
            let (ok, out) = run_child(&dir, None, spill);
            assert!(ok, "{name} (spill {spill}): the restart failed: {out}");
            assert!(out.contains("restored_from=Some("), "{name}: the restart restored a checkpoint: {out}");
            let keys = if spill { SPILL_KEYS } else { common::counting::KEYS };
            compare(&committed(&dir.join("out")).unwrap(), &expected_over(N, keys));
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
