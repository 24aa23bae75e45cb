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
pub type Keys = &'static [&'static [&'static str]];

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
        s.allowed = &[&["type"]];
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
    pub fn take<T: DeserializeOwned>(&mut self, key: &'static str) -> Result<Option<Spanned<T>>, JobFileError> {
        assert!(
            self.allowed.iter().any(|group| group.contains(&key)),
            "the reader of {} nodes takes `{key}`, which is not in their keys",
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
    pub fn required<T: DeserializeOwned>(&mut self, key: &'static str, hint: &str) -> Result<Spanned<T>, JobFileError> {
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
