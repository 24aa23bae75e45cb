//! Where a job starts from and keeps its keyed state: the checkpoint to restore, and the
//! RocksDB shards (one per core the stateful subtasks run on), rebuilt from that checkpoint.

use super::StartError;
use super::plan::Plan;
use crate::checkpoint::CheckpointError;
use crate::graph::GraphInner;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// RocksDB's part of the budget: the backend's parts, and the allocator's slack over them.
/// No RocksDB setting bounds the slack: glibc gives each allocating thread its own arena,
/// and memtable chunks and cache blocks are allocated by some threads and freed by others,
/// so each arena keeps its own high-water mark. tests/state_memory.rs measured RSS growth
/// up to 1.15 x the backend's parts with glibc's defaults; half of them is allowed.
#[cfg(feature = "rocksdb")]
pub(super) fn rocksdb_budget(state: Option<&JobState>) -> Vec<(String, u64)> {
    let Some(backend) = state.and_then(|s| s.backend.as_ref()) else { return Vec::new() };
    let mut parts = backend.budget_parts();
    let total: u64 = parts.iter().map(|(_, b)| b).sum();
    parts.push(("rocksdb allocator slack (glibc arenas): half the rocksdb parts".into(), total / 2));
    parts
}

/// No RocksDB in this build: nothing of it in the budget.
#[cfg(not(feature = "rocksdb"))]
pub(super) fn rocksdb_budget(_state: Option<&JobState>) -> Vec<(String, u64)> {
    Vec::new()
}

/// Where the job's checkpoints are, and the one it starts from.
pub(super) struct Restore {
    pub root: PathBuf,
    pub manifest: Option<Arc<crate::checkpoint::Manifest>>,
    /// Where the files of `manifest` are: `root`, or the savepoint's directory.
    pub restored_root: PathBuf,
    pub next_id: u64,
    /// The nodes whose parallelism differs from the checkpoint's.
    pub rescaled: Vec<crate::checkpoint::restore::Rescale>,
    /// The savepoint this run descends from: its checkpoints carry it.
    pub lineage: Option<String>,
    /// The job's nodes and fingerprint, as its manifests record them.
    pub nodes: std::collections::BTreeMap<String, crate::checkpoint::upgrade::NodeRecord>,
    pub fingerprint: String,
}

/// Every node of the job as checkpoints record it: operator, parallelism, how its input is
/// keyed, the state its graph declares.
pub(super) fn node_records(
    g: &GraphInner,
) -> std::collections::BTreeMap<String, crate::checkpoint::upgrade::NodeRecord> {
    use crate::checkpoint::upgrade::{KeyedInput, NodeRecord};
    g.nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let keyed = g.edges.iter().filter(|e| e.to == i).find_map(|e| {
                Some(KeyedInput { key_by: e.key_by.clone()?, key_type: e.key_type.unwrap_or("").to_owned() })
            });
            let record = NodeRecord {
                op: n.op.to_owned(),
                parallelism: n.parallelism,
                keyed: keyed.filter(|_| n.keyed),
                state: n.state_schema.clone(),
            };
            (n.id.clone(), record)
        })
        .collect()
}

/// Find the checkpoint to start from (and check it fits this graph): the newest in the
/// checkpoint directory, or the savepoint the job was told to start from unless the
/// directory holds a newer checkpoint of a run that started from it.
pub(super) fn find_restore(g: &GraphInner) -> Result<Option<Restore>, StartError> {
    let Some(settings) = &g.config.checkpoints else { return Ok(None) };
    let fail = |source: CheckpointError| StartError::Checkpoint { source };
    crate::checkpoint::restore::claim(&settings.dir).map_err(fail)?;
    let found = crate::checkpoint::restore::find(&settings.dir).map_err(fail)?;
    let mut rescaled = Vec::new();
    for w in &found.warnings {
        tracing::warn!(job = %g.config.name, "{w}");
    }
    let (manifest, restored_root) = match &settings.from_savepoint {
        None => (found.manifest, settings.dir.clone()),
        Some(sp) => {
            let saved = crate::checkpoint::savepoint::read(sp).map_err(fail)?;
            let uid = saved.savepoint.as_ref().map(|s| s.uid.clone());
            match found.manifest {
                Some(m) if m.lineage.is_some() && m.lineage == uid => {
                    tracing::info!(
                        event = "savepoint_superseded",
                        job = %g.config.name,
                        checkpoint = m.id,
                        "{} holds checkpoint {} of a run started from savepoint {}: resuming from it",
                        settings.dir.display(),
                        m.id,
                        sp.display()
                    );
                    (Some(m), settings.dir.clone())
                }
                _ => (Some(saved), sp.clone()),
            }
        }
    };
    let nodes = node_records(g);
    if let Some(m) = &manifest {
        if !settings.restore && settings.from_savepoint.is_none() {
            return Err(fail(CheckpointError::Unusable(format!(
                "{} holds checkpoint {} and restoring is off; remove the directory, or allow restoring",
                settings.dir.display(),
                m.id
            ))));
        }
        let in_rocksdb = m.subtasks.iter().flat_map(|s| &s.shards).next();
        if let Some(r) = in_rocksdb
            && g.config.state.backend != crate::graph::StateBackendKind::RocksDb
        {
            return Err(fail(CheckpointError::Unusable(format!(
                "checkpoint {} holds state in RocksDB (node {}, and maybe others) and this job keeps its state on \
                 the heap (state backend memory), which would start without it: restore it with the RocksDB \
                 backend, or start with an empty checkpoint directory",
                m.id, r.node
            ))));
        }
        let layout: Vec<(String, u32)> = g.nodes.iter().map(|n| (n.id.clone(), n.parallelism)).collect();
        rescaled = crate::checkpoint::restore::check_layout(m, &layout, g.config.max_key_groups).map_err(fail)?;
        let upgrade =
            crate::checkpoint::upgrade::check_upgrade(m, &nodes, settings.allow_dropped_state).map_err(fail)?;
        for r in &rescaled {
            tracing::info!(
                event = "rescale",
                job = %g.config.name,
                node = %r.node,
                from = r.from,
                to = r.to,
                "checkpoint {} was taken with node {} at parallelism {}; restoring it at {}: its state moves \
                 between subtasks by key group",
                m.id,
                r.node,
                r.from,
                r.to
            );
        }
        for node in &upgrade.dropped {
            tracing::warn!(
                event = "state_dropped",
                job = %g.config.name,
                node = %node,
                "checkpoint {} holds state of node {node}, which this job does not have: dropped (allowed)",
                m.id
            );
        }
        for note in &upgrade.notes {
            tracing::info!(event = "state_changed", job = %g.config.name, "checkpoint {}: {note}", m.id);
        }
        for (node, part, migration) in &upgrade.migrations {
            if let crate::record::schema::Migration::Convert { changes, .. } = migration {
                tracing::info!(
                    event = "state_converted",
                    job = %g.config.name,
                    node = %node,
                    "checkpoint {}: node {node}'s {part} convert as they are restored: {}",
                    m.id,
                    changes.join(", ")
                );
            }
        }
    }
    let lineage = match &manifest {
        Some(m) => m.savepoint.as_ref().map(|s| s.uid.clone()).or_else(|| m.lineage.clone()),
        None => None,
    };
    Ok(Some(Restore {
        root: settings.dir.clone(),
        manifest: manifest.map(Arc::new),
        restored_root,
        next_id: found.next_id,
        rescaled,
        lineage,
        nodes,
        fingerprint: g.fingerprint(),
    }))
}

/// The job's state backend, and whether its directory goes with the job. (Never made in a
/// build without the `rocksdb` feature: keyed state is then on the heap.)
#[cfg_attr(not(feature = "rocksdb"), allow(dead_code))]
pub(super) struct JobState {
    #[cfg(feature = "rocksdb")]
    pub backend: Option<Arc<crate::state::StateBackend>>,
    pub dir: PathBuf,
    /// The directory was made for this job (not given): remove it at the end.
    pub owned: bool,
    /// The shard of each stateful subtask, by (chain, index).
    pub shard_of: HashMap<(usize, u32), usize>,
}

impl Drop for JobState {
    fn drop(&mut self) {
        // Close every shard before removing their files.
        #[cfg(feature = "rocksdb")]
        drop(self.backend.take());
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Without the `rocksdb` feature keyed state is on the heap ([`StateBackendKind::Memory`], the
/// default of such a build); a job that asks for RocksDB is refused, with the feature named.
///
/// [`StateBackendKind::Memory`]: crate::graph::StateBackendKind::Memory
#[cfg(not(feature = "rocksdb"))]
pub(super) fn open_state(
    g: &GraphInner,
    _plan: &Plan,
    _placement: &[Vec<Option<usize>>],
    _run_dir: &Path,
    _restore: Option<&Restore>,
) -> Result<Option<JobState>, StartError> {
    let settings = &g.config.state;
    if settings.backend == crate::graph::StateBackendKind::RocksDb && g.nodes.iter().any(|n| n.state_bytes > 0) {
        return Err(StartError::State {
            dir: settings.dir.clone().unwrap_or_default(),
            source: crate::state::StateError::Config(
                "the RocksDB state backend needs weir built with the `rocksdb` feature, and this build has none: \
                 build with `--features rocksdb`, or keep state on the heap (StateBackendKind::Memory)"
                    .into(),
            ),
        });
    }
    Ok(None)
}

/// Open the state backend if the job keeps keyed state and uses RocksDB: one shard per core
/// the stateful subtasks are pinned to (unpinned: one per host core, at most one per
/// subtask, assigned round robin).
#[cfg(feature = "rocksdb")]
pub(super) fn open_state(
    g: &GraphInner,
    plan: &Plan,
    placement: &[Vec<Option<usize>>],
    run_dir: &Path,
    restore: Option<&Restore>,
) -> Result<Option<JobState>, StartError> {
    use crate::graph::StateBackendKind;
    use crate::state::{StateBackend, StateConfig, WRITE_BUFFER_BYTES_MIN};
    let settings = &g.config.state;
    if settings.backend != StateBackendKind::RocksDb {
        return Ok(None);
    }
    let stateful: Vec<(usize, u32)> = plan
        .chains
        .iter()
        .enumerate()
        .filter(|(_, chain)| chain.nodes.iter().any(|&n| g.nodes[n].state_bytes > 0))
        .flat_map(|(ci, chain)| (0..chain.parallelism).map(move |i| (ci, i)))
        .collect();
    if stateful.is_empty() {
        return Ok(None);
    }
    let mut shard_of = HashMap::new();
    let shards = if stateful.iter().all(|&(ci, i)| placement[ci][i as usize].is_some()) {
        let mut cpus: Vec<usize> = stateful.iter().filter_map(|&(ci, i)| placement[ci][i as usize]).collect();
        cpus.sort_unstable();
        cpus.dedup();
        for &(ci, i) in &stateful {
            let cpu = placement[ci][i as usize].expect("all placed");
            shard_of.insert((ci, i), cpus.binary_search(&cpu).expect("listed"));
        }
        cpus.len()
    } else {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get()).min(stateful.len());
        for (j, &(ci, i)) in stateful.iter().enumerate() {
            shard_of.insert((ci, i), j % n);
        }
        n
    };
    let (dir, owned) = match (&settings.dir, restore) {
        (Some(d), _) => (d.clone(), false),
        // Next to the checkpoints: their snapshots are hard links of its files.
        (None, Some(r)) => (crate::checkpoint::restore::live_state_dir(&r.root), true),
        (None, None) => {
            let run = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "job".into());
            let root = super::run_dir::state_root();
            weir_ring::private_file::private_dir(&root)
                .map_err(|source| StartError::RunDir { path: root.clone(), source })?;
            (root.join(run), true)
        }
    };
    let merges: crate::state::MergeOperators =
        g.nodes.iter().filter_map(|n| Some((n.id.clone(), n.merge.clone()?))).collect();
    // What each shard was rebuilt with, to say what damage found at open takes with it.
    let mut damaged_targets: Option<(u64, Vec<crate::checkpoint::restore::ShardTarget>)> = None;
    if let Some(r) = restore {
        // The live shards are ahead of (or unrelated to) any checkpoint: rebuild them from
        // the restored one, or empty them on a fresh start.
        let restored = match &r.manifest {
            Some(m) => {
                // Every stateful node of every stateful subtask: its key groups, on its shard.
                let targets: Vec<crate::checkpoint::restore::ShardTarget> = stateful
                    .iter()
                    .flat_map(|&(ci, i)| {
                        let chain = &plan.chains[ci];
                        let shard = shard_of[&(ci, i)];
                        chain.nodes.iter().map(|&n| &g.nodes[n]).filter(|n| n.state_bytes > 0).map(move |n| {
                            crate::checkpoint::restore::ShardTarget {
                                shard,
                                node: n.id.clone(),
                                key_groups: crate::record::key_group_range(
                                    i,
                                    chain.parallelism,
                                    g.config.max_key_groups,
                                ),
                            }
                        })
                    })
                    .collect();
                // Progress on a long restore (a large state, a rescale): a line a second at
                // most, and the last one, once it took a second.
                let (started, mut said) = (std::time::Instant::now(), std::time::Instant::now());
                let mut progress = |done: usize, of: usize| {
                    let now = std::time::Instant::now();
                    if now - said >= std::time::Duration::from_secs(1)
                        || (done == of && now - started >= std::time::Duration::from_secs(1))
                    {
                        said = now;
                        tracing::info!(
                            event = "restore_progress",
                            job = %g.config.name,
                            checkpoint = m.id,
                            shards_done = done,
                            shards = of,
                            seconds = (now - started).as_secs_f64(),
                            "restoring checkpoint {}: {done} of {of} state shards rebuilt in {:.1} s",
                            m.id,
                            (now - started).as_secs_f64()
                        );
                    }
                };
                let restored = crate::checkpoint::restore::restore_shards(
                    &r.restored_root,
                    m,
                    &dir,
                    shards,
                    &targets,
                    &merges,
                    &mut progress,
                );
                damaged_targets = Some((m.id, targets));
                restored
            }
            None => (0..shards)
                .try_for_each(|i| crate::state::restore_shard(&dir, i, &[], &merges))
                .map_err(CheckpointError::State),
        };
        restored.map_err(|source| StartError::Checkpoint { source })?;
    }
    let config = StateConfig {
        // Keyed state of user operators may expire (a time to live): a compaction filter
        // drops it.
        expiring: g.nodes.iter().filter(|n| n.op == crate::graph::KEYED_STATE_OP).map(|n| n.id.clone()).collect(),
        block_cache_bytes: settings.block_cache_bytes,
        memtable_bytes: settings.memtable_bytes,
        write_buffer_bytes_max: (settings.memtable_bytes / 4).clamp(WRITE_BUFFER_BYTES_MIN, 8 << 20),
        ..StateConfig::new(&dir, shards)
    };
    let backend = StateBackend::open_with(config, merges).map_err(|source| match (&source, &damaged_targets) {
        (crate::state::StateError::Damaged { shard, .. }, Some((id, targets))) => {
            StartError::Checkpoint { source: CheckpointError::Unusable(damaged_shard(*id, *shard, targets, &source)) }
        }
        _ => StartError::State { dir: dir.clone(), source },
    })?;
    Ok(Some(JobState { backend: Some(Arc::new(backend)), dir, owned, shard_of }))
}

#[cfg(feature = "rocksdb")]
/// What a shard found damaged as it opened, after it was rebuilt from checkpoint `id`, takes
/// with it: the operators and key groups it holds, and what to do.
fn damaged_shard(
    id: u64,
    shard: usize,
    targets: &[crate::checkpoint::restore::ShardTarget],
    error: &crate::state::StateError,
) -> String {
    let mut held: Vec<String> = targets
        .iter()
        .filter(|t| t.shard == shard)
        .map(|t| format!("operator `{}` key groups {}..{}", t.node, t.key_groups.start, t.key_groups.end))
        .collect();
    held.dedup();
    format!(
        "the state restored from checkpoint {id} is damaged: {error}; shard {shard} holds {}. Checkpoints \
         share unchanged files, so an older one may hold the same damage: restore the checkpoint \
         directory from a copy, or move it away to start the job without its state",
        if held.is_empty() { "no key group of this job".to_string() } else { held.join(", ") }
    )
}
