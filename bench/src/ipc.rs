//! `weir-bench ipc`: another process → ipc source → forward → ipc sink → that process.
//!
//! - **Throughput**: a peer process (this binary again, `WEIR_BENCH_IPC_PEER`) publishes
//!   `n` events into the job's ipc source endpoint from one thread and reads them back from
//!   the ipc sink's endpoint on another; the job (in this process) is the ipc source, an
//!   identity map and the ipc sink, chained into one subtask. Records per second and per
//!   CPU-second (this process and the peer, which reports its own CPU time), against the same
//!   pipeline with an in-process source (events from a counter) and a counting sink.
//! - **Round trip**: the peer sends one record and waits for it to come back, again and
//!   again (job and peer busy-spinning, and with the default park strategy); against a
//!   round trip over two in-process weir rings between two threads (the in-process hop's)
//!   and the cache-line floor, measured in the same run.

use crate::measure::{Cost, Meter};
use crate::report::{Row, Section};
use crate::{floor, median};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::io::ipc::{IpcConfig, IpcSink, IpcSource};
use weir::operators::{Collector, Halt, Sink, Source, SourcePoll};
use weir::record::{Event, Record};
use weir::ring::ipc::{Publisher, Received, Sent, Subscriber};
use weir::ring::{IdleStrategy, Idler, Read, RingConfig};

/// The variable that makes this binary the peer: `throughput:<in>:<out>:<n>` or
/// `rtt:<in>:<out>:<round trips>`.
pub const PEER_ENV: &str = "WEIR_BENCH_IPC_PEER";

fn event(seq: u64) -> Event {
    Event { key: seq % 1024, value: seq, time_ns: seq, seq }
}

/// Connect with retries (the job makes its endpoints as it starts).
fn retry<T>(what: &str, mut f: impl FnMut() -> Result<T, weir::ring::ipc::EndpointError>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f() {
            Ok(t) => return t,
            Err(e) => {
                assert!(Instant::now() < deadline, "ipc peer: {what}: {e}");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// The peer's side; prints `cpu_s=<its CPU seconds>` and, for round trips, `rtt_ns=...`.
pub fn peer(arg: &str) {
    let parts: Vec<&str> = arg.split(':').collect();
    let (mode, inp, out, n) =
        (parts[0], PathBuf::from(parts[1]), PathBuf::from(parts[2]), parts[3].parse::<u64>().unwrap());
    let meter = Meter::start();
    match mode {
        "throughput" => {
            let reader = std::thread::spawn(move || {
                let mut s = retry("subscribe", || Subscriber::connect(&out));
                let mut idler = Idler::new(IdleStrategy::default());
                let mut next = 0u64;
                while next < n {
                    match s.recv(&mut idler, |seq, _| assert_eq!(seq, next, "in order")).expect("the job stays") {
                        Received::Record(_) => next += 1,
                        Received::Closed => break,
                        Received::Empty => {}
                    }
                }
                assert_eq!(next, n, "every record came back");
            });
            let mut p = retry("publish", || Publisher::connect(&inp));
            p.set_batch(64);
            let mut idler = Idler::new(IdleStrategy::default());
            let len = event(0).encoded_len();
            for seq in 0..n {
                let e = event(seq);
                if p.try_send_with(len, |b| e.encode(b)).expect("the job stays") == Sent::NoCredit {
                    // No room: wait for it (the record is encoded again when room comes).
                    let mut b = vec![0u8; len];
                    e.encode(&mut b);
                    p.send(&b, &mut idler).expect("the job stays");
                }
            }
            p.close();
            reader.join().expect("reader");
        }
        "rtt" => {
            let mut s = retry("subscribe", || Subscriber::connect(&out));
            let mut p = retry("publish", || Publisher::connect(&inp));
            let len = event(0).encoded_len();
            let mut rtts = Vec::with_capacity(n as usize);
            for seq in 0..n {
                let t = Instant::now();
                let e = event(seq);
                while p.try_send_with(len, |b| e.encode(b)).expect("the job stays") == Sent::NoCredit {
                    std::hint::spin_loop();
                }
                loop {
                    match s.try_recv(|got, _| assert_eq!(got, seq)).expect("the job stays") {
                        Received::Record(_) => break,
                        Received::Empty => std::hint::spin_loop(),
                        Received::Closed => panic!("closed early"),
                    }
                }
                s.flush();
                rtts.push(t.elapsed().as_nanos() as u64);
            }
            rtts.sort_unstable();
            let at = |q: f64| rtts[((rtts.len() as f64 * q) as usize).min(rtts.len() - 1)];
            println!("rtt_p50_ns={} rtt_p99_ns={}", at(0.5), at(0.99));
            p.close();
        }
        other => panic!("unknown peer mode {other}"),
    }
    println!("cpu_s={}", meter.stop().cpu_s);
}

fn figure(text: &str, name: &str) -> f64 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")).and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("the peer printed no {name}= in {text}"))
}

/// A private directory for the endpoints (removed on drop).
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ipc_job(dir: &Path, idle: IdleStrategy) -> Job {
    let config = IpcConfig {
        dir: Some(dir.to_owned()),
        ring: RingConfig { slot_bytes: 64, slot_count: 4096, max_record_bytes: 1024 },
        idle,
        ..IpcConfig::default()
    };
    let job = Job::new("bench-ipc");
    job.configure(|c| {
        c.idle = idle;
        c.pinning = false;
    });
    let sink_config = config.clone();
    job.source("in", 1, move |info| IpcSource::<Event>::new(config.clone(), info)).map("forward", |e: &Event| *e).sink(
        "out",
        1,
        move |info| IpcSink::<Event>::new(sink_config.clone(), info),
    );
    job
}

/// Run the ipc pipeline with a peer in `mode`; the cost (this process + the peer) and what
/// the peer printed.
fn run_ipc(mode: &str, n: u64, idle: IdleStrategy) -> (Cost, String) {
    let dir = Dir(std::env::temp_dir().join(format!("weir-bench-ipc-{}-{mode}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let meter = Meter::start();
    let running = ipc_job(&dir.0, idle).start().expect("the ipc job starts");
    let peer = Command::new(std::env::current_exe().expect("this binary"))
        .arg("ipc")
        .env(PEER_ENV, format!("{mode}:{}:{}:{n}", dir.0.join("in.0").display(), dir.0.join("out.0").display()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("the peer starts");
    let out = peer.wait_with_output().expect("the peer ends");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the ipc peer failed: {text}");
    running.wait().expect("the ipc job ends cleanly");
    let mut cost = meter.stop();
    cost.cpu_s += figure(&text, "cpu_s");
    (cost, text)
}

/// Events from a counter: the in-process stand-in for the publisher.
struct Counter(u64, u64);

impl Source<Event> for Counter {
    fn poll(&mut self, out: &mut dyn Collector<Event>) -> Result<SourcePoll, Halt> {
        if self.0 == self.1 {
            return Ok(SourcePoll::Finished);
        }
        let end = (self.0 + 256).min(self.1);
        for seq in self.0..end {
            out.collect(&event(seq))?;
        }
        let n = (end - self.0) as usize;
        self.0 = end;
        Ok(SourcePoll::Emitted(n))
    }
}

/// Counts what reaches it: the in-process stand-in for the subscriber.
struct Count(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Sink<Event> for Count {
    fn write(&mut self, e: &Event) -> Result<(), Halt> {
        std::hint::black_box(e);
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// The same pipeline in-process: unchained (`chaining`: false), source, forward and sink are
/// three subtasks joined by two rings, as the ipc pipeline's are joined by its two
/// endpoints; chained, one subtask and no ring.
fn run_in_process(n: u64, chaining: bool) -> Cost {
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let job = Job::new("bench-ipc-baseline");
    job.configure(|c| {
        c.pinning = false;
        c.chaining = chaining;
    });
    let sink = count.clone();
    job.source("in", 1, move |_| Counter(0, n))
        .map("forward", |e: &Event| *e)
        .sink("out", 1, move |_| Count(sink.clone()));
    let meter = Meter::start();
    job.start().expect("starts").wait().expect("ends");
    let cost = meter.stop();
    assert_eq!(count.load(std::sync::atomic::Ordering::Relaxed), n);
    cost
}

/// Round trips over two in-process weir rings between two busy-spinning threads, ns
/// (median of 5 rounds' means).
fn in_process_hop_rtt(round_trips: u64) -> f64 {
    let config = RingConfig { slot_bytes: 64, slot_count: 4096, max_record_bytes: 1024 };
    let mut rounds = Vec::new();
    for _ in 0..5 {
        let (mut there_p, mut there_c) = weir::ring::channel(config).unwrap();
        let (mut back_p, mut back_c) = weir::ring::channel(config).unwrap();
        let echo = std::thread::spawn(move || {
            for _ in 0..round_trips {
                loop {
                    if let Read::Record(r) = there_c.read().unwrap() {
                        let mut buf = [0u8; 40];
                        buf.copy_from_slice(&r.payload()[..40]);
                        r.release();
                        while !back_p.push(weir::ring::RecordKind::Data, &buf).unwrap() {}
                        back_p.publish();
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
        });
        let t = Instant::now();
        let buf = [7u8; 40];
        for _ in 0..round_trips {
            while !there_p.push(weir::ring::RecordKind::Data, &buf).unwrap() {}
            there_p.publish();
            loop {
                if let Read::Record(r) = back_c.read().unwrap() {
                    r.release();
                    break;
                }
                std::hint::spin_loop();
            }
        }
        rounds.push(t.elapsed().as_nanos() as f64 / round_trips as f64);
        echo.join().unwrap();
    }
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

/// The section.
pub fn section(smoke: bool) -> Section {
    let n: u64 = if smoke { 20_000 } else { 5_000_000 };
    let round_trips: u64 = if smoke { 2_000 } else { 50_000 };
    let mut s = Section::new("ipc", "Another process → ipc source → forward → ipc sink → that process");
    let runs = if smoke { 1 } else { 3 };
    let (mut ipc, mut base, mut chained) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        // Alternated, so drift in the machine's load hits all alike.
        ipc.push(run_ipc("throughput", n, IdleStrategy::default()).0);
        base.push(run_in_process(n, false));
        chained.push(run_in_process(n, true));
    }
    let ipc_cpu = median(ipc.iter().map(|c| c.per_cpu_s(n)).collect());
    let base_cpu = median(base.iter().map(|c| c.per_cpu_s(n)).collect());
    let ipc_wall = median(ipc.iter().map(|c| c.per_s(n)).collect());
    let base_wall = median(base.iter().map(|c| c.per_s(n)).collect());
    let chained_cpu = median(chained.iter().map(|c| c.per_cpu_s(n)).collect());
    s.rows.push(
        Row::new("records per CPU-second, ipc in and out (job + peer process)", ipc_cpu / 1e6, "M")
            .vs("in-process source, forward, sink on two rings", base_cpu / 1e6)
            .target("≥ 0.9× in-process", |r| r >= 0.9),
    );
    s.rows.push(
        Row::new("records per second, ipc in and out", ipc_wall / 1e6, "M")
            .vs("in-process source, forward, sink on two rings", base_wall / 1e6),
    );
    s.rows.push(
        Row::new("records per CPU-second, ipc in and out", ipc_cpu / 1e6, "M")
            .vs("in-process, chained (one subtask, no ring)", chained_cpu / 1e6),
    );

    let fl = floor::measure((None, None), if smoke { 20_000 } else { 200_000 }, 5);
    let hop = in_process_hop_rtt(round_trips);
    let mut rtt_json = Vec::new();
    for (label, idle) in [("busy-spin", IdleStrategy::BusySpin), ("park (default)", IdleStrategy::default())] {
        let (_, text) = run_ipc("rtt", round_trips, idle);
        let (p50, p99) = (figure(&text, "rtt_p50_ns"), figure(&text, "rtt_p99_ns"));
        s.rows.push(
            Row::new(format!("round trip through the job, job {label}: median"), p50 / 1e3, "µs")
                .vs("in-process hop round trip (two rings, two threads)", hop / 1e3)
                .target("≤ 1.5× in-process", |r| r <= 1.5)
                .note(format!(
                    "p99 {:.1} µs; cache-line floor {:.0} ns (ratio {:.1}×)",
                    p99 / 1e3,
                    fl.rtt_ns,
                    p50 / fl.rtt_ns
                )),
        );
        rtt_json.push(json!({ "job_idle": label, "p50_ns": p50, "p99_ns": p99 }));
    }
    s.details = json!({
        "records": n,
        "runs": runs,
        "ipc": ipc.iter().map(|c| c.json(n)).collect::<Vec<_>>(),
        "in_process": base.iter().map(|c| c.json(n)).collect::<Vec<_>>(),
        "in_process_chained": chained.iter().map(|c| c.json(n)).collect::<Vec<_>>(),
        "round_trips": round_trips,
        "rtt": rtt_json,
        "in_process_hop_rtt_ns": hop,
        "floor": fl.json(),
        "cores": "unpinned; the job (one subtask), the peer's publisher and subscriber threads share the machine's CPUs",
    });
    s.markdown = format!(
        "The peer is a second process (this binary again) with one publisher and one subscriber thread; \
         CPU time counts both processes. Round trips: one record at a time, the peer busy-spinning; the \
         in-process hop is two weir rings between two busy-spinning threads ({:.0} ns), the floor one \
         cache line bounced between two threads ({:.0} ns).\n",
        hop, fl.rtt_ns
    );
    s
}
