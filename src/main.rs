//! The `weir` command: validate and run job files, and run the demo.
//!
//! Exit codes: 0 ok, 1 the job failed, 2 usage, 69 a dependency is unavailable (Kafka
//! unreachable, or it refused us: credentials, TLS certificate, security protocol;
//! EX_UNAVAILABLE), 78 bad job file, checkpoint directory or client setting (EX_CONFIG),
//! 128 + the signal when SIGINT or SIGTERM stopped the job (130, 143).
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

const EX_CONFIG: u8 = 78;
/// A service the job needs (Kafka) is unavailable.
const EX_UNAVAILABLE: u8 = 69;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Control-plane logging (checkpoints, recovery) on stderr; RUST_LOG=weir=debug shows more.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("weir=info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
    match cli.command {
        Command::Validate { file } => match weir::graph::jobfile::load(&file) {
            Ok(loaded) => match loaded.job.describe() {
                Ok(plan) => {
                    println!("{}: ok", file.display());
                    print!("{plan}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    ExitCode::from(EX_CONFIG)
                }
            },
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EX_CONFIG)
            }
        },
        Command::Run { file, json } => {
            let loaded = match weir::graph::jobfile::load(&file) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(EX_CONFIG);
                }
            };
            let stop = match stop_on_signals() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("cannot handle SIGINT/SIGTERM: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let mut running = match loaded.job.start() {
                Ok(r) => r,
                // A checkpoint directory that cannot be used is a configuration problem.
                Err(e @ weir::runtime::StartError::Checkpoint { .. }) => {
                    eprintln!("cannot start {}: {e}", file.display());
                    return ExitCode::from(EX_CONFIG);
                }
                Err(e) => {
                    eprintln!("cannot start {}: {e}", file.display());
                    return ExitCode::FAILURE;
                }
            };
            let restored = running.checkpoint_stats();
            if let Some(id) = restored.restored_from {
                eprintln!("restored from checkpoint {id}: sources resume from its positions");
            }
            for (node, from, to) in &restored.rescaled {
                eprintln!("  node {node}: checkpoint taken at parallelism {from}, restored at {to}");
            }
            eprintln!("{}", running.budget());
            eprintln!("live counters: weir-stat {}", running.counters_path().display());
            while !running.is_finished() && !running.has_failed() {
                if stop.load(Ordering::Relaxed) != 0 {
                    eprintln!("stopping the job (a second signal exits at once)");
                    running.cancel();
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            match running.wait() {
                Ok(summary) => {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&summary).expect("summaries serialize"));
                    } else {
                        println!("{summary}");
                        for (id, tally) in &loaded.tallies {
                            let (count, sum, _) = tally.totals();
                            println!("sink {id}: {count} events, seq checksum {sum}");
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(weir::runtime::JobError::Cancelled) => {
                    let signal = stop.load(Ordering::Relaxed);
                    eprintln!("job stopped by signal {signal}");
                    ExitCode::from(128 + signal as u8)
                }
                Err(e) => {
                    eprintln!("job failed: {e}");
                    // A Kafka source or sink that cannot reach or authenticate to its brokers:
                    // a dependency is unavailable; a setting librdkafka refused: configuration.
                    use weir::io::kafka::{KafkaConnectorError, KafkaErrorKind};
                    if let weir::runtime::JobError::Failed { error, .. } = &e
                        && let Some(k) = error.downcast_ref::<KafkaConnectorError>()
                    {
                        match k.kind {
                            KafkaErrorKind::Unavailable | KafkaErrorKind::Refused => {
                                return ExitCode::from(EX_UNAVAILABLE);
                            }
                            KafkaErrorKind::Config => return ExitCode::from(EX_CONFIG),
                            KafkaErrorKind::Failed => {}
                        }
                    }
                    ExitCode::FAILURE
                }
            }
        }
        Command::Demo { args } => demo(&args),
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

/// `weir demo ...`: run `weir-demo` from beside this program, with the same arguments.
fn demo(args: &[String]) -> ExitCode {
    let beside = std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join("weir-demo")));
    let Some(program) = beside.filter(|p| p.is_file()) else {
        eprintln!(
            "weir demo: weir-demo is not installed beside this program; build and run it with \
             `cargo run --release -p weir-demo -- {}`",
            args.join(" ")
        );
        return ExitCode::from(2);
    };
    match std::process::Command::new(&program).args(args).status() {
        Ok(status) => ExitCode::from(status.code().map_or(1, |c| c.clamp(0, 255) as u8)),
        Err(e) => {
            eprintln!("weir demo: cannot run {}: {e}", program.display());
            ExitCode::FAILURE
        }
    }
}
