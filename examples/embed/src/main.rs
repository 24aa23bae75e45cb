//! weir embedded in a program of your own, with the lean feature set: no RocksDB, no Kafka, no
//! TLS — nothing but Rust to compile. In your `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! weir = { path = "../weir", default-features = false }
//! ```
//!
//! The job: a generator of click events, a filter, a key_by (a hash exchange over shared-memory
//! rings), a one-second tumbling window per key on event time (state on the heap), and part
//! files written through io_uring, committed exactly once when the input ends.
//!
//! ```sh
//! cargo run --release -p weir-embed -- /tmp/clicks
//! ```

use std::time::Duration;
use weir::graph::Job;
use weir::io::{FileSink, FileSinkConfig};
use weir::operators::builtin::Generator;
use weir::record::Event;
use weir::window::{Aggregates, Window, WindowResult};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| std::env::temp_dir().join("weir-embed").display().to_string());
    let files = FileSinkConfig::new(&dir);
    let written = files.stats.clone();

    let job = Job::new("embed");
    // Two cores or fewer: let the threads float rather than pinning each to a CPU of its own.
    job.configure(|c| c.pinning = false);
    job.source("clicks", 1, |info| Generator::events(info, 1_000_000, 1_000))
        .filter("big", |e: &Event| e.value > 10)
        .key_by("by_user", |e: &Event| e.key)
        .window(Window::tumbling(Duration::from_secs(1)))
        .timestamps(|e: &Event| e.time_ns)
        .aggregate("per_second", 2, Aggregates::of(|e: &Event| e.value).count().sum())
        .sink("files", 1, move |info| FileSink::<WindowResult>::new(files.clone(), info));

    let summary = job.run()?;
    println!("{summary}");
    println!(
        "{} window results in {dir} ({} part files)",
        written.records.load(std::sync::atomic::Ordering::Relaxed),
        written.parts_committed.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(())
}
