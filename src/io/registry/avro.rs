//! Avro in the Confluent wire format: decoded straight into the record through serde (no value
//! tree: `serde_avro_fast`), the writer's schema from the registry.

use super::{Registry, SchemaError, SchemaKind, split_frame, write_frame};
use crate::io::kafka::{Decode, Encode, FormatError};
use rustc_hash::FxHashMap;
use std::marker::PhantomData;
use std::sync::Arc;

type Parsed = Result<Arc<serde_avro_fast::Schema>, String>;

/// Avro records (Confluent wire format) into `T`, by the writer's schema from the registry.
#[derive(Debug)]
pub struct AvroDecode<T> {
    registry: Arc<Registry>,
    /// Every id seen: its schema, or why records of it are bad (asked once per id).
    schemas: FxHashMap<u32, Parsed>,
    value: Option<T>,
}

impl<T> AvroDecode<T> {
    /// Decode with the schemas of `registry`.
    pub fn new(registry: Arc<Registry>) -> AvroDecode<T> {
        AvroDecode { registry, schemas: FxHashMap::default(), value: None }
    }

    /// The schema of `id`, or why records of it are bad; `Err` only for an unavailable
    /// registry (not remembered: asked again).
    fn fetch(&self, id: u32) -> Result<Parsed, FormatError> {
        let schema = match self.registry.schema_by_id(id) {
            Ok(s) => s,
            Err(FormatError::Bad(why)) => return Ok(Err(why)),
            Err(unavailable) => return Err(unavailable),
        };
        if schema.kind != SchemaKind::Avro {
            return Ok(Err(format!(
                "schema id {id} is a {} schema; this source reads Avro (format = \"avro\")",
                schema.kind.name()
            )));
        }
        if !schema.references.is_empty() {
            return Ok(Err(format!(
                "schema id {id} refers to other subjects' schemas, which weir does not resolve for Avro"
            )));
        }
        Ok(schema.text.parse().map(Arc::new).map_err(|e| format!("schema id {id} does not parse as Avro: {e}")))
    }
}

impl<T: serde::de::DeserializeOwned + Send> Decode<T> for AvroDecode<T> {
    fn decode(&mut self, payload: Option<&[u8]>) -> Result<&T, FormatError> {
        let (id, datum) = split_frame(payload)?;
        if !self.schemas.contains_key(&id) {
            let parsed = self.fetch(id)?;
            self.schemas.insert(id, parsed);
        }
        let schema = self.schemas[&id].as_ref().map_err(|why| FormatError::Bad(why.clone()))?;
        match serde_avro_fast::from_datum_slice::<T>(datum, schema) {
            Ok(v) => Ok(self.value.insert(v)),
            Err(e) => Err(FormatError::Bad(format!(
                "an Avro datum of schema id {id} does not decode into {}: {e}",
                std::any::type_name::<T>()
            ))),
        }
    }
}

/// Records of `T` as Avro (Confluent wire format) by a schema the job gives, registered under
/// a subject when the first record is written.
pub struct AvroEncode<T> {
    registry: Arc<Registry>,
    subject: String,
    text: String,
    schema: serde_avro_fast::Schema,
    register: bool,
    id: Option<u32>,
    _record: PhantomData<fn(&T)>,
}

impl<T> std::fmt::Debug for AvroEncode<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AvroEncode").field("subject", &self.subject).field("id", &self.id).finish_non_exhaustive()
    }
}

impl<T> AvroEncode<T> {
    /// Write by the Avro schema `text` (JSON), under `subject`: registered there if
    /// `register`, else it must be registered already. The schema is parsed here.
    pub fn new(
        registry: Arc<Registry>,
        subject: &str,
        text: &str,
        register: bool,
    ) -> Result<AvroEncode<T>, SchemaError> {
        let schema = text.parse().map_err(SchemaError::Avro)?;
        Ok(AvroEncode {
            registry,
            subject: subject.to_owned(),
            text: text.to_owned(),
            schema,
            register,
            id: None,
            _record: PhantomData,
        })
    }
}

impl<T: serde::Serialize> Encode<T> for AvroEncode<T> {
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), FormatError> {
        let id = match self.id {
            Some(id) => id,
            None => *self.id.insert(self.registry.id_for(
                &self.subject,
                SchemaKind::Avro,
                &self.text,
                &[],
                self.register,
            )?),
        };
        write_frame(id, out);
        let mut config = serde_avro_fast::ser::SerializerConfig::new(&self.schema);
        serde_avro_fast::to_datum(record, &mut *out, &mut config).map(|_| ()).map_err(|e| {
            FormatError::Bad(format!(
                "a {} does not fit the Avro schema of subject {}: {e}",
                std::any::type_name::<T>(),
                self.subject
            ))
        })
    }
}
