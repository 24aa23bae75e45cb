//! A started job: waiting for it, cancelling it, and what it reports at the end.

use super::coordinator::CoordinatorHandle;
use super::state::JobState;
use super::subtask::SubtaskReport;
use super::{CheckpointStats, JobError, JobSummary, NodeSummary, SubtaskSummary};
use crate::chain::NodeCounters;
use crate::exchange::{Control, Mailbox};
use crate::operators::{Failure, Halt, OperatorError};
use crate::telemetry::Budget;
use crate::telemetry::counters::JobCounters;
use crate::telemetry::monitor::{Monitor, sample_rss};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use weir_ring::counters::SharedCounter;

/// A spawned subtask, as the job holds it.
pub(super) struct SubtaskHandle {
    pub name: String,
    /// How it ended, in this process's memory (never read back from the counters file,
    /// which any process of this user can write).
    pub outcome: Arc<Outcome>,
    pub cpu: Option<usize>,
    pub mailbox: Arc<Mailbox>,
    /// What it waits on, in words (named when a stop times out).
    pub waiting: Arc<crate::telemetry::waiting::Waiting>,
    pub thread: SubtaskThread,
}

/// How a subtask ended: its run's result, or the panic that ended it.
pub(super) type Ended = std::thread::Result<Result<SubtaskReport, Halt>>;

/// Where a subtask runs: a thread of its own, or a fiber of a thread it shares with the
/// other subtasks pinned to its CPU (`JobConfig::fibers`).
pub(super) enum SubtaskThread {
    Own(JoinHandle<Result<SubtaskReport, Halt>>),
    Fiber {
        /// Filled as the fiber's last act but one (the exit count is the last).
        ended: Arc<std::sync::Mutex<Option<Ended>>>,
        /// The shared thread, joined by whichever of its subtasks is joined first.
        thread: Arc<std::sync::Mutex<Option<JoinHandle<()>>>>,
    },
}

impl SubtaskThread {
    pub(super) fn is_finished(&self) -> bool {
        match self {
            SubtaskThread::Own(t) => t.is_finished(),
            // Or its thread ended without it (a panic outside the fibers): it never will.
            SubtaskThread::Fiber { ended, thread } => {
                ended.lock().unwrap_or_else(|e| e.into_inner()).is_some()
                    || thread.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_none_or(|t| t.is_finished())
            }
        }
    }

    /// Wait for the subtask's end. A fiber's ends with its thread at the latest (a thread
    /// runs its fibers to their ends).
    pub(super) fn join(self) -> Ended {
        match self {
            SubtaskThread::Own(t) => t.join(),
            SubtaskThread::Fiber { ended, thread } => {
                let shared = thread.lock().unwrap_or_else(|e| e.into_inner()).take();
                let mut thread_panic = None;
                if let Some(Err(panic)) = shared.map(JoinHandle::join) {
                    thread_panic = Some(panic);
                }
                let result = ended.lock().unwrap_or_else(|e| e.into_inner()).take();
                // Its thread's own panic says more than that it ended early.
                result
                    .or(thread_panic.map(Err))
                    .unwrap_or_else(|| Err(Box::new("the thread running this subtask as a fiber ended before it")))
            }
        }
    }
}

/// A started job.
pub struct RunningJob {
    pub(super) name: String,
    pub(super) subtasks: Vec<SubtaskHandle>,
    pub(super) node_counters: Vec<(String, &'static str, u32, Vec<NodeCounters>)>,
    pub(super) counters: JobCounters,
    /// Removed when the job ends (a failed start drops it: removed then).
    pub(super) run_dir: super::run_dir::RunDir,
    pub(super) rss: SharedCounter,
    pub(super) job_state: SharedCounter,
    pub(super) budget: Budget,
    pub(super) started: Instant,
    pub(super) cancelled: bool,
    /// How long `stop` waits for the subtasks.
    pub(super) stop_timeout: Duration,
    pub(super) max_rss: Arc<AtomicU64>,
    pub(super) monitor: Option<Monitor>,
    /// Closed (and its directory removed) once the subtasks are joined: no store is left open.
    pub(super) state: Option<JobState>,
    /// The checkpoint coordinator, when the job takes checkpoints.
    pub(super) coordinator: Option<CoordinatorHandle>,
    /// The control socket (`weir savepoint`), when the job takes checkpoints.
    pub(super) control: Option<super::control::ControlServer>,
    /// How long a savepoint may take to answer (twice the checkpoint timeout).
    pub(super) savepoint_timeout: Duration,
}

impl fmt::Debug for RunningJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningJob").field("name", &self.name).field("subtasks", &self.subtasks.len()).finish()
    }
}

impl RunningJob {
    /// The counters file `weir-stat` reads.
    pub fn counters_path(&self) -> &Path {
        self.counters.path()
    }

    /// The job's counters file, to allocate counters of the caller's own (an instance's,
    /// [`crate::cluster`]; the file has room for those the job was sized for).
    pub fn counters(&self) -> &JobCounters {
        &self.counters
    }

    /// The memory budget computed at start.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The job's checkpoints so far (empty when it takes none).
    pub fn checkpoint_stats(&self) -> CheckpointStats {
        self.coordinator.as_ref().map(|c| c.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()).unwrap_or_default()
    }

    /// Take a savepoint into `dir` (new or empty; see [`crate::checkpoint::savepoint`]):
    /// a checkpoint, triggered now (after the one in flight, if any), copied there once
    /// complete. The job goes on. Start another version of the job from it with
    /// [`CheckpointSettings::from_savepoint`](crate::checkpoint::CheckpointSettings::from_savepoint).
    pub fn savepoint(
        &self,
        dir: impl Into<std::path::PathBuf>,
    ) -> Result<super::SavepointTaken, super::SavepointError> {
        self.ask_savepoint(dir.into(), false)
    }

    /// Take a savepoint into `dir` and stop right after it: sources emit nothing after its
    /// barrier, every sink commits what it covers, then every subtask stops. `wait` then
    /// returns the summary (with the savepoint in `checkpoints.savepoints`). If the
    /// savepoint fails, the job goes on and the error says why.
    pub fn stop_with_savepoint(
        &self,
        dir: impl Into<std::path::PathBuf>,
    ) -> Result<super::SavepointTaken, super::SavepointError> {
        self.ask_savepoint(dir.into(), true)
    }

    fn ask_savepoint(
        &self,
        dir: std::path::PathBuf,
        stop: bool,
    ) -> Result<super::SavepointTaken, super::SavepointError> {
        let Some(c) = &self.coordinator else { return Err(super::SavepointError::NoCheckpoints) };
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        // A failed subtask acks no barrier: give up then, not at the timeout.
        let failed = || {
            let failed: Vec<&str> =
                self.subtasks.iter().filter(|s| s.outcome.failed_as().is_some()).map(|s| s.name.as_str()).collect();
            (!failed.is_empty()).then(|| format!("{} failed (RunningJob::wait says why)", failed.join(", ")))
        };
        super::control::ask(&c.sender(), dir, stop, self.savepoint_timeout, &failed)
    }

    /// The run directory (`weir savepoint <run dir>` reaches the job there).
    pub fn run_dir(&self) -> &Path {
        self.run_dir.path()
    }

    /// Ask every subtask to stop; `wait` then returns `JobError::Cancelled`.
    pub fn cancel(&mut self) {
        self.cancelled = true;
        self.stop_all();
    }

    /// Stop every subtask: mark all, then ring all (see `Mailbox::request_stop`).
    fn stop_all(&self) {
        for s in &self.subtasks {
            s.mailbox.request_stop();
        }
        for s in &self.subtasks {
            s.mailbox.post(Control::Stop);
        }
    }

    /// Whether a subtask has failed (`wait` then stops the others and returns its error).
    pub fn has_failed(&self) -> bool {
        self.any_failed()
    }

    /// Whether every subtask has ended.
    pub fn is_finished(&self) -> bool {
        self.subtasks.iter().all(|s| s.thread.is_finished())
    }

    /// Sample RSS now into the counters file (and the summary's maximum); returns it. A
    /// monitor thread also does this every 50 ms.
    pub fn sample_rss(&self) -> u64 {
        sample_rss(&self.rss, &self.max_rss)
    }

    fn stop_monitor(&mut self) {
        if let Some(mut m) = self.monitor.take() {
            m.stop();
        }
    }

    /// Wait for the job to end (the monitor thread samples RSS meanwhile). A failed subtask
    /// stops the others. The calling thread sleeps until a subtask's thread exits, so it
    /// takes no CPU from the subtasks (it used to wake every 20 ms).
    pub fn wait(self) -> Result<JobSummary, JobError> {
        self.wait_until(None)
    }

    /// Stop the job within its `stop_timeout` ([`JobConfig::stop_timeout`](crate::graph::JobConfig::stop_timeout)):
    /// every subtask is asked to stop, and code waiting on the outside gives its wait up (what
    /// was in flight is replayed from the last checkpoint). [`JobError::Cancelled`] once all
    /// stopped; [`JobError::StopTimedOut`] naming the subtasks still running after it, with
    /// what each waits on: they are left behind (the process should exit; nothing they hold is
    /// committed), and the run directory is removed all the same.
    pub fn stop(mut self) -> Result<JobSummary, JobError> {
        self.cancel();
        let deadline = Instant::now() + self.stop_timeout;
        self.wait_until(Some(deadline))
    }

    fn wait_until(mut self, mut deadline: Option<Instant>) -> Result<JobSummary, JobError> {
        let mut stopping = false;
        let exits = self.subtasks.first().map(|s| s.outcome.exits.clone());
        loop {
            // A stop at a savepoint has the deadline of a stop, from when the coordinator
            // stopped the subtasks.
            if deadline.is_none()
                && let Some(at) = self.coordinator.as_ref().and_then(|c| c.stopped_at.get())
            {
                deadline = Some(*at + self.stop_timeout);
            }
            let exited = exits.as_ref().map_or(0, |e| e.load(Ordering::Acquire));
            let finished = self.subtasks.iter().filter(|s| s.thread.is_finished()).count();
            if finished == self.subtasks.len() {
                break;
            }
            // A subtask that failed stops the rest (they may be blocked on it).
            if !stopping && self.any_failed() {
                stopping = true;
                self.stop_all();
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.abandon());
            }
            let Some(word) = exits.as_ref() else { break };
            // A thread counted as exited may not be joinable yet (its last instructions run
            // after the count): look again shortly; else sleep until the next exit.
            let mut timeout = if exited as usize > finished { Duration::from_millis(1) } else { WAIT_BACKSTOP };
            if let Some(d) = deadline {
                timeout = timeout.min(d.saturating_duration_since(Instant::now()));
            }
            weir_ring::wait_any(&[weir_ring::ParkToken::new(word, exited)], timeout);
        }
        let elapsed_ns = self.started.elapsed().as_nanos() as u64;
        drop(self.control.take());
        self.sample_rss();
        self.stop_monitor();
        let checkpoints = match self.coordinator.take() {
            Some(mut c) => {
                c.stop();
                c.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
            }
            None => Default::default(),
        };
        // (order of failure, subtask, error): the first to fail is the cause.
        let mut failures: Vec<(u64, String, Failure)> = Vec::new();
        let mut summaries = Vec::new();
        for s in self.subtasks.drain(..) {
            match s.thread.join() {
                Ok(Ok(r)) => summaries.push(SubtaskSummary {
                    name: s.name,
                    cpu: s.cpu,
                    busy_ns: r.busy_ns,
                    backpressured_ns: r.backpressured_ns,
                    idle_ns: r.idle_ns,
                    waiting_ns: r.waiting_ns,
                    records_in: r.records_in,
                }),
                Ok(Err(Halt::Stopped)) => {}
                Ok(Err(Halt::Failed(error))) => {
                    failures.push((s.outcome.failed_as().unwrap_or(u64::MAX), s.name, error));
                }
                Err(panic) => {
                    let message = crate::operators::panic_message(&*panic).unwrap_or_else(|| "panic".into());
                    let error = OperatorError::Panicked { message }.into();
                    failures.push((s.outcome.failed_as().unwrap_or(u64::MAX), s.name, error));
                }
            }
        }
        if failures.len() > 1 {
            tracing::debug!(job = %self.name, "{} subtasks failed; the first is reported", failures.len());
        }
        let mut failure = failures
            .into_iter()
            .min_by_key(|(order, _, _)| *order)
            .map(|(_, subtask, error)| JobError::Failed { subtask, error });
        if let Some(message) = &checkpoints.fatal {
            failure.get_or_insert(JobError::Failed {
                subtask: "checkpoint coordinator".into(),
                error: Failure::msg(message),
            });
        }
        if let Some(JobError::Failed { subtask, error }) = &failure {
            tracing::error!(event = "job_failed", job = %self.name, subtask = %subtask, "subtask {subtask} failed: {error}");
        }
        self.job_state.set(if failure.is_some() { 3 } else { 2 });
        drop(self.state.take());
        self.run_dir.remove();
        if let Some(f) = failure {
            return Err(f);
        }
        if self.cancelled {
            return Err(JobError::Cancelled);
        }
        let nodes = self
            .node_counters
            .iter()
            .map(|(id, op, parallelism, cs)| NodeSummary {
                id: id.clone(),
                op,
                parallelism: *parallelism,
                records_in: cs.iter().map(|c| c.records_in.get()).sum(),
                records_out: cs.iter().map(|c| c.records_out.get()).sum(),
                late_records: cs.iter().map(|c| c.late_records.get()).sum(),
                evicted_keys: cs.iter().map(|c| c.evicted_keys.get()).sum(),
            })
            .collect();
        Ok(JobSummary {
            name: self.name.clone(),
            elapsed_ns,
            nodes,
            subtasks: summaries,
            max_rss_bytes: self.max_rss.load(Ordering::Relaxed),
            budget: self.budget.clone(),
            checkpoints,
        })
    }

    /// The stop's deadline passed with subtasks still running: name them and what they wait
    /// on, stop the coordinator and the monitor, remove the run directory, and leave those
    /// threads behind (never joined: each may be blocked in a call that will not return).
    fn abandon(&mut self) -> JobError {
        let running: Vec<String> = self
            .subtasks
            .iter()
            .filter(|s| !s.thread.is_finished())
            .map(|s| match s.waiting.describe() {
                Some(waiting) => format!("{} ({waiting})", s.name),
                None => s.name.clone(),
            })
            .collect();
        tracing::error!(
            event = "stop_timed_out",
            job = %self.name,
            "the job did not stop within {}: still running: {}",
            crate::util::duration_text(self.stop_timeout),
            running.join(", ")
        );
        self.stop_monitor();
        if let Some(mut c) = self.coordinator.take() {
            c.stop();
        }
        self.job_state.set(3);
        // Detached, not joined. The state's files are removed under them (a shard stays open
        // while a subtask holds it; the process exits next).
        self.subtasks.clear();
        drop(self.state.take());
        self.run_dir.remove();
        JobError::StopTimedOut { timeout: self.stop_timeout, running }
    }

    /// Whether a subtask has failed (returned an error or panicked).
    fn any_failed(&self) -> bool {
        self.subtasks.iter().any(|s| s.outcome.failed_as().is_some())
    }
}

/// The longest `RunningJob::wait` sleeps without a subtask exiting (a failure that leaves
/// every thread running is seen by then too).
const WAIT_BACKSTOP: Duration = Duration::from_millis(100);

/// How a subtask ended, and when it failed relative to the job's other subtasks: the first
/// failure is the cause the job reports (the others are often its symptoms: a peer that
/// closed a ring, a stop in the middle of a write).
#[derive(Debug)]
pub(super) struct Outcome {
    /// 0 running, 1 ended well (or stopped), n >= 2: the (n - 1)-th failure of the job.
    state: AtomicU64,
    /// Failures of the job so far, shared by its subtasks.
    failures: Arc<AtomicU64>,
    /// Subtask threads of the job that have returned (or are about to), shared: a futex
    /// word that [`RunningJob::wait`] sleeps on.
    exits: Arc<AtomicU32>,
}

impl Outcome {
    pub(super) fn new(failures: Arc<AtomicU64>, exits: Arc<AtomicU32>) -> Outcome {
        Outcome { state: AtomicU64::new(0), failures, exits }
    }

    /// A guard to hold for the whole of the subtask's thread: its drop, the thread's last
    /// act, counts the exit and wakes the job's waiter.
    pub(super) fn on_exit(self: &Arc<Self>) -> impl Drop + use<> {
        struct Exit(Arc<Outcome>);
        impl Drop for Exit {
            fn drop(&mut self) {
                self.0.exits.fetch_add(1, Ordering::Release);
                weir_ring::wake(&self.0.exits);
            }
        }
        Exit(self.clone())
    }

    /// The subtask's run returned; `failed`: with an error.
    pub(super) fn ended(&self, failed: bool) {
        let v = if failed { 2 + self.failures.fetch_add(1, Ordering::Relaxed) } else { 1 };
        self.state.store(v, Ordering::Release);
    }

    /// A guard that records a failure if the thread unwinds past it.
    pub(super) fn on_panic(&self) -> impl Drop + '_ {
        struct Guard<'a>(&'a Outcome);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.ended(true);
                }
            }
        }
        Guard(self)
    }

    /// `Some(order)` if it failed (smaller: earlier).
    pub(super) fn failed_as(&self) -> Option<u64> {
        let v = self.state.load(Ordering::Acquire);
        (v >= 2).then_some(v)
    }
}

impl Drop for RunningJob {
    fn drop(&mut self) {
        self.stop_monitor();
        if let Some(mut c) = self.coordinator.take() {
            c.stop();
        }
        if !self.subtasks.is_empty() {
            self.stop_all();
            for s in self.subtasks.drain(..) {
                let _ = s.thread.join();
            }
            drop(self.state.take());
            self.run_dir.remove();
        }
    }
}
