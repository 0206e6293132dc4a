//! The MMU interface the designs program against.
//!
//! A design decides *what* is mapped; the MMU holds the translations
//! (page tables, TLBs) and performs shootdowns. The designs only
//! install, clear and shoot down; user accesses go through
//! [`Mmu::access`], which reports a miss so that the caller runs the
//! design's `pagefault` and retries, as hardware re-executes a faulting
//! instruction.
//!
//! Three backends, chosen by one parameter ([`Backend`]):
//! * [`sw`] — the software MMU: page tables and per-CPU TLBs are data
//!   structures, shootdowns are inter-thread handshakes. The TLB is
//!   simulated and every output line says so.
//! * [`uffd`] — the userfaultfd MMU: a real arena whose first touch
//!   raises a real fault; installs are `UFFDIO_COPY`/`UFFDIO_ZEROPAGE`,
//!   zaps are `madvise(MADV_DONTNEED)`, and the kernel does the real TLB
//!   work.
//! * [`crate::percore`] — one worker process per core with its own real
//!   page table; shootdowns are user-level messages to exactly the cores
//!   the design names, the kernel's flushes are local.

pub mod probe;
pub mod sw;
pub mod uffd;

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
/// The frame outlives the mapping (a segment's page): a backend that
/// keeps a copy of the page elsewhere must write it back when clearing.
const PTE_SHARED: u64 = 8;
/// Bits below the frame number a backend may use for itself; designs
/// never see them.
pub const PTE_BACKEND_BITS: u64 = 0xff0;
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

    /// The same entry marked as mapping a frame that outlives the
    /// mapping (segment pages).
    pub fn shared(self) -> Pte {
        Pte(self.0 | PTE_SHARED)
    }

    /// Whether the frame outlives the mapping.
    pub fn is_shared(self) -> bool {
        self.0 & PTE_SHARED != 0
    }

    /// The same frame (and sharing) with protection `prot`.
    pub fn with_prot(self, prot: Prot) -> Pte {
        let mut new = Pte::new(self.frame(), prot);
        new.0 |= self.0 & PTE_SHARED;
        new
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

/// One user memory operation on one byte, as one instruction performs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A load; [`Mmu::access`] returns the byte.
    Load,
    /// A store of the byte.
    Store(u8),
    /// An access that changes nothing: a load for `Read`, an atomic
    /// `or` of 0 for `Write` (a store as far as the MMU is concerned).
    Touch(Access),
}

impl Op {
    /// The access the MMU checks.
    pub fn access(self) -> Access {
        match self {
            Op::Load => Access::Read,
            Op::Store(_) => Access::Write,
            Op::Touch(a) => a,
        }
    }

    /// Performs the operation on `p`; returns the byte loaded (0 for
    /// stores).
    ///
    /// # Safety
    /// `p` is valid for a one-byte read and write (or read, for loads)
    /// for the duration of the call; other threads may access it
    /// concurrently (the accesses are volatile or atomic).
    pub unsafe fn perform(self, p: *mut u8) -> u8 {
        match self {
            // SAFETY: the caller guarantees `p` is valid for a one-byte read
            // for the call (`# Safety`); a byte needs no alignment.
            Op::Load | Op::Touch(Access::Read) => unsafe { p.read_volatile() },
            Op::Store(v) => {
                // SAFETY: the caller guarantees `p` is valid for a one-byte
                // write for the call (`# Safety`).
                unsafe { p.write_volatile(v) };
                0
            }
            Op::Touch(Access::Write) => {
                // SAFETY: the caller guarantees `p` is valid for a one-byte
                // read and write for the call, and a byte is always aligned
                // for an AtomicU8; concurrent accesses are atomic or
                // volatile, never a plain `&mut`.
                unsafe { std::sync::atomic::AtomicU8::from_ptr(p) }.fetch_or(0, Ordering::Relaxed);
                0
            }
        }
    }
}

/// Which MMU an address space runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// [`sw::SoftMmu`]: simulated TLBs and page tables.
    Software,
    /// [`uffd::UffdMmu`]: a real arena, real faults, the kernel's TLB.
    Userfaultfd,
    /// [`crate::percore::PercoreMmu`]: a worker process per core, each
    /// with its own real page table; user-level targeted shootdowns.
    Percore,
}

impl Backend {
    /// All, in report order.
    pub const ALL: [Backend; 3] = [Backend::Software, Backend::Userfaultfd, Backend::Percore];

    /// Name on command lines and in output.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Software => "sw",
            Backend::Userfaultfd => "uffd",
            Backend::Percore => "percore",
        }
    }

    /// What the TLB is: `"simulated"` or `"real"`.
    pub fn tlb(self) -> &'static str {
        match self {
            Backend::Software => "simulated",
            Backend::Userfaultfd | Backend::Percore => "real",
        }
    }

    /// A new MMU of this kind; `per_cpu_tables` asks for one page table
    /// per CPU (the userfaultfd backend has the process's one real table
    /// and ignores it).
    pub fn new_mmu(
        self,
        frames: &Arc<Frames>,
        per_cpu_tables: bool,
    ) -> Result<Box<dyn Mmu>, uffd::UffdError> {
        match self {
            Backend::Software => Ok(Box::new(sw::SoftMmu::new(frames, per_cpu_tables))),
            Backend::Userfaultfd => Ok(Box::new(uffd::UffdMmu::new(frames)?)),
            Backend::Percore => {
                crate::percore::available().map_err(uffd::UffdError::Unavailable)?;
                Ok(Box::new(
                    crate::percore::PercoreMmu::new(frames, per_cpu_tables)
                        .map_err(|e| uffd::UffdError::Os("per-core MMU", e))?,
                ))
            }
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| format!("unknown backend {s:?} (sw, uffd, percore)"))
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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
    /// Accesses that missed the TLB (software MMU) or took a real fault
    /// (userfaultfd MMU).
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

    /// The count of `counter` on `cpu`.
    pub fn get(&self, cpu: usize, counter: Counter) -> u64 {
        self.per_cpu[cpu][counter as usize].load(Ordering::Relaxed)
    }

    /// Sum over CPUs.
    pub fn total(&self, counter: Counter) -> u64 {
        self.per_cpu
            .iter()
            .map(|c| c[counter as usize].load(Ordering::Relaxed))
            .sum()
    }
}

/// The set of CPUs attached to an MMU, a bit per CPU (shared by the
/// backends' `attach` / `detach` / `attached`).
#[derive(Default)]
pub struct AttachedCpus(CachePadded<AtomicU64>);

impl std::fmt::Debug for AttachedCpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AttachedCpus({:#x})", self.get())
    }
}

impl AttachedCpus {
    /// Adds `cpu`; panics if it is out of range or already attached.
    pub fn attach(&self, cpu: usize) {
        assert!(cpu < MAX_CPUS, "cpu {cpu} out of range");
        let was = self.0.fetch_or(1 << cpu, Ordering::SeqCst);
        assert_eq!(was & (1 << cpu), 0, "cpu {cpu} attached twice");
    }

    /// Removes `cpu`.
    pub fn detach(&self, cpu: usize) {
        self.0.fetch_and(!(1 << cpu), Ordering::SeqCst);
    }

    /// The attached CPUs as a bit mask.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The MMU interface.
pub trait Mmu: Send + Sync {
    /// Description for output lines (says whether the TLB is simulated).
    fn describe(&self) -> &'static str;

    /// Which backend this is.
    fn backend(&self) -> Backend;

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

    /// Sets the empty entries for `first_vpn + i` in `table` to `ptes[i]`,
    /// a run the design filled in one fault (its fault-around; the caller
    /// holds the design's locks of the whole run). The per-core MMU makes
    /// a run of consecutive frames real with one system call; the default
    /// is one [`Mmu::update_pte`] per page.
    fn install_run(&self, table: usize, first_vpn: u64, ptes: &[Pte]) {
        for (vpn, &pte) in (first_vpn..).zip(ptes) {
            self.update_pte(table, vpn, &mut |_| pte);
        }
    }

    /// Clears every present entry for `vpns` in `table` (under the page
    /// table locks), appending `(vpn, old entry)` to `out`.
    fn clear(&self, table: usize, vpns: Range<u64>, out: &mut Vec<(u64, Pte)>);

    /// Flushes `vpns` from the TLBs of `targets` and returns once each has
    /// (the initiator's own TLB is flushed locally and not counted as a
    /// shootdown target).
    fn shootdown(&self, initiator: usize, targets: u64, vpns: Range<u64>);

    /// A user access by `cpu` to page `vpn` at byte `offset`: through the
    /// TLB, then the page table; on success performs `op` while the
    /// translation is guaranteed (no shootdown of it can complete
    /// meanwhile) and returns the byte loaded.
    fn access(&self, cpu: usize, vpn: u64, offset: usize, op: Op) -> Result<u8, Miss>;

    /// Page-table pages allocated, over all tables.
    fn page_table_pages(&self) -> u64;

    /// This MMU as the per-core MMU, if it is one.
    fn percore(&self) -> Option<&crate::percore::PercoreMmu> {
        None
    }
}
