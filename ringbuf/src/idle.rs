//! Idle strategies: what a side does while it has nothing to do (no record to read,
//! no credit to write). Agrona's duty-cycle idea: after each pass of work call
//! [`Idler::idle`] with how much work the pass did; zero escalates, non-zero resets.

use std::time::{Duration, Instant};

/// How a waiting side spends its time. Pinned busy-spin is for bare metal with a core
/// per subtask; [`IdleStrategy::default`] (park) behaves on a 2-core machine running
/// more subtasks than cores: a parked side uses no CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStrategy {
    /// Spin forever with a CPU pause hint. Lowest latency; burns the core.
    BusySpin,
    /// Spin `spins` times, then yield the CPU on every further round.
    SpinYield {
        /// Rounds of spinning before yielding.
        spins: u32,
    },
    /// Spin, yield, then sleep, doubling from `min_sleep` to `max_sleep`.
    Backoff {
        /// Rounds of spinning.
        spins: u32,
        /// Rounds of yielding after that.
        yields: u32,
        /// First sleep.
        min_sleep: Duration,
        /// Longest sleep.
        max_sleep: Duration,
    },
    /// Spin for a while, yield a few times, then sleep on a futex word in the ring header
    /// until the other side wakes us; the other side makes that system call only when our
    /// waiter flag is set.
    ///
    /// The spin is bounded by time, not by a count of rounds (a pause takes 10 cycles on
    /// one CPU and 140 on the next), and it adapts to what the waits turn out to be: after a
    /// wait that spinning would have covered (work came within twice `spin`) the next idle
    /// period spins the whole `spin` again; after a longer one it spins half as long as the
    /// last, down to not at all. A side whose peer sends a record every few microseconds
    /// keeps spinning and never pays a wake-up; one whose peer is quiet for longer, or
    /// parked itself, parks at once and costs no CPU per record (the ski-rental rule: spin
    /// about as long as a park and a wake-up cost, no longer).
    Park {
        /// The longest spin of an idle period (before yielding and parking).
        spin: Duration,
        /// Rounds of yielding after the spin (0 where threads outnumber CPUs: a yield
        /// there hands the CPU to a neighbour for a whole slice, or does nothing).
        yields: u32,
    },
}

/// The default park strategy's longest spin: about what parking and being woken costs on
/// a virtual machine (a futex wake, an inter-processor interrupt, a context switch each
/// way: 10–20 µs measured on the project's 2-vCPU machines).
pub const DEFAULT_PARK_SPIN: Duration = Duration::from_micros(20);

impl Default for IdleStrategy {
    fn default() -> Self {
        IdleStrategy::Park { spin: DEFAULT_PARK_SPIN, yields: 8 }
    }
}

/// What the waiting side should do on this round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStep {
    /// Spin once (a pause hint).
    Spin,
    /// Yield the CPU.
    Yield,
    /// Sleep this long.
    Sleep(Duration),
    /// Park on the ring's futex until woken.
    Park,
}

/// Spin rounds between two looks at the clock while a time-bounded spin lasts.
const ROUNDS_PER_CLOCK: u32 = 32;

/// A spin budget below this is no spin at all.
const MIN_SPIN_NS: u64 = 250;

/// The state of one idle strategy: how long we have been idle, and (for `Park`) how long
/// the next idle period may spin.
#[derive(Clone, Debug)]
pub struct Idler {
    strategy: IdleStrategy,
    rounds: u32,
    /// `Park`: the spin budget of the current idle period, ns (at most `max_spin_ns`).
    spin_ns: u64,
    /// `Park`: the strategy's longest spin, ns (0: no spin, nothing to adapt, no clock).
    max_spin_ns: u64,
    /// `Park`: when the current idle period began — read at its first round when it may
    /// spin, else when it first parks — so that its end tells how long the wait was.
    since: Option<Instant>,
    /// `Park`: the current idle period got past spinning; the round it is in.
    phase: Phase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Spin,
    Yield(u32),
    Park,
}

impl Idler {
    /// A fresh idler.
    pub fn new(strategy: IdleStrategy) -> Idler {
        let spin_ns = match strategy {
            IdleStrategy::Park { spin, .. } => spin.as_nanos() as u64,
            _ => 0,
        };
        Idler { strategy, rounds: 0, spin_ns, max_spin_ns: spin_ns, since: None, phase: Phase::Spin }
    }

    /// The strategy.
    pub fn strategy(&self) -> IdleStrategy {
        self.strategy
    }

    /// Whether this strategy may park on a futex (so the peer must check our waiter flag).
    pub fn parks(&self) -> bool {
        matches!(self.strategy, IdleStrategy::Park { .. })
    }

    /// How long the next idle period may spin (`Park`; zero for the others).
    pub fn spin_budget(&self) -> Duration {
        Duration::from_nanos(self.spin_ns)
    }

    /// Work happened: start over from spinning. Costs one comparison unless the idle
    /// period it ends went past its spin (then one clock read, to adapt the next spin).
    #[inline]
    pub fn reset(&mut self) {
        if self.rounds == 0 {
            return;
        }
        self.rounds = 0;
        if self.max_spin_ns > 0 {
            if self.phase != Phase::Spin {
                self.adapt();
            } else {
                // Spinning found the work: spin as long as before, or longer, next time.
                self.spin_ns = self.spin_ns.max(MIN_SPIN_NS).saturating_mul(2).min(self.max_spin_ns);
            }
            self.since = None;
        }
        self.phase = Phase::Spin;
    }

    /// The idle period that just ended went past its spin: a wait that the longest spin
    /// would have covered (within twice it) restores the spin; a longer one halves it.
    #[cold]
    fn adapt(&mut self) {
        let max = self.max_spin_ns;
        let waited = self.since.map_or(u64::MAX, |t| t.elapsed().as_nanos() as u64);
        self.spin_ns = if waited <= max.saturating_mul(2) {
            max
        } else if self.spin_ns / 2 < MIN_SPIN_NS {
            0
        } else {
            self.spin_ns / 2
        };
    }

    /// The next step of an idle period (one call per round without work).
    #[inline]
    pub fn step(&mut self) -> IdleStep {
        let round = self.rounds;
        self.rounds = self.rounds.saturating_add(1);
        match self.strategy {
            IdleStrategy::BusySpin => IdleStep::Spin,
            IdleStrategy::SpinYield { spins } => {
                if round < spins {
                    IdleStep::Spin
                } else {
                    IdleStep::Yield
                }
            }
            IdleStrategy::Backoff { spins, yields, min_sleep, max_sleep } => {
                if round < spins {
                    IdleStep::Spin
                } else if round < spins.saturating_add(yields) {
                    IdleStep::Yield
                } else {
                    let doublings = (round - spins.saturating_add(yields)).min(20);
                    IdleStep::Sleep(min_sleep.saturating_mul(1 << doublings).min(max_sleep))
                }
            }
            IdleStrategy::Park { yields, .. } => self.park_step(round, yields),
        }
    }

    #[inline]
    fn park_step(&mut self, round: u32, yields: u32) -> IdleStep {
        if self.phase == Phase::Spin {
            if self.spin_ns > 0 {
                if round == 0 {
                    self.since = Some(Instant::now());
                    return IdleStep::Spin;
                }
                if !round.is_multiple_of(ROUNDS_PER_CLOCK)
                    || self.since.is_some_and(|t| (t.elapsed().as_nanos() as u64) < self.spin_ns)
                {
                    return IdleStep::Spin;
                }
            }
            self.phase = Phase::Yield(0);
            if self.max_spin_ns > 0 {
                self.since.get_or_insert_with(Instant::now);
            }
        }
        if let Phase::Yield(n) = self.phase {
            if n < yields {
                self.phase = Phase::Yield(n + 1);
                return IdleStep::Yield;
            }
            self.phase = Phase::Park;
        }
        IdleStep::Park
    }

    /// Whether the last step slept or parked (the idle period went past spinning and
    /// yielding): a caller that accounts idle time reads its clock then, not every round.
    #[inline]
    pub fn slept(&self) -> bool {
        match self.strategy {
            IdleStrategy::BusySpin | IdleStrategy::SpinYield { .. } => false,
            IdleStrategy::Backoff { spins, yields, .. } => self.rounds > spins.saturating_add(yields),
            IdleStrategy::Park { .. } => self.phase == Phase::Park,
        }
    }

    /// Agrona's duty-cycle call, the one place a step is carried out: `work_count > 0`
    /// resets; zero takes one step and performs it for Spin/Yield/Sleep. `Some(Park)` is
    /// returned to the caller, which knows what to park on (a ring, several rings and a
    /// mailbox).
    #[inline]
    pub fn idle(&mut self, work_count: usize) -> Option<IdleStep> {
        if work_count > 0 {
            self.reset();
            return None;
        }
        let step = self.step();
        match step {
            IdleStep::Spin => crate::sync::spin_hint(),
            IdleStep::Yield => crate::sync::yield_now(),
            IdleStep::Sleep(d) => crate::sync::sleep(d),
            IdleStep::Park => return Some(IdleStep::Park),
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each strategy escalates in its documented order and `reset` starts it over.
    #[test]
    fn escalation() {
        let mut idler = Idler::new(IdleStrategy::Park { spin: Duration::ZERO, yields: 1 });
        let steps: Vec<_> = (0..3).map(|_| idler.step()).collect();
        assert_eq!(steps, [IdleStep::Yield, IdleStep::Park, IdleStep::Park]);
        assert!(idler.slept(), "the second step parks");
        idler.reset();
        assert_eq!(idler.step(), IdleStep::Yield);
        assert!(!idler.slept());

        // A spin bounded by an hour spins for every round a test can take.
        let mut idler = Idler::new(IdleStrategy::Park { spin: Duration::from_secs(3600), yields: 0 });
        assert!((0..10_000).all(|_| idler.step() == IdleStep::Spin));
        assert!(!idler.slept());

        let ms = Duration::from_millis;
        let mut idler = Idler::new(IdleStrategy::Backoff { spins: 0, yields: 0, min_sleep: ms(1), max_sleep: ms(3) });
        let steps: Vec<_> = (0..3).map(|_| idler.step()).collect();
        assert_eq!(steps, [IdleStep::Sleep(ms(1)), IdleStep::Sleep(ms(2)), IdleStep::Sleep(ms(3))]);
        assert_eq!(Idler::new(IdleStrategy::BusySpin).step(), IdleStep::Spin);
    }

    /// Steps until the idler parks.
    fn until_park(idler: &mut Idler) {
        while idler.step() != IdleStep::Park {}
    }

    /// Waits longer than twice the spin halve the next spin, down to none; a wait the spin
    /// would have covered restores the whole spin. (Times are only ever "at least": a sleep
    /// of 1 ms is a wait longer than twice 100 ns, and a wait is never longer than an hour.)
    #[test]
    fn the_spin_adapts_to_the_waits() {
        let spin = Duration::from_nanos(1000);
        let mut idler = Idler::new(IdleStrategy::Park { spin, yields: 0 });
        assert_eq!(idler.spin_budget(), spin);
        let mut budgets = Vec::new();
        for _ in 0..4 {
            until_park(&mut idler);
            std::thread::sleep(Duration::from_millis(1));
            idler.reset();
            budgets.push(idler.spin_budget().as_nanos());
        }
        assert_eq!(budgets, [500, 250, 0, 0], "each long wait halves the spin; below 250 ns it is none");
        // With no spin the first step parks at once.
        assert_eq!(idler.step(), IdleStep::Park);

        // A long spin bound, so that any wait here counts as short: the whole spin is back.
        let spin = Duration::from_secs(3600);
        let mut idler = Idler::new(IdleStrategy::Park { spin: Duration::from_nanos(1), yields: 0 });
        idler.spin_ns = 0;
        until_park(&mut idler);
        idler.max_spin_ns = spin.as_nanos() as u64;
        idler.reset();
        assert_eq!(idler.spin_budget(), spin);

        // Work found while spinning keeps the spin.
        let _ = idler.step();
        idler.reset();
        assert_eq!(idler.spin_budget(), spin);
    }
}
