//! The key_by exchange alone (generator → key_by → counting sink, at parallelism p), for a
//! profiler: `cargo run --release -p weir-bench --example keyed -- [records] [p]`.
fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000_000);
    let p: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let tally = std::sync::Arc::new(weir::operators::builtin::Tally::default());
    let job = weir_bench::pipeline::keyed(n, p, tally);
    // WEIR_TARGET_OFF=1: no credit by time.
    if std::env::var("WEIR_TARGET_OFF").is_ok_and(|v| v == "1") {
        job.configure(|c| c.inflight_target = None);
    }
    // WEIR_FIBERS=1: the subtasks pinned to one CPU run as fibers of one thread.
    if std::env::var("WEIR_FIBERS").is_ok_and(|v| v == "1") {
        job.configure(|c| c.fibers = true);
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
    let (_, cost) = weir_bench::measure::measure(|| job.run().expect("runs"));
    let (v1, i1) = context_switches(CpuScope::Process);
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
