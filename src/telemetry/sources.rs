//! Sources' published figures: per-partition consumer lag, read by the job's monitor thread
//! into counters named `node[partition]`.

use std::sync::Arc;

/// A reading of per-partition lags: calls its argument with `(partition, lag)` for each
/// partition whose lag is known.
pub type ReadLags = Arc<dyn Fn(&mut dyn FnMut(i32, u64)) + Send + Sync>;

/// Reads one source node's per-partition lag. The job's monitor thread calls it every 50 ms.
#[derive(Clone)]
pub struct LagGauge {
    /// The source node.
    pub node: String,
    /// The reading.
    pub read: ReadLags,
}

impl std::fmt::Debug for LagGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagGauge").field("node", &self.node).finish()
    }
}

impl PartialEq for LagGauge {
    fn eq(&self, other: &LagGauge) -> bool {
        self.node == other.node && Arc::ptr_eq(&self.read, &other.read)
    }
}
