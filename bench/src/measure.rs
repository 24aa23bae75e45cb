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
