//! One io_uring for one sink subtask, with the buffers it lends to the kernel owned here.
//!
//! The sinks never touch a submission entry: they hand this wrapper an owned `Vec<u8>` with
//! the operation, the wrapper keeps the vector in a slot until the kernel reports the
//! operation complete, and gives it back with the completion. That is the whole safety
//! argument of this module: a buffer the kernel may read or write is owned by a slot that
//! nobody else can reach until its completion has been reaped (and on drop, buffers of
//! operations that never completed are leaked, not freed).
//!
//! Batching: operations are only *queued* by [`Uring::write_at`], [`Uring::send`], ...; one
//! `io_uring_enter` system call ([`Uring::submit`] or [`Uring::wait`]) hands all queued ones to
//! the kernel and, when waiting, reaps completions in the same call.

#![allow(unsafe_code)]

use crate::util::errno_text;
use io_uring::{IoUring, opcode, types};
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// The tag of operations the wrapper issues itself (cancellations); never handed out.
const INTERNAL_TAG: u64 = u64::MAX;

/// How long `Drop` waits for cancelled operations before leaking their buffers.
const DROP_DRAIN: Duration = Duration::from_secs(2);

/// What a slot holds while its operation is in the kernel.
#[derive(Debug)]
struct Slot {
    /// The caller's tag, handed back with the completion.
    tag: u64,
    /// The buffer the kernel reads (write, send) or fills (recv).
    buffer: Option<Vec<u8>>,
    /// For a receive: the buffer's length before it, the kernel fills the spare capacity after.
    recv_from: Option<usize>,
    busy: bool,
}

/// One finished operation.
#[derive(Debug)]
pub(crate) struct Completion {
    /// The tag given when the operation was queued.
    pub tag: u64,
    /// The kernel's result: bytes transferred, 0, or a negated errno.
    pub result: i32,
    /// The buffer lent with the operation, back in the caller's hands. After a receive its
    /// length includes the bytes received.
    pub buffer: Option<Vec<u8>>,
}

impl Completion {
    /// The result as bytes transferred, or the errno as an error.
    pub fn bytes(&self) -> Result<usize, i32> {
        if self.result < 0 { Err(-self.result) } else { Ok(self.result as usize) }
    }
}

/// An io_uring with a fixed number of operation slots, allocated at start.
pub(crate) struct Uring {
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Operations queued or submitted whose completion has not been reaped.
    in_kernel: usize,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring").field("slots", &self.slots.len()).field("in_kernel", &self.in_kernel).finish()
    }
}

impl Uring {
    /// A ring of `entries` submission entries and as many operation slots (plus a few for
    /// the cancellations `Drop` issues). Fails with a message that says why io_uring is
    /// unavailable and what to do.
    pub fn new(entries: u32) -> Result<Uring, UringError> {
        let ring = IoUring::new(entries.next_power_of_two()).map_err(UringError::Unavailable)?;
        if !ring.params().is_feature_ext_arg() {
            return Err(UringError::NoExtArg);
        }
        let count = entries as usize * 2;
        let slots = (0..count).map(|_| Slot { tag: 0, buffer: None, recv_from: None, busy: false }).collect();
        Ok(Uring { ring, slots, free: (0..count).rev().collect(), in_kernel: 0 })
    }

    /// Operations queued or in the kernel, not yet reaped.
    pub fn in_kernel(&self) -> usize {
        self.in_kernel
    }

    fn take_slot(&mut self, tag: u64, buffer: Option<Vec<u8>>, recv_from: Option<usize>) -> usize {
        // Programmer error: every sink bounds its own operations well below the slot count.
        let slot = self.free.pop().expect("io_uring slots exhausted: a sink queued more operations than it bounds");
        self.slots[slot] = Slot { tag, buffer, recv_from, busy: true };
        self.in_kernel += 1;
        slot
    }

    /// Queue an entry; if the submission queue is full, submit what is queued first.
    fn push(&mut self, entry: io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every pointer in `entry` points into a buffer owned by the slot named by
            // its user_data, which stays owned there (not moved, dropped or lent) until the
            // completion with that user_data is reaped in `next_completion` (or leaked in Drop).
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn queue(&mut self, slot: usize, entry: io_uring::squeue::Entry) -> io::Result<()> {
        if let Err(e) = self.push(entry.user_data(slot as u64)) {
            // Not queued: the kernel never saw it, the slot is ours again.
            self.slots[slot].busy = false;
            self.slots[slot].buffer = None;
            self.free.push(slot);
            self.in_kernel -= 1;
            return Err(e);
        }
        Ok(())
    }

    /// Queue a write of `buffer[start..]` at `offset` of the file `fd`.
    pub fn write_at(&mut self, fd: RawFd, buffer: Vec<u8>, start: usize, offset: u64, tag: u64) -> io::Result<()> {
        assert!(start < buffer.len(), "a write of nothing");
        let len = (buffer.len() - start).min(u32::MAX as usize) as u32;
        let ptr = buffer[start..].as_ptr();
        // Moving the Vec into the slot does not move its heap bytes: `ptr` stays valid.
        let slot = self.take_slot(tag, Some(buffer), None);
        self.queue(slot, opcode::Write::new(types::Fd(fd), ptr, len).offset(offset).build())
    }

    /// Queue a send of `buffer[start..]` on the connected socket `fd`. `MSG_NOSIGNAL`: a
    /// closed peer is an `EPIPE` result, not a signal that kills the process; `MSG_WAITALL`:
    /// the kernel retries short sends itself.
    pub fn send(&mut self, fd: RawFd, buffer: Vec<u8>, start: usize, tag: u64) -> io::Result<()> {
        assert!(start < buffer.len(), "a send of nothing");
        let len = (buffer.len() - start).min(u32::MAX as usize) as u32;
        let ptr = buffer[start..].as_ptr();
        let slot = self.take_slot(tag, Some(buffer), None);
        let flags = libc::MSG_NOSIGNAL | libc::MSG_WAITALL;
        self.queue(slot, opcode::Send::new(types::Fd(fd), ptr, len).flags(flags).build())
    }

    /// Queue a receive on the socket `fd` into the spare capacity of `buffer` (after its
    /// current length). The completion's buffer has the received bytes appended.
    pub fn recv(&mut self, fd: RawFd, mut buffer: Vec<u8>, tag: u64) -> io::Result<()> {
        let spare = buffer.spare_capacity_mut();
        assert!(!spare.is_empty(), "a receive into a full buffer");
        let len = spare.len().min(u32::MAX as usize) as u32;
        let ptr = spare.as_mut_ptr().cast::<u8>();
        let from = buffer.len();
        let slot = self.take_slot(tag, Some(buffer), Some(from));
        self.queue(slot, opcode::Recv::new(types::Fd(fd), ptr, len).build())
    }

    /// Queue an fsync of `fd` (data and metadata).
    pub fn fsync(&mut self, fd: RawFd, tag: u64) -> io::Result<()> {
        let slot = self.take_slot(tag, None, None);
        self.queue(slot, opcode::Fsync::new(types::Fd(fd)).build())
    }

    /// The whole buffer lent to the kernel by the send or write tagged `tag` that is still in
    /// flight (a checkpoint copies a request the kernel is sending). The kernel only reads a
    /// send's or a write's buffer, so reading it meanwhile is sound; a receive's is not lent
    /// here.
    pub fn lent(&self, tag: u64) -> Option<&[u8]> {
        self.slots.iter().find(|s| s.busy && s.tag == tag && s.recv_from.is_none()).and_then(|s| s.buffer.as_deref())
    }

    /// Hand every queued operation to the kernel; do not wait.
    pub fn submit(&mut self) -> io::Result<()> {
        self.ring.submit().map(|_| ())
    }

    /// Submit what is queued and wait until at least one completion is ready, or `timeout`
    /// passed (`None`: no limit). Returns whether a completion is ready.
    ///
    /// Waiting with nothing in the kernel is refused (an error, not a wait that never ends):
    /// no completion could come.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        if !self.ring.completion().is_empty() {
            self.submit()?;
            return Ok(true);
        }
        if self.in_kernel == 0 {
            return Err(io::Error::other(
                "a wait for an io_uring completion with no operation in flight (its completion was reaped \
                 elsewhere): a bug in weir, please report it",
            ));
        }
        if weir_ring::fiber::in_fiber() {
            return self.wait_as_fiber(timeout);
        }
        let result = match timeout {
            None => self.ring.submit_and_wait(1),
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        match result {
            Ok(_) => Ok(!self.ring.completion().is_empty()),
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(false),
            // A signal, or completions the kernel holds back until we reap: look again.
            Err(e) if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::EBUSY) => {
                Ok(!self.ring.completion().is_empty())
            }
            Err(e) => Err(e),
        }
    }

    /// `wait` for a fiber, which must not block its thread in the kernel: submit, then look
    /// for a completion between sleeps that let the other fibers run, 10 µs at first and
    /// doubling to 1 ms (an operation that takes long costs few looks; a fast one is seen
    /// within about its own time).
    fn wait_as_fiber(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        self.submit()?;
        let start = std::time::Instant::now();
        let mut slice = Duration::from_micros(10);
        loop {
            if !self.ring.completion().is_empty() {
                return Ok(true);
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Ok(false),
                },
                None => slice,
            };
            weir_ring::fiber::sleep(slice.min(left));
            slice = (slice * 2).min(Duration::from_millis(1));
        }
    }

    /// The next completion, if one is ready (no system call).
    pub fn next_completion(&mut self) -> Option<Completion> {
        loop {
            let cqe = self.ring.completion().next()?;
            let slot = cqe.user_data() as usize;
            let result = cqe.result();
            let s = &mut self.slots[slot];
            debug_assert!(s.busy, "a completion for an idle slot");
            s.busy = false;
            let tag = s.tag;
            let recv_from = s.recv_from.take();
            let mut buffer = s.buffer.take();
            self.free.push(slot);
            self.in_kernel -= 1;
            if tag == INTERNAL_TAG {
                continue;
            }
            if let (Some(from), Some(b), Ok(n)) = (recv_from, buffer.as_mut(), usize::try_from(result)) {
                assert!(from + n <= b.capacity(), "the kernel reported more bytes than the buffer holds");
                // SAFETY: the kernel wrote `n` bytes into the spare capacity starting at `from`
                // (the receive was given exactly that region), so they are initialized.
                unsafe { b.set_len(from + n) };
            }
            return Some(Completion { tag, result, buffer });
        }
    }

    /// Wait for the completion of everything in the kernel, up to `limit`; completions are
    /// passed to `each`. Returns whether everything completed.
    pub fn drain(&mut self, limit: Duration, mut each: impl FnMut(Completion)) -> io::Result<bool> {
        let end = Instant::now() + limit;
        while self.in_kernel > 0 {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            self.wait(Some(left))?;
            while let Some(c) = self.next_completion() {
                each(c);
            }
        }
        Ok(true)
    }
}

impl Drop for Uring {
    /// The kernel may still write into buffers of operations in flight (a pending receive):
    /// cancel them, wait a little, and leak whatever the kernel still holds.
    fn drop(&mut self) {
        if self.in_kernel == 0 {
            return;
        }
        let busy: Vec<usize> =
            (0..self.slots.len()).filter(|&i| self.slots[i].busy && self.slots[i].tag != INTERNAL_TAG).collect();
        for target in busy {
            if self.free.is_empty() {
                break;
            }
            let slot = self.take_slot(INTERNAL_TAG, None, None);
            let _ = self.queue(slot, opcode::AsyncCancel::new(target as u64).build());
        }
        let drained = self.drain(DROP_DRAIN, drop).unwrap_or(false);
        if !drained {
            // Leak: better a few KiB than the kernel writing into freed memory.
            std::mem::forget(std::mem::take(&mut self.slots));
        }
    }
}

/// Why io_uring cannot be set up, and the way out.
/// Why no ring could be made ([`Uring::new`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum UringError {
    /// io_uring_setup failed: no io_uring, disabled, or no memory for it.
    #[error("{}", unavailable(.0))]
    Unavailable(#[source] io::Error),
    /// The kernel is older than 5.11.
    #[error(
        "io_uring on this kernel lacks IORING_FEAT_EXT_ARG (timed waits, Linux 5.11); weir's sinks need Linux 5.11 \
         or newer"
    )]
    NoExtArg,
}

pub(crate) fn unavailable(e: &io::Error) -> String {
    let code = e.raw_os_error().unwrap_or(0);
    let why = match code {
        libc::ENOSYS => "this kernel has no io_uring (or a seccomp filter hides it)",
        libc::EPERM | libc::EACCES => {
            "io_uring is disabled: the sysctl kernel.io_uring_disabled is 2 (or 1 and this user is not in \
             kernel.io_uring_group), or a seccomp profile (a container runtime's default) refuses io_uring_setup"
        }
        libc::ENOMEM => "the kernel could not allocate the ring (locked-memory limit, RLIMIT_MEMLOCK, too low?)",
        _ => "io_uring_setup failed",
    };
    format!(
        "cannot create an io_uring: {} ({why}); weir's file, TCP, HTTP and Kafka connectors need io_uring: \
         run `sysctl kernel.io_uring_disabled=0`, or allow io_uring_setup/io_uring_enter in the container's \
         seccomp profile, or use other connectors",
        errno_text(code)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    /// Writes go out at their offsets and their buffers come back; an fsync completes.
    #[test]
    fn write_and_fsync_give_buffers_back() {
        let path = std::env::temp_dir().join(format!("weir-uring-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let mut ring = Uring::new(8).unwrap();
        ring.write_at(file.as_raw_fd(), b"xxhello ".to_vec(), 2, 0, 1).unwrap();
        ring.write_at(file.as_raw_fd(), b"ring".to_vec(), 0, 6, 2).unwrap();
        let mut seen = Vec::new();
        assert!(ring.drain(Duration::from_secs(10), |c| seen.push(c)).unwrap());
        seen.sort_by_key(|c| c.tag);
        assert_eq!(seen[0].bytes(), Ok(6));
        assert_eq!(seen[0].buffer.as_deref(), Some(&b"xxhello "[..]));
        assert_eq!(seen[1].bytes(), Ok(4));
        ring.fsync(file.as_raw_fd(), 3).unwrap();
        assert!(ring.wait(Some(Duration::from_secs(10))).unwrap());
        let c = ring.next_completion().unwrap();
        assert_eq!((c.tag, c.bytes()), (3, Ok(0)));
        assert_eq!(std::fs::read(&path).unwrap(), b"hello ring");
        let _ = std::fs::remove_file(&path);
    }

    /// A receive appends to its buffer; a timed wait with nothing ready says so.
    #[test]
    fn recv_appends_and_timed_wait_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut ring = Uring::new(4).unwrap();
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(b"ab");
        ring.recv(server.as_raw_fd(), buf, 7).unwrap();
        assert!(!ring.wait(Some(Duration::from_millis(20))).unwrap(), "nothing sent yet");
        client.write_all(b"cd").unwrap();
        assert!(ring.wait(Some(Duration::from_secs(10))).unwrap());
        let c = ring.next_completion().unwrap();
        assert_eq!((c.tag, c.bytes()), (7, Ok(2)));
        assert_eq!(c.buffer.unwrap(), b"abcd");
        ring.send(server.as_raw_fd(), b"pong".to_vec(), 0, 8).unwrap();
        ring.submit().unwrap();
        let mut got = [0u8; 4];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"pong");
    }

    /// When io_uring is refused, the message says why and names the way out.
    #[test]
    fn unavailable_names_the_way_out() {
        let m = unavailable(&io::Error::from_raw_os_error(libc::EPERM));
        assert!(m.contains("EPERM") && m.contains("kernel.io_uring_disabled") && m.contains("seccomp"), "{m}");
        assert!(unavailable(&io::Error::from_raw_os_error(libc::ENOSYS)).contains("no io_uring"));
    }

    /// Dropping a ring with a receive still pending cancels it (no hang, no use after free).
    #[test]
    fn drop_cancels_pending_receive() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut ring = Uring::new(4).unwrap();
        ring.recv(server.as_raw_fd(), Vec::with_capacity(16), 1).unwrap();
        ring.submit().unwrap();
        drop(ring);
    }
}
