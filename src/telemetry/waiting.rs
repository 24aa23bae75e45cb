//! What a subtask is waiting on, in words: code that waits on the outside (a sink riding out
//! an outage, retrying; a source whose broker is away) says so here with [`waiting_on`] and
//! [`waiting_over`]. While the note is up:
//!
//! - the subtask's time counts as *waiting* ([`super::time`]), live;
//! - a wait longer than [`LOG_AFTER`] is logged by the job's monitor thread while it lasts
//!   ("sink#0 waiting 2.0 s: http sink api#0: 4 requests in flight to ..., none answered"),
//!   again every [`LOG_EVERY`], and once more when it ends, with its length — whatever the
//!   subtask does meanwhile (parked, backpressured, in retries);
//! - a checkpoint that expires names it in its reason, beside the subtasks that did not ack
//!   ("no ack from gen#0 (waiting 4.1 s: http sink api#0 retrying 2 batches, last: connect
//!   ... refused)").
//!
//! One note per subtask; the subtask's thread installs it at start, and code anywhere in that
//! thread (a chained sink, an operator) reaches it without being handed anything: a subtask
//! is one thread running one loop.
//!
//! An outage seen from no subtask's thread (librdkafka's error callback says every broker is
//! down) is an [`Outage`]: logged the same way, while it lasts and when it ends.

use super::time::TimeAccount;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A wait is logged once it lasted this long.
pub const LOG_AFTER: Duration = Duration::from_secs(2);
/// And again every this long while it lasts.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// A wait in progress.
#[derive(Debug, Clone)]
struct Note {
    since: Instant,
    what: String,
    /// When it was last logged (None: not yet).
    logged: Option<Instant>,
}

/// One subtask's note: since when it waits, and on what.
#[derive(Debug)]
pub struct Waiting {
    subtask: String,
    time: Arc<TimeAccount>,
    note: Mutex<Option<Note>>,
}

impl Default for Waiting {
    fn default() -> Waiting {
        Waiting::new(String::new(), Arc::default())
    }
}

impl Waiting {
    /// The note of subtask `subtask`, whose time goes to `time`.
    pub(crate) fn new(subtask: String, time: Arc<TimeAccount>) -> Waiting {
        Waiting { subtask, time, note: Mutex::new(None) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Note>> {
        self.note.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// "waiting 4.1 s: <what>", or `None` while the subtask is not waiting.
    pub(crate) fn describe(&self) -> Option<String> {
        self.lock().as_ref().map(|n| format!("waiting {:.1} s: {}", n.since.elapsed().as_secs_f64(), n.what))
    }

    /// Since when and on what the subtask waits (None: it does not).
    pub fn current(&self) -> Option<(Instant, String)> {
        self.lock().as_ref().map(|n| (n.since, n.what.clone()))
    }

    /// The monitor's look, at `now`: log a wait that lasted [`LOG_AFTER`], and every
    /// [`LOG_EVERY`] after.
    pub(crate) fn log_if_long(&self, now: Instant) {
        let mut note = self.lock();
        let Some(n) = note.as_mut() else { return };
        let lasted = now.saturating_duration_since(n.since);
        let due = match n.logged {
            None => lasted >= LOG_AFTER,
            Some(at) => now.saturating_duration_since(at) >= LOG_EVERY,
        };
        if due {
            n.logged = Some(now);
            let waited = lasted.as_secs_f64();
            tracing::warn!(
                event = "waiting",
                subtask = %self.subtask,
                waited_s = waited,
                "{} waiting {waited:.1} s: {}",
                self.subtask,
                n.what
            );
        }
    }

    fn on(&self, what: impl FnOnce() -> String) {
        let mut note = self.lock();
        match note.as_mut() {
            Some(n) => n.what = what(),
            None => {
                let now = Instant::now();
                self.time.set_waiting(true, now);
                *note = Some(Note { since: now, what: what(), logged: None });
            }
        }
    }

    fn over(&self) {
        let Some(n) = self.lock().take() else { return };
        let now = Instant::now();
        self.time.set_waiting(false, now);
        if n.logged.is_some() {
            let waited = now.saturating_duration_since(n.since).as_secs_f64();
            tracing::warn!(
                event = "waiting_over",
                subtask = %self.subtask,
                waited_s = waited,
                "{} no longer waiting, after {waited:.1} s: {}",
                self.subtask,
                n.what
            );
        }
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Waiting>>> = const { RefCell::new(None) };
}

/// Make `note` the current thread's (a subtask thread does this once, at start; a fiber at
/// each resume).
pub(crate) fn install(note: Arc<Waiting>) {
    CURRENT.with(|c| *c.borrow_mut() = Some(note));
}

/// The current subtask waits on `what` (the text is refreshed, the start kept while it
/// keeps waiting). Outside a subtask thread it does nothing. Call it where a wait on the
/// outside begins (and again to say more), and [`waiting_over`] where it ends.
pub fn waiting_on(what: impl FnOnce() -> String) {
    CURRENT.with(|c| {
        if let Some(note) = c.borrow().as_ref() {
            note.on(what);
        }
    });
}

/// The current subtask no longer waits.
pub fn waiting_over() {
    CURRENT.with(|c| {
        if let Some(note) = c.borrow().as_ref() {
            note.over();
        }
    });
}

/// An outage that no subtask's thread sees as a wait of its own (a client library's thread
/// reports it: librdkafka's "all brokers down", or its log of a broker connection that
/// failed). Logged like a wait: after [`LOG_AFTER`] while it lasts, every [`LOG_EVERY`] after
/// (by the monitor thread of any job in the process), and when it ends, with its length; a
/// short one is not logged at all. Cheap to clone; any thread.
///
/// It ends when its reporter says so ([`Outage::up`]: a record came), or, for one that named
/// the address it cannot reach ([`Outage::down_at`]), when that address accepts a TCP
/// connection again: the monitor tries every [`PROBE_EVERY`] (at most [`PROBE_TIMEOUT`]
/// each), so the end is logged when the broker is back, even while the subtask that reads
/// from it is backpressured and polls nothing.
#[derive(Debug, Clone)]
pub struct Outage(Arc<Mutex<Option<Down>>>);

/// An outage in progress.
#[derive(Debug)]
struct Down {
    note: Note,
    /// The address whose coming back ends it, and when it was last tried.
    probe: Option<(SocketAddr, Option<Instant>)>,
}

/// How often the monitor tries the address of an outage ([`Outage::down_at`]).
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long one try may wait for the connection.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(100);

/// Every outage alive in the process, for the monitors to watch.
static OUTAGES: Mutex<Vec<std::sync::Weak<Mutex<Option<Down>>>>> = Mutex::new(Vec::new());

impl Default for Outage {
    fn default() -> Outage {
        Outage::new()
    }
}

/// Log every outage of the process that is due, and try the addresses of those that name
/// one (see [`Outage`]); a monitor's call.
pub(crate) fn watch_outages(now: Instant) {
    let alive: Vec<Outage> = {
        let mut all = OUTAGES.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(std::sync::Weak::upgrade).map(Outage).collect()
    };
    for o in alive {
        o.watch(now);
    }
}

impl Outage {
    /// An outage not yet begun, watched by the monitors.
    pub fn new() -> Outage {
        let o = Arc::new(Mutex::new(None));
        OUTAGES.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&o));
        Outage(o)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Down>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The outside is down: `what` says what ("kafka: all brokers down (source clicks)").
    /// The start is kept while it stays down; the text is the latest.
    pub fn down(&self, what: impl Into<String>) {
        self.went_down(what.into(), None);
    }

    /// [`Outage::down`], and it ends (if nothing ends it before) once `addr` accepts a TCP
    /// connection.
    pub fn down_at(&self, what: impl Into<String>, addr: SocketAddr) {
        self.went_down(what.into(), Some(addr));
    }

    fn went_down(&self, what: String, addr: Option<SocketAddr>) {
        let mut down = self.lock();
        match down.as_mut() {
            Some(d) => {
                d.note.what = what;
                if let Some(addr) = addr {
                    d.probe = Some((addr, d.probe.and_then(|p| p.1)));
                }
            }
            None => {
                let note = Note { since: Instant::now(), what, logged: None };
                *down = Some(Down { note, probe: addr.map(|a| (a, None)) });
            }
        }
    }

    /// The outside is back (nothing if it was not down).
    pub fn up(&self) {
        let Some(d) = self.lock().take() else { return };
        if d.note.logged.is_some() {
            let lasted = d.note.since.elapsed().as_secs_f64();
            tracing::warn!(event = "outage_over", lasted_s = lasted, "back after {lasted:.1} s: {}", d.note.what);
        }
    }

    /// Since when and on what (None: not down).
    pub fn current(&self) -> Option<(Instant, String)> {
        self.lock().as_ref().map(|d| (d.note.since, d.note.what.clone()))
    }

    /// Log the outage if it is due, and try its address if it has one and a try is due (see
    /// the type's docs); the watcher's call.
    pub fn watch(&self, now: Instant) {
        let probe = {
            let mut down = self.lock();
            let Some(d) = down.as_mut() else { return };
            let n = &mut d.note;
            let lasted = now.saturating_duration_since(n.since);
            let due = match n.logged {
                None => lasted >= LOG_AFTER,
                Some(at) => now.saturating_duration_since(at) >= LOG_EVERY,
            };
            if due {
                n.logged = Some(now);
                let lasted = lasted.as_secs_f64();
                tracing::warn!(event = "outage", lasted_s = lasted, "down for {lasted:.1} s: {}", n.what);
            }
            match &mut d.probe {
                Some((addr, tried)) if tried.is_none_or(|t| now.saturating_duration_since(t) >= PROBE_EVERY) => {
                    *tried = Some(now);
                    Some((*addr, n.since))
                }
                _ => None,
            }
        };
        // The try without the lock: the reporter's thread (librdkafka's) never waits on it.
        if let Some((addr, since)) = probe
            && std::net::TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok()
        {
            let mut down = self.lock();
            // Still the same outage: it is over.
            if down.as_ref().is_some_and(|d| d.note.since == since) {
                let d = down.take().expect("looked at above");
                drop(down);
                if d.note.logged.is_some() {
                    let lasted = d.note.since.elapsed().as_secs_f64();
                    tracing::warn!(
                        event = "outage_over",
                        lasted_s = lasted,
                        "back after {lasted:.1} s ({addr} accepts connections again): {}",
                        d.note.what
                    );
                }
            }
        }
    }
}

/// The file beside a job's counters file that says what its subtasks wait on now, for the
/// tools that read the job from outside (`weir-stat`, `weir top`, `weir-stat --serve`): one
/// line per wait, `subtask<TAB>since (Unix ms)<TAB>what`. The monitor rewrites it (write,
/// rename) when it changes; no file or an empty one: nothing waits.
pub const WAITS_FILE: &str = "waiting";

/// One wait as the waits file holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// The subtask, or `outage` for an [`Outage`].
    pub subtask: String,
    /// Since when, wall clock (Unix) ms.
    pub since_ms: u64,
    /// On what.
    pub what: String,
}

impl Wait {
    /// `sink#0 waiting 12.3 s: <what>` at `now_ms`.
    pub fn describe(&self, now_ms: u64) -> String {
        let s = now_ms.saturating_sub(self.since_ms) as f64 / 1e3;
        format!("{} waiting {s:.1} s: {}", self.subtask, self.what)
    }
}

/// The waits file of the job whose counters file is `counters`.
pub fn waits_path(counters: &Path) -> PathBuf {
    counters.with_file_name(WAITS_FILE)
}

/// The waits the file beside `counters` lists (none when there is no such file).
pub fn read_waits(counters: &Path) -> Vec<Wait> {
    let Ok(text) = std::fs::read_to_string(waits_path(counters)) else { return Vec::new() };
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '\t');
            Some(Wait { subtask: f.next()?.to_owned(), since_ms: f.next()?.parse().ok()?, what: f.next()?.to_owned() })
        })
        .collect()
}

/// The waits now, of `notes` and of the process's outages, as the waits file holds them.
pub(crate) fn waits_now(notes: &[&Waiting]) -> Vec<Wait> {
    let now = Instant::now();
    let now_ms = super::counters::unix_ms_now();
    let as_ms = |since: Instant| now_ms.saturating_sub(now.saturating_duration_since(since).as_millis() as u64);
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    let mut out: Vec<Wait> = notes
        .iter()
        .filter_map(|n| {
            let (since, what) = n.current()?;
            Some(Wait { subtask: n.subtask.clone(), since_ms: as_ms(since), what: clean(&what) })
        })
        .collect();
    let all = OUTAGES.lock().unwrap_or_else(|p| p.into_inner());
    for o in all.iter().filter_map(std::sync::Weak::upgrade) {
        if let Some((since, what)) = Outage(o).current() {
            out.push(Wait { subtask: "outage".into(), since_ms: as_ms(since), what: clean(&what) });
        }
    }
    out
}

/// Write `waits` as the waits file at `path` (write beside, rename: a reader sees the old or
/// the new, whole).
pub(crate) fn write_waits(path: &Path, waits: &[Wait]) -> std::io::Result<()> {
    let text: String = waits.iter().map(|w| format!("{}\t{}\t{}\n", w.subtask, w.since_ms, w.what)).collect();
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A note keeps its start and takes the latest text; while it is up the subtask's time
    /// counts as waiting; outside a subtask thread nothing happens.
    #[test]
    fn a_note_keeps_its_start_and_takes_the_latest_text() {
        let time = Arc::new(TimeAccount::default());
        let note = Arc::new(Waiting::new("s#0".into(), time.clone()));
        waiting_on(|| "ignored: no note installed".into());
        assert!(note.describe().is_none());
        install(note.clone());
        waiting_on(|| "first".into());
        let since = note.current().unwrap().0;
        waiting_on(|| "second".into());
        let (again, what) = note.current().unwrap();
        assert_eq!((again, what.as_str()), (since, "second"));
        assert!(note.describe().unwrap().ends_with("s: second"));
        assert_eq!(time.read().1, crate::telemetry::time::Spent::Waiting);
        waiting_over();
        assert!(note.describe().is_none());
        assert_eq!(time.read().1, crate::telemetry::time::Spent::Busy);
        CURRENT.with(|c| c.borrow_mut().take());
    }

    /// The waits file says what waits, since when, and reads back.
    #[test]
    fn the_waits_file_reads_back() {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("weir-waits-{}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let counters = dir.join("counters");
        assert!(read_waits(&counters).is_empty(), "no file: nothing waits");
        let note = Waiting::new("api#0".into(), Arc::default());
        note.on(|| "http sink api:\t4 batches".into());
        let waits = waits_now(&[&note]);
        let mine: Vec<&Wait> = waits.iter().filter(|w| w.subtask == "api#0").collect();
        assert_eq!(mine.len(), 1);
        write_waits(&waits_path(&counters), &waits).unwrap();
        let back = read_waits(&counters);
        assert!(back.contains(mine[0]), "{back:?}");
        assert_eq!(mine[0].what, "http sink api: 4 batches");
        assert!(mine[0].describe(mine[0].since_ms + 12_300).starts_with("api#0 waiting 12.3 s: http sink api"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A long wait is due for the log after LOG_AFTER, then every LOG_EVERY; an outage the
    /// same.
    #[test]
    fn long_waits_are_logged_while_they_last() {
        let note = Waiting::new("s#0".into(), Arc::default());
        note.on(|| "api".into());
        let since = note.current().unwrap().0;
        note.log_if_long(since + LOG_AFTER / 2);
        assert!(note.lock().as_ref().unwrap().logged.is_none());
        note.log_if_long(since + LOG_AFTER);
        assert_eq!(note.lock().as_ref().unwrap().logged, Some(since + LOG_AFTER));
        note.log_if_long(since + LOG_AFTER + LOG_EVERY / 2);
        assert_eq!(note.lock().as_ref().unwrap().logged, Some(since + LOG_AFTER), "not again so soon");
        note.over();
        assert!(note.current().is_none());

        let outage = Outage::default();
        outage.watch(Instant::now());
        outage.down("kafka: all brokers down");
        let since = outage.current().unwrap().0;
        outage.watch(since + LOG_AFTER);
        assert!(outage.lock().as_ref().unwrap().note.logged.is_some());
        outage.down("kafka: all brokers down (still)");
        assert_eq!(outage.current().unwrap(), (since, "kafka: all brokers down (still)".to_owned()));
        outage.up();
        assert!(outage.current().is_none());
    }

    /// An outage that names an address ends once the address accepts a connection, tried by
    /// the watcher at most every PROBE_EVERY; not before.
    #[test]
    fn an_outage_ends_when_its_address_answers() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let outage = Outage::default();
        outage.down_at("kafka source: broker 127.0.0.1 down", addr);
        let since = outage.current().unwrap().0;
        outage.watch(since);
        assert!(outage.current().is_some(), "nothing listens: still down");
        let Ok(listener) = std::net::TcpListener::bind(addr) else { return };
        outage.watch(since + PROBE_EVERY / 2);
        assert!(outage.current().is_some(), "not tried again before PROBE_EVERY");
        outage.watch(since + PROBE_EVERY);
        assert!(outage.current().is_none(), "the address answers: over");
        drop(listener);
    }
}
