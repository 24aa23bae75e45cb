//! Files for this user alone: how rings and the counters file are created.
//!
//! Another user on the host must not be able to plant, replace or read the files a job
//! maps. So a file is created only inside a directory that is ours and closed to others
//! (mode 0700, owned by our effective uid, a real directory and not a symlink), with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` (nothing adopted, no link followed) and mode 0600. One
//! function does it for every shared file, so the checks cannot drift apart.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a private file could not be created.
#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    /// The directory is not ours alone.
    #[error(
        "directory {path}: mode {mode:o}, owner uid {uid}; it must be 0700 and ours (uid {our_uid}): fix it with `chmod 700`, or pick another directory"
    )]
    UnsafeDir {
        /// The directory.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
        /// Its owner.
        uid: u32,
        /// Our effective uid.
        our_uid: u32,
    },
    /// A symlink (never followed) or another file where a directory must be.
    #[error("{0} is a symlink or not a directory; remove it, or pick another directory")]
    NotADirectory(PathBuf),
    /// The file already exists (it is never adopted).
    #[error("{0} already exists")]
    Exists(PathBuf),
    /// A system call failed.
    #[error("cannot create {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Our effective uid.
pub fn our_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Create `path`'s directory (0700, with any missing parents) if it is missing, and check
/// what is there: opened `O_DIRECTORY | O_NOFOLLOW` (a symlink is refused, not followed) and
/// checked by `fstat` on what was opened: a directory, owned by us, mode 0700. One that is
/// not is refused, never adopted or repaired.
pub fn private_dir(dir: &Path) -> Result<(), PrivateFileError> {
    let io = |source| PrivateFileError::Io { path: dir.to_owned(), source };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => PrivateFileError::NotADirectory(dir.to_owned()),
            _ => io(e),
        })?;
    let meta = opened.metadata().map_err(io)?;
    let our_uid = our_uid();
    if !meta.is_dir() || meta.mode() & 0o777 != 0o700 || meta.uid() != our_uid {
        return Err(PrivateFileError::UnsafeDir {
            path: dir.to_owned(),
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            our_uid,
        });
    }
    Ok(())
}

/// Create `path` for us alone, `len` bytes long: its directory checked by [`private_dir`],
/// the file opened read-write with `O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC`, mode 0600.
pub fn create_private(path: &Path, len: u64) -> Result<File, PrivateFileError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    private_dir(dir)?;
    let io = |source| PrivateFileError::Io { path: path.to_owned(), source };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => PrivateFileError::Exists(path.to_owned()),
            _ => io(e),
        })?;
    file.set_len(len).map_err(io)?;
    Ok(file)
}

/// Create shared memory of `len` bytes that nobody can truncate or grow, reachable at
/// `path`: a sealed memfd (`F_SEAL_SHRINK | F_SEAL_GROW`, mode 0600), and at `path` a
/// symlink to it (`/proc/<pid>/fd/<n>`, created like a private file: in a directory checked
/// by [`private_dir`], never over an existing name). Readers open `path` as a file; a
/// truncation through it fails with EPERM instead of killing the writer with SIGBUS when it
/// next touches the memory. The link works while the returned file is open, and dangles
/// once this process is gone. Call [`seal_writes`] once it is mapped writable.
pub fn create_sealed(path: &Path, len: u64) -> Result<File, PrivateFileError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    private_dir(dir)?;
    let io = |source| PrivateFileError::Io { path: path.to_owned(), source };
    let name = c"weir-shared";
    // SAFETY: a valid NUL-terminated name; the flags are memfd_create's.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor, owned by the File from here on.
    let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(io)?;
    file.set_len(len).map_err(io)?;
    add_seals(&file, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW).map_err(io)?;
    let link = format!("/proc/{}/fd/{fd}", std::process::id());
    std::os::unix::fs::symlink(link, path).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => PrivateFileError::Exists(path.to_owned()),
        _ => io(e),
    })?;
    Ok(file)
}

/// After mapping a [`create_sealed`] file writable: seal it against new writable mappings
/// and writes (`F_SEAL_FUTURE_WRITE`), and against further seals. Our mapping stays
/// writable; every other process can map it read-only at most, so what it holds is ours.
pub fn seal_writes(file: &File) -> std::io::Result<()> {
    add_seals(file, libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL)
}

/// Whether `file` is sealed against shrinking (a [`create_sealed`] memory): mapping it
/// cannot end in SIGBUS from someone truncating it.
pub fn is_sealed(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl F_GET_SEALS on a descriptor we own; no memory is passed.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

fn add_seals(file: &File, seals: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor we own, with F_ADD_SEALS and seal bits.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A file is made 0600 in a 0700 directory; an existing file is never adopted; a
    /// directory open to others is refused, naming its mode.
    #[test]
    fn private_files_only_in_private_dirs() {
        let dir = std::env::temp_dir().join(format!("weir-private-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let f = dir.join("x");
        create_private(&f, 64).unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&f).unwrap().len(), 64);
        assert!(matches!(create_private(&f, 64), Err(PrivateFileError::Exists(_))));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = create_private(&dir.join("y"), 64).unwrap_err();
        assert!(matches!(e, PrivateFileError::UnsafeDir { mode: 0o755, .. }), "{e}");
        assert!(e.to_string().contains("chmod 700"), "{e}");
        // A symlink to a private directory is refused, not followed.
        let real = dir.with_extension("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = dir.with_extension("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(private_dir(&link), Err(PrivateFileError::NotADirectory(_))));
        assert!(matches!(create_private(&link.join("z"), 8), Err(PrivateFileError::NotADirectory(_))));
        assert!(!real.join("z").exists(), "nothing was created through the link");
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&real).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
