//! Value types: how Redis collections and memcached items share one engine.
//!
//! The engine stores bytes plus a 32-bit `flags` word per item. memcached
//! clients own those flags (they are its opaque client flags), so the
//! server cannot steal bits from them without breaking clients that use
//! all 32. Instead the top sixteen *values* of the flags are reserved
//! ([`RESERVED_FLAGS_MIN`]..=`u32::MAX`), one per Redis type:
//!
//! * `flags == HASH_FLAGS` (0xFFFF_FFFF) marks a Redis hash, `SET_FLAGS`
//!   (0xFFFF_FFFE) a set, `LIST_FLAGS` (0xFFFF_FFFD) a list,
//!   `ZSET_FLAGS` (0xFFFF_FFFC) a sorted set (`zset`). The value's first byte says how it is stored:
//!   [`HASH_MAGIC`] for a small hash in one item (below), the magics of
//!   `coll` for a small set or for the root of a large collection whose
//!   elements live in items of their own (see `coll`).
//! * Every other flags value is a string. Redis writes strings with flags
//!   0; memcached writes the client's flags. Redis string commands that
//!   modify a memcached item in place (APPEND, SETRANGE, INCR) keep its
//!   flags.
//! * memcached `set`/`add`/... with reserved flags are refused with
//!   `CLIENT_ERROR`, so no memcached item can ever look like a collection,
//!   and a memcached `append`/`prepend`/`incr` on a collection is refused,
//!   so a collection can never be corrupted through memcached. A memcached
//!   `get` of a collection returns its encoded bytes (for a large one, its
//!   root) with the reserved flags: honest, and harmless. A memcached
//!   `set` or `delete` over a large collection's root orphans its nodes,
//!   which the sweeper (`coll`) reclaims.
//!
//! Hash encoding (all integers little-endian u32):
//!
//! ```text
//!  MAGIC | count | flen | field | vlen | value | flen | field | ...
//! ```
//!
//! A small hash is read, changed and written back whole (see `coll`); past
//! `hash-max-listpack-entries` fields or `hash-max-listpack-value` bytes it
//! becomes a large one, whose update costs O(1) items.

use nibble::ItemMeta;

/// The flags value reserved for Redis hashes.
pub const HASH_FLAGS: u32 = u32::MAX;
/// The flags value reserved for Redis sets.
pub const SET_FLAGS: u32 = u32::MAX - 1;
/// The flags value reserved for Redis lists.
pub const LIST_FLAGS: u32 = u32::MAX - 2;
/// The flags value reserved for Redis sorted sets.
pub const ZSET_FLAGS: u32 = u32::MAX - 3;
/// Smallest reserved flags value (future types: sorted sets, lists).
pub const RESERVED_FLAGS_MIN: u32 = u32::MAX - 15;

/// True if memcached may not write these flags (they mark a Redis type).
pub fn is_reserved_flags(flags: u32) -> bool {
    flags >= RESERVED_FLAGS_MIN
}

/// True if the item is a Redis collection (any type but a string).
pub fn is_collection(m: &ItemMeta) -> bool {
    is_reserved_flags(m.flags)
}

/// The TYPE name of an item.
pub fn type_name(m: &ItemMeta) -> &'static str {
    match m.flags {
        HASH_FLAGS => "hash",
        SET_FLAGS => "set",
        LIST_FLAGS => "list",
        ZSET_FLAGS => "zset",
        f if is_reserved_flags(f) => "none",
        _ => "string",
    }
}

/// First byte of an encoded hash.
pub const HASH_MAGIC: u8 = 0xB5;

/// A hash: fields in insertion order.
pub type Hash = Vec<(Vec<u8>, Vec<u8>)>;

/// True if the item is a Redis hash.
pub fn is_hash(m: &ItemMeta) -> bool {
    m.flags == HASH_FLAGS
}

/// Encode a hash.
pub fn encode_hash(h: &Hash) -> Vec<u8> {
    let size = 5 + h.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(HASH_MAGIC);
    out.extend_from_slice(&(h.len() as u32).to_le_bytes());
    for (f, v) in h {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if b.len() < n {
        return None;
    }
    let (h, t) = b.split_at(n);
    *b = t;
    Some(h)
}

fn take_u32(b: &mut &[u8]) -> Option<usize> {
    let s = take(b, 4)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize)
}

/// Decode a hash; `None` if the bytes are not a valid encoding.
pub fn decode_hash(mut b: &[u8]) -> Option<Hash> {
    if take(&mut b, 1)? != [HASH_MAGIC] {
        return None;
    }
    let n = take_u32(&mut b)?;
    let mut h = Vec::with_capacity(n.min(b.len() / 8));
    for _ in 0..n {
        let fl = take_u32(&mut b)?;
        let f = take(&mut b, fl)?.to_vec();
        let vl = take_u32(&mut b)?;
        let v = take(&mut b, vl)?.to_vec();
        h.push((f, v));
    }
    b.is_empty().then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let h: Hash = vec![(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())];
        assert_eq!(decode_hash(&encode_hash(&h)).unwrap(), h);
        assert!(decode_hash(b"xx").is_none());
        assert!(decode_hash(&encode_hash(&h)[..7]).is_none());
    }
}
