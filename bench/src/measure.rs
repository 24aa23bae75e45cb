//! Wall time and CPU time of a measured interval. CPU time is getrusage(RUSAGE_SELF) user +
//! system of the whole process (every thread, idle spinning included, and threads that ended
//! inside the interval), so "records per CPU-second" compares across machines and counts what
//! the work really cost, not just the one thread that looked busy.

use serde_json::{Value, json};
use std::time::Instant;
use weir::ring::process::{CpuScope, cpu_time};

/// What one measured interval cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// CPU seconds of the process (user + system, all threads).
    pub cpu_s: f64,
}

impl Cost {
    /// `n` per wall-clock second.
    pub fn per_s(&self, n: u64) -> f64 {
        n as f64 / self.wall_s.max(1e-9)
    }

    /// `n` per CPU-second.
    pub fn per_cpu_s(&self, n: u64) -> f64 {
        n as f64 / self.cpu_s.max(1e-9)
    }

    /// Cores busy on average: CPU seconds per wall second.
    pub fn cores(&self) -> f64 {
        self.cpu_s / self.wall_s.max(1e-9)
    }

    /// As JSON, with the rates of `n` items.
    pub fn json(&self, n: u64) -> Value {
        json!({
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "per_s": self.per_s(n),
            "per_cpu_s": self.per_cpu_s(n),
            "cores_busy": self.cores(),
        })
    }
}

/// A running measurement: started by [`Meter::start`], read by [`Meter::stop`].
#[derive(Debug, Clone, Copy)]
pub struct Meter {
    wall: Instant,
    cpu: std::time::Duration,
}

impl Meter {
    /// Start the clocks.
    pub fn start() -> Meter {
        Meter { cpu: cpu_time(CpuScope::Process), wall: Instant::now() }
    }

    /// The cost since `start`.
    pub fn stop(&self) -> Cost {
        let wall_s = self.wall.elapsed().as_secs_f64();
        let cpu_s = (cpu_time(CpuScope::Process) - self.cpu).as_secs_f64();
        Cost { wall_s, cpu_s }
    }
}

/// Microseconds to touch one fresh 4 KiB page: 64 MiB zeroed (mapped, not yet backed), one
/// byte written per page — a page fault and a zeroed page each. On bare metal that is a
/// fraction of a microsecond. In a VM whose balloon reports free memory to its host
/// (virtio-balloon free page reporting, as on the machines these figures come from) a page
/// given back must come from the host again, and costs 10–20 µs: `dd` of 2 GiB into
/// /dev/shm took 11.2 s of system time, 0.83 s when repeated at once, 9.4 s again 20 s
/// later. A run that touches fresh memory (the page cache its files go into, state that
/// grows) pays that as its own CPU time; the reports carry this figure so a reader can tell.
pub fn page_touch_us() -> f64 {
    const BYTES: usize = 64 << 20;
    const PAGE: usize = 4096;
    let t = Instant::now();
    let mut pages = vec![0u8; BYTES];
    for i in (0..BYTES).step_by(PAGE) {
        pages[i] = 1;
    }
    std::hint::black_box(&pages);
    let us = t.elapsed().as_secs_f64() * 1e6 / (BYTES / PAGE) as f64;
    drop(pages);
    us
}

/// Run `f` and return its result and cost.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Cost) {
    let meter = Meter::start();
    let r = f();
    (r, meter.stop())
}

/// The pinning map of a finished job: `{"gen#0": 0, "sink#0": 1}` (null: not pinned).
pub fn pinning(summary: &weir::runtime::JobSummary) -> Value {
    let map: serde_json::Map<String, Value> = summary.subtasks.iter().map(|s| (s.name.clone(), json!(s.cpu))).collect();
    Value::Object(map)
}

/// CPU time by thread, sampled from `/proc/self/task` while a job runs (a job's threads end
/// with it, and an ended thread's time cannot be read any more): what [`ThreadCpu::stop`]
/// returns is each thread's last sample minus its time at start, so up to one sampling
/// period of a thread's end is missed.
#[derive(Debug)]
pub struct ThreadCpu {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Times>>,
    start: Times,
}

/// (tid, start time) → (name, CPU seconds).
type Times = std::collections::HashMap<(u64, u64), (String, f64)>;

/// Every thread of this process now: (tid, start time) → (name, CPU seconds). The start
/// time tells a thread from a later one that got its tid again.
fn thread_times() -> Times {
    let mut out = std::collections::HashMap::new();
    let tick = 100.0; // USER_HZ on Linux
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return out };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // "tid (comm) state ..." — comm may hold spaces and parentheses: split at the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let name = head.split_once('(').map_or("", |(_, n)| n).to_owned();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the comm: state is field 3, utime field 14, stime field 15 (1-based).
        let (Some(u), Some(s)) = (fields.get(11), fields.get(12)) else { continue };
        let ticks = u.parse::<f64>().unwrap_or(0.0) + s.parse::<f64>().unwrap_or(0.0);
        // starttime is field 22.
        let started = fields.get(19).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        out.insert((tid, started), (name, ticks / tick));
    }
    out
}

impl ThreadCpu {
    /// Start sampling every 50 ms.
    pub fn start() -> ThreadCpu {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let start = thread_times();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut last = std::collections::HashMap::new();
                loop {
                    last.extend(thread_times());
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return last;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        });
        ThreadCpu { stop, thread: Some(thread), start }
    }

    /// CPU seconds since `start`, summed over the threads whose name satisfies `pick`.
    pub fn stop(mut self, picks: &[&dyn Fn(&str) -> bool]) -> Vec<f64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let last = self.thread.take().map(|t| t.join().unwrap_or_default()).unwrap_or_default();
        picks
            .iter()
            .map(|pick| {
                last.iter()
                    .filter(|(_, (name, _))| pick(name))
                    .map(|(tid, (_, cpu))| cpu - self.start.get(tid).map_or(0.0, |s| s.1))
                    .sum::<f64>()
                    .max(0.0)
            })
            .collect()
    }
}

/// Bytes this process read and wrote through system calls (`rchar`, `wchar` of
/// `/proc/self/io`): in a state benchmark, RocksDB's file I/O (page cache hits included).
pub fn io_bytes() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<u64>().ok())).unwrap_or(0)
    };
    (field("rchar:"), field("wchar:"))
}
