//! Waiting on the outside world from inside a subtask: every wait bounded, named, cut short by
//! a stop, and never in a checkpoint barrier's way.
//!
//! A subtask is one thread running one loop. Code deep inside it — a sink waiting for its API
//! to answer, a Kafka call, a database round trip — cannot read the subtask's mailbox, and must
//! not wait as if the job had nothing else to do. What it needs of its subtask is here, reached
//! through the thread (the runtime `install`s a subtask's `SubtaskFlags` on its thread, and
//! on every resume of its fiber), so nothing has to be handed down the chain:
//!
//! | ask | what it tells | what a waiting sink does |
//! |---|---|---|
//! | [`stop_requested`] | the job is stopping | gives the wait up and returns [`Halt::Stopped`]: what it had in flight is replayed from the last checkpoint |
//! | [`barrier_expected`] | a checkpoint was triggered and its barrier has not passed this subtask yet | takes records instead of blocking for room (up to its own bound), so the barrier reaches it and passes at once |
//! | [`decline`] | — | says the expected checkpoint cannot complete (it cannot take more), so the coordinator fails it now, with the reason, instead of letting it expire |
//! | [`wait_for`] | — | the one shape of a bounded wait: a deadline, a name shown while it lasts, a stop honoured |
//!
//! Outside a subtask's thread (a test calling a sink directly) no flags are installed: no stop
//! is ever requested, no barrier is expected, a decline goes nowhere.

use super::Halt;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How a subtask tells the coordinator that checkpoint `id` cannot complete, and why.
pub(crate) type DeclineFn = Box<dyn Fn(u64, String) + Send + Sync>;

/// What a subtask's own code may ask of its subtask while it waits on the outside. One per
/// subtask, shared by its mailbox (which sets the stop and the expected checkpoint as messages
/// are posted) and its thread (which reads them, and notes each barrier that passed).
#[derive(Default)]
pub(crate) struct SubtaskFlags {
    /// A stop was requested (set before the stop message is queued).
    stop: AtomicBool,
    /// The newest checkpoint triggered: its barrier is on its way to this subtask.
    expected: AtomicU64,
    /// The newest barrier that passed this subtask (its snapshot taken).
    passed: AtomicU64,
    /// The newest checkpoint this subtask declined (one decline per checkpoint).
    declined: AtomicU64,
    /// Where declines go (the coordinator); unset when the job takes no checkpoints.
    decline: OnceLock<DeclineFn>,
}

impl std::fmt::Debug for SubtaskFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubtaskFlags")
            .field("stop", &self.stop.load(Ordering::Relaxed))
            .field("expected", &self.expected.load(Ordering::Relaxed))
            .field("passed", &self.passed.load(Ordering::Relaxed))
            .finish()
    }
}

impl SubtaskFlags {
    /// The job asks the subtask to stop.
    pub(crate) fn request_stop(&self) {
        // Release: pairs with the Acquire in `stop_requested`.
        self.stop.store(true, Ordering::Release);
    }

    /// Whether a stop was requested.
    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Checkpoint `id` was triggered; its barrier is on its way.
    pub(crate) fn expect(&self, id: u64) {
        self.expected.fetch_max(id, Ordering::AcqRel);
    }

    /// Barrier `id` passed this subtask.
    pub(crate) fn passed(&self, id: u64) {
        self.passed.fetch_max(id, Ordering::AcqRel);
    }

    /// The checkpoint whose barrier is on its way, if any.
    pub(crate) fn expected(&self) -> Option<u64> {
        let expected = self.expected.load(Ordering::Acquire);
        (expected > self.passed.load(Ordering::Acquire)).then_some(expected)
    }

    /// Send declines of this subtask's checkpoints to `to` (set once, at start).
    pub(crate) fn on_decline(&self, to: DeclineFn) {
        let _ = self.decline.set(to);
    }

    fn decline(&self, why: impl FnOnce() -> String) -> bool {
        let Some(id) = self.expected() else { return false };
        self.decline_id(id, why)
    }

    fn decline_id(&self, id: u64, why: impl FnOnce() -> String) -> bool {
        let Some(to) = self.decline.get() else { return false };
        if self.declined.fetch_max(id, Ordering::AcqRel) < id {
            to(id, why());
        }
        true
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<SubtaskFlags>>> = const { RefCell::new(None) };
}

/// Make `flags` the current thread's (a subtask's thread at start; a fiber at each resume).
pub(crate) fn install(flags: Arc<SubtaskFlags>) {
    CURRENT.with(|c| *c.borrow_mut() = Some(flags));
}

fn with<R>(f: impl FnOnce(&SubtaskFlags) -> R) -> Option<R> {
    CURRENT.with(|c| c.borrow().as_deref().map(f))
}

/// Whether the job asked this subtask to stop: a wait on the outside gives up and returns
/// [`Halt::Stopped`].
pub fn stop_requested() -> bool {
    with(SubtaskFlags::stop_requested).unwrap_or(false)
}

/// The checkpoint whose barrier is on its way to this subtask (triggered, not yet passed
/// here), if any. A sink that would block for room takes records instead while this is
/// `Some`, up to its own bound: the barrier then reaches it and passes at once, and what it
/// holds goes into the checkpoint.
pub fn barrier_expected() -> Option<u64> {
    with(SubtaskFlags::expected).flatten()
}

/// The checkpoint on its way cannot complete: this subtask cannot take the records before its
/// barrier (a sink at its bound, its destination not answering), or cannot prepare what it
/// holds. The coordinator fails that checkpoint at once with `why` (called only for the first
/// decline of it), instead of letting it expire. Returns whether the checkpoint on its way is
/// declined (now or before); `false` when none is on its way or the job takes no checkpoints.
pub fn decline(why: impl FnOnce() -> String) -> bool {
    with(|f| f.decline(why)).unwrap_or(false)
}

/// A sink at its bound, about to wait for its destination: whether to take the record
/// instead. While a checkpoint's barrier is on its way, a sink takes records past its bound,
/// as long as what it holds is `within` its second bound, so that the barrier reaches it and
/// passes at once (what it holds goes into the checkpoint); past that bound the checkpoint on
/// its way is declined with `why` (see [`decline`]) and the sink waits. `false` (wait) when no
/// barrier is on its way.
pub fn take_for_barrier(within: bool, why: impl FnOnce() -> String) -> bool {
    if barrier_expected().is_none() {
        return false;
    }
    if within {
        return true;
    }
    decline(why);
    false
}

/// Checkpoint `id`, whose barrier this subtask is taking its snapshot for, cannot complete:
/// what the subtask holds cannot be made ready for it (a Kafka transaction the broker has not
/// acknowledged). As [`decline`], for that checkpoint; `false` when the job takes no
/// checkpoints (nothing to decline to: the caller must then wait or fail).
pub fn decline_checkpoint(id: u64, why: impl FnOnce() -> String) -> bool {
    with(|f| f.decline_id(id, why)).unwrap_or(false)
}

/// How a bounded wait ended without its result.
#[derive(Debug)]
pub enum Waited<E> {
    /// The job is stopping.
    Stopped,
    /// The deadline passed: `what` had not happened after `waited`.
    Expired {
        /// What was waited for (the wait's name).
        what: String,
        /// How long it was waited for.
        waited: Duration,
    },
    /// A step failed.
    Failed(E),
}

impl<E: Into<Halt>> Waited<E> {
    /// As a [`Halt`]: a stop stops, an expired wait fails with `expired`'s failure.
    pub fn into_halt(self, expired: impl FnOnce(String, Duration) -> Halt) -> Halt {
        match self {
            Waited::Stopped => Halt::Stopped,
            Waited::Expired { what, waited } => expired(what, waited),
            Waited::Failed(e) => e.into(),
        }
    }
}

/// Steps of a wait are at most this long, so a stop is seen within it.
pub const WAIT_STEP: Duration = Duration::from_millis(100);

/// A wait that lasts longer than this is shown (weir-stat, an expired checkpoint's reason).
pub const SHOW_AFTER: Duration = Duration::from_millis(500);

/// A waiting note that lasts longer than this is logged (a warning) by the job's monitor,
/// again every [`LOG_EVERY`] while it lasts, and at its end (one mechanism for every note,
/// whoever puts it up: [`crate::telemetry::waiting`]).
pub use crate::telemetry::waiting::{LOG_AFTER, LOG_EVERY};

/// Wait for something outside, until `deadline`: `step(limit)` looks (blocking at most
/// `limit`, never more than [`WAIT_STEP`]) and returns `Some` when it is done. Between steps
/// a stop is honoured; once the wait has lasted [`SHOW_AFTER`] it is named (`what()`, refreshed
/// each step) in the subtask's waiting note, and cleared when the wait ends. While the note is
/// up the subtask's time counts as waiting; weir-stat, weir top, Prometheus, an expired
/// checkpoint's reason and a stop that ran out of time show it; the monitor logs it once it
/// has lasted [`LOG_AFTER`] (`event=waiting`), again every [`LOG_EVERY`], and when it ends.
pub fn wait_for<T, E>(
    what: impl Fn() -> String,
    deadline: Instant,
    mut step: impl FnMut(Duration) -> Result<Option<T>, E>,
) -> Result<T, Waited<E>> {
    let start = Instant::now();
    let mut shown = false;
    let result = loop {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        match step(left.min(WAIT_STEP)) {
            Ok(Some(done)) => break Ok(done),
            Ok(None) => {}
            Err(e) => break Err(Waited::Failed(e)),
        }
        if stop_requested() {
            break Err(Waited::Stopped);
        }
        let now = Instant::now();
        if now >= deadline {
            break Err(Waited::Expired { what: what(), waited: now - start });
        }
        if now - start >= SHOW_AFTER {
            shown = true;
            crate::telemetry::waiting::waiting_on(&what);
        }
    };
    if shown {
        crate::telemetry::waiting::waiting_over();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Without flags installed nothing is requested or expected, and a decline goes nowhere.
    #[test]
    fn outside_a_subtask_nothing_is_asked() {
        std::thread::spawn(|| {
            assert!(!stop_requested());
            assert_eq!(barrier_expected(), None);
            assert!(!decline(|| unreachable!("no coordinator to tell")));
        })
        .join()
        .expect("the thread ran");
    }

    /// A barrier is expected from its trigger until it passed; a decline goes out once per
    /// checkpoint, and only while one is expected.
    #[test]
    fn expected_barriers_and_declines() {
        std::thread::spawn(|| {
            let flags = Arc::new(SubtaskFlags::default());
            let sent = Arc::new(Mutex::new(Vec::new()));
            let to = sent.clone();
            flags.on_decline(Box::new(move |id, why| to.lock().unwrap().push((id, why))));
            install(flags.clone());
            assert_eq!(barrier_expected(), None);
            assert!(!decline(|| "nothing expected".into()));
            flags.expect(3);
            assert_eq!(barrier_expected(), Some(3));
            assert!(decline(|| "full".into()));
            assert!(decline(|| unreachable!("one decline message per checkpoint")));
            flags.passed(3);
            assert_eq!(barrier_expected(), None);
            flags.expect(4);
            assert!(decline(|| "still full".into()));
            assert_eq!(*sent.lock().unwrap(), vec![(3, "full".to_owned()), (4, "still full".to_owned())]);
            flags.request_stop();
            assert!(stop_requested());
        })
        .join()
        .expect("the thread ran");
    }

    /// A wait returns its result, expires at its deadline naming what it waited for, and gives
    /// up at a stop.
    #[test]
    fn a_wait_ends_by_result_deadline_or_stop() {
        std::thread::spawn(|| {
            let flags = Arc::new(SubtaskFlags::default());
            install(flags.clone());
            let mut looks = 0;
            let got: Result<u32, Waited<Halt>> = wait_for(
                || "the answer".into(),
                Instant::now() + Duration::from_secs(60),
                |_| {
                    looks += 1;
                    Ok(if looks == 3 { Some(42) } else { None })
                },
            );
            assert_eq!(got.unwrap(), 42);
            let expired: Result<(), Waited<Halt>> = wait_for(
                || "an API that never answers".into(),
                Instant::now() + Duration::from_millis(20),
                |limit| {
                    std::thread::sleep(limit);
                    Ok(None)
                },
            );
            match expired {
                Err(Waited::Expired { what, waited }) => {
                    assert_eq!(what, "an API that never answers");
                    assert!(waited >= Duration::from_millis(20));
                }
                other => panic!("expected an expiry, got {other:?}"),
            }
            flags.request_stop();
            let stopped: Result<(), Waited<Halt>> =
                wait_for(|| "anything".into(), Instant::now() + Duration::from_secs(3600), |_| Ok(None));
            assert!(matches!(stopped, Err(Waited::Stopped)));
        })
        .join()
        .expect("the thread ran");
    }
}
