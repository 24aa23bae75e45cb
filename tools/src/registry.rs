//! A stand-in schema registry for the tests: the calls of Confluent's REST API that weir makes,
//! answered the way Confluent's registry answers them (the same paths, bodies, status codes
//! and `error_code`s), in memory, on loopback.
//!
//! No real registry runs on the test machines: Confluent's is not published to the package
//! registries they reach, Karapace is not on PyPI, and Apicurio's modules on Maven Central are
//! incomplete (see the README). So the tests talk to this, written from Confluent's API
//! reference:
//!
//! - `POST /subjects/{subject}/versions` `{"schema", "schemaType"?, "references"?}` →
//!   `{"id"}`: the same schema (text and type) gets the same id in every subject; a new
//!   version is checked against the subject's latest under its compatibility (`BACKWARD` by
//!   default, as Confluent's; `NONE`, `FORWARD`, `FULL` and the `_TRANSITIVE` forms read as
//!   their non-transitive form), 409 / `409` when it fails; an Avro schema that is not JSON
//!   → 422 / `42201`.
//! - `POST /subjects/{subject}` (lookup) → `{"subject", "id", "version", "schema"}`, or 404
//!   with `40401` (no subject) / `40403` (not under it).
//! - `GET /schemas/ids/{id}` → `{"schema", "schemaType"?, "references"?}` or 404 / `40403`.
//! - `GET /subjects/{subject}/versions/{version|latest}` → the version, or 404 / `40402`.
//! - `PUT /config/{subject}` `{"compatibility"}` → the same body.
//!
//! Compatibility is checked for Avro records only (a reader's field without a default must be
//! in the writer's schema, by name); Protobuf schemas are taken as compatible. Optional
//! basic authentication answers 401 / `401` to anything else. Requests are counted by path
//! kind, so tests can show what is cached.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the registry holds.
#[derive(Default)]
struct Store {
    /// (type, text, references JSON) by id, from 1.
    schemas: Vec<(Option<String>, String, serde_json::Value)>,
    /// The ids of each subject's versions, in order.
    subjects: BTreeMap<String, Vec<u32>>,
    /// Compatibility by subject (default BACKWARD).
    compatibility: BTreeMap<String, String>,
}

/// How many requests of each kind it answered.
#[derive(Debug, Default)]
pub struct RegistryCounts {
    /// `GET /schemas/ids/{id}`.
    pub by_id: AtomicU64,
    /// `POST /subjects/{subject}/versions`.
    pub registrations: AtomicU64,
    /// `POST /subjects/{subject}`.
    pub lookups: AtomicU64,
    /// `GET /subjects/{subject}/versions/{version}`.
    pub versions: AtomicU64,
    /// Refused for want of credentials.
    pub unauthorized: AtomicU64,
}

/// A running stand-in registry; stops when dropped.
pub struct StandInRegistry {
    url: String,
    store: Arc<Mutex<Store>>,
    counts: Arc<RegistryCounts>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StandInRegistry {
    /// Start on a free loopback port; `credentials` (user, password) turns basic auth on.
    pub fn start(credentials: Option<(&str, &str)>) -> std::io::Result<StandInRegistry> {
        let server = tiny_http::Server::http("127.0.0.1:0").map_err(std::io::Error::other)?;
        let port = server.server_addr().to_ip().map(|a| a.port()).ok_or_else(|| std::io::Error::other("no port"))?;
        let store = Arc::new(Mutex::new(Store::default()));
        let counts = Arc::new(RegistryCounts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let expected = credentials.map(|(u, p)| format!("Basic {}", base64_encode(format!("{u}:{p}").as_bytes())));
        let (s, c, halt) = (store.clone(), counts.clone(), stop.clone());
        let thread = std::thread::Builder::new().name("stand-in-registry".into()).spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                let Ok(Some(mut request)) = server.recv_timeout(Duration::from_millis(20)) else { continue };
                let authorized = expected.as_ref().is_none_or(|want| {
                    request.headers().iter().any(|h| h.field.equiv("Authorization") && h.value.as_str() == want)
                });
                let (status, body) = if authorized {
                    let mut text = String::new();
                    let _ = std::io::Read::read_to_string(request.as_reader(), &mut text);
                    answer(&s, &c, request.method().as_str(), request.url(), &text)
                } else {
                    c.unauthorized.fetch_add(1, Ordering::Relaxed);
                    (401, error(401, "Unauthorized"))
                };
                let header = tiny_http::Header::from_bytes("Content-Type", "application/vnd.schemaregistry.v1+json")
                    .expect("a valid header");
                let response =
                    tiny_http::Response::from_string(body.to_string()).with_status_code(status).with_header(header);
                let _ = request.respond(response);
            }
        })?;
        Ok(StandInRegistry { url: format!("http://127.0.0.1:{port}"), store, counts, stop, thread: Some(thread) })
    }

    /// Its base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Requests answered, by kind.
    pub fn counts(&self) -> &RegistryCounts {
        &self.counts
    }

    /// Register `schema` under `subject` directly (as another producer would); its id.
    pub fn register(&self, subject: &str, kind: Option<&str>, schema: &str) -> Result<u32, String> {
        let mut body = serde_json::json!({ "schema": schema });
        if let Some(k) = kind {
            body["schemaType"] = k.into();
        }
        let (status, answer) = answer(
            &self.store,
            &RegistryCounts::default(),
            "POST",
            &format!("/subjects/{subject}/versions"),
            &body.to_string(),
        );
        match status {
            200 => Ok(answer["id"].as_u64().expect("an id") as u32),
            _ => Err(answer.to_string()),
        }
    }

    /// Stop answering (connections are then refused).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for StandInRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandInRegistry").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Drop for StandInRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn error(code: u32, message: &str) -> serde_json::Value {
    serde_json::json!({ "error_code": code, "message": message })
}

fn decode_segment(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = bytes.get(i + 1..i + 3)
            && let Some(b) = std::str::from_utf8(hex).ok().and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One request's (status, body).
fn answer(
    store: &Mutex<Store>,
    counts: &RegistryCounts,
    method: &str,
    url: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let path: Vec<String> = url.split('?').next().unwrap_or("").split('/').skip(1).map(decode_segment).collect();
    let path: Vec<&str> = path.iter().map(String::as_str).collect();
    let mut store = store.lock().expect("registry store");
    let request: serde_json::Value = if body.is_empty() {
        serde_json::Value::Null
    } else {
        match serde_json::from_str(body) {
            Ok(v) => v,
            Err(e) => return (422, error(422, &format!("Unrecognized JSON: {e}"))),
        }
    };
    match (method, path.as_slice()) {
        ("GET", ["schemas", "ids", id]) => {
            counts.by_id.fetch_add(1, Ordering::Relaxed);
            let found = id.parse::<usize>().ok().and_then(|i| i.checked_sub(1)).and_then(|i| store.schemas.get(i));
            match found {
                Some((kind, text, refs)) => (200, schema_body(kind, text, refs)),
                None => (404, error(40403, &format!("Schema {id} not found"))),
            }
        }
        ("POST", ["subjects", subject, "versions"]) => {
            counts.registrations.fetch_add(1, Ordering::Relaxed);
            register(&mut store, subject, &request)
        }
        ("POST", ["subjects", subject]) => {
            counts.lookups.fetch_add(1, Ordering::Relaxed);
            let Some(versions) = store.subjects.get(*subject) else {
                return (404, error(40401, &format!("Subject '{subject}' not found.")));
            };
            let wanted = (kind_of(&request), request["schema"].as_str().unwrap_or("").to_owned());
            for (v, &id) in versions.iter().enumerate() {
                let (kind, text, _) = &store.schemas[id as usize - 1];
                if (kind.clone(), text.clone()) == wanted {
                    let body = serde_json::json!({"subject": subject, "id": id, "version": v + 1, "schema": text});
                    return (200, body);
                }
            }
            (404, error(40403, "Schema not found"))
        }
        ("GET", ["subjects", subject, "versions", version]) => {
            counts.versions.fetch_add(1, Ordering::Relaxed);
            let Some(versions) = store.subjects.get(*subject) else {
                return (404, error(40401, &format!("Subject '{subject}' not found.")));
            };
            let index = match *version {
                "latest" => versions.len().checked_sub(1),
                v => v.parse::<usize>().ok().and_then(|v| v.checked_sub(1)),
            };
            match index.and_then(|i| versions.get(i).map(|&id| (i, id))) {
                Some((i, id)) => {
                    let (kind, text, refs) = &store.schemas[id as usize - 1];
                    let mut body = schema_body(kind, text, refs);
                    body["subject"] = (*subject).into();
                    body["version"] = (i + 1).into();
                    body["id"] = id.into();
                    (200, body)
                }
                None => (404, error(40402, &format!("Version {version} not found."))),
            }
        }
        ("PUT", ["config", subject]) => {
            let Some(level) = request["compatibility"].as_str() else {
                return (422, error(42203, "Invalid compatibility level"));
            };
            store.compatibility.insert((*subject).to_owned(), level.to_owned());
            (200, serde_json::json!({ "compatibility": level }))
        }
        _ => (404, error(404, "HTTP 404 Not Found")),
    }
}

fn kind_of(request: &serde_json::Value) -> Option<String> {
    request["schemaType"].as_str().filter(|k| *k != "AVRO").map(str::to_owned)
}

fn schema_body(kind: &Option<String>, text: &str, refs: &serde_json::Value) -> serde_json::Value {
    let mut body = serde_json::json!({ "schema": text });
    if let Some(k) = kind {
        body["schemaType"] = k.as_str().into();
    }
    if refs.as_array().is_some_and(|r| !r.is_empty()) {
        body["references"] = refs.clone();
    }
    body
}

fn register(store: &mut Store, subject: &str, request: &serde_json::Value) -> (u16, serde_json::Value) {
    let Some(text) = request["schema"].as_str() else {
        return (422, error(42201, "Invalid schema: no schema"));
    };
    let kind = kind_of(request);
    let refs = request.get("references").cloned().unwrap_or_else(|| serde_json::json!([]));
    if kind.is_none() && serde_json::from_str::<serde_json::Value>(text).is_err() {
        return (422, error(42201, "Invalid schema: not Avro JSON"));
    }
    let existing = store.schemas.iter().position(|(k, t, _)| *k == kind && t == text).map(|i| i as u32 + 1);
    let versions = store.subjects.get(subject).cloned().unwrap_or_default();
    if let Some(id) = existing
        && versions.contains(&id)
    {
        return (200, serde_json::json!({ "id": id }));
    }
    if let Some(&latest) = versions.last() {
        let level = store.compatibility.get(subject).map_or("BACKWARD", String::as_str);
        let (latest_kind, latest_text, _) = &store.schemas[latest as usize - 1];
        if let Some(why) = incompatible(level, latest_kind, latest_text, &kind, text) {
            let message = format!(
                "Schema being registered is incompatible with an earlier schema for subject \"{subject}\", details: [{why}]"
            );
            return (409, error(409, &message));
        }
    }
    let id = existing.unwrap_or_else(|| {
        store.schemas.push((kind, text.to_owned(), refs));
        store.schemas.len() as u32
    });
    store.subjects.entry(subject.to_owned()).or_default().push(id);
    (200, serde_json::json!({ "id": id }))
}

/// Why `new` may not follow `old` at `level` (Avro records only).
fn incompatible(
    level: &str,
    old_kind: &Option<String>,
    old: &str,
    new_kind: &Option<String>,
    new: &str,
) -> Option<String> {
    if old_kind != new_kind {
        return Some(format!("the schema type changed from {old_kind:?} to {new_kind:?}"));
    }
    if new_kind.is_some() {
        return None;
    }
    let (old, new): (serde_json::Value, serde_json::Value) =
        (serde_json::from_str(old).ok()?, serde_json::from_str(new).ok()?);
    let level = level.trim_end_matches("_TRANSITIVE");
    let reads = |reader: &serde_json::Value, writer: &serde_json::Value| -> Option<String> {
        let names: Vec<&str> = writer["fields"].as_array()?.iter().filter_map(|f| f["name"].as_str()).collect();
        reader["fields"].as_array()?.iter().find_map(|f| {
            let name = f["name"].as_str()?;
            (f.get("default").is_none() && !names.contains(&name))
                .then(|| format!("READER_FIELD_MISSING_DEFAULT_VALUE: {name}"))
        })
    };
    match level {
        "NONE" => None,
        "FORWARD" => reads(&old, &new),
        "FULL" => reads(&new, &old).or_else(|| reads(&old, &new)),
        _ => reads(&new, &old),
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_as_confluent_does() {
        let r = StandInRegistry::start(None).unwrap();
        let avro = r#"{"type":"record","name":"E","fields":[{"name":"key","type":"long"}]}"#;
        let id = r.register("t-value", None, avro).unwrap();
        assert_eq!(r.register("other-value", None, avro).unwrap(), id, "one id per schema");
        let wider =
            r#"{"type":"record","name":"E","fields":[{"name":"key","type":"long"},{"name":"v","type":"long"}]}"#;
        let e = r.register("t-value", None, wider).unwrap_err();
        assert!(e.contains("409") && e.contains("READER_FIELD_MISSING_DEFAULT_VALUE: v"), "{e}");
        let store = &r.store;
        let (s, b) = answer(store, &r.counts, "GET", &format!("/schemas/ids/{id}"), "");
        assert_eq!((s, b["schema"].as_str()), (200, Some(avro)));
        let (s, b) = answer(store, &r.counts, "GET", "/schemas/ids/99", "");
        assert_eq!((s, b["error_code"].as_u64()), (404, Some(40403)));
        let (s, b) =
            answer(store, &r.counts, "POST", "/subjects/nope", &serde_json::json!({"schema": avro}).to_string());
        assert_eq!((s, b["error_code"].as_u64()), (404, Some(40401)));
        let (s, b) = answer(store, &r.counts, "GET", "/subjects/t-value/versions/latest", "");
        assert_eq!((s, b["id"].as_u64(), b["version"].as_u64()), (200, Some(u64::from(id)), Some(1)));
        assert_eq!(base64_encode(b"user:pw"), "dXNlcjpwdw==");
    }
}
