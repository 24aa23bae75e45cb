//! `weir run --metrics ADDR` (issue #20 item 1): the job's counters served to Prometheus
//! while it runs; a bad address or a port in use refused before the job starts, saying
//! what to give. And `weir run`'s progress on bounded input when stderr is no terminal,
//! and its JSON logs. (A real Prometheus server scraping a job: tools/tests/prometheus.rs.)

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn weir_run(metrics: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.arg("run").arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/jobs/slow-sink.toml")).args(["--metrics", metrics]);
    c
}

fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// While the job runs, /metrics holds its series in OpenMetrics text; other paths are 404.
#[test]
fn weir_run_serves_the_jobs_metrics_while_it_runs() {
    let mut child = weir_run("127.0.0.1:0").stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("weir runs");
    // Its stderr, line by line, on a thread (so the pipe never fills).
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let addr: SocketAddr = loop {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) else {
            common::kill_and_clean(&mut child);
            panic!("watchdog: weir run never said where its metrics are: {seen:?}");
        };
        if let Some(url) = line.strip_prefix("Prometheus metrics: http://") {
            break url.trim_end_matches("/metrics").parse().expect("an address");
        }
        seen.push(line);
    };
    let page = get(addr, "/metrics");
    let (head, body) = page.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.") && head.contains(" 200 "), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: application/openmetrics-text"), "{head}");
    for want in [
        "weir_job_up{weir_job=\"slow-sink\"} 1",
        "# TYPE weir_subtask_busy_seconds counter",
        "# TYPE weir_channel_fill_ratio gauge",
        "# TYPE weir_job_memory_budget_bytes gauge",
    ] {
        assert!(body.lines().any(|l| l == want), "no {want:?} in:\n{body}");
    }
    assert!(body.contains("weir_node_records_in_total{weir_job=\"slow-sink\",node=\"slow\",index=\"1\"}"), "{body}");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    assert!(get(addr, "/other").contains(" 404 "));
    let status = common::wait_with_watchdog(child, Duration::from_secs(120)).status;
    assert!(status.success(), "{status:?}");
    // Not a terminal: no bar, a plain progress line at the end (issue #20 item 4).
    let rest: Vec<String> = rx.iter().collect();
    assert!(
        rest.iter().any(|l| l.starts_with("progress: 300000 of 300000 records (100.0 %)")),
        "no final progress line: {rest:?}"
    );
}

/// A port in use and a bad address: exit 2, a message that says what to do, and the job
/// never started (no counters file announced).
#[test]
fn a_port_in_use_or_a_bad_address_is_refused_before_the_job_starts() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    for (addr, says) in [
        (format!("127.0.0.1:{port}"), "the port is in use"),
        ("localhost".to_owned(), "HOST:PORT"),
        ("127.0.0.1:99999".to_owned(), "HOST:PORT"),
    ] {
        let out = common::output_and_clean(weir_run(&addr).stdout(Stdio::piped()).stderr(Stdio::piped()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{addr}: {stderr}");
        assert!(stderr.contains(says), "{addr}: {stderr}");
        assert!(!stderr.contains("live counters"), "{addr}: the job started: {stderr}");
        assert!(out.stdout.is_empty(), "{addr}: {}", String::from_utf8_lossy(&out.stdout));
    }
    drop(taken);
}

/// `weir run --log-format json FILE`: its output, its stderr, and each stderr line parsed
/// (every line must be one JSON object).
fn weir_run_json(file: &std::path::Path) -> (std::process::Output, String, Vec<serde_json::Value>) {
    let out = common::output_and_clean(
        Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["run", "--log-format", "json"])
            .arg(file)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let events = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON object ({e}): {l}")))
        .collect();
    (out, stderr, events)
}

/// `--log-format json` (issue #20 item 7): every line on stderr is one JSON object; the
/// control-plane events carry `event` and `job` (a completed checkpoint its id and
/// duration), and `weir run`'s own lines come as events too.
#[test]
fn json_logs_are_one_event_per_line() {
    let dir = std::env::temp_dir().join(common::unique("weir-json-logs"));
    let _clean = common::RemoveOnDrop(dir.clone());
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("job.toml");
    std::fs::write(
        &file,
        format!(
            "[job]\nname = \"json-logs\"\ncheckpoint_dir = \"{}\"\ncheckpoint_interval_ms = 100\n\n\
             [[source]]\nid = \"events\"\ntype = \"generator\"\ncount = 20000\nkeys = 10\nrate = 20000\n\n\
             [[sink]]\nid = \"n\"\ntype = \"count\"\ninput = \"events\"\n",
            dir.join("chk").display()
        ),
    )
    .unwrap();
    let (out, stderr, events) = weir_run_json(&file);
    assert!(out.status.success(), "{stderr}");
    let complete: Vec<&serde_json::Value> = events.iter().filter(|e| e["event"] == "checkpoint_complete").collect();
    assert!(!complete.is_empty(), "no checkpoint_complete event: {stderr}");
    for e in &complete {
        assert_eq!(e["job"], "json-logs", "{e}");
        assert!(e["checkpoint"].as_u64().is_some() && e["duration_ms"].as_f64().is_some(), "{e}");
        assert_eq!(e["level"], "INFO", "{e}");
    }
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "cli" && e["message"].as_str().is_some_and(|m| m.starts_with("live counters"))),
        "{stderr}"
    );
}

/// A sink that fails is one structured event (`sink_poisoned`, issue #20 item 7) naming the
/// job, the node and the subtask, with the reason; then the job fails (exit 1) as before.
#[test]
fn a_failing_sink_is_one_structured_event() {
    let dir = std::env::temp_dir().join(common::unique("weir-sink-poisoned"));
    let _clean = common::RemoveOnDrop(dir.clone());
    std::fs::create_dir_all(&dir).unwrap();
    // The file sink's directory lies under a regular file: it cannot be made.
    let blocker = dir.join("not-a-directory");
    std::fs::write(&blocker, b"").unwrap();
    let file = dir.join("job.toml");
    std::fs::write(
        &file,
        format!(
            "[job]\nname = \"poisoned\"\n\n\
             [[source]]\nid = \"events\"\ntype = \"generator\"\ncount = 1000\nkeys = 10\n\n\
             [[sink]]\nid = \"parts\"\ntype = \"file\"\ninput = \"events\"\npath = \"{}\"\n",
            blocker.join("parts").display()
        ),
    )
    .unwrap();
    let (out, stderr, events) = weir_run_json(&file);
    assert!(!out.status.success(), "the job should fail: {stderr}");
    let poisoned: Vec<&serde_json::Value> = events.iter().filter(|e| e["event"] == "sink_poisoned").collect();
    assert_eq!(poisoned.len(), 1, "one sink_poisoned event: {stderr}");
    let e = poisoned[0];
    assert_eq!((&e["job"], &e["node"], &e["subtask"]), (&"poisoned".into(), &"parts".into(), &"parts#0".into()), "{e}");
    assert_eq!(e["level"], "ERROR", "{e}");
    assert!(e["message"].as_str().is_some_and(|m| m.contains("not-a-directory")), "the reason names the path: {e}");
}
