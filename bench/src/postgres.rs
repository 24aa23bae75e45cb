//! The PostgreSQL sink into a real server, at each guarantee, against a bare COPY loop to the
//! same server in the same run: rows per second, rows per client CPU-second (this process:
//! the job, or the loop), and the server's CPU per row apart (every `postgres` process on the
//! host, and the children the postmaster reaped). The bare loop is what a hand-written
//! client does: generate the same events, encode them as binary COPY rows directly (no
//! serde), and send one `COPY … FROM STDIN (FORMAT binary)` per batch of the same size over a
//! blocking socket, waiting for each to commit.
//!
//! The server: `WEIR_PG_URL` (as `.ci/test` sets it), or one of the run's own started with
//! `tools/postgres/server.sh` (and removed after). Runs alternate (loop, exactly once, upsert,
//! at least once), three times each; medians reported.

use crate::measure::{Cost, measure};
use crate::median;
use crate::report::{Row, Section};
use bytes::{BufMut, BytesMut};
use postgres_protocol::authentication::sasl;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;
use weir::graph::Job;
use weir::io::postgres::{ConnInfo, Delivery, PostgresSink, PostgresSinkConfig};
use weir::operators::builtin::Generator;
use weir::record::Event;

/// Rows per batch (one COPY), for the sink and the loop alike: sized as the sink's guide
/// says for `exactly_once` — the rows of two checkpoint intervals (a batch prepared in one
/// is committed when the next checkpoint, the first to hold it prepared, completes: 1–2
/// million rows a second here, at 1 s intervals) fit in the subtask's share of
/// `max_prepared_transactions` (32 of the server's 64). With 50,000 rows a batch they did
/// not: batches waited for checkpoints to commit prepared ones, and the checkpoints held
/// those batches' rows (0.39× instead of 0.54× the loop per CPU-second in one run).
const BATCH: usize = 100_000;
/// The target (issue #48): exactly once at ≥ 0.8× the bare loop's rows per client CPU-second.
const TARGET_RATIO: f64 = 0.8;

const SERVER_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/postgres/server.sh");

/// The server's CPU: every `postgres` process's user + system time, and what the postmaster
/// collected from children that ended (backends of connections closed in between), seconds.
fn server_cpu_s() -> f64 {
    let tick = 100.0; // USER_HZ: the kernel's /proc clock, 100 on every Linux port weir runs on
    let mut procs = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let comm = &stat[open + 1..close];
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let pid: u64 = stat[..open].trim().parse().unwrap_or(0);
        // Fields after the comm: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
        procs.push((pid, comm.to_owned(), num(1), num(11) + num(12), num(13) + num(14)));
    }
    let is_pg = |pid: u64| procs.iter().any(|p| p.0 == pid && p.1 == "postgres");
    let mut ticks = 0;
    for (_, comm, ppid, own, children) in &procs {
        if comm == "postgres" {
            ticks += own;
            if !is_pg(*ppid) {
                ticks += children; // the postmaster: its reaped backends
            }
        }
    }
    ticks as f64 / tick
}

/// The server: `WEIR_PG_URL`, or one started for this run (stopped on drop).
struct Server {
    url: String,
    own: Option<std::path::PathBuf>,
}

impl Server {
    fn get() -> Result<Server, String> {
        if let Ok(url) = std::env::var("WEIR_PG_URL") {
            return Ok(Server { url, own: None });
        }
        let dir = std::env::temp_dir().join(format!("weir-bench-pg-{}", std::process::id()));
        let out = Command::new(SERVER_SH)
            .arg("start")
            .env("WEIR_PG_DIR", &dir)
            .output()
            .map_err(|e| format!("cannot run {SERVER_SH}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{SERVER_SH} start failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let said = String::from_utf8_lossy(&out.stdout);
        let url = said.lines().find_map(|l| l.strip_prefix("url=")).ok_or("server.sh said no url")?.to_owned();
        Ok(Server { url, own: Some(dir) })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(dir) = &self.own {
            let _ = Command::new(SERVER_SH).arg("stop").env("WEIR_PG_DIR", dir).output();
        }
    }
}

/// A blocking connection for the loop and for setup: startup and SCRAM (or MD5, or
/// cleartext) authentication with postgres-protocol, plain TCP.
struct Client {
    stream: TcpStream,
    inbox: BytesMut,
}

impl Client {
    fn connect(url: &str) -> Result<Client, String> {
        let info = ConnInfo::parse(url).map_err(|e| e.to_string())?;
        let stream = TcpStream::connect(info.address()).map_err(|e| format!("connect: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(Duration::from_secs(300))).map_err(|e| e.to_string())?;
        let mut c = Client { stream, inbox: BytesMut::new() };
        let mut buf = BytesMut::new();
        frontend::startup_message([("user", info.user.as_str()), ("database", info.dbname.as_str())], &mut buf)
            .map_err(|e| e.to_string())?;
        c.send(&buf)?;
        let password = info.password.clone().unwrap_or_default();
        let mut scram = None;
        loop {
            match c.next()? {
                Message::AuthenticationOk => {}
                Message::AuthenticationCleartextPassword => {
                    buf.clear();
                    frontend::password_message(password.as_bytes(), &mut buf).map_err(|e| e.to_string())?;
                    c.send(&buf)?;
                }
                Message::AuthenticationMd5Password(b) => {
                    let h = postgres_protocol::authentication::md5_hash(
                        info.user.as_bytes(),
                        password.as_bytes(),
                        b.salt(),
                    );
                    buf.clear();
                    frontend::password_message(h.as_bytes(), &mut buf).map_err(|e| e.to_string())?;
                    c.send(&buf)?;
                }
                Message::AuthenticationSasl(_) => {
                    let s = sasl::ScramSha256::new(password.as_bytes(), sasl::ChannelBinding::unsupported());
                    buf.clear();
                    frontend::sasl_initial_response(sasl::SCRAM_SHA_256, s.message(), &mut buf)
                        .map_err(|e| e.to_string())?;
                    c.send(&buf)?;
                    scram = Some(s);
                }
                Message::AuthenticationSaslContinue(b) => {
                    let s = scram.as_mut().ok_or("SCRAM out of order")?;
                    s.update(b.data()).map_err(|e| e.to_string())?;
                    buf.clear();
                    frontend::sasl_response(s.message(), &mut buf).map_err(|e| e.to_string())?;
                    c.send(&buf)?;
                }
                Message::AuthenticationSaslFinal(b) => {
                    scram.as_mut().ok_or("SCRAM out of order")?.finish(b.data()).map_err(|e| e.to_string())?;
                }
                Message::ErrorResponse(_) => return Err("the server refused the connection".into()),
                Message::ReadyForQuery(_) => return Ok(c),
                _ => {}
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stream.write_all(bytes).map_err(|e| format!("send: {e}"))
    }

    fn next(&mut self) -> Result<Message, String> {
        loop {
            if let Some(m) = Message::parse(&mut self.inbox).map_err(|e| e.to_string())? {
                return Ok(m);
            }
            let mut chunk = [0u8; 16384];
            let n = match self.stream.read(&mut chunk) {
                Ok(n) => n,
                // A signal to this process (a child's exit) ends a blocking read early: read again.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("receive: {e}")),
            };
            if n == 0 {
                return Err("the server closed the connection".into());
            }
            self.inbox.extend_from_slice(&chunk[..n]);
        }
    }

    /// Wait for `count` ReadyForQuery messages; the first error, if any.
    fn settle(&mut self, mut count: usize) -> Result<(), String> {
        let mut error = None;
        while count > 0 {
            match self.next()? {
                Message::ErrorResponse(_) => error = Some("the server answered with an error".to_owned()),
                Message::ReadyForQuery(_) => count -= 1,
                _ => {}
            }
        }
        error.map_or(Ok(()), Err)
    }

    fn execute(&mut self, sql: &str) -> Result<(), String> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf).map_err(|e| e.to_string())?;
        self.send(&buf)?;
        self.settle(1).map_err(|e| format!("{sql}: {e}"))
    }
}

/// The generator's event `seq` (as `Generator::events(_, _, 1000)` makes it).
fn event(seq: u64) -> Event {
    Event { key: seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 1000, value: seq % 100 + 1, time_ns: seq * 1_000, seq }
}

/// The bare loop: `n` events in COPY batches of `BATCH`, each committed before the next.
fn bare_loop(url: &str, table: &str, n: u64) -> Result<(), String> {
    let mut c = Client::connect(url)?;
    let copy = format!("COPY {table} (key, value, time_ns, seq) FROM STDIN (FORMAT binary)");
    let mut rows = BytesMut::with_capacity(BATCH * 46 + 32);
    let mut out = BytesMut::with_capacity(BATCH * 46 + 256);
    let mut seq = 0;
    while seq < n {
        rows.clear();
        rows.put_slice(b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0");
        let end = (seq + BATCH as u64).min(n);
        for s in seq..end {
            let e = event(s);
            rows.put_i16(4);
            for v in [e.key, e.value, e.time_ns, e.seq] {
                rows.put_i32(8);
                rows.put_i64(v as i64);
            }
        }
        rows.put_i16(-1);
        seq = end;
        out.clear();
        frontend::query(&copy, &mut out).map_err(|e| e.to_string())?;
        frontend::CopyData::new(&rows[..]).map_err(|e| e.to_string())?.write(&mut out);
        frontend::copy_done(&mut out);
        c.send(&out)?;
        c.settle(1)?;
    }
    Ok(())
}

/// `url` without TLS, as the bare loop talks (plain TCP): the server's TLS would otherwise
/// be taken (`sslmode=prefer`, the default), and the sink would pay for encryption the loop
/// does not. A URL that names an `sslmode` keeps it (then the figures say so in `setup`).
fn plain(url: &str) -> String {
    if url.contains("sslmode=") {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&sslmode=disable")
    } else {
        format!("{url}?sslmode=disable")
    }
}

/// The job: a generator of `n` events into the sink at `delivery`; its cost, the rows
/// committed and the rows its checkpoints held (batches not on the server when a
/// checkpoint's part was put).
fn sink_run(url: &str, table: &str, n: u64, delivery: Delivery, run: usize) -> (Cost, u64, u64) {
    let config = PostgresSinkConfig {
        delivery,
        batch_rows: BATCH,
        batch_bytes: 8 << 20,
        transaction_prefix: format!("bench-{}-{run}", std::process::id()),
        ..PostgresSinkConfig::new(&plain(url), table).expect("the connection string")
    };
    let stats = config.stats.clone();
    // Checkpoints every second, as a job that wants exactly once runs: its prepared
    // transactions are committed when each completes.
    let checkpoints = std::env::temp_dir().join(format!("weir-bench-pg-{}-{run}", std::process::id()));
    let _ = std::fs::remove_dir_all(&checkpoints);
    let job = Job::new("bench-postgres");
    job.configure(|c| {
        c.pinning = false;
        c.checkpoints = Some(weir::checkpoint::CheckpointSettings {
            interval: Duration::from_secs(1),
            ..weir::checkpoint::CheckpointSettings::new(&checkpoints)
        });
    });
    job.source("gen", 1, move |info| Generator::events(info, n, 1000))
        .sink("db", 1, move |info| PostgresSink::new(config.clone(), info));
    let (result, cost) = measure(|| job.run());
    let _ = std::fs::remove_dir_all(&checkpoints);
    result.expect("the PostgreSQL job runs");
    (cost, stats.rows_committed.load(Ordering::Relaxed), stats.checkpoint_rows.load(Ordering::Relaxed))
}

/// One measured run: client cost, server CPU seconds.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Rows written.
    n: u64,
    cost: Cost,
    server_cpu_s: f64,
    /// Rows the job's checkpoints held (0 for the bare loop).
    checkpoint_rows: u64,
}

/// `weir-bench postgres`'s command line.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Rows per run of the loop, exactly_once and at_least_once (default 2,000,000; 20,000 in
    /// a smoke run). A job's start (threads, connection, the table's columns, recovery) is a
    /// fixed cost that more rows spread thinner.
    #[arg(long)]
    pub rows: Option<u64>,
    /// Rows per upsert run (default: as --rows, at most 2,000,000: upsert is bound by the
    /// server's CPU, 4–8 µs a row).
    #[arg(long)]
    pub upsert_rows: Option<u64>,
    /// Runs of each kind, alternating; medians reported (default 3; 1 in a smoke run).
    #[arg(long)]
    pub runs: Option<usize>,
}

impl Args {
    /// Every default (what `weir-bench all` runs).
    pub const NONE: Args = Args { rows: None, upsert_rows: None, runs: None };
}

/// The section: each guarantee against the bare loop.
pub fn section(smoke: bool, args: &Args) -> Section {
    let n: u64 = args.rows.unwrap_or(if smoke { 20_000 } else { 2_000_000 });
    let upsert_n: u64 = args.upsert_rows.unwrap_or(n.min(2_000_000));
    let runs = args.runs.unwrap_or(if smoke { 1 } else { 3 });
    let touch_before = crate::measure::page_touch_us();
    let mut s = Section::new("postgres", "PostgreSQL sink vs a bare COPY loop to the same server");
    let server = match Server::get() {
        Ok(s) => s,
        Err(e) => {
            s.rows.push(Row::not_run("PostgreSQL sink, exactly once: rows per client CPU-second", e));
            return s;
        }
    };
    let url = server.url.clone();
    let table = format!("weir_bench_{}", std::process::id());
    let mut admin = Client::connect(&url).expect("connect to the benchmark's server");
    admin
        .execute(&format!(
            "DROP TABLE IF EXISTS {table}, {table}_keyed; CREATE TABLE {table} (key int8, value int8, time_ns int8, \
             seq int8); CREATE TABLE {table}_keyed (key int8, value int8, time_ns int8, seq int8 PRIMARY KEY)"
        ))
        .expect("create the tables");
    let kinds: [(&str, Option<Delivery>); 4] = [
        ("bare COPY loop", None),
        ("exactly_once", Some(Delivery::ExactlyOnce)),
        ("upsert", Some(Delivery::Upsert)),
        ("at_least_once", Some(Delivery::AtLeastOnce)),
    ];
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); kinds.len()];
    for run in 0..runs {
        for (k, (name, delivery)) in kinds.iter().enumerate() {
            let target = if *delivery == Some(Delivery::Upsert) { format!("{table}_keyed") } else { table.clone() };
            admin.execute(&format!("TRUNCATE {target}; CHECKPOINT")).ok();
            let n = if *delivery == Some(Delivery::Upsert) { upsert_n } else { n };
            let server_before = server_cpu_s();
            let (cost, checkpoint_rows) = match delivery {
                None => (measure(|| bare_loop(&url, &target, n)).1, 0),
                Some(d) => {
                    let (cost, committed, held) = sink_run(&url, &target, n, *d, run);
                    assert_eq!(committed, n, "{name}: every row committed");
                    (cost, held)
                }
            };
            let server_cpu_s = server_cpu_s() - server_before;
            let mut count = Client::connect(&url).expect("connect");
            count.execute(&format!("SELECT 1 FROM {target} LIMIT 1")).expect("the table is there");
            println!(
                "postgres {name}: {:.0} rows/s, {:.0} rows per client CPU-s, server {:.2} µs CPU per row, \
                 {checkpoint_rows} rows held by checkpoints",
                cost.per_s(n),
                cost.per_cpu_s(n),
                server_cpu_s * 1e6 / n as f64
            );
            results[k].push(Run { n, cost, server_cpu_s, checkpoint_rows });
        }
    }
    let _ = admin.execute(&format!("DROP TABLE {table}, {table}_keyed"));
    let rate = |r: &[Run]| median(r.iter().map(|x| x.cost.per_s(x.n)).collect());
    let per_cpu = |r: &[Run]| median(r.iter().map(|x| x.cost.per_cpu_s(x.n)).collect());
    let server_us = |r: &[Run]| median(r.iter().map(|x| x.server_cpu_s * 1e6 / x.n as f64).collect());
    let (bare_rate, bare_cpu) = (rate(&results[0]), per_cpu(&results[0]));
    s.rows.push(Row::new("bare COPY loop: rows/s", bare_rate / 1e3, "k rows/s"));
    s.rows.push(Row::new("bare COPY loop: rows per client CPU-second", bare_cpu / 1e3, "k rows/CPU-s"));
    s.rows.push(Row::new("bare COPY loop: server CPU per row", server_us(&results[0]), "µs"));
    for (k, (name, _)) in kinds.iter().enumerate().skip(1) {
        let r = &results[k];
        s.rows.push(
            Row::new(format!("{name}: rows/s"), rate(r) / 1e3, "k rows/s")
                .vs(format!("bare loop {:.0} k/s", bare_rate / 1e3), bare_rate / 1e3),
        );
        let mut row = Row::new(format!("{name}: rows per client CPU-second"), per_cpu(r) / 1e3, "k rows/CPU-s")
            .vs(format!("bare loop {:.0} k/CPU-s", bare_cpu / 1e3), bare_cpu / 1e3);
        if k == 1 {
            row = row.target(format!("≥ {TARGET_RATIO}× the bare loop"), |x| x >= TARGET_RATIO);
        }
        s.rows.push(row);
        s.rows.push(Row::new(format!("{name}: server CPU per row"), server_us(r), "µs"));
    }
    s.setup = json!({
        "rows_per_run": n, "rows_per_upsert_run": upsert_n, "rows_per_batch": BATCH, "runs_each": runs, "max_in_flight": 4,
        "record": "Event (4 × int8)", "server": if server.own.is_some() { "own (tools/postgres/server.sh)" } else { "WEIR_PG_URL" },
        "pinning": false, "tls": if url.contains("sslmode=") { "as WEIR_PG_URL's sslmode says (the bare loop: none)" } else { "none (sslmode=disable; the bare loop: plain TCP)" }, "checkpoint_interval_ms": 1000,
        "fresh_page_touch_us": { "before": touch_before, "after": crate::measure::page_touch_us() },
    });
    s.details = json!(kinds.iter().zip(&results).map(|((name, _), r)| json!({
        "kind": name,
        "runs": r.iter().map(|x| { let mut j = x.cost.json(x.n); j["server_cpu_s"] = json!(x.server_cpu_s); j["checkpoint_rows"] = json!(x.checkpoint_rows); j }).collect::<Vec<_>>(),
    })).collect::<Vec<_>>());
    s
}
