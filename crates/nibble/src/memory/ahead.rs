//! Mapping memory in ahead of the log (see "Mapping memory in" in
//! `memory.rs`).
//!
//! A log head that finds the warm cache empty takes a fresh region from
//! the buddy allocator, and its first write faults the region's 2 MiB
//! huge page in: the kernel zeroes 2 MiB inside that client's request
//! (on a virtual machine that hands freed memory back to its host, the
//! host maps the page in again too: milliseconds). That happens whenever
//! the log grows past the resident memory, most of all in the first
//! burst after an idle release (`purge_all`) gave every free block back.
//!
//! So a client whose append took blocks while the warm cache held fewer
//! than [`MAP_AHEAD_LOW_WATER_BLOCKS`] resident blocks, or whose append
//! is the first since an idle release (or since the store was created)
//! that fit in its head and found the warm cache low, raises a request
//! (one flag) and wakes the compaction workers; the first worker to see
//! it takes a whole free region from the buddy allocator, faults its huge
//! page in (`MADV_POPULATE_WRITE`) and puts its blocks in the warm cache,
//! where the next heads find them resident. The client that raised the
//! request does not wait. At most one region is mapped per request, and a
//! request is raised only while clients append, so a store that is
//! quiet maps nothing and the decay-time and idle releases give such a
//! region back like any other warm memory: resident memory exceeds what
//! the log itself would have faulted in by at most one region. The
//! jemalloc analogue is its background thread's purging; the original
//! Nibble has none of this, since it populates its whole log at start
//! (`Config::prefault`).

use super::*;

/// Resident warm blocks below which a client that takes blocks asks for
/// the next region to be mapped in ahead of it: half a region (1 MiB).
pub(crate) const MAP_AHEAD_LOW_WATER_BLOCKS: u64 = BLOCKS_PER_REGION as u64 / 2;

impl Memory {
    /// For a client after each append (`took_blocks`: it took blocks from
    /// the memory layer): whether a request to map a region ahead was
    /// raised now (the caller then wakes a worker). Raised when the
    /// append took blocks and the warm cache is low, or when it is the
    /// first append that took none since the idle release gave the warm
    /// cache back (or since the store was created) and the warm cache is
    /// low: the burst that follows will need fresh memory soon, and its
    /// head still has room for a while. Cheap when nothing is needed: one
    /// relaxed load of a flag that changes once per idle period.
    pub(crate) fn request_map_ahead(&self, took_blocks: bool) -> bool {
        if !took_blocks
            && (!self.purged_since_append.load(Ordering::Relaxed)
                || !self.purged_since_append.swap(false, Ordering::Relaxed))
        {
            return false;
        }
        if self.warm_blocks() >= MAP_AHEAD_LOW_WATER_BLOCKS
            || self.no_whole_regions.load(Ordering::Relaxed)
            || self.map_ahead_wanted.load(Ordering::Relaxed)
        {
            return false;
        }
        !self.map_ahead_wanted.swap(true, Ordering::AcqRel)
    }

    /// For a compaction worker: serve a raised request, if any, by taking
    /// a whole free region from the buddy allocator, faulting its huge
    /// page in and putting its blocks in the warm cache. Returns whether
    /// a region was mapped.
    pub(crate) fn map_ahead(&self) -> bool {
        // A load first: every worker step asks, and requests are rare.
        if !self.map_ahead_wanted.load(Ordering::Relaxed)
            || !self.map_ahead_wanted.swap(false, Ordering::AcqRel)
            || self.warm_blocks() >= MAP_AHEAD_LOW_WATER_BLOCKS
        {
            return false;
        }
        let Some(first) = self.take_whole_region() else {
            return false;
        };
        // SAFETY: the region lies inside the pool, and this thread owns
        // all of its blocks: the buddy allocator handed it over whole, and
        // no block of it is in a segment or in the warm cache yet, so no
        // other thread reads or writes these bytes (a reader's stale
        // location never points into a block the buddy allocator held:
        // blocks reach it only after the epoch passed their segment).
        unsafe { self.populate(first << BLOCK_SHIFT, REGION_BYTES) };
        // Resident with no block taken: the decay-time release may give
        // the region back if nobody takes from it in time.
        self.regions[first / BLOCKS_PER_REGION].fetch_or(REGION_RESIDENT, Ordering::AcqRel);
        self.push_spares(first..first + BLOCKS_PER_REGION);
        self.blocks_mapped_ahead
            .fetch_add(BLOCKS_PER_REGION as u64, Ordering::Relaxed);
        true
    }

    /// Blocks mapped in ahead of the log so far.
    pub(crate) fn blocks_mapped_ahead(&self) -> u64 {
        self.blocks_mapped_ahead.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::release::tests::resident_blocks;
    use super::*;

    /// A request raised once the warm cache runs low is served by one
    /// region, faulted in whole, whose blocks the next segments take
    /// before any fresh memory; without a request nothing is mapped.
    #[test]
    fn a_request_maps_one_resident_region_the_next_segments_take() {
        let mem = Memory::new(4 * REGION_BYTES, 0, 1).unwrap();
        assert!(!mem.map_ahead(), "mapped without a request");
        assert_eq!(mem.blocks_mapped_ahead(), 0);
        assert!(mem.request_map_ahead(true));
        assert!(!mem.request_map_ahead(true), "a request raised twice");
        assert!(mem.map_ahead());
        assert!(!mem.map_ahead(), "one request mapped two regions");
        assert_eq!(mem.warm_blocks(), BLOCKS_PER_REGION as u64);
        assert_eq!(mem.blocks_mapped_ahead(), BLOCKS_PER_REGION as u64);
        let mapped: Vec<usize> = (0..4)
            .filter(|&r| resident_blocks(&mem, r) == BLOCKS_PER_REGION)
            .collect();
        assert_eq!(mapped.len(), 1, "one region resident: {mapped:?}");
        // Warm: no request while half a region is resident.
        assert!(!mem.request_map_ahead(true));
        let segs: Vec<SegId> = (0..BLOCKS_PER_REGION)
            .map(|_| mem.new_segment(1, false).unwrap())
            .collect();
        for &s in &segs {
            let b = mem.seg(s).meta.lock().blocks[0] as usize;
            assert_eq!(
                b / BLOCKS_PER_REGION,
                mapped[0],
                "block {b} not mapped ahead"
            );
        }
        assert_eq!(mem.warm_blocks(), 0);
        for r in (0..4).filter(|&r| r != mapped[0]) {
            assert_eq!(resident_blocks(&mem, r), 0, "region {r} faulted in");
        }
        for s in segs {
            mem.free_segment(s);
        }
        assert_eq!(mem.blocks_in_use(), 0);
    }

    /// A region mapped ahead that nobody took from goes back to the OS
    /// with the decay-time release, and the idle release returns its
    /// blocks to the buddy allocator.
    #[test]
    fn an_unused_region_is_released_like_any_warm_memory() {
        let mem = Memory::new(4 * REGION_BYTES, 0, 1).unwrap();
        assert!(mem.request_map_ahead(true) && mem.map_ahead());
        let r = (0..4)
            .find(|&r| resident_blocks(&mem, r) > 0)
            .expect("a region was mapped");
        assert_eq!(mem.purge_cold_regions(u64::MAX), BLOCKS_PER_REGION as u64);
        assert_eq!(resident_blocks(&mem, r), 0);
        assert_eq!(mem.warm_blocks(), 0);
        mem.purge_all();
        // Every block can be taken again, four whole regions.
        let all: Vec<SegId> = (0..mem.blocks_total())
            .map(|_| mem.new_segment(1, false).unwrap())
            .collect();
        assert!(mem.new_segment(1, false).is_err());
        for s in all {
            mem.free_segment(s);
        }
    }

    /// With no whole region free, a request maps nothing and takes no
    /// block.
    #[test]
    fn a_full_pool_maps_nothing() {
        let mem = Memory::new(2 * REGION_BYTES, 0, 1).unwrap();
        let segs: Vec<SegId> = (0..mem.blocks_total() - 1)
            .map(|_| mem.new_segment(1, false).unwrap())
            .collect();
        let warm = mem.warm_blocks();
        assert!(mem.request_map_ahead(true));
        assert!(!mem.map_ahead());
        assert_eq!(mem.warm_blocks(), warm);
        assert_eq!(mem.blocks_mapped_ahead(), 0);
        assert!(!mem.request_map_ahead(true), "no whole region: no request");
        for s in segs {
            mem.free_segment(s);
        }
    }

    /// The first append after the idle release (or ever) asks for a
    /// region even though it took no blocks; later ones that take none do
    /// not.
    #[test]
    fn the_first_append_after_an_idle_release_or_ever_asks_for_a_region() {
        let mem = Memory::new(4 * REGION_BYTES, 0, 1).unwrap();
        // A new store's first append asks too.
        assert!(mem.request_map_ahead(false));
        assert!(mem.map_ahead());
        assert!(!mem.request_map_ahead(false), "asked twice");
        let seg = mem.new_segment(1, false).unwrap();
        mem.free_segment(seg);
        mem.purge_all();
        assert!(mem.request_map_ahead(false));
        assert!(mem.map_ahead());
        assert!(!mem.request_map_ahead(false), "asked twice for one release");
        assert_eq!(mem.warm_blocks(), BLOCKS_PER_REGION as u64);
        assert_eq!(mem.blocks_mapped_ahead(), 2 * BLOCKS_PER_REGION as u64);
    }
}
