//! The control socket: how `weir savepoint` and `weir stop --savepoint` reach a running job.
//!
//! A job that takes checkpoints listens on `control.sock` in its run directory: a Unix
//! socket, mode 0600, in a directory that is this user's alone (0700, checked when it was
//! made), so only this user (and root) can connect. One request per connection, one JSON
//! line each way:
//!
//! ```text
//!  → {"savepoint":"/abs/dir","stop":false}
//!  ← {"ok":{"id":12,"dir":"/abs/dir","bytes":1048576,"stopped":false}}   or   {"error":"..."}
//! ```
//!
//! The answer comes once the savepoint is complete (its manifest written in its directory),
//! and, with `"stop":true`, once every subtask has committed it and been told to stop.

use super::SavepointError;
use super::coordinator::{Msg, SavepointRequest, SavepointTaken};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

/// The socket's name in the run directory.
pub const CONTROL_SOCKET: &str = "control.sock";

/// How often the listener looks for a stop while no one connects.
const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// How long a client may take to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Request {
    savepoint: PathBuf,
    #[serde(default)]
    stop: bool,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    Ok(SavepointTaken),
    Error(String),
}

/// The listening thread of a running job; stopped (and its socket removed) when dropped.
pub(crate) struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Listen on `run_dir/control.sock`; requests go to the coordinator through `tx`, and
    /// an answer is waited for at most `timeout` (the checkpoint timeout, and as long again
    /// for the sinks' commits of a stop).
    pub(crate) fn spawn(run_dir: &Path, tx: Sender<Msg>, timeout: Duration) -> std::io::Result<ControlServer> {
        let path = run_dir.join(CONTROL_SOCKET);
        // A leftover of a run that used this (given) directory and was killed.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name("weir-control".into()).spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => serve(conn, &tx, timeout),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
                    Err(e) => {
                        tracing::warn!("control socket: cannot accept: {e}");
                        std::thread::sleep(ACCEPT_POLL);
                    }
                }
            }
        })?;
        Ok(ControlServer { path, stop, thread: Some(thread) })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One connection: read the request, ask the coordinator, write the answer.
fn serve(conn: UnixStream, tx: &Sender<Msg>, timeout: Duration) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(REQUEST_TIMEOUT));
    let mut line = String::new();
    let reply = match BufReader::new(&conn).read_line(&mut line) {
        Err(e) => Reply::Error(format!("cannot read the request: {e}")),
        Ok(_) => match serde_json::from_str::<Request>(&line) {
            Err(e) => Reply::Error(format!("not a request ({e}): send {{\"savepoint\":\"/abs/dir\",\"stop\":false}}")),
            Ok(req) if !req.savepoint.is_absolute() => Reply::Error(format!(
                "{}: give the savepoint's directory as an absolute path (the job's working directory is not yours)",
                req.savepoint.display()
            )),
            Ok(req) => match ask(tx, req.savepoint, req.stop, timeout, &|| None) {
                Ok(taken) => Reply::Ok(taken),
                Err(SavepointError::Failed(why)) => Reply::Error(why),
                Err(e) => Reply::Error(e.to_string()),
            },
        },
    };
    let mut conn = conn;
    let mut out = serde_json::to_vec(&reply).expect("a reply serializes");
    out.push(b'\n');
    let _ = conn.write_all(&out);
}

/// Ask the coordinator behind `tx` for a savepoint into `dir` (and a stop after it), and
/// wait for the answer at most `timeout`, or until `gone` says why none will come (a
/// subtask failed: it acks no barrier).
pub(crate) fn ask(
    tx: &Sender<Msg>,
    dir: PathBuf,
    stop: bool,
    timeout: Duration,
    gone: &dyn Fn() -> Option<String>,
) -> Result<SavepointTaken, SavepointError> {
    let failed = SavepointError::Failed;
    let (reply, answer) = std::sync::mpsc::channel();
    tx.send(Msg::Savepoint(SavepointRequest { dir, stop, reply }))
        .map_err(|_| failed("the job is not taking checkpoints any more (it is ending)".to_owned()))?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match answer.recv_timeout(left.min(GONE_POLL)) {
            Ok(r) => return r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if left > GONE_POLL => {
                if let Some(why) = gone() {
                    return Err(failed(format!("the job cannot take it: {why}")));
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                return Err(failed(format!(
                    "no answer within {:.0} s (the checkpoint timeout, twice)",
                    timeout.as_secs_f64()
                )));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(failed("the job ended before the savepoint was complete".to_owned()));
            }
        }
    }
}

/// How often a wait for a savepoint looks whether the job can still take it.
const GONE_POLL: Duration = Duration::from_millis(100);

/// Why `weir savepoint` could not get one from a running job.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The run directory does not have a control socket, or it cannot be reached.
    #[error("cannot reach the job in {}: {reason}", run_dir.display())]
    Unreachable {
        /// The run directory given.
        run_dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// The job answered with an error.
    #[error("the job refused: {0}")]
    Refused(String),
}

/// Ask the job running in `run_dir` (its run directory: `weir run` prints it; the one whose
/// `counters` file `weir-stat` reads) for a savepoint into `dir`, and to stop right after it
/// if `stop`. Waits for the answer; the job bounds it (by its checkpoint timeout).
pub fn request_savepoint(run_dir: &Path, dir: &Path, stop: bool) -> Result<SavepointTaken, ControlError> {
    // The counters file `weir-stat` is given names the run directory too.
    let run_dir = if run_dir.is_file() { run_dir.parent().unwrap_or(run_dir) } else { run_dir };
    let unreachable = |reason: String| ControlError::Unreachable { run_dir: run_dir.to_owned(), reason };
    if !run_dir.is_dir() {
        return Err(unreachable("no such directory (the job has ended, or this is not its run directory)".into()));
    }
    weir_ring::private_file::private_dir(run_dir).map_err(|e| unreachable(e.to_string()))?;
    let path = run_dir.join(CONTROL_SOCKET);
    if !path.exists() {
        return Err(unreachable(format!(
            "no {CONTROL_SOCKET} there: the job is not running, or takes no checkpoints (a savepoint needs \
             checkpoint_dir)"
        )));
    }
    let dir = std::path::absolute(dir).map_err(|e| unreachable(format!("{}: {e}", dir.display())))?;
    let mut conn = UnixStream::connect(&path).map_err(|e| unreachable(format!("{}: {e}", path.display())))?;
    let mut req = serde_json::to_vec(&Request { savepoint: dir, stop }).expect("a request serializes");
    req.push(b'\n');
    conn.write_all(&req).map_err(|e| unreachable(format!("cannot send the request: {e}")))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line).map_err(|e| unreachable(format!("no answer: {e}")))?;
    match serde_json::from_str::<Reply>(&line) {
        Ok(Reply::Ok(taken)) => Ok(taken),
        Ok(Reply::Error(e)) => Err(ControlError::Refused(e)),
        Err(e) => Err(unreachable(format!("an answer that does not read ({e}): {line:?}"))),
    }
}
