//! Reaching the cluster, and saying why not: librdkafka reports TLS, SASL and transport
//! failures through its error callback and then retries for ever, while a metadata request
//! only times out. [`Connection`] keeps what the callback said; [`reach`] asks for the
//! topic's metadata in short slices and stops at the first failure that retrying cannot mend
//! (the broker refused our credentials, did not prove who it is, or speaks another protocol on
//! that port), naming the cause and the setting to change. An unreachable cluster still fails
//! after the whole timeout, as unavailable.
//!
//! Secrets never reach a message: librdkafka's own texts name mechanisms and hosts, not
//! passwords, and settings are named by key (see [`client_error_text`], [`is_secret`]).

use super::error::{KafkaErrorKind, Problem};
use crate::io::tls::Refusal;
use rdkafka::ClientContext;
use rdkafka::client::Client;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::metadata::Metadata;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why the client could not talk to the brokers, as far as its error callback told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cause {
    /// SASL: the broker refused the credentials.
    Authentication(String),
    /// SASL: the broker does not offer the configured mechanism.
    Mechanism(String),
    /// TLS: the broker's certificate does not chain to a trusted CA.
    Untrusted(String),
    /// TLS: the certificate is valid but does not name the host connected to.
    HostnameMismatch(String),
    /// TLS: the certificate has expired (or is not yet valid).
    Expired(String),
    /// TLS spoken to a port that answers in plaintext.
    TlsToPlaintext(String),
    /// Plaintext spoken to a TLS (or SASL) port: the broker hung up at the first request.
    PlaintextToTls(String),
    /// Any other TLS failure.
    Tls(String),
}

impl Cause {
    /// Classify one error of the client's error callback (or a broker failure from its log);
    /// `None` for errors that say nothing about security (a broker down, a name that does not
    /// resolve, a connection closed without a hint).
    fn of(code: Option<RDKafkaErrorCode>, text: &str) -> Option<Cause> {
        let lower = text.to_ascii_lowercase();
        let t = text.to_owned();
        let sasl = matches!(code, Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed))
            || lower.contains("sasl authentication error");
        if code == Some(RDKafkaErrorCode::UnsupportedSASLMechanism)
            || (sasl && lower.contains("mechanism") && (lower.contains("not enabled") || lower.contains("unsupported")))
        {
            return Some(Cause::Mechanism(t));
        }
        if sasl {
            return Some(Cause::Authentication(t));
        }
        if code == Some(RDKafkaErrorCode::SSL) || lower.contains("ssl handshake failed") {
            let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
            return Some(if has(&["plaintext broker listener", "wrong version number", "packet length too long"]) {
                // A plaintext broker hangs up on a ClientHello (or answers garbage).
                Cause::TlsToPlaintext(t)
            } else if has(&["hostname mismatch", "ip address mismatch"]) {
                Cause::HostnameMismatch(t)
            } else if has(&["certificate has expired", "not yet valid"]) {
                Cause::Expired(t)
            } else if has(&["certificate verify failed"]) {
                Cause::Untrusted(t)
            } else {
                Cause::Tls(t)
            });
        }
        if lower.contains("incorrect security.protocol") || lower.contains("connecting to a ssl listener") {
            return Some(Cause::PlaintextToTls(t));
        }
        None
    }

    /// The error, with what to do.
    pub(crate) fn problem(&self, bootstrap: &str) -> Problem {
        let reason = match self {
            Cause::Authentication(t) => format!(
                "SASL authentication failed: {t}; check sasl.mechanism, sasl.username and sasl.password \
                 (the broker refused them)"
            ),
            Cause::Mechanism(t) => format!(
                "the broker does not offer this SASL mechanism: {t}; set sasl.mechanism to one its listener \
                 enables (sasl.enabled.mechanisms on the broker)"
            ),
            Cause::Untrusted(t) => format!(
                "the broker's TLS certificate is not trusted: {t}; set ssl.ca.location to the CA certificate \
                 (PEM) that signed it"
            ),
            Cause::HostnameMismatch(t) => format!(
                "the broker's TLS certificate does not name the host connected to: {t}; connect by a name or \
                 address the certificate lists (bootstrap.servers {bootstrap}, and the broker's advertised \
                 listeners)"
            ),
            Cause::Expired(t) => {
                format!("the broker's TLS certificate has expired or is not yet valid: {t}; the broker needs a new one")
            }
            Cause::TlsToPlaintext(t) => format!(
                "TLS handshake with a port that does not speak TLS: {t}; is {bootstrap} a PLAINTEXT listener? \
                 set security.protocol (PLAINTEXT or SASL_PLAINTEXT) or the port to match the listener"
            ),
            Cause::PlaintextToTls(t) => format!(
                "plaintext spoken to a port that expects TLS: {t}; set security.protocol (SSL or SASL_SSL) to \
                 match the listener at {bootstrap}"
            ),
            Cause::Tls(t) => format!("TLS failed: {t}; check the ssl.* settings"),
        };
        Problem { kind: KafkaErrorKind::Refused, reason }
    }
}

/// What a client's error callback said, shared between the callback (librdkafka's threads)
/// and the subtask.
#[derive(Debug, Clone, Default)]
pub(crate) struct Connection {
    inner: Arc<Mutex<Seen>>,
}

#[derive(Debug, Default)]
struct Seen {
    /// The first security failure since the client last delivered.
    cause: Option<Cause>,
    /// The last error of any kind.
    last: Option<String>,
    /// Values of the client's secret properties: replaced in every text kept (librdkafka
    /// quotes some settings back in its messages, e.g. a bad `sasl.oauthbearer.config`).
    secrets: Vec<String>,
}

impl Connection {
    /// Hide the values of `properties`' secrets in every text this keeps or redacts.
    pub(crate) fn hide_secrets(&self, properties: &BTreeMap<String, String>) {
        let secrets = properties.iter().filter(|(k, v)| is_secret(k) && v.len() >= 3).map(|(_, v)| v.clone());
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).secrets = secrets.collect();
    }

    /// `text` with the client's secret values replaced.
    pub(crate) fn redact(&self, text: &str) -> String {
        redact(&self.inner.lock().unwrap_or_else(|e| e.into_inner()).secrets, text)
    }

    /// The client delivered: whatever failed before is over.
    pub(crate) fn clear(&self) {
        let mut seen = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        seen.cause = None;
        seen.last = None;
    }

    /// Take the security failure seen so far, if any (a later one may then be recorded).
    fn take_cause(&self) -> Option<Cause> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).cause.take()
    }

    /// One error from the client's error callback.
    pub(crate) fn record(&self, error: &KafkaError, reason: &str) {
        let text = if reason.is_empty() { super::kafka_error_text(error) } else { reason.to_owned() };
        let mut seen = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let text = redact(&seen.secrets, &text);
        let cause = Cause::of(error.rdkafka_error_code(), &text);
        if seen.cause.is_none() {
            seen.cause = cause;
        }
        seen.last = Some(text);
    }

    /// One line of the client's log: broker failures (facility `FAIL`) come there first, the
    /// error callback repeats them later (if at all, for some transport errors).
    pub(crate) fn record_log(&self, facility: &str, message: &str) {
        if facility != "FAIL" {
            return;
        }
        // `[thrd:sasl_ssl://host:port/bootstrap]: sasl_ssl://host:port/bootstrap: ...`
        let message = match message.strip_prefix("[thrd:") {
            Some(rest) => rest.split_once("]: ").map_or(message, |(_, m)| m),
            None => message,
        };
        let mut seen = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let message = redact(&seen.secrets, message);
        let Some(cause) = Cause::of(None, &message) else { return };
        seen.cause.get_or_insert(cause);
        seen.last = Some(message);
    }

    /// The security failure seen so far, if any.
    pub(crate) fn cause(&self) -> Option<Cause> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).cause.clone()
    }

    fn last(&self) -> Option<String> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).last.clone()
    }
}

/// The topic's metadata, asked for in slices of at most 500 ms until it comes, the client
/// reports a failure that retrying cannot mend (then at once), or `timeout` passes (then as
/// unavailable, with the client's last error). `serve` polls the client's queue between
/// slices, so that its errors reach the error callback (rdkafka delivers them on a poll).
pub(crate) fn reach<C: ClientContext>(
    client: &Client<C>,
    serve: &dyn Fn(),
    topic: &str,
    timeout: Duration,
    connection: &Connection,
    properties: &BTreeMap<String, String>,
) -> Result<Metadata, Problem> {
    let bootstrap = properties.get("bootstrap.servers").map_or("?", String::as_str);
    let started = Instant::now();
    let deadline = started + timeout;
    let plaintext = properties
        .get("security.protocol")
        .is_none_or(|p| p.eq_ignore_ascii_case("plaintext") || p.eq_ignore_ascii_case("sasl_plaintext"));
    let mut probed = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let slice = left.min(Duration::from_millis(500)).max(Duration::from_millis(1));
        let failed = match client.fetch_metadata(Some(topic), slice) {
            Ok(m) => return Ok(m),
            Err(e) => e,
        };
        serve();
        if let Some(cause) = connection.take_cause().and_then(|c| refine(c, properties)) {
            return Err(cause.problem(bootstrap));
        }
        // A plaintext request to a TLS port gets no answer from Kafka (its TLS listener waits
        // for a record that never comes): after 2 s of silence, see whether the port speaks TLS.
        if plaintext && !probed && started.elapsed() >= Duration::from_secs(2) {
            probed = true;
            if let Some(addr) = bootstrap
                .split(',')
                .map(str::trim)
                .take(3)
                .find(|a| crate::io::tls::speaks_tls(a, Duration::from_secs(1)))
            {
                let text = format!("{addr} answers a TLS handshake, and the client spoke plaintext to it");
                return Err(Cause::PlaintextToTls(text).problem(bootstrap));
            }
        }
        if Instant::now() >= deadline {
            let last = connection.last().map(|l| format!("; the client's last error: {l}")).unwrap_or_default();
            return Err(Problem::unavailable(format!(
                "cannot read the topic's metadata within {}: {}{last} (is Kafka running and reachable at {bootstrap}?)",
                crate::util::duration_text(timeout),
                super::kafka_error_text(&failed),
            )));
        }
    }
}

/// A cause checked by a handshake of our own where librdkafka's words are only a hint: a
/// disconnect while starting TLS or asking the API version happens to healthy brokers too
/// (a restart, a connection quota), so "TLS to a plaintext port" and the reverse are taken
/// only when the port really does not (or does) speak TLS; `None`: not confirmed, keep
/// waiting. And librdkafka (OpenSSL) says only "certificate verify failed": the same
/// handshake, trusting the same CA file, tells an untrusted issuer from another host's
/// certificate or an expired one.
fn refine(cause: Cause, properties: &BTreeMap<String, String>) -> Option<Cause> {
    let probe_timeout = Duration::from_secs(1);
    // `sasl_ssl://host:port/bootstrap: SSL handshake failed: ...`
    let broker = |text: &str| text.split_once("://").and_then(|(_, rest)| rest.split('/').next()).map(str::to_owned);
    let text = match &cause {
        Cause::TlsToPlaintext(text) => {
            let addr = broker(text)?;
            return (!crate::io::tls::speaks_tls(&addr, probe_timeout)).then_some(cause);
        }
        Cause::PlaintextToTls(text) => {
            let addr = broker(text)?;
            return crate::io::tls::speaks_tls(&addr, probe_timeout).then_some(cause);
        }
        Cause::Untrusted(text) => text,
        _ => return Some(cause),
    };
    let Some(addr) = broker(text) else { return Some(cause) };
    let ca = properties.get("ssl.ca.location").map(std::path::Path::new);
    if ca.is_some_and(|p| !p.is_file()) {
        return Some(cause);
    }
    let names_checked =
        properties.get("ssl.endpoint.identification.algorithm").is_none_or(|a| !a.eq_ignore_ascii_case("none"));
    Some(match crate::io::tls::probe(&addr, ca, Duration::from_secs(2)) {
        Some((Refusal::OtherName, detail)) if names_checked => {
            Cause::HostnameMismatch(format!("{text}; a handshake of weir's own finds: {detail}"))
        }
        Some((Refusal::Expired, detail)) => {
            Cause::Expired(format!("{text}; a handshake of weir's own finds: {detail}"))
        }
        _ => cause,
    })
}

/// `text` with every value of `secrets` replaced.
fn redact(secrets: &[String], text: &str) -> String {
    secrets.iter().fold(text.to_owned(), |t, s| t.replace(s.as_str(), "<redacted>"))
}

/// Whether a librdkafka property holds a secret (passwords, keys, tokens, JAAS): its value is
/// never printed, logged or put in an error.
pub fn is_secret(property: &str) -> bool {
    let p = property.to_ascii_lowercase();
    ["password", "passphrase", "secret", "jaas", "key.pem", "private.key", "token", "credential", "oauthbearer.config"]
        .iter()
        .any(|s| p.contains(s))
}

/// A client that could not be made, as text: librdkafka's description and the property, its
/// value only when it is not a secret. A mistyped property name may be a secret's, so an
/// unknown property's value is never shown.
pub(crate) fn client_error_text(e: &KafkaError) -> String {
    match e {
        KafkaError::ClientConfig(_, description, key, value) => {
            let unknown = description.contains("No such configuration property");
            if unknown || is_secret(key) || description.contains(value.as_str()) {
                format!("{description} (property {key})")
            } else {
                format!("{description} (property {key} = {value:?})")
            }
        }
        other => super::kafka_error_text(other),
    }
}

/// A client librdkafka refused to make: a bad setting (exit 78 from `weir run`).
pub(crate) fn bad_setting(what: &str, e: &KafkaError) -> Problem {
    Problem { kind: KafkaErrorKind::Config, reason: format!("{what}: {}", client_error_text(e)) }
}

/// The properties of a client that only has to reach the same cluster as `properties` (a
/// dead-letter producer, a commit-marker consumer): the brokers and how to connect and
/// authenticate, nothing about consuming or producing.
pub(crate) fn connection_properties(properties: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
    const SHARED: &[&str] = &["bootstrap.servers", "client.id", "socket.", "security.", "sasl.", "ssl.", "broker."];
    properties
        .iter()
        .filter(|(name, _)| SHARED.iter().any(|p| *name == p || (p.ends_with('.') && name.starts_with(p))))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// librdkafka's texts for each failure (2.12, against Kafka 4.4) land in their cause.
    #[test]
    fn causes_are_told_apart() {
        let ssl = Some(RDKafkaErrorCode::SSL);
        let of = |code, t: &str| Cause::of(code, t);
        assert!(matches!(
            of(
                Some(RDKafkaErrorCode::Authentication),
                "SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
            ),
            Some(Cause::Authentication(_))
        ));
        assert!(matches!(
            of(
                ssl,
                "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root CA certificates are installed (install ca-certificates package)"
            ),
            Some(Cause::Untrusted(_))
        ));
        assert!(matches!(
            of(ssl, "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: Hostname mismatch"),
            Some(Cause::HostnameMismatch(_))
        ));
        assert!(matches!(
            of(ssl, "SSL handshake failed: error:0A00010B:SSL routines::wrong version number"),
            Some(Cause::TlsToPlaintext(_))
        ));
        assert!(matches!(
            of(
                Some(RDKafkaErrorCode::BrokerTransportFailure),
                "ssl://127.0.0.1:9092/bootstrap: SSL handshake failed: Disconnected: connecting to a PLAINTEXT broker listener?"
            ),
            Some(Cause::TlsToPlaintext(_))
        ));
        assert!(matches!(
            of(
                Some(RDKafkaErrorCode::BrokerTransportFailure),
                "Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol configuration (connecting to a SSL listener?) or broker version is < 0.10"
            ),
            Some(Cause::PlaintextToTls(_))
        ));
        assert_eq!(
            of(
                Some(RDKafkaErrorCode::BrokerTransportFailure),
                "Connect to ipv4#127.0.0.1:1 failed: Connection refused"
            ),
            None
        );
    }

    #[test]
    fn secrets_are_not_shown() {
        for p in [
            "sasl.password",
            "ssl.key.password",
            "ssl.key.pem",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
        ] {
            assert!(is_secret(p), "{p}");
        }
        for p in ["sasl.username", "sasl.mechanism", "security.protocol", "ssl.ca.location", "bootstrap.servers"] {
            assert!(!is_secret(p), "{p}");
        }
        let e = KafkaError::ClientConfig(
            rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
            "No such configuration property: \"sasl.pasword\"".into(),
            "sasl.pasword".into(),
            "hunter2".into(),
        );
        assert!(!client_error_text(&e).contains("hunter2"), "{}", client_error_text(&e));
        let e = KafkaError::ClientConfig(
            rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
            "Invalid value for configuration property \"sasl.password\"".into(),
            "sasl.password".into(),
            "hunter2".into(),
        );
        assert!(!client_error_text(&e).contains("hunter2"));
    }
}
