//! The C ABI (`libweir_ring.so`, `include/weir_ring.h`) from another process: the C example
//! publisher (compiled here with `cc`) and the Python one (ctypes) feed an endpoint whose
//! job side is this test, which checks every record: its number, its bytes, the order, the
//! close. A small ring read slowly shows the C publisher meeting back pressure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use weir_ring::ipc::{Endpoint, SEQ_BYTES};
use weir_ring::{Read, RingConfig};

/// The repository's ringbuf directory.
fn ringbuf_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `libweir_ring.so`, built beside this test (the crate's cdylib). The C programs linked
/// against it find it by their rpath: they run without cargo's LD_LIBRARY_PATH, which may name
/// an older copy at the target dir's root first.
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.join("libweir_ring.so"), deps.parent().unwrap().join("libweir_ring.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libweir_ring.so not found beside {}", exe.display()))
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("weir-capi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compile the C example publisher into `dir`.
fn compile_c(dir: &Path) -> PathBuf {
    compile_example(dir, "publisher")
}

/// Compile `ringbuf/examples/c/<name>.c` into `dir`.
fn compile_example(dir: &Path, name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let lib = library();
    let out = dir.join(name);
    let status = Command::new("cc")
        .arg("-O2")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(ringbuf_dir().join("include"))
        .arg(ringbuf_dir().join(format!("examples/c/{name}.c")))
        .arg(format!("-L{}", lib.parent().unwrap().display()))
        .arg("-lweir_ring")
        .arg(format!("-Wl,-rpath,{}", lib.parent().unwrap().display()))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc runs (build-essential)");
    assert!(status.success(), "the C example compiles against weir_ring.h");
    out
}

/// Be the job: read records 0..n from the endpoint at `path` (made here), checking each
/// (`delay` between records), while `publisher` runs; return its stdout.
fn serve(path: &Path, slots: u32, n: u64, delay: Option<Duration>, publisher: &mut Command) -> String {
    let endpoint =
        Endpoint::create(path, RingConfig { slot_bytes: 64, slot_count: slots, max_record_bytes: 256 }, 0, 0)
            .expect("endpoint");
    let mut consumer = endpoint.ring().consumer().unwrap();
    let child = publisher.stdout(std::process::Stdio::piped()).spawn().expect("publisher starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut next = 0u64;
    let mut copy = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "watchdog: {next} of {n} records in 120 s");
        match consumer.read().expect("the ring stays healthy") {
            Read::Record(view) => {
                let bytes = view.copy_payload(&mut copy).to_vec();
                view.release();
                assert_eq!(bytes.len(), SEQ_BYTES + 32, "a numbered event");
                let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
                assert_eq!(word(0), next, "records in order, once");
                assert_eq!(
                    (word(1), word(2), word(3), word(4)),
                    (next % 97, next * 3, next * 1000, next),
                    "record {next}"
                );
                next += 1;
                if let Some(d) = delay {
                    std::thread::sleep(d);
                }
            }
            Read::Empty => std::thread::sleep(Duration::from_micros(50)),
            Read::Closed => break,
        }
    }
    assert_eq!(next, n, "every record, then the close");
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "publisher failed: {text}");
    text
}

fn figure(text: &str, name: &str) -> u64 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")).and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("no {name}= in {text}"))
}

#[test]
fn a_c_publisher_feeds_an_endpoint_exactly() {
    let dir = TempDir::new("c");
    let exe = compile_c(&dir.0.join("bin"));
    let path = dir.0.join("ep").join("ticks.0");
    let n = 200_000;
    let text =
        serve(&path, 256, n, None, Command::new(&exe).env_remove("LD_LIBRARY_PATH").arg(&path).arg(n.to_string()));
    assert_eq!(figure(&text, "sent"), n);
}

#[test]
fn a_c_publisher_meets_back_pressure_from_a_slow_reader() {
    let dir = TempDir::new("c-slow");
    let exe = compile_c(&dir.0.join("bin"));
    let path = dir.0.join("ep").join("ticks.0");
    let n = 2_000;
    let text = serve(
        &path,
        16,
        n,
        Some(Duration::from_micros(100)),
        Command::new(&exe).env_remove("LD_LIBRARY_PATH").arg(&path).arg(n.to_string()),
    );
    assert!(figure(&text, "no_credit") > 0, "{text}");
    assert!(figure(&text, "blocked_ns") > 0, "{text}");
}

#[test]
fn a_python_publisher_feeds_an_endpoint_exactly() {
    let dir = TempDir::new("py");
    let path = dir.0.join("ep").join("ticks.0");
    let n = 20_000;
    let text = serve(
        &path,
        64,
        n,
        None,
        Command::new("python3")
            .arg(ringbuf_dir().join("examples/python/publisher.py"))
            .arg(library())
            .arg(&path)
            .arg(n.to_string()),
    );
    assert_eq!(figure(&text, "sent"), n);
}

/// The C example subscriber reads what a job side (this test) writes: numbered records,
/// some written again (as after a restart), then the close; it skips the copies and sees
/// every record once, in order.
#[test]
fn a_c_subscriber_reads_an_endpoint_exactly() {
    let dir = TempDir::new("c-sub");
    let exe = compile_example(&dir.0.join("bin"), "subscriber");
    let path = dir.0.join("ep").join("out.0");
    let endpoint = Endpoint::create(&path, RingConfig { slot_bytes: 64, slot_count: 64, max_record_bytes: 256 }, 0, 0)
        .expect("endpoint");
    let mut producer = endpoint.ring().producer().unwrap();
    let child = Command::new(&exe)
        .env_remove("LD_LIBRARY_PATH")
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let n = 100_000u64;
    let mut send = |seq: u64| {
        let mut bytes = seq.to_le_bytes().to_vec();
        bytes.extend_from_slice(&(seq * 7).to_le_bytes());
        while !producer.push(weir_ring::RecordKind::Data, &bytes).unwrap() {
            assert!(Instant::now() < deadline, "watchdog: the subscriber stopped reading");
            std::thread::sleep(Duration::from_micros(20));
        }
        producer.publish();
    };
    for seq in 0..n / 2 {
        send(seq);
    }
    // Written again from an earlier number, as a sink restored from a checkpoint does.
    for seq in n / 2 - 1_000..n {
        send(seq);
    }
    producer.close();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "subscriber failed: {text}");
    assert_eq!((figure(&text, "received"), figure(&text, "skipped")), (n, 1_000), "{text}");
    assert_eq!(figure(&text, "bytes"), n * 8);
}

/// Issue #47: the C ABI's durable end of stream. The example `durable_publisher.c`, built
/// from the header alone, sends weir_events and ends with `weir_publisher_close_and_wait`:
/// it is told "durable" only once the job side (this test) has read the close and published
/// every record as durable; until then it waits. (Across a real job's restart: the engine's
/// `tests/ipc.rs`.)
#[test]
fn a_c_publisher_waits_until_its_end_is_durable() {
    let dir = TempDir::new("c-durable");
    let exe = compile_example(&dir.0.join("bin"), "durable_publisher");
    let path = dir.0.join("ep").join("in.0");
    let endpoint = Endpoint::create(&path, RingConfig { slot_bytes: 64, slot_count: 64, max_record_bytes: 256 }, 0, 0)
        .expect("endpoint");
    let mut consumer = endpoint.ring().consumer().unwrap();
    let mut child = Command::new(&exe)
        .env_remove("LD_LIBRARY_PATH")
        .arg(&path)
        .arg("3000")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("publisher starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut next, mut copy) = (0u64, Vec::new());
    loop {
        assert!(Instant::now() < deadline, "watchdog: {next} records in 120 s");
        match consumer.read().expect("the ring stays healthy") {
            Read::Record(view) => {
                let bytes = view.copy_payload(&mut copy).to_vec();
                view.release();
                let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
                assert_eq!(bytes.len(), SEQ_BYTES + 32, "a numbered weir_event");
                assert_eq!(
                    (word(0), word(1), word(2), word(3), word(4)),
                    (next, next % 97, next.wrapping_mul(0x9e37_79b9_7f4a_7c15), next * 1000, next),
                    "record {next}"
                );
                next += 1;
            }
            Read::Empty => std::thread::sleep(Duration::from_micros(50)),
            Read::Closed => break,
        }
    }
    assert_eq!(next, 3000);
    // Closed, not durable yet: the publisher still waits.
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.try_wait().unwrap().is_none(), "close_and_wait returned before the end was durable");
    endpoint.set_durable(next);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "watchdog: the publisher did not see its end durable");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && text.contains("durable after 0 restarts"), "{text}");
}
