//! Idle strategies: what a side does while it has nothing to do (no record to read,
//! no credit to write). Agrona's duty-cycle idea: after each pass of work call
//! [`Idler::idle`] with how much work the pass did; zero escalates, non-zero resets.

use std::time::Duration;

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
    /// Spin, yield, then sleep on a futex word in the ring header until the other side
    /// wakes us; the other side makes that system call only when our waiter flag is set.
    Park {
        /// Rounds of spinning.
        spins: u32,
        /// Rounds of yielding after that.
        yields: u32,
    },
}

impl Default for IdleStrategy {
    fn default() -> Self {
        IdleStrategy::Park { spins: 64, yields: 8 }
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

/// The state of one idle strategy: how long we have been idle.
#[derive(Clone, Debug)]
pub struct Idler {
    strategy: IdleStrategy,
    rounds: u32,
}

impl Idler {
    /// A fresh idler.
    pub fn new(strategy: IdleStrategy) -> Idler {
        Idler { strategy, rounds: 0 }
    }

    /// The strategy.
    pub fn strategy(&self) -> IdleStrategy {
        self.strategy
    }

    /// Whether this strategy may park on a futex (so the peer must check our waiter flag).
    pub fn parks(&self) -> bool {
        matches!(self.strategy, IdleStrategy::Park { .. })
    }

    /// Work happened: start over from spinning.
    #[inline]
    pub fn reset(&mut self) {
        self.rounds = 0;
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
            IdleStrategy::Park { spins, yields } => {
                if round < spins {
                    IdleStep::Spin
                } else if round < spins.saturating_add(yields) {
                    IdleStep::Yield
                } else {
                    IdleStep::Park
                }
            }
        }
    }

    /// Whether the last step slept or parked (the idle period went past spinning and
    /// yielding): a caller that accounts idle time reads its clock then, not every round.
    #[inline]
    pub fn slept(&self) -> bool {
        match self.strategy {
            IdleStrategy::BusySpin | IdleStrategy::SpinYield { .. } => false,
            IdleStrategy::Backoff { spins, yields, .. } | IdleStrategy::Park { spins, yields } => {
                self.rounds > spins.saturating_add(yields)
            }
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
            IdleStep::Sleep(d) => std::thread::sleep(d),
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
        let mut idler = Idler::new(IdleStrategy::Park { spins: 2, yields: 1 });
        let steps: Vec<_> = (0..5).map(|_| idler.step()).collect();
        assert_eq!(steps, [IdleStep::Spin, IdleStep::Spin, IdleStep::Yield, IdleStep::Park, IdleStep::Park]);
        idler.reset();
        assert_eq!(idler.step(), IdleStep::Spin);
        assert!(!idler.slept());
        let _ = (idler.step(), idler.step(), idler.step());
        assert!(idler.slept(), "the fourth step parks");

        let ms = Duration::from_millis;
        let mut idler = Idler::new(IdleStrategy::Backoff { spins: 0, yields: 0, min_sleep: ms(1), max_sleep: ms(3) });
        let steps: Vec<_> = (0..3).map(|_| idler.step()).collect();
        assert_eq!(steps, [IdleStep::Sleep(ms(1)), IdleStep::Sleep(ms(2)), IdleStep::Sleep(ms(3))]);
        assert_eq!(Idler::new(IdleStrategy::BusySpin).step(), IdleStep::Spin);
    }
}
