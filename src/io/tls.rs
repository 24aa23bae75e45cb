//! TLS through rustls: the HTTP sink's HTTPS, and a probe that tells why a Kafka broker's
//! certificate was refused.
//!
//! HTTPS: rustls between the sink's buffers and io_uring. rustls is sans-I/O — it turns
//! plaintext into TLS records and back in memory — so the sink keeps its io_uring sends and
//! receives and only passes the bytes through a [`Tls`] on each side:
//!
//! ```text
//!  request (plaintext, kept for retries) ─seal─► ciphertext buffer ─► io_uring send
//!  io_uring recv ─► ciphertext buffer ─open─► plaintext ─► the response parser
//! ```
//!
//! The handshake runs when a connection is made, blocking like the connect itself and bounded
//! by `connect_timeout`. Certificates are verified against the system's roots (the
//! `rustls-native-certs` store: `/etc/ssl/certs` on Debian) or a CA bundle the job names
//! (`ca_file`), with SNI and the host name (or IP address) of the URL; a client certificate is
//! optional. A certificate that fails verification fails the job at once with the cause
//! (untrusted, another host's, expired): retrying cannot mend it, and sending to a server
//! that did not prove who it is would be worse.
//!
//! Kafka: librdkafka (OpenSSL) says only "certificate verify failed"; [`probe`] makes one TLS
//! handshake of its own with the same CA file to the broker that refused, and rustls names
//! the reason (untrusted issuer, another host's name, expired).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{CertificateError, ClientConfig, ClientConnection, RootCertStore};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A client certificate and its private key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate chain, leaf first (PEM).
    pub cert: std::path::PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
}

/// What a connection is made with: the TLS settings and the name its server must prove.
pub(crate) type Settings = (Arc<ClientConfig>, ServerName<'static>);

/// The TLS settings of every connection of one sink: roots, client certificate, protocols.
pub(crate) fn client_config(ca_file: Option<&Path>, client: Option<&ClientCert>) -> Result<Arc<ClientConfig>, String> {
    let roots = root_store(ca_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(c) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&c.cert)
                .and_then(|certs| certs.collect::<Result<_, _>>())
                .map_err(|e| format!("cannot read the client certificate {}: {e}", c.cert.display()))?;
            if chain.is_empty() {
                return Err(format!("the client certificate file {} holds no PEM certificate", c.cert.display()));
            }
            let key = PrivateKeyDer::from_pem_file(&c.key)
                .map_err(|e| format!("cannot read the client key {}: {e}", c.key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the client certificate {} and key {}: {e}", c.cert.display(), c.key.display()))?
        }
    };
    Ok(Arc::new(config))
}

/// The CA certificates to trust: those of `ca_file` (PEM), or the system's store.
pub(crate) fn root_store(ca_file: Option<&Path>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("the CA file {}: {e}", path.display()))?;
                roots.add(cert).map_err(|e| format!("the CA file {}: a certificate it holds: {e}", path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("the CA file {} holds no PEM certificate", path.display()));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
            if roots.is_empty() {
                return Err(format!(
                    "no trusted CA certificates in the system's store ({}); install ca-certificates, or give ca_file",
                    native.errors.first().map_or_else(|| "it is empty".to_owned(), |e| e.to_string())
                ));
            }
        }
    }
    Ok(roots)
}

/// The name a server's certificate must carry: the URL's host (a DNS name or an IP address,
/// IPv6 without its brackets), also sent as SNI for DNS names.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    ServerName::try_from(host.to_owned()).map_err(|e| format!("`{host}` is not a host name TLS can verify: {e}"))
}

/// Why a handshake failed.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    /// The server's certificate was refused (or the server refused ours): permanent.
    Certificate {
        /// Which way.
        kind: Refusal,
        /// What rustls saw, in words (names, dates).
        detail: String,
    },
    /// Anything else (reset, timeout, a server that is not speaking TLS): worth a retry.
    Other(String),
}

/// How a certificate was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its issuer is not among the trusted CAs.
    Untrusted,
    /// It does not name the host connected to.
    OtherName,
    /// It has expired or is not valid yet.
    Expired,
    /// The server refused the handshake (an alert): it may want a client certificate.
    ServerRefused,
    /// Anything else about it (revoked, a bad signature).
    Other,
}

impl HandshakeError {
    /// The refusal, with what to do about it in the words of the HTTP sink's settings.
    pub(crate) fn http_reason(kind: Refusal, detail: &str) -> String {
        match kind {
            Refusal::Untrusted => format!(
                "the server's TLS certificate is not trusted ({detail}): give the CA certificate that signed it in \
                 ca_file (PEM), or install it in the system's store"
            ),
            Refusal::OtherName => format!(
                "the server's TLS certificate does not name the URL's host ({detail}): use a URL with a name the \
                 certificate lists"
            ),
            Refusal::Expired => format!("the server's TLS certificate has expired or is not valid yet ({detail})"),
            Refusal::ServerRefused => format!(
                "the server refused the TLS handshake ({detail}): does it require a client certificate \
                 (client_cert, client_key)?"
            ),
            Refusal::Other => format!("the server's TLS certificate is invalid ({detail})"),
        }
    }
}

/// One TLS session over a connection.
pub(crate) struct Tls {
    conn: ClientConnection,
    /// Plaintext of the response so far (what the parser reads).
    pub plain: Vec<u8>,
    /// The server sent close_notify.
    pub closed: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("plain", &self.plain.len()).field("closed", &self.closed).finish()
    }
}

impl Tls {
    /// Handshake on the connected `stream`, within `timeout`.
    pub(crate) fn handshake(
        stream: &mut TcpStream,
        config: &Arc<ClientConfig>,
        name: &ServerName<'static>,
        timeout: Duration,
    ) -> Result<Tls, HandshakeError> {
        let other = |what: &str, e: &dyn std::fmt::Display| HandshakeError::Other(format!("TLS {what}: {e}"));
        let mut conn = ClientConnection::new(config.clone(), name.clone()).map_err(|e| other("setup", &e))?;
        // Requests are bounded by the batch size; no limit of rustls' own on top.
        conn.set_buffer_limit(None);
        let deadline = Instant::now() + timeout;
        let result = (|| {
            while conn.is_handshaking() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(HandshakeError::Other(format!(
                        "TLS handshake not done within {}",
                        crate::util::duration_text(timeout)
                    )));
                }
                stream.set_read_timeout(Some(left)).map_err(|e| other("handshake", &e))?;
                stream.set_write_timeout(Some(left)).map_err(|e| other("handshake", &e))?;
                match conn.complete_io(stream) {
                    Ok((0, 0)) if conn.is_handshaking() => {
                        return Err(HandshakeError::Other(
                            "the server closed the connection during the TLS handshake".into(),
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => return Err(handshake_error(&e)),
                }
            }
            Ok(())
        })();
        // io_uring drives the socket from here on: no timeouts left on it.
        let _ = stream.set_read_timeout(None);
        let _ = stream.set_write_timeout(None);
        result.map(|()| Tls { conn, plain: Vec::new(), closed: false })
    }

    /// Encrypt `request` into `out` (cleared first): the bytes to send.
    pub(crate) fn seal(&mut self, request: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        out.clear();
        self.conn.writer().write_all(request).map_err(|e| format!("TLS: {e}"))?;
        while self.conn.wants_write() {
            self.conn.write_tls(out).map_err(|e| format!("TLS: {e}"))?;
        }
        Ok(())
    }

    /// Decrypt what was received (`cipher`; `eof` when the connection ended) onto `plain`.
    pub(crate) fn open(&mut self, mut cipher: &[u8], eof: bool) -> Result<(), String> {
        while !cipher.is_empty() {
            // rustls takes what fits its record buffer; decrypting empties it for the rest.
            let n = self.conn.read_tls(&mut cipher).map_err(|e| format!("TLS: {e}"))?;
            self.decrypt()?;
            if n == 0 {
                break;
            }
        }
        if eof {
            // A read of nothing tells rustls the transport ended.
            let _ = self.conn.read_tls(&mut &[][..]);
            self.decrypt()?;
        }
        Ok(())
    }

    /// Process the records rustls holds; append their plaintext to `plain`.
    fn decrypt(&mut self) -> Result<(), String> {
        let state = self.conn.process_new_packets().map_err(|e| format!("TLS: {e}"))?;
        let n = state.plaintext_bytes_to_read();
        let at = self.plain.len();
        self.plain.resize(at + n, 0);
        self.conn.reader().read_exact(&mut self.plain[at..]).map_err(|e| format!("TLS: {e}"))?;
        self.closed |= state.peer_has_closed();
        Ok(())
    }
}

/// A failed handshake, by cause.
fn handshake_error(e: &std::io::Error) -> HandshakeError {
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return HandshakeError::Other(format!("TLS handshake: {}", crate::util::io_error_text(e)));
    };
    match tls {
        rustls::Error::InvalidCertificate(c) => {
            let (kind, detail) = refusal(c);
            HandshakeError::Certificate { kind, detail }
        }
        // Alerts about certificates are the server's refusal; others (internal_error from a
        // busy server or a load balancer) are worth a retry.
        rustls::Error::AlertReceived(alert) if refuses(*alert) => {
            HandshakeError::Certificate { kind: Refusal::ServerRefused, detail: format!("alert {alert:?}") }
        }
        rustls::Error::InvalidMessage(m) => HandshakeError::Other(format!(
            "TLS handshake: the server sent something that is not TLS ({m:?}): is it a plain http:// server?"
        )),
        other => HandshakeError::Other(format!("TLS handshake: {other}")),
    }
}

/// Whether a TLS alert is a server's refusal of the client (its certificate, or its lack of
/// one) rather than a passing failure.
fn refuses(alert: rustls::AlertDescription) -> bool {
    use rustls::AlertDescription as A;
    matches!(
        alert,
        A::BadCertificate
            | A::CertificateRequired
            | A::UnknownCA
            | A::AccessDenied
            | A::HandshakeFailure
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
    )
}

/// What is wrong with a certificate: which way, and the names or dates involved.
fn refusal(c: &CertificateError) -> (Refusal, String) {
    match c {
        CertificateError::UnknownIssuer => (Refusal::Untrusted, "its issuer is unknown".into()),
        CertificateError::NotValidForNameContext { expected, presented } => (
            Refusal::OtherName,
            format!(
                "wanted {}; it names {}",
                expected.to_str(),
                presented.iter().map(|n| bare_name(n)).collect::<Vec<_>>().join(", ")
            ),
        ),
        CertificateError::NotValidForName => (Refusal::OtherName, "its names do not include the host".into()),
        CertificateError::ExpiredContext { not_after, .. } => {
            (Refusal::Expired, format!("expired: not after {} (unix time)", not_after.as_secs()))
        }
        CertificateError::Expired => (Refusal::Expired, "expired".into()),
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            (Refusal::Expired, "not valid yet: is this machine's clock right?".into())
        }
        other => (Refusal::Other, format!("{other:?}")),
    }
}

/// A presented name as rustls writes it (`DnsName("a.example")`, `IpAddress(127.0.0.1)`),
/// without the wrapping.
fn bare_name(name: &str) -> &str {
    let inner = ["DnsName(", "IpAddress("]
        .iter()
        .find_map(|p| name.strip_prefix(p).and_then(|n| n.strip_suffix(')')))
        .unwrap_or(name);
    inner.trim_matches('"')
}

/// Why a TLS server's certificate is refused, found by one handshake of our own: `addr` is
/// `host:port`, `ca_file` the CA certificates to trust (`None`: the system's). `None` when the
/// handshake succeeds or fails for another reason than the certificate (then the caller keeps
/// what it knew).
#[cfg(feature = "kafka")]
pub(crate) fn probe(addr: &str, ca_file: Option<&Path>, timeout: Duration) -> Option<(Refusal, String)> {
    let (host, _) = addr.rsplit_once(':')?;
    let config = client_config(ca_file, None).ok()?;
    let name = server_name(host).ok()?;
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(addr).ok()?.collect();
    let mut stream = addrs.iter().find_map(|a| TcpStream::connect_timeout(a, timeout).ok())?;
    match Tls::handshake(&mut stream, &config, &name, timeout) {
        Err(HandshakeError::Certificate { kind, detail }) => Some((kind, detail)),
        _ => None,
    }
}

/// Whether the server at `addr` (`host:port`) answers a TLS ClientHello with a certificate
/// (trusted or not): a plaintext client at a TLS port gets no answer at all from some
/// servers (Kafka's TLS listeners wait), so this is how to tell.
#[cfg(feature = "kafka")]
pub(crate) fn speaks_tls(addr: &str, timeout: Duration) -> bool {
    let Some((host, _)) = addr.rsplit_once(':') else { return false };
    let (Ok(config), Ok(name)) = (client_config(None, None), server_name(host)) else { return false };
    let Ok(addrs) = std::net::ToSocketAddrs::to_socket_addrs(addr) else { return false };
    let Some(mut stream) = addrs.into_iter().find_map(|a| TcpStream::connect_timeout(&a, timeout).ok()) else {
        return false;
    };
    matches!(Tls::handshake(&mut stream, &config, &name, timeout), Ok(_) | Err(HandshakeError::Certificate { .. }))
}
