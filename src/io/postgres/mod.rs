//! The PostgreSQL sink: rows into a table over one connection per subtask, driven by the
//! sink's io_uring, as binary COPY inside transactions; exactly once through prepared
//! transactions committed by name when a checkpoint completes.
//!
//! ```toml
//! [[sink]]
//! id = "db"
//! type = "postgres"
//! input = "per_second"
//! connection = "postgresql://weir@127.0.0.1:5432/clicks?sslmode=verify-full&sslrootcert=ca.pem"
//! password_file = "/run/secrets/pg"   # or a password in the string, or a passfile (.pgpass format)
//! table = "public.clicks_per_second"
//! columns = { key = "user_id", end_ns = "window_end", count = "clicks" }   # default: fields by name
//! json_column = "doc"                 # the whole record as JSON too (json, jsonb or text)
//! delivery = "exactly_once"           # exactly_once | upsert | at_least_once
//! key_columns = ["user_id", "window_end"]   # upsert's conflict target (default: the primary key)
//! batch_rows = 10000                  # a batch (one COPY, one transaction) holds at most this many rows,
//! batch_bytes = 1048576               # and this many bytes,
//! batch_ms = 200                      # and is sent after this long at the latest
//! max_in_flight = 4                   # batches sent and not yet durable; more makes the sink wait
//! on_bad_record = "dead_letter"       # dead_letter | fail: a row the server rejects
//! dead_letter = "rejected.jsonl"
//! retry_for_ms = 60000                # a server down this long (and max_retries attempts) fails the job
//! request_timeout_ms = 60000          # a statement unanswered this long: the connection is hung
//! ```
//!
//! # Rows
//!
//! The first record's fields (nested ones as `left.key`) are matched with the table's columns
//! by name, or by `columns`; types convert as [`encode`](self) describes (integers into any
//! integer, float, numeric, text or timestamp column — a timestamp from nanoseconds since the
//! Unix epoch; anything into json/jsonb). A mapping that cannot fit (a missing table, column
//! or field, a string into a bigint, a NOT NULL column left out) fails the job at the first
//! record with the setting named, and `weir run` exits 78.
//!
//! # Batches, backpressure, memory
//!
//! Rows are encoded into a batch — a `fixed_record!` type whose written fields are all
//! numbers straight from its bytes, any other through serde, byte for byte the same rows —; a
//! full batch (or one older than `batch_ms`) is *sealed* and
//! its statements are queued on the connection at once — pipelined behind the batches before
//! it, without waiting for their answers: `BEGIN`, `COPY … FROM STDIN (FORMAT binary)` with
//! the rows, and the end of the transaction. At most `max_in_flight` batches hold rows (sent
//! and not yet durable); when the server is slower than the input, `write` waits for one to
//! become durable, the subtask stops reading its ring, and backpressure goes upstream. That
//! wait is bounded by nothing but the server, so it keeps the stuck-world rules: it ends at
//! once when the job stops, and while a checkpoint's barrier is on its way the sink takes
//! records past its bound (up to twice `max_in_flight` batches) so the barrier reaches it;
//! past that it declines the checkpoint, naming the server. It holds `2 × max_in_flight + 2`
//! batches at most (the barrier's snapshot seals one more, and the seal that starts the wait
//! another; one more sealed by age for `upsert` and `at_least_once`), however long the
//! server is away; with the copies a send lends the kernel, its memory is
//! `(2 × max_in_flight + 5) × batch_bytes` at most ([`PostgresSinkConfig::memory_bytes`], in
//! the job's budget).
//!
//! # Guarantees
//!
//! | delivery | a batch ends with | visible | after a crash |
//! |---|---|---|---|
//! | `exactly_once` | `PREPARE TRANSACTION '<name>'` | when the checkpoint that closed it completes (`COMMIT PREPARED`) | every row once |
//! | `upsert` | `INSERT … SELECT DISTINCT ON (key) … ON CONFLICT (key) DO UPDATE`, `COMMIT` | at once | each key ends with the latest value, as once |
//! | `at_least_once` | the COPY's own commit | at once | rows after the last checkpoint may be written twice |
//!
//! ## Exactly once, and no barrier waits on the server
//!
//! Each batch is its own transaction, named `<prefix>/<node>/<subtask>/<epoch>/<n>`: the
//! epoch is the id of the last checkpoint before its rows (0 before the first), `n` counts
//! batches since, and `prefix` is the job's name (`transaction_prefix`). A batch is prepared
//! as soon as it is sent — not at the barrier — so preparing overlaps with writing. The
//! barrier of checkpoint `c` *closes* every batch sealed before it and passes at once; the
//! sink's state in checkpoint `c` is:
//!
//! - the names of the batches known prepared (their rows are durable in the server), and
//! - the rows of every batch not yet known prepared (queued, or sent without an answer yet),
//!   whole, with their names — at most `2 × max_in_flight + 1` batches.
//!
//! That state is the sink's part of the checkpoint, put *later* (`Sink::snapshot_later`):
//! the records after the barrier flow on while the sink waits, up to `checkpoint_wait`
//! (500 ms by default), for the server to prepare the batches sealed before it; then the part
//! names them all and holds no rows. Past `checkpoint_wait`, at once without a connection,
//! when a batch fails, or when a batch waits for the share of prepared transactions (below:
//! only a completed checkpoint frees it), the part holds the rows of those not prepared. So
//! no barrier waits on the server, and a slow or hung server makes a checkpoint at most
//! `checkpoint_wait` later and bigger (up to those batches), never stuck
//! (`stats.checkpoint_rows` counts the rows checkpoints held). A batch is *closed* by the first checkpoint whose
//! state names it prepared; when that checkpoint completes, `COMMIT PREPARED` goes out for it
//! (queued too, not waited for). A batch whose rows a checkpoint holds is never committed
//! before a later checkpoint names it prepared: a restore of the earlier one sends the rows
//! again unless it finds the name prepared, so the name must not have been committed since.
//!
//! A restore of checkpoint `c` (after a crash, a kill -9, a server restart) first settles the
//! names, at its first connection and before anything new is sent: every prepared transaction
//! under the subtask's names (`pg_prepared_xacts`) that the checkpoint names prepared is
//! committed (`c` is complete); one it holds pending and found prepared is kept, and committed
//! with the next checkpoint; every other one was written after `c` and is rolled back; each
//! pending batch not found is sent again under its name. Rows after `c` come again from the
//! sources. So every
//! row is committed once: a name is committed at most once, and the rows of a name are the
//! same in every attempt. A fresh start (no checkpoint) rolls back what an earlier run of the
//! subtask left prepared. At another parallelism, old subtask `k` is settled by new subtask
//! `k % parallelism`.
//!
//! A prepared transaction lives in the server until its checkpoint completes, and the server
//! holds `max_prepared_transactions` of them for every client together. So `exactly_once`
//! seals batches by size and at barriers only (`batch_ms` does not apply: its rows become
//! visible at the checkpoint anyway), and a subtask keeps at most its share on the wire or
//! prepared — `max_prepared_transactions / (2 × parallelism)`, at least 1; past it a batch
//! waits, queued, for the next checkpoint to commit some (the sink then backpressures). A
//! batch prepared during one checkpoint interval is committed when the next checkpoint
//! completes: size `batch_bytes` (and `batch_rows`) so two intervals' rows fit in that share.
//! `exactly_once` needs
//! checkpoints: a job file without `checkpoint_dir` is refused (exit 78); built in code
//! without checkpoints, everything would commit at the end of input only.
//!
//! Prepared transactions hold their locks until committed: with `exactly_once` a table should
//! not have a unique key that rows of two checkpoints share (such a row waits for
//! `lock_timeout_ms`, then is retried, and finally rejected as a duplicate). `upsert` is for
//! keyed results. A server with `max_prepared_transactions = 0` cannot prepare: the sink
//! refuses to start with `exactly_once` and says what to set.
//!
//! # Faults
//!
//! - **The connection is lost** (a server restart, a network cut) or a statement is not
//!   answered within `request_timeout_ms` (a hung server): the connection is closed, its
//!   backend terminated on the next one (`pg_terminate_backend`, so that a hung one cannot
//!   finish its statements behind the sink's back), the batches that were on it are looked up
//!   by name (a PREPARE may have gone through), and the others are sent again, after capped
//!   exponential backoff. The job fails (exit 69) only after `max_retries` attempts *and*
//!   `retry_for_ms`. Every wait is bounded and named in weir-stat (`waiting 3.2 s: postgres
//!   127.0.0.1:5432/clicks: 4 batches in flight; waiting 3.2 s for COPY of batch …`).
//! - **A row the server rejects** (a constraint, a value out of range: SQLSTATE classes 22
//!   and 23): the server names its line in the COPY; that row goes to the dead-letter file as
//!   one JSON line with the server's message, and the rest of the batch is sent again under the
//!   same name. An error that names no row (a deferred constraint) halves the batch until the
//!   row is alone. With `on_bad_record = "fail"` (or no `dead_letter`), the job fails instead
//!   (a row is never dropped silently). Rows the encoder cannot write (an integer out of the
//!   column's range) are treated the same way before they are sent.
//! - **Authentication, TLS, privileges** (exit 69) and **settings** (exit 78: a missing table
//!   or column, a type that does not fit, `max_prepared_transactions = 0`) fail the job with
//!   the setting named.
//!
//! # TLS
//!
//! `sslmode` as libpq: `disable`, `allow` (plain), `prefer` (TLS if offered, certificate not
//! checked; the default), `require` (TLS, not checked — or as `verify-ca` when `sslrootcert`
//! is given), `verify-ca` (the chain must lead to `sslrootcert`, or the system's roots),
//! `verify-full` (and the certificate must name the host). rustls sits between the sink's
//! buffers and io_uring, as for HTTPS.
//!
//! | file | what |
//! |---|---|
//! | `sink.rs` | the sink: batches, pipeline, prepared transactions, checkpoints, recovery, dead letters |
//! | `conn.rs` | a connection: TLS, startup, authentication, then messages in and out through io_uring |
//! | `encode.rs` | records into binary COPY rows through serde (a fixed-layout record's numbers straight from its bytes); rows back into JSON for dead letters |
//! | `config.rs` | the settings and the connection string |
//! | `section.rs` | the job-file keys |
//! | `error.rs` | the error type, and what the server's errors mean for a batch |

mod config;
mod conn;
mod encode;
mod error;
mod section;
mod sink;

pub use config::{ConnInfo, ConnInfoError, Delivery, OnBadRecord, PostgresSinkConfig, PostgresSinkStats, SslMode};
pub use error::{PostgresErrorKind, PostgresSinkError};
pub use sink::PostgresSink;
