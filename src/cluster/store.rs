//! The checkpoint store the instances share, through the `object_store` crate: a directory
//! (local or a network file system) or, with the `s3` feature, an S3 bucket.
//!
//! ```text
//!  <job>/runs/<run>/n<ns>/chk-<n>/<subtask>/<node>.state      operator bytes
//!  <job>/runs/<run>/n<ns>/chk-<n>/<subtask>/<node>.rocksdb/…  a shard snapshot's small files
//!  <job>/runs/<run>/n<ns>/sst/<inode>-<mtime>-<name>.sst      its SST files, each uploaded once
//!  <job>/runs/<run>/n<ns>/txn/<transactional id>.c<n>.log     prepared Kafka transaction logs
//!  <job>/runs/<run>/alive                                     the run's heartbeat
//!  <job>/partitions/<p>/<epoch>-<checkpoint>.json              pointers, newest last
//!
//!  <run> = <instance>-<started ms> (one per process); <ns>: see [`LocalCopies`]
//! ```
//!
//! A **pointer** says where partition `p`'s state is: the parts of every subtask of index `p`
//! in one checkpoint of one instance, with the store key of each file (and the prepared
//! transaction logs of its Kafka sinks). An instance that starts serving a partition
//! **claims** it first: it writes `<epoch>-0.json`, an empty pointer with an epoch above every
//! one there, and only then reads the newest pointer with content. Publishing checkpoint `n`
//! writes `<epoch>-<n>.json` and then looks again: a newer epoch means another instance has
//! claimed the partition since, and the checkpoint fails — its sinks do not commit. With a
//! store that reads its own writes (a file system; S3 since 2020), an owner that is paused
//! past its session timeout and resumes (a zombie) can commit nothing the new owner does not
//! see: either its pointer came before the claim, and the new owner restores from it, or its
//! checkpoint fails. (Kafka fences it as well: the new owner's sinks take over the same
//! transactional ids, per partition.)
//!
//! # What is removed, and when
//!
//! Pointers: each publish keeps the newest [`POINTERS_KEPT`] with content of its partition.
//! Files: a pointer names files of the run that wrote it only, so a file no pointer names is
//! garbage — unless a run still means to reuse it (an SST it uploaded once and names again in
//! its next checkpoint). So each run writes a heartbeat (`runs/<run>/alive`) at most once a
//! minute when it publishes, and after a publish, at most once a minute and on a thread of
//! its own (a slow store delays no checkpoint), [`CheckpointStore::collect_garbage`]
//! removes (1) the run's own files no pointer names (and forgets them, so they are
//! uploaded again if named again), and (2) the unnamed files of
//! other runs whose heartbeat is older than [`RUN_GRACE`] (30 min) — a dead process's; a run
//! none of whose files is named any more is removed whole. A run that comes back after its
//! heartbeat went stale (a process paused, or cut off from the store, for that long) uploads
//! everything again before it names it. A pointer that cannot be read stops the collection:
//! nothing is removed on a guess.

use crate::checkpoint::{BlobRef, Manifest, ShardRef, SubtaskSnapshot};
use object_store::ObjectStore;
use object_store::path::Path as StorePath;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Pointer format version.
const FORMAT: u32 = 1;
/// Content pointers kept per partition (older ones are removed, and then the files only they
/// named, by [`CheckpointStore::collect_garbage`]).
pub const POINTERS_KEPT: usize = 4;
/// How long a run may go without a heartbeat before other instances take it for dead and
/// remove its files no pointer names.
pub const RUN_GRACE: std::time::Duration = std::time::Duration::from_secs(30 * 60);
/// A run's heartbeat, and its collection of garbage, at most this often.
const HOUSEKEEPING_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
/// A run's heartbeat file, under its directory.
const ALIVE: &str = "alive";

/// A store operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("checkpoint store {store}: {what}")]
pub struct StoreError {
    /// The store, as configured (credentials never shown).
    pub store: String,
    /// What failed, and why.
    pub what: String,
    /// A newer owner claimed the partition (not a failure of the store).
    pub fenced: bool,
}

/// One file of a stored checkpoint part: where it goes under the local checkpoint root, and
/// its key in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// Relative to the subtask part's own directory (see [`StoredPart`]).
    pub path: String,
    pub key: String,
    pub bytes: u64,
}

/// One subtask's part of a checkpoint, as stored: its snapshot (paths relative to the
/// checkpoint root it was taken in) and the store keys of its files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPart {
    pub snapshot: SubtaskSnapshot,
    /// Every file the snapshot names, by its path relative to the checkpoint root.
    pub files: Vec<StoredFile>,
}

/// Where a partition's state is (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pointer {
    pub format: u32,
    pub job: String,
    pub partition: u32,
    pub epoch: u64,
    /// The instance that wrote it.
    pub instance: String,
    /// Its checkpoint id in that instance's checkpoint directory; 0: a claim (no content).
    pub checkpoint: u64,
    pub max_key_groups: u32,
    /// Every subtask of index `partition`.
    pub parts: Vec<StoredPart>,
    /// Prepared transaction logs of the partition's Kafka sinks (file name → key).
    pub logs: Vec<StoredFile>,
    pub written_unix_ms: u64,
    /// The manifest format of the checkpoint its parts come from (1 where absent: written
    /// before the field): format 2's operator bytes are in envelopes.
    #[serde(default = "manifest_format_1")]
    pub manifest_format: u32,
    /// The job's nodes as that checkpoint recorded them (format 2), for the restore's checks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nodes: BTreeMap<String, crate::checkpoint::upgrade::NodeRecord>,
}

fn manifest_format_1() -> u32 {
    1
}

/// A checkpoint store, opened for one job.
#[derive(Clone)]
pub struct CheckpointStore {
    inner: Arc<dyn ObjectStore>,
    shown: String,
    job: String,
}

impl std::fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStore").field("store", &self.shown).field("job", &self.job).finish()
    }
}

/// Drive one store call to its end on this thread. The local backend needs no runtime (it
/// runs inline); S3's HTTP client needs tokio's, one for the process (a worker thread).
#[cfg(not(feature = "s3"))]
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

#[cfg(feature = "s3")]
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("weir-store-io")
                .enable_all()
                .build()
                .expect("a tokio runtime for the S3 store")
        })
        .block_on(f)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl CheckpointStore {
    /// Open `url` for `job`: a directory path (created if missing) or `file:///path`;
    /// `s3://bucket/prefix` with the `s3` feature (credentials and endpoint from the usual
    /// `AWS_*` variables).
    pub fn open(url: &str, job: &str) -> Result<CheckpointStore, StoreError> {
        let err = |what: String| StoreError { store: url.to_owned(), what, fenced: false };
        let inner: Arc<dyn ObjectStore> = if let Some(rest) = url.strip_prefix("s3://") {
            open_s3(rest).map_err(err)?
        } else {
            let path = url.strip_prefix("file://").unwrap_or(url);
            if path.contains("://") {
                return Err(err("unknown scheme: give a directory, file:///path or s3://bucket/prefix".into()));
            }
            std::fs::create_dir_all(path).map_err(|e| err(format!("cannot create the directory: {e}")))?;
            Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(path)
                    .map_err(|e| err(format!("cannot open the directory: {e}")))?,
            )
        };
        let store = CheckpointStore { inner, shown: url.to_owned(), job: job.to_owned() };
        // Reach it now: a store that is down is said at start, not at the first checkpoint.
        store.list(&format!("{job}/partitions"))?;
        Ok(store)
    }

    fn err(&self, what: String) -> StoreError {
        StoreError { store: self.shown.clone(), what, fenced: false }
    }

    fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let path = StorePath::from(key);
        block_on(self.inner.put(&path, bytes.into())).map_err(|e| self.err(format!("cannot write {key}: {e}")))?;
        Ok(())
    }

    /// The object at `key`, with the store's own error (a caller may tell "not found").
    fn fetch(&self, key: &str) -> object_store::Result<bytes::Bytes> {
        let path = StorePath::from(key);
        block_on(async { self.inner.get(&path).await?.bytes().await })
    }

    fn get(&self, key: &str) -> Result<bytes::Bytes, StoreError> {
        self.fetch(key).map_err(|e| self.err(format!("cannot read {key}: {e}")))
    }

    fn delete(&self, key: &str) {
        let _ = block_on(self.inner.delete(&StorePath::from(key)));
    }

    /// Keys under `prefix`, with when each was last written (unix ms) and its size.
    fn list_meta(&self, prefix: &str) -> Result<Vec<(String, u64, u64)>, StoreError> {
        use futures::StreamExt;
        let path = StorePath::from(prefix);
        block_on(async {
            let mut out = Vec::new();
            let mut stream = self.inner.list(Some(&path));
            while let Some(meta) = stream.next().await {
                let meta = meta?;
                let written = u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0);
                out.push((meta.location.to_string(), written, meta.size));
            }
            Ok::<_, object_store::Error>(out)
        })
        .map_err(|e| self.err(format!("cannot list {prefix}: {e}")))
    }

    /// Write the heartbeat of `run` (`<job>/runs/<instance>-<started ms>`).
    pub fn heartbeat(&self, run: &str, instance: &str) -> Result<(), StoreError> {
        let body = serde_json::json!({ "instance": instance, "pid": std::process::id(), "unix_ms": unix_ms() });
        self.put(&format!("{run}/{ALIVE}"), body.to_string().into_bytes())
    }

    /// The keys the pointers in the store name; `pointers` caches what each pointer names
    /// (pointer files never change). A pointer that cannot be read is an error.
    fn named_keys(&self, pointers: &mut HashMap<String, Vec<String>>) -> Result<HashSet<String>, StoreError> {
        let listed: BTreeSet<String> =
            self.list(&format!("{}/partitions", self.job))?.into_iter().filter(|k| k.ends_with(".json")).collect();
        pointers.retain(|k, _| listed.contains(k));
        for key in &listed {
            if pointers.contains_key(key) {
                continue;
            }
            let bytes = match self.fetch(key) {
                Ok(b) => b,
                // Removed since the listing (a publish keeps only the newest): it names nothing.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(self.err(format!("cannot read {key}; nothing removed: {e}"))),
            };
            let p: Pointer = serde_json::from_slice(&bytes)
                .map_err(|e| self.err(format!("the pointer {key} does not parse; nothing removed: {e}")))?;
            let named = p.parts.iter().flat_map(|part| &part.files).chain(&p.logs).map(|f| f.key.clone()).collect();
            pointers.insert(key.clone(), named);
        }
        Ok(pointers.values().flatten().cloned().collect())
    }

    /// Remove what no pointer names (see the module docs): every such file of `own_run`
    /// (this process's run) and those of other runs whose heartbeat is older than `grace` at
    /// `now_ms`. The run's own files to remove are settled holding `publishing` (the lock
    /// a publish holds), with the pointers read again, and forgotten in `local` (which moves
    /// to a new namespace of keys) before any is removed: no publish names a file being
    /// removed, or uploads one under its key.
    pub fn collect_garbage(
        &self,
        own_run: &str,
        pointers: &mut HashMap<String, Vec<String>>,
        local: &LocalCopies,
        publishing: &Mutex<()>,
        grace: std::time::Duration,
        now_ms: u64,
    ) -> Result<Collected, StoreError> {
        let named = self.named_keys(pointers)?;
        let runs_prefix = format!("{}/runs/", self.job);
        let mut runs: BTreeMap<String, Vec<(String, u64, u64)>> = BTreeMap::new();
        for (key, written, size) in self.list_meta(&format!("{}/runs", self.job))? {
            let Some(run) = key.strip_prefix(&runs_prefix).and_then(|r| r.split_once('/')).map(|(r, _)| r) else {
                continue;
            };
            runs.entry(format!("{runs_prefix}{run}")).or_default().push((key, written, size));
        }
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let alive = |run: &str| format!("{run}/{ALIVE}");
        // Other runs: those silent for longer than the grace.
        runs.retain(|run, files| {
            if run == own_run {
                return true;
            }
            // The heartbeat, or the newest file of a run that wrote none.
            let beat = files
                .iter()
                .find(|(k, _, _)| *k == alive(run))
                .map(|(_, w, _)| *w)
                .unwrap_or_else(|| files.iter().map(|(_, w, _)| *w).max().unwrap_or(0));
            now_ms.saturating_sub(beat) >= grace_ms
        });
        let unnamed = |named: &HashSet<String>, run: &str, files: &[(String, u64, u64)]| -> Vec<(String, u64)> {
            files
                .iter()
                .filter(|(k, _, _)| *k != alive(run) && !named.contains(k))
                .map(|(k, _, size)| (k.clone(), *size))
                .collect()
        };
        let mut own: Vec<(String, u64)> =
            runs.get(own_run).map(|files| unnamed(&named, own_run, files)).unwrap_or_default();
        let named = if own.is_empty() {
            named
        } else {
            let _publishing = publishing.lock().unwrap_or_else(|e| e.into_inner());
            // A publish may have named some since: read the pointers again.
            let named = self.named_keys(pointers)?;
            own.retain(|(k, _)| !named.contains(k));
            local.forget(&own.iter().map(|(k, _)| k.clone()).collect());
            named
        };
        let mut done = Collected::default();
        let remove = |files: &[(String, u64)], done: &mut Collected| {
            for (key, size) in files {
                self.delete(key);
                done.files += 1;
                done.bytes += size;
            }
        };
        remove(&own, &mut done);
        for (run, files) in runs.iter().filter(|(run, _)| *run != own_run) {
            // Looked at again just before removing: a run that has just come back keeps its
            // files (it uploads everything again, in a new namespace).
            if let Ok(again) = self.list_meta(&alive(run))
                && again.iter().any(|(_, w, _)| now_ms.saturating_sub(*w) < grace_ms)
            {
                continue;
            }
            let gone = unnamed(&named, run, files);
            let whole = gone.len() + usize::from(files.iter().any(|(k, _, _)| *k == alive(run))) == files.len();
            remove(&gone, &mut done);
            if whole {
                self.delete(&alive(run));
                done.runs += 1;
            }
        }
        Ok(done)
    }

    /// Keys under `prefix`, sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut keys: Vec<String> = self.list_meta(prefix)?.into_iter().map(|(key, _, _)| key).collect();
        keys.sort();
        Ok(keys)
    }

    fn pointer_dir(&self, partition: u32) -> String {
        format!("{}/partitions/{partition:05}", self.job)
    }

    /// `(epoch, checkpoint, key)` of every pointer of `partition`, oldest first.
    fn pointers(&self, partition: u32) -> Result<Vec<(u64, u64, String)>, StoreError> {
        let mut out: Vec<(u64, u64, String)> = self
            .list(&self.pointer_dir(partition))?
            .into_iter()
            .filter_map(|key| {
                let name = key.rsplit('/').next()?.strip_suffix(".json")?;
                let (epoch, checkpoint) = name.split_once('-')?;
                Some((epoch.parse().ok()?, checkpoint.parse().ok()?, key.clone()))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Claim `partition` for `instance`: an epoch above every one in the store. Returns it
    /// and the newest pointer with content (what the partition restores from), if any.
    pub fn claim(&self, partition: u32, instance: &str) -> Result<(u64, Option<Pointer>), StoreError> {
        let before = self.pointers(partition)?;
        let epoch = before.iter().map(|(e, _, _)| *e).max().unwrap_or(0) + 1;
        let claim = Pointer {
            format: FORMAT,
            job: self.job.clone(),
            partition,
            epoch,
            instance: instance.to_owned(),
            checkpoint: 0,
            max_key_groups: 0,
            parts: Vec::new(),
            logs: Vec::new(),
            written_unix_ms: unix_ms(),
            manifest_format: crate::checkpoint::MANIFEST_FORMAT,
            nodes: BTreeMap::new(),
        };
        let key = format!("{}/{epoch:010}-{:012}.json", self.pointer_dir(partition), 0);
        self.put(&key, serde_json::to_vec_pretty(&claim).expect("pointers serialize"))?;
        // Read after the claim: whatever an older owner publishes from now on fails.
        let after = self.pointers(partition)?;
        if let Some((e, _, _)) = after.iter().find(|(e, _, _)| *e > epoch) {
            return Err(self.err(format!(
                "partition {partition} was claimed at epoch {e} by another instance while this one claimed it at {epoch}"
            )));
        }
        let newest = after.iter().rev().find(|(e, c, _)| *e < epoch && *c > 0);
        let pointer = match newest {
            None => None,
            Some((_, _, key)) => {
                let bytes = self.get(key)?;
                let p: Pointer = serde_json::from_slice(&bytes)
                    .map_err(|e| self.err(format!("the pointer {key} does not parse: {e}")))?;
                if p.format != FORMAT || p.partition != partition || p.job != self.job {
                    return Err(self.err(format!("the pointer {key} is not partition {partition} of {}", self.job)));
                }
                Some(p)
            }
        };
        Ok((epoch, pointer))
    }

    /// Write `pointer` (content, at its epoch), then check that no newer epoch exists.
    fn publish_pointer(&self, pointer: &Pointer) -> Result<(), StoreError> {
        let dir = self.pointer_dir(pointer.partition);
        let key = format!("{dir}/{:010}-{:012}.json", pointer.epoch, pointer.checkpoint);
        self.put(&key, serde_json::to_vec_pretty(pointer).expect("pointers serialize"))?;
        let all = self.pointers(pointer.partition)?;
        if let Some((e, _, k)) = all.iter().find(|(e, _, _)| *e > pointer.epoch) {
            let who = self
                .get(k)
                .ok()
                .and_then(|b| serde_json::from_slice::<Pointer>(&b).ok())
                .map_or_else(|| "another instance".to_owned(), |p| format!("instance `{}`", p.instance));
            let mut e = self.err(format!(
                "partition {} was claimed by {who} (epoch {e} > this instance's {}): this instance no longer owns it",
                pointer.partition, pointer.epoch
            ));
            e.fenced = true;
            return Err(e);
        }
        // Keep the newest few with content (and every claim above them).
        let contents: Vec<&(u64, u64, String)> = all.iter().filter(|(_, c, _)| *c > 0).collect();
        if contents.len() > POINTERS_KEPT {
            let oldest_kept = contents[contents.len() - POINTERS_KEPT];
            for (e, c, k) in &all {
                if (*e, *c) < (oldest_kept.0, oldest_kept.1) {
                    self.delete(k);
                }
            }
        }
        Ok(())
    }

    fn download(&self, key: &str, to: &Path) -> Result<u64, StoreError> {
        let bytes = self.get(key)?;
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.err(format!("cannot create {}: {e}", dir.display())))?;
        }
        std::fs::write(to, &bytes).map_err(|e| self.err(format!("cannot write {}: {e}", to.display())))?;
        Ok(bytes.len() as u64)
    }
}

/// `s3://bucket/prefix`: credentials, region and endpoint (an S3-compatible server) from the
/// usual `AWS_*` variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
/// `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`); requests are retried by object_store's own policy
/// (bounded, with backoff) before a call fails.
#[cfg(feature = "s3")]
fn open_s3(rest: &str) -> Result<Arc<dyn ObjectStore>, String> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err("no bucket: give s3://bucket/prefix".into());
    }
    // object_store panics signing a request to an endpoint that is no URL: say so first.
    for var in ["AWS_ENDPOINT", "AWS_ENDPOINT_URL"] {
        if let Ok(v) = std::env::var(var) {
            let host = v.strip_prefix("http://").or_else(|| v.strip_prefix("https://"));
            if host.is_none_or(|h| h.trim_matches('/').is_empty()) {
                return Err(format!("{var} = `{v}` is not an http:// or https:// URL of the S3 endpoint"));
            }
        }
    }
    let retry = object_store::RetryConfig {
        max_retries: 3,
        retry_timeout: std::time::Duration::from_secs(10),
        ..Default::default()
    };
    let store = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_retry(retry)
        .build()
        .map_err(|e| format!("cannot open the bucket: {e}"))?;
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        return Ok(Arc::new(store));
    }
    Ok(Arc::new(object_store::prefix::PrefixStore::new(store, prefix)))
}

#[cfg(not(feature = "s3"))]
fn open_s3(_rest: &str) -> Result<Arc<dyn ObjectStore>, String> {
    Err("this weir was built without S3; build it with `--features s3`, or give a directory".into())
}

/// The partition of a subtask name `head#index`.
fn index_of(subtask: &str) -> Option<u32> {
    subtask.rsplit_once('#').and_then(|(_, i)| i.parse().ok())
}

/// The partition of a prepared transaction log `<prefix>-<index>-<k>.c<n>.log`.
fn log_partition(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(".log")?;
    let (id, c) = stem.rsplit_once(".c")?;
    c.parse::<u64>().ok()?;
    let (rest, k) = id.rsplit_once('-')?;
    k.parse::<u32>().ok()?;
    rest.rsplit_once('-')?.1.parse().ok()
}

/// Every file under `dir`, as paths relative to it.
fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let path = e.path();
            if e.file_type()?.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir).expect("under dir").to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What [`CheckpointStore::collect_garbage`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    /// Files removed, and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Runs of other processes removed whole.
    pub runs: u64,
}

/// A process's heartbeat and garbage collection in the store, shared by its generations'
/// publishers. A collection runs on a thread of its own, never on a checkpoint's path.
#[derive(Debug, Default)]
pub struct Housekeeping {
    state: Mutex<HousekeepingState>,
    /// Held by a publish from its first upload to its last pointer, and by a collection
    /// while it settles which of the run's files it removes.
    publishing: Mutex<()>,
}

#[derive(Debug, Default)]
struct HousekeepingState {
    /// What each pointer in the store names (see [`CheckpointStore::collect_garbage`]).
    pointers: HashMap<String, Vec<String>>,
    /// The last heartbeat written, and the last collection started.
    beat: Option<std::time::Instant>,
    collected: Option<std::time::Instant>,
    /// A collection is running.
    running: bool,
}

impl Housekeeping {
    fn state(&self) -> std::sync::MutexGuard<'_, HousekeepingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The files an instance uploaded, by store key: where each is on this host. A later
/// generation of the same instance restores a partition it kept from these (when they are
/// still there, at the length stored) instead of fetching them back, and immutable files
/// (SSTs, prepared logs) are uploaded once: by the name they are uploaded under, the key
/// they got.
///
/// Keys are made under `<run>/n<namespace>/`; a collection that removes some of this run's
/// files forgets them and moves to the next namespace, so a file uploaded after it never
/// takes the key of one it is removing. Entries whose file is gone (pruned checkpoints) are
/// dropped whenever the map has doubled since the last look, so it stays about the size of
/// what is on disk.
#[derive(Debug, Default)]
pub struct LocalCopies(Mutex<Copies>);

#[derive(Debug, Default)]
struct Copies {
    /// Store key → where the file is here.
    by_key: HashMap<String, PathBuf>,
    /// Immutable files: the name they were uploaded under → their store key.
    uploaded: HashMap<String, String>,
    namespace: u64,
    next_look: usize,
}

impl LocalCopies {
    fn lock(&self) -> std::sync::MutexGuard<'_, Copies> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: &str) -> Option<PathBuf> {
        self.lock().by_key.get(key).cloned()
    }

    /// The store key an immutable file `name` was uploaded under.
    fn uploaded(&self, name: &str) -> Option<String> {
        self.lock().uploaded.get(name).cloned()
    }

    fn namespace(&self) -> u64 {
        self.lock().namespace
    }

    /// Forget these keys (being removed from the store), and move to the next namespace.
    fn forget(&self, keys: &HashSet<String>) {
        let mut c = self.lock();
        c.by_key.retain(|k, _| !keys.contains(k));
        c.uploaded.retain(|_, k| !keys.contains(k));
        c.namespace += 1;
    }

    /// Forget every upload (each file is uploaded again when next named), and move to the
    /// next namespace.
    fn clear(&self) {
        let mut c = self.lock();
        c.by_key.clear();
        c.uploaded.clear();
        c.namespace += 1;
    }

    /// `key` holds the file at `path`; `name`: an immutable file's upload name.
    fn insert(&self, name: Option<&str>, key: &str, path: &Path) {
        let mut c = self.lock();
        c.by_key.insert(key.to_owned(), path.to_owned());
        if let Some(name) = name {
            c.uploaded.insert(name.to_owned(), key.to_owned());
        }
        if c.by_key.len() > c.next_look.max(4096) {
            c.by_key.retain(|_, p| p.exists());
            let Copies { by_key, uploaded, .. } = &mut *c;
            uploaded.retain(|_, k| by_key.contains_key(k));
            c.next_look = 2 * c.by_key.len();
        }
    }
}

/// What an instance's checkpoints publish, and what it learnt doing so.
pub struct Publisher {
    store: CheckpointStore,
    instance: String,
    /// `<job>/runs/<instance>-<started ms>`: one per process of the instance.
    run: String,
    /// The epoch of each partition this instance serves now.
    epochs: BTreeMap<u32, u64>,
    /// What this process uploaded, and where it is here.
    local: Arc<LocalCopies>,
    /// Its heartbeat and garbage collection.
    housekeeping: Arc<Housekeeping>,
    /// Bytes uploaded in all, and by the last checkpoint.
    pub stats: Arc<PublishStats>,
    /// A partition was claimed by a newer owner: this instance must stop serving it.
    pub fenced: std::sync::atomic::AtomicBool,
}

/// A publisher's totals.
#[derive(Debug, Default)]
pub struct PublishStats {
    pub bytes: std::sync::atomic::AtomicU64,
    pub last_bytes: std::sync::atomic::AtomicU64,
    pub checkpoints: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("run", &self.run).field("epochs", &self.epochs).finish()
    }
}

impl Publisher {
    /// Publishing for `instance`, which serves the partitions of `epochs` (claimed).
    /// `started_ms` names this process's run in the store; `local` is shared by its
    /// generations.
    pub fn new(
        store: CheckpointStore,
        instance: &str,
        started_ms: u64,
        epochs: BTreeMap<u32, u64>,
        local: Arc<LocalCopies>,
        housekeeping: Arc<Housekeeping>,
    ) -> Publisher {
        let run = format!("{}/runs/{instance}-{started_ms}", store.job);
        Publisher {
            store,
            instance: instance.to_owned(),
            run,
            epochs,
            local,
            housekeeping,
            stats: Arc::default(),
            fenced: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Upload `file` as `name` (relative to the run): its store key. An immutable file
    /// uploaded before is not uploaded again.
    fn upload(&self, name: &str, file: &Path, immutable: bool, bytes: &mut u64) -> Result<String, StoreError> {
        if immutable && let Some(key) = self.local.uploaded(name) {
            return Ok(key);
        }
        let key = format!("{}/n{}/{name}", self.run, self.local.namespace());
        let data = std::fs::read(file).map_err(|e| self.store.err(format!("cannot read {}: {e}", file.display())))?;
        *bytes += data.len() as u64;
        self.store.put(&key, data)?;
        self.local.insert(immutable.then_some(name), &key, file);
        Ok(key)
    }

    /// Publish checkpoint `m` (in `dir`, under the checkpoint `root`): the files of each
    /// owned partition's subtasks, the prepared transaction logs, then one pointer per
    /// partition. The checkpoint's sinks commit only if this succeeds.
    pub fn publish(&self, root: &Path, m: &Manifest) -> Result<(), StoreError> {
        use std::os::unix::fs::MetadataExt;
        self.keep_alive()?;
        let publishing = self.housekeeping.publishing.lock().unwrap_or_else(|e| e.into_inner());
        let mut bytes = 0u64;
        let mut pointers = Vec::new();
        let logs_dir = root.join("kafka-transactions");
        let logs: Vec<String> = std::fs::read_dir(&logs_dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| log_partition(n).is_some())
            .collect();
        for (&partition, &epoch) in &self.epochs {
            let mut parts = Vec::new();
            for s in m.subtasks.iter().filter(|s| index_of(&s.subtask) == Some(partition)) {
                let mut files = Vec::new();
                for b in &s.blobs {
                    let key = self.upload(&b.file, &root.join(&b.file), false, &mut bytes)?;
                    files.push(StoredFile { path: b.file.clone(), key, bytes: b.bytes });
                }
                for r in &s.shards {
                    let dir = root.join(&r.dir);
                    let listed =
                        files_under(&dir).map_err(|e| self.store.err(format!("cannot list {}: {e}", dir.display())))?;
                    for rel in listed {
                        let local = dir.join(&rel);
                        let meta = std::fs::metadata(&local)
                            .map_err(|e| self.store.err(format!("cannot stat {}: {e}", local.display())))?;
                        let name = rel.to_string_lossy().into_owned();
                        // SST files are immutable and shared by snapshots (hard links): one
                        // upload per file, named by its inode and modification time.
                        let (upload_name, immutable) = if name.ends_with(".sst") {
                            (
                                format!(
                                    "sst/{}-{}-{name}",
                                    meta.ino(),
                                    meta.mtime_nsec() + meta.mtime() as i64 * 1_000_000_000
                                ),
                                true,
                            )
                        } else {
                            (format!("{}/{name}", r.dir), false)
                        };
                        let key = self.upload(&upload_name, &local, immutable, &mut bytes)?;
                        files.push(StoredFile { path: format!("{}/{name}", r.dir), key, bytes: meta.len() });
                    }
                }
                parts.push(StoredPart { snapshot: s.clone(), files });
            }
            let mut stored_logs = Vec::new();
            for name in logs.iter().filter(|n| log_partition(n) == Some(partition)) {
                let local = logs_dir.join(name);
                if !local.is_file() {
                    continue; // committed and removed meanwhile
                }
                let len = std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0);
                let key = self.upload(&format!("txn/{name}"), &local, true, &mut bytes)?;
                stored_logs.push(StoredFile { path: name.clone(), key, bytes: len });
            }
            pointers.push(Pointer {
                format: FORMAT,
                job: self.store.job.clone(),
                partition,
                epoch,
                instance: self.instance.clone(),
                checkpoint: m.id,
                max_key_groups: m.max_key_groups,
                parts,
                logs: stored_logs,
                written_unix_ms: unix_ms(),
                manifest_format: m.format,
                nodes: m.nodes.clone(),
            });
        }
        for p in &pointers {
            if let Err(e) = self.store.publish_pointer(p) {
                if e.fenced {
                    self.fenced.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                return Err(e);
            }
        }
        use std::sync::atomic::Ordering::Relaxed;
        self.stats.bytes.fetch_add(bytes, Relaxed);
        self.stats.last_bytes.store(bytes, Relaxed);
        self.stats.checkpoints.fetch_add(1, Relaxed);
        drop(publishing);
        self.collect();
        Ok(())
    }

    /// Write the run's heartbeat when one is due. A run whose last heartbeat is older than
    /// half the grace may have been taken for dead: it forgets its uploads first, so this
    /// checkpoint names only files it uploads again.
    fn keep_alive(&self) -> Result<(), StoreError> {
        let mut h = self.housekeeping.state();
        let age = h.beat.map(|b| b.elapsed());
        if age.is_some_and(|a| a < HOUSEKEEPING_EVERY) {
            return Ok(());
        }
        if age.is_some_and(|a| a >= RUN_GRACE / 2) {
            tracing::warn!(
                event = "store_heartbeat_stale",
                "no heartbeat written for {:.0} s: uploading every file again",
                age.unwrap_or_default().as_secs_f64()
            );
            self.local.clear();
        }
        self.store.heartbeat(&self.run, &self.instance)?;
        h.beat = Some(std::time::Instant::now());
        Ok(())
    }

    /// After a publish, at most once a minute: start a collection of what no pointer names,
    /// on a thread of its own. A failure is logged, never the checkpoint's.
    fn collect(&self) {
        let mut h = self.housekeeping.state();
        if h.running || h.collected.is_some_and(|c| c.elapsed() < HOUSEKEEPING_EVERY) {
            return;
        }
        h.collected = Some(std::time::Instant::now());
        h.running = true;
        drop(h);
        let (store, run, local, housekeeping) =
            (self.store.clone(), self.run.clone(), self.local.clone(), self.housekeeping.clone());
        let spawned = std::thread::Builder::new().name("weir-store-gc".into()).spawn(move || {
            let started = std::time::Instant::now();
            let mut pointers = std::mem::take(&mut housekeeping.state().pointers);
            let result =
                store.collect_garbage(&run, &mut pointers, &local, &housekeeping.publishing, RUN_GRACE, unix_ms());
            let mut h = housekeeping.state();
            h.pointers = pointers;
            h.running = false;
            drop(h);
            match result {
                Ok(c) if c.files > 0 => tracing::info!(
                    event = "store_collected",
                    files = c.files,
                    bytes = c.bytes,
                    runs = c.runs,
                    "checkpoint store: removed {} files ({} bytes) no pointer names, {} dead runs whole ({:.0} ms)",
                    c.files,
                    c.bytes,
                    c.runs,
                    started.elapsed().as_secs_f64() * 1e3
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(event = "store_collect_failed", "{e}"),
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(event = "store_collect_failed", "cannot start a collection: {e}");
            self.housekeeping.state().running = false;
        }
    }
}

/// What [`materialize`] did.
#[derive(Debug, Default, Clone)]
pub struct Materialized {
    /// The checkpoint id written under the root (`None`: no partition had state).
    pub checkpoint: Option<u64>,
    /// Bytes fetched from the store.
    pub bytes: u64,
    /// Bytes copied from this process's own earlier checkpoints instead.
    pub local_bytes: u64,
    /// Partitions restored from a pointer: the instance that wrote it, and the bytes
    /// fetched for the partition.
    pub from: BTreeMap<u32, (String, u64)>,
}

/// Build, under the local checkpoint `root`, a checkpoint that holds the newest stored state
/// of each partition in `pointers` (and nothing for the job's other subtasks), so that the
/// job restores exactly those partitions: files fetched from the store, paths rewritten, a
/// manifest over all `partitions` subtasks of every chain. `next_id`: the id it gets (after
/// every one in `root`).
pub fn materialize(
    store: &CheckpointStore,
    root: &Path,
    next_id: u64,
    partitions: u32,
    pointers: &BTreeMap<u32, Pointer>,
    local: &LocalCopies,
) -> Result<Materialized, StoreError> {
    let mut done = Materialized::default();
    let Some(first) = pointers.values().next() else {
        return Ok(done);
    };
    let chk = format!("chk-{next_id}");
    let dir = root.join(&chk);
    let _ = std::fs::remove_dir_all(&dir);
    // Paths are relative to the root; each part's go under chk-<next>/ instead of their own
    // checkpoint's directory (`chk-<n>/...` or `final-<run>/...`).
    let rewrite = |path: &str| -> String {
        let rest = path.split_once('/').map_or(path, |(_, r)| r);
        format!("{chk}/{rest}")
    };
    let mut by_name: BTreeMap<String, SubtaskSnapshot> = BTreeMap::new();
    // A file this process uploaded and still has, at the length stored, is copied here;
    // anything else is fetched.
    let fetch = |f: &StoredFile, to: &Path, done: &mut Materialized| -> Result<u64, StoreError> {
        if let Some(have) = local.get(&f.key)
            && std::fs::metadata(&have).is_ok_and(|m| m.len() == f.bytes)
        {
            if let Some(dir) = to.parent() {
                std::fs::create_dir_all(dir).map_err(|e| store.err(format!("cannot create {}: {e}", dir.display())))?;
            }
            if std::fs::copy(&have, to).is_ok() {
                done.local_bytes += f.bytes;
                return Ok(0);
            }
        }
        store.download(&f.key, to)
    };
    for (partition, p) in pointers {
        let mut bytes = 0;
        for part in &p.parts {
            for f in &part.files {
                bytes += fetch(f, &root.join(rewrite(&f.path)), &mut done)?;
            }
            let s = &part.snapshot;
            let snapshot = SubtaskSnapshot {
                subtask: s.subtask.clone(),
                blobs: s.blobs.iter().map(|b| BlobRef { file: rewrite(&b.file), ..b.clone() }).collect(),
                shards: s.shards.iter().map(|r| ShardRef { dir: rewrite(&r.dir), ..r.clone() }).collect(),
            };
            by_name.insert(s.subtask.clone(), snapshot);
        }
        let logs = root.join("kafka-transactions");
        for f in &p.logs {
            bytes += fetch(f, &logs.join(&f.path), &mut done)?;
        }
        done.bytes += bytes;
        done.from.insert(*partition, (p.instance.clone(), bytes));
    }
    // Every subtask of every chain (the heads are those of the pointers' subtasks).
    let heads: BTreeSet<String> = pointers
        .values()
        .flat_map(|p| &p.parts)
        .filter_map(|part| part.snapshot.subtask.rsplit_once('#').map(|(h, _)| h.to_owned()))
        .collect();
    let mut subtasks = Vec::new();
    for head in &heads {
        for i in 0..partitions {
            let name = format!("{head}#{i}");
            subtasks.push(by_name.remove(&name).unwrap_or(SubtaskSnapshot {
                subtask: name,
                blobs: Vec::new(),
                shards: Vec::new(),
            }));
        }
    }
    // Operator bytes are read by the manifest's format: partitions stored by instances of
    // another format cannot be restored together (a rolling upgrade across weir versions
    // restores what the newest format's instances stored, after the old ones are gone).
    let formats: BTreeSet<u32> = pointers.values().map(|p| p.manifest_format).collect();
    if formats.len() > 1 {
        return Err(store.err(format!(
            "the partitions' stored checkpoints are of manifest formats {formats:?} (instances of different weir \
             versions published them): restore them with instances of one version: let the old instances run \
             until every partition is republished by the new ones, or stop all and restore from one savepoint"
        )));
    }
    let m = Manifest {
        format: first.manifest_format,
        job: first.job.clone(),
        id: next_id,
        is_final: false,
        completed_unix_ms: unix_ms(),
        duration_ns: 0,
        max_key_groups: first.max_key_groups,
        subtasks,
        nodes: first.nodes.clone(),
        fingerprint: String::new(),
        lineage: None,
        savepoint: None,
        checksum: 0,
    };
    std::fs::create_dir_all(&dir).map_err(|e| store.err(format!("cannot create {}: {e}", dir.display())))?;
    m.write(&dir).map_err(|e| store.err(format!("cannot write the restored checkpoint's manifest: {e}")))?;
    done.checkpoint = Some(next_id);
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_their_partition() {
        assert_eq!(index_of("events#11"), Some(11));
        assert_eq!(index_of("events"), None);
        assert_eq!(log_partition("weir-job-out-7-2.c15.log"), Some(7));
        assert_eq!(log_partition("weir-job-out-7-2.open"), None);
        assert_eq!(log_partition("x.c1.log"), None);
    }

    /// A claim fences the older epoch: its next publish fails, naming the new owner; the
    /// claimer gets the newest pointer with content.
    #[test]
    fn a_claim_fences_the_previous_owner() {
        let dir = std::env::temp_dir().join(format!("weir-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = CheckpointStore::open(dir.to_str().unwrap(), "job").unwrap();
        let (e1, none) = store.claim(3, "a").unwrap();
        assert!(none.is_none());
        let content = |epoch, checkpoint| Pointer {
            format: FORMAT,
            job: "job".into(),
            partition: 3,
            epoch,
            instance: "a".into(),
            checkpoint,
            max_key_groups: 128,
            parts: Vec::new(),
            logs: Vec::new(),
            written_unix_ms: 0,
            manifest_format: crate::checkpoint::MANIFEST_FORMAT,
            nodes: BTreeMap::new(),
        };
        store.publish_pointer(&content(e1, 5)).unwrap();
        let (e2, got) = store.claim(3, "b").unwrap();
        assert!(e2 > e1);
        assert_eq!(got.map(|p| p.checkpoint), Some(5));
        let e = store.publish_pointer(&content(e1, 6)).unwrap_err();
        assert!(e.to_string().contains("instance `b`"), "{e}");
        // The fenced pointer is there, but a later claim takes the newest epoch's content.
        store.publish_pointer(&Pointer { instance: "b".into(), ..content(e2, 2) }).unwrap();
        let (_, got) = store.claim(3, "c").unwrap();
        assert_eq!(got.map(|p| (p.instance, p.checkpoint)), Some(("b".into(), 2)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Garbage: a run's own unnamed files go at once (and are forgotten), another run's only
    /// once its heartbeat is older than the grace, a dead run none of whose files is named
    /// goes whole; named files stay; an unreadable pointer removes nothing.
    #[test]
    fn what_no_pointer_names_is_collected() {
        let dir = std::env::temp_dir().join(format!("weir-store-gc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = CheckpointStore::open(dir.to_str().unwrap(), "job").unwrap();
        let (a, b) = ("job/runs/a-1", "job/runs/b-2");
        let put = |key: &str| store.put(key, vec![7; 10]).unwrap();
        for f in ["x", "y", "old"] {
            put(&format!("{a}/chk-1/{f}"));
            put(&format!("{b}/chk-1/{f}"));
        }
        store.heartbeat(a, "a").unwrap();
        store.heartbeat(b, "b").unwrap();
        let file = |key: &str| StoredFile { path: "p".into(), key: key.into(), bytes: 10 };
        let pointer = |partition, instance: &str, run: &str| Pointer {
            format: FORMAT,
            job: "job".into(),
            partition,
            epoch: 1,
            instance: instance.into(),
            checkpoint: 1,
            max_key_groups: 128,
            parts: vec![StoredPart {
                snapshot: SubtaskSnapshot { subtask: format!("w#{partition}"), blobs: Vec::new(), shards: Vec::new() },
                files: vec![file(&format!("{run}/chk-1/x"))],
            }],
            logs: vec![file(&format!("{run}/chk-1/y"))],
            written_unix_ms: 0,
            manifest_format: crate::checkpoint::MANIFEST_FORMAT,
            nodes: BTreeMap::new(),
        };
        store.publish_pointer(&pointer(0, "a", a)).unwrap();
        store.publish_pointer(&pointer(1, "b", b)).unwrap();
        let exists = |key: &str| dir.join(key).is_file();
        let local = LocalCopies::default();
        local.insert(Some("chk-1/old"), &format!("{a}/chk-1/old"), Path::new("/nowhere"));
        let mut cache = HashMap::new();
        let publishing = Mutex::new(());
        let hour = std::time::Duration::from_secs(3600);

        // a collects: its own unnamed file goes; b's heartbeat is fresh: all of b stays.
        let c = store.collect_garbage(a, &mut cache, &local, &publishing, hour, unix_ms()).unwrap();
        assert_eq!(c, Collected { files: 1, bytes: 10, runs: 0 });
        assert!(!exists(&format!("{a}/chk-1/old")) && local.get(&format!("{a}/chk-1/old")).is_none());
        assert_eq!((local.uploaded("chk-1/old"), local.namespace()), (None, 1), "forgotten, in a new namespace");
        assert!(exists(&format!("{a}/chk-1/x")) && exists(&format!("{a}/chk-1/y")));
        assert!(exists(&format!("{b}/chk-1/old")));

        // Two hours later b is taken for dead: its unnamed file goes, its named ones stay.
        let later = unix_ms() + 2 * 3600 * 1000;
        let c = store.collect_garbage(a, &mut cache, &local, &publishing, hour, later).unwrap();
        assert_eq!(c, Collected { files: 1, bytes: 10, runs: 0 });
        assert!(exists(&format!("{b}/chk-1/x")) && exists(&format!("{b}/chk-1/y")) && exists(&format!("{b}/alive")));

        // b's pointer replaced by a's: nothing of b is named any more; b goes whole.
        store.delete("job/partitions/00001/0000000001-000000000001.json");
        store.publish_pointer(&Pointer { epoch: 2, ..pointer(1, "a", a) }).unwrap();
        let c = store.collect_garbage(a, &mut cache, &local, &publishing, hour, later).unwrap();
        assert_eq!(c, Collected { files: 2, bytes: 20, runs: 1 });
        assert!(store.list_meta(b).unwrap().is_empty(), "{:?}", store.list_meta(b));

        // A pointer that does not parse: nothing removed.
        put(&format!("{a}/chk-2/z"));
        store.put("job/partitions/00002/0000000001-000000000001.json", b"{".to_vec()).unwrap();
        let e = store.collect_garbage(a, &mut cache, &local, &publishing, hour, later).unwrap_err();
        assert!(e.to_string().contains("nothing removed"), "{e}");
        assert!(exists(&format!("{a}/chk-2/z")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
