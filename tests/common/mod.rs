//! Code shared by several test files.
#![allow(dead_code)]

pub mod counting;
pub mod kafka;
pub mod log;

/// A job of ten subtasks with nothing to do: two silent sources, four maps behind a
/// rebalance and four null sinks behind a key_by, parked on their rings and mailboxes.
pub fn quiet_job(name: &str) -> weir::graph::Job {
    use weir::operators::builtin::{NullSink, Silent};
    use weir::record::Event;
    let job = weir::graph::Job::new(name);
    job.source::<Event, _>("quiet", 2, |_| Silent)
        .rebalance()
        .map("a", |e: &Event| *e)
        .parallelism(4)
        .key_by("k", |e: &Event| e.key)
        .sink("sink", 4, |_| NullSink);
    job
}

/// Random delays for the kill loops: a xorshift generator from a seed the test prints, so a
/// failing run can be told apart (and its seed tried again).
pub struct KillClock(u64);

impl KillClock {
    /// Seeded from the clock; prints the seed.
    pub fn from_time() -> KillClock {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        println!("seed {seed}");
        KillClock(seed | 1)
    }

    /// A delay of `min_ms` plus up to `spread_ms` more.
    pub fn next_delay(&mut self, min_ms: u64, spread_ms: u64) -> std::time::Duration {
        let x = &mut self.0;
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        std::time::Duration::from_millis(min_ms + *x % spread_ms)
    }
}

/// SIGKILL `child`, reap it, and remove the run directories it had under the run root: a
/// killed job cannot clean up after itself, and the suite must leave nothing behind.
pub fn kill_and_clean(child: &mut std::process::Child) {
    let pid = child.id();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    remove_run_dirs_of(pid);
}

/// Remove the run directories (`<job>-<pid>-<n>`) that process `pid` left in this user's run
/// root (`weir::runtime::run_root`), and the state directories named after them.
pub fn remove_run_dirs_of(pid: u32) {
    let mark = format!("-{pid}-");
    for e in std::fs::read_dir(weir::runtime::run_root()).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().contains(&mark) {
            let _ = std::fs::remove_dir_all(e.path());
            let _ = std::fs::remove_dir_all(weir::runtime::state_root().join(e.file_name()));
        }
    }
}

/// Run `cmd` to its end (it may crash at a failpoint) and remove the run directories it
/// left behind; its output.
pub fn output_and_clean(cmd: &mut std::process::Command) -> std::process::Output {
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    remove_run_dirs_of(pid);
    out
}

/// Wait for `child` to end and return its output; a watchdog kills it (and fails the test)
/// after `limit`.
pub fn wait_with_watchdog(mut child: std::process::Child, limit: std::time::Duration) -> std::process::Output {
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            kill_and_clean(&mut child);
            panic!("watchdog: the child did not end in {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `name` made unique: this process, the time, and a count (calls from threads at once).
pub fn unique(name: &str) -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    format!("{name}-{}-{t}-{n}", std::process::id())
}

/// A directory removed when this goes out of scope (a failing test too).
pub struct RemoveOnDrop(pub std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Wait for `child` (started with piped stdout and stderr) for at most `limit`, draining both
/// pipes on threads of their own so a talkative child never waits for us; killed and the test
/// failed past the limit (a watchdog). Its status, stdout and stderr.
pub fn wait_draining_pipes(
    mut child: std::process::Child,
    limit: std::time::Duration,
    what: &str,
) -> (std::process::ExitStatus, String, String) {
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout piped")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr piped")));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("watchdog: {what} did not end in {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    (status, stdout.join().unwrap(), stderr.join().unwrap())
}

/// Run `job` to its end, sampling its sinks' latency counters every 20 ms: every sample
/// (of sinks that timed a marker). A sink publishes its figures one counter after another,
/// so a snapshot taken while it does can hold some new figures and some old (ingest
/// quantiles still 0 beside a timed marker): a sample counts only when two snapshots taken
/// back to back agree on it.
pub fn latencies_while_running(job: &weir::graph::Job) -> Vec<weir_tools::stat::LatencyView> {
    let running = job.start().expect("the job starts");
    let reader = weir::ring::counters::CountersReader::open(running.counters_path()).expect("the counters file");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let latencies = || {
        let snap = reader.snapshot();
        weir_tools::stat::StatView::between(&snap, &snap, 1.0).latencies
    };
    let mut seen = Vec::new();
    while !running.is_finished() {
        assert!(std::time::Instant::now() < deadline, "watchdog: the job did not finish in 120 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (first, second) = (latencies(), latencies());
        seen.extend(second.into_iter().filter(|l| l.markers > 0 && first.contains(l)));
    }
    running.wait().expect("the job finishes");
    seen
}
