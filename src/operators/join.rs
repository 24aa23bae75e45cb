//! Joins of two keyed streams, built on the keyed-process contract: a [`KeyedProcess`] over
//! [`Either`] records (both inputs through one gate, barriers aligned across them, the
//! watermark the minimum of both), its state cleaned up by [`EventTimers`] as the
//! watermark passes.
//!
//! [`IntervalJoin`]: each left record `a` meets every right record `b` of its key with
//! `b.time − a.time` in `[lower, upper]` (a quote within 5 ms before a trade:
//! `[−5 ms, 0]`). Inner, or left outer (a left record that met nothing by the time the
//! watermark closes its interval is emitted alone). Results come as soon as both records
//! are there — an interval join never waits for the watermark to emit a match, only to
//! emit a left record's lack of one and to drop state.
//!
//! A regular join ([`Interval::unbounded`]) is the same operator with no bounds: every
//! pair of a key meets whatever their times, and a record is kept until the watermark
//! passes its time plus the time to live (an event-time timer), or for ever without one.
//!
//! What is kept: per key, the left records whose interval may still hold a right record to
//! come (`a.time + upper ≥ watermark`), and the right records a left record to come may
//! still meet (`b.time − lower ≥ watermark`). A record whose event time is below the
//! watermark when it arrives is late: it is dropped and counted ([`IntervalJoin::late`]),
//! as Flink's interval join does. State lives in the operator's memory and goes whole into
//! each checkpoint with the watermark (keys are recomputed from the records on restore, so a
//! restore at another parallelism keeps exactly the key groups the subtask owns now).
//!
//! [`WindowJoin`]: the records of a key in the same window (tumbling or sliding) meet;
//! a window's pairs come out when the watermark closes it.
//!
//! [`KeyedProcess`]: super::KeyedProcess

use super::timers::EventTimers;
use super::{Halt, KeyedProcess, Rescaled, SubtaskInfo};
use crate::record::{CodecError, Either, Record, hash_key, put_record, take_record};
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

/// Which records of an interval join are emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    /// Pairs that meet.
    Inner,
    /// Pairs that meet, and each left record that met none, alone (`None` for the right).
    LeftOuter,
}

/// The bounds of a join: a right record `b` meets a left record `a` of its key when
/// `lower ≤ b.time − a.time ≤ upper` (event time, ns; both bounds included).
/// [`Interval::unbounded`] is a regular join: every pair of a key meets, whenever its
/// records come, and records are kept for `ttl` of event time (or for ever).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// Least `b.time − a.time`, ns (negative: `b` may come before `a`).
    pub lower: i64,
    /// Greatest `b.time − a.time`, ns.
    pub upper: i64,
    /// Inner or left outer.
    pub kind: JoinKind,
    /// A regular join's state time to live, ns of event time: a record is dropped once the
    /// watermark passes its time plus this (by an event-time timer, not a sweep), and meets
    /// nothing after. `None`: kept for ever. Only for [`Interval::unbounded`].
    pub ttl: Option<u64>,
}

impl Interval {
    /// An inner join of the pairs with `lower ≤ b.time − a.time ≤ upper` (ns).
    pub fn between(lower: i64, upper: i64) -> Interval {
        Interval { lower, upper, kind: JoinKind::Inner, ttl: None }
    }

    /// A regular (unbounded) inner join: every left record meets every right record of its
    /// key, whatever their times, kept for ever unless [`with_ttl`](Interval::with_ttl).
    /// No record is late to it.
    pub fn unbounded() -> Interval {
        Interval { lower: i64::MIN, upper: i64::MAX, kind: JoinKind::Inner, ttl: None }
    }

    /// A regular join whose records expire `ttl` (ns of event time) after their time.
    pub fn with_ttl(self, ttl: u64) -> Interval {
        Interval { ttl: Some(ttl), ..self }
    }

    /// The same bounds, left outer.
    pub fn left_outer(self) -> Interval {
        Interval { kind: JoinKind::LeftOuter, ..self }
    }

    /// Whether this is a regular join (no bounds).
    pub fn is_unbounded(&self) -> bool {
        self.lower == i64::MIN && self.upper == i64::MAX
    }

    /// Why these bounds make no join, if they don't.
    pub fn problem(&self) -> Option<String> {
        if self.lower > self.upper {
            return Some(format!(
                "the lower bound {} ns is above the upper bound {} ns: no right record can meet a left one; give lower ≤ upper",
                self.lower, self.upper
            ));
        }
        if self.ttl.is_some() && !self.is_unbounded() {
            return Some(
                "a time to live is for a regular join (Interval::unbounded()); an interval join drops its state when the watermark closes each interval".to_owned(),
            );
        }
        if self.is_unbounded() && self.kind == JoinKind::LeftOuter && self.ttl.is_none() {
            return Some(
                "a left outer regular join without a time to live never knows a left record met nothing; give it with_ttl(...)".to_owned(),
            );
        }
        None
    }
}

/// Makes a join's result from a pair (`Some`), or from a left record that met none (`None`).
pub type JoinFn<A, B, U> = Arc<dyn Fn(&A, Option<&B>) -> U + Send + Sync>;

/// The functions an interval join reads its records with.
pub struct JoinFns<A, B, K, U> {
    /// The key of a left record.
    pub key_a: Arc<dyn Fn(&A) -> K + Send + Sync>,
    /// The key of a right record (equal keys meet).
    pub key_b: Arc<dyn Fn(&B) -> K + Send + Sync>,
    /// A left record's event time, ns.
    pub time_a: Arc<dyn Fn(&A) -> u64 + Send + Sync>,
    /// A right record's event time, ns.
    pub time_b: Arc<dyn Fn(&B) -> u64 + Send + Sync>,
    /// The result of a pair (`Some`), or of a left record that met none (`None`, left outer).
    pub join: JoinFn<A, B, U>,
}

impl<A, B, K, U> Clone for JoinFns<A, B, K, U> {
    fn clone(&self) -> Self {
        JoinFns {
            key_a: self.key_a.clone(),
            key_b: self.key_b.clone(),
            time_a: self.time_a.clone(),
            time_b: self.time_b.clone(),
            join: self.join.clone(),
        }
    }
}

impl<A, B, K, U> std::fmt::Debug for JoinFns<A, B, K, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JoinFns")
    }
}

/// One key's records: by (event time, arrival), left ones with whether they met a right one.
struct Buffers<A, B> {
    left: BTreeMap<(u64, u64), (A, bool)>,
    right: BTreeMap<(u64, u64), B>,
}

impl<A, B> Default for Buffers<A, B> {
    fn default() -> Self {
        Buffers { left: BTreeMap::new(), right: BTreeMap::new() }
    }
}

/// The interval join of one subtask (see the module's docs).
pub struct IntervalJoin<A, B, K, U> {
    interval: Interval,
    fns: JoinFns<A, B, K, U>,
    keys: HashMap<K, Buffers<A, B>>,
    timers: EventTimers<K>,
    watermark: u64,
    /// Arrival number: orders records of one key and time.
    seq: u64,
    late: u64,
    info: SubtaskInfo,
}

impl<A, B, K: Ord + Clone, U> std::fmt::Debug for IntervalJoin<A, B, K, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntervalJoin")
            .field("node", &self.info.name())
            .field("interval", &self.interval)
            .field("keys", &self.keys.len())
            .field("timers", &self.timers.len())
            .field("watermark", &self.watermark)
            .field("late", &self.late)
            .finish()
    }
}

/// Version of the checkpoint bytes: the version, the watermark (u64), then the entries.
const VERSION: u8 = 2;
const LEFT: u8 = 0;
const LEFT_MET: u8 = 1;
const RIGHT: u8 = 2;

impl<A, B, K, U> IntervalJoin<A, B, K, U>
where
    A: Record + Clone,
    B: Record + Clone,
    K: Hash + Eq + Ord + Clone + Send + 'static,
    U: Record,
{
    /// The join of subtask `info`.
    pub fn new(info: &SubtaskInfo, interval: Interval, fns: JoinFns<A, B, K, U>) -> IntervalJoin<A, B, K, U> {
        IntervalJoin {
            interval,
            fns,
            keys: HashMap::new(),
            timers: EventTimers::new(),
            watermark: 0,
            seq: 0,
            late: 0,
            info: info.clone(),
        }
    }

    /// Records dropped for arriving behind the watermark.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Records held (left and right).
    pub fn held(&self) -> usize {
        self.keys.values().map(|b| b.left.len() + b.right.len()).sum()
    }

    /// When a left record at `t` stops being able to meet a right record to come (its
    /// time to live, in a regular join).
    fn left_expiry(&self, t: u64) -> u64 {
        match self.interval.ttl {
            Some(ttl) => t.saturating_add(ttl),
            None => sat(t as i128 + self.interval.upper as i128),
        }
    }

    /// When a right record at `t` stops being able to meet a left record to come.
    fn right_expiry(&self, t: u64) -> u64 {
        match self.interval.ttl {
            Some(ttl) => t.saturating_add(ttl),
            None => sat(t as i128 - self.interval.lower as i128),
        }
    }

    /// Whether a record at `t` arriving now is dropped: behind the watermark in an interval
    /// join (late), or past its time to live in a regular join (it meets nothing held
    /// then either: what it would meet expired no later than it).
    fn dropped(&self, t: u64) -> bool {
        if self.interval.is_unbounded() {
            self.interval.ttl.is_some_and(|ttl| t.saturating_add(ttl) < self.watermark)
        } else {
            t < self.watermark
        }
    }

    fn left_arrives(&mut self, a: A, out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        let t = (self.fns.time_a)(&a);
        if self.dropped(t) {
            self.late += 1;
            return Ok(());
        }
        let key = (self.fns.key_a)(&a);
        let buffers = self.keys.entry(key.clone()).or_default();
        let mut met = false;
        if let Some((lo, hi)) = span(t as i128 + self.interval.lower as i128, t as i128 + self.interval.upper as i128) {
            for (_, b) in buffers.right.range((lo, 0)..=(hi, u64::MAX)) {
                met = true;
                out(&(self.fns.join)(&a, Some(b)))?;
            }
        }
        self.seq += 1;
        buffers.left.insert((t, self.seq), (a, met));
        let expiry = self.left_expiry(t);
        self.timers.register(key, expiry);
        Ok(())
    }

    fn right_arrives(&mut self, b: B, out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        let t = (self.fns.time_b)(&b);
        if self.dropped(t) {
            self.late += 1;
            return Ok(());
        }
        let key = (self.fns.key_b)(&b);
        let buffers = self.keys.entry(key.clone()).or_default();
        if let Some((lo, hi)) = span(t as i128 - self.interval.upper as i128, t as i128 - self.interval.lower as i128) {
            for (_, (a, met)) in buffers.left.range_mut((lo, 0)..=(hi, u64::MAX)) {
                *met = true;
                out(&(self.fns.join)(a, Some(&b)))?;
            }
        }
        self.seq += 1;
        buffers.right.insert((t, self.seq), b);
        let expiry = self.right_expiry(t);
        self.timers.register(key, expiry);
        Ok(())
    }

    /// Drop what the watermark closed for `key`; emit the left records that met nothing
    /// (left outer).
    fn expire(&mut self, key: &K, out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        // Expiry grows with the event time on each side, so what expired is a prefix: the
        // records before these times (`left_expiry(t) < watermark` ⟺ `t < left_until`).
        let w = self.watermark as i128;
        let (left_until, right_until) = match self.interval.ttl {
            Some(ttl) => (sat(w - ttl as i128), sat(w - ttl as i128)),
            None => (sat(w - self.interval.upper as i128), sat(w + self.interval.lower as i128)),
        };
        let Some(buffers) = self.keys.get_mut(key) else { return Ok(()) };
        while let Some(entry) = buffers.left.first_entry() {
            if entry.key().0 >= left_until {
                break;
            }
            let (a, met) = entry.remove();
            if !met && self.interval.kind == JoinKind::LeftOuter {
                out(&(self.fns.join)(&a, None))?;
            }
        }
        while let Some(entry) = buffers.right.first_entry() {
            if entry.key().0 >= right_until {
                break;
            }
            entry.remove();
        }
        if buffers.left.is_empty() && buffers.right.is_empty() {
            self.keys.remove(key);
        }
        Ok(())
    }

    /// Keys of this subtask's key groups (all of them when not restoring a share).
    fn owns(&self, key: &K) -> bool {
        owns(&self.info, key)
    }

    /// Add the records of checkpoint bytes `bytes` (`rescaled`: those of this subtask's
    /// key groups).
    fn load_part(&mut self, bytes: &[u8], rescaled: bool) -> Result<(), CodecError> {
        let Some(mut bytes) = take_header(bytes, "interval join state", &mut self.watermark, rescaled)? else {
            return Ok(());
        };
        while let Some((&tag, rest)) = bytes.split_first() {
            bytes = rest;
            match tag {
                LEFT | LEFT_MET => {
                    let a = take_record(&mut bytes, |a: &A| a.clone())?;
                    let key = (self.fns.key_a)(&a);
                    if rescaled && !self.owns(&key) {
                        continue;
                    }
                    let t = (self.fns.time_a)(&a);
                    self.seq += 1;
                    self.keys.entry(key.clone()).or_default().left.insert((t, self.seq), (a, tag == LEFT_MET));
                    let expiry = self.left_expiry(t);
                    self.timers.register(key, expiry);
                }
                RIGHT => {
                    let b = take_record(&mut bytes, |b: &B| b.clone())?;
                    let key = (self.fns.key_b)(&b);
                    if rescaled && !self.owns(&key) {
                        continue;
                    }
                    let t = (self.fns.time_b)(&b);
                    self.seq += 1;
                    self.keys.entry(key.clone()).or_default().right.insert((t, self.seq), b);
                    let expiry = self.right_expiry(t);
                    self.timers.register(key, expiry);
                }
                other => {
                    return Err(CodecError {
                        type_name: "interval join state",
                        len: bytes.len(),
                        reason: format!("entry tag {other} is none of left (0), left met (1), right (2)"),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Whether `key` is in the key groups subtask `info` owns.
fn owns<K: Hash>(info: &SubtaskInfo, key: &K) -> bool {
    info.key_groups().contains(&info.key_groups_of_keys().key_group(hash_key(key)))
}

/// What the two joins share to restore: loading one part of checkpoint bytes.
trait Restores {
    /// Add the records of one part (`rescaled`: keep only this subtask's key groups, and
    /// the least watermark).
    fn load(&mut self, bytes: &[u8], rescaled: bool) -> Result<(), CodecError>;
    fn watermark(&mut self) -> &mut u64;
    /// `interval join <node>`, for messages.
    fn name(&self) -> String;
}

/// Restore `parts` (one, or every old subtask's when `rescaled`); a part that does not
/// read fails the restore, saying which join and why.
fn restore_parts<'a, J: Restores>(
    join: &mut J,
    parts: impl Iterator<Item = &'a [u8]>,
    rescaled: bool,
) -> Result<(), Halt> {
    if rescaled {
        // The least over the parts: start above every watermark.
        *join.watermark() = u64::MAX;
    }
    let mut any = false;
    for bytes in parts.filter(|b| !b.is_empty()) {
        any = true;
        join.load(bytes, rescaled).map_err(|e| Halt::failed(format!("{}: restore: {e}", join.name())))?;
    }
    if !any {
        *join.watermark() = 0;
    }
    Ok(())
}

/// Read the header of one part of a join's checkpoint bytes (the layout version, then the
/// watermark into `watermark`) and return the entries after it; `None` for an empty part.
/// A join restores its watermark, so a record that was late before the restore is late
/// after it, and a closed window stays closed. Restoring parts of several old subtasks
/// (another parallelism), it keeps the least of theirs: a record one of them would still
/// have taken is not dropped.
fn take_header<'a>(
    bytes: &'a [u8],
    type_name: &'static str,
    watermark: &mut u64,
    rescaled: bool,
) -> Result<Option<&'a [u8]>, CodecError> {
    let Some((&version, rest)) = bytes.split_first() else { return Ok(None) };
    if version != VERSION {
        return Err(CodecError {
            type_name,
            len: bytes.len(),
            reason: format!("version {version}, this build reads {VERSION}"),
        });
    }
    // (`restore_parts` starts from u64::MAX when rescaled, and takes 0 if no part had one.)
    let Some((w, rest)) = rest.split_first_chunk::<8>() else {
        return Err(CodecError {
            type_name: "join state",
            len: rest.len(),
            reason: "the bytes end before the watermark".to_owned(),
        });
    };
    let w = u64::from_le_bytes(*w);
    *watermark = if rescaled { (*watermark).min(w) } else { w };
    Ok(Some(rest))
}

/// The event times `[lo, hi]` as u64s, clipped to the u64 range; `None` if none is in it.
fn span(lo: i128, hi: i128) -> Option<(u64, u64)> {
    (hi >= 0 && lo <= u64::MAX as i128).then(|| (sat(lo), sat(hi)))
}

/// `v` clamped to the u64 range.
fn sat(v: i128) -> u64 {
    v.clamp(0, u64::MAX as i128) as u64
}

impl<A, B, K, U> KeyedProcess<Either<A, B>, U> for IntervalJoin<A, B, K, U>
where
    A: Record + Clone,
    B: Record + Clone,
    K: Hash + Eq + Ord + Clone + Send + 'static,
    U: Record,
{
    fn process(
        &mut self,
        record: &Either<A, B>,
        _key_group: u32,
        out: &mut dyn FnMut(&U) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        match record {
            Either::Left(a) => self.left_arrives(a.clone(), out),
            Either::Right(b) => self.right_arrives(b.clone(), out),
        }
    }

    fn late_records(&self) -> u64 {
        self.late
    }

    fn on_watermark(&mut self, watermark: u64, out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        while let Some((_, key)) = self.timers.pop_due(watermark) {
            self.expire(&key, out)?;
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        // The input ended: every interval is closed.
        self.on_watermark(u64::MAX, out)
    }

    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        let mut out = vec![VERSION];
        out.extend_from_slice(&self.watermark.to_le_bytes());
        for buffers in self.keys.values() {
            for (a, met) in buffers.left.values() {
                out.push(if *met { LEFT_MET } else { LEFT });
                put_record(&mut out, a);
            }
            for b in buffers.right.values() {
                out.push(RIGHT);
                put_record(&mut out, b);
            }
        }
        Ok(out)
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), Halt> {
        restore_parts(self, std::iter::once(state), false)
    }

    fn restore_rescaled(&mut self, from: &Rescaled) -> Result<(), Halt> {
        restore_parts(self, from.parts.iter().map(|(_, bytes)| bytes.as_slice()), true)
    }
}

/// The windows of a [`WindowJoin`]: `size` ns long, one starting every `slide` ns (equal:
/// tumbling), aligned to multiples of `slide` from 0, as the window operator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinWindows {
    /// Window length, ns.
    pub size: u64,
    /// Between window starts, ns (`size`: tumbling).
    pub slide: u64,
    /// Inner or left outer (a left record alone in a window is emitted with `None`).
    pub kind: JoinKind,
}

impl JoinWindows {
    /// Why these windows make no join, if they don't.
    pub fn problem(&self) -> Option<String> {
        (self.size == 0 || self.slide == 0 || self.slide > self.size).then(|| {
            format!(
                "windows of {} ns every {} ns: give a size > 0 and a slide in 1..=size (tumbling: slide = size)",
                self.size, self.slide
            )
        })
    }

    /// The starts of the windows holding time `t`, latest first.
    fn starts(&self, t: u64) -> impl Iterator<Item = u64> + use<> {
        let (size, slide) = (self.size, self.slide);
        let last = t - t % slide;
        (0..size.div_ceil(slide)).map_while(move |k| {
            let start = last.checked_sub(k * slide)?;
            (start + size > t).then_some(start)
        })
    }
}

/// A window join of one subtask: each left record meets every right record of its key in
/// each window (tumbling or sliding) holding both; a window's pairs (and, left outer, its
/// left records that met none) are emitted when the watermark closes it (an event-time
/// timer per key and window), and its records dropped. A record is put in the windows that
/// are still open when it comes (end above the watermark); one that finds none is late:
/// dropped and counted. Checkpointed with the window each record is in, so a restore
/// neither reopens a closed window nor loses an open one; at another parallelism a subtask
/// keeps its key groups.
pub struct WindowJoin<A, B, K, U> {
    windows: JoinWindows,
    fns: JoinFns<A, B, K, U>,
    open: HashMap<(K, u64), (Vec<A>, Vec<B>)>,
    timers: EventTimers<(K, u64)>,
    watermark: u64,
    late: u64,
    info: SubtaskInfo,
}

impl<A, B, K: Ord + Clone, U> std::fmt::Debug for WindowJoin<A, B, K, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowJoin")
            .field("node", &self.info.name())
            .field("windows", &self.windows)
            .field("open", &self.open.len())
            .field("watermark", &self.watermark)
            .field("late", &self.late)
            .finish()
    }
}

impl<A, B, K, U> WindowJoin<A, B, K, U>
where
    A: Record + Clone,
    B: Record + Clone,
    K: Hash + Eq + Ord + Clone + Send + 'static,
    U: Record,
{
    /// The join of subtask `info`.
    pub fn new(info: &SubtaskInfo, windows: JoinWindows, fns: JoinFns<A, B, K, U>) -> WindowJoin<A, B, K, U> {
        WindowJoin {
            windows,
            fns,
            open: HashMap::new(),
            timers: EventTimers::new(),
            watermark: 0,
            late: 0,
            info: info.clone(),
        }
    }

    /// Records that found every window of theirs closed.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Records held, counted once per window they are in.
    pub fn held(&self) -> usize {
        self.open.values().map(|(l, r)| l.len() + r.len()).sum()
    }

    /// The window of `key` starting at `start`, opened (with its timer) if new.
    fn window(&mut self, key: K, start: u64) -> &mut (Vec<A>, Vec<B>) {
        let timers = &mut self.timers;
        let end = start.saturating_add(self.windows.size);
        self.open.entry((key.clone(), start)).or_insert_with(|| {
            timers.register((key, start), end - 1);
            (Vec::new(), Vec::new())
        })
    }

    /// The open windows (end above the watermark) holding `t`.
    fn open_starts(&self, t: u64) -> Vec<u64> {
        let (size, w) = (self.windows.size, self.watermark);
        self.windows.starts(t).filter(|s| s.saturating_add(size) > w).collect()
    }

    fn load_part(&mut self, bytes: &[u8], rescaled: bool) -> Result<(), CodecError> {
        let bad = |len: usize, reason: String| CodecError { type_name: "window join state", len, reason };
        let Some(mut bytes) = take_header(bytes, "window join state", &mut self.watermark, rescaled)? else {
            return Ok(());
        };
        while let Some((&tag, rest)) = bytes.split_first() {
            let Some((start, rest)) = rest.split_first_chunk::<8>() else {
                return Err(bad(rest.len(), "an entry without its window".to_owned()));
            };
            let start = u64::from_le_bytes(*start);
            bytes = rest;
            match tag {
                LEFT => {
                    let a = take_record(&mut bytes, |a: &A| a.clone())?;
                    let key = (self.fns.key_a)(&a);
                    if !rescaled || self.owns(&key) {
                        self.window(key, start).0.push(a);
                    }
                }
                RIGHT => {
                    let b = take_record(&mut bytes, |b: &B| b.clone())?;
                    let key = (self.fns.key_b)(&b);
                    if !rescaled || self.owns(&key) {
                        self.window(key, start).1.push(b);
                    }
                }
                other => return Err(bad(bytes.len(), format!("entry tag {other} is neither left (0) nor right (2)"))),
            }
        }
        Ok(())
    }

    fn owns(&self, key: &K) -> bool {
        owns(&self.info, key)
    }
}

impl<A, B, K, U> KeyedProcess<Either<A, B>, U> for WindowJoin<A, B, K, U>
where
    A: Record + Clone,
    B: Record + Clone,
    K: Hash + Eq + Ord + Clone + Send + 'static,
    U: Record,
{
    fn process(
        &mut self,
        record: &Either<A, B>,
        _kg: u32,
        _out: &mut dyn FnMut(&U) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        let starts = match record {
            Either::Left(a) => self.open_starts((self.fns.time_a)(a)),
            Either::Right(b) => self.open_starts((self.fns.time_b)(b)),
        };
        if starts.is_empty() {
            self.late += 1;
            return Ok(());
        }
        match record {
            Either::Left(a) => {
                let key = (self.fns.key_a)(a);
                for s in starts {
                    self.window(key.clone(), s).0.push(a.clone());
                }
            }
            Either::Right(b) => {
                let key = (self.fns.key_b)(b);
                for s in starts {
                    self.window(key.clone(), s).1.push(b.clone());
                }
            }
        }
        Ok(())
    }

    fn late_records(&self) -> u64 {
        self.late
    }

    fn on_watermark(&mut self, watermark: u64, out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        while let Some((_, key)) = self.timers.pop_due(watermark) {
            let Some((lefts, rights)) = self.open.remove(&key) else { continue };
            for a in &lefts {
                for b in &rights {
                    out(&(self.fns.join)(a, Some(b)))?;
                }
                if rights.is_empty() && self.windows.kind == JoinKind::LeftOuter {
                    out(&(self.fns.join)(a, None))?;
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut dyn FnMut(&U) -> Result<(), Halt>) -> Result<(), Halt> {
        self.on_watermark(u64::MAX, out)
    }

    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        let mut out = vec![VERSION];
        out.extend_from_slice(&self.watermark.to_le_bytes());
        for ((_, start), (lefts, rights)) in &self.open {
            for a in lefts {
                out.push(LEFT);
                out.extend_from_slice(&start.to_le_bytes());
                put_record(&mut out, a);
            }
            for b in rights {
                out.push(RIGHT);
                out.extend_from_slice(&start.to_le_bytes());
                put_record(&mut out, b);
            }
        }
        Ok(out)
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), Halt> {
        restore_parts(self, std::iter::once(state), false)
    }

    fn restore_rescaled(&mut self, from: &Rescaled) -> Result<(), Halt> {
        restore_parts(self, from.parts.iter().map(|(_, bytes)| bytes.as_slice()), true)
    }
}

impl<A, B, K, U> Restores for IntervalJoin<A, B, K, U>
where
    A: Record + Clone,
    B: Record + Clone,
    K: Hash + Eq + Ord + Clone + Send + 'static,
    U: Record,
{
    fn load(&mut self, bytes: &[u8], rescaled: bool) -> Result<(), CodecError> {
        self.load_part(bytes, rescaled)
    }
    fn watermark(&mut self) -> &mut u64 {
        &mut self.watermark
    }
    fn name(&self) -> String {
        format!("interval join {}", self.info.node)
    }
}

impl<A, B, K, U> Restores for WindowJoin<A, B, K, U>
where
    A: Record + Clone,
    B: Record + Clone,
    K: Hash + Eq + Ord + Clone + Send + 'static,
    U: Record,
{
    fn load(&mut self, bytes: &[u8], rescaled: bool) -> Result<(), CodecError> {
        self.load_part(bytes, rescaled)
    }
    fn watermark(&mut self) -> &mut u64 {
        &mut self.watermark
    }
    fn name(&self) -> String {
        format!("window join {}", self.info.node)
    }
}
