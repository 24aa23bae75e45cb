//! Errors, one small enum per operation. Would-block is never an error: it is
//! [`crate::Claim::NoCredit`] or [`crate::Read::Empty`].

use std::path::PathBuf;

/// Why a ring configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Slot size not a power of two, or below 8 bytes.
    #[error("slot size {0} bytes: must be a power of two of at least 8 bytes (try 64)")]
    SlotBytes(u32),
    /// Slot count not a power of two, or below 2.
    #[error("slot count {0}: must be a power of two of at least 2 (try 4096)")]
    SlotCount(u32),
    /// The ring would be larger than this build maps (1 GiB of slots).
    #[error("ring of {slot_count} slots x {slot_bytes} bytes is over the 1 GiB limit; use fewer or smaller slots")]
    TooLarge {
        /// Requested slot size.
        slot_bytes: u32,
        /// Requested slot count.
        slot_count: u32,
    },
    /// The max record size does not fit in the ring.
    #[error(
        "max record size {max_record_bytes} bytes does not fit a ring of {ring_bytes} bytes (8-byte header included); raise slot_count or slot_bytes, or lower the max record size"
    )]
    MaxRecord {
        /// Requested max payload.
        max_record_bytes: u32,
        /// Bytes of slots in the ring.
        ring_bytes: u64,
    },
}

/// What a protocol violation looked like; stored as `poison_code` in the header.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoisonReason {
    /// The producer's `tail` went backwards, or ran more than a ring ahead of `head`.
    TailOutOfRange = 1,
    /// The consumer's `head` went backwards, or past `tail`.
    HeadOutOfRange = 2,
    /// A record header held a kind byte no kind has.
    BadKind = 3,
    /// A record header held a length above the max record size, or past the published tail.
    BadLength = 4,
    /// A padding record whose length does not reach exactly to the end of the ring.
    BadPadding = 5,
    /// The application poisoned the ring on purpose.
    Application = 6,
    /// A frame whose header or end-offset table does not describe its bytes (no records, a
    /// stride that does not fill it exactly, a record over the max, offsets out of order or
    /// past the data); the detail is the frame header word.
    BadFrame = 7,
    /// `tail` was published past a record whose header is not committed: the producer
    /// stores `tail` only after the headers before it, so a reader that sees such a `tail`
    /// would wait for ever on a record nothing will commit. The detail is the read position.
    Uncommitted = 8,
    /// The header's magic, version or layout (header, slot and max record sizes) changed
    /// under a live ring: someone wrote over it. Its state, pids and positions are no longer
    /// to be believed (a `closed` bit there is not an end of stream). The detail is the
    /// header's first word (the magic) as found.
    HeaderChanged = 9,
}

impl PoisonReason {
    /// What was wrong, in words.
    pub fn what(self) -> &'static str {
        match self {
            PoisonReason::TailOutOfRange => "the published position (tail) went back or ran more than a ring ahead",
            PoisonReason::HeadOutOfRange => "the released position (head) went back or past the published one",
            PoisonReason::BadKind => "a record header with a kind no record has",
            PoisonReason::BadLength => "a record longer than the largest allowed, or past the end of the ring",
            PoisonReason::BadPadding => "padding that does not reach the end of the ring",
            PoisonReason::Application => "poisoned by a side on purpose",
            PoisonReason::BadFrame => "a frame whose header or offsets do not describe its bytes",
            PoisonReason::Uncommitted => {
                "the published position (tail) ran ahead of a record nothing committed (the detail is where)"
            }
            PoisonReason::HeaderChanged => {
                "the ring's header (magic, version or layout) was written over while in use (the detail is the magic found)"
            }
        }
    }

    /// The reason for a stored code.
    pub fn from_code(code: u32) -> Option<PoisonReason> {
        Some(match code {
            1 => PoisonReason::TailOutOfRange,
            2 => PoisonReason::HeadOutOfRange,
            3 => PoisonReason::BadKind,
            4 => PoisonReason::BadLength,
            5 => PoisonReason::BadPadding,
            6 => PoisonReason::Application,
            7 => PoisonReason::BadFrame,
            8 => PoisonReason::Uncommitted,
            9 => PoisonReason::HeaderChanged,
            _ => return None,
        })
    }
}

/// The ring can no longer be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// A side saw a protocol violation; nothing more is read or written.
    #[error(
        "ring poisoned: {reason:?}, {} (detail {detail}); the peer broke the ring protocol or memory was corrupted: stop both sides and recreate the ring", reason.what()
    )]
    Poisoned {
        /// What was wrong.
        reason: PoisonReason,
        /// The offending value (a length, a position, a kind byte).
        detail: u64,
    },
    /// The consumer closed the ring: records written now would never be read.
    #[error("the consumer closed the ring; nothing more can be sent on it")]
    ConsumerClosed,
}

/// Why a claim was refused (would-block is not here: it is `Claim::NoCredit`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The record is larger than the ring's max record size. It was not written, not truncated.
    #[error(
        "record of {len} bytes is over this ring's max record size of {max} bytes; it was not written (raise max_record_bytes, or split the record)"
    )]
    TooLarge {
        /// Payload bytes asked for.
        len: usize,
        /// The ring's max record size.
        max: u32,
    },
    /// The ring is poisoned or closed.
    #[error(transparent)]
    Ring(#[from] RingError),
}

/// Why a ring file could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The run directory exists with permissions other than 0700, or another owner.
    #[error(
        "run directory {path}: mode {mode:o}, owner uid {uid}; a ring directory must be 0700 and ours (uid {our_uid}): fix it with `chmod 700` or pick another run directory"
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
    /// The run directory is a symlink (never followed) or not a directory.
    #[error("run directory {0} is a symlink or not a directory; remove it, or pick another run directory")]
    NotADirectory(PathBuf),
    /// The file already exists (O_EXCL).
    #[error(
        "ring file {0} already exists; another job may be using it (check with `weir-stat`), or a dead one left it: remove it if stale"
    )]
    Exists(PathBuf),
    /// Any other system call failed.
    #[error("cannot create ring file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

#[cfg(not(loom))]
impl From<crate::private_file::PrivateFileError> for CreateError {
    fn from(e: crate::private_file::PrivateFileError) -> CreateError {
        use crate::private_file::PrivateFileError;
        match e {
            PrivateFileError::UnsafeDir { path, mode, uid, our_uid } => {
                CreateError::UnsafeDir { path, mode, uid, our_uid }
            }
            PrivateFileError::NotADirectory(p) => CreateError::NotADirectory(p),
            PrivateFileError::Exists(p) => CreateError::Exists(p),
            PrivateFileError::Io { path, source } => CreateError::Io { path, source },
        }
    }
}

/// Why attaching to a ring file, or taking a role on it, was refused.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The path could not be opened or mapped.
    #[error("cannot attach ring {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The path is a symbolic link; rings are never opened through links.
    #[error(
        "cannot attach ring {0}: it is a symbolic link; rings are opened only directly (a link may point another user's file at us): use the real path"
    )]
    Symlink(PathBuf),
    /// Not a regular file.
    #[error("cannot attach ring {0}: not a regular file")]
    NotRegular(PathBuf),
    /// Owned by another user.
    #[error(
        "cannot attach ring {path}: owned by uid {uid}, we are uid {our_uid}; rings are private to their user: run as the job's user"
    )]
    NotOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// Our effective uid.
        our_uid: u32,
    },
    /// Mode other than 0600.
    #[error(
        "cannot attach ring {path}: mode {mode:o}, rings must be 0600 (someone else could read or write it); recreate the ring"
    )]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Too short to hold a header.
    #[error("cannot attach ring {path}: {len} bytes is too short for a ring header ({need} bytes); not a ring file")]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: u64,
        /// The header size.
        need: u64,
    },
    /// Wrong magic: not a ring, or not finished being created.
    #[error(
        "cannot attach ring {path}: magic {found:#018x}, expected {expected:#018x}; not a weir ring file, or its creator has not finished creating it"
    )]
    Magic {
        /// The file.
        path: PathBuf,
        /// What was there.
        found: u64,
        /// [`crate::layout::MAGIC`].
        expected: u64,
    },
    /// Another layout version.
    #[error(
        "cannot attach ring {path}: layout version {found}, this build reads {expected} (was the job started by another weir version? stop it, or run the matching build)"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        expected: u32,
    },
    /// Layout fields inconsistent with each other or with the file size.
    #[error("cannot attach ring {path}: bad layout: {what}; the file is damaged or not a ring: recreate it")]
    Layout {
        /// The file.
        path: PathBuf,
        /// What did not add up.
        what: String,
    },
    /// The role is held by a live process.
    #[error(
        "cannot attach ring {path} as {role}: pid {pid} already is its {role} and is alive; a ring has one producer and one consumer"
    )]
    RoleTaken {
        /// The file, or "(in-process)".
        path: PathBuf,
        /// "producer" or "consumer".
        role: &'static str,
        /// The holder.
        pid: u32,
    },
    /// The ring is poisoned.
    #[error(transparent)]
    Ring(#[from] RingError),
}
