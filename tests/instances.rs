//! Instances of one job on "several hosts" (separate processes, run and checkpoint
//! directories; one checkpoint store), sharing a Kafka topic of 6 partitions through the
//! consumer group: a keyed 1 s tumbling count + sum into Kafka, exactly once. While the job
//! runs the test scales it 1 → 3, kills an instance with SIGKILL and restarts it under the
//! same name within the session timeout (static membership: the same partitions back),
//! pauses one past the session timeout and resumes it (a zombie, fenced), and kills another
//! for good (3 → 2). The output, read with `read_committed`, holds every (key, window) of the
//! input exactly once with its exact count and sum.
//!
//! Needs Apache Kafka (`WEIR_KAFKA_BOOTSTRAP`, as `.ci/test` sets it).

mod common;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weir::record::Event;
use weir::window::WindowResult;

const PARTITIONS: i32 = 6;
const OUT_PARTITIONS: i32 = 3;
const KEYS: u64 = 24;
/// Events per phase; three phases.
const PHASE: u64 = 8_000;
/// Event time between events: 4 000 events per second of event time.
const STEP_NS: u64 = 250_000;
const WINDOW_NS: u64 = 1_000_000_000;
/// `session_timeout_ms` of the job file.
const SESSION: Duration = Duration::from_secs(6);

type Counts = BTreeMap<(u64, u64), (u64, u64)>;

fn event(seq: u64) -> Event {
    Event { key: seq % KEYS, value: seq % 100 + 1, time_ns: seq * STEP_NS, seq }
}

/// Every (key, window) of events `0..n`: count and sum.
fn expected(n: u64) -> Counts {
    let mut want = Counts::new();
    for seq in 0..n {
        let e = event(seq);
        let w = want.entry((e.key, e.time_ns / WINDOW_NS * WINDOW_NS)).or_default();
        w.0 += 1;
        w.1 += e.value;
    }
    want
}

struct Setup {
    bootstrap: String,
    topic: String,
    dir: PathBuf,
    producer: BaseProducer,
    /// The checkpoint store: a directory under `dir`, or `s3://…` with its `AWS_*` settings.
    store: String,
    store_env: Vec<(String, String)>,
    /// The job file the instances run.
    job: &'static str,
    /// Events go to partition `key % PARTITIONS` (keyed by the job's key); else every key
    /// to every partition (the job must repartition).
    keyed: bool,
}

impl Setup {
    fn new(bootstrap: &str) -> Setup {
        let topic = common::unique("weir-inst");
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
        let out = format!("{topic}-out");
        let topics = [
            NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1)),
            NewTopic::new(&out, OUT_PARTITIONS, TopicReplication::Fixed(1)),
        ];
        for r in common::kafka::block_on(admin.create_topics(&topics, &AdminOptions::new())).unwrap() {
            r.unwrap();
        }
        let producer: BaseProducer =
            ClientConfig::new().set("bootstrap.servers", bootstrap).set("enable.idempotence", "true").create().unwrap();
        let dir = std::env::temp_dir().join(&topic);
        std::fs::create_dir_all(&dir).unwrap();
        let store = dir.join("store").display().to_string();
        Setup {
            bootstrap: bootstrap.to_owned(),
            topic,
            dir,
            producer,
            store,
            store_env: Vec::new(),
            job: "tests/jobs/instances.toml",
            keyed: true,
        }
    }

    /// Events `from..to`: partition = key % PARTITIONS (keyed by the job's key), or (seq / 5)
    /// % PARTITIONS (each key in every partition; each partition in event-time order).
    fn produce(&self, from: u64, to: u64) {
        for seq in from..to {
            let e = event(seq);
            let by = if self.keyed { e.key } else { e.seq / 5 };
            self.send((by % PARTITIONS as u64) as i32, &e);
        }
        self.producer.flush(Duration::from_secs(60)).unwrap();
    }

    /// One event per partition far ahead in event time: every window before it fires.
    fn flush_windows(&self, n: u64) {
        for p in 0..PARTITIONS {
            let e = Event { key: p as u64, value: 0, time_ns: n * STEP_NS + 10 * WINDOW_NS, seq: u64::MAX };
            self.send(p, &e);
        }
        self.producer.flush(Duration::from_secs(60)).unwrap();
    }

    fn send(&self, partition: i32, e: &Event) {
        let payload = serde_json::to_vec(e).unwrap();
        let key = e.key.to_le_bytes();
        let mut record = Some(BaseRecord::to(&self.topic).key(&key[..]).payload(&payload[..]).partition(partition));
        while let Some(r) = record.take() {
            if let Err((_, r)) = self.producer.send(r) {
                self.producer.poll(Duration::from_millis(5));
                record = Some(r);
            }
        }
    }

    fn start(&self, name: &str) -> Instance {
        let log = self.dir.join(format!("{name}-{}.log", common::unique("run")));
        let child = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["run", self.job, "--instance", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("KAFKA", &self.bootstrap)
            .env("TOPIC", &self.topic)
            .env("OUT_TOPIC", format!("{}-out", self.topic))
            .env("GROUP", &self.topic)
            // The job's name gives the sinks' transactional ids: tests running at once must
            // not share them (they would fence each other, as two jobs of one name do).
            .env("JOB", &self.topic)
            .env("STORE", &self.store)
            .envs(self.store_env.iter().map(|(k, v)| (k, v)))
            .env("WEIR_DATA", &self.dir)
            .env("RUST_LOG", "weir=info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Instance { name: name.to_owned(), child, log }
    }

    /// The committed output; a (key, window) twice is an error.
    fn committed(&self) -> Result<Counts, String> {
        let mut got = Counts::new();
        let topic = format!("{}-out", self.topic);
        for payload in common::kafka::read_payloads(&self.bootstrap, &topic, OUT_PARTITIONS, "read_committed") {
            let r: WindowResult = serde_json::from_slice(&payload).unwrap();
            if got.insert((r.key, r.start_ns), (r.count, r.sum)).is_some() {
                return Err(format!("window ({}, {}) committed twice", r.key, r.start_ns));
            }
        }
        Ok(got)
    }

    /// The end of a run whose input is all produced and `last` the one instance left:
    /// every window fires, `last` commits them all (watchdog 120 s) and stops, and the
    /// output is exactly the expected windows, each once. Returns its log.
    fn finish_exact(&self, last: Instance) -> String {
        self.flush_windows(3 * PHASE);
        let want = expected(3 * PHASE);
        let got = self.wait_for_output(want.len(), Duration::from_secs(120), &[&last]);
        let log = last.log();
        last.stop();
        assert!(got == want, "every window once, exact: {}\n{log}", differences(&got, &want));
        println!("{} windows exact", got.len());
        log
    }

    /// Wait (watchdog: `limit`) until the committed output holds at least `n` windows.
    fn wait_for_output(&self, n: usize, limit: Duration, instances: &[&Instance]) -> Counts {
        let deadline = Instant::now() + limit;
        loop {
            let got = self.committed().unwrap_or_else(|e| panic!("{e}\n{}", logs(instances)));
            if got.len() >= n {
                return got;
            }
            if Instant::now() > deadline {
                let want = expected(3 * PHASE);
                let missing: Vec<(u64, u64)> = want
                    .keys()
                    .filter(|k| !got.contains_key(k))
                    .map(|(k, w)| (k % PARTITIONS as u64, w / WINDOW_NS))
                    .collect();
                panic!(
                    "watchdog: {} of {n} windows after {limit:?}; missing (partition, second): {missing:?}\n{}",
                    got.len(),
                    logs(instances)
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

struct Instance {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Instance {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The partitions of each generation this process started, in order.
    fn generations(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|l| {
                l.split_once("serves partitions ").map(|(_, r)| r.split(" (").next().unwrap_or(r).to_owned())
            })
            .collect()
    }

    /// Wait (watchdog) until this process has started `n` generations; the last one's partitions.
    fn wait_generations(&mut self, n: usize, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("instance {} ended ({status})\n{}", self.name, self.log());
            }
            let g = self.generations();
            if g.len() >= n {
                return g[n - 1].clone();
            }
            assert!(
                Instant::now() < deadline,
                "watchdog: instance {} started {} of {n} generations\n{}",
                self.name,
                g.len(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait (watchdog) until the counters file of this process's running generation says it
    /// serves `served` (`{0, 2}`), with its generation count and the group's generation.
    fn wait_for_counters(&self, served: &str, limit: Duration) {
        use weir::telemetry::counters::CounterKind;
        let deadline = Instant::now() + limit;
        let mark = format!("-{}-", self.child.id());
        loop {
            let newest = std::fs::read_dir(weir::runtime::run_root())
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(&mark))
                .map(|e| e.path().join("counters"))
                .filter(|p| p.is_file())
                .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
            let counters = newest
                .and_then(|p| weir_ring::counters::CountersReader::open(p).ok())
                .map(|r| r.snapshot())
                .unwrap_or_default();
            let of = |kind: CounterKind| counters.iter().filter(move |c| c.type_id == kind.type_id());
            let mut owned: Vec<u32> = of(CounterKind::PartitionOwned)
                .filter(|c| c.value == 1)
                .filter_map(|c| weir::telemetry::counters::partition_owner(&c.owner)?.1.parse().ok())
                .collect();
            owned.sort_unstable();
            let shown = format!("{{{}}}", owned.iter().map(u32::to_string).collect::<Vec<_>>().join(", "));
            let value = |kind| of(kind).find(|c| c.owner == self.name).map(|c| c.value);
            let partitions = of(CounterKind::PartitionOwned).count();
            if shown == served
                && partitions == PARTITIONS as usize
                && value(CounterKind::InstanceGenerations) == Some(self.generations().len() as u64)
                && value(CounterKind::GroupGeneration).is_some_and(|g| g > 0)
                && value(CounterKind::HandoverNs).is_some_and(|ns| ns > 0)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "watchdog: instance {}'s counters say {shown} of {partitions} partitions, generation {:?} (group {:?}); \
                 its log says {served}\n{}",
                self.name,
                value(CounterKind::InstanceGenerations),
                value(CounterKind::GroupGeneration),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn signal(&self, signal: &str) {
        let ok = Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill {signal} {}", self.child.id());
    }

    fn kill9(mut self) {
        common::kill_and_clean(&mut self.child);
    }

    /// SIGTERM, and wait (watchdog) for a clean stop: exit 143.
    fn stop(mut self) {
        let pid = self.child.id();
        self.signal("-TERM");
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                common::kill_and_clean(&mut self.child);
                panic!("watchdog: instance {} did not stop in 60 s\n{}", self.name, self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        common::remove_run_dirs_of(pid);
        assert_eq!(status.code(), Some(143), "instance {} stopped by SIGTERM\n{}", self.name, self.log());
    }
}

/// Wait (watchdog) until the instances' latest generations split the partitions between
/// them and stay so for a second (a cooperative rebalance may take two rounds); each one's
/// partitions.
fn settled(instances: &mut [&mut Instance], limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let latest = |instances: &mut [&mut Instance]| -> Vec<String> {
        instances.iter_mut().map(|i| i.generations().last().cloned().unwrap_or_default()).collect()
    };
    loop {
        let now = latest(instances);
        let parts: Vec<&str> =
            now.iter().flat_map(|g| g.trim_matches(['{', '}']).split(", ")).filter(|p| !p.is_empty()).collect();
        let distinct: std::collections::BTreeSet<&str> = parts.iter().copied().collect();
        if parts.len() == PARTITIONS as usize && distinct.len() == PARTITIONS as usize {
            std::thread::sleep(Duration::from_secs(1));
            if latest(instances) == now {
                return now;
            }
        }
        assert!(
            Instant::now() < deadline,
            "watchdog: no settled assignment: {now:?}\n{}",
            logs(&instances.iter().map(|i| &**i).collect::<Vec<_>>())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A test that fails leaves no instance running: killed, and its run directories removed.
impl Drop for Instance {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            common::kill_and_clean(&mut self.child);
        }
    }
}

/// How `got` differs from `want`: windows missing, extra, or with other (count, sum), as
/// (partition, second, key).
fn differences(got: &Counts, want: &Counts) -> String {
    let at = |(k, w): &(u64, u64)| (k % PARTITIONS as u64, w / WINDOW_NS, *k);
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(k)).map(at).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(k)).map(at).collect();
    let wrong: Vec<_> =
        want.iter().filter_map(|(k, v)| got.get(k).filter(|g| *g != v).map(|g| (at(k), *g, *v))).collect();
    format!("missing {missing:?}; extra {extra:?}; wrong (got, want) {wrong:?}")
}

/// The instances' logs without the line of each checkpoint.
fn logs(instances: &[&Instance]) -> String {
    let text =
        |i: &Instance| i.log().lines().filter(|l| !l.contains("checkpoint_complete")).collect::<Vec<_>>().join("\n");
    instances.iter().map(|i| format!("--- {} ---\n{}", i.name, text(i))).collect::<Vec<_>>().join("\n")
}

#[test]
fn three_instances_share_a_job_and_lose_nothing() {
    let Ok(bootstrap) = std::env::var("WEIR_KAFKA_BOOTSTRAP") else {
        println!("SKIPPED: needs Apache Kafka (tools/kafka/broker.sh start; WEIR_KAFKA_BOOTSTRAP not set)");
        return;
    };
    let s = Setup::new(&bootstrap);
    let _clean = common::RemoveOnDrop(s.dir.clone());
    let limit = Duration::from_secs(90);

    // One instance: every partition.
    s.produce(0, PHASE);
    let mut a = s.start("a");
    assert_eq!(a.wait_generations(1, limit), "{0, 1, 2, 3, 4, 5}", "{}", a.log());
    s.wait_for_output(1, limit, &[&a]);

    // 1 -> 3: partitions move to b and c with their state.
    let mut b = s.start("b");
    let mut c = s.start("c");
    b.wait_generations(1, limit);
    c.wait_generations(1, limit);
    s.produce(PHASE, 2 * PHASE);
    let before = s.wait_for_output(KEYS as usize * 2, limit, &[&a, &b, &c]);
    println!("{} windows committed after the scale-out", before.len());

    // kill -9 c and start it again at once under the same name: static membership gives it
    // its partitions back, with no rebalance.
    let now = settled(&mut [&mut a, &mut b, &mut c], limit);
    // Seen from outside (weir-stat, Prometheus): each instance's counters say which
    // partitions it serves, its generations and the group's.
    for (i, served) in [&a, &b, &c].into_iter().zip(&now) {
        i.wait_for_counters(served, limit);
    }
    let served = now[2].clone();
    c.kill9();
    c = s.start("c");
    assert_eq!(c.wait_generations(1, limit), served, "c got its partitions back\n{}", c.log());

    // b paused past the session timeout: its partitions move to a and c; resumed, it is a
    // zombie whose late checkpoints fail and whose producers are fenced.
    b.signal("-STOP");
    s.produce(2 * PHASE, 3 * PHASE);
    std::thread::sleep(SESSION + Duration::from_secs(4));
    let revoked = b.log().matches("revoked: handing them over").count();
    b.signal("-CONT");
    // Resumed, it learns it lost its partitions (and stops serving them).
    let deadline = Instant::now() + limit;
    while b.log().matches("revoked: handing them over").count() == revoked {
        assert!(
            Instant::now() < deadline,
            "watchdog: the resumed zombie never heard it lost its partitions\n{}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // 3 -> 2 for good: a dies; its partitions go to b and c.
    let (b_gens, c_gens) = (b.generations().len(), c.generations().len());
    a.kill9();
    s.flush_windows(3 * PHASE);
    let want = expected(3 * PHASE);
    let got = s.wait_for_output(want.len(), Duration::from_secs(120), &[&b, &c]);
    let (bl, cl) = (b.log(), c.log());
    b.stop();
    c.stop();
    assert_eq!(got.len(), want.len(), "windows\n{bl}\n{cl}");
    for (k, v) in &want {
        assert_eq!(got.get(k), Some(v), "window {k:?}\n{bl}\n{cl}");
    }
    // a's partitions were restored from what a published: state moved between processes.
    let moved_from_a = |log: &str, after: usize| {
        log.lines().filter(|l| l.contains("serves partitions")).skip(after).any(|l| l.contains("\"a\""))
    };
    assert!(
        moved_from_a(&bl, b_gens) || moved_from_a(&cl, c_gens),
        "a's partitions moved with their state\n{bl}\n{cl}"
    );
    for l in bl.lines().chain(cl.lines()).filter(|l| l.contains("serves partitions")) {
        println!("{}", l.split_once(" INFO ").map_or(l, |(_, r)| r).split(" event=").next().unwrap_or(l));
    }
    println!("{} windows exact", got.len());
}

/// Input not keyed the job's way (every key in every partition) through a repartition
/// topic: two instances, one killed with SIGKILL mid-run and its partitions taken over by
/// the other (their state, the repartition topic's offsets and the writers' watermarks
/// restored from the store). Every (key, window) exactly once, exact.
#[test]
fn key_by_across_instances_through_a_repartition_topic() {
    let Ok(bootstrap) = std::env::var("WEIR_KAFKA_BOOTSTRAP") else {
        println!("SKIPPED: needs Apache Kafka (tools/kafka/broker.sh start; WEIR_KAFKA_BOOTSTRAP not set)");
        return;
    };
    let s = Setup { job: "tests/jobs/instances-repartition.toml", keyed: false, ..Setup::new(&bootstrap) };
    let _clean = common::RemoveOnDrop(s.dir.clone());
    let limit = Duration::from_secs(90);

    let mut a = s.start("a");
    a.wait_generations(1, limit);
    let mut b = s.start("b");
    b.wait_generations(1, limit);
    s.produce(0, PHASE);
    let now = settled(&mut [&mut a, &mut b], limit);
    println!("a serves {}, b serves {}", now[0], now[1]);
    assert!(now.iter().all(|p| p != "{}"), "both serve partitions: {now:?}");
    s.wait_for_output(KEYS as usize, limit, &[&a, &b]);

    // b dies mid-run: its partitions, of the input and of the repartition topic, go to a.
    s.produce(PHASE, 2 * PHASE);
    let gens = a.generations().len();
    b.kill9();
    assert_eq!(a.wait_generations(gens + 1, limit), "{0, 1, 2, 3, 4, 5}", "a took over\n{}", a.log());
    s.produce(2 * PHASE, 3 * PHASE);
    s.finish_exact(a);
}

/// A second job that names the first job's consumer group is refused before it joins (exit
/// 78, naming the group and the job it belongs to): it takes none of the first job's
/// partitions, and the first job's output stays exact.
#[test]
fn a_second_job_naming_a_jobs_group_is_refused() {
    let Ok(bootstrap) = std::env::var("WEIR_KAFKA_BOOTSTRAP") else {
        println!("SKIPPED: needs Apache Kafka (tools/kafka/broker.sh start; WEIR_KAFKA_BOOTSTRAP not set)");
        return;
    };
    let s = Setup::new(&bootstrap);
    let _clean = common::RemoveOnDrop(s.dir.clone());
    let limit = Duration::from_secs(90);
    s.produce(0, PHASE);
    let mut a = s.start("a");
    assert_eq!(a.wait_generations(1, limit), "{0, 1, 2, 3, 4, 5}", "{}", a.log());
    s.wait_for_output(1, limit, &[&a]);
    // Another job (its own name, output and store) whose [job] group is the first one's.
    let other = format!("{}-other", s.topic);
    let intruder = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["run", s.job, "--instance", "x"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("KAFKA", &s.bootstrap)
        .env("TOPIC", &s.topic)
        .env("OUT_TOPIC", format!("{other}-out"))
        .env("GROUP", &s.topic)
        .env("JOB", &other)
        .env("STORE", s.dir.join("other-store"))
        .env("WEIR_DATA", s.dir.join("other"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::wait_with_watchdog(intruder, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "the second job is refused\n{err}");
    for w in [format!("consumer group {}", s.topic), "belongs to another job".into(), format!("job {}", s.topic)] {
        assert!(err.contains(&w), "the refusal does not say `{w}`:\n{err}");
    }
    // The first job kept every partition.
    assert_eq!(a.generations().len(), 1, "the first job rebalanced\n{}", a.log());
    s.produce(PHASE, 3 * PHASE);
    s.finish_exact(a);
}

/// Run `weir run <file> --instance <name>` to its end (watchdog 60 s): exit code and stderr.
fn refused(file: &std::path::Path, name: &str) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weir"));
    cmd.args(["run", file.to_str().unwrap(), "--instance", name]).stdout(Stdio::null()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let out = common::wait_with_watchdog(child, Duration::from_secs(60));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Careless settings are refused before anything runs, exit 78, saying what to set: no
/// store, a bad instance name, two instances on one checkpoint directory. (No broker
/// needed: each is found before Kafka is asked.)
#[test]
fn careless_instance_settings_are_refused() {
    let dir = std::env::temp_dir().join(common::unique("weir-inst-bad"));
    std::fs::create_dir_all(&dir).unwrap();
    let _clean = common::RemoveOnDrop(dir.clone());
    let job = |store: &str| {
        format!(
            "[job]\nname = \"bad\"\ncheckpoint_dir = \"{d}/chk\"\n{store}\n\
             [[source]]\nid = \"in\"\ntype = \"kafka\"\nbootstrap = \"127.0.0.1:1\"\ntopic = \"t\"\n\
             properties = {{ \"socket.connection.setup.timeout.ms\" = 1000 }}\n\
             [[sink]]\nid = \"out\"\ntype = \"null\"\ninput = \"in\"\n",
            d = dir.display()
        )
    };
    let no_store = dir.join("no-store.toml");
    std::fs::write(&no_store, job("")).unwrap();
    let (code, err) = refused(&no_store, "a");
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("set checkpoint_store in [job]"), "{err}");

    let with_store = dir.join("store.toml");
    std::fs::write(&with_store, job(&format!("checkpoint_store = \"{}/store\"", dir.display()))).unwrap();
    let (code, err) = refused(&with_store, "a/b");
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("instance name `a/b`"), "{err}");

    // The source's own group (its offset commits, for lag tools) is the instances' group.
    let same_group = dir.join("same-group.toml");
    let text = job(&format!("checkpoint_store = \"{}/store\"\ngroup = \"g\"", dir.display()))
        .replace("properties = { ", "properties = { \"group.id\" = \"g\", ");
    std::fs::write(&same_group, text).unwrap();
    let (code, err) = refused(&same_group, "a");
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("which is the group the instances form"), "{err}");

    // The first instance holds its checkpoint directory while it waits for Kafka (none
    // there); a second on the same directory is refused.
    let mut first = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["run", with_store.to_str().unwrap(), "--instance", "a"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lock = dir.join("chk").join("instance.lock");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "watchdog: the first instance never locked {}", lock.display());
        if let Ok(f) = std::fs::File::open(&lock)
            && f.try_lock().is_err()
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, err) = refused(&with_store, "b");
    common::kill_and_clean(&mut first);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("another instance runs on") && err.contains("WEIR_INSTANCE"), "{err}");
}

/// The store on S3 (s3proxy, a real S3 server on loopback, started by `.ci/test`), and down
/// for a while: two instances run; the server stops (checkpoints fail with the store's error,
/// no sink commits, nothing is lost) and comes back; then one instance is killed and its
/// partitions move to the other through S3. The output holds every window once.
#[cfg(feature = "s3")]
#[test]
fn an_s3_store_that_goes_down_loses_nothing() {
    let (Ok(bootstrap), Ok(endpoint)) = (std::env::var("WEIR_KAFKA_BOOTSTRAP"), std::env::var("WEIR_S3_ENDPOINT"))
    else {
        println!("SKIPPED: needs Apache Kafka and s3proxy (.ci/test: WEIR_KAFKA_BOOTSTRAP, WEIR_S3_ENDPOINT)");
        return;
    };
    let s3proxy = |what: &str| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/s3/s3proxy.sh");
        let ok = Command::new(script).arg(what).stdout(Stdio::null()).status().unwrap().success();
        assert!(ok, "tools/s3/s3proxy.sh {what}");
    };
    let mut s = Setup::new(&bootstrap);
    let _clean = common::RemoveOnDrop(s.dir.clone());
    s.store = format!("s3://weir/{}", s.topic);
    s.store_env = [
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "weir"),
        ("AWS_SECRET_ACCESS_KEY", "weir-secret"),
        ("AWS_REGION", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let limit = Duration::from_secs(90);
    s.produce(0, PHASE);
    let mut a = s.start("a");
    let mut b = s.start("b");
    settled(&mut [&mut a, &mut b], limit);
    s.wait_for_output(1, limit, &[&a, &b]);
    // b has published its partitions' state (a checkpoint completes only once it is in the
    // store): it is what a restores them from later.
    let deadline = Instant::now() + limit;
    while !b.log().rsplit("serves partitions").next().unwrap_or("").contains("event=\"checkpoint_complete\"") {
        assert!(Instant::now() < deadline, "watchdog: b never completed a checkpoint\n{}", b.log());
        std::thread::sleep(Duration::from_millis(100));
    }

    // The store down: a's checkpoints fail, saying why (or, if a generation starts meanwhile,
    // its claim does).
    let store_errors = |log: &str| log.matches("checkpoint store s3://").count();
    let before = store_errors(&a.log());
    s3proxy("stop");
    s.produce(PHASE, 2 * PHASE);
    let deadline = Instant::now() + limit;
    while store_errors(&a.log()) == before {
        assert!(Instant::now() < deadline, "watchdog: no checkpoint failed with the store down\n{}", a.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    s3proxy("restart");

    // Through S3 again: b's partitions move to a.
    let before = a.generations().len();
    b.kill9();
    s.produce(2 * PHASE, 3 * PHASE);
    let log = s.finish_exact(a);
    let moved = log.lines().filter(|l| l.contains("serves partitions")).skip(before).any(|l| l.contains("\"b\""));
    assert!(moved, "b's partitions moved to a through S3\n{log}");
}
