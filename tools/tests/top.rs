//! Issue #20 item 3: `weir-top` in a real terminal (tmux, read back with `capture-pane`)
//! against a job whose sink stopped answering: the sink's stage is marked SLOW, the source
//! feeding it HIGH, and the channel between them full.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::operators::builtin::Generator;
use weir::operators::{Halt, Sink};
use weir::record::Event;

struct Blocked(Arc<AtomicBool>);

impl Sink<Event> for Blocked {
    fn write(&mut self, _e: &Event) -> Result<(), Halt> {
        while !self.0.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

/// Releases the blocked sink when dropped: a failing test must not leave the job's threads
/// stuck (dropping a running job joins them).
struct Release(Arc<AtomicBool>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A tmux server of our own (its socket in a directory of our own), killed and removed
/// when dropped: nothing left in /tmp.
struct Tmux {
    dir: PathBuf,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(self.dir.join("socket"));
        c
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn have_tmux() -> bool {
    let found = Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "CI needs tmux: .ci/test installs it");
    }
    found
}

fn screen(tmux: &Tmux) -> String {
    let out = tmux.cmd().args(["capture-pane", "-p", "-t", "top"]).output().expect("tmux capture-pane");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn weir_top_marks_the_slow_stage_in_a_terminal() {
    if !have_tmux() {
        println!("SKIPPED: no tmux");
        return;
    }
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let job = Job::new("top-stuck");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 64;
        c.max_record_bytes = 256;
    });
    job.source("gen", 1, |info| Generator::events(info, 50_000, 100))
        .rebalance()
        .sink("slow", 1, move |_| Blocked(r.clone()));
    let running = job.start().unwrap();
    let released = Release(release.clone());

    let dir = std::env::temp_dir().join(format!("weir-top-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tmux = Tmux { dir };
    let top: &Path = Path::new(env!("CARGO_BIN_EXE_weir-top"));
    let status = tmux
        .cmd()
        .args(["new-session", "-d", "-s", "top", "-x", "150", "-y", "40"])
        .arg(format!("{} {} --interval-ms 300", top.display(), running.counters_path().display()))
        .status()
        .expect("tmux starts");
    assert!(status.success());
    let t = Instant::now();
    let shown = loop {
        let s = screen(&tmux);
        if s.contains("slow ×1 OK SLOW") && s.contains("gen ×1 HIGH") && s.contains("gen → slow") {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "watchdog: weir-top never showed the stuck job:\n{s}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(shown.contains("job top-stuck (running)"), "{shown}");
    assert!(shown.contains("fill ████████████████████ 100%"), "{shown}");
    // q quits and gives the terminal back.
    tmux.cmd().args(["send-keys", "-t", "top", "q"]).status().unwrap();
    let t = Instant::now();
    while tmux.cmd().args(["has-session", "-t", "top"]).output().is_ok_and(|o| o.status.success()) {
        assert!(t.elapsed() < Duration::from_secs(20), "watchdog: weir-top did not quit on q");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(tmux);
    drop(released);
    running.wait().expect("the job ends once released");
}
