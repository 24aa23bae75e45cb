//! `weir-bench`: run weir's benchmarks and write one report.
//!
//! ```sh
//! cargo run --release -p weir-bench -- all            # everything, into target/weir-bench/report/
//! cargo run --release -p weir-bench -- all --smoke    # tiny sizes: proves it all runs (CI)
//! cargo run --release -p weir-bench -- latency        # one benchmark alone
//! ```
//!
//! `all` starts each benchmark as a child process of this binary (`weir-bench <name>`), so
//! RSS, peak RSS (VmHWM) and getrusage CPU time are that benchmark's alone; each child writes
//! `<out>/sections/<name>.json`, and `all` joins them into `report.json` and `report.md`.

use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use weir_bench::report::{Row, Section, table};

#[derive(Parser, Debug)]
#[command(name = "weir-bench", about = "weir's benchmarks: one command, one report (JSON, markdown, .hgrm)")]
struct Cli {
    /// Tiny sizes: proves every benchmark runs; the figures mean nothing.
    #[arg(long, global = true)]
    smoke: bool,
    /// Where the report goes (default: <target dir>/weir-bench/report).
    #[arg(long, global = true, value_name = "DIR")]
    out: Option<PathBuf>,
    #[command(subcommand)]
    command: Bench,
}

#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
enum Bench {
    /// Every benchmark below, each in its own process, then report.json and report.md.
    All,
    /// Ring micro-benchmarks (runs `cargo bench -p weir-bench --bench ring`): weir vs rtrb vs
    /// crossbeam, round trip vs the cache-line floor.
    Ring,
    /// Stateless chain (chained, unchained) and key_by exchange at p=1 and p=2.
    Pipeline,
    /// Keyed 1 s tumbling count + sum over 10,000 keys with RocksDB state.
    Window,
    /// State backend micro-benchmarks (one RocksDB shard, the write-back cache).
    State,
    /// A sink 100× slower than its source: RSS growth, peak RSS vs budget, backpressured time.
    Backpressure,
    /// Open-loop constant-rate latency, coordinated-omission corrected, with .hgrm files.
    Latency,
    /// Kafka (mock cluster) source → sink vs a bare rdkafka BaseConsumer loop.
    Kafka,
    /// The HTTP sink over plain HTTP and HTTPS: what TLS costs per request.
    Http,
    /// Checkpoints against the latency of the sink's API: 2, 200, 500 ms and hung.
    Stuck,
    /// Nexmark's suite on Nexmark's events, each result exact against a reference:
    /// generator settings, queries and parallelism on the command line.
    Nexmark(weir_bench::nexmark::Args),
    /// Another process → ipc source → forward → ipc sink → that process: throughput and
    /// round trip against in-process source, sink and hop.
    Ipc,
    /// The PostgreSQL sink at each guarantee vs a bare COPY loop to the same server.
    Postgres(weir_bench::postgres::Args),
    /// One job on 1, 2 and 3 `weir --instance` processes (Apache Kafka): throughput, a kill
    /// to the first result of the moved partitions, bytes moved.
    Instances,
}

/// The benchmarks `all` runs, in order.
const ALL: [(Bench, &str); 13] = [
    (Bench::Ring, "ring"),
    (Bench::Pipeline, "pipeline"),
    (Bench::Window, "window"),
    (Bench::State, "state"),
    (Bench::Backpressure, "backpressure"),
    (Bench::Latency, "latency"),
    (Bench::Kafka, "kafka"),
    (Bench::Http, "http"),
    (Bench::Stuck, "stuck"),
    (Bench::Postgres(weir_bench::postgres::Args::NONE), "postgres"),
    (Bench::Nexmark(weir_bench::nexmark::Args::NONE), "nexmark"),
    (Bench::Ipc, "ipc"),
    (Bench::Instances, "instances"),
];

fn name_of(b: &Bench) -> &'static str {
    ALL.iter().find(|(x, _)| std::mem::discriminant(x) == std::mem::discriminant(b)).map_or("all", |(_, n)| n)
}

/// Run one benchmark in this process and write its section.
fn run_one(bench: &Bench, smoke: bool, out: &Path) -> Section {
    let meter = weir_bench::measure::Meter::start();
    let load_start = weir_bench::loadavg();
    let mut section = match bench {
        Bench::Ring => weir_bench::ring::section(smoke, out),
        Bench::Pipeline => weir_bench::pipeline::section(smoke),
        Bench::Window => weir_bench::window::section(smoke),
        Bench::State => weir_bench::state::section(smoke),
        Bench::Backpressure => weir_bench::backpressure::section(smoke),
        Bench::Latency => weir_bench::latency::section(smoke, out),
        Bench::Kafka => weir_bench::kafka::section(smoke),
        Bench::Http => weir_bench::http::section(smoke),
        Bench::Stuck => weir_bench::stuck::section(smoke),
        Bench::Postgres(args) => weir_bench::postgres::section(smoke, args),
        Bench::Nexmark(args) => weir_bench::nexmark::section(smoke, args),
        Bench::Ipc => weir_bench::ipc::section(smoke),
        Bench::Instances => weir_bench::instances::section(smoke),
        Bench::All => unreachable!("`all` runs the others"),
    };
    let cost = meter.stop();
    // The ring figures come from a `cargo bench` child process, whose CPU time is not ours.
    let cpu_s = if *bench == Bench::Ring { None } else { Some(cost.cpu_s) };
    section.run = json!({
        "wall_s": cost.wall_s,
        "cpu_s": cpu_s,
        "loadavg_start": load_start,
        "loadavg_end": weir_bench::loadavg(),
        "smoke": smoke,
    });
    section.write(out).unwrap_or_else(|e| panic!("cannot write the {} section: {e}", section.name));
    section
}

fn main() -> ExitCode {
    // The other process of the ipc benchmark.
    if let Ok(arg) = std::env::var(weir_bench::ipc::PEER_ENV) {
        weir_bench::ipc::peer(&arg);
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    let out = cli.out.clone().unwrap_or_else(|| weir_bench::report_dir().join("report"));
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("cannot create {}: {e}", out.display()));
    if cli.command != Bench::All {
        let s = run_one(&cli.command, cli.smoke, &out);
        println!("\n## {}\n\n{}\n{}", s.title, s.table(), s.markdown);
        println!("written: {}", out.join("sections").join(format!("{}.json", s.name)).display());
        return ExitCode::SUCCESS;
    }
    run_all(cli.smoke, &out)
}

/// Progress of `weir-bench all`: before each benchmark a line with how many are done, the
/// time so far and, when the report directory holds an earlier report of the same size
/// (smoke or not), an ETA from its sections' wall times. Lines, not a bar: each benchmark
/// prints its own output to the same terminal as it runs.
struct Progress {
    started: std::time::Instant,
    smoke: bool,
    /// Each section's wall seconds in the earlier report.
    previous: std::collections::BTreeMap<String, f64>,
    done: Vec<&'static str>,
}

impl Progress {
    fn new(out: &Path, smoke: bool) -> Progress {
        let previous = std::fs::read(out.join("report.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .filter(|r| r["smoke"].as_bool() == Some(smoke))
            .and_then(|r| {
                r["sections"].as_array().map(|all| {
                    all.iter()
                        .filter_map(|s| Some((s["name"].as_str()?.to_owned(), s["run"]["wall_s"].as_f64()?)))
                        .collect()
                })
            })
            .unwrap_or_default();
        Progress { started: std::time::Instant::now(), smoke, previous, done: Vec::new() }
    }

    fn starting(&mut self, name: &'static str) {
        let left: Option<f64> =
            ALL.iter().filter(|(_, n)| !self.done.contains(n)).map(|(_, n)| self.previous.get(*n).copied()).sum();
        let eta = left.map_or(String::new(), |s| format!(", ETA {} from the last report's times", minutes(s)));
        eprintln!(
            "weir-bench: [{}/{}] running {name}{} ({} so far{eta})",
            self.done.len() + 1,
            ALL.len(),
            if self.smoke { " (smoke)" } else { "" },
            minutes(self.started.elapsed().as_secs_f64()),
        );
        self.done.push(name);
    }

    fn done(&self) {
        eprintln!("weir-bench: {} benchmarks in {}", ALL.len(), minutes(self.started.elapsed().as_secs_f64()));
    }
}

/// `12 s`, `3 min 05 s`.
fn minutes(s: f64) -> String {
    let s = s.round() as u64;
    if s < 60 { format!("{s} s") } else { format!("{} min {:02} s", s / 60, s % 60) }
}

fn run_all(smoke: bool, out: &Path) -> ExitCode {
    // A fresh report: no section or histogram of an earlier run may be mistaken for this one's.
    let _ = std::fs::remove_dir_all(out.join("sections"));
    if let Ok(entries) = std::fs::read_dir(out) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "hgrm") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let mut environment = weir_bench::environment();
    environment["smoke"] = json!(smoke);
    let exe = std::env::current_exe().expect("this program's path");
    let mut sections = Vec::new();
    let mut failed = Vec::new();
    let mut progress = Progress::new(out, smoke);
    for (bench, name) in ALL {
        progress.starting(name);
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("--out").arg(out).arg(name);
        if smoke {
            cmd.arg("--smoke");
        }
        let status = cmd.status().expect("start a benchmark process");
        match Section::read(out, name_of(&bench)) {
            Ok(s) if status.success() => sections.push(s),
            result => {
                let why = result.err().unwrap_or_default();
                eprintln!("weir-bench: {name} FAILED ({status}) {why}");
                let mut s = Section::new(name, name);
                s.rows.push(Row::not_run(format!("{name} benchmark"), format!("FAILED: {status}; see its output")));
                sections.push(s);
                failed.push(name);
            }
        }
    }
    progress.done();
    environment["loadavg_end"] = json!(weir_bench::loadavg());

    let report = json!({
        "command": format!("weir-bench all{}", if smoke { " --smoke" } else { "" }),
        "smoke": smoke,
        "environment": environment,
        "sections": sections,
        "failed": failed,
    });
    let json_path = out.join("report.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report).expect("json") + "\n").expect("write report.json");
    let md_path = out.join("report.md");
    std::fs::write(&md_path, markdown(&report, &sections)).expect("write report.md");
    println!("{}", std::fs::read_to_string(&md_path).unwrap_or_default());
    println!("written: {} and {}", md_path.display(), json_path.display());
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("weir-bench: failed: {}", failed.join(", "));
        ExitCode::FAILURE
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "?".into(),
        other => other.to_string(),
    }
}

fn markdown(report: &Value, sections: &[Section]) -> String {
    let env = &report["environment"];
    let mut md = String::from("# weir benchmark report\n\n");
    if report["smoke"] == json!(true) {
        md.push_str("**SMOKE RUN: tiny sizes, the figures mean nothing; it proves every benchmark runs.**\n\n");
    }
    let _ = writeln!(md, "`{}`, {}\n", text(&report["command"]), text(&env["date_utc"]));
    md.push_str("## Environment\n\n| | |\n|---|---|\n");
    let dirty = if env["git_dirty"] == json!(true) { " (dirty working tree)" } else { "" };
    let rows = [
        ("CPU", text(&env["cpu_model"])),
        ("logical cores online", text(&env["cores_online"])),
        ("CPUs available to the run", text(&env["cpus_available"])),
        (
            "load average (1, 5, 15 min) at start / end",
            format!("{} / {}", text(&env["loadavg"]), text(&env["loadavg_end"])),
        ),
        ("nice", text(&env["nice"])),
        ("git revision", format!("{}{dirty}", text(&env["git_short"]))),
        ("rustc", text(&env["rustc"])),
        ("kernel", text(&env["kernel"])),
    ];
    for (k, v) in rows {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    md.push_str(
        "\nEach benchmark ran in its own process. Pinning maps (subtask → CPU), idle strategies, ring \
         slot counts and sizes and record sizes are under each section (and in report.json).\n\n",
    );

    let targets: Vec<Row> =
        sections.iter().flat_map(|s| s.rows.iter().filter(|r| r.target.is_some()).cloned()).collect();
    md.push_str("## Targets\n\n");
    md.push_str(&table(&targets));
    md.push('\n');

    for s in sections {
        let _ = writeln!(md, "## {}\n", s.title);
        if let Some(setup) = s.setup.as_object() {
            for (k, v) in setup {
                let _ = writeln!(md, "- {k}: `{}`", compact(v));
            }
            if !setup.is_empty() {
                md.push('\n');
            }
        }
        if let Some(w) = s.run["wall_s"].as_f64() {
            let cpu =
                s.run["cpu_s"].as_f64().map_or(String::from("CPU in a child process"), |c| format!("{c:.1} s CPU"));
            let _ =
                writeln!(md, "Ran {w:.1} s wall, {cpu}; load average at start {}.\n", text(&s.run["loadavg_start"]));
        }
        md.push_str(&s.table());
        md.push('\n');
        if !s.markdown.is_empty() {
            md.push_str(&s.markdown);
            md.push('\n');
        }
        if !s.files.is_empty() {
            let _ =
                writeln!(md, "Files: {}\n", s.files.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", "));
        }
    }
    md
}

/// A JSON value on one line, strings without quotes.
fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
