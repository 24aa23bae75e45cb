//! An HTTP sink's job-file section (`type = "http"`): every key it takes, checked where it is.

use super::{BodyFormat, HttpSinkConfig};
use crate::io::ClientCert;
use crate::util::section::{Affects, JobFileError, Key, KeyType as T, REQUIRED, Section, UNSET};
use std::path::PathBuf;
use std::time::Duration;

impl HttpSinkConfig {
    /// The keys of an HTTP sink's section.
    pub const KEYS: &'static [Key] = &[
        Key::new("url", T::String, REQUIRED, "Where batches are POSTed: `http://` or `https://` (TLS: the `tls` feature)."),
        Key::new("max_in_flight", T::Integer, "4", "Requests outstanding, 1 to 256: with all of them waiting the sink blocks and stops reading its ring (backpressure).")
            .affects(Affects::Latency),
        Key::new("batch_records", T::Integer, "100", "Records per request body, 1 to 1,000,000."),
        Key::new("body", T::String, "json_lines", "The body: `json_lines` (one JSON record a line) or `json_array`."),
        Key::new("dead_letter", T::String, UNSET, "A file for batches the API refuses (4xx), with the status and its answer; unset, a refusal fails the job.")
            .affects(Affects::Failures),
        Key::new("max_retries", T::Integer, "8", "Retries of a batch after a 5xx, 408, 429, a lost connection or a timeout, with capped backoff (at least this many, and for at least `retry_for_ms`).")
            .affects(Affects::Failures),
        Key::new("retry_for_ms", T::Integer, "120000", "How long a batch is retried at least: an outage this long is ridden out.").affects(Affects::Failures),
        Key::new("request_timeout_ms", T::Integer, "30000", "An answer that takes longer is a failed attempt (retried).").affects(Affects::Failures),
        Key::new("ca_file", T::String, "the system's roots", "`https://`: the CA certificates (PEM) the server's certificate must chain to.")
            .affects(Affects::Security),
        Key::new("client_cert", T::String, UNSET, "`https://`: a client certificate chain (PEM), with `client_key`.").affects(Affects::Security),
        Key::new("client_key", T::String, UNSET, "`https://`: the client certificate's private key (PEM).").affects(Affects::Security),
        Key::new("max_held_bytes", T::Integer, "16777216", "Idempotency by content: record bytes held waiting for their watermark, 64 KiB to 4 GiB; past it the oldest event time is sent at once (dedup of those batches is no longer exact). In the memory budget.")
            .affects(Affects::Memory),
        Key::new("max_pending_bytes", T::Integer, "16777216", "Bytes of sealed batches kept toward the API (in flight, awaiting a retry, queued), 64 KiB to 4 GiB. Beyond `max_in_flight` the sink queues only while a checkpoint's barrier is on its way (what is queued goes into the checkpoint); at this bound that checkpoint is declined, naming the API. In the memory budget.")
            .affects(Affects::Memory),
    ];

    /// Read an HTTP sink's section; idempotency keys start with `job_name`.
    pub fn from_section(s: &mut Section, job_name: &str) -> Result<HttpSinkConfig, JobFileError> {
        let url = s.required::<String>("url", "the endpoint, e.g. http://127.0.0.1:8080/ingest")?;
        let mut config = HttpSinkConfig { key_prefix: job_name.to_owned(), ..HttpSinkConfig::new(url.get_ref()) };
        let ca_file = s.take::<String>("ca_file")?;
        if let Some(f) = &ca_file {
            config.ca_file = Some(PathBuf::from(f.get_ref()));
        }
        let client_cert = match (s.take::<String>("client_cert")?, s.take::<String>("client_key")?) {
            (Some(cert), Some(key)) => {
                config.client_cert =
                    Some(ClientCert { cert: PathBuf::from(cert.get_ref()), key: PathBuf::from(key.get_ref()) });
                Some(cert.span())
            }
            (Some(one), None) | (None, Some(one)) => {
                return Err(s.err(one.span(), "client_cert", "give client_cert and client_key together (PEM files)"));
            }
            (None, None) => None,
        };
        if let Err(e) = config.validate().map_err(|e| e.to_string()) {
            // A file that does not load is the file's fault; anything else the URL's.
            let (span, field) = match (&ca_file, client_cert) {
                (_, Some(span)) if e.contains("client certificate") || e.contains("client key") => {
                    (span, "client_cert")
                }
                (Some(f), _) if e.contains("CA file") => (f.span(), "ca_file"),
                _ => (url.span(), "url"),
            };
            return Err(s.err(span, field, e));
        }
        if let Some(m) = s.take::<u64>("max_in_flight")? {
            if !(1..=256).contains(m.get_ref()) {
                return Err(s.err(m.span(), "max_in_flight", "use 1 to 256 requests in flight"));
            }
            config.max_in_flight = *m.get_ref() as usize;
        }
        if let Some(b) = s.take::<u64>("batch_records")? {
            if !(1..=1_000_000).contains(b.get_ref()) {
                return Err(s.err(b.span(), "batch_records", "use 1 to 1000000 records per request"));
            }
            config.batch_records = *b.get_ref() as usize;
        }
        if let Some(b) = s.take::<String>("body")? {
            config.body = BodyFormat::from_name(b.get_ref()).ok_or_else(|| {
                s.err(b.span(), "body", format!("unknown body `{}`; use json_lines or json_array", b.get_ref()))
            })?;
        }
        if let Some(p) = s.take::<String>("dead_letter")? {
            if p.get_ref().trim().is_empty() {
                return Err(s.err(p.span(), "dead_letter", "an empty path; name a file, or remove the setting"));
            }
            config.dead_letter = Some(PathBuf::from(p.get_ref()));
        }
        if let Some(r) = s.take::<u32>("max_retries")? {
            config.max_retries = *r.get_ref();
        }
        if let Some(t) = s.take::<u64>("retry_for_ms")? {
            config.retry_for = Duration::from_millis(*t.get_ref());
        }
        for (key, field) in
            [("max_held_bytes", &mut config.max_held_bytes), ("max_pending_bytes", &mut config.max_pending_bytes)]
        {
            if let Some(b) = s.take::<u64>(key)? {
                if !(64 * 1024..=1 << 32).contains(b.get_ref()) {
                    return Err(s.err(
                        b.span(),
                        key,
                        "use 64 KiB to 4 GiB (bytes; counted in the job's memory budget)",
                    ));
                }
                *field = *b.get_ref() as usize;
            }
        }
        if let Some(t) = s.take::<u64>("request_timeout_ms")? {
            if *t.get_ref() == 0 {
                return Err(s.err(t.span(), "request_timeout_ms", "a timeout of 0; give requests time"));
            }
            config.request_timeout = Duration::from_millis(*t.get_ref());
        }
        Ok(config)
    }
}
