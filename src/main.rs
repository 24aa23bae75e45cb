//! The `weir` command: validate and run job files, and run the demo.
//!
//! Exit codes: 0 ok, 1 the job failed, 2 usage, 69 a dependency is unavailable (Kafka
//! unreachable: EX_UNAVAILABLE), 78 bad job file or checkpoint directory (EX_CONFIG).
//! Control-plane messages go to stderr through `tracing`; `RUST_LOG` filters them.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

mod demo;

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
    /// Run a job file until its sources end (or Ctrl-C); watch it live with `weir-stat`.
    Run {
        /// The job file (TOML).
        file: PathBuf,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The whole story in a minute or two, nothing to install: clicks into an embedded
    /// Kafka, a job counting them per user and second, a REST API that slows down and
    /// recovers. Shows lag growing in Kafka while memory stays flat and checkpoints go on;
    /// ends with a verdict and a picture. Exit 0 only if every promise held.
    Demo(demo::DemoArgs),
    /// (Used by the demo) librdkafka's mock Kafka cluster in this process until stdin closes.
    #[command(hide = true)]
    KafkaMock {
        /// Topic to create.
        #[arg(long)]
        topic: String,
        /// Its partitions.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
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
            let running = match loaded.job.start() {
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
            if let Some(id) = running.checkpoint_stats().restored_from {
                eprintln!("restored from checkpoint {id}: sources resume from its positions");
            }
            eprintln!("{}", running.budget());
            eprintln!("live counters: weir-stat {}", running.counters_path().display());
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
                Err(e) => {
                    eprintln!("job failed: {e}");
                    // A Kafka source or sink that cannot reach its brokers: a dependency is
                    // unavailable.
                    let text = e.to_string();
                    if text.contains("kafka s") && text.contains("cannot read the topic's metadata") {
                        eprintln!("is Kafka running and reachable at the job's bootstrap servers?");
                        return ExitCode::from(EX_UNAVAILABLE);
                    }
                    ExitCode::FAILURE
                }
            }
        }
        Command::Demo(args) => demo::run(args),
        Command::KafkaMock { topic, partitions } => demo::kafka_mock(&topic, partitions),
    }
}
