//! How operators and connectors fail: a typed error behind [`Halt::Failed`](super::Halt).
//!
//! Every failure on the record path is an error type of its own crate-visible kind — the
//! engine's [`OperatorError`], each connector's (`FileSinkError`, `HttpSinkError`,
//! `KafkaSinkError`, ...) — carried in a [`Failure`]: a cheap-to-clone handle that keeps the
//! typed error (a program embedding weir can [`downcast_ref`](Failure::downcast_ref) it and
//! match on the cause), its `source()` chain, and whether the failure is worth retrying.
//!
//! Three kinds of failure stay apart: *would block* is a value (`Claim::NoCredit`), an
//! *operating error* is a `Failure` (it says what failed and the likely cause), a
//! *programmer error* is a panic.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// An error that can end an operator's work: a typed error that says whether retrying the
/// same operation could succeed (a timeout, a refused connection) or not (a bad record, a
/// full disk, a fenced producer).
pub trait OperatorFailure: Error + Send + Sync + 'static {
    /// Whether the same operation, retried later, may succeed. Default: no.
    fn is_retryable(&self) -> bool {
        false
    }
}

/// A typed operator or connector error, shared (cloning is a reference count).
#[derive(Clone)]
pub struct Failure {
    error: Arc<dyn Error + Send + Sync + 'static>,
    retryable: bool,
}

/// The message a panic carried (a `String` or a `&str` payload), if any.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> Option<String> {
    panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
}

impl Failure {
    /// Wrap a typed error.
    pub fn new<E: OperatorFailure>(error: E) -> Failure {
        let retryable = error.is_retryable();
        Failure { error: Arc::new(error), retryable }
    }

    /// A failure described only by text (user operators that have no error type of their own).
    pub fn msg(text: impl Into<String>) -> Failure {
        Failure::new(OperatorError::Other(text.into()))
    }

    /// Whether retrying the failed operation may succeed.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The typed error, if it is an `E`.
    pub fn downcast_ref<E: Error + 'static>(&self) -> Option<&E> {
        self.error.downcast_ref::<E>()
    }

    /// The error itself.
    pub fn error(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.error
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.error, f)
    }
}

impl Error for Failure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error.source()
    }
}

/// Two failures are equal when they say the same (a poisoned sink repeats its first error).
impl PartialEq for Failure {
    fn eq(&self, other: &Failure) -> bool {
        Arc::ptr_eq(&self.error, &other.error) || self.to_string() == other.to_string()
    }
}

impl Eq for Failure {}

impl<E: OperatorFailure> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(e)
    }
}

/// The engine's own failures on the record path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// A record in an input ring is not of the node's input type.
    #[error("node {node}: input record: {source}")]
    Decode {
        /// The node.
        node: String,
        /// What the decoder said.
        #[source]
        source: crate::record::CodecError,
    },
    /// An operator could not get its state back from the checkpoint being restored.
    #[error("node {node}: cannot restore its checkpoint: {source}")]
    Restore {
        /// The node.
        node: String,
        /// What was wrong with the checkpoint's file.
        #[source]
        source: crate::checkpoint::CheckpointError,
    },
    /// An output ring refused a claim (poisoned, closed by its receiver, record too large).
    #[error("output {channel}: {source}")]
    Output {
        /// The channel (`sender#i->receiver#j`).
        channel: String,
        /// The ring's error.
        #[source]
        source: weir_ring::ClaimError,
    },
    /// An input ring failed (poisoned by a bad peer, or a record header out of range).
    #[error("input {channel}: {source}")]
    Input {
        /// The channel.
        channel: String,
        /// The ring's error.
        #[source]
        source: weir_ring::RingError,
    },
    /// A barrier came out of order on an input channel (a bug upstream, or a bad peer).
    #[error("input {channel}: barrier {id} after barrier {current}: barriers out of order")]
    BarrierOrder {
        /// The channel.
        channel: String,
        /// The barrier that came.
        id: u64,
        /// The barrier being aligned.
        current: u64,
    },
    /// A watermark or barrier record whose payload is not the 8 bytes it must be.
    #[error("input {channel}: a {kind} record that is not 8 bytes")]
    BadControlRecord {
        /// The channel.
        channel: String,
        /// `watermark` or `barrier`.
        kind: &'static str,
    },
    /// A keyed operator panicked while it processed a record of `key_group`, or in a timer
    /// callback (`on_watermark` or `on_processing_time`, at the watermark or the wall-clock
    /// time given it; `key_group` unknown): the subtask fails, the job with it,
    /// and a restart resumes from the last checkpoint (nothing after it was committed).
    #[error("node {node}: panicked {}: {message}", match key_group {
        Some(kg) => format!("processing a record of key group {kg}"),
        None => format!("in a timer callback (at {watermark})"),
    })]
    KeyedPanicked {
        /// The node.
        node: String,
        /// The key group of the record being processed (`None`: in a timer callback).
        key_group: Option<u32>,
        /// The watermark, or the wall-clock time, a timer callback was given (0 for a record).
        watermark: u64,
        /// The panic's message.
        message: String,
    },
    /// An operator panicked (a bug in it, or in weir): the subtask's thread ended.
    #[error("panicked: {message}")]
    Panicked {
        /// The panic's message.
        message: String,
    },
    /// Any other failure, in words (user operators without an error type of their own).
    #[error("{0}")]
    Other(String),
}

impl OperatorFailure for OperatorError {}

/// A keyed state read or write that failed fails the operator with the state's own words.
impl OperatorFailure for crate::state::StateError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connect 127.0.0.1:1")]
    struct Refused(#[source] std::io::Error);

    impl OperatorFailure for Refused {
        fn is_retryable(&self) -> bool {
            true
        }
    }

    /// A failure keeps its type (a program can match on it), its source chain and whether it
    /// is retryable.
    #[test]
    fn typed_with_its_cause() {
        let f = Failure::new(Refused(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        assert!(f.is_retryable());
        assert!(f.downcast_ref::<Refused>().is_some());
        assert!(f.downcast_ref::<OperatorError>().is_none());
        assert_eq!(f.to_string(), "connect 127.0.0.1:1");
        assert!(f.source().is_some_and(|s| s.to_string().contains("refused")));
        let g = Failure::msg("bad");
        assert!(!g.is_retryable());
        assert_eq!(g, Failure::msg("bad"));
        assert_ne!(g, f);
    }
}
