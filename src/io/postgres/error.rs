//! How the PostgreSQL sink fails: one typed error naming the sink subtask, the server and,
//! where a setting is at fault, the setting; its kind says which exit code `weir run` gives.

use crate::operators::OperatorFailure;

/// What kind of failure (`weir run` exits 69 for `Unavailable` and `Refused`, 78 for
/// `Config`, 1 otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostgresErrorKind {
    /// The server could not be reached, or kept failing, for longer than `retry_for_ms`.
    Unavailable,
    /// The server answered and refused us: authentication, its TLS certificate, a missing
    /// privilege. Retrying does not mend it.
    Refused,
    /// A setting does not fit the server or the records: a table or column that does not
    /// exist, a type a field cannot be written as, two-phase commit switched off.
    Config,
    /// The server rejected a row and `on_bad_record = "fail"` (or no dead-letter file).
    BadRecord,
    /// Anything else: a checkpoint this sink cannot read, io_uring, a dead-letter file.
    Failed,
}

/// Why a PostgreSQL sink failed.
#[derive(Debug, thiserror::Error)]
#[error("postgres sink {sink} ({server}): {reason}{}", setting.as_ref().map(|s| format!(" (setting `{s}`)")).unwrap_or_default())]
pub struct PostgresSinkError {
    /// The sink subtask (`node#index`).
    pub sink: String,
    /// `host:port/dbname`.
    pub server: String,
    /// Which kind of failure.
    pub kind: PostgresErrorKind,
    /// The job-file setting at fault, if one is (`table`, `columns.user`, `connection`, ...).
    pub setting: Option<String>,
    /// What happened, and what to do.
    pub reason: String,
}

impl OperatorFailure for PostgresSinkError {
    fn is_retryable(&self) -> bool {
        self.kind == PostgresErrorKind::Unavailable
    }
}

/// A failure before it is given the sink's and the server's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub kind: PostgresErrorKind,
    pub setting: Option<String>,
    pub reason: String,
}

impl Problem {
    /// A setting that does not fit.
    pub(crate) fn config(setting: impl Into<String>, reason: impl Into<String>) -> Problem {
        Problem { kind: PostgresErrorKind::Config, setting: Some(setting.into()), reason: reason.into() }
    }

    /// The server refused us; `setting` is what to change.
    pub(crate) fn refused(setting: impl Into<String>, reason: impl Into<String>) -> Problem {
        Problem { kind: PostgresErrorKind::Refused, setting: Some(setting.into()), reason: reason.into() }
    }

    /// The server is not there (yet): worth another try.
    pub(crate) fn unavailable(reason: impl Into<String>) -> Problem {
        Problem { kind: PostgresErrorKind::Unavailable, setting: None, reason: reason.into() }
    }

    /// Anything else.
    pub(crate) fn failed(reason: impl Into<String>) -> Problem {
        Problem { kind: PostgresErrorKind::Failed, setting: None, reason: reason.into() }
    }

    /// Whether another attempt may succeed.
    pub(crate) fn is_retryable(&self) -> bool {
        self.kind == PostgresErrorKind::Unavailable
    }
}

/// An error the server sent (an ErrorResponse), with the fields weir uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DbError {
    /// ERROR, FATAL, PANIC.
    pub severity: String,
    /// The SQLSTATE (`23505`, ...).
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
    /// Where it happened (`COPY clicks, line 3, column user_id: "..."`).
    pub context: Option<String>,
    pub column: Option<String>,
    pub constraint: Option<String>,
}

impl DbError {
    /// `message (SQLSTATE code): detail; hint`.
    pub(crate) fn text(&self) -> String {
        let mut s = format!("{} (SQLSTATE {})", self.message, self.code);
        if let Some(d) = &self.detail {
            s.push_str(": ");
            s.push_str(d);
        }
        if let Some(h) = &self.hint {
            s.push_str("; hint: ");
            s.push_str(h);
        }
        s
    }

    /// The row of a COPY the error is about (1-based), from its context
    /// (`COPY t, line 3, column a: ...`).
    pub(crate) fn copy_line(&self) -> Option<usize> {
        let context = self.context.as_deref()?;
        let at = context.find("COPY ")?;
        let rest = &context[at..];
        let line = rest.find(", line ")? + ", line ".len();
        let digits: String = rest[line..].chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    }

    /// How a batch that got this error goes on.
    pub(crate) fn class(&self) -> ErrorClass {
        let class = self.code.get(..2).unwrap_or("");
        match (class, self.code.as_str()) {
            // Data exceptions, integrity constraints: the row is at fault.
            ("22" | "23", _) => ErrorClass::BadRow,
            // Serialization failure, deadlock, lock timeout, statement timeout (query
            // canceled), out of resources, operator intervention (the server shutting down),
            // connection trouble, system errors: another attempt may succeed.
            ("40" | "53" | "57" | "08" | "58" | "XX", _) | (_, "55P03" | "55006") => ErrorClass::Retry,
            // Privileges.
            (_, "42501") => ErrorClass::Refused,
            // Undefined table or column, a wrong ON CONFLICT target, a type mismatch in the
            // statement, two-phase commit switched off: the settings.
            ("42" | "0A" | "55", _) => ErrorClass::Config,
            _ => ErrorClass::Fail,
        }
    }
}

/// What an error means for the batch that got it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// A row is at fault: dead-letter it, send the rest again.
    BadRow,
    /// Passing: send the batch again after a backoff.
    Retry,
    /// A privilege is missing.
    Refused,
    /// The settings do not fit the server.
    Config,
    /// Anything else: the job fails with the server's message.
    Fail,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row number comes out of a COPY error's context; errors sort into classes.
    #[test]
    fn copy_line_and_classes() {
        let e = DbError {
            code: "23502".into(),
            context: Some("COPY clicks, line 17, column user_id: null input".into()),
            ..DbError::default()
        };
        assert_eq!(e.copy_line(), Some(17));
        assert_eq!(e.class(), ErrorClass::BadRow);
        let e = DbError { code: "22003".into(), context: Some("COPY clicks, line 3".into()), ..DbError::default() };
        assert_eq!(e.copy_line(), Some(3));
        assert_eq!(DbError { code: "42P01".into(), ..DbError::default() }.class(), ErrorClass::Config);
        assert_eq!(DbError { code: "42501".into(), ..DbError::default() }.class(), ErrorClass::Refused);
        assert_eq!(DbError { code: "57P01".into(), ..DbError::default() }.class(), ErrorClass::Retry);
        assert_eq!(DbError { code: "55P03".into(), ..DbError::default() }.class(), ErrorClass::Retry);
        assert_eq!(DbError { code: "55000".into(), ..DbError::default() }.class(), ErrorClass::Config);
        assert_eq!(DbError::default().copy_line(), None);
    }
}
