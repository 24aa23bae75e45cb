//! TLS in a build without the `tls` feature: the names `tls.rs` gives the HTTP sink, and no
//! session can be made. An `https://` URL is refused when the sink's settings are checked
//! (before the job starts), with the feature to build with; plain `http://` is unchanged.

use std::convert::Infallible;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// A client certificate and its private key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate chain, leaf first (PEM).
    pub cert: std::path::PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
}

/// What a connection would be made with: none can be, so no value of it exists.
pub(crate) type Settings = (Infallible, Infallible);

/// What the sink's check says of an `https://` URL in this build.
const NO_TLS: &str = "https:// needs weir built with the `tls` feature (this build has no TLS); \
                      build with `--features tls`, or post to an http:// URL";

/// Always refused: this build has no TLS.
pub(crate) fn client_config(_ca_file: Option<&Path>, _client: Option<&ClientCert>) -> Result<Infallible, String> {
    Err(NO_TLS.to_owned())
}

/// Always refused: this build has no TLS.
pub(crate) fn server_name(_host: &str) -> Result<Infallible, String> {
    Err(NO_TLS.to_owned())
}

/// Why a handshake failed (none is made in this build).
#[derive(Debug)]
#[allow(dead_code)] // the HTTP sink matches on both; neither is made here
pub(crate) enum HandshakeError {
    /// The server's certificate was refused.
    Certificate {
        /// Which way.
        kind: Refusal,
        /// What was seen, in words.
        detail: String,
    },
    /// Anything else.
    Other(String),
}

/// How a certificate was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {}

impl HandshakeError {
    /// The refusal in the words of the HTTP sink's settings.
    pub(crate) fn http_reason(kind: Refusal, _detail: &str) -> String {
        match kind {}
    }
}

/// One TLS session over a connection: none exists in this build.
#[derive(Debug)]
pub(crate) struct Tls {
    never: Infallible,
    /// Plaintext of the response so far.
    pub plain: Vec<u8>,
    /// The server sent close_notify.
    pub closed: bool,
}

impl Tls {
    /// Unreachable: `config` cannot exist in this build.
    pub(crate) fn handshake(
        _stream: &mut TcpStream,
        config: &Infallible,
        _name: &Infallible,
        _timeout: Duration,
    ) -> Result<Tls, HandshakeError> {
        match *config {}
    }

    /// Unreachable: no session exists.
    pub(crate) fn seal(&mut self, _request: &[u8], _out: &mut Vec<u8>) -> Result<(), String> {
        match self.never {}
    }

    /// Unreachable: no session exists.
    pub(crate) fn open(&mut self, _cipher: &[u8], _eof: bool) -> Result<(), String> {
        match self.never {}
    }
}
