//! Fibers: several ring users on one thread, each on a stack of its own, switched where
//! they would have parked.
//!
//! Subtasks pinned to the same CPU gain nothing from being threads: the kernel can run only
//! one at a time there, and every hand-over between them is a futex wake, a context switch
//! and a scheduler decision (microseconds), or, when one spins while its runnable neighbour
//! waits, a whole scheduler slice. A [`Fibers`] set runs them on one thread instead. Each
//! fiber runs its duty cycle unchanged; where it would sleep — [`crate::wait_any`] (a park
//! on rings and a mailbox), a ring's own park, [`sleep`] — it hands the thread back to the
//! scheduler with the words it waits on, and the scheduler resumes another fiber whose
//! words changed, whose deadline passed or that only yielded. When every fiber waits, the
//! thread sleeps on all their words at once (`futex_waitv`), until the earliest deadline.
//!
//! Because a fiber stops exactly where a thread would have blocked, and nowhere else but
//! [`yield_now`], a set of fibers makes the same progress a set of threads would: a writer
//! out of credit waits inside `collect` while the reader on the same thread drains the ring.
//! No run-to-completion rule, no help-while-waiting, no new way to deadlock — as long as a
//! fiber blocks the thread only through these calls. A fiber that blocks in another way (a
//! `poll` on a socket, `std::thread::sleep`) holds up the others on its thread for that
//! long, and one that spins without parking holds them up for good: busy-spin strategies
//! must not run as fibers.
//!
//! A switch saves and restores the callee-saved registers and the stack pointer (corosensei):
//! tens of nanoseconds, against microseconds for a futex wake of another thread.

use crate::futex::ParkToken;
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// Why a fiber handed the thread back.
enum Stop {
    /// To let the others run; it is ready again at once.
    Yield,
    /// Until a word differs from its expected value, or the deadline.
    Park {
        /// The fiber's own tokens, on its stack: valid while it is suspended in [`park`].
        tokens: *const [ParkToken<'static>],
        deadline: Instant,
    },
}

type FiberYielder = Yielder<(), Stop>;

thread_local! {
    /// The yielder of the fiber running on this thread; null on the scheduler's stack (or
    /// on a thread without fibers).
    static CURRENT: Cell<*const FiberYielder> = const { Cell::new(std::ptr::null()) };
}

/// Sets CURRENT to null when dropped.
struct ClearCurrent;

impl Drop for ClearCurrent {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(std::ptr::null()));
    }
}

/// Whether the caller runs as a fiber.
pub fn in_fiber() -> bool {
    !CURRENT.with(Cell::get).is_null()
}

/// Hand the thread back to the scheduler with `stop`; false (and nothing done) when the
/// caller is not a fiber.
fn suspend(stop: Stop) -> bool {
    let current = CURRENT.with(Cell::get);
    // While this thread unwinds a panic, the other fibers must not run: they would see
    // `std::thread::panicking()` as theirs. The wait blocks the thread instead.
    if current.is_null() || std::thread::panicking() {
        return false;
    }
    CURRENT.with(|c| c.set(std::ptr::null()));
    // SAFETY: `current` was set by this fiber's body from the `&Yielder` corosensei passed
    // it, and the fiber is running (we are on its stack), so the yielder is alive.
    unsafe { (*current).suspend(stop) };
    CURRENT.with(|c| c.set(current));
    true
}

/// A fiber's park: give the thread to the others until a token's word differs from its
/// expected value, or `timeout`. False when the caller is not a fiber (it then waits on
/// its own).
pub(crate) fn park(tokens: &[ParkToken<'_>], timeout: Duration) -> bool {
    if !in_fiber() || std::thread::panicking() {
        return false;
    }
    // The lifetime is erased: the scheduler reads these only while this call is suspended.
    let tokens: *const [ParkToken<'static>] = tokens as *const [ParkToken<'_>] as _;
    // A deadline past the representable range is a deadline never reached in practice.
    let deadline = Instant::now().checked_add(timeout).unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
    suspend(Stop::Park { tokens, deadline })
}

/// Let the other fibers of this thread run (a preemption point between a fiber's passes,
/// so one that always has work does not keep the thread). True when the caller is a fiber.
/// Costs one thread-local load when it is not.
#[inline]
pub fn yield_now() -> bool {
    in_fiber() && suspend(Stop::Yield)
}

/// Sleep for `d`: as a fiber, let the others run meanwhile; else `std::thread::sleep`.
pub fn sleep(d: Duration) {
    if !park(&[], d) {
        std::thread::sleep(d);
    }
}

/// One fiber.
struct Fiber {
    coroutine: Coroutine<(), Stop, (), DefaultStack>,
    /// Why it stopped last; `None` while it has not run yet.
    stop: Option<Stop>,
    /// Called on the scheduler's stack before each resume: the fiber's thread-locals.
    on_resume: Box<dyn Fn()>,
    done: bool,
}

impl Fiber {
    /// Whether it may run now (`now`: the clock, read at most once per round).
    fn ready(&self, now: &mut Option<Instant>) -> bool {
        match &self.stop {
            None | Some(Stop::Yield) => true,
            Some(Stop::Park { tokens, deadline }) => {
                // SAFETY: the fiber is suspended inside `park`, whose caller holds the
                // tokens and the words they point at for as long as it waits.
                let tokens = unsafe { &**tokens };
                tokens.iter().any(|t| t.word.load(crate::sync::Ordering::Acquire) != t.expected)
                    || *now.get_or_insert_with(Instant::now) >= *deadline
            }
        }
    }
}

/// A set of fibers for one thread: [`spawn`](Fibers::spawn) them, then [`run`](Fibers::run)
/// them to their ends.
#[derive(Default)]
pub struct Fibers {
    fibers: Vec<Fiber>,
}

impl std::fmt::Debug for Fibers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fibers").field("fibers", &self.fibers.len()).finish()
    }
}

/// A fiber's stack: reserved, committed as it is touched, with a guard page.
pub const FIBER_STACK: usize = 8 << 20;

impl Fibers {
    /// An empty set whose thread sleeps as soon as every fiber waits.
    pub fn new() -> Fibers {
        Fibers::default()
    }

    /// Add a fiber running `body` on a stack of `stack_size` bytes; `on_resume` runs on the
    /// thread before each of its turns (to install its thread-locals). A panic in `body`
    /// is not caught here: catch it in `body` (else it comes out of [`run`](Fibers::run),
    /// and the other fibers are unwound and dropped).
    pub fn spawn(
        &mut self,
        stack_size: usize,
        on_resume: impl Fn() + 'static,
        body: impl FnOnce() + 'static,
    ) -> std::io::Result<()> {
        let stack = DefaultStack::new(stack_size)?;
        let coroutine = Coroutine::with_stack(stack, move |yielder: &FiberYielder, ()| {
            CURRENT.with(|c| c.set(yielder));
            // Cleared however the body ends, a panic included: no pointer to this
            // fiber's yielder outlives its stack.
            let _clear = ClearCurrent;
            body();
        });
        self.fibers.push(Fiber { coroutine, stop: None, on_resume: Box::new(on_resume), done: false });
        Ok(())
    }

    /// Run every fiber to its end, in turn; sleep on all their words when none can run.
    pub fn run(self) {
        self.run_watched(Duration::MAX, |_, _| {});
    }

    /// [`run`](Fibers::run), calling `on_long(i, took)` after a turn of fiber `i` (in the
    /// order spawned) that kept the thread for `long` or more while other fibers were live:
    /// it blocked them all that long (a fiber that blocks outside the fiber-aware waits, or
    /// a long pass). Turns are timed by the coarse clock (a few ms of resolution, two vDSO
    /// reads per turn).
    pub fn run_watched(mut self, long: Duration, mut on_long: impl FnMut(usize, Duration)) {
        let long_ns = u64::try_from(long.as_nanos()).unwrap_or(u64::MAX);
        let mut live = self.fibers.len();
        let mut words: Vec<ParkToken<'static>> = Vec::new();
        while live > 0 {
            let mut ran = false;
            let mut now = None;
            for (i, fiber) in self.fibers.iter_mut().enumerate() {
                if fiber.done || !fiber.ready(&mut now) {
                    continue;
                }
                ran = true;
                fiber.stop = None;
                (fiber.on_resume)();
                let began = crate::process::coarse_monotonic_ns();
                // Back on the scheduler's stack CURRENT is null, even if the fiber's panic
                // comes out of `resume` (then the others are dropped, unwinding, as threads).
                let clear = ClearCurrent;
                match fiber.coroutine.resume(()) {
                    CoroutineResult::Yield(stop) => fiber.stop = Some(stop),
                    CoroutineResult::Return(()) => {
                        fiber.done = true;
                        live -= 1;
                    }
                }
                drop(clear);
                let took = crate::process::coarse_monotonic_ns().saturating_sub(began);
                if took >= long_ns && live > usize::from(!fiber.done) {
                    on_long(i, Duration::from_nanos(took));
                }
            }
            if ran || live == 0 {
                continue;
            }
            // Every fiber waits: sleep on the union of their words until the first deadline.
            let mut deadline: Option<Instant> = None;
            for fiber in self.fibers.iter().filter(|f| !f.done) {
                if let Some(Stop::Park { tokens, deadline: d }) = &fiber.stop {
                    // SAFETY: as in `ready`: the fiber is suspended in `park`.
                    let tokens = unsafe { &**tokens };
                    words.extend(tokens.iter().map(|t| ParkToken { word: t.word, expected: t.expected }));
                    deadline = Some(deadline.map_or(*d, |x| x.min(*d)));
                }
            }
            let timeout = deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
            if !timeout.is_zero() {
                // More words than one futex_waitv takes: the rest are looked at every ms.
                let timeout = if words.len() > crate::futex::MAX_WAIT_WORDS {
                    timeout.min(Duration::from_millis(1))
                } else {
                    timeout
                };
                crate::futex::wait_any(&words, timeout);
            }
            words.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{AtomicU32, Ordering};
    use std::rc::Rc;

    /// Add a fiber running `body` on a small stack, with nothing to do between turns.
    fn spawn(fibers: &mut Fibers, body: impl FnOnce() + 'static) {
        fibers.spawn(64 << 10, || {}, body).expect("a stack");
    }

    /// A fiber waiting on a word another fiber of the same thread sets runs when it is set,
    /// and a fiber that yields lets the other run between its steps.
    #[test]
    fn fibers_hand_over_where_they_park() {
        let word = Rc::new(AtomicU32::new(0));
        let log = Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut fibers = Fibers::new();
        {
            let (word, log) = (word.clone(), log.clone());
            spawn(&mut fibers, move || {
                while word.load(Ordering::Acquire) == 0 {
                    log.borrow_mut().push("wait");
                    crate::wait_any(&[ParkToken::new(&word, 0)], Duration::from_secs(3600));
                }
                log.borrow_mut().push("woken");
            });
        }
        {
            let (word, log) = (word.clone(), log.clone());
            spawn(&mut fibers, move || {
                log.borrow_mut().push("step 1");
                assert!(yield_now(), "a fiber yields");
                log.borrow_mut().push("step 2");
                word.store(1, Ordering::Release);
            });
        }
        assert!(!in_fiber());
        fibers.run();
        assert_eq!(*log.borrow(), ["wait", "step 1", "step 2", "woken"]);
        assert!(!yield_now(), "outside a fiber nothing yields");
    }

    /// When every fiber waits, the thread sleeps until the first deadline; a fiber's sleep
    /// lets the others run.
    #[test]
    fn deadlines_end_waits() {
        let log = Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut fibers = Fibers::new();
        for (name, ms) in [("long", 20u64), ("short", 2)] {
            let log = log.clone();
            spawn(&mut fibers, move || {
                sleep(Duration::from_millis(ms));
                log.borrow_mut().push(name);
            });
        }
        fibers.run();
        assert_eq!(*log.borrow(), ["short", "long"]);
    }

    /// A turn that blocks the thread (here `std::thread::sleep`, not a fiber's sleep) while
    /// another fiber is live is reported with the blocking fiber's index.
    #[test]
    fn a_turn_that_blocks_the_others_is_reported() {
        let mut fibers = Fibers::new();
        spawn(&mut fibers, || sleep(Duration::from_millis(60)));
        spawn(&mut fibers, || std::thread::sleep(Duration::from_millis(60)));
        let mut long = Vec::new();
        fibers.run_watched(Duration::from_millis(20), |i, took| long.push((i, took)));
        assert_eq!(long.iter().map(|l| l.0).collect::<Vec<_>>(), [1], "{long:?}");
        assert!(long[0].1 >= Duration::from_millis(20), "{long:?}");
    }

    /// A panic in a body comes out of `run`, the other fibers are unwound (a wait in a drop
    /// during that unwinding blocks the thread instead of switching), and nothing on the
    /// thread is left looking like a fiber.
    #[test]
    fn a_panicking_body_leaves_no_fiber_behind() {
        struct WaitsOnDrop;
        impl Drop for WaitsOnDrop {
            fn drop(&mut self) {
                sleep(Duration::from_millis(1));
            }
        }
        let mut fibers = Fibers::new();
        spawn(&mut fibers, || {
            let _w = WaitsOnDrop;
            sleep(Duration::from_secs(3600));
        });
        spawn(&mut fibers, || panic!("boom"));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fibers.run()));
        assert!(result.is_err(), "the panic comes out of run");
        assert!(!in_fiber() && !yield_now(), "nothing left looking like a fiber");
    }

    /// `on_resume` runs before every turn of its fiber.
    #[test]
    fn on_resume_runs_before_each_turn() {
        let turns = Rc::new(Cell::new(0));
        let mut fibers = Fibers::new();
        let t = turns.clone();
        fibers
            .spawn(
                64 << 10,
                move || t.set(t.get() + 1),
                || {
                    for _ in 0..3 {
                        yield_now();
                    }
                },
            )
            .expect("a stack");
        fibers.run();
        assert_eq!(turns.get(), 4);
    }
}
