//! The address-space interface, per-CPU attachment and statistics.
//!
//! Every design implements [`AddressSpace`]: `mmap` (fixed, hint or
//! anywhere; anonymous or segment backing), `munmap`, `mprotect` and
//! `pagefault`. Threads act as CPUs: a thread [`attach`](Cpu::attach)es
//! under a CPU id (its TLB, its shootdown mailbox, its bit in the
//! address space's CPU set) and works through the returned [`Cpu`] guard;
//! dropping it detaches (flushes the CPU's TLB and clears its bit).
//!
//! User memory accesses ([`Cpu::read`], [`Cpu::write`], [`Cpu::touch`])
//! go through the MMU: TLB, page table, and on a miss the design's
//! `pagefault`, then the access again, as hardware retries a faulting
//! instruction.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::mmu::{Counter, Mmu, Op};
use crate::{
    Access, Backing, Design, MapAt, Prot, VmError, ADDRESS_LIMIT_BYTES, MAX_CPUS, PAGE_SIZE_BYTES,
};

/// An address space (one of the designs).
pub trait AddressSpace: Send + Sync {
    /// Which design.
    fn design(&self) -> Design;

    /// The MMU holding its translations.
    fn mmu(&self) -> &dyn Mmu;

    /// Maps `len_bytes` (page multiple) at `at` with `prot` and `backing`;
    /// returns the address.
    fn mmap(
        &self,
        cpu: usize,
        at: MapAt,
        len_bytes: u64,
        prot: Prot,
        backing: Backing,
    ) -> Result<u64, VmError>;

    /// Unmaps `[addr, addr + len_bytes)`; unmapped holes are fine. When it
    /// returns, no CPU can reach the old frames.
    fn munmap(&self, cpu: usize, addr: u64, len_bytes: u64) -> Result<(), VmError>;

    /// Changes the protection of `[addr, addr + len_bytes)`, all of which
    /// must be mapped.
    fn mprotect(&self, cpu: usize, addr: u64, len_bytes: u64, prot: Prot) -> Result<(), VmError>;

    /// Resolves a fault by `cpu` at `addr` for `access`: installs a
    /// translation or reports why not.
    fn pagefault(&self, cpu: usize, addr: u64, access: Access) -> Result<(), VmError>;

    /// Statistics so far.
    fn stats(&self) -> Stats {
        stats_of(self.mmu())
    }
}

/// Statistics of an address space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Page faults resolved or refused.
    pub faults: u64,
    /// mmap calls.
    pub mmaps: u64,
    /// munmap calls.
    pub munmaps: u64,
    /// mprotect calls.
    pub mprotects: u64,
    /// Shootdowns with at least one remote target.
    pub shootdowns: u64,
    /// Remote targets over all shootdowns.
    pub shootdown_targets: u64,
    /// Targets that acknowledged themselves.
    pub acks_self: u64,
    /// Targets flushed on their behalf while in the kernel.
    pub acks_proxy: u64,
    /// TLB misses.
    pub tlb_misses: u64,
    /// Touches that reached a freed frame (a bug if not zero).
    pub stale_touches: u64,
    /// Page-table pages allocated.
    pub page_table_pages: u64,
}

/// Statistics from an MMU's counters.
pub fn stats_of(mmu: &dyn Mmu) -> Stats {
    let c = mmu.counters();
    Stats {
        faults: c.total(Counter::Faults),
        mmaps: c.total(Counter::Mmaps),
        munmaps: c.total(Counter::Munmaps),
        mprotects: c.total(Counter::Mprotects),
        shootdowns: c.total(Counter::Shootdowns),
        shootdown_targets: c.total(Counter::ShootdownTargets),
        acks_self: c.total(Counter::AcksSelf),
        acks_proxy: c.total(Counter::AcksProxy),
        tlb_misses: c.total(Counter::TlbMisses),
        stale_touches: c.total(Counter::StaleTouches),
        page_table_pages: mmu.page_table_pages(),
    }
}

/// A thread attached to an address space as CPU `id`. Detaches on drop.
pub struct Cpu<'a> {
    space: &'a dyn AddressSpace,
    id: usize,
}

impl std::fmt::Debug for Cpu<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cpu").field("id", &self.id).finish()
    }
}

impl<'a> Cpu<'a> {
    /// Attaches the calling thread as CPU `id` (< [`MAX_CPUS`]); panics if
    /// that CPU is attached already.
    pub fn attach(space: &'a dyn AddressSpace, id: usize) -> Cpu<'a> {
        assert!(id < MAX_CPUS);
        space.mmu().attach(id);
        Cpu { space, id }
    }

    /// The CPU id.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The address space.
    pub fn space(&self) -> &'a dyn AddressSpace {
        self.space
    }

    /// [`AddressSpace::mmap`] on this CPU.
    pub fn mmap(
        &self,
        at: MapAt,
        len_bytes: u64,
        prot: Prot,
        backing: Backing,
    ) -> Result<u64, VmError> {
        self.space.mmap(self.id, at, len_bytes, prot, backing)
    }

    /// [`AddressSpace::munmap`] on this CPU.
    pub fn munmap(&self, addr: u64, len_bytes: u64) -> Result<(), VmError> {
        self.space.munmap(self.id, addr, len_bytes)
    }

    /// [`AddressSpace::mprotect`] on this CPU.
    pub fn mprotect(&self, addr: u64, len_bytes: u64, prot: Prot) -> Result<(), VmError> {
        self.space.mprotect(self.id, addr, len_bytes, prot)
    }

    /// A user operation on the byte at `addr`: the MMU, a page fault on a
    /// miss, the MMU again, as hardware re-executes a faulting
    /// instruction. Returns the byte loaded (0 for stores).
    pub fn op(&self, addr: u64, op: Op) -> Result<u8, VmError> {
        let vpn = addr / PAGE_SIZE_BYTES;
        let offset = (addr % PAGE_SIZE_BYTES) as usize;
        let mmu = self.space.mmu();
        loop {
            match mmu.access(self.id, vpn, offset, op) {
                Ok(v) => return Ok(v),
                Err(crate::mmu::Miss::Fault) => self.space.pagefault(self.id, addr, op.access())?,
            }
        }
    }

    /// An access to `addr` that changes nothing (a load, or an atomic
    /// `or` of 0 for a write).
    pub fn touch(&self, addr: u64, access: Access) -> Result<(), VmError> {
        self.op(addr, Op::Touch(access)).map(|_| ())
    }

    /// Loads the byte at `addr`.
    pub fn read(&self, addr: u64) -> Result<u8, VmError> {
        self.op(addr, Op::Load)
    }

    /// Stores `value` at `addr`.
    pub fn write(&self, addr: u64, value: u8) -> Result<(), VmError> {
        self.op(addr, Op::Store(value)).map(|_| ())
    }
}

impl Drop for Cpu<'_> {
    fn drop(&mut self) {
        self.space.mmu().detach(self.id);
        // No longer a CPU: stop holding Refcache's epochs up.
        crate::frameref::leave();
    }
}

/// Checks and converts a byte range to page numbers.
pub fn page_range(addr: u64, len_bytes: u64) -> Result<Range<u64>, VmError> {
    if !addr.is_multiple_of(PAGE_SIZE_BYTES)
        || !len_bytes.is_multiple_of(PAGE_SIZE_BYTES)
        || len_bytes == 0
        || addr
            .checked_add(len_bytes)
            .is_none_or(|end| end > ADDRESS_LIMIT_BYTES)
    {
        return Err(VmError::Invalid);
    }
    Ok(addr / PAGE_SIZE_BYTES..(addr + len_bytes) / PAGE_SIZE_BYTES)
}

/// Start of the windows [`MapAt::Anywhere`] allocates from (1 TiB);
/// fixed mappings below it never collide with them.
pub const ANYWHERE_BASE_BYTES: u64 = 1 << 40;
/// Bytes of address space per CPU window (16 GiB: the windows end at
/// [`ADDRESS_LIMIT_BYTES`]).
pub const WINDOW_BYTES: u64 = (ADDRESS_LIMIT_BYTES - ANYWHERE_BASE_BYTES) / MAX_CPUS as u64;

/// Address allocation for [`MapAt::Anywhere`]: a bump pointer per CPU in
/// its own window, so concurrent mmaps touch no shared line (sv6 does the
/// same with per-CPU address hints). The pointer wraps around at the end
/// of the window, so addresses are reused; a design must check that the
/// range it gets is free and ask again if not ([`ANYWHERE_TRIES`]).
pub struct AddrAlloc {
    next: Box<[CachePadded<AtomicU64>]>,
}

/// How many ranges a design tries for one [`MapAt::Anywhere`] mmap before
/// it reports [`VmError::OutOfMemory`].
pub const ANYWHERE_TRIES: usize = 64;

impl std::fmt::Debug for AddrAlloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddrAlloc").finish_non_exhaustive()
    }
}

impl Default for AddrAlloc {
    fn default() -> Self {
        AddrAlloc {
            next: (0..MAX_CPUS)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        }
    }
}

impl AddrAlloc {
    /// A range of `len_bytes` in `cpu`'s window, the next one after the
    /// last handed out (wrapping around); possibly still in use.
    pub fn alloc(&self, cpu: usize, len_bytes: u64) -> Result<u64, VmError> {
        if len_bytes > WINDOW_BYTES {
            return Err(VmError::OutOfMemory);
        }
        let window = ANYWHERE_BASE_BYTES + cpu as u64 * WINDOW_BYTES;
        loop {
            let offset = self.next[cpu].fetch_add(len_bytes, Ordering::Relaxed) % WINDOW_BYTES;
            if offset + len_bytes <= WINDOW_BYTES {
                return Ok(window + offset);
            }
            // Straddles the end: skip to the start of the window.
        }
    }
}
