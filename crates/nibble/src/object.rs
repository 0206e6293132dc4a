//! Objects in the log (dissertation §4.2).
//!
//! An object is a header followed by the key and the value, written
//! back-to-back into a segment with no alignment (so a scan can walk a
//! segment header by header). The paper's header is a 32-bit length plus a
//! 64-bit key; ours carries what a server needs, in 24 bytes (at 256-byte
//! objects every header byte is 0.4 % of memory bloat, so it is packed):
//!
//! ```text
//!  0           2           4            8        12              18              24
//!  | key_len   | cap_slack | value_len  | flags  | version (u48)  | expiry (u48)  | key … | value … (value_cap bytes)
//! ```
//!
//! * `key_len` (u16): keys are 0 to 65 535 bytes (Redis allows the empty key).
//! * `cap_slack` (u16) = `value_cap - value_len`: the space reserved for the
//!   value is `value_len` when appended; Nibble-2's in-place overwrite may
//!   store a shorter value in the same space (at most 65 535 bytes shorter,
//!   see [`Header::can_hold`]), so scans use `value_cap` to find the next
//!   object.
//! * `version` (48 bits) changes on every modification (memcached CAS,
//!   Redis WATCH): the TSC divided by 1024, or the old version plus one if
//!   that is not larger (see [`next_version`]).
//! * `expiry` (48 bits) is a Unix time in milliseconds (good until the year
//!   10 889), 0 for none.
//! * `flags` are memcached's opaque client flags.
//!
//! `key_len` and `value_cap` never change after the append; the rest may
//! change only under the object's bucket lock.

/// Bytes of the object header.
pub const HEADER_BYTES: usize = 24;

/// Largest `value_cap - value_len` a header can record.
pub const MAX_CAP_SLACK_BYTES: u32 = u16::MAX as u32;

/// Versions and expiry times are 48-bit fields.
pub const FIELD48_MASK: u64 = (1 << 48) - 1;

/// The version after `old`: increasing per key, from the TSC where it can.
#[inline]
pub fn next_version(old: u64) -> u64 {
    ((topology::rdtsc() >> 10).max(old + 1)) & FIELD48_MASK
}

/// The decoded header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Key length in bytes (0 to 65 535).
    pub key_len: u32,
    /// Value length in bytes.
    pub value_len: u32,
    /// Bytes reserved for the value (`value_len` to `value_len + 65 535`).
    pub value_cap: u32,
    /// Opaque client flags.
    pub flags: u32,
    /// Modification version (48 bits).
    pub version: u64,
    /// Unix time in ms at which the object expires; 0 = never (48 bits).
    pub expiry_ms: u64,
}

impl Header {
    /// Total bytes the object occupies in the log.
    #[inline]
    pub fn object_bytes(&self) -> usize {
        HEADER_BYTES + self.key_len as usize + self.value_cap as usize
    }

    /// Whether a value of `len` bytes can overwrite this object's value in
    /// place (Nibble-2): it fits, and the slack left is representable.
    #[inline]
    pub fn can_hold(&self, len: usize) -> bool {
        len <= self.value_cap as usize
            && self.value_cap as usize - len <= MAX_CAP_SLACK_BYTES as usize
    }

    /// Encode to bytes. `key_len` must be at most 65 535 and `value_cap -
    /// value_len` at most [`MAX_CAP_SLACK_BYTES`] (the store ensures both);
    /// `version` and `expiry_ms` are cut to 48 bits (an expiry beyond the
    /// year 10 889 becomes that year).
    #[inline]
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        debug_assert!(self.key_len <= u16::MAX as u32);
        debug_assert!(self.value_cap >= self.value_len);
        debug_assert!(self.value_cap - self.value_len <= MAX_CAP_SLACK_BYTES);
        let mut b = [0u8; HEADER_BYTES];
        let key = self.key_len.min(u16::MAX as u32) as u16;
        let slack = self
            .value_cap
            .saturating_sub(self.value_len)
            .min(MAX_CAP_SLACK_BYTES) as u16;
        b[0..2].copy_from_slice(&key.to_le_bytes());
        b[2..4].copy_from_slice(&slack.to_le_bytes());
        b[4..8].copy_from_slice(&self.value_len.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..18].copy_from_slice(&(self.version & FIELD48_MASK).to_le_bytes()[..6]);
        b[18..24].copy_from_slice(&self.expiry_ms.min(FIELD48_MASK).to_le_bytes()[..6]);
        b
    }

    /// Decode from bytes.
    #[inline]
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Header {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as u32;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u48_at = |i: usize| {
            let mut w = [0u8; 8];
            w[..6].copy_from_slice(&b[i..i + 6]);
            u64::from_le_bytes(w)
        };
        let value_len = u32_at(4);
        Header {
            key_len: u16_at(0),
            value_len,
            value_cap: value_len.saturating_add(u16_at(2)),
            flags: u32_at(8),
            version: u48_at(12),
            expiry_ms: u48_at(18),
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
            value_cap: 10 + 65535,
            flags: 0xdead_beef,
            version: FIELD48_MASK - 3,
            expiry_ms: 1_700_000_000_000,
        };
        assert_eq!(Header::decode(&h.encode()), h);
        assert_eq!(h.object_bytes(), HEADER_BYTES + 65535 + 10 + 65535);
        assert!(h.expired_at(1_700_000_000_000));
        assert!(!Header::default().expired_at(u64::MAX));
        let small = Header {
            key_len: 0,
            value_len: 16 << 20,
            value_cap: 16 << 20,
            ..h
        };
        assert_eq!(Header::decode(&small.encode()), small);
    }

    #[test]
    fn slack_and_48_bit_fields() {
        let h = Header {
            key_len: 3,
            value_len: 100_000,
            value_cap: 100_000,
            ..Default::default()
        };
        assert!(h.can_hold(100_000) && h.can_hold(100_000 - 65535));
        assert!(
            !h.can_hold(10),
            "slack of 99 990 bytes is not representable"
        );
        assert!(!h.can_hold(100_001));
        let far = Header {
            expiry_ms: u64::MAX,
            version: u64::MAX,
            ..h
        };
        let d = Header::decode(&far.encode());
        assert_eq!(d.expiry_ms, FIELD48_MASK);
        assert_eq!(d.version, FIELD48_MASK);
        let v = next_version(0);
        assert!(next_version(v) > v && v <= FIELD48_MASK);
    }
}
