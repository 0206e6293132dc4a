//! Blocks, segments and the SegmentInfo table (dissertation §4.2, §4.5).
//!
//! The store's memory is one [`FramePool`] handed out by the distributed
//! buddy allocator in *blocks* of [`BLOCK_BYTES`] (64 KiB, order 4). A
//! *segment* is an ordered list of blocks that need not be contiguous;
//! objects are appended to a segment's byte space and may cross block
//! boundaries, never segment boundaries.
//!
//! Readers follow an object across blocks through two per-block tables: the
//! next block of the same segment, and the segment a block belongs to. Both
//! are written when a segment is created, before any object in it is
//! published through the index, and read without locks under an epoch guard
//! (a segment's blocks are not reused while any operation that might have
//! seen it is still running).
//!
//! The SegmentInfo table keeps, per segment, behind a small mutex only
//! compaction and head rolling touch, its state, length and block list; its
//! live bytes (updated by PUT and DEL, §4.5) are in the CPU-striped
//! `LiveBytes` table beside it.
//!
//! Capacity. Blocks are counted against a budget: clients may use all but
//! the compaction reserve, compaction may use everything. The index may
//! borrow from the same budget once it outgrows its own share
//! (`Memory::borrow_for_index`): a store of small objects is then
//! limited by its memory, not by a fixed index size, and every byte of
//! both still counts against one capacity. A location (`Loc`,
//! what the index stores) is the pool byte offset plus one, so that 0 can
//! mean "empty".
//!
//! Giving memory back. Blocks freed by compaction first go to a *warm
//! cache* of resident free blocks, which new segments take before asking
//! the buddy allocator: under steady churn the log recycles the same
//! resident memory and never page-faults. Blocks nobody reused within the
//! decay time (`Config::decay_ms`, 1 s by default; jemalloc's equivalent is
//! 10 s) are released with `MADV_DONTNEED` a whole 2 MiB region at a time,
//! once no block of the region is in a segment, so RSS follows the data
//! after a phase of deletes instead of staying at its high-water mark.
//! Why whole regions: the pool is backed by transparent huge pages, and
//! releasing one 64 KiB block splits its 2 MiB page into 4 KiB pages for
//! the live blocks around it too. Free blocks lie everywhere after a
//! write burst, so per-block release would split nearly every huge page of
//! the pool and the reads that follow would pay for the TLB misses (about
//! a tenth of read throughput on a 200k-key store). A region being
//! released is marked, and a thread taking one of its blocks waits
//! for the release to finish before it writes. When the store is idle, and
//! in `Store::release_memory` (the analogue of `malloc_trim`), every free
//! block is released and returned to the buddy allocator: memory then
//! matters more than huge pages.
//! (The release itself is in `memory/release.rs`.)
//!
//! Huge pages and the buddy allocator. A released block the buddy
//! allocator holds must stay released, but the kernel can map it in again
//! behind the memory layer's back in two ways: a write into any block of a
//! region whose pages were all dropped faults in the whole 2 MiB huge page,
//! and khugepaged folds a region with any page present into a huge page,
//! filling every hole (with `max_ptes_none` at its default of 511). Either
//! turns up to 31 free blocks nobody will release again into RSS: about
//! 2 MiB, 4 % of a 48 MiB store (`memlab server --quick`'s churn read
//! 1.23 instead of 1.19 in a quarter of its runs). So every region in
//! which the buddy allocator holds a block is advised `MADV_NOHUGEPAGE`
//! before the block goes there (the idle release, or a single block taken
//! from the buddy allocator when no whole region is free): faults there
//! map 4 KiB pages and khugepaged leaves it alone. The advice is lifted
//! when the region is taken whole again, when the memory layer owns every
//! block of it. The blocks of a region the decay-time release dropped stay
//! in the warm cache; the first block taken there may fault the huge page
//! back, so they count as resident again from then on.
//!
//! Never-used blocks. The first write into a fresh 2 MiB region faults in
//! its whole huge page, so the blocks of that region nobody has taken yet
//! are resident too, and each log head and compaction destination would
//! keep up to 2 MiB resident that holds no data (several percent of a
//! 48 MiB store). So the memory layer takes fresh memory from the buddy
//! allocator a whole region at a time when it can (order
//! `REGION_ORDER`; one block when no whole region is free): it splits the
//! region into blocks (`FrameAllocator::split`), uses one and puts the
//! others in the warm cache as *spare* blocks, where the next segments
//! take them first. The memory layer, not the buddy allocator, owns every
//! block a huge-page fault can have made resident, so the idle release
//! (`purge_all`) finds them all in the warm cache and gives them back
//! like any freed block. Why this cannot zero a block in use: a block is
//! released only by the thread that popped it from the warm cache (or,
//! for a whole region, under `REGION_RELEASING` with no block of it in a
//! segment); a pop hands the block to exactly one thread, and a block
//! reaches the buddy allocator only after its release. Nothing ever
//! releases a block that the buddy allocator holds, so a taker can never
//! race a release of the block it took.
//!
//! Mapping memory in. The pool is reserved, not populated: a block's
//! pages are faulted in by the first append that writes them, one 2 MiB
//! page per fault (about 0.007 faults per 1 KiB record in the YCSB load,
//! against 0.28 for a map on glibc's 4 KiB pages), so an empty store
//! costs almost nothing. The kernel zeroes each huge page in the fault,
//! inside the writer's time: 13 % of a 200k-record load's CPU samples in
//! a profile (`examples/load_profile.rs`). The original Nibble prototype
//! populates its whole log before it starts; `Config::prefault` does the
//! same here (`Memory::prefault`, `MADV_POPULATE_WRITE` after
//! `MADV_HUGEPAGE`), off by default since it makes RSS the capacity.
//! What is on by default is narrower (`Config::map_ahead`, module
//! `ahead`): when the warm cache runs low while clients append, or at the
//! first append after an idle release, a compaction worker faults the
//! next whole region in and puts its blocks in the warm cache, so the
//! clients' heads find resident memory: one region ahead, never more.
//!
//! Metadata tables. The per-segment-slot tables (SegmentInfo, live
//! bytes) are sized by the capacity but cost RSS only for the slots in
//! use: SegmentInfo is built in chunks of `SEG_CHUNK_SLOTS` slots when a
//! slot of the chunk is first handed out, the live-bytes cells are zeroed
//! memory, and a new segment gets the lowest free slot, so the slots in
//! use stay at the bottom of the tables. The buddy allocator's per-frame
//! links are zeroed memory too (`buddy::dense`).
//!
//! Accessed bits (cache mode, Segcache §4.3). Once a store may evict,
//! `Memory::track_access` allocates one bit per `ACCESS_GRANULE_BYTES`
//! of pool (0.8 % of the pool; nothing at all under `noeviction`): no two
//! objects start in one granule unless one of them has fewer than 8 key
//! and value bytes (an object is a header of at least 8 bytes and its
//! key and value);
//! then a read of either marks both, which costs eviction only precision.
//! GET sets the bit of the object it read only if it is not set
//! already (a plain load first), so a hot object's line is written once
//! per eviction round, not once per read; merge eviction keeps the objects
//! whose bit is set. A block's bits are cleared when it is taken into a
//! segment, so a copy made by compaction or eviction starts unaccessed.
//! A reader sets a bit under its epoch guard, so the block cannot be freed
//! and reused under it.
//!
//! Reads of object bytes race, by design, with Nibble-2's in-place
//! overwrites (the bucket seqlock detects it and the reader retries); they
//! go through raw pointers with `copy_nonoverlapping`, never through Rust
//! references to pool memory, and every length read from memory is bounded
//! before use.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use buddy::pool::{FramePool, PoolConfig};
use buddy::{new_allocator, AllocatorKind, BuddyConfig, FrameAllocator, FRAME_SHIFT};
use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::index::Loc;
use crate::live::LiveBytes;
use crate::object::{now_ms, Header, HEADER_MAX_BYTES, HEADER_MIN_BYTES};

mod ahead;
mod release;

/// Bytes per block (the paper's default).
pub const BLOCK_BYTES: usize = 64 << 10;
const BLOCK_SHIFT: u32 = 16;
/// Buddy order of one block (16 frames of 4 KiB).
const BLOCK_ORDER: u32 = BLOCK_SHIFT - FRAME_SHIFT;
/// Pool bytes per accessed bit (see "Accessed bits"): below the smallest
/// object, so every object has a bit of its own.
const ACCESS_GRANULE_BYTES: usize = 16;
/// Words of accessed bits per block.
const ACCESS_WORDS_PER_BLOCK: usize = BLOCK_BYTES / ACCESS_GRANULE_BYTES / 64;
/// "No block" in the next-block table.
const NO_BLOCK: u32 = u32::MAX;
/// Bytes of a region, the unit the decay time releases: one transparent
/// huge page (the pool is aligned to it).
const REGION_BYTES: usize = 2 << 20;
/// Blocks per region.
const BLOCKS_PER_REGION: usize = REGION_BYTES / BLOCK_BYTES;
/// Buddy order of one region (512 frames of 4 KiB).
const REGION_ORDER: u32 = REGION_BYTES.trailing_zeros() - FRAME_SHIFT;
/// SegmentInfo slots built at a time (see "Metadata tables").
const SEG_CHUNK_SLOTS: usize = 64;
/// Region word: blocks of the region in segments (low bits) ...
const REGION_TAKEN_MASK: u32 = (1 << 16) - 1;
/// ... some block was taken since the region was last released ...
const REGION_RESIDENT: u32 = 1 << 30;
/// ... and a release is under way (takers wait).
const REGION_RELEASING: u32 = 1 << 31;

/// Where a block is; changed by the thread that owns the block, except
/// `WARM` -> `WARM_RELEASED`, which a region release does to blocks that
/// sit in the warm cache.
mod block_state {
    /// In a segment (or being put into one).
    pub const TAKEN: u8 = 0;
    /// In the warm cache, resident (or a spare block of a region taken
    /// whole, resident once a neighbour's write faulted the region in).
    pub const WARM: u8 = 1;
    /// In the warm cache, its region released (not resident).
    pub const WARM_RELEASED: u8 = 2;
    /// In the buddy allocator (released or never touched).
    pub const BUDDY: u8 = 3;
}

/// Segment id.
pub(crate) type SegId = u32;

/// Life cycle of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegState {
    /// Slot unused.
    Free,
    /// A log head (or a compaction destination being filled).
    Head,
    /// Closed, immutable except for Nibble-2 overwrites; a compaction candidate.
    Closed,
    /// Compacted away, waiting for the epoch to pass before its blocks are freed.
    Retired,
}

/// Mutable segment metadata.
#[derive(Debug)]
pub(crate) struct SegMeta {
    /// State.
    pub state: SegState,
    /// Blocks, in order.
    pub blocks: Vec<u32>,
    /// Bytes written (the end of the last object).
    pub used: usize,
    /// TSC when created (age for the cost-benefit score).
    pub created_tsc: u64,
    /// Epoch stamp when closed.
    pub closed_at: u64,
    /// TTL heads' segments (module `log`): the first object's expiry plus
    /// its bucket's width (Unix ms), by when every object appended to it
    /// expires unless an expiry changed later; 0 for other segments. The
    /// expiry pass waits for such a segment to expire whole instead of
    /// reading it for its first expired objects.
    pub ttl_span_end_ms: u64,
    /// The expiry pass's wait (ms) before it reads this mixed segment
    /// again for expired objects; doubles while reads find little.
    pub mixed_backoff_ms: u64,
    /// Merge eviction's second chance (module `compaction::evict`): a
    /// compaction destination (its objects survived a pass) that merge
    /// eviction has not yet passed over once.
    pub second_chance: bool,
}

/// One SegmentInfo slot.
pub(crate) struct SegInfo {
    /// Earliest expiry (Unix ms) of any object written here; `u64::MAX` if
    /// none. Live bytes cannot see expiry, so compaction uses this to find
    /// segments whose objects have expired.
    pub min_expiry_ms: AtomicU64,
    /// Latest expiry (Unix ms) of any object written here, raised at
    /// every append, relocation and expiry change ([`crate::store::note_expiry`]);
    /// `u64::MAX` once an object without an expiry is written, 0 while
    /// the segment is empty. An upper bound, never lowered while the
    /// segment is in use: once it has passed, every object here has
    /// expired, and the expiry pass frees the segment whole
    /// (`compaction/expire.rs`).
    pub max_expiry_ms: AtomicU64,
    /// Everything else.
    pub meta: Mutex<SegMeta>,
}

/// Blocks of memory and the segments built from them.
pub(crate) struct Memory {
    pool: FramePool,
    base: *mut u8,
    alloc: Box<dyn FrameAllocator>,
    blocks_total: u64,
    reserve_blocks: u64,
    blocks_in_use: CachePadded<AtomicU64>,
    /// Bytes the index has borrowed from the block budget; the blocks they
    /// round up to are counted in `blocks_in_use` (never allocated: the
    /// pool's pages behind them stay untouched).
    index_borrowed: Mutex<u64>,
    next_block: Box<[AtomicU32]>,
    block_seg: Box<[AtomicU32]>,
    /// SegmentInfo slots in chunks of `SEG_CHUNK_SLOTS`, each built when
    /// one of its slots is first handed out (see "Metadata tables").
    segs: Box<[OnceLock<Box<[SegInfo]>>]>,
    /// Live bytes per segment slot.
    live: LiveBytes,
    free_segs: Mutex<FreeSlots>,
    /// The last region-sized take from the buddy allocator failed: take
    /// single blocks until the idle release gives blocks back (a failed
    /// take costs the allocator's slow path).
    no_whole_regions: AtomicBool,
    /// Free blocks not yet given to the buddy allocator, roughly oldest
    /// first, with the time (Unix ms) they were freed (or last looked at by
    /// the decay-time release): the next segments take them before asking
    /// the buddy allocator; [`Memory::purge_cold_regions`] releases the
    /// regions of those nobody reused within the decay time, and
    /// [`Memory::purge_all`] releases them all (see "Giving memory back").
    warm: SegQueue<(u32, u64)>,
    warm_blocks: AtomicU64,
    /// Warm blocks whose region was released (state `WARM_RELEASED`).
    warm_released: AtomicU64,
    blocks_purged: AtomicU64,
    /// A client asked for a region to be mapped in ahead of the log
    /// (module `ahead`).
    map_ahead_wanted: AtomicBool,
    /// The idle release ran since the last append looked, or no append
    /// has looked yet (module `ahead`).
    purged_since_append: AtomicBool,
    blocks_mapped_ahead: AtomicU64,
    /// Per block: a `block_state` value.
    block_state: Box<[AtomicU8]>,
    /// Per 2 MiB region: taken count and flags (`REGION_*`).
    regions: Box<[AtomicU32]>,
    /// Per 2 MiB region: advised `MADV_NOHUGEPAGE` (see "Huge pages and
    /// the buddy allocator").
    region_nohuge: Box<[AtomicBool]>,
    /// Held while a region's huge-page advice and its flag change.
    thp_advice: Mutex<()>,
    /// Accessed bits, one per `ACCESS_GRANULE_BYTES` of pool, once the
    /// store may evict (see "Accessed bits").
    accessed: OnceLock<Box<[AtomicU64]>>,
    /// How often each key is read, from the same moment on (module
    /// `sketch`: merge eviction keeps the keys read most).
    sketch: OnceLock<crate::sketch::Sketch>,
}

// SAFETY: `base` points into `pool`, which lives as long as `Memory`; all
// access to pool bytes goes through raw pointers whose synchronisation is
// the index's bucket protocol and the epoch table.
unsafe impl Send for Memory {}
// SAFETY: as above; the shared tables are atomics or behind mutexes.
unsafe impl Sync for Memory {}

/// Free SegmentInfo slots: the lowest is handed out first, so the slots in
/// use stay at the bottom of the tables.
struct FreeSlots {
    /// Slots freed since they were first handed out.
    freed: BinaryHeap<Reverse<SegId>>,
    /// Slots `fresh..` were never handed out.
    fresh: SegId,
    /// Slots in all.
    total: SegId,
}

impl FreeSlots {
    /// The lowest free slot: every freed slot is below `fresh`.
    fn pop(&mut self) -> Option<SegId> {
        if let Some(Reverse(id)) = self.freed.pop() {
            return Some(id);
        }
        (self.fresh < self.total).then(|| {
            self.fresh += 1;
            self.fresh - 1
        })
    }
}

/// A chunk of SegmentInfo slots, all free.
fn seg_chunk(slots: usize) -> Box<[SegInfo]> {
    (0..slots)
        .map(|_| SegInfo {
            min_expiry_ms: AtomicU64::new(u64::MAX),
            max_expiry_ms: AtomicU64::new(0),
            meta: Mutex::new(SegMeta {
                state: SegState::Free,
                blocks: Vec::new(),
                used: 0,
                created_tsc: 0,
                closed_at: 0,
                ttl_span_end_ms: 0,
                mixed_backoff_ms: 0,
                second_chance: false,
            }),
        })
        .collect()
}

/// Error from block allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoBlocks;

impl Memory {
    /// Map `pool_bytes` of memory (rounded down to blocks), with
    /// `reserve_blocks` kept for compaction, over `heaps` buddy heaps.
    pub(crate) fn new(pool_bytes: usize, reserve_blocks: u64, heaps: usize) -> io::Result<Memory> {
        let blocks_total = (pool_bytes / BLOCK_BYTES) as u64;
        let pool = FramePool::new(&PoolConfig {
            bytes: blocks_total as usize * BLOCK_BYTES,
            ..Default::default()
        })?;
        let alloc = new_allocator(
            AllocatorKind::Distributed,
            pool.frames(),
            &BuddyConfig {
                heaps: Some(heaps.max(1)),
                check_frees: cfg!(debug_assertions),
                ..Default::default()
            },
        )
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let base = pool.frame_ptr(0).as_ptr();
        let n = blocks_total as usize;
        let segs = (0..n.div_ceil(SEG_CHUNK_SLOTS))
            .map(|_| OnceLock::new())
            .collect();
        let free_segs = Mutex::new(FreeSlots {
            freed: BinaryHeap::new(),
            fresh: 0,
            total: n as SegId,
        });
        Ok(Memory {
            pool,
            base,
            alloc,
            blocks_total,
            reserve_blocks: reserve_blocks.min(blocks_total / 2),
            blocks_in_use: CachePadded::new(AtomicU64::new(0)),
            index_borrowed: Mutex::new(0),
            next_block: (0..n).map(|_| AtomicU32::new(NO_BLOCK)).collect(),
            block_seg: (0..n).map(|_| AtomicU32::new(u32::MAX)).collect(),
            segs,
            live: LiveBytes::new(n, heaps),
            free_segs,
            no_whole_regions: AtomicBool::new(false),
            warm: SegQueue::new(),
            warm_blocks: AtomicU64::new(0),
            warm_released: AtomicU64::new(0),
            blocks_purged: AtomicU64::new(0),
            map_ahead_wanted: AtomicBool::new(false),
            purged_since_append: AtomicBool::new(true),
            blocks_mapped_ahead: AtomicU64::new(0),
            block_state: (0..n).map(|_| AtomicU8::new(block_state::BUDDY)).collect(),
            regions: (0..n.div_ceil(BLOCKS_PER_REGION))
                .map(|_| AtomicU32::new(0))
                .collect(),
            region_nohuge: (0..n.div_ceil(BLOCKS_PER_REGION))
                .map(|_| AtomicBool::new(false))
                .collect(),
            thp_advice: Mutex::new(()),
            accessed: OnceLock::new(),
            sketch: OnceLock::new(),
        })
    }

    /// Map every page of the pool in now (`Config::prefault`): one
    /// `MADV_POPULATE_WRITE` (Linux 5.14+), after the pool's
    /// `MADV_HUGEPAGE`, so the pages are 2 MiB ones; on an older kernel,
    /// a write to each 4 KiB page. Blocks are still counted as before:
    /// this changes residency, not the budget.
    pub(crate) fn prefault(&self) {
        // SAFETY: the whole pool, which no object uses yet (the store is
        // being built): nobody else reads or writes these bytes.
        unsafe { self.populate(0, self.blocks_total as usize * BLOCK_BYTES) };
    }

    /// Map pool bytes `start..start + len` in: one `MADV_POPULATE_WRITE`
    /// (Linux 5.14+), or on an older kernel a write of a zero to each
    /// 4 KiB page. Contents do not change where they were zero already.
    ///
    /// # Safety
    ///
    /// The range lies inside the pool, holds no object, and no other
    /// thread reads or writes it while this runs (the fallback writes
    /// zeros into it).
    unsafe fn populate(&self, start: usize, len: usize) {
        const PAGE_BYTES: usize = 4096;
        // SAFETY: the caller's range lies inside the pool's mapping;
        // populating maps pages in without changing their contents.
        let r = unsafe {
            libc::madvise(
                self.base.add(start) as *mut libc::c_void,
                len,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            for off in (start..start + len).step_by(PAGE_BYTES) {
                // SAFETY: inside the caller's range, which holds no object
                // and which no other thread touches meanwhile.
                unsafe { self.base.add(off).write_volatile(0) };
            }
        }
    }

    /// Bytes of metadata held outside the pool (tables, SegmentInfo).
    pub(crate) fn metadata_bytes(&self) -> u64 {
        let n = self.blocks_total;
        // next_block, block_seg (4 B each), block_state (1 B); regions
        // (4 B) and region_nohuge (1 B).
        n * 9
            + n.div_ceil(BLOCKS_PER_REGION as u64) * 5
            + self.seg_slots() as u64 * core::mem::size_of::<SegInfo>() as u64
            + self.live.bytes()
            + self.alloc.stats().metadata_bytes
            + self.accessed.get().map_or(0, |b| b.len() as u64 * 8)
            + self.sketch.get().map_or(0, |s| s.bytes())
    }

    /// Start keeping accessed bits and the read-frequency sketch (the
    /// store may now evict); idempotent.
    pub(crate) fn track_access(&self) {
        self.sketch.get_or_init(|| {
            crate::sketch::Sketch::for_capacity(self.blocks_total as usize * BLOCK_BYTES)
        });
        self.accessed.get_or_init(|| {
            (0..self.blocks_total as usize * ACCESS_WORDS_PER_BLOCK)
                .map(|_| AtomicU64::new(0))
                .collect()
        });
    }

    /// Whether accessed bits are kept (the store has evicted or may).
    #[inline]
    pub(crate) fn tracks_access(&self) -> bool {
        self.accessed.get().is_some()
    }

    /// The word and bit of the object at pool offset `off`.
    #[inline]
    fn access_bit(bits: &[AtomicU64], off: u64) -> Option<(&AtomicU64, u64)> {
        let g = off as usize / ACCESS_GRANULE_BYTES;
        bits.get(g / 64).map(|w| (w, 1u64 << (g % 64)))
    }

    /// A GET read the object at `off`: set its accessed bit, writing the
    /// line only if the bit is not set yet.
    #[inline]
    pub(crate) fn note_access(&self, off: u64) {
        if let Some((w, m)) = self.accessed.get().and_then(|b| Self::access_bit(b, off)) {
            if w.load(Ordering::Relaxed) & m == 0 {
                w.fetch_or(m, Ordering::Relaxed);
            }
        }
    }

    /// A GET looked up the key with this hash (found or not): count it in
    /// the frequency sketch, once the store may evict.
    #[inline]
    pub(crate) fn note_read(&self, hash: u64) {
        if let Some(s) = self.sketch.get() {
            s.record(hash);
        }
    }

    /// The frequency sketch, once the store may evict.
    #[inline]
    pub(crate) fn sketch(&self) -> Option<&crate::sketch::Sketch> {
        self.sketch.get()
    }

    /// Whether the object at `off` was read since it was written here.
    #[inline]
    pub(crate) fn accessed(&self, off: u64) -> bool {
        self.accessed
            .get()
            .and_then(|b| Self::access_bit(b, off))
            .is_some_and(|(w, m)| w.load(Ordering::Relaxed) & m != 0)
    }

    /// Clear the accessed bits of blocks just taken into a segment.
    fn clear_access(&self, blocks: &[u32]) {
        if let Some(bits) = self.accessed.get() {
            for &b in blocks {
                let from = b as usize * ACCESS_WORDS_PER_BLOCK;
                for w in &bits[from..from + ACCESS_WORDS_PER_BLOCK] {
                    w.store(0, Ordering::Relaxed);
                }
            }
        }
    }

    /// Blocks in the pool.
    pub(crate) fn blocks_total(&self) -> u64 {
        self.blocks_total
    }

    /// Blocks held back for compaction.
    pub(crate) fn reserve_blocks(&self) -> u64 {
        self.reserve_blocks
    }

    /// Blocks allocated to segments.
    pub(crate) fn blocks_in_use(&self) -> u64 {
        self.blocks_in_use.load(Ordering::Relaxed)
    }

    /// Blocks allocated to segments (the budget's use less the index's
    /// borrowed blocks).
    pub(crate) fn segment_blocks_in_use(&self) -> u64 {
        let borrowed = self.index_borrowed.lock();
        self.blocks_in_use()
            .saturating_sub(borrowed.div_ceil(BLOCK_BYTES as u64))
    }

    /// Let the index use `bytes` more than its own share, taken from the
    /// clients' block budget (the index grows rarely: a mutex is enough).
    /// False when the clients' free blocks cannot cover it; the caller
    /// then fails the growth and compaction or eviction must free blocks
    /// first.
    pub(crate) fn borrow_for_index(&self, bytes: u64) -> bool {
        let mut borrowed = self.index_borrowed.lock();
        let block = BLOCK_BYTES as u64;
        let need = (*borrowed + bytes).div_ceil(block) - borrowed.div_ceil(block);
        let limit = self.blocks_total - self.reserve_blocks;
        let mut cur = self.blocks_in_use.load(Ordering::Relaxed);
        loop {
            if cur + need > limit {
                return false;
            }
            match self.blocks_in_use.compare_exchange_weak(
                cur,
                cur + need,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        *borrowed += bytes;
        true
    }

    /// Give back bytes [`Memory::borrow_for_index`] lent (a growth that
    /// was rolled back).
    pub(crate) fn return_from_index(&self, bytes: u64) {
        let mut borrowed = self.index_borrowed.lock();
        let block = BLOCK_BYTES as u64;
        let before = borrowed.div_ceil(block);
        *borrowed = borrowed.saturating_sub(bytes);
        self.blocks_in_use
            .fetch_sub(before - borrowed.div_ceil(block), Ordering::AcqRel);
    }

    /// Blocks clients may still take before hitting the reserve.
    pub(crate) fn client_blocks_free(&self) -> u64 {
        (self.blocks_total - self.reserve_blocks).saturating_sub(self.blocks_in_use())
    }

    /// The live-bytes table.
    #[inline]
    pub(crate) fn live(&self) -> &LiveBytes {
        &self.live
    }

    /// Segment info.
    pub(crate) fn seg(&self, id: SegId) -> &SegInfo {
        let (chunk, slot) = (id as usize / SEG_CHUNK_SLOTS, id as usize % SEG_CHUNK_SLOTS);
        let slots = (self.blocks_total as usize - chunk * SEG_CHUNK_SLOTS).min(SEG_CHUNK_SLOTS);
        &self.segs[chunk].get_or_init(|| seg_chunk(slots))[slot]
    }

    /// Number of segment slots handed out so far: every segment's id is
    /// below it.
    pub(crate) fn seg_slots(&self) -> usize {
        self.free_segs.lock().fresh as usize
    }

    /// Take `n` blocks from the budget (clients may not use the reserve;
    /// compaction may) and from the warm cache, then the buddy allocator.
    fn take_blocks(&self, n: usize, for_compaction: bool) -> Result<Vec<u32>, NoBlocks> {
        let limit = if for_compaction {
            self.blocks_total
        } else {
            self.blocks_total - self.reserve_blocks
        };
        let want = n as u64;
        let mut cur = self.blocks_in_use.load(Ordering::Relaxed);
        loop {
            if cur + want > limit {
                return Err(NoBlocks);
            }
            match self.blocks_in_use.compare_exchange_weak(
                cur,
                cur + want,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        let mut list = Vec::with_capacity(n);
        while list.len() < n {
            // The warm cache first, again after each region taken whole
            // (its spares are there).
            if let Some((b, _)) = self.warm.pop() {
                self.warm_blocks.fetch_sub(1, Ordering::Relaxed);
                self.take_block(b);
                list.push(b);
                continue;
            }
            match self.alloc_fresh_block() {
                Some(b) => {
                    self.take_block(b);
                    list.push(b);
                }
                None => {
                    // The budget says the blocks exist; they may be in flight
                    // between buddy heaps. Give back what we took.
                    self.release_blocks(&list);
                    self.blocks_in_use.fetch_sub(want, Ordering::AcqRel);
                    return Err(NoBlocks);
                }
            }
        }
        Ok(list)
    }

    /// Create a segment of `blocks` blocks in state `Head`. It may grow
    /// later ([`Memory::grow_segment`]) while it is a head.
    pub(crate) fn new_segment(
        &self,
        blocks: usize,
        for_compaction: bool,
    ) -> Result<SegId, NoBlocks> {
        let n = blocks as u64;
        let list = self.take_blocks(blocks, for_compaction)?;
        let popped = self.free_segs.lock().pop();
        let Some(id) = popped else {
            self.release_blocks(&list);
            self.blocks_in_use.fetch_sub(n, Ordering::AcqRel);
            return Err(NoBlocks);
        };
        for (i, &b) in list.iter().enumerate() {
            let next = list.get(i + 1).copied().unwrap_or(NO_BLOCK);
            self.next_block[b as usize].store(next, Ordering::Relaxed);
            self.block_seg[b as usize].store(id, Ordering::Relaxed);
        }
        self.clear_access(&list);
        let info = self.seg(id);
        self.live.reset(id);
        info.min_expiry_ms.store(u64::MAX, Ordering::Relaxed);
        info.max_expiry_ms.store(0, Ordering::Relaxed);
        let mut m = info.meta.lock();
        *m = SegMeta {
            state: SegState::Head,
            blocks: list,
            used: 0,
            created_tsc: topology::rdtsc(),
            closed_at: 0,
            ttl_span_end_ms: 0,
            mixed_backoff_ms: 0,
            second_chance: for_compaction,
        };
        Ok(id)
    }

    /// Append `n` blocks to segment `id`, a head (or a compaction
    /// destination) being filled; returns them. Segments grow a block at a
    /// time as objects arrive instead of taking all their blocks when they
    /// open, so open segments hold no empty blocks the budget counts as in
    /// use: at high utilization that unused space is exactly what
    /// compaction lacks.
    ///
    /// The new blocks are linked into the next-block and block-to-segment
    /// tables before the caller writes an object into them, and objects are
    /// published through the index only after they are written, so a reader
    /// that follows an object across the old last block finds the link.
    pub(crate) fn grow_segment(
        &self,
        id: SegId,
        n: usize,
        for_compaction: bool,
    ) -> Result<Vec<u32>, NoBlocks> {
        let list = self.take_blocks(n, for_compaction)?;
        self.clear_access(&list);
        let mut m = self.seg(id).meta.lock();
        debug_assert_eq!(m.state, SegState::Head, "only an open segment grows");
        let mut prev = m.blocks.last().copied();
        for (i, &b) in list.iter().enumerate() {
            let next = list.get(i + 1).copied().unwrap_or(NO_BLOCK);
            self.next_block[b as usize].store(next, Ordering::Relaxed);
            self.block_seg[b as usize].store(id, Ordering::Relaxed);
            if let Some(p) = prev.take() {
                self.next_block[p as usize].store(b, Ordering::Release);
            }
        }
        m.blocks.extend_from_slice(&list);
        Ok(list)
    }

    /// A block from the buddy allocator, for a caller that found the warm
    /// cache empty: the first block of a whole region when one is free
    /// (its other blocks go to the warm cache as spares, see "Never-used
    /// blocks"), else a single block.
    fn alloc_fresh_block(&self) -> Option<u32> {
        if let Some(first) = self.take_whole_region() {
            self.push_spares(first + 1..first + BLOCKS_PER_REGION);
            return Some(first as u32);
        }
        let b = self
            .alloc
            .alloc(BLOCK_ORDER)
            .ok()
            .map(|f| (f >> BLOCK_ORDER) as u32)?;
        // The buddy allocator may hold other blocks of its region.
        self.forbid_huge(b as usize / BLOCKS_PER_REGION);
        Some(b)
    }

    /// A whole free region from the buddy allocator, split into blocks,
    /// its huge-page advice lifted (every block of it is the memory
    /// layer's now); returns its first block. `None` when the allocator
    /// has no whole region free, and then no more tries until the idle
    /// release gives blocks back (a failed take costs its slow path).
    fn take_whole_region(&self) -> Option<usize> {
        if self.no_whole_regions.load(Ordering::Relaxed) {
            return None;
        }
        let Ok(f) = self.alloc.alloc(REGION_ORDER) else {
            self.no_whole_regions.store(true, Ordering::Relaxed);
            return None;
        };
        self.alloc
            .split(f, REGION_ORDER, BLOCK_ORDER)
            .expect("splitting a region this store allocated");
        let first = (f >> BLOCK_ORDER) as usize;
        self.allow_huge(first / BLOCKS_PER_REGION);
        Some(first)
    }

    /// Put never-used blocks of a region just taken whole in the warm
    /// cache (spares, see "Never-used blocks").
    fn push_spares(&self, blocks: core::ops::Range<usize>) {
        let now = now_ms();
        // Counted before they are pushed, so a popper's decrement never
        // takes the count below zero.
        self.warm_blocks
            .fetch_add(blocks.len() as u64, Ordering::Relaxed);
        for b in blocks {
            self.block_state[b].store(block_state::WARM, Ordering::Release);
            self.warm.push((b as u32, now));
        }
    }

    /// Mark block `b`, just taken from the warm cache or the buddy
    /// allocator, as in use. Waits while its region is being released, so
    /// the caller's writes come after the release's `MADV_DONTNEED`.
    fn take_block(&self, b: u32) {
        let region = &self.regions[b as usize / BLOCKS_PER_REGION];
        let mut cur = region.load(Ordering::Acquire);
        loop {
            if cur & REGION_RELEASING != 0 {
                std::hint::spin_loop();
                cur = region.load(Ordering::Acquire);
                continue;
            }
            match region.compare_exchange_weak(
                cur,
                (cur + 1) | REGION_RESIDENT,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        let was = self.block_state[b as usize].swap(block_state::TAKEN, Ordering::AcqRel);
        if was == block_state::WARM_RELEASED {
            self.warm_released.fetch_sub(1, Ordering::Relaxed);
        }
        if cur & REGION_RESIDENT == 0 {
            // The first block taken since the region was released: its
            // first write may fault the whole huge page in, so the
            // region's released warm blocks count as resident again (see
            // "Huge pages and the buddy allocator"). No release of the
            // region can run now (its taken count is not 0).
            let first = b as usize / BLOCKS_PER_REGION * BLOCKS_PER_REGION;
            let end = (first + BLOCKS_PER_REGION).min(self.blocks_total as usize);
            let n = self.move_states(first..end, block_state::WARM_RELEASED, block_state::WARM);
            self.warm_released.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Move every block of `blocks` that is in state `from` to `to`;
    /// returns how many moved.
    pub(crate) fn move_states(&self, blocks: core::ops::Range<usize>, from: u8, to: u8) -> u64 {
        let mut n = 0;
        for s in &self.block_state[blocks] {
            if s.compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                n += 1;
            }
        }
        n
    }

    /// Put free blocks in the warm cache (they stay resident for now).
    fn release_blocks(&self, blocks: &[u32]) {
        let now = now_ms();
        // Counted before they are pushed: a thread may pop a block (and
        // decrement) as soon as it is in the queue, and a count that
        // wrapped below zero would make `purge_cold_regions`, which loops
        // over the count, cycle the queue practically forever.
        self.warm_blocks
            .fetch_add(blocks.len() as u64, Ordering::Relaxed);
        for &b in blocks {
            self.block_state[b as usize].store(block_state::WARM, Ordering::Release);
            let was = self.regions[b as usize / BLOCKS_PER_REGION].fetch_sub(1, Ordering::AcqRel);
            debug_assert!(was & REGION_TAKEN_MASK > 0, "block {b} freed twice");
            self.warm.push((b, now));
        }
    }

    /// Free a retired segment's blocks and slot. The caller guarantees the
    /// epoch has passed.
    pub(crate) fn free_segment(&self, id: SegId) {
        let blocks = {
            let mut m = self.seg(id).meta.lock();
            m.state = SegState::Free;
            m.used = 0;
            std::mem::take(&mut m.blocks)
        };
        self.release_blocks(&blocks);
        self.blocks_in_use
            .fetch_sub(blocks.len() as u64, Ordering::AcqRel);
        self.free_segs.lock().freed.push(Reverse(id));
    }

    /// Pool offset of byte `off` of a segment with these blocks.
    #[inline]
    pub(crate) fn seg_offset(blocks: &[u32], off: usize) -> u64 {
        ((blocks[off >> BLOCK_SHIFT] as u64) << BLOCK_SHIFT) | (off & (BLOCK_BYTES - 1)) as u64
    }

    /// The segment holding pool offset `pool_off`.
    #[inline]
    pub(crate) fn seg_of(&self, pool_off: u64) -> SegId {
        self.block_seg[(pool_off >> BLOCK_SHIFT) as usize].load(Ordering::Relaxed)
    }

    /// Pointer to the `n` bytes at pool offset `off`, which lie in one
    /// block (`n` is at most what is left of `off`'s block).
    ///
    /// # Panics
    /// If `off` is beyond the pool. Offsets come from the index, from a
    /// segment's block list or from the next-block table, all of which
    /// hold only this pool's blocks, so this never fires; it keeps a logic
    /// error from becoming an out-of-bounds access (one compare per block
    /// a copy touches).
    #[inline(always)]
    fn block_ptr(&self, off: u64, n: usize) -> *mut u8 {
        assert!(
            off >> BLOCK_SHIFT < self.blocks_total,
            "pool offset {off:#x} is beyond the pool"
        );
        // Every caller computes `n` as at most the room left in the block.
        debug_assert!((off as usize & (BLOCK_BYTES - 1)) + n <= BLOCK_BYTES);
        // SAFETY: `off` is below the pool's length (asserted), so the
        // result points into the pool's mapping, which lives as long as
        // `self`.
        unsafe { self.base.add(off as usize) }
    }

    /// The block after the block of `off` in its segment, as a pool
    /// offset; `None` at the segment's end.
    #[inline(always)]
    fn next_block_off(&self, off: u64) -> Option<u64> {
        let b = self.next_block[(off >> BLOCK_SHIFT) as usize].load(Ordering::Relaxed);
        (b != NO_BLOCK).then_some((b as u64) << BLOCK_SHIFT)
    }

    /// Copy `dst.len()` bytes starting at pool offset `off`, following the
    /// segment's blocks. Returns false if the walk left the segment (only
    /// possible on a torn read; the caller retries).
    ///
    /// The source bytes may be written concurrently (a Nibble-2 overwrite
    /// under a bucket lock): the copy is through raw pointers, never a
    /// reference, and the caller's seqlock validation discards what it
    /// read if a writer was there.
    #[inline(always)]
    pub(crate) fn read(&self, off: u64, dst: &mut [u8]) -> bool {
        // The usual case, all of `dst` in `off`'s block: one copy (of a
        // constant length where the caller's is, as a header prefix's).
        if dst.len() <= BLOCK_BYTES - (off as usize & (BLOCK_BYTES - 1)) {
            let src = self.block_ptr(off, dst.len());
            // SAFETY: `src .. src + dst.len()` lies inside one block of the
            // pool (`block_ptr`, the test above); a local buffer cannot
            // overlap the pool.
            unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
            return true;
        }
        self.read_across(off, dst)
    }

    /// [`Memory::read`] of bytes that continue in the segment's next
    /// block(s).
    #[inline(never)]
    fn read_across(&self, mut off: u64, dst: &mut [u8]) -> bool {
        let mut done = 0;
        while done < dst.len() {
            let in_block = BLOCK_BYTES - (off as usize & (BLOCK_BYTES - 1));
            let n = in_block.min(dst.len() - done);
            let src = self.block_ptr(off, n);
            // SAFETY: `src .. src + n` lies inside one block of the pool
            // (`block_ptr`); `dst[done .. done + n]` is in bounds
            // (`n <= dst.len() - done`); a local buffer cannot overlap the
            // pool.
            unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr().add(done), n) };
            done += n;
            if done < dst.len() {
                match self.next_block_off(off) {
                    Some(o) => off = o,
                    None => return false,
                }
            } else {
                off += n as u64;
            }
        }
        true
    }

    /// Write `src` at pool offset `off`, following the segment's blocks.
    ///
    /// # Safety
    /// The caller has exclusive write access to these bytes for the
    /// duration of the call: they are space it reserved in a head (or
    /// compaction destination) it holds, or part of a published object
    /// whose index buckets it has locked. No other thread writes them
    /// meanwhile (readers may read them: see [`Memory::read`]). The
    /// segment's blocks must reach `off + src.len()` (set up before its
    /// first write).
    #[inline(always)]
    pub(crate) unsafe fn write(&self, off: u64, src: &[u8]) {
        // The usual case, all of `src` in `off`'s block: one copy.
        if src.len() <= BLOCK_BYTES - (off as usize & (BLOCK_BYTES - 1)) {
            let dst = self.block_ptr(off, src.len());
            // SAFETY: `dst .. dst + src.len()` lies inside one block of
            // the pool (`block_ptr`, the test above), and the caller has
            // exclusive write access to these pool bytes (this function's
            // contract); a caller's slice is not pool memory.
            unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
            return;
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.write_across(off, src) }
    }

    /// [`Memory::write`] of bytes that continue in the segment's next
    /// block(s).
    ///
    /// # Safety
    /// As [`Memory::write`].
    #[inline(never)]
    unsafe fn write_across(&self, mut off: u64, src: &[u8]) {
        let mut done = 0;
        while done < src.len() {
            let in_block = BLOCK_BYTES - (off as usize & (BLOCK_BYTES - 1));
            let n = in_block.min(src.len() - done);
            let dst = self.block_ptr(off, n);
            // SAFETY: `dst .. dst + n` lies inside one block of the pool
            // (`block_ptr`), `src[done .. done + n]` is in bounds, and the
            // caller has exclusive write access to the pool bytes (this
            // function's contract); a caller's slice is not pool memory.
            unsafe { ptr::copy_nonoverlapping(src.as_ptr().add(done), dst, n) };
            done += n;
            if done < src.len() {
                let next = self.next_block_off(off);
                debug_assert!(next.is_some(), "write past the end of a segment");
                let Some(o) = next else { return };
                off = o;
            }
        }
    }

    /// Copy `len` bytes of an object at pool offset `src` to pool offset
    /// `dst` in another segment, following both segments' blocks (for
    /// compaction; no bounce buffer). Returns false if the walk left the
    /// source segment (a torn header; the caller keeps it).
    ///
    /// # Safety
    /// As [`Memory::write`] for the destination bytes (compaction's own
    /// open segment); the source is an object whose bucket lock the caller
    /// holds, in another segment, so the ranges do not overlap.
    #[inline]
    pub(crate) unsafe fn copy(&self, mut src: u64, mut dst: u64, len: usize) -> bool {
        let mut done = 0;
        while done < len {
            let src_room = BLOCK_BYTES - (src as usize & (BLOCK_BYTES - 1));
            let dst_room = BLOCK_BYTES - (dst as usize & (BLOCK_BYTES - 1));
            let n = src_room.min(dst_room).min(len - done);
            let (from, to) = (self.block_ptr(src, n), self.block_ptr(dst, n));
            // SAFETY: both ranges lie inside one block each of the pool
            // (`block_ptr`). They belong to different segments, so they
            // do not overlap, and the caller has exclusive write access to
            // the destination (this function's contract).
            unsafe { ptr::copy_nonoverlapping(from, to, n) };
            done += n;
            if done < len {
                if n == src_room {
                    match self.next_block_off(src) {
                        Some(o) => src = o,
                        None => return false,
                    }
                } else {
                    src += n as u64;
                }
                if n == dst_room {
                    let next = self.next_block_off(dst);
                    debug_assert!(next.is_some(), "copy past the end of a segment");
                    let Some(o) = next else { return false };
                    dst = o;
                } else {
                    dst += n as u64;
                }
            }
        }
        true
    }

    /// Hint the CPU to load the cache lines of `off .. off + len`, cut at
    /// the end of `off`'s block (the next block of a segment is elsewhere
    /// in the pool), for an upcoming read.
    #[inline]
    pub(crate) fn prefetch(&self, off: u64, len: usize) {
        self.prefetch_lines(off, len, crate::prefetch::line);
    }

    /// Like [`Memory::prefetch`], for bytes about to be written.
    #[inline]
    pub(crate) fn prefetch_for_write(&self, off: u64, len: usize) {
        self.prefetch_lines(off, len, crate::prefetch::line_for_write);
    }

    #[inline(always)]
    fn prefetch_lines(&self, off: u64, len: usize, each: fn(*const u8)) {
        const LINE_BYTES: usize = 64;
        let in_block = BLOCK_BYTES - (off as usize & (BLOCK_BYTES - 1));
        let mut at = off as usize & !(LINE_BYTES - 1);
        let end = off as usize + len.min(in_block);
        // Four lines a turn (a 1 KiB value is 17 lines: half the loop's
        // compares and branches), then the rest one by one.
        while at + 3 * LINE_BYTES < end {
            each(self.base.wrapping_add(at));
            each(self.base.wrapping_add(at + LINE_BYTES));
            each(self.base.wrapping_add(at + 2 * LINE_BYTES));
            each(self.base.wrapping_add(at + 3 * LINE_BYTES));
            at += 4 * LINE_BYTES;
        }
        while at < end {
            each(self.base.wrapping_add(at));
            at += LINE_BYTES;
        }
    }

    /// Read the header at pool offset `off`.
    #[inline]
    pub(crate) fn header(&self, off: u64) -> Option<Header> {
        let mut b = [0u8; HEADER_MIN_BYTES];
        if !self.read(off, &mut b) {
            return None;
        }
        let (mut h, slots) = Header::decode_base(&b);
        if slots > 0 {
            let mut ext = [0u8; HEADER_MAX_BYTES - HEADER_MIN_BYTES];
            let ext = &mut ext[..slots];
            if !self.read_part(off, HEADER_MIN_BYTES, ext) {
                return None;
            }
            h.decode_slots(ext);
        }
        Some(h)
    }

    /// Write the header `h` at the start of the object at `off`.
    ///
    /// # Safety
    /// As [`Memory::write`], for the header's bytes.
    #[inline]
    pub(crate) unsafe fn write_header(&self, off: u64, h: &Header) {
        // SAFETY: the caller's contract covers the header's bytes.
        unsafe { self.write(off, h.encode().as_bytes()) }
    }

    /// Pool offset `n` bytes past `off` within the segment; `None` if that
    /// is at or past the segment's end.
    #[inline]
    pub(crate) fn advance(&self, mut off: u64, mut n: usize) -> Option<u64> {
        loop {
            let in_block = BLOCK_BYTES - (off as usize & (BLOCK_BYTES - 1));
            if n < in_block {
                return Some(off + n as u64);
            }
            n -= in_block;
            off = self.next_block_off(off)?;
        }
    }

    /// Copy `dst.len()` bytes starting `skip` bytes into the object at `off`.
    #[inline]
    pub(crate) fn read_part(&self, off: u64, skip: usize, dst: &mut [u8]) -> bool {
        if dst.is_empty() {
            return true;
        }
        match self.advance(off, skip) {
            Some(o) => self.read(o, dst),
            None => false,
        }
    }

    /// Write `src` starting `skip` bytes into the object at `off`.
    ///
    /// # Safety
    /// As [`Memory::write`], for the bytes `skip .. skip + src.len()` of
    /// the object.
    #[inline]
    pub(crate) unsafe fn write_part(&self, off: u64, skip: usize, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        if let Some(o) = self.advance(off, skip) {
            // SAFETY: the caller's contract covers these bytes.
            unsafe { self.write(o, src) };
        }
    }

    /// Mark the object at `off` dead ([`crate::object::DEAD_MARK`]).
    ///
    /// # Safety
    /// The caller holds the object's bucket lock, has just unlinked it
    /// from the index and holds an epoch guard: it is the only writer of
    /// the object's bytes (as [`Memory::write`]).
    #[inline]
    pub(crate) unsafe fn mark_dead(&self, off: u64) {
        // SAFETY: the caller's contract covers the object's version bytes.
        unsafe {
            self.write_part(
                off,
                crate::object::VERSION_OFFSET,
                &crate::object::DEAD_MARK,
            )
        }
    }

    /// Compare the key of the object at `off` with `key`.
    #[inline]
    pub(crate) fn key_equals(&self, off: u64, key: &[u8]) -> bool {
        // The length first: a stored key that merely starts with `key` is
        // another key.
        match self.header(off) {
            Some(h) if h.key_len as usize == key.len() => self.key_bytes_equal(off, &h, key),
            _ => false,
        }
    }

    /// Compare the key bytes of the object at `off` (whose header is `h`)
    /// with `key`, for a caller that has already checked the key length.
    #[inline]
    pub(crate) fn key_bytes_equal(&self, off: u64, h: &Header, key: &[u8]) -> bool {
        const CHUNK_BYTES: usize = 256;
        let mut buf = [0u8; CHUNK_BYTES];
        let mut skip = h.header_bytes();
        for chunk in key.chunks(CHUNK_BYTES) {
            let dst = &mut buf[..chunk.len()];
            if !self.read_part(off, skip, dst) || dst != chunk {
                return false;
            }
            skip += chunk.len();
        }
        true
    }

    /// The pool itself (for RSS checks and tests).
    pub(crate) fn pool(&self) -> &FramePool {
        &self.pool
    }
}

/// `Loc` of a pool offset.
#[inline]
pub(crate) fn loc_of(pool_off: u64) -> Loc {
    pool_off + 1
}

/// Pool offset of a `Loc`.
#[inline]
pub(crate) fn off_of(loc: Loc) -> u64 {
    loc - 1
}
