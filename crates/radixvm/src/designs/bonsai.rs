//! Bonsai VM, "pure RCU" (Clements, Kaashoek, Zeldovich, ASPLOS 2012,
//! §5.3): page faults find their region without the address-space lock.
//!
//! Regions live in a Bonsai tree (an RCU bounded-balance tree, `bonsai`
//! crate) keyed by their *last* page, so "the region containing page p"
//! is the first key `>= p` (Linux's `find_vma`). `mmap`, `munmap` and
//! `mprotect` still serialize on one address-space lock; a page fault
//! takes no lock on the region structure: it pins an epoch, looks the
//! region up, and installs its page under the fine-grained lock of one
//! page-table page. The shared page table and the shootdown to every CPU
//! using the address space are unchanged from Linux.
//!
//! The race the paper closes (§5.3): a fault that found a region just
//! before `munmap` removed it must not install a translation after
//! `munmap` cleared the range. `munmap` marks the region dead *before*
//! clearing any entry, and clears each entry under its page-table lock;
//! the fault checks "dead" under that same lock. Either the fault
//! installs first and the clear removes it, or the fault sees the mark
//! and retries its lookup (finding nothing, or the region's replacement
//! after a split or mprotect).
//!
//! ```text
//!  CPU 0 munmap:  lock AS ─ tree.remove(r) ─ r.dead = true ─ PTL: clear ─ shootdown all ─ free ─ unlock
//!  CPU 1 fault:   pin ─ lookup → r ─────────────── PTL: r.dead? yes → retry: lookup → none → SIGSEGV
//!  CPU 1 fault':  pin ─ lookup → r ─ PTL: dead? no, install ─┘ (cleared by CPU 0 afterwards)
//! ```
//!
//! Removed regions stay readable until every reader that could have found
//! them unpins: the tree retires its nodes (which hold the `Arc`s) through
//! the `epoch` crate.
//!
//! The address-space lock is `xsync`'s because on the per-core backend this
//! metadata is shared between processes, where parking_lot's wake-ups are lost.

use std::ops::Range;
use std::sync::Arc;

use bonsai::BonsaiTree;
use xsync::Mutex;

use super::{count, fault_shared, protect_shared, zap_shared, Region, DEAD, LIVE};
use crate::mmu::sw::SoftMmu;
use crate::mmu::{Counter, Mmu};
use crate::space::{page_range, AddrAlloc, ANYWHERE_TRIES};
use crate::{Access, AddressSpace, Backing, Design, Frames, MapAt, Prot, VmError, PAGE_SIZE_BYTES};

/// The Bonsai VM address space.
pub struct BonsaiVm {
    mmu: Box<dyn Mmu>,
    /// Regions keyed by last page.
    tree: BonsaiTree<u64, Arc<Region>>,
    /// The address-space lock (mmap, munmap, mprotect).
    lock: Mutex<()>,
    addrs: AddrAlloc,
}

impl std::fmt::Debug for BonsaiVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BonsaiVm").finish_non_exhaustive()
    }
}

impl BonsaiVm {
    /// An empty address space with a shared page table.
    pub fn new(frames: &Arc<Frames>) -> BonsaiVm {
        BonsaiVm::with_mmu(Box::new(SoftMmu::new(frames, false)))
    }

    /// An empty address space over `mmu` (built with a shared page table where the
    /// backend has a choice).
    pub fn with_mmu(mmu: Box<dyn Mmu>) -> BonsaiVm {
        BonsaiVm {
            mmu,
            tree: BonsaiTree::new(),
            lock: Mutex::new(()),
            addrs: AddrAlloc::default(),
        }
    }

    /// Regions overlapping `vpns` (caller holds the address-space lock).
    fn overlapping(&self, vpns: &Range<u64>) -> Vec<Arc<Region>> {
        let reader = self.tree.reader();
        reader
            .range(vpns.start..)
            .map(|(_, r)| r.clone())
            .take_while(|r| r.start < vpns.end)
            .collect()
    }

    /// Replaces the regions overlapping `vpns` by their outside parts
    /// (and, with `middle`, their inside with that protection) plus
    /// `extra`, then marks the replaced ones dead. New regions go in
    /// before old ones go out, so a fault always finds a region for a page
    /// that stays mapped. Caller holds the address-space lock.
    fn carve(
        &self,
        vpns: &Range<u64>,
        middle: Option<Prot>,
        extra: Option<Arc<Region>>,
    ) -> Vec<Arc<Region>> {
        let old = self.overlapping(vpns);
        let mut keys = Vec::new();
        for r in &old {
            for piece in r.carve(vpns, middle) {
                keys.push(piece.end - 1);
                self.tree.insert(piece.end - 1, Arc::new(piece));
            }
        }
        if let Some(r) = extra {
            keys.push(r.end - 1);
            self.tree.insert(r.end - 1, r);
        }
        for r in &old {
            if !keys.contains(&(r.end - 1)) {
                self.tree.remove(&(r.end - 1));
            }
            r.set(DEAD);
        }
        old
    }
}

fn owned_in(old: &[Arc<Region>], vpn: u64) -> bool {
    old.iter()
        .any(|r| (r.start..r.end).contains(&vpn) && matches!(r.backing, Backing::Anonymous))
}

impl AddressSpace for BonsaiVm {
    fn design(&self) -> Design {
        Design::Bonsai
    }

    fn mmu(&self) -> &dyn Mmu {
        &*self.mmu
    }

    fn mmap(
        &self,
        cpu: usize,
        at: MapAt,
        len_bytes: u64,
        prot: Prot,
        backing: Backing,
    ) -> Result<u64, VmError> {
        count(&*self.mmu, cpu, Counter::Mmaps);
        page_range(0, len_bytes)?;
        let _as_lock = self.lock.lock();
        // A free range in this CPU's window.
        let anywhere = || {
            for _ in 0..ANYWHERE_TRIES {
                let a = self.addrs.alloc(cpu, len_bytes)?;
                let vpns = page_range(a, len_bytes)?;
                if self.overlapping(&vpns).is_empty() {
                    return Ok(a);
                }
            }
            Err(VmError::OutOfMemory)
        };
        let addr = match at {
            MapAt::Fixed(a) => a,
            MapAt::Hint(a) => match page_range(a, len_bytes) {
                Ok(vpns) if self.overlapping(&vpns).is_empty() => a,
                _ => anywhere()?,
            },
            MapAt::Anywhere => anywhere()?,
        };
        let vpns = page_range(addr, len_bytes)?;
        if let Backing::Segment {
            segment,
            offset_pages,
        } = &backing
        {
            if offset_pages + (vpns.end - vpns.start) > segment.len_pages() {
                return Err(VmError::PastSegmentEnd);
            }
        }
        let region = Arc::new(Region::born(vpns.clone(), prot, backing));
        let old = self.carve(&vpns, None, Some(region.clone()));
        if !old.is_empty() {
            zap_shared(&*self.mmu, cpu, vpns, &|v| owned_in(&old, v));
        }
        region.set(LIVE);
        Ok(addr)
    }

    fn munmap(&self, cpu: usize, addr: u64, len_bytes: u64) -> Result<(), VmError> {
        count(&*self.mmu, cpu, Counter::Munmaps);
        let vpns = page_range(addr, len_bytes)?;
        let _as_lock = self.lock.lock();
        let old = self.carve(&vpns, None, None);
        zap_shared(&*self.mmu, cpu, vpns, &|v| owned_in(&old, v));
        Ok(())
    }

    fn mprotect(&self, cpu: usize, addr: u64, len_bytes: u64, prot: Prot) -> Result<(), VmError> {
        count(&*self.mmu, cpu, Counter::Mprotects);
        let vpns = page_range(addr, len_bytes)?;
        let _as_lock = self.lock.lock();
        let covered: u64 = self
            .overlapping(&vpns)
            .iter()
            .map(|r| r.end.min(vpns.end) - r.start.max(vpns.start))
            .sum();
        if covered != vpns.end - vpns.start {
            return Err(VmError::Unmapped(addr));
        }
        self.carve(&vpns, Some(prot), None);
        protect_shared(&*self.mmu, cpu, vpns, prot);
        Ok(())
    }

    fn pagefault(&self, cpu: usize, addr: u64, access: Access) -> Result<(), VmError> {
        count(&*self.mmu, cpu, Counter::Faults);
        let vpn = addr / PAGE_SIZE_BYTES;
        loop {
            let reader = self.tree.reader();
            let region = reader
                .lower_bound(&vpn)
                .map(|(_, r)| r)
                .filter(|r| r.start <= vpn)
                .ok_or(VmError::Unmapped(addr))?;
            if fault_shared(&*self.mmu, cpu, region, vpn, access)? {
                return Ok(());
            }
            // The region died under us: look again.
            std::hint::spin_loop();
        }
    }
}
