//! The schema registry's HTTP API (Confluent's, which Apicurio, Karapace and Redpanda also
//! serve): fetch a schema by id, a subject's version, register a schema or look it up.
//!
//! Called off the record path: a decoder asks once per schema id it has not seen, an encoder
//! once per sink subtask; answers are cached ([`Registry::schema_by_id`]). A registry that
//! does not answer (connection refused, a timeout, a 5xx) is asked again with capped backoff
//! for `retry_for`, then the caller gets [`FormatError::Unavailable`]: the job fails as
//! unavailable and reads the record again after a restart. An answer about the record (no
//! such id, an incompatible schema) is [`FormatError::Bad`].

use crate::io::kafka::FormatError;
use base64::Engine as _;
use rustc_hash::FxHashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the schema registry is, and how to ask it.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// The API's base URL, `http://host:8081` (Apicurio: `http://host:8080/apis/ccompat/v7`).
    pub url: String,
    /// HTTP basic authentication: the user.
    pub user: Option<String>,
    /// HTTP basic authentication: the password (a secret: never printed).
    pub password: Option<String>,
    /// PEM roots to trust for `https://` (default: the system's store).
    pub ca_file: Option<PathBuf>,
    /// One request's limit.
    pub request_timeout: Duration,
    /// How long a registry that does not answer is asked again before the job fails.
    pub retry_for: Duration,
}

impl RegistryConfig {
    /// The registry at `url`, asked without credentials.
    pub fn new(url: &str) -> RegistryConfig {
        RegistryConfig {
            url: url.trim_end_matches('/').to_owned(),
            user: None,
            password: None,
            ca_file: None,
            request_timeout: Duration::from_secs(10),
            retry_for: Duration::from_secs(60),
        }
    }

    /// The settings make sense (nothing is asked).
    pub fn validate(&self) -> Result<(), RegistryError> {
        let rest = self.url.strip_prefix("http://").or_else(|| self.url.strip_prefix("https://"));
        let url = || shown(&self.url);
        match rest {
            None => Err(RegistryError::NotHttp { url: url() }),
            Some(r) if r.is_empty() || r.starts_with('/') => Err(RegistryError::NoHost { url: url() }),
            Some(r) if r.split('/').next().is_some_and(|authority| authority.contains('@')) => {
                Err(RegistryError::Credentials { url: url() })
            }
            Some(_) if self.password.is_some() && self.user.is_none() => Err(RegistryError::PasswordWithoutUser),
            Some(_) if self.request_timeout.is_zero() => Err(RegistryError::ZeroTimeout),
            Some(_) => Ok(()),
        }
    }
}

/// Why a schema registry client cannot be made ([`RegistryConfig::validate`],
/// [`Registry::new`]). URLs are shown without credentials.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The URL is not `http://` or `https://`.
    #[error("the schema registry URL `{url}` is not http:// or https://; e.g. http://127.0.0.1:8081")]
    NotHttp {
        /// The URL.
        url: String,
    },
    /// The URL names no host.
    #[error("the schema registry URL `{url}` names no host")]
    NoHost {
        /// The URL.
        url: String,
    },
    /// The URL carries `user:password@`.
    #[error(
        "the schema registry URL `{url}` carries credentials; give schema_registry_user and schema_registry_password \
         instead (they are never printed)"
    )]
    Credentials {
        /// The URL, without them.
        url: String,
    },
    /// A password without a user.
    #[error("a schema registry password without a user; set schema_registry_user")]
    PasswordWithoutUser,
    /// A request timeout of 0.
    #[error("a schema registry request timeout of 0")]
    ZeroTimeout,
    /// The CA file cannot be read.
    #[error("cannot read the schema registry's CA file {}: {source}", path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The CA file holds no certificate.
    #[error("the schema registry's CA file {} holds no PEM certificate", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
}

/// Why a schema given to an encoder cannot be used ([`AvroEncode::new`](super::AvroEncode::new),
/// [`ProtobufEncode::new`](super::ProtobufEncode::new)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The Avro schema does not parse.
    #[error("the Avro schema does not parse: {0}")]
    Avro(#[source] serde_avro_fast::schema::SchemaError),
    /// The `.proto` file does not compile (or imports what is not given).
    #[error("{0}")]
    Protobuf(String),
    /// The message asked for is not in the `.proto` file.
    #[error("the Protobuf schema has no message {name}; it has {}", messages.join(", "))]
    NoSuchMessage {
        /// The message's full name.
        name: String,
        /// The messages the file has.
        messages: Vec<String>,
    },
    /// The `.proto` file declares no message.
    #[error("the Protobuf schema declares no message")]
    NoMessage,
}

/// Why one request got no answer ([`Registry::once`]): the registry may answer later.
#[derive(Debug, thiserror::Error)]
enum NoAnswer {
    #[error("did not answer within {0:?}")]
    Timeout(Duration),
    #[error("could not be reached ({0})")]
    Unreachable(#[source] std::io::Error),
    #[error("could not be asked ({0})")]
    Failed(#[source] ureq::Error),
    #[error("answered {status} but its body could not be read ({source})")]
    Body { status: u16, source: ureq::Error },
}

/// A URL as it may be printed: without any `user:password@`.
fn shown(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match (scheme.is_empty(), path.is_empty()) {
        (true, true) => host.to_owned(),
        (true, false) => format!("{host}/{path}"),
        (false, true) => format!("{scheme}://{host}"),
        (false, false) => format!("{scheme}://{host}/{path}"),
    }
}

/// What kind of schema the registry holds under an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaKind {
    /// Avro (the registry's default: `schemaType` absent).
    Avro,
    /// Protobuf: the text of a `.proto` file.
    Protobuf,
    /// JSON Schema (not decoded by weir).
    Json,
}

impl SchemaKind {
    /// The registry's name for it.
    pub fn name(self) -> &'static str {
        match self {
            SchemaKind::Avro => "AVRO",
            SchemaKind::Protobuf => "PROTOBUF",
            SchemaKind::Json => "JSON",
        }
    }

    fn from_name(name: Option<&str>) -> Option<SchemaKind> {
        match name {
            None | Some("AVRO") => Some(SchemaKind::Avro),
            Some("PROTOBUF") => Some(SchemaKind::Protobuf),
            Some("JSON") => Some(SchemaKind::Json),
            Some(_) => None,
        }
    }
}

/// Another subject's schema that a schema refers to (a Protobuf import, by its file name).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reference {
    /// The name the schema uses for it (a Protobuf import path).
    pub name: String,
    /// The subject it is registered under.
    pub subject: String,
    /// The version of that subject.
    pub version: i64,
}

/// A schema as the registry holds it.
#[derive(Debug, Clone)]
pub struct Schema {
    /// Avro, Protobuf or JSON.
    pub kind: SchemaKind,
    /// Its text (Avro JSON, or a `.proto` file).
    pub text: String,
    /// The schemas it refers to.
    pub references: Vec<Reference>,
}

/// A client of one schema registry, shared by the subtasks of a node (its cache too).
pub struct Registry {
    config: RegistryConfig,
    agent: ureq::Agent,
    authorization: Option<String>,
    by_id: Mutex<FxHashMap<u32, Arc<Schema>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("url", &shown(&self.config.url)).finish_non_exhaustive()
    }
}

/// The media type of the registry's API.
const MEDIA_TYPE: &str = "application/vnd.schemaregistry.v1+json";

impl Registry {
    /// A client for `config` (its TLS roots are loaded here; nothing is asked yet).
    pub fn new(config: RegistryConfig) -> Result<Registry, RegistryError> {
        config.validate()?;
        let roots = match &config.ca_file {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|source| RegistryError::CaFile { path: path.clone(), source })?;
                let certs: Vec<_> = ureq::tls::parse_pem(&pem)
                    .filter_map(|item| match item {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                if certs.is_empty() {
                    return Err(RegistryError::NoCertificate { path: path.clone() });
                }
                ureq::tls::RootCerts::Specific(Arc::new(certs))
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                let certs: Vec<_> =
                    native.certs.iter().map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned()).collect();
                ureq::tls::RootCerts::Specific(Arc::new(certs))
            }
        };
        let tls = ureq::tls::TlsConfig::builder().root_certs(roots).build();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(config.request_timeout))
            .tls_config(tls)
            .user_agent(concat!("weir/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        let authorization = config.user.as_ref().map(|user| {
            let pair = format!("{user}:{}", config.password.as_deref().unwrap_or(""));
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
        });
        Ok(Registry { config, agent, authorization, by_id: Mutex::new(FxHashMap::default()) })
    }

    /// The registry's URL, as it may be printed.
    pub fn url(&self) -> String {
        shown(&self.config.url)
    }

    /// The schema registered under `id` (cached: asked once per id and registry).
    pub fn schema_by_id(&self, id: u32) -> Result<Arc<Schema>, FormatError> {
        if let Some(s) = self.by_id.lock().expect("registry cache").get(&id) {
            return Ok(s.clone());
        }
        let body = self.ask(&format!("schema id {id}"), "GET", &format!("/schemas/ids/{id}"), None)?;
        let schema = Arc::new(self.parse_schema(&format!("schema id {id}"), &body)?);
        self.by_id.lock().expect("registry cache").insert(id, schema.clone());
        Ok(schema)
    }

    /// Version `version` of `subject` (a reference's target).
    pub fn subject_version(&self, subject: &str, version: i64) -> Result<Schema, FormatError> {
        let what = format!("version {version} of subject {subject}");
        let path = format!("/subjects/{}/versions/{version}", escape(subject));
        let body = self.ask(&what, "GET", &path, None)?;
        self.parse_schema(&what, &body)
    }

    /// The id of `schema` under `subject`: registered if `register` (an existing identical
    /// schema keeps its id), else looked up (it must be registered already).
    pub fn id_for(
        &self,
        subject: &str,
        kind: SchemaKind,
        schema: &str,
        references: &[Reference],
        register: bool,
    ) -> Result<u32, FormatError> {
        let mut body = serde_json::json!({ "schema": schema });
        if kind != SchemaKind::Avro {
            body["schemaType"] = kind.name().into();
        }
        if !references.is_empty() {
            body["references"] = serde_json::to_value(references).expect("references are JSON");
        }
        let (what, path) = if register {
            (
                format!("registering the schema under subject {subject}"),
                format!("/subjects/{}/versions", escape(subject)),
            )
        } else {
            (format!("looking up the schema under subject {subject}"), format!("/subjects/{}", escape(subject)))
        };
        let answer = self.ask(&what, "POST", &path, Some(body.to_string()))?;
        answer.get("id").and_then(serde_json::Value::as_u64).and_then(|id| u32::try_from(id).ok()).ok_or_else(|| {
            FormatError::Bad(format!("{what}: the registry at {} answered without an id: {answer}", self.url()))
        })
    }

    fn parse_schema(&self, what: &str, body: &serde_json::Value) -> Result<Schema, FormatError> {
        let text = body.get("schema").and_then(serde_json::Value::as_str).ok_or_else(|| {
            FormatError::Bad(format!("{what}: the registry at {} answered without a schema: {body}", self.url()))
        })?;
        let kind_name = body.get("schemaType").and_then(serde_json::Value::as_str);
        let kind = SchemaKind::from_name(kind_name).ok_or_else(|| {
            FormatError::Bad(format!("{what} is of type {} (weir reads AVRO and PROTOBUF)", kind_name.unwrap_or("")))
        })?;
        let references = match body.get("references") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(r) => serde_json::from_value(r.clone())
                .map_err(|e| FormatError::Bad(format!("{what}: references the registry sent do not parse: {e}")))?,
        };
        Ok(Schema { kind, text: text.to_owned(), references })
    }

    /// One call, asked again while the registry does not answer (for `retry_for`); the JSON
    /// of a 2xx answer.
    fn ask(
        &self,
        what: &str,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<serde_json::Value, FormatError> {
        let url = format!("{}{path}", self.config.url);
        let start = Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            let answer = self.once(method, &url, body.as_deref());
            let retry = match answer {
                Ok((status, text)) if (200..300).contains(&status) => {
                    return serde_json::from_str(&text).map_err(|e| {
                        FormatError::Bad(format!(
                            "{what}: the registry at {} answered {status} with no JSON ({e})",
                            self.url()
                        ))
                    });
                }
                Ok((status, text)) if status >= 500 || status == 408 || status == 429 => {
                    format!("answered {status}: {}", error_message(&text))
                }
                Ok((status, text)) => return Err(self.refusal(what, status, &text)),
                Err(e) => e.to_string(),
            };
            if start.elapsed() + pause > self.config.retry_for {
                return Err(FormatError::Unavailable(format!(
                    "{what}: the schema registry at {} {retry} (asked for {:.0?}; check schema_registry, or \
                     raise schema_registry_retry_ms)",
                    self.url(),
                    start.elapsed()
                )));
            }
            tracing::warn!(registry = %self.url(), "{what}: the schema registry {retry}; asking again in {pause:?}");
            weir_ring::fiber::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// (status, body) of one request; an error is a sentence that says why no answer came.
    fn once(&self, method: &str, url: &str, body: Option<&str>) -> Result<(u16, String), NoAnswer> {
        let answer = match body {
            None => {
                let mut request = self.agent.get(url).header("Accept", MEDIA_TYPE);
                if let Some(a) = &self.authorization {
                    request = request.header("Authorization", a);
                }
                request.call()
            }
            Some(body) => {
                debug_assert_eq!(method, "POST");
                let mut request = self.agent.post(url).header("Accept", MEDIA_TYPE).header("Content-Type", MEDIA_TYPE);
                if let Some(a) = &self.authorization {
                    request = request.header("Authorization", a);
                }
                request.send(body)
            }
        };
        let mut response = answer.map_err(|e| match e {
            ureq::Error::Timeout(_) => NoAnswer::Timeout(self.config.request_timeout),
            ureq::Error::Io(io) => NoAnswer::Unreachable(io),
            other => NoAnswer::Failed(other),
        })?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(16 << 20)
            .read_to_string()
            .map_err(|source| NoAnswer::Body { status, source })?;
        Ok((status, text))
    }

    /// A 4xx answer as an error: about the record (no such schema, incompatible), or about
    /// the settings (credentials), which no retry mends either.
    fn refusal(&self, what: &str, status: u16, text: &str) -> FormatError {
        let message = error_message(text);
        let url = self.url();
        match status {
            401 | 403 => FormatError::Unavailable(format!(
                "{what}: the schema registry at {url} refused the credentials ({status}: {message}); check \
                 schema_registry_user and schema_registry_password"
            )),
            404 => FormatError::Bad(format!("{what} is not in the schema registry at {url} ({message})")),
            409 => FormatError::Bad(format!(
                "{what}: the schema is incompatible with the subject's earlier versions ({message}); change the \
                 schema or the subject's compatibility setting"
            )),
            422 => FormatError::Bad(format!("{what}: the registry at {url} calls the schema invalid ({message})")),
            _ => FormatError::Bad(format!("{what}: the registry at {url} answered {status} ({message})")),
        }
    }
}

/// The registry's error body (`{"error_code": 40403, "message": "Schema not found"}`) as
/// one line.
fn error_message(text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) if v.get("message").is_some() => {
            let message = v["message"].as_str().map_or_else(|| v["message"].to_string(), str::to_owned);
            match v.get("error_code").and_then(serde_json::Value::as_i64) {
                Some(code) => format!("error {code}: {message}"),
                None => message,
            }
        }
        _ => {
            let line: String = text.chars().take(200).collect();
            if line.trim().is_empty() { "no body".to_owned() } else { line.trim().replace('\n', " ") }
        }
    }
}

/// A subject as a URL path segment.
fn escape(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_print_without_credentials() {
        assert_eq!(shown("https://u:secret@reg:8081/apis/ccompat/v7"), "https://reg:8081/apis/ccompat/v7");
        assert_eq!(shown("http://reg:8081"), "http://reg:8081");
        let mut c = RegistryConfig::new("http://u:secret@reg:8081/");
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("carries credentials") && !e.contains("secret"), "{e}");
        c.url = "reg:8081".into();
        assert!(c.validate().unwrap_err().to_string().contains("not http:// or https://"));
        c.url = "http://reg".into();
        c.password = Some("p".into());
        assert!(c.validate().unwrap_err().to_string().contains("schema_registry_user"));
    }

    #[test]
    fn registry_error_bodies_read_as_one_line() {
        assert_eq!(
            error_message(r#"{"error_code":40403,"message":"Schema not found"}"#),
            "error 40403: Schema not found"
        );
        assert_eq!(error_message("<html>\nbad gateway</html>"), "<html> bad gateway</html>");
        assert_eq!(error_message(""), "no body");
        assert_eq!(escape("my topic-value/x"), "my%20topic-value%2Fx");
    }
}
