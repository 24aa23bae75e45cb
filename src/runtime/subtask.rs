//! One subtask: a thread running a single-threaded duty cycle over its chain.
//!
//! One duty cycle, written once ([`run`], Agrona's shape): each pass `do_work` checks the
//! mailbox (one load), does a bounded amount of work (a source poll, or one chunk of work
//! the chain left pending, or one fair pass over the input rings), flushes outputs and says
//! how much it did; a pass that did nothing `idle`s — a source waits on its own readiness
//! (a Kafka queue's event fd) or the mailbox, a subtask fed by rings idles by its strategy
//! ([`Idler::idle`]), parking on every input ring and the mailbox at once, until the next
//! processing-time timer at the latest.
//!
//! Processing-time timers are a deadline this loop wakes for ([`Collector::poll_timers`]),
//! not `Control::Timer` messages through the mailbox: only this thread can fire its windows,
//! and a deadline needs no timer thread, no lock and no message per timer — the park already
//! takes a timeout. The mailbox stays for what comes from outside: stop, checkpoint
//! triggers (sources) and completions.
//!
//! Checkpoints: a source subtask takes checkpoint n when the trigger comes (between polls:
//! the position is exact); any other subtask when its gate has aligned barrier n. Either
//! way the chain snapshots as the barrier passes down it, then the subtask acks the
//! coordinator. At the end of input the same happens with the final barrier, and the
//! subtask waits for the final checkpoint to be durable before its sinks commit and it
//! exits.
//!
//! [`Collector::poll_timers`]: crate::operators::Collector::poll_timers Time is split the way
//! Flink splits it, plus one: *idle* (waiting for input, said here), *backpressured* (waiting
//! for credit, said by the output gates), *waiting* (on the outside, said by whoever puts up a
//! [`waiting`](crate::telemetry::waiting) note) and *busy* (the rest). The subtask only says
//! when its state changes; the account ([`TimeAccount`]) is turned into counters by the
//! monitor, the open interval included, so a stuck subtask's counters move.

use super::coordinator::{Ack, AckTiming, Msg};
use crate::chain::{ErasedInput, ErasedSource};
use crate::checkpoint::{FINAL, Snapshots};
use crate::exchange::{Control, InputGate, PARK_BACKSTOP, SubtaskContext};
use crate::operators::{Halt, Signal, SourcePoll, Wake, Work};
use crate::telemetry::time::TimeAccount;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use weir_ring::counters::SharedCounter;
use weir_ring::{IdleStep, Idler, ParkToken};

/// What feeds the chain.
pub(crate) enum Body {
    Source(Box<dyn ErasedSource>),
    Input { gate: InputGate, input: Box<dyn ErasedInput> },
}

/// Counters of one subtask the subtask writes itself (its time goes through its
/// [`TimeAccount`], which the monitor publishes).
#[derive(Clone)]
pub(crate) struct SubtaskCounters {
    pub records_in: SharedCounter,
    pub state: SharedCounter,
}

/// What a finished subtask reports.
#[derive(Debug, Clone)]
pub(crate) struct SubtaskReport {
    pub busy_ns: u64,
    pub backpressured_ns: u64,
    pub idle_ns: u64,
    pub waiting_ns: u64,
    pub records_in: u64,
}

pub(crate) struct Subtask {
    pub body: Body,
    pub ctx: Arc<SubtaskContext>,
    pub counters: SubtaskCounters,
    pub checkpoints: Option<Checkpoints>,
}

/// A subtask's link to the checkpoint coordinator.
pub(crate) struct Checkpoints {
    pub snapshots: Snapshots,
    pub acks: std::sync::mpsc::Sender<Msg>,
    /// This subtask's index in the coordinator's list.
    pub index: usize,
    /// The timing of a checkpoint whose ack waits for late parts (`Snapshots::hold`).
    pub held: std::cell::Cell<Option<(u64, Option<AckTiming>)>>,
}

impl Checkpoints {
    fn ack(&self, id: u64, timing: Option<AckTiming>) {
        if id != FINAL {
            crate::checkpoint::failpoint!("checkpoint::snapshot-taken");
        }
        // A held ack whose late parts came goes first; one still waiting is dropped (the
        // coordinator has one checkpoint in flight: it expired that one).
        self.send_held();
        self.held.set(None);
        let parts = self.snapshots.take();
        if !parts.late.is_empty() && id != FINAL {
            // A part comes later (a sink's batches on their way): the ack waits for it.
            self.snapshots.hold(id, parts);
            self.held.set(Some((id, timing)));
            return;
        }
        // The coordinator is gone only when the job is ending: nothing to ack to.
        let _ = self.acks.send(Msg::Ack(Ack { id, subtask: self.index, parts, timing }));
    }

    /// Send the held ack once its late parts have come (a `Cell` read while none is held).
    #[inline]
    fn send_held(&self) {
        if let Some((id, timing)) = self.held.get()
            && let Some((held_id, parts)) = self.snapshots.take_held()
        {
            self.held.set(None);
            debug_assert_eq!(id, held_id);
            let _ = self.acks.send(Msg::Ack(Ack { id, subtask: self.index, parts, timing }));
        }
    }
}

impl Subtask {
    /// Run to the end. `ended(failed)` is called when the run is over but before the
    /// subtask's rings close (they close as it is dropped): a failure is recorded before the
    /// peers that it leaves without a reader or a writer fail in turn, so the job reports the
    /// cause, not its consequences.
    pub(crate) fn run(mut self, ended: impl FnOnce(bool)) -> Result<SubtaskReport, Halt> {
        let start = self.ctx.time.start();
        // From its context's making to here the subtask waited to start: idle (see `start`).
        self.ctx.time.set_idle(false, Instant::now());
        self.counters.state.set(1);
        let cp = self.checkpoints.as_ref();
        // The doorbell starts at 0, and anything posted before this thread got here (a stop
        // from a job failing at start, a trigger) must still be seen: start from 0, not from
        // the doorbell's value now, or the first check skips those messages for good.
        let last_seq = 0;
        let result = match &mut self.body {
            Body::Source(source) => {
                let mut duty = SourceDuty {
                    source: source.as_mut(),
                    ctx: &self.ctx,
                    cp,
                    last_seq,
                    wait: Duration::ZERO,
                    paused: false,
                };
                run(&mut duty, &self.ctx, &self.counters, start)
            }
            Body::Input { gate, input } => {
                let idler = Idler::new(self.ctx.idle);
                let mut duty = InputDuty {
                    gate,
                    input: input.as_mut(),
                    ctx: &self.ctx,
                    cp,
                    last_seq,
                    idler,
                    timer: None,
                    expecting: None,
                    last_barrier: 0,
                };
                run(&mut duty, &self.ctx, &self.counters, start)
            }
        };
        self.ctx.time.end(Instant::now());
        let ([busy_ns, backpressured_ns, idle_ns, waiting_ns], _, _) = self.ctx.time.read();
        let report = SubtaskReport {
            busy_ns,
            backpressured_ns,
            idle_ns,
            waiting_ns,
            records_in: self.counters.records_in.get(),
        };
        self.counters.state.set(if result.is_ok() { 2 } else { 3 });
        ended(matches!(result, Err(Halt::Failed(_))));
        result.map(|()| report)
    }
}

/// What one pass of a duty cycle did.
enum Pass {
    /// Moved this many records, watermarks, barriers or chunks of pending work (0: nothing).
    Work(usize),
    /// The input ended: the chain is finished (and, with checkpoints, committed).
    Finished,
}

/// What feeds a subtask's chain, as a duty cycle sees it.
trait Duty {
    /// One bounded pass; how much it did.
    fn do_work(&mut self, counters: &SubtaskCounters) -> Result<Pass, Halt>;
    /// The pass did nothing: wait for more (by the strategy, the source's readiness, the
    /// mailbox, the next timer), bounded by [`PARK_BACKSTOP`]. True when it slept or parked
    /// (or got as far as trying to); false for a spin or yield round.
    fn idle(&mut self) -> bool;
    /// After each pass: `wall_ns` since the subtask started, `idle_ns` of them idle.
    fn settled(&mut self, _wall_ns: u64, _idle_ns: u64) {}
}

/// Rounds of spinning (or yielding) between two looks at the clock while idle: a few
/// microseconds of busy-spin.
const IDLE_ROUNDS_PER_CLOCK: u32 = 1024;

/// Working passes between two settlements (a clock read, the busy counter, the gate's drain
/// clock) while passes are short: a pass moves up to a batch in microseconds, and a clock
/// read (~30 ns on these VMs) per pass was 3 % of an unchained chain's samples. A pass in
/// which the coarse clock (~6 ns to read) moved settles at once, so slow passes (a slow sink,
/// the case credit by time is for) settle as before; the busy counter and the drain clock's
/// sampling run at most this many short passes late; an idle period settles at once.
const PASSES_PER_SETTLE: u32 = 8;

/// The duty cycle of every subtask: do work, and idle when there was none; time spent
/// idling is idle time, the rest is busy or (said by the output gates and waiting notes)
/// backpressured or waiting.
///
/// The clock is read when an idle period starts, after each park or sleep and every
/// [`IDLE_ROUNDS_PER_CLOCK`] rounds of spinning (for the drain clock of credit by time; the
/// counters show an idle period live whatever the strategy, as the monitor counts the open
/// interval) and when work resumes — not on every spin round, which would cost more than the
/// spin. An idle period ends at the clock read after a park
/// or sleep: the pass that follows is busy, however long it takes (a sink that parks for
/// each record and then spends 5 ms writing it is busy, not idle — the drain rate of credit
/// by time divides by that busy time). After spin or yield rounds, which read no clock, the
/// pass that ends the idle period counts as idle: with no clock read before it, where the
/// spin ended is not known (a clock read per spin round would double its cost).
fn run<D: Duty>(duty: &mut D, ctx: &SubtaskContext, counters: &SubtaskCounters, start: Instant) -> Result<(), Halt> {
    let mut idle_since: Option<Instant> = None;
    let mut spun = 0u32;
    let mut unsettled = 0u32;
    let mut settled_tick = 0u64;
    let time = &*ctx.time;
    let end_idle = |since: &mut Option<Instant>| {
        if since.take().is_some() {
            time.set_idle(false, Instant::now());
        }
    };
    loop {
        match duty.do_work(counters) {
            Ok(Pass::Work(0)) => {
                if idle_since.is_none() {
                    let now = Instant::now();
                    time.set_idle(true, now);
                    idle_since = Some(now);
                }
                let slept = duty.idle();
                spun += 1;
                if slept || spun == IDLE_ROUNDS_PER_CLOCK {
                    spun = 0;
                    let now = Instant::now();
                    // After a park the next pass starts now: if it works, it is busy; if
                    // not, it opens a new idle period (one more clock read, after a park).
                    if slept {
                        time.set_idle(false, now);
                        idle_since = None;
                    }
                    let (wall, idle) = settle(time, start, now);
                    duty.settled(wall, idle);
                }
                continue;
            }
            Ok(Pass::Work(_)) => {
                end_idle(&mut idle_since);
                spun = 0;
                // A fiber lets the others on its thread have a turn between passes, so one
                // that always has work (a source with credit) does not keep the thread.
                weir_ring::fiber::yield_now();
                unsettled += 1;
                let tick = weir_ring::process::coarse_monotonic_ns();
                if unsettled < PASSES_PER_SETTLE && tick == settled_tick {
                    continue;
                }
                settled_tick = tick;
            }
            Ok(Pass::Finished) => {
                end_idle(&mut idle_since);
                return Ok(());
            }
            Err(e) => {
                end_idle(&mut idle_since);
                return Err(e);
            }
        }
        unsettled = 0;
        let (wall, idle) = settle(time, start, Instant::now());
        duty.settled(wall, idle);
    }
}

/// The subtask's clock at `now`: wall ns since it started and idle ns of them (for the drain
/// clock of credit by time, which divides by the time not idle).
#[inline]
fn settle(time: &TimeAccount, start: Instant, now: Instant) -> (u64, u64) {
    ((now - start).as_nanos() as u64, time.idle_ns(now))
}

/// The messages posted since the last look (one load when there are none); a stop is an
/// error (the subtask exits).
fn check_mailbox(ctx: &SubtaskContext, last_seq: &mut u32) -> Result<Vec<Control>, Halt> {
    let seq = ctx.mailbox.seq();
    if seq == *last_seq {
        return Ok(Vec::new());
    }
    *last_seq = seq;
    let messages = ctx.mailbox.drain();
    if messages.contains(&Control::Stop) || ctx.mailbox.stop_requested() {
        return Err(Halt::Stopped);
    }
    Ok(messages)
}

/// The end of input with checkpoints: the chain has put its final parts (`end` ran it);
/// ack, wait until the coordinator says the final checkpoint is durable, then let the
/// chain commit (`complete`). Without checkpoints `end` is all.
fn finish(
    ctx: &SubtaskContext,
    cp: Option<&Checkpoints>,
    last_seq: &mut u32,
    end: impl FnOnce() -> Result<(), Halt>,
    mut complete: impl FnMut(u64) -> Result<(), Halt>,
) -> Result<(), Halt> {
    let Some(cp) = cp else { return end() };
    cp.snapshots.begin(FINAL);
    end()?;
    cp.ack(FINAL, None);
    loop {
        let seq = ctx.mailbox.seq();
        for m in check_mailbox(ctx, last_seq)? {
            if let Control::Complete(id) = m {
                complete(id)?;
                ctx.mailbox.completed(id);
                if id == FINAL {
                    return Ok(());
                }
            }
        }
        weir_ring::wait_any(&[ParkToken::new(&ctx.mailbox.doorbell, seq)], PARK_BACKSTOP);
    }
}

/// A source subtask: checkpoint triggers between polls (so the position is exact), a
/// bounded poll per pass.
struct SourceDuty<'a> {
    source: &'a mut dyn ErasedSource,
    ctx: &'a SubtaskContext,
    cp: Option<&'a Checkpoints>,
    last_seq: u32,
    /// How long the last poll said to wait before polling again.
    wait: Duration,
    /// Stopping at a savepoint: its barrier is out, nothing more is polled (until `Resume`).
    paused: bool,
}

impl Duty for SourceDuty<'_> {
    fn do_work(&mut self, counters: &SubtaskCounters) -> Result<Pass, Halt> {
        let mut work = 0;
        if let Some(cp) = self.cp {
            cp.send_held();
        }
        for m in check_mailbox(self.ctx, &mut self.last_seq)? {
            match m {
                Control::Trigger(id) | Control::TriggerAndPause(id) => {
                    // A savepoint to stop at: nothing is emitted after its barrier.
                    self.paused |= matches!(m, Control::TriggerAndPause(_));
                    if let Some(cp) = self.cp {
                        let began = Instant::now();
                        cp.snapshots.begin(id);
                        crate::checkpoint::failpoint!("checkpoint::barrier-injected");
                        self.source.barrier(id)?;
                        self.source.signal(Signal::Flush)?;
                        let sync_ns = began.elapsed().as_nanos() as u64;
                        cp.ack(id, Some(AckTiming { began, alignment_ns: 0, sync_ns }));
                        self.ctx.mailbox.flags.passed(id);
                        work += 1;
                    }
                }
                Control::Complete(id) => {
                    self.source.complete(id)?;
                    self.ctx.mailbox.completed(id);
                }
                Control::Resume => self.paused = false,
                Control::Stop | Control::Expect(_) => {}
            }
        }
        if self.paused {
            // Stopping at a savepoint: poll nothing, and wait on the mailbox alone.
            self.source.signal(Signal::Flush)?;
            self.wait = PARK_BACKSTOP;
            return Ok(Pass::Work(work));
        }
        match self.source.poll()? {
            SourcePoll::Emitted(n) => {
                counters.records_in.add(n as u64);
                self.source.signal(Signal::Flush)?;
                // A poll that emitted nothing but may emit more soon is not idle.
                Ok(Pass::Work(work + n.max(1)))
            }
            SourcePoll::Idle(wait) => {
                self.source.signal(Signal::Flush)?;
                // The chain behind the source may want its timers sooner (a sink's retry
                // or request timeout): wait no longer than that.
                let timer = self.source.poll_timers()?.unwrap_or(PARK_BACKSTOP);
                self.wait = wait.min(PARK_BACKSTOP).min(timer);
                // Nothing to emit: wait as the source said, even after a barrier (that went
                // out with the flush above).
                Ok(Pass::Work(0))
            }
            SourcePoll::Finished => {
                let source = std::cell::RefCell::new(&mut *self.source);
                let cp = self.cp;
                finish(
                    self.ctx,
                    cp,
                    &mut self.last_seq,
                    || match cp {
                        Some(_) => source.borrow_mut().barrier(FINAL),
                        None => source.borrow_mut().signal(Signal::End),
                    },
                    |id| source.borrow_mut().complete(id),
                )?;
                Ok(Pass::Finished)
            }
        }
    }

    /// Wait as the source said, on its own readiness if it has one, else on the mailbox.
    fn idle(&mut self) -> bool {
        let seq = self.ctx.mailbox.seq();
        if self.paused || !self.source.wait(&Wake::new(&self.ctx.mailbox.doorbell, seq), self.wait) {
            weir_ring::wait_any(&[ParkToken::new(&self.ctx.mailbox.doorbell, seq)], self.wait);
        }
        true
    }
}

/// A subtask fed by rings: completions from the mailbox, timers, pending work first, then
/// one fair pass over the inputs (aligning barriers).
struct InputDuty<'a> {
    gate: &'a mut InputGate,
    input: &'a mut dyn ErasedInput,
    ctx: &'a SubtaskContext,
    cp: Option<&'a Checkpoints>,
    last_seq: u32,
    idler: Idler,
    /// When the chain's head next wants `poll_timers`.
    timer: Option<Duration>,
    /// A checkpoint was triggered whose barrier has not passed yet: pending work that
    /// allows it takes input between its chunks, so the barrier does not wait for all of it.
    expecting: Option<u64>,
    /// The last barrier that passed.
    last_barrier: u64,
}

impl Duty for InputDuty<'_> {
    fn do_work(&mut self, counters: &SubtaskCounters) -> Result<Pass, Halt> {
        if let Some(cp) = self.cp {
            cp.send_held();
        }
        for m in check_mailbox(self.ctx, &mut self.last_seq)? {
            match m {
                Control::Complete(id) => {
                    self.input.signal(Signal::CheckpointComplete(id))?;
                    self.ctx.mailbox.completed(id);
                }
                Control::Expect(id) if id > self.last_barrier => self.expecting = Some(id),
                _ => {}
            }
        }
        // Processing time: the chain's head notes the time and starts what is due.
        self.timer = self.input.poll_timers()?;
        // Pending work first, one bounded chunk per pass, with the mailbox checked between
        // chunks. No input is read while the chain has work left — except, while a
        // checkpoint's barrier is on its way, what an operator that keeps its results in
        // order with the watermarks itself lets in (`Work::Interleave`).
        let budget = match self.input.resume()? {
            // Some input between chunks while a barrier is on its way: it passes a long
            // firing. (Otherwise the input waits, and credit runs out upstream: records
            // wait in Kafka, not in the operator's state.)
            Work::Interleave(records) if self.expecting.is_some() => Some(records),
            Work::More | Work::Interleave(_) => {
                self.input.signal(Signal::Flush)?;
                self.idler.reset();
                return Ok(Pass::Work(1));
            }
            Work::Done => None,
        };
        let polled = self.gate.poll(self.input, budget)?;
        if let (Some((id, alignment_ns)), Some(cp)) = (polled.barrier, self.cp) {
            let began = Instant::now();
            cp.snapshots.begin(id);
            self.input.signal(Signal::Barrier(id))?;
            let sync_ns = began.elapsed().as_nanos() as u64;
            cp.ack(id, Some(AckTiming { began, alignment_ns, sync_ns }));
            self.ctx.mailbox.flags.passed(id);
            self.last_barrier = self.last_barrier.max(id);
            if self.expecting.is_some_and(|e| e <= id) {
                self.expecting = None;
            }
        }
        if polled.any() || budget.is_some() {
            counters.records_in.add(polled.records as u64);
            self.input.signal(Signal::Flush)?;
            self.idler.reset();
            // Pending work is work, whether or not input came between its chunks.
            return Ok(Pass::Work(
                usize::from(budget.is_some())
                    + polled.records
                    + polled.watermarks
                    + polled.markers
                    + usize::from(polled.barrier.is_some()),
            ));
        }
        if self.gate.ended() {
            let input = std::cell::RefCell::new(&mut *self.input);
            finish(
                self.ctx,
                self.cp,
                &mut self.last_seq,
                || input.borrow_mut().signal(Signal::End),
                |id| input.borrow_mut().signal(Signal::CheckpointComplete(id)),
            )?;
            return Ok(Pass::Finished);
        }
        Ok(Pass::Work(0))
    }

    #[inline]
    fn settled(&mut self, wall_ns: u64, idle_ns: u64) {
        self.gate.settled(wall_ns, idle_ns);
    }

    /// Idle by the strategy; when it says park, park on every input ring and the mailbox,
    /// waking for the next timer or when an input may have gone idle.
    fn idle(&mut self) -> bool {
        let Some(IdleStep::Park) = self.idler.idle(0) else { return self.idler.slept() };
        let seq = self.ctx.mailbox.seq();
        if seq == self.last_seq {
            let wait = [self.timer, self.gate.next_idle_check()]
                .into_iter()
                .flatten()
                .fold(PARK_BACKSTOP, |wait, d| wait.min(d));
            if !wait.is_zero() {
                self.gate.park(&self.ctx.mailbox.doorbell, seq, wait);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::Mailbox;
    use crate::telemetry::counters::{JobCounters, SUBTASK};
    use crate::telemetry::time::Spent;
    use crate::telemetry::waiting::Waiting;
    use weir_ring::IdleStrategy;

    /// Idles `idles` times (each a park of `park`), then works one pass of `work`, then ends.
    struct Scripted {
        idles: u32,
        park: Duration,
        work: Duration,
        worked: bool,
        slept: bool,
    }

    impl Duty for Scripted {
        fn do_work(&mut self, _: &SubtaskCounters) -> Result<Pass, Halt> {
            if self.idles > 0 {
                return Ok(Pass::Work(0));
            }
            if self.worked {
                return Ok(Pass::Finished);
            }
            std::thread::sleep(self.work);
            self.worked = true;
            Ok(Pass::Work(1))
        }

        fn idle(&mut self) -> bool {
            self.idles -= 1;
            std::thread::sleep(self.park);
            self.slept
        }
    }

    /// The busy and idle nanoseconds `duty` leaves in its time account.
    fn account(duty: &mut Scripted) -> (u64, u64) {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("weir-duty-{}-{}", std::process::id(), duty.slept));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).expect("a private directory");
        let file = JobCounters::create(&dir.join("counters"), "duty", 8).expect("counters file");
        let [_, _, _, _, records_in, state] = file.counters(&SUBTASK, "duty#0").expect("counters");
        let _ = std::fs::remove_dir_all(&dir);
        let time = Arc::new(TimeAccount::default());
        let ctx = SubtaskContext {
            mailbox: Arc::new(Mailbox::default()),
            idle: IdleStrategy::default(),
            time: time.clone(),
            waiting: Arc::new(Waiting::new("duty#0".into(), time.clone())),
        };
        let counters = SubtaskCounters { records_in, state };
        run(duty, &ctx, &counters, time.start()).expect("runs");
        time.end(Instant::now());
        let (ns, _, _) = time.read();
        (ns[Spent::Busy as usize], ns[Spent::Idle as usize])
    }

    /// A pass that follows a park is busy however long it takes: a sink that parks before
    /// each record and then spends milliseconds on it is busy, not idle (credit by time's
    /// drain rate divides by this). Lower bounds of sleeps only: nothing here asserts a time
    /// a loaded machine could stretch.
    #[test]
    fn a_pass_after_a_park_is_busy() {
        let work = Duration::from_millis(30);
        let (busy, idle) =
            account(&mut Scripted { idles: 3, park: Duration::from_millis(2), work, worked: false, slept: true });
        assert!(busy >= work.as_nanos() as u64, "a {work:?} pass after a park counted busy for {busy} ns");
        assert!(idle >= 6_000_000, "three 2 ms parks counted idle for {idle} ns");
    }

    /// After spin rounds (no clock read), the pass that ends the idle period counts as idle:
    /// where the spin ended is not known.
    #[test]
    fn a_pass_after_spinning_counts_as_idle() {
        let work = Duration::from_millis(30);
        let (_, idle) = account(&mut Scripted { idles: 3, park: Duration::ZERO, work, worked: false, slept: false });
        assert!(idle >= work.as_nanos() as u64, "{idle} ns idle");
    }
}
