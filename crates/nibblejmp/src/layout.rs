//! What lies in the three segments, byte for byte.
//!
//! ```text
//!  meta  │ MetaHeader │ Lease │ Slot × 252 (epoch table) │ Head × 64 │ CountStripe × 16 │ SegEntry × log_segments │
//!  index │ Bucket × index_buckets (128 B each: lock/version word + 15 entries)                  │
//!  log   │ segment 0 │ segment 1 │ …  (each `seg_bytes`, a run of 64 KiB blocks)               │
//! ```
//!
//! Everything shared is an `AtomicU64` (or an array of them), so processes
//! never race on plain memory, and nothing holds a pointer: buckets name
//! objects by *log offset + 1* (48 bits, with the 16-bit hash tag on top,
//! as in `nibble::index`), heads and the segment table name segments by
//! number. The segments sit at the same address in every process
//! (SpaceJMP), so absolute addresses would be valid too, but offsets keep
//! the files position independent and easy to check.
//!
//! An object in the log (8-byte aligned, so its first word is atomic):
//!
//! ```text
//!  0                 8                                  32
//!  | state (u64)     | nibble::object header (24 bytes) | key … | value … | pad to 8 |
//!  state = magic (16 bits) << 48 | crc32c (32 bits) << 16 | DEAD? << 1 | COMMITTED?
//! ```
//!
//! The 24-byte header is `nibble::object::Header` in its wide layout
//! (`Header::encode_wide`: lengths,
//! flags, 48-bit version, expiry). The state word in front is what makes the
//! log self-describing after a crash: an object is part of the store's
//! contents iff it is COMMITTED and not DEAD (see the crate essay).
//!
//! The checksum in the state word ([`obj_crc`]) is CRC-32C over the key,
//! the value and the header's first [`OBJ_CRC_HEADER_BYTES`] bytes
//! (lengths, flags, version): everything of the object that never changes
//! once it is published. It leaves out the state bits (set by `fetch_or`
//! as the object is committed and killed) and the expiry (stored in place
//! by `set_expiry`), which a checksum could only cover if every change
//! rewrote it atomically with them. It costs no space: the magic was cut
//! from 32 to 16 bits to make room (see `crate::store::integrity`).
//!
//! The meta header also carries checksums of the store's structure:
//! `geometry_crc` over the geometry words (set at creation, checked at
//! every attach) and, written by a clean shutdown only, `seal_meta_crc`
//! over the rest of the meta segment (lease, slots, heads, counters,
//! segment table) and `seal_index_crc` over the index segment.
//!
//! Lock words (a bucket's version word, a head's lock) are
//! `seq << 8 | holder`, holder = epoch slot + 1 (0 = free). The sequence
//! number moves on every unlock, so a compare-and-swap that steals a lock
//! from a dead holder cannot succeed against a later holding of the same
//! slot (no ABA).

use std::sync::atomic::AtomicU64;

/// `"NIBJMP\0\x01"`: the meta segment's magic.
pub const MAGIC: u64 = u64::from_le_bytes(*b"NIBJMP\0\x01");
/// Layout version; bumped on any change to this file (2: per-segment
/// earliest expiry, striped item counters, expired-reclaim counter; 3:
/// object checksums in the state word, geometry and shutdown-seal
/// checksums in the meta header). Another version is refused at attach.
pub const LAYOUT_VERSION: u64 = 3;
/// Log block size; a log segment is a whole number of blocks.
pub const BLOCK_BYTES: u64 = 64 << 10;
/// Epoch-table slots (each process claims up to 4; at most 252 threads
/// inside operations at once across all processes, 63 processes with 4
/// each). Must fit the 8-bit holder field of lock words (slot + 1 < 256).
pub const EPOCH_SLOTS: usize = 252;
/// Most log heads a store can have.
pub const MAX_HEADS: usize = 64;
/// Entries per bucket: 15 × 8 + the 8-byte lock/version word = 128 bytes.
pub const ENTRIES_PER_BUCKET: usize = 15;
/// Bytes of a bucket.
pub const BUCKET_BYTES: u64 = 128;
/// Bits of an entry's location; the top 16 are the hash tag.
pub const LOC_BITS: u32 = 48;
/// Mask of the location bits.
pub const LOC_MASK: u64 = (1 << LOC_BITS) - 1;
/// Stripes of the item counter (one cache line each; an operation adds to
/// the stripe of its epoch slot, so processes rarely share a line).
pub const COUNT_STRIPES: usize = 16;

/// Top 16 bits of every object's state word ("NJ").
pub const OBJ_MAGIC: u64 = 0x4E4A << 48;
/// Mask of the magic in the state word.
pub const OBJ_MAGIC_MASK: u64 = 0xFFFF << 48;
/// Shift of the object checksum ([`obj_crc`]) in the state word.
pub const OBJ_CRC_SHIFT: u32 = 16;
/// Mask of the object checksum in the state word.
pub const OBJ_CRC_MASK: u64 = 0xFFFF_FFFF << OBJ_CRC_SHIFT;
/// Header bytes the object checksum covers: the wide header up to its
/// expiry (key length, capacity slack, value length, flags, version).
pub const OBJ_CRC_HEADER_BYTES: usize = 18;
/// State bit: the object's index update happened (it is, or was, the
/// key's value).
pub const OBJ_COMMITTED: u64 = 1;
/// State bit: the object was superseded or deleted.
pub const OBJ_DEAD: u64 = 2;
/// Bytes before the key: the state word and nibble's header.
pub const OBJ_PREFIX_BYTES: u64 = 8 + nibble::object::WIDE_HEADER_BYTES as u64;

/// Capacity slack (bytes of room past the value, never written) that marks
/// a *tombstone*: a delete's record in the log, appended while checkpoints
/// are on (`store/checkpoint.rs`). Its key is the deleted key, its version
/// that of the deleted object, its 8-byte value the checkpoint epoch it was
/// written in; its state is COMMITTED | DEAD from the moment it counts, so
/// every walk that looks for live objects skips it. Objects the store
/// writes otherwise have no slack, so the marker cannot be a user's object.
pub const TOMBSTONE_SLACK_BYTES: u32 = 8;
/// Capacity slack that marks a segment's *stamp*: the first object of a
/// segment opened while checkpoints are on, with an empty key and, as its
/// 8-byte value, the checkpoint epoch the segment was opened in
/// (COMMITTED | DEAD, as a tombstone).
pub const STAMP_SLACK_BYTES: u32 = 16;
/// Bytes of a stamp's or a tombstone's value (the epoch, little endian).
pub const MARKER_VALUE_BYTES: usize = 8;

/// Segment states (low byte of [`SegEntry::state`]; the next byte is the
/// owner tag of an open segment).
pub const SEG_FREE: u64 = 0;
/// Being appended to by a head (tag = head) or by compaction.
pub const SEG_OPEN: u64 = 1;
/// Full; a compaction candidate.
pub const SEG_CLOSED: u64 = 2;
/// Being compacted by the lease holder.
pub const SEG_COMPACTING: u64 = 3;
/// Emptied by compaction; free once every epoch slot has passed `stamp`.
pub const SEG_RETIRED: u64 = 4;
/// Owner tag of a segment opened by compaction.
pub const TAG_COMPACTOR: u64 = 0xFF;
/// Tag of a CLOSED segment that compaction found an unparseable (damaged)
/// region in: never picked as a victim, since index entries may still name
/// objects in the region; recovery's index rebuild untags it.
pub const TAG_QUARANTINED: u64 = 0xFE;

/// Intent kinds recorded in an epoch slot before locking buckets.
pub const INTENT_NONE: u64 = 0;
/// A put: `new` is the appended object, `old` the one it replaces.
pub const INTENT_PUT: u64 = 1;
/// A delete of `old`.
pub const INTENT_DEL: u64 = 2;
/// A compaction move of `old` to `new`.
pub const INTENT_MOVE: u64 = 3;

/// Fixed header of the meta segment: identity, geometry, counters.
#[repr(C, align(64))]
pub struct MetaHeader {
    /// [`MAGIC`], stored last at creation.
    pub magic: AtomicU64,
    pub layout_version: AtomicU64,
    pub capacity_bytes: AtomicU64,
    pub seg_bytes: AtomicU64,
    pub log_segments: AtomicU64,
    pub index_buckets: AtomicU64,
    pub heads: AtomicU64,
    pub reserve_segments: AtomicU64,
    /// 1 after a clean shutdown of the last process, 0 while in use.
    pub clean: AtomicU64,
    pub created_unix_ms: AtomicU64,
    pub attaches: AtomicU64,
    /// Attaches that found an unclean shutdown and ran recovery.
    pub recoveries: AtomicU64,
    /// Index rebuilds from the log.
    pub rebuilds: AtomicU64,
    /// Bucket and head locks taken over from dead holders.
    pub broken_locks: AtomicU64,
    /// Epoch slots of dead processes reclaimed.
    pub slots_reclaimed: AtomicU64,
    /// Segments compacted.
    pub compactions: AtomicU64,
    /// Compaction leases taken from dead holders.
    pub lease_takeovers: AtomicU64,
    /// Where the next free-segment search starts.
    pub alloc_hint: AtomicU64,
    /// Expired objects removed by compaction.
    pub expired_reclaimed: AtomicU64,
    /// CRC-32C of the geometry words (`magic` .. `reserve_segments`),
    /// written at creation, checked at every attach.
    pub geometry_crc: AtomicU64,
    /// Written by a clean shutdown with `clean`: [`SEAL_VALID`] | CRC-32C
    /// of the meta segment after this header ([`Meta`]'s other parts and
    /// the segment table); 0 = none.
    pub seal_meta_crc: AtomicU64,
    /// As `seal_meta_crc`, over the whole index segment.
    pub seal_index_crc: AtomicU64,
    /// Objects found damaged (checksum mismatch) by reads, scans,
    /// compaction and recovery.
    pub damaged_objects: AtomicU64,
}

/// Bit of a seal word that says a checksum is present.
pub const SEAL_VALID: u64 = 1 << 32;

/// Words of [`MetaHeader`] the geometry checksum covers (`magic` to
/// `reserve_segments`).
pub const GEOMETRY_WORDS: usize = 8;

/// CRC-32C of an object: key, value, then the first
/// [`OBJ_CRC_HEADER_BYTES`] bytes of its wide header (in that order, so a
/// put whose version is decided under the locks rechecksums only the
/// header: `crc32c_append` onto the key-and-value checksum).
#[inline]
pub fn obj_crc(header: &[u8; nibble::object::WIDE_HEADER_BYTES], key: &[u8], value: &[u8]) -> u32 {
    obj_crc_finish(obj_crc_kv(key, value), header)
}

/// The key-and-value part of [`obj_crc`].
#[inline]
pub fn obj_crc_kv(key: &[u8], value: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(key), value)
}

/// [`obj_crc`] from its key-and-value part.
#[inline]
pub fn obj_crc_finish(kv: u32, header: &[u8; nibble::object::WIDE_HEADER_BYTES]) -> u32 {
    crc32c::crc32c_append(kv, &header[..OBJ_CRC_HEADER_BYTES])
}

/// The state word of a fresh, uncommitted object with checksum `crc`.
#[inline]
pub fn obj_state_word(crc: u32) -> u64 {
    OBJ_MAGIC | (u64::from(crc) << OBJ_CRC_SHIFT)
}

/// The checksum recorded in a state word.
#[inline]
pub fn state_crc(state: u64) -> u32 {
    ((state & OBJ_CRC_MASK) >> OBJ_CRC_SHIFT) as u32
}

/// The compaction lease: one process at a time compacts.
#[repr(C, align(64))]
pub struct Lease {
    /// Packed id of the holder, 0 if none.
    pub owner: AtomicU64,
    /// Unix ms of the holder's last pass (informational).
    pub heartbeat_ms: AtomicU64,
    /// Segment the holder is compacting into, + 1 (0 = none).
    pub dest: AtomicU64,
    /// Passes run under any lease.
    pub passes: AtomicU64,
}

/// One epoch-table slot (dissertation §4.5), owned by a process, used by
/// one of its threads at a time.
#[repr(C, align(64))]
pub struct Slot {
    /// Packed owner id; 0 = free; [`RECLAIM_BIT`](crate::proc_id::RECLAIM_BIT)
    /// set = being reclaimed by the id in the other bits.
    pub owner: AtomicU64,
    /// TSC at the start of the current operation, 0 when quiescent.
    pub tsc: AtomicU64,
    /// Intent: kind, the two buckets (+ 1), the old and new locations.
    pub intent_kind: AtomicU64,
    pub intent_b0: AtomicU64,
    pub intent_b1: AtomicU64,
    pub intent_old: AtomicU64,
    pub intent_new: AtomicU64,
    /// Operations run in this slot (statistics).
    pub ops: AtomicU64,
}

/// A log head (dissertation §4.4): one per CPU up to [`MAX_HEADS`].
#[repr(C, align(64))]
pub struct Head {
    /// Lock word `seq << 8 | holder slot + 1`.
    pub lock: AtomicU64,
    /// Current segment + 1 (0 = none).
    pub seg: AtomicU64,
    /// Append offset in the current segment (bytes committed).
    pub off: AtomicU64,
}

/// One log segment's entry in the segment table.
#[repr(C)]
pub struct SegEntry {
    /// `tag << 8 | state`.
    pub state: AtomicU64,
    /// Bytes appended and complete (a scan stops here).
    pub used: AtomicU64,
    /// Live bytes (advisory: kept by puts and deletes, exact after
    /// recovery; compaction reads the index for the truth).
    pub live: AtomicU64,
    /// TSC when closed (for the age in the cost-benefit score) or retired
    /// (the epoch stamp).
    pub stamp: AtomicU64,
    /// Earliest expiry (Unix ms) of an object written into the segment, 0
    /// if none: once it has passed, the segment is a compaction candidate
    /// however live it looks, so expired objects are reclaimed.
    pub min_expiry_ms: AtomicU64,
}

/// One stripe of the item counter: index entries added minus removed
/// (wrapping; the sum over the stripes is the number of keys). Exact while
/// no process dies inside an insert or delete; recovery recounts it.
#[repr(C, align(64))]
pub struct CountStripe {
    pub items: AtomicU64,
}

/// The meta segment's fixed part; the segment table follows it.
#[repr(C)]
pub struct Meta {
    pub hdr: MetaHeader,
    pub lease: Lease,
    pub slots: [Slot; EPOCH_SLOTS],
    pub heads: [Head; MAX_HEADS],
    pub counts: [CountStripe; COUNT_STRIPES],
}

/// One index bucket (the layout of `nibble::index::bucket::Bucket<15>`).
#[repr(C, align(128))]
pub struct Bucket {
    /// Lock/version word `seq << 8 | holder slot + 1`.
    pub word: AtomicU64,
    /// `tag << 48 | loc`, 0 = empty.
    pub entries: [AtomicU64; ENTRIES_PER_BUCKET],
}

const _: () = {
    assert!(core::mem::size_of::<Bucket>() == BUCKET_BYTES as usize);
    assert!(core::mem::size_of::<Slot>() == 64);
    assert!(core::mem::size_of::<Head>() == 64);
    assert!(core::mem::size_of::<SegEntry>() == 40);
    assert!(EPOCH_SLOTS < 255);
};

/// Bytes of the meta segment's data for `segments` log segments.
pub fn meta_bytes(segments: u64) -> u64 {
    core::mem::size_of::<Meta>() as u64 + segments * core::mem::size_of::<SegEntry>() as u64
}

/// Holder slot of a lock word, if held.
#[inline]
pub fn lock_holder(word: u64) -> Option<usize> {
    match word & 0xFF {
        0 => None,
        h => Some(h as usize - 1),
    }
}

/// The word of a lock taken by `slot` from the free word `word`.
#[inline]
pub fn lock_word(word: u64, slot: usize) -> u64 {
    (word & !0xFF) | (slot as u64 + 1)
}

/// The free word after unlocking `word` (sequence + 1).
#[inline]
pub fn unlock_word(word: u64) -> u64 {
    ((word >> 8) + 1) << 8
}

/// Bytes an object with these lengths occupies in the log.
#[inline]
pub fn object_bytes(key_len: usize, value_len: usize) -> u64 {
    (OBJ_PREFIX_BYTES + key_len as u64 + value_len as u64).next_multiple_of(8)
}

/// Segment state word.
#[inline]
pub fn seg_state(kind: u64, tag: u64) -> u64 {
    (tag << 8) | kind
}
