//! Side outputs: an operator's second, typed output — late records, dead letters, alerts —
//! as a stream of its own. An operator that has one emits [`Either`]: `Left` for its main
//! output, `Right` for the side; [`Stream::split`] makes them two streams. The two halves are
//! flat_maps chained into the operator's subtask (no ring between them), so a side output
//! costs one copy of each record and goes wherever a stream can go (a sink, a key_by, a
//! join).
//!
//! ```no_run
//! use weir::graph::Job;
//! use weir::operators::builtin::{Generator, NullSink};
//! use weir::record::Event;
//!
//! let job = Job::new("parse");
//! let (parsed, dead_letters) = job
//!     .source("gen", 1, |i| Generator::events(i, 1_000, 10))
//!     .try_map("check", |e: &Event| if e.value < 90 { Ok(*e) } else { Err(format!("value {} out of range", e.value)) });
//! parsed.sink("out", 1, |_| NullSink);
//! dead_letters.sink("dead", 1, |_| NullSink);
//! ```

use super::Stream;
use crate::record::{Either, Record};

impl<U: Record + Clone, S: Record + Clone> Stream<Either<U, S>> {
    /// The main records (`Left`) and the side records (`Right`) as two streams, through
    /// nodes named `main` and `side` (chained into the node before them).
    pub fn split(&self, main: &str, side: &str) -> (Stream<U>, Stream<S>) {
        let m = self.flat_map(main, |e: &Either<U, S>| e.left().cloned());
        let s = self.flat_map(side, |e: &Either<U, S>| e.right().cloned());
        (m, s)
    }
}

impl<T: Record> Stream<T> {
    /// A map that may fail: what `f` returns `Ok` goes to the first stream, what it returns
    /// `Err` to the second (dead letters), each a stream of its own. Nodes `id`, `<id>-ok`
    /// and `<id>-err`, all chained together.
    pub fn try_map<U: Record + Clone, S: Record + Clone>(
        &self,
        id: &str,
        f: impl Fn(&T) -> Result<U, S> + Send + Sync + 'static,
    ) -> (Stream<U>, Stream<S>) {
        self.map(id, move |t: &T| match f(t) {
            Ok(u) => Either::Left(u),
            Err(s) => Either::Right(s),
        })
        .split(&format!("{id}-ok"), &format!("{id}-err"))
    }
}
