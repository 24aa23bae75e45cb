//! The input gate: a subtask's input rings, read fairly, their watermarks combined, and
//! checkpoint barriers aligned.
//!
//! Alignment: when barrier n arrives on a channel, that channel is *blocked* — not read,
//! not parked on — until barrier n has arrived on every channel that has not ended. Then the
//! gate hands barrier n to the subtask (which snapshots and forwards it) and unblocks all.
//! Records behind a barrier so wait in their ring, where credit bounds them.

use super::credit::{Drain, DrainClock};
use super::valve::WatermarkValve;
use crate::chain::ErasedInput;
use crate::operators::{Halt, OperatorError, Signal};
use std::time::{Duration, Instant};
use weir_ring::{Batch, Consumer, ParkToken, RecordKind};

/// One incoming ring.
pub(crate) struct InputChannel {
    pub consumer: Consumer,
    pub name: String,
    pub ended: bool,
    /// Barrier of the alignment in progress arrived here: not read until it completes.
    pub blocked: bool,
    /// Credit by time: the drain measurement behind this channel's announcement (`None`:
    /// the channel announces nothing, its sender may fill the ring).
    pub drain: Option<Drain>,
}

/// All input rings of one subtask.
pub(crate) struct InputGate {
    pub channels: Vec<InputChannel>,
    next: usize,
    live: usize,
    valve: WatermarkValve,
    /// The barrier being aligned, and when its first copy arrived.
    aligning: Option<(u64, Instant)>,
    /// When the channels' drain rates are sampled (`None`: no channel announces).
    drain_clock: Option<DrainClock>,
    /// With a drain clock: a sampling period plus the coarse clock's resolution, ns — how
    /// long a pass may run before it ends early, so a receiver that turned slow is sampled
    /// within a period, not after a whole pass of slow records.
    pass_budget_ns: u64,
    /// Records between looks at the clock in a pass: `CHECK_EVERY` while records are
    /// cheap, 1 once a pass ran over (they are not).
    check_every: u32,
}

/// What one pass over the channels did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Polled {
    /// Data records processed.
    pub records: usize,
    /// Watermarks forwarded (the chain may now have pending work: see `Collector::resume`).
    pub watermarks: usize,
    /// Latency markers passed on (work: they must be flushed on, not wait for records).
    pub markers: usize,
    /// A barrier aligned on every channel: its id and the ns its channels were blocked.
    /// The subtask snapshots and forwards it.
    pub barrier: Option<(u64, u64)>,
}

impl Polled {
    /// Whether the pass did anything.
    pub(crate) fn any(&self) -> bool {
        self.records + self.watermarks + self.markers > 0 || self.barrier.is_some()
    }
}

/// Records taken from one channel before the gate moves on to the next: fairness between
/// channels, and a bound on how long a pass runs between mailbox checks.
const PER_CHANNEL_BATCH: usize = 64;

/// Records between looks at the (coarse) clock within a pass, while records are cheap (with
/// credit by time only: a pass that runs past its sampling period ends early): a whole
/// channel's turn, so a fixed-stride frame's records go down the chain as one run of up to
/// 64 (runs are cut at the clock checks). A receiver that turns slow is seen after at most
/// this many slow records; from then on after each record, the interval doubling back with
/// every pass that fits its period. (At 8, the unchained 5-subtask chain of
/// `chain_unchained` ran at 13.3 M records per CPU-second; at 64, 16.5 with a thread per
/// subtask and 20 with fibers.)
const CHECK_EVERY: u32 = PER_CHANNEL_BATCH as u32;

impl InputGate {
    /// A gate over `channels`; a channel silent for `idle_timeout` stops holding the
    /// watermark back (see [`crate::time`]).
    pub(crate) fn new(mut channels: Vec<InputChannel>, idle_timeout: Option<Duration>) -> InputGate {
        let live = channels.len();
        let valve = WatermarkValve::new(channels.len(), idle_timeout, Instant::now());
        let period = channels.iter().filter_map(|c| c.drain.as_ref().map(Drain::period)).min();
        for c in &mut channels {
            if let Some(d) = &mut c.drain {
                d.skip(&c.consumer);
            }
        }
        InputGate {
            channels,
            next: 0,
            live,
            valve,
            aligning: None,
            drain_clock: period.map(DrainClock::new),
            pass_budget_ns: period.map_or(0, |p| p.as_nanos() as u64 + weir_ring::process::coarse_resolution_ns()),
            check_every: CHECK_EVERY,
        }
    }

    /// The subtask's clock after a pass: `wall_ns` since it started, `idle_ns` of them idle.
    /// When a sample is due, each channel that announces updates its drain rate and, if it
    /// moved enough, its announcement (see [`super::credit`]). A channel blocked by an
    /// alignment or ended is skipped: it was not read for reasons other than speed.
    #[inline]
    pub(crate) fn settled(&mut self, wall_ns: u64, idle_ns: u64) {
        let Some(clock) = &mut self.drain_clock else { return };
        let Some(busy) = clock.due(wall_ns, idle_ns) else { return };
        for c in &mut self.channels {
            if let Some(d) = &mut c.drain {
                if c.ended || c.blocked {
                    d.skip(&c.consumer);
                    continue;
                }
                d.sample(&mut c.consumer, busy);
            }
        }
    }

    /// Barrier `id` arrived on channel `i`: block it; say whether every live channel is now
    /// blocked (the alignment is complete).
    fn barrier_arrived(&mut self, i: usize, id: u64) -> Result<(), Halt> {
        match self.aligning {
            Some((current, _)) if current == id => {}
            Some((current, _)) if id < current => {
                return Err(OperatorError::BarrierOrder { channel: self.channels[i].name.clone(), id, current }.into());
            }
            // A newer barrier while an older one aligns cannot happen (every channel carries
            // every barrier, in order); if it does, the older alignment is abandoned.
            _ => {
                for c in &mut self.channels {
                    c.blocked = false;
                }
                self.aligning = Some((id, Instant::now()));
            }
        }
        self.channels[i].blocked = true;
        Ok(())
    }

    /// The aligned barrier, once every live channel delivered it; unblocks all.
    fn aligned(&mut self) -> Option<(u64, u64)> {
        let (id, since) = self.aligning?;
        if self.channels.iter().any(|c| !c.ended && !c.blocked) {
            return None;
        }
        self.aligning = None;
        for c in &mut self.channels {
            c.blocked = false;
        }
        Some((id, since.elapsed().as_nanos() as u64))
    }

    /// Whether every channel has ended.
    pub(crate) fn ended(&self) -> bool {
        self.live == 0
    }

    /// One pass over the channels, round robin from where the last pass stopped: up to
    /// `PER_CHANNEL_BATCH` records from each, processed fully by `input` — a fixed-stride
    /// frame's records as a run (one batch down the chain), cut at the looks at the clock
    /// (every `check_every` records) when the channels announce credit by time. A watermark
    /// that advances the gate's minimum is forwarded to `input` and ends the pass, so the
    /// subtask can let the chain finish what it started (firing windows) before more input.
    /// With a `budget` (the chain has work pending that tolerates input between its chunks:
    /// [`crate::operators::Work::Interleave`]) the pass takes at most that many data records.
    pub(crate) fn poll(&mut self, input: &mut dyn ErasedInput, budget: Option<usize>) -> Result<Polled, Halt> {
        let mut polled = Polled::default();
        let mut budget = budget.unwrap_or(usize::MAX);
        let count = self.channels.len();
        // The clock is read once per pass, and only when channels can go idle.
        let now = self.valve.tracks_idleness().then(Instant::now);
        // The pass's own deadline, from its start (not from the end of the last pass: the
        // chain's pending work may have run in between).
        let deadline =
            self.drain_clock.as_ref().map(|_| weir_ring::process::coarse_monotonic_ns() + self.pass_budget_ns);
        let mut check_every = self.check_every;
        let mut until_check = check_every;
        let mut over = false;
        for k in 0..count {
            let i = (self.next + k) % count;
            let channel = &mut self.channels[i];
            if channel.ended || channel.blocked {
                continue;
            }
            let mut barrier = None;
            let mut forwarded = None;
            let mut read_any = false;
            let mut ended = false;
            let mut taken = 0;
            while taken < PER_CHANNEL_BATCH {
                let mut max = (PER_CHANNEL_BATCH - taken).min(budget);
                if let Some(deadline) = deadline {
                    if until_check == 0 {
                        if weir_ring::process::coarse_monotonic_ns() >= deadline {
                            // Records are slow: end the pass so the drain is sampled, and
                            // look at the clock after every record until a pass fits.
                            over = true;
                            check_every = 1;
                            break;
                        }
                        until_check = check_every;
                    }
                    max = max.min(until_check as usize);
                }
                // Records come a run at a time (a fixed-stride frame's records as one
                // slice, handed down the chain as a batch), control records one by one;
                // a control record that changes what the pass does ends the read.
                let mut controls = 0;
                let mut failed = None;
                let valve = &mut self.valve;
                let name = &channel.name;
                let markers = &mut polled.markers;
                let read = channel.consumer.read_runs(max, |kind, run, stride| {
                    let step = match kind {
                        RecordKind::Data => input.on_run(run, stride).map(|()| true),
                        RecordKind::Watermark => {
                            controls += 1;
                            match watermark_of(run) {
                                Some(w) => {
                                    forwarded = valve.watermark(i, w);
                                    Ok(forwarded.is_none())
                                }
                                None => Err(bad_control(name, "watermark")),
                            }
                        }
                        RecordKind::EndOfStream => {
                            controls += 1;
                            ended = true;
                            Ok(false)
                        }
                        RecordKind::Barrier => {
                            controls += 1;
                            match watermark_of(run) {
                                Some(id) => {
                                    barrier = Some(id);
                                    Ok(false)
                                }
                                None => Err(bad_control(name, "barrier")),
                            }
                        }
                        RecordKind::Latency => {
                            controls += 1;
                            match crate::operators::LatencyMarker::from_bytes(run) {
                                // Passed on at once: it measures the rings, not alignment.
                                Some(marker) => input.signal(Signal::Latency(marker)).map(|()| {
                                    *markers += 1;
                                    true
                                }),
                                None => Err(bad_control(name, "latency marker")),
                            }
                        }
                        _ => {
                            controls += 1;
                            Ok(true)
                        }
                    };
                    step.unwrap_or_else(|halt| {
                        failed = Some(halt);
                        false
                    })
                });
                let n = match read {
                    Ok(Batch::Records(n)) => n,
                    Ok(Batch::Empty) => break,
                    Ok(Batch::Closed) => {
                        // The sender went away without end-of-stream: it stopped or failed;
                        // the job learns why from that subtask.
                        ended = true;
                        break;
                    }
                    Err(e) => return Err(OperatorError::Input { channel: channel.name.clone(), source: e }.into()),
                };
                if let Some(halt) = failed {
                    return Err(halt);
                }
                read_any |= n > 0;
                taken += n;
                until_check = until_check.saturating_sub(n as u32);
                let data = n - controls;
                polled.records += data;
                budget -= data;
                if ended || barrier.is_some() || forwarded.is_some() {
                    break;
                }
                if budget == 0 {
                    // The pending work's share is read: back to it (this channel had its
                    // turn; the next one starts the next pass).
                    over = true;
                    break;
                }
                if n < max {
                    // The ring had no more.
                    break;
                }
            }
            if ended {
                channel.ended = true;
                self.live -= 1;
                forwarded = self.valve.end(i);
            }
            channel.consumer.publish();
            if let Some(id) = barrier {
                self.barrier_arrived(i, id)?;
            }
            if let (true, Some(now)) = (read_any, now)
                && let Some(w) = self.valve.seen(i, now)
            {
                forwarded = Some(forwarded.map_or(w, |f: u64| f.max(w)));
            }
            if let Some(w) = forwarded {
                input.signal(Signal::Watermark(w))?;
                polled.watermarks += 1;
                // Resume with the next channel: fairness holds across shortened passes.
                self.next = (i + 1) % count;
                self.check_every = check_every;
                polled.barrier = self.aligned();
                return Ok(polled);
            }
            if barrier.is_some() || self.channels[i].ended {
                polled.barrier = self.aligned();
                if polled.barrier.is_some() {
                    self.next = (i + 1) % count;
                    self.check_every = check_every;
                    return Ok(polled);
                }
            }
            if over {
                self.next = (i + 1) % count;
                break;
            }
        }
        if over {
            self.check_every = check_every;
        } else {
            // The pass fitted its period: look at the clock less often again.
            self.check_every = (check_every * 2).min(CHECK_EVERY);
            self.next = (self.next + 1) % count.max(1);
        }
        if let Some(now) = now
            && let Some(w) = self.valve.check_idle(now)
        {
            input.signal(Signal::Watermark(w))?;
            polled.watermarks += 1;
        }
        Ok(polled)
    }

    /// How long until a channel may go idle (when the subtask should look again).
    pub(crate) fn next_idle_check(&self) -> Option<Duration> {
        self.valve.next_idle_check(Instant::now())
    }

    /// Park until any live channel has a record (or the mailbox `doorbell` moves past `seq`),
    /// at most `timeout`.
    pub(crate) fn park(&mut self, doorbell: &std::sync::atomic::AtomicU32, seq: u32, timeout: Duration) {
        // On the stack for up to 16 inputs: a park allocates nothing.
        let mut tokens: smallvec::SmallVec<[ParkToken<'_>; 16]> = smallvec::SmallVec::new();
        let mut ready = false;
        // Blocked channels may hold records: parking on them would not sleep.
        for c in self.channels.iter().filter(|c| !c.ended && !c.blocked) {
            match c.consumer.prepare_park() {
                Some(token) => tokens.push(token),
                None => {
                    ready = true;
                    break;
                }
            }
        }
        if !ready {
            tokens.push(ParkToken::new(doorbell, seq));
            weir_ring::wait_any(&tokens, timeout);
        }
        drop(tokens);
        for c in self.channels.iter().filter(|c| !c.ended && !c.blocked) {
            c.consumer.end_park();
        }
    }
}

/// A control record on `channel` that does not hold what its kind says.
#[cold]
fn bad_control(channel: &str, kind: &'static str) -> Halt {
    OperatorError::BadControlRecord { channel: channel.to_owned(), kind }.into()
}

/// A watermark's or barrier's payload: the watermark or checkpoint id, u64 little-endian.
fn watermark_of(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(payload.try_into().ok()?))
}
