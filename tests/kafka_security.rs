//! Kafka over TLS and SASL, against Apache Kafka's SASL_SSL listener (`tools/kafka/broker.sh`:
//! a CA and a broker certificate made at start, user `weir` for SCRAM-SHA-256/512, PLAIN and
//! OAUTHBEARER's unsecured JWT mode):
//!
//! - a source and an exactly-once sink over SASL_SSL with SCRAM-SHA-512, read back exact;
//! - every mechanism reaches the broker;
//! - every way of failing to connect ends `weir run` with a message naming the cause and the
//!   exit code for it (69: could not reach or authenticate; 78: a bad setting), never a silent
//!   retry loop, and never with a secret in its output (nor in `weir validate`'s).
//!
//! Needs the broker of `.ci/test` (`WEIR_KAFKA_SASL_SSL`, `WEIR_KAFKA_CA`); skipped without.

mod common;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::kafka::{Delivery, Json, JsonEncode, KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use weir::operators::{Sink, SubtaskInfo};
use weir::record::Event;

use common::{RemoveOnDrop, unique};

/// The user every mechanism of the test broker knows.
const USER: &str = "weir";
const PASSWORD: &str = "weir-secret";

/// The SASL_SSL listener and the CA that signed its certificate, or `None` (the test says why
/// it skips).
struct Secure {
    sasl_ssl: String,
    plaintext: String,
    ca: String,
}

fn secure() -> Option<Secure> {
    match (std::env::var("WEIR_KAFKA_SASL_SSL"), std::env::var("WEIR_KAFKA_CA"), std::env::var("WEIR_KAFKA_BOOTSTRAP"))
    {
        (Ok(sasl_ssl), Ok(ca), Ok(plaintext)) => Some(Secure { sasl_ssl, plaintext, ca }),
        _ => {
            println!(
                "SKIPPED: needs the SASL_SSL listener of tools/kafka/broker.sh (WEIR_KAFKA_SASL_SSL, WEIR_KAFKA_CA)"
            );
            None
        }
    }
}

impl Secure {
    /// The client properties for `mechanism` on the SASL_SSL listener.
    fn properties(&self, mechanism: &str) -> Vec<(&'static str, String)> {
        let mut p = vec![
            ("security.protocol", "SASL_SSL".to_owned()),
            ("sasl.mechanism", mechanism.to_owned()),
            ("ssl.ca.location", self.ca.clone()),
        ];
        if mechanism == "OAUTHBEARER" {
            // librdkafka's unsecured JWT (tests only), which the broker's default validator takes.
            p.push(("enable.sasl.oauthbearer.unsecure.jwt", "true".into()));
            p.push(("sasl.oauthbearer.config", format!("principal={USER}")));
        } else {
            p.push(("sasl.username", USER.into()));
            p.push(("sasl.password", PASSWORD.into()));
        }
        p
    }

    fn client(&self, mechanism: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.sasl_ssl);
        for (k, v) in self.properties(mechanism) {
            c.set(k, v);
        }
        c
    }
}

/// Every seq in `topic` (partitions 0..`partitions`), read over SASL_SSL with `mechanism`.
fn read_seqs(s: &Secure, mechanism: &str, topic: &str, partitions: i32) -> Vec<u64> {
    let consumer: BaseConsumer = s
        .client(mechanism)
        .set("group.id", unique("weir-test-reader"))
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let (mut seqs, mut ended) = (Vec::new(), BTreeSet::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while ended.len() < partitions as usize {
        assert!(Instant::now() < deadline, "watchdog: reading {topic} back took over 60 s");
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
                seqs.push(v["seq"].as_u64().unwrap());
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic} back: {e}"),
            None => {}
        }
    }
    seqs.sort_unstable();
    seqs
}

/// `n` JSON events into `topic`'s `partitions`, over SASL_SSL with `mechanism`.
fn produce(s: &Secure, mechanism: &str, topic: &str, partitions: i32, n: u64) {
    let producer: BaseProducer = s.client(mechanism).create().expect("producer");
    for seq in 0..n {
        let json = format!("{{\"key\":{},\"value\":1,\"time_ns\":{seq},\"seq\":{seq}}}", seq % 7);
        let mut record = BaseRecord::<(), _>::to(topic).payload(&json).partition((seq % partitions as u64) as i32);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush over SASL_SSL");
}

fn create_topic(s: &Secure, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<_> = s.client("SCRAM-SHA-512").create().expect("admin client");
    let topics = [NewTopic::new(topic, partitions, TopicReplication::Fixed(1))];
    let results = common::kafka::block_on(admin.create_topics(&topics, &AdminOptions::new())).expect("create");
    for r in results {
        r.expect("the topic is created");
    }
}

/// Kafka source (2 subtasks) → exactly-once Kafka sink, both over SASL_SSL with SCRAM-SHA-512,
/// checkpoints every 100 ms: the output, read back `read_committed` (over PLAIN), holds every
/// record once.
#[test]
fn sasl_ssl_source_and_exactly_once_sink_are_exact() {
    let Some(s) = secure() else { return };
    const N: u64 = 5_000;
    let (input, output) = (unique("weir-sasl-in"), unique("weir-sasl-out"));
    create_topic(&s, &input, 2);
    create_topic(&s, &output, 1);
    produce(&s, "SCRAM-SHA-256", &input, 2, N);

    let dir = std::env::temp_dir().join(unique("weir-sasl-job"));
    let mut source = KafkaSourceConfig { bounded: true, ..KafkaSourceConfig::new(&s.sasl_ssl, &input) };
    let mut sink = KafkaSinkConfig {
        delivery: Delivery::ExactlyOnce,
        transactional_id_prefix: output.clone(),
        checkpoint_timeout: Duration::from_secs(30),
        transaction_log_dir: Some(dir.join("txn")),
        ..KafkaSinkConfig::new(&s.sasl_ssl, &output)
    };
    for (k, v) in s.properties("SCRAM-SHA-512") {
        source.properties.insert(k.into(), v.clone());
        sink.properties.insert(k.into(), v);
    }
    let job = Job::new("kafka-sasl-ssl");
    job.configure(|c| {
        c.pinning = false;
        c.checkpoints = Some(CheckpointSettings {
            interval: Duration::from_millis(100),
            timeout: Duration::from_secs(30),
            ..CheckpointSettings::new(dir.join("chk"))
        });
    });
    job.source("in", 2, move |info| KafkaSource::new(source.clone(), info, Json::<Event>::default())).rebalance().sink(
        "out",
        1,
        move |info| KafkaSink::new(sink.clone(), info, JsonEncode::<Event>::default()),
    );
    let running = job.start().expect("job starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not end in 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let summary = running.wait().expect("the job runs over SASL_SSL");
    println!("{summary}");
    let seqs = read_seqs(&s, "PLAIN", &output, 1);
    assert_eq!(seqs, (0..N).collect::<Vec<_>>(), "every record exactly once");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// PLAIN, SCRAM-SHA-256 and OAUTHBEARER (unsecured JWT): a sink writes through each, and a
/// reader with the same mechanism reads it back.
#[test]
fn every_sasl_mechanism_reaches_the_broker() {
    let Some(s) = secure() else { return };
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "OAUTHBEARER"] {
        let topic = unique(&format!("weir-sasl-{}", mechanism.to_ascii_lowercase()));
        create_topic(&s, &topic, 1);
        let mut config = KafkaSinkConfig::new(&s.sasl_ssl, &topic);
        for (k, v) in s.properties(mechanism) {
            config.properties.insert(k.into(), v);
        }
        let info = SubtaskInfo {
            job: "test".into(),
            node: "out".into(),
            index: 0,
            parallelism: 1,
            max_key_groups: 128,
            owned: None,
        };
        let mut sink = KafkaSink::new(config, &info, JsonEncode::<Event>::default());
        sink.restore(None).unwrap();
        for seq in 0..20 {
            sink.write(&Event { key: 1, value: 1, time_ns: seq, seq }).unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        }
        sink.finish().unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        assert_eq!(read_seqs(&s, mechanism, &topic, 1), (0..20).collect::<Vec<_>>(), "{mechanism}");
    }
}

/// A job file reading `bootstrap` with `properties` (TOML inline-table entries) into a count.
fn job_file(dir: &Path, name: &str, bootstrap: &str, properties: &[(&str, &str)]) -> PathBuf {
    let props: Vec<String> = properties.iter().map(|(k, v)| format!("\"{k}\" = \"{v}\"")).collect();
    let text = format!(
        "[job]\nname = \"{name}\"\n\n[[source]]\nid = \"in\"\ntype = \"kafka\"\nbootstrap = \"{bootstrap}\"\n\
         topic = \"weir-security-{name}\"\nbounded = true\nproperties = {{ {} }}\n\n\
         [[sink]]\nid = \"out\"\ntype = \"count\"\ninput = \"in\"\n",
        props.join(", ")
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `weir <args>`: exit code, and stdout + stderr; killed after 60 s (a watchdog: every case
/// must end by itself well before).
fn weir(args: &[&str]) -> (i32, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .env("RUST_LOG", "weir=info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stdout, stderr) =
        common::wait_draining_pipes(child, Duration::from_secs(60), &format!("weir {args:?}"));
    let text = format!("{stdout}{stderr}");
    (status.code().unwrap_or(-1), text)
}

/// One way of failing to connect: the job file's bootstrap and properties, the exit code and
/// the words its message must hold.
struct Case {
    name: &'static str,
    bootstrap: String,
    properties: Vec<(&'static str, String)>,
    exit: i32,
    words: &'static [&'static str],
}

/// Each way of failing to connect, through `weir run` on a job file: the exit code, words of
/// the message, and no secret anywhere in the output. The cases run at once (each is a
/// process that waits on the network).
#[test]
fn connection_failures_end_the_run_naming_the_cause() {
    let Some(s) = secure() else { return };
    const WRONG: &str = "not-the-password-7f3a";
    let dir = std::env::temp_dir().join(unique("weir-security-jobs"));
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = RemoveOnDrop(dir.clone());
    let localhost = s.sasl_ssl.replace("127.0.0.1", "localhost");
    let scram = |password: &'static str| -> Vec<(&'static str, String)> {
        vec![
            ("security.protocol", "SASL_SSL".into()),
            ("sasl.mechanism", "SCRAM-SHA-512".into()),
            ("sasl.username", USER.into()),
            ("sasl.password", password.into()),
            ("ssl.ca.location", s.ca.clone()),
        ]
    };
    let without = |props: Vec<(&'static str, String)>, key: &str| -> Vec<(&'static str, String)> {
        props.into_iter().filter(|(k, _)| *k != key).collect()
    };
    let with = |mut props: Vec<(&'static str, String)>, key: &'static str, value: &str| {
        props.retain(|(k, _)| *k != key);
        props.push((key, value.to_owned()));
        props
    };
    let case = |name, bootstrap: &str, properties, exit, words| Case {
        name,
        bootstrap: bootstrap.to_owned(),
        properties,
        exit,
        words,
    };
    let cases = vec![
        case("wrong-password", &s.sasl_ssl, scram(WRONG), 69, &["SASL authentication failed", "sasl.password"]),
        case(
            "unknown-mechanism",
            &s.sasl_ssl,
            with(scram(PASSWORD), "sasl.mechanism", "SCRAM-SHA-1024"),
            78,
            &["SCRAM-SHA-1024"],
        ),
        case(
            "untrusted-certificate",
            &s.sasl_ssl,
            without(scram(PASSWORD), "ssl.ca.location"),
            69,
            &["not trusted", "ssl.ca.location"],
        ),
        case("hostname-mismatch", &localhost, scram(PASSWORD), 69, &["does not name the host", "localhost"]),
        case(
            "tls-to-plaintext-port",
            &s.plaintext,
            with(without(scram(PASSWORD), "sasl.mechanism"), "security.protocol", "SSL"),
            69,
            &["does not speak TLS", "security.protocol"],
        ),
        case(
            "plaintext-to-tls-port",
            &s.sasl_ssl,
            vec![("security.protocol", "PLAINTEXT".into())],
            69,
            &["security.protocol", "SSL"],
        ),
    ];
    let results: Vec<(i32, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|c| {
                let props: Vec<(&str, &str)> = c.properties.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let path = job_file(&dir, c.name, &c.bootstrap, &props);
                scope.spawn(move || weir(&["run", path.to_str().unwrap()]))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((code, text), c) in results.iter().zip(&cases) {
        let name = c.name;
        println!("== {name}: exit {code}\n{text}");
        assert_eq!(*code, c.exit, "{name}: exit code\n{text}");
        for w in c.words {
            assert!(text.contains(w), "{name}: the message does not say `{w}`:\n{text}");
        }
        for secret in [WRONG, PASSWORD] {
            assert!(!text.contains(secret), "{name}: a password in the output:\n{text}");
        }
    }
    // `weir validate` shows the plan, never the properties' secrets.
    let props = scram(PASSWORD);
    let props: Vec<(&str, &str)> = props.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let path = job_file(&dir, "validate", &s.sasl_ssl, &props);
    let (code, text) = weir(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains(PASSWORD), "a password in weir validate's output:\n{text}");
}

/// `java -cp <Kafka's jars> <class> <args>`: Kafka's own command-line tools, as `kafka-acls.sh`
/// runs them. Panics with the output when the tool fails, or after 90 s (a watchdog).
///
/// `-XX:-UsePerfData`: without it the JVM writes /tmp/hsperfdata_<user>, whatever its
/// `java.io.tmpdir`, and leaves the directory behind; the temp dir is one of this call's own.
fn kafka_tool(class: &str, args: &[&str]) {
    let lib = std::env::var("WEIR_KAFKA_LIB").expect("WEIR_KAFKA_LIB (tools/kafka/broker.sh)");
    let tmp = std::env::temp_dir().join(unique("weir-kafka-tool"));
    std::fs::create_dir_all(&tmp).unwrap();
    let _tmp = RemoveOnDrop(tmp.clone());
    let child = Command::new("java")
        .args(["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-Xshare:auto", "-Xmx256m"])
        .arg(format!("-Djava.io.tmpdir={}", tmp.display()))
        .args(["-cp", &format!("{lib}/*"), class])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("java runs");
    let (status, stdout, stderr) =
        common::wait_draining_pipes(child, Duration::from_secs(90), &format!("{class} {args:?}"));
    assert!(status.success(), "{class} {args:?}: {status}\n{stdout}{stderr}");
}

/// A user who may read the topic but not use the consumer group the job names (an ACL on the
/// group for another user only): `weir run` exits 69 (a dependency refused us), naming the
/// group, GROUP_AUTHORIZATION_FAILED and the `kafka-acls.sh` line that grants it — a bounded
/// job at its final offset commit, an unbounded one at its first checkpoint's commit — never
/// a job that waits for ever for a coordinator the broker will not grant. A SIGTERM meanwhile
/// stops it (143) or it has already refused (69): it never hangs.
#[test]
fn a_group_without_an_acl_is_refused_naming_the_acl() {
    let Some(s) = secure() else { return };
    if std::env::var("WEIR_KAFKA_LIB").is_err() {
        println!("SKIPPED: needs Kafka's tools (WEIR_KAFKA_LIB)");
        return;
    }
    let dir = std::env::temp_dir().join(unique("weir-acl-jobs"));
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = RemoveOnDrop(dir.clone());
    let group = unique("weir-acl-group");
    // An ACL for someone else makes the group closed to `weir`.
    kafka_tool(
        "org.apache.kafka.tools.AclCommand",
        &[
            "--bootstrap-server",
            &s.plaintext,
            "--add",
            "--allow-principal",
            "User:someone-else",
            "--operation",
            "Read",
            "--group",
            &group,
        ],
    );
    let scram: Vec<(&str, String)> = vec![
        ("security.protocol", "SASL_SSL".into()),
        ("sasl.mechanism", "SCRAM-SHA-512".into()),
        ("sasl.username", USER.into()),
        ("sasl.password", PASSWORD.into()),
        ("ssl.ca.location", s.ca.clone()),
        ("group.id", group.clone()),
    ];
    let props: Vec<(&str, &str)> = scram.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for (name, checkpoints) in [("acl-bounded", false), ("acl-checkpointed", true)] {
        let topic = format!("weir-security-{name}");
        create_topic(&s, &topic, 1);
        produce(&s, "SCRAM-SHA-512", &topic, 1, 100);
        let path = job_file(&dir, name, &s.sasl_ssl, &props);
        if checkpoints {
            // Unbounded, with checkpoints: the first completed one commits its offsets.
            let text = std::fs::read_to_string(&path).unwrap().replace("bounded = true", "bounded = false").replace(
                "[job]\n",
                &format!("[job]\ncheckpoint_dir = \"{}\"\ncheckpoint_interval_ms = 200\n", dir.join(name).display()),
            );
            std::fs::write(&path, text).unwrap();
        }
        let (code, text) = weir(&["run", path.to_str().unwrap()]);
        println!("== {name}: exit {code}\n{text}");
        assert_eq!(code, 69, "{name}: a refused group is a refused dependency\n{text}");
        for w in
            ["GROUP_AUTHORIZATION_FAILED", &group, "kafka-acls.sh", "--operation Read", &format!("--group {group}")]
        {
            assert!(text.contains(w), "{name}: the message does not say `{w}`:\n{text}");
        }
        assert!(!text.contains(PASSWORD), "{name}: a password in the output:\n{text}");
    }
    // A SIGTERM while such a job runs ends it, one way or the other, and fast.
    let path = job_file(&dir, "acl-bounded", &s.sasl_ssl, &props);
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["run", path.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain system call on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "watchdog: the job did not end after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(matches!(status.code(), Some(69 | 143)), "ended by the refusal or the signal: {status:?}");
}
