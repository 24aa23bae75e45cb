//! Records into rows of PostgreSQL's binary COPY format, through serde.
//!
//! The first record's *shape* (its fields in the order serde visits them, nested structs as
//! dotted paths: `left.key`) is matched once against the table's columns: the result is a
//! [`Plan`], one action per node of the shape — descend into a struct, skip a field, encode a
//! field as a column's type, or write a field (or the whole record) as JSON. The COPY column
//! list follows the record's field order, so encoding a row is one pass over the record that
//! appends each mapped field as it comes: no value tree, no lookup by name.
//!
//! ```text
//!  row:   i16 field count | per field: i32 length (-1: NULL) | value in the column type's binary form
//!  batch: "PGCOPY\n\xff\r\n\0" | i32 flags 0 | i32 extension 0 | rows … | i16 -1
//! ```
//!
//! Values convert as the column's type asks: integers into int2/int4/int8 (range-checked),
//! float4/float8, numeric, text, and timestamp/timestamptz (an integer is nanoseconds since
//! the Unix epoch, stored to the microsecond); floats into float4/float8, numeric, text;
//! strings into text, varchar, char, uuid, numeric; bytes into bytea; `None` and `()` are
//! NULL; anything into json or jsonb (as JSON). A field whose kind no value of it could fit
//! its column (a string into a bigint) is a setting error found at the first record; a value
//! that does not fit (a u64 above int8's range) is a bad row, dead-lettered like one the
//! server rejects.

use super::error::Problem;
use bytes::{BufMut, BytesMut};
use postgres_protocol::types as pg;
use serde::ser::{self, Serialize};
use std::fmt::Display;

/// The binary COPY header: signature, flags, header extension length.
pub(crate) const COPY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// The binary COPY trailer: a field count of -1.
pub(crate) const COPY_TRAILER: &[u8] = &[0xff, 0xff];

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// A column type this sink writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum PgType {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Numeric,
    /// text, varchar, bpchar, name, citext-like domains.
    Text,
    Json,
    Jsonb,
    Bytea,
    Timestamp,
    Timestamptz,
    Uuid,
}

impl PgType {
    /// The type of a column by its (base) type's OID; `None`: not one this sink writes.
    pub(crate) fn from_oid(oid: u32) -> Option<PgType> {
        Some(match oid {
            16 => PgType::Bool,
            17 => PgType::Bytea,
            20 => PgType::Int8,
            21 => PgType::Int2,
            23 => PgType::Int4,
            19 | 25 | 1042 | 1043 => PgType::Text,
            114 => PgType::Json,
            700 => PgType::Float4,
            701 => PgType::Float8,
            1114 => PgType::Timestamp,
            1184 => PgType::Timestamptz,
            1700 => PgType::Numeric,
            2950 => PgType::Uuid,
            3802 => PgType::Jsonb,
            _ => return None,
        })
    }

    /// Whether values of `kind` can be written as this type (some may still be out of range).
    fn takes(self, kind: Kind) -> bool {
        use PgType as T;
        match kind {
            Kind::Null => true,
            Kind::Bool => matches!(self, T::Bool | T::Text | T::Json | T::Jsonb),
            Kind::Int => matches!(
                self,
                T::Int2
                    | T::Int4
                    | T::Int8
                    | T::Float4
                    | T::Float8
                    | T::Numeric
                    | T::Text
                    | T::Json
                    | T::Jsonb
                    | T::Timestamp
                    | T::Timestamptz
            ),
            Kind::Float => matches!(self, T::Float4 | T::Float8 | T::Numeric | T::Text | T::Json | T::Jsonb),
            Kind::Str => matches!(self, T::Text | T::Json | T::Jsonb | T::Uuid | T::Numeric),
            Kind::Bytes => matches!(self, T::Bytea | T::Json | T::Jsonb),
            Kind::Compound | Kind::Struct => matches!(self, T::Json | T::Jsonb | T::Text),
        }
    }
}

/// A column of the table: its name and how it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableColumn {
    pub name: String,
    /// What the server calls its type (`bigint`, `character varying(20)`).
    pub type_name: String,
    /// `None`: a type this sink does not write.
    pub ty: Option<PgType>,
    pub not_null: bool,
    pub has_default: bool,
}

/// What kind of value a node of a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Bool,
    Int,
    Float,
    Str,
    Bytes,
    /// `None` or `()`: its type is not known from this record.
    Null,
    /// A sequence, a map, an enum variant with data: JSON only.
    Compound,
    /// A struct: its fields follow.
    Struct,
}

impl Kind {
    fn words(self) -> &'static str {
        match self {
            Kind::Bool => "a bool",
            Kind::Int => "an integer",
            Kind::Float => "a float",
            Kind::Str => "a string",
            Kind::Bytes => "bytes",
            Kind::Null => "empty",
            Kind::Compound => "a list, map or enum",
            Kind::Struct => "a struct",
        }
    }
}

/// One node of a record's shape, in pre-order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    /// Dotted path (`left.key`); empty for the record itself.
    pub path: String,
    pub kind: Kind,
    /// Nodes in its subtree, itself included.
    pub size: usize,
}

/// The shape of `record`.
pub(crate) fn shape<T: Serialize + ?Sized>(record: &T) -> Result<Vec<Node>, String> {
    let mut s = Shaper { nodes: Vec::new(), path: String::new() };
    compound_is_done(record.serialize(&mut s)).map_err(|e| e.0)?;
    Ok(s.nodes)
}

/// What encoding does at one node of the shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// A struct whose fields follow.
    Descend,
    /// Not written: skip this many nodes (the node and its subtree).
    Skip(usize),
    /// A scalar, as this type.
    Column(PgType),
    /// As JSON text into a json, jsonb or text column; skip its subtree of this size.
    Json(PgType, usize),
}

/// How records of one type become rows of one table: actions per node of the shape, the
/// COPY column list, and the layout the rows carry.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    actions: Vec<Action>,
    /// The whole record as JSON in the last column, of this type.
    whole: Option<PgType>,
    /// Columns in COPY order, with their types.
    pub layout: Layout,
}

/// The columns rows are encoded for, in COPY order: what a batch (and a checkpoint holding
/// one) needs to be sent again.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Layout {
    pub columns: Vec<(String, PgType)>,
}

impl Layout {
    /// `"a", "b", "c"`: the column list of a COPY or INSERT.
    pub(crate) fn column_list(&self) -> String {
        self.columns.iter().map(|(c, _)| quote_ident(c)).collect::<Vec<_>>().join(", ")
    }
}

/// An identifier as SQL text: as is when it is a plain lower-case name, else double-quoted.
pub(crate) fn quote_ident(name: &str) -> String {
    let plain = !name.is_empty()
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain { name.to_owned() } else { postgres_protocol::escape::escape_identifier(name) }
}

impl Plan {
    /// Match the record's `shape` with the table's `columns`: `mapping` (field → column;
    /// empty: by name) and `json_column`. Every failure names the setting to change.
    pub(crate) fn new(
        shape: &[Node],
        columns: &[TableColumn],
        mapping: &[(String, String)],
        json_column: Option<&str>,
        table: &str,
    ) -> Result<Plan, Problem> {
        let column = |name: &str, setting: &str| -> Result<&TableColumn, Problem> {
            columns.iter().find(|c| c.name == name).ok_or_else(|| {
                Problem::config(
                    setting,
                    format!(
                        "table {table} has no column `{name}`; its columns are {}",
                        columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                )
            })
        };
        for (field, _) in mapping {
            if !shape.iter().any(|n| &n.path == field) {
                return Err(Problem::config(
                    format!("columns.{field}"),
                    format!(
                        "the records have no field `{field}`; their fields are {}",
                        shape
                            .iter()
                            .filter(|n| !n.path.is_empty())
                            .map(|n| n.path.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        let mut actions = Vec::with_capacity(shape.len());
        let mut layout = Vec::new();
        let mut i = 0;
        while i < shape.len() {
            let node = &shape[i];
            let target = if mapping.is_empty() {
                let by_name = node.path.replace('.', "_");
                (!node.path.is_empty()).then(|| columns.iter().find(|c| c.name == by_name)).flatten().map(|c| {
                    let setting = format!("columns.{}", node.path);
                    (c, setting)
                })
            } else {
                match mapping.iter().find(|(f, _)| *f == node.path) {
                    Some((f, c)) => {
                        let setting = format!("columns.{f}");
                        Some((column(c, &setting)?, setting))
                    }
                    None => None,
                }
            };
            match target {
                Some((col, setting)) => {
                    let ty = col.ty.ok_or_else(|| {
                        Problem::config(
                            &setting,
                            format!(
                                "column `{}` is of type {}, which this sink does not write (it writes boolean, \
                                 smallint, integer, bigint, real, double precision, numeric, text, varchar, char, \
                                 json, jsonb, bytea, timestamp, timestamptz, uuid)",
                                col.name, col.type_name
                            ),
                        )
                    })?;
                    if !ty.takes(node.kind) {
                        return Err(Problem::config(
                            &setting,
                            format!(
                                "field `{}` is {}, which column `{}` ({}) cannot take; map it to a column of a fitting \
                                 type (or to a json/jsonb column)",
                                node.path,
                                node.kind.words(),
                                col.name,
                                col.type_name
                            ),
                        ));
                    }
                    let json = matches!(ty, PgType::Json | PgType::Jsonb)
                        || matches!(node.kind, Kind::Struct | Kind::Compound);
                    actions.push(if json { Action::Json(ty, node.size) } else { Action::Column(ty) });
                    actions.extend(std::iter::repeat_n(Action::Skip(1), node.size - 1));
                    layout.push((col.name.clone(), ty));
                    i += node.size;
                }
                None if node.kind == Kind::Struct => {
                    actions.push(Action::Descend);
                    i += 1;
                }
                None => {
                    actions.push(Action::Skip(node.size));
                    actions.extend(std::iter::repeat_n(Action::Skip(1), node.size - 1));
                    i += node.size;
                }
            }
        }
        let whole = match json_column {
            None => None,
            Some(name) => {
                let col = column(name, "json_column")?;
                match col.ty {
                    Some(t @ (PgType::Json | PgType::Jsonb | PgType::Text)) => {
                        layout.push((col.name.clone(), t));
                        Some(t)
                    }
                    _ => {
                        return Err(Problem::config(
                            "json_column",
                            format!(
                                "column `{name}` is {}; the whole record goes into json, jsonb or text",
                                col.type_name
                            ),
                        ));
                    }
                }
            }
        };
        if layout.is_empty() {
            return Err(Problem::config(
                "columns",
                format!(
                    "no field of the records has a column of the same name in {table} (fields: {}; columns: {}); map \
                     fields to columns with `columns = {{ field = \"column\" }}`, or give json_column",
                    shape.iter().filter(|n| !n.path.is_empty()).map(|n| n.path.as_str()).collect::<Vec<_>>().join(", "),
                    columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        if let Some(c) =
            columns.iter().find(|c| c.not_null && !c.has_default && !layout.iter().any(|(n, _)| *n == c.name))
        {
            return Err(Problem::config(
                "columns",
                format!(
                    "column `{}` of {table} is NOT NULL without a default, and no field is written to it; map a field \
                     to it",
                    c.name
                ),
            ));
        }
        // A struct the records' root is must descend; a root that is a scalar can only go
        // into json_column.
        Ok(Plan { actions, whole, layout: Layout { columns: layout } })
    }

    /// Append `record` as one row to `out`. On a value that does not fit, `out` is left as
    /// it was and the reason is returned (the row is bad; the batch goes on).
    pub(crate) fn encode<T: Serialize + ?Sized>(&self, record: &T, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        out.put_i16(self.layout.columns.len() as i16);
        let mut e = RowEncoder { plan: &self.actions, pos: 0, out };
        let result = match e.node("", record) {
            Ok(()) => {
                debug_assert_eq!(e.pos, self.actions.len(), "a record of another shape");
                if e.pos != self.actions.len() { Err(shape_changed()) } else { Ok(()) }
            }
            Err(err) => Err(err),
        };
        let result = result.and_then(|()| match self.whole {
            None => Ok(()),
            Some(t) => put_json(out, t, record),
        });
        if result.is_err() {
            out.truncate(start);
        }
        result
    }
}

fn shape_changed() -> EncodeError {
    EncodeError(
        "this record's fields differ from the first record's (an optional struct, or an enum?); a record type with a \
         fixed set of fields is written column by column, or give json_column"
            .into(),
    )
}

/// serde's error type for both serializers, and why a row cannot be encoded: a message.
#[derive(Debug)]
pub(crate) struct EncodeError(String);

impl Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EncodeError {}

impl ser::Error for EncodeError {
    fn custom<M: Display>(msg: M) -> Self {
        EncodeError(msg.to_string())
    }
}

/// Writes a length-prefixed value: reserve the length, write, patch it.
fn put_len_prefixed(
    out: &mut BytesMut,
    write: impl FnOnce(&mut BytesMut) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let at = out.len();
    out.put_i32(0);
    write(out)?;
    let len = i32::try_from(out.len() - at - 4).map_err(|_| EncodeError("a value over 2 GiB".to_owned()))?;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

fn put_json<T: Serialize + ?Sized>(out: &mut BytesMut, ty: PgType, value: &T) -> Result<(), EncodeError> {
    put_len_prefixed(out, |out| {
        if ty == PgType::Jsonb {
            out.put_u8(1); // jsonb's binary format version
        }
        serde_json::to_writer(out.writer(), value).map_err(|e| EncodeError(format!("cannot write as JSON: {e}")))
    })
}

/// Builds the shape of a record.
struct Shaper {
    nodes: Vec<Node>,
    path: String,
}

impl Shaper {
    fn leaf(&mut self, kind: Kind) -> Result<(), EncodeError> {
        self.nodes.push(Node { path: self.path.clone(), kind, size: 1 });
        Ok(())
    }
}

/// A struct being shaped: its node's index, to set its size at the end.
struct ShapeStruct<'a> {
    s: &'a mut Shaper,
    at: usize,
}

impl ser::SerializeStruct for ShapeStruct<'_> {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_field<V: Serialize + ?Sized>(&mut self, key: &'static str, value: &V) -> Result<(), EncodeError> {
        let len = self.s.path.len();
        if len > 0 {
            self.s.path.push('.');
        }
        self.s.path.push_str(key);
        let r = value.serialize(&mut *self.s);
        self.s.path.truncate(len);
        compound_is_done(r)
    }
    fn end(self) -> Result<(), EncodeError> {
        self.s.nodes[self.at].size = self.s.nodes.len() - self.at;
        Ok(())
    }
}

impl<'a> ser::Serializer for &'a mut Shaper {
    type Ok = ();
    type Error = EncodeError;
    type SerializeSeq = ser::Impossible<(), EncodeError>;
    type SerializeTuple = ser::Impossible<(), EncodeError>;
    type SerializeTupleStruct = ser::Impossible<(), EncodeError>;
    type SerializeTupleVariant = ser::Impossible<(), EncodeError>;
    type SerializeMap = ser::Impossible<(), EncodeError>;
    type SerializeStruct = ShapeStruct<'a>;
    type SerializeStructVariant = ser::Impossible<(), EncodeError>;

    fn serialize_bool(self, _: bool) -> Result<(), EncodeError> {
        self.leaf(Kind::Bool)
    }
    fn serialize_i8(self, _: i8) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_i16(self, _: i16) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_i32(self, _: i32) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_i64(self, _: i64) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_i128(self, _: i128) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_u8(self, _: u8) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_u16(self, _: u16) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_u32(self, _: u32) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_u64(self, _: u64) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_u128(self, _: u128) -> Result<(), EncodeError> {
        self.leaf(Kind::Int)
    }
    fn serialize_f32(self, _: f32) -> Result<(), EncodeError> {
        self.leaf(Kind::Float)
    }
    fn serialize_f64(self, _: f64) -> Result<(), EncodeError> {
        self.leaf(Kind::Float)
    }
    fn serialize_char(self, _: char) -> Result<(), EncodeError> {
        self.leaf(Kind::Str)
    }
    fn serialize_str(self, _: &str) -> Result<(), EncodeError> {
        self.leaf(Kind::Str)
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), EncodeError> {
        self.leaf(Kind::Bytes)
    }
    fn serialize_none(self) -> Result<(), EncodeError> {
        self.leaf(Kind::Null)
    }
    fn serialize_some<V: Serialize + ?Sized>(self, value: &V) -> Result<(), EncodeError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), EncodeError> {
        self.leaf(Kind::Null)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), EncodeError> {
        self.leaf(Kind::Null)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), EncodeError> {
        self.leaf(Kind::Str)
    }
    fn serialize_newtype_struct<V: Serialize + ?Sized>(self, _: &'static str, value: &V) -> Result<(), EncodeError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &V,
    ) -> Result<(), EncodeError> {
        self.leaf(Kind::Compound)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, EncodeError> {
        self.leaf(Kind::Compound)?;
        Err(compound_done())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, EncodeError> {
        self.leaf(Kind::Compound)?;
        Err(compound_done())
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, EncodeError> {
        self.leaf(Kind::Compound)?;
        Err(compound_done())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, EncodeError> {
        self.leaf(Kind::Compound)?;
        Err(compound_done())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, EncodeError> {
        self.leaf(Kind::Compound)?;
        Err(compound_done())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, EncodeError> {
        let at = self.nodes.len();
        self.nodes.push(Node { path: self.path.clone(), kind: Kind::Struct, size: 1 });
        Ok(ShapeStruct { s: self, at })
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, EncodeError> {
        self.leaf(Kind::Compound)?;
        Err(compound_done())
    }
}

/// The shaper records a compound value as one node and stops there: serde's compound
/// serializers cannot be skipped, so it answers with this marker, which `ShapeStruct`
/// would pass on — instead the node is recorded first and the marker is caught below.
fn compound_done() -> EncodeError {
    EncodeError(COMPOUND.into())
}

const COMPOUND: &str = "\u{0}compound";

/// A compound value's marker is not an error: its node was recorded.
fn compound_is_done(r: Result<(), EncodeError>) -> Result<(), EncodeError> {
    match r {
        Err(e) if e.0 == COMPOUND => Ok(()),
        r => r,
    }
}

/// Encodes one row.
struct RowEncoder<'p, 'o> {
    plan: &'p [Action],
    /// The node being visited.
    pos: usize,
    out: &'o mut BytesMut,
}

impl RowEncoder<'_, '_> {
    /// Encode `value` at the current node by its action.
    fn node<V: Serialize + ?Sized>(&mut self, path: &str, value: &V) -> Result<(), EncodeError> {
        let Some(&action) = self.plan.get(self.pos) else { return Err(shape_changed()) };
        match action {
            Action::Skip(n) => {
                self.pos += n;
                Ok(())
            }
            Action::Json(ty, n) => {
                self.pos += n;
                put_json(self.out, ty, value).map_err(|e| EncodeError(format!("field `{path}`: {e}")))
            }
            Action::Column(ty) => {
                self.pos += 1;
                value
                    .serialize(Scalar { ty, out: self.out })
                    .map_err(|e| EncodeError(format!("field `{path}`: {}", e.0)))
            }
            Action::Descend => value.serialize(&mut *self),
        }
    }
}

struct RowStruct<'e, 'p, 'o> {
    e: &'e mut RowEncoder<'p, 'o>,
}

impl ser::SerializeStruct for RowStruct<'_, '_, '_> {
    type Ok = ();
    type Error = EncodeError;
    #[inline]
    fn serialize_field<V: Serialize + ?Sized>(&mut self, key: &'static str, value: &V) -> Result<(), EncodeError> {
        self.e.node(key, value)
    }
    fn end(self) -> Result<(), EncodeError> {
        Ok(())
    }
}

impl<'e, 'p, 'o> ser::Serializer for &'e mut RowEncoder<'p, 'o> {
    type Ok = ();
    type Error = EncodeError;
    type SerializeSeq = ser::Impossible<(), EncodeError>;
    type SerializeTuple = ser::Impossible<(), EncodeError>;
    type SerializeTupleStruct = ser::Impossible<(), EncodeError>;
    type SerializeTupleVariant = ser::Impossible<(), EncodeError>;
    type SerializeMap = ser::Impossible<(), EncodeError>;
    type SerializeStruct = RowStruct<'e, 'p, 'o>;
    type SerializeStructVariant = ser::Impossible<(), EncodeError>;

    // Only a struct is descended into: every other value is handled by `node` at its parent.
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, EncodeError> {
        match self.plan.get(self.pos) {
            Some(Action::Descend) => {
                self.pos += 1;
                Ok(RowStruct { e: self })
            }
            _ => Err(shape_changed()),
        }
    }
    fn serialize_newtype_struct<V: Serialize + ?Sized>(self, _: &'static str, value: &V) -> Result<(), EncodeError> {
        value.serialize(self)
    }
    fn serialize_some<V: Serialize + ?Sized>(self, value: &V) -> Result<(), EncodeError> {
        value.serialize(self)
    }
    fn serialize_bool(self, _: bool) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_i8(self, _: i8) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_i16(self, _: i16) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_i32(self, _: i32) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_i64(self, _: i64) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_u8(self, _: u8) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_u16(self, _: u16) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_u32(self, _: u32) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_u64(self, _: u64) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_f32(self, _: f32) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_f64(self, _: f64) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_char(self, _: char) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_str(self, _: &str) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_none(self) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_unit(self) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_newtype_variant<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &V,
    ) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, EncodeError> {
        Err(shape_changed())
    }
}

/// One scalar value into one column (length prefix and value).
struct Scalar<'o> {
    ty: PgType,
    out: &'o mut BytesMut,
}

impl Scalar<'_> {
    fn mismatch(&self, what: &str) -> EncodeError {
        EncodeError(format!("{what} cannot be written as {:?}", self.ty))
    }

    fn int(self, v: i128) -> Result<(), EncodeError> {
        let out = self.out;
        let range = |name: &str| EncodeError(format!("{v} is out of range for {name}"));
        match self.ty {
            PgType::Int2 => {
                let v = i16::try_from(v).map_err(|_| range("smallint"))?;
                out.put_i32(2);
                pg::int2_to_sql(v, out);
            }
            PgType::Int4 => {
                let v = i32::try_from(v).map_err(|_| range("integer"))?;
                out.put_i32(4);
                pg::int4_to_sql(v, out);
            }
            PgType::Int8 => {
                let v = i64::try_from(v).map_err(|_| range("bigint"))?;
                out.put_i32(8);
                pg::int8_to_sql(v, out);
            }
            PgType::Float4 => {
                out.put_i32(4);
                pg::float4_to_sql(v as f32, out);
            }
            PgType::Float8 => {
                out.put_i32(8);
                pg::float8_to_sql(v as f64, out);
            }
            PgType::Numeric => put_len_prefixed(out, |out| numeric(&v.to_string(), out))?,
            PgType::Text => put_text(out, &v.to_string()),
            PgType::Timestamp | PgType::Timestamptz => {
                // Nanoseconds since the Unix epoch, to the microsecond, floored.
                let us = i64::try_from(v.div_euclid(1000)).map_err(|_| range("timestamp"))?;
                let us = us.checked_sub(PG_EPOCH_US).ok_or_else(|| range("timestamp"))?;
                out.put_i32(8);
                pg::timestamp_to_sql(us, out);
            }
            _ => return Err(EncodeError(format!("an integer cannot be written as {:?}", self.ty))),
        }
        Ok(())
    }

    fn float(self, v: f64, single: bool) -> Result<(), EncodeError> {
        let out = self.out;
        match self.ty {
            PgType::Float4 => {
                out.put_i32(4);
                pg::float4_to_sql(v as f32, out);
            }
            PgType::Float8 => {
                out.put_i32(8);
                pg::float8_to_sql(v, out);
            }
            PgType::Numeric => {
                let text = if single { (v as f32).to_string() } else { v.to_string() };
                put_len_prefixed(out, |out| numeric(&text, out))?;
            }
            PgType::Text => put_text(out, &if single { (v as f32).to_string() } else { v.to_string() }),
            _ => return Err(EncodeError(format!("a float cannot be written as {:?}", self.ty))),
        }
        Ok(())
    }

    fn text(self, v: &str) -> Result<(), EncodeError> {
        match self.ty {
            PgType::Text => {
                if v.contains('\0') {
                    return Err(EncodeError("a string with a NUL character (text cannot hold one)".into()));
                }
                put_text(self.out, v);
            }
            PgType::Uuid => {
                let bytes = parse_uuid(v).ok_or_else(|| EncodeError(format!("`{v}` is not a UUID")))?;
                self.out.put_i32(16);
                pg::uuid_to_sql(bytes, self.out);
            }
            PgType::Numeric => put_len_prefixed(self.out, |out| numeric(v, out))?,
            _ => return Err(self.mismatch("a string")),
        }
        Ok(())
    }
}

fn put_text(out: &mut BytesMut, v: &str) {
    out.put_i32(v.len() as i32);
    pg::text_to_sql(v, out);
}

/// A decimal number (`-12.5`, `1e3` not accepted: no exponent; `NaN`, `inf`, `-inf`) in
/// numeric's binary form: digit count, weight, sign, display scale, base-10000 digits.
fn numeric(text: &str, out: &mut BytesMut) -> Result<(), EncodeError> {
    let special = match text {
        "NaN" => Some(0xC000u16),
        "inf" | "Infinity" => Some(0xD000),
        "-inf" | "-Infinity" => Some(0xF000),
        _ => None,
    };
    if let Some(sign) = special {
        out.put_i16(0);
        out.put_i16(0);
        out.put_u16(sign);
        out.put_u16(0);
        return Ok(());
    }
    let (negative, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if (int.is_empty() && frac.is_empty()) || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(EncodeError(format!("`{text}` is not a decimal number")));
    }
    let int = int.trim_start_matches('0');
    // Digits grouped by four from the decimal point: the integer part padded on the left,
    // the fraction on the right.
    let int_pad = (4 - int.len() % 4) % 4;
    let frac_pad = (4 - frac.len() % 4) % 4;
    let digits: Vec<u8> = std::iter::repeat_n(b'0', int_pad)
        .chain(int.bytes())
        .chain(frac.bytes())
        .chain(std::iter::repeat_n(b'0', frac_pad))
        .map(|b| b - b'0')
        .collect();
    let mut groups: Vec<i16> = digits.chunks(4).map(|c| c.iter().fold(0i16, |acc, d| acc * 10 + *d as i16)).collect();
    let mut weight = ((int.len() + int_pad) / 4) as i32 - 1;
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    let too_big = || EncodeError(format!("`{text}` has too many digits for numeric"));
    out.put_i16(i16::try_from(groups.len()).map_err(|_| too_big())?);
    out.put_i16(i16::try_from(weight).map_err(|_| too_big())?);
    out.put_u16(if negative && !groups.is_empty() { 0x4000 } else { 0 });
    out.put_u16(u16::try_from(frac.len()).map_err(|_| too_big())?);
    for g in groups {
        out.put_i16(g);
    }
    Ok(())
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 || !(s.len() == 32 || s.len() == 36) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

impl ser::Serializer for Scalar<'_> {
    type Ok = ();
    type Error = EncodeError;
    type SerializeSeq = ser::Impossible<(), EncodeError>;
    type SerializeTuple = ser::Impossible<(), EncodeError>;
    type SerializeTupleStruct = ser::Impossible<(), EncodeError>;
    type SerializeTupleVariant = ser::Impossible<(), EncodeError>;
    type SerializeMap = ser::Impossible<(), EncodeError>;
    type SerializeStruct = ser::Impossible<(), EncodeError>;
    type SerializeStructVariant = ser::Impossible<(), EncodeError>;

    fn serialize_bool(self, v: bool) -> Result<(), EncodeError> {
        match self.ty {
            PgType::Bool => {
                self.out.put_i32(1);
                pg::bool_to_sql(v, self.out);
                Ok(())
            }
            PgType::Text => {
                put_text(self.out, if v { "true" } else { "false" });
                Ok(())
            }
            _ => Err(self.mismatch("a bool")),
        }
    }
    fn serialize_i8(self, v: i8) -> Result<(), EncodeError> {
        self.int(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<(), EncodeError> {
        self.int(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<(), EncodeError> {
        self.int(v.into())
    }
    #[inline]
    fn serialize_i64(self, v: i64) -> Result<(), EncodeError> {
        // The common case first: a bigint from an integer that fits.
        if self.ty == PgType::Int8 {
            self.out.put_i32(8);
            self.out.put_i64(v);
            return Ok(());
        }
        self.int(v.into())
    }
    fn serialize_i128(self, v: i128) -> Result<(), EncodeError> {
        self.int(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), EncodeError> {
        self.int(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<(), EncodeError> {
        self.int(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<(), EncodeError> {
        self.int(v.into())
    }
    #[inline]
    fn serialize_u64(self, v: u64) -> Result<(), EncodeError> {
        if self.ty == PgType::Int8
            && let Ok(v) = i64::try_from(v)
        {
            self.out.put_i32(8);
            self.out.put_i64(v);
            return Ok(());
        }
        self.int(v.into())
    }
    fn serialize_u128(self, v: u128) -> Result<(), EncodeError> {
        self.int(i128::try_from(v).map_err(|_| EncodeError(format!("{v} is out of range")))?)
    }
    fn serialize_f32(self, v: f32) -> Result<(), EncodeError> {
        self.float(v.into(), true)
    }
    fn serialize_f64(self, v: f64) -> Result<(), EncodeError> {
        self.float(v, false)
    }
    fn serialize_char(self, v: char) -> Result<(), EncodeError> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), EncodeError> {
        self.text(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), EncodeError> {
        match self.ty {
            PgType::Bytea => {
                self.out.put_i32(i32::try_from(v.len()).map_err(|_| EncodeError("bytes over 2 GiB".into()))?);
                pg::bytea_to_sql(v, self.out);
                Ok(())
            }
            _ => Err(self.mismatch("bytes")),
        }
    }
    fn serialize_none(self) -> Result<(), EncodeError> {
        self.out.put_i32(-1);
        Ok(())
    }
    fn serialize_some<V: Serialize + ?Sized>(self, value: &V) -> Result<(), EncodeError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), EncodeError> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), EncodeError> {
        self.serialize_none()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<(), EncodeError> {
        self.text(variant)
    }
    fn serialize_newtype_struct<V: Serialize + ?Sized>(self, _: &'static str, value: &V) -> Result<(), EncodeError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &V,
    ) -> Result<(), EncodeError> {
        Err(shape_changed())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, EncodeError> {
        Err(shape_changed())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, EncodeError> {
        Err(shape_changed())
    }
}

/// The rows of a batch (binary COPY tuples) one by one: the byte range of each.
pub(crate) fn row_ranges(rows: &[u8]) -> Result<Vec<std::ops::Range<usize>>, String> {
    let mut ranges = Vec::new();
    let mut at = 0;
    let read = |at: usize, n: usize| rows.get(at..at + n).ok_or_else(|| "a row is cut short".to_owned());
    while at < rows.len() {
        let start = at;
        let fields = i16::from_be_bytes(read(at, 2)?.try_into().expect("2 bytes"));
        at += 2;
        for _ in 0..fields.max(0) {
            let len = i32::from_be_bytes(read(at, 4)?.try_into().expect("4 bytes"));
            at += 4;
            if len > 0 {
                read(at, len as usize)?;
                at += len as usize;
            }
        }
        ranges.push(start..at);
    }
    Ok(ranges)
}

/// A row read back as JSON (`{"column": value}`), for a dead-letter line.
pub(crate) fn row_json(row: &[u8], layout: &Layout) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    let mut at = 2;
    for (name, ty) in &layout.columns {
        let Some(len) = row.get(at..at + 4).map(|b| i32::from_be_bytes(b.try_into().expect("4 bytes"))) else {
            break;
        };
        at += 4;
        if len < 0 {
            map.insert(name.clone(), serde_json::Value::Null);
            continue;
        }
        let Some(v) = row.get(at..at + len as usize) else { break };
        at += len as usize;
        map.insert(name.clone(), value_json(v, *ty));
    }
    serde_json::Value::Object(map)
}

fn value_json(v: &[u8], ty: PgType) -> serde_json::Value {
    use serde_json::Value as J;
    let fallback = || J::String(v.iter().map(|b| format!("{b:02x}")).collect());
    let result = match ty {
        PgType::Bool => pg::bool_from_sql(v).map(J::from).ok(),
        PgType::Int2 => pg::int2_from_sql(v).map(J::from).ok(),
        PgType::Int4 => pg::int4_from_sql(v).map(J::from).ok(),
        PgType::Int8 => pg::int8_from_sql(v).map(J::from).ok(),
        PgType::Float4 => pg::float4_from_sql(v).map(|f| J::from(f as f64)).ok(),
        PgType::Float8 => pg::float8_from_sql(v).map(J::from).ok(),
        PgType::Text => std::str::from_utf8(v).map(J::from).ok(),
        PgType::Json => serde_json::from_slice(v).ok(),
        PgType::Jsonb => v.split_first().and_then(|(_, j)| serde_json::from_slice(j).ok()),
        // Back to nanoseconds since the Unix epoch, as the field was.
        PgType::Timestamp | PgType::Timestamptz => pg::timestamp_from_sql(v)
            .ok()
            .and_then(|us| us.checked_add(PG_EPOCH_US))
            .and_then(|us| us.checked_mul(1000))
            .map(J::from),
        PgType::Uuid => pg::uuid_from_sql(v).ok().map(|b| {
            let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
            J::from(format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]))
        }),
        PgType::Numeric | PgType::Bytea => None,
    };
    result.unwrap_or_else(fallback)
}

/// The rows of a fixed-layout record type (`fixed_record!`: a `#[repr(C)]` struct of numbers
/// and bools) read straight from each field's offset — no serde walk of the record per row.
/// Each value goes through the same [`Scalar`] conversion the plan uses, so the bytes are the
/// plan's; a value the column cannot hold is left to the plan, for its message.
#[derive(Debug, Clone)]
pub(crate) struct FixedPlan {
    /// `size_of` the record.
    size: usize,
    /// The written fields, in COPY order.
    columns: Vec<FixedColumn>,
    /// Every column a number or bool whose binary form the row can take without a
    /// conversion that allocates (text, numeric): the row is built on the stack.
    direct: bool,
}

#[derive(Debug, Clone, Copy)]
struct FixedColumn {
    offset: usize,
    field: FieldType,
    to: PgType,
}

/// A field of a fixed layout as the fast path reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldType {
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F32,
    F64,
    Bool,
}

/// The largest record the fast path copies to the stack.
const FIXED_MAX: usize = 512;

impl FixedPlan {
    /// The fast path for `plan` over records of `schema` whose shape is `shape`, if every
    /// written field is a top-level number or bool at a known offset (else `None`: the plan
    /// encodes every row).
    pub(crate) fn new(plan: &Plan, shape: &[Node], schema: &crate::record::schema::TypeSchema) -> Option<FixedPlan> {
        use crate::record::schema::{Codec, Scalar as S, Shape};
        let Codec::Fixed { size } = schema.codec else { return None };
        let Shape::Struct(fields) = &schema.shape else { return None };
        let size = size as usize;
        if plan.whole.is_some() || size > FIXED_MAX || plan.actions.len() != shape.len() {
            return None;
        }
        if plan.actions.first() != Some(&Action::Descend) || shape.first().is_none_or(|n| !n.path.is_empty()) {
            return None;
        }
        let mut columns = Vec::new();
        for (action, node) in plan.actions.iter().zip(shape).skip(1) {
            let to = match *action {
                Action::Skip(1) => continue,
                Action::Column(ty) => ty,
                _ => return None,
            };
            let field = fields.iter().find(|f| f.name == node.path)?;
            // What serde wrote for the field must be the field's own kind of value.
            let kind = match field.ty {
                S::F32 | S::F64 => Kind::Float,
                S::Bool => Kind::Bool,
                _ => Kind::Int,
            };
            if node.kind != kind {
                return None;
            }
            let field_type = match field.ty {
                S::U8 => FieldType::U8,
                S::U16 => FieldType::U16,
                S::U32 => FieldType::U32,
                S::U64 => FieldType::U64,
                S::I8 => FieldType::I8,
                S::I16 => FieldType::I16,
                S::I32 => FieldType::I32,
                S::I64 => FieldType::I64,
                S::F32 => FieldType::F32,
                S::F64 => FieldType::F64,
                S::Bool => FieldType::Bool,
                _ => return None,
            };
            let offset = field.offset? as usize;
            if offset + field_type.width() > size {
                return None;
            }
            columns.push(FixedColumn { offset, field: field_type, to });
        }
        let direct = columns.iter().all(|c| c.direct_width().is_some())
            && 2 + columns.iter().filter_map(|c| c.direct_width()).sum::<usize>() <= ROW_MAX;
        (columns.len() == plan.layout.columns.len()).then_some(FixedPlan { size, columns, direct })
    }

    /// Append `record` as one row to `out`; `Err` (and `out` as it was) when a value does
    /// not fit its column: the caller encodes that row with the plan, for the reason.
    #[inline]
    pub(crate) fn encode<T: crate::record::Record>(&self, record: &T, out: &mut BytesMut) -> Result<(), ()> {
        // The record's size as a constant (the copy inlined), and a small buffer to zero for
        // a small record: each costs as much as the row otherwise.
        let size = std::mem::size_of::<T>();
        if size == self.size && size <= 64 {
            let mut bytes = [0u8; 64];
            record.encode(&mut bytes[..size]);
            if self.direct { self.direct_row(&bytes[..size], out) } else { self.encode_bytes(&bytes[..size], out) }
        } else {
            let mut bytes = [0u8; FIXED_MAX];
            record.encode(&mut bytes[..self.size]);
            self.encode_bytes(&bytes[..self.size], out)
        }
    }

    /// The row, each value's length and bytes made in registers and appended as one
    /// constant-size piece (no `memcpy` call, no serde); `Err` (and `out` as it was) when a
    /// value does not fit.
    #[inline]
    fn direct_row(&self, bytes: &[u8], out: &mut BytesMut) -> Result<(), ()> {
        let start = out.len();
        out.reserve(ROW_MAX);
        out.put_i16(self.columns.len() as i16);
        for c in &self.columns {
            if c.direct(bytes, out).is_none() {
                out.truncate(start);
                return Err(());
            }
        }
        Ok(())
    }

    #[inline]
    fn encode_bytes(&self, bytes: &[u8], out: &mut BytesMut) -> Result<(), ()> {
        let start = out.len();
        out.put_i16(self.columns.len() as i16);
        for c in &self.columns {
            if c.put(bytes, out).is_err() {
                out.truncate(start);
                return Err(());
            }
        }
        Ok(())
    }
}

impl FieldType {
    fn width(self) -> usize {
        match self {
            FieldType::U8 | FieldType::I8 | FieldType::Bool => 1,
            FieldType::U16 | FieldType::I16 => 2,
            FieldType::U32 | FieldType::I32 | FieldType::F32 => 4,
            FieldType::U64 | FieldType::I64 | FieldType::F64 => 8,
        }
    }
}

/// The longest row the stack takes.
const ROW_MAX: usize = 256;

impl FixedColumn {
    /// Bytes this column takes in a row built on the stack (length and value), if it can.
    fn direct_width(&self) -> Option<usize> {
        let int = !matches!(self.field, FieldType::F32 | FieldType::F64 | FieldType::Bool);
        match self.to {
            PgType::Int8 if int => Some(12),
            PgType::Int4 if int => Some(8),
            PgType::Int2 if int => Some(6),
            PgType::Float8 if matches!(self.field, FieldType::F32 | FieldType::F64) => Some(12),
            PgType::Float4 if self.field == FieldType::F32 => Some(8),
            PgType::Bool if self.field == FieldType::Bool => Some(5),
            _ => None,
        }
    }

    /// The field as an integer (`None`: not an integer field).
    #[inline]
    fn int(&self, bytes: &[u8]) -> Option<i128> {
        let at = self.offset;
        let b2 = || [bytes[at], bytes[at + 1]];
        let b4 = || <[u8; 4]>::try_from(&bytes[at..at + 4]).expect("4 bytes");
        let b8 = || <[u8; 8]>::try_from(&bytes[at..at + 8]).expect("8 bytes");
        Some(match self.field {
            FieldType::U8 => bytes[at].into(),
            FieldType::U16 => u16::from_ne_bytes(b2()).into(),
            FieldType::U32 => u32::from_ne_bytes(b4()).into(),
            FieldType::U64 => u64::from_ne_bytes(b8()).into(),
            FieldType::I8 => (bytes[at] as i8).into(),
            FieldType::I16 => i16::from_ne_bytes(b2()).into(),
            FieldType::I32 => i32::from_ne_bytes(b4()).into(),
            FieldType::I64 => i64::from_ne_bytes(b8()).into(),
            _ => return None,
        })
    }

    /// Append length and value to `out` (room reserved by the caller); `None` when it does
    /// not fit (the same conversions and range checks as [`Scalar`]).
    #[inline]
    fn direct(&self, bytes: &[u8], out: &mut BytesMut) -> Option<()> {
        let at = self.offset;
        // A 64-bit integer into a bigint first: the common column.
        if self.to == PgType::Int8 && matches!(self.field, FieldType::U64 | FieldType::I64) {
            let raw = <[u8; 8]>::try_from(&bytes[at..at + 8]).ok()?;
            let v = if self.field == FieldType::U64 {
                i64::try_from(u64::from_ne_bytes(raw)).ok()?
            } else {
                i64::from_ne_bytes(raw)
            };
            let cell = ((8u128) << 64 | u128::from(v as u64)).to_be_bytes();
            out.put_slice(&cell[4..]);
            return Some(());
        }
        match self.to {
            PgType::Int8 => {
                out.put_i32(8);
                out.put_i64(i64::try_from(self.int(bytes)?).ok()?);
            }
            PgType::Int4 => {
                out.put_i32(4);
                out.put_i32(i32::try_from(self.int(bytes)?).ok()?);
            }
            PgType::Int2 => {
                out.put_i32(2);
                out.put_i16(i16::try_from(self.int(bytes)?).ok()?);
            }
            PgType::Float8 => {
                let v = match self.field {
                    FieldType::F64 => f64::from_ne_bytes(bytes[at..at + 8].try_into().ok()?),
                    _ => f32::from_ne_bytes(bytes[at..at + 4].try_into().ok()?).into(),
                };
                out.put_i32(8);
                out.put_f64(v);
            }
            PgType::Float4 => {
                // Through f64 as serde's path goes (a signalling NaN comes out quiet there too).
                let v = f64::from(f32::from_ne_bytes(bytes[at..at + 4].try_into().ok()?));
                out.put_i32(4);
                out.put_f32(v as f32);
            }
            PgType::Bool => {
                out.put_i32(1);
                out.put_u8(u8::from(bytes[at] != 0));
            }
            _ => return None,
        }
        Some(())
    }

    #[inline]
    fn put(&self, bytes: &[u8], out: &mut BytesMut) -> Result<(), EncodeError> {
        use ser::Serializer as _;
        let at = self.offset;
        let b1 = || bytes[at];
        let b2 = || [bytes[at], bytes[at + 1]];
        let b4 = || <[u8; 4]>::try_from(&bytes[at..at + 4]).expect("4 bytes");
        let b8 = || <[u8; 8]>::try_from(&bytes[at..at + 8]).expect("8 bytes");
        let s = Scalar { ty: self.to, out };
        match self.field {
            FieldType::U8 => s.serialize_u8(b1()),
            FieldType::U16 => s.serialize_u16(u16::from_ne_bytes(b2())),
            FieldType::U32 => s.serialize_u32(u32::from_ne_bytes(b4())),
            FieldType::U64 => s.serialize_u64(u64::from_ne_bytes(b8())),
            FieldType::I8 => s.serialize_i8(b1() as i8),
            FieldType::I16 => s.serialize_i16(i16::from_ne_bytes(b2())),
            FieldType::I32 => s.serialize_i32(i32::from_ne_bytes(b4())),
            FieldType::I64 => s.serialize_i64(i64::from_ne_bytes(b8())),
            FieldType::F32 => s.serialize_f32(f32::from_ne_bytes(b4())),
            FieldType::F64 => s.serialize_f64(f64::from_ne_bytes(b8())),
            FieldType::Bool => s.serialize_bool(b1() != 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Event, JoinedEvents};

    fn col(name: &str, ty: PgType) -> TableColumn {
        TableColumn {
            name: name.into(),
            type_name: format!("{ty:?}"),
            ty: Some(ty),
            not_null: false,
            has_default: false,
        }
    }

    /// A struct's shape lists every field in order, nested ones with dotted paths.
    #[test]
    fn shapes_are_dotted_paths() {
        let s = shape(&JoinedEvents::default()).unwrap();
        let paths: Vec<&str> = s.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths[..3], ["", "left", "left.key"]);
        assert_eq!(s[0].size, s.len());
        assert_eq!(s[1].size, 5);
        assert_eq!(s.last().unwrap().path, "matched");
    }

    /// Rows encode field by field in the record's order, and read back.
    #[test]
    fn rows_encode_and_read_back() {
        let cols = [col("key", PgType::Int8), col("value", PgType::Int4), col("seq", PgType::Text)];
        let e = Event { key: 7, value: 9, time_ns: 1, seq: 42 };
        let plan = Plan::new(&shape(&e).unwrap(), &cols, &[], None, "t").unwrap();
        assert_eq!(plan.layout.column_list(), "key, value, seq");
        let mut out = BytesMut::new();
        plan.encode(&e, &mut out).unwrap();
        plan.encode(&Event { key: 1, value: 2, time_ns: 3, seq: 4 }, &mut out).unwrap();
        let ranges = row_ranges(&out).unwrap();
        assert_eq!(ranges.len(), 2);
        assert_eq!(
            row_json(&out[ranges[0].clone()], &plan.layout),
            serde_json::json!({"key": 7, "value": 9, "seq": "42"})
        );
        // A value out of range leaves the batch as it was.
        let before = out.len();
        let err =
            plan.encode(&Event { key: 1, value: u64::MAX, time_ns: 0, seq: 0 }, &mut out).unwrap_err().to_string();
        assert!(err.contains("field `value`") && err.contains("out of range for integer"), "{err}");
        assert_eq!(out.len(), before);
    }

    /// An explicit mapping, nested fields, a struct as JSON and the whole record as JSON.
    #[test]
    fn mapping_nested_and_json() {
        let cols = [
            col("l", PgType::Int8),
            col("right_doc", PgType::Jsonb),
            col("at", PgType::Timestamptz),
            col("doc", PgType::Json),
        ];
        let j = JoinedEvents::new(&Event { key: 3, value: 0, time_ns: 946_684_800_000_001_000, seq: 0 }, None);
        let mapping = vec![
            ("left.key".into(), "l".into()),
            ("right".into(), "right_doc".into()),
            ("left.time_ns".into(), "at".into()),
        ];
        let plan = Plan::new(&shape(&j).unwrap(), &cols, &mapping, Some("doc"), "t").unwrap();
        assert_eq!(plan.layout.column_list(), "l, at, right_doc, doc");
        let mut out = BytesMut::new();
        plan.encode(&j, &mut out).unwrap();
        let row = row_json(&out, &plan.layout);
        assert_eq!(row["l"], 3);
        assert_eq!(row["at"], 946_684_800_000_001_000i64);
        assert_eq!(row["right_doc"]["key"], 0);
        assert_eq!(row["doc"]["left"]["key"], 3);
    }

    /// Settings that cannot fit are named: a missing field or column, a type that cannot
    /// take the field, a NOT NULL column left out, no column at all.
    #[test]
    fn mismatches_name_the_setting() {
        let s = shape(&Event::default()).unwrap();
        let e = |cols: &[TableColumn], mapping: &[(&str, &str)], json: Option<&str>| {
            let m: Vec<(String, String)> = mapping.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
            Plan::new(&s, cols, &m, json, "t").unwrap_err()
        };
        let p = e(&[col("k", PgType::Int8)], &[("user", "k")], None);
        assert_eq!(p.setting.as_deref(), Some("columns.user"));
        assert!(p.reason.contains("no field `user`") && p.reason.contains("key, value"), "{}", p.reason);
        let p = e(&[col("k", PgType::Int8)], &[("key", "kk")], None);
        assert!(p.reason.contains("no column `kk`"), "{}", p.reason);
        let p = e(&[col("key", PgType::Bool)], &[], None);
        assert_eq!(p.setting.as_deref(), Some("columns.key"));
        assert!(p.reason.contains("an integer"), "{}", p.reason);
        let p = e(&[col("x", PgType::Int8)], &[], None);
        assert_eq!(p.setting.as_deref(), Some("columns"));
        let mut nn = col("must", PgType::Int8);
        nn.not_null = true;
        let p = e(&[col("key", PgType::Int8), nn], &[], None);
        assert!(p.reason.contains("`must`") && p.reason.contains("NOT NULL"), "{}", p.reason);
        let p = e(&[col("key", PgType::Int8), col("d", PgType::Int8)], &[], Some("d"));
        assert_eq!(p.setting.as_deref(), Some("json_column"));
    }

    /// numeric's binary form, against what the server sends for the same numbers.
    #[test]
    fn numeric_digits() {
        let enc = |t: &str| {
            let mut b = BytesMut::new();
            numeric(t, &mut b).unwrap();
            b.to_vec()
        };
        // 12345.678: digits [1, 2345, 6780], weight 1, dscale 3.
        assert_eq!(enc("12345.678"), [0, 3, 0, 1, 0, 0, 0, 3, 0, 1, 0x09, 0x29, 0x1a, 0x7c]);
        assert_eq!(enc("-0.5"), [0, 1, 0xff, 0xff, 0x40, 0, 0, 1, 0x13, 0x88]);
        assert_eq!(enc("0"), [0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(enc("10000"), [0, 1, 0, 1, 0, 0, 0, 0, 0, 1]);
        assert!(numeric("1e5", &mut BytesMut::new()).is_err());
    }

    #[test]
    fn uuids_parse() {
        assert_eq!(parse_uuid("00010203-0405-0607-0809-0a0b0c0d0e0f").unwrap()[15], 15);
        assert!(parse_uuid("xyz").is_none());
    }

    /// A fixed-layout record of every number width and a bool, for the fast path.
    #[derive(
        Clone,
        Copy,
        Debug,
        Default,
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::Immutable,
        zerocopy::KnownLayout,
        serde::Serialize,
    )]
    #[repr(C)]
    struct Wide {
        a: u64,
        b: i64,
        c: f64,
        d: u32,
        e: i32,
        f: f32,
        g: u16,
        h: i16,
        i: u8,
        j: i8,
        k: u8,
        l: u8,
        /// Not written (no column): skipped.
        m: u32,
    }
    crate::fixed_record!(Wide {
        a: u64,
        b: i64,
        c: f64,
        d: u32,
        e: i32,
        f: f32,
        g: u16,
        h: i16,
        i: u8,
        j: i8,
        k: u8,
        l: u8,
        m: u32
    });

    /// The fast path of a fixed-layout record writes the plan's bytes, row for row, and
    /// leaves a value that does not fit to the plan (same rows, same errors) — on the stack
    /// path (numbers and bools into numbers) and the per-value one (text, numeric, timestamps).
    #[test]
    fn fixed_records_encode_as_the_plan_does() {
        use crate::record::Record;
        let direct = [
            col("a", PgType::Int8),
            col("b", PgType::Int4),
            col("c", PgType::Float8),
            col("d", PgType::Int2),
            col("e", PgType::Int8),
            col("f", PgType::Float4),
            col("g", PgType::Int4),
            col("h", PgType::Int2),
            col("i", PgType::Int2),
            col("j", PgType::Int8),
        ];
        let mut per_value = direct.to_vec();
        per_value[1] = col("b", PgType::Text);
        per_value[2] = col("c", PgType::Numeric);
        per_value[4] = col("e", PgType::Timestamptz);
        per_value[5] = col("f", PgType::Float8);
        let rows = [
            Wide::default(),
            Wide {
                a: 1,
                b: -2,
                c: 2.5,
                d: 7,
                e: -9,
                f: 1.25,
                g: 65_535,
                h: -32_768,
                i: 255,
                j: -128,
                k: 0,
                l: 0,
                m: 5,
            },
            Wide {
                a: i64::MAX as u64,
                b: i32::MIN.into(),
                c: -0.0,
                d: 32_767,
                e: i32::MAX,
                f: f32::MIN,
                ..Wide::default()
            },
            Wide { a: u64::MAX, ..Wide::default() }, // does not fit a bigint
            Wide { b: i64::MAX, ..Wide::default() }, // does not fit an integer
            Wide { d: 40_000, ..Wide::default() },   // does not fit a smallint
            Wide { e: 1_000_000, f: f32::NAN, ..Wide::default() },
        ];
        for cols in [&direct[..], &per_value[..]] {
            let shape = shape(&rows[0]).unwrap();
            let plan = Plan::new(&shape, cols, &[], None, "t").unwrap();
            let fixed = FixedPlan::new(&plan, &shape, &Wide::schema()).expect("a fixed plan");
            assert_eq!(fixed.direct, std::ptr::eq(cols, &direct[..]), "the stack path is taken for numbers only");
            let (mut slow, mut fast) = (BytesMut::new(), BytesMut::new());
            for (n, r) in rows.iter().enumerate() {
                let s = plan.encode(r, &mut slow).map_err(|e| e.to_string());
                let f = fixed.encode(r, &mut fast);
                assert_eq!(s.is_ok(), f.is_ok(), "row {n}: {s:?}");
                assert_eq!(slow, fast, "row {n}");
            }
            // Rows 3, 4 and 5 do not fit the numbers; as text, row 4's `b` does.
            let fits = if fixed.direct { 4 } else { 5 };
            assert_eq!(row_ranges(&fast).unwrap().len(), fits);
        }
        // A record as JSON, or a nested struct: no fast path.
        let cols = [col("a", PgType::Int8), col("doc", PgType::Jsonb)];
        let plan = Plan::new(&shape(&rows[0]).unwrap(), &cols, &[], Some("doc"), "t").unwrap();
        assert!(FixedPlan::new(&plan, &shape(&rows[0]).unwrap(), &Wide::schema()).is_none());
    }
}
