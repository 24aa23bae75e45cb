//! The record format of a Kafka node's job-file section: `format = "json" | "avro" |
//! "protobuf"`, the schema registry, and for a sink the schema it writes by.
//!
//! ```toml
//! [[source]]
//! type = "kafka"
//! format = "avro"                          # json (default) | avro | protobuf
//! schema_registry = "http://127.0.0.1:8081" # Apicurio: http://host:8080/apis/ccompat/v7
//! schema_registry_user = "${REGISTRY_USER}" # HTTP basic auth (optional)
//! schema_registry_password = "${file:/run/secrets/registry}"
//! schema_registry_ca = "ca.pem"            # roots for https:// (default: the system's)
//! schema_registry_retry_ms = 60000         # a registry that does not answer, then fail (exit 69)
//!
//! [[sink]]
//! type = "kafka"
//! format = "protobuf"
//! schema = "event.proto"                   # .avsc for avro; registered when the first record is written
//! message = "weir.Event"                   # protobuf: which message (default: the file's first)
//! subject = "events-value"                 # default: <topic>-value
//! auto_register = true                     # false: the schema must be registered already
//! ```

#[cfg(feature = "registry")]
use super::{AvroDecode, AvroEncode, ProtobufDecode, ProtobufEncode, Registry, RegistryConfig};
use crate::io::kafka::{Decode, Encode, FormatError, Json, JsonEncode};
use crate::util::section::{Affects, JobFileError, Key, KeyType as T, Section, UNSET};
#[cfg(feature = "registry")]
use std::path::PathBuf;
#[cfg(feature = "registry")]
use std::sync::Arc;
#[cfg(feature = "registry")]
use std::time::Duration;

/// The keys a Kafka source's section takes for its format.
pub const SOURCE_KEYS: &[Key] = &[
    Key::new(
        "format",
        T::String,
        "json",
        "The records' format: `json` (an event's fields), `avro` or `protobuf` (the Confluent wire format through a schema registry: the `registry` feature).",
    ),
    Key::new(
        "schema_registry",
        T::String,
        "required by avro and protobuf",
        "The registry's URL (Confluent's API: Confluent, Apicurio's `/apis/ccompat/v7`, Karapace, Redpanda).",
    ),
    Key::new("schema_registry_user", T::String, UNSET, "HTTP basic auth user.").affects(Affects::Security),
    Key::new("schema_registry_password", T::String, UNSET, "HTTP basic auth password; never printed.")
        .affects(Affects::Security),
    Key::new(
        "schema_registry_ca",
        T::String,
        "the system's roots",
        "`https://` registries: the CA certificates (PEM).",
    )
    .affects(Affects::Security),
    Key::new(
        "schema_registry_retry_ms",
        T::Integer,
        "60000",
        "How long a registry that does not answer is asked again, with backoff, before the job fails (exit 69).",
    )
    .affects(Affects::Failures),
];

/// The keys a Kafka sink's section takes for its format.
pub const SINK_KEYS: &[Key] = &[
    SOURCE_KEYS[0],
    SOURCE_KEYS[1],
    SOURCE_KEYS[2],
    SOURCE_KEYS[3],
    SOURCE_KEYS[4],
    SOURCE_KEYS[5],
    Key::new(
        "schema",
        T::String,
        "required by avro and protobuf",
        "The schema file written by: `.avsc` for Avro, `.proto` for Protobuf; read and checked when the job file loads.",
    ),
    Key::new("message", T::String, "the file's first message", "Protobuf: which message of the `.proto` file."),
    Key::new("subject", T::String, "<topic>-value", "The subject the schema is registered under."),
    Key::new(
        "auto_register",
        T::Boolean,
        "true",
        "Register the schema when the first record is written; `false`: it must be registered already.",
    ),
];

/// How a Kafka source reads its records.
#[derive(Debug, Clone)]
pub enum SourceFormat {
    /// JSON text (the default).
    Json,
    #[cfg(feature = "registry")]
    /// Avro, Confluent wire format.
    Avro(Arc<Registry>),
    #[cfg(feature = "registry")]
    /// Protobuf, Confluent wire format.
    Protobuf(Arc<Registry>),
}

/// One decoder of any format (a `match` per record, no dynamic call).
#[derive(Debug)]
pub enum AnyDecode<T> {
    /// JSON.
    Json(Json<T>),
    #[cfg(feature = "registry")]
    /// Avro.
    Avro(AvroDecode<T>),
    #[cfg(feature = "registry")]
    /// Protobuf.
    Protobuf(ProtobufDecode<T>),
}

impl<T: serde::de::DeserializeOwned + Send> Decode<T> for AnyDecode<T> {
    fn decode(&mut self, payload: Option<&[u8]>) -> Result<&T, FormatError> {
        match self {
            AnyDecode::Json(d) => d.decode(payload),
            #[cfg(feature = "registry")]
            AnyDecode::Avro(d) => d.decode(payload),
            #[cfg(feature = "registry")]
            AnyDecode::Protobuf(d) => d.decode(payload),
        }
    }
}

impl SourceFormat {
    /// A decoder for one subtask.
    pub fn decoder<T>(&self) -> AnyDecode<T> {
        match self {
            SourceFormat::Json => AnyDecode::Json(Json::default()),
            #[cfg(feature = "registry")]
            SourceFormat::Avro(r) => AnyDecode::Avro(AvroDecode::new(r.clone())),
            #[cfg(feature = "registry")]
            SourceFormat::Protobuf(r) => AnyDecode::Protobuf(ProtobufDecode::new(r.clone())),
        }
    }

    /// Read a Kafka source's `format` and registry keys.
    pub fn from_section(s: &mut Section) -> Result<SourceFormat, JobFileError> {
        Ok(match format(s)? {
            Kind::Json => {
                no_registry(s, "json")?;
                SourceFormat::Json
            }
            #[cfg(feature = "registry")]
            Kind::Avro => SourceFormat::Avro(registry(s, "avro")?),
            #[cfg(feature = "registry")]
            Kind::Protobuf => SourceFormat::Protobuf(registry(s, "protobuf")?),
        })
    }
}

/// How a Kafka sink writes its records.
#[derive(Debug, Clone)]
pub enum SinkFormat {
    /// JSON text (the default).
    Json,
    #[cfg(feature = "registry")]
    /// Avro by a schema file's text, Confluent wire format.
    Avro(SchemaSink),
    #[cfg(feature = "registry")]
    /// Protobuf by a `.proto` file's text and a message in it, Confluent wire format.
    Protobuf(SchemaSink, Option<String>),
}

#[cfg(feature = "registry")]
/// What a schema-registry sink writes by.
#[derive(Debug, Clone)]
pub struct SchemaSink {
    /// The registry.
    pub registry: Arc<Registry>,
    /// The subject the schema is registered under.
    pub subject: String,
    /// The schema's text.
    pub text: String,
    /// Register it (else look it up).
    pub register: bool,
}

/// One encoder of any format.
#[derive(Debug)]
pub enum AnyEncode<T> {
    /// JSON.
    Json(JsonEncode<T>),
    #[cfg(feature = "registry")]
    /// Avro.
    Avro(AvroEncode<T>),
    #[cfg(feature = "registry")]
    /// Protobuf.
    Protobuf(ProtobufEncode<T>),
}

impl<T: serde::Serialize> Encode<T> for AnyEncode<T> {
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), FormatError> {
        match self {
            AnyEncode::Json(e) => e.encode(record, out),
            #[cfg(feature = "registry")]
            AnyEncode::Avro(e) => e.encode(record, out),
            #[cfg(feature = "registry")]
            AnyEncode::Protobuf(e) => e.encode(record, out),
        }
    }
}

impl SinkFormat {
    /// An encoder for one subtask (the schema was checked when the section was read).
    pub fn encoder<T>(&self) -> AnyEncode<T> {
        match self {
            SinkFormat::Json => AnyEncode::Json(JsonEncode::default()),
            #[cfg(feature = "registry")]
            SinkFormat::Avro(s) => AnyEncode::Avro(
                AvroEncode::new(s.registry.clone(), &s.subject, &s.text, s.register).expect("checked when read"),
            ),
            #[cfg(feature = "registry")]
            SinkFormat::Protobuf(s, message) => AnyEncode::Protobuf(
                ProtobufEncode::new(s.registry.clone(), &s.subject, &s.text, message.as_deref(), s.register)
                    .expect("checked when read"),
            ),
        }
    }

    /// Read a Kafka sink's `format`, registry and schema keys; the subject defaults to
    /// `<topic>-value`.
    pub fn from_section(s: &mut Section, topic: &str) -> Result<SinkFormat, JobFileError> {
        let kind = format(s)?;
        if kind == Kind::Json {
            no_registry(s, "json")?;
            for key in ["schema", "message", "subject", "auto_register"] {
                if let Some(span) = s.span_of(key) {
                    return Err(s.err(span, key, "JSON needs no schema; set format = \"avro\" or \"protobuf\""));
                }
            }
            return Ok(SinkFormat::Json);
        }
        #[cfg(feature = "registry")]
        return SinkFormat::by_schema(s, kind, topic);
        #[cfg(not(feature = "registry"))]
        unreachable!("format() refuses {kind:?} without the registry feature")
    }

    /// An Avro or Protobuf sink's registry and schema keys.
    #[cfg(feature = "registry")]
    fn by_schema(s: &mut Section, kind: Kind, topic: &str) -> Result<SinkFormat, JobFileError> {
        let name = if kind == Kind::Avro { "avro" } else { "protobuf" };
        let registry = registry(s, name)?;
        let hint = if kind == Kind::Avro { "the Avro schema file (.avsc)" } else { "the .proto file" };
        let path = s.required::<String>("schema", hint)?;
        let text = std::fs::read_to_string(path.get_ref())
            .map_err(|e| s.err(path.span(), "schema", format!("cannot read {}: {e}", path.get_ref())))?;
        let subject = match s.take::<String>("subject")? {
            Some(v) if v.get_ref().trim().is_empty() => {
                return Err(s.err(v.span(), "subject", "an empty subject; remove it for <topic>-value"));
            }
            Some(v) => v.into_inner(),
            None => format!("{topic}-value"),
        };
        let register = s.take::<bool>("auto_register")?.is_none_or(|b| b.into_inner());
        let message = s.take::<String>("message")?;
        let sink = SchemaSink { registry, subject, text, register };
        // Parse or compile the schema now: a bad file is the job file's error, with its line.
        if kind == Kind::Avro {
            if let Some(m) = &message {
                return Err(s.err(m.span(), "message", "an Avro schema names its record itself; remove message"));
            }
            AvroEncode::<()>::new(sink.registry.clone(), &sink.subject, &sink.text, register)
                .map_err(|e| s.err(path.span(), "schema", format!("{}: {e}", path.get_ref())))?;
            return Ok(SinkFormat::Avro(sink));
        }
        let message = message.map(|m| m.into_inner());
        ProtobufEncode::<()>::new(sink.registry.clone(), &sink.subject, &sink.text, message.as_deref(), register)
            .map_err(|e| s.err(path.span(), "schema", format!("{}: {e}", path.get_ref())))?;
        Ok(SinkFormat::Protobuf(sink, message))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Json,
    #[cfg(feature = "registry")]
    Avro,
    #[cfg(feature = "registry")]
    Protobuf,
}

fn format(s: &mut Section) -> Result<Kind, JobFileError> {
    let Some(v) = s.take::<String>("format")? else { return Ok(Kind::Json) };
    match v.get_ref().as_str() {
        "json" => Ok(Kind::Json),
        #[cfg(feature = "registry")]
        "avro" => Ok(Kind::Avro),
        #[cfg(feature = "registry")]
        "protobuf" => Ok(Kind::Protobuf),
        #[cfg(not(feature = "registry"))]
        name @ ("avro" | "protobuf") => {
            Err(s.err(v.span(), "format", crate::util::section::not_built(&format!("format = \"{name}\""), "registry")))
        }
        other => Err(s.err(v.span(), "format", format!("unknown format `{other}`; use json, avro or protobuf"))),
    }
}

fn no_registry(s: &Section, format: &str) -> Result<(), JobFileError> {
    for key in SOURCE_KEYS[1..].iter().map(|k| k.name) {
        if let Some(span) = s.span_of(key) {
            let message =
                format!("format = \"{format}\" reads no schema registry; set format = \"avro\" or \"protobuf\"");
            return Err(s.err(span, key, message));
        }
    }
    Ok(())
}

#[cfg(feature = "registry")]
fn registry(s: &mut Section, format: &str) -> Result<Arc<Registry>, JobFileError> {
    let hint = format!(
        "format = \"{format}\" needs the schema registry's URL, e.g. schema_registry = \"http://127.0.0.1:8081\""
    );
    let url = s.required::<String>("schema_registry", &hint)?;
    let mut config = RegistryConfig::new(url.get_ref());
    config.user = s.take::<String>("schema_registry_user")?.map(|u| u.into_inner());
    config.password = s.take::<String>("schema_registry_password")?.map(|p| p.into_inner());
    let ca = s.take::<String>("schema_registry_ca")?;
    config.ca_file = ca.as_ref().map(|c| PathBuf::from(c.get_ref()));
    if let Some(ms) = s.take::<u64>("schema_registry_retry_ms")? {
        config.retry_for = Duration::from_millis(ms.into_inner());
    }
    Registry::new(config).map(Arc::new).map_err(|e| match (&ca, &e) {
        (Some(c), super::RegistryError::CaFile { .. } | super::RegistryError::NoCertificate { .. }) => {
            s.err(c.span(), "schema_registry_ca", e.to_string())
        }
        (_, super::RegistryError::PasswordWithoutUser) => s.err(url.span(), "schema_registry_user", e.to_string()),
        _ => s.err(url.span(), "schema_registry", e.to_string()),
    })
}
