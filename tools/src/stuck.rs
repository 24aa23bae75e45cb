//! A sink that stops answering, for tests of a stuck job (what `weir-stat`, `weir top` and
//! the Prometheus exporter show; a source's lag while it is paused). Its gate opens when
//! dropped, so a failing test never leaves the job's threads waiting for ever (dropping a
//! running job joins them): keep the gate in a variable declared after the job.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir::operators::{Halt, Sink};

/// Holds every [`StuckSink`] made from it until released or dropped.
#[derive(Debug, Default)]
pub struct Gate(Arc<AtomicBool>);

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate::default()
    }

    /// A sink whose every write waits for this gate (any record type).
    pub fn sink(&self) -> StuckSink {
        StuckSink(self.0.clone())
    }

    /// Let the sinks go on.
    pub fn release(&self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.release();
    }
}

/// See [`Gate`].
#[derive(Debug, Clone)]
pub struct StuckSink(Arc<AtomicBool>);

impl<T> Sink<T> for StuckSink {
    fn write(&mut self, _record: &T) -> Result<(), Halt> {
        while !self.0.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}
