//! The input gate: a subtask's input rings, read fairly.

use crate::operators::{ErasedInput, Halt};
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
}

/// Records taken from one channel before the gate moves on to the next: fairness between
/// channels, and a bound on how long a pass runs between mailbox checks.
const PER_CHANNEL_BATCH: usize = 64;

impl InputGate {
    pub(crate) fn new(channels: Vec<InputChannel>) -> InputGate {
        let live = channels.len();
        InputGate { channels, next: 0, live }
    }

    /// Whether every channel has ended.
    pub(crate) fn ended(&self) -> bool {
        self.live == 0
    }

    /// One pass over the channels, round robin from where the last pass stopped: up to
    /// `PER_CHANNEL_BATCH` records from each, each processed fully by `input`. Returns the
    /// number of data records processed.
    pub(crate) fn poll(&mut self, input: &mut dyn ErasedInput) -> Result<usize, Halt> {
        let mut processed = 0;
        let count = self.channels.len();
        for k in 0..count {
            let i = (self.next + k) % count;
            let channel = &mut self.channels[i];
            if channel.ended {
                continue;
            }
            for _ in 0..PER_CHANNEL_BATCH {
                match channel.consumer.read() {
                    Ok(Read::Record(view)) => match view.kind() {
                        RecordKind::Data => {
                            let result = input.on_bytes(view.payload());
                            view.release_deferred();
                            result?;
                            processed += 1;
                        }
                        RecordKind::EndOfStream => {
                            view.release();
                            channel.ended = true;
                            self.live -= 1;
                            break;
                        }
                        // Barriers and watermarks arrive with later work; skip them for now.
                        _ => view.release_deferred(),
                    },
                    Ok(Read::Empty) => break,
                    Ok(Read::Closed) => {
                        // The sender went away without end-of-stream: it stopped or failed;
                        // the job learns why from that subtask.
                        channel.ended = true;
                        self.live -= 1;
                        break;
                    }
                    Err(e) => return Err(Halt::Failed(format!("input {}: {e}", channel.name))),
                }
            }
            channel.consumer.publish();
        }
        self.next = (self.next + 1) % count.max(1);
        Ok(processed)
    }

    /// Park until any live channel has a record (or the mailbox `doorbell` moves past `seq`),
    /// at most `timeout`.
    pub(crate) fn park(&mut self, doorbell: &std::sync::atomic::AtomicU32, seq: u32, timeout: std::time::Duration) {
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
