//! Membership: one Kafka consumer per instance, subscribed to the lead topic in the job's
//! consumer group, that reads no record — it only holds the instance's place in the group
//! and learns which partitions are the instance's.
//!
//! Static membership (`group.instance.id` = the instance's name, KIP-345): an instance that
//! restarts within `session.timeout.ms` gets its partitions back without a rebalance.
//! Cooperative-sticky assignment (KIP-429): a rebalance revokes only the partitions that
//! move. Every assigned partition is paused at once, so the consumer fetches nothing; the
//! job's own Kafka sources read the partitions, at the offsets of its checkpoints.
//!
//! A group belongs to one job. Each member names its job in its `client.id` ([`Identity`]: the
//! job's name, a hash of it, the graph's fingerprint and the instance); before joining, an
//! instance lists the group's members and refuses to join one where a member of another job
//! is (with a message naming the group and that job), and a running instance looks at the
//! members after each rebalance and every few seconds, and logs a member that is not of its
//! job (a consumer started by hand, an older weir) once. A member of the same job with another
//! graph fingerprint is another version of it (a rolling upgrade): logged, not refused.
//!
//! A revocation blocks in librdkafka's rebalance callback (on this thread) until the
//! instance has released the partitions — stopped the job that served them — so another
//! instance cannot start on them while this one still writes; it must finish within
//! `max.poll.interval.ms`, or the group evicts this member.

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};
use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the membership thread knows, shared with the instance.
#[derive(Debug, Default, Clone)]
pub struct Assignment {
    /// Partitions the group gave this instance.
    pub owned: BTreeSet<u32>,
    /// Rebalances this member took part in (assignments and revocations seen).
    pub rebalances: u64,
    /// The group's generation, as its coordinator last gave it (`None`: not known yet).
    pub generation: Option<i32>,
    /// Partitions being revoked: the instance must release them (stop serving) and then
    /// call [`Membership::released`].
    pub revoking: Option<BTreeSet<u32>>,
    /// The membership thread failed or the group refused it.
    pub error: Option<String>,
    /// When `owned` last changed.
    pub changed: Option<Instant>,
}

struct Shared {
    state: Mutex<Assignment>,
    changed: Condvar,
    stop: std::sync::atomic::AtomicBool,
    /// How long a revocation may wait for the instance.
    revoke_limit: Duration,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Assignment> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Context {
    shared: Arc<Shared>,
    topic: String,
}

/// How long listing the group's members may take.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
/// A running instance looks at the group's members at least this often.
const MEMBERS_EVERY: Duration = Duration::from_secs(5);

/// Who a member is, as its `client.id` says: `weir;<hash of the job's name>;<graph
/// fingerprint>;<job name, made safe>;<instance>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// 16 hex digits of the job's full name (the name below may be shortened or changed).
    pub job_hash: String,
    /// The graph's fingerprint ([`crate::graph::Job::fingerprint`]).
    pub fingerprint: String,
    /// The job's name with anything but letters, digits and `._-` made `_`, at most 64.
    pub job: String,
    /// The instance's name.
    pub instance: String,
}

impl Identity {
    /// The identity of instance `instance` of job `job` whose graph has `fingerprint`.
    pub fn new(job: &str, fingerprint: &str, instance: &str) -> Identity {
        let safe = |t: &str| -> String {
            t.chars().take(64).map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
        };
        Identity {
            job_hash: format!("{:016x}", crate::util::fnv1a(job.as_bytes())),
            fingerprint: fingerprint.to_owned(),
            job: safe(job),
            instance: safe(instance),
        }
    }

    /// As a `client.id`.
    pub fn client_id(&self) -> String {
        format!("weir;{};{};{};{}", self.job_hash, self.fingerprint, self.job, self.instance)
    }

    /// A member's `client.id` read back (`None`: not a weir instance's).
    pub fn parse(client_id: &str) -> Option<Identity> {
        let mut parts = client_id.split(';');
        if parts.next()? != "weir" {
            return None;
        }
        let (job_hash, fingerprint, job, instance) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        Some(Identity {
            job_hash: job_hash.into(),
            fingerprint: fingerprint.into(),
            job: job.into(),
            instance: instance.into(),
        })
    }
}

/// A member of the group that is not an instance of this job: what it is, in words.
fn stranger(me: &Identity, client_id: &str, host: &str) -> Option<String> {
    match Identity::parse(client_id) {
        Some(other) if other.job_hash == me.job_hash => None,
        Some(other) => Some(format!("instance {} of job {} (on {host})", other.instance, other.job)),
        None => Some(format!("a consumer that is not a weir instance (client.id {client_id:?}, on {host})")),
    }
}

/// The group's members as `(member id, client id, host)`.
fn members<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    group: &str,
) -> Result<Vec<(String, String, String)>, String> {
    let list = consumer
        .fetch_group_list(Some(group), DESCRIBE_TIMEOUT)
        .map_err(|e| format!("cannot list the members of group {group}: {e}"))?;
    Ok(list
        .groups()
        .iter()
        .filter(|g| g.name() == group)
        .flat_map(|g| g.members())
        .map(|m| (m.id().to_owned(), m.client_id().to_owned(), m.client_host().to_owned()))
        .collect())
}

impl ClientContext for Context {}

fn partitions_of(tpl: &TopicPartitionList, topic: &str) -> BTreeSet<u32> {
    tpl.elements().iter().filter(|e| e.topic() == topic).map(|e| e.partition() as u32).collect()
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else { return };
        let revoked = partitions_of(tpl, &self.topic);
        if revoked.is_empty() {
            return;
        }
        tracing::info!(event = "partitions_revoked", partitions = ?revoked, "partitions {revoked:?} revoked: handing them over");
        let mut s = self.shared.lock();
        s.revoking = Some(revoked.clone());
        s.rebalances += 1;
        self.shared.changed.notify_all();
        // Wait until the instance released them (or gives up), within the poll interval.
        let deadline = Instant::now() + self.shared.revoke_limit;
        while s.revoking.is_some() && !self.shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(event = "revoke_timeout", "the instance did not release {revoked:?} in time");
                break;
            }
            s = self
                .shared
                .changed
                .wait_timeout(s, left.min(Duration::from_millis(100)))
                .map_or_else(|e| e.into_inner().0, |r| r.0);
        }
        s.revoking = None;
        for p in &revoked {
            s.owned.remove(p);
        }
        s.changed = Some(Instant::now());
        self.shared.changed.notify_all();
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                // Fetch nothing: the job's sources read these partitions.
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!("cannot pause the membership consumer: {e}");
                }
                let got = partitions_of(tpl, &self.topic);
                let mut s = self.shared.lock();
                s.rebalances += 1;
                if !got.is_empty() {
                    tracing::info!(event = "partitions_assigned", partitions = ?got, "partitions {got:?} assigned");
                    s.owned.extend(got);
                    s.changed = Some(Instant::now());
                }
                self.shared.changed.notify_all();
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                tracing::warn!(event = "rebalance_error", "rebalance error: {e}");
            }
        }
    }
}

/// Why an instance did not join its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// A member of another job is in the group.
    Refused(String),
    /// The client could not be made, or could not subscribe.
    Failed(String),
}

/// The instance's membership in the job's consumer group (a thread).
pub struct Membership {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How to join.
#[derive(Debug, Clone)]
pub struct MemberSettings {
    /// librdkafka properties of the lead source (bootstrap, security).
    pub properties: Vec<(String, String)>,
    pub topic: String,
    pub group: String,
    pub instance: String,
    pub session_timeout: Duration,
    pub max_poll_interval: Duration,
    /// Who this member is (its job, the graph's fingerprint, the instance).
    pub identity: Identity,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership").field("assignment", &*self.shared.lock()).finish()
    }
}

impl Membership {
    /// Join the group (on a thread of its own). Errors creating the client are returned, and
    /// a group where a member of another job is (`Refused`); later ones reach
    /// [`Assignment::error`].
    pub fn join(settings: MemberSettings) -> Result<Membership, JoinError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(Assignment::default()),
            changed: Condvar::new(),
            stop: std::sync::atomic::AtomicBool::new(false),
            revoke_limit: settings.max_poll_interval.saturating_sub(Duration::from_secs(5)).max(Duration::from_secs(1)),
        });
        let mut client = ClientConfig::new();
        for (k, v) in &settings.properties {
            client.set(k, v);
        }
        client
            .set("group.id", &settings.group)
            .set("group.instance.id", &settings.instance)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", settings.session_timeout.as_millis().to_string())
            .set("max.poll.interval.ms", settings.max_poll_interval.as_millis().to_string())
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("client.id", settings.identity.client_id());
        let context = Context { shared: shared.clone(), topic: settings.topic.clone() };
        let consumer: BaseConsumer<Context> = client
            .create_with_context(context)
            .map_err(|e| JoinError::Failed(format!("cannot create the membership consumer: {e}")))?;
        // A group belongs to one job: refuse to join one where another job's member is.
        let (me, group) = (settings.identity.clone(), settings.group.clone());
        match members(&consumer, &group) {
            Ok(found) => {
                let others: Vec<String> = found.iter().filter_map(|(_, c, h)| stranger(&me, c, h)).collect();
                if !others.is_empty() {
                    return Err(JoinError::Refused(format!(
                        "consumer group {group} belongs to another job: its members include {}; a group belongs to one \
                         job (its instances share the input partitions): give job {} a group of its own ([job] group, \
                         default the job's name)",
                        others.join(", "),
                        me.job
                    )));
                }
            }
            // Describing the group needs DESCRIBE on it: without, join and watch.
            Err(e) => tracing::warn!(group = %group, "{e}: cannot check that no other job uses the group"),
        }
        consumer
            .subscribe(&[&settings.topic])
            .map_err(|e| JoinError::Failed(format!("cannot subscribe to {}: {e}", settings.topic)))?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("weir-member".into())
            .spawn(move || {
                // The group's generation: read after each rebalance seen, and every second (a
                // rebalance that gives or takes nothing of ours moves it too).
                let (mut seen, mut looked) = (u64::MAX, Instant::now());
                // Strangers already logged (by member id), and when the members were listed.
                let (mut logged, mut listed) = (BTreeSet::new(), Instant::now());
                while !thread_shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let rebalances = thread_shared.lock().rebalances;
                    if rebalances != seen || listed.elapsed() >= MEMBERS_EVERY {
                        listed = Instant::now();
                        for (id, client, host) in members(&consumer, &group).unwrap_or_default() {
                            if let Some(who) = stranger(&me, &client, &host)
                                && logged.insert(id.clone())
                            {
                                tracing::warn!(
                                    event = "foreign_member",
                                    group = %group,
                                    member = %id,
                                    "consumer group {group} of job {} has a member of another job: {who}; it takes \
                                     input partitions from this job's instances while it stays (give it another \
                                     group)",
                                    me.job
                                );
                            }
                            if let Some(other) = Identity::parse(&client)
                                && other.job_hash == me.job_hash
                                && other.fingerprint != me.fingerprint
                                && logged.insert(id.clone())
                            {
                                tracing::info!(
                                    event = "other_version_member",
                                    group = %group,
                                    "instance {} runs another version of job {} (graph fingerprint {}, this one {}): a \
                                     rolling upgrade?",
                                    other.instance,
                                    me.job,
                                    other.fingerprint,
                                    me.fingerprint
                                );
                            }
                        }
                    }
                    if rebalances != seen || looked.elapsed() >= Duration::from_secs(1) {
                        let generation = crate::io::kafka::group_generation(consumer.client());
                        (seen, looked) = (rebalances, Instant::now());
                        let mut s = thread_shared.lock();
                        if generation.is_some() && s.generation != generation {
                            tracing::info!(
                                event = "group_generation",
                                generation = generation.unwrap_or(-1),
                                "group generation {}",
                                generation.unwrap_or(-1)
                            );
                            s.generation = generation;
                            thread_shared.changed.notify_all();
                        }
                    }
                    match consumer.poll(Duration::from_millis(100)) {
                        None | Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            let text = e.to_string();
                            tracing::debug!("membership consumer: {text}");
                            // Fatal: fenced by a newer member with our group.instance.id.
                            if text.contains("Fatal") || text.contains("FENCED") {
                                let mut s = thread_shared.lock();
                                s.error = Some(format!("the group refused this member: {text}"));
                                thread_shared.changed.notify_all();
                                return;
                            }
                        }
                    }
                }
                // A static member does not leave the group on close: its partitions wait for
                // it until the session times out (a restart within it keeps them).
                drop(consumer);
            })
            .map_err(|e| JoinError::Failed(format!("cannot start the membership thread: {e}")))?;
        Ok(Membership { shared, thread: Some(thread) })
    }

    /// A copy of what is known now.
    pub fn snapshot(&self) -> Assignment {
        self.shared.lock().clone()
    }

    /// Wait up to `timeout` for a change (an assignment, a revocation, an error).
    pub fn wait(&self, timeout: Duration) {
        let s = self.shared.lock();
        let _ = self.shared.changed.wait_timeout(s, timeout);
    }

    /// The instance stopped serving the partitions being revoked.
    pub fn released(&self) {
        let mut s = self.shared.lock();
        // Gone from `owned` in the same step: a look right after this never sees them as
        // still owned (claiming them would take them from their new owner).
        if let Some(revoked) = s.revoking.take() {
            for p in &revoked {
                s.owned.remove(p);
            }
            s.changed = Some(Instant::now());
        }
        self.shared.changed.notify_all();
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.shared.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member's identity goes through its `client.id` and back; members of the same job
    /// (any graph fingerprint: another version in a rolling upgrade) are not strangers, those of
    /// another job or no weir instance at all are, named as such.
    #[test]
    fn identities_tell_another_job_from_another_version() {
        let me = Identity::new("counts per user; v2", "00ff", "a");
        assert_eq!(me.job, "counts_per_user__v2");
        assert_eq!(Identity::parse(&me.client_id()), Some(me.clone()));
        let upgraded = Identity::new("counts per user; v2", "abcd", "b");
        assert_eq!(stranger(&me, &upgraded.client_id(), "/10.0.0.2"), None);
        let other = Identity::new("fraud", "00ff", "x");
        let why = stranger(&me, &other.client_id(), "/10.0.0.3").expect("another job");
        assert!(why.contains("job fraud") && why.contains("instance x"), "{why}");
        let why = stranger(&me, "rdkafka", "/10.0.0.4").expect("not weir");
        assert!(why.contains("not a weir instance") && why.contains("rdkafka"), "{why}");
        assert_eq!(Identity::parse("weir;only;three"), None);
    }
}
