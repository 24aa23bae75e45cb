//! The sink: batches, the pipeline of statements on one connection, prepared transactions
//! and their names, checkpoints, recovery, retries and dead letters. The wire is `conn.rs`,
//! rows are `encode.rs`.

use super::config::{Delivery, OnBadRecord, PostgresSinkConfig};
use super::conn::{Pipe, Rows, Session, TlsPolicy, tag_gen};
use super::encode::{
    COPY_HEADER, COPY_TRAILER, FixedPlan, Layout, PgType, Plan, TableColumn, quote_ident, row_json, row_ranges,
};
use super::error::{DbError, ErrorClass, PostgresErrorKind, PostgresSinkError, Problem};
use crate::io::poison::Poisoned;
use crate::io::uring::Uring;
use crate::operators::outside;
use crate::operators::{Halt, Sink, SubtaskInfo};
use crate::record::Record;
use crate::telemetry::waiting::{waiting_on, waiting_over};
use bytes::{Buf, BytesMut};
use postgres_protocol::escape::escape_literal;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use std::collections::{HashSet, VecDeque};
use std::io::Write as _;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What a checkpoint of this sink holds, version 1.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Saved<'a> {
    version: u32,
    /// The transaction names of the subtask that saved it start with this.
    prefix: String,
    /// Transactions prepared (durable) and not known committed: committed by name on restore.
    prepared: Vec<String>,
    /// Batches whose rows were not known durable: sent again on restore under their names.
    pending: Vec<SavedBatch<'a>>,
    /// The column layouts of `pending`.
    layouts: Vec<Layout>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SavedBatch<'a> {
    name: String,
    rows: u32,
    layout: u32,
    /// Bytes, not a sequence of numbers: the same postcard encoding as a `Vec<u8>` (a length,
    /// then the bytes), written at once instead of byte by byte; borrowed from the batch when
    /// written (a checkpoint's rows are not copied before they are serialized).
    #[serde(with = "raw_bytes")]
    data: std::borrow::Cow<'a, [u8]>,
}

/// Bytes (de)serialized as bytes.
mod raw_bytes {
    use std::borrow::Cow;

    /// Takes `&[u8]`: serde passes the field (`&Cow<[u8]>`), which derefs to it.
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub fn deserialize<'de, 'a, D: serde::Deserializer<'de>>(d: D) -> Result<Cow<'a, [u8]>, D::Error> {
        bytes(d).map(Cow::Owned)
    }

    fn bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                while let Some(b) = seq.next_element()? {
                    v.push(b);
                }
                Ok(v)
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

const SAVED_VERSION: u32 = 1;

/// Where a batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Sealed, waiting to be sent (or sent again, after `retry_at`).
    Queued,
    /// Its statements are on the connection.
    Wire,
    /// Exactly-once: prepared, its rows durable; waits for its checkpoint to complete.
    Prepared,
    /// Exactly-once: `COMMIT PREPARED` is on the connection.
    Committing,
}

/// A batch of rows: one transaction.
#[derive(Debug)]
struct Batch {
    /// Unique in this sink instance.
    id: u64,
    /// Its transaction name (exactly-once; a label otherwise).
    name: String,
    /// The checkpoint whose barrier closed it (its snapshot held it): committed when that
    /// checkpoint completes. `None`: still open.
    closed_by: Option<u64>,
    /// The epoch it was sealed in (its name's): the checkpoints after it hold it.
    epoch: u64,
    rows: u32,
    /// Binary COPY tuples (no header or trailer); empty once prepared.
    data: BytesMut,
    layout: Arc<Layout>,
    /// The write position of its first row (for `acknowledged`); 0 when restored.
    first: u64,
    sealed: Instant,
    state: State,
    /// Attempts that failed, when the first failed, and when the next may start.
    failures: u32,
    failing_since: Option<Instant>,
    retry_at: Option<Instant>,
    /// The first error its statements got in this attempt.
    error: Option<DbError>,
    /// Upsert: sent again after it succeeds (a batch before it failed and went again).
    again: bool,
    /// Its PREPARE may have reached the server on a connection that was lost.
    maybe_prepared: bool,
}

/// A statement on the connection, resolved at its ReadyForQuery.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// A statement of batch `id` before its last one (BEGIN, the COPY, the upsert's INSERT).
    Part(u64),
    /// The last statement of batch `id`: PREPARE TRANSACTION, COMMIT, or (at-least-once)
    /// the COPY itself.
    End(u64),
    /// COMMIT PREPARED of batch `id`.
    Commit(u64),
    /// ROLLBACK PREPARED of a transaction of an earlier run.
    Rollback(String),
}

/// A statement sent, and when.
#[derive(Debug)]
struct Expect {
    step: Step,
    sent: Instant,
    /// What it is, for messages ("COPY of 'weir/…/3/0'").
    what: String,
}

/// What a statement got back so far.
#[derive(Debug, Default)]
struct Outcome {
    tag: Option<String>,
    error: Option<DbError>,
}

/// What the table looks like (read at the first connection).
#[derive(Debug, Clone)]
struct TableInfo {
    columns: Vec<TableColumn>,
    /// Upsert: the conflict target.
    keys: Vec<String>,
    /// The server's `max_prepared_transactions`.
    max_prepared: usize,
}

/// Work left from an earlier run, done at the next connection before anything else: which
/// transaction names are ours to settle.
#[derive(Debug, Default)]
struct Recovery {
    /// Prefixes of the subtasks whose transactions this one settles.
    prefixes: Vec<String>,
    /// Whether transactions under those prefixes not in the checkpoint are rolled back
    /// (a restore, a fresh start); false after a lost connection (then they are this run's).
    roll_back_unknown: bool,
}

/// A checkpoint's part put later (`Sink::snapshot_later`): the batches sealed before its
/// barrier are on their way to the server; once it has them (prepared, or committed) the part
/// names them instead of holding their rows — or, past `checkpoint_wait`, holds the rows.
#[derive(Debug)]
struct Late {
    part: crate::operators::LatePart,
    deadline: Instant,
}

/// Writes records into a PostgreSQL table. See the module docs.
pub struct PostgresSink<T> {
    config: PostgresSinkConfig,
    name: String,
    server: String,
    /// `<prefix>/<node>/<subtask>/`: every transaction name of this subtask starts with it.
    gid_base: String,
    /// `<prefix>/<node>/`.
    node_base: String,
    /// A dormant subtask (an instance that does not own its partition) opens nothing.
    dormant: bool,
    /// The node's parallelism: the subtasks that share the server's prepared transactions.
    parallelism: u32,
    tls: Option<TlsPolicy>,
    password: Option<Option<String>>,
    ring: Option<Uring>,
    pipe: Option<Pipe>,
    /// The loss of `pipe` was handled (its work queued again).
    lost: bool,
    generation: u64,
    table: Option<TableInfo>,
    plan: Option<Plan>,
    /// The plan's fast path for a fixed-layout record type (see [`FixedPlan`]).
    fixed: Option<FixedPlan>,
    layout: Option<Arc<Layout>>,
    /// The batch being filled.
    filling: BytesMut,
    /// Buffers of batches the server has (prepared or committed), emptied for the next
    /// batches: a batch's buffer is allocated once, not per batch (a fresh multi-megabyte
    /// allocation is a fresh mapping, every page of it faulted in again).
    spare: Vec<BytesMut>,
    filling_rows: u32,
    filling_first: u64,
    filling_since: Instant,
    /// Names of batches written after barrier `epoch`: `<gid_base><epoch>/<seq>`.
    epoch: u64,
    seq: u64,
    next_id: u64,
    batches: VecDeque<Batch>,
    expect: VecDeque<Expect>,
    outcome: Outcome,
    /// The newest checkpoint completed (`u64::MAX` once the end of input is).
    completed: Option<u64>,
    recovery: Option<Recovery>,
    /// A checkpoint's part not put yet.
    late: Option<Late>,
    /// The backend of a connection given up on: terminated before anything else.
    old_backend: Option<i32>,
    /// Connection failures: since when, how many in a row, why the last, next attempt.
    down_since: Option<Instant>,
    connect_failures: u32,
    last_failure: String,
    next_connect: Instant,
    dead_letter: Option<std::fs::File>,
    written: u64,
    /// `written` as last added to `stats.rows` (published every 64 rows and at each batch,
    /// not per row: an atomic add per row costs as much as encoding it).
    rows_published: u64,
    /// Batches holding rows now, as published in `stats.in_flight`.
    published_in_flight: u64,
    poisoned: Poisoned,
    _record: PhantomData<fn(&T)>,
}

impl<T> std::fmt::Debug for PostgresSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSink").field("name", &self.name).field("server", &self.server).finish()
    }
}

/// A new buffer for a batch of `batch_bytes` (a batch may pass it by one row).
fn batch_buffer(batch_bytes: usize) -> BytesMut {
    BytesMut::with_capacity(batch_bytes + 4096)
}

/// A name of at most `max` bytes: as is, or cut with a CRC-32 of the whole.
fn bounded_name(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_owned();
    }
    let mut cut = max - 9;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{:08x}", &name[..cut], crc32fast::hash(name.as_bytes()))
}

impl<T> PostgresSink<T> {
    /// A sink for one subtask. Never fails: a bad setting poisons the sink and its first
    /// `write` or `finish` fails the job with it. It connects when its first record comes
    /// (or a restore has work for the server).
    pub fn new(config: PostgresSinkConfig, info: &SubtaskInfo) -> PostgresSink<T> {
        let name = info.name();
        let server = config.connection.server();
        let mut poisoned = Poisoned::default();
        let fail = |p: Problem| PostgresSinkError {
            sink: name.clone(),
            server: server.clone(),
            kind: p.kind,
            setting: p.setting,
            reason: p.reason,
        };
        if let Err(p) = config.validate() {
            poisoned.poison(fail(p));
        }
        let tls = match TlsPolicy::new(&config.connection) {
            Ok(t) => Some(t),
            Err(p) => {
                poisoned.poison(fail(p));
                None
            }
        };
        let max_in_flight = config.max_in_flight.clamp(1, 64);
        let ring = match Uring::new(8) {
            Ok(r) => Some(r),
            Err(e) => {
                poisoned.poison(fail(Problem::failed(e.to_string())));
                None
            }
        };
        let node_base = format!("{}/{}/", config.transaction_prefix, bounded_name(&info.node, 48));
        let gid_base = format!("{node_base}{}/", info.index);
        let filling = batch_buffer(config.batch_bytes);
        PostgresSink {
            name,
            server,
            gid_base: gid_base.clone(),
            node_base,
            dormant: !info.is_owned(),
            parallelism: info.parallelism.max(1),
            tls,
            password: None,
            ring,
            pipe: None,
            lost: false,
            generation: 0,
            table: None,
            plan: None,
            fixed: None,
            layout: None,
            filling,
            spare: Vec::new(),
            filling_rows: 0,
            filling_first: 0,
            filling_since: Instant::now(),
            epoch: 0,
            seq: 0,
            next_id: 0,
            batches: VecDeque::new(),
            expect: VecDeque::new(),
            outcome: Outcome::default(),
            completed: None,
            // A fresh start settles what an earlier run of this subtask left prepared;
            // `restore` replaces this with what the checkpoint says.
            recovery: Some(Recovery { prefixes: vec![gid_base], roll_back_unknown: true }),
            late: None,
            old_backend: None,
            down_since: None,
            connect_failures: 0,
            last_failure: String::new(),
            next_connect: Instant::now(),
            dead_letter: None,
            written: 0,
            rows_published: 0,
            published_in_flight: 0,
            poisoned,
            config: PostgresSinkConfig { max_in_flight, ..config },
            _record: PhantomData,
        }
    }

    /// The setup error that poisoned this sink, if any.
    pub fn setup_error(&self) -> Option<&str> {
        self.poisoned.text()
    }

    fn check(&self) -> Result<(), Halt> {
        self.poisoned.check()
    }

    fn fail(&mut self, p: Problem) -> Halt {
        let error = PostgresSinkError {
            sink: self.name.clone(),
            server: self.server.clone(),
            kind: p.kind,
            setting: p.setting,
            reason: p.reason,
        };
        waiting_over();
        self.poisoned.poison(error)
    }

    /// Batches holding rows (queued or on the connection).
    fn held(&self) -> usize {
        self.batches.iter().filter(|b| matches!(b.state, State::Queued | State::Wire)).count()
    }

    fn publish_in_flight(&mut self) {
        let now = self.held() as u64;
        let stats = &self.config.stats;
        if now > self.published_in_flight {
            stats.in_flight.fetch_add(now - self.published_in_flight, Ordering::Relaxed);
        } else {
            stats.in_flight.fetch_sub(self.published_in_flight - now, Ordering::Relaxed);
        }
        self.published_in_flight = now;
    }

    // ---- connecting ----

    /// Whether a connection is up.
    fn connected(&self) -> bool {
        !self.lost && self.pipe.as_ref().is_some_and(|p| p.failed.is_none())
    }

    /// Connect now (blocking, bounded by `connect_timeout`): open, read the table the first
    /// time, set the session up, end what a lost connection left, settle an earlier run's
    /// transactions. A failure worth retrying schedules the next attempt; one that is not
    /// fails the job.
    fn connect(&mut self) -> Result<(), Halt> {
        let attempt = self.connect_failures + 1;
        let server = self.server.clone();
        let last = self.last_failure.clone();
        waiting_on(|| {
            if attempt == 1 {
                format!("postgres {server}: connecting")
            } else {
                format!("postgres {server}: connecting (attempt {attempt}; last: {last})")
            }
        });
        let deadline = Instant::now() + self.config.connect_timeout;
        match self.open(deadline) {
            Ok(pipe) => {
                self.pipe = Some(pipe);
                self.lost = false;
                self.config.stats.connections.fetch_add(1, Ordering::Relaxed);
                self.connect_failures = 0;
                self.down_since = None;
                waiting_over();
                Ok(())
            }
            Err(p) if p.is_retryable() => {
                let now = Instant::now();
                let since = *self.down_since.get_or_insert(now);
                self.connect_failures += 1;
                self.last_failure = p.reason.clone();
                if self.connect_failures > self.config.max_retries && now - since >= self.config.retry_for {
                    return Err(self.fail(Problem::unavailable(format!(
                        "the server has not answered for {} ({} attempts; last: {}); giving up (max_retries {} and \
                         retry_for_ms {}: raise retry_for_ms to ride out a longer outage)",
                        crate::util::duration_text(now - since),
                        self.connect_failures,
                        p.reason,
                        self.config.max_retries,
                        self.config.retry_for.as_millis()
                    ))));
                }
                self.next_connect = now + self.config.backoff.delay(self.connect_failures);
                Ok(())
            }
            Err(p) => Err(self.fail(p)),
        }
    }

    /// The `application_name` the connections of the subtask whose names start with `prefix`
    /// carry (63 bytes at most, as the server keeps).
    fn app_name(&self, prefix: &str) -> String {
        let app = self.config.connection.application_name.as_deref().unwrap_or("weir");
        bounded_name(&format!("{app} {prefix}"), 63)
    }

    /// One connection, ready for batches.
    fn open(&mut self, deadline: Instant) -> Result<Pipe, Problem> {
        if self.password.is_none() {
            let p = self.config.connection.resolve_password(self.config.password_file.as_deref());
            let setting = if self.config.password_file.is_some() { "password_file" } else { "connection" };
            self.password = Some(p.map_err(|e| Problem::config(setting, e.to_string()))?);
        }
        let password = self.password.clone().flatten();
        let tls = self.tls.clone().ok_or_else(|| Problem::failed("no TLS policy (a poisoned sink)"))?;
        let app = self.app_name(&self.gid_base);
        let mut session = Session::open(&self.config.connection, &app, password.as_deref(), &tls, deadline)?;
        let query = |session: &mut Session, sql: &str| -> Result<Result<Rows, DbError>, Problem> {
            session.query(sql, deadline)
        };
        // The session: lock waits bounded (a row a prepared transaction holds).
        let setup = format!("SET lock_timeout = {}", self.config.lock_timeout.as_millis().max(1));
        query(&mut session, &setup)?.map_err(|e| Problem::failed(format!("{setup}: {}", e.text())))?;
        if self.table.is_none() {
            self.table = Some(self.read_table(&mut session, deadline)?);
        }
        if self.old_backend.take().is_some() || self.recovery.is_some() {
            // A connection given up on (a hung or slow server), or one of a run that was killed,
            // may still be running its statements: end every backend of the subtasks whose
            // names this one settles (each connects under its own application_name), and wait
            // for them to be gone, so that none can prepare a name after it was looked up.
            let mut apps = vec![self.app_name(&self.gid_base)];
            if let Some(r) = &self.recovery {
                apps.extend(r.prefixes.iter().map(|p| self.app_name(p)));
            }
            let list = apps.iter().map(|a| escape_literal(a)).collect::<Vec<_>>().join(", ");
            let sql = format!(
                "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE usename = current_user \
                 AND application_name IN ({list}) AND pid <> pg_backend_pid()"
            );
            match query(&mut session, &sql)? {
                Ok(rows) => {
                    let ended = rows.first().and_then(|r| r.first().cloned().flatten()).unwrap_or_default();
                    if ended != "0" {
                        tracing::info!(sink = %self.name, "ended {ended} backend(s) of earlier connections");
                    }
                }
                Err(e) => tracing::warn!(sink = %self.name, "ending earlier connections' backends: {}", e.text()),
            }
        }
        self.generation += 1;
        let mut rollbacks = Vec::new();
        if self.recovery.is_some() || self.batches.iter().any(|b| b.maybe_prepared || b.state != State::Queued) {
            rollbacks = self.reconcile(&mut session, deadline)?;
        }
        let mut pipe = session.into_pipe(self.generation);
        for gid in rollbacks {
            let sql = format!("ROLLBACK PREPARED {}", escape_literal(&gid));
            pipe.queue_with(|b| frontend::query(&sql, b));
            self.expect.push_back(Expect { step: Step::Rollback(gid.clone()), sent: Instant::now(), what: sql });
        }
        Ok(pipe)
    }

    /// The table's columns (and for upsert its key), checked against the settings.
    fn read_table(&self, session: &mut Session, deadline: Instant) -> Result<TableInfo, Problem> {
        let table = &self.config.table;
        let lit = escape_literal(table);
        let sql = format!(
            "SELECT to_regclass({lit})::oid::int8, has_table_privilege(to_regclass({lit}), 'INSERT'), \
             current_setting('max_prepared_transactions'), current_user, current_database(), \
             current_setting('search_path')"
        );
        let rows = session.query(&sql, deadline)?.map_err(|e| {
            if e.code == "42501" {
                Problem::refused("connection", e.text())
            } else {
                Problem::config("table", format!("`{table}`: {}", e.text()))
            }
        })?;
        let row = rows.first().ok_or_else(|| Problem::failed("the table query returned no row"))?;
        let text = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
        let (user, db) = (text(3), text(4));
        let Some(oid) = row.first().cloned().flatten() else {
            return Err(Problem::config(
                "table",
                format!(
                    "there is no table `{table}` in database {db} (search_path {}); create it, or name it with its \
                     schema",
                    text(5)
                ),
            ));
        };
        if text(1) != "t" {
            return Err(Problem::refused(
                "connection",
                format!("user {user} may not INSERT into {table}: GRANT INSERT ON {table} TO {}", quote_ident(&user)),
            ));
        }
        if self.config.delivery == Delivery::ExactlyOnce && text(2).trim() == "0" {
            return Err(Problem::config(
                "delivery",
                "the server has max_prepared_transactions = 0, so it cannot prepare transactions, which \
                 delivery = \"exactly_once\" needs: set max_prepared_transactions in postgresql.conf (at least twice \
                 the sink's parallelism; the server needs a restart), or use delivery = \"upsert\" or \
                 \"at_least_once\"",
            ));
        }
        let sql = format!(
            "SELECT a.attname, CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END::int8, \
             format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasdef OR a.attidentity <> '', \
             a.attgenerated <> '' FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = {oid} AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
        );
        let rows = session.query(&sql, deadline)?.map_err(|e| Problem::failed(e.text()))?;
        let columns = rows
            .iter()
            .filter(|r| r.get(5).cloned().flatten().as_deref() != Some("t"))
            .map(|r| {
                let text = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
                TableColumn {
                    name: text(0),
                    ty: text(1).parse().ok().and_then(PgType::from_oid),
                    type_name: text(2),
                    not_null: text(3) == "t",
                    has_default: text(4) == "t",
                }
            })
            .collect::<Vec<_>>();
        let mut keys = self.config.key_columns.clone();
        if self.config.delivery == Delivery::Upsert {
            if keys.is_empty() {
                let sql = format!(
                    "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = \
                     ANY(i.indkey) WHERE i.indrelid = {oid} AND i.indisprimary ORDER BY \
                     array_position(i.indkey::int2[], a.attnum)"
                );
                let rows = session.query(&sql, deadline)?.map_err(|e| Problem::failed(e.text()))?;
                keys = rows.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect();
                if keys.is_empty() {
                    return Err(Problem::config(
                        "key_columns",
                        format!(
                            "table {table} has no primary key, so upsert does not know which rows are the same: give \
                             key_columns (a unique index must cover them)"
                        ),
                    ));
                }
            }
            for k in &keys {
                if !columns.iter().any(|c| &c.name == k) {
                    return Err(Problem::config("key_columns", format!("table {table} has no column `{k}`")));
                }
            }
        }
        let max_prepared = text(2).trim().parse().unwrap_or(0);
        Ok(TableInfo { columns, keys, max_prepared })
    }

    /// Settle transactions by name before anything else is sent: after a restore (or at a
    /// fresh start), what the checkpoint prepared is committed and every other prepared
    /// transaction under the subtask's names is rolled back; after a lost connection, the
    /// batches whose PREPARE may have reached the server are looked up. Returns the names to
    /// roll back.
    fn reconcile(&mut self, session: &mut Session, deadline: Instant) -> Result<Vec<String>, Problem> {
        // The recovery stays armed until its rollbacks are answered: a connection lost before
        // then settles again on the next one.
        let (mut prefixes, roll_back_unknown) = match &self.recovery {
            Some(r) => (r.prefixes.clone(), r.roll_back_unknown),
            None => (Vec::new(), false),
        };
        if !prefixes.contains(&self.gid_base) {
            prefixes.push(self.gid_base.clone());
        }
        let like = |p: &str| {
            let escaped: String =
                p.chars().flat_map(|c| if "\\%_".contains(c) { vec!['\\', c] } else { vec![c] }).collect();
            format!("gid LIKE {}", escape_literal(&format!("{escaped}%")))
        };
        let sql = format!(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND ({})",
            prefixes.iter().map(|p| like(p)).collect::<Vec<_>>().join(" OR ")
        );
        let found: HashSet<String> = match session.query(&sql, deadline)? {
            Ok(rows) => rows.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect(),
            Err(e) => return Err(Problem::failed(format!("reading pg_prepared_xacts: {}", e.text()))),
        };
        let mut known = HashSet::new();
        let mut committed = Vec::new();
        for b in &mut self.batches {
            known.insert(b.name.clone());
            let there = found.contains(&b.name);
            match b.state {
                // Prepared on a connection whose answer was lost, or by the run before a
                // restore: its rows are durable; commit it when its checkpoint completes.
                State::Queued | State::Wire if there => {
                    b.state = State::Prepared;
                    b.data = BytesMut::new();
                    b.maybe_prepared = false;
                }
                State::Queued | State::Wire => {
                    b.state = State::Queued;
                    b.maybe_prepared = false;
                }
                // Prepared and no longer there: its commit went through.
                State::Prepared | State::Committing if !there => committed.push(b.id),
                State::Committing => b.state = State::Prepared,
                State::Prepared => {}
            }
        }
        for id in committed {
            self.settle_committed(id);
        }
        let mut rollbacks = Vec::new();
        if roll_back_unknown {
            rollbacks = found.into_iter().filter(|g| !known.contains(g)).collect();
            rollbacks.sort();
            if rollbacks.is_empty() {
                self.recovery = None;
            } else {
                tracing::warn!(
                    sink = %self.name,
                    count = rollbacks.len(),
                    "rolling back {} prepared transaction(s) an earlier run left after its last checkpoint ({}…)",
                    rollbacks.len(),
                    rollbacks[0]
                );
            }
        }
        Ok(rollbacks)
    }

    /// The connection failed (`why`): what was on it goes back to the queue, to be sent
    /// again on the next connection after a backoff. An idle connection that ends (a server
    /// restarted while nothing was on it) is only replaced when there is work.
    fn connection_lost(&mut self, why: String) {
        let pipe = self.pipe.as_mut().expect("a connection was up");
        pipe.fail(why.clone());
        self.lost = true;
        let on_wire = !self.expect.is_empty();
        let now = Instant::now();
        if !on_wire {
            tracing::debug!(sink = %self.name, server = %self.server, "idle connection ended: {why}");
            return;
        }
        self.old_backend = Some(pipe.pid());
        let exactly_once = self.config.delivery == Delivery::ExactlyOnce;
        for b in &mut self.batches {
            match b.state {
                State::Wire => {
                    b.state = State::Queued;
                    b.error = None;
                    b.again = false;
                    b.maybe_prepared |= exactly_once;
                    b.failures += 1;
                    b.failing_since.get_or_insert(now);
                }
                State::Committing => b.state = State::Prepared,
                _ => {}
            }
        }
        self.expect.clear();
        self.outcome = Outcome::default();
        self.config.stats.retries.fetch_add(1, Ordering::Relaxed);
        let since = *self.down_since.get_or_insert(now);
        self.connect_failures += 1;
        self.last_failure = why.clone();
        self.next_connect = now + self.config.backoff.delay(self.connect_failures);
        tracing::warn!(sink = %self.name, server = %self.server, "connection lost: {why}; sending again on a new one");
        let server = self.server.clone();
        waiting_on(|| {
            format!(
                "postgres {server}: connection lost {:.1} s ago ({why}); reconnecting",
                since.elapsed().as_secs_f64()
            )
        });
    }

    /// A batch that kept losing its connection (a server that accepts and then drops every
    /// attempt) for `max_retries` attempts and `retry_for`: the job fails.
    fn gave_up(&mut self) -> Result<(), Halt> {
        let now = Instant::now();
        let (max, span) = (self.config.max_retries, self.config.retry_for);
        let Some(b) =
            self.batches.iter().find(|b| b.failures > max && b.failing_since.is_some_and(|since| now - since >= span))
        else {
            return Ok(());
        };
        let reason = format!(
            "batch {} ({} rows) was cut off {} times over {}, last: {}; giving up (raise retry_for_ms to ride out a \
             longer outage)",
            b.name,
            b.rows,
            b.failures,
            crate::util::duration_text(now - b.failing_since.unwrap_or(now)),
            self.last_failure
        );
        Err(self.fail(Problem::unavailable(reason)))
    }

    // ---- the pipeline ----

    /// One round of work: reconnect when due (if `may_connect`), seal a batch past its time,
    /// put queued batches and due commits on the connection, wait up to `block` for the
    /// server, and handle what it answered.
    fn drive(&mut self, block: Option<Duration>, may_connect: bool) -> Result<(), Halt> {
        self.check()?;
        // Exactly-once rows become visible when a checkpoint completes, whatever their batch's
        // age: its batches are sealed by size and at barriers only, so a checkpoint interval
        // holds as few prepared transactions as its rows allow.
        if self.config.delivery != Delivery::ExactlyOnce
            && self.filling_rows > 0
            && self.filling_since.elapsed() >= self.config.batch_time
        {
            self.seal();
        }
        let busy = !self.batches.is_empty() || !self.expect.is_empty();
        if !self.connected() && busy && may_connect && Instant::now() >= self.next_connect {
            // A connection given up on is dropped at once: its operations come back under
            // its generation and are ignored.
            self.pipe = None;
            self.connect()?;
        }
        self.dispatch();
        if let Err(e) = self.pump() {
            return Err(self.fail(Problem::failed(format!("io_uring submit: {e}"))));
        }
        if let Some(timeout) = block {
            let now = Instant::now();
            let mut wait = timeout;
            if !self.connected() && busy {
                wait = wait.min(self.next_connect.saturating_duration_since(now));
            }
            if let Some(front) = self.expect.front() {
                wait = wait.min((front.sent + self.config.request_timeout).saturating_duration_since(now));
            }
            let in_kernel = self.ring.as_ref().is_some_and(|r| r.in_kernel() > 0);
            if in_kernel {
                let ring = self.ring.as_mut().expect("a sink with a ring");
                if let Err(e) = ring.wait(Some(wait.max(Duration::from_micros(50)))) {
                    return Err(self.fail(Problem::failed(format!("io_uring wait: {e}"))));
                }
            } else if !wait.is_zero() {
                // Nothing in the kernel: the next connection attempt is what we wait for.
                std::thread::sleep(wait.min(Duration::from_millis(50)));
            }
        }
        self.reap()?;
        // What the answers freed (a send done, commits due) goes out at once.
        self.dispatch();
        if let Err(e) = self.pump() {
            return Err(self.fail(Problem::failed(format!("io_uring submit: {e}"))));
        }
        self.settle_late(false)
    }

    /// Hand what is queued to the kernel.
    fn pump(&mut self) -> std::io::Result<()> {
        let (Some(pipe), Some(ring)) = (self.pipe.as_mut(), self.ring.as_mut()) else { return Ok(()) };
        if pipe.failed.is_none() && !self.lost {
            pipe.pump(ring)?;
        }
        ring.submit()
    }

    /// Handle every completion and every whole message received; notice a failed or hung
    /// connection.
    fn reap(&mut self) -> Result<(), Halt> {
        while let Some(c) = self.ring.as_mut().and_then(|r| r.next_completion()) {
            if tag_gen(c.tag) != self.generation {
                continue; // a connection given up on: its buffers come back, nothing else
            }
            let (Some(pipe), Some(ring)) = (self.pipe.as_mut(), self.ring.as_mut()) else { continue };
            if let Err(e) = pipe.completed(c, ring) {
                return Err(self.fail(Problem::failed(format!("io_uring submit: {e}"))));
            }
        }
        while let Some(pipe) = self.pipe.as_mut() {
            if self.lost {
                break; // what it carried is queued again already
            }
            match pipe.next_message() {
                Ok(Some(m)) => self.message(m)?,
                Ok(None) => break,
                Err(why) => {
                    pipe.fail(why);
                    break;
                }
            }
        }
        self.check()?;
        if !self.lost
            && let Some(pipe) = &self.pipe
        {
            if let Some(why) = pipe.failed.clone() {
                self.connection_lost(why);
            } else if let Some(front) = self.expect.front()
                && front.sent.elapsed() >= self.config.request_timeout
            {
                let why = format!(
                    "no answer to {} within {} (request_timeout_ms)",
                    front.what,
                    crate::util::duration_text(self.config.request_timeout)
                );
                self.connection_lost(why);
            }
            self.gave_up()?;
        }
        self.publish_in_flight();
        Ok(())
    }

    /// One message from the server.
    fn message(&mut self, m: Message) -> Result<(), Halt> {
        match m {
            Message::CommandComplete(body) => {
                self.outcome.tag = body.tag().ok().map(str::to_owned);
            }
            Message::ErrorResponse(body) => {
                let e = super::conn::db_error(&body);
                if self.expect.is_empty() || e.severity == "FATAL" || e.severity == "PANIC" {
                    // Outside a statement, or the session ends: the connection is lost.
                    if let Some(p) = self.pipe.as_mut() {
                        p.fail(format!("the server ended the session: {}", e.text()));
                    }
                } else {
                    self.outcome.error.get_or_insert(e);
                }
            }
            Message::ReadyForQuery(_) => {
                let outcome = std::mem::take(&mut self.outcome);
                if let Some(ex) = self.expect.pop_front() {
                    self.resolve(ex, outcome)?;
                }
            }
            Message::NoticeResponse(_) | Message::ParameterStatus(_) | Message::CopyInResponse(_) => {}
            _ => {}
        }
        Ok(())
    }

    fn position(&self, id: u64) -> Option<usize> {
        self.batches.iter().position(|b| b.id == id)
    }

    /// A statement is done.
    fn resolve(&mut self, ex: Expect, outcome: Outcome) -> Result<(), Halt> {
        match ex.step {
            Step::Part(id) => {
                if let (Some(i), Some(e)) = (self.position(id), outcome.error) {
                    self.batches[i].error.get_or_insert(e);
                }
                Ok(())
            }
            Step::End(id) => {
                let Some(i) = self.position(id) else { return Ok(()) };
                let b = &mut self.batches[i];
                let mut already = false;
                if b.error.is_none()
                    && let Some(e) = outcome.error
                {
                    // PREPARE of a name already prepared by an earlier attempt of this very
                    // batch (a connection given up on that still went through).
                    if e.code == "42710" && b.failures > 0 && self.config.delivery == Delivery::ExactlyOnce {
                        tracing::warn!(sink = %self.name, "transaction {} was prepared by an earlier attempt", b.name);
                        already = true;
                    } else {
                        b.error = Some(e);
                    }
                }
                let expected_tag = match self.config.delivery {
                    Delivery::ExactlyOnce => "PREPARE TRANSACTION",
                    Delivery::Upsert => "COMMIT",
                    Delivery::AtLeastOnce => "COPY",
                };
                if !already && b.error.is_none() && !outcome.tag.as_deref().is_some_and(|t| t.starts_with(expected_tag))
                {
                    // The server rolled the transaction back without saying why here.
                    b.error = Some(DbError {
                        code: "40000".into(),
                        message: format!("the transaction ended with {:?}", outcome.tag),
                        ..DbError::default()
                    });
                }
                match b.error.take() {
                    None => self.batch_done(i),
                    Some(e) => self.batch_failed(i, e),
                }
            }
            Step::Commit(id) => {
                let Some(i) = self.position(id) else { return Ok(()) };
                match outcome.error {
                    // 42704: no such prepared transaction: a commit an earlier connection sent
                    // went through.
                    None => {
                        self.settle_committed(id);
                        Ok(())
                    }
                    Some(e) if e.code == "42704" => {
                        self.settle_committed(id);
                        Ok(())
                    }
                    Some(e) if e.class() == ErrorClass::Retry => {
                        self.batches[i].state = State::Prepared;
                        self.batches[i].retry_at = Some(Instant::now() + self.config.backoff.delay(1));
                        Ok(())
                    }
                    Some(e) => Err(self.fail(Problem::failed(format!(
                        "COMMIT PREPARED {}: {}",
                        escape_literal(&self.batches[i].name),
                        e.text()
                    )))),
                }
            }
            Step::Rollback(gid) => {
                match outcome.error {
                    None => {
                        self.config.stats.rolled_back.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(e) if e.code == "42704" => {}
                    Some(e) => {
                        return Err(self.fail(Problem::failed(format!(
                            "ROLLBACK PREPARED {}: {}",
                            escape_literal(&gid),
                            e.text()
                        ))));
                    }
                }
                if !self.expect.iter().any(|e| matches!(e.step, Step::Rollback(_))) {
                    self.recovery = None;
                }
                Ok(())
            }
        }
    }

    /// Batch `i`'s last statement succeeded.
    fn batch_done(&mut self, i: usize) -> Result<(), Halt> {
        let stats = self.config.stats.clone();
        let b = &mut self.batches[i];
        b.failures = 0;
        b.failing_since = None;
        b.maybe_prepared = false;
        if b.again {
            // Upsert: a batch before it went again; so does this one, after it.
            b.again = false;
            b.state = State::Queued;
            return Ok(());
        }
        match self.config.delivery {
            Delivery::ExactlyOnce => {
                stats.prepared.fetch_add(1, Ordering::Relaxed);
                b.state = State::Prepared;
                let data = std::mem::take(&mut b.data);
                self.recycle(data);
            }
            Delivery::Upsert | Delivery::AtLeastOnce => {
                let id = b.id;
                stats.committed.fetch_add(1, Ordering::Relaxed);
                self.settle_committed(id);
            }
        }
        if self.down_since.is_none() && self.expect.is_empty() {
            waiting_over();
        }
        Ok(())
    }

    /// Batch `id` is visible: count it and forget it.
    fn settle_committed(&mut self, id: u64) {
        let Some(i) = self.position(id) else { return };
        let mut b = self.batches.remove(i).expect("found above");
        self.recycle(std::mem::take(&mut b.data));
        let stats = &self.config.stats;
        stats.rows_committed.fetch_add(b.rows.into(), Ordering::Relaxed);
        if b.state == State::Committing || b.state == State::Prepared {
            stats.committed.fetch_add(1, Ordering::Relaxed);
        }
        stats.commit_latency.record(b.sealed.elapsed());
    }

    /// Batch `i` got error `e`: take a rejected row out, retry, or fail, by the error.
    fn batch_failed(&mut self, i: usize, e: DbError) -> Result<(), Halt> {
        let now = Instant::now();
        let class = e.class();
        if self.config.delivery == Delivery::Upsert && matches!(class, ErrorClass::BadRow | ErrorClass::Retry) {
            // Batches after it may have been applied already: they go again after it, so
            // that each key ends with its latest value.
            for b in self.batches.iter_mut().skip(i + 1) {
                if b.state == State::Wire {
                    b.again = true;
                }
            }
        }
        match class {
            ErrorClass::BadRow => self.bad_rows(i, &e),
            ErrorClass::Retry => {
                let b = &mut self.batches[i];
                b.failures += 1;
                let since = *b.failing_since.get_or_insert(now);
                if b.failures > self.config.max_retries && now - since >= self.config.retry_for {
                    let reason = format!(
                        "batch {} ({} rows) failed {} times over {}, last: {}; giving up (raise retry_for_ms to ride \
                         out a longer outage)",
                        b.name,
                        b.rows,
                        b.failures,
                        crate::util::duration_text(now - since),
                        e.text()
                    );
                    return Err(self.fail(Problem::unavailable(reason)));
                }
                b.state = State::Queued;
                b.retry_at = Some(now + self.config.backoff.delay(b.failures));
                self.config.stats.retries.fetch_add(1, Ordering::Relaxed);
                let (name, failures, server) = (b.name.clone(), b.failures, self.server.clone());
                waiting_on(|| format!("postgres {server}: batch {name} failed {failures} times, last: {}", e.text()));
                Ok(())
            }
            ErrorClass::Refused => Err(self.fail(Problem::refused(
                "connection",
                format!(
                    "{} (as user {}: GRANT the privilege on {})",
                    e.text(),
                    self.config.connection.user,
                    self.config.table
                ),
            ))),
            ErrorClass::Config => {
                let setting = match e.code.as_str() {
                    "42P01" => "table",
                    "42703" | "42804" | "42P18" => "columns",
                    "42P10" => "key_columns",
                    "42710" => "transaction_prefix",
                    "55000" if self.config.delivery == Delivery::ExactlyOnce => "delivery",
                    _ => "table",
                };
                let hint = if e.code == "42P10" {
                    "; key_columns must be covered by a unique index or the primary key"
                } else if e.code == "42710" {
                    "; another job or sink uses the same transaction names: give each its own transaction_prefix"
                } else if setting == "delivery" {
                    "; set max_prepared_transactions in postgresql.conf and restart the server"
                } else {
                    ""
                };
                Err(self.fail(Problem::config(setting, format!("{} (table {}){hint}", e.text(), self.config.table))))
            }
            ErrorClass::Fail => Err(self.fail(Problem::failed(format!(
                "batch {} into {}: {}",
                self.batches[i].name,
                self.config.table,
                e.text()
            )))),
        }
    }

    /// The server rejected a row of batch `i`: its line if the error names one, else the
    /// batch is halved until the row is alone. Rejected rows go to the dead letters (or fail
    /// the job); the rest is sent again under the same name.
    fn bad_rows(&mut self, i: usize, e: &DbError) -> Result<(), Halt> {
        let ranges = match row_ranges(&self.batches[i].data) {
            Ok(r) => r,
            Err(why) => {
                let name = self.batches[i].name.clone();
                return Err(self.fail(Problem::failed(format!("batch {name}: {why}"))));
            }
        };
        let line = e.copy_line().filter(|l| (1..=ranges.len()).contains(l));
        if line.is_none() && ranges.len() > 1 {
            // No row named (a deferred constraint, the upsert's INSERT): halve the batch.
            let b = self.batches.remove(i).expect("a failed batch");
            let mid = ranges.len() / 2;
            let cut = ranges[mid].start;
            let mut first = b.data;
            let second = first.split_off(cut);
            let halves = [(first, mid as u32, "a"), (second, (ranges.len() - mid) as u32, "b")];
            for (k, (data, rows, suffix)) in halves.into_iter().enumerate() {
                let id = self.next_id;
                self.next_id += 1;
                let half = Batch {
                    id,
                    name: format!("{}{suffix}", b.name),
                    closed_by: b.closed_by,
                    epoch: b.epoch,
                    rows,
                    data,
                    layout: b.layout.clone(),
                    first: b.first,
                    sealed: b.sealed,
                    state: State::Queued,
                    failures: 0,
                    failing_since: None,
                    retry_at: None,
                    error: None,
                    again: false,
                    maybe_prepared: false,
                };
                self.batches.insert(i + k, half);
            }
            self.config.stats.retries.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let row = line.map_or(0, |l| l - 1);
        let range = ranges[row].clone();
        let b = &self.batches[i];
        let json = row_json(&b.data[range.clone()], &b.layout);
        let name = b.name.clone();
        self.reject_row(json, &e.text(), &e.code, &name)?;
        let b = &mut self.batches[i];
        let mut rest = b.data.split_off(range.start);
        rest.advance(range.end - range.start);
        b.data.unsplit(rest);
        b.rows -= 1;
        b.state = State::Queued;
        b.error = None;
        if b.rows == 0 {
            let id = b.id;
            self.batches.remove(self.position(id).expect("the batch"));
        } else {
            self.config.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A row the server (or the encoder) rejected: a dead-letter line, or the job fails.
    fn reject_row(&mut self, row: serde_json::Value, why: &str, sqlstate: &str, batch: &str) -> Result<(), Halt> {
        let path = match (&self.config.on_bad_record, &self.config.dead_letter) {
            (OnBadRecord::DeadLetter, Some(p)) => p.clone(),
            _ => {
                return Err(self.fail(Problem {
                    kind: PostgresErrorKind::BadRecord,
                    setting: Some("on_bad_record".into()),
                    reason: format!(
                        "the server rejected a row of {} ({why}): {row}; on_bad_record is fail (or no dead_letter \
                         file is given), so the job fails rather than drop it",
                        self.config.table
                    ),
                }));
            }
        };
        let line = serde_json::json!({
            "sink": self.name,
            "table": self.config.table,
            "transaction": batch,
            "sqlstate": sqlstate,
            "error": why,
            "row": row,
        });
        let written = (|| -> std::io::Result<()> {
            if self.dead_letter.is_none() {
                self.dead_letter = Some(std::fs::OpenOptions::new().create(true).append(true).open(&path)?);
            }
            let mut bytes = serde_json::to_vec(&line).expect("JSON values serialize");
            bytes.push(b'\n');
            // One write per line: lines of concurrent subtasks do not interleave (O_APPEND).
            self.dead_letter.as_mut().expect("opened above").write_all(&bytes)
        })();
        if let Err(e) = written {
            return Err(self.fail(Problem::failed(format!(
                "cannot write the dead-letter file {}: {}",
                path.display(),
                crate::util::io_error_text(&e)
            ))));
        }
        self.config.stats.dead_letter_rows.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Put queued batches (in order) and due commits on the connection.
    fn dispatch(&mut self) {
        if !self.connected() {
            return;
        }
        let now = Instant::now();
        let delivery = self.config.delivery;
        let completed = self.completed;
        let cap = self.prepared_cap();
        let mut open = self.batches.iter().filter(|b| b.state != State::Queued).count();
        for i in 0..self.batches.len() {
            let b = &self.batches[i];
            match b.state {
                State::Queued if delivery == Delivery::ExactlyOnce && open >= cap => {
                    // The server's prepared transactions are shared by every subtask: past its
                    // share a batch waits, queued, for a checkpoint to commit some.
                    let server = self.server.clone();
                    waiting_on(|| {
                        format!(
                            "postgres {server}: {open} prepared transactions wait for a checkpoint to complete                              (this subtask's share of max_prepared_transactions)"
                        )
                    });
                }
                State::Queued => {
                    if b.retry_at.is_some_and(|t| t > now) {
                        if delivery == Delivery::Upsert {
                            break; // upsert keeps the order of batches
                        }
                        continue;
                    }
                    open += 1;
                    self.send_batch(i, now);
                }
                State::Prepared
                    if b.closed_by.is_some_and(|c| completed.is_some_and(|done| c <= done))
                        && b.retry_at.is_none_or(|t| t <= now) =>
                {
                    let sql = format!("COMMIT PREPARED {}", escape_literal(&b.name));
                    let id = b.id;
                    let pipe = self.pipe.as_mut().expect("connected");
                    pipe.queue_with(|buf| frontend::query(&sql, buf));
                    self.expect.push_back(Expect { step: Step::Commit(id), sent: now, what: sql });
                    self.batches[i].state = State::Committing;
                    self.batches[i].retry_at = None;
                }
                _ => {}
            }
        }
    }

    /// How many transactions this subtask may have on the wire or prepared at once: its
    /// share of the server's `max_prepared_transactions` (half of it over the node's
    /// subtasks, leaving room for other clients and for a restore's rollbacks).
    fn prepared_cap(&self) -> usize {
        let server = self.table.as_ref().map_or(0, |t| t.max_prepared);
        (server / (2 * self.parallelism as usize)).max(1)
    }

    /// Put batch `i`'s statements on the connection.
    fn send_batch(&mut self, i: usize, now: Instant) {
        let delivery = self.config.delivery;
        let table = self.config.table.clone();
        let keys = self.table.as_ref().map(|t| t.keys.clone()).unwrap_or_default();
        let b = &mut self.batches[i];
        let pipe = self.pipe.as_mut().expect("connected");
        let columns = b.layout.column_list();
        let stage = format!("weir_stage_{:08x}", crc32fast::hash(columns.as_bytes()));
        let copy_target = match delivery {
            Delivery::Upsert => stage.clone(),
            _ => table.clone(),
        };
        let copy = format!("COPY {copy_target} ({columns}) FROM STDIN (FORMAT binary)");
        let mut steps = Vec::new();
        pipe.queue_with(|buf| {
            if delivery != Delivery::AtLeastOnce {
                frontend::query("BEGIN", buf)?;
                steps.push((Step::Part(b.id), "BEGIN".to_owned()));
            }
            if delivery == Delivery::Upsert {
                // Types of the target's columns, no constraints: a staging table per layout,
                // emptied at every commit.
                let create = format!(
                    "CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS SELECT {columns} FROM {table} \
                     WITH NO DATA"
                );
                frontend::query(&create, buf)?;
                steps.push((Step::Part(b.id), format!("the staging table of {}", b.name)));
            }
            frontend::query(&copy, buf)?;
            let copy_step = if delivery == Delivery::AtLeastOnce { Step::End(b.id) } else { Step::Part(b.id) };
            steps.push((copy_step, format!("COPY of batch {} ({} rows)", b.name, b.rows)));
            Ok(())
        });
        // The rows, copied once, straight into the outbox.
        let copied = pipe.queue_copy_data(&[COPY_HEADER, &b.data[..], COPY_TRAILER]);
        pipe.queue_with(|buf| {
            if copied {
                frontend::copy_done(buf);
            } else {
                // Not reachable with batch_bytes below 2 GiB; the COPY fails, and so the batch.
                frontend::copy_fail("a batch too large for one CopyData message", buf)?;
            }
            match delivery {
                Delivery::ExactlyOnce => {
                    let prepare = format!("PREPARE TRANSACTION {}", escape_literal(&b.name));
                    frontend::query(&prepare, buf)?;
                    steps.push((Step::End(b.id), prepare));
                }
                Delivery::Upsert => {
                    let key_list = keys.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
                    let updates: Vec<String> = b
                        .layout
                        .columns
                        .iter()
                        .filter(|(c, _)| !keys.contains(c))
                        .map(|(c, _)| format!("{0} = EXCLUDED.{0}", quote_ident(c)))
                        .collect();
                    let action = if updates.is_empty() {
                        "NOTHING".to_owned()
                    } else {
                        format!("UPDATE SET {}", updates.join(", "))
                    };
                    let insert = format!(
                        "INSERT INTO {table} ({columns}) SELECT DISTINCT ON ({key_list}) {columns} FROM {stage} ORDER \
                         BY {key_list}, ctid DESC ON CONFLICT ({key_list}) DO {action}"
                    );
                    frontend::query(&insert, buf)?;
                    steps.push((Step::Part(b.id), format!("INSERT … ON CONFLICT of batch {}", b.name)));
                    frontend::query("COMMIT", buf)?;
                    steps.push((Step::End(b.id), format!("COMMIT of batch {}", b.name)));
                }
                Delivery::AtLeastOnce => {}
            }
            Ok(())
        });
        for (step, what) in steps {
            self.expect.push_back(Expect { step, sent: now, what });
        }
        b.state = State::Wire;
        b.error = None;
        b.retry_at = None;
        self.config.stats.batches_sent.fetch_add(1, Ordering::Relaxed);
    }

    // ---- batches ----

    /// Keep the buffer of a batch the server has, for a later batch (as many as can hold
    /// rows at once; the rest are freed).
    fn recycle(&mut self, mut data: BytesMut) {
        // Only a buffer of the size the budget counts: one a large row grew is freed.
        let size = self.config.batch_bytes..=self.config.batch_bytes + 64 * 1024;
        if size.contains(&data.capacity()) && self.spare.len() <= self.config.max_in_flight {
            data.clear();
            self.spare.push(data);
        }
    }

    /// Add the rows taken since the last time to `stats.rows`.
    fn publish_rows(&mut self) {
        let new = self.written - self.rows_published;
        if new > 0 {
            self.config.stats.rows.fetch_add(new, Ordering::Relaxed);
            self.rows_published = self.written;
        }
    }

    /// Turn the rows being filled into a batch.
    fn seal(&mut self) {
        self.publish_rows();
        if self.filling_rows == 0 {
            return;
        }
        let layout = self.layout.clone().expect("rows were encoded with a plan");
        let next = self.spare.pop().unwrap_or_else(|| batch_buffer(self.config.batch_bytes));
        let data = std::mem::replace(&mut self.filling, next);
        let id = self.next_id;
        self.next_id += 1;
        let name = format!("{}{}/{}", self.gid_base, self.epoch, self.seq);
        self.seq += 1;
        self.batches.push_back(Batch {
            id,
            name,
            closed_by: None,
            epoch: self.epoch,
            rows: self.filling_rows,
            data,
            layout,
            first: self.filling_first,
            sealed: Instant::now(),
            state: State::Queued,
            failures: 0,
            failing_since: None,
            retry_at: None,
            error: None,
            again: false,
            maybe_prepared: false,
        });
        self.filling_rows = 0;
    }

    /// Wait (bounded, named, stop-aware) until at most `max_in_flight` batches hold rows.
    ///
    /// While a checkpoint's barrier is on its way the sink takes records instead, up to twice
    /// `max_in_flight` batches, so that the barrier reaches it and passes at once (what it holds
    /// goes into the checkpoint). Past that bound it declines the checkpoint (the coordinator
    /// fails it now, naming the server) and waits on; a stop ends the wait at once (what it held
    /// is replayed from the last checkpoint).
    fn wait_for_room(&mut self) -> Result<(), Halt> {
        let max = self.config.max_in_flight;
        if self.held() <= max {
            return Ok(());
        }
        let waited = Instant::now();
        let wait = self.config.stats.blocked.start();
        let result = loop {
            if let Err(h) = self.drive(Some(Duration::from_millis(100)), true) {
                break Err(h);
            }
            if self.held() <= max {
                break Ok(());
            }
            if outside::stop_requested() {
                break Err(Halt::Stopped);
            }
            // Batches queued behind this subtask's share of prepared transactions wait for a
            // checkpoint to commit some: that checkpoint's barrier is behind the records this
            // wait holds back, so take them (no more than the pipeline holds before the
            // barrier) and never decline for it, or no checkpoint would ever complete. Not
            // while the server is away: nothing is on the wire then, yet nothing commits
            // either, so past the second bound the checkpoint is declined and memory stays
            // bounded however long the outage lasts.
            let on_server = self.batches.iter().filter(|b| b.state == State::Wire).count();
            let held = self.held();
            let commits_pending = self.connected() && on_server < max;
            if outside::take_for_barrier(held <= 2 * max || commits_pending, || {
                format!(
                    "postgres sink {}: {held} batches not yet durable on {} after {} (max_in_flight {max})",
                    self.name,
                    self.server,
                    crate::util::duration_text(waited.elapsed())
                )
            }) {
                break Ok(());
            }
            self.name_the_wait();
        };
        self.config.stats.blocked.stop(wait);
        result
    }

    /// Say what the sink waits on (weir-stat, a checkpoint's expiry reason).
    fn name_the_wait(&self) {
        let server = &self.server;
        if !self.connected() {
            let (since, last) = (self.down_since, &self.last_failure);
            waiting_on(|| {
                format!(
                    "postgres {server}: reconnecting ({:.1} s without a connection; last: {last})",
                    since.map_or(0.0, |s| s.elapsed().as_secs_f64())
                )
            });
        } else if let Some(front) = self.expect.front() {
            let held = self.held();
            waiting_on(|| {
                format!(
                    "postgres {server}: {held} batches in flight; waiting {:.1} s for {}",
                    front.sent.elapsed().as_secs_f64(),
                    front.what
                )
            });
        }
    }

    /// Connect at once if not connected (the first record needs the table's columns):
    /// bounded by `retry_for`.
    fn ensure_connected(&mut self) -> Result<(), Halt> {
        while !self.connected() {
            self.check()?;
            if outside::stop_requested() {
                return Err(Halt::Stopped);
            }
            let wait = self.next_connect.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                self.name_the_wait();
                std::thread::sleep(wait.min(Duration::from_millis(100)));
                continue;
            }
            self.pipe = None;
            self.connect()?;
        }
        Ok(())
    }

    /// The first record: learn the table, match the record's fields to its columns.
    #[cold]
    fn first_record(&mut self, record: &T) -> Result<(), Halt>
    where
        T: serde::Serialize + Record,
    {
        let shape = match super::encode::shape(record) {
            Ok(s) => s,
            Err(e) => {
                return Err(
                    self.fail(Problem::config("columns", format!("the records cannot be read field by field: {e}")))
                );
            }
        };
        self.ensure_connected()?;
        let table = self.table.clone().expect("read at the first connection");
        let plan = Plan::new(
            &shape,
            &table.columns,
            &self.config.columns,
            self.config.json_column.as_deref(),
            &self.config.table,
        );
        match plan {
            Ok(plan) => {
                if self.config.delivery == Delivery::Upsert {
                    for k in &table.keys {
                        if !plan.layout.columns.iter().any(|(c, _)| c == k) {
                            return Err(self.fail(Problem::config(
                                "key_columns",
                                format!("key column `{k}` gets no field of the records; map one to it in columns"),
                            )));
                        }
                    }
                }
                tracing::info!(
                    sink = %self.name,
                    server = %self.server,
                    "writing into {} ({}), {}",
                    self.config.table,
                    plan.layout.column_list(),
                    self.config.delivery.name()
                );
                self.layout = Some(Arc::new(plan.layout.clone()));
                // The fast path reads the fields' bytes; a type whose Serialize writes
                // something else (serialize_with, a skipped field) must not take it: it is
                // kept only if the first row comes out the same both ways.
                let fixed = if T::FIXED_SIZE { FixedPlan::new(&plan, &shape, &T::schema()) } else { None };
                self.fixed = fixed.filter(|fixed| {
                    let (mut fast, mut slow) = (BytesMut::new(), BytesMut::new());
                    fixed.encode(record, &mut fast).is_ok() && plan.encode(record, &mut slow).is_ok() && fast == slow
                });
                self.plan = Some(plan);
                Ok(())
            }
            Err(p) => Err(self.fail(p)),
        }
    }

    /// Nothing held, sent or waiting for a commit.
    fn settled(&self) -> bool {
        self.filling_rows == 0 && self.batches.is_empty() && self.expect.is_empty()
    }

    /// Wait (bounded by the retry settings) until every batch is committed.
    fn drain(&mut self) -> Result<(), Halt> {
        self.seal();
        if self.recovery.is_some() && self.settled() {
            // Nothing written this run: still settle what an earlier run left prepared.
            self.ensure_connected()?;
        }
        if self.completed.is_none() || self.batches.iter().any(|b| b.closed_by.is_none()) {
            // No checkpoint will close them: the end of input does.
            for b in &mut self.batches {
                b.closed_by.get_or_insert(u64::MAX);
            }
            self.completed = Some(u64::MAX);
        }
        while !self.settled() {
            self.drive(Some(Duration::from_millis(100)), true)?;
            if outside::stop_requested() {
                return Err(Halt::Stopped);
            }
            if !self.settled() {
                self.name_the_wait();
            }
        }
        waiting_over();
        self.sync_dead_letters()
    }

    /// Wait (bounded by the retry settings, stop-aware) until no batch holds rows the server
    /// does not have durably (prepared; with the other deliveries, committed); the end of
    /// input's snapshot, which then holds no rows. (The end of input waits for every commit
    /// anyway: waiting here first costs nothing, and the final checkpoint stays small.)
    fn make_all_durable(&mut self) -> Result<(), Halt> {
        while self.held() > 0 {
            self.drive(Some(Duration::from_millis(100)), true)?;
            if outside::stop_requested() {
                return Err(Halt::Stopped);
            }
            if self.held() > 0 {
                self.name_the_wait();
            }
        }
        waiting_over();
        Ok(())
    }

    // ---- checkpoints ----

    /// A checkpoint's first step: an earlier part not put yet is put now, the open batch is
    /// sealed (the barrier ends it), batch names start again under the checkpoint's epoch,
    /// and what can start without waiting starts (the final checkpoint: every batch prepared).
    fn begin_snapshot(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        self.check()?;
        self.settle_late(true)?;
        self.seal();
        self.epoch = checkpoint_id;
        self.seq = 0;
        if checkpoint_id == crate::checkpoint::FINAL {
            // The end of input: no later checkpoint will name what is pending prepared, and
            // a job restored from the final one does not replay, so everything is made
            // durable now: prepared, or committed (no barrier is held up: the input ended).
            self.make_all_durable()
        } else {
            // Start what can start without waiting (no connection attempt).
            self.drive(None, false)
        }
    }

    /// Whether checkpoint `id`'s part, waiting for the batches sealed before its barrier
    /// (those of an earlier epoch), may soon name them all:
    /// one is not prepared yet, and each such one is on the wire or about to be (connected,
    /// none failing, none held back by the share of prepared transactions — those wait for
    /// a checkpoint to complete, which waits for this part).
    fn worth_waiting(&self, id: u64) -> bool {
        if !self.connected() {
            return false;
        }
        let mut open = self.batches.iter().filter(|b| b.state != State::Queued).count();
        let cap = self.prepared_cap();
        let mut unsent = false;
        for b in self.batches.iter().filter(|b| b.epoch < id) {
            match b.state {
                State::Prepared | State::Committing => {}
                State::Wire if b.error.is_none() => unsent = true,
                State::Queued
                    if b.retry_at.is_none() && (self.config.delivery != Delivery::ExactlyOnce || open < cap) =>
                {
                    open += 1;
                    unsent = true;
                }
                _ => return false,
            }
        }
        unsent
    }

    /// Put the late part when its batches are all on the server, or at once with `force`
    /// (a later checkpoint, the end of input), or when waiting is no longer worth it (past
    /// `checkpoint_wait`, the connection lost, a batch failed).
    fn settle_late(&mut self, force: bool) -> Result<(), Halt> {
        let Some(late) = &self.late else { return Ok(()) };
        if !force && Instant::now() < late.deadline && self.worth_waiting(late.part.checkpoint_id()) {
            return Ok(());
        }
        let late = self.late.take().expect("a late part");
        self.put_part(late)
    }

    fn put_part(&mut self, late: Late) -> Result<(), Halt> {
        let bytes = self.part_bytes(late.part.checkpoint_id())?;
        late.part.put(&bytes);
        Ok(())
    }

    /// Checkpoint `checkpoint_id`'s bytes, of the batches sealed before its barrier:
    /// prepared transactions by name (their commit is by name), rows not yet known prepared
    /// whole.
    fn part_bytes(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        // A batch is closed by the first checkpoint that holds it as prepared, never by one
        // that holds its rows: a restore of that one sends the rows again unless it finds the
        // name prepared, so the name must not have been committed in between.
        for b in self.batches.iter_mut().filter(|b| b.epoch < checkpoint_id) {
            if matches!(b.state, State::Prepared | State::Committing) {
                b.closed_by.get_or_insert(checkpoint_id);
            }
        }
        // Rows rejected into the dead-letter file are durable before the checkpoint that no
        // longer holds them.
        self.sync_dead_letters()?;
        let mut layouts: Vec<Layout> = Vec::new();
        let mut saved = Saved {
            version: SAVED_VERSION,
            prefix: self.gid_base.clone(),
            prepared: Vec::new(),
            pending: Vec::new(),
            layouts: Vec::new(),
        };
        let mut size = 1024;
        for b in self.batches.iter().filter(|b| b.epoch < checkpoint_id) {
            size += b.name.len() + 16;
            match b.state {
                State::Prepared | State::Committing => saved.prepared.push(b.name.clone()),
                State::Queued | State::Wire => {
                    let layout = match layouts.iter().position(|l| *l == *b.layout) {
                        Some(i) => i,
                        None => {
                            layouts.push((*b.layout).clone());
                            layouts.len() - 1
                        }
                    };
                    size += b.data.len();
                    self.config.stats.checkpoint_rows.fetch_add(u64::from(b.rows), Ordering::Relaxed);
                    saved.pending.push(SavedBatch {
                        name: b.name.clone(),
                        rows: b.rows,
                        layout: layout as u32,
                        data: std::borrow::Cow::Borrowed(&b.data[..]),
                    });
                }
            }
        }
        saved.layouts = layouts;
        // Into a buffer of the size it needs (growing one by doubling copies the rows again).
        Ok(postcard::to_io(&saved, Vec::with_capacity(size)).expect("sink state serializes"))
    }

    fn sync_dead_letters(&mut self) -> Result<(), Halt> {
        if let Some(f) = &self.dead_letter
            && let Err(e) = f.sync_all()
        {
            let path = self.config.dead_letter.clone().unwrap_or_default();
            return Err(self.fail(Problem::failed(format!(
                "cannot fsync the dead-letter file {}: {}",
                path.display(),
                crate::util::io_error_text(&e)
            ))));
        }
        Ok(())
    }

    /// Take what a checkpoint of one or more old subtasks holds (their `prefixes` are this
    /// subtask's to settle).
    fn restore_saved(&mut self, id: u64, parts: &[&[u8]], prefixes: Vec<String>) -> Result<(), Halt> {
        self.completed = Some(id);
        self.epoch = id;
        self.seq = 0;
        for bytes in parts.iter().filter(|b| !b.is_empty()) {
            let saved: Saved = match postcard::from_bytes(bytes) {
                Ok(s) => s,
                Err(e) => {
                    return Err(self.fail(Problem::failed(format!("checkpoint {id}: unreadable sink state: {e}"))));
                }
            };
            if saved.version != SAVED_VERSION {
                return Err(self.fail(Problem::failed(format!(
                    "checkpoint {id}: sink state of version {}, this build reads {SAVED_VERSION}",
                    saved.version
                ))));
            }
            let layouts: Vec<Arc<Layout>> = saved.layouts.into_iter().map(Arc::new).collect();
            let empty = Arc::new(Layout { columns: Vec::new() });
            let mut entries: Vec<(String, u32, BytesMut, Arc<Layout>, State)> = saved
                .prepared
                .into_iter()
                .map(|name| (name, 0, BytesMut::new(), empty.clone(), State::Prepared))
                .collect();
            for p in saved.pending {
                let Some(layout) = layouts.get(p.layout as usize).cloned() else {
                    return Err(self.fail(Problem::failed(format!("checkpoint {id}: a batch names a missing layout"))));
                };
                entries.push((p.name, p.rows, BytesMut::from(&p.data[..]), layout, State::Queued));
            }
            let now = Instant::now();
            for (name, rows, data, layout, state) in entries {
                let bid = self.next_id;
                self.next_id += 1;
                // A prepared one is closed by the checkpoint being restored, which is
                // complete: committed at once. One whose rows the checkpoint holds is closed
                // by the next checkpoint that holds it prepared (committing it sooner would
                // let a second restore of this checkpoint send it again).
                self.batches.push_back(Batch {
                    id: bid,
                    name,
                    closed_by: (state == State::Prepared).then_some(id),
                    epoch: id,
                    rows,
                    data,
                    layout,
                    first: 0,
                    sealed: now,
                    state,
                    failures: 0,
                    failing_since: None,
                    retry_at: None,
                    error: None,
                    again: false,
                    maybe_prepared: state == State::Queued,
                });
            }
        }
        self.recovery = Some(Recovery { prefixes, roll_back_unknown: true });
        self.publish_in_flight();
        Ok(())
    }
}

impl<T: serde::Serialize + Record> Sink<T> for PostgresSink<T> {
    fn write(&mut self, record: &T) -> Result<(), Halt> {
        self.check()?;
        if self.plan.is_none() {
            self.first_record(record)?;
        }
        if self.filling_rows == 0 {
            self.filling_first = self.written;
            self.filling_since = Instant::now();
        }
        self.written += 1;
        let fast = self.fixed.as_ref().is_some_and(|f| f.encode(record, &mut self.filling).is_ok());
        let plan = self.plan.as_ref().expect("made at the first record");
        match if fast { Ok(()) } else { plan.encode(record, &mut self.filling) } {
            Ok(()) => self.filling_rows += 1,
            Err(why) => {
                let row = serde_json::to_value(record).unwrap_or(serde_json::Value::Null);
                self.reject_row(row, &why.to_string(), "", "(not sent)")?;
            }
        }
        if self.filling_rows as usize >= self.config.batch_rows || self.filling.len() >= self.config.batch_bytes {
            self.seal();
            self.drive(None, true)?;
            return self.wait_for_room();
        }
        if self.written.is_multiple_of(64) {
            self.publish_rows();
            // Answers that arrived free batches early (a look at the completion queue, no
            // system call).
            if self.ring.as_ref().is_some_and(|r| r.in_kernel() > 0) {
                self.reap()?;
                // The answers may complete a checkpoint's part waiting for them.
                self.settle_late(false)?;
            }
        }
        Ok(())
    }

    /// Processing time: send a batch past `batch_time`, reconnect when due, handle answers.
    fn poll_timers(&mut self) -> Result<Option<Duration>, Halt> {
        self.publish_rows();
        self.settle_late(false)?;
        if self.dormant || (self.settled() && self.recovery.is_none()) {
            return Ok(None);
        }
        if self.recovery.is_some() && self.settled() && self.plan.is_none() {
            // Nothing to send yet: the earlier run's transactions are settled with the
            // first record's connection.
            return Ok(None);
        }
        self.drive(None, true)?;
        let mut next = Duration::from_millis(10);
        if self.filling_rows > 0 && self.config.delivery != Delivery::ExactlyOnce {
            next = next.min(self.config.batch_time.saturating_sub(self.filling_since.elapsed()));
        }
        Ok(Some(next))
    }

    /// Rows settled (committed, or dead-lettered) as a prefix of what this subtask wrote.
    fn acknowledged(&self) -> Option<u64> {
        let filling = (self.filling_rows > 0).then_some(self.filling_first);
        let held = self.batches.iter().map(|b| b.first);
        Some(held.chain(filling).fold(self.written, u64::min))
    }

    /// End of input: every row committed, the connection closed.
    fn finish(&mut self) -> Result<(), Halt> {
        self.check()?;
        if self.dormant {
            return Ok(());
        }
        self.drain()?;
        if let Some(mut pipe) = self.pipe.take() {
            pipe.queue_with(|b| {
                frontend::terminate(b);
                Ok(())
            });
            if let Some(ring) = self.ring.as_mut() {
                let _ = pipe.pump(ring).and_then(|()| ring.submit());
            }
        }
        Ok(())
    }

    /// Checkpoint `checkpoint_id` at once (the final one; `snapshot_later` for the others):
    /// what `begin_snapshot` leaves, every batch's rows that are not prepared held whole.
    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, Halt> {
        self.begin_snapshot(checkpoint_id)?;
        self.part_bytes(checkpoint_id)
    }

    /// Checkpoint `part`'s id: the open batch is sealed and the barrier passes at once —
    /// nothing here waits on the server. The part is put once the server has every batch
    /// sealed before the barrier (prepared, or committed): then it names them and holds no
    /// rows. At once when they are all there already, when there is no connection, or with
    /// `checkpoint_wait` 0; past `checkpoint_wait`, or when the connection is lost or a batch
    /// fails, it holds the rows of those the server does not have (see `settle_late`).
    fn snapshot_later(&mut self, part: crate::operators::LatePart) -> Result<(), Halt> {
        let id = part.checkpoint_id();
        self.begin_snapshot(id)?;
        let late = Late { part, deadline: Instant::now() + self.config.checkpoint_wait };
        if self.config.checkpoint_wait.is_zero() || !self.worth_waiting(id) {
            return self.put_part(late);
        }
        self.late = Some(late);
        Ok(())
    }

    /// Restore checkpoint `id`: what it prepared is committed, what it held is sent again
    /// under the same names, and every other prepared transaction of this subtask (written
    /// after the checkpoint) is rolled back — at the first connection, before anything new.
    fn restore(&mut self, from: Option<(u64, &[u8])>) -> Result<(), Halt> {
        if self.dormant {
            self.recovery = None;
            return Ok(());
        }
        match from {
            None => Ok(()),
            Some((id, bytes)) => {
                let prefixes = vec![self.gid_base.clone()];
                self.restore_saved(id, &[bytes], prefixes)
            }
        }
    }

    /// At another parallelism: old subtask `k` goes to new subtask `k % parallelism`, which
    /// settles its transactions by name as its own.
    fn restore_rescaled(&mut self, from: &crate::operators::Rescaled) -> Result<(), Halt> {
        if self.dormant {
            self.recovery = None;
            return Ok(());
        }
        let p = from.parallelism.max(1);
        let mut prefixes: Vec<String> = (0..from.from_parallelism)
            .filter(|k| k % p == from.index)
            .map(|k| format!("{}{k}/", self.node_base))
            .collect();
        if !prefixes.contains(&self.gid_base) {
            prefixes.push(self.gid_base.clone());
        }
        let parts: Vec<&[u8]> = from.split().map(|(_, b)| b.as_slice()).collect();
        self.restore_saved(from.checkpoint_id, &parts, prefixes)
    }

    /// Checkpoint `checkpoint_id` is durable: the transactions it closed are committed by
    /// name (queued on the connection; nothing waits here).
    fn checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), Halt> {
        self.check()?;
        self.completed = Some(self.completed.map_or(checkpoint_id, |c| c.max(checkpoint_id)));
        self.drive(None, false)
    }
}

impl<T> Drop for PostgresSink<T> {
    fn drop(&mut self) {
        self.pipe = None;
        let held = self.published_in_flight;
        self.config.stats.in_flight.fetch_sub(held, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's rows in a checkpoint are written as bytes, which postcard encodes as it did
    /// the sequence of numbers before (a length, then the bytes): a checkpoint of either
    /// reads back as the other.
    #[test]
    fn saved_rows_read_back_across_the_encodings() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Before {
            name: String,
            rows: u32,
            layout: u32,
            data: Vec<u8>,
        }
        let data: Vec<u8> = (0..=255).chain(0..44).collect();
        let before = Before { name: "weir/db/0/7/1".into(), rows: 3, layout: 0, data: data.clone() };
        let now = SavedBatch { name: before.name.clone(), rows: 3, layout: 0, data: std::borrow::Cow::Borrowed(&data) };
        let (old_bytes, new_bytes) = (postcard::to_stdvec(&before).unwrap(), postcard::to_stdvec(&now).unwrap());
        assert_eq!(old_bytes, new_bytes);
        let read: SavedBatch = postcard::from_bytes(&old_bytes).unwrap();
        assert_eq!((read.name, read.rows, read.data), (now.name, now.rows, now.data));
        assert_eq!(postcard::from_bytes::<Before>(&new_bytes).unwrap(), before);
    }
}
