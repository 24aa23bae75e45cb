//! Backpressure from a slow sink to a Kafka source (its own test binary, so the RSS it samples
//! is this job's alone). The mock cluster runs in a child process (this test binary again,
//! as `mock_cluster_process`), so the records it stores do not count in our RSS.

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::io::kafka::{Json, KafkaSource, KafkaSourceConfig};
use weir::operators::{Halt, Sink};
use weir::record::Event;

const CHILD_ENV: &str = "WEIR_KAFKA_MOCK_CHILD";

/// Not a test of its own: with `WEIR_KAFKA_MOCK_CHILD=topic:partitions` set, this process is
/// the mock cluster of the test below; it prints `bootstrap=...` and lives until stdin closes.
#[test]
fn mock_cluster_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let (topic, partitions) = spec.split_once(':').unwrap();
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(topic, partitions.parse().unwrap(), 1).unwrap();
    println!("bootstrap={}", cluster.bootstrap_servers());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

/// Start the mock cluster in a child process; returns it (stdin open) and its bootstrap.
fn mock_process(topic: &str, partitions: i32) -> (std::process::Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["mock_cluster_process", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{topic}:{partitions}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the mock cluster process starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let bootstrap = loop {
        let line = lines.next().expect("the mock cluster prints its address").unwrap();
        // The harness may print "test mock_cluster_process ... " before it on the same line.
        if let Some(at) = line.find("bootstrap=") {
            break line[at + "bootstrap=".len()..].trim().to_owned();
        }
    };
    // Keep draining its output, so its last words do not hit a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, bootstrap)
}

/// Sleeps 1 ms every 5 records (at most 5,000 records/s), collects seqs.
struct SlowSink {
    seqs: Arc<Mutex<Vec<u64>>>,
    count: Arc<AtomicU64>,
    n: u64,
}

impl Sink<Event> for SlowSink {
    fn write(&mut self, e: &Event) -> Result<(), Halt> {
        self.n += 1;
        if self.n.is_multiple_of(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.seqs.lock().unwrap().push(e.seq);
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A producer writes 60,000 records of 1 KiB (60 MiB) while a slow sink takes at most 5,000
/// a second: the source reads only as fast as credit returns, so lag builds up in Kafka, RSS
/// stays within the client's prefetch bound (plus slack) instead of growing with the backlog,
/// and every record arrives exactly once.
#[test]
fn slow_sink_keeps_rss_flat_while_lag_grows() {
    const N: u64 = 60_000;
    // The mock keeps at most 5 MB per partition (older records are dropped, as by retention):
    // 20 partitions keep 60 MB of records within that.
    const PARTITIONS: u64 = 20;
    let (mut child, bootstrap) = mock_process("bp", PARTITIONS as i32);
    let config = KafkaSourceConfig::new(&bootstrap, "bp").set("queued.max.messages.kbytes", 2048);
    let budget = config.prefetch_budget_bytes();
    let stats = config.stats.clone();
    let seqs = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicU64::new(0));
    let job = Job::new("kafka-backpressure");
    job.configure(|c| {
        c.ring_slots = 256;
        c.max_record_bytes = 2048;
    });
    let (s, c) = (seqs.clone(), count.clone());
    job.source("kafka", 1, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default()))
        .rebalance()
        .sink("slow", 1, move |_| SlowSink { seqs: s.clone(), count: c.clone(), n: 0 });
    // The mock cluster answers a fetch at offset 0 of a partition that is still empty with
    // "offset out of range" (a real broker waits for data): start the job once both
    // partitions hold records.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let b = bootstrap.clone();
    let producer = std::thread::spawn(move || {
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &b)
            .set("enable.idempotence", "true")
            .set("queue.buffering.max.kbytes", "2048")
            .create()
            .unwrap();
        let pad = "x".repeat(1000);
        for seq in 0..N {
            let payload = format!(r#"{{"key":{},"value":1,"time_ns":{seq},"seq":{seq},"pad":"{pad}"}}"#, seq % 9);
            let mut record = BaseRecord::to("bp").key("k").payload(&payload).partition((seq % PARTITIONS) as i32);
            loop {
                match p.send(record) {
                    Ok(()) => break,
                    Err((_, r)) => {
                        record = r;
                        p.poll(Duration::from_millis(5));
                    }
                }
            }
            if seq == 2 * PARTITIONS {
                p.flush(Duration::from_secs(60)).unwrap();
                started_tx.send(()).unwrap();
            }
        }
        p.flush(Duration::from_secs(60)).unwrap();
    });
    started_rx.recv_timeout(Duration::from_secs(60)).expect("the first records are delivered");
    let mut running = job.start().expect("job starts");

    let deadline = Instant::now() + Duration::from_secs(300);
    let warm_up = Instant::now() + Duration::from_millis(1500);
    let (mut rss_after_warm_up, mut rss_max, mut lag_max) = (None, 0u64, 0i64);
    while count.load(Ordering::Relaxed) < N {
        assert!(Instant::now() < deadline, "watchdog: {} of {N} records after 300 s", count.load(Ordering::Relaxed));
        if running.is_finished() {
            panic!("the job ended early: {:?}", running.wait().map(|_| ()));
        }
        std::thread::sleep(Duration::from_millis(100));
        let rss = running.sample_rss();
        lag_max = lag_max.max(stats.total_lag());
        if Instant::now() >= warm_up {
            rss_after_warm_up.get_or_insert(rss);
            rss_max = rss_max.max(rss);
        }
    }
    producer.join().unwrap();
    running.cancel();
    let _ = running.wait();
    drop(child.stdin.take());
    let _ = child.wait();

    let base = rss_after_warm_up.expect("the job ran past its warm-up");
    let growth = rss_max.saturating_sub(base);
    println!(
        "lag max {lag_max} records; RSS after warm-up {} MiB, max {} MiB (+{} KiB); prefetch bound {} KiB; \
         60 MiB produced meanwhile",
        base >> 20,
        rss_max >> 20,
        growth >> 10,
        budget >> 10
    );
    let mut seqs = seqs.lock().unwrap().clone();
    seqs.sort_unstable();
    assert_eq!(seqs.len() as u64, N, "every record once (count)");
    assert!(seqs.iter().copied().eq(0..N), "every record once");
    assert!(lag_max >= 5_000, "the backlog waited in Kafka (max lag {lag_max})");
    assert!(
        growth <= budget + (16 << 20),
        "RSS grew by {growth} bytes, more than the prefetch bound {budget} + 16 MiB: the source reads ahead"
    );
}
