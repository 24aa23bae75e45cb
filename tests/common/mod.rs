//! Code shared by several test files.
#![allow(dead_code)]

pub mod counting;
pub mod kafka;

/// Random delays for the kill loops: a xorshift generator from a seed the test prints, so a
/// failing run can be told apart (and its seed tried again).
pub struct KillClock(u64);

impl KillClock {
    /// Seeded from the clock; prints the seed.
    pub fn from_time() -> KillClock {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        println!("seed {seed}");
        KillClock(seed | 1)
    }

    /// A delay of `min_ms` plus up to `spread_ms` more.
    pub fn next_delay(&mut self, min_ms: u64, spread_ms: u64) -> std::time::Duration {
        let x = &mut self.0;
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        std::time::Duration::from_millis(min_ms + *x % spread_ms)
    }
}
