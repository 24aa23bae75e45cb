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

/// Interim (1xx) responses accepted before the final one.
const MAX_INTERIM: u32 = 16;
/// Trailer bytes accepted after the last chunk.
const MAX_TRAILER_BYTES: usize = 16 * 1024;
/// The longest chunk-size line (with extensions).
const MAX_CHUNK_LINE_BYTES: usize = 1024;

/// Parse the response at the start of `buf` in one go (see [`ResponseParser`]).
#[cfg(test)]
pub(crate) fn parse(buf: &[u8], eof: bool, max_body_bytes: usize) -> Result<Parsed, ResponseError> {
    ResponseParser::default().parse(buf, eof, max_body_bytes)
}

fn malformed(what: impl Into<String>) -> ResponseError {
    ResponseError::Malformed(what.into())
}

/// A response head, as parsed.
#[derive(Debug, Clone)]
struct Head {
    status: u16,
    reason: String,
    keep_alive: bool,
    retry_after_s: Option<u64>,
    /// Its length, with the empty line.
    len: usize,
    framing: Framing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Chunked,
    Length(usize),
    UntilClose,
}

/// Parses one response from a buffer that grows between calls (the connection's receive
/// buffer): each call goes on where the last stopped, so a response trickled in byte by byte
/// costs time linear in its length, and every part a peer controls is bounded: the head
/// (64 KiB), interim responses (16), the body (`max_body_bytes`), chunk-size lines (1 KiB),
/// trailers (16 KiB), and the bytes of chunk framing (the body's size again, plus 64 KiB).
/// Reset (`Default`) for the next response.
#[derive(Debug, Default)]
pub(crate) struct ResponseParser {
    /// Where the response being parsed starts (after interim responses).
    start: usize,
    interim: u32,
    /// Bytes after `start` already searched for the end of the head.
    scanned: usize,
    head: Option<Head>,
    /// Chunked: the next unread byte, after `start`.
    at: usize,
    body: Vec<u8>,
    /// Chunked: trailer bytes so far, once the last chunk was read.
    trailers: Option<usize>,
}

impl ResponseParser {
    /// Parse what `buf` holds (the same bytes as last time, and maybe more). `eof`: the peer
    /// closed the connection after these bytes.
    pub(crate) fn parse(&mut self, buf: &[u8], eof: bool, max_body_bytes: usize) -> Result<Parsed, ResponseError> {
        loop {
            let Some(head) = self.head(buf, eof)? else { return Ok(Parsed::Incomplete) };
            if (100..200).contains(&head.status) {
                // An interim response (100 Continue, 103 Early Hints): the final one follows.
                self.interim += 1;
                if self.interim > MAX_INTERIM {
                    return Err(ResponseError::TooLarge(format!("more than {MAX_INTERIM} interim (1xx) responses")));
                }
                self.start += head.len;
                self.scanned = 0;
                self.head = None;
                continue;
            }
            let rest = &buf[self.start + head.len..];
            let body = match head.framing {
                Framing::None => Some((Vec::new(), 0)),
                Framing::Chunked => match self.dechunk(rest, max_body_bytes)? {
                    Some(x) => Some(x),
                    None if eof => return Err(malformed("the connection closed inside a chunked body")),
                    None => None,
                },
                Framing::Length(n) => {
                    if n > max_body_bytes {
                        return Err(ResponseError::TooLarge(format!("Content-Length {n} (limit {max_body_bytes})")));
                    }
                    if rest.len() < n {
                        if eof {
                            return Err(malformed(format!(
                                "the connection closed after {} of {n} body bytes",
                                rest.len()
                            )));
                        }
                        None
                    } else {
                        Some((rest[..n].to_vec(), n))
                    }
                }
                Framing::UntilClose => {
                    if rest.len() > max_body_bytes {
                        return Err(ResponseError::TooLarge(format!("an unframed body over {max_body_bytes} bytes")));
                    }
                    eof.then(|| (rest.to_vec(), rest.len()))
                }
            };
            let Some((body, used)) = body else { return Ok(Parsed::Incomplete) };
            let response = Response {
                status: head.status,
                reason: head.reason,
                keep_alive: head.keep_alive,
                retry_after_s: head.retry_after_s,
                body,
            };
            return Ok(Parsed::Complete(response, self.start + head.len + used));
        }
    }

    /// The head of the response at `start`, once it is whole.
    fn head(&mut self, buf: &[u8], eof: bool) -> Result<Option<Head>, ResponseError> {
        if let Some(h) = &self.head {
            return Ok(Some(h.clone()));
        }
        let at = &buf[self.start..];
        // The end may straddle what was searched last time: back up 3 bytes.
        let from = self.scanned.saturating_sub(3);
        let Some(end) = find(&at[from..], b"\r\n\r\n").map(|i| from + i + 4) else {
            self.scanned = at.len();
            if at.len() > MAX_HEAD_BYTES {
                return Err(ResponseError::TooLarge(format!("no end of the head within {MAX_HEAD_BYTES} bytes")));
            }
            if eof {
                return Err(malformed(format!("the connection closed inside the response head ({} bytes)", at.len())));
            }
            return Ok(None);
        };
        if end > MAX_HEAD_BYTES {
            return Err(ResponseError::TooLarge(format!("a head of {end} bytes (limit {MAX_HEAD_BYTES})")));
        }
        let head = parse_head(&at[..end - 4], end)?;
        self.head = Some(head.clone());
        Ok(Some(head))
    }

    /// Go on decoding a chunked body (`buf`: from the body's start): `(body, bytes used)`
    /// once the last chunk and the trailers are in.
    fn dechunk(&mut self, buf: &[u8], max_body_bytes: usize) -> Result<Option<(Vec<u8>, usize)>, ResponseError> {
        loop {
            // Framing beyond the body itself is bounded too (1-byte chunks with long
            // extensions would otherwise let the buffer grow far past the body limit).
            let framing = self.at - self.body.len();
            if framing > self.body.len() + MAX_HEAD_BYTES {
                return Err(ResponseError::TooLarge(format!(
                    "chunk framing over {framing} bytes for a body of {}",
                    self.body.len()
                )));
            }
            if let Some(seen) = self.trailers {
                let Some(eol) = find(&buf[self.at..], b"\r\n") else {
                    if seen + buf.len() - self.at > MAX_TRAILER_BYTES {
                        return Err(ResponseError::TooLarge(format!("trailers over {MAX_TRAILER_BYTES} bytes")));
                    }
                    return Ok(None);
                };
                self.at += eol + 2;
                if eol == 0 {
                    return Ok(Some((std::mem::take(&mut self.body), self.at)));
                }
                if seen + eol + 2 > MAX_TRAILER_BYTES {
                    return Err(ResponseError::TooLarge(format!("trailers over {MAX_TRAILER_BYTES} bytes")));
                }
                self.trailers = Some(seen + eol + 2);
                continue;
            }
            let Some(eol) = find(&buf[self.at..], b"\r\n") else {
                return if buf.len() - self.at > MAX_CHUNK_LINE_BYTES {
                    Err(malformed("a chunk-size line over 1 KiB"))
                } else {
                    Ok(None)
                };
            };
            if eol > MAX_CHUNK_LINE_BYTES {
                return Err(malformed("a chunk-size line over 1 KiB"));
            }
            let line = std::str::from_utf8(&buf[self.at..self.at + eol])
                .map_err(|_| malformed("a chunk-size line is not UTF-8"))?;
            let size_text = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_text, 16)
                .map_err(|_| malformed(format!("chunk size `{}` is not hexadecimal", clip(size_text))))?;
            if size == 0 {
                self.at += eol + 2;
                self.trailers = Some(0);
                continue;
            }
            if self.body.len().saturating_add(size) > max_body_bytes {
                return Err(ResponseError::TooLarge(format!("a chunked body over {max_body_bytes} bytes")));
            }
            let data = self.at + eol + 2;
            if buf.len() < data + size + 2 {
                return Ok(None);
            }
            if &buf[data + size..data + size + 2] != b"\r\n" {
                return Err(malformed("a chunk is not followed by CRLF"));
            }
            self.body.extend_from_slice(&buf[data..data + size]);
            self.at = data + size + 2;
        }
    }
}

/// The status line and headers (`text`, without the empty line); `len` is the head's length.
fn parse_head(text: &[u8], len: usize) -> Result<Head, ResponseError> {
    let head = std::str::from_utf8(text).map_err(|_| malformed("the head is not UTF-8"))?;
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
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        // No framing: the body is everything until the peer closes.
        keep_alive = false;
        Framing::UntilClose
    };
    Ok(Head { status, reason, keep_alive, retry_after_s, len, framing })
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

    /// Fed a byte at a time through one parser, a response parses as in one piece; each
    /// call goes on from where the last stopped.
    #[test]
    fn byte_by_byte_through_one_parser() {
        let raw = b"HTTP/1.1 103 Early\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nT: 1\r\n\r\n";
        let mut p = ResponseParser::default();
        for end in 1..raw.len() {
            assert_eq!(p.parse(&raw[..end], false, 1024), Ok(Parsed::Incomplete), "at {end}");
        }
        let Ok(Parsed::Complete(r, n)) = p.parse(raw, false, 1024) else { panic!() };
        assert_eq!((r.status, &r.body[..], n), (200, &b"hello"[..], raw.len()));
    }

    /// What a hostile server sends to grow the buffer for ever is refused at its bound:
    /// endless trailers, endless interim responses, framing far larger than the body.
    #[test]
    fn hostile_floods_are_bounded() {
        let mut trailers = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n".to_vec();
        let mut interim = Vec::new();
        let mut tiny_chunks = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..10_000 {
            trailers.extend_from_slice(b"X-Flood: 0123456789\r\n");
            interim.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            tiny_chunks.extend_from_slice(b"1;ext=0123456789012345678901234567890123456789\r\nx\r\n");
        }
        for (raw, says) in [(&trailers, "trailers over"), (&interim, "interim"), (&tiny_chunks, "framing over")] {
            let mut p = ResponseParser::default();
            let mut got = Ok(Parsed::Incomplete);
            // Fed as a trickle, in 100-byte steps.
            for end in (100..raw.len()).step_by(100) {
                got = p.parse(&raw[..end], false, 1 << 20);
                if got.is_err() {
                    break;
                }
            }
            let e = got.expect_err(says).to_string();
            assert!(e.contains(says), "{e}");
        }
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
