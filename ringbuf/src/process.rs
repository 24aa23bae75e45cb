//! Who is alive: pids with start times (so a reused pid is not mistaken for the
//! original), and a monotonic clock for heartbeats.

/// Our process id.
pub fn pid() -> u32 {
    std::process::id()
}

/// Start time of `pid` in clock ticks since boot (`/proc/<pid>/stat` field 22),
/// or `None` if there is no such process.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')': split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts with field 3 (state); field 22 is the 20th of rest.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// Whether the process `pid` that started at `ticks` still runs (a zombie counts as dead).
pub fn alive(pid: u32, ticks: u64) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(close) = stat.rfind(')') else {
        return false;
    };
    let mut fields = stat[close + 1..].split_ascii_whitespace();
    let state = fields.next().unwrap_or("X");
    if state == "Z" || state == "X" {
        return false;
    }
    // `fields` now stands after field 3, so field 22 is the 19th left.
    fields.nth(18).and_then(|t| t.parse::<u64>().ok()) == Some(ticks)
}

/// CLOCK_MONOTONIC in milliseconds (shared by all processes on the host).
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// CLOCK_MONOTONIC_COARSE in nanoseconds: about 6 ns to read here (CLOCK_MONOTONIC, as
/// `Instant::now`, about 30 ns on this VM), advancing once per scheduler tick. For "has this
/// run for a few milliseconds" checks in hot loops; add [`coarse_resolution_ns`] to a
/// deadline so it is never early.
#[inline]
pub fn coarse_monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC_COARSE exists since Linux 2.6.32.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// How far [`coarse_monotonic_ns`] may lag the true time: its resolution (one tick, 1–10 ms).
pub fn coarse_resolution_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: as above.
    unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64).clamp(1, 100_000_000)
}

/// A field of `/proc/self/status` given in kB (`VmRSS`, `VmHWM`, ...), in bytes.
pub fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    let kb: u64 = line[field.len() + 1..].split_ascii_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident set size of this process, bytes: `/proc/self/statm`'s resident pages (what
/// `VmRSS` says, for a quarter of the kernel's work: `status` formats some fifty fields;
/// the job's monitor reads this every 50 ms beside the subtasks).
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_ascii_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|&p| p > 0)?)
}

/// Peak resident set size of this process, bytes.
pub fn hwm_bytes() -> Option<u64> {
    status_bytes("VmHWM")
}

/// Whose CPU time to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuScope {
    /// All threads of this process.
    Process,
    /// The calling thread.
    Thread,
}

/// getrusage for `scope`.
fn rusage(scope: CpuScope) -> libc::rusage {
    let who = match scope {
        CpuScope::Process => libc::RUSAGE_SELF,
        CpuScope::Thread => libc::RUSAGE_THREAD,
    };
    // SAFETY: all-zero is a valid `rusage` (plain integers).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; `who` is a valid selector.
    unsafe { libc::getrusage(who, &mut usage) };
    usage
}

/// User + system CPU time used so far (getrusage).
pub fn cpu_time(scope: CpuScope) -> std::time::Duration {
    let usage = rusage(scope);
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The calling thread's CPU time, to the nanosecond (CLOCK_THREAD_CPUTIME_ID: the scheduler's
/// running total, brought up to date by the read). getrusage's thread figure moves only when
/// the scheduler updates it (a tick or a switch), so it cannot time short intervals; this can,
/// at a system call per read (a few hundred ns).
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID exists since Linux 2.6.12.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Context switches so far (getrusage): (voluntary — slept or parked —, involuntary — the
/// CPU was taken). For the process, those of threads that have exited count too.
pub fn context_switches(scope: CpuScope) -> (u64, u64) {
    let usage = rusage(scope);
    (usage.ru_nvcsw as u64, usage.ru_nivcsw as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread's CPU clock advances by about the CPU a busy loop spends, and never back.
    #[test]
    fn thread_cpu_time_counts_work() {
        let before = thread_cpu_time();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let spent = thread_cpu_time() - before;
        assert!(spent > std::time::Duration::ZERO, "a busy loop of 20 ms took no thread CPU time");
        assert!(
            spent <= start.elapsed() + std::time::Duration::from_millis(1),
            "{spent:?} of CPU in {:?}",
            start.elapsed()
        );
    }

    /// Our own start time is readable and makes us alive; a wrong one makes us "dead".
    #[test]
    fn we_are_alive() {
        let ticks = start_ticks(pid()).expect("our own /proc stat");
        assert!(alive(pid(), ticks));
        assert!(!alive(pid(), ticks + 1));
        assert!(!alive(0, ticks));
    }

    /// `statm`'s resident pages are `status`'s VmRSS (read back to back: within a few MiB).
    #[test]
    fn rss_from_statm_is_vmrss() {
        let from_status = status_bytes("VmRSS").expect("VmRSS");
        let from_statm = rss_bytes().expect("statm");
        assert!(from_statm > 0);
        assert!(from_status.abs_diff(from_statm) < 8 << 20, "statm {from_statm} vs VmRSS {from_status}");
    }
}
