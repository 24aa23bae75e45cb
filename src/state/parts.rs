//! What a keyed operator's or a window's state holds, part by part, as checkpoints record
//! it ([`crate::checkpoint::upgrade`]), and whether a part written by one version of a job
//! reads in the next.

use crate::record::schema::{Migration, TypeSchema, plan};
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
pub fn check_part(node: &str, old: &StatePart, new: &StatePart) -> Result<Migration, String> {
    let what = |w: &str| format!("node {node}, {} state `{}`, {w}", old.kind, old.name);
    if old.kind != new.kind {
        return Err(format!(
            "node {node}: state `{}` was a {} state and is now a {} state (name the new one otherwise)",
            old.name, old.kind, new.kind
        ));
    }
    for (label, a, b) in [("key", &old.key, &new.key), ("map key", &old.map_key, &new.map_key)] {
        if let (Some(a), Some(b)) = (a, b)
            && !plan(a, b).is_ok_and(|m| m.is_same())
        {
            return Err(format!(
                "{}: was {} and is now {} (state is found by the key's bytes, so its type cannot change)",
                what(label),
                a,
                b
            ));
        }
    }
    plan(&old.value, &new.value).map_err(|refused| {
        let text: Vec<String> = refused.iter().map(|r| r.to_string()).collect();
        format!("{}: {}", what("value"), text.join(", "))
    })
}
