//! What a finished job reports: totals per node, time accounting per subtask, the budget
//! and the checkpoints.

use super::CheckpointStats;
use crate::telemetry::{Budget, backpressure_level, bytes};
use std::fmt;

/// One node's totals over its subtasks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeSummary {
    /// Node id.
    pub id: String,
    /// What it is ("source", "map", ...).
    pub op: &'static str,
    /// Its parallelism.
    pub parallelism: u32,
    /// Records it received (sources: produced).
    pub records_in: u64,
    /// Records it emitted (sinks: 0).
    pub records_out: u64,
    /// Late records it dropped (windows; 0 for other nodes).
    pub late_records: u64,
    /// Keys its caches evicted to the state store (windows; 0 for other nodes).
    pub evicted_keys: u64,
}

/// One subtask's time accounting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SubtaskSummary {
    /// `head-node#index`.
    pub name: String,
    /// CPU it was pinned to.
    pub cpu: Option<usize>,
    /// ns processing.
    pub busy_ns: u64,
    /// ns waiting for credit.
    pub backpressured_ns: u64,
    /// ns waiting for input.
    pub idle_ns: u64,
    /// ns waiting on the outside (a destination, a broker, another process).
    pub waiting_ns: u64,
    /// Records into the chain.
    pub records_in: u64,
}

/// What a finished job reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobSummary {
    /// Job name.
    pub name: String,
    /// Wall time.
    pub elapsed_ns: u64,
    /// Per node.
    pub nodes: Vec<NodeSummary>,
    /// Per subtask.
    pub subtasks: Vec<SubtaskSummary>,
    /// Largest RSS sampled while running.
    pub max_rss_bytes: u64,
    /// The budget.
    pub budget: Budget,
    /// Checkpoints taken (empty when the job takes none).
    pub checkpoints: CheckpointStats,
}

impl JobSummary {
    /// The node with this id.
    pub fn node(&self, id: &str) -> Option<&NodeSummary> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

impl fmt::Display for JobSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.elapsed_ns as f64 / 1e9;
        writeln!(f, "job {} finished in {secs:.3} s", self.name)?;
        writeln!(
            f,
            "{:<20} {:<9} {:>4} {:>14} {:>14} {:>14}",
            "node", "op", "par", "records in", "records out", "in/s"
        )?;
        for n in &self.nodes {
            writeln!(
                f,
                "{:<20} {:<9} {:>4} {:>14} {:>14} {:>14.0}",
                n.id,
                n.op,
                n.parallelism,
                n.records_in,
                n.records_out,
                n.records_in.max(n.records_out) as f64 / secs.max(1e-9)
            )?;
        }
        writeln!(
            f,
            "{:<20} {:>4} {:>7} {:>7} {:>7} {:>7}  backpressure",
            "subtask", "cpu", "busy%", "bp%", "idle%", "wait%"
        )?;
        for s in &self.subtasks {
            let total = (s.busy_ns + s.backpressured_ns + s.idle_ns + s.waiting_ns).max(1) as f64;
            let bp = s.backpressured_ns as f64 / total;
            writeln!(
                f,
                "{:<20} {:>4} {:>7.1} {:>7.1} {:>7.1} {:>7.1}  {}",
                s.name,
                s.cpu.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
                100.0 * s.busy_ns as f64 / total,
                100.0 * bp,
                100.0 * s.idle_ns as f64 / total,
                100.0 * s.waiting_ns as f64 / total,
                backpressure_level(bp)
            )?;
        }
        write!(f, "max RSS {} of {}", bytes(self.max_rss_bytes), self.budget)
    }
}
