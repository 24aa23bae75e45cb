//! A subtask's mailbox: control messages from the job (stop; checkpoint triggers and
//! completions), with a doorbell word the subtask can park on together with its rings.

use crate::operators::outside::SubtaskFlags;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Stop now (cancel): the subtask exits without finishing its operators.
    Stop,
    /// (Sources) take checkpoint n: snapshot the position, emit barrier n.
    Trigger(u64),
    /// (Sources) take checkpoint n as `Trigger`, then emit nothing more until `Resume` (or a
    /// stop): the savepoint a job stops at (`weir stop --savepoint`).
    TriggerAndPause(u64),
    /// (Sources) emit again: the savepoint a job was to stop at failed.
    Resume,
    /// Checkpoint n is durable: tell the chain (sinks commit).
    Complete(u64),
    /// (Subtasks fed by rings) checkpoint n was triggered: its barrier is on its way, so
    /// work pending in the chain that allows it lets input in between its chunks until the
    /// barrier has passed ([`crate::operators::Work::Interleave`]).
    Expect(u64),
}

/// Control messages for one subtask. The subtask checks `seq()` once per loop pass (one
/// relaxed load) and drains the queue only when it changed.
#[derive(Debug, Default)]
pub struct Mailbox {
    /// Bumped on every post; the futex word a parked subtask also sleeps on.
    pub(crate) doorbell: AtomicU32,
    /// The stop and the checkpoint on its way, where code waiting on the outside inside the
    /// subtask sees them without reading the queue ([`crate::operators::outside`]).
    pub(crate) flags: Arc<SubtaskFlags>,
    queue: Mutex<VecDeque<Control>>,
    /// The newest checkpoint whose completion the subtask has handled (its sinks committed):
    /// a job stopping at a savepoint waits for every subtask's to reach it.
    completed: AtomicU64,
}

impl Mailbox {
    /// Post a message and wake the subtask if it is parked.
    pub fn post(&self, message: Control) {
        match message {
            Control::Stop => self.flags.request_stop(),
            Control::Trigger(id) | Control::TriggerAndPause(id) | Control::Expect(id) => self.flags.expect(id),
            Control::Complete(_) | Control::Resume => {}
        }
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push_back(message);
        // Release: pairs with the Acquire in `seq`; the message is queued before the bell rings.
        self.doorbell.fetch_add(1, Ordering::Release);
        weir_ring::wake(&self.doorbell);
    }

    /// Mark a stop as requested without ringing yet: a job stopping all its subtasks marks
    /// them all first, so no subtask sees a stopped neighbour's closed ring before it can
    /// see its own stop request.
    pub fn request_stop(&self) {
        self.flags.request_stop();
    }

    /// The doorbell's value; read it before checking for work, then park on it.
    #[inline]
    pub fn seq(&self) -> u32 {
        self.doorbell.load(Ordering::Acquire)
    }

    /// Whether a stop was posted.
    #[inline]
    pub fn stop_requested(&self) -> bool {
        self.flags.stop_requested()
    }

    /// The subtask handled `Complete(id)` (its chain committed what it prepared for `id`).
    pub fn completed(&self, id: u64) {
        // Release: pairs with the Acquire in `completed_through`.
        self.completed.fetch_max(id, Ordering::Release);
    }

    /// The newest checkpoint whose completion the subtask has handled (0: none).
    pub fn completed_through(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// Take every queued message.
    pub fn drain(&self) -> Vec<Control> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect()
    }
}
