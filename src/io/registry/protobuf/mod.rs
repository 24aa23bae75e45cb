//! Protobuf in the Confluent wire format: the registry's `.proto` text compiled in process
//! (protox, descriptors by prost-reflect); messages read from the wire straight into the
//! record (`read.rs`) and written straight from it (`write.rs`), fields matched by proto
//! field name, over plans of the schema's messages made from the descriptors once per
//! schema (`plan.rs`): no dynamic message, value tree or descriptor lookup per record.

use super::{Reference, Registry, Schema, SchemaError, SchemaKind, split_frame, write_frame};
use crate::io::kafka::{Decode, Encode, FormatError};
use prost::Message as _;
use prost_reflect::{FileDescriptor, MessageDescriptor};
use read::MessageDe;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

mod plan;
mod read;
mod write;

use plan::Plans;

/// Files a schema's references may bring (a guard against a registry that loops).
const MAX_FILES: usize = 256;

/// Message indexes deeper than this are refused (a hostile frame cannot make us walk far).
const MAX_DEPTH: usize = 32;

/// Protobuf records (Confluent wire format) into `T`, by the writer's schema from the registry.
#[derive(Debug)]
pub struct ProtobufDecode<T> {
    registry: Arc<Registry>,
    /// Every id seen: its compiled file, or why records of it are bad (a
    /// [`FormatError::Bad`]; asked once per id).
    files: FxHashMap<u32, Result<Compiled, FormatError>>,
    value: Option<T>,
}

impl<T> ProtobufDecode<T> {
    /// Decode with the schemas of `registry`.
    pub fn new(registry: Arc<Registry>) -> ProtobufDecode<T> {
        ProtobufDecode { registry, files: FxHashMap::default(), value: None }
    }

    /// The compiled file of `id`, or why records of it are bad (`Ok(Err(Bad))`); `Err` only
    /// for an unavailable registry (not remembered: asked again).
    fn fetch(&self, id: u32) -> Result<Result<Compiled, FormatError>, FormatError> {
        let schema = match self.registry.schema_by_id(id) {
            Ok(s) => s,
            Err(bad @ FormatError::Bad(_)) => return Ok(Err(bad)),
            Err(unavailable) => return Err(unavailable),
        };
        if schema.kind != SchemaKind::Protobuf {
            return Ok(Err(FormatError::Bad(format!(
                "schema id {id} is an {} schema; this source reads Protobuf (format = \"protobuf\")",
                schema.kind.name()
            ))));
        }
        match compile(&self.registry, &format!("schema id {id}"), &schema) {
            Ok(file) => {
                let plans = Plans::new(file.parent_pool());
                let first = file.messages().next().and_then(|m| plans.message(m.full_name()));
                Ok(Ok(Compiled { file, plans, first }))
            }
            Err(bad @ FormatError::Bad(_)) => Ok(Err(bad)),
            Err(unavailable) => Err(unavailable),
        }
    }
}

/// Why a message did not decode into the record, or the record not into the message.
#[derive(Debug)]
struct WireError(String);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WireError {}

impl serde::de::Error for WireError {
    fn custom<T: std::fmt::Display>(msg: T) -> WireError {
        WireError(msg.to_string())
    }
}

impl serde::ser::Error for WireError {
    fn custom<T: std::fmt::Display>(msg: T) -> WireError {
        WireError(msg.to_string())
    }
}

fn err<T>(message: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(message.into()))
}

/// A schema compiled, with the plans of its messages.
#[derive(Debug)]
struct Compiled {
    file: FileDescriptor,
    plans: Plans,
    /// The plan of the file's first message, if it has one.
    first: Option<usize>,
}

/// The message a frame names by its indexes, and the message's bytes.
fn message_at<'a>(
    file: &FileDescriptor,
    id: u32,
    rest: &'a [u8],
) -> Result<(MessageDescriptor, &'a [u8]), FormatError> {
    let mut rest = rest;
    let unparsed = || FormatError::Bad(format!("schema id {id}: the message indexes do not parse"));
    let count = read_zigzag(&mut rest).ok_or_else(unparsed)?;
    let mut message: Option<MessageDescriptor> = None;
    let step = |message: &Option<MessageDescriptor>, index: i32| -> Option<MessageDescriptor> {
        let index = usize::try_from(index).ok()?;
        match message {
            None => file.messages().nth(index),
            Some(m) => m.child_messages().nth(index),
        }
    };
    if count == 0 {
        message = step(&None, 0);
    } else {
        if !(1..=MAX_DEPTH as i32).contains(&count) {
            return Err(FormatError::Bad(format!("schema id {id}: {count} message indexes (at most {MAX_DEPTH})")));
        }
        for _ in 0..count {
            let index = read_zigzag(&mut rest).ok_or_else(unparsed)?;
            message = Some(step(&message, index).ok_or_else(|| {
                FormatError::Bad(format!(
                    "schema id {id} has no message at index {index} (of {})",
                    message.as_ref().map_or(file.name(), |m| m.full_name())
                ))
            })?);
        }
    }
    let message = message.ok_or_else(|| FormatError::Bad(format!("schema id {id} declares no message")))?;
    Ok((message, rest))
}

/// The message's indexes in its file: top-level index, then each nested one.
fn indexes_of(message: &MessageDescriptor) -> Vec<i32> {
    // A message's source path is [4, i] at the top level, then [.., 3, j] per nesting level.
    message.path().iter().skip(1).step_by(2).copied().collect()
}

/// Write the indexes (`[0]` as the single byte 0, Confluent's shorthand).
fn write_indexes(indexes: &[i32], out: &mut Vec<u8>) {
    if indexes == [0] {
        out.push(0);
        return;
    }
    write_zigzag(indexes.len() as i32, out);
    for &i in indexes {
        write_zigzag(i, out);
    }
}

fn write_zigzag(v: i32, out: &mut Vec<u8>) {
    let mut n = ((v << 1) ^ (v >> 31)) as u32;
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn read_zigzag(input: &mut &[u8]) -> Option<i32> {
    let mut n: u32 = 0;
    for shift in (0..35).step_by(7) {
        let (&b, rest) = input.split_first()?;
        *input = rest;
        n |= u32::from(b & 0x7f).checked_shl(shift)?;
        if b & 0x80 == 0 {
            return Some(((n >> 1) as i32) ^ -((n & 1) as i32));
        }
    }
    None
}

/// `.proto` sources by file name (a schema and what it imports).
struct Sources(HashMap<String, String>);

impl protox::file::FileResolver for Sources {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        let Some(source) = self.0.get(name) else { return Err(protox::Error::file_not_found(name)) };
        protox::file::File::from_source(name, source).or_else(|error| match serialized(source) {
            // Some clients (Confluent's Python one) register a base64 FileDescriptorProto, and
            // some registries hand it back as it came.
            Some(mut descriptor) => {
                descriptor.name = Some(name.to_owned());
                Ok(protox::file::File::from_file_descriptor_proto(descriptor))
            }
            None => Err(error),
        })
    }
}

/// A schema registered as a base64 `FileDescriptorProto`.
fn serialized(text: &str) -> Option<prost_types::FileDescriptorProto> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD.decode(text.trim()).ok()?;
    prost_types::FileDescriptorProto::decode(&bytes[..]).ok()
}

/// Compile `schema` with the files its references bring (fetched from the registry).
fn compile(registry: &Registry, what: &str, schema: &Schema) -> Result<FileDescriptor, FormatError> {
    const ROOT: &str = "weir-registry-schema.proto";
    let mut sources = HashMap::from([(ROOT.to_owned(), schema.text.clone())]);
    let mut todo: Vec<Reference> = schema.references.clone();
    while let Some(r) = todo.pop() {
        if sources.contains_key(&r.name) {
            continue;
        }
        if sources.len() >= MAX_FILES {
            return Err(FormatError::Bad(format!("{what} brings more than {MAX_FILES} files through its references")));
        }
        let imported = registry.subject_version(&r.subject, r.version)?;
        todo.extend(imported.references);
        sources.insert(r.name, imported.text);
    }
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(Sources(sources));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    compiler.open_file(ROOT).map_err(|e| FormatError::Bad(format!("{what} does not compile as Protobuf: {e}")))?;
    compiler
        .descriptor_pool()
        .get_file_by_name(ROOT)
        .ok_or_else(|| FormatError::Bad(format!("{what}: the compiled schema is missing")))
}

impl<T: serde::de::DeserializeOwned + Send> Decode<T> for ProtobufDecode<T> {
    fn decode(&mut self, payload: Option<&[u8]>) -> Result<&T, FormatError> {
        let (id, rest) = split_frame(payload)?;
        if !self.files.contains_key(&id) {
            let file = self.fetch(id)?;
            self.files.insert(id, file);
        }
        let compiled = self.files[&id].as_ref().map_err(FormatError::clone)?;
        let plans = &compiled.plans;
        let (msg, bytes) = match (rest.split_first(), compiled.first) {
            // Indexes `[0]`, the file's first message (nearly every record): no lookup.
            (Some((0, bytes)), Some(first)) => (first, bytes),
            _ => {
                let (descriptor, bytes) = message_at(&compiled.file, id, rest)?;
                (plans.message(descriptor.full_name()).expect("every message of the pool has a plan"), bytes)
            }
        };
        // Straight from the wire into the record (`read.rs`): no dynamic message in between.
        match T::deserialize(MessageDe::new(plans, msg, bytes)) {
            Ok(v) => Ok(self.value.insert(v)),
            Err(e) => Err(FormatError::Bad(format!(
                "a {} message of schema id {id} does not decode into {}: {e}",
                plans.messages[msg].full_name,
                std::any::type_name::<T>()
            ))),
        }
    }
}

/// Records of `T` as one Protobuf message type (Confluent wire format), from a `.proto` file
/// the job gives, registered under a subject when the first record is written.
pub struct ProtobufEncode<T> {
    registry: Arc<Registry>,
    subject: String,
    text: String,
    descriptor: MessageDescriptor,
    plans: Plans,
    msg: usize,
    indexes: Vec<i32>,
    register: bool,
    id: Option<u32>,
    _record: PhantomData<fn(&T)>,
}

impl<T> std::fmt::Debug for ProtobufEncode<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtobufEncode")
            .field("subject", &self.subject)
            .field("message", &self.descriptor.full_name())
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<T> ProtobufEncode<T> {
    /// Write messages of type `message` (its full name; `None`: the file's first message) of
    /// the `.proto` file `text` (importing only Google's well-known types), under `subject`:
    /// registered there if `register`, else it must be registered already. Compiled here.
    pub fn new(
        registry: Arc<Registry>,
        subject: &str,
        text: &str,
        message: Option<&str>,
        register: bool,
    ) -> Result<ProtobufEncode<T>, SchemaError> {
        let schema = Schema { kind: SchemaKind::Protobuf, text: text.to_owned(), references: Vec::new() };
        let file = compile(&registry, "the Protobuf schema", &schema)
            .map_err(|e| SchemaError::Protobuf(e.reason().to_owned()))?;
        let descriptor = match message {
            Some(name) => {
                file.messages().chain(file.messages().flat_map(|m| nested(&m))).find(|m| m.full_name() == name)
            }
            None => file.messages().next(),
        }
        .ok_or_else(|| match message {
            Some(name) => SchemaError::NoSuchMessage {
                name: name.to_owned(),
                messages: file.messages().map(|m| m.full_name().to_owned()).collect(),
            },
            None => SchemaError::NoMessage,
        })?;
        let indexes = indexes_of(&descriptor);
        let plans = Plans::new(file.parent_pool());
        let msg = plans.message(descriptor.full_name()).expect("every message of the pool has a plan");
        Ok(ProtobufEncode {
            registry,
            subject: subject.to_owned(),
            text: text.to_owned(),
            descriptor,
            plans,
            msg,
            indexes,
            register,
            id: None,
            _record: PhantomData,
        })
    }
}

/// Every message nested in `m`, at any depth.
fn nested(m: &MessageDescriptor) -> Vec<MessageDescriptor> {
    m.child_messages().flat_map(|c| std::iter::once(c.clone()).chain(nested(&c))).collect()
}

impl<T: serde::Serialize> Encode<T> for ProtobufEncode<T> {
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), FormatError> {
        let id = match self.id {
            Some(id) => id,
            None => *self.id.insert(self.registry.id_for(
                &self.subject,
                SchemaKind::Protobuf,
                &self.text,
                &[],
                self.register,
            )?),
        };
        let unfit = |e: &dyn std::fmt::Display| {
            FormatError::Bad(format!(
                "a {} does not fit the Protobuf message {} of subject {}: {e}",
                std::any::type_name::<T>(),
                self.descriptor.full_name(),
                self.subject
            ))
        };
        let start = out.len();
        write_frame(id, out);
        write_indexes(&self.indexes, out);
        // Straight from the record to the wire (`write.rs`): no dynamic message in between.
        write::write_message(&self.plans, self.msg, record, out).map_err(|e| {
            out.truncate(start);
            unfit(&e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_indexes_round_trip() {
        for indexes in [vec![0], vec![1], vec![0, 2], vec![3, 0, 70]] {
            let mut out = Vec::new();
            write_indexes(&indexes, &mut out);
            let mut input = &out[..];
            let count = read_zigzag(&mut input).unwrap();
            let got: Vec<i32> =
                if count == 0 { vec![0] } else { (0..count).map(|_| read_zigzag(&mut input).unwrap()).collect() };
            assert_eq!(got, indexes);
            assert!(input.is_empty());
        }
        // Confluent's bytes: [1] is count 1 (zig-zag 2), index 1 (zig-zag 2).
        let mut out = Vec::new();
        write_indexes(&[1], &mut out);
        assert_eq!(out, [2, 2]);
        assert_eq!(read_zigzag(&mut &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01][..]), None, "too long");
        assert_eq!(read_zigzag(&mut &[0x80][..]), None, "cut short");
    }
}
