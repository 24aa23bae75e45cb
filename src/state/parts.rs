//! What a keyed operator's or a window's state holds, part by part, as checkpoints record
//! it ([`crate::checkpoint::upgrade`]), and whether a part written by one version of a job
//! reads in the next.

use crate::record::schema::{Migration, Refusal, TypeSchema, plan};
use serde::{Deserialize, Serialize};

/// One named part of a node's state and the types it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatePart {
    /// Its name (a keyed state's, `windows` for a window's accumulators).
    pub name: String,
    /// What kind of state (`value`, `list`, `map`, `windows`).
    pub kind: String,
    /// The type of its keys (the record key a keyed state is kept per).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<TypeSchema>,
    /// A map state's map keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_key: Option<TypeSchema>,
    /// The type of its values.
    pub value: TypeSchema,
}

/// How part `old` of node `node`'s state reads as `new`: keys must keep their type (state
/// is found by their bytes), values convert by [`plan`]; a refusal names node, part, field
/// and the change.
// The error is large (the node, the part and both types, by name): it is made at most once
// per state part, when a job starts from a checkpoint, never on the record path.
#[allow(clippy::result_large_err)]
pub fn check_part(node: &str, old: &StatePart, new: &StatePart) -> Result<Migration, PartError> {
    if old.kind != new.kind {
        return Err(PartError::KindChanged {
            node: node.to_owned(),
            part: old.name.clone(),
            was: old.kind.clone(),
            now: new.kind.clone(),
        });
    }
    for (label, a, b) in [("key", &old.key, &new.key), ("map key", &old.map_key, &new.map_key)] {
        if let (Some(a), Some(b)) = (a, b)
            && !plan(a, b).is_ok_and(|m| m.is_same())
        {
            return Err(PartError::KeyChanged {
                node: node.to_owned(),
                kind: old.kind.clone(),
                part: old.name.clone(),
                which: label,
                was: a.to_string(),
                now: b.to_string(),
            });
        }
    }
    plan(&old.value, &new.value).map_err(|refusals| PartError::ValueRefused {
        node: node.to_owned(),
        kind: old.kind.clone(),
        part: old.name.clone(),
        refusals,
    })
}

/// Why a part of a node's state in a checkpoint does not read as this job's ([`check_part`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PartError {
    /// The state is of another kind (a value state became a list state).
    #[error("node {node}: state `{part}` was a {was} state and is now a {now} state (name the new one otherwise)")]
    KindChanged {
        /// The node.
        node: String,
        /// The state's name.
        part: String,
        /// Its kind in the checkpoint.
        was: String,
        /// Its kind now.
        now: String,
    },
    /// The type of its keys (or map keys) changed.
    #[error(
        "node {node}, {kind} state `{part}`, {which}: was {was} and is now {now} (state is found by the key's \
         bytes, so its type cannot change)"
    )]
    KeyChanged {
        /// The node.
        node: String,
        /// What kind of state.
        kind: String,
        /// The state's name.
        part: String,
        /// `key` or `map key`.
        which: &'static str,
        /// The type in the checkpoint.
        was: String,
        /// The type now.
        now: String,
    },
    /// Its values cannot convert ([`plan`]'s refusals).
    #[error("node {node}, {kind} state `{part}`, value: {}", refusals_text(refusals))]
    ValueRefused {
        /// The node.
        node: String,
        /// What kind of state.
        kind: String,
        /// The state's name.
        part: String,
        /// Every change that cannot convert.
        refusals: Vec<Refusal>,
    },
}

fn refusals_text(refusals: &[Refusal]) -> String {
    refusals.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}
