//! The layout of a state key in RocksDB.
//!
//! ```text
//!  0          2                    6                       6+n                    end
//!  +----------+--------------------+-----------------------+----------------------+
//!  | key group| key length n       | key bytes             | namespace            |
//!  | u16 BE   | u32 BE             | (n bytes)             | (the rest, e.g. the  |
//!  |          |                    |                       |  window's bytes)     |
//!  +----------+--------------------+-----------------------+----------------------+
//!  \_ key group prefix _/
//!  \_________________ key prefix (all namespaces of one key) _/
//! ```
//!
//! Why this order:
//! - the **key group first, big-endian**, so RocksDB's bytewise order sorts by key group:
//!   one key group's data is one contiguous range, which can be scanned, deleted or moved
//!   to another shard as a unit when parallelism changes;
//! - the **key length before the key bytes**, so that a key can never run into the
//!   namespace: keys `ab` + namespace `c` and key `a` + namespace `bc` encode differently,
//!   and the key prefix `[kg][n][key]` selects exactly one key's namespaces (without the
//!   length, the prefix of key `a` would also match key `ab`);
//! - the **namespace last**, so all windows of one key are adjacent and sorted by the
//!   namespace's bytes (encode window ends big-endian to get them in time order).
//!
//! Order within a key group is therefore by key *length*, then key bytes, then namespace —
//! a total order, just not the lexicographic order of the raw keys.
//!
//! Keys must be shorter than `u32::MAX` bytes (a panic otherwise: a programmer error), which
//! makes `[0xFF; 6]` an upper bound of every key of key group 65535 — the exclusive end of a
//! key group range that runs to the last key group.

use std::ops::Range;

/// Bytes of the key group field.
pub const KEY_GROUP_BYTES: usize = 2;
/// Bytes of the key length field.
pub const KEY_LEN_BYTES: usize = 4;
/// Bytes before the key: key group and key length.
pub const HEADER_BYTES: usize = KEY_GROUP_BYTES + KEY_LEN_BYTES;
/// Key groups in the encoding (u16): ranges end at most here.
pub const KEY_GROUPS_MAX: u32 = 1 << 16;

/// An encoded key, split back into its parts (borrowing the encoded bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyParts<'a> {
    /// The key group.
    pub key_group: u16,
    /// The key's bytes.
    pub key: &'a [u8],
    /// The namespace's bytes (may be empty).
    pub namespace: &'a [u8],
}

/// Encode `(key_group, key, namespace)` into `out` (cleared first), as drawn above.
pub fn encode_key(key_group: u16, key: &[u8], namespace: &[u8], out: &mut Vec<u8>) {
    encode_key_prefix(key_group, key, out);
    out.extend_from_slice(namespace);
}

/// Encode the prefix shared by all namespaces of `key` into `out` (cleared first).
pub fn encode_key_prefix(key_group: u16, key: &[u8], out: &mut Vec<u8>) {
    // u32::MAX itself is reserved so that [0xFF; 6] bounds every key (see the module docs).
    let len = u32::try_from(key.len()).ok().filter(|&l| l < u32::MAX).expect("state key of 4 GiB or more");
    out.clear();
    out.reserve(HEADER_BYTES + key.len());
    out.extend_from_slice(&key_group.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(key);
}

/// Split an encoded key into its parts; `None` if it is too short for its own header.
pub fn decode_key(encoded: &[u8]) -> Option<KeyParts<'_>> {
    let header: &[u8; HEADER_BYTES] = encoded.get(..HEADER_BYTES)?.try_into().ok()?;
    let key_group = u16::from_be_bytes([header[0], header[1]]);
    let len = u32::from_be_bytes([header[2], header[3], header[4], header[5]]) as usize;
    let rest = &encoded[HEADER_BYTES..];
    if rest.len() < len {
        return None;
    }
    let (key, namespace) = rest.split_at(len);
    Some(KeyParts { key_group, key, namespace })
}

/// The encoded bounds `[lower, upper)` that hold exactly the keys of `key_groups`.
///
/// Panics if `key_groups.end > 65536` (a programmer error). An empty range gives equal
/// bounds.
pub fn key_group_bounds(key_groups: &Range<u32>) -> (Vec<u8>, Vec<u8>) {
    assert!(key_groups.end <= KEY_GROUPS_MAX, "key group range {key_groups:?} runs past the last key group (65535)");
    let start = key_groups.start.min(key_groups.end);
    let lower = key_group_start(start);
    let upper = key_group_start(key_groups.end);
    (lower, upper)
}

/// The smallest encoded key of key group `kg`, or for `kg == 65536` a key above every key.
fn key_group_start(kg: u32) -> Vec<u8> {
    match u16::try_from(kg) {
        Ok(kg) => kg.to_be_bytes().to_vec(),
        // Every key of key group 65535 is below FF FF FF FF FF FF: its length field is at
        // most FF FF FF FE (encode_key_prefix refuses u32::MAX).
        Err(_) => vec![0xFF; HEADER_BYTES],
    }
}

/// The encoded bounds `[lower, upper)` of all keys that start with `prefix`; `upper` is
/// `None` when no finite bound exists (a prefix of all 0xFF bytes).
pub fn prefix_bounds(prefix: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut upper = prefix.to_vec();
    // The successor of a prefix: increment its last byte that is not 0xFF and cut after it.
    while let Some(last) = upper.pop() {
        if last != 0xFF {
            upper.push(last + 1);
            return (prefix.to_vec(), Some(upper));
        }
    }
    (prefix.to_vec(), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_as_drawn() {
        let mut out = Vec::new();
        encode_key(0x0102, b"user", b"\x00\x00\x00\x09", &mut out);
        assert_eq!(out, b"\x01\x02\x00\x00\x00\x04user\x00\x00\x00\x09");
        let parts = decode_key(&out).unwrap();
        assert_eq!(parts, KeyParts { key_group: 0x0102, key: b"user", namespace: b"\x00\x00\x00\x09" });
        assert_eq!(decode_key(b"\x00\x01\x00\x00\x00\x05abc"), None);
        assert_eq!(decode_key(b"\x00"), None);
    }

    #[test]
    fn prefix_successor() {
        assert_eq!(prefix_bounds(b"ab").1.unwrap(), b"ac");
        assert_eq!(prefix_bounds(b"a\xFF").1.unwrap(), b"b");
        assert_eq!(prefix_bounds(b"\xFF\xFF").1, None);
    }

    proptest! {
        /// Decoding inverts encoding, and the key prefix of a key never prefixes another
        /// key's encoding: keys cannot run into the namespace.
        #[test]
        fn roundtrip_and_no_runover(kg in any::<u16>(), key in proptest::collection::vec(any::<u8>(), 0..12),
                                    ns in proptest::collection::vec(any::<u8>(), 0..12),
                                    key2 in proptest::collection::vec(any::<u8>(), 0..12),
                                    ns2 in proptest::collection::vec(any::<u8>(), 0..12)) {
            let mut a = Vec::new();
            encode_key(kg, &key, &ns, &mut a);
            prop_assert_eq!(decode_key(&a), Some(KeyParts { key_group: kg, key: &key, namespace: &ns }));
            let mut b = Vec::new();
            encode_key(kg, &key2, &ns2, &mut b);
            let mut prefix = Vec::new();
            encode_key_prefix(kg, &key, &mut prefix);
            prop_assert_eq!(b.starts_with(&prefix), key == key2);
        }

        /// An encoded key lies within the bounds of a key group range iff its key group does.
        #[test]
        fn bounds_hold_exactly_their_key_groups(kg in any::<u16>(), start in 0u32..=65536, len in 0u32..70000,
                                                key in proptest::collection::vec(any::<u8>(), 0..6)) {
            let end = (start + len).min(KEY_GROUPS_MAX);
            let (lo, hi) = key_group_bounds(&(start..end));
            let mut k = Vec::new();
            encode_key(kg, &key, b"\xFF\xFF", &mut k);
            let inside = k.as_slice() >= lo.as_slice() && k.as_slice() < hi.as_slice();
            prop_assert_eq!(inside, (start..end).contains(&(kg as u32)));
        }
    }
}
