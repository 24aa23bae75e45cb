//! Avro and Protobuf records in the Confluent wire format, their schemas in a schema registry.
//!
//! A payload is a magic byte `0`, the schema's id in the registry (u32, big-endian), then the
//! datum: Avro binary, or for Protobuf the message's indexes in its file (zig-zag varints: a
//! count, then the indexes; a single `0` for the file's first message) and the message.
//!
//! - **Sources** ([`AvroDecode`], [`ProtobufDecode`]) read the id, ask the registry for the
//!   writer's schema the first time they see it (cached), and decode into the job's typed
//!   record through serde: fields by name, extra fields in the writer's schema ignored, a
//!   missing one a bad record (Protobuf: proto3's default, as on the wire). Both decode
//!   straight into the record, no value tree in between; Protobuf by the descriptor compiled
//!   in process from the registry's `.proto` text (its imports fetched as references,
//!   Google's well-known types built in).
//! - **Sinks** ([`AvroEncode`], [`ProtobufEncode`]) take the schema from the job (a `.avsc`
//!   or `.proto` file), register it under the subject (default `<topic>-value`, Confluent's
//!   TopicNameStrategy; or only look it up with `auto_register = false`) when they write their
//!   first record, and frame every record with its id.
//! - **Bad records**: a wrong magic byte, a payload too short for its header, a schema id the
//!   registry does not have, a schema of the other kind, or a datum that does not fit the
//!   record are [`FormatError::Bad`]: counted as malformed, then dead-lettered with the reason
//!   (the id included), skipped or fatal per the source's `on_bad_record`.
//! - **An unreachable registry** is not the record's fault: it is asked again with capped
//!   backoff for `retry_for` (60 s), then the job fails as unavailable (`weir run` exits 69)
//!   and reads the record again after a restart. So is a registry refusing the credentials.
//!
//! Not built: JSON Schema, Avro schema references (named types from other subjects), other
//! subject name strategies than giving the subject, and the record key in these formats.

//!
//! Without the `registry` feature (Kafka alone) only JSON is built: a job file asking for
//! `format = "avro"` or `"protobuf"` is refused with the feature named.

#[cfg(feature = "registry")]
mod avro;
#[cfg(feature = "registry")]
mod client;
#[cfg(feature = "registry")]
mod protobuf;
mod section;

#[cfg(feature = "registry")]
pub use avro::{AvroDecode, AvroEncode};
#[cfg(feature = "registry")]
pub use client::{Reference, Registry, RegistryConfig, RegistryError, Schema, SchemaError, SchemaKind};
#[cfg(feature = "registry")]
pub use protobuf::{ProtobufDecode, ProtobufEncode};
#[cfg(feature = "registry")]
pub use section::SchemaSink;
pub use section::{AnyDecode, AnyEncode, SINK_KEYS, SOURCE_KEYS, SinkFormat, SourceFormat};

use crate::io::kafka::FormatError;

/// The Confluent wire format's first byte.
pub const MAGIC: u8 = 0;

/// The schema id and the rest of a framed payload.
pub fn split_frame(payload: Option<&[u8]>) -> Result<(u32, &[u8]), FormatError> {
    let payload = payload.ok_or("no value (a tombstone), expected a schema registry frame")?;
    match payload {
        [MAGIC, a, b, c, d, rest @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), rest)),
        [MAGIC, ..] => {
            Err(format!("{} bytes, too short for the schema registry frame (5 bytes)", payload.len()).into())
        }
        [m, ..] => Err(format!(
            "magic byte {m}, not 0: not in the schema registry's wire format (JSON or plain bytes? set format)"
        )
        .into()),
        [] => Err("an empty payload, expected a schema registry frame".into()),
    }
}

/// Start a framed payload: the magic byte and the schema id.
pub fn write_frame(id: u32, out: &mut Vec<u8>) {
    out.push(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_and_refuse_what_is_not_one() {
        let mut out = Vec::new();
        write_frame(0x0102_0304, &mut out);
        out.push(9);
        assert_eq!(split_frame(Some(&out)).unwrap(), (0x0102_0304, &[9u8][..]));
        assert!(split_frame(Some(b"{\"key\":1}")).unwrap_err().reason().contains("magic byte 123"));
        assert!(split_frame(Some(&[0, 1])).unwrap_err().reason().contains("too short"));
        assert!(split_frame(None).unwrap_err().reason().contains("tombstone"));
        assert!(split_frame(Some(&[])).unwrap_err().reason().contains("empty"));
    }
}
