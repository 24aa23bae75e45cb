//! `weir-demo` (also `weir demo`): the design's whole argument, end to end, with nothing installed.
//!
//! ```text
//!  producer ──► Kafka topic "clicks" ──► weir: Kafka source ─► key_by(user) ─► 1 s tumbling (event time)
//!  (fixed rate)  (embedded: librdkafka's      (2 subtasks)                      count (2) ─►
//!                 mock cluster, in a helper                                      HTTP POST ──► slow REST API
//!                 process; or --kafka)                                           sink (1)      2 → 40 → 200 → 2 ms
//! ```
//!
//! The API's latency goes through phases. When it slows, the sink's requests in flight hit
//! their bound, the sink stops reading its ring, credit runs out hop by hop back to the
//! source, and the source stops polling Kafka: the consumer lag grows *in Kafka*, the job's
//! memory stays flat, and checkpoints (every second) keep completing because barriers flow
//! with the data. When the API recovers, the lag burns down. A line per second shows it;
//! the end is a verdict — every click produced is counted at the API exactly once (after the
//! API drops duplicate requests by idempotency key), RSS stayed under the budget,
//! checkpoints completed in the slow phase, the lag burned down — and three files: a PNG
//! timeline, an HdrHistogram (.hgrm) of result latency, and a JSON summary. The exit status
//! is 0 only if every promise held (69 if Kafka is unreachable).

use crate::plot::{self, Sample};
use clap::Args;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::kafka::{Json, KafkaSource, KafkaSourceConfig};
use weir::io::{HttpSink, HttpSinkConfig};
use weir::operators::{Collector, Halt, Source, SourcePoll, Wake};
use weir::ring::counters::CountersReader;
use weir::telemetry::bytes;
use weir::telemetry::counters::channel_fill;
use weir::time::WatermarkStrategy;
use weir::window::{Aggregates, Window, WindowResult};
use weir_tools::slow_api::{Phase, SlowApi, SlowApiConfig, parse_phases};
use weir_tools::stat::StatView;

/// Options of the demo.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Use this Kafka broker (host:port) instead of the embedded one; the topic is created
    /// by the producer (the broker must allow auto-creation) or must exist.
    #[arg(long)]
    kafka: Option<String>,
    /// The topic.
    #[arg(long, default_value = "weir-demo-clicks")]
    topic: String,
    /// Clicks per second the producer writes into Kafka.
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Distinct users (the key).
    #[arg(long, default_value_t = 10_000)]
    users: u64,
    /// The API's latency phases, latency:duration each; the producer writes during all of
    /// them, and the job ends once it has read everything.
    #[arg(long, default_value = "2ms:15s,40ms:15s,200ms:20s,2ms:40s")]
    phases: String,
    /// Partitions of the embedded topic (librdkafka's mock broker keeps about 5 MB per
    /// partition: enough partitions keep the slow phase's lag inside what it retains).
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// How long the producer gathers clicks into a batch (librdkafka's linger.ms). The
    /// embedded mock broker's cost grows with the number of batches it holds: with 5 ms
    /// batches (4 clicks per partition) and a 1.5 M-click lag it served fetches at 5-10 K
    /// clicks/s, below the 20 K/s produced, and the lag never shrank; with 100 ms batches the
    /// same run burns a 730 K lag down in 5 s.
    #[arg(long, default_value_t = 100)]
    linger_ms: u64,
    /// Credit by time: how long data in flight may take to drain from source to sink, ms
    /// (the job's `inflight_target`); 0 turns it off, so rings fill to their size and
    /// checkpoints under the slow API wait behind full rings.
    #[arg(long, default_value_t = weir::graph::DEFAULT_INFLIGHT_TARGET.as_millis() as u64)]
    inflight_target_ms: u64,
    /// Where the picture, the histogram and the summary go.
    #[arg(long, default_value = "weir-demo")]
    out: PathBuf,
    /// A short run (about 20 s, lower rate): what CI runs.
    #[arg(long)]
    short: bool,
    /// Where the results go: `http` (a REST API whose latency follows --phases) or `postgres`
    /// (a table of a real PostgreSQL; the slowest phase of --phases is an expensive index
    /// built on the table, the others are the database as it is).
    #[arg(long, value_enum, default_value_t = SinkKind::Http)]
    sink: SinkKind,
    /// With --sink postgres: this server (a connection string) instead of one started with
    /// tools/postgres/server.sh (Debian's PostgreSQL, removed at the end).
    #[arg(long)]
    postgres: Option<String>,
    /// With --sink postgres: exactly_once (prepared transactions committed at each
    /// checkpoint), upsert or at_least_once.
    #[arg(long, default_value = "exactly_once")]
    delivery: String,
}

/// Where the demo's results go.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// A REST API that slows down (weir-slow-api in this process).
    Http,
    /// A PostgreSQL table slowed by an index being built on it.
    Postgres,
}

/// The sink the job gets.
enum SinkChoice {
    Http(String),
    Postgres(Box<weir::io::postgres::PostgresSinkConfig>),
}

/// A click, as the producer writes it (JSON) and the job carries it (fixed layout, 24 B).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
    serde::Serialize,
    serde::Deserialize,
)]
#[repr(C)]
pub struct Click {
    /// Who clicked (the key).
    pub user: u64,
    /// When, ms since the Unix epoch (set by the producer).
    pub ts_ms: u64,
    /// The producer's sequence number.
    pub seq: u64,
}

weir::fixed_record!(Click);

const EX_UNAVAILABLE: u8 = 69;
/// How far behind the newest click of a partition its watermark runs (out-of-orderness
/// allowed by the producer's batching).
const WATERMARK_DELAY_MS: u64 = 200;

/// How often the job takes a checkpoint.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// The longest a checkpoint may take in the slow phase for the verdict to hold: a barrier waits
/// behind the data in flight (the in-flight target per hop), never behind the API.
const RHYTHM_MAX: Duration = Duration::from_millis(1500);

fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// What the producer, the sources and the live view share.
#[derive(Default)]
struct Shared {
    produced: AtomicU64,
    producer_done: AtomicBool,
    producer_error: Mutex<Option<String>>,
    /// The API is in its slowest phase now: result latency goes into the slow-phase histogram too.
    in_slow_phase: AtomicBool,
}

/// Result latency, µs: the whole run and the slowest phase alone.
struct Latency {
    all: hdrhistogram::Histogram<u64>,
    slow: hdrhistogram::Histogram<u64>,
}

/// The Kafka source, finishing once it has read every click the producer wrote (the demo
/// ends by itself; a real job reads forever).
struct DemoSource {
    inner: KafkaSource<Click, Json<Click>>,
    shared: Arc<Shared>,
    read: Arc<weir::io::kafka::KafkaSourceStats>,
}

impl Source<Click> for DemoSource {
    fn poll(&mut self, out: &mut dyn Collector<Click>) -> Result<SourcePoll, Halt> {
        let p = self.inner.poll(out)?;
        if matches!(p, SourcePoll::Idle(_))
            && self.shared.producer_done.load(Ordering::Acquire)
            && self.read.records.load(Ordering::Relaxed) >= self.shared.produced.load(Ordering::Acquire)
        {
            return Ok(SourcePoll::Finished);
        }
        Ok(p)
    }
    fn snapshot(&mut self, id: u64) -> Result<Vec<u8>, Halt> {
        self.inner.snapshot(id)
    }
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        self.inner.restore(from)
    }
    fn checkpoint_complete(&mut self, id: u64) -> Result<(), Halt> {
        self.inner.checkpoint_complete(id)
    }
    fn wait(&mut self, wake: &Wake<'_>, timeout: Duration) -> bool {
        self.inner.wait(wake, timeout)
    }
}

/// `weir-demo kafka-mock`: librdkafka's mock cluster in this process, the topic created, the
/// bootstrap address on stdout; it runs until stdin closes (so it dies with its parent).
pub fn kafka_mock(topic: &str, partitions: i32) -> ExitCode {
    let cluster = match rdkafka::mocking::MockCluster::new(1) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot start the mock Kafka cluster: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = cluster.create_topic(topic, partitions, 1) {
        eprintln!("cannot create topic {topic}: {e}");
        return ExitCode::FAILURE;
    }
    println!("bootstrap={}", cluster.bootstrap_servers());
    let _ = std::io::stdout().flush();
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    ExitCode::SUCCESS
}

/// The embedded Kafka: this binary's `kafka-mock` in a child process.
struct EmbeddedKafka {
    child: Child,
    bootstrap: String,
}

impl EmbeddedKafka {
    fn start(topic: &str, partitions: i32) -> Result<EmbeddedKafka, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        let mut child = Command::new(exe)
            .args(["kafka-mock", "--topic", topic, "--partitions", &partitions.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the embedded Kafka: {e}"))?;
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped");
        BufReader::new(stdout).read_line(&mut line).map_err(|e| format!("embedded Kafka: {e}"))?;
        let bootstrap = line.trim().strip_prefix("bootstrap=").map(str::to_owned);
        match bootstrap {
            Some(b) => Ok(EmbeddedKafka { child, bootstrap: b }),
            None => {
                let _ = child.kill();
                Err(format!("the embedded Kafka did not start (it said {line:?})"))
            }
        }
    }
}

impl Drop for EmbeddedKafka {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a broker answers at `bootstrap` (metadata within 10 s); with `topic`, wait up
/// to `wait` for it to exist with partitions (the producer's first record creates it on a
/// broker that auto-creates topics).
fn check_kafka(bootstrap: &str, topic: Option<&str>, wait: Duration) -> Result<(), String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("cannot create a Kafka client for {bootstrap}: {e}"))?;
    let deadline = Instant::now() + wait;
    loop {
        let m = consumer
            .fetch_metadata(topic, Duration::from_secs(10))
            .map_err(|e| format!("Kafka at {bootstrap} does not answer: {e}"))?;
        let Some(topic) = topic else { return Ok(()) };
        if m.topics().iter().any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "topic {topic} does not exist at {bootstrap} after {} s (the broker does not create topics on \
                 first use: create it, e.g. with 4 partitions)",
                wait.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Create `topic` with `partitions` partitions if it does not exist. A broker's own default
/// (one partition, when the producer's first record creates it) would leave all but one of
/// the job's source subtasks without a partition, and their windows waiting on a watermark
/// that never comes until the end. A broker that refuses (no rights to create topics) is
/// said, and the demo goes on with what is there.
fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::types::RDKafkaErrorCode;
    let admin: AdminClient<DefaultClientContext> =
        match rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap).create() {
            Ok(a) => a,
            Err(e) => return eprintln!("cannot create a Kafka admin client for {bootstrap}: {e}"),
        };
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    match futures::executor::block_on(admin.create_topics([&new], &options)) {
        Ok(results) => {
            for r in results {
                match r {
                    Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((t, code)) => eprintln!("cannot create topic {t} with {partitions} partitions: {code}"),
                }
            }
        }
        Err(e) => eprintln!("cannot create topic {topic} with {partitions} partitions: {e}"),
    }
}

/// What the producer writes: clicks per second, distinct users, batching.
#[derive(Debug, Clone, Copy)]
struct Clicks {
    rate: u64,
    users: u64,
    linger_ms: u64,
}

/// Write clicks at `rate` per second (open loop) until `until`, keyed by user.
fn produce(bootstrap: String, topic: String, clicks: Clicks, until: Instant, shared: Arc<Shared>) {
    let Clicks { rate, users, linger_ms } = clicks;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let fail = |e: String| {
        *shared.producer_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        shared.producer_done.store(true, Ordering::Release);
    };
    let producer: BaseProducer = match rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", linger_ms.to_string())
        .create()
    {
        Ok(p) => p,
        Err(e) => return fail(format!("producer: {e}")),
    };
    let start = Instant::now();
    let mut seq = 0u64;
    while Instant::now() < until {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while seq < due {
            let user = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % users;
            let click = Click { user, ts_ms: unix_ns() / 1_000_000, seq };
            let payload = serde_json::to_vec(&click).expect("clicks serialize");
            let key = user.to_string();
            match producer.send(BaseRecord::to(&topic).key(&key).payload(&payload)) {
                Ok(()) => {
                    seq += 1;
                    shared.produced.store(seq, Ordering::Release);
                }
                Err((e, _)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                    producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => return fail(format!("producer: {e}")),
            }
        }
        producer.poll(Duration::from_millis(2));
    }
    if let Err(e) = producer.flush(Duration::from_secs(60)) {
        return fail(format!("producer flush: {e}"));
    }
    shared.producer_done.store(true, Ordering::Release);
}

/// The job: Kafka → key_by(user) → 1 s tumbling count → HTTP POST, checkpoints every second.
fn build_job(
    bootstrap: &str,
    topic: &str,
    sink: SinkChoice,
    checkpoints: &Path,
    inflight_target: Option<Duration>,
    shared: Arc<Shared>,
    latency: Arc<Mutex<Latency>>,
) -> (Job, Arc<weir::io::kafka::KafkaSourceStats>) {
    let job = Job::new("demo");
    let source_config = KafkaSourceConfig::new(bootstrap, topic).set("group.id", "weir-demo");
    let read = source_config.stats.clone();
    let prefetch = source_config.prefetch_budget_bytes();
    job.configure(|c| {
        c.checkpoints = Some(CheckpointSettings {
            interval: CHECKPOINT_INTERVAL,
            timeout: Duration::from_secs(60),
            ..CheckpointSettings::new(checkpoints)
        });
        c.connector_memory.push((format!("kafka source prefetch (2 x {})", bytes(prefetch)), 2 * prefetch));
        c.lag_gauges.push(source_config.lag_gauge("clicks"));
        match &sink {
            SinkChoice::Http(_) => {}
            SinkChoice::Postgres(config) => {
                c.sink_gauges.push(config.sink_gauge("db"));
                c.connector_memory.push(("postgres sink batches".into(), config.memory_bytes()));
            }
        }
        c.ring_slots = 1024;
        c.inflight_target = inflight_target;
    });
    let in_slow = shared.clone();
    let stats = read.clone();
    // Event time: the second each click was produced in. The source keeps watermarks per
    // partition, so a subtask that reads its partitions unevenly under backpressure does not
    // make the slower ones' clicks late.
    let click_ns = |c: &Click| c.ts_ms * 1_000_000;
    let results = job
        .source("clicks", 2, move |info| DemoSource {
            inner: KafkaSource::new(source_config.clone(), info, Json::default())
                .with_event_time(click_ns, WatermarkStrategy::bounded(Duration::from_millis(WATERMARK_DELAY_MS))),
            shared: shared.clone(),
            read: stats.clone(),
        })
        .with_source_watermarks(click_ns)
        .key_by("by_user", |c: &Click| c.user)
        .window(Window::tumbling(Duration::from_secs(1)))
        .aggregate("per_second", 2, Aggregates::of(|_: &Click| 1).count())
        .map("latency", move |r: &WindowResult| {
            // Result latency: from the window's end to here (it fires once the watermark, which
            // runs WATERMARK_DELAY_MS behind the clicks of the slowest partition, passes its end).
            let us = unix_ns().saturating_sub(r.end_ns) / 1_000;
            let mut l = latency.lock().unwrap_or_else(|p| p.into_inner());
            let _ = l.all.record(us.max(1));
            if in_slow.in_slow_phase.load(Ordering::Relaxed) {
                let _ = l.slow.record(us.max(1));
            }
            *r
        });
    match sink {
        SinkChoice::Http(url) => {
            let sink_config = HttpSinkConfig {
                batch_records: 100,
                max_in_flight: 4,
                key_prefix: "demo".into(),
                ..HttpSinkConfig::new(url)
            };
            job.configure(|c| {
                c.sink_gauges.push(sink_config.sink_gauge("api"));
                let held = sink_config.budget_bytes();
                c.connector_memory.push((format!("http sink held and pending (1 x {})", bytes(held)), held));
            });
            // Batches named by window and user: a replay after a crash re-sends the same
            // batches under the same idempotency keys.
            results.sink("api", 1, move |info| HttpSink::new(sink_config.clone(), info).window_results());
        }
        SinkChoice::Postgres(config) => {
            let config = *config;
            results.sink("db", 1, move |info| weir::io::postgres::PostgresSink::new(config.clone(), info));
        }
    }
    (job, read)
}

/// Group per-subtask or per-channel figures by node: `a#0->b#1` → `a->b`, `a#0` → `a`.
fn node_of(owner: &str) -> String {
    owner.split("->").map(|p| p.rsplit_once('#').map_or(p, |(n, _)| n)).collect::<Vec<_>>().join("->")
}

struct Verdict {
    checks: Vec<(String, bool)>,
}

impl Verdict {
    fn check(&mut self, what: String, ok: bool) {
        println!("  [{}] {what}", if ok { "ok" } else { "FAILED" });
        self.checks.push((what, ok));
    }
}

/// Run the demo.
pub fn run(mut args: DemoArgs) -> ExitCode {
    if args.short {
        // The API's capacity at 200 ms (4 requests of 100 results in flight: 2,000 results
        // per second) is below the ~4,000 results per second of 5,000 users: the lag grows.
        args.phases = "2ms:4s,40ms:3s,200ms:6s,2ms:7s".into();
        args.rate = args.rate.min(5_000);
        args.users = args.users.min(5_000);
    }
    let phases = match parse_phases(&args.phases) {
        Ok(p) if !p.is_empty() => p,
        Ok(_) => {
            eprintln!("--phases: give at least one latency:duration");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("--phases: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("cannot create {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }
    let checkpoints = args.out.join("checkpoints");
    let _ = std::fs::remove_dir_all(&checkpoints);

    // Kafka: embedded (a helper process) or given.
    let mut _embedded = None;
    let bootstrap = match &args.kafka {
        Some(b) => {
            if let Err(e) = check_kafka(b, None, Duration::ZERO) {
                eprintln!("{e}\nstart a broker there, or run the demo without --kafka (embedded Kafka)");
                return ExitCode::from(EX_UNAVAILABLE);
            }
            create_topic(b, &args.topic, args.partitions);
            b.clone()
        }
        None => match EmbeddedKafka::start(&args.topic, args.partitions) {
            Ok(k) => {
                let b = k.bootstrap.clone();
                _embedded = Some(k);
                b
            }
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(EX_UNAVAILABLE);
            }
        },
    };

    // The destination: the slow API (the phases, then fast until the job has drained), or
    // PostgreSQL (its slowest phase an index being built on the table).
    let total: Duration = phases.iter().map(|p| p.duration).sum();
    let slow = phases.iter().enumerate().max_by_key(|(_, p)| p.latency).map_or(0, |(i, _)| i);
    let mut api = None;
    let mut pg = None;
    let sink_choice = match args.sink {
        SinkKind::Http => {
            let mut api_phases = phases.clone();
            api_phases
                .push(Phase { latency: phases.last().expect("non-empty").latency, duration: Duration::from_secs(600) });
            match SlowApi::start(SlowApiConfig {
                phases: api_phases,
                max_run: total + Duration::from_secs(900),
                ..Default::default()
            }) {
                Ok(a) => {
                    let url = a.url("/ingest");
                    api = Some(a);
                    SinkChoice::Http(url)
                }
                Err(e) => {
                    eprintln!("cannot start the slow API on 127.0.0.1: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        SinkKind::Postgres => {
            let Some(delivery) = weir::io::postgres::Delivery::from_name(&args.delivery) else {
                eprintln!("--delivery: `{}`; use exactly_once, upsert or at_least_once", args.delivery);
                return ExitCode::from(2);
            };
            let server = match crate::pg::PgDemo::start(args.postgres.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(EX_UNAVAILABLE);
                }
            };
            let config = match weir::io::postgres::PostgresSinkConfig::new(&server.url, crate::pg::TABLE) {
                Ok(c) => weir::io::postgres::PostgresSinkConfig {
                    columns: vec![
                        ("key".into(), "user_id".into()),
                        ("end_ns".into(), "window_end".into()),
                        ("count".into(), "clicks".into()),
                    ],
                    delivery,
                    batch_rows: 1000,
                    batch_time: Duration::from_millis(100),
                    max_in_flight: 4,
                    transaction_prefix: "demo".into(),
                    ..c
                },
                Err(e) => {
                    eprintln!("--postgres: {e}");
                    return ExitCode::from(2);
                }
            };
            pg = Some((server, config.stats.clone()));
            SinkChoice::Postgres(Box::new(config))
        }
    };

    let shared = Arc::new(Shared::default());
    let histogram = || hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("bounds");
    let latency = Arc::new(Mutex::new(Latency { all: histogram(), slow: histogram() }));
    let inflight_target = (args.inflight_target_ms > 0).then(|| Duration::from_millis(args.inflight_target_ms));
    let (job, read) =
        build_job(&bootstrap, &args.topic, sink_choice, &checkpoints, inflight_target, shared.clone(), latency.clone());
    let start = Instant::now();
    let producer = {
        let (b, t, s) = (bootstrap.clone(), args.topic.clone(), shared.clone());
        let clicks = Clicks { rate: args.rate, users: args.users, linger_ms: args.linger_ms };
        std::thread::spawn(move || produce(b, t, clicks, start + total, s))
    };
    // The job assigns the topic's partitions at start: the topic must exist by then.
    if let Err(e) = check_kafka(&bootstrap, Some(&args.topic), Duration::from_secs(30)) {
        eprintln!("{e}");
        return ExitCode::from(EX_UNAVAILABLE);
    }
    let running = match job.start() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the job: {e}");
            return ExitCode::FAILURE;
        }
    };
    let budget = running.budget().total_bytes();
    // PostgreSQL's slow phase: the index is built when it begins and dropped when it ends.
    let index_thread = pg.as_ref().map(|(server, _)| {
        let url = server.url.clone();
        let begin: Duration = phases[..slow].iter().map(|p| p.duration).sum();
        let end = begin + phases[slow].duration;
        std::thread::spawn(move || -> Result<String, String> {
            let db = crate::pg::PgDemo::at(&url);
            std::thread::sleep((start + begin).saturating_duration_since(Instant::now()));
            let built = db.slow_index_on()?;
            std::thread::sleep((start + end).saturating_duration_since(Instant::now()));
            db.slow_index_off()?;
            Ok(format!("the index was built in {:.1} s and dropped at {:.0} s", built.as_secs_f64(), end.as_secs_f64()))
        })
    });
    let destination = match &pg {
        Some((server, _)) => format!(
            "PostgreSQL {} ({}; the slow phase: an expensive index built on the table)",
            server.url, args.delivery
        ),
        None => format!("the slow API, phases {}", args.phases),
    };
    println!(
        "weir demo: {} clicks/s over {} users into Kafka at {bootstrap} ({}), into {}; in-flight target {}; job budget {}",
        args.rate,
        args.users,
        if args.kafka.is_some() { "given" } else { "embedded" },
        destination,
        inflight_target.map_or("off (rings fill)".to_owned(), |t| format!("{} ms", t.as_millis())),
        bytes(budget)
    );
    println!("{}", running.budget());
    let reader = CountersReader::open(running.counters_path()).ok();

    // Live: a line per second.
    let phase_bounds: Vec<crate::plot::Phase> = {
        let mut t = 0.0;
        phases
            .iter()
            .map(|p| {
                let a = t;
                t += p.duration.as_secs_f64();
                let name = match args.sink {
                    SinkKind::Http => format!("API {} ms", p.latency.as_millis()),
                    SinkKind::Postgres if p.latency == phases[slow].latency => "slow index".to_owned(),
                    SinkKind::Postgres => "database".to_owned(),
                };
                (name, a, t, p.latency.as_secs_f64() * 1e3)
            })
            .collect()
    };
    let mut samples: Vec<Sample> = Vec::new();
    let mut before = reader.as_ref().map(|r| r.snapshot()).unwrap_or_default();
    let (mut last_produced, mut last_read, mut last_api) = (0u64, 0u64, 0u64);
    let mut last_ckpt_count = 0u64;
    let mut checkpoints_in_slow = 0u64;
    // The ids of the checkpoints that completed in the slow phase (the first and last seen).
    let mut slow_ids: Option<(u64, u64)> = None;
    // Durations of the checkpoints that completed in the slow phase, ms.
    let mut slow_checkpoint_ms: Vec<f64> = Vec::new();
    let mut tick = start;
    // The sink's end-to-end latency as the engine times it (latency markers), last seen.
    let mut e2e: Vec<weir_tools::stat::LatencyView> = Vec::new();
    // A failed subtask ends the live view (the verdict reports the failure).
    while !running.is_finished() && !running.has_failed() {
        tick += Duration::from_secs(1);
        while Instant::now() < tick && !running.is_finished() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let t = start.elapsed().as_secs_f64();
        let after = reader.as_ref().map(|r| r.snapshot()).unwrap_or_default();
        let view = StatView::between(&before, &after, 1.0);
        before = after;
        if view.latencies.iter().any(|l| l.markers > 0) {
            e2e = view.latencies.clone();
        }
        let produced = shared.produced.load(Ordering::Relaxed);
        let read_n = read.records.load(Ordering::Relaxed);
        // Clicks counted at the API, or rows committed to the table.
        let api_n = match (&api, &pg) {
            (Some(api), _) => api.stats().count_sum,
            (_, Some((_, stats))) => stats.rows_committed.load(Ordering::Relaxed),
            _ => 0,
        };
        let lag = read.total_lag().max(0) as u64;
        let phase = phase_bounds.iter().position(|(_, a, b, _)| t > *a && t <= *b).unwrap_or(phases.len());
        let new_ckpts = view.checkpoints.completed.saturating_sub(last_ckpt_count);
        last_ckpt_count = view.checkpoints.completed;
        if phase == slow {
            checkpoints_in_slow += new_ckpts;
            if new_ckpts > 0 {
                slow_checkpoint_ms.push(view.checkpoints.duration_ns as f64 / 1e6);
                let last = view.checkpoints.last_id;
                let first = last + 1 - new_ckpts.min(last);
                slow_ids = Some(slow_ids.map_or((first, last), |(a, _)| (a, last)));
            }
        }
        // The phase the next second runs in (for the slow-phase latency histogram).
        let next = phase_bounds.iter().position(|(_, a, b, _)| t + 1.0 > *a && t + 1.0 <= *b);
        shared.in_slow_phase.store(next == Some(slow), Ordering::Relaxed);
        let sample = Sample {
            t_s: t,
            phase,
            in_rate: (read_n - last_read) as f64,
            sink_rate: (api_n.saturating_sub(last_api)) as f64,
            produce_rate: (produced - last_produced) as f64,
            lag,
            rss_mib: view.rss_bytes as f64 / (1 << 20) as f64,
            checkpoint_ms: (new_ckpts > 0).then_some(view.checkpoints.duration_ns as f64 / 1e6),
        };
        (last_produced, last_read, last_api) = (produced, read_n, api_n);
        // Edge fill (the fullest ring of each edge), its receivers' estimated drain time (the
        // longest) and backpressure per stage (the mean).
        // (No drain time without the in-flight target: receivers then measure nothing.)
        let mut fills: Vec<(String, f64, Option<f64>)> = Vec::new();
        for c in &view.channels {
            let (edge, fill) = (node_of(&c.owner), channel_fill(c.slots, c.announced, c.backlog).unwrap_or(0.0));
            let drain = (c.drain_rate > 0).then_some(c.drain_ms);
            match fills.iter_mut().find(|(e, _, _)| *e == edge) {
                Some((_, f, d)) => {
                    *f = f.max(fill);
                    *d = match (*d, drain) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        (a, b) => a.or(b),
                    };
                }
                None => fills.push((edge, fill, drain)),
            }
        }
        let mut bp: Vec<(String, f64, u32)> = Vec::new();
        for s in &view.subtasks {
            let node = node_of(&s.owner);
            match bp.iter_mut().find(|(n, _, _)| *n == node) {
                Some((_, b, n)) => {
                    *b += s.backpressured;
                    *n += 1;
                }
                None => bp.push((node, s.backpressured, 1)),
            }
        }
        let phase_name = phase_bounds.get(phase).map_or("drain", |p| p.0.as_str());
        println!(
            "{t:5.0}s {phase_name:<11} in {:>7.0}/s  {} {:>7.0}/s  lag {:>8}  fill {}  bp {}  RSS {:.0}/{:.0} MiB  checkpoint #{} {:.0} ms",
            sample.in_rate,
            if pg.is_some() { "rows" } else { "api" },
            sample.sink_rate,
            lag,
            fills
                .iter()
                .map(|(e, f, d)| match d {
                    Some(d) => format!("{e} {:.0}% ({d:.0} ms)", 100.0 * f),
                    None => format!("{e} {:.0}%", 100.0 * f),
                })
                .collect::<Vec<_>>()
                .join(", "),
            bp.iter().map(|(n, b, k)| format!("{n} {:.0}%", 100.0 * b / *k as f64)).collect::<Vec<_>>().join(", "),
            sample.rss_mib,
            budget as f64 / (1 << 20) as f64,
            view.checkpoints.last_id,
            view.checkpoints.duration_ns as f64 / 1e6,
        );
        samples.push(sample);
        if let Some(e) = shared.producer_error.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            eprintln!("the producer failed: {e}");
            break;
        }
    }
    let _ = producer.join();
    let summary = running.wait();
    let api_stats = api.map(|a| a.stop());
    let produced = shared.produced.load(Ordering::Relaxed);
    let index = index_thread.map(|t| t.join().unwrap_or_else(|_| Err("the index thread panicked".into())));

    // The verdict.
    println!("\nverdict:");
    let mut v = Verdict { checks: Vec::new() };
    let summary = match summary {
        Ok(s) => s,
        Err(e) => {
            println!("  [FAILED] the job failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut counted = 0;
    if let Some(api_stats) = &api_stats {
        counted = api_stats.count_sum;
        v.check(
            format!(
                "clicks produced {produced} = counted at the API {} (duplicate requests dropped by idempotency key: {})",
                api_stats.count_sum, api_stats.duplicate_requests
            ),
            produced > 0 && api_stats.count_sum == produced,
        );
    }
    if let Some((db, stats)) = &pg {
        match db.counts() {
            Ok((sum, rows, distinct, prepared)) => {
                counted = sum;
                v.check(
                    format!(
                        "clicks produced {produced} = SELECT sum(clicks) FROM {} {sum}; {rows} rows, each (user, \
                         second) once: {distinct} distinct; prepared transactions left: {prepared}",
                        crate::pg::TABLE
                    ),
                    produced > 0 && sum == produced && rows == distinct && prepared == 0,
                );
            }
            Err(e) => v.check(format!("read the table back: {e}"), false),
        }
        let (retries, dead) = (stats.retries.load(Ordering::Relaxed), stats.dead_letter_rows.load(Ordering::Relaxed));
        v.check(
            format!(
                "the database was the slow part: {}; the sink waited {:.1} s for it in all, {retries} retries, {dead} \
                 rows rejected",
                match &index {
                    Some(Ok(said)) => said.clone(),
                    Some(Err(e)) => format!("the index failed: {e}"),
                    None => "no index".into(),
                },
                stats.blocked.total_ns() as f64 / 1e9
            ),
            matches!(index, Some(Ok(_))) && stats.blocked.total_ns() > 0 && dead == 0,
        );
    }
    let late = summary.node("per_second").map_or(0, |n| n.late_records);
    v.check(format!("late records dropped by the windows: {late}"), late == 0);
    v.check(
        format!("max RSS {} under the budget {}", bytes(summary.max_rss_bytes), bytes(budget)),
        summary.max_rss_bytes <= budget,
    );
    v.check(
        format!(
            "checkpoints completed during the slow phase ({}): {checkpoints_in_slow}; {} in all, {} expired or declined",
            phase_bounds[slow].0,
            summary.checkpoints.completed.len(),
            summary.checkpoints.failed.len()
        ),
        checkpoints_in_slow > 0,
    );
    // Checkpoints keep their rhythm while the API is slow: one completes every interval (a
    // second here), none takes longer than RHYTHM_MAX, none is declined or expires there.
    let slow_len = phase_bounds[slow].2 - phase_bounds[slow].1;
    let in_slow = |id: u64| slow_ids.is_some_and(|(a, b)| (a..=b).contains(&id));
    let slow_durations: Vec<u64> =
        summary.checkpoints.completed.iter().filter(|c| in_slow(c.0)).map(|c| c.1 / 1_000_000).collect();
    let longest = slow_durations.iter().copied().max().unwrap_or(0);
    let failed_in_slow = summary.checkpoints.failed.iter().filter(|(id, _)| in_slow(*id)).count();
    let expected_in_slow = (slow_len / CHECKPOINT_INTERVAL.as_secs_f64()).floor() as u64;
    v.check(
        format!(
            "checkpoints kept their rhythm in the slow phase: {} of the {expected_in_slow} intervals completed one, the \
             longest took {longest} ms (at most {} ms), {failed_in_slow} declined or expired",
            slow_durations.len(),
            RHYTHM_MAX.as_millis()
        ),
        slow_durations.len() as u64 + 1 >= expected_in_slow
            && longest <= RHYTHM_MAX.as_millis() as u64
            && failed_in_slow == 0,
    );
    let slow_end = phase_bounds[slow].2;
    let peak_lag = samples.iter().map(|s| s.lag).max().unwrap_or(0);
    // While clicks are still produced: a lag that only shrinks once the producer stops was
    // not burned down by the job (the read rate never caught up with the write rate).
    let producing_end = phase_bounds.last().map_or(slow_end, |p| p.2) + 1.0;
    let burned = samples
        .iter()
        .find(|s| s.t_s > slow_end && s.t_s <= producing_end && s.lag <= args.rate / 2)
        .map(|s| s.t_s - slow_end);
    v.check(
        format!(
            "the lag (peak {peak_lag} clicks) burned down after the slow phase, while clicks were still produced: {}",
            burned.map_or("no, it did not catch up".to_owned(), |s| format!("in {s:.0} s"))
        ),
        burned.is_some() && peak_lag > 0,
    );

    // The engine's own figure for what the API measured: event time (the window's end) to
    // acknowledged, from the latency markers the windows send behind their results.
    let markers: u64 = e2e.iter().map(|l| l.markers).sum();
    let worst = |f: fn(&weir_tools::stat::LatencyView) -> u64| e2e.iter().map(f).max().unwrap_or(0) as f64 / 1e3;
    v.check(
        format!(
            "the sink timed {markers} latency markers: window end to acknowledged since the start p50 {:.0} ms, p99 {:.0} ms, \
             max {:.0} ms; the windows' input to acknowledged p99 {:.0} ms",
            worst(|l| l.event[4]),
            worst(|l| l.event[5]),
            worst(|l| l.event[7]),
            worst(|l| l.ingest[5]),
        ),
        markers > 0,
    );

    // The files.
    let (hist, slow_hist) = {
        let l = latency.lock().unwrap_or_else(|p| p.into_inner());
        (l.all.clone(), l.slow.clone())
    };
    let png = args.out.join("timeline.png");
    let hgrm = args.out.join("latency.hgrm");
    let json = args.out.join("summary.json");
    if let Err(e) = plot::timeline(&png, &samples, &phase_bounds, budget as f64 / (1 << 20) as f64) {
        eprintln!("no picture: {e}");
    }
    let _ = std::fs::write(&hgrm, weir::telemetry::hgrm::percentile_distribution(&hist, 1000.0));
    let quantiles = |h: &hdrhistogram::Histogram<u64>| -> Vec<(f64, f64)> {
        [50.0, 90.0, 99.0, 99.9, 100.0].iter().map(|&q| (q, h.value_at_quantile(q / 100.0) as f64 / 1000.0)).collect()
    };
    let percentiles = quantiles(&hist);
    let slow_percentiles = quantiles(&slow_hist);
    let slow_checkpoint_max = slow_checkpoint_ms.iter().copied().fold(0.0, f64::max);
    let report = serde_json::json!({
        "args": { "rate": args.rate, "users": args.users, "phases": args.phases, "kafka": args.kafka, "topic": args.topic },
        "produced": produced,
        "counted": counted,
        "sink": if pg.is_some() { "postgres" } else { "http" },
        "api": api_stats,
        "max_rss_bytes": summary.max_rss_bytes,
        "budget_bytes": budget,
        "checkpoints": summary.checkpoints,
        "checkpoints_in_slow_phase": checkpoints_in_slow,
        "slow_phase_checkpoint_ms": slow_checkpoint_ms,
        "inflight_target_ms": inflight_target.map(|t| t.as_millis() as u64),
        "slow_phase_result_latency_ms": slow_percentiles.iter().map(|(q, ms)| serde_json::json!({"percentile": q, "ms": ms})).collect::<Vec<_>>(),
        "peak_lag": peak_lag,
        "burn_down_s": burned,
        "engine_latency": e2e.iter().map(|l| serde_json::json!({
            "subtask": l.owner,
            "markers": l.markers,
            "ingest_to_ack_us_since_start": { "p50": l.ingest[4], "p99": l.ingest[5], "p999": l.ingest[6], "max": l.ingest[7] },
            "event_to_ack_us_since_start": { "p50": l.event[4], "p99": l.event[5], "p999": l.event[6], "max": l.event[7] },
        })).collect::<Vec<_>>(),
        "result_latency_ms": percentiles.iter().map(|(q, ms)| serde_json::json!({"percentile": q, "ms": ms})).collect::<Vec<_>>(),
        "verdict": v.checks.iter().map(|(what, ok)| serde_json::json!({"check": what, "ok": ok})).collect::<Vec<_>>(),
        "ok": v.checks.iter().all(|c| c.1),
        "samples": samples,
    });
    let _ = std::fs::write(&json, serde_json::to_string_pretty(&report).expect("json"));
    println!(
        "\nresult latency (window end → sink), ms: p50 {:.0}, p90 {:.0}, p99 {:.0}, p99.9 {:.0}, max {:.0}",
        percentiles[0].1, percentiles[1].1, percentiles[2].1, percentiles[3].1, percentiles[4].1
    );
    println!(
        "slow phase ({}): result latency p50 {:.0}, p99 {:.0}, max {:.0} ms; checkpoints there took up to {slow_checkpoint_max:.0} ms \
         (in-flight target {})",
        phase_bounds[slow].0,
        slow_percentiles[0].1,
        slow_percentiles[2].1,
        slow_percentiles[4].1,
        inflight_target.map_or("off".to_owned(), |t| format!("{} ms", t.as_millis())),
    );
    println!(
        "files: {} (timeline), {} (latency histogram), {} (summary)",
        png.display(),
        hgrm.display(),
        json.display()
    );
    if v.checks.iter().all(|c| c.1) { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
