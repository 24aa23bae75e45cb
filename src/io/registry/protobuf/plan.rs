//! What the wire reader and writer need of a schema's messages, taken from the descriptors
//! once per schema: every message's fields (number, name, kind, shape) in plain vectors, so
//! the record path does no descriptor lookups and clones no handles (prost-reflect's
//! descriptors are handles into a shared pool: each field visited that way costs a reference
//! count).

use prost_reflect::{DescriptorPool, FieldDescriptor, Kind};
use rustc_hash::FxHashMap;

/// A field's type; messages and enums by their index in [`Plans`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ty {
    Double,
    Float,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Sint32,
    Sint64,
    Fixed32,
    Fixed64,
    Sfixed32,
    Sfixed64,
    Bool,
    String,
    Bytes,
    Enum(usize),
    Message(usize),
}

/// Whether a field holds one value, a list, or a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// `presence`: explicitly optional or in a oneof (absent is none; written even at its
    /// default).
    Single {
        presence: bool,
    },
    List {
        packed: bool,
    },
    Map {
        key: Ty,
        value: Ty,
    },
}

#[derive(Debug)]
pub(super) struct FieldPlan {
    pub number: u32,
    pub name: Box<str>,
    pub kind: Ty,
    pub shape: Shape,
}

#[derive(Debug)]
pub(super) struct MessagePlan {
    pub full_name: Box<str>,
    /// In declaration order.
    pub fields: Vec<FieldPlan>,
    /// Field index by proto name and by JSON name.
    by_name: FxHashMap<Box<str>, usize>,
}

impl MessagePlan {
    /// The index of the field called `name` (its proto or JSON name).
    pub fn field_named(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}

#[derive(Debug)]
pub(super) struct EnumPlan {
    pub full_name: Box<str>,
    /// (number, name) in declaration order: the first is the default.
    pub values: Vec<(i32, Box<str>)>,
}

impl EnumPlan {
    pub fn name_of(&self, number: i32) -> Option<&str> {
        self.values.iter().find(|(n, _)| *n == number).map(|(_, name)| &**name)
    }

    pub fn number_of(&self, name: &str) -> Option<i32> {
        self.values.iter().find(|(_, v)| &**v == name).map(|(n, _)| *n)
    }
}

/// Every message and enum of a descriptor pool (a schema and what it imports).
#[derive(Debug)]
pub(super) struct Plans {
    pub messages: Vec<MessagePlan>,
    pub enums: Vec<EnumPlan>,
    message_index: FxHashMap<Box<str>, usize>,
}

impl Plans {
    pub fn new(pool: &DescriptorPool) -> Plans {
        let message_index: FxHashMap<Box<str>, usize> =
            pool.all_messages().enumerate().map(|(i, m)| (m.full_name().into(), i)).collect();
        let enums: Vec<EnumPlan> = pool
            .all_enums()
            .map(|e| EnumPlan {
                full_name: e.full_name().into(),
                values: e.values().map(|v| (v.number(), v.name().into())).collect(),
            })
            .collect();
        let enum_index: FxHashMap<&str, usize> = enums.iter().enumerate().map(|(i, e)| (&*e.full_name, i)).collect();
        let kind = |k: &Kind| -> Ty {
            match k {
                Kind::Double => Ty::Double,
                Kind::Float => Ty::Float,
                Kind::Int32 => Ty::Int32,
                Kind::Int64 => Ty::Int64,
                Kind::Uint32 => Ty::Uint32,
                Kind::Uint64 => Ty::Uint64,
                Kind::Sint32 => Ty::Sint32,
                Kind::Sint64 => Ty::Sint64,
                Kind::Fixed32 => Ty::Fixed32,
                Kind::Fixed64 => Ty::Fixed64,
                Kind::Sfixed32 => Ty::Sfixed32,
                Kind::Sfixed64 => Ty::Sfixed64,
                Kind::Bool => Ty::Bool,
                Kind::String => Ty::String,
                Kind::Bytes => Ty::Bytes,
                Kind::Enum(e) => Ty::Enum(enum_index[e.full_name()]),
                Kind::Message(m) => Ty::Message(message_index[m.full_name()]),
            }
        };
        let field = |f: FieldDescriptor| -> FieldPlan {
            let shape = match f.kind() {
                Kind::Message(entry) if f.is_map() => Shape::Map {
                    key: kind(&entry.map_entry_key_field().kind()),
                    value: kind(&entry.map_entry_value_field().kind()),
                },
                _ if f.is_list() => Shape::List { packed: f.is_packed() },
                _ => Shape::Single { presence: f.supports_presence() },
            };
            FieldPlan { number: f.number(), name: f.name().into(), kind: kind(&f.kind()), shape }
        };
        let messages = pool
            .all_messages()
            .map(|m| {
                let fields: Vec<FieldPlan> = m.fields().map(field).collect();
                let mut by_name = FxHashMap::default();
                for (i, f) in m.fields().enumerate() {
                    by_name.insert(f.json_name().into(), i);
                }
                for (i, f) in fields.iter().enumerate() {
                    by_name.insert(f.name.clone(), i);
                }
                MessagePlan { full_name: m.full_name().into(), fields, by_name }
            })
            .collect();
        Plans { messages, enums, message_index }
    }

    /// The index of the message `full_name`.
    pub fn message(&self, full_name: &str) -> Option<usize> {
        self.message_index.get(full_name).copied()
    }

    /// How errors name a kind.
    pub fn kind_name(&self, kind: Ty) -> String {
        match kind {
            Ty::Message(m) => format!("the message {}", self.messages[m].full_name),
            Ty::Enum(e) => format!("the enum {}", self.enums[e].full_name),
            k => format!("{k:?}").to_lowercase(),
        }
    }
}
