//! Issue #20 item 3: `weir-top` in a real terminal (tmux, read back with `capture-pane`)
//! against a job whose sink stopped answering: the sink's stage is marked SLOW, the source
//! feeding it HIGH, and the channel between them full. Issue #47: resized to 80×24 it cuts no
//! number and still says so; at 30×8 it says the terminal is too small.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::operators::builtin::Generator;
use weir_tools::stuck::Gate;

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
    let gate = Gate::new();
    let stuck = gate.sink();
    let job = Job::new("top-stuck");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 64;
        c.max_record_bytes = 256;
    });
    job.source("gen", 1, |info| Generator::events(info, 50_000, 100))
        .rebalance()
        .sink("slow", 1, move |_| stuck.clone());
    let running = job.start().unwrap();
    let gate = gate; // dropped before the job, however the test ends (see `Gate`)

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
    // Issue #47: at 80×24 every number is whole (the credit, the checkpoint line), the boxes
    // and the edge still say where the job is stuck; below the minimum it says so.
    let resize = |x: &str, y: &str| {
        let status = tmux.cmd().args(["resize-window", "-t", "top", "-x", x, "-y", y]).status().unwrap();
        assert!(status.success(), "tmux resize-window");
    };
    resize("80", "24");
    let t = Instant::now();
    let small = loop {
        let s = screen(&tmux);
        let width = s.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        if width <= 80 && s.contains("slow ×1 OK SLOW") && s.contains("credit 0 of 64 slots") {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "watchdog: weir-top at 80×24:\n{s}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(small.contains("gen ×1 HIGH") && small.contains("gen → slow"), "{small}");
    resize("30", "8");
    let t = Instant::now();
    loop {
        let s = screen(&tmux);
        if s.contains("terminal too small") {
            assert!(!s.contains("credit"), "{s}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "watchdog: weir-top at 30×8:\n{s}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // q quits and gives the terminal back.
    tmux.cmd().args(["send-keys", "-t", "top", "q"]).status().unwrap();
    let t = Instant::now();
    while tmux.cmd().args(["has-session", "-t", "top"]).output().is_ok_and(|o| o.status.success()) {
        assert!(t.elapsed() < Duration::from_secs(20), "watchdog: weir-top did not quit on q");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(tmux);
    drop(gate);
    running.wait().expect("the job ends once released");
}
