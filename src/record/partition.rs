//! Partitioning: which receiving subtask a record goes to. A key is hashed, the hash picks a
//! *key group* (`0..max_key_groups`), and each receiver owns a contiguous range of key
//! groups, so a key group's state moves as one range when parallelism changes.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// How records of an edge are spread over the receiving subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitioning {
    /// Sender i to receiver i; needs equal parallelism.
    Forward,
    /// By key group of the record's key.
    Hash,
    /// Round robin.
    Rebalance,
    /// To every receiver.
    Broadcast,
}

impl Partitioning {
    /// Its name in job files and descriptions: `forward`, `hash`, `rebalance`, `broadcast`.
    pub fn name(self) -> &'static str {
        match self {
            Partitioning::Forward => "forward",
            Partitioning::Hash => "hash",
            Partitioning::Rebalance => "rebalance",
            Partitioning::Broadcast => "broadcast",
        }
    }
}

/// The key group of a key hash: `hash % max_key_groups`, after a finalizer so that keys
/// that differ only in high bits still spread.
#[inline]
pub fn key_group(key_hash: u64, max_key_groups: u32) -> u32 {
    (spread(key_hash) % max_key_groups as u64) as u32
}

/// murmur3's fmix64.
#[inline]
fn spread(key_hash: u64) -> u64 {
    let mut h = key_hash;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// [`key_group`] and [`subtask_for_key_group`] for one edge or keyed operator, whose
/// `max_key_groups` and parallelism are fixed: the two divisions per record become
/// multiplications by precomputed reciprocals. Exact — the same results as the division,
/// so key groups, and the checkpoints that name them, do not change.
#[derive(Clone, Copy, Debug)]
pub struct KeyGroups {
    max: strength_reduce::StrengthReducedU64,
    parallelism: u64,
    /// The first key group: 0, or the range's start for [`KeyGroups::within`].
    base: u32,
}

impl KeyGroups {
    /// For `parallelism` receivers of `max_key_groups` key groups (both at least 1).
    pub fn new(parallelism: u32, max_key_groups: u32) -> KeyGroups {
        KeyGroups {
            max: strength_reduce::StrengthReducedU64::new(max_key_groups.max(1) as u64),
            parallelism: parallelism as u64,
            base: 0,
        }
    }

    /// Key groups taken within `range` only: `range.start + spread(hash) % range.len()`. For
    /// a subtask whose keys never leave it (a job run as one of several instances, where a
    /// subtask's keys are those of one input partition: its state is its own key-group range,
    /// and moves with the partition). [`KeyGroups::subtask`] is meaningless here.
    pub fn within(range: std::ops::Range<u32>) -> KeyGroups {
        KeyGroups {
            max: strength_reduce::StrengthReducedU64::new(range.len().max(1) as u64),
            parallelism: 1,
            base: range.start,
        }
    }

    /// [`key_group`]`(key_hash, max_key_groups)` (or within the range of [`KeyGroups::within`]).
    #[inline]
    pub fn key_group(&self, key_hash: u64) -> u32 {
        self.base + (spread(key_hash) % self.max) as u32
    }

    /// [`subtask_for_key_group`]`(kg, parallelism, max_key_groups)`.
    #[inline]
    pub fn subtask(&self, kg: u32) -> u32 {
        (kg as u64 * self.parallelism / self.max) as u32
    }
}

/// Which receiver owns key group `kg` (Flink's formula: contiguous ranges).
#[inline]
pub fn subtask_for_key_group(kg: u32, parallelism: u32, max_key_groups: u32) -> u32 {
    (kg as u64 * parallelism as u64 / max_key_groups as u64) as u32
}

/// The key groups subtask `index` of `parallelism` owns.
pub fn key_group_range(index: u32, parallelism: u32, max_key_groups: u32) -> std::ops::Range<u32> {
    let start = (index as u64 * max_key_groups as u64).div_ceil(parallelism as u64) as u32;
    let end = ((index as u64 + 1) * max_key_groups as u64).div_ceil(parallelism as u64) as u32;
    start..end
}

/// Hash a key with a fixed, fast hasher (the same in every process and run).
pub fn hash_key<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// A record's key, hashed (what `key_by` turns its key function into).
pub type KeyFn<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Key-group ranges cover 0..max exactly once, and agree with subtask_for_key_group.
    #[test]
    fn key_group_ranges_partition() {
        for p in 1..=16u32 {
            let mut next = 0;
            for i in 0..p {
                let r = key_group_range(i, p, 128);
                assert_eq!(r.start, next);
                for kg in r.clone() {
                    assert_eq!(subtask_for_key_group(kg, p, 128), i, "kg {kg} p {p}");
                }
                next = r.end;
            }
            assert_eq!(next, 128);
        }
    }

    proptest::proptest! {
        /// The reciprocals give exactly what the divisions give, for any hash, any
        /// max_key_groups (1 to 2^31 and the usual powers of two) and any parallelism.
        #[test]
        fn key_groups_match_the_divisions(
            hash: u64,
            max in proptest::prop_oneof![1u32..=1 << 31, proptest::sample::select(vec![1u32, 2, 128, 32768, u32::MAX >> 1])],
            p_seed: u32,
        ) {
            let p = p_seed % max + 1;
            let groups = KeyGroups::new(p, max);
            let kg = groups.key_group(hash);
            proptest::prop_assert_eq!(kg, key_group(hash, max));
            proptest::prop_assert_eq!(groups.subtask(kg), subtask_for_key_group(kg, p, max));
            proptest::prop_assert_eq!(groups.subtask(max - 1), subtask_for_key_group(max - 1, p, max));
        }
    }

    /// Sequential keys spread over key groups.
    #[test]
    fn keys_spread() {
        let mut counts = [0u32; 128];
        for k in 0..128_000u64 {
            counts[key_group(hash_key(&k), 128) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 500 && c < 1500), "{counts:?}");
    }
}
