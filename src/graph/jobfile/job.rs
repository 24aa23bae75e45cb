//! The `[job]` section: job-wide settings (rings, idle strategy, state, checkpoints).

use super::*;
use crate::util::section::{Affects, Key, KeyType as T, UNSET};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct JobSection {
    pub(super) name: Option<Spanned<String>>,
    pub(super) max_key_groups: Option<Spanned<u32>>,
    pub(super) ring_slots: Option<Spanned<u32>>,
    pub(super) slot_bytes: Option<Spanned<u32>>,
    pub(super) max_record_bytes: Option<Spanned<u32>>,
    pub(super) idle: Option<Spanned<String>>,
    pub(super) chaining: Option<bool>,
    pub(super) pinning: Option<bool>,
    pub(super) fibers: Option<bool>,
    pub(super) watermark_idle_timeout_ms: Option<u64>,
    pub(super) inflight_target_ms: Option<Spanned<u64>>,
    pub(super) latency_interval_ms: Option<Spanned<u64>>,
    pub(super) stop_timeout_ms: Option<Spanned<u64>>,
    pub(super) state_backend: Option<Spanned<String>>,
    pub(super) state_dir: Option<PathBuf>,
    pub(super) checkpoint_dir: Option<PathBuf>,
    pub(super) checkpoint_interval_ms: Option<Spanned<u64>>,
    pub(super) checkpoint_timeout_ms: Option<Spanned<u64>>,
    pub(super) checkpoints_retained: Option<Spanned<usize>>,
    /// Instances (`weir run --instance`): the Kafka consumer group they form (default: the
    /// job's name) and the checkpoint store they share.
    pub(super) group: Option<Spanned<String>>,
    pub(super) checkpoint_store: Option<Spanned<String>>,
    pub(super) session_timeout_ms: Option<Spanned<u64>>,
}

/// The keys of `[job]`, for the reference; a test checks that they are exactly what
/// [`JobSection`] reads.
pub(super) const JOB_KEYS: &[Key] = &[
    Key::new("name", T::String, "the file's name", "The job's name: its run directory, counters file, the `weir_job` label, Kafka's default group and transactional ids."),
    Key::new("max_key_groups", T::Integer, "128", "Key groups of every key_by: the most subtasks a keyed node can have. Fixed for the job's life (a checkpoint restores only with the same).")
        .affects(Affects::Recovery),
    Key::new("ring_slots", T::Integer, "4096", "Slots per ring, a power of two (an exchange of many rings gets smaller ones, down to 1024).")
        .affects(Affects::Memory),
    Key::new("slot_bytes", T::Integer, "64", "Bytes per ring slot, a power of two.").affects(Affects::Memory),
    Key::new("max_record_bytes", T::Integer, "16384", "The largest record a ring carries; a larger one is a bad record (Kafka) or an error."),
    Key::new("idle", T::String, "park", "How a subtask with nothing to do waits: `park` (spin briefly, then sleep on a futex), `latency` (= `busy-spin`: a CPU each), `spin-yield` or `backoff`.")
        .affects(Affects::Latency),
    Key::new("chaining", T::Boolean, "true", "Fuse forward edges of equal parallelism into one thread (no ring, no copy).").affects(Affects::Latency),
    Key::new("pinning", T::Boolean, "true", "Pin each subtask to a CPU; `false` lets the threads float (a laptop, CI).").affects(Affects::Latency),
    Key::new("fibers", T::Boolean, "false", "Run the subtasks pinned to one CPU on one thread, switching where they would block (needs `pinning`; not with busy-spin).")
        .affects(Affects::Latency),
    Key::new("watermark_idle_timeout_ms", T::Integer, UNSET, "An input that sends nothing this long stops holding watermarks back.").affects(Affects::Results),
    Key::new("inflight_target_ms", T::Integer, "100", "Credit by time, end to end: each ring gets the target over the rings on the longest path through it; receivers announce what they drain in that time (0: off, rings fill).")
        .affects(Affects::Latency),
    Key::new("latency_interval_ms", T::Integer, "10", "How often each source subtask sends a latency marker, which every sink times end to end (0: none)."),
    Key::new("stop_timeout_ms", T::Integer, "10000", "How long a stop (`RunningJob::stop`, the first SIGINT or SIGTERM) may take, 100 ms to an hour: waits on the outside are given up (what was in flight is replayed from the last checkpoint); subtasks still running then are named with what they wait for, and `weir run` exits 75.")
        .affects(Affects::Failures),
    Key::new("state_backend", T::String, "rocksdb (memory without the `rocksdb` feature)", "Where keyed state beyond the caches lives: `rocksdb` (one instance per core, bounded, larger than memory) or `memory` (the heap, unbounded).")
        .affects(Affects::Memory),
    Key::new("state_dir", T::String, "`live-state/` in `checkpoint_dir`, else a directory removed when the job ends", "The RocksDB shards' directory."),
    Key::new("checkpoint_dir", T::String, UNSET, "Turn checkpoints on, here (marked `WEIR-CHECKPOINTS`); a start on a directory with checkpoints restores the newest.")
        .affects(Affects::Recovery),
    Key::new("checkpoint_interval_ms", T::Integer, "1000", "How often a checkpoint starts (needs `checkpoint_dir`); exactly-once sinks commit at this pace.")
        .affects(Affects::Delivery),
    Key::new("checkpoint_timeout_ms", T::Integer, "600000", "A checkpoint not complete by then fails, naming the subtasks that did not acknowledge and the channels without credit.")
        .affects(Affects::Recovery),
    Key::new("checkpoints_retained", T::Integer, "3", "Completed checkpoints kept.").affects(Affects::Recovery),
    Key::new("group", T::String, "the job's name", "Instances (`weir run --instance`): the Kafka consumer group they form."),
    Key::new("checkpoint_store", T::String, UNSET, "Instances: a directory every instance reaches, or `s3://bucket/prefix` (the `s3` feature), where partitions' state moves.")
        .affects(Affects::Recovery),
    Key::new("session_timeout_ms", T::Integer, "10000", "Instances: how long a silent instance keeps its partitions.").affects(Affects::Failures),
];

pub(super) fn apply_job_section(loc: &Loc, job: &Job, s: &JobSection) -> Result<(), JobFileError> {
    let idle = match &s.idle {
        None => None,
        Some(v) => Some(match v.get_ref().as_str() {
            "park" => IdleStrategy::default(),
            // The latency profile: every subtask pinned to a CPU of its own, busy-spinning
            // (for isolated cores; checked at validate: no more subtasks than CPUs).
            "busy-spin" | "latency" => IdleStrategy::BusySpin,
            "spin-yield" => IdleStrategy::SpinYield { spins: 100 },
            "backoff" => IdleStrategy::Backoff {
                spins: 64,
                yields: 8,
                min_sleep: Duration::from_micros(50),
                max_sleep: Duration::from_millis(1),
            },
            other => {
                return Err(loc.err(
                    Some(v.span()),
                    "job.idle",
                    format!("unknown idle strategy `{other}`; use park, latency (= busy-spin), spin-yield or backoff"),
                ));
            }
        }),
    };
    if let Some(v) = &s.idle
        && v.get_ref() == "latency"
        && s.pinning == Some(false)
    {
        return Err(loc.err(
            Some(v.span()),
            "job.idle",
            "the latency profile pins every subtask to a CPU of its own; remove `pinning = false`, or use idle = \"busy-spin\" unpinned",
        ));
    }
    let backend = match &s.state_backend {
        None => None,
        Some(v) => Some(match v.get_ref().as_str() {
            "rocksdb" if cfg!(feature = "rocksdb") => StateBackendKind::RocksDb,
            "rocksdb" => {
                return Err(loc.err(
                    Some(v.span()),
                    "job.state_backend",
                    super::catalogue::not_built("state_backend = \"rocksdb\"", "rocksdb")
                        + "; or set state_backend = \"memory\" (the default of this build)",
                ));
            }
            "memory" => StateBackendKind::Memory,
            other => {
                return Err(loc.err(
                    Some(v.span()),
                    "job.state_backend",
                    format!("unknown state backend `{other}`; use rocksdb or memory"),
                ));
            }
        }),
    };
    for (v, field) in [
        (&s.checkpoint_interval_ms, "job.checkpoint_interval_ms"),
        (&s.checkpoint_timeout_ms, "job.checkpoint_timeout_ms"),
    ] {
        if let Some(v) = v
            && *v.get_ref() == 0
        {
            return Err(loc.err(Some(v.span()), field, "must be at least 1 ms"));
        }
    }
    if let Some(v) = &s.checkpoints_retained
        && *v.get_ref() == 0
    {
        return Err(loc.err(Some(v.span()), "job.checkpoints_retained", "must be at least 1 (the newest checkpoint)"));
    }
    if let Some(v) = &s.inflight_target_ms
        && *v.get_ref() > 3_600_000
    {
        return Err(loc.err(
            Some(v.span()),
            "job.inflight_target_ms",
            "is over an hour; give the time data in flight may take to drain (ms), or 0 to let rings fill",
        ));
    }
    if let Some(v) = &s.latency_interval_ms
        && *v.get_ref() > 3_600_000
    {
        return Err(loc.err(
            Some(v.span()),
            "job.latency_interval_ms",
            "is over an hour; give how often sources send a latency marker (ms), or 0 for none",
        ));
    }
    if let Some(v) = &s.stop_timeout_ms
        && !(100..=3_600_000).contains(v.get_ref())
    {
        return Err(loc.err(
            Some(v.span()),
            "job.stop_timeout_ms",
            "use 100 ms to an hour: how long a stop (the first SIGINT or SIGTERM) may take before weir gives up \
             waiting and exits",
        ));
    }
    let checkpoint_field = [&s.checkpoint_interval_ms, &s.checkpoint_timeout_ms]
        .into_iter()
        .flatten()
        .next()
        .map(|v| v.span())
        .or_else(|| s.checkpoints_retained.as_ref().map(|v| v.span()));
    if s.checkpoint_dir.is_none()
        && let Some(span) = checkpoint_field
    {
        return Err(loc.err(
            Some(span),
            "job.checkpoint_dir",
            "checkpoint settings need `checkpoint_dir` (where they go)",
        ));
    }
    job.configure(|c| {
        if let Some(dir) = &s.checkpoint_dir {
            let mut k = crate::checkpoint::CheckpointSettings::new(dir);
            if let Some(v) = &s.checkpoint_interval_ms {
                k.interval = Duration::from_millis(*v.get_ref());
            }
            if let Some(v) = &s.checkpoint_timeout_ms {
                k.timeout = Duration::from_millis(*v.get_ref());
            }
            if let Some(v) = &s.checkpoints_retained {
                k.retained = *v.get_ref();
            }
            c.checkpoints = Some(k);
        }
        if let Some(v) = &s.max_key_groups {
            c.max_key_groups = *v.get_ref();
        }
        if let Some(v) = &s.ring_slots {
            c.ring_slots = *v.get_ref();
        }
        if let Some(v) = &s.slot_bytes {
            c.slot_bytes = *v.get_ref();
        }
        if let Some(v) = &s.max_record_bytes {
            c.max_record_bytes = *v.get_ref();
        }
        if let Some(i) = idle {
            c.idle = i;
        }
        if let Some(v) = s.chaining {
            c.chaining = v;
        }
        if let Some(v) = s.pinning {
            c.pinning = v;
        }
        if let Some(v) = s.fibers {
            c.fibers = v;
        }
        if let Some(v) = &s.inflight_target_ms {
            c.inflight_target = (*v.get_ref() > 0).then(|| Duration::from_millis(*v.get_ref()));
        }
        if let Some(v) = &s.latency_interval_ms {
            c.latency_interval = (*v.get_ref() > 0).then(|| Duration::from_millis(*v.get_ref()));
        }
        if let Some(v) = &s.stop_timeout_ms {
            c.stop_timeout = Duration::from_millis(*v.get_ref());
        }
        if let Some(ms) = s.watermark_idle_timeout_ms {
            c.watermark_idle_timeout = Some(Duration::from_millis(ms));
        }
        if let Some(b) = backend {
            c.state.backend = b;
        }
        if let Some(dir) = &s.state_dir {
            c.state.dir = Some(dir.clone());
        }
    });
    if let Err(e) = job.validate_settings() {
        let span = match &e {
            GraphError::Setting { field: "max_key_groups", .. } => s.max_key_groups.as_ref().map(|v| v.span()),
            GraphError::Setting { field: "name", .. } => s.name.as_ref().map(|v| v.span()),
            _ => s.ring_slots.as_ref().or(s.slot_bytes.as_ref()).or(s.max_record_bytes.as_ref()).map(|v| v.span()),
        };
        let field = match &e {
            GraphError::Setting { field: "max_key_groups", .. } => "job.max_key_groups",
            GraphError::Setting { field: "name", .. } => "job.name",
            _ => "job.ring_slots",
        };
        return Err(loc.err(span, field, e.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`JOB_KEYS`] (what the reference lists) is exactly what `[job]` reads: serde's refusal
    /// of an unknown key lists the keys it knows.
    #[test]
    fn job_keys_are_what_the_section_reads() {
        let message = match toml::from_str::<JobSection>("no_such_key = 1") {
            Ok(_) => panic!("an unknown key was accepted"),
            Err(e) => e.to_string(),
        };
        let known =
            message.split("expected one of ").nth(1).unwrap_or_else(|| panic!("serde's words changed: {message}"));
        let mut read: Vec<&str> =
            known.lines().next().unwrap_or_default().split(", ").map(|k| k.trim().trim_matches('`')).collect();
        let mut listed: Vec<&str> = JOB_KEYS.iter().map(|k| k.name).collect();
        read.sort_unstable();
        listed.sort_unstable();
        assert_eq!(read, listed, "JOB_KEYS and JobSection's fields differ");
    }
}
