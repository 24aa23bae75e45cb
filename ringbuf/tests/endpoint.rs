//! Endpoints' own checks: a link that reaches another endpoint than the one made at its path
//! (what a stale link becomes when a dead job's pid and descriptor number are reused by a
//! live job of the same user) is neither connected to nor taken for a live endpoint.

use std::path::PathBuf;
use weir_ring::RingConfig;
use weir_ring::ipc::{Endpoint, EndpointError, Publisher};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_link_to_another_endpoint_is_not_that_endpoint() {
    let dir = TempDir(std::env::temp_dir().join(format!("weir-endpoint-reuse-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let config = RingConfig { slot_bytes: 64, slot_count: 64, max_record_bytes: 256 };
    let b = dir.0.join("b.0");
    let endpoint_b = Endpoint::create(&b, config, 7, 7).unwrap();
    // Job A's stale link, now naming B's memory.
    let a = dir.0.join("a.0");
    std::os::unix::fs::symlink(std::fs::read_link(&b).unwrap(), &a).unwrap();
    let e = Publisher::connect(&a).unwrap_err();
    assert!(matches!(e, EndpointError::Absent { .. }), "{e}");
    // A restarted job A replaces the link instead of refusing it as in use.
    let endpoint_a = Endpoint::create(&a, config, 0, 0).unwrap();
    let p = Publisher::connect(&a).unwrap();
    assert_eq!(p.next_seq(), 0, "A's own endpoint");
    // And B is untouched, reachable at its own path (relative spellings agree).
    let q = Publisher::connect(&b).unwrap();
    assert_eq!(q.next_seq(), 7);
    drop((p, q, endpoint_a, endpoint_b));
}

/// The C subscriber's receive leaves a record longer than the caller's buffer in place and
/// says how long it is; a larger buffer then gets it whole.
#[test]
fn a_record_over_the_c_buffer_stays_to_be_read_again() {
    use weir_ring::capi::{weir_subscriber_connect, weir_subscriber_free, weir_subscriber_recv};
    let dir = TempDir(std::env::temp_dir().join(format!("weir-endpoint-long-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let path = dir.0.join("out.0");
    let config = RingConfig { slot_bytes: 64, slot_count: 64, max_record_bytes: 1024 };
    let endpoint = Endpoint::create(&path, config, 0, 0).unwrap();
    let mut producer = endpoint.producer().unwrap();
    let mut record = 0u64.to_le_bytes().to_vec();
    record.extend((0..300).map(|i| i as u8));
    assert!(producer.push(weir_ring::RecordKind::Data, &record).unwrap());
    producer.publish();
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let mut err = [0 as std::ffi::c_char; 256];
    // SAFETY: a NUL-terminated path and an error buffer of its stated length.
    let s = unsafe { weir_subscriber_connect(c_path.as_ptr(), err.as_mut_ptr(), err.len()) };
    assert!(!s.is_null());
    let (mut buf, mut len, mut seq) = (vec![0u8; 400], 0usize, 99u64);
    // SAFETY: a live handle; `buf` has at least the capacities passed; the outputs are ours.
    let rc = unsafe {
        weir_subscriber_recv(s, buf.as_mut_ptr().cast(), 100, &mut len, &mut seq, 0, err.as_mut_ptr(), err.len())
    };
    assert_eq!((rc, len), (3, 300), "too long: nothing copied, the length said");
    // SAFETY: as above.
    let rc = unsafe {
        weir_subscriber_recv(s, buf.as_mut_ptr().cast(), 400, &mut len, &mut seq, 0, err.as_mut_ptr(), err.len())
    };
    assert_eq!((rc, len, seq), (1, 300, 0), "the same record, whole");
    assert!(buf[..300].iter().enumerate().all(|(i, &b)| b == i as u8));
    // SAFETY: as above.
    let rc = unsafe {
        weir_subscriber_recv(s, buf.as_mut_ptr().cast(), 400, &mut len, &mut seq, 0, err.as_mut_ptr(), err.len())
    };
    assert_eq!(rc, 0, "nothing more");
    // SAFETY: a live handle, not used again.
    unsafe { weir_subscriber_free(s) };
    drop(producer);
}

/// Issue #47: a job's endpoint directory under the user's root (`ipc/<job>`) goes with the
/// last of its endpoints, whichever made it and in whatever order they end (two subtasks'
/// endpoints, the one that made the directory ending first).
#[test]
fn the_last_endpoint_of_a_job_removes_its_directory() {
    let root = weir_ring::ipc::user_root();
    let job = format!("endpoint-dirs-{}", std::process::id());
    let config = RingConfig { slot_bytes: 64, slot_count: 16, max_record_bytes: 256 };
    let paths: Vec<PathBuf> = (0..2).map(|i| weir_ring::ipc::endpoint_path(&root, &job, "in", i)).collect();
    let job_dir = paths[0].parent().unwrap().to_owned();
    for first in [0, 1] {
        let made = Endpoint::create(&paths[0], config, 0, 0).expect("the first endpoint, and the directory");
        let other = Endpoint::create(&paths[1], config, 0, 0).expect("the second endpoint");
        let (a, b) = if first == 0 { (made, other) } else { (other, made) };
        drop(a);
        assert!(job_dir.is_dir(), "one endpoint is left: the directory stays");
        drop(b);
        assert!(!job_dir.exists(), "the last endpoint removed {}", job_dir.display());
    }
}
