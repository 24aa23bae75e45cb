//! The key_by exchange alone (generator → key_by → counting sink, at parallelism p), for a
//! profiler: `cargo run --release -p weir-bench --example keyed -- [records] [p]`.
fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000_000);
    let p: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let tally = std::sync::Arc::new(weir::operators::builtin::Tally::default());
    let job = weir_bench::pipeline::keyed(n, p, tally);
    // WEIR_FIBERS, WEIR_TARGET_OFF, WEIR_FLOOR: see `run_example`.
    weir_bench::pipeline::run_example(&job, n, false);
}
