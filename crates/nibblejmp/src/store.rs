//! The shared store: creation and attach over SpaceJMP segments, the epoch
//! table, breakable locks, and put / get / delete.
//!
//! Module map: this file holds the process-side handle ([`SharedStore`]),
//! the epoch slots and the lock protocol; [`crate::compaction`] the lease
//! and the cleaner; [`crate::recovery`] what attach does after a crash. The
//! protocol itself (who writes what in which order, and why a dead process
//! never wedges the others) is the crate essay in `lib.rs`.

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
/// Spins before a lock waiter starts yielding the CPU.
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

/// The default directory of a store named `name`:
/// `/dev/shm/nibblejmp-<uid>/<name>` (tmpfs: survives processes, not
/// reboots; pass a disk directory for that).
pub fn default_dir(name: &str) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/dev/shm/nibblejmp-{uid}")).join(name)
}

/// A held `flock` on the store's attach lock file.
pub(crate) struct AttachLock(std::fs::File);

impl AttachLock {
    pub(crate) fn take(dir: &Path) -> Result<AttachLock> {
        let p = dir.join(ATTACH_LOCK_FILE);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .map_err(|e| Error::Io {
                what: "open".into(),
                path: p.clone(),
                source: e,
            })?;
        // SAFETY: a valid descriptor owned by `f`.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::Io {
                what: "flock".into(),
                path: p,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(AttachLock(f))
    }
}

impl Drop for AttachLock {
    fn drop(&mut self) {
        // SAFETY: a valid descriptor owned by `self.0`.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
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

/// An operation's hold on an epoch slot: pinned while it lives.
pub(crate) struct Op<'a> {
    inner: &'a Inner,
    local: usize,
    pub(crate) slot: usize,
}

impl Op<'_> {
    /// Leave the epoch (while waiting for space) ...
    pub(crate) fn unpin(&self) {
        self.inner.slot(self.slot).tsc.store(0, Ordering::Release);
    }

    /// ... and enter it again.
    pub(crate) fn repin(&self) {
        self.inner.pin(self.slot);
    }
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        let s = self.inner.slot(self.slot);
        s.intent_kind.store(INTENT_NONE, Ordering::Relaxed);
        s.tsc.store(0, Ordering::Release);
        self.inner.local[self.local]
            .busy
            .store(false, Ordering::Release);
    }
}

/// Outcome of an append attempt.
pub(crate) enum Append {
    Done(ValidLoc),
    NoSpace,
}

/// A snapshot of a slot's intent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Intent {
    kind: u64,
    b0: u64,
    b1: u64,
    old: u64,
    new: u64,
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
        if self.obj_state(loc).load(Ordering::Acquire) & OBJ_MAGIC_MASK != OBJ_MAGIC {
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
        (end <= self.geo.seg_bytes).then_some(Obj { loc, h })
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

    // ---- epochs -----------------------------------------------------

    pub(crate) fn pin(&self, slot: usize) {
        self.slot(slot)
            .tsc
            .store(topology::rdtsc().max(1), Ordering::Relaxed);
        // Pairs with the reclaimer's fence before it scans the slots: either
        // it sees our stamp, or we see its state change (§4.5).
        fence(Ordering::SeqCst);
    }

    /// Take one of this process's epoch slots and pin it.
    pub(crate) fn begin(&self) -> Op<'_> {
        let n = self.local.len();
        let start = topology::current_cpu() % n;
        loop {
            for i in 0..n {
                let l = (start + i) % n;
                if self.local[l]
                    .busy
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    let slot = self.local[l].slot;
                    self.slot(slot).ops.fetch_add(1, Ordering::Relaxed);
                    self.pin(slot);
                    return Op {
                        inner: self,
                        local: l,
                        slot,
                    };
                }
            }
            std::thread::yield_now();
        }
    }

    /// The oldest stamp of any operation in flight (u64::MAX if none),
    /// reclaiming slots of dead processes that hold it back.
    pub(crate) fn min_epoch(&self) -> u64 {
        fence(Ordering::SeqCst);
        let mut min = u64::MAX;
        for i in 0..EPOCH_SLOTS {
            let s = self.slot(i);
            let t = s.tsc.load(Ordering::Acquire);
            if t == 0 {
                continue;
            }
            let owner = s.owner.load(Ordering::Acquire);
            if owner != 0 && owner != self.me && slot_owner_dead(owner) {
                self.reclaim_slot(i, owner);
                continue;
            }
            min = min.min(t);
        }
        min
    }

    // ---- slots of dead processes ---------------------------------------

    fn intent_of(&self, slot: usize) -> Intent {
        let s = self.slot(slot);
        Intent {
            kind: s.intent_kind.load(Ordering::Acquire),
            b0: s.intent_b0.load(Ordering::Acquire),
            b1: s.intent_b1.load(Ordering::Acquire),
            old: s.intent_old.load(Ordering::Acquire),
            new: s.intent_new.load(Ordering::Acquire),
        }
    }

    pub(crate) fn set_intent(
        &self,
        op: &Op<'_>,
        kind: u64,
        b0: usize,
        b1: usize,
        old: u64,
        new: u64,
    ) {
        let s = self.slot(op.slot);
        s.intent_b0.store(b0 as u64 + 1, Ordering::Relaxed);
        s.intent_b1.store(b1 as u64 + 1, Ordering::Relaxed);
        s.intent_old.store(old, Ordering::Relaxed);
        s.intent_new.store(new, Ordering::Relaxed);
        s.intent_kind.store(kind, Ordering::Release);
    }

    pub(crate) fn set_intent_old(&self, op: &Op<'_>, old: u64) {
        self.slot(op.slot).intent_old.store(old, Ordering::Release);
    }

    pub(crate) fn set_intent_new(&self, op: &Op<'_>, new: u64) {
        self.slot(op.slot).intent_new.store(new, Ordering::Release);
    }

    /// The (bucket, entry) of `b0`/`b1` that names `loc`, if any. The
    /// caller holds both buckets' locks when it acts on the answer.
    pub(crate) fn find_entry(&self, b0: usize, b1: usize, loc: u64) -> Option<(usize, usize)> {
        [b0, b1].into_iter().find_map(|b| {
            self.bucket(b)
                .entries
                .iter()
                .position(|e| {
                    let e = e.load(Ordering::Acquire);
                    e != 0 && e & LOC_MASK == loc
                })
                .map(|i| (b, i))
        })
    }

    fn bucket_has(&self, b: u64, loc: u64) -> bool {
        b != 0
            && b <= self.geo.index_buckets
            && self.bucket(b as usize - 1).entries.iter().any(|e| {
                let e = e.load(Ordering::Acquire);
                e != 0 && e & LOC_MASK == loc
            })
    }

    /// Finish or roll back a dead holder's bucket update. Every step is
    /// idempotent, so two processes resolving the same intent agree (the
    /// deciding fact, whether the index holds `new` / still holds `old`,
    /// cannot change while one of the key's buckets is held).
    fn resolve(&self, it: Intent) {
        let present =
            |loc: u64| loc != 0 && (self.bucket_has(it.b0, loc) || self.bucket_has(it.b1, loc));
        match it.kind {
            INTENT_PUT | INTENT_MOVE if it.new != 0 => {
                if present(it.new) {
                    self.mark(it.new, OBJ_COMMITTED);
                    if it.old != 0 && it.old != it.new {
                        self.mark(it.old, OBJ_DEAD);
                    }
                } else {
                    self.mark(it.new, OBJ_DEAD);
                }
            }
            INTENT_DEL if it.old != 0 && !present(it.old) => self.mark(it.old, OBJ_DEAD),
            _ => {}
        }
    }

    /// Take bucket `b` from dead holder `holder` (word `w`), resolve its
    /// intent and unlock. False if someone else moved first.
    fn break_bucket(&self, my_slot: usize, b: usize, w: u64, holder: usize) -> bool {
        let it = self.intent_of(holder);
        let word = &self.bucket(b).word;
        if word
            .compare_exchange(
                w,
                lock_word(w, my_slot),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        if it.kind != INTENT_NONE && (it.b0 == b as u64 + 1 || it.b1 == b as u64 + 1) {
            self.resolve(it);
        }
        let now = word.load(Ordering::Relaxed);
        word.store(unlock_word(now), Ordering::Release);
        self.hdr().broken_locks.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Take head `h` from a dead holder; on success the caller holds it.
    fn break_head(&self, my_slot: usize, h: usize, w: u64) -> bool {
        let lock = &self.head(h).lock;
        if lock
            .compare_exchange(
                w,
                lock_word(w, my_slot),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        self.repair_head(h);
        self.hdr().broken_locks.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Under head `h`'s lock, after its holder died: segments the holder
    /// claimed but never linked are closed, and the head's segment's
    /// `used` covers every complete append.
    pub(crate) fn repair_head(&self, h: usize) {
        let head = self.head(h);
        let cur = head.seg.load(Ordering::Acquire);
        for s in 0..self.geo.log_segments as usize {
            let e = self.seg(s);
            let st = e.state.load(Ordering::Acquire);
            if st == seg_state(SEG_OPEN, h as u64) && cur != s as u64 + 1 {
                self.close_segment(s);
            }
        }
        if cur != 0 && cur <= self.geo.log_segments {
            let e = self.seg(cur as usize - 1);
            let off = head.off.load(Ordering::Acquire).min(self.geo.seg_bytes);
            e.used.fetch_max(off, Ordering::AcqRel);
        }
    }

    /// Reclaim slot `i` of the dead owner `owner`: resolve and release the
    /// locks it holds, clear it, free it.
    pub(crate) fn reclaim_slot(&self, i: usize, owner: u64) -> bool {
        let s = self.slot(i);
        if s.owner
            .compare_exchange(
                owner,
                RECLAIM_BIT | self.me,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        let it = self.intent_of(i);
        for b in [it.b0, it.b1] {
            if b == 0 || b > self.geo.index_buckets {
                continue;
            }
            let w = self.bucket(b as usize - 1).word.load(Ordering::Acquire);
            if lock_holder(w) == Some(i) {
                // Steal as ourselves (slot i is ours now: we hold RECLAIM).
                self.break_bucket(i, b as usize - 1, w, i);
            }
        }
        for h in 0..self.geo.heads as usize {
            let lock = &self.head(h).lock;
            let w = lock.load(Ordering::Acquire);
            if lock_holder(w) == Some(i) && self.break_head(i, h, w) {
                let now = lock.load(Ordering::Relaxed);
                lock.store(unlock_word(now), Ordering::Release);
            }
        }
        s.intent_kind.store(INTENT_NONE, Ordering::Relaxed);
        s.tsc.store(0, Ordering::Relaxed);
        s.owner.store(0, Ordering::Release);
        self.hdr().slots_reclaimed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Reclaim every slot whose owner is dead.
    pub(crate) fn reclaim_dead_slots(&self) -> u64 {
        let mut n = 0;
        for i in 0..EPOCH_SLOTS {
            let owner = self.slot(i).owner.load(Ordering::Acquire);
            if owner != 0
                && owner != self.me
                && slot_owner_dead(owner)
                && self.reclaim_slot(i, owner)
            {
                n += 1;
            }
        }
        n
    }

    /// Live processes (other than us) with a slot in the table.
    pub(crate) fn others_alive(&self) -> bool {
        (0..EPOCH_SLOTS).any(|i| {
            let o = self.slot(i).owner.load(Ordering::Acquire);
            o != 0 && o & RECLAIM_BIT == 0 && o != self.me && proc_id::alive(o)
        })
    }

    // ---- locks ------------------------------------------------------

    /// Lock bucket `b`, breaking it if its holder is dead; `Busy` after
    /// `lock_wait` behind a live holder.
    pub(crate) fn lock_bucket(&self, op: &Op<'_>, b: usize) -> Result<()> {
        let word = &self.bucket(b).word;
        let mut spins = 0u32;
        let start = Instant::now();
        loop {
            let w = word.load(Ordering::Acquire);
            match lock_holder(w) {
                None => {
                    if word
                        .compare_exchange_weak(
                            w,
                            lock_word(w, op.slot),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                    {
                        return Ok(());
                    }
                }
                Some(h) => {
                    spins += 1;
                    if spins.is_multiple_of(SPINS_BETWEEN_LIVENESS_CHECKS) {
                        let owner = self.slot(h).owner.load(Ordering::Acquire);
                        if lock_breakable(owner) {
                            self.break_bucket(op.slot, b, w, h);
                            continue;
                        }
                        if start.elapsed() > self.opts.lock_wait {
                            return Err(Error::Busy(format!(
                                "index bucket {b} held by live process {} for over {:?}",
                                proc_id::pid_of(owner),
                                self.opts.lock_wait
                            )));
                        }
                    }
                    backoff(spins);
                }
            }
        }
    }

    pub(crate) fn unlock_bucket(&self, b: usize) {
        let word = &self.bucket(b).word;
        let w = word.load(Ordering::Relaxed);
        word.store(unlock_word(w), Ordering::Release);
    }

    /// Lock a key's two buckets, lower index first (one global order).
    pub(crate) fn lock_pair(&self, op: &Op<'_>, b0: usize, b1: usize) -> Result<()> {
        let (lo, hi) = (b0.min(b1), b0.max(b1));
        self.lock_bucket(op, lo)?;
        if hi != lo {
            if let Err(e) = self.lock_bucket(op, hi) {
                self.unlock_bucket(lo);
                return Err(e);
            }
        }
        Ok(())
    }

    pub(crate) fn unlock_pair(&self, b0: usize, b1: usize) {
        if b0 != b1 {
            self.unlock_bucket(b0.max(b1));
        }
        self.unlock_bucket(b0.min(b1));
    }

    /// Lock some head, starting from this CPU's (§4.4: a busy head is
    /// skipped, not waited on); dead holders' heads are taken over.
    fn lock_head(&self, op: &Op<'_>) -> Result<usize> {
        let n = self.geo.heads as usize;
        let first = topology::current_cpu() % n;
        let start = Instant::now();
        let mut rounds = 0u32;
        loop {
            for i in 0..n {
                let h = (first + i) % n;
                let lock = &self.head(h).lock;
                let w = lock.load(Ordering::Acquire);
                if lock_holder(w).is_none()
                    && lock
                        .compare_exchange(
                            w,
                            lock_word(w, op.slot),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                {
                    return Ok(h);
                }
            }
            rounds += 1;
            if rounds.is_multiple_of(64) {
                for h in 0..n {
                    let w = self.head(h).lock.load(Ordering::Acquire);
                    if let Some(holder) = lock_holder(w) {
                        let owner = self.slot(holder).owner.load(Ordering::Acquire);
                        if lock_breakable(owner) && self.break_head(op.slot, h, w) {
                            return Ok(h);
                        }
                    }
                }
                if start.elapsed() > self.opts.lock_wait {
                    return Err(Error::Busy(format!(
                        "every log head held by live processes for over {:?}",
                        self.opts.lock_wait
                    )));
                }
            }
            backoff(rounds);
        }
    }

    fn unlock_head(&self, h: usize) {
        let lock = &self.head(h).lock;
        let w = lock.load(Ordering::Relaxed);
        lock.store(unlock_word(w), Ordering::Release);
    }

    // ---- segments ---------------------------------------------------

    pub(crate) fn count_free(&self) -> u64 {
        (0..self.geo.log_segments as usize)
            .filter(|&s| self.seg(s).state.load(Ordering::Relaxed) == SEG_FREE)
            .count() as u64
    }

    /// Claim a free segment for `tag`; clients leave the reserve alone.
    pub(crate) fn claim_segment(&self, tag: u64, use_reserve: bool) -> Option<usize> {
        let n = self.geo.log_segments as usize;
        if !use_reserve && self.count_free() <= self.geo.reserve_segments {
            return None;
        }
        let start = self.hdr().alloc_hint.fetch_add(1, Ordering::Relaxed) as usize % n;
        for i in 0..n {
            let s = (start + i) % n;
            let e = self.seg(s);
            if e.state.load(Ordering::Relaxed) == SEG_FREE
                && e.state
                    .compare_exchange(
                        SEG_FREE,
                        seg_state(SEG_OPEN, tag),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                e.used.store(0, Ordering::Relaxed);
                e.live.store(0, Ordering::Relaxed);
                e.min_expiry_ms.store(0, Ordering::Relaxed);
                e.stamp.store(0, Ordering::Release);
                return Some(s);
            }
        }
        None
    }

    pub(crate) fn close_segment(&self, s: usize) {
        let e = self.seg(s);
        e.stamp.store(ordered_stamp(), Ordering::Release);
        e.state.store(SEG_CLOSED, Ordering::Release);
    }

    /// Append an object under a head; the caller is pinned.
    fn append(&self, op: &Op<'_>, key: &[u8], value: &[u8], hdr: &Header) -> Result<Append> {
        let size = object_bytes(key.len(), value.len());
        let h = self.lock_head(op)?;
        let head = self.head(h);
        loop {
            let cur = head.seg.load(Ordering::Acquire);
            let off = head.off.load(Ordering::Acquire);
            if cur != 0 && off + size <= self.geo.seg_bytes {
                let s = cur as usize - 1;
                let loc = self
                    .valid_loc(s as u64 * self.geo.seg_bytes + off + 1)
                    .expect("a head's offset leaves room for the object in its segment");
                // SAFETY: `size` bytes at `off` fit the head's segment
                // (checked above) and we hold the head's lock: nobody else
                // appends there, and nothing names the space yet.
                unsafe { self.write_object(loc, key, value, hdr) };
                point(CrashPoint::AppendMidCopy);
                head.off.store(off + size, Ordering::Release);
                self.seg(s).used.store(off + size, Ordering::Release);
                self.unlock_head(h);
                return Ok(Append::Done(loc));
            }
            if cur != 0 {
                head.seg.store(0, Ordering::Release);
                self.close_segment(cur as usize - 1);
            }
            match self.claim_segment(h as u64, false) {
                Some(s) => {
                    point(CrashPoint::SegmentClaimed);
                    head.off.store(0, Ordering::Relaxed);
                    head.seg.store(s as u64 + 1, Ordering::Release);
                }
                None => {
                    self.unlock_head(h);
                    return Ok(Append::NoSpace);
                }
            }
        }
    }

    /// Write state word (uncommitted), header, key and value at `loc`.
    ///
    /// # Safety
    /// The caller reserved `object_bytes(key.len(), value.len())` bytes at
    /// `loc`, inside `loc`'s segment, under a head lock (or in the
    /// compactor's own segment), and has not published them: no one else
    /// reads or writes them.
    pub(crate) unsafe fn write_object(
        &self,
        loc: ValidLoc,
        key: &[u8],
        value: &[u8],
        hdr: &Header,
    ) {
        debug_assert!(
            (loc.0 - 1) % self.geo.seg_bytes + object_bytes(key.len(), value.len())
                <= self.geo.seg_bytes
        );
        let p = self.obj(loc);
        self.obj_state(loc).store(OBJ_MAGIC, Ordering::Relaxed);
        let hb = hdr.encode_wide();
        // SAFETY: the bytes lie in one segment of the log mapping and only
        // this thread accesses them (this function's contract); header,
        // key and value follow each other without overlapping the
        // caller's slices (which are not log memory).
        unsafe {
            std::ptr::copy_nonoverlapping(hb.as_ptr(), p.add(8), HEADER_BYTES);
            let k = p.add(OBJ_PREFIX_BYTES as usize);
            std::ptr::copy_nonoverlapping(key.as_ptr(), k, key.len());
            std::ptr::copy_nonoverlapping(value.as_ptr(), k.add(key.len()), value.len());
        }
    }

    /// Copy the object `from` (`bytes` long) to `to` (compaction),
    /// uncommitted.
    ///
    /// # Safety
    /// `bytes` is `from`'s size; `to` is unpublished room of `bytes` bytes
    /// in the compactor's own open segment (another segment than
    /// `from`'s), which only the caller writes.
    pub(crate) unsafe fn copy_object(&self, from: &Obj, to: ValidLoc, bytes: u64) {
        debug_assert_eq!(
            bytes,
            object_bytes(from.key_len as usize, from.value_cap as usize)
        );
        // SAFETY: `from` is a checked object of `bytes` bytes inside its
        // segment; `to` has `bytes` bytes of room in another segment (the
        // contract), so the ranges are in the mapping and do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.obj(from.loc), self.obj(to), bytes as usize)
        };
        self.obj_state(to).store(OBJ_MAGIC, Ordering::Release);
    }

    // ---- index ------------------------------------------------------

    /// Find the entry of `key` in its buckets: (bucket, index, loc).
    pub(crate) fn find(
        &self,
        key: &[u8],
        b0: usize,
        b1: usize,
        tag: u64,
    ) -> Option<(usize, usize, u64)> {
        let bs = if b0 == b1 { [b0, usize::MAX] } else { [b0, b1] };
        for b in bs {
            if b == usize::MAX {
                continue;
            }
            for (i, e) in self.bucket(b).entries.iter().enumerate() {
                let e = e.load(Ordering::Acquire);
                if e == 0 || e >> LOC_BITS != tag {
                    continue;
                }
                let loc = e & LOC_MASK;
                if let Some(h) = self.obj_header(loc) {
                    if h.key_len as usize == key.len() && self.obj_key(&h) == key {
                        return Some((b, i, loc));
                    }
                }
            }
        }
        None
    }

    /// An empty entry in the emptier of the two buckets (home on a tie).
    pub(crate) fn empty_entry(&self, b0: usize, b1: usize) -> Option<(usize, usize)> {
        let empties = |b: usize| {
            self.bucket(b)
                .entries
                .iter()
                .filter(|e| e.load(Ordering::Relaxed) == 0)
                .count()
        };
        let b = if b0 != b1 && empties(b1) > empties(b0) {
            b1
        } else {
            b0
        };
        self.bucket(b)
            .entries
            .iter()
            .position(|e| e.load(Ordering::Relaxed) == 0)
            .map(|i| (b, i))
    }

    // ---- operations -------------------------------------------------

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if key.len() > nibble::MAX_KEY_BYTES {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: nibble::MAX_KEY_BYTES,
            });
        }
        Ok(())
    }

    /// The general write (see [`SharedStore::put_with`]); returns the new
    /// version.
    pub(crate) fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64> {
        let op = self.begin();
        self.write(&op, key, value, opts)
    }

    /// Append `key` → `value` and swap it into the index under the key's
    /// bucket locks, as the crate essay's `put` timeline. The condition is
    /// decided under the locks, and so are the version (above every earlier
    /// one of the key) and a kept expiry; the new object's header is
    /// rewritten before the index store if they changed: the object is not
    /// published yet (uncommitted, in a segment no compactor may pick while
    /// we are pinned), so nobody reads it.
    pub(crate) fn write(
        &self,
        op: &Op<'_>,
        key: &[u8],
        value: &[u8],
        o: PutOptions,
    ) -> Result<u64> {
        self.check_key(key)?;
        let size = object_bytes(key.len(), value.len());
        if size > self.geo.seg_bytes || value.len() > u32::MAX as usize {
            return Err(Error::ValueTooLarge {
                len: key.len() + value.len(),
                max: (self.geo.seg_bytes - OBJ_PREFIX_BYTES) as usize,
            });
        }
        let hash = nibble::hash_key(key);
        let (b0, b1, tag) = self.buckets_of(hash);
        let (cond, flags, version) = (o.condition, o.flags, nibble::object::next_version(0));
        let expiry = match o.expiry {
            Expiry::At(t) => t.clamp(1, nibble::object::FIELD48_MASK),
            Expiry::Never | Expiry::Keep => 0,
        };
        if cond != Condition::Always {
            // Cheap optimistic check first, so a failing condition does
            // not leave a dead object in the log.
            let cur = self.find_live(key, b0, b1, tag);
            check_condition(cond, cur.as_ref().map(Obj::header))?;
        }
        let mut hdr = Header {
            key_len: key.len() as u32,
            value_len: value.len() as u32,
            value_cap: value.len() as u32,
            flags,
            version,
            expiry_ms: expiry,
            // The wide layout has every field.
            flags_slot: true,
            slack_slot: true,
        };
        let deadline = Instant::now() + self.opts.oom_wait;
        let loc = loop {
            match self.append(op, key, value, &hdr)? {
                Append::Done(loc) => break loc,
                Append::NoSpace => {
                    // Holding our pin would keep retired segments from
                    // being reused: leave the epoch while waiting.
                    op.unpin();
                    let progress = self.make_space();
                    // Out of memory when compaction made no room in
                    // time, or when others kept taking the room it made
                    // for ten times as long.
                    let now = Instant::now();
                    if (!progress && now >= deadline) || now >= deadline + self.opts.oom_wait * 10 {
                        return Err(Error::OutOfMemory {
                            live_bytes: self.live_bytes(),
                            capacity_bytes: self.geo.capacity_bytes,
                        });
                    }
                    if !progress {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    op.repin();
                }
            }
        };
        let new = loc;
        let loc = new.get();
        self.set_intent(op, INTENT_PUT, b0, b1, 0, loc);
        point(CrashPoint::PutAppended);
        if let Err(e) = self.lock_pair(op, b0, b1) {
            self.mark(loc, OBJ_DEAD);
            return Err(e);
        }
        let found = self.find(key, b0, b1, tag);
        let old_hdr = found.and_then(|(_, _, old)| self.obj_header(old));
        let live_old = old_hdr.filter(|h| !h.expired());
        if let Err(e) = check_condition(cond, live_old.as_ref().map(Obj::header)) {
            self.mark(loc, OBJ_DEAD);
            self.unlock_pair(b0, b1);
            return Err(e);
        }
        if let Some(oh) = old_hdr {
            hdr.version = hdr.version.max(oh.version + 1) & nibble::object::FIELD48_MASK;
        }
        if o.expiry == Expiry::Keep {
            hdr.expiry_ms = live_old.map_or(0, |h| h.expiry_ms);
        }
        if hdr.version != version || hdr.expiry_ms != expiry {
            self.rewrite_header(new, &hdr);
        }
        let entry = (tag << LOC_BITS) | loc;
        let old = match found {
            Some((b, i, old)) => {
                self.set_intent_old(op, old);
                self.bucket(b).entries[i].store(entry, Ordering::Release);
                Some(old)
            }
            None => match self.empty_entry(b0, b1) {
                Some((b, i)) => {
                    self.bucket(b).entries[i].store(entry, Ordering::Release);
                    None
                }
                None => {
                    self.mark(loc, OBJ_DEAD);
                    self.unlock_pair(b0, b1);
                    return Err(Error::IndexFull);
                }
            },
        };
        point(CrashPoint::PutEntryStored);
        self.mark(loc, OBJ_COMMITTED);
        point(CrashPoint::PutCommitted);
        self.add_live(loc, size);
        self.note_expiry(loc, hdr.expiry_ms);
        match old {
            Some(old) => {
                self.mark(old, OBJ_DEAD);
                if let Some(oh) = old_hdr {
                    self.sub_live(
                        old,
                        object_bytes(oh.key_len as usize, oh.value_cap as usize),
                    );
                }
            }
            None => self.count_items(op, 1),
        }
        self.unlock_pair(b0, b1);
        Ok(hdr.version)
    }

    /// Rewrite the header of an unpublished object this operation appended.
    /// (It is not published, so nobody reads it; the stores are atomic
    /// anyway, as every access to header words after the append. Key and
    /// value lengths are unchanged, so scans that size it agree.)
    fn rewrite_header(&self, loc: ValidLoc, hdr: &Header) {
        let hb = hdr.encode_wide();
        for (i, chunk) in hb.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.obj_word(loc, 1 + i)
                .store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
    }

    /// Record that the object at `loc` expires at `expiry_ms` (0 = never)
    /// in its segment's earliest expiry.
    pub(crate) fn note_expiry(&self, loc: u64, expiry_ms: u64) {
        if expiry_ms != 0 {
            let _ = self.seg(self.seg_of(loc)).min_expiry_ms.fetch_update(
                Ordering::AcqRel,
                Ordering::Relaxed,
                |m| (m == 0 || expiry_ms < m).then_some(expiry_ms),
            );
        }
    }

    /// Add `delta` (±1) to the item counter stripe of `op`'s slot.
    pub(crate) fn count_items(&self, op: &Op<'_>, delta: i64) {
        self.meta().counts[op.slot % COUNT_STRIPES]
            .items
            .fetch_add(delta as u64, Ordering::Relaxed);
    }

    /// Keys in the index (the sum of the counter stripes).
    pub(crate) fn len(&self) -> u64 {
        let sum = self
            .meta()
            .counts
            .iter()
            .fold(0u64, |a, c| a.wrapping_add(c.items.load(Ordering::Relaxed)));
        (sum as i64).max(0) as u64
    }

    /// The key's object and header if present and not expired; the caller
    /// is pinned.
    fn find_live(&self, key: &[u8], b0: usize, b1: usize, tag: u64) -> Option<Obj> {
        let (_, _, loc) = self.find(key, b0, b1, tag)?;
        let o = self.obj_header(loc)?;
        (!o.expired()).then_some(o)
    }

    pub(crate) fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>> {
        buf.clear();
        self.check_key(key)?;
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let _op = self.begin();
        // No seqlock validation is needed: an entry is one word, read
        // atomically; the object it names has an immutable key and value
        // (header words are loaded atomically) and stays mapped while we
        // are pinned (see the crate essay).
        Ok(self.find_live(key, b0, b1, tag).map(|o| {
            buf.extend_from_slice(self.obj_value(&o));
            item_meta(&o)
        }))
    }

    pub(crate) fn meta_of(&self, key: &[u8]) -> Result<Option<ItemMeta>> {
        self.check_key(key)?;
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let _op = self.begin();
        Ok(self.find_live(key, b0, b1, tag).map(|o| item_meta(&o)))
    }

    /// Delete `key` if `cond` holds (an expired item is removed either way
    /// and reported as `KeyNotFound`).
    pub(crate) fn delete_if(&self, key: &[u8], cond: Condition) -> Result<()> {
        self.check_key(key)?;
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let op = self.begin();
        self.set_intent(&op, INTENT_DEL, b0, b1, 0, 0);
        self.lock_pair(&op, b0, b1)?;
        let Some((b, i, old)) = self.find(key, b0, b1, tag) else {
            self.unlock_pair(b0, b1);
            return Err(Error::KeyNotFound);
        };
        let oh = self.obj_header(old);
        let live = oh.filter(|h| !h.expired());
        if live.is_some() {
            if let Err(e) = check_condition(cond, live.as_ref().map(Obj::header)) {
                self.unlock_pair(b0, b1);
                return Err(e);
            }
        }
        self.set_intent_old(&op, old);
        self.bucket(b).entries[i].store(0, Ordering::Release);
        point(CrashPoint::DeleteEntryCleared);
        self.mark(old, OBJ_DEAD);
        if let Some(oh) = oh {
            self.sub_live(
                old,
                object_bytes(oh.key_len as usize, oh.value_cap as usize),
            );
        }
        self.count_items(&op, -1);
        self.unlock_pair(b0, b1);
        if live.is_some() {
            Ok(())
        } else {
            Err(Error::KeyNotFound)
        }
    }

    pub(crate) fn delete(&self, key: &[u8]) -> Result<bool> {
        match self.delete_if(key, Condition::Always) {
            Ok(()) => Ok(true),
            Err(Error::KeyNotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Set or clear the expiry of `key` in place: one atomic store of the
    /// header word that holds the expiry (its low 16 bits, the top of the
    /// version, are kept), under the key's bucket locks, so it cannot race
    /// a put's "keep the expiry" or a compaction move. Readers load header
    /// words atomically and see the old or the new expiry. The version is
    /// kept, as `nibble::Store` keeps it; no space is needed, so this works
    /// in a full store too.
    pub(crate) fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool> {
        self.check_key(key)?;
        let (b0, b1, tag) = self.buckets_of(nibble::hash_key(key));
        let t = expiry_ms.map_or(0, |t| t.clamp(1, nibble::object::FIELD48_MASK));
        let op = self.begin();
        // No intent to resolve (one atomic store), but the buckets are
        // named so that a reclaimer of a dead holder finds its locks.
        self.set_intent(&op, INTENT_NONE, b0, b1, 0, 0);
        self.lock_pair(&op, b0, b1)?;
        let done = match self.find_live(key, b0, b1, tag) {
            Some(o) => {
                let loc = o.loc().get();
                let w = self.obj_word(o.loc(), EXPIRY_WORD);
                let old = w.load(Ordering::Relaxed);
                w.store(
                    (old & !EXPIRY_WORD_MASK) | (t << EXPIRY_SHIFT),
                    Ordering::Release,
                );
                self.note_expiry(loc, t);
                point(CrashPoint::ExpiryStored);
                true
            }
            None => false,
        };
        self.unlock_pair(b0, b1);
        Ok(done)
    }

    /// One step of a cursor over the keys (Redis SCAN: the cursor is the
    /// next bucket; a key present for the whole iteration is returned,
    /// exactly once, since an entry never moves between buckets while the
    /// store is attached). Visits buckets until `count` keys are found or
    /// `16 × count` buckets were read, so a sparse index costs bounded work
    /// per step.
    pub(crate) fn scan(
        &self,
        cursor: u64,
        count: usize,
        with_expired: bool,
    ) -> Result<(u64, Vec<Vec<u8>>)> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let n = self.geo.index_buckets;
        let count = count.max(1);
        let max_buckets = (count as u64).saturating_mul(SCAN_BUCKETS_PER_KEY);
        let mut keys = Vec::new();
        let mut b = cursor;
        let now = nibble::object::now_ms();
        let _op = self.begin();
        let mut visited = 0;
        while b < n && keys.len() < count && visited < max_buckets {
            for e in &self.bucket(b as usize).entries {
                let e = e.load(Ordering::Acquire);
                if e == 0 {
                    continue;
                }
                let loc = e & LOC_MASK;
                if let Some(h) = self.obj_header(loc) {
                    if with_expired || !h.expired_at(now) {
                        keys.push(self.obj_key(&h).to_vec());
                    }
                }
            }
            b += 1;
            visited += 1;
        }
        Ok((if b >= n { 0 } else { b }, keys))
    }

    pub(crate) fn live_bytes(&self) -> u64 {
        (0..self.geo.log_segments as usize)
            .map(|s| self.seg(s).live.load(Ordering::Relaxed))
            .sum()
    }

    /// Free space for a writer: retired segments whose epoch passed, then a
    /// compaction pass if this process can hold the lease. True if a
    /// client-usable segment is free now.
    pub(crate) fn make_space(&self) -> bool {
        self.reclaim_retired();
        if self.count_free() > self.geo.reserve_segments {
            return true;
        }
        self.compact_inline();
        self.count_free() > self.geo.reserve_segments
    }

    /// Key iteration: every key, in bucket order (a snapshot per bucket;
    /// keys written concurrently may or may not appear).
    pub(crate) fn for_each_key(&self, mut f: impl FnMut(&[u8], &Header)) {
        const BUCKETS_PER_PIN: usize = 256;
        let n = self.geo.index_buckets as usize;
        let mut b = 0;
        while b < n {
            let _op = self.begin();
            for bb in b..(b + BUCKETS_PER_PIN).min(n) {
                for e in &self.bucket(bb).entries {
                    let e = e.load(Ordering::Acquire);
                    if e == 0 {
                        continue;
                    }
                    let loc = e & LOC_MASK;
                    if let Some(h) = self.obj_header(loc) {
                        f(self.obj_key(&h), &h);
                    }
                }
            }
            b += BUCKETS_PER_PIN;
        }
    }
}

/// A write's condition against the current live item (`None` = absent or
/// expired), as `nibble::Store`'s.
fn check_condition(cond: Condition, cur: Option<&Header>) -> Result<()> {
    match (cond, cur) {
        (Condition::Always, _) | (Condition::IfAbsent, None) | (Condition::IfPresent, Some(_)) => {
            Ok(())
        }
        (Condition::IfAbsent, Some(_)) => Err(Error::KeyExists),
        (Condition::IfPresent, None) | (Condition::IfVersion(_), None) => Err(Error::KeyNotFound),
        (Condition::IfVersion(v), Some(h)) if h.version == v => Ok(()),
        (Condition::IfVersion(_), Some(h)) => Err(Error::VersionMismatch { current: h.version }),
    }
}

/// The item metadata of a header.
fn item_meta(h: &Header) -> ItemMeta {
    ItemMeta {
        value_len: h.value_len as usize,
        version: h.version,
        flags: h.flags,
        expiry_ms: (h.expiry_ms != 0).then_some(h.expiry_ms),
    }
}

/// A TSC stamp taken after every earlier load and store is globally
/// visible: `MFENCE; LFENCE; RDTSC` (Intel SDM; the sequence
/// `epoch::TscClock::stamp_ordered` uses). A plain RDTSC may execute before
/// the index updates a retirement or close stamp must follow.
pub(crate) fn ordered_stamp() -> u64 {
    fence(Ordering::SeqCst);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: LFENCE exists on every x86-64 processor (SSE2), touches no
    // memory or registers and leaves the flags alone.
    unsafe {
        core::arch::asm!("lfence", options(nostack, preserves_flags));
    }
    topology::rdtsc().max(1)
}

/// Whether a slot owner word names a dead process (or a dead reclaimer).
pub(crate) fn slot_owner_dead(owner: u64) -> bool {
    owner != 0 && !proc_id::alive(owner & !RECLAIM_BIT)
}

/// Whether a lock held by a slot with this owner word may be broken: the
/// slot is free (cannot hold a lock), being reclaimed (its owner died), or
/// its owner is dead.
fn lock_breakable(owner: u64) -> bool {
    owner == 0 || owner & RECLAIM_BIT != 0 || !proc_id::alive(owner)
}

fn backoff(spins: u32) {
    if spins < SPINS_BEFORE_YIELD {
        for _ in 0..(1u32 << (spins.min(6))) {
            std::hint::spin_loop();
        }
    } else {
        std::thread::yield_now();
    }
}

/// Statistics of a store (see [`SharedStore::stats`]).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub geometry: Option<Geometry>,
    pub segments_free: u64,
    pub segments_open: u64,
    pub segments_closed: u64,
    pub segments_compacting: u64,
    pub segments_retired: u64,
    /// Sum of the per-segment live-byte counters.
    pub live_bytes: u64,
    /// Index entries (keys), from the striped counters (see
    /// [`SharedStore::len`]).
    pub objects: u64,
    pub index_load: f64,
    pub attaches: u64,
    pub recoveries: u64,
    pub rebuilds: u64,
    pub broken_locks: u64,
    pub slots_reclaimed: u64,
    pub compactions: u64,
    pub lease_takeovers: u64,
    /// Expired objects removed by compaction.
    pub expired_reclaimed: u64,
    pub clean_flag: bool,
    /// Compaction lease holder: (pid, alive).
    pub lease_holder: Option<(u32, bool)>,
    /// Processes with epoch slots: (pid, slots, alive).
    pub processes: Vec<(u32, usize, bool)>,
}

/// A Nibble store in SpaceJMP segments, attached by this process.
pub struct SharedStore {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    report: RecoveryReport,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        what: what.into(),
        path: path.to_path_buf(),
        source: e,
    }
}

impl SharedStore {
    /// Create a store of `capacity_bytes` in directory `dir` (a SpaceJMP
    /// store directory of its own: registry + three segment files).
    pub fn create(
        dir: impl AsRef<Path>,
        capacity_bytes: u64,
        opts: &Options,
    ) -> Result<SharedStore> {
        let dir = dir.as_ref().to_path_buf();
        let geo = Geometry::plan(capacity_bytes, opts)?;
        if dir.join("registry").exists() {
            return Err(Error::Exists(dir));
        }
        std::fs::create_dir_all(&dir).map_err(|e| io_err("create", &dir, e))?;
        let lock = AttachLock::take(&dir)?;
        if dir.join("registry").exists() {
            return Err(Error::Exists(dir));
        }
        let res = Self::create_locked(&dir, geo, opts);
        if res.is_err() {
            // Leave nothing half-made behind.
            for name in [SEG_META, SEG_INDEX, SEG_LOG] {
                let _ = std::fs::remove_file(spacejmp::segment::seg_path(&dir, name));
            }
            let _ = std::fs::remove_file(dir.join("registry"));
        }
        let inner = res?;
        drop(lock);
        Ok(Self::start(inner, RecoveryReport::default()))
    }

    fn create_locked(dir: &Path, geo: Geometry, opts: &Options) -> Result<Inner> {
        let meta_len = meta_bytes(geo.log_segments);
        let index_len = geo.index_buckets * BUCKET_BYTES;
        let log_len = geo.log_segments * geo.seg_bytes;
        let win_len =
            (meta_len + index_len + log_len + (64 << 20)).next_multiple_of(WINDOW_GRANULE_BYTES);
        let gran = win_len.next_power_of_two();
        let slots = (WINDOW_AREA_END - WINDOW_AREA_BASE) / gran;
        if slots == 0 {
            return Err(Error::InvalidArgument(format!(
                "capacity {} too large for the address window",
                geo.capacity_bytes
            )));
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        dir.hash(&mut hasher);
        std::process::id().hash(&mut hasher);
        let first = hasher.finish() % slots;
        let mut jmp = None;
        for i in 0..64 {
            let base = WINDOW_AREA_BASE + ((first + i) % slots) * gran;
            // Jmp::open reserves the window with MAP_FIXED_NOREPLACE and
            // reports a collision as WindowTaken: try the next slot.
            let _ = std::fs::remove_file(dir.join("registry"));
            match Jmp::open(Config::with_store(dir).window(base, win_len)) {
                Ok(j) => {
                    jmp = Some(j);
                    break;
                }
                Err(spacejmp::Error::WindowTaken { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let jmp = Box::new(
            jmp.ok_or_else(|| Error::Busy("no free address window for the store".into()))?,
        );
        let so = SegOptions {
            lockable: false,
            mode: 0o660,
            ..SegOptions::default()
        };
        jmp.seg_alloc(SEG_META, meta_len, &so)?;
        jmp.seg_alloc(SEG_INDEX, index_len, &so)?;
        jmp.seg_alloc(SEG_LOG, log_len, &so)?;
        jmp.vas_create(VAS_NAME, 0o660)?;
        for s in [SEG_META, SEG_INDEX, SEG_LOG] {
            jmp.seg_attach(VAS_NAME, s, Access::Write)?;
        }
        let inner = Self::map(dir, jmp, opts, Some(geo))?;
        let h = inner.hdr();
        h.layout_version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.capacity_bytes
            .store(geo.capacity_bytes, Ordering::Relaxed);
        h.seg_bytes.store(geo.seg_bytes, Ordering::Relaxed);
        h.log_segments.store(geo.log_segments, Ordering::Relaxed);
        h.index_buckets.store(geo.index_buckets, Ordering::Relaxed);
        h.heads.store(geo.heads, Ordering::Relaxed);
        h.reserve_segments
            .store(geo.reserve_segments, Ordering::Relaxed);
        h.created_unix_ms
            .store(nibble::object::now_ms(), Ordering::Relaxed);
        h.attaches.store(1, Ordering::Relaxed);
        // Magic last: a creator killed before this leaves "not a store".
        h.magic.store(MAGIC, Ordering::Release);
        let mut inner = inner;
        inner.claim_local_slots()?;
        Ok(inner)
    }

    /// Map the VAS and build the process-side handle; validates the meta
    /// header unless `creating`.
    fn map(dir: &Path, jmp: Box<Jmp>, opts: &Options, creating: Option<Geometry>) -> Result<Inner> {
        let not_store = |what: String| Error::NotAStore {
            path: dir.to_path_buf(),
            what,
        };
        let vh = match jmp.vas_attach(VAS_NAME, AttachOptions::default()) {
            Ok(v) => v,
            Err(spacejmp::Error::NotFound { .. }) => {
                return Err(not_store("no `nibblejmp` VAS in the registry".into()))
            }
            Err(e) => return Err(e.into()),
        };
        // SAFETY: `vh` borrows the Jmp in the Box, whose address is stable;
        // Inner keeps both and drops `vh` first (see `Drop for Inner`).
        let vh: VasHandle<'static> =
            unsafe { std::mem::transmute::<VasHandle<'_>, VasHandle<'static>>(vh) };
        let mut addr = [(0u64, 0u64); 3];
        for (info, _) in vh.segments() {
            let i = match info.name.as_str() {
                SEG_META => 0,
                SEG_INDEX => 1,
                SEG_LOG => 2,
                _ => continue,
            };
            addr[i] = (info.data_start(), info.size - info.header_size);
        }
        if addr.iter().any(|a| a.0 == 0) {
            return Err(not_store(
                "the VAS lacks the meta, index or log segment".into(),
            ));
        }
        if addr[0].1 < core::mem::size_of::<Meta>() as u64 {
            return Err(not_store("meta segment too small".into()));
        }
        let meta = addr[0].0 as *const Meta;
        // SAFETY: the meta segment is mapped read-write and is at least
        // `size_of::<Meta>()` bytes (checked just above).
        let hdr = unsafe { &(*meta).hdr };
        let geo = match creating {
            Some(g) => g,
            None => {
                let magic = hdr.magic.load(Ordering::Acquire);
                if magic != MAGIC {
                    return Err(not_store(if magic == 0 {
                        "creation did not finish (no magic)".into()
                    } else {
                        format!("bad magic {magic:#x}")
                    }));
                }
                let v = hdr.layout_version.load(Ordering::Relaxed);
                if v != LAYOUT_VERSION {
                    return Err(Error::WrongVersion {
                        path: dir.to_path_buf(),
                        found: v,
                        expected: LAYOUT_VERSION,
                    });
                }
                let g = Geometry {
                    capacity_bytes: hdr.capacity_bytes.load(Ordering::Relaxed),
                    seg_bytes: hdr.seg_bytes.load(Ordering::Relaxed),
                    log_segments: hdr.log_segments.load(Ordering::Relaxed),
                    index_buckets: hdr.index_buckets.load(Ordering::Relaxed),
                    heads: hdr.heads.load(Ordering::Relaxed),
                    reserve_segments: hdr.reserve_segments.load(Ordering::Relaxed),
                };
                let sane = g.seg_bytes >= BLOCK_BYTES
                    && g.seg_bytes.is_multiple_of(BLOCK_BYTES)
                    && g.log_segments > 0
                    && g.index_buckets.is_power_of_two()
                    && g.index_buckets >= 2
                    && (1..=MAX_HEADS as u64).contains(&g.heads)
                    && addr[0].1 >= meta_bytes(g.log_segments)
                    && addr[1].1 >= g.index_buckets * BUCKET_BYTES
                    && addr[2].1 / g.seg_bytes >= g.log_segments;
                if !sane {
                    return Err(not_store(format!(
                        "geometry {g:?} does not match the segments"
                    )));
                }
                g
            }
        };
        Ok(Inner {
            vh: ManuallyDrop::new(vh),
            jmp: ManuallyDrop::new(jmp),
            dir: dir.to_path_buf(),
            meta,
            segtab: (addr[0].0 + core::mem::size_of::<Meta>() as u64) as *const SegEntry,
            index: addr[1].0 as *const Bucket,
            log: addr[2].0 as *mut u8,
            geo,
            me: proc_id::self_id(),
            local: Vec::new(),
            opts: opts.clone(),
            compactor: Mutex::new(CompactorState::default()),
            closed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        })
    }

    /// Attach an existing store. Reclaims slots of dead processes; after
    /// an unclean shutdown of the last process (or with `opts.rebuild`),
    /// runs recovery (see [`crate::recovery`]).
    pub fn attach(dir: impl AsRef<Path>, opts: &Options) -> Result<SharedStore> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.join("registry").exists() {
            return Err(Error::NotFound(dir));
        }
        let lock = AttachLock::take(&dir)?;
        let jmp = Box::new(Jmp::open(Config::with_store(&dir))?);
        let mut inner = Self::map(&dir, jmp, opts, None)?;
        inner.hdr().attaches.fetch_add(1, Ordering::Relaxed);
        inner.reclaim_dead_slots();
        let others = inner.others_alive();
        if opts.rebuild && others {
            return Err(Error::Busy(
                "rebuild needs exclusive use; other processes are attached".into(),
            ));
        }
        let unclean = inner.hdr().clean.load(Ordering::Acquire) == 0;
        let report = if !others && (unclean || opts.rebuild) {
            inner.recover(unclean, opts.rebuild)?
        } else {
            RecoveryReport::default()
        };
        inner.hdr().clean.store(0, Ordering::Release);
        inner.claim_local_slots()?;
        drop(lock);
        Ok(Self::start(inner, report))
    }

    fn start(inner: Inner, report: RecoveryReport) -> SharedStore {
        let inner = Arc::new(inner);
        let thread = if inner.opts.compaction_thread {
            let i2 = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("nibblejmp-compact".into())
                .spawn(move || i2.compaction_loop())
                .ok()
        } else {
            None
        };
        SharedStore {
            inner,
            thread,
            report,
        }
    }

    /// Insert or replace `key` (no expiry, flags 0).
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.inner.put_with(key, value, PutOptions::default())?;
        Ok(())
    }

    /// The general write, with `nibble::Store::put_with`'s semantics: the
    /// condition (`Always`, `IfAbsent` → `KeyExists`, `IfPresent` /
    /// `IfVersion(v)` → `KeyNotFound` or `VersionMismatch`) is decided
    /// under the key's bucket locks, an expired item counts as absent, and
    /// `Expiry::Keep` keeps the live item's expiry. Returns the new
    /// version: larger than every earlier version of the key (48 bits, from
    /// the TSC as in Nibble, so also across processes and restarts).
    pub fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64> {
        self.inner.put_with(key, value, opts)
    }

    /// The value of `key` (`None` if absent or expired).
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut buf = Vec::new();
        Ok(self.inner.get_into(key, &mut buf)?.map(|_| buf))
    }

    /// Copy the value of `key` into `buf` (replacing its contents) and
    /// return its metadata; `None` (and `buf` empty) if absent or expired.
    pub fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<ItemMeta>> {
        self.inner.get_into(key, buf)
    }

    /// Metadata of `key` without copying the value.
    pub fn meta(&self, key: &[u8]) -> Result<Option<ItemMeta>> {
        self.inner.meta_of(key)
    }

    /// Whether `key` is present (and not expired).
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        Ok(self.inner.meta_of(key)?.is_some())
    }

    /// Remove `key`; true if a live item was removed.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.inner.delete(key)
    }

    /// Delete `key` if `cond` holds, atomically under its bucket locks
    /// (`nibble::Store::delete_if`): `KeyNotFound` if absent or expired
    /// (an expired item is removed either way), `VersionMismatch` if
    /// `IfVersion` names another version, `KeyExists` for `IfAbsent` on a
    /// live item.
    pub fn delete_if(&self, key: &[u8], cond: Condition) -> Result<()> {
        self.inner.delete_if(key, cond)
    }

    /// Set (`Some(unix_ms)`) or clear (`None`) the expiry of `key`; false
    /// if it is absent or expired. The version is kept.
    pub fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool> {
        self.inner.set_expiry(key, expiry_ms)
    }

    /// One step of a cursor over the keys: start with 0, 0 comes back at
    /// the end. Tolerates concurrent writes (Redis SCAN's guarantee: a key
    /// present during the whole walk is returned; a key written meanwhile
    /// may or may not be). Expired keys are skipped.
    pub fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>)> {
        self.inner.scan(cursor, count, false)
    }

    /// Number of keys in the index, from striped counters (no scan).
    /// Items that expired but were not reclaimed yet are included, as in
    /// `nibble::Store::len`.
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    /// True if no key is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Delete every key, expired ones included (a scan and a delete per
    /// key; keys written concurrently may survive). Returns the number of
    /// live keys deleted.
    pub fn flush(&self) -> Result<u64> {
        let mut n = 0;
        let mut cursor = 0;
        loop {
            let (next, keys) = self.inner.scan(cursor, 1024, true)?;
            for k in keys {
                n += u64::from(self.inner.delete(&k)?);
            }
            if next == 0 {
                return Ok(n);
            }
            cursor = next;
        }
    }

    /// Largest key + value bytes one item may have (an object fits one
    /// log segment).
    pub fn max_item_bytes(&self) -> u64 {
        self.inner.geo.seg_bytes - OBJ_PREFIX_BYTES
    }

    /// Every key (for the CLI; tolerates concurrent writes).
    pub fn keys(&self) -> Result<Vec<Vec<u8>>> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let mut v = Vec::new();
        let now = nibble::object::now_ms();
        self.inner.for_each_key(|k, h| {
            if !h.expired_at(now) {
                v.push(k.to_vec())
            }
        });
        Ok(v)
    }

    /// The fixed geometry.
    pub fn geometry(&self) -> Geometry {
        self.inner.geo
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// What recovery did at this attach.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Run compaction passes now (under the lease; for tests and the CLI):
    /// the number of segments compacted, or `Busy` if another process
    /// holds the lease.
    pub fn compact_now(&self) -> Result<u64> {
        self.inner.compact_forced()
    }

    /// Reclaim the epoch slots of dead processes now (resolving their
    /// in-flight bucket updates and releasing their locks); otherwise this
    /// happens when someone waits on such a lock or needs the epoch to
    /// advance. Returns the number of slots reclaimed.
    pub fn reclaim_dead(&self) -> u64 {
        self.inner.reclaim_dead_slots()
    }

    /// Statistics.
    pub fn stats(&self) -> Stats {
        let i = &self.inner;
        let h = i.hdr();
        let mut st = Stats {
            geometry: Some(i.geo),
            ..Stats::default()
        };
        for s in 0..i.geo.log_segments as usize {
            match i.seg(s).state.load(Ordering::Relaxed) & 0xFF {
                SEG_FREE => st.segments_free += 1,
                SEG_OPEN => st.segments_open += 1,
                SEG_CLOSED => st.segments_closed += 1,
                SEG_COMPACTING => st.segments_compacting += 1,
                _ => st.segments_retired += 1,
            }
        }
        st.live_bytes = i.live_bytes();
        st.objects = i.len();
        st.index_load =
            st.objects as f64 / (i.geo.index_buckets as f64 * ENTRIES_PER_BUCKET as f64);
        st.attaches = h.attaches.load(Ordering::Relaxed);
        st.recoveries = h.recoveries.load(Ordering::Relaxed);
        st.rebuilds = h.rebuilds.load(Ordering::Relaxed);
        st.broken_locks = h.broken_locks.load(Ordering::Relaxed);
        st.slots_reclaimed = h.slots_reclaimed.load(Ordering::Relaxed);
        st.compactions = h.compactions.load(Ordering::Relaxed);
        st.lease_takeovers = h.lease_takeovers.load(Ordering::Relaxed);
        st.expired_reclaimed = h.expired_reclaimed.load(Ordering::Relaxed);
        st.clean_flag = h.clean.load(Ordering::Relaxed) != 0;
        let lo = i.meta().lease.owner.load(Ordering::Relaxed);
        if lo != 0 {
            st.lease_holder = Some((proc_id::pid_of(lo), proc_id::alive(lo)));
        }
        let mut procs: Vec<(u64, usize)> = Vec::new();
        for s in 0..EPOCH_SLOTS {
            let o = i.slot(s).owner.load(Ordering::Relaxed) & !RECLAIM_BIT;
            if o == 0 {
                continue;
            }
            match procs.iter_mut().find(|p| p.0 == o) {
                Some(p) => p.1 += 1,
                None => procs.push((o, 1)),
            }
        }
        st.processes = procs
            .into_iter()
            .map(|(o, n)| (proc_id::pid_of(o), n, proc_id::alive(o)))
            .collect();
        st
    }

    /// Detach cleanly: stop compaction, give back the lease and this
    /// process's slots, and mark the store clean if no other live process
    /// is attached.
    pub fn close(mut self) -> Result<()> {
        self.detach()
    }

    /// [`close`](Self::close) for an owner that cannot give the handle up
    /// (a field of a struct being dropped): every later operation on this
    /// handle returns `Closed`; a second call does nothing.
    pub fn close_in_place(&mut self) -> Result<()> {
        self.detach()
    }

    fn detach(&mut self) -> Result<()> {
        let i = &self.inner;
        if i.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        i.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Without the lock file (the directory was removed under us) the
        // slots are still given back; only the clean mark needs the lock.
        let lock = AttachLock::take(&i.dir);
        i.release_lease();
        // Wait for this process's operations to finish, then free slots.
        for l in &i.local {
            while l
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::thread::yield_now();
            }
            let s = i.slot(l.slot);
            s.tsc.store(0, Ordering::Relaxed);
            s.intent_kind.store(INTENT_NONE, Ordering::Relaxed);
            s.owner.store(0, Ordering::Release);
        }
        let lock = lock?;
        if !i.others_alive() {
            // On a disk directory the files must reach the disk before the
            // store is called clean (a no-op cost on tmpfs).
            i.sync()?;
            i.hdr().clean.store(1, Ordering::Release);
            i.sync()?;
        }
        drop(lock);
        Ok(())
    }

    /// Remove the store's files. Refused with `Busy` while a live process
    /// is attached.
    pub fn remove(dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref().to_path_buf();
        let s = SharedStore::attach(
            &dir,
            &Options {
                compaction_thread: false,
                ..Options::default()
            },
        )?;
        if s.inner.others_alive() {
            return Err(Error::Busy("other processes are attached".into()));
        }
        drop(s);
        std::fs::remove_dir_all(&dir).map_err(|e| io_err("remove", &dir, e))
    }
}

impl Drop for SharedStore {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

impl Inner {
    /// `msync` the three segments' data.
    fn sync(&self) -> Result<()> {
        let ranges = [
            (self.meta as u64, meta_bytes(self.geo.log_segments)),
            (self.index as u64, self.geo.index_buckets * BUCKET_BYTES),
            (self.log as u64, self.log_bytes()),
        ];
        for (addr, len) in ranges {
            // SAFETY: each range is the page-aligned start of a segment's
            // data, mapped shared by `vh`, of at most the segment's length.
            if unsafe { libc::msync(addr as *mut libc::c_void, len as usize, libc::MS_SYNC) } != 0 {
                return Err(io_err("msync", &self.dir, std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }

    /// Claim this process's epoch slots.
    fn claim_local_slots(&mut self) -> Result<()> {
        let want = match self.opts.epoch_slots {
            Some(n) if (1..=MAX_PROCESS_SLOTS).contains(&n) => n,
            Some(n) => {
                return Err(Error::InvalidArgument(format!(
                    "epoch_slots {n} must be in 1..={MAX_PROCESS_SLOTS}"
                )))
            }
            None => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .clamp(2, MAX_LOCAL_SLOTS),
        };
        let mut local = Vec::new();
        for i in 0..EPOCH_SLOTS {
            if local.len() == want {
                break;
            }
            let s = self.slot(i);
            if s.owner.load(Ordering::Relaxed) == 0
                && s.owner
                    .compare_exchange(0, self.me, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                s.tsc.store(0, Ordering::Relaxed);
                s.intent_kind.store(INTENT_NONE, Ordering::Release);
                local.push(LocalSlot {
                    slot: i,
                    busy: AtomicBool::new(false),
                });
            }
        }
        if local.is_empty() {
            return Err(Error::Busy(format!(
                "all {EPOCH_SLOTS} epoch slots are held by live processes"
            )));
        }
        self.local = local;
        Ok(())
    }
}
