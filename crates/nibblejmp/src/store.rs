//! The shared store's core: options, geometry, the process's view of an
//! attached store (`Inner`) and the addressing of the three segments.
//!
//! Module map. The protocol itself (who writes what in which order, and
//! why a dead process never wedges the others) is the crate essay in
//! `lib.rs`; its mechanisms live here, one file each:
//!
//! | file | concern |
//! |---|---|
//! | `store.rs` | [`Options`], [`Geometry`], `Inner`, object addressing (`ValidLoc`, `Obj`) |
//! | `store/slots.rs` | epoch slots, operations (`Op`), intents, reclaiming dead processes' slots |
//! | `store/locks.rs` | breakable bucket and head locks, intent resolution, head repair |
//! | `store/segments.rs` | segment claim and close, the append, object writes |
//! | `store/ops.rs` | put / get / delete / set_expiry / scan |
//! | `store/attach.rs` | create, attach, detach, remove; the attach `flock` |
//! | `store/integrity.rs` | object checksums on read, the damage-tolerant log walk, the clean-shutdown seal |
//! | `store/handle.rs` | [`SharedStore`], the public handle, and [`Stats`] |
//! | [`crate::compaction`] | the lease and the cleaner |
//! | [`crate::recovery`] | what attach does after a crash |
//!
//! Addressing: the log is one mapping; a location (`loc`) is its byte
//! offset plus one (0 means "no object"). A location read from shared
//! memory is only a number until `Inner::valid_loc` has checked it; the
//! accessors that dereference the log take the checked form (`ValidLoc`,
//! or `Obj` for key and value bytes), so a bad word in the index or an
//! intent can make an operation fail or skip an object, never read or
//! write outside the mapping.

use std::hash::{Hash, Hasher};
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nibble::object::{Header, WIDE_HEADER_BYTES as HEADER_BYTES};
use nibble::{Condition, Expiry, ItemMeta, PutOptions};
use spacejmp::{Access, AttachOptions, Config, Jmp, SegOptions, VasHandle};

use crate::error::{Error, Result};
use crate::layout::*;
use crate::proc_id::{self, RECLAIM_BIT};
use crate::recovery::RecoveryReport;
use crate::testing::{point, CrashPoint};

mod attach;
mod checkpoint;
mod durability;
mod handle;
mod integrity;
mod locks;
mod ops;
mod segments;
mod slots;

pub use attach::default_dir;
pub use checkpoint::CheckpointStats;
pub(crate) use checkpoint::{
    Loaded, Marker, CHECKPOINT_FILE, SECOND_BUCKET_BIT, SNAPSHOT_WALK_BIT,
};
pub use durability::apply_power_cut;
pub use durability::FlushStats;
pub use handle::{SharedStore, Stats};
pub(crate) use integrity::{SealCheck, SegWalk};
use segments::Append;
use slots::Intent;
pub(crate) use slots::{ordered_stamp, Op};

/// Default share of the capacity given to the index, in permille (as
/// `nibble`'s 6.2 %).
pub const DEFAULT_INDEX_PERMILLE: u32 = 62;
/// Largest default log segment.
pub const DEFAULT_MAX_SEG_BYTES: u64 = 1 << 20;
/// The default segment size shrinks until the log has this many segments.
pub const MIN_DEFAULT_SEGMENTS: u64 = 64;
/// Most heads chosen by default (one per CPU up to this).
pub const DEFAULT_MAX_HEADS: usize = 8;
/// Reserve of free segments only compaction may take, in permille of the
/// log (at least [`MIN_RESERVE_SEGMENTS`]).
pub const RESERVE_PERMILLE: u64 = 30;
/// Smallest compaction reserve.
pub const MIN_RESERVE_SEGMENTS: u64 = 2;
/// Epoch slots a process claims at attach (one per thread inside an
/// operation; more threads wait for a slot).
pub const MAX_LOCAL_SLOTS: usize = 4;
/// Spins on a held lock before checking whether its holder is alive, and
/// between checks.
const SPINS_BETWEEN_LIVENESS_CHECKS: u32 = 512;
/// Backoff rounds (`nibble::backoff`) before a lock waiter starts yielding
/// the CPU: longer than in-process waiters spin, since a holder in another
/// process is as likely to be running as descheduled.
const SPINS_BEFORE_YIELD: u32 = 64;
/// Epoch slots a process may claim at most (`Options::epoch_slots`).
pub const MAX_PROCESS_SLOTS: usize = 64;
/// The object-prefix word holding the expiry (header bytes 18..24 are
/// object bytes 26..32: the top 48 bits of word 3; its low 16 bits are the
/// top of the version).
const EXPIRY_WORD: usize = 3;
const EXPIRY_SHIFT: u32 = 16;
const EXPIRY_WORD_MASK: u64 = nibble::object::FIELD48_MASK << EXPIRY_SHIFT;
/// A scan step reads at most this many buckets per key asked for.
const SCAN_BUCKETS_PER_KEY: u64 = 16;
/// Name of the VAS and of the segments in the SpaceJMP registry.
pub(crate) const VAS_NAME: &str = "nibblejmp";
const SEG_META: &str = "meta";
const SEG_INDEX: &str = "index";
const SEG_LOG: &str = "log";
/// File in the store directory whose `flock` serializes attach, recovery
/// and detach (released by the kernel if the holder dies).
const ATTACH_LOCK_FILE: &str = "nibblejmp.lock";
/// Address range in which store windows are placed (80 TiB of the 128 TiB
/// user half, above spacejmp's default window).
const WINDOW_AREA_BASE: u64 = 0x2000_0000_0000;
const WINDOW_AREA_END: u64 = 0x7000_0000_0000;
/// Window granule.
const WINDOW_GRANULE_BYTES: u64 = 1 << 30;

/// Options of [`SharedStore::create`] and [`SharedStore::attach`]. The
/// geometry fields only matter at creation.
#[derive(Clone, Debug)]
pub struct Options {
    /// Log segment size (a multiple of 64 KiB); default: 1 MiB, halved
    /// until the log has 64 segments, not below 64 KiB.
    pub seg_bytes: Option<u64>,
    /// Number of log heads; default: online CPUs, at most 8.
    pub heads: Option<usize>,
    /// Index share of the capacity in permille.
    pub index_permille: u32,
    /// Run a compaction thread in this process (it competes for the lease).
    pub compaction_thread: bool,
    /// Compaction starts when free segments fall below this permille of
    /// the log.
    pub compaction_trigger_permille: u32,
    /// How long a put waits for compaction before `OutOfMemory`.
    pub oom_wait: Duration,
    /// How long an operation waits on a lock held by a live process before
    /// `Busy`.
    pub lock_wait: Duration,
    /// At attach: rebuild the index from the log even if it looks
    /// consistent (refused with `Busy` while other processes are attached).
    pub rebuild: bool,
    /// Epoch slots this process claims (threads inside an operation at
    /// once; more wait for a slot); default: CPUs, 2 to
    /// [`MAX_LOCAL_SLOTS`]. A server with one worker per CPU asks for one
    /// per worker plus one, up to [`MAX_PROCESS_SLOTS`].
    pub epoch_slots: Option<usize>,
    /// Threads recovery's log walks use (re-derive, rebuild, verify);
    /// default: one per available CPU, at most 16. `Some(1)` runs the
    /// serial walks in log order (the reference the parallel ones are
    /// tested against).
    pub recovery_threads: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seg_bytes: None,
            heads: None,
            index_permille: DEFAULT_INDEX_PERMILLE,
            compaction_thread: true,
            compaction_trigger_permille: 200,
            oom_wait: Duration::from_millis(200),
            lock_wait: Duration::from_secs(5),
            rebuild: false,
            epoch_slots: None,
            recovery_threads: None,
        }
    }
}

/// The store's fixed geometry, decided at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub capacity_bytes: u64,
    pub seg_bytes: u64,
    pub log_segments: u64,
    pub index_buckets: u64,
    pub heads: u64,
    pub reserve_segments: u64,
}

impl Geometry {
    /// Plan a store of `capacity_bytes`: index, meta and log together fit
    /// in the capacity (the SpaceJMP header pages, one per segment, are
    /// extra).
    pub fn plan(capacity_bytes: u64, opts: &Options) -> Result<Geometry> {
        if opts.index_permille == 0 || opts.index_permille > 500 {
            return Err(Error::InvalidArgument(format!(
                "index_permille {} must be in 1..=500",
                opts.index_permille
            )));
        }
        let heads = opts
            .heads
            .unwrap_or_else(|| topology::online_cpus().len().clamp(1, DEFAULT_MAX_HEADS));
        if heads == 0 || heads > MAX_HEADS {
            return Err(Error::InvalidArgument(format!(
                "heads {heads} must be in 1..={MAX_HEADS}"
            )));
        }
        let index_target = capacity_bytes / 1000 * opts.index_permille as u64;
        let index_buckets = prev_pow2((index_target / BUCKET_BYTES).max(64));
        let index_bytes = index_buckets * BUCKET_BYTES;
        let seg_bytes = match opts.seg_bytes {
            Some(s) => {
                if s < BLOCK_BYTES || !s.is_multiple_of(BLOCK_BYTES) || s > (1 << 30) {
                    return Err(Error::InvalidArgument(format!(
                        "seg_bytes {s} must be a multiple of {BLOCK_BYTES} up to 1 GiB"
                    )));
                }
                s
            }
            None => {
                let mut s = DEFAULT_MAX_SEG_BYTES;
                while s > BLOCK_BYTES
                    && capacity_bytes.saturating_sub(index_bytes) / s < MIN_DEFAULT_SEGMENTS
                {
                    s /= 2;
                }
                s
            }
        };
        let rest = capacity_bytes.saturating_sub(index_bytes);
        let mut segs = rest / seg_bytes;
        while segs > 0 && meta_bytes(segs).next_multiple_of(4096) + segs * seg_bytes > rest {
            segs -= 1;
        }
        let reserve = (segs * RESERVE_PERMILLE / 1000).max(MIN_RESERVE_SEGMENTS);
        let need = heads as u64 + reserve + 4;
        if segs < need {
            let min_bytes =
                index_bytes + meta_bytes(need).next_multiple_of(4096) + need * seg_bytes;
            return Err(Error::CapacityTooSmall {
                capacity_bytes,
                min_bytes,
            });
        }
        Ok(Geometry {
            capacity_bytes,
            seg_bytes,
            log_segments: segs,
            index_buckets,
            heads: heads as u64,
            reserve_segments: reserve,
        })
    }

    /// Largest key + value (+ header) bytes one object may have.
    pub fn max_object_bytes(&self) -> u64 {
        self.seg_bytes
    }
}

fn prev_pow2(x: u64) -> u64 {
    1 << (63 - x.max(1).leading_zeros())
}

/// One epoch slot this process owns, used by one thread at a time.
pub(crate) struct LocalSlot {
    pub(crate) slot: usize,
    busy: AtomicBool,
}

/// Process-local state of the compactor (under `Inner::compactor`).
#[derive(Default)]
pub(crate) struct CompactorState {
    /// Segment being filled by compaction.
    pub(crate) dest: Option<usize>,
}

/// Everything a process holds for one attached store.
pub(crate) struct Inner {
    // Drop order matters: the VAS handle borrows the Jmp (see Drop).
    vh: ManuallyDrop<VasHandle<'static>>,
    jmp: ManuallyDrop<Box<Jmp>>,
    pub(crate) dir: PathBuf,
    meta: *const Meta,
    segtab: *const SegEntry,
    index: *const Bucket,
    log: *mut u8,
    pub(crate) geo: Geometry,
    pub(crate) me: u64,
    pub(crate) local: Vec<LocalSlot>,
    pub(crate) opts: Options,
    pub(crate) compactor: Mutex<CompactorState>,
    pub(crate) closed: AtomicBool,
    pub(crate) stop: AtomicBool,
    /// Flushes, deferred kills, the reuse rule (see `durability`).
    pub(crate) dur: durability::Durability,
    /// Checkpoints, stamps, tombstones, the version floor (see
    /// `checkpoint`).
    pub(crate) ck: checkpoint::Ckpt,
}

// SAFETY: the raw pointers point into the segments mapped by `vh`, which
// live as long as `Inner`; everything reached through them is atomics
// (shared with other processes anyway) or log bytes whose writes follow
// the append protocol. No thread-affine state is held.
unsafe impl Send for Inner {}
// SAFETY: as above; all shared mutation goes through atomics.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: `vh` borrows `*jmp` (a Box, so its address is stable);
        // it is dropped first, then the Jmp, and neither is used after.
        unsafe {
            ManuallyDrop::drop(&mut self.vh);
            ManuallyDrop::drop(&mut self.jmp);
        }
    }
}

/// A log location that names room for an object: [`Inner::loc_ok`] held
/// for it (non-zero, 8-aligned, its 32-byte prefix inside one segment).
/// Only [`Inner::valid_loc`] makes one, so the accessors that take it
/// ([`Inner::obj_word`] and the object writes) need no check of their own.
/// It is valid for the store whose `Inner` made it; locations never travel
/// between stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ValidLoc(u64);

impl ValidLoc {
    /// The location.
    #[inline]
    pub(crate) fn get(self) -> u64 {
        self.0
    }
}

/// An object whose header [`Inner::obj_header`] read and checked: its key
/// and value lie inside its segment. The header (in it, by `Deref`) is a
/// copy; the lengths in it never change after the append.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Obj {
    loc: ValidLoc,
    h: Header,
    /// The header's bytes as read (the checksum covers them, not a
    /// re-encoding of `h`).
    raw: [u8; HEADER_BYTES],
    /// The checksum recorded in the state word.
    pub(crate) crc: u32,
}

impl Obj {
    /// Where the object is.
    #[inline]
    pub(crate) fn loc(&self) -> ValidLoc {
        self.loc
    }

    /// Its header.
    #[inline]
    pub(crate) fn header(&self) -> &Header {
        &self.h
    }
}

impl std::ops::Deref for Obj {
    type Target = Header;
    #[inline]
    fn deref(&self) -> &Header {
        &self.h
    }
}

impl Inner {
    // ---- addressing -------------------------------------------------

    pub(crate) fn meta(&self) -> &Meta {
        // SAFETY: `meta` points at the start of the mapped meta segment's
        // data, which holds a `Meta` (checked at attach) for as long as
        // `self` lives; all fields are atomics.
        unsafe { &*self.meta }
    }

    pub(crate) fn hdr(&self) -> &MetaHeader {
        &self.meta().hdr
    }

    pub(crate) fn slot(&self, i: usize) -> &Slot {
        &self.meta().slots[i]
    }

    pub(crate) fn head(&self, i: usize) -> &Head {
        &self.meta().heads[i]
    }

    pub(crate) fn seg(&self, i: usize) -> &SegEntry {
        debug_assert!((i as u64) < self.geo.log_segments);
        // SAFETY: the segment table follows `Meta` in the meta segment with
        // `log_segments` entries (size checked at attach); `i` is in range
        // by every caller's construction.
        unsafe { &*self.segtab.add(i) }
    }

    pub(crate) fn bucket(&self, i: usize) -> &Bucket {
        debug_assert!((i as u64) < self.geo.index_buckets);
        // SAFETY: the index segment holds `index_buckets` buckets (checked
        // at attach), 128-byte aligned (page-aligned base); `i` is masked.
        unsafe { &*self.index.add(i) }
    }

    /// Address of the mapped index's first bucket.
    /// Base address of the log mapping (page-aligned).
    pub(crate) fn log_base(&self) -> *mut libc::c_void {
        self.log.cast()
    }

    pub(crate) fn index_addr(&self) -> usize {
        self.index as usize
    }

    pub(crate) fn log_bytes(&self) -> u64 {
        self.geo.log_segments * self.geo.seg_bytes
    }

    /// Whether `loc` can name an object: non-zero, 8-aligned, and its
    /// prefix inside one segment.
    pub(crate) fn loc_ok(&self, loc: u64) -> bool {
        if loc == 0 {
            return false;
        }
        let off = loc - 1;
        off.is_multiple_of(8)
            && off + OBJ_PREFIX_BYTES <= self.log_bytes()
            && (off % self.geo.seg_bytes) + OBJ_PREFIX_BYTES <= self.geo.seg_bytes
    }

    /// `loc` as a [`ValidLoc`], if [`Inner::loc_ok`] holds for it: the only
    /// way to make one.
    #[inline]
    pub(crate) fn valid_loc(&self, loc: u64) -> Option<ValidLoc> {
        self.loc_ok(loc).then_some(ValidLoc(loc))
    }

    pub(crate) fn seg_of(&self, loc: u64) -> usize {
        ((loc - 1) / self.geo.seg_bytes) as usize
    }

    /// The first byte of the object at `loc` (its state word).
    fn obj(&self, loc: ValidLoc) -> *mut u8 {
        // SAFETY: `loc_ok` held when `loc` was made (the only constructor
        // is `valid_loc`), so `loc - 1 + OBJ_PREFIX_BYTES` is within the
        // log mapping, which lives as long as `self`.
        unsafe { self.log.add((loc.0 - 1) as usize) }
    }

    pub(crate) fn obj_state(&self, loc: ValidLoc) -> &AtomicU64 {
        self.obj_word(loc, 0)
    }

    /// Word `i` (0..4) of an object's 32-byte prefix: 0 is the state word,
    /// 1..=3 nibble's header; word 3 holds the expiry in its top 48 bits.
    ///
    /// # Panics
    /// If `i >= 4` (every caller passes a constant below 4).
    pub(crate) fn obj_word(&self, loc: ValidLoc, i: usize) -> &AtomicU64 {
        assert!(i < 4, "word {i} of a 4-word object prefix");
        // SAFETY: `loc` is a `ValidLoc`, so the object's 8-aligned 32-byte
        // prefix is inside the log mapping, which lives as long as `self`;
        // `i < 4` keeps the word inside the prefix. The mapping is shared
        // memory every process accesses with atomics only.
        unsafe { &*(self.obj(loc).add(8 * i) as *const AtomicU64) }
    }

    /// The object at `loc`, if `loc` can name one, its magic is intact and
    /// it fits its segment.
    pub(crate) fn obj_header(&self, loc: u64) -> Option<Obj> {
        let loc = self.valid_loc(loc)?;
        let st = self.obj_state(loc).load(Ordering::Acquire);
        if st & OBJ_MAGIC_MASK != OBJ_MAGIC {
            return None;
        }
        // Word by word, atomically: the expiry word may be stored by
        // `set_expiry` (under the bucket locks) while we read.
        let mut b = [0u8; HEADER_BYTES];
        for (i, chunk) in b.chunks_exact_mut(8).enumerate() {
            let w = self.obj_word(loc, 1 + i).load(Ordering::Acquire);
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        let h = Header::decode_wide(&b);
        let end = (loc.0 - 1) % self.geo.seg_bytes
            + object_bytes(h.key_len as usize, h.value_cap as usize);
        (end <= self.geo.seg_bytes).then_some(Obj {
            loc,
            h,
            raw: b,
            crc: state_crc(st),
        })
    }

    /// Whether a checked object's key, value and immutable header bytes
    /// match its checksum (see `store/integrity.rs`).
    pub(crate) fn obj_intact(&self, o: &Obj) -> bool {
        obj_crc(&o.raw, self.obj_key(o), self.obj_value(o)) == o.crc
    }

    /// The key bytes of a checked object.
    pub(crate) fn obj_key(&self, o: &Obj) -> &[u8] {
        // SAFETY: `obj_header` made `o` after checking that the object
        // (prefix, key, value of `value_cap` bytes) lies inside one
        // segment, and the lengths in `o.h` are the ones it checked (an
        // `Obj`'s fields are private to this module). The key is immutable
        // once appended and the segment is not reused while the caller is
        // pinned.
        unsafe {
            std::slice::from_raw_parts(
                self.obj(o.loc).add(OBJ_PREFIX_BYTES as usize),
                o.h.key_len as usize,
            )
        }
    }

    /// The value bytes of a checked object.
    pub(crate) fn obj_value(&self, o: &Obj) -> &[u8] {
        let len = o.h.value_len.min(o.h.value_cap) as usize;
        // SAFETY: as `obj_key`; the value follows the key and is at most
        // `value_cap` bytes (bounded above).
        unsafe {
            std::slice::from_raw_parts(
                self.obj(o.loc)
                    .add(OBJ_PREFIX_BYTES as usize + o.h.key_len as usize),
                len,
            )
        }
    }

    /// Set state bits on an object (idempotent; DEAD dominates).
    pub(crate) fn mark(&self, loc: u64, bits: u64) {
        if let Some(loc) = self.valid_loc(loc) {
            let st = self.obj_state(loc);
            if st.load(Ordering::Relaxed) & OBJ_MAGIC_MASK == OBJ_MAGIC {
                st.fetch_or(bits, Ordering::AcqRel);
            }
        }
    }

    pub(crate) fn add_live(&self, loc: u64, bytes: u64) {
        self.seg(self.seg_of(loc))
            .live
            .fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn sub_live(&self, loc: u64, bytes: u64) {
        let _ = self.seg(self.seg_of(loc)).live.fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |v| Some(v.saturating_sub(bytes)),
        );
    }

    pub(crate) fn buckets_of(&self, hash: u64) -> (usize, usize, u64) {
        let n = self.geo.index_buckets as usize;
        let tag = hash >> LOC_BITS;
        let home = (hash as usize) & (n - 1);
        let second = (home + (tag as usize | 1)) & (n - 1);
        (home, second, tag)
    }
}
