//! weir's benchmarks: the workloads (shared by the criterion-style `cargo bench` targets in
//! `benches/` and the runner `weir-bench`, `src/main.rs`), the report they fill, and the
//! environment every report records (CPU model, cores, load, nice, git revision, rustc,
//! kernel, date), since figures mean nothing without it.
//!
//! `cargo run --release -p weir-bench -- all` runs every benchmark, each in its own process
//! (so RSS, peak RSS and getrusage are that benchmark's alone), and writes
//! `target/weir-bench/report/`: `report.json`, `report.md` and `.hgrm` latency histograms.

pub mod backpressure;
pub mod floor;
pub mod http;
pub mod instances;
pub mod kafka;

pub mod ipc;
pub mod latency;
pub mod measure;
pub mod nexmark;
pub mod pipeline;
pub mod postgres;
pub mod report;
pub mod ring;
pub mod state;
pub mod stuck;
pub mod window;

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;

/// Whether `WEIR_BENCH_SMOKE=1`: run every benchmark tiny, to prove it runs (CI).
pub fn smoke() -> bool {
    std::env::var("WEIR_BENCH_SMOKE").is_ok_and(|v| v == "1")
}

/// Where cargo puts build output: `$CARGO_TARGET_DIR`, `cargo metadata`, else `./target`
/// (criterion looks in the same places).
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let meta = Command::new(cargo).args(["metadata", "--format-version", "1", "--no-deps"]).output();
    if let Ok(out) = meta
        && out.status.success()
        && let Ok(v) = serde_json::from_slice::<Value>(&out.stdout)
        && let Some(dir) = v["target_directory"].as_str()
    {
        return PathBuf::from(dir);
    }
    PathBuf::from("target")
}

/// The reports folder, `target/weir-bench`, created.
pub fn report_dir() -> PathBuf {
    let dir = target_dir().join("weir-bench");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// The CPU model from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg").ok().map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// This process's nice value (field 19 of /proc/self/stat): a negative one means the run was
/// given priority over other work on the machine.
pub fn nice() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    // Fields from 3 (state) on; nice is field 19.
    after_name.split_whitespace().nth(19 - 3)?.parse().ok()
}

/// The median of `v` (the upper one of an even count). Panics if `v` is empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Context switches of the calling thread so far, voluntary + involuntary
/// (`/proc/thread-self/status`).
pub fn thread_context_switches() -> Option<u64> {
    thread_switches().map(|(voluntary, involuntary)| voluntary + involuntary)
}

/// Context switches of the calling thread so far: (voluntary — it slept or parked —,
/// involuntary — the CPU was taken from it), from `/proc/thread-self/status`.
pub fn thread_switches() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok())
    };
    Some((field("voluntary_ctxt_switches:")?, field("nonvoluntary_ctxt_switches:")?))
}

/// The SMT siblings of `cpu` (`/sys/.../topology/thread_siblings_list`, e.g. "0-1" when two
/// hardware threads share the core, "0" when it has the core alone).
pub fn smt_siblings(cpu: usize) -> Option<String> {
    let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Steal time of the whole machine so far, in clock ticks (the 8th figure of /proc/stat's
/// `cpu` line: time the hypervisor ran something else while a vCPU wanted to run).
pub fn steal_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().next()?.split_whitespace().nth(8)?.parse().ok()
}

/// `git <args>` in the repository, trimmed, if it worked.
pub fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `rustc -V` (the compiler on PATH, or `$RUSTC`: the one cargo builds with).
pub fn rustc_version() -> Option<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc).arg("-V").output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The kernel release (`uname -r`).
pub fn kernel() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string())
}

/// Now, UTC, as `2025-11-30T12:34:56Z`.
pub fn date_utc() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// The CPUs this process may run on (its affinity mask).
pub fn cpus_available() -> Vec<usize> {
    core_affinity::get_core_ids().map(|ids| ids.into_iter().map(|c| c.id).collect()).unwrap_or_default()
}

/// The environment block every report carries.
pub fn environment() -> Value {
    json!({
        "cpu_model": cpu_model(),
        "cores_online": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpus_available": cpus_available(),
        "loadavg": loadavg(),
        "nice": nice(),
        "git_revision": git(&["rev-parse", "HEAD"]),
        "git_short": git(&["rev-parse", "--short", "HEAD"]),
        "git_dirty": git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
        "rustc": rustc_version(),
        "kernel": kernel(),
        "date_utc": date_utc(),
        "smoke": smoke(),
    })
}
