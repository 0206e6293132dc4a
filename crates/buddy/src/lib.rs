//! # buddy — physical frames for everything above
//!
//! This crate is the bottom of the stack: the key-value store's blocks, the
//! segments' frames and the VM designs' pages all come from here. It
//! implements the **distributed buddy allocator** of the fos thesis
//! (Distributed Buddy Allocator, ch. 4) adapted from message-passing servers
//! to shared memory, and two baselines behind the same [`FrameAllocator`]
//! trait so the three can be measured side by side:
//!
//! | kind | module | what it is |
//! |---|---|---|
//! | [`AllocatorKind::Distributed`] | [`distributed`] | a fleet of per-CPU heaps, each a buddy over the ranges it owns plus a sparse set of foreign frames; borrowing, returning and forwarded frees travel through per-heap lock-free inboxes |
//! | [`AllocatorKind::GlobalLock`] | [`global`] | one buddy allocator behind one lock (the "big lock" of §2.1.1) |
//! | [`AllocatorKind::LinuxPcp`] | [`linuxlike`] | one zone buddy behind one lock plus per-CPU single-frame caches, as Linux does |
//!
//! "Physical" means *pool offset*: a frame is 4 KiB of one large mapping, the
//! [`FramePool`](pool::FramePool). Allocators deal in frame numbers only;
//! the pool turns them into addresses. Blocks are `2^order` frames, aligned
//! to their size in frame numbers.
//!
//! The algorithmic cores ([`dense`], [`sparse`], [`check`], [`stats`]) need
//! only `core` + `alloc`; the crate builds `no_std` with
//! `--no-default-features`. Threads, locks, queues and `mmap` live in the
//! `std` modules.

#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

extern crate alloc;

pub mod check;
pub mod dense;
pub mod sparse;
pub mod stats;

#[cfg(feature = "std")]
pub mod distributed;
#[cfg(feature = "std")]
pub mod global;
#[cfg(feature = "std")]
pub mod linuxlike;
#[cfg(feature = "std")]
pub mod pool;

use core::fmt;

pub use stats::{HeapStats, Stats};

/// A frame number: byte offset in the pool divided by [`FRAME_SIZE_BYTES`].
pub type FrameNo = u64;

/// Size of one frame.
pub const FRAME_SIZE_BYTES: usize = 4096;
/// log2 of [`FRAME_SIZE_BYTES`].
pub const FRAME_SHIFT: u32 = 12;
/// Number of order slots in fixed-size per-order arrays (orders `0..ORDER_SLOTS`).
pub const ORDER_SLOTS: usize = 32;
/// Largest maximum order a caller may configure (2^26 frames = 256 GiB blocks).
pub const MAX_CONFIGURABLE_ORDER: u32 = 26;
/// Default cap on the maximum order: 2^18 frames = 1 GiB blocks.
pub const DEFAULT_MAX_ORDER_CAP: u32 = 18;

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// The request asked for more than the allocator's maximum order.
    OrderTooLarge {
        /// The order asked for.
        order: u32,
        /// The allocator's maximum order.
        max_order: u32,
    },
    /// No block of this order could be found within the bounded search.
    OutOfMemory {
        /// The order asked for.
        order: u32,
    },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AllocError::OrderTooLarge { order, max_order } => write!(
                f,
                "order {order} ({} KiB) exceeds the maximum order {max_order}",
                (FRAME_SIZE_BYTES as u64) << order >> 10
            ),
            AllocError::OutOfMemory { order } => {
                write!(f, "out of memory: no free block of order {order}")
            }
        }
    }
}

/// Why a free was rejected. Nothing is changed when a free is rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeError {
    /// The frame number is past the end of the pool.
    OutOfPool {
        /// The frame freed.
        frame: FrameNo,
        /// Frames in the pool.
        frames: u64,
    },
    /// The frame is not aligned to the order given, so cannot start a block of it.
    Misaligned {
        /// The frame freed.
        frame: FrameNo,
        /// The order given.
        order: u32,
    },
    /// The order given exceeds the allocator's maximum order.
    OrderTooLarge {
        /// The order given.
        order: u32,
        /// The allocator's maximum order.
        max_order: u32,
    },
    /// The frame heads no live allocation: a double free, or never allocated.
    NotAllocated {
        /// The frame freed.
        frame: FrameNo,
    },
    /// The frame lies inside a live allocation that starts elsewhere.
    NotAllocationStart {
        /// The frame freed.
        frame: FrameNo,
        /// Where the enclosing allocation starts.
        head: FrameNo,
    },
    /// The frame heads a live allocation of another order.
    WrongOrder {
        /// The frame freed.
        frame: FrameNo,
        /// The order given to free.
        given: u32,
        /// The order it was allocated with.
        allocated: u32,
    },
    /// The allocator handed out a frame that was still live (an allocator bug).
    AlreadyAllocated {
        /// The frame.
        frame: FrameNo,
    },
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FreeError::OutOfPool { frame, frames } => {
                write!(f, "frame {frame} is outside the pool of {frames} frames")
            }
            FreeError::Misaligned { frame, order } => {
                write!(f, "frame {frame} is not aligned to order {order}")
            }
            FreeError::OrderTooLarge { order, max_order } => {
                write!(f, "order {order} exceeds the maximum order {max_order}")
            }
            FreeError::NotAllocated { frame } => {
                write!(f, "frame {frame} is not allocated (double free?)")
            }
            FreeError::NotAllocationStart { frame, head } => write!(
                f,
                "frame {frame} is inside the allocation starting at frame {head}, not its start"
            ),
            FreeError::WrongOrder {
                frame,
                given,
                allocated,
            } => write!(
                f,
                "frame {frame} was allocated with order {allocated} but freed with order {given}"
            ),
            FreeError::AlreadyAllocated { frame } => {
                write!(f, "allocator bug: frame {frame} handed out while live")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for AllocError {}
#[cfg(feature = "std")]
impl std::error::Error for FreeError {}

/// Validate the arguments of a free that do not need allocator state.
pub fn validate_free(
    frame: FrameNo,
    order: u32,
    frames: u64,
    max_order: u32,
) -> Result<(), FreeError> {
    if order > max_order {
        return Err(FreeError::OrderTooLarge { order, max_order });
    }
    if frame >= frames || frame + (1u64 << order) > frames {
        return Err(FreeError::OutOfPool { frame, frames });
    }
    if frame & ((1u64 << order) - 1) != 0 {
        return Err(FreeError::Misaligned { frame, order });
    }
    Ok(())
}

/// [`FrameAllocator::split`] for every allocator: the buddies keep lists
/// of free blocks only, so a split checks `(frame, order)` as a free does
/// and `into_order` ≤ `order`, then changes nothing but the allocation
/// table, when there is one (`BuddyConfig::check_frees`).
pub(crate) fn split_checked(
    check: Option<&check::AllocTable>,
    (frame, order, into_order): (FrameNo, u32, u32),
    frames: u64,
    max_order: u32,
) -> Result<(), FreeError> {
    validate_free(frame, order, frames, max_order)?;
    if into_order > order {
        return Err(FreeError::OrderTooLarge {
            order: into_order,
            max_order: order,
        });
    }
    match check {
        Some(t) => t.on_split(frame, order, into_order),
        None => Ok(()),
    }
}

/// The default maximum order for a pool of `frames` frames split among
/// `heaps` heaps: 1 GiB blocks, or the largest power of two that still gives
/// every heap at least one ownership range, whichever is smaller.
///
/// The default is "1 GiB or the pool size"; with many heaps and a
/// small pool, pool-sized blocks would leave all but one heap owning nothing,
/// so we divide by the number of heaps first.
pub fn default_max_order(frames: u64, heaps: usize) -> u32 {
    let per_heap = (frames / heaps.max(1) as u64).max(1);
    let fit = 63 - per_heap.leading_zeros();
    fit.min(DEFAULT_MAX_ORDER_CAP)
}

/// `heap % heaps`, without a division in the common case `heap < heaps`
/// (a 64-bit divide costs more than the rest of a local allocation's
/// bookkeeping).
#[inline(always)]
pub fn heap_index(heap: usize, heaps: usize) -> usize {
    if heap < heaps {
        heap
    } else {
        heap % heaps
    }
}

/// The interface all three allocators share.
///
/// `heap` arguments name the CPU-local heap to use (for the global-lock
/// baseline they are ignored; for the Linux-style one they pick the per-CPU
/// cache). [`FrameAllocator::alloc`] and [`FrameAllocator::free`] use the
/// calling thread's current CPU.
pub trait FrameAllocator: Send + Sync {
    /// Short name used in benchmark output.
    fn name(&self) -> &'static str;
    /// Frames managed.
    fn total_frames(&self) -> u64;
    /// Largest order that can be allocated.
    fn max_order(&self) -> u32;
    /// Number of heaps (or per-CPU caches); heap ids are `0..num_heaps()`.
    fn num_heaps(&self) -> usize;
    /// Allocate `2^order` contiguous frames through heap `heap`.
    fn alloc_on(&self, heap: usize, order: u32) -> Result<FrameNo, AllocError>;
    /// Free a block through heap `heap`.
    fn free_on(&self, heap: usize, frame: FrameNo, order: u32) -> Result<(), FreeError>;
    /// Split the live allocation of `2^order` frames at `frame` into
    /// allocations of `2^into_order` frames each, which are then freed one
    /// by one (Linux's `split_page`). The buddies keep lists of free
    /// blocks only, so this changes nothing but the allocation table
    /// (`BuddyConfig::check_frees`), which it checks like a free.
    fn split(&self, frame: FrameNo, order: u32, into_order: u32) -> Result<(), FreeError>;
    /// A snapshot of the statistics (exact when no thread is allocating).
    fn stats(&self) -> Stats;
    /// Let all asynchronous work finish: deliver queued messages, send
    /// foreign frames home, flush caches. Afterwards, when no thread is
    /// allocating, every free frame sits coalesced with its buddies.
    fn quiesce(&self);

    /// The heap of the calling thread's current CPU.
    #[cfg(feature = "std")]
    fn local_heap(&self) -> usize {
        heap_index(topology::current_cpu(), self.num_heaps())
    }
    /// Allocate on the calling thread's local heap.
    #[cfg(feature = "std")]
    fn alloc(&self, order: u32) -> Result<FrameNo, AllocError> {
        self.alloc_on(self.local_heap(), order)
    }
    /// Free on the calling thread's local heap.
    #[cfg(feature = "std")]
    fn free(&self, frame: FrameNo, order: u32) -> Result<(), FreeError> {
        self.free_on(self.local_heap(), frame, order)
    }
}

/// Which allocator to build; one parameter selects the variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocatorKind {
    /// The distributed buddy allocator (fos thesis ch. 4).
    Distributed,
    /// One buddy allocator behind one global lock.
    GlobalLock,
    /// Linux-style: a global zone buddy plus per-CPU single-frame caches.
    LinuxPcp,
}

impl AllocatorKind {
    /// All kinds, in the order benchmarks report them.
    pub const ALL: [AllocatorKind; 3] = [
        AllocatorKind::Distributed,
        AllocatorKind::GlobalLock,
        AllocatorKind::LinuxPcp,
    ];

    /// The name used on command lines and in output.
    pub fn name(self) -> &'static str {
        match self {
            AllocatorKind::Distributed => "distributed",
            AllocatorKind::GlobalLock => "global-lock",
            AllocatorKind::LinuxPcp => "linux-pcp",
        }
    }
}

impl core::str::FromStr for AllocatorKind {
    type Err = alloc::string::String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocatorKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                alloc::format!("unknown allocator {s:?} (distributed, global-lock, linux-pcp)")
            })
    }
}

impl fmt::Display for AllocatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Tunables. The defaults are the ones the docs and benchmarks use.
#[derive(Clone, Debug)]
pub struct BuddyConfig {
    /// Number of heaps (distributed) or per-CPU caches (linux-pcp).
    /// `None` = one per online CPU.
    pub heaps: Option<usize>,
    /// Maximum order. `None` = [`default_max_order`].
    pub max_order: Option<u32>,
    /// Keep the per-frame allocation table and reject bad frees.
    pub check_frees: bool,
    /// Low watermark, in thousandths of the estimated balanced share of free
    /// frames per heap: below it a heap asks a peer to lend.
    pub low_watermark_permille: u64,
    /// High watermark, in thousandths of the balanced share: above it a heap
    /// forwards foreign frees and sends foreign frames home.
    pub high_watermark_permille: u64,
    /// Rounds of synchronous borrowing before an allocation reports out of
    /// memory (the bounded "no memory for a period of time" of §4.1.3).
    pub oom_rounds: u32,
    /// Linux-style baseline: frames moved between a per-CPU cache and the zone at once.
    pub pcp_batch_frames: usize,
    /// Linux-style baseline: a per-CPU cache above this drains a batch to the zone.
    pub pcp_high_frames: usize,
}

/// Default low watermark: a quarter of the balanced share.
pub const DEFAULT_LOW_WATERMARK_PERMILLE: u64 = 250;
/// Default high watermark: one and a half times the balanced share.
pub const DEFAULT_HIGH_WATERMARK_PERMILLE: u64 = 1500;
/// Default rounds of borrowing before out of memory.
pub const DEFAULT_OOM_ROUNDS: u32 = 3;
/// Linux's per-CPU page-list batch for a large zone.
pub const DEFAULT_PCP_BATCH_FRAMES: usize = 63;
/// Linux's per-CPU page-list high mark (6 batches).
pub const DEFAULT_PCP_HIGH_FRAMES: usize = 6 * DEFAULT_PCP_BATCH_FRAMES;

impl Default for BuddyConfig {
    fn default() -> Self {
        BuddyConfig {
            heaps: None,
            max_order: None,
            check_frees: cfg!(debug_assertions),
            low_watermark_permille: DEFAULT_LOW_WATERMARK_PERMILLE,
            high_watermark_permille: DEFAULT_HIGH_WATERMARK_PERMILLE,
            oom_rounds: DEFAULT_OOM_ROUNDS,
            pcp_batch_frames: DEFAULT_PCP_BATCH_FRAMES,
            pcp_high_frames: DEFAULT_PCP_HIGH_FRAMES,
        }
    }
}

impl BuddyConfig {
    /// Heaps to use: the configured number or one per online CPU.
    #[cfg(feature = "std")]
    pub fn heaps_or_cpus(&self) -> usize {
        self.heaps
            .unwrap_or_else(|| topology::online_cpus().len())
            .max(1)
    }

    /// Maximum order for `frames` frames and `heaps` heaps, validated.
    pub fn resolve_max_order(&self, frames: u64, heaps: usize) -> Result<u32, ConfigError> {
        if frames == 0 {
            return Err(ConfigError::EmptyPool);
        }
        let order = self
            .max_order
            .unwrap_or_else(|| default_max_order(frames, heaps));
        if order > MAX_CONFIGURABLE_ORDER || (1u64 << order) > frames {
            return Err(ConfigError::MaxOrder { order, frames });
        }
        Ok(order)
    }
}

/// A configuration that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The pool has no frames.
    EmptyPool,
    /// The maximum order is larger than the pool or than supported.
    MaxOrder {
        /// The order asked for.
        order: u32,
        /// Frames in the pool.
        frames: u64,
    },
    /// More heaps than a heap id can name, or zero.
    Heaps(usize),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::EmptyPool => write!(f, "the pool has no frames"),
            ConfigError::MaxOrder { order, frames } => write!(
                f,
                "maximum order {order} does not fit a pool of {frames} frames (limit {MAX_CONFIGURABLE_ORDER})"
            ),
            ConfigError::Heaps(n) => write!(f, "invalid number of heaps: {n}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ConfigError {}

/// Build an allocator of `kind` over frames `0..frames`.
#[cfg(feature = "std")]
pub fn new_allocator(
    kind: AllocatorKind,
    frames: u64,
    config: &BuddyConfig,
) -> Result<alloc::boxed::Box<dyn FrameAllocator>, ConfigError> {
    Ok(match kind {
        AllocatorKind::Distributed => {
            alloc::boxed::Box::new(distributed::DistributedBuddy::new(frames, config)?)
        }
        AllocatorKind::GlobalLock => {
            alloc::boxed::Box::new(global::GlobalLockBuddy::new(frames, config)?)
        }
        AllocatorKind::LinuxPcp => {
            alloc::boxed::Box::new(linuxlike::PcpBuddy::new(frames, config)?)
        }
    })
}
