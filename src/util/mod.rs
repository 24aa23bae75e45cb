//! Small utilities every layer may use: errno texts, durations in messages, the job-file
//! format ([`section`]). The bottom layer, with
//! [`crate::record`]: it imports nothing of the engine.

mod errno;
pub mod exit;
pub mod section;

pub use errno::{errno_text, io_error_text, path_error};

/// A duration as a person reads it in a message: `250 µs`, `40 ms`, `1.5 s`, `90 s`.
pub fn duration_text(d: std::time::Duration) -> String {
    let us = d.as_micros();
    if us < 1_000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{} ms", d.as_millis())
    } else if d.as_secs() < 10 && d.subsec_millis().is_multiple_of(100) {
        format!("{:.1} s", d.as_secs_f64())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}

/// FNV-1a (64 bits) of `bytes`: a stable fingerprint (the same on every host, build and run),
/// not a defence against anyone choosing the bytes.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// For tests: a fresh directory under the system's temp dir, removed when dropped — also
/// when an assertion fails first, so a failing test leaves nothing behind either.
#[cfg(test)]
pub(crate) struct TempDir(std::path::PathBuf);

#[cfg(test)]
impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

#[cfg(test)]
impl AsRef<std::path::Path> for TempDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

#[cfg(test)]
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A [`TempDir`] named `weir-<what>-<pid>-<n>` (not created: a test makes what it needs).
#[cfg(test)]
pub(crate) fn temp_dir(what: &str) -> TempDir {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("weir-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    TempDir(dir)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_for_people() {
        assert_eq!(super::duration_text(Duration::from_micros(250)), "250 µs");
        assert_eq!(super::duration_text(Duration::from_millis(40)), "40 ms");
        assert_eq!(super::duration_text(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(super::duration_text(Duration::from_secs(90)), "90 s");
        assert_eq!(super::duration_text(Duration::from_millis(12_345)), "12.345 s");
    }
}
