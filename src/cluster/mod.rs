//! More than one host: instances of a job share it through Kafka's consumer-group protocol
//! and hand keyed state over through a checkpoint store.
//!
//! weir grows no cluster manager of its own. Kafka, which every such job reads, coordinates:
//! `weir run job.toml --instance <name>` starts one instance, and the instances of a job
//! form one consumer group on its lead input topic (`[job] group`, default the job's name).
//! Inside each host the job runs as always — pinned subtasks joined by rings.
//!
//! # What runs where
//!
//! ```text
//!   host A: weir run job.toml --instance a          host B: weir run job.toml --instance b
//!   ┌──────────────────────────────────┐            ┌──────────────────────────────────┐
//!   │ membership (group member, paused)│            │ membership                        │
//!   │ job: P subtasks per node,        │            │ job: P subtasks per node,         │
//!   │   those of partitions {0,2,4} live│           │   those of partitions {1,3,5} live│
//!   │ checkpoints ─► local dir ─► store│            │ checkpoints ─► local dir ─► store │
//!   └──────────────────────────────────┘            └──────────────────────────────────┘
//!            │ Kafka: input partitions, output transactions, the group │
//!            └────────────── checkpoint store (directory or S3) ───────┘
//! ```
//!
//! - **Shared-nothing by partition.** With P partitions in the lead topic, every node of
//!   the job gets P subtasks, and subtask `i` serves partition `i` (of the lead input, and
//!   of co-partitioned inputs, which must have P partitions too); those of partitions the
//!   instance does not own are dormant threads (their sources read nothing, their sinks
//!   open nothing). Records never cross partitions: key_by keeps a key in its subtask, so
//!   **the input must be keyed by the job's key** (a key in one partition only) — the way a
//!   Kafka producer keyed by that field writes it — or the key_by must run **through a
//!   repartition topic** (`repartition = true` in the job file,
//!   [`crate::io::kafka::repartition`]): `<job>-<node>-repartition`, P partitions, written
//!   exactly once by the upstream subtasks wherever they run (each record to the partition of
//!   its key, each watermark marked in every partition) and read `read_committed` by the
//!   downstream ones, subtask `i` reading partition `i` — a co-partitioned input like any
//!   other, so it moves with partition `i` of the lead input.
//! - **Keyed state follows its partition.** A key's group is taken within its subtask's
//!   range (`KeyGroups::within`), so partition `i`'s state is exactly the key-group range of
//!   subtask `i`, the same in every instance: moving it is restoring subtask `i` elsewhere.
//! - **Each instance checkpoints on its own**, aligned within the host as always; there is
//!   no barrier across hosts. Before a checkpoint's sinks commit, its parts for each owned
//!   partition are in the store with a pointer ([`store`]): what Kafka shows as committed is
//!   always covered by state another instance can restore.
//!
//! # Handover
//!
//! Membership is static (`group.instance.id` = the instance's name; a restart within
//! `session_timeout_ms` keeps the partitions, no rebalance) and cooperative-sticky (only
//! moving partitions are revoked). When the assignment changes, the instance stops its
//! job (the revocation waits in the rebalance callback until it has), then starts the next
//! *generation*: it **claims** each owned partition in the store (an epoch above every one
//! there), rebuilds a local checkpoint from the partitions' newest pointers, and starts the
//! job restoring from it; sources seek to the checkpointed offsets, Kafka sinks take over
//! the partition's transactional ids (fencing the previous owner) and finish what it
//! prepared — committed transactions stay, aborted ones are written again from their logs,
//! which are in the store too.
//!
//! # What fails how
//!
//! - An instance killed (kill -9): its partitions go to the others after the session
//!   timeout; they restore the last published checkpoint, and Kafka replays the rest.
//! - A zombie (paused past the session timeout, then resumed): its next checkpoint finds a
//!   newer epoch and fails, so its sinks commit nothing more, and Kafka fences its producers;
//!   its membership learns it lost the partitions and it starts over.
//! - The store down: checkpoints fail (no commits, nothing lost; the job goes on from the
//!   last one once it is back); a generation cannot start and is retried every second.
//!
//! # Seen from outside
//!
//! Each generation's job is a job like any other, with a counters file: the instance adds
//! its own counters to it ([`INSTANCE`](crate::telemetry::counters::INSTANCE): generations,
//! the group's generation, rebalances, the last handover's duration, partitions and bytes
//! moved in; and per partition of the lead input, whether it is served here), which
//! `weir-stat`, `weir top` and the Prometheus endpoint show. Rebalances, handovers and each
//! generation's start (with the handover's duration and the counters file) are logged.
//!
//! Not yet: a rebalance restarts the instance's whole job (the partitions it keeps pause
//! for the restart too); offsets committed to the group inside the sinks' transactions
//! (KIP-447); S3 needs `--features s3`.

pub mod instance;
pub mod membership;
pub mod store;

pub use instance::{InstanceError, InstanceSummary, run};
pub use store::{CheckpointStore, Pointer, StoreError};
