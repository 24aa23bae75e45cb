//! What the sink asks of its subtask while it waits on the server: whether the job is
//! stopping, whether a checkpoint's barrier is on its way, and how to decline that checkpoint.
//!
//! These are the stuck-world rules' questions (#46: `crate::operators::outside`). Until that
//! module is on this branch's base they answer as outside a subtask: no stop is requested, no
//! barrier is expected, a decline goes nowhere. The sink's waits are written against them, so
//! switching is one `use`.

/// Whether the job asked this subtask to stop.
pub(crate) fn stop_requested() -> bool {
    false
}

/// The checkpoint whose barrier is on its way to this subtask, if any.
pub(crate) fn barrier_expected() -> Option<u64> {
    None
}

/// The checkpoint on its way cannot complete (the sink cannot take the records before its
/// barrier); whether it was declined.
pub(crate) fn decline(_why: impl FnOnce() -> String) -> bool {
    false
}
