//! A hostile HTTP/1.1 server on loopback, for testing that a client's buffers stay bounded:
//! every request is answered with a response that never ends the way the client waits for.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// A chunked 200 whose last chunk is followed by trailer lines without end.
    TrailerFlood,
    /// `100 Continue` responses without end, never the final one.
    InterimFlood,
    /// A chunked 200 of 1-byte chunks, each with a long extension, without end.
    TinyChunks,
    /// Nothing at all: the request is read and never answered (the connection stays open).
    Silent,
}

/// The server, stopped when dropped.
#[derive(Debug)]
pub struct HostileServer {
    port: u16,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// The most a connection is sent: a client that reads this much has no bound.
pub const MAX_SENT_PER_CONNECTION: u64 = 256 << 20;

impl HostileServer {
    /// Listen on 127.0.0.1 (a free port) and answer every request with `attack`.
    pub fn start(attack: Attack) -> std::io::Result<HostileServer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let thread = std::thread::Builder::new().name("hostile-http".into()).spawn({
            let (stop, sent) = (stop.clone(), sent.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let (stop, sent) = (stop.clone(), sent.clone());
                            std::thread::spawn(move || serve(conn, attack, &stop, &sent));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }
        })?;
        Ok(HostileServer { port, stop, sent, thread: Some(thread) })
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Bytes sent to clients so far, all connections together.
    pub fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Read the request's head, then send the attack until the client stops reading (its
/// socket closes) or [`MAX_SENT_PER_CONNECTION`].
fn serve(mut conn: TcpStream, attack: Attack, stop: &AtomicBool, sent: &AtomicU64) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let (first, repeat): (&[u8], &[u8]) = match attack {
        Attack::TrailerFlood => {
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n", b"X-Flood: 0123456789abcdef\r\n")
        }
        Attack::InterimFlood => (b"", b"HTTP/1.1 100 Continue\r\n\r\n"),
        Attack::Silent => {
            while !stop.load(Ordering::Relaxed) {
                match conn.read(&mut buf) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => return,
                }
            }
            return;
        }
        Attack::TinyChunks => (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"1;padding=0123456789012345678901234567890123456789\r\nx\r\n",
        ),
    };
    let mut flood = Vec::new();
    while flood.len() < 16 * 1024 {
        flood.extend_from_slice(repeat);
    }
    let mut total = 0u64;
    let mut out: &[u8] = first;
    while !stop.load(Ordering::Relaxed) && total < MAX_SENT_PER_CONNECTION {
        if out.is_empty() {
            out = &flood;
        }
        match conn.write(out) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                total += n as u64;
                sent.fetch_add(n as u64, Ordering::Relaxed);
                out = &out[n..];
            }
        }
    }
}
