//! `weir-kafka-mock`: librdkafka's mock Kafka cluster in a process of its own, so it outlives a
//! job that is killed (restart and recovery demos), with an optional producer of click events.
//!
//! ```text
//! weir-kafka-mock --brokers 3 --topic clicks:8 --produce clicks --rate 1000 --keys 100
//! bootstrap=127.0.0.1:40123
//! ```
//!
//! It prints `bootstrap=host:port` on stdout once the topics exist, then stays up until its
//! standard input closes (the parent went away) or it gets SIGTERM/SIGINT; `--detach` ignores
//! standard input. Produced events are JSON, keyed by user:
//! `{"user":17,"ts_ms":1700000000000,"seq":42}`; `seq` counts from 0 without gaps.

use clap::Parser;
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Parser, Debug)]
#[command(about = "librdkafka's mock Kafka cluster as a process, with an optional click-event producer")]
struct Args {
    /// Brokers in the mock cluster.
    #[arg(long, default_value_t = 1)]
    brokers: i32,
    /// A topic to create, `name:partitions` (repeatable).
    #[arg(long = "topic", value_name = "NAME:PARTITIONS")]
    topics: Vec<String>,
    /// Produce click events to this topic.
    #[arg(long)]
    produce: Option<String>,
    /// Events per second (with --produce).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Distinct users (keys).
    #[arg(long, default_value_t = 100)]
    keys: u64,
    /// Stop after this many events (default: never).
    #[arg(long)]
    count: Option<u64>,
    /// Ignore standard input (stay up until a signal).
    #[arg(long)]
    detach: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("weir-kafka-mock: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, handler as libc::sighandler_t) };
    }
    let cluster = MockCluster::new(args.brokers).map_err(|e| format!("cannot start the mock cluster: {e}"))?;
    for spec in &args.topics {
        let (name, partitions) = spec.rsplit_once(':').unwrap_or((spec, "1"));
        let partitions: i32 = partitions.parse().map_err(|_| format!("--topic {spec}: partitions is not a number"))?;
        cluster
            .create_topic(name, partitions, args.brokers.min(3))
            .map_err(|e| format!("cannot create topic {name}: {e}"))?;
    }
    let bootstrap = cluster.bootstrap_servers();
    println!("bootstrap={bootstrap}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;

    if !args.detach {
        std::thread::spawn(|| {
            // EOF (or an error): the parent is gone.
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            STOP.store(true, Ordering::Relaxed);
        });
    }
    match &args.produce {
        Some(topic) => produce(&bootstrap, topic, &args)?,
        None => {
            while !STOP.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    drop(cluster);
    Ok(())
}

/// Produce events at a fixed rate until stopped (or `--count` events).
fn produce(bootstrap: &str, topic: &str, args: &Args) -> Result<(), String> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .map_err(|e| format!("cannot create the producer: {e}"))?;
    let start = Instant::now();
    let rate = args.rate.max(1);
    let keys = args.keys.max(1);
    let mut seq = 0u64;
    let mut payload = String::new();
    while !STOP.load(Ordering::Relaxed) && args.count.is_none_or(|c| seq < c) {
        // Events due by now at the fixed rate.
        let due = (start.elapsed().as_nanos() * rate as u128 / 1_000_000_000) as u64;
        let due = args.count.map_or(due, |c| due.min(c));
        while seq < due {
            let user = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) % keys;
            let ts_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            payload.clear();
            payload.push_str(&format!(r#"{{"user":{user},"ts_ms":{ts_ms},"seq":{seq}}}"#));
            let key = user.to_string();
            match producer.send(BaseRecord::to(topic).key(&key).payload(&payload)) {
                Ok(()) => seq += 1,
                Err((e, _)) => {
                    producer.poll(Duration::from_millis(10));
                    if !matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::QueueFull)) {
                        return Err(format!("produce to {topic}: {e}"));
                    }
                }
            }
        }
        producer.poll(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
    }
    producer.flush(Duration::from_secs(10)).map_err(|e| format!("flush: {e}"))?;
    eprintln!("weir-kafka-mock: produced {seq} events to {topic}");
    // With --count, stay up (the cluster holds the data) until stopped.
    while !STOP.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
