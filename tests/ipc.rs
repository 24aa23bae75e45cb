//! Other processes feed and read a running job through ipc endpoints (issue #18).
//!
//! The other process is this test binary run again with `--exact child` and the
//! `WEIR_IPC_CHILD` variable (`mode:path:...`); without the variable `child` does nothing.
//! Publishers send events whose fields follow from their sequence number, so the job's
//! output is checked record by record: nothing lost, nothing twice, nothing out of order.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::io::ipc::{IpcConfig, IpcSink, IpcSource, OnPoison};
use weir::io::{FileSink, FileSinkConfig};
use weir::operators::builtin::Generator;
use weir::operators::{Halt, Sink};
use weir::record::{Event, Record};
use weir::runtime::{JobError, JobSummary};
use weir_ring::ipc::{Publisher, Received, Sent, Subscriber};
use weir_ring::{IdleStrategy, Idler, RingConfig};

const CHILD_ENV: &str = "WEIR_IPC_CHILD";

/// The event a publisher sends as record `seq`.
fn event(seq: u64) -> Event {
    Event { key: seq % 97, value: seq.wrapping_mul(0x9e37_79b9_7f4a_7c15), time_ns: seq * 1000, seq }
}

fn encode(e: &Event) -> Vec<u8> {
    let mut b = vec![0u8; e.encoded_len()];
    e.encode(&mut b);
    b
}

/// A private directory for a test's endpoints (0700, removed on drop).
struct EndpointDir(PathBuf);

impl EndpointDir {
    fn new(name: &str) -> EndpointDir {
        let dir = std::env::temp_dir().join(format!("weir-ipc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        EndpointDir(dir)
    }

    fn config(&self, slots: u32) -> IpcConfig {
        IpcConfig {
            dir: Some(self.0.clone()),
            ring: RingConfig { slot_bytes: 64, slot_count: slots, max_record_bytes: 256 },
            ..IpcConfig::default()
        }
    }

    /// The endpoint of subtask `index` of node `node`.
    fn path(&self, node: &str, index: usize) -> PathBuf {
        self.0.join(format!("{node}.{index}"))
    }
}

impl Drop for EndpointDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Collects what reaches it.
struct Collect(Arc<Mutex<Vec<Event>>>, Option<Duration>);

impl Sink<Event> for Collect {
    fn write(&mut self, e: &Event) -> Result<(), Halt> {
        if let Some(d) = self.1 {
            std::thread::sleep(d);
        }
        self.0.lock().unwrap().push(*e);
        Ok(())
    }
}

/// ipc source `in` (1 subtask) into a collecting sink (with `delay` per record).
fn job_from_ipc(name: &str, config: IpcConfig, delay: Option<Duration>) -> (Job, Arc<Mutex<Vec<Event>>>) {
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new(name);
    job.configure(|c| c.pinning = false);
    let sink = out.clone();
    job.source("in", 1, move |info| IpcSource::<Event>::new(config.clone(), info))
        .sink("out", 1, move |_| Collect(sink.clone(), delay));
    (job, out)
}

/// Wait for the job to end (a watchdog, not a speed test).
fn finish(running: weir::runtime::RunningJob, limit: Duration) -> Result<JobSummary, JobError> {
    let deadline = Instant::now() + limit;
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not end in {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    running.wait()
}

fn spawn_child(arg: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, arg)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn child_output(child: std::process::Child, limit: Duration) -> String {
    let out = common::wait_with_watchdog(child, limit);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "child failed ({:?}): {text}", out.status);
    text
}

/// The figure `name` a child printed as `name=<n>`.
fn figure(text: &str, name: &str) -> u64 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")).and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("no {name}= in {text}"))
}

/// Connect a publisher, retrying while the job has not made the endpoint yet.
fn connect(path: &Path) -> Publisher {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Publisher::connect(path) {
            Ok(p) => return p,
            Err(e) => {
                assert!(Instant::now() < deadline, "publisher: cannot connect to {}: {e}", path.display());
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// The other process. Modes:
/// - `publish:<path>:<end>:<close|detach|forever>[:<batch>]`: connect, send from the
///   endpoint's next number up to `end` (or for ever), then close or detach; print the
///   figures (`batch`: records made visible together);
/// - `second:<path>`: try to take a publisher role that is held; print the refusal;
/// - `subscribe:<path>:<count>`: read `count` records in order, then the close.
#[test]
fn child() {
    let Ok(arg) = std::env::var(CHILD_ENV) else { return };
    let parts: Vec<&str> = arg.split(':').collect();
    match parts[0] {
        "publish" => {
            let path = Path::new(parts[1]);
            let end: u64 = parts[2].parse().unwrap();
            let mut p = connect(path);
            if let Some(batch) = parts.get(4) {
                p.set_batch(batch.parse().unwrap());
            }
            let first = p.next_seq();
            let mut idler = Idler::new(IdleStrategy::default());
            let mut no_credit = 0u64;
            let forever = parts[3] == "forever";
            let mut seq = first;
            while forever || seq < end {
                let bytes = encode(&event(seq));
                match p.try_send(&bytes).expect("publisher: the endpoint stays healthy") {
                    Sent::Sent(s) => {
                        assert_eq!(s, seq, "numbers follow on");
                        seq += 1;
                        idler.reset();
                    }
                    Sent::NoCredit => {
                        no_credit += 1;
                        p.send(&bytes, &mut idler).expect("publisher: the job stays");
                        seq += 1;
                    }
                }
            }
            let status = p.status();
            println!(
                "first={first} sent={} no_credit={no_credit} blocked_ns={} durable={}",
                seq - first,
                status.producer_blocked_ns,
                p.durable_seq()
            );
            match parts[3] {
                "detach" => p.detach(),
                _ => p.close(),
            }
        }
        "second" => match Publisher::connect(parts[1]) {
            Ok(_) => println!("refused=no"),
            Err(e) => println!("refused=yes {e}"),
        },
        "subscribe" => {
            let path = Path::new(parts[1]);
            let count: u64 = parts[2].parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut s = loop {
                match Subscriber::connect(path) {
                    Ok(s) => break s,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "subscriber: {e}");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            };
            let mut idler = Idler::new(IdleStrategy::default());
            let mut next = 0u64;
            loop {
                let got = s
                    .recv(&mut idler, |seq, bytes| {
                        assert_eq!(seq, next, "subscriber: records in order, once");
                        Event::decode(bytes, |e| assert_eq!(e.seq, seq, "the job's record {seq}")).unwrap();
                    })
                    .expect("subscriber: the job stays until it is read");
                match got {
                    Received::Record(_) => next += 1,
                    Received::Closed => break,
                    Received::Empty => unreachable!("recv waits"),
                }
            }
            assert_eq!(next, count, "every record");
            println!("received={next}");
        }
        "job" => {
            // The job of `a_job_killed_and_restarted_with_its_publisher_running_...`.
            let (endpoints, chk, out) = (PathBuf::from(parts[1]), PathBuf::from(parts[2]), PathBuf::from(parts[3]));
            let config = IpcConfig { dir: Some(endpoints), ..IpcConfig::default() };
            let job = checkpointed_job("ipc-restart", &chk);
            job.source("in", 1, move |info| IpcSource::<Event>::new(config.clone(), info)).sink(
                "out",
                1,
                move |info| FileSink::new(FileSinkConfig::new(&out), info),
            );
            let summary = job.start().expect("job starts").wait().expect("job ends cleanly");
            println!("restored={:?}", summary.checkpoints.restored_from);
        }
        "holdjob" => {
            // The job of `a_c_publisher_ends_its_stream_durably_across_a_restart`: its map holds
            // record `hold_at` while the file `hold` exists, so the end cannot become durable;
            // before, it takes 200 µs a record, so checkpoints (every 50 ms) complete on the way
            // and the restarted job restores one (the publisher resends from past 0).
            let (endpoints, chk, out) = (PathBuf::from(parts[1]), PathBuf::from(parts[2]), PathBuf::from(parts[3]));
            let (hold, hold_at) = (PathBuf::from(parts[4]), parts[5].parse::<u64>().unwrap());
            let config = IpcConfig { dir: Some(endpoints), ..IpcConfig::default() };
            let job = checkpointed_job("ipc-c-restart", &chk);
            job.source("in", 1, move |info| IpcSource::<Event>::new(config.clone(), info))
                .map("hold", move |e: &Event| {
                    std::thread::sleep(Duration::from_micros(200));
                    while e.seq == hold_at && hold.exists() {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    *e
                })
                .sink("out", 1, move |info| FileSink::new(FileSinkConfig::new(&out), info));
            let summary = job.start().expect("job starts").wait().expect("job ends cleanly");
            println!("restored={:?}", summary.checkpoints.restored_from);
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn assert_exact(events: &[Event], n: u64) {
    assert_eq!(events.len() as u64, n, "every record once");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(*e, event(i as u64), "record {i}");
    }
}

/// A publisher in another process feeds a job: every record once, in order; the job's
/// source ends when the publisher closes the stream.
#[test]
fn a_publisher_in_another_process_feeds_a_job_exactly() {
    const N: u64 = 200_000;
    let dir = EndpointDir::new("feeds");
    let (job, out) = job_from_ipc("ipc-feeds", dir.config(256), None);
    let running = job.start().expect("job starts");
    let child = spawn_child(&format!("publish:{}:{N}:close", dir.path("in", 0).display()));
    let text = child_output(child, Duration::from_secs(120));
    finish(running, Duration::from_secs(60)).expect("job ends cleanly");
    assert_eq!(figure(&text, "first"), 0);
    assert_exact(&out.lock().unwrap(), N);
    assert!(!dir.path("in", 0).exists(), "the endpoint is removed with the job");
}

/// A slow job holds the publisher back: its claims find no credit (a value, not an error)
/// and it waits; the endpoint counts the time it was blocked, and the job's counters file
/// shows it like any channel's (`ipc:in->in#0`, what `weir-stat` and Prometheus read);
/// nothing is lost.
#[test]
fn back_pressure_reaches_the_external_publisher() {
    use weir::telemetry::counters::CounterKind;
    const N: u64 = 2_000;
    let dir = EndpointDir::new("backpressure");
    let out = Arc::new(Mutex::new(Vec::new()));
    let job = Job::new("ipc-backpressure");
    job.configure(|c| c.pinning = false);
    let (sink, config) = (out.clone(), dir.config(16));
    let stats = Arc::new(weir::io::ipc::IpcStats::default());
    let gauge = stats.endpoint_gauge("in", "in");
    job.configure(|c| c.endpoint_gauges.push(gauge));
    job.source("in", 1, move |info| IpcSource::<Event>::with_stats(config.clone(), info, stats.clone())).sink(
        "out",
        1,
        move |_| Collect(sink.clone(), Some(Duration::from_micros(200))),
    );
    let running = job.start().expect("job starts");
    let reader = weir_ring::counters::CountersReader::open(running.counters_path()).unwrap();
    let channel = |kind: CounterKind| {
        reader.snapshot().iter().find(|c| c.type_id == kind.type_id() && c.owner == "ipc:in->in#0").map(|c| c.value)
    };
    let mut child = spawn_child(&format!("publish:{}:{N}:close", dir.path("in", 0).display()));
    // While it publishes: the channel's figures as the job's counters file has them.
    let (mut blocked, mut slots, mut fullest) = (0, None, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        blocked = blocked.max(channel(CounterKind::ChannelBlockedNs).unwrap_or(0));
        slots = slots.or(channel(CounterKind::ChannelSlots));
        fullest = fullest.max(channel(CounterKind::ChannelBacklog).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = child_output(child, Duration::from_secs(120));
    finish(running, Duration::from_secs(60)).expect("job ends cleanly");
    assert!(figure(&text, "no_credit") > 0, "the publisher met back pressure: {text}");
    assert!(figure(&text, "blocked_ns") > 0, "and its blocked time is counted: {text}");
    println!("counters file: channel ipc:in->in#0, {slots:?} slots, up to {fullest} used, blocked {blocked} ns");
    assert_eq!(slots, Some(16), "the endpoint is a channel of the job's counters");
    assert!(blocked > 0 && blocked <= figure(&text, "blocked_ns"), "the publisher's blocked time, as it counted it");
    assert!(fullest > 8, "the ring filled up behind the slow sink: {fullest} of 16 slots");
    assert_exact(&out.lock().unwrap(), N);
}

/// Publishers killed with SIGKILL at random moments, 24 times (every other one making its
/// records visible 16 at a time): each successor takes the role over and goes on at the
/// number the endpoint holds. The job sees every record once,
/// in order (what a killed publisher had committed but not published is sent again by the
/// next; copies of what it had published are dropped as duplicates).
#[test]
fn publishers_killed_again_and_again_lose_and_double_nothing() {
    const N: u64 = 150_000;
    const KILLS: usize = 24;
    let dir = EndpointDir::new("kills");
    let (job, out) = job_from_ipc("ipc-kills", dir.config(64), None);
    let running = job.start().expect("job starts");
    let path = dir.path("in", 0);
    let mut clock = common::KillClock::from_time();
    for round in 0..KILLS {
        let batch = if round % 2 == 0 { 1 } else { 16 };
        let mut child = spawn_child(&format!("publish:{}:0:forever:{batch}", path.display()));
        std::thread::sleep(clock.next_delay(20, 60));
        common::kill_and_clean(&mut child);
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "round {round}: killed, not ended: {status:?}");
    }
    let before_last = out.lock().unwrap().len() as u64;
    let end = before_last.max(N) + 1_000;
    let child = spawn_child(&format!("publish:{}:{end}:close", path.display()));
    let text = child_output(child, Duration::from_secs(120));
    finish(running, Duration::from_secs(60)).expect("job ends cleanly");
    println!("last publisher: {text}");
    assert_exact(&out.lock().unwrap(), end);
}

/// A second publisher is refused while the first lives, naming it; after the first
/// detaches (without ending the stream), a new one goes on where it stopped.
#[test]
fn a_second_publisher_is_refused_and_a_detached_role_is_taken_over() {
    let dir = EndpointDir::new("second");
    let (job, out) = job_from_ipc("ipc-second", dir.config(64), None);
    let running = job.start().expect("job starts");
    let path = dir.path("in", 0);
    let mut first = connect(&path);
    let mut idler = Idler::new(IdleStrategy::default());
    for seq in 0..100 {
        first.send(&encode(&event(seq)), &mut idler).unwrap();
    }
    let text = child_output(spawn_child(&format!("second:{}", path.display())), Duration::from_secs(60));
    assert!(text.contains("refused=yes"), "{text}");
    assert!(text.contains(&format!("pid {}", std::process::id())) && text.contains("producer"), "{text}");
    first.detach();
    let text = child_output(spawn_child(&format!("publish:{}:300:close", path.display())), Duration::from_secs(60));
    assert_eq!(figure(&text, "first"), 100, "the successor starts where the first stopped: {text}");
    finish(running, Duration::from_secs(60)).expect("job ends cleanly");
    assert_exact(&out.lock().unwrap(), 300);
}

/// What a hostile publisher can do to the endpoint's file: truncating it fails (sealed:
/// no SIGBUS in the job), a mode opened to others makes attaching refuse, and replacing the
/// path changes nothing the job reads. The job carries on and delivers exactly.
#[test]
fn truncating_or_replacing_the_endpoint_cannot_hurt_the_job() {
    let dir = EndpointDir::new("truncate");
    let (job, out) = job_from_ipc("ipc-truncate", dir.config(64), None);
    let running = job.start().expect("job starts");
    let path = dir.path("in", 0);
    let mut p = connect(&path);
    let mut idler = Idler::new(IdleStrategy::default());
    for seq in 0..1_000 {
        p.send(&encode(&event(seq)), &mut idler).unwrap();
    }
    // Truncate and grow through the path: refused by the seals.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let e = file.set_len(0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "truncation refused: {e}");
    let e = file.set_len(1 << 30).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "growth refused: {e}");
    // Opened to others: a new attach refuses it (the job's own mapping is unaffected).
    file.set_permissions(std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Publisher::connect(&path).unwrap_err();
    assert!(e.to_string().contains("mode 644"), "{e}");
    file.set_permissions(std::fs::Permissions::from_mode(0o600)).unwrap();
    drop(file);
    // Replaced: the link now names a plain file; the job still reads the memory it mapped.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    for seq in 1_000..2_000 {
        p.send(&encode(&event(seq)), &mut idler).unwrap();
    }
    p.close();
    finish(running, Duration::from_secs(60)).expect("job ends cleanly");
    assert_exact(&out.lock().unwrap(), 2_000);
    assert!(path.exists(), "what the peer put there is not ours to remove");
}

/// A publisher that skips numbers fails the job (default), saying which records are
/// missing; with `on_poison = reset` the endpoint is made anew and a publisher that
/// connects again goes on from the number expected.
#[test]
fn a_gap_fails_the_job_or_resets_the_endpoint_by_policy() {
    let dir = EndpointDir::new("gap");
    for policy in [OnPoison::Fail, OnPoison::Reset] {
        let config = IpcConfig { on_poison: policy, ..dir.config(64) };
        let (job, out) = job_from_ipc("ipc-gap2", config, None);
        let running = job.start().expect("job starts");
        let path = dir.path("in", 0);
        let ring = {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match weir_ring::Ring::attach(&path) {
                    Ok(r) => break r,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "{e}");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        };
        let mut raw = ring.producer().unwrap();
        for seq in [0u64, 1, 5] {
            let mut bytes = seq.to_le_bytes().to_vec();
            bytes.extend(encode(&event(seq)));
            raw.push(weir_ring::RecordKind::Data, &bytes).unwrap();
        }
        raw.publish();
        match policy {
            OnPoison::Fail => {
                let e = finish(running, Duration::from_secs(60)).expect_err("a gap fails the job");
                let text = e.to_string();
                assert!(text.contains("record 5 came when 2 was expected") && text.contains("2..5"), "{text}");
                assert!(text.contains("on_poison"), "says what else could be done: {text}");
                drop(raw);
            }
            OnPoison::Reset => {
                // The old ring is left behind; a publisher connecting now gets the new one,
                // which wants record 2.
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut p = loop {
                    if let Ok(p) = Publisher::connect(&path)
                        && p.next_seq() == 2
                    {
                        break p;
                    }
                    assert!(Instant::now() < deadline, "the endpoint was made anew at record 2");
                    std::thread::sleep(Duration::from_millis(5));
                };
                let mut idler = Idler::new(IdleStrategy::default());
                for seq in 2..10 {
                    p.send(&encode(&event(seq)), &mut idler).unwrap();
                }
                p.close();
                drop(raw);
                finish(running, Duration::from_secs(60)).expect("job ends cleanly");
                assert_exact(&out.lock().unwrap(), 10);
            }
        }
    }
}

/// Issue #47: a same-user process scribbles over a live endpoint two ways — random bytes over
/// the slot after the last record with the published position moved one slot forward
/// (committing nothing), or garbage over the ring's 768-byte header (a `closed` bit among
/// it) — under both policies. With `on_poison = fail` the job fails naming the endpoint and
/// what was wrong; with `reset` the endpoint is made anew and a publisher that connects again
/// delivers the rest, every record once. Never an exit 0 with records missing, never a wait
/// for ever.
#[test]
fn a_scribbled_endpoint_fails_or_resets_never_ends_short() {
    use std::os::unix::fs::FileExt;
    const SENT: u64 = 100;
    let dir = EndpointDir::new("scribble");
    for scribble in ["slots", "header"] {
        for policy in [OnPoison::Fail, OnPoison::Reset] {
            let config = IpcConfig { on_poison: policy, ..dir.config(64) };
            let (job, out) = job_from_ipc(&format!("ipc-scribble-{scribble}"), config, None);
            let running = job.start().expect("job starts");
            let path = dir.path("in", 0);
            let mut p = connect(&path);
            let mut idler = Idler::new(IdleStrategy::default());
            for seq in 0..SENT {
                p.send(&encode(&event(seq)), &mut idler).unwrap();
            }
            p.flush();
            let deadline = Instant::now() + Duration::from_secs(60);
            while (out.lock().unwrap().len() as u64) < SENT {
                assert!(Instant::now() < deadline, "watchdog: the job did not read the first records");
                std::thread::sleep(Duration::from_millis(5));
            }
            let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
            let mut word = [0u8; 8];
            file.read_exact_at(&mut word, 128).unwrap();
            let tail = u64::from_le_bytes(word);
            let slots_at = weir_ring::layout::HEADER_BYTES as u64;
            let mut noise = tail ^ 0x9e37_79b9_7f4a_7c15;
            let garbage = |n: usize, x: &mut u64| -> Vec<u8> {
                (0..n / 8)
                    .flat_map(|_| {
                        // xorshift64: any bytes will do, the same on every run.
                        *x ^= *x << 13;
                        *x ^= *x >> 7;
                        *x ^= *x << 17;
                        x.to_le_bytes()
                    })
                    .collect()
            };
            let why = match scribble {
                "slots" => {
                    let mut bytes = garbage(64, &mut noise);
                    bytes[7] &= 0x7f; // no lap tag: not a header any producer could commit
                    file.write_all_at(&bytes, slots_at + (tail % 64) * 64).unwrap();
                    file.write_all_at(&(tail + 1).to_le_bytes(), 128).unwrap();
                    "Uncommitted"
                }
                _ => {
                    let mut bytes = garbage(slots_at as usize, &mut noise);
                    bytes[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
                    file.write_all_at(&bytes, 0).unwrap();
                    "HeaderChanged"
                }
            };
            match policy {
                OnPoison::Fail => {
                    let e = finish(running, Duration::from_secs(60)).expect_err("a scribbled endpoint fails the job");
                    let text = e.to_string();
                    assert!(text.contains(why) && text.contains(&path.display().to_string()), "{text}");
                    drop(p);
                }
                OnPoison::Reset => {
                    // The endpoint made anew wants the record after the last one read.
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let mut again = loop {
                        if let Ok(q) = Publisher::connect(&path)
                            && q.next_seq() == SENT
                        {
                            break q;
                        }
                        assert!(Instant::now() < deadline, "watchdog: the endpoint was not made anew");
                        std::thread::sleep(Duration::from_millis(5));
                    };
                    for seq in SENT..2 * SENT {
                        again.send(&encode(&event(seq)), &mut idler).unwrap();
                    }
                    again.close();
                    drop(p);
                    let summary = finish(running, Duration::from_secs(60)).expect("the job ends cleanly");
                    assert_exact(&out.lock().unwrap(), 2 * SENT);
                    let _ = summary;
                }
            }
        }
    }
}

/// Garbage in the ring's own framing (a record header no writer could make) poisons the
/// ring; the job fails saying so instead of reading out of bounds or looping.
#[test]
fn a_broken_ring_fails_the_job_with_the_poison() {
    let dir = EndpointDir::new("poison");
    let (job, _out) = job_from_ipc("ipc-poison", dir.config(64), None);
    let running = job.start().expect("job starts");
    let path = dir.path("in", 0);
    let p = connect(&path);
    // Commit a data record header that claims 1 GiB at position 0 (lap 0's tag: 64 slots),
    // and a tail past it, by hand (offsets from weir_ring::layout).
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    use std::os::unix::fs::FileExt;
    let slots_at = weir_ring::layout::HEADER_BYTES as u64;
    let header = weir_ring::layout::header_word(weir_ring::RecordKind::Data as u8, 1 << 30, 0, 64u32.trailing_zeros());
    file.write_all_at(&header.to_le_bytes(), slots_at).unwrap();
    file.write_all_at(&1u64.to_le_bytes(), 128).unwrap();
    let e = finish(running, Duration::from_secs(60)).expect_err("a broken ring fails the job");
    let text = e.to_string();
    assert!(text.contains("poisoned") && text.contains(&path.display().to_string()), "{text}");
    drop(p);
}

/// An ipc sink: a subscriber in another process reads every record once, in order, then
/// the end of the stream.
#[test]
fn a_subscriber_in_another_process_reads_a_sink_exactly() {
    const N: u64 = 100_000;
    let dir = EndpointDir::new("sink");
    let config = dir.config(128);
    let job = Job::new("ipc-sink");
    job.configure(|c| c.pinning = false);
    job.source("gen", 1, |info| Generator::events(info, N, 1000))
        .sink("out", 1, move |info| IpcSink::<Event>::new(config.clone(), info));
    let running = job.start().expect("job starts");
    let child = spawn_child(&format!("subscribe:{}:{N}", dir.path("out", 0).display()));
    let text = child_output(child, Duration::from_secs(120));
    finish(running, Duration::from_secs(60)).expect("job ends cleanly");
    assert_eq!(figure(&text, "received"), N);
}

/// A sink whose subscriber never comes fails after `reader_timeout` with what to do,
/// instead of holding the job for ever.
#[test]
fn a_sink_without_a_subscriber_fails_after_its_timeout() {
    let dir = EndpointDir::new("nosub");
    let config = IpcConfig { reader_timeout: Some(Duration::from_millis(300)), ..dir.config(16) };
    let job = Job::new("ipc-nosub");
    job.configure(|c| c.pinning = false);
    job.source("gen", 1, |info| Generator::events(info, 10_000, 1000))
        .sink("out", 1, move |info| IpcSink::<Event>::new(config.clone(), info));
    let running = job.start().expect("job starts");
    let e = finish(running, Duration::from_secs(60)).expect_err("no subscriber");
    let text = e.to_string();
    assert!(text.contains("no subscriber") && text.contains("reader_timeout_ms"), "{text}");
}

/// A second instance of a job cannot take over a live one's endpoint.
#[test]
fn a_live_endpoint_is_not_taken_by_another_job() {
    let dir = EndpointDir::new("twice");
    let (job, _out) = job_from_ipc("ipc-twice", dir.config(64), None);
    let running = job.start().expect("job starts");
    let path = dir.path("in", 0);
    let p = connect(&path);
    let (job2, _out2) = job_from_ipc("ipc-twice", dir.config(64), None);
    let e = finish(job2.start().expect("starts"), Duration::from_secs(60)).expect_err("refused");
    let text = e.to_string();
    assert!(text.contains("is served by pid") && text.contains("another instance"), "{text}");
    p.close();
    finish(running, Duration::from_secs(60)).expect("the first job is unharmed");
}

/// The job killed with SIGKILL five times while a publisher (this process) keeps sending,
/// and restarted from its last checkpoint each time. The publisher follows the stated
/// contract: it keeps what is not durable, connects again when the job is gone, sends from
/// the number the new endpoint asks for (never below what it was told is durable), and at
/// the end closes and waits until the job's final checkpoint holds everything (connecting
/// again if the job went first). The exactly-once file sink then holds every record once.
#[test]
fn a_job_killed_and_restarted_with_its_publisher_running_delivers_each_record_once() {
    use std::sync::atomic::{
        AtomicBool,
        Ordering::{Acquire, Release},
    };
    const N: u64 = 300_000;
    let dir = EndpointDir::new("restart");
    let (chk, out) = (dir.0.join("chk"), dir.0.join("out"));
    let endpoints = dir.0.join("endpoints");
    let path = endpoints.join("in.0");
    let done = Arc::new(AtomicBool::new(false));
    // The kills so far: the publisher holds its last record back until there were 3, so the
    // job goes mid-stream at least that often however fast this machine sends.
    let killed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let publisher = {
        let (path, done, killed) = (path.clone(), done.clone(), killed.clone());
        std::thread::spawn(move || {
            let mut last_durable = 0;
            let mut reconnects = 0u64;
            loop {
                let mut p = connect(&path);
                let start = p.next_seq();
                assert!(start >= last_durable, "the job asks for {start}, below durable {last_durable}");
                let mut seq = start;
                let gone = loop {
                    if seq == N {
                        break false;
                    }
                    if seq == N - 1 && killed.load(Acquire) < 3 {
                        if !p.job_alive() {
                            break true;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    match p.try_send(&encode(&event(seq))) {
                        Ok(Sent::Sent(_)) => {
                            seq += 1;
                            // Paced, so the kills land mid-stream.
                            if seq.is_multiple_of(200) {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        }
                        Ok(Sent::NoCredit) if p.job_alive() => std::thread::sleep(Duration::from_micros(200)),
                        Ok(Sent::NoCredit) | Err(_) => break true,
                    }
                    last_durable = last_durable.max(p.durable_seq());
                };
                if !gone {
                    match p.close_and_wait(Duration::from_secs(60)) {
                        Ok(true) => {
                            done.store(true, Release);
                            return reconnects;
                        }
                        Ok(false) => panic!("the job neither made the end durable nor went in 60 s"),
                        Err(_) => {}
                    }
                }
                println!(
                    "publisher: the job went at record {seq} (this run started at {start}, durable {last_durable})"
                );
                reconnects += 1;
            }
        })
    };
    let job_arg = format!("job:{}:{}:{}", endpoints.display(), chk.display(), out.display());
    let mut clock = common::KillClock::from_time();
    let mut kills = 0;
    let last = loop {
        let mut child = spawn_child(&job_arg);
        std::thread::sleep(clock.next_delay(300, 400));
        if kills == 5 || done.load(Acquire) {
            break child;
        }
        common::kill_and_clean(&mut child);
        let _ = child.wait();
        kills += 1;
        killed.store(kills, Release);
    };
    let text = child_output(last, Duration::from_secs(120));
    let reconnects = publisher.join().expect("the publisher keeps the contract");
    println!("kills {kills}, publisher reconnects {reconnects}; last run: {text}");
    assert!(reconnects >= 3, "the job went mid-stream ({reconnects} times)");
    let mut seqs = Vec::new();
    for entry in std::fs::read_dir(&out).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".inprogress"), "no in-progress part is left: {name}");
        for line in std::fs::read_to_string(out.join(&name)).unwrap().lines() {
            let seq: u64 = line.rsplit_once("seq=").and_then(|(_, s)| s.parse().ok()).expect("a record line");
            assert_eq!(line, event(seq).to_string(), "record {seq} whole");
            seqs.push(seq);
        }
    }
    seqs.sort_unstable();
    let missing = (0..N).filter(|s| seqs.binary_search(s).is_err()).count();
    let doubled = seqs.windows(2).filter(|w| w[0] == w[1]).count();
    assert_eq!((missing, doubled, seqs.len() as u64), (0, 0, N), "each record once");
}

/// `libweir_ring.so`, built beside this test (the ring crate's cdylib).
fn ring_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    // The newer of the two: the copy beside the target dir's root is only refreshed by a
    // build that names weir-ring itself, and may be older than the code under test.
    [deps.join("libweir_ring.so"), deps.parent().unwrap().join("libweir_ring.so")]
        .into_iter()
        .filter(|p| p.exists())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| {
            panic!("libweir_ring.so not found beside {}: cargo build --release -p weir-ring", exe.display())
        })
}

/// Issue #47: a C program compiled from `weir_ring.h` alone (the example
/// `durable_publisher.c`) ends its stream with `weir_publisher_close_and_wait` while the job
/// holds its last record, so the end is not durable; the job is killed then. The C program is
/// told the job went first, connects to the restarted job, sends again from the number it
/// asks for, closes and waits again: the end is durable, and the exactly-once file sink
/// holds every record once. (With `weir_publisher_close` alone it could not know, and the
/// restarted job would wait for an end that never comes.)
#[test]
fn a_c_publisher_ends_its_stream_durably_across_a_restart() {
    use std::io::BufRead;
    const N: u64 = 5_000;
    if Command::new("cc").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "CI needs a C compiler");
        println!("SKIPPED: no cc");
        return;
    }
    let dir = EndpointDir::new("c-restart");
    let (chk, out, endpoints) = (dir.0.join("chk"), dir.0.join("out"), dir.0.join("endpoints"));
    let (path, hold) = (endpoints.join("in.0"), dir.0.join("hold"));
    let lib = ring_library();
    let ringbuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("ringbuf");
    let program = dir.0.join("durable_publisher");
    let status = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-I"])
        .arg(ringbuf.join("include"))
        .arg(ringbuf.join("examples/c/durable_publisher.c"))
        .arg(format!("-L{}", lib.parent().unwrap().display()))
        .arg("-lweir_ring")
        .arg(format!("-Wl,-rpath,{}", lib.parent().unwrap().display()))
        .arg("-o")
        .arg(&program)
        .status()
        .expect("cc runs");
    assert!(status.success(), "durable_publisher.c compiles against weir_ring.h alone");
    std::fs::write(&hold, b"").unwrap();
    let job_arg =
        format!("holdjob:{}:{}:{}:{}:{}", endpoints.display(), chk.display(), out.display(), hold.display(), N - 1);
    let mut job = spawn_child(&job_arg);
    let mut publisher = Command::new(&program)
        // Its rpath names the library found above; cargo's LD_LIBRARY_PATH would win over it.
        .env_remove("LD_LIBRARY_PATH")
        .arg(&path)
        .arg(N.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the C publisher starts");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = publisher.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("C publisher: {line}");
            let _ = lines_tx.send(line);
        }
    });
    let wait_for = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(_) => panic!("watchdog: the C publisher never said {what:?}"),
            }
        }
    };
    wait_for("closing");
    // The job holds record N - 1: the end cannot be durable. Kill it now.
    common::kill_and_clean(&mut job);
    wait_for("job gone before the end was durable");
    std::fs::remove_file(&hold).unwrap();
    let job = spawn_child(&job_arg);
    let again = wait_for("closing");
    assert!(!again.starts_with("sent 0.."), "the restarted job asks for the records after its checkpoint: {again}");
    let done = wait_for("durable after");
    assert!(done.contains("durable after 1 restarts"), "{done}");
    let status = common::wait_with_watchdog(publisher, Duration::from_secs(60)).status;
    assert!(status.success(), "the C publisher: {status:?}");
    let _ = reader.join();
    let text = child_output(job, Duration::from_secs(120));
    assert!(text.contains("restored=Some("), "the second run restored a checkpoint: {text}");
    let mut seqs = Vec::new();
    for entry in std::fs::read_dir(&out).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".inprogress"), "no in-progress part is left: {name}");
        for line in std::fs::read_to_string(out.join(&name)).unwrap().lines() {
            let seq: u64 = line.rsplit_once("seq=").and_then(|(_, s)| s.parse().ok()).expect("a record line");
            assert_eq!(line, event(seq).to_string(), "record {seq} whole");
            seqs.push(seq);
        }
    }
    seqs.sort_unstable();
    let missing = (0..N).filter(|s| seqs.binary_search(s).is_err()).count();
    let doubled = seqs.windows(2).filter(|w| w[0] == w[1]).count();
    assert_eq!((missing, doubled, seqs.len() as u64), (0, 0, N), "each record once");
}

/// Another user on the host (`nobody`, via `runuser`) cannot publish into the endpoint:
/// the attach is refused with the reason. Needs root and runuser; skipped otherwise.
#[test]
fn another_user_cannot_publish() {
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !is_root || !Path::new("/usr/sbin/runuser").exists() {
        println!("SKIPPED: needs root and runuser");
        return;
    }
    let dir = EndpointDir::new("other-user");
    let (job, _out) = job_from_ipc("ipc-other-user", dir.config(64), None);
    let running = job.start().expect("job starts");
    let path = dir.path("in", 0);
    let p = connect(&path);
    // A copy of this test binary that nobody may run.
    let bin_dir = std::env::temp_dir().join(format!("weir-ipc-bin-{}", std::process::id()));
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = bin_dir.join("ipc-test");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(&exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("second:{}", path.display()))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&bin_dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("refused=yes") && text.contains("Permission denied"), "{text}");
    p.close();
    finish(running, Duration::from_secs(60)).expect("the job is unharmed");
}

/// A job with pinning off and a checkpoint every 50 ms into `chk`.
fn checkpointed_job(name: &str, chk: &Path) -> Job {
    let job = Job::new(name);
    job.configure(|c| {
        c.pinning = false;
        c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
            interval: Duration::from_millis(50),
            timeout: Duration::from_secs(20),
            ..weir::checkpoint::CheckpointSettings::new(chk)
        });
    });
    job
}

/// Send events `from..to` (their numbers) into `path`, then wait (watchdog) until the job's
/// checkpoints hold them all and detach: the stream stays open for a restart.
fn publish_until_durable(path: &Path, to: u64) -> u64 {
    let mut p = connect(path);
    let first = p.next_seq();
    let mut idler = Idler::new(IdleStrategy::default());
    for seq in first..to {
        p.send(&encode(&event(seq)), &mut idler).expect("the job stays");
    }
    p.flush();
    let deadline = Instant::now() + Duration::from_secs(60);
    while p.durable_seq() < to {
        assert!(Instant::now() < deadline, "watchdog: {} of {to} durable after 60 s", p.durable_seq());
        std::thread::sleep(Duration::from_millis(10));
    }
    p.detach();
    first
}

/// An ipc source restored at another parallelism: at 2 from a checkpoint taken at 1,
/// endpoint 0 goes on from its number and the new endpoint 1 starts at 0; at 1 from one
/// taken at 2, the restore is refused, naming the endpoint that would be gone.
#[test]
fn an_ipc_source_restored_at_another_parallelism_keeps_each_endpoints_numbers() {
    let dir = EndpointDir::new("rescale");
    let chk = dir.0.join("chk");
    let job = |p: u32, out: Arc<Mutex<Vec<Event>>>| {
        let config = dir.config(64);
        let job = checkpointed_job("ipc-rescale", &chk);
        job.source("in", p, move |info| IpcSource::<Event>::new(config.clone(), info))
            .sink("out", 1, move |_| Collect(out.clone(), None));
        job
    };
    let stop = |mut running: weir::runtime::RunningJob| {
        running.cancel();
        let _ = finish(running, Duration::from_secs(60));
    };
    // At 1: records 0..1000 of endpoint 0, in a checkpoint.
    let first = Arc::new(Mutex::new(Vec::new()));
    let running = job(1, first.clone()).start().expect("job starts");
    assert_eq!(publish_until_durable(&dir.path("in", 0), 1_000), 0);
    stop(running);
    assert_exact(&first.lock().unwrap(), 1_000);

    // At 2: endpoint 0 asks for 1000 next, endpoint 1 is new and starts at 0.
    let second = Arc::new(Mutex::new(Vec::new()));
    let running = job(2, second.clone()).start().expect("job restores at parallelism 2");
    assert_eq!(publish_until_durable(&dir.path("in", 0), 1_500), 1_000, "endpoint 0 goes on from its number");
    assert_eq!(publish_until_durable(&dir.path("in", 1), 300), 0, "endpoint 1 starts fresh");
    stop(running);
    let mut got: Vec<u64> = second.lock().unwrap().iter().map(|e| e.seq).collect();
    got.sort_unstable();
    let mut want: Vec<u64> = (0..300).chain(1_000..1_500).collect();
    want.sort_unstable();
    assert_eq!(got, want, "each endpoint's records once");

    // At 1 again: endpoint 1 would be gone with whatever its publisher still holds.
    let third = Arc::new(Mutex::new(Vec::new()));
    let e = match job(1, third).start() {
        Err(e) => e.to_string(),
        Ok(running) => finish(running, Duration::from_secs(60)).expect_err("fewer endpoints are refused").to_string(),
    };
    assert!(e.contains("endpoint in.1 would be gone") && e.contains("parallelism 2 or more"), "{e}");
}

/// An ipc sink restored at another parallelism is refused: the records after the
/// checkpoint would reach other endpoints under numbers their subscribers may have seen.
#[test]
fn an_ipc_sink_is_not_restored_at_another_parallelism() {
    let dir = EndpointDir::new("sink-rescale");
    let chk = dir.0.join("chk");
    let job = |p: u32| {
        let config = dir.config(4096);
        let job = checkpointed_job("ipc-sink-rescale", &chk);
        job.source("gen", 1, |info| Generator::events(info, 100_000, 10).with_rate(1_000.0)).sink(
            "out",
            p,
            move |info| IpcSink::<Event>::new(config.clone(), info),
        );
        job
    };
    let mut running = job(1).start().expect("job starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while weir::checkpoint::restore::find(&chk).ok().and_then(|f| f.manifest).is_none() {
        assert!(Instant::now() < deadline, "watchdog: no checkpoint after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    running.cancel();
    let _ = finish(running, Duration::from_secs(60));
    let e = match job(2).start() {
        Err(e) => e.to_string(),
        Ok(running) => {
            finish(running, Duration::from_secs(60)).expect_err("another parallelism is refused").to_string()
        }
    };
    assert!(
        e.contains("taken with 1 sink endpoint and this run has 2") && e.contains("run the sink at parallelism 1"),
        "{e}"
    );
}

/// Read system calls (`syscr` of `/proc/self/task/<tid>/io`) made so far by this process's
/// thread named `name`.
fn reads_of_thread(name: &str) -> u64 {
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("a task").path();
        if std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim_end() == name) {
            let io = std::fs::read_to_string(dir.join("io")).expect("the thread's io counters");
            return io
                .lines()
                .find_map(|l| l.strip_prefix("syscr: "))
                .and_then(|v| v.trim().parse().ok())
                .expect("syscr in the io counters");
        }
    }
    panic!("no thread named {name}");
}

/// The source's loop reads nothing from the kernel per poll: a record at a time, each
/// waited for, costs no read system call on the subtask's thread (a status that looked
/// up the publisher under /proc on every poll once made each round trip 60 µs instead
/// of 0.4 µs). Counted, not timed.
#[test]
fn an_ipc_source_makes_no_read_system_call_per_poll() {
    const N: u64 = 2_000;
    let dir = EndpointDir::new("no-reads");
    let (job, out) = job_from_ipc("ipc-no-reads", dir.config(256), None);
    let running = job.start().expect("job starts");
    let mut publisher = connect(&dir.path("in", 0));
    // The first record opens everything the source opens once.
    let mut send_and_wait = |seq: u64| {
        let e = event(seq);
        while publisher.try_send_with(e.encoded_len(), |b| e.encode(b)).expect("the job stays") == Sent::NoCredit {
            std::thread::yield_now();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while out.lock().unwrap().len() as u64 <= seq {
            assert!(Instant::now() < deadline, "watchdog: record {seq} did not arrive");
            std::thread::yield_now();
        }
    };
    send_and_wait(0);
    let before = reads_of_thread("in#0");
    for seq in 1..N {
        send_and_wait(seq);
    }
    let reads = reads_of_thread("in#0") - before;
    println!("{reads} read system calls on the source's thread for {} records", N - 1);
    assert!(reads < N / 10, "the source's thread made {reads} read system calls for {} records, each polled", N - 1);
    publisher.close();
    finish(running, Duration::from_secs(60)).expect("job ends cleanly");
    assert_exact(&out.lock().unwrap(), N);
}
