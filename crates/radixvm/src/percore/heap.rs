//! The shared heap: a global allocator whose every byte lives in one
//! `MAP_SHARED` region at a fixed address, so that a process that forks
//! keeps sharing every Rust object it built before the fork, at the same
//! address, with its children.
//!
//! This is what lets the per-core backend ([`crate::percore`]) run the
//! designs unchanged with one *process* per core: the parent builds the
//! address space (radix map, Refcache domain, frame allocator, MMU) with
//! ordinary `Box`/`Arc`/`Vec`, forks the workers, and every worker follows
//! the same pointers to the same memory. Atomics in that memory are
//! atomic across processes (they are the same cache lines), and so are
//! spin locks; locks that park waiters in a process-private table are not
//! (module essay of [`crate::percore`]).
//!
//! *Region.* [`SharedHeap`] maps [`HEAP_RESERVE_BYTES`] at
//! [`HEAP_BASE_ADDR`] with `MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE |
//! MAP_FIXED_NOREPLACE` on its first allocation (before `main`, single
//! threaded). If the address is taken the process says so on stderr and
//! exits: a heap elsewhere would silently not be shared.
//!
//! *Allocator.* Lock-free, with all its state in the region's header, so
//! it is equally correct among threads and among processes:
//! * sizes are rounded up to a power of two (at least
//!   [`MIN_BLOCK_BYTES`]); each class has a Treiber stack of free blocks
//!   whose head word carries a 16-bit tag beside the 47-bit address (the
//!   tag changes on every push and pop, so a head that was popped and
//!   pushed again between a reader's load and its CAS fails the CAS: no
//!   ABA);
//! * an empty class takes a fresh block from a bump pointer (CAS loop),
//!   aligned to the block size up to a page and to the page above that
//!   (large allocations are page-granular);
//! * freed blocks go back to their class's stack; memory never returns
//!   to the system (the workers are short-lived);
//! * a thread that asks for it ([`enable_thread_cache`]: each per-core
//!   worker, a single-threaded process) keeps a private cache of free
//!   blocks per small class (up to [`CACHED_MAX_BYTES`]), as a kernel's
//!   per-CPU slab caches do: an allocation pops from it and a free pushes
//!   to it, with no atomic operation on a shared cache line. It goes to
//!   the shared stacks only when empty (one pop or one bump) or full
//!   (half of it goes back as one chain, one CAS), and gives everything
//!   back at [`flush_thread_cache`] (a worker, before it exits). Without
//!   it every allocation of the designs' metadata on one core is a CAS
//!   on the same few header lines as every other core's: a cache-line
//!   transfer per allocation and per free between the workers. Each
//!   class holds up to [`CACHE_CLASS_BYTES`], enough for the bursts
//!   Refcache frees at the end of an epoch (hundreds of frame headers at
//!   once): with a cache smaller than the burst, the surplus goes to the
//!   shared stack and the next allocations of that class take it back
//!   from there one CAS at a time, blocks wandering between workers. The cache
//!   is not reentrant: a signal handler that allocated while the thread
//!   was inside it would take the shared stacks (a per-thread busy flag
//!   says so), so handlers stay correct either way.
//!
//! ```text
//!  pop(class):  h = head (tag|addr) ─ next = *addr ─ CAS head h → (tag+1|next)
//!  push(class): h = head ─ *blk = addr(h) ─ CAS head h → (tag+1|blk)
//! ```
//!
//! A pop reads `*addr` of a block another thread or process may just have
//! popped and be writing; the read is an atomic load of memory that stays
//! mapped for the life of the process, and the CAS then fails on the tag.
//!
//! *Hazards after a fork* (what the per-core runner obeys): an object
//! owned by value before the fork is owned by every process afterwards;
//! a worker must only borrow such objects and end with `_exit` so that
//! nothing pre-fork is dropped twice. Statics and thread-locals are
//! per-process copies: a static that points into the heap keeps pointing
//! at the shared object (the Refcache domain is made so on purpose), a
//! buffer behind a static (stdout's) is shared too, so workers never
//! print to stdout.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Where the region is mapped, in every process.
pub const HEAP_BASE_ADDR: usize = 0x6000_0000_0000;
/// Bytes of address space reserved for the heap (no memory is committed
/// until touched).
pub const HEAP_RESERVE_BYTES: usize = 64 << 30;
/// The smallest block.
pub const MIN_BLOCK_BYTES: usize = 16;
/// Blocks of a page or more are page-aligned (and page multiples).
const PAGE_BYTES: usize = 4096;
/// Size classes: 2^4 .. 2^36 bytes.
const CLASSES: usize = 33;
const MIN_SHIFT: u32 = 4;
/// Low bits of a stack head holding the address (x86-64 user space).
const ADDR_BITS: u32 = 47;
const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;

/// Largest block a thread's private cache holds.
pub const CACHED_MAX_BYTES: usize = 4096;
/// Classes a thread's private cache holds (16 B .. [`CACHED_MAX_BYTES`]).
const CACHED_CLASSES: usize = 9;
/// Bytes of blocks a thread's private cache holds per class; when a
/// class is full, half of it goes back to the shared stack. Sized for
/// the bursts a per-core worker frees at once: Refcache frees an epoch's
/// worth of released frames together (their 128-byte counted headers,
/// ~4 per iteration of the local workload, hundreds per epoch, more when
/// another worker holds the epoch up), and a cache smaller than the
/// burst sends most of them to the shared stack and takes every later
/// allocation of that class from there.
pub const CACHE_CLASS_BYTES: usize = 256 << 10;
/// Most blocks a thread's private cache holds, all classes together.
pub const MAX_CACHED_BLOCKS: u64 = {
    let mut blocks = 0;
    let mut class = 0;
    while class < CACHED_CLASSES {
        blocks += cache_blocks(class) as u64;
        class += 1;
    }
    blocks
};

const STATE_UNINIT: u8 = 0;
const STATE_BUSY: u8 = 1;
const STATE_READY: u8 = 2;

/// The allocator's state, at the start of the region.
#[repr(C)]
struct Header {
    /// Next unused byte, as an offset from the region's start.
    bump: AtomicU64,
    /// Per class: tag (high 17 bits) | address of the first free block.
    heads: [AtomicU64; CLASSES],
}

/// The global allocator over the shared region (see the module essay).
/// Declare it with `#[global_allocator]` in a binary that forks workers.
pub struct SharedHeap {
    /// Process-private: whether this process mapped (or inherited) the
    /// region. After a fork the child's copy says ready, which is true.
    state: AtomicU8,
}

impl SharedHeap {
    /// The allocator; it maps its region on first use.
    pub const fn new() -> SharedHeap {
        SharedHeap {
            state: AtomicU8::new(STATE_UNINIT),
        }
    }

    fn header(&self) -> &Header {
        if self.state.load(Ordering::Acquire) != STATE_READY {
            self.init();
        }
        // SAFETY: the region is mapped (init returned) and starts with a
        // `Header`, zero-initialized by the kernel: all-zero atomics are
        // valid. It stays mapped for the life of the process.
        unsafe { &*(HEAP_BASE_ADDR as *const Header) }
    }

    #[cold]
    fn init(&self) {
        match self.state.compare_exchange(
            STATE_UNINIT,
            STATE_BUSY,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {}
            Err(_) => {
                while self.state.load(Ordering::Acquire) != STATE_READY {
                    std::hint::spin_loop();
                }
                return;
            }
        }
        // SAFETY: a fresh shared anonymous mapping at a fixed address the
        // kernel refuses to place over an existing mapping
        // (MAP_FIXED_NOREPLACE): nothing else can be clobbered.
        let p = unsafe {
            libc::mmap(
                HEAP_BASE_ADDR as *mut libc::c_void,
                HEAP_RESERVE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != HEAP_BASE_ADDR as *mut libc::c_void {
            let msg = b"radixvm shared heap: cannot map the region at 0x600000000000 \
(address taken or mmap refused); the per-core workers need it at that address\n";
            // SAFETY: write(2) of a static buffer to stderr, then _exit:
            // no allocation is possible here.
            unsafe {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(2);
            }
        }
        // SAFETY: the region is ours and zeroed; the header is written
        // once, before any allocation (state is BUSY, others spin).
        unsafe {
            let h = &*(HEAP_BASE_ADDR as *const Header);
            let first = std::mem::size_of::<Header>().next_multiple_of(PAGE_BYTES);
            h.bump.store(first as u64, Ordering::Relaxed);
        }
        self.state.store(STATE_READY, Ordering::Release);
    }

    /// Whether `p` lies in the shared region.
    pub fn contains(p: *const u8) -> bool {
        (p as usize).wrapping_sub(HEAP_BASE_ADDR) < HEAP_RESERVE_BYTES
    }
}

impl Default for SharedHeap {
    fn default() -> Self {
        SharedHeap::new()
    }
}

/// The class of a layout: block size 2^(MIN_SHIFT + class).
fn class_of(layout: Layout) -> Option<usize> {
    let bytes = layout
        .size()
        .max(layout.align())
        .max(MIN_BLOCK_BYTES)
        .checked_next_power_of_two()?;
    let class = (bytes.trailing_zeros() - MIN_SHIFT) as usize;
    (class < CLASSES).then_some(class)
}

fn block_bytes(class: usize) -> usize {
    block_bytes_const(class)
}

impl Header {
    fn pop(&self, class: usize) -> Option<*mut u8> {
        let head = &self.heads[class];
        let mut h = head.load(Ordering::Acquire);
        loop {
            let addr = h & ADDR_MASK;
            if addr == 0 {
                return None;
            }
            // SAFETY: `addr` is a block of the region (only blocks are
            // pushed), which stays mapped; the first word of a free block
            // is its link. If another thread or process popped it
            // meanwhile, the value read may be garbage, but the tag makes
            // the CAS below fail.
            let next = unsafe { (*(addr as *const AtomicU64)).load(Ordering::Relaxed) };
            let tag = (h >> ADDR_BITS).wrapping_add(1);
            match head.compare_exchange_weak(
                h,
                (tag << ADDR_BITS) | (next & ADDR_MASK),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(addr as *mut u8),
                Err(now) => h = now,
            }
        }
    }

    fn push(&self, class: usize, block: *mut u8) {
        let head = &self.heads[class];
        let mut h = head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `block` is a block of at least 16 bytes that the
            // caller owns (being freed); its first word becomes the link.
            unsafe { (*(block as *const AtomicU64)).store(h & ADDR_MASK, Ordering::Relaxed) };
            let tag = (h >> ADDR_BITS).wrapping_add(1);
            match head.compare_exchange_weak(
                h,
                (tag << ADDR_BITS) | block as u64,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => h = now,
            }
        }
    }

    /// Pushes the chain `first` .. `last` (linked through their first
    /// words, `last`'s link to be set here) with one CAS.
    fn push_chain(&self, class: usize, first: *mut u8, last: *mut u8) {
        let head = &self.heads[class];
        let mut h = head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `last` is a free block the caller owns (the chain is
            // private until the CAS below publishes it).
            unsafe { (*(last as *const AtomicU64)).store(h & ADDR_MASK, Ordering::Relaxed) };
            let tag = (h >> ADDR_BITS).wrapping_add(1);
            match head.compare_exchange_weak(
                h,
                (tag << ADDR_BITS) | first as u64,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => h = now,
            }
        }
    }

    fn bump(&self, class: usize) -> Option<*mut u8> {
        let bytes = block_bytes(class) as u64;
        let align = bytes.min(PAGE_BYTES as u64);
        let mut cur = self.bump.load(Ordering::Relaxed);
        loop {
            let start = cur.next_multiple_of(align);
            let end = start.checked_add(bytes)?;
            if end > HEAP_RESERVE_BYTES as u64 {
                return None;
            }
            match self
                .bump
                .compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some((HEAP_BASE_ADDR as u64 + start) as *mut u8),
                Err(now) => cur = now,
            }
        }
    }
}

/// A thread's private cache of free blocks (module essay).
struct ThreadCache {
    /// Caching is on for this thread.
    on: Cell<bool>,
    /// The thread is inside a cache operation (a signal handler that
    /// allocates then uses the shared stacks).
    busy: Cell<bool>,
    /// Per class: the first cached block (its first word links to the
    /// next), 0 when empty.
    heads: [Cell<usize>; CACHED_CLASSES],
    /// Per class: blocks cached.
    counts: [Cell<u32>; CACHED_CLASSES],
}

thread_local! {
    // Const-initialized and without a destructor: reaching it never
    // allocates, so the allocator may use it.
    static CACHE: ThreadCache = const {
        ThreadCache {
            on: Cell::new(false),
            busy: Cell::new(false),
            heads: [const { Cell::new(0) }; CACHED_CLASSES],
            counts: [const { Cell::new(0) }; CACHED_CLASSES],
        }
    };
}

/// The shared region's header; only valid once this process mapped it.
fn mapped_header() -> &'static Header {
    // SAFETY: called only with blocks of the region in hand (so it is
    // mapped, and stays mapped for the life of the process); the header
    // is zero-initialized atomics or was initialized by `init`.
    unsafe { &*(HEAP_BASE_ADDR as *const Header) }
}

/// Turns on the calling thread's private cache of small blocks (module
/// essay). For a thread that allocates and frees much of the designs'
/// metadata (a per-core worker); call [`flush_thread_cache`] before the
/// thread or process ends, or its cached blocks stay out of the shared
/// stacks.
pub fn enable_thread_cache() {
    let _ = CACHE.try_with(|c| c.on.set(true));
}

/// Turns off the calling thread's private cache and gives every block in
/// it back to the shared stacks.
pub fn flush_thread_cache() {
    let _ = CACHE.try_with(|c| {
        if c.busy.replace(true) {
            return;
        }
        c.on.set(false);
        for class in 0..CACHED_CLASSES {
            let first = c.heads[class].replace(0);
            if first == 0 {
                continue;
            }
            let mut last = first;
            // SAFETY: cached blocks are free blocks of the region owned
            // by this thread, linked through their first words.
            while let next @ 1.. = unsafe { *(last as *const usize) } {
                last = next;
            }
            mapped_header().push_chain(class, first as *mut u8, last as *mut u8);
            c.counts[class].set(0);
        }
        c.busy.set(false);
    });
}

/// Blocks the calling thread's cache holds now, all classes (tests).
pub fn thread_cache_blocks() -> u64 {
    CACHE
        .try_with(|c| c.counts.iter().map(|n| n.get() as u64).sum())
        .unwrap_or(0)
}

impl ThreadCache {
    /// A block of `class` from the cache, if on and not empty.
    fn pop(&self, class: usize) -> Option<*mut u8> {
        if !self.on.get() || class >= CACHED_CLASSES || self.busy.replace(true) {
            return None;
        }
        let head = self.heads[class].get();
        let got = (head != 0).then(|| {
            // SAFETY: a cached block is a free block of the region that
            // this thread owns; its first word links to the next one.
            let next = unsafe { *(head as *const usize) };
            self.heads[class].set(next);
            self.counts[class].set(self.counts[class].get() - 1);
            head as *mut u8
        });
        self.busy.set(false);
        got
    }

    /// Keeps `block` of `class` in the cache; false if off (the caller
    /// pushes it to the shared stack). A full cache gives half its
    /// blocks back first, as one chain.
    fn push(&self, class: usize, block: *mut u8) -> bool {
        if !self.on.get() || class >= CACHED_CLASSES || self.busy.replace(true) {
            return false;
        }
        let full = cache_blocks(class);
        if self.counts[class].get() >= full {
            let first = self.heads[class].get();
            let mut last = first;
            for _ in 1..full / 2 {
                // SAFETY: as in `pop`: `full` blocks are linked.
                last = unsafe { *(last as *const usize) };
            }
            // SAFETY: as above; the rest of the list stays cached.
            let rest = unsafe { *(last as *const usize) };
            self.heads[class].set(rest);
            self.counts[class].set(self.counts[class].get() - full / 2);
            mapped_header().push_chain(class, first as *mut u8, last as *mut u8);
        }
        // SAFETY: `block` is being freed by its owner, at least 16 bytes;
        // its first word becomes the link.
        unsafe { *(block as *mut usize) = self.heads[class].get() };
        self.heads[class].set(block as usize);
        self.counts[class].set(self.counts[class].get() + 1);
        self.busy.set(false);
        true
    }
}

const _: () = assert!(block_bytes_const(CACHED_CLASSES - 1) == CACHED_MAX_BYTES);

const fn block_bytes_const(class: usize) -> usize {
    1 << (class as u32 + MIN_SHIFT)
}

/// Blocks of `class` a thread's private cache holds when full.
const fn cache_blocks(class: usize) -> u32 {
    (CACHE_CLASS_BYTES / block_bytes_const(class)) as u32
}

// SAFETY: blocks are disjoint ranges of the region (each handed out by
// exactly one successful pop or bump CAS, or by the private cache of the
// one thread that freed it, and returned only by `dealloc`);
// a block of class c has 2^(4+c) >= max(size, align) bytes and is aligned
// to min(2^(4+c), page) >= align, since alignments above a page are
// refused. The region stays mapped for the life of the process.
unsafe impl GlobalAlloc for SharedHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() > PAGE_BYTES {
            return std::ptr::null_mut();
        }
        let Some(class) = class_of(layout) else {
            return std::ptr::null_mut();
        };
        if let Ok(Some(p)) = CACHE.try_with(|c| c.pop(class)) {
            return p;
        }
        let h = self.header();
        h.pop(class)
            .or_else(|| h.bump(class))
            .unwrap_or(std::ptr::null_mut())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let class = class_of(layout).expect("a layout that was allocated has a class");
        if CACHE.try_with(|c| c.push(class, ptr)) == Ok(true) {
            return;
        }
        self.header().push(class, ptr);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `GlobalAlloc::realloc`'s contract makes this a valid
        // layout (non-zero size, no overflow when rounded to align).
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if class_of(new) == class_of(layout) {
            return ptr;
        }
        // SAFETY: as `alloc`/`dealloc` above; `ptr` holds `layout.size()`
        // bytes and the new block at least `new_size`, and they are
        // disjoint (different blocks).
        unsafe {
            let p = self.alloc(new);
            if !p.is_null() {
                std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            p
        }
    }
}
