//! The unchained stateless chain alone (5 subtasks, 4 rings), for a profiler:
//! `cargo run --release -p weir-bench --example chain_unchained -- [records]`.
fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000_000);
    // WEIR_BLOCKS=1: three subtasks on CPU 0, two on CPU 1 (one ring between the CPUs).
    let job = if std::env::var("WEIR_BLOCKS").is_ok_and(|v| v == "1") {
        weir_bench::pipeline::chain_in_blocks(n)
    } else {
        weir_bench::pipeline::chain(n, false)
    };
    // WEIR_IDLE=spin_us,yields: the Park strategy's longest spin and its yields (experiments).
    if let Ok(v) = std::env::var("WEIR_IDLE") {
        let (s, y) = v.split_once(',').expect("spin_us,yields");
        let (spin, yields) = (std::time::Duration::from_micros(s.parse().unwrap()), y.parse().unwrap());
        job.configure(|c| c.idle = weir::ring::IdleStrategy::Park { spin, yields });
    }
    // WEIR_LATENCY_INTERVAL_MS=ms: latency markers that often (0: none; default 10 ms).
    if let Ok(v) = std::env::var("WEIR_LATENCY_INTERVAL_MS") {
        let ms: u64 = v.parse().expect("milliseconds");
        job.configure(|c| c.latency_interval = (ms > 0).then(|| std::time::Duration::from_millis(ms)));
    }
    // WEIR_FIBERS, WEIR_TARGET_OFF, WEIR_FLOOR: see `run_example`.
    weir_bench::pipeline::run_example(&job, n, true);
}
