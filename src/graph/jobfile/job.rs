//! The `[job]` section: job-wide settings (rings, idle strategy, state, checkpoints).

use super::*;

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
            "rocksdb" => StateBackendKind::RocksDb,
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
