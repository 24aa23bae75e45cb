//! The job-file format, apart from what a file describes: `${VAR}` interpolation, errors that
//! name the file, the line, the column and the field, and [`Section`], one node's settings,
//! from which each connector and operator takes the keys it owns.
//!
//! The catalogue of node types (`graph::jobfile`) hands every node's table to the code that
//! builds that type; the keys it took are its settings, and a key left over is a mistake the
//! catalogue names ("`url` is not a setting of a file sink; it belongs to http sinks").

mod format;

pub(crate) use format::Loc;
pub use format::{JobFileError, interpolate};

use serde::Deserialize as _;
use serde::de::{DeserializeOwned, IntoDeserializer};
use std::ops::Range;
use toml::Spanned;
use toml::de::DeValue;

/// The keys a node type reads, in groups (its own, and shared ones such as event time).
pub type Keys = &'static [&'static [Key]];

/// One key of a job-file section, and what the reference says of it.
///
/// A node type's keys are the parser's allow-list: [`Section::take`] refuses to take any
/// other, and takes a key only as the TOML type given here (both are programmer errors:
/// panics). The job-file reference (`weir::guide::reference::job_file`) is generated from
/// these tables, so it cannot name a key the parser does not read, or give it another type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// The key as written in the file.
    pub name: &'static str,
    /// Its TOML type.
    pub ty: KeyType,
    /// The default in words (`"1000"`, `"the node's id"`), [`REQUIRED`] when the node must
    /// have it, [`UNSET`] when leaving it out turns its behaviour off.
    pub default: &'static str,
    /// What it does, in a sentence or two (Markdown).
    pub doc: &'static str,
    /// Which promise of the job it bears on.
    pub affects: Affects,
}

/// [`Key::default`] of a key the node must have.
pub const REQUIRED: &str = "required";
/// [`Key::default`] of a key whose absence turns its behaviour off.
pub const UNSET: &str = "unset";

impl Key {
    /// A key that bears on no promise of the job (see [`Key::affects`] to say which).
    pub const fn new(name: &'static str, ty: KeyType, default: &'static str, doc: &'static str) -> Key {
        Key { name, ty, default, doc, affects: Affects::Nothing }
    }

    /// The same key, bearing on `affects`.
    pub const fn affects(self, affects: Affects) -> Key {
        Key { affects, ..self }
    }
}

/// The TOML type of a key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// A string.
    String,
    /// An integer.
    Integer,
    /// A float or an integer.
    Number,
    /// `true` or `false`.
    Boolean,
    /// An array of strings.
    Strings,
    /// An array of integers.
    Integers,
    /// A table of names to strings, numbers or booleans.
    Table,
}

impl KeyType {
    /// The type as the reference names it.
    pub fn name(self) -> &'static str {
        match self {
            KeyType::String => "string",
            KeyType::Integer => "integer",
            KeyType::Number => "number",
            KeyType::Boolean => "boolean",
            KeyType::Strings => "array of strings",
            KeyType::Integers => "array of integers",
            KeyType::Table => "table",
        }
    }
}

/// The Rust types a key is taken as, and the TOML type each reads ([`Section::take`] checks
/// it against the key's [`KeyType`]).
pub trait TomlType {
    /// What this type reads.
    const TYPE: KeyType;
}

macro_rules! toml_type {
    ($ty:expr => $($t:ty),*) => { $(impl TomlType for $t { const TYPE: KeyType = $ty; })* };
}
toml_type!(KeyType::String => String);
toml_type!(KeyType::Integer => u64, u32, usize, i64);
toml_type!(KeyType::Number => f64);
toml_type!(KeyType::Boolean => bool);
toml_type!(KeyType::Strings => Vec<String>, Vec<Spanned<String>>);
toml_type!(KeyType::Integers => Vec<usize>, Vec<u64>);
toml_type!(KeyType::Table => std::collections::BTreeMap<String, toml::Value>, std::collections::BTreeMap<String, String>);

/// Which promise of a job a key bears on (the reference's "affects" column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affects {
    /// None of them: naming, formats, convenience.
    Nothing,
    /// Delivery: exactly once, at least once, what a replay writes again.
    Delivery,
    /// The memory budget: what the job holds.
    Memory,
    /// Latency and CPU: how long records and barriers wait, what waiting costs.
    Latency,
    /// Results: which records count, when windows fire, what is late.
    Results,
    /// Recovery: what a checkpoint holds and what a restore can do.
    Recovery,
    /// Failure handling: what fails the job, what is retried, what is set aside.
    Failures,
    /// Security: secrets, certificates, who may attach.
    Security,
}

impl Affects {
    /// The column's words.
    pub fn name(self) -> &'static str {
        match self {
            Affects::Nothing => "–",
            Affects::Delivery => "delivery",
            Affects::Memory => "memory",
            Affects::Latency => "latency",
            Affects::Results => "results",
            Affects::Recovery => "recovery",
            Affects::Failures => "failures",
            Affects::Security => "security",
        }
    }
}

/// What a job file is told when it names what this build left out (`what`: "a kafka source",
/// `format = "avro"`): the Cargo feature that has it, and how to build with it.
pub fn not_built(what: &str, feature: &str) -> String {
    format!(
        "{what} needs weir built with the `{feature}` feature, and this build has none: build with \
         `--features {feature}` (or `full`), or depend on weir with features = [\"{feature}\"]"
    )
}

/// `type`: every node's first key, read before its type is known.
pub const TYPE_KEY: Key = Key::new("type", KeyType::String, REQUIRED, "Which kind of node this is.");

/// One node's table (`sink[2]`, say): its type, and the keys not taken yet.
#[derive(Debug)]
pub struct Section<'a> {
    loc: &'a Loc<'a>,
    /// `source[0]`, `operator[3]`, `sink[1]`: what messages call the node.
    name: String,
    /// `source`, `operator` or `sink`.
    noun: &'static str,
    kind: Spanned<String>,
    /// The keys this node's type may take; taking another one is a bug in its reader.
    allowed: Keys,
    keys: Vec<(Spanned<String>, Spanned<DeValue<'a>>)>,
    /// Where every key's value was, taken or not (for errors found after building).
    spans: Vec<(String, Range<usize>)>,
}

impl<'a> Section<'a> {
    /// The table of a node: `name` is how messages call it (`sink[1]`), `noun` its section.
    pub(crate) fn new(
        loc: &'a Loc<'a>,
        name: String,
        noun: &'static str,
        table: toml::de::DeTable<'a>,
        table_span: Range<usize>,
    ) -> Result<Section<'a>, JobFileError> {
        let mut keys: Vec<(Spanned<String>, Spanned<DeValue<'a>>)> =
            table.into_iter().map(|(k, v)| (Spanned::new(k.span(), k.into_inner().into_owned()), v)).collect();
        keys.sort_by_key(|(k, _)| k.span().start); // file order, for the first stray key
        let spans = keys.iter().map(|(k, v)| (k.get_ref().clone(), v.span())).collect();
        let mut s =
            Section { loc, name, noun, kind: Spanned::new(table_span, String::new()), allowed: &[], keys, spans };
        s.allowed = &[&[TYPE_KEY]];
        let kind = s.required::<String>("type", "say which kind of node it is")?;
        s.kind = kind;
        Ok(s)
    }

    /// The node's `type`.
    pub fn kind(&self) -> &str {
        self.kind.get_ref()
    }

    /// Where the node's `type` is: errors about the node as a whole point there.
    pub fn kind_span(&self) -> Range<usize> {
        self.kind.span()
    }

    /// `source`, `operator` or `sink`.
    pub fn noun(&self) -> &'static str {
        self.noun
    }

    /// Where `key`'s value is in the file, if the node has it (taken or not).
    pub fn span_of(&self, key: &str) -> Option<Range<usize>> {
        self.spans.iter().find(|(k, _)| k == key).map(|(_, s)| s.clone())
    }

    /// From now on the node's reader may take these keys (its type's).
    pub(crate) fn allow(&mut self, keys: Keys) {
        self.allowed = keys;
    }

    /// Take `key`, if the node has it, as a `T` (with where its value is).
    pub fn take<T: DeserializeOwned + TomlType>(
        &mut self,
        key: &'static str,
    ) -> Result<Option<Spanned<T>>, JobFileError> {
        let Some(declared) = self.allowed.iter().flat_map(|group| group.iter()).find(|k| k.name == key) else {
            panic!("the reader of {} nodes takes `{key}`, which is not in their keys", self.kind());
        };
        assert_eq!(
            declared.ty,
            T::TYPE,
            "the reader of {} nodes takes `{key}` as another type than its keys declare",
            self.kind()
        );
        let Some(at) = self.keys.iter().position(|(k, _)| k.get_ref() == key) else { return Ok(None) };
        let (_, value) = self.keys.remove(at);
        let span = value.span();
        Spanned::<T>::deserialize(value.into_deserializer())
            .map(Some)
            .map_err(|e| self.err(e.span().unwrap_or(span), key, e.message().trim().to_owned()))
    }

    /// Take `key`, which the node must have; `hint` says what to write.
    pub fn required<T: DeserializeOwned + TomlType>(
        &mut self,
        key: &'static str,
        hint: &str,
    ) -> Result<Spanned<T>, JobFileError> {
        self.take(key)?.ok_or_else(|| {
            let what = if self.kind().is_empty() { self.noun.to_owned() } else { format!("`{}` node", self.kind()) };
            self.err(self.kind_span(), key, format!("a {what} needs `{key}`; {hint}"))
        })
    }

    /// An error at `span` about `key` of this node.
    pub fn err(&self, span: Range<usize>, key: &str, message: impl Into<String>) -> JobFileError {
        self.loc.err(Some(span), self.field(key), message)
    }

    /// `sink[1].url`.
    pub fn field(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }

    /// The first key no reader took: its name and where it is.
    pub fn leftover(&self) -> Option<(&str, Range<usize>)> {
        self.keys.first().map(|(k, _)| (k.get_ref().as_str(), k.span()))
    }
}
