//! Cross-process: a child process produces into a ring file, this process consumes. The
//! child is killed with SIGKILL at random moments, again and again; after each kill we
//! drain what it published and start a new child that takes over the dead producer's role
//! and continues at the next sequence number. Across all children the published records
//! must form one unbroken sequence: nothing corrupt, nothing twice, nothing missing. A
//! record the killed child had written but not published is lost and written again by
//! its successor; that is the "no torn records" guarantee, seen from outside.
//!
//! The child is this same test binary run again with `--exact child_producer` and the
//! `WEIR_RING_CHILD` variable; without the variable `child_producer` does nothing.

mod common;

use common::{
    ChildProcess, STALL, TempDir, Watchdog, XorShift, check_record, mix, record_len, spawn_self, write_record,
};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};
use weir_ring::{Claim, Consumer, IdleStrategy, Idler, Read, Ring, RingConfig};

/// `start_seq:count:path` for the child; count `-` means "until killed".
const CHILD_ENV: &str = "WEIR_RING_CHILD";
/// Rounds of spawn, random wait, SIGKILL, drain.
const KILL_ROUNDS: usize = 40;
/// Records the last child sends before it closes the ring and exits.
const FINAL_RECORDS: u64 = 20_000;
/// The ring: 128 slots of 64 bytes, records up to 1 KiB (17 slots), so it wraps often.
const CONFIG: RingConfig = RingConfig { slot_bytes: 64, slot_count: 128, max_record_bytes: 1024 };
const MAX: usize = CONFIG.max_record_bytes as usize;
const SLOT: usize = CONFIG.slot_bytes as usize;

/// The child's side: attach, take over the producer role, send records from `start_seq`,
/// `count` of them (then close and exit) or until killed. Does nothing when run as an
/// ordinary test.
#[test]
fn child_producer() {
    let Ok(arg) = std::env::var(CHILD_ENV) else { return };
    let mut parts = arg.splitn(3, ':');
    let start: u64 = parts.next().and_then(|s| s.parse().ok()).expect("start seq");
    let count: Option<u64> = parts.next().and_then(|s| s.parse().ok());
    let path = parts.next().expect("ring path");

    let ring = Ring::attach(path).expect("child: attach the ring");
    // If the consumer (our parent) dies, nobody will kill us: leave instead of waiting for
    // credit forever.
    let watcher = ring.clone();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(100));
            if !watcher.status().consumer.is_some_and(|c| c.alive) {
                eprintln!("child producer: the consumer is gone, exiting");
                std::process::exit(3);
            }
        }
    });
    let mut producer = ring.producer().expect("child: take over the producer role");
    let mut idler = Idler::new(IdleStrategy::default());
    let end = count.map_or(u64::MAX, |n| start + n);
    for seq in start..end {
        let len = record_len(seq, MAX, SLOT);
        producer.wait_for_credit(len, &mut idler).expect("child: ring stays healthy");
        match producer.claim(len).expect("child: ring stays healthy") {
            Claim::Granted(mut slot) => {
                write_record(seq, &mut slot);
                // Mostly deferred, so a kill often finds committed but unpublished records.
                if mix(seq).is_multiple_of(4) {
                    slot.commit();
                } else {
                    slot.commit_deferred();
                }
            }
            Claim::NoCredit => panic!("child: seq {seq}: no credit right after wait_for_credit returned"),
        }
    }
    // Publishes the last batch and closes the ring.
    drop(producer);
}

/// Read every published record, checking that each is record `next` and whole, releasing
/// them at once or deferred. Returns how many were read and whether the ring is closed.
fn drain(consumer: &mut Consumer, next: &mut u64) -> (u64, bool) {
    let mut read = 0;
    loop {
        match consumer.read().expect("parent: ring stays healthy") {
            Read::Record(view) => {
                if let Err(e) = check_record(*next, view.payload(), MAX, SLOT) {
                    panic!("parent: {e}");
                }
                if mix(*next ^ 7).is_multiple_of(2) {
                    view.release();
                } else {
                    view.release_deferred();
                }
                *next += 1;
                read += 1;
            }
            // Empty publishes deferred releases first.
            Read::Empty => return (read, false),
            Read::Closed => return (read, true),
        }
    }
}

fn spawn_child(path: &Path, start: u64, count: Option<u64>) -> ChildProcess {
    let count = count.map_or("-".to_owned(), |n| n.to_string());
    spawn_self("child_producer", (CHILD_ENV, format!("{start}:{count}:{}", path.display())))
}

/// 40 children SIGKILLed at random points (0–20 ms after they take the producer role, or
/// after they start for every fifth one, so some die while attaching), then one that sends
/// its records and exits normally: every published record arrives exactly once, in order,
/// whole; each new child takes over the dead one's role; after the last child closes the
/// ring the consumer reads its last record and then `Closed`.
#[test]
fn killed_producers_lose_nothing_published() {
    let dir = TempDir::new("xproc");
    let path = dir.join("ring");
    let ring = Ring::create(&path, CONFIG).expect("create ring file");
    let mut consumer = ring.consumer().expect("consumer role");
    let watchdog = Watchdog::start("killed_producers_lose_nothing_published", STALL);
    let mut rng = XorShift::new(0x5eed_0001);
    let mut next = 0u64;
    let mut read_per_round = Vec::with_capacity(KILL_ROUNDS);

    for round in 0..KILL_ROUNDS {
        let from_spawn = round % 5 == 4;
        let delay = Duration::from_micros(rng.below(20_001));
        let before = next;
        let mut child = spawn_child(&path, next, None);
        let pid = child.id();
        if !from_spawn {
            // Start the clock when the child holds the producer role.
            while ring.status().producer.is_none_or(|p| p.pid != pid) {
                if let Some(status) = child.try_wait() {
                    panic!("round {round}: child exited before taking the producer role: {status}");
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let deadline = Instant::now() + delay;
        while Instant::now() < deadline {
            if drain(&mut consumer, &mut next).0 == 0 {
                // Nothing published: sleep on the ring's futex; the child's publish wakes us.
                consumer.park(Duration::from_millis(1));
            }
            watchdog.tick();
        }
        let status = child.kill();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "round {round}: the child must die by our SIGKILL, not end by itself ({status})"
        );
        let (_, closed) = drain(&mut consumer, &mut next);
        assert!(!closed, "round {round}: a killed producer must not close the ring");
        let st = ring.status();
        assert!(st.poisoned.is_none(), "round {round}: {:?}", st.poisoned);
        assert!(!st.producer.is_some_and(|p| p.alive), "round {round}: the killed producer shows as alive");
        assert_eq!(st.backlog, 0, "round {round}: drained, yet {} slots in use", st.backlog);
        read_per_round.push(next - before);
        watchdog.tick();
    }

    // The last child sends FINAL_RECORDS, closes the ring and exits.
    let before = next;
    let mut child = spawn_child(&path, next, Some(FINAL_RECORDS));
    loop {
        let (read, closed) = drain(&mut consumer, &mut next);
        if closed {
            break;
        }
        if read == 0 {
            consumer.park(Duration::from_millis(1));
        }
        watchdog.tick();
    }
    let status = child.wait(STALL);
    assert!(status.success(), "the last child failed: {status}");
    assert_eq!(next - before, FINAL_RECORDS, "the ring closed before the last child's records all arrived");
    assert!(matches!(consumer.read().unwrap(), Read::Closed), "Closed stays Closed");
    assert!(ring.status().producer_closed);

    let killed_with_records = read_per_round.iter().filter(|&&n| n > 0).count();
    eprintln!(
        "cross_process: {} records, contiguous and whole, from {KILL_ROUNDS} killed children ({killed_with_records} of \
         them published something; per child min {} max {}) and one that closed after {FINAL_RECORDS}",
        next,
        read_per_round.iter().min().unwrap(),
        read_per_round.iter().max().unwrap(),
    );
}
