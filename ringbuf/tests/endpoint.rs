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
