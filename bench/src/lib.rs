//! Shared pieces of weir's benchmarks: where reports go, and the environment every report
//! records (CPU model, cores, load, nice, git revision), since figures mean nothing without it.

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

/// `git <args>` in the repository, trimmed, if it worked.
pub fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The environment block every report carries.
pub fn environment() -> Value {
    json!({
        "cpu_model": cpu_model(),
        "cores_online": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "loadavg": loadavg(),
        "nice": nice(),
        "git_revision": git(&["rev-parse", "HEAD"]),
        "git_dirty": git(&["status", "--porcelain"]).map(|s| !s.is_empty()),
        "smoke": smoke(),
    })
}
