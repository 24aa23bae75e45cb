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

/// Where another process writes into a source subtask (an ipc endpoint's ring), read like a
/// channel of the job: its slots, the slots in use, and the time the publisher waited for
/// credit (as its ring's header says; the publisher keeps that figure).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointReading {
    /// Slots in the ring.
    pub slots: u64,
    /// Slots in use (written, not yet released by the source).
    pub backlog: u64,
    /// Nanoseconds the publisher waited for credit, in total.
    pub blocked_ns: u64,
}

/// A reading of a source node's endpoints: calls its argument with `(subtask, reading)`.
pub type ReadEndpoints = Arc<dyn Fn(&mut dyn FnMut(u32, EndpointReading)) + Send + Sync>;

/// Reads one source node's endpoints into channel counters named `<publisher>-><node>#<i>`
/// (`weir-stat`'s channel table, `weir top`'s edges, Prometheus' `weir_channel_*`). The
/// job's monitor thread calls it every 50 ms.
#[derive(Clone)]
pub struct EndpointGauge {
    /// The source node.
    pub node: String,
    /// How the sender is named (`ipc:<endpoint>`).
    pub publisher: String,
    /// The reading.
    pub read: ReadEndpoints,
}

impl std::fmt::Debug for EndpointGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointGauge").field("node", &self.node).field("publisher", &self.publisher).finish()
    }
}

impl PartialEq for EndpointGauge {
    fn eq(&self, other: &EndpointGauge) -> bool {
        self.node == other.node && Arc::ptr_eq(&self.read, &other.read)
    }
}
