//! A serde type written as Protobuf's wire format by the message's plan (`plan.rs`): no
//! dynamic message, no value tree. The record's fields are matched to the message's by
//! proto field name (or JSON name) and written in the order the record gives them; a record
//! field the message lacks is an error (it would be lost). As proto3 writes them, singular
//! fields without presence are left out at their default (0, "", false, the enum's first
//! value), explicitly optional ones are written when `Some`; repeated scalars are packed;
//! map fields are entries of key 1 and value 2. Enums are written from their value's name
//! (a string or a unit variant) or number; `bytes` from `Vec<u8>`, serde bytes or a string.
//!
//! A nested message's length goes before it: one byte is kept for it and the body moved
//! only when it is 128 bytes or longer.

use serde::ser::{self, Impossible, Serialize, Serializer};

use super::plan::{FieldPlan, Plans, Shape, Ty};
use super::{WireError, err};

/// Write `value` as the body of a message of type `msg` (an index into `plans`; no tag, no
/// length) at the end of `out`.
pub(super) fn write_message<T: Serialize + ?Sized>(
    plans: &Plans,
    msg: usize,
    value: &T,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    value.serialize(ValueSer { plans, kind: Ty::Message(msg), number: None, skip_default: false, out })
}

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_tag(number: u32, wire: u32, out: &mut Vec<u8>) {
    put_varint(u64::from(number << 3 | wire), out);
}

/// Keep a byte for the length of what follows; [`close`] writes it.
fn open(out: &mut Vec<u8>) -> usize {
    out.push(0);
    out.len()
}

/// Write the length of everything after `at` (from [`open`]) in front of it.
fn close(at: usize, out: &mut Vec<u8>) {
    let len = out.len() - at;
    if len < 0x80 {
        out[at - 1] = len as u8;
        return;
    }
    let mut prefix = Vec::with_capacity(10);
    put_varint(len as u64, &mut prefix);
    out.splice(at - 1..at, prefix);
}

/// A length-delimited field: tag (when there is one), length, bytes.
fn put_bytes(number: Option<u32>, bytes: &[u8], out: &mut Vec<u8>) {
    if let Some(n) = number {
        put_tag(n, LEN, out);
    }
    put_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn in_range(v: i128, lo: i128, hi: i128, plans: &Plans, kind: Ty) -> Result<(), WireError> {
    if (lo..=hi).contains(&v) { Ok(()) } else { err(format!("{v} is out of range for {}", plans.kind_name(kind))) }
}

/// One value of a field (`number`; `None`: an element of a packed field, or the top-level
/// message's body). `skip_default`: a field without presence, left out at its default.
struct ValueSer<'a> {
    plans: &'a Plans,
    kind: Ty,
    number: Option<u32>,
    skip_default: bool,
    out: &'a mut Vec<u8>,
}

impl<'a> ValueSer<'a> {
    fn refuse<T>(&self, what: &str) -> Result<T, WireError> {
        err(format!("{what} where the schema says {}", self.plans.kind_name(self.kind)))
    }

    fn tag(&mut self, wire: u32) {
        if let Some(n) = self.number {
            put_tag(n, wire, self.out);
        }
    }

    fn int(mut self, v: i128) -> Result<(), WireError> {
        if self.skip_default && v == 0 {
            return match self.kind {
                Ty::String | Ty::Bytes | Ty::Message(_) | Ty::Bool => self.refuse("an integer"),
                _ => Ok(()),
            };
        }
        match self.kind {
            Ty::Int32 | Ty::Enum(_) => {
                in_range(v, i32::MIN.into(), i32::MAX.into(), self.plans, self.kind)?;
                self.tag(VARINT);
                put_varint(v as i64 as u64, self.out);
            }
            Ty::Int64 => {
                in_range(v, i64::MIN.into(), i64::MAX.into(), self.plans, self.kind)?;
                self.tag(VARINT);
                put_varint(v as i64 as u64, self.out);
            }
            Ty::Uint32 => {
                in_range(v, 0, u32::MAX.into(), self.plans, self.kind)?;
                self.tag(VARINT);
                put_varint(v as u64, self.out);
            }
            Ty::Uint64 => {
                in_range(v, 0, u64::MAX.into(), self.plans, self.kind)?;
                self.tag(VARINT);
                put_varint(v as u64, self.out);
            }
            Ty::Sint32 => {
                in_range(v, i32::MIN.into(), i32::MAX.into(), self.plans, self.kind)?;
                let v = v as i32;
                self.tag(VARINT);
                put_varint(u64::from(((v << 1) ^ (v >> 31)) as u32), self.out);
            }
            Ty::Sint64 => {
                in_range(v, i64::MIN.into(), i64::MAX.into(), self.plans, self.kind)?;
                let v = v as i64;
                self.tag(VARINT);
                put_varint(((v << 1) ^ (v >> 63)) as u64, self.out);
            }
            Ty::Fixed32 | Ty::Sfixed32 => {
                if self.kind == Ty::Fixed32 {
                    in_range(v, 0, u32::MAX.into(), self.plans, self.kind)?;
                } else {
                    in_range(v, i32::MIN.into(), i32::MAX.into(), self.plans, self.kind)?;
                }
                self.tag(FIXED32);
                self.out.extend_from_slice(&(v as u32).to_le_bytes());
            }
            Ty::Fixed64 | Ty::Sfixed64 => {
                if self.kind == Ty::Fixed64 {
                    in_range(v, 0, u64::MAX.into(), self.plans, self.kind)?;
                } else {
                    in_range(v, i64::MIN.into(), i64::MAX.into(), self.plans, self.kind)?;
                }
                self.tag(FIXED64);
                self.out.extend_from_slice(&(v as u64).to_le_bytes());
            }
            Ty::Double => return self.float(v as f64),
            Ty::Float => return self.float(v as f32 as f64),
            _ => return self.refuse("an integer"),
        }
        Ok(())
    }

    fn float(mut self, v: f64) -> Result<(), WireError> {
        match self.kind {
            Ty::Double => {
                if !(self.skip_default && v.to_bits() == 0) {
                    self.tag(FIXED64);
                    self.out.extend_from_slice(&v.to_le_bytes());
                }
            }
            Ty::Float => {
                let v = v as f32;
                if !(self.skip_default && v.to_bits() == 0) {
                    self.tag(FIXED32);
                    self.out.extend_from_slice(&v.to_le_bytes());
                }
            }
            _ => return self.refuse("a floating-point number"),
        }
        Ok(())
    }

    fn bytes(self, v: &[u8]) -> Result<(), WireError> {
        if !matches!(self.kind, Ty::Bytes | Ty::String) {
            return self.refuse("bytes");
        }
        if self.kind == Ty::String && std::str::from_utf8(v).is_err() {
            return err("bytes that are not UTF-8 where the schema says a string");
        }
        if !(self.skip_default && v.is_empty()) {
            put_bytes(self.number, v, self.out);
        }
        Ok(())
    }

    /// A nested message's fields, after its tag and length.
    fn message(mut self) -> Result<FieldsSer<'a>, WireError> {
        let Ty::Message(msg) = self.kind else { return self.refuse("a struct or a map") };
        let at = match self.number {
            Some(_) => {
                self.tag(LEN);
                Some(open(self.out))
            }
            None => None,
        };
        Ok(FieldsSer { plans: self.plans, msg, out: self.out, at, key: None, next: 0 })
    }
}

impl<'a> Serializer for ValueSer<'a> {
    type Ok = ();
    type Error = WireError;
    type SerializeSeq = BytesSer<'a>;
    type SerializeTuple = Impossible<(), WireError>;
    type SerializeTupleStruct = Impossible<(), WireError>;
    type SerializeTupleVariant = Impossible<(), WireError>;
    type SerializeMap = FieldsSer<'a>;
    type SerializeStruct = FieldsSer<'a>;
    type SerializeStructVariant = Impossible<(), WireError>;

    fn serialize_bool(mut self, v: bool) -> Result<(), WireError> {
        if self.kind != Ty::Bool {
            return self.refuse("a bool");
        }
        if v || !self.skip_default {
            self.tag(VARINT);
            self.out.push(u8::from(v));
        }
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), WireError> {
        self.int(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), WireError> {
        self.int(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), WireError> {
        self.int(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), WireError> {
        self.int(v.into())
    }
    fn serialize_i128(self, v: i128) -> Result<(), WireError> {
        self.int(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), WireError> {
        self.int(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), WireError> {
        self.int(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), WireError> {
        self.int(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), WireError> {
        self.int(v.into())
    }
    fn serialize_u128(self, v: u128) -> Result<(), WireError> {
        match i128::try_from(v) {
            Ok(v) => self.int(v),
            Err(_) => err(format!("{v} is out of range for {}", self.plans.kind_name(self.kind))),
        }
    }
    fn serialize_f32(self, v: f32) -> Result<(), WireError> {
        self.float(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), WireError> {
        self.float(v)
    }
    fn serialize_char(self, v: char) -> Result<(), WireError> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(mut self, v: &str) -> Result<(), WireError> {
        match self.kind {
            Ty::String | Ty::Bytes => self.bytes(v.as_bytes()),
            Ty::Enum(e) => {
                let plan = &self.plans.enums[e];
                let Some(number) = plan.number_of(v) else {
                    let names: Vec<&str> = plan.values.iter().map(|(_, name)| &**name).collect();
                    return err(format!("{v:?} is not a value of the enum {} ({})", plan.full_name, names.join(", ")));
                };
                if !(self.skip_default && number == 0) {
                    self.tag(VARINT);
                    put_varint(number as i64 as u64, self.out);
                }
                Ok(())
            }
            _ => self.refuse("a string"),
        }
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), WireError> {
        self.bytes(v)
    }

    fn serialize_none(self) -> Result<(), WireError> {
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), WireError> {
        // `Some` is on the wire even at the default (an explicitly optional field).
        value.serialize(ValueSer { skip_default: false, ..self })
    }

    fn serialize_unit(self) -> Result<(), WireError> {
        Ok(())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), WireError> {
        Ok(())
    }

    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<(), WireError> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), WireError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: &T,
    ) -> Result<(), WireError> {
        self.refuse(&format!("the enum variant {variant} with data"))
    }

    /// `Vec<u8>` into a `bytes` field.
    fn serialize_seq(self, len: Option<usize>) -> Result<BytesSer<'a>, WireError> {
        if self.kind != Ty::Bytes {
            return self.refuse("a sequence");
        }
        Ok(BytesSer { bytes: Vec::with_capacity(len.unwrap_or(0)), value: self })
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, WireError> {
        self.refuse("a tuple")
    }

    fn serialize_tuple_struct(self, name: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, WireError> {
        self.refuse(&format!("the tuple struct {name}"))
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, WireError> {
        self.refuse(&format!("the enum variant {variant} with data"))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<FieldsSer<'a>, WireError> {
        self.message()
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<FieldsSer<'a>, WireError> {
        self.message()
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, WireError> {
        self.refuse(&format!("the enum variant {variant} with data"))
    }
}

/// A `Vec<u8>` (a sequence of u8) gathered, then written as one `bytes` value.
struct BytesSer<'a> {
    bytes: Vec<u8>,
    value: ValueSer<'a>,
}

impl ser::SerializeSeq for BytesSer<'_> {
    type Ok = ();
    type Error = WireError;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WireError> {
        // Each element is taken as a fixed32 (any integer type, range-checked), then as a u8.
        let mut byte = Vec::with_capacity(4);
        let plans = self.value.plans;
        value.serialize(ValueSer { plans, kind: Ty::Fixed32, number: None, skip_default: false, out: &mut byte })?;
        let number = <[u8; 4]>::try_from(&byte[..]).map(u32::from_le_bytes);
        match number.map(u8::try_from) {
            Ok(Ok(b)) => {
                self.bytes.push(b);
                Ok(())
            }
            _ => err("a sequence of other things than bytes where the schema says bytes"),
        }
    }

    fn end(self) -> Result<(), WireError> {
        self.value.bytes(&self.bytes)
    }
}

/// A message's fields, from a struct or a map; its length written at the end.
struct FieldsSer<'a> {
    plans: &'a Plans,
    msg: usize,
    out: &'a mut Vec<u8>,
    /// Where the length goes (from [`open`]); none for the top-level message.
    at: Option<usize>,
    /// The key of a map's entry, until its value comes.
    key: Option<String>,
    /// The field after the last one written: a struct whose fields follow the message's
    /// order finds each there, without a lookup by name.
    next: usize,
}

impl FieldsSer<'_> {
    fn field<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<(), WireError> {
        let message = &self.plans.messages[self.msg];
        let index = match message.fields.get(self.next) {
            Some(f) if *f.name == *name => self.next,
            _ => message.field_named(name).ok_or_else(|| {
                WireError(format!(
                    "the message {} has no field {name} (a record field the schema lacks would be lost)",
                    message.full_name
                ))
            })?,
        };
        self.next = index + 1;
        let field = &message.fields[index];
        value
            .serialize(FieldSer { plans: self.plans, field, out: self.out })
            .map_err(|e| WireError(format!("field {name}: {e}")))
    }

    fn finish(self) -> Result<(), WireError> {
        if let Some(at) = self.at {
            close(at, self.out);
        }
        Ok(())
    }
}

impl ser::SerializeStruct for FieldsSer<'_> {
    type Ok = ();
    type Error = WireError;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) -> Result<(), WireError> {
        self.field(name, value)
    }

    fn end(self) -> Result<(), WireError> {
        self.finish()
    }
}

impl ser::SerializeMap for FieldsSer<'_> {
    type Ok = ();
    type Error = WireError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), WireError> {
        self.key = Some(key.serialize(KeyName)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WireError> {
        let Some(name) = self.key.take() else { return err("a map value before its key") };
        self.field(&name, value)
    }

    fn end(self) -> Result<(), WireError> {
        self.finish()
    }
}

/// One field of a message: repeated and map fields take sequences and maps, the others one
/// value.
struct FieldSer<'a> {
    plans: &'a Plans,
    field: &'a FieldPlan,
    out: &'a mut Vec<u8>,
}

impl<'a> FieldSer<'a> {
    /// The field as one value; refused for a repeated or map field.
    fn single(self, what: &str) -> Result<ValueSer<'a>, WireError> {
        match self.field.shape {
            Shape::Map { .. } => err(format!("{what} where the field is a map")),
            Shape::List { .. } => err(format!("{what} where the field is repeated")),
            // A field of a oneof or explicitly optional (presence) is written even at its
            // default.
            Shape::Single { presence } => Ok(ValueSer {
                plans: self.plans,
                kind: self.field.kind,
                number: Some(self.field.number),
                skip_default: !presence,
                out: self.out,
            }),
        }
    }
}

impl<'a> Serializer for FieldSer<'a> {
    type Ok = ();
    type Error = WireError;
    type SerializeSeq = SeqSer<'a>;
    type SerializeTuple = Impossible<(), WireError>;
    type SerializeTupleStruct = Impossible<(), WireError>;
    type SerializeTupleVariant = Impossible<(), WireError>;
    type SerializeMap = MapSer<'a>;
    type SerializeStruct = FieldsSer<'a>;
    type SerializeStructVariant = Impossible<(), WireError>;

    fn serialize_bool(self, v: bool) -> Result<(), WireError> {
        self.single("a bool")?.serialize_bool(v)
    }
    fn serialize_i8(self, v: i8) -> Result<(), WireError> {
        self.single("an integer")?.int(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), WireError> {
        self.single("an integer")?.int(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), WireError> {
        self.single("an integer")?.int(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<(), WireError> {
        self.single("an integer")?.int(v.into())
    }
    fn serialize_i128(self, v: i128) -> Result<(), WireError> {
        self.single("an integer")?.int(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), WireError> {
        self.single("an integer")?.int(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), WireError> {
        self.single("an integer")?.int(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), WireError> {
        self.single("an integer")?.int(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<(), WireError> {
        self.single("an integer")?.int(v.into())
    }
    fn serialize_u128(self, v: u128) -> Result<(), WireError> {
        self.single("an integer")?.serialize_u128(v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), WireError> {
        self.single("a floating-point number")?.float(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), WireError> {
        self.single("a floating-point number")?.float(v)
    }
    fn serialize_char(self, v: char) -> Result<(), WireError> {
        self.single("a char")?.serialize_char(v)
    }
    fn serialize_str(self, v: &str) -> Result<(), WireError> {
        self.single("a string")?.serialize_str(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), WireError> {
        self.single("bytes")?.bytes(v)
    }

    /// Not on the wire (absent reads back as the default, or none for a field with presence).
    fn serialize_none(self) -> Result<(), WireError> {
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), WireError> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), WireError> {
        Ok(())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), WireError> {
        Ok(())
    }

    fn serialize_unit_variant(self, name: &'static str, index: u32, variant: &'static str) -> Result<(), WireError> {
        self.single("an enum")?.serialize_unit_variant(name, index, variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), WireError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: &T,
    ) -> Result<(), WireError> {
        err(format!("the enum variant {variant} with data: Protobuf has no such field"))
    }

    /// A repeated field's elements (scalars packed), or `Vec<u8>` into a `bytes` field.
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqSer<'a>, WireError> {
        let Shape::List { packed } = self.field.shape else {
            return Ok(SeqSer::Bytes(self.single("a sequence")?.serialize_seq(len)?));
        };
        let (kind, number) = (self.field.kind, self.field.number);
        let start = self.out.len();
        let packed = if packed {
            put_tag(number, LEN, self.out);
            Some(open(self.out))
        } else {
            None
        };
        Ok(SeqSer::Repeated { plans: self.plans, kind, number, start, packed, out: self.out })
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, WireError> {
        err("a tuple: Protobuf has no such field")
    }

    fn serialize_tuple_struct(self, name: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, WireError> {
        err(format!("the tuple struct {name}: Protobuf has no such field"))
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, WireError> {
        err(format!("the enum variant {variant} with data: Protobuf has no such field"))
    }

    /// A map field's entries, or a nested message's fields.
    fn serialize_map(self, len: Option<usize>) -> Result<MapSer<'a>, WireError> {
        let Shape::Map { key, value } = self.field.shape else {
            return Ok(MapSer::Fields(self.single("a map")?.serialize_map(len)?));
        };
        Ok(MapSer::Entries { plans: self.plans, number: self.field.number, key, value, at: 0, out: self.out })
    }

    fn serialize_struct(self, name: &'static str, len: usize) -> Result<FieldsSer<'a>, WireError> {
        self.single("a struct")?.serialize_struct(name, len)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, WireError> {
        err(format!("the enum variant {variant} with data: Protobuf has no such field"))
    }
}

/// A repeated field, or the bytes of a `bytes` field.
enum SeqSer<'a> {
    Repeated {
        plans: &'a Plans,
        kind: Ty,
        number: u32,
        /// Where the field began (an empty packed field is taken back).
        start: usize,
        /// Where the packed elements' length goes; none when each element has its tag.
        packed: Option<usize>,
        out: &'a mut Vec<u8>,
    },
    Bytes(BytesSer<'a>),
}

impl ser::SerializeSeq for SeqSer<'_> {
    type Ok = ();
    type Error = WireError;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WireError> {
        match self {
            SeqSer::Repeated { plans, kind, number, packed, out, .. } => {
                let number = if packed.is_some() { None } else { Some(*number) };
                value.serialize(ValueSer { plans, kind: *kind, number, skip_default: false, out })
            }
            SeqSer::Bytes(b) => b.serialize_element(value),
        }
    }

    fn end(self) -> Result<(), WireError> {
        match self {
            SeqSer::Repeated { start, packed: Some(at), out, .. } => {
                if out.len() == at {
                    out.truncate(start);
                } else {
                    close(at, out);
                }
                Ok(())
            }
            SeqSer::Repeated { packed: None, .. } => Ok(()),
            SeqSer::Bytes(b) => b.end(),
        }
    }
}

/// A map field (each entry a message of key 1 and value 2), or a nested message from a map.
enum MapSer<'a> {
    Entries { plans: &'a Plans, number: u32, key: Ty, value: Ty, at: usize, out: &'a mut Vec<u8> },
    Fields(FieldsSer<'a>),
}

impl ser::SerializeMap for MapSer<'_> {
    type Ok = ();
    type Error = WireError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), WireError> {
        match self {
            MapSer::Entries { plans, number, key, at, out, .. } => {
                put_tag(*number, LEN, out);
                *at = open(out);
                k.serialize(ValueSer { plans, kind: *key, number: Some(1), skip_default: false, out })
            }
            MapSer::Fields(f) => f.serialize_key(k),
        }
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), WireError> {
        match self {
            MapSer::Entries { plans, value, at, out, .. } => {
                v.serialize(ValueSer { plans, kind: *value, number: Some(2), skip_default: false, out })?;
                close(*at, out);
                Ok(())
            }
            MapSer::Fields(f) => f.serialize_value(v),
        }
    }

    fn end(self) -> Result<(), WireError> {
        match self {
            MapSer::Entries { .. } => Ok(()),
            MapSer::Fields(f) => ser::SerializeMap::end(f),
        }
    }
}

/// A map key that names a message field.
struct KeyName;

impl Serializer for KeyName {
    type Ok = String;
    type Error = WireError;
    type SerializeSeq = Impossible<String, WireError>;
    type SerializeTuple = Impossible<String, WireError>;
    type SerializeTupleStruct = Impossible<String, WireError>;
    type SerializeTupleVariant = Impossible<String, WireError>;
    type SerializeMap = Impossible<String, WireError>;
    type SerializeStruct = Impossible<String, WireError>;
    type SerializeStructVariant = Impossible<String, WireError>;

    fn serialize_str(self, v: &str) -> Result<String, WireError> {
        Ok(v.to_owned())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<String, WireError> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, v: &T) -> Result<String, WireError> {
        v.serialize(self)
    }
    fn serialize_bool(self, _: bool) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_i8(self, _: i8) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_i16(self, _: i16) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_i32(self, _: i32) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_i64(self, _: i64) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_u8(self, _: u8) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_u16(self, _: u16) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_u32(self, _: u32) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_u64(self, _: u64) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_f32(self, _: f32) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_f64(self, _: f64) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_char(self, v: char) -> Result<String, WireError> {
        Ok(v.to_string())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_none(self) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_unit(self) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, WireError> {
        not_a_name()
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, WireError> {
        not_a_name()
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, WireError> {
        not_a_name()
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, WireError> {
        not_a_name()
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, WireError> {
        not_a_name()
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, WireError> {
        not_a_name()
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, WireError> {
        not_a_name()
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, WireError> {
        not_a_name()
    }
}

fn not_a_name<T>() -> Result<T, WireError> {
    err("a map key that is not a string: a message is written from a map only by field names")
}

#[cfg(test)]
mod tests {
    use super::super::read::MessageDe;
    use super::super::read::tests::{All, descriptor, sample};
    use super::*;
    use serde::Deserialize as _;

    fn written<T: Serialize>(record: &T) -> Result<Vec<u8>, WireError> {
        let (_, plans, msg) = descriptor();
        let mut out = Vec::new();
        write_message(&plans, msg, record, &mut out)?;
        Ok(out)
    }

    /// Every scalar kind, a nested message, packed and unpacked repeated fields, a map, an
    /// explicit optional at its default: prost-reflect reads what is written as the same
    /// message its JSON makes, and so does the wire reader.
    #[test]
    fn writes_every_kind_as_prost_reads_it() {
        let (desc, plans, msg) = descriptor();
        let (json, record) = sample();
        let bytes = written(&record).unwrap();
        let theirs = prost_reflect::DynamicMessage::deserialize(desc.clone(), json).unwrap();
        let ours = prost_reflect::DynamicMessage::decode(desc.clone(), &bytes[..]).unwrap();
        assert_eq!(ours, theirs);
        assert_eq!(All::deserialize(MessageDe::new(&plans, msg, &bytes)).unwrap(), record);
        // Proto3 leaves defaults out: an empty record is an empty message.
        assert!(written(&All { color: "RED".into(), ..All::default() }).unwrap().is_empty());
    }

    /// A Rust enum into an enum field, by its variant's name.
    #[test]
    fn rust_enums_write_by_name() {
        #[derive(serde::Serialize)]
        #[serde(rename_all = "UPPERCASE")]
        enum Color {
            Red,
            Green,
        }
        #[derive(serde::Serialize)]
        struct Colored {
            color: Color,
        }
        assert_eq!(written(&Colored { color: Color::Green }).unwrap(), [0x80, 0x01, 1]);
        assert!(written(&Colored { color: Color::Red }).unwrap().is_empty(), "the default is left out");
    }

    /// A nested message of 128 bytes or more takes a longer length prefix.
    #[test]
    fn long_nested_messages_and_strings() {
        let (desc, plans, msg) = descriptor();
        let (_, mut record) = sample();
        record.inner.as_mut().unwrap().name = "n".repeat(300);
        record.s = "s".repeat(20_000);
        let bytes = written(&record).unwrap();
        assert_eq!(All::deserialize(MessageDe::new(&plans, msg, &bytes)).unwrap(), record);
        prost_reflect::DynamicMessage::decode(desc, &bytes[..]).unwrap();
    }

    /// What the message cannot hold is an error naming the field, never a silent loss.
    #[test]
    fn refuses_what_does_not_fit() {
        #[derive(serde::Serialize)]
        struct Extra {
            s: String,
            nope: u8,
        }
        let e = written(&Extra { s: "x".into(), nope: 1 }).unwrap_err().to_string();
        assert!(e.contains("no field nope"), "{e}");
        #[derive(serde::Serialize)]
        struct Wide {
            i32: i64,
        }
        let e = written(&Wide { i32: 1 << 40 }).unwrap_err().to_string();
        assert!(e.contains("field i32") && e.contains("out of range"), "{e}");
        #[derive(serde::Serialize)]
        struct BadEnum {
            color: &'static str,
        }
        let e = written(&BadEnum { color: "BLUE" }).unwrap_err().to_string();
        assert!(e.contains("BLUE") && e.contains("RED, GREEN"), "{e}");
        #[derive(serde::Serialize)]
        struct Shape {
            packed: i64,
        }
        let e = written(&Shape { packed: 1 }).unwrap_err().to_string();
        assert!(e.contains("repeated"), "{e}");
        #[derive(serde::Serialize)]
        struct Kind {
            s: f64,
        }
        let e = written(&Kind { s: 1.0 }).unwrap_err().to_string();
        assert!(e.contains("field s") && e.contains("string"), "{e}");
    }

    proptest::proptest! {
        /// Any record of the test message, written and read back, is the same record; and
        /// prost-reflect reads the same bytes without an error.
        #[test]
        fn any_record_round_trips(
            ints in (proptest::prelude::any::<i32>(), proptest::prelude::any::<i64>(), proptest::prelude::any::<u32>(),
                proptest::prelude::any::<u64>(), proptest::prelude::any::<i32>(), proptest::prelude::any::<i64>()),
            fixed in (proptest::prelude::any::<u32>(), proptest::prelude::any::<u64>(), proptest::prelude::any::<i32>(),
                proptest::prelude::any::<i64>()),
            floats in (-1e300f64..1e300, -1e30f32..1e30, proptest::prelude::any::<bool>()),
            text in (".{0,40}", proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
                proptest::prelude::any::<bool>()),
            inner in proptest::option::of((".{0,200}", proptest::prelude::any::<i32>())),
            lists in (proptest::collection::vec(proptest::prelude::any::<i64>(), 0..50),
                proptest::collection::vec((".{0,10}", proptest::prelude::any::<i32>()), 0..5),
                proptest::collection::btree_map(".{0,10}", proptest::prelude::any::<i64>(), 0..8),
                proptest::option::of(proptest::prelude::any::<i64>()),
                proptest::collection::vec(".{0,10}", 0..5),
                proptest::collection::vec(proptest::prelude::any::<i32>(), 0..20)),
        ) {
            use super::super::read::tests::Inner;
            let record = All {
                d: floats.0,
                f: floats.1,
                i32: ints.0,
                i64: ints.1,
                u32: ints.2,
                u64: ints.3,
                s32: ints.4,
                s64: ints.5,
                fx32: fixed.0,
                fx64: fixed.1,
                sf32: fixed.2,
                sf64: fixed.3,
                b: floats.2,
                s: text.0,
                by: text.1,
                color: if text.2 { "GREEN".into() } else { "RED".into() },
                inner: inner.map(|(name, delta)| Inner { name, delta }),
                packed: lists.0,
                inners: lists.1.into_iter().map(|(name, delta)| Inner { name, delta }).collect(),
                counts: lists.2,
                maybe: lists.3,
                names: lists.4,
                loose: lists.5,
            };
            let (desc, plans, msg) = descriptor();
            let bytes = written(&record).unwrap();
            proptest::prop_assert_eq!(All::deserialize(MessageDe::new(&plans, msg, &bytes)).unwrap(), record);
            proptest::prop_assert!(prost_reflect::DynamicMessage::decode(desc, &bytes[..]).is_ok());
        }
    }
}
