//! How Kafka payloads become records (source) and records become payloads (sink).
//!
//! A decoder keeps the last record it made and lends it out (`&T`), so raw payloads are
//! copied into one reused buffer and fixed layouts into one reused value: no allocation per
//! record except what serde needs for JSON.

use std::marker::PhantomData;

/// Why a payload did not become a record (or a record a payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// This record is bad (not the format, a schema id the registry does not know, a wrong
    /// magic byte): a source counts it and applies `on_bad_record` (the reason goes with the
    /// dead letter); a sink fails.
    Bad(String),
    /// Nothing is known to be wrong with the record: what decodes it is unavailable (a schema
    /// registry that does not answer). The job fails as "unavailable" (`weir run` exits 69)
    /// and reads the record again after a restart; it is never dead-lettered for this.
    Unavailable(String),
}

impl FormatError {
    /// What happened.
    pub fn reason(&self) -> &str {
        match self {
            FormatError::Bad(r) | FormatError::Unavailable(r) => r,
        }
    }
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl From<String> for FormatError {
    fn from(reason: String) -> FormatError {
        FormatError::Bad(reason)
    }
}

impl From<&str> for FormatError {
    fn from(reason: &str) -> FormatError {
        FormatError::Bad(reason.to_owned())
    }
}

/// Turns one Kafka payload into a record.
pub trait Decode<T>: Send {
    /// Decode `payload` (`None`: a record without a value, a tombstone).
    fn decode(&mut self, payload: Option<&[u8]>) -> Result<&T, FormatError>;
    /// A payload that is no record but a writer's watermark (in a repartition topic, see
    /// [`super::repartition`]); asked before `decode`.
    fn writer_mark(&self, _payload: Option<&[u8]>) -> Option<super::repartition::WriterMark> {
        None
    }
}

/// The payload's bytes as they are (`Vec<u8>` records); a tombstone is an empty record.
#[derive(Debug, Default)]
pub struct RawBytes {
    buf: Vec<u8>,
}

impl Decode<Vec<u8>> for RawBytes {
    fn decode(&mut self, payload: Option<&[u8]>) -> Result<&Vec<u8>, FormatError> {
        self.buf.clear();
        self.buf.extend_from_slice(payload.unwrap_or_default());
        Ok(&self.buf)
    }
}

/// JSON text into any serde type.
#[derive(Debug)]
pub struct Json<T> {
    value: Option<T>,
}

impl<T> Default for Json<T> {
    fn default() -> Json<T> {
        Json { value: None }
    }
}

impl<T: serde::de::DeserializeOwned + Send> Decode<T> for Json<T> {
    fn decode(&mut self, payload: Option<&[u8]>) -> Result<&T, FormatError> {
        let payload = payload.ok_or("no value (a tombstone), expected JSON")?;
        match serde_json::from_slice::<T>(payload) {
            Ok(v) => Ok(self.value.insert(v)),
            Err(e) => Err(format!("not JSON for {}: {e}", std::any::type_name::<T>()).into()),
        }
    }
}

/// A fixed binary layout (zerocopy): the payload must be exactly `size_of::<T>()` bytes. It is
/// copied (payloads in librdkafka's buffers are not aligned for `T`).
#[derive(Debug)]
pub struct Fixed<T> {
    value: Option<T>,
}

impl<T> Default for Fixed<T> {
    fn default() -> Fixed<T> {
        Fixed { value: None }
    }
}

impl<T: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + Send> Decode<T> for Fixed<T> {
    fn decode(&mut self, payload: Option<&[u8]>) -> Result<&T, FormatError> {
        let payload = payload.ok_or("no value (a tombstone), expected a fixed layout")?;
        match T::read_from_bytes(payload) {
            Ok(v) => Ok(self.value.insert(v)),
            Err(_) => Err(format!(
                "{} bytes, but a {} is {} bytes",
                payload.len(),
                std::any::type_name::<T>(),
                std::mem::size_of::<T>()
            )
            .into()),
        }
    }
}

/// Turns a record into a Kafka payload (sink), appended to `out`.
pub trait Encode<T>: Send {
    /// Append the payload of `record` to `out` (cleared by the caller).
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), FormatError>;
}

/// A record's bytes as they are.
#[derive(Debug, Default)]
pub struct RawEncode;

impl<T: AsRef<[u8]>> Encode<T> for RawEncode {
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), FormatError> {
        out.extend_from_slice(record.as_ref());
        Ok(())
    }
}

/// A serde record as JSON text.
#[derive(Debug)]
pub struct JsonEncode<T>(PhantomData<fn(&T)>);

impl<T> Default for JsonEncode<T> {
    fn default() -> JsonEncode<T> {
        JsonEncode(PhantomData)
    }
}

impl<T: serde::Serialize> Encode<T> for JsonEncode<T> {
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), FormatError> {
        serde_json::to_writer(out, record).map_err(|e| format!("cannot write a record as JSON: {e}").into())
    }
}

/// A fixed binary layout, its bytes as they are in memory.
#[derive(Debug)]
pub struct FixedEncode<T>(PhantomData<fn(&T)>);

impl<T> Default for FixedEncode<T> {
    fn default() -> FixedEncode<T> {
        FixedEncode(PhantomData)
    }
}

impl<T: zerocopy::IntoBytes + zerocopy::Immutable> Encode<T> for FixedEncode<T> {
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), FormatError> {
        out.extend_from_slice(record.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Event;

    /// Each decoder takes what it should and gives a reason for what it should not.
    #[test]
    fn decoders() {
        let mut raw = RawBytes::default();
        assert_eq!(raw.decode(Some(b"abc")).unwrap(), b"abc");
        assert!(raw.decode(None).unwrap().is_empty());

        let mut json = Json::<Event>::default();
        let e = json.decode(Some(br#"{"key":1,"value":2,"time_ns":3,"seq":4}"#)).unwrap();
        assert_eq!(e.seq, 4);
        assert!(json.decode(Some(b"{nope")).unwrap_err().reason().contains("not JSON"));
        assert!(json.decode(None).unwrap_err().reason().contains("tombstone"));

        let mut fixed = Fixed::<Event>::default();
        let mut bytes = Vec::new();
        FixedEncode::<Event>::default().encode(&Event { key: 9, ..Event::default() }, &mut bytes).unwrap();
        assert_eq!(fixed.decode(Some(&bytes)).unwrap().key, 9);
        assert!(fixed.decode(Some(&bytes[1..])).unwrap_err().reason().contains("31 bytes"));
    }
}
