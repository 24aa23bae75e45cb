//! Errors of the operating system, as a person reads them: the text, the symbolic name and
//! the number, so a message can be searched for by any of them.

/// `No space left on device (ENOSPC, errno 28)`: the text, the symbolic name, the number,
/// so a message can be searched for by any of them.
pub fn errno_text(code: i32) -> String {
    let text = std::io::Error::from_raw_os_error(code).to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
    match errno_name(code) {
        Some(name) => format!("{text} ({name}, errno {code})"),
        None => format!("{text} (errno {code})"),
    }
}

/// The symbolic name of the errnos sinks meet.
fn errno_name(code: i32) -> Option<&'static str> {
    Some(match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EPIPE => "EPIPE",
        libc::ENOSYS => "ENOSYS",
        libc::ETIME => "ETIME",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ECONNABORTED => "ECONNABORTED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EDQUOT => "EDQUOT",
        libc::ECANCELED => "ECANCELED",
        _ => return None,
    })
}

/// The errno text of an `io::Error` (its raw code when it has one).
pub fn io_error_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => errno_text(code),
        None => e.to_string(),
    }
}

/// `what path: errno text`, as a file operation's error reads in a message.
pub fn path_error(what: &str, path: &std::path::Path, e: &std::io::Error) -> String {
    format!("{what} {}: {}", path.display(), io_error_text(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errno texts carry the symbolic name.
    #[test]
    fn errno_names() {
        let t = errno_text(libc::ENOSPC);
        assert!(t.contains("ENOSPC") && t.contains("28") && t.contains("No space"), "{t}");
        assert!(errno_text(9999).contains("errno 9999"));
    }
}
