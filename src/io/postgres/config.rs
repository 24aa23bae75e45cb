//! A PostgreSQL sink's settings, and the connection string in both of libpq's forms
//! (`postgresql://user@host:port/db?sslmode=verify-full` and `host=... port=... dbname=...`).

use super::error::Problem;
use crate::io::Backoff;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How much a sink promises about its rows (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// One prepared transaction per batch, committed by name when the checkpoint that holds
    /// it completes: every row once, whatever fails.
    #[default]
    ExactlyOnce,
    /// `INSERT … ON CONFLICT (key) DO UPDATE` in a transaction per batch, batches cut at
    /// every barrier: a replay writes the same values again, so each key ends as once.
    Upsert,
    /// A COPY per batch, committed at once: a replay after a crash writes its rows again.
    AtLeastOnce,
}

impl Delivery {
    /// Parse a job-file name: `exactly_once`, `upsert`, `at_least_once`.
    pub fn from_name(name: &str) -> Option<Delivery> {
        match name {
            "exactly_once" => Some(Delivery::ExactlyOnce),
            "upsert" => Some(Delivery::Upsert),
            "at_least_once" => Some(Delivery::AtLeastOnce),
            _ => None,
        }
    }

    /// The job-file name.
    pub fn name(self) -> &'static str {
        match self {
            Delivery::ExactlyOnce => "exactly_once",
            Delivery::Upsert => "upsert",
            Delivery::AtLeastOnce => "at_least_once",
        }
    }
}

/// What happens to a row the server rejects (a constraint, a value out of range).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBadRecord {
    /// It goes to the dead-letter file with the server's message; the rest of its batch is
    /// written. The default when a dead-letter file is given.
    #[default]
    DeadLetter,
    /// The job fails with the server's message.
    Fail,
}

/// How the connection is protected (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// Plain TCP (weir does not fall back to TLS: use `prefer` or `require` for that).
    Allow,
    /// TLS if the server offers it, plain otherwise; the certificate is not checked.
    #[default]
    Prefer,
    /// TLS; the certificate is not checked, unless `sslrootcert` is given (then as
    /// `verify-ca`, as libpq does).
    Require,
    /// TLS; the certificate must chain to `sslrootcert` (or the system's roots).
    VerifyCa,
    /// TLS; as `verify-ca`, and the certificate must name the host.
    VerifyFull,
}

impl SslMode {
    fn from_name(name: &str) -> Option<SslMode> {
        match name {
            "disable" => Some(SslMode::Disable),
            "allow" => Some(SslMode::Allow),
            "prefer" => Some(SslMode::Prefer),
            "require" => Some(SslMode::Require),
            "verify-ca" => Some(SslMode::VerifyCa),
            "verify-full" => Some(SslMode::VerifyFull),
            _ => None,
        }
    }
}

/// Where and as whom to connect: the connection string, parsed.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct ConnInfo {
    /// A host name or IP address (no Unix sockets: the sink's io_uring talks TCP).
    pub host: String,
    /// Default 5432.
    pub port: u16,
    /// Default: the user name.
    pub dbname: String,
    /// The role.
    pub user: String,
    /// The password, if the string gives one.
    pub password: Option<String>,
    /// A password file in libpq's `.pgpass` format (`host:port:db:user:password` lines).
    pub passfile: Option<PathBuf>,
    /// TLS.
    pub sslmode: SslMode,
    /// The CA certificates (PEM) the server's must chain to.
    pub sslrootcert: Option<PathBuf>,
    /// One connection attempt, at most (libpq's `connect_timeout`, seconds in the string).
    pub connect_timeout: Option<Duration>,
    /// What `pg_stat_activity` shows (default `weir`).
    pub application_name: Option<String>,
}

impl std::fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnInfo")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("dbname", &self.dbname)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("sslmode", &self.sslmode)
            .finish_non_exhaustive()
    }
}

impl ConnInfo {
    /// Parse a connection string: a URI (`postgresql://` or `postgres://`) or libpq's
    /// `key=value` pairs (values may be single-quoted, `\'` and `\\` escaped).
    pub fn parse(text: &str) -> Result<ConnInfo, ConnInfoError> {
        let value_err = |parameter: &'static str, problem: String| ConnInfoError::Value { parameter, problem };
        let pairs = if let Some(rest) = text.strip_prefix("postgresql://").or_else(|| text.strip_prefix("postgres://"))
        {
            uri_pairs(rest)?
        } else {
            keyword_pairs(text)?
        };
        let mut info = ConnInfo { port: 5432, ..ConnInfo::default() };
        for (key, value) in pairs {
            match key.as_str() {
                "host" | "hostaddr" => {
                    if value.contains(',') {
                        return Err(value_err(
                            "host",
                            format!("several hosts (`{value}`) are not supported; name one"),
                        ));
                    }
                    if value.starts_with('/') {
                        return Err(value_err(
                            "host",
                            format!(
                                "host `{value}` is a Unix socket directory; the sink connects over TCP: give a host \
                                 name or address"
                            ),
                        ));
                    }
                    info.host = value;
                }
                "port" => {
                    info.port = value
                        .parse()
                        .map_err(|_| value_err("port", format!("port `{value}` is not a number 1..65535")))?;
                    if info.port == 0 {
                        return Err(value_err("port", "port 0; give the server's port (5432 by default)".into()));
                    }
                }
                "dbname" => info.dbname = value,
                "user" => info.user = value,
                "password" => info.password = Some(value),
                "passfile" => info.passfile = Some(PathBuf::from(value)),
                "sslmode" => {
                    info.sslmode = SslMode::from_name(&value).ok_or_else(|| {
                        value_err(
                            "sslmode",
                            format!("sslmode `{value}`; use disable, allow, prefer, require, verify-ca or verify-full"),
                        )
                    })?;
                }
                "sslrootcert" => info.sslrootcert = Some(PathBuf::from(value)),
                "connect_timeout" => {
                    let s: u64 = value.parse().map_err(|_| {
                        value_err("connect_timeout", format!("connect_timeout `{value}` is not a number of seconds"))
                    })?;
                    info.connect_timeout = (s > 0).then(|| Duration::from_secs(s.max(2)));
                }
                "application_name" => info.application_name = Some(value),
                other => return Err(ConnInfoError::Unknown { parameter: other.to_owned() }),
            }
        }
        if info.host.is_empty() {
            return Err(ConnInfoError::Missing { parameter: "host" });
        }
        if info.user.is_empty() {
            return Err(ConnInfoError::Missing { parameter: "user" });
        }
        if info.dbname.is_empty() {
            info.dbname = info.user.clone();
        }
        if matches!(info.sslmode, SslMode::Disable | SslMode::Allow) && info.sslrootcert.is_some() {
            return Err(value_err(
                "sslrootcert",
                format!(
                    "sslrootcert is given but sslmode is {}; use sslmode=verify-full to check the server's certificate",
                    if info.sslmode == SslMode::Disable { "disable" } else { "allow" }
                ),
            ));
        }
        Ok(info)
    }

    /// `host:port`.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `host:port/dbname`, as messages name the server.
    pub fn server(&self) -> String {
        format!("{}/{}", self.address(), self.dbname)
    }

    /// The password: the string's own, else `password_file`'s (the whole file, one line),
    /// else the matching line of `passfile`.
    pub(crate) fn resolve_password(&self, password_file: Option<&Path>) -> Result<Option<String>, PasswordError> {
        if let Some(p) = &self.password {
            return Ok(Some(p.clone()));
        }
        if let Some(path) = password_file {
            let text = std::fs::read_to_string(path).map_err(|source| PasswordError::Read {
                what: "password file",
                path: path.to_owned(),
                source,
            })?;
            let line = text.lines().next().unwrap_or("").to_owned();
            if line.is_empty() {
                return Err(PasswordError::Empty { path: path.to_owned() });
            }
            return Ok(Some(line));
        }
        if let Some(path) = &self.passfile {
            let text = std::fs::read_to_string(path).map_err(|source| PasswordError::Read {
                what: "passfile",
                path: path.clone(),
                source,
            })?;
            return Ok(pgpass_lookup(&text, &self.host, self.port, &self.dbname, &self.user));
        }
        Ok(None)
    }
}

/// The pairs of a URI's authority, path and query (percent-decoded).
fn uri_pairs(rest: &str) -> Result<Vec<(String, String)>, ConnInfoError> {
    let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = main.split_once('/').unwrap_or((main, ""));
    let mut pairs = Vec::new();
    let hostport = match authority.rsplit_once('@') {
        Some((userinfo, hostport)) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                pairs.push(("user".into(), percent_decode(user)?));
            }
            if let Some(p) = password {
                pairs.push(("password".into(), percent_decode(p)?));
            }
            hostport
        }
        None => authority,
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) =
            v6.split_once(']').ok_or_else(|| ConnInfoError::Syntax(format!("`{hostport}`: a broken IPv6 literal")))?;
        (h.to_owned(), after.strip_prefix(':').map(str::to_owned))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (percent_decode(h)?, Some(p.to_owned())),
            None => (percent_decode(hostport)?, None),
        }
    };
    if !host.is_empty() {
        pairs.push(("host".into(), host));
    }
    if let Some(p) = port {
        pairs.push(("port".into(), p));
    }
    if !path.is_empty() {
        pairs.push(("dbname".into(), percent_decode(path)?));
    }
    for kv in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| ConnInfoError::Syntax(format!("`{kv}` in the URI's query has no `=value`")))?;
        pairs.push((percent_decode(k)?, percent_decode(v)?));
    }
    Ok(pairs)
}

fn percent_decode(s: &str) -> Result<String, ConnInfoError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .ok_or_else(|| ConnInfoError::Syntax(format!("`{s}`: a `%` without two hex digits")))?;
            out.push(
                u8::from_str_radix(hex, 16)
                    .map_err(|_| ConnInfoError::Syntax(format!("`{s}`: `%{hex}` is not a hex escape")))?,
            );
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ConnInfoError::Syntax(format!("`{s}` decodes to bytes that are not UTF-8")))
}

/// libpq's `key = value` pairs, values bare or single-quoted.
fn keyword_pairs(text: &str) -> Result<Vec<(String, String)>, ConnInfoError> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(ConnInfoError::Syntax(format!(
                "`{key}` has no `=value` (a connection string is `host=... port=... dbname=... user=...` or a \
                 postgresql:// URI)"
            )));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err(ConnInfoError::Syntax(format!("the quoted value of `{key}` is not closed"))),
                    Some('\\') => value.push(
                        chars.next().ok_or_else(|| ConnInfoError::Syntax(format!("`{key}`: a `\\` at the end")))?,
                    ),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// Why a connection string does not parse ([`ConnInfo::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnInfoError {
    /// The string is not a URI or `key=value` pairs: quoting, a percent escape, a broken
    /// IPv6 literal, a pair without `=value`.
    #[error("{0}")]
    Syntax(String),
    /// A parameter's value cannot be used.
    #[error("{problem}")]
    Value {
        /// The parameter (`host`, `port`, `sslmode`, `connect_timeout`, `sslrootcert`).
        parameter: &'static str,
        /// What is wrong, and what to do.
        problem: String,
    },
    /// A parameter this sink does not know.
    #[error(
        "`{parameter}` is not a connection parameter this sink knows; it takes host, port, dbname, user, password, \
         passfile, sslmode, sslrootcert, connect_timeout and application_name"
    )]
    Unknown {
        /// The parameter.
        parameter: String,
    },
    /// A parameter that must be given is not.
    #[error("{}", match *parameter {
        "host" => "no host; give one (host=127.0.0.1, or postgresql://user@host/db)",
        _ => "no user; give the role to connect as (user=..., or postgresql://user@host/db)",
    })]
    Missing {
        /// `host` or `user`.
        parameter: &'static str,
    },
}

/// Why the password could not be read from its file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PasswordError {
    /// The file cannot be read.
    #[error("cannot read the {what} {}: {}", path.display(), crate::util::io_error_text(source))]
    Read { what: &'static str, path: PathBuf, source: std::io::Error },
    /// The password file is empty.
    #[error("the password file {} is empty", path.display())]
    Empty { path: PathBuf },
}

/// The password of the first `.pgpass` line matching the connection (`*` matches anything;
/// `\:` and `\\` escaped).
fn pgpass_lookup(text: &str, host: &str, port: u16, dbname: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = Vec::new();
        let mut field = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => field.extend(chars.next()),
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut field)),
                c => field.push(c),
            }
        }
        fields.push(field);
        if fields.len() != 5 {
            continue;
        }
        let fits = |pattern: &str, value: &str| pattern == "*" || pattern == value;
        if fits(&fields[0], host) && fits(&fields[1], &port) && fits(&fields[2], dbname) && fits(&fields[3], user) {
            return Some(fields[4].clone());
        }
    }
    None
}

/// Settings of a PostgreSQL sink (every subtask has its own connection).
#[derive(Debug, Clone)]
pub struct PostgresSinkConfig {
    /// Where and as whom to connect.
    pub connection: ConnInfo,
    /// A file holding the password (its first line), when the connection string has none.
    pub password_file: Option<PathBuf>,
    /// The table, optionally schema-qualified (`public.clicks`); written as given (quote
    /// mixed-case names yourself: `"Clicks"`).
    pub table: String,
    /// Record field (dotted for nested fields: `left.key`) → column. Empty: every field
    /// whose name is a column of the table (nested fields as `left_key`).
    pub columns: Vec<(String, String)>,
    /// A column that takes the whole record as JSON (json, jsonb or text).
    pub json_column: Option<String>,
    /// The guarantee.
    pub delivery: Delivery,
    /// `upsert`: the conflict target; empty: the table's primary key.
    pub key_columns: Vec<String>,
    /// Rows per batch (one COPY), at most.
    pub batch_rows: usize,
    /// Bytes of encoded rows per batch, at most.
    pub batch_bytes: usize,
    /// A batch that has rows is sent after this long even when not full.
    pub batch_time: Duration,
    /// Batches sent and not yet known durable (prepared, or committed), at most: more makes
    /// `write` wait (backpressure). 1 to 64.
    pub max_in_flight: usize,
    /// A row the server rejects.
    pub on_bad_record: OnBadRecord,
    /// Where rejected rows go, one JSON line each with the server's message.
    pub dead_letter: Option<PathBuf>,
    /// How long the server may be unreachable (or keep failing a batch) before the job fails,
    /// at least; see `max_retries`.
    pub retry_for: Duration,
    /// Attempts before the job fails, at least.
    pub max_retries: u32,
    /// Delays between attempts.
    pub backoff: Backoff,
    /// How long the server may take to answer a statement before the connection counts as
    /// hung (it is closed, and what it carried is sent again on a new one).
    pub request_timeout: Duration,
    /// One connection attempt, at most (startup, TLS, authentication, the table's columns).
    pub connect_timeout: Duration,
    /// The session's `lock_timeout`: how long a batch may wait for a lock (a row another
    /// transaction holds) before it fails and is sent again.
    pub lock_timeout: Duration,
    /// How long a checkpoint's part may wait for the batches sealed before its barrier to
    /// reach the server (prepared, or committed) — the records after the barrier flow on
    /// meanwhile — so that it names them rather than holding their rows. Past it (a slow or
    /// stuck server), or at once when there is no connection, the rows go into the
    /// checkpoint. 0: they always do (the checkpoint never waits on the server).
    pub checkpoint_wait: Duration,
    /// The start of every transaction name (`<prefix>/<node>/<subtask>/<checkpoint>/<n>`):
    /// the job's name by default. Two jobs writing to one server need different ones.
    pub transaction_prefix: String,
    /// Shared totals of every subtask made from this configuration.
    pub stats: Arc<PostgresSinkStats>,
}

impl PostgresSinkConfig {
    /// A sink writing into `table` over `connection` (parsed as [`ConnInfo::parse`]):
    /// exactly once, 10 000 rows or 1 MiB per batch, sent after 200 ms at the latest, 4
    /// batches in flight, retries for 60 s.
    pub fn new(connection: &str, table: impl Into<String>) -> Result<PostgresSinkConfig, ConnInfoError> {
        Ok(PostgresSinkConfig {
            connection: ConnInfo::parse(connection)?,
            password_file: None,
            table: table.into(),
            columns: Vec::new(),
            json_column: None,
            delivery: Delivery::ExactlyOnce,
            key_columns: Vec::new(),
            batch_rows: 10_000,
            batch_bytes: 1 << 20,
            batch_time: Duration::from_millis(200),
            max_in_flight: 4,
            on_bad_record: OnBadRecord::DeadLetter,
            dead_letter: None,
            retry_for: Duration::from_secs(60),
            max_retries: 8,
            backoff: Backoff { min_delay: Duration::from_millis(50), max_delay: Duration::from_secs(2) },
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            lock_timeout: Duration::from_secs(10),
            checkpoint_wait: Duration::from_millis(500),
            transaction_prefix: "weir".into(),
            stats: Arc::default(),
        })
    }

    /// Check what can be checked without connecting: the bounds, the names.
    pub(crate) fn validate(&self) -> Result<(), Problem> {
        if self.table.trim().is_empty() {
            return Err(Problem::config("table", "an empty table name"));
        }
        if !(1..=64).contains(&self.max_in_flight) {
            return Err(Problem::config("max_in_flight", "use 1 to 64 batches in flight"));
        }
        if self.batch_rows == 0 {
            return Err(Problem::config("batch_rows", "a batch needs at least 1 row"));
        }
        if !(1024..=1 << 30).contains(&self.batch_bytes) {
            return Err(Problem::config("batch_bytes", "use 1024 bytes to 1 GiB per batch"));
        }
        if self.on_bad_record == OnBadRecord::DeadLetter && self.dead_letter.is_none() {
            // Without a file there is nowhere to put a bad row: it fails the job instead
            // (never dropped); the section reader refuses `on_bad_record = "dead_letter"`
            // without `dead_letter`.
        }
        if !self.key_columns.is_empty() && self.delivery != Delivery::Upsert {
            return Err(Problem::config("key_columns", "key_columns is for delivery = \"upsert\""));
        }
        let mut columns: Vec<&str> = self.columns.iter().map(|(_, c)| c.as_str()).collect();
        columns.extend(self.json_column.as_deref());
        columns.sort_unstable();
        if let Some(w) = columns.windows(2).find(|w| w[0] == w[1]) {
            return Err(Problem::config("columns", format!("column `{}` is given two fields", w[0])));
        }
        if self.transaction_prefix.is_empty() || self.transaction_prefix.len() > 100 {
            return Err(Problem::config("transaction_prefix", "use 1 to 100 characters"));
        }
        Ok(())
    }

    /// What the sinks made from this configuration publish, for
    /// [`JobConfig::sink_gauges`](crate::graph::JobConfig::sink_gauges).
    pub fn sink_gauge(&self, node: &str) -> crate::telemetry::sinks::SinkGauge {
        let stats = self.stats.clone();
        crate::telemetry::sinks::SinkGauge {
            node: node.to_owned(),
            read: Arc::new(move || crate::telemetry::sinks::SinkReading {
                records: stats.rows.load(Ordering::Relaxed),
                acked: stats.rows_committed.load(Ordering::Relaxed) + stats.dead_letter_rows.load(Ordering::Relaxed),
                in_flight: stats.in_flight.load(Ordering::Relaxed),
                retries: stats.retries.load(Ordering::Relaxed),
                dead_letters: stats.dead_letter_rows.load(Ordering::Relaxed),
                blocked_ns: stats.blocked.total_ns(),
                latency: stats.commit_latency.summary(),
            }),
        }
    }

    /// The memory one subtask holds at most for its batches, for the job's budget: twice
    /// `max_in_flight` (while a barrier is on its way the sink takes records past its bound,
    /// up to twice, so the barrier reaches it), the batch that barrier's snapshot seals, the
    /// one whose seal then starts the wait (or, before it, the one being filled), for the
    /// deliveries that also seal by age one that `batch_ms` sealed meanwhile, the copy a send
    /// lends to the kernel, and the connection's buffer its messages are written into first.
    /// `tests/postgres.rs` holds the server away for dozens of checkpoints under exactly once
    /// and sees at most `2 × max_in_flight + 2` batches.
    pub fn memory_bytes(&self) -> u64 {
        // A batch may pass batch_bytes by one row; rows are small next to a batch.
        (2 * self.max_in_flight as u64 + 5) * (self.batch_bytes as u64 + 64 * 1024)
    }
}

/// Totals of a PostgreSQL sink's subtasks, readable while the job runs.
#[derive(Debug, Default)]
pub struct PostgresSinkStats {
    /// Rows taken by `write`.
    pub rows: AtomicU64,
    /// Rows made visible (committed).
    pub rows_committed: AtomicU64,
    /// Batches sent (attempts, retries included).
    pub batches_sent: AtomicU64,
    /// Transactions prepared (exactly-once).
    pub prepared: AtomicU64,
    /// Transactions committed (`COMMIT PREPARED`, or a plain commit).
    pub committed: AtomicU64,
    /// Prepared transactions of an earlier run rolled back at a restore.
    pub rolled_back: AtomicU64,
    /// Batches sent again (a lost connection, a rejected row taken out, a lock timeout).
    pub retries: AtomicU64,
    /// Connections opened.
    pub connections: AtomicU64,
    /// Rows the server rejected, written to the dead-letter file.
    pub dead_letter_rows: AtomicU64,
    /// Rows the checkpoints held because the server did not have them yet when their part
    /// was put (each checkpoint counts the rows it holds; see `checkpoint_wait`).
    pub checkpoint_rows: AtomicU64,
    /// Batches outstanding now (sent, not yet durable), summed over subtasks.
    pub in_flight: AtomicU64,
    /// Time `write` waited because `max_in_flight` batches were outstanding, the wait in
    /// progress included (so it grows during an outage, not after).
    pub blocked: crate::telemetry::time::Stopwatch,
    /// Batch latency, sealed to committed.
    pub commit_latency: crate::telemetry::sinks::AckLatency,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both forms of the connection string give the same settings.
    #[test]
    fn uri_and_keywords_agree() {
        let a =
            ConnInfo::parse("postgresql://weir:s%40cret@127.0.0.1:5433/clicks?sslmode=verify-full&sslrootcert=ca.pem")
                .unwrap();
        let b = ConnInfo::parse(
            "host=127.0.0.1 port=5433 dbname=clicks user=weir password='s@cret' sslmode=verify-full sslrootcert=ca.pem",
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.password.as_deref(), Some("s@cret"));
        assert_eq!(a.sslmode, SslMode::VerifyFull);
        assert_eq!(a.server(), "127.0.0.1:5433/clicks");
        let c = ConnInfo::parse("postgres://u@[::1]/d").unwrap();
        assert_eq!((c.host.as_str(), c.port, c.address()), ("::1", 5432, "[::1]:5432".to_owned()));
        let d = ConnInfo::parse("host=h user=u password='it\\'s'").unwrap();
        assert_eq!((d.dbname.as_str(), d.password.as_deref()), ("u", Some("it's")));
    }

    /// A bad connection string says what is wrong.
    #[test]
    fn bad_strings_are_named() {
        let e = |s: &str| ConnInfo::parse(s).unwrap_err().to_string();
        assert!(e("host=h user=u sslmode=maybe").contains("sslmode `maybe`"));
        assert!(e("host=h user=u port=x").contains("port `x`"));
        assert!(e("host=h user=u colour=red").contains("`colour` is not a connection parameter"));
        assert!(e("user=u").contains("no host"));
        assert!(e("host=/var/run/postgresql user=u").contains("Unix socket"));
        assert!(e("host=a,b user=u").contains("several hosts"));
        assert!(e("host=h").contains("no user"));
        assert!(e("host=h user=u password='x").contains("not closed"));
        assert!(e("host=h user=u sslmode=disable sslrootcert=ca.pem").contains("verify-full"));
    }

    /// `.pgpass` lines match by host, port, database and user, with wildcards and escapes.
    #[test]
    fn pgpass_lines() {
        let text = "# comment\nother:5432:*:weir:no\n127.0.0.1:*:clicks:weir:pa\\:ss\n*:*:*:*:fallback\n";
        assert_eq!(pgpass_lookup(text, "127.0.0.1", 5433, "clicks", "weir").as_deref(), Some("pa:ss"));
        assert_eq!(pgpass_lookup(text, "h", 1, "d", "u").as_deref(), Some("fallback"));
        assert_eq!(pgpass_lookup("h:1:d:u:p", "h", 2, "d", "u"), None);
    }
}
