//! State backend benchmark: operations per second through a `Store` and a `WriteBackCache`
//! on one RocksDB shard (see `weir_bench::state` for the workloads).
//! Run: `cargo bench -p weir-bench --bench state` (prints a markdown table, writes
//! `target/weir-bench/state.json`); `WEIR_BENCH_SMOKE=1` runs it tiny. The same workloads are
//! part of `cargo run --release -p weir-bench -- all`.

fn main() {
    let test_mode = std::env::args().any(|a| a == "--test");
    let smoke = weir_bench::smoke() || test_mode;
    let (outcomes, report) = weir_bench::state::run_all(smoke);
    println!("\n{}", weir_bench::state::table(&outcomes));
    println!("cold cache: {}", report["cold_cache"]);
    let path = weir_bench::report_dir().join("state.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json")).expect("write report");
    println!("\nwritten: {}", path.display());
}
