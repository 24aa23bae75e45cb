//! A sink's poisoned state, shared by every sink here: the first failure is kept and every
//! later call returns it. A sink that failed (an fsync error, a refused batch past its
//! retries) does not try again blindly; recovery restarts the job from its last checkpoint.

use crate::operators::{Failure, Halt};

/// Healthy, or poisoned by its first failure.
#[derive(Debug, Default)]
pub(crate) struct Poisoned {
    /// The first failure, and its text (what `setup_error` shows).
    first: Option<(Failure, String)>,
}

impl Poisoned {
    /// `Ok` while healthy; the first failure, again, once poisoned.
    #[inline]
    pub(crate) fn check(&self) -> Result<(), Halt> {
        match &self.first {
            None => Ok(()),
            Some((f, _)) => Err(Halt::Failed(f.clone())),
        }
    }

    /// Poison with `failure` unless already poisoned (a later failure is a symptom of the
    /// first); the first failure, as a halt.
    pub(crate) fn poison(&mut self, failure: impl Into<Failure>) -> Halt {
        let (f, _) = self.first.get_or_insert_with(|| {
            let f = failure.into();
            let text = f.to_string();
            (f, text)
        });
        Halt::Failed(f.clone())
    }

    /// The first failure's text, if poisoned.
    pub(crate) fn text(&self) -> Option<&str> {
        self.first.as_ref().map(|(_, t)| t.as_str())
    }

    /// Whether a failure poisoned it.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.first.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first failure wins and is repeated; a healthy state passes.
    #[test]
    fn first_failure_wins() {
        let mut p = Poisoned::default();
        assert_eq!(p.check(), Ok(()));
        let first = p.poison(Failure::msg("disk full"));
        let later = p.poison(Failure::msg("write after close"));
        assert_eq!(first, later);
        assert_eq!(p.check(), Err(first));
        assert_eq!(p.text(), Some("disk full"));
        assert!(p.is_poisoned());
    }
}
