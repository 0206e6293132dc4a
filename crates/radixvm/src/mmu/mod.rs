//! The MMU interface the designs program against.
//!
//! A design decides *what* is mapped; the MMU holds the translations
//! (page tables, TLBs) and performs shootdowns. The designs only
//! install, clear and shoot down; user accesses go through
//! [`Mmu::access`], which calls back into the design's `pagefault` on a
//! miss. [`sw`] is the software MMU (simulated TLB).

pub mod sw;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use buddy::FrameNo;
use crossbeam_utils::CachePadded;

use crate::{Access, Frames, Prot, MAX_CPUS};

/// A page-table entry: present (holds a frame), readable, writable, frame
/// number. A present entry without read is a `PROT_NONE` page that keeps
/// its frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pte(u64);

const PTE_PRESENT: u64 = 1;
const PTE_READ: u64 = 2;
const PTE_WRITE: u64 = 4;
const PTE_FRAME_SHIFT: u32 = 12;

impl Pte {
    /// No translation.
    pub const EMPTY: Pte = Pte(0);

    /// A present entry for `frame` allowing what `prot` allows.
    pub fn new(frame: FrameNo, prot: Prot) -> Pte {
        let mut bits = (frame << PTE_FRAME_SHIFT) | PTE_PRESENT;
        if prot.allows(Access::Read) {
            bits |= PTE_READ;
        }
        if prot.allows(Access::Write) {
            bits |= PTE_WRITE;
        }
        Pte(bits)
    }

    /// Whether a translation is present.
    pub fn present(self) -> bool {
        self.0 & PTE_PRESENT != 0
    }

    /// Whether stores are allowed.
    pub fn writable(self) -> bool {
        self.0 & PTE_WRITE != 0
    }

    /// Whether `access` may use it.
    pub fn permits(self, access: Access) -> bool {
        self.present()
            && match access {
                Access::Read => self.0 & PTE_READ != 0,
                Access::Write => self.0 & PTE_WRITE != 0,
            }
    }

    /// The frame.
    pub fn frame(self) -> FrameNo {
        self.0 >> PTE_FRAME_SHIFT
    }

    /// The raw word.
    pub fn bits(self) -> u64 {
        self.0
    }

    /// From a raw word.
    pub fn from_bits(bits: u64) -> Pte {
        Pte(bits)
    }
}

/// Why [`Mmu::access`] did not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// No usable translation: the caller takes a page fault.
    Fault,
}

/// What the MMU counts, per CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Page faults handled by the design.
    Faults,
    /// mmap calls.
    Mmaps,
    /// munmap calls.
    Munmaps,
    /// mprotect calls.
    Mprotects,
    /// Shootdowns with at least one remote target.
    Shootdowns,
    /// Remote CPUs targeted, summed over shootdowns.
    ShootdownTargets,
    /// Targets that acknowledged themselves.
    AcksSelf,
    /// Targets flushed by the initiator on their behalf.
    AcksProxy,
    /// Accesses that missed the TLB.
    TlbMisses,
    /// Accesses that reached a frame not live (must stay zero).
    StaleTouches,
}

/// Number of [`Counter`]s.
pub const COUNTERS: usize = Counter::StaleTouches as usize + 1;

/// Per-CPU event counters: each CPU writes only its own cache line.
pub struct Counters {
    per_cpu: Box<[CachePadded<[AtomicU64; COUNTERS]>]>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            per_cpu: (0..MAX_CPUS)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters").finish_non_exhaustive()
    }
}

impl Counters {
    /// Adds `n` to `counter` of `cpu`.
    pub fn add(&self, cpu: usize, counter: Counter, n: u64) {
        self.per_cpu[cpu][counter as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Sum over CPUs.
    pub fn total(&self, counter: Counter) -> u64 {
        self.per_cpu
            .iter()
            .map(|c| c[counter as usize].load(Ordering::Relaxed))
            .sum()
    }
}

/// The MMU interface.
pub trait Mmu: Send + Sync {
    /// Description for output lines (says whether the TLB is simulated).
    fn describe(&self) -> &'static str;

    /// The frame pool.
    fn frames(&self) -> &Arc<Frames>;

    /// Event counters.
    fn counters(&self) -> &Counters;

    /// Marks `cpu` as running in this address space; panics if it already
    /// is.
    fn attach(&self, cpu: usize);

    /// Flushes `cpu`'s TLB and marks it gone.
    fn detach(&self, cpu: usize);

    /// CPUs attached now.
    fn attached(&self) -> u64;

    /// The page table `cpu` walks (its own with per-CPU tables, else 0).
    fn table_of(&self, cpu: usize) -> usize;

    /// Runs `update` on the entry for `vpn` in `table` under that entry's
    /// page-table lock (a lock per page-table page, as Linux's split PTL),
    /// storing what it returns. Returns the entry as left.
    fn update_pte(&self, table: usize, vpn: u64, update: &mut dyn FnMut(Pte) -> Pte) -> Pte;

    /// Clears every present entry for `vpns` in `table` (under the page
    /// table locks), appending `(vpn, old entry)` to `out`.
    fn clear(&self, table: usize, vpns: Range<u64>, out: &mut Vec<(u64, Pte)>);

    /// Flushes `vpns` from the TLBs of `targets` and returns once each has
    /// (the initiator's own TLB is flushed locally and not counted as a
    /// shootdown target).
    fn shootdown(&self, initiator: usize, targets: u64, vpns: Range<u64>);

    /// A user access by `cpu` to page `vpn` at byte `offset`: through the
    /// TLB, then the page table; on success runs `touch` with the byte's
    /// address while the translation is guaranteed (no shootdown of it
    /// can complete meanwhile).
    fn access(
        &self,
        cpu: usize,
        vpn: u64,
        offset: usize,
        access: Access,
        touch: &mut dyn FnMut(*mut u8),
    ) -> Result<(), Miss>;

    /// Page-table pages allocated, over all tables.
    fn page_table_pages(&self) -> u64;
}
