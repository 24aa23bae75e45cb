//! Event-time timers for keyed operators: a queue of `(time, key)` that the operator asks,
//! when the watermark advances ([`KeyedProcess::on_watermark`]), which timers are due. No
//! timer thread: timers fire in the subtask's loop, in order with the records and before
//! the watermark is passed on, so what they emit is never late downstream.
//!
//! Semantics follow the watermark's ([`crate::time`]): a watermark `w` says no record with
//! an event time below `w` will come, so a timer for `t` fires once `t < w`. Timers are
//! deduplicated per `(time, key)`, fire in time order (ties by key), and once each.
//!
//! [`KeyedProcess::on_watermark`]: super::KeyedProcess::on_watermark

use std::collections::BTreeSet;

/// The event-time timers of one operator instance, by key.
#[derive(Debug, Clone)]
pub struct EventTimers<K> {
    queue: BTreeSet<(u64, K)>,
}

impl<K: Ord> Default for EventTimers<K> {
    fn default() -> EventTimers<K> {
        EventTimers { queue: BTreeSet::new() }
    }
}

impl<K: Ord + Clone> EventTimers<K> {
    /// No timers.
    pub fn new() -> EventTimers<K> {
        EventTimers::default()
    }

    /// Fire for `key` once the watermark passes `time`. Says whether the timer is new (a
    /// second registration of the same time and key is one timer).
    pub fn register(&mut self, key: K, time: u64) -> bool {
        self.queue.insert((time, key))
    }

    /// Forget the timer for `key` at `time`, if there is one.
    pub fn delete(&mut self, key: K, time: u64) -> bool {
        self.queue.remove(&(time, key))
    }

    /// The earliest timer due under `watermark` (its time below it), removed; `None` when
    /// none is due. Call until `None` to fire every due timer in order; a timer registered
    /// meanwhile for a time below the watermark fires in the same round.
    pub fn pop_due(&mut self, watermark: u64) -> Option<(u64, K)> {
        match self.queue.first() {
            Some((t, _)) if *t < watermark => self.queue.pop_first(),
            _ => None,
        }
    }

    /// The earliest timer's time.
    pub fn next_time(&self) -> Option<u64> {
        self.queue.first().map(|(t, _)| *t)
    }

    /// Timers pending.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Drop every timer whose key `keep` refuses (restoring a share of the key groups).
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.queue.retain(|(_, k)| keep(k));
    }

    /// Every pending timer, in firing order.
    pub fn iter(&self) -> impl Iterator<Item = &(u64, K)> {
        self.queue.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timers fire in time order, once, only below the watermark; duplicates are one.
    #[test]
    fn fire_in_order_below_the_watermark() {
        let mut t = EventTimers::new();
        assert!(t.register(2u64, 30));
        assert!(t.register(1, 10));
        assert!(!t.register(1, 10), "the same time and key is one timer");
        assert!(t.register(3, 20));
        assert!(t.delete(3, 20));
        assert_eq!(t.pop_due(10), None, "a timer at 10 waits for a watermark above 10");
        assert_eq!(t.pop_due(11), Some((10, 1)));
        assert_eq!(t.pop_due(11), None);
        t.register(4, 5);
        assert_eq!(t.pop_due(31), Some((5, 4)));
        assert_eq!(t.pop_due(31), Some((30, 2)));
        assert!(t.is_empty());
    }
}
