//! What a record type's bytes are, written into checkpoints beside the bytes, so that the
//! next version of a job can check that it reads them as they were written, and convert
//! what it can.
//!
//! Every [`Record`](super::Record) has a [`TypeSchema`]: its name, its codec (a fixed layout
//! of so many bytes, or postcard) and its shape. A type declared with
//! [`fixed_record!`](crate::fixed_record) or [`serde_record!`](crate::serde_record) alone is
//! *opaque* (weir knows its name only); one declared with its fields is *described*:
//!
//! ```
//! # use weir::fixed_record;
//! #[derive(Clone, Copy, Debug, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, zerocopy::KnownLayout)]
//! #[repr(C)]
//! pub struct Totals { pub count: u64, pub max: u32, pub flags: u32 }
//! // Every field, in order; `= value` is what the field holds in values written before it existed.
//! fixed_record!(Totals { count: u64, max: u32, flags: u32 = 1 });
//! ```
//!
//! The field list is checked by the compiler (each name and type must be the struct's; each
//! offset is the compiler's), not its completeness: list every field.
//!
//! # What converts ([`plan`])
//!
//! | change between the schema written and the job's | at restore |
//! |---|---|
//! | none (a type renamed with the same fields included) | read as it is |
//! | a field added | values written before get its default (`= value`, else 0, false, empty) |
//! | an integer widened (u8 → u16 → u32 → u64, i8 → … → i64, uN → iM with M > N), f32 → f64 | converted |
//! | fields reordered, fixed layout ↔ postcard | converted |
//! | a field removed, narrowed, or of another kind | refused, naming the field and the change |
//! | an opaque type renamed (or replaced) | refused, naming both types |
//! | an opaque type changed inside, same name | not seen: values that do not decode fail naming the state |

use serde::{Deserialize, Serialize};
use std::fmt;

/// How a record type encodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// A `#[repr(C)]` plain-data layout of this many bytes (little-endian fields).
    Fixed {
        /// `size_of` the type.
        size: u32,
    },
    /// postcard: varints for integers (zigzag for signed ones), fields in declaration order.
    Postcard,
}

/// A field's or a value's type, as far as weir reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scalar {
    /// Unsigned integers of 1, 2, 4, 8 bytes.
    U8,
    #[allow(missing_docs)]
    U16,
    #[allow(missing_docs)]
    U32,
    #[allow(missing_docs)]
    U64,
    /// Signed integers of 1, 2, 4, 8 bytes.
    I8,
    #[allow(missing_docs)]
    I16,
    #[allow(missing_docs)]
    I32,
    #[allow(missing_docs)]
    I64,
    /// Floats.
    F32,
    #[allow(missing_docs)]
    F64,
    /// A bool (one byte).
    Bool,
    /// A UTF-8 string (postcard only).
    String,
    /// A byte vector (postcard only).
    Bytes,
    /// A type weir cannot see inside: its name, and its size in a fixed layout.
    Opaque {
        /// `type_name`.
        name: String,
        /// Bytes in a fixed layout (`None` in postcard).
        size: Option<u32>,
    },
}

impl Scalar {
    /// The scalar a type of this name is, if weir knows it (`u64`, `alloc::string::String`,
    /// ...); `None` for any other type.
    pub fn of_name(name: &str) -> Option<Scalar> {
        Some(match name {
            "u8" => Scalar::U8,
            "u16" => Scalar::U16,
            "u32" => Scalar::U32,
            "u64" => Scalar::U64,
            "i8" => Scalar::I8,
            "i16" => Scalar::I16,
            "i32" => Scalar::I32,
            "i64" => Scalar::I64,
            "f32" => Scalar::F32,
            "f64" => Scalar::F64,
            "bool" => Scalar::Bool,
            "alloc::string::String" | "std::string::String" | "String" => Scalar::String,
            "alloc::vec::Vec<u8>" | "std::vec::Vec<u8>" | "Vec<u8>" => Scalar::Bytes,
            _ => return None,
        })
    }

    /// The scalar of a field of type `name` and `size` bytes: a known one, or opaque.
    pub fn of_field(name: &str, size: Option<u32>) -> Scalar {
        Scalar::of_name(name).unwrap_or_else(|| Scalar::Opaque { name: name.to_owned(), size })
    }

    /// Bytes in a fixed layout (`None`: variable, or not known).
    pub fn fixed_size(&self) -> Option<u32> {
        Some(match self {
            Scalar::U8 | Scalar::I8 | Scalar::Bool => 1,
            Scalar::U16 | Scalar::I16 => 2,
            Scalar::U32 | Scalar::I32 | Scalar::F32 => 4,
            Scalar::U64 | Scalar::I64 | Scalar::F64 => 8,
            Scalar::Opaque { size, .. } => return *size,
            Scalar::String | Scalar::Bytes => return None,
        })
    }

    /// (signed, bits) of an integer.
    fn int(&self) -> Option<(bool, u32)> {
        Some(match self {
            Scalar::U8 => (false, 8),
            Scalar::U16 => (false, 16),
            Scalar::U32 => (false, 32),
            Scalar::U64 => (false, 64),
            Scalar::I8 => (true, 8),
            Scalar::I16 => (true, 16),
            Scalar::I32 => (true, 32),
            Scalar::I64 => (true, 64),
            _ => return None,
        })
    }

    /// Whether every value of `self` is a value of `to`, converted exactly.
    fn widens_to(&self, to: &Scalar) -> bool {
        match (self.int(), to.int()) {
            (Some((fs, fb)), Some((ts, tb))) => (fs == ts && tb >= fb) || (!fs && ts && tb > fb),
            _ => matches!((self, to), (Scalar::F32, Scalar::F64)),
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Opaque { name, .. } => f.write_str(name),
            other => {
                let s = serde_json::to_value(other).ok();
                f.write_str(s.as_ref().and_then(|v| v.as_str()).unwrap_or("?"))
            }
        }
    }
}

/// A value a described field holds (a default, or one read from bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    /// An unsigned integer (or a bool as 0 / 1 when read).
    U(u64),
    /// A signed integer.
    I(i64),
    /// A float.
    F(f64),
    /// A bool.
    Bool(bool),
    /// A string.
    Str(String),
    /// Bytes: a byte vector, or an opaque field's raw bytes.
    Bytes(Vec<u8>),
}

macro_rules! value_from {
    ($variant:ident as $as:ty: $($t:ty),+) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$variant(v as $as)
            }
        }
    )+};
}
value_from!(U as u64: u8, u16, u32, u64, usize);
value_from!(I as i64: i8, i16, i32, i64, isize);
value_from!(F as f64: f32, f64);

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.to_owned())
    }
}

/// One described field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Field {
    /// Its name.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub ty: Scalar,
    /// Its offset in a fixed layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u32>,
    /// What it holds in values written before it existed (`None`: 0, false, empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

/// What weir knows of a type's inside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// Nothing: its name only.
    Opaque,
    /// One scalar (an integer, a string).
    Scalar(Scalar),
    /// A struct of these fields, in declaration order.
    Struct(Vec<Field>),
}

/// A record type's schema: its name, codec and shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TypeSchema {
    /// `std::any::type_name` of the type.
    pub name: String,
    /// How it encodes.
    pub codec: Codec,
    /// What weir knows of its inside.
    pub shape: Shape,
}

impl TypeSchema {
    /// The schema of a type declared without fields: a known scalar by its name, else opaque.
    pub fn named(name: &str, codec: Codec) -> TypeSchema {
        let shape = Scalar::of_name(name).map_or(Shape::Opaque, Shape::Scalar);
        TypeSchema { name: name.to_owned(), codec, shape }
    }

    /// The type's name without module paths (`weir::window::Stats` → `Stats`), as messages
    /// and comparisons of opaque types use it: a type moved between modules is the same.
    pub fn short_name(&self) -> String {
        short_type_name(&self.name)
    }
}

/// `a::b::C<d::E>` → `C<E>`.
pub fn short_type_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut word = String::new();
    for c in name.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            out.push_str(word.rsplit("::").next().unwrap_or(""));
            word.clear();
            out.push(c);
        }
    }
    out.push_str(word.rsplit("::").next().unwrap_or(""));
    out
}

impl fmt::Display for TypeSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.short_name())?;
        if let Shape::Struct(fields) = &self.shape {
            let fields: Vec<String> = fields.iter().map(|x| format!("{}: {}", x.name, x.ty)).collect();
            write!(f, " {{ {} }}", fields.join(", "))?;
        }
        Ok(())
    }
}

/// A change [`plan`] cannot convert: which field (or the type, `None`) and what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The field, or `None` for the type as a whole.
    pub field: Option<String>,
    /// What changed, in words.
    pub change: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "field `{field}`: {}", self.change),
            None => f.write_str(&self.change),
        }
    }
}

/// How values written with one schema are read with another ([`plan`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Migration {
    /// The bytes are read as they are.
    Same,
    /// Each value is decoded by the old schema and encoded by the new one.
    Convert {
        /// The schema the bytes were written with.
        from: TypeSchema,
        /// The job's.
        to: TypeSchema,
        /// What changed, in words (for the log): `field max added (default 0)`, ...
        changes: Vec<String>,
    },
}

impl Migration {
    /// Whether values need converting.
    pub fn is_same(&self) -> bool {
        matches!(self, Migration::Same)
    }

    /// Convert one value's bytes (`Same`: a copy).
    pub fn apply(&self, bytes: &[u8]) -> Result<Vec<u8>, ConvertError> {
        match self {
            Migration::Same => Ok(bytes.to_vec()),
            Migration::Convert { from, to, .. } => {
                let values = decode_values(from, bytes)?;
                encode_values(to, &values)
            }
        }
    }
}

/// Why a value's bytes could not be converted by a [`Migration`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// The type is opaque: weir does not know its fields.
    #[error("{type_name} is opaque")]
    Opaque {
        /// The type's short name.
        type_name: String,
    },
    /// A fixed-layout value of another length than its type's.
    #[error("{len} bytes where {type_name} has {size}")]
    Length {
        /// The bytes given.
        len: usize,
        /// The type's short name.
        type_name: String,
        /// Its size.
        size: u32,
    },
    /// The bytes do not read as the old schema says (a field without an offset or past the
    /// end, a postcard field that does not decode, bytes left over).
    #[error("{0}")]
    Unreadable(String),
    /// A field's value cannot be written as the new schema's type.
    #[error("field {field}: {source}")]
    Field {
        /// The field (`""` for a scalar).
        field: String,
        /// What is wrong with the value.
        #[source]
        source: ValueError,
    },
}

/// Why one value cannot be written as a type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    /// A bool was expected.
    #[error("not a bool")]
    NotBool,
    /// An integer was expected.
    #[error("not an integer")]
    NotInteger,
    /// A number was expected.
    #[error("not a number")]
    NotNumber,
    /// A string or bytes were expected.
    #[error("not a string or bytes")]
    NotStringOrBytes,
    /// A string or bytes in a fixed layout.
    #[error("has no fixed size")]
    NoFixedSize,
    /// Opaque bytes of another size than the type's.
    #[error("opaque ({ty}) bytes of another size")]
    OpaqueSize {
        /// The type.
        ty: String,
    },
    /// An integer out of the type's range.
    #[error("{value} does not fit a {ty}")]
    OutOfRange {
        /// The value.
        value: i128,
        /// The type.
        ty: String,
    },
    /// A type weir cannot write in postcard.
    #[error("weir cannot write a {ty} in postcard")]
    NoPostcard {
        /// The type.
        ty: String,
    },
    /// The field lies past the end of the layout.
    #[error("past the end")]
    PastTheEnd,
}

/// How values written with `old` are read by a job whose type is `new`: as they are, converted
/// (the rules in this module's table), or refused with every change that cannot convert.
pub fn plan(old: &TypeSchema, new: &TypeSchema) -> Result<Migration, Vec<Refusal>> {
    let renamed = || {
        vec![Refusal {
            field: None,
            change: format!(
                "its type was {} and is now {}: weir cannot see inside {} (declare the fields with \
                 fixed_record!/serde_record! so weir can check and convert them)",
                old.short_name(),
                new.short_name(),
                if matches!(old.shape, Shape::Opaque) && matches!(new.shape, Shape::Opaque) { "either" } else { "one" },
            ),
        }]
    };
    let convert = |changes: Vec<String>| Migration::Convert { from: old.clone(), to: new.clone(), changes };
    match (&old.shape, &new.shape) {
        (Shape::Opaque, _) | (_, Shape::Opaque) => {
            if old.short_name() == new.short_name() && old.codec == new.codec {
                Ok(Migration::Same)
            } else {
                Err(renamed())
            }
        }
        (Shape::Scalar(a), Shape::Scalar(b)) => {
            if a == b && old.codec == new.codec {
                Ok(Migration::Same)
            } else if a == b || a.widens_to(b) {
                Ok(convert(vec![format!("{a} widened to {b}")]))
            } else {
                Err(vec![Refusal { field: None, change: format!("{a} became {b}, which does not hold every {a}") }])
            }
        }
        (Shape::Struct(a), Shape::Struct(b)) => {
            let mut refused = Vec::new();
            let mut changes = Vec::new();
            for f in a {
                match b.iter().find(|g| g.name == f.name) {
                    None => refused.push(Refusal {
                        field: Some(f.name.clone()),
                        change: "removed (its values would be lost)".into(),
                    }),
                    Some(g) if g.ty == f.ty => {}
                    Some(g) if f.ty.widens_to(&g.ty) => {
                        changes.push(format!("{} widened {} to {}", f.name, f.ty, g.ty))
                    }
                    Some(g) => refused.push(Refusal {
                        field: Some(f.name.clone()),
                        change: format!("{} became {}, which does not hold every {}", f.ty, g.ty, f.ty),
                    }),
                }
            }
            for g in b.iter().filter(|g| !a.iter().any(|f| f.name == g.name)) {
                let default = g.default.as_ref().map_or_else(|| "0".to_owned(), |d| format!("{d:?}"));
                changes.push(format!("{} added (default {default})", g.name));
            }
            if old.codec == Codec::Postcard
                && let Some(f) = a.iter().find(|f| matches!(f.ty, Scalar::Opaque { .. }))
                && (!changes.is_empty()
                    || old.codec != new.codec
                    || a.iter().map(|f| &f.name).ne(b.iter().map(|g| &g.name)))
            {
                refused.push(Refusal {
                    field: Some(f.name.clone()),
                    change: format!(
                        "is of a type weir cannot read in postcard bytes ({}), so the fields around it cannot be converted",
                        f.ty
                    ),
                });
            }
            if !refused.is_empty() {
                return Err(refused);
            }
            let moved = a.iter().map(|f| (&f.name, f.offset)).ne(b.iter().map(|g| (&g.name, g.offset)));
            if changes.is_empty() && !moved && old.codec == new.codec {
                Ok(Migration::Same)
            } else {
                if changes.is_empty() {
                    changes.push("fields laid out anew".into());
                }
                Ok(convert(changes))
            }
        }
        (a, b) => Err(vec![Refusal {
            field: None,
            change: format!("it was {} and is now {}", shape_word(a, old), shape_word(b, new)),
        }]),
    }
}

fn shape_word(s: &Shape, t: &TypeSchema) -> String {
    match s {
        Shape::Opaque => format!("the opaque type {}", t.short_name()),
        Shape::Scalar(x) => format!("a {x}"),
        Shape::Struct(_) => format!("the struct {t}"),
    }
}

/// A value's fields by name (a scalar's under the name `""`).
type Values = Vec<(String, Value)>;

fn decode_values(schema: &TypeSchema, bytes: &[u8]) -> Result<Values, ConvertError> {
    let unreadable = ConvertError::Unreadable;
    let fields: Vec<(String, &Scalar, Option<u32>)> = match &schema.shape {
        Shape::Scalar(s) => vec![(String::new(), s, Some(0))],
        Shape::Struct(fields) => fields.iter().map(|f| (f.name.clone(), &f.ty, f.offset)).collect(),
        Shape::Opaque => return Err(ConvertError::Opaque { type_name: schema.short_name() }),
    };
    let mut out = Vec::with_capacity(fields.len());
    match schema.codec {
        Codec::Fixed { size } => {
            if bytes.len() != size as usize {
                return Err(ConvertError::Length { len: bytes.len(), type_name: schema.short_name(), size });
            }
            for (name, ty, offset) in fields {
                let at = offset.ok_or_else(|| unreadable(format!("field {name} has no offset")))? as usize;
                let len = ty.fixed_size().ok_or_else(|| unreadable(format!("field {name} ({ty}) has no fixed size")))?
                    as usize;
                let raw = bytes
                    .get(at..at + len)
                    .ok_or_else(|| unreadable(format!("field {name} lies past the value's end")))?;
                out.push((name, read_fixed(ty, raw)));
            }
        }
        Codec::Postcard => {
            let mut rest = bytes;
            for (name, ty, _) in fields {
                let (v, r) =
                    read_postcard(ty, rest).ok_or_else(|| unreadable(format!("cannot read field {name} ({ty})")))?;
                out.push((name, v));
                rest = r;
            }
            if !rest.is_empty() {
                return Err(unreadable(format!("{} bytes left after the last field", rest.len())));
            }
        }
    }
    Ok(out)
}

fn encode_values(schema: &TypeSchema, values: &Values) -> Result<Vec<u8>, ConvertError> {
    let fields: Vec<(String, &Scalar, Option<u32>, Option<&Value>)> = match &schema.shape {
        Shape::Scalar(s) => vec![(String::new(), s, Some(0), None)],
        Shape::Struct(fields) => fields.iter().map(|f| (f.name.clone(), &f.ty, f.offset, f.default.as_ref())).collect(),
        Shape::Opaque => return Err(ConvertError::Opaque { type_name: schema.short_name() }),
    };
    let value_of = |name: &str, ty: &Scalar, default: Option<&Value>| -> Value {
        values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .or_else(|| default.cloned())
            .unwrap_or_else(|| zero(ty))
    };
    match schema.codec {
        Codec::Fixed { size } => {
            let mut out = vec![0u8; size as usize];
            for (name, ty, offset, default) in fields {
                let at =
                    offset.ok_or_else(|| ConvertError::Unreadable(format!("field {name} has no offset")))? as usize;
                let v = value_of(&name, ty, default);
                let Some(out) = out.get_mut(at..) else {
                    return Err(ConvertError::Unreadable(format!("field {name} lies past the end")));
                };
                write_fixed(ty, &v, out).map_err(|source| ConvertError::Field { field: name, source })?;
            }
            Ok(out)
        }
        Codec::Postcard => {
            let mut out = Vec::new();
            for (name, ty, _, default) in fields {
                write_postcard(ty, &value_of(&name, ty, default), &mut out)
                    .map_err(|source| ConvertError::Field { field: name, source })?;
            }
            Ok(out)
        }
    }
}

fn zero(ty: &Scalar) -> Value {
    match ty {
        Scalar::U8 | Scalar::U16 | Scalar::U32 | Scalar::U64 => Value::U(0),
        Scalar::I8 | Scalar::I16 | Scalar::I32 | Scalar::I64 => Value::I(0),
        Scalar::F32 | Scalar::F64 => Value::F(0.0),
        Scalar::Bool => Value::Bool(false),
        Scalar::String => Value::Str(String::new()),
        Scalar::Bytes => Value::Bytes(Vec::new()),
        Scalar::Opaque { size, .. } => Value::Bytes(vec![0; size.unwrap_or(0) as usize]),
    }
}

fn read_fixed(ty: &Scalar, raw: &[u8]) -> Value {
    let mut le = [0u8; 8];
    le[..raw.len().min(8)].copy_from_slice(&raw[..raw.len().min(8)]);
    let u = u64::from_le_bytes(le);
    match ty {
        Scalar::U8 | Scalar::U16 | Scalar::U32 | Scalar::U64 => Value::U(u),
        Scalar::I8 => Value::I(u as u8 as i8 as i64),
        Scalar::I16 => Value::I(u as u16 as i16 as i64),
        Scalar::I32 => Value::I(u as u32 as i32 as i64),
        Scalar::I64 => Value::I(u as i64),
        Scalar::F32 => Value::F(f32::from_bits(u as u32) as f64),
        Scalar::F64 => Value::F(f64::from_bits(u)),
        Scalar::Bool => Value::Bool(u != 0),
        Scalar::String | Scalar::Bytes | Scalar::Opaque { .. } => Value::Bytes(raw.to_vec()),
    }
}

/// The integer in `v` as i128 (for range checks when writing).
fn as_int(v: &Value) -> Option<i128> {
    match v {
        Value::U(u) => Some(*u as i128),
        Value::I(i) => Some(*i as i128),
        Value::Bool(b) => Some(*b as i128),
        _ => None,
    }
}

fn write_fixed(ty: &Scalar, v: &Value, out: &mut [u8]) -> Result<(), ValueError> {
    let bytes: Vec<u8> = match ty {
        Scalar::F32 => (float(v)? as f32).to_le_bytes().to_vec(),
        Scalar::F64 => float(v)?.to_le_bytes().to_vec(),
        Scalar::Bool => vec![(as_int(v).ok_or(ValueError::NotBool)? != 0) as u8],
        Scalar::String | Scalar::Bytes => return Err(ValueError::NoFixedSize),
        Scalar::Opaque { size, .. } => match v {
            Value::Bytes(b) if Some(b.len() as u32) == *size => b.clone(),
            _ => return Err(ValueError::OpaqueSize { ty: ty.to_string() }),
        },
        int => {
            let (signed, bits) = int.int().expect("an integer");
            let i = as_int(v).ok_or(ValueError::NotInteger)?;
            let (lo, hi) =
                if signed { (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1) } else { (0, (1i128 << bits) - 1) };
            if i < lo || i > hi {
                return Err(ValueError::OutOfRange { value: i, ty: ty.to_string() });
            }
            (i as i64 as u64).to_le_bytes()[..(bits / 8) as usize].to_vec()
        }
    };
    out.get_mut(..bytes.len()).ok_or(ValueError::PastTheEnd)?.copy_from_slice(&bytes);
    Ok(())
}

fn float(v: &Value) -> Result<f64, ValueError> {
    match v {
        Value::F(f) => Ok(*f),
        other => as_int(other).map(|i| i as f64).ok_or(ValueError::NotNumber),
    }
}

fn read_varint(b: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, &b[i + 1..]));
        }
    }
    None
}

fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_postcard<'a>(ty: &Scalar, b: &'a [u8]) -> Option<(Value, &'a [u8])> {
    match ty {
        // postcard writes u8 and i8 as one raw byte, wider integers as varints.
        Scalar::U8 => b.split_first().map(|(x, r)| (Value::U(*x as u64), r)),
        Scalar::I8 => b.split_first().map(|(x, r)| (Value::I(*x as i8 as i64), r)),
        Scalar::Bool => b.split_first().and_then(|(x, r)| (*x <= 1).then_some((Value::Bool(*x == 1), r))),
        Scalar::U16 | Scalar::U32 | Scalar::U64 => read_varint(b).map(|(v, r)| (Value::U(v), r)),
        Scalar::I16 | Scalar::I32 | Scalar::I64 => {
            read_varint(b).map(|(v, r)| (Value::I(((v >> 1) as i64) ^ -((v & 1) as i64)), r))
        }
        Scalar::F32 => b.split_first_chunk::<4>().map(|(x, r)| (Value::F(f32::from_le_bytes(*x) as f64), r)),
        Scalar::F64 => b.split_first_chunk::<8>().map(|(x, r)| (Value::F(f64::from_le_bytes(*x)), r)),
        Scalar::String | Scalar::Bytes => {
            let (len, r) = read_varint(b)?;
            let (x, r) = r.split_at_checked(usize::try_from(len).ok()?)?;
            let v = if *ty == Scalar::String {
                Value::Str(String::from_utf8(x.to_vec()).ok()?)
            } else {
                Value::Bytes(x.to_vec())
            };
            Some((v, r))
        }
        Scalar::Opaque { .. } => None,
    }
}

fn write_postcard(ty: &Scalar, v: &Value, out: &mut Vec<u8>) -> Result<(), ValueError> {
    match ty {
        Scalar::F32 => out.extend_from_slice(&(float(v)? as f32).to_le_bytes()),
        Scalar::F64 => out.extend_from_slice(&float(v)?.to_le_bytes()),
        Scalar::String | Scalar::Bytes => {
            let bytes = match v {
                Value::Str(s) => s.as_bytes(),
                Value::Bytes(b) => b.as_slice(),
                _ => return Err(ValueError::NotStringOrBytes),
            };
            write_varint(bytes.len() as u64, out);
            out.extend_from_slice(bytes);
        }
        Scalar::Opaque { .. } => return Err(ValueError::NoPostcard { ty: ty.to_string() }),
        int => {
            // Range-checked as a fixed layout would be, then written postcard's way.
            let mut scratch = [0u8; 8];
            write_fixed(int, v, &mut scratch)?;
            let i = as_int(v).ok_or(ValueError::NotInteger)?;
            match int {
                Scalar::U8 | Scalar::I8 | Scalar::Bool => out.push(scratch[0]),
                Scalar::I16 | Scalar::I32 | Scalar::I64 => {
                    let i = i as i64;
                    write_varint(((i << 1) ^ (i >> 63)) as u64, out)
                }
                _ => write_varint(i as u64, out),
            }
        }
    }
    Ok(())
}

/// The value `bytes` holds by `schema`, as JSON (`weir state dump`): a described type's fields
/// by name, a scalar as itself; `None` where weir cannot read it (opaque, or bytes that do
/// not fit the schema).
pub fn to_json(schema: &TypeSchema, bytes: &[u8]) -> Option<serde_json::Value> {
    let values = decode_values(schema, bytes).ok()?;
    let json = |v: &Value| match v {
        Value::U(u) => serde_json::json!(u),
        Value::I(i) => serde_json::json!(i),
        Value::F(f) => serde_json::json!(f),
        Value::Bool(b) => serde_json::json!(b),
        Value::Str(s) => serde_json::json!(s),
        Value::Bytes(b) => serde_json::json!(hex(b)),
    };
    match &schema.shape {
        Shape::Scalar(Scalar::Bool) => values.first().map(|(_, v)| serde_json::json!(as_int(v) == Some(1))),
        Shape::Scalar(_) => values.first().map(|(_, v)| json(v)),
        _ => Some(serde_json::Value::Object(
            values
                .iter()
                .map(|(n, v)| {
                    let field = match &schema.shape {
                        Shape::Struct(fs) => fs.iter().find(|f| &f.name == n),
                        _ => None,
                    };
                    let v = match (field.map(|f| &f.ty), v) {
                        (Some(Scalar::Bool), v) => serde_json::json!(as_int(v) == Some(1)),
                        (_, v) => json(v),
                    };
                    (n.clone(), v)
                })
                .collect(),
        )),
    }
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;

    #[derive(
        Debug,
        Clone,
        Copy,
        PartialEq,
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::Immutable,
        zerocopy::KnownLayout,
    )]
    #[repr(C)]
    struct V1 {
        count: u64,
        max: u32,
        pad: u32,
    }
    crate::fixed_record!(V1 { count: u64, max: u32, pad: u32 });

    #[derive(
        Debug,
        Clone,
        Copy,
        PartialEq,
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::Immutable,
        zerocopy::KnownLayout,
    )]
    #[repr(C)]
    struct V2 {
        min: u64,
        count: u64,
        max: u64,
        pad: u32,
        flags: u32,
    }
    crate::fixed_record!(V2 { min: u64 = u64::MAX, count: u64, max: u64, pad: u32, flags: u32 });

    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct P1 {
        name: String,
        n: i32,
        small: u8,
    }
    crate::serde_record!(P1 { name: String, n: i32, small: u8 });

    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct P2 {
        n: i64,
        small: u16,
        name: String,
        ok: bool,
    }
    crate::serde_record!(P2 { n: i64, small: u16, name: String, ok: bool = true });

    fn bytes_of<T: Record>(v: &T) -> Vec<u8> {
        let mut b = vec![0u8; v.encoded_len()];
        v.encode(&mut b);
        b
    }

    /// Fields added (with their defaults), widened and moved convert, in a fixed layout and
    /// in postcard, and the result decodes as the new type with the old values kept.
    #[test]
    fn added_widened_and_moved_fields_convert() {
        let m = plan(&V1::schema(), &V2::schema()).unwrap();
        let Migration::Convert { changes, .. } = &m else { panic!("{m:?}") };
        assert!(changes.iter().any(|c| c.contains("max widened u32 to u64")), "{changes:?}");
        assert!(changes.iter().any(|c| c.contains("min added")), "{changes:?}");
        let new = m.apply(&bytes_of(&V1 { count: 7, max: 9, pad: 0 })).unwrap();
        let v2 = V2::decode(&new, |v| *v).unwrap();
        assert_eq!(v2, V2 { min: u64::MAX, count: 7, max: 9, pad: 0, flags: 0 });

        let m = plan(&P1::schema(), &P2::schema()).unwrap();
        let new = m.apply(&bytes_of(&P1 { name: "x".into(), n: -5, small: 200 })).unwrap();
        let p2 = P2::decode(&new, |v| v.clone()).unwrap();
        assert_eq!(p2, P2 { n: -5, small: 200, name: "x".into(), ok: true });
        assert!(plan(&V2::schema(), &V2::schema()).unwrap().is_same());
        assert!(plan(&u32::schema(), &u32::schema()).unwrap().is_same());
        assert_eq!(
            plan(&u32::schema(), &u64::schema()).unwrap().apply(&7u32.to_le_bytes()).unwrap(),
            7u64.to_le_bytes()
        );
    }

    /// What cannot convert is refused naming the field and the change; opaque types are
    /// compared by name.
    #[test]
    fn removed_narrowed_and_renamed_are_refused() {
        let e = plan(&V2::schema(), &V1::schema()).unwrap_err();
        let text: Vec<String> = e.iter().map(|r| r.to_string()).collect();
        assert!(text.iter().any(|t| t.starts_with("field `min`: removed")), "{text:?}");
        assert!(text.iter().any(|t| t.contains("field `max`: u64 became u32")), "{text:?}");
        let e = plan(&P2::schema(), &P1::schema()).unwrap_err();
        assert!(e.iter().any(|r| r.field.as_deref() == Some("ok")), "{e:?}");
        assert!(plan(&u64::schema(), &u32::schema()).is_err());
        assert!(plan(&u64::schema(), &i64::schema()).is_err(), "u64 does not fit i64");
        assert!(plan(&u32::schema(), &i64::schema()).unwrap().apply(&3u32.to_le_bytes()).is_ok());
        let opaque = |name: &str| TypeSchema { name: name.into(), codec: Codec::Postcard, shape: Shape::Opaque };
        assert!(plan(&opaque("a::Acc"), &opaque("b::Acc")).unwrap().is_same(), "moved between modules");
        let e = plan(&opaque("a::Acc"), &opaque("a::Acc2")).unwrap_err();
        assert!(e[0].change.contains("was Acc and is now Acc2"), "{e:?}");
        assert_eq!(short_type_name("alloc::vec::Vec<weir::record::Event>"), "Vec<Event>");
    }

    /// Values read back as JSON by their schema.
    #[test]
    fn values_as_json() {
        let j = to_json(&V1::schema(), &bytes_of(&V1 { count: 3, max: 4, pad: 0 })).unwrap();
        assert_eq!(j, serde_json::json!({"count": 3, "max": 4, "pad": 0}));
        let j = to_json(&P2::schema(), &bytes_of(&P2 { n: -1, small: 2, name: "z".into(), ok: true })).unwrap();
        assert_eq!(j, serde_json::json!({"n": -1, "small": 2, "name": "z", "ok": true}));
        assert_eq!(to_json(&u64::schema(), &9u64.to_le_bytes()), Some(serde_json::json!(9)));
    }
}
