//! `weir-bench instances`: the job of `tests/jobs/instances.toml` (Kafka → key_by → 1 s
//! tumbling count + sum → Kafka, exactly once) run by 1, 2 and 3 instances — separate `weir`
//! processes sharing one checkpoint store — on one topic of 6 partitions in Apache Kafka.
//!
//! - **Throughput**: the instances are started on an empty topic and left to settle their
//!   assignment; then N events are produced and the clock runs until the output topic
//!   (`read_committed`) holds every window. Records per second, and records per CPU-second
//!   of the instance processes (their user + system time from /proc over the interval).
//! - **Repartitioned**: the same at 1 and 2 instances with input not keyed by the job's key
//!   and the key_by through a repartition topic (`tests/jobs/instances-repartition.toml`).
//! - **A kill**: two instances, events produced at a steady pace; one is killed with
//!   SIGKILL; the time from the kill to the first committed result of one of its partitions
//!   (the session timeout, a rebalance, the restore from the store, the first window),
//!   and the bytes the survivor fetched for the partitions it took over.
//!
//! Needs `WEIR_KAFKA_BOOTSTRAP` (Apache Kafka: `tools/kafka/broker.sh start`) and the `weir`
//! binary beside this one (`cargo build --release`).

use crate::report::{Row, Section, fmt_rate};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weir::record::Event;

const PARTITIONS: i32 = 6;
const OUT_PARTITIONS: i32 = 3;
const KEYS: u64 = 600;
/// Event time between events (N events span N × STEP of event time).
const STEP_NS: u64 = 10_000;
const WINDOW_NS: u64 = 1_000_000_000;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn event(seq: u64) -> Event {
    Event { key: seq % KEYS, value: seq % 100 + 1, time_ns: seq * STEP_NS, seq }
}

/// Windows of events `0..n` (key, window start).
fn windows(n: u64) -> usize {
    (0..n).map(|s| (s % KEYS, s * STEP_NS / WINDOW_NS)).collect::<BTreeSet<_>>().len()
}

struct Run {
    bootstrap: String,
    topic: String,
    dir: PathBuf,
    weir: PathBuf,
    producer: BaseProducer,
    /// The job: keyed input (`tests/jobs/instances.toml`), or input with every key in every
    /// partition through a repartition topic (`tests/jobs/instances-repartition.toml`).
    repartition: bool,
}

struct Instance {
    child: Child,
    log: PathBuf,
}

impl Instance {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The partitions of its latest generation.
    fn serves(&self) -> Option<BTreeSet<u32>> {
        let log = self.log();
        let line = log.lines().rev().find(|l| l.contains("serves partitions {"))?;
        let set = line.split_once("serves partitions {")?.1.split('}').next()?;
        Some(set.split(", ").filter_map(|p| p.trim().parse().ok()).collect())
    }

    /// User + system CPU seconds so far (/proc/<pid>/stat, fields 14 and 15).
    fn cpu_s(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        let Some(i) = stat.rfind(')') else { return 0.0 };
        let f: Vec<&str> = stat[i + 2..].split_whitespace().collect();
        let ticks = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        ticks / 100.0
    }

    fn stop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.wait();
    }
}

/// Remove what a killed process left in the run and state roots (`<job>-<pid>-<n>`).
fn remove_run_dirs_of(pid: u32) {
    let mark = format!("-{pid}-");
    for e in std::fs::read_dir(weir::runtime::run_root()).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().contains(&mark) {
            let _ = std::fs::remove_dir_all(e.path());
            let _ = std::fs::remove_dir_all(weir::runtime::state_root().join(e.file_name()));
        }
    }
}

/// An instance left running (an error path) is killed, and what it left removed.
impl Drop for Instance {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        remove_run_dirs_of(self.child.id());
    }
}

impl Run {
    fn new(bootstrap: &str, weir: &Path, name: &str, repartition: bool) -> Run {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
        let topic = format!("weir-bench-inst-{name}-{}-{t}", std::process::id());
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
        let out = format!("{topic}-out");
        let topics = [
            NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1)),
            NewTopic::new(&out, OUT_PARTITIONS, TopicReplication::Fixed(1)),
        ];
        for r in block_on(admin.create_topics(&topics, &AdminOptions::new())).expect("create topics") {
            r.expect("topic created");
        }
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "20")
            .set("compression.type", "lz4")
            .create()
            .expect("producer");
        let dir = std::env::temp_dir().join(&topic);
        std::fs::create_dir_all(&dir).expect("bench dir");
        Run { bootstrap: bootstrap.into(), topic, dir, weir: weir.into(), producer, repartition }
    }

    fn start(&self, name: &str) -> Instance {
        let log = self.dir.join(format!("{name}-{}.log", Instant::now().elapsed().as_nanos()));
        let child = Command::new(&self.weir)
            .args(["run", self.job(), "--instance", name])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .env("KAFKA", &self.bootstrap)
            .env("TOPIC", &self.topic)
            .env("OUT_TOPIC", format!("{}-out", self.topic))
            .env("GROUP", &self.topic)
            .env("JOB", &self.topic)
            .env("STORE", self.dir.join("store"))
            .env("WEIR_DATA", &self.dir)
            .env("RUST_LOG", "weir=info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start weir");
        Instance { child, log }
    }

    fn job(&self) -> &'static str {
        if self.repartition { "tests/jobs/instances-repartition.toml" } else { "tests/jobs/instances.toml" }
    }

    /// Wait until the instances' latest generations cover every partition once.
    fn settled(&self, instances: &[&Instance], limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let sets: Vec<BTreeSet<u32>> = instances.iter().filter_map(|i| i.serves()).collect();
            let all: BTreeSet<u32> = sets.iter().flatten().copied().collect();
            if sets.len() == instances.len()
                && all.len() == PARTITIONS as usize
                && sets.iter().map(BTreeSet::len).sum::<usize>() == PARTITIONS as usize
            {
                // Give the group a moment to be sure no rebalance follows.
                std::thread::sleep(Duration::from_secs(2));
                let again: Vec<BTreeSet<u32>> = instances.iter().filter_map(|i| i.serves()).collect();
                if again == sets {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    /// Keyed by the job's key, or (repartition) runs of 5 events per partition in turn.
    fn send(&self, e: &Event) {
        let by = if self.repartition { e.seq / 5 } else { e.key };
        self.send_to((by % PARTITIONS as u64) as i32, e);
    }

    fn send_to(&self, partition: i32, e: &Event) {
        let payload = serde_json::to_vec(e).expect("json");
        let key = e.key.to_le_bytes();
        let mut record = Some(BaseRecord::to(&self.topic).key(&key[..]).payload(&payload[..]).partition(partition));
        while let Some(r) = record.take() {
            if let Err((_, r)) = self.producer.send(r) {
                self.producer.poll(Duration::from_millis(1));
                record = Some(r);
            }
        }
    }

    /// Events `from..to`, then one per partition far ahead (every window before fires).
    fn produce(&self, from: u64, to: u64, flush: bool) {
        for seq in from..to {
            self.send(&event(seq));
            if seq % 1024 == 0 {
                self.producer.poll(Duration::ZERO);
            }
        }
        if flush {
            for p in 0..PARTITIONS {
                let ahead = Event { key: p as u64, value: 0, time_ns: to * STEP_NS + 10 * WINDOW_NS, seq: u64::MAX };
                self.send_to(p, &ahead);
            }
        }
        self.producer.flush(Duration::from_secs(60)).expect("flush");
    }

    /// A read_committed reader of the output from the start.
    fn reader(&self) -> BaseConsumer {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", "weir-bench-reader")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("reader");
        let mut tpl = TopicPartitionList::new();
        for p in 0..OUT_PARTITIONS {
            tpl.add_partition_offset(&format!("{}-out", self.topic), p, Offset::Beginning).expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        consumer
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One throughput run at `k` instances: (records/s, records per CPU-s, wall s, cpu s).
fn throughput(
    bootstrap: &str,
    weir: &Path,
    k: usize,
    n: u64,
    repartition: bool,
) -> Result<(f64, f64, f64, f64), String> {
    let run = Run::new(bootstrap, weir, &format!("k{k}{}", if repartition { "r" } else { "" }), repartition);
    let names = ["a", "b", "c"];
    let instances: Vec<Instance> = names[..k].iter().map(|name| run.start(name)).collect();
    let refs: Vec<&Instance> = instances.iter().collect();
    let result = (|| {
        if !run.settled(&refs, Duration::from_secs(120)) {
            return Err(format!("the {k} instances did not settle on an assignment in 120 s"));
        }
        let reader = run.reader();
        let want = windows(n);
        let cpu0: f64 = instances.iter().map(Instance::cpu_s).sum();
        let started = Instant::now();
        run.produce(0, n, true);
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(600);
        while got < want {
            if Instant::now() > deadline {
                return Err(format!("{got} of {want} windows after 600 s"));
            }
            if let Some(Ok(m)) = reader.poll(Duration::from_millis(100))
                && m.payload().is_some()
            {
                got += 1;
            }
        }
        let wall = started.elapsed().as_secs_f64();
        let cpu: f64 = instances.iter().map(Instance::cpu_s).sum::<f64>() - cpu0;
        Ok((n as f64 / wall, n as f64 / cpu.max(1e-9), wall, cpu))
    })();
    for mut i in instances {
        i.stop();
    }
    result
}

/// Two instances, a steady stream, one killed: (seconds from the kill to the first result of
/// one of its partitions, bytes the survivor fetched for them, partitions moved).
fn kill(bootstrap: &str, weir: &Path) -> Result<(f64, u64, usize), String> {
    let run = Run::new(bootstrap, weir, "kill", false);
    let a = run.start("a");
    let b = run.start("b");
    // (`b` is killed below; dropped, it is reaped and its run directory removed.)
    let result = (|| {
        if !run.settled(&[&a, &b], Duration::from_secs(120)) {
            return Err("the 2 instances did not settle on an assignment in 120 s".into());
        }
        let moving = b.serves().ok_or("b serves nothing")?;
        let reader = run.reader();
        // 20 000 events per second of wall time, 100 000 per second of event time: a window
        // of every key fires about every 5 s.
        let mut seq = 0u64;
        let pace = |secs: f64, seq: &mut u64| {
            let until = Instant::now() + Duration::from_secs_f64(secs);
            while Instant::now() < until {
                run.produce(*seq, *seq + 2_000, false);
                *seq += 2_000;
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        pace(8.0, &mut seq);
        let b_pid = b.child.id();
        let _ = Command::new("kill").args(["-KILL", &b_pid.to_string()]).status();
        let killed = Instant::now();
        let mut first = None;
        while first.is_none() && killed.elapsed() < Duration::from_secs(120) {
            run.produce(seq, seq + 2_000, false);
            seq += 2_000;
            let until = Instant::now() + Duration::from_millis(100);
            while Instant::now() < until {
                if let Some(Ok(m)) = reader.poll(Duration::from_millis(10))
                    && killed.elapsed() > Duration::from_millis(500)
                    && let Some(p) = m.payload()
                    && let Ok(r) = serde_json::from_slice::<weir::window::WindowResult>(p)
                    && moving.contains(&((r.key % PARTITIONS as u64) as u32))
                {
                    first = Some(killed.elapsed().as_secs_f64());
                    break;
                }
            }
        }
        let first = first.ok_or("no result of b's partitions in 120 s after the kill")?;
        let log = a.log();
        let moved: u64 = log
            .lines()
            .rev()
            .filter(|l| l.contains("event=\"handover\""))
            .find_map(|l| l.split("moved_bytes=").nth(1)?.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        Ok((first, moved, moving.len()))
    })();
    let (mut a, _b) = (a, b);
    a.stop();
    result
}

/// The section.
pub fn section(smoke: bool) -> Section {
    let mut s =
        Section::new("instances", "Instances: one job on 1, 2 and 3 weir processes (Apache Kafka, 6 partitions)");
    let Ok(bootstrap) = std::env::var("WEIR_KAFKA_BOOTSTRAP") else {
        s.rows.push(Row::not_run("instances", "set WEIR_KAFKA_BOOTSTRAP (tools/kafka/broker.sh start)"));
        return s;
    };
    let weir = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.join("weir"))).filter(|p| p.is_file());
    let Some(weir) = weir else {
        s.rows.push(Row::not_run("instances", "the weir binary is not beside weir-bench: cargo build --release first"));
        return s;
    };
    let n: u64 = if smoke { 20_000 } else { 1_000_000 };
    let counts: &[usize] = if smoke { &[1] } else { &[1, 2, 3] };
    let mut details = BTreeMap::new();
    let mut one = None;
    // Then the input keyed otherwise, the key_by through a repartition topic.
    let through: &[usize] = if smoke { &[1] } else { &[1, 2] };
    let runs = counts.iter().map(|&k| (k, false)).chain(through.iter().map(|&k| (k, true)));
    for (k, repartition) in runs {
        let how = if repartition { ", key_by through a repartition topic" } else { "" };
        match throughput(&bootstrap, &weir, k, n, repartition) {
            Ok((per_s, per_cpu, wall, cpu)) => {
                let base = *one.get_or_insert(per_s);
                s.rows.push(
                    Row::new(format!("{k} instance(s){how}: records per second"), per_s / 1e6, "M/s")
                        .vs(format!("1 instance, keyed input {}", fmt_rate(base)), base / 1e6),
                );
                s.rows.push(Row::new(format!("{k} instance(s){how}: records per CPU-second"), per_cpu / 1e6, "M/s"));
                details.insert(
                    format!("k{k}{}", if repartition { "-repartition" } else { "" }),
                    json!({"per_s": per_s, "per_cpu_s": per_cpu, "wall_s": wall, "cpu_s": cpu}),
                );
            }
            Err(e) => s.rows.push(Row::not_run(format!("{k} instance(s){how}"), e)),
        }
    }
    if !smoke {
        match kill(&bootstrap, &weir) {
            Ok((first, moved, partitions)) => {
                s.rows.push(
                    Row::new("kill -9 of one of 2: to the first result of its partitions", first, "s")
                        .note("session.timeout.ms = 6 s of it"),
                );
                s.rows.push(Row::new(
                    format!("bytes fetched from the store for its {partitions} partitions"),
                    moved as f64 / 1024.0,
                    "KiB",
                ));
                details.insert(
                    "kill".into(),
                    json!({"first_result_s": first, "moved_bytes": moved, "partitions": partitions}),
                );
            }
            Err(e) => s.rows.push(Row::not_run("kill -9 of one of 2", e)),
        }
    }
    s.details = json!({"events": n, "partitions": PARTITIONS, "keys": KEYS, "runs": details,
        "cores": std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1)});
    s.markdown = format!(
        "{n} events (JSON, {KEYS} keys) into a topic of {PARTITIONS} partitions after the instances settled; the clock \
         stops when every window is committed. Keyed input (a key in one partition), then input with every key in \
         every partition, the key_by through a repartition topic (each event written and read once more, exactly \
         once). All instances share this machine's {} cores, so more instances add \
         no cores: the figures say what the handover machinery and the per-instance fixed costs (a consumer, \
         dormant subtasks, checkpoints published per instance) cost, not how it scales on real hosts.\n",
        std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1)
    );
    s
}
