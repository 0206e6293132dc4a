//! Objects in the log (dissertation §4.2).
//!
//! An object is a header followed by the key and the value, written
//! back-to-back into a segment with no alignment (so a scan can walk a
//! segment header by header). The paper's header is a 32-bit length plus a
//! 64-bit key; ours carries what a server needs, in 32 bytes:
//!
//! ```text
//!  0        4          8          12       16               24               32
//!  | key_len | value_len | value_cap | flags  | version (u64)  | expiry_ms (u64) | key … | value … (value_cap bytes)
//! ```
//!
//! * `value_cap` is the space reserved for the value. It equals `value_len`
//!   when appended; Nibble-2's in-place overwrite may store a shorter value
//!   in the same space, so scans use `value_cap` to find the next object.
//! * `version` changes on every modification (memcached CAS, Redis WATCH).
//! * `expiry_ms` is a Unix time in milliseconds, 0 for none.
//! * `flags` are memcached's opaque client flags.
//!
//! `key_len` and `value_cap` never change after the append; the rest may
//! change only under the object's bucket lock.

/// Bytes of the object header.
pub const HEADER_BYTES: usize = 32;

/// The decoded header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Key length in bytes.
    pub key_len: u32,
    /// Value length in bytes.
    pub value_len: u32,
    /// Bytes reserved for the value (>= `value_len`).
    pub value_cap: u32,
    /// Opaque client flags.
    pub flags: u32,
    /// Modification version.
    pub version: u64,
    /// Unix time in ms at which the object expires; 0 = never.
    pub expiry_ms: u64,
}

impl Header {
    /// Total bytes the object occupies in the log.
    #[inline]
    pub fn object_bytes(&self) -> usize {
        HEADER_BYTES + self.key_len as usize + self.value_cap as usize
    }

    /// Encode to bytes.
    #[inline]
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&self.key_len.to_le_bytes());
        b[4..8].copy_from_slice(&self.value_len.to_le_bytes());
        b[8..12].copy_from_slice(&self.value_cap.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.version.to_le_bytes());
        b[24..32].copy_from_slice(&self.expiry_ms.to_le_bytes());
        b
    }

    /// Decode from bytes.
    #[inline]
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Header {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Header {
            key_len: u32_at(0),
            value_len: u32_at(4),
            value_cap: u32_at(8),
            flags: u32_at(12),
            version: u64_at(16),
            expiry_ms: u64_at(24),
        }
    }

    /// True if the object has expired at `now_ms`.
    #[inline]
    pub fn expired_at(&self, now_ms: u64) -> bool {
        self.expiry_ms != 0 && self.expiry_ms <= now_ms
    }

    /// Whether the object has expired by now. Reads the clock only for
    /// objects that have an expiry (a `clock_gettime` is ~2% of a GET).
    pub fn expired(&self) -> bool {
        self.expiry_ms != 0 && self.expiry_ms <= now_ms()
    }
}

/// Unix time now, in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Header {
            key_len: 65535,
            value_len: 10,
            value_cap: 16 << 20,
            flags: 0xdead_beef,
            version: u64::MAX - 3,
            expiry_ms: 1_700_000_000_000,
        };
        assert_eq!(Header::decode(&h.encode()), h);
        assert_eq!(h.object_bytes(), 32 + 65535 + (16 << 20));
        assert!(h.expired_at(1_700_000_000_000));
        assert!(!Header::default().expired_at(u64::MAX));
    }
}
