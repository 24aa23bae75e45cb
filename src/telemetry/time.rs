//! Where a subtask's time goes, accounted as it passes: *busy* (processing), *backpressured*
//! (waiting for credit on an output), *idle* (waiting for input) and *waiting* (on the
//! outside: a destination, a broker, another process — what [`waiting_on`] names).
//!
//! The subtask's thread says when its state changes ([`TimeAccount::set_idle`],
//! [`TimeAccount::set_backpressured`], [`TimeAccount::set_waiting`]); it never writes the
//! counters file for them. The job's monitor thread reads the account every sample and writes
//! the four counters, *including the interval still open*: a subtask stuck for a minute in a
//! wait on its destination shows a minute of waiting while it lasts, not when it ends, and its
//! four counters always add up to its wall time (to within one sample). So every rate over
//! any window is right during an outage, and every view (Prometheus' `rate()`, `weir-stat`,
//! `weir top`) computes the same shares from the same counters: a state's share is its
//! counter's increase over the four counters' increase ([`shares`]).
//!
//! When states overlap, the first of these wins: backpressured (an output has no credit),
//! waiting (a note is up: whatever else the subtask does meanwhile — parking, retrying, a
//! pass over its inputs — is done for the outside's sake), idle, busy.
//!
//! The account is a seqlock over atomics (one writer, any number of readers): the writer
//! makes the sequence odd, updates, makes it even; a reader retries while it changed. State
//! changes are rare next to records (an idle period's start and end, a wait for credit), so
//! the cost is a few relaxed stores where the clock is read anyway.
//!
//! [`waiting_on`]: super::waiting::waiting_on

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// A state of a subtask's time.
#[repr(usize)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spent {
    /// Processing.
    Busy = 0,
    /// Waiting for credit on an output.
    Backpressured = 1,
    /// Waiting for input.
    Idle = 2,
    /// Waiting on the outside (a note is up).
    Waiting = 3,
}

/// Flag bits of the current state: the duty cycle idles, an output waits for credit, a
/// waiting note is up, the subtask ended (its clock stopped).
const IDLE: u32 = 1;
const BACKPRESSURED: u32 = 2;
const WAITING: u32 = 4;
const ENDED: u32 = 8;

fn state_of(flags: u32) -> Spent {
    if flags & BACKPRESSURED != 0 {
        Spent::Backpressured
    } else if flags & WAITING != 0 {
        Spent::Waiting
    } else if flags & IDLE != 0 {
        Spent::Idle
    } else {
        Spent::Busy
    }
}

/// One subtask's time (see the module docs). Written by the subtask's thread only.
#[derive(Debug)]
pub struct TimeAccount {
    start: Instant,
    /// Odd while the writer updates. SYNC POINT: the writer's Release stores pair with the
    /// Acquire load and fence in [`TimeAccount::read`].
    seq: AtomicU64,
    /// Closed intervals, ns, by [`Spent`].
    closed_ns: [AtomicU64; 4],
    /// Where the open interval began, ns since `start`.
    since_ns: AtomicU64,
    flags: AtomicU32,
}

impl Default for TimeAccount {
    fn default() -> TimeAccount {
        TimeAccount::new(Instant::now())
    }
}

impl TimeAccount {
    /// An account whose clock starts at `start`, busy.
    pub fn new(start: Instant) -> TimeAccount {
        TimeAccount {
            start,
            seq: AtomicU64::new(0),
            closed_ns: Default::default(),
            since_ns: AtomicU64::new(0),
            flags: AtomicU32::new(0),
        }
    }

    /// When the clock started.
    pub fn start(&self) -> Instant {
        self.start
    }

    fn ns_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Close the open interval at `at` and change the flags by `f` (the writer's one path).
    #[inline]
    fn change(&self, at: Instant, f: impl FnOnce(u32) -> u32) {
        let flags = self.flags.load(Ordering::Relaxed);
        let next = f(flags);
        if next == flags || flags & ENDED != 0 {
            return;
        }
        let now = self.ns_at(at);
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        // SYNC POINT: the odd sequence is visible before any field changes (pairs with the
        // reader's fence before its second look at `seq`).
        fence(Ordering::Release);
        let since = self.since_ns.load(Ordering::Relaxed);
        if now > since {
            let cell = &self.closed_ns[state_of(flags) as usize];
            cell.store(cell.load(Ordering::Relaxed) + (now - since), Ordering::Relaxed);
            self.since_ns.store(now, Ordering::Relaxed);
        }
        self.flags.store(next, Ordering::Relaxed);
        // Release: pairs with the Acquire load of `seq` in `read`; publishes the fields.
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    fn set(&self, bit: u32, on: bool, at: Instant) {
        self.change(at, |f| if on { f | bit } else { f & !bit });
    }

    /// The duty cycle starts (`true`) or ends an idle period at `at`.
    #[inline]
    pub fn set_idle(&self, idle: bool, at: Instant) {
        self.set(IDLE, idle, at);
    }

    /// An output starts or stops waiting for credit at `at`.
    #[inline]
    pub fn set_backpressured(&self, backpressured: bool, at: Instant) {
        self.set(BACKPRESSURED, backpressured, at);
    }

    /// A waiting note went up or down at `at`.
    pub fn set_waiting(&self, waiting: bool, at: Instant) {
        self.set(WAITING, waiting, at);
    }

    /// The subtask ended at `at`: the open interval is closed and the clock stops.
    pub fn end(&self, at: Instant) {
        self.change(at, |f| f | ENDED);
    }

    /// The ns spent in each state until now (the open interval counted), by [`Spent`]; the
    /// state now; and when "now" was. Any thread; consistent: the four add up to the time
    /// from the start to that instant (or to the end, when the subtask ended).
    ///
    /// A cell may read a little less than an earlier reading did: the writer closes an
    /// interval at the instant it read its clock, which may be before a reader's "now" that
    /// counted the same interval as open. Counters built on it keep their largest value
    /// (the monitor does).
    pub fn read(&self) -> ([u64; 4], Spent, Instant) {
        loop {
            // Acquire: pairs with the writer's Release store of an even sequence.
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mut ns = [0u64; 4];
            for (v, cell) in ns.iter_mut().zip(&self.closed_ns) {
                *v = cell.load(Ordering::Relaxed);
            }
            let since = self.since_ns.load(Ordering::Relaxed);
            let flags = self.flags.load(Ordering::Relaxed);
            // SYNC POINT: the loads above happen before the second look at `seq` (pairs with
            // the writer's Release fence after it made the sequence odd).
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            // Read after the fields: every interval they hold began at or before it.
            let now = Instant::now();
            let state = state_of(flags);
            if flags & ENDED == 0 {
                ns[state as usize] += self.ns_at(now).saturating_sub(since);
            }
            return (ns, state, now);
        }
    }

    /// Idle ns up to `at`, for the writer's own use (the drain clock of credit by time).
    #[inline]
    pub fn idle_ns(&self, at: Instant) -> u64 {
        let closed = self.closed_ns[Spent::Idle as usize].load(Ordering::Relaxed);
        let flags = self.flags.load(Ordering::Relaxed);
        if state_of(flags) == Spent::Idle && flags & ENDED == 0 {
            closed + self.ns_at(at).saturating_sub(self.since_ns.load(Ordering::Relaxed))
        } else {
            closed
        }
    }
}

/// Time spent in one kind of wait (a sink waiting for its destination), summed over every
/// waiter and live: each waiting thread starts a [`Wait`] and stops it, any number of them at
/// once (one stopwatch serves all subtasks of a node), and any thread reads the total with
/// every wait in progress counted, so a counter built on it grows during an outage, not after.
/// Two subtasks blocked for a second each count two seconds. Readings never go down.
///
/// Starts and stops are per wait, not per record, so a mutex over the three figures is cheap
/// and keeps them consistent (a count and a sum of start times in two atomics could be read
/// torn).
#[derive(Debug)]
pub struct Stopwatch {
    origin: Instant,
    waits: Mutex<Waits>,
    /// The largest total read, so that no reading is less than one before it (a stop that read
    /// the clock before a reader did, but took the lock after it).
    read_ns: AtomicU64,
}

/// The waits of a [`Stopwatch`]; times in ns since its `origin`.
#[derive(Debug, Default)]
struct Waits {
    /// Closed waits, summed.
    closed_ns: u64,
    /// Waits in progress.
    open: u64,
    /// Their start times, summed: what they have waited at `t` is `open * t - started_sum_ns`.
    started_sum_ns: u128,
}

/// One waiter's wait in progress on a [`Stopwatch`], from [`Stopwatch::start`] to
/// [`Stopwatch::stop`]. The waiter keeps it (a local, or a field of its own subtask's struct);
/// it is not `Clone`, so one wait is stopped once. A wait never stopped counts on for ever.
#[derive(Debug)]
#[must_use = "a wait counts until it is given to Stopwatch::stop"]
pub struct Wait {
    started: Instant,
}

impl Wait {
    /// When this wait began.
    pub fn started(&self) -> Instant {
        self.started
    }
}

impl Default for Stopwatch {
    fn default() -> Stopwatch {
        Stopwatch { origin: Instant::now(), waits: Mutex::new(Waits::default()), read_ns: AtomicU64::new(0) }
    }
}

impl Stopwatch {
    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn waits(&self) -> std::sync::MutexGuard<'_, Waits> {
        // The figures are whole after any panic (each update is a few additions), so a
        // poisoned lock is as good as any.
        self.waits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A wait begins; give what this returns to [`Stopwatch::stop`] when it ends. The waiting
    /// thread's call; others may be waiting at the same time.
    pub fn start(&self) -> Wait {
        self.start_at(Instant::now())
    }

    /// A wait ends. The waiting thread's call.
    pub fn stop(&self, wait: Wait) {
        self.stop_at(wait, Instant::now());
    }

    fn start_at(&self, at: Instant) -> Wait {
        let started_ns = self.ns(at);
        let mut w = self.waits();
        w.open += 1;
        w.started_sum_ns += u128::from(started_ns);
        Wait { started: at }
    }

    fn stop_at(&self, wait: Wait, at: Instant) {
        let started_ns = self.ns(wait.started);
        let waited_ns = self.ns(at).saturating_sub(started_ns);
        let mut w = self.waits();
        debug_assert!(w.open > 0, "a Wait stopped on a stopwatch that has none (another stopwatch's?)");
        w.open = w.open.saturating_sub(1);
        w.started_sum_ns = w.started_sum_ns.saturating_sub(u128::from(started_ns));
        w.closed_ns = w.closed_ns.saturating_add(waited_ns);
    }

    /// Whether any wait is in progress.
    pub fn running(&self) -> bool {
        self.waits().open > 0
    }

    /// The time waited, summed over waiters, every wait in progress included, ns.
    pub fn total_ns(&self) -> u64 {
        self.total_ns_at(Instant::now())
    }

    fn total_ns_at(&self, at: Instant) -> u64 {
        let total = {
            let w = self.waits();
            let open_ns = (u128::from(w.open) * u128::from(self.ns(at))).saturating_sub(w.started_sum_ns);
            w.closed_ns.saturating_add(u64::try_from(open_ns).unwrap_or(u64::MAX))
        };
        self.read_ns.fetch_max(total, Ordering::Relaxed).max(total)
    }
}

/// Shares of an interval from the increases of the four counters (busy, backpressured, idle,
/// waiting): each over their sum, which is the wall time they cover. `None` when nothing was
/// accounted (a subtask that has not started, or one that ended before the interval). The
/// one definition of the shares for `weir-stat`, `weir top` and the Prometheus dashboards
/// (`rate(x) / (rate(busy) + rate(backpressured) + rate(idle) + rate(waiting))`).
pub fn shares(delta_ns: [u64; 4]) -> Option<[f64; 4]> {
    let total: u64 = delta_ns.iter().sum();
    (total > 0).then(|| delta_ns.map(|d| d as f64 / total as f64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Each state's time lands in its own cell, the open interval counts, the cells add up
    /// to the wall time, and overlapping states resolve as documented.
    #[test]
    fn states_account_their_time() {
        let t0 = Instant::now();
        let a = TimeAccount::new(t0);
        a.set_idle(true, t0 + ms(10)); // busy 10
        a.set_idle(false, t0 + ms(30)); // idle 20
        a.set_waiting(true, t0 + ms(35)); // busy 5
        a.set_idle(true, t0 + ms(40)); // waiting 5 (idle under a note is waiting)
        a.set_backpressured(true, t0 + ms(50)); // waiting 10
        a.set_backpressured(false, t0 + ms(60)); // backpressured 10
        a.set_waiting(false, t0 + ms(100)); // waiting 40
        assert_eq!(a.idle_ns(t0 + ms(130)), 50_000_000, "idle again since 100");
        a.end(t0 + ms(130)); // idle 30
        let (ns, state, _) = a.read();
        assert_eq!(state, Spent::Idle);
        assert_eq!(ns, [15, 10, 50, 55].map(|m| m * 1_000_000));
        assert_eq!(ns.iter().sum::<u64>(), 130_000_000, "the clock stopped at the end");
        // The open interval counts while it lasts.
        let b = TimeAccount::new(Instant::now());
        b.set_waiting(true, b.start());
        let (ns, state, at) = b.read();
        assert_eq!(state, Spent::Waiting);
        assert_eq!(ns.iter().sum::<u64>(), u64::try_from((at - b.start()).as_nanos()).unwrap());
        assert_eq!(shares([1, 1, 2, 0]), Some([0.25, 0.25, 0.5, 0.0]));
        assert_eq!(shares([0; 4]), None);
    }

    /// A stopwatch counts the wait in progress, and stops counting when it ends.
    #[test]
    fn a_stopwatch_counts_the_wait_in_progress() {
        let w = Stopwatch::default();
        let t0 = w.origin;
        assert_eq!(w.total_ns_at(t0 + ms(5)), 0);
        assert!(!w.running());
        let a = w.start_at(t0 + ms(10));
        assert!(w.running());
        assert_eq!(w.total_ns_at(t0 + ms(12)), 2_000_000, "the wait in progress counts");
        w.stop_at(a, t0 + ms(13));
        assert!(!w.running());
        assert_eq!(w.total_ns_at(t0 + ms(20)), 3_000_000, "stopped: no more time");
        // The real clock: a wait started and stopped counts at least what it lasted.
        let b = w.start();
        let started = b.started();
        w.stop(b);
        let lasted = u64::try_from(started.elapsed().as_nanos()).unwrap();
        assert!(w.total_ns() >= 3_000_000 && w.total_ns() <= 3_000_000 + lasted);
    }

    /// Two waits at once both count: the total is the sum of what each waited, while they
    /// last and after; one waiter's stop does not end the other's wait.
    #[test]
    fn a_stopwatch_sums_overlapping_waits() {
        let w = Stopwatch::default();
        let t0 = w.origin;
        let a = w.start_at(t0 + ms(10));
        let b = w.start_at(t0 + ms(15));
        assert_eq!(w.total_ns_at(t0 + ms(20)), 15_000_000, "a 10 + b 5");
        w.stop_at(a, t0 + ms(30)); // a waited 20
        assert!(w.running(), "b still waits");
        assert_eq!(w.total_ns_at(t0 + ms(40)), 45_000_000, "a 20 + b 25 and counting");
        assert_eq!(w.total_ns_at(t0 + ms(50)), 55_000_000, "b counts on after a stopped");
        let c = w.start_at(t0 + ms(50));
        w.stop_at(b, t0 + ms(60)); // b waited 45
        w.stop_at(c, t0 + ms(70)); // c waited 20
        assert!(!w.running());
        assert_eq!(w.total_ns_at(t0 + ms(100)), 85_000_000, "a 20 + b 45 + c 20");
    }

    /// No reading is less than one before it, even when a stop names an earlier time than a
    /// reading already counted (a stop reads the clock before it takes the lock).
    #[test]
    fn stopwatch_readings_never_decrease() {
        let w = Stopwatch::default();
        let t0 = w.origin;
        let a = w.start_at(t0 + ms(10));
        assert_eq!(w.total_ns_at(t0 + ms(30)), 20_000_000);
        w.stop_at(a, t0 + ms(25)); // closes at 15, less than read
        assert_eq!(w.total_ns_at(t0 + ms(40)), 20_000_000, "the largest reading stands");
        let b = w.start_at(t0 + ms(40));
        assert_eq!(w.total_ns_at(t0 + ms(50)), 25_000_000, "15 closed + 10 open");
        w.stop_at(b, t0 + ms(50));
        // Many threads start and stop at once, a reader checks every reading against the last.
        let w = std::sync::Arc::new(w);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (w, done) = (w.clone(), done.clone());
            std::thread::spawn(move || {
                let mut last = 0;
                while !done.load(Ordering::Relaxed) {
                    let now = w.total_ns();
                    assert!(now >= last, "{now} < {last}");
                    last = now;
                }
            })
        };
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let wait = w.start();
                        w.stop(wait);
                    }
                })
            })
            .collect();
        for t in waiters {
            t.join().expect("waiters finish");
        }
        done.store(true, Ordering::Relaxed);
        reader.join().expect("every reading at least the one before");
        assert!(!w.running());
    }

    /// A reader on another thread always sees the four add up to the wall time of its
    /// reading, while the writer changes state as fast as it can.
    #[test]
    fn readers_see_consistent_growing_figures() {
        let a = std::sync::Arc::new(TimeAccount::default());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) || reads < 1000 {
                    let (ns, _, at) = a.read();
                    let wall = u64::try_from(at.duration_since(a.start()).as_nanos()).unwrap();
                    assert_eq!(ns.iter().sum::<u64>(), wall, "{ns:?}");
                    reads += 1;
                }
            })
        };
        for i in 0..200_000u32 {
            let now = Instant::now();
            match i % 3 {
                0 => a.set_idle(i % 2 == 0, now),
                1 => a.set_backpressured(i % 4 == 1, now),
                _ => a.set_waiting(i % 5 == 2, now),
            }
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("the reader's checks hold");
    }
}
