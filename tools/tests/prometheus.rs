//! Issue #20 item 1: a real Prometheus server (Debian's `prometheus`, 2.42; `.ci/test`
//! unpacks it and names it in `WEIR_PROMETHEUS`) scrapes a job stuck behind a blocked sink, twice over: through the job's own
//! server ([`MetricsServer`], what `weir run --metrics` starts) and through `weir-stat
//! --serve` in another process. PromQL over Prometheus' HTTP API must then return the lag of
//! each Kafka partition (records produced and not read), the channel into the blocked stage
//! at fill 1.0, and the subtask behind it backpressured.

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weir::graph::Job;
use weir::io::kafka::{Json, KafkaSource, KafkaSourceConfig};
use weir::record::Event;
use weir::telemetry::prometheus::MetricsServer;
use weir_tools::stuck::Gate;

/// A port free now (bound and let go): for the servers that take a port number only.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET `path` from `addr` over HTTP/1.0: the body.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => Ok(body.to_owned()),
        _ => Err(std::io::Error::other(format!("unexpected answer: {text:.300}"))),
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server scraping `targets` every second, in a directory of its own;
/// killed and removed when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    fn start(binary: &Path, targets: &[SocketAddr]) -> Prometheus {
        let dir = std::env::temp_dir().join(format!("weir-prometheus-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: weir\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        Prometheus { child, addr, dir }
    }

    /// An instant query: (labels, value) per series; empty while Prometheus is not up.
    fn query(&self, promql: &str) -> Vec<(serde_json::Value, f64)> {
        let Ok(body) = get(self.addr, &format!("/api/v1/query?query={}", url_encode(promql))) else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(v["status"], "success", "{promql}: {v}");
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap().parse::<f64>().unwrap()))
            .collect()
    }

    /// Query until `ok` holds for the answer (a 90 s watchdog, which names the query, the
    /// last answer and Prometheus' log).
    fn wait_for(
        &self,
        promql: &str,
        ok: impl Fn(&[(serde_json::Value, f64)]) -> bool,
    ) -> Vec<(serde_json::Value, f64)> {
        let t = Instant::now();
        loop {
            let got = self.query(promql);
            if ok(&got) {
                return got;
            }
            if t.elapsed() > Duration::from_secs(90) {
                let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
                let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
                panic!(
                    "watchdog: {promql} never held; last answer {got:?}\nprometheus log (last lines, newest first):\n{tail}"
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A child process killed when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `WEIR_PROMETHEUS`, else `prometheus` on the PATH; in CI one of them must be there.
fn prometheus_binary() -> Option<PathBuf> {
    let found = std::env::var_os("WEIR_PROMETHEUS").map(PathBuf::from).filter(|p| p.is_file()).or_else(|| {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs a Prometheus server: .ci/test unpacks one (WEIR_PROMETHEUS)"
        );
    }
    found
}

#[test]
fn prometheus_scrapes_a_stuck_job_through_both_servers() {
    let Some(binary) = prometheus_binary() else {
        println!("SKIPPED: no Prometheus server (WEIR_PROMETHEUS or `prometheus` on the PATH; .ci/test unpacks one)");
        return;
    };
    // 4,000 records in each of two partitions; the job reads a few hundred and sticks.
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("clicks", 2, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    for i in 0..8_000u64 {
        let payload = format!(r#"{{"key":{},"value":1,"time_ns":{},"seq":{i}}}"#, i % 10, i * 1_000);
        let key = i.to_string();
        let mut record = BaseRecord::to("clicks").key(&key).payload(&payload).partition((i % 2) as i32);
        while let Err((_, r)) = producer.send(record) {
            record = r;
            producer.poll(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(30)).expect("delivered");

    let gate = Gate::new();
    let stuck = gate.sink();
    let job = Job::new("prom-stuck");
    job.configure(|c| {
        c.pinning = false;
        c.ring_slots = 64;
        c.max_record_bytes = 256;
    });
    let config = KafkaSourceConfig { batch_records: 50, ..KafkaSourceConfig::new(&bootstrap, "clicks") };
    let lag = config.lag_gauge("clicks");
    job.configure(|c| c.lag_gauges.push(lag));
    job.source("clicks", 1, move |info| KafkaSource::new(config.clone(), info, Json::<Event>::default()))
        .rebalance()
        .map("m", |e: &Event| *e)
        .sink("out", 1, move |_| stuck.clone());
    let mut running = job.start().unwrap();
    let gate = gate; // dropped before the job, however the test ends (see `Gate`)

    // The job's own server (what `weir run --metrics` starts), and weir-stat's.
    let own = MetricsServer::start("127.0.0.1:0", running.counters_path()).expect("metrics server");
    let stat_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _stat = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_weir-stat"))
            .arg(running.counters_path())
            .arg("--serve")
            .arg(stat_addr.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("weir-stat starts"),
    );
    let page = get(own.local_addr(), "/metrics").expect("the job's own server answers");
    assert!(page.contains("weir_job_up{weir_job=\"prom-stuck\"} 1"), "{page}");

    let prom = Prometheus::start(&binary, &[own.local_addr(), stat_addr]);
    // Both targets up.
    prom.wait_for("up{job=\"weir\"}", |r| r.len() == 2 && r.iter().all(|(_, v)| *v == 1.0));
    // The channel into the blocked stage is full, as both servers tell.
    let full = prom.wait_for("weir_channel_fill_ratio{weir_job=\"prom-stuck\",receiver=\"m#0\"}", |r| {
        r.len() == 2 && r.iter().all(|(_, v)| *v == 1.0)
    });
    assert!(full.iter().all(|(m, _)| m["sender"] == "clicks#0" && m["channel"] == "clicks#0->m#0"), "{full:?}");
    // Each partition's lag: most of its 4,000 records are still in Kafka.
    let lag = prom.wait_for("weir_source_lag_records{weir_job=\"prom-stuck\",node=\"clicks\"}", |r| {
        r.len() == 4 && r.iter().all(|(_, v)| *v > 1_000.0 && *v <= 4_000.0)
    });
    let mut partitions: Vec<&str> = lag.iter().map(|(m, _)| m["partition"].as_str().unwrap()).collect();
    partitions.sort_unstable();
    assert_eq!(partitions, ["0", "0", "1", "1"], "{lag:?}");
    // The source is backpressured most of the time (a rate over the scrapes: counters work).
    prom.wait_for(
        "rate(weir_subtask_backpressured_seconds_total{weir_job=\"prom-stuck\",subtask=\"clicks#0\"}[5s])",
        |r| r.len() == 2 && r.iter().all(|(_, v)| *v > 0.5),
    );
    // Every sink subtask's end-to-end latency is exported (the stuck sink has timed no
    // marker: everything it was given is still in its write).
    prom.wait_for("weir_sink_latency_markers_total{weir_job=\"prom-stuck\",node=\"out\",index=\"0\"}", |r| {
        r.len() == 2 && r.iter().all(|(_, v)| *v == 0.0)
    });
    prom.wait_for("weir_sink_ingest_latency_seconds{weir_job=\"prom-stuck\",node=\"out\"}", |r| r.len() == 2 * 4);
    drop(prom);
    drop(gate);
    running.cancel();
    let _ = running.wait();
    drop(own);
}
