//! `weir-stat --json` reads a running job, and a job stuck on a blocked sink, from the
//! counters file alone.

use std::process::Command;
use std::time::Duration;
use weir::graph::Job;
use weir::operators::builtin::{Generator, NullSink};
use weir::operators::{Halt, Sink};
use weir::record::Event;
use weir_tools::stuck::Gate;

fn stat_json(counters: &std::path::Path, count: u32) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_weir-stat"))
        .arg(counters)
        .args(["--json", "--interval-ms", "300", "--count", &count.to_string()])
        .output()
        .expect("weir-stat runs");
    assert!(out.status.success(), "weir-stat failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// A running job: weir-stat sees it alive, its subtasks and records flowing.
#[test]
fn reads_a_running_job() {
    let job = Job::new("stat-running");
    job.source("gen", 1, |info| Generator::events(info, 200_000, 100).with_rate(50_000.0))
        .rebalance()
        .map("m", |e: &Event| *e)
        .sink("out", 1, |_| NullSink);
    let running = job.start().unwrap();
    let lines = stat_json(running.counters_path(), 2);
    let last = lines.last().unwrap();
    assert_eq!(last["job"], "stat-running");
    assert_eq!(last["alive"], true);
    let names: Vec<&str> = last["subtasks"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"gen#0") && names.contains(&"m#0"), "{names:?}");
    let gen_rate =
        last["subtasks"].as_array().unwrap().iter().find(|s| s["name"] == "gen#0").unwrap()["records_in_per_s"]
            .as_f64()
            .unwrap();
    assert!(gen_rate > 0.0, "records flow: {last}");
    assert!(last["budget_bytes"].as_u64().unwrap() > 0);
    running.wait().unwrap();
}

/// Issue #20 item 5: over many short samples of a busy, backpressured job, every subtask's
/// busy + backpressured + idle stays at most 100 %, and every channel's and sink's blocked
/// share at most 100 %.
#[test]
fn shares_add_up_over_many_samples() {
    struct Slow;
    impl Sink<Event> for Slow {
        fn write(&mut self, _e: &Event) -> Result<(), Halt> {
            std::thread::sleep(Duration::from_micros(20));
            Ok(())
        }
    }
    let job = Job::new("stat-shares");
    job.configure(|c| c.ring_slots = 64);
    job.configure(|c| c.max_record_bytes = 256);
    job.source("gen", 1, |info| Generator::events(info, 60_000, 100))
        .rebalance()
        .map("m", |e: &Event| *e)
        .rebalance()
        .sink("slow", 1, |_| Slow);
    let mut running = job.start().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_weir-stat"))
        .arg(running.counters_path())
        .args(["--json", "--interval-ms", "20", "--count", "40"])
        .output()
        .expect("weir-stat runs");
    assert!(out.status.success(), "weir-stat failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut samples = 0;
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for s in v["subtasks"].as_array().into_iter().flatten() {
            let sum = ["busy", "backpressured", "idle"].iter().map(|k| s[k].as_f64().unwrap()).sum::<f64>();
            assert!(sum <= 1.0 + 1e-9, "{} adds up to {sum}: {s}", s["name"]);
            samples += 1;
        }
        for c in v["channels"].as_array().into_iter().chain(v["sinks"].as_array()).flatten() {
            assert!(c["blocked"].as_f64().unwrap_or(0.0) <= 1.0 + 1e-9, "{c}");
        }
    }
    assert!(samples > 40, "weir-stat sampled the subtasks: {samples}");
    running.cancel();
    let _ = running.wait();
}

/// A job stuck on a blocked sink: weir-stat still answers, and shows where it is stuck —
/// the sink's input ring full, the sender backpressured (HIGH), the source too.
#[test]
fn reads_a_stuck_job() {
    let gate = Gate::new();
    let job = Job::new("stat-stuck");
    job.configure(|c| c.ring_slots = 64);
    job.configure(|c| c.max_record_bytes = 256);
    let stuck = gate.sink();
    job.source("gen", 1, |info| Generator::events(info, 100_000, 100))
        .rebalance()
        .map("m", |e: &Event| *e)
        .rebalance()
        .sink("stuck", 1, move |_| stuck.clone());
    let running = job.start().unwrap();
    // Bound after the job, so dropped before it however the test ends: the sink goes on and
    // the job's threads can be joined.
    let gate = gate;
    std::thread::sleep(Duration::from_millis(500)); // let the rings fill
    let lines = stat_json(running.counters_path(), 1);
    let v = &lines[0];
    println!("{v:#}");
    let sub = |name: &str| v["subtasks"].as_array().unwrap().iter().find(|s| s["name"] == name).cloned().unwrap();
    assert_eq!(sub("m#0")["level"], "HIGH", "{v}");
    // Stuck inside the sink's own code: busy, as Flink counts it (neither idle nor waiting for credit).
    assert!(sub("stuck#0")["busy"].as_f64().unwrap() > 0.9, "{v}");
    assert!(v["rss_bytes"].as_u64().unwrap() > 0, "RSS is sampled while the job runs: {v}");
    assert_eq!(sub("gen#0")["level"], "HIGH", "{v}");
    let into_sink = v["channels"].as_array().unwrap().iter().find(|c| c["name"] == "m#0->stuck#0").cloned().unwrap();
    assert_eq!(into_sink["credit"], 0, "{into_sink}");
    assert!(into_sink["blocked"].as_f64().unwrap() > 0.5, "{into_sink}");
    // Credit by time: the sink never finished a pass, so it measured nothing and announced
    // nothing (the whole ring); every slot is in flight.
    assert_eq!(into_sink["announced"], 64, "{into_sink}");
    assert_eq!(into_sink["in_flight"], 64, "{into_sink}");
    assert_eq!(into_sink["drain_rate_slots_per_s"], 0, "{into_sink}");
    gate.release();
    let summary = running.wait().unwrap();
    assert_eq!(summary.node("stuck").unwrap().records_in, 100_000);
}

/// A job with an ipc source under the user's root: weir-stat lists its endpoint, the job's
/// role on it, the publisher (this process) and the numbers it sent.
#[test]
fn shows_a_jobs_ipc_endpoints() {
    let name = format!("stat-ipc-{}", std::process::id());
    let job = Job::new(&name);
    job.configure(|c| c.pinning = false);
    let config = weir::io::ipc::IpcConfig::default();
    job.source("ticks", 1, move |info| weir::io::ipc::IpcSource::<Event>::new(config.clone(), info)).sink(
        "out",
        1,
        |_| NullSink,
    );
    let running = job.start().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut p = loop {
        match weir_ring::ipc::Publisher::connect_to(&name, "ticks", 0) {
            Ok(p) => break p,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "{e}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    let mut idler = weir_ring::Idler::new(weir_ring::IdleStrategy::default());
    for seq in 0..1000u64 {
        let e = Event { key: seq, value: seq, time_ns: seq, seq };
        let mut bytes = vec![0u8; weir::record::Record::encoded_len(&e)];
        weir::record::Record::encode(&e, &mut bytes);
        p.send(&bytes, &mut idler).unwrap();
    }
    let lines = stat_json(running.counters_path(), 1);
    let endpoints = lines[0]["endpoints"].as_array().expect("an endpoints list").clone();
    assert_eq!(endpoints.len(), 1, "{endpoints:?}");
    let e = &endpoints[0];
    assert_eq!((e["name"].as_str(), e["job_is"].as_str()), (Some("ticks.0"), Some("source")), "{e}");
    assert_eq!(e["peer_pid"].as_u64(), Some(std::process::id() as u64), "{e}");
    assert_eq!((e["peer_alive"].as_bool(), e["next_seq"].as_u64()), (Some(true), Some(1000)), "{e}");
    p.close();
    running.wait().unwrap();
}

/// Run weir-stat with `args` and a watchdog (a tool that blocks is a failure, not a hang).
fn stat_run(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir-stat"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("weir-stat runs");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("watchdog: weir-stat {args:?} still runs after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A private directory for a test, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("weir-stat-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Issue #47: weir-stat on a FIFO says it is not a counters file, at once (no open(2) that
/// waits for a writer for ever); on a run directory whose job was killed it names the job as
/// dead — its pid, when it was last seen alive — and exits 69.
#[test]
fn refuses_a_fifo_and_names_a_dead_job() {
    let dir = Scratch::new("edges");
    let fifo = dir.0.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let out = stat_run(&[fifo.as_os_str(), "--count".as_ref(), "1".as_ref()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("a FIFO, not a counters file"), "{err}");

    // A run directory as a SIGKILLed job leaves it: the counters link into its gone process.
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    let run = dir.0.join("job-dead");
    std::fs::create_dir(&run).unwrap();
    std::os::unix::fs::symlink(format!("/proc/{pid}/fd/7"), run.join("counters")).unwrap();
    std::fs::write(run.join("waiting"), "").unwrap();
    let out = stat_run(&[run.as_os_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("is dead") && err.contains(&format!("process {pid} is gone")), "{err}");
    assert!(err.contains("last seen alive"), "{err}");
}

/// Issue #47: `weir-stat --serve` on a port in use suggests its own flag, not `weir run`'s.
#[test]
fn serve_on_a_port_in_use_names_its_own_flag() {
    let job = Job::new("stat-serve-busy-port");
    job.source("gen", 1, |info| Generator::events(info, 1_000_000, 100).with_rate(1_000.0))
        .sink("out", 1, |_| NullSink);
    let mut running = job.start().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = stat_run(&[running.counters_path().as_os_str(), "--serve".as_ref(), addr.as_ref()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("in use") && err.contains("e.g. --serve") && !err.contains("--metrics"), "{err}");
    running.cancel();
    let _ = running.wait();
}
