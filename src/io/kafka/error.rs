//! How the Kafka connectors fail: one typed error, naming the node and the topic, that says
//! whether the cluster was unreachable (worth retrying later) or something else failed.

use crate::operators::OperatorFailure;

/// Which side of the connector failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaRole {
    /// A Kafka source.
    Source,
    /// A Kafka sink.
    Sink,
}

impl std::fmt::Display for KafkaRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KafkaRole::Source => "source",
            KafkaRole::Sink => "sink",
        })
    }
}

/// What kind of failure (`weir run` exits 69 for the first two, 78 for `Config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaErrorKind {
    /// The cluster did not answer (its metadata did not come): a dependency is unavailable.
    Unavailable,
    /// The cluster answered but the connection was refused: SASL authentication failed, the
    /// broker's TLS certificate is not trusted or names another host, or the port speaks
    /// another security protocol. Retrying does not mend it; the reason names the setting.
    Refused,
    /// librdkafka refused a setting (an unknown property or mechanism, a bad value, a CA file
    /// that does not load): nothing was tried.
    Config,
    /// Anything else: a client or transaction error, a bad checkpoint.
    Failed,
}

/// Why a Kafka source or sink failed.
#[derive(Debug, thiserror::Error)]
#[error("kafka {role} {node} (topic {topic}): {reason}")]
pub struct KafkaConnectorError {
    /// Source or sink.
    pub role: KafkaRole,
    /// The subtask (`node#index`).
    pub node: String,
    /// The topic.
    pub topic: String,
    /// Unavailable or failed.
    pub kind: KafkaErrorKind,
    /// What happened, and what to do.
    pub reason: String,
}

impl KafkaConnectorError {
    /// The `role`'s subtask `node`, on `topic`, failed with `problem`.
    pub(crate) fn new(role: KafkaRole, node: &str, topic: &str, problem: impl Into<Problem>) -> KafkaConnectorError {
        let Problem { kind, reason } = problem.into();
        KafkaConnectorError { role, node: node.to_owned(), topic: topic.to_owned(), kind, reason }
    }
}

impl OperatorFailure for KafkaConnectorError {
    fn is_retryable(&self) -> bool {
        self.kind == KafkaErrorKind::Unavailable
    }
}

/// A failure inside the connector, before it is given the node's and topic's names.
#[derive(Debug)]
pub(crate) struct Problem {
    pub kind: KafkaErrorKind,
    pub reason: String,
}

impl Problem {
    /// The cluster did not answer.
    pub(crate) fn unavailable(reason: String) -> Problem {
        Problem { kind: KafkaErrorKind::Unavailable, reason }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl From<String> for Problem {
    fn from(reason: String) -> Problem {
        Problem { kind: KafkaErrorKind::Failed, reason }
    }
}

impl From<&str> for Problem {
    fn from(reason: &str) -> Problem {
        Problem::from(reason.to_owned())
    }
}
