//! The C ABI of the ipc clients ([`crate::ipc::Publisher`], [`crate::ipc::Subscriber`]),
//! for C, C++ and Python (ctypes) programs: `libweir_ring.so` and `include/weir_ring.h`.
//!
//! Conventions: a handle is an opaque pointer made by a `*_connect` function and freed by
//! exactly one of `weir_publisher_close`, `weir_publisher_detach` or
//! `weir_subscriber_free`. Functions that can fail take `err` and `err_len` (may be NULL /
//! 0) and write a NUL-terminated message there, cut to fit. No function panics across the
//! boundary: a panic inside is reported as an error (-1 or NULL).

use crate::IdleStrategy;
use crate::idle::Idler;
use crate::ipc::{Publisher, Received, Sent, Subscriber};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A publisher handle (opaque to C).
#[derive(Debug)]
pub struct WeirPublisher {
    inner: Publisher,
    idler: Idler,
}

/// A subscriber handle (opaque to C).
#[derive(Debug)]
pub struct WeirSubscriber {
    inner: Subscriber,
    idler: Idler,
}

/// Write `msg` into the caller's buffer, NUL-terminated, cut to fit.
///
/// # Safety
/// `err` is NULL or points at `err_len` writable bytes.
unsafe fn write_err(err: *mut c_char, err_len: usize, msg: &str) {
    if err.is_null() || err_len == 0 {
        return;
    }
    let n = msg.len().min(err_len - 1);
    // SAFETY: the caller gives `err_len` writable bytes at `err`; we write n + 1 <= err_len.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err as *mut u8, n);
        *err.add(n) = 0;
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic in weir_ring".into())
}

/// # Safety
/// `s` is a valid NUL-terminated string.
unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<&'a str, String> {
    if s.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(s) }.to_str().map_err(|_| format!("{what} is not UTF-8"))
}

/// Make a handle with `connect(path)`: a boxed pointer, or NULL with the reason in `err`
/// (a panic inside included).
///
/// # Safety
/// `path` is a NUL-terminated string; `err` is NULL or has `err_len` writable bytes.
unsafe fn connect_with<T>(
    path: *const c_char,
    err: *mut c_char,
    err_len: usize,
    connect: impl FnOnce(&str) -> Result<T, crate::ipc::EndpointError>,
) -> *mut T {
    let made = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as the caller promises.
        let path = unsafe { str_arg(path, "path") }?;
        connect(path).map_err(|e| e.to_string())
    }));
    let msg = match made {
        Ok(Ok(handle)) => return Box::into_raw(Box::new(handle)),
        Ok(Err(msg)) => msg,
        Err(p) => panic_text(p),
    };
    // SAFETY: as the caller promises.
    unsafe { write_err(err, err_len, &msg) };
    std::ptr::null_mut()
}

/// Connect a publisher to the endpoint at `path` (see `Publisher::connect`). NULL on
/// failure, with the reason in `err`.
///
/// # Safety
/// `path` is a NUL-terminated string; `err` is NULL or has `err_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_connect(
    path: *const c_char,
    err: *mut c_char,
    err_len: usize,
) -> *mut WeirPublisher {
    // SAFETY: as the caller promises.
    unsafe {
        connect_with(path, err, err_len, |p| {
            Publisher::connect(p).map(|inner| WeirPublisher { inner, idler: Idler::new(IdleStrategy::default()) })
        })
    }
}

/// Connect a publisher to subtask `subtask` of endpoint `endpoint` of job `job` under this
/// user's root (`/dev/shm/weir-<uid>/ipc/<job>/<endpoint>.<subtask>`).
///
/// # Safety
/// `job` and `endpoint` are NUL-terminated strings; `err` is NULL or has `err_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_connect_to(
    job: *const c_char,
    endpoint: *const c_char,
    subtask: u32,
    err: *mut c_char,
    err_len: usize,
) -> *mut WeirPublisher {
    // SAFETY: as the caller promises.
    let path = unsafe { str_arg(job, "job").and_then(|j| str_arg(endpoint, "endpoint").map(|e| (j, e))) };
    match path {
        Ok((job, endpoint)) => {
            let path = crate::ipc::endpoint_path(&crate::ipc::user_root(), job, endpoint, subtask as usize);
            let c = std::ffi::CString::new(path.to_string_lossy().into_owned()).unwrap_or_default();
            // SAFETY: a NUL-terminated string we own; err as the caller promises.
            unsafe { weir_publisher_connect(c.as_ptr(), err, err_len) }
        }
        Err(msg) => {
            // SAFETY: as the caller promises.
            unsafe { write_err(err, err_len, &msg) };
            std::ptr::null_mut()
        }
    }
}

/// Call `f` on the publisher behind `p`, turning a NULL handle or a panic into -1 + `err`.
///
/// # Safety
/// `p` is NULL or a live handle from `weir_publisher_connect`; `err` as above.
unsafe fn with_publisher(
    p: *mut WeirPublisher,
    err: *mut c_char,
    err_len: usize,
    f: impl FnOnce(&mut WeirPublisher) -> Result<c_int, String>,
) -> c_int {
    if p.is_null() {
        // SAFETY: as the caller promises.
        unsafe { write_err(err, err_len, "publisher handle is NULL") };
        return -1;
    }
    // SAFETY: a live handle, used by one thread at a time (the caller's contract).
    let publisher = unsafe { &mut *p };
    match catch_unwind(AssertUnwindSafe(|| f(publisher))) {
        Ok(Ok(rc)) => rc,
        Ok(Err(msg)) => {
            // SAFETY: as the caller promises.
            unsafe { write_err(err, err_len, &msg) };
            -1
        }
        Err(panic) => {
            // SAFETY: as the caller promises.
            unsafe { write_err(err, err_len, &panic_text(panic)) };
            -1
        }
    }
}

/// Send `len` bytes at `data` if the job has room, without waiting: 1 sent (its sequence
/// number in `*seq_out` if not NULL), 0 no credit (back pressure: nothing written), -1
/// error (the reason in `err`).
///
/// # Safety
/// `p` is a live handle; `data` has `len` readable bytes; `seq_out` is NULL or writable;
/// `err` is NULL or has `err_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_try_send(
    p: *mut WeirPublisher,
    data: *const c_void,
    len: usize,
    seq_out: *mut u64,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    // SAFETY: as the caller promises.
    unsafe {
        with_publisher(p, err, err_len, |p| {
            let bytes = if len == 0 { &[][..] } else { std::slice::from_raw_parts(data as *const u8, len) };
            match p.inner.try_send(bytes).map_err(|e| e.to_string())? {
                Sent::Sent(seq) => {
                    if !seq_out.is_null() {
                        *seq_out = seq;
                    }
                    Ok(1)
                }
                Sent::NoCredit => Ok(0),
            }
        })
    }
}

/// Zero copy: if the job has room for a record of `len` bytes, call `write(ctx, buf, len)`
/// with the record's bytes in the ring, then send it: 1 sent, 0 no credit (`write` not
/// called), -1 error.
///
/// # Safety
/// As [`weir_publisher_try_send`]; `write` writes at most `len` bytes at `buf`, does not
/// keep the pointer, and does not call back into this handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_try_send_with(
    p: *mut WeirPublisher,
    len: usize,
    write: Option<extern "C" fn(ctx: *mut c_void, buf: *mut u8, len: usize)>,
    ctx: *mut c_void,
    seq_out: *mut u64,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    // SAFETY: as the caller promises.
    unsafe {
        with_publisher(p, err, err_len, |p| {
            let write = write.ok_or("the write callback is NULL")?;
            match p
                .inner
                .try_send_with(len, |buf| write(ctx, buf.as_mut_ptr(), buf.len()))
                .map_err(|e| e.to_string())?
            {
                Sent::Sent(seq) => {
                    if !seq_out.is_null() {
                        *seq_out = seq;
                    }
                    Ok(1)
                }
                Sent::NoCredit => Ok(0),
            }
        })
    }
}

/// Send `len` bytes at `data`, waiting (spin, then sleep on the ring) while the job has no
/// room: 1 sent, -1 error (the job is gone: connect again after it restarts).
///
/// # Safety
/// As [`weir_publisher_try_send`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_send(
    p: *mut WeirPublisher,
    data: *const c_void,
    len: usize,
    seq_out: *mut u64,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    // SAFETY: as the caller promises.
    unsafe {
        with_publisher(p, err, err_len, |p| {
            let bytes = if len == 0 { &[][..] } else { std::slice::from_raw_parts(data as *const u8, len) };
            let seq = p.inner.send(bytes, &mut p.idler).map_err(|e| e.to_string())?;
            if !seq_out.is_null() {
                *seq_out = seq;
            }
            Ok(1)
        })
    }
}

/// The sequence number the next record gets (where the job wants the stream to go on).
///
/// # Safety
/// `p` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_next_seq(p: *const WeirPublisher) -> u64 {
    // SAFETY: a live handle (the caller's contract).
    unsafe { p.as_ref() }.map_or(0, |p| p.inner.next_seq())
}

/// Records below this number are in a completed checkpoint of the job: forget them.
///
/// # Safety
/// `p` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_durable_seq(p: *const WeirPublisher) -> u64 {
    // SAFETY: a live handle (the caller's contract).
    unsafe { p.as_ref() }.map_or(0, |p| p.inner.durable_seq())
}

/// Nanoseconds the publisher has waited for credit, in total (the endpoint's figure).
///
/// # Safety
/// `p` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_blocked_ns(p: *const WeirPublisher) -> u64 {
    // SAFETY: a live handle (the caller's contract).
    unsafe { p.as_ref() }.map_or(0, |p| p.inner.status().producer_blocked_ns)
}

/// 1 if the job that serves the endpoint is alive, else 0.
///
/// # Safety
/// `p` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_job_alive(p: *const WeirPublisher) -> c_int {
    // SAFETY: a live handle (the caller's contract).
    unsafe { p.as_ref() }.map_or(0, |p| p.inner.job_alive() as c_int)
}

/// Make records visible every `records` records (default 1: each at once). With more,
/// call [`weir_publisher_flush`] when you stop sending for a while.
///
/// # Safety
/// `p` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_set_batch(p: *mut WeirPublisher, records: u64) {
    // SAFETY: a live handle (the caller's contract).
    if let Some(p) = unsafe { p.as_mut() } {
        p.inner.set_batch(records);
    }
}

/// Make every record sent so far visible to the job.
///
/// # Safety
/// `p` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_flush(p: *mut WeirPublisher) {
    // SAFETY: a live handle (the caller's contract).
    if let Some(p) = unsafe { p.as_mut() } {
        let _ = catch_unwind(AssertUnwindSafe(|| p.inner.flush()));
    }
}

/// End the stream (the job's source finishes after reading it) and free the handle.
///
/// # Safety
/// `p` is a live handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_close(p: *mut WeirPublisher) {
    if !p.is_null() {
        // SAFETY: made by Box::into_raw in weir_publisher_connect, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe { Box::from_raw(p) }.inner.close()));
    }
}

/// End the stream, then wait until the job holds every record in a completed checkpoint
/// (`Publisher::close_and_wait`): 1 durable; 0 not within `timeout_ms`; -1 an error — the
/// job went first (it crashed before the end was durable: connect again once it restarts,
/// send from `weir_publisher_next_seq`, and close again) or the endpoint broke, with the
/// reason in `err`. Frees the handle in every case.
///
/// # Safety
/// `p` is a live handle, not used again; `err` is NULL or has `err_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_close_and_wait(
    p: *mut WeirPublisher,
    timeout_ms: u64,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    if p.is_null() {
        // SAFETY: as the caller promises.
        unsafe { write_err(err, err_len, "publisher handle is NULL") };
        return -1;
    }
    // SAFETY: made by Box::into_raw in weir_publisher_connect, freed once (here).
    let handle = unsafe { Box::from_raw(p) };
    let done =
        catch_unwind(AssertUnwindSafe(|| handle.inner.close_and_wait(std::time::Duration::from_millis(timeout_ms))));
    let msg = match done {
        Ok(Ok(true)) => return 1,
        Ok(Ok(false)) => return 0,
        Ok(Err(e)) => e.to_string(),
        Err(p) => panic_text(p),
    };
    // SAFETY: as the caller promises.
    unsafe { write_err(err, err_len, &msg) };
    -1
}

/// The largest payload a record may carry, bytes (a longer one is refused, never cut).
///
/// # Safety
/// `p` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_max_payload(p: *const WeirPublisher) -> usize {
    // SAFETY: a live handle (the caller's contract).
    unsafe { p.as_ref() }.map_or(0, |p| p.inner.max_payload())
}

/// Leave without ending the stream (another publisher may go on) and free the handle.
///
/// # Safety
/// `p` is a live handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_publisher_detach(p: *mut WeirPublisher) {
    if !p.is_null() {
        // SAFETY: made by Box::into_raw in weir_publisher_connect, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe { Box::from_raw(p) }.inner.detach()));
    }
}

/// Connect a subscriber to the sink endpoint at `path`. NULL on failure, the reason in `err`.
///
/// # Safety
/// `path` is a NUL-terminated string; `err` is NULL or has `err_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_subscriber_connect(
    path: *const c_char,
    err: *mut c_char,
    err_len: usize,
) -> *mut WeirSubscriber {
    // SAFETY: as the caller promises.
    unsafe {
        connect_with(path, err, err_len, |p| {
            Subscriber::connect(p).map(|inner| WeirSubscriber { inner, idler: Idler::new(IdleStrategy::default()) })
        })
    }
}

/// Connect a subscriber to subtask `subtask` of endpoint `endpoint` of job `job`, under this
/// user's root. NULL on failure, the reason in `err`.
///
/// # Safety
/// `job` and `endpoint` are NUL-terminated strings; `err` is NULL or has `err_len` writable
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_subscriber_connect_to(
    job: *const c_char,
    endpoint: *const c_char,
    subtask: u32,
    err: *mut c_char,
    err_len: usize,
) -> *mut WeirSubscriber {
    // SAFETY: as the caller promises.
    let endpoint = match unsafe { str_arg(endpoint, "endpoint") } {
        Ok(e) => e.to_owned(),
        Err(msg) => {
            // SAFETY: as the caller promises.
            unsafe { write_err(err, err_len, &msg) };
            return std::ptr::null_mut();
        }
    };
    // SAFETY: as the caller promises.
    unsafe {
        connect_with(job, err, err_len, |job| {
            Subscriber::connect_to(job, &endpoint, subtask as usize)
                .map(|inner| WeirSubscriber { inner, idler: Idler::new(IdleStrategy::default()) })
        })
    }
}

/// The number the job gives the next record it writes.
///
/// # Safety
/// `s` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_subscriber_next_seq(s: *const WeirSubscriber) -> u64 {
    // SAFETY: a live handle (the caller's contract).
    unsafe { s.as_ref() }.map_or(0, |s| s.inner.next_seq())
}

/// Records below this number are in a completed checkpoint of the job: it will not write
/// them again after a restart.
///
/// # Safety
/// `s` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_subscriber_durable_seq(s: *const WeirSubscriber) -> u64 {
    // SAFETY: a live handle (the caller's contract).
    unsafe { s.as_ref() }.map_or(0, |s| s.inner.durable_seq())
}

/// The largest payload a record may carry, bytes: a buffer this large takes any record.
///
/// # Safety
/// `s` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_subscriber_max_payload(s: *const WeirSubscriber) -> usize {
    // SAFETY: a live handle (the caller's contract).
    unsafe { s.as_ref() }.map_or(0, |s| s.inner.max_payload())
}

/// 1 if the job that serves the endpoint is alive, else 0 (a system call: not per record).
///
/// # Safety
/// `s` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_subscriber_job_alive(s: *const WeirSubscriber) -> c_int {
    // SAFETY: a live handle (the caller's contract).
    unsafe { s.as_ref() }.map_or(0, |s| c_int::from(s.inner.job_alive()))
}

/// Take the next record, copying it into `buf` (`cap` bytes): 1 a record (its length in
/// `*len_out`, its number in `*seq_out`), 3 the next record is longer than `cap` (its length
/// in `*len_out`; nothing copied, the record stays: call again with a larger buffer), 0
/// nothing yet, 2 the stream ended, -1 error. With `wait` non-zero, waits (spin, then sleep on
/// the ring) instead of returning 0.
///
/// # Safety
/// `s` is a live handle; `buf` has `cap` writable bytes; `len_out`, `seq_out` are NULL or
/// writable; `err` is NULL or has `err_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_subscriber_recv(
    s: *mut WeirSubscriber,
    buf: *mut c_void,
    cap: usize,
    len_out: *mut usize,
    seq_out: *mut u64,
    wait: c_int,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    if s.is_null() {
        // SAFETY: as the caller promises.
        unsafe { write_err(err, err_len, "subscriber handle is NULL") };
        return -1;
    }
    // SAFETY: a live handle, used by one thread at a time.
    let sub = unsafe { &mut *s };
    let mut too_long = false;
    let got = catch_unwind(AssertUnwindSafe(|| {
        let mut copy = |seq: u64, bytes: &[u8]| {
            // SAFETY: `buf` has `cap` writable bytes; `len_out`/`seq_out` NULL or writable.
            unsafe {
                if !len_out.is_null() {
                    *len_out = bytes.len();
                }
                if !seq_out.is_null() {
                    *seq_out = seq;
                }
                if bytes.len() > cap {
                    too_long = true;
                    return false;
                }
                if !bytes.is_empty() {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
                }
            }
            true
        };
        loop {
            match sub.inner.try_recv_if(&mut copy)? {
                crate::ipc::Received::Empty if wait != 0 => sub.inner.wait(&mut sub.idler)?,
                other => {
                    sub.idler.reset();
                    return Ok(other);
                }
            }
        }
    }));
    let msg = match got {
        Ok(Ok(Received::Record(_))) if too_long => return 3,
        Ok(Ok(Received::Record(_))) => return 1,
        Ok(Ok(Received::Empty)) => return 0,
        Ok(Ok(Received::Closed)) => return 2,
        Ok(Err(e)) => {
            let e: crate::ipc::EndpointError = e;
            e.to_string()
        }
        Err(p) => panic_text(p),
    };
    // SAFETY: as the caller promises.
    unsafe { write_err(err, err_len, &msg) };
    -1
}

/// Free a subscriber handle (its role is left for another subscriber).
///
/// # Safety
/// `s` is a live handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn weir_subscriber_free(s: *mut WeirSubscriber) {
    if !s.is_null() {
        // SAFETY: made by Box::into_raw in weir_subscriber_connect, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(s) })));
    }
}
