//! A third party's look at a ring: how full it is, for a monitor thread that samples gauges
//! while the two sides run. It reads the shared positions now and then (Relaxed: a gauge
//! needs a recent value, not an ordering), so neither side's hot path reads the other's
//! line to keep a gauge up to date.

use crate::region::Region;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Backlog and credit of one ring, read from the shared positions. Cheap to clone.
#[derive(Clone)]
pub struct Observer {
    region: Arc<Region>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").field("slot_count", &self.region.slot_count).finish()
    }
}

impl Observer {
    pub(crate) fn new(region: Arc<Region>) -> Observer {
        Observer { region }
    }

    /// Slots in the ring.
    pub fn slot_count(&self) -> u64 {
        self.region.slot_count
    }

    /// Used slots: published and not yet released, clamped to `0..=slot_count` (a peer may
    /// have written anything into the header; a gauge never poisons).
    pub fn backlog(&self) -> u64 {
        let h = self.region.header();
        let head = h.head.value.load(Ordering::Relaxed);
        let tail = h.tail.value.load(Ordering::Relaxed);
        tail.saturating_sub(head).min(self.region.slot_count)
    }

    /// Free slots: `slot_count − backlog`.
    pub fn credit(&self) -> u64 {
        self.region.slot_count - self.backlog()
    }
}
