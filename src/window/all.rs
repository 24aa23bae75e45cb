//! Non-keyed windows in two phases ([`Stream::window_all`](crate::graph::Stream::window_all)):
//! a global aggregate over every record of a stream, per window, without sending every
//! record to one subtask.
//!
//! ```text
//!  upstream subtask ─► partial (chained, no ring) ─┐   key_by window start   ┌─► final ─► …
//!  upstream subtask ─► partial (chained, no ring) ─┴────────── ring ─────────┘
//! ```
//!
//! **Phase one** runs in each upstream subtask, chained after it: it folds the subtask's
//! records into one accumulator per open window ([`WindowAggregate::add`]) and sends a
//! [`Partial`] — the window and its accumulator — when the watermark closes the window,
//! before the watermark itself. At a checkpoint barrier it sends every open window's
//! partial and starts them afresh, so it keeps no state across a checkpoint (what it sent
//! is the final phase's state). A record whose every window is closed already is late:
//! counted on the node and dropped.
//!
//! **Phase two** is a keyed operator (keyed by window start, so windows spread over its
//! subtasks): it merges the partials of each window ([`WindowAggregate::merge`]) and emits
//! the result when its watermark — the least of all its inputs' — closes the window, so
//! every partial of it is in. Its open windows go into each checkpoint; a restore at
//! another parallelism keeps the subtask's key groups.
//!
//! Event time only, tumbling and sliding windows (a session is per key).

use super::{Fired, WindowAggregate, WindowKind};
use crate::chain::{LinkFn, NodeCounters, erase, unerase};
use crate::operators::{Collector, Halt, KeyedProcess, Signal};
use crate::record::{CodecError, Record};
use crate::time::TimestampFn;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One subtask's aggregate of one window (phase one's output, phase two's input): the
/// window and the accumulator. Encoded as `[start u64][end u64][accumulator]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Partial<A> {
    /// Window start, ns (inclusive).
    pub start_ns: u64,
    /// Window end, ns (exclusive).
    pub end_ns: u64,
    /// The accumulator of the subtask's records in the window.
    pub acc: A,
}

impl<A: Record + Clone> Record for Partial<A> {
    const FIXED_SIZE: bool = A::FIXED_SIZE;

    fn encoded_len(&self) -> usize {
        16 + self.acc.encoded_len()
    }

    fn encode(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.start_ns.to_le_bytes());
        out[8..16].copy_from_slice(&self.end_ns.to_le_bytes());
        self.acc.encode(&mut out[16..]);
    }

    fn decode<R>(bytes: &[u8], f: impl FnOnce(&Self) -> R) -> Result<R, CodecError> {
        let short = || CodecError {
            type_name: std::any::type_name::<Self>(),
            len: bytes.len(),
            reason: "shorter than a window's start and end".into(),
        };
        let (head, rest) = bytes.split_at_checked(16).ok_or_else(short)?;
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        let acc = A::decode(rest, A::clone)?;
        Ok(f(&Partial { start_ns: word(0), end_ns: word(8), acc }))
    }
}

/// The `(start, end)` of every window of `kind` that holds time `t` (event time, ns).
pub(crate) fn windows_of(kind: &WindowKind, t: u64, mut each: impl FnMut(u64, u64)) {
    match *kind {
        WindowKind::Tumbling { size } => {
            let size = (size.as_nanos() as u64).max(1);
            let start = t - t % size;
            each(start, start.saturating_add(size));
        }
        WindowKind::Sliding { size, slide } => {
            let (size, slide) = ((size.as_nanos() as u64).max(1), (slide.as_nanos() as u64).max(1));
            let mut start = t - t % slide;
            loop {
                if start.saturating_add(size) <= t {
                    break;
                }
                each(start, start.saturating_add(size));
                if start < slide {
                    break;
                }
                start -= slide;
            }
        }
        WindowKind::Session { .. } => unreachable!("window_all refuses session windows when built"),
    }
}

/// Phase one: see the module docs.
struct LocalAggregate<T, G: WindowAggregate<T>> {
    agg: Arc<G>,
    kind: WindowKind,
    timestamp: TimestampFn<T>,
    /// Open windows by (end, start): the watermark closes them in that order.
    open: BTreeMap<(u64, u64), G::Acc>,
    watermark: u64,
    /// The ingest time of the newest latency marker that came in (markers stop here; the
    /// partials carry their own).
    marker_ingest: u64,
    down: Box<dyn Collector<Partial<G::Acc>>>,
    counters: NodeCounters,
}

impl<T: Record, G: WindowAggregate<T>> LocalAggregate<T, G> {
    /// Send the partials of the windows that end at or before `to` (every open one for
    /// `u64::MAX`).
    /// Closed by the watermark (`mark`), a latency marker follows them: the newest window end
    /// sent, the newest ingest time that came in (see the keyed window's `mark_fired`; the
    /// final phase passes it on at once, before the results it merges: an early sample
    /// there). Not those a barrier or the end of input sends early.
    fn send_until(&mut self, to: u64, mark: bool) -> Result<(), Halt> {
        let mut newest_end = 0;
        while let Some(entry) = self.open.first_entry() {
            let &(end, start) = entry.key();
            if end > to {
                break;
            }
            let acc = entry.remove();
            self.counters.records_out.add(1);
            self.down.collect(&Partial { start_ns: start, end_ns: end, acc })?;
            newest_end = end;
        }
        if mark && newest_end > 0 && self.marker_ingest > 0 {
            let ingest_ns = std::mem::take(&mut self.marker_ingest);
            let marker = crate::operators::LatencyMarker { ingest_ns, event_ns: newest_end };
            self.down.signal(Signal::Latency(marker))?;
        }
        Ok(())
    }
}

impl<T: Record, G: WindowAggregate<T>> Collector<T> for LocalAggregate<T, G> {
    fn collect(&mut self, record: &T) -> Result<(), Halt> {
        self.counters.records_in.add(1);
        let t = (self.timestamp)(record);
        let (agg, open, watermark) = (&self.agg, &mut self.open, self.watermark);
        let mut placed = false;
        windows_of(&self.kind, t, |start, end| {
            // A window the watermark closed went out already: not this record's any more.
            if end > watermark {
                agg.add(open.entry((end, start)).or_insert_with(|| agg.create()), record);
                placed = true;
            }
        });
        if !placed {
            self.counters.late_records.add(1);
        }
        Ok(())
    }

    fn signal(&mut self, signal: Signal) -> Result<(), Halt> {
        match signal {
            Signal::Watermark(w) => {
                self.watermark = self.watermark.max(w);
                self.send_until(w, true)?;
            }
            // What is open goes out before the barrier: the final phase checkpoints it, so
            // this phase has nothing to keep across a checkpoint.
            Signal::Barrier(_) | Signal::End => self.send_until(u64::MAX, false)?,
            Signal::Latency(m) => {
                self.marker_ingest = self.marker_ingest.max(m.ingest_ns);
                return Ok(());
            }
            _ => {}
        }
        self.down.signal(signal)
    }

    fn poll_timers(&mut self) -> Result<Option<std::time::Duration>, Halt> {
        self.down.poll_timers()
    }
}

/// Phase one's link.
pub(crate) fn local_aggregate_fn<T: Record, G: WindowAggregate<T>>(
    agg: Arc<G>,
    kind: WindowKind,
    timestamp: TimestampFn<T>,
) -> LinkFn {
    Arc::new(move |info, counters, _env, down| {
        erase::<T>(Box::new(LocalAggregate {
            agg: agg.clone(),
            kind,
            timestamp: timestamp.clone(),
            open: BTreeMap::new(),
            watermark: 0,
            marker_ingest: 0,
            down: unerase::<Partial<G::Acc>>(down, &info.node),
            counters,
        }))
    })
}

/// Phase two: see the module docs.
pub(crate) struct MergePartials<T, G: WindowAggregate<T>> {
    agg: Arc<G>,
    /// Open windows by (end, start), with the key group of their start.
    open: BTreeMap<(u64, u64), (u32, G::Acc)>,
    watermark: u64,
    /// This subtask's key groups (what a restore at another parallelism keeps).
    key_groups: std::ops::Range<u32>,
    late: u64,
    _t: std::marker::PhantomData<fn(&T)>,
}

impl<T, G: WindowAggregate<T>> MergePartials<T, G> {
    pub(crate) fn new(agg: Arc<G>, key_groups: std::ops::Range<u32>) -> Self {
        MergePartials { agg, open: BTreeMap::new(), watermark: 0, key_groups, late: 0, _t: std::marker::PhantomData }
    }

    /// Take what a checkpoint holds: the watermark, then `(key group, start, end,
    /// accumulator length, accumulator)` per open window; keep the windows of `keep`.
    fn take(&mut self, bytes: &[u8], keep: &std::ops::Range<u32>) -> Result<(), Halt> {
        let bad = || Halt::failed("window_all: the checkpoint's bytes are not those of its final phase");
        let mut rest = bytes;
        let mut word = |n: usize| -> Result<u64, Halt> {
            let (head, r) = rest.split_at_checked(n).ok_or_else(bad)?;
            rest = r;
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(head);
            Ok(u64::from_le_bytes(b))
        };
        let watermark = word(8)?;
        let count = word(8)?;
        let mut windows = Vec::new();
        for _ in 0..count {
            let (kg, start, end, len) = (word(4)? as u32, word(8)?, word(8)?, word(4)? as usize);
            windows.push((kg, start, end, len));
        }
        // The accumulators follow the index, in its order.
        let mut accs = rest;
        for (kg, start, end, len) in windows {
            let (acc, r) = accs.split_at_checked(len).ok_or_else(bad)?;
            accs = r;
            if !keep.contains(&kg) {
                continue;
            }
            let acc = decode_acc::<G::Acc>(acc).map_err(|e| Halt::failed(format!("window_all: {e}")))?;
            let slot = self.open.entry((end, start)).or_insert_with(|| (kg, self.agg.create()));
            self.agg.merge(&mut slot.1, &acc);
        }
        // At an aligned barrier every subtask saw the same watermark; the least is safe.
        self.watermark = if self.watermark == 0 { watermark } else { self.watermark.min(watermark) };
        Ok(())
    }
}

/// Decode an accumulator from stored bytes (copied to 8-aligned memory: fixed layouts
/// decode in place).
fn decode_acc<A: Record + Clone>(bytes: &[u8]) -> Result<A, CodecError> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    let aligned = &mut zerocopy::IntoBytes::as_mut_bytes(words.as_mut_slice())[..bytes.len()];
    aligned.copy_from_slice(bytes);
    A::decode(aligned, A::clone)
}

impl<T: Send + 'static, G: WindowAggregate<T>> KeyedProcess<Partial<G::Acc>, G::Out> for MergePartials<T, G> {
    fn process(
        &mut self,
        p: &Partial<G::Acc>,
        key_group: u32,
        _out: &mut dyn FnMut(&G::Out) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        if p.end_ns <= self.watermark {
            // Its window went out already (phase one sends before the watermark, so only a
            // partial from before a restore to an earlier point can come this late).
            self.late += 1;
            return Ok(());
        }
        let slot = self.open.entry((p.end_ns, p.start_ns)).or_insert_with(|| (key_group, self.agg.create()));
        self.agg.merge(&mut slot.1, &p.acc);
        Ok(())
    }

    fn on_watermark(&mut self, w: u64, out: &mut dyn FnMut(&G::Out) -> Result<(), Halt>) -> Result<(), Halt> {
        self.watermark = self.watermark.max(w);
        while let Some(entry) = self.open.first_entry() {
            let &(end, start) = entry.key();
            if end > w {
                break;
            }
            let (_, acc) = entry.remove();
            out(&self.agg.result(&Fired { key: 0, start_ns: start, end_ns: end, late: false }, &acc))?;
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut dyn FnMut(&G::Out) -> Result<(), Halt>) -> Result<(), Halt> {
        self.on_watermark(u64::MAX, out)
    }

    fn late_records(&self) -> u64 {
        self.late
    }

    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        let mut index = Vec::with_capacity(16 + self.open.len() * 24);
        let mut accs = Vec::new();
        index.extend_from_slice(&self.watermark.to_le_bytes());
        index.extend_from_slice(&(self.open.len() as u64).to_le_bytes());
        for (&(end, start), (kg, acc)) in &self.open {
            let len = acc.encoded_len();
            index.extend_from_slice(&kg.to_le_bytes());
            index.extend_from_slice(&start.to_le_bytes());
            index.extend_from_slice(&end.to_le_bytes());
            index.extend_from_slice(&(len as u32).to_le_bytes());
            let at = accs.len();
            accs.resize(at + len, 0);
            acc.encode(&mut accs[at..]);
        }
        index.extend_from_slice(&accs);
        Ok(index)
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), Halt> {
        if state.is_empty() {
            return Ok(());
        }
        self.take(state, &(0..u32::MAX))
    }

    fn restore_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        let keep = self.key_groups.clone();
        for (_, bytes) in &from.parts {
            if !bytes.is_empty() {
                self.take(bytes, &keep)?;
            }
        }
        Ok(())
    }
}
