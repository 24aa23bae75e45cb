//! An HTTP sink's job-file section (`type = "http"`): every key it takes, checked where it is.

use super::{BodyFormat, HttpSinkConfig};
use crate::io::ClientCert;
use crate::util::section::{JobFileError, Section};
use std::path::PathBuf;
use std::time::Duration;

impl HttpSinkConfig {
    /// The keys of an HTTP sink's section.
    pub const KEYS: &'static [&'static str] = &[
        "url",
        "max_in_flight",
        "batch_records",
        "body",
        "dead_letter",
        "max_retries",
        "retry_for_ms",
        "request_timeout_ms",
        "ca_file",
        "client_cert",
        "client_key",
        "max_held_bytes",
        "max_pending_bytes",
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
        if let Err(e) = config.validate() {
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
