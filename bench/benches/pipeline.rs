//! Runtime benchmark: whole jobs, end to end (see `weir_bench::pipeline` for the workloads).
//! Run: `cargo bench -p weir-bench --bench pipeline` (prints a markdown table, writes
//! `target/weir-bench/pipeline.json`); `WEIR_BENCH_SMOKE=1` runs it tiny (CI). The same
//! workloads are part of `cargo run --release -p weir-bench -- all`.

use serde_json::json;
use weir_bench::pipeline;

fn main() {
    // cargo bench passes `--bench`; `--test` (cargo bench -- --test) means run tiny, once.
    let test_mode = std::env::args().any(|a| a == "--test");
    let smoke = weir_bench::smoke() || test_mode;
    let outcomes = pipeline::run_all(smoke);
    println!("\n{}", pipeline::table(&outcomes));
    let mut report = json!({
        "benchmark": "pipeline",
        "environment": weir_bench::environment(),
        "results": pipeline::details(&outcomes),
    });
    for (k, v) in pipeline::setup().as_object().expect("an object") {
        report[k] = v.clone();
    }
    let path = weir_bench::report_dir().join("pipeline.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json")).expect("write report");
    println!("written: {}", path.display());
}
