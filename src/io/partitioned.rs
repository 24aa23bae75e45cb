//! A file sink partitioned by time: each record goes to the directory its partition names
//! (`dt=2025-01-01/hm=10:42` under the sink's directory, say), written there by a
//! [`FileSink`] of its own (part files, two phases); a partition is *committed* — its parts
//! made final and an empty `_SUCCESS` file written beside them, Flink's `success-file` policy —
//! once the watermark is `commit_delay` past the partition's end (Flink's `partition-time`
//! trigger).
//!
//! When it commits:
//! - without checkpoints (`checkpointed = false`, the default): at that watermark;
//! - with checkpoints (`checkpointed = true`): at the first checkpoint completed after that
//!   watermark, so what a restart replays never lands in a committed partition.
//!
//! At the end of input every partition is committed. A record for a partition that was
//! committed already (it came later than the delay allowed) opens the partition again: a new
//! part, committed again. Only the partitions with records since their last commit hold a
//! file sink (an io_uring and two buffers) meanwhile.

use super::{FileSink, FileSinkConfig, Format};
use crate::operators::{Halt, Sink, SubtaskInfo};
use crate::record::Record;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The partition of a record: a relative path of one or more directories, written into the
/// (cleared) buffer given, so naming a record's partition allocates nothing.
pub type PartitionFn<T> = Arc<dyn Fn(&T, &mut String) + Send + Sync>;
/// The end of a record's partition in event time, ns (records of a partition agree).
pub type PartitionEndFn<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

/// Settings of a partitioned file sink.
pub struct PartitionedFileSinkConfig<T> {
    /// The directory the partitions are made in.
    pub dir: PathBuf,
    /// Each record's partition.
    pub partition: PartitionFn<T>,
    /// Each record's partition's end.
    pub end_ns: PartitionEndFn<T>,
    /// How long after a partition's end (by the watermark) it is committed.
    pub commit_delay: Duration,
    /// Commit at checkpoints (see the module docs).
    pub checkpointed: bool,
    /// How records become bytes.
    pub format: Format,
    /// Each partition's file sink's buffers.
    pub buffer_bytes: usize,
}

impl<T> Clone for PartitionedFileSinkConfig<T> {
    fn clone(&self) -> Self {
        PartitionedFileSinkConfig {
            dir: self.dir.clone(),
            partition: self.partition.clone(),
            end_ns: self.end_ns.clone(),
            commit_delay: self.commit_delay,
            checkpointed: self.checkpointed,
            format: self.format,
            buffer_bytes: self.buffer_bytes,
        }
    }
}

impl<T> std::fmt::Debug for PartitionedFileSinkConfig<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedFileSinkConfig")
            .field("dir", &self.dir)
            .field("commit_delay", &self.commit_delay)
            .field("checkpointed", &self.checkpointed)
            .finish()
    }
}

impl<T> PartitionedFileSinkConfig<T> {
    /// Partitions under `dir`, named by `partition`, ending at `end_ns`; lines, committed as
    /// soon as the watermark passes a partition's end, without checkpoints.
    pub fn new(dir: impl Into<PathBuf>, partition: PartitionFn<T>, end_ns: PartitionEndFn<T>) -> Self {
        PartitionedFileSinkConfig {
            dir: dir.into(),
            partition,
            end_ns,
            commit_delay: Duration::ZERO,
            checkpointed: false,
            format: Format::Lines,
            buffer_bytes: 64 * 1024,
        }
    }

    /// Commit a partition this long after its end.
    pub fn commit_delay(mut self, delay: Duration) -> Self {
        self.commit_delay = delay;
        self
    }

    /// Commit at checkpoints (the job takes them).
    pub fn checkpointed(mut self, yes: bool) -> Self {
        self.checkpointed = yes;
        self
    }
}

/// The file holding a committed partition's mark.
pub const SUCCESS_FILE: &str = "_SUCCESS";

/// One partition with records since its last commit.
struct Open<T> {
    sink: FileSink<T>,
    end_ns: u64,
    /// The checkpoint whose snapshot came after the watermark passed the commit time: the
    /// partition commits when that checkpoint completes.
    sealed_at: Option<u64>,
}

/// Writes each record into its partition's part files; see the module docs.
pub struct PartitionedFileSink<T> {
    config: PartitionedFileSinkConfig<T>,
    info: SubtaskInfo,
    open: BTreeMap<String, Open<T>>,
    /// Partitions committed by this subtask (to count them; their files stay).
    committed: BTreeSet<String>,
    watermark: u64,
    /// The partition of the record being written (kept for its capacity).
    partition: String,
}

impl<T> std::fmt::Debug for PartitionedFileSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedFileSink").field("dir", &self.config.dir).field("open", &self.open.len()).finish()
    }
}

impl<T> PartitionedFileSink<T> {
    /// A partitioned file sink for one subtask.
    pub fn new(config: PartitionedFileSinkConfig<T>, info: &SubtaskInfo) -> PartitionedFileSink<T> {
        PartitionedFileSink {
            config,
            info: info.clone(),
            open: BTreeMap::new(),
            committed: BTreeSet::new(),
            watermark: 0,
            partition: String::new(),
        }
    }

    /// Partitions this subtask has committed so far.
    pub fn committed(&self) -> usize {
        self.committed.len()
    }

    fn file_sink(&self, partition: &str) -> FileSink<T> {
        let config = FileSinkConfig {
            format: self.config.format,
            buffer_bytes: self.config.buffer_bytes,
            ..FileSinkConfig::new(self.config.dir.join(partition))
        };
        FileSink::new(config, &self.info)
    }

    /// Whether `partition` is a relative path that stays under the sink's directory.
    fn check_partition(&self, partition: &str) -> Result<(), Halt> {
        let p = Path::new(partition);
        let ok = !partition.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
        if ok {
            Ok(())
        } else {
            Err(Halt::failed(format!(
                "partitioned file sink {}: partition `{partition}` is not a relative path of directories \
                 (no `..`, no leading `/`); fix the partition function",
                self.info.name()
            )))
        }
    }
}

impl<T: Record + Display> PartitionedFileSink<T> {
    /// Make `partition` final: its parts, then the `_SUCCESS` mark.
    fn commit(&mut self, partition: &str) -> Result<(), Halt> {
        let Some(mut open) = self.open.remove(partition) else { return Ok(()) };
        Sink::finish(&mut open.sink)?;
        let mark = self.config.dir.join(partition).join(SUCCESS_FILE);
        std::fs::write(&mark, b"").map_err(|e| {
            Halt::failed(format!("partitioned file sink {}: cannot write {}: {e}", self.info.name(), mark.display()))
        })?;
        self.committed.insert(partition.to_owned());
        Ok(())
    }

    /// Write `record` into `partition`, opening it if it is not.
    fn write_into(&mut self, partition: &str, record: &T) -> Result<(), Halt> {
        // One look-up for the common case, a partition already open.
        if let Some(open) = self.open.get_mut(partition) {
            return open.sink.write(record);
        }
        self.check_partition(partition)?;
        let sink = self.file_sink(partition);
        let end_ns = (self.config.end_ns)(record);
        let open = self.open.entry(partition.to_owned()).or_insert(Open { sink, end_ns, sealed_at: None });
        open.sink.write(record)
    }

    /// The partitions whose commit time the watermark has passed.
    fn due(&self) -> Vec<String> {
        let delay = self.config.commit_delay.as_nanos().min(u64::MAX as u128) as u64;
        self.open
            .iter()
            .filter(|(_, o)| o.end_ns.saturating_add(delay) <= self.watermark)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

impl<T: Record + Display> Sink<T> for PartitionedFileSink<T> {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        let mut partition = std::mem::take(&mut self.partition);
        partition.clear();
        (self.config.partition)(record, &mut partition);
        let written = self.write_into(&partition, record);
        self.partition = partition;
        written
    }

    fn watermark(&mut self, w: u64) -> Result<(), Halt> {
        self.watermark = self.watermark.max(w);
        if !self.config.checkpointed {
            for partition in self.due() {
                self.commit(&partition)?;
            }
        }
        Ok(())
    }

    /// Each open partition's pending parts, as `<partition>\n<length>\n<file sink bytes>`.
    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        let due = if self.config.checkpointed { self.due() } else { Vec::new() };
        let mut out = Vec::new();
        for (partition, open) in &mut self.open {
            let bytes = open.sink.snapshot(checkpoint_id)?;
            if due.contains(partition) && open.sealed_at.is_none() {
                open.sealed_at = Some(checkpoint_id);
            }
            out.extend_from_slice(format!("{partition}\n{}\n", bytes.len()).as_bytes());
            out.extend_from_slice(&bytes);
        }
        Ok(out)
    }

    fn checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        let mut sealed = Vec::new();
        for (partition, open) in &mut self.open {
            open.sink.checkpoint_complete(checkpoint_id)?;
            if open.sealed_at.is_some_and(|c| c <= checkpoint_id) {
                sealed.push(partition.clone());
            }
        }
        for partition in sealed {
            self.commit(&partition)?;
        }
        Ok(())
    }

    /// Commit what the checkpoint prepared, in every partition it names; remove this
    /// subtask's in-progress parts everywhere else under the directory (records after the
    /// checkpoint, which the job replays).
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        let mut listed: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let id = from.map_or(0, |(id, _)| id);
        if let Some((_, mut bytes)) = from {
            let bad =
                |why: &str| Halt::failed(format!("partitioned file sink: checkpoint {id} does not read back ({why})"));
            while !bytes.is_empty() {
                let line = |b: &[u8]| b.iter().position(|&c| c == b'\n');
                let at = line(bytes).ok_or_else(|| bad("a partition without its length"))?;
                let partition = String::from_utf8_lossy(&bytes[..at]).into_owned();
                bytes = &bytes[at + 1..];
                let at = line(bytes).ok_or_else(|| bad("a length without its line"))?;
                let len: usize = std::str::from_utf8(&bytes[..at])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad("a length"))?;
                bytes = &bytes[at + 1..];
                if bytes.len() < len {
                    return Err(bad("cut short"));
                }
                self.check_partition(&partition)?;
                listed.insert(partition, bytes[..len].to_vec());
                bytes = &bytes[len..];
            }
        }
        let mut dirs = BTreeSet::new();
        in_progress_dirs(&self.config.dir, &self.config.dir, self.info.index, &mut dirs);
        dirs.extend(listed.keys().cloned());
        for partition in dirs {
            let mut sink = self.file_sink(&partition);
            match listed.get(&partition) {
                Some(bytes) => sink.restore(Some((id, bytes)))?,
                None => sink.restore(None)?,
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Halt> {
        let all: Vec<String> = self.open.keys().cloned().collect();
        for partition in all {
            self.commit(&partition)?;
        }
        Ok(())
    }
}

/// The directories under `root` (as paths relative to `base`) holding an in-progress part of
/// subtask `index`.
fn in_progress_dirs(base: &Path, root: &Path, index: u32, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    let prefix = format!("part-{index}-");
    for e in entries.flatten() {
        let path = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            in_progress_dirs(base, &path, index, out);
        } else {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix)
                && name.ends_with(".inprogress")
                && let Ok(rel) = root.strip_prefix(base)
            {
                out.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Event;

    fn info() -> SubtaskInfo {
        SubtaskInfo {
            job: "t".into(),
            node: "files".into(),
            index: 0,
            parallelism: 1,
            max_key_groups: 128,
            owned: None,
        }
    }

    fn config(dir: &Path) -> PartitionedFileSinkConfig<Event> {
        PartitionedFileSinkConfig::new(
            dir,
            Arc::new(|e: &Event, p: &mut String| p.push_str(&format!("minute={}", e.time_ns / 60_000_000_000))),
            Arc::new(|e: &Event| (e.time_ns / 60_000_000_000 + 1) * 60_000_000_000),
        )
    }

    fn lines(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("part-"))
            .flat_map(|e| std::fs::read_to_string(e.path()).unwrap().lines().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        out.sort();
        out
    }

    /// Records go to their partition's directory; a partition is committed (final parts and
    /// `_SUCCESS`) when the watermark passes its end plus the delay, and the rest at the end.
    #[test]
    fn partitions_commit_by_the_watermark() {
        let dir = crate::util::temp_dir("partitioned");
        let mut sink = PartitionedFileSink::new(config(&dir).commit_delay(Duration::from_secs(1)), &info());
        let minute = 60_000_000_000;
        for (seq, t) in [1, minute + 5, 2].into_iter().enumerate() {
            sink.write(&Event { key: 0, value: 0, time_ns: t, seq: seq as u64 }).unwrap();
        }
        sink.watermark(minute + 999_999_999).unwrap();
        assert!(!dir.join("minute=0").join(SUCCESS_FILE).exists(), "the delay is not over");
        sink.watermark(minute + 1_000_000_000).unwrap();
        assert!(dir.join("minute=0").join(SUCCESS_FILE).exists());
        assert_eq!(lines(&dir.join("minute=0")).len(), 2);
        assert!(!dir.join("minute=1").join(SUCCESS_FILE).exists());
        // A late record opens its partition again, in a new part.
        sink.write(&Event { key: 0, value: 0, time_ns: 3, seq: 9 }).unwrap();
        sink.finish().unwrap();
        assert_eq!(lines(&dir.join("minute=0")).len(), 3);
        assert_eq!(lines(&dir.join("minute=1")).len(), 1);
        assert!(dir.join("minute=1").join(SUCCESS_FILE).exists());
        assert_eq!(sink.committed(), 2);
    }

    /// Partitions that would leave the directory are refused.
    #[test]
    fn partitions_stay_inside() {
        let dir = crate::util::temp_dir("partitioned-escape");
        let escape = PartitionedFileSinkConfig::new(
            &*dir,
            Arc::new(|_: &Event, p: &mut String| p.push_str("../x")),
            Arc::new(|_: &Event| 0),
        );
        let mut sink = PartitionedFileSink::new(escape, &info());
        let err = sink.write(&Event::default()).unwrap_err();
        assert!(err.to_string().contains("not a relative path"), "{err}");
    }

    /// With checkpoints, a due partition commits when the checkpoint after the watermark
    /// completes; a restore commits what its checkpoint prepared and removes the rest.
    #[test]
    fn checkpointed_partitions_commit_at_checkpoints() {
        let dir = crate::util::temp_dir("partitioned-checkpoints");
        let minute = 60_000_000_000;
        let mut sink = PartitionedFileSink::new(config(&dir).checkpointed(true), &info());
        sink.write(&Event { time_ns: 1, seq: 1, ..Event::default() }).unwrap();
        sink.watermark(minute).unwrap();
        assert!(!dir.join("minute=0").join(SUCCESS_FILE).exists(), "not before a checkpoint");
        let snapshot = sink.snapshot(1).unwrap();
        sink.write(&Event { time_ns: minute + 1, seq: 2, ..Event::default() }).unwrap();
        let _ = sink.snapshot(2).unwrap();
        sink.checkpoint_complete(1).unwrap();
        assert!(dir.join("minute=0").join(SUCCESS_FILE).exists());
        // A crash after checkpoint 2's snapshot, restored from checkpoint 1: minute 1's part
        // was after it and goes.
        sink.write(&Event { time_ns: minute + 2, seq: 3, ..Event::default() }).unwrap();
        let mut again = PartitionedFileSink::new(config(&dir).checkpointed(true), &info());
        again.restore(Some((1, &snapshot))).unwrap();
        assert_eq!(lines(&dir.join("minute=0")).len(), 1);
        assert!(lines(&dir.join("minute=1")).is_empty());
    }
}
