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
        // left: with several workers, one finding nothing says nothing
        // about the others' candidates.
        while start.elapsed() < timeout {
            let mut busy = false;
            for (node, workers) in inner.workers.iter().enumerate() {
                for worker in 0..workers.len() {
                    busy |= crate::compaction::step_now(inner, node, worker);
                }
            }
            if !busy && self.stats().segments_retired == 0 {
                break;
            }
            if !busy {
                inner.wait_space(Duration::from_millis(1));
            }
        }
        inner.force_compaction.store(false, Ordering::Release);
    }

    /// Give every free block back to the OS now (`MADV_DONTNEED`), instead
    /// of after the decay time; returns the bytes released. Combined with
    /// [`Store::compact_now`] this is the store's `malloc_trim`.
    pub fn release_memory(&self) -> u64 {
        self.inner.mem.purge_all() * BLOCK_BYTES as u64
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
            index: inner.index.stats(),
        }
    }
}
