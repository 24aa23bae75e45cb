//! The host as an attacker or a careless neighbour would use it (issue 22): another user's
//! directories where ours would go, a job name that is a path, a dead process's leftovers,
//! a start that fails half way, and `weir run` stopped by a signal.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::operators::builtin::{Generator, NullSink};
use weir::record::Event;

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// A small job that ends by itself.
fn small_job(name: &str) -> Job {
    let job = Job::new(name);
    job.configure(|c| c.pinning = false);
    job.source("gen", 1, |info| Generator::events(info, 1000, 10)).sink("out", 1, |_| NullSink);
    job
}

/// This process's run directories of job `name` under the run root (other tests of this
/// process run jobs at the same time).
fn run_dirs_of_this_process(name: &str) -> Vec<PathBuf> {
    let mark = format!("{name}-{}-", std::process::id());
    std::fs::read_dir(weir::runtime::run_root())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(&mark))
        .map(|e| e.path())
        .collect()
}

/// `name = "../../../tmp/x"` or `"/tmp/x"`: the run directory stays one entry of the run
/// root; nothing is made, emptied or removed where the name points.
#[test]
fn a_job_name_that_is_a_path_stays_in_the_run_root() {
    let target = std::env::temp_dir().join(format!("weir-escape-{}", std::process::id()));
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keep"), b"not weir's").unwrap();
    for name in [format!("../../../{}", target.display()), target.display().to_string()] {
        let running = small_job(&name).start().expect("starts");
        let counters = running.counters_path().to_owned();
        assert_eq!(counters.parent().and_then(Path::parent), Some(weir::runtime::run_root().as_path()), "{counters:?}");
        running.wait().expect("finishes");
        assert!(!counters.exists(), "its run directory is removed at the end");
    }
    assert!(target.join("keep").exists(), "the directory the name pointed at is untouched");
    std::fs::remove_dir_all(&target).unwrap();
}

/// A NUL or an escape sequence in a job file's name is a bad job file (exit 78, the field
/// named), not a crash.
#[test]
fn control_characters_in_a_job_name_are_refused_at_validate() {
    let dir = std::env::temp_dir().join(format!("weir-badname-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["a\\u0000b", "\\u001b[2Jclear"] {
        let file = dir.join("job.toml");
        let text = format!(
            "[job]\nname = \"{name}\"\n[[source]]\nid = \"g\"\ntype = \"generator\"\ncount = 1\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"g\"\n"
        );
        std::fs::write(&file, text).unwrap();
        let out = Command::new(WEIR).arg("validate").arg(&file).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{stderr}");
        assert!(stderr.contains(":2:8: field `job.name`") && stderr.contains("control characters"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A killed process's run directory (its pid gone, its lock free) is removed when the next
/// job starts; one whose lock is held (a live job in another pid namespace) is left alone.
#[test]
fn dead_processes_run_directories_are_reclaimed_and_live_ones_kept() {
    let root = weir::runtime::run_root();
    std::fs::create_dir_all(&root).unwrap();
    // Pids above the kernel's pid_max (4194304 at most) name no live process.
    let dead = root.join(format!("killed-{}-0", 4_000_000_000u32 - std::process::id()));
    let held = root.join(format!("other-ns-{}-0", 4_000_000_001u32 - std::process::id()));
    let no_lock = root.join(format!("died-early-{}-0", 4_000_000_002u32 - std::process::id()));
    for d in [&dead, &held, &no_lock] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(d.join("counters"), b"stale").unwrap();
    }
    std::fs::write(dead.join("lock"), b"").unwrap();
    let lock = std::fs::File::create(held.join("lock")).unwrap();
    lock.try_lock().unwrap();

    small_job("reclaim").run().expect("runs");
    assert!(!dead.exists(), "the dead process's run directory was reclaimed");
    assert!(!no_lock.exists(), "the one that died before taking its lock too");
    assert!(held.join("counters").exists(), "a run directory whose lock is held is left alone");
    drop(lock);
    std::fs::remove_dir_all(&held).unwrap();
}

/// A start that fails after the counters file was made (here: the state directory is a
/// file) leaves no run directory behind.
#[test]
fn a_failed_start_leaves_no_run_directory() {
    let blocker = std::env::temp_dir().join(format!("weir-state-is-a-file-{}", std::process::id()));
    std::fs::write(&blocker, b"x").unwrap();
    let job = Job::new("failed-start");
    job.configure(|c| {
        c.pinning = false;
        c.state.dir = Some(blocker.clone());
    });
    job.source("gen", 1, |info| Generator::events(info, 10, 10))
        .key_by("k", |e: &Event| e.key)
        .window(weir::window::Window::tumbling(Duration::from_millis(10)).processing_time())
        .aggregate("count", 1, weir::window::Aggregates::of(|e: &Event| e.value).count())
        .sink("out", 1, |_| NullSink);
    let before = run_dirs_of_this_process("failed-start");
    let e = job.start().expect_err("the state directory is a file");
    assert!(e.to_string().contains("state"), "{e}");
    let after = run_dirs_of_this_process("failed-start");
    assert!(after.iter().all(|d| before.contains(d)), "left behind: {after:?}");
    std::fs::remove_file(&blocker).unwrap();
}

/// A run directory the caller gave is checked like ours, and only the job's own files in it
/// are removed at the end (the directory and what else it holds stay).
#[test]
fn a_given_run_directory_is_checked_and_kept() {
    let dir = std::env::temp_dir().join(format!("weir-given-run-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let job = small_job("given");
    job.configure(|c| c.run_dir = Some(dir.clone()));
    let e = job.start().expect_err("a directory open to others is refused");
    assert!(e.to_string().contains("chmod 700"), "{e}");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(dir.join("mine"), b"the caller's").unwrap();
    let job = small_job("given");
    job.configure(|c| c.run_dir = Some(dir.clone()));
    job.run().expect("runs");
    assert!(dir.join("mine").exists() && !dir.join("counters").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An endless job file for `weir run`.
fn endless_job_file(dir: &Path, name: &str) -> PathBuf {
    let file = dir.join(format!("{name}.toml"));
    let text = format!(
        "[job]\nname = \"{name}\"\npinning = false\n[[source]]\nid = \"g\"\ntype = \"generator\"\nrate = 1000\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"g\"\n"
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// Wait (watchdog: 60 s) until process `pid` has a run directory; returns it.
fn run_dir_of(pid: u32, root: &Path) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mark = format!("-{pid}-");
        let found = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().contains(&mark) && e.path().join("counters").exists());
        if let Some(e) = found {
            return e.path();
        }
        assert!(Instant::now() < deadline, "watchdog: no run directory of {pid} after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM and SIGINT stop `weir run` cleanly: exit 128 + the signal, the run directory
/// removed, the reason said.
#[test]
fn a_signal_stops_weir_run_cleanly() {
    let dir = std::env::temp_dir().join(format!("weir-signal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (signal, name, code) in [(libc::SIGTERM, "term", 143), (libc::SIGINT, "int", 130)] {
        let file = endless_job_file(&dir, name);
        let child =
            Command::new(WEIR).arg("run").arg(&file).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let run_dir = run_dir_of(child.id(), &weir::runtime::run_root());
        let rc = Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status().unwrap();
        assert!(rc.success());
        let out = common::wait_with_watchdog(child, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{stderr}");
        assert!(stderr.contains(&format!("stopped by signal {signal}")), "{stderr}");
        assert!(!run_dir.exists(), "{} left behind", run_dir.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Another user on the host (`nobody`, via `runuser`): a run root planted in their name (a
/// directory we own, or a symlink to one) is refused with what to do, never adopted; and
/// their jobs run beside ours, each user with a root of their own. Needs root and runuser;
/// skipped otherwise.
#[test]
fn another_users_run_root_is_refused_and_users_do_not_block_each_other() {
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !is_root || !Path::new("/usr/sbin/runuser").exists() || !Path::new("/dev/shm").is_dir() {
        println!("SKIPPED: needs root, runuser and /dev/shm");
        return;
    }
    let nobody_uid = String::from_utf8(Command::new("id").args(["-u", "nobody"]).output().unwrap().stdout).unwrap();
    let nobody_root = PathBuf::from(format!("/dev/shm/weir-{}", nobody_uid.trim()));
    if nobody_root.exists() {
        println!("SKIPPED: {} exists (a job of nobody's may be running)", nobody_root.display());
        return;
    }
    // A copy of weir that nobody may run, and a job file it may read.
    let dir = std::env::temp_dir().join(format!("weir-other-user-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let weir = dir.join("weir");
    std::fs::copy(WEIR, &weir).unwrap();
    let file = dir.join("job.toml");
    std::fs::write(
        &file,
        "[job]\nname = \"nobodys\"\npinning = false\n[[source]]\nid = \"g\"\ntype = \"generator\"\ncount = 1000\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"g\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run_as_nobody =
        || Command::new("runuser").args(["-u", "nobody", "--"]).arg(&weir).arg("run").arg(&file).output().unwrap();

    // Planted: a directory of ours (root's) where nobody's root goes.
    std::fs::create_dir(&nobody_root).unwrap();
    std::fs::set_permissions(&nobody_root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run_as_nobody();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cannot use the run directory") && stderr.contains("owner uid 0"), "{stderr}");
    assert_eq!(std::fs::read_dir(&nobody_root).unwrap().count(), 0, "nothing was made in the planted directory");
    std::fs::remove_dir(&nobody_root).unwrap();

    // Planted: a symlink to a directory nobody could write.
    let target = dir.join("target");
    std::fs::create_dir(&target).unwrap();
    std::os::unix::fs::symlink(&target, &nobody_root).unwrap();
    let out = run_as_nobody();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("symlink"), "{stderr}");
    std::fs::remove_file(&nobody_root).unwrap();

    // Nothing planted: nobody's job runs while root's root exists, in a root of its own,
    // and leaves it empty.
    std::fs::create_dir_all(weir::runtime::run_root()).unwrap();
    let out = run_as_nobody();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_dir(&nobody_root).unwrap().count(), 0);
    std::fs::remove_dir(&nobody_root).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Settings `weir validate` used to accept and `weir run` could not survive: each is now a
/// bad job file (exit 78, line and field named) at validate.
#[test]
fn settings_run_cannot_survive_are_refused_at_validate() {
    let dir = std::env::temp_dir().join(format!("weir-bad-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = "[[source]]\nid = \"g\"\ntype = \"generator\"\n";
    let sink = "[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"g\"\n";
    let cases = [
        (format!("{source}cpus = []\n{sink}"), "source[0].cpus", "pins to no CPU"),
        (format!("{source}parallelism = 4000000000\n{sink}"), "source[0].parallelism", "at most 4096"),
        (
            format!(
                "{source}[[operator]]\nid = \"f\"\ntype = \"flat_map\"\nfunction = \"repeat\"\ntimes = 1000000000000\ninput = \"g\"\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"f\"\n"
            ),
            "operator[0].times",
            "1 to 1000000",
        ),
        // 4096 x 4096 rings of 64 KiB at least: far more than any machine here.
        (
            format!(
                "[job]\nring_slots = 1048576\nslot_bytes = 64\n{source}parallelism = 4096\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"g\"\nparallelism = 4096\npartitioning = \"rebalance\"\n"
            ),
            "",
            "more than half of this machine's",
        ),
    ];
    for (text, field, says) in cases {
        let file = dir.join("bad.toml");
        std::fs::write(&file, &text).unwrap();
        let out = Command::new(WEIR).arg("validate").arg(&file).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{text}\n{stderr}");
        assert!(stderr.contains(says), "{text}\n{stderr}");
        assert!(field.is_empty() || stderr.contains(&format!("field `{field}`")), "{text}\n{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A source paced to 1e-30 records per second runs (it emits nothing) and stops when asked:
/// no overflowing duration, no wait the mailbox cannot interrupt.
#[test]
fn an_absurdly_slow_rate_runs_and_stops() {
    let job = Job::new("slow-rate");
    job.configure(|c| c.pinning = false);
    job.source("gen", 1, |info| Generator::events(info, u64::MAX, 10).with_rate(1e-30)).sink("out", 1, |_| NullSink);
    let mut running = job.start().expect("starts");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!running.has_failed(), "the source is alive");
    running.cancel();
    assert!(matches!(running.wait(), Err(weir::runtime::JobError::Cancelled)));
}

/// A checkpoint directory that holds other files and no marker is refused, and nothing in
/// it is touched (weir removes partial and old checkpoints only where its marker is). One
/// weir wrote before the marker existed (it holds a manifest) is adopted.
#[test]
fn a_checkpoint_directory_that_is_not_weirs_is_refused_untouched() {
    use weir::checkpoint::CheckpointSettings;
    let dir = std::env::temp_dir().join(format!("weir-not-weirs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("chk-3")).unwrap();
    std::fs::write(dir.join("chk-3").join("thesis.tex"), b"years of work").unwrap();
    std::fs::create_dir_all(dir.join("final-x")).unwrap();
    std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
    let with_checkpoints = |name: &str| {
        let job = small_job(name);
        job.configure(|c| c.checkpoints = Some(CheckpointSettings::new(&dir)));
        job
    };
    let e = with_checkpoints("not-weirs").start().expect_err("refused");
    assert!(e.to_string().contains("not a weir checkpoint directory"), "{e}");
    assert!(dir.join("chk-3/thesis.tex").exists() && dir.join("final-x").exists() && dir.join("notes.txt").exists());

    // A directory weir made: marked, and used again.
    let ours = dir.join("ours");
    let job = small_job("ours");
    job.configure(|c| c.checkpoints = Some(CheckpointSettings::new(&ours)));
    job.run().expect("runs");
    assert!(ours.join(weir::checkpoint::restore::MARKER_FILE).is_file());
    // Written before markers existed: a manifest, no marker. Adopted.
    std::fs::remove_file(ours.join(weir::checkpoint::restore::MARKER_FILE)).unwrap();
    let job = small_job("ours");
    job.configure(|c| c.checkpoints = Some(CheckpointSettings::new(&ours)));
    job.run().expect("an unmarked directory of weir's is adopted");
    assert!(ours.join(weir::checkpoint::restore::MARKER_FILE).is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// When several subtasks fail, the job reports the first failure (the cause), not whichever
/// subtask comes first in the job's order (often a symptom).
#[test]
fn the_first_failure_is_the_one_reported() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use weir::operators::{Halt, Sink};
    struct Fails {
        first: bool,
        failed: Arc<AtomicBool>,
    }
    impl Sink<Event> for Fails {
        fn write(&mut self, _: &Event) -> Result<(), Halt> {
            if self.first {
                self.failed.store(true, Ordering::Release);
                return Err(Halt::failed("disk full (the cause)"));
            }
            // The symptom: fails once the cause has.
            while !self.failed.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(100));
            Err(Halt::failed("peer closed the ring (a symptom)"))
        }
    }
    let failed = Arc::new(AtomicBool::new(false));
    let job = Job::new("root-cause");
    job.configure(|c| c.pinning = false);
    let events = job.source("gen", 1, |info| Generator::events(info, 1_000_000, 10));
    // The symptom's node comes first in the job's order.
    let f = failed.clone();
    events.sink("a-symptom", 1, move |_| Fails { first: false, failed: f.clone() });
    let f = failed.clone();
    events.sink("b-cause", 1, move |_| Fails { first: true, failed: f.clone() });
    let e = job.run().expect_err("fails");
    assert!(e.to_string().contains("the cause"), "{e}");
}

/// A chain of 100 000 operators used to take 48 s to validate (quadratic) and then overflow
/// its thread's stack: validating it now takes a moment and refuses it (each chained operator
/// is a call deeper); the longest chain allowed runs.
#[test]
fn a_very_long_chain_is_refused_quickly_and_the_longest_allowed_runs() {
    let dir = std::env::temp_dir().join(format!("weir-long-chain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::from("[[source]]\nid = \"g\"\ntype = \"generator\"\ncount = 1000\n");
    let mut input = "g".to_owned();
    for i in 0..100_000 {
        text += &format!("[[operator]]\nid = \"m{i}\"\ntype = \"map\"\nfunction = \"identity\"\ninput = \"{input}\"\n");
        input = format!("m{i}");
    }
    text += &format!("[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"{input}\"\n");
    let file = dir.join("long.toml");
    std::fs::write(&file, text).unwrap();
    let out = common::wait_with_watchdog(
        Command::new(WEIR).arg("validate").arg(&file).stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap(),
        Duration::from_secs(120),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("at most 1024 run chained"), "{stderr}");

    let job = Job::new("longest-chain");
    job.configure(|c| c.pinning = false);
    let mut stream = job.source("gen", 1, |info| Generator::events(info, 10_000, 10));
    for i in 0..weir::runtime::MAX_CHAINED - 2 {
        stream = stream.map(&format!("m{i}"), |e: &Event| *e);
    }
    stream.sink("out", 1, |_| NullSink);
    let summary = job.run().expect("the longest chain allowed runs");
    assert_eq!(summary.nodes.last().map(|n| n.records_in), Some(10_000));
    std::fs::remove_dir_all(&dir).unwrap();
}
