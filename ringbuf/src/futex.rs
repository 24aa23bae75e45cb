//! Sleeping on a word in shared memory. No `FUTEX_PRIVATE_FLAG`: the word may be
//! mapped by another process, and the kernel must key the wait on the physical page.

use crate::sync::AtomicU32;
use std::time::Duration;

/// Sleep while `*word == expected`, at most `timeout`. Returns on a wake, a timeout,
/// a signal, or at once if the word already differs; the caller re-checks its condition.
#[cfg(not(loom))]
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `word` is a live, aligned u32 for the duration of the call; the kernel only
    // reads it. A relative timeout with FUTEX_WAIT is a plain timespec.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec);
    }
}

/// Wake one sleeper on `word`.
#[cfg(not(loom))]
pub fn wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not touch memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

/// Under loom there is no kernel: a wait is a yield, the caller loops.
#[cfg(loom)]
pub fn wait(_word: &AtomicU32, _expected: u32, _timeout: Duration) {
    loom::thread::yield_now();
}

/// Under loom there is no kernel.
#[cfg(loom)]
pub fn wake(_word: &AtomicU32) {}
