//! Protobuf's wire format read straight into a serde type, by the message's plan
//! (`plan.rs`): no dynamic message, no value tree. A message is scanned once (field number
//! and raw value of every field on the wire, on the stack for small messages), then shown
//! to the record's visitor as a map of the descriptor's fields in declaration order, by
//! proto field name: each field's last occurrence (a message field's occurrences merged, as
//! protobuf does; repeated ones, packed or not, as a sequence; map fields as a map), and a
//! field that is not on the wire as proto3 reads it — its default (0, "", false, the enum's
//! first value), or none for a message or an explicitly optional field. Enums are their
//! value's name, bytes are bytes, nested messages (well-known types too) are maps.

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use smallvec::SmallVec;

use super::plan::{FieldPlan, Plans, Shape, Ty};
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

/// The largest field number protobuf allows.
const MAX_FIELD_NUMBER: u32 = (1 << 29) - 1;

/// Append the fields of `input` to `out`.
fn scan_into<'de>(mut input: &'de [u8], out: &mut Scan<'de>) -> Result<(), WireError> {
    while !input.is_empty() {
        let tag = varint(&mut input)?;
        // Field numbers go up to 2^29 − 1: a tag is a 32-bit varint.
        let number =
            u32::try_from(tag).ok().map(|t| t >> 3).filter(|&n| n <= MAX_FIELD_NUMBER).ok_or_else(|| {
                WireError(format!("field number {} too large (at most {MAX_FIELD_NUMBER})", tag >> 3))
            })?;
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
    plans: &'a Plans,
    msg: usize,
    /// The message's occurrences on the wire: a singular message field that appears more than
    /// once is the merge of them all, which is the same as reading them one after the other.
    parts: SmallVec<[&'de [u8]; 1]>,
    depth: u32,
}

impl<'a, 'de> MessageDe<'a, 'de> {
    /// The top-level message `bytes` of type `msg` (an index into `plans`).
    pub(super) fn new(plans: &'a Plans, msg: usize, bytes: &'de [u8]) -> MessageDe<'a, 'de> {
        MessageDe { plans, msg, parts: SmallVec::from_slice(&[bytes]), depth: 0 }
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
        let fields = &self.plans.messages[self.msg].fields;
        visitor.visit_map(Fields { plans: self.plans, fields, scan, next: 0, depth: self.depth })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

struct Fields<'a, 'de> {
    plans: &'a Plans,
    fields: &'a [FieldPlan],
    scan: Scan<'de>,
    next: usize,
    depth: u32,
}

impl<'de> MapAccess<'de> for Fields<'_, 'de> {
    type Error = WireError;

    fn next_key_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, WireError> {
        let Some(field) = self.fields.get(self.next) else { return Ok(None) };
        seed.deserialize((&*field.name).into_deserializer()).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, WireError> {
        let field = &self.fields[self.next];
        self.next += 1;
        let at = FieldDe { plans: self.plans, field, scan: &self.scan, depth: self.depth };
        seed.deserialize(at).map_err(|e| WireError(format!("field {}: {e}", field.name)))
    }
}

/// One field of a scanned message: its occurrences on the wire.
struct FieldDe<'a, 'de> {
    plans: &'a Plans,
    field: &'a FieldPlan,
    scan: &'a Scan<'de>,
    depth: u32,
}

impl<'a, 'de> FieldDe<'a, 'de> {
    fn occurrences(&self) -> impl Iterator<Item = Wire<'de>> + 'a {
        let number = self.field.number;
        self.scan.iter().filter(move |(n, _)| *n == number).map(|(_, w)| *w)
    }

    fn last(&self) -> Option<Wire<'de>> {
        self.scan.iter().rev().find(|(n, _)| *n == self.field.number).map(|(_, w)| *w)
    }

    /// The value of a singular field: its last occurrence (protobuf's "last one wins"), once
    /// every earlier one was found to be a value of the field's type too — a field sent
    /// twice, once as a varint and once as a fixed64, is broken wire, not a record (as
    /// prost-reflect reads it).
    fn single(&self) -> Result<Option<Wire<'de>>, WireError> {
        let mut last = None;
        for wire in self.occurrences() {
            if let Some(earlier) = last.replace(wire)
                && !fits(self.field.kind, &earlier)
            {
                return err(format!(
                    "an earlier occurrence is a {} that the field's type does not take",
                    wire_name(&earlier)
                ));
            }
        }
        Ok(last)
    }
}

/// Whether `wire` is a value of `kind` (what `ValueDe` reads without an error, but for an
/// enum's unknown number, which proto3 keeps).
fn fits(kind: Ty, wire: &Wire<'_>) -> bool {
    match (kind, wire) {
        (Ty::Double | Ty::Fixed64 | Ty::Sfixed64, w) => matches!(w, Wire::Fixed64(_)),
        (Ty::Float | Ty::Fixed32 | Ty::Sfixed32, w) => matches!(w, Wire::Fixed32(_)),
        (Ty::String, Wire::Bytes(b)) => std::str::from_utf8(b).is_ok(),
        (Ty::String | Ty::Bytes | Ty::Message(_), w) => matches!(w, Wire::Bytes(_)),
        (_, w) => matches!(w, Wire::Varint(_)),
    }
}

impl<'de> Deserializer<'de> for FieldDe<'_, 'de> {
    type Error = WireError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        let (plans, kind, depth) = (self.plans, self.field.kind, self.depth);
        match self.field.shape {
            Shape::Map { key, value } => {
                let entries: SmallVec<[&'de [u8]; 8]> = self
                    .occurrences()
                    .map(|w| match w {
                        Wire::Bytes(b) => Ok(b),
                        _ => err("a map entry that is not length-delimited"),
                    })
                    .collect::<Result<_, _>>()?;
                visitor.visit_map(Entries { plans, key, value, entries, next: 0, pending: None, depth })
            }
            Shape::List { .. } => {
                let mut elements: SmallVec<[Wire<'de>; 16]> = SmallVec::new();
                for w in self.occurrences() {
                    match (w, packed_width(kind)) {
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
                visitor.visit_seq(Elements { plans, kind, elements, next: 0, depth })
            }
            Shape::Single { .. } => {
                if let Ty::Message(msg) = kind {
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
                    return MessageDe { plans, msg, parts, depth: depth + 1 }.deserialize_any(visitor);
                }
                match self.single()? {
                    Some(wire) => ValueDe { plans, kind, wire, depth }.deserialize_any(visitor),
                    None => default(plans, kind, visitor),
                }
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        if self.field.shape == (Shape::Single { presence: true }) && self.last().is_none() {
            return visitor.visit_none();
        }
        visitor.visit_some(self)
    }

    /// A `bytes` field read as a sequence (`Vec<u8>`), else as any.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        if self.field.kind == Ty::Bytes && matches!(self.field.shape, Shape::Single { .. }) {
            return match self.single()? {
                Some(wire) => {
                    ValueDe { plans: self.plans, kind: Ty::Bytes, wire, depth: self.depth }.deserialize_seq(visitor)
                }
                None => visitor.visit_seq(de::value::SeqDeserializer::new(std::iter::empty::<u8>())),
            };
        }
        self.deserialize_any(visitor)
    }

    /// An enum field into a Rust enum: its value's name as a unit variant.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, WireError> {
        match (self.field.kind, self.field.shape) {
            (Ty::Enum(_), Shape::Single { .. }) => match self.single()? {
                Some(wire) => ValueDe { plans: self.plans, kind: self.field.kind, wire, depth: self.depth }
                    .deserialize_enum(name, variants, visitor),
                None => Absent(self.plans, self.field.kind).deserialize_enum(name, variants, visitor),
            },
            _ => self.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct newtype_struct tuple tuple_struct map struct identifier ignored_any
    }
}

/// The element width of a packed repeated scalar (0: varints), or none if it cannot pack.
fn packed_width(kind: Ty) -> Option<usize> {
    match kind {
        Ty::Double | Ty::Fixed64 | Ty::Sfixed64 => Some(8),
        Ty::Float | Ty::Fixed32 | Ty::Sfixed32 => Some(4),
        Ty::Int32 | Ty::Int64 | Ty::Uint32 | Ty::Uint64 | Ty::Sint32 | Ty::Sint64 | Ty::Bool | Ty::Enum(_) => Some(0),
        Ty::String | Ty::Bytes | Ty::Message(_) => None,
    }
}

/// A field that is not on the wire, as proto3 reads it.
fn default<'de, V: Visitor<'de>>(plans: &Plans, kind: Ty, visitor: V) -> Result<V::Value, WireError> {
    match kind {
        Ty::Double | Ty::Float => visitor.visit_f64(0.0),
        Ty::Uint32 | Ty::Uint64 | Ty::Fixed32 | Ty::Fixed64 => visitor.visit_u64(0),
        Ty::Int32 | Ty::Int64 | Ty::Sint32 | Ty::Sint64 | Ty::Sfixed32 | Ty::Sfixed64 => visitor.visit_i64(0),
        Ty::Bool => visitor.visit_bool(false),
        Ty::String => visitor.visit_borrowed_str(""),
        Ty::Bytes => visitor.visit_borrowed_bytes(&[]),
        Ty::Enum(e) => match plans.enums[e].values.first() {
            Some((_, name)) => visitor.visit_str(name),
            None => visitor.visit_i32(0),
        },
        Ty::Message(_) => visitor.visit_none(),
    }
}

/// One value of a field.
struct ValueDe<'a, 'de> {
    plans: &'a Plans,
    kind: Ty,
    wire: Wire<'de>,
    depth: u32,
}

impl<'de> Deserializer<'de> for ValueDe<'_, 'de> {
    type Error = WireError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        let wrong =
            |expected: &str| err(format!("a {:?} on the wire where the schema says {expected}", wire_name(&self.wire)));
        match (self.kind, self.wire) {
            (Ty::Double, Wire::Fixed64(v)) => visitor.visit_f64(f64::from_bits(v)),
            (Ty::Float, Wire::Fixed32(v)) => visitor.visit_f32(f32::from_bits(v)),
            (Ty::Fixed64, Wire::Fixed64(v)) => visitor.visit_u64(v),
            (Ty::Sfixed64, Wire::Fixed64(v)) => visitor.visit_i64(v as i64),
            (Ty::Fixed32, Wire::Fixed32(v)) => visitor.visit_u32(v),
            (Ty::Sfixed32, Wire::Fixed32(v)) => visitor.visit_i32(v as i32),
            (Ty::Int64, Wire::Varint(v)) => visitor.visit_i64(v as i64),
            (Ty::Uint64, Wire::Varint(v)) => visitor.visit_u64(v),
            (Ty::Int32, Wire::Varint(v)) => visitor.visit_i32(v as i32),
            (Ty::Uint32, Wire::Varint(v)) => visitor.visit_u32(v as u32),
            (Ty::Sint64, Wire::Varint(v)) => visitor.visit_i64(((v >> 1) as i64) ^ -((v & 1) as i64)),
            (Ty::Sint32, Wire::Varint(v)) => {
                let v = v as u32;
                visitor.visit_i32(((v >> 1) as i32) ^ -((v & 1) as i32))
            }
            (Ty::Bool, Wire::Varint(v)) => visitor.visit_bool(v != 0),
            (Ty::Enum(e), Wire::Varint(v)) => match self.plans.enums[e].name_of(v as i32) {
                Some(name) => visitor.visit_str(name),
                None => visitor.visit_i32(v as i32),
            },
            (Ty::String, Wire::Bytes(b)) => match std::str::from_utf8(b) {
                Ok(s) => visitor.visit_borrowed_str(s),
                Err(e) => err(format!("a string that is not UTF-8 ({e})")),
            },
            (Ty::Bytes, Wire::Bytes(b)) => visitor.visit_borrowed_bytes(b),
            (Ty::Message(msg), Wire::Bytes(b)) => {
                let parts = SmallVec::from_slice(&[b]);
                MessageDe { plans: self.plans, msg, parts, depth: self.depth + 1 }.deserialize_any(visitor)
            }
            (Ty::Double | Ty::Fixed64 | Ty::Sfixed64, _) => wrong("a 64-bit fixed value"),
            (Ty::Float | Ty::Fixed32 | Ty::Sfixed32, _) => wrong("a 32-bit fixed value"),
            (Ty::String | Ty::Bytes | Ty::Message(_), _) => wrong("length-delimited bytes"),
            _ => wrong("a varint"),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        visitor.visit_some(self)
    }

    /// `bytes` as a sequence of u8 (`Vec<u8>`), else as any.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        match (self.kind, self.wire) {
            (Ty::Bytes, Wire::Bytes(b)) => visitor.visit_seq(de::value::SeqDeserializer::new(b.iter().copied())),
            _ => self.deserialize_any(visitor),
        }
    }

    /// An enum value into a Rust enum: its name as a unit variant.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, WireError> {
        match (self.kind, self.wire) {
            (Ty::Enum(e), Wire::Varint(v)) => match self.plans.enums[e].name_of(v as i32) {
                Some(name) => visitor.visit_enum(name.into_deserializer()),
                None => err(format!("{} is not a value of the enum {}", v as i32, self.plans.enums[e].full_name)),
            },
            _ => self.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct newtype_struct tuple tuple_struct map struct identifier ignored_any
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

struct Elements<'a, 'de> {
    plans: &'a Plans,
    kind: Ty,
    elements: SmallVec<[Wire<'de>; 16]>,
    next: usize,
    depth: u32,
}

impl<'de> SeqAccess<'de> for Elements<'_, 'de> {
    type Error = WireError;

    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, WireError> {
        let Some(&wire) = self.elements.get(self.next) else { return Ok(None) };
        self.next += 1;
        seed.deserialize(ValueDe { plans: self.plans, kind: self.kind, wire, depth: self.depth }).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.elements.len() - self.next)
    }
}

/// A map field: its entry messages (key = field 1, value = field 2).
struct Entries<'a, 'de> {
    plans: &'a Plans,
    key: Ty,
    value: Ty,
    entries: SmallVec<[&'de [u8]; 8]>,
    next: usize,
    pending: Option<Scan<'de>>,
    depth: u32,
}

/// The last occurrence of field `number` in a scanned entry.
fn part<'de>(scan: &Scan<'de>, number: u32) -> Option<Wire<'de>> {
    scan.iter().rev().find(|(n, _)| *n == number).map(|(_, w)| *w)
}

impl<'de> MapAccess<'de> for Entries<'_, 'de> {
    type Error = WireError;

    fn next_key_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, WireError> {
        let Some(&bytes) = self.entries.get(self.next) else { return Ok(None) };
        self.next += 1;
        let entry = scan(bytes)?;
        let (plans, kind, depth) = (self.plans, self.key, self.depth);
        let key = match part(&entry, 1) {
            Some(wire) => seed.deserialize(ValueDe { plans, kind, wire, depth })?,
            None => seed.deserialize(Absent(plans, kind))?,
        };
        self.pending = Some(entry);
        Ok(Some(key))
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, WireError> {
        let entry = self.pending.take().ok_or_else(|| WireError("a map value before its key".into()))?;
        let (plans, kind, depth) = (self.plans, self.value, self.depth);
        match part(&entry, 2) {
            Some(wire) => seed.deserialize(ValueDe { plans, kind, wire, depth }),
            None => seed.deserialize(Absent(plans, kind)),
        }
    }
}

/// A value that is not on the wire: its default.
struct Absent<'a>(&'a Plans, Ty);

impl<'de> Deserializer<'de> for Absent<'_> {
    type Error = WireError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WireError> {
        default(self.0, self.1, visitor)
    }

    /// An absent enum into a Rust enum: its first value, as proto3 reads it.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, WireError> {
        match self.1 {
            Ty::Enum(e) => match self.0.enums[e].values.first() {
                Some((_, name)) => visitor.visit_enum((&**name).into_deserializer()),
                None => err(format!("the enum {} has no values", self.0.enums[e].full_name)),
            },
            _ => self.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
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

    /// The test schema compiled: its descriptor, and its plans with the index of `All`.
    pub(in super::super) fn descriptor() -> (prost_reflect::MessageDescriptor, Plans, usize) {
        let registry =
            crate::io::registry::Registry::new(crate::io::registry::RegistryConfig::new("http://127.0.0.1:1")).unwrap();
        let schema = crate::io::registry::Schema {
            kind: crate::io::registry::SchemaKind::Protobuf,
            text: ALL.into(),
            references: Vec::new(),
        };
        let file = super::super::compile(&registry, "test", &schema).unwrap();
        let desc = file.messages().find(|m| m.name() == "All").unwrap();
        let plans = Plans::new(file.parent_pool());
        let msg = plans.message("t.All").unwrap();
        (desc, plans, msg)
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
        let (desc, plans, msg) = descriptor();
        let (json, want) = sample();
        let message = prost_reflect::DynamicMessage::deserialize(desc.clone(), json).unwrap();
        let bytes = message.encode_to_vec();
        let got = All::deserialize(MessageDe::new(&plans, msg, &bytes)).unwrap();
        assert_eq!(got, want);
        // Nothing on the wire: proto3's defaults, none for the message and the optional.
        let empty = All::deserialize(MessageDe::new(&plans, msg, &[])).unwrap();
        assert_eq!(empty, All { color: "RED".into(), ..All::default() });
    }

    /// An enum field read into a Rust enum (present, and absent: the first value).
    #[test]
    fn enums_read_into_rust_enums() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        #[serde(rename_all = "UPPERCASE")]
        enum Color {
            Red,
            Green,
        }
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Colored {
            color: Color,
        }
        let (_, plans, msg) = descriptor();
        let green = Colored::deserialize(MessageDe::new(&plans, msg, &[0x80, 0x01, 1])).unwrap();
        assert_eq!(green, Colored { color: Color::Green });
        let absent = Colored::deserialize(MessageDe::new(&plans, msg, &[])).unwrap();
        assert_eq!(absent, Colored { color: Color::Red });
        let e = Colored::deserialize(MessageDe::new(&plans, msg, &[0x80, 0x01, 7])).unwrap_err();
        assert!(e.to_string().contains("7 is not a value of the enum t.Color"), "{e}");
    }

    /// A singular message field sent twice is the merge of both, as protobuf reads it.
    #[test]
    fn merges_a_message_sent_twice() {
        let (_, plans, msg) = descriptor();
        let bytes = [0x8a, 0x01, 4, 0x0a, 2, b'a', b'b', 0x8a, 0x01, 2, 0x10, 3];
        let got = All::deserialize(MessageDe::new(&plans, msg, &bytes)).unwrap();
        assert_eq!(got.inner, Some(Inner { name: "ab".into(), delta: -2 }));
    }

    /// Cut or hostile bytes are errors, never a panic or a loop.
    #[test]
    fn refuses_broken_wire() {
        let (_, plans, msg) = descriptor();
        for bytes in [&[0x08][..], &[0x7a, 0x05, 1], &[0x0b], &[0x00, 0x01], &[0xff; 11], &[0x82, 0x01, 0x02, 0x80]] {
            let e = All::deserialize(MessageDe::new(&plans, msg, bytes));
            assert!(e.is_err(), "{bytes:?}");
        }
        // A string field that is not UTF-8; a varint where the schema says bytes.
        let e = All::deserialize(MessageDe::new(&plans, msg, &[0x72, 0x01, 0xff])).unwrap_err();
        assert!(e.to_string().contains("field s") && e.to_string().contains("UTF-8"), "{e}");
        let e = All::deserialize(MessageDe::new(&plans, msg, &[0x78, 0x01])).unwrap_err();
        assert!(e.to_string().contains("field by"), "{e}");
        // Field 10 sent twice, first as a varint, then as what its type takes (proptest
        // found it: prost-reflect refuses, and only the last occurrence used to be read).
        let bytes = [80, 0, 81, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(prost_reflect::DynamicMessage::decode(descriptor().0, &bytes[..]).is_err());
        let e = All::deserialize(MessageDe::new(&plans, msg, &bytes)).unwrap_err();
        assert!(e.to_string().contains("earlier occurrence is a varint"), "{e}");
        // A tag past 32 bits (field number 2^29 + 5): refused, as prost-reflect does.
        let bytes = [169, 128, 128, 128, 16, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(prost_reflect::DynamicMessage::decode(descriptor().0, &bytes[..]).is_err());
        let e = All::deserialize(MessageDe::new(&plans, msg, &bytes)).unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
    }

    proptest::proptest! {
        /// Bytes from a hostile peer: an error or a record, never a panic, a hang or a read
        /// out of bounds; and what prost-reflect refuses is never read as a record.
        #[test]
        fn any_bytes_are_safe(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let (desc, plans, msg) = descriptor();
            let ours = All::deserialize(MessageDe::new(&plans, msg, &bytes));
            if prost_reflect::DynamicMessage::decode(desc, &bytes[..]).is_err() {
                proptest::prop_assert!(ours.is_err());
            }
        }

        /// Valid messages with their bytes cut anywhere: errors or records, never a panic.
        #[test]
        fn cut_messages_are_safe(cut in 0usize..200) {
            let (desc, plans, msg) = descriptor();
            let (json, _) = sample();
            let bytes = prost_reflect::DynamicMessage::deserialize(desc, json).unwrap().encode_to_vec();
            let _ = All::deserialize(MessageDe::new(&plans, msg, &bytes[..cut.min(bytes.len())]));
        }
    }
}
