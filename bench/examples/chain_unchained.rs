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
    // WEIR_FIBERS=1: the subtasks pinned to one CPU run as fibers of one thread.
    if std::env::var("WEIR_FIBERS").is_ok_and(|v| v == "1") {
        job.configure(|c| c.fibers = true);
    }
    // WEIR_TARGET_OFF=1: no credit by time (runs are then not cut at the clock checks).
    if std::env::var("WEIR_TARGET_OFF").is_ok_and(|v| v == "1") {
        job.configure(|c| c.inflight_target = None);
    }
    // WEIR_LATENCY_INTERVAL_MS=ms: latency markers that often (0: none; default 10 ms).
    if let Ok(v) = std::env::var("WEIR_LATENCY_INTERVAL_MS") {
        let ms: u64 = v.parse().expect("milliseconds");
        job.configure(|c| c.latency_interval = (ms > 0).then(|| std::time::Duration::from_millis(ms)));
    }
    // The cache-line round trip between CPUs 0 and 1 now: these vCPUs are sometimes close
    // (~60-100 ns) and sometimes far (~250-400 ns), and that moves every figure below.
    // WEIR_FLOOR=0 skips it (under valgrind, which runs one thread at a time, it would
    // take minutes).
    let floor = if std::env::var("WEIR_FLOOR").is_ok_and(|v| v == "0") {
        f64::NAN
    } else {
        weir_bench::floor::measure((Some(0), Some(1)), 200_000, 5).rtt_ns
    };
    use weir::ring::process::{CpuScope, context_switches};
    let (v0, i0) = context_switches(CpuScope::Process);
    let (summary, cost) = weir_bench::measure::measure(|| job.run().expect("runs"));
    let (v1, i1) = context_switches(CpuScope::Process);
    println!("{summary}");
    println!(
        "{:.2} M records/s, {:.2} M records per CPU-second, {:.3} context switches per 1k records ({} voluntary, {} involuntary); cache-line round trip CPU 0-1 {:.0} ns",
        cost.per_s(n) / 1e6,
        cost.per_cpu_s(n) / 1e6,
        ((v1 - v0) + (i1 - i0)) as f64 * 1000.0 / n as f64,
        v1 - v0,
        i1 - i0,
        floor
    );
}
