//! An HTTP/1.1 response parser for the HTTP sink: incremental (call it again with more bytes),
//! bounded (head and body limits), strict where ambiguity would be dangerous (conflicting
//! `Content-Length`s, unknown transfer codings are refused with a clear error).
//!
//! Body framing, as RFC 9112 §6.3 orders it: 1xx, 204 and 304 have no body; `Transfer-Encoding:
//! chunked` (the only coding accepted) wins over `Content-Length`; then `Content-Length`; else
//! the body runs to the end of the connection (and the connection is not reused).

/// The longest response head accepted.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    /// The status code.
    pub status: u16,
    /// The reason phrase.
    pub reason: String,
    /// Whether the connection may carry the next request.
    pub keep_alive: bool,
    /// `Retry-After` in seconds, when given as a number.
    pub retry_after_s: Option<u64>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

/// What the bytes so far hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// Not a whole response yet: read more.
    Incomplete,
    /// A whole response, and how many bytes of the input it took.
    Complete(Response, usize),
}

/// A response the sink cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResponseError {
    /// Not HTTP/1.x, or broken framing.
    #[error("malformed HTTP response: {0}")]
    Malformed(String),
    /// Valid HTTP the sink does not speak.
    #[error("unsupported HTTP response: {0}")]
    Unsupported(String),
    /// Over a limit.
    #[error("HTTP response too large: {0}")]
    TooLarge(String),
}

/// Parse the response at the start of `buf`. `eof`: the peer closed the connection after
/// these bytes. `max_body_bytes` bounds the (de-chunked) body.
pub(crate) fn parse(buf: &[u8], eof: bool, max_body_bytes: usize) -> Result<Parsed, ResponseError> {
    let mut start = 0;
    loop {
        match parse_one(&buf[start..], eof, max_body_bytes)? {
            // An interim response (100 Continue, 103 Early Hints): the final one follows.
            Parsed::Complete(r, used) if (100..200).contains(&r.status) => start += used,
            Parsed::Complete(r, used) => return Ok(Parsed::Complete(r, start + used)),
            Parsed::Incomplete => return Ok(Parsed::Incomplete),
        }
    }
}

fn malformed(what: impl Into<String>) -> ResponseError {
    ResponseError::Malformed(what.into())
}

fn parse_one(buf: &[u8], eof: bool, max_body_bytes: usize) -> Result<Parsed, ResponseError> {
    let Some(head_len) = find(buf, b"\r\n\r\n").map(|i| i + 4) else {
        if buf.len() > MAX_HEAD_BYTES {
            return Err(ResponseError::TooLarge(format!("no end of the head within {MAX_HEAD_BYTES} bytes")));
        }
        if eof {
            return Err(malformed(format!("the connection closed inside the response head ({} bytes)", buf.len())));
        }
        return Ok(Parsed::Incomplete);
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(ResponseError::TooLarge(format!("a head of {head_len} bytes (limit {MAX_HEAD_BYTES})")));
    }
    let head = std::str::from_utf8(&buf[..head_len - 4]).map_err(|_| malformed("the head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => return Err(malformed(format!("status line `{}`: not HTTP/1.0 or 1.1", clip(status_line)))),
    };
    let code = parts.next().unwrap_or_default();
    let status = match code.parse::<u16>() {
        Ok(s) if code.len() == 3 && (100..600).contains(&s) => s,
        _ => return Err(malformed(format!("status line `{}`: no three-digit status", clip(status_line)))),
    };
    let reason = parts.next().unwrap_or_default().to_owned();

    let (mut length, mut chunked, mut close, mut keep_alive_token, mut retry_after_s) =
        (None::<usize>, false, false, false, None);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(malformed(format!("header line `{}` has no colon", clip(line))));
        };
        if name.is_empty() || name.ends_with([' ', '\t']) {
            return Err(malformed(format!("header name `{}`", clip(name))));
        }
        let value = value.trim_matches([' ', '\t']);
        match name.to_ascii_lowercase().as_str() {
            "content-length" => {
                let n: usize = value.parse().map_err(|_| malformed(format!("Content-Length `{}`", clip(value))))?;
                if length.is_some_and(|l| l != n) {
                    return Err(malformed("two different Content-Length values"));
                }
                length = Some(n);
            }
            "transfer-encoding" => {
                let codings: Vec<String> = value.split(',').map(|c| c.trim().to_ascii_lowercase()).collect();
                if codings.iter().any(|c| c != "chunked") {
                    return Err(ResponseError::Unsupported(format!(
                        "Transfer-Encoding `{}` (only chunked is accepted)",
                        clip(value)
                    )));
                }
                chunked = true;
            }
            "connection" => {
                for token in value.split(',').map(|t| t.trim().to_ascii_lowercase()) {
                    close |= token == "close";
                    keep_alive_token |= token == "keep-alive";
                }
            }
            "retry-after" => retry_after_s = value.parse().ok(),
            _ => {}
        }
    }
    let mut keep_alive = !close && (minor == 1 || keep_alive_token);
    let rest = &buf[head_len..];
    let (body, used) = if (100..200).contains(&status) || status == 204 || status == 304 {
        (Vec::new(), 0)
    } else if chunked {
        match dechunk(rest, max_body_bytes)? {
            Some(x) => x,
            None if eof => return Err(malformed("the connection closed inside a chunked body")),
            None => return Ok(Parsed::Incomplete),
        }
    } else if let Some(n) = length {
        if n > max_body_bytes {
            return Err(ResponseError::TooLarge(format!("Content-Length {n} (limit {max_body_bytes})")));
        }
        if rest.len() < n {
            if eof {
                return Err(malformed(format!("the connection closed after {} of {n} body bytes", rest.len())));
            }
            return Ok(Parsed::Incomplete);
        }
        (rest[..n].to_vec(), n)
    } else {
        // No framing: the body is everything until the peer closes.
        keep_alive = false;
        if rest.len() > max_body_bytes {
            return Err(ResponseError::TooLarge(format!("an unframed body over {max_body_bytes} bytes")));
        }
        if !eof {
            return Ok(Parsed::Incomplete);
        }
        (rest.to_vec(), rest.len())
    };
    Ok(Parsed::Complete(Response { status, reason, keep_alive, retry_after_s, body }, head_len + used))
}

/// Decode a chunked body at the start of `buf`: `(body, bytes used)`, or None if incomplete.
fn dechunk(buf: &[u8], max_body_bytes: usize) -> Result<Option<(Vec<u8>, usize)>, ResponseError> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(eol) = find(&buf[at..], b"\r\n") else {
            return if buf.len() - at > 1024 { Err(malformed("a chunk-size line over 1 KiB")) } else { Ok(None) };
        };
        let line = std::str::from_utf8(&buf[at..at + eol]).map_err(|_| malformed("a chunk-size line is not UTF-8"))?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| malformed(format!("chunk size `{}` is not hexadecimal", clip(size_text))))?;
        at += eol + 2;
        if size == 0 {
            // Trailer fields, then an empty line.
            loop {
                let Some(eol) = find(&buf[at..], b"\r\n") else { return Ok(None) };
                at += eol + 2;
                if eol == 0 {
                    return Ok(Some((body, at)));
                }
            }
        }
        if body.len().saturating_add(size) > max_body_bytes {
            return Err(ResponseError::TooLarge(format!("a chunked body over {max_body_bytes} bytes")));
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err(malformed("a chunk is not followed by CRLF"));
        }
        body.extend_from_slice(&buf[at..at + size]);
        at += size + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// At most 80 characters of `s`, for messages.
fn clip(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn complete(buf: &[u8]) -> (Response, usize) {
        match parse(buf, false, 1 << 20) {
            Ok(Parsed::Complete(r, n)) => (r, n),
            other => panic!("{other:?}"),
        }
    }

    /// Content-Length framing, keep-alive by default in 1.1, bytes after the response left alone.
    #[test]
    fn content_length() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhelloHTTP/1.1";
        let (r, n) = complete(raw);
        assert_eq!((r.status, r.reason.as_str(), r.keep_alive, &r.body[..]), (200, "OK", true, &b"hello"[..]));
        assert_eq!(n, raw.len() - 8);
    }

    /// Chunked bodies are decoded, with extensions and trailers; 1xx responses are skipped.
    #[test]
    fn chunked_and_interim() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n4;x=y\r\nslow\r\n3\r\n...\r\n0\r\nT: v\r\n\r\n";
        let (r, n) = complete(raw);
        assert_eq!((r.status, r.retry_after_s, &r.body[..]), (503, Some(3), &b"slow..."[..]));
        assert_eq!(n, raw.len());
    }

    /// `Connection: close`, HTTP/1.0 and unframed bodies end keep-alive.
    #[test]
    fn connection_reuse() {
        assert!(!complete(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").0.keep_alive);
        assert!(!complete(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").0.keep_alive);
        assert!(complete(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n").0.keep_alive);
        let raw = b"HTTP/1.1 400 Bad\r\n\r\nno framing";
        assert_eq!(parse(raw, false, 100), Ok(Parsed::Incomplete));
        let Ok(Parsed::Complete(r, _)) = parse(raw, true, 100) else { panic!() };
        assert_eq!((r.keep_alive, &r.body[..]), (false, &b"no framing"[..]));
    }

    /// What the sink refuses, it refuses with a reason.
    #[test]
    fn refusals() {
        let err = |raw: &[u8]| parse(raw, false, 16).unwrap_err().to_string();
        assert!(err(b"SPDY/3 200 OK\r\n\r\n").contains("not HTTP/1.0 or 1.1"));
        assert!(err(b"HTTP/1.1 2000 OK\r\n\r\n").contains("three-digit"));
        assert!(err(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").contains("only chunked"));
        assert!(err(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").contains("two different"));
        assert!(err(b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n").contains("too large"));
        assert!(err(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").contains("hexadecimal"));
        assert!(err(b"HTTP/1.1 200 OK\r\nbroken\r\n\r\n").contains("no colon"));
        let eof = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab", true, 16).unwrap_err().to_string();
        assert!(eof.contains("closed after 2 of 4"), "{eof}");
    }

    proptest! {
        /// Fed in two pieces at any split point, a response is incomplete until all of it is
        /// there, then parses the same as in one piece.
        #[test]
        fn any_split(split in 0usize..200, chunked in any::<bool>()) {
            let raw: &[u8] = if chunked {
                b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            } else {
                b"HTTP/1.1 201 Created\r\nContent-Length: 11\r\n\r\nhello world"
            };
            let split = split.min(raw.len());
            if split < raw.len() {
                prop_assert_eq!(parse(&raw[..split], false, 1024), Ok(Parsed::Incomplete));
            }
            let (r, n) = complete(raw);
            prop_assert_eq!((r.status, &r.body[..], n), (201, &b"hello world"[..], raw.len()));
        }
    }
}
