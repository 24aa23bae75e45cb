//! A PostgreSQL sink's job-file section (`type = "postgres"`): every key it takes, checked
//! where it is.

use super::config::{Delivery, OnBadRecord, PostgresSinkConfig};
use crate::util::section::{Affects, JobFileError, Key, KeyType as T, REQUIRED, Section, UNSET};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

impl PostgresSinkConfig {
    /// The keys of a PostgreSQL sink's section.
    pub const KEYS: &'static [Key] = &[
        Key::new("connection", T::String, REQUIRED, "The server: a URI (`postgresql://user@host:5432/db?sslmode=verify-full&sslrootcert=ca.pem`) or libpq's `key=value` pairs; TCP only.")
            .affects(Affects::Security),
        Key::new("password_file", T::String, UNSET, "A file whose first line is the password, when the connection string has none (else `passfile`, libpq's `.pgpass`).")
            .affects(Affects::Security),
        Key::new("table", T::String, REQUIRED, "The table rows go into, optionally schema-qualified (`public.clicks`), written as given."),
        Key::new("columns", T::Table, "every field named as a column", "Record field (dotted for nested fields: `left.key`) → column."),
        Key::new("json_column", T::String, UNSET, "A column (json, jsonb or text) that takes the whole record as JSON."),
        Key::new("delivery", T::String, "exactly_once", "`exactly_once` (a prepared transaction per batch, committed when its checkpoint completes; needs `checkpoint_dir`), `upsert` (`INSERT … ON CONFLICT DO UPDATE`: each key ends as once) or `at_least_once` (a COPY per batch).")
            .affects(Affects::Delivery),
        Key::new("key_columns", T::Strings, "the table's primary key", "`upsert`: the conflict target.").affects(Affects::Delivery),
        Key::new("batch_rows", T::Integer, "10000", "Rows per batch (one COPY), at most."),
        Key::new("batch_bytes", T::Integer, "1048576", "Bytes of encoded rows per batch, at most: 1024 to 1 GiB.").affects(Affects::Memory),
        Key::new("batch_ms", T::Integer, "200", "A batch with rows is sent after this long even when not full.").affects(Affects::Latency),
        Key::new("max_in_flight", T::Integer, "4", "Batches sent and not yet known durable, 1 to 64: more makes the sink wait (backpressure).")
            .affects(Affects::Memory),
        Key::new("on_bad_record", T::String, "dead_letter with a dead letter, else fail", "A row the server rejects (a constraint, a value out of range): `dead_letter` (with the server's message; the rest of its batch is written) or `fail` the job.")
            .affects(Affects::Failures),
        Key::new("dead_letter", T::String, UNSET, "A file (JSON lines) for rejected rows, with the server's message.").affects(Affects::Failures),
        Key::new("max_retries", T::Integer, "8", "Attempts before the job fails, at least (and for at least `retry_for_ms`).").affects(Affects::Failures),
        Key::new("retry_for_ms", T::Integer, "60000", "How long the server may be unreachable, or keep failing a batch, before the job fails, at least.")
            .affects(Affects::Failures),
        Key::new("request_timeout_ms", T::Integer, "60000", "A statement not answered by then counts the connection as hung: it is closed and what it carried is sent again.")
            .affects(Affects::Failures),
        Key::new("connect_timeout_ms", T::Integer, "10000", "One connection attempt (startup, TLS, authentication, the table's columns), at most.")
            .affects(Affects::Failures),
        Key::new("lock_timeout_ms", T::Integer, "10000", "The session's `lock_timeout`: how long a batch may wait for a row lock before it fails and is sent again.")
            .affects(Affects::Failures),
        Key::new("checkpoint_wait_ms", T::Integer, "500", "How long a checkpoint's part may wait (the records after its barrier flowing on) for the batches before the barrier to reach the server, so that it names them instead of holding their rows; past it, the rows go into the checkpoint. 0: always the rows.")
            .affects(Affects::Recovery),
        Key::new("transaction_prefix", T::String, "the job's name", "The start of every prepared transaction's name; two jobs writing to one server need different ones.")
            .affects(Affects::Delivery),
    ];

    /// Read a PostgreSQL sink's section; transaction names start with `job_name` unless
    /// `transaction_prefix` says otherwise.
    pub fn from_section(s: &mut Section, job_name: &str) -> Result<PostgresSinkConfig, JobFileError> {
        let connection = s.required::<String>(
            "connection",
            "the server, e.g. \"postgresql://weir@127.0.0.1:5432/clicks?sslmode=verify-full&sslrootcert=ca.pem\" or \
             \"host=127.0.0.1 dbname=clicks user=weir\"",
        )?;
        let table = s.required::<String>("table", "the table rows go into, e.g. \"public.clicks\"")?;
        let mut config = PostgresSinkConfig::new(connection.get_ref(), table.get_ref().clone())
            .map_err(|e| s.err(connection.span(), "connection", e.to_string()))?;
        config.transaction_prefix = job_name.to_owned();
        if let Some(p) = s.take::<String>("password_file")? {
            if config.connection.password.is_some() {
                return Err(s.err(p.span(), "password_file", "the connection string has a password already; give one"));
            }
            config.password_file = Some(PathBuf::from(p.get_ref()));
        }
        if let Some(c) = s.take::<BTreeMap<String, String>>("columns")? {
            if c.get_ref().is_empty() {
                return Err(s.err(
                    c.span(),
                    "columns",
                    "an empty mapping; name field = \"column\" pairs, or remove it",
                ));
            }
            config.columns = c.into_inner().into_iter().collect();
        }
        if let Some(j) = s.take::<String>("json_column")? {
            config.json_column = Some(j.into_inner());
        }
        let delivery = s.take::<String>("delivery")?;
        if let Some(d) = &delivery {
            config.delivery = Delivery::from_name(d.get_ref()).ok_or_else(|| {
                s.err(
                    d.span(),
                    "delivery",
                    format!("unknown delivery `{}`; use exactly_once, upsert or at_least_once", d.get_ref()),
                )
            })?;
        }
        if let Some(k) = s.take::<Vec<String>>("key_columns")? {
            if config.delivery != Delivery::Upsert {
                return Err(s.err(k.span(), "key_columns", "key_columns is for delivery = \"upsert\""));
            }
            if k.get_ref().is_empty() {
                return Err(s.err(k.span(), "key_columns", "an empty list; name the conflict target's columns"));
            }
            config.key_columns = k.into_inner();
        }
        if let Some(b) = s.take::<u64>("batch_rows")? {
            if !(1..=1_000_000).contains(b.get_ref()) {
                return Err(s.err(b.span(), "batch_rows", "use 1 to 1000000 rows per batch"));
            }
            config.batch_rows = *b.get_ref() as usize;
        }
        if let Some(b) = s.take::<u64>("batch_bytes")? {
            if !(1024..=256 << 20).contains(b.get_ref()) {
                return Err(s.err(b.span(), "batch_bytes", "use 1 KiB to 256 MiB per batch"));
            }
            config.batch_bytes = *b.get_ref() as usize;
        }
        if let Some(t) = s.take::<u64>("batch_ms")? {
            if *t.get_ref() == 0 {
                return Err(s.err(t.span(), "batch_ms", "0 ms; give batches time to fill (1 or more)"));
            }
            config.batch_time = Duration::from_millis(*t.get_ref());
        }
        if let Some(m) = s.take::<u64>("max_in_flight")? {
            if !(1..=64).contains(m.get_ref()) {
                return Err(s.err(m.span(), "max_in_flight", "use 1 to 64 batches in flight"));
            }
            config.max_in_flight = *m.get_ref() as usize;
        }
        let on_bad = s.take::<String>("on_bad_record")?;
        if let Some(o) = &on_bad {
            config.on_bad_record = match o.get_ref().as_str() {
                "dead_letter" => OnBadRecord::DeadLetter,
                "fail" => OnBadRecord::Fail,
                other => {
                    return Err(s.err(
                        o.span(),
                        "on_bad_record",
                        format!("unknown on_bad_record `{other}`; use dead_letter or fail (a row is never dropped)"),
                    ));
                }
            };
        }
        if let Some(p) = s.take::<String>("dead_letter")? {
            if p.get_ref().trim().is_empty() {
                return Err(s.err(p.span(), "dead_letter", "an empty path; name a file, or remove the setting"));
            }
            config.dead_letter = Some(PathBuf::from(p.get_ref()));
        }
        if let Some(o) = &on_bad
            && config.on_bad_record == OnBadRecord::DeadLetter
            && config.dead_letter.is_none()
        {
            return Err(s.err(o.span(), "on_bad_record", "on_bad_record = \"dead_letter\" needs a dead_letter file"));
        }
        if let Some(r) = s.take::<u32>("max_retries")? {
            config.max_retries = *r.get_ref();
        }
        for (key, field) in [
            ("retry_for_ms", &mut config.retry_for),
            ("request_timeout_ms", &mut config.request_timeout),
            ("connect_timeout_ms", &mut config.connect_timeout),
            ("lock_timeout_ms", &mut config.lock_timeout),
        ] {
            if let Some(t) = s.take::<u64>(key)? {
                if *t.get_ref() == 0 && key != "retry_for_ms" {
                    return Err(s.err(t.span(), key, "a timeout of 0; give the server time"));
                }
                *field = Duration::from_millis(*t.get_ref());
            }
        }
        if let Some(t) = s.take::<u64>("checkpoint_wait_ms")? {
            config.checkpoint_wait = Duration::from_millis(*t.get_ref());
        }
        if let Some(p) = s.take::<String>("transaction_prefix")? {
            config.transaction_prefix = p.get_ref().clone();
        }
        if let Err(p) = config.validate() {
            let setting = p.setting.clone().unwrap_or_else(|| "table".into());
            let key = setting.split('.').next().unwrap_or("table").to_owned();
            let span = s.span_of(&key).unwrap_or_else(|| table.span());
            return Err(s.err(span, &key, p.reason));
        }
        Ok(config)
    }
}
