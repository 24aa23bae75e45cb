//! Every compression codec both ways, with Apache Kafka's own tools on the other side, and the
//! lag Kafka's own tools see:
//!
//! - records written by Kafka's console producer with `compression.type` gzip, snappy, lz4
//!   and zstd are read exactly by a weir source (a zstd topic used to hang a job for ever,
//!   silently: librdkafka was built without zstd);
//! - weir's sink with each codec writes batches the broker stores with that codec
//!   (`DumpLogSegments`) and Kafka's console consumer reads back exactly;
//! - after a checkpoint, `kafka-consumer-groups --describe` shows the source's group at the
//!   checkpointed offsets (lag 0 at the end of a bounded run).
//!
//! Needs the broker of `.ci/test` and its jars (`WEIR_KAFKA_BOOTSTRAP`, `WEIR_KAFKA_LIB`,
//! `WEIR_KAFKA_DATA`); skipped without.

mod common;

use common::{RemoveOnDrop, unique};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::kafka::{Json, JsonEncode, KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use weir::operators::builtin::{CountingSink, Tally};
use weir::operators::{Sink, SubtaskInfo};
use weir::record::Event;

const CODECS: [&str; 4] = ["gzip", "snappy", "lz4", "zstd"];
const N: u64 = 2_000;

struct Broker {
    bootstrap: String,
    lib: String,
    data: String,
}

fn broker() -> Option<Broker> {
    match (std::env::var("WEIR_KAFKA_BOOTSTRAP"), std::env::var("WEIR_KAFKA_LIB"), std::env::var("WEIR_KAFKA_DATA")) {
        (Ok(bootstrap), Ok(lib), Ok(data)) => Some(Broker { bootstrap, lib, data }),
        _ => {
            println!(
                "SKIPPED: needs the broker of tools/kafka/broker.sh and its jars (WEIR_KAFKA_LIB, WEIR_KAFKA_DATA)"
            );
            None
        }
    }
}

fn event_json(seq: u64) -> String {
    format!("{{\"key\":{},\"value\":1,\"time_ns\":{seq},\"seq\":{seq}}}", seq % 7)
}

impl Broker {
    /// One of Kafka's command-line tools (`class`), with `input` on its stdin; its stdout, and
    /// whether it succeeded. Killed after 90 s (a watchdog).
    fn tool(&self, class: &str, args: &[&str], input: &str) -> (bool, String) {
        // The codecs' native libraries (lz4-java, snappy-java) are unpacked into the JVM's
        // temp dir: one of this call's own, removed after, so nothing is left in /tmp.
        let tmp = std::env::temp_dir().join(unique("weir-kafka-tool"));
        std::fs::create_dir_all(&tmp).unwrap();
        let _tmp = RemoveOnDrop(tmp.clone());
        let mut child = Command::new("java")
            .args(["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-Xshare:auto", "-Xmx256m"])
            .arg(format!("-Djava.io.tmpdir={}", tmp.display()))
            .arg("-Dlog4j2.level=ERROR")
            .arg("-cp")
            .arg(format!("{}/*", self.lib))
            .arg(class)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("java runs (Kafka's tools)");
        let mut stdin = child.stdin.take().unwrap();
        // A tool that exits early (an error) closes its stdin: what it says is below.
        let _ = stdin.write_all(input.as_bytes());
        drop(stdin);
        let (status, stdout, stderr) =
            common::wait_draining_pipes(child, Duration::from_secs(90), &format!("{class} {args:?}"));
        if !status.success() {
            println!("{class} {args:?}: {status}\n{stderr}");
        }
        (status.success(), stdout)
    }

    /// The codecs of the record batches the broker stored for partition 0 of `topic`.
    fn stored_codecs(&self, topic: &str) -> Vec<String> {
        let file = format!("{}/{topic}-0/00000000000000000000.log", self.data);
        let (ok, out) = self.tool("org.apache.kafka.tools.DumpLogSegments", &["--files", &file], "");
        assert!(ok, "DumpLogSegments on {file}");
        let mut codecs: Vec<String> = out
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "compresscodec:")
            .map(|w| w[1].to_ascii_lowercase())
            .collect();
        codecs.dedup();
        codecs
    }
}

/// Count and seq checksum of `topic` read by a bounded weir source (2 subtasks).
fn read_with_weir(bootstrap: &str, topic: &str) -> (u64, u64) {
    let tally = Arc::new(Tally::default());
    let config = KafkaSourceConfig { bounded: true, ..KafkaSourceConfig::new(bootstrap, topic) };
    let job = Job::new(&format!("codec-{topic}"));
    job.configure(|c| c.pinning = false);
    let t = tally.clone();
    job.source("in", 2, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default())).rebalance().sink(
        "count",
        1,
        move |_| CountingSink::new(t.clone()),
    );
    let running = job.start().expect("job starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: reading {topic} did not end in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    running.wait().unwrap_or_else(|e| panic!("reading {topic}: {e}"));
    let (count, sum, _) = tally.totals();
    (count, sum)
}

/// Kafka's console producer writes N records with each codec (four producers at once); a
/// weir source reads each topic exactly, and the broker stored each with its codec.
#[test]
fn every_codec_kafka_writes_is_read_exactly() {
    let Some(b) = broker() else { return };
    let input: String = (0..N).map(|s| event_json(s) + "\n").collect();
    let topics: Vec<(&str, String)> = CODECS.iter().map(|c| (*c, unique(&format!("weir-codec-in-{c}")))).collect();
    std::thread::scope(|scope| {
        for (codec, topic) in &topics {
            let (b, input) = (&b, &input);
            scope.spawn(move || {
                // The console producer's own option: it overrides compression.type.
                let args = ["--bootstrap-server", &b.bootstrap, "--topic", topic, "--compression-codec", codec];
                let (ok, _) = b.tool("org.apache.kafka.tools.ConsoleProducer", &args, input);
                assert!(ok, "the console producer ({codec})");
            });
        }
    });
    let (_, expected_sum, _) = Tally::expected(N);
    for (codec, topic) in &topics {
        assert_eq!(b.stored_codecs(topic), vec![codec.to_string()], "the broker stored {codec} batches");
        assert_eq!(read_with_weir(&b.bootstrap, topic), (N, expected_sum), "{codec}: every record once");
    }
}

/// weir's sink with `compression.type` = each codec: the broker stores that codec, and
/// Kafka's console consumer reads every record back.
#[test]
fn weir_writes_every_codec_for_kafkas_consumer() {
    let Some(b) = broker() else { return };
    let topics: Vec<(&str, String)> = CODECS.iter().map(|c| (*c, unique(&format!("weir-codec-out-{c}")))).collect();
    for (codec, topic) in &topics {
        let config = KafkaSinkConfig::new(&b.bootstrap, topic).set("compression.type", codec);
        let info = SubtaskInfo {
            job: "t".into(),
            node: "out".into(),
            index: 0,
            parallelism: 1,
            max_key_groups: 128,
            owned: None,
        };
        let mut sink = KafkaSink::new(config, &info, JsonEncode::<Event>::default());
        sink.restore(None).unwrap();
        for seq in 0..N {
            sink.write(&Event { key: seq % 7, value: 1, time_ns: seq, seq }).unwrap();
        }
        sink.finish().unwrap_or_else(|e| panic!("{codec}: {e}"));
        assert_eq!(b.stored_codecs(topic), vec![codec.to_string()], "the broker stored {codec} batches");
    }
    let outputs: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = topics
            .iter()
            .map(|(_, topic)| {
                let b = &b;
                scope.spawn(move || {
                    let max = N.to_string();
                    let args = [
                        "--bootstrap-server",
                        &b.bootstrap,
                        "--topic",
                        topic,
                        "--from-beginning",
                        "--max-messages",
                        &max,
                        "--timeout-ms",
                        "30000",
                    ];
                    b.tool("org.apache.kafka.tools.consumer.ConsoleConsumer", &args, "").1
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((codec, _), out) in topics.iter().zip(outputs) {
        // The records, one JSON object a line (the JVM may print a notice of its own).
        let mut seqs: Vec<u64> = out
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"].as_u64().unwrap())
            .collect();
        if seqs.len() != N as usize {
            println!("{codec}: Kafka's console consumer printed:\n{out}");
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (0..N).collect::<Vec<_>>(), "{codec}: Kafka's consumer reads every record once");
    }
}

/// A bounded source with checkpoints commits each completed checkpoint's offsets to its
/// group: Kafka's `kafka-consumer-groups --describe` shows them, lag 0 at the end.
#[test]
fn kafkas_consumer_groups_tool_sees_the_checkpointed_offsets() {
    let Some(b) = broker() else { return };
    let topic = unique("weir-group-lag");
    let group = unique("weir-group");
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &b.bootstrap).create().unwrap();
    {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<_> = ClientConfig::new().set("bootstrap.servers", &b.bootstrap).create().unwrap();
        let topics = [NewTopic::new(&topic, 2, TopicReplication::Fixed(1))];
        let results = common::kafka::block_on(admin.create_topics(&topics, &AdminOptions::new()));
        results.unwrap().into_iter().for_each(|r| {
            r.unwrap();
        });
    }
    for seq in 0..N {
        let json = event_json(seq);
        producer.send(BaseRecord::<(), _>::to(&topic).payload(&json).partition((seq % 2) as i32)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    let dir = std::env::temp_dir().join(unique("weir-group-job"));
    // Removed however the test ends (a failed assertion left it in /tmp before).
    let _dir = RemoveOnDrop(dir.clone());
    let config =
        KafkaSourceConfig { bounded: true, ..KafkaSourceConfig::new(&b.bootstrap, &topic) }.set("group.id", &group);
    let tally = Arc::new(Tally::default());
    let job = Job::new("group-lag");
    job.configure(|c| {
        c.pinning = false;
        c.checkpoints = Some(CheckpointSettings {
            interval: Duration::from_millis(100),
            ..CheckpointSettings::new(dir.join("chk"))
        });
    });
    let t = tally.clone();
    job.source("in", 1, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default())).sink(
        "count",
        1,
        move |_| CountingSink::new(t.clone()),
    );
    let running = job.start().expect("job starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not end in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    running.wait().unwrap();
    assert_eq!(tally.totals().0, N);

    let (ok, out) = b.tool(
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        &["--bootstrap-server", &b.bootstrap, "--describe", "--group", &group],
        "",
    );
    println!("{out}");
    assert!(ok, "kafka-consumer-groups --describe");
    // GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
    let rows: BTreeMap<i32, (String, String, String)> = out
        .lines()
        .filter(|l| l.contains(&topic))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[2].parse().unwrap(), (f[3].to_owned(), f[4].to_owned(), f[5].to_owned()))
        })
        .collect();
    assert_eq!(rows.len(), 2, "both partitions described:\n{out}");
    for (p, (current, end, lag)) in &rows {
        assert_eq!(current, end, "partition {p}: the committed offset is the end:\n{out}");
        assert_eq!(lag, "0", "partition {p}:\n{out}");
        assert_eq!(end.parse::<u64>().unwrap(), N / 2, "partition {p}");
    }
}
