//! `wait_any` (futex_waitv over several words) is woken by a plain `wake` on any one of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use weir_ring::{ParkToken, wait_any, wake};

/// A waiter on two words wakes when the other thread bumps either word and wakes it — the
/// runtime parks on its input rings and its mailbox this way. The wait's own timeout is ten
/// minutes, so only the wake can end it; a watchdog aborts the test if the wake is lost.
#[test]
fn wait_any_wakes_on_any_word() {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        if !d.load(Ordering::Acquire) {
            eprintln!("watchdog: wait_any was not woken by a wake on one of its words");
            std::process::abort();
        }
    });
    for which in 0..2 {
        let words = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
        let w = words.clone();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w[which].fetch_add(1, Ordering::Release);
            wake(&w[which]);
        });
        let t = Instant::now();
        loop {
            let tokens = [ParkToken::new(&words[0], 0), ParkToken::new(&words[1], 0)];
            wait_any(&tokens, Duration::from_secs(600));
            if words[which].load(Ordering::Acquire) != 0 {
                break;
            }
        }
        waker.join().unwrap();
        println!("word {which}: woke after {:?}", t.elapsed());
    }
    done.store(true, Ordering::Release);
}
