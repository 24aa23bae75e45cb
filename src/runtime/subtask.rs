//! One subtask: a thread running a single-threaded duty cycle over its chain.
//!
//! Each pass: check the mailbox (one load), do a bounded amount of work (a source poll, or
//! one chunk of work the chain left pending, or one fair pass over the input rings), flush
//! outputs; with nothing to do, idle by the strategy — parking on every input ring and the
//! mailbox at once, until the next processing-time timer at the latest.
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
//! Flink splits it: *idle* (waiting for input, counted here), *backpressured* (waiting for
//! credit, counted by the output gates) and *busy* (the rest).

use super::gate::InputGate;
use super::{Control, SubtaskContext};
use crate::checkpoint::{Ack, FINAL, Snapshots};
use crate::operators::{ErasedInput, ErasedSource, Halt, Signal, SourcePoll, Wake, Work};
use std::sync::Arc;
use std::time::Instant;
use weir_ring::counters::Counter;
use weir_ring::{IdleStep, Idler, ParkToken};

/// What feeds the chain.
pub(crate) enum Body {
    Source(Box<dyn ErasedSource>),
    Input { gate: InputGate, input: Box<dyn ErasedInput> },
}

/// Counters of one subtask.
#[derive(Clone, Copy)]
pub(crate) struct SubtaskCounters {
    pub busy_ns: Counter,
    pub idle_ns: Counter,
    pub records_in: Counter,
    pub state: Counter,
}

/// What a finished subtask reports.
#[derive(Debug, Clone)]
pub(crate) struct SubtaskReport {
    pub busy_ns: u64,
    pub backpressured_ns: u64,
    pub idle_ns: u64,
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
    pub acks: std::sync::mpsc::Sender<crate::checkpoint::coordinator::Msg>,
    /// This subtask's index in the coordinator's list.
    pub index: usize,
}

impl Checkpoints {
    fn ack(&self, id: u64, alignment_ns: u64) {
        if id != FINAL {
            crate::checkpoint::failpoint!("checkpoint::snapshot-taken");
        }
        let parts = self.snapshots.take();
        // The coordinator is gone only when the job is ending: nothing to ack to.
        let _ = self.acks.send(crate::checkpoint::coordinator::Msg::Ack(Ack {
            id,
            subtask: self.index,
            parts,
            alignment_ns,
        }));
    }
}

impl Subtask {
    pub(crate) fn run(mut self) -> Result<SubtaskReport, Halt> {
        let start = Instant::now();
        self.counters.state.set(1);
        let cp = self.checkpoints.as_ref();
        let result = match &mut self.body {
            Body::Source(source) => run_source(source.as_mut(), &self.ctx, &self.counters, cp, start),
            Body::Input { gate, input } => run_input(gate, input.as_mut(), &self.ctx, &self.counters, cp, start),
        };
        let report = SubtaskReport {
            busy_ns: settle(&self.ctx, &self.counters, start),
            backpressured_ns: self.ctx.backpressured_ns.get(),
            idle_ns: self.counters.idle_ns.get(),
            records_in: self.counters.records_in.get(),
        };
        self.counters.state.set(if result.is_ok() { 2 } else { 3 });
        result.map(|()| report)
    }
}

/// busy = wall − idle − backpressured; written as a counter, returned.
#[inline]
fn settle(ctx: &SubtaskContext, counters: &SubtaskCounters, start: Instant) -> u64 {
    let wall = start.elapsed().as_nanos() as u64;
    let busy = wall.saturating_sub(counters.idle_ns.get()).saturating_sub(ctx.backpressured_ns.get());
    counters.busy_ns.set(busy);
    busy
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
    cp.ack(FINAL, 0);
    loop {
        let seq = ctx.mailbox.seq();
        for m in check_mailbox(ctx, last_seq)? {
            if let Control::Complete(id) = m {
                complete(id)?;
                if id == FINAL {
                    return Ok(());
                }
            }
        }
        weir_ring::wait_any(&[ParkToken::new(&ctx.mailbox.doorbell, seq)], super::PARK_BACKSTOP);
    }
}

fn run_source(
    source: &mut dyn ErasedSource,
    ctx: &SubtaskContext,
    counters: &SubtaskCounters,
    cp: Option<&Checkpoints>,
    start: Instant,
) -> Result<(), Halt> {
    let mut last_seq = ctx.mailbox.seq();
    loop {
        for m in check_mailbox(ctx, &mut last_seq)? {
            match m {
                Control::Trigger(id) => {
                    if let Some(cp) = cp {
                        cp.snapshots.begin(id);
                        crate::checkpoint::failpoint!("checkpoint::barrier-injected");
                        source.barrier(id)?;
                        source.signal(Signal::Flush)?;
                        cp.ack(id, 0);
                    }
                }
                Control::Complete(id) => source.complete(id)?,
                Control::Stop => {}
            }
        }
        match source.poll()? {
            SourcePoll::Emitted(n) => {
                counters.records_in.add(n as u64);
                source.signal(Signal::Flush)?;
            }
            SourcePoll::Idle(wait) => {
                source.signal(Signal::Flush)?;
                let seq = ctx.mailbox.seq();
                let t = Instant::now();
                let wait = wait.min(super::PARK_BACKSTOP);
                if !source.wait(&Wake::new(&ctx.mailbox.doorbell, seq), wait) {
                    weir_ring::wait_any(&[ParkToken::new(&ctx.mailbox.doorbell, seq)], wait);
                }
                counters.idle_ns.add(t.elapsed().as_nanos() as u64);
            }
            SourcePoll::Finished => {
                let source = std::cell::RefCell::new(source);
                return finish(
                    ctx,
                    cp,
                    &mut last_seq,
                    || match cp {
                        Some(_) => source.borrow_mut().barrier(FINAL),
                        None => source.borrow_mut().signal(Signal::End),
                    },
                    |id| source.borrow_mut().complete(id),
                );
            }
        }
        settle(ctx, counters, start);
    }
}

fn run_input(
    gate: &mut InputGate,
    input: &mut dyn ErasedInput,
    ctx: &SubtaskContext,
    counters: &SubtaskCounters,
    cp: Option<&Checkpoints>,
    start: Instant,
) -> Result<(), Halt> {
    let mut idler = Idler::new(ctx.idle);
    let mut last_seq = ctx.mailbox.seq();
    loop {
        for m in check_mailbox(ctx, &mut last_seq)? {
            if let Control::Complete(id) = m {
                input.signal(Signal::CheckpointComplete(id))?;
            }
        }
        // Processing time: the chain's head notes the time and starts what is due.
        let timer = input.poll_timers()?;
        // Pending work first, one bounded chunk per pass, with the mailbox checked between
        // chunks; no input is read while the chain has work left, so results stay in order
        // with the watermark that caused them.
        if input.resume()? == Work::More {
            input.signal(Signal::Flush)?;
            idler.reset();
            settle(ctx, counters, start);
            continue;
        }
        let polled = gate.poll(input)?;
        if let (Some((id, alignment_ns)), Some(cp)) = (polled.barrier, cp) {
            cp.snapshots.begin(id);
            input.signal(Signal::Barrier(id))?;
            cp.ack(id, alignment_ns);
        }
        if polled.any() {
            counters.records_in.add(polled.records as u64);
            input.signal(Signal::Flush)?;
            idler.reset();
            settle(ctx, counters, start);
            continue;
        }
        if gate.ended() {
            let input = std::cell::RefCell::new(input);
            return finish(
                ctx,
                cp,
                &mut last_seq,
                || input.borrow_mut().signal(Signal::End),
                |id| input.borrow_mut().signal(Signal::CheckpointComplete(id)),
            );
        }
        // Idle: nothing to read.
        let t = Instant::now();
        match idler.step() {
            IdleStep::Spin => std::hint::spin_loop(),
            IdleStep::Yield => std::thread::yield_now(),
            IdleStep::Sleep(d) => std::thread::sleep(d),
            IdleStep::Park => {
                let seq = ctx.mailbox.seq();
                if seq == last_seq {
                    // Wake for the next timer, or when an input may have gone idle.
                    let wait = [timer, gate.next_idle_check()]
                        .into_iter()
                        .flatten()
                        .fold(super::PARK_BACKSTOP, |wait, d| wait.min(d));
                    if !wait.is_zero() {
                        gate.park(&ctx.mailbox.doorbell, seq, wait);
                    }
                }
            }
        }
        counters.idle_ns.add(t.elapsed().as_nanos() as u64);
        settle(ctx, counters, start);
    }
}
