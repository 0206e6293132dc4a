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
//! The pool is anonymous memory by default, or one memfd
//! ([`Frames::new_memfd`]) so that other address spaces (the per-core
//! workers of [`crate::percore`]) can map a frame by its file offset.
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

    /// A pool of `bytes` over one memfd, mapped shared, with the
    /// distributed buddy allocator: frame `f` is the file's page `f`
    /// (offset `f * 4096`), so another address space can map it with
    /// `mmap(fd, f * 4096)` ([`Frames::memfd`]); the per-core MMU
    /// ([`crate::percore`]) does.
    pub fn new_memfd(bytes: usize) -> io::Result<Arc<Frames>> {
        Frames::with_pool(
            PoolConfig {
                bytes,
                backing: Backing::Memfd,
                ..PoolConfig::default()
            },
            AllocatorKind::Distributed,
        )
    }

    fn with_pool(pool: PoolConfig, kind: AllocatorKind) -> io::Result<Arc<Frames>> {
        let config = BuddyConfig {
            check_frees: false,
            ..BuddyConfig::default()
        };
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

    /// The memfd holding the frames (frame `f` at offset `f * 4096`), for
    /// a pool made by [`Frames::new_memfd`].
    pub fn memfd(&self) -> Option<i32> {
        match self.alloc.pool().backing() {
            Backing::Memfd => self.alloc.pool().fd(),
            _ => None,
        }
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
