//! Giving memory back (see "Giving memory back" in `memory.rs`): the
//! decay-time release of whole 2 MiB regions none of whose blocks is in a
//! segment, and the full release (`purge_all`) when the store is idle or
//! asked to (`Store::release_memory`).
//!
//! A region is released with `MADV_DONTNEED` only once its taken count is
//! 0, under the `REGION_RELEASING` flag that makes a taker of one of its
//! blocks wait, so a release never drops a block that is in a segment (the
//! tests below race the two). A single block is released only by the
//! thread that popped it from the warm cache, which owns it until it hands
//! it to the buddy allocator; the never-used blocks of a region a huge-page
//! fault made resident are in the warm cache too (spares, "Never-used
//! blocks" in `memory.rs`), so no release ever touches a block that the
//! buddy allocator, and through it another thread, may hand out.
//!
//! A block goes to the buddy allocator only after its region is advised
//! `MADV_NOHUGEPAGE` ("Huge pages and the buddy allocator" in
//! `memory.rs`), and the advice comes before the block's `MADV_DONTNEED`:
//! a huge-page fault or a khugepaged collapse of the region that runs
//! before the advice maps the block in, and the `MADV_DONTNEED` after it
//! drops it again; one that would run after finds the advice. The full
//! release drops every block it pops, whatever its state says: the first
//! write into a released region can have faulted the whole region in.

use super::*;

impl Memory {
    /// Release the region of block `b` to the OS if none of its blocks is
    /// in a segment and it has not been released since one was. Returns
    /// the warm blocks that stopped being resident.
    fn release_region(&self, b: u32) -> u64 {
        let r = b as usize / BLOCKS_PER_REGION;
        let region = &self.regions[r];
        if region
            .compare_exchange(
                REGION_RESIDENT,
                REGION_RELEASING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            // Some block is in use, a release is under way, or nothing was
            // touched since the last one.
            return 0;
        }
        let first = r * BLOCKS_PER_REGION;
        let end = (first + BLOCKS_PER_REGION).min(self.blocks_total as usize);
        // SAFETY: the range lies inside the pool's mapping (blocks
        // `first..end` exist). No block of the region is in a segment (the
        // taken count was 0) and none can enter one before we clear
        // REGION_RELEASING (takers wait for it), so no live object is in
        // these pages; dropping them (they read back as zeros) loses no
        // data. A failure only leaves the pages resident.
        unsafe {
            libc::madvise(
                self.base.add(first << BLOCK_SHIFT) as *mut libc::c_void,
                (end - first) << BLOCK_SHIFT,
                libc::MADV_DONTNEED,
            );
        }
        let n = self.move_states(first..end, block_state::WARM, block_state::WARM_RELEASED);
        self.warm_released.fetch_add(n, Ordering::Relaxed);
        region.store(0, Ordering::Release);
        n
    }

    /// The decay-time release: for every warm block freed at or before
    /// `freed_by_ms` (Unix ms), release its region if no block of it is in
    /// a segment. The blocks stay in the warm cache (stamped now, so each
    /// is looked at again one decay time later). Returns the blocks that
    /// stopped being resident.
    pub(crate) fn purge_cold_regions(&self, freed_by_ms: u64) -> u64 {
        let now = now_ms();
        let mut n = 0;
        for _ in 0..self.warm_blocks.load(Ordering::Relaxed) {
            let Some((b, at)) = self.warm.pop() else {
                break;
            };
            if at > freed_by_ms {
                self.warm.push((b, at));
                break;
            }
            n += self.release_region(b);
            self.warm.push((b, now));
        }
        self.blocks_purged.fetch_add(n, Ordering::Relaxed);
        n
    }

    /// Give every warm block back to the OS and to the buddy allocator,
    /// block by block (splitting the huge pages they share with live
    /// blocks): the idle-time and `Store::release_memory` release; the
    /// decay-time one is [`Memory::purge_cold_regions`]. Returns how many
    /// were resident.
    ///
    /// This includes the spare blocks of regions taken whole, which are
    /// resident if a neighbour's write faulted their huge page in.
    ///
    /// A popped block is this thread's alone (a pop hands it to one
    /// thread; it is in no segment and not in the buddy allocator until
    /// this thread frees it there, after the `MADV_DONTNEED`), so
    /// discarding its pages cannot lose data; a reader still holding a
    /// stale location is impossible because blocks enter the cache only
    /// after the epoch has passed their segment, or, spares, before they
    /// were ever in one.
    pub(crate) fn purge_all(&self) -> u64 {
        let (mut n, mut popped) = (0, false);
        while let Some((b, _)) = self.warm.pop() {
            popped = true;
            self.warm_blocks.fetch_sub(1, Ordering::Relaxed);
            let off = (b as usize) << BLOCK_SHIFT;
            // Before the block's pages are dropped: nothing may map them
            // in again once the buddy allocator holds it.
            self.forbid_huge(b as usize / BLOCKS_PER_REGION);
            let was = self.block_state[b as usize].swap(block_state::BUDDY, Ordering::AcqRel);
            if was == block_state::WARM_RELEASED {
                self.warm_released.fetch_sub(1, Ordering::Relaxed);
            } else {
                n += 1;
            }
            // SAFETY: the block lies inside the pool's mapping (block ids
            // come from this pool's allocator) and this thread owns it: it
            // was popped from the warm cache and is not in any segment.
            // MADV_DONTNEED on a private anonymous mapping only drops the
            // pages (they read back as zeros); it cannot affect other
            // memory. A failure only leaves them resident.
            unsafe {
                libc::madvise(
                    self.base.add(off) as *mut libc::c_void,
                    BLOCK_BYTES,
                    libc::MADV_DONTNEED,
                );
            }
            self.alloc
                .free((b as u64) << BLOCK_ORDER, BLOCK_ORDER)
                .expect("freeing a block this store allocated");
        }
        self.blocks_purged.fetch_add(n, Ordering::Relaxed);
        // The buddy allocator may hold whole free regions again.
        self.no_whole_regions.store(false, Ordering::Relaxed);
        // The next append asks for memory mapped ahead (module `ahead`).
        if popped {
            self.purged_since_append.store(true, Ordering::Relaxed);
        }
        n
    }

    /// Advise region `r` `MADV_NOHUGEPAGE` (once): faults in it map 4 KiB
    /// pages and khugepaged does not fold it (see "Huge pages and the buddy
    /// allocator" in `memory.rs`).
    pub(super) fn forbid_huge(&self, r: usize) {
        if self.region_nohuge[r].load(Ordering::Acquire) {
            return;
        }
        let _advice = self.thp_advice.lock();
        if !self.region_nohuge[r].load(Ordering::Relaxed)
            && self.advise_region(r, libc::MADV_NOHUGEPAGE)
        {
            self.region_nohuge[r].store(true, Ordering::Release);
        }
    }

    /// Lift region `r`'s `MADV_NOHUGEPAGE`, for a caller that has just
    /// taken the whole region from the buddy allocator.
    pub(super) fn allow_huge(&self, r: usize) {
        if !self.region_nohuge[r].load(Ordering::Acquire) {
            return;
        }
        let _advice = self.thp_advice.lock();
        if self.region_nohuge[r].load(Ordering::Relaxed)
            && self.advise_region(r, libc::MADV_HUGEPAGE)
        {
            self.region_nohuge[r].store(false, Ordering::Release);
        }
    }

    /// `madvise(advice)` on region `r`'s bytes; false if the kernel
    /// refused (no THP support, or a split of the pool's mapping past the
    /// process's map count), which leaves the advice as it was.
    fn advise_region(&self, r: usize, advice: libc::c_int) -> bool {
        let first = r * BLOCKS_PER_REGION;
        let end = (first + BLOCKS_PER_REGION).min(self.blocks_total as usize);
        // SAFETY: blocks `first..end` exist, so the range lies inside the
        // pool's mapping; huge-page advice changes how pages are mapped,
        // never their contents.
        unsafe {
            libc::madvise(
                self.base.add(first << BLOCK_SHIFT) as *mut libc::c_void,
                (end - first) << BLOCK_SHIFT,
                advice,
            ) == 0
        }
    }

    /// Free blocks still resident (the warm cache, less the blocks of
    /// released regions in it).
    pub(crate) fn warm_blocks(&self) -> u64 {
        self.warm_blocks
            .load(Ordering::Relaxed)
            .saturating_sub(self.warm_released.load(Ordering::Relaxed))
    }

    /// Blocks given back to the OS so far.
    pub(crate) fn blocks_purged(&self) -> u64 {
        self.blocks_purged.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn block_of(mem: &Memory, s: SegId) -> u32 {
        mem.seg(s).meta.lock().blocks[0]
    }

    /// Fill block `b`, which the caller took in a segment of its own.
    fn fill(mem: &Memory, b: u32, byte: u8) {
        // SAFETY: every caller passes a block of a segment only its thread
        // holds, so nobody else writes it.
        unsafe { mem.write((b as u64) << BLOCK_SHIFT, &[byte; BLOCK_BYTES]) };
    }

    fn holds(mem: &Memory, b: u32, byte: u8) -> bool {
        let mut buf = vec![0u8; BLOCK_BYTES];
        assert!(mem.read((b as u64) << BLOCK_SHIFT, &mut buf));
        buf.iter().all(|&x| x == byte)
    }

    /// The decay-time release gives back whole regions none of whose
    /// blocks is in a segment, and leaves the others (and their huge
    /// pages) alone; a released region is not released again until one of
    /// its blocks is used.
    #[test]
    fn decay_release_takes_whole_free_regions_only() {
        let mem = Memory::new(4 * REGION_BYTES, 0, 1).unwrap();
        let segs: Vec<SegId> = (0..mem.blocks_total())
            .map(|_| mem.new_segment(1, false).unwrap())
            .collect();
        let region_of = |s: SegId| block_of(&mem, s) as usize / BLOCKS_PER_REGION;
        for &s in &segs {
            fill(&mem, block_of(&mem, s), 0xAB);
        }
        // Free regions 0 and 1 entirely, region 2 but for one block.
        let mut kept_in_2 = None;
        for &s in &segs {
            match region_of(s) {
                0 | 1 => mem.free_segment(s),
                2 if kept_in_2.is_none() => kept_in_2 = Some(s),
                2 => mem.free_segment(s),
                _ => {}
            }
        }
        let kept = block_of(&mem, kept_in_2.unwrap());
        let freed = (2 * BLOCKS_PER_REGION + BLOCKS_PER_REGION - 1) as u64;
        assert_eq!(mem.warm_blocks(), freed);
        let released = mem.purge_cold_regions(u64::MAX);
        assert_eq!(released, 2 * BLOCKS_PER_REGION as u64);
        assert_eq!(mem.warm_blocks(), freed - released);
        assert!(holds(&mem, kept, 0xAB), "a block in use lost its data");
        // The released regions read back as zeros; region 2's free blocks
        // are still resident.
        for b in 0..mem.blocks_total() as u32 {
            let r = b as usize / BLOCKS_PER_REGION;
            if r < 2 {
                assert!(holds(&mem, b, 0), "block {b} of a released region");
            } else {
                assert!(holds(&mem, b, 0xAB), "block {b} of a kept region");
            }
        }
        assert_eq!(mem.purge_cold_regions(u64::MAX), 0);
        // Every free block goes to the buddy allocator with a full purge,
        // and the counts come back to zero.
        mem.purge_all();
        assert_eq!(mem.warm_blocks(), 0);
        assert_eq!(mem.warm_released.load(Ordering::Relaxed), 0);
        let again = mem.new_segment(1, false).unwrap();
        fill(&mem, block_of(&mem, again), 0xCD);
        assert!(holds(&mem, block_of(&mem, again), 0xCD));
    }

    /// A region taken whole gives one block to its segment and the rest
    /// to the warm cache; the idle release gives those spares back (they
    /// read as zeros after it, standing in for the pages a huge-page fault
    /// mapped) and keeps the block in use.
    #[test]
    fn idle_release_returns_the_spares_of_a_region_taken_whole() {
        let mem = Memory::new(4 * REGION_BYTES, 0, 1).unwrap();
        let seg = mem.new_segment(1, false).unwrap();
        let used = block_of(&mem, seg);
        let first = used as usize / BLOCKS_PER_REGION * BLOCKS_PER_REGION;
        assert_eq!(used as usize, first, "a fresh region's first block");
        assert_eq!(mem.warm_blocks(), BLOCKS_PER_REGION as u64 - 1);
        // The next segments take the spares before asking the allocator.
        let next = mem.new_segment(1, false).unwrap();
        assert_eq!(
            block_of(&mem, next) as usize / BLOCKS_PER_REGION,
            first / BLOCKS_PER_REGION
        );
        mem.free_segment(next);
        fill(&mem, used, 0xAB);
        for b in first..first + BLOCKS_PER_REGION {
            if b as u32 != used {
                // SAFETY: the block is a spare in the warm cache and this
                // test is the only thread.
                unsafe { mem.write((b as u64) << BLOCK_SHIFT, &[0x5A; BLOCK_BYTES]) };
            }
        }
        mem.purge_all();
        assert_eq!(mem.warm_blocks(), 0);
        assert!(holds(&mem, used, 0xAB), "the block in use lost its data");
        for b in first..first + BLOCKS_PER_REGION {
            if b as u32 != used {
                assert!(holds(&mem, b as u32, 0), "spare block {b} still resident");
            }
        }
        // The spares went back to the allocator piece by piece; every
        // block can still be taken, and the counts come back to zero.
        let all: Vec<SegId> = (0..mem.blocks_total() - 1)
            .map(|_| mem.new_segment(1, false).unwrap())
            .collect();
        assert!(
            mem.new_segment(1, false).is_err(),
            "more blocks than the pool"
        );
        for s in all {
            mem.free_segment(s);
        }
        mem.free_segment(seg);
        mem.purge_all();
        assert_eq!(mem.warm_blocks(), 0);
        assert_eq!(mem.blocks_in_use(), 0);
    }

    /// Blocks of region `r` with at least one page resident (`mincore`).
    pub(in crate::memory) fn resident_blocks(mem: &Memory, r: usize) -> usize {
        const PAGE_BYTES: usize = 4096;
        let mut vec = vec![0u8; REGION_BYTES / PAGE_BYTES];
        // SAFETY: the region lies inside the pool's mapping (the callers'
        // pools are whole regions) and `vec` has one byte per page of it.
        let rc = unsafe {
            libc::mincore(
                mem.base.add(r * REGION_BYTES) as *mut libc::c_void,
                REGION_BYTES,
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
        vec.chunks(BLOCK_BYTES / PAGE_BYTES)
            .filter(|pages| pages.iter().any(|&p| p & 1 != 0))
            .count()
    }

    /// A pool of four regions with one block in use (filled with 0xAB)
    /// and its region's other blocks given to the buddy allocator by the
    /// idle release: the store, the segment, its block and its region.
    fn one_block_after_release() -> (Memory, SegId, u32, usize) {
        let mem = Memory::new(4 * REGION_BYTES, 0, 1).unwrap();
        let seg = mem.new_segment(1, false).unwrap();
        let used = block_of(&mem, seg);
        let r = used as usize / BLOCKS_PER_REGION;
        fill(&mem, used, 0xAB);
        mem.purge_all();
        assert_eq!(resident_blocks(&mem, r), 1);
        (mem, seg, used, r)
    }

    /// A region released whole by the decay-time release, whose other
    /// blocks the buddy allocator holds: taking one block of it again and
    /// writing it must not fault the whole huge page in (the buddy's
    /// blocks would be resident with nobody to release them); and the
    /// region's released warm blocks count as resident again once a
    /// block of it is taken, so the idle release drops them.
    #[test]
    fn a_write_into_a_released_region_maps_only_its_block() {
        // The idle release gives the region's spares to the buddy.
        let (mem, seg, used, r) = one_block_after_release();
        // The last block is freed and its region released whole.
        mem.free_segment(seg);
        assert_eq!(mem.purge_cold_regions(u64::MAX), 1);
        assert_eq!(resident_blocks(&mem, r), 0);
        // The warm cache hands the same block out again.
        let again = mem.new_segment(1, false).unwrap();
        assert_eq!(block_of(&mem, again), used);
        fill(&mem, used, 0xCD);
        assert_eq!(
            resident_blocks(&mem, r),
            1,
            "a write faulted the buddy allocator's blocks of region {r} in"
        );
        mem.free_segment(again);
        mem.purge_all();
        assert_eq!(resident_blocks(&mem, r), 0);

        // A region taken whole (one block and 31 spares, all the memory
        // layer's), two blocks used, freed and released whole: its 32
        // blocks are released warm blocks. The next take may fault the
        // huge page in: the other 31 count as resident again.
        let mem = Memory::new(4 * REGION_BYTES, 0, 1).unwrap();
        let a = mem.new_segment(1, false).unwrap();
        let b = mem.new_segment(1, false).unwrap();
        for s in [a, b] {
            fill(&mem, block_of(&mem, s), 0xAB);
        }
        let r = block_of(&mem, a) as usize / BLOCKS_PER_REGION;
        mem.free_segment(a);
        mem.free_segment(b);
        mem.purge_cold_regions(u64::MAX);
        assert_eq!(mem.warm_blocks(), 0);
        let c = mem.new_segment(1, false).unwrap();
        fill(&mem, block_of(&mem, c), 0xCD);
        assert_eq!(mem.warm_blocks(), BLOCKS_PER_REGION as u64 - 1);
        mem.purge_all();
        assert_eq!(mem.warm_blocks(), 0);
        assert_eq!(resident_blocks(&mem, r), 1);
        assert!(holds(&mem, block_of(&mem, c), 0xCD));
    }

    /// khugepaged folds a region with any page present into one huge page
    /// (`max_ptes_none` 511 by default), filling its holes; `MADV_COLLAPSE`
    /// does the same at once. After the idle release has given a region's
    /// free blocks to the buddy allocator, neither may map them in again.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_collapse_does_not_map_the_buddy_allocators_blocks_in() {
        let (mem, seg, used, r) = one_block_after_release();
        // SAFETY: advice on region `r`, inside the pool's mapping; a
        // collapse keeps every page's contents. Its failure is the point.
        unsafe {
            libc::madvise(
                mem.base.add(r * REGION_BYTES) as *mut libc::c_void,
                REGION_BYTES,
                libc::MADV_COLLAPSE,
            );
        }
        assert_eq!(
            resident_blocks(&mem, r),
            1,
            "a collapse mapped the buddy allocator's blocks of region {r} in"
        );
        assert!(holds(&mem, used, 0xAB));
        // Taken whole again, the region may have huge pages.
        mem.free_segment(seg);
        mem.purge_all();
        assert!(mem.region_nohuge[r].load(Ordering::Relaxed));
        let all: Vec<SegId> = (0..mem.blocks_total())
            .map(|_| mem.new_segment(1, false).unwrap())
            .collect();
        assert!(mem.region_nohuge.iter().all(|f| !f.load(Ordering::Relaxed)));
        for s in all {
            mem.free_segment(s);
        }
    }

    /// A taker thread of the race tests: until `stop`, take a segment of
    /// `blocks` blocks, fill them with a byte of its own (`t` tells the
    /// two takers apart), yield, check every byte, free the segment.
    fn take_write_check(mem: &Memory, stop: &std::sync::atomic::AtomicBool, t: u8, blocks: usize) {
        let mut i = 0u8;
        while !stop.load(Ordering::Relaxed) {
            i = i.wrapping_add(1);
            let byte = (t << 7) | (i & 0x7F) | 1;
            let Ok(seg) = mem.new_segment(blocks, false) else {
                continue;
            };
            let list = mem.seg(seg).meta.lock().blocks.clone();
            for &b in &list {
                fill(mem, b, byte);
            }
            std::thread::yield_now();
            for &b in &list {
                assert!(holds(mem, b, byte), "block {b} lost its data");
            }
            mem.free_segment(seg);
        }
    }

    /// Takers that write and check their blocks race with the idle
    /// release and the decay release run in a tight loop: neither ever
    /// drops a block that is in a segment (every block reads back whole),
    /// while regions are taken whole and their spares released over and
    /// over.
    #[test]
    fn idle_release_never_drops_a_block_in_use() {
        let mem = Memory::new(4 * REGION_BYTES, 0, 2).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let ms = if cfg!(debug_assertions) { 300 } else { 600 };
        std::thread::scope(|s| {
            for t in 0..2u8 {
                let (mem, stop) = (&mem, &stop);
                s.spawn(move || take_write_check(mem, stop, t, 3));
            }
            let (mem, stop) = (&mem, &stop);
            s.spawn(move || {
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    if round.is_multiple_of(2) {
                        mem.purge_all();
                    } else {
                        mem.purge_cold_regions(u64::MAX);
                    }
                }
            });
            std::thread::sleep(std::time::Duration::from_millis(ms));
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while mem.blocks_purged() == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert!(mem.blocks_purged() > 0, "nothing was ever released");
        mem.purge_all();
        assert_eq!(mem.blocks_in_use(), 0);
        assert_eq!(mem.warm_blocks(), 0);
    }

    /// Threads that take blocks, write them and check them race with
    /// threads that release regions: a release never drops a block that
    /// is in a segment (a taker waits for a release under way).
    #[test]
    fn region_release_never_drops_a_block_in_use() {
        let mem = Memory::new(2 * REGION_BYTES, 0, 2).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let released = std::sync::atomic::AtomicU64::new(0);
        let ms = if cfg!(debug_assertions) { 300 } else { 600 };
        std::thread::scope(|s| {
            for t in 0..2u8 {
                let (mem, stop) = (&mem, &stop);
                s.spawn(move || take_write_check(mem, stop, t, 2));
            }
            let (mem, stop, released) = (&mem, &stop, &released);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    released.fetch_add(mem.purge_cold_regions(u64::MAX), Ordering::Relaxed);
                }
            });
            // Run at least `ms`, and on a loaded machine until the purger
            // has released a region at least once (within 20 s), so the
            // check below is about correctness, not scheduling luck.
            std::thread::sleep(std::time::Duration::from_millis(ms));
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while released.load(Ordering::Relaxed) == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            stop.store(true, Ordering::Relaxed);
            assert!(
                released.load(Ordering::Relaxed) > 0,
                "no region was ever released"
            );
        });
    }
}
