//! Value types: how a Redis hash and a memcached item share one engine.
//!
//! The engine stores bytes plus a 32-bit `flags` word per item. memcached
//! clients own those flags (they are its opaque client flags), so the
//! server cannot steal bits from them without breaking clients that use
//! all 32. Instead one *value* of the flags is reserved:
//!
//! * `flags == HASH_FLAGS` (0xFFFF_FFFF) marks a Redis hash. Its value is
//!   the encoding below and starts with [`HASH_MAGIC`].
//! * Every other flags value is a string. Redis writes strings with flags
//!   0; memcached writes the client's flags. Redis string commands that
//!   modify a memcached item in place (APPEND, SETRANGE, INCR) keep its
//!   flags.
//! * memcached `set`/`add`/... with flags 4294967295 are refused with
//!   `CLIENT_ERROR`, so no memcached item can ever look like a hash, and a
//!   memcached `append`/`prepend`/`incr` on a hash is refused, so a hash
//!   can never be corrupted through memcached. A memcached `get` of a hash
//!   returns its encoded bytes with flags 4294967295: honest, and
//!   harmless.
//!
//! Hash encoding (all integers little-endian u32):
//!
//! ```text
//!  MAGIC | count | flen | field | vlen | value | flen | field | ...
//! ```
//!
//! A hash is read, changed and written back whole under a compare-and-swap
//! on the item's version, so concurrent HSETs to one key never lose
//! updates (see `commands::hash`). This suits the small hashes of YCSB and
//! redis-benchmark; a hash is bounded by the engine's largest value.

use nibble::ItemMeta;

/// The flags value reserved for Redis hashes.
pub const HASH_FLAGS: u32 = u32::MAX;
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
