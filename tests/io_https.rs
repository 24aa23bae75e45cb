//! The HTTP sink over HTTPS (rustls between its buffers and io_uring) against the slow API
//! behind TLS, with certificates made at test time (`weir_tools::test_pki`): exact and
//! deduplicated as over plain HTTP; a certificate that is not trusted, names another host or
//! has expired fails the job at once with a message naming the cause.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::io::{Backoff, HttpSink, HttpSinkConfig};
use weir::operators::builtin::{Generator, Tally};
use weir::runtime::{JobError, JobSummary};
use weir_tools::slow_api::{SlowApi, SlowApiConfig};
use weir_tools::test_pki::{TestPki, Validity};

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

/// The CA's certificate in a file of this test's own (removed when dropped).
struct CaFile(PathBuf);

impl CaFile {
    fn new(pki: &TestPki, name: &str) -> CaFile {
        let path = std::env::temp_dir().join(format!("weir-io-https-{name}-{}.pem", std::process::id()));
        std::fs::write(&path, pki.ca_pem()).unwrap();
        CaFile(path)
    }
}

impl Drop for CaFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn tls_api(pki: &TestPki, names: &[&str], validity: Validity, config: SlowApiConfig) -> SlowApi {
    SlowApi::start(SlowApiConfig {
        max_run: Duration::from_secs(300),
        tls: Some(pki.server(names, validity)),
        ..config
    })
    .expect("the slow API starts")
}

/// generator (2) -> rebalance -> HTTPS sink (2), the API failing every 7th request with 503
/// and losing the answer to every 11th: every record arrives exactly once (retries keep their
/// idempotency key over new TLS connections), as over plain HTTP.
#[test]
fn https_delivers_every_record_once_despite_503s_and_lost_answers() {
    const N: u64 = 20_000;
    let pki = TestPki::new();
    let ca = CaFile::new(&pki, "exact");
    let api = tls_api(
        &pki,
        &["127.0.0.1"],
        Validity::Current,
        SlowApiConfig {
            latency: Duration::from_millis(1),
            fail_every: Some(7),
            lose_response_every: Some(11),
            ..Default::default()
        },
    );
    let url = api.url("/ingest");
    assert!(url.starts_with("https://"), "{url}");
    let config = HttpSinkConfig {
        batch_records: 50,
        ca_file: Some(ca.0.clone()),
        backoff: Backoff { min_delay: Duration::from_millis(1), max_delay: Duration::from_millis(20) },
        key_prefix: "tls".into(),
        ..HttpSinkConfig::new(url)
    };
    let stats = config.stats.clone();
    let job = Job::new("io-https");
    job.source("gen", 2, |info| Generator::events(info, N, 1000))
        .rebalance()
        .sink("api", 2, move |info| HttpSink::new(config.clone(), info));
    let summary = run(&job, Duration::from_secs(180)).expect("job finishes");
    let seen = api.stop();
    println!("API: {seen:?}\n{summary}");
    assert_eq!((seen.records, seen.seq_sum, seen.seq_square_sum), Tally::expected(N), "exactly once at the API");
    assert!(seen.failed > 0 && seen.lost_responses > 0, "the failures were injected");
    assert_eq!(seen.duplicate_requests, seen.lost_responses, "each lost answer was retried once, and dropped");
    assert_eq!(stats.records_acked.load(Ordering::Relaxed), N);
    assert!(stats.in_flight_max.load(Ordering::Relaxed) <= 4, "never more than max_in_flight");
}

/// One batch to an API whose certificate is `validity` for `names`, trusting the test CA (or
/// the system's store): the job's error. `test` names the CA file (tests run at once).
fn failure(test: &str, names: &[&str], validity: Validity, trust_test_ca: bool) -> String {
    let pki = TestPki::new();
    let ca = CaFile::new(&pki, test);
    let api = tls_api(&pki, names, validity, SlowApiConfig { latency: Duration::ZERO, ..Default::default() });
    let config = HttpSinkConfig {
        ca_file: trust_test_ca.then(|| ca.0.clone()),
        // A retried failure would take minutes to fail the job: certificate failures are not
        // retried at all, so these limits never matter for them.
        retry_for: Duration::from_secs(600),
        ..HttpSinkConfig::new(api.url("/ingest"))
    };
    let job = Job::new("io-https-refused");
    job.source("gen", 1, |info| Generator::events(info, 10, 1000))
        .sink("api", 1, move |info| HttpSink::new(config.clone(), info));
    let error = run(&job, Duration::from_secs(60)).expect_err("the certificate is refused").to_string();
    let seen = api.stop();
    assert_eq!(seen.records, 0, "nothing was sent to a server that did not prove who it is");
    println!("{error}");
    error
}

/// A certificate signed by a CA the sink does not trust (the system's store only).
#[test]
fn an_untrusted_certificate_fails_naming_the_cause() {
    let e = failure("untrusted", &["127.0.0.1"], Validity::Current, false);
    assert!(e.contains("not trusted") && e.contains("ca_file"), "{e}");
}

/// A certificate for another host than the URL's.
#[test]
fn a_certificate_for_another_host_fails_naming_the_cause() {
    let e = failure("other-host", &["api.example.com"], Validity::Current, true);
    assert!(e.contains("does not name the URL's host") && e.contains("api.example.com"), "{e}");
}

/// An expired certificate.
#[test]
fn an_expired_certificate_fails_naming_the_cause() {
    let e = failure("expired", &["127.0.0.1"], Validity::Expired, true);
    assert!(e.contains("expired"), "{e}");
}

/// Settings: a CA file that does not exist or holds no certificate, a client certificate
/// without its key, TLS settings on an http:// URL: each refused before anything runs.
#[test]
fn bad_tls_settings_are_refused_at_setup() {
    let missing =
        HttpSinkConfig { ca_file: Some("/nonexistent/ca.pem".into()), ..HttpSinkConfig::new("https://127.0.0.1:1/") };
    assert!(missing.validate().unwrap_err().to_string().contains("/nonexistent/ca.pem"));
    let empty = std::env::temp_dir().join(format!("weir-io-https-empty-{}.pem", std::process::id()));
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let config = HttpSinkConfig { ca_file: Some(empty.clone()), ..HttpSinkConfig::new("https://127.0.0.1:1/") };
    assert!(config.validate().unwrap_err().to_string().contains("no PEM certificate"));
    std::fs::remove_file(&empty).unwrap();
    let plain = HttpSinkConfig {
        ca_file: Some("/etc/ssl/certs/ca-certificates.crt".into()),
        ..HttpSinkConfig::new("http://127.0.0.1:1/")
    };
    assert!(plain.validate().unwrap_err().to_string().contains("https://"));
}
