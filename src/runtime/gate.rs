//! The input gate: a subtask's input rings, read fairly, and their watermarks combined.

use crate::operators::{ErasedInput, Halt, Signal};
use crate::time::valve::WatermarkValve;
use std::time::{Duration, Instant};
use weir_ring::{Consumer, ParkToken, Read, RecordKind};

/// One incoming ring.
pub(crate) struct InputChannel {
    pub consumer: Consumer,
    pub name: String,
    pub ended: bool,
}

/// All input rings of one subtask.
pub(crate) struct InputGate {
    pub channels: Vec<InputChannel>,
    next: usize,
    live: usize,
    valve: WatermarkValve,
}

/// What one pass over the channels did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Polled {
    /// Data records processed.
    pub records: usize,
    /// Watermarks forwarded (the chain may now have pending work: see `Collector::resume`).
    pub watermarks: usize,
}

impl Polled {
    /// Whether the pass did anything.
    pub(crate) fn any(&self) -> bool {
        self.records + self.watermarks > 0
    }
}

/// Records taken from one channel before the gate moves on to the next: fairness between
/// channels, and a bound on how long a pass runs between mailbox checks.
const PER_CHANNEL_BATCH: usize = 64;

impl InputGate {
    /// A gate over `channels`; a channel silent for `idle_timeout` stops holding the
    /// watermark back (see [`crate::time`]).
    pub(crate) fn new(channels: Vec<InputChannel>, idle_timeout: Option<Duration>) -> InputGate {
        let live = channels.len();
        let valve = WatermarkValve::new(channels.len(), idle_timeout, Instant::now());
        InputGate { channels, next: 0, live, valve }
    }

    /// Whether every channel has ended.
    pub(crate) fn ended(&self) -> bool {
        self.live == 0
    }

    /// One pass over the channels, round robin from where the last pass stopped: up to
    /// `PER_CHANNEL_BATCH` records from each, each processed fully by `input`. A watermark
    /// that advances the gate's minimum is forwarded to `input` and ends the pass, so the
    /// subtask can let the chain finish what it started (firing windows) before more input.
    pub(crate) fn poll(&mut self, input: &mut dyn ErasedInput) -> Result<Polled, Halt> {
        let mut polled = Polled::default();
        let count = self.channels.len();
        // The clock is read once per pass, and only when channels can go idle.
        let now = self.valve.tracks_idleness().then(Instant::now);
        for k in 0..count {
            let i = (self.next + k) % count;
            let channel = &mut self.channels[i];
            if channel.ended {
                continue;
            }
            let mut forwarded = None;
            let mut read_any = false;
            for _ in 0..PER_CHANNEL_BATCH {
                match channel.consumer.read() {
                    Ok(Read::Record(view)) => {
                        read_any = true;
                        match view.kind() {
                            RecordKind::Data => {
                                let result = input.on_bytes(view.payload());
                                view.release_deferred();
                                result?;
                                polled.records += 1;
                            }
                            RecordKind::Watermark => {
                                let w = watermark_of(view.payload());
                                view.release_deferred();
                                let Some(w) = w else {
                                    return Err(Halt::Failed(format!(
                                        "input {}: a watermark record that is not 8 bytes",
                                        channel.name
                                    )));
                                };
                                if let Some(out) = self.valve.watermark(i, w) {
                                    forwarded = Some(out);
                                    break;
                                }
                            }
                            RecordKind::EndOfStream => {
                                view.release();
                                channel.ended = true;
                                self.live -= 1;
                                forwarded = self.valve.end(i);
                                break;
                            }
                            // Barriers arrive with checkpoints; skip them for now.
                            _ => view.release_deferred(),
                        }
                    }
                    Ok(Read::Empty) => break,
                    Ok(Read::Closed) => {
                        // The sender went away without end-of-stream: it stopped or failed;
                        // the job learns why from that subtask.
                        channel.ended = true;
                        self.live -= 1;
                        forwarded = self.valve.end(i);
                        break;
                    }
                    Err(e) => return Err(Halt::Failed(format!("input {}: {e}", channel.name))),
                }
            }
            channel.consumer.publish();
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
                return Ok(polled);
            }
        }
        if let Some(now) = now
            && let Some(w) = self.valve.check_idle(now)
        {
            input.signal(Signal::Watermark(w))?;
            polled.watermarks += 1;
        }
        self.next = (self.next + 1) % count.max(1);
        Ok(polled)
    }

    /// How long until a channel may go idle (when the subtask should look again).
    pub(crate) fn next_idle_check(&self) -> Option<Duration> {
        self.valve.next_idle_check(Instant::now())
    }

    /// Park until any live channel has a record (or the mailbox `doorbell` moves past `seq`),
    /// at most `timeout`.
    pub(crate) fn park(&mut self, doorbell: &std::sync::atomic::AtomicU32, seq: u32, timeout: Duration) {
        let mut tokens = Vec::with_capacity(self.channels.len() + 1);
        let mut ready = false;
        for c in self.channels.iter().filter(|c| !c.ended) {
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
        for c in self.channels.iter().filter(|c| !c.ended) {
            c.consumer.end_park();
        }
    }
}

/// A watermark record's payload: the watermark, u64 little-endian.
fn watermark_of(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(payload.try_into().ok()?))
}
