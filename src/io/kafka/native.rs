//! The few calls into librdkafka that rdkafka does not wrap, and the io_uring a source subtask
//! waits in (and a sink subtask, for delivery reports when its producer queue is full). The
//! only `unsafe` of the Kafka connector lives here.
//!
//! # Waking on Kafka readiness
//!
//! librdkafka can write a few bytes to a file descriptor when an operation (a fetched message,
//! an error, a commit result) is put on a queue that was empty
//! (`rd_kafka_queue_io_event_enable`). It writes *once per non-polling period*: after a write,
//! the next one comes only once the queue has been served (polled) again. So a waiter must
//! (1) drain the fd, (2) then look at the queue length, and sleep only if it is 0: a message
//! that arrived before (1) is seen by (2); one that arrives after (1) writes the fd again,
//! because the queue was served (polled empty) before the waiter was called.
//!
//! [`Waiter`] sleeps in one io_uring on three things at once: the eventfd readable
//! (`PollAdd`), the subtask's mailbox futex word (`FutexWait`, Linux 6.7+), and a timeout. On a
//! kernel without io_uring futex support it falls back to a short timeout (so a stop or a
//! checkpoint trigger waits at most that long).

#![allow(unsafe_code)]

use crate::util::errno_text;
use io_uring::{IoUring, opcode, types};
use rdkafka::bindings as rdsys;
use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// How long a wait lasts at most when io_uring cannot wait on the futex word.
pub(crate) const FUTEX_FALLBACK: Duration = Duration::from_millis(5);

/// An eventfd that librdkafka writes to when the client's consumer queue becomes non-empty,
/// and a handle on that queue (to ask its length).
pub(crate) struct QueueEvent {
    /// The handle from `rd_kafka_queue_get_consumer` (or `_main` without a group), owned
    /// here and destroyed in `Drop`, which must run before the client is destroyed.
    queue: *mut rdsys::rd_kafka_queue_t,
    fd: File,
}

// SAFETY: a queue handle is a reference-counted pointer to a queue with its own lock; every
// librdkafka queue call is thread-safe, and the handle is used by one thread at a time (&mut).
unsafe impl Send for QueueEvent {}

impl std::fmt::Debug for QueueEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueEvent").field("fd", &self.fd.as_raw_fd()).finish()
    }
}

impl QueueEvent {
    /// Enable the IO event on the queue the consumer `client` polls: its consumer-group queue
    /// when `group` (rdkafka's `BaseConsumer` polls that queue when `group.id` is set), else
    /// its main queue.
    ///
    /// The caller keeps the client alive for as long as the returned value (drop this first).
    pub(crate) fn enable(client: *mut rdsys::rd_kafka_t, group: bool) -> Result<QueueEvent, String> {
        // SAFETY: plain system call; the flags are valid.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            let code = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(format!("eventfd: {}", errno_text(code)));
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        // SAFETY: `client` is a live client handle (the caller's contract); the getters return
        // a new reference to a queue, or null (no consumer group).
        let queue = unsafe {
            if group { rdsys::rd_kafka_queue_get_consumer(client) } else { rdsys::rd_kafka_queue_get_main(client) }
        };
        if queue.is_null() {
            return Err("librdkafka returned no consumer queue (is group.id set?)".into());
        }
        // An eventfd takes 8-byte writes of a counter increment.
        let payload = 1u64.to_ne_bytes();
        // SAFETY: `queue` is live; librdkafka copies the payload (it keeps no pointer to it) and
        // writes it to `fd`, which stays open until `Drop` has disabled the event again.
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(queue, raw, payload.as_ptr().cast(), payload.len());
        }
        Ok(QueueEvent { queue, fd })
    }

    /// The eventfd, to wait on.
    pub(crate) fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Consume the pending event count (never blocks).
    pub(crate) fn drain(&mut self) {
        let mut buf = [0u8; 8];
        // WouldBlock: nothing pending. An eventfd read takes the whole count at once.
        let _ = (&self.fd).read(&mut buf);
    }

    /// Operations waiting on the queue now.
    pub(crate) fn queue_len(&self) -> usize {
        // SAFETY: `queue` is live until `Drop`.
        unsafe { rdsys::rd_kafka_queue_length(self.queue) }
    }
}

impl Drop for QueueEvent {
    fn drop(&mut self) {
        // SAFETY: `queue` is live; fd -1 disables the event, so librdkafka stops writing to the
        // eventfd before it is closed; destroying our handle drops one reference of the queue
        // (the client holds its own).
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(self.queue, -1, std::ptr::null(), 0);
            rdsys::rd_kafka_queue_destroy(self.queue);
        }
    }
}

/// librdkafka's cached low and high watermarks of a partition, from the last fetch response
/// (no request to the broker). `None` while unknown.
pub(crate) fn cached_watermarks(client: *mut rdsys::rd_kafka_t, topic: &CString, partition: i32) -> Option<(i64, i64)> {
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: `client` is a live client handle (the caller holds the consumer); `topic` is a
    // NUL-terminated string; the outputs are valid for writes.
    let err = unsafe { rdsys::rd_kafka_get_watermark_offsets(client, topic.as_ptr(), partition, &mut low, &mut high) };
    (err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some((low, high))
}

/// The generation of the consumer group `consumer` is a member of, as its coordinator last
/// gave it (`None`: not in a group yet, or unknown).
///
/// librdkafka hands its group metadata out only serialized
/// (`rd_kafka_consumer_group_metadata_write`), and calls that format private: in 2.12 it is
/// the 7 bytes `CGMDv2:`, then the generation id as a native-endian `i32`. Any other prefix
/// reads as unknown, never as a wrong number.
pub(crate) fn group_generation<C: rdkafka::ClientContext>(consumer: &rdkafka::client::Client<C>) -> Option<i32> {
    const MAGIC: &[u8] = b"CGMDv2:";
    // SAFETY: `consumer` is a live client; the metadata it returns is ours to destroy, once.
    let md = unsafe { rdsys::rd_kafka_consumer_group_metadata(consumer.native_ptr()) };
    if md.is_null() {
        return None;
    }
    let (mut buf, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: `md` is live; the outputs are valid for writes; `md` is not used after its destroy.
    let err = unsafe {
        let err = rdsys::rd_kafka_consumer_group_metadata_write(md, &mut buf, &mut size);
        rdsys::rd_kafka_consumer_group_metadata_destroy(md);
        err
    };
    if !err.is_null() {
        // SAFETY: an error object returned to us, destroyed once.
        unsafe { rdsys::rd_kafka_error_destroy(err) };
        return None;
    }
    // SAFETY: on success `buf` holds `size` bytes librdkafka allocated for us; copied out, then
    // freed with librdkafka's own allocator, once.
    let bytes = unsafe {
        let bytes = std::slice::from_raw_parts(buf as *const u8, size).to_vec();
        rdsys::rd_kafka_mem_free(std::ptr::null_mut(), buf);
        bytes
    };
    let id = bytes.strip_prefix(MAGIC)?.get(..4)?;
    let generation = i32::from_ne_bytes(id.try_into().ok()?);
    (generation >= 0).then_some(generation)
}

/// An offset commit sent to the group coordinator whose result comes on a queue of its own,
/// so that waiting for it is bounded ([`Commit::poll`] with a timeout) — rdkafka's synchronous
/// commit waits for as long as the coordinator takes, and a coordinator the broker never
/// grants (no ACL on the group) is for ever.
pub(crate) struct Commit {
    /// A temporary queue (`rd_kafka_queue_new`) the result event is put on; destroyed in `Drop`
    /// (librdkafka keeps its own reference while the commit is outstanding).
    queue: *mut rdsys::rd_kafka_queue_t,
}

// SAFETY: a queue handle is a reference-counted pointer to a queue with its own lock; every
// librdkafka queue call is thread-safe, and the handle is used by one thread at a time (&mut).
unsafe impl Send for Commit {}

impl std::fmt::Debug for Commit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Commit")
    }
}

impl Commit {
    /// Send a commit of `offsets` for `client`'s consumer group. `Err` with librdkafka's error
    /// code when it is refused at once (no group, bad arguments).
    pub(crate) fn send(
        client: *mut rdsys::rd_kafka_t,
        offsets: &rdkafka::TopicPartitionList,
    ) -> Result<Commit, rdsys::rd_kafka_resp_err_t> {
        // SAFETY: `client` is a live client handle (the caller holds the consumer); the new
        // queue is ours until `Drop`.
        let queue = unsafe { rdsys::rd_kafka_queue_new(client) };
        let commit = Commit { queue };
        // SAFETY: `offsets` is a live list (librdkafka copies it); with no callback the result
        // comes as an RD_KAFKA_EVENT_OFFSET_COMMIT event on `queue`.
        let err = unsafe { rdsys::rd_kafka_commit_queue(client, offsets.ptr(), queue, None, std::ptr::null_mut()) };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(err);
        }
        Ok(commit)
    }

    /// Wait at most `timeout` for the result: `Some(Ok)` committed, `Some(Err(code))` refused
    /// or failed, `None` not yet.
    pub(crate) fn poll(&mut self, timeout: Duration) -> Option<Result<(), rdsys::rd_kafka_resp_err_t>> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `queue` is live until `Drop`; an event returned is ours to destroy, once.
        unsafe {
            let event = rdsys::rd_kafka_queue_poll(self.queue, ms);
            if event.is_null() {
                return None;
            }
            let kind = rdsys::rd_kafka_event_type(event);
            let err = rdsys::rd_kafka_event_error(event);
            rdsys::rd_kafka_event_destroy(event);
            if kind != rdsys::RD_KAFKA_EVENT_OFFSET_COMMIT {
                return None;
            }
            Some(if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR { Ok(()) } else { Err(err) })
        }
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        // SAFETY: `queue` is live; destroying our handle drops one reference (an outstanding
        // commit keeps librdkafka's own until its result is put, then discarded).
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue) };
    }
}

/// Operation tags in the waiter's ring.
const TAG_POLL: u64 = 1;
const TAG_FUTEX: u64 = 2;
const TAG_CANCEL: u64 = 3;

/// `FUTEX2_SIZE_U32`: the futex2 flag for a 32-bit word; shared (no `FUTEX2_PRIVATE`), as the
/// runtime's wakers use shared `FUTEX_WAKE`.
const FUTEX2_SIZE_U32: u32 = 0x02;
/// `FUTEX_BITSET_MATCH_ANY`.
const FUTEX_MATCH_ANY: u64 = 0xffff_ffff;

/// What ended a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The queue has something (or its eventfd fired).
    Kafka,
    /// The mailbox word changed (or was different already).
    Mailbox,
    /// The timeout passed.
    Timeout,
}

/// One io_uring per source subtask for waiting on Kafka, the mailbox and a timeout together.
pub(crate) struct Waiter {
    ring: std::mem::ManuallyDrop<IoUring>,
    /// A `PollAdd` on the eventfd is in the kernel (it is one-shot; it stays armed across waits).
    poll_armed: bool,
    /// io_uring refused `FutexWait` (EINVAL/ENOSYS): wait with a short timeout instead.
    futex_unsupported: bool,
    /// A FutexWait could not be settled: never wait again, and leak the ring on drop.
    broken: bool,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.broken {
            // SAFETY: dropped once, here; no operation references memory we free (the futex
            // wait was settled), so closing the ring is safe.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.ring) };
        }
        // Broken: a FutexWait may still reference the word; leaking the ring keeps the kernel
        // from being told to tear down operations on memory we no longer own.
    }
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("futex_unsupported", &self.futex_unsupported).finish()
    }
}

impl Waiter {
    pub(crate) fn new() -> Result<Waiter, String> {
        let ring = IoUring::new(8).map_err(|e| super::super::uring::unavailable(&e))?;
        Ok(Waiter {
            ring: std::mem::ManuallyDrop::new(ring),
            poll_armed: false,
            futex_unsupported: false,
            broken: false,
        })
    }

    /// Whether the kernel refused io_uring futex waits (the fallback is in use).
    pub(crate) fn futex_unsupported(&self) -> bool {
        self.futex_unsupported
    }

    fn push(&mut self, entry: io_uring::squeue::Entry) -> std::io::Result<()> {
        loop {
            // SAFETY: the entries pushed here reference no memory (PollAdd, AsyncCancel) or the
            // futex word, which `wait` keeps borrowed until the FutexWait has completed.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// Sleep until the eventfd `fd` is readable, `word` differs from `expected` (or is woken),
    /// or `timeout` passed. The caller drained the eventfd and saw an empty queue first.
    pub(crate) fn wait(
        &mut self,
        fd: i32,
        word: &AtomicU32,
        expected: u32,
        timeout: Duration,
    ) -> std::io::Result<Woken> {
        if self.broken {
            return Err(std::io::Error::from_raw_os_error(libc::EBADFD));
        }
        if !self.poll_armed {
            self.push(opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build().user_data(TAG_POLL))?;
            self.poll_armed = true;
        }
        let mut futex_in_kernel = false;
        let timeout = if self.futex_unsupported {
            timeout.min(FUTEX_FALLBACK)
        } else {
            let entry = opcode::FutexWait::new(word.as_ptr(), expected as u64, FUTEX_MATCH_ANY, FUTEX2_SIZE_U32)
                .build()
                .user_data(TAG_FUTEX);
            self.push(entry)?;
            futex_in_kernel = true;
            timeout
        };
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => {}
            Err(e) => {
                // The futex entry may be queued or in the kernel: it must not outlive `word`.
                if futex_in_kernel {
                    self.settle_futex()?;
                }
                return Err(e);
            }
        }
        let mut woken = Woken::Timeout;
        self.reap(&mut futex_in_kernel, &mut woken);
        if futex_in_kernel {
            // The FutexWait borrows `word`, which the caller may drop after we return: cancel it
            // and wait until the kernel reports it done.
            self.settle_futex()?;
        }
        Ok(woken)
    }

    /// Sleep until the eventfd `fd` is readable or `timeout` passed (no mailbox: a sink
    /// waiting for delivery reports). The caller drained the eventfd and saw an empty queue
    /// first. Says whether the eventfd woke it.
    pub(crate) fn wait_readable(&mut self, fd: i32, timeout: Duration) -> std::io::Result<bool> {
        if self.broken {
            return Err(std::io::Error::from_raw_os_error(libc::EBADFD));
        }
        if !self.poll_armed {
            self.push(opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build().user_data(TAG_POLL))?;
            self.poll_armed = true;
        }
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => {}
            Err(e) => return Err(e),
        }
        let (mut futex_in_kernel, mut woken) = (false, Woken::Timeout);
        self.reap(&mut futex_in_kernel, &mut woken);
        Ok(woken == Woken::Kafka)
    }

    fn reap(&mut self, futex_in_kernel: &mut bool, woken: &mut Woken) {
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            match cqe.user_data() {
                TAG_POLL => {
                    self.poll_armed = false;
                    *woken = Woken::Kafka;
                }
                TAG_FUTEX => {
                    *futex_in_kernel = false;
                    match -cqe.result() {
                        // Woken (0), or the word already differed (EAGAIN).
                        0 | libc::EAGAIN if *woken == Woken::Timeout => *woken = Woken::Mailbox,
                        libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP => self.futex_unsupported = true,
                        // ECANCELED after our own cancel, EINTR: nothing to note.
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }

    /// Cancel the FutexWait in the kernel and wait for its completion.
    fn settle_futex(&mut self) -> std::io::Result<()> {
        self.push(opcode::AsyncCancel::new(TAG_FUTEX).build().user_data(TAG_CANCEL))?;
        let mut futex_in_kernel = true;
        let mut woken = Woken::Timeout;
        while futex_in_kernel {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => {
                    // The kernel will not tell us when it is done with the word: the futex
                    // wait stays armed on it. Leak the ring on drop (the kernel keeps the
                    // operation until it completes), and refuse further waits.
                    self.broken = true;
                    return Err(e);
                }
            }
            self.reap(&mut futex_in_kernel, &mut woken);
        }
        Ok(())
    }
}
