//! The ring micro-benchmarks in the report: `all` runs the criterion benchmark
//! (`cargo bench -p weir-bench --bench ring`, `benches/ring.rs`) as a child process, so its
//! figures are criterion's (medians, confidence intervals, warm-up), then reads the summary it
//! writes (`target/weir-bench/ring.json`): weir, rtrb and crossbeam measured in the same run
//! on the same two cores, and the cache-line round-trip floor measured inside each round-trip
//! group.

use crate::report::{Row, Section};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::SystemTime;

/// The workspace root (where `cargo bench` runs).
fn workspace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("bench/ sits in the workspace").to_path_buf()
}

/// Run the criterion benchmark and turn its summary into a section. Its output goes to
/// `<out>/logs/ring.log`.
pub fn section(smoke: bool, out: &Path) -> Section {
    let mut s = Section::new("ring", "Ring micro-benchmarks: weir vs rtrb vs crossbeam, round trip vs the floor");
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).expect("create the logs folder");
    let log_path = logs.join("ring.log");
    let log = std::fs::File::create(&log_path).expect("create the ring log");
    let started = SystemTime::now();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["bench", "-p", "weir-bench", "--bench", "ring"])
        .current_dir(workspace())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log);
    if smoke {
        cmd.env("WEIR_BENCH_SMOKE", "1");
    } else {
        cmd.env_remove("WEIR_BENCH_SMOKE");
    }
    let status = cmd.status().expect("run cargo bench");
    let json_path = crate::report_dir().join("ring.json");
    let fresh = std::fs::metadata(&json_path).and_then(|m| m.modified()).is_ok_and(|t| t >= started);
    if !status.success() || !fresh {
        let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(30).collect();
        eprintln!("{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        panic!(
            "`cargo bench -p weir-bench --bench ring` failed ({status}) or wrote no summary; see {}",
            log_path.display()
        );
    }
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&json_path).expect("read ring.json")).expect("ring.json parses");
    std::fs::write(out.join("ring-criterion.json"), serde_json::to_string_pretty(&doc).expect("json") + "\n")
        .expect("copy ring.json");
    s.files.push("ring-criterion.json".into());
    s.files.push("logs/ring.log".into());

    let f = |v: &Value| v.as_f64();
    for t in doc["throughput"].as_array().into_iter().flatten() {
        let label = t["workload"].as_str().unwrap_or("?");
        let (Some(weir), Some(rtrb)) = (f(&t["weir"]), f(&t["rtrb"])) else { continue };
        let batched = t["batch"].as_u64().unwrap_or(1) > 1;
        let row = Row::new(format!("ring {label}: weir"), weir / 1e6, "M records/s")
            .vs(format!("rtrb {:.1} M/s", rtrb / 1e6), rtrb / 1e6)
            .note(format!("crossbeam ArrayQueue {:.1} M/s", f(&t["crossbeam"]).unwrap_or(f64::NAN) / 1e6));
        s.rows.push(row);
        if let Some(frame) = f(&t["weir_frame"]) {
            let mut row = Row::new(format!("ring {label}: weir, records in frames"), frame / 1e6, "M records/s")
                .vs(format!("rtrb {:.1} M/s", rtrb / 1e6), rtrb / 1e6)
                .note("Producer::append (fixed stride), one header per frame");
            if batched {
                row = row.target("≥ 1.0× rtrb", |r| r >= 1.0);
            }
            s.rows.push(row);
        }
        let large = &t["large_rings"];
        if let (Some(frame), Some(base)) = (f(&large["weir_frame"]), f(&large["rtrb"])) {
            s.rows.push(
                Row::new(
                    format!("ring {label}: weir, records in frames, rings {}× larger", large["times"]),
                    frame / 1e6,
                    "M records/s",
                )
                .vs(format!("rtrb in a ring of the same bytes {:.1} M/s", base / 1e6), base / 1e6)
                .note("a ring larger than what the two cores hand over hot"),
            );
        }
        let cpu = &t["records_per_cpu_s"];
        if let (Some(w), Some(r)) = (f(&cpu["weir"]["records_per_cpu_s"]), f(&cpu["rtrb"]["records_per_cpu_s"])) {
            s.rows.push(
                Row::new(format!("ring {label}: weir, records per CPU-second"), w / 1e6, "M records/CPU-s")
                    .vs(format!("rtrb {:.1} M/CPU-s", r / 1e6), r / 1e6)
                    .note("both threads busy-spin, so about 2 cores"),
            );
        }
    }
    for t in doc["round_trip"].as_array().into_iter().flatten() {
        let label = t["workload"].as_str().unwrap_or("?");
        let (Some(weir), Some(floor)) = (f(&t["weir"]), f(&t["floor_ns"])) else { continue };
        // Against the floor timed inside each sample on the same threads (the median of
        // those ratios, as the floor it implies) where the run has it; the group's floor,
        // timed seconds apart by other threads, is named beside it.
        let against = |value: f64, paired: &Value| match f(paired) {
            Some(r) if r > 0.0 => (
                format!("floor timed in each sample on the same threads (median; the group's floor {floor:.0} ns)"),
                value / r,
            ),
            _ => (format!("floor {floor:.0} ns (same run)"), floor),
        };
        let (vs, base) = against(weir, &t["weir_over_paired_floor"]);
        let rtrb_ratio = f(&t["rtrb_over_paired_floor"]).or(f(&t["rtrb_over_floor"]));
        s.rows.push(
            Row::new(format!("ring {label}: weir"), weir, "ns").vs(vs, base).target("≤ 1.3× floor", |r| r <= 1.3).note(
                format!(
                    "rtrb {:.0} ns = {:.2}× floor, crossbeam {:.0} ns",
                    f(&t["rtrb"]).unwrap_or(f64::NAN),
                    rtrb_ratio.unwrap_or(f64::NAN),
                    f(&t["crossbeam"]).unwrap_or(f64::NAN)
                ),
            ),
        );
        if let Some(frame) = f(&t["weir_frame"]) {
            let (vs, base) = against(frame, &t["weir_frame_over_paired_floor"]);
            s.rows.push(
                Row::new(format!("ring {label}: weir, records in frames"), frame, "ns")
                    .vs(vs, base)
                    .target("≤ 1.3× floor", |r| r <= 1.3)
                    .note("a frame of one record per hop"),
            );
        }
    }
    s.setup = json!({
        "pinning": doc["pinning"],
        "idle_strategy": doc["idle_strategy"],
        "rings": doc["rings"],
        "record_bytes": doc["record_bytes"],
        "batch_records": doc["batch_records"],
        "statistic": doc["statistic"],
        "sched_policy": doc["machine"]["sched_policy"],
    });
    s.details = json!({ "throughput": doc["throughput"], "round_trip": doc["round_trip"] });
    s
}
