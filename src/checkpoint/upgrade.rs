//! State that carries its schema, and a restore into a changed job.
//!
//! **Each operator's bytes in an envelope.** Since manifest format 2 every non-empty
//! `<node>.state` file starts with an envelope that says what wrote it:
//!
//! ```text
//!  0          8              12             16                16 + n
//!  +----------+--------------+--------------+-----------------+------------------+
//!  | weirstat | version u32  | tag bytes n  | tag (JSON)      | the operator's   |
//!  | (magic)  | LE (1)       | u32 LE       | StateTag        | own bytes        |
//!  +----------+--------------+--------------+-----------------+------------------+
//! ```
//!
//! The tag ([`StateTag`]) names the kind of operator (`window`, `keyed`, `source`, `sink`),
//! the version of that kind's byte format (an operator's own
//! [`state_version`](crate::operators::KeyedProcess::state_version)), and the schemas of the
//! parts of its state whose types are the job's (a keyed operator's value, list and map
//! states). The operator's bytes inside are its own business: a sink may change them
//! from one version to the next and read the old ones back by their version.
//!
//! **Each node described in the manifest.** The manifest records, per node of the job that
//! took the checkpoint, a [`NodeRecord`]: its operator, its parallelism, how its input is
//! keyed (the `key_by` id and the key's type) and the schema of the state the graph declares
//! (a window's shape, aggregates and accumulator). [`check_upgrade`] compares them with the
//! job being started.
//!
//! **The rules** (a job restored from a checkpoint or savepoint of another version):
//!
//! | what changed | at restore |
//! |---|---|
//! | a node added | starts empty |
//! | a node removed that held state | refused, naming the nodes, unless dropped state is allowed (`--allow-dropped-state`): then its state is left behind |
//! | a node removed that held none (a map, a filter, a stateless sink) | nothing to do |
//! | parallelism, chaining | restored as at another parallelism: state moves by key group |
//! | a keyed node's `key_by` id or key type | refused, naming the node |
//! | a node's operator (a window became a keyed operator) | refused, naming the node |
//! | a window's shape (size, slide, gap, clock) | refused, naming the node |
//! | a window's built-in aggregates (count, sum, min, max, mean) | restored: the accumulator keeps all of them, so an aggregate added is exact for the windows already open too |
//! | a window's accumulator type, a keyed state's value type | converted or refused by [`crate::record::schema`]'s rules, naming node, state and field |
//! | a keyed state no longer declared | refused, naming it, unless dropped state is allowed: then deleted |
//! | the version of an operator's own bytes | its `migrate_state` converts them, or the restore is refused naming node and versions |
//! | the number of key groups | refused (state is laid out by them) |

use super::CheckpointError;
use super::manifest::Manifest;
use crate::record::schema::Migration;
pub use crate::state::{StatePart, check_part};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The first bytes of an enveloped `<node>.state` file.
pub const ENVELOPE_MAGIC: &[u8; 8] = b"weirstat";
/// The envelope's own version.
pub const ENVELOPE_VERSION: u32 = 1;

/// What wrote an operator's bytes: the envelope's tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateTag {
    /// `window`, `keyed`, `source`, `sink`.
    pub kind: String,
    /// The version of that kind's byte format (an operator's own `state_version`).
    pub version: u32,
    /// Parts of the state whose types are the job's, declared as the operator ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<StatePart>,
}

impl StateTag {
    /// A tag of `kind` at `version`, no parts.
    pub fn new(kind: &str, version: u32) -> StateTag {
        StateTag { kind: kind.to_owned(), version, parts: Vec::new() }
    }
}

/// An operator's bytes with the tag of their envelope (`None`: format 1, or empty bytes).
pub type TaggedBytes = (Option<StateTag>, Vec<u8>);

/// `payload` in an envelope tagged `tag` (an empty payload stays empty: nothing to describe).
pub fn envelope(tag: &StateTag, payload: &[u8]) -> Vec<u8> {
    let mut out = envelope_head(tag, payload.len());
    out.reserve_exact(payload.len());
    out.extend_from_slice(payload);
    out
}

/// The envelope's bytes before a payload of `len` bytes (nothing for an empty payload):
/// `envelope(tag, p)` is this followed by `p`, for a writer that does not copy the payload.
pub(crate) fn envelope_head(tag: &StateTag, len: usize) -> Vec<u8> {
    if len == 0 {
        return Vec::new();
    }
    let tag = serde_json::to_vec(tag).expect("a tag serializes");
    let mut out = Vec::with_capacity(16 + tag.len());
    out.extend_from_slice(ENVELOPE_MAGIC);
    out.extend_from_slice(&ENVELOPE_VERSION.to_le_bytes());
    out.extend_from_slice(&(tag.len() as u32).to_le_bytes());
    out.extend_from_slice(&tag);
    out
}

/// The tag and the payload of enveloped bytes (`None` for the tag: empty bytes).
pub fn open_envelope(bytes: &[u8]) -> Result<(Option<StateTag>, &[u8]), EnvelopeError> {
    if bytes.is_empty() {
        return Ok((None, bytes));
    }
    let rest = bytes.strip_prefix(ENVELOPE_MAGIC.as_slice()).ok_or(EnvelopeError::Missing)?;
    let word = |b: &[u8], at: usize| b.get(at..at + 4).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")));
    let version = word(rest, 0).ok_or(EnvelopeError::CutShort)?;
    if version != ENVELOPE_VERSION {
        return Err(EnvelopeError::Version { version });
    }
    let len = word(rest, 4).ok_or(EnvelopeError::CutShort)? as usize;
    let tag = rest.get(8..8 + len).ok_or(EnvelopeError::TagCutShort)?;
    let tag: StateTag = serde_json::from_slice(tag).map_err(EnvelopeError::Tag)?;
    Ok((Some(tag), &rest[8 + len..]))
}

/// Why bytes of a checkpoint part do not open as a state envelope ([`open_envelope`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The bytes do not start with the envelope's magic.
    #[error("no state envelope (the file was not written by weir's checkpoints of format 2)")]
    Missing,
    /// An envelope of a version this build does not read.
    #[error("state envelope version {version} (this build reads {ENVELOPE_VERSION})")]
    Version {
        /// The envelope's version.
        version: u32,
    },
    /// The bytes end inside the envelope's header.
    #[error("the envelope is cut short")]
    CutShort,
    /// The bytes end inside the envelope's tag.
    #[error("the envelope's tag is cut short")]
    TagCutShort,
    /// The tag is not the JSON of a [`StateTag`].
    #[error("the envelope's tag does not read: {0}")]
    Tag(#[source] serde_json::Error),
}

/// How a keyed node's input is keyed: what decides which key group a record's state is in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedInput {
    /// The `key_by` id of its input edge(s).
    pub key_by: String,
    /// The key's type (`std::any::type_name`).
    pub key_type: String,
}

/// The state a node's graph declares (a window's), beside what its operator tags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateSchema {
    /// What kind of state (`window`).
    pub kind: String,
    /// Properties that must not change for the state to stay meaningful (a window's `shape`),
    /// and those that may (a window's `aggregates`), by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// Its typed parts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<StatePart>,
}

/// Properties of a [`StateSchema`] that may change between versions (the rest may not).
const CHANGEABLE: &[&str] = &["aggregates"];

/// One node of the job that took a checkpoint, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The operator (`source`, `map`, `window`, `keyed`, `keyed_state`, `sink`, ...).
    pub op: String,
    /// Its parallelism.
    pub parallelism: u32,
    /// How its input is keyed, for a keyed node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyed: Option<KeyedInput>,
    /// The state its graph declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateSchema>,
}

/// What a restore into this job does beside restoring: state left behind, and conversions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpgradePlan {
    /// Nodes whose state the checkpoint holds and this job lacks (allowed: dropped).
    pub dropped: Vec<String>,
    /// (node, part, how its values convert) for every part that does not read as it is.
    pub migrations: Vec<(String, String, Migration)>,
    /// What changed that needs no conversion, in words (for the log).
    pub notes: Vec<String>,
}

/// Nodes that hold state in `m`: a shard snapshot, or operator bytes that are not empty.
pub fn stateful_nodes(m: &Manifest) -> std::collections::BTreeSet<&str> {
    m.subtasks
        .iter()
        .flat_map(|s| {
            s.blobs
                .iter()
                .filter(|b| b.bytes > 0)
                .map(|b| b.node.as_str())
                .chain(s.shards.iter().map(|r| r.node.as_str()))
        })
        .collect()
}

fn op_word(op: &str) -> &str {
    match op {
        "window" => "a window",
        "keyed" => "a keyed operator",
        "keyed_state" => "a keyed operator with keyed state",
        "source" => "a source",
        "sink" => "a sink",
        "window_partial" => "a window_all's first phase",
        other => other,
    }
}

/// Check that checkpoint `m` can be restored into a job of these nodes: every node with
/// state is in the job (or `allow_dropped`), a node's operator, keyed input and declared
/// state fit. Returns what the restore drops and converts; refuses with every problem
/// found, each naming its node.
pub fn check_upgrade(
    m: &Manifest,
    nodes: &BTreeMap<String, NodeRecord>,
    allow_dropped: bool,
) -> Result<UpgradePlan, CheckpointError> {
    let mut out = UpgradePlan::default();
    let missing: Vec<&str> = stateful_nodes(m).into_iter().filter(|n| !nodes.contains_key(*n)).collect();
    if !missing.is_empty() {
        if !allow_dropped {
            return Err(CheckpointError::Unusable(format!(
                "checkpoint {} holds state of node{} {} that this job does not have (node ids are how state is \
                 found): restore it into a job with {}, or allow dropping it (weir run --allow-dropped-state, \
                 CheckpointSettings::allow_dropped_state) to start without it",
                m.id,
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", "),
                if missing.len() == 1 { "that node" } else { "those nodes" }
            )));
        }
        out.dropped = missing.iter().map(|s| s.to_string()).collect();
    }
    let mut problems = Vec::new();
    for (id, new) in nodes {
        let Some(old) = m.nodes.get(id) else { continue };
        let holds_state = stateful_nodes(m).contains(id.as_str());
        if old.op != new.op && holds_state {
            problems.push(format!(
                "node {id} was {} and is now {}: its state cannot be read as the other's (give the new operator \
                 another id to start it empty)",
                op_word(&old.op),
                op_word(&new.op)
            ));
            continue;
        }
        if holds_state && let (Some(a), Some(b)) = (&old.keyed, &new.keyed) {
            if a.key_by != b.key_by {
                problems.push(format!(
                    "node {id} was keyed by `{}` and is now keyed by `{}`: its state is laid out by the old key \
                     (give the node another id to start it empty)",
                    a.key_by, b.key_by
                ));
            } else if a.key_type != b.key_type {
                problems.push(format!(
                    "node {id}'s key was of type {} and is now {}: its state is laid out by the old key's hash \
                     (keep the key type, or give the node another id to start it empty)",
                    crate::record::schema::short_type_name(&a.key_type),
                    crate::record::schema::short_type_name(&b.key_type)
                ));
            }
        } else if holds_state && old.keyed.is_some() != new.keyed.is_some() {
            problems.push(format!(
                "node {id} {}: its state is laid out by key group and its input would not be (give the node \
                 another id to start it empty)",
                if old.keyed.is_some() { "was keyed and is not now" } else { "was not keyed and is now" }
            ));
        }
        if let (Some(a), Some(b)) = (&old.state, &new.state) {
            if !holds_state {
                continue;
            }
            for (k, v) in &a.properties {
                let now = b.properties.get(k);
                if now == Some(v) {
                    continue;
                }
                let now = now.map_or("none", String::as_str);
                if CHANGEABLE.contains(&k.as_str()) {
                    out.notes.push(format!("node {id}: {k} {v} → {now}"));
                } else {
                    problems.push(format!(
                        "node {id}: its {} {k} was {v} and is now {now}: the state it holds was made for the old \
                         one (give the node another id to start it empty)",
                        a.kind
                    ));
                }
            }
            for part in &a.parts {
                let Some(now) = b.parts.iter().find(|p| p.name == part.name) else { continue };
                match check_part(id, part, now) {
                    Ok(Migration::Same) => {}
                    Ok(migration) => out.migrations.push((id.clone(), part.name.clone(), migration)),
                    Err(e) => problems.push(e.to_string()),
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(CheckpointError::Unusable(format!("checkpoint {} does not fit this job: {}", m.id, problems.join("; "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An envelope gives back its tag and payload; empty bytes stay empty; bytes without one,
    /// of another version, or cut short are refused, saying which.
    #[test]
    fn envelopes_round_trip_and_refuse_what_is_not_one() {
        let tag = StateTag::new("sink", 3);
        let bytes = envelope(&tag, b"payload");
        let (got, payload) = open_envelope(&bytes).unwrap();
        assert_eq!((got, payload), (Some(tag.clone()), &b"payload"[..]));
        assert!(envelope(&tag, b"").is_empty());
        assert_eq!(open_envelope(b"").unwrap(), (None, &b""[..]));
        assert!(open_envelope(b"payload").unwrap_err().to_string().contains("no state envelope"));
        let mut other = bytes.clone();
        other[8] = 9;
        assert!(open_envelope(&other).unwrap_err().to_string().contains("envelope version 9"));
        assert!(open_envelope(&bytes[..14]).unwrap_err().to_string().contains("cut short"));
    }
}
