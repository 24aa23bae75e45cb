//! Helpers the ring's integration tests share: a record format that checks itself
//! (sequence number, length, checksum), a seeded RNG, a progress watchdog, a private
//! temporary run directory, and re-running this test binary as a child process.
//!
//! Each test binary uses only some of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Records that check themselves
// ---------------------------------------------------------------------------------------

/// Bytes of the self-check at the start of every test record: seq (u64 LE), checksum (u64 LE).
pub const CHECK_BYTES: usize = 16;

/// A 64-bit mix (splitmix64's finalizer): every seq gets a well-spread number.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The payload length of record `seq`, from `CHECK_BYTES` to `max` (which must be at least
/// `CHECK_BYTES + 64`). Mostly small; some end exactly on a slot boundary; one in sixteen is
/// large, so records often do not fit before the ring's end and the producer pads.
pub fn record_len(seq: u64, max: usize, slot_bytes: usize) -> usize {
    let h = mix(seq);
    let pick = (h >> 32) as usize;
    match h % 16 {
        // Large: up to the max record size.
        0 => CHECK_BYTES + pick % (max - CHECK_BYTES + 1),
        // Header + payload fill whole slots exactly: 1 to 4 slots.
        1 => ((pick % 4) + 1) * slot_bytes - 8,
        _ => CHECK_BYTES + pick % 100,
    }
    .clamp(CHECK_BYTES, max)
}

/// The checksum of a record: a multiply-xor-rotate over its seq and its bytes after the
/// check words, a word at a time.
pub fn checksum(seq: u64, body: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seq;
    let mut chunks = body.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().unwrap());
        h = (h ^ word).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(last) ^ (body.len() as u64) << 56).wrapping_mul(0x0000_0100_0000_01b3);
    h ^ (h >> 32)
}

/// Fill `buf` as record `seq`: seq, checksum, then bytes that depend on seq (so a stale
/// record from an earlier lap of the ring cannot pass for a new one).
pub fn write_record(seq: u64, buf: &mut [u8]) {
    assert!(buf.len() >= CHECK_BYTES, "test records hold at least {CHECK_BYTES} bytes");
    let mut state = mix(seq ^ 0x5555);
    for chunk in buf[CHECK_BYTES..].chunks_mut(8) {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    let sum = checksum(seq, &buf[CHECK_BYTES..]);
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..CHECK_BYTES].copy_from_slice(&sum.to_le_bytes());
}

/// Check that `buf` is record `expected_seq` of the stream, whole: its seq, its length and
/// its checksum. The error says what was wrong.
pub fn check_record(expected_seq: u64, buf: &[u8], max: usize, slot_bytes: usize) -> Result<(), String> {
    if buf.len() < CHECK_BYTES {
        return Err(format!(
            "record expected as seq {expected_seq}: {} bytes, shorter than its check words",
            buf.len()
        ));
    }
    let seq = u64::from_le_bytes(buf[..8].try_into().unwrap());
    if seq != expected_seq {
        let what = if seq < expected_seq { "duplicate or stale" } else { "records missing" };
        return Err(format!("expected seq {expected_seq}, got {seq} ({what})"));
    }
    let want_len = record_len(seq, max, slot_bytes);
    if buf.len() != want_len {
        return Err(format!("seq {seq}: {} bytes, written with {want_len}", buf.len()));
    }
    let stored = u64::from_le_bytes(buf[8..CHECK_BYTES].try_into().unwrap());
    let sum = checksum(seq, &buf[CHECK_BYTES..]);
    if stored != sum {
        return Err(format!("seq {seq}: checksum {sum:#018x}, record says {stored:#018x} (corrupt)"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Determinism
// ---------------------------------------------------------------------------------------

/// xorshift64*: a tiny seeded RNG, so a test's random choices repeat run after run.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (any value; zero is remapped).
    pub fn new(seed: u64) -> XorShift {
        XorShift(mix(seed) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-enough in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

// ---------------------------------------------------------------------------------------
// Watchdog
// ---------------------------------------------------------------------------------------

/// Aborts the whole process, with a message, when `progress` has not moved for `stall`:
/// a deadlocked test fails instead of hanging. It does not bound the run time: a slow but
/// moving test (a loaded machine, a debug build) is left alone.
#[derive(Debug)]
pub struct Watchdog {
    progress: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

/// How long a test may go without progress before its watchdog aborts it.
pub const STALL: Duration = Duration::from_secs(120);

impl Watchdog {
    /// Start watching; `name` goes into the abort message.
    pub fn start(name: &'static str, stall: Duration) -> Watchdog {
        let progress = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let (p, d) = (progress.clone(), done.clone());
        std::thread::Builder::new()
            .name(format!("watchdog-{name}"))
            .spawn(move || {
                let mut last = p.load(Ordering::Relaxed);
                let mut since = Instant::now();
                while !d.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    let now = p.load(Ordering::Relaxed);
                    if now != last {
                        last = now;
                        since = Instant::now();
                    } else if since.elapsed() >= stall {
                        eprintln!(
                            "watchdog: test `{name}` made no progress for {} s (stuck at progress {now}): deadlock? aborting",
                            stall.as_secs()
                        );
                        std::process::abort();
                    }
                }
            })
            .expect("spawn watchdog thread");
        Watchdog { progress, done }
    }

    /// A handle to report progress through (any change counts).
    pub fn progress(&self) -> Arc<AtomicU64> {
        self.progress.clone()
    }

    /// Report progress.
    pub fn tick(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------
// Files and processes
// ---------------------------------------------------------------------------------------

/// A private run directory (mode 0700) under /dev/shm (or the system temp dir), named
/// after the test and our pid; removed with everything in it on drop, pass or fail.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory for the test `tag` (unique within this process).
    pub fn new(tag: &str) -> TempDir {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_owned() } else { std::env::temp_dir() };
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("weir-ring-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new().mode(0o700).create(&path).unwrap_or_else(|e| panic!("create {path:?}: {e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        TempDir(path)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run the `#[test]` named `test` of this same test binary in a child process, with
/// `env` set (the child test does nothing without it). Its stdout is dropped (the test
/// harness chatter); its stderr is ours, so a panic in the child shows.
pub fn spawn_self(test: &str, env: (&str, String)) -> ChildProcess {
    let exe = std::env::current_exe().expect("path of the running test binary");
    let child = Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env.0, env.1)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("re-run the test binary as a child");
    ChildProcess(child)
}

/// A child process that is killed (SIGKILL) and reaped when dropped, so a failing test
/// leaves none behind.
#[derive(Debug)]
pub struct ChildProcess(Child);

impl ChildProcess {
    /// Its pid.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Its exit status, if it has ended (reaping it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.0.try_wait().expect("wait for the child")
    }

    /// SIGKILL it and reap it; its exit status.
    pub fn kill(&mut self) -> ExitStatus {
        self.0.kill().expect("SIGKILL the child");
        self.0.wait().expect("reap the child")
    }

    /// Wait for it to end by itself; if it runs longer than `limit`, kill it and panic
    /// (a watchdog for a child that should end soon).
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.try_wait() {
                return status;
            }
            if start.elapsed() > limit {
                self.kill();
                panic!("child {} still running after {} s: killed", self.id(), limit.as_secs());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
