//! The PostgreSQL sink against a real server: exactly once and upsert through kill -9 at random
//! moments, server restarts, a server that hangs and one gone for dozens of checkpoints (the
//! sink's batches bounded meanwhile), read back with SQL, each bad setting's error and exit code,
//! rejected rows in the dead-letter file, and backpressure from a slow index.
//!
//! Needs PostgreSQL (`WEIR_PG_URL` and `WEIR_PG_CA`, as `.ci/test` sets them from
//! `tools/postgres/server.sh start`, one server per run); the server-restart test restarts that
//! server with the same script (its directory from `WEIR_PG_DIR`, as it was started), so the
//! tests here run one at a time. Reads back with `psql`. Jobs that are killed run in a child process: this
//! test binary started again with `WEIR_PG_CHILD` set, running only the test `child_process`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir::checkpoint::CheckpointSettings;
use weir::graph::Job;
use weir::io::postgres::{Delivery, PostgresSink, PostgresSinkConfig};
use weir::operators::builtin::Generator;
use weir::record::Event;

const WEIR: &str = env!("CARGO_BIN_EXE_weir");
const SERVER_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/postgres/server.sh");

/// The shared server, or `None` (and the test says it is skipped).
fn server() -> Option<(String, String)> {
    match (std::env::var("WEIR_PG_URL"), std::env::var("WEIR_PG_CA")) {
        (Ok(url), Ok(ca)) => Some((url, ca)),
        _ => {
            println!("SKIPPED: needs PostgreSQL (tools/postgres/server.sh start; WEIR_PG_URL and WEIR_PG_CA not set)");
            None
        }
    }
}

/// Run `sql` with psql; its output, rows as `a|b` lines.
fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql").args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql]).output().unwrap();
    assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A name unique to this test run.
fn unique(what: &str) -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() % 1_000_000_000;
    format!("{what}_{}_{t}", std::process::id())
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("weir-pg-test-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every test here holds it while it runs: the restart test restarts the shared server.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `tools/postgres/server.sh` on the shared server (its directory from `WEIR_PG_DIR`, as
/// `.ci/test` started it): its output.
fn server_sh(args: &[&str]) -> String {
    let out = Command::new(SERVER_SH).args(args).stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "server.sh {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

/// Sets the shared server's `max_prepared_transactions` back (and restarts it) when a test
/// that changed it fails.
struct ResetPrepared;

impl Drop for ResetPrepared {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for args in [&["psql", "-c", "ALTER SYSTEM RESET max_prepared_transactions"][..], &["restart"]] {
            let _ = Command::new(SERVER_SH).args(args).output();
        }
    }
}

// ---- the child job ----

/// Events in the child job.
const CHILD_N: u64 = 40_000;
const CHILD_KEYS: u64 = 500;

/// The child: a generator (paced) into two sinks — every event into `<table>_eo` exactly
/// once (2 subtasks), and per key the latest event into `<table>_up` by upsert (2 subtasks
/// behind a key_by) — checkpointing every 150 ms into the directory it is given.
#[test]
fn child_process() {
    let Ok(dir) = std::env::var("WEIR_PG_CHILD") else { return };
    let url = std::env::var("WEIR_PG_URL").unwrap();
    let table = std::env::var("WEIR_PG_TABLE").unwrap();
    let rate: f64 = std::env::var("WEIR_PG_RATE").map_or(20_000.0, |r| r.parse().unwrap());
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stdout)
        .with_env_filter(tracing_subscriber::EnvFilter::new("weir=warn"))
        .try_init();
    let job = Job::new("pg-child");
    job.configure(|c| {
        c.checkpoints =
            Some(CheckpointSettings { interval: Duration::from_millis(150), ..CheckpointSettings::new(&dir) });
    });
    let config = |suffix: &str, delivery: Delivery| PostgresSinkConfig {
        delivery,
        batch_rows: 700,
        batch_time: Duration::from_millis(50),
        max_in_flight: 3,
        retry_for: Duration::from_secs(60),
        request_timeout: Duration::from_secs(20),
        transaction_prefix: format!("t-{table}"),
        ..PostgresSinkConfig::new(&url, format!("{table}_{suffix}")).unwrap()
    };
    let (eo, up) = (config("eo", Delivery::ExactlyOnce), config("up", Delivery::Upsert));
    let (eo_stats, up_stats) = (eo.stats.clone(), up.stats.clone());
    let events = job.source("gen", 1, move |info| Generator::events(info, CHILD_N, CHILD_KEYS).with_rate(rate));
    events.clone().rebalance().sink("eo", 2, move |info| PostgresSink::new(eo.clone(), info));
    events.key_by("k", |e: &Event| e.key).sink("up", 2, move |info| PostgresSink::new(up.clone(), info));
    let summary = job.run().unwrap();
    println!(
        "CHILD restored_from={:?} completed={} eo_prepared={} eo_committed={} eo_rolled_back={} eo_retries={} up_retries={} eo_connections={} up_connections={}",
        summary.checkpoints.restored_from,
        summary.checkpoints.completed.len(),
        eo_stats.prepared.load(Ordering::Relaxed),
        eo_stats.committed.load(Ordering::Relaxed),
        eo_stats.rolled_back.load(Ordering::Relaxed),
        eo_stats.retries.load(Ordering::Relaxed),
        up_stats.retries.load(Ordering::Relaxed),
        eo_stats.connections.load(Ordering::Relaxed),
        up_stats.connections.load(Ordering::Relaxed),
    );
}

fn child(dir: &Path, url: &str, table: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_process", "--nocapture", "--test-threads=1"])
        .env("WEIR_PG_CHILD", dir)
        .env("WEIR_PG_URL", url)
        .env("WEIR_PG_TABLE", table)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// The tables the child writes into: events (no key: a row written twice would show) and the
/// latest event per key.
fn create_child_tables(url: &str, table: &str) {
    psql(
        url,
        &format!(
            "DROP TABLE IF EXISTS {table}_eo, {table}_up; CREATE TABLE {table}_eo (key int8 NOT NULL, value int8, time_ns \
             int8, seq int8 NOT NULL); CREATE TABLE {table}_up (key int8 PRIMARY KEY, value int8, time_ns int8, seq int8)"
        ),
    );
}

/// Every event once in `<table>_eo`, the latest event of every key in `<table>_up`, and no
/// prepared transaction left behind.
fn check_child_tables(url: &str, table: &str) {
    let got =
        psql(url, &format!("SELECT count(*), count(DISTINCT seq), sum(value), min(seq), max(seq) FROM {table}_eo"));
    let sum: u64 = (0..CHILD_N).map(|s| s % 100 + 1).sum();
    assert_eq!(
        got,
        format!("{CHILD_N}|{CHILD_N}|{sum}|0|{}", CHILD_N - 1),
        "exactly once: count, distinct, sum, min, max"
    );
    let mut latest = std::collections::BTreeMap::new();
    for seq in 0..CHILD_N {
        latest.insert(seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) % CHILD_KEYS, seq);
    }
    let want: Vec<String> = latest.iter().map(|(k, s)| format!("{k}|{s}|{}", s % 100 + 1)).collect();
    let got = psql(url, &format!("SELECT key, seq, value FROM {table}_up ORDER BY key"));
    assert_eq!(got.lines().collect::<Vec<_>>(), want, "upsert: the latest event of every key");
    let left = psql(url, &format!("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 't-{table}/%'"));
    assert_eq!(left, "0", "prepared transactions left behind");
    println!("{CHILD_N} events once in {table}_eo; {} keys at their latest in {table}_up", latest.len());
}

/// What the last child run said; it must have succeeded.
fn last_run(out: std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the last run failed: {stdout}");
    let line = stdout.lines().find_map(|l| l.split_once("CHILD").map(|(_, r)| r)).expect("the child reports");
    println!("last run:{line}");
    line.to_owned()
}

/// kill -9 of the job at random moments, then a run to the end: every event is in the
/// exactly-once table once (prepared transactions of the killed runs committed or rolled
/// back by name, none left), and every key's row in the upsert table is its latest event.
#[test]
fn kill_nine_at_random_moments_leaves_every_row_once() {
    if std::env::var("WEIR_PG_CHILD").is_ok() {
        return;
    }
    let Some((url, _)) = server() else { return };
    let _serial = serial();
    let table = unique("kill");
    create_child_tables(&url, &table);
    let scratch = Scratch::new(&table);
    let mut clock = common::KillClock::from_time();
    const KILLS: usize = 6;
    for _ in 0..KILLS {
        let mut running = child(&scratch.0, &url, &table).env("WEIR_PG_RATE", "8000").spawn().unwrap();
        std::thread::sleep(clock.next_delay(300, 900));
        common::kill_and_clean(&mut running);
    }
    let partial = psql(&url, &format!("SELECT count(*) FROM {table}_eo"));
    println!("{KILLS} kills; {partial} events committed before the last run");
    let out = common::wait_with_watchdog(child(&scratch.0, &url, &table).spawn().unwrap(), Duration::from_secs(180));
    let line = last_run(out);
    assert!(!line.contains("restored_from=None"), "the last run restored a checkpoint: {line}");
    check_child_tables(&url, &table);
    psql(&url, &format!("DROP TABLE {table}_eo, {table}_up"));
}

/// A server without prepared transactions is refused at start (exit 78, the setting named);
/// once it has them, a job whose server restarts twice under it (connections cut in the middle
/// of COPY and PREPARE) still writes every row once, and every key's latest event.
#[test]
fn server_restarts_mid_run_leave_every_row_once() {
    if std::env::var("WEIR_PG_CHILD").is_ok() {
        return;
    }
    let Some((url, _)) = server() else { return };
    let _serial = serial();
    let name = unique("restart");
    let scratch = Scratch::new(&name);
    // Refused: max_prepared_transactions = 0.
    // The server replays its WAL at a restart, prepared transactions included, and cannot
    // with none allowed: roll back what failed tests left, and checkpoint, first.
    let _reset = ResetPrepared;
    let left = psql(&url, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()");
    for gid in left.lines().filter(|g| !g.is_empty()) {
        psql(&url, &format!("ROLLBACK PREPARED '{}'", gid.replace('\'', "''")));
    }
    server_sh(&["psql", "-c", "CHECKPOINT"]);
    server_sh(&["psql", "-c", "ALTER SYSTEM SET max_prepared_transactions = 0"]);
    server_sh(&["restart"]);
    let refused = format!("{name}_refused");
    psql(&url, &format!("CREATE TABLE {refused} (key int8, value int8, time_ns int8, seq int8)"));
    let job = write_job(&scratch.0, "refused", &generator_job(&url, &refused, ""));
    let out = Command::new(WEIR).arg("run").arg(&job).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "exit 78 for a server without prepared transactions: {err}");
    assert!(err.contains("max_prepared_transactions = 0") && err.contains("delivery"), "{err}");
    psql(&url, &format!("DROP TABLE {refused}"));
    server_sh(&["psql", "-c", "ALTER SYSTEM RESET max_prepared_transactions"]);
    server_sh(&["restart"]);

    let table = format!("r{}", std::process::id());
    create_child_tables(&url, &table);
    let mut running = child(&scratch.0.join("checkpoints"), &url, &table).env("WEIR_PG_RATE", "8000").spawn().unwrap();
    for pause in [1500, 1800] {
        std::thread::sleep(Duration::from_millis(pause));
        let started = Instant::now();
        server_sh(&["restart"]);
        println!("server restarted in {:.1} s", started.elapsed().as_secs_f64());
    }
    let out = common::wait_with_watchdog(running_take(&mut running), Duration::from_secs(180));
    let line = last_run(out);
    // A restart ends every connection; whether one had a batch on it at that moment (a retry)
    // depends on the moment. The four subtasks (two per sink) kept writing after the restarts
    // (exactly-once commits at every checkpoint, the last one at the end), so they connected
    // again: more connections than subtasks.
    let field = |name: &str| -> u64 {
        line.split_whitespace().filter_map(|w| w.strip_prefix(name)).next().unwrap().parse().unwrap()
    };
    let connections = field("eo_connections=") + field("up_connections=");
    assert!(connections > 4, "the sinks connected again after the restarts: {line}");
    check_child_tables(&url, &table);
    psql(&url, &format!("DROP TABLE {table}_eo, {table}_up"));
}

/// SIGSTOP or SIGCONT the shared server: the postmaster and every process it started (a
/// server that accepts connections in the kernel and answers nothing).
fn signal_server(signal: i32) {
    let status = server_sh(&["status"]);
    let pid: i32 = status.split_whitespace().find_map(|w| w.strip_prefix("pid=")).unwrap().parse().unwrap();
    let children = Command::new("pgrep").args(["-P", &pid.to_string()]).output().unwrap();
    let mut pids = vec![pid];
    pids.extend(String::from_utf8_lossy(&children.stdout).lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    for p in pids {
        // SAFETY: kill(2) on the test server's own processes.
        unsafe { libc::kill(p, signal) };
    }
}

/// Wakes the shared server again however the test ends.
struct Thaw;

impl Drop for Thaw {
    fn drop(&mut self) {
        signal_server(libc::SIGCONT);
    }
}

/// A server that stops answering under a running exactly-once job (every server process
/// SIGSTOPped, connections still accepted by the kernel): checkpoints go on completing, the
/// first SIGTERM stops the job
/// cleanly (143; past its stop_timeout it would exit 75, a hang would trip the watchdog), and
/// once the server answers again the next run restores the last checkpoint and every row is
/// in the table once, no prepared transaction left.
#[test]
fn a_hung_server_holds_no_stop_and_loses_nothing() {
    if std::env::var("WEIR_PG_CHILD").is_ok() {
        return;
    }
    let Some((url, _)) = server() else { return };
    let _serial = serial();
    let (table, scratch) = events_table(&url, "hung");
    const N: u64 = 20_000;
    let text = format!(
        "[job]\nname = \"{table}\"\ncheckpoint_dir = \"@CKPT@\"\ncheckpoint_interval_ms = 200\nstop_timeout_ms = 20000\n\n\
         [[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = {N}\nkeys = 10\nrate = 4000\n\n\
         [[sink]]\nid = \"db\"\ntype = \"postgres\"\ninput = \"gen\"\nconnection = \"{url}\"\ntable = \"{table}\"\n\
         delivery = \"exactly_once\"\nrequest_timeout_ms = 600000\nretry_for_ms = 600000\n"
    );
    let job = write_job(&scratch.0, "hung", &text);
    let checkpoints = scratch.0.join("hung-checkpoints");
    let run = || Command::new(WEIR).arg("run").arg(&job).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut running = run();
    let t = Instant::now();
    while psql(&url, &format!("SELECT count(*) FROM {table}")) == "0" {
        assert!(running.try_wait().unwrap().is_none(), "weir run ended before a checkpoint committed rows");
        assert!(t.elapsed() < Duration::from_secs(120), "watchdog: no rows committed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(std::fs::read_dir(&checkpoints).unwrap().flatten().any(|e| e.path().join("_manifest.json").is_file()));
    let newest = || {
        std::fs::read_dir(&checkpoints)
            .unwrap()
            .flatten()
            .filter(|e| e.path().join("_manifest.json").is_file())
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
    };
    let thaw = Thaw;
    signal_server(libc::SIGSTOP);
    // Checkpoints go on completing while nothing answers: the sink keeps the rows the server
    // has not made durable in the checkpoint. Then the operator stops the job.
    let frozen_at = newest();
    let t = Instant::now();
    while newest() < frozen_at + 3 {
        assert!(t.elapsed() < Duration::from_secs(60), "watchdog: no checkpoint completed while the server hangs");
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("checkpoints {} to {} completed while the server hung", frozen_at + 1, newest());
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(running.id() as i32, libc::SIGTERM) }, 0);
    let out = common::wait_with_watchdog(running, Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "a clean stop on the first SIGTERM while the server hangs:\n{stderr}");
    drop(thaw);
    let again = common::wait_with_watchdog(run(), Duration::from_secs(180));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "the run after the hang failed:\n{stderr}");
    assert!(stderr.contains("restoring checkpoint"), "the run after the hang restored a checkpoint:\n{stderr}");
    assert_every_row_once(&url, &table, N, &format!("{table}%"));
    psql(&url, &format!("DROP TABLE {table}"));
}

/// A fresh table named for `what` for the generator's events (`seq` NOT NULL), and a scratch
/// directory of the same name.
fn events_table(url: &str, what: &str) -> (String, Scratch) {
    let table = unique(what);
    let scratch = Scratch::new(&table);
    psql(url, &format!("CREATE TABLE {table} (key int8, value int8, time_ns int8, seq int8 NOT NULL)"));
    (table, scratch)
}

/// Start an in-process job `name`: `n` generated events over 100 keys (`rate` a second when
/// given) into one subtask of the sink `config` makes, checkpointing every `interval` into
/// `checkpoints`.
fn start_sink_job(
    name: &str,
    config: PostgresSinkConfig,
    n: u64,
    rate: Option<f64>,
    interval: Duration,
    checkpoints: &Path,
) -> weir::runtime::RunningJob {
    let job = Job::new(name);
    job.configure(|c| {
        c.checkpoints = Some(CheckpointSettings { interval, ..CheckpointSettings::new(checkpoints) });
    });
    job.source("gen", 1, move |info| {
        let events = Generator::events(info, n, 100);
        match rate {
            Some(r) => events.with_rate(r),
            None => events,
        }
    })
    .sink("db", 1, move |info| PostgresSink::new(config.clone(), info));
    job.start().unwrap()
}

/// Wait until `running` ends; the watchdog fails the test past `limit`.
fn wait_finished(running: &weir::runtime::RunningJob, limit: Duration, what: &str) {
    let t = Instant::now();
    while !running.is_finished() {
        assert!(t.elapsed() < limit, "watchdog: {what} ran past {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rows `seq` 0 to `n` - 1 are each in `table` once, and no prepared transaction whose gid is
/// LIKE `gids` is left behind.
fn assert_every_row_once(url: &str, table: &str, n: u64, gids: &str) {
    let got = psql(url, &format!("SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM {table}"));
    assert_eq!(got, format!("{n}|{n}|0|{}", n - 1), "every row once: count, distinct, min, max");
    let left = psql(url, &format!("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE '{gids}'"));
    assert_eq!(left, "0", "prepared transactions left behind");
}

fn running_take(child: &mut std::process::Child) -> std::process::Child {
    // wait_with_watchdog takes the child by value; a spawned one is moved out here.
    std::mem::replace(child, Command::new("true").spawn().unwrap())
}

/// A job file: `count` generated events into `table` with `extra` settings.
fn generator_job(url: &str, table: &str, extra: &str) -> String {
    format!(
        "[job]\nname = \"pg-cli\"\ncheckpoint_dir = \"@CKPT@\"\n\n[[source]]\nid = \"gen\"\ntype = \"generator\"\ncount = 1000\nkeys = 10\n\n\
         [[sink]]\nid = \"db\"\ntype = \"postgres\"\ninput = \"gen\"\nconnection = \"{url}\"\ntable = \"{table}\"\n\
         connect_timeout_ms = 5000\nretry_for_ms = 0\nmax_retries = 0\n{extra}\n"
    )
}

/// Write job file `name` into `dir`, its checkpoints (`@CKPT@`) in a directory of its own there.
fn write_job(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let checkpoints = dir.join(format!("{name}-checkpoints"));
    std::fs::write(&path, text.replace("@CKPT@", &checkpoints.display().to_string())).unwrap();
    path
}

/// `weir run` of a job file: exit code, stderr.
fn weir_run(dir: &Path, name: &str, text: &str) -> (Option<i32>, String) {
    let path = write_job(dir, name, text);
    let child = Command::new(WEIR).arg("run").arg(&path).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let out = common::wait_with_watchdog(child, Duration::from_secs(60));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Each bad setting fails with its exit code (69: the server refused or is not there; 78: a
/// setting that does not fit) and names what to change; good TLS settings work.
#[test]
fn bad_settings_exit_with_the_setting_named() {
    let Some((url, ca)) = server() else { return };
    let _serial = serial();
    let scratch = Scratch::new(&unique("bad"));
    let table = unique("bad");
    psql(
        &url,
        &format!(
            "CREATE TABLE {table} (key int8, value int8, time_ns int8, seq int8, flag boolean); CREATE TABLE \
             {table}_nn (key int8, must text NOT NULL)"
        ),
    );
    let wrong_password = url.replace("weir-secret", "not-the-password");
    let no_port = url.replacen(url.rsplit_once(':').unwrap().1.split('/').next().unwrap(), "1", 1);
    let verify = |mode: &str, ca: &str| format!("{url}?sslmode={mode}{ca}");
    let cases: Vec<(&str, String, String, i32, Vec<&str>)> = vec![
        (
            "password",
            wrong_password.clone(),
            table.clone(),
            69,
            vec!["password authentication failed", "check the password"],
        ),
        ("unreachable", no_port, table.clone(), 69, vec!["has not answered", "retry_for_ms"]),
        ("no table", url.clone(), format!("{table}_missing"), 78, vec!["there is no table", "setting `table`"]),
        ("untrusted", verify("verify-full", ""), table.clone(), 69, vec!["not trusted", "sslrootcert"]),
    ];
    for (what, conn, t, code, words) in cases {
        let (got, err) = weir_run(&scratch.0, what, &generator_job(&conn, &t, ""));
        println!("{what}: exit {got:?}: {}", err.lines().last().unwrap_or(""));
        assert_eq!(got, Some(code), "{what}: {err}");
        for w in words {
            assert!(err.contains(w), "{what}: `{w}` not in: {err}");
        }
    }
    let mapped = |extra: &str| generator_job(&url, &table, extra);
    let cases: Vec<(&str, String, i32, Vec<&str>)> = vec![
        ("no field", mapped("columns = { user = \"key\" }"), 78, vec!["no field `user`", "columns.user"]),
        ("no column", mapped("columns = { key = \"user_id\" }"), 78, vec!["no column `user_id`", "columns.key"]),
        ("type", mapped("columns = { key = \"flag\" }"), 78, vec!["cannot take", "columns.key"]),
        ("not null", generator_job(&url, &format!("{table}_nn"), ""), 78, vec!["`must`", "NOT NULL"]),
        ("upsert without a key", mapped("delivery = \"upsert\""), 78, vec!["no primary key", "key_columns"]),
        (
            "exactly once without checkpoints",
            mapped("").replace("checkpoint_dir = \"@CKPT@\"\n", ""),
            78,
            vec!["takes no checkpoints", "delivery"],
        ),
    ];
    for (what, text, code, words) in cases {
        let (got, err) = weir_run(&scratch.0, what, &text);
        println!("{what}: exit {got:?}: {}", err.lines().last().unwrap_or(""));
        assert_eq!(got, Some(code), "{what}: {err}");
        for w in words {
            assert!(err.contains(w), "{what}: `{w}` not in: {err}");
        }
    }
    // A bad setting the job file refuses before anything runs.
    let (got, err) = weir_run(&scratch.0, "sslmode", &generator_job(&format!("{url}?sslmode=sometimes"), &table, ""));
    assert_eq!(got, Some(78), "{err}");
    assert!(err.contains("sslmode `sometimes`"), "{err}");
    // Good ones: verify-full with the CA, require, a password file; every row written.
    let pass = scratch.0.join("password");
    std::fs::write(&pass, "weir-secret\n").unwrap();
    let no_password = url.replace(":weir-secret@", "@");
    let good = [
        generator_job(&verify("verify-full", &format!("&sslrootcert={ca}")), &table, ""),
        generator_job(&verify("require", ""), &table, ""),
        generator_job(&no_password, &table, &format!("password_file = \"{}\"", pass.display())),
    ];
    for (i, text) in good.iter().enumerate() {
        let (got, err) = weir_run(&scratch.0, &format!("good{i}"), text);
        assert_eq!(got, Some(0), "good settings {i}: {err}");
    }
    assert_eq!(psql(&url, &format!("SELECT count(*), count(DISTINCT seq) FROM {table}")), "3000|1000");
    psql(&url, &format!("DROP TABLE {table}, {table}_nn"));
}

/// Rows the server rejects (a CHECK constraint) go to the dead-letter file with the server's
/// message and the row; the rest is written once. With `on_bad_record = "fail"` the job fails
/// with the server's message instead.
#[test]
fn rejected_rows_are_dead_lettered_with_the_servers_message() {
    let Some((url, _)) = server() else { return };
    let _serial = serial();
    let scratch = Scratch::new(&unique("dead"));
    let table = unique("dead");
    psql(&url, &format!("CREATE TABLE {table} (key int8, value int8 CHECK (value <= 97), time_ns int8, seq int8)"));
    let dead = scratch.0.join("dead.jsonl");
    let extra = format!("on_bad_record = \"dead_letter\"\ndead_letter = \"{}\"\nbatch_rows = 128", dead.display());
    let (got, err) = weir_run(&scratch.0, "dead", &generator_job(&url, &table, &extra));
    assert_eq!(got, Some(0), "{err}");
    // value = seq % 100 + 1: 98, 99 and 100 are refused, 30 of 1000 events.
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&dead).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 30, "one line per rejected row");
    for l in &lines {
        assert_eq!(l["sqlstate"], "23514", "{l}");
        assert!(l["error"].as_str().unwrap().contains("violates check constraint"), "{l}");
        assert!(l["row"]["value"].as_i64().unwrap() > 97, "{l}");
        assert_eq!(l["table"], table.as_str());
    }
    assert_eq!(psql(&url, &format!("SELECT count(*), count(DISTINCT seq), max(value) FROM {table}")), "970|970|97");
    // Fail instead.
    let (got, err) = weir_run(&scratch.0, "fail", &generator_job(&url, &table, "on_bad_record = \"fail\""));
    assert_eq!(got, Some(1), "{err}");
    assert!(err.contains("violates check constraint") && err.contains("on_bad_record"), "{err}");
    psql(&url, &format!("DROP TABLE {table}"));
}

/// A table whose index costs the server real work per row (an expression index over a
/// function that sums a thousand numbers): the sink waits for its batches, the source is
/// backpressured, the sink's batches in flight stay at their bound, RSS stays in the
/// budget, and every row arrives once.
#[test]
fn a_slow_index_backpressures_the_source_within_the_budget() {
    let Some((url, _)) = server() else { return };
    let _serial = serial();
    let table = unique("slow");
    psql(
        &url,
        &format!(
            "CREATE FUNCTION {table}_cost(v int8) RETURNS int8 LANGUAGE sql IMMUTABLE AS $$ SELECT sum(i + v) FROM \
             generate_series(1, 1000) i $$; CREATE TABLE {table} (key int8, value int8, time_ns int8, seq int8); \
             CREATE INDEX ON {table} ({table}_cost(seq))"
        ),
    );
    const N: u64 = 20_000;
    let config = PostgresSinkConfig {
        batch_rows: 250,
        max_in_flight: 2,
        ..PostgresSinkConfig::new(&url, table.clone()).unwrap()
    };
    let stats = config.stats.clone();
    let scratch = Scratch::new(&table);
    let running = start_sink_job("pg-slow", config, N, None, Duration::from_millis(500), &scratch.0);
    let budget = running.budget().total_bytes();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut max_in_flight = 0;
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "watchdog: the job did not finish in 240 s");
        max_in_flight = max_in_flight.max(stats.in_flight.load(Ordering::Relaxed));
        std::thread::sleep(Duration::from_millis(20));
    }
    let summary = running.wait().unwrap();
    let source = summary.subtasks.iter().find(|s| s.name.starts_with("gen")).unwrap();
    let blocked = stats.blocked.total_ns();
    let elapsed = summary.elapsed_ns as f64;
    println!(
        "{N} rows in {:.1} s; sink blocked {:.0} % of the time, batches in flight at most {max_in_flight}; max RSS {} \
         of {}",
        elapsed / 1e9,
        100.0 * blocked as f64 / elapsed,
        summary.max_rss_bytes >> 20,
        budget >> 20
    );
    assert!(blocked > 0, "the sink waited for the server");
    assert!(max_in_flight >= 2, "the sink's batches in flight reached their bound");
    assert!(source.backpressured_ns > 0 || blocked as f64 > 0.5 * elapsed, "the source was held back");
    assert!(summary.max_rss_bytes <= budget, "RSS {} within the budget {budget}", summary.max_rss_bytes);
    assert_eq!(psql(&url, &format!("SELECT count(*), count(DISTINCT seq) FROM {table}")), format!("{N}|{N}"));
    psql(&url, &format!("DROP TABLE {table}; DROP FUNCTION {table}_cost"));
}

/// With time to wait (`checkpoint_wait`), each checkpoint's part names the batches sealed
/// before its barrier once the server has them prepared, and holds none of their rows (a
/// healthy server prepares every batch); the checkpoints complete and every row is in the
/// table once, none left prepared.
#[test]
fn checkpoints_name_prepared_batches_instead_of_holding_rows() {
    if std::env::var("WEIR_PG_CHILD").is_ok() {
        return;
    }
    let Some((url, _)) = server() else { return };
    let _serial = serial();
    let (table, scratch) = events_table(&url, "late");
    const N: u64 = 30_000;
    let config = PostgresSinkConfig {
        batch_rows: 1_000,
        max_in_flight: 3,
        checkpoint_wait: Duration::from_secs(120),
        transaction_prefix: table.clone(),
        ..PostgresSinkConfig::new(&url, &table).unwrap()
    };
    let stats = config.stats.clone();
    let chk = scratch.0.join("checkpoints");
    let running = start_sink_job(&table, config, N, Some(30_000.0), Duration::from_millis(50), &chk);
    wait_finished(&running, Duration::from_secs(180), "the job");
    let summary = running.wait().unwrap();
    let completed = summary.checkpoints.completed.len();
    assert!(completed >= 3, "checkpoints completed: {:?}", summary.checkpoints);
    assert!(summary.checkpoints.failed.is_empty(), "none failed: {:?}", summary.checkpoints.failed);
    assert_eq!(stats.checkpoint_rows.load(Ordering::Relaxed), 0, "no checkpoint held rows");
    assert_every_row_once(&url, &table, N, &format!("{table}/%"));
    println!("{completed} checkpoints, none holding rows; {N} rows once");
    psql(&url, &format!("DROP TABLE {table}"));
}

/// Starts the shared server again however the test ends (after `server.sh kill`). A killed
/// postmaster's backends end on their own, and until the last has, a new postmaster refuses
/// the shared memory they still hold: `start` is tried again for up to a minute.
struct Revive;

impl Drop for Revive {
    fn drop(&mut self) {
        let t = Instant::now();
        loop {
            let out = Command::new(SERVER_SH).arg("start").output().unwrap();
            let up = Command::new(SERVER_SH).arg("status").output().unwrap().status.success();
            if out.status.success() && up {
                return;
            }
            if t.elapsed() > Duration::from_secs(60) {
                assert!(
                    std::thread::panicking(),
                    "the server did not start again after server.sh kill: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// The server gone (its postmaster killed: connections cut, new ones refused) for dozens of
/// checkpoint intervals under an exactly-once job: the sink holds at most twice
/// `max_in_flight` batches taken for barriers, the one a barrier's snapshot then seals and
/// the one whose seal starts the wait, however long the outage lasts — past that it declines
/// each checkpoint and waits — and once the server is back every row is in the table once,
/// none left prepared.
#[test]
fn a_server_gone_for_many_checkpoints_holds_bounded_batches() {
    if std::env::var("WEIR_PG_CHILD").is_ok() {
        return;
    }
    let Some((url, _)) = server() else { return };
    let _serial = serial();
    let (table, scratch) = events_table(&url, "outage");
    const N: u64 = 60_000;
    const MAX_IN_FLIGHT: usize = 2;
    let config = PostgresSinkConfig {
        batch_rows: 200,
        max_in_flight: MAX_IN_FLIGHT,
        retry_for: Duration::from_secs(600),
        max_retries: u32::MAX,
        transaction_prefix: table.clone(),
        ..PostgresSinkConfig::new(&url, &table).unwrap()
    };
    let stats = config.stats.clone();
    let chk = scratch.0.join("checkpoints");
    let running = start_sink_job(&table, config, N, Some(10_000.0), Duration::from_millis(100), &chk);
    let t = Instant::now();
    while psql(&url, &format!("SELECT count(*) FROM {table}")) == "0" {
        assert!(!running.is_finished(), "the job ended before a checkpoint committed rows");
        assert!(t.elapsed() < Duration::from_secs(120), "watchdog: no rows committed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let revive = Revive;
    server_sh(&["kill"]);
    // Thirty checkpoint intervals without a server; the source keeps offering 10,000 rows
    // a second (150 batches' worth), and the sink's batches are sampled all along.
    let (mut most, mut samples) = (0, 0);
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(3) {
        assert!(!running.is_finished(), "the job ended while the server was gone");
        most = most.max(stats.in_flight.load(Ordering::Relaxed));
        samples += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let rows_while_down = stats.rows.load(Ordering::Relaxed);
    drop(revive);
    wait_finished(&running, Duration::from_secs(180), "the job after the outage");
    let summary = running.wait().unwrap();
    let bound = 2 * MAX_IN_FLIGHT as u64 + 2;
    println!(
        "server gone 3 s: at most {most} batches held ({samples} samples, bound {bound}), {rows_while_down} rows \
         taken by then; checkpoints completed {}, failed {}: {:?}",
        summary.checkpoints.completed.len(),
        summary.checkpoints.failed.len(),
        summary.checkpoints.failed.iter().take(3).collect::<Vec<_>>()
    );
    assert!(most <= bound, "batches held while the server was gone: {most}, bound {bound}");
    let last_failed = summary.checkpoints.failed.iter().map(|(id, _)| *id).max().unwrap_or(0);
    let last_completed = summary.checkpoints.completed.last().map_or(0, |c| c.0);
    assert!(last_completed > last_failed, "checkpoints complete again once the server is back: {summary:?}");
    assert!(stats.connections.load(Ordering::Relaxed) >= 2, "the sink connected again after the outage");
    assert_every_row_once(&url, &table, N, &format!("{table}/%"));
    psql(&url, &format!("DROP TABLE {table}"));
}
