//! Statistics and maintenance: [`Stats`], the compaction counters, and
//! the calls tools and tests use to force compaction or give memory back
//! (`compact_now`, `release_memory`, the store's `malloc_trim`).
use super::*;

/// Compaction counters.
#[derive(Default)]
pub(crate) struct CompactionCounters {
    /// Passes run.
    pub passes: AtomicU64,
    /// Segments compacted away.
    pub segments_compacted: AtomicU64,
    /// Bytes copied.
    pub bytes_relocated: AtomicU64,
    /// Expired objects dropped.
    pub expired_reclaimed: AtomicU64,
    /// Dead objects passed over by their mark, without an index probe.
    pub dead_skipped: AtomicU64,
    /// Live objects evicted (cache mode).
    pub evicted: AtomicU64,
    /// Bytes of the evicted objects.
    pub evicted_bytes: AtomicU64,
    /// Eviction passes that freed segments.
    pub eviction_passes: AtomicU64,
    /// Writes that found the log full and waited for space.
    pub write_waits: AtomicU64,
    /// Time those writes waited, microseconds in all.
    pub write_wait_us: AtomicU64,
    /// Expired objects dropped that no GET had read (counted while
    /// accessed bits are kept, i.e. once the store may evict).
    pub expired_unfetched: AtomicU64,
    /// Blocks of retired segments not freed yet (the epoch has not
    /// passed them): free space on its way, which eviction counts so as
    /// not to evict again while it waits (see `Inner::space_short`).
    pub retiring_blocks: AtomicU64,
    /// Retired segments freed (their blocks back to the allocator).
    pub segments_freed: AtomicU64,
    /// Segments the expiry pass retired whole: every object expired (or
    /// dead), nothing relocated.
    pub expired_segments: AtomicU64,
    /// Bytes of segments the expiry pass read (the whole-segment frees
    /// and the unlinking of expired objects from mixed segments).
    pub expiry_bytes_read: AtomicU64,
    /// Mixed segments (unexpired objects beside expired ones) whose
    /// expired objects the expiry pass unlinked in place.
    pub expiry_mixed_scans: AtomicU64,
    /// `segments_freed + 1` when a write was last refused for want of
    /// log space (0: none, or a delete since): until another segment is
    /// freed or an item deleted, the next write is refused at once (see
    /// `Inner::known_full`).
    pub refused_at: AtomicU64,
}

/// A statistics snapshot.
#[derive(Clone, Debug)]
pub struct Stats {
    /// Mode.
    pub mode: Mode,
    /// Epoch scheme name.
    pub epoch: &'static str,
    /// Configured capacity.
    pub capacity_bytes: u64,
    /// Bytes of the block pool.
    pub pool_bytes: u64,
    /// Index bytes in use (touched buckets).
    pub index_bytes: u64,
    /// The index's own budget (its share of capacity).
    pub index_budget_bytes: u64,
    /// Index bytes past its own budget, borrowed from the log's blocks
    /// (counted in `index_bytes`, not in `blocks_in_use`).
    pub index_borrowed_bytes: u64,
    /// Metadata outside pool and index.
    pub metadata_bytes: u64,
    /// Live object bytes (headers, keys, values).
    pub live_bytes: u64,
    /// Items in the index.
    pub items: u64,
    /// Blocks in the pool / in use / reserved for compaction.
    pub blocks_total: u64,
    /// Blocks in segments.
    pub blocks_in_use: u64,
    /// Free blocks still resident (reused before any fresh block).
    pub blocks_free_resident: u64,
    /// Blocks given back to the OS so far.
    pub blocks_released: u64,
    /// Blocks a compaction worker mapped in ahead of the log so far
    /// (`Config::map_ahead`).
    pub blocks_mapped_ahead: u64,
    /// Compaction reserve.
    pub reserve_blocks: u64,
    /// Segment size in bytes.
    pub segment_bytes: u64,
    /// Segments that are heads, closed, retired.
    pub segments_head: u64,
    /// Closed segments.
    pub segments_closed: u64,
    /// Retired segments waiting for the epoch.
    pub segments_retired: u64,
    /// Compaction passes.
    pub compaction_passes: u64,
    /// Segments compacted.
    pub segments_compacted: u64,
    /// Bytes relocated by compaction.
    pub bytes_relocated: u64,
    /// Expired objects reclaimed by compaction.
    pub expired_reclaimed: u64,
    /// Dead objects compaction passed over by their dead mark (no index
    /// probe).
    pub dead_skipped: u64,
    /// Live items evicted (cache mode; never under `NoEviction`).
    pub evicted_items: u64,
    /// Bytes of the evicted items.
    pub evicted_bytes: u64,
    /// Eviction passes that freed segments.
    pub eviction_passes: u64,
    /// Writes that found the log full and waited for compaction or
    /// eviction to free space.
    pub write_waits: u64,
    /// Time those writes waited, microseconds in all.
    pub write_wait_us: u64,
    /// Expired objects reclaimed that no GET had read (memcached's
    /// `expired_unfetched`; counted once the store may evict, 0 before).
    pub expired_unfetched: u64,
    /// Segments the expiry pass freed whole (every object expired).
    pub expired_segments: u64,
    /// Bytes of segments the expiry pass read to unlink expired objects.
    pub expiry_bytes_read: u64,
    /// Mixed segments the expiry pass read to unlink expired objects
    /// beside unexpired ones.
    pub expiry_mixed_scans: u64,
    /// Index figures.
    pub index: IndexStats,
}

impl Store {
    /// Run compaction now, regardless of free space, until a pass makes no
    /// progress or `timeout` passes. Closes all heads first so everything
    /// is a candidate. For tests and tools.
    pub fn compact_now(&self, timeout: Duration) {
        let inner = &*self.inner;
        for log in &inner.logs {
            log.close_all(&inner.mem, &inner.epochs);
        }
        inner.force_compaction.store(true, Ordering::Release);
        let start = std::time::Instant::now();
        // Run every worker's steps here until none of them has anything
        // left.
        while start.elapsed() < timeout {
            let busy = step_every_worker(inner);
            if !busy && self.stats().segments_retired == 0 {
                break;
            }
            if !busy {
                inner.wait_space(Duration::from_millis(1));
            }
        }
        inner.force_compaction.store(false, Ordering::Release);
    }

    /// Wait until the background workers have finished what the last
    /// operations left them: evictions are asynchronous (a write that
    /// takes free space below the trigger wakes a worker, which evicts
    /// after the write returned), so until this returns `true` a GET may
    /// still find an item that `stats().evicted_items` is about to count,
    /// or miss one it has not counted yet. Runs every worker's step on the
    /// calling thread (waiting for one a worker is in the middle of) until
    /// none has anything to do, without forcing compaction as
    /// [`Store::compact_now`] does; `false` if `timeout` passed first. For
    /// tests and tools that compare the store's contents with its
    /// statistics.
    pub fn quiesce(&self, timeout: Duration) -> bool {
        let inner = &*self.inner;
        let start = std::time::Instant::now();
        while start.elapsed() < timeout {
            let busy = step_every_worker(inner);
            if !busy {
                return true;
            }
            inner.wait_space(Duration::from_millis(1));
        }
        false
    }

    /// Give every free block back to the OS now (`MADV_DONTNEED`), instead
    /// of after the decay time; returns the bytes released. Combined with
    /// [`Store::compact_now`] this is the store's `malloc_trim`.
    pub fn release_memory(&self) -> u64 {
        self.inner.mem.purge_all() * BLOCK_BYTES as u64
    }

    /// Run the bulk-expiry pass now on the calling thread (the workers
    /// run it by themselves at least every 100 ms): segments whose objects
    /// have all expired are freed whole, expired objects of mixed segments
    /// unlinked (module `compaction::expire`). For tests and tools.
    pub fn expire_now(&self) {
        crate::compaction::expire_now(&self.inner);
    }

    /// A statistics snapshot.
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let (mut head, mut closed, mut retired, mut live) = (0, 0, 0, 0);
        for i in 0..mem.seg_slots() as u32 {
            let s = mem.seg(i);
            let st = s.meta.lock().state;
            match st {
                SegState::Head => head += 1,
                SegState::Closed => closed += 1,
                SegState::Retired => retired += 1,
                SegState::Free => continue,
            }
            live += mem.live().get(i);
        }
        let c = &inner.stats;
        Stats {
            mode: inner.cfg.mode,
            epoch: inner.epochs.name(),
            capacity_bytes: inner.cfg.capacity_bytes as u64,
            pool_bytes: mem.pool().bytes() as u64,
            index_bytes: inner.index.memory_bytes(),
            index_budget_bytes: inner.index_budget as u64,
            index_borrowed_bytes: inner.index.borrowed_bytes(),
            metadata_bytes: mem.metadata_bytes(),
            live_bytes: live,
            items: inner.index.len(),
            blocks_total: mem.blocks_total(),
            blocks_in_use: mem.segment_blocks_in_use(),
            blocks_free_resident: mem.warm_blocks(),
            blocks_released: mem.blocks_purged(),
            blocks_mapped_ahead: mem.blocks_mapped_ahead(),
            reserve_blocks: mem.reserve_blocks(),
            segment_bytes: (inner.segment_blocks * BLOCK_BYTES) as u64,
            segments_head: head,
            segments_closed: closed,
            segments_retired: retired,
            compaction_passes: c.passes.load(Ordering::Relaxed),
            segments_compacted: c.segments_compacted.load(Ordering::Relaxed),
            bytes_relocated: c.bytes_relocated.load(Ordering::Relaxed),
            expired_reclaimed: c.expired_reclaimed.load(Ordering::Relaxed),
            dead_skipped: c.dead_skipped.load(Ordering::Relaxed),
            evicted_items: c.evicted.load(Ordering::Relaxed),
            evicted_bytes: c.evicted_bytes.load(Ordering::Relaxed),
            eviction_passes: c.eviction_passes.load(Ordering::Relaxed),
            write_waits: c.write_waits.load(Ordering::Relaxed),
            write_wait_us: c.write_wait_us.load(Ordering::Relaxed),
            expired_unfetched: c.expired_unfetched.load(Ordering::Relaxed),
            expired_segments: c.expired_segments.load(Ordering::Relaxed),
            expiry_bytes_read: c.expiry_bytes_read.load(Ordering::Relaxed),
            expiry_mixed_scans: c.expiry_mixed_scans.load(Ordering::Relaxed),
            index: inner.index.stats(),
        }
    }
}

/// One step of every compaction worker, on the calling thread; whether any
/// of them found work. All of them, every time: with several workers, one
/// finding nothing says nothing about the others' candidates.
fn step_every_worker(inner: &Inner) -> bool {
    let mut busy = false;
    for (node, workers) in inner.workers.iter().enumerate() {
        for worker in 0..workers.len() {
            busy |= crate::compaction::step_now(inner, node, worker);
        }
    }
    busy
}
