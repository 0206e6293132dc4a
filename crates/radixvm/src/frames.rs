//! Physical frames and segments.
//!
//! "Physical memory" is a `buddy` frame pool (one anonymous mapping cut
//! into 4 KiB frames) with the distributed buddy allocator over it: a
//! frame is real memory, "physical" means "pool offset" (BRIEF, "Kernel
//! ideas on Linux, honestly"). A frame is zeroed when allocated, as a
//! kernel zeroes an anonymous page before mapping it.
//!
//! Beside the allocator, [`Frames`] keeps one state byte per frame (live
//! or free) so that a touch through a simulated TLB can check that the
//! frame it reaches is still allocated: the test suite's "frames are never
//! freed while a TLB may still map them" is that check counting zero
//! violations. Live-frame counts are per CPU (cache-padded) so that
//! counting costs no shared cache line.
//!
//! The pool is anonymous memory by default, or memfds
//! ([`Frames::new_memfd`]) so that other address spaces (the per-core
//! workers of [`crate::percore`]) can map a frame by file and offset.
//! A memfd pool is one file per buddy heap (per CPU): the distributed
//! allocator gives heap `k` the frames `[k * part, (k + 1) * part)`, and
//! the pool is cut at exactly those edges, so frame `f` lies in memfd
//! `f / part` at page `f % part` ([`Frames::file_of`]). A core allocates
//! from its own heap, so the frames it maps are mostly in its own file,
//! and the kernel's per-file state that every `mmap` and `munmap` of a
//! shared file updates (the file's reference count, its `i_mmap_rwsem`
//! and the interval tree of its mappings) is per core as well. A frame
//! that another core allocated is mapped from that core's file: the same
//! page either way.
//!
//! A [`Segment`] is a file of frames: its pages are allocated on first
//! use, shared by every mapping of it, and freed when the last `Arc` to
//! the segment drops (SpaceJMP's segments, in miniature).

use std::io;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use buddy::pool::{Backing, PoolConfig, PooledAllocator};
use buddy::{AllocatorKind, BuddyConfig, FrameNo};
use crossbeam_utils::CachePadded;

use crate::{VmError, MAX_CPUS, PAGE_SIZE_BYTES};

const FRAME_FREE: u8 = 0;
const FRAME_LIVE: u8 = 1;

/// The frame pool shared by address spaces.
///
/// Aligned to 128 bytes so that, inside an `Arc<Frames>`, the reference
/// counts (which every Refcache'd frame reference bumps on the core that
/// allocates the frame and on the one that frees it) do not share a
/// cache line with the fields every allocation reads.
#[repr(align(128))]
pub struct Frames {
    alloc: PooledAllocator,
    state: Box<[AtomicU8]>,
    live_per_cpu: Box<[CachePadded<AtomicI64>]>,
}

impl std::fmt::Debug for Frames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frames")
            .field("frames", &self.alloc.pool().frames())
            .field("live", &self.live_frames())
            .finish()
    }
}

impl Frames {
    /// A pool of `bytes` (rounded down to frames) with the distributed
    /// buddy allocator over it.
    pub fn new(bytes: usize) -> io::Result<Arc<Frames>> {
        Frames::with_allocator(bytes, AllocatorKind::Distributed)
    }

    /// A pool of `bytes` with allocator `kind`.
    pub fn with_allocator(bytes: usize, kind: AllocatorKind) -> io::Result<Arc<Frames>> {
        Frames::with_pool(
            PoolConfig {
                bytes,
                ..PoolConfig::default()
            },
            kind,
        )
    }

    /// A pool of at most `bytes` over one memfd per buddy heap (one heap
    /// per CPU), mapped shared, with the distributed buddy allocator:
    /// heap `k` owns exactly the frames of memfd `k`, and frame `f` is
    /// page `f % part` of memfd `f / part` ([`Frames::file_of`]), so
    /// another address space can map it with `mmap(fd, offset)`; the
    /// per-core MMU ([`crate::percore`]) does. The pool is rounded down to
    /// equal parts of whole ownership chunks, losing at most an eighth of
    /// it.
    pub fn new_memfd(bytes: usize) -> io::Result<Arc<Frames>> {
        let heaps = BuddyConfig::default().heaps_or_cpus();
        Frames::new_memfds(bytes, heaps)
    }

    /// [`Frames::new_memfd`] with `heaps` heaps (and files) whatever the
    /// number of CPUs.
    pub fn new_memfds(bytes: usize, heaps: usize) -> io::Result<Arc<Frames>> {
        let frames = (bytes as u64 / PAGE_SIZE_BYTES).max(1);
        // The largest chunk (at most the allocator's default) that leaves
        // at most an eighth of each heap's share unused.
        let share_frames = frames / heaps as u64;
        let mut max_order = buddy::default_max_order(frames, heaps);
        while max_order > 0 && share_frames % (1u64 << max_order) > share_frames / 8 {
            max_order -= 1;
        }
        let chunk_frames = 1u64 << max_order;
        let part_frames = share_frames / chunk_frames * chunk_frames;
        if part_frames == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a pool of {bytes} bytes gives {heaps} heaps no frame each"),
            ));
        }
        // Equal parts of whole chunks: the allocator's ownership ranges
        // (chunk i * chunks / heaps onwards for heap i) fall on the files'
        // edges.
        Frames::with_config(
            PoolConfig {
                bytes: (part_frames * heaps as u64 * PAGE_SIZE_BYTES) as usize,
                backing: Backing::Memfds(heaps),
                ..PoolConfig::default()
            },
            AllocatorKind::Distributed,
            BuddyConfig {
                heaps: Some(heaps),
                max_order: Some(max_order),
                check_frees: false,
                ..BuddyConfig::default()
            },
        )
    }

    fn with_pool(pool: PoolConfig, kind: AllocatorKind) -> io::Result<Arc<Frames>> {
        let config = BuddyConfig {
            check_frees: false,
            ..BuddyConfig::default()
        };
        Frames::with_config(pool, kind, config)
    }

    fn with_config(
        pool: PoolConfig,
        kind: AllocatorKind,
        config: BuddyConfig,
    ) -> io::Result<Arc<Frames>> {
        let alloc = PooledAllocator::new(&pool, kind, &config)?;
        let frames = alloc.pool().frames() as usize;
        Ok(Arc::new(Frames {
            alloc,
            state: (0..frames).map(|_| AtomicU8::new(FRAME_FREE)).collect(),
            live_per_cpu: (0..MAX_CPUS)
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect(),
        }))
    }

    /// A zeroed frame, allocated on behalf of `cpu`.
    pub fn alloc_zeroed(&self, cpu: usize) -> Result<FrameNo, VmError> {
        let block = self
            .alloc
            .alloc_block(0)
            .map_err(|_| VmError::OutOfMemory)?;
        // SAFETY: the block is ours alone (just allocated) and spans one
        // frame of the pool's mapping.
        unsafe { std::ptr::write_bytes(block.ptr.as_ptr(), 0, PAGE_SIZE_BYTES as usize) };
        let was = self.state[block.frame as usize].swap(FRAME_LIVE, Ordering::Release);
        assert_eq!(was, FRAME_FREE, "frame {} handed out twice", block.frame);
        self.live_per_cpu[cpu % MAX_CPUS].fetch_add(1, Ordering::Relaxed);
        Ok(block.frame)
    }

    /// `2^order` consecutive zeroed frames (one buddy block), allocated on
    /// behalf of `cpu`; returns the first. Each frame is live on its own:
    /// free them one by one with [`Frames::free`] (the buddy coalesces
    /// the pieces again).
    pub fn alloc_zeroed_block(&self, cpu: usize, order: u32) -> Result<FrameNo, VmError> {
        let block = self
            .alloc
            .alloc_block(order)
            .map_err(|_| VmError::OutOfMemory)?;
        let frames = 1u64 << order;
        // SAFETY: the block is ours alone (just allocated) and spans
        // `frames` frames of the pool's mapping.
        unsafe {
            std::ptr::write_bytes(block.ptr.as_ptr(), 0, (frames * PAGE_SIZE_BYTES) as usize)
        };
        for f in block.frame..block.frame + frames {
            let was = self.state[f as usize].swap(FRAME_LIVE, Ordering::Release);
            assert_eq!(was, FRAME_FREE, "frame {f} handed out twice");
        }
        self.live_per_cpu[cpu % MAX_CPUS].fetch_add(frames as i64, Ordering::Relaxed);
        Ok(block.frame)
    }

    /// Frees `frame` on behalf of `cpu`. The caller guarantees that no TLB
    /// or page table maps it any more.
    pub fn free(&self, cpu: usize, frame: FrameNo) {
        let was = self.state[frame as usize].swap(FRAME_FREE, Ordering::Release);
        assert_eq!(was, FRAME_LIVE, "frame {frame} freed twice");
        self.live_per_cpu[cpu % MAX_CPUS].fetch_sub(1, Ordering::Relaxed);
        let block = buddy::pool::Block {
            frame,
            order: 0,
            ptr: self.alloc.pool().frame_ptr(frame),
        };
        self.alloc
            .free_block(block)
            .expect("a live frame frees cleanly");
    }

    /// Whether `frame` is allocated.
    pub fn is_live(&self, frame: FrameNo) -> bool {
        self.state[frame as usize].load(Ordering::Acquire) == FRAME_LIVE
    }

    /// Address of `frame`'s first byte.
    pub fn ptr(&self, frame: FrameNo) -> *mut u8 {
        self.alloc.pool().frame_ptr(frame).as_ptr()
    }

    /// The memfd holding `frame` and the byte offset of its page there,
    /// for a pool made by [`Frames::new_memfd`] (`None` for an anonymous
    /// pool).
    pub fn file_of(&self, frame: FrameNo) -> Option<(i32, u64)> {
        self.alloc.pool().file_of(frame)
    }

    /// Frames per backing file: the run of frames one `mmap` of a file can
    /// cover (the whole pool when it is not cut into files).
    pub fn file_frames(&self) -> u64 {
        self.alloc.pool().file_frames()
    }

    /// Frames allocated and not freed.
    pub fn live_frames(&self) -> i64 {
        self.live_per_cpu
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Frames in the pool.
    pub fn capacity_frames(&self) -> u64 {
        self.alloc.pool().frames()
    }
}

/// A file of frames: pages allocated on first use and shared by every
/// mapping of the segment.
pub struct Segment {
    frames: Arc<Frames>,
    /// Frame number + 1 of each page, 0 while not yet allocated.
    pages: Box<[AtomicU64]>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("pages", &self.pages.len())
            .finish()
    }
}

impl Segment {
    /// A segment of `pages` pages drawing frames from `frames`.
    pub fn new(frames: &Arc<Frames>, pages: u64) -> Arc<Segment> {
        Arc::new(Segment {
            frames: frames.clone(),
            pages: (0..pages).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Length in pages.
    pub fn len_pages(&self) -> u64 {
        self.pages.len() as u64
    }

    /// The frame holding page `page`, allocated (zeroed) on first use.
    pub fn frame(&self, cpu: usize, page: u64) -> Result<FrameNo, VmError> {
        let slot = self
            .pages
            .get(page as usize)
            .ok_or(VmError::PastSegmentEnd)?;
        let word = slot.load(Ordering::Acquire);
        if word != 0 {
            return Ok(word - 1);
        }
        let frame = self.frames.alloc_zeroed(cpu)?;
        match slot.compare_exchange(0, frame + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(frame),
            Err(won) => {
                self.frames.free(cpu, frame);
                Ok(won - 1)
            }
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // Every mapping holds an `Arc` to the segment, so no page table
        // maps these frames any more.
        for slot in self.pages.iter() {
            let word = slot.load(Ordering::Acquire);
            if word != 0 {
                self.frames.free(0, word - 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte at `offset` of file `fd`, read with `pread`.
    fn file_byte(fd: i32, offset: u64) -> u8 {
        let mut b = 0u8;
        // SAFETY: one byte into a valid local; `fd` is an open memfd.
        let n = unsafe { libc::pread(fd, (&mut b as *mut u8).cast(), 1, offset as libc::off_t) };
        assert_eq!(n, 1, "pread at {offset}");
        b
    }

    /// Heap `k` hands out only frames of memfd `k`, and frame numbers map
    /// to (file, offset) at every edge between parts, for heap counts that
    /// divide the pool evenly and ones that do not.
    #[test]
    fn memfd_per_heap_matches_the_heaps_ownership() {
        for (bytes, heaps) in [
            (64 << 20, 2),
            (100 << 20, 3),
            (1 << 30, 3),
            (40 << 20, 5),
            (1 << 30, 6),
            (8 << 20, 1),
        ] {
            let frames = Frames::new_memfds(bytes, heaps).unwrap();
            let part = frames.file_frames();
            assert_eq!(
                frames.capacity_frames(),
                part * heaps as u64,
                "{bytes} {heaps}"
            );
            let cap_bytes = frames.capacity_frames() * PAGE_SIZE_BYTES;
            assert!(cap_bytes <= bytes as u64 && cap_bytes >= bytes as u64 / 8 * 7);
            let mut fds = Vec::new();
            for k in 0..heaps as u64 {
                let edges = [k * part, k * part + 1, (k + 1) * part - 1];
                for f in edges {
                    let (fd, offset) = frames.file_of(f).unwrap();
                    assert_eq!(offset, (f - k * part) * PAGE_SIZE_BYTES, "frame {f}");
                    let tag = (f % 250) as u8 + 1;
                    // SAFETY: a frame of the pool nobody else uses.
                    unsafe { frames.ptr(f).add(3).write_volatile(tag) };
                    assert_eq!(file_byte(fd, offset + 3), tag, "frame {f} of heap {k}");
                    fds.push(fd);
                }
                // What heap k hands out lies in its own file.
                let alloc = frames.alloc.allocator();
                let got: Vec<FrameNo> = (0..8)
                    .map(|_| alloc.alloc_on(k as usize, 0).unwrap())
                    .collect();
                for &f in &got {
                    assert_eq!(
                        f / part,
                        k,
                        "heap {k} handed out frame {f} of file {}",
                        f / part
                    );
                    alloc.free_on(k as usize, f, 0).unwrap();
                }
                let block = alloc.alloc_on(k as usize, 2).unwrap();
                assert_eq!(
                    block / part,
                    (block + 3) / part,
                    "a block stays in one file"
                );
                alloc.free_on(k as usize, block, 2).unwrap();
            }
            fds.dedup();
            assert_eq!(fds.len(), heaps, "one memfd per heap");
        }
        let e = Frames::new_memfds(4 * PAGE_SIZE_BYTES as usize, 8).unwrap_err();
        assert!(e.to_string().contains("no frame each"), "{e}");
        assert_eq!(Frames::new(1 << 20).unwrap().file_of(0), None);
    }
}
