//! One connection to the server: opened blocking and bounded (TCP, TLS, startup,
//! authentication, the first queries), then driven by the sink's io_uring — statements
//! pipelined out, responses parsed as they come in. The messages are postgres-protocol's.
//!
//! ```text
//!  open:   connect ─► [SSLRequest ─► 'S' ─► TLS handshake] ─► StartupMessage ─► auth (SCRAM, MD5,
//!          password) ─► ParameterStatus… BackendKeyData ─► ReadyForQuery        (blocking, one deadline)
//!  pipe:   outbox ──send──► kernel            kernel ──recv──► inbox ─► Message::parse ─► the sink
//!          (one send in the kernel at a time, so statements leave in order; one receive always posted)
//! ```

use super::config::{ConnInfo, SslMode};
use super::error::{DbError, Problem};
use crate::io::tls::{HandshakeError, Refusal, Tls};
use crate::io::uring::{Completion, Uring};
use crate::util::{errno_text, io_error_text};
use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes a receive asks for at a time.
const RECV_BYTES: usize = 64 * 1024;

/// How a connection is protected, made once per sink from `sslmode` and `sslrootcert`.
#[derive(Clone)]
pub(crate) struct TlsPolicy {
    mode: SslMode,
    /// The settings of a TLS connection (`None`: plain only).
    config: Option<Arc<ClientConfig>>,
    name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for TlsPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPolicy").field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl TlsPolicy {
    /// The policy of `info` (reads `sslrootcert`).
    pub(crate) fn new(info: &ConnInfo) -> Result<TlsPolicy, Problem> {
        let mode = match (info.sslmode, &info.sslrootcert) {
            // libpq: `require` with a root certificate file verifies as `verify-ca`.
            (SslMode::Require, Some(_)) => SslMode::VerifyCa,
            (m, _) => m,
        };
        if matches!(mode, SslMode::Disable | SslMode::Allow) {
            return Ok(TlsPolicy { mode, config: None, name: None });
        }
        let setting = "connection.sslrootcert";
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Problem::failed(format!("TLS: {e}")))?;
        let config = match mode {
            SslMode::VerifyFull => {
                let roots = crate::io::tls::root_store(info.sslrootcert.as_deref())
                    .map_err(|e| Problem::config(setting, e.replace("ca_file", "sslrootcert")))?;
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            SslMode::VerifyCa => {
                let roots = crate::io::tls::root_store(info.sslrootcert.as_deref())
                    .map_err(|e| Problem::config(setting, e.replace("ca_file", "sslrootcert")))?;
                let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| Problem::config(setting, format!("TLS: {e}")))?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(inner))).with_no_client_auth()
            }
            _ => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
                .with_no_client_auth(),
        };
        let name = crate::io::tls::server_name(&info.host).map_err(|e| Problem::config("connection.host", e))?;
        Ok(TlsPolicy { mode, config: Some(Arc::new(config)), name: Some(name) })
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require`: encryption without checking who the server is (libpq's meaning
/// of those modes); the handshake's signatures are still checked.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Rows of a query, as text (`None`: NULL).
pub(crate) type Rows = Vec<Vec<Option<String>>>;

/// One open connection.
pub(crate) struct Session {
    stream: TcpStream,
    tls: Option<Tls>,
    /// The backend's process id and cancel key.
    pub pid: i32,
    /// Received plaintext not yet parsed.
    inbox: BytesMut,
    /// The server closed the connection.
    eof: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("pid", &self.pid).field("tls", &self.tls.is_some()).finish()
    }
}

/// Time left to `deadline`, or the error that says what did not finish.
fn left(deadline: Instant, what: &str) -> Result<Duration, Problem> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(Problem::unavailable(format!("{what}: no answer in time (connect_timeout_ms)")))
    } else {
        Ok(left)
    }
}

impl Session {
    /// Connect, negotiate TLS, start up (as `app`, the `application_name`) and authenticate,
    /// all by `deadline`.
    pub(crate) fn open(
        info: &ConnInfo,
        app: &str,
        password: Option<&str>,
        tls: &TlsPolicy,
        deadline: Instant,
    ) -> Result<Session, Problem> {
        let address = info.address();
        let addrs: Vec<SocketAddr> = address
            .to_socket_addrs()
            .map_err(|e| Problem::unavailable(format!("cannot resolve {address}: {e}")))?
            .collect();
        let mut stream = None;
        let mut last = format!("`{address}` resolves to no address");
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, left(deadline, "connect")?) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = io_error_text(&e),
            }
        }
        let Some(mut stream) = stream else {
            return Err(Problem::unavailable(format!("connect to {address}: {last}")));
        };
        let _ = stream.set_nodelay(true);
        let mut session_tls = None;
        if let (Some(config), Some(name)) = (&tls.config, &tls.name) {
            let mut buf = BytesMut::new();
            frontend::ssl_request(&mut buf);
            let mut answer = [0u8; 1];
            let negotiated = (|| {
                stream.set_write_timeout(Some(left(deadline, "TLS negotiation")?)).map_err(io_failed)?;
                stream.write_all(&buf).map_err(io_failed)?;
                stream.set_read_timeout(Some(left(deadline, "TLS negotiation")?)).map_err(io_failed)?;
                stream.read_exact(&mut answer).map_err(io_failed)
            })();
            negotiated.map_err(|p| Problem::unavailable(format!("TLS negotiation with {address}: {}", p.reason)))?;
            match answer[0] {
                b'S' => {
                    let timeout = left(deadline, "TLS handshake")?;
                    match Tls::handshake(&mut stream, config, name, timeout) {
                        Ok(t) => session_tls = Some(t),
                        Err(HandshakeError::Certificate { kind, detail }) => {
                            return Err(Problem::refused("connection.sslrootcert", tls_reason(kind, &detail)));
                        }
                        Err(HandshakeError::Other(why)) => return Err(Problem::unavailable(why)),
                    }
                }
                b'N' if tls.mode == SslMode::Prefer => {}
                b'N' => {
                    return Err(Problem::refused(
                        "connection.sslmode",
                        "the server does not offer TLS (its `ssl` setting is off); turn it on there, or use \
                         sslmode=prefer or disable",
                    ));
                }
                other => {
                    return Err(Problem::unavailable(format!(
                        "the server answered the TLS request with byte {other:#04x}: is it a PostgreSQL server?"
                    )));
                }
            }
        }
        let mut session = Session { stream, tls: session_tls, pid: 0, inbox: BytesMut::new(), eof: false };
        session.startup(info, app, password, deadline)?;
        Ok(session)
    }

    /// StartupMessage, authentication, and the messages up to the first ReadyForQuery.
    fn startup(
        &mut self,
        info: &ConnInfo,
        app: &str,
        password: Option<&str>,
        deadline: Instant,
    ) -> Result<(), Problem> {
        let mut buf = BytesMut::new();
        let params = [
            ("user", info.user.as_str()),
            ("database", info.dbname.as_str()),
            ("application_name", app),
            ("client_encoding", "UTF8"),
        ];
        frontend::startup_message(params.iter().copied(), &mut buf).map_err(io_failed)?;
        self.write_plain(&buf, deadline)?;
        let need_password = || {
            Problem::refused(
                "connection",
                format!(
                    "the server asks for a password for user `{}` and none is given: put it in the connection string, \
                     password_file or a passfile",
                    info.user
                ),
            )
        };
        let mut scram: Option<sasl::ScramSha256> = None;
        loop {
            match self.read_message(deadline, "authentication")? {
                Message::AuthenticationOk => break,
                Message::AuthenticationCleartextPassword => {
                    let p = password.ok_or_else(need_password)?;
                    buf.clear();
                    frontend::password_message(p.as_bytes(), &mut buf).map_err(io_failed)?;
                    self.write_plain(&buf, deadline)?;
                }
                Message::AuthenticationMd5Password(body) => {
                    let p = password.ok_or_else(need_password)?;
                    let hash =
                        postgres_protocol::authentication::md5_hash(info.user.as_bytes(), p.as_bytes(), body.salt());
                    buf.clear();
                    frontend::password_message(hash.as_bytes(), &mut buf).map_err(io_failed)?;
                    self.write_plain(&buf, deadline)?;
                }
                Message::AuthenticationSasl(body) => {
                    let p = password.ok_or_else(need_password)?;
                    let mut mechanisms = body.mechanisms();
                    let mut found = false;
                    while let Some(m) = mechanisms.next().map_err(io_failed)? {
                        found |= m == sasl::SCRAM_SHA_256;
                    }
                    if !found {
                        return Err(Problem::refused(
                            "connection",
                            "the server offers no SASL mechanism this sink speaks (it speaks SCRAM-SHA-256)",
                        ));
                    }
                    // No channel binding: "n,," (the server may still offer -PLUS).
                    let s = sasl::ScramSha256::new(p.as_bytes(), sasl::ChannelBinding::unsupported());
                    buf.clear();
                    frontend::sasl_initial_response(sasl::SCRAM_SHA_256, s.message(), &mut buf).map_err(io_failed)?;
                    self.write_plain(&buf, deadline)?;
                    scram = Some(s);
                }
                Message::AuthenticationSaslContinue(body) => {
                    let s = scram.as_mut().ok_or_else(|| Problem::failed("SCRAM: a continue without a start"))?;
                    s.update(body.data()).map_err(|e| Problem::refused("connection", format!("SCRAM: {e}")))?;
                    buf.clear();
                    frontend::sasl_response(s.message(), &mut buf).map_err(io_failed)?;
                    self.write_plain(&buf, deadline)?;
                }
                Message::AuthenticationSaslFinal(body) => {
                    let s = scram.as_mut().ok_or_else(|| Problem::failed("SCRAM: a final without a start"))?;
                    s.finish(body.data()).map_err(|e| {
                        Problem::refused(
                            "connection",
                            format!("SCRAM: the server did not prove it knows the password: {e}"),
                        )
                    })?;
                }
                Message::ErrorResponse(body) => return Err(startup_error(db_error(&body), info)),
                Message::AuthenticationGss | Message::AuthenticationKerberosV5 | Message::AuthenticationSspi => {
                    return Err(Problem::refused(
                        "connection",
                        "the server asks for GSSAPI/Kerberos/SSPI authentication, which this sink does not speak; \
                         allow scram-sha-256 or md5 for this user in pg_hba.conf",
                    ));
                }
                _ => {}
            }
        }
        loop {
            match self.read_message(deadline, "startup")? {
                Message::BackendKeyData(body) => self.pid = body.process_id(),
                Message::ReadyForQuery(_) => return Ok(()),
                Message::ErrorResponse(body) => return Err(startup_error(db_error(&body), info)),
                _ => {}
            }
        }
    }

    /// One simple query (several statements allowed), blocking, by `deadline`: its rows,
    /// or the server's first error.
    pub(crate) fn query(&mut self, sql: &str, deadline: Instant) -> Result<Result<Rows, DbError>, Problem> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf).map_err(io_failed)?;
        self.write_plain(&buf, deadline)?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            match self.read_message(deadline, "a query")? {
                Message::DataRow(body) => rows.push(data_row(&body)?),
                Message::ErrorResponse(body) => {
                    error.get_or_insert(db_error(&body));
                }
                Message::ReadyForQuery(_) => return Ok(error.map_or(Ok(rows), Err)),
                _ => {}
            }
        }
    }

    /// Write plaintext (encrypted over TLS) to the socket, blocking, by `deadline`.
    fn write_plain(&mut self, plain: &[u8], deadline: Instant) -> Result<(), Problem> {
        let sealed;
        let bytes = match &mut self.tls {
            None => plain,
            Some(tls) => {
                let mut out = Vec::new();
                tls.seal(plain, &mut out).map_err(Problem::unavailable)?;
                sealed = out;
                &sealed
            }
        };
        self.stream.set_write_timeout(Some(left(deadline, "send")?)).map_err(io_failed)?;
        self.stream.write_all(bytes).map_err(|e| Problem::unavailable(format!("send: {}", io_error_text(&e))))
    }

    /// The next message, reading (blocking, by `deadline`) as needed.
    fn read_message(&mut self, deadline: Instant, what: &str) -> Result<Message, Problem> {
        loop {
            if let Some(m) = self.next_message().map_err(Problem::failed)? {
                return Ok(m);
            }
            if self.eof {
                return Err(Problem::unavailable(format!("the server closed the connection during {what}")));
            }
            // Steps of at most WAIT_STEP, so a stop is seen while the server is slow to answer.
            let step = left(deadline, what)?.min(crate::operators::outside::WAIT_STEP);
            self.stream.set_read_timeout(Some(step)).map_err(io_failed)?;
            let mut buf = vec![0u8; RECV_BYTES];
            let n = match self.stream.read(&mut buf) {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if crate::operators::outside::stop_requested() {
                        return Err(Problem::unavailable(format!("{what}: the job is stopping")));
                    }
                    continue;
                }
                Err(e) => return Err(Problem::unavailable(format!("{what}: {}", io_error_text(&e)))),
            };
            buf.truncate(n);
            self.received(&buf, n == 0)?;
        }
    }

    /// Take received bytes (ciphertext over TLS) into the inbox; a TLS failure is worth
    /// another connection.
    fn received(&mut self, bytes: &[u8], eof: bool) -> Result<(), Problem> {
        match &mut self.tls {
            None => self.inbox.extend_from_slice(bytes),
            Some(tls) => {
                tls.open(bytes, eof).map_err(Problem::unavailable)?;
                self.inbox.extend_from_slice(&tls.plain);
                tls.plain.clear();
                self.eof |= tls.closed;
            }
        }
        self.eof |= eof;
        Ok(())
    }

    /// The next whole message in the inbox, if there is one.
    pub(crate) fn next_message(&mut self) -> Result<Option<Message>, String> {
        Message::parse(&mut self.inbox).map_err(|e| format!("a message from the server: {e}"))
    }

    /// Switch to io_uring: the connection becomes a [`Pipe`] with tags of generation `generation`.
    pub(crate) fn into_pipe(self, generation: u64) -> Pipe {
        let _ = self.stream.set_read_timeout(None);
        let _ = self.stream.set_write_timeout(None);
        Pipe {
            session: self,
            generation,
            outbox: Vec::new(),
            spare: Vec::new(),
            scratch: BytesMut::new(),
            sending: None,
            recv_in_kernel: false,
            rx: Vec::with_capacity(RECV_BYTES),
            failed: None,
        }
    }
}

fn io_failed(e: std::io::Error) -> Problem {
    Problem::unavailable(io_error_text(&e))
}

/// A startup error, by cause, naming what to change.
fn startup_error(e: DbError, info: &ConnInfo) -> Problem {
    match e.code.as_str() {
        "28P01" => Problem::refused(
            "connection",
            format!("{}: check the password (connection string, password_file or passfile)", e.text()),
        ),
        "28000" => Problem::refused(
            "connection",
            format!("{}: the server's pg_hba.conf has no entry that lets user `{}` in from here", e.text(), info.user),
        ),
        "3D000" => Problem::config("connection.dbname", format!("{}: create it, or name another dbname", e.text())),
        // The server starting up or shutting down, too many connections: later.
        "57P03" | "53300" | "57P01" | "57P02" => Problem::unavailable(e.text()),
        _ => Problem::refused("connection", e.text()),
    }
}

/// A certificate refusal in the words of the connection string.
fn tls_reason(kind: Refusal, detail: &str) -> String {
    match kind {
        Refusal::Untrusted => format!(
            "the server's TLS certificate is not trusted ({detail}): give the CA certificate that signed it as \
             sslrootcert (PEM)"
        ),
        Refusal::OtherName => format!(
            "the server's TLS certificate does not name the host ({detail}): connect by a name it lists, or use \
             sslmode=verify-ca"
        ),
        Refusal::Expired => format!("the server's TLS certificate has expired or is not valid yet ({detail})"),
        Refusal::ServerRefused => format!("the server refused the TLS handshake ({detail})"),
        Refusal::Other => format!("the server's TLS certificate is invalid ({detail})"),
    }
}

/// An ErrorResponse's fields.
pub(crate) fn db_error(body: &postgres_protocol::message::backend::ErrorResponseBody) -> DbError {
    let mut e = DbError::default();
    let mut fields = body.fields();
    while let Ok(Some(f)) = fields.next() {
        let v = String::from_utf8_lossy(f.value_bytes()).into_owned();
        match f.type_() {
            b'V' => e.severity = v,
            b'S' if e.severity.is_empty() => e.severity = v,
            b'C' => e.code = v,
            b'M' => e.message = v,
            b'D' => e.detail = Some(v),
            b'H' => e.hint = Some(v),
            b'W' => e.context = Some(v),
            b'c' => e.column = Some(v),
            b'n' => e.constraint = Some(v),
            _ => {}
        }
    }
    e
}

/// A DataRow's values as text.
pub(crate) fn data_row(
    body: &postgres_protocol::message::backend::DataRowBody,
) -> Result<Vec<Option<String>>, Problem> {
    let buf = body.buffer();
    let mut out = Vec::new();
    let mut ranges = body.ranges();
    while let Some(r) = ranges.next().map_err(io_failed)? {
        out.push(r.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()));
    }
    Ok(out)
}

/// Operation kinds in the low bits of a tag; the connection's generation above them.
const SEND: u64 = 0;
const RECV: u64 = 1;

/// A connection driven by io_uring: plaintext queued out, messages parsed in.
pub(crate) struct Pipe {
    session: Session,
    /// This connection's generation: completions of an older one are recognized and dropped.
    generation: u64,
    /// Plaintext queued, not yet handed to the kernel.
    outbox: Vec<u8>,
    /// A buffer to swap in for the next send.
    spare: Vec<u8>,
    /// Where `queue_with` writes before the outbox takes it whole (kept: a batch's
    /// messages are as large as the batch, and a fresh buffer grows by copying).
    scratch: BytesMut,
    /// The send in the kernel: bytes already sent, and the total.
    sending: Option<(usize, usize)>,
    recv_in_kernel: bool,
    /// The receive buffer, when not lent to the kernel.
    rx: Vec<u8>,
    /// Why the connection failed, once it did.
    pub failed: Option<String>,
}

impl std::fmt::Debug for Pipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipe")
            .field("generation", &self.generation)
            .field("pid", &self.session.pid)
            .finish_non_exhaustive()
    }
}

/// The generation a completion's tag names.
pub(crate) fn tag_gen(tag: u64) -> u64 {
    tag >> 1
}

impl Pipe {
    /// The backend's process id.
    pub(crate) fn pid(&self) -> i32 {
        self.session.pid
    }

    /// Queue messages written by `write` into the outbox (as a BytesMut): all of them, or
    /// none if it fails.
    pub(crate) fn queue_with(&mut self, write: impl FnOnce(&mut BytesMut) -> std::io::Result<()>) {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        if write(&mut buf).is_ok() {
            self.outbox.extend_from_slice(&buf);
        }
        self.scratch = buf;
    }

    /// Queue one `CopyData` message whose payload is `parts` one after the other, copied
    /// into the outbox once (a batch's rows are megabytes: not through `queue_with`'s
    /// buffer). False, and nothing queued, if the payload is too long for one message.
    pub(crate) fn queue_copy_data(&mut self, parts: &[&[u8]]) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let Ok(framed) = i32::try_from(len + 4) else { return false };
        self.outbox.reserve(len + 5);
        self.outbox.push(b'd');
        self.outbox.extend_from_slice(&framed.to_be_bytes());
        for p in parts {
            self.outbox.extend_from_slice(p);
        }
        true
    }

    /// Hand what is queued to the kernel (if no send is in the kernel), and keep a receive
    /// posted. Queues operations; the caller submits.
    pub(crate) fn pump(&mut self, ring: &mut Uring) -> std::io::Result<()> {
        if self.failed.is_some() {
            return Ok(());
        }
        let fd = self.session.stream.as_raw_fd();
        if self.sending.is_none() && !self.outbox.is_empty() {
            let mut bytes = std::mem::take(&mut self.spare);
            bytes.clear();
            std::mem::swap(&mut bytes, &mut self.outbox);
            if let Some(tls) = &mut self.session.tls {
                let mut cipher = Vec::with_capacity(bytes.len() + bytes.len() / 16 + 64);
                if let Err(why) = tls.seal(&bytes, &mut cipher) {
                    self.fail(why);
                    return Ok(());
                }
                bytes.clear();
                self.spare = bytes;
                bytes = cipher;
            }
            let len = bytes.len();
            ring.send(fd, bytes, 0, (self.generation << 1) | SEND)?;
            self.sending = Some((0, len));
        }
        if !self.recv_in_kernel {
            let mut rx = std::mem::take(&mut self.rx);
            rx.clear();
            rx.reserve(RECV_BYTES);
            ring.recv(fd, rx, (self.generation << 1) | RECV)?;
            self.recv_in_kernel = true;
        }
        Ok(())
    }

    /// A completion of this connection's (its tag's generation is `generation`).
    pub(crate) fn completed(&mut self, mut c: Completion, ring: &mut Uring) -> std::io::Result<()> {
        let buffer = c.buffer.take().unwrap_or_default();
        if c.tag & 1 == SEND {
            let Some((sent, len)) = self.sending.take() else { return Ok(()) };
            match c.bytes() {
                Err(code) => self.fail(format!("send: {}", errno_text(code))),
                Ok(0) => self.fail("send: the kernel sent 0 bytes".into()),
                Ok(n) if sent + n < len => {
                    if self.failed.is_none() {
                        let fd = self.session.stream.as_raw_fd();
                        ring.send(fd, buffer, sent + n, c.tag)?;
                        self.sending = Some((sent + n, len));
                        return Ok(());
                    }
                }
                Ok(_) => {}
            }
            if self.spare.capacity() < buffer.capacity() {
                self.spare = buffer;
            }
            return Ok(());
        }
        self.recv_in_kernel = false;
        let mut rx = buffer;
        match c.bytes() {
            Err(code) => self.fail(format!("receive: {}", errno_text(code))),
            Ok(n) => {
                if let Err(why) = self.session.received(&rx, n == 0) {
                    self.fail(why.reason);
                } else if self.session.eof {
                    self.fail("the server closed the connection".into());
                }
            }
        }
        rx.clear();
        self.rx = rx;
        Ok(())
    }

    /// The next whole message received, if any.
    pub(crate) fn next_message(&mut self) -> Result<Option<Message>, String> {
        self.session.next_message()
    }

    /// The connection failed: remember why, and shut the socket down so the kernel
    /// completes its operations soon.
    pub(crate) fn fail(&mut self, why: String) {
        self.failed.get_or_insert(why);
        let _ = self.session.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        let _ = self.session.stream.shutdown(Shutdown::Both);
    }
}
