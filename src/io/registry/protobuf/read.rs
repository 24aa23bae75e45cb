//! Protobuf's wire format read straight into a serde type, by the message's descriptor: no
//! dynamic message, no value tree. A message is scanned once (field number and raw value of
//! every field on the wire, on the stack for small messages), then shown to the record's
//! visitor as a map of the descriptor's fields in declaration order, by proto field name:
//! each field's last occurrence (a message field's occurrences merged, as protobuf does;
//! repeated ones, packed or not, as a sequence; map fields as a map), and a field that is not
//! on the wire as proto3 reads it — its default (0, "", false, the enum's first value), or
//! none for a message or an explicitly optional field. Enums are their value's name, bytes
//! are bytes, nested messages (well-known types too) are maps.

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use smallvec::SmallVec;

use super::{WireError, err};

/// Nested messages deeper than this are refused (hostile input cannot exhaust the stack).
const MAX_DEPTH: u32 = 64;

/// One field's raw value on the wire.
#[derive(Debug, Clone, Copy)]
enum Wire<'de> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(&'de [u8]),
}

fn varint(input: &mut &[u8]) -> Result<u64, WireError> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let Some((&b, rest)) = input.split_first() else { return err("a varint cut short") };
        *input = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    err("a varint longer than 10 bytes")
}

fn take<'de>(input: &mut &'de [u8], n: usize) -> Result<&'de [u8], WireError> {
    if input.len() < n {
        return err(format!("{n} bytes expected, {} left", input.len()));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

/// Every field on the wire of one message: (field number, value), in order.
type Scan<'de> = SmallVec<[(u32, Wire<'de>); 16]>;

fn scan(input: &[u8]) -> Result<Scan<'_>, WireError> {
    let mut out = Scan::new();
    scan_into(input, &mut out)?;
    Ok(out)
}

/// Append the fields of `input` to `out`.
fn scan_into<'de>(mut input: &'de [u8], out: &mut Scan<'de>) -> Result<(), WireError> {
    while !input.is_empty() {
        let tag = varint(&mut input)?;
        let number = u32::try_from(tag >> 3).map_err(|_| WireError(format!("field number {} too large", tag >> 3)))?;
        let value = match tag & 7 {
            0 => Wire::Varint(varint(&mut input)?),
            1 => Wire::Fixed64(u64::from_le_bytes(take(&mut input, 8)?.try_into().expect("8 bytes"))),
            2 => {
                let len = usize::try_from(varint(&mut input)?).unwrap_or(usize::MAX);
                Wire::Bytes(take(&mut input, len)?)
            }
            5 => Wire::Fixed32(u32::from_le_bytes(take(&mut input, 4)?.try_into().expect("4 bytes"))),
            t => return err(format!("field {number}: wire type {t} (groups are not read)")),
        };
        if number == 0 {
            return err("field number 0");
        }
        out.push((number, value));
    }
    Ok(())
}

/// A message as a map of its fields.
pub(super) struct MessageDe<'a, 'de> {
    desc: &'a MessageDescriptor,
    /// The message's occurrences on the wire: a singular message field that appears more than
    /// once is the merge of them all, which is the same as reading them one after the other.
    parts: SmallVec<[&'de [u8]; 1]>,
    depth: u32,
}

impl<'a, 'de> MessageDe<'a, 'de> {
    /// The top-level message `bytes` of type `desc`.
    pub(super) fn new(desc: &'a MessageDescriptor, bytes: &'de [u8]) -> MessageDe<'a, 'de> {
        MessageDe { desc, parts: SmallVec::from_slice(&[bytes]), depth: 0 }
    }
}

impl<'de> Deserializer<'de> for MessageDe<'_, 'de> {
    type Error = WireError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        if self.depth > MAX_DEPTH {
            return err(format!("messages nested deeper than {MAX_DEPTH}"));
        }
        let mut scan = Scan::new();
        for part in &self.parts {
            scan_into(part, &mut scan)?;
        }
        let fields: SmallVec<[FieldDescriptor; 16]> = self.desc.fields().collect();
        visitor.visit_map(Fields { fields, scan, next: 0, depth: self.depth })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

struct Fields<'de> {
    fields: SmallVec<[FieldDescriptor; 16]>,
    scan: Scan<'de>,
    next: usize,
    depth: u32,
}

impl<'de> MapAccess<'de> for Fields<'de> {
    type Error = WireError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, WireError> {
        let Some(field) = self.fields.get(self.next) else { return Ok(None) };
        seed.deserialize(field.name().into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, WireError> {
        let field = &self.fields[self.next];
        self.next += 1;
        let number = field.number();
        let at = FieldDe { field, scan: &self.scan, number, depth: self.depth };
        seed.deserialize(at).map_err(|e| WireError(format!("field {}: {e}", field.name())))
    }
}

/// One field of a scanned message: its occurrences on the wire.
struct FieldDe<'a, 'de> {
    field: &'a FieldDescriptor,
    scan: &'a Scan<'de>,
    number: u32,
    depth: u32,
}

impl<'a, 'de> FieldDe<'a, 'de> {
    fn occurrences(&self) -> impl Iterator<Item = Wire<'de>> + 'a {
        let number = self.number;
        self.scan.iter().filter(move |(n, _)| *n == number).map(|(_, w)| *w)
    }

    fn last(&self) -> Option<Wire<'de>> {
        self.scan.iter().rev().find(|(n, _)| *n == self.number).map(|(_, w)| *w)
    }
}

impl<'de> Deserializer<'de> for FieldDe<'_, 'de> {
    type Error = WireError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        let kind = self.field.kind();
        if self.field.is_map() {
            let Kind::Message(entry) = kind else { return err("a map field without an entry message") };
            let entries: SmallVec<[&'de [u8]; 8]> = self
                .occurrences()
                .map(|w| match w {
                    Wire::Bytes(b) => Ok(b),
                    _ => err("a map entry that is not length-delimited"),
                })
                .collect::<Result<_, _>>()?;
            return visitor.visit_map(Entries { entry, entries, next: 0, pending: None, depth: self.depth });
        }
        if self.field.is_list() {
            let mut elements: SmallVec<[Wire<'de>; 16]> = SmallVec::new();
            for w in self.occurrences() {
                match (w, packed_width(&kind)) {
                    (Wire::Bytes(mut b), Some(width)) => {
                        while !b.is_empty() {
                            elements.push(match width {
                                0 => Wire::Varint(varint(&mut b)?),
                                4 => Wire::Fixed32(u32::from_le_bytes(take(&mut b, 4)?.try_into().expect("4"))),
                                _ => Wire::Fixed64(u64::from_le_bytes(take(&mut b, 8)?.try_into().expect("8"))),
                            });
                        }
                    }
                    (w, _) => elements.push(w),
                }
            }
            return visitor.visit_seq(Elements { kind, elements, next: 0, depth: self.depth });
        }
        if let Kind::Message(desc) = &kind {
            let parts = self
                .occurrences()
                .map(|w| match w {
                    Wire::Bytes(b) => Ok(b),
                    w => err(format!("a {} on the wire where the schema says a message", wire_name(&w))),
                })
                .collect::<Result<SmallVec<[&'de [u8]; 1]>, _>>()?;
            if parts.is_empty() {
                return visitor.visit_none();
            }
            return MessageDe { desc, parts, depth: self.depth + 1 }.deserialize_any(visitor);
        }
        match self.last() {
            Some(w) => ValueDe { kind, wire: w, depth: self.depth }.deserialize_any(visitor),
            None => default(&kind, visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        let absent = self.last().is_none() && !self.field.is_list() && !self.field.is_map();
        if absent && self.field.supports_presence() {
            return visitor.visit_none();
        }
        visitor.visit_some(self)
    }

    /// A `bytes` field read as a sequence (`Vec<u8>`), else as any.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        if self.field.kind() == Kind::Bytes && !self.field.is_list() {
            return match self.last() {
                Some(wire) => ValueDe { kind: Kind::Bytes, wire, depth: self.depth }.deserialize_seq(visitor),
                None => visitor.visit_seq(de::value::SeqDeserializer::new(std::iter::empty::<u8>())),
            };
        }
        self.deserialize_any(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct newtype_struct tuple tuple_struct map struct enum identifier ignored_any
    }
}

/// The element width of a packed repeated scalar (0: varints), or none if it cannot pack.
fn packed_width(kind: &Kind) -> Option<usize> {
    match kind {
        Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => Some(8),
        Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => Some(4),
        Kind::Int32
        | Kind::Int64
        | Kind::Uint32
        | Kind::Uint64
        | Kind::Sint32
        | Kind::Sint64
        | Kind::Bool
        | Kind::Enum(_) => Some(0),
        Kind::String | Kind::Bytes | Kind::Message(_) => None,
    }
}

/// A field that is not on the wire, as proto3 reads it.
fn default<'de, V: Visitor<'de>>(kind: &Kind, visitor: V) -> Result<V::Value, WireError> {
    match kind {
        Kind::Double | Kind::Float => visitor.visit_f64(0.0),
        Kind::Uint32 | Kind::Uint64 | Kind::Fixed32 | Kind::Fixed64 => visitor.visit_u64(0),
        Kind::Int32 | Kind::Int64 | Kind::Sint32 | Kind::Sint64 | Kind::Sfixed32 | Kind::Sfixed64 => {
            visitor.visit_i64(0)
        }
        Kind::Bool => visitor.visit_bool(false),
        Kind::String => visitor.visit_borrowed_str(""),
        Kind::Bytes => visitor.visit_borrowed_bytes(&[]),
        Kind::Enum(e) => visitor.visit_str(e.default_value().name()),
        Kind::Message(_) => visitor.visit_none(),
    }
}

/// One value of a field.
struct ValueDe<'de> {
    kind: Kind,
    wire: Wire<'de>,
    depth: u32,
}

impl<'de> Deserializer<'de> for ValueDe<'de> {
    type Error = WireError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        let wrong =
            |expected: &str| err(format!("a {:?} on the wire where the schema says {expected}", wire_name(&self.wire)));
        match (&self.kind, self.wire) {
            (Kind::Double, Wire::Fixed64(v)) => visitor.visit_f64(f64::from_bits(v)),
            (Kind::Float, Wire::Fixed32(v)) => visitor.visit_f32(f32::from_bits(v)),
            (Kind::Fixed64, Wire::Fixed64(v)) => visitor.visit_u64(v),
            (Kind::Sfixed64, Wire::Fixed64(v)) => visitor.visit_i64(v as i64),
            (Kind::Fixed32, Wire::Fixed32(v)) => visitor.visit_u32(v),
            (Kind::Sfixed32, Wire::Fixed32(v)) => visitor.visit_i32(v as i32),
            (Kind::Int64, Wire::Varint(v)) => visitor.visit_i64(v as i64),
            (Kind::Uint64, Wire::Varint(v)) => visitor.visit_u64(v),
            (Kind::Int32, Wire::Varint(v)) => visitor.visit_i32(v as i32),
            (Kind::Uint32, Wire::Varint(v)) => visitor.visit_u32(v as u32),
            (Kind::Sint64, Wire::Varint(v)) => visitor.visit_i64(((v >> 1) as i64) ^ -((v & 1) as i64)),
            (Kind::Sint32, Wire::Varint(v)) => {
                let v = v as u32;
                visitor.visit_i32(((v >> 1) as i32) ^ -((v & 1) as i32))
            }
            (Kind::Bool, Wire::Varint(v)) => visitor.visit_bool(v != 0),
            (Kind::Enum(e), Wire::Varint(v)) => match e.get_value(v as i32) {
                Some(value) => visitor.visit_str(value.name()),
                None => visitor.visit_i32(v as i32),
            },
            (Kind::String, Wire::Bytes(b)) => match std::str::from_utf8(b) {
                Ok(s) => visitor.visit_borrowed_str(s),
                Err(e) => err(format!("a string that is not UTF-8 ({e})")),
            },
            (Kind::Bytes, Wire::Bytes(b)) => visitor.visit_borrowed_bytes(b),
            (Kind::Message(m), Wire::Bytes(b)) => {
                MessageDe { desc: m, parts: SmallVec::from_slice(&[b]), depth: self.depth + 1 }.deserialize_any(visitor)
            }
            (Kind::Double | Kind::Fixed64 | Kind::Sfixed64, _) => wrong("a 64-bit fixed value"),
            (Kind::Float | Kind::Fixed32 | Kind::Sfixed32, _) => wrong("a 32-bit fixed value"),
            (Kind::String | Kind::Bytes | Kind::Message(_), _) => wrong("length-delimited bytes"),
            _ => wrong("a varint"),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        visitor.visit_some(self)
    }

    /// `bytes` as a sequence of u8 (`Vec<u8>`), else as any.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        match (&self.kind, self.wire) {
            (Kind::Bytes, Wire::Bytes(b)) => visitor.visit_seq(de::value::SeqDeserializer::new(b.iter().copied())),
            _ => self.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct newtype_struct tuple tuple_struct map struct enum identifier ignored_any
    }
}

fn wire_name(w: &Wire<'_>) -> &'static str {
    match w {
        Wire::Varint(_) => "varint",
        Wire::Fixed64(_) => "64-bit fixed value",
        Wire::Fixed32(_) => "32-bit fixed value",
        Wire::Bytes(_) => "length-delimited value",
    }
}

struct Elements<'de> {
    kind: Kind,
    elements: SmallVec<[Wire<'de>; 16]>,
    next: usize,
    depth: u32,
}

impl<'de> SeqAccess<'de> for Elements<'de> {
    type Error = WireError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, WireError> {
        let Some(&wire) = self.elements.get(self.next) else { return Ok(None) };
        self.next += 1;
        seed.deserialize(ValueDe { kind: self.kind.clone(), wire, depth: self.depth }).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.elements.len() - self.next)
    }
}

/// A map field: its entry messages (key = field 1, value = field 2).
struct Entries<'de> {
    entry: MessageDescriptor,
    entries: SmallVec<[&'de [u8]; 8]>,
    next: usize,
    pending: Option<Scan<'de>>,
    depth: u32,
}

impl<'de> Entries<'de> {
    fn part(&self, scan: &Scan<'de>, number: u32, seed_kind: &str) -> Result<(Kind, Option<Wire<'de>>), WireError> {
        let field = self
            .entry
            .get_field(number)
            .ok_or_else(|| WireError(format!("a map entry without its {seed_kind} field")))?;
        Ok((field.kind(), scan.iter().rev().find(|(n, _)| *n == number).map(|(_, w)| *w)))
    }
}

impl<'de> MapAccess<'de> for Entries<'de> {
    type Error = WireError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, WireError> {
        let Some(&bytes) = self.entries.get(self.next) else { return Ok(None) };
        self.next += 1;
        let entry = scan(bytes)?;
        let (kind, wire) = self.part(&entry, 1, "key")?;
        let key = match wire {
            Some(wire) => seed.deserialize(ValueDe { kind, wire, depth: self.depth })?,
            None => seed.deserialize(Absent(kind))?,
        };
        self.pending = Some(entry);
        Ok(Some(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, WireError> {
        let entry = self.pending.take().ok_or_else(|| WireError("a map value before its key".into()))?;
        match self.part(&entry, 2, "value")? {
            (kind, Some(wire)) => seed.deserialize(ValueDe { kind, wire, depth: self.depth }),
            (kind, None) => seed.deserialize(Absent(kind)),
        }
    }
}

/// A value that is not on the wire: its default.
struct Absent(Kind);

impl<'de> Deserializer<'de> for Absent {
    type Error = WireError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        default(&self.0, visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use prost::Message as _;
    use serde::Deserialize as _;
    use std::collections::BTreeMap;

    pub(in super::super) const ALL: &str = r#"syntax = "proto3";
package t;
enum Color { RED = 0; GREEN = 1; }
message Inner { string name = 1; sint32 delta = 2; }
message All {
  double d = 1; float f = 2; int32 i32 = 3; int64 i64 = 4; uint32 u32 = 5; uint64 u64 = 6;
  sint32 s32 = 7; sint64 s64 = 8; fixed32 fx32 = 9; fixed64 fx64 = 10; sfixed32 sf32 = 11;
  sfixed64 sf64 = 12; bool b = 13; string s = 14; bytes by = 15; Color color = 16; Inner inner = 17;
  repeated int64 packed = 18; repeated Inner inners = 19; map<string, int64> counts = 20;
  optional int64 maybe = 21; repeated string names = 22; repeated sint32 loose = 23 [packed = false];
}
"#;

    #[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq, Default, Clone)]
    pub(in super::super) struct Inner {
        pub name: String,
        pub delta: i32,
    }

    #[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq, Default, Clone)]
    pub(in super::super) struct All {
        pub d: f64,
        pub f: f32,
        pub i32: i32,
        pub i64: i64,
        pub u32: u32,
        pub u64: u64,
        pub s32: i32,
        pub s64: i64,
        pub fx32: u32,
        pub fx64: u64,
        pub sf32: i32,
        pub sf64: i64,
        pub b: bool,
        pub s: String,
        pub by: Vec<u8>,
        pub color: String,
        pub inner: Option<Inner>,
        pub packed: Vec<i64>,
        pub inners: Vec<Inner>,
        pub counts: BTreeMap<String, i64>,
        pub maybe: Option<i64>,
        pub names: Vec<String>,
        pub loose: Vec<i32>,
    }

    pub(in super::super) fn descriptor() -> MessageDescriptor {
        let registry =
            crate::io::registry::Registry::new(crate::io::registry::RegistryConfig::new("http://127.0.0.1:1")).unwrap();
        let schema = crate::io::registry::Schema {
            kind: crate::io::registry::SchemaKind::Protobuf,
            text: ALL.into(),
            references: Vec::new(),
        };
        let file = super::super::compile(&registry, "test", &schema).unwrap();
        file.messages().find(|m| m.name() == "All").unwrap()
    }

    /// A record using every field, and the same as prost-reflect's JSON.
    pub(in super::super) fn sample() -> (serde_json::Value, All) {
        let json = serde_json::json!({
            "d": 1.5, "f": -2.25, "i32": -3, "i64": "-4000000000000", "u32": 5, "u64": "18446744073709551615",
            "s32": -7, "s64": "-8", "fx32": 9, "fx64": "10", "sf32": -11, "sf64": "-12", "b": true,
            "s": "héllo", "by": "AAEC/w==", "color": "GREEN", "inner": {"name": "in", "delta": -1},
            "packed": [1, -2, 300], "inners": [{"name": "a"}, {"delta": 2}], "counts": {"x": 1, "y": -2},
            "maybe": "0", "names": ["p", "q"], "loose": [-1, 1]
        });
        let want = All {
            d: 1.5,
            f: -2.25,
            i32: -3,
            i64: -4_000_000_000_000,
            u32: 5,
            u64: u64::MAX,
            s32: -7,
            s64: -8,
            fx32: 9,
            fx64: 10,
            sf32: -11,
            sf64: -12,
            b: true,
            s: "héllo".into(),
            by: vec![0, 1, 2, 255],
            color: "GREEN".into(),
            inner: Some(Inner { name: "in".into(), delta: -1 }),
            packed: vec![1, -2, 300],
            inners: vec![Inner { name: "a".into(), delta: 0 }, Inner { name: String::new(), delta: 2 }],
            counts: [("x".to_owned(), 1), ("y".to_owned(), -2)].into(),
            maybe: Some(0),
            names: vec!["p".into(), "q".into()],
            loose: vec![-1, 1],
        };
        (json, want)
    }

    /// Every scalar kind, a nested message, packed and unpacked repeated fields, a map, an
    /// explicit optional: what prost-reflect writes, the wire reader reads back.
    #[test]
    fn reads_every_kind_as_written() {
        let desc = descriptor();
        let (json, want) = sample();
        let message = prost_reflect::DynamicMessage::deserialize(desc.clone(), json).unwrap();
        let bytes = message.encode_to_vec();
        let got = All::deserialize(MessageDe::new(&desc, &bytes)).unwrap();
        assert_eq!(got, want);
        // Nothing on the wire: proto3's defaults, none for the message and the optional.
        let empty = All::deserialize(MessageDe::new(&desc, &[])).unwrap();
        assert_eq!(empty, All { color: "RED".into(), ..All::default() });
    }

    /// A singular message field sent twice is the merge of both, as protobuf reads it.
    #[test]
    fn merges_a_message_sent_twice() {
        let desc = descriptor();
        let bytes = [0x8a, 0x01, 4, 0x0a, 2, b'a', b'b', 0x8a, 0x01, 2, 0x10, 3];
        let got = All::deserialize(MessageDe::new(&desc, &bytes)).unwrap();
        assert_eq!(got.inner, Some(Inner { name: "ab".into(), delta: -2 }));
    }

    /// Cut or hostile bytes are errors, never a panic or a loop.
    #[test]
    fn refuses_broken_wire() {
        let desc = descriptor();
        for bytes in [&[0x08][..], &[0x7a, 0x05, 1], &[0x0b], &[0x00, 0x01], &[0xff; 11], &[0x82, 0x01, 0x02, 0x80]] {
            let e = All::deserialize(MessageDe::new(&desc, bytes));
            assert!(e.is_err(), "{bytes:?}");
        }
        // A string field that is not UTF-8; a varint where the schema says bytes.
        let e = All::deserialize(MessageDe::new(&desc, &[0x72, 0x01, 0xff])).unwrap_err();
        assert!(e.to_string().contains("field s") && e.to_string().contains("UTF-8"), "{e}");
        let e = All::deserialize(MessageDe::new(&desc, &[0x78, 0x01])).unwrap_err();
        assert!(e.to_string().contains("field by"), "{e}");
    }
}
