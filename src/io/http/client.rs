//! The HTTP/1.1 client side of the sink: where requests go (`http://` and `https://` URLs),
//! connecting, the request head, and quoting a response in messages. Responses are parsed
//! incrementally by `response.rs`; TLS is `tls.rs`.

use super::sink::HttpConfigError;
use crate::util::io_error_text;
use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Bytes of a response body quoted in messages and dead letters.
pub(super) const QUOTE_BYTES: usize = 512;

/// Where requests go.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// `Host` header value.
    pub host: String,
    /// `host:port`, resolved at connect.
    pub authority: String,
    /// Request target (`/path?query`).
    pub path: String,
    /// `https://`: TLS, and the host (without port) its certificate must name.
    pub tls: Option<String>,
}

/// Split `http[s]://host[:port][/path]` (port 80 or 443 by default).
pub(super) fn parse_url(url: &str) -> Result<Target, HttpConfigError> {
    let bad = |problem: String| HttpConfigError::Url { url: url.to_owned(), problem };
    let (rest, https) = match url.split_once("://") {
        Some(("http", rest)) => (rest, false),
        Some(("https", rest)) => (rest, true),
        _ => return Err(bad(format!("`{url}` is not an http:// or https:// URL"))),
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_owned()),
    };
    if authority.is_empty() || authority.contains('@') || authority.contains(char::is_whitespace) {
        return Err(bad(format!("`{url}`: no usable host (user info and spaces are not accepted)")));
    }
    if path.contains(char::is_whitespace) || path.contains('#') {
        return Err(bad(format!("`{url}`: the path has spaces or a fragment")));
    }
    let has_port = match authority.strip_prefix('[') {
        // An IPv6 literal: `[::1]` or `[::1]:port`.
        Some(v6) => match v6.split_once(']') {
            Some((_, after)) if after.is_empty() || after.starts_with(':') => !after.is_empty(),
            _ => return Err(bad(format!("`{url}`: a broken IPv6 literal"))),
        },
        None => authority.contains(':'),
    };
    let (name, with_port) = if has_port {
        let (name, port) = authority.rsplit_once(':').unwrap_or_default();
        port.parse::<u16>().map_err(|_| bad(format!("`{url}`: port `{port}` is not a number 0..65535")))?;
        (name, authority.to_owned())
    } else {
        (authority, format!("{authority}:{}", if https { 443 } else { 80 }))
    };
    let tls = https.then(|| name.to_owned());
    Ok(Target { host: authority.to_owned(), authority: with_port, path, tls })
}

/// Append the head of a POST of `body_len` bytes of `content_type` to `target`, named by
/// `key` (the `Idempotency-Key` header).
pub(super) fn write_post_head(out: &mut Vec<u8>, target: &Target, content_type: &str, body_len: usize, key: &str) {
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: weir\r\nContent-Type: {content_type}\r\nContent-Length: {body_len}\r\n\
         Idempotency-Key: {key}\r\n\r\n",
        target.path, target.host,
    );
}

/// `: <start of the body>` for messages, or nothing when the body is empty.
pub(super) fn quote(body: &[u8]) -> String {
    if body.is_empty() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(QUOTE_BYTES)]);
    format!(": {}", text.trim())
}

/// One connection to `authority` (every resolved address in turn).
pub(super) fn connect(authority: &str, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let addrs: Vec<SocketAddr> = authority.to_socket_addrs().map_err(ConnectError::Resolve)?.collect();
    let mut last = ConnectError::NoAddress { authority: authority.to_owned() };
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = ConnectError::Connect(e),
        }
    }
    Err(last)
}

/// Why no connection to a destination could be made ([`connect`]).
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectError {
    /// Its name does not resolve.
    #[error("cannot resolve: {0}")]
    Resolve(#[source] std::io::Error),
    /// It resolves to no address.
    #[error("`{authority}` resolves to no address")]
    NoAddress { authority: String },
    /// The last address tried refused, or did not answer in time.
    #[error("{}", io_error_text(.0))]
    Connect(#[source] std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// URLs: host, port, path and query; https and junk refused with a reason.
    #[test]
    fn urls() {
        let t = parse_url("http://127.0.0.1:8080/ingest?x=1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.authority.as_str(), t.path.as_str()),
            ("127.0.0.1:8080", "127.0.0.1:8080", "/ingest?x=1")
        );
        let t = parse_url("http://localhost").unwrap();
        assert_eq!((t.authority.as_str(), t.path.as_str()), ("localhost:80", "/"));
        let t = parse_url("http://[::1]:9000?q").unwrap();
        assert_eq!((t.authority.as_str(), t.path.as_str()), ("[::1]:9000", "/?q"));
        assert_eq!(parse_url("http://[::1]/a").unwrap().authority, "[::1]:80");
        let t = parse_url("https://api.example.com/v1").unwrap();
        assert_eq!((t.authority.as_str(), t.tls.as_deref()), ("api.example.com:443", Some("api.example.com")));
        let t = parse_url("https://[::1]:8443/").unwrap();
        assert_eq!((t.authority.as_str(), t.tls.as_deref()), ("[::1]:8443", Some("[::1]")));
        assert_eq!(parse_url("http://h/").unwrap().tls, None);
        assert!(parse_url("ftp://x").unwrap_err().to_string().contains("not an http"));
        assert!(parse_url("http://h:99999/").unwrap_err().to_string().contains("port"));
        assert!(parse_url("http:///x").is_err());
    }
}
