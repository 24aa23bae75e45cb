//! Ranking window results: the top N keys of each window ([`TopN`], built by
//! [`Stream::top_n`](crate::graph::Stream::top_n)), the second phase after a keyed window
//! aggregate — "the auctions with the most bids per window" (Nexmark q5), "the ten busiest
//! users per minute".
//!
//! Results are keyed by window (all of a window's results meet in one subtask) and held
//! until the watermark closes the window; then the N best by the ranking value go out,
//! ties at the N-th kept (so more than N may go out). A late re-firing of a window that
//! already went out (a window result with `late = 1`, within the window operator's allowed
//! lateness) replaces its key's result and sends the window's top N again, every record
//! marked `late = 1`: an updating result, each set replacing the last for its window. A
//! window's results are kept until the watermark passes its end plus the lateness given;
//! a result that comes later is dropped.

use super::WindowResult;
use crate::operators::timers::EventTimers;
use crate::operators::{Halt, KeyedProcess};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The ranking value of a result (larger ranks first), e.g. `|r| r.count`.
pub type RankFn = Arc<dyn Fn(&WindowResult) -> u64 + Send + Sync>;

/// One window's results so far, by key, and whether its top N went out.
#[derive(Debug, Default)]
struct Ranked {
    by_key: HashMap<u64, WindowResult>,
    sent: bool,
}

/// The top N of each window, in one subtask (see the module's docs).
pub struct TopN {
    n: usize,
    lateness_ns: u64,
    rank: RankFn,
    /// window start → its results.
    windows: BTreeMap<u64, Ranked>,
    /// (time, window start): a window's close (`end − 1`) and its drop (`end + lateness − 1`).
    timers: EventTimers<u64>,
    ends: HashMap<u64, u64>,
    watermark: u64,
}

impl std::fmt::Debug for TopN {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopN").field("n", &self.n).field("windows", &self.windows.len()).finish()
    }
}

impl TopN {
    /// The `n` best of each window by `rank`, windows kept `lateness_ns` past their end.
    pub fn new(n: usize, lateness_ns: u64, rank: RankFn) -> TopN {
        TopN {
            n: n.max(1),
            lateness_ns,
            rank,
            windows: BTreeMap::new(),
            timers: EventTimers::new(),
            ends: HashMap::new(),
            watermark: 0,
        }
    }

    /// Send window `start`'s top N (marked late if `late`).
    fn send(&self, start: u64, late: bool, out: &mut dyn FnMut(&WindowResult) -> Result<(), Halt>) -> Result<(), Halt> {
        let Some(w) = self.windows.get(&start) else { return Ok(()) };
        let mut all: Vec<&WindowResult> = w.by_key.values().collect();
        all.sort_unstable_by(|a, b| (self.rank)(b).cmp(&(self.rank)(a)).then(a.key.cmp(&b.key)));
        let Some(cut) = all.get(self.n - 1).or(all.last()).map(|r| (self.rank)(r)) else { return Ok(()) };
        for r in all.into_iter().take_while(|r| (self.rank)(r) >= cut) {
            out(&WindowResult { late: late as u32, ..*r })?;
        }
        Ok(())
    }
}

impl KeyedProcess<WindowResult, WindowResult> for TopN {
    fn process(
        &mut self,
        r: &WindowResult,
        _key_group: u32,
        out: &mut dyn FnMut(&WindowResult) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        if r.end_ns.saturating_add(self.lateness_ns) <= self.watermark {
            // Its window went out and was dropped: past the lateness, as the window
            // operator would have dropped the record itself.
            return Ok(());
        }
        let w = self.windows.entry(r.start_ns).or_insert_with(|| {
            self.timers.register(r.start_ns, r.end_ns - 1);
            self.ends.insert(r.start_ns, r.end_ns);
            Ranked::default()
        });
        w.by_key.insert(r.key, *r);
        if w.sent {
            // A late re-firing of a window that went out: its top N again, as an update.
            self.send(r.start_ns, true, out)?;
        }
        Ok(())
    }

    fn on_watermark(&mut self, w: u64, out: &mut dyn FnMut(&WindowResult) -> Result<(), Halt>) -> Result<(), Halt> {
        self.watermark = self.watermark.max(w);
        while let Some((t, start)) = self.timers.pop_due(w) {
            let Some(&end) = self.ends.get(&start) else { continue };
            let window = self.windows.get_mut(&start).expect("a window per end");
            if !window.sent && t == end - 1 {
                window.sent = true;
                self.send(start, false, out)?;
                if self.lateness_ns > 0 {
                    self.timers.register(start, (end - 1).saturating_add(self.lateness_ns));
                    continue;
                }
            }
            self.windows.remove(&start);
            self.ends.remove(&start);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(key: u64, start: u64, count: u64, late: u32) -> WindowResult {
        WindowResult { key, start_ns: start, end_ns: start + 10, count, late, ..WindowResult::default() }
    }

    fn run(top: &mut TopN, input: &[Result<WindowResult, u64>]) -> Vec<(u64, u64, u64, u32)> {
        let mut got = Vec::new();
        let mut out = |r: &WindowResult| -> Result<(), Halt> {
            got.push((r.start_ns, r.key, r.count, r.late));
            Ok(())
        };
        for i in input {
            match i {
                Ok(r) => top.process(r, 0, &mut out).unwrap(),
                Err(w) => top.on_watermark(*w, &mut out).unwrap(),
            }
        }
        got
    }

    /// The top 2 of each window when the watermark closes it, ties at the 2nd kept; a late
    /// re-firing sends the window's top 2 again, marked late; past the lateness, nothing.
    #[test]
    fn top_n_per_window_with_ties_and_late_updates() {
        let mut top = TopN::new(2, 5, Arc::new(|r: &WindowResult| r.count));
        let input = [
            Ok(result(1, 0, 5, 0)),
            Ok(result(2, 0, 9, 0)),
            Ok(result(3, 0, 5, 0)),
            Ok(result(4, 0, 1, 0)),
            Ok(result(7, 10, 3, 0)),
            Err(9),
            Err(10),
            Ok(result(4, 0, 12, 1)),
            Err(20),
            Ok(result(1, 0, 99, 1)),
        ];
        let got = run(&mut top, &input);
        assert_eq!(
            got,
            vec![(0, 2, 9, 0), (0, 1, 5, 0), (0, 3, 5, 0), (0, 4, 12, 1), (0, 2, 9, 1), (10, 7, 3, 0),],
            "window 0 at watermark 10 (a tie at the 2nd), its late update, window 10 at 20, window 0 dropped at 15"
        );
        assert_eq!(
            top.windows.len(),
            1,
            "window 10 is kept for its lateness; the result past window 0's opened nothing"
        );
    }
}
