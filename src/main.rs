//! The `weir` command: validate and run job files, and run the demo.
//!
//! Exit codes: [`weir::util::exit::Exit`] (0 ok, 1 the job failed, 2 usage, 69 a dependency
//! is unavailable: Kafka or PostgreSQL unreachable or refusing us, 75 a stop did not finish
//! within `stop_timeout_ms`, 78 bad configuration: a bad job file, checkpoint directory or
//! client setting, a PostgreSQL table, column or type that does not fit, 128 + the signal
//! that stopped the job), also the reference page `weir::guide::reference::exit_codes`.
//! Control-plane messages go to stderr through `tracing`; `RUST_LOG` filters them.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// weir: a zero-copy streaming dataplane for one multicore host.
#[derive(Parser, Debug)]
#[command(name = "weir", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How control-plane events (checkpoints, restores, rescales, failures) are logged on
    /// stderr: `text` for people, `json` (one object per line, with `event`, `job` and the
    /// event's fields) for log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a job file and show how it would run (chains, exchanges); exit 78 if it is bad.
    Validate {
        /// The job file (TOML).
        file: PathBuf,
    },
    /// Run a job file until its sources end; watch it live with `weir-stat`. Ctrl-C (SIGINT)
    /// or SIGTERM stops it cleanly (no new checkpoint, its run directory removed; the next
    /// run resumes from the last checkpoint); a second one exits at once.
    Run {
        /// The job file (TOML).
        file: PathBuf,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        /// Serve the job's counters to Prometheus at http://ADDR/metrics: PORT (on
        /// 127.0.0.1), HOST:PORT or [IPv6]:PORT (e.g. 9464).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        /// Run as this instance of several that share the job: they form the Kafka consumer
        /// group `[job] group` on the job's first Kafka source, each serves the partitions it
        /// is given, and state moves through `[job] checkpoint_store` (see the README,
        /// "More than one host"). `${WEIR_INSTANCE}` in the job file is this name.
        #[arg(long, value_name = "NAME")]
        instance: Option<String>,
        /// Start from this savepoint (`weir savepoint`, `weir stop --savepoint`): a job of
        /// another version may restore it (see "Upgrading a job"). A restart with the same
        /// flag resumes from the job's own newer checkpoints instead.
        #[arg(long, value_name = "DIR")]
        from_savepoint: Option<PathBuf>,
        /// Restore even if the checkpoint or savepoint holds state this job has no node for
        /// (or a keyed state it no longer declares): that state is dropped.
        #[arg(long)]
        allow_dropped_state: bool,
    },
    /// Take a savepoint of a running job into DIR (new or empty; never pruned): a
    /// checkpoint on its own, to start this or another version of the job from
    /// (`weir run --from-savepoint DIR`). The job goes on. Prints the savepoint as JSON.
    Savepoint {
        /// The job's run directory (`weir run` prints it; `weir-stat` reads its counters file).
        run_dir: PathBuf,
        /// Where the savepoint goes.
        dir: PathBuf,
    },
    /// Stop a running job at a savepoint: sources emit nothing after its barrier, sinks
    /// commit what it covers, then the job stops (its `weir run` exits 0). A new version
    /// started from it begins exactly where this one ended.
    Stop {
        /// Where the savepoint goes (new or empty).
        #[arg(long, value_name = "DIR")]
        savepoint: PathBuf,
        /// The job's run directory.
        run_dir: PathBuf,
    },
    /// Look inside a checkpoint or savepoint of a job that is not running.
    State {
        #[command(subcommand)]
        command: StateCommand,
    },
    /// A live terminal view of a running job's graph (the `weir-top` program beside this
    /// one; `cargo run --release -p weir-tools --bin weir-top` builds and runs it): stages
    /// with busy / backpressured / idle and Flink's levels, channel fill, lag, checkpoints.
    #[command(disable_help_flag = true)]
    Top {
        /// Passed to `weir-top` (a job's counters file or run directory; default: the newest).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The demo (the `weir-demo` program beside this one): clicks into an embedded Kafka, a
    /// REST API that slows down and recovers, a verdict. `cargo run --release -p weir-demo`
    /// builds and runs it; its options follow `demo` (`weir demo --help` lists them).
    #[command(disable_help_flag = true)]
    Demo {
        /// Passed to `weir-demo`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// `weir state ...`.
#[derive(Subcommand, Debug)]
enum StateCommand {
    /// What a checkpoint or savepoint holds: its job and fingerprint, and per node its
    /// operator, parallelism, subtasks, key groups, bytes and state schema.
    Ls {
        /// A savepoint's directory, a checkpoint directory (its newest checkpoint) or one of
        /// its `chk-<n>` directories.
        path: PathBuf,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// One node's state as JSON lines: a window's windows (key, start, end, accumulator), a
    /// keyed operator's keyed state (key, state, value), other operators' bytes.
    Dump {
        /// A savepoint's directory, a checkpoint directory or one of its `chk-<n>`.
        path: PathBuf,
        /// The node.
        #[arg(long)]
        node: String,
        /// Only this key's state (a window's key is a number; a keyed state's key as JSON).
        #[arg(long)]
        key: Option<String>,
    },
}

use weir::util::exit::Exit;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Control-plane logging (checkpoints, recovery) on stderr; RUST_LOG=weir=debug shows more.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("weir=info"));
    JSON_LOGS.store(cli.log_format == LogFormat::Json, Ordering::Relaxed);
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(false).init(),
    }
    match cli.command {
        Command::Validate { file } => match weir::graph::jobfile::load(&file) {
            Ok(loaded) => match loaded.job.describe() {
                Ok(plan) => {
                    println!("{}: ok", file.display());
                    print!("{plan}");
                    Exit::Ok.into()
                }
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    Exit::Config.into()
                }
            },
            Err(e) => {
                eprintln!("{e}");
                Exit::Config.into()
            }
        },
        Command::Run { instance: Some(_), from_savepoint: Some(_), .. } => {
            eprintln!(
                "--from-savepoint does not apply to an instance: instances restore their partitions from the \
                 checkpoint store (see \"Upgrading a job\", Instances)"
            );
            ExitCode::from(2)
        }
        Command::Run { instance: Some(name), file, allow_dropped_state, .. } => {
            run_instance(&file, &name, allow_dropped_state)
        }
        Command::Savepoint { run_dir, dir } => savepoint(&run_dir, &dir, false),
        Command::Stop { savepoint: dir, run_dir } => savepoint(&run_dir, &dir, true),
        Command::State { command } => state(command),
        Command::Run { file, json, metrics, instance: None, from_savepoint, allow_dropped_state } => {
            // A bad address or a port in use is refused before the job starts.
            let metrics = match metrics.map(|a| weir::telemetry::prometheus::MetricsListener::bind(&a)).transpose() {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("{e}");
                    return Exit::Usage.into();
                }
            };
            let loaded = match weir::graph::jobfile::load(&file) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("{e}");
                    return Exit::Config.into();
                }
            };
            if from_savepoint.is_some() || allow_dropped_state {
                let mut missing = false;
                loaded.job.configure(|c| match &mut c.checkpoints {
                    Some(k) => {
                        k.from_savepoint = from_savepoint.clone();
                        k.allow_dropped_state = allow_dropped_state;
                    }
                    None => missing = true,
                });
                if missing {
                    eprintln!(
                        "{}: --from-savepoint and --allow-dropped-state need checkpoints: set checkpoint_dir in [job]",
                        file.display()
                    );
                    return Exit::Config.into();
                }
            }
            let stop = match stop_on_signals() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("cannot handle SIGINT/SIGTERM: {e}");
                    return Exit::Failed.into();
                }
            };
            let mut running = match loaded.job.start() {
                Ok(r) => r,
                // A checkpoint directory that cannot be used is a configuration problem.
                Err(e @ weir::runtime::StartError::Checkpoint { .. }) => {
                    eprintln!("cannot start {}: {e}", file.display());
                    return Exit::Config.into();
                }
                Err(e) => {
                    eprintln!("cannot start {}: {e}", file.display());
                    return Exit::Failed.into();
                }
            };
            // (A restore and each node restored at another parallelism are logged as events.)
            say(&running.budget().to_string());
            say(&format!("live counters: weir-stat {}", running.counters_path().display()));
            if loaded.job.config().checkpoints.is_some() {
                say(&format!("savepoints: weir savepoint {} <dir>", running.run_dir().display()));
            }
            let _metrics = match metrics.map(|m| m.serve(running.counters_path())).transpose() {
                Ok(server) => {
                    if let Some(s) = &server {
                        say(&format!("Prometheus metrics: http://{}/metrics", s.local_addr()));
                    }
                    server
                }
                Err(e) => {
                    // The counters file cannot be read back: stop the job rather than run it
                    // unwatched when watching was asked for.
                    eprintln!("{e}");
                    running.cancel();
                    let _ = running.wait();
                    return Exit::Failed.into();
                }
            };
            let mut progress = Progress::new(&loaded.bounded, running.counters_path());
            let mut stopping = false;
            while !running.is_finished() && !running.has_failed() {
                if stop.load(Ordering::Relaxed) != 0 {
                    stopping = true;
                    break;
                }
                if let Some(p) = &mut progress {
                    p.tick();
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if let Some(p) = progress {
                p.finish();
            }
            let ended = if stopping {
                say(&format!(
                    "stopping the job, within {} (a second signal exits at once)",
                    weir::util::duration_text(loaded.job.config().stop_timeout)
                ));
                running.stop()
            } else {
                running.wait()
            };
            match ended {
                Ok(summary) => {
                    if let Some(sp) = summary.checkpoints.savepoints.iter().rev().find(|s| s.stopped) {
                        say(&format!("job stopped at savepoint {} ({})", sp.id, sp.dir.display()));
                    }
                    if json {
                        println!("{}", serde_json::to_string_pretty(&summary).expect("summaries serialize"));
                    } else {
                        println!("{summary}");
                        for (id, tally) in &loaded.tallies {
                            let (count, sum, _) = tally.totals();
                            println!("sink {id}: {count} events, seq checksum {sum}");
                        }
                    }
                    Exit::Ok.into()
                }
                Err(weir::runtime::JobError::Cancelled) => {
                    let signal = stop.load(Ordering::Relaxed);
                    say(&format!("job stopped by signal {signal}"));
                    Exit::Signal(signal as u8).into()
                }
                Err(e @ weir::runtime::JobError::StopTimedOut { .. }) => {
                    say(&format!("{e}"));
                    Exit::StopTimedOut.into()
                }
                Err(e) => {
                    say(&format!("job failed: {e}"));
                    // A Kafka source or sink that cannot reach or authenticate to its brokers:
                    // a dependency is unavailable; a setting librdkafka refused: configuration.
                    use weir::io::kafka::{KafkaConnectorError, KafkaErrorKind};
                    if let weir::runtime::JobError::Failed { error, .. } = &e
                        && let Some(k) = error.downcast_ref::<KafkaConnectorError>()
                    {
                        match k.kind {
                            KafkaErrorKind::Unavailable | KafkaErrorKind::Refused => {
                                return Exit::Unavailable.into();
                            }
                            KafkaErrorKind::Config => return Exit::Config.into(),
                            KafkaErrorKind::Failed => {}
                        }
                    }
                    // The PostgreSQL sink: the server unreachable or refusing us (69), a setting
                    // that does not fit the server or the records (78).
                    use weir::io::postgres::{PostgresErrorKind, PostgresSinkError};
                    if let weir::runtime::JobError::Failed { error, .. } = &e
                        && let Some(p) = error.downcast_ref::<PostgresSinkError>()
                    {
                        match p.kind {
                            PostgresErrorKind::Unavailable | PostgresErrorKind::Refused => {
                                return Exit::Unavailable.into();
                            }
                            PostgresErrorKind::Config => return Exit::Config.into(),
                            PostgresErrorKind::BadRecord | PostgresErrorKind::Failed => {}
                        }
                    }
                    Exit::Failed.into()
                }
            }
        }
        Command::Demo { args } => beside("weir-demo", "cargo run --release -p weir-demo --", &args),
        Command::Top { args } => beside("weir-top", "cargo run --release -p weir-tools --bin weir-top --", &args),
    }
}

/// `weir savepoint`, `weir stop --savepoint`: ask the job in `run_dir` for a savepoint.
fn savepoint(run_dir: &std::path::Path, dir: &std::path::Path, stop: bool) -> ExitCode {
    match weir::runtime::control::request_savepoint(run_dir, dir, stop) {
        Ok(taken) => {
            println!("{}", serde_json::to_string(&taken).expect("a savepoint serializes"));
            say(&format!(
                "savepoint {} written to {} ({} bytes){}; start a job from it with `weir run --from-savepoint {} <job file>`",
                taken.id,
                taken.dir.display(),
                taken.bytes,
                if taken.stopped { ", the job stopped at it" } else { "" },
                taken.dir.display()
            ));
            ExitCode::SUCCESS
        }
        Err(e @ weir::runtime::control::ControlError::Unreachable { .. }) => {
            eprintln!("{e}");
            Exit::Unavailable.into()
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// `weir state ls|dump`.
fn state(command: StateCommand) -> ExitCode {
    use weir::runtime::inspect;
    let path = match &command {
        StateCommand::Ls { path, .. } | StateCommand::Dump { path, .. } => path.clone(),
    };
    let opened = match inspect::open(&path) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return Exit::Config.into();
        }
    };
    match command {
        StateCommand::Ls { json, .. } => match inspect::list(&opened) {
            Ok(listing) if json => {
                println!("{}", serde_json::to_string_pretty(&listing).expect("a listing serializes"));
                ExitCode::SUCCESS
            }
            Ok(listing) => {
                print!("{listing}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        StateCommand::Dump { node, key, .. } => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let done = inspect::dump(&opened, &node, key.as_deref(), &mut out);
            let flushed = std::io::Write::flush(&mut out);
            match done.map_err(|e| e.to_string()).and_then(|n| flushed.map(|()| n).map_err(|e| e.to_string())) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Whether stderr carries JSON lines only (`--log-format json`).
static JSON_LOGS: AtomicBool = AtomicBool::new(false);

/// A line of `weir run` for the person (or, with `--log-format json`, the log shipper)
/// watching stderr: as it is, or as a JSON event (`event` "cli").
fn say(line: &str) {
    if JSON_LOGS.load(Ordering::Relaxed) {
        tracing::info!(event = "cli", "{line}");
    } else {
        eprintln!("{line}");
    }
}

/// Progress of the bounded sources of a job file, read from the job's counters file: a bar
/// with rate and ETA on a terminal (indicatif), else a plain line every 10 s and one at the
/// end. Done is what the bounded sources have emitted; the total is a generator's `count`,
/// or for a bounded Kafka source what it has read plus its lag.
struct Progress {
    reader: weir_ring::counters::CountersReader,
    /// (node, total or None: read + lag).
    bounded: Vec<(String, Option<u64>)>,
    bar: Option<indicatif::ProgressBar>,
    started: std::time::Instant,
    last: std::time::Instant,
    last_line: std::time::Instant,
}

impl Progress {
    /// `None` when the job has no bounded source (or its counters cannot be read).
    fn new(bounded: &[(String, Option<u64>)], counters: &std::path::Path) -> Option<Progress> {
        if bounded.is_empty() {
            return None;
        }
        let reader = weir_ring::counters::CountersReader::open(counters).ok()?;
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(0);
            let style = indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40.cyan/blue}] {human_pos}/{human_len} records, {per_sec}, ETA {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> ");
            bar.set_style(style);
            bar
        });
        let now = std::time::Instant::now();
        Some(Progress { reader, bounded: bounded.to_vec(), bar, started: now, last: now, last_line: now })
    }

    /// (done, total) now.
    fn read(&self) -> (u64, u64) {
        use weir::telemetry::counters::CounterKind;
        let (mut done, mut total) = (0u64, 0u64);
        let mut read_by: std::collections::BTreeMap<&str, u64> = Default::default();
        let snapshot = self.reader.snapshot();
        for c in &snapshot {
            match CounterKind::from_type_id(c.type_id) {
                // A source node counts what it emits.
                Some(CounterKind::RecordsOut) => {
                    let node = c.owner.rsplit_once('#').map_or(c.owner.as_str(), |(n, _)| n);
                    if let Some((n, _)) = self.bounded.iter().find(|(n, _)| n == node) {
                        *read_by.entry(n.as_str()).or_default() += c.value;
                    }
                }
                Some(CounterKind::SourceLag) => {
                    let node = c.owner.split_once('[').map_or(c.owner.as_str(), |(n, _)| n);
                    if self.bounded.iter().any(|(n, t)| n == node && t.is_none()) {
                        total += c.value;
                    }
                }
                _ => {}
            }
        }
        for (node, expected) in &self.bounded {
            let read = read_by.get(node.as_str()).copied().unwrap_or(0);
            done += read;
            total += expected.unwrap_or(read);
        }
        (done, total.max(done))
    }

    fn tick(&mut self) {
        if self.last.elapsed() < std::time::Duration::from_millis(200) {
            return;
        }
        self.last = std::time::Instant::now();
        let (done, total) = self.read();
        match &self.bar {
            Some(bar) => {
                bar.set_length(total);
                bar.set_position(done);
            }
            None if self.last_line.elapsed() >= std::time::Duration::from_secs(10) => {
                self.last_line = std::time::Instant::now();
                say(&self.line(done, total));
            }
            None => {}
        }
    }

    fn line(&self, done: u64, total: u64) -> String {
        let s = self.started.elapsed().as_secs_f64();
        let rate = done as f64 / s.max(1e-9);
        let eta = if rate > 0.0 && total > done {
            format!(", ETA {:.0} s", (total - done) as f64 / rate)
        } else {
            String::new()
        };
        format!(
            "progress: {done} of {total} records ({:.1} %) in {s:.1} s, {rate:.0}/s{eta}",
            100.0 * done as f64 / total.max(1) as f64
        )
    }

    fn finish(self) {
        let (done, total) = self.read();
        match &self.bar {
            Some(bar) => {
                bar.set_length(total);
                bar.set_position(done);
                bar.finish();
            }
            None => say(&self.line(done, total)),
        }
    }
}

/// `weir run --instance NAME`: one instance of a job shared by several (`weir::cluster`).
fn run_instance(file: &std::path::Path, name: &str, allow_dropped_state: bool) -> ExitCode {
    let stop = match stop_on_signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot handle SIGINT/SIGTERM: {e}");
            return Exit::Failed.into();
        }
    };
    let load = || {
        let text =
            std::fs::read_to_string(file).map_err(|e| format!("{}: cannot read the job file: {e}", file.display()))?;
        let vars = |var: &str| if var == "WEIR_INSTANCE" { Some(name.to_owned()) } else { std::env::var(var).ok() };
        let loaded = weir::graph::jobfile::parse_with(file, &text, &vars).map_err(|e| e.to_string())?;
        if allow_dropped_state {
            loaded.job.configure(|c| {
                if let Some(k) = &mut c.checkpoints {
                    k.allow_dropped_state = true;
                }
            });
        }
        Ok(loaded)
    };
    use weir::cluster::InstanceError;
    match weir::cluster::run::<String>(name, &load, &stop) {
        Ok(summary) => {
            say(&format!(
                "instance {name} stopped by signal {} after {} generation(s); {} bytes restored, {} published",
                stop.load(Ordering::Relaxed),
                summary.generations,
                summary.restored_bytes,
                summary.published_bytes
            ));
            Exit::Signal(stop.load(Ordering::Relaxed) as u8).into()
        }
        Err(e) => {
            eprintln!("instance {name}: {e}");
            match e {
                InstanceError::Config(_) => Exit::Config,
                InstanceError::Unavailable(_) => Exit::Unavailable,
                InstanceError::Failed(_) => Exit::Failed,
            }
            .into()
        }
    }
}

/// Make SIGINT and SIGTERM set the returned number (the signal's) instead of killing the
/// process; when one is set already, the next exits at once with 128 + the signal.
fn stop_on_signals() -> std::io::Result<Arc<AtomicUsize>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicUsize::new(0));
    let stopping = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        // Registered first: sees `stopping` as the earlier signal left it.
        signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, stopping.clone())?;
        signal_hook::flag::register(signal, stopping.clone())?;
        signal_hook::flag::register_usize(signal, stop.clone(), signal as usize)?;
    }
    Ok(stop)
}

/// `weir demo ...`, `weir top ...`: run `program` from beside this one with the same
/// arguments; where it is not installed, say how to build and run it (`cargo`).
fn beside(program: &str, cargo: &str, args: &[String]) -> ExitCode {
    let found = std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join(program)));
    let Some(path) = found.filter(|p| p.is_file()) else {
        eprintln!(
            "weir: {program} is not installed beside this program; build and run it with `{cargo} {}`",
            args.join(" ")
        );
        return Exit::Usage.into();
    };
    // Become the program (exec): signals reach it as they would reach `weir`, its exit status
    // (a signal's death included) is ours, and no wrapper is left behind when it is killed.
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(&path).args(args).exec();
    eprintln!("weir: cannot run {}: {e}", path.display());
    Exit::Failed.into()
}
