//! What a subtask is waiting on, in words: code that blocks for long inside a subtask (a
//! sink riding out an outage, retrying) says so here, and a checkpoint that expires names it
//! in its reason, beside the subtasks that did not ack ("no ack from gen#0 (waiting 4.1 s:
//! http sink api#0 retrying 2 batches, last: connect ... refused)").
//!
//! One note per subtask; the subtask's thread installs it at start, and code anywhere in that
//! thread (a chained sink, an operator) reaches it without being handed anything: a subtask
//! is one thread running one loop.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One subtask's note: since when it waits, and on what.
#[derive(Debug, Default)]
pub(crate) struct Waiting(Mutex<Option<(Instant, String)>>);

impl Waiting {
    /// "waiting 4.1 s: <what>", or `None` while the subtask is not waiting.
    pub(crate) fn describe(&self) -> Option<String> {
        let note = self.0.lock().unwrap_or_else(|p| p.into_inner());
        note.as_ref().map(|(since, what)| format!("waiting {:.1} s: {what}", since.elapsed().as_secs_f64()))
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Waiting>>> = const { RefCell::new(None) };
}

/// Make `note` the current thread's (a subtask thread does this once, at start).
pub(crate) fn install(note: Arc<Waiting>) {
    CURRENT.with(|c| *c.borrow_mut() = Some(note));
}

/// The current subtask waits on `what` (the text is refreshed, the start kept while it
/// keeps waiting). Outside a subtask thread it does nothing.
pub fn waiting_on(what: impl FnOnce() -> String) {
    CURRENT.with(|c| {
        if let Some(note) = c.borrow().as_ref() {
            let mut note = note.0.lock().unwrap_or_else(|p| p.into_inner());
            let since = note.as_ref().map_or_else(Instant::now, |(since, _)| *since);
            *note = Some((since, what()));
        }
    });
}

/// The current subtask no longer waits.
pub fn waiting_over() {
    CURRENT.with(|c| {
        if let Some(note) = c.borrow().as_ref() {
            note.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_keeps_its_start_and_takes_the_latest_text() {
        let note = Arc::new(Waiting::default());
        waiting_on(|| "ignored: no note installed".into());
        assert!(note.describe().is_none());
        install(note.clone());
        waiting_on(|| "first".into());
        let since = note.0.lock().unwrap().as_ref().unwrap().0;
        waiting_on(|| "second".into());
        let (again, what) = note.0.lock().unwrap().clone().unwrap();
        assert_eq!((again, what.as_str()), (since, "second"));
        assert!(note.describe().unwrap().ends_with("s: second"));
        waiting_over();
        assert!(note.describe().is_none());
    }
}
