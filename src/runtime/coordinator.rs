//! The checkpoint coordinator: one thread per job that triggers checkpoints at the sources,
//! collects the subtasks' acks, writes manifests, tells subtasks when a checkpoint is
//! complete, expires checkpoints that take too long, and prunes old ones.

use crate::checkpoint::{CheckpointSettings, FINAL, Manifest, Parts, SubtaskSnapshot, checkpoint_dirs};
use crate::exchange::{Control, Mailbox};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};
use weir_ring::Observer;
use weir_ring::counters::SharedCounter;

/// A subtask's answer to barrier `id` (or to the end of input: `id == FINAL`).
#[derive(Debug)]
pub(crate) struct Ack {
    pub id: u64,
    /// The subtask's index in the coordinator's list.
    pub subtask: usize,
    pub parts: Parts,
    /// Where its part of the checkpoint spent its time (`None`: a finished subtask's
    /// final parts standing in for it).
    pub timing: Option<AckTiming>,
}

/// When a subtask took its part of a checkpoint, and how long that took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AckTiming {
    /// When its snapshot began: every input's barrier in (a source: the trigger read).
    pub began: Instant,
    /// How long its input channels were blocked aligning before that, ns.
    pub alignment_ns: u64,
    /// How long the snapshot took on the subtask's thread (the operators' state written,
    /// the barrier sent on), ns.
    pub sync_ns: u64,
}

pub(crate) enum Msg {
    Ack(Ack),
    Stop,
    /// Take a savepoint (and stop the job right after it, if asked).
    Savepoint(SavepointRequest),
}

/// A savepoint asked of the coordinator ([`crate::runtime::RunningJob::savepoint`], the
/// control socket): where to, whether the job stops after it, and where the answer goes.
pub(crate) struct SavepointRequest {
    pub dir: PathBuf,
    pub stop: bool,
    pub reply: Sender<Result<SavepointTaken, super::SavepointError>>,
}

/// A savepoint taken.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavepointTaken {
    /// The checkpoint id it was taken as.
    pub id: u64,
    /// Its directory.
    pub dir: PathBuf,
    /// Bytes of its files.
    pub bytes: u64,
    /// Whether the job stopped right after it (its sinks committed what it covers).
    pub stopped: bool,
}

/// One subtask as the coordinator sees it.
pub(crate) struct Member {
    pub name: String,
    pub mailbox: Arc<Mailbox>,
    pub waiting: Arc<crate::telemetry::waiting::Waiting>,
    pub is_source: bool,
}

/// The checkpoint counters of the job, in the order of
/// [`CHECKPOINT`](crate::telemetry::counters::CHECKPOINT).
#[derive(Debug, Clone)]
pub(crate) struct Counters {
    pub last_id: SharedCounter,
    pub duration_ns: SharedCounter,
    pub alignment_ns: SharedCounter,
    pub bytes: SharedCounter,
    pub completed: SharedCounter,
    pub failed: SharedCounter,
}

impl Counters {
    pub(crate) fn new([last_id, duration_ns, alignment_ns, bytes, completed, failed]: [SharedCounter; 6]) -> Counters {
        Counters { last_id, duration_ns, alignment_ns, bytes, completed, failed }
    }
}

/// What the job reports about its checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointStats {
    /// The checkpoint the job started from.
    pub restored_from: Option<u64>,
    /// Nodes restored at another parallelism than the checkpoint's: (node, from, to).
    pub rescaled: Vec<(String, u32, u32)>,
    /// Completed checkpoints, in order: (id, duration ns, bytes).
    pub completed: Vec<(u64, u64, u64)>,
    /// Per completed checkpoint, in the same order: (id, bytes it added: operator bytes and
    /// SST files its subtasks' previous snapshots did not have).
    pub added: Vec<(u64, u64)>,
    /// Per completed checkpoint but the final one, in the same order: where its duration
    /// went (the slowest subtask in each phase).
    pub phases: Vec<CheckpointPhases>,
    /// Expired or declined checkpoints, with the reason.
    pub failed: Vec<(u64, String)>,
    /// A failure that ends the job (the final manifest could not be written).
    pub fatal: Option<String>,
    /// Savepoints taken, in order.
    pub savepoints: Vec<SavepointTaken>,
}

/// Where a checkpoint's duration went, each phase its slowest subtask's (as Flink reports
/// a checkpoint's start delay, alignment and sync durations). The duration is about the
/// start delay plus the alignment plus the sync time of the subtask that acked last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointPhases {
    pub id: u64,
    /// From the trigger to a subtask's first barrier: how long the barrier travelled behind
    /// the data in the rings (and behind work upstream), ns.
    pub start_delay_ns: u64,
    /// From a subtask's first barrier to its last (its other inputs blocked meanwhile), ns.
    pub alignment_ns: u64,
    /// A subtask's snapshot on its own thread: its operators' state written, ns.
    pub sync_ns: u64,
}

impl CheckpointPhases {
    fn of(id: u64, started: Instant, acks: &[Ack]) -> CheckpointPhases {
        let timings = || acks.iter().filter_map(|a| a.timing);
        let first_barrier = |t: AckTiming| {
            (t.began.saturating_duration_since(started).as_nanos() as u64).saturating_sub(t.alignment_ns)
        };
        CheckpointPhases {
            id,
            start_delay_ns: timings().map(first_barrier).max().unwrap_or(0),
            alignment_ns: timings().map(|t| t.alignment_ns).max().unwrap_or(0),
            sync_ns: timings().map(|t| t.sync_ns).max().unwrap_or(0),
        }
    }
}

/// The running coordinator: its thread and how to reach it.
pub(crate) struct CoordinatorHandle {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<Mutex<CheckpointStats>>,
    /// Set when the coordinator stopped the job at a savepoint.
    pub stopped_at: Arc<std::sync::OnceLock<Instant>>,
}

impl CoordinatorHandle {
    /// Where savepoint requests go.
    pub(crate) fn sender(&self) -> Sender<Msg> {
        self.tx.clone()
    }

    /// Stop the thread and wait for it.
    pub(crate) fn stop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for CoordinatorHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

struct InFlight {
    id: u64,
    started: Instant,
    acks: Vec<Option<Ack>>,
    /// This checkpoint is a savepoint's.
    savepoint: Option<SavepointRequest>,
}

pub(crate) struct Coordinator {
    pub settings: CheckpointSettings,
    pub job: String,
    pub max_key_groups: u32,
    pub members: Vec<Member>,
    /// Every channel, to name the full ones when a checkpoint expires.
    pub channels: Vec<(String, Observer)>,
    pub counters: Counters,
    /// The first id this run uses (after every id in the directory).
    pub next_id: u64,
    pub stats: Arc<Mutex<CheckpointStats>>,
    /// This run's final directory (never pruned while the run lives).
    pub final_dir: String,
    /// The blob files the last completed checkpoint named: one that names them again (a
    /// finished subtask's final parts) did not add their bytes.
    pub last_blobs: std::collections::HashSet<String>,
    /// The job's nodes and fingerprint, and the savepoint it descends from: what every
    /// manifest records ([`crate::checkpoint::upgrade`]).
    pub nodes: std::collections::BTreeMap<String, crate::checkpoint::upgrade::NodeRecord>,
    pub fingerprint: String,
    pub lineage: Option<String>,
    /// The job's `stop_timeout`: a stop at a savepoint waits at most this long for the sinks'
    /// commits, and the job's subtasks then have as long again to end (#46's stop deadline).
    pub stop_timeout: Duration,
    /// When this thread stopped the job at a savepoint (`RunningJob::wait` gives the subtasks
    /// `stop_timeout` from then, as `RunningJob::stop` does).
    pub stopped_at: Arc<std::sync::OnceLock<Instant>>,
}

impl Coordinator {
    /// Start the thread; subtasks ack into `tx`, it reads `rx`.
    pub(crate) fn spawn(self, tx: Sender<Msg>, rx: Receiver<Msg>) -> std::io::Result<CoordinatorHandle> {
        let (stats, stopped_at) = (self.stats.clone(), self.stopped_at.clone());
        let thread = std::thread::Builder::new().name("weir-checkpoint".into()).spawn(move || self.run(rx))?;
        Ok(CoordinatorHandle { tx, thread: Some(thread), stats, stopped_at })
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, CheckpointStats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(mut self, rx: Receiver<Msg>) {
        let n = self.members.len();
        let mut in_flight: Option<InFlight> = None;
        let mut next_trigger = Instant::now() + self.settings.interval;
        // The final acks of the subtasks that reached the end of their input. The others go
        // on, and so do checkpoints: a finished subtask's final parts stand for it in each
        // (see `ended_part`).
        let mut finals: Vec<Option<Ack>> = (0..n).map(|_| None).collect();
        let mut done = false;
        // A savepoint asked for while a checkpoint was in flight: it is the next one.
        let mut savepoint: Option<SavepointRequest> = None;
        loop {
            let now = Instant::now();
            let deadline = match &in_flight {
                Some(f) => f.started + self.settings.timeout,
                None if done => now + Duration::from_secs(3600),
                None => next_trigger,
            };
            match rx.recv_timeout(deadline.saturating_duration_since(now)) {
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Ok(Msg::Savepoint(req)) => {
                    let busy = savepoint.is_some() || in_flight.as_ref().is_some_and(|f| f.savepoint.is_some());
                    let refused = if done {
                        Some("the job's input has ended: it takes no more checkpoints".to_owned())
                    } else if busy {
                        Some("a savepoint is being taken already: wait for it".to_owned())
                    } else {
                        None
                    };
                    match refused {
                        Some(why) => {
                            let _ = req.reply.send(Err(super::SavepointError::Failed(why)));
                        }
                        None => {
                            savepoint = Some(req);
                            if in_flight.is_none() {
                                in_flight = Some(self.trigger(&finals, savepoint.take()));
                            }
                        }
                    }
                }
                Ok(Msg::Ack(ack)) if ack.id == FINAL => {
                    let who = ack.subtask;
                    finals[who] = Some(ack);
                    if finals.iter().all(Option::is_some) {
                        // The final checkpoint covers everything: one in flight is moot.
                        done = true;
                        for req in in_flight.take().and_then(|f| f.savepoint).into_iter().chain(savepoint.take()) {
                            let _ = req.reply.send(Err(super::SavepointError::Failed(
                                "the job's input ended before the savepoint completed: the final checkpoint covers \
                                 it all"
                                    .to_owned(),
                            )));
                        }
                        let acks: Vec<Ack> = finals.iter_mut().map(|a| a.take().expect("all acked")).collect();
                        self.complete_final(acks);
                        continue;
                    }
                    // It ended before the barrier in flight reached it: its part of that
                    // checkpoint is its final one (see `ended_part`).
                    if let Some(f) = in_flight.as_mut()
                        && f.acks[who].is_none()
                    {
                        f.acks[who] = finals[who].as_ref().map(|a| ended_part(a, f.id));
                        if f.acks.iter().all(Option::is_some) {
                            let f = in_flight.take().expect("in flight");
                            next_trigger = self.next_after(f.started);
                            if self.complete(f) {
                                return; // stopped at a savepoint
                            }
                        }
                    }
                    if in_flight.is_none() && savepoint.is_some() {
                        in_flight = Some(self.trigger(&finals, savepoint.take()));
                    }
                }
                Ok(Msg::Ack(ack)) => {
                    let Some(f) = in_flight.as_mut().filter(|f| f.id == ack.id) else {
                        continue; // a late ack of an expired or declined checkpoint
                    };
                    if !ack.parts.errors.is_empty() {
                        let reason =
                            format!("declined by {}: {}", self.members[ack.subtask].name, ack.parts.errors.join("; "));
                        let f = in_flight.take().expect("in flight");
                        next_trigger = self.next_after(f.started);
                        self.fail(f, reason);
                        if savepoint.is_some() {
                            in_flight = Some(self.trigger(&finals, savepoint.take()));
                        }
                        continue;
                    }
                    let who = ack.subtask;
                    f.acks[who] = Some(ack);
                    if f.acks.iter().all(Option::is_some) {
                        let f = in_flight.take().expect("in flight");
                        next_trigger = self.next_after(f.started);
                        if self.complete(f) {
                            return; // stopped at a savepoint
                        }
                        if savepoint.is_some() {
                            in_flight = Some(self.trigger(&finals, savepoint.take()));
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(f) = in_flight.take() {
                        if f.started.elapsed() >= self.settings.timeout {
                            let reason = self.expiry_reason(&f);
                            self.fail(f, reason);
                            next_trigger = Instant::now();
                            if savepoint.is_some() {
                                in_flight = Some(self.trigger(&finals, savepoint.take()));
                            }
                        } else {
                            in_flight = Some(f);
                        }
                    } else if !done && Instant::now() >= next_trigger {
                        in_flight = Some(self.trigger(&finals, savepoint.take()));
                    }
                }
            }
        }
    }

    /// When the checkpoint after one started at `started` is due: checkpoints keep the
    /// interval from trigger to trigger (a checkpoint every second at 1 s, however long each
    /// took), and one that took longer than the interval is followed at once.
    fn next_after(&self, started: Instant) -> Instant {
        (started + self.settings.interval).max(Instant::now())
    }

    /// Start checkpoint `id` at the sources; a subtask that has finished is not asked (it
    /// waits for the final checkpoint), its final parts are its ack.
    fn trigger(&mut self, finals: &[Option<Ack>], savepoint: Option<SavepointRequest>) -> InFlight {
        let id = self.next_id;
        self.next_id += 1;
        // Before the posts: every subtask's part begins after it (`CheckpointPhases`).
        let started = Instant::now();
        let pause = savepoint.as_ref().is_some_and(|s| s.stop);
        for (m, f) in self.members.iter().zip(finals) {
            if f.is_none() {
                m.mailbox.post(match (m.is_source, pause) {
                    (true, false) => Control::Trigger(id),
                    (true, true) => Control::TriggerAndPause(id),
                    (false, _) => Control::Expect(id),
                });
            }
        }
        let acks = finals.iter().map(|f| f.as_ref().map(|a| ended_part(a, id))).collect();
        InFlight { id, started, acks, savepoint }
    }

    fn expiry_reason(&self, f: &InFlight) -> String {
        // Each subtask that did not ack, with what it says it waits on.
        let missing: Vec<String> = f
            .acks
            .iter()
            .zip(&self.members)
            .filter(|(a, _)| a.is_none())
            .map(|(_, m)| match m.waiting.describe() {
                Some(waiting) => format!("{} ({waiting})", m.name),
                None => m.name.clone(),
            })
            .collect();
        let blocked: Vec<String> = self
            .channels
            .iter()
            .filter(|(_, ring)| ring.credit() == 0)
            .map(|(name, ring)| format!("{name} (full: {0} of {0} slots)", ring.slot_count()))
            .collect();
        let blocked = if blocked.is_empty() { "none".to_owned() } else { blocked.join(", ") };
        format!(
            "expired after {:.1} s: no ack from {}; channels without credit: {blocked}",
            self.settings.timeout.as_secs_f64(),
            missing.join(", ")
        )
    }

    fn fail(&mut self, f: InFlight, mut reason: String) {
        // RocksDB and other libraries say the text only; name the errno too.
        if reason.contains("No space left on device") && !reason.contains("ENOSPC") {
            reason += " (ENOSPC)";
        }
        if let Some(req) = f.savepoint {
            self.savepoint_failed(req, &reason);
        }
        tracing::warn!(event = "checkpoint_failed", job = %self.job, checkpoint = f.id, "checkpoint failed: {reason}");
        self.counters.failed.add(1);
        self.stats().failed.push((f.id, reason));
    }

    fn manifest(&self, id: u64, is_final: bool, started: Instant, acks: &mut [Ack]) -> Manifest {
        Manifest {
            format: crate::checkpoint::MANIFEST_FORMAT,
            job: self.job.clone(),
            id,
            is_final,
            completed_unix_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            duration_ns: started.elapsed().as_nanos() as u64,
            max_key_groups: self.max_key_groups,
            subtasks: acks
                .iter_mut()
                .zip(&self.members)
                .map(|(a, m)| SubtaskSnapshot {
                    subtask: m.name.clone(),
                    blobs: std::mem::take(&mut a.parts.blobs),
                    shards: std::mem::take(&mut a.parts.shards),
                })
                .collect(),
            nodes: self.nodes.clone(),
            fingerprint: self.fingerprint.clone(),
            lineage: self.lineage.clone(),
            savepoint: None,
            checksum: 0,
        }
    }

    /// Write the manifest of `id`; on success count it, copy it into the savepoint directory
    /// if it is a savepoint's (`Some` when that worked too), and tell every subtask.
    fn write(
        &mut self,
        id: u64,
        m: Manifest,
        phases: Option<CheckpointPhases>,
        savepoint: Option<&SavepointRequest>,
    ) -> Result<Option<SavepointTaken>, String> {
        let dir = self.settings.dir.join(format!("chk-{id}"));
        std::fs::create_dir_all(&dir).map_err(|e| crate::util::path_error("cannot create", &dir, &e))?;
        let m = m.write(&dir).map_err(|e| e.to_string())?;
        if let Some(publish) = &self.settings.publish
            && let Err(e) = (publish.0)(&self.settings.dir, &dir, &m)
        {
            // Not published, not complete: no sink commits for it, a restore skips it.
            let _ = std::fs::remove_file(dir.join(crate::checkpoint::MANIFEST_FILE));
            return Err(format!("cannot publish it to the checkpoint store: {e}"));
        }
        crate::checkpoint::failpoint!("checkpoint::after-manifest-before-commit");
        let bytes = m.bytes();
        self.counters.last_id.set(id);
        self.counters.duration_ns.set(m.duration_ns);
        let p = phases.unwrap_or_default();
        self.counters.alignment_ns.set(p.alignment_ns);
        self.counters.bytes.set(bytes);
        self.counters.completed.add(1);
        self.stats().completed.push((id, m.duration_ns, bytes));
        let blobs = || m.subtasks.iter().flat_map(|s| &s.blobs);
        let reused: u64 = blobs().filter(|b| self.last_blobs.contains(&b.file)).map(|b| b.bytes).sum();
        self.stats().added.push((id, m.new_bytes() - reused));
        self.last_blobs = blobs().map(|b| b.file.clone()).collect();
        if let Some(p) = phases {
            self.stats().phases.push(p);
        }
        tracing::info!(
            event = "checkpoint_complete",
            job = %self.job,
            checkpoint = id,
            duration_ms = m.duration_ns as f64 / 1e6,
            start_delay_ms = p.start_delay_ns as f64 / 1e6,
            alignment_ms = p.alignment_ns as f64 / 1e6,
            sync_ms = p.sync_ns as f64 / 1e6,
            bytes,
            "checkpoint {id} complete"
        );
        // A savepoint is copied out before sinks commit: a job that stops at it commits
        // only what a savepoint covers.
        let saved = savepoint.and_then(|req| {
            match crate::checkpoint::savepoint::write(&self.settings.dir, &m, &req.dir, req.stop) {
                Ok(s) => {
                    let bytes = s.bytes();
                    tracing::info!(
                        event = "savepoint_complete",
                        job = %self.job,
                        checkpoint = id,
                        dir = %req.dir.display(),
                        bytes,
                        "savepoint {id} written to {}",
                        req.dir.display()
                    );
                    Some(SavepointTaken { id, dir: req.dir.clone(), bytes, stopped: req.stop })
                }
                Err(e) => {
                    self.stats().failed.push((id, format!("savepoint to {}: {e}", req.dir.display())));
                    None
                }
            }
        });
        let complete = if m.is_final { FINAL } else { id };
        for member in &self.members {
            member.mailbox.post(Control::Complete(complete));
        }
        prune(&self.settings.dir, self.settings.retained.max(1), &self.final_dir);
        Ok(saved)
    }

    /// Write checkpoint `f` (a savepoint's too); `true` when the job stopped at it.
    fn complete(&mut self, f: InFlight) -> bool {
        let mut acks: Vec<Ack> = f.acks.into_iter().map(|a| a.expect("all acked")).collect();
        let failed = |savepoint| InFlight { id: f.id, started: f.started, acks: Vec::new(), savepoint };
        // A finished subtask's parts stand in without a message: its errors are read here.
        if let Some(reason) = self.declined(&acks) {
            self.fail(failed(f.savepoint), reason);
            return false;
        }
        let phases = CheckpointPhases::of(f.id, f.started, &acks);
        let m = self.manifest(f.id, false, f.started, &mut acks);
        match self.write(f.id, m, Some(phases), f.savepoint.as_ref()) {
            Ok(saved) => match (f.savepoint, saved) {
                (Some(req), Some(taken)) => self.savepoint_done(req, taken),
                (Some(req), None) => {
                    // The checkpoint is complete; its copy into the savepoint was not.
                    let why = self.stats().failed.last().map(|(_, w)| w.clone()).unwrap_or_default();
                    self.savepoint_failed(req, &why);
                    false
                }
                _ => false,
            },
            Err(e) => {
                self.fail(failed(f.savepoint), e);
                false
            }
        }
    }

    /// A savepoint could not be taken: say why to who asked, and let paused sources go on.
    fn savepoint_failed(&mut self, req: SavepointRequest, why: &str) {
        tracing::warn!(event = "savepoint_failed", job = %self.job, dir = %req.dir.display(), "savepoint failed: {why}");
        if req.stop {
            for m in self.members.iter().filter(|m| m.is_source) {
                m.mailbox.post(Control::Resume);
            }
        }
        let _ = req.reply.send(Err(super::SavepointError::Failed(why.to_owned())));
    }

    /// A savepoint was taken (its manifest written in its directory, and `Complete` sent):
    /// if the job stops at it, wait until every subtask has committed it, then stop them
    /// all; answer who asked. `true` when the job stopped.
    fn savepoint_done(&mut self, req: SavepointRequest, taken: SavepointTaken) -> bool {
        self.stats().savepoints.push(taken.clone());
        if !req.stop {
            let _ = req.reply.send(Ok(taken));
            return false;
        }
        // Sinks commit what the savepoint covers before the job stops: a new version
        // started from it begins exactly where this one ended. The stop has a deadline: a
        // sink that cannot commit within it commits when the savepoint is restored.
        let patience = self.settings.timeout.min(self.stop_timeout);
        let deadline = Instant::now() + patience;
        let behind = |members: &[Member]| -> Vec<String> {
            members.iter().filter(|m| m.mailbox.completed_through() < taken.id).map(|m| m.name.clone()).collect()
        };
        loop {
            let late = behind(&self.members);
            if late.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    event = "savepoint_stop_late",
                    job = %self.job,
                    "stopping at savepoint {}: {} did not confirm committing it within {:.0} s; stopping anyway \
                     (what they prepared is committed when a job restores the savepoint)",
                    taken.id,
                    late.join(", "),
                    patience.as_secs_f64()
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.stopped_at.set(Instant::now());
        for m in &self.members {
            m.mailbox.request_stop();
        }
        for m in &self.members {
            m.mailbox.post(Control::Stop);
        }
        tracing::info!(
            event = "stopped_at_savepoint",
            job = %self.job,
            checkpoint = taken.id,
            dir = %taken.dir.display(),
            "stopped at savepoint {} ({})",
            taken.id,
            taken.dir.display()
        );
        let _ = req.reply.send(Ok(taken));
        true
    }

    /// Why a checkpoint with these acks cannot be written: the parts a subtask could not take.
    fn declined(&self, acks: &[Ack]) -> Option<String> {
        let a = acks.iter().find(|a| !a.parts.errors.is_empty())?;
        Some(format!("declined by {}: {}", self.members[a.subtask].name, a.parts.errors.join("; ")))
    }

    /// Every subtask reached the end of its input: the final checkpoint. If its manifest
    /// cannot be written the job fails (sinks must not commit what no checkpoint covers).
    fn complete_final(&mut self, mut acks: Vec<Ack>) {
        let id = self.next_id;
        self.next_id += 1;
        let m = self.manifest(id, true, Instant::now(), &mut acks);
        let written = match self.declined(&acks) {
            Some(reason) => Err(reason),
            None => self.write(id, m, None, None).map(drop),
        };
        if let Err(e) = written {
            let message = format!("the final checkpoint {id} could not be written: {e}");
            tracing::error!(event = "final_checkpoint_failed", job = %self.job, checkpoint = id, "{message}");
            self.stats().fatal = Some(message);
            for member in &self.members {
                member.mailbox.post(Control::Stop);
            }
        }
    }
}

/// A finished subtask's part of checkpoint `id`: the parts it put at the end of its input.
/// That is exact: everything it sent is before the barrier downstream, where a channel that
/// ended counts as aligned (`InputGate`), and nothing after it will come. Its files stay in
/// the run's final directory, which is never pruned while a kept manifest names it; they
/// add no bytes to this checkpoint.
fn ended_part(last: &Ack, id: u64) -> Ack {
    let mut parts = last.parts.clone();
    for s in &mut parts.shards {
        s.new_bytes = 0;
    }
    Ack { id, subtask: last.subtask, parts, timing: None }
}

/// Keep the newest `keep` complete checkpoints; remove older `chk-*` directories (complete,
/// partial or expired) and `final-*` directories no kept manifest names, except `protect`.
pub(crate) fn prune(root: &Path, keep: usize, protect: &str) {
    let dirs = checkpoint_dirs(root);
    let complete: Vec<&(u64, PathBuf)> =
        dirs.iter().filter(|(_, d)| d.join(crate::checkpoint::MANIFEST_FILE).is_file()).take(keep).collect();
    let Some(oldest_kept) = complete.last().map(|(id, _)| *id) else { return };
    let newest_kept = complete[0].0;
    for (id, d) in &dirs {
        let kept = complete.iter().any(|(k, _)| k == id);
        if !kept && (*id < oldest_kept || *id < newest_kept) {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    // Final directories named by a kept manifest stay.
    let named: Vec<String> = complete
        .iter()
        .filter_map(|(_, d)| std::fs::read(d.join(crate::checkpoint::MANIFEST_FILE)).ok())
        .filter_map(|b| serde_json::from_slice::<Manifest>(&b).ok())
        .flat_map(|m| {
            m.subtasks
                .into_iter()
                .flat_map(|s| s.blobs.into_iter().map(|b| b.file).chain(s.shards.into_iter().map(|r| r.dir)))
        })
        .filter_map(|f| f.split('/').next().map(str::to_owned))
        .collect();
    for e in std::fs::read_dir(root).into_iter().flatten().filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("final-") && name != protect && !named.contains(&name) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
