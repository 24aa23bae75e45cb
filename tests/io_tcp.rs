//! The io_uring TCP sink against a local listener.

use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::io::{Format, TcpSink, TcpSinkConfig};
use weir::operators::builtin::{Generator, Tally};
use weir::record::Event;
use weir::runtime::{JobError, JobSummary};

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

/// Accept `connections` connections on a loopback listener and read each to end-of-file on
/// its own thread; the bytes of each come back on the channel.
fn listen(connections: usize) -> (String, mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for _ in 0..connections {
            let (mut stream, _) = listener.accept().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                stream.read_to_end(&mut bytes).unwrap();
                let _ = tx.send(bytes);
            });
        }
    });
    (address, rx)
}

/// Every connection's bytes, waiting at most `limit` for each (a watchdog).
fn collect(rx: &mpsc::Receiver<Vec<u8>>, connections: usize, limit: Duration) -> Vec<Vec<u8>> {
    (0..connections).map(|_| rx.recv_timeout(limit).expect("watchdog: a connection did not end")).collect()
}

/// generator (2 subtasks) -> TCP sink (2 subtasks, newline-delimited): each subtask's
/// connection carries its records exactly once, in the order the subtask got them, and
/// together the connections carry every record.
#[test]
fn tcp_sink_delivers_every_record_once_in_order_per_subtask() {
    const N: u64 = 300_000;
    let (address, rx) = listen(2);
    let config = TcpSinkConfig::new(address);
    let stats = config.stats.clone();
    let job = Job::new("io-tcp");
    job.source("gen", 2, |info| Generator::events(info, N, 1000))
        .sink("tcp", 2, move |info| TcpSink::new(config.clone(), info));
    let summary = run(&job, Duration::from_secs(120)).expect("job finishes");
    let streams = collect(&rx, 2, Duration::from_secs(60));

    let (mut count, mut sum, mut squares) = (0u64, 0u64, 0u64);
    for bytes in streams {
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.ends_with('\n'), "whole lines only");
        let seqs: Vec<u64> = text
            .lines()
            .map(|l| l.rsplit_once("seq=").and_then(|(_, s)| s.parse().ok()).unwrap_or_else(|| panic!("line `{l}`")))
            .collect();
        let first = seqs[0];
        assert!(first < 2, "a connection starts with its subtask's first record");
        for (i, &seq) in seqs.iter().enumerate() {
            assert_eq!(seq, first + 2 * i as u64, "records in order, none missing, none doubled");
        }
        for seq in seqs {
            count += 1;
            sum = sum.wrapping_add(seq);
            squares = squares.wrapping_add(seq.wrapping_mul(seq));
        }
    }
    assert_eq!((count, sum, squares), Tally::expected(N), "every record exactly once");
    let sends = stats.sends.load(Ordering::Relaxed);
    println!("{N} records in {sends} sends ({:.0} records per send)\n{summary}", N as f64 / sends as f64);
}

/// Length-prefixed framing: each record is a 4-byte big-endian length and the record's
/// encoding; the stream decodes back to exactly the generator's events, in order.
#[test]
fn length_prefixed_framing_round_trips() {
    const N: u64 = 50_000;
    let (address, rx) = listen(1);
    let config = TcpSinkConfig { format: Format::LengthPrefixed, ..TcpSinkConfig::new(address) };
    let job = Job::new("io-tcp-length");
    job.source("gen", 1, |info| Generator::events(info, N, 1000))
        .sink("tcp", 1, move |info| TcpSink::new(config.clone(), info));
    run(&job, Duration::from_secs(120)).expect("job finishes");
    let bytes = collect(&rx, 1, Duration::from_secs(60)).remove(0);

    let keys = 1000;
    let mut at = 0;
    let mut seq = 0u64;
    while at < bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        assert_eq!(len, 32, "an event is 32 bytes");
        let e = <Event as zerocopy::FromBytes>::read_from_bytes(&bytes[at + 4..at + 4 + len]).unwrap();
        let expected = Event {
            key: seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys,
            value: seq % 100 + 1,
            time_ns: seq * 1_000,
            seq,
        };
        assert_eq!(e, expected);
        at += 4 + len;
        seq += 1;
    }
    assert_eq!(seq, N, "every record, in order");
}

/// Nobody listens: after its connection attempts the sink fails the job with a message
/// naming the address and the errno.
#[test]
fn refused_connection_fails_the_job_with_the_cause() {
    let address = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let config = TcpSinkConfig {
        connect_attempts: 3,
        backoff: weir::io::Backoff { min_delay: Duration::from_millis(1), max_delay: Duration::from_millis(5) },
        ..TcpSinkConfig::new(address.clone())
    };
    let stats = config.stats.clone();
    let job = Job::new("io-tcp-refused");
    job.source("gen", 1, |info| Generator::events(info, 1000, 10))
        .sink("tcp", 1, move |info| TcpSink::new(config.clone(), info));
    let message = run(&job, Duration::from_secs(60)).expect_err("nobody listens").to_string();
    println!("the job failed as it should: {message}");
    assert!(message.contains(&address) && message.contains("ECONNREFUSED"), "{message}");
    assert!(message.contains("after 3 attempts"), "{message}");
    assert_eq!(stats.connect_failures.load(Ordering::Relaxed), 3);
}

/// A peer that accepts but never reads: the socket buffers fill, the sink backpressures, and
/// after `send_timeout` the job fails saying the peer took no data (instead of hanging).
#[test]
fn a_peer_that_stops_reading_fails_the_job() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (keep, kept) = mpsc::channel();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let _ = keep.send(stream); // held open by the test, never read
    });
    let config = TcpSinkConfig { send_timeout: Duration::from_millis(500), ..TcpSinkConfig::new(address.clone()) };
    let job = Job::new("io-tcp-stalled");
    job.source("gen", 1, |info| Generator::events(info, u64::MAX, 10))
        .sink("tcp", 1, move |info| TcpSink::new(config.clone(), info));
    let message = run(&job, Duration::from_secs(120)).expect_err("the peer never reads").to_string();
    println!("the job failed as it should: {message}");
    assert!(message.contains(&address) && message.contains("has taken no data"), "{message}");
    drop(kept);
}
