//! Address-space designs side by side: RadixVM (EuroSys 2013, §3.3-3.4),
//! Bonsai VM (ASPLOS 2012, §5.3, "pure RCU") and a Linux-style baseline,
//! behind one interface and over one MMU interface.
//!
//! An address space maps virtual pages to frames. Three operations change
//! the map (`mmap`, `munmap`, `mprotect`); one fills it lazily
//! (`pagefault`). The designs differ in what those operations share:
//!
//! ```text
//!  design   region/page metadata          mmap/munmap           pagefault          page table   shootdown targets
//!  radixvm  radix map, per-page metadata  range lock (§3.4)     1-page range lock  per CPU      CPUs in the page's set
//!  bonsai   Bonsai RCU tree of regions    one address-space lock lock-free lookup,  shared       every CPU using the AS
//!                                                                 leaf PT lock
//!  linux    RwLock<BTreeMap> of regions   write lock            read lock, leaf    shared       every CPU using the AS
//!                                                                 PT lock
//! ```
//!
//! One parameter, [`Design`], picks the design ([`new_space`]), as sv6
//! picks its page-table and shootdown schemes.
//!
//! A second parameter, [`Backend`], picks the MMU ([`new_space_on`]):
//! * the software MMU ([`mmu::sw`]): per-CPU TLBs and page tables are
//!   data structures in memory, a TLB or page-table miss calls
//!   `pagefault`, and a TLB shootdown is a message each target CPU's
//!   thread acknowledges (see [`shootdown`]). Frames are real memory from
//!   the `buddy` frame pool and every touch reads or writes them. Nothing
//!   changes the process's own page tables: every figure produced with
//!   it says "TLB simulated";
//! * the userfaultfd MMU ([`mmu::uffd`]): a real arena whose first touch
//!   is a real page fault, resolved by the design on the faulting thread
//!   with `UFFDIO_COPY`; unmapping is `madvise(MADV_DONTNEED)` and the
//!   kernel does the real TLB shootdown;
//! * the per-core MMU ([`percore`]): one pinned worker *process* per
//!   core, each with its own real page table (a process that runs on one
//!   CPU is an mm only that CPU walks, so its unmaps flush locally, with
//!   no IPI); the design lives in a shared heap at the same address in
//!   every worker, frames in one memfd; a fault installs the frame into
//!   the faulting worker's table only (`mmap` of the memfd page), and a
//!   shootdown is an acknowledged message to exactly the workers the
//!   design names (RadixVM: the page's CPU set), §3.3-3.4 and §4. Real:
//!   page tables, faults, TLBs, the kernel's flushes and IPIs. User-level:
//!   the shootdown messages. It runs only in the `radixvm-percore` binary
//!   (its global allocator is the shared heap); `memlab` runs it there.
//!
//! Layout, one module per concern:
//! * [`space`] — the [`AddressSpace`] trait, per-CPU attachment ([`Cpu`]),
//!   statistics, address allocation.
//! * [`mmu`] — the [`mmu::Mmu`] trait; [`mmu::sw`] the software MMU,
//!   [`mmu::uffd`] the userfaultfd MMU, [`mmu::probe`] the access probes
//!   both real-table backends use.
//! * [`percore`] — the per-core MMU, its shared heap and its worker
//!   runner.
//! * [`shootdown`] — the TLB-shootdown handshake.
//! * [`frames`] — frames from the buddy pool, segments (file-like backing).
//! * [`frameref`] — Refcache'd frame references (RadixVM's frames).
//! * [`designs`] — [`designs::radixvm`], [`designs::bonsai`],
//!   [`designs::linux`].
//! * [`bench`](mod@bench) — `mapbench` (RadixVM §5) and `faultbench` (Bonsai
//!   Fig. 16-18) as library functions.

#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bench;
pub mod designs;
pub mod frameref;
pub mod frames;
pub mod mmu;
pub mod percore;
pub mod shootdown;
pub mod space;

use std::fmt;
use std::sync::Arc;

pub use frames::{Frames, Segment};
pub use mmu::Backend;
pub use space::{AddressSpace, Cpu, Stats};

/// Bytes per page.
pub const PAGE_SIZE_BYTES: u64 = 4096;
/// CPUs an address space can have attached (one bit each in a `u64` set).
pub const MAX_CPUS: usize = 64;
/// Virtual addresses are below this (2 TiB: small enough for the
/// userfaultfd backend to reserve the whole range as its arena).
pub const ADDRESS_LIMIT_BYTES: u64 = 1 << 41;

/// Page protection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prot(u8);

impl Prot {
    /// No access.
    pub const NONE: Prot = Prot(0);
    /// Read only.
    pub const READ: Prot = Prot(1);
    /// Read and write.
    pub const READ_WRITE: Prot = Prot(3);

    /// Whether `access` is allowed.
    pub fn allows(self, access: Access) -> bool {
        match access {
            Access::Read => self.0 & 1 != 0,
            Access::Write => self.0 & 2 != 0,
        }
    }

    /// The raw bits (1 = read, 2 = write).
    pub fn bits(self) -> u8 {
        self.0
    }

    /// From raw bits; write implies read, as on x86.
    pub fn from_bits(bits: u8) -> Prot {
        if bits & 2 != 0 {
            Prot::READ_WRITE
        } else {
            Prot(bits & 1)
        }
    }
}

/// A memory access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// A load.
    Read,
    /// A store.
    Write,
}

/// What a mapping's pages hold.
#[derive(Clone, Debug)]
pub enum Backing {
    /// Zero-filled private frames, freed at munmap.
    Anonymous,
    /// The pages of a [`Segment`] (a file of frames) from `offset_pages`;
    /// shared by every mapping of the segment, freed with the segment.
    Segment {
        /// The segment.
        segment: Arc<Segment>,
        /// First page of the segment mapped.
        offset_pages: u64,
    },
}

impl Backing {
    /// The same backing advanced by `pages` (for the tail of a split).
    pub fn advanced(&self, pages: u64) -> Backing {
        match self {
            Backing::Anonymous => Backing::Anonymous,
            Backing::Segment {
                segment,
                offset_pages,
            } => Backing::Segment {
                segment: segment.clone(),
                offset_pages: offset_pages + pages,
            },
        }
    }
}

/// Where `mmap` places a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapAt {
    /// Exactly here, replacing whatever was mapped (`MAP_FIXED`).
    Fixed(u64),
    /// Here if the range is free, else anywhere.
    Hint(u64),
    /// Anywhere (a per-CPU window, so concurrent mmaps share nothing).
    Anywhere,
}

/// Why an operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmError {
    /// No mapping at this address (SIGSEGV).
    Unmapped(u64),
    /// The mapping forbids the access (SIGSEGV).
    Protection(u64),
    /// Address or length not page-aligned, zero, or out of range.
    Invalid,
    /// The frame pool is exhausted.
    OutOfMemory,
    /// A segment mapping reaches past the segment's end.
    PastSegmentEnd,
}

impl fmt::Display for VmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VmError::Unmapped(a) => write!(f, "no mapping at {a:#x}"),
            VmError::Protection(a) => write!(f, "access to {a:#x} not allowed"),
            VmError::Invalid => f.write_str("invalid address or length"),
            VmError::OutOfMemory => f.write_str("out of frames"),
            VmError::PastSegmentEnd => f.write_str("mapping reaches past the segment"),
        }
    }
}

impl std::error::Error for VmError {}

/// The three designs; one parameter apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Design {
    /// RadixVM (§3.3-3.4).
    RadixVm,
    /// Bonsai VM, "pure RCU" (Bonsai §5.3).
    Bonsai,
    /// Linux-style: RwLock over a region tree.
    Linux,
}

impl Design {
    /// All designs, in report order.
    pub const ALL: [Design; 3] = [Design::RadixVm, Design::Bonsai, Design::Linux];

    /// Name on command lines and in output.
    pub fn name(self) -> &'static str {
        match self {
            Design::RadixVm => "radixvm",
            Design::Bonsai => "bonsai",
            Design::Linux => "linux",
        }
    }
}

impl std::str::FromStr for Design {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Design::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown design {s:?} (radixvm, bonsai, linux)"))
    }
}

impl fmt::Display for Design {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A new empty address space of `design` over a software MMU drawing
/// frames from `frames`.
pub fn new_space(design: Design, frames: &Arc<Frames>) -> Arc<dyn AddressSpace> {
    new_space_on(design, Backend::Software, frames).expect("the software MMU always builds")
}

/// A new empty address space of `design` over `backend`. Fails for the
/// userfaultfd backend where the kernel offers no userfaultfd, and for the
/// per-core backend outside the `radixvm-percore` binary (or with a frame
/// pool that is not a memfd), with [`mmu::uffd::UffdError`].
pub fn new_space_on(
    design: Design,
    backend: Backend,
    frames: &Arc<Frames>,
) -> Result<Arc<dyn AddressSpace>, mmu::uffd::UffdError> {
    let mmu = backend.new_mmu(frames, design == Design::RadixVm)?;
    Ok(match design {
        Design::RadixVm => {
            let mut space = designs::radixvm::RadixVm::with_mmu(mmu);
            // The binaries check the variable and refuse a bad value.
            space.set_fault_around_pages(designs::radixvm::fault_around_from_env().unwrap_or(1));
            Arc::new(space)
        }
        Design::Bonsai => Arc::new(designs::bonsai::BonsaiVm::with_mmu(mmu)),
        Design::Linux => Arc::new(designs::linux::LinuxVm::with_mmu(mmu)),
    })
}
