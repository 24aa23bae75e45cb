//! The io_uring HTTP POST sink against the slow REST API (`weir-slow-api`, in process).

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::{Backoff, BodyFormat, HttpSink, HttpSinkConfig, HttpSinkStats};
use weir::operators::builtin::{Generator, Tally};
use weir::ring::counters::CountersReader;
use weir::runtime::{JobError, JobSummary};
use weir_tools::slow_api::{SlowApi, SlowApiConfig};
use weir_tools::stat::StatView;

/// Run `job`, failing the test if it has not ended after `limit` (a watchdog, not a speed test).
fn run(job: &Job, limit: Duration) -> Result<JobSummary, JobError> {
    let running = job.start().expect("job starts");
    let deadline = Instant::now() + limit;
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not end in {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    running.wait()
}

fn api(config: SlowApiConfig) -> SlowApi {
    SlowApi::start(SlowApiConfig { max_run: Duration::from_secs(300), ..config }).expect("the slow API starts")
}

/// Short backoff, so retries do not make the tests slow.
fn sink_config(api: &SlowApi) -> HttpSinkConfig {
    HttpSinkConfig {
        backoff: Backoff { min_delay: Duration::from_millis(1), max_delay: Duration::from_millis(20) },
        key_prefix: "test".into(),
        ..HttpSinkConfig::new(api.url("/ingest"))
    }
}

/// generator (2) -> rebalance -> HTTP sink (2): the API fails every 7th request with 503 and
/// loses the answer to every 11th (it records the batch, then closes the connection). The sink
/// retries both with the same idempotency key; the API drops the retries of lost answers as
/// duplicates; so it counts every record exactly once (count and seq checksums).
#[test]
fn every_record_arrives_once_despite_503s_and_lost_answers() {
    const N: u64 = 40_000;
    let api = api(SlowApiConfig {
        latency: Duration::from_millis(1),
        fail_every: Some(7),
        lose_response_every: Some(11),
        ..Default::default()
    });
    let config = HttpSinkConfig { batch_records: 50, ..sink_config(&api) };
    let stats = config.stats.clone();
    let job = Job::new("io-http");
    job.source("gen", 2, |info| Generator::events(info, N, 1000))
        .rebalance()
        .sink("api", 2, move |info| HttpSink::new(config.clone(), info));
    let summary = run(&job, Duration::from_secs(180)).expect("job finishes");
    let seen = api.stop();
    println!("API: {seen:?}\nsink: {stats:?}\n{summary}");

    let (count, sum, squares) = Tally::expected(N);
    assert_eq!((seen.records, seen.seq_sum, seen.seq_square_sum), (count, sum, squares), "exactly once at the API");
    assert!(seen.failed > 0 && seen.lost_responses > 0, "the failures were injected");
    assert_eq!(seen.duplicate_requests, seen.lost_responses, "each lost answer was retried once, and dropped");
    assert_eq!(stats.records_acked.load(Ordering::Relaxed), N);
    assert_eq!(stats.retries.load(Ordering::Relaxed), seen.failed + seen.lost_responses);
    assert_eq!(stats.in_flight.load(Ordering::Relaxed), 0, "nothing outstanding after finish");
    assert!(stats.in_flight_max.load(Ordering::Relaxed) <= 4, "never more than max_in_flight");
}

/// Every 5th request is refused with 400: those batches go to the dead-letter file with the
/// status and the API's reason, the job goes on, and API plus dead letters hold every record
/// exactly once. JSON-array bodies.
#[test]
fn refused_batches_go_to_the_dead_letter_file() {
    const N: u64 = 10_000;
    let dead_letter = std::env::temp_dir().join(format!("weir-io-http-dead-letter-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&dead_letter);
    let api = api(SlowApiConfig { latency: Duration::ZERO, reject_every: Some(5), ..Default::default() });
    let config = HttpSinkConfig {
        batch_records: 40,
        body: BodyFormat::JsonArray,
        dead_letter: Some(dead_letter.clone()),
        ..sink_config(&api)
    };
    let stats = config.stats.clone();
    let job = Job::new("io-http-4xx");
    job.source("gen", 1, |info| Generator::events(info, N, 1000))
        .rebalance()
        .sink("api", 1, move |info| HttpSink::new(config.clone(), info));
    run(&job, Duration::from_secs(120)).expect("a 4xx does not fail the job when dead letters have a file");
    let seen = api.stop();

    let text = std::fs::read_to_string(&dead_letter).expect("the dead-letter file");
    let (mut records, mut sum, mut squares) = (seen.records, seen.seq_sum, seen.seq_square_sum);
    let mut lines = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["status"], 400);
        assert!(v["reason"].as_str().unwrap().contains("400"), "{v}");
        assert!(v["response"].as_str().unwrap().contains("rejected by failure injection"), "{v}");
        assert!(v["idempotency_key"].as_str().unwrap().starts_with("test/api-0/0/"), "{v}");
        let body: Vec<serde_json::Value> = serde_json::from_str(v["body"].as_str().unwrap()).unwrap();
        assert_eq!(body.len() as u64, v["records"].as_u64().unwrap());
        for e in body {
            let seq = e["seq"].as_u64().unwrap();
            records += 1;
            sum = sum.wrapping_add(seq);
            squares = squares.wrapping_add(seq.wrapping_mul(seq));
        }
        lines += 1;
    }
    println!("{lines} batches dead-lettered, {} records accepted", seen.records);
    assert_eq!(lines, seen.rejected, "one dead letter per refused batch");
    assert_eq!(stats.dead_letter_batches.load(Ordering::Relaxed), seen.rejected);
    assert!(seen.rejected > 0 && seen.records > 0);
    assert_eq!((records, sum, squares), Tally::expected(N), "API + dead letters: every record exactly once");
    let _ = std::fs::remove_file(&dead_letter);
}

/// An API that answers 503 to everything: after max_retries the job fails, naming the URL,
/// the status and the idempotency key; a 4xx without a dead-letter file fails it too.
#[test]
fn exhausted_retries_and_unfiled_4xx_fail_the_job() {
    let api = api(SlowApiConfig { latency: Duration::ZERO, fail_every: Some(1), ..Default::default() });
    // One batch in flight, so the first batch is the one that gives up.
    let config = HttpSinkConfig { max_retries: 3, retry_for: Duration::ZERO, max_in_flight: 1, ..sink_config(&api) };
    let job = Job::new("io-http-503");
    job.source("gen", 1, |info| Generator::events(info, 1000, 10))
        .sink("api", 1, move |info| HttpSink::new(config.clone(), info));
    let message = run(&job, Duration::from_secs(60)).expect_err("the API never accepts").to_string();
    println!("{message}");
    assert!(
        message.contains("503") && message.contains("failed 4 times") && message.contains("test/api-0/0/0"),
        "{message}"
    );
    assert!(message.contains(&api.url("/ingest")), "{message}");
    assert_eq!(api.stats().requests, 4, "the first batch, then 3 retries");

    api.set_fail_every(0);
    api.set_reject_every(1);
    let config = sink_config(&api);
    let job = Job::new("io-http-400");
    job.source("gen", 1, |info| Generator::events(info, 1000, 10))
        .sink("api", 1, move |info| HttpSink::new(config.clone(), info));
    let message = run(&job, Duration::from_secs(60)).expect_err("refused, and no dead-letter file").to_string();
    println!("{message}");
    assert!(message.contains("400") && message.contains("no dead_letter"), "{message}");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Backpressure starts at the sink: generator -> rebalance -> HTTP sink (max_in_flight 4).
/// While the API answers in 1 ms, the job flows. When the API slows to 100 ms per call, the
/// sink holds exactly its bound of 4 requests in flight, its `write` blocks, its subtask stops
/// reading, and its input ring fills (median ≥ 90 %), so the generator runs out of credit.
/// When the API recovers, the job finishes and the API has counted every
/// record exactly once.
#[test]
fn slow_api_backpressures_at_the_sink() {
    const N: u64 = 60_000;
    const BOUND: usize = 4;
    let api = api(SlowApiConfig { latency: Duration::from_millis(1), ..Default::default() });
    let config = HttpSinkConfig { batch_records: 20, max_in_flight: BOUND, ..sink_config(&api) };
    let stats: Arc<HttpSinkStats> = config.stats.clone();
    let job = Job::new("io-http-slow");
    let gauge = config.sink_gauge("api");
    job.configure(|c| {
        c.ring_slots = 256;
        c.max_record_bytes = 1024;
        c.sink_gauges.push(gauge);
    });
    job.source("gen", 1, |info| Generator::events(info, N, 1000))
        .rebalance()
        .sink("api", 1, move |info| HttpSink::new(config.clone(), info));
    let running = job.start().expect("job starts");
    let reader = CountersReader::open(running.counters_path()).expect("counters file");
    let deadline = Instant::now() + Duration::from_secs(180);
    let watchdog = |what: &str| assert!(Instant::now() < deadline, "watchdog: {what} within 180 s");

    // Fast phase: wait until records flow.
    while api.stats().records < 2_000 {
        watchdog("records reach the API");
        assert!(!running.is_finished(), "the job ended before the slow phase; raise N");
        std::thread::sleep(Duration::from_millis(5));
    }
    api.set_latency(Duration::from_millis(100));
    let slow_from = Instant::now();
    let (mut in_flight, mut fill, mut gen_bp) = (Vec::new(), Vec::new(), Vec::new());
    let mut published = Vec::new();
    let mut before = reader.snapshot();
    let mut at = Instant::now();
    // Sample the slow state: after 300 ms to settle, 12 samples 100 ms apart.
    while in_flight.len() < 12 {
        watchdog("the slow phase is sampled");
        std::thread::sleep(Duration::from_millis(100));
        let after = reader.snapshot();
        let now = Instant::now();
        let v = StatView::between(&before, &after, (now - at).as_secs_f64());
        (before, at) = (after, now);
        if now - slow_from < Duration::from_millis(300) {
            continue;
        }
        let ring: Vec<f64> = v
            .channels
            .iter()
            .filter(|c| c.owner.ends_with("->api#0"))
            .map(|c| c.backlog as f64 / c.announced.max(1) as f64)
            .collect();
        assert_eq!(ring.len(), 1, "one ring into the sink");
        fill.push(ring[0]);
        in_flight.push(stats.in_flight.load(Ordering::Relaxed) as f64);
        gen_bp.push(v.subtasks.iter().find(|s| s.owner == "gen#0").map_or(0.0, |s| s.backpressured));
        published.extend(v.sinks.iter().cloned());
    }
    let records_slow = api.stats().records;
    api.set_latency(Duration::from_millis(1));
    while !running.is_finished() {
        watchdog("the job finishes after the API recovers");
        std::thread::sleep(Duration::from_millis(20));
    }
    let summary = running.wait().expect("job finishes");
    let seen = api.stop();
    let (in_flight, fill, gen_bp) = (median(&mut in_flight), median(&mut fill), median(&mut gen_bp));
    println!(
        "slow API: in flight (median) {in_flight}, sink input ring fill (median) {fill:.2}, generator backpressured \
         (median) {gen_bp:.2}, records at the API when the slow phase ended {records_slow}; blocked in write {:.2} s\n{summary}",
        stats.blocked.total_ns() as f64 / 1e9
    );
    assert_eq!(in_flight, BOUND as f64, "the sink holds its bound of requests in flight");
    // The counters file says the same: the sink's figures as weir-stat shows them.
    let last = published.last().expect("the sink publishes its figures");
    println!("published: {last:?}");
    assert_eq!(last.node, "api");
    assert_eq!(last.in_flight, BOUND as u64, "requests in flight, in the counters");
    assert!(last.ack_p99_us >= 100_000, "ack latency follows the API's 100 ms: {last:?}");
    assert!(last.blocked > 0.5, "the sink waited for the API most of the time: {last:?}");
    assert!(stats.in_flight_max.load(Ordering::Relaxed) <= BOUND as u64, "and never more");
    assert!(fill >= 0.9, "the sink's input ring fills up to the credit it announces: median fill {fill:.2}");
    // How far upstream it goes (the generator waiting for credit, printed above) is
    // tests/backpressure.rs's subject; this test is about where it starts.
    let (count, sum, squares) = Tally::expected(N);
    assert_eq!((seen.records, seen.seq_sum, seen.seq_square_sum), (count, sum, squares), "exactly once at the API");
    assert_eq!(seen.duplicate_requests, 0);
}

/// Names by content without watermarks (a generator without event time): the records held
/// for a watermark that never comes stay under `max_held_bytes` — the oldest are sent while
/// the job runs, not all at its end — and every record arrives once.
#[test]
fn held_records_without_watermarks_stay_bounded() {
    const N: u64 = 20_000;
    let api = api(SlowApiConfig { latency: Duration::from_millis(1), ..Default::default() });
    let config = HttpSinkConfig { batch_records: 50, max_held_bytes: 16 * 1024, ..sink_config(&api) };
    let job = Job::new("io-http-held");
    job.source("gen", 1, |info| Generator::events(info, N, 1000).with_rate(10_000.0)).sink("api", 1, move |info| {
        HttpSink::new(config.clone(), info).with_record_keys(|e: &weir::record::Event, id: &mut String| {
            id.push_str(&e.seq.to_string());
            e.time_ns / 1_000_000
        })
    });
    let running = job.start().expect("job starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen_while_running = 0;
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not end in 120 s");
        seen_while_running = seen_while_running.max(api.stats().records);
        std::thread::sleep(Duration::from_millis(20));
    }
    running.wait().expect("job finishes");
    let seen = api.stop();
    println!("records at the API while the job ran: {seen_while_running} of {N}");
    assert!(seen_while_running > N / 2, "held records were sent while the job ran: {seen_while_running}");
    let (count, sum, squares) = Tally::expected(N);
    assert_eq!((seen.records, seen.seq_sum, seen.seq_square_sum), (count, sum, squares), "exactly once at the API");
}

/// A hostile server (tools' `hostile_http`) answers every request with a flood meant to grow
/// the sink's response buffer for ever: trailers without end, interim responses without end,
/// 1-byte chunks with long extensions. Each is refused at its bound and the job fails naming
/// it; the sink stopped reading long before the server's 256 MiB per connection.
#[test]
fn hostile_floods_fail_the_job_at_their_bound() {
    use weir_tools::hostile_http::{Attack, HostileServer, MAX_SENT_PER_CONNECTION};
    for (attack, says) in [
        (Attack::TrailerFlood, "trailers over"),
        (Attack::InterimFlood, "interim"),
        (Attack::TinyChunks, "framing over"),
    ] {
        let server = HostileServer::start(attack).unwrap();
        let job = Job::new("hostile");
        job.configure(|c| c.pinning = false);
        let config = HttpSinkConfig {
            max_retries: 1,
            retry_for: Duration::ZERO,
            backoff: Backoff { min_delay: Duration::from_millis(1), max_delay: Duration::from_millis(5) },
            ..HttpSinkConfig::new(server.url("/ingest"))
        };
        job.source("gen", 1, |info| Generator::events(info, 10, 10))
            .sink("api", 1, move |info| HttpSink::new(config.clone(), info));
        let e = run(&job, Duration::from_secs(120)).expect_err("the flood fails the job");
        assert!(e.to_string().contains(says), "{attack:?}: {e}");
        // Two attempts; each connection's flood stopped at the bound plus what the sockets buffer.
        let sent = server.bytes_sent();
        println!("{attack:?}: the server got {sent} bytes out before the sink closed");
        assert!(sent < 2 * MAX_SENT_PER_CONNECTION / 8, "{attack:?}: {sent} bytes were taken in");
    }
}

/// The API is down (nothing listens on its port: every connect is refused) for a while,
/// then comes up: with the defaults (retries for 2 minutes) the sink rides the outage out,
/// blocking meanwhile (at most max_in_flight batches held, retries paced by the backoff)
/// while checkpoints keep completing (what it could not send goes into their state), and
/// the API gets every record exactly once. CI takes a 5 s outage
/// (`WEIR_HTTP_OUTAGE_S` makes it longer: 60 for the case).
#[test]
fn an_api_that_is_down_for_a_while_is_ridden_out() {
    const N: u64 = 20_000;
    let outage = Duration::from_secs(std::env::var("WEIR_HTTP_OUTAGE_S").map_or(5, |v| v.parse().unwrap()));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = HttpSinkConfig {
        batch_records: 100,
        key_prefix: "outage".into(),
        ..HttpSinkConfig::new(format!("http://127.0.0.1:{port}/ingest"))
    };
    let stats = config.stats.clone();
    let chk = std::env::temp_dir().join(format!("weir-io-http-outage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&chk);
    let job = Job::new("io-http-outage");
    job.configure(|c| {
        c.pinning = false;
        c.checkpoints = Some(CheckpointSettings {
            interval: Duration::from_millis(100),
            timeout: Duration::from_secs(1),
            ..CheckpointSettings::new(&chk)
        });
    });
    job.source("gen", 1, |info| Generator::events(info, N, 1000))
        .sink("api", 1, move |info| HttpSink::new(config.clone(), info));
    let running = job.start().expect("job starts");
    std::thread::sleep(outage);
    assert!(!running.has_failed(), "the job rides the outage out");
    let retries_down = stats.retries.load(Ordering::Relaxed);
    // Checkpoints keep completing meanwhile (#46): no barrier waits on the API; what the
    // sink could not send is in their state.
    let during = running.checkpoint_stats();
    println!("during the outage: {} checkpoints completed, failed: {:?}", during.completed.len(), during.failed);
    assert!(during.completed.len() >= 3, "checkpoints complete during the outage: {during:?}");
    assert!(during.failed.is_empty(), "no checkpoint fails during the outage: {:?}", during.failed);
    let api = api(SlowApiConfig { port, latency: Duration::from_millis(1), ..Default::default() });
    let deadline = Instant::now() + outage + Duration::from_secs(120);
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let summary = running.wait().expect("job finishes once the API is back");
    let seen = api.stop();
    println!("outage {outage:?}: {retries_down} retries while down; API: {seen:?}\n{summary}");
    assert!(
        summary.checkpoints.completed.len() > during.completed.len(),
        "a checkpoint completes after the API is back: {:?}",
        summary.checkpoints
    );
    std::fs::remove_dir_all(&chk).unwrap();
    let (count, sum, squares) = Tally::expected(N);
    assert_eq!((seen.records, seen.seq_sum, seen.seq_square_sum), (count, sum, squares), "exactly once at the API");
    // Paced, not spinning: the backoff (10 ms doubling to 1 s) allows about one attempt per
    // second per batch once it is reached.
    let bound = 4 * (outage.as_secs() + 10);
    assert!(retries_down <= bound, "{retries_down} retries in {outage:?}: a busy retry loop");
    assert!(stats.in_flight_max.load(Ordering::Relaxed) <= 4, "never more than max_in_flight");
}

/// A server that reads the request and never answers, while the job's input has gone quiet
/// (no record, no barrier, no end to drive the sink): the request still times out, because
/// the sink's timers run on every pass of its subtask's loop, not only when a record comes.
#[test]
fn a_silent_server_times_out_without_new_input() {
    use weir::operators::{Collector, Source, SourcePoll};
    use weir::record::Event;
    use weir_tools::hostile_http::{Attack, HostileServer};
    /// 100 events (one batch), then idle for ever.
    struct OneBatch(bool);
    impl Source<Event> for OneBatch {
        fn poll(&mut self, out: &mut dyn Collector<Event>) -> Result<SourcePoll, weir::operators::Halt> {
            if std::mem::replace(&mut self.0, true) {
                return Ok(SourcePoll::Idle(Duration::from_millis(50)));
            }
            for seq in 0..100 {
                out.collect(&Event { key: seq, value: 1, time_ns: seq, seq })?;
            }
            Ok(SourcePoll::Emitted(100))
        }
    }
    let server = HostileServer::start(Attack::Silent).unwrap();
    let config = HttpSinkConfig {
        batch_records: 100,
        max_retries: 0,
        retry_for: Duration::ZERO,
        request_timeout: Duration::from_secs(1),
        ..HttpSinkConfig::new(server.url("/ingest"))
    };
    for chained in [true, false] {
        let job = Job::new("silent");
        job.configure(|c| c.pinning = false);
        let events = job.source("one-batch", 1, |_| OneBatch(false));
        // Chained to the source, or behind a ring (its own subtask, input-driven).
        let events = if chained { events } else { events.rebalance() };
        let config = config.clone();
        events.sink("api", 1, move |info| HttpSink::new(config.clone(), info));
        let running = job.start().expect("job starts");
        let deadline = Instant::now() + Duration::from_secs(60);
        // The source never ends: wait for the sink's failure (wait() then stops the rest).
        while !running.is_finished() && !running.has_failed() {
            assert!(Instant::now() < deadline, "watchdog: the silent server's request never timed out");
            std::thread::sleep(Duration::from_millis(20));
        }
        let e = running.wait().expect_err("the request times out");
        assert!(e.to_string().contains("no response within 1.0 s"), "chained {chained}: {e}");
    }
}

/// End-to-end latency through the HTTP sink: markers are timed when the API has answered
/// 2xx for every record written before them (retried batches included), so with an API
/// that takes 30 ms per request and fails every 5th, ingest → acknowledged is at least
/// 30 ms at every quantile; the sink subtask's counters say so while the job runs.
#[test]
fn markers_are_timed_when_the_api_acknowledges() {
    const N: u64 = 6_000;
    let api = api(SlowApiConfig { latency: Duration::from_millis(30), fail_every: Some(5), ..Default::default() });
    let config = HttpSinkConfig { batch_records: 50, ..sink_config(&api) };
    let job = Job::new("io-http-latency");
    job.configure(|c| c.pinning = false);
    job.source("gen", 1, |info| Generator::events(info, N, 100).with_rate(3_000.0)).rebalance().sink(
        "api",
        1,
        move |info| HttpSink::new(config.clone(), info),
    );
    let timed = common::latencies_while_running(&job);
    let seen = api.stop();
    assert_eq!(seen.records, N, "every record at the API");
    let last = timed.last().expect("the HTTP sink timed latency markers");
    for l in &timed {
        assert!(l.ingest[4..].iter().all(|&us| us >= 30_000), "ingest to a 30 ms API's answer below 30 ms: {l:?}");
    }
    println!(
        "{} markers; ingest → 2xx since the start p50 {} µs, p99 {} µs, max {} µs (API 30 ms, every 5th request failed)",
        last.markers, last.ingest[4], last.ingest[5], last.ingest[7]
    );
}
