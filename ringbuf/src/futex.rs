//! Sleeping on a word in shared memory. No `FUTEX_PRIVATE_FLAG`: the word may be
//! mapped by another process, and the kernel must key the wait on the physical page.

use crate::sync::AtomicU32;
use std::time::Duration;

/// Sleep while `*word == expected`, at most `timeout`. Returns on a wake, a timeout,
/// a signal, or at once if the word already differs; the caller re-checks its condition.
#[cfg(not(loom))]
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    if crate::fiber::park(&[ParkToken { word, expected }], timeout) {
        return;
    }
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `word` is a live, aligned u32 for the duration of the call; the kernel only
    // reads it. A relative timeout with FUTEX_WAIT is a plain timespec.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec);
    }
}

/// Let this thread's timed waits (a park's timeout, a sleep) end within `slack` of when
/// they were asked to, instead of the kernel's default 50 µs — which a thread that sleeps
/// until its next record is due would add to every record's latency. A no-op under loom.
pub fn set_timer_slack(slack: Duration) {
    #[cfg(not(loom))]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument (ns, at least 1) and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, slack.as_nanos().max(1) as libc::c_ulong, 0, 0, 0);
    }
    #[cfg(loom)]
    let _ = slack;
}

/// Wake one sleeper on `word`.
#[cfg(not(loom))]
pub fn wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not touch memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

// Under loom there is no kernel; the model stands in for it. One mutex and condition
// variable serve every word: the mutex makes "compare the word, then sleep" atomic against
// a wake, as the kernel's hash-bucket lock does. A wait shorter than the park backstop (the
// first park) may time out at any moment, so it is a yield. A backstop-long wait is taken
// to be endless: it ends only by a wake or a word that already differs, so a lost wake-up
// leaves the side asleep for good and loom reports a deadlock instead of a 100 ms stall.
#[cfg(loom)]
loom::lazy_static! {
    static ref KERNEL: (loom::sync::Mutex<()>, loom::sync::Condvar) =
        (loom::sync::Mutex::new(()), loom::sync::Condvar::new());
}

/// Under loom: sleep while `*word == expected` until a [`wake`]; a short `timeout` yields.
#[cfg(loom)]
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    wait_any(&[ParkToken { word, expected }], timeout);
}

/// Under loom: wake every sleeper (callers re-check their condition, as after a real wake).
#[cfg(loom)]
pub fn wake(_word: &AtomicU32) {
    let (lock, sleepers) = &*KERNEL;
    let _guard = lock.lock().unwrap_or_else(|e| e.into_inner());
    sleepers.notify_all();
}

/// One word to wait on with [`wait_any`]: sleep only while it still holds `expected`.
#[derive(Debug)]
pub struct ParkToken<'a> {
    pub(crate) word: &'a AtomicU32,
    pub(crate) expected: u32,
}

impl<'a> ParkToken<'a> {
    /// A token for a word of the caller's own (a mailbox doorbell, say): read `expected`
    /// from it *before* checking the condition it guards.
    pub fn new(word: &'a AtomicU32, expected: u32) -> ParkToken<'a> {
        ParkToken { word, expected }
    }
}

/// `struct futex_waitv` of the kernel ABI.
#[cfg(not(loom))]
#[repr(C)]
#[derive(Clone, Copy)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// The most words one [`wait_any`] sleeps on (the kernel's limit for `futex_waitv`).
#[cfg(not(loom))]
pub(crate) const MAX_WAIT_WORDS: usize = 128;

/// Sleep until any of the words differs from its expected value, a wake on any of them,
/// or `timeout` (Linux `futex_waitv`, 5.16+; at most 128 words). Shared futexes, so the
/// words may live in memory other processes map.
#[cfg(not(loom))]
pub fn wait_any(tokens: &[ParkToken<'_>], timeout: Duration) {
    const FUTEX2_SIZE_U32: u32 = 0x02;
    // A fiber hands its thread to the others instead (`crate::fiber`).
    if crate::fiber::park(tokens, timeout) {
        return;
    }
    match tokens {
        [] => std::thread::sleep(timeout),
        [one] => wait(one.word, one.expected, timeout),
        _ => {
            // On the stack: a park allocates nothing (3 KiB for the kernel's limit of 128,
            // left uninitialized past the words used: no 3 KiB clear per park).
            let mut array = [const { std::mem::MaybeUninit::<FutexWaitv>::uninit() }; MAX_WAIT_WORDS];
            let len = tokens.len().min(array.len());
            for (w, t) in array.iter_mut().zip(tokens) {
                w.write(FutexWaitv {
                    val: t.expected as u64,
                    uaddr: t.word.as_ptr() as u64,
                    flags: FUTEX2_SIZE_U32,
                    reserved: 0,
                });
            }
            // SAFETY: the first `len` entries were written just above (`zip` stops at the
            // shorter of the two, and `len` is that length).
            let waiters = unsafe { std::slice::from_raw_parts(array.as_ptr().cast::<FutexWaitv>(), len) };
            let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: `now` is a valid, writable timespec.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
            let deadline_ns = now.tv_sec as u128 * 1_000_000_000 + now.tv_nsec as u128 + timeout.as_nanos();
            let deadline = libc::timespec {
                tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
            };
            // SAFETY: `waiters` is a live array of `len` kernel-ABI structs whose addresses point
            // at live, aligned u32 words; the deadline is an absolute CLOCK_MONOTONIC timespec.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_futex_waitv,
                    waiters.as_ptr(),
                    waiters.len() as libc::c_uint,
                    0 as libc::c_uint,
                    &deadline as *const libc::timespec,
                    libc::CLOCK_MONOTONIC,
                )
            };
            if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                // A kernel before 5.16: fall back to a bounded sleep; callers re-check anyway.
                std::thread::sleep(timeout.min(Duration::from_millis(1)));
            }
        }
    }
}

/// Under loom: sleep while every word holds its expected value until a [`wake`]; no
/// words or a short `timeout` yield (see `KERNEL` above).
#[cfg(loom)]
pub fn wait_any(tokens: &[ParkToken<'_>], timeout: Duration) {
    if tokens.is_empty() || timeout < crate::ring::PARK_BACKSTOP {
        loom::thread::yield_now();
        return;
    }
    let (lock, sleepers) = &*KERNEL;
    let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
    // Relaxed: a waker bumps its word before it takes the lock; the lock orders the two.
    if tokens.iter().all(|t| t.word.load(crate::sync::Ordering::Relaxed) == t.expected) {
        drop(sleepers.wait(guard).unwrap_or_else(|e| e.into_inner()));
    }
}
