//! A slow REST API for testing sinks: a real HTTP/1.1 server on loopback that accepts POSTed
//! batches of JSON records, counts them, drops duplicates by idempotency key, and answers
//! after a latency that can change while it runs.
//!
//! - **Ingest**: `POST <any path>` with a JSON-lines or JSON-array body and an
//!   `Idempotency-Key` header. A key seen before is answered 200 and counted as a duplicate,
//!   its records are not counted again. Records' `seq` fields are summed (Σ seq, Σ seq²), so a
//!   test can prove every record arrived exactly once; `count` fields too (window results say
//!   how many records they count).
//! - **Latency** per request: from a schedule of phases (`2ms:10s,200ms:10s`: 2 ms for 10 s,
//!   then 200 ms for 10 s, then the server stops), or fixed; `POST /control?latency_ms=40`
//!   (or [`SlowApi::set_latency`]) overrides it until the next phase begins.
//! - **Failure injection**, by request number (every ingest request counts, retries too):
//!   `fail_every` N → 503, `reject_every` N → 400 (checked after `fail_every`),
//!   `lose_response_every` N → the batch is recorded but the connection closes without an
//!   answer (the client must retry, and the retry is a duplicate).
//! - **Hang**: [`SlowApi::hold`] (or `POST /control?hold=1`) — connections are accepted and
//!   requests read, but no answer goes out until released (`hold=0`): an API that stopped
//!   answering; held requests are then answered as usual.
//! - **Control and stats**: `POST /control?latency_ms=..&fail_every=..&reject_every=..&lose_response_every=..&hold=1&stop=1`
//!   (0 turns an injection off), `GET /stats` (JSON, [`SlowApiStats`]).
//! - **Bounded**: binds 127.0.0.1 only; at most `max_connections` connections (more are
//!   answered 503 and closed), bodies up to `max_body_bytes`, at most `max_keys` keys
//!   remembered (then 507); it stops after its phases, after `max_run`, when told, or when
//!   its handle is dropped.
//! - **Log**: optionally one JSON line per ingest request (key, status, records, and the body
//!   of accepted ones), for verification by hand.
//! - **HTTPS**: with [`SlowApiConfig::tls`] (rustls server settings, e.g. from
//!   [`crate::test_pki`]) every connection speaks TLS; a client that refuses the certificate
//!   just ends its connection.

use serde::Serialize;
use std::collections::HashSet;
use std::io::{self, BufWriter, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest request head accepted.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How often blocked threads look at the stop flag.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// One phase of the latency schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    /// Latency of every request in this phase.
    pub latency: Duration,
    /// How long the phase lasts.
    pub duration: Duration,
}

/// Parse a schedule: `2ms:10s,40ms:10s,200ms:10s` (latency:duration, comma separated).
pub fn parse_phases(text: &str) -> Result<Vec<Phase>, String> {
    text.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (latency, duration) = p
                .trim()
                .split_once(':')
                .ok_or_else(|| format!("phase `{p}`: write it as latency:duration, e.g. 40ms:10s"))?;
            Ok(Phase { latency: parse_duration(latency)?, duration: parse_duration(duration)? })
        })
        .collect()
}

/// Parse `250us`, `2ms`, `1.5s`, `2m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number.parse().map_err(|_| format!("`{text}`: not a number followed by us, ms, s or m"))?;
    let secs = match unit {
        "us" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("`{text}`: unknown unit `{unit}`; use us, ms, s or m")),
    };
    if !(secs.is_finite() && (0.0..1e7).contains(&secs)) {
        return Err(format!("`{text}`: out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Settings of the slow API.
#[derive(Debug, Clone)]
pub struct SlowApiConfig {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Latency schedule; empty: `latency` until stopped.
    pub phases: Vec<Phase>,
    /// Latency when there are no phases.
    pub latency: Duration,
    /// Every Nth ingest request is answered 503.
    pub fail_every: Option<u64>,
    /// Every Nth ingest request is answered 400.
    pub reject_every: Option<u64>,
    /// Every Nth ingest request is recorded, then its connection is closed without an answer.
    pub lose_response_every: Option<u64>,
    /// Connections served at once.
    pub max_connections: usize,
    /// The largest body accepted.
    pub max_body_bytes: usize,
    /// Idempotency keys remembered at most.
    pub max_keys: usize,
    /// The server stops after this long whatever else happens.
    pub max_run: Duration,
    /// Append one JSON line per ingest request here.
    pub log: Option<PathBuf>,
    /// Serve HTTPS with these settings (certificate and key); `None`: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for SlowApiConfig {
    fn default() -> Self {
        SlowApiConfig {
            port: 0,
            phases: Vec::new(),
            latency: Duration::from_millis(2),
            fail_every: None,
            reject_every: None,
            lose_response_every: None,
            max_connections: 64,
            max_body_bytes: 16 * 1024 * 1024,
            max_keys: 1_000_000,
            max_run: Duration::from_secs(600),
            log: None,
            tls: None,
        }
    }
}

/// What the server has seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SlowApiStats {
    /// Ingest requests received (failed, rejected and duplicates included).
    pub requests: u64,
    /// Requests whose records were counted (first time their key was seen).
    pub accepted_requests: u64,
    /// Records counted (duplicates not).
    pub records: u64,
    /// Σ of the records' `seq` fields, wrapping.
    pub seq_sum: u64,
    /// Σ of seq², wrapping.
    pub seq_square_sum: u64,
    /// Σ of the records' `count` fields (window results: the records they count), wrapping.
    pub count_sum: u64,
    /// Requests whose key had been seen: answered 200, dropped.
    pub duplicate_requests: u64,
    /// Records in those.
    pub duplicate_records: u64,
    /// Requests without an idempotency key (counted, never deduplicated).
    pub requests_without_key: u64,
    /// 503s injected.
    pub failed: u64,
    /// 400s: injected or invalid JSON.
    pub rejected: u64,
    /// Requests recorded whose answer was withheld (connection closed).
    pub lost_responses: u64,
    /// Body bytes received.
    pub body_bytes: u64,
    /// Connections accepted.
    pub connections: u64,
    /// The latency now, in milliseconds.
    pub latency_ms: f64,
    /// The phase now (0-based; equals the phase count after the last).
    pub phase: usize,
}

struct Shared {
    config: SlowApiConfig,
    started: Instant,
    stop: AtomicBool,
    state: Mutex<State>,
    request_number: AtomicU64,
    fail_every: AtomicU64,
    reject_every: AtomicU64,
    lose_every: AtomicU64,
    active: AtomicUsize,
    /// No answer goes out while set.
    hold: AtomicBool,
}

struct State {
    keys: HashSet<String>,
    stats: SlowApiStats,
    /// A latency set at run time, and the phase it was set in.
    latency_override: Option<(Duration, usize)>,
    log: Option<BufWriter<std::fs::File>>,
}

impl Shared {
    /// The phase now, and its latency (None after the last phase).
    fn phase(&self) -> (usize, Option<Duration>) {
        if self.config.phases.is_empty() {
            return (0, Some(self.config.latency));
        }
        let mut elapsed = self.started.elapsed();
        for (i, p) in self.config.phases.iter().enumerate() {
            if elapsed < p.duration {
                return (i, Some(p.latency));
            }
            elapsed -= p.duration;
        }
        (self.config.phases.len(), None)
    }

    fn latency(&self) -> Duration {
        let (phase, latency) = self.phase();
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match state.latency_override {
            Some((l, set_in)) if set_in == phase => l,
            _ => latency.unwrap_or_default(),
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.started.elapsed() >= self.config.max_run || self.phase().1.is_none()
    }

    /// Wait out the latency for a request that arrived now, in short steps, so a stop is not
    /// held up by a long latency. The latency is read again at each step: a request held by
    /// an API that hangs (a latency of an hour) is answered once the latency drops, as by a
    /// real API that recovers.
    fn delay(&self) {
        let start = Instant::now();
        loop {
            let left = (start + self.latency()).saturating_duration_since(Instant::now());
            if left.is_zero() || self.stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(left.min(POLL_INTERVAL));
        }
    }
}

/// A running slow API. Dropping it stops it.
pub struct SlowApi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SlowApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowApi").field("addr", &self.addr).finish()
    }
}

impl SlowApi {
    /// Bind 127.0.0.1 and serve on threads of its own.
    pub fn start(config: SlowApiConfig) -> io::Result<SlowApi> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, config.port))?;
        // Non-blocking accept: the acceptor looks at the stop flag between attempts.
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let log = match &config.log {
            Some(p) => Some(BufWriter::new(std::fs::OpenOptions::new().create(true).append(true).open(p)?)),
            None => None,
        };
        let shared = Arc::new(Shared {
            started: Instant::now(),
            stop: AtomicBool::new(false),
            state: Mutex::new(State {
                keys: HashSet::new(),
                stats: SlowApiStats::default(),
                latency_override: None,
                log,
            }),
            request_number: AtomicU64::new(0),
            fail_every: AtomicU64::new(config.fail_every.unwrap_or(0)),
            reject_every: AtomicU64::new(config.reject_every.unwrap_or(0)),
            lose_every: AtomicU64::new(config.lose_response_every.unwrap_or(0)),
            active: AtomicUsize::new(0),
            hold: AtomicBool::new(false),
            config,
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new().name("slow-api".into()).spawn(move || accept_loop(listener, s))?;
        Ok(SlowApi { addr, shared, acceptor: Some(acceptor) })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port><path>` (`https://` when it serves TLS).
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.shared.config.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.addr)
    }

    /// What it has seen so far.
    pub fn stats(&self) -> SlowApiStats {
        stats(&self.shared)
    }

    /// Stop answering (`true`): requests are read and held, unanswered, until released
    /// (`false`), then answered as usual.
    pub fn hold(&self, hold: bool) {
        self.shared.hold.store(hold, Ordering::Release);
    }

    /// Answer after `latency` from now until the next phase begins.
    pub fn set_latency(&self, latency: Duration) {
        let phase = self.shared.phase().0;
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).latency_override = Some((latency, phase));
    }

    /// Answer every Nth ingest request 503 (0: never).
    pub fn set_fail_every(&self, n: u64) {
        self.shared.fail_every.store(n, Ordering::Relaxed);
    }

    /// Answer every Nth ingest request 400 (0: never).
    pub fn set_reject_every(&self, n: u64) {
        self.shared.reject_every.store(n, Ordering::Relaxed);
    }

    /// Withhold the answer to every Nth ingest request (0: never).
    pub fn set_lose_response_every(&self, n: u64) {
        self.shared.lose_every.store(n, Ordering::Relaxed);
    }

    /// Whether it has stopped (told to, or its phases or `max_run` are over).
    pub fn is_stopped(&self) -> bool {
        self.shared.stopping()
    }

    /// Wait until it stops by itself (after its phases, `max_run`, or `POST /control?stop=1`).
    pub fn wait(mut self) -> SlowApiStats {
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        self.stats()
    }

    /// Stop now; returns the final stats.
    pub fn stop(self) -> SlowApiStats {
        self.shared.stop.store(true, Ordering::Release);
        self.wait()
    }
}

impl Drop for SlowApi {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

fn stats(shared: &Shared) -> SlowApiStats {
    let latency = shared.latency();
    let phase = shared.phase().0;
    let state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    SlowApiStats { latency_ms: latency.as_secs_f64() * 1e3, phase, ..state.stats.clone() }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stopping() {
        match listener.accept() {
            Ok((stream, _)) => {
                shared.state.lock().unwrap_or_else(|e| e.into_inner()).stats.connections += 1;
                if shared.active.load(Ordering::Acquire) >= shared.config.max_connections {
                    // Over TLS the refusal would need a handshake: the connection just ends.
                    if shared.config.tls.is_none() {
                        let mut stream = stream;
                        let _ = respond(
                            &mut stream,
                            503,
                            "Service Unavailable",
                            b"{\"error\":\"too many connections\"}",
                            true,
                        );
                    }
                    continue;
                }
                shared.active.fetch_add(1, Ordering::AcqRel);
                let s = shared.clone();
                match std::thread::Builder::new().name("slow-api-conn".into()).spawn(move || {
                    let _ = serve(stream, &s);
                    s.active.fetch_sub(1, Ordering::AcqRel);
                }) {
                    Ok(h) => workers.push(h),
                    Err(_) => {
                        shared.active.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                workers.retain(|h| !h.is_finished());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
    // Whatever ended the run ends the connections too.
    shared.stop.store(true, Ordering::Release);
    for h in workers {
        let _ = h.join();
    }
    if let Some(log) = &mut shared.state.lock().unwrap_or_else(|e| e.into_inner()).log {
        let _ = log.flush();
    }
}

/// A served connection: plain TCP, or TLS over it.
trait Peer: Read + Write {
    /// End the connection without an answer.
    fn end(&mut self);
}

impl Peer for TcpStream {
    fn end(&mut self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

impl Peer for rustls::StreamOwned<rustls::ServerConnection, TcpStream> {
    fn end(&mut self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// A parsed request.
struct Request {
    method: String,
    target: String,
    key: Option<String>,
    close: bool,
    body: Vec<u8>,
}

/// Read one request from `stream` (bytes after it stay in `buf`). Ok(None): the client closed
/// or the server is stopping. Err: answered already with the error status, close.
fn read_request(stream: &mut impl Peer, buf: &mut Vec<u8>, shared: &Shared) -> io::Result<Option<Request>> {
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD_BYTES {
            respond(stream, 431, "Request Header Fields Too Large", b"{}", true)?;
            return Err(io::Error::other("head too large"));
        }
        match read_some(stream, &mut chunk, shared)? {
            0 => return Ok(None),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end - 4]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let (method, target, version) = (
        request_line.next().unwrap_or_default().to_owned(),
        request_line.next().unwrap_or_default().to_owned(),
        request_line.next().unwrap_or_default(),
    );
    if !version.starts_with("HTTP/1.") {
        respond(stream, 400, "Bad Request", b"{\"error\":\"not an HTTP/1.x request\"}", true)?;
        return Err(io::Error::other("bad request line"));
    }
    let (mut length, mut key, mut close) = (0usize, None, version == "HTTP/1.0");
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().unwrap_or(usize::MAX),
            "transfer-encoding" => {
                respond(
                    stream,
                    501,
                    "Not Implemented",
                    b"{\"error\":\"send a Content-Length body, not chunked\"}",
                    true,
                )?;
                return Err(io::Error::other("chunked request"));
            }
            "idempotency-key" => key = Some(value.to_owned()),
            "connection" => close |= value.eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    if length > shared.config.max_body_bytes {
        respond(stream, 413, "Content Too Large", b"{\"error\":\"body too large\"}", true)?;
        return Err(io::Error::other("body too large"));
    }
    buf.drain(..head_end);
    while buf.len() < length {
        match read_some(stream, &mut chunk, shared)? {
            0 => return Ok(None),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body: Vec<u8> = buf.drain(..length).collect();
    Ok(Some(Request { method, target, key, close, body }))
}

/// Read with a short timeout, looking at the stop flag between tries.
fn read_some(stream: &mut impl Peer, chunk: &mut [u8], shared: &Shared) -> io::Result<usize> {
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(0);
        }
        match stream.read(chunk) {
            Ok(n) => return Ok(n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

fn respond(stream: &mut impl Peer, status: u16, reason: &str, body: &[u8], close: bool) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n",
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    )
    .into_bytes();
    out.extend_from_slice(body);
    stream.write_all(&out)?;
    stream.flush()
}

fn serve(stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_read_timeout(Some(POLL_INTERVAL * 5))?;
    let _ = stream.set_nodelay(true);
    match &shared.config.tls {
        None => serve_on(stream, shared),
        Some(config) => {
            let conn = rustls::ServerConnection::new(config.clone()).map_err(io::Error::other)?;
            serve_on(rustls::StreamOwned::new(conn, stream), shared)
        }
    }
}

fn serve_on(mut stream: impl Peer, shared: &Shared) -> io::Result<()> {
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut stream, &mut buf, shared)? {
        let path = req.target.split('?').next().unwrap_or_default();
        let keep = match (req.method.as_str(), path) {
            ("GET", "/stats") => {
                let body = serde_json::to_vec(&stats(shared)).unwrap_or_default();
                respond(&mut stream, 200, "OK", &body, req.close)?;
                !req.close
            }
            ("POST", "/control") => control(&mut stream, &req, shared)?,
            ("POST", _) => ingest(&mut stream, &req, shared)?,
            _ => {
                respond(
                    &mut stream,
                    404,
                    "Not Found",
                    b"{\"error\":\"POST records, POST /control, GET /stats\"}",
                    req.close,
                )?;
                !req.close
            }
        };
        if !keep {
            break;
        }
    }
    Ok(())
}

/// `POST /control?latency_ms=40&fail_every=5&stop=1`.
fn control(stream: &mut impl Peer, req: &Request, shared: &Shared) -> io::Result<bool> {
    let query = req.target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let mut done = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let number = value.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
        let Some(number) = number else {
            let body = format!("{{\"error\":\"`{name}` needs a non-negative number\"}}");
            respond(stream, 400, "Bad Request", body.as_bytes(), req.close)?;
            return Ok(!req.close);
        };
        match name {
            "latency_ms" => {
                let phase = shared.phase().0;
                shared.state.lock().unwrap_or_else(|e| e.into_inner()).latency_override =
                    Some((Duration::from_secs_f64(number / 1e3), phase));
            }
            "fail_every" => shared.fail_every.store(number as u64, Ordering::Relaxed),
            "reject_every" => shared.reject_every.store(number as u64, Ordering::Relaxed),
            "lose_response_every" => shared.lose_every.store(number as u64, Ordering::Relaxed),
            "stop" => shared.stop.store(number > 0.0, Ordering::Release),
            "hold" => shared.hold.store(number > 0.0, Ordering::Release),
            _ => {
                let body = format!(
                    "{{\"error\":\"unknown control `{name}`; use latency_ms, fail_every, reject_every, lose_response_every, hold, stop\"}}"
                );
                respond(stream, 400, "Bad Request", body.as_bytes(), req.close)?;
                return Ok(!req.close);
            }
        }
        done.push(name);
    }
    let body = serde_json::to_vec(&serde_json::json!({ "applied": done, "stats": stats(shared) })).unwrap_or_default();
    respond(stream, 200, "OK", &body, true)?;
    Ok(false)
}

/// Count the records of a JSON-lines or JSON-array body: (records, Σ seq, Σ seq², Σ count).
fn count_records(body: &[u8]) -> Result<(u64, u64, u64, u64), String> {
    let mut totals = (0u64, 0u64, 0u64, 0u64);
    let mut add = |v: &serde_json::Value| {
        totals.0 += 1;
        if let Some(seq) = v.get("seq").and_then(|s| s.as_u64()) {
            totals.1 = totals.1.wrapping_add(seq);
            totals.2 = totals.2.wrapping_add(seq.wrapping_mul(seq));
        }
        if let Some(count) = v.get("count").and_then(|s| s.as_u64()) {
            totals.3 = totals.3.wrapping_add(count);
        }
    };
    let text = std::str::from_utf8(body).map_err(|_| "the body is not UTF-8".to_owned())?;
    if text.trim_start().starts_with('[') {
        let values: Vec<serde_json::Value> =
            serde_json::from_str(text).map_err(|e| format!("invalid JSON array: {e}"))?;
        values.iter().for_each(&mut add);
    } else {
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| format!("invalid JSON on line {}: {e}", i + 1))?;
            add(&v);
        }
    }
    Ok(totals)
}

fn every(n: u64, counter: &AtomicU64) -> bool {
    let every = counter.load(Ordering::Relaxed);
    every > 0 && n.is_multiple_of(every)
}

/// Handle one batch; returns whether the connection stays open.
fn ingest(stream: &mut impl Peer, req: &Request, shared: &Shared) -> io::Result<bool> {
    let n = shared.request_number.fetch_add(1, Ordering::Relaxed) + 1;
    shared.delay();
    while shared.hold.load(Ordering::Acquire) && !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(POLL_INTERVAL);
    }
    let keep = !req.close;
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    let st = &mut state.stats;
    st.requests += 1;
    st.body_bytes += req.body.len() as u64;
    let (status, records, duplicate, lose, answer): (u16, u64, bool, bool, String) = if every(n, &shared.fail_every) {
        st.failed += 1;
        (503, 0, false, false, format!("{{\"error\":\"injected failure (request {n})\"}}"))
    } else if every(n, &shared.reject_every) {
        st.rejected += 1;
        (400, 0, false, false, format!("{{\"error\":\"rejected by failure injection (request {n})\"}}"))
    } else {
        match count_records(&req.body) {
            Err(e) => {
                st.rejected += 1;
                (400, 0, false, false, serde_json::json!({ "error": e }).to_string())
            }
            Ok((records, seq_sum, seq_square_sum, count_sum)) => {
                let seen = req.key.as_ref().is_some_and(|k| state.keys.contains(k));
                let full = req.key.is_some() && !seen && state.keys.len() >= shared.config.max_keys;
                let st = &mut state.stats;
                if seen {
                    st.duplicate_requests += 1;
                    st.duplicate_records += records;
                    (200, records, true, false, format!("{{\"records\":{records},\"duplicate\":true}}"))
                } else if full {
                    (507, 0, false, false, "{\"error\":\"the key set is full (max_keys)\"}".into())
                } else {
                    st.accepted_requests += 1;
                    st.records += records;
                    st.seq_sum = st.seq_sum.wrapping_add(seq_sum);
                    st.seq_square_sum = st.seq_square_sum.wrapping_add(seq_square_sum);
                    st.count_sum = st.count_sum.wrapping_add(count_sum);
                    if req.key.is_none() {
                        st.requests_without_key += 1;
                    }
                    let lose = every(n, &shared.lose_every);
                    if lose {
                        st.lost_responses += 1;
                    }
                    if let Some(k) = &req.key {
                        state.keys.insert(k.clone());
                    }
                    (200, records, false, lose, format!("{{\"records\":{records}}}"))
                }
            }
        }
    };
    if let Some(log) = &mut state.log {
        let mut line = serde_json::json!({
            "t_ms": shared.started.elapsed().as_millis() as u64,
            "request": n,
            "key": req.key,
            "status": status,
            "records": records,
            "duplicate": duplicate,
            "lost_response": lose,
        });
        if status == 200 && !duplicate {
            line["body"] = serde_json::Value::String(String::from_utf8_lossy(&req.body).into_owned());
        }
        let _ = writeln!(log, "{line}");
    }
    drop(state);
    if lose {
        // The batch is recorded; the client never learns it: its retry must be a duplicate.
        stream.end();
        return Ok(false);
    }
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        503 => "Service Unavailable",
        _ => "Insufficient Storage",
    };
    respond(stream, status, reason, answer.as_bytes(), !keep)?;
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(api: &SlowApi, path: &str, key: Option<&str>, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(api.addr()).unwrap();
        let key = key.map(|k| format!("Idempotency-Key: {k}\r\n")).unwrap_or_default();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{key}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, out)
    }

    /// Schedules and durations parse; mistakes are explained.
    #[test]
    fn phases_parse() {
        let p = parse_phases("2ms:10s, 40ms:1.5s,200us:2m").unwrap();
        assert_eq!(p[0], Phase { latency: Duration::from_millis(2), duration: Duration::from_secs(10) });
        assert_eq!(p[1].duration, Duration::from_millis(1500));
        assert_eq!(p[2], Phase { latency: Duration::from_micros(200), duration: Duration::from_secs(120) });
        assert!(parse_phases("2ms").unwrap_err().contains("latency:duration"));
        assert!(parse_duration("3h").unwrap_err().contains("unknown unit"));
    }

    /// Records are counted once per key, seq fields summed, injections and controls work.
    #[test]
    fn counts_dedups_and_injects() {
        let api = SlowApi::start(SlowApiConfig { latency: Duration::ZERO, ..Default::default() }).unwrap();
        assert_eq!(post(&api, "/in", Some("a"), "{\"seq\":1}\n{\"seq\":2}\n").0, 200);
        assert_eq!(post(&api, "/in", Some("a"), "{\"seq\":1}\n{\"seq\":2}\n").0, 200);
        assert_eq!(post(&api, "/in", Some("b"), "[{\"seq\":3}]").0, 200);
        assert_eq!(post(&api, "/in", Some("c"), "{nope").0, 400);
        let (status, _) = post(&api, "/control?fail_every=1&latency_ms=1", None, "");
        assert_eq!(status, 200);
        assert_eq!(post(&api, "/in", Some("d"), "{}").0, 503);
        let s = api.stats();
        assert_eq!((s.records, s.seq_sum, s.seq_square_sum), (3, 6, 14));
        assert_eq!((s.duplicate_requests, s.duplicate_records, s.rejected, s.failed), (1, 2, 1, 1));
        assert_eq!(s.latency_ms, 1.0);
        assert_eq!(post(&api, "/control?stop=1", None, "").0, 200);
        api.wait();
    }

    /// After its last phase the server stops by itself.
    #[test]
    fn stops_after_phases() {
        let phases = parse_phases("0ms:50ms").unwrap();
        let api = SlowApi::start(SlowApiConfig { phases, ..Default::default() }).unwrap();
        let stats = api.wait();
        assert_eq!(stats.phase, 1);
    }
}
