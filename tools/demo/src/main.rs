//! `weir-demo`: the whole story in a minute or two, nothing to install: clicks into an
//! embedded Kafka, a job counting them per user and second, a REST API that slows down and
//! recovers. Shows lag growing in Kafka while memory stays flat and checkpoints go on; ends
//! with a verdict and a picture. Exit 0 only if every promise held (69: Kafka unreachable).
//!
//! A package of its own: the engine crate `weir` depends on neither the slow API nor the
//! plotting library the demo uses.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod demo;
mod pg;
mod plot;

/// weir's demo: backpressure from a slow REST API back into Kafka, with a verdict.
#[derive(Parser, Debug)]
#[command(name = "weir-demo", version, about, long_about = None, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(flatten)]
    demo: demo::DemoArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // A completed checkpoint is logged each time (info): the live line shows them already.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("weir=info,weir::runtime::coordinator=warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
    match cli.command {
        Some(Command::KafkaMock { topic, partitions }) => demo::kafka_mock(&topic, partitions),
        None => demo::run(cli.demo),
    }
}
