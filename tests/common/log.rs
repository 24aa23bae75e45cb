//! weir's log, captured for a test to wait on (and still written to stderr).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The log, captured: install with `tracing_subscriber::fmt().with_writer(log.clone())`.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        std::io::stderr().write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Wait (a watchdog of `limit`) for a line with every one of `words`: the line, and when
    /// it was seen.
    pub fn wait_for(&self, words: &[&str], limit: Duration) -> (String, Instant) {
        let deadline = Instant::now() + limit;
        loop {
            let text = self.text();
            if let Some(line) = text.lines().find(|l| words.iter().all(|w| l.contains(w))) {
                return (line.to_owned(), Instant::now());
            }
            assert!(Instant::now() < deadline, "watchdog: no log line with {words:?} in {limit:?}:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
