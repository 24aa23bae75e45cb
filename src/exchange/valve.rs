//! An input gate's watermark: one per input channel, the minimum forwarded.
//!
//! As Flink's `StatusWatermarkValve`: the output is the minimum over the *active, aligned*
//! channels, and it never goes back.
//!
//! - **active**: the channel sent something (a record of any kind) within the idle timeout.
//!   A channel silent for longer is *idle* and does not hold the minimum back; it becomes
//!   active again when it sends.
//! - **aligned**: the channel's watermark has reached the output. A channel that rejoins
//!   behind the output stays out of the minimum until it catches up, so rejoining never
//!   stalls the others (its records below the output are late, as they would have been).
//! - **ended**: end-of-stream is watermark `+∞`: the channel no longer holds anything back.
//!   When every channel has ended the output is `+∞`. When the only channels left are idle
//!   ones, the output is the largest of their watermarks (Flink would emit `+∞` when the
//!   others have ended; weir lets the idle inputs' own progress stand).

use std::time::{Duration, Instant};

struct ChannelClock {
    watermark: u64,
    idle: bool,
    ended: bool,
    last_seen: Instant,
}

/// Watermarks of one gate's channels.
pub(crate) struct WatermarkValve {
    channels: Vec<ChannelClock>,
    output: u64,
    idle_timeout: Option<Duration>,
}

impl WatermarkValve {
    /// `channels` inputs, none seen yet (watermark 0); `idle_timeout`: see the module.
    pub(crate) fn new(channels: usize, idle_timeout: Option<Duration>, now: Instant) -> WatermarkValve {
        WatermarkValve {
            channels: (0..channels)
                .map(|_| ChannelClock { watermark: 0, idle: false, ended: false, last_seen: now })
                .collect(),
            output: 0,
            idle_timeout,
        }
    }

    /// The watermark forwarded so far.
    #[cfg(test)]
    pub(crate) fn output(&self) -> u64 {
        self.output
    }

    /// Whether channels can go idle (then the gate must tell the valve the time).
    pub(crate) fn tracks_idleness(&self) -> bool {
        self.idle_timeout.is_some()
    }

    /// Channel `ch` delivered something at `now`: it is active (again). Returns the output if
    /// that advanced it (rejoining cannot, but the time of the call is when to look).
    pub(crate) fn seen(&mut self, ch: usize, now: Instant) -> Option<u64> {
        let c = &mut self.channels[ch];
        c.last_seen = now;
        if c.idle {
            c.idle = false;
            return self.recompute();
        }
        None
    }

    /// A watermark arrived on channel `ch`. Returns the new output if it advanced.
    pub(crate) fn watermark(&mut self, ch: usize, w: u64) -> Option<u64> {
        let c = &mut self.channels[ch];
        if w <= c.watermark {
            return None;
        }
        c.watermark = w;
        self.recompute()
    }

    /// Channel `ch` ended (end-of-stream, or its sender went away): watermark `+∞`.
    pub(crate) fn end(&mut self, ch: usize) -> Option<u64> {
        let c = &mut self.channels[ch];
        c.ended = true;
        c.idle = false;
        c.watermark = u64::MAX;
        self.recompute()
    }

    /// Mark channels silent for the idle timeout as idle. Returns the new output if that
    /// advanced it.
    pub(crate) fn check_idle(&mut self, now: Instant) -> Option<u64> {
        let timeout = self.idle_timeout?;
        let mut changed = false;
        for c in &mut self.channels {
            if !c.idle && !c.ended && now.saturating_duration_since(c.last_seen) >= timeout {
                c.idle = true;
                changed = true;
            }
        }
        if changed { self.recompute() } else { None }
    }

    /// How long until the next active channel would go idle (when to look again).
    pub(crate) fn next_idle_check(&self, now: Instant) -> Option<Duration> {
        let timeout = self.idle_timeout?;
        self.channels
            .iter()
            .filter(|c| !c.idle && !c.ended)
            .map(|c| (c.last_seen + timeout).saturating_duration_since(now))
            .min()
    }

    fn recompute(&mut self) -> Option<u64> {
        let (mut active, mut aligned_min, mut idle_max) = (0usize, None::<u64>, None::<u64>);
        for c in &self.channels {
            if c.ended {
                continue;
            }
            if c.idle {
                idle_max = Some(idle_max.map_or(c.watermark, |m| m.max(c.watermark)));
                continue;
            }
            active += 1;
            if c.watermark >= self.output {
                aligned_min = Some(aligned_min.map_or(c.watermark, |m| m.min(c.watermark)));
            }
        }
        let next = if active > 0 {
            aligned_min?
        } else {
            // Nothing active: the idle ones' progress stands; all ended: +∞.
            idle_max.unwrap_or(u64::MAX)
        };
        if next > self.output {
            self.output = next;
            Some(next)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The output is the minimum over channels, forwarded only when it advances, and
    /// end-of-stream counts as +∞.
    #[test]
    fn minimum_over_channels_and_end_is_infinity() {
        let t = Instant::now();
        let mut v = WatermarkValve::new(3, None, t);
        assert_eq!(v.watermark(0, 10), None);
        assert_eq!(v.watermark(1, 20), None);
        assert_eq!(v.watermark(2, 5), Some(5));
        assert_eq!(v.watermark(2, 30), Some(10));
        assert_eq!(v.watermark(0, 8), None, "a channel's watermark never goes back");
        assert_eq!(v.end(0), Some(20));
        assert_eq!(v.end(1), Some(30));
        assert_eq!(v.end(2), Some(u64::MAX));
        assert_eq!(v.output(), u64::MAX);
    }

    /// A silent channel goes idle after the timeout and stops holding the minimum back; it
    /// rejoins when it sends, but holds the minimum again only once it has caught up.
    #[test]
    fn idle_channels_step_aside_and_rejoin() {
        let t0 = Instant::now();
        let timeout = Duration::from_millis(100);
        let mut v = WatermarkValve::new(2, Some(timeout), t0);
        assert_eq!(v.watermark(0, 50), None, "channel 1 holds it at 0");
        let t1 = t0 + Duration::from_millis(60);
        v.seen(0, t1);
        assert_eq!(v.check_idle(t1), None, "not yet idle");
        assert_eq!(v.next_idle_check(t1), Some(Duration::from_millis(40)), "channel 1 goes idle first");
        let t2 = t0 + Duration::from_millis(100);
        assert_eq!(v.check_idle(t2), Some(50), "channel 1 idle: channel 0 alone decides");
        v.seen(0, t2);
        assert_eq!(v.watermark(0, 70), Some(70));
        // Channel 1 comes back, behind: it is active again but not aligned.
        let t3 = t0 + Duration::from_millis(120);
        assert_eq!(v.seen(1, t3), None);
        assert_eq!(v.watermark(1, 40), None, "behind the output: not counted");
        v.seen(0, t3);
        assert_eq!(v.watermark(0, 90), Some(90), "the lagging channel does not stall channel 0");
        assert_eq!(v.watermark(1, 95), None, "caught up (aligned), now it is the minimum with 0");
        assert_eq!(v.watermark(0, 120), Some(95));
    }

    /// When every live channel is idle, the largest idle watermark stands; ended channels do
    /// not turn that into +∞.
    #[test]
    fn all_idle_takes_the_largest_idle_watermark() {
        let t0 = Instant::now();
        let mut v = WatermarkValve::new(3, Some(Duration::from_millis(10)), t0);
        v.watermark(0, 30);
        v.watermark(1, 40);
        assert_eq!(v.end(2), Some(30));
        assert_eq!(v.check_idle(t0 + Duration::from_millis(10)), Some(40));
        assert_eq!(v.next_idle_check(t0), None, "nothing left to go idle");
    }
}
