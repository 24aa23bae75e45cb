//! Avro and Protobuf in the Confluent wire format, with a schema registry: the encoders and
//! decoders against a stand-in registry (Confluent's API, `weir_tools::registry`), and job
//! files reading Avro from librdkafka's mock cluster and writing Protobuf back, exact, a
//! record of an unknown schema id dead-lettered with the id, a registry that does not answer
//! ending `weir run` with exit 69. And Confluent's own client (its Python serializers, in
//! CI) reads what weir writes and writes what weir reads.

mod common;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir::io::kafka::{Decode, Encode, FormatError};
use weir::io::registry::{AvroDecode, AvroEncode, ProtobufDecode, ProtobufEncode, Registry, RegistryConfig};
use weir::record::Event;
use weir_tools::registry::StandInRegistry;

const EVENT_AVSC: &str = r#"{"type":"record","name":"Event","namespace":"weir","fields":[
  {"name":"key","type":"long"},{"name":"value","type":"long"},
  {"name":"time_ns","type":"long"},{"name":"seq","type":"long"}]}"#;

/// The fields in another order, one more (with a default), and nested in a file whose first
/// message is another: the decoder must follow the indexes and the names.
const EVENT_PROTO: &str = include_str!("../tools/interop/event.proto");

fn registry(url: &str) -> Arc<Registry> {
    let mut config = RegistryConfig::new(url);
    config.retry_for = Duration::from_millis(300);
    Arc::new(Registry::new(config).unwrap())
}

fn event(seq: u64) -> Event {
    Event { key: seq % 7, value: seq * 3, time_ns: 1_700_000_000_000_000_000 + seq, seq }
}

fn bad(e: FormatError) -> String {
    match e {
        FormatError::Bad(why) => why,
        other => panic!("expected a bad record, got {other:?}"),
    }
}

/// Avro: what the encoder writes the decoder reads back exact; the registry is asked once per
/// schema id and subject, not per record; schema evolution by name; bad frames are bad records
/// that say why (the id among it).
#[test]
fn avro_round_trips_through_the_registry() {
    let stand_in = StandInRegistry::start(None).unwrap();
    let reg = registry(stand_in.url());
    let mut encode = AvroEncode::<Event>::new(reg.clone(), "events-value", EVENT_AVSC, true).unwrap();
    let mut decode = AvroDecode::<Event>::new(reg.clone());
    let mut payload = Vec::new();
    for seq in 0..1000 {
        payload.clear();
        encode.encode(&event(seq), &mut payload).unwrap();
        assert_eq!(payload[0], 0, "magic byte");
        assert_eq!(*decode.decode(Some(&payload)).unwrap(), event(seq));
    }
    let counts = stand_in.counts();
    assert_eq!(counts.registrations.load(Ordering::Relaxed), 1, "registered once");
    assert_eq!(counts.by_id.load(Ordering::Relaxed), 1, "fetched once");
    let id = u32::from_be_bytes(payload[1..5].try_into().unwrap());

    // Another producer's newer schema: fields reordered, one added with a default. Registered
    // under BACKWARD (the default) and read by name; the extra field is ignored.
    let newer = r#"{"type":"record","name":"Event","namespace":"weir","fields":[
      {"name":"seq","type":"long"},{"name":"key","type":"long"},{"name":"value","type":"long"},
      {"name":"time_ns","type":"long"},{"name":"note","type":"string","default":""}]}"#;
    let mut other = AvroEncode::<serde_json::Value>::new(reg.clone(), "events-value", newer, true).unwrap();
    payload.clear();
    let record = serde_json::json!({"seq": 5, "key": 1, "value": 2, "time_ns": 3, "note": "hi"});
    other.encode(&record, &mut payload).unwrap();
    assert_ne!(u32::from_be_bytes(payload[1..5].try_into().unwrap()), id, "a new id");
    assert_eq!(*decode.decode(Some(&payload)).unwrap(), Event { key: 1, value: 2, time_ns: 3, seq: 5 });

    // An incompatible schema (a field without a default the old data lacks) is refused by the
    // registry: the sink's error says so.
    let incompatible = r#"{"type":"record","name":"Event","fields":[{"name":"missing","type":"long"}]}"#;
    let mut refused = AvroEncode::<Event>::new(reg.clone(), "events-value", incompatible, true).unwrap();
    let e = bad(refused.encode(&event(1), &mut Vec::new()).unwrap_err());
    assert!(e.contains("incompatible") && e.contains("error 409"), "{e}");
    // Not registered and not to be: a lookup that fails names the subject.
    let mut lookup = AvroEncode::<Event>::new(reg.clone(), "unknown-value", EVENT_AVSC, false).unwrap();
    let e = bad(lookup.encode(&event(1), &mut Vec::new()).unwrap_err());
    assert!(e.contains("subject unknown-value") && e.contains("40401"), "{e}");

    // Bad frames: an unknown id (asked once, then remembered), the wrong magic byte, a cut
    // datum, an id of a Protobuf schema.
    let unknown = [0, 0, 0, 0x10, 0x92, 2];
    for _ in 0..3 {
        let e = bad(decode.decode(Some(&unknown)).unwrap_err());
        assert!(e.contains("schema id 4242") && e.contains("40403"), "{e}");
    }
    assert_eq!(counts.by_id.load(Ordering::Relaxed), 3, "ids 1, the newer one and 4242, each once");
    assert!(bad(decode.decode(Some(br#"{"key":1}"#)).unwrap_err()).contains("magic byte 123"));
    let e = bad(decode.decode(Some(&payload[..7])).unwrap_err());
    assert!(e.contains("does not decode into"), "{e}");
    let proto_id = stand_in.register("p-value", Some("PROTOBUF"), EVENT_PROTO).unwrap();
    let mut framed = vec![0];
    framed.extend(proto_id.to_be_bytes());
    framed.push(0);
    let e = bad(decode.decode(Some(&framed)).unwrap_err());
    assert!(e.contains("is a PROTOBUF schema"), "{e}");
}

/// Protobuf: the second message of a file that imports a well-known type, fields by name in
/// another order, the message indexes Confluent writes; an unknown id and a bad message
/// index are bad records.
#[test]
fn protobuf_round_trips_through_the_registry() {
    let stand_in = StandInRegistry::start(None).unwrap();
    let reg = registry(stand_in.url());
    let mut encode =
        ProtobufEncode::<Event>::new(reg.clone(), "events-value", EVENT_PROTO, Some("weir.Event"), true).unwrap();
    let mut decode = ProtobufDecode::<Event>::new(reg.clone());
    let mut payload = Vec::new();
    for seq in 0..1000 {
        payload.clear();
        encode.encode(&event(seq), &mut payload).unwrap();
        // Magic, id, then the indexes of the file's second message: count 1, index 1.
        assert_eq!((payload[0], &payload[5..7]), (0, &[2u8, 2][..]));
        assert_eq!(*decode.decode(Some(&payload)).unwrap(), event(seq));
    }
    assert_eq!(stand_in.counts().by_id.load(Ordering::Relaxed), 1, "fetched once");
    // Zero values (proto3 leaves them off the wire) still reach every field.
    payload.clear();
    encode.encode(&Event::default(), &mut payload).unwrap();
    assert_eq!(*decode.decode(Some(&payload)).unwrap(), Event::default());
    // A message index past the file's messages, and an unknown id.
    let mut wrong = payload[..5].to_vec();
    wrong.extend([2, 14]);
    let e = bad(decode.decode(Some(&wrong)).unwrap_err());
    assert!(e.contains("no message at index 7"), "{e}");
    let e = bad(decode.decode(Some(&[0, 0, 0, 0, 77, 0])).unwrap_err());
    assert!(e.contains("schema id 77"), "{e}");
    // A message name the file does not have is refused when the sink is made.
    let e = ProtobufEncode::<Event>::new(reg, "x-value", EVENT_PROTO, Some("weir.Nope"), true).unwrap_err().to_string();
    assert!(e.contains("no message weir.Nope") && e.contains("weir.Event"), "{e}");
}

/// A registry that does not answer is no bad record: the decoder says unavailable (after its
/// retries) and remembers nothing, so the record is decoded once the registry is back.
#[test]
fn an_unreachable_registry_is_unavailable_not_bad() {
    let mut stand_in = StandInRegistry::start(None).unwrap();
    let id = stand_in.register("events-value", None, EVENT_AVSC).unwrap();
    let url = stand_in.url().to_owned();
    let mut payload = vec![0];
    payload.extend(id.to_be_bytes());
    payload.extend([2, 4, 6, 8]);
    stand_in.stop();
    let mut decode = AvroDecode::<Event>::new(registry(&url));
    match decode.decode(Some(&payload)).unwrap_err() {
        FormatError::Unavailable(why) => {
            assert!(why.contains("could not be reached") && why.contains(&url), "{why}")
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    // Credentials the registry refuses: unavailable too (no retry mends them; exit 69).
    let guarded = StandInRegistry::start(Some(("weir", "right"))).unwrap();
    let mut config = RegistryConfig::new(guarded.url());
    config.user = Some("weir".into());
    config.password = Some("wrong-secret".into());
    let mut decode = AvroDecode::<Event>::new(Arc::new(Registry::new(config.clone()).unwrap()));
    match decode.decode(Some(&payload)).unwrap_err() {
        FormatError::Unavailable(why) => {
            assert!(why.contains("refused the credentials") && !why.contains("wrong-secret"), "{why}")
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    config.password = Some("right".into());
    let id = guarded.register("events-value", None, EVENT_AVSC).unwrap();
    payload[1..5].copy_from_slice(&id.to_be_bytes());
    let mut decode = AvroDecode::<Event>::new(Arc::new(Registry::new(config).unwrap()));
    assert_eq!(*decode.decode(Some(&payload)).unwrap(), Event { key: 1, value: 2, time_ns: 3, seq: 4 });
}

const EVENTS: u64 = 2_000;
const KEYS: u64 = 13;

/// A job file: Avro events from Kafka (one record of an unknown schema id among them), summed
/// per key, the sums written as Protobuf; read back through the registry, exact; the bad
/// record in the dead letters with its id.
#[test]
fn job_files_read_avro_and_write_protobuf() {
    let stand_in = StandInRegistry::start(None).unwrap();
    let reg = registry(stand_in.url());
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("events", 2, 1).unwrap();
    cluster.create_topic("sums", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    let mut encode = AvroEncode::<Event>::new(reg.clone(), "events-value", EVENT_AVSC, true).unwrap();
    let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
    let mut payload = Vec::new();
    for seq in 0..EVENTS {
        let e = Event { key: seq % KEYS, value: seq % 10 + 1, time_ns: seq, seq };
        *expected.entry(e.key).or_default() += e.value;
        payload.clear();
        encode.encode(&e, &mut payload).unwrap();
        producer.send(BaseRecord::<(), _>::to("events").payload(&payload).partition((seq % 2) as i32)).unwrap();
    }
    producer.send(BaseRecord::<(), _>::to("events").payload(&[0u8, 0, 0, 0x30, 0x39, 0][..]).partition(1)).unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();

    let dir = common::counting::temp_dir("kafka-formats");
    let proto = dir.join("event.proto");
    std::fs::write(&proto, EVENT_PROTO).unwrap();
    let job = format!(
        r#"
[job]
name = "formats"

[[source]]
id = "events"
type = "kafka"
bootstrap = "{bootstrap}"
topic = "events"
start = "earliest"
bounded = true
format = "avro"
schema_registry = "{url}"
dead_letter = "{dir}/bad.jsonl"
parallelism = 2

[[operator]]
id = "by_key"
type = "key_by"
field = "key"
input = "events"

[[operator]]
id = "sums"
type = "sum_per_key"
input = "by_key"

[[sink]]
id = "out"
type = "kafka"
bootstrap = "{bootstrap}"
topic = "sums"
format = "protobuf"
schema_registry = "{url}"
schema = "{proto}"
message = "weir.Event"
input = "sums"
"#,
        url = stand_in.url(),
        dir = dir.display(),
        proto = proto.display()
    );
    let path = dir.join("formats.toml");
    let loaded = weir::graph::jobfile::parse(&path, &job).unwrap();
    loaded.job.configure(|c| c.pinning = false);
    let summary = loaded.job.run().unwrap();
    assert_eq!(summary.node("events").unwrap().records_out, EVENTS, "every good record in");
    let dead = std::fs::read_to_string(dir.join("bad.jsonl")).unwrap();
    assert!(dead.contains("schema id 12345") && dead.contains("\"partition\":1"), "{dead}");

    let mut decode = ProtobufDecode::<Event>::new(reg);
    let mut got: BTreeMap<u64, u64> = BTreeMap::new();
    for payload in common::kafka::read_payloads(&bootstrap, "sums", 1, "read_committed") {
        let e = decode.decode(Some(&payload)).unwrap();
        got.insert(e.key, e.value);
    }
    assert_eq!(got, expected);
    let counts = stand_in.counts();
    assert_eq!(counts.registrations.load(Ordering::Relaxed), 2, "the Avro schema, then the sink's Protobuf one");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Through `weir run`: a schema registry that is not there ends the job with exit 69 and a
/// message naming it; bad settings are refused with exit 78 before anything runs.
#[test]
fn weir_run_names_an_unreachable_registry_and_bad_settings() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("events", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    producer.send(BaseRecord::<(), _>::to("events").payload(&[0u8, 0, 0, 0, 1, 2][..])).unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    // A port nothing listens on: bound, then closed.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dir = common::counting::temp_dir("kafka-formats-run");
    let run = |extra: &str| {
        let text = format!(
            "[job]\nname = \"f\"\n[[source]]\nid = \"events\"\ntype = \"kafka\"\nbootstrap = \"{bootstrap}\"\n\
             topic = \"events\"\nstart = \"earliest\"\nbounded = true\n{extra}\n\
             [[sink]]\nid = \"c\"\ntype = \"count\"\ninput = \"events\"\n"
        );
        let path = dir.join("job.toml");
        std::fs::write(&path, text).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["run", path.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = common::wait_with_watchdog(child, Duration::from_secs(60));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code().unwrap_or(-1), text)
    };
    let (code, text) = run(&format!(
        "format = \"avro\"\nschema_registry = \"http://{dead}\"\nschema_registry_retry_ms = 500\n\
         schema_registry_password = \"hunter2\"\nschema_registry_user = \"u\""
    ));
    println!("== unreachable: exit {code}\n{text}");
    assert_eq!(code, 69, "{text}");
    assert!(text.contains(&format!("http://{dead}")) && text.contains("could not be reached"), "{text}");
    assert!(!text.contains("hunter2"), "the password is never printed: {text}");

    for (extra, words) in [
        ("format = \"avro\"", "needs the schema registry's URL"),
        ("format = \"xml\"", "unknown format `xml`"),
        ("schema_registry = \"http://127.0.0.1:1\"", "reads no schema registry"),
        (
            "format = \"avro\"\nschema_registry = \"http://u:hunter2@127.0.0.1:1\"",
            "`source[0].schema_registry`: the schema registry URL `http://127.0.0.1:1` carries credentials",
        ),
        (
            "format = \"avro\"\nschema_registry = \"http://r\"\nschema_registry_password = \"hunter2\"",
            "`source[0].schema_registry_user`",
        ),
        ("format = \"protobuf\"\nschema_registry = \"127.0.0.1:8081\"", "not http:// or https://"),
    ] {
        let (code, text) = run(extra);
        println!("== {extra}: exit {code}\n{text}");
        assert_eq!(code, 78, "{extra}: {text}");
        assert!(text.contains(words), "{extra}: {text}");
        assert!(!text.contains("hunter2"), "{extra}: {text}");
    }

    // A sink's schema is read and compiled when the job file is: its faults name the line.
    let avsc = dir.join("bad.avsc");
    std::fs::write(&avsc, "{\"type\": \"record\"").unwrap();
    let proto = dir.join("event.proto");
    std::fs::write(&proto, EVENT_PROTO).unwrap();
    let registry = "schema_registry = \"http://127.0.0.1:1\"";
    for (extra, words) in [
        (format!("format = \"avro\"\n{registry}\nschema = \"/nonexistent/e.avsc\""), "cannot read /nonexistent/e.avsc"),
        (format!("format = \"avro\"\n{registry}\nschema = \"{}\"", avsc.display()), "the Avro schema does not parse"),
        (
            format!("format = \"protobuf\"\n{registry}\nschema = \"{}\"\nmessage = \"weir.Nope\"", proto.display()),
            "no message weir.Nope",
        ),
        (format!("format = \"protobuf\"\n{registry}"), "`sink[0].schema`"),
        ("schema = \"x.avsc\"".to_owned(), "JSON needs no schema"),
    ] {
        let text = format!(
            "[job]\nname = \"f\"\n[[source]]\nid = \"g\"\ntype = \"generator\"\ncount = 1\n\
             [[sink]]\nid = \"k\"\ntype = \"kafka\"\nbootstrap = \"127.0.0.1:1\"\ntopic = \"t\"\ninput = \"g\"\n{extra}\n"
        );
        let e = weir::graph::jobfile::parse(&dir.join("sink.toml"), &text).map(|_| ()).expect_err(&extra).to_string();
        assert!(e.contains(words), "{extra}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A Python with Confluent's client and its serializers (`WEIR_INTEROP_PYTHON`; .ci/test makes
/// one in ~/.cache/weir/interop-venv); in CI it must be there.
fn interop_python() -> Option<std::path::PathBuf> {
    let found = std::env::var_os("WEIR_INTEROP_PYTHON").map(std::path::PathBuf::from).filter(|p| p.is_file());
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "CI needs WEIR_INTEROP_PYTHON: .ci/test makes the venv");
    }
    found
}

/// Confluent's Python client (confluent-kafka's AvroSerializer / ProtobufSerializer and its
/// schema registry client, through the same stand-in registry) and weir read each other's
/// records, Avro and Protobuf, exact and in order.
#[test]
fn confluent_client_and_weir_read_each_other() {
    let Some(python) = interop_python() else {
        println!(
            "SKIPPED: no WEIR_INTEROP_PYTHON (a Python with confluent-kafka[avro,protobuf,schemaregistry] and grpcio-tools)"
        );
        return;
    };
    const N: u64 = 300;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/interop/confluent_client.py");
    let stand_in = StandInRegistry::start(None).unwrap();
    let reg = registry(stand_in.url());
    let cluster = MockCluster::new(1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let python_side = |args: &[&str]| {
        let child = std::process::Command::new(&python)
            .arg(script)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = common::wait_with_watchdog(child, Duration::from_secs(120));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    for format in ["avro", "protobuf"] {
        // Confluent's client writes, weir reads.
        let topic = format!("from-python-{format}");
        cluster.create_topic(&topic, 1, 1).unwrap();
        python_side(&["produce", &bootstrap, stand_in.url(), &topic, format, &N.to_string()]);
        let mut decode: Box<dyn Decode<Event>> = match format {
            "avro" => Box::new(AvroDecode::new(reg.clone())),
            _ => Box::new(ProtobufDecode::new(reg.clone())),
        };
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", "interop-check")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        consumer.subscribe(&[&topic]).unwrap();
        let (mut seq, t) = (0, Instant::now());
        while seq < N && t.elapsed() < Duration::from_secs(60) {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                assert_eq!(*decode.decode(m.payload()).unwrap(), event(seq), "{format}");
                seq += 1;
            }
        }
        assert_eq!(seq, N, "{format}: every record Confluent's client wrote");

        // weir writes, Confluent's client reads.
        let topic = format!("from-weir-{format}");
        cluster.create_topic(&topic, 1, 1).unwrap();
        let mut encode: Box<dyn Encode<Event>> = match format {
            "avro" => Box::new(AvroEncode::new(reg.clone(), &format!("{topic}-value"), EVENT_AVSC, true).unwrap()),
            _ => Box::new(
                ProtobufEncode::new(reg.clone(), &format!("{topic}-value"), EVENT_PROTO, Some("weir.Event"), true)
                    .unwrap(),
            ),
        };
        let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
        let mut payload = Vec::new();
        for seq in 0..N {
            payload.clear();
            encode.encode(&event(seq), &mut payload).unwrap();
            producer.send(BaseRecord::<(), _>::to(&topic).payload(&payload)).unwrap();
        }
        producer.flush(Duration::from_secs(10)).unwrap();
        let lines = python_side(&["consume", &bootstrap, stand_in.url(), &topic, format, &N.to_string()]);
        let got: Vec<Event> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(got, (0..N).map(event).collect::<Vec<_>>(), "{format}: what Confluent's client read");
    }
}
