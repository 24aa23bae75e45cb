//! One instance: join the group, and run the job for the partitions it is given, one
//! *generation* per assignment.
//!
//! ```text
//!  membership ── owned set S, stable ──► claim each p in S in the store (new epoch)
//!       ▲                                 materialize: chk-<next> from the pointers of S
//!       │                                 start the job: every node P subtasks, those of S live
//!       │                                 (checkpoints publish S's parts, then sinks commit)
//!       └── a revocation or an assignment ◄── stop the job; release; next generation
//! ```

use super::membership::{MemberSettings, Membership};
use super::store::{CheckpointStore, Housekeeping, LocalCopies, Publisher, materialize};
use crate::graph::InstanceShare;
use crate::graph::jobfile::LoadedJob;
use crate::telemetry::counters::{CounterKind, INSTANCE};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use weir_ring::counters::SharedCounter;

/// Why an instance could not run, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The job file or a setting is wrong (exit 78).
    #[error("{0}")]
    Config(String),
    /// Kafka or the checkpoint store cannot be reached (exit 69).
    #[error("{0}")]
    Unavailable(String),
    /// The group refused this instance, or a job failed to start.
    #[error("{0}")]
    Failed(String),
}

/// How long an assignment must stay the same before a generation starts on it: the
/// follow-up rebalance of a cooperative protocol comes within this.
const SETTLE: Duration = Duration::from_millis(300);
/// After a generation's job failed: wait this long before the next.
const RETRY: Duration = Duration::from_secs(1);

/// What a stopped instance did.
#[derive(Debug, Default, Clone)]
pub struct InstanceSummary {
    /// Generations started (one per distinct assignment, or after a failure).
    pub generations: u64,
    /// Bytes fetched from the store to restore partitions, in all.
    pub restored_bytes: u64,
    /// Bytes published to the store, in all.
    pub published_bytes: u64,
    /// Partitions taken over from other instances, and the bytes fetched for them.
    pub moved_partitions: u64,
    pub moved_bytes: u64,
}

/// The lead input and the instance's settings, checked.
struct Settings {
    job: String,
    /// The graph's fingerprint, carried in the group membership.
    fingerprint: String,
    group: String,
    topic: String,
    properties: Vec<(String, String)>,
    store_url: String,
    root: PathBuf,
    session_timeout: Duration,
    max_key_groups: u32,
}

fn settings(loaded: &LoadedJob) -> Result<Settings, InstanceError> {
    let config = loaded.job.config();
    let Some((id, lead)) = loaded.kafka_sources.first() else {
        return Err(InstanceError::Config(
            "instances share a job through its Kafka input's consumer group: the job has no Kafka source".into(),
        ));
    };
    if lead.bounded {
        return Err(InstanceError::Config(format!(
            "source `{id}` is bounded; instances run unbounded jobs (set bounded = false)"
        )));
    }
    let Some(checkpoints) = &config.checkpoints else {
        return Err(InstanceError::Config(
            "instances hand partitions over through checkpoints: set checkpoint_dir in [job]".into(),
        ));
    };
    let Some(store_url) = loaded.cluster.store.clone() else {
        return Err(InstanceError::Config(
            "instances share their checkpoints through a store: set checkpoint_store in [job] (a directory all \
             instances reach, or s3://bucket/prefix)"
                .into(),
        ));
    };
    let properties: Vec<(String, String)> = lead
        .client_properties()
        .into_iter()
        .filter(|(k, _)| {
            // The membership consumer's own group settings win; fetch sizes do not matter
            // (it fetches nothing).
            !matches!(
                k.as_str(),
                "group.id" | "group.instance.id" | "enable.auto.commit" | "partition.assignment.strategy"
            )
        })
        .collect();
    let group = loaded.cluster.group.clone().unwrap_or_else(|| config.name.clone());
    // The sources commit each completed checkpoint's offsets to their own group, as a client
    // outside it (for lag tools); the instances' group has members, and refuses such commits.
    if let Some((_, source_group)) = lead.client_properties().into_iter().find(|(k, _)| k == "group.id")
        && source_group == group
    {
        return Err(InstanceError::Config(format!(
            "source `{id}` commits its offsets to group `{group}`, which is the group the instances form ([job] group): \
             give the source another group.id (its committed offsets are for lag tools), or the job another group"
        )));
    }
    Ok(Settings {
        job: config.name.clone(),
        fingerprint: loaded.job.fingerprint(),
        group,
        topic: lead.topic.clone(),
        properties,
        store_url,
        root: checkpoints.dir.clone(),
        session_timeout: loaded.cluster.session_timeout.unwrap_or(Duration::from_secs(10)),
        max_key_groups: config.max_key_groups,
    })
}

fn partition_count(s: &Settings) -> Result<u32, InstanceError> {
    let mut client = ClientConfig::new();
    for (k, v) in &s.properties {
        client.set(k, v);
    }
    let consumer: BaseConsumer = client
        .create()
        .map_err(|e| InstanceError::Config(format!("cannot create a Kafka client for {}: {e}", s.topic)))?;
    let metadata = consumer
        .fetch_metadata(Some(&s.topic), Duration::from_secs(30))
        .map_err(|e| InstanceError::Unavailable(format!("cannot read the metadata of topic {}: {e}", s.topic)))?;
    let t = metadata
        .topics()
        .iter()
        .find(|t| t.name() == s.topic)
        .ok_or_else(|| InstanceError::Unavailable(format!("topic {} is not in the metadata", s.topic)))?;
    let n = t.partitions().len() as u32;
    if n == 0 || t.error().is_some() {
        return Err(InstanceError::Config(format!("topic {} has no partitions (does it exist?)", s.topic)));
    }
    if n > s.max_key_groups {
        return Err(InstanceError::Config(format!(
            "topic {} has {n} partitions and the job {} key groups; each partition needs one: raise max_key_groups",
            s.topic, s.max_key_groups
        )));
    }
    Ok(n)
}

/// The longest instance name: it owns counters, whose owner field holds
/// [`OWNER_BYTES`](weir_ring::counters::OWNER_BYTES).
const NAME_MAX: usize = 48;
const _: () = assert!(NAME_MAX <= weir_ring::counters::OWNER_BYTES);

/// Check an instance name: it names the group member, store paths, files and counters.
pub fn check_name(name: &str) -> Result<(), InstanceError> {
    if name.is_empty() || name.len() > NAME_MAX || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
    {
        return Err(InstanceError::Config(format!(
            "instance name `{name}`: use 1 to {NAME_MAX} letters, digits, `_`, `-` or `.`"
        )));
    }
    Ok(())
}

/// Run `file` as instance `name` until `stop` holds a signal number. `load` reads the job
/// file (with `${WEIR_INSTANCE}` set to the name); it is called once per generation, so
/// each generation's job is built afresh. Its error (of the caller's type: a
/// [`JobFileError`](crate::util::section::JobFileError), say) ends the instance as
/// [`InstanceError::Config`], in its words.
pub fn run<E: std::fmt::Display>(
    name: &str,
    load: &dyn Fn() -> Result<LoadedJob, E>,
    stop: &AtomicUsize,
) -> Result<InstanceSummary, InstanceError> {
    check_name(name)?;
    let first = load().map_err(|e| InstanceError::Config(e.to_string()))?;
    let s = settings(&first)?;
    drop(first);
    crate::checkpoint::restore::claim(&s.root).map_err(|e| InstanceError::Config(e.to_string()))?;
    // Two instances on one checkpoint directory would remove each other's checkpoints.
    let lock_path = s.root.join("instance.lock");
    let lock = std::fs::File::create(&lock_path)
        .map_err(|e| InstanceError::Config(format!("cannot create {}: {e}", lock_path.display())))?;
    if lock.try_lock().is_err() {
        return Err(InstanceError::Config(format!(
            "another instance runs on {}: give each instance a checkpoint_dir of its own (e.g. with \
             ${{WEIR_INSTANCE}} in it)",
            s.root.display()
        )));
    }
    let partitions = partition_count(&s)?;
    let store = CheckpointStore::open(&s.store_url, &s.job).map_err(|e| InstanceError::Unavailable(e.to_string()))?;
    let run = Process { store, started_ms: unix_ms(), local: Arc::default(), housekeeping: Arc::default() };
    let member = Membership::join(MemberSettings {
        properties: s.properties.clone(),
        topic: s.topic.clone(),
        group: s.group.clone(),
        instance: name.to_owned(),
        session_timeout: s.session_timeout,
        max_poll_interval: Duration::from_secs(300),
        identity: super::membership::Identity::new(&s.job, &s.fingerprint, name),
    })
    .map_err(|e| match e {
        // Another job's group: this job's setting must change.
        super::membership::JoinError::Refused(why) => InstanceError::Config(why),
        super::membership::JoinError::Failed(why) => InstanceError::Failed(why),
    })?;
    tracing::info!(
        event = "instance_joined",
        job = %s.job,
        instance = name,
        group = %s.group,
        partitions,
        "instance {name} joined group {} on {} ({partitions} partitions)",
        s.group,
        s.topic
    );
    let mut summary = InstanceSummary::default();
    // When the current handover began: the instance joined, or its last generation stopped.
    let mut since = Instant::now();
    loop {
        // Wait for an assignment that holds still (and release what is revoked meanwhile).
        let owned = loop {
            if stop.load(Ordering::Relaxed) != 0 {
                return Ok(summary);
            }
            let super::membership::Assignment { owned, revoking, error, changed, .. } = member.snapshot();
            if let Some(e) = error {
                return Err(InstanceError::Failed(e));
            }
            if revoking.is_some() {
                member.released();
                continue;
            }
            if !owned.is_empty() && changed.is_none_or(|c| c.elapsed() >= SETTLE) {
                break owned;
            }
            if owned.is_empty() {
                // Serving nothing, nothing waits: a handover starts when partitions come.
                since = Instant::now();
            }
            member.wait(Duration::from_millis(50));
        };
        summary.generations += 1;
        let rebalances = member.snapshot().rebalances;
        match generation(name, &s, &run, &member, partitions, &owned, load, stop, &mut summary, &mut since) {
            Ok(false) => {}
            Ok(true) => {
                // Fenced: this instance's view of the group is older than another's (a
                // zombie that has not heard of its eviction yet). Claiming again now would
                // take the partitions back from their new owner: wait for the group to say
                // (a rebalance), or, if it says nothing for two session timeouts, believe
                // what it says then.
                let deadline = Instant::now() + 2 * s.session_timeout;
                while member.snapshot().rebalances == rebalances
                    && Instant::now() < deadline
                    && stop.load(Ordering::Relaxed) == 0
                {
                    member.wait(Duration::from_millis(100));
                }
            }
            Err(e @ InstanceError::Config(_)) => return Err(e),
            Err(e) => {
                tracing::error!(event = "generation_failed", instance = name, "{e}; trying again");
                member.released();
                std::thread::sleep(RETRY);
            }
        }
    }
}

/// What this process's generations share: the store, the name of its run in it, the files
/// it uploaded (a partition it keeps is restored from them, not fetched back), and its
/// heartbeat and garbage collection in the store.
struct Process {
    store: CheckpointStore,
    started_ms: u64,
    local: Arc<LocalCopies>,
    housekeeping: Arc<Housekeeping>,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// One generation: claim, restore, run until the assignment changes or a stop. `true`: it
/// ended because another instance claimed one of its partitions.
#[allow(clippy::too_many_arguments)]
fn generation<E: std::fmt::Display>(
    name: &str,
    s: &Settings,
    run: &Process,
    member: &Membership,
    partitions: u32,
    owned: &BTreeSet<u32>,
    load: &dyn Fn() -> Result<LoadedJob, E>,
    stop: &AtomicUsize,
    summary: &mut InstanceSummary,
    since: &mut Instant,
) -> Result<bool, InstanceError> {
    let started = Instant::now();
    let store = &run.store;
    let unavailable = |e: super::store::StoreError| InstanceError::Unavailable(e.to_string());
    let mut epochs = BTreeMap::new();
    let mut pointers = BTreeMap::new();
    for &p in owned {
        let (epoch, pointer) = store.claim(p, name).map_err(unavailable)?;
        epochs.insert(p, epoch);
        if let Some(ptr) = pointer {
            pointers.insert(p, ptr);
        }
    }
    crate::checkpoint::restore::claim(&s.root).map_err(|e| InstanceError::Config(e.to_string()))?;
    let next_id = crate::checkpoint::restore::find(&s.root).map_err(|e| InstanceError::Config(e.to_string()))?.next_id;
    let restored = materialize(store, &s.root, next_id, partitions, &pointers, &run.local).map_err(unavailable)?;
    summary.restored_bytes += restored.bytes;
    // Partitions another instance served last: their state moved here.
    let moved: BTreeMap<u32, &str> =
        restored.from.iter().filter(|(_, (who, _))| who != name).map(|(p, (who, _))| (*p, who.as_str())).collect();
    let moved_bytes: u64 = restored.from.values().filter(|(who, _)| who != name).map(|(_, b)| b).sum();
    summary.moved_bytes += moved_bytes;
    summary.moved_partitions += moved.len() as u64;
    tracing::info!(
        event = "handover",
        instance = name,
        partitions = ?owned,
        from_others = ?moved,
        moved_bytes,
        restored_bytes = restored.bytes,
        local_bytes = restored.local_bytes,
        restore_ms = started.elapsed().as_secs_f64() * 1e3,
        "instance {name} serves partitions {owned:?} ({} restored from the store, {} bytes fetched, {} copied from \
         its own earlier checkpoints; {} moved from other instances, {moved_bytes} bytes; {:.0} ms)",
        restored.from.len(),
        restored.bytes,
        restored.local_bytes,
        moved.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let publisher = Arc::new(Publisher::new(
        store.clone(),
        name,
        run.started_ms,
        epochs,
        run.local.clone(),
        run.housekeeping.clone(),
    ));
    let loaded = load().map_err(|e| InstanceError::Config(e.to_string()))?;
    let publish = publisher.clone();
    loaded.job.configure(|c| {
        c.instance = Some(InstanceShare { partitions, owned: owned.clone() });
        if let Some(chk) = &mut c.checkpoints {
            chk.restore = true;
            chk.publish = Some(crate::checkpoint::Publish(Arc::new(move |root: &Path, _dir: &Path, m| {
                publish.publish(root, m).map_err(Into::into)
            })));
        }
    });
    let mut running = loaded.job.start().map_err(|e| InstanceError::Failed(format!("cannot start the job: {e}")))?;
    let handover = since.elapsed();
    let at = member.snapshot();
    tracing::info!(
        event = "generation_start",
        instance = name,
        generation = summary.generations,
        group_generation = at.generation.unwrap_or(-1),
        handover_ms = handover.as_secs_f64() * 1e3,
        counters = %running.counters_path().display(),
        "instance {name} runs generation {} on partitions {owned:?} (group generation {}): the handover took {:.0} ms; \
         weir-stat {}",
        summary.generations,
        at.generation.map_or_else(|| "unknown".to_owned(), |g| g.to_string()),
        handover.as_secs_f64() * 1e3,
        running.counters_path().display()
    );
    let gauges = match Gauges::allocate(&running, name, &s.topic, partitions, owned, summary, handover) {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::warn!("instance {name}: its counters are not in the job's counters file: {e}");
            None
        }
    };
    let ended = loop {
        if stop.load(Ordering::Relaxed) != 0 {
            running.cancel();
            break "stopped";
        }
        if running.has_failed() || running.is_finished() {
            break "ended";
        }
        let super::membership::Assignment { owned: now, revoking, error, rebalances, generation, .. } =
            member.snapshot();
        if let Some(g) = &gauges {
            g.rebalances.set(rebalances);
            g.group_generation.set(generation.map_or(0, |g| g.max(0) as u64));
        }
        if revoking.is_some() || error.is_some() {
            running.cancel();
            break "revoked";
        }
        if &now != owned {
            running.cancel();
            break "reassigned";
        }
        if publisher.fenced.load(Ordering::Relaxed) {
            // Another instance claimed one of these partitions: what the group says wins.
            running.cancel();
            break "fenced: another instance claimed a partition; waiting for the group";
        }
        member.wait(Duration::from_millis(20));
    };
    *since = Instant::now();
    let waited = running.wait();
    summary.published_bytes += publisher.stats.bytes.load(Ordering::Relaxed);
    member.released();
    match (ended, waited) {
        (_, Ok(_)) | (_, Err(crate::runtime::JobError::Cancelled)) => {
            tracing::info!(event = "generation_end", instance = name, "generation on {owned:?} {ended}");
            Ok(publisher.fenced.load(Ordering::Relaxed))
        }
        ("ended", Err(e)) => Err(InstanceError::Failed(format!("the job failed: {e}"))),
        // Stopped by us: a sink whose producer was torn down mid-delivery says so; that is
        // the stop, not a failure (the next owner restores the last published checkpoint).
        (_, Err(e)) => {
            tracing::info!(event = "generation_end", instance = name, "generation on {owned:?} {ended} ({e})");
            Ok(publisher.fenced.load(Ordering::Relaxed))
        }
    }
}

/// The instance's counters in this generation's counters file (`weir-stat`, Prometheus): the
/// figures since the process began, and which partitions it serves.
struct Gauges {
    rebalances: SharedCounter,
    group_generation: SharedCounter,
}

impl Gauges {
    fn allocate(
        running: &crate::runtime::RunningJob,
        name: &str,
        topic: &str,
        partitions: u32,
        owned: &BTreeSet<u32>,
        summary: &InstanceSummary,
        handover: Duration,
    ) -> Result<Gauges, weir_ring::counters::CountersError> {
        let counters = running.counters();
        let [generations, group_generation, rebalances, handover_ns, moved_partitions, moved_bytes, restored_bytes] =
            counters.counters(&INSTANCE, name)?;
        generations.set(summary.generations);
        handover_ns.set(u64::try_from(handover.as_nanos()).unwrap_or(u64::MAX));
        moved_partitions.set(summary.moved_partitions);
        moved_bytes.set(summary.moved_bytes);
        restored_bytes.set(summary.restored_bytes);
        for p in 0..partitions {
            // A topic too long for a counter's owner is called `lead`.
            let mut owner = format!("{topic}[{p}]");
            if owner.len() > weir_ring::counters::OWNER_BYTES {
                owner = format!("lead[{p}]");
            }
            counters.counter(CounterKind::PartitionOwned, &owner)?.set(u64::from(owned.contains(&p)));
        }
        Ok(Gauges { rebalances, group_generation })
    }
}
