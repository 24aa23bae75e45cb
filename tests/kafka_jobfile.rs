//! Kafka in job files: tests/jobs/kafka-events.toml runs against librdkafka's mock cluster
//! (a bounded replay of JSON events), and its sums come back from the output topic exact;
//! a malformed record reaches the dead-letter file. Bad Kafka settings are refused with the
//! line and field.

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use weir::graph::jobfile;

const EVENTS: u64 = 3_000;
const KEYS: u64 = 17;

#[test]
fn kafka_job_file_sums_exactly() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("events", 3, 1).unwrap();
    cluster.create_topic("sums", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
    for seq in 0..EVENTS {
        let (key, value) = (seq % KEYS, seq % 10 + 1);
        *expected.entry(key).or_default() += value;
        let json = format!("{{\"key\":{key},\"value\":{value},\"time_ns\":{seq},\"seq\":{seq}}}");
        producer.send(BaseRecord::<(), _>::to("events").payload(&json).partition((seq % 3) as i32)).unwrap();
    }
    producer.send(BaseRecord::<(), _>::to("events").payload("not json").partition(0)).unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();

    let data = std::env::temp_dir().join(format!("weir-kafka-jobfile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jobs/kafka-events.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let vars: BTreeMap<&str, String> =
        [("KAFKA", bootstrap.clone()), ("BOUNDED", "true".into()), ("WEIR_DATA", data.display().to_string())]
            .into_iter()
            .collect();
    let text = jobfile::interpolate(&path, &text, &|name| vars.get(name).cloned()).unwrap();
    let loaded = jobfile::parse(&path, &text).unwrap();
    loaded.job.configure(|c| c.pinning = false);
    let summary = loaded.job.run().unwrap();
    assert!(
        summary.budget.parts.iter().any(|(what, _)| what.contains("kafka source events prefetch")),
        "{}",
        summary.budget
    );
    assert_eq!(summary.node("events").unwrap().records_out, EVENTS, "every good record in");
    let bad = std::fs::read_to_string(data.join("bad-events.jsonl")).unwrap();
    assert!(bad.contains("not json") && bad.contains("\"partition\":0"), "{bad}");

    // Read the sums back: the final sum of every key.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "check")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&["sums"]).unwrap();
    let mut got: BTreeMap<u64, u64> = BTreeMap::new();
    let t = Instant::now();
    while got.len() < KEYS as usize && t.elapsed() < Duration::from_secs(60) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
            got.insert(v["key"].as_u64().unwrap(), v["value"].as_u64().unwrap());
        }
    }
    assert_eq!(got, expected);
    std::fs::remove_dir_all(&data).unwrap();
}

/// A Kafka setting on another node type, or a bad value, names its line and field.
#[test]
fn kafka_settings_errors_name_line_and_field() {
    let head = "[job]\nname = \"k\"\n[[source]]\nid = \"g\"\ntype = \"generator\"\n";
    let cases = [
        (format!("{head}topic = \"x\"\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"g\"\n"), 6, "source[0].topic"),
        (
            "[[source]]\nid = \"k\"\ntype = \"kafka\"\ntopic = \"t\"\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"k\"\n".into(),
            3,
            "source[0].bootstrap",
        ),
        (
            "[[source]]\nid = \"k\"\ntype = \"kafka\"\nbootstrap = \"h:1\"\ntopic = \"t\"\nstart = \"yesterday\"\n[[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"k\"\n".into(),
            6,
            "source[0].start",
        ),
        (
            format!("{head}[[sink]]\nid = \"o\"\ntype = \"kafka\"\nbootstrap = \"h:1\"\ntopic = \"t\"\ndelivery = \"exactly_once\"\ninput = \"g\"\n"),
            11,
            "sink[0].delivery",
        ),
    ];
    for (text, line, field) in cases {
        let e = jobfile::parse(Path::new("j.toml"), &text).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
    }
}

/// Per-partition consumer lag reaches the counters file (what `weir-stat` shows): one
/// counter per partition, `events[p]`, down to 0 once the source has read everything.
#[test]
fn lag_per_partition_is_in_the_counters_file() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("events", 3, 1).unwrap();
    cluster.create_topic("sums", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    for seq in 0..300u64 {
        let json = format!("{{\"key\":{},\"value\":1,\"time_ns\":{seq},\"seq\":{seq}}}", seq % 5);
        producer.send(BaseRecord::<(), _>::to("events").payload(&json).partition((seq % 3) as i32)).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let data = std::env::temp_dir().join(format!("weir-kafka-lag-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jobs/kafka-events.toml");
    let vars: BTreeMap<&str, String> =
        [("KAFKA", bootstrap.clone()), ("WEIR_DATA", data.display().to_string())].into_iter().collect();
    let text =
        jobfile::interpolate(&path, &std::fs::read_to_string(&path).unwrap(), &|n| vars.get(n).cloned()).unwrap();
    let loaded = jobfile::parse(&path, &text).unwrap();
    loaded.job.configure(|c| c.pinning = false);
    let mut running = loaded.job.start().unwrap();
    let reader = weir::ring::counters::CountersReader::open(running.counters_path()).unwrap();
    let t = Instant::now();
    let lags = loop {
        let snap = reader.snapshot();
        let lags = weir_tools::stat::StatView::between(&snap, &snap, 1.0).lags;
        if lags.len() == 3 && lags.iter().all(|(_, l)| *l == 0) {
            break lags;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "lag counters: {lags:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let names: Vec<&str> = lags.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["events[0]", "events[1]", "events[2]"]);
    running.cancel();
    let _ = running.wait();
    let _ = std::fs::remove_dir_all(&data);
}

/// `weir run` on a job whose Kafka does not answer exits 69 (EX_UNAVAILABLE) and says what
/// to check.
#[test]
fn run_with_unreachable_kafka_exits_69() {
    let data = std::env::temp_dir().join(format!("weir-kafka-69-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["run", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/jobs/kafka-events.toml")])
        .env("KAFKA", "127.0.0.1:1")
        .env("WEIR_DATA", &data)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("cannot read the topic's metadata") && err.contains("reachable"), "{err}");
    let _ = std::fs::remove_dir_all(&data);
}

/// A key_by through a repartition topic (on the mock cluster: the topic made beforehand, no
/// checkpoints, so at least once — nothing fails here): 2 generator subtasks write, 3
/// window subtasks read one partition each, their watermarks from the writers' markers; the
/// job ends when both writers marked their end. Its window results are those of the same job
/// with the key_by inside the process, and none was late.
#[test]
fn a_key_by_through_a_repartition_topic_gives_the_same_windows() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("rk-by_key-repartition", 3, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let job = |repartition: bool| {
        let through = if repartition {
            format!("repartition = true\nbootstrap = \"{bootstrap}\"\nparallelism = 3\n")
        } else {
            String::new()
        };
        format!(
            "[job]\nname = \"rk\"\npinning = false\n\
             [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 60000\nkeys = 50\njitter_us = 500\n\
             parallelism = 2\ntimestamp = \"time_ns\"\nmax_out_of_orderness_ms = 1\n\
             [[operator]]\nid = \"by_key\"\ntype = \"key_by\"\nfield = \"key\"\ninput = \"gen\"\n{through}\
             [[operator]]\nid = \"w\"\ntype = \"window\"\ninput = \"by_key\"\nwindow = \"tumbling\"\nsize_ms = 10\n\
             aggregate = [\"count\", \"sum\"]\nparallelism = 3\n\
             [[sink]]\nid = \"out\"\ntype = \"count\"\ninput = \"w\"\n"
        )
    };
    let run = |repartition: bool| {
        let loaded = jobfile::parse(Path::new("rk.toml"), &job(repartition)).unwrap();
        // Watchdog: a reader that never hears its writers end would run for ever.
        let summary = ended_within(loaded.job.start().unwrap(), Duration::from_secs(120)).unwrap();
        assert_eq!(summary.node("w").unwrap().late_records, 0, "no late record");
        let t = &loaded.tallies[0].1;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        (load(&t.count), load(&t.seq_sum), load(&t.value_sum), summary.node("w").unwrap().records_in)
    };
    let local = run(false);
    let through = run(true);
    println!("window results, Σ: in the process {local:?}, through the repartition topic {through:?}");
    assert_eq!(local.3, 60_000, "every event reached the windows");
    assert_eq!(through, local, "the same windows, the same counts");
}

/// Wait until the job ends or fails; a watchdog cancels it and panics after `limit`.
fn ended_within(
    mut running: weir::runtime::RunningJob,
    limit: Duration,
) -> Result<weir::runtime::JobSummary, weir::runtime::JobError> {
    let t = Instant::now();
    while !running.is_finished() && !running.has_failed() {
        if t.elapsed() > limit {
            running.cancel();
            panic!("watchdog: the job neither failed nor ended within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    running.wait()
}

/// A repartition topic that exists with another partition count is refused, saying what to
/// do: a key would reach a subtask that does not own it. And `bootstrap` on a key_by
/// without `repartition = true` is refused at parse, with its line.
#[test]
fn a_repartition_topic_of_the_wrong_size_is_refused() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("rw-by_key-repartition", 2, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let text = format!(
        "[job]\nname = \"rw\"\npinning = false\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1000\nkeys = 5\n\
         [[operator]]\nid = \"by_key\"\ntype = \"key_by\"\nfield = \"key\"\ninput = \"gen\"\n\
         repartition = true\nbootstrap = \"{bootstrap}\"\nparallelism = 3\n\
         [[sink]]\nid = \"out\"\ntype = \"null\"\ninput = \"by_key\"\n"
    );
    let loaded = jobfile::parse(Path::new("rw.toml"), &text).unwrap();
    let running = loaded.job.start().unwrap();
    let e = ended_within(running, Duration::from_secs(60)).expect_err("the wrong size is refused").to_string();
    println!("{e}");
    assert!(e.contains("has 2 partitions and this job needs 3") && e.contains("delete it"), "{e}");

    let stray = "[[source]]\nid = \"g\"\ntype = \"generator\"\n\
                 [[operator]]\nid = \"k\"\ntype = \"key_by\"\nfield = \"key\"\ninput = \"g\"\nbootstrap = \"h:1\"\n\
                 [[sink]]\nid = \"o\"\ntype = \"null\"\ninput = \"k\"\n";
    let e = jobfile::parse(Path::new("j.toml"), stray).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (9, "operator[0].bootstrap"), "{e}");
    assert!(e.to_string().contains("repartition = true"), "{e}");
}

/// More source subtasks than partitions: the subtask with none says so and holds no
/// watermark back, so event-time windows fire while the job runs (they waited for the end of
/// input, or for ever on an endless topic).
#[test]
fn a_source_subtask_without_a_partition_holds_no_window_back() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("one", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    // 100 ms of event time: 10 windows of 10 ms; the last stays open.
    for seq in 0..1_000u64 {
        let json = format!("{{\"key\":{},\"value\":1,\"time_ns\":{},\"seq\":{seq}}}", seq % 5, seq * 100_000);
        producer.send(BaseRecord::<(), _>::to("one").payload(&json).partition(0)).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let text = format!(
        "[job]\nname = \"one\"\npinning = false\n\
         [[source]]\nid = \"in\"\ntype = \"kafka\"\nbootstrap = \"{bootstrap}\"\ntopic = \"one\"\nparallelism = 2\n\
         timestamp = \"time_ns\"\nmax_out_of_orderness_ms = 0\n\
         [[operator]]\nid = \"k\"\ntype = \"key_by\"\nfield = \"key\"\ninput = \"in\"\n\
         [[operator]]\nid = \"w\"\ntype = \"window\"\ninput = \"k\"\nwindow = \"tumbling\"\nsize_ms = 10\n\
         aggregate = [\"count\"]\n\
         [[sink]]\nid = \"out\"\ntype = \"count\"\ninput = \"w\"\n"
    );
    let loaded = jobfile::parse(Path::new("one.toml"), &text).unwrap();
    let mut running = loaded.job.start().unwrap();
    let reader = weir_ring::counters::CountersReader::open(running.counters_path()).unwrap();
    let records_in = weir::telemetry::counters::CounterKind::RecordsIn.type_id();
    let fired = || -> u64 {
        let all = reader.snapshot();
        all.iter().filter(|c| c.type_id == records_in && c.owner.starts_with("out#")).map(|c| c.value).sum()
    };
    let t = Instant::now();
    // 9 windows of 5 keys close (the sink's counters say what reached it).
    while fired() < 45 && t.elapsed() < Duration::from_secs(60) && !running.has_failed() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let got = fired();
    running.cancel();
    let _ = running.wait();
    assert_eq!(got, 45, "the 9 closed windows of every key fired while the job ran (watchdog 60 s)");
}
