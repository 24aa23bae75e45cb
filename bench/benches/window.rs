//! Window benchmark: keyed 1 s tumbling count + sum over 10,000 keys, end to end (see
//! `weir_bench::window` for the setups).
//! Run: `cargo bench -p weir-bench --bench window` (prints a markdown table, writes
//! `target/weir-bench/window.json`); `WEIR_BENCH_SMOKE=1` runs it tiny (CI). The same setups
//! are part of `cargo run --release -p weir-bench -- all`.

use serde_json::json;
use weir_bench::window;

fn main() {
    // cargo bench passes `--bench`; `--test` (cargo bench -- --test) means run tiny, once.
    let test_mode = std::env::args().any(|a| a == "--test");
    let smoke = weir_bench::smoke() || test_mode;
    let outcomes = window::run_all(smoke);
    println!("\nkeyed 1 s tumbling count + sum over {} keys\n", window::KEYS);
    print!("{}", window::table(&outcomes));
    let mut report = json!({
        "benchmark": "window",
        "environment": weir_bench::environment(),
        "results": window::details(&outcomes),
    });
    for (k, v) in window::setup().as_object().expect("an object") {
        report[k] = v.clone();
    }
    let path = weir_bench::report_dir().join("window.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json")).expect("write report");
    println!("\nwritten: {}", path.display());
}
