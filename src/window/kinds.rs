//! The window shapes, as operations on one key's slot: add a record, catch up with the
//! watermark (fire what is due, drop what is past lateness), and say when the key next
//! needs attention.
//!
//! Times: `w` is the watermark (records below it are complete); a window `[s, e)` is *due*
//! when `e <= w` and *expired* when `e + lateness <= w`. A key's windows that end at or
//! before `slot.caught_up` have fired; catching up to `w` fires those that end in
//! `(caught_up, w]`.

use super::cache::{Entry, Slot};
use super::{Fired, WindowAggregate, WindowKind};
use crate::operators::{Collector, Halt};
use crate::time::duration_ns;
use weir_ring::counters::Counter;

/// Where firing windows go, and the time they fire at.
pub(crate) struct Firing<'a, T, G: WindowAggregate<T>> {
    pub agg: &'a G,
    pub out: &'a mut dyn Collector<G::Out>,
    pub records_out: Counter<'a>,
    /// The watermark (or processing time) now.
    pub w: u64,
    pub lateness: u64,
    /// Windows fired so far (for chunking).
    pub fired: usize,
    /// The newest end of a window fired (0: none): the event time of the latency marker
    /// that follows the results.
    pub newest_end: u64,
    pub _t: std::marker::PhantomData<fn(&T)>,
}

impl<T, G: WindowAggregate<T>> Firing<'_, T, G> {
    #[inline]
    fn emit(&mut self, key: u64, start: u64, end: u64, acc: &G::Acc, late: bool) -> Result<(), Halt> {
        let result = self.agg.result(&Fired { key, start_ns: start, end_ns: end, late }, acc);
        self.records_out.add(1);
        self.fired += 1;
        self.newest_end = self.newest_end.max(end);
        self.out.collect(&result)
    }

    /// Whether a window ending at `end` is past allowed lateness.
    #[inline]
    fn expired(&self, end: u64) -> bool {
        end.saturating_add(self.lateness) <= self.w
    }
}

/// A window step (slide or pane) in ns, with its reciprocal: rounding a time to a multiple
/// of it, once or more per record, multiplies instead of dividing (exact: the same result).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    ns: u64,
    reciprocal: strength_reduce::StrengthReducedU64,
}

impl PartialEq for Step {
    fn eq(&self, other: &Step) -> bool {
        self.ns == other.ns
    }
}

impl Eq for Step {}

impl Step {
    /// A step of `ns` (at least 1).
    pub(crate) fn new(ns: u64) -> Step {
        let ns = ns.max(1);
        Step { ns, reciprocal: strength_reduce::StrengthReducedU64::new(ns) }
    }

    /// The step in ns.
    #[inline]
    pub(crate) fn get(self) -> u64 {
        self.ns
    }

    /// The largest multiple at or below `t`.
    #[inline]
    pub(crate) fn floor(self, t: u64) -> u64 {
        t - t % self.reciprocal
    }

    /// The smallest multiple at or above `x` (saturating to the largest multiple).
    #[inline]
    fn ceil(self, x: u64) -> u64 {
        let down = self.floor(x);
        if down == x { x } else { down.checked_add(self.ns).unwrap_or(down) }
    }
}

/// A window shape, in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Tumbling (`slide == size`) and sliding windows, kept as panes of `gcd(size, slide)`.
    Aligned { size: u64, slide: Step, pane: Step },
    /// Session windows.
    Session { gap: u64 },
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The smallest multiple of `a` at or above `x` (saturating): what [`Step::ceil`] gives.
#[cfg(test)]
fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a).checked_mul(a).unwrap_or(u64::MAX - u64::MAX % a)
}

impl Kind {
    /// The shape of a window specification (sizes were checked to be positive).
    pub(crate) fn of(kind: WindowKind) -> Kind {
        let ns = |d| duration_ns(d).max(1);
        match kind {
            WindowKind::Tumbling { size } => {
                Kind::Aligned { size: ns(size), slide: Step::new(ns(size)), pane: Step::new(ns(size)) }
            }
            WindowKind::Sliding { size, slide } => {
                let (size, slide) = (ns(size), ns(slide));
                Kind::Aligned { size, slide: Step::new(slide), pane: Step::new(gcd(size, slide)) }
            }
            WindowKind::Session { gap } => Kind::Session { gap: ns(gap) },
        }
    }

    /// How much the watermark must move between sweeps over every key. Aligned windows end
    /// together, so a sweep when the first is due fires them all: no quantum. Session ends
    /// are spread over time; sweeping at every watermark would visit every key per
    /// watermark, so sessions sweep at most every quarter gap. Their results then lag the
    /// watermark by up to that much, the watermark sent downstream lags with them (so they
    /// are not late there), and a key touched meanwhile catches up first: results are the
    /// same.
    pub(crate) fn sweep_quantum(&self) -> u64 {
        match *self {
            Kind::Aligned { .. } => 0,
            Kind::Session { gap } => (gap / 4).max(1),
        }
    }

    /// For aligned windows: whether every window of a record at `t` is expired (decided
    /// before touching state).
    #[inline]
    pub(crate) fn all_expired(&self, t: u64, w: u64, lateness: u64) -> bool {
        match *self {
            Kind::Aligned { size, slide, .. } => slide.floor(t).saturating_add(size).saturating_add(lateness) <= w,
            Kind::Session { .. } => false,
        }
    }

    /// Whether a record at `t` belongs to a window that is due at `w`: adding it fires that
    /// window again, which needs all of the key's state. (Sessions: always, as a record may
    /// merge sessions.)
    #[inline]
    pub(crate) fn touches_due(&self, t: u64, w: u64) -> bool {
        match *self {
            Kind::Aligned { size, slide, .. } => first_start_containing(t, size, slide).saturating_add(size) <= w,
            Kind::Session { .. } => true,
        }
    }

    /// Add a record at time `t` to `slot` (caught up to `f.w`). Returns false when the
    /// record is late (every window it belongs to has expired); nothing changed then.
    #[inline]
    pub(crate) fn add<T, G: WindowAggregate<T>>(
        &self,
        slot: &mut Slot<G::Acc>,
        t: u64,
        record: &T,
        f: &mut Firing<'_, T, G>,
    ) -> Result<bool, Halt> {
        match *self {
            Kind::Aligned { size, slide, pane } => aligned_add(size, slide, pane, slot, t, record, f),
            Kind::Session { gap } => session_add(gap, slot, t, record, f),
        }
    }

    /// Fire the windows of `slot` that became due since it last caught up, drop the expired
    /// ones, and update `caught_up` and `next_due`.
    pub(crate) fn catch_up<T, G: WindowAggregate<T>>(
        &self,
        slot: &mut Slot<G::Acc>,
        f: &mut Firing<'_, T, G>,
    ) -> Result<(), Halt> {
        let (c, w) = (slot.caught_up, f.w);
        match *self {
            Kind::Aligned { size, slide, .. } => {
                let mut s = first_start_containing(c, size, slide);
                while let Some(x) = next_window(slot.entries.as_slice(), s, size, slide) {
                    if x.saturating_add(size) > w {
                        break;
                    }
                    fire_aligned(slot, x, size, false, f)?;
                    s = x.saturating_add(slide.get());
                }
                let lateness = f.lateness;
                slot.entries.retain(|p| pane_cleanup(p.start, size, slide, lateness) > w);
            }
            Kind::Session { .. } => {
                for e in slot.entries.as_slice() {
                    if e.end > c && e.end <= w {
                        f.emit(slot.key, e.start, e.end, &e.acc, false)?;
                    }
                }
                let lateness = f.lateness;
                slot.entries.retain(|e| e.end.saturating_add(lateness) > w);
            }
        }
        slot.caught_up = w;
        slot.next_due = self.next_due(slot, f.lateness);
        Ok(())
    }

    /// When `slot` (caught up to `slot.caught_up`) next needs attention: its first window
    /// that has not fired, or its first expiry.
    pub(crate) fn next_due<A>(&self, slot: &Slot<A>, lateness: u64) -> u64 {
        let entries = slot.entries.as_slice();
        let Some(first) = entries.first() else { return u64::MAX };
        let c = slot.caught_up;
        match *self {
            Kind::Aligned { size, slide, .. } => {
                let fire = next_window(entries, first_start_containing(c, size, slide), size, slide)
                    .map_or(u64::MAX, |s| s.saturating_add(size));
                fire.min(pane_cleanup(first.start, size, slide, lateness))
            }
            Kind::Session { .. } => entries
                .iter()
                .map(|e| if e.end > c { e.end } else { e.end.saturating_add(lateness) })
                .min()
                .unwrap_or(u64::MAX),
        }
    }
}

/// The first window start `s` (a multiple of `slide`) whose window `[s, s + size)` ends
/// after `t`: the first window containing `t`, or the first not yet due at watermark `t`.
#[inline]
fn first_start_containing(t: u64, size: u64, slide: Step) -> u64 {
    slide.ceil(t.saturating_add(1).saturating_sub(size))
}

/// When pane `p` may go: the last window containing it has expired.
#[inline]
fn pane_cleanup(p: u64, size: u64, slide: Step, lateness: u64) -> u64 {
    slide.floor(p).saturating_add(size).saturating_add(lateness)
}

/// The first window start at or after `s` whose window holds at least one pane.
#[inline]
fn next_window<A>(panes: &[Entry<A>], s: u64, size: u64, slide: Step) -> Option<u64> {
    let i = panes.partition_point(|p| p.start < s);
    let p = panes.get(i)?.start;
    if p < s.saturating_add(size) { Some(s) } else { Some(first_start_containing(p, size, slide)) }
}

/// Fire window `[s, s + size)` of an aligned slot: its panes merged (one pane: as is).
fn fire_aligned<T, G: WindowAggregate<T>>(
    slot: &Slot<G::Acc>,
    s: u64,
    size: u64,
    late: bool,
    f: &mut Firing<'_, T, G>,
) -> Result<(), Halt> {
    let panes = slot.entries.as_slice();
    let e = s.saturating_add(size);
    let lo = panes.partition_point(|p| p.start < s);
    let hi = panes.partition_point(|p| p.start < e);
    match hi - lo {
        0 => Ok(()),
        1 => f.emit(slot.key, s, e, &panes[lo].acc, late),
        _ => {
            let mut acc = f.agg.create();
            for p in &panes[lo..hi] {
                f.agg.merge(&mut acc, &p.acc);
            }
            f.emit(slot.key, s, e, &acc, late)
        }
    }
}

#[inline]
fn aligned_add<T, G: WindowAggregate<T>>(
    size: u64,
    slide: Step,
    pane: Step,
    slot: &mut Slot<G::Acc>,
    t: u64,
    record: &T,
    f: &mut Firing<'_, T, G>,
) -> Result<bool, Halt> {
    let last = slide.floor(t);
    if f.expired(last.saturating_add(size)) {
        return Ok(false);
    }
    let p = pane.floor(t);
    let panes = slot.entries.as_mut_slice();
    // In-order data hits the newest pane: look there first.
    let found = match panes.last() {
        Some(e) if e.start == p => Ok(panes.len() - 1),
        _ => panes.binary_search_by_key(&p, |e| e.start),
    };
    let i = match found {
        Ok(i) => i,
        Err(i) => {
            slot.entries.insert(i, Entry { start: p, end: p.saturating_add(pane.get()), acc: f.agg.create() });
            // A new pane: its first unfired window or its expiry may come before the key's.
            let first = first_start_containing(p, size, slide).max(first_start_containing(f.w, size, slide));
            let due = if first <= last { first.saturating_add(size) } else { pane_cleanup(p, size, slide, f.lateness) };
            slot.next_due = slot.next_due.min(due);
            i
        }
    };
    f.agg.add(&mut slot.entries.as_mut_slice()[i].acc, record);
    // Windows of `t` that are due already (but not expired) fire again with the record, as
    // Flink's trigger does for a late element within allowed lateness.
    let first = first_start_containing(t, size, slide);
    if first.saturating_add(size) <= f.w {
        let mut s = first;
        while s <= last {
            let e = s.saturating_add(size);
            if e <= f.w && !f.expired(e) {
                fire_aligned(slot, s, size, true, f)?;
            }
            s += slide.get();
        }
    }
    Ok(true)
}

fn session_add<T, G: WindowAggregate<T>>(
    gap: u64,
    slot: &mut Slot<G::Acc>,
    t: u64,
    record: &T,
    f: &mut Firing<'_, T, G>,
) -> Result<bool, Halt> {
    let (s, e) = (t, t.saturating_add(gap));
    let list = slot.entries.as_slice();
    // Sessions are sorted and apart, so those that touch [s, e] (Flink: a.start <= b.end &&
    // a.end >= b.start) are a run.
    let lo = list.partition_point(|x| x.end < s);
    let hi = list.partition_point(|x| x.start <= e);
    if lo >= hi {
        if f.expired(e) {
            return Ok(false);
        }
        let mut acc = f.agg.create();
        f.agg.add(&mut acc, record);
        slot.entries.insert(lo, Entry { start: s, end: e, acc });
    } else {
        for j in (lo + 1..hi).rev() {
            let other = slot.entries.remove(j);
            let first = &mut slot.entries.as_mut_slice()[lo];
            f.agg.merge(&mut first.acc, &other.acc);
            first.end = first.end.max(other.end);
        }
        let first = &mut slot.entries.as_mut_slice()[lo];
        first.start = first.start.min(s);
        first.end = first.end.max(e);
        f.agg.add(&mut first.acc, record);
    }
    let merged = &slot.entries.as_slice()[lo];
    let (start, end) = (merged.start, merged.end);
    if end <= f.w {
        // Due already (within lateness): fire again with the record.
        f.emit(slot.key, start, end, &merged.acc, true)?;
    }
    slot.next_due = slot.next_due.min(if end > f.w { end } else { end.saturating_add(f.lateness) });
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Window arithmetic at the edges: the first window of a time, pane expiry, alignment.
    #[test]
    fn aligned_arithmetic() {
        assert_eq!(first_start_containing(0, 10, Step::new(5)), 0);
        assert_eq!(first_start_containing(12, 10, Step::new(5)), 5, "[5, 15) holds 12; [0, 10) does not");
        assert_eq!(first_start_containing(15, 10, Step::new(5)), 10);
        assert_eq!(first_start_containing(9, 10, Step::new(10)), 0);
        assert_eq!(first_start_containing(10, 10, Step::new(10)), 10);
        assert_eq!(pane_cleanup(12, 10, Step::new(5), 0), 20, "the last window holding 12 is [10, 20)");
        assert_eq!(pane_cleanup(12, 10, Step::new(5), 3), 23);
        assert_eq!(align_up(u64::MAX - 3, 10), u64::MAX - u64::MAX % 10);
        for (x, a) in [(u64::MAX - 3, 10), (0, 7), (14, 7), (15, 7), (u64::MAX, 1), (u64::MAX, u64::MAX), (5, u64::MAX)]
        {
            assert_eq!(Step::new(a).ceil(x), align_up(x, a), "ceil({x}, {a})");
            assert_eq!(Step::new(a).floor(x), x - x % a, "floor({x}, {a})");
        }
        assert_eq!(
            Kind::of(WindowKind::Sliding {
                size: std::time::Duration::from_nanos(10),
                slide: std::time::Duration::from_nanos(4)
            }),
            Kind::Aligned { size: 10, slide: Step::new(4), pane: Step::new(2) }
        );
        let panes: Vec<Entry<u8>> = [30u64, 32].iter().map(|&s| Entry { start: s, end: s + 2, acc: 0 }).collect();
        assert_eq!(next_window(&panes, 0, 10, Step::new(4)), Some(24), "[24, 34) is the first window with a pane");
        assert_eq!(next_window(&panes, 28, 10, Step::new(4)), Some(28));
        assert_eq!(next_window(&panes, 36, 10, Step::new(4)), None);
    }

    proptest::proptest! {
        /// The reciprocal rounds exactly as the division does.
        #[test]
        fn steps_round_as_divisions(x: u64, a in 1u64..) {
            proptest::prop_assert_eq!(Step::new(a).floor(x), x - x % a);
            proptest::prop_assert_eq!(Step::new(a).ceil(x), align_up(x, a));
        }
    }
}
