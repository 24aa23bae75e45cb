//! # The weir guide
//!
//! User documentation that the build checks: each page is a module here, its text a Markdown
//! file beside this one. `cargo doc` renders them; `cargo test --doc` compiles and runs every
//! Rust example; `tests/guide.rs` parses every job file they show (a ` ```toml ` block; a
//! ` ```toml fragment ` is part of one and is only read as TOML; a ` ```toml cargo ` block is a
//! program's `Cargo.toml` and may name only features weir has); `tests/reference.rs` regenerates
//! the reference pages from the code and fails when the committed copy differs. So a page
//! cannot show an example that does not build or a key the parser does not take.
//!
//! | | page | read it to |
//! |---|---|---|
//! | start | [`tutorial`] | write, run and watch a first job, in a job file and in Rust |
//! | how-to | [`howto::embedding`] | embed weir in a program of your own, with only the features it uses |
//! | | [`howto::kafka`] | read and write Kafka in production: TLS, SASL, lag, Avro and Protobuf |
//! | | [`howto::exactly_once`] | get output exactly once: files, Kafka transactions, idempotent HTTP |
//! | | [`howto::postgres`] | write rows into PostgreSQL, exactly once, as upserts or at least once |
//! | | [`howto::instances`] | run one job on several hosts |
//! | | [`howto::ipc_clients`] | feed a job from another process, in Rust, C or Python |
//! | | [`howto::upgrading`] | stop a job at a savepoint and start its next version from it |
//! | | [`howto::tuning`] | bound memory, trade CPU for latency |
//! | | [`howto::operating`] | watch a job: `weir top`, `weir-stat`, Prometheus, logs, signals |
//! | concepts | [`concepts::credit`] | why a slow sink slows the source instead of filling memory |
//! | | [`concepts::checkpoints`] | what a checkpoint holds, and what a restore guarantees |
//! | | [`concepts::key_groups`] | how keyed state is laid out, and how it moves |
//! | | [`concepts::time`] | event time, watermarks, windows and joins |
//! | reference | [`reference::job_file`] | every node type and key: type, default, what it does, what it affects |
//! | | [`reference::metrics`] | every Prometheus series and its labels |
//! | | [`reference::exit_codes`] | what `weir run` and `weir validate` exit with |
//! | | [`reference::records`] | the record layouts an ipc client reads and writes |
//!
//! The architecture and its words are in `DESIGN.md`-style module docs: start at the crate
//! root ([`crate`]), then [`crate::ring`] for the protocol of the rings.

#[doc = include_str!("tutorial.md")]
pub mod tutorial {}

/// How-to guides: one task each, start to finish.
pub mod howto {
    #[doc = include_str!("howto/embedding.md")]
    pub mod embedding {}
    #[doc = include_str!("howto/kafka.md")]
    pub mod kafka {}
    #[doc = include_str!("howto/exactly_once.md")]
    pub mod exactly_once {}
    #[doc = include_str!("howto/postgres.md")]
    pub mod postgres {}
    #[doc = include_str!("howto/instances.md")]
    pub mod instances {}
    #[doc = include_str!("howto/ipc_clients.md")]
    pub mod ipc_clients {}
    #[doc = include_str!("howto/upgrading.md")]
    pub mod upgrading {}
    #[doc = include_str!("howto/tuning.md")]
    pub mod tuning {}
    #[doc = include_str!("howto/operating.md")]
    pub mod operating {}
}

/// Concepts: what holds, and why.
pub mod concepts {
    #[doc = include_str!("concepts/credit.md")]
    pub mod credit {}
    #[doc = include_str!("concepts/checkpoints.md")]
    pub mod checkpoints {}
    #[doc = include_str!("concepts/key_groups.md")]
    pub mod key_groups {}
    #[doc = include_str!("concepts/time.md")]
    pub mod time {}
}

/// Reference: generated from the code where the code has the table (`tests/reference.rs`
/// keeps the committed pages equal to what the code generates).
pub mod reference {
    #[doc = include_str!("reference/job_file.md")]
    pub mod job_file {}
    #[doc = include_str!("reference/metrics.md")]
    pub mod metrics {}
    #[doc = include_str!("reference/exit_codes.md")]
    pub mod exit_codes {}
    #[doc = include_str!("reference/records.md")]
    pub mod records {}
}

/// The README's Rust example, compiled by `cargo test --doc` like the guide's.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;
