//! Attaching to a ring file, and creating one, is refused when the file or its directory is
//! not what a ring must be; each refusal is its own error variant and its message names
//! the problem (and the path). Roles: a second producer or consumer is refused while the
//! first lives; a dead process's role is taken over; a ring nobody alive uses is removed
//! by `remove_if_stale`, one with a live side is kept.

mod common;

use common::{TempDir, spawn_self};
use std::fmt::Display;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use weir_ring::layout::{HEADER_BYTES, MAGIC, VERSION};
use weir_ring::{AttachError, CreateError, Ring, RingConfig, remove_if_stale};

const CONFIG: RingConfig = RingConfig { slot_bytes: 64, slot_count: 16, max_record_bytes: 512 };

/// A fresh ring file `name` in `dir`, not mapped by anyone afterwards. Checks that it
/// attaches, so each refusal below comes from what the test then does to it.
fn ring_file(dir: &TempDir, name: &str) -> PathBuf {
    let path = dir.join(name);
    drop(Ring::create(&path, CONFIG).expect("create ring"));
    Ring::attach(&path).expect("a fresh ring attaches");
    path
}

/// Write `bytes` at `offset` of the file, as a misbehaving peer or a stray write would.
fn poke(path: &Path, offset: u64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

/// Attach, expecting a refusal.
fn refused(path: &Path) -> AttachError {
    Ring::attach(path).expect_err("attach must be refused")
}

/// The message says each of `words`, and names the path.
fn says(err: &impl Display, path: &Path, words: &[&str]) {
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "message does not name the path {path:?}: {msg}");
    for word in words {
        assert!(msg.contains(word), "message does not say {word:?}: {msg}");
    }
}

/// Bytes 0..8 not the magic: `Magic`, with what was found and what was expected. A file
/// of zeros (a creator that has not finished) is refused the same way.
#[test]
fn wrong_magic() {
    let dir = TempDir::new("magic");
    let path = ring_file(&dir, "ring");
    poke(&path, 0, b"NOTARING");
    match refused(&path) {
        e @ AttachError::Magic { found, expected, .. } => {
            assert_eq!(found, u64::from_le_bytes(*b"NOTARING"));
            assert_eq!(expected, MAGIC);
            says(&e, &path, &["magic", "not a weir ring file"]);
        }
        other => panic!("expected Magic, got {other:?}"),
    }

    let zeros = dir.join("zeros");
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&zeros).unwrap();
    std::fs::write(&zeros, vec![0u8; CONFIG.region_bytes() as usize]).unwrap();
    match refused(&zeros) {
        e @ AttachError::Magic { found: 0, .. } => says(&e, &zeros, &["has not finished creating it"]),
        other => panic!("expected Magic with 0 found, got {other:?}"),
    }
}

/// Another layout version at offset 8: `Version`, naming both versions.
#[test]
fn other_version() {
    let dir = TempDir::new("version");
    let path = ring_file(&dir, "ring");
    poke(&path, 8, &(VERSION + 1).to_le_bytes());
    match refused(&path) {
        e @ AttachError::Version { found, expected, .. } => {
            assert_eq!((found, expected), (VERSION + 1, VERSION));
            says(&e, &path, &[&format!("layout version {}, this build reads {VERSION}", VERSION + 1)]);
        }
        other => panic!("expected Version, got {other:?}"),
    }
}

/// Layout fields that do not add up: slot count 3 (not a power of two), another header
/// size, a max record larger than the ring, positions out of range. Each is `Layout`,
/// saying which.
#[test]
fn bad_layout() {
    let dir = TempDir::new("layout");
    let cases: [(&str, u64, Vec<u8>, &str); 5] = [
        ("slot_count", 20, 3u32.to_le_bytes().to_vec(), "slot count 3"),
        ("slot_bytes", 16, 48u32.to_le_bytes().to_vec(), "slot size 48"),
        ("header_bytes", 12, 512u32.to_le_bytes().to_vec(), "header of 512 bytes"),
        ("max_record", 24, 4096u32.to_le_bytes().to_vec(), "max record size 4096"),
        // head more than a ring past tail 0 (a head past tail by less is checked when a
        // role is taken: the producer stores tail after the headers it commits).
        ("positions", 256, 1000u64.to_le_bytes().to_vec(), "positions out of range: tail 0, head 1000"),
    ];
    for (name, offset, bytes, words) in cases {
        let path = ring_file(&dir, name);
        poke(&path, offset, &bytes);
        match refused(&path) {
            e @ AttachError::Layout { .. } => says(&e, &path, &["bad layout", words]),
            other => panic!("{name}: expected Layout, got {other:?}"),
        }
    }
}

/// A file shorter or longer than its header says: `Layout`, with both sizes.
#[test]
fn size_mismatch() {
    let dir = TempDir::new("size");
    let region = CONFIG.region_bytes();
    for (name, len) in [("short", region - 64), ("long", region + 4096)] {
        let path = ring_file(&dir, name);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len).unwrap();
        match refused(&path) {
            e @ AttachError::Layout { .. } => {
                says(&e, &path, &[&format!("{region} bytes"), &format!("the file has {len}")])
            }
            other => panic!("{name}: expected Layout, got {other:?}"),
        }
    }
}

/// Mode 0644 (or 0660): `Mode`, saying the mode found and that rings must be 0600.
#[test]
fn mode_not_0600() {
    let dir = TempDir::new("mode");
    for mode in [0o644, 0o660] {
        let path = ring_file(&dir, &format!("ring{mode:o}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        match refused(&path) {
            e @ AttachError::Mode { mode: found, .. } => {
                assert_eq!(found, mode);
                says(&e, &path, &[&format!("mode {mode:o}"), "must be 0600"]);
            }
            other => panic!("expected Mode, got {other:?}"),
        }
    }
}

/// A file owned by another user (uid 12345): `NotOwner`, with both uids. Needs root to
/// chown; as another user the test says so and checks nothing.
#[test]
fn other_owner() {
    let dir = TempDir::new("owner");
    let path = ring_file(&dir, "ring");
    if let Err(e) = std::os::unix::fs::chown(&path, Some(12345), None) {
        eprintln!("other_owner: cannot chown as this user ({e}); not checked");
        return;
    }
    match refused(&path) {
        e @ AttachError::NotOwner { uid, our_uid, .. } => {
            assert_eq!(uid, 12345);
            assert_eq!(
                our_uid,
                std::fs::metadata(dir.path()).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap()
            );
            says(&e, &path, &["owned by uid 12345"]);
        }
        other => panic!("expected NotOwner, got {other:?}"),
    }
}

/// A symbolic link to a valid ring: `Symlink` (rings are never opened through links).
#[test]
fn symlink() {
    let dir = TempDir::new("symlink");
    let path = ring_file(&dir, "ring");
    let link = dir.join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    match refused(&link) {
        e @ AttachError::Symlink(_) => says(&e, &link, &["symbolic link"]),
        other => panic!("expected Symlink, got {other:?}"),
    }
}

/// A FIFO: `NotRegular`. A directory cannot even be opened for writing: `Io`, whose
/// message names the path and says it is a directory.
#[test]
fn not_a_regular_file() {
    let dir = TempDir::new("notreg");
    let fifo = dir.join("fifo");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    match refused(&fifo) {
        e @ AttachError::NotRegular(_) => says(&e, &fifo, &["not a regular file"]),
        other => panic!("expected NotRegular, got {other:?}"),
    }

    let sub = dir.join("dir");
    std::fs::create_dir(&sub).unwrap();
    match refused(&sub) {
        e @ AttachError::Io { .. } => says(&e, &sub, &["directory"]),
        other => panic!("expected Io (is a directory), got {other:?}"),
    }
}

/// A file shorter than a ring header (empty, or 100 bytes): `TooShort`, with both sizes.
#[test]
fn too_short() {
    let dir = TempDir::new("short");
    for len in [0u64, 100, HEADER_BYTES as u64 - 1] {
        let path = dir.join(&format!("short{len}"));
        let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
        file.set_len(len).unwrap();
        match refused(&path) {
            e @ AttachError::TooShort { len: found, need, .. } => {
                assert_eq!((found, need), (len, HEADER_BYTES as u64));
                says(&e, &path, &[&format!("{len} bytes is too short")]);
            }
            other => panic!("expected TooShort, got {other:?}"),
        }
    }
}

/// While this process holds the producer (consumer) role, a second producer (consumer) is
/// refused, through the same `Ring` or another attach of the file: `RoleTaken`, naming the
/// role and the holder's pid. Once the first handle is dropped, the role can be taken again.
#[test]
fn second_producer_or_consumer() {
    let dir = TempDir::new("roles");
    let path = ring_file(&dir, "ring");
    let ring = Ring::attach(&path).unwrap();
    let other = Ring::attach(&path).unwrap();
    let me = std::process::id();

    let producer = ring.producer().expect("first producer");
    let consumer = ring.consumer().expect("first consumer");
    for (role, attempt) in [
        ("producer", ring.producer().map(drop)),
        ("producer", other.producer().map(drop)),
        ("consumer", ring.consumer().map(drop)),
        ("consumer", other.consumer().map(drop)),
    ] {
        match attempt {
            Err(e @ AttachError::RoleTaken { role: r, pid, .. }) => {
                assert_eq!((r, pid), (role, me));
                says(&e, &path, &[&format!("pid {me} already is its {role} and is alive")]);
            }
            other => panic!("second {role}: expected RoleTaken, got {other:?}"),
        }
    }
    drop(producer);
    drop(consumer);
    other.producer().expect("producer role free again");
    other.consumer().expect("consumer role free again");
}

/// A run directory with mode 0755, or owned by another user, is refused by `Ring::create`:
/// `UnsafeDir`, saying the mode and owner and how to fix it; no file is created.
#[test]
fn unsafe_run_directory() {
    let dir = TempDir::new("rundir");
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    match Ring::create(open.join("ring"), CONFIG) {
        Err(e @ CreateError::UnsafeDir { mode: 0o755, .. }) => says(&e, &open, &["mode 755", "chmod 700"]),
        other => panic!("expected UnsafeDir, got {other:?}"),
    }
    assert!(!open.join("ring").exists());

    let foreign = dir.join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o700)).unwrap();
    if std::os::unix::fs::chown(&foreign, Some(12345), None).is_ok() {
        match Ring::create(foreign.join("ring"), CONFIG) {
            Err(e @ CreateError::UnsafeDir { uid: 12345, .. }) => says(&e, &foreign, &["owner uid 12345"]),
            other => panic!("expected UnsafeDir, got {other:?}"),
        }
    }
}

/// Creating over an existing file is refused (`Exists`) and leaves that file as it was.
#[test]
fn create_over_existing_file() {
    let dir = TempDir::new("exists");
    let path = ring_file(&dir, "ring");
    {
        let ring = Ring::attach(&path).unwrap();
        assert!(ring.producer().unwrap().push(weir_ring::RecordKind::Data, b"still here").unwrap());
    }
    match Ring::create(&path, RingConfig { slot_count: 32, ..CONFIG }) {
        Err(e @ CreateError::Exists(_)) => says(&e, &path, &["already exists"]),
        other => panic!("expected Exists, got {other:?}"),
    }
    let ring = Ring::attach(&path).expect("the old ring is intact");
    assert_eq!(ring.config(), CONFIG);
    let mut consumer = ring.consumer().unwrap();
    match consumer.read().unwrap() {
        weir_ring::Read::Record(view) => assert_eq!(view.payload(), b"still here"),
        other => panic!("the old record is gone: {other:?}"),
    }
}

/// `WEIR_RING_STALE_CHILD=<dir>`: create rings `a` and `b` in `dir`, hold the producer role
/// on both and the consumer role on `b`, and exit without letting go (as a crash would).
const STALE_ENV: &str = "WEIR_RING_STALE_CHILD";

/// The child's side of `dead_roles_and_stale_rings`; does nothing as an ordinary test.
#[test]
fn child_creator() {
    let Ok(dir) = std::env::var(STALE_ENV) else { return };
    let dir = Path::new(&dir);
    let a = Ring::create(dir.join("a"), CONFIG).expect("child: create a");
    let b = Ring::create(dir.join("b"), CONFIG).expect("child: create b");
    let roles = (a.producer().unwrap(), b.producer().unwrap(), b.consumer().unwrap());
    // No drop: the header keeps saying this process holds the roles, as after a crash.
    std::mem::forget(roles);
}

/// A ring created by a process that has exited while holding roles: `status` shows the
/// roles held by a pid that is not alive and the creator dead; `producer()` takes the dead
/// role over; `remove_if_stale` keeps a ring with a live side (ours; returns false), removes
/// one whose creator and sides are all dead (returns true), keeps a ring whose creator
/// lives, and leaves a file that is not a ring alone (an error, not a removal).
#[test]
fn dead_roles_and_stale_rings() {
    let dir = TempDir::new("stale");
    let mut child = spawn_self("child_creator", (STALE_ENV, dir.path().display().to_string()));
    let status = child.wait(common::STALL);
    assert!(status.success(), "child failed: {status}");
    let child_pid = child.id();
    let (a, b) = (dir.join("a"), dir.join("b"));

    let ring_a = Ring::attach(&a).expect("attach a");
    let st = ring_a.status();
    let producer = st.producer.expect("the dead child still shows as producer");
    assert_eq!(producer.pid, child_pid);
    assert!(!producer.alive, "a dead producer shows as alive");
    assert!(st.consumer.is_none());
    assert!(!st.creator_alive, "a dead creator shows as alive");
    let st_b = Ring::attach(&b).unwrap().status();
    assert!(st_b.producer.is_some_and(|p| p.pid == child_pid && !p.alive));
    assert!(st_b.consumer.is_some_and(|c| c.pid == child_pid && !c.alive));

    // Take over the dead producer; with a live side (us), `a` is not stale.
    let mut taken = ring_a.producer().expect("take over a dead producer");
    assert!(taken.push(weir_ring::RecordKind::Data, b"x").unwrap());
    let me = ring_a.status().producer.expect("producer after takeover");
    assert_eq!(me.pid, std::process::id());
    assert!(me.alive);
    assert!(!remove_if_stale(&a).unwrap(), "a ring with a live producer was removed");
    assert!(a.exists());

    // Everything on `b` is dead: removed.
    assert!(remove_if_stale(&b).unwrap(), "a stale ring was kept");
    assert!(!b.exists());

    // We let go of `a`: now nobody alive uses it either.
    drop(taken);
    assert!(remove_if_stale(&a).unwrap(), "a ring whose sides and creator are dead was kept");
    assert!(!a.exists());

    // A ring whose creator (us) lives is kept even with no sides.
    let ours = ring_file(&dir, "ours");
    assert!(!remove_if_stale(&ours).unwrap(), "a ring with a live creator was removed");
    assert!(ours.exists());

    // A file that is not a ring is refused, not removed.
    let junk = dir.join("junk");
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&junk).unwrap();
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    assert!(matches!(remove_if_stale(&junk), Err(AttachError::Magic { .. })));
    assert!(junk.exists());
}
