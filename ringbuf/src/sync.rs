//! The atomics the ring is built from: `core`'s in a normal build, loom's under
//! `--cfg loom`, so the same protocol code runs in the model checker.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

/// Politely give up the CPU for a moment (loom needs to be told, to explore other threads).
#[inline(always)]
pub(crate) fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    // A fiber lets the other fibers of its thread run; a thread lets the other threads.
    #[cfg(not(loom))]
    if !crate::fiber::yield_now() {
        std::thread::yield_now();
    }
}

/// Sleep for `d` (a fiber lets the others of its thread run meanwhile).
pub(crate) fn sleep(d: std::time::Duration) {
    #[cfg(loom)]
    std::thread::sleep(d);
    #[cfg(not(loom))]
    crate::fiber::sleep(d);
}

/// A spin-loop hint (under loom, a yield so the model makes progress).
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
