//! Objects in the log (dissertation §4.2).
//!
//! An object is a header followed by the key and the value, written
//! back-to-back into a segment with no alignment (so a scan can walk a
//! segment header by header). The paper's header is a 32-bit length plus a
//! 64-bit key; ours carries what a server needs. It is 8 bytes for the
//! common object (no TTL, a key below 256 bytes, a value below 512 KiB)
//! and grows by a slot for each optional field the object carries,
//! because with small values the header is the largest cost after the
//! data itself (at 16-byte values and 14-byte keys every header byte is
//! 2 % of a key's memory; the per-key breakdown is in
//! `docs/BENCHMARKS.md`, "Small objects"):
//!
//! ```text
//!  0             4               8
//!  | shape (u32) | version (u32) | [long u32] | [expiry u48] | [flags u32] | [cap_slack u16] | key … | value … (value_cap bytes)
//! ```
//!
//! * `shape` (u32): bits 0-7 the key length's low byte, bits 8-26 the
//!   value capacity's low 19 bits, four bits that say which slots follow
//!   (bit 27 a 6-byte `expiry` slot, bit 28 a 4-byte `flags` slot, bit 29
//!   a 2-byte `cap_slack` slot, bit 30 a 4-byte `long` slot) and bit 31
//!   the `pinned` mark. The long slot holds the high bits (bits 0-7 the
//!   key length's high byte, bits 8-18 the value capacity's bits 19-29).
//!   An object has it when its key is longer than 255 bytes or its value
//!   capacity is 512 KiB or more, so keys are 0 to 65 535 bytes (Redis
//!   allows the empty key) and values below 1 GiB ([`MAX_VALUE_BYTES`]);
//!   the slot costs big objects 4 bytes, under 0.001 % of them.
//! * `version` (u32) changes on every modification (memcached CAS, Redis
//!   WATCH): the TSC divided by 1024, cut to 32 bits, or the old version
//!   plus one if that is not later (see [`next_log_version`]). 32 bits
//!   wrap every ~25 minutes of a 3 GHz TSC, so versions increase per key
//!   only between wraps; what CAS and WATCH need is that a modification
//!   never leaves the version it found, which holds at a wrap too. A stale
//!   CAS token can match again only if a later object of the same key
//!   lands on the same 1024-cycle tick modulo 2^42 cycles.
//! * `expiry` (slot; low 47 bits of a 48-bit field) is a Unix time in
//!   milliseconds (good until the year 6429), 0 for none. Only an object
//!   appended with a TTL has the slot. Setting a TTL on an object without
//!   it (EXPIRE, GETEX, SET KEEPTTL over a key with a TTL, memcached
//!   touch, ...) relocates the object: a copy with the slot is appended
//!   and the index entry swapped under the bucket lock, exactly like an
//!   overwrite (`Store::set_expiry`; on a full store the copy may take
//!   half the compaction reserve, as Redis allows EXPIRE over maxmemory).
//!   Clearing a TTL (PERSIST) writes 0 into the slot in place.
//! * `pinned` (shape bit 31): cache mode never evicts a pinned object (it
//!   relocates it, as compaction does); the server pins the internal
//!   pieces of big collections, which must never disappear one at a time
//!   (`KvEngine::put_never_evict`). An in-place overwrite rewrites it
//!   with the new write's setting: it shares a byte with the slot bits,
//!   but it is no part of the layout, and a header torn between the two
//!   settings still has the one layout both carry.
//! * `cap_slack` = `value_cap - value_len`: the space reserved for the value
//!   is `value_len` when appended; Nibble-2's in-place overwrite may store a
//!   shorter value in the same space (at most 65 535 bytes shorter) if the
//!   object has this slot, so scans use `value_cap` to find the next
//!   object, and `value_len` is `value_cap - cap_slack`. Nibble-2 gives the
//!   slot to an object that replaces one of a different size (the key's
//!   values vary, so a later shorter value can stay in place); objects
//!   without it are overwritten in place only by a value of exactly their
//!   size. Likewise an in-place overwrite that sets a TTL needs the expiry
//!   slot, and flags other than 0 the flags slot: else the put appends.
//!
//! The layout (`key_len`, `value_cap`, which slots exist) never changes
//! after the append, so the key and value stay where a scan expects them;
//! and the bytes that encode it (`shape`'s layout bits, the long slot) are
//! never rewritten: an in-place overwrite changes only `cap_slack`,
//! version, expiry, flags and the pinned bit. Compaction's scan reads
//! headers without the bucket lock; a header it reads while a writer
//! rewrites it may mix old and new fields, and the object's size must not
//! depend on which it got, or the scan loses its place in the segment,
//! takes the bytes of live objects for headers and retires the segment
//! with those objects still linked. The rest (`value_len` within the
//! capacity, version, expiry, flags, pinned) may change only under the
//! object's bucket lock. The in-memory log has no per-object checksum: it
//! is not a durable format (the server's AOF and RDB files carry their
//! own; it never writes the log itself to disk), and the shared store that
//! is one (`nibblejmp`) keeps the earlier fixed 24-byte layout
//! ([`Header::encode_wide`], 48-bit versions from [`next_version`]), in
//! which the expiry is one atomic word at a fixed offset that another
//! process may update, plus its own CRC per object.

/// Bytes of the header of an object with no optional slot.
pub const HEADER_MIN_BYTES: usize = 8;

/// Bytes of the largest header (all four slots).
pub const HEADER_MAX_BYTES: usize =
    HEADER_MIN_BYTES + LONG_SLOT_BYTES + EXPIRY_SLOT_BYTES + FLAGS_SLOT_BYTES + SLACK_SLOT_BYTES;

/// Bytes of the fixed layout used by `nibblejmp` ([`Header::encode_wide`]).
pub const WIDE_HEADER_BYTES: usize = 24;

/// Values are shorter than this: `value_len` has 30 bits in the header.
pub const MAX_VALUE_BYTES: usize = (1 << 30) - 1;

/// Bytes of the optional long slot (the lengths' high bits).
const LONG_SLOT_BYTES: usize = 4;
/// Bytes of the optional expiry slot.
pub const EXPIRY_SLOT_BYTES: usize = 6;
/// Bytes of the optional flags slot.
const FLAGS_SLOT_BYTES: usize = 4;
/// Bytes of the optional capacity-slack slot.
const SLACK_SLOT_BYTES: usize = 2;
/// Bits of the key length held in the shape word.
const SHAPE_KEY_BITS: u32 = 8;
/// Bits of the value length held in the shape word.
const SHAPE_VALUE_BITS: u32 = 19;
/// Shape word bit: an expiry slot follows (after the long slot).
const EXT_EXPIRY: u32 = 1 << 27;
/// Shape word bit: a flags slot follows (after the expiry slot).
const EXT_FLAGS: u32 = 1 << 28;
/// Shape word bit: a slack slot follows (after the flags slot).
const EXT_SLACK: u32 = 1 << 29;
/// Shape word bit: a long slot follows the base header (first).
const EXT_LONG: u32 = 1 << 30;
/// Shape word bit: the pinned mark (not a layout bit).
const PINNED_BIT: u32 = 1 << 31;
/// Keys longer than this need the long slot.
const SHORT_KEY_MAX_BYTES: u32 = (1 << SHAPE_KEY_BITS) - 1;
/// Value capacities above this need the long slot.
const SHORT_VALUE_MAX_BYTES: u32 = (1 << SHAPE_VALUE_BITS) - 1;

/// The shape word's four slot bits start here (expiry, flags, slack,
/// long, from the lowest).
const SLOT_BITS_SHIFT: u32 = 27;

/// Bytes of the slots that follow the base header, by the shape word's
/// four slot bits (one load instead of a branch per slot on every read).
const SLOT_BYTES_BY_BITS: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (if i & 1 != 0 { EXPIRY_SLOT_BYTES } else { 0 }
            + if i & 2 != 0 { FLAGS_SLOT_BYTES } else { 0 }
            + if i & 4 != 0 { SLACK_SLOT_BYTES } else { 0 }
            + if i & 8 != 0 { LONG_SLOT_BYTES } else { 0 }) as u8;
        i += 1;
    }
    t
};

// The table's order is the shape word's.
const _: () = assert!(
    EXT_EXPIRY == 1 << SLOT_BITS_SHIFT
        && EXT_FLAGS == 2 << SLOT_BITS_SHIFT
        && EXT_SLACK == 4 << SLOT_BITS_SHIFT
        && EXT_LONG == 8 << SLOT_BITS_SHIFT
);

/// The 30 bits of a value length.
const VALUE_LEN_MASK: u32 = (1 << 30) - 1;

/// Largest `value_cap - value_len` a header can record.
pub const MAX_CAP_SLACK_BYTES: u32 = u16::MAX as u32;

/// Versions and expiry times of the wide layout are 48-bit fields.
pub const FIELD48_MASK: u64 = (1 << 48) - 1;

/// The largest version of the log's header (32 bits); see
/// [`DEAD_VERSION`].
const LOG_VERSION_MASK: u64 = u32::MAX as u64;

/// The latest expiry a header records (Unix ms, 47 bits: the year 6429).
pub const MAX_EXPIRY_MS: u64 = (1 << 47) - 1;

/// The version field of an object the index no longer points at (see
/// [`DEAD_MARK`]); no live object has it.
pub const DEAD_VERSION: u64 = LOG_VERSION_MASK;

/// Byte offset of the version field in the store's header (the wide layout
/// of `nibblejmp` has it at 12 and never carries the dead mark).
pub const VERSION_OFFSET: usize = 4;

/// Written over the version of an object once the index stops pointing at
/// it (overwritten elsewhere or deleted), by the writer that unlinked it
/// while its epoch guard keeps the segment from reuse. Compaction skips a
/// marked object without hashing its key or probing the index; a missing
/// mark (a torn read, or an object unlinked by compaction itself) only
/// costs it that probe. Four bytes of 0xFF read back as [`DEAD_VERSION`]
/// only if the mark was written: every live version is below it.
pub const DEAD_MARK: [u8; 4] = [0xFF; 4];

/// The version after `old` in the wide layout of `nibblejmp` (48 bits):
/// increasing per key, from the TSC where it can, and below 2^48 - 1.
#[inline]
pub fn next_version(old: u64) -> u64 {
    ((topology::rdtsc() >> 10).max(old + 1) & FIELD48_MASK).min(FIELD48_MASK - 1)
}

/// The version after `old` in the log's header (32 bits): the TSC tick if
/// it is later than `old` (modulo 2^32), else `old + 1`; never `old`, 0 or
/// [`DEAD_VERSION`]. `next_log_version(0)` is a new key's version.
#[inline]
pub fn next_log_version(old: u64) -> u64 {
    log_version_after((topology::rdtsc() >> 10) & LOG_VERSION_MASK, old)
}

/// `cand` if it is later than `old` modulo 2^32 (serial-number order), else
/// `old + 1`; skipping 0 and [`DEAD_VERSION`], so never equal to `old`.
#[inline]
pub fn log_version_after(cand: u64, old: u64) -> u64 {
    let (c, o) = (cand as u32, old as u32);
    let mut v = if (c.wrapping_sub(o) as i32) > 0 {
        c
    } else {
        o.wrapping_add(1)
    };
    while v == 0 || v as u64 == DEAD_VERSION || v == o {
        v = v.wrapping_add(1);
    }
    v as u64
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
    /// Opaque client flags (0 when the object has no flags slot).
    pub flags: u32,
    /// Modification version (32 bits in the log, 48 in the wide layout).
    pub version: u64,
    /// Unix time in ms at which the object expires; 0 = never (47 bits;
    /// always 0 without an expiry slot).
    pub expiry_ms: u64,
    /// The object has an expiry slot (layout; fixed at the append).
    pub expiry_slot: bool,
    /// The object has a flags slot (layout; fixed at the append).
    pub flags_slot: bool,
    /// The object has a capacity-slack slot (layout; fixed at the append).
    pub slack_slot: bool,
    /// Cache mode never evicts the object (it relocates it instead).
    pub pinned: bool,
}

/// A header encoded for the log: [`EncodedHeader::as_bytes`] is
/// [`HEADER_MIN_BYTES`] to
/// [`HEADER_MAX_BYTES`] bytes.
#[derive(Clone, Copy, Debug)]
pub struct EncodedHeader {
    bytes: [u8; HEADER_MAX_BYTES],
    len: usize,
}

impl EncodedHeader {
    /// The encoded bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Header {
    /// A header for a new object (capacity = `value_len`), with an expiry
    /// slot if `expiry_ms` is not 0, a flags slot if `flags` is not 0 and
    /// a slack slot if `slack_slot`.
    #[inline]
    pub fn new(
        key_len: usize,
        value_len: usize,
        flags: u32,
        version: u64,
        expiry_ms: u64,
        slack_slot: bool,
    ) -> Header {
        Header {
            key_len: key_len as u32,
            value_len: value_len as u32,
            value_cap: value_len as u32,
            flags,
            version,
            expiry_ms,
            expiry_slot: expiry_ms != 0,
            flags_slot: flags != 0,
            slack_slot,
            pinned: false,
        }
    }

    /// Bytes of this object's header in the log.
    #[inline]
    pub fn header_bytes(&self) -> usize {
        HEADER_MIN_BYTES
            + if self.long_slot() { LONG_SLOT_BYTES } else { 0 }
            + if self.expiry_slot {
                EXPIRY_SLOT_BYTES
            } else {
                0
            }
            + if self.flags_slot { FLAGS_SLOT_BYTES } else { 0 }
            + if self.slack_slot { SLACK_SLOT_BYTES } else { 0 }
    }

    /// Whether the object has the long slot: its key or its value
    /// capacity does not fit the shape word (layout; fixed at the append,
    /// as both are).
    #[inline]
    pub fn long_slot(&self) -> bool {
        self.key_len > SHORT_KEY_MAX_BYTES || self.value_cap > SHORT_VALUE_MAX_BYTES
    }

    /// Total bytes the object occupies in the log.
    #[inline]
    pub fn object_bytes(&self) -> usize {
        self.header_bytes() + self.key_len as usize + self.value_cap as usize
    }

    /// Whether a value of `len` bytes can overwrite this object's value in
    /// place (Nibble-2): exactly its capacity, or shorter if the object has
    /// a slack slot and the slack left is representable.
    #[inline]
    pub fn can_hold(&self, len: usize) -> bool {
        let cap = self.value_cap as usize;
        len == cap || (self.slack_slot && len < cap && cap - len <= MAX_CAP_SLACK_BYTES as usize)
    }

    /// Whether an expiry of `expiry_ms` can be stored in this object's
    /// header (0, none, needs no slot).
    #[inline]
    pub fn fits_expiry(&self, expiry_ms: u64) -> bool {
        expiry_ms == 0 || self.expiry_slot
    }

    /// Whether `flags` can be stored in this object's header (0 needs no
    /// slot).
    #[inline]
    pub fn fits_flags(&self, flags: u32) -> bool {
        flags == 0 || self.flags_slot
    }

    /// Encode for the log. `key_len` must be at most 65 535, `value_cap` at
    /// most [`MAX_VALUE_BYTES`], `value_cap - value_len` 0 without a slack
    /// slot and at most [`MAX_CAP_SLACK_BYTES`] with one, and the flags
    /// and the expiry must fit (the store ensures all of it); `version` is
    /// cut to 32 bits and `expiry_ms` to [`MAX_EXPIRY_MS`].
    #[inline]
    pub fn encode(&self) -> EncodedHeader {
        debug_assert!(self.key_len <= u16::MAX as u32);
        debug_assert!(self.value_cap as usize <= MAX_VALUE_BYTES);
        debug_assert!(self.value_cap >= self.value_len);
        debug_assert!(self.slack_slot || self.value_cap == self.value_len);
        debug_assert!(self.value_cap - self.value_len <= MAX_CAP_SLACK_BYTES);
        debug_assert!(self.fits_flags(self.flags));
        debug_assert!(self.fits_expiry(self.expiry_ms));
        let mut b = [0u8; HEADER_MAX_BYTES];
        let key = self.key_len.min(u16::MAX as u32);
        // The capacity, not the length: these bits are never rewritten
        // (module essay, "The layout").
        let value = self.value_cap & VALUE_LEN_MASK;
        let long = self.long_slot();
        let mut shape =
            (key & SHORT_KEY_MAX_BYTES) | (value & SHORT_VALUE_MAX_BYTES) << SHAPE_KEY_BITS;
        if self.expiry_slot {
            shape |= EXT_EXPIRY;
        }
        if self.flags_slot {
            shape |= EXT_FLAGS;
        }
        if self.slack_slot {
            shape |= EXT_SLACK;
        }
        if long {
            shape |= EXT_LONG;
        }
        if self.pinned {
            shape |= PINNED_BIT;
        }
        b[0..4].copy_from_slice(&shape.to_le_bytes());
        let version = (self.version & LOG_VERSION_MASK) as u32;
        b[VERSION_OFFSET..VERSION_OFFSET + 4].copy_from_slice(&version.to_le_bytes());
        let mut at = HEADER_MIN_BYTES;
        if long {
            let high = key >> SHAPE_KEY_BITS | (value >> SHAPE_VALUE_BITS) << SHAPE_KEY_BITS;
            b[at..at + LONG_SLOT_BYTES].copy_from_slice(&high.to_le_bytes());
            at += LONG_SLOT_BYTES;
        }
        if self.expiry_slot {
            let expiry = self.expiry_ms.min(MAX_EXPIRY_MS);
            b[at..at + EXPIRY_SLOT_BYTES].copy_from_slice(&expiry.to_le_bytes()[..6]);
            at += EXPIRY_SLOT_BYTES;
        }
        if self.flags_slot {
            b[at..at + FLAGS_SLOT_BYTES].copy_from_slice(&self.flags.to_le_bytes());
            at += FLAGS_SLOT_BYTES;
        }
        if self.slack_slot {
            let slack = self
                .value_cap
                .saturating_sub(self.value_len)
                .min(MAX_CAP_SLACK_BYTES) as u16;
            b[at..at + SLACK_SLOT_BYTES].copy_from_slice(&slack.to_le_bytes());
            at += SLACK_SLOT_BYTES;
        }
        EncodedHeader { bytes: b, len: at }
    }

    /// Decode the first [`HEADER_MIN_BYTES`] of a log header. Returns the
    /// header and how many slot bytes follow (0 to 16), which the caller
    /// reads and hands to [`Header::decode_slots`]; until then the lengths
    /// hold only their low bits if the object has the long slot.
    #[inline]
    pub fn decode_base(b: &[u8; HEADER_MIN_BYTES]) -> (Header, usize) {
        let shape = u32_at(b, 0);
        // The capacity; `decode_slots` subtracts the slack, if any.
        let value_len = (shape >> SHAPE_KEY_BITS) & SHORT_VALUE_MAX_BYTES;
        let h = Header {
            key_len: shape & SHORT_KEY_MAX_BYTES,
            value_len,
            value_cap: value_len,
            flags: 0,
            version: u32_at(b, VERSION_OFFSET) as u64,
            expiry_ms: 0,
            expiry_slot: shape & EXT_EXPIRY != 0,
            flags_slot: shape & EXT_FLAGS != 0,
            slack_slot: shape & EXT_SLACK != 0,
            pinned: shape & PINNED_BIT != 0,
        };
        let slots = SLOT_BYTES_BY_BITS[((shape >> SLOT_BITS_SHIFT) & 0xF) as usize] as usize;
        (h, slots)
    }

    /// Fill the slot fields from the `slots` bytes after the base header
    /// ([`Header::decode_base`]'s count, which says whether the long slot
    /// is there: it is the one slot whose bit the header keeps no field
    /// for).
    #[inline]
    pub fn decode_slots(&mut self, b: &[u8]) {
        let mut at = 0;
        let fixed = if self.expiry_slot {
            EXPIRY_SLOT_BYTES
        } else {
            0
        } + if self.flags_slot { FLAGS_SLOT_BYTES } else { 0 }
            + if self.slack_slot { SLACK_SLOT_BYTES } else { 0 };
        if b.len() >= fixed + LONG_SLOT_BYTES {
            let high = u32_at(b, 0);
            self.key_len |= (high & SHORT_KEY_MAX_BYTES) << SHAPE_KEY_BITS;
            self.value_cap |= (high >> SHAPE_KEY_BITS) << SHAPE_VALUE_BITS;
            self.value_cap &= VALUE_LEN_MASK;
            self.value_len = self.value_cap;
            at += LONG_SLOT_BYTES;
        }
        if self.expiry_slot {
            self.expiry_ms = u48_at(b, at) & MAX_EXPIRY_MS;
            at += EXPIRY_SLOT_BYTES;
        }
        if self.flags_slot {
            self.flags = u32_at(b, at);
            at += FLAGS_SLOT_BYTES;
        }
        if self.slack_slot {
            self.value_len = self.value_cap.saturating_sub(u16_at(b, at) as u32);
        }
    }

    /// Decode a whole log header held in one slice (the tests' round
    /// trips; the store reads headers with `Memory::header`). `None` if `b`
    /// is shorter than the header says.
    #[cfg(test)]
    fn decode(b: &[u8]) -> Option<Header> {
        let base: &[u8; HEADER_MIN_BYTES] = b.get(..HEADER_MIN_BYTES)?.try_into().ok()?;
        let (mut h, slots) = Header::decode_base(base);
        h.decode_slots(b.get(HEADER_MIN_BYTES..HEADER_MIN_BYTES + slots)?);
        Some(h)
    }

    /// Encode in the fixed 24-byte layout of the shared store (`nibblejmp`):
    ///
    /// ```text
    ///  0           2           4            8        12              18              24
    ///  | key_len   | cap_slack | value_len  | flags  | version (u48)  | expiry (u48)  |
    /// ```
    ///
    /// Every object has every field there; the slot bits are not stored.
    #[inline]
    pub fn encode_wide(&self) -> [u8; WIDE_HEADER_BYTES] {
        debug_assert!(self.key_len <= u16::MAX as u32);
        debug_assert!(self.value_cap >= self.value_len);
        debug_assert!(self.value_cap - self.value_len <= MAX_CAP_SLACK_BYTES);
        let mut b = [0u8; WIDE_HEADER_BYTES];
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

    /// Decode the fixed 24-byte layout ([`Header::encode_wide`]); every
    /// slot bit reads as set (the wide layout has every field).
    #[inline]
    pub fn decode_wide(b: &[u8; WIDE_HEADER_BYTES]) -> Header {
        let value_len = u32_at(b, 4);
        Header {
            key_len: u16_at(b, 0) as u32,
            value_len,
            value_cap: value_len.saturating_add(u16_at(b, 2) as u32),
            flags: u32_at(b, 8),
            version: u48_at(b, 12),
            expiry_ms: u48_at(b, 18),
            expiry_slot: true,
            flags_slot: true,
            slack_slot: true,
            pinned: false,
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

    /// Whether the object carries the dead mark ([`DEAD_MARK`]).
    #[inline]
    pub fn is_dead(&self) -> bool {
        self.version == DEAD_VERSION
    }
}

#[inline]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

#[inline]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

#[inline]
fn u48_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w[..6].copy_from_slice(&b[i..i + 6]);
    u64::from_le_bytes(w)
}

/// Milliseconds added to the clock of this process's stores (0 unless a
/// test moves it; see [`skew_clock_ms`]).
static CLOCK_SKEW_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Unix time now, in milliseconds, as the store's expiry sees it (the
/// system clock plus the test skew).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
        + CLOCK_SKEW_MS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The store's clock hook, for TTL tests: move the clock every store of
/// this process sees forward by `ms` (a fake clock, without sleeping).
/// Process-wide, so a test that uses it belongs in a test binary of its
/// own. Servers never call it.
pub fn skew_clock_ms(ms: u64) {
    CLOCK_SKEW_MS.fetch_add(ms, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn full() -> Header {
        Header {
            key_len: 65535,
            value_len: 10,
            value_cap: 10 + 65535,
            flags: 0xdead_beef,
            version: u32::MAX as u64 - 3,
            expiry_ms: 1_700_000_000_000,
            expiry_slot: true,
            flags_slot: true,
            slack_slot: true,
            pinned: false,
        }
    }

    /// Compaction's scan reads headers without the bucket lock while a
    /// Nibble-2 overwrite rewrites them in place: whatever mix of the old
    /// and the new header bytes it reads, the object's size (where the
    /// next object starts) is the one the append fixed. The overwrite may
    /// change the value length, version, expiry and the pinned bit.
    #[test]
    fn a_header_read_mid_overwrite_keeps_the_object_size() {
        for (key_len, cap, long) in [(20, 700, false), (300, 2 << 20, true)] {
            for expiry_slot in [false, true] {
                let old = Header {
                    key_len,
                    value_len: cap,
                    value_cap: cap,
                    flags: 0,
                    version: 77,
                    expiry_ms: if expiry_slot { 1_800_000_000_000 } else { 0 },
                    expiry_slot,
                    flags_slot: false,
                    slack_slot: true,
                    pinned: false,
                };
                assert_eq!(old.long_slot(), long);
                for new_len in [cap - 1, cap - 684, cap.saturating_sub(MAX_CAP_SLACK_BYTES)] {
                    assert!(old.can_hold(new_len as usize));
                    let new = Header {
                        value_len: new_len,
                        version: 78,
                        expiry_ms: if expiry_slot { 5 } else { 0 },
                        pinned: true,
                        ..old
                    };
                    let (a, b) = (old.encode(), new.encode());
                    let (a, b) = (a.as_bytes(), b.as_bytes());
                    assert_eq!(a.len(), b.len(), "an overwrite keeps the header size");
                    for cut in 0..=a.len() {
                        for (first, second) in [(a, b), (b, a)] {
                            let mut torn = first[..cut].to_vec();
                            torn.extend_from_slice(&second[cut..]);
                            let h = Header::decode(&torn).expect("a whole header");
                            assert_eq!(
                                h.object_bytes(),
                                old.object_bytes(),
                                "cap {cap}, new length {new_len}, cut at byte {cut}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A header with the given lengths and slots (the slot fields filled
    /// from `seed` where the slot exists, 0 where it does not).
    fn with_slots(
        key_len: u32,
        value_len: u32,
        slack: u32,
        slots: (bool, bool, bool),
        pinned: bool,
        seed: u64,
    ) -> Header {
        let (expiry_slot, flags_slot, slack_slot) = slots;
        let slack = if slack_slot { slack } else { 0 };
        Header {
            key_len,
            value_len,
            value_cap: value_len + slack,
            flags: if flags_slot { (seed as u32) | 1 } else { 0 },
            version: (seed >> 7) & LOG_VERSION_MASK,
            expiry_ms: if expiry_slot {
                (seed >> 3) & MAX_EXPIRY_MS
            } else {
                0
            },
            expiry_slot,
            flags_slot,
            slack_slot,
            pinned,
        }
    }

    proptest! {
        /// Every combination of slots (long, expiry, flags, slack) and the
        /// pinned bit round-trips, with the header size the slots say, and
        /// a header cut one byte short does not decode.
        #[test]
        fn headers_round_trip_in_every_slot_combination(
            key_len in prop_oneof![0u32..=300, 65_000u32..=65_535],
            value_len in prop_oneof![
                0u32..=4096,
                (SHORT_VALUE_MAX_BYTES - 70_000)..=(SHORT_VALUE_MAX_BYTES + 70_000),
                (MAX_VALUE_BYTES as u32 - 65_535)..=(MAX_VALUE_BYTES as u32 - 65_535),
            ],
            slack in 0u32..=MAX_CAP_SLACK_BYTES,
            slots in any::<(bool, bool, bool)>(),
            pinned in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let h = with_slots(key_len, value_len, slack, slots, pinned, seed);
            let (expiry_slot, flags_slot, slack_slot) = slots;
            let bytes = HEADER_MIN_BYTES
                + if h.long_slot() { LONG_SLOT_BYTES } else { 0 }
                + if expiry_slot { EXPIRY_SLOT_BYTES } else { 0 }
                + if flags_slot { FLAGS_SLOT_BYTES } else { 0 }
                + if slack_slot { SLACK_SLOT_BYTES } else { 0 };
            prop_assert_eq!(
                h.long_slot(),
                key_len > SHORT_KEY_MAX_BYTES || h.value_cap > SHORT_VALUE_MAX_BYTES
            );
            let e = h.encode();
            prop_assert_eq!(e.as_bytes().len(), bytes);
            prop_assert_eq!(h.header_bytes(), bytes);
            prop_assert_eq!(Header::decode(e.as_bytes()), Some(h));
            prop_assert_eq!(Header::decode(&e.as_bytes()[..bytes - 1]), None);
            prop_assert_eq!(
                h.object_bytes(),
                bytes + key_len as usize + h.value_cap as usize
            );
        }
    }

    #[test]
    fn header_round_trips_at_the_edges() {
        let h = full();
        assert_eq!(h.header_bytes(), HEADER_MAX_BYTES);
        assert_eq!(Header::decode(h.encode().as_bytes()), Some(h));
        assert!(h.expired_at(1_700_000_000_000));
        assert!(!Header::default().expired_at(u64::MAX));
        let big = Header {
            key_len: 0,
            value_len: MAX_VALUE_BYTES as u32,
            value_cap: MAX_VALUE_BYTES as u32,
            flags_slot: false,
            slack_slot: false,
            expiry_slot: false,
            expiry_ms: 0,
            flags: 0,
            ..h
        };
        assert_eq!(big.header_bytes(), HEADER_MIN_BYTES + 4);
        assert_eq!(Header::decode(big.encode().as_bytes()), Some(big));
        let small = Header::new(14, 16, 0, 7, 0, false);
        assert_eq!(small.encode().as_bytes().len(), 8, "the common header");
        let short_max = Header::new(255, SHORT_VALUE_MAX_BYTES as usize, 0, 7, 0, false);
        assert_eq!(short_max.header_bytes(), 8);
        let long = Header::new(255, SHORT_VALUE_MAX_BYTES as usize + 1, 0, 7, 0, false);
        assert_eq!(long.header_bytes(), 12);
        let ttl = Header::new(14, 16, 0, 7, 1_800_000_000_000, false);
        assert_eq!(ttl.header_bytes(), 8 + EXPIRY_SLOT_BYTES);
        assert_eq!(Header::decode(ttl.encode().as_bytes()), Some(ttl));
    }

    #[test]
    fn log_versions_change_on_every_modification_and_wrap() {
        for old in [0u64, 1, 5, u32::MAX as u64 - 2, u32::MAX as u64 - 1] {
            let v = next_log_version(old);
            assert!(v != old && v != 0 && v < DEAD_VERSION, "{old} -> {v}");
        }
        // Later candidates win, earlier or equal ones give old + 1, and the
        // step past the top skips the dead mark and 0.
        assert_eq!(log_version_after(10, 5), 10);
        assert_eq!(log_version_after(5, 5), 6);
        assert_eq!(log_version_after(3, 5), 6);
        assert_eq!(
            log_version_after(3, u32::MAX as u64 - 10),
            3,
            "after a wrap"
        );
        assert_eq!(log_version_after(u32::MAX as u64 - 1, 100), 101);
        assert_eq!(log_version_after(0, u32::MAX as u64 - 1), 1);
        assert_eq!(log_version_after(u32::MAX as u64, u32::MAX as u64 - 1), 1);
        let mut v = 0;
        for _ in 0..1000 {
            let n = next_log_version(v);
            assert_ne!(n, v);
            v = n;
        }
    }

    #[test]
    fn new_picks_slots_and_the_checks_use_them() {
        let plain = Header::new(3, 5, 0, 7, 0, false);
        assert_eq!(plain.header_bytes(), HEADER_MIN_BYTES);
        assert!(plain.fits_expiry(0) && !plain.fits_expiry(99));
        assert!(plain.fits_flags(0) && !plain.fits_flags(1));
        assert!(plain.can_hold(5) && !plain.can_hold(4) && !plain.can_hold(6));
        let ttl = Header::new(3, 5, 0, 7, 99, false);
        assert!(ttl.expiry_slot && ttl.fits_expiry(0) && ttl.fits_expiry(123));
        let flagged = Header::new(3, 5, 9, 7, 0, false);
        assert!(flagged.flags_slot && !flagged.slack_slot && flagged.fits_flags(9));
        let slack = Header::new(3, 5, 0, 7, 0, true);
        assert!(slack.can_hold(5) && slack.can_hold(0) && !slack.can_hold(6));
    }

    #[test]
    fn wide_layout_round_trips() {
        let h = full();
        let b = h.encode_wide();
        assert_eq!(b.len(), WIDE_HEADER_BYTES);
        assert_eq!(Header::decode_wide(&b), h);
    }

    #[test]
    fn slack_and_wide_fields() {
        let h = Header {
            key_len: 3,
            value_len: 100_000,
            value_cap: 100_000,
            slack_slot: true,
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
            expiry_slot: true,
            version: u64::MAX,
            flags_slot: true,
            ..h
        };
        let d = Header::decode(far.encode().as_bytes()).unwrap();
        assert_eq!(d.expiry_ms, MAX_EXPIRY_MS);
        assert!(!d.pinned, "a far expiry does not set the pinned mark");
        let pinned = Header {
            pinned: true,
            ..far
        };
        let p = Header::decode(pinned.encode().as_bytes()).unwrap();
        assert!(p.pinned && p.expiry_ms == MAX_EXPIRY_MS);
        let bare = Header {
            pinned: true,
            ..Header::new(1, 2, 0, 3, 0, false)
        };
        let b = Header::decode(bare.encode().as_bytes()).unwrap();
        assert!(b.pinned && b.header_bytes() == HEADER_MIN_BYTES);
        assert_eq!(d.version, LOG_VERSION_MASK, "the log keeps 32 bits");
        let w = Header::decode_wide(&far.encode_wide());
        assert_eq!((w.expiry_ms, w.version), (FIELD48_MASK, FIELD48_MASK));
        let v = next_version(0);
        assert!(next_version(v) > v && v <= FIELD48_MASK);
    }
}
